//! A watch of the Leases for the balance rounds. It tells them two things:
//! - when a Lease changed in a way a round acts on at once (a shard Lease released or
//!   deleted, a replica that joins, leaves or turns full), so that a released shard is not
//!   left waiting for the next round (every retry period) and that round's list;
//! - every version of every Lease as it arrives, so that the expiry tracker sees a renewal
//!   when it happens, not at the next list: judged from lists alone, a Lease renewed just
//!   after one list looks renewed only at the next, and expires that much later.
//!
//! The watch only hastens rounds and refines when a Lease is seen to change: each round still
//! lists the Leases with a consistent read and takes a shard with compare-and-swap, and a
//! version is stamped when it is noted, never earlier, so a late, lost or stale event can only
//! delay a takeover. Renewals (most events) wake nothing.

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::watcher::Event;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};
use tracing::{debug, warn};

use super::leases::{LABEL_FULL, Leases, holder, is_member};

/// What the watch remembers between events: each membership Lease seen, with whether it said
/// its replica was full.
#[derive(Debug, Default)]
pub struct Seen {
    members: BTreeMap<String, bool>,
    /// Members seen since the watch (re)started its list, swapped in when the list is done.
    listing: BTreeMap<String, bool>,
}

fn full(lease: &Lease) -> bool {
    lease.metadata.labels.as_ref().and_then(|m| m.get(LABEL_FULL)).map(String::as_str) == Some("true")
}

impl Seen {
    /// Whether `event` should start a balance round now.
    pub fn wakes(&mut self, event: &Event<Lease>) -> bool {
        match event {
            Event::Init => {
                self.listing.clear();
                false
            }
            Event::InitApply(l) => {
                if is_member(l) {
                    self.listing.insert(l.metadata.name.clone().unwrap_or_default(), full(l));
                }
                false
            }
            // A relist may stand for changes the watch missed: look once.
            Event::InitDone => {
                self.members = std::mem::take(&mut self.listing);
                true
            }
            Event::Apply(l) if is_member(l) => {
                let name = l.metadata.name.clone().unwrap_or_default();
                self.members.insert(name, full(l)) != Some(full(l))
            }
            Event::Apply(l) => holder(l).is_none(),
            Event::Delete(l) => {
                if is_member(l) {
                    self.members.remove(l.metadata.name.as_deref().unwrap_or_default());
                }
                true
            }
        }
    }
}

/// Retry delays of the Lease watch: 250 ms, doubling to at most 2 s, and from the start again
/// once the apiserver answers (`hears`). kube's default backoff waits up to 30 s and forgets its
/// delays only after 2 min without errors: after an apiserver outage a replica's watch came
/// back 45 s later, and a shard released meanwhile waited for its timer. This watch serves
/// failover, and it is one small request per replica. (Not kube's `StreamBackoff`: it starts
/// again on any item, and the watcher yields one, `Init`, before each attempt to list, so
/// its delays never grew past the first.)
#[derive(Debug)]
struct Retry(Duration);

const RETRY_FIRST: Duration = Duration::from_millis(250);
const RETRY_MAX: Duration = Duration::from_secs(2);

impl Default for Retry {
    fn default() -> Self {
        Self(RETRY_FIRST)
    }
}

impl Retry {
    /// The delay before the next attempt.
    fn next_delay(&mut self) -> Duration {
        let delay = self.0;
        self.0 = (delay * 2).min(RETRY_MAX);
        delay
    }

    fn reset(&mut self) {
        self.0 = RETRY_FIRST;
    }
}

/// When the watch last heard from the apiserver (a Lease, a deletion, the end of a list; not
/// the watcher's own `Init`, which it yields before each attempt, failed or not), and its
/// longest silence since the balance loop last asked. Stamped as events arrive, in the
/// watch's task: news that waits in the channel while a round runs was heard all the same.
#[derive(Clone, Debug)]
pub struct Hearing(Arc<Mutex<(Instant, Duration)>>);

impl Hearing {
    pub fn new(now: Instant) -> Self {
        Self(Arc::new(Mutex::new((now, Duration::ZERO))))
    }

    fn heard(&self, now: Instant) {
        let mut h = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        h.1 = h.1.max(now.saturating_duration_since(h.0));
        h.0 = h.0.max(now);
    }

    /// The longest silence since the last call, the one going on now included; then counts
    /// again from nothing.
    pub fn take_silence(&self, now: Instant) -> Duration {
        let mut h = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let longest = h.1.max(now.saturating_duration_since(h.0));
        h.1 = Duration::ZERO;
        longest
    }
}

/// What the watch tells the balance loop.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    /// A Lease's name, holder and version as the watch saw it (none for a deletion or the end
    /// of a relist).
    pub lease: Option<(String, Option<String>, String)>,
    /// Whether a round should look at once.
    pub wakes: bool,
}

/// What of `event` the balance loop is told, if anything.
pub fn observed(seen: &mut Seen, event: &Event<Lease>) -> Option<Observed> {
    let wakes = seen.wakes(event);
    let lease = match event {
        Event::Apply(l) | Event::InitApply(l) => Some((
            l.metadata.name.clone().unwrap_or_default(),
            holder(l).map(str::to_string),
            l.metadata.resource_version.clone().unwrap_or_default(),
        )),
        Event::Delete(_) | Event::Init | Event::InitDone => None,
    };
    (lease.is_some() || wakes).then_some(Observed { lease, wakes })
}

/// Watches the Leases until `shutdown` (or until the balance loop is gone), sending what the
/// balance loop is to note and stamping in `hearing` when the apiserver was last heard. Watch
/// errors are retried after `Retry`'s delays; meanwhile rounds run on their own timer.
pub async fn watch_leases(
    leases: Leases,
    tx: mpsc::Sender<Observed>,
    hearing: Hearing,
    shutdown: watch::Receiver<bool>,
) {
    follow(leases.watch(), tx, hearing, shutdown).await;
}

/// What a watch event says of the apiserver: that it answered. `Init` comes before every
/// attempt to list, one that fails too, so it says nothing.
fn hears(event: &Event<Lease>) -> bool {
    !matches!(event, Event::Init)
}

/// `watch_leases` on the watcher's stream `events`.
async fn follow<S>(events: S, tx: mpsc::Sender<Observed>, hearing: Hearing, mut shutdown: watch::Receiver<bool>)
where
    S: futures::Stream<Item = Result<Event<Lease>, kube::runtime::watcher::Error>>,
{
    let mut seen = Seen::default();
    let mut events = std::pin::pin!(events);
    let mut retry = Retry::default();
    let mut failing = false;
    loop {
        let event = tokio::select! {
            _ = shutdown.wait_for(|s| *s) => return,
            event = events.next() => event,
        };
        match event {
            Some(Ok(event)) => {
                if hears(&event) {
                    hearing.heard(Instant::now());
                    retry.reset();
                    failing = false;
                }
                if let Some(o) = observed(&mut seen, &event)
                    && tx.send(o).await.is_err()
                {
                    return;
                }
            }
            Some(Err(e)) => {
                // Once per outage at warn: the retries go on every 2 s at most.
                if std::mem::replace(&mut failing, true) {
                    debug!(error = %e, "watching Leases");
                } else {
                    warn!(error = %e, "watching Leases failed: rounds go on by their timer, and expiry is judged from lists");
                }
                let delay = retry.next_delay();
                tokio::select! {
                    _ = shutdown.wait_for(|s| *s) => return,
                    () = tokio::time::sleep(delay) => {}
                }
            }
            None => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn lease(name: &str, kind: &str, holder: Option<&str>, full: bool) -> Lease {
        let labels = BTreeMap::from([
            (super::super::leases::LABEL_LEASE.to_string(), kind.to_string()),
            (LABEL_FULL.to_string(), full.to_string()),
        ]);
        Lease {
            metadata: ObjectMeta { name: Some(name.into()), labels: Some(labels), ..ObjectMeta::default() },
            spec: Some(LeaseSpec { holder_identity: holder.map(String::from), ..LeaseSpec::default() }),
        }
    }

    #[test]
    fn renewals_wake_nothing_and_what_a_round_acts_on_wakes_it() {
        let mut seen = Seen::default();
        let (a, b) = (
            lease("flotilla-member-a", "member", Some("a"), false),
            lease("flotilla-member-b", "member", Some("b"), false),
        );
        let held = lease("flotilla-shard-3", "shard", Some("a"), false);
        // The first list: nothing until it is done, then one look.
        assert!(!seen.wakes(&Event::Init));
        assert!(!seen.wakes(&Event::InitApply(a.clone())));
        assert!(!seen.wakes(&Event::InitApply(held.clone())));
        assert!(seen.wakes(&Event::InitDone));
        // Renewals of a known member and of a held shard.
        assert!(!seen.wakes(&Event::Apply(a.clone())));
        assert!(!seen.wakes(&Event::Apply(held.clone())));
        // A shard taken by a peer: nothing to do.
        assert!(!seen.wakes(&Event::Apply(lease("flotilla-shard-4", "shard", Some("b"), false))));
        // A replica joins (then renews), turns full, clears.
        assert!(seen.wakes(&Event::Apply(b.clone())));
        assert!(!seen.wakes(&Event::Apply(b.clone())));
        assert!(seen.wakes(&Event::Apply(lease("flotilla-member-b", "member", Some("b"), true))));
        assert!(seen.wakes(&Event::Apply(b.clone())));
        // A shard released, a shard Lease deleted, a replica that leaves (and comes back).
        assert!(seen.wakes(&Event::Apply(lease("flotilla-shard-3", "shard", None, false))));
        assert!(seen.wakes(&Event::Delete(held)));
        assert!(seen.wakes(&Event::Delete(a.clone())));
        assert!(seen.wakes(&Event::Apply(a)));
    }

    #[test]
    fn every_version_is_passed_on_and_only_what_a_round_acts_on_wakes() {
        let mut seen = Seen::default();
        let held = lease("flotilla-shard-3", "shard", Some("a"), false);
        assert_eq!(observed(&mut seen, &Event::Init), None, "nothing to note or do");
        let renewal = observed(&mut seen, &Event::Apply(held.clone())).expect("noted");
        assert_eq!(
            renewal,
            Observed { lease: Some(("flotilla-shard-3".into(), Some("a".into()), String::new())), wakes: false }
        );
        let released =
            observed(&mut seen, &Event::Apply(lease("flotilla-shard-3", "shard", None, false))).expect("noted");
        assert_eq!(released, Observed { lease: Some(("flotilla-shard-3".into(), None, String::new())), wakes: true });
        assert_eq!(observed(&mut seen, &Event::Delete(held)), Some(Observed { lease: None, wakes: true }));
    }

    #[test]
    fn the_watch_retries_within_two_seconds_and_starts_again_after_an_event() {
        let mut r = Retry::default();
        let delays: Vec<u64> = (0..6).map(|_| r.next_delay().as_millis() as u64).collect();
        assert_eq!(delays, vec![250, 500, 1_000, 2_000, 2_000, 2_000]);
        r.reset();
        assert_eq!(r.next_delay(), RETRY_FIRST);
    }

    #[test]
    fn silence_is_the_longest_gap_between_arrivals_and_counts_the_one_going_on() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let h = Hearing::new(t0);
        h.heard(at(1_000));
        h.heard(at(4_000));
        h.heard(at(4_500));
        assert_eq!(h.take_silence(at(5_000)), Duration::from_secs(3));
        assert_eq!(h.take_silence(at(5_200)), Duration::from_millis(700), "counted again, from the last arrival");
        assert_eq!(h.take_silence(at(9_000)), Duration::from_millis(4_500), "a silence going on");
        // An arrival stamped before the last one moves nothing back.
        h.heard(at(4_000));
        assert_eq!(h.take_silence(at(9_000)), Duration::from_millis(4_500));
    }

    /// kube's watcher during an outage: `Init` before each attempt, then the attempt's error.
    fn outage(attempts: usize) -> Vec<Result<Event<Lease>, kube::runtime::watcher::Error>> {
        (0..attempts).flat_map(|_| [Ok(Event::Init), Err(kube::runtime::watcher::Error::NoResourceVersion)]).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn the_retries_grow_through_an_outage_and_start_again_once_a_lease_arrives() {
        let t0 = tokio::time::Instant::now();
        let polled: Arc<Mutex<Vec<u64>>> = Arc::default();
        let mut items = outage(6);
        items.push(Ok(Event::InitApply(lease("flotilla-shard-1", "shard", Some("a"), false))));
        items.push(Ok(Event::InitDone));
        items.extend(outage(2));
        let log = polled.clone();
        let events = futures::stream::iter(items).inspect(move |item| {
            if item.is_err() {
                log.lock().expect("log").push(t0.elapsed().as_millis() as u64);
            }
        });
        let (tx, mut rx) = mpsc::channel(16);
        let (_stop, shutdown) = watch::channel(false);
        let hearing = Hearing::new(Instant::now());
        follow(events, tx, hearing, shutdown).await;
        // Each error is followed by a wait before the watcher is polled again: 250 ms, then
        // doubling to 2 s, and 250 ms again after the Lease (not after the `Init`s).
        assert_eq!(*polled.lock().expect("log"), vec![0, 250, 750, 1_750, 3_750, 5_750, 7_750, 8_000]);
        assert!(rx.try_recv().is_ok(), "the Lease was passed on");
    }

    #[test]
    fn only_what_the_apiserver_sent_is_hearing_from_it() {
        assert!(!hears(&Event::Init));
        assert!(hears(&Event::InitDone));
        assert!(hears(&Event::Delete(lease("flotilla-shard-1", "shard", None, false))));
    }

    #[test]
    fn a_relist_forgets_members_that_went_while_the_watch_was_down() {
        let mut seen = Seen::default();
        let a = lease("flotilla-member-a", "member", Some("a"), false);
        seen.wakes(&Event::Apply(a.clone()));
        // The watch restarts; a is gone from the new list.
        seen.wakes(&Event::Init);
        seen.wakes(&Event::InitDone);
        assert!(seen.wakes(&Event::Apply(a)), "a is new again after the relist");
    }
}
