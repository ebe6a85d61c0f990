//! Turns of one namespace's reconciles: at most a few at once, taken first come, first
//! served.
//!
//! kube-runtime can bound a controller's reconciles in flight itself, but the messages it
//! holds back meanwhile wait in a hash set and are taken in its iteration order: Apps that
//! come due again and again (an analysis every second against a Prometheus that hangs) took
//! every free turn ahead of an App placed late in that order, whose change then waited for
//! good (`bench/analysis_isolation.sh` saw 30 of 200 Apps unreconciled after 7 minutes). So
//! the controller runs every reconcile that is due, and each takes its namespace's turn here
//! first, in the order they asked (tokio's semaphore is fair), so that a reconcile waits for
//! at most the reconciles that were waiting before it.

use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A namespace's turns (none: no bound). Clones share them.
#[derive(Clone, Debug, Default)]
pub struct NamespaceTurns(Option<Arc<Semaphore>>);

impl NamespaceTurns {
    /// `per_namespace` turns; 0 is no bound.
    pub fn new(per_namespace: u16) -> Self {
        Self((per_namespace > 0).then(|| Arc::new(Semaphore::new(per_namespace.into()))))
    }

    /// Waits for a turn, held until the permit is dropped (`None`: no bound).
    pub async fn take(&self) -> Option<OwnedSemaphorePermit> {
        match &self.0 {
            // Never closed: a closed semaphore would only mean no bound.
            Some(turns) => turns.clone().acquire_owned().await.ok(),
            None => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn turns_go_in_the_order_they_were_asked_for() {
        let turns = NamespaceTurns::new(1);
        let first = turns.take().await;
        assert!(first.is_some());
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let waiting: Vec<_> = (0..5)
            .map(|i| {
                let (turns, order) = (turns.clone(), order.clone());
                let task = tokio::spawn(async move {
                    let _turn = turns.take().await;
                    order.lock().expect("order").push(i);
                });
                task
            })
            .collect();
        // Each asks before the next is spawned and the turn is given back.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        drop(first);
        for task in waiting {
            task.await.expect("task");
        }
        assert_eq!(*order.lock().expect("order"), [0, 1, 2, 3, 4]);
        assert!(NamespaceTurns::new(0).take().await.is_none(), "0: no bound");
    }
}
