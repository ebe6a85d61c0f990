//! `flotilla.dev/v1alpha1`: the first shape of App and Tenant. Still served (deprecated, with a
//! warning kubectl prints); objects are stored as `v1beta1` and converted by the operator's
//! conversion webhook (`crate::api::conversion`).

use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::app::{AppStatus, Autoscaling};
use super::rollout::{Analysis, Strategy};
use super::tenant::{
    PodSecurity, Subject, TenantLimitRange, TenantNetworkPolicy, TenantPrometheus, TenantQuota, TenantStatus,
};

/// Desired state of an application managed by Flotilla.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "flotilla.dev",
    version = "v1alpha1",
    kind = "App",
    deprecated = "flotilla.dev/v1alpha1 App is deprecated: use flotilla.dev/v1beta1, where strategy, analysis, autoRollback and progressDeadline are grouped under spec.rollout",
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
    validation = Rule::new("!has(self.spec.strategy) || self.spec.strategy.type != 'BlueGreen' || self.metadata.name.size() <= 55").message("metadata.name: a BlueGreen App's name must be at most 55 characters, so that its preview Service <name>-preview stays within 63"),
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!(has(self.replicas) && has(self.autoscaling))").message("spec.replicas and spec.autoscaling are mutually exclusive: with autoscaling the HorizontalPodAutoscaler owns the replica count").reason(kube::core::Reason::FieldValueForbidden).field_path(".replicas"))]
#[x_kube(validation = Rule::new("!has(self.autoscaling) || !has(self.strategy) || !has(self.strategy.canary) || !has(self.strategy.canary.trafficRouting)").message("spec.autoscaling cannot be used with a canary's trafficRouting: the autoscaler would shrink the stable version as the route takes its requests away, and a rollback would send every request back to fewer pods").reason(kube::core::Reason::FieldValueForbidden).field_path(".strategy.canary.trafficRouting"))]
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

/// A tenant of the cluster: the namespaces it owns, who administers them, and their quota.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "flotilla.dev",
    version = "v1alpha1",
    kind = "Tenant",
    deprecated = "flotilla.dev/v1alpha1 Tenant is deprecated: use flotilla.dev/v1beta1, where deleteNamespacesOnRemoval is namespaceRemovalPolicy",
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
    /// removed from this list unless `deleteNamespacesOnRemoval` is true. System namespaces are refused.
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

    /// Delete a namespace when it leaves `namespaces` or the Tenant is deleted. Default false: namespaces
    /// and their workloads stay, only Flotilla's access is removed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub delete_namespaces_on_removal: bool,

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
