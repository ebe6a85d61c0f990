//! Which namespaces the App controller serves: those a Tenant reports as onboarded. One App
//! controller (with its own namespaced watches) runs per served namespace, because the
//! operator has no cluster-wide right on workloads.

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use kube::Client;
use kube::api::Api;
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{info, warn};

use crate::api::{NamespaceState, Tenant};
use crate::app::controller::{Scope, ServedBy, Shared, app_controller};
use crate::sharding::fence::Fence;
use crate::sharding::shard_of;
use crate::watch_cache::cache;

/// Namespaces some Tenant (not being deleted) reports as onboarded, with that Tenant's name. Pure.
///
/// A namespace two Tenants report at once (a cluster admin handed it over, and the former
/// owner's status has not caught up yet) is served by neither until only one reports it:
/// serving it for the former owner would let its Apps use that owner's Prometheus endpoints.
pub fn served_namespaces<'a>(tenants: impl IntoIterator<Item = &'a Tenant>) -> BTreeMap<String, String> {
    let mut claims: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for t in tenants.into_iter().filter(|t| t.metadata.deletion_timestamp.is_none()) {
        let name = t.metadata.name.clone().unwrap_or_default();
        let onboarded =
            t.status.iter().flat_map(|s| s.namespaces.iter()).filter(|n| n.state == NamespaceState::Onboarded);
        for n in onboarded {
            claims.entry(n.name.clone()).or_default().push(name.clone());
        }
    }
    claims
        .into_iter()
        .filter_map(|(ns, mut owners)| {
            owners.dedup();
            match owners.as_slice() {
                [one] => Some((ns, one.clone())),
                _ => {
                    warn!(namespace = ns, tenants = ?owners, "reported onboarded by more than one Tenant: served by none until one is left");
                    None
                }
            }
        })
        .collect()
}

/// What to start and stop to go from `running` to `wanted` (namespace to owning Tenant). Pure.
/// A namespace whose owner changed is stopped and started again: its controller holds the
/// Tenant it was started for (its Prometheus endpoints, its policy).
pub fn changes(running: &BTreeMap<String, String>, wanted: &BTreeMap<String, String>) -> (Vec<String>, Vec<String>) {
    let moved = |ns: &String| running.get(ns).is_some_and(|owner| wanted.get(ns) != Some(owner));
    let start = wanted.keys().filter(|ns| !running.contains_key(*ns) || moved(ns)).cloned().collect();
    let stop = running.keys().filter(|ns| !wanted.contains_key(*ns) || moved(ns)).cloned().collect();
    (start, stop)
}

/// The connections of served namespaces, handed in by the wiring (which packs a few
/// namespaces per HTTP/2 connection: `operator::packing`).
pub trait NamespaceConnections: Send {
    /// The client a newly served namespace's controller uses.
    fn for_namespace(&mut self, namespace: &str) -> Client;
    /// The namespace is no longer served here: its share of a connection is free.
    fn release(&mut self, namespace: &str);
    /// Connections open now (for the metric).
    fn connections(&self) -> usize;
}

/// What every namespace controller is started with.
#[derive(Clone, Copy)]
struct WorkerContext<'a> {
    shared: &'a Shared,
    fence: &'a Fence,
    tenants: &'a Store<Tenant>,
}

struct NamespaceWorker {
    /// The Tenant the controller was started for.
    tenant: String,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

/// Starts an App controller for each newly served namespace and stops those no longer served.
async fn converge_workers(
    workers: &mut BTreeMap<String, NamespaceWorker>,
    wanted: &BTreeMap<String, String>,
    clients: &mut dyn NamespaceConnections,
    with: WorkerContext<'_>,
    stop_within: Duration,
) -> Vec<String> {
    let WorkerContext { shared, fence, tenants } = with;
    let running: BTreeMap<String, String> = workers.iter().map(|(ns, w)| (ns.clone(), w.tenant.clone())).collect();
    let (start, stop) = changes(&running, wanted);
    let stopping: Vec<(String, NamespaceWorker)> =
        stop.into_iter().filter_map(|ns| workers.remove(&ns).map(|w| (ns, w))).collect();
    for (ns, _) in &stopping {
        info!(namespace = ns, "no longer served here (offboarded or shard gone); stopping its App controller");
        clients.release(ns);
    }
    // The shard's fence is already closed (no new write leaves); what is in flight gets a
    // moment to be answered before the shard manager may hand the Lease to a peer.
    let cancelled = stop_workers(stopping, stop_within, |_| {}).await;
    for ns in start {
        let Some(tenant) = wanted.get(&ns).cloned() else { continue };
        info!(namespace = ns, tenant, "onboarded; starting its App controller");
        let (stop_tx, mut stop_rx) = watch::channel(false);
        let run = app_controller(
            clients.for_namespace(&ns),
            Scope::Namespace(ns.clone()),
            shared.clone(),
            Some(ServedBy { fence: fence.clone(), tenant: Some(tenant.clone()), tenants: Some(tenants.clone()) }),
            Arc::new(AtomicBool::new(false)),
            async move {
                let _ = stop_rx.wait_for(|s| *s).await;
            },
        );
        workers.insert(ns, NamespaceWorker { tenant, stop: stop_tx, task: tokio::spawn(run) });
    }
    shared.metrics.namespaces_served(workers.len());
    shared.metrics.namespace_connections(clients.connections());
    cancelled
}

/// Stops namespace controllers: all are told at once, and their reconciles get `within` to
/// finish. What is still running then is cancelled; those namespaces are returned, because a
/// request their reconciles sent may still land. `report` hears the namespaces still
/// stopping each time one has stopped, so that a shard can be handed over as soon as its own
/// namespaces have stopped (a cancelled namespace never leaves that set).
async fn stop_workers(
    stopping: Vec<(String, NamespaceWorker)>,
    within: Duration,
    mut report: impl FnMut(&BTreeSet<String>),
) -> Vec<String> {
    if stopping.is_empty() {
        return Vec::new();
    }
    let deadline = tokio::time::Instant::now() + within;
    let mut still: BTreeSet<String> = stopping.iter().map(|(ns, _)| ns.clone()).collect();
    let mut stopped: FuturesUnordered<_> = stopping
        .into_iter()
        .map(|(ns, w)| {
            let _ = w.stop.send(true);
            let mut task = w.task;
            async move {
                if tokio::time::timeout_at(deadline, &mut task).await.is_ok() {
                    return (ns, true);
                }
                task.abort();
                let _ = task.await;
                (ns, false)
            }
        })
        .collect();
    let mut cancelled = Vec::new();
    while let Some((ns, finished)) = stopped.next().await {
        if finished {
            still.remove(&ns);
            report(&still);
        } else {
            cancelled.push(ns);
        }
    }
    cancelled
}

/// What this replica may act on: the shards it holds, and the onboarded namespaces in them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ownership {
    pub shards: u32,
    pub held: BTreeSet<u32>,
    pub served: BTreeSet<String>,
    /// Every namespace some Tenant onboarded, in any shard: Apps there are some replica's
    /// business, never the guard's.
    pub onboarded: Arc<BTreeSet<String>>,
}

impl Ownership {
    /// Whether this replica answers for `namespace` at all (its shard is held here).
    pub fn owns(&self, namespace: &str) -> bool {
        self.held.contains(&shard_of(namespace, self.shards))
    }
}

/// How the supervisor reaches the apiserver: `client` for the Tenants, `namespaces` for the
/// served namespaces.
pub struct ServedConnections {
    pub client: Client,
    pub namespaces: Box<dyn NamespaceConnections>,
    /// How long a namespace controller gets to stop (shard handed back, lost, or shutdown)
    /// before its reconciles are cancelled.
    pub stop_within: Duration,
    /// How long a shard whose reconciles had to be cancelled is still reported as working,
    /// so that the shard manager lets its Lease expire instead of releasing it: a request
    /// those reconciles sent may still land. The lease duration.
    pub cancelled_linger: Duration,
}

/// Channels of the supervisor.
pub struct ServedChannels {
    /// Shards this replica holds (from the shard manager).
    pub held_rx: watch::Receiver<BTreeSet<u32>>,
    /// Shards whose work is running (to the shard manager, which releases a Lease only after).
    pub working_tx: watch::Sender<BTreeSet<u32>>,
    /// What this replica owns (to the guard).
    pub ownership_tx: watch::Sender<Ownership>,
    /// Checked before every write of the namespace controllers.
    pub fence: Fence,
}

/// Runs one App controller per served namespace (onboarded, in a held shard) until
/// `shutdown`. `ready` turns true once the Tenant cache is synced.
pub async fn serve_onboarded_namespaces(
    connections: ServedConnections,
    shared: Shared,
    shards: u32,
    channels: ServedChannels,
    ready: Arc<AtomicBool>,
    mut shutdown: watch::Receiver<bool>,
) {
    let ServedChannels { mut held_rx, working_tx, ownership_tx, fence } = channels;
    let ServedConnections { client, mut namespaces, stop_within, cancelled_linger } = connections;
    let (tenants, mut synced, events) = cache::<Tenant>(Api::all(client.clone()), watcher::Config::default(), ());
    let mut events = std::pin::pin!(events);
    let mut workers: BTreeMap<String, NamespaceWorker> = BTreeMap::new();
    // Shards whose reconciles were cancelled, until when they still count as working.
    let mut lingering: BTreeMap<u32, Instant> = BTreeMap::new();
    loop {
        tokio::select! {
            _ = shutdown.wait_for(|s| *s) => break,
            event = events.next() => {
                if event.is_none() { break; }
            }
            changed = synced.changed() => {
                if changed.is_err() { break; }
            }
            changed = held_rx.changed() => {
                if changed.is_err() { break; }
            }
        }
        // At shutdown the shard manager drops every shard as it closes the fence: stop
        // below, where work gets its time to finish, not as for shards that were lost.
        if *shutdown.borrow() {
            break;
        }
        if !*synced.borrow_and_update() {
            continue;
        }
        ready.store(true, Ordering::SeqCst);
        let held = held_rx.borrow_and_update().clone();
        let owners = served_namespaces(tenants.state().iter().map(|t| t.as_ref()));
        let wanted: BTreeMap<String, String> = owners
            .iter()
            .filter(|(ns, _)| held.contains(&shard_of(ns, shards)))
            .map(|(n, t)| (n.clone(), t.clone()))
            .collect();
        let cancelled = converge_workers(
            &mut workers,
            &wanted,
            namespaces.as_mut(),
            WorkerContext { shared: &shared, fence: &fence, tenants: &tenants },
            stop_within,
        )
        .await;
        if !cancelled.is_empty() {
            warn!(namespaces = ?cancelled, "cancelled reconciles may still have writes on their way: their shards count as working for a lease duration, so their Leases expire instead of being released");
        }
        let now = Instant::now();
        lingering.extend(cancelled.iter().map(|ns| (shard_of(ns, shards), now + cancelled_linger)));
        lingering.retain(|_, until| *until > now);
        let working: BTreeSet<u32> =
            workers.keys().map(|ns| shard_of(ns, shards)).chain(lingering.keys().copied()).collect();
        working_tx.send_replace(working);
        let onboarded = Arc::new(owners.keys().cloned().collect());
        let ownership = Ownership { shards, held, served: wanted.into_keys().collect(), onboarded };
        ownership_tx.send_if_modified(|current| {
            if *current != ownership {
                *current = ownership;
                true
            } else {
                false
            }
        });
    }
    // Shutting down: the shard manager closes the fence, so no new write leaves. Every
    // namespace's controller stops at once and its reconciles get until `stop_within` (half
    // the renew deadline, while the Leases are still held) to finish, so that requests
    // already on their way are answered before a peer may take the shards. What is still
    // running then is cancelled (a reconcile waiting for a write held up by a slow apiserver,
    // up to --request-timeout, or for caches whose watches the shutdown stopped), and its
    // shards are not reported stopped: a request it sent may still land, so the shard
    // manager lets their Leases expire instead of releasing them.
    // Each shard is reported stopped as soon as its own namespaces are, so that the shard
    // manager releases it then rather than after the slowest namespace of all. Shards whose
    // reconciles were cancelled a moment ago (still lingering) stay reported working.
    let lingering: BTreeSet<u32> =
        lingering.into_iter().filter(|(_, until)| *until > Instant::now()).map(|(s, _)| s).collect();
    let cancelled = stop_workers(workers.into_iter().collect(), stop_within, |still| {
        working_tx.send_replace(working_at_shutdown(still.iter(), &lingering, shards));
    })
    .await;
    if !cancelled.is_empty() {
        warn!(namespaces = ?cancelled, "reconciles cancelled at shutdown may still have writes on their way: their shards' Leases are left to expire");
    }
    working_tx.send_replace(working_at_shutdown(cancelled.iter(), &lingering, shards));
}

/// The shards still working while a replica shuts down: those of the namespaces still
/// stopping (or cancelled), and those whose reconciles were cancelled within a lease duration.
fn working_at_shutdown<'a>(
    namespaces: impl Iterator<Item = &'a String>,
    lingering: &BTreeSet<u32>,
    shards: u32,
) -> BTreeSet<u32> {
    namespaces.map(|ns| shard_of(ns, shards)).chain(lingering.iter().copied()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{NamespaceStatus, TenantSpec, TenantStatus};

    fn tenant(states: &[(&str, NamespaceState)]) -> Tenant {
        let mut t = Tenant::new(
            "t",
            TenantSpec {
                namespaces: vec![],
                admins: vec![],
                quota: None,
                namespace_removal_policy: Default::default(),
                pod_security: None,
                prometheus_endpoints: Vec::new(),
                limit_range: None,
                network_policy: None,
                pod_policy: None,
            },
        );
        t.status = Some(TenantStatus {
            namespaces: states
                .iter()
                .map(|(n, s)| NamespaceStatus { name: n.to_string(), state: *s, message: String::new() })
                .collect(),
            ..TenantStatus::default()
        });
        t
    }

    #[test]
    fn only_onboarded_namespaces_are_served() {
        let a = tenant(&[("a1", NamespaceState::Onboarded), ("a2", NamespaceState::Conflict)]);
        let b = tenant(&[("b1", NamespaceState::Offboarded), ("b2", NamespaceState::Onboarded)]);
        let served: Vec<String> = served_namespaces([&a, &b]).into_keys().collect();
        assert_eq!(served, vec!["a1", "b2"]);
    }

    #[test]
    fn a_namespace_two_tenants_report_is_served_by_neither() {
        let mut a = tenant(&[("shared", NamespaceState::Onboarded), ("a1", NamespaceState::Onboarded)]);
        a.metadata.name = Some("a".into());
        let mut b = tenant(&[("shared", NamespaceState::Onboarded)]);
        b.metadata.name = Some("b".into());
        let served = served_namespaces([&a, &b]);
        assert_eq!(served, BTreeMap::from([("a1".to_string(), "a".to_string())]));
    }

    #[test]
    fn start_and_stop_sets() {
        let map = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs.iter().map(|(n, t)| (n.to_string(), t.to_string())).collect()
        };
        let running = map(&[("a", "t"), ("b", "t"), ("moved", "old")]);
        let wanted = map(&[("b", "t"), ("c", "t"), ("moved", "new")]);
        assert_eq!(
            changes(&running, &wanted),
            (vec!["c".to_string(), "moved".to_string()], vec!["a".to_string(), "moved".to_string()]),
            "a namespace handed to another Tenant is restarted under its new owner"
        );
    }

    /// A worker that stops `after` its stop signal (or never, with `None`).
    fn worker(after: Option<Duration>) -> NamespaceWorker {
        let (stop, mut rx) = watch::channel(false);
        let task = tokio::spawn(async move {
            let _ = rx.wait_for(|s| *s).await;
            match after {
                Some(d) => tokio::time::sleep(d).await,
                None => std::future::pending().await,
            }
        });
        NamespaceWorker { tenant: "t".into(), stop, task }
    }

    #[tokio::test(start_paused = true)]
    async fn stopping_workers_reports_each_as_it_stops_and_returns_the_cancelled() {
        let stopping = vec![
            ("a".to_string(), worker(Some(Duration::from_millis(100)))),
            ("b".to_string(), worker(Some(Duration::from_millis(300)))),
            ("c".to_string(), worker(None)),
        ];
        let start = Instant::now();
        let mut reports: Vec<(Vec<String>, u128)> = Vec::new();
        let cancelled = stop_workers(stopping, Duration::from_secs(2), |still| {
            reports.push((still.iter().cloned().collect(), start.elapsed().as_millis()));
        })
        .await;
        assert_eq!(cancelled, vec!["c".to_string()]);
        // "a" is reported stopped at 100 ms, without waiting for "b" or the deadline.
        assert_eq!(reports, vec![(vec!["b".to_string(), "c".to_string()], 100), (vec!["c".to_string()], 300)]);
    }

    #[test]
    fn shards_with_cancelled_reconciles_stay_working_at_shutdown() {
        let stopping = ["a".to_string()];
        let a = shard_of("a", 32);
        let lingering = BTreeSet::from([(a + 1) % 32]);
        assert_eq!(working_at_shutdown(stopping.iter(), &lingering, 32), BTreeSet::from([a, (a + 1) % 32]));
        assert_eq!(
            working_at_shutdown([].iter(), &lingering, 32),
            lingering,
            "nothing stopping: the lingering shard still works"
        );
    }
}
