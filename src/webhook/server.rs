//! The HTTPS server of the conversion webhook. Its socket is bound with SO_REUSEPORT, so that
//! several replicas on one host (a local control plane) can listen on the same address: the
//! kernel spreads connections over them, and when one dies the others take every new one.
//!
//! Any pod that can reach port 9443 can send it anything, so every request is bounded (see
//! `limits`): HTTP/1.1 only (the apiserver calls webhooks over HTTP/1.1, so HTTP/2 and its
//! stream floods are not offered), headers within 5 s, a declared body above 16 MiB refused
//! at once and an undeclared one cut off there, four bodies read and two reviews converted
//! at a time, 10 s from headers to answer, and the review itself answered object by object (`review`).

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum_server::tls_rustls::RustlsConfig;
use http::StatusCode;
use http::header::CONTENT_TYPE;
use hyper_util::rt::TokioTimer;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;
use tower::limit::GlobalConcurrencyLimitLayer;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::timeout::TimeoutLayer;

use super::cert::CertPair;
use super::limits::{
    BODY_LIMIT, HEADER_READ_TIMEOUT, MAX_BODIES_IN_FLIGHT, MAX_CONCURRENT_REVIEWS, READ_BUFFER, REQUEST_TIMEOUT,
};
use super::review;
use crate::api::crds::WEBHOOK_PATH;
use crate::telemetry::Metrics;

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

/// The TLS settings for `pair`, offering only HTTP/1.1 in the handshake (axum-server offers
/// h2 too).
pub async fn tls_config(pair: &CertPair) -> std::io::Result<Arc<rustls::ServerConfig>> {
    let parsed = RustlsConfig::from_pem(pair.cert_pem.clone().into_bytes(), pair.key_pem.clone().into_bytes()).await?;
    let mut config = (*parsed.get_inner()).clone();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// What the handler shares: the metrics, and the conversion slots.
#[derive(Clone)]
struct Shared {
    metrics: Metrics,
    converting: Arc<Semaphore>,
}

async fn convert(State(shared): State<Shared>, body: Bytes) -> Response {
    let metrics = shared.metrics;
    let Ok(slot) = shared.converting.acquire_owned().await else {
        return (StatusCode::SERVICE_UNAVAILABLE, "the webhook is stopping").into_response();
    };
    // Parsing and converting is CPU work of up to a few hundred milliseconds: off the runtime's
    // workers, which also run the replica's reconciles and Lease renewals. The slot goes with
    // the work, so it is held until the work ends even if the request timed out meanwhile.
    match tokio::task::spawn_blocking(move || {
        let _slot = slot;
        review::answer(&body)
    })
    .await
    {
        Ok(Ok(answer)) => {
            metrics.converted(answer.objects, answer.failure.is_none());
            if let Some(message) = &answer.failure {
                tracing::warn!(objects = answer.objects, message, "conversion refused");
            }
            ([(CONTENT_TYPE, "application/json")], answer.body).into_response()
        }
        Ok(Err(refused)) => {
            tracing::warn!(error = %refused, "conversion review refused");
            (refused.status(), refused.to_string()).into_response()
        }
        Err(e) => {
            tracing::error!(error = %e, "the conversion task failed");
            (StatusCode::INTERNAL_SERVER_ERROR, "conversion failed").into_response()
        }
    }
}

/// The routes with their bounds (each `layer` wraps those before it). Outermost: the timeout,
/// which covers waiting, reading the body and converting; then a declared body too large is
/// refused before it waits; then one of the reading slots is held while the body is read (and
/// cut off past the limit when undeclared) and converted, the conversion itself in one of the
/// fewer conversion slots.
pub fn router(metrics: Metrics) -> Router {
    let shared = Shared { metrics, converting: Arc::new(Semaphore::new(MAX_CONCURRENT_REVIEWS)) };
    Router::new()
        .route(WEBHOOK_PATH, post(convert))
        .layer(GlobalConcurrencyLimitLayer::new(MAX_BODIES_IN_FLIGHT))
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .layer(RequestBodyLimitLayer::new(BODY_LIMIT))
        .layer(TimeoutLayer::with_status_code(StatusCode::REQUEST_TIMEOUT, REQUEST_TIMEOUT))
        .with_state(shared)
}

/// Starts serving `POST /convert` on `addr` with `pair`. On `shutdown` it stops accepting and
/// lets conversions under way finish (5 s at most). The returned config reloads the certificate.
pub async fn serve(
    addr: SocketAddr,
    pair: &CertPair,
    metrics: Metrics,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<(SocketAddr, RustlsConfig, tokio::task::JoinHandle<()>)> {
    let config = RustlsConfig::from_config(tls_config(pair).await?);
    let listener = listener(addr)?;
    let bound = listener.local_addr()?;
    let handle = axum_server::Handle::new();
    let mut server = axum_server::from_tcp_rustls(listener, config.clone())?.handle(handle.clone()).http1_only();
    server
        .http_builder()
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .max_buf_size(READ_BUFFER);
    tokio::spawn(async move {
        let _ = shutdown.wait_for(|s| *s).await;
        handle.graceful_shutdown(Some(Duration::from_secs(5)));
    });
    let app = router(metrics);
    let task = tokio::spawn(async move {
        if let Err(e) = server.serve(app.into_make_service()).await {
            tracing::error!(error = %e, "conversion webhook stopped");
        }
    });
    Ok((bound, config, task))
}

#[cfg(test)]
#[path = "server_tests.rs"]
mod tests;
