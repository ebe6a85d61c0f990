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

use k8s_openapi::api::admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding};
use kube::Client;
use kube::api::Api;

/// The policy that fences each shard (rbac/shard-fence.yaml).
pub const POLICY: &str = "flotilla-shard-fence-per-shard";

/// Every policy that matches the operator's requests by its user name: the shard fence's two
/// and the limits on its own writes (rbac/admission.yaml).
pub const POLICIES: [&str; 6] = [
    POLICY,
    "flotilla-shard-fence-unbound",
    "flotilla-operator-onboarding",
    "flotilla-operator-tenant-admins",
    "flotilla-operator-namespaces",
    "flotilla-operator-workloads",
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

/// What the replica found when it read the policies.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Every policy matches this replica's user and every binding found reads this
    /// replica's Leases (a shard without a binding is fenced shut by
    /// flotilla-shard-fence-unbound).
    Covers,
    /// The policies could not be read (an install older than the rule that lets the replica
    /// read them, or the apiserver did not answer): not known.
    Unknown { why: String },
}

/// Judges the installed policies (`(name, policy)` for each of `POLICIES`) and the
/// bindings of shards `0..` for a replica that authenticates as `username` and keeps its
/// Leases in `lease_namespace`. Pure.
pub fn judge(
    policies: &[(&str, Option<ValidatingAdmissionPolicy>)],
    bindings: &[(u32, Option<ValidatingAdmissionPolicyBinding>)],
    username: &str,
    lease_namespace: &str,
) -> Result<(), Misconfigured> {
    let quoted = format!("'{username}'");
    for (name, policy) in policies {
        let Some(policy) = policy else {
            return Err(Misconfigured { why: format!("ValidatingAdmissionPolicy {name} is not installed") });
        };
        let names_me = policy
            .spec
            .as_ref()
            .and_then(|s| s.match_conditions.as_ref())
            .is_some_and(|conditions| conditions.iter().any(|c| c.expression.contains(&quoted)));
        if !names_me {
            return Err(Misconfigured {
                why: format!(
                    "ValidatingAdmissionPolicy {name} does not match requests of user {username}, this replica's"
                ),
            });
        }
    }
    for (shard, binding) in bindings {
        let Some(binding) = binding else { continue };
        let name = binding_name(*shard);
        let spec = &binding.spec;
        if spec.policy_name != POLICY {
            return Err(Misconfigured {
                why: format!("ValidatingAdmissionPolicyBinding {name} does not bind {POLICY}"),
            });
        }
        let param = spec.param_ref.as_ref();
        let lease = format!("flotilla-shard-{shard}");
        let (param_ns, param_name) =
            (param.and_then(|p| p.namespace.as_deref()), param.and_then(|p| p.name.as_deref()));
        if param_ns != Some(lease_namespace) || param_name != Some(lease.as_str()) {
            return Err(Misconfigured {
                why: format!(
                    "ValidatingAdmissionPolicyBinding {name} reads Lease {}/{}, but this replica's shard {shard} is Lease {lease_namespace}/{lease}",
                    param_ns.unwrap_or("(the request's namespace)"),
                    param_name.unwrap_or("(none)")
                ),
            });
        }
        let denies = spec.validation_actions.iter().any(|a| a == "Deny");
        if !denies {
            return Err(Misconfigured { why: format!("ValidatingAdmissionPolicyBinding {name} does not Deny") });
        }
    }
    Ok(())
}

/// Reads the policy and the bindings of `shards` shards and judges them. A 403 or an
/// apiserver that does not answer is `Unknown` (the replica warns and starts); a fence that
/// names another user or namespace is `Misconfigured`.
pub async fn check(
    client: &Client,
    username: &str,
    lease_namespace: &str,
    shards: u32,
) -> Result<Verdict, Misconfigured> {
    let policies_api: Api<ValidatingAdmissionPolicy> = Api::all(client.clone());
    let bindings_api: Api<ValidatingAdmissionPolicyBinding> = Api::all(client.clone());
    let mut policies = Vec::new();
    for name in POLICIES {
        match policies_api.get_opt(name).await {
            Ok(p) => policies.push((name, p)),
            Err(e) => return Ok(Verdict::Unknown { why: format!("reading ValidatingAdmissionPolicy {name}: {e}") }),
        }
    }
    let mut bindings = Vec::new();
    for shard in 0..shards {
        match bindings_api.get_opt(&binding_name(shard)).await {
            Ok(b) => bindings.push((shard, b)),
            Err(e) => {
                return Ok(Verdict::Unknown {
                    why: format!("reading ValidatingAdmissionPolicyBinding {}: {e}", binding_name(shard)),
                });
            }
        }
    }
    judge(&policies, &bindings, username, lease_namespace).map(|()| Verdict::Covers)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME: &str = "system:serviceaccount:flotilla-system:flotilla";

    type Policies = Vec<(&'static str, Option<ValidatingAdmissionPolicy>)>;

    fn installed() -> (Policies, Vec<(u32, Option<ValidatingAdmissionPolicyBinding>)>) {
        let docs = [include_str!("../../rbac/shard-fence.yaml"), include_str!("../../rbac/admission.yaml")];
        let bindings_yaml = include_str!("../../rbac/shard-fence-bindings.yaml");
        let mut policies: Policies = POLICIES.iter().map(|n| (*n, None)).collect();
        for doc in docs.iter().flat_map(|d| serde_yaml::Deserializer::from_str(d)) {
            let value = serde_yaml::Value::deserialize(doc).expect("yaml");
            if value["kind"] != "ValidatingAdmissionPolicy" {
                continue;
            }
            let name = value["metadata"]["name"].as_str().unwrap_or_default().to_string();
            if let Some(slot) = policies.iter_mut().find(|(n, _)| *n == name) {
                slot.1 = Some(serde_yaml::from_value(value).expect("policy"));
            }
        }
        let mut bindings = Vec::new();
        for doc in serde_yaml::Deserializer::from_str(bindings_yaml) {
            let value = serde_yaml::Value::deserialize(doc).expect("yaml");
            if value.is_null() {
                continue;
            }
            let b: ValidatingAdmissionPolicyBinding = serde_yaml::from_value(value).expect("binding");
            // The unbound policy's binding is the one without a shard number.
            if let Some(shard) =
                b.metadata.name.as_deref().and_then(|n| n.rsplit('-').next()).and_then(|s| s.parse().ok())
            {
                bindings.push((shard, Some(b)));
            }
        }
        assert!(policies.iter().all(|(_, p)| p.is_some()), "every policy of POLICIES is in rbac/");
        (policies, bindings)
    }

    use serde::Deserialize;

    #[test]
    fn the_fence_in_rbac_covers_a_replica_in_flotilla_system() {
        let (policies, bindings) = installed();
        assert_eq!(bindings.len(), 32);
        assert_eq!(judge(&policies, &bindings, ME, "flotilla-system"), Ok(()));
    }

    #[test]
    fn a_replica_moved_to_another_namespace_is_refused() {
        let (policies, bindings) = installed();
        let moved = "system:serviceaccount:platform:flotilla";
        let err = judge(&policies, &bindings, moved, "platform").expect_err("another user");
        assert!(err.why.contains("does not match requests of user system:serviceaccount:platform:flotilla"), "{err}");
        // The user rewritten in all policies but one of the limits: still refused.
        let mut rewritten = policies.clone();
        for (_, p) in rewritten.iter_mut() {
            for c in
                p.as_mut().and_then(|p| p.spec.as_mut()).and_then(|s| s.match_conditions.as_mut()).expect("conditions")
            {
                c.expression = c.expression.replace(ME, moved);
            }
        }
        let mut one_left = rewritten.clone();
        one_left[4] = policies[4].clone();
        let err = judge(&one_left, &bindings, moved, "platform").expect_err("one policy not rewritten");
        assert!(err.why.contains("flotilla-operator-namespaces does not match"), "{err}");
        // The user rewritten everywhere, the bindings not (what a kustomize `namespace:` leaves).
        let err = judge(&rewritten, &bindings, moved, "platform").expect_err("another Lease namespace");
        assert!(err.why.contains("flotilla-shard-fence-0 reads Lease flotilla-system/flotilla-shard-0"), "{err}");
        assert!(err.to_string().contains("does not start"), "{err}");
    }

    #[test]
    fn a_missing_policy_a_foreign_binding_or_a_warn_only_binding_is_refused() {
        let (policies, bindings) = installed();
        let mut missing = policies.clone();
        missing[1].1 = None;
        let err = judge(&missing, &bindings, ME, "flotilla-system").expect_err("missing");
        assert!(err.why.contains("flotilla-shard-fence-unbound is not installed"), "{err}");
        let mut other = bindings.clone();
        if let Some(spec) = other[3].1.as_mut().map(|b| &mut b.spec) {
            spec.policy_name = "something-else".into();
        }
        assert!(judge(&policies, &other, ME, "flotilla-system").expect_err("foreign").why.contains("does not bind"));
        let mut warn = bindings.clone();
        if let Some(spec) = warn[5].1.as_mut().map(|b| &mut b.spec) {
            spec.validation_actions = vec!["Warn".into()];
        }
        assert!(judge(&policies, &warn, ME, "flotilla-system").expect_err("warn only").why.contains("does not Deny"));
        let mut wrong_lease = bindings.clone();
        if let Some(p) = wrong_lease[7].1.as_mut().and_then(|b| b.spec.param_ref.as_mut()) {
            p.name = Some("flotilla-shard-8".into());
        }
        assert!(judge(&policies, &wrong_lease, ME, "flotilla-system").is_err());
    }

    #[test]
    fn a_shard_without_a_binding_is_left_to_the_unbound_policy() {
        let (policies, mut bindings) = installed();
        bindings[9].1 = None;
        assert_eq!(judge(&policies, &bindings, ME, "flotilla-system"), Ok(()));
    }
}
