//! End to end: a real Prometheus (Debian's `prometheus` package) scrapes a running replica;
//! every query of every dashboard panel returns data, every alerting rule loads and evaluates,
//! and promtool checks and unit-tests the rules.

mod support;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use support::{Operator, admin_client, http_get, install_crds, onboarded_healthy_app, operator_kubeconfig, wait_for};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// promtool and prometheus come from Debian's `prometheus` package (hack/prerequisites.sh
/// installs it); their absence is a failure that says so.
fn tool(name: &str) -> PathBuf {
    for dir in ["/usr/bin", "/usr/local/bin"] {
        let p = Path::new(dir).join(name);
        if p.exists() {
            return p;
        }
    }
    panic!(
        "{name} not found: install Debian's prometheus package (`apt-get install prometheus`), which `bash hack/prerequisites.sh` does"
    );
}

fn encode(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

async fn query(prom: &str, expr: &str) -> Value {
    let (code, body) =
        http_get(prom, &format!("/api/v1/query?query={}", encode(expr))).await.expect("Prometheus answers");
    let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    assert_eq!(code, 200, "query {expr} failed: {body}");
    v
}

fn dashboard_queries() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(repo().join("dashboards")).expect("dashboards/") {
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
    let dir = repo().join("deploy/prometheus");
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
    let prometheus = tool("prometheus");
    let client = admin_client().await;
    install_crds(&client).await;
    let kubeconfig = operator_kubeconfig();
    let op = Operator::start_with(&kubeconfig, &[], "observability").await;

    // Some work, so that every kind of series moves.
    let ns = format!("obs-{:05x}", std::process::id() & 0xfffff);
    onboarded_healthy_app(&client, &ns, "web").await;

    let dir = std::env::temp_dir().join(format!("flotilla-prometheus-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("prometheus dir");
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("port");
    let config = format!(
        "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\n\
         rule_files: [{}]\n\
         scrape_configs:\n  - job_name: flotilla\n    static_configs: [{{targets: ['{}']}}]\n",
        repo().join("deploy/prometheus/alerts.yaml").display(),
        op.admin
    );
    std::fs::write(dir.join("prometheus.yml"), config).expect("config");
    let log = std::fs::File::create(dir.join("prometheus.log")).expect("log");
    let _prom = tokio::process::Command::new(prometheus)
        .arg(format!("--config.file={}", dir.join("prometheus.yml").display()))
        .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("starting prometheus");
    let prom = format!("127.0.0.1:{port}");
    wait_for(Duration::from_secs(30), "Prometheus ready", || async {
        http_get(&prom, "/-/ready").await.filter(|(c, _)| *c == 200).map(|_| ())
    })
    .await;
    wait_for(Duration::from_secs(30), "the operator scraped at least 3 times", || async {
        let v = query(&prom, "count_over_time(up{job=\"flotilla\"}[1m])").await;
        let n: f64 = v["data"]["result"][0]["value"][1].as_str()?.parse().ok()?;
        (n >= 3.0).then_some(())
    })
    .await;

    let mut failures = Vec::new();
    let queries = dashboard_queries();
    assert!(queries.len() >= 8, "dashboards/ has its panels");
    for (panel, expr) in &queries {
        let v = query(&prom, expr).await;
        let empty = v["data"]["result"].as_array().is_none_or(|r| r.is_empty());
        if v["status"] != "success" || empty {
            failures.push(format!("{panel}: {expr} -> {v}"));
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
    assert_eq!(loaded.len(), 4, "every alerting rule is loaded: {rules}");
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
