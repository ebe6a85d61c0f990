//! What onboarding a tenant namespace means, as objects and decisions. Pure: no I/O.

use k8s_openapi::api::core::v1::{Namespace, ResourceQuota, ResourceQuotaSpec};
use k8s_openapi::api::rbac::v1::{RoleBinding, RoleRef, Subject as RbacSubject};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use std::collections::BTreeMap;

use crate::api::conditions::{DesiredCondition, merge_conditions};
use crate::api::{NamespaceState, NamespaceStatus, SubjectKind, Tenant, TenantStatus};
use crate::app::names::{LABEL_MANAGED_BY, MANAGED_BY};

/// Label on a namespace naming the tenant that owns it.
pub const LABEL_TENANT: &str = "flotilla.dev/tenant";
/// ClusterRole that gives the operator exactly what the App reconciler needs in a namespace.
pub const WORKLOADS_ROLE: &str = "flotilla-tenant-workloads";
/// ClusterRole that gives tenant admins Apps and read access to their workloads.
pub const ADMIN_ROLE: &str = "flotilla-tenant-admin";
/// RoleBinding that lets the operator manage workloads in a tenant namespace.
pub const OPERATOR_BINDING: &str = "flotilla-operator";
/// RoleBinding that lets the tenant admins manage Apps in a tenant namespace.
pub const ADMIN_BINDING: &str = "flotilla-tenant-admins";
/// ResourceQuota of a tenant namespace.
pub const QUOTA: &str = "flotilla-tenant";
/// Finalizer that offboards a Tenant's namespaces before it goes away.
pub const FINALIZER: &str = "flotilla.dev/offboard";

/// Namespaces Kubernetes itself needs; the schema refuses them too.
pub const SYSTEM_NAMESPACES: [&str; 4] = ["kube-system", "kube-public", "kube-node-lease", "default"];

/// The operator's own identity, which the onboarding RoleBinding names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OperatorIdentity {
    pub namespace: String,
    pub service_account: String,
}

fn labels(tenant: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_MANAGED_BY.to_string(), MANAGED_BY.to_string()),
        (LABEL_TENANT.to_string(), tenant.to_string()),
    ])
}

fn meta(name: &str, namespace: &str, tenant: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: Some(namespace.into()),
        labels: Some(labels(tenant)),
        ..ObjectMeta::default()
    }
}

/// A namespace created for a tenant.
pub fn desired_namespace(name: &str, tenant: &str) -> Namespace {
    Namespace {
        metadata: ObjectMeta { name: Some(name.into()), labels: Some(labels(tenant)), ..ObjectMeta::default() },
        ..Namespace::default()
    }
}

/// Binds the operator's ServiceAccount to the workloads role in one namespace.
pub fn operator_binding(namespace: &str, tenant: &str, operator: &OperatorIdentity) -> RoleBinding {
    RoleBinding {
        metadata: meta(OPERATOR_BINDING, namespace, tenant),
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "ClusterRole".into(),
            name: WORKLOADS_ROLE.into(),
        },
        subjects: Some(vec![RbacSubject {
            kind: "ServiceAccount".into(),
            name: operator.service_account.clone(),
            namespace: Some(operator.namespace.clone()),
            api_group: None,
        }]),
    }
}

/// Binds the tenant admins to the tenant-admin role in one namespace; `None` without admins.
pub fn admin_binding(namespace: &str, tenant: &Tenant) -> Option<RoleBinding> {
    if tenant.spec.admins.is_empty() {
        return None;
    }
    let subjects = tenant
        .spec
        .admins
        .iter()
        .map(|a| match a.kind {
            SubjectKind::ServiceAccount => RbacSubject {
                kind: "ServiceAccount".into(),
                name: a.name.clone(),
                namespace: a.namespace.clone(),
                api_group: None,
            },
            SubjectKind::User | SubjectKind::Group => RbacSubject {
                kind: if a.kind == SubjectKind::User { "User" } else { "Group" }.into(),
                name: a.name.clone(),
                namespace: None,
                api_group: Some("rbac.authorization.k8s.io".into()),
            },
        })
        .collect();
    Some(RoleBinding {
        metadata: meta(ADMIN_BINDING, namespace, &tenant_name(tenant)),
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "ClusterRole".into(),
            name: ADMIN_ROLE.into(),
        },
        subjects: Some(subjects),
    })
}

/// The quota of one namespace; `None` when the tenant sets none.
pub fn quota(namespace: &str, tenant: &Tenant) -> Option<ResourceQuota> {
    let q = tenant.spec.quota.as_ref()?;
    Some(ResourceQuota {
        metadata: meta(QUOTA, namespace, &tenant_name(tenant)),
        spec: Some(ResourceQuotaSpec {
            hard: Some(q.hard.iter().map(|(k, v)| (k.clone(), Quantity::from(v))).collect()),
            ..ResourceQuotaSpec::default()
        }),
        status: None,
    })
}

pub fn tenant_name(tenant: &Tenant) -> String {
    tenant.metadata.name.clone().unwrap_or_default()
}

/// One Tenant as the ownership decision sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    pub tenant: String,
    pub created: Option<Timestamp>,
    pub namespaces: Vec<String>,
}

impl Claim {
    pub fn of(t: &Tenant) -> Self {
        Self {
            tenant: tenant_name(t),
            created: t.metadata.creation_timestamp.as_ref().map(|c| c.0),
            namespaces: t.spec.namespaces.clone(),
        }
    }
}

/// Which tenant owns `namespace`: the one named by the namespace's `flotilla.dev/tenant` label
/// if that tenant still lists it, otherwise the oldest tenant that lists it (ties broken by
/// name). A later claimant is told `Conflict` and the owner is left untouched.
pub fn namespace_owner<'a>(namespace: &str, claims: &'a [Claim], label: Option<&str>) -> Option<&'a str> {
    let mut claimants: Vec<&Claim> = claims.iter().filter(|c| c.namespaces.iter().any(|n| n == namespace)).collect();
    if let Some(labelled) = label.and_then(|l| claimants.iter().find(|c| c.tenant == l)) {
        return Some(&labelled.tenant);
    }
    claimants.sort_by(|a, b| (a.created, &a.tenant).cmp(&(b.created, &b.tenant)));
    claimants.first().map(|c| c.tenant.as_str())
}

/// Why a namespace cannot be onboarded before any request is made, if it cannot.
pub fn refusal(
    namespace: &str,
    tenant: &str,
    owner: Option<&str>,
    operator: &OperatorIdentity,
) -> Option<NamespaceStatus> {
    if namespace == operator.namespace {
        return Some(NamespaceStatus {
            name: namespace.into(),
            state: NamespaceState::Error,
            message: format!("{namespace} is the operator's own namespace and cannot belong to a tenant"),
        });
    }
    if SYSTEM_NAMESPACES.contains(&namespace) {
        return Some(NamespaceStatus {
            name: namespace.into(),
            state: NamespaceState::Error,
            message: format!("{namespace} is a system namespace and cannot belong to a tenant"),
        });
    }
    match owner {
        Some(o) if o != tenant => Some(NamespaceStatus {
            name: namespace.into(),
            state: NamespaceState::Conflict,
            message: format!("namespace {namespace} already belongs to tenant {o}"),
        }),
        _ => None,
    }
}

/// Namespaces this tenant onboarded (per the last status) that are no longer listed. Only
/// namespaces it really onboarded: one it was refused (the operator's own, another tenant's)
/// is never offboarded by it.
pub fn to_offboard(tenant: &Tenant) -> Vec<String> {
    let listed = &tenant.spec.namespaces;
    tenant
        .status
        .iter()
        .flat_map(|s| s.namespaces.iter())
        .filter(|n| matches!(n.state, NamespaceState::Onboarded | NamespaceState::Offboarding))
        .filter(|n| !listed.contains(&n.name))
        .map(|n| n.name.clone())
        .collect()
}

/// The Tenant's status from the per-namespace outcomes (listed ones first, then offboarded).
pub fn tenant_status(tenant: &Tenant, mut namespaces: Vec<NamespaceStatus>, now: Timestamp) -> TenantStatus {
    let previous = tenant.status.clone().unwrap_or_default();
    // Offboarded namespaces stay visible until they are listed again.
    for old in previous.namespaces.iter().filter(|n| n.state == NamespaceState::Offboarded) {
        if !namespaces.iter().any(|n| n.name == old.name) {
            namespaces.push(old.clone());
        }
    }
    let listed = tenant.spec.namespaces.len();
    let onboarded = namespaces.iter().filter(|n| n.state == NamespaceState::Onboarded).count();
    let worst = namespaces
        .iter()
        .filter(|n| !matches!(n.state, NamespaceState::Onboarded | NamespaceState::Offboarded))
        .map(|n| (n.state, n.message.clone()))
        .min();
    let condition = match worst {
        None => DesiredCondition {
            type_: "Ready",
            status: true,
            reason: "Onboarded".into(),
            message: format!("{onboarded}/{listed} namespaces onboarded"),
        },
        Some((state, message)) => DesiredCondition {
            type_: "Ready",
            status: false,
            reason: format!("{state:?}"),
            message: format!("{onboarded}/{listed} namespaces onboarded; {message}"),
        },
    };
    TenantStatus {
        observed_generation: tenant.metadata.generation,
        summary: Some(format!("{onboarded}/{listed}")),
        conditions: merge_conditions(&previous.conditions, &[condition], tenant.metadata.generation, now),
        namespaces,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{Subject, TenantQuota, TenantSpec};

    fn claim(tenant: &str, created: i64, namespaces: &[&str]) -> Claim {
        Claim {
            tenant: tenant.into(),
            created: Some(Timestamp::from_second(created).expect("ts")),
            namespaces: namespaces.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn operator() -> OperatorIdentity {
        OperatorIdentity { namespace: "flotilla-system".into(), service_account: "flotilla".into() }
    }

    #[test]
    fn ownership_table() {
        let claims =
            [claim("a", 10, &["shared", "a-only"]), claim("b", 5, &["shared", "b-only"]), claim("c", 20, &["c"])];
        let cases = [
            ("oldest claimant wins", "shared", None, Some("b")),
            ("label keeps the owner", "shared", Some("a"), Some("a")),
            ("stale label is ignored", "c", Some("gone"), Some("c")),
            ("sole claimant", "a-only", None, Some("a")),
            ("nobody", "other", None, None),
        ];
        for (what, ns, label, want) in cases {
            assert_eq!(namespace_owner(ns, &claims, label), want, "{what}");
        }
    }

    #[test]
    fn refusals() {
        let op = operator();
        assert_eq!(refusal("flotilla-system", "a", Some("a"), &op).map(|s| s.state), Some(NamespaceState::Error));
        assert_eq!(refusal("kube-system", "a", Some("a"), &op).map(|s| s.state), Some(NamespaceState::Error));
        let conflict = refusal("shared", "a", Some("b"), &op).expect("conflict");
        assert_eq!(conflict.state, NamespaceState::Conflict);
        assert!(conflict.message.contains("tenant b"));
        assert_eq!(refusal("mine", "a", Some("a"), &op), None);
    }

    fn tenant(namespaces: &[&str]) -> Tenant {
        let mut t = Tenant::new(
            "team-a",
            TenantSpec {
                namespaces: namespaces.iter().map(|s| s.to_string()).collect(),
                admins: vec![
                    Subject { kind: SubjectKind::Group, name: "team-a".into(), namespace: None },
                    Subject { kind: SubjectKind::ServiceAccount, name: "ci".into(), namespace: Some("ci".into()) },
                ],
                quota: Some(TenantQuota {
                    hard: BTreeMap::from([("pods".to_string(), crate::api::tenant::NonNegativeQuantity("10".into()))]),
                }),
                namespace_removal_policy: Default::default(),
                prometheus_endpoints: Vec::new(),
            },
        );
        t.metadata.generation = Some(2);
        t
    }

    #[test]
    fn bindings_and_quota() {
        let t = tenant(&["a"]);
        let b = operator_binding("a", "team-a", &operator());
        assert_eq!(b.role_ref.name, WORKLOADS_ROLE);
        assert_eq!(b.subjects.as_ref().map(|s| s[0].name.as_str()), Some("flotilla"));
        let admins = admin_binding("a", &t).expect("admins");
        let subjects = admins.subjects.expect("subjects");
        assert_eq!(subjects[0].api_group.as_deref(), Some("rbac.authorization.k8s.io"));
        assert_eq!(subjects[1].namespace.as_deref(), Some("ci"));
        let q = quota("a", &t).expect("quota");
        assert_eq!(q.spec.and_then(|s| s.hard).and_then(|h| h.get("pods").cloned()), Some(Quantity("10".into())));
    }

    #[test]
    fn offboarding_and_status() {
        let mut t = tenant(&["a"]);
        t.status = Some(TenantStatus {
            namespaces: vec![
                NamespaceStatus { name: "a".into(), state: NamespaceState::Onboarded, message: String::new() },
                NamespaceStatus { name: "b".into(), state: NamespaceState::Onboarded, message: String::new() },
                NamespaceStatus {
                    name: "flotilla-system".into(),
                    state: NamespaceState::Error,
                    message: "refused".into(),
                },
                NamespaceStatus { name: "theirs".into(), state: NamespaceState::Conflict, message: "taken".into() },
                NamespaceStatus { name: "retry".into(), state: NamespaceState::Offboarding, message: "failed".into() },
            ],
            ..TenantStatus::default()
        });
        assert_eq!(
            to_offboard(&t),
            vec!["b".to_string(), "retry".to_string()],
            "refused and conflicting namespaces are never offboarded"
        );
        let now = Timestamp::from_second(1).expect("ts");
        let s = tenant_status(
            &t,
            vec![
                NamespaceStatus { name: "a".into(), state: NamespaceState::Onboarded, message: String::new() },
                NamespaceStatus { name: "b".into(), state: NamespaceState::Offboarded, message: "x".into() },
            ],
            now,
        );
        assert_eq!(s.summary.as_deref(), Some("1/1"));
        assert_eq!(s.conditions[0].status, "True");
        let s = tenant_status(
            &t,
            vec![NamespaceStatus { name: "a".into(), state: NamespaceState::Conflict, message: "taken".into() }],
            now,
        );
        assert_eq!((s.conditions[0].status.as_str(), s.conditions[0].reason.as_str()), ("False", "Conflict"));
    }
}
