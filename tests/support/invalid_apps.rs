//! Apps the apiserver must refuse, each with the field its refusal must name: the cases of
//! `tests/app_validation.rs` (written as v1beta1) and of `tests/conversion.rs` (the same Apps
//! written through v1alpha1, their v1beta1-only fields in the conversion's annotation).

use serde_json::{Value, json};

/// An App the schema (or a CEL rule) refuses.
pub struct Refused {
    pub what: &'static str,
    pub name: String,
    /// The v1beta1 spec.
    pub spec: Value,
    /// The field the refusal names (as v1beta1 names it).
    pub field: &'static str,
}

/// A valid v1beta1 spec: every case is this with one thing wrong.
pub fn valid_spec() -> Value {
    json!({"image": "registry.example.com/team/web", "version": "1.0.0"})
}

/// `valid_spec()` with `patch`'s keys set (a null removes one).
pub fn with(patch: Value) -> Value {
    let mut spec = valid_spec();
    for (k, v) in patch.as_object().expect("object") {
        if v.is_null() {
            spec.as_object_mut().expect("spec").remove(k);
        } else {
            spec[k] = v.clone();
        }
    }
    spec
}

/// A template of `containers`.
fn pod(containers: Value) -> Value {
    with(json!({"template": {"spec": {"containers": containers}}}))
}

/// Every refused App.
pub fn refused() -> Vec<Refused> {
    let ok = valid_spec();
    let long_name = "a".repeat(57);
    let bg_name = "a".repeat(56);
    let cases: Vec<(&str, &str, Value, &str)> = vec![
        ("image with a tag", "tagged", with(json!({"image": "nginx:1.25"})), "spec.image"),
        (
            "image with a digest",
            "digest",
            with(json!({"image": "nginx@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"})),
            "spec.image",
        ),
        ("empty image", "noimage", with(json!({"image": ""})), "spec.image"),
        ("upper-case repository", "upper", with(json!({"image": "registry.example.com/Team/Web"})), "spec.image"),
        ("missing version", "nover", with(json!({"version": null})), "spec.version"),
        ("version starting with a dash", "dash", with(json!({"version": "-1.0"})), "spec.version"),
        ("version with a space", "space", with(json!({"version": "1 0"})), "spec.version"),
        ("negative replicas", "neg", with(json!({"replicas": -1})), "spec.replicas"),
        (
            "65 pod annotations",
            "annotations",
            with(
                json!({"podAnnotations": (0..65).map(|i| (format!("example.com/a{i}"), json!("x"))).collect::<serde_json::Map<_, _>>()}),
            ),
            "spec.podAnnotations",
        ),
        ("too many replicas", "many", with(json!({"replicas": 1001})), "spec.replicas"),
        (
            "replicas and autoscaling together",
            "both",
            with(json!({"replicas": 2, "autoscaling": {"minReplicas": 1, "maxReplicas": 3}})),
            "spec.replicas",
        ),
        (
            "minReplicas zero",
            "minzero",
            with(json!({"autoscaling": {"minReplicas": 0, "maxReplicas": 3}})),
            "spec.autoscaling.minReplicas",
        ),
        (
            "minReplicas above maxReplicas",
            "minmax",
            with(json!({"autoscaling": {"minReplicas": 5, "maxReplicas": 2}})),
            "spec.autoscaling.minReplicas",
        ),
        (
            "CPU target over 100",
            "cpu",
            with(json!({"autoscaling": {"minReplicas": 1, "maxReplicas": 2, "targetCPUUtilizationPercentage": 150}})),
            "spec.autoscaling.targetCPUUtilizationPercentage",
        ),
        (
            "canary without steps",
            "nosteps",
            with(json!({"rollout": {"strategy": {"type": "Canary"}}})),
            "spec.rollout.strategy.canary",
        ),
        (
            "canary weight over 100",
            "weight",
            with(json!({"rollout": {"strategy": {"type": "Canary", "canary": {"steps": [{"weight": 150}]}}}})),
            "spec.rollout.strategy.canary.steps[0].weight",
        ),
        (
            "canary pause not a duration",
            "pause",
            with(
                json!({"rollout": {"strategy": {"type": "Canary", "canary": {"steps": [{"weight": 10, "pause": "soon"}]}}}}),
            ),
            "spec.rollout.strategy.canary.steps[0].pause",
        ),
        (
            "canary steps with a rolling strategy",
            "mixed",
            with(json!({"rollout": {"strategy": {"type": "Rolling", "canary": {"steps": [{"weight": 10}]}}}})),
            "spec.rollout.strategy.canary",
        ),
        (
            "metric without bounds",
            "nobounds",
            with(json!({"rollout": {"analysis": {"metrics": [{"name": "errors", "query": "up"}]}}})),
            "spec.rollout.analysis.metrics[0].max",
        ),
        (
            "metric min above max",
            "minmax2",
            with(
                json!({"rollout": {"analysis": {"metrics": [{"name": "errors", "query": "up", "min": 2, "max": 1}]}}}),
            ),
            "spec.rollout.analysis.metrics[0].min",
        ),
        (
            "duplicate metric names",
            "dup",
            with(
                json!({"rollout": {"analysis": {"metrics": [{"name": "e", "query": "up", "max": 1}, {"name": "e", "query": "up", "max": 1}]}}}),
            ),
            "spec.rollout.analysis.metrics",
        ),
        (
            "analysis interval not a duration",
            "interval",
            with(
                json!({"rollout": {"analysis": {"interval": "often", "metrics": [{"name": "e", "query": "up", "max": 1}]}}}),
            ),
            "spec.rollout.analysis.interval",
        ),
        (
            "Prometheus address not a URL",
            "promurl",
            with(
                json!({"rollout": {"analysis": {"prometheusUrl": "prometheus:9090", "metrics": [{"name": "e", "query": "up", "max": 1}]}}}),
            ),
            "spec.rollout.analysis.prometheusUrl",
        ),
        (
            "failure limit zero",
            "limit",
            with(
                json!({"rollout": {"analysis": {"failureLimit": 0, "metrics": [{"name": "e", "query": "up", "max": 1}]}}}),
            ),
            "spec.rollout.analysis.failureLimit",
        ),
        (
            "progress deadline too short",
            "deadline",
            with(json!({"rollout": {"progressDeadline": "1s"}})),
            "spec.rollout.progressDeadline",
        ),
        (
            "progress deadline too long",
            "deadline2",
            with(json!({"rollout": {"progressDeadline": "2h"}})),
            "spec.rollout.progressDeadline",
        ),
        ("history limit zero", "history", with(json!({"rollout": {"historyLimit": 0}})), "spec.rollout.historyLimit"),
        ("name too long for derived objects", &long_name, ok.clone(), "metadata.name"),
        ("name not a DNS-1035 label", "1app", ok.clone(), "metadata.name"),
        // App web's canary Deployment is web-canary: an App of that name would collide.
        ("name of another App's canary", "web-canary", ok.clone(), "metadata.name"),
        ("name of another App's preview", "web-preview", ok.clone(), "metadata.name"),
        // <name>-preview must stay a valid Service name (63).
        (
            "blue-green name of 56 characters",
            &bg_name,
            with(json!({"rollout": {"strategy": {"type": "BlueGreen"}}})),
            "metadata.name",
        ),
        (
            "blueGreen settings with a canary strategy",
            "bgcanary",
            with(
                json!({"rollout": {"strategy": {"type": "Canary", "canary": {"steps": [{"weight": 10}]}, "blueGreen": {}}}}),
            ),
            "spec.rollout.strategy.blueGreen",
        ),
        (
            "canary steps with a blue-green strategy",
            "bgsteps",
            with(json!({"rollout": {"strategy": {"type": "BlueGreen", "canary": {"steps": [{"weight": 10}]}}}})),
            "spec.rollout.strategy.canary",
        ),
        (
            "scaleDownDelay without a unit",
            "bgunit",
            with(json!({"rollout": {"strategy": {"type": "BlueGreen", "blueGreen": {"scaleDownDelay": "30"}}}})),
            "spec.rollout.strategy.blueGreen.scaleDownDelay",
        ),
        (
            "scaleDownDelay over an hour",
            "bgdelay",
            with(json!({"rollout": {"strategy": {"type": "BlueGreen", "blueGreen": {"scaleDownDelay": "2h"}}}})),
            "spec.rollout.strategy.blueGreen.scaleDownDelay",
        ),
        (
            "an HTTPRoute name that no route can have",
            "routename",
            with(json!({"rollout": {"strategy": {"type": "Canary", "canary": {"steps": [{"weight": 10}],
                "trafficRouting": {"gatewayAPI": {"httpRoute": "Shop_Route"}}}}}})),
            "spec.rollout.strategy.canary.trafficRouting.gatewayAPI.httpRoute",
        ),
        (
            "trafficRouting with an autoscaler",
            "routedhpa",
            with(json!({"replicas": null, "autoscaling": {"minReplicas": 2, "maxReplicas": 4},
                "rollout": {"strategy": {"type": "Canary", "canary": {"steps": [{"weight": 10}],
                "trafficRouting": {"gatewayAPI": {"httpRoute": "shop"}}}}}})),
            "spec.rollout.strategy.canary.trafficRouting",
        ),
        (
            "trafficRouting without a route",
            "routeless",
            with(json!({"rollout": {"strategy": {"type": "Canary", "canary": {"steps": [{"weight": 10}],
                "trafficRouting": {}}}}})),
            "spec.rollout.strategy.canary.trafficRouting.gatewayAPI",
        ),
    ];
    let labels =
        |n: usize| (0..n).map(|i| (format!("example.com/l{i}"), json!("x"))).collect::<serde_json::Map<_, _>>();
    let sidecars = |n: usize| {
        (0..n).map(|i| json!({"name": format!("c{i}"), "image": "registry.example.com/c:1"})).collect::<Vec<_>>()
    };
    let templates: Vec<(&str, &str, Value, &str)> = vec![
        ("a template that is not an object", "tplstring", with(json!({"template": "x"})), "spec.template"),
        ("containers that are not a list", "tpllist", pod(json!("app")), "spec.template.spec.containers"),
        (
            "a container without a name",
            "tplnoname",
            pod(json!([{"args": ["--x"]}])),
            "spec.template.spec.containers[0].name",
        ),
        (
            "a port that is not a number",
            "tplport",
            pod(json!([{"name": "app", "ports": [{"containerPort": "http"}]}])),
            "spec.template.spec.containers[0].ports[0].containerPort",
        ),
        (
            "two containers, none named app",
            "tplnoapp",
            pod(
                json!([{"name": "a", "image": "registry.example.com/a:1"}, {"name": "b", "image": "registry.example.com/b:1"}]),
            ),
            "spec.template.spec.containers",
        ),
        (
            "a main container that sets image",
            "tplimage",
            pod(json!([{"name": "app", "image": "nginx"}])),
            "spec.template.spec.containers",
        ),
        (
            "a sidecar without image",
            "tplsidecar",
            pod(json!([{"name": "app"}, {"name": "proxy"}])),
            "spec.template.spec.containers",
        ),
        ("17 containers", "tplmany", pod(Value::Array(sidecars(17))), "spec.template.spec.containers"),
        (
            "an init container without image",
            "tplinit",
            with(
                json!({"template": {"spec": {"containers": [{"name": "app"}], "initContainers": [{"name": "init"}]}}}),
            ),
            "spec.template.spec.initContainers",
        ),
        (
            "a label Flotilla selects by",
            "tpllabel",
            with(json!({"template": {"metadata": {"labels": {"app.kubernetes.io/name": "other"}}}})),
            "spec.template.metadata.labels",
        ),
        (
            "65 template labels",
            "tpllabels",
            with(json!({"template": {"metadata": {"labels": labels(65)}}})),
            "spec.template.metadata.labels",
        ),
    ];
    cases
        .into_iter()
        .chain(templates)
        .map(|(what, name, spec, field)| Refused { what, name: name.to_string(), spec, field })
        .collect()
}
