//! Whether the apiserver streams a watch's initial state (`sendInitialEvents`, the WatchList
//! feature: on by default since Kubernetes 1.34), so that caches of objects whose writers
//! choose their size can read them one at a time instead of in pages.
//!
//! A page is read whole as text before any of it is parsed, and copied once on the way in
//! (inside kube), so a page of Apps costs up to twice its length however little of it is
//! kept: 20 Apps of 1.5 MiB are 60 MiB at once, in each namespace's cache that lists at once.
//! Streamed, the initial state arrives as watch events, one object at a time.
//!
//! Older apiservers, or ones with the feature off, refuse such a watch; the caches then list
//! in pages, as before. Asked once, at start, with a watch of no object.

use futures::{Stream, StreamExt};
use kube::api::{Api, WatchParams};
use kube::core::WatchEvent;
use kube::runtime::watcher;
use serde::de::DeserializeOwned;
use std::fmt::Debug;
use std::time::Duration;
use tracing::{info, warn};

/// How long one probe waits for the end of the (empty) initial state.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);
/// Probes before a replica settles for pages when the apiserver neither streams nor refuses.
const PROBES: u32 = 3;

/// What a probe's answer says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// The initial state ended with the bookmark that marks its end.
    Streamed,
    /// The apiserver refused to send an initial state (400 or 422: the feature is off or
    /// unknown), with its reason.
    Refused(String),
    /// No answer that tells (an error of another kind, a watch that ended or timed out
    /// without the end bookmark): asked again.
    Unclear(String),
}

/// Whether `status` refuses a watch for asking for its initial state: the apiserver's answer
/// where WatchList is off (422, "sendInitialEvents is forbidden"), or where the parameter
/// is not known to a proxy on the way (400).
pub fn refuses(status: &kube::core::Status) -> bool {
    status.code == 422 || status.code == 400 || status.message.contains("sendInitialEvents")
}

/// The probe's reading of one watch event.
pub fn read<K>(event: Result<WatchEvent<K>, kube::Error>) -> Option<Answer> {
    match event {
        Ok(WatchEvent::Bookmark(b)) if b.metadata.annotations.contains_key("k8s.io/initial-events-end") => {
            Some(Answer::Streamed)
        }
        // An object of that name (anyone may name an App so), or a plain bookmark: read on.
        Ok(WatchEvent::Added(_) | WatchEvent::Modified(_) | WatchEvent::Deleted(_) | WatchEvent::Bookmark(_)) => None,
        Ok(WatchEvent::Error(status)) if refuses(&status) => Some(Answer::Refused(status.message.clone())),
        Ok(WatchEvent::Error(status)) => Some(Answer::Unclear(status.message.clone())),
        Err(kube::Error::Api(status)) if refuses(&status) => Some(Answer::Refused(status.message.clone())),
        Err(e) => Some(Answer::Unclear(e.to_string())),
    }
}

/// One probe: a watch of the objects named by a name no object has, asked to send its
/// initial state as of now (nothing, then a bookmark saying so), as the replica's watches
/// ask for it (`as_of_now`).
async fn probe<K>(api: &Api<K>) -> Answer
where
    K: Clone + DeserializeOwned + Debug + kube::Resource,
{
    let params = WatchParams::streaming_lists().fields("metadata.name=flotilla.dev-streaming-lists-probe").timeout(5);
    let read_all = async {
        let mut stream = match api.watch(&params, "").await {
            Ok(stream) => stream.boxed(),
            Err(e) => return read::<K>(Err(e)).unwrap_or(Answer::Unclear("no answer".into())),
        };
        while let Some(event) = stream.next().await {
            if let Some(answer) = read(event) {
                return answer;
            }
        }
        Answer::Unclear("the watch ended without marking the end of its initial state".into())
    };
    tokio::time::timeout(PROBE_TIMEOUT, read_all)
        .await
        .unwrap_or_else(|_| Answer::Unclear(format!("no end of the initial state within {PROBE_TIMEOUT:?}")))
}

/// Whether `api`'s apiserver streams initial states. Asked up to `PROBES` times while the
/// answer is unclear (an apiserver busy with a failover); pages, which always work, when
/// refused or never clear.
pub async fn supported<K>(api: &Api<K>) -> bool
where
    K: Clone + DeserializeOwned + Debug + kube::Resource,
{
    for attempt in 1..=PROBES {
        match probe(api).await {
            Answer::Streamed => {
                info!("the apiserver streams initial states (WatchList): Apps are read one at a time");
                return true;
            }
            Answer::Refused(reason) => {
                info!(reason, "the apiserver does not stream initial states (WatchList); Apps are listed in pages");
                return false;
            }
            Answer::Unclear(reason) if attempt < PROBES => {
                info!(reason, attempt, "could not tell whether the apiserver streams initial states; asking again");
                tokio::time::sleep(Duration::from_secs(u64::from(attempt))).await;
            }
            Answer::Unclear(reason) => {
                warn!(reason, "could not tell whether the apiserver streams initial states; Apps are listed in pages");
            }
        }
    }
    false
}

/// A request for a streamed initial state as of now rather than of any time: kube-runtime
/// asks for one from `resourceVersion=0` (what the apiserver's watch cache holds, however far
/// behind), where client-go sends none, which makes the apiserver wait until its cache has
/// caught up with storage first (as the quorum list of a paged watcher does). A replica that
/// takes over a namespace must not start from its App's state of before the last owner's
/// last writes (a rollback it made, for one). Other requests pass unchanged. Pure.
pub fn as_of_now<B>(mut request: http::Request<B>) -> http::Request<B> {
    let Some(query) = request.uri().query() else { return request };
    if !super::start_mark::asks_for_initial_state(&request) || !query.split('&').any(|p| p == "resourceVersion=0") {
        return request;
    }
    let kept: Vec<&str> = query.split('&').filter(|p| *p != "resourceVersion=0").collect();
    let path_and_query = format!("{}?{}", request.uri().path(), kept.join("&"));
    let mut parts = request.uri().clone().into_parts();
    match path_and_query.parse() {
        Ok(pq) => parts.path_and_query = Some(pq),
        Err(_) => return request,
    }
    if let Ok(uri) = http::Uri::from_parts(parts) {
        *request.uri_mut() = uri;
    }
    request
}

/// Whether a watcher's error is the apiserver refusing to stream an initial state.
pub fn refused(error: &watcher::Error) -> bool {
    match error {
        watcher::Error::WatchError(status) => refuses(status),
        watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status))
        | watcher::Error::InitialListFailed(kube::Error::Api(status)) => refuses(status),
        _ => false,
    }
}

/// A watch of `api`'s objects whose initial state is streamed (`streamed`) or listed in
/// pages by `paged`. A streamed watch that the apiserver refuses later (the feature turned
/// off since the probe, or an apiserver of another version behind the same address) goes
/// on in pages, at once and for good, with a warning.
pub fn watch<K>(
    api: Api<K>,
    paged: watcher::Config,
    streamed: bool,
) -> impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send + 'static
where
    K: kube::Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    if !streamed {
        return super::list_watch::events(api, paged).boxed();
    }
    let is_mark = |obj: &K| super::start_mark::is_start_mark(obj.meta());
    let streaming = reset_on_restart(super::list_watch::events(api.clone(), paged.clone().streaming_lists()), is_mark)
        .take_while(|event| {
            let go_on = !matches!(event, Err(e) if refused(e));
            if !go_on {
                warn!("the apiserver no longer streams initial states (WatchList); listing in pages from now on");
            }
            std::future::ready(go_on)
        });
    let then_paged = futures::stream::once(async move { super::list_watch::events(api, paged) }).flatten();
    streaming.chain(then_paged).boxed()
}

/// Whether kube-runtime starts a new initial state after `error` (it reads on from the same
/// stream after the others).
fn starts_over(error: &watcher::Error) -> bool {
    match error {
        watcher::Error::WatchError(status) => status.code == 410,
        watcher::Error::WatchStartFailed(_)
        | watcher::Error::InitialListFailed(_)
        | watcher::Error::NoResourceVersion => true,
        watcher::Error::WatchFailed(_) => false,
    }
}

/// kube-runtime's streamed watch sends no `Init` when it starts an initial state again, so a
/// cache's buffer would keep what a cut-short one sent: an object deleted meanwhile would stay
/// in the cache. This sends `Init` at the start of every initial state:
/// - where the replica's clients mark each streamed initial state (`start_mark`, `is_mark`
///   knows the mark): after each mark, which it drops, before the state's first object or
///   end. Exact, whatever ended the state before: an error, or a stream that ended without
///   one;
/// - before the first object (or end) of the first initial state, of one after the last
///   ended, and of one after an error that makes kube-runtime start over (410 Gone, a watch
///   that could not start): for a stream without marks.
///
/// After other errors kube-runtime reads on from the same stream (a line that did not decode,
/// a read error), and an `Init` there would throw away what that stream already sent: a cache
/// that then swaps in part of its objects, or none, as synced. So those send none.
pub fn reset_on_restart<K>(
    events: impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send + 'static,
    is_mark: fn(&K) -> bool,
) -> impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send + 'static
where
    K: Send + 'static,
{
    events
        .scan(true, move |fresh, event| {
            let out = match event {
                // Held back until the state's first object or end: an answer that fails before
                // either yields no `Ok` of its own, so kube's watch backoff still grows.
                Ok(watcher::Event::InitApply(obj)) if is_mark(&obj) => {
                    *fresh = true;
                    Vec::new()
                }
                Ok(e @ (watcher::Event::InitApply(_) | watcher::Event::InitDone)) => {
                    let ends = matches!(e, watcher::Event::InitDone);
                    let init = std::mem::replace(fresh, ends);
                    if init { vec![Ok(watcher::Event::Init), Ok(e)] } else { vec![Ok(e)] }
                }
                Ok(watcher::Event::Init) => {
                    *fresh = false;
                    vec![Ok(watcher::Event::Init)]
                }
                Err(e) => {
                    if starts_over(&e) {
                        *fresh = true;
                    }
                    vec![Err(e)]
                }
                Ok(e) => vec![Ok(e)],
            };
            std::future::ready(Some(futures::stream::iter(out)))
        })
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bookmark(end: bool) -> WatchEvent<()> {
        let annotations =
            if end { serde_json::json!({"k8s.io/initial-events-end": "true"}) } else { serde_json::json!({}) };
        serde_json::from_value(serde_json::json!({"type": "BOOKMARK",
            "object": {"apiVersion": "flotilla.dev/v1beta1", "kind": "App",
                "metadata": {"resourceVersion": "9", "annotations": annotations}}}))
        .expect("a bookmark")
    }

    #[test]
    fn only_the_end_of_an_initial_state_means_streamed() {
        let refusal = kube::core::Status::failure(
            "sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled",
            "Invalid",
        )
        .with_code(422);
        assert!(matches!(read::<()>(Err(kube::Error::Api(refusal.clone().boxed()))), Some(Answer::Refused(_))));
        assert!(matches!(read::<()>(Ok(WatchEvent::Error(refusal.boxed()))), Some(Answer::Refused(_))));
        let busy = kube::core::Status::failure("too many requests", "TooManyRequests").with_code(429);
        assert!(matches!(read::<()>(Err(kube::Error::Api(busy.clone().boxed()))), Some(Answer::Unclear(_))));
        assert!(matches!(read::<()>(Ok(WatchEvent::Error(busy.boxed()))), Some(Answer::Unclear(_))));
        assert_eq!(read(Ok(bookmark(false))), None, "a plain bookmark (a watch that ignored the ask): read on");
        assert_eq!(read(Ok(WatchEvent::Added(()))), None, "an object of the probe's name: read on");
        assert_eq!(read(Ok(bookmark(true))), Some(Answer::Streamed));
    }

    fn init_events(events: Vec<watcher::Result<watcher::Event<u32>>>) -> Vec<String> {
        // 0 stands for the mark.
        let out = futures::executor::block_on(
            reset_on_restart(futures::stream::iter(events), |n| *n == 0).collect::<Vec<_>>(),
        );
        out.into_iter()
            .map(|e| match e {
                Ok(watcher::Event::Init) => "init".to_string(),
                Ok(watcher::Event::InitApply(n)) => format!("i{n}"),
                Ok(watcher::Event::InitDone) => "done".to_string(),
                Ok(watcher::Event::Apply(n)) => format!("a{n}"),
                Ok(watcher::Event::Delete(n)) => format!("d{n}"),
                Err(_) => "err".to_string(),
            })
            .collect()
    }

    #[test]
    fn every_initial_state_that_starts_anew_starts_with_init() {
        use watcher::Event::{Apply, InitApply, InitDone};
        let gone = || {
            Err(watcher::Error::WatchError(kube::core::Status::failure("too old", "Expired").with_code(410).boxed()))
        };
        let not_started = || Err(watcher::Error::WatchStartFailed(kube::Error::LinesCodecMaxLineLengthExceeded));
        let line = || Err(watcher::Error::WatchFailed(kube::Error::LinesCodecMaxLineLengthExceeded));
        let other = || Err(watcher::Error::WatchError(kube::core::Status::failure("busy", "x").with_code(500).boxed()));
        assert_eq!(
            init_events(vec![Ok(InitApply(1)), Ok(InitApply(2)), Ok(InitDone), Ok(Apply(3))]),
            ["init", "i1", "i2", "done", "a3"]
        );
        // Gone, or not started: a new initial state, the buffer starts over.
        assert_eq!(
            init_events(vec![Ok(InitApply(1)), gone(), Ok(InitApply(1)), Ok(InitApply(2)), Ok(InitDone)]),
            ["init", "i1", "err", "init", "i1", "i2", "done"]
        );
        assert_eq!(init_events(vec![not_started(), Ok(InitApply(1)), Ok(InitDone)]), ["err", "init", "i1", "done"]);
        // After an error kube-runtime reads on from: the same initial state goes on, kept whole.
        for error in [line(), other()] {
            assert_eq!(
                init_events(vec![Ok(InitApply(1)), error, Ok(InitApply(2)), Ok(InitDone)]),
                ["init", "i1", "err", "i2", "done"]
            );
        }
        // Streamed again after a watch that ran, and an empty initial state.
        assert_eq!(
            init_events(vec![Ok(InitDone), Ok(Apply(1)), gone(), Ok(InitApply(1)), Ok(InitDone)]),
            ["init", "done", "a1", "err", "init", "i1", "done"]
        );
        // Marked: each mark starts the state anew, also after a stream that ended without an
        // error (kube-runtime then just watches again); the mark itself is dropped.
        assert_eq!(
            init_events(vec![Ok(InitApply(0)), Ok(InitApply(1)), Ok(InitApply(0)), Ok(InitApply(2)), Ok(InitDone)]),
            ["init", "i1", "init", "i2", "done"]
        );
        assert_eq!(
            init_events(vec![
                Ok(InitApply(0)),
                Ok(InitApply(1)),
                gone(),
                Ok(InitApply(0)),
                Ok(InitApply(2)),
                Ok(InitDone)
            ]),
            ["init", "i1", "err", "init", "i2", "done"]
        );
        assert_eq!(
            init_events(vec![Ok(InitApply(0)), Ok(InitApply(1)), line(), Ok(InitApply(2)), Ok(InitDone)]),
            ["init", "i1", "err", "i2", "done"],
            "read on after an error: no new mark, no Init"
        );
        // A watch that fails after its mark, before any object, yields its error first (kube's
        // backoff grows on errors and starts over on anything else).
        assert_eq!(
            init_events(vec![Ok(InitApply(0)), line(), Ok(InitApply(0)), Ok(InitDone)]),
            ["err", "init", "done"]
        );
        // Listed in pages (kube-runtime sends Init itself): not sent twice.
        assert_eq!(init_events(vec![Ok(watcher::Event::Init), Ok(InitApply(1)), Ok(InitDone)]), ["init", "i1", "done"]);
    }

    #[test]
    fn a_streamed_initial_state_is_asked_for_as_of_now() {
        use kube::core::{Request, params::ListParams};
        let uri = |r: http::Request<Vec<u8>>| as_of_now(r).uri().to_string();
        // As kube builds them.
        let apps = Request::new("/apis/flotilla.dev/v1beta1/namespaces/a/apps");
        let streamed = apps.watch(&WatchParams::streaming_lists(), "0").expect("a request");
        let asked = uri(streamed);
        assert!(
            asked.contains("sendInitialEvents=true") && asked.contains("resourceVersionMatch=NotOlderThan"),
            "{asked}"
        );
        assert!(!asked.contains("resourceVersion=0"), "{asked}");
        let resumed = apps.watch(&WatchParams::default(), "0").expect("a request");
        let resumed_uri = resumed.uri().to_string();
        assert_eq!(uri(resumed), resumed_uri, "not a streamed initial state");
        let listed = apps.list(&ListParams::default().limit(20)).expect("a request");
        let listed_uri = listed.uri().to_string();
        assert_eq!(uri(listed), listed_uri);
        let at = "https://127.0.0.1:6443/apis/x/v1/apps?watch=true&sendInitialEvents=true&resourceVersion=0&resourceVersionMatch=NotOlderThan";
        let request = http::Request::get(at).body(Vec::new()).expect("a request");
        assert_eq!(
            uri(request),
            "https://127.0.0.1:6443/apis/x/v1/apps?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan"
        );
    }

    #[test]
    fn a_refusal_is_told_apart_from_other_errors() {
        let status = |code: u16, message: &str| kube::core::Status::failure(message, "x").with_code(code).boxed();
        assert!(refused(&watcher::Error::WatchError(status(422, "sendInitialEvents is forbidden"))));
        assert!(refused(&watcher::Error::WatchFailed(kube::Error::Api(status(400, "bad")))));
        assert!(refused(&watcher::Error::WatchStartFailed(kube::Error::Api(status(422, "invalid")))));
        assert!(!refused(&watcher::Error::WatchError(status(410, "too old resource version"))));
        assert!(!refused(&watcher::Error::WatchError(status(403, "forbidden"))));
        assert!(!refused(&watcher::Error::NoResourceVersion));
    }
}
