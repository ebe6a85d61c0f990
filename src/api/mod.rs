//! Custom resource types served under `flotilla.dev`, and the CRD documents generated from them.

pub mod app;
pub mod conditions;

pub use app::{App, AppPhase, AppSpec, AppStatus, Autoscaling};

use kube::CustomResourceExt;

/// API group of every Flotilla resource.
pub const GROUP: &str = "flotilla.dev";

/// The CRDs as one multi-document YAML stream, exactly as checked in under `crds/`.
pub fn crds_yaml() -> Result<String, serde_yaml::Error> {
    let mut out = String::new();
    for crd in [App::crd()] {
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(&crd)?);
    }
    Ok(out)
}
