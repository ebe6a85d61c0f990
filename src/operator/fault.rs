//! A fault the end-to-end tests inject to prove that no decision is lost when a replica dies
//! between two writes: with `FLOTILLA_FAULT_ABORT_AFTER_WRITES=n` in its environment, a
//! replica aborts (as `kill -9` would stop it: no cleanup, no Lease release) right after the
//! apiserver accepted its n-th write into a namespace. Events do not count: they record, they
//! decide nothing. Everything else runs the production path; without the variable the layer
//! is not even built.

use futures::future::{BoxFuture, FutureExt};
use http::{Method, Request, Response};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use tower::{BoxError, Layer, Service};

use super::wire_fence::{is_write, namespace_of};

/// The environment variable that arms the fault.
pub const ABORT_AFTER_WRITES: &str = "FLOTILLA_FAULT_ABORT_AFTER_WRITES";

/// Aborts the process after `after` accepted writes.
#[derive(Clone, Debug)]
pub struct AbortAfterWrites {
    after: u64,
    count: Arc<AtomicU64>,
}

impl AbortAfterWrites {
    /// The fault the environment asks for, if any.
    pub fn from_env() -> Option<Self> {
        let after = std::env::var(ABORT_AFTER_WRITES).ok()?.trim().parse::<u64>().ok()?;
        tracing::warn!(after, "fault injection armed: the replica aborts after this many accepted writes");
        Some(Self { after, count: Arc::default() })
    }

    /// Whether a request counts: a write into a namespace, other than an Event.
    pub fn counts(method: &Method, path: &str) -> bool {
        is_write(method) && namespace_of(path).is_some() && !path.contains("/events")
    }
}

impl<S> Layer<S> for AbortAfterWrites {
    type Service = AbortAfterWritesService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        AbortAfterWritesService { inner, fault: self.clone() }
    }
}

#[derive(Clone)]
pub struct AbortAfterWritesService<S> {
    inner: S,
    fault: AbortAfterWrites,
}

impl<S, B, R> Service<Request<B>> for AbortAfterWritesService<S>
where
    S: Service<Request<B>, Response = Response<R>, Error = BoxError>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<S::Response, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let counts = AbortAfterWrites::counts(req.method(), req.uri().path());
        let what = format!("{} {}", req.method(), req.uri().path());
        let fault = self.fault.clone();
        let answer = self.inner.call(req);
        async move {
            let response = answer.await?;
            if counts && response.status().is_success() {
                let n = fault.count.fetch_add(1, Ordering::SeqCst) + 1;
                if n >= fault.after {
                    eprintln!("fault injection: aborting after accepted write {n}: {what}");
                    std::process::abort();
                }
            }
            Ok(response)
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_namespaced_writes_other_than_events_count() {
        let path = "/apis/apps/v1/namespaces/a/deployments/web";
        assert!(AbortAfterWrites::counts(&Method::PATCH, path));
        assert!(AbortAfterWrites::counts(&Method::DELETE, path));
        assert!(!AbortAfterWrites::counts(&Method::GET, path));
        assert!(!AbortAfterWrites::counts(&Method::POST, "/apis/events.k8s.io/v1/namespaces/a/events"));
        assert!(!AbortAfterWrites::counts(&Method::PUT, "/apis/coordination.k8s.io/v1/leases"));
    }
}
