//! End to end: a real Prometheus (Debian's `prometheus` package) scrapes a running replica
//! (with an App mid-canary, measured against an exporter);
//! every query of every dashboard panel returns data, every alerting rule loads and evaluates,
//! and promtool checks and unit-tests the rules.

mod support;

use flotilla::api::App;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::Value;
use serde_json::json;
use std::time::Duration;
use support::prometheus::{Exporter, Prometheus, Traffic, tool};
use support::rollout::ERROR_RATE;
use support::{
    Operator, admin_client, http_get, install_crds, onboarded_healthy_app, operator_kubeconfig, repo_root, wait_for,
};

fn dashboard_queries() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(repo_root().join("dashboards")).expect("dashboards/") {
        let path = entry.expect("entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        let d: Value = serde_json::from_str(&std::fs::read_to_string(&path).expect("read")).expect("dashboard JSON");
        for panel in d["panels"].as_array().into_iter().flatten() {
            for target in panel["targets"].as_array().into_iter().flatten() {
                if let Some(expr) = target["expr"].as_str() {
                    out.push((format!("{} / {}", path.display(), panel["title"]), expr.to_string()));
                }
            }
        }
    }
    out
}

#[test]
fn promtool_checks_and_unit_tests_the_rules() {
    let promtool = tool("promtool");
    let dir = repo_root().join("deploy/prometheus");
    for args in [vec!["check", "rules", "alerts.yaml"], vec!["test", "rules", "alerts_test.yaml"]] {
        let out = std::process::Command::new(&promtool).args(&args).current_dir(&dir).output().expect("promtool");
        assert!(
            out.status.success(),
            "promtool {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_the_operator_and_every_query_returns_data() {
    tool("prometheus");
    let client = admin_client().await;
    install_crds(&client).await;
    let kubeconfig = operator_kubeconfig("observability");
    let op = Operator::start_with(&kubeconfig, &[], "observability").await;

    // Some work, so that every kind of series moves.
    let ns = format!("obs-{:05x}", std::process::id() & 0xfffff);
    onboarded_healthy_app(&client, &ns, "web").await;

    // And a canary held at its first step, measured against the exporter: the rollout panels
    // (weight, values against thresholds, Apps not Healthy) have data.
    let exporter = Exporter::start().await;
    exporter.set(&ns, "shop", "2", Traffic { error_ratio: 0.01, ..Traffic::default() });
    let prometheus = Prometheus::start(
        &[("flotilla", op.admin.clone()), ("exporter", exporter.addr())],
        &[repo_root().join("deploy/prometheus/alerts.yaml")],
    )
    .await;
    let prom = prometheus.addr();
    // The platform lets this tenant's Apps query that Prometheus (queries limited to their namespace).
    let tenants: Api<flotilla::api::Tenant> = Api::all(client.clone());
    tenants
        .patch(
            &ns,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"prometheusEndpoints": [{"url": prometheus.url()}]}})),
        )
        .await
        .expect("listing the Prometheus on the Tenant");
    let apps: Api<App> = Api::namespaced(client.clone(), &ns);
    let canary: App = serde_json::from_value(json!({
        "apiVersion": "flotilla.dev/v1beta1", "kind": "App", "metadata": {"name": "shop", "namespace": ns},
        "spec": {"image": "registry.example.com/tests/shop", "version": "1", "replicas": 2,
                 "rollout": {"strategy": {"type": "Canary", "canary": {"steps": [{"weight": 50, "pause": "1h"}]}},
                             "analysis": {"interval": "2s", "prometheusUrl": prometheus.url(),
                                          "metrics": [{"name": "error-rate", "query": ERROR_RATE, "max": 0.05}]}}},
    }))
    .expect("App");
    apps.create(&PostParams::default(), &canary).await.expect("creating App");
    wait_for(Duration::from_secs(60), "App shop at version 1", || async {
        (apps.get("shop").await.ok()?.status?.current_version.as_deref() == Some("1")).then_some(())
    })
    .await;
    apps.patch("shop", &PatchParams::default(), &Patch::Merge(json!({"spec": {"version": "2"}})))
        .await
        .expect("new version");
    wait_for(Duration::from_secs(60), "canary of shop measured", || async {
        let s = apps.get("shop").await.ok()?.status?;
        s.analysis?.measurements.first()?.value.map(|_| ())
    })
    .await;
    wait_for(Duration::from_secs(30), "the operator scraped at least 3 times", || async {
        let v = prometheus.query("count_over_time(up{job=\"flotilla\"}[1m])").await;
        let n: f64 = v["data"]["result"][0]["value"][1].as_str()?.parse().ok()?;
        (n >= 3.0).then_some(())
    })
    .await;

    let mut failures = Vec::new();
    let queries = dashboard_queries();
    assert!(queries.len() >= 8, "dashboards/ has its panels");
    // A series appears with the first scrape after the state it reports (a measurement, say),
    // so each query gets a few scrape intervals to return data.
    for (panel, expr) in &queries {
        let deadline = std::time::Instant::now() + Duration::from_secs(15);
        loop {
            let v = prometheus.query(expr).await;
            let empty = v["data"]["result"].as_array().is_none_or(|r| r.is_empty());
            if v["status"] == "success" && !empty {
                break;
            }
            if std::time::Instant::now() > deadline {
                failures.push(format!("{panel}: {expr} -> {v}"));
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    let (_, rules) = http_get(&prom, "/api/v1/rules").await.expect("rules");
    let rules: Value = serde_json::from_str(&rules).expect("rules JSON");
    let loaded: Vec<&Value> = rules["data"]["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_array().into_iter().flatten())
        .collect();
    assert_eq!(loaded.len(), 7, "every alerting rule is loaded: {rules}");
    wait_for(Duration::from_secs(10), "every rule evaluated without error", || async {
        let (_, body) = http_get(&prom, "/api/v1/rules").await?;
        let v: Value = serde_json::from_str(&body).ok()?;
        let all_ok = v["data"]["groups"]
            .as_array()?
            .iter()
            .flat_map(|g| g["rules"].as_array().into_iter().flatten())
            .all(|r| r["health"] == "ok");
        all_ok.then_some(())
    })
    .await;
    assert!(failures.is_empty(), "dashboard queries without data:\n{}", failures.join("\n"));
}
