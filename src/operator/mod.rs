//! Wiring of one operator replica: client, admin server, controllers, and shutdown.

pub mod admin;
pub mod clients;
pub mod fault;
pub mod fence_config;
pub mod heap_trim;
pub mod namespace_clients;
pub mod packing;
pub mod readiness;
pub mod token_identity;
pub mod wire_fence;

use kube::runtime::events::Reporter;
use kube::{Client, Config};

use clients::{ClientError, Clients, Protocol};
use readiness::{Readiness, Started};
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};
use wire_fence::WireFenceLayer;

use crate::app::controller::{Scope, Shared, app_controller};
use crate::rollout::{AnalysisLimits, Analyzer};
use crate::sharding::fence::Fence;
use crate::sharding::leases::Leases;
use crate::sharding::manager::{ShardChannels, ShardSettings, run_shard_manager};
use crate::sharding::singleton::run_singleton;
use crate::sharding::stuck::{Progress, watch_progress};
use crate::telemetry::Metrics;
use crate::tenancy::OperatorIdentity;
use crate::tenancy::controller::{TenantSettings, tenant_controller};
use crate::tenancy::served::{Ownership, ServedChannels, ServedConnections};
use crate::webhook::WebhookSettings;
use namespace_clients::NamespaceClients;
use std::time::Duration;

/// Settings of one replica, from the command line.
#[derive(Clone, Debug)]
pub struct Settings {
    pub kubeconfig: Option<PathBuf>,
    pub namespace: Option<String>,
    pub admin_addr: SocketAddr,
    pub replica_id: String,
    /// The operator's namespace and ServiceAccount, named in onboarding RoleBindings.
    pub identity: OperatorIdentity,
    /// Namespaces no Tenant may claim.
    pub protection: crate::tenancy::claim::Protection,
    /// Namespaces every tenant namespace's NetworkPolicy admits traffic from.
    pub network_allowed_namespaces: Vec<String>,
    /// Where the pods of tenant namespaces may not send (`None`: egress is not limited).
    pub network_egress: Option<crate::tenancy::desired::EgressPolicy>,
    pub sharding: ShardSettings,
    /// Prometheus queried by Apps whose analysis names none.
    pub prometheus_url: Option<String>,
    /// Analysis runs in flight at once, per replica and per tenant.
    pub analysis_limits: AnalysisLimits,
    /// The conversion webhook this replica serves (`None`: none, for command-line clients).
    pub webhook: Option<WebhookSettings>,
    /// HTTP/2 (multiplexed) or HTTP/1.1 to the apiserver.
    pub protocol: Protocol,
    /// Served namespaces that share one connection (see `packing`).
    pub namespaces_per_connection: usize,
    /// Requests to the apiserver in flight at once, Lease requests excepted.
    pub max_requests_in_flight: usize,
    /// Reconciles of one served namespace's Apps in flight at once (0: no bound; none with
    /// `namespace`).
    pub reconciles_per_namespace: u16,
    /// How long a sent request waits for its answer.
    pub request_timeout: Duration,
    /// A replica whose requests go unanswered this long while its Leases are answered is
    /// stuck: it drops its shards and fails `/healthz` (see `sharding::stuck`).
    pub stuck_after: Duration,
    /// Pod annotations a tenant may not set.
    pub pod_policy: crate::app::pod_policy::PodPolicy,
    /// How long a SIGTERMed replica waits for its tasks before it exits without them.
    pub shutdown_grace: Duration,
    /// How often the heap is trimmed (`heap_trim`); zero: never.
    pub heap_trim_interval: Duration,
    /// Whether a replica the admission policies do not cover refuses to start.
    pub admission_policy_check: fence_config::OnMismatch,
    /// For tests of network faults only: every request but the Leases' goes to this URL (a
    /// proxy in front of the same apiserver), so that the workload path can be broken while
    /// the Lease path works.
    pub workload_url: Option<http::Uri>,
}

#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    #[error("reading kubeconfig {path}: {source}")]
    Kubeconfig {
        path: String,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("loading the cluster configuration (in-cluster or $KUBECONFIG): {0}")]
    InferConfig(#[from] kube::config::InferConfigError),
    #[error("{0}")]
    Client(#[from] ClientError),
    #[error("starting the admin server on {addr}: {source}")]
    Admin {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Metrics(#[from] crate::telemetry::metrics::MetricsError),
    #[error("{0}")]
    Prometheus(#[from] crate::rollout::prometheus::ClientError),
    #[error("{0}")]
    Webhook(#[from] crate::webhook::WebhookError),
    #[error("{0}")]
    Identity(#[from] token_identity::IdentityMismatch),
    #[error(transparent)]
    Fence(#[from] fence_config::Misconfigured),
}

/// A client from an explicit kubeconfig, or in-cluster / $KUBECONFIG.
pub async fn client_for(kubeconfig: Option<&std::path::Path>, replica_id: &str) -> Result<Client, OperatorError> {
    let settings = Settings {
        kubeconfig: kubeconfig.map(|p| p.to_path_buf()),
        namespace: None,
        admin_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        replica_id: replica_id.to_string(),
        identity: OperatorIdentity { namespace: String::new(), service_account: String::new() },
        protection: Default::default(),
        network_allowed_namespaces: Vec::new(),
        network_egress: None,
        sharding: ShardSettings::default(),
        prometheus_url: None,
        analysis_limits: AnalysisLimits::default(),
        webhook: None,
        protocol: Protocol::Http1,
        namespaces_per_connection: 1,
        max_requests_in_flight: 1,
        reconciles_per_namespace: 0,
        request_timeout: Duration::from_secs(30),
        stuck_after: Duration::from_secs(30),
        shutdown_grace: Duration::from_secs(10),
        heap_trim_interval: Duration::ZERO,
        pod_policy: Default::default(),
        workload_url: None,
        admission_policy_check: fence_config::OnMismatch::Refuse,
    };
    Ok(clients(&settings, None).await?.client()?)
}

/// The configuration of `kubeconfig`, else what kube infers ($KUBECONFIG or ~/.kube/config,
/// else in-cluster), as it is (no header or URL of the operator's added).
pub async fn kube_config(kubeconfig: Option<&std::path::Path>) -> Result<Config, OperatorError> {
    match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .map_err(|source| OperatorError::Kubeconfig { path: path.display().to_string(), source })?;
            Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .map_err(|source| OperatorError::Kubeconfig { path: path.display().to_string(), source })
        }
        None => Ok(Config::infer().await?),
    }
}

/// A factory of clients with the replica's configuration, each with a connection of its own;
/// `url` replaces the apiserver's URL.
async fn clients(settings: &Settings, url: Option<&http::Uri>) -> Result<Clients, OperatorError> {
    let mut config = kube_config(settings.kubeconfig.as_deref()).await?;
    if let Some(url) = url {
        config.cluster_url = url.clone();
    }
    // Every write of this replica can be told apart in an apiserver audit log.
    let agent = format!("flotilla/{} ({})", env!("CARGO_PKG_VERSION"), settings.replica_id);
    if let Ok(value) = http::HeaderValue::from_str(&agent) {
        config.headers.push((http::header::USER_AGENT, value));
    }
    Ok(Clients::new(config, settings.protocol))
}

/// Resolves on SIGTERM or Ctrl-C.
async fn termination() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => {
                let _ = ctrl_c.await;
                return;
            }
        };
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

/// Runs the replica until SIGTERM.
pub async fn run(settings: Settings) -> Result<(), OperatorError> {
    if heap_trim::hold_mmap_threshold() {
        tracing::debug!(
            bytes = heap_trim::MMAP_THRESHOLD,
            "blocks from this size are mapped apart and unmapped when freed"
        );
    }
    if settings.network_egress.as_ref().is_some_and(|e| e.cluster_cidrs.is_empty()) {
        tracing::warn!(
            "--network-policy-egress-denied-namespaces without --network-policy-cluster-cidrs: tenants' egress to any address is allowed, and network plugins that match pod addresses by ipBlock let them reach the denied namespaces' pods by address; give the cluster's pod and Service ranges"
        );
    }
    if settings.network_allowed_namespaces.is_empty() {
        // Tenant isolation is the default: without this flag no ingress controller and no
        // Prometheus outside the tenants can reach their pods.
        tracing::warn!(
            "--network-policy-allowed-namespaces is empty: the NetworkPolicy of every tenant namespace admits only the tenant's own namespaces (and each Tenant's allowFromNamespaces); name the ingress controller's and the monitoring namespaces there"
        );
    }
    let all = clients(&settings, None).await?;
    // Leases and the singleton's election on a connection of their own, outside the bound on
    // requests in flight: renewals must never wait behind the replica's bulk work.
    let control = all.client()?;
    if settings.namespace.is_none() {
        match token_identity::check(&control, &settings.replica_id).await? {
            (token_identity::ServerFence::Active, username) => {
                // The policies must also name this replica's user and Lease namespace, or
                // they let every write through (see `fence_config`).
                let leases = &settings.identity.namespace;
                let verdict = match username {
                    Some(user) => fence_config::check(&control, &user, leases, settings.sharding.shards).await,
                    None => {
                        Ok(fence_config::Verdict::Unknown { why: "the apiserver did not say the user name".into() })
                    }
                };
                match verdict {
                    Ok(fence_config::Verdict::Covers { shut }) => {
                        info!(
                            replica = settings.replica_id,
                            "the apiserver fences this replica's writes by its shard Leases"
                        );
                        if !shut.is_empty() {
                            warn!(
                                replica = settings.replica_id,
                                ?shut,
                                "these shards have no flotilla-shard-fence binding: the apiserver refuses every write there (make bindings for --shards {}: hack/shard-fence-bindings.sh)",
                                settings.sharding.shards
                            );
                        }
                    }
                    Ok(fence_config::Verdict::Unknown { why }) => tracing::warn!(
                        replica = settings.replica_id,
                        "could not check that the apiserver's admission policies cover this replica: {why}"
                    ),
                    Err(e) if settings.admission_policy_check == fence_config::OnMismatch::Warn => {
                        tracing::error!(
                            replica = settings.replica_id,
                            "{e} (running anyway: --admission-policy-check=warn)"
                        )
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            (token_identity::ServerFence::Inactive { why }, _) => tracing::warn!(
                replica = settings.replica_id,
                "the apiserver's shard fence does not cover this replica ({why}): a write delayed past the loss of its shard is stopped only by its preconditions. In-cluster replicas have Pod-bound tokens; outside, use `kubectl create token --bound-object-kind Pod`"
            ),
        }
    }
    let workload = match &settings.workload_url {
        Some(url) => clients(&settings, Some(url)).await?,
        None => all,
    };
    // Every answer on the workload path is progress (see `sharding::stuck`): a replica busy
    // behind a slow apiserver is not stuck while its requests complete.
    let progress = Progress::new();
    let clients = workload
        .limited(settings.max_requests_in_flight)
        .with_deadline(settings.request_timeout)
        .with_progress(progress.clone());
    let client = clients.client()?;
    let metrics = Metrics::new()?;
    let ready = Arc::new(AtomicBool::new(false));
    // A sharded replica's share of the shards (tenancy mode; none in single-namespace mode):
    // the shards the manager holds, and those whose namespaces the supervisor has started.
    let share = Arc::new(AtomicBool::new(false));
    let (held_tx, held_rx) = watch::channel(BTreeSet::new());
    let (ownership_tx, ownership_rx) = watch::channel(Ownership::default());
    let started: Started = {
        let (held, ownership) = (held_rx.clone(), ownership_rx.clone());
        Arc::new(move || *held.borrow() == ownership.borrow().held)
    };
    let readiness = Readiness {
        work: ready.clone(),
        share: settings.namespace.is_none().then(|| (share.clone(), started)),
        apps: metrics.app_index().clone(),
        was_ready: Arc::default(),
    };
    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = move |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };

    let (addr, admin) =
        admin::serve(settings.admin_addr, metrics.clone(), readiness, progress.clone(), stopped(stop_rx.clone()))
            .await
            .map_err(|source| OperatorError::Admin { addr: settings.admin_addr, source })?;
    info!(%addr, replica = settings.replica_id, "admin server listening (/metrics, /healthz, /readyz)");
    match settings.sharding.budget {
        Some(b) => info!(max_apps = b.max_apps, "memory budget: no more shards once the Apps served reach max_apps"),
        None => info!("no memory budget (no --memory-budget and no container memory limit)"),
    }
    metrics.app_budget(settings.sharding.budget.map(|b| b.max_apps), false);

    let mut tasks: Vec<(&'static str, JoinHandle<()>)> = Vec::new();
    // Returns at once when trimming is off, or the allocator has no trim.
    tasks.push(("heap trim", tokio::spawn(heap_trim::trim_until(settings.heap_trim_interval, stop_rx.clone()))));
    if let Some(webhook) = settings.webhook.clone() {
        let (_, webhook_tasks) =
            crate::webhook::start(client.clone(), webhook, metrics.clone(), stop_rx.clone()).await?;
        tasks.extend(webhook_tasks.into_iter().map(|t| ("conversion webhook", t)));
    }

    let reporter = Reporter { controller: "flotilla".into(), instance: Some(settings.replica_id.clone()) };
    // Asked where the Apps are watched: one namespace's, or all of them.
    let app_scope = settings.namespace.clone().map_or(Scope::All, Scope::Namespace);
    // Through a proxy the clients are kube's own, which ask for a streamed initial state
    // from resourceVersion=0 (whatever the apiserver's cache holds): pages instead.
    let streaming_lists = if clients.proxied() {
        info!("the apiserver is reached through a proxy: Apps are listed in pages");
        false
    } else {
        crate::watch_cache::streaming_lists::supported(&app_scope.api::<crate::app::light::LightApp>(&client)).await
    };
    let shared = Shared {
        streaming_lists,
        events: crate::telemetry::events::EventWriter::new(client.clone(), reporter.clone()),
        metrics: metrics.clone(),
        analyzer: Analyzer::new(settings.prometheus_url.clone(), settings.analysis_limits)?,
        // Twice the requests in flight: a reconcile sends its requests one after the other.
        slots: Some(Arc::new(tokio::sync::Semaphore::new(settings.max_requests_in_flight.max(1) * 2))),
        pod_policy: Arc::new(settings.pod_policy.clone()),
        // One namespace alone: the replica's slots are its only bound.
        reconciles_per_namespace: if settings.namespace.is_some() { 0 } else { settings.reconciles_per_namespace },
    };
    match &settings.namespace {
        // Single-namespace mode: the operator was given rights in this namespace directly.
        Some(ns) => {
            let scope = Scope::Namespace(ns.clone());
            tasks.push((
                "App controller",
                tokio::spawn(app_controller(client, scope, shared, None, ready, stopped(stop_rx.clone()))),
            ));
        }
        // Tenancy mode, sharded: the singleton replica onboards Tenants; every replica serves
        // the onboarded namespaces of the shards it holds and explains the rest.
        None => {
            let (working_tx, working_rx) = watch::channel(Default::default());
            let fence = Fence::new(settings.sharding.shards, settings.sharding.renew_deadline);
            // Everything written in served namespaces (App controllers, the guard) goes through
            // clients that look at the fence again when each write leaves. The Tenant
            // controller is not sharded: its client is not fenced.
            let fenced = clients.fenced(WireFenceLayer::new(fence.clone(), metrics.writes_fenced()));
            let guard_client = fenced.client()?;
            let leases = Leases::new(
                control.clone(),
                &settings.identity.namespace,
                &settings.replica_id,
                settings.sharding.lease_duration,
                settings.sharding.shards,
            );
            tasks.push((
                "shard manager",
                tokio::spawn(run_shard_manager(
                    leases,
                    settings.replica_id.clone(),
                    settings.sharding,
                    ShardChannels {
                        fence: fence.clone(),
                        held_tx,
                        working_rx,
                        ready: ready.clone(),
                        share,
                        progress: progress.clone(),
                    },
                    metrics.clone(),
                    stop_rx.clone(),
                )),
            ));
            // Probes the path the work takes, through the same bound on requests in flight.
            tasks.push((
                "progress probe",
                tokio::spawn(watch_progress(client.clone(), progress.clone(), settings.stuck_after, stop_rx.clone())),
            ));
            let (tenant_client, tenant_settings, tenant_reporter, tenant_metrics) = (
                client.clone(),
                TenantSettings {
                    operator: settings.identity.clone(),
                    protection: settings.protection.clone(),
                    network_allowed: settings.network_allowed_namespaces.clone(),
                    network_egress: settings.network_egress.clone(),
                    shards: settings.sharding.shards,
                },
                reporter.clone(),
                metrics.clone(),
            );
            tasks.push((
                "Tenant controller",
                tokio::spawn({
                    let client = control;
                    let namespace = settings.identity.namespace.clone();
                    let me = settings.replica_id.clone();
                    let shutdown = stop_rx.clone();
                    let progress = progress.clone();
                    async move {
                        run_singleton(
                            client,
                            &namespace,
                            &me,
                            Duration::from_secs(15),
                            progress,
                            shutdown,
                            move |stop| {
                                tenant_controller(
                                    tenant_client.clone(),
                                    tenant_settings.clone(),
                                    tenant_reporter.clone(),
                                    tenant_metrics.clone(),
                                    stopped(stop),
                                )
                            },
                        )
                        .await
                    }
                }),
            ));
            tasks.push((
                "guard",
                tokio::spawn(crate::app::guard::guard(
                    guard_client.clone(),
                    reporter.clone(),
                    metrics.clone(),
                    ownership_rx,
                    fence.clone(),
                    streaming_lists,
                    stopped(stop_rx.clone()),
                )),
            ));
            tasks.push((
                "namespace controllers",
                tokio::spawn(crate::tenancy::served::serve_onboarded_namespaces(
                    ServedConnections {
                        // The guard's client is also a namespace's fallback: fenced like the others.
                        namespaces: Box::new(NamespaceClients::new(
                            fenced,
                            guard_client.clone(),
                            settings.namespaces_per_connection,
                        )),
                        client: guard_client.clone(),
                        stop_within: settings.sharding.renew_deadline / 2,
                        cancelled_linger: settings.sharding.lease_duration,
                    },
                    shared,
                    settings.sharding.shards,
                    ServedChannels { held_rx, working_tx, ownership_tx, fence },
                    ready,
                    stop_rx.clone(),
                )),
            ));
        }
    }

    termination().await;
    info!(grace = ?settings.shutdown_grace, "termination requested; stopping controllers");
    let _ = stop_tx.send(true);
    tasks.push(("admin server", tokio::spawn(async move { drop(admin.await) })));
    let left = stop_within(tasks, settings.shutdown_grace).await;
    if left.is_empty() {
        info!("stopped");
    } else {
        // The fence is closed and the Leases are released first thing (or expire): what is
        // left cannot write. Exiting now is safe; waiting longer only delays the restart.
        warn!(?left, grace = ?settings.shutdown_grace, "not stopped within the shutdown grace; exiting without them");
    }
    Ok(())
}

/// Waits for every task for at most `grace` in all; aborts and names those still running then.
async fn stop_within(tasks: Vec<(&'static str, JoinHandle<()>)>, grace: Duration) -> Vec<&'static str> {
    let deadline = tokio::time::Instant::now() + grace;
    let mut left = Vec::new();
    for (name, mut task) in tasks {
        if tokio::time::timeout_at(deadline, &mut task).await.is_err() {
            task.abort();
            left.push(name);
        }
    }
    left
}
