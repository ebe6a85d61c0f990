//! Whether a namespace's ResourceQuotas can hold more pods: checked before a blue-green
//! rollout creates its preview (a second full copy of the App), so that a quota too small
//! for two copies makes the rollout wait with the quota named, instead of creating part of
//! the copy and failing at the progress deadline.

use k8s_openapi::api::core::v1::{PodSpec, ResourceQuota};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, ListParams};
use kube_quantity::ParsedQuantity;
use std::collections::BTreeMap;

/// The resources a quota may bound that a pod's template says how much of: the pod count,
/// and the requests and limits of CPU and memory (`cpu` and `memory` are the requests).
const CHECKED: [&str; 7] = ["pods", "requests.cpu", "cpu", "requests.memory", "memory", "limits.cpu", "limits.memory"];

fn amount(q: &Quantity) -> Option<f64> {
    ParsedQuantity::try_from(q).ok()?.to_bytes_f64()
}

/// What one pod of `pod` counts against `resource`: the containers' sum, or the largest init
/// container's when that is more (as the scheduler counts). A request left unset counts as
/// its limit; one with neither counts as 0 (a LimitRange default is not known here).
fn per_pod(pod: &PodSpec, resource: &str) -> f64 {
    if resource == "pods" {
        return 1.0;
    }
    let (kind, name) = match resource {
        "cpu" | "memory" => ("requests", resource),
        other => other.split_once('.').unwrap_or(("requests", other)),
    };
    let of = |c: &k8s_openapi::api::core::v1::Container| {
        let r = c.resources.as_ref();
        let get = |m: Option<&BTreeMap<String, Quantity>>| m.and_then(|m| m.get(name)).and_then(amount);
        let limit = get(r.and_then(|r| r.limits.as_ref()));
        match kind {
            "limits" => limit,
            _ => get(r.and_then(|r| r.requests.as_ref())).or(limit),
        }
        .unwrap_or(0.0)
    };
    let sum: f64 = pod.containers.iter().map(of).sum();
    let init = pod.init_containers.iter().flatten().map(of).fold(0.0, f64::max);
    sum.max(init)
}

/// Why `quotas` cannot hold `pods` more pods of `pod`, naming the quota, the resource and the
/// figures; `None` when they can. Quotas with scopes (which may not apply to these pods) are
/// not judged.
pub fn shortfall(quotas: &[ResourceQuota], pod: &PodSpec, pods: i32) -> Option<String> {
    let count = f64::from(pods.max(0));
    for quota in quotas {
        let scoped = quota
            .spec
            .as_ref()
            .is_some_and(|s| s.scopes.as_ref().is_some_and(|v| !v.is_empty()) || s.scope_selector.is_some());
        let Some(status) = quota.status.as_ref().filter(|_| !scoped) else {
            continue;
        };
        let name = quota.metadata.name.as_deref().unwrap_or_default();
        for resource in CHECKED {
            let Some(hard) = status.hard.as_ref().and_then(|h| h.get(resource)).and_then(amount) else {
                continue;
            };
            let used = status.used.as_ref().and_then(|u| u.get(resource)).and_then(amount).unwrap_or(0.0);
            let need = per_pod(pod, resource) * count;
            if need > 0.0 && used + need > hard * (1.0 + 1e-9) {
                let shown =
                    |q: &str| status.hard.as_ref().and_then(|h| h.get(q)).map(|q| q.0.clone()).unwrap_or_default();
                return Some(format!(
                    "ResourceQuota {name} allows {resource} {} with {} used; {pods} more pods need {}",
                    shown(resource),
                    status
                        .used
                        .as_ref()
                        .and_then(|u| u.get(resource))
                        .map(|q| q.0.clone())
                        .unwrap_or_else(|| "0".into()),
                    trim(need)
                ));
            }
        }
    }
    None
}

fn trim(v: f64) -> String {
    let text = format!("{v:.3}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// The pods a blue-green rollout adds beside the running version's `replicas`: the preview's
/// copy, and then, when the stable Deployment rolls to the new version at promotion, the
/// surge pod its rolling update needs when it may take none away (the Deployment's default
/// 25% unavailable rounds down to 0 below 4 replicas, while 25% surge rounds up to 1).
pub fn pods_for_preview(replicas: i32) -> i32 {
    let replicas = replicas.max(0);
    replicas + i32::from(replicas > 0 && replicas < 4)
}

/// The ResourceQuotas of `namespace`.
pub async fn list(client: &kube::Client, namespace: &str) -> Result<Vec<ResourceQuota>, kube::Error> {
    let api: Api<ResourceQuota> = Api::namespaced(client.clone(), namespace);
    Ok(api.list(&ListParams::default()).await?.items)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn quota(hard: serde_json::Value, used: serde_json::Value) -> ResourceQuota {
        serde_json::from_value(
            json!({"metadata": {"name": "team"}, "spec": {"hard": hard}, "status": {"hard": hard, "used": used}}),
        )
        .expect("quota")
    }

    fn pod(requests: serde_json::Value) -> PodSpec {
        serde_json::from_value(
            json!({"containers": [{"name": "app", "resources": {"requests": requests}}, {"name": "side"}]}),
        )
        .expect("pod")
    }

    #[test]
    fn a_quota_that_cannot_hold_the_copy_is_named_with_its_figures() {
        let q = quota(json!({"pods": "6"}), json!({"pods": "4"}));
        let why = shortfall(std::slice::from_ref(&q), &pod(json!({})), 4).expect("6 pods cannot hold 4 more beside 4");
        assert_eq!(why, "ResourceQuota team allows pods 6 with 4 used; 4 more pods need 4");
        assert!(shortfall(&[q], &pod(json!({})), 2).is_none(), "2 more fit");

        let cpu = quota(json!({"requests.cpu": "2"}), json!({"requests.cpu": "1500m"}));
        let why = shortfall(std::slice::from_ref(&cpu), &pod(json!({"cpu": "250m"})), 4)
            .expect("1 core more does not fit in 0.5");
        assert!(why.contains("requests.cpu 2 with 1500m used; 4 more pods need 1"), "{why}");
        assert!(shortfall(&[cpu], &pod(json!({"cpu": "250m"})), 2).is_none());

        let mem = quota(json!({"memory": "1Gi"}), json!({"memory": "512Mi"}));
        assert!(
            shortfall(std::slice::from_ref(&mem), &pod(json!({"memory": "256Mi"})), 2).is_none(),
            "exactly full fits"
        );
        assert!(shortfall(&[mem], &pod(json!({"memory": "256Mi"})), 3).is_some());
    }

    #[test]
    fn a_small_app_also_needs_room_for_the_surge_of_its_promotion() {
        assert_eq!([0, 1, 2, 3, 4, 10].map(pods_for_preview), [0, 2, 3, 4, 4, 10]);
    }

    #[test]
    fn unset_requests_count_as_limits_and_init_containers_as_their_largest() {
        let p: PodSpec = serde_json::from_value(json!({
            "initContainers": [{"name": "migrate", "resources": {"requests": {"cpu": "2"}}}],
            "containers": [{"name": "app", "resources": {"limits": {"cpu": "500m"}}}],
        }))
        .expect("pod");
        assert_eq!(per_pod(&p, "requests.cpu"), 2.0);
        assert_eq!(per_pod(&p, "limits.cpu"), 0.5);
        assert_eq!(per_pod(&p, "memory"), 0.0);
    }

    #[test]
    fn scoped_quotas_and_unbounded_resources_are_not_judged() {
        let mut scoped = quota(json!({"pods": "1"}), json!({"pods": "1"}));
        if let Some(spec) = scoped.spec.as_mut() {
            spec.scopes = Some(vec!["BestEffort".into()]);
        }
        assert!(shortfall(&[scoped], &pod(json!({})), 4).is_none());
        let other = quota(json!({"services": "1"}), json!({"services": "1"}));
        assert!(shortfall(&[other], &pod(json!({})), 4).is_none());
    }
}
