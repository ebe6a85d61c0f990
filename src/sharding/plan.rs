//! Pure decisions of shard ownership: when another replica's Lease has expired (judged on this
//! replica's own monotonic clock), and which shards to take or hand back for a fair share.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use super::hash::fnv1a64;

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

    /// Whether the Lease is free to take: no holder, never seen, or unchanged for longer than `duration`.
    pub fn is_free(&self, lease: &str, now_ms: u64, duration: Duration) -> bool {
        match self.seen.get(lease) {
            None => true,
            Some((None, _, _)) => true,
            Some((Some(_), _, since)) => {
                now_ms.saturating_sub(*since) > u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
            }
        }
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
/// shares add up to the shard count and differ by at most one.
pub fn fair_share(replica: &str, shards: u32, live: &BTreeSet<String>) -> usize {
    let mut members = live.clone();
    members.insert(replica.to_string());
    let n = members.len();
    let rank = members.iter().position(|m| m == replica).unwrap_or(0);
    let (base, extra) = (shards as usize / n, shards as usize % n);
    base + usize::from(rank < extra)
}

/// How much `replica` prefers `shard`: a rendezvous hash, so that replicas racing for free
/// shards mostly go for different ones, and a replica gives back the ones it likes least.
fn preference(replica: &str, shard: u32) -> u64 {
    fnv1a64(format!("{replica}/{shard}").as_bytes())
}

/// Takes free shards up to the fair share, or hands back the surplus when more replicas
/// are alive than when the shards were taken.
pub fn plan(replica: &str, shards: u32, live: &BTreeSet<String>, held: &BTreeSet<u32>, free: &BTreeSet<u32>) -> Plan {
    let fair = fair_share(replica, shards, live);
    let mut out = Plan::default();
    if held.len() > fair {
        let mut mine: Vec<u32> = held.iter().copied().collect();
        mine.sort_by_key(|s| preference(replica, *s));
        out.release = mine.into_iter().take(held.len() - fair).collect();
    } else if held.len() < fair {
        let mut candidates: Vec<u32> = free.iter().copied().filter(|s| !held.contains(s) && *s < shards).collect();
        candidates.sort_by_key(|s| std::cmp::Reverse(preference(replica, *s)));
        out.acquire = candidates.into_iter().take(fair - held.len()).collect();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const LEASE: Duration = Duration::from_secs(6);

    #[test]
    fn expiry_is_judged_on_the_local_clock() {
        let mut t = ExpiryTracker::default();
        t.observe("s0", Some("b"), "10", 1_000);
        assert!(!t.is_free("s0", 6_000, LEASE), "5 s unchanged: still held");
        t.observe("s0", Some("b"), "11", 6_000);
        assert!(!t.is_free("s0", 11_500, LEASE), "renewed at 6 s: held until 12 s");
        assert!(t.is_free("s0", 12_001, LEASE), "unchanged for more than 6 s: expired");
        t.observe("s1", None, "3", 0);
        assert!(t.is_free("s1", 0, LEASE), "released: free at once");
        assert!(t.is_free("never-seen", 0, LEASE));
    }

    fn members(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn fair_shares_add_up_and_differ_by_at_most_one() {
        let three = members(&["a", "b", "c"]);
        assert_eq!(
            [fair_share("a", 32, &three), fair_share("b", 32, &three), fair_share("c", 32, &three)],
            [11, 11, 10]
        );
        let five = members(&["a", "b", "c", "d", "e"]);
        let shares: Vec<usize> = ["a", "b", "c", "d", "e"].iter().map(|r| fair_share(r, 32, &five)).collect();
        assert_eq!(shares, vec![7, 7, 6, 6, 6]);
        assert_eq!(fair_share("solo", 32, &BTreeSet::new()), 32, "a replica counts itself");
    }

    #[test]
    fn takes_up_to_fair_share_and_hands_back_surplus() {
        let all: BTreeSet<u32> = (0..32).collect();
        let none = BTreeSet::new();
        let p = plan("a", 32, &members(&["a", "b", "c"]), &none, &all);
        assert_eq!(p.acquire.len(), 11);
        assert!(p.release.is_empty());
        let held: BTreeSet<u32> = (0..16).collect();
        let p = plan("a", 32, &members(&["a", "b", "c", "d"]), &held, &none);
        assert_eq!((p.acquire.len(), p.release.len()), (0, 8));
        assert!(p.release.iter().all(|s| held.contains(s)));
    }

    /// Simulates replicas taking turns with the planner over shared Leases: they always end
    /// with every shard held exactly once and shares within one of each other.
    fn converge(replicas: &[String], shards: u32, mut owner: Vec<Option<usize>>) -> Vec<Option<usize>> {
        for _round in 0..20 {
            for (i, r) in replicas.iter().enumerate() {
                let held: BTreeSet<u32> = (0..shards).filter(|s| owner[*s as usize] == Some(i)).collect();
                let free: BTreeSet<u32> = (0..shards).filter(|s| owner[*s as usize].is_none()).collect();
                let live: BTreeSet<String> = replicas.iter().cloned().collect();
                let p = plan(r, shards, &live, &held, &free);
                for s in p.release {
                    owner[s as usize] = None;
                }
                for s in p.acquire {
                    if owner[s as usize].is_none() {
                        owner[s as usize] = Some(i);
                    }
                }
            }
        }
        owner
    }

    proptest! {
        #[test]
        fn replicas_converge_to_a_balanced_exclusive_split(n in 1usize..7, shards in 1u32..80, joiner in any::<bool>()) {
            let replicas: Vec<String> = (0..n).map(|i| format!("flotilla-{i}")).collect();
            let mut owner = converge(&replicas, shards, vec![None; shards as usize]);
            let mut all = replicas.clone();
            if joiner {
                all.push("flotilla-new".into());
                owner = converge(&all, shards, owner);
            }
            prop_assert!(owner.iter().all(Option::is_some), "every shard held");
            let counts: Vec<usize> = (0..all.len()).map(|i| owner.iter().filter(|o| **o == Some(i)).count()).collect();
            let (min, max) = (counts.iter().min().copied().unwrap_or(0), counts.iter().max().copied().unwrap_or(0));
            prop_assert!(max - min <= 1, "counts {counts:?}");
        }
    }
}
