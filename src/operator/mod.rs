//! Wiring of one operator replica: client, admin server, controllers, and shutdown.

pub mod admin;

use kube::runtime::events::Reporter;
use kube::{Client, Config};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use tokio::sync::watch;
use tracing::info;

use crate::app::controller::{Scope, app_controller};
use crate::telemetry::Metrics;
use crate::tenancy::OperatorIdentity;

/// Settings of one replica, from the command line.
#[derive(Clone, Debug)]
pub struct Settings {
    pub kubeconfig: Option<PathBuf>,
    pub namespace: Option<String>,
    pub admin_addr: SocketAddr,
    pub replica_id: String,
    /// The operator's namespace and ServiceAccount, named in onboarding RoleBindings.
    pub identity: OperatorIdentity,
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
    #[error("building the Kubernetes client: {0}")]
    Client(#[source] kube::Error),
    #[error("starting the admin server on {addr}: {source}")]
    Admin {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Metrics(#[from] crate::telemetry::metrics::MetricsError),
}

async fn client(settings: &Settings) -> Result<Client, OperatorError> {
    let config = match &settings.kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .map_err(|source| OperatorError::Kubeconfig { path: path.display().to_string(), source })?;
            Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                .await
                .map_err(|source| OperatorError::Kubeconfig { path: path.display().to_string(), source })?
        }
        None => Config::infer().await?,
    };
    Client::try_from(config).map_err(OperatorError::Client)
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
    let client = client(&settings).await?;
    let metrics = Metrics::new()?;
    let ready = Arc::new(AtomicBool::new(false));
    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = move |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };

    let (addr, admin) = admin::serve(settings.admin_addr, metrics.clone(), ready.clone(), stopped(stop_rx.clone()))
        .await
        .map_err(|source| OperatorError::Admin { addr: settings.admin_addr, source })?;
    info!(%addr, replica = settings.replica_id, "admin server listening (/metrics, /healthz, /readyz)");

    let reporter = Reporter { controller: "flotilla".into(), instance: Some(settings.replica_id.clone()) };
    let mut tasks = Vec::new();
    match &settings.namespace {
        // Single-namespace mode: the operator was given rights in this namespace directly.
        Some(ns) => {
            let scope = Scope::Namespace(ns.clone());
            tasks.push(tokio::spawn(app_controller(client, scope, reporter, metrics, ready, stopped(stop_rx.clone()))));
        }
        // Tenancy mode: onboard Tenants, serve the namespaces they onboarded, explain the rest.
        None => {
            let (served_tx, served_rx) = watch::channel(Default::default());
            tasks.push(tokio::spawn(crate::tenancy::controller::tenant_controller(
                client.clone(),
                settings.identity.clone(),
                reporter.clone(),
                metrics.clone(),
                stopped(stop_rx.clone()),
            )));
            tasks.push(tokio::spawn(crate::app::guard::guard(
                client.clone(),
                reporter.clone(),
                metrics.clone(),
                served_rx,
                stopped(stop_rx.clone()),
            )));
            tasks.push(tokio::spawn(crate::tenancy::served::serve_onboarded_namespaces(
                client,
                reporter,
                metrics,
                served_tx,
                ready,
                stop_rx.clone(),
            )));
        }
    }

    termination().await;
    info!("termination requested; stopping controllers");
    let _ = stop_tx.send(true);
    for task in tasks {
        let _ = task.await;
    }
    let _ = admin.await;
    info!("stopped");
    Ok(())
}
