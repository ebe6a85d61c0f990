//! Parts of the `Tenant` resource that every served version shares: subjects, quota and status.
//! The specs of each version are in `v1alpha1` and `v1beta1`.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::KubeSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// An RBAC subject that administers the tenant's namespaces.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.kind != 'ServiceAccount' || has(self.__namespace__)").message("spec.admins: a ServiceAccount subject needs its namespace").reason(kube::core::Reason::FieldValueRequired).field_path(".namespace"))]
pub struct Subject {
    /// `User`, `Group` or `ServiceAccount`.
    pub kind: SubjectKind,
    /// Name of the user, group or ServiceAccount.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Namespace of a ServiceAccount.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// Kind of an RBAC subject.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SubjectKind {
    User,
    Group,
    ServiceAccount,
}

/// Hard limits of the ResourceQuota each tenant namespace gets.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TenantQuota {
    /// ResourceQuota `hard` limits, for example `pods: "200"` or `requests.cpu: "20"` (quoted: each
    /// limit is a non-negative quantity written as a string).
    #[schemars(extend("maxProperties" = 64))]
    pub hard: BTreeMap<String, NonNegativeQuantity>,
}

/// A resource quantity such as `200`, `500m` or `16Gi`, never negative.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct NonNegativeQuantity(
    #[schemars(
        length(min = 1, max = 32),
        regex(
            pattern = r"^\+?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE][+-]?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
        )
    )]
    pub String,
);

impl From<&NonNegativeQuantity> for Quantity {
    fn from(q: &NonNegativeQuantity) -> Self {
        Quantity(q.0.clone())
    }
}

/// What the pods of a tenant's Apps may ask for beyond Pod Security, set by the platform:
/// where they may run and with what. Each list is what is allowed (empty: nothing); a pod
/// that asks for anything else is refused, naming the field. Unset: no limit beyond Pod
/// Security and the platform's own admission.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TenantPodPolicy {
    /// PriorityClasses a template may name in `priorityClassName` (a high one preempts other
    /// tenants' pods).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), inner(length(min = 1, max = 253)))]
    pub allowed_priority_classes: Vec<String>,
    /// RuntimeClasses a template may name in `runtimeClassName` (leaving a sandbox the
    /// platform defaults).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), inner(length(min = 1, max = 253)))]
    pub allowed_runtime_classes: Vec<String>,
    /// Node labels every pod must select: a template's `nodeSelector` must carry each of
    /// these, with this value (so the tenant's pods land on its nodes only). `nodeName` is
    /// refused whenever a pod policy is set (it skips the scheduler).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 16))]
    pub node_selector: BTreeMap<String, String>,
    /// Taint keys a template may tolerate (a toleration of every key, with no key, is never
    /// allowed): the control plane's and other tenants' dedicated nodes stay out of reach.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), inner(length(min = 1, max = 317)))]
    pub allowed_toleration_keys: Vec<String>,
    /// CSI drivers a template may use in inline (`csi`) volumes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), inner(length(min = 1, max = 63)))]
    pub allowed_csi_drivers: Vec<String>,
    /// Audiences a template may ask projected ServiceAccount tokens for (a token for another
    /// service's audience lets the pod act as its ServiceAccount there).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), inner(length(min = 1, max = 253)))]
    pub allowed_token_audiences: Vec<String>,
}

/// A LimitRange each tenant namespace gets: per-container defaults and bounds, so that pods
/// which set no resources still fit a `requests.*` or `limits.*` quota and can be
/// autoscaled on CPU. Keys are resource names (`cpu`, `memory`, `ephemeral-storage`).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TenantLimitRange {
    /// Limits of a container that sets none, for example `cpu: 500m`, `memory: 256Mi`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("maxProperties" = 16))]
    pub default: Option<BTreeMap<String, NonNegativeQuantity>>,
    /// Requests of a container that sets none, for example `cpu: 100m`, `memory: 128Mi`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("maxProperties" = 16))]
    pub default_request: Option<BTreeMap<String, NonNegativeQuantity>>,
    /// Most a container may ask for (its limits, or requests where it sets no limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("maxProperties" = 16))]
    pub max: Option<BTreeMap<String, NonNegativeQuantity>>,
}

/// Which traffic a tenant's namespaces admit (a NetworkPolicy `flotilla-tenant` in each).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TenantNetworkPolicy {
    /// `Tenant` (default): pods admit traffic from the tenant's own namespaces; `Namespace`:
    /// only from their own namespace; `None`: Flotilla writes no NetworkPolicy. Namespaces
    /// named in `allowFromNamespaces` (and in the operator's
    /// `--network-policy-allowed-namespaces`) are admitted in the first two.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolation: Option<NetworkIsolation>,
    /// Further namespaces whose pods may reach the tenant's pods (an ingress controller, a
    /// monitoring stack), by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 32),
        inner(length(min = 1, max = 63), regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))
    )]
    pub allow_from_namespaces: Vec<String>,
}

/// How far a tenant's network isolation goes.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NetworkIsolation {
    /// Admit traffic from every namespace of the same tenant.
    #[default]
    Tenant,
    /// Admit traffic only from the same namespace.
    Namespace,
    /// No NetworkPolicy.
    None,
}

/// Pod Security Admission levels of a tenant's namespaces (labels
/// `pod-security.kubernetes.io/{enforce,warn,audit}`, enforced by kube-apiserver itself).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PodSecurity {
    /// Pods that do not meet this level are refused: `baseline` (default) or `restricted`.
    /// `privileged` cannot be asked for through a Tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enforce: Option<EnforceLevel>,
    /// Pods that do not meet this level are admitted with a warning to the client:
    /// `privileged`, `baseline` or `restricted` (default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warn: Option<PodSecurityLevel>,
    /// Pods that do not meet this level are admitted and noted in the audit log:
    /// `privileged`, `baseline` or `restricted` (default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit: Option<PodSecurityLevel>,
}

/// A Pod Security Standard.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum PodSecurityLevel {
    Privileged,
    Baseline,
    Restricted,
}

/// A Pod Security Standard a Tenant may enforce.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum EnforceLevel {
    Baseline,
    Restricted,
}

impl PodSecurityLevel {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Privileged => "privileged",
            Self::Baseline => "baseline",
            Self::Restricted => "restricted",
        }
    }
}

impl From<EnforceLevel> for PodSecurityLevel {
    fn from(level: EnforceLevel) -> Self {
        match level {
            EnforceLevel::Baseline => Self::Baseline,
            EnforceLevel::Restricted => Self::Restricted,
        }
    }
}

impl PodSecurity {
    /// The (enforce, warn, audit) levels, defaults filled in.
    pub fn levels(&self) -> [(&'static str, PodSecurityLevel); 3] {
        [
            ("enforce", self.enforce.map_or(PodSecurityLevel::Baseline, PodSecurityLevel::from)),
            ("warn", self.warn.unwrap_or(PodSecurityLevel::Restricted)),
            ("audit", self.audit.unwrap_or(PodSecurityLevel::Restricted)),
        ]
    }
}

/// Observed state of a Tenant, written by the operator.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TenantStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Per namespace: whether Flotilla serves it, and why not.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<NamespaceStatus>,
    /// `onboarded/listed`, for display.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    /// `Ready` is true when every listed namespace is onboarded.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// State of one namespace of a tenant.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceStatus {
    pub name: String,
    pub state: NamespaceState,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// Where a tenant namespace stands.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum NamespaceState {
    /// Flotilla's RoleBindings (and the quota) are in place; Apps here are reconciled.
    Onboarded,
    /// Not onboarded yet.
    Pending,
    /// Another Tenant owns this namespace.
    Conflict,
    /// The namespace exists, Flotilla did not create it, and no cluster admin marked it
    /// adoptable (label `flotilla.dev/adoptable`).
    NotAdoptable,
    /// Onboarding failed; the message says why.
    Error,
    /// Removed from the tenant, but withdrawing Flotilla's access failed; retried.
    Offboarding,
    /// Removed from the tenant: Flotilla's access was withdrawn, workloads were left in place.
    Offboarded,
}

/// A Prometheus the tenant's Apps may query for rollout analysis (listed by the platform).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct TenantPrometheus {
    /// The query API's base URL, for example `http://prometheus.monitoring:9090`: an App's
    /// `spec.rollout.analysis.prometheusUrl` names it by this URL or another spelling of it
    /// (case, the default port, a trailing `/`, a `.svc` suffix); this spelling is what is
    /// asked. An endpoint at the host and port of the operator's `--prometheus-url` is
    /// limited to the App's namespace like that one, even if `Dedicated`.
    #[x_kube(validation = Rule::new("self.matches('^https?://[^\\\\s]+$')").message("must be an http:// or https:// URL").reason(kube::core::Reason::FieldValueInvalid))]
    #[schemars(length(max = 512))]
    pub url: String,
    /// `Shared` (default): it holds other tenants' series too, so every selector of a query is
    /// limited to the App's namespace. `Dedicated`: it holds only this tenant's series; queries
    /// are sent as written.
    #[serde(default)]
    #[schemars(extend("default" = "Shared"))]
    pub isolation: PrometheusIsolation,
}

/// Whose series a Prometheus holds.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PrometheusIsolation {
    /// Several tenants' series: queries are limited to the App's namespace.
    #[default]
    Shared,
    /// Only this tenant's series: queries are sent as written.
    Dedicated,
}
