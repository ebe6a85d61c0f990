//! Turns of one namespace's reconciles: at most a few at once, given first come, first
//! served.
//!
//! kube-runtime bounds a controller's reconciles in flight itself, but the messages it holds
//! back meanwhile wait in a hash set and are taken in its iteration order: Apps that came due
//! again and again (an analysis every second against a Prometheus that hangs, each run
//! holding its reconcile up to 30 s) took every free place ahead of an App placed late in
//! that order, whose change then waited for good (`bench/analysis_isolation.sh` saw 30 of
//! 200 Apps unreconciled after 7 minutes). Waiting in a fair queue instead, with every
//! reconcile in flight, cost a replica 5 MiB at a third of 10,000 Apps
//! (`bench/replica_memory.sh 333 3333`: 60 MiB at rest against 55).
//!
//! So the turns are given here, in order, and nobody waits in flight: kube-runtime lets in
//! `QUICK_LANES` more reconciles than there are turns (`app::controller::controller_config`),
//! a reconcile that finds no turn for it joins the namespace's line and ends at once, and
//! the App first in line is reconciled again as soon as a turn is free for it (the wake
//! stream, which the controller reconciles on). A free turn is kept for the Apps first in
//! line: an App that comes later, or again, goes behind them. An App woken that does not
//! come within `WOKEN_WAIT` (deleted meanwhile) leaves the line.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Places kube-runtime lets in beyond the turns, for reconciles that find no turn and end at
/// once: with every turn held for long, the Apps it holds back still get in quickly to join
/// the line.
pub const QUICK_LANES: u16 = 2;

/// How long a turn is kept for an App woken for it.
pub const WOKEN_WAIT: Duration = Duration::from_secs(5);

/// When an App that joined the line is looked at again if it was never woken (the wake is the
/// way it is meant to come back).
pub const LOOK_AGAIN: Duration = Duration::from_secs(60);

/// A namespace's turns (none: no bound). Clones share them.
#[derive(Clone, Debug, Default)]
pub struct NamespaceTurns(Option<Arc<Inner>>);

#[derive(Debug)]
struct Inner {
    turns: usize,
    line: Mutex<Line>,
    /// The names of Apps a turn is free for.
    wake: mpsc::UnboundedSender<String>,
}

#[derive(Debug, Default)]
struct Line {
    held: usize,
    waiting: VecDeque<Waiter>,
}

#[derive(Debug)]
struct Waiter {
    name: String,
    /// When it was told a turn is free for it.
    woken: Option<Instant>,
}

/// What a reconcile gets.
#[derive(Debug)]
pub enum Taken {
    /// No bound.
    Unbounded,
    /// A turn, held until dropped.
    Turn(Turn),
    /// In line: end now, the App is reconciled again when a turn is free for it.
    InLine,
}

/// A turn of a namespace; given back when dropped.
#[derive(Debug)]
pub struct Turn(Arc<Inner>);

impl Drop for Turn {
    fn drop(&mut self) {
        let mut line = self.0.line.lock().unwrap_or_else(|p| p.into_inner());
        line.held = line.held.saturating_sub(1);
        self.0.wake_first(&mut line, Instant::now());
    }
}

impl Inner {
    /// Drops from the line the Apps a turn was kept for that did not come.
    fn prune(&self, line: &mut Line, now: Instant) {
        loop {
            let free = self.turns.saturating_sub(line.held);
            let gone = line.waiting.iter().take(free).position(|w| w.woken.is_some_and(|t| now >= t + WOKEN_WAIT));
            match gone {
                Some(i) => {
                    line.waiting.remove(i);
                }
                None => break,
            }
        }
    }

    /// Wakes the Apps first in line that a turn is free for.
    fn wake_first(&self, line: &mut Line, now: Instant) {
        self.prune(line, now);
        let free = self.turns.saturating_sub(line.held);
        for waiter in line.waiting.iter_mut().take(free).filter(|w| w.woken.is_none()) {
            waiter.woken = Some(now);
            // Nobody listens once the controller stopped: nothing to wake then.
            let _ = self.wake.send(waiter.name.clone());
        }
    }
}

impl NamespaceTurns {
    /// `turns` turns (0: no bound), and the names of the Apps to reconcile again because a
    /// turn is free for them.
    pub fn new(turns: u16) -> (Self, mpsc::UnboundedReceiver<String>) {
        let (wake, woken) = mpsc::unbounded_channel();
        let inner = (turns > 0).then(|| Arc::new(Inner { turns: turns.into(), line: Mutex::default(), wake }));
        (Self(inner), woken)
    }

    /// A turn for the App `name` if one is free for it: none is while Apps that asked before
    /// it wait. Else it joins the line (once) and is woken when one is.
    pub fn take(&self, name: &str) -> Taken {
        let Some(inner) = &self.0 else {
            return Taken::Unbounded;
        };
        let now = Instant::now();
        let mut line = inner.line.lock().unwrap_or_else(|p| p.into_inner());
        inner.prune(&mut line, now);
        let free = inner.turns.saturating_sub(line.held);
        let at = line.waiting.iter().position(|w| w.name == name);
        let its_turn = match at {
            Some(i) => i < free,
            None => line.waiting.len() < free,
        };
        if its_turn {
            if let Some(i) = at {
                line.waiting.remove(i);
            }
            line.held += 1;
            // Turns freed for Apps that left the line go to the next ones.
            inner.wake_first(&mut line, now);
            return Taken::Turn(Turn(inner.clone()));
        }
        if at.is_none() {
            line.waiting.push_back(Waiter { name: name.to_string(), woken: None });
        }
        inner.wake_first(&mut line, now);
        Taken::InLine
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn(taken: Taken) -> Turn {
        match taken {
            Taken::Turn(t) => t,
            other => panic!("no turn: {other:?}"),
        }
    }

    fn in_line(taken: &Taken) -> bool {
        matches!(taken, Taken::InLine)
    }

    /// Turns go in the order asked: a free turn is kept for the first in line, who is woken;
    /// an App that asks later (or again) goes behind.
    #[tokio::test(start_paused = true)]
    async fn turns_go_in_the_order_they_were_asked_for() {
        let (turns, mut woken) = NamespaceTurns::new(2);
        let a = turn(turns.take("a"));
        let b = turn(turns.take("b"));
        for name in ["c", "d", "e"] {
            assert!(in_line(&turns.take(name)), "{name}");
        }
        assert!(in_line(&turns.take("c")), "asking again keeps its place, no more");
        drop(a);
        assert_eq!(woken.try_recv().ok().as_deref(), Some("c"), "the first in line is woken");
        assert!(in_line(&turns.take("e")), "the free turn is kept for c");
        assert!(in_line(&turns.take("a")), "a goes behind those in line");
        let c = turn(turns.take("c"));
        drop(b);
        assert_eq!(woken.try_recv().ok().as_deref(), Some("d"));
        let d = turn(turns.take("d"));
        drop((c, d));
        let woke: Vec<_> = std::iter::from_fn(|| woken.try_recv().ok()).collect();
        assert_eq!(woke, ["e", "a"]);
        let (_e, _a) = (turn(turns.take("e")), turn(turns.take("a")));
        assert!(in_line(&turns.take("f")));
    }

    /// A turn kept for an App woken that does not come (deleted meanwhile) goes to the next
    /// in line after `WOKEN_WAIT`.
    #[tokio::test(start_paused = true)]
    async fn a_woken_app_that_does_not_come_leaves_the_line() {
        let (turns, mut woken) = NamespaceTurns::new(1);
        let a = turn(turns.take("a"));
        assert!(in_line(&turns.take("gone")));
        assert!(in_line(&turns.take("b")));
        drop(a);
        assert_eq!(woken.try_recv().ok().as_deref(), Some("gone"));
        assert!(in_line(&turns.take("b")), "kept for the one woken");
        tokio::time::advance(WOKEN_WAIT).await;
        let _b = turn(turns.take("b"));
        assert!(woken.try_recv().is_err(), "b came by itself");
        assert!(in_line(&turns.take("gone")), "back in line, at its end");
    }

    #[tokio::test]
    async fn no_bound() {
        let (turns, _) = NamespaceTurns::new(0);
        assert!(matches!(turns.take("a"), Taken::Unbounded));
    }
}
