//! What the dashboard's pages show, built from what was read. Pure: objects and the time in,
//! view models out; `pages` turns them into HTML.

use k8s_openapi::api::core::v1::Event;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet};

use crate::api::conditions::{PROGRESSING, READY};
use crate::api::rollout::PAUSE_UNTIL_PROMOTED;
use crate::api::{App, AppPhase, AppStatus, MeasurementResult, StrategyType, Tenant};
use crate::app::lenient::LenientApp;
use crate::cli::status as text;
use crate::cli::undo::plan_undo;

/// Events shown on an App's page, newest first.
const EVENTS_SHOWN: usize = 20;
/// Finished rollouts shown on an App's page, newest first.
const HISTORY_SHOWN: usize = 10;

/// What the overview is narrowed to (query parameters `tenant`, `namespace`, `phase`).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Deserialize)]
pub struct Filter {
    #[serde(default)]
    pub tenant: Option<String>,
    #[serde(default)]
    pub namespace: Option<String>,
    #[serde(default)]
    pub phase: Option<String>,
    /// Page of the Apps table, from 1.
    #[serde(default)]
    pub page: Option<usize>,
}

impl Filter {
    /// Empty values (a form's "all" choice) filter nothing.
    pub fn normalized(self) -> Filter {
        let keep = |v: Option<String>| v.filter(|s| !s.trim().is_empty());
        Filter {
            tenant: keep(self.tenant),
            namespace: keep(self.namespace),
            phase: keep(self.phase),
            page: self.page.filter(|p| *p > 1),
        }
    }
}

/// One App in the overview's table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppRow {
    pub namespace: String,
    pub name: String,
    pub tenant: Option<String>,
    pub phase: &'static str,
    pub version: String,
    /// Where a rollout under way stands: `canary step 2/3 at 50%`.
    pub progress: Option<String>,
    pub ready: String,
    pub in_progress: bool,
    /// Why the App cannot be read (phase `Invalid`): shown in its row instead of a rollout.
    pub problem: Option<String>,
}

/// One namespace of a Tenant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TenantNamespace {
    pub name: String,
    pub state: String,
    pub message: String,
}

/// One Tenant in the overview.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TenantRow {
    pub name: String,
    pub ready: Option<bool>,
    pub summary: String,
    pub namespaces: Vec<TenantNamespace>,
    pub apps: usize,
    pub healthy: usize,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Overview {
    /// None when the user may not list Tenants.
    pub tenants: Option<Vec<TenantRow>>,
    /// Rollouts under way (after the filter), shown on top.
    pub in_progress: Vec<AppRow>,
    /// The Apps after the filter, one page of them.
    pub apps: Vec<AppRow>,
    /// Apps after the filter, the page shown (from 1) and the number of pages.
    pub total: usize,
    pub page: usize,
    pub pages: usize,
    /// Apps per phase after the filter, in the order of `PHASES`.
    pub phases: Vec<(&'static str, usize)>,
    /// Choices of the filter form.
    pub tenant_names: Vec<String>,
    pub namespaces: Vec<String>,
    pub filter: Filter,
}

/// Apps per page of the overview (and rollouts in progress shown at most): a page stays
/// small enough to fetch again on every change at 10,000 Apps.
pub const PAGE_SIZE: usize = 200;

/// The phases in the order the overview counts them; `Pending` is an App not reconciled yet,
/// `Invalid` one that cannot be read as an App (the operator does nothing for it either).
pub const PHASES: [&str; 7] = ["Progressing", "Paused", "Degraded", "RolledBack", "Healthy", "Pending", INVALID];

/// The phase of an App that cannot be read.
pub const INVALID: &str = "Invalid";

fn phase_of(app: &App) -> &'static str {
    app.status.as_ref().and_then(|s| s.phase).map_or("Pending", AppPhase::as_str)
}

fn in_progress(status: &AppStatus) -> bool {
    matches!(status.phase, Some(AppPhase::Progressing | AppPhase::Paused))
        || status.rollout.is_some()
        || status.canary.is_some()
        || status.blue_green.is_some()
}

/// `canary step 2/3 at 50%`, `blue-green: preview`, or None when no rollout is under way.
fn progress(status: &AppStatus) -> Option<String> {
    if let Some(c) = &status.canary {
        return Some(if c.step >= c.steps {
            format!("canary promoting after {} steps", c.steps)
        } else {
            format!("canary step {}/{} at {}%", c.step.saturating_add(1), c.steps, c.weight)
        });
    }
    if let Some(b) = &status.blue_green {
        return Some(format!("blue-green: {:?}", b.stage).to_lowercase());
    }
    status
        .target_version
        .as_ref()
        .filter(|t| Some(*t) != status.current_version.as_ref())
        .map(|t| format!("rolling to {t}"))
}

/// Namespace → Tenant, from the Tenants' specs.
fn tenant_of_namespace<T: Borrow<Tenant>>(tenants: &[T]) -> BTreeMap<&str, &str> {
    let mut map = BTreeMap::new();
    for t in tenants.iter().map(Borrow::borrow) {
        let name = t.metadata.name.as_deref().unwrap_or_default();
        for ns in &t.spec.namespaces {
            map.entry(ns.as_str()).or_insert(name);
        }
    }
    map
}

pub fn app_row(app: &App, tenant: Option<&str>) -> AppRow {
    let empty = AppStatus::default();
    let status = app.status.as_ref().unwrap_or(&empty);
    AppRow {
        namespace: app.namespace().unwrap_or_default(),
        name: app.name_any(),
        tenant: tenant.map(str::to_string),
        phase: phase_of(app),
        version: text::version(app, status),
        progress: progress(status),
        ready: status.ready.clone().unwrap_or_else(|| "-".into()),
        in_progress: in_progress(status),
        problem: None,
    }
}

/// The row of an App as read: an App that cannot be read is listed with why.
pub fn row_of(app: &LenientApp, tenant: Option<&str>) -> AppRow {
    match app.app() {
        Ok(app) => app_row(app, tenant),
        Err(unreadable) => AppRow {
            namespace: app.namespace().unwrap_or_default(),
            name: app.name_any(),
            tenant: tenant.map(str::to_string),
            phase: INVALID,
            version: "-".into(),
            progress: None,
            ready: unreadable.status.as_ref().and_then(|s| s.ready.clone()).unwrap_or_else(|| "-".into()),
            in_progress: false,
            problem: Some(format!("cannot be read as an App: {}", unreadable.error)),
        },
    }
}

/// The overview of `apps` (and `tenants`, when the user may list them) narrowed by `filter`.
/// Takes the objects or the cache's shared pointers to them alike.
pub fn overview<A: Borrow<LenientApp>, T: Borrow<Tenant>>(
    apps: &[A],
    tenants: Option<&[T]>,
    filter: &Filter,
) -> Overview {
    let owners = tenant_of_namespace(tenants.unwrap_or_default());
    let all: Vec<AppRow> = apps
        .iter()
        .map(Borrow::borrow)
        .map(|a| row_of(a, a.namespace().as_deref().and_then(|ns| owners.get(ns).copied())))
        .collect();
    let mut namespaces: BTreeSet<String> = all.iter().map(|r| r.namespace.clone()).collect();
    namespaces.extend(owners.keys().map(|ns| ns.to_string()));
    let tenant_rows = tenants.map(|ts| {
        let mut rows: Vec<TenantRow> = ts.iter().map(|t| tenant_row(t.borrow(), &all)).collect();
        rows.sort_by(|a, b| a.name.cmp(&b.name));
        rows
    });
    let mut shown: Vec<AppRow> = all
        .into_iter()
        .filter(|r| filter.namespace.as_ref().is_none_or(|ns| &r.namespace == ns))
        .filter(|r| filter.tenant.as_ref().is_none_or(|t| r.tenant.as_ref() == Some(t)))
        .filter(|r| filter.phase.as_ref().is_none_or(|p| r.phase == p))
        .collect();
    shown.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    let phases = PHASES.iter().map(|p| (*p, shown.iter().filter(|r| r.phase == *p).count())).collect();
    let total = shown.len();
    let pages = total.div_ceil(PAGE_SIZE).max(1);
    let page = filter.page.unwrap_or(1).clamp(1, pages);
    Overview {
        in_progress: shown.iter().filter(|r| r.in_progress).take(PAGE_SIZE).cloned().collect(),
        apps: shown.into_iter().skip((page - 1) * PAGE_SIZE).take(PAGE_SIZE).collect(),
        total,
        page,
        pages,
        phases,
        tenant_names: tenant_rows.iter().flatten().map(|t| t.name.clone()).collect(),
        tenants: tenant_rows,
        namespaces: namespaces.into_iter().collect(),
        filter: filter.clone(),
    }
}

fn tenant_row(t: &Tenant, apps: &[AppRow]) -> TenantRow {
    let name = t.metadata.name.clone().unwrap_or_default();
    let status = t.status.clone().unwrap_or_default();
    let reported: BTreeMap<&str, &crate::api::NamespaceStatus> =
        status.namespaces.iter().map(|n| (n.name.as_str(), n)).collect();
    let namespaces = t
        .spec
        .namespaces
        .iter()
        .map(|ns| match reported.get(ns.as_str()) {
            Some(n) => {
                TenantNamespace { name: ns.clone(), state: format!("{:?}", n.state), message: n.message.clone() }
            }
            None => TenantNamespace { name: ns.clone(), state: "Pending".into(), message: String::new() },
        })
        .collect();
    let ready = status.conditions.iter().find(|c| c.type_ == READY).map(|c| c.status == "True");
    let own: Vec<&AppRow> = apps.iter().filter(|a| a.tenant.as_deref() == Some(name.as_str())).collect();
    TenantRow {
        summary: status.summary.clone().unwrap_or_default(),
        ready,
        namespaces,
        apps: own.len(),
        healthy: own.iter().filter(|a| a.phase == "Healthy").count(),
        name,
    }
}

/// Where one canary step stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepState {
    Done,
    Current,
    Pending,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepView {
    /// 1-based.
    pub number: usize,
    pub weight: i32,
    /// `for 30s`, `until promoted`, or empty.
    pub pause: String,
    pub state: StepState,
}

/// The split of a routed canary's requests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteView {
    pub http_route: String,
    pub stable_weight: i32,
    pub canary_weight: i32,
    pub problem: Option<String>,
}

/// A plot of a check's recent values against its bounds, in SVG user units.
#[derive(Clone, Debug, PartialEq)]
pub struct Plot {
    pub width: f64,
    pub height: f64,
    /// `x,y x,y ...` for an SVG polyline: the new version's values.
    pub points: String,
    /// The same for the stable version's values, when they were read.
    pub stable_points: Option<String>,
    /// y of the upper and lower bounds, when set and within the plotted range.
    pub max_y: Option<f64>,
    pub min_y: Option<f64>,
    /// The plotted range of values: lowest, highest.
    pub range: (f64, f64),
}

#[derive(Clone, Debug, PartialEq)]
pub struct MetricView {
    pub name: String,
    pub result: &'static str,
    pub passing: bool,
    pub value: String,
    pub bounds: String,
    pub message: Option<String>,
    pub plot: Option<Plot>,
    /// Values plotted, and where they come from.
    pub samples: usize,
    pub source: &'static str,
    /// Why Prometheus gave no values for the plot, when it was asked.
    pub range_problem: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HistoryRow {
    pub version: String,
    pub result: &'static str,
    pub when: String,
    pub message: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventRow {
    pub type_: String,
    pub reason: String,
    pub message: String,
    pub count: i32,
    pub when: String,
}

/// What a person can ask of an App from its page; the same requests as the CLI's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Promote,
    PromoteFull,
    Abort,
    Retry,
    Pause,
    Resume,
    Undo,
}

impl Action {
    pub const ALL: [Action; 7] = [
        Action::Promote,
        Action::PromoteFull,
        Action::Abort,
        Action::Retry,
        Action::Pause,
        Action::Resume,
        Action::Undo,
    ];

    /// The CLI command's name, also the form value.
    pub fn verb(self) -> &'static str {
        match self {
            Action::Promote => "promote",
            Action::PromoteFull => "promote-full",
            Action::Abort => "abort",
            Action::Retry => "retry",
            Action::Pause => "pause",
            Action::Resume => "resume",
            Action::Undo => "undo",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Action::Promote => "Promote",
            Action::PromoteFull => "Promote fully",
            Action::Abort => "Abort",
            Action::Retry => "Retry",
            Action::Pause => "Pause",
            Action::Resume => "Resume",
            Action::Undo => "Undo",
        }
    }

    /// What it does, as the button's title.
    pub fn help(self) -> &'static str {
        match self {
            Action::Promote => "Move the canary to its next step now",
            Action::PromoteFull => "Finish the rollout now, skipping every remaining step and check",
            Action::Abort => "Roll the App back to its stable version now",
            Action::Retry => "Try the version that was rolled back again",
            Action::Pause => "Hold the rollout where it is",
            Action::Resume => "Let the paused rollout go on",
            Action::Undo => "Go back to the version before (a rollout under way is abandoned at once)",
        }
    }

    /// The question asked before actions that cannot be taken back (with JavaScript).
    pub fn confirmation(self) -> Option<&'static str> {
        match self {
            Action::PromoteFull => Some("Finish the rollout now, skipping every remaining step and check, for"),
            Action::Abort => Some("Roll back"),
            Action::Undo => Some("Undo the last version of"),
            _ => None,
        }
    }

    pub fn parse(verb: &str) -> Option<Action> {
        Action::ALL.into_iter().find(|a| a.verb() == verb)
    }
}

/// The actions that make sense for `app` now.
pub fn actions(app: &App) -> Vec<Action> {
    let empty = AppStatus::default();
    let status = app.status.as_ref().unwrap_or(&empty);
    let rolling_out = status.rollout.is_some() || status.canary.is_some() || status.blue_green.is_some();
    let stepped = matches!(app.spec.strategy().map(|s| s.type_), Some(StrategyType::Canary | StrategyType::BlueGreen));
    let paused = text::paused_by_user(app);
    let mut out = Vec::new();
    if rolling_out && stepped {
        out.push(Action::Promote);
    }
    if rolling_out {
        out.extend([Action::PromoteFull, Action::Abort]);
    }
    if status.failed_version.is_some() {
        out.push(Action::Retry);
    }
    if rolling_out && !paused {
        out.push(Action::Pause);
    }
    if paused {
        out.push(Action::Resume);
    }
    if plan_undo(app, None).is_ok() {
        out.push(Action::Undo);
    }
    out
}

/// Everything an App's page shows.
#[derive(Clone, Debug, PartialEq)]
pub struct AppView {
    pub namespace: String,
    pub name: String,
    /// The spec's generation: actions carry it, and are refused when the spec changed since.
    pub generation: Option<i64>,
    pub phase: &'static str,
    pub version: String,
    pub current_version: String,
    pub target_version: Option<String>,
    pub strategy: String,
    pub steps: Vec<StepView>,
    /// Where a canary rollout stands, as `flotilla status` says it.
    pub canary: Option<String>,
    pub blue_green: Option<String>,
    pub route: Option<RouteView>,
    /// Canary (or preview) and stable replicas during a canary or blue-green rollout.
    pub replicas_split: Option<(i32, i32)>,
    pub ready: String,
    pub progressing: Option<String>,
    pub rollout: Option<String>,
    pub paused_by_user: bool,
    pub request: Option<String>,
    pub failed: Option<String>,
    pub analysis: Option<String>,
    pub metrics: Vec<MetricView>,
    pub history: Vec<HistoryRow>,
    pub events: Vec<EventRow>,
    pub actions: Vec<Action>,
}

/// Recent values of one check of one App, oldest first: (seconds since the epoch, value).
pub type Samples = Vec<(i64, f64)>;

/// What Prometheus gave for one check over the rollout: the new version's values (or why
/// none), and the stable version's when the check's query names the version.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Ranges {
    pub values: Option<Result<Samples, String>>,
    pub stable: Samples,
}

/// Where the values plotted for a check come from.
pub const FROM_PROMETHEUS: &str = "from Prometheus, over the rollout";
pub const SEEN_HERE: &str = "seen by this dashboard";

/// The page of `app`, with its `events`, the `samples` of each check this dashboard saw, and
/// each check's values over the rollout from Prometheus (`ranges`, when it was asked).
pub fn app_view(
    app: &App,
    events: &[Event],
    samples: &BTreeMap<String, Samples>,
    ranges: &BTreeMap<String, Ranges>,
    now: Timestamp,
) -> AppView {
    let empty = AppStatus::default();
    let status = app.status.as_ref().unwrap_or(&empty);
    let name = app.name_any();
    let analysis = (app.spec.analysis().is_some() || status.analysis.is_some()).then(|| analysis_line(app, now));
    let metrics = status
        .analysis
        .iter()
        .flat_map(|a| &a.measurements)
        .map(|m| {
            let range = ranges.get(&m.name);
            let (plotted, stable, source) = match range.and_then(|r| r.values.as_ref()) {
                Some(Ok(values)) if !values.is_empty() => {
                    (values.as_slice(), range.map(|r| r.stable.as_slice()).unwrap_or_default(), FROM_PROMETHEUS)
                }
                _ => (samples.get(&m.name).map(Vec::as_slice).unwrap_or_default(), &[][..], SEEN_HERE),
            };
            let range_problem = match range.and_then(|r| r.values.as_ref()) {
                Some(Err(why)) => Some(why.clone()),
                _ => None,
            };
            MetricView {
                name: m.name.clone(),
                result: text::measurement_result(m.result),
                passing: m.result == MeasurementResult::Pass,
                value: m.value.map_or_else(|| "-".into(), text::number),
                bounds: text::bounds(m.min, m.max),
                message: m.message.clone(),
                plot: plot(plotted, stable, m.min, m.max),
                samples: plotted.len(),
                source,
                range_problem,
            }
        })
        .collect();
    AppView {
        generation: app.metadata.generation,
        namespace: app.namespace().unwrap_or_default(),
        phase: phase_of(app),
        version: text::version(app, status),
        current_version: status.current_version.clone().unwrap_or_else(|| "(none)".into()),
        target_version: status.target_version.clone().filter(|t| Some(t) != status.current_version.as_ref()),
        strategy: text::strategy(app),
        steps: steps(app, status),
        canary: status.canary.as_ref().map(|c| text::canary(c, now)),
        blue_green: status.blue_green.as_ref().map(|b| text::blue_green(&name, b, now)),
        route: status.traffic_routing.as_ref().map(|t| RouteView {
            http_route: t.http_route.clone(),
            stable_weight: 100 - t.canary_weight.clamp(0, 100),
            canary_weight: t.canary_weight.clamp(0, 100),
            problem: t.problem.clone(),
        }),
        replicas_split: match (&status.canary, &status.blue_green) {
            (Some(c), _) => Some((c.replicas, c.stable_replicas)),
            (None, Some(b)) => Some((b.replicas, status.replicas.unwrap_or(0))),
            (None, None) => None,
        },
        ready: text::ready(status, text::condition(status, PROGRESSING)),
        progressing: text::condition(status, PROGRESSING).map(|c| format!("{}: {}", c.reason, c.message)),
        rollout: status.rollout.as_ref().map(|r| text::rollout(r, now)),
        paused_by_user: text::paused_by_user(app),
        request: text::request(app, status),
        failed: status
            .failed_version
            .as_ref()
            .map(|f| format!("version {} at generation {}, {}: {}", f.version, f.generation, f.reason, f.message)),
        analysis,
        metrics,
        history: status
            .history
            .iter()
            .take(HISTORY_SHOWN)
            .map(|h| HistoryRow {
                version: h.version.clone(),
                result: text::rollout_result(h.result),
                when: text::ago(&h.at, now),
                message: h.message.clone().unwrap_or_default(),
            })
            .collect(),
        events: event_rows(events, now),
        actions: actions(app),
        name,
    }
}

fn analysis_line(app: &App, now: Timestamp) -> String {
    let status = app.status.as_ref().and_then(|s| s.analysis.as_ref());
    let limit =
        app.spec.analysis().and_then(|a| a.failure_limit).unwrap_or(crate::rollout::planner::DEFAULT_FAILURE_LIMIT);
    let mut line = format!("failures {}/{}", status.map_or(0, |a| a.failures), limit.max(1));
    match status.and_then(|a| a.last_run.as_ref()) {
        Some(at) => line.push_str(&format!(", last run {}", text::ago(at, now))),
        None => line.push_str(", no run yet"),
    }
    if let Some(r) = status.and_then(|a| a.last_result) {
        line.push_str(&format!(": {}", text::measurement_result(r)));
    }
    line
}

/// The canary's steps with the current one marked; empty for other strategies.
pub fn steps(app: &App, status: &AppStatus) -> Vec<StepView> {
    let Some(canary) = app.spec.strategy().and_then(|s| s.canary.as_ref()) else { return Vec::new() };
    let current = status.canary.as_ref().map(|c| usize::try_from(c.step).unwrap_or(0));
    canary
        .steps
        .iter()
        .enumerate()
        .map(|(i, s)| StepView {
            number: i + 1,
            weight: s.weight,
            pause: match s.pause.as_deref() {
                Some(PAUSE_UNTIL_PROMOTED) => "until promoted".into(),
                Some(p) => format!("for {p}"),
                None => String::new(),
            },
            state: match current {
                Some(c) if i < c => StepState::Done,
                Some(c) if i == c => StepState::Current,
                _ => StepState::Pending,
            },
        })
        .collect()
}

fn event_time(e: &Event) -> Option<Timestamp> {
    e.last_timestamp
        .as_ref()
        .map(|t| t.0)
        .or_else(|| e.event_time.as_ref().map(|t| t.0))
        .or_else(|| e.metadata.creation_timestamp.as_ref().map(|t| t.0))
}

pub fn event_rows(events: &[Event], now: Timestamp) -> Vec<EventRow> {
    let mut sorted: Vec<&Event> = events.iter().collect();
    sorted.sort_by_key(|e| std::cmp::Reverse(event_time(e)));
    sorted
        .into_iter()
        .take(EVENTS_SHOWN)
        .map(|e| EventRow {
            type_: e.type_.clone().unwrap_or_default(),
            reason: cut(e.reason.as_deref().unwrap_or_default()),
            message: cut(e.message.as_deref().unwrap_or_default()),
            count: e.count.unwrap_or(1).max(1),
            when: event_time(e)
                .map(|t| text::ago(&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(t), now))
                .unwrap_or_default(),
        })
        .collect()
}

/// Longest text of an Event shown (a tenant writes Events as long as the apiserver takes).
const EVENT_TEXT_CHARS: usize = 1000;

fn cut(text: &str) -> String {
    let mut out: String = text.chars().take(EVENT_TEXT_CHARS).collect();
    if text.chars().count() > EVENT_TEXT_CHARS {
        out.push('…');
    }
    out
}

/// Size of a plot, in SVG user units.
const PLOT_WIDTH: f64 = 320.0;
const PLOT_HEIGHT: f64 = 80.0;

/// A plot of `samples` (time, value) with the bounds drawn as lines, or None with fewer than
/// one finite value. Values that are not finite are left out; the range covers the values and
/// the bounds, padded by a tenth, so a bound is always visible beside the line.
pub fn plot(samples: &[(i64, f64)], stable: &[(i64, f64)], min: Option<f64>, max: Option<f64>) -> Option<Plot> {
    let finite = |s: &[(i64, f64)]| -> Vec<(i64, f64)> { s.iter().copied().filter(|(_, v)| v.is_finite()).collect() };
    let (finite, stable) = (finite(samples), finite(stable));
    if finite.is_empty() {
        return None;
    }
    let bounds = [min, max].into_iter().flatten().filter(|b| b.is_finite());
    let (mut lo, mut hi) = finite
        .iter()
        .chain(&stable)
        .map(|(_, v)| *v)
        .chain(bounds)
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)));
    // A scale from zero when nothing is negative: a ratio of 0.01 against a bound of 0.05
    // looks like what it is.
    if lo > 0.0 {
        lo = 0.0;
    }
    let span = hi - lo;
    let pad = if span.is_finite() && span > 0.0 { span / 10.0 } else { lo.abs().max(1.0) / 10.0 };
    if lo != 0.0 {
        lo -= pad;
    }
    hi += pad;
    if !(hi - lo).is_finite() || hi - lo <= 0.0 {
        // Values near f64::MAX: the range overflows; plot a flat line rather than nothing.
        lo = -1.0;
        hi = 1.0;
    }
    // The time axis is the new version's; stable values outside it are left out.
    let (t0, t1) = (finite[0].0, finite[finite.len() - 1].0);
    let x = |t: i64| {
        if t1 > t0 { (t.saturating_sub(t0)) as f64 / (t1.saturating_sub(t0)) as f64 * PLOT_WIDTH } else { PLOT_WIDTH }
    };
    let y = |v: f64| {
        let scaled = PLOT_HEIGHT - (v.clamp(lo, hi) - lo) / (hi - lo) * PLOT_HEIGHT;
        if scaled.is_finite() { scaled } else { PLOT_HEIGHT / 2.0 }
    };
    let line = |values: &[(i64, f64)]| {
        values
            .iter()
            .filter(|(t, _)| (t0..=t1).contains(t))
            .map(|(t, v)| format!("{:.1},{:.1}", x(*t), y(*v)))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let stable_points = Some(line(&stable)).filter(|p| !p.is_empty());
    let within = |b: Option<f64>| b.filter(|b| b.is_finite() && (lo..=hi).contains(b)).map(y);
    Some(Plot {
        width: PLOT_WIDTH,
        height: PLOT_HEIGHT,
        points: line(&finite),
        stable_points,
        max_y: within(max),
        min_y: within(min),
        range: (lo, hi),
    })
}

/// One shard in the shards page.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardView {
    pub shard: u32,
    pub holder: Option<String>,
    /// How long the holder has held it.
    pub held_for: String,
    /// Since the holder's last renewal.
    pub renewed: String,
    pub namespaces: usize,
    pub apps: usize,
}

/// A change of a shard's holder the dashboard saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failover {
    pub at: Timestamp,
    pub shard: u32,
    pub from: Option<String>,
    pub to: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardsView {
    pub shards: Vec<ShardView>,
    /// Replica → shards it holds; `None` collects the free ones.
    pub holders: Vec<(Option<String>, Vec<u32>)>,
    pub failovers: Vec<(String, Failover)>,
}

/// The shards page from the Leases, namespaces and Apps read, and the failovers seen.
pub fn shards_view(
    shards: u32,
    leases: &[k8s_openapi::api::coordination::v1::Lease],
    namespaces: &[String],
    apps: &[(String, String)],
    failovers: &[Failover],
    now: Timestamp,
) -> ShardsView {
    let table = crate::cli::shards::shard_table(shards, leases, namespaces, apps);
    let renewed: BTreeMap<u32, Timestamp> = leases
        .iter()
        .filter_map(|l| {
            let shard = l.metadata.name.as_deref().and_then(crate::sharding::leases::shard_of_lease)?;
            Some((shard, l.spec.as_ref()?.renew_time.as_ref()?.0))
        })
        .collect();
    let ago = |t: Timestamp| text::ago(&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(t), now);
    let mut holders: BTreeMap<Option<String>, Vec<u32>> = BTreeMap::new();
    for r in &table {
        holders.entry(r.holder.clone()).or_default().push(r.shard);
    }
    ShardsView {
        shards: table
            .into_iter()
            .map(|r| ShardView {
                held_for: r.since.map(ago).unwrap_or_default(),
                renewed: renewed.get(&r.shard).copied().map(ago).unwrap_or_default(),
                shard: r.shard,
                holder: r.holder,
                namespaces: r.namespaces,
                apps: r.apps,
            })
            .collect(),
        holders: holders.into_iter().collect(),
        failovers: failovers.iter().rev().map(|f| (ago(f.at), f.clone())).collect(),
    }
}

#[cfg(test)]
#[path = "model_tests.rs"]
mod tests;
