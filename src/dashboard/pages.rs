//! The dashboard's HTML, rendered on the server with maud: every value is escaped by the
//! template, names and messages a tenant wrote included. Pure: view models in, markup out.

use maud::{DOCTYPE, Markup, html};

use super::model::{
    Action, AppRow, AppView, Filter, MetricView, Overview, PHASES, Plot, ShardsView, StepState, TenantRow,
};

/// What every page's frame shows.
pub struct Frame<'a> {
    pub title: &'a str,
    /// Who the dashboard acts as, and where it looks.
    pub identity: &'a str,
    pub scope: &'a str,
    /// Whether the shards page is offered (the user may read the shard Leases).
    pub shards: bool,
    /// The topic of live updates this page follows: `overview`, `shards` or `app:<ns>/<name>`.
    pub live: &'a str,
}

/// A whole page: the frame around `main`.
pub fn page(frame: &Frame, main: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (frame.title) " · Flotilla" }
                link rel="stylesheet" href="/assets/dashboard.css";
                script src="/assets/dashboard.js" defer {}
            }
            body data-live=(frame.live) {
                header {
                    nav aria-label="Main" {
                        a.brand href="/" { "Flotilla" }
                        a href="/" { "Overview" }
                        @if frame.shards { a href="/shards" { "Shards" } }
                    }
                    p.who {
                        "Signed in as " strong { (frame.identity) } " · " (frame.scope) " · "
                        span #live role="status" aria-live="polite" { "static" }
                    }
                }
                main { (main) }
            }
        }
    }
}

fn phase_badge(phase: &str) -> Markup {
    html! { span class={ "phase phase-" (phase.to_lowercase()) } { (phase) } }
}

/// The App's page link. Names are DNS labels, so a path segment needs no escaping beyond
/// what the template does; percent-encoding keeps it safe should one ever not be.
pub fn app_href(namespace: &str, name: &str) -> String {
    format!("/apps/{}/{}", segment(namespace), segment(name))
}

/// What a path segment keeps as it is: letters, digits and `-._~` (RFC 3986's unreserved).
const SEGMENT: &percent_encoding::AsciiSet =
    &percent_encoding::NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

fn segment(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, SEGMENT).to_string()
}

fn apps_table(rows: &[AppRow], caption: &str, id: &str) -> Markup {
    html! {
        table #(id) {
            caption { (caption) }
            thead { tr { th scope="col" { "Namespace" } th scope="col" { "App" } th scope="col" { "Tenant" }
                th scope="col" { "Phase" } th scope="col" { "Version" } th scope="col" { "Rollout" } th scope="col" { "Ready" } } }
            tbody {
                @for r in rows {
                    tr data-app={ (r.namespace) "/" (r.name) } {
                        td { (r.namespace) }
                        td { a href=(app_href(&r.namespace, &r.name)) { (r.name) } }
                        td { (r.tenant.as_deref().unwrap_or("-")) }
                        td { (phase_badge(r.phase)) }
                        td { (r.version) }
                        td {
                            @if let Some(problem) = &r.problem { span.problem { (problem) } }
                            @else { (r.progress.as_deref().unwrap_or("")) }
                        }
                        td { (r.ready) }
                    }
                }
                @if rows.is_empty() { tr { td colspan="7" { "None." } } }
            }
        }
    }
}

fn tenants_section(tenants: &[TenantRow]) -> Markup {
    html! {
        section aria-labelledby="tenants-h" {
            h2 #tenants-h { "Tenants" }
            @if tenants.is_empty() { p { "No Tenants." } }
            ul.tenants {
                @for t in tenants {
                    li data-tenant=(t.name) {
                        a href={ "/?" (filter_query(&Filter { tenant: Some(t.name.clone()), ..Filter::default() }, 1)) } { strong { (t.name) } }
                        " " (match t.ready { Some(true) => phase_badge("Ready"), Some(false) => phase_badge("NotReady"), None => phase_badge("Pending") })
                        " " (t.healthy) "/" (t.apps) " Apps healthy"
                        @if !t.summary.is_empty() { br; small { (t.summary) } }
                        ul {
                            @for ns in &t.namespaces {
                                li { a href={ "/?" (filter_query(&Filter { namespace: Some(ns.name.clone()), ..Filter::default() }, 1)) } { (ns.name) } " " small { (ns.state) }
                                    @if !ns.message.is_empty() { small { ": " (ns.message) } } }
                            }
                        }
                    }
                }
            }
        }
    }
}

fn filter_form(o: &Overview) -> Markup {
    let chosen = |current: &Option<String>, v: &str| current.as_deref() == Some(v);
    html! {
        form.filter method="get" action="/" aria-label="Filter Apps" {
            @if !o.tenant_names.is_empty() {
                label { "Tenant "
                    select name="tenant" {
                        option value="" { "all" }
                        @for t in &o.tenant_names { option value=(t) selected[chosen(&o.filter.tenant, t)] { (t) } }
                    }
                }
            }
            label { "Namespace "
                select name="namespace" {
                    option value="" { "all" }
                    @for ns in &o.namespaces { option value=(ns) selected[chosen(&o.filter.namespace, ns)] { (ns) } }
                }
            }
            label { "Phase "
                select name="phase" {
                    option value="" { "all" }
                    @for p in PHASES { option value=(p) selected[chosen(&o.filter.phase, p)] { (p) } }
                }
            }
            button type="submit" { "Show" }
        }
    }
}

pub fn overview(o: &Overview, notices: &[String]) -> Markup {
    html! {
        h1 { "Overview" }
        (notice_list(notices))
        @if let Some(tenants) = &o.tenants { (tenants_section(tenants)) }
        section aria-labelledby="apps-h" {
            h2 #apps-h { "Apps" }
            p.phases {
                @for (phase, n) in &o.phases { span.count { (phase_badge(phase)) " " (n) } " " }
            }
            (filter_form(o))
            @if !o.in_progress.is_empty() { (apps_table(&o.in_progress, "Rollouts in progress", "in-progress")) }
            (apps_table(&o.apps, &apps_caption(o), "apps"))
            @if o.pages > 1 {
                nav.pages aria-label="Pages of Apps" {
                    @if o.page > 1 { a rel="prev" href={ "/?" (filter_query(&o.filter, o.page - 1)) } { "Previous" } " " }
                    "Page " (o.page) " of " (o.pages)
                    @if o.page < o.pages { " " a rel="next" href={ "/?" (filter_query(&o.filter, o.page + 1)) } { "Next" } }
                }
            }
        }
    }
}

fn apps_caption(o: &Overview) -> String {
    if o.pages > 1 {
        let first = (o.page - 1) * super::model::PAGE_SIZE + 1;
        format!("Apps {first} to {} of {}", first + o.apps.len() - 1, o.total)
    } else {
        format!("All Apps ({})", o.total)
    }
}

/// The overview's query string for `filter` at `page`.
pub fn filter_query(filter: &Filter, page: usize) -> String {
    let mut parts = Vec::new();
    for (key, value) in [("tenant", &filter.tenant), ("namespace", &filter.namespace), ("phase", &filter.phase)] {
        if let Some(v) = value {
            parts.push(format!(
                "{key}={}",
                percent_encoding::utf8_percent_encode(v, percent_encoding::NON_ALPHANUMERIC)
            ));
        }
    }
    parts.push(format!("page={page}"));
    parts.join("&")
}

fn notice_list(notices: &[String]) -> Markup {
    html! { @for n in notices { p.notice role="alert" { (n) } } }
}

fn step_class(s: StepState) -> &'static str {
    match s {
        StepState::Done => "step done",
        StepState::Current => "step current",
        StepState::Pending => "step pending",
    }
}

fn plot_svg(name: &str, p: &Plot) -> Markup {
    let (w, h) = (p.width, p.height);
    html! {
        svg.plot viewBox={ "0 0 " (w) " " (h) } width=(w) height=(h) role="img"
            aria-label={ "Recent values of " (name) } {
            @if let Some(y) = p.max_y { line.bound x1="0" x2=(w) y1=(y) y2=(y) {} }
            @if let Some(y) = p.min_y { line.bound x1="0" x2=(w) y1=(y) y2=(y) {} }
            @if let Some(stable) = &p.stable_points { polyline.stable-values points=(stable) {} }
            polyline.values points=(p.points) {}
            text.axis x="3" y="11" { (crate::cli::status::number(p.range.1)) }
            text.axis x="3" y=(h - 3.0) { (crate::cli::status::number(p.range.0)) }
        }
    }
}

fn metric(m: &MetricView) -> Markup {
    html! {
        tr data-metric=(m.name) {
            td { (m.name) }
            td.value { (m.value) }
            td { (m.bounds) }
            td { span class={ "result " @if m.passing { "pass" } @else { "fail" } } { (m.result) } }
            td {
                @if let Some(p) = &m.plot {
                    (plot_svg(&m.name, p)) br;
                    small.source { (m.samples) " values " (m.source) }
                    @if p.stable_points.is_some() { br; small.legend { span.key-canary { "— new version" } " " span.key-stable { "— stable version" } } }
                }
                @if let Some(why) = &m.range_problem { br; small.range-problem { "Prometheus: " (why) } }
            }
            td { (m.message.as_deref().unwrap_or("")) }
        }
    }
}

fn action_form(v: &AppView, a: Action, token: &str) -> Markup {
    html! {
        form.action method="post" action={ (app_href(&v.namespace, &v.name)) "/action" }
            data-confirm=[a.confirmation().map(|c| format!("{c} {}/{}?", v.namespace, v.name))] {
            input type="hidden" name="token" value=(token);
            input type="hidden" name="verb" value=(a.verb());
            @if let Some(g) = v.generation { input type="hidden" name="generation" value=(g); }
            button type="submit" name="action" value=(a.verb()) title=(a.help()) data-action=(a.verb()) { (a.label()) }
        }
    }
}

/// A bar of two shares (SVG attributes, not inline styles: the page's Content-Security-Policy
/// allows no inline style).
fn split_bar(label: &str, stable: i32, canary: i32) -> Markup {
    let total = (i64::from(stable.max(0)) + i64::from(canary.max(0))).max(1);
    let stable_width = i64::from(stable.max(0)) * 100 / total;
    html! {
        svg.split viewBox="0 0 100 4" preserveAspectRatio="none" role="img" aria-label=(label) {
            rect.stable x="0" y="0" height="4" width=(stable_width) {}
            rect.canary x=(stable_width) y="0" height="4" width=(100 - stable_width) {}
        }
    }
}

pub fn app(v: &AppView, token: &str, notices: &[String]) -> Markup {
    html! {
        h1 { "App " span.ns { (v.namespace) "/" } (v.name) " " span #phase { (phase_badge(v.phase)) } }
        p.lead { "Version " strong #version { (v.version) } " · " (v.strategy) " · ready " (v.ready) }
        (notice_list(notices))
        @if !v.steps.is_empty() || v.canary.is_some() || v.blue_green.is_some() || v.rollout.is_some() || !v.actions.is_empty() {
            section aria-labelledby="rollout-h" {
                h2 #rollout-h { @if v.rollout.is_some() { "Rollout of " (v.target_version.as_deref().unwrap_or("")) } @else { "Rollout" } }
                @if let Some(p) = &v.progressing { p #progressing { (p) } }
                @if !v.steps.is_empty() {
                    ol.steps aria-label="Canary steps" {
                        @for s in &v.steps {
                            li class=(step_class(s.state)) data-step=(s.number)
                                aria-current=[(s.state == StepState::Current).then_some("step")] {
                                small { "step " (s.number) } br;
                                span.weight { (s.weight) "%" }
                                @if !s.pause.is_empty() { " " small { (s.pause) } }
                            }
                        }
                    }
                }
                @if let Some((canary, stable)) = v.replicas_split {
                    p.legend { span.key-stable { "stable " (stable) } " · " span.key-canary { "canary " (canary) } " replicas" }
                    (split_bar(&format!("{canary} canary and {stable} stable replicas"), stable, canary))
                }
                @if let Some(r) = &v.route {
                    @if let Some(p) = &r.problem { p.notice { "HTTPRoute " (r.http_route) " is not usable, the rollout waits: " (p) } }
                    @else {
                        p.legend #route { "HTTPRoute " (r.http_route) ": " span.key-stable #stable-weight { (r.stable_weight) "% stable" } " · "
                            span.key-canary #canary-weight { (r.canary_weight) "% canary" } " of the requests" }
                        (split_bar(&format!("{}% of the requests to the canary", r.canary_weight), r.stable_weight, r.canary_weight))
                    }
                }
                dl.summary {
                    @if let Some(c) = &v.canary { dt { "Canary" } dd #canary { (c) } }
                    @if let Some(b) = &v.blue_green { dt { "Blue-green" } dd { (b) } }
                    @if let Some(r) = &v.rollout { dt { "Started" } dd { (r) } }
                    @if v.paused_by_user { dt { "Paused" } dd { "by a user" } }
                    @if let Some(r) = &v.request { dt { "Request" } dd { (r) } }
                    @if let Some(f) = &v.failed { dt { "Failed" } dd { (f) } }
                }
                @if !v.actions.is_empty() {
                    div.actions role="group" aria-label="Actions" {
                        @for a in &v.actions { (action_form(v, *a, token)) }
                    }
                }
            }
        }
        @if let Some(a) = &v.analysis {
            section aria-labelledby="analysis-h" {
                h2 #analysis-h { "Analysis" }
                p { (a) }
                @if !v.metrics.is_empty() {
                    table #metrics {
                        thead { tr { th scope="col" { "Check" } th scope="col" { "Value" } th scope="col" { "Bounds" }
                            th scope="col" { "Result" } th scope="col" { "Recent values" } th scope="col" { "Message" } } }
                        tbody { @for m in &v.metrics { (metric(m)) } }
                    }
                }
            }
        }
        section aria-labelledby="details-h" {
            h2 #details-h { "Details" }
            dl.summary {
                dt { "Current version" } dd { (v.current_version) }
                @if let Some(t) = &v.target_version { dt { "Target version" } dd #target { (t) } }
                dt { "Strategy" } dd { (v.strategy) }
                dt { "Ready" } dd { (v.ready) }
            }
        }
        section aria-labelledby="history-h" {
            h2 #history-h { "History" }
            table #history {
                thead { tr { th scope="col" { "Version" } th scope="col" { "Result" } th scope="col" { "When" } th scope="col" { "Message" } } }
                tbody {
                    @for h in &v.history { tr { td { (h.version) } td { (h.result) } td { (h.when) } td { (h.message) } } }
                    @if v.history.is_empty() { tr { td colspan="4" { "No finished rollout yet." } } }
                }
            }
        }
        section aria-labelledby="events-h" {
            h2 #events-h { "Events" }
            table #events {
                thead { tr { th scope="col" { "Type" } th scope="col" { "Reason" } th scope="col" { "Message" } th scope="col" { "Count" } th scope="col" { "When" } } }
                tbody {
                    @for e in &v.events { tr { td { (e.type_) } td { (e.reason) } td { (e.message) } td { (e.count) } td { (e.when) } } }
                    @if v.events.is_empty() { tr { td colspan="5" { "No Events." } } }
                }
            }
        }
    }
}

pub fn shards(v: &ShardsView) -> Markup {
    html! {
        h1 { "Shards" }
        section aria-labelledby="holders-h" {
            h2 #holders-h { "Replicas" }
            ul #holders {
                @for (holder, shards) in &v.holders {
                    li { strong { (holder.as_deref().unwrap_or("(free)")) } ": " (shards.len()) " shards "
                        small { (shards.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")) } }
                }
            }
        }
        section aria-labelledby="failovers-h" {
            h2 #failovers-h { "Failovers seen" }
            @if v.failovers.is_empty() { p { "No shard changed hands since the dashboard started." } }
            @else {
                table #failovers {
                    thead { tr { th scope="col" { "When" } th scope="col" { "Shard" } th scope="col" { "From" } th scope="col" { "To" } } }
                    tbody { @for (when, f) in &v.failovers {
                        tr { td { (when) } td { (f.shard) } td { (f.from.as_deref().unwrap_or("(free)")) } td { (f.to.as_deref().unwrap_or("(free)")) } }
                    } }
                }
            }
        }
        section aria-labelledby="shards-h" {
            h2 #shards-h { "Shards" }
            table #shards {
                thead { tr { th scope="col" { "Shard" } th scope="col" { "Holder" } th scope="col" { "Held for" }
                    th scope="col" { "Renewed" } th scope="col" { "Namespaces" } th scope="col" { "Apps" } } }
                tbody { @for s in &v.shards {
                    tr data-shard=(s.shard) { td { (s.shard) } td { (s.holder.as_deref().unwrap_or("(free)")) } td { (s.held_for) }
                        td { (s.renewed) } td { (s.namespaces) } td { (s.apps) } }
                } }
            }
        }
    }
}

/// A page that could not be shown: why, in the apiserver's words when it refused.
pub fn problem(title: &str, message: &str) -> Markup {
    html! { h1 { (title) } p.notice role="alert" { (message) } p { a href="/" { "Back to the overview" } } }
}
