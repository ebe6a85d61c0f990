//! Which Pod this replica's token is bound to, as the apiserver sees it (SelfSubjectReview).
//! The apiserver's shard fence (rbac/shard-fence.yaml) compares that Pod's name with the
//! holder of the namespace's shard Lease, so it works only when the two agree: a replica
//! whose token is bound to another Pod than its replica id would have every write refused,
//! and one whose token is bound to no Pod is not fenced by the apiserver at all.

use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use kube::Client;
use kube::api::{Api, PostParams};
use std::collections::BTreeMap;

/// The user-info extra in which the apiserver names the Pod a token is bound to.
pub const POD_NAME_EXTRA: &str = "authentication.kubernetes.io/pod-name";

/// What the apiserver's shard fence can do for this replica.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServerFence {
    /// The token is bound to the Pod named like the replica: the apiserver refuses this
    /// replica's writes into namespaces whose shard it does not hold.
    Active,
    /// The token is bound to no Pod (or the apiserver would not say): only the replica's own
    /// fence and the writes' preconditions stand.
    Inactive { why: String },
}

#[derive(Debug, thiserror::Error)]
#[error(
    "this replica's token is bound to Pod {pod}, but its replica id is {replica}: the apiserver's shard fence would refuse every write it makes. Leave --replica-id unset in a Pod (it defaults to $POD_NAME), or bind the token to a Pod of that name"
)]
pub struct IdentityMismatch {
    pub pod: String,
    pub replica: String,
}

/// Judges the user-info extras the apiserver reported for this replica's token. Pure.
pub fn judge(extra: Option<&BTreeMap<String, Vec<String>>>, replica: &str) -> Result<ServerFence, IdentityMismatch> {
    match extra.and_then(|e| e.get(POD_NAME_EXTRA)).and_then(|v| v.first()) {
        Some(pod) if pod == replica => Ok(ServerFence::Active),
        Some(pod) => Err(IdentityMismatch { pod: pod.clone(), replica: replica.to_string() }),
        None => Ok(ServerFence::Inactive { why: "the token is not bound to a Pod".into() }),
    }
}

/// Asks the apiserver who this client is, and judges it; also returns the user name the
/// apiserver knows this client by. A slow or restarting apiserver is asked again (5 times,
/// 2 s apart) before the replica starts without knowing: a mismatch found late would have
/// every write refused.
pub async fn check(client: &Client, replica: &str) -> Result<(ServerFence, Option<String>), IdentityMismatch> {
    let api: Api<SelfSubjectReview> = Api::all(client.clone());
    let mut last = String::new();
    for attempt in 0..5 {
        if attempt > 0 {
            tokio::time::sleep(std::time::Duration::from_secs(2)).await;
        }
        match api.create(&PostParams::default(), &SelfSubjectReview::default()).await {
            Ok(review) => {
                let user = review.status.and_then(|s| s.user_info).unwrap_or_default();
                return judge(user.extra.as_ref(), replica).map(|fence| (fence, user.username));
            }
            Err(e) => last = e.to_string(),
        }
    }
    Ok((ServerFence::Inactive { why: format!("the apiserver did not say who this replica is ({last})") }, None))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn extra(pod: &str) -> BTreeMap<String, Vec<String>> {
        BTreeMap::from([(POD_NAME_EXTRA.to_string(), vec![pod.to_string()])])
    }

    #[test]
    fn a_token_bound_to_the_replicas_pod_is_fenced_by_the_apiserver() {
        assert_eq!(judge(Some(&extra("flotilla-7c9-abc")), "flotilla-7c9-abc").ok(), Some(ServerFence::Active));
    }

    #[test]
    fn a_token_bound_to_another_pod_is_refused_at_start() {
        let err = judge(Some(&extra("flotilla-7c9-abc")), "replica-a").expect_err("mismatch");
        assert!(err.to_string().contains("bound to Pod flotilla-7c9-abc"), "{err}");
        assert!(err.to_string().contains("replica id is replica-a"), "{err}");
    }

    #[test]
    fn an_unbound_token_leaves_the_apiserver_fence_off() {
        assert!(matches!(judge(None, "r"), Ok(ServerFence::Inactive { .. })));
        assert!(matches!(judge(Some(&BTreeMap::new()), "r"), Ok(ServerFence::Inactive { .. })));
    }
}
