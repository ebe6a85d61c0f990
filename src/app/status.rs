//! The status an App should show, from its spec and the Deployment observed. Pure: no I/O.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::jiff::Timestamp;

use super::names;
use crate::api::conditions::{DesiredCondition, merge_conditions};
use crate::api::{App, AppPhase, AppStatus};

/// Type of the condition that says whether an App serves its desired version.
pub const READY: &str = "Ready";

/// A problem that stops the operator from reaching the desired state, shown in status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Blocker {
    /// CamelCase reason, for example `Forbidden`.
    pub reason: String,
    pub message: String,
}

/// How far the observed Deployment is from serving the desired version with all replicas.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Readiness {
    pub desired: i32,
    pub ready: i32,
    pub complete: bool,
}

/// Reads a Deployment's rollout state the way `kubectl rollout status` does: the controller
/// has seen the latest spec, every replica runs the new template, all are available, and no
/// old replica is left.
pub fn readiness(app: &App, deployment: Option<&Deployment>) -> Readiness {
    let Some(d) = deployment else {
        let desired = app.spec.autoscaling.as_ref().map(|a| a.min_replicas).or(app.spec.replicas).unwrap_or(1);
        return Readiness { desired, ready: 0, complete: false };
    };
    let spec_replicas = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let desired = match (&app.spec.autoscaling, app.spec.replicas) {
        // The autoscaler's choice, which is never outside its bounds once it has acted.
        (Some(a), _) => spec_replicas.clamp(a.min_replicas, a.max_replicas.max(a.min_replicas)),
        (None, r) => r.unwrap_or(1),
    };
    let status = d.status.clone().unwrap_or_default();
    let seen = match (d.metadata.generation, status.observed_generation) {
        (Some(g), Some(o)) => o >= g,
        _ => false,
    };
    let image = d
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.containers.iter().find(|c| c.name == names::CONTAINER_NAME))
        .and_then(|c| c.image.clone());
    let right_image = image.as_deref() == Some(names::image_ref(&app.spec.image, &app.spec.version).as_str());
    let ready = status.ready_replicas.unwrap_or(0);
    let complete = seen
        && right_image
        && spec_replicas == desired
        && status.updated_replicas.unwrap_or(0) == desired
        && status.available_replicas.unwrap_or(0) == desired
        && status.replicas.unwrap_or(0) == desired;
    Readiness { desired, ready, complete }
}

/// The message of the Deployment's `ReplicaFailure` condition (for example an exceeded
/// ResourceQuota), when pods cannot be created.
pub fn replica_failure(deployment: Option<&Deployment>) -> Option<String> {
    deployment?
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "ReplicaFailure" && c.status == "True")
        .map(|c| c.message.clone().unwrap_or_else(|| c.reason.clone().unwrap_or_default()))
}

/// The status to write. Equal to the App's current status when nothing changed, so the
/// caller can skip the write.
pub fn desired_status(
    app: &App,
    deployment: Option<&Deployment>,
    blocker: Option<&Blocker>,
    now: Timestamp,
) -> AppStatus {
    let previous = app.status.clone().unwrap_or_default();
    let r = readiness(app, deployment);
    let version = &app.spec.version;
    let (phase, condition) = match (blocker, r.complete) {
        (Some(b), _) => (
            AppPhase::Degraded,
            DesiredCondition { type_: READY, status: false, reason: b.reason.clone(), message: b.message.clone() },
        ),
        (None, true) => (
            AppPhase::Healthy,
            DesiredCondition {
                type_: READY,
                status: true,
                reason: "Available".into(),
                message: format!("version {version} is available with {}/{} replicas ready", r.ready, r.desired),
            },
        ),
        (None, false) if replica_failure(deployment).is_some() => (
            AppPhase::Progressing,
            DesiredCondition {
                type_: READY,
                status: false,
                reason: "ReplicaFailure".into(),
                message: format!(
                    "rolling out version {version}: {}/{} replicas ready; pods cannot be created: {}",
                    r.ready,
                    r.desired,
                    replica_failure(deployment).unwrap_or_default()
                ),
            },
        ),
        (None, false) => (
            AppPhase::Progressing,
            DesiredCondition {
                type_: READY,
                status: false,
                reason: "Progressing".into(),
                message: format!("rolling out version {version}: {}/{} replicas ready", r.ready, r.desired),
            },
        ),
    };
    let observed_generation = app.metadata.generation;
    let current_version =
        if r.complete && blocker.is_none() { Some(version.clone()) } else { previous.current_version.clone() };
    AppStatus {
        observed_generation,
        current_version,
        ready_replicas: Some(r.ready),
        replicas: Some(r.desired),
        ready: Some(format!("{}/{}", r.ready, r.desired)),
        phase: Some(phase),
        conditions: merge_conditions(&previous.conditions, &[condition], observed_generation, now),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::AppSpec;
    use crate::app::desired::{AppIdentity, desired_deployment};
    use k8s_openapi::api::apps::v1::DeploymentStatus;

    fn app() -> App {
        let mut app = App::new(
            "web",
            AppSpec { image: "example.com/web".into(), version: "2".into(), replicas: Some(3), autoscaling: None },
        );
        app.metadata.namespace = Some("ns".into());
        app.metadata.uid = Some("u".into());
        app.metadata.generation = Some(4);
        app
    }

    fn deployment(app: &App, updated: i32, available: i32, total: i32) -> Deployment {
        let id = AppIdentity::of(app).expect("id");
        let mut d = desired_deployment(app, &id);
        d.metadata.generation = Some(2);
        d.status = Some(DeploymentStatus {
            observed_generation: Some(2),
            replicas: Some(total),
            updated_replicas: Some(updated),
            available_replicas: Some(available),
            ready_replicas: Some(available),
            ..DeploymentStatus::default()
        });
        d
    }

    #[test]
    fn phases_from_the_deployment() {
        let a = app();
        let now = Timestamp::from_second(10).expect("ts");
        let cases = [
            ("missing", None, AppPhase::Progressing, None),
            ("surge in progress", Some(deployment(&a, 3, 3, 4)), AppPhase::Progressing, None),
            ("partly available", Some(deployment(&a, 3, 2, 3)), AppPhase::Progressing, None),
            ("complete", Some(deployment(&a, 3, 3, 3)), AppPhase::Healthy, Some("2")),
        ];
        for (name, d, phase, current) in cases {
            let s = desired_status(&a, d.as_ref(), None, now);
            assert_eq!(s.phase, Some(phase), "{name}");
            assert_eq!(s.current_version.as_deref(), current, "{name}");
            assert_eq!(s.observed_generation, Some(4), "{name}");
        }
    }

    #[test]
    fn blocker_degrades_and_keeps_current_version() {
        let mut a = app();
        a.status = Some(AppStatus { current_version: Some("1".into()), ..AppStatus::default() });
        let b = Blocker { reason: "Forbidden".into(), message: "no rights".into() };
        let s = desired_status(&a, None, Some(&b), Timestamp::from_second(1).expect("ts"));
        assert_eq!(s.phase, Some(AppPhase::Degraded));
        assert_eq!(s.current_version.as_deref(), Some("1"));
        assert_eq!(s.conditions[0].reason, "Forbidden");
    }

    #[test]
    fn replica_failure_is_explained() {
        let a = app();
        let mut d = deployment(&a, 2, 2, 2);
        d.status.as_mut().expect("status").conditions = Some(vec![k8s_openapi::api::apps::v1::DeploymentCondition {
            type_: "ReplicaFailure".into(),
            status: "True".into(),
            message: Some("pods \"web-1\" is forbidden: exceeded quota: flotilla-tenant".into()),
            ..Default::default()
        }]);
        let s = desired_status(&a, Some(&d), None, Timestamp::from_second(1).expect("ts"));
        assert_eq!(s.conditions[0].reason, "ReplicaFailure");
        assert!(s.conditions[0].message.contains("exceeded quota"), "{}", s.conditions[0].message);
    }

    #[test]
    fn same_state_gives_same_status() {
        let mut a = app();
        let d = deployment(&a, 3, 3, 3);
        let first = desired_status(&a, Some(&d), None, Timestamp::from_second(1).expect("ts"));
        a.status = Some(first.clone());
        let second = desired_status(&a, Some(&d), None, Timestamp::from_second(99).expect("ts"));
        assert_eq!(first, second);
    }
}
