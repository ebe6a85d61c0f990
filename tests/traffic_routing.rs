//! End to end, a canary routed through a Gateway API HTTPRoute (the standard-channel CRDs
//! from the Go module, no data plane): the route's two weights at every step, put back when
//! edited by hand while the rest of the edit stays, set to 0 at once on a rollback while the
//! stable Deployment never shrinks, and a route that is missing or does not send to the App
//! reported in status and never created.

mod support;

use flotilla::api::AppPhase;
use flotilla::app::route::http_route_resource;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use support::rollout::{Rig, analysis, condition, error_rate_check};

const ROUTE: &str = "shop-route";

fn route(namespace: &str, rules: Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": ROUTE, "namespace": namespace},
        "spec": {"parentRefs": [{"name": "public"}], "hostnames": ["shop.example.com"], "rules": rules},
    }))
    .expect("an HTTPRoute")
}

/// The route of the test: an admin rule that is not the App's, and the App's rule.
fn shop_rules() -> Value {
    json!([
        {"matches": [{"path": {"type": "PathPrefix", "value": "/admin"}}], "backendRefs": [{"name": "admin", "port": 80}]},
        {"backendRefs": [{"name": "shop", "port": 80, "weight": 1}, {"name": "shop-canary", "port": 80, "weight": 1}]},
    ])
}

/// (stable, canary) weights of the App's rule, and the whole route.
async fn weights(routes: &Api<DynamicObject>) -> ((i64, i64), Value) {
    let r = serde_json::to_value(routes.get(ROUTE).await.expect("reading the HTTPRoute")).expect("JSON");
    let w =
        |i: usize| r.pointer(&format!("/spec/rules/1/backendRefs/{i}/weight")).and_then(Value::as_i64).unwrap_or(-1);
    ((w(0), w(1)), r)
}

async fn wait_weights(routes: &Api<DynamicObject>, want: (i64, i64), within: Duration, what: &str) -> Value {
    let started = Instant::now();
    loop {
        let (got, route) = weights(routes).await;
        if got == want {
            return route;
        }
        assert!(started.elapsed() < within, "{what}: the route's weights are {got:?}, want {want:?} within {within:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn waiting_at(step: i32) -> impl Fn(&flotilla::api::App) -> Option<()> {
    move |a| {
        let s = a.status.as_ref()?;
        (s.phase == Some(AppPhase::Paused) && s.canary.as_ref()?.step == step).then_some(())
    }
}

fn replicas(d: &Option<k8s_openapi::api::apps::v1::Deployment>) -> Option<i32> {
    d.as_ref().and_then(|d| d.spec.as_ref()?.replicas)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_routed_canary_sets_exact_weights_puts_back_drift_and_routes_nothing_to_a_rolled_back_canary() {
    let rig = Rig::start("tr-gw").await;
    support::install_gateway_api();
    let ns = rig.ns.name.clone();
    let routes: Api<DynamicObject> = Api::namespaced_with(rig.client.clone(), &ns, &http_route_resource());
    routes.create(&PostParams::default(), &route(&ns, shop_rules())).await.expect("creating the HTTPRoute");
    rig.traffic("shop", "1", 0.0, 0.05);
    rig.traffic("shop", "2", 0.0, 0.05);
    let strategy = json!({"type": "Canary", "canary": {
        "steps": [{"weight": 10, "pause": "untilPromoted"}, {"weight": 60, "pause": "untilPromoted"}],
        "trafficRouting": {"gatewayAPI": {"httpRoute": ROUTE}}}});
    rig.create(
        "shop",
        json!({"replicas": 4, "rollout": {"strategy": strategy, "analysis": analysis(error_rate_check())}}),
    )
    .await;
    // Steady: every request to the stable Service.
    wait_weights(&routes, (100, 0), Duration::from_secs(10), "steady").await;
    let services: Api<k8s_openapi::api::core::v1::Service> = Api::namespaced(rig.client.clone(), &ns);
    let track = |s: k8s_openapi::api::core::v1::Service| {
        s.spec.and_then(|s| s.selector).and_then(|m| m.get("flotilla.dev/track").cloned())
    };
    assert_eq!(track(services.get("shop").await.expect("Service shop")).as_deref(), Some("stable"));
    assert_eq!(track(services.get("shop-canary").await.expect("Service shop-canary")).as_deref(), Some("canary"));

    // Step 1: 10% of the requests, exactly, with one canary pod; the stable Deployment keeps 4.
    rig.wait_for_data("shop", "2").await;
    rig.set_version("shop", "2").await;
    let started = Instant::now();
    let mut seen = Vec::new();
    loop {
        let ((s, c), _) = weights(&routes).await;
        if seen.last() != Some(&(s, c)) {
            seen.push((s, c));
        }
        assert_eq!(replicas(&rig.deployment("shop").await), Some(4), "the stable Deployment never shrinks");
        let app = rig.app("shop").await;
        if waiting_at(0)(&app).is_some() && (s, c) == (90, 10) {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "step 1 not reached: weights {seen:?}, {:?}", app.status);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(seen, [(100, 0), (90, 10)], "no other weight on the way");
    assert_eq!(replicas(&rig.deployment("shop-canary").await), Some(1));

    // A person edits the route: the weights are put back, the new hostname stays.
    let edit = json!([
        {"op": "replace", "path": "/spec/rules/1/backendRefs/0/weight", "value": 50},
        {"op": "replace", "path": "/spec/rules/1/backendRefs/1/weight", "value": 50},
        {"op": "add", "path": "/spec/hostnames/-", "value": "edited.example.com"},
    ]);
    let edit: json_patch::Patch = serde_json::from_value(edit).expect("a JSON patch");
    routes.patch(ROUTE, &PatchParams::default(), &Patch::<()>::Json(edit)).await.expect("editing the route");
    let edited = wait_weights(&routes, (90, 10), Duration::from_secs(12), "drift put back").await;
    assert_eq!(edited.pointer("/spec/hostnames/1").and_then(Value::as_str), Some("edited.example.com"));
    assert_eq!(edited.pointer("/spec/rules/0/backendRefs/0/name").and_then(Value::as_str), Some("admin"));
    assert!(edited.pointer("/spec/rules/0/backendRefs/0/weight").is_none_or(|w| w == 1), "the admin rule is untouched");
    rig.wait_events("shop", &["DriftCorrected"]).await;

    // Step 2 after a promote: 60%, three canary pods (60% of 4, rounded up).
    rig.apps
        .patch(
            "shop",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"flotilla.dev/action": "promote 1"}}})),
        )
        .await
        .expect("promoting");
    rig.wait_until("shop", "waiting at step 2", waiting_at(1)).await;
    wait_weights(&routes, (40, 60), Duration::from_secs(10), "step 2").await;
    assert_eq!(replicas(&rig.deployment("shop-canary").await), Some(3));
    assert_eq!(replicas(&rig.deployment("shop").await), Some(4));

    // The new version fails its checks: weight 0 at once, while the canary's pods still exist
    // (they drain), and the stable Deployment was never scaled down.
    rig.traffic("shop", "2", 0.5, 0.05);
    let started = Instant::now();
    loop {
        assert_eq!(replicas(&rig.deployment("shop").await), Some(4), "the stable Deployment never shrinks");
        let app = rig.app("shop").await;
        if app.status.as_ref().and_then(|s| s.phase) == Some(AppPhase::RolledBack) {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "not rolled back: {:?}", app.status);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    wait_weights(&routes, (100, 0), Duration::from_secs(3), "rollback").await;
    assert!(rig.deployment("shop-canary").await.is_some(), "the route moved before the canary's pods went");
    support::wait_for(Duration::from_secs(30), "the canary gone after its drain", || async {
        rig.deployment("shop-canary").await.is_none().then_some(())
    })
    .await;

    // No route: reported, the rollout waits, and the route is not created.
    routes.delete(ROUTE, &DeleteParams::default()).await.expect("deleting the route");
    rig.set_version("shop", "3").await;
    let app = rig
        .wait_until("shop", "waiting for its route", |a| {
            (condition(a, "Ready").1 == "RouteNotUsable" && a.status.as_ref()?.phase == Some(AppPhase::Paused))
                .then_some(())
        })
        .await;
    let problem = app.status.and_then(|s| s.traffic_routing).and_then(|t| t.problem).unwrap_or_default();
    assert!(problem.contains("does not exist"), "{problem}");
    assert!(routes.get_opt(ROUTE).await.expect("reading").is_none(), "never created by Flotilla");

    // A route that does not send to the App's Services: reported, left as it is.
    let foreign = json!([{"backendRefs": [{"name": "admin", "port": 80}]}]);
    routes.create(&PostParams::default(), &route(&ns, foreign.clone())).await.expect("creating the route");
    let app = rig
        .wait_until("shop", "a route that does not send to it", |a| {
            let t = a.status.as_ref()?.traffic_routing.as_ref()?;
            t.problem.as_deref()?.contains("has no rule that sends requests").then_some(())
        })
        .await;
    assert_eq!(app.status.and_then(|s| s.canary).map(|c| c.step), Some(0), "no step taken");
    let kept = serde_json::to_value(routes.get(ROUTE).await.expect("reading")).expect("JSON");
    assert_eq!(kept.pointer("/spec/rules/0/backendRefs/0/name").and_then(Value::as_str), Some("admin"));
    assert!(kept.pointer("/spec/rules/1").is_none(), "nothing added to the route");
    rig.wait_events("shop", &["RouteNotUsable", "RolledBack"]).await;

    // A usable route again: the waiting step goes on at 10%. Then the App stops naming the
    // route mid-rollout: the route's canary share goes back to 0 before the canary's Service
    // goes, and status stops naming the route only then.
    routes.delete(ROUTE, &DeleteParams::default()).await.expect("deleting the route");
    support::wait_for(Duration::from_secs(10), "the route gone", || async {
        routes.get_opt(ROUTE).await.ok().flatten().is_none().then_some(())
    })
    .await;
    rig.traffic("shop", "3", 0.0, 0.05);
    routes.create(&PostParams::default(), &route(&ns, shop_rules())).await.expect("creating the route");
    wait_weights(&routes, (90, 10), Duration::from_secs(30), "the waiting step").await;
    rig.patch_spec("shop", json!({"rollout": {"strategy": {"canary": {"trafficRouting": null}}}})).await;
    wait_weights(&routes, (100, 0), Duration::from_secs(10), "a route no longer named").await;
    // The route's backend stays resolvable while the Gateway takes the new weights (the drain).
    assert!(services.get_opt("shop-canary").await.expect("reading").is_some(), "the canary Service drains first");
    support::wait_for(Duration::from_secs(25), "the canary Service removed after its drain", || async {
        services.get_opt("shop-canary").await.ok().flatten().is_none().then_some(())
    })
    .await;
    // The same reconcile removes the Service, then writes the status without the route.
    support::wait_for(Duration::from_secs(5), "status no longer naming the route", || async {
        rig.app("shop").await.status.and_then(|s| s.traffic_routing).is_none().then_some(())
    })
    .await;
}
