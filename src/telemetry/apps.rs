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

use crate::api::{App, AppPhase};
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

    /// Calls `each` with every served App's namespace, name and what its series read of its
    /// status, one App at a time: each App is read from its cached text as it comes and
    /// dropped before the next, so a scrape holds one App's few fields at a time, never all
    /// statuses at once.
    fn for_each_status(&self, mut each: impl FnMut(&str, &str, &ScrapedStatus)) {
        // The caches are taken under the lock, read after it: a scrape of many large Apps must
        // not hold up a namespace's controller as it starts or stops (both take the lock to
        // write).
        let stores: Vec<Store<Compact<App>>> = {
            let stores = self.stores.read().unwrap_or_else(|p| p.into_inner());
            stores.values().map(|r| r.store.clone()).collect()
        };
        for store in stores {
            for obj in store.state() {
                let status = ScrapedStatus::of(obj.json());
                let (ns, name) = (obj.meta().namespace.as_deref(), obj.meta().name.as_deref());
                each(ns.unwrap_or_default(), name.unwrap_or_default(), &status);
            }
        }
    }
}

/// What a scrape reads of an App: the fields its series use. The rest of the App (its spec,
/// and in its status the stable template, a typed pod spec many times its JSON's length, the
/// history and the conditions) is skipped as the text is read (serde's `IgnoredAny`).
#[derive(Debug, Default, PartialEq, serde::Deserialize)]
struct ScrapedStatus {
    #[serde(default)]
    phase: Option<AppPhase>,
    #[serde(default)]
    canary: Option<ScrapedCanary>,
    #[serde(default)]
    analysis: Option<ScrapedAnalysis>,
}

#[derive(Debug, PartialEq, serde::Deserialize)]
struct ScrapedCanary {
    weight: i32,
}

#[derive(Debug, Default, PartialEq, serde::Deserialize)]
struct ScrapedAnalysis {
    #[serde(default)]
    measurements: Vec<ScrapedMeasurement>,
}

#[derive(Debug, PartialEq, serde::Deserialize)]
struct ScrapedMeasurement {
    name: String,
    #[serde(default)]
    value: Option<f64>,
    #[serde(default)]
    min: Option<f64>,
    #[serde(default)]
    max: Option<f64>,
}

impl ScrapedStatus {
    /// What the series read of the App cached as `json` (none of it when its status does not
    /// read so: the App then has no series).
    fn of(json: &str) -> Self {
        #[derive(serde::Deserialize)]
        struct Scraped {
            #[serde(default)]
            status: Option<ScrapedStatus>,
        }
        serde_json::from_str::<Scraped>(json).ok().and_then(|s| s.status).unwrap_or_default()
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
        self.index.for_each_status(|ns, name, status| {
            if let Some(p) = status.phase {
                apps.with_label_values(&[p.as_str()]).inc();
                phase.with_label_values(&[ns, name, p.as_str()]).set(1);
            }
            if let Some(c) = &status.canary {
                weight.with_label_values(&[ns, name]).set(f64::from(c.weight));
            }
            for m in status.analysis.iter().flat_map(|a| a.measurements.iter()) {
                if let Some(v) = m.value {
                    value.with_label_values(&[ns, name, &m.name]).set(v);
                }
                if let Some(max) = m.max {
                    threshold.with_label_values(&[ns, name, &m.name, "max"]).set(max);
                }
                if let Some(min) = m.min {
                    threshold.with_label_values(&[ns, name, &m.name, "min"]).set(min);
                }
            }
        });
        [apps.collect(), phase.collect(), weight.collect(), value.collect(), threshold.collect()].concat()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::DynamicObject;
    use kube::runtime::reflector::store::Writer;
    use kube::runtime::watcher;

    fn cached(name: &str, status: serde_json::Value) -> Compact<App> {
        let obj: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "flotilla.dev/v1beta1", "kind": "App",
            "metadata": {"name": name, "namespace": "shop", "uid": name, "resourceVersion": "1"},
            "spec": {"image": "registry.example.com/web", "version": "2", "replicas": 0},
            "status": status,
        }))
        .expect("an App");
        Compact::of(obj)
    }

    /// The series of one family, as (its labels' values in the order of their names, joined
    /// by commas; its value).
    fn series(families: &[MetricFamily], family: &str) -> Vec<(String, f64)> {
        let Some(f) = families.iter().find(|f| f.name() == family) else { return Vec::new() };
        f.get_metric()
            .iter()
            .map(|m| {
                let labels: Vec<&str> = m.get_label().iter().map(|l| l.value()).collect();
                (labels.join(","), m.get_gauge().get_value())
            })
            .collect()
    }

    #[test]
    fn each_app_gives_its_series_from_the_fields_they_read() {
        let mut writer = Writer::<Compact<App>>::default();
        let canary = serde_json::json!({
            "phase": "Progressing", "currentVersion": "1", "targetVersion": "2",
            "canary": {"step": 1, "steps": 3, "weight": 20, "replicas": 1, "stableReplicas": 4,
                "stepStartedAt": "2026-12-01T00:00:00Z"},
            "analysis": {"failures": 0, "measurements": [
                {"name": "errors", "result": "Pass", "value": 0.5, "max": 1.0},
                {"name": "latency", "result": "Inconclusive", "min": 0.1}]},
            "conditions": [{"type": "Ready", "status": "False", "reason": "Progressing", "message": "",
                "lastTransitionTime": "2026-12-01T00:00:00Z"}],
            "stableTemplate": {"spec": {"containers": [{"name": "app", "env": [{"name": "A", "value": "b"}]}]}},
        });
        let healthy = serde_json::json!({"phase": "Healthy", "currentVersion": "2"});
        for app in [cached("web", canary), cached("api", healthy), cached("new", serde_json::json!(null))] {
            writer.apply_watcher_event(&watcher::Event::Apply(app));
        }
        let index = AppIndex::default();
        let _registration = index.register("shop", writer.as_reader(), Arc::default());
        let families = AppCollector::new(index).expect("a collector").collect();
        let mut phases = series(&families, "flotilla_app_phase");
        phases.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(phases, [("api,shop,Healthy".into(), 1.0), ("web,shop,Progressing".into(), 1.0)]);
        assert_eq!(series(&families, "flotilla_app_canary_weight_percent"), [("web,shop".into(), 20.0)]);
        assert_eq!(series(&families, "flotilla_app_analysis_value"), [("web,errors,shop".into(), 0.5)]);
        let mut bounds = series(&families, "flotilla_app_analysis_threshold");
        bounds.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(bounds, [("web,max,errors,shop".into(), 1.0), ("web,min,latency,shop".into(), 0.1)]);
        let by_phase = series(&families, "flotilla_apps");
        assert!(by_phase.contains(&("Healthy".into(), 1.0)) && by_phase.contains(&("Degraded".into(), 0.0)));
    }

    #[test]
    fn a_status_that_does_not_read_gives_no_series() {
        assert_eq!(ScrapedStatus::of(r#"{"status": {"phase": "Sleeping"}}"#), ScrapedStatus::default());
        assert_eq!(ScrapedStatus::of("not JSON"), ScrapedStatus::default());
        // Fields the series do not read are not checked.
        let read = ScrapedStatus::of(r#"{"status": {"phase": "Healthy", "canary": {"weight": 5}, "history": 7}}"#);
        assert_eq!((read.phase, read.canary.map(|c| c.weight)), (Some(AppPhase::Healthy), Some(5)));
    }
}
