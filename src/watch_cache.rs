//! Watch-fed caches with a "synced" flag that any number of tasks can wait on.

use futures::{Stream, StreamExt};
use kube::Resource;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde::de::DeserializeOwned;
use std::fmt::Debug;
use tokio::sync::watch;

/// Drops what the operator never reads from cached objects: managed fields and the
/// last-applied annotation are most of a Deployment's size.
pub fn slim<K: Resource>(obj: &mut K) {
    obj.meta_mut().managed_fields = None;
    if let Some(a) = obj.meta_mut().annotations.as_mut() {
        a.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
}

/// Turns true once a watch stream has delivered its first complete list. Kept as a
/// `watch` channel because any number of reconciles may wait on it at once (a reflector
/// store's own readiness future wakes only one waiter).
pub fn synced_flag() -> (watch::Sender<bool>, watch::Receiver<bool>) {
    watch::channel(false)
}

/// A cache of the objects of one kind, the stream of changes that feeds it, and a flag
/// that turns true once the cache holds its first full list.
pub fn cache<K>(
    api: Api<K>,
    config: watcher::Config,
    dyntype: K::DynamicType,
) -> (Store<K>, watch::Receiver<bool>, impl Stream<Item = Result<K, watcher::Error>> + Send + 'static)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    cache_with(api, config, dyntype, slim::<K>)
}

/// Like `cache`, with `modify` deciding what of each object is kept.
pub fn cache_with<K>(
    api: Api<K>,
    config: watcher::Config,
    dyntype: K::DynamicType,
    modify: fn(&mut K),
) -> (Store<K>, watch::Receiver<bool>, impl Stream<Item = Result<K, watcher::Error>> + Send + 'static)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    let writer = reflector::store::Writer::new(dyntype);
    let reader = writer.as_reader();
    let (synced_tx, synced_rx) = synced_flag();
    let stream = watcher(api, config)
        .default_backoff()
        .modify(modify)
        .reflect(writer)
        // After `reflect`: the store swaps in the initial list when it sees InitDone, so only
        // now does the cache hold it. Flagging earlier let a reconcile read an empty cache.
        .inspect(move |event| {
            if let Ok(watcher::Event::InitDone) = event {
                synced_tx.send_replace(true);
            }
        })
        .touched_objects();
    (reader, synced_rx, stream)
}
