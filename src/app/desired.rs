//! The objects an App should have, and how observed objects differ from them. Pure: no I/O.

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment};
use k8s_openapi::api::autoscaling::v2::{
    CrossVersionObjectReference, HorizontalPodAutoscaler, HorizontalPodAutoscalerSpec, MetricSpec, MetricTarget,
    ResourceMetricSource,
};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, PodSecurityContext, PodTemplateSpec, SeccompProfile, SecurityContext,
    Service, ServicePort, ServiceSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use std::collections::BTreeMap;

use crate::api::names::{self, Track};
use crate::api::template::{PodTemplate, main_container, version_of};
use crate::api::{App, Strategy};
use crate::rollout::replicas::revision_of;
pub use crate::rollout::workload::{DeploymentShape, Workload};

/// Default target of the autoscaler when the App names none.
pub const DEFAULT_TARGET_CPU_PERCENT: i32 = 80;

/// Everything the planner needs to know about an App, already validated.
#[derive(Clone, Debug, PartialEq)]
pub struct AppIdentity {
    pub name: String,
    pub namespace: String,
    pub owner: OwnerReference,
}

impl AppIdentity {
    /// `None` when the App lacks a name, namespace or uid (it has not been stored yet).
    pub fn of(app: &App) -> Option<Self> {
        let name = app.metadata.name.clone()?;
        let namespace = app.metadata.namespace.clone()?;
        let uid = app.metadata.uid.clone()?;
        let owner = OwnerReference {
            api_version: <App as kube::Resource>::api_version(&()).into_owned(),
            kind: "App".into(),
            name: name.clone(),
            uid,
            controller: Some(true),
            block_owner_deletion: Some(true),
        };
        Some(Self { name, namespace, owner })
    }

    fn meta(&self, name: String, labels: BTreeMap<String, String>) -> ObjectMeta {
        ObjectMeta {
            name: Some(name),
            namespace: Some(self.namespace.clone()),
            labels: Some(labels),
            owner_references: Some(vec![self.owner.clone()]),
            ..ObjectMeta::default()
        }
    }
}

/// The Deployment a plan's `workload` asks for, beside the `observed` one: rendered from the
/// spec (keeping the running pods' template when the shape says so and the observed
/// Deployment runs that revision), or the observed one as it is. `None`: nothing to have.
pub fn render(app: &App, id: &AppIdentity, workload: &Workload, observed: Option<&Deployment>) -> Option<Deployment> {
    let shape = match workload {
        Workload::AsObserved => return observed.cloned(),
        Workload::Shape(shape) => shape,
    };
    let mut d = deployment(app, id, shape);
    if shape.keep_running_pods
        && let Some(observed) = observed
        && revision_of(observed) == Some(shape.version.as_str())
        && let (Some(spec), Some(have)) = (d.spec.as_mut(), observed.spec.as_ref())
    {
        spec.template = have.template.clone();
        // With the template, its fingerprint: the one the observed pods were made from.
        // The revision annotation stays (it is the version): without it the Deployment
        // would no longer read as the stable revision and be re-rendered at the next look.
        let kept = observed.metadata.annotations.as_ref().and_then(|a| a.get(names::ANNOTATION_TEMPLATE_HASH));
        let annotations = d.metadata.annotations.get_or_insert_with(BTreeMap::new);
        match kept {
            Some(h) => annotations.insert(names::ANNOTATION_TEMPLATE_HASH.to_string(), h.clone()),
            None => annotations.remove(names::ANNOTATION_TEMPLATE_HASH),
        };
    }
    Some(d)
}

/// A Deployment of the App: the image at `shape.version`, the pod settings of the spec, and
/// (for the stable track) the rolling-update bounds.
pub fn deployment(app: &App, id: &AppIdentity, shape: &DeploymentShape) -> Deployment {
    let spec = &app.spec;
    let version = version_of(&shape.version);
    let labels = names::labels(&id.name, version, shape.track);
    let strategy = match (spec.strategy(), shape.track) {
        (Some(Strategy { rolling: Some(r), .. }), Track::Stable) => Some(DeploymentStrategy {
            type_: Some("RollingUpdate".into()),
            rolling_update: Some(RollingUpdateDeployment {
                max_surge: r.max_surge.clone(),
                max_unavailable: r.max_unavailable.clone(),
            }),
        }),
        _ => None,
    };
    let template = pod_template(app, shape.template.as_ref(), version, labels.clone());
    let mut metadata = id.meta(names::deployment_name(&id.name, shape.track), labels);
    metadata.annotations = Some(BTreeMap::from([
        (names::ANNOTATION_TEMPLATE_HASH.to_string(), template_hash(&template)),
        (names::ANNOTATION_REVISION.to_string(), shape.version.clone()),
    ]));
    Deployment {
        metadata,
        spec: Some(DeploymentSpec {
            replicas: shape.replicas,
            selector: LabelSelector {
                match_labels: Some(names::selector(&id.name, shape.track)),
                ..LabelSelector::default()
            },
            strategy,
            min_ready_seconds: spec.min_ready_seconds,
            progress_deadline_seconds: spec.rollout.progress_deadline_seconds(),
            paused: shape.paused.then_some(true),
            template,
            ..DeploymentSpec::default()
        }),
        status: None,
    }
}

/// The pods of one of the App's Deployments: `template` (the App's, or the stable revision's) with Flotilla's
/// labels, the main container running the image at `version` with its `http` port, and the
/// Pod Security `restricted` settings wherever the template leaves them unset.
pub fn pod_template(
    app: &App,
    template: Option<&PodTemplate>,
    version: &str,
    labels: BTreeMap<String, String>,
) -> PodTemplateSpec {
    let spec = &app.spec;
    let meta = template.and_then(|t| t.metadata.as_ref());
    let mut pod_labels = meta.and_then(|m| m.labels.clone()).unwrap_or_default();
    pod_labels.extend(labels);
    let mut annotations = meta.and_then(|m| m.annotations.clone()).unwrap_or_default();
    annotations.extend(spec.pod_annotations.clone().unwrap_or_default());
    let mut pod = template.and_then(|t| t.spec.clone()).unwrap_or_default();
    let main = match main_container(&pod.containers) {
        Some(i) => i,
        None => {
            pod.containers.insert(0, Container { name: names::CONTAINER_NAME.into(), ..Container::default() });
            0
        }
    };
    let port = spec.port.unwrap_or(names::DEFAULT_APP_PORT);
    if let Some(c) = pod.containers.get_mut(main) {
        c.image = Some(names::image_ref(&spec.image, version));
        let http = ContainerPort { name: Some("http".into()), container_port: port, ..ContainerPort::default() };
        let others = c
            .ports
            .take()
            .into_iter()
            .flatten()
            .filter(|p| p.name.as_deref() != Some("http") && p.container_port != port);
        c.ports = Some(std::iter::once(http).chain(others).collect());
    }
    let root_asked = pod.security_context.as_ref().and_then(|s| s.run_as_user) == Some(0)
        || pod
            .containers
            .iter()
            .chain(pod.init_containers.iter().flatten())
            .any(|c| c.security_context.as_ref().and_then(|s| s.run_as_user) == Some(0));
    let pod_sc = pod.security_context.get_or_insert_with(PodSecurityContext::default);
    if pod_sc.run_as_non_root.is_none() && !root_asked {
        pod_sc.run_as_non_root = Some(true);
    }
    if pod_sc.seccomp_profile.is_none() {
        pod_sc.seccomp_profile = pod_security_context().seccomp_profile;
    }
    for c in pod.containers.iter_mut().chain(pod.init_containers.iter_mut().flatten()) {
        harden(c);
    }
    pod.automount_service_account_token = pod.automount_service_account_token.or(Some(false));
    PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(pod_labels),
            annotations: (!annotations.is_empty()).then_some(annotations),
            ..ObjectMeta::default()
        }),
        spec: Some(pod),
    }
}

/// Fills in the `restricted` settings a container leaves unset: no privilege escalation
/// (unless it asks for privileges, where the apiserver refuses that combination) and every
/// capability dropped (capabilities it adds are kept).
fn harden(c: &mut Container) {
    let sc = c.security_context.get_or_insert_with(SecurityContext::default);
    let needs_escalation = sc.privileged == Some(true)
        || sc
            .capabilities
            .as_ref()
            .and_then(|caps| caps.add.as_ref())
            .is_some_and(|add| add.iter().any(|a| a == "SYS_ADMIN" || a == "CAP_SYS_ADMIN"));
    if sc.allow_privilege_escalation.is_none() && !needs_escalation {
        sc.allow_privilege_escalation = Some(false);
    }
    let caps = sc.capabilities.get_or_insert_with(Capabilities::default);
    if caps.drop.is_none() {
        caps.drop = Some(vec!["ALL".into()]);
    }
}

/// A short fingerprint of a pod template, kept on the Deployment: a change of the App's
/// template shows as a different fingerprint (the apiserver's defaults make the template
/// itself uncomparable).
pub fn template_hash(template: &PodTemplateSpec) -> String {
    crate::api::fingerprint::hex_fingerprint(&serde_json::to_vec(template).unwrap_or_default())
}

/// Pod-level settings that, with [`container_security_context`], pass the Pod Security
/// `restricted` profile: no root user, the container runtime's default seccomp profile. The
/// image must run as a non-root user (a numeric `USER` other than 0), or the kubelet refuses to
/// start it. The apiserver defaults none of these fields, so they compare as written.
pub fn pod_security_context() -> PodSecurityContext {
    PodSecurityContext {
        run_as_non_root: Some(true),
        seccomp_profile: Some(SeccompProfile { type_: "RuntimeDefault".into(), localhost_profile: None }),
        ..PodSecurityContext::default()
    }
}

/// Container-level settings for `restricted`: no privilege escalation, every capability dropped.
pub fn container_security_context() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities { drop: Some(vec!["ALL".into()]), add: None }),
        ..SecurityContext::default()
    }
}

/// The App's Service: in front of both tracks (it splits traffic by replica count), or of one
/// track while a blue-green rollout decides which version serves.
pub fn desired_service(app: &App, id: &AppIdentity, track: Option<Track>) -> Service {
    service(app, id, names::service_name(&id.name), track)
}

/// The preview Service of a blue-green rollout, in front of the new version only.
pub fn desired_preview_service(app: &App, id: &AppIdentity) -> Service {
    service(app, id, names::preview_service_name(&id.name), Some(Track::Canary))
}

/// The Service in front of a routed canary's pods only: the HTTPRoute's second backend.
pub fn desired_canary_service(app: &App, id: &AppIdentity) -> Service {
    service(app, id, names::canary_service_name(&id.name), Some(Track::Canary))
}

fn service(app: &App, id: &AppIdentity, name: String, track: Option<Track>) -> Service {
    let port = app.spec.port.unwrap_or(names::DEFAULT_APP_PORT);
    Service {
        metadata: id.meta(name, names::service_selector(&id.name)),
        spec: Some(ServiceSpec {
            selector: Some(names::track_selector(&id.name, track)),
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                port: names::SERVICE_PORT,
                target_port: Some(IntOrString::Int(port)),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

/// The HorizontalPodAutoscaler, when the App asks for autoscaling.
pub fn desired_hpa(app: &App, id: &AppIdentity) -> Option<HorizontalPodAutoscaler> {
    let auto = app.spec.autoscaling.as_ref()?;
    let target = auto.target_cpu_utilization_percentage.unwrap_or(DEFAULT_TARGET_CPU_PERCENT);
    Some(HorizontalPodAutoscaler {
        metadata: id.meta(names::hpa_name(&id.name), names::labels(&id.name, &app.spec.version, Track::Stable)),
        spec: HorizontalPodAutoscalerSpec {
            scale_target_ref: CrossVersionObjectReference {
                api_version: Some("apps/v1".into()),
                kind: "Deployment".into(),
                name: names::stable_deployment_name(&id.name),
            },
            min_replicas: Some(auto.min_replicas),
            max_replicas: auto.max_replicas,
            metrics: Some(vec![MetricSpec {
                type_: "Resource".into(),
                resource: Some(ResourceMetricSource {
                    name: "cpu".into(),
                    target: MetricTarget {
                        type_: "Utilization".into(),
                        average_utilization: Some(target),
                        ..MetricTarget::default()
                    },
                }),
                ..MetricSpec::default()
            }]),
            behavior: None,
        },
        status: None,
    })
}

/// One field of a managed object that differs from what the App asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Difference {
    pub field: &'static str,
    pub observed: String,
    pub desired: String,
}

impl std::fmt::Display for Difference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} was {}, want {}", self.field, self.observed, self.desired)
    }
}

fn show<T: std::fmt::Debug>(v: Option<T>) -> String {
    match v {
        Some(v) => format!("{v:?}").trim_matches('"').to_string(),
        None => "unset".into(),
    }
}

fn diff<T: PartialEq + std::fmt::Debug>(
    out: &mut Vec<Difference>,
    field: &'static str,
    observed: Option<T>,
    desired: Option<T>,
) {
    if observed != desired {
        out.push(Difference { field, observed: show(observed), desired: show(desired) });
    }
}

/// Whether `observed` carries every label of `desired` with the same value.
fn labels_cover(observed: Option<&BTreeMap<String, String>>, desired: Option<&BTreeMap<String, String>>) -> bool {
    let Some(desired) = desired else { return true };
    let Some(observed) = observed else {
        return desired.is_empty();
    };
    desired.iter().all(|(k, v)| observed.get(k) == Some(v))
}

/// Whether `owner` is the controller of the object with `meta` (its ownerReference, by uid).
pub(crate) fn owned_by(meta: &ObjectMeta, owner: &OwnerReference) -> bool {
    meta.owner_references.iter().flatten().any(|o| o.uid == owner.uid && o.controller == Some(true))
}

/// The fields the operator owns on the Deployment that differ from `desired`; empty when
/// nothing needs to be applied. Fields owned by others (extra labels, other containers,
/// resources set by a policy engine) are not compared.
pub fn deployment_differences(desired: &Deployment, observed: Option<&Deployment>) -> Vec<Difference> {
    let mut out = Vec::new();
    let Some(observed) = observed else {
        out.push(Difference { field: "deployment", observed: "missing".into(), desired: "present".into() });
        return out;
    };
    // A projection from the cache keeps its main container apart (`projection`); so does a
    // Deployment rendered by copying one's template (the running pods kept).
    let expanded = crate::app::projection::expanded(observed);
    let observed = expanded.as_ref().unwrap_or(observed);
    let expanded_desired = crate::app::projection::expanded(desired);
    let desired = expanded_desired.as_ref().unwrap_or(desired);
    let (Some(want), Some(have)) = (desired.spec.as_ref(), observed.spec.as_ref()) else {
        out.push(Difference { field: "spec", observed: "unset".into(), desired: "set".into() });
        return out;
    };
    if want.replicas.is_some() {
        diff(&mut out, "spec.replicas", have.replicas, want.replicas);
    }
    let image = |d: &DeploymentSpec| {
        d.template.spec.as_ref().and_then(|p| main_container(&p.containers).and_then(|i| p.containers[i].image.clone()))
    };
    diff(&mut out, "spec.template.spec.containers[app].image", image(have), image(want));
    let port = |d: &DeploymentSpec| {
        d.template.spec.as_ref().and_then(|p| {
            main_container(&p.containers)
                .and_then(|i| p.containers[i].ports.as_ref()?.first().map(|p| p.container_port))
        })
    };
    diff(&mut out, "spec.template.spec.containers[app].ports", port(have), port(want));
    // What makes the pods pass Pod Security `restricted` is kept too (a Deployment created by an
    // earlier release gets it at the next reconcile).
    // Only the fields set here are compared: a mutating webhook that adds others (runAsUser,
    // fsGroup) must not cause a loop of re-applies.
    let hardening = |d: &DeploymentSpec| {
        d.template.spec.as_ref().map(|p| {
            let pod = p.security_context.as_ref();
            let container = main_container(&p.containers).map(|i| &p.containers[i]);
            let sc = container.and_then(|c| c.security_context.as_ref());
            (
                pod.and_then(|s| s.run_as_non_root),
                pod.and_then(|s| s.seccomp_profile.as_ref()).map(|s| s.type_.clone()),
                p.automount_service_account_token,
                sc.and_then(|s| s.allow_privilege_escalation),
                // The apiserver drops an empty list: `drop: []` reads back as unset.
                sc.and_then(|s| s.capabilities.as_ref()).and_then(|c| c.drop.clone()).filter(|d| !d.is_empty()),
            )
        })
    };
    if hardening(have) != hardening(want) {
        out.push(Difference {
            field: "spec.template.spec.securityContext",
            observed: "changed".into(),
            desired: "restricted".into(),
        });
    }
    // The template's fingerprint stands for the template; the planner reads a Deployment's
    // revision from its annotation, so one removed by hand is put back.
    for (field, key) in [
        ("spec.template", names::ANNOTATION_TEMPLATE_HASH),
        ("metadata.annotations[flotilla.dev/revision]", names::ANNOTATION_REVISION),
    ] {
        let value = |m: &ObjectMeta| m.annotations.as_ref().and_then(|a| a.get(key).cloned());
        if value(&desired.metadata).is_some() {
            diff(&mut out, field, value(&observed.metadata), value(&desired.metadata));
        }
    }
    diff(&mut out, "spec.paused", have.paused.unwrap_or(false).then_some(true), want.paused);
    if want.min_ready_seconds.is_some() || have.min_ready_seconds.unwrap_or(0) != 0 {
        diff(&mut out, "spec.minReadySeconds", have.min_ready_seconds.or(Some(0)), want.min_ready_seconds.or(Some(0)));
    }
    if want.progress_deadline_seconds.is_some() {
        diff(&mut out, "spec.progressDeadlineSeconds", have.progress_deadline_seconds, want.progress_deadline_seconds);
    }
    if let Some(want_rolling) = want.strategy.as_ref().and_then(|s| s.rolling_update.as_ref()) {
        let have_rolling = have.strategy.as_ref().and_then(|s| s.rolling_update.as_ref());
        if want_rolling.max_surge.is_some() {
            diff(
                &mut out,
                "spec.strategy.rollingUpdate.maxSurge",
                have_rolling.and_then(|r| r.max_surge.as_ref()),
                want_rolling.max_surge.as_ref(),
            );
        }
        if want_rolling.max_unavailable.is_some() {
            diff(
                &mut out,
                "spec.strategy.rollingUpdate.maxUnavailable",
                have_rolling.and_then(|r| r.max_unavailable.as_ref()),
                want_rolling.max_unavailable.as_ref(),
            );
        }
    }
    let annotations = |d: &DeploymentSpec| d.template.metadata.as_ref().and_then(|m| m.annotations.clone());
    if !labels_cover(annotations(have).as_ref(), annotations(want).as_ref()) {
        out.push(Difference {
            field: "spec.template.metadata.annotations",
            observed: "changed".into(),
            desired: "restored".into(),
        });
    }
    if !labels_cover(observed.metadata.labels.as_ref(), desired.metadata.labels.as_ref()) {
        out.push(Difference { field: "metadata.labels", observed: "changed".into(), desired: "restored".into() });
    }
    let tmpl_labels = |d: &DeploymentSpec| d.template.metadata.as_ref().and_then(|m| m.labels.clone());
    if !labels_cover(tmpl_labels(have).as_ref(), tmpl_labels(want).as_ref()) {
        out.push(Difference {
            field: "spec.template.metadata.labels",
            observed: "changed".into(),
            desired: "restored".into(),
        });
    }
    if let Some(owner) = desired.metadata.owner_references.iter().flatten().next()
        && !owned_by(&observed.metadata, owner)
    {
        out.push(Difference { field: "metadata.ownerReferences", observed: "missing".into(), desired: "App".into() });
    }
    out
}

/// The protocol of a Service port that names none.
pub const DEFAULT_PROTOCOL: &str = "TCP";

/// What keys a Service port in its list: its number and protocol.
pub fn port_key(p: &ServicePort) -> (i32, &str) {
    (p.port, p.protocol.as_deref().unwrap_or(DEFAULT_PROTOCOL))
}

/// The fields the operator owns on the Service that differ from `desired`.
pub fn service_differences(desired: &Service, observed: Option<&Service>) -> Vec<Difference> {
    let mut out = Vec::new();
    let Some(observed) = observed else {
        out.push(Difference { field: "service", observed: "missing".into(), desired: "present".into() });
        return out;
    };
    let (want, have) = (desired.spec.clone().unwrap_or_default(), observed.spec.clone().unwrap_or_default());
    diff(&mut out, "spec.selector", have.selector.as_ref(), want.selector.as_ref());
    // A port is keyed by its number and protocol (TCP when unset), and compared in order of
    // those: a protocol flipped by hand is drift too.
    type Compared<'a> = ((i32, &'a str), Option<&'a str>, Option<&'a IntOrString>);
    fn ports(s: &ServiceSpec) -> Vec<Compared<'_>> {
        let mut ports = s
            .ports
            .iter()
            .flatten()
            .map(|p| (port_key(p), p.name.as_deref(), p.target_port.as_ref()))
            .collect::<Vec<_>>();
        ports.sort_by_key(|p| p.0);
        ports
    }
    diff(&mut out, "spec.ports", Some(ports(&have)), Some(ports(&want)));
    if !labels_cover(observed.metadata.labels.as_ref(), desired.metadata.labels.as_ref()) {
        out.push(Difference { field: "metadata.labels", observed: "changed".into(), desired: "restored".into() });
    }
    out
}

/// The fields the operator owns on the HorizontalPodAutoscaler that differ from `desired`.
pub fn hpa_differences(
    desired: &HorizontalPodAutoscaler,
    observed: Option<&HorizontalPodAutoscaler>,
) -> Vec<Difference> {
    let mut out = Vec::new();
    let Some(observed) = observed else {
        out.push(Difference {
            field: "horizontalPodAutoscaler",
            observed: "missing".into(),
            desired: "present".into(),
        });
        return out;
    };
    let (want, have) = (&desired.spec, &observed.spec);
    diff(&mut out, "spec.minReplicas", have.min_replicas, want.min_replicas);
    diff(&mut out, "spec.maxReplicas", Some(have.max_replicas), Some(want.max_replicas));
    diff(&mut out, "spec.scaleTargetRef.name", Some(&have.scale_target_ref.name), Some(&want.scale_target_ref.name));
    diff(&mut out, "spec.metrics", have.metrics.as_ref(), want.metrics.as_ref());
    if !labels_cover(observed.metadata.labels.as_ref(), desired.metadata.labels.as_ref()) {
        out.push(Difference { field: "metadata.labels", observed: "changed".into(), desired: "restored".into() });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rollout::replicas::fixed_replicas;
    use k8s_openapi::api::core::v1::PodSpec;

    /// The stable Deployment running `spec.version` as the App asks (no rollout under way).
    fn desired_deployment(app: &App, id: &AppIdentity) -> Deployment {
        let shape = DeploymentShape {
            track: Track::Stable,
            version: crate::api::template::revision(&app.spec.version, app.spec.template.as_ref()),
            template: app.spec.template.clone(),
            replicas: fixed_replicas(app),
            paused: false,
            keep_running_pods: false,
        };
        deployment(app, id, &shape)
    }
    use crate::api::{AppSpec, Autoscaling};
    use proptest::prelude::*;

    fn app(replicas: Option<i32>, autoscaling: Option<Autoscaling>) -> (App, AppIdentity) {
        let mut app = App::new(
            "checkout",
            AppSpec {
                image: "registry.example.com/checkout".into(),
                version: "1.4.2".into(),
                replicas,
                autoscaling,
                ..AppSpec::default()
            },
        );
        app.metadata.namespace = Some("team-a".into());
        app.metadata.uid = Some("uid-1".into());
        let id = AppIdentity::of(&app).expect("identity");
        (app, id)
    }

    /// An App with a template as a team would write one: env, resources, a probe, a volume
    /// from a ConfigMap, a sidecar, a node selector, labels and annotations.
    fn templated(main: &str) -> (App, AppIdentity) {
        let (mut app, id) = app(Some(2), None);
        let template: crate::api::PodTemplate = serde_json::from_value(serde_json::json!({
            "metadata": {"labels": {"team": "payments"}, "annotations": {"example.com/owner": "pay"}},
            "spec": {
                "nodeSelector": {"pool": "general"},
                "volumes": [{"name": "config", "configMap": {"name": "checkout-config"}}],
                "containers": [
                    {"name": "proxy", "image": "envoy:1.30", "securityContext": {"capabilities": {"add": ["NET_BIND_SERVICE"]}}},
                    {
                        "name": main,
                        "env": [{"name": "MODE", "value": "live"}],
                        "resources": {"requests": {"cpu": "250m", "memory": "128Mi"}},
                        "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"}},
                        "volumeMounts": [{"name": "config", "mountPath": "/etc/checkout"}],
                        "ports": [{"name": "metrics", "containerPort": 9090}]
                    }
                ]
            }
        }))
        .expect("template");
        app.spec.template = Some(template);
        (app, id)
    }

    fn pod_of(d: &Deployment) -> &k8s_openapi::api::core::v1::PodSpec {
        d.spec.as_ref().and_then(|s| s.template.spec.as_ref()).expect("pod")
    }

    #[test]
    fn the_template_is_rendered_with_the_image_port_labels_and_defaults() {
        let (app, id) = templated("app");
        let d = desired_deployment(&app, &id);
        let pod = pod_of(&d);
        assert_eq!(pod.node_selector.as_ref().and_then(|n| n.get("pool")).map(String::as_str), Some("general"));
        assert_eq!(pod.volumes.as_ref().map(Vec::len), Some(1));
        let main = &pod.containers[1];
        assert_eq!(main.name, "app");
        assert_eq!(main.image.as_deref(), Some("registry.example.com/checkout:1.4.2"));
        let ports: Vec<(Option<&str>, i32)> =
            main.ports.iter().flatten().map(|p| (p.name.as_deref(), p.container_port)).collect();
        assert_eq!(ports, [(Some("http"), 8080), (Some("metrics"), 9090)], "the http port first, the template's kept");
        assert!(main.readiness_probe.is_some() && main.env.is_some() && main.resources.is_some());
        // The sidecar keeps its image and the capability it adds; everything else is dropped.
        let proxy = &pod.containers[0];
        assert_eq!(proxy.image.as_deref(), Some("envoy:1.30"));
        let caps = proxy.security_context.as_ref().and_then(|s| s.capabilities.clone()).expect("caps");
        assert_eq!((caps.add, caps.drop), (Some(vec!["NET_BIND_SERVICE".into()]), Some(vec!["ALL".into()])));
        for c in &pod.containers {
            assert_eq!(
                c.security_context.as_ref().and_then(|s| s.allow_privilege_escalation),
                Some(false),
                "{}",
                c.name
            );
        }
        let sc = pod.security_context.as_ref().expect("pod securityContext");
        assert_eq!(sc.run_as_non_root, Some(true));
        assert_eq!(pod.automount_service_account_token, Some(false));
        let meta = d.spec.as_ref().and_then(|s| s.template.metadata.as_ref()).expect("meta");
        let labels = meta.labels.as_ref().expect("labels");
        assert_eq!(labels.get("team").map(String::as_str), Some("payments"));
        assert_eq!(labels.get(names::LABEL_NAME).map(String::as_str), Some("checkout"));
        assert!(meta.annotations.as_ref().is_some_and(|a| a.contains_key("example.com/owner")));
        assert!(deployment_differences(&d, Some(&d)).is_empty());
    }

    #[test]
    fn the_only_container_is_the_main_one_whatever_its_name() {
        let (mut app, id) = templated("web");
        if let Some(pod) = app.spec.template.as_mut().and_then(|t| t.spec.as_mut()) {
            pod.containers.remove(0);
        }
        let d = desired_deployment(&app, &id);
        let pod = pod_of(&d);
        assert_eq!(pod.containers.len(), 1);
        assert_eq!(pod.containers[0].name, "web");
        assert_eq!(pod.containers[0].image.as_deref(), Some("registry.example.com/checkout:1.4.2"));
    }

    #[test]
    fn the_templates_own_security_settings_win() {
        let (mut app, id) = templated("app");
        if let Some(pod) = app.spec.template.as_mut().and_then(|t| t.spec.as_mut()) {
            pod.security_context = Some(PodSecurityContext { run_as_user: Some(0), ..PodSecurityContext::default() });
            pod.automount_service_account_token = Some(true);
            pod.containers[0].security_context =
                Some(SecurityContext { privileged: Some(true), ..SecurityContext::default() });
        }
        let d = desired_deployment(&app, &id);
        let pod = pod_of(&d);
        let sc = pod.security_context.as_ref().expect("sc");
        assert_eq!(sc.run_as_non_root, None, "runAsUser 0 asked: no runAsNonRoot that the kubelet would refuse");
        assert_eq!(pod.automount_service_account_token, Some(true));
        let proxy = pod.containers[0].security_context.as_ref().expect("sc");
        assert_eq!(proxy.allow_privilege_escalation, None, "privileged: the apiserver refuses escalation false");
    }

    #[test]
    fn a_change_of_the_template_is_a_difference() {
        let (app, id) = templated("app");
        let before = desired_deployment(&app, &id);
        let mut changed = app.clone();
        if let Some(pod) = changed.spec.template.as_mut().and_then(|t| t.spec.as_mut()) {
            pod.containers[1].env = Some(vec![k8s_openapi::api::core::v1::EnvVar {
                name: "MODE".into(),
                value: Some("dry-run".into()),
                value_from: None,
            }]);
        }
        let after = desired_deployment(&changed, &id);
        let fields: Vec<&str> = deployment_differences(&after, Some(&before)).iter().map(|d| d.field).collect();
        assert_eq!(fields, ["spec.template", "metadata.annotations[flotilla.dev/revision]"]);
    }

    #[test]
    fn a_removed_revision_annotation_is_a_difference() {
        let (app, id) = templated("app");
        let desired = desired_deployment(&app, &id);
        let mut observed = desired.clone();
        if let Some(a) = observed.metadata.annotations.as_mut() {
            a.remove(names::ANNOTATION_REVISION);
        }
        let fields: Vec<&str> = deployment_differences(&desired, Some(&observed)).iter().map(|d| d.field).collect();
        assert_eq!(fields, ["metadata.annotations[flotilla.dev/revision]"]);
    }

    #[test]
    fn an_empty_drop_list_reads_back_as_unset_and_is_no_difference() {
        let (mut app, id) = templated("app");
        if let Some(pod) = app.spec.template.as_mut().and_then(|t| t.spec.as_mut()) {
            pod.containers[1].security_context = Some(SecurityContext {
                capabilities: Some(k8s_openapi::api::core::v1::Capabilities { add: None, drop: Some(vec![]) }),
                ..SecurityContext::default()
            });
        }
        let desired = desired_deployment(&app, &id);
        let mut observed = desired.clone();
        if let Some(pod) = observed.spec.as_mut().and_then(|s| s.template.spec.as_mut()) {
            pod.containers[1].security_context.as_mut().and_then(|s| s.capabilities.as_mut()).expect("caps").drop =
                None;
        }
        assert!(deployment_differences(&desired, Some(&observed)).is_empty(), "as the apiserver stores it");
    }

    #[test]
    fn an_init_container_as_root_gets_no_run_as_non_root() {
        let (mut app, id) = templated("app");
        if let Some(pod) = app.spec.template.as_mut().and_then(|t| t.spec.as_mut()) {
            pod.init_containers = Some(vec![Container {
                name: "migrate".into(),
                image: Some("migrate:1".into()),
                security_context: Some(SecurityContext { run_as_user: Some(0), ..SecurityContext::default() }),
                ..Container::default()
            }]);
        }
        let d = desired_deployment(&app, &id);
        assert_eq!(pod_of(&d).security_context.as_ref().and_then(|s| s.run_as_non_root), None);
    }

    #[test]
    fn a_running_template_read_back_renders_the_same_pods() {
        let (app, id) = templated("app");
        let running = desired_deployment(&app, &id);
        let read = crate::api::template::template_from_running(&running).expect("template");
        let mut again = app.clone();
        again.spec.template = Some(read.clone());
        let rendered = desired_deployment(&again, &id);
        assert_eq!(rendered.spec.as_ref().map(|s| &s.template), running.spec.as_ref().map(|s| &s.template));
        let labels = read.metadata.and_then(|m| m.labels).unwrap_or_default();
        assert!(labels.keys().all(|k| !k.starts_with("app.kubernetes.io/") && !k.starts_with("flotilla.dev/")));
    }

    #[test]
    fn deployment_runs_the_image_at_the_version() {
        let (app, id) = app(Some(3), None);
        let d = desired_deployment(&app, &id);
        let spec = d.spec.as_ref().expect("spec");
        assert_eq!(spec.replicas, Some(3));
        let pod = spec.template.spec.as_ref().expect("pod");
        assert_eq!(pod.containers[0].image.as_deref(), Some("registry.example.com/checkout:1.4.2"));
        let labels = d.metadata.labels.as_ref().expect("labels");
        assert_eq!(labels.get(names::LABEL_VERSION).map(String::as_str), Some("1.4.2"));
        assert_eq!(labels.get(names::LABEL_MANAGED_BY).map(String::as_str), Some("flotilla"));
        assert_eq!(d.metadata.owner_references.as_ref().map(|o| o[0].uid.as_str()), Some("uid-1"));
    }

    /// What Pod Security `restricted` checks of a pod, on the pods Flotilla creates.
    #[test]
    fn pods_pass_pod_security_restricted() {
        let (app, id) = app(Some(1), None);
        let d = desired_deployment(&app, &id);
        let pod = d.spec.and_then(|s| s.template.spec).expect("pod");
        let sc = pod.security_context.expect("pod securityContext");
        assert_eq!(sc.run_as_non_root, Some(true));
        assert_eq!(sc.seccomp_profile.map(|p| p.type_).as_deref(), Some("RuntimeDefault"));
        assert_eq!(pod.automount_service_account_token, Some(false));
        assert_eq!(pod.host_network.or(pod.host_pid).or(pod.host_ipc), None);
        for c in &pod.containers {
            let sc = c.security_context.as_ref().expect("container securityContext");
            assert_eq!(sc.allow_privilege_escalation, Some(false));
            assert_eq!(sc.privileged, None);
            assert_eq!(sc.capabilities.as_ref().and_then(|c| c.drop.clone()), Some(vec!["ALL".to_string()]));
            assert_eq!(sc.capabilities.as_ref().and_then(|c| c.add.clone()), None);
        }
    }

    #[test]
    fn replicas_default_to_one() {
        let (app, id) = app(None, None);
        assert_eq!(desired_deployment(&app, &id).spec.and_then(|s| s.replicas), Some(1));
    }

    #[test]
    fn autoscaling_leaves_replicas_to_the_hpa() {
        let auto = Autoscaling { min_replicas: 2, max_replicas: 5, target_cpu_utilization_percentage: None };
        let (app, id) = app(None, Some(auto));
        assert_eq!(desired_deployment(&app, &id).spec.and_then(|s| s.replicas), None);
        let hpa = desired_hpa(&app, &id).expect("hpa");
        let spec = hpa.spec;
        assert_eq!((spec.min_replicas, spec.max_replicas), (Some(2), 5));
        assert_eq!(spec.scale_target_ref.name, "checkout");
    }

    #[test]
    fn no_hpa_without_autoscaling() {
        let (app, id) = app(Some(2), None);
        assert!(desired_hpa(&app, &id).is_none());
    }

    #[test]
    fn table_of_differences() {
        let (app, id) = app(Some(3), None);
        let desired = desired_deployment(&app, &id);
        let scaled = {
            let mut d = desired.clone();
            d.spec.as_mut().expect("spec").replicas = Some(7);
            d
        };
        let reimaged = {
            let mut d = desired.clone();
            d.spec.as_mut().expect("spec").template.spec.as_mut().expect("pod").containers[0].image =
                Some("evil:latest".into());
            d
        };
        let extra_label = {
            let mut d = desired.clone();
            d.metadata.labels.as_mut().expect("labels").insert("team".into(), "a".into());
            d
        };
        let pod =
            |d: &mut Deployment| -> PodSpec { d.spec.as_mut().and_then(|s| s.template.spec.take()).expect("pod") };
        let with_pod = |d: &Deployment, f: &dyn Fn(&mut PodSpec)| {
            let mut d = d.clone();
            let mut p = pod(&mut d);
            f(&mut p);
            d.spec.as_mut().expect("spec").template.spec = Some(p);
            d
        };
        let privileged = with_pod(&desired, &|p| {
            p.containers[0].security_context.as_mut().expect("sc").allow_privilege_escalation = Some(true)
        });
        let unhardened = with_pod(&desired, &|p| {
            p.security_context = Some(PodSecurityContext::default());
            p.automount_service_account_token = None;
        });
        // What a mutating webhook or the apiserver may add beside the fields set here.
        let mutated = with_pod(&desired, &|p| {
            let pod = p.security_context.as_mut().expect("sc");
            pod.run_as_user = Some(1000);
            pod.fs_group = Some(2000);
            p.containers[0].security_context.as_mut().expect("sc").read_only_root_filesystem = Some(true);
            p.service_account_name = Some("default".into());
        });
        let cases: Vec<(&str, Option<&Deployment>, Vec<&str>)> = vec![
            ("missing", None, vec!["deployment"]),
            ("identical", Some(&desired), vec![]),
            ("privilege escalation allowed", Some(&privileged), vec!["spec.template.spec.securityContext"]),
            ("hardening removed", Some(&unhardened), vec!["spec.template.spec.securityContext"]),
            ("fields added by others are fine", Some(&mutated), vec![]),
            ("scaled", Some(&scaled), vec!["spec.replicas"]),
            ("image edited", Some(&reimaged), vec!["spec.template.spec.containers[app].image"]),
            ("foreign label is fine", Some(&extra_label), vec![]),
        ];
        for (name, observed, want) in cases {
            let got: Vec<_> = deployment_differences(&desired, observed).iter().map(|d| d.field).collect();
            assert_eq!(got, want, "case {name}");
        }
    }

    #[test]
    fn hpa_choice_of_replicas_is_not_drift() {
        let auto = Autoscaling { min_replicas: 2, max_replicas: 5, target_cpu_utilization_percentage: Some(60) };
        let (app, id) = app(None, Some(auto));
        let desired = desired_deployment(&app, &id);
        let mut observed = desired.clone();
        observed.spec.as_mut().expect("spec").replicas = Some(4);
        assert!(deployment_differences(&desired, Some(&observed)).is_empty());
    }

    proptest! {
        #[test]
        fn desired_state_never_differs_from_itself(replicas in 0i32..=1000, version in "[a-z0-9]([a-z0-9._-]{0,20}[a-z0-9])?", min in 1i32..10, extra in 0i32..10, auto in any::<bool>()) {
            let autoscaling = auto.then_some(Autoscaling { min_replicas: min, max_replicas: min + extra, target_cpu_utilization_percentage: None });
            let (mut app, id) = app(if auto { None } else { Some(replicas) }, autoscaling);
            app.spec.version = version;
            let d = desired_deployment(&app, &id);
            prop_assert!(deployment_differences(&d, Some(&d)).is_empty());
            if let Some(h) = desired_hpa(&app, &id) {
                prop_assert!(hpa_differences(&h, Some(&h)).is_empty());
            }
        }
    }
}
