//! End to end, on an apiserver that does not stream a watch's initial state (the WatchList
//! feature turned off, as on Kubernetes before 1.34 or where a platform turns it off): the
//! replica finds that out at start and lists Apps in pages instead, and serves them all the
//! same, those made before it started and after. A control plane of its own (the flag is
//! the apiserver's).

mod support;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, PostParams};
use serde_json::json;
use std::time::Duration;
use support::{Operator, admin_client, install_crds, wait_for};

async fn create_app(client: &kube::Client, namespace: &str, name: &str) {
    let app: flotilla::api::App = serde_json::from_value(json!({
        "apiVersion": "flotilla.dev/v1beta1", "kind": "App", "metadata": {"name": name},
        "spec": {"image": "registry.example.com/web", "version": "1", "replicas": 1}
    }))
    .expect("an App");
    Api::<flotilla::api::App>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &app)
        .await
        .unwrap_or_else(|e| panic!("creating App {namespace}/{name}: {e}"));
}

/// Removes the control plane however the test ends: a cluster of this name left running would
/// be used as it is by the next run.
struct Down;

impl Drop for Down {
    fn drop(&mut self) {
        // Never a panic here (one during a failing test's unwinding would abort it).
        let _ = std::process::Command::new("bash")
            .arg(support::repo_root().join("hack/cluster.sh"))
            .args(["down", support::cluster_name()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apps_are_listed_in_pages_where_the_apiserver_does_not_stream() {
    support::use_private_cluster_with(
        "flotilla-test-no-watchlist",
        &["--extra-args", "kube-apiserver=feature-gates=WatchList=false"],
    );
    let _down = Down;
    let client = admin_client().await;
    install_crds(&client).await;
    let ns = "paged";
    let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}})).expect("namespace");
    let _ = Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &namespace).await;
    // One App before the replica starts (its initial list), one after (its watch).
    create_app(&client, ns, "before").await;
    let operator = Operator::start(ns).await;
    create_app(&client, ns, "after").await;

    let deployments = Api::<Deployment>::namespaced(client.clone(), ns);
    for name in ["before", "after"] {
        wait_for(Duration::from_secs(30), &format!("the Deployment of App {name}"), || async {
            deployments.get_opt(name).await.ok().flatten().map(|_| ())
        })
        .await;
    }
    let log = std::fs::read_to_string(&operator.log).expect("the replica's log");
    assert!(
        log.contains("does not stream initial states") && log.contains("sendInitialEvents"),
        "the replica says it lists in pages, and why (log: {})",
        operator.log.display()
    );
    drop(operator);
}
