//! `flotilla dashboard`: a web UI on 127.0.0.1 that reads and acts with the user's own
//! kubeconfig, so that everyone sees and does exactly what their RBAC allows. Pages are
//! rendered on the server (`pages`, from the pure view models of `model`); a small script
//! follows server-sent events (`live`) and fetches a page's content again when what it shows
//! changes. `guard` keeps other sites and hosts out.

pub mod guard;
pub mod live;
pub mod model;
pub mod pages;
pub mod series;

use axum::Router;
use axum::extract::{Form, Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use futures::{Stream, StreamExt};
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Namespace};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::reflector::Store;
use kube::{Client, ResourceExt};
use maud::Markup;
use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::api::{App, Tenant};
use crate::app::lenient::{LenientApp, Unreadable};
use crate::cli::control::{self, Request as ControlRequest};
use crate::rollout::planner::Verb;
use crate::rollout::prometheus::PrometheusClient;
use live::{AppStores, Live};
use model::{Action, Filter};
use pages::Frame;

/// Messages of actions kept for the page they lead back to.
const FLASHES_KEPT: usize = 64;
/// How long the dashboard waits for its first lists before it serves anyway.
const FIRST_LIST_WAIT: Duration = Duration::from_secs(30);
/// Header the page's script sends to get only the content of `main`.
const FRAGMENT_HEADER: &str = "x-flotilla-fragment";

#[derive(clap::Args, Debug)]
pub struct DashboardArgs {
    /// Kubeconfig to use; default: $KUBECONFIG, then ~/.kube/config. The dashboard reads and
    /// acts with exactly these credentials.
    #[arg(long, env = "FLOTILLA_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Port to listen on (0: any free port; the URL printed says which).
    #[arg(long, default_value_t = 3100)]
    pub port: u16,
    /// Address to listen on. The default keeps the dashboard on this machine.
    #[arg(long, default_value = "127.0.0.1")]
    pub address: IpAddr,
    /// Another host name the dashboard answers to (for example behind `kubectl port-forward`
    /// or a tunnel); requests naming any other host are refused (DNS rebinding).
    #[arg(long = "public-host", value_delimiter = ',')]
    pub public_hosts: Vec<String>,
    /// Show only these namespaces (comma-separated or repeated). Default: the whole cluster
    /// when the credentials may list Apps everywhere, else the kubeconfig context's namespace.
    #[arg(short = 'n', long = "namespace", value_delimiter = ',')]
    pub namespaces: Vec<String>,
    /// Namespace the operator runs in (where the shard Leases are).
    #[arg(long, env = "POD_NAMESPACE", default_value = "flotilla-system")]
    pub operator_namespace: String,
    /// Number of shards (as given to the replicas).
    #[arg(long, env = "FLOTILLA_SHARDS", default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub shards: u32,
    /// A Prometheus this machine reaches (for example through `kubectl port-forward`): an
    /// App's page plots its checks over the whole rollout from it. Queries are limited to the
    /// App's namespace, and Apps whose analysis names another Prometheus are not asked about.
    #[arg(long, env = "FLOTILLA_DASHBOARD_PROMETHEUS_URL")]
    pub prometheus_url: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum DashboardError {
    #[error("reading Apps to find what these credentials may see: {0}")]
    Probe(#[source] Box<kube::Error>),
    #[error("-n {0}: not a namespace name (lower-case letters, digits and '-', at most 63)")]
    Namespace(String),
    #[error("making the token of the dashboard's forms: no system randomness")]
    Token,
    #[error("listening on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("serving: {0}")]
    Serve(#[source] std::io::Error),
    #[error("{0}")]
    Prometheus(#[from] crate::rollout::prometheus::ClientError),
}

/// What every request handler shares.
struct Dashboard {
    client: Client,
    identity: String,
    scope: String,
    apps: AppStores,
    tenants: Option<Store<Tenant>>,
    sees_shards: bool,
    operator_namespace: String,
    shards: u32,
    /// The user's Prometheus and a client for it.
    prometheus: Option<(String, PrometheusClient)>,
    token: String,
    /// The key of the URL printed, and the cookie it becomes.
    session_key: String,
    cookie: String,
    hosts: guard::Hosts,
    live: Arc<Live>,
    /// Notices that namespaces could not be watched.
    notices: Vec<String>,
    flashes: Mutex<VecDeque<Flash>>,
    next_flash: AtomicU64,
}

type Shared = Arc<Dashboard>;

/// The outcome of an action, shown once on the page of the App it was taken on.
struct Flash {
    id: u64,
    namespace: String,
    name: String,
    message: String,
}

/// Longest time a page (or an action) may take; the live events are not bounded.
const PAGE_TIMEOUT: Duration = Duration::from_secs(20);
/// Events read for an App's page: a tenant can create many naming its App.
const EVENTS_READ: u32 = 500;

/// Who the credentials are, as the apiserver sees them.
async fn whoami(client: &Client) -> String {
    let api: Api<SelfSubjectReview> = Api::all(client.clone());
    match api.create(&PostParams::default(), &SelfSubjectReview::default()).await {
        Ok(r) => r.status.and_then(|s| s.user_info).and_then(|u| u.username).unwrap_or_else(|| "(unknown)".into()),
        Err(_) => "(unknown)".into(),
    }
}

fn forbidden(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 403)
}

/// Serves the dashboard until Ctrl-C; `on_listening` gets the URL once it listens.
pub async fn serve(client: Client, args: DashboardArgs, on_listening: impl FnOnce(&str)) -> Result<(), DashboardError> {
    let live = Live::new();
    let probe = ListParams::default().limit(1);
    let mut notices = Vec::new();
    if let Some(bad) = args.namespaces.iter().find(|ns| guard::check_names(ns, "x").is_err()) {
        return Err(DashboardError::Namespace(bad.clone()));
    }
    let (namespaces, scope) = if !args.namespaces.is_empty() {
        (Some(args.namespaces.clone()), format!("namespaces {}", args.namespaces.join(", ")))
    } else {
        match Api::<App>::all(client.clone()).list_metadata(&probe).await {
            Ok(_) => (None, "all namespaces".to_string()),
            Err(e) if forbidden(&e) => {
                let ns = client.default_namespace().to_string();
                notices.push(format!(
                    "Your credentials may not list Apps in every namespace: showing namespace {ns}. \
                     Start the dashboard with -n to choose others."
                ));
                (Some(vec![ns.clone()]), format!("namespace {ns}"))
            }
            Err(e) => return Err(DashboardError::Probe(Box::new(e))),
        }
    };
    // A namespace whose Apps the user may not list would hold its store unready forever.
    let watched = match &namespaces {
        None => None,
        Some(list) => {
            let mut ok = Vec::new();
            for ns in list {
                match Api::<App>::namespaced(client.clone(), ns).list_metadata(&probe).await {
                    Ok(_) => ok.push(ns.clone()),
                    Err(e) => notices.push(format!("Namespace {ns} is not shown: {}", api_message(&e))),
                }
            }
            Some(ok)
        }
    };
    let apps = live::watch_apps(&client, watched.as_deref(), &live);
    let tenants = match Api::<Tenant>::all(client.clone()).list_metadata(&probe).await {
        Ok(_) => Some(live::watch_tenants(&client, &live)),
        Err(_) => None,
    };
    let lease_probe = ListParams::default().labels("flotilla.dev/lease=shard").limit(1);
    let sees_shards =
        Api::<Lease>::namespaced(client.clone(), &args.operator_namespace).list_metadata(&lease_probe).await.is_ok();
    if sees_shards {
        live::watch_leases(&client, &args.operator_namespace, &live);
    }
    for (_, store) in &apps.0 {
        let _ = tokio::time::timeout(FIRST_LIST_WAIT, store.wait_until_ready()).await;
    }
    if let Some(t) = &tenants {
        let _ = tokio::time::timeout(FIRST_LIST_WAIT, t.wait_until_ready()).await;
    }
    let addr = SocketAddr::new(args.address, args.port);
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|source| DashboardError::Bind { addr, source })?;
    let local = listener.local_addr().map_err(|source| DashboardError::Bind { addr, source })?;
    let state = Arc::new(Dashboard {
        identity: whoami(&client).await,
        client,
        scope,
        apps,
        tenants,
        sees_shards,
        operator_namespace: args.operator_namespace,
        shards: args.shards,
        prometheus: match args.prometheus_url {
            Some(url) => Some((url, PrometheusClient::new()?)),
            None => None,
        },
        token: guard::new_token().map_err(|_| DashboardError::Token)?,
        session_key: guard::new_token().map_err(|_| DashboardError::Token)?,
        cookie: guard::cookie_name(local.port()),
        hosts: guard::Hosts::new(local, &args.public_hosts),
        live,
        notices,
        flashes: Mutex::new(VecDeque::new()),
        next_flash: AtomicU64::new(1),
    });
    let host = if local.ip().is_unspecified() { "127.0.0.1".to_string() } else { local.ip().to_string() };
    let url = match local {
        SocketAddr::V6(_) if !local.ip().is_unspecified() => format!("http://[{host}]:{}/", local.port()),
        _ => format!("http://{host}:{}/", local.port()),
    };
    on_listening(&format!("{url}login?key={} (as {}, {})", state.session_key, state.identity, state.scope));
    axum::serve(listener, router(state))
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
        .map_err(DashboardError::Serve)
}

fn router(state: Shared) -> Router {
    Router::new()
        .route("/", get(overview))
        .route("/login", get(login))
        .route("/apps/{namespace}/{name}", get(app_page))
        .route("/apps/{namespace}/{name}/action", post(action))
        .route("/shards", get(shards_page))
        .route("/live", get(live_events))
        .route(
            "/assets/dashboard.css",
            get(|| async { asset("text/css; charset=utf-8", include_str!("dashboard.css")) }),
        )
        .route(
            "/assets/dashboard.js",
            get(|| async { asset("text/javascript; charset=utf-8", include_str!("dashboard.js")) }),
        )
        .layer(middleware::from_fn_with_state(state.clone(), guard_layer))
        .with_state(state)
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    ([(axum::http::header::CONTENT_TYPE, content_type)], body).into_response()
}

/// Refuses requests naming another host, sent by another site, or without the session's
/// cookie; bounds the time of every page; sets the security headers on every response.
async fn guard_layer(State(d): State<Shared>, request: Request, next: Next) -> Response {
    let path = request.uri().path().to_string();
    let open = path == "/login" || path.starts_with("/assets/");
    let refused = d
        .hosts
        .check(request.headers())
        .map_err(|r| (StatusCode::MISDIRECTED_REQUEST, r))
        .and_then(|()| d.hosts.check_fetch(request.headers(), request.method()).map_err(|r| (StatusCode::FORBIDDEN, r)))
        .and_then(|()| {
            if open || guard::has_session(request.headers(), &d.cookie, &d.session_key) {
                Ok(())
            } else {
                Err((StatusCode::UNAUTHORIZED, guard::Refused::Session))
            }
        });
    let mut response = match refused {
        Err((status, refused)) => (status, refused.to_string()).into_response(),
        Ok(()) if path == "/live" => next.run(request).await,
        Ok(()) => match tokio::time::timeout(PAGE_TIMEOUT, next.run(request)).await {
            Ok(response) => response,
            Err(_) => (StatusCode::GATEWAY_TIMEOUT, format!("no answer within {PAGE_TIMEOUT:?}")).into_response(),
        },
    };
    for (name, value) in guard::SECURITY_HEADERS {
        response.headers_mut().insert(name, HeaderValue::from_static(value));
    }
    response.headers_mut().insert("vary", HeaderValue::from_static(FRAGMENT_HEADER));
    response
}

#[derive(serde::Deserialize)]
struct LoginQuery {
    #[serde(default)]
    key: String,
}

/// Opens a session: the key of the printed URL becomes a cookie, and the URL loses it.
async fn login(State(d): State<Shared>, Query(q): Query<LoginQuery>) -> Response {
    let ok = guard::same_key(&q.key, &d.session_key);
    if !ok {
        return (StatusCode::UNAUTHORIZED, guard::Refused::Session.to_string()).into_response();
    }
    let cookie = guard::session_cookie(&d.cookie, &d.session_key);
    let mut response = Redirect::to("/").into_response();
    if let Ok(value) = HeaderValue::from_str(&cookie) {
        response.headers_mut().insert(axum::http::header::SET_COOKIE, value);
    }
    response
}

/// The page, or only its content when the page's script asks for it.
fn respond(d: &Dashboard, headers: &HeaderMap, status: StatusCode, title: &str, live: &str, main: Markup) -> Response {
    if headers.contains_key(FRAGMENT_HEADER) {
        return (status, Html(main.into_string())).into_response();
    }
    let frame = Frame { title, identity: &d.identity, scope: &d.scope, shards: d.sees_shards, live };
    (status, Html(pages::page(&frame, main).into_string())).into_response()
}

/// The apiserver's own words for a failed request.
fn api_message(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("the apiserver said {}: {}", s.code, s.message),
        other => other.to_string(),
    }
}

fn problem(d: &Dashboard, headers: &HeaderMap, e: &kube::Error, what: &str) -> Response {
    let (status, title) = match e {
        kube::Error::Api(s) if s.code == 403 => (StatusCode::FORBIDDEN, "Not allowed"),
        kube::Error::Api(s) if s.code == 404 => (StatusCode::NOT_FOUND, "Not found"),
        _ => (StatusCode::BAD_GATEWAY, "The apiserver did not answer"),
    };
    page_problem(d, headers, status, title, &format!("{what}: {}", api_message(e)))
}

fn page_problem(d: &Dashboard, headers: &HeaderMap, status: StatusCode, title: &str, message: &str) -> Response {
    respond(d, headers, status, title, "none", pages::problem(title, message))
}

async fn overview(State(d): State<Shared>, Query(filter): Query<Filter>, headers: HeaderMap) -> Response {
    let filter = filter.normalized();
    let apps = d.apps.all();
    let tenants = d.tenants.as_ref().map(Store::state);
    let view = model::overview(&apps, tenants.as_deref(), &filter);
    respond(&d, &headers, StatusCode::OK, "Overview", "overview", pages::overview(&view, &d.notices))
}

#[derive(serde::Deserialize)]
struct PageQuery {
    #[serde(default)]
    flash: Option<u64>,
}

async fn app_page(
    State(d): State<Shared>,
    Path((namespace, name)): Path<(String, String)>,
    Query(q): Query<PageQuery>,
    headers: HeaderMap,
) -> Response {
    if let Err(refused) = guard::check_names(&namespace, &name) {
        return page_problem(&d, &headers, StatusCode::NOT_FOUND, "Not found", &refused.to_string());
    }
    let read = match d.apps.get(&namespace, &name) {
        Some(app) => app,
        // Not watched here, or not listed yet: read it (the apiserver says if it is missing).
        None => match Api::<LenientApp>::namespaced(d.client.clone(), &namespace).get(&name).await {
            Ok(app) => app,
            Err(e) => return problem(&d, &headers, &e, &format!("Reading App {namespace}/{name}")),
        },
    };
    let app = match read.app() {
        Ok(app) => app,
        Err(unreadable) => return unreadable_page(&d, &headers, &namespace, &name, unreadable),
    };
    let mut notices: Vec<String> = q.flash.and_then(|id| d.flash(id, &namespace, &name)).into_iter().collect();
    let events = Api::<Event>::namespaced(d.client.clone(), &namespace);
    let selector = format!("involvedObject.kind=App,involvedObject.name={name}");
    let events = match events.list(&ListParams::default().fields(&selector).limit(EVENTS_READ)).await {
        Ok(list) => list.items,
        Err(e) => {
            notices.push(format!("Events are not shown: {}", api_message(&e)));
            Vec::new()
        }
    };
    let now = Timestamp::now();
    let ranges = match &d.prometheus {
        Some((url, client)) => series::fetch(client, url, series::plan(app, url, now)).await,
        None => Default::default(),
    };
    let view = model::app_view(app, &events, &d.live.samples(&namespace, &name), &ranges, now);
    let title = format!("{namespace}/{name}");
    let topic = format!("app:{namespace}/{name}");
    respond(&d, &headers, StatusCode::OK, &title, &topic, pages::app(&view, &d.token, &notices))
}

/// The page of an App that cannot be read: why, and that nothing can be done with it here. It
/// follows the App's changes, so it shows the App once it is fixed.
fn unreadable_page(d: &Dashboard, headers: &HeaderMap, namespace: &str, name: &str, why: &Unreadable) -> Response {
    let message = format!(
        "App {namespace}/{name} cannot be read as a flotilla.dev/v1beta1 App: {}. The operator does nothing \
         for it (it reports InvalidSpec) until it is changed, and the dashboard offers no action on it.",
        why.error
    );
    let title = format!("{namespace}/{name}");
    let main = pages::problem("This App cannot be read", &message);
    respond(d, headers, StatusCode::OK, &title, &format!("app:{namespace}/{name}"), main)
}

#[derive(serde::Deserialize)]
struct ActionForm {
    #[serde(default)]
    token: Option<String>,
    #[serde(default)]
    verb: String,
    /// The App's generation on the page the button was on: an action is taken only on the
    /// spec that was shown.
    #[serde(default)]
    generation: Option<i64>,
}

impl Dashboard {
    fn remember(&self, namespace: &str, name: &str, message: String) -> u64 {
        let id = self.next_flash.fetch_add(1, Ordering::Relaxed);
        let mut flashes = self.flashes.lock().unwrap_or_else(PoisonError::into_inner);
        flashes.push_back(Flash { id, namespace: namespace.into(), name: name.into(), message });
        if flashes.len() > FLASHES_KEPT {
            flashes.pop_front();
        }
        id
    }

    /// The message of action `id`, when it was taken on this App.
    fn flash(&self, id: u64, namespace: &str, name: &str) -> Option<String> {
        let flashes = self.flashes.lock().unwrap_or_else(PoisonError::into_inner);
        flashes.iter().find(|f| f.id == id && f.namespace == namespace && f.name == name).map(|f| f.message.clone())
    }
}

/// Does what the CLI's command of the same name does, with the user's credentials.
async fn act(client: Client, namespace: &str, name: &str, action: Action) -> Result<String, String> {
    let request = match action {
        Action::Promote => ControlRequest::Action(Verb::Promote),
        Action::PromoteFull => ControlRequest::Action(Verb::PromoteFull),
        Action::Abort => ControlRequest::Action(Verb::Abort),
        Action::Retry => ControlRequest::Action(Verb::Retry),
        Action::Pause => ControlRequest::Pause,
        Action::Resume => ControlRequest::Resume,
        Action::Undo => {
            return crate::cli::undo::undo(client, namespace, name, None).await.map_err(|e| e.to_string());
        }
    };
    control::send(client, namespace, name, request).await.map_err(|e| e.to_string())
}

async fn action(
    State(d): State<Shared>,
    Path((namespace, name)): Path<(String, String)>,
    headers: HeaderMap,
    Form(form): Form<ActionForm>,
) -> Response {
    if let Err(refused) = d.hosts.check_write(&headers, &d.token, form.token.as_deref()) {
        return page_problem(&d, &headers, StatusCode::FORBIDDEN, "Refused", &refused.to_string());
    }
    let Some(action) = Action::parse(&form.verb) else {
        let message = "The dashboard knows no such action.";
        return page_problem(&d, &headers, StatusCode::BAD_REQUEST, "Unknown action", message);
    };
    if let Err(refused) = guard::check_names(&namespace, &name) {
        return page_problem(&d, &headers, StatusCode::NOT_FOUND, "Not found", &refused.to_string());
    }
    let changed = match Api::<App>::namespaced(d.client.clone(), &namespace).get(&name).await {
        Ok(app) if app.metadata.generation != form.generation => Some(format!(
            "the App's spec changed since the page was shown (generation {} then, {} now); look at it again",
            form.generation.map_or("-".into(), |g| g.to_string()),
            app.metadata.generation.map_or("-".into(), |g| g.to_string()),
        )),
        Ok(_) => None,
        // Not readable: the action's own request says why.
        Err(_) => None,
    };
    let message = match changed {
        Some(why) => format!("{} was not done: {why}", action.label()),
        None => match act(d.client.clone(), &namespace, &name, action).await {
            Ok(done) => done,
            Err(refusal) => format!("{} was not done: {refusal}", action.label()),
        },
    };
    let id = d.remember(&namespace, &name, message);
    Redirect::to(&format!("{}?flash={id}", pages::app_href(&namespace, &name))).into_response()
}

async fn shards_page(State(d): State<Shared>, headers: HeaderMap) -> Response {
    let leases = Api::<Lease>::namespaced(d.client.clone(), &d.operator_namespace);
    let leases = match leases.list(&ListParams::default().labels("flotilla.dev/lease=shard")).await {
        Ok(l) => l.items,
        Err(e) => return problem(&d, &headers, &e, "Reading the shard Leases"),
    };
    let apps: Vec<(String, String)> =
        d.apps.all().iter().map(|a| (a.namespace().unwrap_or_default(), a.name_any())).collect();
    let namespaces = match Api::<Namespace>::all(d.client.clone()).list_metadata(&ListParams::default()).await {
        Ok(list) => list.items.iter().map(|n| n.name_any()).collect(),
        Err(_) => {
            let mut seen: Vec<String> = apps.iter().map(|(ns, _)| ns.clone()).collect();
            seen.sort();
            seen.dedup();
            seen
        }
    };
    let view = model::shards_view(d.shards, &leases, &namespaces, &apps, &d.live.failovers(), Timestamp::now());
    respond(&d, &headers, StatusCode::OK, "Shards", "shards", pages::shards(&view))
}

/// Server-sent events: one `change` event, carrying the topic, per change.
async fn live_events(State(d): State<Shared>) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let changes = tokio_stream_of(d.live.changes.subscribe());
    Sse::new(changes.map(|topic| Ok(SseEvent::default().event("change").data(topic))))
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}

/// The topics of a broadcast receiver as a stream; a lagging page is told everything changed.
fn tokio_stream_of(rx: tokio::sync::broadcast::Receiver<String>) -> impl Stream<Item = String> {
    futures::stream::unfold(rx, |mut rx| async move {
        match rx.recv().await {
            Ok(topic) => Some((topic, rx)),
            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => Some(("*".to_string(), rx)),
            Err(tokio::sync::broadcast::error::RecvError::Closed) => None,
        }
    })
}
