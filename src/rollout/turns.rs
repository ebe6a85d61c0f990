//! Analysis turns: how many analysis runs a replica has in flight at once, and who goes
//! next. At most `per_replica` runs hold a turn, at most `per_tenant` of them of one tenant,
//! and a turn that comes free goes to the waiting tenant that has used the fewest
//! turn-seconds lately (the time its runs held turns, halved every `HALF_LIFE`, counting
//! the turns it holds now); the longest waiting among equals, a tenant's own runs in the
//! order they came.
//!
//! Tenants whose Prometheus hangs hold each turn until the query's timeout, so they use
//! turns a thousand times faster than a tenant whose Prometheus answers at once, and the
//! latter takes the first turn that comes free ahead of all of them. A queue in arrival
//! order would have let them take back every turn they gave up, and so would counting only
//! the turns held at the moment: a hanging tenant that just gave its one turn back holds as
//! few as a quiet one, and its next run has waited longer.
//!
//! Written here rather than taken from a crate: tokio's semaphore is first come, first
//! served, and no maintained crate keys a semaphore's waiters by tenant.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::time::Instant;

/// How quickly past use is forgotten: a turn-second counts half after this long.
const HALF_LIFE: Duration = Duration::from_secs(30);

/// Use below this (turn-seconds) with nothing held or waiting: the tenant is forgotten.
const FORGOTTEN: f64 = 0.001;

/// Which turns were all held when a run gave up waiting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Busy {
    /// The tenant's own (`per_tenant`).
    Tenant,
    /// The replica's (`per_replica`), held by runs of other tenants.
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
    /// Times are kept as seconds since this instant.
    epoch: Instant,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    free: usize,
    /// Arrival order of the waiting runs.
    next: u64,
    /// Tenants with a run in flight or waiting, or some recent use.
    tenants: HashMap<String, Line>,
}

/// One tenant's turns: held, used, and its runs waiting in the order they came.
#[derive(Debug, Default)]
struct Line {
    held: usize,
    /// The sum of the times the turns held were handed out.
    held_since: f64,
    /// Turn-seconds of the turns given back, halved every `HALF_LIFE`, as of `used_at`.
    used: f64,
    used_at: f64,
    waiting: VecDeque<(u64, oneshot::Sender<Turn>)>,
}

impl Line {
    /// Turn-seconds used lately, the turns held now included.
    fn usage(&self, now: f64) -> f64 {
        self.decayed(now) + self.held as f64 * now - self.held_since
    }

    fn decayed(&self, now: f64) -> f64 {
        self.used * 0.5f64.powf((now - self.used_at).max(0.0) / HALF_LIFE.as_secs_f64())
    }

    /// Drops the runs at the front that stopped waiting.
    fn skip_stopped(&mut self) {
        while self.waiting.front().is_some_and(|(_, tx)| tx.is_closed()) {
            self.waiting.pop_front();
        }
    }
}

/// A turn: given back, and handed to the next run, when dropped.
#[derive(Debug)]
pub struct Turn {
    /// `None` once given back (or never handed out).
    pool: Option<Arc<Pool>>,
    tenant: String,
    /// When it was handed out.
    since: f64,
}

impl Turns {
    pub fn new(per_replica: usize, per_tenant: usize) -> Self {
        let state = State { free: per_replica.max(1), ..State::default() };
        Self { pool: Arc::new(Pool { per_tenant: per_tenant.max(1), epoch: Instant::now(), state: Mutex::new(state) }) }
    }

    /// Waits until `deadline` for a turn of `tenant`. Cancel-safe: a run that stops waiting
    /// (or is dropped) holds nothing, and a turn handed to it meanwhile goes to the next.
    pub async fn take(&self, tenant: &str, deadline: Instant) -> Result<Turn, Busy> {
        let handed = {
            let mut state = self.pool.lock();
            let (tx, rx) = oneshot::channel();
            let order = state.next;
            state.next += 1;
            let line = state.tenants.entry(tenant.to_string()).or_default();
            // The tenant's runs that stopped waiting leave their place.
            line.waiting.retain(|(_, tx)| !tx.is_closed());
            line.waiting.push_back((order, tx));
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

    fn now(&self) -> f64 {
        self.epoch.elapsed().as_secs_f64()
    }

    /// Hands free turns to waiting runs: each to the first run of the tenant that has used
    /// the fewest turn-seconds lately, among tenants under their own limit.
    fn hand_out(self: &Arc<Self>, state: &mut State) {
        if state.free == 0 {
            return;
        }
        let now = self.now();
        state.tenants.retain(|_, line| {
            line.skip_stopped();
            line.held > 0 || !line.waiting.is_empty() || line.decayed(now) >= FORGOTTEN
        });
        while state.free > 0 {
            let next = state
                .tenants
                .iter()
                .filter(|(_, line)| line.held < self.per_tenant)
                .filter_map(|(tenant, line)| line.waiting.front().map(|(order, _)| (line.usage(now), *order, tenant)))
                .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)))
                .map(|(_, _, tenant)| tenant.clone());
            let Some(tenant) = next else { return };
            let Some(line) = state.tenants.get_mut(&tenant) else { return };
            let Some((_, tx)) = line.waiting.pop_front() else { return };
            line.held += 1;
            line.held_since += now;
            state.free -= 1;
            // Once sent, only the receiver can drop the turn (tokio's oneshot), so a turn is
            // never given back here, under the lock. A run that stopped waiting gets nothing.
            if let Err(mut unsent) = tx.send(Turn { pool: Some(self.clone()), tenant, since: now }) {
                unsent.pool = None;
                line.held -= 1;
                line.held_since -= now;
                state.free += 1;
            }
            line.skip_stopped();
        }
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let Some(pool) = self.pool.take() else { return };
        let now = pool.now();
        let mut state = pool.lock();
        if let Some(line) = state.tenants.get_mut(&self.tenant) {
            line.used = line.decayed(now) + (now - self.since).max(0.0);
            line.used_at = now;
            line.held = line.held.saturating_sub(1);
            line.held_since = if line.held == 0 { 0.0 } else { line.held_since - self.since };
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

    /// A run of `tenant` waiting for a turn, in a task of its own.
    fn waiting(turns: &Turns, tenant: &'static str) -> tokio::task::JoinHandle<Result<Turn, Busy>> {
        let turns = turns.clone();
        tokio::spawn(async move { turns.take(tenant, later()).await })
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
        let first = waiting(&turns, "hanging");
        tokio::time::sleep(Duration::from_millis(10)).await;
        let quiet = waiting(&turns, "quiet");
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

    /// A tenant whose run held a turn for a query's timeout, and gives it back holding none,
    /// does not take it back ahead of a tenant that used none, although its next run came
    /// first: counting the turns held at that moment alone would tie them.
    #[tokio::test(start_paused = true)]
    async fn a_free_turn_goes_to_the_tenant_that_used_the_fewest_lately() {
        let turns = Turns::new(1, 8);
        let hanging = turns.take("hanging", later()).await.expect("the only turn");
        let mut next = Vec::new();
        for _ in 0..2 {
            next.push(waiting(&turns, "hanging"));
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let quiet = waiting(&turns, "quiet");
        tokio::time::sleep(Duration::from_secs(10)).await;
        drop(hanging);
        let quiet = tokio::time::timeout(Duration::from_millis(100), quiet).await;
        let quiet = quiet.expect("in time").expect("joined").expect("the quiet tenant got the free turn");
        assert!(next.iter().all(|n| !n.is_finished()), "the hanging tenant's next runs still wait");
        drop(quiet);
        for n in next {
            let turn = tokio::time::timeout(Duration::from_millis(100), n).await;
            assert!(turn.is_ok_and(|t| t.is_ok_and(|t| t.is_ok())), "then they go, one after the other");
        }
    }

    /// Among tenants that used as little, the run that came first goes first; a tenant's own
    /// runs go in the order they came, after tenants that used less meanwhile.
    #[tokio::test(start_paused = true)]
    async fn equal_users_go_in_the_order_they_came() {
        let turns = Turns::new(1, 2);
        let held = turns.take("a", later()).await.expect("the only turn");
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut waiting = Vec::new();
        for (tenant, run) in [("b", 1), ("b", 2), ("c", 1)] {
            let (turns, order) = (turns.clone(), order.clone());
            waiting.push(tokio::spawn(async move {
                let turn = turns.take(tenant, later()).await;
                assert!(turn.is_ok(), "{tenant}{run} got a turn");
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
        let stopped = waiting(&turns, "c");
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
        tokio::time::sleep(HALF_LIFE * 20).await;
        drop(turns.take("d", soon()).await);
        assert!(turns.pool.lock().tenants.is_empty(), "tenants with nothing in flight and no recent use are forgotten");
    }
}
