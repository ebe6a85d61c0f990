//! The write fence: before every write in a namespace, a reconcile asks whether this replica
//! renewed that namespace's shard within the renew deadline. A replica that was paused (a
//! stopped process, a long GC-like stall, a partition) resumes with stale renewals, so its
//! first write after waking is refused here, before the shard manager even runs, and long
//! before a peer could have been granted the Lease and written itself.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::Method;

use super::hash::shard_of;

/// A write refused at send time: this replica's hold on the namespace's shard had lapsed.
#[derive(Debug, thiserror::Error)]
#[error("{method} in namespace {namespace} not sent: this replica's hold on its shard lapsed before it left (fenced)")]
pub struct Fenced {
    pub method: Method,
    pub namespace: String,
}

/// What the apiserver's shard fence (rbac/shard-fence.yaml) begins its refusals with.
pub const SERVER_FENCE: &str = "flotilla-shard-fence:";

/// Whether `err` (as kube's client reports it) is a write that was fenced: refused by this
/// layer before it left, or by the apiserver's shard fence because it arrived when this
/// replica no longer held (or did not yet hold, in the apiserver's cache) the shard.
pub fn is_fenced(err: &kube::Error) -> bool {
    match err {
        kube::Error::Service(e) => e.downcast_ref::<Fenced>().is_some(),
        kube::Error::Api(status) => status.code == 403 && status.message.contains(SERVER_FENCE),
        _ => false,
    }
}

#[derive(Clone, Debug)]
pub struct Fence {
    shards: u32,
    renew_deadline: Duration,
    renewed: Arc<Mutex<HashMap<u32, Instant>>>,
}

impl Fence {
    pub fn new(shards: u32, renew_deadline: Duration) -> Self {
        Self { shards, renew_deadline, renewed: Arc::default() }
    }

    /// The shard of a namespace under this installation's shard count.
    pub fn shard_of(&self, namespace: &str) -> u32 {
        shard_of(namespace, self.shards)
    }

    /// Records a successful acquire or renew of `shard` that was sent at `at`.
    pub fn renewed(&self, shard: u32, at: Instant) {
        self.renewed.lock().unwrap_or_else(|p| p.into_inner()).insert(shard, at);
    }

    /// Forgets a shard that was lost or released.
    pub fn dropped(&self, shard: u32) {
        self.renewed.lock().unwrap_or_else(|p| p.into_inner()).remove(&shard);
    }

    /// Whether this replica may write in `namespace` now.
    pub fn may_write(&self, namespace: &str) -> bool {
        self.may_write_at(namespace, Instant::now())
    }

    pub fn may_write_at(&self, namespace: &str, now: Instant) -> bool {
        let shard = shard_of(namespace, self.shards);
        self.renewed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&shard)
            .is_some_and(|at| now.saturating_duration_since(*at) < self.renew_deadline)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_only_within_the_renew_deadline() {
        let fence = Fence::new(32, Duration::from_secs(4));
        let ns = "team-a-prod"; // shard 0
        let t0 = Instant::now();
        assert!(!fence.may_write_at(ns, t0), "never held");
        fence.renewed(0, t0);
        assert!(fence.may_write_at(ns, t0 + Duration::from_secs(3)));
        assert!(!fence.may_write_at(ns, t0 + Duration::from_secs(5)), "stale after a pause");
        assert!(!fence.may_write_at("team-a-dev", t0), "another shard");
        fence.dropped(0);
        assert!(!fence.may_write_at(ns, t0));
    }
}
