//! The Kubernetes clients of a replica.
//!
//! kube 4.2 builds an HTTP/1.1 client: every watch holds a TCP + TLS connection of its own,
//! and every concurrent request opens another. A replica serving hundreds of namespaces, with
//! four watches each, held thousands of connections (most of its memory, and much of the
//! apiserver's work). The apiserver speaks HTTP/2, so this builds kube's own layers (base URI,
//! auth, headers, retries) over a hyper client that speaks HTTP/2 only: one connection
//! multiplexes every request and watch of the client. The apiserver allows 1000 concurrent
//! streams per connection and hyper queues requests past that rather than opening a second
//! connection, so the replica keeps one client per shard (a shard's namespaces have far
//! fewer watches than that) and one for its Leases, whose renewals then never wait behind
//! bulk work on the same connection.

use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::ConfigExt;
use kube::client::retry::RetryPolicy;
use kube::{Client, Config};
use std::time::Duration;
use tower::retry::RetryLayer;
use tower::{BoxError, ServiceBuilder};

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
}

/// How a replica talks to the apiserver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// One multiplexed HTTP/2 connection per client (TLS with ALPN `h2`, or cleartext h2c).
    Http2,
    /// kube's own client: one connection per concurrent request or watch. For a path to the
    /// apiserver that does not pass HTTP/2 (some proxies).
    Http1,
}

/// Builds clients that share one configuration; each client has its own connection.
#[derive(Clone)]
pub struct Clients {
    config: Config,
    protocol: Protocol,
}

impl Clients {
    pub fn new(config: Config, protocol: Protocol) -> Self {
        Self { config, protocol }
    }

    /// A new client, with a connection of its own.
    pub fn client(&self) -> Result<Client, ClientError> {
        match self.protocol {
            Protocol::Http1 => Client::try_from(self.config.clone()).map_err(ClientError::Kube),
            Protocol::Http2 => http2_client(&self.config),
        }
    }
}

fn http2_client(config: &Config) -> Result<Client, ClientError> {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(config.connect_timeout);
    http.set_nodelay(true);
    let tls = config.rustls_client_config().map_err(ClientError::Tls)?;
    // ALPN `h2` only: the apiserver (Go's TLS server) speaks HTTP/2 only when it was offered.
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http2()
        .wrap_connector(http);
    let hyper = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .http2_only(true)
        .http2_keep_alive_interval(KEEP_ALIVE)
        .http2_keep_alive_timeout(KEEP_ALIVE_TIMEOUT)
        .http2_keep_alive_while_idle(true)
        .build(https);
    let auth = config.auth_layer().map_err(ClientError::Auth)?;
    let headers = config.extra_headers_layer().map_err(ClientError::Headers)?;
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.default_retry.then(|| RetryLayer::new(RetryPolicy::server_retry())))
        .option_layer(auth)
        .layer(headers)
        .map_err(BoxError::from)
        .service(hyper);
    Ok(Client::new(service, config.default_namespace.clone()))
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
            let client = Clients::new(config(), protocol).client();
            assert!(client.is_ok(), "{protocol:?}: {:?}", client.err());
        }
    }
}
