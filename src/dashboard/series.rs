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

use super::model::Ranges;
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

/// What to ask for one check: its query for the new version (or why it is not sent), and
/// for the stable version during a rollout when the query names the version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Planned {
    pub values: Result<RangeQuery, String>,
    pub stable: Option<RangeQuery>,
}

/// The range queries of each check of `app`. Pure.
pub fn plan(app: &App, prometheus_url: &str, now: Timestamp) -> BTreeMap<String, Planned> {
    let Some(analysis) = app.spec.analysis() else { return BTreeMap::new() };
    let namespace = app.namespace().unwrap_or_default();
    let name = app.name_any();
    let status = app.status.clone().unwrap_or_default();
    let own = analysis
        .prometheus_url
        .as_deref()
        .is_none_or(|u| u.trim_end_matches('/') == prometheus_url.trim_end_matches('/'));
    let end = now.as_second();
    let started = status.rollout.as_ref().map(|r| r.started_at.0.as_second()).filter(|s| *s < end);
    let start = started.unwrap_or(end - IDLE_WINDOW_SECONDS);
    let step = u64::try_from(((end - start) / POINTS).max(1)).unwrap_or(1);
    let stable = status.current_version.as_deref().map(version_of).unwrap_or_default().to_string();
    let values =
        TemplateValues { app: &name, namespace: &namespace, version: &app.spec.version, stable_version: &stable };
    // The stable version's series, through the same query with {{version}} set to it.
    let stable_values = TemplateValues { version: &stable, ..values.clone() };
    let scoped = |query: String| {
        scope_to_namespace(&query, &namespace)
            .map(|query| RangeQuery { query, start, end, step })
            .map_err(|e| e.to_string())
    };
    analysis
        .metrics
        .iter()
        .map(|check| {
            if !own {
                let why = "the App's checks use another Prometheus than the dashboard's".to_string();
                return (check.name.clone(), Planned { values: Err(why), stable: None });
            }
            let query = render(&check.query, &values);
            let stable_query = render(&check.query, &stable_values);
            let stable = (started.is_some() && !stable.is_empty() && stable_query != query)
                .then(|| scoped(stable_query).ok())
                .flatten();
            (check.name.clone(), Planned { values: scoped(query), stable })
        })
        .collect()
}

/// Runs the planned queries at once, each bounded in time.
pub async fn fetch(
    client: &PrometheusClient,
    prometheus_url: &str,
    planned: BTreeMap<String, Planned>,
) -> BTreeMap<String, Ranges> {
    let ask = |q: RangeQuery| async move {
        let run = client.query_range(prometheus_url, &q.query, q.start, q.end, q.step);
        match tokio::time::timeout(RANGE_TIMEOUT, run).await {
            Ok(result) => result,
            Err(_) => Err(format!("Prometheus did not answer within {RANGE_TIMEOUT:?}")),
        }
    };
    let runs = planned.into_iter().map(|(name, planned)| async move {
        let values = async {
            match planned.values {
                Err(why) => Err(why),
                Ok(q) => ask(q).await,
            }
        };
        let stable = async {
            match planned.stable {
                Some(q) => ask(q).await.unwrap_or_default(),
                None => Vec::new(),
            }
        };
        let (values, stable) = futures::join!(values, stable);
        (name, Ranges { values: Some(values), stable })
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
        let got = planned["errors"].values.clone().expect("planned");
        assert_eq!((got.end - got.start, got.step), (600, 5));
        assert!(got.query.contains(r#"namespace="shop""#), "{}", got.query);
        assert!(got.query.contains(r#"version="2""#) && got.query.contains(r#"stable="1""#), "{}", got.query);
        assert!(got.query.contains(r#"app="web""#), "{}", got.query);
        let stable = planned["errors"].stable.clone().expect("the stable version's query, during a rollout");
        assert!(
            stable.query.contains(r#"version="1""#) && stable.query.contains(r#"namespace="shop""#),
            "{}",
            stable.query
        );
        assert_eq!((stable.start, stable.end), (got.start, got.end));
        // A query that does not name the version has no second line.
        assert_eq!(plan(&app(None, "sum(up)"), "http://prom:9090", now())["errors"].stable, None);
    }

    #[test]
    fn another_namespace_or_another_prometheus_is_never_asked() {
        let foreign = plan(&app(None, r#"up{namespace="kube-system"}"#), "http://prom:9090", now());
        assert!(foreign["errors"].values.as_ref().is_err_and(|m| m.contains("kube-system")), "{foreign:?}");
        let elsewhere = plan(&app(Some("http://169.254.169.254/"), "up"), "http://prom:9090", now());
        assert!(elsewhere["errors"].values.as_ref().is_err_and(|m| m.contains("another Prometheus")), "{elsewhere:?}");
        assert_eq!(elsewhere["errors"].stable, None);
        let same = plan(&app(Some("http://prom:9090/"), "up"), "http://prom:9090", now());
        assert!(same["errors"].values.is_ok(), "{same:?}");
    }
}
