//! Shared support for the end-to-end tests: the local control plane (started once per
//! test binary, reused across binaries), a namespace per test, and an operator replica
//! per test that serves only that namespace.
#![allow(dead_code)]

pub mod browser;
pub mod invalid_apps;
pub mod prometheus;
pub mod recorder;
pub mod rollout;
pub mod stall_proxy;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, Config};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use tokio::process::{Child, Command};

/// Name of the cluster the tests share, unless FLOTILLA_TEST_KUBECONFIG names another.
pub const TEST_CLUSTER: &str = "flotilla-test";

/// The repository's root (the crate's manifest directory).
pub fn repo_root() -> PathBuf {
    // Cargo sets the variable when it runs a test too. The run's value is preferred: the
    // target dir is shared between clones, and a test binary reused from another clone (its
    // sources unchanged) would otherwise read that clone's files, or a removed directory.
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

static PRIVATE_CLUSTER: OnceLock<String> = OnceLock::new();

/// Makes this test binary use a cluster of its own (own name, ports and data dir) instead of
/// the shared one, for tests that stop the control plane. Call it before anything else.
pub fn use_private_cluster(name: &str) {
    let _ = PRIVATE_CLUSTER.set(name.to_string());
}

static PRIVATE_CLUSTER_ARGS: OnceLock<Vec<String>> = OnceLock::new();

/// Like `use_private_cluster`, the cluster made with `args` passed on to kwokctl (for example
/// `--extra-args kube-apiserver=feature-gates=...`). Its name must be its own: a cluster of
/// that name already running is used as it is.
pub fn use_private_cluster_with(name: &str, args: &[&str]) {
    use_private_cluster(name);
    let _ = PRIVATE_CLUSTER_ARGS.set(args.iter().map(|a| a.to_string()).collect());
}

/// The cluster this test binary uses.
pub fn cluster_name() -> &'static str {
    PRIVATE_CLUSTER.get().map(String::as_str).unwrap_or(TEST_CLUSTER)
}

/// Starts (or reuses) the test cluster and returns its kubeconfig. A failure here is a test
/// failure with instructions, never a skip.
pub fn kubeconfig() -> &'static Path {
    static KUBECONFIG: OnceLock<PathBuf> = OnceLock::new();
    KUBECONFIG.get_or_init(|| {
        let name = cluster_name();
        if name == TEST_CLUSTER
            && let Some(path) = std::env::var_os("FLOTILLA_TEST_KUBECONFIG")
        {
            return PathBuf::from(path);
        }
        let script = repo_root().join("hack/cluster.sh");
        let status = std::process::Command::new("bash")
            .arg(&script)
            .args(["up", name])
            .args(PRIVATE_CLUSTER_ARGS.get().into_iter().flatten())
            .stdout(Stdio::inherit())
            .stderr(Stdio::inherit())
            .status();
        match status {
            Ok(s) if s.success() => {}
            other => panic!(
                "the local control plane could not be started ({other:?}).\n\
                 Run `bash hack/cluster.sh up {name}` to see why. It builds etcd, Kubernetes and kwok \
                 from their Go modules, so it needs Go >= 1.26 on PATH (https://go.dev/doc/install) and \
                 access to the Go module proxy; `bash hack/test.sh` installs the rest."
            ),
        }
        let out = std::process::Command::new("bash")
            .arg(&script)
            .args(["kubeconfig", name])
            .output()
            .expect("running hack/cluster.sh kubeconfig");
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim().to_string())
    })
}

/// An admin client for the test cluster (system:masters).
pub async fn admin_client() -> Client {
    let path = kubeconfig();
    let kc = kube::config::Kubeconfig::read_from(path).expect("reading the test kubeconfig");
    let config = Config::from_custom_kubeconfig(kc, &Default::default()).await.expect("kubeconfig");
    Client::try_from(config).expect("client")
}

/// Installs the CRDs (server-side apply, so every test binary can do it) and waits until
/// they are established. Their conversion webhook is the in-cluster Service, which does not
/// exist here: these tests read and write `v1beta1` only, which needs no conversion.
pub async fn install_crds(client: &Client) {
    install_crds_converted_by(client, None).await
}

/// Installs the CRDs with their conversion webhook at `url` (`None`: as shipped).
pub async fn install_crds_converted_by(client: &Client, url: Option<&str>) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for mut crd in flotilla::api::crds().expect("the CRDs") {
        if let Some(url) = url {
            crd.spec.conversion = Some(flotilla::api::crds::conversion(
                k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::WebhookClientConfig {
                    url: Some(url.to_string()),
                    ..Default::default()
                },
            ));
        }
        let name = crd.metadata.name.clone().expect("crd name");
        crds.patch(&name, &PatchParams::apply("flotilla-tests").force(), &Patch::Apply(&crd))
            .await
            .expect("applying CRD");
        wait_for(Duration::from_secs(30), &format!("CRD {name} established"), || {
            let crds = crds.clone();
            let name = name.clone();
            async move {
                let crd = crds.get(&name).await.ok()?;
                let established =
                    crd.status?.conditions?.iter().any(|c| c.type_ == "Established" && c.status == "True");
                established.then_some(())
            }
        })
        .await;
    }
}

/// Polls `probe` every 200 ms until it yields a value; panics with `what` after `timeout`.
pub async fn wait_for<T, F, Fut>(timeout: Duration, what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        if start.elapsed() > timeout {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A name for a test's own objects: `prefix` and five hex digits from the clock and pid.
pub fn unique(prefix: &str) -> String {
    let n = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    format!("{prefix}-{:05x}", (n ^ std::process::id()) & 0xfffff)
}

/// A namespace of one test; deleted when the test ends.
pub struct TestNamespace {
    pub name: String,
}

impl TestNamespace {
    pub async fn create(client: &Client, prefix: &str) -> Self {
        let suffix: u32 = std::process::id()
            ^ (Instant::now().elapsed().subsec_nanos())
            ^ (std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0));
        let name = format!("{prefix}-{:06x}", suffix & 0xff_ffff);
        let ns = Namespace {
            metadata: kube::api::ObjectMeta { name: Some(name.clone()), ..Default::default() },
            ..Default::default()
        };
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .expect("creating test namespace");
        wait_for(Duration::from_secs(30), "default ServiceAccount", || {
            let sa: Api<k8s_openapi::api::core::v1::ServiceAccount> = Api::namespaced(client.clone(), &name);
            async move { sa.get_opt("default").await.ok().flatten() }
        })
        .await;
        Self { name }
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        let _ = std::process::Command::new(kubectl())
            .args(["--kubeconfig"])
            .arg(kubeconfig())
            .args(["delete", "namespace", &self.name, "--wait=false", "--ignore-not-found"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// A path hack/versions.sh names (`$K8S_BIN/kubectl`, ...).
fn cached_tool(expr: &str) -> PathBuf {
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!(". {}/hack/versions.sh && echo {expr}", repo_root().display()))
        .output()
        .expect("reading hack/versions.sh");
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The kubectl built with the control plane.
pub fn kubectl() -> PathBuf {
    cached_tool("$K8S_BIN/kubectl")
}

/// The Helm built by hack/build-helm.sh (hack/test.sh runs it).
pub fn helm() -> PathBuf {
    let path = cached_tool("$HELM_BIN/helm");
    assert!(path.exists(), "{} not found: build it with `bash hack/build-helm.sh` (hack/test.sh does)", path.display());
    path
}

/// Creates a Tenant `name` of `namespaces` and waits until every one is onboarded.
pub async fn onboard(client: &Client, name: &str, namespaces: &[String]) {
    use flotilla::api::{NamespaceState, Tenant};
    let tenant: Tenant = serde_json::from_value(serde_json::json!({
        "apiVersion": "flotilla.dev/v1beta1", "kind": "Tenant", "metadata": {"name": name},
        "spec": {"namespaces": namespaces},
    }))
    .expect("Tenant");
    let tenants: Api<Tenant> = Api::all(client.clone());
    tenants.create(&PostParams::default(), &tenant).await.expect("creating the Tenant");
    wait_for(Duration::from_secs(120), "every namespace onboarded", || async {
        let s = tenants.get(name).await.ok()?.status?;
        (s.namespaces.iter().filter(|n| n.state == NamespaceState::Onboarded).count() == namespaces.len()).then_some(())
    })
    .await;
}

/// One operator replica (the real binary), killed when dropped.
pub struct Operator {
    pub child: Child,
    pub admin: String,
    /// Where its output goes.
    pub log: PathBuf,
}

impl Operator {
    /// Starts `flotilla run` serving only `namespace` (single-namespace mode, admin
    /// credentials), and waits until it is ready.
    pub async fn start(namespace: &str) -> Self {
        Self::start_with(
            kubeconfig(),
            &["--namespace", namespace, "--conversion-webhook=false"],
            &format!("e2e-{namespace}"),
        )
        .await
    }

    /// Starts `flotilla run` with the given kubeconfig and extra arguments, and waits until it
    /// is ready. Its log goes to the temp dir, named after `id`.
    pub async fn start_with(kubeconfig: &Path, args: &[&str], id: &str) -> Self {
        Self::start_with_env(kubeconfig, args, id, &[]).await
    }

    /// Like `start_with`, with extra environment variables.
    pub async fn start_with_env(kubeconfig: &Path, args: &[&str], id: &str, env: &[(&str, &str)]) -> Self {
        Self::spawn(kubeconfig, args, id, id, env).await
    }

    /// Like `start_with`, its log named after `log` rather than `id`: a second process under
    /// the same replica id.
    pub async fn start_logged_as(kubeconfig: &Path, args: &[&str], id: &str, log: &str) -> Self {
        Self::spawn(kubeconfig, args, id, log, &[]).await
    }

    async fn spawn(kubeconfig: &Path, args: &[&str], id: &str, log: &str, env: &[(&str, &str)]) -> Self {
        let port = free_port();
        let log = std::env::temp_dir().join(format!("flotilla-e2e-{log}.log"));
        let log_file = std::fs::File::create(&log).expect("operator log file");
        // The conversion webhook listens on a port of its own unless the test says where: only
        // the conversion tests call it.
        let webhook: &[&str] =
            if args.iter().any(|a| a.starts_with("--webhook-addr")) { &[] } else { &["--webhook-addr", "127.0.0.1:0"] };
        // No memory budget from the cgroup the tests happen to run in, unless the test sets one.
        let budget: &[&str] =
            if args.iter().any(|a| a.starts_with("--memory-budget")) { &[] } else { &["--memory-budget", "unlimited"] };
        // The tests' Apps measure every second or two, under the platform's default floor.
        let floor: &[&str] = if args.iter().any(|a| a.starts_with("--analysis-min-interval")) {
            &[]
        } else {
            &["--analysis-min-interval", "1s"]
        };
        let child = Command::new(env!("CARGO_BIN_EXE_flotilla"))
            .arg("run")
            .args(args)
            .args(webhook)
            .args(budget)
            .args(floor)
            .args(["--admin-addr", &format!("127.0.0.1:{port}")])
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["--replica-id", id])
            .env("RUST_LOG", "info,flotilla=debug")
            .envs(env.iter().copied())
            .stdout(log_file.try_clone().expect("log"))
            .stderr(log_file)
            .kill_on_drop(true)
            .spawn()
            .expect("starting the operator binary");
        let admin = format!("127.0.0.1:{port}");
        let op = Self { child, admin: admin.clone(), log: log.clone() };
        wait_for(Duration::from_secs(60), &format!("operator ready (log: {})", log.display()), || {
            let admin = admin.clone();
            async move { http_get(&admin, "/readyz").await.filter(|(code, _)| *code == 200).map(|_| ()) }
        })
        .await;
        op
    }

    pub async fn metrics(&self) -> String {
        http_get(&self.admin, "/metrics").await.map(|(_, body)| body).unwrap_or_default()
    }
}

/// Runs kubectl as admin against the test cluster; panics with its output when it fails.
pub fn kubectl_ok(args: &[&str]) -> String {
    let (ok, out) = kubectl_try(args);
    assert!(ok, "kubectl {args:?} failed: {out}");
    out
}

/// Runs kubectl as admin and returns (success, stdout + stderr).
pub fn kubectl_try(args: &[&str]) -> (bool, String) {
    let out = std::process::Command::new(kubectl())
        .arg("--kubeconfig")
        .arg(kubeconfig())
        .args(args)
        .output()
        .expect("running kubectl");
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

/// The operator's namespace, ServiceAccount, exactly the roles of rbac/ and the Lease
/// FlowSchema, as an install would.
/// Once per test binary: two concurrent client-side applies of a new object race to create it.
pub fn install_operator_rbac() {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        let root = repo_root();
        kubectl_ok(&[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            &root.join("deploy/base/namespace.yaml").display().to_string(),
        ]);
        kubectl_ok(&["apply", "--server-side", "--force-conflicts", "-k", &root.join("rbac").display().to_string()]);
        // The shard fence of older installs: one binding over every Lease (one per shard now).
        kubectl_ok(&["delete", "validatingadmissionpolicybinding", "flotilla-shard-fence", "--ignore-not-found"]);
        kubectl_ok(&["delete", "validatingadmissionpolicy", "flotilla-shard-fence", "--ignore-not-found"]);
        kubectl_ok(&[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            &root.join("deploy/base/flowschema.yaml").display().to_string(),
        ]);
    });
}

/// The Gateway API standard-channel CRDs (HTTPRoute), from the Go module that ships them
/// (hack/gateway-api.sh). Once per test binary.
pub fn install_gateway_api() {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        let out = std::process::Command::new("bash")
            .arg(repo_root().join("hack/gateway-api.sh"))
            .arg("install")
            .arg(kubeconfig())
            .output()
            .expect("running hack/gateway-api.sh");
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "installing the Gateway API CRDs failed (needs Go and its module proxy): {text}");
    });
}

/// A kubeconfig that authenticates as the operator's ServiceAccount the way a replica in a
/// Pod does: with a token bound to a Pod named `replica` (the replica's id), so that the
/// apiserver's shard fence (rbac/shard-fence.yaml) knows which replica sends each request.
/// Written by hack/operator-kubeconfig.sh, as for the demo and the benchmarks: the Pod is a
/// placeholder that never runs (a scheduling gate holds it).
pub fn operator_kubeconfig(replica: &str) -> PathBuf {
    install_operator_rbac();
    let path = std::env::temp_dir().join(format!("flotilla-operator-{}-{replica}.kubeconfig", std::process::id()));
    let out = std::process::Command::new("bash")
        .arg(repo_root().join("hack/operator-kubeconfig.sh"))
        .arg(cluster_name())
        .arg(&path)
        .arg(replica)
        .env("KUBECONFIG", kubeconfig())
        .output()
        .expect("running hack/operator-kubeconfig.sh");
    assert!(
        out.status.success(),
        "hack/operator-kubeconfig.sh failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    path
}

/// Runs `hack/cluster.sh <args> <this binary's cluster>`; panics when it fails.
pub fn cluster_script(args: &[&str]) {
    let status = std::process::Command::new("bash")
        .arg(repo_root().join("hack/cluster.sh"))
        .args(args)
        .arg(cluster_name())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("running hack/cluster.sh");
    assert!(status.success(), "hack/cluster.sh {args:?} {} failed", cluster_name());
}

/// The test cluster's audit log (requests by ServiceAccounts of flotilla-system).
pub fn audit_log() -> PathBuf {
    let out = std::process::Command::new("bash")
        .arg(repo_root().join("hack/cluster.sh"))
        .args(["audit-log", cluster_name()])
        .output()
        .expect("locating the audit log");
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The whole audit log. Panics when it is missing or empty: a test that reads it to prove who
/// wrote what must never pass for lack of evidence.
pub fn audit_text() -> String {
    let path = audit_log();
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "reading the audit log {}: {e}; the cluster must run with hack/cluster.sh's audit policy",
            path.display()
        )
    });
    assert!(
        !text.trim().is_empty(),
        "the audit log {} is empty: requests of the operator's ServiceAccounts are not being audited",
        path.display()
    );
    text
}

/// Audit events (parsed JSON lines) whose request URI touches `namespace`.
pub fn audit_events_in(namespace: &str) -> Vec<serde_json::Value> {
    let text = audit_text();
    let needle = format!("/namespaces/{namespace}/");
    text.lines().filter(|l| l.contains(&needle)).filter_map(|l| serde_json::from_str(l).ok()).collect()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("free port")
}

/// A tiny HTTP/1.0 GET against the admin server: status code and body.
pub async fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    let (code, response) = http_exchange(addr, &format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")).await?;
    let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    Some((code, body))
}

/// Sends `request` (a whole HTTP/1.0 request, as written) to `addr`; the status code and the
/// whole response, headers included.
pub async fn http_exchange(addr: &str, request: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut buf = String::new();
    stream.read_to_string(&mut buf).await.ok()?;
    let code = buf.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, buf))
}

/// A Tenant named like its only namespace, onboarded, with one App of one replica that is
/// Healthy: some real work for the tests of what the operator reports about itself.
pub async fn onboarded_healthy_app(client: &Client, namespace: &str, app: &str) {
    use flotilla::api::{App, AppPhase, NamespaceState, Tenant};
    let tenant: Tenant = serde_json::from_value(serde_json::json!({
        "apiVersion": "flotilla.dev/v1beta1", "kind": "Tenant", "metadata": {"name": namespace},
        "spec": {"namespaces": [namespace]},
    }))
    .expect("tenant");
    let tenants: Api<Tenant> = Api::all(client.clone());
    tenants.create(&PostParams::default(), &tenant).await.expect("creating Tenant");
    wait_for(Duration::from_secs(60), "namespace onboarded", || async {
        let s = tenants.get(namespace).await.ok()?.status?;
        s.namespaces.iter().any(|n| n.state == NamespaceState::Onboarded).then_some(())
    })
    .await;
    let object: App = serde_json::from_value(serde_json::json!({
        "apiVersion": "flotilla.dev/v1beta1", "kind": "App", "metadata": {"name": app, "namespace": namespace},
        "spec": {"image": format!("registry.example.com/tests/{app}"), "version": "1", "replicas": 1},
    }))
    .expect("app");
    let apps: Api<App> = Api::namespaced(client.clone(), namespace);
    apps.create(&PostParams::default(), &object).await.expect("creating App");
    wait_for(Duration::from_secs(60), "App Healthy", || async {
        (apps.get(app).await.ok()?.status?.phase == Some(AppPhase::Healthy)).then_some(())
    })
    .await;
}
