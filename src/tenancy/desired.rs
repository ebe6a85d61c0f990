//! What onboarding a tenant namespace means, as objects and decisions. Pure: no I/O.

use k8s_openapi::api::core::v1::{
    LimitRange, LimitRangeItem, LimitRangeSpec, Namespace, ResourceQuota, ResourceQuotaSpec,
};
use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicySpec,
};
use k8s_openapi::api::rbac::v1::{RoleBinding, RoleRef, Subject as RbacSubject};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use std::collections::BTreeMap;

use crate::api::conditions::{DesiredCondition, merge_conditions};
use crate::api::names::{LABEL_MANAGED_BY, MANAGED_BY};
use crate::api::tenant::NonNegativeQuantity;
use crate::api::{NamespaceState, NamespaceStatus, NetworkIsolation, SubjectKind, Tenant, TenantStatus};
use crate::sharding::hash::shard_of;

pub use super::claim::LABEL_TENANT;
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
/// Name of the LimitRange in each tenant namespace.
pub const LIMIT_RANGE: &str = "flotilla-tenant";
/// Name of the NetworkPolicy in each tenant namespace.
pub const NETWORK_POLICY: &str = "flotilla-tenant";
/// The label the apiserver puts on every namespace: its name.
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";
/// Finalizer that offboards a Tenant's namespaces before it goes away.
pub const FINALIZER: &str = "flotilla.dev/offboard";
/// Fingerprint of what Flotilla last asked of a tenant object (`reconcile::apply`).
pub const ANNOTATION_DESIRED: &str = "flotilla.dev/desired";
/// The shard of a tenant namespace (`sharding::hash::shard_of`), which the apiserver's shard
/// fence (rbac/shard-fence.yaml) reads to know whose Lease the namespace's writes need.
pub const LABEL_SHARD: &str = "flotilla.dev/shard";

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

/// Prefix of the Pod Security Admission labels of a namespace.
pub const POD_SECURITY_LABEL_PREFIX: &str = "pod-security.kubernetes.io/";

/// The labels every namespace of `tenant` carries: its owner, its shard among `shards`, and
/// the Pod Security levels of `spec.podSecurity` (default: enforce baseline, warn and audit
/// restricted).
pub fn namespace_labels(namespace: &str, tenant: &Tenant, shards: u32) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::from([
        (LABEL_TENANT.to_string(), tenant_name(tenant)),
        (LABEL_SHARD.to_string(), shard_of(namespace, shards).to_string()),
    ]);
    for (mode, level) in tenant.spec.pod_security.clone().unwrap_or_default().levels() {
        labels.insert(format!("{POD_SECURITY_LABEL_PREFIX}{mode}"), level.as_str().to_string());
    }
    labels
}

/// The entries of `desired` that `current` lacks or holds with another value.
pub fn missing_labels(
    current: &BTreeMap<String, String>,
    desired: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    desired.iter().filter(|(k, v)| current.get(*k) != Some(*v)).map(|(k, v)| (k.clone(), v.clone())).collect()
}

/// A namespace created for a tenant.
pub fn desired_namespace(name: &str, tenant: &Tenant, shards: u32) -> Namespace {
    let mut labels = labels(&tenant_name(tenant));
    labels.extend(namespace_labels(name, tenant, shards));
    Namespace {
        metadata: ObjectMeta { name: Some(name.into()), labels: Some(labels), ..ObjectMeta::default() },
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

/// The LimitRange of a tenant namespace, when the Tenant asks for one.
pub fn limit_range(namespace: &str, tenant: &Tenant) -> Option<LimitRange> {
    let l = tenant.spec.limit_range.as_ref()?;
    let quantities = |m: &Option<BTreeMap<String, NonNegativeQuantity>>| {
        m.as_ref().filter(|m| !m.is_empty()).map(|m| m.iter().map(|(k, v)| (k.clone(), Quantity::from(v))).collect())
    };
    Some(LimitRange {
        metadata: meta(LIMIT_RANGE, namespace, &tenant_name(tenant)),
        spec: Some(LimitRangeSpec {
            limits: vec![LimitRangeItem {
                type_: "Container".into(),
                default: quantities(&l.default),
                default_request: quantities(&l.default_request),
                max: quantities(&l.max),
                ..LimitRangeItem::default()
            }],
        }),
    })
}

/// The NetworkPolicy of a tenant namespace: its pods admit traffic from the tenant's
/// namespaces (`Tenant`, the default) or their own (`Namespace`), and from the namespaces the
/// platform names (`platform`, the operator's `--network-policy-allowed-namespaces`, and the
/// Tenant's `allowFromNamespaces`). `None` when the Tenant asks for no isolation.
///
/// `owned` are the tenant's namespaces (those it lists that are not refused to it). Every
/// peer is named by `kubernetes.io/metadata.name`, which the apiserver sets to the
/// namespace's name and nobody can change: a label anyone who creates a namespace could write
/// (such as `flotilla.dev/tenant`) would let that namespace's pods in.
pub fn network_policy(
    namespace: &str,
    tenant: &Tenant,
    owned: &[String],
    platform: &[String],
    egress: Option<&EgressPolicy>,
) -> Option<NetworkPolicy> {
    let wanted = tenant.spec.network_policy.clone().unwrap_or_default();
    let me = tenant_name(tenant);
    let own = match wanted.isolation.unwrap_or_default() {
        NetworkIsolation::None => return egress.map(|e| egress_only(namespace, &me, e)),
        // By name and by the owner's label, which only the platform and the operator may set:
        // a listed name someone else created (before the operator could, or after a deletion)
        // is not the tenant's, and is not admitted.
        NetworkIsolation::Tenant => {
            let names = owned.iter().chain([&namespace.to_string()]).cloned().collect();
            namespaces_by_name("In", names, Some(&me))
        }
        NetworkIsolation::Namespace => {
            NetworkPolicyPeer { pod_selector: Some(LabelSelector::default()), ..NetworkPolicyPeer::default() }
        }
    };
    let others: Vec<String> = platform.iter().chain(wanted.allow_from_namespaces.iter()).cloned().collect();
    let mut from = vec![own];
    if !others.is_empty() {
        from.push(namespaces_by_name("In", others, None));
    }
    let types = if egress.is_some() { vec!["Ingress".into(), "Egress".into()] } else { vec!["Ingress".into()] };
    Some(NetworkPolicy {
        metadata: meta(NETWORK_POLICY, namespace, &me),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector::default()),
            policy_types: Some(types),
            ingress: Some(vec![NetworkPolicyIngressRule { from: Some(from), ports: None }]),
            egress: egress.map(egress_rules),
        }),
    })
}

/// The NetworkPolicy of a Tenant that asks for no isolation, when the platform limits egress:
/// egress only.
fn egress_only(namespace: &str, tenant: &str, egress: &EgressPolicy) -> NetworkPolicy {
    NetworkPolicy {
        metadata: meta(NETWORK_POLICY, namespace, tenant),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector::default()),
            policy_types: Some(vec!["Egress".into()]),
            ingress: None,
            egress: Some(egress_rules(egress)),
        }),
    }
}

/// Where the pods of every tenant may not send (`--network-policy-egress-denied-namespaces`):
/// the platform's namespaces whose services are shared (a Prometheus, an Alertmanager),
/// which the operator's query scoping protects only on its own path.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EgressPolicy {
    /// Namespaces whose pods tenants may not reach.
    pub denied_namespaces: Vec<String>,
    /// The cluster's pod and Service address ranges (`--network-policy-cluster-cidrs`): left
    /// out of the rule that lets tenants reach addresses outside the cluster, so that the
    /// denied namespaces' pods cannot be reached by address either (several network plugins
    /// match pod addresses by `ipBlock`).
    pub cluster_cidrs: Vec<String>,
}

/// The egress rules of `policy`: every pod of every namespace but the denied ones, and every
/// address outside the cluster's ranges.
fn egress_rules(policy: &EgressPolicy) -> Vec<NetworkPolicyEgressRule> {
    let namespaces = namespaces_by_name("NotIn", policy.denied_namespaces.clone(), None);
    let outside = |all: &str, v6: bool| {
        let except: Vec<String> = policy.cluster_cidrs.iter().filter(|c| c.contains(':') == v6).cloned().collect();
        NetworkPolicyPeer {
            ip_block: Some(IPBlock { cidr: all.into(), except: (!except.is_empty()).then_some(except) }),
            ..NetworkPolicyPeer::default()
        }
    };
    vec![NetworkPolicyEgressRule {
        to: Some(vec![namespaces, outside("0.0.0.0/0", false), outside("::/0", true)]),
        ports: None,
    }]
}

/// Whether `cidr` is an address range (`10.0.0.0/8`, `fd00::/8`).
pub fn is_cidr(cidr: &str) -> bool {
    let Some((address, bits)) = cidr.split_once('/') else { return false };
    let Ok(address) = address.parse::<std::net::IpAddr>() else { return false };
    let most = if address.is_ipv4() { 32 } else { 128 };
    bits.parse::<u8>().is_ok_and(|b| b <= most)
}

/// A peer of every pod in the namespaces whose name is (`In`) or is not (`NotIn`) one of
/// `names`, by `kubernetes.io/metadata.name`, and labelled for `owner` when given.
fn namespaces_by_name(operator: &str, mut names: Vec<String>, owner: Option<&str>) -> NetworkPolicyPeer {
    names.sort();
    names.dedup();
    NetworkPolicyPeer {
        namespace_selector: Some(LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: NAMESPACE_NAME_LABEL.into(),
                operator: operator.into(),
                values: Some(names),
            }]),
            match_labels: owner.map(|o| BTreeMap::from([(LABEL_TENANT.to_string(), o.to_string())])),
        }),
        ..NetworkPolicyPeer::default()
    }
}

pub fn tenant_name(tenant: &Tenant) -> String {
    tenant.metadata.name.clone().unwrap_or_default()
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

    fn operator() -> OperatorIdentity {
        OperatorIdentity { namespace: "flotilla-system".into(), service_account: "flotilla".into() }
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
                pod_security: None,
                prometheus_endpoints: Vec::new(),
                limit_range: None,
                network_policy: None,
                pod_policy: None,
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
    fn limit_range_only_when_asked() {
        use crate::api::TenantLimitRange;
        use crate::api::tenant::NonNegativeQuantity;
        let mut t = tenant(&["a"]);
        assert!(limit_range("a", &t).is_none());
        t.spec.limit_range = Some(TenantLimitRange {
            default_request: Some(BTreeMap::from([("cpu".to_string(), NonNegativeQuantity("100m".into()))])),
            ..TenantLimitRange::default()
        });
        let l = limit_range("a", &t).expect("limit range");
        let item = &l.spec.expect("spec").limits[0];
        assert_eq!(item.type_, "Container");
        assert_eq!(item.default_request.as_ref().and_then(|d| d.get("cpu")).map(|q| q.0.as_str()), Some("100m"));
        assert!(item.default.is_none() && item.max.is_none());
    }

    #[test]
    fn network_policy_admits_the_tenant_and_the_platform() {
        use crate::api::{NetworkIsolation, TenantNetworkPolicy};
        let mut t = tenant(&["a"]);
        let peers = |p: Option<NetworkPolicy>| -> Vec<String> {
            let spec = p.expect("policy").spec.expect("spec");
            assert_eq!(spec.policy_types.as_deref(), Some(&["Ingress".to_string()][..]));
            assert_eq!(spec.pod_selector, Some(LabelSelector::default()), "every pod of the namespace");
            let rules = spec.ingress.expect("ingress");
            rules[0].from.iter().flatten().map(|peer| serde_json::to_string(peer).expect("json")).collect()
        };
        assert_eq!(
            peers(network_policy("a", &t, &["c".into(), "b".into()], &[], None)),
            [
                r#"{"namespaceSelector":{"matchExpressions":[{"key":"kubernetes.io/metadata.name","operator":"In","values":["a","b","c"]}],"matchLabels":{"flotilla.dev/tenant":"team-a"}}}"#
            ],
            "by default: the tenant's own namespaces, by the name the apiserver sets and the owner's label"
        );
        assert_eq!(
            peers(network_policy("a", &t, &[], &[], None)),
            [
                r#"{"namespaceSelector":{"matchExpressions":[{"key":"kubernetes.io/metadata.name","operator":"In","values":["a"]}],"matchLabels":{"flotilla.dev/tenant":"team-a"}}}"#
            ],
            "a tenant with no other namespace admits its own"
        );
        t.spec.network_policy = Some(TenantNetworkPolicy {
            isolation: Some(NetworkIsolation::Namespace),
            allow_from_namespaces: vec!["monitoring".into(), "ingress".into()],
        });
        assert_eq!(
            peers(network_policy("a", &t, &[], &["ingress".into()], None)),
            [
                r#"{"podSelector":{}}"#.to_string(),
                r#"{"namespaceSelector":{"matchExpressions":[{"key":"kubernetes.io/metadata.name","operator":"In","values":["ingress","monitoring"]}]}}"#.to_string(),
            ]
        );
        t.spec.network_policy =
            Some(TenantNetworkPolicy { isolation: Some(NetworkIsolation::None), ..Default::default() });
        assert!(network_policy("a", &t, &[], &["ingress".into()], None).is_none());
    }

    #[test]
    fn egress_to_the_denied_namespaces_is_not_admitted_by_name_nor_by_address() {
        let t = tenant(&["a"]);
        let egress = EgressPolicy {
            denied_namespaces: vec!["monitoring".into(), "alerting".into()],
            cluster_cidrs: vec!["10.0.0.0/8".into(), "fd00::/8".into()],
        };
        let spec = network_policy("a", &t, &[], &[], Some(&egress)).expect("policy").spec.expect("spec");
        assert_eq!(spec.policy_types, Some(vec!["Ingress".to_string(), "Egress".to_string()]));
        let rules = serde_json::to_string(&spec.egress).expect("json");
        assert_eq!(
            rules,
            r#"[{"to":[{"namespaceSelector":{"matchExpressions":[{"key":"kubernetes.io/metadata.name","operator":"NotIn","values":["alerting","monitoring"]}]}},{"ipBlock":{"cidr":"0.0.0.0/0","except":["10.0.0.0/8"]}},{"ipBlock":{"cidr":"::/0","except":["fd00::/8"]}}]}]"#
        );
        let none = network_policy("a", &t, &[], &[], None).expect("policy").spec.expect("spec");
        assert!(none.egress.is_none(), "without the flag, egress stays open");
        let mut open = t.clone();
        open.spec.network_policy =
            Some(crate::api::TenantNetworkPolicy { isolation: Some(NetworkIsolation::None), ..Default::default() });
        let only = network_policy("a", &open, &[], &[], Some(&egress)).expect("an egress policy").spec.expect("spec");
        assert_eq!(only.policy_types, Some(vec!["Egress".to_string()]), "no isolation asked: egress only");
        assert!(only.ingress.is_none() && only.egress.is_some());
        assert!(is_cidr("10.96.0.0/12") && is_cidr("fd00::/8"));
        assert!(!is_cidr("10.96.0.0") && !is_cidr("10.0.0.0/33") && !is_cidr("monitoring/8"));
    }

    #[test]
    fn namespace_labels_carry_owner_and_pod_security() {
        use crate::api::{EnforceLevel, PodSecurity, PodSecurityLevel};
        let mut t = tenant(&["a"]);
        let labels = namespace_labels("a", &t, 32);
        let want = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
        };
        assert_eq!(
            labels,
            want(&[
                ("flotilla.dev/shard", &shard_of("a", 32).to_string()),
                ("flotilla.dev/tenant", "team-a"),
                ("pod-security.kubernetes.io/audit", "restricted"),
                ("pod-security.kubernetes.io/enforce", "baseline"),
                ("pod-security.kubernetes.io/warn", "restricted"),
            ])
        );
        t.spec.pod_security = Some(PodSecurity {
            enforce: Some(EnforceLevel::Restricted),
            warn: None,
            audit: Some(PodSecurityLevel::Baseline),
        });
        let labels = namespace_labels("a", &t, 32);
        assert_eq!(labels.get("pod-security.kubernetes.io/enforce").map(String::as_str), Some("restricted"));
        assert_eq!(labels.get("pod-security.kubernetes.io/warn").map(String::as_str), Some("restricted"));
        assert_eq!(labels.get("pod-security.kubernetes.io/audit").map(String::as_str), Some("baseline"));
        let created = desired_namespace("a", &t, 32);
        let created = created.metadata.labels.expect("labels");
        assert_eq!(created.get("app.kubernetes.io/managed-by").map(String::as_str), Some("flotilla"));
        assert!(labels.iter().all(|(k, v)| created.get(k) == Some(v)));
        // An existing namespace is patched only with what differs.
        let mut current = labels.clone();
        current.insert("team".into(), "x".into());
        assert!(missing_labels(&current, &labels).is_empty());
        current.insert("pod-security.kubernetes.io/enforce".into(), "privileged".into());
        assert_eq!(missing_labels(&current, &labels), want(&[("pod-security.kubernetes.io/enforce", "restricted")]));
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
