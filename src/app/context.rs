//! State shared by every reconcile of the App controller.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::Service;
use kube::runtime::reflector::Store;
use kube::{Client, Resource, ResourceExt};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

use super::memos::Memos;

use crate::api::{AnalysisStatus, AppStatus};
use tokio::sync::watch;

use crate::api::Tenant;
use crate::rollout::endpoints::Refusal;
use crate::rollout::{Analyzer, Asker, Run};
use crate::sharding::fence::Fence;
use crate::telemetry::Metrics;
use crate::watch_cache::{Compact, Demand, OnDemand};

/// The caches of managed objects, and one flag per always-watched cache that turns true
/// once it holds its first full list. HPAs and ConfigMaps are watched on demand.
pub struct Caches {
    pub deployments: Store<Compact<Deployment>>,
    pub hpas: Store<HorizontalPodAutoscaler>,
    pub services: Store<Compact<Service>>,
    pub config_maps: Store<crate::app::config_map_key::ConfigMapKey>,
    pub synced: Vec<watch::Receiver<bool>>,
    pub hpa_watch: OnDemand,
    pub config_map_watch: OnDemand,
}

/// Which of the caches watched on demand a reconcile reads.
#[derive(Clone, Copy, Debug, Default)]
pub struct Needs {
    /// The App autoscales.
    pub hpas: bool,
    /// The App's template reads a ConfigMap.
    pub config_maps: bool,
}

/// Handed to every reconcile: the client, the caches of managed objects, Events and metrics.
pub struct Context {
    pub client: Client,
    pub events: crate::telemetry::events::EventWriter,
    pub metrics: Metrics,
    /// Deployments labelled as managed by Flotilla, in the namespaces this replica serves, as
    /// projections (`projection`) kept as text (read with `deployment`).
    deployments: Store<Compact<Deployment>>,
    /// HorizontalPodAutoscalers labelled as managed by Flotilla (watched once an App of the
    /// namespace autoscales, or one was there at start: see `hpa_watch`).
    pub hpas: Store<HorizontalPodAutoscaler>,
    /// Services labelled as managed by Flotilla, kept as text (read with `service`).
    services: Store<Compact<Service>>,
    /// Every ConfigMap in the served namespaces, as its key and the fingerprint of its data
    /// (`config_map_key`), watched once an App of the namespace reads one.
    pub config_maps: Store<crate::app::config_map_key::ConfigMapKey>,
    hpa_watch: OnDemand,
    config_map_watch: OnDemand,
    /// Takes the measurements that gate rollouts.
    pub analyzer: Analyzer,
    synced: Vec<watch::Receiver<bool>>,
    /// Set when sharded: every write checks that this replica still owns the namespace.
    pub fence: Option<Fence>,
    /// The tenant whose namespace this controller serves (for spans and logs).
    pub tenant: Option<String>,
    /// The Tenants as this replica sees them: which Prometheus endpoints the tenant may use.
    pub tenants: Option<Store<Tenant>>,
    /// Slots shared by the reconciles of every served namespace (see `reconcile`).
    pub slots: Option<Arc<tokio::sync::Semaphore>>,
    /// This namespace's turns, taken before a slot (`namespace_turns`).
    pub namespace_turns: crate::app::namespace_turns::NamespaceTurns,
    /// Pod annotations a tenant may not set.
    pub pod_policy: Arc<crate::app::pod_policy::PodPolicy>,
    /// Consecutive failures per App (`memos`).
    failures: Mutex<Memos<u32>>,
    /// The fingerprint of the status this replica last wrote per App, until the cache shows it.
    written: Mutex<Memos<Written>>,
    /// Services this replica applied, until the Service cache shows them.
    applied_services: Mutex<Memos<Applied>>,
    /// The latest analysis run per App that was not written (`status::run_may_wait`), with
    /// the version it measured (the status' target).
    unwritten_runs: Mutex<Memos<(AnalysisStatus, Option<String>)>>,
}

/// The resourceVersion this replica's apply returned.
type Applied = Option<String>;

/// The fingerprint of a status this replica wrote (`status_fingerprint`).
type Written = Option<u64>;

/// How long a written status may take to show in the cache before the cache is trusted anyway.
const WRITE_VISIBLE_WITHIN: Duration = Duration::from_secs(10);
/// How long an applied Service is read from the apiserver while the cache does not show it
/// (under load a watch event can take longer than a status does; the read gives the truth,
/// so a deletion in that time is still put back).
const APPLY_VISIBLE_WITHIN: Duration = Duration::from_secs(60);
/// How long an App's count of consecutive failures is kept after its last failure: longer
/// than the longest retry delay (`error::retry_delay`, 300 s), so an App that keeps failing
/// keeps its count, and the count of one deleted meanwhile goes.
const FAILURES_KEPT: Duration = Duration::from_secs(600);

impl Context {
    pub fn new(
        client: Client,
        events: crate::telemetry::events::EventWriter,
        metrics: Metrics,
        caches: Caches,
        analyzer: Analyzer,
    ) -> Self {
        let Caches { deployments, hpas, services, config_maps, synced, hpa_watch, config_map_watch } = caches;
        Self {
            client,
            events,
            metrics,
            deployments,
            hpas,
            services,
            config_maps,
            hpa_watch,
            config_map_watch,
            analyzer,
            synced,
            fence: None,
            tenant: None,
            tenants: None,
            slots: None,
            namespace_turns: Default::default(),
            pod_policy: Arc::default(),
            failures: Mutex::new(Memos::new(FAILURES_KEPT)),
            written: Mutex::new(Memos::new(WRITE_VISIBLE_WITHIN)),
            applied_services: Mutex::new(Memos::new(APPLY_VISIBLE_WITHIN)),
            unwritten_runs: Mutex::new(Memos::new(crate::app::status::FRESH_FOR)),
        }
    }

    /// Waits until the caches hold their initial lists, so that a missing object in the
    /// cache really means missing. The caches watched on demand that `needs` names are
    /// started; the others are waited for only if they run (one not running holds nothing,
    /// rightly: see `OnDemand`).
    /// False when a cache never will be (its watch went first: the controller is stopping).
    pub async fn wait_for_caches(&self, needs: Needs) -> bool {
        for flag in &self.synced {
            if !crate::watch_cache::synced(flag).await {
                return false;
            }
        }
        self.hpa_watch.ready(needs.hpas).await && self.config_map_watch.ready(needs.config_maps).await
    }

    /// Whether the caches are synced now, as `wait_for_caches` would find them without
    /// waiting; starts the on-demand ones `needs` asks for (both, whatever the first says).
    pub fn caches_synced_now(&self, needs: Needs) -> bool {
        let listed = self.synced.iter().all(|flag| *flag.borrow());
        let hpas = self.hpa_watch.ready_now(needs.hpas);
        let config_maps = self.config_map_watch.ready_now(needs.config_maps);
        listed && hpas && config_maps
    }

    /// Like `wait_for_caches`, but gives up after `limit`; false when the caches are not synced.
    pub async fn caches_synced_within(&self, limit: std::time::Duration, needs: Needs) -> bool {
        tokio::time::timeout(limit, self.wait_for_caches(needs)).await.unwrap_or(false)
    }

    /// The cached Deployment `name` of `namespace` (a projection: see `projection`).
    pub fn deployment(&self, namespace: &str, name: &str) -> Result<Option<Arc<Deployment>>, serde_json::Error> {
        read_back(&self.deployments, namespace, name)
    }

    /// The cached Service `name` of `namespace`.
    pub fn service(&self, namespace: &str, name: &str) -> Result<Option<Arc<Service>>, serde_json::Error> {
        read_back(&self.services, namespace, name)
    }

    /// Whether HPAs are watched (not idle, not being probed).
    pub fn hpas_watched(&self) -> bool {
        self.hpa_watch.demand() == Demand::Started
    }

    fn key(obj: &impl Resource) -> (String, String) {
        (obj.namespace().unwrap_or_default(), obj.name_any())
    }

    /// What the config stamp needs to know of the ConfigMaps `names` in `namespace`: absent,
    /// untracked, or present with a fingerprint of its data, as the cache holds them (the
    /// fingerprint is of the data only, so a change of labels or annotations, or a rewrite by
    /// the apiserver (storage migration), is not a new config). Never fails: kept async and
    /// fallible for its callers, as it read the data of a changed ConfigMap before.
    pub async fn config_states(
        &self,
        namespace: &str,
        names: &std::collections::BTreeSet<String>,
    ) -> Result<HashMap<String, crate::app::config::ConfigState>, kube::Error> {
        use crate::app::config::ConfigState;
        let mut out = HashMap::new();
        for name in names {
            let cached = self.config_maps.get(&kube::runtime::reflector::ObjectRef::new(name).within(namespace));
            let state = match cached {
                None => ConfigState::Absent,
                Some(cm) if cm.untracked() => ConfigState::Untracked,
                Some(cm) => ConfigState::Present(cm.data_fingerprint().to_string()),
            };
            out.insert(name.clone(), state);
        }
        Ok(out)
    }

    /// Whether this replica may write in `namespace` now (always, when not sharded).
    pub fn may_write(&self, namespace: &str) -> bool {
        self.fence.as_ref().is_none_or(|f| f.may_write(namespace))
    }

    /// Counts one more consecutive failure of this App and returns the count.
    pub fn count_failure(&self, obj: &impl Resource) -> u32 {
        let mut failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        *failures.update(Self::key(obj), |n| n.unwrap_or(0).saturating_add(1))
    }

    /// Remembers the status just written for an App, as its fingerprint: a status is about
    /// 2.5 KB, and a replica that starts thousands of Apps at once held them all (8.5 MiB of
    /// its peak at 3,333 Apps, `bench/heap.sh`).
    pub fn remember_written(&self, namespace: &str, name: &str, status: AppStatus) {
        let mut written = self.written.lock().unwrap_or_else(|p| p.into_inner());
        written.update((namespace.to_string(), name.to_string()), |_| status_fingerprint(&status));
    }

    /// Whether the cached App predates the status this replica last wrote for it: planning
    /// from it would undo that write (for example re-create a canary just rolled back).
    pub fn cache_behind(&self, namespace: &str, name: &str, cached: Option<&AppStatus>) -> bool {
        let mut written = self.written.lock().unwrap_or_else(|p| p.into_inner());
        let key = (namespace.to_string(), name.to_string());
        let Some((fingerprint, at)) = written.get(&key) else { return false };
        if !write_pending(*fingerprint, *at, cached) {
            written.forget(&key);
            return false;
        }
        true
    }

    /// Remembers an analysis run that was not written (it decided nothing new), so that the
    /// App's next reconcile plans from it: its next run is due an interval after it, not at
    /// once, and a step may move on it.
    pub fn remember_unwritten_run(&self, namespace: &str, name: &str, run: AnalysisStatus, target: Option<String>) {
        let mut runs = self.unwritten_runs.lock().unwrap_or_else(|p| p.into_inner());
        runs.update((namespace.to_string(), name.to_string()), |_| (run, target));
    }

    /// The run not written that is newer than the `stored` one and judged alike, if there is
    /// one; else it is forgotten (the stored status moved on, or said something else).
    fn unwritten_run(&self, namespace: &str, name: &str, stored: Option<&AppStatus>) -> Option<AnalysisStatus> {
        let mut runs = self.unwritten_runs.lock().unwrap_or_else(|p| p.into_inner());
        let key = (namespace.to_string(), name.to_string());
        let ((run, target), at) = runs.get(&key)?;
        let before = stored.and_then(|s| s.analysis.as_ref());
        // Of the same version, judged alike, newer than the stored run, and not older than a
        // memo is of use (a sweep may not have come by yet).
        let newer = at.elapsed() <= crate::app::status::FRESH_FOR
            && stored.is_some_and(|s| s.target_version == *target)
            && before.is_some_and(|b| {
                crate::app::status::same_outcome(b, run)
                    && run.last_run.as_ref().map(|t| t.0) > b.last_run.as_ref().map(|t| t.0)
            });
        if newer {
            return Some(run.clone());
        }
        runs.forget(&key);
        None
    }

    /// Lays the run not written (`unwritten_run`) over `status`, the App's stored one, for
    /// planning.
    pub fn lay_unwritten_run(&self, namespace: &str, name: &str, status: Option<&mut AppStatus>) {
        let run = self.unwritten_run(namespace, name, status.as_deref());
        if let (Some(status), Some(run)) = (status, run) {
            status.analysis = Some(run);
        }
    }

    /// Forgets the run not written, once a status with it (or a later one) is written.
    pub fn forget_unwritten_run(&self, namespace: &str, name: &str) {
        let mut runs = self.unwritten_runs.lock().unwrap_or_else(|p| p.into_inner());
        runs.forget(&(namespace.to_string(), name.to_string()));
    }

    /// Remembers the resourceVersion of a Service this replica just applied.
    pub fn remember_applied_service(&self, namespace: &str, name: &str, resource_version: Option<String>) {
        let mut applied = self.applied_services.lock().unwrap_or_else(|p| p.into_inner());
        applied.update((namespace.to_string(), name.to_string()), |_| resource_version);
    }

    /// Whether the cache may not show a Service this replica applied moments ago: the App is
    /// often reconciled again (for its Deployment's progress) before the Service's watch event
    /// arrives, and comparing with the cache then would apply the Service a second time. The
    /// caller reads the Service from the apiserver instead (a read, not a write).
    pub fn service_cache_behind(&self, namespace: &str, name: &str, cached: Option<&Service>) -> bool {
        let mut applied = self.applied_services.lock().unwrap_or_else(|p| p.into_inner());
        let key = (namespace.to_string(), name.to_string());
        let behind = cache_behind_apply(applied.get(&key), cached.and_then(|c| c.metadata.resource_version.as_deref()));
        if !behind {
            applied.forget(&key);
        }
        behind
    }

    /// Takes one analysis run of `app`, with the Prometheus endpoints its Tenant allows (none
    /// without a Tenant that has this namespace onboarded: then only the operator's default).
    pub async fn measure(&self, app: &crate::api::App, stable_version: &str) -> Run {
        let namespace = app.metadata.namespace.as_deref().unwrap_or_default();
        let tenant = self.tenant_of(namespace);
        let endpoints = tenant.as_ref().map(|t| t.spec.prometheus_endpoints.as_slice()).unwrap_or_default();
        let key = self.tenant.as_deref().unwrap_or(namespace);
        self.analyzer.measure(app, stable_version, Asker { key, endpoints }, &self.metrics).await
    }

    /// Why `app` may not use the Prometheus it names, if it may not (nothing is fetched).
    pub fn analysis_refusal(&self, app: &crate::api::App) -> Option<Refusal> {
        let tenant = self.tenant_of(app.metadata.namespace.as_deref().unwrap_or_default());
        self.analyzer.refusal(app, tenant.as_ref().map(|t| t.spec.prometheus_endpoints.as_slice()).unwrap_or_default())
    }

    /// What `app`'s pod asks for that its Tenant's pod policy does not allow, if anything:
    /// its spec's template, and the stable template its status keeps (the stable Deployment
    /// is rendered from it, scaled and rolled back to, whatever the spec says now).
    pub fn pod_policy_violation(&self, app: &crate::api::App) -> Option<crate::app::tenant_pods::Violation> {
        let tenant = self.tenant_of(app.metadata.namespace.as_deref().unwrap_or_default())?;
        let policy = tenant.spec.pod_policy.as_ref()?;
        crate::app::tenant_pods::check(policy, app.spec.template.as_ref()).or_else(|| {
            let stable = app.status.as_ref()?.stable_template.as_ref()?;
            let v = crate::app::tenant_pods::check(policy, Some(stable))?;
            let field = v.field.replacen("spec.template", "status.stableTemplate", 1);
            Some(crate::app::tenant_pods::Violation { field, why: format!("{} (the stable version's pod)", v.why) })
        })
    }

    /// The Tenant of this controller, when it has `namespace` onboarded.
    fn tenant_of(&self, namespace: &str) -> Option<Arc<Tenant>> {
        self.tenant
            .as_ref()
            .zip(self.tenants.as_ref())
            .and_then(|(name, store)| store.get(&kube::runtime::reflector::ObjectRef::new(name)))
            .filter(|t| crate::tenancy::served::served_namespaces([&**t]).contains_key(namespace))
    }

    /// A reconcile slot (see `reconcile`), when slots are bounded.
    pub async fn slot(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        match &self.slots {
            Some(slots) => slots.clone().acquire_owned().await.ok(),
            None => None,
        }
    }

    pub fn reset_failures(&self, obj: &impl Resource) {
        self.failures.lock().unwrap_or_else(|p| p.into_inner()).forget(&Self::key(obj));
    }
}

/// The object `name` of `namespace` in `cache`, parsed back. An entry that does not parse
/// (each was written from the same type, so only one whose text was too large to keep:
/// another writer made it so) is an error, which fails the reconcile
/// (`ReconcileError::unreadable`): planning from a part of the object could write over the rest.
fn read_back<K>(cache: &Store<Compact<K>>, namespace: &str, name: &str) -> Result<Option<Arc<K>>, serde_json::Error>
where
    K: kube::Resource<DynamicType = ()> + serde::de::DeserializeOwned,
{
    let key = kube::runtime::reflector::ObjectRef::new(name).within(namespace);
    cache.get(&key).map(|cached| cached.parse().map(Arc::new)).transpose()
}

/// A status's fingerprint: a keyed hash (SipHash, with a key drawn once per process, so that
/// no one can craft two statuses that collide) of its JSON, which serde writes in field order
/// with every map sorted. Equal fingerprints mean the cache shows the status written; a status
/// that reads back differently (a float one step off) only waits out `WRITE_VISIBLE_WITHIN`,
/// as with `==` before. `None` when the status cannot be written as JSON (it always can).
fn status_fingerprint(status: &AppStatus) -> Option<u64> {
    static KEY: std::sync::OnceLock<std::collections::hash_map::RandomState> = std::sync::OnceLock::new();
    let json = serde_json::to_vec(status).ok()?;
    Some(std::hash::BuildHasher::hash_one(KEY.get_or_init(Default::default), json))
}

/// Whether a status written at `at` (its fingerprint `written`) is still to show in the cache,
/// which shows `cached`: it does not show it yet, and the write is recent. A fingerprint that
/// could not be made matches nothing: the wait ends only with `WRITE_VISIBLE_WITHIN`.
fn write_pending(written: Option<u64>, at: Instant, cached: Option<&AppStatus>) -> bool {
    let shown = written.is_some() && cached.and_then(status_fingerprint) == written;
    !shown && at.elapsed() <= WRITE_VISIBLE_WITHIN
}

/// Whether the cache (showing `cached`, a resourceVersion) may not yet show the object this
/// replica applied (`applied`): it shows another version and the apply is recent.
fn cache_behind_apply(applied: Option<&(Applied, Instant)>, cached: Option<&str>) -> bool {
    applied.is_some_and(|(version, at)| version.as_deref() != cached && at.elapsed() <= APPLY_VISIBLE_WITHIN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recent_apply_the_cache_does_not_show_is_read_from_the_apiserver() {
        let now = (Some("5".to_string()), Instant::now());
        assert!(cache_behind_apply(Some(&now), None), "the cache has not seen it yet");
        assert!(cache_behind_apply(Some(&now), Some("4")), "the cache shows an older version");
        assert!(!cache_behind_apply(Some(&now), Some("5")), "the cache caught up");
        assert!(!cache_behind_apply(None, None), "nothing applied: the cache decides");
        let old = (Some("7".to_string()), Instant::now() - APPLY_VISIBLE_WITHIN - Duration::from_secs(1));
        assert!(!cache_behind_apply(Some(&old), None), "an old apply: the cache decides");
    }

    #[test]
    fn a_written_status_is_pending_until_the_cache_shows_that_status() {
        let written = AppStatus { current_version: Some("v2".into()), ..AppStatus::default() };
        let before = AppStatus { current_version: Some("v1".into()), ..AppStatus::default() };
        let fingerprint = status_fingerprint(&written);
        let now = Instant::now();
        assert!(write_pending(fingerprint, now, Some(&before)), "the cache shows the status before the write");
        assert!(write_pending(fingerprint, now, None), "the cache shows no status yet");
        assert!(!write_pending(fingerprint, now, Some(&written.clone())), "the cache shows the write");
        let old = now - WRITE_VISIBLE_WITHIN - Duration::from_secs(1);
        assert!(!write_pending(fingerprint, old, Some(&before)), "an old write: the cache decides");
    }

    /// A measured value comes back from the apiserver as the shortest text that names it
    /// (what serde writes too): read back, the status must be the one written, or every
    /// status with a measurement would wait out `WRITE_VISIBLE_WITHIN` for a float a step off
    /// (serde_json parses exactly only with its `float_roundtrip` feature).
    #[test]
    fn a_status_with_measured_values_reads_back_as_written() {
        use crate::api::rollout::{AnalysisStatus, Measurement, MeasurementResult};
        let mut off = Vec::new();
        for i in 1..2000u32 {
            let value = f64::from(i) / 7.0 * 0.0013 + 1.0 / f64::from(i + 2);
            let written = AppStatus {
                analysis: Some(AnalysisStatus {
                    measurements: vec![Measurement {
                        name: "error-rate".into(),
                        result: MeasurementResult::Pass,
                        value: Some(value),
                        min: None,
                        max: Some(0.05),
                        message: None,
                    }],
                    ..AnalysisStatus::default()
                }),
                ..AppStatus::default()
            };
            let text = serde_json::to_string(&written).expect("a status writes as JSON");
            let read: AppStatus = serde_json::from_str(&text).expect("and reads back");
            if status_fingerprint(&read) != status_fingerprint(&written) {
                off.push(value);
            }
        }
        assert!(off.is_empty(), "{} of 1,999 values read back otherwise, e.g. {:?}", off.len(), off.first());
    }
}
