//! Wires the Tenant controller.

use futures::StreamExt;
use kube::Client;
use kube::api::Api;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::{Controller, watcher};
use std::future::Future;
use std::sync::Arc;
use tracing::{debug, info};

use super::claim::Protection;
use super::desired::OperatorIdentity;
use super::reconcile::{TenantContext, error_policy, reconcile};
use crate::api::Tenant;
use crate::telemetry::Metrics;

/// Returns the future that runs the Tenant controller until `shutdown`.
pub fn tenant_controller(
    client: Client,
    operator: OperatorIdentity,
    protection: Protection,
    network_allowed: Vec<String>,
    reporter: Reporter,
    metrics: Metrics,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> impl Future<Output = ()> {
    let api: Api<Tenant> = Api::all(client.clone());
    let controller = Controller::new(api, watcher::Config::default()).graceful_shutdown_on(shutdown);
    let ctx = Arc::new(TenantContext {
        recorder: Recorder::new(client.clone(), reporter),
        client,
        metrics,
        operator,
        protection,
        network_allowed,
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
