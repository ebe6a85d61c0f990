//! The Kubernetes clients of a replica.
//!
//! kube 4.2 builds an HTTP/1.1 client: every watch holds a TCP + TLS connection of its own,
//! and every concurrent request opens another. A replica serving hundreds of namespaces, with
//! four watches each, held thousands of connections (most of its memory, and much of the
//! apiserver's work). The apiserver speaks HTTP/2, so this builds kube's own layers (base URI,
//! auth, headers, retries) over a hyper client that speaks HTTP/2 only: one connection
//! multiplexes every request and watch of the client. The apiserver allows 100 concurrent
//! streams per connection and hyper queues requests past that rather than opening a second
//! connection, so served namespaces are packed a few to a client (`packing`), and the
//! Leases have a client of their own, whose renewals then never wait behind bulk work.
//!
//! All clients but the Leases' share one bound on requests in flight. A replica that starts
//! serving a few hundred namespaces would otherwise send thousands of writes at once; at
//! 10,000 Apps that made the apiserver time out Service creations (their ClusterIP
//! allocation) after 34 s, the retries added to the pile, and little converged. Waiting in
//! the replica costs nothing; a watch holds its permit only until its response starts.

use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::retry::RetryPolicy;
use kube::client::{Body, ConfigExt};
use kube::{Client, Config};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;
use tower::limit::GlobalConcurrencyLimitLayer;
use tower::retry::RetryLayer;
use tower::timeout::TimeoutLayer;
use tower::util::MapResponseLayer;
use tower::{BoxError, ServiceBuilder};
use tower_http::classify::ServerErrorsFailureClass;
use tower_http::trace::TraceLayer;
use tracing::Span;

use super::fault::AbortAfterWrites;
use super::wire_fence::WireFenceLayer;
use crate::sharding::stuck::Progress;

/// Pings on an otherwise quiet connection, so that a dead peer (a restarted apiserver, a
/// dropped NAT entry) is noticed within `KEEP_ALIVE + KEEP_ALIVE_TIMEOUT`, not at the next
/// watch timeout minutes later.
const KEEP_ALIVE: Duration = Duration::from_secs(30);
const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("building the Kubernetes client: {0}")]
    Kube(#[source] kube::Error),
    #[error("TLS settings of the Kubernetes client: {0}")]
    Tls(#[source] kube::Error),
    #[error("authentication settings of the Kubernetes client: {0}")]
    Auth(#[source] kube::Error),
    #[error("extra headers of the Kubernetes client: {0}")]
    Headers(#[source] kube::Error),
    #[error(
        "the kubeconfig names a proxy-url: sharded replicas need the write fence on every request, which kube's proxy client cannot carry; run without proxy-url (in-cluster, or a direct URL) or with --namespace"
    )]
    ProxyUnfenced,
}

/// How a replica talks to the apiserver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// One multiplexed HTTP/2 connection per client (TLS with ALPN `h2`, or cleartext h2c).
    Http2,
    /// HTTP/1.1, as kube's own client: one connection per concurrent request or watch. For a
    /// path to the apiserver that does not pass HTTP/2 (some proxies).
    Http1,
}

/// Builds clients that share one configuration; each client has its own connection(s).
#[derive(Clone)]
pub struct Clients {
    config: Config,
    protocol: Protocol,
    in_flight: Option<Arc<Semaphore>>,
    fence: Option<WireFenceLayer>,
    deadline: Option<Duration>,
    fault: Option<AbortAfterWrites>,
    progress: Option<Progress>,
}

impl Clients {
    pub fn new(config: Config, protocol: Protocol) -> Self {
        Self { config, protocol, in_flight: None, fence: None, deadline: None, fault: None, progress: None }
    }

    /// A factory whose clients together have at most `max` requests in flight.
    /// Their writes are what a test's `fault` counts (the Leases' client is never limited).
    pub fn limited(&self, max: usize) -> Self {
        Self {
            in_flight: Some(Arc::new(Semaphore::new(max.max(1)))),
            fault: AbortAfterWrites::from_env(),
            ..self.clone()
        }
    }

    /// A factory whose clients check the write fence when each write (or retry) is sent,
    /// after it waited for its permit (see `wire_fence`).
    pub fn fenced(&self, fence: WireFenceLayer) -> Self {
        Self { fence: Some(fence), ..self.clone() }
    }

    /// A factory whose clients report every answer of the apiserver to `progress` (the
    /// replica's judgement of whether it is stuck).
    pub fn with_progress(&self, progress: Progress) -> Self {
        Self { progress: Some(progress), ..self.clone() }
    }

    /// A factory whose requests each give up after `deadline` without an answer (the
    /// response's head: a watch answers at once and then streams). Time spent waiting for a
    /// permit does not count: under load that is the replica's queue, not a hung request.
    pub fn with_deadline(&self, deadline: Duration) -> Self {
        Self { deadline: Some(deadline), ..self.clone() }
    }

    /// Whether its clients reach the apiserver through a proxy (`--proxy-url`, or the
    /// kubeconfig's): they are then kube's own, without this module's layers.
    pub fn proxied(&self) -> bool {
        self.config.proxy_url.is_some()
    }

    /// A new client, with a connection of its own: kube's layers (base URI, retries, auth,
    /// headers) over hyper.
    pub fn client(&self) -> Result<Client, ClientError> {
        let config = &self.config;
        if config.proxy_url.is_some() && self.fence.is_some() {
            return Err(ClientError::ProxyUnfenced);
        }
        if config.proxy_url.is_some() {
            // kube's own client knows the proxy protocols (HTTP CONNECT, SOCKS5); through a
            // proxy a replica speaks HTTP/1.1 and its requests are not bounded.
            return Client::try_from(config.clone()).map_err(ClientError::Kube);
        }
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(config.connect_timeout);
        http.set_nodelay(true);
        let tls = config.rustls_client_config().map_err(ClientError::Tls)?;
        let https = hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(tls).https_or_http();
        let mut builder = hyper_util::client::legacy::Client::builder(TokioExecutor::new());
        builder.timer(TokioTimer::new()).pool_timer(TokioTimer::new());
        let https = match self.protocol {
            // ALPN `h2` only: the apiserver (Go's TLS server) speaks HTTP/2 only when offered.
            Protocol::Http2 => {
                builder
                    .http2_only(true)
                    .http2_keep_alive_interval(KEEP_ALIVE)
                    .http2_keep_alive_timeout(KEEP_ALIVE_TIMEOUT)
                    .http2_keep_alive_while_idle(true);
                https.enable_http2().wrap_connector(http)
            }
            Protocol::Http1 => https.enable_http1().wrap_connector(http),
        };
        let hyper = builder.build(https);
        let auth = config.auth_layer().map_err(ClientError::Auth)?;
        let headers = config.extra_headers_layer().map_err(ClientError::Headers)?;
        let service = ServiceBuilder::new()
            // A mark before each streamed initial state's events, so that a cache knows when
            // one starts again (`watch_cache::start_mark`).
            .layer(crate::watch_cache::start_mark::StartMarkLayer)
            // A streamed initial state as of now, not of any time (kube-runtime's ask).
            .map_request(crate::watch_cache::streaming_lists::as_of_now::<Body>)
            .layer(config.base_uri_layer())
            .option_layer(config.default_retry.then(|| RetryLayer::new(RetryPolicy::server_retry())))
            .option_layer(auth)
            .layer(headers)
            // One debug span per request, named like kube's own (`HTTP`, with method, URL and
            // status), so that traces show a reconcile's API calls as its children.
            .layer(
                TraceLayer::new_for_http()
                    .make_span_with(|req: &Request<Body>| {
                        tracing::debug_span!(
                            "HTTP",
                            http.method = %req.method(),
                            http.url = %req.uri(),
                            http.status_code = tracing::field::Empty,
                            otel.name = req.extensions().get::<&'static str>().unwrap_or(&"HTTP"),
                            otel.kind = "client",
                            otel.status_code = tracing::field::Empty,
                        )
                    })
                    .on_request(())
                    .on_response(|res: &Response<Incoming>, _: Duration, span: &Span| {
                        span.record("http.status_code", res.status().as_u16());
                        if res.status().is_client_error() || res.status().is_server_error() {
                            span.record("otel.status_code", "ERROR");
                        }
                    })
                    .on_body_chunk(())
                    .on_eos(())
                    .on_failure(|_: ServerErrorsFailureClass, _: Duration, span: &Span| {
                        span.record("otel.status_code", "ERROR");
                    }),
            )
            .option_layer(self.in_flight.clone().map(GlobalConcurrencyLimitLayer::with_semaphore))
            // Below the bound and the retries: the last look at the fence before the wire.
            .option_layer(self.fence.as_ref().map(|f| f.under(config.cluster_url.path())))
            .option_layer(self.deadline.map(TimeoutLayer::new))
            .option_layer(self.progress.clone().map(|progress| {
                MapResponseLayer::new(move |response| {
                    progress.workload_answered();
                    response
                })
            }))
            .option_layer(self.fault.clone())
            .map_err(BoxError::from)
            .service(hyper);
        Ok(Client::new(service, config.default_namespace.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Config {
        let mut config = Config::new("https://127.0.0.1:6443".parse().expect("a valid URL"));
        config.accept_invalid_certs = true;
        config
    }

    #[tokio::test]
    async fn both_protocols_build_a_client_from_a_plain_config() {
        for protocol in [Protocol::Http2, Protocol::Http1] {
            let clients = Clients::new(config(), protocol);
            for clients in [clients.clone(), clients.limited(4)] {
                let client = clients.client();
                assert!(client.is_ok(), "{protocol:?}: {:?}", client.err());
            }
        }
    }
}
