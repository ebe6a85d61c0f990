//! The Canary strategy: a second Deployment (`<app>-canary`) runs the new version on a
//! growing share of the replicas, step by step, each step gated by its pause, the analysis and
//! optionally a person; after the last step the stable Deployment moves to the new version
//! while the canary still serves, then the canary goes.

use super::*;

impl Planner<'_> {
    pub(super) fn canary(&mut self, stable_version: &str, promote_step: bool) -> Planned {
        let steps = i32::try_from(self.settings.weights.len()).unwrap_or(i32::MAX);
        let target = self.target.clone();
        let user_paused = paused_by_user(self.app);
        // A routed canary whose HTTPRoute cannot be used waits where it is: its weight cannot
        // be set, and its pods may take no requests to be judged on.
        let route_problem = self.route_problem();
        let holding = user_paused || route_problem.is_some();
        let mut c = self.status.canary.clone().unwrap_or_else(|| CanaryStatus {
            step: 0,
            steps,
            weight: self.settings.weights.first().copied().unwrap_or(100),
            replicas: 0,
            stable_replicas: self.total,
            step_started_at: Time(self.now),
            available_since: None,
            unavailable_since: None,
        });
        if c.step >= steps && c.step < c.steps {
            // Steps were removed from the spec mid-rollout: stay at the (new) last step, gated.
            c.step = steps - 1;
        }
        c.steps = steps;
        if self.promoted_by_user() && c.step < steps {
            c.step = steps;
            c.step_started_at = Time(self.now);
        } else if promote_step && c.step < steps {
            c.step += 1;
            c.step_started_at = Time(self.now);
            let text = if c.step < steps { format!("step {}", c.step + 1) } else { "promotion".to_string() };
            self.note(false, "StepPromotedByUser", format!("a user moved the canary of {target} on to {text}"));
        }

        if c.step >= steps {
            return self.promote_canary(stable_version, c);
        }

        let index = usize::try_from(c.step).unwrap_or(0);
        let weight = self.settings.weights[index];
        let wanted = self.canary_size(weight);
        let cr = readiness(self.input.observed.canary, &self.target, wanted);
        // The step serves once its pods are available and, for a routed canary, the route
        // carries its weight: its pause counts from then, and its checks judge only
        // requests sent at that weight.
        let serving = cr.complete && self.route_carries(weight);
        if serving {
            c.available_since.get_or_insert(Time(self.now));
        } else {
            c.available_since = None;
        }
        let available_for = c.available_since.as_ref().map_or(Duration::ZERO, |t| elapsed(t, self.now));
        // A routed canary's first run of a step waits one interval after the weight is on the
        // route, so that its queries' windows hold requests sent at that weight.
        let routed = self.settings.route.is_some();
        let settled = !routed || available_for >= self.settings.interval;
        // (No run is taken before `settled`, so one after `available_since` is one of those.)
        let judged_from = match (&c.available_since, routed) {
            (Some(since), true) => since.clone(),
            _ => c.step_started_at.clone(),
        };
        let waited = self.unavailable_for(&mut c.unavailable_since, cr.complete);
        let canary_name = names::canary_deployment_name(self.name());

        let stop = if holding || !serving {
            self.held_analysis()
        } else if !settled {
            self.look_again_in(self.settings.interval - available_for);
            self.held_analysis()
        } else {
            self.analyse(true)
        };
        if let Some(AnalysisStop::Failed(why)) = &stop {
            let message = format!("analysis failed at step {} ({weight}%): {why}", c.step + 1);
            let held = match self.fail_or_hold(stable_version, "AnalysisFailed", message) {
                ControlFlow::Break(rolled_back) => return rolled_back,
                ControlFlow::Continue(held) => held,
            };
            return self.canary_objects(stable_version, c, wanted, cr, held);
        }
        if !cr.complete && !user_paused && waited > self.settings.deadline {
            let message = format!(
                "the canary Deployment {canary_name} did not become available within {}: {}/{} replicas ready",
                secs(self.settings.deadline),
                cr.ready.min(wanted),
                wanted
            );
            let held = match self.fail_or_hold(stable_version, "ProgressDeadlineExceeded", message) {
                ControlFlow::Break(rolled_back) => return rolled_back,
                ControlFlow::Continue(held) => held,
            };
            return self.canary_objects(stable_version, c, wanted, cr, held);
        }

        let pause = self.settings.pauses[index];
        let gated = self.settings.gates.get(index).copied().unwrap_or(false);
        let analysed = self.passed_since(&judged_from);
        let step_done = serving && stop.is_none() && !holding && available_for >= pause && analysed;
        if step_done && !gated {
            c.step += 1;
            c.step_started_at = Time(self.now);
            c.available_since = None;
            c.unavailable_since = Some(Time(self.now));
            if c.step >= steps {
                self.note(
                    false,
                    "StepCompleted",
                    format!("step {} of {steps} ({weight}%) passed: promoting {target}", c.step),
                );
                return self.promote_canary(stable_version, c);
            }
            let next = self.settings.weights[usize::try_from(c.step).unwrap_or(0)];
            self.note(
                false,
                "StepCompleted",
                format!("step {} of {steps} ({weight}%) passed: moving to step {} ({next}%)", c.step, c.step + 1),
            );
            let wanted = self.canary_size(next);
            let cr = readiness(self.input.observed.canary, &self.target, wanted);
            let outcome = self.step_outcome(&c, next, wanted, cr);
            return self.canary_objects(stable_version, c, wanted, cr, outcome);
        }
        if serving && available_for < pause && !user_paused {
            self.look_again_in(pause - available_for);
        }
        if !cr.complete && !user_paused && waited < self.settings.deadline {
            self.look_again_in(self.settings.deadline - waited);
        }
        let outcome = match (stop, route_problem) {
            (Some(s), _) => s.outcome(&target),
            (None, _) if user_paused => Outcome {
                phase: AppPhase::Paused,
                reason: "PausedByUser".into(),
                message: format!(
                    "the canary of {target} is paused at step {} of {steps} ({weight}%) ({ANNOTATION_PAUSED}=true)",
                    c.step + 1
                ),
            },
            (None, Some(why)) => Outcome {
                phase: AppPhase::Paused,
                reason: "RouteNotUsable".into(),
                message: format!(
                    "the canary of {target} waits at step {} of {steps} ({weight}%) until its HTTPRoute can be used: {why}",
                    c.step + 1
                ),
            },
            // A gated step: `analyse` above keeps the runs going while it waits (and schedules
            // the next one), so a failure still rolls back.
            (None, None) if step_done => Outcome {
                phase: AppPhase::Paused,
                reason: "WaitingForPromote".into(),
                message: format!(
                    "Paused (waiting for promote): the canary of {target} passed step {} of {steps} ({weight}%) and waits for `flotilla promote`",
                    c.step + 1
                ),
            },
            (None, None) => self.step_outcome(&c, weight, wanted, cr),
        };
        self.canary_objects(stable_version, c, wanted, cr, outcome)
    }

    /// Canary replicas at a step's `weight`: a share of the App's replicas (at most all but
    /// one, so that the stable version keeps serving); with a route, as many as that share of
    /// the requests needs, rounded up, and the stable Deployment keeps all of its own.
    fn canary_size(&self, weight: i32) -> i32 {
        if self.settings.route.is_some() {
            routed_canary_replicas(weight, self.total)
        } else {
            canary_replicas(weight, self.total)
        }
    }

    fn step_outcome(&self, c: &CanaryStatus, weight: i32, wanted: i32, cr: Readiness) -> Outcome {
        let target = &self.target;
        let step = format!("step {} of {} ({weight}%)", c.step + 1, c.steps);
        let message = if cr.complete {
            format!("canary {target} at {step}: {wanted} canary replicas available, analysing")
        } else {
            format!("canary {target} at {step}: {}/{wanted} canary replicas ready", cr.ready.min(wanted))
        };
        Outcome { phase: AppPhase::Progressing, reason: "CanaryStep".into(), message }
    }

    fn canary_objects(
        &mut self,
        stable_version: &str,
        mut c: CanaryStatus,
        wanted: i32,
        cr: Readiness,
        outcome: Outcome,
    ) -> Planned {
        let autoscaled = fixed_replicas(self.app).is_none();
        let routed = self.settings.route.is_some();
        // A routed canary's stable Deployment keeps all its replicas: the route, not the pod
        // count, sets the canary's share, and a rollback sends every request back at once.
        let mut stable_count = if routed { self.total } else { stable_replicas(self.total, wanted, cr.available) };
        if let Some(before) = self.app.status.as_ref().and_then(|s| s.canary.as_ref())
            && before.step == c.step
            && self.app.status.as_ref().and_then(|s| s.replicas) == Some(self.total)
        {
            // Within a step and at the same total, the stable Deployment only shrinks: a
            // canary status that lags our own scale-up must not make it grow and shrink again.
            stable_count = stable_count.min(before.stable_replicas.max(1));
        }
        let stable = self.stable_kept(stable_version, (!autoscaled).then_some(stable_count));
        let canary = self.canary_of(wanted);
        let step = usize::try_from(c.step).unwrap_or(0);
        c.weight = self.settings.weights.get(step).copied().unwrap_or(100);
        // The route sends the step's share once the canary's pods for it are all available;
        // until then the share of the step before (none before the first), no more than the
        // available pods can take.
        self.route_weight = if cr.complete {
            c.weight
        } else {
            let before = step.checked_sub(1).and_then(|i| self.settings.weights.get(i)).copied().unwrap_or(0);
            self.capped_weight(before.min(c.weight), cr.available)
        };
        c.replicas = wanted;
        c.stable_replicas = if autoscaled { self.total } else { stable_count };
        self.status.canary = Some(c);
        (stable, Some(canary), outcome)
    }

    /// Last phase of a canary: the stable Deployment moves to the new version (the canary
    /// keeps serving meanwhile), then the canary goes.
    fn promote_canary(&mut self, stable_version: &str, mut c: CanaryStatus) -> Planned {
        let target = self.target.clone();
        let stable = self.stable_from_spec(&target, fixed_replicas(self.app), false);
        let r = readiness(self.input.observed.stable, &self.target, self.total);
        if r.complete && !paused_by_user(self.app) {
            let outcome = self.promoted();
            // A routed canary's pods drain: the route sends them nothing from this plan on.
            let draining = self.draining();
            return (stable, draining, outcome);
        }
        let user_paused = paused_by_user(self.app);
        let held = match self.stable_rolling_in(stable_version, &c.step_started_at, r, user_paused) {
            ControlFlow::Break(rolled_back) => return rolled_back,
            ControlFlow::Continue(held) => held,
        };
        let keep = c.replicas.max(1);
        let canary = self.canary_of(keep);
        // A routed canary keeps the share the route gives it now while the stable Deployment
        // rolls (never more: a promotion from an early step does not send the last step's
        // share to the early step's pods), no more than its available pods can take.
        let available = readiness(self.input.observed.canary, &target, keep).available;
        self.route_weight = self.capped_weight(self.route_weight_now(), available);
        c.weight = 100;
        c.replicas = keep;
        c.stable_replicas = self.total;
        self.status.canary = Some(c);
        let outcome = match held {
            Some(outcome) => outcome,
            None if user_paused => Outcome {
                phase: AppPhase::Paused,
                reason: "PausedByUser".into(),
                message: format!("the promotion of {target} is paused ({ANNOTATION_PAUSED}=true)"),
            },
            None => Outcome {
                phase: AppPhase::Progressing,
                reason: "Promoting".into(),
                message: format!(
                    "promoting {target}: the stable Deployment rolls to it, {}/{} replicas ready",
                    r.ready, r.want
                ),
            },
        };
        (stable, Some(canary), outcome)
    }
}
