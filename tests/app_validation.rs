//! End to end: the apiserver itself refuses invalid Apps (CRD schema and CEL rules), with a
//! message that names the offending field.

mod support;

use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use serde_json::{Value, json};
use support::invalid_apps::{Refused, refused, valid_spec, with};
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
    let ok = valid_spec();
    let cases = refused();
    let mut failures = Vec::new();
    for Refused { what, name, spec, field } in &cases {
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
