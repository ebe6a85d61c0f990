//! The rollout planner: from the App (spec, status, annotations), the observed Deployments
//! and HPA, the measurements just taken (if any) and the time, it decides the Deployments the
//! App should have, the status to write, the Events to record and when to look again.
//! Pure: no I/O, so that every transition is a table test.
//!
//! States, from `status`:
//! - no `currentVersion`: first deployment, `spec.version` goes straight in;
//! - `spec.version == currentVersion`: steady (a rollout under way is reverted at once);
//! - `failedVersion` is `spec.version` at this generation: rolled back, nothing to do until
//!   the spec changes or a user retries;
//! - otherwise a rollout of `spec.version`, `rollout` set, with `canary` for the Canary
//!   strategy (`canary.step == canary.steps` while promoting).

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use std::ops::ControlFlow;
use std::time::Duration;

use super::analysis::{explain, summarise};
use super::replicas::{
    Readiness, canary_replicas, fixed_replicas, readiness, ready_replicas, replica_failure, revision_of,
    routed_canary_replicas, stable_replicas, total_replicas,
};
use super::workload::{DeploymentShape, Workload};
use crate::api::conditions::{DesiredCondition, merge_conditions};
use crate::api::duration::{self, DurationError};
use crate::api::names::{self, Track};
use crate::api::rollout::{ANNOTATION_ACTION, ANNOTATION_PAUSED, DEFAULT_SCALE_DOWN_DELAY, PAUSE_UNTIL_PROMOTED};
use crate::api::template::template_from_running;
use crate::api::template::{PodTemplate, is_template_of, revision};
use crate::api::{
    AnalysisStatus, App, AppPhase, AppStatus, CanaryStatus, FailedVersion, Measurement, MeasurementResult,
    RolloutProgress, RolloutRecord, RolloutResult, StrategyType, TrafficRoutingStatus,
};

pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(30);
pub const DEFAULT_FAILURE_LIMIT: i32 = 2;
/// How long the new version's pods stay after they stopped taking requests in one write (a
/// blue-green App's Service moved off them, a routed canary's weight set to 0).
pub const DRAIN: Duration = Duration::from_secs(10);
use crate::api::conditions::{PROGRESSING, READY};

/// The App's rollout settings, read once, with defaults applied.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    pub canary: bool,
    pub weights: Vec<i32>,
    pub pauses: Vec<Duration>,
    /// Steps that wait for a person's `promote` once their pause and analysis are done.
    pub gates: Vec<bool>,
    pub deadline: Duration,
    pub analysis: bool,
    pub interval: Duration,
    pub failure_limit: i32,
    pub auto_rollback: bool,
    pub history_limit: usize,
    /// Set for the BlueGreen strategy.
    pub blue_green: Option<BlueGreenSettings>,
    /// The HTTPRoute that splits a canary's traffic by weight (`trafficRouting.gatewayAPI`).
    pub route: Option<String>,
}

/// A blue-green rollout's settings, with defaults applied.
#[derive(Clone, Debug, PartialEq)]
pub struct BlueGreenSettings {
    pub auto_promotion: bool,
    pub scale_down_delay: Duration,
}

impl Settings {
    pub fn of(app: &App) -> Result<Self, DurationError> {
        let spec = &app.spec;
        let steps = spec.strategy().and_then(|s| s.canary.as_ref()).map(|c| c.steps.clone()).unwrap_or_default();
        let canary = spec.strategy().is_some_and(|s| s.type_ == StrategyType::Canary) && !steps.is_empty();
        let mut pauses = Vec::with_capacity(steps.len());
        let mut gates = Vec::with_capacity(steps.len());
        for step in &steps {
            let gate = step.pause.as_deref() == Some(PAUSE_UNTIL_PROMOTED);
            gates.push(gate);
            pauses.push(match &step.pause {
                Some(p) if !gate => duration::parse("spec.rollout.strategy.canary.steps[].pause", p)?,
                _ => Duration::ZERO,
            });
        }
        let analysis = spec.analysis();
        let interval = match analysis.and_then(|a| a.interval.as_deref()) {
            Some(i) => duration::parse("spec.rollout.analysis.interval", i)?.max(Duration::from_secs(1)),
            None => DEFAULT_INTERVAL,
        };
        let blue_green = match spec.strategy() {
            Some(s) if s.type_ == StrategyType::BlueGreen => {
                let bg = s.blue_green.clone().unwrap_or_default();
                let scale_down_delay = match bg.scale_down_delay.as_deref() {
                    Some(d) => duration::parse("spec.rollout.strategy.blueGreen.scaleDownDelay", d)?,
                    None => DEFAULT_SCALE_DOWN_DELAY,
                };
                Some(BlueGreenSettings { auto_promotion: bg.auto_promotion.unwrap_or(true), scale_down_delay })
            }
            _ => None,
        };
        let route = spec.http_route().filter(|_| canary).map(str::to_string);
        Ok(Self {
            blue_green,
            route,
            canary,
            weights: steps.iter().map(|s| s.weight).collect(),
            pauses,
            gates,
            deadline: spec.progress_deadline()?.max(Duration::from_secs(1)),
            analysis: analysis.is_some_and(|a| !a.metrics.is_empty()),
            interval,
            failure_limit: analysis.and_then(|a| a.failure_limit).unwrap_or(DEFAULT_FAILURE_LIMIT).max(1),
            auto_rollback: spec.auto_rollback(),
            history_limit: spec.history_limit(),
        })
    }
}

/// A one-off request from `flotilla promote|abort|retry`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verb {
    /// Move to the next canary step now (a rolling update: accept the new version).
    Promote,
    /// Skip every remaining step and check.
    PromoteFull,
    /// Roll back now.
    Abort,
    /// Try the rolled-back version again.
    Retry,
}

impl Verb {
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Promote => "promote",
            Verb::PromoteFull => "promote-full",
            Verb::Abort => "abort",
            Verb::Retry => "retry",
        }
    }

    pub fn parse(word: &str) -> Option<Self> {
        [Verb::Promote, Verb::PromoteFull, Verb::Abort, Verb::Retry].into_iter().find(|v| v.as_str() == word)
    }
}

/// The request in the App's `flotilla.dev/action` annotation that has not been acted on yet.
/// `Err` carries the annotation when its verb is unknown (reported once, then ignored).
pub fn pending_request(app: &App) -> Option<(String, Result<Verb, String>)> {
    let raw = app.metadata.annotations.as_ref()?.get(ANNOTATION_ACTION)?.trim().to_string();
    let handled = app.status.as_ref().and_then(|s| s.handled_action.as_deref());
    if raw.is_empty() || handled == Some(raw.as_str()) {
        return None;
    }
    let word = raw.split_whitespace().next().unwrap_or_default();
    Some((raw.clone(), Verb::parse(word).ok_or_else(|| raw.clone())))
}

fn paused_by_user(app: &App) -> bool {
    app.metadata.annotations.as_ref().and_then(|a| a.get(ANNOTATION_PAUSED)).is_some_and(|v| v.trim() == "true")
}

/// An Event the reconciler records after applying the plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    pub warning: bool,
    pub reason: &'static str,
    pub message: String,
}

/// What the App's objects should look like.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Observed<'a> {
    pub stable: Option<&'a Deployment>,
    pub canary: Option<&'a Deployment>,
    pub hpa: Option<&'a HorizontalPodAutoscaler>,
    /// The HTTPRoute of a canary routed through Gateway API: the canary's weight on it now
    /// (`None` when its rules disagree), or why it cannot be used (`None`: not read, or the
    /// App has none).
    pub route: Option<Result<Option<i32>, String>>,
    /// Why the namespace's quota cannot hold the blue-green preview the plan would create
    /// (the reconciler checks when a plan creates one, and plans again with the answer).
    pub quota: Option<String>,
}

/// Everything the planner reads.
#[derive(Clone, Debug)]
pub struct Input<'a> {
    pub app: &'a App,
    pub observed: Observed<'a>,
    /// The checks just run, when the previous plan asked for them (`analysis_due`).
    pub measurements: Option<&'a [Measurement]>,
    pub now: Timestamp,
    /// The shortest interval between analysis runs the platform allows: an App's shorter
    /// `spec.rollout.analysis.interval` is raised to it.
    pub min_interval: Duration,
}

/// The planner's decision.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub stable: Workload,
    /// `None`: the canary Deployment must not exist.
    pub canary: Option<Workload>,
    pub status: AppStatus,
    pub notes: Vec<Note>,
    /// Look again after this long even without a watch event.
    pub recheck: Option<Duration>,
    /// The checks should run now; plan again with their results.
    pub analysis_due: bool,
    /// The pods the App's Service selects: one track (a blue-green App), or both (`None`).
    pub active: Option<Track>,
    /// The preview Service of a blue-green rollout must exist.
    pub preview: bool,
    /// The share of requests, in percent, the App's HTTPRoute sends to the canary (`None`: the
    /// App's traffic is not split by a route, or the route cannot be used).
    pub route_weight: Option<i32>,
}

/// The two Deployments the App should have (`None`: no canary) and where it stands.
type Planned = (Workload, Option<Workload>, Outcome);

/// Where the App stands, before it becomes status fields and conditions.
struct Outcome {
    phase: AppPhase,
    reason: String,
    message: String,
}

struct Planner<'a> {
    input: &'a Input<'a>,
    app: &'a App,
    settings: Settings,
    status: AppStatus,
    notes: Vec<Note>,
    recheck: Option<Duration>,
    analysis_due: bool,
    now: Timestamp,
    total: i32,
    /// The revision the spec asks for (`api::template::revision`).
    target: String,
    active: Option<Track>,
    preview: bool,
    /// The canary's share of the route's requests (a routed canary).
    route_weight: i32,
}

/// Plans one reconcile of `input.app`.
pub fn plan(input: &Input) -> Result<Plan, DurationError> {
    let app = input.app;
    let mut settings = Settings::of(app)?;
    settings.interval = settings.interval.max(input.min_interval);
    let target = revision(&app.spec.version, app.spec.template.as_ref());
    // A blue-green App's Service selects the stable track unless its rollout says otherwise,
    // so that the new version's pods take traffic only when switched to.
    let settings_blue_green = settings.blue_green.is_some();
    let mut p = Planner {
        input,
        app,
        total: total_replicas(app, input.observed.stable, input.observed.hpa),
        target,
        settings,
        status: app.status.clone().unwrap_or_default(),
        notes: Vec::new(),
        recheck: None,
        analysis_due: false,
        now: input.now,
        active: settings_blue_green.then_some(Track::Stable),
        preview: false,
        route_weight: 0,
    };
    let request = pending_request(app);
    let verb = match &request {
        Some((raw, verb)) => {
            p.status.handled_action = Some(raw.clone());
            match verb {
                Ok(v) => Some(*v),
                Err(raw) => {
                    p.note(true, "UnknownAction", format!("ignoring {ANNOTATION_ACTION}={raw:?}: the verb must be promote, promote-full, abort or retry"));
                    None
                }
            }
        }
        None => None,
    };
    let (stable, canary, outcome) = p.decide(verb);
    Ok(p.finish(stable, canary, outcome))
}

/// Whether the Deployment's controller saw its current spec and it had pods available (or
/// wants none): it served, as a stable version does.
fn served(d: &Deployment) -> bool {
    let status = d.status.as_ref();
    let seen = match (d.metadata.generation, status.and_then(|s| s.observed_generation)) {
        (Some(g), Some(o)) => o >= g,
        _ => false,
    };
    let wants_none = d.spec.as_ref().and_then(|s| s.replicas) == Some(0);
    seen && (wants_none || status.and_then(|s| s.available_replicas).unwrap_or(0) > 0)
}

fn elapsed(since: &Time, now: Timestamp) -> Duration {
    let ms = now.as_millisecond().saturating_sub(since.0.as_millisecond());
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

fn secs(d: Duration) -> String {
    humantime::format_duration(Duration::from_secs(d.as_secs())).to_string()
}

impl Planner<'_> {
    fn note(&mut self, warning: bool, reason: &'static str, message: String) {
        self.notes.push(Note { warning, reason, message });
    }

    fn look_again_in(&mut self, d: Duration) {
        let d = d.max(Duration::from_secs(1));
        self.recheck = Some(self.recheck.map_or(d, |r| r.min(d)));
    }

    fn record(&mut self, version: String, result: RolloutResult, message: Option<String>) {
        self.status.history.insert(0, RolloutRecord { version, result, at: Time(self.now), message, replaced: None });
        self.status.history.truncate(self.settings.history_limit);
    }

    fn shape(&self, track: Track, version: &str, replicas: Option<i32>, paused: bool) -> DeploymentShape {
        DeploymentShape {
            track,
            version: version.to_string(),
            template: self.template_of(version),
            replicas,
            paused,
            keep_running_pods: false,
        }
    }

    /// The App-level template of `revision`: the spec's for the revision it asks for, the one
    /// kept in status for the stable revision (a rollback renders the template that was
    /// stable, not the spec's new one).
    fn template_of(&self, rev: &str) -> Option<PodTemplate> {
        let spec = self.app.spec.template.as_ref();
        if rev == self.target {
            return spec.cloned();
        }
        let kept = self.status.stable_template.as_ref();
        match kept {
            Some(t) if is_template_of(rev, t) => Some(t.clone()),
            // No template (an App without one, or a revision from before templates existed).
            _ if !rev.contains('+') => None,
            // Read back from the running stable Deployment when status was lost
            // (`recovered_stable_version`): its fingerprint need not match to the byte.
            Some(t) if self.status.current_version.as_deref() == Some(rev) => Some(t.clone()),
            _ => spec.cloned(),
        }
    }

    /// Records `revision` as the stable one, with its template.
    fn set_stable(&mut self, revision: &str) {
        self.status.current_version = Some(revision.to_string());
        self.status.stable_template = self.template_of(revision);
    }

    /// The stable Deployment at `version` with the App's pod settings.
    fn stable_from_spec(&self, version: &str, replicas: Option<i32>, paused: bool) -> Workload {
        Workload::Shape(Box::new(self.shape(Track::Stable, version, replicas, paused)))
    }

    /// The new version's Deployment (`<app>-canary`) with `replicas`.
    fn canary_of(&self, replicas: i32) -> Workload {
        Workload::Shape(Box::new(self.shape(Track::Canary, &self.target, Some(replicas), false)))
    }

    /// The App's name, for messages.
    fn name(&self) -> &str {
        self.app.metadata.name.as_deref().unwrap_or_default()
    }

    /// The stable Deployment at `version`, keeping the pod template it has when it already
    /// runs that version: during a rollout (and after a rollback) only the new version
    /// changes pods, never the stable one.
    fn stable_kept(&self, version: &str, replicas: Option<i32>) -> Workload {
        let shape = DeploymentShape { keep_running_pods: true, ..self.shape(Track::Stable, version, replicas, false) };
        Workload::Shape(Box::new(shape))
    }

    fn decide(&mut self, verb: Option<Verb>) -> Planned {
        let app = self.app;
        let generation = app.metadata.generation.unwrap_or(0);
        let target = self.target.clone();
        let previous = app.status.clone().unwrap_or_default();

        let Some(stable_version) = previous.current_version.clone().or_else(|| self.recovered_stable_version()) else {
            // First deployment: nothing to compare the version with.
            return self.steady(&target);
        };
        if target == stable_version {
            if previous.rollout.is_some() {
                let abandoned = previous.target_version.clone().unwrap_or_default();
                let message = format!(
                    "spec.version was set back to the stable version {stable_version}: the rollout of {abandoned} was abandoned, and its canary is removed as soon as the stable Deployment is back to full size"
                );
                self.note(true, "Reverted", message.clone());
                self.record(abandoned, RolloutResult::Reverted, Some(message));
            }
            if verb.is_some_and(|v| v != Verb::Retry) {
                self.note(
                    false,
                    "NothingToDo",
                    format!("no rollout is under way: version {target} is the stable version"),
                );
            }
            return self.steady(&target);
        }
        let retry = verb == Some(Verb::Retry)
            && previous.failed_version.as_ref().is_some_and(|f| f.version == target && previous.rollout.is_none());
        if verb == Some(Verb::Retry) && !retry {
            self.note(false, "NothingToDo", format!("version {target} was not rolled back: nothing to retry"));
        }
        if let Some(failed) = previous.failed_version.clone()
            && failed.version == target
            && failed.generation == generation
            && !retry
        {
            if verb.is_some() {
                self.note(false, "NothingToDo", format!("version {target} was rolled back; use retry to try it again"));
            }
            return self.rolled_back(&stable_version, &failed);
        }

        let fresh = retry || previous.rollout.is_none() || previous.target_version.as_deref() != Some(target.as_str());
        if fresh {
            if previous.rollout.is_some()
                && let Some(old) = previous.target_version.clone().filter(|old| *old != target)
            {
                let message = format!(
                    "version {target} was asked for during the rollout of {old}: restarting from the first step with fresh analysis"
                );
                self.note(false, "Superseded", message.clone());
                self.record(old, RolloutResult::Superseded, Some(message));
            }
            self.status.target_version = Some(target.clone());
            self.status.failed_version = None;
            self.status.rollout =
                Some(RolloutProgress { started_at: Time(self.now), progress_since: None, promoted_by_user: false });
            self.status.analysis = self.settings.analysis.then(AnalysisStatus::default);
            self.status.canary = None;
            self.status.blue_green = None;
            let how = if self.settings.canary {
                "canary"
            } else if self.settings.blue_green.is_some() {
                "blue-green"
            } else {
                "rolling"
            };
            let verb_text = if retry { "retrying" } else { "rolling out" };
            self.note(
                false,
                "RolloutStarted",
                format!("{verb_text} version {target} (stable: {stable_version}) with a {how} update"),
            );
        }
        if verb == Some(Verb::Abort) {
            return self.fail(&stable_version, "Aborted", "aborted by a user".into());
        }
        let stepwise = self.settings.canary || self.settings.blue_green.is_some();
        if matches!(verb, Some(Verb::PromoteFull)) || (matches!(verb, Some(Verb::Promote)) && !stepwise) {
            if let Some(r) = self.status.rollout.as_mut() {
                r.promoted_by_user = true;
            }
            self.note(
                false,
                "PromotedByUser",
                format!("a user promoted version {target}: remaining steps and checks are skipped"),
            );
        }
        if self.settings.canary && self.total > 0 {
            self.status.blue_green = None;
            self.canary(&stable_version, verb == Some(Verb::Promote))
        } else if self.settings.blue_green.is_some() && self.total > 0 {
            self.status.canary = None;
            self.blue_green(&stable_version, verb == Some(Verb::Promote))
        } else {
            self.status.blue_green = None;
            self.rolling(&stable_version)
        }
    }

    /// The version the App's stable Deployment runs, when status does not say (status lost
    /// in a restore from a backup, or an App re-created with the same spec over its old
    /// Deployment): a new version then rolls out with its canary and analysis instead of
    /// replacing the running one as a first deployment would.
    /// Only when status never named a target (a first deployment in progress has one) and the
    /// running version is not the one asked for (then there is nothing to roll out).
    fn recovered_stable_version(&mut self) -> Option<String> {
        if self.app.status.as_ref().is_some_and(|s| s.target_version.is_some()) {
            return None;
        }
        let observed = self.input.observed.stable?;
        let version = revision_of(observed)?.to_string();
        if version == self.target || !served(observed) {
            // A Deployment that never served (a first deployment whose status is not written
            // yet, app::first_deployment) is not a stable version to come back to.
            return None;
        }
        self.status.current_version = Some(version.clone());
        // The template of that revision is the running Deployment's: keep it, so that a
        // rollback brings back these pods and not the spec's new template.
        let kept = self.status.stable_template.as_ref();
        if version.contains('+') && kept.is_none_or(|t| !is_template_of(&version, t)) {
            self.status.stable_template = self.input.observed.stable.and_then(template_from_running);
        }
        self.note(
            false,
            "StableVersionRecovered",
            format!("status did not name the stable version; the running Deployment says {version}"),
        );
        Some(version)
    }

    /// No rollout: the stable Deployment runs `version` as the spec says.
    fn steady(&mut self, version: &str) -> Planned {
        self.status.rollout = None;
        self.status.canary = None;
        self.status.blue_green = None;
        self.status.target_version = Some(version.to_string());
        let stable = self.stable_from_spec(version, fixed_replicas(self.app), false);
        let r = readiness(self.input.observed.stable, &self.target, self.total);
        let outcome = if r.complete {
            self.set_stable(version);
            Outcome {
                phase: AppPhase::Healthy,
                reason: "Available".into(),
                message: format!("version {version} is available with {}/{} replicas ready", r.ready, r.want),
            }
        } else {
            self.look_again_in(Duration::from_secs(30));
            self.converging(version, r, self.input.observed.stable)
        };
        // A reverted rollout's canary serves until the stable Deployment is back, as after a
        // rollback.
        let kept = match self.status.history.first() {
            Some(h) if h.result == RolloutResult::Reverted => {
                let abandoned = h.version.clone();
                self.canary_kept_for_capacity(version, &abandoned, RolloutResult::Reverted)
            }
            _ => None,
        };
        let mut outcome = outcome;
        if let Some((_, r)) = &kept {
            outcome.message.push_str(&format!(
                "; the abandoned canary's pods serve until version {version} is back to {} available replicas",
                r.want
            ));
            // Both tracks serve (a blue-green App's Service too) while the canary is kept.
            self.active = None;
        }
        let canary = kept.map(|(canary, _)| canary).or_else(|| self.draining());
        (stable, canary, outcome)
    }

    fn converging(&self, version: &str, r: Readiness, d: Option<&Deployment>) -> Outcome {
        match replica_failure(d) {
            Some(why) => Outcome {
                phase: AppPhase::Progressing,
                reason: "ReplicaFailure".into(),
                message: format!(
                    "rolling out version {version}: {}/{} replicas ready; pods cannot be created: {why}",
                    r.ready, r.want
                ),
            },
            None => Outcome {
                phase: AppPhase::Progressing,
                reason: "Progressing".into(),
                message: format!("rolling out version {version}: {}/{} replicas ready", r.ready, r.want),
            },
        }
    }

    fn rolled_back(&mut self, stable_version: &str, failed: &FailedVersion) -> Planned {
        self.status.rollout = None;
        self.status.canary = None;
        self.status.blue_green = None;
        if self.settings.blue_green.is_some() {
            // Switched back, in the same write: the Service selects the stable pods again.
            self.active = Some(Track::Stable);
            self.preview = false;
        }
        self.status.target_version = Some(stable_version.to_string());
        let stable = self.stable_kept(stable_version, fixed_replicas(self.app));
        let kept = self.canary_kept_for_capacity(stable_version, &failed.version, RolloutResult::RolledBack);
        let mut message = format!(
            "version {} was rolled back ({}); version {stable_version} runs. It is not tried again until the spec changes or a user retries",
            failed.version, failed.message
        );
        if let Some((_, r)) = &kept {
            message.push_str(&format!(
                ". The canary's pods serve until version {stable_version} is back to {} available replicas ({}/{} now)",
                r.want, r.available, r.want
            ));
        }
        let outcome = Outcome { phase: AppPhase::RolledBack, reason: failed.reason.clone(), message };
        if kept.is_some() {
            // Both tracks serve (a blue-green App's Service too) while the canary is kept.
            self.active = None;
        }
        let canary = kept.map(|(canary, _)| canary).or_else(|| self.draining());
        (stable, canary, outcome)
    }

    /// After a rollback (or a revert), the canary Deployment as it is (nothing written to it)
    /// while the stable one is not yet back to all its replicas, for at most the progress
    /// deadline after the rollback: removing the canary's pods first would leave fewer pods serving
    /// than the App asks for until the stable Deployment's new pods are ready. With the
    /// stable readiness it waits for.
    fn canary_kept_for_capacity(
        &mut self,
        stable_version: &str,
        abandoned: &str,
        ended: RolloutResult,
    ) -> Option<(Workload, Readiness)> {
        self.input.observed.canary?;
        let r = readiness(self.input.observed.stable, stable_version, self.total);
        // Pods the stable Deployment cannot create (a quota, which the canary's pods may be
        // using) do not come back by waiting: the canary goes at once.
        if r.complete || replica_failure(self.input.observed.stable).is_some() {
            return None;
        }
        let rolled_back_at =
            self.status.history.iter().find(|h| h.result == ended && h.version == abandoned)?.at.clone();
        let waited = elapsed(&rolled_back_at, self.now);
        if waited >= self.settings.deadline {
            return None;
        }
        self.look_again_in((self.settings.deadline - waited).min(Duration::from_secs(30)));
        Some((Workload::AsObserved, r))
    }

    /// After the new version's pods stopped taking requests in one write (a blue-green App's
    /// Service moved off the preview, a routed canary's weight went to 0: a promotion, a
    /// rollback, a revert), its Deployment as it is for `DRAIN` after the rollout ended, so
    /// that proxies and clients still holding its endpoints finish with them instead of
    /// meeting terminating pods. A replica-weighted canary's pods are taken out of the
    /// Service's endpoints by their own termination, so it goes at once.
    fn draining(&mut self) -> Option<Workload> {
        if self.settings.blue_green.is_none() && self.settings.route.is_none() {
            return None;
        }
        self.input.observed.canary?;
        let last = self.status.history.first()?;
        let ended =
            matches!(last.result, RolloutResult::Promoted | RolloutResult::RolledBack | RolloutResult::Reverted);
        let waited = elapsed(&last.at, self.now);
        // A record from the future (a writer's clock ahead) does not hold the pods.
        let future = last.at.0.as_millisecond() > self.now.as_millisecond();
        if !ended || future || waited >= DRAIN {
            return None;
        }
        self.look_again_in(DRAIN - waited);
        Some(Workload::AsObserved)
    }

    /// Rolls the failed rollout back (always: also what a user's abort asks for).
    fn fail(&mut self, stable_version: &str, reason: &'static str, message: String) -> Planned {
        let target = self.target.clone();
        let failed = FailedVersion {
            version: target.clone(),
            generation: self.app.metadata.generation.unwrap_or(0),
            reason: reason.to_string(),
            message: message.clone(),
        };
        let text = format!("rolled back version {target} to {stable_version}: {message}");
        self.note(true, "RolledBack", text.clone());
        self.record(target, RolloutResult::RolledBack, Some(message));
        self.status.failed_version = Some(failed.clone());
        self.rolled_back(stable_version, &failed)
    }

    /// How long the new version's Deployment has not had all its pods available, kept in
    /// `since` (a canary step's, a blue-green stage's): counted from the first look that saw
    /// it short, and not over the time a person held the rollout (the progress deadline).
    fn unavailable_for(&self, since: &mut Option<Time>, complete: bool) -> Duration {
        if complete {
            *since = None;
            return Duration::ZERO;
        }
        let was_paused = self.app.status.as_ref().and_then(|s| s.phase) == Some(AppPhase::Paused);
        let since = since.get_or_insert(Time(self.now));
        if was_paused && !paused_by_user(self.app) {
            *since = Time(self.now);
        }
        elapsed(since, self.now)
    }

    /// The stable Deployment rolling to the new version, the last stage of a canary or a
    /// blue-green rollout, which began at `since`: past the progress deadline the rollout
    /// fails (`Break` with the rollback) or is held for a person (`Continue` with the outcome
    /// to show); before it, nothing to show, and a look again at the deadline.
    fn stable_rolling_in(
        &mut self,
        stable_version: &str,
        since: &Time,
        r: Readiness,
        user_paused: bool,
    ) -> ControlFlow<Planned, Option<Outcome>> {
        let waited = elapsed(since, self.now);
        if user_paused {
            return ControlFlow::Continue(None);
        }
        if waited <= self.settings.deadline {
            self.look_again_in(self.settings.deadline - waited);
            return ControlFlow::Continue(None);
        }
        let message = format!(
            "the stable Deployment did not become available on version {} within {}: {}/{} replicas ready",
            self.target,
            secs(self.settings.deadline),
            r.ready,
            r.want
        );
        match self.fail_or_hold(stable_version, "ProgressDeadlineExceeded", message) {
            ControlFlow::Break(rolled_back) => ControlFlow::Break(rolled_back),
            ControlFlow::Continue(outcome) => ControlFlow::Continue(Some(outcome)),
        }
    }

    /// The rollout failed a check or the health gate: roll it back (`Break` with the plan), or
    /// with autoRollback off hold it where it is for a person to abort or promote (`Continue`
    /// with the outcome to show).
    fn fail_or_hold(
        &mut self,
        stable_version: &str,
        reason: &'static str,
        message: String,
    ) -> ControlFlow<Planned, Outcome> {
        if self.settings.auto_rollback {
            return ControlFlow::Break(self.fail(stable_version, reason, message));
        }
        ControlFlow::Continue(Outcome {
            phase: AppPhase::Paused,
            reason: reason.to_string(),
            message: format!("{message}; autoRollback is off: abort or promote the rollout"),
        })
    }

    /// Runs the analysis bookkeeping for this round: records the measurements passed in, or
    /// asks for a run when one is due. Returns the outcome that stops the rollout, if any.
    fn analyse(&mut self, may_run: bool) -> Option<AnalysisStop> {
        if !self.settings.analysis {
            return None;
        }
        let limit = self.settings.failure_limit;
        let started = self.status.rollout.as_ref().map(|r| r.started_at.clone());
        let mut analysis = self.status.analysis.clone().unwrap_or_default();
        if analysis.failures >= limit {
            return Some(AnalysisStop::Failed(explain(&analysis.measurements)));
        }
        let mut stop = None;
        if let Some(measurements) = self.input.measurements.filter(|_| may_run) {
            let before = analysis.last_result;
            let result = summarise(measurements);
            analysis.last_run = Some(Time(self.now));
            analysis.last_result = Some(result);
            analysis.measurements = measurements.to_vec();
            let why = explain(measurements);
            self.look_again_in(self.settings.interval);
            match result {
                MeasurementResult::Fail => {
                    analysis.failures += 1;
                    let failures = analysis.failures;
                    self.note(true, "AnalysisFailed", format!("failed run {failures} of {limit}: {why}"));
                    if failures >= limit {
                        stop = Some(AnalysisStop::Failed(why));
                    }
                }
                MeasurementResult::Inconclusive if before != Some(result) => {
                    self.note(true, "AnalysisInconclusive", format!("rollout paused, no usable measurement: {why}"));
                }
                MeasurementResult::Invalid if before != Some(result) => {
                    self.note(true, "QueryInvalid", format!("rollout stopped, a query is invalid: {why}"));
                }
                MeasurementResult::Pass if before.is_some_and(|b| b != MeasurementResult::Pass) => {
                    self.note(false, "AnalysisPassed", "every check passes again: the rollout goes on".into());
                }
                _ => {}
            }
        } else if may_run {
            let due = match (&analysis.last_run, &started) {
                (Some(last), Some(start)) if last.0 >= start.0 => {
                    let since = elapsed(last, self.now);
                    if since < self.settings.interval {
                        self.look_again_in(self.settings.interval - since);
                        false
                    } else {
                        true
                    }
                }
                _ => true,
            };
            self.analysis_due = due;
        }
        self.status.analysis = Some(analysis);
        if stop.is_some() {
            return stop;
        }
        let analysis = self.status.analysis.clone().unwrap_or_default();
        match analysis.last_result {
            Some(MeasurementResult::Inconclusive) => Some(AnalysisStop::Inconclusive(explain(&analysis.measurements))),
            Some(MeasurementResult::Invalid) => Some(AnalysisStop::Invalid(explain(&analysis.measurements))),
            _ => None,
        }
    }

    /// Whether the latest run passed and was taken after `since` (a run in the second a step
    /// began belongs to the step before).
    fn passed_since(&self, since: &Time) -> bool {
        !self.settings.analysis
            || self.status.analysis.as_ref().is_some_and(|a| {
                a.last_result == Some(MeasurementResult::Pass) && a.last_run.as_ref().is_some_and(|t| t.0 > since.0)
            })
    }

    fn promoted_by_user(&self) -> bool {
        self.status.rollout.as_ref().is_some_and(|r| r.promoted_by_user)
    }

    fn started_at(&self) -> Time {
        self.status.rollout.as_ref().map(|r| r.started_at.clone()).unwrap_or(Time(self.now))
    }

    /// Completes the rollout: the new version is the stable one.
    fn promoted(&mut self) -> Outcome {
        let target = self.target.clone();
        let from = self.status.current_version.clone().unwrap_or_default();
        let message = format!("version {target} replaced {from} and is available with {} replicas", self.total);
        self.note(false, "Promoted", message.clone());
        self.record(target.clone(), RolloutResult::Promoted, Some(message.clone()));
        if let Some(record) = self.status.history.first_mut()
            && !from.is_empty()
        {
            record.replaced = Some(from.clone());
        }
        self.set_stable(&target);
        self.status.rollout = None;
        self.status.canary = None;
        self.status.blue_green = None;
        self.status.failed_version = None;
        Outcome { phase: AppPhase::Healthy, reason: "Promoted".into(), message }
    }

    /// The analysis state when no run may be taken now (paused, or the canary is not ready):
    /// a failure limit already reached still stops the rollout.
    fn held_analysis(&self) -> Option<AnalysisStop> {
        let a = self.status.analysis.as_ref()?;
        (self.settings.analysis && a.failures >= self.settings.failure_limit)
            .then(|| AnalysisStop::Failed(explain(&a.measurements)))
    }

    /// Turns the decision into the status to write.
    fn finish(mut self, stable: Workload, canary: Option<Workload>, outcome: Outcome) -> Plan {
        let app = self.app;
        let route_weight = self.routed();
        let observed_generation = app.metadata.generation;
        let stable_ready = ready_replicas(self.input.observed.stable);
        let canary_ready = ready_replicas(self.input.observed.canary);
        // The pods the App's Service serves from.
        let ready = match (self.active, canary.is_some()) {
            (Some(Track::Stable), _) | (None, false) => stable_ready,
            (Some(Track::Canary), _) => canary_ready,
            (None, true) => stable_ready + canary_ready,
        };
        let s = &mut self.status;
        s.observed_generation = observed_generation;
        s.ready_replicas = Some(ready);
        s.replicas = Some(self.total);
        s.ready = Some(format!("{ready}/{}", self.total));
        s.phase = Some(outcome.phase);
        let healthy = outcome.phase == AppPhase::Healthy;
        let moving = matches!(outcome.phase, AppPhase::Healthy | AppPhase::Progressing);
        let conditions = [
            DesiredCondition {
                type_: READY,
                status: healthy,
                reason: if healthy { "Available".into() } else { outcome.reason.clone() },
                message: outcome.message.clone(),
            },
            DesiredCondition { type_: PROGRESSING, status: moving, reason: outcome.reason, message: outcome.message },
        ];
        let previous = app.status.as_ref().map(|s| s.conditions.clone()).unwrap_or_default();
        s.conditions = merge_conditions(&previous, &conditions, observed_generation, self.now);
        if healthy && canary.is_none() {
            self.recheck = None;
        }
        Plan {
            stable,
            canary,
            status: self.status,
            notes: self.notes,
            recheck: self.recheck,
            analysis_due: self.analysis_due,
            active: self.active,
            preview: self.preview,
            route_weight,
        }
    }

    /// A routed canary's route in status, and the weight to set on it (`None`: no route, or
    /// one that cannot be used). Its Service `<app>` then selects the stable pods only: the
    /// canary's pods take requests through the route alone, at the weight of the step.
    fn routed(&mut self) -> Option<i32> {
        let Some(http_route) = self.settings.route.clone() else {
            self.status.traffic_routing = None;
            return None;
        };
        self.active = Some(Track::Stable);
        let problem = self.route_problem();
        let before = self.app.status.as_ref().and_then(|s| s.traffic_routing.as_ref()).and_then(|t| t.problem.clone());
        if let Some(why) = problem.as_ref().filter(|why| before.as_ref() != Some(*why)) {
            self.note(true, "RouteNotUsable", why.clone());
        }
        self.status.traffic_routing = Some(TrafficRoutingStatus {
            http_route,
            canary_weight: self.route_weight,
            problem: problem.clone(),
            retired_at: None,
        });
        problem.is_none().then_some(self.route_weight)
    }

    /// The canary's weight on a routed canary's HTTPRoute now, as read (0 when unknown).
    fn route_weight_now(&self) -> i32 {
        match &self.input.observed.route {
            Some(Ok(Some(w))) => *w,
            _ => 0,
        }
    }

    /// Whether the requests follow the canary's step at `weight`: always, without a route;
    /// with one, once the route carries that weight.
    fn route_carries(&self, weight: i32) -> bool {
        self.settings.route.is_none() || matches!(self.input.observed.route, Some(Ok(Some(w))) if w == weight)
    }

    /// A routed canary's share of requests, capped by what its available pods can take
    /// (`available` of the App's replicas): a canary losing pods loses its share with them,
    /// and one with none takes nothing.
    fn capped_weight(&self, weight: i32, available: i32) -> i32 {
        let carried = i64::from(available.max(0)) * 100 / i64::from(self.total.max(1));
        i32::try_from(carried.min(i64::from(weight))).unwrap_or(weight).clamp(0, 100)
    }

    /// Why a routed canary's HTTPRoute cannot be used now, if it cannot.
    fn route_problem(&self) -> Option<String> {
        let name = self.settings.route.as_ref()?;
        match &self.input.observed.route {
            Some(Ok(_)) => None,
            Some(Err(why)) => Some(why.clone()),
            None => Some(format!("HTTPRoute {name} was not read")),
        }
    }
}

/// Why the analysis stops a rollout.
enum AnalysisStop {
    Failed(String),
    Inconclusive(String),
    Invalid(String),
}

impl AnalysisStop {
    fn outcome(self, target: &str) -> Outcome {
        match self {
            AnalysisStop::Failed(why) => Outcome {
                phase: AppPhase::Paused,
                reason: "AnalysisFailed".into(),
                message: format!("the rollout of {target} failed its analysis: {why}"),
            },
            AnalysisStop::Inconclusive(why) => Outcome {
                phase: AppPhase::Paused,
                reason: "Inconclusive".into(),
                message: format!(
                    "the rollout of {target} is paused until its checks have data again (it is never promoted without): {why}"
                ),
            },
            AnalysisStop::Invalid(why) => Outcome {
                phase: AppPhase::Degraded,
                reason: "QueryInvalid".into(),
                message: format!("the rollout of {target} is stopped: fix spec.rollout.analysis: {why}"),
            },
        }
    }
}

// One file per strategy, over the shared core above (analysis, deadlines, rollback).
#[path = "bluegreen.rs"]
mod bluegreen;
#[path = "canary.rs"]
mod canary;
#[path = "rolling.rs"]
mod rolling;

#[cfg(test)]
#[path = "planner_tests.rs"]
mod tests;
