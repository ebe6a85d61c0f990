//! Custom resource types served under `flotilla.dev`, and the CRD documents generated from them.
//!
//! Two versions are served: `v1beta1` (stored, and the one the operator reads) and `v1alpha1`
//! (deprecated). The operator's conversion webhook converts between them (`conversion`).

pub mod app;
pub mod conditions;
pub mod conversion;
pub mod crds;
pub mod duration;
pub mod fingerprint;
pub mod names;
pub mod rollout;
pub mod structural;
pub mod template;
pub mod template_check;
pub mod tenant;
pub mod v1alpha1;
pub mod v1beta1;

pub use app::{AppPhase, AppStatus, Autoscaling};
pub use crds::{crds, crds_yaml};
pub use rollout::{
    Analysis, AnalysisStatus, BlueGreenStage, BlueGreenStatus, BlueGreenStrategy, CanaryStatus, CanaryStep,
    CanaryStrategy, FailedVersion, GatewayApiRouting, Measurement, MeasurementResult, MetricCheck, RollingStrategy,
    RolloutProgress, RolloutRecord, RolloutResult, Strategy, StrategyType, TrafficRouting, TrafficRoutingStatus,
};
pub use template::{PodTemplate, TemplateMetadata};
pub use tenant::{
    EnforceLevel, NamespaceState, NamespaceStatus, PodSecurity, PodSecurityLevel, Subject, SubjectKind, TenantQuota,
    TenantStatus,
};
pub use tenant::{
    NetworkIsolation, PrometheusIsolation, TenantLimitRange, TenantNetworkPolicy, TenantPodPolicy, TenantPrometheus,
};
pub use v1beta1::{App, AppSpec, NamespaceRemovalPolicy, RolloutSpec, Tenant, TenantSpec};

/// API group of every Flotilla resource.
pub const GROUP: &str = "flotilla.dev";
/// The version objects are stored in and the operator reads.
pub const STORAGE_VERSION: &str = "v1beta1";
