//! Taking one analysis run for an App: choose the Prometheus the platform allows it, render
//! every check's query and limit it to the App's namespace on a shared Prometheus, run them
//! (concurrently, each with a timeout) and judge the answers.
//!
//! Runs take turns (`turns`): at most `AnalysisLimits::per_tenant` runs of one tenant and
//! `AnalysisLimits::per_replica` runs in all are in flight at once, and a turn that comes free
//! goes to the waiting tenant that has used the fewest turn-seconds lately, so a tenant whose
//! Prometheus hangs holds only its own turns and never gets ahead of one whose Prometheus
//! answers (the reconciler releases its reconcile slot while it waits here, see
//! `app::reconcile`).

use futures::future::join_all;

use super::analysis::{QueryOutcome, TemplateValues, judge, render};
use super::endpoints::{Endpoint, Refusal, choose};
use super::prometheus::{Asked, ClientError, PrometheusClient, shown};
use super::query_cost::{self, QueryBounds};
use super::resting::Resting;
use super::scope::{ScopeError, scope_to_namespace};
use super::turns::{Busy, Turns};
use crate::api::{App, Measurement, MeasurementResult, TenantPrometheus};
use crate::telemetry::Metrics;

/// How long a run waits for a turn before it is inconclusive. Only runs whose Prometheus
/// hangs hold a turn long, and each ends within `QUERY_TIMEOUT`: a tenant that used turns
/// less than the hanging ones gets the first that comes free, so twice that is a full round
/// to spare. It also bounds how long a reconcile waits here holding one of its namespace's
/// few turns (`app::controller::controller_config`).
pub const TURN_WAIT: std::time::Duration =
    std::time::Duration::from_secs(2 * super::prometheus::QUERY_TIMEOUT.as_secs());

/// What analysis may cost: how many runs may be in flight at once, how often an App's
/// checks may run, and what one query may ask of Prometheus.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AnalysisLimits {
    pub per_replica: usize,
    pub per_tenant: usize,
    /// The shortest interval between an App's runs, whatever its spec asks (`--analysis-min-interval`).
    pub min_interval: std::time::Duration,
    /// The bounds on each query (`--analysis-max-lookback`).
    pub query: QueryBounds,
}

/// Queries of one run in flight at once: a run of 20 checks sends them 4 at a time, so one
/// tenant has at most `per_tenant` x 4 queries in flight on a replica.
pub const QUERIES_PER_RUN: usize = 4;

/// The default of `--analysis-min-interval`.
pub const DEFAULT_MIN_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

impl Default for AnalysisLimits {
    fn default() -> Self {
        Self { per_replica: 32, per_tenant: 8, min_interval: DEFAULT_MIN_INTERVAL, query: QueryBounds::default() }
    }
}

/// The operator's way to measure: one HTTP client, the Prometheus used when an App names
/// none, and the turns runs take.
#[derive(Clone, Debug)]
pub struct Analyzer {
    client: PrometheusClient,
    default_url: Option<String>,
    turns: Turns,
    resting: Resting,
    /// How long a run waits for its turns (`TURN_WAIT`; shorter in tests).
    turn_wait: std::time::Duration,
    limits: AnalysisLimits,
}

/// Who asks: the tenant whose turns a run takes, and the endpoints its Tenant lists.
#[derive(Clone, Copy, Debug, Default)]
pub struct Asker<'a> {
    /// The tenant's name (or, without tenancy, the namespace).
    pub key: &'a str,
    pub endpoints: &'a [TenantPrometheus],
}

/// One run: a measurement per check, and the refusal when the App may not use the
/// Prometheus it names (then nothing was fetched).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Run {
    pub measurements: Vec<Measurement>,
    pub refusal: Option<Refusal>,
}

impl Analyzer {
    pub fn new(default_url: Option<String>, limits: AnalysisLimits) -> Result<Self, ClientError> {
        Ok(Self {
            client: PrometheusClient::new()?,
            default_url: default_url.filter(|u| !u.trim().is_empty()),
            turns: Turns::new(limits.per_replica, limits.per_tenant),
            resting: Resting::default(),
            turn_wait: TURN_WAIT,
            limits,
        })
    }

    /// The shortest interval between an App's runs.
    pub fn min_interval(&self) -> std::time::Duration {
        self.limits.min_interval
    }

    /// Why `app` may not use the Prometheus it names (`None` when it may, or has no analysis).
    pub fn refusal(&self, app: &App, endpoints: &[TenantPrometheus]) -> Option<Refusal> {
        let analysis = app.spec.analysis()?;
        choose(analysis.prometheus_url.as_deref(), self.default_url.as_deref(), endpoints).err()
    }

    /// Runs every check of `app` once. Never fails: what cannot be measured is an
    /// inconclusive (or invalid) measurement, which never lets a rollout advance.
    #[tracing::instrument(skip_all, fields(namespace = app.metadata.namespace.as_deref().unwrap_or_default(), app = app.metadata.name.as_deref().unwrap_or_default()))]
    pub async fn measure(&self, app: &App, stable_version: &str, asker: Asker<'_>, metrics: &Metrics) -> Run {
        let Some(analysis) = app.spec.analysis() else {
            return Run::default();
        };
        let namespace = app.metadata.namespace.as_deref().unwrap_or_default();
        let endpoint = choose(analysis.prometheus_url.as_deref(), self.default_url.as_deref(), asker.endpoints);
        let values = TemplateValues {
            app: app.metadata.name.as_deref().unwrap_or_default(),
            namespace,
            version: &app.spec.version,
            stable_version,
        };
        // Each check's query as it will be sent, or the outcome it has without asking.
        let prepared: Vec<Result<String, QueryOutcome>> = analysis
            .metrics
            .iter()
            .map(|check| {
                let query = render(&check.query, &values);
                // What a query may cost is judged before anything else, whichever Prometheus
                // it is for: nothing that costs more is sent.
                if let Err(e) = query_cost::check(&query, &self.limits.query) {
                    return Err(QueryOutcome::Invalid(format!("check {}: {e}", check.name)));
                }
                match &endpoint {
                    Err(refusal) => Err(QueryOutcome::Invalid(refusal.to_string())),
                    Ok(Endpoint { scoped: false, .. }) => Ok(query),
                    Ok(Endpoint { scoped: true, .. }) => scope_to_namespace(&query, namespace).map_err(|e| match e {
                        ScopeError::ForeignNamespace { .. } => QueryOutcome::Inconclusive(e.to_string()),
                        ScopeError::Parse { .. } | ScopeError::Unscoped { .. } => QueryOutcome::Invalid(e.to_string()),
                    }),
                }
            })
            .collect();
        // A dedicated endpoint at rest for this tenant (a query of it timed out
        // lately) is not asked, and no turn is taken or kept for it.
        let at_rest = |ep: &Endpoint| {
            (!ep.scoped && self.resting.rests(asker.key, &ep.url)).then(|| {
                format!(
                    "a query of this tenant to Prometheus at {} timed out lately (no connection within {:?} or no answer within {:?}): it is not asked again for {:?}",
                    shown(&ep.url),
                    self.client.connect_timeout(),
                    self.client.timeout(),
                    self.resting.duration()
                )
            })
        };
        let (_turn, no_turn) = match (&endpoint, prepared.iter().any(Result::is_ok)) {
            (Ok(ep), true) => match at_rest(ep) {
                Some(why) => (None, Some(why)),
                None => match self.turns.take(asker.key, tokio::time::Instant::now() + self.turn_wait).await {
                    // It may have come to rest while this run waited.
                    Ok(turn) => match at_rest(ep) {
                        Some(why) => (None, Some(why)),
                        None => (Some(turn), None),
                    },
                    // No turn within `turn_wait`: the runs in flight hang (queries end within
                    // their timeout). Nothing is asked then, and the reconcile goes on instead of
                    // waiting, holding one of its namespace's few turns
                    // (`app::controller::controller_config`).
                    Err(busy) => {
                        let whose = match busy {
                            Busy::Tenant => "this tenant's own runs in flight hold all its turns",
                            Busy::Replica => "the replica's runs in flight, of every tenant, hold all its turns",
                        };
                        // Debug only: tenants can make many such runs, and the App's status says it.
                        tracing::debug!(tenant = asker.key, ?busy, "an analysis run got no turn: inconclusive");
                        (
                            None,
                            Some(format!("no analysis run could start within {}s: {whose}", self.turn_wait.as_secs())),
                        )
                    }
                },
            },
            _ => (None, None),
        };
        // Without a turn, each query's outcome is known without asking, as a refusal's is.
        let prepared = prepared.into_iter().map(|p| match (&no_turn, p) {
            (Some(why), Ok(_)) => Err(QueryOutcome::Inconclusive(why.clone())),
            (_, p) => p,
        });
        // A check not asked by then (its run's queries go `QUERIES_PER_RUN` at a time) is
        // inconclusive: a run of checks that all hang holds its turn for two query timeouts.
        let deadline = tokio::time::Instant::now() + 2 * self.client.timeout();
        let in_flight = tokio::sync::Semaphore::new(QUERIES_PER_RUN);
        let runs = analysis.metrics.iter().zip(prepared).map(|(check, prepared)| {
            let endpoint = endpoint.as_ref().ok();
            let in_flight = &in_flight;
            async move {
                // Never closed: an error would only mean no bound, so it goes on without one.
                let _permit = match &prepared {
                    Ok(_) => in_flight.acquire().await.ok(),
                    Err(_) => None,
                };
                let late = tokio::time::Instant::now() >= deadline;
                let asked = match (prepared, endpoint) {
                    (Ok(_), Some(_)) if late => Asked {
                        outcome: QueryOutcome::Inconclusive(format!(
                            "not asked: the run's other checks took its {}s",
                            2 * self.client.timeout().as_secs()
                        )),
                        timed_out: false,
                    },
                    (Ok(query), Some(endpoint)) => self.client.ask(&endpoint.url, &query).await,
                    (Err(outcome), _) => Asked { outcome, timed_out: false },
                    (Ok(_), None) => {
                        Asked { outcome: QueryOutcome::Invalid("no Prometheus to ask".into()), timed_out: false }
                    }
                };
                (judge(check, &asked.outcome), asked.timed_out)
            }
        });
        let (measurements, timed_out): (Vec<Measurement>, Vec<bool>) = join_all(runs).await.into_iter().unzip();
        // Only a dedicated endpoint rests: on a shared one, another tenant's load could make
        // this tenant's queries slow, and a rest would lengthen that into 30 s for each.
        if let (Ok(ep @ Endpoint { scoped: false, .. }), true) = (&endpoint, timed_out.contains(&true)) {
            tracing::debug!(tenant = asker.key, endpoint = %shown(&ep.url), "a query timed out: the endpoint rests");
            self.resting.rest(asker.key, &ep.url);
        }
        for m in &measurements {
            metrics.measured(match m.result {
                MeasurementResult::Pass => "pass",
                MeasurementResult::Fail => "fail",
                MeasurementResult::Inconclusive => "inconclusive",
                MeasurementResult::Invalid => "invalid",
            });
        }
        Run { measurements, refusal: endpoint.err() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    /// A turn of `tenant`, taken at once or never.
    async fn turn(a: &Analyzer, tenant: &str) -> Option<crate::rollout::turns::Turn> {
        a.turns.take(tenant, tokio::time::Instant::now() + Duration::from_millis(100)).await.ok()
    }

    /// An App with two checks, both passing at 0.01.
    fn checked() -> App {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "flotilla.dev/v1beta1", "kind": "App",
            "metadata": {"name": "checkout", "namespace": "shop"},
            "spec": {"image": "registry.example.com/shop/checkout", "version": "1.5.0", "replicas": 1,
                     "rollout": {"analysis": {"metrics": [
                         {"name": "errors", "query": "sum(rate(errors[1m]))", "max": 0.05},
                         {"name": "latency", "query": "max(latency)", "max": 0.5}]}}}
        }))
        .expect("an App")
    }

    /// A Prometheus that answers 0.01 to every query, and the count of queries it got.
    async fn prometheus() -> (String, Arc<std::sync::atomic::AtomicUsize>) {
        let body = r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1700000000,"0.01"]}]}}"#;
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let (url, asked, _) = crate::rollout::prometheus::tests::serve(head, None).await;
        (url, asked)
    }

    fn analyzer(url: String, limits: AnalysisLimits) -> Analyzer {
        let mut a = Analyzer::new(Some(url), limits).expect("analyzer");
        a.turn_wait = Duration::from_millis(300);
        a
    }

    /// One run of `checked()` for tenant "shop"; a run that does not end fails the test
    /// instead of hanging it.
    async fn measured(a: &Analyzer, metrics: &Metrics) -> Run {
        let app = checked();
        let run = a.measure(&app, "1.4.0", Asker { key: "shop", endpoints: &[] }, metrics);
        tokio::time::timeout(Duration::from_secs(10), run).await.expect("the run ends")
    }

    fn results(run: &Run) -> Vec<(MeasurementResult, String)> {
        run.measurements.iter().map(|m| (m.result, m.message.clone().unwrap_or_default())).collect()
    }

    /// A Prometheus that answers 0.01 to every query after 100 ms: the most queries it had
    /// in flight at once, and the request lines it got.
    async fn slow_prometheus() -> (String, Arc<std::sync::atomic::AtomicUsize>, Arc<std::sync::Mutex<Vec<String>>>) {
        use std::sync::atomic::AtomicUsize;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let (now, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let lines = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (m, l) = (most.clone(), lines.clone());
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let (now, most, lines) = (now.clone(), m.clone(), l.clone());
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 8192];
                    let n = stream.read(&mut buf).await.unwrap_or(0);
                    let line = String::from_utf8_lossy(&buf[..n]).lines().next().unwrap_or_default().to_string();
                    lines.lock().expect("lines").push(line);
                    let in_flight = now.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(in_flight, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    now.fetch_sub(1, Ordering::SeqCst);
                    let body = r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1700000000,"0.01"]}]}}"#;
                    let head = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = stream.write_all(head.as_bytes()).await;
                });
            }
        });
        (url, most, lines)
    }

    /// A run of 20 checks sends them `QUERIES_PER_RUN` at a time, each with Prometheus' own
    /// timeout, and every check is measured.
    #[tokio::test]
    async fn a_runs_queries_go_a_few_at_a_time_with_prometheus_own_timeout() {
        let (url, most, lines) = slow_prometheus().await;
        let a = analyzer(url, AnalysisLimits::default());
        let checks: Vec<serde_json::Value> = (0..20)
            .map(|i| serde_json::json!({"name": format!("c{i}"), "query": format!("sum(rate(errors_{i}[1m]))"), "max": 0.05}))
            .collect();
        let app: App = serde_json::from_value(serde_json::json!({
            "apiVersion": "flotilla.dev/v1beta1", "kind": "App", "metadata": {"name": "many", "namespace": "shop"},
            "spec": {"image": "registry.example.com/shop/many", "version": "2", "replicas": 1,
                     "rollout": {"analysis": {"metrics": checks}}}
        }))
        .expect("an App");
        let metrics = Metrics::new().expect("metrics");
        let run = a.measure(&app, "1", Asker { key: "shop", endpoints: &[] }, &metrics);
        let run = tokio::time::timeout(Duration::from_secs(10), run).await.expect("the run ends");
        assert_eq!(run.measurements.len(), 20);
        assert!(run.measurements.iter().all(|m| m.result == MeasurementResult::Pass), "{:?}", results(&run));
        let most = most.load(Ordering::SeqCst);
        assert!((1..=4).contains(&most), "{most} queries of one run in flight at once");
        let lines = lines.lock().expect("lines").clone();
        assert_eq!(lines.len(), 20);
        assert!(lines.iter().all(|l| l.contains("timeout=9000ms")), "{lines:?}");
    }

    /// A query that costs more than any check needs is refused before anything is asked.
    #[tokio::test]
    async fn a_costly_query_is_invalid_and_not_sent() {
        let (url, asked) = prometheus().await;
        let a = analyzer(url, AnalysisLimits::default());
        let app: App = serde_json::from_value(serde_json::json!({
            "apiVersion": "flotilla.dev/v1beta1", "kind": "App", "metadata": {"name": "costly", "namespace": "shop"},
            "spec": {"image": "registry.example.com/shop/costly", "version": "2", "replicas": 1,
                     "rollout": {"analysis": {"metrics": [
                         {"name": "everything", "query": "count_over_time(vector(1)[1d:1ms])", "max": 1}]}}}
        }))
        .expect("an App");
        let run = a.measure(&app, "1", Asker { key: "shop", endpoints: &[] }, &Metrics::new().expect("metrics")).await;
        let (result, message) = results(&run).remove(0);
        assert_eq!(result, MeasurementResult::Invalid);
        assert!(message.contains("check everything: the query selects no series"), "{message}");
        assert_eq!(asked.load(Ordering::SeqCst), 0, "nothing was sent");
    }

    /// A run that finds its tenant's turns all held (its Prometheus hangs) stops waiting
    /// after the turn wait, asks nothing and is inconclusive: a rollout never advances on
    /// it, and the reconcile that waited goes on. With a turn free it asks and passes.
    #[tokio::test]
    async fn a_run_that_gets_no_turn_is_inconclusive_and_asks_nothing() {
        let (url, asked) = prometheus().await;
        let a = analyzer(url, AnalysisLimits { per_replica: 4, per_tenant: 1, ..Default::default() });
        let metrics = Metrics::new().expect("metrics");
        let held = turn(&a, "shop").await;
        assert!(held.is_some());
        let started = std::time::Instant::now();
        let run = measured(&a, &metrics).await;
        assert!(started.elapsed() >= a.turn_wait, "it waited for a turn first");
        for (result, message) in results(&run) {
            assert_eq!(result, MeasurementResult::Inconclusive, "{message}");
            assert!(message.contains("this tenant's own runs in flight hold all its turns"), "{message}");
        }
        assert_eq!(run.measurements.len(), 2);
        assert_eq!(asked.load(Ordering::SeqCst), 0, "nothing was asked");
        drop(held);
        let run = measured(&a, &metrics).await;
        assert_eq!(results(&run).iter().map(|r| r.0).collect::<Vec<_>>(), [MeasurementResult::Pass; 2], "{run:?}");
        assert_eq!(asked.load(Ordering::SeqCst), 2, "each check asked once");
    }

    /// A run that finds the replica's turns all held by other tenants' runs says so when it
    /// stops waiting, and holds no turn afterwards.
    #[tokio::test]
    async fn a_run_that_gives_up_on_the_replicas_turns_holds_none() {
        let (url, asked) = prometheus().await;
        let a = analyzer(url, AnalysisLimits { per_replica: 1, per_tenant: 1, ..Default::default() });
        let metrics = Metrics::new().expect("metrics");
        let other = turn(&a, "bank").await;
        assert!(other.is_some());
        let run = measured(&a, &metrics).await;
        for (result, message) in results(&run) {
            assert_eq!(result, MeasurementResult::Inconclusive, "{message}");
            assert!(message.contains("the replica's runs in flight"), "{message}");
        }
        assert_eq!(asked.load(Ordering::SeqCst), 0, "nothing was asked");
        drop(other);
        assert!(turn(&a, "shop").await.is_some(), "the run that gave up holds no turn");
    }

    /// A run holds its turn while its queries are in flight (here against a server that
    /// accepts and never answers), and gives it back when it ends.
    #[tokio::test]
    async fn a_run_holds_its_turn_while_it_asks() {
        let (url, _) = hanging().await;
        let a = analyzer(url, AnalysisLimits { per_replica: 1, per_tenant: 1, ..Default::default() });
        let run = tokio::spawn({
            let a = a.clone();
            async move {
                a.measure(&checked(), "1.4.0", Asker { key: "shop", endpoints: &[] }, &Metrics::new().expect("metrics"))
                    .await
            }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!run.is_finished(), "the run waits for its answers");
        assert!(turn(&a, "bank").await.is_none(), "the only turn is held by the run in flight");
        run.abort();
        assert!(run.await.is_err(), "stopped");
        assert!(turn(&a, "bank").await.is_some(), "and given back when it ended");
    }

    use crate::rollout::prometheus::tests::hanging;

    /// `checked()` naming `url`, and the Tenant's list with `url` as its own (Dedicated).
    fn dedicated(url: &str) -> (App, [TenantPrometheus; 1]) {
        let mut app = serde_json::to_value(checked()).expect("an App");
        app["spec"]["rollout"]["analysis"]["prometheusUrl"] = serde_json::json!(url);
        let app: App = serde_json::from_value(app).expect("an App");
        let listed = [TenantPrometheus {
            url: url.trim_end_matches('/').to_string(),
            isolation: crate::api::PrometheusIsolation::Dedicated,
        }];
        (app, listed)
    }

    /// A tenant whose query to its dedicated Prometheus timed out does not ask
    /// it again for a while: its runs are inconclusive at once and take no turn. Another
    /// tenant listing it still asks it, and the tenant asks again after the rest. A shared
    /// Prometheus (the operator's default) never rests: another tenant's load could be what
    /// made it slow.
    #[tokio::test]
    async fn a_dedicated_prometheus_that_did_not_answer_rests_for_that_tenant() {
        let (shared_url, shared_accepted) = hanging().await;
        let (url, accepted) = hanging().await;
        let mut a = analyzer(shared_url, AnalysisLimits { per_replica: 1, per_tenant: 1, ..Default::default() });
        a.client =
            PrometheusClient::with_timeouts(Duration::from_millis(300), Duration::from_millis(300)).expect("client");
        a.resting = Resting::new(Duration::from_secs(2));
        let metrics = Metrics::new().expect("metrics");
        let shared = checked();
        let (dedicated, listed) = dedicated(&format!("{url}/"));
        assert!(dedicated.spec.analysis().is_some_and(|an| an.prometheus_url.is_some()), "the App names it");
        let run = |app: &App, tenant: &'static str| {
            let (a, app, metrics, listed) = (a.clone(), app.clone(), metrics.clone(), listed.clone());
            async move { a.measure(&app, "1.4.0", Asker { key: tenant, endpoints: &listed }, &metrics).await }
        };
        let asked_now = || accepted.load(Ordering::SeqCst);
        let timed_out = |r: &Run| {
            results(r)
                .iter()
                .all(|(res, m)| *res == MeasurementResult::Inconclusive && m.contains("did not answer within"))
        };
        let settle = || tokio::time::sleep(Duration::from_millis(100));

        // The shared default: timed out twice, asked twice.
        let first = run(&shared, "shop").await;
        assert!(timed_out(&first), "{first:?}");
        let second = run(&shared, "shop").await;
        assert!(timed_out(&second), "a shared Prometheus does not rest: {second:?}");
        settle().await;
        assert!(shared_accepted.load(Ordering::SeqCst) >= 2, "both runs asked");
        let asked = asked_now();

        // The dedicated endpoint: timed out once, then at rest.
        let first = run(&dedicated, "shop").await;
        assert!(timed_out(&first), "{first:?}");
        settle().await;
        assert!(asked_now() > asked, "the first run asked");
        let asked = asked_now();
        let held = turn(&a, "bank").await;
        let started = std::time::Instant::now();
        let resting = run(&dedicated, "shop").await;
        assert!(started.elapsed() < Duration::from_millis(100), "no wait for a turn, the only one being held");
        for (result, message) in results(&resting) {
            assert_eq!(result, MeasurementResult::Inconclusive, "{message}");
            assert!(message.contains("it is not asked again for 2s"), "{message}");
        }
        drop(held);
        let other = run(&dedicated, "bank").await;
        assert!(timed_out(&other), "another tenant asks it: {other:?}");
        settle().await;
        assert!(asked_now() > asked, "another tenant asked");
        let asked = asked_now();
        tokio::time::sleep(Duration::from_secs(2)).await;
        let again = run(&dedicated, "shop").await;
        assert!(timed_out(&again), "asked again after the rest: {again:?}");
        settle().await;
        assert!(asked_now() > asked, "the tenant asked again");
    }

    /// A run that waited for its tenant's turn while the run holding it timed out asks
    /// nothing once it gets the turn: the endpoint came to rest meanwhile.
    #[tokio::test]
    async fn a_run_that_waited_while_its_endpoint_came_to_rest_asks_nothing() {
        let (url, accepted) = hanging().await;
        let mut a = analyzer(
            "http://127.0.0.1:9".into(),
            AnalysisLimits { per_replica: 4, per_tenant: 1, ..Default::default() },
        );
        a.client =
            PrometheusClient::with_timeouts(Duration::from_millis(300), Duration::from_millis(300)).expect("client");
        a.resting = Resting::new(Duration::from_secs(30));
        let metrics = Metrics::new().expect("metrics");
        let (dedicated, listed) = dedicated(&url);
        let run = || {
            let (a, app, metrics, listed) = (a.clone(), dedicated.clone(), metrics.clone(), listed.clone());
            tokio::spawn(
                async move { a.measure(&app, "1.4.0", Asker { key: "shop", endpoints: &listed }, &metrics).await },
            )
        };
        let first = run();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let second = run();
        let first = first.await.expect("first run");
        assert!(results(&first).iter().all(|(_, m)| m.contains("did not answer within")), "{first:?}");
        let second = second.await.expect("second run");
        for (result, message) in results(&second) {
            assert_eq!(result, MeasurementResult::Inconclusive, "{message}");
            assert!(message.contains("it is not asked again for 30s"), "{message}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(accepted.load(Ordering::SeqCst), 2, "only the first run's two checks asked");
    }

    /// A dedicated Prometheus that accepts no connection (its backlog full) rests its tenant
    /// too, though each query ended at the connect timeout, well before the query timeout:
    /// else a tenant could hold turns by stalling handshakes instead of answers.
    #[tokio::test]
    async fn a_dedicated_prometheus_that_accepts_no_connection_rests() {
        let (url, _held, _listener) = crate::rollout::prometheus::tests::unaccepting().await;
        let mut a = analyzer(
            "http://127.0.0.1:9".into(),
            AnalysisLimits { per_replica: 4, per_tenant: 1, ..Default::default() },
        );
        a.client = PrometheusClient::with_timeouts(Duration::from_secs(5), Duration::from_millis(300)).expect("client");
        let metrics = Metrics::new().expect("metrics");
        let (dedicated, listed) = dedicated(&url);
        let run = || a.measure(&dedicated, "1.4.0", Asker { key: "shop", endpoints: &listed }, &metrics);
        let started = std::time::Instant::now();
        let first = run().await;
        assert!(started.elapsed() < Duration::from_secs(2), "it ended at the connect timeout");
        assert!(
            results(&first).iter().all(|(_, m)| m.contains("could not connect") && m.contains("within 300ms")),
            "{first:?}"
        );
        let started = std::time::Instant::now();
        let second = run().await;
        assert!(started.elapsed() < Duration::from_millis(100), "nothing was asked: {:?}", started.elapsed());
        for (result, message) in results(&second) {
            assert_eq!(result, MeasurementResult::Inconclusive, "{message}");
            assert!(
                message.contains("no connection within 300ms") && message.contains("not asked again for 30s"),
                "{message}"
            );
        }
    }

    /// A run waits for a turn the turn wait and no more. The clock is paused (nothing is
    /// asked: the run gets no turn).
    #[tokio::test(start_paused = true)]
    async fn a_run_waits_for_a_turn_no_longer_than_the_turn_wait() {
        let a = analyzer(
            "http://127.0.0.1:9".into(),
            AnalysisLimits { per_replica: 1, per_tenant: 1, ..Default::default() },
        );
        let metrics = Metrics::new().expect("metrics");
        let other = turn(&a, "bank").await;
        assert!(other.is_some(), "the replica's only turn, held all along");
        let started = tokio::time::Instant::now();
        let run = measured(&a, &metrics).await;
        let waited = started.elapsed();
        assert!(results(&run).iter().all(|r| r.0 == MeasurementResult::Inconclusive), "{run:?}");
        assert!(waited >= a.turn_wait && waited < a.turn_wait + Duration::from_millis(100), "waited {waited:?}");
        drop(other);
    }
}
