//! What `/readyz` answers: whether this replica does its part of the work, so that a rolling
//! upgrade stops the next replica only once this one has taken over its part.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::sharding::manager::CACHES_FILL_WITHIN;
use crate::telemetry::apps::AppIndex;

/// Whether the namespace supervisor has started the namespaces of every shard held now.
pub type Started = Arc<dyn Fn() -> bool + Send + Sync>;

/// The parts of a replica's readiness. Once ready, a replica stays ready: a survivor that
/// takes over a peer's shards goes on serving what it served while the new namespaces' caches
/// fill, and turning not ready then would only count it out of a rolling upgrade's budget
/// (and a PodDisruptionBudget's) while its peer is already gone.
#[derive(Clone)]
pub struct Readiness {
    /// The caches the work starts from: the Tenant cache of a sharded replica, or the caches
    /// of an unsharded one's single App controller.
    pub work: Arc<AtomicBool>,
    /// A sharded replica's share of the shards taken (`sharding::plan::has_its_share`), and
    /// its namespace supervisor caught up with what it holds; `None` when unsharded.
    pub share: Option<(Arc<AtomicBool>, Started)>,
    /// The caches of the namespaces it serves.
    pub apps: AppIndex,
    /// Set once ready.
    pub was_ready: Arc<AtomicBool>,
}

impl Readiness {
    /// `Ok` when ready, else why not (the body of a 503). A namespace whose caches have not
    /// listed within `CACHES_FILL_WITHIN` (for want of rights, say) is not waited for.
    pub fn check(&self) -> Result<(), String> {
        if self.was_ready.load(Ordering::SeqCst) {
            return Ok(());
        }
        if !self.work.load(Ordering::SeqCst) {
            return Err("caches not synced".into());
        }
        if let Some((share, started)) = &self.share {
            if !share.load(Ordering::SeqCst) {
                return Err("taking its share of the shards".into());
            }
            if !started() {
                return Err("starting the namespaces of the shards it holds".into());
            }
        }
        match self.apps.caches_filling(CACHES_FILL_WITHIN) {
            0 => {
                self.was_ready.store(true, Ordering::SeqCst);
                Ok(())
            }
            n => Err(format!("caches of {n} served namespaces filling")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::reflector::store::Writer;

    fn flag() -> Arc<AtomicBool> {
        Arc::new(AtomicBool::new(false))
    }

    #[test]
    fn ready_once_the_work_the_share_and_every_served_namespace_are_then_for_good() {
        let (work, share, started) = (flag(), flag(), flag());
        let apps = AppIndex::default();
        let seen = started.clone();
        let r = Readiness {
            work: work.clone(),
            share: Some((share.clone(), Arc::new(move || seen.load(Ordering::SeqCst)))),
            apps: apps.clone(),
            was_ready: flag(),
        };
        assert_eq!(r.check(), Err("caches not synced".into()));
        work.store(true, Ordering::SeqCst);
        assert_eq!(r.check(), Err("taking its share of the shards".into()));
        share.store(true, Ordering::SeqCst);
        assert_eq!(r.check(), Err("starting the namespaces of the shards it holds".into()));
        started.store(true, Ordering::SeqCst);
        let synced = flag();
        let registration = apps.register("shop", Writer::default().as_reader(), synced.clone());
        assert_eq!(r.check(), Err("caches of 1 served namespaces filling".into()));
        // One that stops serving before its caches filled is not waited for.
        drop(registration);
        assert_eq!(r.check(), Ok(()));
        // Ready for good: a namespace taken over later fills its caches while the replica
        // goes on serving the others.
        let _later = apps.register("shop", Writer::default().as_reader(), synced);
        assert_eq!(r.check(), Ok(()));
        let unsharded = Readiness { work, share: None, apps: AppIndex::default(), was_ready: flag() };
        assert_eq!(unsharded.check(), Ok(()));
    }
}
