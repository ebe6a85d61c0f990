//! `flotilla.dev/v1beta1`: the storage version of App and Tenant, and the one the operator reads.
//!
//! Against `v1alpha1`: the App's rollout settings are grouped under `spec.rollout`, its progress
//! deadline is a duration like every other one (`10m`, not `600` seconds), and it can keep a
//! longer or shorter history (`spec.rollout.historyLimit`, new). A Tenant's
//! `deleteNamespacesOnRemoval: true|false` is `namespaceRemovalPolicy: Delete|Retain`.

use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};
use std::time::Duration;

use super::app::{AppStatus, Autoscaling};
use super::duration::{self, DurationError};
use super::rollout::{Analysis, Strategy};
use super::template::PodTemplate;
use super::tenant::{
    PodSecurity, Subject, TenantLimitRange, TenantNetworkPolicy, TenantPrometheus, TenantQuota, TenantStatus,
};

/// Progress deadline of an App that sets none.
pub const DEFAULT_PROGRESS_DEADLINE: Duration = Duration::from_secs(600);
/// Finished rollouts kept in `status.history` when `spec.rollout.historyLimit` is unset.
pub const DEFAULT_HISTORY_LIMIT: usize = 10;

/// Desired state of an application managed by Flotilla.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "flotilla.dev",
    version = "v1beta1",
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
    validation = Rule::new("!self.metadata.name.endsWith('-canary') && !self.metadata.name.endsWith('-preview')").message("metadata.name: must not end in -canary or -preview: those names are kept for the objects an App derives (App web's canary Deployment is web-canary), so two Apps can never derive the same name"),
    validation = Rule::new("!has(self.spec.rollout) || !has(self.spec.rollout.strategy) || self.spec.rollout.strategy.type != 'BlueGreen' || self.metadata.name.size() <= 55").message("metadata.name: a BlueGreen App's name must be at most 55 characters, so that its preview Service <name>-preview stays within 63"),
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!(has(self.replicas) && has(self.autoscaling))").message("spec.replicas and spec.autoscaling are mutually exclusive: with autoscaling the HorizontalPodAutoscaler owns the replica count").reason(kube::core::Reason::FieldValueForbidden).field_path(".replicas"))]
#[x_kube(validation = Rule::new("!has(self.autoscaling) || !has(self.rollout) || !has(self.rollout.strategy) || !has(self.rollout.strategy.canary) || !has(self.rollout.strategy.canary.trafficRouting)").message("spec.autoscaling cannot be used with a canary's trafficRouting: the autoscaler would shrink the stable version as the route takes its requests away, and a rollback would send every request back to fewer pods").reason(kube::core::Reason::FieldValueForbidden).field_path(".rollout.strategy.canary.trafficRouting"))]
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
    /// At most 64: every App's annotations are copied into its Deployments and held in the
    /// operator's caches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("maxProperties" = 64))]
    pub pod_annotations: Option<std::collections::BTreeMap<String, String>>,

    /// The App's pod, as a Kubernetes pod template: containers (the main one, named `app` or
    /// the only one, runs `image` at `version`; sidecars), init containers, volumes, env,
    /// resources, probes, securityContext, nodeSelector, tolerations, affinity and the rest of
    /// a PodSpec. Flotilla adds its labels, the main container's image and its `http` port
    /// (`port`), and Pod Security `restricted` defaults where the template sets none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<PodTemplate>,

    /// How a new `version` is rolled out and checked: strategy, Prometheus analysis, rollback and deadline.
    #[serde(default, skip_serializing_if = "RolloutSpec::is_empty")]
    pub rollout: RolloutSpec,
}

/// How a new version replaces the running one, and what gates it.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RolloutSpec {
    /// `Rolling` (default), `Canary` or `BlueGreen`, with their settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<Strategy>,

    /// Prometheus checks that gate every rollout of a new version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub analysis: Option<Analysis>,

    /// Roll back by itself when a check fails `failureLimit` times or the new version does not become available in time (default true). When false, the rollout stops in phase Paused for a person to abort or promote.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_rollback: Option<bool>,

    /// How long the new version may take to become available, per canary step or for a whole rolling update, before the rollout counts as failed: a duration from 10s to 1h such as `90s` or `10m` (default 10m).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = Rule::new("self.matches('^([0-9]+(ms|s|m|h))+$') && duration(self) >= duration('10s') && duration(self) <= duration('1h')").message("must be a duration from 10s to 1h, such as 90s or 10m").reason(kube::core::Reason::FieldValueInvalid))]
    pub progress_deadline: Option<String>,

    /// Finished rollouts kept in `status.history`, newest first (1 to 50, default 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 50))]
    pub history_limit: Option<i32>,
}

impl RolloutSpec {
    pub fn is_empty(&self) -> bool {
        self == &RolloutSpec::default()
    }

    /// The progress deadline in whole seconds (rounded up), for a Deployment's
    /// `progressDeadlineSeconds` and for `v1alpha1`. A deadline that cannot be read (the CRD
    /// refuses those) counts as the default.
    pub fn progress_deadline_seconds(&self) -> Option<i32> {
        self.progress_deadline.as_deref().map(deadline_seconds)
    }
}

/// Whole seconds of a progress deadline such as `90s` or `1500ms`, rounded up. A deadline that
/// cannot be read (the CRD refuses those) counts as the default.
pub fn deadline_seconds(text: &str) -> i32 {
    let d = duration::parse("spec.rollout.progressDeadline", text).unwrap_or(DEFAULT_PROGRESS_DEADLINE);
    i32::try_from(d.as_secs() + u64::from(d.subsec_nanos() > 0)).unwrap_or(i32::MAX)
}

impl AppSpec {
    /// The rollout strategy (`None`: a rolling update with the Deployment's defaults).
    pub fn strategy(&self) -> Option<&Strategy> {
        self.rollout.strategy.as_ref()
    }

    /// The HTTPRoute that splits a canary's traffic (`strategy.canary.trafficRouting`), if any.
    pub fn http_route(&self) -> Option<&str> {
        let strategy = self.strategy().filter(|s| s.type_ == crate::api::StrategyType::Canary)?;
        strategy.canary.as_ref()?.traffic_routing.as_ref().map(|t| t.gateway_api.http_route.as_str())
    }

    /// The Prometheus checks, if any.
    pub fn analysis(&self) -> Option<&Analysis> {
        self.rollout.analysis.as_ref()
    }

    /// Whether a failed rollout is rolled back by itself (default true).
    pub fn auto_rollback(&self) -> bool {
        self.rollout.auto_rollback.unwrap_or(true)
    }

    /// The progress deadline (default 10 minutes).
    pub fn progress_deadline(&self) -> Result<Duration, DurationError> {
        match &self.rollout.progress_deadline {
            Some(text) => duration::parse("spec.rollout.progressDeadline", text),
            None => Ok(DEFAULT_PROGRESS_DEADLINE),
        }
    }

    /// How many finished rollouts `status.history` keeps (within the schema's 1..=50).
    pub fn history_limit(&self) -> usize {
        self.rollout.history_limit.and_then(|n| usize::try_from(n.clamp(1, 50)).ok()).unwrap_or(DEFAULT_HISTORY_LIMIT)
    }
}

/// A tenant of the cluster: the namespaces it owns, who administers them, and their quota.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "flotilla.dev",
    version = "v1beta1",
    kind = "Tenant",
    status = "TenantStatus",
    shortname = "tenant",
    category = "flotilla",
    printcolumn = r#"{"name":"Namespaces","type":"string","jsonPath":".status.summary","description":"Onboarded namespaces / namespaces listed"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct TenantSpec {
    /// Namespaces the tenant owns: created if missing and labelled `flotilla.dev/tenant`. Never deleted when
    /// removed from this list unless `namespaceRemovalPolicy` is `Delete`. System namespaces are refused.
    #[schemars(length(max = 100), inner(length(min = 1, max = 63), regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")), extend("x-kubernetes-list-type" = "set"))]
    #[x_kube(validation = Rule::new("self.all(n, !(n in ['kube-system', 'kube-public', 'kube-node-lease', 'default']))").message("spec.namespaces: kube-system, kube-public, kube-node-lease and default cannot belong to a tenant").reason(kube::core::Reason::FieldValueForbidden))]
    pub namespaces: Vec<String>,

    /// Users, groups or ServiceAccounts bound to the `flotilla-tenant-admin` role in each namespace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 100))]
    pub admins: Vec<Subject>,

    /// A ResourceQuota applied to each of the tenant's namespaces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<TenantQuota>,

    /// What happens to a namespace when it leaves `namespaces` or the Tenant is deleted: `Retain`
    /// (default: the namespace and its workloads stay, only Flotilla's access is removed) or `Delete`.
    #[serde(default)]
    #[schemars(extend("default" = "Retain"))]
    pub namespace_removal_policy: NamespaceRemovalPolicy,

    /// Pod Security Admission levels of the tenant's namespaces. Default: `enforce: baseline`,
    /// `warn: restricted`, `audit: restricted`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_security: Option<PodSecurity>,

    /// Prometheus endpoints (besides the operator's `--prometheus-url`) that this tenant's Apps
    /// may name in `spec.rollout.analysis.prometheusUrl`; any other address is refused and never
    /// fetched. Set by the platform admin, like the rest of the Tenant.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 10))]
    pub prometheus_endpoints: Vec<TenantPrometheus>,

    /// A LimitRange in each of the tenant's namespaces: container defaults and bounds, so
    /// that a `requests.cpu` quota admits pods that set no resources.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_range: Option<TenantLimitRange>,

    /// Which traffic the tenant's namespaces admit. Default: from the tenant's own
    /// namespaces (and the platform's, named on the operator) only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_policy: Option<TenantNetworkPolicy>,

    /// What the pods of the tenant's Apps may ask for beyond Pod Security: priority and
    /// runtime classes, the nodes they select, tolerations, inline CSI drivers, token
    /// audiences. Enforced by the operator and, at admission, by the ValidatingAdmissionPolicy
    /// flotilla-tenant-pod-policy. Unset: no such limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_policy: Option<crate::api::TenantPodPolicy>,
}

/// What happens to a namespace a tenant gives up.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NamespaceRemovalPolicy {
    /// Keep the namespace and its workloads; withdraw Flotilla's access.
    #[default]
    Retain,
    /// Delete the namespace.
    Delete,
}
