//! A real Prometheus (Debian's `prometheus` package) and an in-process exporter whose traffic
//! the test controls, for end-to-end tests of what the operator reads from Prometheus.
#![allow(dead_code)]

use super::{free_port, http_get};
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::process::{Child, Command};
use tokio::task::JoinHandle;

/// promtool and prometheus come from Debian's `prometheus` package (hack/prerequisites.sh
/// installs it); their absence is a failure that says so.
pub fn tool(name: &str) -> PathBuf {
    for dir in ["/usr/bin", "/usr/local/bin"] {
        let p = Path::new(dir).join(name);
        if p.exists() {
            return p;
        }
    }
    panic!(
        "{name} not found: install Debian's prometheus package (`apt-get install prometheus`), which `bash hack/prerequisites.sh` does"
    );
}

/// Percent-encodes `q` for a URL query string.
pub fn encode(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// An instant query against the Prometheus at `addr` ("127.0.0.1:PORT"); panics unless it
/// answers 200.
pub async fn query(addr: &str, expr: &str) -> Value {
    let (code, body) =
        http_get(addr, &format!("/api/v1/query?query={}", encode(expr))).await.expect("Prometheus answers");
    let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    assert_eq!(code, 200, "query {expr} failed: {body}");
    v
}

/// The buckets of `http_request_duration_seconds`, without +Inf.
pub const BUCKETS: [f64; 11] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// What one (namespace, app, version) serves between two scrapes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Traffic {
    /// Requests added to `http_requests_total` at every scrape.
    pub requests_per_scrape: f64,
    /// Share of those requests answered with code 500; the rest are 200.
    pub error_ratio: f64,
    /// Latency of every request, observed in `http_request_duration_seconds`.
    pub latency_seconds: f64,
}

impl Default for Traffic {
    fn default() -> Self {
        Traffic { requests_per_scrape: 100.0, error_ratio: 0.0, latency_seconds: 0.01 }
    }
}

/// (namespace, app, version)
type Key = (String, String, String);

#[derive(Default)]
struct Series {
    traffic: Traffic,
    ok: f64,
    errors: f64,
    /// Cumulative counts, one per entry of BUCKETS.
    buckets: [f64; BUCKETS.len()],
    sum: f64,
    count: f64,
}

impl Series {
    fn advance(&mut self) {
        let t = self.traffic;
        let requests = t.requests_per_scrape.max(0.0);
        let errors = requests * t.error_ratio.clamp(0.0, 1.0);
        self.errors += errors;
        self.ok += requests - errors;
        for (le, count) in BUCKETS.iter().zip(self.buckets.iter_mut()) {
            if t.latency_seconds <= *le {
                *count += requests;
            }
        }
        self.sum += requests * t.latency_seconds;
        self.count += requests;
    }
}

type State = Arc<Mutex<BTreeMap<Key, Series>>>;

fn lock(state: &State) -> MutexGuard<'_, BTreeMap<Key, Series>> {
    state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// Advances every series by its traffic and renders them in the Prometheus text format.
fn scrape(state: &State) -> String {
    let mut series = lock(state);
    let mut out = String::new();
    out.push_str("# HELP http_requests_total Requests served, by code.\n# TYPE http_requests_total counter\n");
    for s in series.values_mut() {
        s.advance();
    }
    for ((ns, app, version), s) in series.iter() {
        let labels = format!("namespace=\"{}\",app=\"{}\",version=\"{}\"", escape(ns), escape(app), escape(version));
        let _ = writeln!(out, "http_requests_total{{{labels},code=\"200\"}} {}", s.ok);
        let _ = writeln!(out, "http_requests_total{{{labels},code=\"500\"}} {}", s.errors);
    }
    out.push_str(
        "# HELP http_request_duration_seconds Request latency.\n# TYPE http_request_duration_seconds histogram\n",
    );
    for ((ns, app, version), s) in series.iter() {
        let labels = format!("namespace=\"{}\",app=\"{}\",version=\"{}\"", escape(ns), escape(app), escape(version));
        for (le, count) in BUCKETS.iter().zip(s.buckets.iter()) {
            let _ = writeln!(out, "http_request_duration_seconds_bucket{{{labels},le=\"{le}\"}} {count}");
        }
        let _ = writeln!(out, "http_request_duration_seconds_bucket{{{labels},le=\"+Inf\"}} {}", s.count);
        let _ = writeln!(out, "http_request_duration_seconds_sum{{{labels}}} {}", s.sum);
        let _ = writeln!(out, "http_request_duration_seconds_count{{{labels}}} {}", s.count);
    }
    out
}

/// Stops the server when the last handle goes.
struct Server(JoinHandle<()>);

impl Drop for Server {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// An HTTP server on 127.0.0.1 serving `/metrics` for the traffic the test sets. Every scrape
/// (by Prometheus or anyone else) advances the counters by one `Traffic`, so `rate()` sees
/// it. Clones share the same state; the server stops with the last clone.
#[derive(Clone)]
pub struct Exporter {
    state: State,
    addr: String,
    _server: Arc<Server>,
}

impl Exporter {
    /// Binds 127.0.0.1:0 and serves until the last clone is dropped.
    pub async fn start() -> Exporter {
        let state: State = Arc::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("binding the exporter");
        let addr = listener.local_addr().expect("exporter address").to_string();
        let handler_state = state.clone();
        let app = axum::Router::new().route(
            "/metrics",
            axum::routing::get(move || {
                let state = handler_state.clone();
                async move {
                    ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], scrape(&state))
                }
            }),
        );
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Exporter { state, addr, _server: Arc::new(Server(server)) }
    }

    /// "127.0.0.1:PORT"
    pub fn addr(&self) -> String {
        self.addr.clone()
    }

    /// Sets (or replaces) the traffic of one version of an app; its counters keep counting.
    pub fn set(&self, namespace: &str, app: &str, version: &str, traffic: Traffic) {
        let key = (namespace.to_string(), app.to_string(), version.to_string());
        lock(&self.state).entry(key).or_default().traffic = traffic;
    }

    /// Stops serving the series of one version of an app; setting it again starts from zero.
    pub fn remove(&self, namespace: &str, app: &str, version: &str) {
        lock(&self.state).remove(&(namespace.to_string(), app.to_string(), version.to_string()));
    }
}

/// A real Prometheus on a free 127.0.0.1 port, scraping every second, with its config, data
/// and log in a directory of its own. Killed when dropped; the directory is removed then
/// unless the test is failing.
pub struct Prometheus {
    dir: PathBuf,
    port: u16,
    child: Option<Child>,
}

impl Prometheus {
    /// Starts Prometheus scraping `targets` (job name, "host:port") and evaluating
    /// `rule_files`; returns once it is ready.
    pub async fn start(targets: &[(&str, String)], rule_files: &[PathBuf]) -> Prometheus {
        static INSTANCES: AtomicU32 = AtomicU32::new(0);
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
        let dir = std::env::temp_dir().join(format!(
            "flotilla-prometheus-{}-{}-{nanos:08x}",
            std::process::id(),
            INSTANCES.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("prometheus dir");
        // JSON is YAML, and serde_json quotes every name and path correctly.
        let config = serde_json::json!({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": rule_files,
            "scrape_configs": targets.iter().map(|(job, addr)| serde_json::json!({
                "job_name": job,
                "static_configs": [{"targets": [addr]}],
            })).collect::<Vec<_>>(),
        });
        std::fs::write(dir.join("prometheus.yml"), config.to_string()).expect("writing prometheus.yml");
        let mut prom = Prometheus { dir, port: free_port(), child: None };
        prom.restart().await;
        prom
    }

    /// "http://127.0.0.1:PORT"
    pub fn url(&self) -> String {
        format!("http://{}", self.addr())
    }

    /// "127.0.0.1:PORT"
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The directory of its config, data (`data/`) and log (`prometheus.log`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Kills Prometheus and waits until it has exited; its port is free then.
    pub async fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
        }
    }

    /// Starts Prometheus again (stopping it first if it runs) on the same port with the same
    /// config and data; returns once it is ready.
    pub async fn restart(&mut self) {
        self.stop().await;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("prometheus.log"))
            .expect("prometheus log");
        let mut child = Command::new(tool("prometheus"))
            .arg(format!("--config.file={}", self.dir.join("prometheus.yml").display()))
            .arg(format!("--storage.tsdb.path={}", self.dir.join("data").display()))
            .arg(format!("--web.listen-address={}", self.addr()))
            .stdout(log.try_clone().expect("prometheus log"))
            .stderr(log)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("starting prometheus");
        let addr = self.addr();
        let start = Instant::now();
        loop {
            if http_get(&addr, "/-/ready").await.is_some_and(|(code, _)| code == 200) {
                self.child = Some(child);
                return;
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "Prometheus exited ({status}) before it was ready; {}:\n{}",
                    self.dir.display(),
                    self.log_tail()
                );
            }
            if start.elapsed() > Duration::from_secs(30) {
                panic!("Prometheus not ready on {addr} after 30s; {}:\n{}", self.dir.display(), self.log_tail());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The last lines of its log.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// An instant query (GET /api/v1/query); panics unless Prometheus answers 200.
    pub async fn query(&self, expr: &str) -> Value {
        query(&self.addr(), expr).await
    }

    /// Polls `expr` every 200 ms until it returns exactly one sample with a finite value;
    /// panics after `timeout` with the last answer.
    pub async fn wait_for_value(&self, expr: &str, timeout: Duration) -> f64 {
        let start = Instant::now();
        loop {
            let v = self.query(expr).await;
            let value = match v["data"]["result"].as_array().map(Vec::as_slice) {
                Some([sample]) => sample["value"][1].as_str().and_then(|s| s.parse::<f64>().ok()),
                _ => None,
            };
            if let Some(value) = value.filter(|x| x.is_finite()) {
                return value;
            }
            if start.elapsed() > timeout {
                panic!("timed out after {timeout:?} waiting for one finite sample of {expr}; last answer: {v}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.start_kill();
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
