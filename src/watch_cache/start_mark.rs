//! A mark before every streamed initial state, so that a cache knows when one starts again.
//!
//! kube-runtime's streamed watch (`sendInitialEvents`) starts a new initial state without
//! saying so when its stream ends before the state's end (the apiserver closes the watch as it
//! shuts down, an idle timeout): the objects of the cut-short state stay in the cache's
//! buffer, and one deleted meanwhile would stay in the cache, as if it still existed, until
//! the next full read. Errors do not tell all such restarts apart (`reset_on_restart`).
//!
//! Every streamed initial state this replica asks for is a watch request of its own clients
//! with `sendInitialEvents=true`. This layer puts one line before the answer's events: an
//! `ADDED` event of an object without a name, uid or resourceVersion, which no object the
//! apiserver sends can be. kube-runtime hands it on as the first object of the state, and
//! `streaming_lists::reset_on_restart` turns it into `Init` (the cache's buffer starts over)
//! and drops it. Exact: one mark per watch request, whatever ended the one before.

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use tower::{Layer, Service};

/// The line put before a streamed initial state's events.
pub const START_MARK: &[u8] = b"{\"type\":\"ADDED\",\"object\":{\"metadata\":{}}}\n";

/// Whether `meta` is the mark's: no name, uid or resourceVersion (every object the apiserver
/// sends has all three).
pub fn is_start_mark(meta: &ObjectMeta) -> bool {
    meta.name.is_none() && meta.uid.is_none() && meta.resource_version.is_none()
}

/// Whether `request` asks for a streamed initial state.
pub(super) fn asks_for_initial_state<B>(request: &Request<B>) -> bool {
    request.uri().query().is_some_and(|q| q.split('&').any(|p| p == "sendInitialEvents=true"))
}

/// Puts `START_MARK` before the body of every successful answer to a request for a streamed
/// initial state; other answers pass unchanged.
#[derive(Clone, Copy, Debug, Default)]
pub struct StartMarkLayer;

impl<S> Layer<S> for StartMarkLayer {
    type Service = StartMarked<S>;
    fn layer(&self, inner: S) -> Self::Service {
        StartMarked(inner)
    }
}

#[derive(Clone, Debug)]
pub struct StartMarked<S>(S);

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for StartMarked<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Future: Send + 'static,
{
    type Response = Response<Marked<ResBody>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let marked = asks_for_initial_state(&request);
        let answer = self.0.call(request);
        Box::pin(async move {
            let response = answer.await?;
            let mark = (marked && response.status().is_success()).then(|| Bytes::from_static(START_MARK));
            Ok(response.map(|inner| Marked { mark, inner }))
        })
    }
}

/// A body with a mark before it (or none).
#[derive(Debug)]
pub struct Marked<B> {
    mark: Option<Bytes>,
    inner: B,
}

impl<B: Body<Data = Bytes> + Unpin> Body for Marked<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        if let Some(mark) = self.mark.take() {
            return Poll::Ready(Some(Ok(Frame::data(mark))));
        }
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.mark.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let inner = self.inner.size_hint();
        let extra = self.mark.as_ref().map_or(0, |m| m.len() as u64);
        // The upper bound first: `set_lower` refuses a lower bound above the upper one.
        let mut hint = SizeHint::new();
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper.saturating_add(extra));
        }
        hint.set_lower(inner.lower().saturating_add(extra));
        hint
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::App;
    use crate::app::config_map_key::ConfigMapKey;
    use crate::app::light::{GuardedApp, LightApp};
    use crate::watch_cache::Compact;
    use kube::Resource;
    use kube::core::WatchEvent;

    /// Every kind a replica streams reads the mark as an object that `is_start_mark` knows.
    #[test]
    fn every_streamed_kind_reads_the_mark_as_the_mark() {
        let line = std::str::from_utf8(START_MARK).expect("text").trim_end();
        fn object<K: serde::de::DeserializeOwned>(line: &str) -> K {
            match serde_json::from_str::<WatchEvent<K>>(line).expect("the mark reads as an event") {
                WatchEvent::Added(k) => k,
                _ => panic!("the mark is an ADDED event"),
            }
        }
        assert!(is_start_mark(object::<Compact<App>>(line).meta()));
        assert!(is_start_mark(object::<ConfigMapKey>(line).meta()));
        assert!(is_start_mark(object::<LightApp>(line).meta()));
        assert!(is_start_mark(object::<GuardedApp>(line).meta()));
        // An object as the apiserver sends it is never the mark.
        let real = r#"{"type":"ADDED","object":{"metadata":{"name":"web","namespace":"shop","uid":"u1","resourceVersion":"7"}}}"#;
        assert!(!is_start_mark(object::<Compact<App>>(real).meta()));
        assert!(!is_start_mark(object::<ConfigMapKey>(real).meta()));
    }

    async fn answer(uri: &str, status: u16) -> (u16, String) {
        use http_body_util::BodyExt;
        let status = http::StatusCode::from_u16(status).expect("a status");
        let service = tower::service_fn(move |_: Request<()>| async move {
            Ok::<_, std::convert::Infallible>(
                Response::builder()
                    .status(status)
                    .body(http_body_util::Full::new(Bytes::from("{}\n")))
                    .expect("a body"),
            )
        });
        let mut marked = StartMarkLayer.layer(service);
        let response = marked.call(Request::get(uri).body(()).expect("a request")).await.expect("an answer");
        let code = response.status().as_u16();
        // The size of what is read, mark included, as exact as the inner body's.
        let hint = response.body().size_hint();
        let length = if uri.contains("sendInitialEvents=true") && code == 200 { START_MARK.len() + 3 } else { 3 };
        assert_eq!((hint.lower(), hint.upper()), (length as u64, Some(length as u64)), "{uri}");
        let body = response.into_body().collect().await.expect("a body").to_bytes();
        (code, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn only_a_successful_streamed_initial_state_is_marked() {
        let mark = std::str::from_utf8(START_MARK).expect("text");
        let streamed = "/apis/flotilla.dev/v1beta1/namespaces/a/apps?watch=true&sendInitialEvents=true";
        assert_eq!(answer(streamed, 200).await, (200, format!("{mark}{{}}\n")));
        assert_eq!(answer(streamed, 422).await, (422, "{}\n".into()), "an error's Status stays as it is");
        let resumed = "/apis/flotilla.dev/v1beta1/namespaces/a/apps?watch=true&resourceVersion=5";
        assert_eq!(answer(resumed, 200).await, (200, "{}\n".into()));
        let listed = "/apis/flotilla.dev/v1beta1/namespaces/a/apps?limit=20";
        assert_eq!(answer(listed, 200).await, (200, "{}\n".into()));
    }
}
