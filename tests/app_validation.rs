//! End to end: the apiserver itself refuses invalid Apps (CRD schema and CEL rules), with a
//! message that names the offending field.

mod support;

use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use serde_json::{Value, json};
use support::{TestNamespace, admin_client, install_crds};

fn app(name: &str, spec: Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "flotilla.dev/v1beta1", "kind": "App",
        "metadata": {"name": name}, "spec": spec,
    }))
    .expect("object")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_apps_are_refused_with_the_field_named() {
    let client = admin_client().await;
    install_crds(&client).await;
    let ns = TestNamespace::create(&client, "e2e-validate").await;
    let ar = ApiResource::erase::<flotilla::api::App>(&());
    let apps: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns.name, &ar);
    let ok = json!({"image": "registry.example.com/team/web", "version": "1.0.0"});
    let with = |patch: Value| {
        let mut spec = ok.clone();
        for (k, v) in patch.as_object().expect("object") {
            if v.is_null() {
                spec.as_object_mut().expect("spec").remove(k);
            } else {
                spec[k] = v.clone();
            }
        }
        spec
    };
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
    let mut failures = Vec::new();
    for (what, name, spec, field) in &cases {
        match apps.create(&PostParams::default(), &app(name, spec.clone())).await {
            Ok(_) => failures.push(format!("{what}: accepted")),
            Err(kube::Error::Api(status)) => {
                if status.code != 422 || !status.message.contains(field) {
                    failures.push(format!("{what}: want 422 naming {field}, got {} {}", status.code, status.message));
                }
            }
            Err(e) => failures.push(format!("{what}: unexpected error {e}")),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} invalid Apps not refused as expected:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );

    // And a valid one is accepted.
    apps.create(&PostParams::default(), &app("fine", ok.clone())).await.expect("a valid App is accepted");
    let bg = with(json!({"rollout": {"strategy": {"type": "BlueGreen", "blueGreen": {"scaleDownDelay": "1h"}}}}));
    apps.create(&PostParams::default(), &app(&"b".repeat(55), bg))
        .await
        .expect("a blue-green App of 55 characters is accepted");
    let routed = with(json!({"rollout": {"strategy": {"type": "Canary", "canary": {"steps": [{"weight": 10}],
        "trafficRouting": {"gatewayAPI": {"httpRoute": "shop.public-v2"}}}}}}));
    apps.create(&PostParams::default(), &app("routed", routed)).await.expect("a routed canary is accepted");
}

/// The sample Apps in deploy/samples are valid (created in a test namespace, dry run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sample_apps_are_valid() {
    let client = admin_client().await;
    install_crds(&client).await;
    let ns = TestNamespace::create(&client, "e2e-samples").await;
    let ar = ApiResource::erase::<flotilla::api::App>(&());
    let apps: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns.name, &ar);
    let text = std::fs::read_to_string(support::repo_root().join("deploy/samples/app.yaml")).expect("samples");
    let mut count = 0;
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let mut obj: DynamicObject = serde::Deserialize::deserialize(doc).expect("sample App YAML");
        obj.metadata.namespace = Some(ns.name.clone());
        let dry = PostParams { dry_run: true, ..PostParams::default() };
        apps.create(&dry, &obj).await.unwrap_or_else(|e| panic!("sample {:?} refused: {e}", obj.metadata.name));
        count += 1;
    }
    assert!(count >= 3, "samples found: {count}");
}

/// The sample Tenants in deploy/samples are valid (dry run: nothing is onboarded).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sample_tenants_are_valid() {
    let client = admin_client().await;
    install_crds(&client).await;
    let ar = ApiResource::erase::<flotilla::api::Tenant>(&());
    let tenants: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
    let text = std::fs::read_to_string(support::repo_root().join("deploy/samples/tenant.yaml")).expect("samples");
    let mut count = 0;
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let obj: DynamicObject = serde::Deserialize::deserialize(doc).expect("sample Tenant YAML");
        let dry = PostParams { dry_run: true, ..PostParams::default() };
        tenants.create(&dry, &obj).await.unwrap_or_else(|e| panic!("sample {:?} refused: {e}", obj.metadata.name));
        count += 1;
    }
    assert!(count >= 2, "samples found: {count}");
}
