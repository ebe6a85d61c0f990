//! What the Deployment cache keeps of each Deployment: what the planner and the drift check
//! read, not the whole object. Pure: no I/O.
//!
//! A Deployment in full held about 6.5 KB in the cache (its maps of labels and annotations,
//! its selector, the pod template with every defaulted field), a third of a replica's memory
//! per App (`bench/heap.sh`). The planner reads the revision, the replica counts, the
//! status's counts and a failure to create pods; the drift check reads the main container's
//! image and port, the pod-security settings and the template's fingerprint. The rest is
//! dropped as the watch delivers it.
//!
//! A projected template is never a record of the pods: its pod template carries
//! `ANNOTATION_PROJECTED`. Whatever would copy it (a stable Deployment whose running pods are
//! kept during a rollout, a stable template recovered from the running Deployment) reads the
//! Deployment in full first (`reconcile`), and a Deployment or status that still carries the
//! marker is never written (`carries_projection`).

use k8s_openapi::api::apps::v1::{Deployment, DeploymentCondition};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, PodSecurityContext, PodSpec, PodTemplateSpec, SeccompProfile,
    SecurityContext,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use crate::api::template::{PodTemplate, main_container};

/// Marks the pod template of a projected Deployment. Not under `flotilla.dev/`, so that a
/// template recovered from it (`template_from_running`, which drops Flotilla's own keys)
/// still carries it.
pub const ANNOTATION_PROJECTED: &str = "cache.flotilla.dev/projected";

/// Keeps of `d` only what the planner and the drift check read (see the module's text).
pub fn project_deployment(d: &mut Deployment) {
    crate::watch_cache::slim(d);
    let meta = std::mem::take(&mut d.metadata);
    let annotations: BTreeMap<String, String> =
        meta.annotations.into_iter().flatten().filter(|(k, _)| k.starts_with("flotilla.dev/")).collect();
    d.metadata = ObjectMeta {
        name: meta.name,
        namespace: meta.namespace,
        uid: meta.uid,
        resource_version: meta.resource_version,
        generation: meta.generation,
        creation_timestamp: meta.creation_timestamp,
        owner_references: meta.owner_references,
        deletion_timestamp: meta.deletion_timestamp,
        annotations: (!annotations.is_empty()).then_some(annotations),
        // The drift check puts back the labels Flotilla sets; `revision_of` may read one.
        labels: meta.labels,
        ..ObjectMeta::default()
    };
    if let Some(spec) = d.spec.as_mut() {
        // Immutable, and never compared.
        spec.selector = LabelSelector::default();
        spec.template = project_template(std::mem::take(&mut spec.template));
    }
    if let Some(status) = d.status.as_mut() {
        status.conditions = status.conditions.take().map(failures_only).filter(|c| !c.is_empty());
    }
}

/// Of a Deployment's conditions, what the planner reads (`replicas::replica_failure`): a
/// failure to create pods, without its times. `Available` and `Progressing`, about 500 bytes
/// of text per Deployment, are read by nothing.
fn failures_only(conditions: Vec<DeploymentCondition>) -> Vec<DeploymentCondition> {
    conditions
        .into_iter()
        .filter(crate::rollout::replicas::is_replica_failure)
        .map(|c| DeploymentCondition {
            type_: c.type_,
            status: c.status,
            reason: c.reason,
            message: c.message,
            ..DeploymentCondition::default()
        })
        .collect()
}

/// `d` projected, as cached (`watch_cache::compact`).
pub fn compact_deployment(mut d: Deployment) -> crate::watch_cache::Compact<Deployment> {
    project_deployment(&mut d);
    crate::watch_cache::Compact::of(d)
}

/// What the drift check reads of the main container. A `Container` is about 1.5 KB before
/// any of its data, so a projection keeps these few fields, as the marker's value, instead.
#[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
struct MainContainer {
    name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    image: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    port: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    allow_privilege_escalation: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    drop: Option<Vec<String>>,
}

/// The fields of a pod template that `desired::deployment_differences` compares, and the marker
/// (whose value holds the main container's, see `expanded`).
fn project_template(template: PodTemplateSpec) -> PodTemplateSpec {
    let mut main = None;
    let spec = template.spec.map(|pod| {
        main = main_container(&pod.containers).and_then(|i| pod.containers.into_iter().nth(i)).map(|c| {
            let sc = c.security_context;
            MainContainer {
                name: c.name,
                image: c.image,
                port: c.ports.into_iter().flatten().next().map(|p| p.container_port),
                allow_privilege_escalation: sc.as_ref().and_then(|s| s.allow_privilege_escalation),
                drop: sc.and_then(|s| s.capabilities).and_then(|c| c.drop),
            }
        });
        PodSpec {
            automount_service_account_token: pod.automount_service_account_token,
            security_context: pod.security_context.map(|s| PodSecurityContext {
                run_as_non_root: s.run_as_non_root,
                seccomp_profile: s.seccomp_profile.map(|p| SeccompProfile { type_: p.type_, localhost_profile: None }),
                ..PodSecurityContext::default()
            }),
            ..PodSpec::default()
        }
    });
    // The template's labels and annotations are compared (those Flotilla sets must be there).
    // The marker's value replaces any a writer of the Deployment put there.
    let meta = template.metadata.unwrap_or_default();
    let mut annotations = meta.annotations.unwrap_or_default();
    let value = main.and_then(|m| serde_json::to_string(&m).ok()).unwrap_or_default();
    annotations.insert(ANNOTATION_PROJECTED.to_string(), value);
    PodTemplateSpec {
        metadata: Some(ObjectMeta { labels: meta.labels, annotations: Some(annotations), ..ObjectMeta::default() }),
        spec,
    }
}

/// A projection with its main container put back from the marker, for the drift check to
/// compare; `None` when `d` is not a projection. Never written (it keeps the marker).
pub fn expanded(d: &Deployment) -> Option<Deployment> {
    let spec = d.spec.as_ref()?;
    let value = spec.template.metadata.as_ref()?.annotations.as_ref()?.get(ANNOTATION_PROJECTED)?;
    let mut out = d.clone();
    let main: Option<MainContainer> = serde_json::from_str(value).ok();
    if let (Some(m), Some(pod)) = (main, out.spec.as_mut().and_then(|s| s.template.spec.as_mut())) {
        let security_context = (m.allow_privilege_escalation.is_some() || m.drop.is_some()).then(|| SecurityContext {
            allow_privilege_escalation: m.allow_privilege_escalation,
            capabilities: m.drop.map(|drop| Capabilities { drop: Some(drop), add: None }),
            ..SecurityContext::default()
        });
        pod.containers = vec![Container {
            name: m.name,
            image: m.image,
            ports: m.port.map(|p| vec![ContainerPort { container_port: p, ..ContainerPort::default() }]),
            security_context,
            ..Container::default()
        }];
    }
    Some(out)
}

/// `d` (read from the apiserver) without a projection's marker, which someone who may edit
/// the Deployment could have put on its pod template.
pub fn unmarked(mut d: Deployment) -> Deployment {
    if let Some(a) = d.spec.as_mut().and_then(|s| s.template.metadata.as_mut()).and_then(|m| m.annotations.as_mut()) {
        a.remove(ANNOTATION_PROJECTED);
    }
    d
}

/// Whether `d` (read from the cache, or rendered from one read there) is a projection.
pub fn is_projected(d: &Deployment) -> bool {
    d.spec.as_ref().is_some_and(|s| annotated(s.template.metadata.as_ref().and_then(|m| m.annotations.as_ref())))
}

/// Whether a template recovered from a Deployment came from a projection.
pub fn template_is_projected(t: &PodTemplate) -> bool {
    annotated(t.metadata.as_ref().and_then(|m| m.annotations.as_ref()))
}

fn annotated(annotations: Option<&BTreeMap<String, String>>) -> bool {
    annotations.is_some_and(|a| a.contains_key(ANNOTATION_PROJECTED))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::names;
    use crate::api::template::template_from_running;
    use crate::app::desired::deployment_differences;
    use crate::rollout::replicas::{readiness, replica_failure, revision_of};
    use k8s_openapi::api::apps::v1::DeploymentStatus;

    /// A Deployment as the apiserver returns one of Flotilla's: defaults filled in, a sidecar,
    /// env, volumes, probes, labels and annotations of others.
    fn full() -> Deployment {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {
                "name": "web", "namespace": "shop", "uid": "u-1", "resourceVersion": "42", "generation": 3,
                "creationTimestamp": "2026-12-01T10:00:00Z",
                "labels": {"app.kubernetes.io/name": "web", "app.kubernetes.io/version": "1.2.0", "team": "a"},
                "annotations": {"flotilla.dev/revision": "1.2.0+abc", "flotilla.dev/template-hash": "abc",
                    "deployment.kubernetes.io/revision": "7", "note": "x".repeat(4096)},
                "ownerReferences": [{"apiVersion": "flotilla.dev/v1beta1", "kind": "App", "name": "web",
                    "uid": "app-uid", "controller": true}],
                "managedFields": [{"manager": "flotilla", "operation": "Apply"}]
            },
            "spec": {
                "replicas": 3,
                "selector": {"matchLabels": {"app.kubernetes.io/name": "web", "flotilla.dev/track": "stable"}},
                "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
                "template": {
                    "metadata": {"labels": {"app.kubernetes.io/name": "web"}, "annotations": {"a": "b"}},
                    "spec": {
                        "automountServiceAccountToken": false,
                        "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}, "fsGroup": 2000},
                        "containers": [
                            {"name": "sidecar", "image": "proxy:1"},
                            {"name": "app", "image": "registry.example.com/web:1.2.0",
                             "ports": [{"containerPort": 8080, "protocol": "TCP"}, {"containerPort": 9090}],
                             "env": [{"name": "K", "value": "V"}],
                             "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}, "runAsUser": 1000},
                             "terminationMessagePath": "/dev/termination-log", "imagePullPolicy": "IfNotPresent"}
                        ],
                        "volumes": [{"name": "v", "emptyDir": {}}],
                        "dnsPolicy": "ClusterFirst", "restartPolicy": "Always", "schedulerName": "default-scheduler"
                    }
                }
            },
            "status": {"observedGeneration": 3, "replicas": 3, "readyReplicas": 3, "availableReplicas": 3,
                "updatedReplicas": 3,
                "conditions": [
                    {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable",
                     "message": "Deployment has minimum availability.",
                     "lastUpdateTime": "2026-12-01T10:00:00Z", "lastTransitionTime": "2026-12-01T10:00:00Z"},
                    {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate",
                     "message": "pods \"web-1\" is forbidden: exceeded quota",
                     "lastUpdateTime": "2026-12-01T10:00:00Z", "lastTransitionTime": "2026-12-01T10:00:00Z"},
                    {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable",
                     "message": "ReplicaSet \"web-abc\" has successfully progressed.",
                     "lastUpdateTime": "2026-12-01T10:00:00Z", "lastTransitionTime": "2026-12-01T10:00:00Z"}]}
        }))
        .expect("a Deployment")
    }

    fn projected() -> Deployment {
        let mut d = full();
        project_deployment(&mut d);
        d
    }

    #[test]
    fn the_planner_reads_the_same_of_a_projection() {
        let (f, p) = (full(), projected());
        assert_eq!(revision_of(&p), revision_of(&f));
        assert_eq!(readiness(Some(&p), "1.2.0+abc", 3), readiness(Some(&f), "1.2.0+abc", 3));
        assert_eq!(replica_failure(Some(&p)), replica_failure(Some(&f)));
        assert!(replica_failure(Some(&p)).is_some_and(|m| m.contains("exceeded quota")));
        let counts = |d: &Deployment| d.status.clone().map(|s| DeploymentStatus { conditions: None, ..s });
        assert_eq!(counts(&p), counts(&f));
        let kept = p
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .map(|c| c.iter().map(|c| c.type_.as_str()).collect::<Vec<_>>());
        assert_eq!(kept, Some(vec!["ReplicaFailure"]), "Available and Progressing are read by nothing");
        let mut healthy = full();
        if let Some(c) = healthy.status.as_mut().and_then(|s| s.conditions.as_mut()) {
            c.retain(|c| c.type_ != "ReplicaFailure");
        }
        project_deployment(&mut healthy);
        assert_eq!(healthy.status.and_then(|s| s.conditions), None, "no condition left, no list");
        assert_eq!(p.spec.as_ref().and_then(|s| s.replicas), Some(3));
        assert_eq!(p.metadata.owner_references, f.metadata.owner_references);
        assert_eq!(p.metadata.creation_timestamp, f.metadata.creation_timestamp, "the stable Deployment's age");
        assert_eq!((p.metadata.generation, p.metadata.resource_version.as_deref()), (Some(3), Some("42")));
    }

    #[test]
    fn the_drift_check_finds_no_difference_between_a_deployment_and_its_projection() {
        let (f, p) = (full(), projected());
        assert_eq!(deployment_differences(&f, Some(&p)), vec![]);
        // And a drift of each compared field still shows through the projection.
        fn spec(d: &mut Deployment) -> &mut k8s_openapi::api::apps::v1::DeploymentSpec {
            d.spec.as_mut().expect("spec")
        }
        fn pod(d: &mut Deployment) -> &mut PodSpec {
            spec(d).template.spec.as_mut().expect("pod spec")
        }
        fn template_meta(d: &mut Deployment) -> &mut ObjectMeta {
            spec(d).template.metadata.as_mut().expect("template metadata")
        }
        type Edit = fn(&mut Deployment);
        let edits: [(&str, Edit); 12] = [
            ("image", |d| pod(d).containers[1].image = Some("evil:1".into())),
            ("ports", |d| pod(d).containers[1].ports = None),
            ("automountServiceAccountToken", |d| pod(d).automount_service_account_token = Some(true)),
            ("pod securityContext", |d| pod(d).security_context = None),
            ("container securityContext", |d| pod(d).containers[1].security_context = None),
            ("replicas", |d| spec(d).replicas = Some(1)),
            ("paused", |d| spec(d).paused = Some(true)),
            ("strategy", |d| spec(d).strategy = None),
            ("labels", |d| d.metadata.labels = None),
            ("template labels", |d| template_meta(d).labels = None),
            ("template annotations", |d| template_meta(d).annotations = None),
            ("template hash", |d| {
                d.metadata.annotations.as_mut().expect("annotations").remove(names::ANNOTATION_TEMPLATE_HASH);
            }),
        ];
        for (what, edit) in edits {
            let mut d = full();
            edit(&mut d);
            project_deployment(&mut d);
            assert!(!deployment_differences(&f, Some(&d)).is_empty(), "a drift of {what} is not seen");
        }
    }

    #[test]
    fn a_deployment_rendered_from_a_projection_shows_no_difference_from_it() {
        // The stable Deployment rendered with its running pods kept copies the projection's
        // template: nothing differs, so no write (and no read in full) follows.
        let p = projected();
        assert_eq!(deployment_differences(&p, Some(&p)), vec![]);
        let mut scaled = projected();
        scaled.spec.as_mut().expect("spec").replicas = Some(1);
        let diffs = deployment_differences(&scaled, Some(&p));
        assert_eq!(diffs.iter().map(|d| d.field).collect::<Vec<_>>(), vec!["spec.replicas"]);
    }

    #[test]
    fn a_projection_reads_back_from_the_cache_as_it_was_made() {
        use crate::watch_cache::Compact;
        let p = projected();
        let cached = Compact::<Deployment>::of(p.clone());
        assert_eq!(compact_deployment(full()).parse().expect("parses"), p);
        let read = cached.parse().expect("parses");
        assert_eq!(read, p);
        assert_eq!(deployment_differences(&full(), Some(&read)), vec![]);
    }

    #[test]
    fn a_projection_is_small_and_marked() {
        let (f, p) = (full(), projected());
        let size = |d: &Deployment| serde_json::to_string(d).map(|s| s.len()).unwrap_or(0);
        assert!(size(&p) * 4 < size(&f), "projection {} bytes of {}", size(&p), size(&f));
        assert!(is_projected(&p) && !is_projected(&f));
        let pod = p.spec.as_ref().and_then(|s| s.template.spec.as_ref()).expect("pod spec");
        assert!(pod.containers.is_empty() && pod.volumes.is_none(), "no container is kept as one");
        let again = expanded(&p).expect("a projection");
        let pod = again.spec.as_ref().and_then(|s| s.template.spec.as_ref()).expect("pod spec");
        assert_eq!(pod.containers.len(), 1, "the main container, for the drift check");
        assert_eq!(pod.containers[0].image.as_deref(), Some("registry.example.com/web:1.2.0"));
        assert!(pod.containers[0].env.is_none());
        assert!(expanded(&f).is_none());
    }

    #[test]
    fn a_forged_marker_is_dropped_from_a_deployment_read_in_full() {
        let mut forged = full();
        let template = forged.spec.as_mut().and_then(|s| s.template.metadata.as_mut()).expect("template metadata");
        template.annotations.get_or_insert_default().insert(ANNOTATION_PROJECTED.into(), "true".into());
        assert!(is_projected(&forged));
        let read = unmarked(forged);
        assert!(!is_projected(&read));
        assert!(!template_from_running(&read).is_some_and(|t| template_is_projected(&t)));
        assert_eq!(unmarked(full()), full(), "nothing else changes");
    }

    #[test]
    fn a_template_recovered_from_a_projection_says_so() {
        let recovered = template_from_running(&projected()).expect("template");
        assert!(template_is_projected(&recovered));
        assert!(!template_from_running(&full()).is_some_and(|t| template_is_projected(&t)));
    }
}
