//! Taking one analysis run for an App: choose the Prometheus the platform allows it, render
//! every check's query and limit it to the App's namespace on a shared Prometheus, run them
//! (concurrently, each with a timeout) and judge the answers.
//!
//! Runs take turns: at most `AnalysisLimits::per_tenant` runs of one tenant and
//! `AnalysisLimits::per_replica` runs in all are in flight at once, so a tenant whose
//! Prometheus hangs holds only its own turns (the reconciler releases its reconcile slot while
//! it waits here, see `app::reconcile`).

use futures::future::join_all;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::analysis::{QueryOutcome, TemplateValues, judge, render};
use super::endpoints::{Endpoint, Refusal, choose};
use super::prometheus::{ClientError, PrometheusClient};
use super::scope::{ScopeError, scope_to_namespace};
use crate::api::{App, Measurement, MeasurementResult, TenantPrometheus};
use crate::telemetry::Metrics;

/// How long a run waits for a turn before it is inconclusive: the turns are held by runs
/// whose Prometheus hangs (a run that answers ends within `QUERY_TIMEOUT`).
pub const TURN_WAIT: std::time::Duration = super::prometheus::QUERY_TIMEOUT;

/// How many analysis runs may be in flight at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AnalysisLimits {
    pub per_replica: usize,
    pub per_tenant: usize,
}

impl Default for AnalysisLimits {
    fn default() -> Self {
        Self { per_replica: 32, per_tenant: 8 }
    }
}

/// The operator's way to measure: one HTTP client, the Prometheus used when an App names
/// none, and the turns runs take.
#[derive(Clone, Debug)]
pub struct Analyzer {
    client: PrometheusClient,
    default_url: Option<String>,
    limits: AnalysisLimits,
    replica: Arc<Semaphore>,
    tenants: Arc<Mutex<HashMap<String, Arc<Semaphore>>>>,
}

/// Who asks: the tenant whose turns a run takes, and the endpoints its Tenant lists.
#[derive(Clone, Copy, Debug, Default)]
pub struct Asker<'a> {
    /// The tenant's name (or, without tenancy, the namespace).
    pub key: &'a str,
    pub endpoints: &'a [TenantPrometheus],
}

/// One run: a measurement per check, and the refusal when the App may not use the
/// Prometheus it names (then nothing was fetched).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Run {
    pub measurements: Vec<Measurement>,
    pub refusal: Option<Refusal>,
}

impl Analyzer {
    pub fn new(default_url: Option<String>, limits: AnalysisLimits) -> Result<Self, ClientError> {
        let limits = AnalysisLimits { per_replica: limits.per_replica.max(1), per_tenant: limits.per_tenant.max(1) };
        Ok(Self {
            client: PrometheusClient::new()?,
            default_url: default_url.filter(|u| !u.trim().is_empty()),
            limits,
            replica: Arc::new(Semaphore::new(limits.per_replica)),
            tenants: Arc::default(),
        })
    }

    /// Waits for a turn of `tenant`, then one of the replica.
    async fn turn(&self, tenant: &str) -> Option<(OwnedSemaphorePermit, OwnedSemaphorePermit)> {
        let own = {
            let mut tenants = self.tenants.lock().unwrap_or_else(|p| p.into_inner());
            // Tenants with no run in flight or waiting are forgotten.
            tenants.retain(|_, s| Arc::strong_count(s) > 1);
            tenants
                .entry(tenant.to_string())
                .or_insert_with(|| Arc::new(Semaphore::new(self.limits.per_tenant)))
                .clone()
        };
        let own = own.acquire_owned().await.ok()?;
        let all = self.replica.clone().acquire_owned().await.ok()?;
        Some((own, all))
    }

    /// Why `app` may not use the Prometheus it names (`None` when it may, or has no analysis).
    pub fn refusal(&self, app: &App, endpoints: &[TenantPrometheus]) -> Option<Refusal> {
        let analysis = app.spec.analysis()?;
        choose(analysis.prometheus_url.as_deref(), self.default_url.as_deref(), endpoints).err()
    }

    /// Runs every check of `app` once. Never fails: what cannot be measured is an
    /// inconclusive (or invalid) measurement, which never lets a rollout advance.
    #[tracing::instrument(skip_all, fields(namespace = app.metadata.namespace.as_deref().unwrap_or_default(), app = app.metadata.name.as_deref().unwrap_or_default()))]
    pub async fn measure(&self, app: &App, stable_version: &str, asker: Asker<'_>, metrics: &Metrics) -> Run {
        let Some(analysis) = app.spec.analysis() else {
            return Run::default();
        };
        let namespace = app.metadata.namespace.as_deref().unwrap_or_default();
        let endpoint = choose(analysis.prometheus_url.as_deref(), self.default_url.as_deref(), asker.endpoints);
        let values = TemplateValues {
            app: app.metadata.name.as_deref().unwrap_or_default(),
            namespace,
            version: &app.spec.version,
            stable_version,
        };
        // Each check's query as it will be sent, or the outcome it has without asking.
        let prepared: Vec<Result<String, QueryOutcome>> = analysis
            .metrics
            .iter()
            .map(|check| {
                let query = render(&check.query, &values);
                match &endpoint {
                    Err(refusal) => Err(QueryOutcome::Invalid(refusal.to_string())),
                    Ok(Endpoint { scoped: false, .. }) => Ok(query),
                    Ok(Endpoint { scoped: true, .. }) => scope_to_namespace(&query, namespace).map_err(|e| match e {
                        ScopeError::ForeignNamespace { .. } => QueryOutcome::Inconclusive(e.to_string()),
                        ScopeError::Parse { .. } | ScopeError::Unscoped { .. } => QueryOutcome::Invalid(e.to_string()),
                    }),
                }
            })
            .collect();
        // No turn within TURN_WAIT: the runs in flight hang (queries end within their
        // timeout). Nothing is asked then; the reconcile ends instead of waiting on, holding
        // one of its namespace's few reconciles in flight (`app::controller::controller_config`).
        let (_turn, no_turn) = match (&endpoint, prepared.iter().any(Result::is_ok)) {
            (Ok(_), true) => match tokio::time::timeout(TURN_WAIT, self.turn(asker.key)).await {
                Ok(turn) => (turn, None),
                Err(_) => (
                    None,
                    Some(format!(
                        "no analysis run of this replica could start within {}s: its {} runs for tenant {} or its {} runs in all are in flight",
                        TURN_WAIT.as_secs(),
                        self.limits.per_tenant,
                        asker.key,
                        self.limits.per_replica
                    )),
                ),
            },
            _ => (None, None),
        };
        let runs = analysis.metrics.iter().zip(prepared).map(|(check, prepared)| {
            let endpoint = endpoint.as_ref().ok();
            let no_turn = no_turn.clone();
            async move {
                let outcome = match (prepared, endpoint) {
                    (Ok(_), Some(_)) if no_turn.is_some() => QueryOutcome::Inconclusive(no_turn.unwrap_or_default()),
                    (Ok(query), Some(endpoint)) => self.client.query(&endpoint.url, &query).await,
                    (Err(outcome), _) => outcome,
                    (Ok(_), None) => QueryOutcome::Invalid("no Prometheus to ask".into()),
                };
                judge(check, &outcome)
            }
        });
        let measurements = join_all(runs).await;
        for m in &measurements {
            metrics.measured(match m.result {
                MeasurementResult::Pass => "pass",
                MeasurementResult::Fail => "fail",
                MeasurementResult::Inconclusive => "inconclusive",
                MeasurementResult::Invalid => "invalid",
            });
        }
        Run { measurements, refusal: endpoint.err() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A tenant that used up its turns (its Prometheus hangs) leaves the others theirs.
    #[tokio::test]
    async fn one_tenant_cannot_take_another_tenants_turns() {
        let a = Analyzer::new(None, AnalysisLimits { per_replica: 4, per_tenant: 2 }).expect("analyzer");
        let held = [a.turn("greedy").await, a.turn("greedy").await];
        assert!(held.iter().all(Option::is_some));
        let third = tokio::time::timeout(Duration::from_millis(100), a.turn("greedy")).await;
        assert!(third.is_err(), "a third run of the same tenant waits");
        let other = tokio::time::timeout(Duration::from_millis(100), a.turn("quiet")).await;
        assert!(other.is_ok_and(|t| t.is_some()), "another tenant gets a turn at once");
    }

    /// A run that finds every turn held (their Prometheus hangs) stops waiting after
    /// TURN_WAIT, asks nothing and is inconclusive: a rollout never advances on it, and the
    /// reconcile that waited gives back its namespace's turn. The clock is paused.
    #[tokio::test(start_paused = true)]
    async fn a_run_that_gets_no_turn_is_inconclusive_after_the_turn_wait() {
        // Nothing listens on port 9: a query sent would fail at once, as Inconclusive too,
        // but with another message.
        let a = Analyzer::new(Some("http://127.0.0.1:9".into()), AnalysisLimits { per_replica: 4, per_tenant: 1 })
            .expect("analyzer");
        let app: App = serde_json::from_value(serde_json::json!({
            "apiVersion": "flotilla.dev/v1beta1", "kind": "App",
            "metadata": {"name": "checkout", "namespace": "shop"},
            "spec": {"image": "registry.example.com/shop/checkout", "version": "1.5.0", "replicas": 1,
                     "rollout": {"analysis": {"metrics": [
                         {"name": "errors", "query": "sum(rate(errors[1m]))", "max": 0.05},
                         {"name": "latency", "query": "max(latency)", "max": 0.5}]}}}
        }))
        .expect("an App");
        let metrics = Metrics::new().expect("metrics");
        let held = a.turn("shop").await;
        assert!(held.is_some());
        let started = tokio::time::Instant::now();
        let run = tokio::time::timeout(
            TURN_WAIT * 3,
            a.measure(&app, "1.4.0", Asker { key: "shop", endpoints: &[] }, &metrics),
        )
        .await
        .expect("the run ends without a turn");
        let waited = started.elapsed();
        assert!(
            waited >= TURN_WAIT && waited < TURN_WAIT + Duration::from_secs(1),
            "it waited the turn wait: {waited:?}"
        );
        assert_eq!(run.measurements.len(), 2);
        for m in &run.measurements {
            assert_eq!(m.result, MeasurementResult::Inconclusive, "{m:?}");
            assert!(m.message.as_deref().unwrap_or_default().contains("no analysis run"), "{m:?}");
        }
        drop(held);
        let started = tokio::time::Instant::now();
        let run = a.measure(&app, "1.4.0", Asker { key: "shop", endpoints: &[] }, &metrics).await;
        assert!(started.elapsed() < TURN_WAIT, "with a turn free it does not wait for one");
        assert!(run.measurements.iter().all(|m| !m.message.as_deref().unwrap_or_default().contains("no analysis run")));
    }
}
