//! A new App's first deployment, in as few writes as lose a person nothing.
//!
//! Before this, a new App cost six writes: its Deployment and Service, a status write before
//! them (Progressing) and one after (Healthy), and two Events (`Created`, `Available`). At
//! 10,000 Apps those writes were most of the operator's cost over a bare client's. Now:
//!
//! - **No status write before the Deployment.** Other decisions are persisted before any
//!   Deployment follows them so that a successor cannot undo them (a rollback, a step). A
//!   first deployment decides nothing a successor could undo: with no status, the next owner
//!   plans the same first deployment from the spec, or recovers the version from the running
//!   Deployment.
//! - **The status waits up to [`STATUS_COALESCE`] for the Deployment to become available**,
//!   and is then written once, Healthy; a Deployment still converging after that is written
//!   Progressing, so a person sees progress within that time, and a blocker (a refusal, a
//!   failed write, pods that cannot be created) is written at once.
//! - **No Normal Event.** The first deployment is in the App's status: the Ready condition and
//!   its transition time, `status.history`'s first revision, and the Deployment's own
//!   `ScalingReplicaSet` Events. Events tell what changes after that (rollouts, promotions,
//!   rollbacks, drift put back), and every Warning, including a first deployment's, is still
//!   recorded.

use std::time::Duration;

use crate::api::{AppPhase, AppStatus};

/// How long a new App's status waits for its Deployment to become available before it is
/// written Progressing. An App's Deployment with no pods, or pods that start at once, is
/// available in about a second on an idle control plane.
pub const STATUS_COALESCE: Duration = Duration::from_secs(3);

/// Whether the plan is an App's first deployment: no version ever became stable, no rollout,
/// no rollback, no user request handled.
pub fn is_first_deployment(previous: &AppStatus, planned: &AppStatus) -> bool {
    previous.current_version.is_none()
        && previous.history.is_empty()
        && previous.rollout.is_none()
        && previous.failed_version.is_none()
        && planned.rollout.is_none()
        && planned.canary.is_none()
        && planned.failed_version.is_none()
        && planned.handled_action == previous.handled_action
}

/// How much longer a first deployment's status may wait unwritten, or `None` to write it now.
/// `deployment_age` is the stable Deployment's age (zero when this reconcile created it),
/// `None` when unknown: then nothing waits. `quiet` is false when something must be said (a
/// blocker, a note of the planner).
pub fn status_deferral(
    first: bool,
    planned: &AppStatus,
    quiet: bool,
    deployment_age: Option<Duration>,
) -> Option<Duration> {
    if !first || !quiet || planned.phase == Some(AppPhase::Healthy) {
        return None;
    }
    STATUS_COALESCE.checked_sub(deployment_age?).filter(|left| !left.is_zero())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{FailedVersion, RolloutRecord, RolloutResult};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn progressing() -> AppStatus {
        AppStatus { phase: Some(AppPhase::Progressing), target_version: Some("1".into()), ..AppStatus::default() }
    }

    #[test]
    fn only_a_new_app_with_nothing_decided_is_a_first_deployment() {
        let new = AppStatus::default();
        assert!(is_first_deployment(&new, &progressing()));
        let stable = AppStatus { current_version: Some("1".into()), ..AppStatus::default() };
        assert!(!is_first_deployment(&stable, &progressing()), "a version was stable once");
        let history = AppStatus {
            history: vec![RolloutRecord {
                version: "0".into(),
                result: RolloutResult::Superseded,
                at: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
                message: None,
                replaced: None,
            }],
            ..AppStatus::default()
        };
        assert!(!is_first_deployment(&history, &progressing()), "a rollout ended once");
        let failed = AppStatus {
            failed_version: Some(FailedVersion {
                version: "1".into(),
                generation: 1,
                reason: "AnalysisFailed".into(),
                message: String::new(),
            }),
            ..progressing()
        };
        assert!(!is_first_deployment(&new, &failed), "a rollback is a decision to persist first");
        let handled = AppStatus { handled_action: Some("promote/1".into()), ..progressing() };
        assert!(!is_first_deployment(&new, &handled), "a user's request handled is persisted first");
    }

    #[test]
    fn a_first_status_waits_for_availability_within_the_window_only() {
        let p = progressing();
        let s = |secs| Some(Duration::from_secs(secs));
        // (first, quiet, age, expected wait)
        let table = [
            (true, true, s(0), Some(STATUS_COALESCE)),
            (true, true, None, None),
            (true, true, s(1), Some(STATUS_COALESCE - Duration::from_secs(1))),
            (true, true, s(3), None),
            (true, true, s(60), None),
            (false, true, s(0), None),
            (true, false, s(0), None),
        ];
        for (first, quiet, age, want) in table {
            assert_eq!(status_deferral(first, &p, quiet, age), want, "first {first} quiet {quiet} age {age:?}");
        }
        let healthy = AppStatus { phase: Some(AppPhase::Healthy), ..p };
        assert_eq!(status_deferral(true, &healthy, true, s(0)), None, "Healthy is written at once");
    }
}
