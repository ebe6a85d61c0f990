//! End to end, on a cluster of its own (the test loosens the App CRD for a moment): one App
//! stored in a shape the v1beta1 schema refuses blinds neither the dashboard nor `flotilla
//! status`. The dashboard lists it, with why it cannot be read, beside every other App of
//! its namespace, and `flotilla status` shows it instead of failing.
//!
//! Such an App was stored by the v1alpha1 annotation before the webhook checked what it
//! restores (`{"template":"x"}` became `spec.template: "x"`, reproduced on the release
//! before), and stays stored in clusters that ran it. The webhook now refuses that write
//! (tests/conversion.rs), so the test stores the App the way a looser schema would have:
//! the App CRD's `spec.template` accepts anything for the one create, then the CRD is put
//! back as shipped. Every typed reader of Apps fails on it (the test checks that first).

mod support;

use flotilla::api::App;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use std::process::Stdio;
use std::time::Duration;
use support::browser::Dashboard;
use support::{TestNamespace, admin_client, install_crds, kubeconfig, wait_for};
use tokio::io::{AsyncBufReadExt, BufReader};

/// The App CRD with `spec.template` of v1beta1 open to any value (as no release shipped it).
fn loose_app_crd() -> CustomResourceDefinition {
    let crd = flotilla::api::crds().expect("CRDs").into_iter().find(|c| c.spec.names.kind == "App").expect("App CRD");
    let mut value = serde_json::to_value(&crd).expect("CRD JSON");
    let versions = value.pointer_mut("/spec/versions").and_then(Value::as_array_mut).expect("versions");
    let beta = versions.iter_mut().find(|v| v["name"] == "v1beta1").expect("v1beta1");
    let template =
        beta.pointer_mut("/schema/openAPIV3Schema/properties/spec/properties/template").expect("spec.template schema");
    *template = json!({"x-kubernetes-preserve-unknown-fields": true});
    serde_json::from_value(value).expect("a CRD")
}

/// Stores App `name` in `ns` with `spec.template: "x"`, through a loosened CRD that is then
/// put back as shipped.
async fn store_unreadable_app(client: &Client, ns: &str, name: &str) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply("flotilla-tests").force();
    crds.patch("apps.flotilla.dev", &params, &Patch::Apply(&loose_app_crd())).await.expect("loosening the App CRD");
    let apps: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &ApiResource::erase::<App>(&()));
    let broken: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "flotilla.dev/v1beta1", "kind": "App", "metadata": {"name": name},
        "spec": {"image": "registry.example.com/tests/web", "version": "1", "template": "x"},
    }))
    .expect("App");
    // The apiserver takes the new schema up within moments.
    wait_for(Duration::from_secs(30), "an App with spec.template \"x\" stored", || async {
        apps.create(&PostParams::default(), &broken).await.ok().map(|_| ())
    })
    .await;
    install_crds(client).await;
    let stored = apps.get(name).await.expect("the App as stored");
    assert_eq!(stored.data["spec"]["template"], "x", "stored as written");
    let typed = Api::<App>::namespaced(client.clone(), ns).list(&ListParams::default()).await;
    assert!(typed.is_err(), "a typed list of the namespace's Apps fails on it: {typed:?}");
}

async fn create_app(client: &Client, ns: &str, name: &str) {
    let app: App = serde_json::from_value(json!({
        "apiVersion": "flotilla.dev/v1beta1", "kind": "App", "metadata": {"name": name},
        "spec": {"image": format!("registry.example.com/tests/{name}"), "version": "1"},
    }))
    .expect("App");
    Api::<App>::namespaced(client.clone(), ns).create(&PostParams::default(), &app).await.expect("creating an App");
}

/// A page of the dashboard, with its session: status code and body.
async fn page(dashboard: &Dashboard, path: &str) -> (u16, String) {
    let addr = dashboard.url.trim_start_matches("http://");
    let request =
        format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\nCookie: {}={}\r\n\r\n", dashboard.cookie, dashboard.key);
    support::http_exchange(addr, &request).await.unwrap_or_else(|| panic!("no answer from the dashboard at {addr}"))
}

/// `flotilla status <args>`: whether it succeeded, and what it printed.
fn status(args: &[&str]) -> (bool, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .arg("status")
        .args(args)
        .arg("--kubeconfig")
        .arg(kubeconfig())
        .output()
        .expect("running flotilla status");
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_unreadable_app_blinds_neither_the_dashboard_nor_status() {
    support::use_private_cluster("flotilla-test-views");
    let client = admin_client().await;
    install_crds(&client).await;
    let ns = TestNamespace::create(&client, "e2e-views").await;
    create_app(&client, &ns.name, "one").await;
    store_unreadable_app(&client, &ns.name, "broken").await;
    create_app(&client, &ns.name, "two").await;

    // The dashboard, with cluster-admin credentials: every App of the namespace is listed,
    // the unreadable one with why.
    let dashboard = Dashboard::start(kubeconfig(), &["--operator-namespace", &ns.name]).await;
    let rows = ["one", "two", "broken"].map(|app| format!("data-app=\"{}/{app}\"", ns.name));
    let overview = format!("/?namespace={}", ns.name);
    let body = wait_for(Duration::from_secs(60), "the overview listing the namespace's three Apps", || async {
        let (code, body) = page(&dashboard, &overview).await;
        (code == 200 && rows.iter().all(|r| body.contains(r.as_str()))).then_some(body)
    })
    .await;
    assert!(body.contains("spec.template: invalid type: string"), "the row says why: {body}");
    let (code, body) = page(&dashboard, &format!("/apps/{}/broken", ns.name)).await;
    assert_eq!(code, 200, "the unreadable App's page: {body}");
    assert!(body.contains("cannot be read") && body.contains("spec.template"), "{body}");
    let (code, body) = page(&dashboard, &format!("/apps/{}/one", ns.name)).await;
    assert_eq!(code, 200, "another App's page: {body}");

    // `flotilla status`: the unreadable App is shown with why; the others as usual.
    let (ok, out) = status(&["broken", "-n", &ns.name]);
    assert!(ok, "flotilla status of the unreadable App: {out}");
    assert!(out.contains(&format!("App:         {}/broken", ns.name)), "{out}");
    assert!(out.contains("cannot be read") && out.contains("spec.template: invalid type: string"), "{out}");
    let (ok, out) = status(&["one", "-n", &ns.name]);
    assert!(ok && out.contains("Phase:       (not reconciled yet)"), "{out}");

    // And `--watch` shows it too, rather than retrying a failed list forever.
    let mut watch = tokio::process::Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(["status", "broken", "-n", &ns.name, "-w", "--kubeconfig"])
        .arg(kubeconfig())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("flotilla status -w");
    let mut lines = BufReader::new(watch.stdout.take().expect("stdout")).lines();
    let shown = tokio::time::timeout(Duration::from_secs(20), async {
        while let Ok(Some(line)) = lines.next_line().await {
            if line.contains("spec.template") {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(shown, Ok(true), "flotilla status -w showed the unreadable App");
}
