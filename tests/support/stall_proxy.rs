//! A TCP proxy between a replica and the apiserver that can stop forwarding what the replica
//! sends while keeping every connection open: requests (and the bytes of TLS and HTTP/2
//! underneath) wait in the proxy, answers and watch events already under way keep flowing.
//! That is what a replica sees of an apiserver that stalls its requests, or of a network path
//! that broke one way. It forwards bytes as they are (TLS passes through), so the replica
//! reaches it with the apiserver's own certificate at the same host, another port.
//!
//! ```ignore
//! let proxy = StallProxy::start(upstream_of(&kubeconfig)).await;
//! // point the replica's requests at proxy.url() ...
//! proxy.stall();   // from now on nothing the replica sends reaches the apiserver
//! proxy.resume();  // what waited is sent, in order
//! ```

use std::net::SocketAddr;
use std::path::Path;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub struct StallProxy {
    addr: SocketAddr,
    stalled: watch::Sender<bool>,
    accept: JoinHandle<()>,
}

impl StallProxy {
    /// Listens on a free port of 127.0.0.1 and forwards every connection to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("binding the stall proxy");
        let addr = listener.local_addr().expect("stall proxy address");
        let (stalled, gate) = watch::channel(false);
        let accept = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                connections.spawn(forward(client, upstream, gate.clone()));
            }
        });
        Self { addr, stalled, accept }
    }

    /// Where the replica should connect: `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops forwarding client-to-server bytes on every connection, present and future.
    pub fn stall(&self) {
        self.stalled.send_replace(true);
    }

    /// Forwards again, first what waited.
    pub fn resume(&self) {
        self.stalled.send_replace(false);
    }

    pub fn is_stalled(&self) -> bool {
        *self.stalled.borrow()
    }
}

impl Drop for StallProxy {
    fn drop(&mut self) {
        // Dropping the accept task drops every connection task with it.
        self.accept.abort();
    }
}

/// The apiserver's address from a kubeconfig's `server: https://<ip>:<port>` (block or flow style).
pub fn upstream_of(kubeconfig: &Path) -> SocketAddr {
    let text = std::fs::read_to_string(kubeconfig).expect("reading the kubeconfig");
    let after = text.split("server:").nth(1).expect("a server in the kubeconfig");
    let url = after.trim_start().trim_start_matches('"');
    let hostport: String = url
        .trim_start_matches("https://")
        .chars()
        .take_while(|c| !matches!(c, '"' | '\'' | ',' | '}' | '/') && !c.is_whitespace())
        .collect();
    hostport.parse().unwrap_or_else(|e| panic!("server {hostport} is not https://<ip>:<port>: {e}"))
}

/// A copy of `kubeconfig` (next to it, named after `id`) whose server is `proxy`: every request
/// of a replica started with it goes through the proxy, its Leases' too.
pub fn kubeconfig_via(kubeconfig: &Path, proxy: &StallProxy, id: &str) -> std::path::PathBuf {
    let text = std::fs::read_to_string(kubeconfig).expect("reading the kubeconfig");
    let upstream = upstream_of(kubeconfig).to_string();
    assert!(text.contains(&upstream), "the kubeconfig names its server as {upstream}");
    let path = kubeconfig.with_file_name(format!("kubeconfig-via-proxy-{id}.yaml"));
    std::fs::write(&path, text.replace(&upstream, &proxy.addr().to_string())).expect("writing the proxied kubeconfig");
    path
}

async fn forward(client: TcpStream, upstream: SocketAddr, mut gate: watch::Receiver<bool>) {
    let Ok(server) = TcpStream::connect(upstream).await else { return };
    let _ = (client.set_nodelay(true), server.set_nodelay(true));
    let (mut from_client, mut to_client) = client.into_split();
    let (mut from_server, mut to_server) = server.into_split();
    let upstream = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match from_client.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            // Hold what was read while stalled; later bytes wait in the socket behind it.
            if gate.wait_for(|stalled| !*stalled).await.is_err() {
                break;
            }
            if to_server.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        let _ = to_server.shutdown().await;
    };
    let downstream = async {
        let _ = tokio::io::copy(&mut from_server, &mut to_client).await;
        let _ = to_client.shutdown().await;
    };
    tokio::join!(upstream, downstream);
}
