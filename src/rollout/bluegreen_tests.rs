//! Table tests of the BlueGreen strategy: preview, switch, the delay that keeps the old
//! version, promotion, and switching back.

use super::*;
use crate::api::{BlueGreenStage, BlueGreenStrategy};
use crate::rollout::planner::DRAIN as PREVIEW_DRAIN;
use k8s_openapi::api::apps::v1::DeploymentCondition;

fn blue_green_app(replicas: i32, analysis: bool, auto_promotion: bool) -> App {
    let mut app = canary_app(replicas, &[50], analysis);
    app.spec.rollout.strategy = Some(Strategy {
        type_: StrategyType::BlueGreen,
        rolling: None,
        canary: None,
        blue_green: Some(BlueGreenStrategy {
            auto_promotion: Some(auto_promotion),
            scale_down_delay: Some("30s".into()),
        }),
    });
    app
}

fn stage(plan: &Plan) -> Option<BlueGreenStage> {
    plan.status.blue_green.as_ref().map(|b| b.stage)
}

fn pass() -> Vec<Measurement> {
    vec![measurement(MeasurementResult::Pass, Some(0.01))]
}

fn fail() -> Vec<Measurement> {
    vec![measurement(MeasurementResult::Fail, Some(0.3))]
}

#[test]
fn a_blue_green_rollout_previews_switches_keeps_the_old_version_then_promotes() {
    let app = blue_green_app(4, true, true);
    let plan = Run::new(&app).stable("1", 4, 4).plan(0);
    assert_eq!(reasons(&plan), ["RolloutStarted"]);
    let preview = plan.canary.as_ref().expect("the new version's Deployment");
    assert_eq!((image(preview), replicas(preview)), ("example.com/web:2".into(), Some(4)), "at full size");
    assert_eq!((image(&plan.stable), replicas(&plan.stable)), ("example.com/web:1".into(), Some(4)));
    assert_eq!((plan.active, plan.preview), (Some(Track::Stable), true), "the Service stays on the old pods");
    assert_eq!(stage(&plan), Some(BlueGreenStage::Preview));

    // Available behind the preview Service: a run is due; nothing switches before it passes.
    let app = advance(&app, &plan);
    let due = Run::new(&app).stable("1", 4, 4).canary("2", 4, 4).plan(3);
    assert!(due.analysis_due);
    assert_eq!((due.active, stage(&due)), (Some(Track::Stable), Some(BlueGreenStage::Preview)));

    // It passes: the Service switches in this plan; the old version stays at full size.
    let plan = Run::new(&app).stable("1", 4, 4).canary("2", 4, 4).measured(pass()).plan(3);
    assert_eq!(reasons(&plan), ["Switched"]);
    assert_eq!((plan.active, stage(&plan)), (Some(Track::Canary), Some(BlueGreenStage::Switched)));
    assert_eq!((image(&plan.stable), replicas(&plan.stable)), ("example.com/web:1".into(), Some(4)));
    assert_eq!(plan.recheck, Some(Duration::from_secs(10)), "the next run, before the 30 s delay ends");

    // Within the delay the old version stays, however well the checks go.
    let app = advance(&app, &plan);
    let plan = Run::new(&app).stable("1", 4, 4).canary("2", 4, 4).measured(pass()).plan(13);
    assert_eq!((plan.active, stage(&plan)), (Some(Track::Canary), Some(BlueGreenStage::Switched)));
    assert_eq!(image(&plan.stable), "example.com/web:1");

    // After it, with a run that passed after the switch: the stable Deployment moves to the
    // new version while the Service still selects the preview pods.
    let app = advance(&app, &plan);
    let plan = Run::new(&app).stable("1", 4, 4).canary("2", 4, 4).measured(pass()).plan(34);
    assert_eq!(reasons(&plan), ["ScalingDown"]);
    assert_eq!(stage(&plan), Some(BlueGreenStage::Promoting));
    assert_eq!((image(&plan.stable), replicas(&plan.stable)), ("example.com/web:2".into(), Some(4)));
    assert_eq!((plan.active, plan.canary.is_some()), (Some(Track::Canary), true));

    // The stable Deployment is available on it: the Service selects it; the preview pods,
    // which took all the traffic, drain for 10 s and then go.
    let app = advance(&app, &plan);
    let plan = Run::new(&app).stable("2", 4, 4).canary("2", 4, 4).plan(40);
    assert_eq!(reasons(&plan), ["Promoted"]);
    assert_eq!((plan.active, plan.preview, plan.canary.is_some()), (Some(Track::Stable), false, true));
    assert_eq!(plan.recheck, Some(PREVIEW_DRAIN));
    assert_eq!(plan.status.current_version.as_deref(), Some("2"));
    assert_eq!(plan.status.phase, Some(AppPhase::Healthy));
    assert_eq!(plan.status.ready.as_deref(), Some("4/4"), "the pods the Service serves from");
    assert!(plan.status.blue_green.is_none());
    let app = advance(&app, &plan);
    let draining = Run::new(&app).stable("2", 4, 4).canary("2", 4, 4).plan(45);
    assert!(draining.canary.is_some() && draining.notes.is_empty());
    let done = Run::new(&app).stable("2", 4, 4).canary("2", 4, 4).plan(50);
    assert_eq!((done.active, done.canary.is_none()), (Some(Track::Stable), true));
}

#[test]
fn a_failed_check_after_the_switch_switches_back_at_once() {
    let app = blue_green_app(4, true, true);
    let app = advance(&app, &Run::new(&app).stable("1", 4, 4).plan(0));
    let app = advance(&app, &Run::new(&app).stable("1", 4, 4).canary("2", 4, 4).measured(pass()).plan(3));
    assert_eq!(
        app.status.as_ref().and_then(|s| s.blue_green.as_ref()).map(|b| b.stage),
        Some(BlueGreenStage::Switched)
    );
    let once = Run::new(&app).stable("1", 4, 4).canary("2", 4, 4).measured(fail()).plan(13);
    assert_eq!(once.active, Some(Track::Canary), "one failed run of two does not switch back");
    let app = advance(&app, &once);
    let plan = Run::new(&app).stable("1", 4, 4).canary("2", 4, 4).measured(fail()).plan(23);
    assert_eq!(reasons(&plan), ["AnalysisFailed", "RolledBack"]);
    assert_eq!((plan.active, plan.preview), (Some(Track::Stable), false), "switched back in the same plan");
    assert!(plan.canary.is_some(), "the old version never left: the new one only drains");
    let gone = Run::new(&advance(&app, &plan)).stable("1", 4, 4).canary("2", 4, 4).plan(33);
    assert!(gone.canary.is_none(), "gone once drained");
    assert_eq!((image(&plan.stable), replicas(&plan.stable)), ("example.com/web:1".into(), Some(4)));
    assert_eq!(plan.status.phase, Some(AppPhase::RolledBack));
    let failed = plan.status.failed_version.as_ref().expect("failed");
    assert!(failed.message.contains("after the switch"), "{}", failed.message);
}

#[test]
fn a_failed_preview_is_rolled_back_without_ever_switching() {
    let app = blue_green_app(4, true, true);
    let mut app = advance(&app, &Run::new(&app).stable("1", 4, 4).plan(0));
    for second in [3, 13] {
        let plan = Run::new(&app).stable("1", 4, 4).canary("2", 4, 4).measured(fail()).plan(second);
        assert_eq!(plan.active, Some(Track::Stable), "at {second} s");
        app = advance(&app, &plan);
    }
    assert_eq!(app.status.as_ref().and_then(|s| s.phase), Some(AppPhase::RolledBack));
}

#[test]
fn without_auto_promotion_the_switch_waits_for_promote() {
    let app = blue_green_app(3, true, false);
    let mut app = advance(&app, &Run::new(&app).stable("1", 3, 3).plan(0));
    for second in [3, 13, 600] {
        let plan = Run::new(&app).stable("1", 3, 3).canary("2", 3, 3).measured(pass()).plan(second);
        assert_eq!((plan.active, plan.status.phase), (Some(Track::Stable), Some(AppPhase::Paused)), "at {second} s");
        let p = plan.status.conditions.iter().find(|c| c.type_ == PROGRESSING).expect("Progressing");
        assert!(p.message.starts_with("Paused (waiting for promote)"), "{}", p.message);
        app = advance(&app, &plan);
    }
    let promote = with_annotation(&app, ANNOTATION_ACTION, "promote 1");
    let plan = Run::new(&promote).stable("1", 3, 3).canary("2", 3, 3).plan(601);
    assert_eq!(reasons(&plan), ["Switched"]);
    assert_eq!((plan.active, stage(&plan)), (Some(Track::Canary), Some(BlueGreenStage::Switched)));
    // A second promote skips what is left of the delay.
    let again = with_annotation(&advance(&promote, &plan), ANNOTATION_ACTION, "promote 2");
    let plan = Run::new(&again).stable("1", 3, 3).canary("2", 3, 3).plan(602);
    assert_eq!(stage(&plan), Some(BlueGreenStage::Promoting));
}

#[test]
fn a_preview_that_cannot_be_created_names_why_and_is_rolled_back_at_the_deadline() {
    let app = blue_green_app(4, false, true);
    let app = advance(&app, &Run::new(&app).stable("1", 4, 4).plan(0));
    let mut run = Run::new(&app).stable("1", 4, 4).canary("2", 4, 2);
    let quota = "pods \"web-canary-x\" is forbidden: exceeded quota: compute, requested: cpu=500m";
    if let Some(status) = run.canary.as_mut().and_then(|d| d.status.as_mut()) {
        status.conditions = Some(vec![DeploymentCondition {
            type_: "ReplicaFailure".into(),
            status: "True".into(),
            reason: Some("FailedCreate".into()),
            message: Some(quota.into()),
            ..DeploymentCondition::default()
        }]);
    }
    let plan = run.plan(5);
    let p = plan.status.conditions.iter().find(|c| c.type_ == PROGRESSING).expect("Progressing");
    assert!(p.message.contains("exceeded quota: compute"), "{}", p.message);
    assert_eq!(plan.active, Some(Track::Stable));
    let app = advance(&app, &plan);
    let late = Run { app: &app, ..run.clone() }.plan(70);
    assert_eq!(late.status.phase, Some(AppPhase::RolledBack));
    assert_eq!(late.active, Some(Track::Stable));
    let app = advance(&app, &late);
    assert!(Run { app: &app, ..run }.plan(81).canary.is_none(), "gone once drained");
    let failed = late.status.failed_version.as_ref().expect("failed");
    assert!(failed.message.contains("exceeded quota"), "{}", failed.message);
}

#[test]
fn only_a_blue_green_app_s_service_selects_one_track() {
    let bg = blue_green_app(2, false, true);
    let mut steady = bg.clone();
    steady.spec.version = "1".into();
    assert_eq!(Run::new(&steady).stable("1", 2, 2).plan(0).active, Some(Track::Stable));
    let rolling = rolling_app(false);
    let plan = Run::new(&rolling).stable("1", 4, 4).plan(0);
    assert_eq!((plan.active, plan.preview), (None, false));
    let canary = canary_app(4, &[50], false);
    assert_eq!(Run::new(&canary).stable("1", 4, 4).plan(0).active, None);
}

#[test]
fn setting_the_version_back_after_the_switch_selects_the_stable_pods_again() {
    let app = blue_green_app(4, false, true);
    let app = advance(&app, &Run::new(&app).stable("1", 4, 4).plan(0));
    let plan = Run::new(&app).stable("1", 4, 4).canary("2", 4, 4).plan(3);
    assert_eq!(stage(&plan), Some(BlueGreenStage::Switched));
    let mut app = advance(&app, &plan);
    app.spec.version = "1".into();
    let plan = Run::new(&app).stable("1", 4, 4).canary("2", 4, 4).plan(5);
    assert_eq!(reasons(&plan), ["Reverted"]);
    assert_eq!((plan.active, plan.preview), (Some(Track::Stable), false));
    let app = advance(&app, &plan);
    assert!(Run::new(&app).stable("1", 4, 4).canary("2", 4, 4).plan(15).canary.is_none(), "drained, then gone");
}

#[test]
fn pods_lost_after_the_switch_send_the_traffic_back_to_the_old_version_until_they_return() {
    let app = blue_green_app(4, false, true);
    let app = advance(&app, &Run::new(&app).stable("1", 4, 4).plan(0));
    let app = advance(&app, &Run::new(&app).stable("1", 4, 4).canary("2", 4, 4).plan(3));
    let short = Run::new(&app).stable("1", 4, 4).canary("2", 4, 2).plan(5);
    assert_eq!(reasons(&short), ["SwitchedBack"]);
    assert_eq!((short.active, stage(&short)), (Some(Track::Stable), Some(BlueGreenStage::Switched)));
    let app = advance(&app, &short);
    // Still short: no second Event, and no promotion however long the delay has run.
    let still = Run::new(&app).stable("1", 4, 4).canary("2", 4, 2).plan(40);
    assert!(still.notes.is_empty());
    assert_eq!((still.active, stage(&still)), (Some(Track::Stable), Some(BlueGreenStage::Switched)));
    let back = Run::new(&app).stable("1", 4, 4).canary("2", 4, 4).plan(41);
    assert_eq!(back.active, Some(Track::Canary));
    assert!(reasons(&back).contains(&"Switched"), "{:?}", reasons(&back));
    // Short for longer than the progress deadline (60 s): rolled back.
    let late = Run::new(&app).stable("1", 4, 4).canary("2", 4, 2).plan(70);
    assert_eq!((late.status.phase, late.active), (Some(AppPhase::RolledBack), Some(Track::Stable)));
}

#[test]
fn an_autoscaled_preview_never_follows_the_idle_stable_deployment_down() {
    let mut app = blue_green_app(1, false, true);
    app.spec.replicas = None;
    app.spec.autoscaling =
        Some(crate::api::Autoscaling { min_replicas: 2, max_replicas: 10, target_cpu_utilization_percentage: None });
    let app = advance(&app, &Run::new(&app).stable("1", 6, 6).plan(0));
    let plan = Run::new(&app).stable("1", 6, 6).canary("2", 6, 6).plan(3);
    assert_eq!(stage(&plan), Some(BlueGreenStage::Switched));
    // After the switch the HPA scales the idle stable Deployment down to its minimum.
    let app = advance(&app, &plan);
    let plan = Run::new(&app).stable("1", 2, 2).canary("2", 6, 6).plan(13);
    assert_eq!(replicas(plan.canary.as_ref().expect("preview")), Some(6), "the serving copy keeps its size");
    assert_eq!(plan.active, Some(Track::Canary));
}

#[test]
fn a_rollback_while_the_stable_deployment_rolls_serves_from_both_tracks() {
    let app = blue_green_app(4, false, true);
    let app = advance(&app, &Run::new(&app).stable("1", 4, 4).plan(0));
    let app = advance(&app, &Run::new(&app).stable("1", 4, 4).canary("2", 4, 4).plan(3));
    let plan = Run::new(&app).stable("1", 4, 4).canary("2", 4, 4).plan(34);
    assert_eq!(stage(&plan), Some(BlueGreenStage::Promoting));
    // A person aborts while the stable Deployment is half way to version 2.
    let abort = with_annotation(&advance(&app, &plan), ANNOTATION_ACTION, "abort 1");
    let plan = Run::new(&abort).stable("2", 4, 2).canary("2", 4, 4).plan(36);
    assert_eq!(plan.status.phase, Some(AppPhase::RolledBack));
    assert_eq!(image(&plan.stable), "example.com/web:1");
    assert!(plan.canary.is_some(), "kept for capacity");
    assert_eq!(plan.active, None, "the kept pods are selected while the stable Deployment is short");
}

#[test]
fn a_failure_held_for_a_person_after_the_switch_takes_the_traffic_off_the_new_version() {
    let mut app = blue_green_app(4, true, true);
    app.spec.rollout.auto_rollback = Some(false);
    let app = advance(&app, &Run::new(&app).stable("1", 4, 4).plan(0));
    let app = advance(&app, &Run::new(&app).stable("1", 4, 4).canary("2", 4, 4).measured(pass()).plan(3));
    let app = advance(&app, &Run::new(&app).stable("1", 4, 4).canary("2", 4, 4).measured(fail()).plan(13));
    let held = Run::new(&app).stable("1", 4, 4).canary("2", 4, 4).measured(fail()).plan(23);
    assert_eq!(held.status.phase, Some(AppPhase::Paused));
    assert!(held.canary.is_some(), "kept for a person to look at");
    assert_eq!(held.active, Some(Track::Stable), "but it serves nothing");
}

#[test]
fn a_promotion_recorded_in_the_future_does_not_hold_the_preview() {
    let app = blue_green_app(2, false, true);
    let mut app = advance(&app, &Run::new(&app).stable("1", 2, 2).plan(0));
    app.spec.version = "1".into();
    let mut reverted = advance(&app, &Run::new(&app).stable("1", 2, 2).canary("2", 2, 2).plan(5));
    if let Some(h) = reverted.status.as_mut().and_then(|s| s.history.first_mut()) {
        h.at = Time(at(3600));
    }
    let plan = Run::new(&reverted).stable("1", 2, 2).canary("2", 2, 2).plan(6);
    assert!(plan.canary.is_none() && plan.recheck.is_none(), "no requeue for a clock an hour ahead");
}

#[test]
fn a_quota_too_small_for_the_preview_waits_with_nothing_created_and_goes_on_when_it_grows() {
    let app = blue_green_app(4, true, true);
    let why = "ResourceQuota team allows pods 6 with 4 used; 4 more pods need 4";
    let plan = Run::new(&app).stable("1", 4, 4).quota(why).plan(0);
    assert_eq!(reasons(&plan), ["RolloutStarted", "QuotaExceeded"]);
    assert!(plan.canary.is_none(), "no part of the preview is created");
    assert_eq!((plan.active, plan.preview), (Some(Track::Stable), false));
    assert_eq!(plan.status.phase, Some(AppPhase::Paused));
    let message = plan.status.conditions.iter().find(|c| c.type_ == PROGRESSING).map(|c| c.message.clone());
    assert!(message.is_some_and(|m| m.contains(why)), "the quota is named");
    assert_eq!((image(&plan.stable), replicas(&plan.stable)), ("example.com/web:1".into(), Some(4)));

    // Still too small long after the deadline: it waits, says it once, and is not rolled back.
    let app = advance(&app, &plan);
    let later = Run::new(&app).stable("1", 4, 4).quota(why).plan(3600);
    assert!(later.notes.is_empty(), "{:?}", later.notes);
    assert_eq!(later.status.phase, Some(AppPhase::Paused));
    // The quota grew: the preview comes up at full size.
    let plan = Run::new(&app).stable("1", 4, 4).plan(3601);
    assert_eq!(plan.canary.as_ref().and_then(replicas), Some(4));
    assert_eq!(stage(&plan), Some(BlueGreenStage::Preview));
}
