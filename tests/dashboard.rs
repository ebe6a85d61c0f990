//! End to end in a real browser: `flotilla dashboard` against the local control plane, an
//! operator replica and a real Prometheus, driven through headless Chromium. An admin finds
//! the App, watches its canary move a step and its analysis plotted without reloading, and
//! promotes it with a button; a tenant admin sees only their namespace, no shards, and the
//! apiserver's refusal when they press a button their RBAC does not allow. Screenshots are
//! saved under the test's temp dir (FLOTILLA_UPDATE_SCREENSHOTS=1 also writes the README's).

mod support;

use flotilla::api::AppPhase;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::time::Duration;
use support::browser::{Dashboard, Driver, click, has_xpath, screenshot, wait_xpath};
use support::rollout::{Rig, analysis, error_rate_check};
use support::{TestNamespace, kubeconfig, kubectl_ok};

/// Longest wait for a page, or for a change to show on an open page (the handover below is
/// held to a second, what the dashboard promises).
const LIVE: Duration = Duration::from_secs(5);

/// A raw HTTP/1.0 request to the dashboard (to send headers a browser would not).
async fn raw(url: &str, request: &str) -> (u16, String) {
    support::http_exchange(url.trim_start_matches("http://"), request)
        .await
        .unwrap_or_else(|| panic!("no HTTP answer from the dashboard at {url}"))
}

/// A kubeconfig for the ServiceAccount `namespace/name`, with a token from the TokenRequest API.
fn service_account_kubeconfig(namespace: &str, name: &str, out: &Path) {
    let token = kubectl_ok(&["-n", namespace, "create", "token", name, "--duration=1h"]);
    let mut kc = kube::config::Kubeconfig::read_from(kubeconfig()).expect("reading the admin kubeconfig");
    for named in &mut kc.auth_infos {
        named.auth_info =
            Some(kube::config::AuthInfo { token: Some(token.trim().to_string().into()), ..Default::default() });
    }
    for ctx in kc.contexts.iter_mut().filter_map(|c| c.context.as_mut()) {
        ctx.namespace = Some(namespace.to_string());
    }
    // Readable by this user only: it holds a token.
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(out)
        .expect("creating the kubeconfig");
    file.write_all(serde_yaml::to_string(&kc).expect("kubeconfig YAML").as_bytes()).expect("writing the kubeconfig");
}

/// Marks the page so that a reload (which would lose the mark) is told apart from a live update.
async fn mark(b: &fantoccini::Client) {
    b.execute("window.__flotillaMark = 'still here'; return null;", vec![]).await.expect("running a script");
}

async fn still_marked(b: &fantoccini::Client) -> bool {
    b.execute("return window.__flotillaMark || null;", vec![]).await.expect("running a script") == json!("still here")
}

fn readme_screenshot(from: &Path) {
    if std::env::var("FLOTILLA_UPDATE_SCREENSHOTS").as_deref() == Ok("1") {
        let to: PathBuf = support::repo_root().join("docs/img/dashboard-canary.png");
        std::fs::create_dir_all(to.parent().expect("dir")).expect("docs/img");
        std::fs::copy(from, &to).expect("copying the screenshot");
        eprintln!("updated {}", to.display());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_in_a_real_browser() {
    let rig = Rig::start("dash").await;
    let ns = rig.ns.name.clone();
    // Where the test plays the shard Leases' holders (the dashboard is told it is the
    // operator's namespace).
    let leases_ns = TestNamespace::create(&rig.client, "dash-leases").await;
    // The tenant admin's own namespace, with an App no operator serves.
    let own = TestNamespace::create(&rig.client, "dash-own").await;
    kubectl_ok(&["-n", &own.name, "create", "serviceaccount", "tenant-admin"]);
    kubectl_ok(&[
        "-n",
        &own.name,
        "create",
        "rolebinding",
        "flotilla-tenant-admins",
        "--clusterrole=flotilla-tenant-admin",
        &format!("--serviceaccount={}:tenant-admin", own.name),
    ]);
    // In the rollout's namespace the tenant admin may only read Apps and Events.
    kubectl_ok(&["-n", &ns, "create", "role", "app-reader", "--verb=get,list,watch", "--resource=apps.flotilla.dev"]);
    kubectl_ok(&["-n", &ns, "create", "role", "event-reader", "--verb=list", "--resource=events"]);
    for role in ["app-reader", "event-reader"] {
        kubectl_ok(&[
            "-n",
            &ns,
            "create",
            "rolebinding",
            role,
            &format!("--role={role}"),
            &format!("--serviceaccount={}:tenant-admin", own.name),
        ]);
    }
    let own_app: flotilla::api::App = serde_json::from_value(json!({
        "apiVersion": "flotilla.dev/v1beta1", "kind": "App", "metadata": {"name": "own", "namespace": own.name},
        "spec": {"image": "registry.example.com/tests/own", "version": "1"},
    }))
    .expect("App");
    Api::<flotilla::api::App>::namespaced(rig.client.clone(), &own.name)
        .create(&PostParams::default(), &own_app)
        .await
        .expect("creating the tenant's App");
    let lease: Lease = serde_json::from_value(json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "flotilla-shard-3", "labels": {"flotilla.dev/lease": "shard"}},
        "spec": {"holderIdentity": "replica-a", "leaseDurationSeconds": 6,
            "acquireTime": "2026-12-01T10:00:00.000000Z", "renewTime": "2026-12-01T10:00:00.000000Z"},
    }))
    .expect("Lease");
    let leases: Api<Lease> = Api::namespaced(rig.client.clone(), &leases_ns.name);
    leases.create(&PostParams::default(), &lease).await.expect("creating a shard Lease");

    rig.traffic("web", "1", 0.0, 0.05);
    rig.traffic("web", "2", 0.01, 0.05);
    let steps = json!([{"weight": 25, "pause": "4s"}, {"weight": 50, "pause": "untilPromoted"}]);
    rig.create(
        "web",
        json!({"replicas": 4, "rollout": {"strategy": {"type": "Canary", "canary": {"steps": steps}},
               "analysis": analysis(error_rate_check())}}),
    )
    .await;
    rig.wait_for_data("web", "2").await;

    let prometheus = rig.prometheus.url();
    let admin =
        Dashboard::start(kubeconfig(), &["--operator-namespace", &leases_ns.name, "--prometheus-url", &prometheus])
            .await;
    assert!(admin.banner.contains("all namespaces"), "an admin sees the cluster: {}", admin.banner);
    let driver = Driver::start().await;
    let b = driver.browser().await;

    // The URL printed opens a session; the overview lists the App, Healthy; the shards page
    // is offered.
    b.goto(&admin.login).await.expect("opening the URL printed");
    wait_xpath(&b, LIVE, "//h1[text()='Overview']").await;
    assert!(!b.current_url().await.expect("url").as_str().contains("key="), "the key stays in the address bar");
    b.goto(&format!("{}/?namespace={ns}", admin.url)).await.expect("opening the overview");
    wait_xpath(&b, LIVE, &format!("//table[@id='apps']//tr[@data-app='{ns}/web']//span[text()='Healthy']")).await;
    assert!(has_xpath(&b, "//nav//a[@href='/shards']").await, "an admin is offered the shards page");
    screenshot(&b, "overview").await;

    // The App's page, then a new version: the canary's first step shows without a reload.
    click(&b, &format!("tr[data-app='{ns}/web'] a")).await;
    wait_xpath(&b, LIVE, "//h1[contains(., 'web')]").await;
    wait_xpath(&b, LIVE, "//span[@id='live' and text()='live']").await;
    mark(&b).await;
    rig.set_version("web", "2").await;
    wait_xpath(&b, support::rollout::MILESTONE, "//ol[@class='steps']/li[@data-step='1' and @aria-current='step']")
        .await;
    wait_xpath(&b, LIVE, "//dd[@id='canary' and contains(., 'at 25%')]").await;
    // After its pause and passing checks, the second step, still without a reload.
    wait_xpath(&b, support::rollout::MILESTONE, "//ol[@class='steps']/li[@data-step='2' and @aria-current='step']")
        .await;
    wait_xpath(&b, LIVE, "//dd[@id='canary' and contains(., 'at 50%')]").await;
    // The analysis' values are plotted against the bound as they come.
    wait_xpath(&b, support::rollout::MILESTONE, "//tr[@data-metric='error-rate']//*[local-name()='polyline']").await;
    wait_xpath(&b, LIVE, "//tr[@data-metric='error-rate']//*[local-name()='line' and @class='bound']").await;
    // ... over the whole rollout, from Prometheus (the operator's query, limited to the namespace).
    wait_xpath(&b, LIVE, "//tr[@data-metric='error-rate']//small[@class='source' and contains(., 'from Prometheus')]")
        .await;
    // ... beside the stable version's values (the same query with version 1).
    wait_xpath(&b, LIVE, "//tr[@data-metric='error-rate']//*[local-name()='polyline' and @class='stable-values']")
        .await;
    assert!(still_marked(&b).await, "the page was reloaded instead of updated live");
    let shot = screenshot(&b, "app-mid-canary").await;
    readme_screenshot(&shot);

    // Promote: the step waiting for a person is passed and the App becomes Healthy at 2.
    click(&b, "button[data-action='promote']").await;
    wait_xpath(&b, LIVE, "//p[@class='notice' and contains(., 'promote requested')]").await;
    wait_xpath(&b, support::rollout::MILESTONE, "//span[@id='phase']/span[text()='Healthy']").await;
    rig.wait_healthy("web", "2").await;
    screenshot(&b, "app-promoted").await;

    // Shards: a handover shows live in the failovers seen.
    b.goto(&format!("{}/shards", admin.url)).await.expect("opening the shards page");
    wait_xpath(&b, LIVE, "//tr[@data-shard='3']/td[text()='replica-a']").await;
    wait_xpath(&b, LIVE, "//span[@id='live' and text()='live']").await;
    mark(&b).await;
    let handed_over = std::time::Instant::now();
    leases
        .patch(
            "flotilla-shard-3",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"holderIdentity": "replica-b"}})),
        )
        .await
        .expect("handing shard 3 over");
    wait_xpath(&b, LIVE, "//table[@id='failovers']//tr[td[2]='3' and td[3]='replica-a' and td[4]='replica-b']").await;
    let took = handed_over.elapsed();
    eprintln!("the handover showed on the open page {took:?} after the Lease was written");
    // The promise is "within a second" (285-293 ms measured in three runs, the polling of
    // the wait included).
    assert!(took < Duration::from_secs(1), "the handover took {took:?} to show on the open page");
    assert!(still_marked(&b).await, "the shards page was reloaded instead of updated live");
    screenshot(&b, "shards").await;

    // What the page's guards refuse: another Host (DNS rebinding), a write without the token,
    // a write from another site.
    let addr = admin.url.trim_start_matches("http://").to_string();
    let (code, _) = raw(&admin.url, "GET / HTTP/1.0\r\nHost: evil.example\r\n\r\n").await;
    assert_eq!(code, 421, "a request naming another host is refused");
    let session = format!("Cookie: {}={}\r\n", admin.cookie, admin.key);
    let pause = |host: &str, extra: &str, body: &str| {
        format!(
            "POST /apps/{ns}/web/action HTTP/1.0\r\nHost: {host}\r\n{extra}Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    // Another user of the machine, without the printed URL's key: nothing, not even a page.
    let (code, text) = raw(&admin.url, &format!("GET /apps/{ns}/web HTTP/1.0\r\nHost: {addr}\r\n\r\n")).await;
    assert_eq!(code, 401, "a request without the session is refused: {text}");
    assert!(!text.contains("name=\"token\""), "the form token was shown without a session");
    let (code, text) = raw(&admin.url, &format!("GET /login?key=guess HTTP/1.0\r\nHost: {addr}\r\n\r\n")).await;
    assert_eq!(code, 401, "a wrong key opens no session: {text}");
    // A name that is not a Kubernetes name never reaches the apiserver.
    let (code, _) =
        raw(&admin.url, &format!("GET /apps/{ns}/web%3Fx=y HTTP/1.0\r\nHost: {addr}\r\n{session}\r\n")).await;
    assert_eq!(code, 404, "a name with a query in it is refused");
    let (code, text) = raw(&admin.url, &pause(&addr, &session, "verb=pause&token=guess")).await;
    assert_eq!(code, 403, "a write without the page's token is refused: {text}");
    let page = b.source().await.expect("page source");
    let token =
        page.split("name=\"token\" value=\"").nth(1).and_then(|rest| rest.split('"').next()).map(str::to_string);
    let token = match token {
        Some(t) => t,
        None => {
            b.goto(&format!("{}/apps/{ns}/web", admin.url)).await.expect("App page");
            wait_xpath(&b, LIVE, "//h1").await;
            let src = b.source().await.expect("source");
            src.split("name=\"token\" value=\"")
                .nth(1)
                .and_then(|r| r.split('"').next())
                .unwrap_or_default()
                .to_string()
        }
    };
    let body = format!("verb=pause&token={token}");
    let cross = format!("{session}Origin: http://evil.example\r\nSec-Fetch-Site: cross-site\r\n");
    let (code, text) = raw(&admin.url, &pause(&addr, &cross, &body)).await;
    assert_eq!(code, 403, "a write from another site is refused even with the token: {text}");
    assert!(text.contains("another site"), "{text}");
    // A button of a page that showed an older spec (generation 1) acts on nothing.
    let stale = format!("verb=pause&token={token}&generation=1");
    let (code, text) = raw(&admin.url, &pause(&addr, &session, &stale)).await;
    assert_eq!(code, 303, "{text}");
    let location = text
        .lines()
        .find_map(|l| l.strip_prefix("location: ").or_else(|| l.strip_prefix("Location: ")))
        .map(str::trim)
        .unwrap_or_else(|| panic!("no location in {text}"))
        .to_string();
    let (_, shown) = raw(&admin.url, &format!("GET {location} HTTP/1.0\r\nHost: {addr}\r\n{session}\r\n")).await;
    assert!(
        shown.contains("Pause was not done: the App&#39;s spec changed")
            || shown.contains("Pause was not done: the App's spec changed"),
        "{shown}"
    );
    let annotations = rig.app("web").await.metadata.annotations.unwrap_or_default();
    assert!(!annotations.contains_key("flotilla.dev/paused"), "a refused write changed the App");

    // A tenant admin: their namespace only, no shards, and RBAC's refusal shown.
    let tenant_kc = std::env::temp_dir().join(format!("flotilla-dash-{}-{}.kubeconfig", own.name, std::process::id()));
    service_account_kubeconfig(&own.name, "tenant-admin", &tenant_kc);
    let tenant = Dashboard::start(&tenant_kc, &["--operator-namespace", &leases_ns.name]).await;
    assert!(
        tenant.banner.contains(&format!("system:serviceaccount:{}:tenant-admin", own.name)),
        "the dashboard says who it acts as: {}",
        tenant.banner
    );
    b.goto(&tenant.login).await.expect("opening the tenant's overview");
    wait_xpath(&b, LIVE, &format!("//table[@id='apps']//tr[@data-app='{}/own']", own.name)).await;
    assert!(!has_xpath(&b, &format!("//tr[@data-app='{ns}/web']")).await, "another namespace's App is shown");
    assert!(!has_xpath(&b, "//nav//a[@href='/shards']").await, "a tenant admin is offered the shards page");
    assert!(!has_xpath(&b, "//section[h2='Tenants']").await, "a tenant admin sees the Tenants");
    screenshot(&b, "tenant-overview").await;
    b.goto(&format!("{}/shards", tenant.url)).await.expect("shards");
    wait_xpath(&b, LIVE, "//h1[text()='Not allowed']").await;
    wait_xpath(&b, LIVE, "//p[@class='notice' and contains(., 'forbidden')]").await;
    // The App they may read but not change: the button's request is refused by the apiserver.
    b.goto(&format!("{}/apps/{ns}/web", tenant.url)).await.expect("the read-only App");
    wait_xpath(&b, LIVE, "//span[@id='phase']/span[text()='Healthy']").await;
    click(&b, "button[data-action='undo']").await;
    // Undo asks first.
    b.accept_alert().await.expect("the undo question");
    wait_xpath(&b, LIVE, "//p[@class='notice' and contains(., 'Undo was not done') and contains(., 'rights')]").await;
    screenshot(&b, "tenant-refused").await;
    assert_eq!(rig.app("web").await.spec.version, "2", "a refused undo changed the App");
    assert_eq!(rig.app("web").await.status.and_then(|s| s.phase), Some(AppPhase::Healthy));

    b.close().await.expect("closing the browser");
    let _ = std::fs::remove_file(tenant_kc);
}
