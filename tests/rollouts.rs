//! End to end, against the local control plane and a real Prometheus scraping an exporter
//! whose per-version traffic the test sets: canary promotion, rollback on a failed metric,
//! missing data, an invalid query, a rolling update's availability, reverting and
//! superseding versions, canaries with an autoscaler, a latency gate, and manual control
//! through the CLI.

mod support;

use flotilla::api::{AppPhase, MeasurementResult, RolloutResult};
use serde_json::json;
use std::time::{Duration, Instant};
use support::kubeconfig;
use support::recorder::Recorder;
use support::rollout::{P99_MS, Rig, analysis, condition, error_rate_check, image_of};

fn canary(steps: serde_json::Value) -> serde_json::Value {
    json!({"type": "Canary", "canary": {"steps": steps}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_good_canary_passes_every_step_and_is_promoted() {
    let rig = Rig::start("ro-good").await;
    rig.traffic("web", "1", 0.0, 0.05);
    rig.traffic("web", "2", 0.01, 0.05);
    rig.create(
        "web",
        json!({"replicas": 4, "rollout": {"strategy": canary(json!([{"weight": 25, "pause": "2s"}, {"weight": 50, "pause": "2s"}])),
               "analysis": analysis(error_rate_check())}}),
    )
    .await;
    rig.wait_for_data("web", "2").await;
    rig.set_version("web", "2").await;

    let mut biggest_canary = 0;
    let mut weights = Vec::new();
    let started = Instant::now();
    let app = loop {
        let app = rig.app("web").await;
        let s = app.status.clone().unwrap_or_default();
        if let Some(c) = &s.canary {
            biggest_canary = biggest_canary.max(c.replicas);
            if weights.last() != Some(&c.weight) {
                weights.push(c.weight);
            }
        }
        assert_ne!(s.phase, Some(AppPhase::RolledBack), "a good canary was rolled back: {:?}", s.conditions);
        if s.phase == Some(AppPhase::Healthy) && s.current_version.as_deref() == Some("2") {
            break app;
        }
        assert!(started.elapsed() < Duration::from_secs(120), "not promoted in 120 s: {s:?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert!(weights.starts_with(&[25]) && weights.contains(&50), "went through the steps: {weights:?}");
    assert!((1..=3).contains(&biggest_canary), "canary of 1..3 of 4 replicas: {biggest_canary}");
    let s = app.status.expect("status");
    assert_eq!(s.history[0].result, RolloutResult::Promoted);
    assert!(s.canary.is_none());
    // The promotion is written to status first, then the canary is deleted (persist first):
    // the deletion follows within a reconcile, as in the bad-canary test.
    support::wait_for(Duration::from_secs(20), "canary Deployment removed after promotion", || async {
        rig.deployment("web-canary").await.is_none().then_some(())
    })
    .await;
    let stable = rig.deployment("web").await.expect("stable");
    assert_eq!(image_of(&stable), "registry.example.com/tests/web:2");
    let m = &s.analysis.expect("analysis").measurements[0];
    assert_eq!((m.name.as_str(), m.result), ("error-rate", MeasurementResult::Pass));
    rig.wait_events("web", &["RolloutStarted", "StepCompleted", "Promoted"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_canary_is_rolled_back_and_the_stable_deployment_never_changes() {
    let rig = Rig::start("ro-bad").await;
    rig.traffic("web", "2", 0.5, 0.05);
    rig.create(
        "web",
        json!({"replicas": 3, "rollout": {"strategy": canary(json!([{"weight": 34}, {"weight": 67}])),
               "analysis": analysis(error_rate_check())}}),
    )
    .await;
    rig.set_version("web", "2").await;
    let started = Instant::now();
    let mut saw_canary = false;
    let app = loop {
        if let Some(stable) = rig.deployment("web").await {
            assert_eq!(image_of(&stable), "registry.example.com/tests/web:1", "the stable Deployment changed");
        }
        saw_canary |= rig.deployment("web-canary").await.is_some();
        let app = rig.app("web").await;
        let s = app.status.clone().unwrap_or_default();
        assert_ne!(s.current_version.as_deref(), Some("2"), "a bad canary was promoted");
        if s.phase == Some(AppPhase::RolledBack) {
            break app;
        }
        assert!(started.elapsed() < Duration::from_secs(90), "not rolled back in 90 s: {s:?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert!(saw_canary);
    let s = app.status.clone().expect("status");
    let failed = s.failed_version.expect("failed version");
    assert_eq!((failed.version.as_str(), failed.reason.as_str()), ("2", "AnalysisFailed"));
    let (_, reason, message) = condition(&app, "Progressing");
    assert_eq!(reason, "AnalysisFailed");
    assert!(message.contains("error-rate") && message.contains("max 0.05"), "{message}");
    assert_eq!(s.current_version.as_deref(), Some("1"));
    assert_eq!(s.history[0].result, RolloutResult::RolledBack);
    support::wait_for(Duration::from_secs(20), "canary Deployment removed", || async {
        rig.deployment("web-canary").await.is_none().then_some(())
    })
    .await;
    rig.wait_events("web", &["AnalysisFailed", "RolledBack"]).await;

    // It stays rolled back: the failed version is not tried again by itself.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(rig.deployment("web-canary").await.is_none());
    assert_eq!(rig.app("web").await.status.and_then(|s| s.phase), Some(AppPhase::RolledBack));
}

/// The env var MODE of the App's main container, as a Deployment runs it.
fn mode_of(d: &k8s_openapi::api::apps::v1::Deployment) -> Option<String> {
    let pod = d.spec.as_ref()?.template.spec.as_ref()?;
    pod.containers.iter().find(|c| c.name == "app")?.env.as_ref()?.first()?.value.clone()
}

fn template(mode: &str) -> serde_json::Value {
    json!({"spec": {"containers": [{"name": "app", "env": [{"name": "MODE", "value": mode}]}]}})
}

/// Creates App `web` at version 1 with `template`, one canary step of 34% gated by the error
/// rate of the series `canary-pods` (the test sets what the canary's pods serve there), and
/// returns its stable revision once Healthy.
async fn create_templated(rig: &Rig, template: serde_json::Value) -> String {
    let check = json!([{"name": "error-rate", "query": support::rollout::ERROR_RATE.replace("{{version}}", "canary-pods"), "max": 0.05}]);
    rig.apps
        .create(
            &Default::default(),
            &serde_json::from_value(json!({
                "apiVersion": "flotilla.dev/v1beta1", "kind": "App", "metadata": {"name": "web"},
                "spec": {"image": "registry.example.com/tests/web", "version": "1", "replicas": 3, "template": template,
                         "rollout": {"strategy": canary(json!([{"weight": 34}])), "analysis": analysis(check)}},
            }))
            .expect("App"),
        )
        .await
        .expect("creating App");
    let app =
        rig.wait_until("web", "Healthy", |a| (a.status.as_ref()?.phase == Some(AppPhase::Healthy)).then_some(())).await;
    app.status.and_then(|s| s.current_version).expect("revision")
}

/// Watches App `web` until its rollout is rolled back, at most 15 s (the rollbacks measured
/// 2.2-2.6 s alone; 15 s leaves room for a loaded CI machine, not for a 10x regression):
/// `stable` checks the stable Deployment each time, and the stable revision must stay
/// `stable_revision` throughout (a bad `what` is never promoted). Returns the status and the
/// last canary Deployment seen.
async fn until_rolled_back(
    rig: &Rig,
    stable_revision: &str,
    what: &str,
    stable: impl Fn(&k8s_openapi::api::apps::v1::Deployment),
) -> (flotilla::api::AppStatus, Option<k8s_openapi::api::apps::v1::Deployment>) {
    let started = Instant::now();
    let mut canary = None;
    loop {
        if let Some(d) = rig.deployment("web").await {
            stable(&d);
        }
        if let Some(c) = rig.deployment("web-canary").await {
            canary = Some(c);
        }
        let s = rig.app("web").await.status.unwrap_or_default();
        assert_eq!(s.current_version.as_deref(), Some(stable_revision), "a bad {what} was promoted");
        if s.phase == Some(AppPhase::RolledBack) {
            return (s, canary);
        }
        assert!(started.elapsed() < Duration::from_secs(15), "not rolled back in 15 s: {s:?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_template_goes_through_the_canary_and_is_rolled_back_to_the_old_one() {
    let rig = Rig::start("ro-tmpl").await;
    // The canary's pods serve errors: its series is the one the check reads.
    rig.traffic("web", "canary-pods", 0.5, 0.05);
    let stable_revision = create_templated(&rig, template("live")).await;
    assert!(stable_revision.starts_with("1+"), "a revision names the version and the template: {stable_revision}");
    rig.wait_for_data("web", "canary-pods").await;

    // Only an env var changes: a new revision of the same version, rolled out as a canary.
    rig.patch_spec("web", json!({"template": template("broken")})).await;
    let started = Instant::now();
    let (app, canary) = until_rolled_back(&rig, &stable_revision, "template", |stable| {
        assert_eq!(mode_of(stable).as_deref(), Some("live"), "the stable pods were given the new template");
    })
    .await;
    let canary_mode = canary.as_ref().and_then(mode_of);
    println!("bad template rolled back {:?} after the change", started.elapsed());
    assert_eq!(canary_mode.as_deref(), Some("broken"), "the canary ran the new template");
    let s = app;
    let failed = s.failed_version.expect("failed revision");
    assert!(failed.version.starts_with("1+") && failed.version != stable_revision, "{failed:?}");
    assert_eq!(s.history[0].result, RolloutResult::RolledBack);
    assert_eq!(s.history[0].version, failed.version, "history names the revision");
    support::wait_for(Duration::from_secs(20), "canary Deployment removed", || async {
        rig.deployment("web-canary").await.is_none().then_some(())
    })
    .await;
}

/// Status lost while no replica ran, and a new template asked for: the running revision is
/// recovered as the stable one, and with it the running pods' template, which a rollback
/// brings back. The replica caches Deployments as projections (`app::projection`): the
/// template must be read from the Deployment in full, never from the projection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stable_template_lost_from_status_is_read_back_from_the_running_deployment() {
    let mut rig = Rig::start("ro-recover").await;
    rig.traffic("web", "canary-pods", 0.5, 0.05);
    let stable_revision = create_templated(&rig, template("live")).await;
    rig.wait_for_data("web", "canary-pods").await;

    // A tenant who may edit Deployments forges the cache's projection marker on the running
    // template: read in full, it must not pass for a projection (every write would be refused).
    let forged = json!({"spec": {"template": {"metadata": {"annotations": {"cache.flotilla.dev/projected": "true"}}}}});
    rig.deployments
        .patch("web", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(forged))
        .await
        .expect("forging the marker");
    rig.operator.child.kill().await.expect("stopping the replica");
    let cleared = kube::api::Patch::Merge(json!({"status": null}));
    rig.apps.patch_status("web", &kube::api::PatchParams::default(), &cleared).await.expect("clearing status");
    rig.patch_spec("web", json!({"template": template("broken")})).await;
    rig.operator = support::Operator::start_with(
        kubeconfig(),
        &["--namespace", &rig.ns.name, "--prometheus-url", &rig.prometheus.url()],
        &format!("e2e-{}-again", rig.ns.name),
    )
    .await;

    let recovered = rig
        .wait_until("web", "the running revision recovered as stable", |a| {
            (a.status.as_ref()?.current_version.as_deref() == Some(stable_revision.as_str())).then_some(())
        })
        .await;
    let kept = serde_json::to_string(&recovered.status.and_then(|s| s.stable_template)).unwrap_or_default();
    assert!(kept.contains("\"live\""), "status keeps the running pods' template: {kept}");
    assert!(!kept.contains("projected"), "status keeps the template in full, never a projection: {kept}");
    let (s, _) = until_rolled_back(&rig, &stable_revision, "template", |stable| {
        assert_eq!(mode_of(stable).as_deref(), Some("live"), "the stable pods were given the new template");
    })
    .await;
    let kept = serde_json::to_string(&s.stable_template).unwrap_or_default();
    assert!(kept.contains("\"live\""), "after the rollback: {kept}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_data_pauses_the_rollout_until_prometheus_is_back() {
    let mut rig = Rig::start("ro-nodata").await;
    // Some errors, so that the 5xx series exists: a ratio over no series is no data.
    rig.traffic("web", "2", 0.01, 0.05);
    rig.create(
        "web",
        json!({"replicas": 2, "rollout": {"strategy": canary(json!([{"weight": 50, "pause": "10s"}])),
               "analysis": analysis(error_rate_check())}}),
    )
    .await;
    rig.wait_for_data("web", "2").await;
    rig.set_version("web", "2").await;
    rig.wait_until("web", "canary available and passing", |a| {
        let s = a.status.as_ref()?;
        (s.canary.as_ref()?.replicas == 1 && s.analysis.as_ref()?.last_result == Some(MeasurementResult::Pass))
            .then_some(())
    })
    .await;
    rig.prometheus.stop().await;
    let paused = rig
        .wait_until("web", "paused: Prometheus unreachable", |a| {
            (a.status.as_ref()?.phase == Some(AppPhase::Paused)
                && condition(a, "Progressing").2.contains("unreachable"))
            .then_some(())
        })
        .await;
    let (_, reason, message) = condition(&paused, "Progressing");
    assert_eq!(reason, "Inconclusive");
    assert!(message.contains("unreachable") && message.contains("never promoted"), "{message}");
    // Past the step's pause: still not promoted while the data is missing.
    let until = Instant::now() + Duration::from_secs(12);
    while Instant::now() < until {
        let s = rig.app("web").await.status.unwrap_or_default();
        assert_eq!(s.current_version.as_deref(), Some("1"), "promoted without data");
        assert_eq!(s.canary.as_ref().map(|c| c.step), Some(0), "a step was taken without data");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    rig.prometheus.restart().await;
    rig.wait_healthy("web", "2").await;
    rig.wait_events("web", &["AnalysisInconclusive", "AnalysisPassed", "Promoted"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_query_degrades_the_app_with_prometheus_message_and_no_hot_loop() {
    let rig = Rig::start("ro-badq").await;
    rig.create(
        "web",
        json!({"replicas": 2, "rollout": {"strategy": canary(json!([{"weight": 50}])),
               "analysis": analysis(json!([{"name": "broken", "query": "sum(rate(http_requests_total[1m]", "max": 1}]))}}),
    )
    .await;
    rig.set_version("web", "2").await;
    let app = rig.wait_phase("web", AppPhase::Degraded).await;
    let (_, reason, message) = condition(&app, "Progressing");
    assert_eq!(reason, "QueryInvalid");
    assert!(message.contains("parse error"), "the parser's message is shown: {message}");
    let invalid = |text: String| {
        text.lines()
            .find(|l| l.starts_with("flotilla_analysis_measurements_total{result=\"invalid\"}"))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let before = invalid(rig.operator.metrics().await);
    tokio::time::sleep(Duration::from_secs(10)).await;
    let runs = invalid(rig.operator.metrics().await) - before;
    assert!((1.0..=7.0).contains(&runs), "one query every 2 s interval, not a hot loop: {runs} in 10 s");
    let s = rig.app("web").await.status.expect("status");
    assert_eq!(s.current_version.as_deref(), Some("1"));
    assert_eq!(s.phase, Some(AppPhase::Degraded));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_update_keeps_all_but_max_unavailable_replicas_available() {
    let rig = Rig::start("ro-rolling").await;
    rig.create(
        "web",
        json!({"replicas": 4, "minReadySeconds": 2,
               "rollout": {"strategy": {"type": "Rolling", "rolling": {"maxUnavailable": 1, "maxSurge": 1}}}}),
    )
    .await;
    // Every write to the Deployment, in order: a GET a round can miss a dip shorter than
    // a round, and a loaded machine makes rounds long.
    let recorder = Recorder::start(rig.client.clone(), &rig.ns.name).await;
    rig.set_version("web", "2").await;
    let started = Instant::now();
    loop {
        let s = rig.app("web").await.status.unwrap_or_default();
        if s.phase == Some(AppPhase::Healthy) && s.current_version.as_deref() == Some("2") {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(90), "rolling update did not finish: {s:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let rolled = |state: &support::recorder::State| {
        let d = state.deployments.get("web");
        let updated = d.and_then(|d| d.status.as_ref()).and_then(|s| s.updated_replicas);
        d.is_some_and(|d| image_of(d).ends_with(":2")) && updated == Some(4) && available(d) == 4
    };
    recorder.wait_until(Duration::from_secs(30), "all 4 replicas of version 2 available", rolled).await;
    let history = recorder.stop();
    assert!(history.iter().any(|s| !rolled(s)), "the rolling update is in the history ({} writes)", history.len());
    let lowest = history.iter().map(|s| available(s.deployments.get("web"))).min().unwrap_or(0);
    assert!(lowest >= 3, "availability dropped to {lowest} of 4 with maxUnavailable 1");
    let d = rig.deployment("web").await.expect("deployment");
    let rolling = d.spec.and_then(|s| s.strategy).and_then(|s| s.rolling_update).expect("rolling update");
    assert_eq!(rolling.max_unavailable, Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(1)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_keeps_the_canary_serving_until_the_stable_deployment_is_back() {
    let rig = Rig::start("ro-capacity").await;
    rig.traffic("web", "2", 0.5, 0.05);
    // minReadySeconds: a new stable pod counts as available 2 s after it is ready, so a
    // canary removed before the stable Deployment is back leaves a gap the history shows.
    rig.create(
        "web",
        json!({"replicas": 4, "minReadySeconds": 2,
               "rollout": {"strategy": canary(json!([{"weight": 50}, {"weight": 75}])),
                           "analysis": analysis(error_rate_check())}}),
    )
    .await;
    // Every write to the Deployments, in order: two GETs are not one moment, and under load a
    // canary deleted between them (once the stable Deployment is back) looked like a gap.
    let recorder = Recorder::start(rig.client.clone(), &rig.ns.name).await;
    rig.set_version("web", "2").await;
    let started = Instant::now();
    // Until the rollback: the canary at 2 of 4. The App's resourceVersion then comes from the
    // same counter as the Deployments': the writes after it are the rollback's.
    let rolled_back_at = loop {
        let app = rig.app("web").await;
        let s = app.status.clone().unwrap_or_default();
        if s.phase == Some(AppPhase::RolledBack) {
            break app.metadata.resource_version.and_then(|v| v.parse::<u64>().ok()).expect("a resourceVersion");
        }
        assert!(started.elapsed() < Duration::from_secs(90), "not rolled back in 90 s: {s:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    recorder
        .wait_until(Duration::from_secs(30), "the canary gone and the stable Deployment back", |s| {
            !s.deployments.contains_key("web-canary") && available(s.deployments.get("web")) == 4
        })
        .await;
    // From the state the rollback was decided in until the canary is gone: available pods of
    // both Deployments after each write.
    let history = recorder.stop();
    let from = history.iter().rposition(|s| s.revision <= rolled_back_at).expect("writes before the rollback");
    assert!(
        history[from].deployments.contains_key("web-canary"),
        "the canary ran when the rollback was decided (the window judged starts there)"
    );
    let mut lowest = (i32::MAX, 0);
    for state in &history[from..] {
        let stable = available(state.deployments.get("web"));
        let canary = state.deployments.get("web-canary");
        if stable + available(canary) < lowest.0 {
            lowest = (stable + available(canary), state.revision);
        }
    }
    assert!(
        lowest.0 >= 3,
        "availability dropped to {} of 4 during the rollback (maxUnavailable 25%), at revision {}",
        lowest.0,
        lowest.1
    );
    let s = rig.app("web").await.status.expect("status");
    assert_eq!(s.phase, Some(AppPhase::RolledBack));
    assert_eq!(s.current_version.as_deref(), Some("1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reverting_mid_canary_rolls_back_at_once_and_a_new_version_restarts_the_rollout() {
    let rig = Rig::start("ro-revert").await;
    rig.traffic("web", "2", 0.0, 0.05);
    rig.traffic("web", "3", 0.0, 0.05);
    rig.create(
        "web",
        json!({"replicas": 4, "rollout": {"strategy": canary(json!([{"weight": 25, "pause": "1h"}, {"weight": 50}])),
               "analysis": analysis(error_rate_check())}}),
    )
    .await;
    rig.set_version("web", "2").await;
    rig.wait_until("web", "canary of 2 at step 1", |a| {
        (a.status.as_ref()?.canary.as_ref()?.replicas == 1).then_some(())
    })
    .await;
    support::wait_for(Duration::from_secs(30), "canary Deployment", || async { rig.deployment("web-canary").await })
        .await;

    // Back to the stable version: the canary goes at once, no steps.
    rig.set_version("web", "1").await;
    let reverted = Instant::now();
    support::wait_for(Duration::from_secs(10), "canary removed at once", || async {
        rig.deployment("web-canary").await.is_none().then_some(())
    })
    .await;
    let took = reverted.elapsed();
    let app = rig.wait_healthy("web", "1").await;
    let s = app.status.expect("status");
    assert_eq!(s.history[0].result, RolloutResult::Reverted);
    assert_eq!(image_of(&rig.deployment("web").await.expect("stable")), "registry.example.com/tests/web:1");
    assert!(took < Duration::from_secs(10), "revert took {took:?}");

    // A new version during the analysis restarts from step 1 with fresh analysis.
    rig.set_version("web", "2").await;
    rig.wait_until("web", "measured canary of 2", |a| {
        let s = a.status.as_ref()?;
        (s.target_version.as_deref() == Some("2") && s.analysis.as_ref()?.last_run.is_some()).then_some(())
    })
    .await;
    rig.set_version("web", "3").await;
    let app = rig
        .wait_until("web", "rollout of 3 at step 1", |a| {
            let s = a.status.as_ref()?;
            (s.target_version.as_deref() == Some("3") && s.canary.as_ref()?.step == 0).then_some(())
        })
        .await;
    let s = app.status.expect("status");
    assert_eq!(s.history[0].result, RolloutResult::Superseded);
    assert_eq!(s.history[0].version, "2");
    assert_eq!(s.analysis.map(|a| a.failures), Some(0));
    support::wait_for(Duration::from_secs(30), "canary runs version 3", || async {
        let d = rig.deployment("web-canary").await?;
        (image_of(&d) == "registry.example.com/tests/web:3").then_some(())
    })
    .await;
    rig.wait_events("web", &["Reverted", "Superseded"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canary_follows_the_autoscaler_replicas() {
    let rig = Rig::start("ro-hpa").await;
    rig.create(
        "web",
        json!({"autoscaling": {"minReplicas": 4, "maxReplicas": 10},
               "rollout": {"strategy": canary(json!([{"weight": 50, "pause": "1h"}]))}}),
    )
    .await;
    support::wait_for(Duration::from_secs(60), "the autoscaler sets 4 replicas", || async {
        let d = rig.deployment("web").await?;
        (d.spec?.replicas == Some(4)).then_some(())
    })
    .await;
    rig.set_version("web", "2").await;
    support::wait_for(Duration::from_secs(60), "canary of 2 (50% of 4)", || async {
        let d = rig.deployment("web-canary").await?;
        (d.spec?.replicas == Some(2)).then_some(())
    })
    .await;
    rig.patch_spec("web", json!({"autoscaling": {"minReplicas": 6, "maxReplicas": 10}})).await;
    support::wait_for(Duration::from_secs(60), "canary of 3 (50% of 6)", || async {
        let d = rig.deployment("web-canary").await?;
        (d.spec?.replicas == Some(3)).then_some(())
    })
    .await;
    rig.wait_until("web", "status shows a canary of 3 beside 6", |a| {
        let c = a.status.as_ref()?.canary.as_ref()?;
        ((c.replicas, c.stable_replicas) == (3, 6)).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_p99_latency_over_two_seconds_rolls_back() {
    let rig = Rig::start("ro-p99").await;
    rig.traffic("web", "2", 0.0, 3.0);
    rig.create(
        "web",
        json!({"replicas": 2, "rollout": {"strategy": canary(json!([{"weight": 50}])),
               "analysis": analysis(json!([{"name": "p99-latency-ms", "query": P99_MS, "max": 2000}]))}}),
    )
    .await;
    rig.set_version("web", "2").await;
    let app = rig.wait_phase("web", AppPhase::RolledBack).await;
    let failed = app.status.as_ref().and_then(|s| s.failed_version.clone()).expect("failed version");
    assert!(failed.message.contains("p99-latency-ms") && failed.message.contains("max 2000"), "{}", failed.message);
    let m = &app.status.and_then(|s| s.analysis).expect("analysis").measurements[0];
    assert!(m.value.is_some_and(|v| v > 2000.0), "{m:?}");
}

fn cli(args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(args)
        .arg("--kubeconfig")
        .arg(kubeconfig())
        .output()
        .expect("running flotilla");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "flotilla {args:?} failed: {text}");
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promote_abort_retry_and_pause_from_the_cli() {
    let rig = Rig::start("ro-cli").await;
    let ns = rig.ns.name.clone();
    rig.create("web", json!({"replicas": 4, "rollout": {"strategy": canary(json!([{"weight": 25, "pause": "1h"}, {"weight": 50, "pause": "1h"}]))}}))
        .await;
    rig.set_version("web", "2").await;
    let step = |n: i32| move |a: &flotilla::api::App| (a.status.as_ref()?.canary.as_ref()?.step == n).then_some(());
    rig.wait_until("web", "at step 1", step(0)).await;

    cli(&["pause", "web", "-n", &ns]);
    let paused = rig.wait_phase("web", AppPhase::Paused).await;
    assert_eq!(condition(&paused, "Progressing").1, "PausedByUser");
    cli(&["resume", "web", "-n", &ns]);
    rig.wait_phase("web", AppPhase::Progressing).await;

    cli(&["promote", "web", "-n", &ns]);
    rig.wait_until("web", "at step 2", step(1)).await;
    let status = cli(&["status", "web", "-n", &ns]);
    assert!(status.contains("50%"), "status shows the weight: {status}");

    cli(&["abort", "web", "-n", &ns]);
    let app = rig.wait_phase("web", AppPhase::RolledBack).await;
    assert_eq!(app.status.and_then(|s| s.failed_version).map(|f| f.reason), Some("Aborted".to_string()));
    support::wait_for(Duration::from_secs(20), "canary removed", || async {
        rig.deployment("web-canary").await.is_none().then_some(())
    })
    .await;

    cli(&["retry", "web", "-n", &ns]);
    rig.wait_until("web", "retried at step 1", |a| {
        let s = a.status.as_ref()?;
        (s.phase == Some(AppPhase::Progressing) && s.canary.as_ref()?.step == 0).then_some(())
    })
    .await;
    cli(&["promote", "web", "-n", &ns, "--full"]);
    rig.wait_healthy("web", "2").await;
    rig.wait_events("web", &["StepPromotedByUser", "RolledBack", "PromotedByUser", "Promoted"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_paused_until_promoted_waits_for_flotilla_promote() {
    let rig = Rig::start("ro-gate").await;
    let ns = rig.ns.name.clone();
    rig.traffic("web", "2", 0.0, 0.05);
    rig.create(
        "web",
        json!({"replicas": 4, "rollout": {"strategy": canary(json!([{"weight": 25, "pause": "untilPromoted"}, {"weight": 50}])),
               "analysis": analysis(error_rate_check())}}),
    )
    .await;
    rig.wait_for_data("web", "2").await;
    rig.set_version("web", "2").await;
    let waiting = rig.wait_phase("web", AppPhase::Paused).await;
    let (_, reason, message) = condition(&waiting, "Progressing");
    assert_eq!(reason, "WaitingForPromote");
    assert!(message.starts_with("Paused (waiting for promote)"), "{message}");
    // Passing checks and an available canary do not move it on: only a person does.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let still = rig.app("web").await.status.expect("status");
    assert_eq!((still.phase, still.canary.as_ref().map(|c| c.step)), (Some(AppPhase::Paused), Some(0)));
    let status = cli(&["status", "web", "-n", &ns]);
    assert!(status.contains("Paused (waiting for promote)"), "the CLI says what it waits for: {status}");
    assert!(status.contains("25% until promoted"), "the CLI lists the gate: {status}");
    cli(&["promote", "web", "-n", &ns]);
    rig.wait_healthy("web", "2").await;
    rig.wait_events("web", &["StepPromotedByUser", "Promoted"]).await;
}

/// The config stamp of a Deployment's pods (`flotilla.dev/config`).
fn config_stamp_of(d: &k8s_openapi::api::apps::v1::Deployment) -> Option<String> {
    d.spec.as_ref()?.template.metadata.as_ref()?.annotations.as_ref()?.get("flotilla.dev/config").cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_map_change_goes_through_the_canary_and_a_bad_one_is_rolled_back() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{Api, Patch, PatchParams, PostParams};
    let rig = Rig::start("ro-config").await;
    // The canary's pods serve errors until the test says otherwise.
    rig.traffic("web", "canary-pods", 0.5, 0.05);
    let config_maps: Api<ConfigMap> = Api::namespaced(rig.client.clone(), &rig.ns.name);
    let config = |mode: &str| -> ConfigMap {
        serde_json::from_value(json!({"metadata": {"name": "web-config"}, "data": {"MODE": mode}})).expect("ConfigMap")
    };
    config_maps.create(&PostParams::default(), &config("live")).await.expect("creating ConfigMap");
    let template =
        json!({"spec": {"containers": [{"name": "app", "envFrom": [{"configMapRef": {"name": "web-config"}}]}]}});
    let stable_revision = create_templated(&rig, template).await;
    let stable_stamp = config_stamp_of(&rig.deployment("web").await.expect("stable")).expect("a config stamp");
    rig.wait_for_data("web", "canary-pods").await;

    // The ConfigMap changes, nothing in the App: a new revision, rolled out as a canary whose
    // analysis fails, and rolled back; the stable pods keep the config they started with.
    let edit = |mode: &'static str| {
        let config_maps = config_maps.clone();
        async move {
            config_maps
                .patch("web-config", &PatchParams::default(), &Patch::Merge(&json!({"data": {"MODE": mode}})))
                .await
                .expect("editing the ConfigMap")
        }
    };
    // A label on the ConfigMap is not a new config: nothing rolls.
    config_maps
        .patch("web-config", &PatchParams::default(), &Patch::Merge(&json!({"metadata": {"labels": {"team": "web"}}})))
        .await
        .expect("labelling the ConfigMap");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let s = rig.app("web").await.status.unwrap_or_default();
    assert_eq!(s.target_version.as_deref(), Some(stable_revision.as_str()), "a label change started a rollout");
    assert!(rig.deployment("web-canary").await.is_none(), "a label change made a canary");
    assert!(s.history.is_empty() && s.failed_version.is_none(), "a label change was rolled out: {:?}", s.history);

    edit("broken").await;
    let started = Instant::now();
    let (app, canary) = until_rolled_back(&rig, &stable_revision, "config", |stable| {
        assert_eq!(config_stamp_of(stable).as_deref(), Some(stable_stamp.as_str()), "the stable pods were restarted");
    })
    .await;
    let canary_stamp = canary.as_ref().and_then(config_stamp_of);
    println!("bad config rolled back {:?} after the ConfigMap changed", started.elapsed());
    assert!(canary_stamp.as_ref().is_some_and(|c| *c != stable_stamp), "the canary ran with the new config's stamp");
    let failed = app.failed_version.expect("failed revision");
    assert!(failed.version.starts_with("1+") && failed.version != stable_revision, "{failed:?}");

    // A good config: promoted, and the stable pods get its stamp. The canary's pods stop
    // serving errors first, and the test waits until the 10 s error rate says so.
    rig.traffic("web", "canary-pods", 0.0, 0.05);
    let rate = support::rollout::ERROR_RATE
        .replace("{{namespace}}", &rig.ns.name)
        .replace("{{app}}", "web")
        .replace("{{version}}", "canary-pods");
    support::wait_for(Duration::from_secs(30), "the canary pods' error rate back to 0", || async {
        let v = support::prometheus::query(&rig.prometheus.addr(), &rate).await;
        let value = v.pointer("/data/result/0/value/1")?.as_str()?.parse::<f64>().ok()?;
        (value < 0.01).then_some(())
    })
    .await;
    edit("fixed").await;
    let promoted = rig
        .wait_until("web", "the fixed config promoted", |a| {
            let s = a.status.as_ref()?;
            (s.phase == Some(AppPhase::Healthy) && s.current_version.as_deref() != Some(stable_revision.as_str()))
                .then_some(())
        })
        .await;
    let s = promoted.status.expect("status");
    assert_eq!(s.history[0].result, RolloutResult::Promoted);
    let stamp = config_stamp_of(&rig.deployment("web").await.expect("stable")).expect("stamp");
    assert!(stamp != stable_stamp && Some(&stamp) != canary_stamp.as_ref(), "the stable pods run the fixed config");
}

fn blue_green(scale_down_delay: &str) -> serde_json::Value {
    json!({"type": "BlueGreen", "blueGreen": {"scaleDownDelay": scale_down_delay}})
}

/// The track the Service `name` selects (`None`: every pod of the App), or `Err` when the
/// Service does not exist.
async fn selected_track(rig: &Rig, name: &str) -> Result<Option<String>, ()> {
    let services: kube::Api<k8s_openapi::api::core::v1::Service> =
        kube::Api::namespaced(rig.client.clone(), &rig.ns.name);
    let service = services.get_opt(name).await.expect("reading Service").ok_or(())?;
    Ok(support::recorder::track_of(&service))
}

/// Available pods of a Deployment (0 when there is none).
fn available(d: Option<&k8s_openapi::api::apps::v1::Deployment>) -> i32 {
    d.and_then(|d| d.status.as_ref()).and_then(|s| s.available_replicas).unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blue_green_rollout_switches_the_service_in_one_write_and_keeps_full_capacity() {
    let rig = Rig::start("ro-bg").await;
    let ns = rig.ns.name.clone();
    rig.traffic("web", "2", 0.0, 0.05);
    rig.create(
        "web",
        json!({"replicas": 3, "rollout": {"strategy": blue_green("3s"), "analysis": analysis(error_rate_check())}}),
    )
    .await;
    assert_eq!(
        selected_track(&rig, "web").await,
        Ok(Some("stable".into())),
        "a blue-green App's Service selects one track"
    );
    rig.wait_for_data("web", "2").await;
    // Every write to the namespace's Services and Deployments from here on, in order: a
    // preview that is switched to a second after it is ready would slip between two GETs.
    let recorder = Recorder::start(rig.client.clone(), &ns).await;
    rig.set_version("web", "2").await;
    let started = Instant::now();
    loop {
        let s = rig.app("web").await.status.unwrap_or_default();
        assert_ne!(s.phase, Some(AppPhase::RolledBack), "a good version was rolled back: {:?}", s.conditions);
        if s.phase == Some(AppPhase::Healthy) && s.current_version.as_deref() == Some("2") {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(120), "not promoted in 120 s: {s:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The promotion is written first; the Service follows in the same reconcile.
    recorder
        .wait_until(Duration::from_secs(10), "the Service back on the stable Deployment", |s| {
            s.track("web") == Ok(Some("stable".into()))
                && s.deployments.get("web").is_some_and(|d| image_of(d).ends_with(":2"))
        })
        .await;

    // After each write: what the Service selects, and how many pods of that track are available.
    let history = recorder.stop();
    let mut tracks: Vec<Option<String>> = Vec::new();
    let mut saw_preview = false;
    let mut lowest = (i32::MAX, 0);
    for state in &history {
        let track = state.track("web").expect("the App's Service");
        let stable = state.deployments.get("web");
        let preview = state.deployments.get("web-canary");
        let behind = match track.as_deref() {
            Some("canary") => available(preview),
            _ => available(stable),
        };
        if behind < lowest.0 {
            lowest = (behind, state.revision);
        }
        if tracks.last() != Some(&track) {
            tracks.push(track.clone());
        }
        // Before the switch the new version runs at full size behind the preview Service.
        let size = preview.and_then(|d| d.spec.as_ref()).and_then(|s| s.replicas);
        if track.as_deref() == Some("stable")
            && stable.is_some_and(|d| image_of(d).ends_with(":1"))
            && state.track("web-preview") == Ok(Some("canary".into()))
            && size == Some(3)
        {
            saw_preview = true;
        }
    }
    assert!(saw_preview, "the new version ran at full size behind web-preview before the switch");
    // Then back to the stable Deployment (waited for above, after Healthy was written).
    assert_eq!(
        tracks.iter().take(2).collect::<Vec<_>>(),
        [&Some("stable".to_string()), &Some("canary".to_string())],
        "the Service went from the old pods to the new ones, nothing in between: {tracks:?}"
    );
    assert_eq!(tracks.last(), Some(&Some("stable".to_string())), "{tracks:?}");
    assert!(tracks[1..].iter().all(|t| t.is_some()), "the Service never selected both versions: {tracks:?}");
    assert!(
        lowest.0 >= 3,
        "the Service selected only {} available pods of 3 at revision {} ({} writes recorded)",
        lowest.0,
        lowest.1,
        history.len()
    );
    let stable = rig.deployment("web").await.expect("stable");
    assert_eq!(image_of(&stable), "registry.example.com/tests/web:2");
    support::wait_for(Duration::from_secs(20), "preview Deployment and Service removed", || async {
        (rig.deployment("web-canary").await.is_none() && selected_track(&rig, "web-preview").await.is_err())
            .then_some(())
    })
    .await;
    rig.wait_events("web", &["RolloutStarted", "Switched", "ScalingDown", "Promoted"]).await;
    let status = cli(&["status", "web", "-n", &ns]);
    assert!(status.contains("BlueGreen (switch automatic, old version kept 3s after it)"), "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blue_green_rollout_switches_back_when_a_check_fails_after_the_switch() {
    let rig = Rig::start("ro-bg-back").await;
    rig.traffic("web", "2", 0.0, 0.05);
    rig.create(
        "web",
        json!({"replicas": 3, "rollout": {"strategy": blue_green("10m"), "analysis": analysis(error_rate_check())}}),
    )
    .await;
    rig.wait_for_data("web", "2").await;
    rig.set_version("web", "2").await;
    support::wait_for(Duration::from_secs(90), "the Service switched to version 2", || async {
        (selected_track(&rig, "web").await == Ok(Some("canary".into()))).then_some(())
    })
    .await;
    // The new version starts failing while the old one is still kept.
    rig.traffic("web", "2", 0.5, 0.05);
    let started = Instant::now();
    loop {
        let stable = rig.deployment("web").await.expect("stable");
        assert_eq!(image_of(&stable), "registry.example.com/tests/web:1", "the old version was touched");
        assert_eq!(available(Some(&stable)), 3, "the old version kept its pods");
        let s = rig.app("web").await.status.unwrap_or_default();
        if s.phase == Some(AppPhase::RolledBack) {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "not switched back in 60 s: {s:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The rollback is written first, the Service follows in the same reconcile.
    support::wait_for(Duration::from_secs(10), "the Service switched back to the old pods", || async {
        (selected_track(&rig, "web").await == Ok(Some("stable".into()))).then_some(())
    })
    .await;
    let app = rig.app("web").await;
    let failed = app.status.clone().and_then(|s| s.failed_version).expect("failed version");
    assert_eq!(failed.reason, "AnalysisFailed");
    assert!(failed.message.contains("after the switch"), "{}", failed.message);
    support::wait_for(Duration::from_secs(20), "preview Deployment and Service removed", || async {
        (rig.deployment("web-canary").await.is_none() && selected_track(&rig, "web-preview").await.is_err())
            .then_some(())
    })
    .await;
    rig.wait_events("web", &["Switched", "AnalysisFailed", "RolledBack"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undo_rolls_the_previous_version_out_again_or_abandons_a_rollout_at_once() {
    let rig = Rig::start("ro-undo").await;
    let ns = rig.ns.name.clone();
    rig.create("web", json!({"replicas": 2, "rollout": {"strategy": canary(json!([{"weight": 50}]))}})).await;
    rig.set_version("web", "2").await;
    rig.wait_healthy("web", "2").await;

    // A finished rollout: version 1 rolls out again through the canary.
    let out = cli(&["undo", "web", "-n", &ns]);
    assert!(out.contains("1 rolls out again"), "{out}");
    let app = rig.wait_healthy("web", "1").await;
    assert_eq!(app.spec.version, "1");
    let s = app.status.expect("status");
    let last: Vec<(&str, RolloutResult)> = s.history.iter().take(2).map(|h| (h.version.as_str(), h.result)).collect();
    assert_eq!(last, [("1", RolloutResult::Promoted), ("2", RolloutResult::Promoted)], "a rollout, not a reset");

    // A rollout under way, held at a step: abandoned at once, version 1 keeps serving.
    rig.patch_spec(
        "web",
        json!({"version": "3", "rollout": {"strategy": canary(json!([{"weight": 50, "pause": "1h"}]))}}),
    )
    .await;
    rig.wait_until("web", "canary of 3 at its step", |a| {
        let s = a.status.as_ref()?;
        (s.target_version.as_deref() == Some("3") && s.canary.as_ref()?.replicas == 1).then_some(())
    })
    .await;
    let out = cli(&["undo", "web", "-n", &ns]);
    assert!(out.contains("abandoned at once"), "{out}");
    let app = rig.wait_healthy("web", "1").await;
    assert_eq!(app.status.expect("status").history[0].result, RolloutResult::Reverted);
    support::wait_for(Duration::from_secs(20), "canary of 3 removed", || async {
        rig.deployment("web-canary").await.is_none().then_some(())
    })
    .await;

    // A version that never ran is refused, naming those that did.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(["undo", "web", "-n", &ns, "--to-revision", "9", "--kubeconfig"])
        .arg(kubeconfig())
        .output()
        .expect("running flotilla");
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && text.contains("revision 9 was never promoted"), "{text}");
    assert_eq!(rig.app("web").await.spec.version, "1", "nothing was written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blue_green_rollout_waits_for_a_quota_that_can_hold_its_preview_and_creates_nothing_before() {
    let rig = Rig::start("ro-bgq").await;
    let ns = rig.ns.name.clone();
    rig.create("web", json!({"replicas": 2, "rollout": {"strategy": blue_green("1s")}})).await;
    let quotas: kube::Api<k8s_openapi::api::core::v1::ResourceQuota> = kube::Api::namespaced(rig.client.clone(), &ns);
    let quota = |pods: &str| {
        serde_json::from_value::<k8s_openapi::api::core::v1::ResourceQuota>(
            json!({"metadata": {"name": "team"}, "spec": {"hard": {"pods": pods}}}),
        )
        .expect("quota")
    };
    quotas.create(&kube::api::PostParams::default(), &quota("3")).await.expect("creating the quota");
    support::wait_for(Duration::from_secs(30), "the quota counts the App's 2 pods", || async {
        let q = quotas.get("team").await.ok()?;
        let used = q.status?.used?.get("pods")?.0.clone();
        (used == "2").then_some(())
    })
    .await;

    rig.set_version("web", "2").await;
    let waiting = rig
        .wait_until("web", "waiting for quota", |a| (condition(a, "Progressing").1 == "QuotaExceeded").then_some(()))
        .await;
    let (_, _, message) = condition(&waiting, "Progressing");
    assert!(message.contains("ResourceQuota team allows pods 3 with 2 used; 3 more pods need 3"), "{message}");
    assert_eq!(waiting.status.as_ref().and_then(|s| s.phase), Some(AppPhase::Paused));
    // Nothing of the preview exists, and the Service stays on the running version.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(rig.deployment("web-canary").await.is_none(), "no part of the preview is created");
    assert_eq!(selected_track(&rig, "web").await, Ok(Some("stable".to_string())));
    rig.wait_events("web", &["QuotaExceeded"]).await;

    // Room for the second copy and the promotion's surge pod: the rollout goes on by itself.
    quotas
        .patch(
            "team",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"hard": {"pods": "5"}}})),
        )
        .await
        .expect("growing the quota");
    rig.wait_healthy("web", "2").await;
}
