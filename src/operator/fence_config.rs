//! Whether the apiserver's admission policies as installed cover this replica.
//!
//! The shard fence (rbac/shard-fence.yaml) and the limits on the operator's own writes
//! (rbac/admission.yaml) name the operator's user in their text: a match condition compares
//! the request's user name with `system:serviceaccount:<namespace>:<account>`. The fence's
//! bindings also read each shard's Lease from `paramRef.namespace`, with
//! `parameterNotFoundAction: Allow`. An install that moves the operator to another namespace
//! without rewriting both (a kustomize overlay's `namespace:` reaches into neither CEL nor
//! `paramRef`) leaves policies that match none of its requests or find no Lease, and so let
//! every write through: two replicas could then write one namespace, and the operator could
//! write what the limits forbid it. A replica reads the policies and the bindings of its
//! shards at start and refuses to run when they name another user or another namespace.

use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use kube::Client;
use kube::api::Api;

/// The policy that fences each shard (rbac/shard-fence.yaml).
pub const POLICY: &str = "flotilla-shard-fence-per-shard";

/// The policy (and its binding) that refuses writes in shards without a binding of their own.
pub const UNBOUND: &str = "flotilla-shard-fence-unbound";

/// Every policy that matches the operator's requests by its user name: the shard fence's two
/// and the limits on its own writes (rbac/admission.yaml).
pub const POLICIES: [&str; 7] = [
    POLICY,
    UNBOUND,
    "flotilla-operator-onboarding",
    "flotilla-operator-tenant-admins",
    "flotilla-operator-namespaces",
    "flotilla-operator-workloads",
    "flotilla-operator-tenants",
];

/// The binding of `shard`'s Lease to the policy.
pub fn binding_name(shard: u32) -> String {
    format!("flotilla-shard-fence-{shard}")
}

/// Policies installed for another user or another Lease namespace than this replica's.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "the apiserver's admission policies do not cover this replica: {why}. Two replicas could then write one namespace, so this replica does not start. Install rbac/ for the operator's namespace (the Helm chart does; a kustomize overlay that sets `namespace:` must also rewrite the policies' user name and the bindings' paramRef.namespace, see docs/operations.md, \"Installing in another namespace\")"
)]
pub struct Misconfigured {
    pub why: String,
}

/// What a replica does when the policies do not cover it.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnMismatch {
    /// Exit with what to fix (the default).
    #[default]
    Refuse,
    /// Log it as an error and run: for installs that fence the operator by other means
    /// (renamed policies, another admission controller).
    Warn,
}

/// What the replica found when it read the policies.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Every policy matches exactly this replica's user, every binding is in place and
    /// denies, and every shard's binding reads this replica's Lease, but for `shut`: shards
    /// without a binding, where flotilla-shard-fence-unbound refuses every write.
    Covers { shut: Vec<u32> },
    /// The policies could not be read (an install older than the rule that lets the replica
    /// read them, or an apiserver that did not answer in time): not known.
    Unknown { why: String },
}

/// What is installed: each of `POLICIES` with its binding (named like the policy, but for
/// the per-shard policy), and the binding of each shard `0..`.
#[derive(Clone, Debug, Default)]
pub struct Installed {
    pub policies: Vec<(&'static str, Option<ValidatingAdmissionPolicy>)>,
    pub bindings: Vec<(&'static str, Option<ValidatingAdmissionPolicyBinding>)>,
    pub shard_bindings: Vec<(u32, Option<ValidatingAdmissionPolicyBinding>)>,
}

/// The shard label values the unbound binding leaves to per-shard bindings (its `NotIn`),
/// when its selector is exactly one `NotIn` on the shard label and nothing else (`None`:
/// it selects some other way, so which shards it fences shut is not known).
fn left_to_shard_bindings(unbound: &ValidatingAdmissionPolicyBinding) -> Option<Vec<String>> {
    let m = unbound.spec.match_resources.as_ref()?;
    let namespaces = m.namespace_selector.as_ref()?;
    let expressions = namespaces.match_expressions.as_deref().unwrap_or_default();
    match expressions {
        [e] if e.key == "flotilla.dev/shard"
            && e.operator == "NotIn"
            && namespaces.match_labels.as_ref().is_none_or(|l| l.is_empty())
            && only_namespaces(m) =>
        {
            Some(e.values.clone().unwrap_or_default())
        }
        _ => None,
    }
}

/// The user rbac/ is written for; the Helm chart and the overlays replace it.
const SHIPPED_USER: &str = "system:serviceaccount:flotilla-system:flotilla";

/// A policy's match conditions as (name, expression without whitespace), sorted.
fn conditions_of(conditions: &[MatchCondition]) -> Vec<(String, String)> {
    let mut out: Vec<_> =
        conditions.iter().map(|c| (c.name.clone(), c.expression.split_whitespace().collect::<String>())).collect();
    out.sort();
    out
}

/// The policies rbac/ ships (embedded at build time).
fn shipped_policies() -> Vec<ValidatingAdmissionPolicy> {
    use serde::Deserialize;
    let files = [include_str!("../../rbac/shard-fence.yaml"), include_str!("../../rbac/admission.yaml")];
    files
        .iter()
        .flat_map(|f| serde_yaml::Deserializer::from_str(f))
        .filter_map(|doc| ValidatingAdmissionPolicy::deserialize(doc).ok())
        .collect()
}

/// The match conditions `shipped` gives policy `name`, for `username` (`None`: not shipped).
fn shipped_conditions(
    shipped: &[ValidatingAdmissionPolicy],
    name: &str,
    username: &str,
) -> Option<Vec<(String, String)>> {
    let policy = shipped.iter().find(|p| p.metadata.name.as_deref() == Some(name))?;
    let mut conditions = policy.spec.as_ref()?.match_conditions.clone().unwrap_or_default();
    for c in &mut conditions {
        c.expression = c.expression.replace(&format!("'{SHIPPED_USER}'"), &format!("'{username}'"));
    }
    Some(conditions_of(&conditions))
}

/// Why `binding` does not enforce `policy`, if it does not: it binds another policy, or it
/// does not Deny.
fn not_enforcing(binding: &ValidatingAdmissionPolicyBinding, name: &str, policy: &str) -> Option<String> {
    if binding.spec.policy_name != policy {
        return Some(format!("ValidatingAdmissionPolicyBinding {name} does not bind {policy}"));
    }
    if !binding.spec.validation_actions.iter().any(|a| a == "Deny") {
        return Some(format!("ValidatingAdmissionPolicyBinding {name} does not Deny"));
    }
    None
}

/// Whether `binding` selects exactly the namespaces labelled with shard `shard`.
fn selects_shard(binding: &ValidatingAdmissionPolicyBinding, shard: u32) -> bool {
    let Some(m) = binding.spec.match_resources.as_ref() else { return false };
    let namespaces = m.namespace_selector.as_ref();
    let labels = namespaces.and_then(|s| s.match_labels.clone()).unwrap_or_default();
    labels.len() == 1
        && labels.get("flotilla.dev/shard") == Some(&shard.to_string())
        && namespaces.and_then(|s| s.match_expressions.as_ref()).is_none_or(|e| e.is_empty())
        && only_namespaces(m)
}

/// Whether a binding's match narrows nothing but the namespaces (no object selector, no
/// resource rules of its own, none excluded).
fn only_namespaces(m: &k8s_openapi::api::admissionregistration::v1::MatchResources) -> bool {
    m.object_selector.as_ref().is_none_or(|o| {
        o.match_labels.as_ref().is_none_or(|l| l.is_empty())
            && o.match_expressions.as_ref().is_none_or(|e| e.is_empty())
    }) && m.resource_rules.as_ref().is_none_or(|r| r.is_empty())
        && m.exclude_resource_rules.as_ref().is_none_or(|r| r.is_empty())
}

/// Judges what is installed for a replica that authenticates as `username` and keeps its
/// Leases in `lease_namespace`. Pure.
/// `Ok` holds the shards that have no binding and are fenced shut by the unbound policy:
/// every write of a replica there is refused.
pub fn judge(installed: &Installed, username: &str, lease_namespace: &str) -> Result<Vec<u32>, Misconfigured> {
    let refuse = |why: String| Err(Misconfigured { why });
    let shipped = shipped_policies();
    // Exactly the conditions shipped in rbac/, with this replica's user: a condition added
    // beside them (an overlay that added the new user's condition instead of replacing the
    // old one), however it is spelled, makes the policy match no request at all.
    for (name, policy) in &installed.policies {
        let Some(policy) = policy else {
            return refuse(format!("ValidatingAdmissionPolicy {name} is not installed"));
        };
        let found = conditions_of(policy.spec.as_ref().and_then(|s| s.match_conditions.as_deref()).unwrap_or_default());
        if Some(found) != shipped_conditions(&shipped, name, username) {
            return refuse(format!(
                "the match conditions of ValidatingAdmissionPolicy {name} are not those of rbac/ for user {username}, this replica's"
            ));
        }
    }
    let mut unbound = None;
    for (name, binding) in &installed.bindings {
        let Some(binding) = binding else {
            return refuse(format!("ValidatingAdmissionPolicyBinding {name} is not installed"));
        };
        if let Some(why) = not_enforcing(binding, name, name) {
            return refuse(why);
        }
        if *name == UNBOUND {
            unbound = Some(binding);
        }
    }
    let left = unbound.and_then(left_to_shard_bindings);
    let mut shut = Vec::new();
    for (shard, binding) in &installed.shard_bindings {
        let name = binding_name(*shard);
        let Some(binding) = binding else {
            // Without its binding, a shard is fenced shut by the unbound policy, unless that
            // policy leaves the shard to the missing binding: then nothing fences it.
            match &left {
                Some(left) if !left.contains(&shard.to_string()) => {
                    shut.push(*shard);
                    continue;
                }
                Some(_) => {
                    return refuse(format!(
                        "shard {shard} has no ValidatingAdmissionPolicyBinding {name}, and {UNBOUND} leaves it to that binding: nothing fences its namespaces"
                    ));
                }
                None => {
                    return refuse(format!(
                        "shard {shard} has no ValidatingAdmissionPolicyBinding {name}, and the binding {UNBOUND} does not select shards by a NotIn of those with bindings: nothing may fence its namespaces"
                    ));
                }
            }
        };
        if !selects_shard(binding, *shard) {
            return refuse(format!(
                "ValidatingAdmissionPolicyBinding {name} does not select exactly the namespaces of shard {shard} (flotilla.dev/shard: \"{shard}\")"
            ));
        }
        if let Some(why) = not_enforcing(binding, &name, POLICY) {
            return refuse(why);
        }
        let param = binding.spec.param_ref.as_ref();
        let lease = format!("flotilla-shard-{shard}");
        let (param_ns, param_name) =
            (param.and_then(|p| p.namespace.as_deref()), param.and_then(|p| p.name.as_deref()));
        if param_ns != Some(lease_namespace) || param_name != Some(lease.as_str()) {
            return refuse(format!(
                "ValidatingAdmissionPolicyBinding {name} reads Lease {}/{}, but this replica's shard {shard} is Lease {lease_namespace}/{lease}",
                param_ns.unwrap_or("(the request's namespace)"),
                param_name.unwrap_or("(none)")
            ));
        }
    }
    Ok(shut)
}

/// How long the replica waits at start to read the policies before it runs without knowing.
const CHECK_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

/// Gets each of `keys` by its name, at most 16 requests at once (`None`: not found).
async fn get_each<K, Key>(
    api: &Api<K>,
    keys: impl IntoIterator<Item = Key>,
    name: impl Fn(&Key) -> String,
) -> Result<Vec<(Key, Option<K>)>, kube::Error>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    use futures::{StreamExt, TryStreamExt};
    futures::stream::iter(keys)
        .map(|key| {
            let name = name(&key);
            async move { api.get_opt(&name).await.map(|found| (key, found)) }
        })
        .buffered(16)
        .try_collect()
        .await
}

/// Reads the policies, their bindings and the shards' bindings.
async fn read(client: &Client, shards: u32) -> Result<Installed, kube::Error> {
    let policies_api: Api<ValidatingAdmissionPolicy> = Api::all(client.clone());
    let bindings_api: Api<ValidatingAdmissionPolicyBinding> = Api::all(client.clone());
    let named = |n: &&'static str| n.to_string();
    Ok(Installed {
        policies: get_each(&policies_api, POLICIES, named).await?,
        bindings: get_each(&bindings_api, POLICIES.into_iter().filter(|n| *n != POLICY), named).await?,
        shard_bindings: get_each(&bindings_api, 0..shards, |s| binding_name(*s)).await?,
    })
}

/// Reads what is installed and judges it. Policies that name another user or namespace are
/// `Misconfigured`. A 403 (roles older than this check), or no full answer within 10 s
/// (tried again every 2 s meanwhile), is `Unknown`: the replica warns and starts.
pub async fn check(
    client: &Client,
    username: &str,
    lease_namespace: &str,
    shards: u32,
) -> Result<Verdict, Misconfigured> {
    let attempts = async {
        loop {
            match read(client, shards).await {
                Ok(installed) => return Ok(installed),
                Err(kube::Error::Api(e)) if e.code == 403 => {
                    return Err(format!(
                        "may not read the admission policies ({}); rbac/operator.yaml lets it",
                        e.message
                    ));
                }
                Err(e) => {
                    tracing::debug!(error = %e, "reading the admission policies; trying again");
                    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
                }
            }
        }
    };
    match tokio::time::timeout(CHECK_DEADLINE, attempts).await {
        Ok(Ok(installed)) => judge(&installed, username, lease_namespace).map(|shut| Verdict::Covers { shut }),
        Ok(Err(why)) => Ok(Verdict::Unknown { why }),
        Err(_) => Ok(Verdict::Unknown { why: format!("the apiserver did not answer within {CHECK_DEADLINE:?}") }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    const ME: &str = "system:serviceaccount:flotilla-system:flotilla";
    const MOVED: &str = "system:serviceaccount:platform:flotilla";

    /// What `rbac/` installs, read from the files themselves.
    fn installed() -> Installed {
        let files = [
            include_str!("../../rbac/shard-fence.yaml"),
            include_str!("../../rbac/admission.yaml"),
            include_str!("../../rbac/shard-fence-bindings.yaml"),
        ];
        let mut installed = Installed {
            policies: POLICIES.iter().map(|n| (*n, None)).collect(),
            bindings: POLICIES.iter().filter(|n| **n != POLICY).map(|n| (*n, None)).collect(),
            shard_bindings: Vec::new(),
        };
        for doc in files.iter().flat_map(|f| serde_yaml::Deserializer::from_str(f)) {
            let value = serde_yaml::Value::deserialize(doc).expect("yaml");
            let name = value["metadata"]["name"].as_str().unwrap_or_default().to_string();
            if value["kind"] == "ValidatingAdmissionPolicy" {
                if let Some(slot) = installed.policies.iter_mut().find(|(n, _)| *n == name) {
                    slot.1 = Some(serde_yaml::from_value(value).expect("policy"));
                }
            } else if value["kind"] == "ValidatingAdmissionPolicyBinding" {
                let binding: ValidatingAdmissionPolicyBinding = serde_yaml::from_value(value).expect("binding");
                if let Some(slot) = installed.bindings.iter_mut().find(|(n, _)| *n == name) {
                    slot.1 = Some(binding);
                } else if let Some(shard) = name.strip_prefix("flotilla-shard-fence-").and_then(|s| s.parse().ok()) {
                    installed.shard_bindings.push((shard, Some(binding)));
                }
            }
        }
        assert!(installed.policies.iter().all(|(_, p)| p.is_some()), "every policy of POLICIES is in rbac/");
        assert!(installed.bindings.iter().all(|(_, b)| b.is_some()), "every policy's binding is in rbac/");
        installed
    }

    fn conditions(
        installed: &mut Installed,
        i: usize,
    ) -> &mut Vec<k8s_openapi::api::admissionregistration::v1::MatchCondition> {
        installed.policies[i]
            .1
            .as_mut()
            .and_then(|p| p.spec.as_mut())
            .and_then(|s| s.match_conditions.as_mut())
            .expect("conditions")
    }

    /// The policies' user rewritten to `MOVED` (what the docs' overlay does first).
    fn user_moved(mut installed: Installed) -> Installed {
        for i in 0..installed.policies.len() {
            for c in conditions(&mut installed, i) {
                c.expression = c.expression.replace(ME, MOVED);
            }
        }
        installed
    }

    #[test]
    fn the_policies_in_rbac_cover_a_replica_in_flotilla_system() {
        let installed = installed();
        assert_eq!(installed.shard_bindings.len(), 32);
        assert_eq!(judge(&installed, ME, "flotilla-system"), Ok(vec![]));
    }

    #[test]
    fn a_replica_moved_to_another_namespace_is_refused() {
        let err = judge(&installed(), MOVED, "platform").expect_err("another user");
        assert!(err.why.contains("are not those of rbac/ for user system:serviceaccount:platform:flotilla"), "{err}");
        // The user rewritten in all policies but one of the limits: still refused.
        let mut one_left = user_moved(installed());
        one_left.policies[4] = installed().policies[4].clone();
        let err = judge(&one_left, MOVED, "platform").expect_err("one policy not rewritten");
        assert!(err.why.contains("ValidatingAdmissionPolicy flotilla-operator-namespaces are not"), "{err}");
        // The user rewritten everywhere, the bindings not (what a kustomize `namespace:` leaves).
        let err = judge(&user_moved(installed()), MOVED, "platform").expect_err("another Lease namespace");
        assert!(err.why.contains("flotilla-shard-fence-0 reads Lease flotilla-system/flotilla-shard-0"), "{err}");
        assert!(err.to_string().contains("does not start"), "{err}");
        // Both rewritten: covered.
        let mut moved = user_moved(installed());
        for (_, b) in moved.shard_bindings.iter_mut() {
            if let Some(p) = b.as_mut().and_then(|b| b.spec.param_ref.as_mut()) {
                p.namespace = Some("platform".into());
            }
        }
        assert_eq!(judge(&moved, MOVED, "platform"), Ok(vec![]));
    }

    #[test]
    fn a_condition_added_beside_the_old_one_is_refused() {
        // An overlay that adds the new user's condition instead of replacing the old one:
        // both must hold, so the policy matches no request at all.
        let mut added = installed();
        conditions(&mut added, 2).push(k8s_openapi::api::admissionregistration::v1::MatchCondition {
            name: "the-operator-moved".into(),
            expression: format!("request.userInfo.username == '{MOVED}'"),
        });
        let err = judge(&added, ME, "flotilla-system").expect_err("two conditions on the user");
        assert!(err.why.contains("ValidatingAdmissionPolicy flotilla-operator-onboarding are not"), "{err}");
        // A condition that only mentions the user (here, one that excludes it) is refused too.
        let mut negated = installed();
        conditions(&mut negated, 0)[0].expression = format!("request.userInfo.username != '{ME}'");
        assert!(judge(&negated, ME, "flotilla-system").is_err());
        // However the added condition is spelled.
        let mut spelled = installed();
        conditions(&mut spelled, 5).push(k8s_openapi::api::admissionregistration::v1::MatchCondition {
            name: "extra".into(),
            expression: "false".into(),
        });
        assert!(judge(&spelled, ME, "flotilla-system").is_err());
    }

    #[test]
    fn missing_foreign_or_warn_only_policies_and_bindings_are_refused() {
        let mut missing = installed();
        missing.policies[1].1 = None;
        let err = judge(&missing, ME, "flotilla-system").expect_err("missing policy");
        assert!(err.why.contains("flotilla-shard-fence-unbound is not installed"), "{err}");
        let mut no_binding = installed();
        no_binding.bindings[3].1 = None;
        let err = judge(&no_binding, ME, "flotilla-system").expect_err("missing binding");
        assert!(
            err.why.contains("ValidatingAdmissionPolicyBinding flotilla-operator-namespaces is not installed"),
            "{err}"
        );
        let mut other = installed();
        if let Some(b) = other.shard_bindings[3].1.as_mut() {
            b.spec.policy_name = "something-else".into();
        }
        assert!(judge(&other, ME, "flotilla-system").expect_err("foreign").why.contains("does not bind"));
        let mut warn = installed();
        if let Some(b) = warn.shard_bindings[5].1.as_mut() {
            b.spec.validation_actions = vec!["Warn".into()];
        }
        assert!(judge(&warn, ME, "flotilla-system").expect_err("warn only").why.contains("does not Deny"));
        let mut warn_limit = installed();
        if let Some(b) = warn_limit.bindings[4].1.as_mut() {
            b.spec.validation_actions = vec!["Audit".into()];
        }
        assert!(judge(&warn_limit, ME, "flotilla-system").expect_err("audit only").why.contains("does not Deny"));
        let mut wrong_lease = installed();
        if let Some(p) = wrong_lease.shard_bindings[7].1.as_mut().and_then(|b| b.spec.param_ref.as_mut()) {
            p.name = Some("flotilla-shard-8".into());
        }
        assert!(judge(&wrong_lease, ME, "flotilla-system").is_err());
    }

    #[test]
    fn a_shard_without_its_binding_is_refused_unless_the_unbound_policy_fences_it_shut() {
        // rbac/ leaves shards 0-31 to their bindings: without one, nothing fences shard 9.
        let mut missing = installed();
        missing.shard_bindings[9].1 = None;
        let err = judge(&missing, ME, "flotilla-system").expect_err("shard 9 unfenced");
        assert!(err.why.contains("shard 9 has no ValidatingAdmissionPolicyBinding flotilla-shard-fence-9"), "{err}");
        // A replica run with more shards than bindings: shard 32 is not left to a binding, so
        // the unbound policy refuses every write there (fenced shut, not open).
        let mut more = installed();
        more.shard_bindings.push((32, None));
        assert_eq!(judge(&more, ME, "flotilla-system"), Ok(vec![32]));
        // An unbound binding that selects some other way than a NotIn of the bound shards:
        // which shards it fences shut is not known, so a shard without a binding is refused.
        let mut narrowed = more.clone();
        if let Some(selector) = narrowed.bindings[0]
            .1
            .as_mut()
            .and_then(|b| b.spec.match_resources.as_mut())
            .and_then(|m| m.namespace_selector.as_mut())
        {
            selector.match_labels = Some([("team".to_string(), "a".to_string())].into());
        }
        let err = judge(&narrowed, ME, "flotilla-system").expect_err("unbound narrowed");
        assert!(err.why.contains("shard 32 has no"), "{err}");
        // A shard's binding that selects another shard's namespaces leaves its own unfenced.
        let mut crossed = installed();
        if let Some(labels) = crossed.shard_bindings[4]
            .1
            .as_mut()
            .and_then(|b| b.spec.match_resources.as_mut())
            .and_then(|m| m.namespace_selector.as_mut())
            .and_then(|s| s.match_labels.as_mut())
        {
            labels.insert("flotilla.dev/shard".into(), "5".into());
        }
        let err = judge(&crossed, ME, "flotilla-system").expect_err("binding of shard 4 selects shard 5");
        assert!(err.why.contains("flotilla-shard-fence-4 does not select exactly the namespaces of shard 4"), "{err}");
    }
}
