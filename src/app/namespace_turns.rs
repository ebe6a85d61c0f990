//! Turns of one namespace's reconciles: at most a few at once, given first come, first
//! served.
//!
//! kube-runtime bounds a controller's reconciles in flight itself, but the messages it holds
//! back meanwhile wait in a hash set and are taken in its iteration order: Apps that came due
//! again and again (an analysis every second against a Prometheus that hangs, each run
//! holding its reconcile up to 30 s) took every free place ahead of an App placed late in
//! that order, whose change then waited for good (`bench/analysis_isolation.sh` saw 30 of
//! 200 Apps unreconciled after 7 minutes). Waiting in a fair queue instead, with every
//! reconcile in flight, kept a replica at 60 MiB at a third of 10,000 Apps against 55
//! (`bench/replica_memory.sh 333 3333`); this line keeps 57 (59 while an App in line asked
//! kube-runtime to retry it and was woken through a channel).
//!
//! So the turns are given here, in order, and nobody waits in flight: kube-runtime lets in
//! `QUICK_LANES` more reconciles than there are turns (`app::controller::controller_config`),
//! a reconcile that finds no turn for it joins the namespace's line and ends at once, asking
//! kube-runtime for nothing more, and the App first in line is reconciled again as soon as a
//! turn is free for it (`NamespaceTurns::woken`, a stream the controller reconciles on). A
//! free turn is kept for the Apps first in line: an App that comes later, or again, goes
//! behind them. An App deleted while in line leaves it when its turn would come (the
//! namespace's Apps are looked up then), and the whole line is swept of deleted Apps each
//! time it doubles, so it holds at most about twice the Apps that exist; an emptied line
//! gives back its room. An App woken that has not come within `WOKEN_WAIT` is woken again,
//! keeping its place. The replica counts the Apps in its lines
//! (`flotilla_apps_waiting_for_turn`).
//!
//! What an App in line costs is its place (a name), and nothing in kube-runtime: no
//! scheduled retry (their map and delay queue keep the room of their largest burst for as
//! long as the controller runs), no channel. The wakes are made by the stream when it is
//! polled, from the line itself.

use futures::StreamExt;
use futures::stream::BoxStream;
use prometheus::IntGauge;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// Places kube-runtime lets in beyond the turns, for reconciles that find no turn and end at
/// once: with every turn held for long, the Apps it holds back still get in quickly to join
/// the line.
pub const QUICK_LANES: u16 = 2;

/// How long an App woken for a turn has to come before it is woken again.
pub const WOKEN_WAIT: Duration = Duration::from_secs(5);

/// Whether an App of the namespace exists (in the controller's cache), by name.
pub type Exists = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// A namespace's turns (none: no bound). Clones share them.
#[derive(Clone, Debug, Default)]
pub struct NamespaceTurns(Option<Arc<Inner>>);

struct Inner {
    turns: usize,
    line: Mutex<Line>,
    /// The replica's count of Apps in line (`flotilla_apps_waiting_for_turn`).
    waiting: IntGauge,
    /// Told when an App in line may have a turn free for it (`NamespaceTurns::woken`).
    changed: Notify,
    exists: Exists,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inner").field("turns", &self.turns).field("line", &self.line).finish_non_exhaustive()
    }
}

#[derive(Debug, Default)]
struct Line {
    held: usize,
    waiting: VecDeque<Waiter>,
    /// The line's length after its last sweep of deleted Apps.
    swept_at: usize,
    /// The line's length as counted in the replica's gauge.
    counted: usize,
}

impl Line {
    /// After the line changed: counts its length in the replica's gauge and, once it is
    /// empty, gives back its room and forgets its last sweep (the next burst is swept by its
    /// own length).
    fn settle(&mut self, waiting: &IntGauge) {
        let length = self.waiting.len();
        if length != self.counted {
            waiting.add(i64::try_from(length).unwrap_or(i64::MAX) - i64::try_from(self.counted).unwrap_or(i64::MAX));
            self.counted = length;
        }
        if self.waiting.is_empty() {
            self.waiting = VecDeque::new();
            self.swept_at = 0;
        }
    }
}

impl Drop for Inner {
    /// A namespace no longer served: its Apps in line are no longer waiting here.
    fn drop(&mut self) {
        let line = self.line.get_mut().unwrap_or_else(|p| p.into_inner());
        self.waiting.sub(i64::try_from(line.counted).unwrap_or(i64::MAX));
    }
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
    /// In line: end now, asking for nothing; the App is reconciled again when a turn is free
    /// for it.
    InLine,
}

/// A turn of a namespace; given back when dropped.
#[derive(Debug)]
pub struct Turn(Arc<Inner>);

impl Drop for Turn {
    fn drop(&mut self) {
        let mut line = self.0.line.lock().unwrap_or_else(|p| p.into_inner());
        line.held = line.held.saturating_sub(1);
        self.0.tell_if_kept(&line);
    }
}

/// Who to wake now, if anyone, and else when to look again.
#[derive(Debug, PartialEq)]
enum Wake {
    Now(String),
    /// A woken App that has not come is to be woken again then.
    At(Instant),
    Nobody,
}

impl Inner {
    /// Tells the wake stream when a free turn is kept for some App in line.
    fn tell_if_kept(&self, line: &Line) {
        if line.held < self.turns && !line.waiting.is_empty() {
            self.changed.notify_one();
        }
    }

    /// The next App a free turn is kept for to wake (one not woken yet, or woken
    /// `WOKEN_WAIT` ago and not come), marked woken; the Apps deleted since they joined leave
    /// the places a free turn is kept for first.
    fn next_wake(&self, now: Instant) -> Wake {
        let mut line = self.line.lock().unwrap_or_else(|p| p.into_inner());
        self.drop_deleted_first(&mut line);
        let free = self.turns.saturating_sub(line.held);
        let mut again: Option<Instant> = None;
        for waiter in line.waiting.iter_mut().take(free) {
            match waiter.woken {
                Some(t) if now < t + WOKEN_WAIT => {
                    again = Some(again.map_or(t + WOKEN_WAIT, |a| a.min(t + WOKEN_WAIT)))
                }
                _ => {
                    waiter.woken = Some(now);
                    return Wake::Now(waiter.name.clone());
                }
            }
        }
        again.map_or(Wake::Nobody, Wake::At)
    }

    /// Drops the Apps deleted since they joined from the places a free turn is kept for.
    fn drop_deleted_first(&self, line: &mut Line) {
        let free = self.turns.saturating_sub(line.held);
        let mut i = 0;
        while i < free && i < line.waiting.len() {
            if (self.exists)(&line.waiting[i].name) {
                i += 1;
            } else {
                line.waiting.remove(i);
            }
        }
        line.settle(&self.waiting);
    }

    /// Drops every deleted App from the line once it has doubled since the last sweep (the
    /// caller settles the line after): the line holds about the Apps that exist, whatever a
    /// tenant creates and deletes.
    fn sweep(&self, line: &mut Line) {
        if line.waiting.len() >= 2 * line.swept_at.max(8) {
            line.waiting.retain(|w| (self.exists)(&w.name));
            line.swept_at = line.waiting.len();
        }
    }
}

impl NamespaceTurns {
    /// `turns` turns (0: no bound); the Apps in line are counted in `waiting`.
    pub fn new(turns: u16, exists: Exists, waiting: IntGauge) -> Self {
        Self((turns > 0).then(|| {
            Arc::new(Inner { turns: turns.into(), line: Mutex::default(), waiting, changed: Notify::new(), exists })
        }))
    }

    /// A turn for the App `name` if one is free for it: none is while Apps that asked before
    /// it wait. Else it joins the line (once) and is woken when one is.
    pub fn take(&self, name: &str) -> Taken {
        let Some(inner) = &self.0 else {
            return Taken::Unbounded;
        };
        let mut line = inner.line.lock().unwrap_or_else(|p| p.into_inner());
        // Turns kept for Apps deleted since go to the next in line.
        inner.drop_deleted_first(&mut line);
        let free = inner.turns.saturating_sub(line.held);
        let at = line.waiting.iter().position(|w| w.name == name);
        let its_turn = match at {
            Some(i) => i < free,
            None => line.waiting.len() < free,
        };
        if its_turn {
            if let Some(i) = at {
                line.waiting.remove(i);
                line.settle(&inner.waiting);
            }
            line.held += 1;
            inner.tell_if_kept(&line);
            return Taken::Turn(Turn(inner.clone()));
        }
        if at.is_none() {
            line.waiting.push_back(Waiter { name: name.to_string(), woken: None });
            inner.sweep(&mut line);
            line.settle(&inner.waiting);
        }
        inner.tell_if_kept(&line);
        Taken::InLine
    }

    /// The names of the Apps a turn is free for, each as its turn comes (and again every
    /// `WOKEN_WAIT` until it comes), for the controller to reconcile them. Made from the line
    /// while polled; never ends. Nothing without a bound.
    pub fn woken(&self) -> BoxStream<'static, String> {
        let Some(inner) = self.0.clone() else {
            return futures::stream::pending().boxed();
        };
        futures::stream::unfold(inner, |inner| async move {
            loop {
                // A change told while nobody waits is kept for the next wait (`notify_one`
                // leaves a permit): none is missed between the look and the wait.
                match inner.next_wake(Instant::now()) {
                    Wake::Now(name) => return Some((name, inner)),
                    Wake::At(at) => {
                        tokio::select! {
                            _ = inner.changed.notified() => {}
                            _ = tokio::time::sleep_until(at) => {}
                        }
                    }
                    Wake::Nobody => inner.changed.notified().await,
                }
            }
        })
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;
    use std::collections::HashSet;

    fn turn(taken: Taken) -> Turn {
        match taken {
            Taken::Turn(t) => t,
            other => panic!("no turn: {other:?}"),
        }
    }

    fn in_line(taken: &Taken) -> bool {
        matches!(taken, Taken::InLine)
    }

    /// The namespace's Apps, which a test can delete.
    fn apps() -> (Arc<Mutex<Option<HashSet<String>>>>, Exists) {
        let deleted: Arc<Mutex<Option<HashSet<String>>>> = Arc::default();
        let d = deleted.clone();
        let exists: Exists =
            Arc::new(move |name| !d.lock().expect("deleted").as_ref().is_some_and(|set| set.contains(name)));
        (deleted, exists)
    }

    fn delete(deleted: &Mutex<Option<HashSet<String>>>, name: &str) {
        deleted.lock().expect("deleted").get_or_insert_default().insert(name.to_string());
    }

    fn gauge() -> IntGauge {
        IntGauge::new("waiting", "Apps in line").expect("a gauge")
    }

    /// The Apps the wake stream gives now, without waiting.
    fn woken(stream: &mut BoxStream<'static, String>) -> Vec<String> {
        std::iter::from_fn(|| stream.next().now_or_never().flatten()).collect()
    }

    /// Turns go in the order asked: a free turn is kept for the first in line, who is woken;
    /// an App that asks later (or again) goes behind.
    #[tokio::test(start_paused = true)]
    async fn turns_go_in_the_order_they_were_asked_for() {
        let turns = NamespaceTurns::new(2, apps().1, gauge());
        let mut wakes = turns.woken();
        let a = turn(turns.take("a"));
        let b = turn(turns.take("b"));
        for name in ["c", "d", "e"] {
            assert!(in_line(&turns.take(name)), "{name}");
        }
        assert!(in_line(&turns.take("c")), "asking again keeps its place, no more");
        assert!(woken(&mut wakes).is_empty(), "no turn is free");
        drop(a);
        assert_eq!(woken(&mut wakes), ["c"], "the first in line is woken");
        assert!(in_line(&turns.take("e")), "the free turn is kept for c");
        assert!(in_line(&turns.take("a")), "a goes behind those in line");
        let c = turn(turns.take("c"));
        drop(b);
        assert_eq!(woken(&mut wakes), ["d"]);
        let d = turn(turns.take("d"));
        drop((c, d));
        assert_eq!(woken(&mut wakes), ["e", "a"]);
        let (_e, _a) = (turn(turns.take("e")), turn(turns.take("a")));
        assert!(in_line(&turns.take("f")));
        assert!(woken(&mut wakes).is_empty(), "nobody woken twice, nor for its own turn");
    }

    /// An App deleted while in line does not keep a turn: the next in line is woken instead.
    #[tokio::test(start_paused = true)]
    async fn a_deleted_app_leaves_the_line() {
        let (deleted, exists) = apps();
        let turns = NamespaceTurns::new(1, exists, gauge());
        let mut wakes = turns.woken();
        let a = turn(turns.take("a"));
        assert!(in_line(&turns.take("gone")));
        assert!(in_line(&turns.take("b")));
        delete(&deleted, "gone");
        drop(a);
        assert_eq!(woken(&mut wakes), ["b"]);
        let _b = turn(turns.take("b"));
    }

    /// An App woken that has not come after `WOKEN_WAIT` is woken again and keeps its place,
    /// though nothing else happens in the namespace: an App in line asks kube-runtime for no
    /// retry of its own, so this is what makes sure it comes.
    #[tokio::test(start_paused = true)]
    async fn a_woken_app_that_has_not_come_is_woken_again() {
        let turns = NamespaceTurns::new(1, apps().1, gauge());
        let mut wakes = turns.woken();
        let a = turn(turns.take("a"));
        assert!(in_line(&turns.take("late")));
        assert!(in_line(&turns.take("b")));
        drop(a);
        assert_eq!(woken(&mut wakes), ["late"]);
        assert!(in_line(&turns.take("b")), "the turn is kept for late");
        assert!(woken(&mut wakes).is_empty());
        let started = Instant::now();
        let again = tokio::time::timeout(2 * WOKEN_WAIT, wakes.next()).await.expect("woken again in time");
        assert_eq!(again.as_deref(), Some("late"), "woken again");
        assert_eq!(started.elapsed(), WOKEN_WAIT, "after WOKEN_WAIT");
        assert!(in_line(&turns.take("b")), "still kept for late");
        let _late = turn(turns.take("late"));
        assert!(woken(&mut wakes).is_empty());
    }

    /// Apps created and deleted while every turn is held leave the line each time it doubles:
    /// it holds about the Apps that exist.
    #[tokio::test(start_paused = true)]
    async fn the_line_is_swept_of_deleted_apps() {
        let (deleted, exists) = apps();
        let turns = NamespaceTurns::new(1, exists, gauge());
        let _held = turn(turns.take("busy"));
        for i in 0..1000 {
            let name = format!("churn-{i}");
            assert!(in_line(&turns.take(&name)));
            delete(&deleted, &name);
        }
        assert!(in_line(&turns.take("real")));
        let Some(inner) = &turns.0 else { panic!("bounded") };
        let length = inner.line.lock().expect("line").waiting.len();
        assert!(length <= 16, "{length} in line, one of them real");
    }

    /// A line emptied gives back its room and its last sweep's length: the Apps that once
    /// waited in a burst cost nothing at rest.
    #[tokio::test(start_paused = true)]
    async fn an_emptied_line_gives_its_room_back() {
        let turns = NamespaceTurns::new(1, apps().1, gauge());
        let held = turn(turns.take("busy"));
        for i in 0..100 {
            assert!(in_line(&turns.take(&format!("app-{i}"))));
        }
        drop(held);
        for i in 0..100 {
            drop(turn(turns.take(&format!("app-{i}"))));
        }
        let Some(inner) = &turns.0 else { panic!("bounded") };
        let line = inner.line.lock().expect("line");
        assert_eq!((line.waiting.capacity(), line.swept_at), (0, 0));
    }

    /// The replica's gauge counts the Apps in every line, as they join and leave it, and
    /// those of a namespace no longer served leave it.
    #[tokio::test(start_paused = true)]
    async fn the_apps_in_line_are_counted() {
        let waiting = gauge();
        let (deleted, exists) = apps();
        let turns = NamespaceTurns::new(1, exists, waiting.clone());
        let other = NamespaceTurns::new(1, apps().1, waiting.clone());
        let other_wakes = other.woken();
        let held = turn(turns.take("busy"));
        let other_held = turn(other.take("busy"));
        for name in ["a", "b", "gone"] {
            assert!(in_line(&turns.take(name)));
        }
        assert!(in_line(&other.take("x")));
        assert!(in_line(&turns.take("a")), "asking again");
        assert_eq!(waiting.get(), 4);
        delete(&deleted, "a");
        drop(held);
        let b = turn(turns.take("b"));
        assert_eq!(waiting.get(), 2, "a, deleted, left the line when its turn came, and b took it");
        drop(b);
        delete(&deleted, "gone");
        let _c = turn(turns.take("c"));
        assert_eq!(waiting.get(), 1, "gone left the line; c never joined it");
        drop((other, other_held, other_wakes));
        assert_eq!(waiting.get(), 0, "a namespace no longer served");
    }

    #[tokio::test]
    async fn no_bound() {
        let turns = NamespaceTurns::new(0, apps().1, gauge());
        assert!(matches!(turns.take("a"), Taken::Unbounded));
        assert!(woken(&mut turns.woken()).is_empty());
    }
}
