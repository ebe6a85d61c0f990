//! Chaos, end to end: 3 replicas under the operator's real ServiceAccount serve 100 Apps in
//! 20 namespaces of one Tenant while a fault hits a random replica every few seconds
//! (kill -9 then restart, SIGSTOP past the lease then SIGCONT, SIGTERM then restart), App
//! versions keep changing and about a quarter of them fail their canary analysis (a real
//! Prometheus scraping an exporter that serves 50% errors for those versions).
//!
//! What is asserted comes from outside the replicas: the apiserver's audit log (ownership of
//! each shard from its Lease writes, see tests/support/audit.rs) proves that no replica wrote
//! into a namespace while another held its shard or after its own hold lapsed; the Apps and
//! Deployments, watched throughout, prove that no version that failed its analysis was ever
//! promoted; and every App ends at its last version, or rolled back from it if that version
//! is a failing one.
//!
//! `bench/chaos.sh` runs the same test longer and bigger: FLOTILLA_CHAOS_SECONDS,
//! FLOTILLA_CHAOS_APPS, FLOTILLA_CHAOS_FAULT_EVERY and FLOTILLA_CHAOS_SEED set the run.

mod support;

#[path = "support/audit.rs"]
mod audit;

use flotilla::api::{App, AppPhase, RolloutResult};
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::prometheus::{Exporter, Prometheus, Traffic};
use support::rollout::image_of;
use support::stall_proxy::{StallProxy, kubeconfig_via, upstream_of};
use support::{Operator, admin_client, audit_log, install_crds, operator_kubeconfig, unique, wait_for};

const OPERATOR_NS: &str = "flotilla-system";
const SHARDS: u32 = 32;
/// The replicas' lease duration (the operator's default); a paused replica stays paused
/// longer than this, so that its shards are taken while it sleeps.
const LEASE: Duration = Duration::from_secs(6);
const APPS_PER_NAMESPACE: usize = 5;
const IMAGE: &str = "registry.example.com/chaos";

/// Error ratio of one App version over the last 10 s (the same query as tests/rollouts.rs).
const ERROR_RATE: &str = r#"sum(rate(http_requests_total{namespace="{{namespace}}",app="{{app}}",version="{{version}}",code="500"}[10s])) / sum(rate(http_requests_total{namespace="{{namespace}}",app="{{app}}",version="{{version}}"}[10s]))"#;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The run's size and pace.
#[derive(Debug, Clone, Copy)]
struct Params {
    apps: usize,
    chaos: Duration,
    fault_every: Duration,
    seed: u64,
}

impl Params {
    fn from_env() -> Self {
        let seed = std::env::var("FLOTILLA_CHAOS_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1)
        });
        Self {
            apps: env_or("FLOTILLA_CHAOS_APPS", 100usize).max(APPS_PER_NAMESPACE),
            chaos: Duration::from_secs(env_or("FLOTILLA_CHAOS_SECONDS", 90u64)),
            fault_every: Duration::from_secs(env_or("FLOTILLA_CHAOS_FAULT_EVERY", 3u64)),
            seed,
        }
    }

    fn namespaces(&self) -> usize {
        self.apps.div_ceil(APPS_PER_NAMESPACE)
    }
}

/// splitmix64: the run is reproducible from the seed it prints.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    /// True with probability `p`.
    fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
}

/// Share of versions whose canary serves 50% errors and must be rolled back.
const BAD_SHARE: f64 = 0.25;

/// (namespace, app)
type Key = (String, String);

/// The versions each App was given, in order, and whether each fails its analysis; shared
/// by the version changer and the watchers.
#[derive(Default)]
struct Versions {
    given: BTreeMap<Key, Vec<(u32, bool)>>,
    /// The next version of each App, its traffic already served so that Prometheus has data
    /// for it when its canary is measured.
    next: BTreeMap<Key, (u32, bool)>,
}

impl Versions {
    fn is_bad(&self, key: &Key, version: &str) -> bool {
        let Ok(v) = version.parse::<u32>() else { return false };
        self.given.get(key).is_some_and(|g| g.iter().any(|(n, bad)| *n == v && *bad))
    }
}

type Shared = Arc<Mutex<Versions>>;

fn lock(v: &Shared) -> std::sync::MutexGuard<'_, Versions> {
    v.lock().unwrap_or_else(|p| p.into_inner())
}

fn traffic(bad: bool) -> Traffic {
    Traffic { requests_per_scrape: 100.0, error_ratio: if bad { 0.5 } else { 0.0 }, latency_seconds: 0.01 }
}

/// Picks the version after `current` and starts serving its traffic.
fn prepare_next(exporter: &Exporter, versions: &Shared, key: &Key, current: u32, rng: &mut Rng) {
    let bad = rng.chance(BAD_SHARE);
    exporter.set(&key.0, &key.1, &(current + 1).to_string(), traffic(bad));
    lock(versions).next.insert(key.clone(), (current + 1, bad));
}

/// Moves random Apps to their prepared next version, all along the chaos.
struct Changer {
    client: Client,
    exporter: Exporter,
    versions: Shared,
    keys: Vec<Key>,
    /// Apps changed per round.
    per_round: usize,
    /// Time between rounds.
    every: Duration,
    rng: Rng,
}

/// Runs `changer` until `stop`; returns the number of changes made.
async fn change_versions(changer: Changer, stop: tokio::sync::watch::Receiver<bool>) -> usize {
    let Changer { client, exporter, versions, keys, per_round, every, mut rng } = changer;
    let mut changes = 0;
    while !*stop.borrow() {
        for _ in 0..per_round {
            let key = &keys[rng.below(keys.len())];
            let Some((version, bad)) = lock(&versions).next.get(key).copied() else { continue };
            lock(&versions).given.entry(key.clone()).or_default().push((version, bad));
            let apps: Api<App> = Api::namespaced(client.clone(), &key.0);
            let patch = json!({"spec": {"version": version.to_string()}});
            match apps.patch(&key.1, &PatchParams::default(), &Patch::Merge(patch)).await {
                Ok(_) => {
                    changes += 1;
                    prepare_next(&exporter, &versions, key, version, &mut rng);
                }
                Err(e) => {
                    // Not given after all: it stays the next version.
                    if let Some(g) = lock(&versions).given.get_mut(key) {
                        g.pop();
                    }
                    eprintln!("could not change {}/{}: {e}", key.0, key.1);
                }
            }
        }
        tokio::time::sleep(every).await;
    }
    changes
}

/// Everything seen that promoted a failing version: an App whose current version, or whose
/// history, says a failing version was promoted, or a stable Deployment running one.
#[derive(Default)]
struct Promotions(BTreeSet<String>);

async fn watch_apps(client: Client, versions: Shared, seen: Arc<Mutex<Promotions>>) {
    let apps: Api<App> = Api::all(client);
    let stream = watcher(apps, watcher::Config::default()).default_backoff().applied_objects();
    let _ = stream
        .try_for_each(|app| {
            let key =
                (app.metadata.namespace.clone().unwrap_or_default(), app.metadata.name.clone().unwrap_or_default());
            if let Some(s) = &app.status {
                let v = lock(&versions);
                let mut found = Vec::new();
                if let Some(cur) = s.current_version.as_deref().filter(|c| v.is_bad(&key, c)) {
                    found.push(format!("{}/{}: status.currentVersion {cur} (fails its analysis)", key.0, key.1));
                }
                for h in s.history.iter().filter(|h| h.result == RolloutResult::Promoted && v.is_bad(&key, &h.version))
                {
                    found.push(format!(
                        "{}/{}: history says {} was promoted (fails its analysis)",
                        key.0, key.1, h.version
                    ));
                }
                drop(v);
                seen.lock().unwrap_or_else(|p| p.into_inner()).0.extend(found);
            }
            async { Ok::<(), watcher::Error>(()) }
        })
        .await;
}

async fn watch_deployments(client: Client, versions: Shared, seen: Arc<Mutex<Promotions>>) {
    let deployments: Api<Deployment> = Api::all(client);
    let stream = watcher(deployments, watcher::Config::default()).default_backoff().applied_objects();
    let _ = stream
        .try_for_each(|d| {
            let ns = d.metadata.namespace.clone().unwrap_or_default();
            let name = d.metadata.name.clone().unwrap_or_default();
            if !name.ends_with("-canary") {
                let image = image_of(&d);
                let key = (ns.clone(), name.clone());
                if let Some(tag) = image.rsplit_once(':').map(|(_, t)| t.to_string())
                    && lock(&versions).is_bad(&key, &tag)
                {
                    seen.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .0
                        .insert(format!("{ns}/{name}: the stable Deployment runs {tag} (fails its analysis)"));
                }
            }
            async { Ok::<(), watcher::Error>(()) }
        })
        .await;
}

/// Why an App is not (yet) where it must end: `None` when it is.
fn unsettled(
    app: &App,
    stable: Option<&Deployment>,
    canary: bool,
    last: (u32, bool),
    good: &BTreeSet<u32>,
) -> Option<String> {
    let s = app.status.as_ref()?;
    let name = format!(
        "{}/{}",
        app.metadata.namespace.as_deref().unwrap_or_default(),
        app.metadata.name.as_deref().unwrap_or_default()
    );
    let (version, bad) = (last.0.to_string(), last.1);
    let current = s.current_version.clone().unwrap_or_default();
    let observed = s.observed_generation == app.metadata.generation;
    let stable_tag = stable.map(image_of).and_then(|i| i.rsplit_once(':').map(|(_, t)| t.to_string()));
    let ok = if bad {
        s.phase == Some(AppPhase::RolledBack)
            && s.failed_version.as_ref().is_some_and(|f| f.version == version)
            && current.parse::<u32>().is_ok_and(|c| good.contains(&c))
    } else {
        s.phase == Some(AppPhase::Healthy) && current == version
    };
    let settled = ok && observed && !canary && stable_tag.as_deref() == Some(current.as_str());
    (!settled).then(|| {
        format!(
            "{name}: wants {version}{}, has phase {:?} current {current} failed {:?} stable {stable_tag:?} canary {canary} observed {observed}",
            if bad { " rolled back" } else { "" },
            s.phase,
            s.failed_version.as_ref().map(|f| f.version.clone())
        )
    })
}

/// Apps not where they must end, with why.
async fn pending(client: &Client, prefix: &str, versions: &Shared) -> Vec<String> {
    let Ok(apps) = Api::<App>::all(client.clone()).list(&ListParams::default()).await else {
        return vec!["could not list Apps".into()];
    };
    let Ok(deployments) = Api::<Deployment>::all(client.clone()).list(&ListParams::default()).await else {
        return vec!["could not list Deployments".into()];
    };
    let by_name: BTreeMap<(String, String), &Deployment> = deployments
        .items
        .iter()
        .map(|d| ((d.metadata.namespace.clone().unwrap_or_default(), d.metadata.name.clone().unwrap_or_default()), d))
        .collect();
    let v = lock(versions);
    let mut out = Vec::new();
    for app in apps.items.iter().filter(|a| a.metadata.namespace.as_deref().is_some_and(|n| n.starts_with(prefix))) {
        let key = (app.metadata.namespace.clone().unwrap_or_default(), app.metadata.name.clone().unwrap_or_default());
        let given = v.given.get(&key).cloned().unwrap_or_default();
        let last = given.last().copied().unwrap_or((1, false));
        let good: BTreeSet<u32> = given.iter().filter(|(_, bad)| !bad).map(|(n, _)| *n).chain([1]).collect();
        let canary = by_name.contains_key(&(key.0.clone(), format!("{}-canary", key.1)));
        let why = match app.status {
            None => Some(format!("{}/{}: no status", key.0, key.1)),
            Some(_) => unsettled(app, by_name.get(&key).copied(), canary, last, &good),
        };
        out.extend(why);
    }
    out
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    /// kill -9, then a new replica in its place.
    Kill,
    /// SIGSTOP for longer than the lease, then SIGCONT: it wakes up with stale work.
    Pause,
    /// SIGTERM (graceful handoff), then a new replica in its place.
    Term,
    /// Everything the replica sends (its Lease renewals too) held back by the TCP proxy in
    /// front of it for longer than the lease, answers and watch events still flowing; then
    /// what waited is sent. Writes that left before its fence closed arrive after a peer took
    /// the shard: they must not win.
    Stall,
}

const FAULTS: [Fault; 4] = [Fault::Kill, Fault::Pause, Fault::Term, Fault::Stall];

/// One of the three replica positions; each restart is a new replica id, so the audit log
/// tells the incarnations apart.
struct Slot {
    letter: char,
    incarnation: u32,
    op: Operator,
    /// Between this replica and the apiserver, for all of its requests.
    proxy: StallProxy,
}

impl Slot {
    fn id(letter: char, incarnation: u32) -> String {
        format!("chaos-{letter}-{incarnation}")
    }

    /// A replica with a token bound to a Pod of its own id (each incarnation is a new Pod,
    /// as a restarted replica is in a cluster), so that the apiserver's shard fence knows it.
    async fn start(args: &[&str], letter: char, incarnation: u32) -> Self {
        let id = Self::id(letter, incarnation);
        let kubeconfig = operator_kubeconfig(&id);
        let proxy = StallProxy::start(upstream_of(&kubeconfig)).await;
        let op = Operator::start_with(&kubeconfig_via(&kubeconfig, &proxy, &id), args, &id).await;
        Self { letter, incarnation, op, proxy }
    }

    fn signal(&self, sig: &str) {
        if let Some(pid) = self.op.child.id() {
            let _ = std::process::Command::new("kill").args([sig, &pid.to_string()]).status();
        }
    }

    async fn restart(&mut self, args: &[&str]) {
        *self = Self::start(args, self.letter, self.incarnation + 1).await;
    }
}

/// Injects one fault; returns whether a SIGTERMed replica failed to exit within 20 s.
async fn inject(fault: Fault, slot: &mut Slot, args: &[&str]) -> bool {
    match fault {
        Fault::Kill => {
            let _ = slot.op.child.start_kill();
            let _ = slot.op.child.wait().await;
            slot.restart(args).await;
            false
        }
        Fault::Pause => {
            slot.signal("-STOP");
            tokio::time::sleep(LEASE + Duration::from_secs(2)).await;
            slot.signal("-CONT");
            false
        }
        Fault::Stall => {
            slot.proxy.stall();
            tokio::time::sleep(LEASE + Duration::from_secs(4)).await;
            slot.proxy.resume();
            false
        }
        Fault::Term => {
            slot.signal("-TERM");
            let exited = tokio::time::timeout(Duration::from_secs(20), slot.op.child.wait()).await;
            let hung = !matches!(exited, Ok(Ok(s)) if s.success());
            if hung {
                // What it was doing: the end of its log.
                let id = Slot::id(slot.letter, slot.incarnation);
                let log = std::env::temp_dir().join(format!("flotilla-e2e-{id}.log"));
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(40).collect();
                eprintln!(
                    "{id} did not exit cleanly within 20 s of SIGTERM ({exited:?}); the end of {}:",
                    log.display()
                );
                for line in tail.iter().rev() {
                    eprintln!("  {line}");
                }
                let _ = slot.op.child.start_kill();
                let _ = slot.op.child.wait().await;
            }
            slot.restart(args).await;
            hung
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_chaos_one_writer_per_namespace_and_no_failed_version_promoted() {
    support::use_private_cluster("flotilla-test-chaos");
    let params = Params::from_env();
    println!("chaos run: {params:?} (FLOTILLA_CHAOS_SEED={} reproduces the choices)", params.seed);
    let mut rng = Rng(params.seed);
    let started = k8s_openapi::jiff::Timestamp::now().as_microsecond();
    let client = admin_client().await;
    install_crds(&client).await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), OPERATOR_NS);
    let _ =
        leases.delete_collection(&DeleteParams::default(), &ListParams::default().labels("flotilla.dev/lease")).await;

    let exporter = Exporter::start().await;
    let prometheus = Prometheus::start(&[("exporter", exporter.addr())], &[]).await;
    let prom_url = prometheus.url();
    let args = ["--shards", "32", "--prometheus-url", prom_url.as_str()];
    let mut slots = Vec::new();
    for letter in ['a', 'b', 'c'] {
        slots.push(Slot::start(&args, letter, 0).await);
    }

    // One Tenant onboards every namespace.
    let prefix = unique("chaos");
    let namespaces: Vec<String> = (0..params.namespaces()).map(|i| format!("{prefix}-{i}")).collect();
    support::onboard(&client, &prefix, &namespaces).await;

    // Apps at version 1, each with a canary gated on its error rate (measured every 2 s, two
    // failures roll back).
    let versions: Shared = Arc::default();
    let keys: Vec<Key> = (0..params.apps)
        .map(|i| (namespaces[i % namespaces.len()].clone(), format!("app-{}", i / namespaces.len())))
        .collect();
    for key in &keys {
        exporter.set(&key.0, &key.1, "1", traffic(false));
        lock(&versions).given.insert(key.clone(), vec![(1, false)]);
        prepare_next(&exporter, &versions, key, 1, &mut rng);
    }
    stream::iter(keys.iter().cloned())
        .for_each_concurrent(8, |(ns, name)| {
            let client = client.clone();
            async move {
                let app: App = serde_json::from_value(json!({
                    "apiVersion": "flotilla.dev/v1beta1", "kind": "App",
                    "metadata": {"name": name, "namespace": ns},
                    "spec": {
                        "image": format!("{IMAGE}/{name}"), "version": "1", "replicas": 2,
                        "rollout": {
                            "strategy": {"type": "Canary", "canary": {"steps": [{"weight": 50}]}},
                            "analysis": {"interval": "2s", "failureLimit": 2, "metrics": [
                                {"name": "error-rate", "query": ERROR_RATE, "max": 0.05}]},
                        },
                    },
                }))
                .expect("App");
                Api::<App>::namespaced(client, &ns).create(&PostParams::default(), &app).await.expect("creating App");
            }
        })
        .await;
    let created = Instant::now();
    wait_for(Duration::from_secs(240.max(params.apps as u64)), "every App Healthy at version 1", || async {
        pending(&client, &prefix, &versions).await.is_empty().then_some(())
    })
    .await;
    println!("{} Apps in {} namespaces Healthy at 1 after {:?}", params.apps, namespaces.len(), created.elapsed());

    let promotions: Arc<Mutex<Promotions>> = Arc::default();
    let app_watch = tokio::spawn(watch_apps(client.clone(), versions.clone(), promotions.clone()));
    let deployment_watch = tokio::spawn(watch_deployments(client.clone(), versions.clone(), promotions.clone()));

    // Versions change all along: about one change per App every 20 s.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let changer = Changer {
        client: client.clone(),
        exporter: exporter.clone(),
        versions: versions.clone(),
        keys: keys.clone(),
        per_round: (params.apps / 20).max(1),
        every: Duration::from_secs(1),
        rng: Rng(params.seed ^ 0x5eed),
    };
    let changer = tokio::spawn(change_versions(changer, stop_rx));

    // A fault every few seconds on a random replica, one at a time.
    let chaos_started = Instant::now();
    let mut faults: BTreeMap<Fault, usize> = BTreeMap::new();
    let mut hung_on_term = 0;
    while chaos_started.elapsed() < params.chaos {
        let fault = FAULTS[rng.below(FAULTS.len())];
        let slot = rng.below(slots.len());
        let before = Slot::id(slots[slot].letter, slots[slot].incarnation);
        hung_on_term += usize::from(inject(fault, &mut slots[slot], &args).await);
        *faults.entry(fault).or_default() += 1;
        println!("{:>5.1}s {fault:?} on {before}", chaos_started.elapsed().as_secs_f64());
        tokio::time::sleep(params.fault_every).await;
    }
    let last_fault = Instant::now();
    let _ = stop_tx.send(true);
    let changes = changer.await.unwrap_or(0);

    // Every App ends at its last version, or rolled back from it.
    let converge_bound = Duration::from_secs(env_or("FLOTILLA_CHAOS_CONVERGE_SECONDS", 180u64));
    let mut left = pending(&client, &prefix, &versions).await;
    let mut reported = Instant::now();
    while !left.is_empty() && last_fault.elapsed() < converge_bound {
        tokio::time::sleep(Duration::from_secs(1)).await;
        left = pending(&client, &prefix, &versions).await;
        if reported.elapsed() >= Duration::from_secs(15) {
            reported = Instant::now();
            println!(
                "{:>5.1}s after the last fault, {} Apps not settled, e.g. {:?}",
                last_fault.elapsed().as_secs_f64(),
                left.len(),
                left.first()
            );
        }
    }
    let converged = last_fault.elapsed();
    // Let the watchers see the final state, then read the audit log.
    tokio::time::sleep(Duration::from_secs(2)).await;
    app_watch.abort();
    deployment_watch.abort();

    let parsed = audit::read(&audit_log(), started, OPERATOR_NS, |ns| flotilla::sharding::shard_of(ns, SHARDS))
        .unwrap_or_else(|e| panic!("{e}"));
    let findings = audit::check(&parsed.leases, &parsed.writes);
    let promoted: Vec<String> = promotions.lock().unwrap_or_else(|p| p.into_inner()).0.iter().cloned().collect();
    let bad_given = lock(&versions).given.values().flatten().filter(|(v, bad)| *v > 1 && *bad).count();
    let fault_total: usize = faults.values().sum();

    println!(
        "chaos figures: apps={} namespaces={} chaos={}s faults={fault_total} {faults:?} version_changes={changes} \
         failing_versions_given={bad_given} lease_writes={} ownership_intervals={} writes_checked={} writes_refused={} \
         stale_writes_refused={} refused_by_shard_fence={} violations={} (overlap={} stale={}) failed_versions_promoted={} \
         unsettled_apps={} converged_after_last_fault={:.1}s sigterm_hangs={hung_on_term} seed={}",
        params.apps,
        namespaces.len(),
        params.chaos.as_secs(),
        findings.lease_writes,
        findings.intervals,
        findings.writes_checked,
        findings.writes_refused,
        findings.stale_refused,
        findings.forbidden,
        findings.violating_writes(),
        findings.count(audit::Kind::Overlap),
        findings.count(audit::Kind::Stale),
        promoted.len(),
        left.len(),
        converged.as_secs_f64(),
        params.seed,
    );
    println!("unfenced writes left out of the check: {:?}", parsed.ignored);
    let mut by_resource: BTreeMap<(audit::Kind, String), usize> = BTreeMap::new();
    for v in &findings.violations {
        *by_resource.entry((v.kind, v.write.resource.clone())).or_default() += 1;
    }
    println!("violations by kind and resource: {by_resource:?}");
    for v in findings.violations.iter().take(10) {
        println!("  {v:?}");
    }
    for p in promoted.iter().take(10) {
        println!("  promoted: {p}");
    }
    for l in left.iter().take(10) {
        println!("  unsettled: {l}");
    }

    assert!(findings.writes_checked > 0, "no namespace write by a replica in the audit log: nothing was checked");
    assert!(fault_total > 0, "no fault was injected");
    assert_eq!(
        findings.violating_writes(),
        0,
        "writes outside the writer's ownership (first: {:?})",
        findings.violations.first()
    );
    assert!(promoted.is_empty(), "failing versions promoted: {promoted:?}");
    assert!(
        left.is_empty(),
        "{} Apps not at their last version {converge_bound:?} after the last fault: {left:?}",
        left.len()
    );
    assert_eq!(hung_on_term, 0, "replicas that did not exit within 20 s of SIGTERM");

    for slot in &mut slots {
        let _ = slot.op.child.start_kill();
    }
    drop(slots);
    drop(prometheus);
    support::cluster_script(&["down"]);
}
