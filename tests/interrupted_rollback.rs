//! End to end: a rollback is never undone, whichever write the replica that decided it died
//! after. A canary fails its analysis; the replica rolling it back is killed (by the
//! `FLOTILLA_FAULT_ABORT_AFTER_WRITES` fault: abort right after its n-th accepted write, on
//! the production path) at every point of the rollback; the canary's metrics then recover, so
//! a replica that lost the decision would measure a pass and promote the version that was
//! just judged bad. The next replica must complete the rollback instead.

mod support;

use flotilla::api::{AppPhase, MeasurementResult};
use serde_json::json;
use std::process::Stdio;
use std::time::{Duration, Instant};
use support::rollout::{ERROR_RATE, Rig, error_rate_check, image_of};
use support::{Operator, kubeconfig, wait_for};
use tokio::process::Command;

/// The writes of a rollback from a canary of one replica beside one stable replica: the
/// status that records the decision, the stable Deployment scaled back, the canary deleted.
const ROLLBACK_WRITES: u32 = 3;

async fn error_ratio(rig: &Rig, version: &str) -> Option<f64> {
    let query =
        ERROR_RATE.replace("{{namespace}}", &rig.ns.name).replace("{{app}}", "web").replace("{{version}}", version);
    let v = rig.prometheus.query(&query).await;
    v["data"]["result"][0]["value"][1].as_str().and_then(|s| s.parse().ok())
}

/// Waits until Prometheus reports `version`'s error ratio as `check` wants it.
async fn wait_ratio(rig: &Rig, version: &str, what: &str, check: impl Fn(f64) -> bool) {
    wait_for(Duration::from_secs(40), what, || async {
        error_ratio(rig, version).await.filter(|r| check(*r)).map(|_| ())
    })
    .await;
}

async fn interrupted_at(n: u32) {
    let mut rig = Rig::start(&format!("rb{n}")).await;
    rig.create(
        "web",
        json!({"replicas": 2, "rollout": {
            "strategy": {"type": "Canary", "canary": {"steps": [{"weight": 50}]}},
            "analysis": {"interval": "2s", "failureLimit": 1, "metrics": error_rate_check()}}}),
    )
    .await;
    // Version 2 has no traffic yet: its canary waits at step 1 for data.
    rig.set_version("web", "2").await;
    rig.wait_until("web", "canary at step 1 waiting for data", |app| {
        let s = app.status.as_ref()?;
        (s.phase == Some(AppPhase::Paused)
            && s.canary.is_some()
            && s.analysis.as_ref()?.last_result == Some(MeasurementResult::Inconclusive))
        .then_some(())
    })
    .await;

    // The stable Deployment gave the canary its replica: the rollback has all three writes.
    wait_for(Duration::from_secs(30), "stable Deployment at 1 replica beside the canary", || async {
        let stable = rig.deployment("web").await?;
        (stable.spec.and_then(|s| s.replicas) == Some(1)).then_some(())
    })
    .await;

    // The replica that ran it so far goes; the canary turns bad.
    rig.operator.child.kill().await.expect("killing the first replica");
    rig.traffic("web", "2", 0.5, 0.05);
    wait_ratio(&rig, "2", "version 2 failing in Prometheus", |r| r > 0.05).await;

    // The next replica judges the canary failed and dies after its n-th write of the rollback.
    let log = std::env::temp_dir().join(format!("flotilla-e2e-{}-abort-{n}.log", rig.ns.name));
    let mut dying = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args([
            "run",
            "--namespace",
            &rig.ns.name,
            "--prometheus-url",
            &rig.prometheus.url(),
            "--analysis-min-interval",
            "1s",
        ])
        .args(["--conversion-webhook=false", "--admin-addr", "127.0.0.1:0", "--webhook-addr", "127.0.0.1:0"])
        .arg("--kubeconfig")
        .arg(kubeconfig())
        .args(["--replica-id", &format!("e2e-{}-abort", rig.ns.name)])
        .env("RUST_LOG", "info,flotilla=debug")
        .env("FLOTILLA_FAULT_ABORT_AFTER_WRITES", n.to_string())
        .stdout(Stdio::from(std::fs::File::create(&log).expect("log file")))
        .stderr(Stdio::from(std::fs::File::create(log.with_extension("err")).expect("log file")))
        .kill_on_drop(true)
        .spawn()
        .expect("starting the replica that will abort");
    let exit = tokio::time::timeout(Duration::from_secs(60), dying.wait())
        .await
        .unwrap_or_else(|_| panic!("the replica did not abort after write {n} within 60 s (log: {})", log.display()))
        .expect("waiting for the replica");
    assert!(!exit.success(), "the replica aborted after write {n}: {exit:?}");

    // The canary recovers: only a decision that survived keeps it rolled back.
    rig.traffic("web", "2", 0.0, 0.05);
    wait_ratio(&rig, "2", "version 2 passing in Prometheus", |r| r <= 0.0).await;
    let _next = Operator::start_with(
        kubeconfig(),
        &["--namespace", &rig.ns.name, "--prometheus-url", &rig.prometheus.url(), "--conversion-webhook=false"],
        &format!("e2e-{}-next", rig.ns.name),
    )
    .await;
    let started = Instant::now();
    loop {
        let s = rig.app("web").await.status.unwrap_or_default();
        assert_ne!(
            s.current_version.as_deref(),
            Some("2"),
            "killed after write {n}: the rolled-back version was promoted"
        );
        if let Some(stable) = rig.deployment("web").await {
            assert_eq!(
                image_of(&stable),
                "registry.example.com/tests/web:1",
                "killed after write {n}: the stable Deployment runs the failed version"
            );
        }
        if s.phase == Some(AppPhase::RolledBack) && rig.deployment("web-canary").await.is_none() {
            assert_eq!(s.failed_version.map(|f| f.version).as_deref(), Some("2"));
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "killed after write {n}: the rollback was not completed in 30 s: {:?}",
            (s.phase, s.canary, s.failed_version)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // And it stays so while the canary's metrics pass.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let s = rig.app("web").await.status.unwrap_or_default();
    assert_eq!((s.phase, s.current_version.as_deref()), (Some(AppPhase::RolledBack), Some("1")), "after write {n}");
    assert!(rig.deployment("web-canary").await.is_none(), "killed after write {n}: the canary came back");
    // Nobody changed the Deployments by hand: completing the stored rollback is told as
    // Flotilla's own change, never as drift put back (which an alert on drift would count).
    let reasons = rig.event_reasons("web").await;
    assert!(
        !reasons.iter().any(|r| r == "DriftCorrected"),
        "killed after write {n}: completing the rollback was told as drift: {reasons:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rollback_interrupted_after_any_write_is_completed_never_undone() {
    futures::future::join_all((1..=ROLLBACK_WRITES).map(interrupted_at)).await;
}
