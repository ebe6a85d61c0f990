//! Status helpers around the rollout planner: what a Deployment's conditions say about
//! failing pods, and the status shown when the operator itself is blocked. Pure: no I/O.

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

pub use crate::rollout::replicas::replica_failure;

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
    use k8s_openapi::api::apps::v1::Deployment;

    #[test]
    fn replica_failure_is_read_from_the_deployment() {
        let mut d = Deployment::default();
        assert_eq!(replica_failure(Some(&d)), None);
        d.status = Some(k8s_openapi::api::apps::v1::DeploymentStatus {
            conditions: Some(vec![k8s_openapi::api::apps::v1::DeploymentCondition {
                type_: "ReplicaFailure".into(),
                status: "True".into(),
                message: Some("pods \"web-1\" is forbidden: exceeded quota: flotilla-tenant".into()),
                ..Default::default()
            }]),
            ..Default::default()
        });
        assert!(replica_failure(Some(&d)).is_some_and(|m| m.contains("exceeded quota")));
    }

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
