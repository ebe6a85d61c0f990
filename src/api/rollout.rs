//! How an App moves to a new version (strategy, analysis) and what the operator reports
//! about that move (canary progress, measurements, history).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// Annotation that pauses a rollout while it is `"true"` (`flotilla pause` / `flotilla resume`).
pub const ANNOTATION_PAUSED: &str = "flotilla.dev/paused";
/// Annotation carrying a one-off request, `<verb> <id>`, with verb `promote`, `promote-full`,
/// `abort` or `retry`. The operator acts on each id once and records it in `status.handledAction`.
pub const ANNOTATION_ACTION: &str = "flotilla.dev/action";

/// How a new version replaces the running one.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.type != 'Canary' || has(self.canary)").message("canary is required when type is Canary").reason(kube::core::Reason::FieldValueRequired).field_path(".canary"))]
#[x_kube(validation = Rule::new("self.type == 'Canary' || !has(self.canary)").message("canary is only allowed when type is Canary").reason(kube::core::Reason::FieldValueForbidden).field_path(".canary"))]
#[x_kube(validation = Rule::new("self.type == 'Rolling' || !has(self.rolling)").message("rolling is only allowed when type is Rolling").reason(kube::core::Reason::FieldValueForbidden).field_path(".rolling"))]
#[x_kube(validation = Rule::new("self.type == 'BlueGreen' || !has(self.blueGreen)").message("blueGreen is only allowed when type is BlueGreen").reason(kube::core::Reason::FieldValueForbidden).field_path(".blueGreen"))]
pub struct Strategy {
    /// `Rolling` (default): the Deployment is updated in place. `Canary`: a second Deployment runs the new version beside the stable one, step by step. `BlueGreen`: the new version comes up at full size behind the `<app>-preview` Service and the App's Service switches to it in one write.
    #[serde(rename = "type", default)]
    pub type_: StrategyType,
    /// Surge and unavailability bounds of a rolling update.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rolling: Option<RollingStrategy>,
    /// Steps of a canary rollout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary: Option<CanaryStrategy>,
    /// Settings of a blue-green rollout (all optional).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blue_green: Option<BlueGreenStrategy>,
}

/// The two ways to roll out.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StrategyType {
    #[default]
    Rolling,
    Canary,
    BlueGreen,
}

/// A blue-green rollout: the new version runs at full size behind `<app>-preview`, is checked
/// there, and then takes all the traffic at once; the old version stays until `scaleDownDelay`
/// has passed with the checks still passing, so that a failure switches back at once.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BlueGreenStrategy {
    /// Switch the App's Service to the new version once it is available and its checks pass (default true). When false, it waits in phase Paused for `flotilla promote`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_promotion: Option<bool>,
    /// How long the old version keeps running after the switch, while the checks go on against the new one: a failure in that time switches back at once. A duration such as `30s` or `5m` (default 30s, at most 1h).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.matches('^([0-9]+(ms|s|m|h))+$') && duration(self) <= duration('1h')").message("must be a duration of at most 1h, such as 30s or 5m").reason(kube::core::Reason::FieldValueInvalid))]
    #[schemars(length(max = 32))]
    pub scale_down_delay: Option<String>,
}

/// Bounds of a rolling update, as on a Deployment (a count or a percentage such as `25%`).
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RollingStrategy {
    /// Pods that may be unavailable during the update (default 25%).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<IntOrString>,
    /// Pods that may be created above the desired count during the update (default 25%).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_surge: Option<IntOrString>,
}

/// The value of a canary step's `pause` that waits for `flotilla promote`.
/// How long a blue-green rollout keeps the old version after the switch when
/// `scaleDownDelay` is unset.
pub const DEFAULT_SCALE_DOWN_DELAY: std::time::Duration = std::time::Duration::from_secs(30);

pub const PAUSE_UNTIL_PROMOTED: &str = "untilPromoted";

/// A canary rollout: the new version gets a growing share of the replicas, one step at a time.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CanaryStrategy {
    /// The steps, in order (1 to 20). After the last one the new version is promoted.
    #[schemars(length(min = 1, max = 20))]
    pub steps: Vec<CanaryStep>,
    /// Send each step's exact share of the requests to the new version through a Gateway API HTTPRoute, instead of a share of the replicas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traffic_routing: Option<TrafficRouting>,
}

/// Where a canary's traffic is split by weight.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct TrafficRouting {
    /// A Gateway API HTTPRoute of the App's namespace.
    #[serde(rename = "gatewayAPI")]
    pub gateway_api: GatewayApiRouting,
}

/// The HTTPRoute whose weights follow the canary's steps.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GatewayApiRouting {
    /// Name of an HTTPRoute (gateway.networking.k8s.io/v1) in the App's namespace. Each rule of it that sends requests to the App must name exactly two backendRefs, the Services `<app>` (the stable version) and `<app>-canary` (the new one); Flotilla sets only their weights, and never creates or deletes the route.
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')").message("must be the name of an HTTPRoute: lower-case letters, digits, '-' and '.'").reason(kube::core::Reason::FieldValueInvalid))]
    pub http_route: String,
}

/// One canary step: the share of replicas that runs the new version, and how long to stay.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CanaryStep {
    /// Percentage of the replicas that run the new version (1 to 100). The canary gets round(weight% x replicas), at least 1 and at most replicas-1.
    #[schemars(range(min = 1, max = 100))]
    pub weight: i32,
    /// How long to stay at this step once the canary is available, for example `30s` or `2m` (default 0: move on once the analysis passes), or `untilPromoted`: stay until a person runs `flotilla promote` (the analysis keeps running meanwhile, and a failure still rolls back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == 'untilPromoted' || self.matches('^([0-9]+(ms|s|m|h))+$')").message("must be a duration such as 30s, 2m or 1m30s, or untilPromoted").reason(kube::core::Reason::FieldValueInvalid))]
    #[schemars(length(max = 32))]
    pub pause: Option<String>,
}

/// Prometheus checks that gate a rollout, whatever its strategy.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.metrics.all(m, self.metrics.exists_one(n, n.name == m.name))").message("metric names must be unique").reason(kube::core::Reason::FieldValueInvalid).field_path(".metrics"))]
pub struct Analysis {
    /// Time between two measurements, for example `30s` (default 30s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.matches('^([0-9]+(ms|s|m|h))+$')").message("must be a duration such as 30s or 1m").reason(kube::core::Reason::FieldValueInvalid))]
    #[schemars(length(max = 32))]
    pub interval: Option<String>,
    /// Failed measurements that abort the rollout (1 to 100, default 2). A measurement with no data never counts as passed nor as failed: it pauses the rollout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub failure_limit: Option<i32>,
    /// Prometheus to query, for example `http://prometheus.monitoring:9090` (default: the operator's `--prometheus-url`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.matches('^https?://[^\\\\s]+$')").message("must be an http:// or https:// URL").reason(kube::core::Reason::FieldValueInvalid))]
    #[schemars(length(max = 512))]
    pub prometheus_url: Option<String>,
    /// The checks (1 to 20). Each must return one series with one finite value.
    #[schemars(length(min = 1, max = 20))]
    pub metrics: Vec<MetricCheck>,
}

/// One PromQL query and its bounds.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.max) || has(self.min)").message("set max, min or both").reason(kube::core::Reason::FieldValueRequired).field_path(".max"))]
#[x_kube(validation = Rule::new("!has(self.max) || !has(self.min) || self.min <= self.max").message("min must not be greater than max").reason(kube::core::Reason::FieldValueInvalid).field_path(".min"))]
pub struct MetricCheck {
    /// Name shown in status and Events, for example `error-rate`.
    #[schemars(length(min = 1, max = 63))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')").message("must be lower-case letters, digits and '-'").reason(kube::core::Reason::FieldValueInvalid))]
    pub name: String,
    /// PromQL returning one series. `{{app}}`, `{{namespace}}`, `{{version}}` (the new version) and `{{stable_version}}` are replaced before it runs.
    #[schemars(length(min = 1, max = 4096))]
    pub query: String,
    /// Highest passing value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<f64>,
    /// Lowest passing value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<f64>,
}

/// Progress of a canary rollout.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CanaryStatus {
    /// Index of the current step (0-based); equal to `steps` while the new version is being promoted.
    pub step: i32,
    /// Number of steps.
    pub steps: i32,
    /// Weight of the current step, in percent (100 while promoting).
    pub weight: i32,
    /// Replicas of the canary Deployment.
    pub replicas: i32,
    /// Replicas of the stable Deployment.
    pub stable_replicas: i32,
    /// When this step began.
    pub step_started_at: Time,
    /// Since when every canary replica of this step is available (the step's pause counts from here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available_since: Option<Time>,
    /// Since when the canary is not fully available (the progress deadline counts from here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unavailable_since: Option<Time>,
}

/// Where a blue-green rollout stands.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlueGreenStage {
    /// The new version runs behind `<app>-preview`; the App's Service still selects the old one.
    Preview,
    /// The App's Service selects the new version; the old one runs until `scaleDownDelay` passes.
    Switched,
    /// The stable Deployment moves to the new version (the App's Service still selects the
    /// preview pods); then the App's Service selects it and the preview Deployment goes.
    Promoting,
}

/// The HTTPRoute that splits a canary's traffic, as Flotilla last set it.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TrafficRoutingStatus {
    /// The HTTPRoute named in `spec.rollout.strategy.canary.trafficRouting`.
    pub http_route: String,
    /// Percentage of the App's requests the route sends to the new version (`<app>-canary`).
    pub canary_weight: i32,
    /// Why the route cannot be used (missing, or not sending to the App's two Services); the rollout waits meanwhile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
    /// When a route the App no longer names had its canary weight set to 0: the canary's Service and pods stay until they have drained.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retired_at: Option<Time>,
}

/// Progress of a blue-green rollout.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BlueGreenStatus {
    pub stage: BlueGreenStage,
    /// When this stage began.
    pub since: Time,
    /// Replicas of the preview Deployment (`<app>-canary`).
    pub replicas: i32,
    /// Since when the preview is not fully available (the progress deadline counts from here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unavailable_since: Option<Time>,
}

/// Progress of the rollout of `targetVersion`, whatever its strategy.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RolloutProgress {
    /// When this rollout began.
    pub started_at: Time,
    /// Where the progress deadline of a rolling update counts from: the start, or the end of
    /// the last pause.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress_since: Option<Time>,
    /// A user promoted the new version: remaining steps and checks are skipped.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub promoted_by_user: bool,
}

/// Outcome of one measurement.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum MeasurementResult {
    /// The value is within its bounds.
    Pass,
    /// The value is outside its bounds.
    Fail,
    /// No usable value (Prometheus unreachable, no data, several series, NaN): neither a pass nor a failure.
    Inconclusive,
    /// Prometheus rejected the query (for example a PromQL syntax error).
    Invalid,
}

/// The latest value of one check.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Measurement {
    pub name: String,
    pub result: MeasurementResult,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<f64>,
    /// Why the result is not a pass (Prometheus' own message when it gave one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// State of the analysis of the current rollout.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AnalysisStatus {
    /// Failed runs so far in this rollout.
    pub failures: i32,
    /// When the checks last ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_run: Option<Time>,
    /// Result of the last run as a whole: Fail if any check failed, else Invalid or Inconclusive if any was, else Pass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_result: Option<MeasurementResult>,
    /// Latest value of every check.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub measurements: Vec<Measurement>,
}

/// A version that was rolled back and is not tried again until the spec changes or a user retries.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FailedVersion {
    pub version: String,
    /// The App's `metadata.generation` when it was rolled back.
    pub generation: i64,
    pub reason: String,
    pub message: String,
}

/// How a rollout ended.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum RolloutResult {
    /// The version became the stable one.
    Promoted,
    /// The version failed a check or the health gate, or a user aborted it, and was rolled back.
    RolledBack,
    /// `spec.version` was set back to the stable version during the rollout.
    Reverted,
    /// Another version was asked for during the rollout.
    Superseded,
}

/// One finished rollout.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RolloutRecord {
    pub version: String,
    pub result: RolloutResult,
    pub at: Time,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The stable version this one replaced (Promoted only): what `flotilla undo` goes back to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replaced: Option<String>,
}
