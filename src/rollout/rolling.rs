//! The Rolling strategy: the stable Deployment is updated in place, within the App's
//! maxUnavailable/maxSurge; the analysis runs while it rolls, and the new version is accepted
//! once the Deployment is complete and a run passes.

use super::*;

impl Planner<'_> {
    pub(super) fn rolling(&mut self, stable_version: &str) -> Planned {
        let user_paused = paused_by_user(self.app);
        let promoted = self.promoted_by_user();
        let r = readiness(self.input.observed.stable, &self.target, self.total);
        // Measure once pods of the new version serve: before that there is nothing to measure.
        let stop = if user_paused || promoted || r.available == 0 { self.held_analysis() } else { self.analyse(true) };
        let target = self.target.clone();
        // A Deployment paused in the same write that changes its image never starts the new
        // version: pause only once the new template is in.
        let rolled_in = self.input.observed.stable.and_then(revision_of) == Some(self.target.as_str());
        let held = stop.is_some() || user_paused;
        let was_paused = self.app.status.as_ref().and_then(|s| s.phase) == Some(AppPhase::Paused);
        let now = self.now;
        if let Some(progress) = self.status.rollout.as_mut()
            && was_paused
            && !held
        {
            // The deadline does not count the time the rollout was held.
            progress.progress_since = Some(Time(now));
        }
        let since = self.status.rollout.as_ref().and_then(|r| r.progress_since.clone()).unwrap_or(self.started_at());
        let waited = elapsed(&since, self.now);
        if let Some(AnalysisStop::Failed(why)) = &stop {
            let message = format!("analysis failed: {why}");
            let held = match self.fail_or_hold(stable_version, "AnalysisFailed", message) {
                ControlFlow::Break(rolled_back) => return rolled_back,
                ControlFlow::Continue(held) => held,
            };
            return (self.stable_from_spec(&target, fixed_replicas(self.app), rolled_in), None, held);
        }
        if !r.complete && !held && waited > self.settings.deadline {
            let message = format!(
                "version {target} did not become available within {}: {}/{} replicas ready",
                secs(self.settings.deadline),
                r.ready,
                r.want
            );
            let held = match self.fail_or_hold(stable_version, "ProgressDeadlineExceeded", message) {
                ControlFlow::Break(rolled_back) => return rolled_back,
                ControlFlow::Continue(held) => held,
            };
            return (self.stable_from_spec(&target, fixed_replicas(self.app), rolled_in), None, held);
        }
        let stable = self.stable_from_spec(&target, fixed_replicas(self.app), held && rolled_in);
        let just_passed = self.input.measurements.is_some() && self.passed_since(&self.started_at());
        if r.complete && !user_paused && (!self.settings.analysis || promoted || just_passed) {
            let outcome = self.promoted();
            return (stable, None, outcome);
        }
        if !r.complete && !held && waited < self.settings.deadline {
            self.look_again_in(self.settings.deadline - waited);
        }
        let outcome = match stop {
            Some(s) => s.outcome(&target),
            None if user_paused => Outcome {
                phase: AppPhase::Paused,
                reason: "PausedByUser".into(),
                message: format!("the rolling update to {target} is paused ({ANNOTATION_PAUSED}=true)"),
            },
            None if r.complete => Outcome {
                phase: AppPhase::Progressing,
                reason: "Analysing".into(),
                message: format!("version {target} is available; waiting for a passing analysis run to promote it"),
            },
            None => self.converging(&target, r, self.input.observed.stable),
        };
        (stable, None, outcome)
    }
}
