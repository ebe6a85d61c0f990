//! What `/readyz` answers: whether this replica does its part of the work, so that a rolling
//! upgrade stops the next replica only once this one has taken over its part.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::sharding::manager::CACHES_FILL_WITHIN;
use crate::telemetry::apps::AppIndex;

/// The parts of a replica's readiness.
#[derive(Clone)]
pub struct Readiness {
    /// The caches the work starts from: the Tenant cache of a sharded replica, or the caches
    /// of an unsharded one's single App controller.
    pub work: Arc<AtomicBool>,
    /// A sharded replica's share of the shards taken (`sharding::plan::has_its_share`);
    /// `None` when unsharded.
    pub share: Option<Arc<AtomicBool>>,
    /// The caches of the namespaces it serves.
    pub apps: AppIndex,
}

impl Readiness {
    /// `Ok` when ready, else why not (the body of a 503). A namespace whose caches have not
    /// listed within `CACHES_FILL_WITHIN` (for want of rights, say) is not waited for.
    pub fn check(&self) -> Result<(), String> {
        if !self.work.load(Ordering::SeqCst) {
            return Err("caches not synced".into());
        }
        if self.share.as_ref().is_some_and(|s| !s.load(Ordering::SeqCst)) {
            return Err("taking its share of the shards".into());
        }
        match self.apps.caches_filling(CACHES_FILL_WITHIN) {
            0 => Ok(()),
            n => Err(format!("caches of {n} served namespaces filling")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::reflector::store::Writer;

    #[test]
    fn ready_once_the_work_the_share_and_every_served_namespace_are() {
        let (work, share) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
        let apps = AppIndex::default();
        let r = Readiness { work: work.clone(), share: Some(share.clone()), apps: apps.clone() };
        assert_eq!(r.check(), Err("caches not synced".into()));
        work.store(true, Ordering::SeqCst);
        assert_eq!(r.check(), Err("taking its share of the shards".into()));
        share.store(true, Ordering::SeqCst);
        assert_eq!(r.check(), Ok(()));
        // A namespace taken over later: not ready while its caches fill.
        let synced = Arc::new(AtomicBool::new(false));
        let registration = apps.register("shop", Writer::default().as_reader(), synced.clone());
        assert_eq!(r.check(), Err("caches of 1 served namespaces filling".into()));
        synced.store(true, Ordering::SeqCst);
        assert_eq!(r.check(), Ok(()));
        // One that stops serving before its caches filled is not waited for.
        synced.store(false, Ordering::SeqCst);
        drop(registration);
        assert_eq!(r.check(), Ok(()));
        let unsharded = Readiness { work, share: None, apps };
        assert_eq!(unsharded.check(), Ok(()));
    }
}
