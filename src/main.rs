use clap::Parser;
use flotilla::cli::control::Request;
use flotilla::cli::{AppTarget, Cli, Command};
use flotilla::rollout::planner::Verb;
use flotilla::sharding::budget;
use std::future::Future;
use std::path::Path;
use std::process::ExitCode;

fn replica_id(explicit: Option<String>) -> String {
    explicit.or_else(|| std::env::var("POD_NAME").ok()).unwrap_or_else(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_else(|_| "flotilla".into());
        format!("{}-{}", host.trim(), std::process::id())
    })
}

/// The async runtime, or an error message for the user.
fn runtime(multi_thread: bool) -> Result<tokio::runtime::Runtime, String> {
    let mut builder = if multi_thread {
        tokio::runtime::Builder::new_multi_thread()
    } else {
        tokio::runtime::Builder::new_current_thread()
    };
    builder.enable_all().build().map_err(|e| format!("error: starting the async runtime: {e}"))
}

/// Runs `command` with a client for `kubeconfig` on a current-thread runtime; a failure to
/// start either is printed and exits non-zero.
fn with_client<F, Fut>(kubeconfig: Option<&Path>, command: F) -> ExitCode
where
    F: FnOnce(kube::Client) -> Fut,
    Fut: Future<Output = ExitCode>,
{
    let runtime = match runtime(false) {
        Ok(rt) => rt,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        match flotilla::operator::client_for(kubeconfig, "cli").await {
            Ok(client) => command(client).await,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        }
    })
}

/// The App's namespace: the one given, else the kubeconfig context's (`default` when it names none).
fn namespace_of(target: &AppTarget, client: &kube::Client) -> String {
    target.namespace.clone().unwrap_or_else(|| client.default_namespace().to_string())
}

/// `flotilla promote|abort|retry|pause|resume`.
fn control(target: AppTarget, request: Request) -> ExitCode {
    let kubeconfig = target.kubeconfig.clone();
    with_client(kubeconfig.as_deref(), |client| async move {
        let namespace = namespace_of(&target, &client);
        match flotilla::cli::control::send(client, &namespace, &target.app, request).await {
            Ok(confirmation) => {
                println!("{confirmation}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        }
    })
}

/// A client with exactly the user's kubeconfig: the dashboard acts with the user's rights.
async fn user_client(kubeconfig: Option<&Path>) -> Result<kube::Client, String> {
    let config = flotilla::operator::kube_config(kubeconfig).await.map_err(|e| e.to_string())?;
    kube::Client::try_from(config).map_err(|e| format!("making a client: {e}"))
}

/// `flotilla dashboard`.
fn dashboard(args: flotilla::dashboard::DashboardArgs) -> ExitCode {
    let runtime = match runtime(true) {
        Ok(rt) => rt,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let client = match user_client(args.kubeconfig.as_deref()).await {
            Ok(client) => client,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        };
        let serving = flotilla::dashboard::serve(client, args, |url| {
            println!("Flotilla dashboard: {url}");
            println!("Press Ctrl-C to stop it.");
        });
        match serving.await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        }
    })
}

fn main() -> ExitCode {
    // The HTTP clients (Prometheus queries, OTLP export) use rustls without a bundled crypto
    // provider: ring, like the kube client.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = Cli::parse();
    match cli.command {
        Command::Promote(args) => {
            control(args.target, Request::Action(if args.full { Verb::PromoteFull } else { Verb::Promote }))
        }
        Command::Abort(target) => control(target, Request::Action(Verb::Abort)),
        Command::Retry(target) => control(target, Request::Action(Verb::Retry)),
        Command::Pause(target) => control(target, Request::Pause),
        Command::Resume(target) => control(target, Request::Resume),
        Command::Undo(args) => {
            let kubeconfig = args.target.kubeconfig.clone();
            with_client(kubeconfig.as_deref(), |client| async move {
                let namespace = namespace_of(&args.target, &client);
                let to = args.to_revision.as_deref();
                match flotilla::cli::undo::undo(client, &namespace, &args.target.app, to).await {
                    Ok(line) => {
                        println!("{line}");
                        ExitCode::SUCCESS
                    }
                    Err(e) => {
                        eprintln!("error: {e}");
                        ExitCode::FAILURE
                    }
                }
            })
        }
        Command::Status(args) => {
            let kubeconfig = args.target.kubeconfig.clone();
            with_client(kubeconfig.as_deref(), |client| async move {
                let namespace = namespace_of(&args.target, &client);
                match flotilla::cli::observe::show(client, &namespace, &args.target.app, args.watch).await {
                    Ok(()) => ExitCode::SUCCESS,
                    Err(e) => {
                        eprintln!("error: {e}");
                        ExitCode::FAILURE
                    }
                }
            })
        }
        Command::Dashboard(args) => dashboard(*args),
        Command::Crd => match flotilla::api::crds_yaml() {
            Ok(yaml) => {
                print!("{yaml}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: rendering CRDs: {e}");
                ExitCode::FAILURE
            }
        },
        Command::MigrateStorage(args) => with_client(args.kubeconfig.as_deref(), |client| async move {
            match flotilla::cli::migrate::migrate_storage(client, |line| println!("{line}")).await {
                Ok(done) => {
                    let objects: usize = done.iter().map(|m| m.objects).sum();
                    println!("done: {objects} objects stored at {}", flotilla::api::STORAGE_VERSION);
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::FAILURE
                }
            }
        }),
        Command::Shards(args) => with_client(args.kubeconfig.as_deref(), |client| async move {
            match flotilla::cli::shards::print_shards(client, &args.operator_namespace, args.shards).await {
                Ok(table) => {
                    print!("{table}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("error: reading Leases, namespaces and Apps: {e}");
                    ExitCode::FAILURE
                }
            }
        }),
        Command::Run(args) => {
            let args = *args;
            let hour = std::time::Duration::from_secs(3600);
            if args.lease_duration > hour {
                eprintln!("error: --lease-duration ({}s) must be at most 60m", args.lease_duration.as_secs());
                return ExitCode::FAILURE;
            }
            if args.renew_deadline.saturating_add(std::time::Duration::from_secs(1)) > args.lease_duration {
                eprintln!(
                    "error: --renew-deadline ({:?}) must be at least 1s shorter than --lease-duration ({:?}): a replica must stop working in a shard before a peer may take it",
                    args.renew_deadline, args.lease_duration
                );
                return ExitCode::FAILURE;
            }
            let retry = std::time::Duration::from_millis(100)..=std::time::Duration::from_secs(300);
            if !retry.contains(&args.shard_retry_period) {
                eprintln!("error: --shard-retry-period ({:?}) must be between 100ms and 5m", args.shard_retry_period);
                return ExitCode::FAILURE;
            }
            if args.stuck_after < args.request_timeout * 2 {
                eprintln!(
                    "error: --stuck-after ({:?}) must be at least twice --request-timeout ({:?}): a replica is judged stuck only when its requests stay unanswered well past their own deadline",
                    args.stuck_after, args.request_timeout
                );
                return ExitCode::FAILURE;
            }
            let runtime = match runtime(true) {
                Ok(rt) => rt,
                Err(message) => {
                    eprintln!("{message}");
                    return ExitCode::FAILURE;
                }
            };
            let code = runtime.block_on(async move {
                let _telemetry = match flotilla::telemetry::logging::init(args.log_json, "flotilla") {
                    Ok(g) => g,
                    Err(e) => {
                        eprintln!("error: {e}");
                        return ExitCode::FAILURE;
                    }
                };
                let settings = flotilla::operator::Settings {
                    kubeconfig: args.kubeconfig,
                    namespace: args.namespace,
                    admin_addr: args.admin_addr,
                    replica_id: replica_id(args.replica_id),
                    sharding: flotilla::sharding::manager::ShardSettings {
                        shards: args.shards,
                        lease_duration: args.lease_duration,
                        renew_deadline: args.renew_deadline,
                        budget: match args.memory_budget {
                            Some(u64::MAX) => None,
                            Some(bytes) => Some(budget::Budget::from_bytes(bytes)),
                            None => budget::default_bytes(budget::container_limit()).map(budget::Budget::from_bytes),
                        },
                        renew_interval: (args.lease_duration / 3)
                            .min(args.renew_deadline / 2)
                            .max(std::time::Duration::from_millis(100)),
                        retry_period: args.shard_retry_period,
                    },
                    prometheus_url: args.prometheus_url,
                    analysis_limits: flotilla::rollout::AnalysisLimits {
                        per_replica: usize::from(args.analysis_concurrency),
                        per_tenant: usize::from(args.analysis_concurrency_per_tenant),
                        min_interval: args.analysis_min_interval,
                        query: flotilla::rollout::query_cost::QueryBounds {
                            max_lookback: args.analysis_max_lookback,
                            ..Default::default()
                        },
                    },
                    webhook: args.conversion_webhook.then(|| flotilla::webhook::WebhookSettings {
                        addr: args.webhook_addr,
                        url: args.webhook_url,
                        namespace: args.operator_namespace.clone(),
                        secret: args.webhook_secret,
                        check_every: std::time::Duration::from_secs(60),
                    }),
                    protocol: if args.api_http2 {
                        flotilla::operator::clients::Protocol::Http2
                    } else {
                        flotilla::operator::clients::Protocol::Http1
                    },
                    namespaces_per_connection: usize::from(args.namespaces_per_connection),
                    max_requests_in_flight: usize::from(args.max_requests_in_flight),
                    reconciles_per_namespace: args.reconciles_per_namespace,
                    request_timeout: args.request_timeout,
                    stuck_after: args.stuck_after,
                    shutdown_grace: args.shutdown_grace,
                    heap_trim_interval: args.heap_trim_interval,
                    pod_policy: flotilla::app::pod_policy::PodPolicy::new(&args.denied_pod_annotation_prefixes),
                    workload_url: args.workload_api_url,
                    admission_policy_check: args.admission_policy_check,
                    identity: flotilla::tenancy::OperatorIdentity {
                        namespace: args.operator_namespace,
                        service_account: args.service_account,
                    },
                    // The namespaces every tenant's NetworkPolicy admits are the platform's: no
                    // Tenant may claim one (were it not created yet, a tenant could take the
                    // name and be admitted everywhere).
                    protection: flotilla::tenancy::claim::Protection {
                        names: args
                            .protected_namespaces
                            .into_iter()
                            .chain(args.network_policy_allowed_namespaces.iter().cloned())
                            .chain(args.network_policy_egress_denied_namespaces.iter().cloned())
                            .collect(),
                        labels: args.protected_namespace_labels,
                    },
                    network_allowed_namespaces: args.network_policy_allowed_namespaces,
                    network_egress: (!args.network_policy_egress_denied_namespaces.is_empty()).then_some(
                        flotilla::tenancy::desired::EgressPolicy {
                            denied_namespaces: args.network_policy_egress_denied_namespaces,
                            cluster_cidrs: args.network_policy_cluster_cidrs,
                        },
                    ),
                };
                match flotilla::operator::run(settings).await {
                    Ok(()) => ExitCode::SUCCESS,
                    Err(e) => {
                        tracing::error!(error = %e, "operator failed");
                        eprintln!("error: {e}");
                        ExitCode::FAILURE
                    }
                }
            });
            // Whatever is still running (a task past the shutdown grace, a blocking DNS lookup)
            // must not keep the process alive.
            runtime.shutdown_timeout(std::time::Duration::from_secs(1));
            code
        }
    }
}
