//! The values of an App's checks over its rollout, from the Prometheus the dashboard's user
//! named (`--prometheus-url`), for plotting against their bounds.
//!
//! A check's query is the tenant's text. The dashboard sends it only to the user's own
//! Prometheus, never to an endpoint the App names (that would make the user's machine fetch
//! any URL a tenant wrote), and limited to the App's namespace the way the operator limits
//! queries on a shared Prometheus (`rollout::scope`), so a page never shows another
//! namespace's series.

use futures::future::join_all;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use std::collections::BTreeMap;
use std::time::Duration;

use super::model::Samples;
use crate::api::App;
use crate::api::template::version_of;
use crate::rollout::analysis::{TemplateValues, render};
use crate::rollout::prometheus::PrometheusClient;
use crate::rollout::scope::scope_to_namespace;

/// Points per plot at most: the step is the window over this.
const POINTS: i64 = 120;
/// The window shown when no rollout is under way.
const IDLE_WINDOW_SECONDS: i64 = 15 * 60;
/// How long a page waits for Prometheus.
const RANGE_TIMEOUT: Duration = Duration::from_secs(3);

/// One range query to run for a check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RangeQuery {
    pub query: String,
    pub start: i64,
    pub end: i64,
    pub step: u64,
}

/// The range query of each check of `app`, or why it is not sent. Pure.
pub fn plan(app: &App, prometheus_url: &str, now: Timestamp) -> BTreeMap<String, Result<RangeQuery, String>> {
    let Some(analysis) = app.spec.analysis() else { return BTreeMap::new() };
    let namespace = app.namespace().unwrap_or_default();
    let name = app.name_any();
    let status = app.status.clone().unwrap_or_default();
    let own = analysis
        .prometheus_url
        .as_deref()
        .is_none_or(|u| u.trim_end_matches('/') == prometheus_url.trim_end_matches('/'));
    let end = now.as_second();
    let start = status
        .rollout
        .as_ref()
        .map(|r| r.started_at.0.as_second())
        .filter(|s| *s < end)
        .unwrap_or(end - IDLE_WINDOW_SECONDS);
    let step = u64::try_from(((end - start) / POINTS).max(1)).unwrap_or(1);
    let stable = status.current_version.as_deref().map(version_of).unwrap_or_default().to_string();
    let values =
        TemplateValues { app: &name, namespace: &namespace, version: &app.spec.version, stable_version: &stable };
    analysis
        .metrics
        .iter()
        .map(|check| {
            let planned = if own {
                scope_to_namespace(&render(&check.query, &values), &namespace)
                    .map(|query| RangeQuery { query, start, end, step })
                    .map_err(|e| e.to_string())
            } else {
                Err("the App's checks use another Prometheus than the dashboard's".to_string())
            };
            (check.name.clone(), planned)
        })
        .collect()
}

/// Runs the planned queries at once, each bounded in time.
pub async fn fetch(
    client: &PrometheusClient,
    prometheus_url: &str,
    planned: BTreeMap<String, Result<RangeQuery, String>>,
) -> BTreeMap<String, Result<Samples, String>> {
    let runs = planned.into_iter().map(|(name, planned)| async move {
        let result = match planned {
            Err(why) => Err(why),
            Ok(q) => {
                let run = client.query_range(prometheus_url, &q.query, q.start, q.end, q.step);
                match tokio::time::timeout(RANGE_TIMEOUT, run).await {
                    Ok(result) => result,
                    Err(_) => Err(format!("Prometheus did not answer within {RANGE_TIMEOUT:?}")),
                }
            }
        };
        (name, result)
    });
    join_all(runs).await.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn app(prometheus: Option<&str>, query: &str) -> App {
        let mut analysis = json!({"metrics": [{"name": "errors", "query": query, "max": 0.05}]});
        if let Some(url) = prometheus {
            analysis["prometheusUrl"] = json!(url);
        }
        serde_json::from_value(json!({
            "apiVersion": "flotilla.dev/v1beta1", "kind": "App",
            "metadata": {"name": "web", "namespace": "shop"},
            "spec": {"image": "i", "version": "2", "rollout": {"analysis": analysis}},
            "status": {"currentVersion": "1+abc", "rollout": {"startedAt": "2026-12-01T10:00:00Z"}},
        }))
        .expect("App")
    }

    fn now() -> Timestamp {
        "2026-12-01T10:10:00Z".parse().expect("time")
    }

    #[test]
    fn the_window_is_the_rollout_and_the_query_is_rendered_and_scoped() {
        let q = r#"sum(rate(x{app="{{app}}",version="{{version}}",stable="{{stable_version}}"}[1m]))"#;
        let planned = plan(&app(None, q), "http://prom:9090", now());
        let got = planned["errors"].clone().expect("planned");
        assert_eq!((got.end - got.start, got.step), (600, 5));
        assert!(got.query.contains(r#"namespace="shop""#), "{}", got.query);
        assert!(got.query.contains(r#"version="2""#) && got.query.contains(r#"stable="1""#), "{}", got.query);
        assert!(got.query.contains(r#"app="web""#), "{}", got.query);
    }

    #[test]
    fn another_namespace_or_another_prometheus_is_never_asked() {
        let foreign = plan(&app(None, r#"up{namespace="kube-system"}"#), "http://prom:9090", now());
        assert!(foreign["errors"].as_ref().is_err_and(|m| m.contains("kube-system")), "{foreign:?}");
        let elsewhere = plan(&app(Some("http://169.254.169.254/"), "up"), "http://prom:9090", now());
        assert!(elsewhere["errors"].as_ref().is_err_and(|m| m.contains("another Prometheus")), "{elsewhere:?}");
        let same = plan(&app(Some("http://prom:9090/"), "up"), "http://prom:9090", now());
        assert!(same["errors"].is_ok(), "{same:?}");
    }
}
