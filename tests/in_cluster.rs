//! The operator as users run it: its image (hack/build-image.sh) on a real node
//! (hack/real-node.sh: a kubelet, containerd, runc and CNI bridge networking beside kwok's fake
//! nodes), installed by its Helm chart. Nothing of the test runs the operator: the kubelet
//! does, with the ServiceAccount token it mounts, the in-cluster config, the real readiness
//! probe, the conversion webhook reached through its Service, and the PodDisruptionBudget.
//!
//! Then the operator upgrades itself by its Deployment's rolling update (`helm upgrade` with a
//! changed pod annotation; the same through kustomize with FLOTILLA_IN_CLUSTER_INSTALL=kustomize,
//! which bench/in_cluster.sh runs), and loses a replica to a forced deletion, while App versions keep
//! changing: every App ends at its last version; the apiserver's audit log shows no namespace
//! written by two replicas at once and no write by a replica after its Lease moved; fewer
//! than two replicas are never available (the PDB's bound); and the handoff of each replica's
//! shards is printed.
//!
//! One real node per machine (the kubelet's port): this is the only test that starts one.

mod support;

#[path = "support/audit.rs"]
mod audit;

use flotilla::api::{App, AppPhase};
use flotilla::sharding::shard_of;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::rollout::image_of;
use support::{admin_client, audit_log, helm, http_get, kubeconfig, kubectl_ok, repo_root, unique, wait_for};

const CLUSTER: &str = "flotilla-real";
const NODE: &str = "flotilla-node-0";
const NS: &str = "flotilla-system";
const SHARDS: u32 = 32;
const REPLICAS: usize = 3;
const NAMESPACES: usize = 6;
const APPS_PER_NAMESPACE: usize = 2;
const IMAGE: &str = "registry.example.com/in-cluster";

/// The real node and its cluster, removed when the test ends (kept with FLOTILLA_KEEP_CLUSTER=1).
struct RealNode;

impl RealNode {
    fn up() -> Self {
        let status = Command::new("bash")
            .arg(repo_root().join("hack/real-node.sh"))
            .args(["up", CLUSTER])
            .stdin(Stdio::null())
            .status();
        assert!(
            status.is_ok_and(|s| s.success()),
            "the real node could not be started. It needs root and Debian's containerd, runc, buildah \
             and containernetworking-plugins, which `bash hack/real-node.sh up` installs with apt-get; \
             run it to see why (logs under ~/.cache/flotilla/realnode/{CLUSTER}/logs)"
        );
        support::use_private_cluster(CLUSTER);
        RealNode
    }
}

impl Drop for RealNode {
    fn drop(&mut self) {
        if std::env::var("FLOTILLA_KEEP_CLUSTER").as_deref() == Ok("1") {
            return;
        }
        let _ = Command::new("bash")
            .arg(repo_root().join("hack/real-node.sh"))
            .args(["down", CLUSTER])
            .stdout(Stdio::null())
            .status();
    }
}

/// The operator's image, built from this test's own binary and loaded into the node.
fn build_image() -> (String, String) {
    let out = Command::new("bash")
        .arg(repo_root().join("hack/build-image.sh"))
        .args([env!("CARGO_BIN_EXE_flotilla"), CLUSTER])
        .stderr(Stdio::inherit())
        .output()
        .expect("running hack/build-image.sh");
    assert!(out.status.success(), "hack/build-image.sh failed");
    let image = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let (repository, tag) = image.rsplit_once(':').expect("an image reference with a tag");
    (repository.to_string(), tag.to_string())
}

/// How the test installs the operator: Helm (CI), or `kubectl apply -k` of deploy/base with
/// an overlay for the local image and the node (FLOTILLA_IN_CLUSTER_INSTALL=kustomize,
/// bench/in_cluster.sh). Both render the same objects (tests/deploy.rs).
fn with_kustomize() -> bool {
    std::env::var("FLOTILLA_IN_CLUSTER_INSTALL").as_deref() == Ok("kustomize")
}

/// Installs (or, with a new `restarted` value, upgrades) the operator onto the real node.
fn install(image: &(String, String), restarted: Option<&str>) {
    if with_kustomize() {
        kustomize_apply(image, restarted)
    } else {
        let annotation = restarted.map(|r| format!("podAnnotations.flotilla\\.dev/restarted={r}"));
        helm_install(image, annotation.as_slice())
    }
    // helm's --wait is content with replicas - maxUnavailable Ready pods of the new template:
    // the last old replica may not even be deleted yet. Wait for the whole rollout.
    kubectl_ok(&["-n", NS, "rollout", "status", "deployment/flotilla", "--timeout=180s"]);
}

/// `kubectl apply --server-side -k` of an overlay of deploy/base: the local image, the
/// node's toleration and selector, and the pod annotation.
fn kustomize_apply(image: &(String, String), restarted: Option<&str>) {
    let dir = std::env::temp_dir().join(format!("flotilla-overlay-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("overlay dir");
    // kustomize takes a relative path to the base.
    let up = "../".repeat(dir.components().count() - 1);
    let base = format!("{up}{}", repo_root().join("deploy/base").display().to_string().trim_start_matches('/'));
    let annotations =
        restarted.map(|r| format!(r#", annotations: {{flotilla.dev/restarted: "{r}"}}"#)).unwrap_or_default();
    let overlay = format!(
        r#"apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources: [{base}]
images: [{{name: flotilla, newName: {}, newTag: "{}"}}]
patches:
- target: {{kind: Deployment, name: flotilla}}
  patch: |
    - {{op: add, path: /spec/template/spec/tolerations, value: [{{key: flotilla.dev/real-node, operator: Exists}}]}}
    - {{op: add, path: /spec/template/spec/nodeSelector, value: {{kubernetes.io/hostname: {NODE}}}}}
    - {{op: add, path: /spec/template/spec/containers/0/imagePullPolicy, value: Never}}
    - {{op: add, path: /spec/template/metadata, value: {{labels: {{app.kubernetes.io/name: flotilla}}{annotations}}}}}
"#,
        image.0, image.1
    );
    std::fs::write(dir.join("kustomization.yaml"), overlay).expect("writing the overlay");
    kubectl_ok(&["apply", "--server-side", "--force-conflicts", "-k", &dir.display().to_string()]);
}

/// `helm upgrade --install` of deploy/helm/flotilla onto the real node, waiting for the
/// rollout; `extra` are more `--set` flags.
fn helm_install(image: &(String, String), extra: &[String]) {
    let mut cmd = Command::new(helm());
    cmd.env("KUBECONFIG", kubeconfig())
        .args(["upgrade", "--install", "flotilla"])
        .arg(repo_root().join("deploy/helm/flotilla"))
        .args(["--namespace", NS, "--create-namespace", "--wait", "--timeout", "3m"])
        .args(["--set", &format!("replicas={REPLICAS},shards={SHARDS}")])
        .args(["--set", &format!("image.repository={},image.tag={},image.pullPolicy=Never", image.0, image.1)])
        .args(["--set-json", r#"tolerations=[{"key":"flotilla.dev/real-node","operator":"Exists"}]"#])
        .args(["--set-json", &format!(r#"nodeSelector={{"kubernetes.io/hostname":"{NODE}"}}"#)]);
    for flag in extra {
        cmd.args(["--set", flag.as_str()]);
    }
    let out = cmd.output().expect("running helm");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let tail: String = stderr.chars().rev().take(2000).collect::<Vec<_>>().into_iter().rev().collect();
    assert!(
        out.status.success(),
        "helm upgrade --install failed:\n{tail}\n{}",
        kubectl_ok(&["-n", NS, "get", "pods", "-o", "wide"])
    );
}

fn ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The operator's pods; `None` when they could not be listed (a look to skip, not an empty list).
async fn try_operator_pods(client: &Client) -> Option<Vec<Pod>> {
    Api::<Pod>::namespaced(client.clone(), NS)
        .list(&ListParams::default().labels("app.kubernetes.io/name=flotilla"))
        .await
        .ok()
        .map(|l| l.items)
}

async fn operator_pods(client: &Client) -> Vec<Pod> {
    try_operator_pods(client).await.unwrap_or_default()
}

/// Holder of each shard Lease (None: released or never taken); `None` when they could not be listed.
async fn try_holders(client: &Client) -> Option<BTreeMap<String, Option<String>>> {
    let leases = Api::<Lease>::namespaced(client.clone(), NS)
        .list(&ListParams::default().labels("flotilla.dev/lease=shard"))
        .await
        .ok()?;
    let holder = |l: Lease| l.spec.and_then(|s| s.holder_identity).filter(|h| !h.is_empty());
    Some(leases.items.into_iter().map(|l| (l.metadata.name.clone().unwrap_or_default(), holder(l))).collect())
}

async fn holders(client: &Client) -> BTreeMap<String, Option<String>> {
    try_holders(client).await.unwrap_or_default()
}

/// What the watcher saw of the replicas, every 200 ms.
#[derive(Default)]
struct Seen {
    /// Fewest replicas available (Ready and not being deleted) at any look.
    min_available: Option<usize>,
    /// When each pod was first seen being deleted (or gone).
    deleted: BTreeMap<String, Instant>,
    /// When no shard Lease was first seen naming the pod, after its deletion: it released
    /// them (or they expired and were taken).
    handed_off: BTreeMap<String, Instant>,
}

async fn watch_replicas(client: Client, seen: Arc<Mutex<Seen>>, stop: tokio::sync::watch::Receiver<bool>) {
    let mut known: BTreeSet<String> = BTreeSet::new();
    while !*stop.borrow() {
        let (Some(pods), Some(shards)) = (try_operator_pods(&client).await, try_holders(&client).await) else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let now = Instant::now();
        let available = pods.iter().filter(|p| p.metadata.deletion_timestamp.is_none() && ready(p)).count();
        let holding: BTreeSet<String> = shards.values().flatten().cloned().collect();
        {
            let mut s = seen.lock().expect("lock");
            if !pods.is_empty() {
                s.min_available = Some(s.min_available.map_or(available, |m| m.min(available)));
            }
            for p in &pods {
                let name = p.metadata.name.clone().unwrap_or_default();
                known.insert(name.clone());
                if p.metadata.deletion_timestamp.is_some() {
                    s.deleted.entry(name).or_insert(now);
                }
            }
            let present: BTreeSet<String> = pods.iter().filter_map(|p| p.metadata.name.clone()).collect();
            for gone in known.difference(&present) {
                s.deleted.entry(gone.clone()).or_insert(now);
            }
            let done: Vec<String> =
                s.deleted.keys().filter(|p| !s.handed_off.contains_key(*p) && !holding.contains(*p)).cloned().collect();
            for p in done {
                s.handed_off.insert(p, now);
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

type Versions = Arc<Mutex<BTreeMap<(String, String), u32>>>;

/// Moves one App after the other to its next version, every 300 ms, until `stop`.
async fn change_versions(client: Client, versions: Versions, stop: tokio::sync::watch::Receiver<bool>) -> usize {
    let keys: Vec<(String, String)> = versions.lock().expect("lock").keys().cloned().collect();
    let mut changes = 0;
    for key in keys.iter().cycle() {
        if *stop.borrow() {
            break;
        }
        let next = versions.lock().expect("lock")[key] + 1;
        let apps: Api<App> = Api::namespaced(client.clone(), &key.0);
        let patch = json!({"spec": {"version": next.to_string()}});
        match apps.patch(&key.1, &PatchParams::default(), &Patch::Merge(patch)).await {
            Ok(_) => {
                versions.lock().expect("lock").insert(key.clone(), next);
                changes += 1;
            }
            Err(e) => eprintln!("could not change {}/{}: {e}", key.0, key.1),
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    changes
}

/// Apps not Healthy at their last version (with their Deployment running it), with why.
async fn unsettled(client: &Client, versions: &Versions) -> Vec<String> {
    let want = versions.lock().expect("lock").clone();
    let mut out = Vec::new();
    for ((ns, name), version) in want {
        let app = Api::<App>::namespaced(client.clone(), &ns).get(&name).await.ok();
        let deployment = Api::<Deployment>::namespaced(client.clone(), &ns).get(&name).await.ok();
        let status = app.as_ref().and_then(|a| a.status.clone());
        let observed =
            app.as_ref().is_some_and(|a| status.as_ref().and_then(|s| s.observed_generation) == a.metadata.generation);
        let healthy = status.as_ref().is_some_and(|s| s.phase == Some(AppPhase::Healthy));
        let current = status.as_ref().and_then(|s| s.current_version.clone()).unwrap_or_default();
        let running = deployment.as_ref().map(image_of).unwrap_or_default();
        if !(observed && healthy && current == version.to_string() && running == format!("{IMAGE}/{name}:{version}")) {
            out.push(format!(
                "{ns}/{name}: wants {version}; phase {:?}, current {current}, observed {observed}, running {running}",
                status.as_ref().and_then(|s| s.phase)
            ));
        }
    }
    out
}

/// Runs `disrupt` while App versions change, then checks that every App ends at its last
/// version, that at least REPLICAS - 1 replicas stayed available, and prints each replaced
/// replica's handoff. Returns the handoffs.
async fn under_changes<F>(client: &Client, versions: &Versions, what: &str, disrupt: F) -> Vec<(String, Duration)>
where
    F: std::future::Future<Output = ()>,
{
    let seen = Arc::new(Mutex::new(Seen::default()));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let watcher = tokio::spawn(watch_replicas(client.clone(), seen.clone(), stop_rx.clone()));
    let changer = tokio::spawn(change_versions(client.clone(), versions.clone(), stop_rx));
    tokio::time::sleep(Duration::from_secs(2)).await;
    disrupt.await;
    // Every replica Ready again, on the new template, and every shard held by one of them.
    wait_for(Duration::from_secs(120), &format!("{what}: {REPLICAS} replicas Ready holding every shard"), || async {
        let pods = operator_pods(client).await;
        let live: BTreeSet<String> = pods
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none() && ready(p))
            .filter_map(|p| p.metadata.name.clone())
            .collect();
        let shards = holders(client).await;
        (pods.len() == REPLICAS
            && live.len() == REPLICAS
            && shards.len() == SHARDS as usize
            && shards.values().all(|h| h.as_ref().is_some_and(|h| live.contains(h))))
        .then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop_tx.send(true).expect("stopping");
    let changes = changer.await.expect("version changer");
    watcher.await.expect("watcher");
    wait_for(Duration::from_secs(120), &format!("{what}: every App at its last version"), || async {
        let pending = unsettled(client, versions).await;
        if !pending.is_empty() {
            eprintln!("{what}: {} Apps not settled yet, e.g. {}", pending.len(), pending[0]);
        }
        pending.is_empty().then_some(())
    })
    .await;
    let s = seen.lock().expect("lock");
    let min = s.min_available.unwrap_or(0);
    assert!(
        min >= REPLICAS - 1,
        "{what}: only {min} replicas were available at one point (the PDB allows one fewer than {REPLICAS})"
    );
    let handoffs: Vec<(String, Duration)> = s
        .deleted
        .iter()
        .map(|(pod, at)| {
            let done = s.handed_off.get(pod).unwrap_or_else(|| panic!("{what}: Leases still named {pod} at the end"));
            (pod.clone(), done.saturating_duration_since(*at))
        })
        .collect();
    println!("{what}: {changes} version changes; fewest replicas available {min}");
    for (pod, took) in &handoffs {
        println!("{what}: replica {pod} deleted, no Lease named it {:.1}s later", took.as_secs_f64());
    }
    handoffs
}

#[tokio::test]
async fn installed_on_a_real_node_it_upgrades_itself_and_loses_nothing() {
    let _node = RealNode::up();
    let started = k8s_openapi::jiff::Timestamp::now().as_microsecond();
    let image = build_image();
    let client = admin_client().await;

    // Installed as users do: every replica Ready through its own readiness probe.
    let t = Instant::now();
    install(&image, None);
    // Every replica Ready through its probe (the pods, for what follows).
    let pods = wait_for(Duration::from_secs(120), "every replica Ready", || async {
        let pods = operator_pods(&client).await;
        (pods.len() == REPLICAS && pods.iter().all(ready)).then_some(pods)
    })
    .await;
    for p in &pods {
        let name = p.metadata.name.clone().unwrap_or_default();
        assert_eq!(p.spec.as_ref().and_then(|s| s.node_name.as_deref()), Some(NODE), "{name} runs on the real node");
    }
    let how = if with_kustomize() { "kubectl apply -k" } else { "helm install" };
    println!("{how}: {REPLICAS} replicas Ready in {:.1}s", t.elapsed().as_secs_f64());

    // Shards balanced among the replicas, within one of each other, and each replica's
    // /metrics (through its pod IP, as Prometheus scrapes it) saying how many it holds.
    let names: BTreeSet<String> = pods.iter().filter_map(|p| p.metadata.name.clone()).collect();
    let ips: Vec<(String, String)> = pods
        .iter()
        .map(|p| {
            let ip = p.status.as_ref().and_then(|s| s.pod_ip.clone()).expect("pod IP");
            (p.metadata.name.clone().unwrap_or_default(), ip)
        })
        .collect();
    let balanced = wait_for(Duration::from_secs(60), "shards balanced, as /metrics says", || async {
        let h = holders(&client).await;
        let mut per_replica: BTreeMap<String, usize> = BTreeMap::new();
        for holder in h.values() {
            *per_replica.entry(holder.clone()?).or_default() += 1;
        }
        let (fewest, most) = (per_replica.values().min()?, per_replica.values().max()?);
        let balanced = h.len() == SHARDS as usize
            && per_replica.values().sum::<usize>() == SHARDS as usize
            && per_replica.keys().cloned().collect::<BTreeSet<_>>() == names
            && most - fewest <= 1;
        if !balanced {
            return None;
        }
        for (name, ip) in &ips {
            let (code, body) = http_get(&format!("{ip}:8080"), "/metrics").await?;
            let held = body
                .lines()
                .find_map(|l| l.strip_prefix("flotilla_shards_held "))
                .and_then(|v| v.trim().parse::<usize>().ok());
            if code != 200 || held != per_replica.get(name).copied() {
                eprintln!("{name} at {ip}: /metrics {code} says {held:?} shards held, the Leases {per_replica:?}");
                return None;
            }
        }
        Some(per_replica)
    })
    .await;
    println!("shards per replica: {balanced:?}");

    // A Tenant onboarded and its Apps reconciled by the replicas in their pods.
    let prefix = unique("incluster");
    let namespaces: Vec<String> = (0..NAMESPACES).map(|i| format!("{prefix}-{i}")).collect();
    support::onboard(&client, &prefix, &namespaces).await;
    let versions: Versions = Arc::default();
    for ns in &namespaces {
        for i in 0..APPS_PER_NAMESPACE {
            let name = format!("app-{i}");
            let app: App = serde_json::from_value(json!({
                "apiVersion": "flotilla.dev/v1beta1", "kind": "App",
                "metadata": {"name": name, "namespace": ns},
                "spec": {"image": format!("{IMAGE}/{name}"), "version": "1", "replicas": 1},
            }))
            .expect("App");
            Api::<App>::namespaced(client.clone(), ns)
                .create(&PostParams::default(), &app)
                .await
                .expect("creating an App");
            versions.lock().expect("lock").insert((ns.clone(), name), 1);
        }
    }
    wait_for(Duration::from_secs(90), "every App Healthy at version 1", || async {
        unsettled(&client, &versions).await.is_empty().then_some(())
    })
    .await;

    // A v1alpha1 read converted by the webhook, reached through its Service (no URL).
    let crd =
        kubectl_ok(&["get", "crd", "apps.flotilla.dev", "-o", "jsonpath={.spec.conversion.webhook.clientConfig}"]);
    let config: serde_json::Value = serde_json::from_str(&crd).expect("clientConfig");
    assert_eq!(config.pointer("/service/name").and_then(|v| v.as_str()), Some("flotilla-webhook"), "{config}");
    assert!(config.get("url").is_none(), "the webhook is reached through its Service, not a URL: {config}");
    let v1alpha1 = ApiResource::from_gvk(&GroupVersionKind::gvk("flotilla.dev", "v1alpha1", "App"));
    let old = Api::<DynamicObject>::namespaced_with(client.clone(), &namespaces[0], &v1alpha1)
        .get("app-0")
        .await
        .expect("reading the App as v1alpha1");
    let old = serde_json::to_value(&old).expect("JSON");
    assert_eq!(old["apiVersion"], "flotilla.dev/v1alpha1", "converted by the webhook: {old}");
    assert_eq!(old["spec"]["image"], format!("{IMAGE}/app-0"), "converted by the webhook: {old}");

    // The operator's own rolling update, as `helm upgrade` with a changed pod annotation does it.
    let before: BTreeSet<String> = names.clone();
    let handoffs = under_changes(&client, &versions, "rolling update", async {
        let image = image.clone();
        tokio::task::spawn_blocking(move || install(&image, Some("1"))).await.expect("upgrade");
    })
    .await;
    let replaced: BTreeSet<String> = handoffs.iter().map(|(p, _)| p.clone()).collect();
    assert_eq!(replaced, before, "the rolling update replaced every replica");

    // A replica's pod deleted at once: the kubelet kills it without its graceful release.
    let victim = operator_pods(&client).await.into_iter().find_map(|p| p.metadata.name).expect("a replica");
    let handoffs = under_changes(&client, &versions, "forced deletion", async {
        kubectl_ok(&["-n", NS, "delete", "pod", &victim, "--grace-period=0", "--force"]);
    })
    .await;
    assert!(handoffs.iter().any(|(p, _)| *p == victim), "{victim}'s handoff was seen: {handoffs:?}");

    // The audit log: every write into a tenant namespace by a replica holding its shard, and
    // by no other at the same time.
    let parsed = audit::read(&audit_log(), started, NS, |ns| shard_of(ns, SHARDS)).expect("the audit log");
    let findings = audit::check(&parsed.leases, &parsed.writes);
    println!(
        "audit: {} namespace writes checked, {} refused ({} by the shard fence, {} from a writer without a hold), {} ownership intervals, {} violations",
        findings.writes_checked,
        findings.writes_refused,
        findings.forbidden,
        findings.stale_refused,
        findings.intervals,
        findings.violations.len()
    );
    assert!(findings.writes_checked > 0, "the replicas wrote into the tenant namespaces");
    assert!(findings.violations.is_empty(), "writes outside their writer's hold: {:#?}", findings.violations);
    // A graceful handoff stops the work before the Lease goes: no write of a replica that
    // no longer holds the shard even reaches the apiserver (where the shard fence would
    // refuse it, which the check above would not count as a violation).
    assert_eq!(
        (findings.forbidden, findings.stale_refused),
        (0, 0),
        "writes sent without a hold (refused by the fence or a precondition)"
    );
    // Every replica the rolling update replaced released its shards (SIGTERM), rather than
    // letting them expire.
    for pod in &replaced {
        let released = parsed.leases.iter().filter(|l| l.writer == *pod && l.holder.is_none()).count();
        assert!(released > 0, "{pod} released no shard when it was replaced");
    }
}
