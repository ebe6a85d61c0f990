//! The shard manager of one replica: renews what it holds, fences itself when renewing fails,
//! takes its fair share of free or expired shards, hands surplus back, and on shutdown stops
//! its work and releases each Lease once that shard's work has stopped.
//!
//! Renewals run in a loop of their own, several at once (at most `RENEWALS_IN_FLIGHT`), so
//! they never wait behind a list, an acquisition or a release: at 100 ms of apiserver latency
//! 32 renewals take 0.4 s, not 3.2 s. The other loop lists the Leases, plans with the pure
//! functions of `plan` and acquires (at most `ACQUISITIONS_IN_FLIGHT` at once) or releases.
//! A hand-back waits for its shards' work to stop (up to the renew deadline) in a task of its
//! own, not in a round: a replica handing shards to a peer that joins still takes, within a
//! round, the shards a leaving peer releases, and a slow round does not hold a release up.

use futures::stream::{FuturesUnordered, StreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::{Notify, watch};
use tracing::{debug, error, info, warn};

use super::budget::Budget;
use super::fence::Fence;
use super::handoff::release_as_stopped;
use super::leases::{
    LABEL_FULL, LABEL_SHARDS, LeaseError, Leases, acquired_at, acquisition_stamp, holder, is_member, shard_lease_name,
    shard_of_lease,
};
use super::plan::{ExpiryTracker, View, fair_share, has_its_share, plan};
use super::stuck::Progress;
use super::wake::{Hearing, Observed, watch_leases};
use crate::telemetry::Metrics;

/// Renewals in flight at once.
const RENEWALS_IN_FLIGHT: usize = 8;
/// Lease versions seen by the watch and not yet noted by the balance loop (it notes them
/// between rounds; the watch waits meanwhile).
const OBSERVED_IN_FLIGHT: usize = 256;
/// Acquisitions (and releases) in flight at once.
const ACQUISITIONS_IN_FLIGHT: usize = 4;

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
    /// The most Apps this replica may serve (`None`: no bound): see `budget`.
    pub budget: Option<Budget>,
}

impl Default for ShardSettings {
    fn default() -> Self {
        Self {
            shards: 32,
            lease_duration: Duration::from_secs(6),
            renew_deadline: Duration::from_secs(4),
            renew_interval: Duration::from_secs(2),
            retry_period: Duration::from_millis(500),
            budget: None,
        }
    }
}

impl ShardSettings {
    /// How long a free shard is left to the replica the shared assignment gives it to: four
    /// looks, at most 2 s (a release or an expiry wakes that replica at once; a longer retry
    /// period must not leave a shard it does not take unowned for minutes).
    fn grace(&self) -> Duration {
        (self.retry_period * 4).min(MAX_GRACE)
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
    pub ready: Arc<AtomicBool>,
    /// Turns true once this replica has taken its share of the shards (`plan::has_its_share`):
    /// part of its readiness, so that a rolling upgrade does not stop the next replica while
    /// this one has yet to take over its part of the work.
    pub share: Arc<AtomicBool>,
    /// Whether the replica's work makes progress. A stuck replica stops renewing (its peers
    /// take its shards once the Leases expire), stops announcing itself and takes nothing.
    pub progress: Progress,
}

/// The shards this replica holds, shared by the renewing loop and the balancing loop. Every
/// change goes to the fence first, then to the work.
#[derive(Clone)]
struct Holdings {
    held: Arc<Mutex<BTreeMap<u32, Held>>>,
    /// When this process acquired, or tried to acquire, each shard Lease it does not hold
    /// (the Lease's acquireTime, which renewals keep, and which taking its own stale Lease
    /// back keeps too), the last `STAMPS_KEPT`: a write that timed out and landed anyway is
    /// still recognised, even after a later attempt. A Lease that names this replica is this
    /// process's own stale Lease, to take back at once, only with one of these: with any
    /// other, another process took it under the same replica id (a process before a restart,
    /// whose requests may still be on their way, or a second process started with the same
    /// id). Only this process's own writes carry its stamps, so keeping several is safe.
    left: Arc<Mutex<BTreeMap<u32, Vec<MicroTime>>>>,
    tx: Arc<watch::Sender<BTreeSet<u32>>>,
    fence: Fence,
    /// Wakes the balance round: a shard this replica lost is its own stale Lease, taken back
    /// (with compare-and-swap) at the next round.
    wake: Arc<Notify>,
    /// True once this process has written its membership Lease (a Lease in its name left by
    /// the process before a restart does not make it a member).
    announced: Arc<AtomicBool>,
}

impl Holdings {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<u32, Held>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn publish(&self) {
        let set: BTreeSet<u32> = self.lock().keys().copied().collect();
        self.tx.send_if_modified(|current| {
            if *current != set {
                *current = set;
                true
            } else {
                false
            }
        });
    }

    fn left(&self) -> MutexGuard<'_, BTreeMap<u32, Vec<MicroTime>>> {
        self.left.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn insert(&self, shard: u32, lease: Lease, sent: Instant) {
        self.fence.renewed(shard, sent);
        self.left().remove(&shard);
        self.lock().insert(shard, Held { lease, renewed: sent });
        self.publish();
    }

    /// Records a renewal sent at `sent` from the version `from`, unless the shard was dropped
    /// or changed hands meanwhile.
    fn renewed(&self, shard: u32, from: &str, lease: Lease, sent: Instant) {
        let mut held = self.lock();
        if let Some(h) = held.get_mut(&shard)
            && h.lease.metadata.resource_version.as_deref() == Some(from)
        {
            self.fence.renewed(shard, sent);
            h.lease = lease;
            h.renewed = sent;
        }
    }

    /// Whether `lease` (of a shard this process does not hold) is still the one it acquired:
    /// its own stale Lease.
    fn acquired(&self, shard: u32, lease: &Lease) -> bool {
        acquired_at(lease).is_some_and(|at| self.left().get(&shard).is_some_and(|stamps| stamps.contains(at)))
    }

    /// Notes an acquisition about to be sent, stamped `at`, before its answer is known.
    fn trying(&self, shard: u32, at: MicroTime) {
        note_stamp(&mut self.left(), shard, at);
    }

    /// Whether `shard` is held at version `from`.
    fn holds(&self, shard: u32, from: &str) -> bool {
        self.lock().get(&shard).is_some_and(|h| h.lease.metadata.resource_version.as_deref() == Some(from))
    }

    /// Removes shards (the fence first), returning what was held.
    fn remove(&self, shards: &[u32]) -> Vec<(u32, Held)> {
        for shard in shards {
            self.fence.dropped(*shard);
        }
        let removed: Vec<(u32, Held)> = {
            let mut held = self.lock();
            shards.iter().filter_map(|s| held.remove(s).map(|h| (*s, h))).collect()
        };
        {
            let mut left = self.left();
            for (shard, h) in &removed {
                if let Some(at) = acquired_at(&h.lease) {
                    note_stamp(&mut left, *shard, at.clone());
                }
            }
        }
        self.publish();
        removed
    }

    fn shards(&self) -> BTreeSet<u32> {
        self.lock().keys().copied().collect()
    }

    /// Held shards whose last renewal is at least `interval` old, with the version to renew from.
    fn due(&self, now: Instant, interval: Duration) -> Vec<(u32, Lease)> {
        self.lock()
            .iter()
            .filter(|(_, h)| now.saturating_duration_since(h.renewed) >= interval)
            .map(|(s, h)| (*s, h.lease.clone()))
            .collect()
    }

    fn seconds_since_renew(&self, now: Instant) -> f64 {
        self.lock().values().map(|h| now.saturating_duration_since(h.renewed).as_secs_f64()).fold(0.0, f64::max)
    }
}

/// How many stamps of its own acquisitions a process keeps per shard (`Holdings::left`).
const STAMPS_KEPT: usize = 4;

fn note_stamp(left: &mut BTreeMap<u32, Vec<MicroTime>>, shard: u32, at: MicroTime) {
    let stamps = left.entry(shard).or_default();
    if !stamps.contains(&at) {
        stamps.push(at);
    }
    if stamps.len() > STAMPS_KEPT {
        stamps.remove(0);
    }
}

/// Runs until `shutdown`, then stops work in every shard and releases their Leases.
pub async fn run_shard_manager(
    leases: Leases,
    me: String,
    settings: ShardSettings,
    channels: ShardChannels,
    metrics: Metrics,
    shutdown: watch::Receiver<bool>,
) {
    let ShardChannels { fence, held_tx, mut working_rx, ready, share, progress } = channels;
    metrics.shards_configured(settings.shards);
    let wake = Arc::new(Notify::new());
    let (observed_tx, observed_rx) = tokio::sync::mpsc::channel(OBSERVED_IN_FLIGHT);
    let holdings = Holdings {
        held: Arc::default(),
        left: Arc::default(),
        tx: Arc::new(held_tx),
        fence,
        wake: wake.clone(),
        announced: Arc::default(),
    };
    let hearing = Hearing::new(Instant::now());
    let renewing = renew_loop(
        leases.clone(),
        holdings.clone(),
        settings,
        ready.clone(),
        progress.clone(),
        metrics.clone(),
        shutdown.clone(),
    );
    let balancing = balance_loop(
        Balancer {
            leases: leases.clone(),
            me,
            settings,
            holdings: holdings.clone(),
            metrics: metrics.clone(),
            hearing: hearing.clone(),
        },
        &working_rx,
        (ready, share),
        progress,
        (wake, observed_rx, shutdown.clone()),
    );
    let watching = watch_leases(leases.clone(), observed_tx, hearing, shutdown);
    let (_, mut handing_back, ()) = tokio::join!(renewing, balancing, watching);

    // Graceful handoff: stop all work, and release each shard's Lease as soon as its own work
    // has stopped, so that peers take over each shard at once. Shards whose work was cancelled
    // rather than stopped may still have writes on their way: their Leases expire (a lease
    // duration after the last renewal) instead.
    // The membership Lease is deleted at once, beside the releases (so that a slow apiserver
    // delays neither). While it is there the peers count this replica among the live ones:
    // their fair shares stay as they were (with three replicas, a third of the shards, not
    // half), they are full, and they take none of the shards released below until the last
    // of them is, after the slowest namespace's stop. Without it a peer may take each shard
    // as soon as it is released. (The shards still held stay this replica's: a Lease is taken
    // from its holder only once released, or unrenewed for a lease duration as after a
    // kill -9.)
    let shards: Vec<u32> = holdings.shards().into_iter().collect();
    let released = holdings.remove(&shards);
    // Hand-backs begun before the signal go on beside it.
    let (_, left, ()) = tokio::join!(
        leases.leave(),
        release_as_stopped(&mut working_rx, released, settings.renew_deadline, ACQUISITIONS_IN_FLIGHT, |shard, h| {
            let (leases, metrics) = (leases.clone(), metrics.clone());
            async move {
                match leases.release(&h.lease).await {
                    Ok(()) => metrics.lease_event("released"),
                    Err(e) => warn!(shard, error = %e, "could not release shard on shutdown"),
                }
            }
        }),
        async move {
            while let Some(done) = handing_back.join_next().await {
                if let Ok(left) = done {
                    warn_unreleased(&left);
                }
            }
        }
    );
    metrics.shards_held(0, 0.0);
    if left.is_empty() {
        info!("released every shard");
    } else {
        warn_unreleased(&left);
    }
}

/// How long a newly served namespace's App cache is waited for before more shards are taken
/// under a memory budget, and by readiness (one that does not list by then, for want of
/// rights, is not).
pub const CACHES_FILL_WITHIN: Duration = Duration::from_secs(30);
/// How long after joining a replica that has not got its share of the shards is counted
/// ready anyway (`plan::has_its_share`).
const SHARE_WITHIN: Duration = Duration::from_secs(30);
/// The shortest lateness of the loop counted as a pause of the process (with a short renew
/// interval, scheduling delays under load are not pauses).
const MIN_PAUSE: Duration = Duration::from_secs(1);
/// The longest a free shard is left to its assigned replica alone.
const MAX_GRACE: Duration = Duration::from_secs(2);
/// How soon a round that could not plan (stuck, a failed list, work not ready) looks again,
/// at most a retry period.
const LOOK_AGAIN_SOON: Duration = Duration::from_millis(500);
/// How soon a round looks again after a peer took a shard it was taking (`look_again`).
const AFTER_A_LOST_RACE: Duration = Duration::from_millis(20);
/// How long every look must find room before a full replica says it is no longer full.
const FULL_CLEARS_AFTER: Duration = Duration::from_secs(5);

type Pending = Pin<Box<dyn Future<Output = Done> + Send>>;

/// Hand-backs of shards for balance, each a task that returns the shards it left unreleased
/// because their work did not stop by the renew deadline. Dropped (at the end of the
/// shutdown grace), the tasks are aborted and those Leases expire.
type HandBacks = tokio::task::JoinSet<Vec<u32>>;

fn warn_unreleased(left: &[u32]) {
    if !left.is_empty() {
        warn!(shards = ?left, "work in these shards did not stop in time: leaving their Leases to expire");
    }
}

/// A renewal that came back.
enum Done {
    Shard { shard: u32, from: String, sent: Instant, result: Result<Option<Lease>, LeaseError> },
    Member { result: Result<Option<Lease>, LeaseError> },
}

/// Renews held shards and the membership Lease, several at once, and fences shards whose
/// renewal is older than the renew deadline. Runs until `shutdown`.
async fn renew_loop(
    leases: Leases,
    holdings: Holdings,
    settings: ShardSettings,
    ready: Arc<AtomicBool>,
    progress: Progress,
    metrics: Metrics,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval((settings.renew_interval / 4).min(settings.retry_period));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut pending: FuturesUnordered<Pending> = FuturesUnordered::new();
    let mut renewing: BTreeSet<u32> = BTreeSet::new();
    let mut membership: Option<Lease> = None;
    let mut membership_renewed: Option<Instant> = None;
    let mut member_pending = false;
    let lose = |shards: Vec<u32>, why: &str| {
        for (shard, _) in holdings.remove(&shards) {
            metrics.lease_event("lost");
            warn!(shard, why, "lost shard: stopping its work");
            holdings.wake.notify_one();
        }
    };
    loop {
        tokio::select! {
            _ = shutdown.wait_for(|s| *s) => break,
            Some(done) = pending.next(), if !pending.is_empty() => match done {
                Done::Shard { shard, from, sent, result } => {
                    renewing.remove(&shard);
                    match result {
                        Ok(Some(lease)) => {
                            progress.control_answered();
                            holdings.renewed(shard, &from, lease, sent);
                        }
                        Ok(None) => {
                            progress.control_answered();
                            if holdings.holds(shard, &from) {
                                lose(vec![shard], "its Lease was written by another replica");
                            }
                        }
                        Err(e) => {
                            if e.answered() {
                                progress.control_answered();
                            }
                            warn!(shard, error = %e, "could not renew shard Lease");
                        }
                    }
                }
                Done::Member { result } => {
                    member_pending = false;
                    match result {
                        Ok(Some(l)) => {
                            progress.control_answered();
                            membership = Some(l);
                            membership_renewed = Some(Instant::now());
                            holdings.announced.store(true, Ordering::SeqCst);
                        }
                        Ok(None) => membership = None,
                        Err(e) => {
                            if e.answered() {
                                progress.control_answered();
                            }
                            warn!(error = %e, "could not renew membership Lease");
                        }
                    }
                }
            },
            _ = tick.tick() => {
                let now = Instant::now();
                if let Some(silent) = progress.stuck() {
                    // Stop everything and renew nothing: peers take the shards once the
                    // Leases expire, and count this replica gone once its membership does.
                    let all: Vec<u32> = holdings.shards().into_iter().collect();
                    if !all.is_empty() {
                        warn!(shards = all.len(), silent = ?silent, "stuck: dropping every shard");
                        lose(all, "this replica is stuck");
                    }
                    metrics.shards_held(0, 0.0);
                    continue;
                }
                // Fence: stop work in shards not renewed within the deadline, before anyone may take them.
                let lapsed: Vec<u32> = holdings
                    .due(now, settings.renew_deadline)
                    .into_iter()
                    .map(|(s, _)| s)
                    .collect();
                if !lapsed.is_empty() {
                    lose(lapsed, "not renewed within the renew deadline");
                }
                for (shard, lease) in holdings.due(now, settings.renew_interval) {
                    if pending.len() >= RENEWALS_IN_FLIGHT {
                        break;
                    }
                    if !renewing.insert(shard) {
                        continue;
                    }
                    let leases = leases.clone();
                    let from = lease.metadata.resource_version.clone().unwrap_or_default();
                    pending.push(Box::pin(async move {
                        let sent = Instant::now();
                        let result = leases.renew(&lease).await;
                        Done::Shard { shard, from, sent, result }
                    }));
                }
                let work_ready = ready.load(Ordering::SeqCst);
                let member_due = membership_renewed.is_none_or(|t| now.duration_since(t) >= settings.renew_interval);
                if work_ready && member_due && !member_pending {
                    member_pending = true;
                    let (leases, last) = (leases.clone(), membership.clone());
                    pending.push(Box::pin(async move { Done::Member { result: leases.heartbeat(last.as_ref()).await } }));
                }
                metrics.shards_held(holdings.shards().len(), holdings.seconds_since_renew(now));
            }
        }
    }
    // A membership heartbeat still on its way is answered before the membership Lease is
    // deleted: a Lease update may create what it finds missing, and one landing after the
    // delete would bring this replica back to life in its peers' eyes for a lease duration
    // (their fair shares shrink, and they hand the shards they just took back). Each call is
    // bounded by the Lease call timeout.
    while pending.next().await.is_some() {}
}

/// Notes what the watch saw and tells whether a round should look at once: a change the
/// watch says a round acts on, or a membership Lease seen free (expired, or never seen) that
/// is held now: a peer back from a pause, owed its fair share. (A shard Lease taken is not:
/// each acquisition would wake its own replica again.)
fn note(tracker: &mut ExpiryTracker, o: &Observed, now_ms: u64, lease_duration: Duration) -> bool {
    let Some((name, holder, version)) = &o.lease else { return o.wakes };
    let was_free = tracker.is_free(name, now_ms, lease_duration);
    tracker.observe(name, holder.as_deref(), version, now_ms);
    let member = shard_of_lease(name).is_none();
    o.wakes || (member && was_free && !tracker.is_free(name, now_ms, lease_duration))
}

/// What a round knows of the time since the Leases were last seen.
#[derive(Clone, Copy, Debug, Default)]
struct SinceLastSeen {
    /// Whether a list failed since the last one that did not.
    failed: bool,
    /// Since the last list that came back.
    gap: Duration,
    /// The watch's longest silence meanwhile (`Hearing`).
    silence: Duration,
    /// How much later than its timer the loop woke for this round.
    late: Duration,
    /// How long this round's list took.
    list: Duration,
}

impl SinceLastSeen {
    /// Whether the Leases went unseen long enough that their holders may not have been able to
    /// renew either, so that their expiry is judged from now:
    /// - lists failed for longer than the renew interval while the watch (which sees every
    ///   renewal) was silent too; a relist after an outage ends a silence, it does not undo it;
    /// - the loop woke long after its timer (the process was paused, or starved);
    /// - the list answered long after its call timeout, which bounds it: the process was
    ///   paused while the answer waited, and the list shows the Leases from before.
    ///
    /// The gaps the timer makes on purpose (a retry period longer than a lease duration) and
    /// slow rounds are not such a time: counted as one, rounds would start the clocks again
    /// and no expired Lease would be taken.
    fn unseen(&self, renew_interval: Duration, call_timeout: Duration) -> bool {
        let outage = self.failed && self.gap > renew_interval && self.silence > renew_interval;
        let woke_late = self.late > renew_interval.max(MIN_PAUSE);
        let answered_late = self.list > call_timeout + MIN_PAUSE;
        outage || woke_late || answered_late
    }
}

/// How long after a round that tried to take shards the next one looks, given how long it
/// would wait otherwise (`planned`):
/// - soon after a race lost to a peer (an acquisition that came back with a conflict): the
///   plan was made from a view the peer had already acted on, and the peer's other shards
///   may now be this replica's, which only a new list shows. Nothing else wakes a round for
///   a peer's acquisition, so without this they wait out the grace (2 s). 20 ms after the
///   first such round, doubling with each in a row up to `planned`: a conflict that is not a
///   peer's (a Lease created by hand, missing from the list for want of its label) cannot
///   make a busy loop;
/// - soon (`soon`) when an acquisition failed (a timeout, an error): it is retried, not hot;
/// - as planned otherwise.
fn look_again(lost_in_a_row: u32, failed: bool, planned: Duration, soon: Duration) -> Duration {
    if lost_in_a_row > 0 {
        let doublings = (lost_in_a_row - 1).min(16);
        AFTER_A_LOST_RACE.saturating_mul(1 << doublings).min(planned)
    } else if failed {
        soon.min(planned)
    } else {
        planned
    }
}

/// Shard Leases in this replica's name that this process did not acquire, by the version
/// first seen while they stayed so. One seen at another version later was written meanwhile:
/// another process is running under this replica's id now, which is said once (loudly: the
/// shard fence of the apiserver tells replicas apart by their Pod's name, so it cannot tell
/// these two apart). Looked at only after this process's first lease duration, so that a
/// renewal its predecessor (before a restart) sent just before it died is not taken for one.
#[derive(Debug, Default)]
struct Strangers {
    seen: BTreeMap<u32, String>,
    said: bool,
}

impl Strangers {
    /// Notes a version; true when it shows another live process under this id.
    fn saw(&mut self, shard: u32, version: Option<&str>, me: &str) -> bool {
        let Some(version) = version else { return false };
        let first = self.seen.entry(shard).or_insert_with(|| version.to_string());
        let twin = first != version;
        if twin && !std::mem::replace(&mut self.said, true) {
            error!(
                replica = me,
                shard,
                "another process holds shard Leases as this replica: replica ids must be unique (--replica-id, the Pod's name in a cluster); this one takes none of them while they are renewed"
            );
        }
        twin
    }

    /// Keeps only the shards still in a stranger's hands (`strange`).
    fn retain(&mut self, strange: impl Fn(u32) -> bool) {
        self.seen.retain(|s, _| strange(*s));
    }
}

/// What the balancing loop works with.
struct Balancer {
    leases: Leases,
    me: String,
    settings: ShardSettings,
    holdings: Holdings,
    metrics: Metrics,
    /// When the watch last heard from the apiserver.
    hearing: Hearing,
}

/// Lists the Leases every retry period, takes free shards and hands surplus back. A round
/// also starts when the Lease watch (`observed`) reports a change a round acts on, when
/// `wake` is notified (this replica lost a shard: its own stale Lease, to take back), and
/// when a Lease seen held turns free without a renewal seen, so that a released or expired
/// shard is taken then, not up to a retry period later. Between rounds it notes each Lease
/// version the watch reports, so that expiry is judged from when each renewal arrived. Runs
/// until `shutdown`, and returns the hand-backs still waiting for their shards' work to stop.
async fn balance_loop(
    b: Balancer,
    working_rx: &watch::Receiver<BTreeSet<u32>>,
    (ready, share): (Arc<AtomicBool>, Arc<AtomicBool>),
    progress: Progress,
    (wake, mut observed, mut shutdown): (Arc<Notify>, tokio::sync::mpsc::Receiver<Observed>, watch::Receiver<bool>),
) -> HandBacks {
    let Balancer { leases, me, settings, holdings, metrics, hearing } = b;
    let start = Instant::now();
    let ms = move |t: Instant| u64::try_from(t.duration_since(start).as_millis()).unwrap_or(u64::MAX);
    let mut tracker = ExpiryTracker::default();
    // From the start: lists failing from the first one are a time without seeing, too.
    let mut last_listed = start;
    let mut failed_since = false;
    let mut budget_reached = false;
    // Since when every look has found room under the budget.
    let mut room_since: Option<Instant> = None;
    let mut next_round = tokio::time::Instant::now();
    // Whether the last pass of the loop ran a round (however it ended).
    let mut ran = false;
    // What the watch reported while the loop waited; noted with the rest at the loop's top.
    let mut arrived: Option<Observed> = None;
    // The shards of each hand-back still running: out of this replica's holdings, their
    // Leases still name it. Planning leaves them alone (neither its own stale Leases to take
    // back, nor free) until their hand-back is done.
    let mut handing_back = HandBacks::new();
    let mut handed: BTreeMap<tokio::task::Id, Vec<u32>> = BTreeMap::new();
    let mut strangers = Strangers::default();
    // Rounds in a row whose acquisitions lost a race (`look_again`).
    let mut lost_in_a_row: u32 = 0;
    // Since when its own membership Lease has been seen live (its share, for readiness).
    let mut member_since: Option<Instant> = None;
    loop {
        // A round slower than the retry period is followed by the next at once; the timer is
        // not late for it.
        if std::mem::take(&mut ran) {
            next_round = next_round.max(tokio::time::Instant::now());
        }
        // Note what arrived (while waiting, or during the last round) before judging what is
        // due: a burst (a relist) makes one round.
        let mut woken = false;
        while let Some(o) = arrived.take().or_else(|| observed.try_recv().ok()) {
            woken |= note(&mut tracker, &o, ms(Instant::now()), settings.lease_duration);
        }
        let due = tracker
            .next_due(ms(Instant::now()), settings.lease_duration, settings.grace())
            .and_then(|(at, name)| Some((start.checked_add(Duration::from_millis(at))?, name.to_string())))
            .map(|(at, name)| (tokio::time::Instant::from_std(at), name));
        let due_at = due.as_ref().map_or(next_round, |(at, _)| *at);
        // When a timer would start the next round at the earliest: waking much later than that
        // means this process was paused (or starved), not that a round was slow. `next_round`
        // outlives the passes that only note the watch's news, so a pause is seen whichever
        // branch wakes first.
        let scheduled = due_at.min(next_round);
        let why = if woken {
            "a Lease changed"
        } else {
            tokio::select! {
            _ = shutdown.wait_for(|s| *s) => break,
            Some(done) = handing_back.join_next_with_id(), if !handing_back.is_empty() => {
                // A hand-back that failed released what it could; the rest expire, and the
                // shards are planned again like any other.
                let id = match done {
                    Ok((id, left)) => {
                        warn_unreleased(&left);
                        id
                    }
                    Err(e) => {
                        warn!(error = %e, "a hand-back of shards failed");
                        e.id()
                    }
                };
                handed.remove(&id);
                continue;
            }
            Some(o) = observed.recv() => {
                arrived = Some(o);
                continue;
            }
            () = wake.notified() => "a shard was lost",
            () = tokio::time::sleep_until(due_at), if due_at < next_round => {
                // Its expiry: the watch may have seen it renewed meanwhile (the end of a
                // grace finds it free).
                let name = due.as_ref().map(|(_, n)| n.as_str()).unwrap_or_default();
                if !tracker.is_free(name, ms(Instant::now()), settings.lease_duration) {
                    continue;
                }
                "a Lease expires"
            }
            () = tokio::time::sleep_until(next_round) => "timer",
            }
        };
        let late = tokio::time::Instant::now().saturating_duration_since(scheduled);
        ran = true;
        // A round that cannot plan (stuck, a failed list, work
        // not ready) looks again soon: nothing would wake it when that ends.
        next_round = tokio::time::Instant::now() + settings.retry_period;
        // Measured when a round gives up, not when it started: a slow list or acquisition is
        // not retried at once.
        let soon = || tokio::time::Instant::now() + settings.retry_period.min(LOOK_AGAIN_SOON);
        if progress.stuck().is_some() {
            next_round = soon();
            continue;
        }
        let asked = Instant::now();
        let all = match leases.list().await {
            Ok(all) => {
                progress.control_answered();
                all
            }
            Err(e) => {
                if e.answered() {
                    progress.control_answered();
                }
                warn!(error = %e, "could not list Leases");
                failed_since = true;
                next_round = soon();
                continue;
            }
        };
        // Observations are stamped when the list came back, never earlier: stamping them with
        // the start of the round would make a peer's fresh renewal look older than it is.
        let now = Instant::now();
        let now_ms = ms(now);
        // After a time without seeing the Leases (`SinceLastSeen::unseen`), their holders may
        // not have been able to renew either: count again from now.
        let since = SinceLastSeen {
            failed: failed_since,
            gap: now.duration_since(last_listed),
            silence: hearing.take_silence(now),
            late,
            list: now.duration_since(asked),
        };
        if since.unseen(settings.renew_interval, leases.call_timeout()) {
            info!(gap = ?since.gap, late = ?since.late, list = ?since.list, "Leases seen again after a gap: judging their expiry from now");
            tracker.restart(now_ms);
        }
        last_listed = now;
        failed_since = false;

        let mut present: BTreeSet<String> = all.iter().filter_map(|l| l.metadata.name.clone()).collect();
        for l in &all {
            let name = l.metadata.name.clone().unwrap_or_default();
            tracker.observe(&name, holder(l), l.metadata.resource_version.as_deref().unwrap_or_default(), now_ms);
        }
        // Shards whose Lease was never created are free from when this replica first saw them missing.
        for shard in 0..settings.shards {
            let name = shard_lease_name(shard);
            if !present.contains(&name) {
                tracker.observe(&name, None, "", now_ms);
                present.insert(name);
            }
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
        let held = holdings.shards();
        let releasing: BTreeSet<u32> = handed.values().flatten().copied().collect();
        // Shards in this replica's name that another process acquired, this round.
        let mut strange = BTreeSet::new();
        // Of those, the ones another live process renews (a twin under the same id).
        let mut twin_held = BTreeSet::new();
        let settled = now.duration_since(start) > settings.lease_duration;
        let mut own_stale = BTreeSet::new();
        let mut others: BTreeMap<String, usize> = BTreeMap::new();
        let mut free: BTreeMap<u32, Duration> = BTreeMap::new();
        for shard in (0..settings.shards).filter(|s| !held.contains(s) && !releasing.contains(s)) {
            let lease = by_shard.get(&shard).copied();
            match lease.and_then(holder) {
                Some(h) if h == me => {
                    if lease.is_some_and(|l| holdings.acquired(shard, l)) {
                        own_stale.insert(shard);
                        continue;
                    }
                    // Taken under this replica's id by another process: like any other
                    // holder's, free only once unchanged for a lease duration.
                    strange.insert(shard);
                    if settled && strangers.saw(shard, lease.and_then(|l| l.metadata.resource_version.as_deref()), &me)
                    {
                        twin_held.insert(shard);
                    }
                }
                Some(h)
                    if live.contains(h)
                        && !tracker.is_free(&shard_lease_name(shard), now_ms, settings.lease_duration) =>
                {
                    *others.entry(h.to_string()).or_default() += 1;
                    continue;
                }
                _ => {}
            }
            if let Some(f) = tracker.free_for(&shard_lease_name(shard), now_ms, settings.lease_duration) {
                free.insert(shard, f);
            }
        }
        // A shard this process took since, or that went to someone else or no one, is no
        // stranger's any more.
        strangers.retain(|s| strange.contains(&s));
        let mismatched: Vec<String> = all
            .iter()
            .filter(|l| is_member(l))
            .filter(|l| holder(l).is_some_and(|h| live.contains(h)))
            .filter_map(|l| l.metadata.labels.as_ref()?.get(LABEL_SHARDS).cloned())
            .filter(|n| *n != settings.shards.to_string())
            .collect();
        // Live replicas at their memory budget, with what they hold: they take no more, and
        // the others share the rest (this replica's own state is judged below, not read back).
        let mut full: BTreeMap<String, usize> = all
            .iter()
            .filter(|l| is_member(l))
            .filter(|l| l.metadata.labels.as_ref().and_then(|m| m.get(LABEL_FULL)).map(String::as_str) == Some("true"))
            .filter_map(|l| holder(l).filter(|h| live.contains(*h) && *h != me.as_str()))
            .map(|h| (h.to_string(), others.get(h).copied().unwrap_or(0)))
            .collect();
        let apps = metrics.app_index().count();
        let filling = metrics.app_index().unsynced(CACHES_FILL_WITHIN) > 0;
        // Full at once; no longer full only once every look for FULL_CLEARS_AFTER has found
        // room, with every cache filled: peers then hand shards back, and a replica that
        // turned full again would leave them unowned for a while.
        let full_now = settings.budget.is_some_and(|b| b.is_full(apps, held.len()));
        room_since = if full_now || filling { None } else { room_since.or(Some(now)) };
        let me_full =
            full_now || (budget_reached && room_since.is_none_or(|t| now.duration_since(t) < FULL_CLEARS_AFTER));
        if me_full {
            full.insert(me.clone(), held.len());
        }
        leases.announce_full(me_full);
        let view = View {
            me: &me,
            shards: settings.shards,
            live: &live,
            held: &held,
            own_stale: &own_stale,
            others: &others,
            free: &free,
            grace: settings.grace(),
            full: &full,
        };
        let mut decision = plan(&view);
        metrics.shards_unowned(free.len());
        // The memory budget: no more shards than the Apps already served leave room for.
        // While a shard taken earlier still fills its caches, its Apps are not counted yet:
        // take nothing more until they are.
        let allowed = settings.budget.map(|b| if filling { 0 } else { b.shards_allowed(apps, held.len()) });
        if me_full && !budget_reached {
            warn!(
                apps,
                max_apps = settings.budget.map(|b| b.max_apps),
                free = free.len(),
                "memory budget reached: taking no more shards; peers share the rest, or leave them unowned"
            );
        }
        if let Some(allowed) = allowed {
            decision.acquire.truncate(allowed);
        }
        budget_reached = me_full;
        metrics.app_budget(settings.budget.map(|b| b.max_apps), me_full);
        // Caches filling or room being confirmed under the budget: nothing wakes a round when
        // that ends.
        if settings.budget.is_some() && (filling || (me_full && !full_now)) {
            next_round = soon();
        }
        if !ready.load(Ordering::SeqCst) {
            decision.acquire.clear();
            next_round = soon();
        }
        if !mismatched.is_empty() {
            // Two shard counts would map one namespace to two shards held by two replicas.
            warn!(shards = settings.shards, others = ?mismatched, "live replicas run with a different --shards; taking no shard until they agree");
            decision.acquire.clear();
            next_round = soon();
        }

        if decision.acquire.is_empty() && decision.release.is_empty() {
            debug!(why, live = live.len(), held = held.len(), free = ?free.keys().collect::<Vec<_>>(), "balance round: nothing to do");
        } else {
            info!(
                why,
                live = live.len(),
                held = held.len(),
                free = ?free.keys().collect::<Vec<_>>(),
                acquire = ?decision.acquire,
                release = ?decision.release,
                "balance round"
            );
        }
        let (failed, lost) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
        futures::stream::iter(decision.acquire)
            .for_each_concurrent(ACQUISITIONS_IN_FLIGHT, |shard| {
                let read = by_shard.get(&shard).map(|l| (*l).clone());
                // Its own stale Lease keeps the stamp of this process's acquisition; any other
                // gets a new one, noted before it is sent (the answer may never come back while
                // the write lands).
                let own = read.as_ref().filter(|_| own_stale.contains(&shard)).and_then(acquired_at).cloned();
                let at = own.unwrap_or_else(|| {
                    let at = acquisition_stamp();
                    holdings.trying(shard, at.clone());
                    at
                });
                let (leases, holdings, metrics, progress, failed, lost) =
                    (leases.clone(), holdings.clone(), metrics.clone(), progress.clone(), failed.clone(), lost.clone());
                async move {
                    let sent = Instant::now();
                    match leases.acquire(shard, read.as_ref(), at).await {
                        Ok(Some(lease)) => {
                            progress.control_answered();
                            info!(shard, "acquired shard");
                            metrics.lease_event("acquired");
                            holdings.insert(shard, lease, sent);
                        }
                        Ok(None) => {
                            progress.control_answered();
                            debug!(
                                shard,
                                "the shard's Lease was written by someone else first (409): looking again soon"
                            );
                            lost.store(true, Ordering::Relaxed);
                        }
                        Err(e) => {
                            warn!(shard, error = %e, "could not acquire shard");
                            failed.store(true, Ordering::Relaxed);
                        }
                    }
                }
            })
            .await;
        // A member once this process has announced itself and the peers can see it (its
        // work ready: the membership is written only then).
        if live.contains(&me) && holdings.announced.load(Ordering::SeqCst) && ready.load(Ordering::SeqCst) {
            member_since.get_or_insert(now);
        }
        if !share.load(Ordering::SeqCst) {
            let fair = fair_share(&me, settings.shards, &live, &full);
            // Shards a live twin under the same id renews count: that is the id's share. Ones
            // only left in its name (by the process before a restart) do not.
            let holds = holdings.shards().union(&twin_held).count();
            let member_for = member_since.map(|t| t.elapsed());
            if has_its_share(member_for, holds, fair, me_full, SHARE_WITHIN) {
                share.store(true, Ordering::SeqCst);
                info!(holds, fair, member_for = ?member_for.unwrap_or_default(), "holds its share of the shards");
            }
        }
        lost_in_a_row = if lost.load(Ordering::Relaxed) { lost_in_a_row.saturating_add(1) } else { 0 };
        let now = tokio::time::Instant::now();
        let (planned, soon) = (next_round.saturating_duration_since(now), soon().saturating_duration_since(now));
        next_round = now + look_again(lost_in_a_row, failed.load(Ordering::Relaxed), planned, soon);
        if !decision.release.is_empty() {
            let release = holdings.remove(&decision.release);
            let shards: Vec<u32> = release.iter().map(|(s, _)| *s).collect();
            // Work that had to be cancelled may still have a request on its way: that shard's
            // Lease is not renewed any more and expires, like at shutdown.
            let mut working = working_rx.clone();
            let (leases, metrics, deadline) = (leases.clone(), metrics.clone(), settings.renew_deadline);
            let task = handing_back.spawn(async move {
                release_as_stopped(&mut working, release, deadline, ACQUISITIONS_IN_FLIGHT, |shard, h| {
                    let (leases, metrics) = (leases.clone(), metrics.clone());
                    async move {
                        match leases.release(&h.lease).await {
                            Ok(()) => {
                                info!(shard, "handed shard back for balance");
                                metrics.lease_event("released");
                            }
                            Err(e) => warn!(shard, error = %e, "could not release shard: it expires instead"),
                        }
                    }
                })
                .await
            });
            handed.insert(task.id(), shards);
        }
    }
    handing_back
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::jiff::Timestamp;

    const LEASE: Duration = Duration::from_secs(6);

    fn lease_at(version: &str, acquired: &str) -> Lease {
        let mut l = Lease::default();
        l.metadata.name = Some(shard_lease_name(3));
        l.metadata.resource_version = Some(version.into());
        let at: Timestamp = acquired.parse().expect("a timestamp");
        l.spec = Some(LeaseSpec { acquire_time: Some(MicroTime(at)), ..LeaseSpec::default() });
        l
    }

    #[test]
    fn only_the_lease_this_process_acquired_is_its_own_stale_lease() {
        let (tx, _rx) = watch::channel(BTreeSet::new());
        let h = Holdings {
            held: Arc::default(),
            left: Arc::default(),
            tx: Arc::new(tx),
            fence: Fence::new(32, Duration::from_secs(4)),
            wake: Arc::default(),
            announced: Arc::default(),
        };
        let now = Instant::now();
        let (mine, before, twin) =
            ("2026-12-05T06:00:01.000001Z", "2026-12-05T06:00:00Z", "2026-12-05T06:00:01.000002Z");
        // Acquired by a process before a restart: not this one's.
        assert!(!h.acquired(3, &lease_at("10", before)));
        h.insert(3, lease_at("11", mine), now);
        h.renewed(3, "11", lease_at("12", mine), now);
        h.remove(&[3]);
        // Dropped (fenced): its own at any version its renewals wrote, even one whose answer
        // never came back.
        assert!(h.acquired(3, &lease_at("12", mine)));
        assert!(h.acquired(3, &lease_at("13", mine)), "a renewal that timed out and landed");
        assert!(!h.acquired(3, &lease_at("14", twin)), "taken by another process under the same id");
        assert!(!h.acquired(3, &Lease::default()), "no acquireTime");
        // Taken again: nothing is left over.
        h.insert(3, lease_at("20", twin), now);
        assert!(h.left().is_empty());
        // An acquisition whose answer never came back, and which landed after a second attempt
        // was sent: both were noted before they went.
        let at = acquisition_stamp();
        h.trying(4, at.clone());
        h.trying(4, MicroTime("2026-12-05T06:00:09Z".parse().expect("a timestamp")));
        let landed =
            Lease { spec: Some(LeaseSpec { acquire_time: Some(at), ..LeaseSpec::default() }), ..Lease::default() };
        assert!(h.acquired(4, &landed));
        for i in 0..STAMPS_KEPT {
            h.trying(4, MicroTime(format!("2026-12-05T06:01:0{i}Z").parse().expect("a timestamp")));
        }
        assert!(!h.acquired(4, &landed), "only the last {STAMPS_KEPT} are kept");
    }

    #[test]
    fn a_lease_in_this_replicas_name_written_again_by_another_process_shows_a_twin() {
        let mut s = Strangers::default();
        assert!(!s.saw(1, Some("7"), "r"), "first seen: a process before a restart, maybe");
        assert!(!s.saw(1, Some("7"), "r"), "unchanged");
        assert!(!s.saw(2, None, "r"));
        assert!(s.saw(1, Some("9"), "r"), "renewed by someone else under this id");
        assert!(s.said);
        assert!(s.saw(1, Some("11"), "r"));
    }

    #[test]
    fn a_round_that_lost_a_race_looks_again_soon_backing_off_and_a_failed_one_soon() {
        let ms = Duration::from_millis;
        let (planned, soon) = (ms(500), ms(300));
        let cases = [
            ("every shard taken", 0, false, planned),
            ("a peer took a shard first", 1, false, ms(20)),
            ("a peer took one, another failed", 1, true, ms(20)),
            ("lost twice in a row", 2, false, ms(40)),
            ("lost five times in a row", 5, false, ms(320)),
            ("lost six times in a row: as planned, no busy loop", 6, false, planned),
            ("lost for ever", u32::MAX, false, planned),
            ("an acquisition failed", 0, true, soon),
        ];
        for (what, lost, failed, want) in cases {
            assert_eq!(look_again(lost, failed, planned, soon), want, "{what}");
        }
        // Never later than planned (a retry period shorter than the pauses).
        assert_eq!(look_again(1, false, ms(10), soon), ms(10));
        assert_eq!(look_again(0, true, ms(10), soon), ms(10));
    }

    #[test]
    fn expiry_is_judged_from_now_after_an_outage_or_a_pause_not_after_a_slow_or_sparse_look() {
        const RENEW: Duration = Duration::from_secs(2);
        const CALL: Duration = Duration::from_secs(2);
        let s = |ms: u64| Duration::from_millis(ms);
        let quiet = SinceLastSeen { gap: s(500), silence: s(100), list: s(20), ..SinceLastSeen::default() };
        let cases = [
            ("a round on time", quiet, false),
            (
                "lists failed 5 s, the watch silent",
                SinceLastSeen { failed: true, gap: s(5_000), silence: s(5_000), ..quiet },
                true,
            ),
            (
                "lists failed 5 s, the watch heard",
                SinceLastSeen { failed: true, gap: s(5_000), silence: s(300), ..quiet },
                false,
            ),
            (
                "a list failed once, within the renew interval",
                SinceLastSeen { failed: true, gap: s(1_500), silence: s(2_500), ..quiet },
                false,
            ),
            (
                "a retry period of 60 s, nothing failed",
                SinceLastSeen { gap: s(60_000), silence: s(60_000), ..quiet },
                false,
            ),
            ("woken 3 s late", SinceLastSeen { late: s(3_000), ..quiet }, true),
            ("woken 0.9 s late", SinceLastSeen { late: s(900), ..quiet }, false),
            ("a list that timed out is slow, not a pause", SinceLastSeen { list: s(2_000), ..quiet }, false),
            ("a list answered 30 s after it was sent", SinceLastSeen { list: s(30_000), ..quiet }, true),
        ];
        for (what, since, unseen) in cases {
            assert_eq!(since.unseen(RENEW, CALL), unseen, "{what}");
        }
    }

    fn seen(name: &str, holder: Option<&str>, version: &str, wakes: bool) -> Observed {
        Observed { lease: Some((name.into(), holder.map(String::from), version.into())), wakes }
    }

    #[test]
    fn a_lease_held_again_after_it_expired_wakes_a_round_and_renewals_do_not() {
        let mut t = ExpiryTracker::default();
        let member = "flotilla-member-b";
        assert!(note(&mut t, &seen(member, Some("b"), "1", false), 0, LEASE), "a peer never seen joins");
        assert!(!note(&mut t, &seen(member, Some("b"), "2", false), 2_000, LEASE), "its renewal");
        // Paused for longer than a lease duration: the same version again (a relist) is no news...
        assert!(!note(&mut t, &seen(member, Some("b"), "2", false), 9_000, LEASE));
        // ...its first renewal after the pause is: it is owed its share again.
        assert!(note(&mut t, &seen(member, Some("b"), "3", false), 9_500, LEASE));
        assert!(!t.is_free(member, 15_000, LEASE), "renewal noted when it arrived");
        // A shard Lease taken (by this replica or a peer) is no news to act on.
        assert!(!note(&mut t, &seen("flotilla-shard-2", Some("c"), "4", false), 9_550, LEASE));
        // What the watch says wakes, wakes.
        assert!(note(&mut t, &seen("flotilla-shard-1", None, "7", true), 9_600, LEASE));
        assert!(note(&mut t, &Observed { lease: None, wakes: true }, 9_700, LEASE));
    }
}
