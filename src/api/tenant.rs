//! The `Tenant` resource: who a tenant is, which namespaces it owns, and their quota.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A tenant of the cluster: the namespaces it owns, who administers them, and their quota.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "flotilla.dev",
    version = "v1alpha1",
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
}

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
    /// Onboarding failed; the message says why.
    Error,
    /// Removed from the tenant, but withdrawing Flotilla's access failed; retried.
    Offboarding,
    /// Removed from the tenant: Flotilla's access was withdrawn, workloads were left in place.
    Offboarded,
}
