//! Wires the App controller: watches Apps, and the Deployments, HPAs and Services they own (so that
//! drift triggers a reconcile at once), and runs reconciles until shutdown.

use futures::{FutureExt, Stream, StreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::Service;
use kube::api::Api;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{Controller, watcher};
use kube::{Client, Resource};
use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tracing::{debug, info, warn};

use super::context::{Caches, Context};
use super::reconcile::{error_policy, reconcile};
use crate::api::App;
use crate::api::names;
use crate::app::config_map_key::ConfigMapKey;
use crate::app::config_readers::ConfigMapReaders;
use crate::rollout::Analyzer;
use crate::sharding::fence::Fence;
use crate::telemetry::Metrics;
use crate::telemetry::events::EventWriter;
use crate::watch_cache::{
    Compact, cache_unmade, cache_unmade_of, compact_cache, compact_cache_observed, on_demand, slim,
};

/// Who serves a namespace, when sharded: the write fence of this replica's shards and the
/// tenant the namespace belongs to.
#[derive(Clone, Debug)]
pub struct ServedBy {
    pub fence: Fence,
    pub tenant: Option<String>,
    /// The Tenants' cache (the Prometheus endpoints a tenant may use are read there).
    pub tenants: Option<kube::runtime::reflector::Store<crate::api::Tenant>>,
}

/// Which namespaces this replica serves.
#[derive(Clone, Debug)]
pub enum Scope {
    /// Every namespace (one cluster-wide watch per kind).
    All,
    /// One namespace only.
    Namespace(String),
}

impl Scope {
    /// The API of `K`'s objects in this scope.
    pub fn api<K>(&self, client: &Client) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        match self {
            Scope::All => Api::all(client.clone()),
            Scope::Namespace(ns) => Api::namespaced(client.clone(), ns),
        }
    }
}

/// What every App controller of a replica shares: how Events name it, its metrics, how it
/// measures rollouts, and the slots its reconciles take turns in.
#[derive(Clone)]
pub struct Shared {
    /// The Event writer the App controllers of all served namespaces share.
    pub events: EventWriter,
    pub metrics: Metrics,
    pub analyzer: Analyzer,
    /// Reconciles of all served namespaces running at once (`None`: no bound).
    pub slots: Option<Arc<tokio::sync::Semaphore>>,
    /// Pod annotations a tenant may not set.
    pub pod_policy: Arc<crate::app::pod_policy::PodPolicy>,
    /// Whether the apiserver streams a watch's initial state (`watch_cache::streaming_lists`).
    pub streaming_lists: bool,
    /// Reconciles of one namespace's Apps working at once (0: no bound). See
    /// `controller_config`.
    pub reconciles_per_namespace: u16,
}

/// The watch streams that fill the controller's caches of managed objects.
pub struct ManagedStreams<D, H, S, C> {
    pub deployments: D,
    pub hpas: H,
    pub services: S,
    /// ConfigMap changes (metadata), mapped to the Apps that read them.
    pub config_maps: C,
    /// Apps a namespace turn is free for (`namespace_turns`).
    pub woken: futures::stream::BoxStream<'static, ObjectRef<Compact<App>>>,
}

/// The watch streams of one controller's managed objects.
pub type Streams = ManagedStreams<
    std::pin::Pin<Box<dyn Stream<Item = Result<Compact<Deployment>, watcher::Error>> + Send>>,
    std::pin::Pin<Box<dyn Stream<Item = Result<HorizontalPodAutoscaler, watcher::Error>> + Send>>,
    std::pin::Pin<Box<dyn Stream<Item = Result<Compact<Service>, watcher::Error>> + Send>>,
    std::pin::Pin<Box<dyn Stream<Item = Result<ConfigMapKey, watcher::Error>> + Send>>,
>;

/// The controller's context and the watch streams that fill its caches. The streams must
/// be polled (the controller does; a test can drain them) for the caches to fill.
pub fn context(
    client: Client,
    scope: &Scope,
    shared: Shared,
    served_by: Option<ServedBy>,
    apps: Option<Store<Compact<App>>>,
) -> (Arc<Context>, Streams) {
    let Shared { events, metrics, analyzer, slots, pod_policy, streaming_lists, reconciles_per_namespace } = shared;
    let managed = || watcher::Config::default().labels(&names::managed_selector()).page_size(LIST_PAGE);
    // Deployments as projections: what the planner and the drift check read (`projection`).
    // Both kept as text (`Compact`): a reconcile reads back the few it needs.
    let (deployments, deployments_synced, deployment_events) =
        compact_cache(scope.api::<Deployment>(&client), managed(), crate::app::projection::compact_deployment);
    let (hpas, hpas_synced, make_hpa_events) =
        cache_unmade::<HorizontalPodAutoscaler>(scope.api(&client), managed(), (), slim::<HorizontalPodAutoscaler>);
    // HPAs are watched once an App of the namespace autoscales, or when one is there at start
    // (an App whose autoscaling was turned off while no replica watched must still have its
    // HPA deleted). Looking costs one list of at most one object's metadata.
    let probe = {
        let api = scope.api::<HorizontalPodAutoscaler>(&client);
        async move { any_managed(&api).await }.boxed()
    };
    let (hpa_watch, hpa_events) = on_demand(make_hpa_events, hpas_synced, Some(probe));
    let (services, services_synced, service_events) =
        compact_cache(scope.api::<Service>(&client), managed(), crate::app::service_projection::compact_service);
    // Every ConfigMap of the namespace (which ones an App reads is in its template, and a
    // label selector would make tenants label them for us), watched once an App of the
    // namespace reads one. Read as `ConfigMapKey`: its key, the opt-out annotation and the
    // fingerprint of its data, computed as it is read, whatever its size or shape; the rest
    // is skipped unread. Streamed where the apiserver can, as Apps are, else in pages of 20.
    let (config_maps, config_maps_synced, make_config_map_events) = {
        let api = scope.api::<ConfigMapKey>(&client);
        cache_unmade_of(move || crate::watch_cache::streaming_lists::watch(api, tenant_sized(), streaming_lists))
    };
    let (config_map_watch, config_map_events) = on_demand(make_config_map_events, config_maps_synced, None);
    let caches = Caches {
        deployments,
        hpas,
        services,
        config_maps,
        synced: vec![deployments_synced, services_synced],
        hpa_watch,
        config_map_watch,
    };
    // The namespace's client: its Events pass the wire fence like every other write.
    let events = events.with_client(client.clone());
    let mut ctx = Context::new(client, events, metrics, caches, analyzer);
    ctx.slots = slots;
    let turns = crate::app::namespace_turns::NamespaceTurns::new(
        turns_of(scope, reconciles_per_namespace),
        exists(apps, scope),
        ctx.metrics.apps_waiting_for_turn(),
    );
    let woken = woken_apps(turns.woken(), scope);
    ctx.namespace_turns = turns;
    ctx.pod_policy = pod_policy;
    if let Some(s) = served_by {
        ctx.fence = Some(s.fence);
        ctx.tenant = s.tenant;
        ctx.tenants = s.tenants;
    }
    let ctx = Arc::new(ctx);
    let streams = ManagedStreams {
        deployments: deployment_events.boxed(),
        hpas: hpa_events.boxed(),
        services: service_events.boxed(),
        config_maps: config_map_events.boxed(),
        woken,
    };
    (ctx, streams)
}

/// The turns of a namespace's controller: none for a controller of every namespace (its
/// Apps' wakes could not name their namespace, `woken_apps`).
fn turns_of(scope: &Scope, per_namespace: u16) -> u16 {
    match scope {
        Scope::Namespace(_) => per_namespace,
        Scope::All => 0,
    }
}

/// Whether an App of `scope` exists in `apps` by name (`namespace_turns`); without a cache,
/// every App does.
fn exists(apps: Option<Store<Compact<App>>>, scope: &Scope) -> crate::app::namespace_turns::Exists {
    let namespace = match scope {
        Scope::Namespace(ns) => ns.clone(),
        Scope::All => String::new(),
    };
    match apps {
        Some(apps) => Arc::new(move |name| apps.get(&ObjectRef::new(name).within(&namespace)).is_some()),
        None => Arc::new(|_| true),
    }
}

/// The Apps a namespace turn is free for (`namespace_turns`), to reconcile again.
fn woken_apps(
    woken: futures::stream::BoxStream<'static, String>,
    scope: &Scope,
) -> futures::stream::BoxStream<'static, ObjectRef<Compact<App>>> {
    let namespace = match scope {
        Scope::Namespace(ns) => Some(ns.clone()),
        Scope::All => None,
    };
    // A controller of all namespaces has no namespace turns (`operator`: one namespace alone,
    // or one controller per served namespace), so nothing is woken there.
    woken
        .filter_map(move |name| {
            let app = namespace.as_deref().map(|ns| ObjectRef::new(&name).within(ns));
            futures::future::ready(app)
        })
        .boxed()
}

/// Whether any object of `api`'s kind labelled as Flotilla's exists (true also when that
/// cannot be told: watching is then the safe choice).
async fn any_managed<K>(api: &Api<K>) -> bool
where
    K: Resource + Clone + serde::de::DeserializeOwned + Debug,
{
    let params = kube::api::ListParams::default().labels(&names::managed_selector()).limit(1);
    match api.list_metadata(&params).await {
        // A page may come back empty with more to read: that is not "none".
        Ok(list) => !list.items.is_empty() || list.metadata.continue_.as_deref().is_some_and(|c| !c.is_empty()),
        Err(e) => {
            warn!(error = %e, "could not look for managed objects; watching them");
            true
        }
    }
}

/// Objects a list of the caches' asks for at once (kube-runtime's default is 500). Anyone
/// who may write in a namespace can make each of its objects as large as the apiserver stores
/// (1.5 MiB): a page of 500 of them would be read whole into memory before anything is
/// dropped. 50 bounds a page at 75 MiB of text; a namespace of fewer objects is one request
/// either way.
pub const LIST_PAGE: u32 = 50;

/// Apps a list asks for at once, in a namespace's cache and in the guard's cluster-wide one.
/// A page is read whole as text before any of it is parsed (and copied once on the way in,
/// inside kube), and whoever may create Apps chooses their size: 20 of 1.5 MiB is 30 MiB of
/// text. Operator-made objects are bounded by the App they are made from (`LIST_PAGE`).
pub const APP_LIST_PAGE: u32 = 20;

/// How a watch of objects whose writers choose their size (Apps, ConfigMaps) reads when not
/// streamed: in pages of `APP_LIST_PAGE`. (Its watch keeps no read buffer between events:
/// `watch_cache::watch_lines`.)
fn tenant_sized() -> watcher::Config {
    watcher::Config::default().page_size(APP_LIST_PAGE)
}

/// A watch of Apps as `K`: its initial state streamed, one App at a time, where the apiserver
/// can (`streamed`, see `watch_cache::streaming_lists`), else listed in pages of
/// `APP_LIST_PAGE`.
pub fn watch_apps<K>(
    client: &Client,
    scope: &Scope,
    streamed: bool,
) -> impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send + 'static
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + Debug
        + Send
        + 'static,
{
    crate::watch_cache::streaming_lists::watch(scope.api::<K>(client), tenant_sized(), streamed)
}

/// How a namespace's App controller runs: at most `per_namespace` of its reconciles work at
/// once, in turns given in the order asked (`namespace_turns`); kube-runtime lets in
/// `namespace_turns::QUICK_LANES` more, for the reconciles that find no turn and end at once
/// (0: no bound).
///
/// The replica's slots (`Shared::slots`) bound the reconciles that work; the namespace's turns
/// bound, per served namespace, those working or waiting for the namespace's caches, a slot
/// or an analysis turn:
/// - A tenant that creates thousands of Apps in one namespace queues only a few of them for
///   the slots at a time, among the other namespaces' reconciles, instead of all of them
///   ahead of every other tenant's.
/// - An App waits for the Apps of its namespace that asked before it, and no more: Apps that
///   come due again and again (an analysis against a Prometheus that hangs) go behind it.
/// - kube-runtime keeps a reconcile in flight as a spawned task, a tracing span and an entry
///   of its runner's hash map, and that map keeps the room its largest burst needed for as
///   long as the controller runs: about 600 bytes an entry, 9 KiB a namespace after each of
///   10 Apps had one in flight (`bench/heap.sh`). Five hold 8 entries' room.
///
/// The Apps in line wait as names in the line (`namespace_turns`), asking kube-runtime for
/// nothing until woken: each scheduled retry costs about 130 bytes of its scheduler's map and
/// delay queue, and those keep the room of their largest burst. An App whose analysis waits
/// for its Prometheus holds a turn meanwhile (at most `rollout::measure::TURN_WAIT` for an
/// analysis turn, then the query timeout). The operator of a single namespace
/// (`--namespace`) sets no bound, nor does a controller of every namespace (`turns_of`).
pub fn controller_config(per_namespace: u16) -> kube::runtime::controller::Config {
    let in_flight = match per_namespace {
        0 => 0,
        turns => turns.saturating_add(crate::app::namespace_turns::QUICK_LANES),
    };
    kube::runtime::controller::Config::default().concurrency(in_flight)
}

/// The App controller of `apps`, triggered by their changes and by those of what they own
/// and read.
fn controller_of(
    app_events: impl Stream<Item = Result<Compact<App>, watcher::Error>> + Send + 'static,
    apps: Store<Compact<App>>,
    streams: Streams,
    readers: ConfigMapReaders,
    config: kube::runtime::controller::Config,
) -> Controller<Compact<App>> {
    Controller::for_stream(app_events, apps)
        .with_config(config)
        .owns_stream(streams.deployments)
        .owns_stream(streams.hpas)
        .owns_stream(streams.services)
        .watches_stream(streams.config_maps, move |cm| readers.apps_reading(&cm))
        .reconcile_on(streams.woken)
}

/// Returns the future that runs the App controller until `shutdown`. `ready` turns true
/// once every cache has its initial list.
pub fn app_controller(
    client: Client,
    scope: Scope,
    shared: Shared,
    served_by: Option<ServedBy>,
    ready: Arc<AtomicBool>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> impl Future<Output = ()> {
    // Read straight into text (`Compact`), never as Apps: one malformed App cannot break the
    // watch (and the cache) for all the others, each is parsed in its own reconcile; and an
    // App shaped to parse into many times its size costs no more than its length. Each App
    // that changes is read for the ConfigMaps it reads, which a ConfigMap's change looks up.
    let readers = ConfigMapReaders::default();
    let (apps, apps_synced, app_events) = {
        let readers = readers.clone();
        let events = watch_apps::<Compact<App>>(&client, &scope, shared.streaming_lists);
        compact_cache_observed(events, std::convert::identity, move |event| readers.observe(event))
    };
    let namespace = match &scope {
        Scope::All => String::new(),
        Scope::Namespace(ns) => ns.clone(),
    };
    let registration = shared.metrics.app_index().register(&namespace, apps.clone(), ready.clone());
    let per_namespace = turns_of(&scope, shared.reconciles_per_namespace);
    let (ctx, streams) = context(client, &scope, shared, served_by, Some(apps.clone()));
    let controller = controller_of(app_events, apps, streams, readers, controller_config(per_namespace))
        .graceful_shutdown_on(shutdown);
    async move {
        // Dropped with this future: the namespace's Apps leave the per-App series.
        let _registration = registration;
        let readiness_ctx = ctx.clone();
        // Aborted with this future (a JoinSet aborts its tasks when dropped), however it ends:
        // an on-demand cache whose probe never answered would keep it (and the namespace's
        // context) waiting for good.
        let mut readiness = tokio::task::JoinSet::new();
        let (started, shown) = (std::time::Instant::now(), namespace);
        readiness.spawn(async move {
            if !crate::watch_cache::synced(&apps_synced).await
                || !readiness_ctx.wait_for_caches(Default::default()).await
            {
                debug!("App controller stopped before its caches synced");
                return;
            }
            ready.store(true, Ordering::SeqCst);
            info!(namespace = %shown, took = ?started.elapsed(), "App controller caches synced");
        });
        controller
            .run(reconcile, error_policy, ctx)
            .for_each(|result| async move {
                if let Err(e) = result {
                    debug!(error = %e, "reconcile did not complete");
                }
            })
            .await;
        info!("App controller stopped");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::DynamicObject;
    use kube::runtime::reflector::store::Writer;
    use std::collections::HashMap;
    use std::sync::Mutex;

    fn cached(name: &str, namespace: &str) -> Compact<App> {
        let obj: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "flotilla.dev/v1beta1", "kind": "App",
            "metadata": {"name": name, "namespace": namespace, "uid": name},
            "spec": {"image": "registry.example.com/web", "version": "1", "replicas": 1}
        }))
        .expect("an App");
        Compact::of(obj)
    }

    /// Runs the controller over `count` Apps of one namespace, as `reconcile` does (each takes
    /// a turn of `turns` first), until `until`; each reconcile works for `works` and asks to
    /// run again after `again`. Returns the most reconciles that worked at once and, per
    /// App, the longest it waited for a reconcile (its first, the next, or, when it asked to
    /// run again, one that had not come by `until`).
    async fn run_namespace(
        count: usize,
        config: kube::runtime::controller::Config,
        per_namespace: u16,
        works: std::time::Duration,
        again: Option<std::time::Duration>,
        until: std::time::Duration,
    ) -> (usize, Vec<std::time::Duration>) {
        use std::sync::atomic::AtomicUsize;
        use tokio::time::Instant;
        let apps: Vec<_> = (0..count).map(|i| cached(&format!("app-{i}"), "team")).collect();
        let mut writer = Writer::<Compact<App>>::default();
        let reader = writer.as_reader();
        writer.apply_watcher_event(&watcher::Event::Init);
        for app in &apps {
            writer.apply_watcher_event(&watcher::Event::InitApply(app.clone()));
        }
        writer.apply_watcher_event(&watcher::Event::InitDone);
        fn empty<T: Send + 'static>() -> futures::stream::BoxStream<'static, T> {
            futures::stream::empty().boxed()
        }
        let scope = Scope::Namespace("team".into());
        let turns = crate::app::namespace_turns::NamespaceTurns::new(
            per_namespace,
            exists(Some(reader.clone()), &scope),
            prometheus::IntGauge::new("waiting", "Apps in line").expect("a gauge"),
        );
        let woken = turns.woken();
        let streams = ManagedStreams {
            deployments: empty(),
            hpas: empty(),
            services: empty(),
            config_maps: empty(),
            woken: woken_apps(woken, &scope),
        };
        // A watch does not end: a controller whose triggers end stops.
        let events = futures::stream::iter(apps.into_iter().map(Ok)).chain(futures::stream::pending());
        struct Seen {
            working: AtomicUsize,
            most: AtomicUsize,
            /// Per App: when it last started working, the longest wait so far, and how often.
            waits: Mutex<HashMap<String, (Instant, std::time::Duration, usize)>>,
            turns: crate::app::namespace_turns::NamespaceTurns,
        }
        let started = Instant::now();
        let seen = Arc::new(Seen {
            working: AtomicUsize::new(0),
            most: AtomicUsize::new(0),
            waits: Mutex::new((0..count).map(|i| (format!("app-{i}"), (started, Default::default(), 0))).collect()),
            turns,
        });
        let run = controller_of(events, reader, streams, ConfigMapReaders::default(), config)
            .run(
                move |app: Arc<Compact<App>>, seen: Arc<Seen>| async move {
                    use crate::app::namespace_turns::Taken;
                    // As `reconcile` does.
                    let name = kube::ResourceExt::name_any(app.as_ref());
                    let _turn = match seen.turns.take(&name) {
                        Taken::InLine => return Ok(kube::runtime::controller::Action::await_change()),
                        taken => taken,
                    };
                    let now = seen.working.fetch_add(1, Ordering::SeqCst) + 1;
                    seen.most.fetch_max(now, Ordering::SeqCst);
                    if let Some((last, longest, times)) = seen.waits.lock().expect("waits").get_mut(&name) {
                        *longest = (*longest).max(last.elapsed());
                        *last = Instant::now();
                        *times += 1;
                    }
                    tokio::time::sleep(works).await;
                    seen.working.fetch_sub(1, Ordering::SeqCst);
                    Ok::<_, std::io::Error>(match again {
                        Some(after) => kube::runtime::controller::Action::requeue(after),
                        None => kube::runtime::controller::Action::await_change(),
                    })
                },
                |_, _, _| kube::runtime::controller::Action::await_change(),
                seen.clone(),
            )
            .for_each(|_| futures::future::ready(()));
        let _ = tokio::time::timeout(until, run).await;
        let waits = seen.waits.lock().expect("waits");
        // The wait since the last reconcile counts when one was asked for after it, or when
        // none came at all.
        let mut longest: Vec<_> = waits
            .values()
            .map(
                |(last, longest, times)| {
                    if again.is_some() || *times == 0 { (*longest).max(last.elapsed()) } else { *longest }
                },
            )
            .collect();
        longest.sort();
        (seen.most.load(Ordering::SeqCst), longest)
    }

    /// A namespace's Apps take turns three at a time. The clock is paused (it moves on only
    /// when every task waits), so that every reconcile let in starts before any ends.
    #[tokio::test(start_paused = true)]
    async fn a_namespace_has_at_most_its_share_of_reconciles_working() {
        use std::time::Duration;
        let ms = Duration::from_millis;
        let (most, waits) = run_namespace(12, controller_config(3), 3, ms(20), None, ms(1000)).await;
        assert_eq!(most, 3);
        assert!(waits.iter().all(|w| *w <= ms(100)), "every App reconciled at once in turn: {waits:?}");
        let (most, _) = run_namespace(12, controller_config(0), 0, ms(20), None, ms(1000)).await;
        assert_eq!(most, 12, "0: no bound");
    }

    /// Ten Apps of a namespace whose reconciles each take 10 s and come due again a second
    /// after (an analysis against a Prometheus that hangs), in three turns: each App is
    /// reconciled at least every ten seconds' worth of the reconciles ahead of it (about 35 s).
    /// With kube-runtime's own bound instead, the Apps it held back were taken in its hash
    /// set's order, and some waited the whole five minutes.
    #[tokio::test(start_paused = true)]
    async fn no_app_of_a_busy_namespace_waits_for_good() {
        use std::time::Duration;
        let s = Duration::from_secs;
        let (most, waits) = run_namespace(10, controller_config(3), 3, s(10), Some(s(1)), s(300)).await;
        assert_eq!(most, 3);
        let longest = *waits.last().expect("ten Apps");
        assert!(longest <= s(45), "an App waited {longest:?} between two reconciles: {waits:?}");
    }

    /// A controller of every namespace has no turns: its wakes could not name the App's
    /// namespace, and an App in line would wait for good.
    #[test]
    fn only_a_namespace_controller_takes_turns() {
        assert_eq!(turns_of(&Scope::Namespace("team".into()), 3), 3);
        assert_eq!(turns_of(&Scope::All, 3), 0);
    }

    /// What the readiness task relies on.
    #[tokio::test]
    async fn a_dropped_join_set_stops_its_task_and_frees_what_it_held() {
        let held = Arc::new(());
        let in_task = held.clone();
        let mut guard = tokio::task::JoinSet::new();
        guard.spawn(async move {
            let _keep = in_task;
            futures::future::pending::<()>().await;
        });
        tokio::task::yield_now().await;
        assert_eq!(Arc::strong_count(&held), 2, "the task holds it while it runs");
        drop(guard);
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(Arc::strong_count(&held), 1, "the task, and what it held, are gone");
    }
}
