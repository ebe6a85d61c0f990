//! Table and property tests of the planner: every transition, and the invariants.

use super::*;
use crate::api::{Analysis, AppSpec, CanaryStep, CanaryStrategy, MetricCheck, RolloutSpec, Strategy};
use crate::app::desired::{AppIdentity, deployment, render};
use k8s_openapi::api::apps::v1::DeploymentStatus;
use proptest::prelude::*;
use std::collections::BTreeMap;

const T0: i64 = 1_000_000;

fn at(second: i64) -> Timestamp {
    Timestamp::from_second(T0 + second).expect("timestamp")
}

fn canary_app(replicas: i32, weights: &[i32], analysis: bool) -> App {
    let steps = weights.iter().map(|w| CanaryStep { weight: *w, pause: None }).collect();
    let mut app = App::new(
        "web",
        AppSpec {
            image: "example.com/web".into(),
            version: "2".into(),
            replicas: Some(replicas),
            rollout: RolloutSpec {
                strategy: Some(Strategy {
                    type_: StrategyType::Canary,
                    rolling: None,
                    canary: Some(CanaryStrategy { steps, traffic_routing: None }),
                    blue_green: None,
                }),
                analysis: analysis.then(|| Analysis {
                    interval: Some("10s".into()),
                    failure_limit: Some(2),
                    prometheus_url: None,
                    metrics: vec![MetricCheck {
                        name: "error-rate".into(),
                        query: "q".into(),
                        max: Some(0.05),
                        min: None,
                    }],
                }),
                progress_deadline: Some("60s".into()),
                ..RolloutSpec::default()
            },
            ..AppSpec::default()
        },
    );
    app.metadata.namespace = Some("shop".into());
    app.metadata.uid = Some("uid".into());
    app.metadata.generation = Some(2);
    app.status = Some(AppStatus {
        current_version: Some("1".into()),
        target_version: Some("1".into()),
        phase: Some(AppPhase::Healthy),
        ..AppStatus::default()
    });
    app
}

fn rolling_app(analysis: bool) -> App {
    let mut app = canary_app(4, &[50], analysis);
    app.spec.rollout.strategy = None;
    app
}

/// A Deployment as the controller would report it once it runs `version` with `ready` of
/// `replicas` available.
fn observed(app: &App, track: Track, version: &str, replicas: i32, ready: i32) -> Deployment {
    observed_with(app, track, version, app.spec.template.clone(), replicas, ready)
}

/// Like `observed`, running `revision` of `template`.
fn observed_with(
    app: &App,
    track: Track,
    version: &str,
    template: Option<PodTemplate>,
    replicas: i32,
    ready: i32,
) -> Deployment {
    let id = AppIdentity::of(app).expect("id");
    let shape = DeploymentShape {
        track,
        version: version.into(),
        template,
        replicas: Some(replicas),
        paused: false,
        keep_running_pods: false,
    };
    let mut d = deployment(app, &id, &shape);
    d.metadata.generation = Some(1);
    d.status = Some(DeploymentStatus {
        observed_generation: Some(1),
        replicas: Some(replicas),
        updated_replicas: Some(replicas),
        ready_replicas: Some(ready),
        available_replicas: Some(ready),
        ..DeploymentStatus::default()
    });
    d
}

fn measurement(result: MeasurementResult, value: Option<f64>) -> Measurement {
    Measurement { name: "error-rate".into(), result, value, min: None, max: Some(0.05), message: Some("m".into()) }
}

#[derive(Clone)]
struct Run<'a> {
    stable: Option<Deployment>,
    canary: Option<Deployment>,
    measurements: Option<Vec<Measurement>>,
    route: Option<Result<Option<i32>, String>>,
    quota: Option<String>,
    min_interval: Duration,
    app: &'a App,
}

impl<'a> Run<'a> {
    fn new(app: &'a App) -> Self {
        // A routed App's route is usable unless a test says otherwise.
        let route = app.spec.http_route().map(|_| Ok(Some(0)));
        Self { stable: None, canary: None, measurements: None, route, quota: None, min_interval: Duration::ZERO, app }
    }
    fn stable(mut self, version: &str, replicas: i32, ready: i32) -> Self {
        self.stable = Some(observed(self.app, Track::Stable, version, replicas, ready));
        self
    }
    /// A stable Deployment running `revision` of `template` (not the spec's).
    fn stable_running(mut self, revision: &str, template: PodTemplate, replicas: i32, ready: i32) -> Self {
        self.stable = Some(observed_with(self.app, Track::Stable, revision, Some(template), replicas, ready));
        self
    }
    fn canary(mut self, version: &str, replicas: i32, ready: i32) -> Self {
        self.canary = Some(observed(self.app, Track::Canary, version, replicas, ready));
        self
    }
    fn quota(mut self, why: &str) -> Self {
        self.quota = Some(why.to_string());
        self
    }
    fn route(mut self, route: Result<Option<i32>, String>) -> Self {
        self.route = Some(route);
        self
    }
    fn min_interval(mut self, floor: Duration) -> Self {
        self.min_interval = floor;
        self
    }
    fn measured(mut self, m: Vec<Measurement>) -> Self {
        self.measurements = Some(m);
        self
    }
    fn plan(&self, second: i64) -> Plan {
        let input = Input {
            app: self.app,
            observed: Observed {
                stable: self.stable.as_ref(),
                canary: self.canary.as_ref(),
                hpa: None,
                route: self.route.clone(),
                quota: self.quota.clone(),
            },
            measurements: self.measurements.as_deref(),
            now: at(second),
            min_interval: self.min_interval,
        };
        Plan::rendered(plan(&input).expect("plan"), self.app, self.stable.as_ref(), self.canary.as_ref())
    }
}

/// A plan with its Deployments rendered as the reconciler renders them (`app::desired`), so
/// that the tables read images, replica counts and templates.
#[derive(Clone, Debug)]
struct Plan {
    stable: Deployment,
    canary: Option<Deployment>,
    status: AppStatus,
    notes: Vec<Note>,
    recheck: Option<Duration>,
    analysis_due: bool,
    active: Option<Track>,
    preview: bool,
    route_weight: Option<i32>,
}

impl Plan {
    fn rendered(p: super::Plan, app: &App, stable: Option<&Deployment>, canary: Option<&Deployment>) -> Self {
        let id = AppIdentity::of(app).expect("id");
        Plan {
            stable: render(app, &id, &p.stable, stable).expect("a stable Deployment"),
            canary: p.canary.as_ref().and_then(|w| render(app, &id, w, canary)),
            status: p.status,
            notes: p.notes,
            recheck: p.recheck,
            analysis_due: p.analysis_due,
            active: p.active,
            preview: p.preview,
            route_weight: p.route_weight,
        }
    }
}

/// Feeds a plan's status back into the App, as the next reconcile would read it.
fn advance(app: &App, plan: &Plan) -> App {
    let mut next = app.clone();
    next.status = Some(plan.status.clone());
    next
}

fn image(d: &Deployment) -> String {
    let containers = d.spec.as_ref().and_then(|s| s.template.spec.as_ref()).map(|p| p.containers.as_slice());
    let main = containers.and_then(|c| c.get(crate::api::template::main_container(c)?));
    main.and_then(|c| c.image.clone()).unwrap_or_default()
}

fn replicas(d: &Deployment) -> Option<i32> {
    d.spec.as_ref().and_then(|s| s.replicas)
}

fn reasons(plan: &Plan) -> Vec<&'static str> {
    plan.notes.iter().map(|n| n.reason).collect()
}

#[test]
fn first_deployment_goes_straight_in() {
    let mut app = canary_app(3, &[20], true);
    app.status = None;
    let plan = Run::new(&app).plan(0);
    assert_eq!(image(&plan.stable), "example.com/web:2");
    assert!(plan.canary.is_none());
    assert_eq!(plan.status.phase, Some(AppPhase::Progressing));
    assert!(!plan.analysis_due);
    let done = Run::new(&app).stable("2", 3, 3).plan(5);
    assert_eq!(done.status.phase, Some(AppPhase::Healthy));
    assert_eq!(done.status.current_version.as_deref(), Some("2"));
}

#[test]
fn a_new_version_starts_a_canary_beside_the_stable_version() {
    let app = canary_app(5, &[20, 50], true);
    let plan = Run::new(&app).stable("1", 5, 5).plan(0);
    assert_eq!(reasons(&plan), ["RolloutStarted"]);
    let canary = plan.canary.as_ref().expect("canary");
    assert_eq!((image(canary), replicas(canary)), ("example.com/web:2".into(), Some(1)));
    assert_eq!(canary.metadata.name.as_deref(), Some("web-canary"));
    assert_eq!((image(&plan.stable), replicas(&plan.stable)), ("example.com/web:1".into(), Some(5)));
    let c = plan.status.canary.as_ref().expect("canary status");
    assert_eq!((c.step, c.steps, c.weight, c.replicas), (0, 2, 20, 1));
    assert_eq!(plan.status.target_version.as_deref(), Some("2"));
    assert_eq!(plan.status.current_version.as_deref(), Some("1"));
    assert!(!plan.analysis_due, "no analysis before the canary is available");

    // The canary is available: the stable Deployment gives up a replica, and a run is due.
    let app = advance(&app, &plan);
    let plan = Run::new(&app).stable("1", 5, 5).canary("2", 1, 1).plan(3);
    assert_eq!(replicas(&plan.stable), Some(4));
    assert!(plan.analysis_due);
    assert_eq!(plan.status.canary.as_ref().map(|c| c.step), Some(0), "no step without a passing run");
}

#[test]
fn a_passing_run_moves_to_the_next_step_and_then_promotes() {
    let app = canary_app(5, &[20, 50], true);
    let app = advance(&app, &Run::new(&app).stable("1", 5, 5).plan(0));
    let pass = vec![measurement(MeasurementResult::Pass, Some(0.01))];
    let plan = Run::new(&app).stable("1", 4, 4).canary("2", 1, 1).measured(pass.clone()).plan(3);
    assert_eq!(reasons(&plan), ["StepCompleted"]);
    let c = plan.status.canary.as_ref().expect("canary");
    assert_eq!((c.step, c.weight, c.replicas), (1, 50, 3), "50% of 5 rounds to 3");
    assert_eq!(replicas(plan.canary.as_ref().expect("canary")), Some(3));
    assert_eq!(replicas(&plan.stable), Some(4), "stable shrinks only as canary replicas become available");

    // Step 2: the next run is due one interval after the last one.
    let app = advance(&app, &plan);
    let early = Run::new(&app).stable("1", 4, 4).canary("2", 3, 3).plan(8);
    assert!(!early.analysis_due);
    assert_eq!(replicas(&early.stable), Some(2), "{:?} {:?}", early.status.canary, early.status.conditions);
    let due = Run::new(&app).stable("1", 2, 2).canary("2", 3, 3).plan(13);
    assert!(due.analysis_due);
    let plan = Run::new(&app).stable("1", 2, 2).canary("2", 3, 3).measured(pass).plan(13);
    assert_eq!(plan.status.canary.as_ref().map(|c| c.step), Some(2), "promoting");
    assert_eq!((image(&plan.stable), replicas(&plan.stable)), ("example.com/web:2".into(), Some(5)));
    assert!(plan.canary.is_some(), "the canary serves until the stable Deployment has rolled");

    // Promotion completes: canary removed, the new version is current.
    let app = advance(&app, &plan);
    let plan = Run::new(&app).stable("2", 5, 5).canary("2", 3, 3).plan(20);
    assert!(plan.canary.is_none());
    assert_eq!(plan.status.current_version.as_deref(), Some("2"));
    assert_eq!(plan.status.phase, Some(AppPhase::Healthy));
    assert_eq!(plan.status.history[0].result, RolloutResult::Promoted);
    assert!(plan.status.canary.is_none() && plan.status.rollout.is_none());
    assert_eq!(reasons(&plan), ["Promoted"]);
}

#[test]
fn failed_runs_up_to_the_limit_roll_back() {
    let app = canary_app(5, &[20, 50], true);
    let app = advance(&app, &Run::new(&app).stable("1", 5, 5).plan(0));
    let fail = vec![measurement(MeasurementResult::Fail, Some(0.3))];
    let first = Run::new(&app).stable("1", 4, 4).canary("2", 1, 1).measured(fail.clone()).plan(3);
    assert_eq!(reasons(&first), ["AnalysisFailed"]);
    assert!(first.canary.is_some());
    assert_eq!(first.status.analysis.as_ref().map(|a| a.failures), Some(1));
    let app = advance(&app, &first);
    let second = Run::new(&app).stable("1", 4, 4).canary("2", 1, 1).measured(fail).plan(13);
    assert_eq!(reasons(&second), ["AnalysisFailed", "RolledBack"]);
    assert!(second.canary.is_some(), "the canary serves until the stable Deployment is back to 5");
    assert_eq!((image(&second.stable), replicas(&second.stable)), ("example.com/web:1".into(), Some(5)));
    assert_eq!(second.status.phase, Some(AppPhase::RolledBack));
    assert_eq!(second.status.current_version.as_deref(), Some("1"));
    let failed = second.status.failed_version.as_ref().expect("failed version");
    assert_eq!((failed.version.as_str(), failed.reason.as_str()), ("2", "AnalysisFailed"));
    assert!(failed.message.contains("error-rate"), "{}", failed.message);
    let ready = second.status.conditions.iter().find(|c| c.type_ == PROGRESSING).expect("condition");
    assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("False", "AnalysisFailed"));

    // It stays rolled back: the same version is not tried again.
    let app = advance(&app, &second);
    let later = Run::new(&app).stable("1", 5, 5).plan(100);
    assert!(later.canary.is_none());
    assert!(later.notes.is_empty());
    assert_eq!(later.status.phase, Some(AppPhase::RolledBack));
    assert!(!later.analysis_due);
}

#[test]
fn no_usable_data_pauses_and_never_advances() {
    let app = canary_app(5, &[20], true);
    let app = advance(&app, &Run::new(&app).stable("1", 5, 5).plan(0));
    let none = vec![measurement(MeasurementResult::Inconclusive, None)];
    let plan = Run::new(&app).stable("1", 4, 4).canary("2", 1, 1).measured(none.clone()).plan(3);
    assert_eq!(plan.status.phase, Some(AppPhase::Paused));
    assert_eq!(reasons(&plan), ["AnalysisInconclusive"]);
    assert_eq!(plan.status.canary.as_ref().map(|c| c.step), Some(0));
    assert_eq!(plan.status.analysis.as_ref().map(|a| a.failures), Some(0), "not a failure either");
    let app = advance(&app, &plan);
    let again = Run::new(&app).stable("1", 4, 4).canary("2", 1, 1).measured(none).plan(13);
    assert!(again.notes.is_empty(), "one Event per change, not per run");
    assert_eq!(again.status.phase, Some(AppPhase::Paused));
    let app = advance(&app, &again);
    let pass = vec![measurement(MeasurementResult::Pass, Some(0.0))];
    let back = Run::new(&app).stable("1", 4, 4).canary("2", 1, 1).measured(pass).plan(23);
    assert_eq!(reasons(&back), ["AnalysisPassed", "StepCompleted"]);
}

/// What `app::status::run_may_wait` relies on: a passing run at a step held for a person
/// changes nothing of the status but the analysis, so it need not be written; a failing one
/// changes its failures.
#[test]
fn a_run_at_a_held_step_changes_only_the_analysis() {
    let mut app = canary_app(5, &[20, 50], true);
    if let Some(c) = app.spec.rollout.strategy.as_mut().and_then(|s| s.canary.as_mut()) {
        c.steps[0].pause = Some(PAUSE_UNTIL_PROMOTED.into());
    }
    let app = advance(&app, &Run::new(&app).stable("1", 5, 5).plan(0));
    let pass = |v| vec![measurement(MeasurementResult::Pass, Some(v))];
    let first = Run::new(&app).stable("1", 4, 4).canary("2", 1, 1).measured(pass(0.01)).plan(3);
    let app = advance(&app, &first);
    let again = Run::new(&app).stable("1", 4, 4).canary("2", 1, 1).measured(pass(0.02)).plan(14);
    assert_eq!(again.status.canary, first.status.canary, "still held at the first step");
    assert_ne!(again.status.analysis, first.status.analysis, "a newer run, another value");
    assert!(crate::app::status::run_may_wait(app.status.as_ref(), &again.status, at(14)), "{:#?}", again.status);
    let fail = vec![measurement(MeasurementResult::Fail, Some(0.5))];
    let failed = Run::new(&app).stable("1", 4, 4).canary("2", 1, 1).measured(fail).plan(14);
    assert!(!crate::app::status::run_may_wait(app.status.as_ref(), &failed.status, at(14)));
}

#[test]
fn the_platforms_floor_raises_a_shorter_interval() {
    // The App asks for 10 s; the platform allows no run more often than every 30 s.
    let app = canary_app(5, &[20, 50], true);
    let app = advance(&app, &Run::new(&app).stable("1", 5, 5).plan(0));
    let floor = Duration::from_secs(30);
    let pass = vec![measurement(MeasurementResult::Pass, Some(0.01))];
    let plan = Run::new(&app).stable("1", 4, 4).canary("2", 1, 1).min_interval(floor).measured(pass).plan(3);
    assert_eq!(plan.recheck, Some(floor), "looked at again after the floor, not the App's 10 s");
    let app = advance(&app, &plan);
    let early = Run::new(&app).stable("1", 4, 4).canary("2", 3, 3).min_interval(floor).plan(20);
    assert!(!early.analysis_due, "17 s after the last run: not due under a 30 s floor");
    let without = Run::new(&app).stable("1", 4, 4).canary("2", 3, 3).plan(20);
    assert!(without.analysis_due, "and due without it");
    let due = Run::new(&app).stable("1", 4, 4).canary("2", 3, 3).min_interval(floor).plan(33);
    assert!(due.analysis_due);
}

#[test]
fn an_invalid_query_degrades_without_advancing() {
    let app = canary_app(5, &[20], true);
    let app = advance(&app, &Run::new(&app).stable("1", 5, 5).plan(0));
    let bad = vec![measurement(MeasurementResult::Invalid, None)];
    let plan = Run::new(&app).stable("1", 4, 4).canary("2", 1, 1).measured(bad).plan(3);
    assert_eq!(plan.status.phase, Some(AppPhase::Degraded));
    let c = plan.status.conditions.iter().find(|c| c.type_ == PROGRESSING).expect("condition");
    assert_eq!(c.reason, "QueryInvalid");
    assert_eq!(plan.recheck, Some(Duration::from_secs(10)), "looked at again after an interval, not hot");
}

#[test]
fn setting_the_stable_version_back_reverts_at_once_and_keeps_capacity() {
    let app = canary_app(5, &[20, 50], true);
    let mut app = advance(&app, &Run::new(&app).stable("1", 4, 4).canary("2", 1, 1).plan(0));
    app.spec.version = "1".into();
    let plan = Run::new(&app).stable("1", 4, 4).canary("2", 1, 1).plan(2);
    assert_eq!((image(&plan.stable), replicas(&plan.stable)), ("example.com/web:1".into(), Some(5)));
    assert_eq!(reasons(&plan), ["Reverted"]);
    assert_eq!(plan.status.history[0].result, RolloutResult::Reverted);
    assert!(plan.status.rollout.is_none() && plan.status.canary.is_none());
    // The canary's pod serves until the stable Deployment is back to 5, then goes.
    assert_eq!(plan.canary.as_ref().map(image).as_deref(), Some("example.com/web:2"), "kept as it is");
    let app = advance(&app, &plan);
    let short = Run::new(&app).stable("1", 5, 4).canary("2", 1, 1).plan(4);
    assert!(short.canary.is_some(), "still short of 5");
    assert!(short.notes.is_empty(), "the revert is noted once");
    assert!(Run::new(&app).stable("1", 5, 5).canary("2", 1, 1).plan(5).canary.is_none());
    // Never longer than the progress deadline (60 s) after the revert.
    assert!(Run::new(&app).stable("1", 5, 4).canary("2", 1, 1).plan(63).canary.is_none());
}

#[test]
fn a_new_version_during_a_rollout_restarts_it() {
    let app = canary_app(5, &[20, 50], true);
    let app = advance(&app, &Run::new(&app).stable("1", 5, 5).plan(0));
    let pass = vec![measurement(MeasurementResult::Pass, Some(0.0))];
    let mut app = advance(&app, &Run::new(&app).stable("1", 4, 4).canary("2", 1, 1).measured(pass).plan(3));
    assert_eq!(app.status.as_ref().and_then(|s| s.canary.as_ref()).map(|c| c.step), Some(1));
    app.spec.version = "3".into();
    let plan = Run::new(&app).stable("1", 2, 2).canary("2", 3, 3).plan(5);
    assert_eq!(reasons(&plan), ["Superseded", "RolloutStarted"]);
    let c = plan.status.canary.as_ref().expect("canary");
    assert_eq!((c.step, c.weight), (0, 20));
    assert_eq!(image(plan.canary.as_ref().expect("canary")), "example.com/web:3");
    assert_eq!(plan.status.analysis.as_ref().map(|a| (a.failures, a.last_run.is_none())), Some((0, true)));
    assert_eq!(replicas(&plan.stable), Some(5), "the old canary's pods do not count for the new version");
}

#[test]
fn a_canary_that_never_becomes_available_is_rolled_back_by_the_health_gate() {
    let app = canary_app(3, &[50], false);
    let app = advance(&app, &Run::new(&app).stable("1", 3, 3).plan(0));
    let waiting = Run::new(&app).stable("1", 3, 3).canary("2", 2, 0).plan(59);
    assert!(waiting.canary.is_some());
    assert_eq!(waiting.status.phase, Some(AppPhase::Progressing));
    let plan = Run::new(&app).stable("1", 3, 3).canary("2", 2, 0).plan(61);
    assert!(plan.canary.is_none());
    assert_eq!(plan.status.phase, Some(AppPhase::RolledBack));
    let failed = plan.status.failed_version.as_ref().expect("failed");
    assert_eq!(failed.reason, "ProgressDeadlineExceeded");
    assert!(failed.message.contains("web-canary"), "{}", failed.message);
}

#[test]
fn a_rollback_keeps_the_canary_until_the_stable_deployment_is_back_within_the_deadline() {
    let app = canary_app(4, &[50], true);
    let app = advance(&app, &Run::new(&app).stable("1", 4, 4).plan(0));
    let fail = vec![measurement(MeasurementResult::Fail, Some(0.3))];
    let app = advance(&app, &Run::new(&app).stable("1", 2, 2).canary("2", 2, 2).measured(fail.clone()).plan(3));
    let rolled = Run::new(&app).stable("1", 2, 2).canary("2", 2, 2).measured(fail).plan(13);
    assert_eq!(rolled.status.phase, Some(AppPhase::RolledBack));
    assert_eq!(replicas(&rolled.stable), Some(4), "the stable Deployment goes back to all replicas");
    let kept = rolled.canary.as_ref().expect("the canary is kept while the stable Deployment is short");
    assert_eq!(Some(kept), Run::new(&app).stable("1", 2, 2).canary("2", 2, 2).canary.as_ref(), "kept as it is");
    let ready = rolled.status.conditions.iter().find(|c| c.type_ == READY).expect("Ready");
    assert!(ready.message.contains("back to 4 available replicas (2/4 now)"), "{}", ready.message);
    assert!(rolled.recheck.is_some());

    let app = advance(&app, &rolled);
    // Scaled up, the new pods not yet available: still kept. All available: removed.
    let short = Run::new(&app).stable("1", 4, 3).canary("2", 2, 2).plan(20);
    assert!(short.canary.is_some());
    let back = Run::new(&app).stable("1", 4, 4).canary("2", 2, 2).plan(21);
    assert!(back.canary.is_none(), "removed once the stable Deployment is back");
    assert_eq!(back.status.phase, Some(AppPhase::RolledBack));
    // Pods the stable Deployment cannot create (a quota): not kept.
    let mut blocked = Run::new(&app).stable("1", 4, 3).canary("2", 2, 2);
    if let Some(status) = blocked.stable.as_mut().and_then(|d| d.status.as_mut()) {
        status.conditions = Some(vec![k8s_openapi::api::apps::v1::DeploymentCondition {
            type_: "ReplicaFailure".into(),
            status: "True".into(),
            reason: Some("FailedCreate".into()),
            message: Some("exceeded quota".into()),
            ..Default::default()
        }]);
    }
    assert!(blocked.plan(20).canary.is_none(), "a stable Deployment that cannot create pods does not wait");
    // Never kept past the progress deadline (60 s) after the rollback.
    let late = Run::new(&app).stable("1", 4, 3).canary("2", 2, 2).plan(13 + 60);
    assert!(late.canary.is_none(), "removed at the deadline even with the stable Deployment short");
    // Nothing to keep when no canary runs.
    assert!(Run::new(&app).stable("1", 4, 3).plan(20).canary.is_none());
}

#[test]
fn a_step_paused_until_promoted_waits_for_a_person_and_keeps_analysing() {
    let mut app = canary_app(4, &[25, 50], true);
    if let Some(c) = app.spec.rollout.strategy.as_mut().and_then(|s| s.canary.as_mut()) {
        c.steps[0].pause = Some(PAUSE_UNTIL_PROMOTED.into());
    }
    let app = advance(&app, &Run::new(&app).stable("1", 4, 4).plan(0));
    let pass = vec![measurement(MeasurementResult::Pass, Some(0.01))];
    // Available and passing, for as long as anyone waits: the step does not move on.
    let mut waiting = app.clone();
    for second in [3, 13, 600] {
        let plan = Run::new(&waiting).stable("1", 3, 3).canary("2", 1, 1).measured(pass.clone()).plan(second);
        assert_eq!(plan.status.canary.as_ref().map(|c| c.step), Some(0), "at {second} s");
        assert_eq!(plan.status.phase, Some(AppPhase::Paused));
        let ready = plan.status.conditions.iter().find(|c| c.type_ == PROGRESSING).expect("Progressing");
        assert_eq!(ready.reason, "WaitingForPromote");
        assert!(ready.message.starts_with("Paused (waiting for promote)"), "{}", ready.message);
        waiting = advance(&waiting, &plan);
    }
    // A failure while it waits still rolls back.
    let fail = vec![measurement(MeasurementResult::Fail, Some(0.3))];
    let once =
        advance(&waiting, &Run::new(&waiting).stable("1", 3, 3).canary("2", 1, 1).measured(fail.clone()).plan(610));
    let failed = Run::new(&once).stable("1", 3, 3).canary("2", 1, 1).measured(fail).plan(620);
    assert_eq!(failed.status.phase, Some(AppPhase::RolledBack));
    // A person promotes: on to the next step, which has no gate.
    let promote = with_annotation(&waiting, ANNOTATION_ACTION, "promote 1");
    let plan = Run::new(&promote).stable("1", 3, 3).canary("2", 1, 1).plan(601);
    assert_eq!(plan.status.canary.as_ref().map(|c| (c.step, c.weight)), Some((1, 50)));
    assert_eq!(reasons(&plan), ["StepPromotedByUser"]);
    assert_eq!(plan.status.phase, Some(AppPhase::Progressing));
}

#[test]
fn without_auto_rollback_a_failure_holds_the_rollout() {
    let mut app = canary_app(5, &[20], true);
    app.spec.rollout.auto_rollback = Some(false);
    let app = advance(&app, &Run::new(&app).stable("1", 5, 5).plan(0));
    let fail = vec![measurement(MeasurementResult::Fail, Some(0.3))];
    let app = advance(&app, &Run::new(&app).stable("1", 4, 4).canary("2", 1, 1).measured(fail.clone()).plan(3));
    let plan = Run::new(&app).stable("1", 4, 4).canary("2", 1, 1).measured(fail).plan(13);
    assert_eq!(plan.status.phase, Some(AppPhase::Paused));
    assert!(plan.canary.is_some(), "the canary stays for a person to look at");
    assert!(plan.status.failed_version.is_none());
    let app = advance(&app, &plan);
    let later = Run::new(&app).stable("1", 4, 4).canary("2", 1, 1).plan(30);
    assert!(!later.analysis_due, "no more runs once the limit is reached");
    assert_eq!(later.status.phase, Some(AppPhase::Paused));
}

fn with_annotation(app: &App, key: &str, value: &str) -> App {
    let mut app = app.clone();
    app.metadata.annotations.get_or_insert_with(BTreeMap::new).insert(key.into(), value.into());
    app
}

#[test]
fn user_requests() {
    let app = canary_app(5, &[20, 50], true);
    let app = advance(&app, &Run::new(&app).stable("1", 5, 5).plan(0));

    // Pause: no runs, no steps.
    let paused = with_annotation(&app, ANNOTATION_PAUSED, "true");
    let plan = Run::new(&paused).stable("1", 4, 4).canary("2", 1, 1).plan(3);
    assert_eq!(plan.status.phase, Some(AppPhase::Paused));
    assert!(!plan.analysis_due);

    // Promote one step, once per request id.
    let promote = with_annotation(&app, ANNOTATION_ACTION, "promote 1");
    let plan = Run::new(&promote).stable("1", 4, 4).canary("2", 1, 1).plan(3);
    assert_eq!(plan.status.canary.as_ref().map(|c| c.step), Some(1));
    assert_eq!(plan.status.handled_action.as_deref(), Some("promote 1"));
    let again = Run::new(&advance(&promote, &plan)).stable("1", 4, 4).canary("2", 3, 1).plan(4);
    assert_eq!(again.status.canary.as_ref().map(|c| c.step), Some(1), "the same request acts once");

    // Promote fully: straight to promotion.
    let full = with_annotation(&app, ANNOTATION_ACTION, "promote-full 2");
    let plan = Run::new(&full).stable("1", 4, 4).canary("2", 1, 1).plan(3);
    assert_eq!(plan.status.canary.as_ref().map(|c| c.step), Some(2));
    assert_eq!(image(&plan.stable), "example.com/web:2");

    // Abort, then retry.
    let abort = with_annotation(&app, ANNOTATION_ACTION, "abort 3");
    let plan = Run::new(&abort).stable("1", 4, 4).canary("2", 1, 1).plan(3);
    assert_eq!(plan.status.phase, Some(AppPhase::RolledBack));
    assert_eq!(plan.status.failed_version.as_ref().map(|f| f.reason.as_str()), Some("Aborted"));
    assert!(plan.canary.is_some(), "kept until the stable Deployment is back to 5");
    assert!(Run::new(&advance(&abort, &plan)).stable("1", 5, 5).canary("2", 1, 1).plan(4).canary.is_none());
    let retry = with_annotation(&advance(&abort, &plan), ANNOTATION_ACTION, "retry 4");
    let plan = Run::new(&retry).stable("1", 5, 5).plan(5);
    assert_eq!(reasons(&plan), ["RolloutStarted"]);
    assert!(plan.canary.is_some());
    assert!(plan.status.failed_version.is_none());

    let unknown = with_annotation(&app, ANNOTATION_ACTION, "explode 5");
    assert_eq!(reasons(&Run::new(&unknown).stable("1", 5, 5).plan(3)), ["UnknownAction"]);
}

#[test]
fn a_spec_change_retries_a_rolled_back_version() {
    let app = canary_app(5, &[20], false);
    let abort = with_annotation(&app, ANNOTATION_ACTION, "abort 1");
    let abort = advance(&abort, &Run::new(&abort).stable("1", 5, 5).plan(0));
    let rolled_back = advance(&abort, &Run::new(&abort).stable("1", 5, 5).plan(1));
    assert_eq!(rolled_back.status.as_ref().and_then(|s| s.phase), Some(AppPhase::RolledBack));
    let mut changed = rolled_back.clone();
    changed.metadata.generation = Some(3);
    assert_eq!(reasons(&Run::new(&changed).stable("1", 5, 5).plan(2)), ["RolloutStarted"]);
}

#[test]
fn the_stable_pod_template_is_kept_during_a_canary() {
    let app = canary_app(3, &[50], false);
    let stable = observed(&app, Track::Stable, "1", 3, 3);
    let mut changed = app.clone();
    changed.spec.pod_annotations = Some(BTreeMap::from([("a".to_string(), "b".to_string())]));
    let input = Input {
        app: &changed,
        observed: Observed { stable: Some(&stable), canary: None, hpa: None, route: None, quota: None },
        measurements: None,
        now: at(0),
        min_interval: Duration::ZERO,
    };
    let plan = Plan::rendered(plan(&input).expect("plan"), &changed, Some(&stable), None);
    let template = |d: &Deployment| d.spec.as_ref().map(|s| s.template.clone());
    assert_eq!(template(&plan.stable), template(&stable), "stable pods are not restarted");
    let canary_annotations =
        plan.canary.as_ref().and_then(|d| d.spec.as_ref()?.template.metadata.as_ref()?.annotations.clone());
    assert_eq!(canary_annotations, changed.spec.pod_annotations, "the canary runs the new template");
}

#[test]
fn rolling_updates_are_gated_and_reverted() {
    let app = rolling_app(true);
    let plan = Run::new(&app).stable("1", 4, 4).plan(0);
    assert_eq!(image(&plan.stable), "example.com/web:2");
    assert!(plan.canary.is_none());
    assert!(!plan.analysis_due, "nothing to measure before pods of the new version serve");
    assert_eq!(plan.stable.spec.as_ref().and_then(|s| s.paused), None, "the new image goes in unpaused");
    let app = advance(&app, &plan);
    assert!(Run::new(&app).stable("2", 4, 1).plan(1).analysis_due, "measured once new pods serve");

    // No data: the Deployment is paused where it is.
    let none = vec![measurement(MeasurementResult::Inconclusive, None)];
    let plan = Run::new(&app).stable("2", 4, 2).measured(none).plan(1);
    assert_eq!(plan.stable.spec.as_ref().and_then(|s| s.paused), Some(true));
    assert_eq!(plan.status.phase, Some(AppPhase::Paused));

    // Complete and passing: promoted.
    let pass = vec![measurement(MeasurementResult::Pass, Some(0.0))];
    let plan = Run::new(&advance(&app, &plan)).stable("2", 4, 4).measured(pass).plan(12);
    assert_eq!(plan.stable.spec.as_ref().and_then(|s| s.paused), None);
    assert_eq!(plan.status.current_version.as_deref(), Some("2"));

    // Failing twice: the image goes back.
    let fail = vec![measurement(MeasurementResult::Fail, Some(1.0))];
    let app2 = advance(&app, &Run::new(&app).stable("2", 4, 2).measured(fail.clone()).plan(1));
    let plan = Run::new(&app2).stable("2", 4, 3).measured(fail).plan(11);
    assert_eq!(image(&plan.stable), "example.com/web:1");
    assert_eq!(plan.status.phase, Some(AppPhase::RolledBack));
}

#[test]
fn rolling_without_analysis_completes_when_available() {
    let app = rolling_app(false);
    let app = advance(&app, &Run::new(&app).stable("1", 4, 4).plan(0));
    let plan = Run::new(&app).stable("2", 4, 4).plan(5);
    assert_eq!(plan.status.current_version.as_deref(), Some("2"));
    assert_eq!(reasons(&plan), ["Promoted"]);
    let late = Run::new(&app).stable("2", 4, 1).plan(61);
    assert_eq!(late.status.phase, Some(AppPhase::RolledBack));
    assert_eq!(image(&late.stable), "example.com/web:1");
}

#[test]
fn settled_apps_plan_the_same_status() {
    let app = canary_app(3, &[50], false);
    let plan = Run::new(&app).stable("1", 3, 3).plan(0);
    let mut app = canary_app(3, &[50], false);
    app.spec.version = "1".into();
    let first = Run::new(&app).stable("1", 3, 3).plan(0);
    let second = Run::new(&advance(&app, &first)).stable("1", 3, 3).plan(500);
    assert_eq!(first.status, second.status, "nothing to write twice");
    assert!(second.notes.is_empty() && second.recheck.is_none());
    assert!(plan.canary.is_some());
}

fn result_strategy() -> impl proptest::strategy::Strategy<Value = MeasurementResult> {
    prop_oneof![
        Just(MeasurementResult::Pass),
        Just(MeasurementResult::Fail),
        Just(MeasurementResult::Inconclusive),
        Just(MeasurementResult::Invalid),
    ]
}

proptest! {
    /// Canary replicas stay within [1, total-1], never promote on a run that did not pass,
    /// and a revert never passes through a canary.
    #[test]
    fn invariants(
        total in 2i32..40,
        weights in proptest::collection::vec(1i32..=100, 1..4),
        ready_canary in 0i32..40,
        results in proptest::collection::vec(result_strategy(), 1..3),
        step in 0usize..4,
        revert in any::<bool>(),
    ) {
        let app = canary_app(total, &weights, true);
        let mut app = advance(&app, &Run::new(&app).stable("1", total, total).plan(0));
        if let Some(c) = app.status.as_mut().and_then(|s| s.canary.as_mut()) {
            c.step = i32::try_from(step.min(weights.len() - 1)).unwrap_or(0);
        }
        if revert {
            app.spec.version = "1".into();
        }
        let measurements: Vec<_> = results.iter().map(|r| measurement(*r, Some(0.0))).collect();
        let passed = summarise(&measurements) == MeasurementResult::Pass;
        let before = app.status.as_ref().and_then(|s| s.canary.as_ref()).map(|c| c.step);
        let plan = Run::new(&app).stable("1", total, total).canary("2", total, ready_canary.min(total)).measured(measurements).plan(20);
        if revert {
            prop_assert!(plan.canary.is_none());
            prop_assert_eq!(image(&plan.stable), "example.com/web:1");
        }
        if let (Some(c), Some(d)) = (plan.status.canary.as_ref(), plan.canary.as_ref())
            && c.step < c.steps
        {
            let n = replicas(d).unwrap_or(0);
            prop_assert!(n >= 1 && n < total, "canary {} of {}", n, total);
        }
        if !passed && !revert {
            let after = plan.status.canary.as_ref().map(|c| c.step);
            prop_assert!(after <= before || after.is_none(), "a step was taken on a run that did not pass");
            prop_assert_ne!(plan.status.current_version.as_deref(), Some("2"));
        }
    }
}

#[test]
fn a_step_pause_counts_from_when_the_canary_is_available() {
    let mut app = canary_app(4, &[25, 50], false);
    app.spec.rollout.strategy.as_mut().and_then(|s| s.canary.as_mut()).expect("canary").steps[0].pause =
        Some("10s".into());
    let app = advance(&app, &Run::new(&app).stable("1", 4, 4).plan(0));
    let app = advance(&app, &Run::new(&app).stable("1", 4, 4).canary("2", 1, 0).plan(30));
    let app = advance(&app, &Run::new(&app).stable("1", 4, 4).canary("2", 1, 1).plan(50));
    let early = Run::new(&app).stable("1", 3, 3).canary("2", 1, 1).plan(55);
    assert_eq!(early.status.canary.as_ref().map(|c| c.step), Some(0), "available for 5 s of a 10 s pause");
    assert_eq!(early.recheck, Some(Duration::from_secs(5)));
    let later = Run::new(&app).stable("1", 3, 3).canary("2", 1, 1).plan(61);
    assert_eq!(later.status.canary.as_ref().map(|c| c.step), Some(1));
}

#[test]
fn a_paused_promotion_does_not_complete() {
    let app = canary_app(2, &[50], false);
    let app = with_annotation(&app, ANNOTATION_ACTION, "promote-full 1");
    let app = advance(&app, &Run::new(&app).stable("1", 2, 2).plan(0));
    assert_eq!(app.status.as_ref().and_then(|s| s.canary.as_ref()).map(|c| c.step), Some(1), "promoting");
    let paused = with_annotation(&app, ANNOTATION_PAUSED, "true");
    let plan = Run::new(&paused).stable("2", 2, 2).canary("2", 1, 1).plan(5);
    assert_eq!(plan.status.phase, Some(AppPhase::Paused));
    assert_ne!(plan.status.current_version.as_deref(), Some("2"));
    assert!(plan.canary.is_some());
}

#[test]
fn retry_only_retries_a_rolled_back_version() {
    let app = canary_app(4, &[25], true);
    let app = advance(&app, &Run::new(&app).stable("1", 4, 4).plan(0));
    let retry = with_annotation(&app, ANNOTATION_ACTION, "retry 1");
    let plan = Run::new(&retry).stable("1", 3, 3).canary("2", 1, 1).plan(3);
    assert_eq!(reasons(&plan), ["NothingToDo"]);
    assert_eq!(plan.status.rollout, app.status.as_ref().and_then(|s| s.rollout.clone()), "the rollout goes on");
}

#[test]
fn removing_steps_mid_rollout_does_not_promote() {
    let app = canary_app(4, &[25, 50, 75], false);
    let mut app = advance(&app, &Run::new(&app).stable("1", 4, 4).plan(0));
    if let Some(c) = app.status.as_mut().and_then(|s| s.canary.as_mut()) {
        c.step = 2;
    }
    app.spec.rollout.strategy.as_mut().and_then(|s| s.canary.as_mut()).expect("canary").steps.truncate(2);
    let plan = Run::new(&app).stable("1", 1, 1).canary("2", 3, 0).plan(5);
    assert_eq!(plan.status.canary.as_ref().map(|c| (c.step, c.steps)), Some((1, 2)));
    assert_eq!(image(&plan.stable), "example.com/web:1");
}

#[test]
fn the_stable_deployment_does_not_grow_back_within_a_step() {
    let mut app = canary_app(4, &[50], false);
    app.spec.rollout.strategy.as_mut().and_then(|s| s.canary.as_mut()).expect("canary").steps[0].pause =
        Some("1h".into());
    let app = advance(&app, &Run::new(&app).stable("1", 4, 4).plan(0));
    let app = advance(&app, &Run::new(&app).stable("1", 4, 4).canary("2", 2, 2).plan(2));
    assert_eq!(app.status.as_ref().and_then(|s| s.canary.as_ref()).map(|c| c.stable_replicas), Some(2));
    // The canary's status lags (nothing available as far as the cache knows).
    let plan = Run::new(&app).stable("1", 2, 2).canary("2", 2, 0).plan(3);
    assert_eq!(replicas(&plan.stable), Some(2));
}

#[test]
fn a_persisted_rollback_completes_from_status_alone_and_is_never_promoted() {
    // The replica that decided the rollback wrote its status and died before changing any
    // Deployment: the next one finds the canary still there and every check passing again.
    let app = canary_app(5, &[20, 50], true);
    let app = advance(&app, &Run::new(&app).stable("1", 5, 5).plan(0));
    let fail = vec![measurement(MeasurementResult::Fail, Some(0.3))];
    let first = Run::new(&app).stable("1", 4, 4).canary("2", 1, 1).measured(fail.clone()).plan(3);
    let app = advance(&app, &first);
    let decided = Run::new(&app).stable("1", 4, 4).canary("2", 1, 1).measured(fail).plan(13);
    assert_eq!(decided.status.phase, Some(AppPhase::RolledBack));
    let app = advance(&app, &decided);
    let pass = vec![measurement(MeasurementResult::Pass, Some(0.0))];
    for (run, stable_back) in [
        (Run::new(&app).stable("1", 4, 4).canary("2", 1, 1), false),
        (Run::new(&app).stable("1", 4, 4).canary("2", 1, 1).measured(pass.clone()), false),
        (Run::new(&app).stable("1", 5, 5).canary("2", 1, 1).measured(pass), true),
    ] {
        let next = run.plan(20);
        // Kept as it is (never promoted) until the stable Deployment is back, then removed.
        assert_eq!(next.canary.is_none(), stable_back, "the canary is removed once the stable is back");
        assert_eq!(next.canary.as_ref(), if stable_back { None } else { run.canary.as_ref() });
        assert_eq!((image(&next.stable), replicas(&next.stable)), ("example.com/web:1".into(), Some(5)));
        assert_eq!(next.status.phase, Some(AppPhase::RolledBack));
        assert_eq!(next.status.current_version.as_deref(), Some("1"));
        assert_eq!(next.status.failed_version, decided.status.failed_version);
        assert!(!next.analysis_due, "a version judged failed is not measured again");
        assert!(next.notes.is_empty(), "{:?}", next.notes);
    }

    // Rolling: a rolled-back version never goes back onto the stable Deployment.
    let app = rolling_app(true);
    let started = Run::new(&app).stable("1", 3, 3).plan(0);
    let app = advance(&app, &started);
    let fail = vec![measurement(MeasurementResult::Fail, Some(0.3))];
    let mut app = app;
    let mut last = started;
    for second in [5, 40] {
        last = Run::new(&app).stable("2", 3, 3).measured(fail.clone()).plan(second);
        app = advance(&app, &last);
    }
    assert_eq!(last.status.phase, Some(AppPhase::RolledBack), "{:?}", last.status.conditions);
    let pass = vec![measurement(MeasurementResult::Pass, Some(0.0))];
    let next = Run::new(&app).stable("2", 3, 3).measured(pass).plan(60);
    assert_eq!(image(&next.stable), "example.com/web:1");
    assert_eq!(next.status.phase, Some(AppPhase::RolledBack));
}

#[test]
fn a_lost_status_recovers_the_stable_version_from_the_running_deployment() {
    // Restored from a backup without status: version 2 must not replace 1 as a first
    // deployment would, skipping the canary and its analysis.
    let mut app = canary_app(5, &[20, 50], true);
    app.status = None;
    let plan = Run::new(&app).stable("1", 5, 5).plan(0);
    assert_eq!(reasons(&plan), ["StableVersionRecovered", "RolloutStarted"]);
    assert_eq!((image(&plan.stable), replicas(&plan.stable)), ("example.com/web:1".into(), Some(5)));
    assert!(plan.canary.as_ref().is_some_and(|c| image(c) == "example.com/web:2"));
    assert_eq!(plan.status.current_version.as_deref(), Some("1"));
    assert_eq!(plan.status.target_version.as_deref(), Some("2"));

    // The same version running: nothing to roll out.
    let plan = Run::new(&app).stable("2", 5, 5).plan(0);
    assert!(plan.canary.is_none());
    assert_eq!(plan.status.phase, Some(AppPhase::Healthy));
    assert!(plan.notes.is_empty(), "{:?}", plan.notes);

    // A first deployment under way (status names its target) is not a lost status: the
    // version becomes current only once it is available.
    let mut first = app.clone();
    first.status = Some(AppStatus { target_version: Some("2".into()), ..AppStatus::default() });
    let plan = Run::new(&first).stable("2", 5, 1).plan(0);
    assert_eq!(plan.status.current_version, None);
    assert_eq!(plan.status.phase, Some(AppPhase::Progressing));
    assert!(plan.notes.is_empty(), "{:?}", plan.notes);
}

/// A template whose main container says `MODE=<mode>`.
fn template(mode: &str) -> PodTemplate {
    serde_json::from_value(serde_json::json!({
        "spec": {"containers": [{"name": "app", "env": [{"name": "MODE", "value": mode}]}]},
    }))
    .expect("template")
}

fn mode(d: &Deployment) -> Option<String> {
    let pod = d.spec.as_ref()?.template.spec.as_ref()?;
    pod.containers.iter().find(|c| c.name == "app")?.env.as_ref()?.first()?.value.clone()
}

/// An App stable at version 2 with template `old`, whose spec now asks for template `new`.
fn template_change(mut app: App, old: &str, new: &str) -> (App, String, PodTemplate) {
    let before = template(old);
    let stable = revision("2", Some(&before));
    app.spec.template = Some(template(new));
    let status = app.status.get_or_insert_with(Default::default);
    status.current_version = Some(stable.clone());
    status.target_version = Some(stable.clone());
    status.stable_template = Some(before.clone());
    (app, stable, before)
}

#[test]
fn a_template_change_is_a_canary_rollout_and_the_stable_keeps_the_old_template() {
    let (app, stable_rev, before) = template_change(canary_app(4, &[50], true), "live", "dry-run");
    let plan = Run::new(&app).stable_running(&stable_rev, before, 4, 4).plan(0);
    assert_eq!(reasons(&plan), ["RolloutStarted"]);
    let target = plan.status.target_version.clone().expect("target");
    assert!(target.starts_with("2+") && target != stable_rev, "a new revision of version 2: {target}");
    assert_eq!(mode(&plan.stable).as_deref(), Some("live"), "the stable pods keep the old template");
    let annotations = plan.stable.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        annotations.get(names::ANNOTATION_REVISION),
        Some(&stable_rev),
        "the kept stable Deployment still says its revision (else the next look re-renders it)"
    );
    let canary = plan.canary.as_ref().expect("canary");
    assert_eq!(mode(canary).as_deref(), Some("dry-run"), "the canary runs the new one");
    assert_eq!(image(canary), "example.com/web:2", "same image");
}

#[test]
fn a_failed_template_is_rolled_back_to_the_stable_one_even_when_rolling() {
    // A rolling update already put the new template on the stable Deployment; it is aborted.
    let (app, stable_rev, _) = template_change(rolling_app(true), "live", "dry-run");
    let target = revision("2", app.spec.template.as_ref());
    let mut app = app;
    if let Some(s) = app.status.as_mut() {
        s.target_version = Some(target.clone());
        s.rollout = Some(RolloutProgress { started_at: Time(at(0)), progress_since: None, promoted_by_user: false });
    }
    let aborted = with_annotation(&app, ANNOTATION_ACTION, "abort 1");
    let plan = Run::new(&aborted).stable(&target, 4, 4).plan(10);
    assert_eq!(plan.status.phase, Some(AppPhase::RolledBack));
    assert_eq!(plan.status.failed_version.as_ref().map(|f| f.version.clone()), Some(target));
    assert_eq!(plan.status.current_version.as_deref(), Some(stable_rev.as_str()));
    assert_eq!(mode(&plan.stable).as_deref(), Some("live"), "the stable Deployment gets the old template back");
    let annotations = plan.stable.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(annotations.get(names::ANNOTATION_REVISION), Some(&stable_rev));
}

#[test]
fn a_promoted_template_becomes_the_stable_one() {
    let (app, _, _) = template_change(rolling_app(false), "live", "dry-run");
    let target = revision("2", app.spec.template.as_ref());
    let first = Run::new(&app).stable(&target, 4, 4).plan(0);
    let next = advance(&app, &first);
    let plan = Run::new(&next).stable(&target, 4, 4).plan(1);
    assert_eq!(plan.status.current_version.as_deref(), Some(target.as_str()));
    assert_eq!(plan.status.stable_template, app.spec.template, "the new template is kept as the stable one");
    assert_eq!(plan.status.phase, Some(AppPhase::Healthy));
}

#[test]
fn a_deployment_that_never_served_is_not_recovered_as_the_stable_version() {
    // A first deployment's status waits for its Deployment (app::first_deployment); the spec
    // changes meanwhile. Version 1 never served: version 2 replaces it as a first deployment.
    let mut app = canary_app(5, &[20, 50], true);
    app.status = None;
    let plan = Run::new(&app).stable("1", 5, 0).plan(0);
    assert!(reasons(&plan).is_empty(), "{:?}", reasons(&plan));
    assert!(plan.canary.is_none());
    assert_eq!(image(&plan.stable), "example.com/web:2");
    assert_eq!(plan.status.current_version, None);
    // Once it served (or wants no pods), it is the stable version.
    let served = Run::new(&app).stable("1", 5, 1).plan(0);
    assert_eq!(reasons(&served), ["StableVersionRecovered", "RolloutStarted"]);
    let none = Run::new(&app).stable("1", 0, 0).plan(0);
    assert_eq!(reasons(&none), ["StableVersionRecovered", "RolloutStarted"]);
}

#[test]
fn a_lost_status_keeps_the_running_template_for_a_rollback() {
    // Restored without status while the stable Deployment runs the old template; the spec
    // asks for a new one. The rolling update puts it in, then it is aborted: the stable
    // Deployment must get the running template back, not the spec's.
    let (mut app, stable_rev, before) = template_change(rolling_app(true), "live", "dry-run");
    app.status = None;
    let first = Run::new(&app).stable_running(&stable_rev, before, 4, 4).plan(0);
    assert_eq!(reasons(&first), ["StableVersionRecovered", "RolloutStarted"]);
    assert_eq!(first.status.current_version.as_deref(), Some(stable_rev.as_str()));
    assert!(first.status.stable_template.is_some(), "the running template is kept as the stable one");
    let target = revision("2", app.spec.template.as_ref());
    let aborted = with_annotation(&advance(&app, &first), ANNOTATION_ACTION, "abort 1");
    let plan = Run::new(&aborted).stable(&target, 4, 4).plan(10);
    assert_eq!(plan.status.phase, Some(AppPhase::RolledBack));
    assert_eq!(mode(&plan.stable).as_deref(), Some("live"), "the rollback brings back the running template");
    let pod = plan.stable.spec.as_ref().and_then(|s| s.template.spec.as_ref()).expect("pod");
    assert_eq!(pod.containers.len(), 1, "no container added by reading the template back");
    assert_eq!(image(&plan.stable), "example.com/web:2");
}

#[path = "route_tests.rs"]
mod route_tests;

#[cfg(test)]
#[path = "bluegreen_tests.rs"]
mod bluegreen;

#[test]
fn a_stable_deployment_that_does_not_roll_in_by_the_deadline_rolls_the_promotion_back() {
    // Canary: promoting after its last step; blue-green: after the delay. Both judged by the
    // same deadline on the stable Deployment's last stage.
    let canary = canary_app(2, &[50], false);
    let canary = with_annotation(&canary, ANNOTATION_ACTION, "promote-full 1");
    let canary = advance(&canary, &Run::new(&canary).stable("1", 2, 2).plan(0));
    assert_eq!(canary.status.as_ref().and_then(|s| s.canary.as_ref()).map(|c| c.step), Some(1), "promoting");
    let waiting = Run::new(&canary).stable("2", 2, 1).canary("2", 1, 1).plan(50);
    assert_eq!(waiting.status.phase, Some(AppPhase::Progressing));
    assert_eq!(waiting.recheck, Some(Duration::from_secs(10)), "looks again at the deadline");
    let late = Run::new(&canary).stable("2", 2, 1).canary("2", 1, 1).plan(61);
    assert_eq!(late.status.phase, Some(AppPhase::RolledBack));
    let failed = late.status.failed_version.as_ref().expect("failed");
    assert_eq!(failed.reason, "ProgressDeadlineExceeded");
    assert!(failed.message.contains("stable Deployment did not become available on version 2"), "{}", failed.message);
    let paused = with_annotation(&canary, ANNOTATION_PAUSED, "true");
    assert_eq!(Run::new(&paused).stable("2", 2, 1).canary("2", 1, 1).plan(600).status.phase, Some(AppPhase::Paused));
}
