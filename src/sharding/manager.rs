//! The shard manager of one replica: renews what it holds, fences itself when renewing fails,
//! takes its fair share of free or expired shards, hands surplus back, and on shutdown stops
//! its work before releasing every Lease.

use k8s_openapi::api::coordination::v1::Lease;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tracing::{info, warn};

use super::fence::Fence;
use super::leases::{LABEL_SHARDS, Leases, holder, is_member, shard_lease_name, shard_of_lease};
use super::plan::{ExpiryTracker, plan};
use crate::telemetry::Metrics;

/// Timings of shard ownership.
#[derive(Clone, Copy, Debug)]
pub struct ShardSettings {
    pub shards: u32,
    /// How long a Lease stays valid without a renewal.
    pub lease_duration: Duration,
    /// A replica that has not renewed a shard for this long stops its work there. Shorter than
    /// `lease_duration`, so work stops before anyone else may take the Lease.
    pub renew_deadline: Duration,
    /// How often held Leases are renewed.
    pub renew_interval: Duration,
    /// How often the manager looks at the Leases.
    pub retry_period: Duration,
}

impl Default for ShardSettings {
    fn default() -> Self {
        Self {
            shards: 32,
            lease_duration: Duration::from_secs(6),
            renew_deadline: Duration::from_secs(4),
            renew_interval: Duration::from_secs(2),
            retry_period: Duration::from_millis(500),
        }
    }
}

struct Held {
    lease: Lease,
    renewed: Instant,
}

/// Channels between the manager and the work it gates.
pub struct ShardChannels {
    /// Renewal times every write in a namespace is checked against.
    pub fence: Fence,
    /// Shards this replica may work in now.
    pub held_tx: watch::Sender<BTreeSet<u32>>,
    /// Shards whose work is running, as reported by the namespace supervisor. The manager
    /// waits for a shard to leave this set before it releases the Lease.
    pub working_rx: watch::Receiver<BTreeSet<u32>>,
    /// True once the work this replica would do is ready (its Tenant cache synced). Until
    /// then it neither announces itself nor takes shards, so that a replica that cannot work
    /// never holds shards its peers could serve.
    pub ready: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

/// Runs until `shutdown`, then stops work in every shard and releases their Leases.
pub async fn run_shard_manager(
    leases: Leases,
    me: String,
    settings: ShardSettings,
    channels: ShardChannels,
    metrics: Metrics,
    mut shutdown: watch::Receiver<bool>,
) {
    let ShardChannels { fence, held_tx, mut working_rx, ready } = channels;
    let start = Instant::now();
    metrics.shards_configured(settings.shards);
    let mut tracker = ExpiryTracker::default();
    let mut held: BTreeMap<u32, Held> = BTreeMap::new();
    let mut membership: Option<Lease> = None;
    let mut membership_renewed: Option<Instant> = None;
    let mut tick = tokio::time::interval(settings.retry_period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.wait_for(|s| *s) => break,
            _ = tick.tick() => {}
        }
        let now = Instant::now();

        // Renew what is due; a failed renewal is retried next round until the deadline.
        let mut taken = Vec::new();
        for (shard, h) in held.iter_mut() {
            if now.duration_since(h.renewed) < settings.renew_interval {
                continue;
            }
            let sent = Instant::now();
            match leases.renew(&h.lease).await {
                Ok(Some(lease)) => {
                    h.lease = lease;
                    h.renewed = sent;
                    fence.renewed(*shard, sent);
                }
                Ok(None) => {
                    warn!(shard, "shard Lease was taken by another replica");
                    taken.push(*shard);
                }
                Err(e) => warn!(shard, error = %e, "could not renew shard Lease"),
            }
        }
        // Fence: stop work in shards not renewed within the deadline, before anyone may take them.
        let mut lost: Vec<u32> = held
            .iter()
            .filter(|(_, h)| now.duration_since(h.renewed) >= settings.renew_deadline)
            .map(|(s, _)| *s)
            .collect();
        lost.extend(taken);
        for shard in lost {
            held.remove(&shard);
            fence.dropped(shard);
            metrics.lease_event("lost");
            warn!(shard, "lost shard: stopping its work");
        }
        publish(&held_tx, &held);

        let work_ready = ready.load(std::sync::atomic::Ordering::SeqCst);
        if work_ready && membership_renewed.is_none_or(|t| now.duration_since(t) >= settings.renew_interval) {
            match leases.heartbeat(membership.as_ref()).await {
                Ok(Some(l)) => {
                    membership = Some(l);
                    membership_renewed = Some(Instant::now());
                }
                Ok(None) => membership = None,
                Err(e) => warn!(error = %e, "could not renew membership Lease"),
            }
        }

        let all = match leases.list().await {
            Ok(all) => all,
            Err(e) => {
                warn!(error = %e, "could not list Leases");
                metrics.shards_held(held.len(), seconds_since_renew(&held, now));
                continue;
            }
        };
        // Observations are stamped when the list came back, never earlier: stamping them with
        // the start of the round would make a peer's fresh renewal look older than it is.
        let now = Instant::now();
        let now_ms = u64::try_from(now.duration_since(start).as_millis()).unwrap_or(u64::MAX);
        let present: BTreeSet<String> = all.iter().filter_map(|l| l.metadata.name.clone()).collect();
        for l in &all {
            let name = l.metadata.name.clone().unwrap_or_default();
            tracker.observe(&name, holder(l), l.metadata.resource_version.as_deref().unwrap_or_default(), now_ms);
        }
        tracker.retain(&present);
        // Membership Leases of replicas that died without leaving (kill -9) are removed once
        // they have been unchanged for ten lease durations.
        for l in all.iter().filter(|l| is_member(l)) {
            let name = l.metadata.name.as_deref().unwrap_or_default();
            if holder(l) != Some(me.as_str()) && tracker.is_free(name, now_ms, settings.lease_duration * 10) {
                info!(lease = name, "removing the membership Lease of a replica that is gone");
                leases.forget_member(l).await;
            }
        }
        let live: BTreeSet<String> = all
            .iter()
            .filter(|l| is_member(l))
            .filter(|l| {
                tracker.is_live(l.metadata.name.as_deref().unwrap_or_default(), now_ms, settings.lease_duration)
                    || holder(l) == Some(me.as_str())
            })
            .filter_map(|l| holder(l).map(str::to_string))
            .collect();
        let by_shard: BTreeMap<u32, &Lease> =
            all.iter().filter_map(|l| Some((shard_of_lease(l.metadata.name.as_deref()?)?, l))).collect();
        let free: BTreeSet<u32> = (0..settings.shards)
            .filter(|s| !held.contains_key(s))
            .filter(|s| match by_shard.get(s) {
                None => true,
                Some(l) => {
                    holder(l).is_none() || tracker.is_free(&shard_lease_name(*s), now_ms, settings.lease_duration)
                }
            })
            .collect();
        let mine: BTreeSet<u32> = held.keys().copied().collect();
        let mismatched: Vec<String> = all
            .iter()
            .filter(|l| is_member(l))
            .filter(|l| holder(l).is_some_and(|h| live.contains(h)))
            .filter_map(|l| l.metadata.labels.as_ref()?.get(LABEL_SHARDS).cloned())
            .filter(|n| *n != settings.shards.to_string())
            .collect();
        let mut decision = plan(&me, settings.shards, &live, &mine, &free);
        if !work_ready {
            decision.acquire.clear();
        }
        if !mismatched.is_empty() {
            // Two shard counts would map one namespace to two shards held by two replicas.
            warn!(shards = settings.shards, others = ?mismatched, "live replicas run with a different --shards; taking no shard until they agree");
            decision.acquire.clear();
        }

        for shard in decision.acquire {
            let sent = Instant::now();
            match leases.acquire(shard, by_shard.get(&shard).copied()).await {
                Ok(Some(lease)) => {
                    info!(shard, "acquired shard");
                    metrics.lease_event("acquired");
                    fence.renewed(shard, sent);
                    held.insert(shard, Held { lease, renewed: sent });
                }
                Ok(None) => {}
                Err(e) => warn!(shard, error = %e, "could not acquire shard"),
            }
        }
        if !decision.release.is_empty() {
            let release: Vec<(u32, Held)> =
                decision.release.iter().filter_map(|s| held.remove(s).map(|h| (*s, h))).collect();
            for (shard, _) in &release {
                fence.dropped(*shard);
            }
            publish(&held_tx, &held);
            wait_stopped(&mut working_rx, release.iter().map(|(s, _)| *s).collect(), settings.renew_deadline).await;
            for (shard, h) in release {
                if let Err(e) = leases.release(&h.lease).await {
                    warn!(shard, error = %e, "could not release shard");
                }
                info!(shard, "handed shard back for balance");
                metrics.lease_event("released");
            }
        }
        publish(&held_tx, &held);
        metrics.shards_held(held.len(), seconds_since_renew(&held, Instant::now()));
    }

    // Graceful handoff: stop all work first, then release every Lease so peers take over at once.
    let shards: BTreeSet<u32> = held.keys().copied().collect();
    for shard in &shards {
        fence.dropped(*shard);
    }
    held_tx.send_replace(BTreeSet::new());
    wait_stopped(&mut working_rx, shards, settings.renew_deadline).await;
    for (shard, h) in held {
        match leases.release(&h.lease).await {
            Ok(()) => metrics.lease_event("released"),
            Err(e) => warn!(shard, error = %e, "could not release shard on shutdown"),
        }
    }
    leases.leave().await;
    metrics.shards_held(0, 0.0);
    info!("released every shard");
}

fn publish(tx: &watch::Sender<BTreeSet<u32>>, held: &BTreeMap<u32, Held>) {
    let set: BTreeSet<u32> = held.keys().copied().collect();
    tx.send_if_modified(|current| {
        if *current != set {
            *current = set;
            true
        } else {
            false
        }
    });
}

fn seconds_since_renew(held: &BTreeMap<u32, Held>, now: Instant) -> f64 {
    held.values().map(|h| now.duration_since(h.renewed).as_secs_f64()).fold(0.0, f64::max)
}

/// Waits until none of `shards` has work running, or the deadline passes.
async fn wait_stopped(working: &mut watch::Receiver<BTreeSet<u32>>, shards: BTreeSet<u32>, deadline: Duration) {
    let done = working.wait_for(|w| w.is_disjoint(&shards));
    if tokio::time::timeout(deadline, done).await.is_err() {
        warn!(?shards, "work in released shards did not stop in time");
    }
}
