//! The admin HTTP server of a replica: `/metrics`, `/healthz` and `/readyz`.

use axum::{Router, extract::State, http::StatusCode, routing::get};
use std::net::SocketAddr;

use super::readiness::Readiness;
use crate::sharding::stuck::Progress;
use crate::telemetry::Metrics;

#[derive(Clone)]
struct AdminState {
    metrics: Metrics,
    ready: Readiness,
    progress: Progress,
}

/// Binds the admin server and returns the address it listens on (useful with port 0).
/// `/healthz` fails once `progress` has judged the replica stuck, so that the kubelet restarts it.
pub async fn serve(
    addr: SocketAddr,
    metrics: Metrics,
    ready: Readiness,
    progress: Progress,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<std::io::Result<()>>)> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let app = Router::new()
        .route("/metrics", get(metrics_text))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(AdminState { metrics, ready, progress });
    let handle = tokio::spawn(async move { axum::serve(listener, app).with_graceful_shutdown(shutdown).await });
    Ok((bound, handle))
}

async fn metrics_text(State(s): State<AdminState>) -> ([(&'static str, &'static str); 1], String) {
    ([("content-type", "text/plain; version=0.0.4")], s.metrics.render())
}

async fn healthz(State(s): State<AdminState>) -> (StatusCode, String) {
    match s.progress.stuck() {
        None => (StatusCode::OK, "ok".into()),
        Some(silent) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "stuck: no request to the apiserver answered for {:.0}s while the Leases were; shards dropped",
                silent.as_secs_f64()
            ),
        ),
    }
}

async fn readyz(State(s): State<AdminState>) -> (StatusCode, String) {
    match s.ready.check() {
        Ok(()) => (StatusCode::OK, "ok".into()),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, why),
    }
}
