//! Pure decisions of shard ownership: when another replica's Lease has expired (judged on this
//! replica's own monotonic clock), and which shards to take or hand back for a fair share.
//!
//! Replicas that see the same Leases compute the same assignment of the free shards (each
//! free shard goes to the live replica that prefers it most by a rendezvous hash, among those
//! with room left in their fair share), and each goes only for its own: after an apiserver
//! outage or a start of every replica at once, their acquisitions do not collide. A shard that
//! stays free for a grace period anyway (views differ, its replica does not take it) is open
//! to any replica with room.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use crate::api::fingerprint::fnv1a64;

/// Remembers, per Lease, the last (holder, resourceVersion) seen and when this replica first
/// saw it, in milliseconds of its own monotonic clock. A Lease whose holder keeps renewing
/// changes resourceVersion; one that stays unchanged for longer than the lease duration has
/// expired. Clocks of other machines are never compared.
#[derive(Debug, Default)]
pub struct ExpiryTracker {
    seen: HashMap<String, (Option<String>, String, u64)>,
}

impl ExpiryTracker {
    pub fn observe(&mut self, lease: &str, holder: Option<&str>, version: &str, now_ms: u64) {
        let entry = self.seen.entry(lease.to_string()).or_insert_with(|| (None, String::new(), now_ms));
        if entry.0.as_deref() != holder || entry.1 != version {
            *entry = (holder.map(str::to_string), version.to_string(), now_ms);
        }
    }

    /// Forgets Leases that no longer exist.
    pub fn retain(&mut self, present: &BTreeSet<String>) {
        self.seen.retain(|k, _| present.contains(k));
    }

    /// Starts every Lease's clock again at `now_ms`. Called when this replica could not see
    /// the Leases for a while (an apiserver outage, a partition, a pause): their holders may
    /// not have been able to renew either, so "unchanged since" is only counted from when
    /// this replica can watch again. It only ever delays a takeover, never hastens one.
    pub fn restart(&mut self, now_ms: u64) {
        for entry in self.seen.values_mut() {
            entry.2 = now_ms;
        }
    }

    /// Whether the Lease is free to take: no holder, never seen, or unchanged for longer than `duration`.
    pub fn is_free(&self, lease: &str, now_ms: u64, duration: Duration) -> bool {
        self.free_for(lease, now_ms, duration).is_some()
    }

    /// How long the Lease has been free (`None`: held). A released Lease is free from when it
    /// was seen released, an expired one from when its lease duration ran out, one never seen
    /// from now.
    pub fn free_for(&self, lease: &str, now_ms: u64, duration: Duration) -> Option<Duration> {
        let duration_ms = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
        match self.seen.get(lease) {
            None => Some(Duration::ZERO),
            Some((None, _, since)) => Some(Duration::from_millis(now_ms.saturating_sub(*since))),
            Some((Some(_), _, since)) => {
                let unchanged = now_ms.saturating_sub(*since);
                (unchanged > duration_ms).then(|| Duration::from_millis(unchanged - duration_ms))
            }
        }
    }

    /// The next moment (on the clock of `free_for`) a balance round is due, and the Lease it
    /// is due for: when a Lease still held turns free unless its holder renews it first, or
    /// when a free Lease has been free for `grace` and is open to any replica.
    pub fn next_due(&self, now_ms: u64, duration: Duration, grace: Duration) -> Option<(u64, &str)> {
        let duration_ms = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
        let grace_ms = u64::try_from(grace.as_millis()).unwrap_or(u64::MAX);
        self.seen
            .iter()
            .flat_map(|(name, (holder, _, since))| {
                let free_from = if holder.is_some() { since.saturating_add(duration_ms) } else { *since };
                let expiry = holder.is_some().then(|| free_from.saturating_add(1));
                [expiry, Some(free_from.saturating_add(grace_ms))].into_iter().flatten().map(|at| (at, name.as_str()))
            })
            .filter(|(at, _)| *at > now_ms)
            .min()
    }

    /// Whether the Lease was seen renewed within `duration` (for membership Leases).
    pub fn is_live(&self, lease: &str, now_ms: u64, duration: Duration) -> bool {
        !self.is_free(lease, now_ms, duration)
    }
}

/// What a replica should do with shard Leases this round.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub acquire: Vec<u32>,
    pub release: Vec<u32>,
}

/// The fair share of one replica: ceil(shards / live replicas) at most. The first
/// (shards mod live) replicas by name take the ceiling and the others the floor, so the
/// shares add up to the shard count and differ by at most one. A replica at its memory
/// budget (in `full`, with the shards it holds) keeps what it holds, up to that equal share,
/// and takes nothing more; the other replicas share the remaining shards the same way.
pub fn fair_share(replica: &str, shards: u32, live: &BTreeSet<String>, full: &BTreeMap<String, usize>) -> usize {
    let mut members = live.clone();
    members.insert(replica.to_string());
    let equal = |r: &str| {
        let n = members.len();
        let rank = members.iter().position(|m| m == r).unwrap_or(0);
        shards as usize / n + usize::from(rank < shards as usize % n)
    };
    let kept = |r: &str, held: usize| held.min(equal(r));
    if let Some(held) = full.get(replica) {
        return kept(replica, *held);
    }
    let taken: usize = full.iter().filter(|(r, _)| members.contains(*r)).map(|(r, n)| kept(r, *n)).sum();
    let rest: Vec<&String> = members.iter().filter(|m| !full.contains_key(*m)).collect();
    let n = rest.len().max(1);
    let left = (shards as usize).saturating_sub(taken);
    let rank = rest.iter().position(|m| *m == replica).unwrap_or(0);
    let (base, extra) = (left / n, left % n);
    base + usize::from(rank < extra)
}

/// Whether a replica has taken its share of the shards, as its readiness means it: it is a
/// live member and holds (or its id holds: a twin's view) at least its fair share, or it is
/// at its memory budget and may take no more, or it has been a member for `wait` and
/// still has not (peers that do not hand back, a shard count that does not match: a rolling
/// upgrade must not wait for it for ever). `member_for` is `None` until its membership Lease
/// is seen live. Pure.
pub fn has_its_share(member_for: Option<Duration>, holds: usize, fair: usize, full: bool, wait: Duration) -> bool {
    match member_for {
        None => false,
        Some(d) => holds >= fair || full || d >= wait,
    }
}

/// How much `replica` prefers `shard`: a rendezvous hash, so that replicas racing for free
/// shards mostly go for different ones, and a replica gives back the ones it likes least.
fn preference(replica: &str, shard: u32) -> u64 {
    fnv1a64(format!("{replica}/{shard}").as_bytes())
}

/// What one replica sees of shard ownership in one round.
#[derive(Clone, Copy, Debug)]
pub struct View<'a> {
    /// This replica.
    pub me: &'a str,
    pub shards: u32,
    /// Live replicas (this one is counted whether listed or not).
    pub live: &'a BTreeSet<String>,
    /// Shards this replica holds and renews.
    pub held: &'a BTreeSet<u32>,
    /// Shard Leases that still name this replica as holder although it no longer renews them
    /// (it fenced itself during an outage), as this process acquired them. Nobody else can
    /// hold them without changing the Lease, so this replica may take them back at once,
    /// with compare-and-swap as always. (A Lease in its name that another process acquired
    /// under the same id is not here.)
    pub own_stale: &'a BTreeSet<u32>,
    /// Shards held by each other live replica, as the Leases show.
    pub others: &'a BTreeMap<String, usize>,
    /// Free or expired shards, with how long each has been free on this replica's clock.
    pub free: &'a BTreeMap<u32, Duration>,
    /// How long a free shard is left to the replica the assignment gives it to before any
    /// replica with room may take it.
    pub grace: Duration,
    /// Live replicas at their memory budget (this one included, if it is), with the shards
    /// each holds: they take no more, and the others share the rest.
    pub full: &'a BTreeMap<String, usize>,
}

/// Takes shards up to the fair share (first its own stale Leases, then the free shards the
/// shared assignment gives it, then shards left free past the grace period), or hands back
/// the surplus when more replicas are alive than when the shards were taken.
pub fn plan(view: &View<'_>) -> Plan {
    let View { me, shards, live, held, own_stale, others, free, grace, full } = *view;
    let fair = fair_share(me, shards, live, full);
    let mut out = Plan::default();
    if held.len() > fair {
        let mut mine: Vec<u32> = held.iter().copied().collect();
        mine.sort_by_key(|s| preference(me, *s));
        out.release = mine.into_iter().take(held.len() - fair).collect();
        return out;
    }
    let mut room = fair - held.len();
    let mut taking: BTreeSet<u32> = BTreeSet::new();
    let mut take = |s: u32, room: &mut usize, out: &mut Plan| {
        if *room > 0 && s < shards && !held.contains(&s) && taking.insert(s) {
            out.acquire.push(s);
            *room -= 1;
        }
    };
    let mut stale: Vec<u32> = own_stale.iter().copied().collect();
    stale.sort_by_key(|s| std::cmp::Reverse(preference(me, *s)));
    for s in stale {
        take(s, &mut room, &mut out);
    }
    let free_now: BTreeSet<u32> =
        free.keys().copied().filter(|s| *s < shards && !held.contains(s) && !own_stale.contains(s)).collect();
    for s in assignment(me, shards, live, held.len() + own_stale.len(), others, &free_now, full) {
        take(s, &mut room, &mut out);
    }
    let mut overdue: Vec<u32> = free_now.iter().copied().filter(|s| free.get(s).is_some_and(|f| *f >= grace)).collect();
    overdue.sort_by_key(|s| std::cmp::Reverse(preference(me, *s)));
    for s in overdue {
        take(s, &mut room, &mut out);
    }
    out
}

/// The free shards the shared assignment gives to `me`: every (shard, replica) pair ordered
/// by preference, each shard to the first live replica that still has room in its fair share.
/// Every replica that sees the same Leases computes the same assignment.
fn assignment(
    me: &str,
    shards: u32,
    live: &BTreeSet<String>,
    mine: usize,
    others: &BTreeMap<String, usize>,
    free: &BTreeSet<u32>,
    full: &BTreeMap<String, usize>,
) -> Vec<u32> {
    let mut members = live.clone();
    members.insert(me.to_string());
    let mut room: BTreeMap<&str, usize> = members
        .iter()
        .map(|r| {
            let has = if r == me { mine } else { others.get(r).copied().unwrap_or(0) };
            (r.as_str(), fair_share(r, shards, &members, full).saturating_sub(has))
        })
        .collect();
    let mut pairs: Vec<(u64, &str, u32)> =
        free.iter().flat_map(|s| members.iter().map(move |r| (preference(r, *s), r.as_str(), *s))).collect();
    pairs.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(b.1)).then(a.2.cmp(&b.2)));
    let mut given: BTreeSet<u32> = BTreeSet::new();
    let mut out = Vec::new();
    for (_, r, s) in pairs {
        if given.contains(&s) {
            continue;
        }
        let Some(left) = room.get_mut(r) else { continue };
        if *left == 0 {
            continue;
        }
        *left -= 1;
        given.insert(s);
        if r == me {
            out.push(s);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const LEASE: Duration = Duration::from_secs(6);
    const GRACE: Duration = Duration::from_secs(2);

    #[test]
    fn expiry_is_judged_on_the_local_clock() {
        let mut t = ExpiryTracker::default();
        t.observe("s0", Some("b"), "10", 1_000);
        assert!(!t.is_free("s0", 6_000, LEASE), "5 s unchanged: still held");
        t.observe("s0", Some("b"), "11", 6_000);
        assert!(!t.is_free("s0", 11_500, LEASE), "renewed at 6 s: held until 12 s");
        assert!(t.is_free("s0", 12_001, LEASE), "unchanged for more than 6 s: expired");
        assert_eq!(t.free_for("s0", 14_000, LEASE), Some(Duration::from_millis(2_000)), "expired at 12 s");
        t.observe("s1", None, "3", 0);
        assert!(t.is_free("s1", 0, LEASE), "released: free at once");
        assert_eq!(t.free_for("s1", 1_500, LEASE), Some(Duration::from_millis(1_500)));
        assert!(t.is_free("never-seen", 0, LEASE));
        assert_eq!(t.free_for("never-seen", 9_000, LEASE), Some(Duration::ZERO));
    }

    #[test]
    fn the_next_expiry_is_the_first_moment_a_held_lease_is_free() {
        let mut t = ExpiryTracker::default();
        assert_eq!(t.next_due(0, LEASE, GRACE), None, "nothing seen");
        t.observe("s0", Some("b"), "10", 1_000);
        t.observe("s1", Some("c"), "7", 2_500);
        t.observe("s2", None, "3", 0);
        assert_eq!(t.next_due(0, LEASE, GRACE), Some((2_000, "s2")), "s2, released at 0, open to all at 2 s");
        assert_eq!(t.next_due(3_000, LEASE, GRACE), Some((7_001, "s0")), "s0, unchanged since 1 s");
        assert!(!t.is_free("s0", 7_000, LEASE) && t.is_free("s0", 7_001, LEASE));
        assert_eq!(t.next_due(7_001, LEASE, GRACE), Some((8_501, "s1")), "then s1; s0 is free already");
        t.observe("s1", Some("c"), "8", 8_000);
        assert_eq!(t.next_due(8_000, LEASE, GRACE), Some((9_000, "s0")), "s0's grace ends");
        assert_eq!(t.free_for("s0", 9_000, LEASE), Some(GRACE));
        assert_eq!(t.next_due(9_000, LEASE, GRACE), Some((14_001, "s1")), "s1 was renewed");
        assert_eq!(t.next_due(16_000, LEASE, GRACE), None, "every Lease free and past its grace");
    }

    #[test]
    fn a_replica_that_could_not_see_counts_unchanged_leases_again_from_when_it_can() {
        // Seen at 1 s; the apiserver is away from 2 s to 22 s; the holder could not renew
        // either. Without a restart the Lease would look expired the moment the list works again.
        let mut t = ExpiryTracker::default();
        t.observe("s0", Some("b"), "10", 1_000);
        t.observe("s1", None, "4", 1_000);
        assert!(t.is_free("s0", 22_000, LEASE));
        t.restart(22_000);
        t.observe("s0", Some("b"), "10", 22_000);
        assert!(!t.is_free("s0", 27_000, LEASE), "held for a lease duration after the replica sees again");
        assert!(t.is_free("s0", 28_001, LEASE), "and expired after it, if its holder never renews");
        assert!(t.is_free("s1", 22_000, LEASE), "a released Lease stays free");
        assert_eq!(t.free_for("s1", 23_000, LEASE), Some(Duration::from_millis(1_000)), "freshly seen free");
    }

    fn members(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn peers_of_a_full_replica_take_its_share() {
        let live: BTreeSet<String> = ["a", "b", "c"].map(String::from).into();
        let free: BTreeMap<u32, Duration> = (5..32).map(|s| (s, GRACE * 2)).collect();
        let full = BTreeMap::from([("a".to_string(), 5)]);
        let (none, no_shards): (BTreeMap<String, usize>, BTreeSet<u32>) = (BTreeMap::new(), BTreeSet::new());
        let view = |me: &'static str, others: &'static str, full: &BTreeMap<String, usize>| -> usize {
            let others = if others.is_empty() { BTreeMap::new() } else { BTreeMap::from([(others.to_string(), 5)]) };
            plan(&View {
                me,
                shards: 32,
                live: &live,
                held: &no_shards,
                own_stale: &no_shards,
                others: &others,
                free: &free,
                grace: GRACE,
                full,
            })
            .acquire
            .len()
        };
        assert_eq!(view("b", "a", &full), 14);
        assert_eq!(view("c", "a", &full), 13);
        // Without the announcement, b and c stop at a third each, and 5 stay unowned.
        assert_eq!(view("b", "a", &none), 11);
        // The full replica itself takes nothing, whatever is free.
        assert_eq!(view("a", "", &BTreeMap::from([("a".to_string(), 0)])), 0);
    }

    #[test]
    fn a_replica_has_its_share_once_it_holds_it_is_full_or_has_waited() {
        let (s, wait) = (Duration::from_secs, Duration::from_secs(30));
        // (member for, holds, fair share, full) -> has its share
        let table = [
            (None, 32, 11, false, false), // not a member yet: peers do not count it
            (Some(s(1)), 0, 11, false, false),
            (Some(s(1)), 10, 11, false, false),
            (Some(s(1)), 11, 11, false, true),
            (Some(s(1)), 12, 11, false, true), // more than its share, until it hands back
            (Some(s(1)), 2, 11, true, true),   // at its memory budget: it takes no more
            (Some(s(29)), 0, 11, false, false),
            (Some(s(30)), 0, 11, false, true), // waited long enough
        ];
        for (member_for, holds, fair, full, want) in table {
            assert_eq!(
                has_its_share(member_for, holds, fair, full, wait),
                want,
                "{member_for:?} {holds} {fair} {full}"
            );
        }
    }

    #[test]
    fn a_replica_at_its_budget_keeps_what_it_holds_and_the_others_share_the_rest() {
        let three: BTreeSet<String> = ["a", "b", "c"].map(String::from).into();
        let full = BTreeMap::from([("a".to_string(), 5)]);
        let shares: Vec<usize> = ["a", "b", "c"].iter().map(|r| fair_share(r, 32, &three, &full)).collect();
        assert_eq!(shares, vec![5, 14, 13]);
        // Everyone full: each keeps what it holds, and nobody takes the rest.
        let all = BTreeMap::from([("a".to_string(), 5), ("b".to_string(), 6), ("c".to_string(), 7)]);
        let shares: Vec<usize> = ["a", "b", "c"].iter().map(|r| fair_share(r, 32, &three, &all)).collect();
        assert_eq!(shares, vec![5, 6, 7]);
        // A full replica holding more than an equal share (alone until now) hands the surplus
        // to the others.
        let alone = BTreeMap::from([("a".to_string(), 32)]);
        let shares: Vec<usize> = ["a", "b", "c"].iter().map(|r| fair_share(r, 32, &three, &alone)).collect();
        assert_eq!(shares, vec![11, 11, 10]);
        // A full replica that is no longer live does not count.
        let two: BTreeSet<String> = ["b", "c"].map(String::from).into();
        assert_eq!(fair_share("b", 32, &two, &full), 16);
    }

    #[test]
    fn fair_shares_add_up_and_differ_by_at_most_one() {
        let three = members(&["a", "b", "c"]);
        assert_eq!(
            [
                fair_share("a", 32, &three, &BTreeMap::new()),
                fair_share("b", 32, &three, &BTreeMap::new()),
                fair_share("c", 32, &three, &BTreeMap::new())
            ],
            [11, 11, 10]
        );
        let five = members(&["a", "b", "c", "d", "e"]);
        let shares: Vec<usize> =
            ["a", "b", "c", "d", "e"].iter().map(|r| fair_share(r, 32, &five, &BTreeMap::new())).collect();
        assert_eq!(shares, vec![7, 7, 6, 6, 6]);
        assert_eq!(fair_share("solo", 32, &BTreeSet::new(), &BTreeMap::new()), 32, "a replica counts itself");
    }

    /// The view of one replica: `owners[s]` names the holder of shard s as the Leases show it
    /// (`"a!"`: a Lease naming `a` that `a` no longer renews), `None` a free shard free for `free_for`.
    fn plan_for(me: &str, live: &[&str], owners: &[Option<&str>], free_for: Duration) -> Plan {
        let live = members(live);
        let shards = u32::try_from(owners.len()).unwrap_or(0);
        let mut held = BTreeSet::new();
        let mut own_stale = BTreeSet::new();
        let mut others: BTreeMap<String, usize> = BTreeMap::new();
        let mut free = BTreeMap::new();
        for (s, o) in (0..shards).zip(owners) {
            match o {
                None => {
                    free.insert(s, free_for);
                }
                Some(o) if *o == me => {
                    held.insert(s);
                }
                Some(o) if o.strip_suffix('!') == Some(me) => {
                    own_stale.insert(s);
                }
                Some(o) => *others.entry(o.trim_end_matches('!').to_string()).or_default() += 1,
            }
        }
        plan(&View {
            me,
            shards,
            live: &live,
            held: &held,
            own_stale: &own_stale,
            others: &others,
            free: &free,
            grace: GRACE,
            full: &BTreeMap::new(),
        })
    }

    #[test]
    fn takes_up_to_fair_share_and_hands_back_surplus() {
        let p = plan_for("a", &["a", "b", "c"], &[None; 32], Duration::ZERO);
        assert_eq!(p.acquire.len(), 11);
        assert!(p.release.is_empty());
        let mut owners = vec![Some("a"); 16];
        owners.extend([Some("b"); 16]);
        let p = plan_for("a", &["a", "b", "c", "d"], &owners, Duration::ZERO);
        assert_eq!((p.acquire.len(), p.release.len()), (0, 8));
        assert!(p.release.iter().all(|s| *s < 16));
    }

    #[test]
    fn replicas_with_one_view_go_for_different_shards() {
        // Table: (live replicas, Lease holders) -> every replica's plan is disjoint from the
        // others', and together they take every free shard.
        let after_outage: Vec<Option<&str>> = (0..32).map(|s| Some(["a!", "b!", "c!"][s % 3])).collect::<Vec<_>>();
        let half: Vec<Option<&str>> = (0..32).map(|s| (s % 2 == 0).then_some("a")).collect();
        type Case<'a> = (&'a str, Vec<&'a str>, Vec<Option<&'a str>>);
        let cases: Vec<Case> = vec![
            ("fresh install, three replicas", vec!["a", "b", "c"], vec![None; 32]),
            ("fresh install, five replicas", vec!["a", "b", "c", "d", "e"], vec![None; 32]),
            ("after an outage every Lease names a replica that fenced itself", vec!["a", "b", "c"], after_outage),
            ("a died, b and c share its shards", vec!["b", "c"], half),
        ];
        for (what, live, owners) in cases {
            let mut taken: BTreeMap<u32, &str> = BTreeMap::new();
            for r in &live {
                for s in plan_for(r, &live, &owners, Duration::ZERO).acquire {
                    if let Some(other) = taken.insert(s, r) {
                        panic!("{what}: {r} and {other} both go for shard {s}");
                    }
                }
            }
            let free = owners.iter().filter(|o| o.is_none() || o.is_some_and(|o| o.ends_with('!'))).count();
            assert_eq!(taken.len(), free, "{what}: every free shard is taken by exactly one replica");
        }
    }

    #[test]
    fn after_an_outage_each_replica_takes_back_only_its_own() {
        let owners: Vec<Option<&str>> = (0..32).map(|s| Some(["a!", "b!", "c!"][s % 3])).collect();
        let p = plan_for("a", &["a", "b", "c"], &owners, Duration::ZERO);
        assert_eq!(p.acquire, {
            let mut own: Vec<u32> = (0..32).filter(|s| s % 3 == 0).collect();
            own.sort_by_key(|s| std::cmp::Reverse(preference("a", *s)));
            own
        });
        // Alone after the outage (its peers died meanwhile): its own Leases first, theirs only
        // once they have expired on its clock.
        let p = plan_for("a", &["a"], &owners, Duration::ZERO);
        assert_eq!(p.acquire.len(), 11, "only its own: the others' Leases are not free yet");
    }

    #[test]
    fn a_free_shard_is_left_to_its_replica_for_the_grace_period() {
        // x is gone but its Leases have not expired yet; a and b have room for more than the
        // four free shards. Each takes only what the assignment gives it; a shard b was given
        // but did not take is open to a once it has been free for the grace period.
        let owners = [Some("x"), Some("x"), None, None, None, None];
        let early_a = plan_for("a", &["a", "b"], &owners, Duration::from_millis(500));
        let early_b = plan_for("b", &["a", "b"], &owners, Duration::from_millis(500));
        assert!(early_a.acquire.iter().all(|s| !early_b.acquire.contains(s)), "{early_a:?} {early_b:?}");
        assert_eq!(early_a.acquire.len() + early_b.acquire.len(), 4);
        let late_a = plan_for("a", &["a", "b"], &owners, GRACE);
        assert_eq!(late_a.acquire.len(), 3, "never past its share of 3");
        assert!(early_a.acquire.iter().all(|s| late_a.acquire.contains(s)), "its own first");
        if early_a.acquire.len() < 3 {
            assert!(late_a.acquire.iter().any(|s| early_b.acquire.contains(s)), "then what b left");
        }
    }

    /// Simulates replicas planning in rounds from one shared snapshot of the Leases (as when
    /// they all list at once): conflicting acquisitions are counted, the first one wins.
    fn converge(replicas: &[String], shards: u32, mut owner: Vec<Option<usize>>) -> (Vec<Option<usize>>, usize) {
        let mut conflicts = 0;
        let mut free_rounds = vec![0u32; shards as usize];
        for _round in 0..20 {
            let live: BTreeSet<String> = replicas.iter().cloned().collect();
            let mut plans = Vec::new();
            for (i, r) in replicas.iter().enumerate() {
                let held: BTreeSet<u32> = (0..shards).filter(|s| owner[*s as usize] == Some(i)).collect();
                let mut others: BTreeMap<String, usize> = BTreeMap::new();
                for o in owner.iter().flatten().filter(|o| **o != i) {
                    *others.entry(replicas[*o].clone()).or_default() += 1;
                }
                let free: BTreeMap<u32, Duration> = (0..shards)
                    .filter(|s| owner[*s as usize].is_none())
                    .map(|s| (s, Duration::from_millis(500) * free_rounds[s as usize]))
                    .collect();
                let view = View {
                    me: r,
                    shards,
                    live: &live,
                    held: &held,
                    own_stale: &BTreeSet::new(),
                    others: &others,
                    free: &free,
                    grace: GRACE,
                    full: &BTreeMap::new(),
                };
                plans.push(plan(&view));
            }
            for p in &plans {
                for s in &p.release {
                    owner[*s as usize] = None;
                }
            }
            for (i, p) in plans.iter().enumerate() {
                for s in &p.acquire {
                    if owner[*s as usize].is_none() {
                        owner[*s as usize] = Some(i);
                    } else {
                        conflicts += 1;
                    }
                }
            }
            for (s, o) in owner.iter().enumerate() {
                free_rounds[s] = if o.is_none() { free_rounds[s] + 1 } else { 0 };
            }
        }
        (owner, conflicts)
    }

    proptest! {
        #[test]
        fn replicas_converge_to_a_balanced_exclusive_split_without_collisions(n in 1usize..7, shards in 1u32..80, joiner in any::<bool>()) {
            let replicas: Vec<String> = (0..n).map(|i| format!("flotilla-{i}")).collect();
            let (mut owner, mut conflicts) = converge(&replicas, shards, vec![None; shards as usize]);
            let mut all = replicas.clone();
            if joiner {
                all.push("flotilla-new".into());
                let (o, c) = converge(&all, shards, owner);
                owner = o;
                conflicts += c;
            }
            prop_assert!(owner.iter().all(Option::is_some), "every shard held");
            let counts: Vec<usize> = (0..all.len()).map(|i| owner.iter().filter(|o| **o == Some(i)).count()).collect();
            let (min, max) = (counts.iter().min().copied().unwrap_or(0), counts.iter().max().copied().unwrap_or(0));
            prop_assert!(max - min <= 1, "counts {counts:?}");
            prop_assert_eq!(conflicts, 0, "replicas with one view never go for the same shard");
        }
    }
}
