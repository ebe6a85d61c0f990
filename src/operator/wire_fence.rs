//! The write fence at the moment a request leaves the replica.
//!
//! Reconciles check the fence when they decide to write, but a request then waits for a
//! permit of the bound on requests in flight, and may be sent again by the retry layer after
//! a 429 or 5xx: a write that passed the check at renew + 3.9 s could leave after the Lease
//! expired and a peer took the shard. This layer sits below the concurrency bound and below
//! the retry layer, right above the connection, so every write (and every retry of one) is
//! checked again when it is really sent. A write whose shard lapsed is dropped, counted, and
//! answered with [`Fenced`]; it never reaches the apiserver.
//!
//! What it cannot stop is a write already on the wire that the network or the apiserver holds
//! back: those carry preconditions (resourceVersion, uid) that make a stale writer fail
//! instead of win (see `app::reconcile`).

use futures::future::{BoxFuture, FutureExt};
use http::{Method, Request};
use prometheus::IntCounter;
use std::task::{Context, Poll};
use tower::{BoxError, Layer, Service};

use crate::sharding::fence::Fence;

use crate::sharding::fence::Fenced;

/// The namespace a request path writes in, if it is a namespaced path:
/// `/api/v1/namespaces/<ns>/...` or `/apis/<group>/<version>/namespaces/<ns>/...`.
/// `/api/v1/namespaces/<ns>` itself (the Namespace object) names `<ns>` too.
pub fn namespace_of(path: &str) -> Option<&str> {
    let mut parts = path.trim_start_matches('/').split('/');
    let skip = match parts.next()? {
        "api" => 1,
        "apis" => 2,
        _ => return None,
    };
    let mut parts = parts.skip(skip);
    match (parts.next(), parts.next()) {
        (Some("namespaces"), Some(ns)) if !ns.is_empty() => Some(ns),
        _ => None,
    }
}

/// Whether a request writes (anything but a read).
pub(crate) fn is_write(method: &Method) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// Refuses writes into namespaces whose shard this replica does not hold now.
#[derive(Clone)]
pub struct WireFenceLayer {
    fence: Fence,
    dropped: IntCounter,
    /// The path of the apiserver's URL (`/k8s/clusters/c-1` behind some proxies), which kube's
    /// base-URI layer puts in front of every request path.
    prefix: std::sync::Arc<str>,
}

impl WireFenceLayer {
    pub fn new(fence: Fence, dropped: IntCounter) -> Self {
        Self { fence, dropped, prefix: std::sync::Arc::from("") }
    }

    /// The same fence for an apiserver reached under `base_path`.
    pub fn under(&self, base_path: &str) -> Self {
        Self { prefix: std::sync::Arc::from(base_path.trim_end_matches('/')), ..self.clone() }
    }
}

/// What the fence decides for a request: writes leave only into a namespace whose shard this
/// replica holds; a write whose namespace cannot be read from its path is refused (these
/// clients write only into namespaces, so such a path is a mistake, never a reason to skip
/// the check).
fn refusal<'a>(fence: &Fence, prefix: &str, method: &Method, path: &'a str) -> Option<&'a str> {
    if !is_write(method) {
        return None;
    }
    let path = path.strip_prefix(prefix).unwrap_or(path);
    match namespace_of(path) {
        Some(namespace) if fence.may_write(namespace) => None,
        Some(namespace) => Some(namespace),
        None => Some(""),
    }
}

impl<S> Layer<S> for WireFenceLayer {
    type Service = WireFence<S>;

    fn layer(&self, inner: S) -> Self::Service {
        WireFence { inner, fence: self.fence.clone(), dropped: self.dropped.clone(), prefix: self.prefix.clone() }
    }
}

#[derive(Clone)]
pub struct WireFence<S> {
    inner: S,
    fence: Fence,
    dropped: IntCounter,
    prefix: std::sync::Arc<str>,
}

impl<S, B> Service<Request<B>> for WireFence<S>
where
    S: Service<Request<B>, Error = BoxError>,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<S::Response, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        if let Some(namespace) = refusal(&self.fence, &self.prefix, req.method(), req.uri().path()) {
            self.dropped.inc();
            let err = Fenced { method: req.method().clone(), namespace: namespace.to_string() };
            tracing::warn!(namespace = err.namespace, method = %err.method, path = req.uri().path(), "write dropped at send time: shard hold lapsed");
            return futures::future::ready(Err(BoxError::from(err))).boxed();
        }
        self.inner.call(req).boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};
    use tower::ServiceExt;

    #[test]
    fn namespaces_of_request_paths() {
        let cases = [
            ("/api/v1/namespaces/shop/services/web", Some("shop")),
            ("/api/v1/namespaces/shop", Some("shop")),
            ("/apis/apps/v1/namespaces/shop-prod/deployments/web?fieldManager=flotilla", Some("shop-prod")),
            ("/apis/flotilla.dev/v1beta1/namespaces/a/apps/web/status", Some("a")),
            ("/apis/events.k8s.io/v1/namespaces/a/events", Some("a")),
            ("/api/v1/namespaces", None),
            ("/api/v1/namespaces/", None),
            ("/apis/flotilla.dev/v1beta1/tenants/shop", None),
            ("/apis/apps/v1/deployments", None),
            ("/healthz", None),
            ("/apis/apps/v1/namespace/x/deployments", None),
        ];
        for (path, want) in cases {
            assert_eq!(namespace_of(path), want, "{path}");
        }
    }

    fn request(method: Method, path: &str) -> Request<()> {
        Request::builder().method(method).uri(path).body(()).expect("a valid request")
    }

    #[tokio::test]
    async fn writes_leave_only_while_the_shard_is_held() {
        let fence = Fence::new(32, Duration::from_secs(4));
        let dropped = IntCounter::new("dropped", "test").expect("a counter");
        let sent = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = sent.clone();
        let inner = tower::service_fn(move |_: Request<()>| {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            futures::future::ready(Ok::<_, BoxError>(()))
        });
        let svc = WireFenceLayer::new(fence.clone(), dropped.clone()).layer(inner);
        let path = "/apis/apps/v1/namespaces/team-a-prod/deployments/web"; // shard 0 of 32

        // Reads always pass; writes only within the renew deadline of the shard.
        assert!(svc.clone().oneshot(request(Method::GET, path)).await.is_ok());
        let refused = svc.clone().oneshot(request(Method::PATCH, path)).await;
        assert!(refused.as_ref().is_err_and(|e| e.downcast_ref::<Fenced>().is_some()), "{refused:?}");
        fence.renewed(0, Instant::now());
        assert!(svc.clone().oneshot(request(Method::PATCH, path)).await.is_ok());
        assert!(svc.clone().oneshot(request(Method::DELETE, path)).await.is_ok());
        // A renewal older than the deadline: the write that waited is dropped when it leaves.
        fence.renewed(0, Instant::now() - Duration::from_secs(5));
        assert!(svc.clone().oneshot(request(Method::POST, path)).await.is_err());
        // A write whose namespace the path does not name is refused: fail closed.
        assert!(svc.clone().oneshot(request(Method::POST, "/api/v1/namespaces")).await.is_err());
        assert_eq!(sent.load(std::sync::atomic::Ordering::SeqCst), 3);
        assert_eq!(dropped.get(), 3);

        // Behind a proxy that serves the apiserver under a path, the same holds.
        let proxied = WireFenceLayer::new(fence.clone(), dropped.clone())
            .under("/k8s/clusters/c-1/")
            .layer(tower::service_fn(|_: Request<()>| futures::future::ready(Ok::<_, BoxError>(()))));
        let prefixed = format!("/k8s/clusters/c-1{path}");
        assert!(
            proxied.clone().oneshot(request(Method::PATCH, &prefixed)).await.is_err(),
            "stale hold, under a prefix"
        );
        fence.renewed(0, Instant::now());
        assert!(proxied.clone().oneshot(request(Method::PATCH, &prefixed)).await.is_ok());
        assert!(
            proxied
                .clone()
                .oneshot(request(Method::PATCH, "/k8s/clusters/c-1/apis/apps/v1/namespaces/other/deployments/x"))
                .await
                .is_err()
        );
    }
}
