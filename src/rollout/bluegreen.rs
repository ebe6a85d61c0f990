//! The BlueGreen strategy. The new version runs at full size in the second Deployment
//! (`<app>-canary`) behind the preview Service `<app>-preview`, while the App's Service selects
//! the stable pods only:
//! 1. `Preview`: once the new version is available and its checks pass (or a person promotes,
//!    with `autoPromotion: false`), the App's Service switches to it in one write.
//! 2. `Switched`: the old version keeps running, untouched, for `scaleDownDelay` while the checks
//!    go on against the new one; a failure switches the Service back at once.
//! 3. `Promoting`: the stable Deployment moves to the new version while the Service still
//!    selects the preview pods; once it is available the Service selects it again and the
//!    preview Deployment and Service go. The App ends as every other strategy ends: the stable
//!    Deployment `<app>` runs the new version (which keeps recovery, the HPA's target and drift
//!    correction the same for all strategies, at the cost of the new version's pods being
//!    started twice).

use super::*;
use crate::api::{BlueGreenStage, BlueGreenStatus};

impl Planner<'_> {
    pub(super) fn blue_green(&mut self, stable_version: &str, promote: bool) -> Planned {
        let total = self.total;
        let mut bg = self.status.blue_green.clone().unwrap_or(BlueGreenStatus {
            stage: BlueGreenStage::Preview,
            since: Time(self.now),
            replicas: total,
            unavailable_since: None,
        });
        // The size of the preview. With an autoscaler it never shrinks during the rollout: the
        // HPA scales the stable Deployment, whose pods take no traffic after the switch, and
        // the preview must not follow it down while it serves everything. (The old version
        // stays the HPA's: a switch back finds it at the size the HPA left it, which then
        // scales it up under the load.)
        bg.replicas = if fixed_replicas(self.app).is_some() { total } else { bg.replicas.max(total) };
        match bg.stage {
            BlueGreenStage::Preview => self.preview(stable_version, bg, promote),
            BlueGreenStage::Switched => self.switched(stable_version, bg, promote),
            BlueGreenStage::Promoting => self.promote_stable(stable_version, bg),
        }
    }

    fn blue_green_settings(&self) -> BlueGreenSettings {
        self.settings
            .blue_green
            .clone()
            .unwrap_or(BlueGreenSettings { auto_promotion: true, scale_down_delay: DEFAULT_SCALE_DOWN_DELAY })
    }

    /// `bg` enters `stage` now.
    fn enter(&self, bg: &mut BlueGreenStatus, stage: BlueGreenStage) {
        bg.stage = stage;
        bg.since = Time(self.now);
        bg.unavailable_since = None;
    }

    fn preview(&mut self, stable_version: &str, mut bg: BlueGreenStatus, promote: bool) -> Planned {
        let target = self.target.clone();
        let total = bg.replicas;
        let user_paused = paused_by_user(self.app);
        let preview_name = names::preview_service_name(self.name());
        if self.input.observed.canary.is_none()
            && let Some(why) = self.input.observed.quota.clone()
        {
            return self.preview_waits_for_quota(stable_version, bg, &why);
        }
        let cr = readiness(self.input.observed.canary, &target, total);
        let waited = self.unavailable_for(&mut bg.unavailable_since, cr.complete);
        let stop = if user_paused || !cr.complete { self.held_analysis() } else { self.analyse(true) };
        if let Some(AnalysisStop::Failed(why)) = &stop {
            let message = format!("analysis of version {target} behind {preview_name} failed: {why}");
            return match self.fail_or_hold(stable_version, "AnalysisFailed", message) {
                ControlFlow::Break(rolled_back) => rolled_back,
                ControlFlow::Continue(held) => self.blue_green_objects(stable_version, bg, held),
            };
        }
        if !cr.complete && !user_paused && waited > self.settings.deadline {
            let message = format!(
                "version {target} did not become available behind {preview_name} within {}: {}/{} replicas ready{}",
                secs(self.settings.deadline),
                cr.ready.min(total),
                total,
                self.preview_failure()
            );
            return match self.fail_or_hold(stable_version, "ProgressDeadlineExceeded", message) {
                ControlFlow::Break(rolled_back) => rolled_back,
                ControlFlow::Continue(held) => self.blue_green_objects(stable_version, bg, held),
            };
        }

        let by_user = promote || self.promoted_by_user();
        let checked = stop.is_none() && self.passed_since(&bg.since);
        let ready = cr.complete && !user_paused && (by_user || checked);
        if ready && (by_user || self.blue_green_settings().auto_promotion) {
            return self.switch(stable_version, bg, by_user);
        }
        if promote {
            self.note(
                false,
                "NothingToDo",
                format!(
                    "version {target} is not available behind {preview_name} yet ({}/{total} replicas ready): promote again once it is",
                    cr.ready.min(total)
                ),
            );
        }
        if !cr.complete && !user_paused && waited < self.settings.deadline {
            self.look_again_in(self.settings.deadline - waited);
        }
        let outcome = match stop {
            Some(s) => s.outcome(&target),
            None if user_paused => Outcome {
                phase: AppPhase::Paused,
                reason: "PausedByUser".into(),
                message: format!("the blue-green rollout of {target} is paused ({ANNOTATION_PAUSED}=true)"),
            },
            None if ready => Outcome {
                phase: AppPhase::Paused,
                reason: "WaitingForPromote".into(),
                message: format!(
                    "Paused (waiting for promote): version {target} is available behind {preview_name} and its checks pass; `flotilla promote` switches the App's Service to it"
                ),
            },
            None if cr.complete => Outcome {
                phase: AppPhase::Progressing,
                reason: "Preview".into(),
                message: format!(
                    "version {target} is available behind {preview_name} ({total} replicas); analysing before the switch"
                ),
            },
            None => Outcome {
                phase: AppPhase::Progressing,
                reason: "Preview".into(),
                message: format!(
                    "version {target} comes up behind {preview_name}: {}/{total} replicas ready{}",
                    cr.ready.min(total),
                    self.preview_failure()
                ),
            },
        };
        self.blue_green_objects(stable_version, bg, outcome)
    }

    /// The namespace's quota cannot hold a second full copy: nothing of the preview is
    /// created, the Service stays on the old version, and the rollout waits (its deadline does
    /// not run) until the quota grows or the App shrinks; one Warning when it starts waiting.
    fn preview_waits_for_quota(&mut self, stable_version: &str, mut bg: BlueGreenStatus, why: &str) -> Planned {
        let target = self.target.clone();
        let message = format!(
            "the blue-green rollout of {target} waits: the namespace's quota cannot hold its preview ({} pods) beside the running version: {why}",
            bg.replicas
        );
        let waiting = self
            .app
            .status
            .as_ref()
            .is_some_and(|s| s.conditions.iter().any(|c| c.type_ == PROGRESSING && c.reason == "QuotaExceeded"));
        if !waiting {
            self.note(true, "QuotaExceeded", message.clone());
        }
        bg.unavailable_since = None;
        self.look_again_in(Duration::from_secs(30));
        let stable = self.stable_kept(stable_version, fixed_replicas(self.app));
        self.active = Some(Track::Stable);
        self.preview = false;
        self.status.blue_green = Some(bg);
        (stable, None, Outcome { phase: AppPhase::Paused, reason: "QuotaExceeded".into(), message })
    }

    /// Why the preview Deployment cannot create its pods (a quota that cannot hold two full
    /// copies of the App names itself here), as a suffix of a message.
    fn preview_failure(&self) -> String {
        replica_failure(self.input.observed.canary)
            .map(|why| format!("; pods cannot be created: {why}"))
            .unwrap_or_default()
    }

    /// The App's Service moves to the new version, in this plan's one Service write.
    fn switch(&mut self, stable_version: &str, mut bg: BlueGreenStatus, by_user: bool) -> Planned {
        let target = self.target.clone();
        let delay = self.blue_green_settings().scale_down_delay;
        let service = names::service_name(self.name());
        let who = if by_user { "a user promoted it" } else { "its checks pass" };
        self.note(
            false,
            "Switched",
            format!(
                "the Service {service} now selects version {target} ({who}); version {stable_version} keeps running for {} in case it must switch back",
                secs(delay)
            ),
        );
        self.enter(&mut bg, BlueGreenStage::Switched);
        self.look_again_in(delay);
        let outcome = self.switched_outcome(stable_version, delay);
        self.blue_green_objects(stable_version, bg, outcome)
    }

    fn switched_outcome(&self, stable_version: &str, left: Duration) -> Outcome {
        Outcome {
            phase: AppPhase::Progressing,
            reason: "Switched".into(),
            message: format!(
                "the App's Service selects version {}; version {stable_version} is kept for {} more while the checks go on",
                self.target,
                secs(left)
            ),
        }
    }

    /// After the switch: the old version stays for `scaleDownDelay`; the checks go on against
    /// the new one, and a failure switches back at once.
    fn switched(&mut self, stable_version: &str, mut bg: BlueGreenStatus, promote: bool) -> Planned {
        let target = self.target.clone();
        let total = bg.replicas;
        let user_paused = paused_by_user(self.app);
        let cr = readiness(self.input.observed.canary, &target, total);
        let was_complete = bg.unavailable_since.is_none();
        let waited = self.unavailable_for(&mut bg.unavailable_since, cr.complete);
        let service = names::service_name(self.name());
        // The new version lost pods after the switch: the old one, still all there, serves
        // again at once, and the new one again once it is back (the deadline counts meanwhile).
        if was_complete && !cr.complete {
            self.note(
                true,
                "SwitchedBack",
                format!(
                    "version {target} has {}/{total} replicas available after the switch: the Service {service} selects {stable_version} again until it is back",
                    cr.available
                ),
            );
        } else if !was_complete && cr.complete {
            self.note(
                false,
                "Switched",
                format!("version {target} is available again: the Service {service} selects it again"),
            );
        }
        let stop = if user_paused { self.held_analysis() } else { self.analyse(true) };
        if let Some(AnalysisStop::Failed(why)) = &stop {
            let message = format!(
                "analysis failed after the switch to {target}: {why}; the Service selects {stable_version} again"
            );
            return match self.fail_or_hold(stable_version, "AnalysisFailed", message) {
                ControlFlow::Break(rolled_back) => rolled_back,
                // Held for a person (autoRollback off): the failing version keeps its pods for
                // them to look at, but not the traffic.
                ControlFlow::Continue(held) => {
                    let planned = self.blue_green_objects(stable_version, bg, held);
                    self.active = Some(Track::Stable);
                    planned
                }
            };
        }
        if !cr.complete && !user_paused && waited > self.settings.deadline {
            let message = format!(
                "version {target} lost available replicas after the switch and did not recover within {}: {}/{total} ready; the Service selects {stable_version} again",
                secs(self.settings.deadline),
                cr.ready.min(total)
            );
            return match self.fail_or_hold(stable_version, "ProgressDeadlineExceeded", message) {
                ControlFlow::Break(rolled_back) => rolled_back,
                ControlFlow::Continue(held) => self.blue_green_objects(stable_version, bg, held),
            };
        }
        let delay = self.blue_green_settings().scale_down_delay;
        let served = elapsed(&bg.since, self.now);
        let checked = stop.is_none() && self.passed_since(&bg.since);
        let by_user = promote || self.promoted_by_user();
        if !user_paused && cr.complete && (by_user || (served >= delay && checked)) {
            self.note(
                false,
                "ScalingDown",
                format!(
                    "version {target} served for {} with passing checks: {stable_version} is replaced",
                    secs(served)
                ),
            );
            self.enter(&mut bg, BlueGreenStage::Promoting);
            return self.promote_stable(stable_version, bg);
        }
        if served < delay && !user_paused {
            self.look_again_in(delay - served);
        }
        let outcome = match stop {
            Some(s) => s.outcome(&target),
            None if user_paused => Outcome {
                phase: AppPhase::Paused,
                reason: "PausedByUser".into(),
                message: format!(
                    "the blue-green rollout of {target} is paused after the switch; {stable_version} is kept ({ANNOTATION_PAUSED}=true)"
                ),
            },
            None if !cr.complete => Outcome {
                phase: AppPhase::Progressing,
                reason: "SwitchedBack".into(),
                message: format!(
                    "version {target} has {}/{total} replicas available after the switch: the Service selects {stable_version} until it is back",
                    cr.available
                ),
            },
            None => self.switched_outcome(stable_version, delay.saturating_sub(served)),
        };
        if !cr.complete && !user_paused && waited < self.settings.deadline {
            self.look_again_in(self.settings.deadline - waited);
        }
        self.blue_green_objects(stable_version, bg, outcome)
    }

    /// Last stage: the stable Deployment moves to the new version while the Service selects
    /// the preview pods; once it is available the Service selects it and the preview goes.
    fn promote_stable(&mut self, stable_version: &str, bg: BlueGreenStatus) -> Planned {
        let target = self.target.clone();
        let stable = self.stable_from_spec(&target, fixed_replicas(self.app), false);
        let r = readiness(self.input.observed.stable, &target, self.total);
        let user_paused = paused_by_user(self.app);
        if r.complete && !user_paused {
            let outcome = self.promoted();
            // The Service moves to the stable Deployment in this plan; the preview's pods,
            // which took all the traffic, stay a few seconds more (`draining`).
            self.active = Some(Track::Stable);
            self.preview = false;
            let draining = self.draining();
            return (stable, draining, outcome);
        }
        let held = match self.stable_rolling_in(stable_version, &bg.since, r, user_paused) {
            ControlFlow::Break(rolled_back) => return rolled_back,
            ControlFlow::Continue(held) => held,
        };
        let outcome = held.unwrap_or_else(|| Outcome {
            phase: if user_paused { AppPhase::Paused } else { AppPhase::Progressing },
            reason: if user_paused { "PausedByUser".into() } else { "Promoting".into() },
            message: format!(
                "promoting {target}: the stable Deployment moves to it ({}/{} replicas ready) while the Service selects the preview pods",
                r.ready, r.want
            ),
        });
        let canary = self.canary_of(bg.replicas);
        // The preview pods serve while the stable Deployment rolls; should they be short,
        // both tracks do (both run or move to the new version) rather than too few pods.
        let complete = readiness(self.input.observed.canary, &target, bg.replicas).complete;
        self.active = complete.then_some(Track::Canary);
        self.preview = true;
        self.status.blue_green = Some(bg);
        (stable, Some(canary), outcome)
    }

    /// The objects of the Preview and Switched stages: the stable Deployment untouched at full
    /// size, the new version at full size beside it, and the Service on the stage's track:
    /// after the switch, the new version's while all its pods are available, else the old one's.
    fn blue_green_objects(&mut self, stable_version: &str, bg: BlueGreenStatus, outcome: Outcome) -> Planned {
        let stable = self.stable_kept(stable_version, fixed_replicas(self.app));
        let canary = self.canary_of(bg.replicas);
        let serving = readiness(self.input.observed.canary, &self.target, bg.replicas).complete;
        self.active = Some(match bg.stage {
            BlueGreenStage::Switched | BlueGreenStage::Promoting if serving => Track::Canary,
            _ => Track::Stable,
        });
        self.preview = true;
        self.status.blue_green = Some(bg);
        (stable, Some(canary), outcome)
    }
}
