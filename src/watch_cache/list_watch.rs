//! The caches' list-and-watch: kube-runtime's `watcher` state machine, step for step (the same
//! events, errors and recovery, so that `default_backoff`, `reflect` and `streaming_lists` work
//! on it unchanged), with two differences in what an idle watch holds:
//! - its events are read by `watch_lines`, which keeps no read buffer between them (kube's
//!   keeps 8 KiB, or the longest event seen, per watch);
//! - the futures of its requests are boxed while they run, so the stream itself is small while
//!   it waits for an event (kube's holds them inline: about 4.7 KB per watch).
//!
//! A replica serving a third of 10,000 Apps runs about 1,000 of these, three per namespace.

use futures::{Stream, StreamExt, future::BoxFuture};
use kube::Resource;
use kube::api::{Api, ListParams, VersionMatch, WatchParams};
use kube::core::WatchEvent;
use kube::runtime::watcher::{self, Event, InitialListStrategy, ListSemantic};
use serde::de::DeserializeOwned;
use std::collections::VecDeque;
use std::fmt::Debug;
use std::time::Duration;
use tracing::{debug, warn};

use super::watch_lines::{self, Events};

/// How much longer than the watch's own timeout a watch may stay silent before it is given up
/// and resumed (kube-runtime's margin).
const IDLE_MARGIN: Duration = Duration::from_secs(5);

/// The watch's timeout when its config names none (the apiserver's and kube's default).
const DEFAULT_TIMEOUT_SECS: u32 = 290;

enum State<K> {
    /// Nothing read yet, or starting over (410 Gone): list, or ask for a streamed initial state.
    Empty,
    /// Listing in pages: the objects of the page read, to hand out one at a time.
    InitPage {
        continue_token: Option<String>,
        objects: VecDeque<K>,
        last_version: Option<String>,
    },
    /// A streamed initial state, until the bookmark that marks its end.
    InitialWatch {
        stream: Events<K>,
    },
    /// Listed (or streamed) up to this version: watch from it.
    InitListed {
        resource_version: String,
    },
    Watching {
        resource_version: String,
        stream: Events<K>,
    },
}

fn list_params(config: &watcher::Config) -> ListParams {
    let (resource_version, version_match) = match config.list_semantic {
        ListSemantic::Any => (Some("0".into()), Some(VersionMatch::NotOlderThan)),
        ListSemantic::MostRecent => (None, None),
    };
    ListParams {
        label_selector: config.label_selector.clone(),
        field_selector: config.field_selector.clone(),
        timeout: config.timeout,
        version_match,
        resource_version,
        limit: config.page_size,
        continue_token: None,
    }
}

fn watch_params(config: &watcher::Config, initial: bool) -> WatchParams {
    WatchParams {
        label_selector: config.label_selector.clone(),
        field_selector: config.field_selector.clone(),
        timeout: config.timeout,
        bookmarks: config.bookmarks,
        send_initial_events: initial && config.initial_list_strategy == InitialListStrategy::StreamingList,
    }
}

/// Starts a watch of `api`'s objects from `version`. Boxed: a request's future is large, and
/// the stream would hold it inline while it waits.
fn start_watch<K>(api: &Api<K>, params: &WatchParams, version: &str) -> BoxFuture<'static, kube::Result<Events<K>>>
where
    K: Resource + Clone + DeserializeOwned + Send + 'static,
{
    let request = kube::core::Request::new(api.resource_url()).watch(params, version);
    let client = api.clone().into_client();
    Box::pin(async move {
        let mut request = request.map_err(kube::Error::BuildRequest)?;
        // The name of its trace span, as kube's `Api::watch` names it.
        request.extensions_mut().insert("watch");
        watch_lines::watch(&client, request).await
    })
}

fn list<K>(api: &Api<K>, params: ListParams) -> BoxFuture<'static, kube::Result<kube::core::ObjectList<K>>>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let api = api.clone();
    Box::pin(async move { api.list(&params).await })
}

fn forbidden(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(status) if status.is_forbidden())
}

/// The next event of a running watch, or `None` when it ended or stayed silent for longer than
/// its timeout (then it is resumed).
async fn next_event<K>(stream: &mut Events<K>, config: &watcher::Config) -> Option<kube::Result<WatchEvent<K>>> {
    let idle = Duration::from_secs(u64::from(config.timeout.unwrap_or(DEFAULT_TIMEOUT_SECS))) + IDLE_MARGIN;
    match tokio::time::timeout(idle, stream.next()).await {
        Ok(event) => event,
        Err(_) => {
            debug!(idle = ?idle, "a watch stayed silent past its timeout; resuming it");
            None
        }
    }
}

/// One step: an event to hand out (or none yet) and the state after it.
async fn step<K>(
    api: &Api<K>,
    config: &watcher::Config,
    state: State<K>,
) -> (Option<watcher::Result<Event<K>>>, State<K>)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    match state {
        State::Empty => match config.initial_list_strategy {
            InitialListStrategy::ListWatch => (
                Some(Ok(Event::Init)),
                State::InitPage { continue_token: None, objects: VecDeque::new(), last_version: None },
            ),
            InitialListStrategy::StreamingList => match start_watch(api, &watch_params(config, true), "0").await {
                Ok(stream) => (None, State::InitialWatch { stream }),
                Err(e) => {
                    log_error("could not start a watch", &e);
                    (Some(Err(watcher::Error::WatchStartFailed(e))), State::Empty)
                }
            },
        },
        State::InitPage { continue_token, mut objects, last_version } => {
            if let Some(next) = objects.pop_front() {
                return (Some(Ok(Event::InitApply(next))), State::InitPage { continue_token, objects, last_version });
            }
            if continue_token.is_none()
                && let Some(resource_version) = last_version
            {
                return (Some(Ok(Event::InitDone)), State::InitListed { resource_version });
            }
            let mut params = list_params(config);
            params.continue_token = continue_token;
            match list(api, params).await {
                Ok(page) => {
                    let last_version = page.metadata.resource_version.filter(|v| !v.is_empty());
                    let continue_token = page.metadata.continue_.filter(|c| !c.is_empty());
                    if last_version.is_none() && continue_token.is_none() {
                        return (Some(Err(watcher::Error::NoResourceVersion)), State::Empty);
                    }
                    (None, State::InitPage { continue_token, objects: page.items.into(), last_version })
                }
                Err(e) => {
                    log_error("could not list", &e);
                    (Some(Err(watcher::Error::InitialListFailed(e))), State::Empty)
                }
            }
        }
        State::InitialWatch { mut stream } => match next_event(&mut stream, config).await {
            Some(Ok(WatchEvent::Added(obj) | WatchEvent::Modified(obj))) => {
                (Some(Ok(Event::InitApply(obj))), State::InitialWatch { stream })
            }
            // The apiserver sends none during an initial state.
            Some(Ok(WatchEvent::Deleted(_))) => {
                warn!("a deletion arrived during a streamed initial state; ignored");
                (None, State::InitialWatch { stream })
            }
            Some(Ok(WatchEvent::Bookmark(mark))) => {
                if mark.metadata.annotations.contains_key("k8s.io/initial-events-end") {
                    let resource_version = mark.metadata.resource_version;
                    (Some(Ok(Event::InitDone)), State::Watching { resource_version, stream })
                } else {
                    (None, State::InitialWatch { stream })
                }
            }
            Some(Ok(WatchEvent::Error(status))) => {
                let gone = status.code == 410;
                log_status(&status);
                let next = if gone { State::Empty } else { State::InitialWatch { stream } };
                (Some(Err(watcher::Error::WatchError(status))), next)
            }
            Some(Err(e)) => {
                log_error("a watch failed", &e);
                (Some(Err(watcher::Error::WatchFailed(e))), State::InitialWatch { stream })
            }
            None => (None, State::Empty),
        },
        State::InitListed { resource_version } => {
            match start_watch(api, &watch_params(config, false), &resource_version).await {
                Ok(stream) => (None, State::Watching { resource_version, stream }),
                Err(e) => {
                    log_error("could not start a watch", &e);
                    (Some(Err(watcher::Error::WatchStartFailed(e))), State::InitListed { resource_version })
                }
            }
        }
        State::Watching { resource_version, mut stream } => match next_event(&mut stream, config).await {
            Some(Ok(WatchEvent::Added(obj) | WatchEvent::Modified(obj))) => match version_of(&obj) {
                Some(resource_version) => (Some(Ok(Event::Apply(obj))), State::Watching { resource_version, stream }),
                None => (Some(Err(watcher::Error::NoResourceVersion)), State::Empty),
            },
            Some(Ok(WatchEvent::Deleted(obj))) => match version_of(&obj) {
                Some(resource_version) => (Some(Ok(Event::Delete(obj))), State::Watching { resource_version, stream }),
                None => (Some(Err(watcher::Error::NoResourceVersion)), State::Empty),
            },
            Some(Ok(WatchEvent::Bookmark(mark))) => {
                (None, State::Watching { resource_version: mark.metadata.resource_version, stream })
            }
            Some(Ok(WatchEvent::Error(status))) => {
                let gone = status.code == 410;
                log_status(&status);
                let next = if gone { State::Empty } else { State::Watching { resource_version, stream } };
                (Some(Err(watcher::Error::WatchError(status))), next)
            }
            Some(Err(e)) => {
                log_error("a watch failed", &e);
                (Some(Err(watcher::Error::WatchFailed(e))), State::Watching { resource_version, stream })
            }
            None => (None, State::InitListed { resource_version }),
        },
    }
}

fn version_of<K: Resource>(obj: &K) -> Option<String> {
    obj.meta().resource_version.clone().filter(|v| !v.is_empty())
}

fn log_error(what: &str, e: &kube::Error) {
    if forbidden(e) {
        warn!(error = %e, "{what}: forbidden");
    } else {
        debug!(error = %e, "{what}");
    }
}

fn log_status(status: &kube::core::Status) {
    if status.is_forbidden() {
        warn!(message = %status.message, "a watch was refused: forbidden");
    } else {
        debug!(code = status.code, message = %status.message, "a watch answered with an error");
    }
}

/// The events of `api`'s objects as `config` asks for them: kube-runtime's `watcher`, leaner
/// while idle (see the module's text).
pub fn events<K>(api: Api<K>, config: watcher::Config) -> impl Stream<Item = watcher::Result<Event<K>>> + Send + 'static
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    futures::stream::unfold((api, config, State::Empty), |(api, config, mut state)| async move {
        loop {
            let (event, next) = step(&api, &config, state).await;
            state = next;
            if let Some(event) = event {
                return Some((event, (api, config, state)));
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;

    fn api() -> Api<ConfigMap> {
        let config = kube::Config::new("http://127.0.0.1:9".parse().expect("a URL"));
        Api::namespaced(kube::Client::try_from(config).expect("an offline client"), "a")
    }

    /// A scripted apiserver of ConfigMaps in namespace `a`: two pages, a watch that ends, one
    /// that resumes from the bookmark and is told 410 Gone, a list again, then a watch refused
    /// with 403 and one that stays open. Records the query of every request.
    async fn scripted() -> (String, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
        use axum::extract::{RawQuery, State};
        use std::sync::{Arc, Mutex};
        type Log = Arc<Mutex<Vec<String>>>;
        fn cm(name: &str, rv: u32) -> String {
            format!(
                r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"{name}","namespace":"a","resourceVersion":"{rv}"}}}}"#
            )
        }
        fn event(kind: &str, object: &str) -> String {
            format!("{{\"type\":\"{kind}\",\"object\":{object}}}\n")
        }
        async fn serve(State(log): State<Log>, RawQuery(q): RawQuery) -> axum::response::Response {
            use axum::response::IntoResponse;
            let q = q.unwrap_or_default();
            let seen = {
                let mut log = log.lock().expect("log");
                log.push(q.clone());
                log.iter().filter(|l| !l.contains("watch=true")).count()
            };
            let list = |items: &[String], rv: u32, cont: &str| {
                format!(
                    r#"{{"apiVersion":"v1","kind":"ConfigMapList","metadata":{{"resourceVersion":"{rv}","continue":"{cont}"}},"items":[{}]}}"#,
                    items.join(",")
                )
            };
            if !q.contains("watch=true") {
                let body = match (seen, q.contains("continue=c1")) {
                    (_, true) => list(&[cm("b", 2)], 10, ""),
                    (1, false) => list(&[cm("a", 1)], 10, "c1"),
                    _ => list(&[cm("a", 13)], 20, ""),
                };
                return body.into_response();
            }
            if q.contains("sendInitialEvents=true") {
                let streamed = log.lock().expect("log").iter().filter(|l| l.contains("sendInitialEvents=true")).count();
                let end = |rv: u32| {
                    format!(
                        r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"resourceVersion":"{rv}","annotations":{{"k8s.io/initial-events-end":"true"}}}}}}"#
                    )
                };
                let body = if streamed == 1 {
                    event("ADDED", &cm("a", 1)) + &event("ADDED", &cm("b", 2)) + &event("BOOKMARK", &end(10))
                } else {
                    event("ADDED", &cm("a", 13)) + &event("BOOKMARK", &end(20))
                };
                return body.into_response();
            }
            let bookmark = r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"resourceVersion":"12"}}"#;
            let gone = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"too old","reason":"Expired","code":410}"#;
            let forbidden = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"no","reason":"Forbidden","code":403}"#;
            if q.contains("resourceVersion=10&") || q.ends_with("resourceVersion=10") {
                return (event("ADDED", &cm("c", 11)) + &event("BOOKMARK", bookmark)).into_response();
            }
            if q.contains("resourceVersion=12") {
                return (event("MODIFIED", &cm("a", 13)) + &event("DELETED", &cm("b", 14)) + &event("ERROR", gone))
                    .into_response();
            }
            let watches_at_20 = log.lock().expect("log").iter().filter(|l| l.contains("resourceVersion=20")).count();
            if watches_at_20 == 1 {
                return (axum::http::StatusCode::FORBIDDEN, forbidden.to_string()).into_response();
            }
            let open = futures::stream::once(async { Ok::<_, std::convert::Infallible>(event("ADDED", &cm("d", 21))) })
                .chain(futures::stream::pending());
            axum::body::Body::from_stream(open).into_response()
        }
        let log: Log = Arc::default();
        let app = axum::Router::new()
            .route("/api/v1/namespaces/a/configmaps", axum::routing::get(serve))
            .with_state(log.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a port");
        let url = format!("http://{}", listener.local_addr().expect("an address"));
        tokio::spawn(async move { axum::serve(listener, app).await });
        (url, log)
    }

    fn described(event: &watcher::Result<Event<ConfigMap>>) -> String {
        let name = |c: &ConfigMap| {
            format!(
                "{}@{}",
                c.metadata.name.clone().unwrap_or_default(),
                c.metadata.resource_version.clone().unwrap_or_default()
            )
        };
        match event {
            Ok(Event::Init) => "Init".into(),
            Ok(Event::InitApply(c)) => format!("InitApply {}", name(c)),
            Ok(Event::InitDone) => "InitDone".into(),
            Ok(Event::Apply(c)) => format!("Apply {}", name(c)),
            Ok(Event::Delete(c)) => format!("Delete {}", name(c)),
            Err(e) => format!("Err {e}"),
        }
    }

    #[tokio::test]
    async fn the_same_events_and_requests_as_kube_runtimes_watcher() {
        for config in [watcher::Config::default().page_size(1), watcher::Config::default().streaming_lists()] {
            the_same_as_kube_runtimes_watcher(config).await;
        }
    }

    async fn the_same_as_kube_runtimes_watcher(config: watcher::Config) {
        let streamed = config.initial_list_strategy == InitialListStrategy::StreamingList;
        let mut runs = Vec::new();
        for ours in [true, false] {
            let (url, log) = scripted().await;
            let client = kube::Client::try_from(kube::Config::new(url.parse().expect("a URL"))).expect("a client");
            let api: Api<ConfigMap> = Api::namespaced(client, "a");
            let stream = if ours {
                events(api, config.clone()).boxed()
            } else {
                kube::runtime::watcher(api, config.clone()).boxed()
            };
            // Every event up to the open watch's first, after which the script sends nothing more.
            let mut stream = stream;
            let mut read = Vec::new();
            while let Ok(Some(event)) = tokio::time::timeout(Duration::from_secs(3), stream.next()).await {
                read.push(described(&event));
            }
            let requests = log.lock().expect("log").clone();
            runs.push((read, requests));
        }
        let (ours, kubes) = (&runs[0], &runs[1]);
        println!("events: {:#?}", ours.0);
        assert_eq!(ours.0, kubes.0, "the events");
        assert_eq!(ours.1, kubes.1, "the requests");
        let inits = if streamed { 0 } else { 2 };
        for (what, expected) in [("Delete b@14", 1), ("Init", inits), ("InitDone", 2), ("Apply d@21", 1)] {
            assert_eq!(ours.0.iter().filter(|e| *e == what).count(), expected, "{what} in {:#?}", ours.0);
        }
        assert!(ours.0.iter().any(|e| e.contains("403")), "the refused watch: {:#?}", ours.0);
    }

    #[tokio::test]
    async fn a_watch_stream_is_small_before_and_between_its_requests() {
        let config = watcher::Config::default().page_size(50);
        let ours = std::mem::size_of_val(&events(api(), config.clone()));
        let kubes = std::mem::size_of_val(&kube::runtime::watcher(api(), config));
        println!("a watch stream: {ours} bytes, kube-runtime's {kubes}");
        assert!(ours * 3 <= kubes, "a watch stream takes {ours} bytes, kube-runtime's {kubes}");
    }
}
