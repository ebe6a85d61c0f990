//! Parts of the `App` resource that every served version shares: autoscaling bounds, status and
//! phase. The specs of each version are in `v1alpha1` and `v1beta1`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::KubeSchema;
use serde::{Deserialize, Serialize};

use super::rollout::{
    AnalysisStatus, BlueGreenStatus, CanaryStatus, FailedVersion, RolloutProgress, RolloutRecord, TrafficRoutingStatus,
};

/// Longest App name: every object derived from it (`<name>`, `<name>-canary`, and the
/// `app.kubernetes.io/name` label) must stay a valid 63-character DNS label.
pub const MAX_APP_NAME_LEN: usize = 56;

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
    /// The last revision that was fully rolled out and available: the version, and for an App
    /// with a template, `+` and the template's fingerprint (`1.4.2+3fa9c01b2e`).
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
    /// Stage of a blue-green rollout, while one is under way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blue_green: Option<BlueGreenStatus>,
    /// The HTTPRoute weights of a canary routed through Gateway API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traffic_routing: Option<TrafficRoutingStatus>,
    /// Measurements of the current (or last) rollout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub analysis: Option<AnalysisStatus>,
    /// The version last rolled back, which is not tried again until the spec changes or a user retries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_version: Option<FailedVersion>,
    /// The last `flotilla.dev/action` request acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handled_action: Option<String>,
    /// The latest finished rollouts, newest first (at most `spec.rollout.historyLimit`, default 10).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<RolloutRecord>,
    /// Conditions: `Ready` says whether the desired version serves with all its replicas.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// `spec.template` as it was when `currentVersion` became the stable revision: what a
    /// rollback of a later template renders again. Only for Apps with a template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::api::template::opaque_object")]
    pub stable_template: Option<super::template::PodTemplate>,
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
