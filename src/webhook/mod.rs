//! The conversion webhook every replica serves (no shard ownership needed): HTTPS with a
//! certificate shared by all replicas through a Secret, and the CRDs kept pointing at it.

pub mod cert;
pub mod crd;
pub mod limits;
pub mod review;
pub mod server;

use axum_server::tls_rustls::RustlsConfig;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::Api;
use std::net::SocketAddr;
use std::time::Duration;
use tracing::{info, warn};

use cert::CertPair;

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

/// Loads (or creates) the shared certificate, starts serving, and keeps the certificate and
/// the CRDs' conversion settings current until `shutdown`. Returns once the server listens.
pub async fn start(
    client: Client,
    settings: WebhookSettings,
    metrics: Metrics,
    shutdown: tokio::sync::watch::Receiver<bool>,
) -> Result<(SocketAddr, Vec<tokio::task::JoinHandle<()>>), WebhookError> {
    let names = cert::names(&settings.namespace, settings.url.as_deref());
    let pair = cert::shared(&client, &settings.namespace, &settings.secret, &names).await?;
    let (addr, tls, server) = server::serve(settings.addr, &pair, metrics, shutdown.clone())
        .await
        .map_err(|source| WebhookError::Serve { addr: settings.addr, source })?;
    info!(%addr, url = settings.url.as_deref().unwrap_or("(through the flotilla-webhook Service)"), "conversion webhook listening");
    let keeper = tokio::spawn(keep_current(client, settings, names, pair, tls, shutdown));
    Ok((addr, vec![server, keeper]))
}

/// Every `check_every`: the certificate in the Secret (reloaded when it changed) and the CRDs
/// pointing at this webhook with it.
async fn keep_current(
    client: Client,
    settings: WebhookSettings,
    names: Vec<String>,
    mut current: CertPair,
    tls: RustlsConfig,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    loop {
        let target = crd::Target {
            ca_pem: current.ca_pem.clone(),
            url: settings.url.clone(),
            namespace: settings.namespace.clone(),
        };
        crd::point(&crds, &target).await;
        tokio::select! {
            _ = tokio::time::sleep(settings.check_every) => {}
            _ = shutdown.wait_for(|s| *s) => return,
        }
        match cert::shared(&client, &settings.namespace, &settings.secret, &names).await {
            Ok(pair) if pair != current => match server::tls_config(&pair).await {
                Ok(config) => {
                    tls.reload_from_config(config);
                    info!(secret = settings.secret, "the webhook certificate changed; serving the new one");
                    current = pair;
                }
                Err(e) => {
                    warn!(secret = settings.secret, error = %e, "the new webhook certificate cannot be used; keeping the old one")
                }
            },
            Ok(_) => {}
            Err(e) => warn!(error = %e, "could not read the webhook certificate; keeping the one in use"),
        }
    }
}
