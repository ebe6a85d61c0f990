//! Watch-fed caches with a "synced" flag that any number of tasks can wait on.

pub mod compact;
mod list_watch;
pub mod start_mark;
mod streamed;
pub mod streaming_lists;
mod watch_lines;

use futures::{Stream, StreamExt, TryStreamExt};
use kube::Resource;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde::de::DeserializeOwned;
use std::fmt::Debug;
use tokio::sync::watch;

pub use compact::Compact;

/// Implements `kube::Resource` for `$view`, a partial view of objects of `$kind` (a
/// `k8s_openapi` or `CustomResource` type): the same kind, group, version and plural, scope
/// namespaced, its metadata in its field `metadata`.
macro_rules! resource_as {
    ($view:ty, $kind:ty) => {
        impl kube::Resource for $view {
            type DynamicType = ();
            type Scope = k8s_openapi::NamespaceResourceScope;

            fn kind(dt: &()) -> std::borrow::Cow<'_, str> {
                <$kind as kube::Resource>::kind(dt)
            }
            fn group(dt: &()) -> std::borrow::Cow<'_, str> {
                <$kind as kube::Resource>::group(dt)
            }
            fn version(dt: &()) -> std::borrow::Cow<'_, str> {
                <$kind as kube::Resource>::version(dt)
            }
            fn api_version(dt: &()) -> std::borrow::Cow<'_, str> {
                <$kind as kube::Resource>::api_version(dt)
            }
            fn plural(dt: &()) -> std::borrow::Cow<'_, str> {
                <$kind as kube::Resource>::plural(dt)
            }
            fn meta(&self) -> &kube::api::ObjectMeta {
                &self.metadata
            }
            fn meta_mut(&mut self) -> &mut kube::api::ObjectMeta {
                &mut self.metadata
            }
        }
    };
}
pub(crate) use resource_as;

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
) -> (Store<K>, watch::Receiver<bool>, WatchStream<K>)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    let (reader, synced, make) = cache_unmade(api, config, dyntype, modify);
    (reader, synced, make())
}

/// A watch stream, boxed.
pub type WatchStream<K> = futures::stream::BoxStream<'static, Result<K, watcher::Error>>;

/// Like `cache_with`, with the stream not made yet: the third part makes it. A cache watched
/// on demand (`on_demand`) makes its stream, and its backoff and reflector state, only once
/// started.
pub fn cache_unmade<K>(
    api: Api<K>,
    config: watcher::Config,
    dyntype: K::DynamicType,
    modify: fn(&mut K),
) -> (Store<K>, watch::Receiver<bool>, impl FnOnce() -> WatchStream<K> + Send + 'static)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    let writer = reflector::store::Writer::new(dyntype);
    let reader = writer.as_reader();
    let (synced_tx, synced_rx) = synced_flag();
    let make =
        move || fill(list_watch::events(api, config).default_backoff().modify(modify), writer, synced_tx).boxed();
    (reader, synced_rx, make)
}

/// Like `cache_unmade`, the stream of watcher events made by `events` (once started).
pub fn cache_unmade_of<K, S>(
    events: impl FnOnce() -> S + Send + 'static,
) -> (Store<K>, watch::Receiver<bool>, impl FnOnce() -> WatchStream<K> + Send + 'static)
where
    K: Resource<DynamicType = ()> + Clone + Debug + Send + Sync + 'static,
    S: Stream<Item = watcher::Result<watcher::Event<K>>> + Send + 'static,
{
    let writer = reflector::store::Writer::new(());
    let reader = writer.as_reader();
    let (synced_tx, synced_rx) = synced_flag();
    let make = move || fill(events().default_backoff(), writer, synced_tx).boxed();
    (reader, synced_rx, make)
}

/// The stream that fills a cache from `events`: each event goes into `writer`'s store, and
/// `synced` turns true once the store holds the first full list.
fn fill<K>(
    events: impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send + 'static,
    writer: reflector::store::Writer<K>,
    synced: watch::Sender<bool>,
) -> impl Stream<Item = watcher::Result<K>> + Send + 'static
where
    K: Resource + Clone + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Send + Sync,
{
    events
        .reflect(writer)
        // After `reflect`: the store swaps in the initial list when it sees InitDone, so only
        // now does the cache hold it. Flagging earlier let a reconcile read an empty cache.
        .inspect(move |event| {
            if let Ok(watcher::Event::InitDone) = event {
                synced.send_replace(true);
            }
        })
        .touched_objects()
}

/// Like `cache_with`, the objects kept as text (`compact`): each object watched as `W` is kept
/// as what `compact` makes of it, and a read of the cache gives that back.
pub fn compact_cache<W, K>(
    api: Api<W>,
    config: watcher::Config,
    compact: fn(W) -> Compact<K>,
) -> (CompactStore<K>, watch::Receiver<bool>, impl Stream<Item = watcher::Result<Compact<K>>> + Send + 'static)
where
    W: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    K: Resource<DynamicType = ()> + 'static,
{
    compact_cache_of(list_watch::events(api, config), compact)
}

/// Like `compact_cache`, filled from `events` (a watcher's stream).
pub fn compact_cache_of<W, K>(
    events: impl Stream<Item = watcher::Result<watcher::Event<W>>> + Send + 'static,
    compact: fn(W) -> Compact<K>,
) -> (CompactStore<K>, watch::Receiver<bool>, impl Stream<Item = watcher::Result<Compact<K>>> + Send + 'static)
where
    W: Send + 'static,
    K: Resource<DynamicType = ()> + 'static,
{
    compact_cache_observed(events, compact, |_| {})
}

/// Like `compact_cache_of`, each event shown to `observe` as the cache gets it (its objects
/// as cached, just before the cache's store takes them).
pub fn compact_cache_observed<W, K>(
    events: impl Stream<Item = watcher::Result<watcher::Event<W>>> + Send + 'static,
    compact: fn(W) -> Compact<K>,
    observe: impl Fn(&watcher::Event<Compact<K>>) + Send + 'static,
) -> (CompactStore<K>, watch::Receiver<bool>, impl Stream<Item = watcher::Result<Compact<K>>> + Send + 'static)
where
    W: Send + 'static,
    K: Resource<DynamicType = ()> + 'static,
{
    let writer = reflector::store::Writer::new(());
    let reader = writer.as_reader();
    let (synced_tx, synced_rx) = synced_flag();
    let compact = move |obj| compact(obj).at_most(MAX_CACHED_BYTES);
    let events = events.default_backoff().map_ok(move |event| match event {
        watcher::Event::Apply(obj) => watcher::Event::Apply(compact(obj)),
        watcher::Event::Delete(obj) => watcher::Event::Delete(compact(obj)),
        watcher::Event::InitApply(obj) => watcher::Event::InitApply(compact(obj)),
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitDone => watcher::Event::InitDone,
    });
    let events = events.inspect_ok(move |event| observe(event));
    (reader, synced_rx, fill(events, writer, synced_tx))
}

/// A cache of objects kept as text.
pub type CompactStore<K> = Store<Compact<K>>;

/// The most of one object's JSON a cache of `compact_cache` keeps (`Compact::at_most`): an
/// App's template may be 64 KiB, and its status keeps a copy of the stable one beside the
/// rest. An App over it is reported (an InvalidSpec Event that says how large it is) and its
/// text not kept.
pub const MAX_CACHED_BYTES: usize = 256 * 1024;

/// Whether the cache of `flag` has its first full list, once it has: false when its watch
/// went before that (its stream was dropped), which must not read as synced.
pub async fn synced(flag: &watch::Receiver<bool>) -> bool {
    flag.clone().wait_for(|s| *s).await.is_ok()
}

/// Whether the watch of a cache started on demand runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Demand {
    /// Not known yet (a probe of what exists is under way): the cache cannot be trusted.
    Unknown,
    /// Not watched: nothing needs it, and nothing of its kind was there when the probe looked
    /// (an empty cache is then the truth).
    Idle,
    /// Watched from now on (never stopped: the controller's life is the namespace's).
    Started,
}

/// A cache whose watch starts only once something needs it: most namespaces have no App
/// that autoscales or reads a ConfigMap, and every watch costs a connection's stream, its
/// state (`list_watch`) and a list at every start and failover.
#[derive(Clone, Debug)]
pub struct OnDemand {
    demand: std::sync::Arc<watch::Sender<Demand>>,
    synced: watch::Receiver<bool>,
}

impl OnDemand {
    /// Starts the watch (if it was not running) and waits for the cache's first full list.
    /// Without `need`, waits only until the cache can be trusted: idle, or started and synced.
    /// False when it never can be (its watch went before its first list).
    pub async fn ready(&self, need: bool) -> bool {
        if need {
            self.start();
        }
        let mut demand = self.demand.subscribe();
        let settled = match demand.wait_for(|d| *d != Demand::Unknown).await {
            Ok(d) => *d,
            Err(_) => return false,
        };
        settled != Demand::Started || synced(&self.synced).await
    }

    /// What `ready` would answer at once, without waiting: starts the watch if `need`.
    pub fn ready_now(&self, need: bool) -> bool {
        if need {
            self.start();
        }
        let demand = *self.demand.borrow();
        demand != Demand::Unknown && (demand != Demand::Started || *self.synced.borrow())
    }

    /// Starts the watch; a no-op when it runs.
    pub fn start(&self) {
        self.demand.send_if_modified(|d| {
            let changed = *d != Demand::Started;
            *d = Demand::Started;
            changed
        });
    }

    /// What a probe found: the watch starts if something exists (or the probe could not
    /// tell), else it stays idle until needed. A start asked for meanwhile stands.
    pub fn settle(&self, found: bool) {
        self.demand.send_if_modified(|d| match *d {
            Demand::Unknown => {
                *d = if found { Demand::Started } else { Demand::Idle };
                true
            }
            _ => false,
        });
    }

    /// Whether the watch runs.
    pub fn demand(&self) -> Demand {
        *self.demand.borrow()
    }
}

/// Makes a cache's watch stream wait until its `OnDemand` is started, and only then makes it
/// (`make`). With a `probe`, the cache starts `Unknown` and the stream, once polled, first runs
/// the probe and settles on what it found (`settle`); without one it starts `Idle`.
pub fn on_demand<K>(
    make: impl FnOnce() -> WatchStream<K> + Send + 'static,
    synced: watch::Receiver<bool>,
    probe: Option<futures::future::BoxFuture<'static, bool>>,
) -> (OnDemand, impl Stream<Item = Result<K, watcher::Error>> + Send + 'static)
where
    K: Send + 'static,
{
    let initial = if probe.is_some() { Demand::Unknown } else { Demand::Idle };
    let lazy = OnDemand { demand: std::sync::Arc::new(watch::channel(initial).0), synced };
    let gated = {
        let lazy = lazy.clone();
        futures::stream::once(async move {
            if let Some(probe) = probe {
                lazy.settle(probe.await);
            }
            let _ = lazy.demand.subscribe().wait_for(|d| *d == Demand::Started).await;
            make()
        })
        .flatten()
    };
    (lazy, gated)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A cache watched on demand; `probed`: with a probe that never answers (the tests settle
    /// by hand).
    fn gated(probed: bool) -> (OnDemand, watch::Sender<bool>, impl Stream<Item = Result<u32, watcher::Error>>) {
        use futures::FutureExt;
        let (synced_tx, synced_rx) = synced_flag();
        let probe = probed.then(|| futures::future::pending::<bool>().boxed());
        let (lazy, stream) = on_demand(|| futures::stream::iter([Ok(7u32)]).boxed(), synced_rx, probe);
        (lazy, synced_tx, stream)
    }

    #[tokio::test]
    async fn the_stream_is_made_only_once_started() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, Ordering};
        let made = Arc::new(AtomicBool::new(false));
        let make = {
            let made = made.clone();
            move || {
                made.store(true, Ordering::SeqCst);
                futures::stream::iter([Ok(7u32)]).boxed()
            }
        };
        let (_synced_tx, synced_rx) = synced_flag();
        let (lazy, stream) = on_demand(make, synced_rx, None);
        let mut stream = Box::pin(stream);
        assert!(!yields(&mut stream).await);
        assert!(!made.load(Ordering::SeqCst), "an idle cache's stream costs nothing yet");
        lazy.start();
        assert!(yields(&mut stream).await, "a started watch runs");
        assert!(made.load(Ordering::SeqCst));
    }

    async fn yields(stream: &mut (impl Stream<Item = Result<u32, watcher::Error>> + Unpin)) -> bool {
        tokio::time::timeout(Duration::from_millis(50), stream.next()).await.is_ok()
    }

    #[tokio::test]
    async fn the_watch_waits_until_something_needs_it() {
        let (lazy, synced, stream) = gated(false);
        let mut stream = Box::pin(stream);
        assert_eq!(lazy.demand(), Demand::Idle);
        assert!(!yields(&mut stream).await, "an idle cache's watch must not run");
        // Idle is trusted as it is: nothing to wait for.
        tokio::time::timeout(Duration::from_millis(50), lazy.ready(false)).await.expect("idle is ready");
        // Needed: started, and ready only once synced.
        let waiting = tokio::time::timeout(Duration::from_millis(50), lazy.ready(true)).await;
        assert!(waiting.is_err(), "a started cache is ready only once synced");
        assert_eq!(lazy.demand(), Demand::Started);
        assert!(yields(&mut stream).await, "a started watch runs");
        synced.send_replace(true);
        assert!(tokio::time::timeout(Duration::from_millis(50), lazy.ready(false)).await.expect("synced"));
    }

    #[tokio::test]
    async fn a_watch_gone_before_its_first_list_is_never_synced() {
        let (tx, rx) = synced_flag();
        drop(tx);
        assert!(!synced(&rx).await, "a dropped stream's empty cache is not the truth");
        let (tx, rx) = synced_flag();
        tx.send_replace(true);
        drop(tx);
        assert!(synced(&rx).await, "synced before it went: still synced");
        let (lazy, synced_tx, _stream) = gated(false);
        drop(synced_tx);
        let ready = tokio::time::timeout(Duration::from_millis(50), lazy.ready(true)).await;
        assert_eq!(ready.ok(), Some(false), "needed, and gone before its list: not ready, at once");
    }

    #[tokio::test]
    async fn a_probe_decides_and_a_start_asked_for_meanwhile_stands() {
        let (lazy, synced, _stream) = gated(true);
        let unknown = tokio::time::timeout(Duration::from_millis(50), lazy.ready(false)).await;
        assert!(unknown.is_err(), "a cache not yet probed cannot be trusted");
        lazy.settle(false);
        assert_eq!(lazy.demand(), Demand::Idle);

        let (lazy, _synced2, _stream) = gated(true);
        lazy.settle(true);
        assert_eq!(lazy.demand(), Demand::Started, "something found: watched");

        let (lazy, _synced3, _stream) = gated(true);
        lazy.start();
        lazy.settle(false);
        assert_eq!(lazy.demand(), Demand::Started, "a probe never stops a started watch");
        drop(synced);
    }
}
