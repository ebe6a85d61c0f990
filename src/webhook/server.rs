//! The HTTPS server of the conversion webhook. Its socket is bound with SO_REUSEPORT, so that
//! several replicas on one host (a local control plane) can listen on the same address: the
//! kernel spreads connections over them, and when one dies the others take every new one.

use axum::extract::{DefaultBodyLimit, State};
use axum::routing::post;
use axum::{Json, Router};
use axum_server::tls_rustls::RustlsConfig;
use kube::core::conversion::ConversionReview;
use std::net::SocketAddr;
use std::time::Duration;

use super::cert::CertPair;
use crate::api::conversion::review;
use crate::api::crds::WEBHOOK_PATH;
use crate::telemetry::Metrics;

/// Largest review accepted (a list read at the other version converts every item at once).
const BODY_LIMIT: usize = 64 * 1024 * 1024;

fn listener(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let socket = socket2::Socket::new(socket2::Domain::for_address(addr), socket2::Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    #[cfg(unix)]
    socket.set_reuse_port(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    Ok(socket.into())
}

async fn convert(State(metrics): State<Metrics>, Json(request): Json<ConversionReview>) -> Json<ConversionReview> {
    let objects = request.request.as_ref().map_or(0, |r| r.objects.len());
    let answer = review(request);
    let ok = answer.response.as_ref().is_some_and(|r| r.result.is_success());
    metrics.converted(objects, ok);
    if !ok {
        let message = answer.response.as_ref().map(|r| r.result.message.as_str()).unwrap_or_default();
        tracing::warn!(objects, message, "conversion refused");
    }
    Json(answer)
}

/// Starts serving `POST /convert` on `addr` with `pair`. On `shutdown` it stops accepting and
/// lets conversions under way finish (5 s at most). The returned config reloads the certificate.
pub async fn serve(
    addr: SocketAddr,
    pair: &CertPair,
    metrics: Metrics,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<(SocketAddr, RustlsConfig, tokio::task::JoinHandle<()>)> {
    let config = RustlsConfig::from_pem(pair.cert_pem.clone().into_bytes(), pair.key_pem.clone().into_bytes()).await?;
    let listener = listener(addr)?;
    let bound = listener.local_addr()?;
    let app =
        Router::new().route(WEBHOOK_PATH, post(convert)).layer(DefaultBodyLimit::max(BODY_LIMIT)).with_state(metrics);
    let handle = axum_server::Handle::new();
    let server = axum_server::from_tcp_rustls(listener, config.clone())?.handle(handle.clone());
    tokio::spawn(async move {
        let _ = shutdown.wait_for(|s| *s).await;
        handle.graceful_shutdown(Some(Duration::from_secs(5)));
    });
    let task = tokio::spawn(async move {
        if let Err(e) = server.serve(app.into_make_service()).await {
            tracing::error!(error = %e, "conversion webhook stopped");
        }
    });
    Ok((bound, config, task))
}
