//! Status helpers around the rollout planner: the status shown when the operator itself is
//! blocked. Pure: no I/O.

use k8s_openapi::jiff::Timestamp;

use crate::api::conditions::{DesiredCondition, PROGRESSING, READY, merge_conditions};
use crate::api::{AppPhase, AppStatus};

/// A problem that stops the operator from reaching the desired state, shown in status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Blocker {
    /// CamelCase reason, for example `Forbidden`.
    pub reason: String,
    pub message: String,
}

/// The planned status, overridden because the plan could not be applied: phase Degraded,
/// with the blocker as the reason of both conditions.
pub fn degraded(planned: &AppStatus, previous: &AppStatus, blocker: &Blocker, now: Timestamp) -> AppStatus {
    let conditions = [READY, PROGRESSING].map(|type_| DesiredCondition {
        type_,
        status: false,
        reason: blocker.reason.clone(),
        message: blocker.message.clone(),
    });
    AppStatus {
        phase: Some(AppPhase::Degraded),
        conditions: merge_conditions(&previous.conditions, &conditions, planned.observed_generation, now),
        ..planned.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocker_degrades_and_keeps_the_rollout_state() {
        let planned = AppStatus {
            current_version: Some("1".into()),
            target_version: Some("2".into()),
            phase: Some(AppPhase::Progressing),
            ..AppStatus::default()
        };
        let b = Blocker { reason: "Forbidden".into(), message: "no rights".into() };
        let s = degraded(&planned, &AppStatus::default(), &b, Timestamp::from_second(1).expect("ts"));
        assert_eq!(s.phase, Some(AppPhase::Degraded));
        assert_eq!(s.current_version.as_deref(), Some("1"));
        assert_eq!(s.target_version.as_deref(), Some("2"));
        assert!(s.conditions.iter().all(|c| c.reason == "Forbidden" && c.status == "False"));
    }
}
