//! End to end: an App never takes over an object it does not control. A hand-made Service
//! (selector-less, routed to an external database by its own EndpointSlice) and a Deployment
//! that merely carries Flotilla's labels stay exactly as they were when an App of the same
//! name appears; the App reports `NameConflict` naming the object, with one Warning Event,
//! and converges by itself once the object is gone.

mod support;

use flotilla::api::App;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use std::time::Duration;
use support::{Operator, TestNamespace, admin_client, install_crds, wait_for};

fn app(name: &str) -> App {
    serde_json::from_value(json!({
        "apiVersion": "flotilla.dev/v1beta1", "kind": "App",
        "metadata": {"name": name},
        "spec": {"image": format!("registry.example.com/tests/{name}"), "version": "1", "replicas": 1},
    }))
    .expect("valid App")
}

fn ready(app: &App) -> Option<(String, String, String)> {
    app.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

async fn warnings(client: &Client, ns: &str, app: &str, reason: &str) -> Vec<Event> {
    let events: Api<Event> = Api::namespaced(client.clone(), ns);
    events
        .list(&ListParams::default().fields(&format!("regarding.name={app},regarding.kind=App")))
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .collect()
}

/// Waits until App `name` says NameConflict; returns the condition's message.
async fn wait_conflict(apps: &Api<App>, name: &str) -> String {
    wait_for(Duration::from_secs(30), &format!("App {name} reports NameConflict"), || async {
        let app = apps.get(name).await.ok()?;
        let (status, reason, message) = ready(&app)?;
        (status == "False" && reason == "NameConflict").then_some(message)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_made_service_is_never_taken_over_and_the_app_converges_once_it_goes() {
    let client = admin_client().await;
    install_crds(&client).await;
    let ns = TestNamespace::create(&client, "e2e-conflict").await;
    let services: Api<Service> = Api::namespaced(client.clone(), &ns.name);
    let apps: Api<App> = Api::namespaced(client.clone(), &ns.name);
    // The platform's Service `db`: no selector, a named port, endpoints of an external database.
    let db: Service = serde_json::from_value(json!({
        "metadata": {"name": "db", "labels": {"team": "platform"}},
        "spec": {"ports": [{"name": "postgres", "port": 5432, "targetPort": 5432}]},
    }))
    .expect("Service");
    let db = services.create(&PostParams::default(), &db).await.expect("creating Service db");
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), &ns.name);
    let slice: EndpointSlice = serde_json::from_value(json!({
        "metadata": {"name": "db-external", "labels": {"kubernetes.io/service-name": "db"}},
        "addressType": "IPv4",
        "ports": [{"name": "postgres", "port": 5432}],
        "endpoints": [{"addresses": ["10.20.30.40"]}],
    }))
    .expect("EndpointSlice");
    slices.create(&PostParams::default(), &slice).await.expect("creating the external EndpointSlice");
    let _operator = Operator::start(&ns.name).await;
    apps.create(&PostParams::default(), &app("db")).await.expect("creating App db");

    let message = wait_conflict(&apps, "db").await;
    assert!(
        message.contains(&format!("Service {}/db", ns.name)) && message.contains("not controlled by this App"),
        "{message}"
    );
    // Several reconciles later: the Service is exactly as it was, and one Warning says why.
    tokio::time::sleep(Duration::from_secs(12)).await;
    let now = services.get("db").await.expect("Service db");
    assert_eq!(now.resource_version(), db.resource_version(), "the hand-made Service was written: {now:?}");
    assert!(now.spec.as_ref().and_then(|s| s.selector.as_ref()).is_none(), "a selector was added");
    assert!(now.owner_references().is_empty(), "an ownerReference was added");
    let conflicts = warnings(&client, &ns.name, "db", "NameConflict").await;
    assert_eq!(conflicts.len(), 1, "one Warning Event: {conflicts:?}");
    assert!(conflicts[0].series.is_none(), "recorded once, not repeated as a series: {:?}", conflicts[0].series);
    let slice = slices.get("db-external").await.expect("the EndpointSlice");
    assert_eq!(slice.endpoints.as_ref().map(Vec::len), Some(1), "the external endpoints are untouched");

    // The platform retires its Service: the App converges without anyone touching it.
    services.delete("db", &DeleteParams::default()).await.expect("deleting Service db");
    // It looks again every 10 s (a backoff counted from failures grew to a minute within
    // 30 ms of the App's creation, and this wait timed out in CI). Measured 8.1 s; at most 10 s
    // plus a reconcile.
    let deleted = std::time::Instant::now();
    wait_for(Duration::from_secs(25), "App db Healthy with its own Service", || async {
        let app = apps.get("db").await.ok()?;
        let service = services.get_opt("db").await.ok()??;
        let owned = service.owner_references().iter().any(|o| Some(&o.uid) == app.metadata.uid.as_ref());
        (owned && ready(&app).is_some_and(|(s, _, _)| s == "True")).then_some(())
    })
    .await;
    println!("App db converged {:?} after the hand-made Service was deleted", deleted.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_wearing_flotillas_labels_is_not_adopted() {
    let client = admin_client().await;
    install_crds(&client).await;
    let ns = TestNamespace::create(&client, "e2e-conflict-dep").await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    let apps: Api<App> = Api::namespaced(client.clone(), &ns.name);
    // Labelled as Flotilla's (so the operator's cache sees it) but controlled by nothing.
    let labels = json!({"app.kubernetes.io/name": "api", "app.kubernetes.io/managed-by": "flotilla", "flotilla.dev/track": "stable"});
    let api: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "api", "labels": labels},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels},
                              "spec": {"containers": [{"name": "app", "image": "registry.example.com/other/api:9"}]}}},
    }))
    .expect("Deployment");
    let api = deployments.create(&PostParams::default(), &api).await.expect("creating Deployment api");
    let _operator = Operator::start(&ns.name).await;
    apps.create(&PostParams::default(), &app("api")).await.expect("creating App api");
    let message = wait_conflict(&apps, "api").await;
    assert!(message.contains(&format!("Deployment {}/api", ns.name)), "{message}");
    tokio::time::sleep(Duration::from_secs(6)).await;
    let now = deployments.get("api").await.expect("Deployment api");
    assert!(now.owner_references().is_empty(), "an ownerReference was added");
    let image = now.spec.and_then(|s| s.template.spec).and_then(|p| p.containers.first().and_then(|c| c.image.clone()));
    assert_eq!(image.as_deref(), Some("registry.example.com/other/api:9"), "the foreign Deployment was changed");
    assert!(api.resource_version().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preview_service_wearing_flotillas_labels_is_neither_deleted_nor_taken_over() {
    let client = admin_client().await;
    install_crds(&client).await;
    let ns = TestNamespace::create(&client, "e2e-conflict-preview").await;
    let services: Api<Service> = Api::namespaced(client.clone(), &ns.name);
    let apps: Api<App> = Api::namespaced(client.clone(), &ns.name);
    // In the operator's cache (Flotilla's labels) and named like App web's preview Service,
    // but controlled by nothing: a finished rollout's clean-up must not delete it.
    let labels = json!({"app.kubernetes.io/name": "web", "app.kubernetes.io/managed-by": "flotilla"});
    let preview: Service = serde_json::from_value(json!({
        "metadata": {"name": "web-preview", "labels": labels},
        "spec": {"selector": {"team": "other"}, "ports": [{"name": "http", "port": 80, "targetPort": 9000}]},
    }))
    .expect("Service");
    let preview = services.create(&PostParams::default(), &preview).await.expect("creating Service web-preview");
    let _operator = Operator::start(&ns.name).await;
    let mut web = app("web");
    web.spec.rollout.strategy = Some(serde_json::from_value(json!({"type": "BlueGreen"})).expect("strategy"));
    apps.create(&PostParams::default(), &web).await.expect("creating App web");
    wait_for(Duration::from_secs(30), "App web Healthy", || async {
        ready(&apps.get("web").await.ok()?).is_some_and(|(s, _, _)| s == "True").then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let now = services.get_opt("web-preview").await.expect("reading").expect("the Service was deleted");
    assert_eq!(now.resource_version(), preview.resource_version(), "the Service was written: {now:?}");

    // A rollout wants its preview Service: the name is taken, so it says so and writes nothing.
    apps.patch("web", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(json!({"spec": {"version": "2"}})))
        .await
        .expect("patching App web");
    let message = wait_conflict(&apps, "web").await;
    assert!(message.contains(&format!("Service {}/web-preview", ns.name)), "{message}");
    let now = services.get("web-preview").await.expect("Service web-preview");
    assert_eq!(now.resource_version(), preview.resource_version(), "the Service was written: {now:?}");
    assert!(now.owner_references().is_empty(), "an ownerReference was added");
}
