//! The conversion webhook every replica serves (no shard ownership needed): HTTPS with a
//! certificate shared by all replicas through a Secret, and the CRDs kept pointing at it.

pub mod cert;
pub mod crd;
pub mod server;

use kube::Client;
use std::net::SocketAddr;
use std::time::Duration;
use tracing::info;

use crate::telemetry::Metrics;

/// How this replica serves the webhook, from the command line.
#[derive(Clone, Debug)]
pub struct WebhookSettings {
    /// Where to listen (every replica on a host may bind the same address: SO_REUSEPORT).
    pub addr: SocketAddr,
    /// The URL the apiserver calls, when it reaches the replicas directly (a local control
    /// plane: `https://127.0.0.1:9443/convert`). `None`: through the `flotilla-webhook` Service.
    pub url: Option<String>,
    /// The operator's namespace (its Secret, and the Service's namespace).
    pub namespace: String,
    /// Secret holding the serving certificate and key all replicas share.
    pub secret: String,
    /// How often the CRDs' conversion settings are checked (and put back when changed).
    pub check_every: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error("{0}")]
    Cert(#[from] cert::CertError),
    #[error("starting the conversion webhook on {addr}: {source}")]
    Serve {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// Loads (or creates) the shared certificate, starts serving, and keeps the CRDs pointing at
/// the webhook with its CA until `shutdown`. Returns once the server listens.
pub async fn start(
    client: Client,
    settings: WebhookSettings,
    metrics: Metrics,
    shutdown: tokio::sync::watch::Receiver<bool>,
) -> Result<(SocketAddr, Vec<tokio::task::JoinHandle<()>>), WebhookError> {
    let names = cert::names(&settings.namespace, settings.url.as_deref());
    let pair = cert::shared(&client, &settings.namespace, &settings.secret, &names).await?;
    let (addr, server) = server::serve(settings.addr, &pair, metrics, shutdown.clone())
        .await
        .map_err(|source| WebhookError::Serve { addr: settings.addr, source })?;
    info!(%addr, url = settings.url.as_deref().unwrap_or("(through the flotilla-webhook Service)"), "conversion webhook listening");
    let target =
        crd::Target { ca_pem: pair.cert_pem.clone(), url: settings.url.clone(), namespace: settings.namespace.clone() };
    let keeper = tokio::spawn(crd::keep_pointing(client, target, settings.check_every, shutdown));
    Ok((addr, vec![server, keeper]))
}
