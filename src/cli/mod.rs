//! The `flotilla` command line.

use clap::{Parser, Subcommand};
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(name = "flotilla", version, about = "Multi-tenant Kubernetes operator with metric-gated rollouts")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run one operator replica.
    Run(RunArgs),
    /// Print the CustomResourceDefinitions as YAML (what `crds/` holds).
    Crd,
}

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// Kubeconfig to use; default: in-cluster, then $KUBECONFIG, then ~/.kube/config.
    #[arg(long, env = "FLOTILLA_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Serve only this namespace, without tenancy (the operator must have been given rights
    /// there). Default: serve every namespace a Tenant onboarded.
    #[arg(long, env = "FLOTILLA_NAMESPACE")]
    pub namespace: Option<String>,
    /// Address of the admin server (/metrics, /healthz, /readyz).
    #[arg(long, env = "FLOTILLA_ADMIN_ADDR", default_value = "0.0.0.0:8080")]
    pub admin_addr: SocketAddr,
    /// Name of this replica in Events, logs and Leases (default: $POD_NAME, else the host name and pid).
    #[arg(long, env = "FLOTILLA_REPLICA_ID")]
    pub replica_id: Option<String>,
    /// Namespace the operator runs in (its Leases live there; no tenant may claim it).
    #[arg(long, env = "POD_NAMESPACE", default_value = "flotilla-system")]
    pub operator_namespace: String,
    /// ServiceAccount the operator runs as; onboarding binds it in each tenant namespace.
    #[arg(long, env = "FLOTILLA_SERVICE_ACCOUNT", default_value = "flotilla")]
    pub service_account: String,
    /// Log as JSON lines.
    #[arg(long, env = "FLOTILLA_LOG_JSON")]
    pub log_json: bool,
}
