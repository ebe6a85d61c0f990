//! At a small scale, in CI: 50 tenant namespaces with 500 Apps, served by 3 replicas
//! authenticated as the operator's ServiceAccount. Every App converges, and once they have,
//! the operator writes nothing (counted in the apiserver audit log). Correctness only, never
//! a timing: `bench/scale.sh` measures.

mod support;

use flotilla::api::{App, AppPhase, NamespaceState, Tenant};
use futures::{StreamExt, stream};
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;
use std::time::Duration;
use support::{Operator, admin_client, audit_log, install_crds, operator_kubeconfig, unique, wait_for};

const TENANTS: usize = 5;
const NAMESPACES_PER_TENANT: usize = 10;
const APPS_PER_NAMESPACE: usize = 10;
/// How long nothing may be written once every App converged.
const IDLE: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_hundred_apps_converge_and_then_the_operator_writes_nothing() {
    support::use_private_cluster("flotilla-test-scale");
    let client = admin_client().await;
    install_crds(&client).await;
    let mut ops = Vec::new();
    for i in 0..3 {
        ops.push(Operator::start_with(&operator_kubeconfig(&format!("scale-{i}")), &[], &format!("scale-{i}")).await);
    }

    let prefix = unique("sc");
    let tenants: Api<Tenant> = Api::all(client.clone());
    let mut namespaces = Vec::new();
    for t in 0..TENANTS {
        let names: Vec<String> = (0..NAMESPACES_PER_TENANT).map(|n| format!("{prefix}-{t}-{n}")).collect();
        namespaces.extend(names.iter().cloned());
        let tenant: Tenant = serde_json::from_value(json!({
            "apiVersion": "flotilla.dev/v1beta1", "kind": "Tenant",
            "metadata": {"name": format!("{prefix}-{t}")}, "spec": {"namespaces": names},
        }))
        .expect("Tenant");
        tenants.create(&PostParams::default(), &tenant).await.expect("creating Tenant");
    }
    wait_for(Duration::from_secs(180), "every namespace onboarded", || async {
        let list = tenants.list(&ListParams::default()).await.ok()?;
        let onboarded = list
            .items
            .iter()
            .filter(|t| t.metadata.name.as_deref().is_some_and(|n| n.starts_with(&prefix)))
            .flat_map(|t| t.status.iter().flat_map(|s| s.namespaces.iter()))
            .filter(|n| n.state == NamespaceState::Onboarded)
            .count();
        (onboarded == namespaces.len()).then_some(())
    })
    .await;

    let apps: Vec<(String, String)> = namespaces
        .iter()
        .flat_map(|ns| (0..APPS_PER_NAMESPACE).map(move |i| (ns.clone(), format!("app-{i}"))))
        .collect();
    let total = apps.len();
    stream::iter(apps)
        .for_each_concurrent(16, |(ns, name)| {
            let client = client.clone();
            async move {
                let app: App = serde_json::from_value(json!({
                    "apiVersion": "flotilla.dev/v1beta1", "kind": "App",
                    "metadata": {"name": name, "namespace": ns},
                    "spec": {"image": "registry.example.com/scale/app", "version": "1", "replicas": 1},
                }))
                .expect("App");
                Api::<App>::namespaced(client, &ns).create(&PostParams::default(), &app).await.expect("creating App");
            }
        })
        .await;

    let ours = |ns: Option<&str>| ns.is_some_and(|n| n.starts_with(&format!("{prefix}-")));
    let all_apps: Api<App> = Api::all(client.clone());
    wait_for(Duration::from_secs(300), &format!("{total} Apps Healthy at their generation"), || async {
        let list = all_apps.list(&ListParams::default()).await.ok()?;
        let converged = list
            .items
            .iter()
            .filter(|a| ours(a.metadata.namespace.as_deref()))
            .filter(|a| {
                a.status.as_ref().is_some_and(|s| {
                    s.phase == Some(AppPhase::Healthy)
                        && s.current_version.as_deref() == Some("1")
                        && s.observed_generation == a.metadata.generation
                })
            })
            .count();
        (converged == total).then_some(())
    })
    .await;
    let deployments: Api<Deployment> = Api::all(client.clone());
    let list = deployments.list(&ListParams::default().labels("app.kubernetes.io/managed-by=flotilla")).await;
    let count = list.expect("Deployments").items.iter().filter(|d| ours(d.metadata.namespace.as_deref())).count();
    assert_eq!(count, total, "one Deployment per App");

    // Idle: nothing changes, so the operator writes nothing in tenant namespaces (its shard
    // Lease renewals in its own namespace are its only writes).
    tokio::time::sleep(Duration::from_secs(5)).await;
    let seen = std::fs::read_to_string(audit_log()).map(|t| t.lines().count()).unwrap_or(0);
    tokio::time::sleep(IDLE).await;
    let text = std::fs::read_to_string(audit_log()).expect("audit log");
    let writes: Vec<String> = text
        .lines()
        .skip(seen)
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["stage"] == "ResponseComplete")
        .filter(|e| matches!(e["verb"].as_str(), Some("create" | "update" | "patch" | "delete")))
        .filter(|e| e["objectRef"]["namespace"] != "flotilla-system")
        .map(|e| format!("{} {} {}", e["verb"], e["requestURI"], e["user"]["username"]))
        .collect();
    assert!(
        writes.is_empty(),
        "{} writes in 30 idle seconds, first: {:?}",
        writes.len(),
        &writes[..writes.len().min(5)]
    );
}
