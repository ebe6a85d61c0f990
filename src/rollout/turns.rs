//! Analysis turns: how many analysis runs a replica has in flight at once, and who goes
//! next. At most `per_replica` runs hold a turn, at most `per_tenant` of them of one tenant,
//! and a turn that comes free goes to the waiting tenant that holds the fewest (the longest
//! waiting among equals; a tenant's own runs in the order they came).
//!
//! Tenants whose Prometheus hangs hold their turns until each query's timeout. With a queue
//! in arrival order, their next runs would wait among everyone else's and take the turns
//! back as they came free, so a handful of such tenants could keep the others waiting for
//! rounds of timeouts. Here a tenant with no run in flight takes the first turn that comes
//! free, ahead of the runs of tenants that already hold some.
//!
//! Written here rather than taken from a crate: tokio's semaphore is first come, first
//! served, and no maintained crate keys a semaphore's waiters by tenant.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::oneshot;
use tokio::time::Instant;

/// Which turns were all held when a run gave up waiting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Busy {
    /// The tenant's own (`per_tenant`).
    Tenant,
    /// The replica's (`per_replica`), held by runs of tenants that hold no more than this one.
    Replica,
}

/// The replica's turns. Clones share them.
#[derive(Clone, Debug)]
pub struct Turns {
    pool: Arc<Pool>,
}

#[derive(Debug)]
struct Pool {
    per_tenant: usize,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    free: usize,
    /// Arrival order of the waiting runs.
    next: u64,
    /// Tenants with a run in flight or waiting; others are forgotten.
    tenants: HashMap<String, Line>,
}

/// One tenant's turns held, and its runs waiting in the order they came.
#[derive(Debug, Default)]
struct Line {
    held: usize,
    waiting: VecDeque<(u64, oneshot::Sender<Turn>)>,
}

/// A turn: given back, and handed to the next run, when dropped.
#[derive(Debug)]
pub struct Turn {
    /// `None` once given back (or never handed out).
    pool: Option<Arc<Pool>>,
    tenant: String,
}

impl Turns {
    pub fn new(per_replica: usize, per_tenant: usize) -> Self {
        let state = State { free: per_replica.max(1), ..State::default() };
        Self { pool: Arc::new(Pool { per_tenant: per_tenant.max(1), state: Mutex::new(state) }) }
    }

    /// Waits until `deadline` for a turn of `tenant`. Cancel-safe: a run that stops waiting
    /// (or is dropped) holds nothing, and a turn handed to it meanwhile goes to the next.
    pub async fn take(&self, tenant: &str, deadline: Instant) -> Result<Turn, Busy> {
        let handed = {
            let mut state = self.pool.lock();
            let (tx, rx) = oneshot::channel();
            let order = state.next;
            state.next += 1;
            state.tenants.entry(tenant.to_string()).or_default().waiting.push_back((order, tx));
            self.pool.hand_out(&mut state);
            rx
        };
        match tokio::time::timeout_at(deadline, handed).await {
            Ok(Ok(turn)) => Ok(turn),
            // The sender was dropped unsent: never done while the pool lives.
            Ok(Err(_)) => Err(Busy::Replica),
            Err(_) => {
                let state = self.pool.lock();
                let held = state.tenants.get(tenant).map_or(0, |line| line.held);
                Err(if held >= self.pool.per_tenant { Busy::Tenant } else { Busy::Replica })
            }
        }
    }

    /// Turns not held.
    #[cfg(test)]
    pub fn free(&self) -> usize {
        self.pool.lock().free
    }
}

impl Pool {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Hands free turns to waiting runs: each to the first run of the tenant that holds the
    /// fewest, among tenants under their own limit.
    fn hand_out(self: &Arc<Self>, state: &mut State) {
        // Runs that stopped waiting leave their place; tenants with nothing left are forgotten.
        state.tenants.retain(|_, line| {
            line.waiting.retain(|(_, tx)| !tx.is_closed());
            line.held > 0 || !line.waiting.is_empty()
        });
        while state.free > 0 {
            let next = state
                .tenants
                .iter()
                .filter(|(_, line)| line.held < self.per_tenant)
                .filter_map(|(tenant, line)| line.waiting.front().map(|(order, _)| ((line.held, *order), tenant)))
                .min()
                .map(|(_, tenant)| tenant.clone());
            let Some(tenant) = next else { return };
            let Some(line) = state.tenants.get_mut(&tenant) else { return };
            let Some((_, tx)) = line.waiting.pop_front() else { return };
            line.held += 1;
            state.free -= 1;
            // Once sent, only the receiver can drop the turn (tokio's oneshot), so a turn is
            // never given back here, under the lock. A run that stopped waiting gets nothing.
            if let Err(mut unsent) = tx.send(Turn { pool: Some(self.clone()), tenant }) {
                unsent.pool = None;
                line.held -= 1;
                state.free += 1;
            }
        }
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let Some(pool) = self.pool.take() else { return };
        let mut state = pool.lock();
        if let Some(line) = state.tenants.get_mut(&self.tenant) {
            line.held = line.held.saturating_sub(1);
        }
        state.free += 1;
        pool.hand_out(&mut state);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn soon() -> Instant {
        Instant::now() + Duration::from_millis(100)
    }

    fn later() -> Instant {
        Instant::now() + Duration::from_secs(3600)
    }

    /// A tenant that used up its turns (its Prometheus hangs) leaves the others theirs.
    #[tokio::test]
    async fn one_tenant_cannot_take_another_tenants_turns() {
        let turns = Turns::new(4, 2);
        let held = [turns.take("greedy", soon()).await, turns.take("greedy", soon()).await];
        assert!(held.iter().all(Result::is_ok));
        assert_eq!(
            turns.take("greedy", soon()).await.err(),
            Some(Busy::Tenant),
            "a third run of the same tenant waits"
        );
        assert!(turns.take("quiet", soon()).await.is_ok(), "another tenant gets a turn at once");
    }

    /// With every turn held, the next that comes free goes to the tenant that holds none,
    /// although another tenant's run has waited longer: first come, first served would let
    /// tenants whose runs hang take back every turn they give up.
    #[tokio::test(start_paused = true)]
    async fn a_free_turn_goes_to_the_tenant_that_holds_the_fewest() {
        let turns = Turns::new(3, 3);
        let hanging = [turns.take("hanging", later()).await, turns.take("hanging", later()).await];
        let other = turns.take("other", later()).await.expect("the last free turn");
        assert_eq!(turns.free(), 0);
        let first = tokio::spawn({
            let turns = turns.clone();
            async move { turns.take("hanging", later()).await }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        let quiet = tokio::spawn({
            let turns = turns.clone();
            async move { turns.take("quiet", later()).await }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        drop(other);
        let quiet = tokio::time::timeout(Duration::from_millis(100), quiet).await;
        let quiet = quiet.expect("in time").expect("joined").expect("the tenant holding none got the free turn");
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!first.is_finished(), "the run of the tenant holding two still waits");
        drop(hanging);
        let first = tokio::time::timeout(Duration::from_millis(100), first).await;
        assert!(first.is_ok_and(|t| t.is_ok_and(|t| t.is_ok())), "and gets the next");
        drop(quiet);
    }

    /// Equal holders are served in the order their runs came, and one tenant's runs too.
    #[tokio::test(start_paused = true)]
    async fn equal_holders_go_in_the_order_they_came() {
        let turns = Turns::new(1, 2);
        let held = turns.take("a", later()).await.expect("the only turn");
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut waiting = Vec::new();
        for (tenant, run) in [("b", 1), ("c", 1), ("b", 2)] {
            let (turns, order) = (turns.clone(), order.clone());
            waiting.push(tokio::spawn(async move {
                let turn = turns.take(tenant, later()).await;
                order.lock().expect("order").push(format!("{tenant}{run}"));
                tokio::time::sleep(Duration::from_millis(5)).await;
                drop(turn);
            }));
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        drop(held);
        for w in waiting {
            w.await.expect("run");
        }
        assert_eq!(*order.lock().expect("order"), ["b1", "c1", "b2"]);
    }

    /// A run that stops waiting holds nothing: its place is skipped, and a turn handed to it
    /// just before it stopped goes back.
    #[tokio::test(start_paused = true)]
    async fn a_run_that_stops_waiting_holds_nothing() {
        let turns = Turns::new(1, 1);
        let held = turns.take("a", later()).await.expect("the only turn");
        assert_eq!(turns.take("b", soon()).await.err(), Some(Busy::Replica));
        let stopped = tokio::spawn({
            let turns = turns.clone();
            async move { turns.take("c", later()).await }
        });
        tokio::time::sleep(Duration::from_millis(1)).await;
        // Handed to "c" (skipping "b", which stopped), which stops before it runs again.
        drop(held);
        assert_eq!(turns.free(), 0, "handed to the waiting run");
        stopped.abort();
        assert!(stopped.await.is_err(), "stopped");
        assert_eq!(turns.free(), 1, "given back");
        let again = turns.take("b", soon()).await.expect("the turn");
        assert_eq!(turns.free(), 0);
        drop(again);
        assert_eq!(turns.free(), 1);
        assert!(turns.pool.lock().tenants.is_empty(), "tenants with nothing in flight are forgotten");
    }
}
