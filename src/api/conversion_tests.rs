//! Round trips on generated objects, and the answers to malformed requests.

use super::*;
use crate::api::rollout::{
    Analysis, BlueGreenStrategy, CanaryStep, CanaryStrategy, GatewayApiRouting, MetricCheck, RollingStrategy,
    Strategy as Rollout, StrategyType, TrafficRouting,
};
use crate::api::template::{PodTemplate, TemplateMetadata};
use crate::api::tenant::{
    EnforceLevel, NetworkIsolation, NonNegativeQuantity, PodSecurity, PodSecurityLevel, PrometheusIsolation, Subject,
    SubjectKind, TenantLimitRange, TenantNetworkPolicy, TenantPrometheus, TenantQuota,
};
use crate::api::v1alpha1;
use crate::api::{Autoscaling, NamespaceRemovalPolicy};
use k8s_openapi::api::core::v1::{Container, EnvVar, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use proptest::collection::{btree_map, vec};
use proptest::option::of;
use proptest::prelude::*;
use serde_json::json;

fn autoscaling() -> impl Strategy<Value = Autoscaling> {
    (1..10i32, 10..20i32, of(1..=100i32)).prop_map(|(min_replicas, max_replicas, target)| Autoscaling {
        min_replicas,
        max_replicas,
        target_cpu_utilization_percentage: target,
    })
}

fn int_or_percent() -> impl Strategy<Value = IntOrString> {
    prop_oneof![(0..10i32).prop_map(IntOrString::Int), (0..100i32).prop_map(|p| IntOrString::String(format!("{p}%")))]
}

fn strategy() -> impl Strategy<Value = Rollout> {
    let step = (1..=100i32, of("[1-9][0-9]?(s|m)")).prop_map(|(weight, pause)| CanaryStep { weight, pause });
    prop_oneof![
        of((of(int_or_percent()), of(int_or_percent()))
            .prop_map(|(max_unavailable, max_surge)| RollingStrategy { max_unavailable, max_surge }))
        .prop_map(|rolling| Rollout { type_: StrategyType::Rolling, rolling, canary: None, blue_green: None }),
        (vec(step, 1..4), of("[a-z][a-z0-9.-]{0,20}")).prop_map(|(steps, route)| Rollout {
            type_: StrategyType::Canary,
            rolling: None,
            canary: Some(CanaryStrategy {
                steps,
                traffic_routing: route
                    .map(|http_route| TrafficRouting { gateway_api: GatewayApiRouting { http_route } }),
            }),
            blue_green: None,
        }),
        of((of(any::<bool>()), of("[1-9][0-9]?(s|m)"))).prop_map(|bg| Rollout {
            type_: StrategyType::BlueGreen,
            rolling: None,
            canary: None,
            blue_green: bg
                .map(|(auto_promotion, scale_down_delay)| BlueGreenStrategy { auto_promotion, scale_down_delay }),
        }),
    ]
}

fn analysis() -> impl Strategy<Value = Analysis> {
    let bound = of(-1.0e6..1.0e6f64);
    let metric = ("[a-z][a-z0-9-]{0,8}", "[a-z_]{1,10}", bound.clone(), bound)
        .prop_map(|(name, query, max, min)| MetricCheck { name, query, max, min });
    (of("[1-9][0-9]?s"), of(1..=100i32), of("http://[a-z]{1,8}:9090"), vec(metric, 1..3)).prop_map(
        |(interval, failure_limit, prometheus_url, metrics)| Analysis {
            interval,
            failure_limit,
            prometheus_url,
            metrics,
        },
    )
}

fn pod_annotations() -> impl Strategy<Value = Option<BTreeMap<String, String>>> {
    of(btree_map("[a-z]{1,5}", "[a-z0-9]{0,5}", 1..3))
}

/// Annotations a user may put on an object (never the conversion's own).
fn annotations() -> impl Strategy<Value = Annotations> {
    btree_map("[a-z]{1,6}(/[a-z]{1,4})?", "[ -~]{0,8}", 0..3)
}

fn deadline_text() -> impl Strategy<Value = String> {
    prop_oneof![
        (10..3600u32).prop_map(|s| format!("{s}s")),
        (1..60u32).prop_map(|m| format!("{m}m")),
        (1..60u32, 1..60u32).prop_map(|(m, s)| format!("{m}m{s}s")),
        (10_000..3_600_000u32).prop_map(|ms| format!("{ms}ms")),
        Just("1h".to_string()),
    ]
}

/// image, version, replicas, autoscaling, port, minReadySeconds, podAnnotations.
type Common =
    (String, String, Option<i32>, Option<Autoscaling>, Option<i32>, Option<i32>, Option<BTreeMap<String, String>>);

fn common() -> impl Strategy<Value = Common> {
    (
        "[a-z]{1,6}(/[a-z]{1,6})?",
        "[0-9]\\.[0-9]{1,2}",
        of(0..1000i32),
        of(autoscaling()),
        of(1..65535i32),
        of(0..3600i32),
        pod_annotations(),
    )
}

/// A pod template: containers (the first named `app`) with env and resources, labels,
/// annotations, a node selector.
fn template() -> impl Strategy<Value = PodTemplate> {
    (
        vec(("[a-z]{1,8}", "[ -~]{0,12}"), 0..3),
        of("[1-9][0-9]{0,2}m"),
        0..3usize,
        of(btree_map("team/[a-z]{1,5}", "[a-z0-9]{0,5}", 1..3)),
        pod_annotations(),
        of(btree_map("[a-z]{1,5}", "[a-z]{1,5}", 1..2)),
    )
        .prop_map(|(env, cpu, sidecars, labels, annotations, node_selector)| {
            let main = Container {
                name: "app".into(),
                env: (!env.is_empty()).then(|| {
                    env.into_iter().map(|(name, value)| EnvVar { name, value: Some(value), value_from: None }).collect()
                }),
                resources: cpu.map(|cpu| ResourceRequirements {
                    requests: Some(BTreeMap::from([("cpu".to_string(), Quantity(cpu))])),
                    ..ResourceRequirements::default()
                }),
                ..Container::default()
            };
            let sidecars = (0..sidecars).map(|i| Container {
                name: format!("sidecar{i}"),
                image: Some(format!("sidecar:{i}")),
                ..Container::default()
            });
            PodTemplate {
                metadata: (labels.is_some() || annotations.is_some())
                    .then_some(TemplateMetadata { labels, annotations }),
                spec: Some(PodSpec {
                    containers: std::iter::once(main).chain(sidecars).collect(),
                    node_selector,
                    ..PodSpec::default()
                }),
            }
        })
}

fn beta_app() -> impl Strategy<Value = v1beta1::AppSpec> {
    (common(), of(strategy()), of(analysis()), of(any::<bool>()), of(deadline_text()), of(1..=50i32), of(template()))
        .prop_map(
            |(
                (image, version, replicas, autoscaling, port, min_ready_seconds, pod_annotations),
                strategy,
                analysis,
                auto_rollback,
                progress_deadline,
                history_limit,
                template,
            )| {
                v1beta1::AppSpec {
                    image,
                    version,
                    replicas,
                    autoscaling,
                    port,
                    min_ready_seconds,
                    pod_annotations,
                    template,
                    rollout: v1beta1::RolloutSpec {
                        strategy,
                        analysis,
                        auto_rollback,
                        progress_deadline,
                        history_limit,
                    },
                }
            },
        )
}

fn alpha_app() -> impl Strategy<Value = v1alpha1::AppSpec> {
    (common(), of(strategy()), of(analysis()), of(any::<bool>()), of(10..=3600i32)).prop_map(
        |(
            (image, version, replicas, autoscaling, port, min_ready_seconds, pod_annotations),
            strategy,
            analysis,
            auto_rollback,
            progress_deadline_seconds,
        )| {
            v1alpha1::AppSpec {
                image,
                version,
                replicas,
                autoscaling,
                port,
                min_ready_seconds,
                pod_annotations,
                strategy,
                analysis,
                auto_rollback,
                progress_deadline_seconds,
            }
        },
    )
}

fn subject() -> impl Strategy<Value = Subject> {
    prop_oneof![
        "[a-z]{1,8}".prop_map(|name| Subject { kind: SubjectKind::User, name, namespace: None }),
        "[a-z]{1,8}".prop_map(|name| Subject { kind: SubjectKind::Group, name, namespace: None }),
        ("[a-z]{1,8}", "[a-z]{1,8}").prop_map(|(name, ns)| Subject {
            kind: SubjectKind::ServiceAccount,
            name,
            namespace: Some(ns)
        }),
    ]
}

fn quota() -> impl Strategy<Value = TenantQuota> {
    btree_map("(pods|services|requests\\.cpu)", "[1-9][0-9]{0,2}(m|Gi)?".prop_map(NonNegativeQuantity), 1..3)
        .prop_map(|hard| TenantQuota { hard })
}

fn level() -> impl Strategy<Value = PodSecurityLevel> {
    prop_oneof![
        Just(PodSecurityLevel::Privileged),
        Just(PodSecurityLevel::Baseline),
        Just(PodSecurityLevel::Restricted)
    ]
}

fn pod_security() -> impl Strategy<Value = PodSecurity> {
    (of(prop_oneof![Just(EnforceLevel::Baseline), Just(EnforceLevel::Restricted)]), of(level()), of(level()))
        .prop_map(|(enforce, warn, audit)| PodSecurity { enforce, warn, audit })
}

/// Prometheus endpoints a Tenant lists: the same type in both versions, carried as is.
fn prometheus_endpoints() -> impl Strategy<Value = Vec<TenantPrometheus>> {
    vec(
        ("https?://[a-z]{1,8}(:[0-9]{2,4})?", any::<bool>()).prop_map(|(url, dedicated)| TenantPrometheus {
            url,
            isolation: if dedicated { PrometheusIsolation::Dedicated } else { PrometheusIsolation::Shared },
        }),
        0..3,
    )
}

fn quantities() -> impl Strategy<Value = Option<BTreeMap<String, NonNegativeQuantity>>> {
    of(btree_map(
        prop_oneof![Just("cpu".to_string()), Just("memory".to_string())],
        "[1-9][0-9]{0,3}(m|Mi)?".prop_map(NonNegativeQuantity),
        1..3,
    ))
}

fn limit_range() -> impl Strategy<Value = TenantLimitRange> {
    (quantities(), quantities(), quantities()).prop_map(|(default, default_request, max)| TenantLimitRange {
        default,
        default_request,
        max,
    })
}

fn network_policy() -> impl Strategy<Value = TenantNetworkPolicy> {
    (
        of(prop_oneof![
            Just(NetworkIsolation::Tenant),
            Just(NetworkIsolation::Namespace),
            Just(NetworkIsolation::None)
        ]),
        vec("[a-z]{1,8}", 0..3),
    )
        .prop_map(|(isolation, allow_from_namespaces)| TenantNetworkPolicy { isolation, allow_from_namespaces })
}

fn pod_policy() -> impl Strategy<Value = crate::api::TenantPodPolicy> {
    (vec("[a-z]{1,8}", 0..3), vec("[a-z]{1,8}", 0..2), btree_map("[a-z./]{1,12}", "[a-z0-9]{0,6}", 0..3)).prop_map(
        |(classes, keys, node_selector)| crate::api::TenantPodPolicy {
            allowed_priority_classes: classes.clone(),
            allowed_runtime_classes: keys.clone(),
            node_selector,
            allowed_toleration_keys: keys,
            allowed_csi_drivers: classes.clone(),
            allowed_token_audiences: classes,
        },
    )
}

fn beta_tenant() -> impl Strategy<Value = v1beta1::TenantSpec> {
    (
        vec("[a-z]{1,8}", 0..4),
        vec(subject(), 0..3),
        of(quota()),
        any::<bool>(),
        of(pod_security()),
        prometheus_endpoints(),
        of(limit_range()),
        of(network_policy()),
        of(pod_policy()),
    )
        .prop_map(
            |(
                namespaces,
                admins,
                quota,
                delete,
                pod_security,
                prometheus_endpoints,
                limit_range,
                network_policy,
                pod_policy,
            )| {
                v1beta1::TenantSpec {
                    namespaces,
                    admins,
                    quota,
                    namespace_removal_policy: if delete {
                        NamespaceRemovalPolicy::Delete
                    } else {
                        NamespaceRemovalPolicy::Retain
                    },
                    pod_security,
                    prometheus_endpoints,
                    limit_range,
                    network_policy,
                    pod_policy,
                }
            },
        )
}

fn alpha_tenant() -> impl Strategy<Value = v1alpha1::TenantSpec> {
    (
        vec("[a-z]{1,8}", 0..4),
        vec(subject(), 0..3),
        of(quota()),
        any::<bool>(),
        of(pod_security()),
        prometheus_endpoints(),
        of(limit_range()),
        of(network_policy()),
        of(pod_policy()),
    )
        .prop_map(
            |(
                namespaces,
                admins,
                quota,
                delete_namespaces_on_removal,
                pod_security,
                prometheus_endpoints,
                limit_range,
                network_policy,
                pod_policy,
            )| {
                v1alpha1::TenantSpec {
                    namespaces,
                    admins,
                    quota,
                    delete_namespaces_on_removal,
                    pod_security,
                    prometheus_endpoints,
                    limit_range,
                    network_policy,
                    pod_policy,
                }
            },
        )
}

/// A whole object as the apiserver sends it, with a status the conversion must not touch.
fn object(api_version: &str, kind: &str, spec: Value, annotations: &Annotations) -> Value {
    let mut object = json!({
        "apiVersion": api_version, "kind": kind,
        "metadata": {"name": "web", "namespace": "shop", "uid": "0e5f", "resourceVersion": "42", "generation": 3,
                     "creationTimestamp": "2026-11-30T10:00:00Z"},
        "spec": spec,
        "status": {"observedGeneration": 3, "phase": "Healthy", "history": [{"version": "1.0", "result": "Promoted", "at": "2026-11-30T10:00:00Z"}]},
    });
    if !annotations.is_empty() {
        object["metadata"]["annotations"] = json!(annotations);
    }
    object
}

const ALPHA: &str = "flotilla.dev/v1alpha1";
const BETA: &str = "flotilla.dev/v1beta1";

fn convert(object: &Value, to: &str) -> Value {
    convert_object(0, object.clone(), to).expect("converts")
}

/// `spec` with only the keys (and `rollout` keys) whose bit is set in `mask`: the partial
/// objects the apiserver converts for server-side apply.
fn partial(spec: Value, mask: u32) -> Value {
    let mut bit = 0;
    let mut keep = |_: &String, _: &mut Value| {
        bit += 1;
        mask & (1 << (bit % 32)) != 0
    };
    let mut spec = spec;
    if let Some(map) = spec.as_object_mut() {
        map.retain(&mut keep);
        for key in ["rollout"] {
            if let Some(inner) = map.get_mut(key).and_then(Value::as_object_mut) {
                inner.retain(&mut keep);
            }
        }
    }
    spec
}

proptest! {
    #[test]
    fn app_v1beta1_to_v1alpha1_and_back_is_identity(spec in beta_app(), annotations in annotations()) {
        let start = object(BETA, "App", serde_json::to_value(&spec).unwrap(), &annotations);
        let down = convert(&start, ALPHA);
        prop_assert_eq!(&down["status"], &start["status"]);
        prop_assert!(serde_json::from_value::<v1alpha1::App>(down.clone()).is_ok(), "a valid v1alpha1 App: {}", down);
        prop_assert_eq!(convert(&down, BETA), start);
    }

    #[test]
    fn app_v1alpha1_to_v1beta1_and_back_is_identity(spec in alpha_app(), annotations in annotations()) {
        let start = object(ALPHA, "App", serde_json::to_value(&spec).unwrap(), &annotations);
        let up = convert(&start, BETA);
        prop_assert!(serde_json::from_value::<v1beta1::App>(up.clone()).is_ok(), "a valid v1beta1 App: {}", up);
        prop_assert_eq!(convert(&up, ALPHA), start);
    }

    /// A `v1alpha1` object that carries `v1beta1`-only fields in the annotation (as every
    /// `v1alpha1` read of such an object does) survives the trip up and down too, and the
    /// `v1beta1` object keeps no conversion annotation.
    #[test]
    fn app_v1alpha1_with_kept_fields_round_trips(spec in beta_app(), annotations in annotations()) {
        let alpha = convert(&object(BETA, "App", serde_json::to_value(&spec).unwrap(), &annotations), ALPHA);
        let up = convert(&alpha, BETA);
        prop_assert!(up["metadata"]["annotations"].get(ANNOTATION_V1BETA1_FIELDS).is_none());
        prop_assert_eq!(convert(&up, ALPHA), alpha);
    }

    /// Partial objects (any subset of the spec's keys) convert without error and round trip.
    #[test]
    fn partial_objects_round_trip(beta in beta_app(), alpha in alpha_app(), mask in any::<u32>()) {
        let start = object(BETA, "App", partial(serde_json::to_value(&beta).unwrap(), mask), &Annotations::new());
        prop_assert_eq!(convert(&convert(&start, ALPHA), BETA), start);
        let start = object(ALPHA, "App", partial(serde_json::to_value(&alpha).unwrap(), mask), &Annotations::new());
        prop_assert_eq!(convert(&convert(&start, BETA), ALPHA), start);
    }

    #[test]
    fn tenants_round_trip_both_ways(beta in beta_tenant(), alpha in alpha_tenant(), annotations in annotations(), mask in any::<u32>()) {
        for spec in [serde_json::to_value(&beta).unwrap(), partial(serde_json::to_value(&beta).unwrap(), mask)] {
            let start = object(BETA, "Tenant", spec, &annotations);
            let down = convert(&start, ALPHA);
            prop_assert_eq!(convert(&down, BETA), start);
        }
        for spec in [serde_json::to_value(&alpha).unwrap(), partial(serde_json::to_value(&alpha).unwrap(), mask)] {
            let start = object(ALPHA, "Tenant", spec, &annotations);
            let up = convert(&start, BETA);
            prop_assert_eq!(convert(&up, ALPHA), start);
        }
    }
}

fn app(version: &str, spec: Value, annotations: &Annotations) -> Value {
    object(version, "App", spec, annotations)
}

fn kept_annotation(object: &Value) -> Option<&str> {
    object["metadata"]["annotations"].get(ANNOTATION_V1BETA1_FIELDS).and_then(Value::as_str)
}

#[test]
fn v1beta1_only_fields_go_into_the_annotation() {
    let beta = app(
        BETA,
        json!({"image": "registry.example.com/web", "version": "2",
               "rollout": {"progressDeadline": "1500ms", "historyLimit": 20, "autoRollback": false}}),
        &Annotations::new(),
    );
    let alpha = convert(&beta, ALPHA);
    assert_eq!(
        alpha["spec"],
        json!({"image": "registry.example.com/web", "version": "2", "autoRollback": false, "progressDeadlineSeconds": 2})
    );
    assert_eq!(kept_annotation(&alpha), Some(r#"{"progressDeadline":"1500ms","historyLimit":20}"#));

    // A deadline v1alpha1 says exactly needs no annotation.
    let beta =
        app(BETA, json!({"image": "web", "version": "2", "rollout": {"progressDeadline": "90s"}}), &Annotations::new());
    let alpha = convert(&beta, ALPHA);
    assert_eq!(alpha["spec"]["progressDeadlineSeconds"], 90);
    assert!(alpha["metadata"].get("annotations").is_none());
}

fn with_kept(text: &str) -> Annotations {
    Annotations::from([(ANNOTATION_V1BETA1_FIELDS.to_string(), text.to_string())])
}

#[test]
fn a_changed_v1alpha1_deadline_wins_over_the_kept_one() {
    let alpha = app(
        ALPHA,
        json!({"image": "web", "version": "2", "progressDeadlineSeconds": 120}),
        &with_kept(r#"{"progressDeadline":"10m","historyLimit":3}"#),
    );
    let beta = convert(&alpha, BETA);
    assert_eq!(beta["spec"]["rollout"], json!({"progressDeadline": "120s", "historyLimit": 3}));
    assert!(beta["metadata"].get("annotations").is_none());
}

/// The apiserver validates a v1alpha1 write against the v1alpha1 schema only and stores what
/// the conversion returns unchecked: values in the annotation that v1beta1 would refuse, and
/// anything else the annotation holds, fail the conversion with the field named.
#[test]
fn kept_values_v1beta1_would_refuse_are_refused() {
    let cases = [
        (
            r#"{"progressDeadline":"garbage"}"#,
            "spec.rollout.progressDeadline (kept in metadata.annotations[flotilla.dev/v1beta1-fields]): must be a duration from 10s to 1h",
        ),
        (r#"{"progressDeadline":"5h"}"#, "spec.rollout.progressDeadline"),
        (r#"{"progressDeadline":"10sec"}"#, "spec.rollout.progressDeadline"),
        (
            r#"{"historyLimit":0}"#,
            "spec.rollout.historyLimit (kept in metadata.annotations[flotilla.dev/v1beta1-fields]): must be from 1 to 50, not 0",
        ),
        (r#"{"historyLimit":100000}"#, "spec.rollout.historyLimit"),
        (r#"{"historyLimit":"3"}"#, "metadata.annotations[flotilla.dev/v1beta1-fields] must be a JSON object"),
        (r#"{"templat":{}}"#, "unknown field `templat`"),
        (r#"{"emptyRollout":"yes"}"#, "metadata.annotations[flotilla.dev/v1beta1-fields]"),
        ("not json", "metadata.annotations[flotilla.dev/v1beta1-fields] must be a JSON object"),
        (r#"["template"]"#, "metadata.annotations[flotilla.dev/v1beta1-fields] must be a JSON object"),
        (
            r#"{"template":"x"}"#,
            "spec.template: must be an object, not a string (kept in metadata.annotations[flotilla.dev/v1beta1-fields])",
        ),
        (
            r#"{"template":{"spec":{"containers":[{"name":"app","image":"nginx"}]}}}"#,
            "spec.template.spec.containers: the main container",
        ),
        (r#"{"template":{"metadata":{"labels":{"app.kubernetes.io/name":"x"}}}}"#, "spec.template.metadata.labels"),
    ];
    for (kept, want) in cases {
        let alpha =
            app(ALPHA, json!({"image": "web", "version": "2", "progressDeadlineSeconds": 600}), &with_kept(kept));
        let message = failure_of(review(review_of(vec![alpha], BETA)));
        assert!(message.contains(want), "{kept}: want {want:?} in {message:?}");
        assert!(message.starts_with("object 0 (web) as flotilla.dev/v1alpha1 App: "), "{message}");
    }
    // A valid deadline the v1alpha1 object no longer asks for is no error: the v1alpha1 field wins.
    let alpha = app(
        ALPHA,
        json!({"image": "web", "version": "2", "progressDeadlineSeconds": 600}),
        &with_kept(r#"{"progressDeadline":"1m30s"}"#),
    );
    assert_eq!(convert(&alpha, BETA)["spec"]["rollout"], json!({"progressDeadline": "600s"}));
    // Nor is a template of null, which v1beta1 allows.
    let alpha = app(ALPHA, json!({"image": "web", "version": "2"}), &with_kept(r#"{"template":null}"#));
    assert_eq!(convert(&alpha, BETA)["spec"]["template"], Value::Null);
}

#[test]
fn v1alpha1_rollout_fields_move_under_spec_rollout() {
    let start = app(
        ALPHA,
        json!({"image": "web", "version": "2", "strategy": {"type": "Canary", "canary": {"steps": [{"weight": 10}]}},
               "progressDeadlineSeconds": 600}),
        &Annotations::new(),
    );
    let beta = convert(&start, BETA);
    assert_eq!(beta["apiVersion"], BETA);
    assert_eq!(
        beta["spec"],
        json!({"image": "web", "version": "2", "rollout": {
            "strategy": {"type": "Canary", "canary": {"steps": [{"weight": 10}]}}, "progressDeadline": "600s"}})
    );
    assert!(beta["metadata"].get("annotations").is_none());
}

#[test]
fn tenant_pod_security_is_the_same_field_in_both_versions() {
    let tenant = |version: &str, spec: Value| object(version, "Tenant", spec, &Annotations::new());
    let levels = json!({"enforce": "restricted", "warn": "restricted", "audit": "baseline"});
    let beta = convert(&tenant(ALPHA, json!({"namespaces": ["a"], "podSecurity": levels})), BETA);
    assert_eq!(beta["spec"], json!({"namespaces": ["a"], "podSecurity": levels}));
    let alpha = convert(&tenant(BETA, json!({"podSecurity": {"enforce": "baseline"}})), ALPHA);
    assert_eq!(alpha["spec"], json!({"podSecurity": {"enforce": "baseline"}}));
    assert!(alpha["metadata"].get("annotations").is_none(), "nothing kept aside: v1alpha1 holds it");
}

#[test]
fn tenant_removal_policy_and_partial_objects() {
    let tenant = |version: &str, spec: Value| object(version, "Tenant", spec, &Annotations::new());
    let beta = convert(&tenant(ALPHA, json!({"namespaces": ["a"], "deleteNamespacesOnRemoval": false})), BETA);
    assert_eq!(beta["spec"], json!({"namespaces": ["a"], "namespaceRemovalPolicy": "Retain"}));
    let alpha = convert(&tenant(BETA, json!({"namespaceRemovalPolicy": "Delete"})), ALPHA);
    assert_eq!(alpha["spec"], json!({"deleteNamespacesOnRemoval": true}));
    // No spec at all, or an empty one: only the apiVersion changes.
    let mut bare = app(ALPHA, json!({}), &Annotations::new());
    bare.as_object_mut().unwrap().remove("spec");
    let converted = convert(&bare, BETA);
    assert_eq!(converted["apiVersion"], BETA);
    assert!(converted.get("spec").is_none());
    assert_eq!(convert(&app(ALPHA, json!({}), &Annotations::new()), BETA)["spec"], json!({}));
}

fn review_of(objects: Vec<Value>, desired: &str) -> ConversionReview {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
        "request": {"uid": "r-1", "desiredAPIVersion": desired, "objects": objects},
    }))
    .unwrap()
}

fn failure_of(review: ConversionReview) -> String {
    let response = review.response.expect("a response");
    assert_eq!(response.uid, "r-1");
    assert_eq!(response.result.status, Some(kube::core::response::StatusSummary::Failure), "{response:?}");
    assert!(response.converted_objects.is_empty());
    response.result.message
}

#[test]
fn malformed_requests_get_a_failure_that_says_why() {
    let app = |spec: Value| object(ALPHA, "App", spec, &Annotations::new());
    let cases = [
        (vec![json!({"kind": "App", "spec": {}})], BETA, "object 0: apiVersion is missing"),
        (
            vec![app(json!({"image": "web", "version": "1"}))],
            "flotilla.dev/v2",
            "desired API version \"flotilla.dev/v2\"",
        ),
        (
            vec![app(json!({"image": "web", "version": "1"})), app(json!({"progressDeadlineSeconds": "soon"}))],
            BETA,
            "object 1 (web) as flotilla.dev/v1alpha1 App: spec.progressDeadlineSeconds must be an integer",
        ),
        (
            vec![json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}})],
            BETA,
            "apps/v1 is not a version",
        ),
        (vec![json!({"apiVersion": ALPHA, "kind": "Secret", "metadata": {"name": "s"}})], BETA, "flotilla.dev/Secret"),
        (vec![app(json!("text"))], BETA, "spec must be an object"),
        (
            vec![object(BETA, "App", json!({"rollout": {"progressDeadline": 5}}), &Annotations::new())],
            ALPHA,
            "spec.rollout.progressDeadline must be a duration string",
        ),
        (
            vec![object(BETA, "Tenant", json!({"namespaceRemovalPolicy": "Shred"}), &Annotations::new())],
            ALPHA,
            "spec.namespaceRemovalPolicy must be Retain or Delete",
        ),
    ];
    for (objects, desired, want) in cases {
        let message = failure_of(review(review_of(objects, desired)));
        assert!(message.contains(want), "want {want:?} in {message:?}");
    }
    let mut annotated = app(json!({"image": "web", "version": "1"}));
    annotated["metadata"]["annotations"] = json!({"a": 1});
    assert!(failure_of(review(review_of(vec![annotated], BETA))).contains("metadata.annotations"));

    // No request at all.
    let empty: ConversionReview =
        serde_json::from_value(json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview"})).unwrap();
    let response = review(empty).response.expect("a response");
    assert_eq!(response.result.code, 400);
}

#[test]
fn a_good_review_converts_every_object_and_echoes_the_uid() {
    let objects = vec![
        object(ALPHA, "App", json!({"image": "web", "version": "1"}), &Annotations::new()),
        object(BETA, "App", json!({"image": "web", "version": "1"}), &Annotations::new()),
    ];
    let response = review(review_of(objects, BETA)).response.expect("a response");
    assert_eq!(response.uid, "r-1");
    assert_eq!(response.result.status, Some(kube::core::response::StatusSummary::Success));
    assert_eq!(response.converted_objects.len(), 2);
    assert!(response.converted_objects.iter().all(|o| o["apiVersion"] == BETA));
}

#[test]
fn nulls_and_an_empty_rollout_survive_round_trips() {
    let cases = [
        (BETA, "App", json!({"rollout": {}})),
        (BETA, "App", json!({"rollout": {"progressDeadline": null}})),
        (ALPHA, "App", json!({"progressDeadlineSeconds": null})),
        (BETA, "Tenant", json!({"namespaceRemovalPolicy": null})),
        (ALPHA, "Tenant", json!({"deleteNamespacesOnRemoval": null})),
    ];
    for (version, kind, spec) in cases {
        let start = object(version, kind, spec, &Annotations::new());
        let other = if version == BETA { ALPHA } else { BETA };
        assert_eq!(convert(&convert(&start, other), version), start, "{version} {kind}");
    }
}
