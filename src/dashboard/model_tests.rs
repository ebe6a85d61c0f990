use super::*;
use serde_json::json;

/// An App as stored with a template that is not one: it reads only as why.
fn unreadable(ns: &str, name: &str) -> LenientApp {
    serde_json::from_value(json!({
        "apiVersion": "flotilla.dev/v1beta1", "kind": "App",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"image": "registry.example.com/x", "version": "2", "template": "<b>x</b>"},
        "status": {"phase": "Healthy", "ready": "2/2"},
    }))
    .expect("any App reads")
}

#[test]
fn an_app_that_cannot_be_read_is_a_row_with_why_beside_the_others() {
    let apps =
        [LenientApp::from(healthy("shop", "cart")), unreadable("shop", "broken"), LenientApp::from(mid_canary())];
    let tenants = [tenant("retail", &["shop"])];
    let o = overview(&apps, Some(&tenants), &Filter::default());
    assert_eq!(o.apps.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(), ["broken", "cart", "web"]);
    let row = &o.apps[0];
    assert_eq!((row.phase, row.version.as_str(), row.ready.as_str(), row.in_progress), (INVALID, "-", "2/2", false));
    assert_eq!(row.tenant.as_deref(), Some("retail"));
    let problem = row.problem.as_deref().expect("why");
    assert!(problem.starts_with("cannot be read as an App: spec.template: invalid type: string"), "{problem}");
    assert!(o.apps[1].problem.is_none(), "a readable App has no problem");
    assert_eq!(o.phases.iter().find(|(p, _)| *p == INVALID), Some(&(INVALID, 1)));
    let retail = &o.tenants.as_ref().expect("tenants")[0];
    assert_eq!((retail.apps, retail.healthy), (3, 1), "counted among the tenant's Apps, not as healthy");
    let only = overview(&apps, None::<&[Tenant]>, &Filter { phase: Some(INVALID.into()), ..Filter::default() });
    assert_eq!(only.apps.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(), ["broken"]);
    let html = super::super::pages::overview(&o, &[]).into_string();
    assert!(html.contains("cannot be read as an App: spec.template"), "shown in its row");
    assert!(!html.contains("<b>x</b>"), "the App's text is escaped: {html}");
}

fn app(ns: &str, name: &str, spec: serde_json::Value, status: serde_json::Value) -> App {
    serde_json::from_value(json!({
        "apiVersion": "flotilla.dev/v1beta1", "kind": "App",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec, "status": status,
    }))
    .expect("App")
}

fn canary_spec() -> serde_json::Value {
    json!({"image": "registry.example.com/shop/web", "version": "2", "replicas": 4,
        "rollout": {"strategy": {"type": "Canary", "canary": {"steps": [
            {"weight": 25, "pause": "30s"}, {"weight": 50, "pause": "untilPromoted"}, {"weight": 75}]}}}})
}

fn mid_canary() -> App {
    app(
        "shop",
        "web",
        canary_spec(),
        json!({"phase": "Progressing", "currentVersion": "1", "targetVersion": "2", "ready": "4/4",
            "rollout": {"startedAt": "2026-12-01T10:00:00Z"},
            "canary": {"step": 1, "steps": 3, "weight": 50, "replicas": 2, "stableReplicas": 2,
                "stepStartedAt": "2026-12-01T10:01:00Z"},
            "trafficRouting": {"httpRoute": "web", "canaryWeight": 50},
            "analysis": {"failures": 0, "lastRun": "2026-12-01T10:01:30Z", "lastResult": "Pass",
                "measurements": [{"name": "error-rate", "result": "Pass", "value": 0.01, "max": 0.05}]}}),
    )
}

fn healthy(ns: &str, name: &str) -> App {
    app(
        ns,
        name,
        json!({"image": "registry.example.com/x", "version": "2"}),
        json!({"phase": "Healthy", "currentVersion": "2", "ready": "1/1",
            "history": [{"version": "2", "result": "Promoted", "at": "2026-12-01T09:00:00Z", "replaced": "1"}]}),
    )
}

fn tenant(name: &str, namespaces: &[&str]) -> Tenant {
    serde_json::from_value(json!({
        "apiVersion": "flotilla.dev/v1beta1", "kind": "Tenant", "metadata": {"name": name},
        "spec": {"namespaces": namespaces, "admins": [{"kind": "Group", "name": name}]},
        "status": {"namespaces": [{"name": namespaces[0], "state": "Onboarded", "message": ""}],
            "conditions": [{"type": "Ready", "status": "True", "reason": "Onboarded", "message": "",
                "lastTransitionTime": "2026-12-01T09:00:00Z"}]},
    }))
    .expect("Tenant")
}

fn now() -> Timestamp {
    "2026-12-01T10:02:00Z".parse().expect("time")
}

#[test]
fn overview_puts_rollouts_on_top_and_narrows_by_tenant_namespace_and_phase() {
    let apps =
        [healthy("shop", "cart"), mid_canary(), healthy("blog", "posts"), healthy("other", "x")].map(LenientApp::from);
    let tenants = [tenant("retail", &["shop", "shop-dev"]), tenant("media", &["blog"])];
    let o = overview(&apps, Some(&tenants), &Filter::default());
    assert_eq!(o.in_progress.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(), ["web"]);
    assert_eq!(o.in_progress[0].progress.as_deref(), Some("canary step 2/3 at 50%"));
    assert_eq!(o.apps.len(), 4);
    assert_eq!(o.apps.iter().find(|r| r.name == "cart").and_then(|r| r.tenant.as_deref()), Some("retail"));
    assert_eq!(o.apps.iter().find(|r| r.name == "x").and_then(|r| r.tenant.as_deref()), None);
    let t = o.tenants.as_ref().expect("tenants listed");
    let retail = t.iter().find(|t| t.name == "retail").expect("retail");
    assert_eq!((retail.apps, retail.healthy, retail.ready), (2, 1, Some(true)));
    assert_eq!(retail.namespaces[1].state, "Pending", "a namespace the status does not report yet");
    assert!(o.namespaces.contains(&"shop-dev".to_string()), "a Tenant's namespace without Apps is a choice");

    let by_tenant = overview(&apps, Some(&tenants), &Filter { tenant: Some("retail".into()), ..Filter::default() });
    assert_eq!(by_tenant.apps.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(), ["cart", "web"]);
    let by_ns = overview(&apps, Some(&tenants), &Filter { namespace: Some("blog".into()), ..Filter::default() });
    assert_eq!(by_ns.apps.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(), ["posts"]);
    let by_phase =
        overview(&apps, None::<&[Tenant]>, &Filter { phase: Some("Progressing".into()), ..Filter::default() });
    assert_eq!(by_phase.apps.len(), 1);
    assert_eq!(by_phase.phases.iter().find(|(p, _)| *p == "Healthy"), Some(&("Healthy", 0)));
    assert!(by_phase.tenants.is_none(), "no Tenants section without the right to list them");
    let blank =
        Filter { tenant: Some(" ".into()), namespace: Some(String::new()), phase: None, page: Some(1) }.normalized();
    assert_eq!(blank, Filter::default());
}

#[test]
fn canary_page_marks_the_current_step_and_the_split() {
    let v = app_view(&mid_canary(), &[], &BTreeMap::new(), &BTreeMap::new(), now());
    let states: Vec<StepState> = v.steps.iter().map(|s| s.state).collect();
    assert_eq!(states, [StepState::Done, StepState::Current, StepState::Pending]);
    assert_eq!(v.steps[1].pause, "until promoted");
    assert_eq!(v.steps[0].pause, "for 30s");
    let r = v.route.expect("route");
    assert_eq!((r.stable_weight, r.canary_weight), (50, 50));
    assert_eq!(v.target_version.as_deref(), Some("2"));
    assert_eq!(v.actions, [Action::Promote, Action::PromoteFull, Action::Abort, Action::Pause, Action::Undo]);
    assert_eq!(v.metrics[0].bounds, "<= 0.05");
    // Promoting after the last step: every step is done.
    let mut done = mid_canary();
    if let Some(c) = done.status.as_mut().and_then(|s| s.canary.as_mut()) {
        c.step = 3;
    }
    let steps = app_view(&done, &[], &BTreeMap::new(), &BTreeMap::new(), now()).steps;
    assert!(steps.iter().all(|s| s.state == StepState::Done));
    // No rollout: no step is current.
    let idle = app("shop", "web", canary_spec(), json!({"phase": "Healthy", "currentVersion": "2"}));
    assert!(
        app_view(&idle, &[], &BTreeMap::new(), &BTreeMap::new(), now())
            .steps
            .iter()
            .all(|s| s.state == StepState::Pending)
    );
}

#[test]
fn actions_follow_the_state() {
    assert_eq!(actions(&healthy("a", "b")), [Action::Undo], "a promoted version before: undo");
    let fresh =
        app("a", "b", json!({"image": "i", "version": "1"}), json!({"phase": "Healthy", "currentVersion": "1"}));
    assert!(actions(&fresh).is_empty());
    let mut paused = mid_canary();
    paused.metadata.annotations = Some([("flotilla.dev/paused".to_string(), "true".to_string())].into());
    assert!(actions(&paused).contains(&Action::Resume) && !actions(&paused).contains(&Action::Pause));
    let failed = app(
        "a",
        "b",
        json!({"image": "i", "version": "2"}),
        json!({"phase": "RolledBack", "currentVersion": "1",
            "failedVersion": {"version": "2", "generation": 2, "reason": "AnalysisFailed", "message": "m"}}),
    );
    assert!(actions(&failed).contains(&Action::Retry));
    for a in Action::ALL {
        assert_eq!(Action::parse(a.verb()), Some(a));
    }
    assert_eq!(Action::parse("delete"), None);
}

#[test]
fn plots_keep_bounds_in_sight_and_survive_hostile_values() {
    let p = plot(&[(0, 0.01), (10, 0.02), (20, 0.03)], &[], None, Some(0.05)).expect("plot");
    assert_eq!(p.points.split(' ').count(), 3);
    let max_y = p.max_y.expect("the bound is within the range");
    assert!((0.0..PLOT_HEIGHT).contains(&max_y));
    assert!(p.points.starts_with("0.0,") && p.points.contains("320.0,"), "{}", p.points);
    // Not-finite values are left out; extreme ones give finite coordinates.
    let p =
        plot(&[(0, f64::NAN), (5, f64::INFINITY), (10, f64::MAX), (20, -f64::MAX)], &[(10, f64::NAN)], Some(0.0), None)
            .expect("plot");
    assert!(!p.points.contains("NaN") && !p.points.contains("inf"), "{}", p.points);
    assert_eq!(p.points.split(' ').count(), 2);
    // One value: a point at the right edge; none: no plot.
    assert!(plot(&[(5, 1.0)], &[], None, None).is_some());
    assert!(plot(&[(5, f64::NAN)], &[(5, 1.0)], None, Some(1.0)).is_none());
    assert!(plot(&[], &[], None, None).is_none());
}

#[test]
fn events_newest_first() {
    let event = |reason: &str, at: &str| -> Event {
        serde_json::from_value(json!({"metadata": {"name": reason}, "involvedObject": {},
            "reason": reason, "message": "m", "type": "Normal", "lastTimestamp": at}))
        .expect("event")
    };
    let rows = event_rows(&[event("Old", "2026-12-01T09:00:00Z"), event("New", "2026-12-01T10:00:00Z")], now());
    assert_eq!(rows.iter().map(|r| r.reason.as_str()).collect::<Vec<_>>(), ["New", "Old"]);
    assert_eq!(rows[0].when, "2m ago");
}

#[test]
fn pages_escape_what_tenants_and_their_prometheus_wrote() {
    let mut a = mid_canary();
    if let Some(m) = a.status.as_mut().and_then(|s| s.analysis.as_mut()).and_then(|x| x.measurements.first_mut()) {
        m.message = Some("<script>alert(1)</script>".into());
    }
    let evil: Event = serde_json::from_value(json!({"metadata": {"name": "e"}, "involvedObject": {},
        "reason": "X\"><img src=x onerror=alert(1)>", "message": "<b>bold</b>"}))
    .expect("event");
    let v = app_view(&a, &[evil], &BTreeMap::new(), &BTreeMap::new(), now());
    let html = super::super::pages::app(&v, "tok", &["<i>notice</i>".to_string()]).into_string();
    assert!(!html.contains("<script>") && html.contains("&lt;script&gt;"), "{html}");
    assert!(!html.contains("<img") && !html.contains("<b>") && !html.contains("<i>"), "{html}");
}

#[test]
fn shards_group_by_holder_and_list_failovers_newest_first() {
    use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
    let lease = |shard: u32, holder: &str| Lease {
        metadata: kube::api::ObjectMeta { name: Some(format!("flotilla-shard-{shard}")), ..Default::default() },
        spec: Some(LeaseSpec {
            holder_identity: Some(holder.into()),
            renew_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(now())),
            ..Default::default()
        }),
    };
    let at = |s: i64| Timestamp::from_second(now().as_second() - s).expect("ts");
    let failovers = [
        Failover { at: at(60), shard: 1, from: Some("a".into()), to: Some("b".into()) },
        Failover { at: at(5), shard: 0, from: Some("b".into()), to: None },
    ];
    let v = shards_view(4, &[lease(0, "a"), lease(1, "b"), lease(2, "b")], &[], &[], &failovers, now());
    assert_eq!(v.holders, [(None, vec![3]), (Some("a".to_string()), vec![0]), (Some("b".to_string()), vec![1, 2])]);
    assert_eq!(v.failovers[0].1.shard, 0, "newest first");
    assert_eq!(v.failovers[0].0, "5s ago");
    assert_eq!(v.shards[0].renewed, "0s ago");
}

#[test]
fn plots_prefer_prometheus_and_say_why_not() {
    let seen: BTreeMap<String, Samples> = [("error-rate".to_string(), vec![(1, 0.01)])].into();
    let from_prometheus: BTreeMap<String, Ranges> = [(
        "error-rate".to_string(),
        Ranges {
            values: Some(Ok(vec![(0, 0.0), (5, 0.01), (10, 0.02)])),
            stable: vec![(0, 0.5), (10, 0.5), (99, 9.0)],
        },
    )]
    .into();
    let v = app_view(&mid_canary(), &[], &seen, &from_prometheus, now());
    assert_eq!((v.metrics[0].samples, v.metrics[0].source), (3, FROM_PROMETHEUS));
    let p = v.metrics[0].plot.clone().expect("plot");
    assert_eq!(
        p.stable_points.as_deref().map(|s| s.split(' ').count()),
        Some(2),
        "the stable value past the axis is left out"
    );
    assert!(p.range.1 >= 0.5, "the range covers the stable line: {:?}", p.range);
    let failed: BTreeMap<String, Ranges> =
        [("error-rate".to_string(), Ranges { values: Some(Err("down".into())), stable: Vec::new() })].into();
    let v = app_view(&mid_canary(), &[], &seen, &failed, now());
    assert_eq!((v.metrics[0].samples, v.metrics[0].source), (1, SEEN_HERE));
    assert_eq!(v.metrics[0].range_problem.as_deref(), Some("down"));
}

#[test]
fn the_overview_pages_through_many_apps() {
    let apps: Vec<LenientApp> = (0..450).map(|i| LenientApp::from(healthy("ns", &format!("app-{i:03}")))).collect();
    let first = overview(&apps, None::<&[Tenant]>, &Filter::default());
    assert_eq!((first.total, first.page, first.pages, first.apps.len()), (450, 1, 3, PAGE_SIZE));
    let last = overview(&apps, None::<&[Tenant]>, &Filter { page: Some(3), ..Filter::default() });
    assert_eq!((last.page, last.apps.len(), last.apps[0].name.as_str()), (3, 50, "app-400"));
    let beyond = overview(&apps, None::<&[Tenant]>, &Filter { page: Some(99), ..Filter::default() });
    assert_eq!(beyond.page, 3, "a page past the end shows the last");
    let q = super::super::pages::filter_query(&Filter { tenant: Some("a&b=c".into()), ..Filter::default() }, 2);
    assert_eq!(q, "tenant=a%26b%3Dc&page=2");
}
