//! End to end: a real trace backend (Jaeger, built from its Go module by hack/build-jaeger.sh)
//! receives the operator's spans over OTLP; each reconcile span carries tenant, namespace,
//! app, shard and result, with the API calls it made as child spans.

mod support;

use serde_json::Value;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;
use support::{Operator, admin_client, http_get, install_crds, onboarded_healthy_app, operator_kubeconfig, wait_for};

fn jaeger() -> PathBuf {
    let root = support::repo_root();
    let root = root.display();
    let status = std::process::Command::new("bash")
        .arg(format!("{root}/hack/build-jaeger.sh"))
        .stdin(Stdio::null())
        .status()
        .expect("running hack/build-jaeger.sh");
    assert!(
        status.success(),
        "building Jaeger failed: run `bash hack/build-jaeger.sh` to see why (it needs Go >= 1.26)"
    );
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!(". {root}/hack/versions.sh && echo $JAEGER_BIN/jaeger"))
        .output()
        .expect("locating jaeger");
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn tag<'a>(span: &'a Value, key: &str) -> Option<&'a Value> {
    span["tags"].as_array()?.iter().find(|t| t["key"] == key).map(|t| &t["value"])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_spans_reach_jaeger_with_their_attributes() {
    let jaeger = jaeger();
    let dir = std::env::temp_dir().join(format!("flotilla-jaeger-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let log = std::fs::File::create(dir.join("jaeger.log")).expect("log");
    // All-in-one defaults: OTLP/HTTP on 4318, the query API on 16686, memory storage.
    let _jaeger = tokio::process::Command::new(&jaeger)
        .current_dir(&dir)
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("starting jaeger");
    wait_for(Duration::from_secs(60), &format!("Jaeger ready (log: {})", dir.join("jaeger.log").display()), || async {
        http_get("127.0.0.1:16686", "/api/services").await.filter(|(c, _)| *c == 200).map(|_| ())
    })
    .await;

    let client = admin_client().await;
    install_crds(&client).await;
    let kubeconfig = operator_kubeconfig("traces");
    let env = [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"), ("OTEL_BSP_SCHEDULE_DELAY", "200")];
    let _op = Operator::start_with_env(&kubeconfig, &[], "traces", &env).await;

    let ns = format!("traced-{:05x}", std::process::id() & 0xfffff);
    onboarded_healthy_app(&client, &ns, "traced").await;

    let expected_shard = flotilla::sharding::shard_of(&ns, 32);
    let trace = wait_for(Duration::from_secs(60), "a reconcile trace of the App in Jaeger", || async {
        let (_, body) =
            http_get("127.0.0.1:16686", "/api/traces?service=flotilla&operation=reconcile&limit=200&lookback=1h")
                .await?;
        let v: Value = serde_json::from_str(&body).ok()?;
        v["data"].as_array()?.iter().find_map(|trace| {
            let spans = trace["spans"].as_array()?;
            let root = spans.iter().find(|s| {
                s["operationName"] == "reconcile" && tag(s, "app").and_then(Value::as_str) == Some("traced")
            })?;
            let root_id = root["spanID"].as_str()?;
            let children = spans
                .iter()
                .filter(|s| {
                    s["references"].as_array().into_iter().flatten().any(|r| r["spanID"].as_str() == Some(root_id))
                })
                .count();
            (children > 0).then(|| (root.clone(), children))
        })
    })
    .await;
    let (root, children) = trace;
    assert_eq!(tag(&root, "tenant").and_then(Value::as_str), Some(ns.as_str()), "tenant attribute: {root}");
    assert_eq!(tag(&root, "namespace").and_then(Value::as_str), Some(ns.as_str()), "namespace attribute: {root}");
    assert_eq!(tag(&root, "result").and_then(Value::as_str), Some("ok"), "result attribute: {root}");
    let shard = tag(&root, "shard").and_then(|v| v.as_i64().or_else(|| v.as_str()?.parse().ok()));
    assert_eq!(shard, Some(i64::from(expected_shard)), "shard attribute: {root}");
    assert!(children > 0, "the API calls of the reconcile are its child spans");
}
