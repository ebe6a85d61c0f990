//! The `App` resource: one application, its version, and how many replicas run it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

pub use super::rollout::{Analysis, Strategy};
use super::rollout::{AnalysisStatus, CanaryStatus, FailedVersion, RolloutProgress, RolloutRecord};

/// Longest App name: every object derived from it (`<name>`, `<name>-canary`, and the
/// `app.kubernetes.io/name` label) must stay a valid 63-character DNS label.
pub const MAX_APP_NAME_LEN: usize = 56;

/// Desired state of an application managed by Flotilla.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "flotilla.dev",
    version = "v1alpha1",
    kind = "App",
    namespaced,
    status = "AppStatus",
    shortname = "fapp",
    category = "flotilla",
    printcolumn = r#"{"name":"Version","type":"string","jsonPath":".spec.version","description":"Desired version"}"#,
    printcolumn = r#"{"name":"Current","type":"string","jsonPath":".status.currentVersion","description":"Last version that completed"}"#,
    printcolumn = r#"{"name":"Weight","type":"integer","jsonPath":".status.canary.weight","description":"Share of replicas on the new version during a canary, in percent"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.ready","description":"Ready replicas / desired replicas"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    validation = Rule::new("self.metadata.name.size() <= 56").message("metadata.name: must be at most 56 characters, so that derived names such as <name>-canary stay within 63"),
    validation = Rule::new("self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')").message("metadata.name: must be a DNS-1035 label (lower-case letters, digits and '-', starting with a letter), because it names a Deployment, its pods' labels and a Service"),
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!(has(self.replicas) && has(self.autoscaling))").message("spec.replicas and spec.autoscaling are mutually exclusive: with autoscaling the HorizontalPodAutoscaler owns the replica count").reason(kube::core::Reason::FieldValueForbidden).field_path(".replicas"))]
pub struct AppSpec {
    /// Container image repository, without a tag or digest (for example `registry.example.com/team/checkout`). The tag is `version`.
    #[schemars(length(min = 1, max = 255))]
    #[x_kube(validation = Rule::new(r"self.matches(r'^(?:(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)(?:\.(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?))*(?::[0-9]+)?/)?[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$')").message("spec.image must be an image repository without a tag or digest, such as registry.example.com/team/app (the tag goes in spec.version)").reason(kube::core::Reason::FieldValueInvalid))]
    pub image: String,

    /// Version to run: the image tag. Letters, digits, '.', '_' and '-', at most 63 characters, starting and ending with a letter or digit (it is also a label value). Changing it rolls the application out to the new version.
    #[schemars(length(min = 1, max = 63))]
    #[x_kube(validation = Rule::new(r"self.matches(r'^[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$')").message("spec.version must be an image tag that is also a label value: letters, digits, '.', '_' and '-', starting and ending with a letter or digit").reason(kube::core::Reason::FieldValueInvalid))]
    pub version: String,

    /// Number of replicas (0 to 1000). Defaults to 1. Leave unset when `autoscaling` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1000))]
    pub replicas: Option<i32>,

    /// Scale with a HorizontalPodAutoscaler instead of a fixed replica count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling: Option<Autoscaling>,

    /// Port the application listens on (default 8080). The App's Service sends its port 80 there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<i32>,

    /// Seconds a new pod must be ready before it counts as available (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 3600))]
    pub min_ready_seconds: Option<i32>,

    /// Annotations for the App's pods (for example scrape settings). Part of the pod template: changing them restarts the pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_annotations: Option<std::collections::BTreeMap<String, String>>,

    /// How a new `version` replaces the running one: `Rolling` (default) or `Canary`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<Strategy>,

    /// Prometheus checks that gate every rollout of a new version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub analysis: Option<Analysis>,

    /// Roll back by itself when a check fails `failureLimit` times or the new version does not become available in time (default true). When false, the rollout stops in phase Paused for a person to abort or promote.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_rollback: Option<bool>,

    /// Seconds the new version may take to become available, per canary step or for a whole rolling update, before the rollout counts as failed (10 to 3600, default 600).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 10, max = 3600))]
    pub progress_deadline_seconds: Option<i32>,
}

/// Bounds and target of the HorizontalPodAutoscaler Flotilla manages for an App.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.minReplicas <= self.maxReplicas").message("spec.autoscaling.minReplicas must be less than or equal to spec.autoscaling.maxReplicas").reason(kube::core::Reason::FieldValueInvalid).field_path(".minReplicas"))]
pub struct Autoscaling {
    /// Fewest replicas the autoscaler may scale to (at least 1).
    #[schemars(range(min = 1, max = 1000))]
    pub min_replicas: i32,
    /// Most replicas the autoscaler may scale to (at most 1000).
    #[schemars(range(min = 1, max = 1000))]
    pub max_replicas: i32,
    /// Average CPU utilisation, in percent of the requested CPU, that the autoscaler aims for. Defaults to 80.
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "targetCPUUtilizationPercentage")]
    #[schemars(range(min = 1, max = 100))]
    pub target_cpu_utilization_percentage: Option<i32>,
}

/// Observed state of an App, written by the operator.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AppStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The last version that was fully rolled out and available.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_version: Option<String>,
    /// Replicas that are ready, across the App's Deployments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_replicas: Option<i32>,
    /// Replicas wanted (from `spec.replicas`, or the autoscaler's current choice).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// `ready/replicas`, for display.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<String>,
    /// Summary of where the App stands.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<AppPhase>,
    /// The version being rolled out (equal to `currentVersion` when no rollout is under way).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_version: Option<String>,
    /// Progress of the rollout of `targetVersion`, while one is under way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutProgress>,
    /// Step, weight and replicas of a canary rollout, while one is under way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary: Option<CanaryStatus>,
    /// Measurements of the current (or last) rollout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub analysis: Option<AnalysisStatus>,
    /// The version last rolled back, which is not tried again until the spec changes or a user retries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_version: Option<FailedVersion>,
    /// The last `flotilla.dev/action` request acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handled_action: Option<String>,
    /// The latest finished rollouts, newest first (at most 10).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<RolloutRecord>,
    /// Conditions: `Ready` says whether the desired version serves with all its replicas.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// Where an App stands.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum AppPhase {
    /// The desired version runs with every replica ready.
    Healthy,
    /// The operator is moving the App towards its desired state.
    Progressing,
    /// A rollout waits: a person paused it, a check had no usable data, or a check failed with autoRollback off.
    Paused,
    /// The operator cannot reach the desired state (for example it lacks the rights in this namespace, or a query is invalid).
    Degraded,
    /// The last rollout failed and the stable version runs again.
    RolledBack,
}

impl AppPhase {
    pub fn as_str(self) -> &'static str {
        match self {
            AppPhase::Healthy => "Healthy",
            AppPhase::Progressing => "Progressing",
            AppPhase::Paused => "Paused",
            AppPhase::Degraded => "Degraded",
            AppPhase::RolledBack => "RolledBack",
        }
    }
}
