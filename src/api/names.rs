//! Names and labels of the objects Flotilla derives from an App, defined once.

use std::collections::BTreeMap;

/// Field manager for every server-side apply the operator makes.
pub const FIELD_MANAGER: &str = "flotilla";
/// `app.kubernetes.io/managed-by` value on everything the operator creates.
pub const MANAGED_BY: &str = "flotilla";
/// Name of the application container in the pod template.
pub const CONTAINER_NAME: &str = "app";

/// Annotation on an App's Deployments: the fingerprint of the pod template the operator
/// rendered (see `app::desired::template_hash`).
pub const ANNOTATION_TEMPLATE_HASH: &str = "flotilla.dev/template-hash";

/// Annotation on an App's Deployments: the revision their pods run (see
/// `api::template::revision`).
pub const ANNOTATION_REVISION: &str = "flotilla.dev/revision";

pub const LABEL_NAME: &str = "app.kubernetes.io/name";
pub const LABEL_VERSION: &str = "app.kubernetes.io/version";
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// Which of an App's Deployments a pod belongs to: `stable` or `canary`.
pub const LABEL_TRACK: &str = "flotilla.dev/track";
/// Port the App's Service listens on.
pub const SERVICE_PORT: i32 = 80;
/// Port the application listens on when the App names none.
pub const DEFAULT_APP_PORT: i32 = 8080;

/// The two Deployments of an App.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Track {
    /// `<app>`: the version that completed last (or, in a rolling update, the one rolling in).
    Stable,
    /// `<app>-canary`: the new version during a canary rollout.
    Canary,
}

impl Track {
    pub fn as_str(self) -> &'static str {
        match self {
            Track::Stable => "stable",
            Track::Canary => "canary",
        }
    }
}

/// Label selector that finds every object the operator manages.
pub fn managed_selector() -> String {
    format!("{LABEL_MANAGED_BY}={MANAGED_BY}")
}

/// The stable Deployment carries the App's own name.
pub fn stable_deployment_name(app: &str) -> String {
    app.to_string()
}

/// The canary Deployment: `<app>-canary`.
pub fn canary_deployment_name(app: &str) -> String {
    format!("{app}-canary")
}

/// The Deployment of one track.
pub fn deployment_name(app: &str, track: Track) -> String {
    match track {
        Track::Stable => stable_deployment_name(app),
        Track::Canary => canary_deployment_name(app),
    }
}

/// The Service selecting the pods of both tracks carries the App's own name.
pub fn service_name(app: &str) -> String {
    app.to_string()
}

/// Selector of the Service: every pod of the App, whatever its track.
pub fn service_selector(app: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(LABEL_NAME.to_string(), app.to_string()), (LABEL_MANAGED_BY.to_string(), MANAGED_BY.to_string())])
}

/// Selector of a Service in front of one track only (a blue-green rollout's Services), or of
/// every pod of the App when `track` is `None`.
pub fn track_selector(app: &str, track: Option<Track>) -> BTreeMap<String, String> {
    let mut selector = service_selector(app);
    if let Some(track) = track {
        selector.insert(LABEL_TRACK.to_string(), track.as_str().to_string());
    }
    selector
}

/// The Service in front of the new version during a blue-green rollout: `<app>-preview`.
pub fn preview_service_name(app: &str) -> String {
    format!("{app}-preview")
}

/// The Service in front of a canary's pods only, when its traffic is split by an HTTPRoute.
pub fn canary_service_name(app: &str) -> String {
    format!("{app}-canary")
}

/// The HorizontalPodAutoscaler carries the App's own name.
pub fn hpa_name(app: &str) -> String {
    app.to_string()
}

/// `image:version`.
pub fn image_ref(image: &str, version: &str) -> String {
    format!("{image}:{version}")
}

/// Immutable selector of the Deployment of one track.
pub fn selector(app: &str, track: Track) -> BTreeMap<String, String> {
    BTreeMap::from([(LABEL_NAME.to_string(), app.to_string()), (LABEL_TRACK.to_string(), track.as_str().to_string())])
}

/// Labels on the objects and pods of one App's track at one version.
pub fn labels(app: &str, version: &str, track: Track) -> BTreeMap<String, String> {
    let mut labels = selector(app, track);
    labels.insert(LABEL_VERSION.to_string(), version.to_string());
    labels.insert(LABEL_MANAGED_BY.to_string(), MANAGED_BY.to_string());
    labels
}
