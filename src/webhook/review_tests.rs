//! The streaming answer against the reference conversion (`api::conversion::review`), and the
//! refusals.

use super::*;
use serde_json::{Value, json};

fn review(objects: Vec<Value>, desired: &str) -> Value {
    json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
           "request": {"uid": "u-1", "desiredAPIVersion": desired, "objects": objects}})
}

fn alpha_app(name: &str) -> Value {
    json!({"apiVersion": "flotilla.dev/v1alpha1", "kind": "App",
           "metadata": {"name": name, "namespace": "ns", "annotations": {"a": "b"}},
           "spec": {"image": "registry.example.com/web", "version": "1", "progressDeadlineSeconds": 90,
                    "strategy": {"type": "Canary", "canary": {"steps": [{"weight": 50}]}}},
           "status": {"phase": "Healthy"}})
}

fn beta_app(name: &str) -> Value {
    json!({"apiVersion": "flotilla.dev/v1beta1", "kind": "App", "metadata": {"name": name},
           "spec": {"image": "registry.example.com/web", "version": "2",
                    "rollout": {"progressDeadline": "90s", "historyLimit": 3}}})
}

fn tenant(version: &str) -> Value {
    let spec = if version == "v1alpha1" {
        json!({"namespaces": ["a"], "deleteNamespacesOnRemoval": true})
    } else {
        json!({"namespaces": ["a"], "namespaceRemovalPolicy": "Retain"})
    };
    json!({"apiVersion": format!("flotilla.dev/{version}"), "kind": "Tenant", "metadata": {"name": "t"}, "spec": spec})
}

/// The answer as JSON, and the reference conversion's answer to the same review.
fn both(body: &Value) -> (Value, Value) {
    let bytes = serde_json::to_vec(body).expect("JSON");
    let answer = answer(&bytes).expect("answered");
    let streamed: Value = serde_json::from_slice(&answer.body).expect("the answer is JSON");
    let reference = crate::api::conversion::review(serde_json::from_value(body.clone()).expect("a review"));
    (streamed, serde_json::to_value(reference).expect("JSON"))
}

#[test]
fn answers_like_the_reference_conversion() {
    let cases = [
        ("one object up", review(vec![alpha_app("a")], "flotilla.dev/v1beta1")),
        ("one object down", review(vec![beta_app("b")], "flotilla.dev/v1alpha1")),
        (
            "a list page of mixed kinds and versions",
            review(
                vec![alpha_app("a"), beta_app("b"), tenant("v1alpha1"), tenant("v1beta1"), alpha_app("c")],
                "flotilla.dev/v1beta1",
            ),
        ),
        ("no objects", review(vec![], "flotilla.dev/v1beta1")),
        (
            "an object that cannot be converted",
            review(
                vec![
                    alpha_app("a"),
                    json!({"apiVersion": "flotilla.dev/v1alpha1", "kind": "App", "spec": {"progressDeadlineSeconds": "soon"}}),
                ],
                "flotilla.dev/v1beta1",
            ),
        ),
        ("an unknown desired version", review(vec![alpha_app("a")], "flotilla.dev/v2")),
        ("no request", json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview"})),
    ];
    for (what, body) in cases {
        let (streamed, reference) = both(&body);
        assert_eq!(streamed, reference, "{what}");
    }
}

#[test]
fn a_v1beta1_review_is_answered_as_v1beta1() {
    let mut body = review(vec![alpha_app("a")], "flotilla.dev/v1beta1");
    body["apiVersion"] = json!("apiextensions.k8s.io/v1beta1");
    let (streamed, reference) = both(&body);
    assert_eq!(streamed["apiVersion"], "apiextensions.k8s.io/v1beta1");
    assert_eq!(streamed, reference);
}

#[test]
fn failures_name_the_object_and_count_every_object() {
    let body = review(
        vec![
            alpha_app("a"),
            json!({"apiVersion": "flotilla.dev/v1alpha1", "kind": "App", "spec": {"progressDeadlineSeconds": "soon"}}),
        ],
        "flotilla.dev/v1beta1",
    );
    let answer = answer(&serde_json::to_vec(&body).expect("JSON")).expect("answered");
    assert_eq!(answer.objects, 2);
    let message = answer.failure.expect("a failure");
    assert!(
        message.contains("object 1") && message.contains("spec.progressDeadlineSeconds must be an integer"),
        "{message}"
    );
}

fn refused(body: &[u8]) -> Refused {
    match answer(body) {
        Ok(a) => panic!("answered: {}", String::from_utf8_lossy(&a.body)),
        Err(e) => e,
    }
}

#[test]
fn malformed_bodies_are_refused_with_400() {
    for body in
        [&b"this is not JSON"[..], b"[1,2,3]", br#"{"request": {"uid": "u", "desiredAPIVersion": "v", "objects": 5}}"#]
    {
        let e = refused(body);
        assert_eq!(e.status(), http::StatusCode::BAD_REQUEST, "{e}");
        assert!(e.to_string().contains("JSON"), "{e}");
    }
}

#[test]
fn nesting_deeper_than_serde_jsons_limit_is_refused_with_400() {
    let depth = 100_000;
    let deep = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    let review = |spec: &str| {
        let object =
            format!(r#"{{"apiVersion":"flotilla.dev/v1alpha1","kind":"App","metadata":{{"name":"a"}},"spec":{spec}}}"#);
        format!(r#"{{"request":{{"uid":"u","desiredAPIVersion":"flotilla.dev/v1beta1","objects":[{object}]}}}}"#)
    };
    // In a field of the spec, which the conversion reads as a value.
    let e = refused(review(&format!(r#"{{"image":"x","values":{deep}}}"#)).as_bytes());
    assert!(matches!(e, Refused::MalformedObject { index: 0, .. }), "{e}");
    assert!(e.to_string().contains("recursion limit"), "{e}");
    // As the spec itself: not an object, which the conversion says.
    let answer_of = |body: String| answer(body.as_bytes()).expect("answered");
    let failure = answer_of(review(&deep)).failure.unwrap_or_default();
    assert!(failure.contains("spec must be an object"), "{failure}");
    // In the template, which is kept as its text: converted, nesting and all (scanned
    // iteratively, no stack used).
    let converted = answer_of(review(&format!(r#"{{"image":"x","template":{deep}}}"#)));
    assert_eq!(converted.failure, None);
    assert!(String::from_utf8_lossy(&converted.body).contains(&deep));
    // Nesting in a field the webhook does not read is skipped iteratively (no stack used).
    let body = format!(r#"{{"x":{deep}}}"#);
    let answer = answer(body.as_bytes()).expect("answered");
    assert_eq!(answer.failure.as_deref(), Some("request missing in ConversionReview"));
}

#[test]
fn too_many_objects_are_refused_with_413_at_the_first_past_the_cap() {
    let objects = vec!["{}"; MAX_OBJECTS + 1].join(",");
    let body =
        format!(r#"{{"request":{{"uid":"u","desiredAPIVersion":"flotilla.dev/v1beta1","objects":[{objects}]}}}}"#);
    let e = refused(body.as_bytes());
    assert!(matches!(e, Refused::TooManyObjects), "{e}");
    assert_eq!(e.status(), http::StatusCode::PAYLOAD_TOO_LARGE);
    // Exactly the cap is converted (objects already at the desired version pass through).
    let objects = vec![r#"{"apiVersion":"flotilla.dev/v1beta1","kind":"App"}"#; MAX_OBJECTS].join(",");
    let body =
        format!(r#"{{"request":{{"uid":"u","desiredAPIVersion":"flotilla.dev/v1beta1","objects":[{objects}]}}}}"#);
    let answer = answer(body.as_bytes()).expect("answered");
    assert_eq!((answer.objects, answer.failure), (MAX_OBJECTS, None));
}

#[test]
fn an_object_larger_than_etcd_stores_is_refused_with_413() {
    let values = vec!["0"; OBJECT_LIMIT / 2].join(",");
    let body = format!(
        r#"{{"request":{{"uid":"u","desiredAPIVersion":"flotilla.dev/v1beta1","objects":[{{}},{{"apiVersion":"flotilla.dev/v1alpha1","kind":"App","spec":{{"x":[{values}]}}}}]}}}}"#
    );
    let e = refused(body.as_bytes());
    assert!(matches!(e, Refused::ObjectTooLarge { index: 1, size } if size > OBJECT_LIMIT), "{e}");
    assert_eq!(e.status(), http::StatusCode::PAYLOAD_TOO_LARGE);
}
