//! End to end, on a cluster of its own: App and Tenant served as v1beta1 (stored) and v1alpha1
//! (deprecated), converted by the webhook the operator replicas serve on 127.0.0.1 (all on one
//! port, SO_REUSEPORT). Objects written in one version read back in the other; kubectl prints
//! the deprecation warning; an App written as v1alpha1 is reconciled exactly like one written
//! as v1beta1; v1beta1-only fields survive a v1alpha1 write; the webhook survives the loss of
//! a replica and answers malformed requests with an error; `flotilla migrate-storage` leaves
//! every object stored at v1beta1 and only v1beta1 in status.storedVersions.
//!
//! The tests of this binary change the CRDs, so they take turns (`SERIAL`).

mod support;

use flotilla::api::{App, AppPhase, v1alpha1};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use std::time::Duration;
use support::{Operator, TestNamespace, admin_client, install_crds_converted_by, kubeconfig, kubectl_try, wait_for};

const PORT: u16 = 9444;
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn url() -> String {
    format!("https://127.0.0.1:{PORT}/convert")
}

async fn cluster() -> Client {
    support::use_private_cluster("flotilla-test-conversion");
    let client = admin_client().await;
    support::install_operator_rbac();
    install_crds_converted_by(&client, Some(&url())).await;
    client
}

/// A replica reconciling `namespace` (admin credentials) and serving the webhook.
async fn replica(namespace: &str, id: &str) -> Operator {
    let addr = format!("127.0.0.1:{PORT}");
    let url = url();
    Operator::start_with(
        kubeconfig(),
        &["--namespace", namespace, "--webhook-addr", &addr, "--webhook-url", &url],
        &format!("conv-{id}"),
    )
    .await
}

/// Waits until both CRDs call the webhook with its certificate, and a v1alpha1 list converts.
async fn webhook_in_use(client: &Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for name in ["apps.flotilla.dev", "tenants.flotilla.dev"] {
        wait_for(Duration::from_secs(30), &format!("{name} converted by {}", url()), || {
            let crds = crds.clone();
            async move {
                let crd = crds.get(name).await.ok()?;
                let config = crd.spec.conversion?.webhook?.client_config?;
                (config.url.as_deref() == Some(url().as_str()) && config.ca_bundle.is_some()).then_some(())
            }
        })
        .await;
    }
    let alpha: Api<v1alpha1::App> = Api::all(client.clone());
    wait_for(Duration::from_secs(30), "a v1alpha1 list through the webhook", || {
        let alpha = alpha.clone();
        async move { alpha.list(&ListParams::default()).await.ok() }
    })
    .await;
}

fn alpha_api(client: &Client, ns: &str, kind: &str) -> Api<DynamicObject> {
    let (plural, namespaced) = if kind == "App" { ("apps", true) } else { ("tenants", false) };
    let ar = ApiResource {
        group: "flotilla.dev".into(),
        version: "v1alpha1".into(),
        api_version: "flotilla.dev/v1alpha1".into(),
        kind: kind.into(),
        plural: plural.into(),
    };
    if namespaced { Api::namespaced_with(client.clone(), ns, &ar) } else { Api::all_with(client.clone(), &ar) }
}

fn write_temp(name: &str, text: &str) -> String {
    let path = std::env::temp_dir().join(format!("flotilla-conv-{}-{name}", std::process::id()));
    std::fs::write(&path, text).expect("temp file");
    path.display().to_string()
}

/// Objects the replica converted, from its metrics.
fn converted_ok(metrics: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("flotilla_conversions_total{result=\"ok\"} "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

async fn healthy(apps: &Api<App>, name: &str) -> App {
    wait_for(Duration::from_secs(60), &format!("App {name} Healthy"), || async {
        let app = apps.get(name).await.ok()?;
        let s = app.status.as_ref()?;
        (s.phase == Some(AppPhase::Healthy) && s.observed_generation == app.metadata.generation).then_some(app.clone())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_version_reads_the_other_and_both_reconcile_alike() {
    let _turn = SERIAL.lock().await;
    let client = cluster().await;
    let ns = TestNamespace::create(&client, "e2e-conv").await;
    let _a = replica(&ns.name, "a").await;
    let _b = replica("conversion-idle", "b").await;
    webhook_in_use(&client).await;

    // Written as v1alpha1 with kubectl, which prints the deprecation warning.
    let old = format!(
        "apiVersion: flotilla.dev/v1alpha1\nkind: App\nmetadata: {{name: old, namespace: {}}}\n\
         spec:\n  image: registry.example.com/tests/web\n  version: \"1\"\n  replicas: 2\n  progressDeadlineSeconds: 120\n\
         \x20 strategy: {{type: Canary, canary: {{steps: [{{weight: 50, pause: 1m}}]}}}}\n",
        ns.name
    );
    let (ok, out) = kubectl_try(&["apply", "-f", &write_temp("old.yaml", &old)]);
    assert!(ok, "kubectl apply of a v1alpha1 App: {out}");
    assert!(
        out.contains("Warning: flotilla.dev/v1alpha1 App is deprecated: use flotilla.dev/v1beta1"),
        "kubectl shows the deprecation warning: {out}"
    );

    // The same App written as v1beta1.
    let apps: Api<App> = Api::namespaced(client.clone(), &ns.name);
    let new: App = serde_json::from_value(json!({
        "apiVersion": "flotilla.dev/v1beta1", "kind": "App", "metadata": {"name": "new"},
        "spec": {"image": "registry.example.com/tests/web", "version": "1", "replicas": 2,
                 "rollout": {"progressDeadline": "120s",
                             "strategy": {"type": "Canary", "canary": {"steps": [{"weight": 50, "pause": "1m"}]}}}},
    }))
    .expect("App");
    apps.create(&PostParams::default(), &new).await.expect("creating the v1beta1 App");

    // Each reads as the other version.
    let old_beta = apps.get("old").await.expect("v1alpha1 App read as v1beta1");
    assert_eq!(old_beta.spec.rollout, new.spec.rollout, "v1alpha1 rollout fields under spec.rollout");
    let alpha: Api<v1alpha1::App> = Api::namespaced(client.clone(), &ns.name);
    let new_alpha = alpha.get("new").await.expect("v1beta1 App read as v1alpha1");
    assert_eq!(new_alpha.spec.progress_deadline_seconds, Some(120));
    assert_eq!(new_alpha.spec.strategy, new.spec.rollout.strategy);
    assert_eq!(alpha.get("old").await.expect("v1alpha1 read back").spec, new_alpha.spec, "same spec either way");

    // Server-side apply across versions: the apiserver converts the managed field sets of
    // both versions, partial objects without the required fields, through the webhook.
    let (ok, out) = kubectl_try(&[
        "apply",
        "--server-side",
        "-f",
        &write_temp("old-ssa.yaml", &old.replace("replicas: 2", "replicas: 3")),
    ]);
    assert!(ok, "server-side apply as v1alpha1: {out}");
    let beta_manifest = format!(
        "apiVersion: flotilla.dev/v1beta1\nkind: App\nmetadata: {{name: old, namespace: {}}}\n\
         spec:\n  image: registry.example.com/tests/web\n  version: \"1\"\n  replicas: 2\n\
         \x20 rollout: {{progressDeadline: 120s, strategy: {{type: Canary, canary: {{steps: [{{weight: 50, pause: 1m}}]}}}}}}\n",
        ns.name
    );
    let (ok, out) = kubectl_try(&[
        "apply",
        "--server-side",
        "--force-conflicts",
        "-f",
        &write_temp("old-beta.yaml", &beta_manifest),
    ]);
    assert!(ok, "server-side apply as v1beta1 over a v1alpha1 manager: {out}");
    assert_eq!(alpha.get("old").await.expect("read as v1alpha1").spec.replicas, Some(2));

    // Reconciled alike: same Deployment apart from the names.
    healthy(&apps, "old").await;
    healthy(&apps, "new").await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    let shape = |d: Deployment| {
        let spec = d.spec.expect("spec");
        let pod = spec.template.spec.expect("pod spec");
        (spec.replicas, spec.progress_deadline_seconds, spec.strategy, pod.containers[0].image.clone())
    };
    assert_eq!(
        shape(deployments.get("old").await.expect("Deployment old")),
        shape(deployments.get("new").await.expect("Deployment new"))
    );

    // Fields only v1beta1 has survive a write through v1alpha1.
    apps.patch(
        "new",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"rollout": {"historyLimit": 3, "progressDeadline": "2m"}}})),
    )
    .await
    .expect("setting v1beta1-only fields");
    let seen = alpha.get("new").await.expect("read as v1alpha1");
    assert_eq!(seen.spec.progress_deadline_seconds, Some(120));
    assert_eq!(
        seen.metadata.annotations.as_ref().and_then(|a| a.get("flotilla.dev/v1beta1-fields")).map(String::as_str),
        Some(r#"{"progressDeadline":"2m","historyLimit":3}"#)
    );
    alpha_api(&client, &ns.name, "App")
        .patch("new", &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": 3}})))
        .await
        .expect("a write through v1alpha1");
    let back = apps.get("new").await.expect("read as v1beta1");
    assert_eq!(back.spec.replicas, Some(3));
    assert_eq!(back.spec.rollout.history_limit, Some(3));
    assert_eq!(back.spec.rollout.progress_deadline.as_deref(), Some("2m"));
    assert!(
        !back.metadata.annotations.unwrap_or_default().contains_key("flotilla.dev/v1beta1-fields"),
        "the v1beta1 object carries no conversion annotation"
    );
}

/// The name a v1alpha1 refusal gives the field v1beta1 names `field`.
fn v1alpha1_field(field: &str) -> String {
    match field {
        "spec.rollout.progressDeadline" => "spec.progressDeadlineSeconds".to_string(),
        "spec.rollout.historyLimit" => field.to_string(),
        _ => field.replacen("spec.rollout.", "spec.", 1),
    }
}

/// Every App the apiserver refuses as v1beta1 (`tests/app_validation.rs`), written through
/// v1alpha1 the way a v1alpha1 client writes what it read (its v1beta1-only fields in the
/// conversion's annotation), is refused too, naming the field, and nothing is stored. The
/// apiserver checks a v1alpha1 write against the v1alpha1 schema only and stores the
/// webhook's v1beta1 body as it is: an annotation `{"template":"x"}` was stored as an App
/// with `spec.template: "x"`, which no typed reader of Apps can read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1alpha1_writes_store_nothing_v1beta1_refuses() {
    let _turn = SERIAL.lock().await;
    let client = cluster().await;
    let ns = TestNamespace::create(&client, "e2e-conv-refuse").await;
    let _webhook = replica("conversion-idle", "refuse").await;
    webhook_in_use(&client).await;
    let alpha = alpha_api(&client, &ns.name, "App");
    let stored: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns.name, &ApiResource::erase::<App>(&()));
    let cases = support::invalid_apps::refused();
    let mut failures = Vec::new();
    for case in &cases {
        let beta = json!({"apiVersion": "flotilla.dev/v1beta1", "kind": "App",
            "metadata": {"name": case.name, "namespace": ns.name}, "spec": case.spec});
        let down = flotilla::api::conversion::convert_object(0, beta, "flotilla.dev/v1alpha1")
            .unwrap_or_else(|e| panic!("{}: converting it down: {e}", case.what));
        let object: DynamicObject = serde_json::from_value(down).expect("a v1alpha1 App");
        let field = v1alpha1_field(case.field);
        match alpha.create(&PostParams::default(), &object).await {
            Ok(_) => failures.push(format!("{}: accepted", case.what)),
            Err(kube::Error::Api(s)) if s.message.contains(&field) || s.message.contains(case.field) => {}
            Err(e) => failures.push(format!("{}: refused without naming {field}: {e}", case.what)),
        }
        if let Ok(Some(app)) = stored.get_opt(&case.name).await {
            failures.push(format!("{}: stored as {}", case.what, serde_json::to_string(&app.data).unwrap_or_default()));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} Apps v1beta1 refuses were not refused through v1alpha1:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );

    // What v1beta1 accepts still goes through the annotation, and reads back typed.
    let template = json!({"spec": {"containers": [{"name": "app", "args": ["--port=8080"]},
        {"name": "proxy", "image": "registry.example.com/proxy:1"}]}});
    let kept = json!({"template": template, "historyLimit": 3}).to_string();
    let good: DynamicObject = serde_json::from_value(json!({"apiVersion": "flotilla.dev/v1alpha1", "kind": "App",
        "metadata": {"name": "kept", "annotations": {"flotilla.dev/v1beta1-fields": kept}},
        "spec": {"image": "registry.example.com/tests/web", "version": "1"}}))
    .expect("App");
    alpha.create(&PostParams::default(), &good).await.expect("a valid template through v1alpha1");
    let back = Api::<App>::namespaced(client.clone(), &ns.name).get("kept").await.expect("read as a typed v1beta1 App");
    assert_eq!(serde_json::to_value(&back.spec.template).expect("template"), template);
    assert_eq!(back.spec.rollout.history_limit, Some(3));

    // A template as the apiserver stored it at v1beta1 (probes, volumes, scheduling, numbers
    // for quantities and ports by name) comes back through every v1alpha1 write of its App.
    let rich = json!({"metadata": {"labels": {"team": "payments"}}, "spec": {
        "containers": [{"name": "app", "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
            "resources": {"requests": {"cpu": 1, "memory": "128Mi"}},
            "readinessProbe": {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 5},
            "volumeMounts": [{"name": "config", "mountPath": "/etc/app"}]},
            {"name": "proxy", "image": "registry.example.com/proxy:1", "securityContext": {"runAsUser": 10001}}],
        "volumes": [{"name": "config", "configMap": {"name": "app-config"}}, {"name": "tmp", "emptyDir": {}}],
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "shop", "effect": "NoSchedule"}],
        "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100,
            "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"team": "payments"}}}}]}},
        "terminationGracePeriodSeconds": 45}});
    let beta: App = serde_json::from_value(json!({"apiVersion": "flotilla.dev/v1beta1", "kind": "App",
        "metadata": {"name": "rich"}, "spec": {"image": "registry.example.com/tests/web", "version": "1", "template": rich}}))
    .expect("App");
    let apps = Api::<App>::namespaced(client.clone(), &ns.name);
    apps.create(&PostParams::default(), &beta).await.expect("a v1beta1 App with a template");
    let before = apps.get("rich").await.expect("read").spec.template;
    alpha
        .patch("rich", &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": 2}})))
        .await
        .expect("a v1alpha1 write of an App with a stored template");
    let after = apps.get("rich").await.expect("read back");
    assert_eq!((after.spec.replicas, after.spec.template), (Some(2), before), "the template as it was");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_survives_a_lost_replica_and_refuses_malformed_requests() {
    let _turn = SERIAL.lock().await;
    let client = cluster().await;
    let ns = TestNamespace::create(&client, "e2e-conv-ha").await;
    let mut replicas = vec![replica("conversion-idle", "ha-1").await, replica("conversion-idle", "ha-2").await];
    webhook_in_use(&client).await;
    let apps: Api<App> = Api::namespaced(client.clone(), &ns.name);
    for i in 0..3 {
        let app: App = serde_json::from_value(json!({
            "apiVersion": "flotilla.dev/v1beta1", "kind": "App", "metadata": {"name": format!("web-{i}")},
            "spec": {"image": "registry.example.com/tests/web", "version": "1"},
        }))
        .expect("App");
        apps.create(&PostParams::default(), &app).await.expect("creating App");
    }
    let alpha: Api<v1alpha1::App> = Api::namespaced(client.clone(), &ns.name);

    // Writes through v1alpha1 convert every time (reads are served from the apiserver's cache,
    // converted once per change).
    let alpha_writes = alpha_api(&client, &ns.name, "App");
    let write = |i: i32| {
        let alpha_writes = alpha_writes.clone();
        async move {
            alpha_writes
                .patch(
                    &format!("web-{}", i % 3),
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"replicas": i % 5}})),
                )
                .await
        }
    };
    // Lose the replica that has been answering (the apiserver keeps its connections open).
    for i in 0..5 {
        write(i).await.expect("a v1alpha1 write");
    }
    let mut served = Vec::new();
    for r in &replicas {
        served.push(converted_ok(&r.metrics().await));
    }
    assert!(served.iter().sum::<u64>() >= 5, "conversions counted: {served:?}");
    let busiest = if served[0] >= served[1] { 0 } else { 1 };
    let mut lost = replicas.remove(busiest);
    lost.child.start_kill().expect("kill -9 of a replica");
    let _ = lost.child.wait().await;
    // The kernel closed the dead replica's connections; the apiserver learns it when it reads
    // the close. A request it sends on such a connection before then fails ("broken pipe") in
    // any cluster, so the test waits for that, not for the webhook: no connection to the port
    // is left half-closed. (So a write in the instant after the loss is not what is tested.)
    wait_for(Duration::from_secs(10), "the apiserver to drop its connections to the dead replica", || async {
        (!half_closed_connections_to(PORT)).then_some(())
    })
    .await;
    let mut survivor = replicas.remove(0);
    let mut failures = Vec::new();
    for i in 0..30 {
        if let Err(e) = write(i).await {
            failures.push(format!("write {i}: {e}"));
        }
    }
    assert!(failures.is_empty(), "v1alpha1 writes after losing a replica failed: {failures:?}");

    // Malformed requests, straight to the webhook with its certificate.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "flotilla-system");
    let secret = secrets.get("flotilla-webhook-cert").await.expect("the webhook certificate Secret");
    let ca = secret.data.as_ref().and_then(|d| d.get("tls.crt")).expect("tls.crt");
    let ca_file = write_temp("ca.pem", &String::from_utf8_lossy(&ca.0));
    let post = |body: &str| {
        let out = std::process::Command::new("curl")
            .args(["-sS", "--cacert", &ca_file, "-H", "Content-Type: application/json", "-w", "\n%{http_code}"])
            .args(["--data-binary", body, &url()])
            .output()
            .expect("curl (installed by hack/prerequisites.sh)");
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let (body, code) = text.rsplit_once('\n').unwrap_or((&text, ""));
        (code.to_string(), body.to_string())
    };
    let (code, body) = post("this is not JSON");
    assert!(code.starts_with('4'), "not JSON: HTTP {code} {body}");
    assert!(body.to_lowercase().contains("json"), "says what is wrong: {body}");

    let (code, body) = post(r#"{"apiVersion":"apiextensions.k8s.io/v1","kind":"ConversionReview"}"#);
    assert_eq!(code, "200");
    let review: Value = serde_json::from_str(&body).expect("a ConversionReview");
    assert_eq!(review["response"]["result"]["status"], "Failure", "{body}");
    assert!(review["response"]["result"]["message"].as_str().unwrap_or("").contains("request missing"), "{body}");

    let bad = json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
        "request": {"uid": "u-1", "desiredAPIVersion": "flotilla.dev/v1beta1",
                    "objects": [{"apiVersion": "flotilla.dev/v1alpha1", "kind": "App",
                                 "metadata": {"name": "x"}, "spec": {"progressDeadlineSeconds": "soon"}}]}});
    let (code, body) = post(&bad.to_string());
    assert_eq!(code, "200");
    let review: Value = serde_json::from_str(&body).expect("a ConversionReview");
    assert_eq!(review["response"]["uid"], "u-1");
    assert_eq!(review["response"]["result"]["status"], "Failure", "{body}");
    assert!(
        review["response"]["result"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("spec.progressDeadlineSeconds must be an integer"),
        "{body}"
    );

    assert!(survivor.child.try_wait().expect("replica state").is_none(), "the replica still runs");
    assert_eq!(alpha.list(&ListParams::default()).await.expect("v1alpha1 read").items.len(), 3);
    assert!(survivor.metrics().await.contains("flotilla_conversions_total{result=\"error\"} 1"));
}

/// Whether a local TCP connection to `port` is in CLOSE_WAIT: its peer has gone and the owner
/// has not read the close yet (`/proc/net/tcp`, state 08).
fn half_closed_connections_to(port: u16) -> bool {
    let table = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp (Linux)");
    let remote = format!(":{port:04X}");
    table.lines().skip(1).any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        fields.len() > 3 && fields[2].ends_with(&remote) && fields[3] == "08"
    })
}

/// The CRDs of the release before this one: v1alpha1 stored.
async fn install_previous_release_crds(client: &Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for mut crd in flotilla::api::crds().expect("CRDs") {
        for version in &mut crd.spec.versions {
            version.storage = version.name == "v1alpha1";
        }
        crd.spec.conversion = Some(flotilla::api::crds::conversion(
            k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::WebhookClientConfig {
                url: Some(url()),
                ..Default::default()
            },
        ));
        let name = crd.metadata.name.clone().expect("name");
        crds.patch(&name, &PatchParams::apply("flotilla-tests").force(), &Patch::Apply(&crd)).await.expect("CRD");
    }
}

async fn stored_versions(client: &Client, name: &str) -> Vec<String> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut versions = crds.get(name).await.expect("CRD").status.and_then(|s| s.stored_versions).unwrap_or_default();
    versions.sort();
    versions
}

async fn specs(client: &Client, ns: &str) -> (Vec<(String, Value)>, Value) {
    let apps: Api<App> = Api::namespaced(client.clone(), ns);
    let list = apps.list(&ListParams::default()).await.expect("Apps as v1beta1");
    let mut out: Vec<_> = list
        .items
        .into_iter()
        .map(|a| (a.metadata.name.clone().unwrap_or_default(), serde_json::to_value(&a.spec).expect("spec")))
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    let tenants: Api<flotilla::api::Tenant> = Api::all(client.clone());
    let tenant = tenants.get("conv-migration").await.expect("Tenant as v1beta1");
    (out, serde_json::to_value(&tenant.spec).expect("spec"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_storage_leaves_every_object_at_v1beta1() {
    let _turn = SERIAL.lock().await;
    let client = cluster().await;
    let ns = TestNamespace::create(&client, "e2e-conv-mig").await;
    install_previous_release_crds(&client).await;
    let webhook = replica("conversion-idle", "mig-1").await;
    webhook_in_use(&client).await;

    // Objects written while v1alpha1 was stored.
    let tenants = alpha_api(&client, "", "Tenant");
    let _ = tenants.delete("conv-migration", &Default::default()).await;
    wait_for(Duration::from_secs(30), "no Tenant conv-migration left", || async {
        tenants.get_opt("conv-migration").await.ok().filter(Option::is_none)
    })
    .await;
    let tenant: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "flotilla.dev/v1alpha1", "kind": "Tenant", "metadata": {"name": "conv-migration"},
        "spec": {"namespaces": [], "deleteNamespacesOnRemoval": true},
    }))
    .expect("Tenant");
    tenants.create(&PostParams::default(), &tenant).await.expect("v1alpha1 Tenant");
    let apps = alpha_api(&client, &ns.name, "App");
    for i in 0..5 {
        let app: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "flotilla.dev/v1alpha1", "kind": "App", "metadata": {"name": format!("web-{i}")},
            "spec": {"image": "registry.example.com/tests/web", "version": "1", "progressDeadlineSeconds": 60 + i,
                     "strategy": {"type": "Canary", "canary": {"steps": [{"weight": 20 + i}]}}},
        }))
        .expect("App");
        apps.create(&PostParams::default(), &app).await.expect("v1alpha1 App");
    }
    let before = specs(&client, &ns.name).await;
    assert_eq!(before.0.len(), 5);
    assert_eq!(before.1["namespaceRemovalPolicy"], "Delete");

    // This release's CRDs: v1beta1 stored, v1alpha1 still in storedVersions.
    install_crds_converted_by(&client, Some(&url())).await;
    for crd in ["apps.flotilla.dev", "tenants.flotilla.dev"] {
        assert_eq!(stored_versions(&client, crd).await, ["v1alpha1", "v1beta1"], "{crd}");
    }
    // Without the webhook, the objects stored as v1alpha1 cannot be read as v1beta1.
    drop(webhook);
    let beta: Api<App> = Api::namespaced(client.clone(), &ns.name);
    wait_for(Duration::from_secs(30), "reads failing without the webhook", || async {
        beta.get("web-0").await.err().map(|_| ())
    })
    .await;

    let webhook = replica("conversion-idle", "mig-2").await;
    webhook_in_use(&client).await;
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(["migrate-storage", "--kubeconfig"])
        .arg(kubeconfig())
        .output()
        .expect("running flotilla migrate-storage");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "migrate-storage failed: {text}");
    let rewritten = text
        .lines()
        .filter_map(|l| {
            l.strip_prefix("apps.flotilla.dev: ")?.strip_suffix(" rewritten at v1beta1")?.parse::<usize>().ok()
        })
        .max();
    assert!(rewritten >= Some(5), "progress names the Apps rewritten: {text}");
    assert!(text.contains("apps.flotilla.dev: status.storedVersions"), "{text}");
    assert!(text.contains("tenants.flotilla.dev: status.storedVersions"), "{text}");
    for crd in ["apps.flotilla.dev", "tenants.flotilla.dev"] {
        assert_eq!(stored_versions(&client, crd).await, ["v1beta1"], "{crd}");
    }

    // Every object is stored at v1beta1 now: it reads back, unchanged, with no webhook at all.
    drop(webhook);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(specs(&client, &ns.name).await, before);
    let tenants: Api<flotilla::api::Tenant> = Api::all(client.clone());
    tenants.delete("conv-migration", &Default::default()).await.expect("deleting the Tenant");
}
