//! What a namespace's reconciles remember of each App for a while: its consecutive failures,
//! the status written until the cache shows it, the Service applied until the cache shows it.
//!
//! Each memo is of use for a bounded time (`keep_for`) and is forgotten by the App's next
//! reconcile; but an App deleted (or renamed) meanwhile has no next reconcile, so a tenant
//! that fails its Apps and deletes them, again and again under new names, would grow the
//! map for as long as the namespace is served. The memos older than `keep_for` are dropped
//! each time the map doubles since it was last swept (amortised: one pass per doubling), and
//! an emptied map gives back its room: a hash map keeps the room of its largest burst, and
//! these are full only while a namespace's Apps are written, empty at rest (0.78 MiB at rest
//! at a third of 10,000 Apps, `bench/heap.sh 333 3333` on b33684f).

use std::collections::HashMap;
use std::time::Duration;
use tokio::time::Instant;

/// An App of a namespace: its namespace and name.
pub type AppKey = (String, String);

/// Memos of `V` per App, each with when it was made.
#[derive(Debug)]
pub struct Memos<V> {
    map: HashMap<AppKey, (V, Instant)>,
    keep_for: Duration,
    /// The map's length after its last sweep.
    swept_at: usize,
}

impl<V> Memos<V> {
    /// Memos of use for `keep_for` after they are made.
    pub fn new(keep_for: Duration) -> Self {
        Self { map: HashMap::new(), keep_for, swept_at: 0 }
    }

    /// The memo of `key`, and when it was made.
    pub fn get(&self, key: &AppKey) -> Option<&(V, Instant)> {
        self.map.get(key)
    }

    /// The memo of `key`, made or changed now with `change` (given the memo kept, if any).
    pub fn update(&mut self, key: AppKey, change: impl FnOnce(Option<V>) -> V) -> &V {
        let now = Instant::now();
        if self.map.len() >= 2 * self.swept_at.max(8) {
            let keep_for = self.keep_for;
            self.map.retain(|_, (_, at)| now.duration_since(*at) <= keep_for);
            self.swept_at = self.map.len();
        }
        let kept = self.map.remove(&key).map(|(v, _)| v);
        &self.map.entry(key).or_insert((change(kept), now)).0
    }

    /// Forgets the memo of `key`; an emptied map gives back its room.
    pub fn forget(&mut self, key: &AppKey) {
        self.map.remove(key);
        if self.map.is_empty() {
            self.map.shrink_to_fit();
            self.swept_at = 0;
        }
    }

    #[cfg(test)]
    fn room(&self) -> usize {
        self.map.capacity()
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn app(i: usize) -> AppKey {
        ("team".to_string(), format!("app-{i}"))
    }

    #[test]
    fn emptied_memos_give_their_room_back() {
        let mut memos = Memos::new(Duration::from_secs(10));
        for i in 0..10 {
            memos.update(app(i), |_| i);
        }
        for i in 0..9 {
            memos.forget(&app(i));
        }
        assert!(memos.room() >= 10, "room kept while a memo is left");
        memos.forget(&app(9));
        assert_eq!(memos.room(), 0, "no room kept once empty");
    }

    /// Apps that failed and were deleted, again and again under new names: their memos go
    /// once old, and the map holds about the memos still of use.
    #[tokio::test(start_paused = true)]
    async fn memos_of_deleted_apps_do_not_pile_up() {
        let keep_for = Duration::from_secs(60);
        let mut memos = Memos::new(keep_for);
        for i in 0..10_000 {
            memos.update(app(i), |n: Option<u32>| n.unwrap_or(0) + 1);
            tokio::time::advance(Duration::from_secs(1)).await;
        }
        assert!(memos.len() <= 2 * 61 + 1, "{} memos kept, 61 of them of use", memos.len());
        assert!(memos.get(&app(9_999)).is_some(), "the latest is kept");
    }

    #[test]
    fn a_memo_is_changed_from_the_one_kept() {
        let mut memos = Memos::new(Duration::from_secs(10));
        assert_eq!(*memos.update(app(1), |n: Option<u32>| n.unwrap_or(0) + 1), 1);
        assert_eq!(*memos.update(app(1), |n| n.unwrap_or(0) + 1), 2);
        memos.forget(&app(1));
        assert_eq!(*memos.update(app(1), |n| n.unwrap_or(0) + 1), 1);
    }
}
