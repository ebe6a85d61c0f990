//! Names and labels of the objects Flotilla derives from an App, defined once.

use std::collections::BTreeMap;

/// Field manager for every server-side apply the operator makes.
pub const FIELD_MANAGER: &str = "flotilla";
/// `app.kubernetes.io/managed-by` value on everything the operator creates.
pub const MANAGED_BY: &str = "flotilla";
/// Name of the application container in the pod template.
pub const CONTAINER_NAME: &str = "app";

pub const LABEL_NAME: &str = "app.kubernetes.io/name";
pub const LABEL_VERSION: &str = "app.kubernetes.io/version";
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// Which of an App's Deployments a pod belongs to: `stable` (or `canary`, later).
pub const LABEL_TRACK: &str = "flotilla.dev/track";

/// Label selector that finds every object the operator manages.
pub fn managed_selector() -> String {
    format!("{LABEL_MANAGED_BY}={MANAGED_BY}")
}

/// The stable Deployment carries the App's own name.
pub fn stable_deployment_name(app: &str) -> String {
    app.to_string()
}

/// The HorizontalPodAutoscaler carries the App's own name.
pub fn hpa_name(app: &str) -> String {
    app.to_string()
}

/// `image:version`.
pub fn image_ref(image: &str, version: &str) -> String {
    format!("{image}:{version}")
}

/// Immutable selector of the stable Deployment.
pub fn stable_selector(app: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(LABEL_NAME.to_string(), app.to_string()), (LABEL_TRACK.to_string(), "stable".to_string())])
}

/// Labels on the objects and pods of one App at one version.
pub fn labels(app: &str, version: &str) -> BTreeMap<String, String> {
    let mut labels = stable_selector(app);
    labels.insert(LABEL_VERSION.to_string(), version.to_string());
    labels.insert(LABEL_MANAGED_BY.to_string(), MANAGED_BY.to_string());
    labels
}
