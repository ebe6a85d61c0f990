//! Wires the Tenant controller.

use futures::StreamExt;
use kube::Client;
use kube::api::Api;
use kube::runtime::events::Reporter;
use kube::runtime::{Controller, watcher};
use std::future::Future;
use std::sync::Arc;
use tracing::{debug, info};

use super::claim::Protection;
use super::desired::OperatorIdentity;
use super::reconcile::{TenantContext, error_policy, reconcile};
use crate::api::Tenant;
use crate::telemetry::Metrics;

/// What the Tenant controller is told by the command line.
#[derive(Clone, Debug)]
pub struct TenantSettings {
    /// The operator's own identity, which the onboarding RoleBinding names.
    pub operator: OperatorIdentity,
    /// Namespaces no Tenant may claim.
    pub protection: Protection,
    /// Namespaces every tenant namespace admits traffic from.
    pub network_allowed: Vec<String>,
    /// Where tenants' pods may not send.
    pub network_egress: Option<crate::tenancy::desired::EgressPolicy>,
    /// The shard count, for the namespaces' shard label.
    pub shards: u32,
}

/// Returns the future that runs the Tenant controller until `shutdown`.
pub fn tenant_controller(
    client: Client,
    settings: TenantSettings,
    reporter: Reporter,
    metrics: Metrics,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> impl Future<Output = ()> {
    let api: Api<Tenant> = Api::all(client.clone());
    let controller = Controller::new(api, watcher::Config::default()).graceful_shutdown_on(shutdown);
    let ctx = Arc::new(TenantContext {
        events: crate::telemetry::events::EventWriter::new(client.clone(), reporter),
        client,
        metrics,
        operator: settings.operator,
        protection: settings.protection,
        network_allowed: settings.network_allowed,
        network_egress: settings.network_egress,
        shards: settings.shards,
    });
    async move {
        controller
            .run(reconcile, error_policy, ctx)
            .for_each(|result| async move {
                if let Err(e) = result {
                    debug!(error = %e, "tenant reconcile did not complete");
                }
            })
            .await;
        info!("Tenant controller stopped");
    }
}
