//! Per-App series (phase, canary weight, latest measurements against their bounds), computed
//! at scrape time from the App caches of the namespaces this replica serves, the way
//! kube-state-metrics does: nothing to forget when an App is deleted or a namespace moves to
//! another replica, because its cache goes with it.

use kube::Resource;
use kube::runtime::reflector::Store;
use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{GaugeVec, IntGaugeVec, Opts};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use crate::api::{App, AppPhase, AppStatus};
use crate::watch_cache::Compact;

/// A namespace's App cache, when it was registered, and whether all of the namespace's
/// caches (Apps, Deployments, Services) have had their first list.
struct Registered {
    store: Store<Compact<App>>,
    since: std::time::Instant,
    caches_synced: Arc<AtomicBool>,
}

/// The App caches of the namespaces served here, by namespace.
#[derive(Clone, Default)]
pub struct AppIndex {
    stores: Arc<RwLock<BTreeMap<String, Registered>>>,
}

/// Removes its namespace's cache from the index when dropped (when the namespace's
/// controller stops, however it stops).
pub struct Registration {
    index: AppIndex,
    namespace: String,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.index.stores.write().unwrap_or_else(|p| p.into_inner()).remove(&self.namespace);
    }
}

impl AppIndex {
    /// Adds the App cache of `namespace` (`""` for a cluster-wide cache) until the returned
    /// registration is dropped; `caches_synced` turns true once all of the namespace's
    /// caches have listed.
    pub fn register(
        &self,
        namespace: &str,
        store: Store<Compact<App>>,
        caches_synced: Arc<AtomicBool>,
    ) -> Registration {
        self.stores
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(namespace.to_string(), Registered { store, since: std::time::Instant::now(), caches_synced });
        Registration { index: self.clone(), namespace: namespace.to_string() }
    }

    /// How many served namespaces, registered less than `within` ago, have caches still
    /// filling (Apps, Deployments or Services not listed yet). Readiness waits for them.
    pub fn caches_filling(&self, within: std::time::Duration) -> usize {
        let stores = self.stores.read().unwrap_or_else(|p| p.into_inner());
        stores.values().filter(|r| r.since.elapsed() < within && !r.caches_synced.load(Ordering::SeqCst)).count()
    }

    /// How many served namespaces' App caches, registered less than `within` ago, have not
    /// had their first list yet (an older one that never lists, for want of rights, is not
    /// waited for).
    pub fn unsynced(&self, within: std::time::Duration) -> usize {
        use futures::FutureExt;
        let stores = self.stores.read().unwrap_or_else(|p| p.into_inner());
        stores
            .values()
            .filter(|r| r.since.elapsed() < within && r.store.wait_until_ready().now_or_never().is_none())
            .count()
    }

    /// How many Apps the served namespaces' caches hold.
    pub fn count(&self) -> usize {
        let stores = self.stores.read().unwrap_or_else(|p| p.into_inner());
        stores.values().map(|r| r.store.state().len()).sum()
    }

    /// Every served App's (namespace, name, status).
    fn statuses(&self) -> Vec<(String, String, AppStatus)> {
        /// What a scrape parses of an App's JSON: its status (none when it does not parse).
        #[derive(serde::Deserialize)]
        struct StatusOf {
            #[serde(default)]
            status: Option<AppStatus>,
        }
        // Taken under the lock, parsed after it: a scrape of many large Apps must not hold up
        // a namespace's controller as it starts or stops (both take the lock to write).
        let apps: Vec<_> = {
            let stores = self.stores.read().unwrap_or_else(|p| p.into_inner());
            stores.values().flat_map(|r| r.store.state()).collect()
        };
        apps.iter()
            .map(|obj| {
                let status =
                    serde_json::from_str::<StatusOf>(obj.json()).ok().and_then(|o| o.status).unwrap_or_default();
                let ns = obj.meta().namespace.clone().unwrap_or_default();
                let name = obj.meta().name.clone().unwrap_or_default();
                (ns, name, status)
            })
            .collect()
    }
}

const PHASES: [AppPhase; 5] =
    [AppPhase::Healthy, AppPhase::Progressing, AppPhase::Paused, AppPhase::Degraded, AppPhase::RolledBack];

/// The collector registered in the operator's registry.
pub struct AppCollector {
    index: AppIndex,
    descs: Vec<Desc>,
}

fn families() -> Result<(IntGaugeVec, IntGaugeVec, GaugeVec, GaugeVec, GaugeVec), prometheus::Error> {
    Ok((
        IntGaugeVec::new(Opts::new("flotilla_apps", "Apps served by this replica, by phase."), &["phase"])?,
        IntGaugeVec::new(
            Opts::new("flotilla_app_phase", "1 for the phase each App served here is in."),
            &["namespace", "app", "phase"],
        )?,
        GaugeVec::new(
            Opts::new(
                "flotilla_app_canary_weight_percent",
                "Share of replicas on the new version of a canary under way.",
            ),
            &["namespace", "app"],
        )?,
        GaugeVec::new(
            Opts::new("flotilla_app_analysis_value", "Latest value of each analysis check of an App."),
            &["namespace", "app", "metric"],
        )?,
        GaugeVec::new(
            Opts::new(
                "flotilla_app_analysis_threshold",
                "Bounds of each analysis check of an App (bound: max or min).",
            ),
            &["namespace", "app", "metric", "bound"],
        )?,
    ))
}

impl AppCollector {
    pub fn new(index: AppIndex) -> Result<Self, prometheus::Error> {
        let (a, b, c, d, e) = families()?;
        let descs = [a.desc(), b.desc(), c.desc(), d.desc(), e.desc()].into_iter().flatten().cloned().collect();
        Ok(Self { index, descs })
    }
}

impl Collector for AppCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let Ok((apps, phase, weight, value, threshold)) = families() else {
            return Vec::new();
        };
        for p in &PHASES {
            apps.with_label_values(&[p.as_str()]).set(0);
        }
        for (ns, name, status) in self.index.statuses() {
            if let Some(p) = status.phase {
                apps.with_label_values(&[p.as_str()]).inc();
                phase.with_label_values(&[&ns, &name, p.as_str()]).set(1);
            }
            if let Some(c) = &status.canary {
                weight.with_label_values(&[&ns, &name]).set(f64::from(c.weight));
            }
            for m in status.analysis.iter().flat_map(|a| a.measurements.iter()) {
                if let Some(v) = m.value {
                    value.with_label_values(&[&ns, &name, &m.name]).set(v);
                }
                if let Some(max) = m.max {
                    threshold.with_label_values(&[&ns, &name, &m.name, "max"]).set(max);
                }
                if let Some(min) = m.min {
                    threshold.with_label_values(&[&ns, &name, &m.name, "min"]).set(min);
                }
            }
        }
        [apps.collect(), phase.collect(), weight.collect(), value.collect(), threshold.collect()].concat()
    }
}
