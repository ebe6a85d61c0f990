//! The `flotilla` command line.

pub mod control;
pub mod migrate;
pub mod observe;
pub mod shards;
pub mod status;
pub mod undo;

use clap::{Parser, Subcommand};
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(name = "flotilla", version, about = "Multi-tenant Kubernetes operator with metric-gated rollouts")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run one operator replica.
    Run(Box<RunArgs>),
    /// Print the CustomResourceDefinitions as YAML (what `crds/` holds).
    Crd,
    /// Rewrite every App and Tenant at the storage version (v1beta1), then drop older versions
    /// from the CRDs' status.storedVersions. Run it once after upgrading to this release.
    MigrateStorage(KubeconfigArgs),
    /// Show which replica holds which shard, since when, and how many namespaces and Apps each has.
    Shards(ShardsArgs),
    /// Show an App's rollout: phase, versions, canary step, measurements, history.
    Status(StatusArgs),
    /// Move a canary rollout to its next step now (with --full: finish it, skipping every remaining step and check).
    Promote(PromoteArgs),
    /// Roll the App back to its stable version now.
    Abort(AppTarget),
    /// Try the version that was rolled back again.
    Retry(AppTarget),
    /// Hold the App's rollout where it is until `resume`.
    Pause(AppTarget),
    /// Let a paused rollout go on.
    Resume(AppTarget),
    /// Go back to a version that was healthy: a rollout under way is abandoned at once;
    /// otherwise the version before the current one (or --to-revision) rolls out again
    /// through the App's strategy and analysis.
    Undo(UndoArgs),
    /// Serve a web dashboard on 127.0.0.1: Tenants, Apps, rollouts and shards, live, with the
    /// rights of your kubeconfig (also `kubectl flotilla dashboard` when installed as a plugin).
    Dashboard(Box<crate::dashboard::DashboardArgs>),
}

#[derive(clap::Args, Debug)]
pub struct UndoArgs {
    #[command(flatten)]
    pub target: AppTarget,
    /// A version (or revision) that status.history lists as Promoted; default: the one before
    /// the current version.
    #[arg(long)]
    pub to_revision: Option<String>,
}

/// The App a rollout command acts on.
#[derive(clap::Args, Debug)]
pub struct AppTarget {
    /// Name of the App.
    pub app: String,
    /// Namespace of the App; default: the kubeconfig context's namespace, else `default`.
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// Kubeconfig to use; default: in-cluster, then $KUBECONFIG, then ~/.kube/config.
    #[arg(long, env = "FLOTILLA_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
pub struct PromoteArgs {
    #[command(flatten)]
    pub target: AppTarget,
    /// Skip every remaining step and check: the new version replaces the stable one now.
    #[arg(long)]
    pub full: bool,
}

#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    #[command(flatten)]
    pub target: AppTarget,
    /// Print the status again whenever the App changes, until Ctrl-C.
    #[arg(short = 'w', long)]
    pub watch: bool,
}

#[derive(clap::Args, Debug)]
pub struct KubeconfigArgs {
    /// Kubeconfig to use; default: in-cluster, then $KUBECONFIG, then ~/.kube/config.
    #[arg(long, env = "FLOTILLA_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
pub struct ShardsArgs {
    /// Kubeconfig to use; default: in-cluster, then $KUBECONFIG, then ~/.kube/config.
    #[arg(long, env = "FLOTILLA_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Namespace the operator runs in (where its Leases are).
    #[arg(long, env = "POD_NAMESPACE", default_value = "flotilla-system")]
    pub operator_namespace: String,
    /// Number of shards (as given to the replicas).
    #[arg(long, env = "FLOTILLA_SHARDS", default_value_t = 32)]
    pub shards: u32,
}

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// Kubeconfig to use; default: in-cluster, then $KUBECONFIG, then ~/.kube/config.
    #[arg(long, env = "FLOTILLA_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Serve only this namespace, without tenancy (the operator must have been given rights
    /// there). Default: serve every namespace a Tenant onboarded.
    #[arg(long, env = "FLOTILLA_NAMESPACE")]
    pub namespace: Option<String>,
    /// Address of the admin server (/metrics, /healthz, /readyz).
    #[arg(long, env = "FLOTILLA_ADMIN_ADDR", default_value = "0.0.0.0:8080")]
    pub admin_addr: SocketAddr,
    /// Name of this replica in Events, logs and Leases (default: $POD_NAME, else the host name and pid).
    #[arg(long, env = "FLOTILLA_REPLICA_ID")]
    pub replica_id: Option<String>,
    /// Namespace the operator runs in (its Leases live there; no tenant may claim it).
    #[arg(long, env = "POD_NAMESPACE", default_value = "flotilla-system")]
    pub operator_namespace: String,
    /// ServiceAccount the operator runs as; onboarding binds it in each tenant namespace.
    #[arg(long, env = "FLOTILLA_SERVICE_ACCOUNT", default_value = "flotilla")]
    pub service_account: String,
    /// Namespaces no Tenant may claim, besides the operator's own: names, or prefixes ending in
    /// `*` (comma-separated).
    #[arg(long, env = "FLOTILLA_PROTECTED_NAMESPACES", value_delimiter = ',', default_values = crate::tenancy::claim::DEFAULT_PROTECTED_NAMESPACES)]
    pub protected_namespaces: Vec<String>,
    /// Namespaces whose pods may reach every tenant's pods (an ingress controller, the
    /// monitoring stack), by name, comma-separated: each tenant namespace's NetworkPolicy
    /// admits them.
    #[arg(long, env = "FLOTILLA_NETWORK_POLICY_ALLOWED_NAMESPACES", value_delimiter = ',')]
    pub network_policy_allowed_namespaces: Vec<String>,
    /// Namespaces whose pods no tenant's pod may reach (the platform's Prometheus and
    /// Alertmanager), by name, comma-separated: each tenant namespace's NetworkPolicy then
    /// limits egress to every other namespace and to addresses outside
    /// --network-policy-cluster-cidrs (give the cluster's pod and Service ranges there).
    #[arg(long, env = "FLOTILLA_NETWORK_POLICY_EGRESS_DENIED_NAMESPACES", value_delimiter = ',')]
    pub network_policy_egress_denied_namespaces: Vec<String>,
    /// The cluster's pod and Service address ranges (comma-separated CIDRs), left out of the
    /// egress to addresses outside the cluster.
    #[arg(long, env = "FLOTILLA_NETWORK_POLICY_CLUSTER_CIDRS", value_delimiter = ',', value_parser = parse_cidr, requires = "network_policy_egress_denied_namespaces")]
    pub network_policy_cluster_cidrs: Vec<String>,
    /// Labels that protect a namespace from every Tenant: `key` (any value) or `key=value`
    /// (comma-separated).
    #[arg(long, env = "FLOTILLA_PROTECTED_NAMESPACE_LABELS", value_delimiter = ',', default_values = crate::tenancy::claim::DEFAULT_PROTECTED_LABELS)]
    pub protected_namespace_labels: Vec<String>,
    /// Number of shards namespaces are hashed into; the same on every replica.
    #[arg(long, env = "FLOTILLA_SHARDS", default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub shards: u32,
    /// How long a shard Lease stays valid without renewal (at most 60m).
    #[arg(long, env = "FLOTILLA_LEASE_DURATION", default_value = "6s", value_parser = parse_duration)]
    pub lease_duration: std::time::Duration,
    /// Stop work in a shard not renewed for this long (shorter than the lease duration).
    #[arg(long, env = "FLOTILLA_RENEW_DEADLINE", default_value = "4s", value_parser = parse_duration)]
    pub renew_deadline: std::time::Duration,
    /// How often a replica looks at the shard Leases when nothing wakes it. A shard released
    /// or deleted, a replica that joins, leaves or fills its budget, and a Lease due to expire
    /// each start a look at once; a free shard is left to the replica it is assigned to for
    /// four periods, at most 2 s, before any replica may take it. Between 100ms and 5m.
    #[arg(long, env = "FLOTILLA_SHARD_RETRY_PERIOD", default_value = "500ms", value_parser = parse_duration)]
    pub shard_retry_period: std::time::Duration,
    /// Log as JSON lines.
    #[arg(long, env = "FLOTILLA_LOG_JSON")]
    pub log_json: bool,
    /// Prometheus (any Prometheus-compatible query API) for Apps whose analysis names none,
    /// for example http://prometheus.monitoring:9090. Every tenant may use it, and every
    /// selector of their queries is limited to the App's namespace there. Other endpoints are
    /// allowed per Tenant (`spec.prometheusEndpoints`); Apps naming anything else are refused.
    #[arg(long, env = "FLOTILLA_PROMETHEUS_URL")]
    pub prometheus_url: Option<String>,
    /// Analysis runs (one per App, its checks concurrently) in flight at once on this replica.
    #[arg(long, env = "FLOTILLA_ANALYSIS_CONCURRENCY", default_value_t = 32, value_parser = clap::value_parser!(u16).range(1..))]
    pub analysis_concurrency: u16,
    /// Analysis runs of one tenant in flight at once on this replica: a tenant whose Prometheus
    /// hangs waits in its own line. A run that gets no turn (of this or
    /// --analysis-concurrency) within 20 s is inconclusive and asks nothing.
    #[arg(long, env = "FLOTILLA_ANALYSIS_CONCURRENCY_PER_TENANT", default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..))]
    pub analysis_concurrency_per_tenant: u16,
    /// The shortest interval between one App's analysis runs: an App asking for a shorter
    /// `spec.rollout.analysis.interval` is measured this often. Between 1s and 10m.
    #[arg(long, env = "FLOTILLA_ANALYSIS_MIN_INTERVAL", default_value = "5s", value_parser = parse_analysis_interval)]
    pub analysis_min_interval: std::time::Duration,
    /// How far back a check's query may read (its range windows, offsets and subqueries
    /// summed); a query reading further, pinned with `@`, or selecting no series is refused
    /// without being sent. Between 1m and 1d.
    #[arg(long, env = "FLOTILLA_ANALYSIS_MAX_LOOKBACK", default_value = "60m", value_parser = parse_lookback)]
    pub analysis_max_lookback: std::time::Duration,
    /// Serve the conversion webhook of the CRDs (every replica does; turn it off only where
    /// another installation of Flotilla serves it).
    #[arg(long, env = "FLOTILLA_CONVERSION_WEBHOOK", default_value_t = true, action = clap::ArgAction::Set)]
    pub conversion_webhook: bool,
    /// Address of the conversion webhook (HTTPS). Replicas on one host may share it.
    #[arg(long, env = "FLOTILLA_WEBHOOK_ADDR", default_value = "0.0.0.0:9443")]
    pub webhook_addr: SocketAddr,
    /// URL the apiserver calls for conversions when it reaches the replicas directly, for
    /// example https://127.0.0.1:9443/convert with a local control plane. Default: through
    /// the flotilla-webhook Service in the operator's namespace.
    #[arg(long, env = "FLOTILLA_WEBHOOK_URL", value_parser = parse_https_url)]
    pub webhook_url: Option<String>,
    /// Secret (in the operator's namespace) with the webhook certificate all replicas share;
    /// created by the first replica when missing.
    #[arg(long, env = "FLOTILLA_WEBHOOK_SECRET", default_value = "flotilla-webhook-cert")]
    pub webhook_secret: String,
    /// Talk HTTP/2 to the apiserver: a multiplexed connection per few served namespaces and
    /// one for the Leases, instead of a connection per watch. Turn it off only where the path
    /// to the apiserver does not pass HTTP/2 (some proxies).
    #[arg(long, env = "FLOTILLA_API_HTTP2", default_value_t = true, action = clap::ArgAction::Set)]
    pub api_http2: bool,
    /// Served namespaces per connection to the apiserver. Each has 3 watches (5 where Apps
    /// autoscale and read ConfigMaps), and
    /// kube-apiserver allows 100 concurrent streams per HTTP/2 connection by default
    /// (--http2-max-streams-per-connection); 12 leaves 40 streams for requests. Keep
    /// 5 x this well under the apiserver's limit.
    #[arg(long, env = "FLOTILLA_NAMESPACES_PER_CONNECTION", default_value_t = 12, value_parser = clap::value_parser!(u16).range(1..=1000))]
    pub namespaces_per_connection: u16,
    /// Requests this replica has in flight to the apiserver at once, Lease requests excepted
    /// (a watch counts only until its response starts); twice as many reconciles run at once.
    /// Bounds the burst (and the memory) when a replica starts serving many namespaces.
    #[arg(long, env = "FLOTILLA_MAX_REQUESTS_IN_FLIGHT", default_value_t = 32, value_parser = clap::value_parser!(u16).range(1..))]
    pub max_requests_in_flight: u16,
    /// Reconciles of one served namespace's Apps in flight at once (0: no bound; with
    /// --namespace, none). The others wait their turn in their namespace, so that a namespace
    /// of thousands of Apps queues a few at a time for the replica's reconcile slots (twice
    /// --max-requests-in-flight) among the other namespaces' instead of all of them ahead.
    #[arg(long, env = "FLOTILLA_RECONCILES_PER_NAMESPACE", default_value_t = 3)]
    pub reconciles_per_namespace: u16,
    /// How long a request to the apiserver waits for its answer (its response's head) once
    /// sent; time queued for a slot of --max-requests-in-flight does not count. A replica whose
    /// requests hang gives up and retries instead of holding its work forever.
    #[arg(long, env = "FLOTILLA_REQUEST_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub request_timeout: std::time::Duration,
    /// A replica whose requests to the apiserver go unanswered this long while its Leases are
    /// answered is stuck: it stops renewing its shards (peers take them once the Leases expire)
    /// and fails /healthz, so that the kubelet restarts it.
    #[arg(long, env = "FLOTILLA_STUCK_AFTER", default_value = "60s", value_parser = parse_duration)]
    pub stuck_after: std::time::Duration,
    /// How often the heap's free pages are given back to the system (builds linked against
    /// glibc, the image's among them; others ignore it). Without it, glibc keeps the pages a
    /// burst of work freed. At least 1s; 0s turns it off.
    #[arg(long, env = "FLOTILLA_HEAP_TRIM_INTERVAL", default_value = "10s", value_parser = parse_trim_interval)]
    pub heap_trim_interval: std::time::Duration,
    /// How long a replica given SIGTERM waits for its work to stop before it exits anyway. It
    /// closes its fence and releases its Leases first (within --renew-deadline), so what is
    /// left cannot write; keep it under the pod's terminationGracePeriodSeconds (30 s).
    #[arg(long, env = "FLOTILLA_SHUTDOWN_GRACE", default_value = "10s", value_parser = parse_duration)]
    pub shutdown_grace: std::time::Duration,
    /// What a replica with a Pod-bound token does when the admission policies it reads at
    /// start (the shard fence and the limits on its own writes, rbac/) name another user or
    /// another Lease namespace than its own, so that they would let its writes through:
    /// `refuse` exits with what to fix; `warn` logs an error and runs, for installs that fence
    /// the operator by other means.
    #[arg(long, env = "FLOTILLA_ADMISSION_POLICY_CHECK", value_enum, default_value_t = crate::operator::fence_config::OnMismatch::Refuse)]
    pub admission_policy_check: crate::operator::fence_config::OnMismatch,
    /// Memory the Apps this replica serves may fill (256Mi, 1Gi, or unlimited): once the
    /// Apps it serves fill it, at about 64 KiB each over 40 MiB, the replica takes no more
    /// shards and leaves them to its peers, or unowned (flotilla_shards_unowned) rather than be
    /// OOM-killed. Default: 80 % of the container's memory limit (cgroup), unlimited without one.
    #[arg(long, env = "FLOTILLA_MEMORY_BUDGET", value_parser = crate::sharding::budget::parse_bytes)]
    pub memory_budget: Option<u64>,
    /// Pod annotations no App may set, as key prefixes, comma-separated (mesh sidecar opt-outs,
    /// unconfined AppArmor and seccomp profiles, drain blockers, Flotilla's own: see
    /// docs/security.md). An App that sets one is refused and nothing of it is applied. An
    /// empty value refuses none.
    #[arg(
        long,
        env = "FLOTILLA_DENIED_POD_ANNOTATION_PREFIXES",
        value_delimiter = ',',
        default_values_t = crate::app::pod_policy::DEFAULT_DENIED_PREFIXES.iter().map(|s| s.to_string()).collect::<Vec<_>>()
    )]
    pub denied_pod_annotation_prefixes: Vec<String>,
    /// For tests of network faults only: send every request but the Leases' to this URL (a
    /// proxy in front of the same apiserver, with the same certificate).
    #[arg(long, hide = true)]
    pub workload_api_url: Option<http::Uri>,
}

/// Accepts an https:// URL (the apiserver calls webhooks over TLS only).
pub fn parse_https_url(s: &str) -> Result<String, String> {
    match s.strip_prefix("https://") {
        Some(rest) if !rest.is_empty() && !rest.contains(char::is_whitespace) => Ok(s.to_string()),
        _ => Err(format!("{s:?} is not an https:// URL (the apiserver calls webhooks over TLS only)")),
    }
}

/// Parses `500ms`, `6s` or `2m`.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let (num, unit) = s.find(|c: char| !c.is_ascii_digit()).map(|i| s.split_at(i)).unwrap_or((s, "s"));
    let n: u64 = num.parse().map_err(|_| format!("invalid duration {s:?}: expected for example 500ms, 6s or 2m"))?;
    match unit {
        "ms" => Ok(std::time::Duration::from_millis(n)),
        "s" => Ok(std::time::Duration::from_secs(n)),
        "m" => Ok(std::time::Duration::from_secs(n.saturating_mul(60))),
        _ => Err(format!("invalid duration unit in {s:?}: use ms, s or m")),
    }
}

/// `--network-policy-cluster-cidrs`: an address range such as 10.0.0.0/8.
pub fn parse_cidr(s: &str) -> Result<String, String> {
    if crate::tenancy::desired::is_cidr(s) {
        Ok(s.to_string())
    } else {
        Err(format!("{s:?} is not an address range (for example 10.244.0.0/16 or fd00::/8)"))
    }
}

/// A duration of `parse_duration` between `min` and `max`.
fn duration_between(
    s: &str,
    min: std::time::Duration,
    max: std::time::Duration,
) -> Result<std::time::Duration, String> {
    let d = parse_duration(s)?;
    if d < min || d > max {
        return Err(format!("{s:?} is out of range: between {min:?} and {max:?}"));
    }
    Ok(d)
}

/// `--analysis-min-interval`: 1s to 10m.
pub fn parse_analysis_interval(s: &str) -> Result<std::time::Duration, String> {
    duration_between(s, std::time::Duration::from_secs(1), std::time::Duration::from_secs(600))
}

/// `--analysis-max-lookback`: 1m to a day (1440m).
pub fn parse_lookback(s: &str) -> Result<std::time::Duration, String> {
    duration_between(s, std::time::Duration::from_secs(60), std::time::Duration::from_secs(86_400))
}

/// `--heap-trim-interval`: 0s (never), or at least a second (each trim holds the allocator's
/// locks while it walks the heap).
pub fn parse_trim_interval(s: &str) -> Result<std::time::Duration, String> {
    let d = parse_duration(s)?;
    if !d.is_zero() && d < std::time::Duration::from_secs(1) {
        return Err(format!("--heap-trim-interval {s:?} is under 1s: use 0s to turn trimming off, or 1s or more"));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(std::time::Duration::from_millis(500)));
        assert_eq!(parse_duration("6s"), Ok(std::time::Duration::from_secs(6)));
        assert_eq!(parse_duration("2m"), Ok(std::time::Duration::from_secs(120)));
        assert!(parse_duration("6h").is_err());
        assert!(parse_duration("x").is_err());
    }

    #[test]
    fn a_heap_trim_interval_is_off_or_at_least_a_second() {
        assert_eq!(parse_trim_interval("0s"), Ok(std::time::Duration::ZERO));
        assert_eq!(parse_trim_interval("1s"), Ok(std::time::Duration::from_secs(1)));
        let e = parse_trim_interval("1ms").expect_err("a trim every millisecond");
        assert!(e.contains("under 1s"), "{e}");
    }

    fn parse(args: &[&str]) -> Command {
        match Cli::try_parse_from(args) {
            Ok(cli) => cli.command,
            Err(e) => panic!("{args:?}: {e}"),
        }
    }

    #[test]
    fn rollout_commands() {
        let Command::Promote(p) =
            parse(&["flotilla", "promote", "checkout", "-n", "shop", "--full", "--kubeconfig", "/k"])
        else {
            panic!("not promote")
        };
        assert_eq!((p.target.app.as_str(), p.target.namespace.as_deref(), p.full), ("checkout", Some("shop"), true));
        assert_eq!(p.target.kubeconfig.as_deref(), Some(std::path::Path::new("/k")));
        let Command::Promote(p) = parse(&["flotilla", "promote", "checkout"]) else { panic!("not promote") };
        assert!(!p.full && p.target.namespace.is_none());
        for verb in ["abort", "retry", "pause", "resume"] {
            let command = parse(&["flotilla", verb, "web", "--namespace", "shop", "--kubeconfig", "/k"]);
            let target = match command {
                Command::Abort(t) | Command::Retry(t) | Command::Pause(t) | Command::Resume(t) => t,
                other => panic!("{verb}: {other:?}"),
            };
            assert_eq!((target.app.as_str(), target.namespace.as_deref()), ("web", Some("shop")), "{verb}");
        }
        assert!(Cli::try_parse_from(["flotilla", "abort"]).is_err(), "the App is required");
    }

    #[test]
    fn works_as_a_kubectl_plugin() {
        // kubectl runs `kubectl-flotilla status web -n shop`: argv[0] is only a name.
        let Command::Status(s) = parse(&["/home/me/.local/bin/kubectl-flotilla", "status", "web", "-n", "shop", "-w"])
        else {
            panic!("not status")
        };
        assert_eq!((s.target.app.as_str(), s.target.namespace.as_deref(), s.watch), ("web", Some("shop"), true));
    }
}
