//! End to end, against the local control plane: a tenant cannot turn rollout analysis against
//! the platform or other tenants. One operator replica runs in tenancy mode with its real
//! ServiceAccount token, a real Prometheus (scraping an exporter with two tenants' series) as
//! its `--prometheus-url`, and hostile HTTP servers in this process that count what reaches
//! them:
//! - a server answering `aws_secret_access_key=...` leaves no trace of it in status,
//!   conditions or Events;
//! - a redirect is not followed (the server it points to gets nothing);
//! - an endless body is cut at 1 MiB and the replica's memory stays within bound;
//! - an address the platform did not allow is refused (`PrometheusNotAllowed`) and never fetched;
//! - a query naming another tenant's namespace, or none, reads nothing of the other tenant.

mod support;

use flotilla::api::{App, AppPhase, MeasurementResult, NamespaceState, Tenant};
use k8s_openapi::api::events::v1::Event;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;
use support::prometheus::{Exporter, Prometheus, Traffic};
use support::{Operator, admin_client, install_crds, operator_kubeconfig, unique, wait_for};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const SECRET: &str = "aws_secret_access_key=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";

/// What a hostile server answers to every request.
#[derive(Clone)]
enum Answer {
    /// 200 text/plain with the secret.
    Secret,
    /// 302 to this URL.
    Redirect(String),
    /// 200 application/json, a body that never ends (chunks of 64 KiB, no length).
    Endless,
}

/// An HTTP server on 127.0.0.1 that counts the requests it gets and the bytes it sends.
struct Hostile {
    url: String,
    requests: Arc<AtomicUsize>,
    sent: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Hostile {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Hostile {
    async fn start(answer: Answer) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("binding a hostile server");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        let requests = Arc::new(AtomicUsize::new(0));
        let sent = Arc::new(AtomicU64::new(0));
        let (r, s) = (requests.clone(), sent.clone());
        let task = tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let (r, s, answer) = (r.clone(), s.clone(), answer.clone());
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 4096];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match stream.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    r.fetch_add(1, Ordering::SeqCst);
                    let _ = match answer {
                        Answer::Secret => {
                            let text = format!(
                                "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{SECRET}",
                                SECRET.len()
                            );
                            stream.write_all(text.as_bytes()).await
                        }
                        Answer::Redirect(to) => {
                            let text = format!(
                                "HTTP/1.1 302 Found\r\nLocation: {to}/api/v1/query?query=up\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{SECRET}",
                                SECRET.len()
                            );
                            stream.write_all(text.as_bytes()).await
                        }
                        Answer::Endless => {
                            let head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
                            if stream.write_all(head.as_bytes()).await.is_err() {
                                return;
                            }
                            let chunk = format!("10000\r\n{}\r\n", "[".repeat(0x10000));
                            loop {
                                if stream.write_all(chunk.as_bytes()).await.is_err() {
                                    break;
                                }
                                s.fetch_add(0x10000, Ordering::SeqCst);
                            }
                            Ok(())
                        }
                    };
                });
            }
        });
        Self { url, requests, sent, task }
    }

    fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

/// A Tenant with one namespace (named like it), listing `endpoints`, onboarded.
async fn tenant(client: &Client, prefix: &str, endpoints: Value) -> String {
    let name = unique(prefix);
    let tenant: Tenant = serde_json::from_value(json!({
        "apiVersion": "flotilla.dev/v1beta1", "kind": "Tenant", "metadata": {"name": name},
        "spec": {"namespaces": [name], "prometheusEndpoints": endpoints},
    }))
    .expect("tenant");
    let tenants: Api<Tenant> = Api::all(client.clone());
    tenants.create(&PostParams::default(), &tenant).await.expect("creating Tenant");
    wait_for(Duration::from_secs(60), &format!("Tenant {name} onboarded"), || async {
        let s = tenants.get(&name).await.ok()?.status?;
        s.namespaces.iter().any(|n| n.state == NamespaceState::Onboarded).then_some(())
    })
    .await;
    name
}

/// Deletes the Tenants (and their namespaces) when the test ends, passed or failed.
struct Cleanup(Vec<String>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for name in &self.0 {
            let _ = support::kubectl_try(&["delete", "tenant", name, "--wait=false", "--ignore-not-found"]);
            let _ = support::kubectl_try(&["delete", "namespace", name, "--wait=false", "--ignore-not-found"]);
        }
    }
}

/// Creates App `name` in `namespace` at version 1 with a canary held at its first step and
/// `analysis`, waits until it is Healthy, then asks for version 2 (the analysis starts).
async fn rolling_app(client: &Client, namespace: &str, name: &str, analysis: Value) -> Api<App> {
    let apps: Api<App> = Api::namespaced(client.clone(), namespace);
    let app: App = serde_json::from_value(json!({
        "apiVersion": "flotilla.dev/v1beta1", "kind": "App", "metadata": {"name": name, "namespace": namespace},
        "spec": {"image": format!("registry.example.com/tests/{name}"), "version": "1", "replicas": 2,
                 "rollout": {"strategy": {"type": "Canary", "canary": {"steps": [{"weight": 50, "pause": "1h"}]}},
                             "analysis": analysis}},
    }))
    .expect("App");
    apps.create(&PostParams::default(), &app).await.expect("creating App");
    wait_for(Duration::from_secs(60), &format!("App {name} Healthy at 1"), || async {
        (apps.get(name).await.ok()?.status?.current_version.as_deref() == Some("1")).then_some(())
    })
    .await;
    apps.patch(name, &PatchParams::default(), &Patch::Merge(json!({"spec": {"version": "2"}})))
        .await
        .expect("new version");
    apps
}

/// Waits until the first measurement of App `name` is `result` with a message containing
/// `text`; returns the App then.
async fn measured(apps: &Api<App>, name: &str, result: MeasurementResult, text: &str) -> App {
    wait_for(Duration::from_secs(60), &format!("App {name}: a measurement {result:?} saying {text:?}"), || async {
        let app = apps.get(name).await.ok()?;
        let m = app.status.as_ref()?.analysis.as_ref()?.measurements.first()?.clone();
        (m.result == result && m.message.as_deref().unwrap_or_default().contains(text)).then_some(app)
    })
    .await
}

/// Everything a tenant reads about its App: status (conditions included) and Events.
async fn what_the_tenant_reads(client: &Client, apps: &Api<App>, name: &str) -> String {
    let app = apps.get(name).await.expect("App");
    let namespace = app.metadata.namespace.clone().unwrap_or_default();
    let events: Api<Event> = Api::namespaced(client.clone(), &namespace);
    let events = events.list(&ListParams::default()).await.expect("Events").items;
    format!(
        "{}\n{}",
        serde_json::to_string(&app.status).unwrap_or_default(),
        serde_json::to_string(&events).unwrap_or_default()
    )
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| l.strip_prefix("VmRSS:").map(|v| v.trim().trim_end_matches(" kB").to_string()))
        })
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

fn check(name: &str, query: &str) -> Value {
    json!({"name": name, "query": query, "max": 1e12})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_tenant_cannot_turn_analysis_against_the_platform_or_other_tenants() {
    support::prometheus::tool("prometheus");
    let client = admin_client().await;
    install_crds(&client).await;

    // Two tenants' traffic, in a real Prometheus: the operator's default.
    let exporter = Exporter::start().await;
    let prometheus = Prometheus::start(&[("exporter", exporter.addr())], &[]).await;
    let kubeconfig = operator_kubeconfig("hostile-analysis");
    let operator =
        Operator::start_with(&kubeconfig, &["--prometheus-url", &prometheus.url()], "hostile-analysis").await;
    let pid = operator.child.id().expect("operator pid");

    let secret = Hostile::start(Answer::Secret).await;
    let target = Hostile::start(Answer::Secret).await;
    let redirect = Hostile::start(Answer::Redirect(target.url.clone())).await;
    let endless = Hostile::start(Answer::Endless).await;
    let internal = Hostile::start(Answer::Secret).await;
    // The platform listed these three (say, endpoints that later misbehave); never `internal`.
    let listed = json!([{"url": secret.url}, {"url": redirect.url}, {"url": endless.url}]);
    let attacker = tenant(&client, "attacker", listed).await;
    let victim = tenant(&client, "victim", json!([])).await;
    let _cleanup = Cleanup(vec![attacker.clone(), victim.clone()]);
    exporter.set(&victim, "ledger", "1", Traffic::default());
    exporter.set(&attacker, "shop", "2", Traffic::default());

    // 1. A huge body: read up to 1 MiB, then dropped; the replica stays small.
    let rss_before = rss_kib(pid);
    let analysis = |url: &str| json!({"interval": "1s", "prometheusUrl": url, "metrics": [check("q", "up")]});
    let apps = rolling_app(&client, &attacker, "huge", analysis(&endless.url)).await;
    measured(&apps, "huge", MeasurementResult::Inconclusive, "larger than 1024 KiB").await;
    // A few more runs, each of them against the endless body.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let rss_after = rss_kib(pid);
    let sent = endless.sent.load(Ordering::SeqCst);
    let runs = endless.requests();
    eprintln!("endless body: {runs} requests, {} KiB sent in all, RSS {rss_before} -> {rss_after} KiB", sent / 1024);
    assert!(runs >= 3, "the endless server was asked {runs} times");
    // Each read stops at 1 MiB; what the socket buffers hold besides is a few MiB at most.
    assert!(sent / (runs as u64) < 8 * 1024 * 1024, "{sent} bytes sent over {runs} requests");
    assert!(rss_after < rss_before + 32 * 1024, "RSS grew from {rss_before} KiB to {rss_after} KiB");

    // 2. A server answering secrets: none of its text reaches status, conditions or Events.
    let apps = rolling_app(&client, &attacker, "leak", analysis(&secret.url)).await;
    let app = measured(
        &apps,
        "leak",
        MeasurementResult::Inconclusive,
        "not a Prometheus API response (HTTP 200, text/plain, 62 bytes)",
    )
    .await;
    assert_eq!(app.status.as_ref().and_then(|s| s.phase), Some(AppPhase::Paused), "inconclusive pauses the rollout");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let seen = what_the_tenant_reads(&client, &apps, "leak").await;
    assert!(!seen.contains("aws_secret") && !seen.contains("EXAMPLEKEY"), "the secret leaked: {seen}");

    // 3. A redirect is not followed: its target gets nothing, its body shows nowhere.
    let apps = rolling_app(&client, &attacker, "redirect", analysis(&redirect.url)).await;
    measured(&apps, "redirect", MeasurementResult::Inconclusive, "a redirect, which is not followed").await;
    assert!(redirect.requests() >= 1);
    assert_eq!(target.requests(), 0, "the redirect was followed");
    let seen = what_the_tenant_reads(&client, &apps, "redirect").await;
    assert!(!seen.contains("aws_secret"), "the redirect's body leaked: {seen}");

    // 4. An address the platform did not list is refused, and never fetched.
    let apps: Api<App> = Api::namespaced(client.clone(), &attacker);
    let app: App = serde_json::from_value(json!({
        "apiVersion": "flotilla.dev/v1beta1", "kind": "App", "metadata": {"name": "probe", "namespace": attacker},
        "spec": {"image": "registry.example.com/tests/probe", "version": "1", "replicas": 1,
                 "rollout": {"analysis": analysis(&internal.url)}},
    }))
    .expect("App");
    apps.create(&PostParams::default(), &app).await.expect("creating App");
    let refused = wait_for(Duration::from_secs(60), "App probe refused", || async {
        let app = apps.get("probe").await.ok()?;
        let ready = app.status.as_ref()?.conditions.iter().find(|c| c.type_ == "Ready")?.clone();
        (ready.reason == "PrometheusNotAllowed").then_some(ready)
    })
    .await;
    assert_eq!(refused.status, "False");
    assert!(refused.message.starts_with("spec.rollout.analysis.prometheusUrl: "), "{}", refused.message);
    assert!(refused.message.contains("nothing was fetched"), "{}", refused.message);
    // A rollout makes the analysis due: still nothing is fetched.
    apps.patch("probe", &PatchParams::default(), &Patch::Merge(json!({"spec": {"version": "2"}})))
        .await
        .expect("new version");
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(internal.requests(), 0, "the operator fetched an address the platform did not allow");

    // 5. On the shared Prometheus, queries read the App's own namespace only.
    let ledger = r#"sum(rate(http_requests_total{app="ledger"}[10s]))"#;
    prometheus.wait_for_value(ledger, Duration::from_secs(30)).await; // the victim's series are there
    prometheus.wait_for_value(r#"sum(rate(http_requests_total{app="shop"}[10s]))"#, Duration::from_secs(30)).await;
    let named = format!(r#"sum(rate(http_requests_total{{namespace="{victim}",app="ledger"}}[10s]))"#);
    let spy = |query: &str| json!({"interval": "1s", "metrics": [check("spy", query)]});
    let apps = rolling_app(&client, &attacker, "named", spy(&named)).await;
    let app = measured(&apps, "named", MeasurementResult::Inconclusive, "read only its own namespace").await;
    assert_eq!(app.status.as_ref().and_then(|s| s.phase), Some(AppPhase::Paused));
    let progressing = app.status.as_ref().and_then(|s| s.conditions.iter().find(|c| c.type_ == "Progressing").cloned());
    assert!(
        progressing.as_ref().is_some_and(|c| c.message.contains(&format!("namespace=\"{victim}\""))),
        "the condition says why: {progressing:?}"
    );
    let apps = rolling_app(&client, &attacker, "unnamed", spy(ledger)).await;
    measured(&apps, "unnamed", MeasurementResult::Inconclusive, "no series").await;
    // The same rewrite leaves the tenant its own series.
    let own = r#"sum(rate(http_requests_total{app="shop"}[10s]))"#;
    let apps = rolling_app(&client, &attacker, "shop", spy(own)).await;
    wait_for(Duration::from_secs(60), "App shop measured with its own series", || async {
        let m = apps.get("shop").await.ok()?.status?.analysis?.measurements.first()?.clone();
        (m.result == MeasurementResult::Pass && m.value.is_some_and(|v| v > 0.0)).then_some(())
    })
    .await;

    // 6. Queries that cost Prometheus more than any check needs are refused, naming the check,
    //    and never sent: no selector, a pinned time, a lookback past the bound. To an endpoint
    //    of their own, that the earlier Apps (still asking theirs every second) do not use.
    let costly = Hostile::start(Answer::Secret).await;
    let endpoints = json!([{"url": secret.url}, {"url": redirect.url}, {"url": endless.url}, {"url": costly.url}]);
    Api::<Tenant>::all(client.clone())
        .patch(&attacker, &PatchParams::default(), &Patch::Merge(json!({"spec": {"prometheusEndpoints": endpoints}})))
        .await
        .expect("listing the endpoint");
    for (name, query, why) in [
        ("selectorless", "count_over_time(vector(1)[1d:1ms])", "selects no series"),
        ("pinned", "up @ 1609746000", "pinned to a time with @"),
        ("history", "rate(up[1d])", "more than the 3600s a check may look back"),
    ] {
        let analysis = json!({"interval": "1s", "prometheusUrl": costly.url, "metrics": [check("costly", query)]});
        let apps = rolling_app(&client, &attacker, name, analysis).await;
        let app = measured(&apps, name, MeasurementResult::Invalid, why).await;
        let m = app.status.as_ref().and_then(|s| s.analysis.as_ref()).and_then(|a| a.measurements.first().cloned());
        assert!(m.as_ref().and_then(|m| m.message.as_deref()).is_some_and(|t| t.contains("check costly")), "{m:?}");
        assert_ne!(app.status.as_ref().and_then(|s| s.phase), Some(AppPhase::Healthy), "never promoted");
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(costly.requests(), 0, "{name}: the query was sent");
    }

    // 7. An App measured every second, passing, held at a step: its runs decide nothing new,
    //    so its status is written at most once per 30 s, not once per run.
    let apps = rolling_app(&client, &attacker, "chatty", spy(own)).await;
    wait_for(Duration::from_secs(60), "App chatty measured", || async {
        let m = apps.get("chatty").await.ok()?.status?.analysis?.measurements.first()?.clone();
        (m.result == MeasurementResult::Pass).then_some(())
    })
    .await;
    let writes = || {
        support::audit_events_in(&attacker)
            .iter()
            .filter(|e| {
                let uri = e["requestURI"].as_str().unwrap_or_default();
                let verb = e["verb"].as_str().unwrap_or_default();
                uri.contains("/apps/chatty/status") && matches!(verb, "patch" | "update")
            })
            .count()
    };
    let (first, started) = (writes(), std::time::Instant::now());
    tokio::time::sleep(Duration::from_secs(45)).await;
    let written = writes() - first;
    let runs = apps.get("chatty").await.expect("App").status.and_then(|s| s.analysis).map(|a| a.failures);
    eprintln!("chatty: {written} status writes in {:?} of runs every second (failures {runs:?})", started.elapsed());
    // One per 30 s, and one more for a run that lands on the edge: 40 or so before.
    assert!(written <= 3, "{written} status writes in 45 s of an analysis every second");
    drop(operator);
}
