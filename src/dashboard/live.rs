//! What the dashboard watches with the user's credentials: the Apps (and Tenants) it shows,
//! kept in reflector stores that pages read, and the shard Leases. Each change is announced
//! to the open pages (server-sent events), which fetch their content again; the values each
//! check reported and the shards that changed hands are remembered while the dashboard runs.

use futures::{Stream, StreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use tokio::sync::broadcast;

use super::model::{Failover, Samples};
use crate::api::{App, Tenant};
use crate::app::lenient::LenientApp;
use crate::sharding::leases::{holder, shard_of_lease};

/// Values kept per check of an App.
const SAMPLES_KEPT: usize = 120;
/// Shard handovers kept.
const FAILOVERS_KEPT: usize = 200;

/// Recent values of each check, per App (`namespace/name`).
type SamplesByApp = HashMap<String, BTreeMap<String, Samples>>;

pub struct Live {
    /// Topics that changed: `app:<ns>/<name>`, `tenant:<name>`, `lease:<name>`.
    pub changes: broadcast::Sender<String>,
    samples: Mutex<SamplesByApp>,
    failovers: Mutex<VecDeque<Failover>>,
}

impl Live {
    pub fn new() -> Arc<Live> {
        Arc::new(Live {
            changes: broadcast::channel(1024).0,
            samples: Mutex::new(HashMap::new()),
            failovers: Mutex::new(VecDeque::new()),
        })
    }

    pub fn samples(&self, namespace: &str, name: &str) -> BTreeMap<String, Samples> {
        let map = self.samples.lock().unwrap_or_else(PoisonError::into_inner);
        map.get(&format!("{namespace}/{name}")).cloned().unwrap_or_default()
    }

    pub fn failovers(&self) -> Vec<Failover> {
        self.failovers.lock().unwrap_or_else(PoisonError::into_inner).iter().cloned().collect()
    }

    fn announce(&self, topic: String) {
        // No page open: nobody to tell.
        let _ = self.changes.send(topic);
    }

    /// Keeps each check's latest value of `app`, once per analysis run.
    pub fn record(&self, app: &App) {
        let Some(analysis) = app.status.as_ref().and_then(|s| s.analysis.as_ref()) else { return };
        let Some(at) = analysis.last_run.as_ref().map(|t| t.0.as_second()) else { return };
        let key = format!("{}/{}", app.namespace().unwrap_or_default(), app.name_any());
        let mut map = self.samples.lock().unwrap_or_else(PoisonError::into_inner);
        let per_check = map.entry(key).or_default();
        record_run(per_check, at, analysis.measurements.iter().map(|m| (m.name.as_str(), m.value)));
    }

    fn forget(&self, app: &LenientApp) {
        let key = format!("{}/{}", app.namespace().unwrap_or_default(), app.name_any());
        self.samples.lock().unwrap_or_else(PoisonError::into_inner).remove(&key);
    }
}

/// Adds one run's values at time `at` (seconds), unless that run was recorded already. Pure.
pub fn record_run<'a>(
    per_check: &mut BTreeMap<String, Samples>,
    at: i64,
    values: impl Iterator<Item = (&'a str, Option<f64>)>,
) {
    let mut seen = std::collections::BTreeSet::new();
    for (name, value) in values {
        seen.insert(name.to_string());
        let Some(v) = value else { continue };
        let samples = per_check.entry(name.to_string()).or_default();
        if samples.last().is_some_and(|(t, _)| *t >= at) {
            continue;
        }
        samples.push((at, v));
        if samples.len() > SAMPLES_KEPT {
            samples.remove(0);
        }
    }
    // A check renamed or removed: its values go.
    per_check.retain(|name, _| seen.contains(name));
}

/// A holder change of a Lease, given the holder known before (None: first sight). Pure.
pub fn handover(known: Option<&Option<String>>, lease: &Lease, at: Timestamp) -> Option<Failover> {
    let shard = lease.metadata.name.as_deref().and_then(shard_of_lease)?;
    let now = holder(lease).map(str::to_string);
    match known {
        Some(before) if *before != now => Some(Failover { at, shard, from: before.clone(), to: now }),
        _ => None,
    }
}

/// Where the dashboard reads Apps from: one store for the cluster, or one per namespace. Each
/// App is read on its own (`LenientApp`): one that does not read as an App is kept as why, and
/// fails neither the list it came in nor the watch.
#[derive(Clone)]
pub struct AppStores(pub Vec<(Option<String>, Store<LenientApp>)>);

impl AppStores {
    /// Every App cached, shared with the stores (not copied).
    pub fn all(&self) -> Vec<Arc<LenientApp>> {
        self.0.iter().flat_map(|(_, s)| s.state()).collect()
    }

    pub fn get(&self, namespace: &str, name: &str) -> Option<LenientApp> {
        let key = reflector::ObjectRef::<LenientApp>::new(name).within(namespace);
        self.0.iter().find_map(|(_, s)| s.get(&key)).map(|a| LenientApp::clone(&a))
    }
}

/// Starts watching the Apps of `namespaces` (None: the cluster) into stores that are ready
/// once listed.
pub fn watch_apps(client: &Client, namespaces: Option<&[String]>, live: &Arc<Live>) -> AppStores {
    let apis: Vec<(Option<String>, Api<LenientApp>)> = match namespaces {
        None => vec![(None, Api::all(client.clone()))],
        Some(list) => list.iter().map(|ns| (Some(ns.clone()), Api::namespaced(client.clone(), ns))).collect(),
    };
    let mut stores = Vec::new();
    for (ns, api) in apis {
        let (reader, writer) = reflector::store();
        // Pages of 20, as the replicas list Apps: a tenant chooses their size.
        let config = watcher::Config::default().page_size(crate::app::controller::APP_LIST_PAGE);
        let stream = reflector::reflector(writer, watcher(api, config).default_backoff());
        let live = live.clone();
        tokio::spawn(follow(stream, move |event| match event {
            watcher::Event::Apply(app) | watcher::Event::InitApply(app) => {
                if let Ok(readable) = app.app() {
                    live.record(readable);
                }
                live.announce(format!("app:{}/{}", app.namespace().unwrap_or_default(), app.name_any()));
            }
            watcher::Event::Delete(app) => {
                live.forget(&app);
                live.announce(format!("app:{}/{}", app.namespace().unwrap_or_default(), app.name_any()));
            }
            watcher::Event::Init | watcher::Event::InitDone => {}
        }));
        stores.push((ns, reader));
    }
    AppStores(stores)
}

pub fn watch_tenants(client: &Client, live: &Arc<Live>) -> Store<Tenant> {
    let (reader, writer) = reflector::store();
    let stream = reflector::reflector(writer, watcher(Api::<Tenant>::all(client.clone()), watcher::Config::default()))
        .default_backoff();
    let live = live.clone();
    tokio::spawn(follow(stream, move |event| {
        if let watcher::Event::Apply(t) | watcher::Event::Delete(t) | watcher::Event::InitApply(t) = event {
            live.announce(format!("tenant:{}", t.name_any()));
        }
    }));
    reader
}

/// Follows the shard Leases of `namespace`, recording every change of holder.
pub fn watch_leases(client: &Client, namespace: &str, live: &Arc<Live>) {
    let api: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let config = watcher::Config::default().labels("flotilla.dev/lease=shard");
    let stream = watcher(api, config).default_backoff();
    let live = live.clone();
    let mut holders: HashMap<String, Option<String>> = HashMap::new();
    tokio::spawn(follow(stream, move |event| {
        if let watcher::Event::Apply(lease) | watcher::Event::InitApply(lease) = event {
            let name = lease.name_any();
            if let Some(f) = handover(holders.get(&name), &lease, Timestamp::now()) {
                let mut log = live.failovers.lock().unwrap_or_else(PoisonError::into_inner);
                log.push_back(f);
                if log.len() > FAILOVERS_KEPT {
                    log.pop_front();
                }
            }
            let now_held = holder(&lease).map(str::to_string);
            // Renewals (every few seconds per shard) are not news; a new holder is.
            if holders.get(&name) != Some(&now_held) {
                live.announce(format!("lease:{name}"));
            }
            holders.insert(name, now_held);
        }
    }));
}

/// Drives `stream` until it ends, handing each event to `on_event`; errors are retried by
/// the watcher's backoff and logged.
async fn follow<K, S>(stream: S, mut on_event: impl FnMut(watcher::Event<K>) + Send)
where
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send,
{
    let mut stream = std::pin::pin!(stream);
    while let Some(item) = stream.next().await {
        match item {
            Ok(event) => on_event(event),
            Err(e) => tracing::warn!(error = %e, "dashboard watch failed; retrying"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;

    #[test]
    fn each_run_is_kept_once_and_the_oldest_go() {
        let mut per_check = BTreeMap::new();
        record_run(&mut per_check, 5, [("renamed", Some(1.0))].into_iter());
        record_run(&mut per_check, 10, [("errors", Some(0.1)), ("latency", None)].into_iter());
        assert!(!per_check.contains_key("renamed"), "a check gone from the run is forgotten");
        record_run(&mut per_check, 10, [("errors", Some(0.1))].into_iter());
        record_run(&mut per_check, 20, [("errors", Some(0.2))].into_iter());
        assert_eq!(per_check["errors"], vec![(10, 0.1), (20, 0.2)]);
        assert!(!per_check.contains_key("latency"), "no value, no sample");
        for t in 21..(21 + SAMPLES_KEPT as i64) {
            record_run(&mut per_check, t, [("errors", Some(1.0))].into_iter());
        }
        assert_eq!(per_check["errors"].len(), SAMPLES_KEPT);
        assert_eq!(per_check["errors"][0].0, 21, "the two oldest went first");
    }

    #[test]
    fn a_handover_is_a_change_of_holder_seen_twice() {
        let lease = |holder: Option<&str>| Lease {
            metadata: kube::api::ObjectMeta { name: Some("flotilla-shard-7".into()), ..Default::default() },
            spec: Some(LeaseSpec { holder_identity: holder.map(str::to_string), ..Default::default() }),
        };
        let at = Timestamp::from_second(100).expect("ts");
        assert_eq!(handover(None, &lease(Some("a")), at), None, "first sight is no handover");
        assert_eq!(handover(Some(&Some("a".into())), &lease(Some("a")), at), None, "a renewal");
        assert_eq!(
            handover(Some(&Some("a".into())), &lease(Some("b")), at),
            Some(Failover { at, shard: 7, from: Some("a".into()), to: Some("b".into()) })
        );
    }
}
