//! Taking one analysis run for an App: render every check's query, run them against the
//! App's Prometheus (concurrently, each with a timeout) and judge the answers.

use futures::future::join_all;

use super::analysis::{QueryOutcome, TemplateValues, judge, render};
use super::prometheus::{ClientError, PrometheusClient};
use crate::api::{App, Measurement, MeasurementResult};
use crate::telemetry::Metrics;

/// The operator's way to measure: one HTTP client, and the Prometheus used when an App
/// names none.
#[derive(Clone, Debug)]
pub struct Analyzer {
    client: PrometheusClient,
    default_url: Option<String>,
}

impl Analyzer {
    pub fn new(default_url: Option<String>) -> Result<Self, ClientError> {
        Ok(Self { client: PrometheusClient::new()?, default_url: default_url.filter(|u| !u.trim().is_empty()) })
    }

    /// Runs every check of `app` once. Never fails: what cannot be measured is an
    /// inconclusive (or invalid) measurement, which never lets a rollout advance.
    #[tracing::instrument(skip_all, fields(namespace = app.metadata.namespace.as_deref().unwrap_or_default(), app = app.metadata.name.as_deref().unwrap_or_default()))]
    pub async fn measure(&self, app: &App, stable_version: &str, metrics: &Metrics) -> Vec<Measurement> {
        let Some(analysis) = app.spec.analysis() else {
            return Vec::new();
        };
        let url = analysis.prometheus_url.clone().or_else(|| self.default_url.clone());
        let values = TemplateValues {
            app: app.metadata.name.as_deref().unwrap_or_default(),
            namespace: app.metadata.namespace.as_deref().unwrap_or_default(),
            version: &app.spec.version,
            stable_version,
        };
        let runs = analysis.metrics.iter().map(|check| {
            let url = url.clone();
            let query = render(&check.query, &values);
            async move {
                let outcome = match url {
                    Some(url) => self.client.query(&url, &query).await,
                    None => QueryOutcome::Invalid(
                        "no Prometheus to ask: set spec.rollout.analysis.prometheusUrl or start the operator with --prometheus-url"
                            .into(),
                    ),
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
        measurements
    }
}
