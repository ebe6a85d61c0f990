//! Custom resource types served under `flotilla.dev`, and the CRD documents generated from them.

pub mod app;
pub mod conditions;
pub mod rollout;
pub mod tenant;

pub use app::{App, AppPhase, AppSpec, AppStatus, Autoscaling};
pub use rollout::{
    Analysis, AnalysisStatus, CanaryStatus, CanaryStep, CanaryStrategy, FailedVersion, Measurement, MeasurementResult,
    MetricCheck, RollingStrategy, RolloutProgress, RolloutRecord, RolloutResult, Strategy, StrategyType,
};
pub use tenant::{
    NamespaceState, NamespaceStatus, Subject, SubjectKind, Tenant, TenantQuota, TenantSpec, TenantStatus,
};

use kube::CustomResourceExt;

/// API group of every Flotilla resource.
pub const GROUP: &str = "flotilla.dev";

/// Every CRD Flotilla serves.
pub fn crds() -> Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> {
    vec![App::crd(), Tenant::crd()]
}

/// The CRDs as one multi-document YAML stream, exactly as checked in under `crds/`.
pub fn crds_yaml() -> Result<String, serde_yaml::Error> {
    let mut out = String::new();
    for crd in crds() {
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(&crd)?);
    }
    Ok(out)
}
