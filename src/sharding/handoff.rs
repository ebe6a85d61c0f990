//! Handing shards back: each shard's Lease is released as soon as that shard's work has
//! stopped, not when the last of them has. At shutdown a replica stops the work of every shard
//! it holds at once; a shard whose namespaces stop quickly goes to a peer at once instead of
//! waiting for the slowest namespace of all (the wait that made a SIGTERM handoff at 10,000
//! Apps take 5-6.5 s). A shard whose work has not stopped by the deadline is not released: a
//! request of it may still be on its way, so its Lease expires instead.

use futures::stream::{FuturesUnordered, StreamExt};
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::time::Duration;
use tokio::sync::watch;

/// Releases each of `shards` (with what `release` needs of it) once `working` no longer lists
/// it, at most `in_flight` at once, until all are released or `deadline` has passed. Returns
/// the shards left unreleased because their work was still running at the deadline.
pub async fn release_as_stopped<T, F, Fut>(
    working: &mut watch::Receiver<BTreeSet<u32>>,
    shards: Vec<(u32, T)>,
    deadline: Duration,
    in_flight: usize,
    release: F,
) -> Vec<u32>
where
    F: Fn(u32, T) -> Fut,
    Fut: Future<Output = ()>,
{
    let until = tokio::time::Instant::now() + deadline;
    let mut waiting: BTreeMap<u32, T> = shards.into_iter().collect();
    let mut ready: Vec<(u32, T)> = Vec::new();
    let mut releasing = FuturesUnordered::new();
    let mut expired = false;
    loop {
        if !expired {
            let stopped: Vec<u32> = {
                let w = working.borrow_and_update();
                waiting.keys().filter(|s| !w.contains(s)).copied().collect()
            };
            ready.extend(stopped.into_iter().filter_map(|s| waiting.remove(&s).map(|t| (s, t))));
        }
        while releasing.len() < in_flight.max(1) {
            let Some((shard, t)) = ready.pop() else { break };
            releasing.push(release(shard, t));
        }
        if releasing.is_empty() && (waiting.is_empty() || expired) {
            break;
        }
        tokio::select! {
            Some(()) = releasing.next(), if !releasing.is_empty() => {}
            changed = working.changed(), if !expired && !waiting.is_empty() => {
                // The supervisor is gone: nothing will report these shards stopped.
                if changed.is_err() {
                    expired = true;
                }
            }
            _ = tokio::time::sleep_until(until), if !expired && !waiting.is_empty() => expired = true,
        }
    }
    waiting.into_keys().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use tokio::time::Instant;

    /// How the supervisor reports: each second one more of these shards stopped (then it
    /// stays, reporting nothing more), or `None`: it is gone at once.
    type Stops = Option<&'static [u32]>;

    /// Runs `release_as_stopped` over shards 1..=3 with 1 and 2 working; returns when each
    /// shard was released (milliseconds since start, by shard) and what was left.
    async fn run(stops: Stops) -> (BTreeMap<u32, u128>, Vec<u32>) {
        let (tx, mut rx) = watch::channel(BTreeSet::from([1, 2]));
        let start = Instant::now();
        let log: Arc<Mutex<BTreeMap<u32, u128>>> = Arc::default();
        if let Some(stops) = stops {
            tokio::spawn(async move {
                for shard in stops {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    tx.send_modify(|w| {
                        w.remove(shard);
                    });
                }
                tokio::time::sleep(Duration::from_secs(60)).await;
            });
        } else {
            drop(tx);
        }
        let left = release_as_stopped(&mut rx, vec![(1, ()), (2, ()), (3, ())], Duration::from_secs(4), 4, |s, ()| {
            let log = log.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(10)).await;
                log.lock().expect("log").insert(s, start.elapsed().as_millis());
            }
        })
        .await;
        let released = log.lock().expect("log").clone();
        (released, left)
    }

    #[tokio::test(start_paused = true)]
    async fn each_shard_goes_when_its_own_work_stops() {
        let (released, left) = run(Some(&[1, 2])).await;
        assert!(left.is_empty());
        // Shard 3 had no work: released at once, not after shards 1 and 2 stopped.
        assert_eq!(released, BTreeMap::from([(3, 10), (1, 1010), (2, 2010)]));
    }

    #[tokio::test(start_paused = true)]
    async fn a_shard_still_working_at_the_deadline_is_left_to_expire() {
        let (released, left) = run(Some(&[1])).await;
        assert_eq!(left, vec![2]);
        assert_eq!(released, BTreeMap::from([(1, 1010), (3, 10)]));
    }

    #[tokio::test(start_paused = true)]
    async fn a_gone_supervisor_ends_the_wait() {
        let (released, left) = run(None).await;
        assert_eq!(left, vec![1, 2]);
        assert_eq!(released.len(), 1, "shard 3 still released: {released:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn no_more_than_in_flight_at_once() {
        let (tx, mut rx) = watch::channel(BTreeSet::new());
        let busy = Arc::new(Mutex::new((0usize, 0usize)));
        let shards: Vec<(u32, ())> = (0..10).map(|s| (s, ())).collect();
        let left = release_as_stopped(&mut rx, shards, Duration::from_secs(4), 3, |_, ()| {
            let busy = busy.clone();
            async move {
                {
                    let mut b = busy.lock().expect("busy");
                    b.0 += 1;
                    b.1 = b.1.max(b.0);
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
                busy.lock().expect("busy").0 -= 1;
            }
        })
        .await;
        drop(tx);
        assert!(left.is_empty());
        assert_eq!(busy.lock().expect("busy").1, 3);
    }
}
