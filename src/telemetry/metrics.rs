//! Prometheus metrics of the operator, in one registry served on `/metrics`.

use prometheus::{
    Encoder, Gauge, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry, TextEncoder,
};
use std::time::Duration;

use super::apps::{AppCollector, AppIndex};

/// Every metric the operator exports. Names follow Prometheus conventions: units in the
/// name, `_total` for counters.
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    reconciles: IntCounterVec,
    reconcile_duration: HistogramVec,
    errors: IntCounterVec,
    drift_corrections: IntCounterVec,
    namespaces_served: IntGauge,
    apps_waiting_for_turn: IntGauge,
    namespace_connections: IntGauge,
    apps_not_onboarded: IntCounter,
    shards_held: IntGauge,
    shards_configured: IntGauge,
    lease_events: IntCounterVec,
    seconds_since_renew: Gauge,
    measurements: IntCounterVec,
    rollouts: IntCounterVec,
    rollbacks: IntCounterVec,
    conversions: IntCounterVec,
    writes_fenced: IntCounter,
    shards_unowned: IntGauge,
    app_budget: IntGauge,
    budget_reached: IntGauge,
    apps: AppIndex,
}

#[derive(Debug, thiserror::Error)]
#[error("registering metric: {0}")]
pub struct MetricsError(#[from] prometheus::Error);

impl Metrics {
    pub fn new() -> Result<Self, MetricsError> {
        let registry = Registry::new();
        let reconciles = IntCounterVec::new(
            Opts::new("flotilla_reconciles_total", "Reconciles by controller and result (ok or error)."),
            &["controller", "result"],
        )?;
        let reconcile_duration = HistogramVec::new(
            HistogramOpts::new("flotilla_reconcile_duration_seconds", "Time one reconcile took.")
                .buckets(vec![0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0]),
            &["controller"],
        )?;
        let errors = IntCounterVec::new(
            Opts::new(
                "flotilla_reconcile_errors_total",
                "Failed reconciles by controller and error kind (conflict, refused, invalid, fenced, transient).",
            ),
            &["controller", "kind"],
        )?;
        let drift_corrections = IntCounterVec::new(
            Opts::new(
                "flotilla_drift_corrections_total",
                "Managed objects put back after someone changed them, by kind.",
            ),
            &["kind"],
        )?;
        let namespaces_served = IntGauge::new(
            "flotilla_namespaces_served",
            "Onboarded namespaces this replica runs an App controller for.",
        )?;
        let apps_waiting_for_turn = IntGauge::new(
            "flotilla_apps_waiting_for_turn",
            "Apps waiting in their namespace's line for a reconcile turn (--reconciles-per-namespace).",
        )?;
        let namespace_connections = IntGauge::new(
            "flotilla_namespace_connections",
            "Connections to the apiserver that carry the served namespaces' watches and requests.",
        )?;
        let apps_not_onboarded = IntCounter::new(
            "flotilla_apps_not_onboarded_total",
            "Apps found in a namespace no Tenant onboarded (marked NamespaceNotOnboarded, not acted on).",
        )?;
        let shards_held = IntGauge::new("flotilla_shards_held", "Shard Leases this replica holds.")?;
        let shards_configured =
            IntGauge::new("flotilla_shards_configured", "Number of shards namespaces are hashed into (--shards).")?;
        registry.register(Box::new(shards_configured.clone()))?;
        let lease_events = IntCounterVec::new(
            Opts::new(
                "flotilla_lease_transitions_total",
                "Shard Lease transitions of this replica (acquired, lost, released).",
            ),
            &["event"],
        )?;
        let seconds_since_renew = Gauge::new(
            "flotilla_lease_seconds_since_renew",
            "Longest time since this replica last renewed one of its shard Leases.",
        )?;
        let measurements = IntCounterVec::new(
            Opts::new(
                "flotilla_analysis_measurements_total",
                "Analysis measurements taken, by result (pass, fail, inconclusive, invalid).",
            ),
            &["result"],
        )?;
        let rollouts = IntCounterVec::new(
            Opts::new(
                "flotilla_rollouts_total",
                "Rollouts that ended, by result (Promoted, RolledBack, Reverted, Superseded).",
            ),
            &["result"],
        )?;
        let rollbacks = IntCounterVec::new(
            Opts::new(
                "flotilla_rollbacks_total",
                "Rollouts rolled back, by reason (AnalysisFailed, ProgressDeadlineExceeded, Aborted).",
            ),
            &["reason"],
        )?;
        let conversions = IntCounterVec::new(
            Opts::new(
                "flotilla_conversions_total",
                "Objects the conversion webhook was asked to convert, by result (ok, error).",
            ),
            &["result"],
        )?;
        let apps = AppIndex::default();
        registry.register(Box::new(AppCollector::new(apps.clone())?))?;
        registry.register(Box::new(measurements.clone()))?;
        registry.register(Box::new(rollouts.clone()))?;
        registry.register(Box::new(rollbacks.clone()))?;
        registry.register(Box::new(conversions.clone()))?;
        let writes_fenced = IntCounter::new(
            "flotilla_writes_fenced_total",
            "Writes dropped when they were to be sent, because this replica's hold on the namespace's shard had lapsed while they waited.",
        )?;
        registry.register(Box::new(writes_fenced.clone()))?;
        let shards_unowned = IntGauge::new(
            "flotilla_shards_unowned",
            "Shards no live replica holds, as this replica sees the Leases (free, or held by a replica that stopped renewing).",
        )?;
        let app_budget = IntGauge::new(
            "flotilla_app_budget",
            "The most Apps this replica serves before it takes no more shards (--memory-budget); -1 when unlimited.",
        )?;
        let budget_reached = IntGauge::new(
            "flotilla_shard_budget_reached",
            "1 while the Apps this replica serves fill its memory budget: it takes no more shards, and its peers share the rest (or leave them unowned).",
        )?;
        registry.register(Box::new(shards_unowned.clone()))?;
        registry.register(Box::new(app_budget.clone()))?;
        registry.register(Box::new(budget_reached.clone()))?;
        registry.register(Box::new(shards_held.clone()))?;
        registry.register(Box::new(lease_events.clone()))?;
        registry.register(Box::new(seconds_since_renew.clone()))?;
        registry.register(Box::new(namespaces_served.clone()))?;
        registry.register(Box::new(apps_waiting_for_turn.clone()))?;
        registry.register(Box::new(namespace_connections.clone()))?;
        registry.register(Box::new(apps_not_onboarded.clone()))?;
        registry.register(Box::new(reconciles.clone()))?;
        registry.register(Box::new(reconcile_duration.clone()))?;
        registry.register(Box::new(errors.clone()))?;
        registry.register(Box::new(drift_corrections.clone()))?;
        // Series exist from the start (at zero), so that rate() and dashboards see them before
        // the first event of each kind.
        for controller in ["app", "tenant", "guard"] {
            for result in ["ok", "error"] {
                reconciles.with_label_values(&[controller, result]);
            }
            for kind in ["conflict", "refused", "invalid", "fenced", "transient"] {
                errors.with_label_values(&[controller, kind]);
            }
        }
        for kind in ["Deployment", "HorizontalPodAutoscaler", "Service"] {
            drift_corrections.with_label_values(&[kind]);
        }
        for event in ["acquired", "lost", "released"] {
            lease_events.with_label_values(&[event]);
        }
        for result in ["pass", "fail", "inconclusive", "invalid"] {
            measurements.with_label_values(&[result]);
        }
        for result in ["Promoted", "RolledBack", "Reverted", "Superseded"] {
            rollouts.with_label_values(&[result]);
        }
        for reason in ["AnalysisFailed", "ProgressDeadlineExceeded", "Aborted"] {
            rollbacks.with_label_values(&[reason]);
        }
        for result in ["ok", "error"] {
            conversions.with_label_values(&[result]);
        }
        Ok(Self {
            registry,
            reconciles,
            reconcile_duration,
            errors,
            drift_corrections,
            namespaces_served,
            apps_waiting_for_turn,
            namespace_connections,
            apps_not_onboarded,
            shards_held,
            shards_configured,
            lease_events,
            seconds_since_renew,
            measurements,
            rollouts,
            rollbacks,
            conversions,
            writes_fenced,
            shards_unowned,
            app_budget,
            budget_reached,
            apps,
        })
    }

    pub fn shards_unowned(&self, n: usize) {
        self.shards_unowned.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// The replica's budget in Apps (`None`: unlimited) and whether its Apps fill it.
    pub fn app_budget(&self, max_apps: Option<usize>, reached: bool) {
        self.app_budget.set(max_apps.map_or(-1, |n| i64::try_from(n).unwrap_or(i64::MAX)));
        self.budget_reached.set(i64::from(reached));
    }

    pub fn reconciled(&self, controller: &str, took: Duration, error_kind: Option<&str>) {
        let result = if error_kind.is_some() { "error" } else { "ok" };
        self.reconciles.with_label_values(&[controller, result]).inc();
        self.reconcile_duration.with_label_values(&[controller]).observe(took.as_secs_f64());
        if let Some(kind) = error_kind {
            self.errors.with_label_values(&[controller, kind]).inc();
        }
    }

    /// Where App controllers register their caches for the per-App series.
    pub fn app_index(&self) -> &AppIndex {
        &self.apps
    }

    pub fn measured(&self, result: &str) {
        self.measurements.with_label_values(&[result]).inc();
    }

    /// A rollout ended with `result`; `reason` says why when it was rolled back.
    pub fn rollout_ended(&self, result: &str, reason: Option<&str>) {
        self.rollouts.with_label_values(&[result]).inc();
        if let Some(reason) = reason {
            self.rollbacks.with_label_values(&[reason]).inc();
        }
    }

    /// The conversion webhook answered a review of `objects` objects.
    pub fn converted(&self, objects: usize, ok: bool) {
        let n = u64::try_from(objects).unwrap_or(u64::MAX);
        self.conversions.with_label_values(&[if ok { "ok" } else { "error" }]).inc_by(n);
    }

    /// The counter of writes the wire fence dropped (see `operator::wire_fence`).
    pub fn writes_fenced(&self) -> IntCounter {
        self.writes_fenced.clone()
    }

    pub fn drift_corrected(&self, kind: &str) {
        self.drift_corrections.with_label_values(&[kind]).inc();
    }

    pub fn namespaces_served(&self, n: usize) {
        self.namespaces_served.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// The count of Apps waiting in the namespaces' lines (`app::namespace_turns`), which
    /// each line moves as Apps join and leave it.
    pub fn apps_waiting_for_turn(&self) -> IntGauge {
        self.apps_waiting_for_turn.clone()
    }

    pub fn namespace_connections(&self, n: usize) {
        self.namespace_connections.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    pub fn shards_held(&self, n: usize, seconds_since_renew: f64) {
        self.shards_held.set(i64::try_from(n).unwrap_or(i64::MAX));
        self.seconds_since_renew.set(seconds_since_renew);
    }

    pub fn shards_configured(&self, n: u32) {
        self.shards_configured.set(i64::from(n));
    }

    pub fn lease_event(&self, event: &str) {
        self.lease_events.with_label_values(&[event]).inc();
    }

    pub fn app_not_onboarded(&self) {
        self.apps_not_onboarded.inc();
    }

    /// The registry in Prometheus' text exposition format.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        let encoder = TextEncoder::new();
        if let Err(e) = encoder.encode(&self.registry.gather(), &mut buf) {
            tracing::warn!(error = %e, "encoding metrics");
        }
        String::from_utf8_lossy(&buf).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_with_labels() {
        let m = Metrics::new().expect("metrics");
        m.reconciled("app", Duration::from_millis(3), None);
        m.reconciled("app", Duration::from_millis(3), Some("refused"));
        let text = m.render();
        assert!(text.contains(r#"flotilla_reconciles_total{controller="app",result="ok"} 1"#), "{text}");
        assert!(text.contains(r#"flotilla_reconcile_errors_total{controller="app",kind="refused"} 1"#), "{text}");
        assert!(text.contains("flotilla_reconcile_duration_seconds_bucket"), "{text}");
    }
}
