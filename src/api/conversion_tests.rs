//! Round trips on generated objects, and the answers to malformed requests.

use super::*;
use crate::api::rollout::{
    Analysis, CanaryStep, CanaryStrategy, MetricCheck, RollingStrategy, Strategy as Rollout, StrategyType,
};
use crate::api::tenant::{NonNegativeQuantity, Subject, SubjectKind, TenantQuota};
use crate::api::{Autoscaling, NamespaceRemovalPolicy};
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
        .prop_map(|rolling| Rollout { type_: StrategyType::Rolling, rolling, canary: None }),
        vec(step, 1..4).prop_map(|steps| Rollout {
            type_: StrategyType::Canary,
            rolling: None,
            canary: Some(CanaryStrategy { steps }),
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

fn beta_app() -> impl Strategy<Value = v1beta1::AppSpec> {
    (common(), of(strategy()), of(analysis()), of(any::<bool>()), of(deadline_text()), of(1..=50i32)).prop_map(
        |(
            (image, version, replicas, autoscaling, port, min_ready_seconds, pod_annotations),
            strategy,
            analysis,
            auto_rollback,
            progress_deadline,
            history_limit,
        )| {
            v1beta1::AppSpec {
                image,
                version,
                replicas,
                autoscaling,
                port,
                min_ready_seconds,
                pod_annotations,
                rollout: v1beta1::RolloutSpec { strategy, analysis, auto_rollback, progress_deadline, history_limit },
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

fn beta_tenant() -> impl Strategy<Value = v1beta1::TenantSpec> {
    (vec("[a-z]{1,8}", 0..4), vec(subject(), 0..3), of(quota()), any::<bool>()).prop_map(
        |(namespaces, admins, quota, delete)| v1beta1::TenantSpec {
            namespaces,
            admins,
            quota,
            namespace_removal_policy: if delete {
                NamespaceRemovalPolicy::Delete
            } else {
                NamespaceRemovalPolicy::Retain
            },
        },
    )
}

fn alpha_tenant() -> impl Strategy<Value = v1alpha1::TenantSpec> {
    (vec("[a-z]{1,8}", 0..4), vec(subject(), 0..3), of(quota()), any::<bool>()).prop_map(
        |(namespaces, admins, quota, delete_namespaces_on_removal)| v1alpha1::TenantSpec {
            namespaces,
            admins,
            quota,
            delete_namespaces_on_removal,
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

proptest! {
    #[test]
    fn app_v1beta1_to_v1alpha1_and_back_is_identity(spec in beta_app(), annotations in annotations()) {
        let mut a = annotations.clone();
        let alpha = app_spec_to_v1alpha1(spec.clone(), &mut a);
        let back = app_spec_to_v1beta1(alpha, &mut a);
        prop_assert_eq!(back, spec);
        prop_assert_eq!(a, annotations);
    }

    #[test]
    fn app_v1alpha1_to_v1beta1_and_back_is_identity(spec in alpha_app(), annotations in annotations()) {
        let mut a = annotations.clone();
        let beta = app_spec_to_v1beta1(spec.clone(), &mut a);
        let back = app_spec_to_v1alpha1(beta, &mut a);
        prop_assert_eq!(back, spec);
        prop_assert_eq!(a, annotations);
    }

    /// A `v1alpha1` object that carries `v1beta1`-only fields in the annotation (as every
    /// `v1alpha1` read of such an object does) survives the trip up and down too.
    #[test]
    fn app_v1alpha1_with_kept_fields_round_trips(spec in beta_app(), annotations in annotations()) {
        let mut a = annotations;
        let alpha = app_spec_to_v1alpha1(spec, &mut a);
        let alpha_annotations = a.clone();
        let beta = app_spec_to_v1beta1(alpha.clone(), &mut a);
        prop_assert!(!a.contains_key(ANNOTATION_V1BETA1_FIELDS), "the v1beta1 object keeps no conversion annotation");
        prop_assert_eq!(app_spec_to_v1alpha1(beta, &mut a), alpha);
        prop_assert_eq!(a, alpha_annotations);
    }

    /// The same through whole objects and JSON, as the webhook sees them: status and metadata
    /// other than annotations come back byte for byte.
    #[test]
    fn app_objects_round_trip_both_ways(beta in beta_app(), alpha in alpha_app(), annotations in annotations()) {
        let start = object(BETA, "App", serde_json::to_value(&beta).unwrap(), &annotations);
        let down = convert_object(0, start.clone(), ALPHA).unwrap();
        prop_assert_eq!(&down["status"], &start["status"]);
        prop_assert_eq!(convert_object(0, down, BETA).unwrap(), start);

        let start = object(ALPHA, "App", serde_json::to_value(&alpha).unwrap(), &annotations);
        let up = convert_object(0, start.clone(), BETA).unwrap();
        prop_assert_eq!(convert_object(0, up, ALPHA).unwrap(), start);
    }

    #[test]
    fn tenants_round_trip_both_ways(beta in beta_tenant(), alpha in alpha_tenant(), annotations in annotations()) {
        prop_assert_eq!(tenant_spec_to_v1beta1(tenant_spec_to_v1alpha1(beta.clone())), beta.clone());
        prop_assert_eq!(tenant_spec_to_v1alpha1(tenant_spec_to_v1beta1(alpha.clone())), alpha.clone());
        let start = object(BETA, "Tenant", serde_json::to_value(&beta).unwrap(), &annotations);
        let down = convert_object(0, start.clone(), ALPHA).unwrap();
        prop_assert_eq!(convert_object(0, down, BETA).unwrap(), start);
        let start = object(ALPHA, "Tenant", serde_json::to_value(&alpha).unwrap(), &annotations);
        let up = convert_object(0, start.clone(), BETA).unwrap();
        prop_assert_eq!(convert_object(0, up, ALPHA).unwrap(), start);
    }
}

#[test]
fn v1beta1_only_fields_go_into_the_annotation() {
    let spec: v1beta1::AppSpec = serde_json::from_value(json!({
        "image": "registry.example.com/web", "version": "2",
        "rollout": {"progressDeadline": "1500ms", "historyLimit": 20, "autoRollback": false},
    }))
    .unwrap();
    let mut annotations = Annotations::new();
    let alpha = app_spec_to_v1alpha1(spec, &mut annotations);
    assert_eq!(alpha.progress_deadline_seconds, Some(2), "rounded up");
    assert_eq!(alpha.auto_rollback, Some(false));
    assert_eq!(annotations[ANNOTATION_V1BETA1_FIELDS], r#"{"progressDeadline":"1500ms","historyLimit":20}"#);

    // A deadline v1alpha1 says exactly needs no annotation.
    let spec: v1beta1::AppSpec = serde_json::from_value(json!({
        "image": "web", "version": "2", "rollout": {"progressDeadline": "90s"},
    }))
    .unwrap();
    let mut annotations = Annotations::new();
    assert_eq!(app_spec_to_v1alpha1(spec, &mut annotations).progress_deadline_seconds, Some(90));
    assert!(annotations.is_empty());
}

#[test]
fn a_changed_v1alpha1_deadline_wins_over_the_kept_one() {
    let alpha: v1alpha1::AppSpec =
        serde_json::from_value(json!({"image": "web", "version": "2", "progressDeadlineSeconds": 120})).unwrap();
    let mut annotations = Annotations::from([(
        ANNOTATION_V1BETA1_FIELDS.to_string(),
        r#"{"progressDeadline":"10m","historyLimit":3}"#.to_string(),
    )]);
    let beta = app_spec_to_v1beta1(alpha, &mut annotations);
    assert_eq!(beta.rollout.progress_deadline.as_deref(), Some("120s"));
    assert_eq!(beta.rollout.history_limit, Some(3));
    assert!(annotations.is_empty());
}

#[test]
fn v1alpha1_rollout_fields_move_under_spec_rollout() {
    let start = object(
        ALPHA,
        "App",
        json!({"image": "web", "version": "2", "strategy": {"type": "Canary", "canary": {"steps": [{"weight": 10}]}},
               "progressDeadlineSeconds": 600}),
        &Annotations::new(),
    );
    let beta = convert_object(0, start, BETA).unwrap();
    assert_eq!(beta["apiVersion"], BETA);
    assert_eq!(
        beta["spec"],
        json!({"image": "web", "version": "2", "rollout": {
            "strategy": {"type": "Canary", "canary": {"steps": [{"weight": 10}]}}, "progressDeadline": "600s"}})
    );
    assert!(beta["metadata"].get("annotations").is_none());
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
            vec![app(json!({"image": "web", "version": "1"})), app(json!({"image": 7, "version": "1"}))],
            BETA,
            "object 1 (web): spec cannot be read as flotilla.dev/v1alpha1 App",
        ),
        (
            vec![json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}})],
            BETA,
            "apps/v1 is not a version",
        ),
        (vec![json!({"apiVersion": ALPHA, "kind": "Secret", "metadata": {"name": "s"}})], BETA, "flotilla.dev/Secret"),
        (vec![app(json!(null))], BETA, "spec cannot be read"),
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
