//! End to end, against the local control plane: an App becomes a ready Deployment, drift is
//! put back, autoscaling hands replicas to an HPA, a settled App causes no writes, and
//! deleting the App removes what it owned.

mod support;

use flotilla::api::{App, AppPhase};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use std::time::Duration;
use support::{Operator, TestNamespace, admin_client, install_crds, wait_for};

const SETTLE: Duration = Duration::from_secs(60);

async fn setup(prefix: &str) -> (Client, TestNamespace, Operator) {
    let client = admin_client().await;
    install_crds(&client).await;
    let ns = TestNamespace::create(&client, prefix).await;
    let op = Operator::start(&ns.name).await;
    (client, ns, op)
}

async fn create_app(client: &Client, ns: &str, spec: serde_json::Value) -> App {
    let name = spec["name"].as_str().expect("name").to_string();
    let mut body = spec.clone();
    body.as_object_mut().expect("object").remove("name");
    let app: App = serde_json::from_value(json!({
        "apiVersion": "flotilla.dev/v1beta1", "kind": "App",
        "metadata": {"name": name, "namespace": ns},
        "spec": body,
    }))
    .expect("valid App");
    Api::<App>::namespaced(client.clone(), ns).create(&PostParams::default(), &app).await.expect("creating App")
}

async fn wait_healthy(apps: &Api<App>, name: &str, version: &str) -> App {
    wait_for(SETTLE, &format!("App {name} Healthy at {version}"), || async {
        let app = apps.get(name).await.ok()?;
        let s = app.status.as_ref()?;
        (s.phase == Some(AppPhase::Healthy)
            && s.current_version.as_deref() == Some(version)
            && s.observed_generation == app.metadata.generation)
            .then_some(app)
    })
    .await
}

fn image_of(d: &Deployment) -> Option<String> {
    d.spec.as_ref()?.template.spec.as_ref()?.containers.first()?.image.clone()
}

async fn event_reasons(client: &Client, ns: &str, app: &str) -> Vec<String> {
    let events: Api<Event> = Api::namespaced(client.clone(), ns);
    let list = events.list(&ListParams::default()).await.expect("events");
    list.items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(app))
        .filter_map(|e| e.reason)
        .collect()
}

/// Waits until HPA `name` is gone (`what` names the wait).
async fn wait_hpa_gone(hpas: &Api<HorizontalPodAutoscaler>, name: &str, what: &str) {
    wait_for(SETTLE, what, || async { hpas.get_opt(name).await.ok().flatten().is_none().then_some(()) }).await;
}

/// Waits until Deployment `name` asks for `replicas`.
async fn wait_replicas(deployments: &Api<Deployment>, name: &str, replicas: i32) {
    wait_for(SETTLE, &format!("replicas of {name} set to {replicas}"), || async {
        let d = deployments.get(name).await.ok()?;
        (d.spec?.replicas == Some(replicas)).then_some(())
    })
    .await;
}

/// Events are recorded just after the write they describe: poll for them.
async fn wait_event(client: &Client, ns: &str, app: &str, reason: &str) {
    wait_for(Duration::from_secs(10), &format!("Event {reason} on App {app}"), || async {
        event_reasons(client, ns, app).await.iter().any(|r| r == reason).then_some(())
    })
    .await;
}

/// The replica's Event writer against the apiserver: a repeat is a count on the first Event
/// (a merge patch of its `series`, which the apiserver validates), another message is another
/// Event, and a repeat whose Event is gone makes a new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_event_is_one_event_with_a_count_and_another_message_another_event() {
    use flotilla::telemetry::events::EventWriter;
    use k8s_openapi::api::core::v1::ObjectReference;
    use kube::runtime::events::{Event as Note, EventType, Reporter};
    let client = admin_client().await;
    let ns = TestNamespace::create(&client, "events").await;
    let writer =
        EventWriter::new(client.clone(), Reporter { controller: "flotilla".into(), instance: Some("test".into()) });
    let regarding = ObjectReference {
        api_version: Some("flotilla.dev/v1beta1".into()),
        kind: Some("App".into()),
        name: Some("web".into()),
        namespace: Some(ns.name.clone()),
        uid: Some("web-uid".into()),
        ..Default::default()
    };
    let warning = |note: &str| Note {
        type_: EventType::Warning,
        reason: "InvalidSpec".into(),
        note: Some(note.into()),
        action: "Reconcile".into(),
        secondary: None,
    };
    let events: Api<Event> = Api::namespaced(client.clone(), &ns.name);
    // (note, series count) of every Event about the App, sorted by note.
    let seen = || async {
        let mut v: Vec<(String, Option<i32>)> = events
            .list(&ListParams::default())
            .await
            .expect("events")
            .items
            .into_iter()
            .map(|e| (e.note.unwrap_or_default(), e.series.map(|s| s.count)))
            .collect();
        v.sort();
        v
    };
    for _ in 0..3 {
        writer.publish(&warning("replicas: invalid"), &regarding).await.expect("published");
    }
    assert_eq!(seen().await, [("replicas: invalid".to_string(), Some(3))], "one Event, counted three times");
    writer.publish(&warning("image: invalid"), &regarding).await.expect("published");
    assert_eq!(
        seen().await,
        [("image: invalid".to_string(), None), ("replicas: invalid".to_string(), Some(3))],
        "another message is another Event, not a count on the first"
    );
    // The first Event expires (deleted here); its next repeat starts a new one.
    let first = events
        .list(&ListParams::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .find(|e| e.series.is_some())
        .expect("the counted Event");
    events.delete(&first.name_any(), &DeleteParams::default()).await.expect("deleted");
    writer.publish(&warning("replicas: invalid"), &regarding).await.expect("a repeat of a gone Event is sent");
    assert_eq!(seen().await, [("image: invalid".to_string(), None), ("replicas: invalid".to_string(), None)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn app_becomes_a_ready_deployment_and_follows_new_versions() {
    let (client, ns, _op) = setup("e2e-create").await;
    create_app(
        &client,
        &ns.name,
        json!({"name": "web", "image": "registry.example.com/web", "version": "1.0.0", "replicas": 3}),
    )
    .await;
    let apps: Api<App> = Api::namespaced(client.clone(), &ns.name);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);

    let app = wait_healthy(&apps, "web", "1.0.0").await;
    let status = app.status.clone().expect("status");
    assert_eq!(status.ready.as_deref(), Some("3/3"));
    assert_eq!(status.ready_replicas, Some(3));
    let ready = status.conditions.iter().find(|c| c.type_ == "Ready").expect("Ready condition");
    assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("True", "Available"));

    let d = deployments.get("web").await.expect("Deployment web");
    assert_eq!(image_of(&d).as_deref(), Some("registry.example.com/web:1.0.0"));
    let labels = d.labels();
    assert_eq!(labels.get("app.kubernetes.io/name").map(String::as_str), Some("web"));
    assert_eq!(labels.get("app.kubernetes.io/version").map(String::as_str), Some("1.0.0"));
    assert_eq!(labels.get("app.kubernetes.io/managed-by").map(String::as_str), Some("flotilla"));
    let owner = &d.owner_references()[0];
    assert_eq!((owner.kind.as_str(), owner.name.as_str(), owner.controller), ("App", "web", Some(true)));

    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let running = pods.list(&ListParams::default().labels("app.kubernetes.io/name=web")).await.expect("pods");
    let ready_pods = running
        .items
        .iter()
        .filter(|p| {
            p.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
        .count();
    assert_eq!(ready_pods, 3, "pods of the App are Ready");

    apps.patch("web", &PatchParams::default(), &Patch::Merge(json!({"spec": {"version": "1.1.0"}})))
        .await
        .expect("new version");
    wait_healthy(&apps, "web", "1.1.0").await;
    let d = deployments.get("web").await.expect("Deployment web");
    assert_eq!(image_of(&d).as_deref(), Some("registry.example.com/web:1.1.0"));

    for want in ["Updated", "Promoted"] {
        wait_event(&client, &ns.name, "web", want).await;
    }
    // A first deployment is recorded by the App's status, not by Events (app::first_deployment);
    // the Events of 1.1.0 above came after any Event of 1.0.0 would have.
    let reasons = event_reasons(&client, &ns.name, "web").await;
    assert!(
        !reasons.iter().any(|r| r == "Created" || r == "Available"),
        "no Normal Event for the first deployment: {reasons:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_app_costs_its_deployment_its_service_and_one_status_write() {
    let (client, ns, _op) = setup("e2e-writes").await;
    let created = create_app(
        &client,
        &ns.name,
        json!({"name": "lean", "image": "registry.example.com/lean", "version": "1", "replicas": 0}),
    )
    .await;
    // Every write of the App after its creation, from a watch that starts at its creation.
    let apps: Api<App> = Api::namespaced(client.clone(), &ns.name);
    let from = created.resource_version().expect("resourceVersion");
    let params = WatchParams::default().fields("metadata.name=lean").timeout(20);
    let mut stream = apps.watch(&params, &from).await.expect("watching the App").boxed();
    let mut writes: Vec<App> = Vec::new();
    let settled = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(event) = stream.try_next().await.expect("watch") {
            if let WatchEvent::Modified(app) = event {
                let healthy = app.status.as_ref().is_some_and(|s| s.phase == Some(AppPhase::Healthy));
                writes.push(app);
                if healthy {
                    // Anything more written once Healthy would come within this second.
                    let more = tokio::time::timeout(Duration::from_secs(2), stream.try_next()).await;
                    if let Ok(Ok(Some(WatchEvent::Modified(app)))) = more {
                        writes.push(app);
                    }
                    return;
                }
            }
        }
    })
    .await;
    assert!(settled.is_ok(), "App lean not Healthy within 20 s; writes seen: {}", writes.len());
    let phases: Vec<_> = writes.iter().map(|a| a.status.as_ref().and_then(|s| s.phase)).collect();
    // The status waits up to 3 s from the Deployment's creation (app::first_deployment); one
    // whose Deployment took longer on a loaded machine may be written Progressing first.
    let last = writes.last().expect("a status write");
    let ready = last.status.as_ref().and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready")).expect("Ready");
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    let deployment = deployments.get("lean").await.expect("Deployment lean");
    let created_at = deployment.metadata.creation_timestamp.clone().expect("creationTimestamp").0;
    let took = ready.last_transition_time.0.duration_since(created_at).as_secs();
    let once = vec![Some(AppPhase::Healthy)];
    let twice = vec![Some(AppPhase::Progressing), Some(AppPhase::Healthy)];
    assert!(
        phases == once || (took > 2 && phases == twice),
        "the App's writes after its creation (Healthy {took} s after its Deployment): {phases:?}"
    );
    let services: Api<k8s_openapi::api::core::v1::Service> = Api::namespaced(client.clone(), &ns.name);
    assert!(deployments.get_opt("lean").await.expect("get").is_some(), "Deployment lean");
    assert!(services.get_opt("lean").await.expect("get").is_some(), "Service lean");
    let reasons = event_reasons(&client, &ns.name, "lean").await;
    assert!(reasons.is_empty(), "no Event for a first deployment that went well: {reasons:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drift_on_the_deployment_is_put_back() {
    let (client, ns, op) = setup("e2e-drift").await;
    create_app(
        &client,
        &ns.name,
        json!({"name": "api", "image": "registry.example.com/api", "version": "2.0.0", "replicas": 2}),
    )
    .await;
    let apps: Api<App> = Api::namespaced(client.clone(), &ns.name);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    wait_healthy(&apps, "api", "2.0.0").await;

    // What `kubectl scale deployment api --replicas=5` does.
    deployments
        .patch_scale("api", &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": 5}})))
        .await
        .expect("scaling by hand");
    wait_for(Duration::from_secs(10), "replicas put back to 2", || async {
        let d = deployments.get("api").await.ok()?;
        (d.spec?.replicas == Some(2)).then_some(())
    })
    .await;

    // What `kubectl set image deployment/api app=evil:latest` does.
    deployments
        .patch("api", &PatchParams::default(), &Patch::Strategic(json!({"spec": {"template": {"spec": {"containers": [{"name": "app", "image": "evil.example.com/miner:latest"}]}}}})))
        .await
        .expect("editing the image by hand");
    wait_for(Duration::from_secs(10), "image put back", || async {
        let d = deployments.get("api").await.ok()?;
        (image_of(&d).as_deref() == Some("registry.example.com/api:2.0.0")).then_some(())
    })
    .await;

    wait_event(&client, &ns.name, "api", "DriftCorrected").await;
    let metrics = op.metrics().await;
    let corrected = drift_corrections(&metrics, "Deployment");
    assert!(corrected >= 2.0, "two drift corrections counted; metrics:\n{metrics}");
}

/// `flotilla_drift_corrections_total` of `kind` in the operator's `metrics` (0 when absent).
fn drift_corrections(metrics: &str, kind: &str) -> f64 {
    let series = format!("flotilla_drift_corrections_total{{kind=\"{kind}\"}} ");
    metrics.lines().find_map(|l| l.strip_prefix(series.as_str())).and_then(|v| v.trim().parse().ok()).unwrap_or(0.0)
}

/// The Service cache keeps a projection (`app::service_projection`): a hand edit of what it
/// compares must still show through it and be put back: a selector key added (the Service
/// then selects no pod), and a port moved, which server-side apply cannot take back from
/// another writer (`app::service_routing`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drift_on_the_service_is_put_back() {
    let (client, ns, op) = setup("e2e-svc-drift").await;
    create_app(&client, &ns.name, json!({"name": "web", "image": "registry.example.com/web", "version": "1.0.0"}))
        .await;
    let apps: Api<App> = Api::namespaced(client.clone(), &ns.name);
    let services: Api<Service> = Api::namespaced(client.clone(), &ns.name);
    wait_healthy(&apps, "web", "1.0.0").await;
    let original = services.get("web").await.expect("the App's Service");
    let spec_of = |s: &Service| {
        let spec = s.spec.clone().unwrap_or_default();
        let ports =
            spec.ports.unwrap_or_default().into_iter().map(|p| (p.name, p.port, p.target_port)).collect::<Vec<_>>();
        (spec.selector, ports)
    };
    let want = spec_of(&original);

    // A selector that matches no pod any more, and the port moved, by hand.
    services
        .patch("web", &PatchParams::default(), &Patch::Merge(json!({"spec": {"selector": {"hijack": "x"}}})))
        .await
        .expect("editing the selector by hand");
    wait_for(Duration::from_secs(10), "selector put back", || async {
        let s = services.get("web").await.ok()?;
        (spec_of(&s) == want).then_some(())
    })
    .await;
    let mut ports = original.spec.clone().unwrap_or_default().ports.unwrap_or_default();
    ports[0].port = 8081;
    services
        .patch("web", &PatchParams::default(), &Patch::Merge(json!({"spec": {"ports": ports}})))
        .await
        .expect("editing the port by hand");
    wait_for(Duration::from_secs(10), "port put back", || async {
        let s = services.get("web").await.ok()?;
        (spec_of(&s) == want).then_some(())
    })
    .await;

    wait_event(&client, &ns.name, "web", "DriftCorrected").await;
    // The Service is seen put back as soon as the write lands; the reconcile counts the
    // correction just after it, so the count is read until it shows (or 10 s pass).
    let mut metrics = String::new();
    for _ in 0..50 {
        metrics = op.metrics().await;
        if drift_corrections(&metrics, "Service") >= 2.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let corrected = drift_corrections(&metrics, "Service");
    assert!(corrected >= 2.0, "two drift corrections of the Service counted; metrics:\n{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn autoscaling_hands_replicas_to_an_hpa_and_back() {
    let (client, ns, _op) = setup("e2e-hpa").await;
    create_app(
        &client,
        &ns.name,
        json!({"name": "worker", "image": "registry.example.com/worker", "version": "3.0.0",
        "autoscaling": {"minReplicas": 2, "maxReplicas": 4, "targetCPUUtilizationPercentage": 70}}),
    )
    .await;
    let apps: Api<App> = Api::namespaced(client.clone(), &ns.name);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    let hpas: Api<HorizontalPodAutoscaler> = Api::namespaced(client.clone(), &ns.name);

    let hpa = wait_for(SETTLE, "HPA worker", || async { hpas.get_opt("worker").await.ok().flatten() }).await;
    let spec = hpa.spec.clone();
    assert_eq!((spec.min_replicas, spec.max_replicas), (Some(2), 4));
    assert_eq!(spec.scale_target_ref.name, "worker");
    assert_eq!(hpa.owner_references()[0].kind, "App");

    // The HPA controller raises the Deployment to minReplicas; the operator must not fight it.
    wait_for(SETTLE, "HPA scales the Deployment to its minimum", || async {
        let d = deployments.get("worker").await.ok()?;
        (d.spec?.replicas == Some(2)).then_some(())
    })
    .await;
    wait_healthy(&apps, "worker", "3.0.0").await;
    let d = deployments.get("worker").await.expect("deployment");
    let ours_owns_replicas = d
        .managed_fields()
        .iter()
        .filter(|m| m.manager.as_deref() == Some("flotilla"))
        .any(|m| m.fields_v1.as_ref().is_some_and(|f| f.0.to_string().contains("\"f:replicas\"")));
    assert!(!ours_owns_replicas, "the operator does not own spec.replicas while an HPA does");

    // Back to a fixed count: the HPA goes away.
    apps.patch("worker", &PatchParams::default(), &Patch::Merge(json!({"spec": {"autoscaling": null, "replicas": 3}})))
        .await
        .expect("turning autoscaling off");
    wait_hpa_gone(&hpas, "worker", "HPA deleted").await;
    wait_replicas(&deployments, "worker", 3).await;
}

/// HPAs are watched only in namespaces that need them (`watch_cache::OnDemand`). Autoscaling
/// turned off while no replica ran leaves an HPA that no App asks for: the next replica must
/// still find it and delete it, or it would go on scaling the Deployment against the App.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_hpa_left_while_no_replica_ran_is_deleted() {
    let (client, ns, mut op) = setup("e2e-hpa-left").await;
    create_app(
        &client,
        &ns.name,
        json!({"name": "batch", "image": "registry.example.com/batch", "version": "1.0.0",
        "autoscaling": {"minReplicas": 1, "maxReplicas": 3}}),
    )
    .await;
    let apps: Api<App> = Api::namespaced(client.clone(), &ns.name);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    let hpas: Api<HorizontalPodAutoscaler> = Api::namespaced(client.clone(), &ns.name);
    wait_for(SETTLE, "HPA batch", || async { hpas.get_opt("batch").await.ok().flatten() }).await;
    wait_healthy(&apps, "batch", "1.0.0").await;

    op.child.kill().await.expect("stopping the replica");
    apps.patch("batch", &PatchParams::default(), &Patch::Merge(json!({"spec": {"autoscaling": null, "replicas": 2}})))
        .await
        .expect("turning autoscaling off");
    let _op = Operator::start_with(
        support::kubeconfig(),
        &["--namespace", &ns.name, "--conversion-webhook=false"],
        &format!("e2e-{}-again", ns.name),
    )
    .await;
    wait_hpa_gone(&hpas, "batch", "the left HPA deleted").await;
    wait_replicas(&deployments, "batch", 2).await;
}

/// In a namespace where no App autoscales, HPAs are not watched. One of Flotilla's HPAs made
/// there by another writer (an earlier owner's late create) is still found at the App's next
/// spec change, and deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_hpa_made_while_hpas_are_not_watched_is_deleted_at_the_next_change() {
    let (client, ns, mut op) = setup("e2e-hpa-late").await;
    let app = create_app(
        &client,
        &ns.name,
        json!({"name": "batch", "image": "registry.example.com/batch", "version": "1.0.0", "replicas": 1}),
    )
    .await;
    let apps: Api<App> = Api::namespaced(client.clone(), &ns.name);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    let hpas: Api<HorizontalPodAutoscaler> = Api::namespaced(client.clone(), &ns.name);
    wait_healthy(&apps, "batch", "1.0.0").await;

    let late: HorizontalPodAutoscaler = serde_json::from_value(json!({
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "batch", "labels": {"app.kubernetes.io/managed-by": "flotilla"},
            "ownerReferences": [{"apiVersion": "flotilla.dev/v1beta1", "kind": "App", "name": "batch",
                "uid": app.uid().expect("uid"), "controller": true, "blockOwnerDeletion": true}]},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "batch"},
            "minReplicas": 1, "maxReplicas": 3}
    }))
    .expect("HPA");
    hpas.create(&PostParams::default(), &late).await.expect("creating the late HPA");
    apps.patch("batch", &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": 2}})))
        .await
        .expect("changing the App");
    wait_hpa_gone(&hpas, "batch", "the late HPA deleted").await;
    wait_replicas(&deployments, "batch", 2).await;

    // The same HPA there when a replica starts, with no spec change to look for it: the
    // start's probe finds it, and the App's first reconcile deletes it.
    op.child.kill().await.expect("stopping the replica");
    hpas.create(&PostParams::default(), &late).await.expect("creating the HPA again");
    let _op = Operator::start_with(
        support::kubeconfig(),
        &["--namespace", &ns.name, "--conversion-webhook=false"],
        &format!("e2e-{}-again", ns.name),
    )
    .await;
    wait_hpa_gone(&hpas, "batch", "the HPA found at start deleted").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settled_app_is_reconciled_100_times_without_a_write() {
    let (client, ns, _op) = setup("e2e-nowrite").await;
    create_app(
        &client,
        &ns.name,
        json!({"name": "quiet", "image": "registry.example.com/quiet", "version": "1.0.0",
        "autoscaling": {"minReplicas": 2, "maxReplicas": 3}}),
    )
    .await;
    create_app(
        &client,
        &ns.name,
        json!({"name": "still", "image": "registry.example.com/still", "version": "1.0.0", "replicas": 2}),
    )
    .await;
    let apps: Api<App> = Api::namespaced(client.clone(), &ns.name);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    let hpas: Api<HorizontalPodAutoscaler> = Api::namespaced(client.clone(), &ns.name);
    wait_healthy(&apps, "quiet", "1.0.0").await;
    wait_healthy(&apps, "still", "1.0.0").await;
    // Let the HPA controller write its status once before taking the snapshot.
    tokio::time::sleep(Duration::from_secs(3)).await;

    let versions = || async {
        let mut v = Vec::new();
        for name in ["quiet", "still"] {
            v.push((format!("App/{name}"), apps.get(name).await.expect("app").resource_version()));
            v.push((format!("Deployment/{name}"), deployments.get(name).await.expect("deployment").resource_version()));
        }
        // The HPA's generation, not its resourceVersion: the HPA controller writes its status
        // whenever it syncs (on a loaded machine, well after the first one).
        let hpa = hpas.get("quiet").await.expect("hpa");
        v.push(("HPA/quiet generation".to_string(), hpa.metadata.generation.map(|g| g.to_string())));
        v
    };
    let before = versions().await;
    let status_before = serde_json::to_string(&apps.get("quiet").await.expect("app").status).unwrap_or_default();

    // A second reconciler in this process, with its own caches, driven by hand.
    let scope = flotilla::app::controller::Scope::Namespace(ns.name.clone());
    let reporter = kube::runtime::events::Reporter { controller: "flotilla".into(), instance: Some("test".into()) };
    let events = flotilla::telemetry::events::EventWriter::new(client.clone(), reporter);
    let metrics = flotilla::telemetry::Metrics::new().expect("metrics");
    let analyzer = flotilla::rollout::Analyzer::new(None, Default::default()).expect("analyzer");
    let shared = flotilla::app::controller::Shared {
        events,
        metrics,
        analyzer,
        slots: None,
        pod_policy: Default::default(),
        streaming_lists: false,
        reconciles_per_namespace: 0,
    };
    let (ctx, streams) = flotilla::app::controller::context(client.clone(), &scope, shared, None, None);
    use futures::StreamExt;
    tokio::spawn(streams.deployments.for_each(|_| async {}));
    tokio::spawn(streams.hpas.for_each(|_| async {}));
    tokio::spawn(streams.services.for_each(|_| async {}));
    tokio::spawn(streams.config_maps.for_each(|_| async {}));
    // Read as the App cache reads them.
    let cache_reads = scope.api::<flotilla::watch_cache::Compact<App>>(&client);
    for name in ["quiet", "still"] {
        for _ in 0..100 {
            let cached = cache_reads.get(name).await.expect("app");
            flotilla::app::reconcile::reconcile(std::sync::Arc::new(cached), ctx.clone()).await.expect("reconcile");
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = versions().await;
    let status_after = serde_json::to_string(&apps.get("quiet").await.expect("app").status).unwrap_or_default();
    assert_eq!(
        before, after,
        "no object was written by 200 reconciles of settled Apps; status of quiet before: {status_before}\nafter: {status_after}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_the_app_removes_its_deployment_and_hpa() {
    let (client, ns, _op) = setup("e2e-delete").await;
    create_app(
        &client,
        &ns.name,
        json!({"name": "gone", "image": "registry.example.com/gone", "version": "1",
        "autoscaling": {"minReplicas": 1, "maxReplicas": 2}}),
    )
    .await;
    let apps: Api<App> = Api::namespaced(client.clone(), &ns.name);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    let hpas: Api<HorizontalPodAutoscaler> = Api::namespaced(client.clone(), &ns.name);
    wait_for(SETTLE, "Deployment and HPA", || async {
        let d = deployments.get_opt("gone").await.ok().flatten();
        let h = hpas.get_opt("gone").await.ok().flatten();
        (d.is_some() && h.is_some()).then_some(())
    })
    .await;
    apps.delete("gone", &DeleteParams::foreground()).await.expect("deleting App");
    wait_for(SETTLE, "Deployment and HPA garbage-collected", || async {
        let d = deployments.get_opt("gone").await.ok().flatten();
        let h = hpas.get_opt("gone").await.ok().flatten();
        (d.is_none() && h.is_none()).then_some(())
    })
    .await;
}
