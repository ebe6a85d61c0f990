//! Replica arithmetic of rollouts: how many replicas the App has in all, how they split
//! between the canary and the stable Deployment, and how far a Deployment has rolled.
//! Pure: no I/O.

use k8s_openapi::api::apps::v1::{Deployment, DeploymentCondition};
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;

use crate::api::App;
use crate::api::names;

/// The message of the Deployment's `ReplicaFailure` condition (for example an exceeded
/// ResourceQuota), when pods cannot be created.
pub fn replica_failure(deployment: Option<&Deployment>) -> Option<String> {
    deployment?
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| is_replica_failure(c))
        .map(|c| c.message.clone().unwrap_or_else(|| c.reason.clone().unwrap_or_default()))
}

/// Whether `c` says that the Deployment cannot create pods.
pub fn is_replica_failure(c: &DeploymentCondition) -> bool {
    c.type_ == "ReplicaFailure" && c.status == "True"
}

/// The replica count the App fixes, or `None` when an autoscaler owns it.
pub fn fixed_replicas(app: &App) -> Option<i32> {
    if app.spec.autoscaling.is_some() { None } else { Some(app.spec.replicas.unwrap_or(1)) }
}

/// Replicas the App runs in all: `spec.replicas`, or with autoscaling the autoscaler's
/// current choice (what it set on the stable Deployment, else its desired count), within its
/// bounds.
pub fn total_replicas(app: &App, stable: Option<&Deployment>, hpa: Option<&HorizontalPodAutoscaler>) -> i32 {
    match &app.spec.autoscaling {
        None => app.spec.replicas.unwrap_or(1).max(0),
        Some(a) => {
            let from_hpa = hpa.and_then(|h| h.status.as_ref()).map(|s| s.desired_replicas).filter(|n| *n > 0);
            let from_deployment = stable.and_then(|d| d.spec.as_ref()).and_then(|s| s.replicas);
            from_hpa
                .or(from_deployment)
                .unwrap_or(a.min_replicas)
                .clamp(a.min_replicas, a.max_replicas.max(a.min_replicas))
        }
    }
}

/// Canary replicas at `weight` percent of `total`: round(weight% x total), at least 1 and,
/// when there are at least two replicas, at most total-1 so that the stable version keeps
/// serving until promotion.
pub fn canary_replicas(weight: i32, total: i32) -> i32 {
    let exact = (i64::from(weight.clamp(0, 100)) * i64::from(total.max(0)) + 50) / 100;
    let upper = (total - 1).max(1);
    i32::try_from(exact).unwrap_or(i32::MAX).clamp(1, upper)
}

/// Canary replicas at `weight` percent of `total` when an HTTPRoute, not the pod count, sets
/// the canary's share: as many as that share of the requests needs, rounded up, at least 1
/// and at most `total` (the stable Deployment keeps all of its own beside them).
pub fn routed_canary_replicas(weight: i32, total: i32) -> i32 {
    let exact = (i64::from(weight.clamp(0, 100)) * i64::from(total.max(0)) + 99) / 100;
    i32::try_from(exact).unwrap_or(i32::MAX).clamp(1, total.max(1))
}

/// Stable replicas while `canary_available` of the `canary_wanted` canary replicas are
/// available: the stable Deployment shrinks only as the canary takes over, and keeps at
/// least one replica.
pub fn stable_replicas(total: i32, canary_wanted: i32, canary_available: i32) -> i32 {
    (total - canary_available.clamp(0, canary_wanted)).max(1)
}

/// How far a Deployment is from running `revision` with `want` replicas, read the way
/// `kubectl rollout status` does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Readiness {
    pub want: i32,
    /// Ready pods of any template.
    pub ready: i32,
    /// Available pods of `revision` (0 when the Deployment runs another).
    pub available: i32,
    /// The controller has seen the latest spec, every replica runs `revision`, all are
    /// available, and no old replica is left.
    pub complete: bool,
}

/// The revision a Deployment of the App runs: its revision annotation, or for one written
/// before revisions existed, its version label (the revision of an App without a template).
pub fn revision_of(d: &Deployment) -> Option<&str> {
    let annotated = d.metadata.annotations.as_ref().and_then(|a| a.get(names::ANNOTATION_REVISION));
    annotated.or_else(|| d.metadata.labels.as_ref()?.get(names::LABEL_VERSION)).map(String::as_str)
}

/// Ready pods of a Deployment, of any template (0 when it is missing).
pub fn ready_replicas(d: Option<&Deployment>) -> i32 {
    d.and_then(|d| d.status.as_ref()).and_then(|s| s.ready_replicas).unwrap_or(0)
}

pub fn readiness(d: Option<&Deployment>, revision: &str, want: i32) -> Readiness {
    let Some(d) = d else {
        return Readiness { want, ..Readiness::default() };
    };
    let status = d.status.clone().unwrap_or_default();
    let seen = match (d.metadata.generation, status.observed_generation) {
        (Some(g), Some(o)) => o >= g,
        _ => false,
    };
    let right = revision_of(d) == Some(revision);
    let spec_replicas = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let ready = ready_replicas(Some(d));
    let available = if right && seen { status.available_replicas.unwrap_or(0).min(spec_replicas) } else { 0 };
    let complete = seen
        && right
        && spec_replicas == want
        && status.updated_replicas.unwrap_or(0) == want
        && status.available_replicas.unwrap_or(0) == want
        && status.replicas.unwrap_or(0) == want;
    Readiness { want, ready, available, complete }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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
    fn table_of_canary_sizes() {
        let cases = [
            (20, 10, 2),
            (25, 10, 3), // 2.5 rounds up
            (21, 10, 2), // 2.1 rounds down: to the nearest, not up
            (50, 4, 2),
            (1, 10, 1),   // at least one
            (100, 10, 9), // stable keeps one until promotion
            (50, 1, 1),   // a single replica: the canary runs beside it
            (10, 2, 1),
            (90, 2, 1),
        ];
        for (weight, total, want) in cases {
            assert_eq!(canary_replicas(weight, total), want, "weight {weight} of {total}");
        }
    }

    #[test]
    fn table_of_routed_canary_sizes() {
        // (weight, total, canary): rounded up, at least one, up to every replica.
        let cases = [(5, 5, 1), (40, 5, 2), (60, 4, 3), (100, 4, 4), (1, 1000, 10), (50, 1, 1), (10, 0, 1)];
        for (weight, total, want) in cases {
            assert_eq!(routed_canary_replicas(weight, total), want, "weight {weight} of {total}");
        }
    }

    #[test]
    fn stable_shrinks_as_the_canary_becomes_available() {
        assert_eq!(stable_replicas(10, 3, 0), 10);
        assert_eq!(stable_replicas(10, 3, 2), 8);
        assert_eq!(stable_replicas(10, 3, 5), 7, "extra canary pods do not count");
        assert_eq!(stable_replicas(1, 1, 1), 1, "stable keeps one replica");
    }

    proptest! {
        #[test]
        fn canary_within_one_and_total_minus_one(weight in 1i32..=100, total in 2i32..=1000) {
            let c = canary_replicas(weight, total);
            prop_assert!(c >= 1 && c < total, "canary {c} of {total}");
            let s = stable_replicas(total, c, c);
            prop_assert_eq!(s + c, total);
        }

        #[test]
        fn capacity_never_drops_below_total(total in 1i32..=200, weight in 1i32..=100, available in 0i32..=200) {
            let c = canary_replicas(weight, total);
            let available = available.min(c);
            prop_assert!(stable_replicas(total, c, available) + available >= total);
        }
    }
}
