//! Table tests of a canary routed through a Gateway API HTTPRoute: the step's exact weight,
//! a stable Deployment that keeps all its replicas, weight 0 at once on promotion and
//! rollback, and a rollout that waits while the route cannot be used.

use super::*;
use crate::api::{GatewayApiRouting, TrafficRouting};

fn routed_app(replicas: i32, weights: &[i32]) -> App {
    let mut app = canary_app(replicas, weights, true);
    if let Some(canary) = app.spec.rollout.strategy.as_mut().and_then(|s| s.canary.as_mut()) {
        canary.traffic_routing = Some(TrafficRouting { gateway_api: GatewayApiRouting { http_route: "shop".into() } });
    }
    app
}

fn pass() -> Vec<Measurement> {
    vec![measurement(MeasurementResult::Pass, Some(0.01))]
}

fn fail() -> Vec<Measurement> {
    vec![measurement(MeasurementResult::Fail, Some(0.3))]
}

fn routed_weight(plan: &Plan) -> Option<i32> {
    plan.status.traffic_routing.as_ref().map(|t| t.canary_weight)
}

#[test]
fn each_step_sets_its_exact_weight_once_its_pods_are_available_and_is_judged_only_at_that_weight() {
    let app = routed_app(5, &[5, 40]);
    let plan = Run::new(&app).stable("1", 5, 5).plan(0);
    assert_eq!(reasons(&plan), ["RolloutStarted"]);
    // 5% of 5 replicas is a quarter of a pod: one canary pod, and the stable five stay.
    assert_eq!(plan.canary.as_ref().and_then(replicas), Some(1));
    assert_eq!(replicas(&plan.stable), Some(5));
    assert_eq!(plan.route_weight, Some(0), "no requests before the canary's pods are available");
    assert_eq!(plan.active, Some(Track::Stable), "the App's Service selects the stable pods only");

    // Available: the weight goes on the route; nothing is judged before the route carries it.
    let app = advance(&app, &plan);
    let plan = Run::new(&app).stable("1", 5, 5).canary("2", 1, 1).plan(2);
    assert_eq!(plan.route_weight, Some(5), "the step's weight, not a share of the replicas (1 of 6 pods)");
    assert_eq!(routed_weight(&plan), Some(5));
    assert_eq!(plan.status.canary.as_ref().map(|c| c.weight), Some(5));
    assert!(!plan.analysis_due, "the route still sends the canary nothing");
    // Even a passing run taken now would judge no requests at 5%: it does not count.
    let early = Run::new(&app).stable("1", 5, 5).canary("2", 1, 1).measured(pass()).plan(2);
    assert!(reasons(&early).is_empty() && early.status.canary.as_ref().is_some_and(|c| c.step == 0));

    // The route carries 5%: the first run waits one analysis interval (10 s) from then.
    let app = advance(&app, &plan);
    let carried = Run::new(&app).stable("1", 5, 5).canary("2", 1, 1).route(Ok(Some(5)));
    let plan = carried.clone().plan(3);
    assert!(!plan.analysis_due);
    assert_eq!(plan.recheck, Some(Duration::from_secs(10)));
    let app = advance(&app, &plan);
    let carried = Run { app: &app, ..carried };
    assert!(!carried.clone().plan(12).analysis_due);
    assert!(carried.clone().plan(13).analysis_due);

    // It passes: the next step's pods first, its weight when they are available.
    let plan = carried.clone().measured(pass()).plan(13);
    assert_eq!(reasons(&plan), ["StepCompleted"]);
    assert_eq!(plan.canary.as_ref().and_then(replicas), Some(2), "40% of 5 replicas, rounded up");
    assert_eq!(replicas(&plan.stable), Some(5));
    assert_eq!(plan.route_weight, Some(5), "the step before's weight until the 2 pods are available");
    let app = advance(&app, &plan);
    let plan = Run::new(&app).stable("1", 5, 5).canary("2", 2, 2).route(Ok(Some(5))).plan(15);
    assert_eq!(plan.route_weight, Some(40));
    assert_eq!(replicas(&plan.stable), Some(5));
}

/// A routed App of 4 replicas at its first step (`weight`, 2 pods for 50%), the route
/// carrying that weight since second 1, judged with `runs` at second 11.
fn judged_step(app: &App, weight: i32, runs: Vec<Measurement>) -> (App, Plan) {
    let pods = (weight * 4 + 99) / 100;
    let start = Run::new(app).stable("1", 4, 4).plan(0);
    let app = advance(app, &start);
    let seen = Run::new(&app).stable("1", 4, 4).canary("2", pods, pods).route(Ok(Some(weight))).plan(1);
    let app = advance(&app, &seen);
    let plan = Run::new(&app).stable("1", 4, 4).canary("2", pods, pods).route(Ok(Some(weight))).measured(runs).plan(11);
    (app, plan)
}

#[test]
fn promotion_keeps_the_weight_on_the_route_while_the_stable_version_rolls_then_sets_0_and_drains_the_canary() {
    let app = routed_app(4, &[50]);
    let (app, plan) = judged_step(&app, 50, pass());
    assert_eq!(reasons(&plan), ["StepCompleted"]);
    assert_eq!(image(&plan.stable), "example.com/web:2", "promoting: the stable Deployment rolls");
    assert_eq!(plan.route_weight, Some(50), "the canary keeps its share meanwhile");

    let app = advance(&app, &plan);
    let plan = Run::new(&app).stable("2", 4, 4).canary("2", 2, 2).route(Ok(Some(50))).plan(16);
    assert_eq!(reasons(&plan), ["Promoted"]);
    assert_eq!(plan.route_weight, Some(0), "every request to the stable Service, in this plan");
    assert!(plan.canary.is_some(), "the canary's pods drain before they go");
    assert_eq!(plan.recheck, Some(DRAIN));
    let app = advance(&app, &plan);
    let done = Run::new(&app).stable("2", 4, 4).canary("2", 2, 2).plan(16 + 10);
    assert!(done.canary.is_none());
    assert_eq!(done.route_weight, Some(0));
}

#[test]
fn promoting_from_an_early_step_never_raises_the_weight_and_a_canary_losing_pods_loses_its_share() {
    // promote-full at the first step (10%, one pod of four): the route keeps 10%, it does not
    // jump to the last step's 90% on one pod.
    let app = routed_app(4, &[10, 90]);
    let start = Run::new(&app).stable("1", 4, 4).plan(0);
    let app = advance(&app, &start);
    let full = with_annotation(&app, ANNOTATION_ACTION, "promote-full 1");
    let plan = Run::new(&full).stable("1", 4, 4).canary("2", 1, 1).route(Ok(Some(10))).plan(2);
    assert!(reasons(&plan).contains(&"PromotedByUser"), "{:?}", reasons(&plan));
    assert_eq!(plan.route_weight, Some(10));
    // Its one pod fails while the stable Deployment rolls: no share left for it.
    let app = advance(&full, &plan);
    let plan = Run::new(&app).stable("1", 4, 4).canary("2", 1, 0).route(Ok(Some(10))).plan(3);
    assert_eq!(plan.route_weight, Some(0));

    // At the second step (90%, four pods), two of its pods fail: at most 2 of 4 replicas' share,
    // and never more than the step before's.
    let app = routed_app(4, &[40, 90]);
    let (app, plan) = judged_step(&app, 40, pass());
    assert_eq!(reasons(&plan), ["StepCompleted"]);
    let app = advance(&app, &plan);
    let short = Run::new(&app).stable("1", 4, 4).canary("2", 4, 1).route(Ok(Some(40))).plan(12);
    assert_eq!(short.route_weight, Some(25), "1 of 4 replicas available: 25%, below the step before's 40%");
    let gone = Run::new(&app).stable("1", 4, 4).canary("2", 4, 0).route(Ok(Some(40))).plan(12);
    assert_eq!(gone.route_weight, Some(0));
}

#[test]
fn a_rollback_sets_weight_0_at_once_and_never_shrinks_the_stable_version() {
    let app = routed_app(4, &[50, 100]);
    let (app, plan) = judged_step(&app, 50, fail());
    let run = Run::new(&app).stable("1", 4, 4).canary("2", 2, 2).route(Ok(Some(50)));
    assert_eq!(plan.route_weight, Some(50), "one failed run of two: the step goes on");
    let app = advance(&app, &plan);
    let plan = Run { app: &app, ..run }.measured(fail()).plan(21);
    assert_eq!(plan.status.phase, Some(AppPhase::RolledBack));
    assert_eq!(plan.route_weight, Some(0));
    assert_eq!((image(&plan.stable), replicas(&plan.stable)), ("example.com/web:1".into(), Some(4)));
    assert_eq!(plan.active, Some(Track::Stable));
    assert!(plan.canary.is_some(), "drained, not cut");
    let app = advance(&app, &plan);
    assert!(Run::new(&app).stable("1", 4, 4).canary("2", 2, 2).plan(21 + 10).canary.is_none());
}

#[test]
fn a_route_that_cannot_be_used_holds_the_step_and_says_why_once() {
    let app = routed_app(4, &[25, 50]);
    let start = Run::new(&app).stable("1", 4, 4).plan(0);
    let app = advance(&app, &start);
    let missing = Err("HTTPRoute shop does not exist".to_string());
    let plan = Run::new(&app).stable("1", 4, 4).canary("2", 1, 1).route(missing.clone()).measured(pass()).plan(3);
    assert_eq!(reasons(&plan), ["RouteNotUsable"]);
    assert_eq!(plan.status.phase, Some(AppPhase::Paused));
    assert_eq!(
        plan.status.conditions.iter().find(|c| c.type_ == READY).map(|c| c.reason.as_str()),
        Some("RouteNotUsable")
    );
    assert_eq!(plan.status.canary.as_ref().map(|c| c.step), Some(0), "no step is taken");
    assert_eq!(plan.route_weight, None, "nothing is written to a route that cannot be used");
    let problem = plan.status.traffic_routing.as_ref().and_then(|t| t.problem.clone());
    assert_eq!(problem.as_deref(), Some("HTTPRoute shop does not exist"));
    assert!(!plan.analysis_due, "no runs on a canary that may take no requests");

    // Said once; the next look with the same problem is quiet.
    let app = advance(&app, &plan);
    let again = Run::new(&app).stable("1", 4, 4).canary("2", 1, 1).route(missing).plan(8);
    assert!(again.notes.is_empty(), "{:?}", again.notes);
    // Usable again: the step goes on from where it waited.
    let plan = Run::new(&app).stable("1", 4, 4).canary("2", 1, 1).plan(9);
    assert!(plan.status.traffic_routing.as_ref().is_some_and(|t| t.problem.is_none()));
    assert_eq!(plan.route_weight, Some(25));
}

#[test]
fn a_routed_canary_may_take_every_replica_and_an_unrouted_one_may_not() {
    let routed = routed_app(4, &[100]);
    let plan = Run::new(&routed).stable("1", 4, 4).plan(0);
    assert_eq!((plan.canary.as_ref().and_then(replicas), replicas(&plan.stable)), (Some(4), Some(4)));
    let unrouted = canary_app(4, &[100], true);
    let plan = Run::new(&unrouted).stable("1", 4, 4).plan(0);
    assert_eq!(plan.canary.as_ref().and_then(replicas), Some(3));
    assert_eq!((plan.route_weight, plan.status.traffic_routing.clone()), (None, None));
}

#[test]
fn a_steady_routed_app_keeps_weight_0() {
    let app = routed_app(3, &[50]);
    let mut steady = app.clone();
    steady.spec.version = "1".into();
    let plan = Run::new(&steady).stable("1", 3, 3).plan(0);
    assert_eq!((plan.route_weight, plan.active, plan.canary.is_none()), (Some(0), Some(Track::Stable), true));
    assert_eq!(plan.status.phase, Some(AppPhase::Healthy));
}
