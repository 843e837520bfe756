//! The command line: `gpu-defrag report | plan | status | run | crd` (also as the kubectl
//! plugin `kubectl gpu-defrag`).
use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};
use gpu_defrag_core::{frag, ingest, policy::Policy};

use crate::{apiclient, controller, http, idle, input, lease, metrics, render};

#[derive(Parser)]
#[command(
    name = "gpu-defrag",
    version,
    about = "GPU defragmentation descheduler for Kubernetes"
)]
pub struct Cli {
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Output {
    Table,
    Json,
}

/// How `gpu-defrag run` writes its log.
#[derive(Clone, Copy, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Where landing control keeps its ConfigMap (docs/operator.md#landing-control).
#[derive(clap::Args, Debug)]
pub struct LandingArgs {
    /// Namespace of the landing-control ConfigMap: the one the MutatingAdmissionPolicy
    /// binding of config/landing reads (`paramRef.namespace`).
    #[arg(long, env = "POD_NAMESPACE", default_value = "gpu-defrag-system")]
    pub landing_namespace: String,
    /// Name of the landing-control ConfigMap; also the value of the
    /// `gpu-defrag.io/landing` label on the pods it holds. One per operator install.
    #[arg(long, default_value = "gpu-defrag-landing")]
    pub landing_configmap: String,
}

#[derive(Subcommand)]
pub enum Cmd {
    /// Print the DefragPolicy CRD as YAML.
    Crd {
        /// Print the field reference of the CRD (Markdown) instead.
        #[arg(long)]
        reference: bool,
    },
    /// Measure GPU fragmentation of a snapshot file or of the live cluster (read-only).
    Report {
        /// A DefragPolicy of the cluster whose nodeSelector, namespaces and target shapes
        /// apply (instead of --policy FILE).
        #[arg(value_name = "POLICY", conflicts_with = "policy")]
        policy_name: Option<String>,
        /// A `v1` List (YAML or JSON) as `kubectl get nodes,pods,pdb -A -o yaml` prints it.
        /// Without it, the cluster of the current kubeconfig context is read.
        #[arg(long)]
        snapshot: Option<PathBuf>,
        /// A DefragPolicy YAML: its nodeSelector, namespaces and target shapes apply.
        #[arg(long)]
        policy: Option<PathBuf>,
        /// Output format.
        #[arg(short = 'o', long, value_enum, default_value = "table")]
        output: Output,
        /// Heatmap rows at most (table output).
        #[arg(long, default_value_t = 40)]
        max_rows: usize,
        /// The instant pod and node ages are measured at (RFC 3339); default now. A
        /// snapshot is judged as the operator would judge its objects at that instant.
        #[arg(long, value_name = "RFC3339", value_parser = parse_now)]
        now: Option<chrono::DateTime<chrono::Utc>>,
        #[command(flatten)]
        kube: input::KubeArgs,
    },
    /// Run the operator: reconcile DefragPolicies (kubeconfig or in-cluster config).
    Run {
        /// Address of /metrics, /healthz and /readyz.
        #[arg(long, default_value = "127.0.0.1:8080")]
        metrics_addr: std::net::SocketAddr,
        /// Elect a leader through a Lease (only the leader writes status or evicts). On by
        /// default, so that a second process (started by hand beside the Deployment) only
        /// stands by; `--leader-elect=false` only where no other replica can ever run.
        #[arg(long, default_value_t = true, num_args = 0..=1, require_equals = true,
              default_missing_value = "true", action = clap::ArgAction::Set)]
        leader_elect: bool,
        /// Namespace of the Lease.
        #[arg(long, env = "POD_NAMESPACE", default_value = "gpu-defrag-system")]
        lease_namespace: String,
        /// Name of the Lease.
        #[arg(long, default_value = "gpu-defrag-leader")]
        lease_name: String,
        #[command(flatten)]
        landing: Box<LandingArgs>,
        /// Identity of this replica (defaults to the pod name or host name).
        #[arg(long, env = "POD_NAME")]
        identity: Option<String>,
        /// Lease duration in seconds.
        #[arg(long, default_value_t = 15)]
        lease_duration: u64,
        /// Only reconcile DefragPolicies matching this label selector (e.g. one operator
        /// per team, or isolated tests). Empty: all.
        #[arg(long, default_value = "")]
        policy_selector: String,
        /// Also export `gpu_defrag_gpu_used_milli{node,gpu}`: one series per GPU of the
        /// cluster, for per-GPU heatmaps (cardinality grows with the GPU count).
        #[arg(long, env = "GPU_DEFRAG_METRICS_PER_GPU", default_value_t = false)]
        metrics_per_gpu: bool,
        #[command(flatten)]
        idle: idle::IdleArgs,
        /// Client-side rate limit: average requests per second to the API server (as
        /// client-go's QPS); 0 turns the limiter off.
        #[arg(long, default_value_t = 50.0)]
        kube_qps: f64,
        /// Client-side rate limit: requests allowed at once above the average (client-go's
        /// Burst).
        #[arg(long, default_value_t = 100)]
        kube_burst: u32,
        /// Log lines as text, or as one JSON object per line (for log collectors).
        #[arg(long, value_enum, default_value = "text")]
        log_format: LogFormat,
    },
    /// Plan migrations for a snapshot and a policy: report before, the moves, report after.
    /// Only computes: nothing is evicted, tainted or written.
    Plan {
        /// A DefragPolicy of the cluster to plan with (instead of --policy FILE).
        #[arg(value_name = "POLICY", conflicts_with = "policy")]
        policy_name: Option<String>,
        /// A `v1` List (YAML or JSON). Without it, the live cluster (read-only).
        #[arg(long)]
        snapshot: Option<PathBuf>,
        /// A DefragPolicy YAML (limits, safety, shapes, scope).
        #[arg(long)]
        policy: Option<PathBuf>,
        /// Output format.
        #[arg(short = 'o', long, value_enum, default_value = "table")]
        output: Output,
        /// The instant pod and node ages are measured at (RFC 3339); default now. A
        /// snapshot is judged as the operator would judge its objects at that instant.
        #[arg(long, value_name = "RFC3339", value_parser = parse_now)]
        now: Option<chrono::DateTime<chrono::Utc>>,
        /// Preview the demand run for this pending pod (and its gang's pending members):
        /// the evictions that would make room for it, its room, or why none can be made.
        #[arg(long = "for", value_name = "NS/POD")]
        for_pod: Option<String>,
        #[command(flatten)]
        kube: input::KubeArgs,
    },
    /// Show what the operator measured, planned and did: the status of every DefragPolicy,
    /// or in detail of one (read-only).
    Status {
        /// The DefragPolicy to show in detail. Without it, one line per policy.
        #[arg(value_name = "POLICY")]
        name: Option<String>,
        /// Output format: `json` prints the raw status (of POLICY, or an object of all
        /// statuses by policy name).
        #[arg(short = 'o', long, value_enum, default_value = "table")]
        output: Output,
        #[command(flatten)]
        kube: input::KubeArgs,
    },
}

/// Runs a command; `as_plugin`: invoked as `kubectl gpu-defrag`, which only reads (it
/// refuses `run`: an operator started from a laptop would be a second evictor).
pub fn run(cli: Cli, as_plugin: bool) -> anyhow::Result<()> {
    if as_plugin && matches!(cli.cmd, Cmd::Run { .. }) {
        return Err(input::InputError(
            "the kubectl plugin only reads: the operator runs as its Deployment (config/default), or as `gpu-defrag run`".into(),
        )
        .into());
    }
    match cli.cmd {
        Cmd::Run {
            metrics_addr,
            leader_elect,
            lease_namespace,
            lease_name,
            landing,
            identity,
            lease_duration,
            policy_selector,
            idle,
            metrics_per_gpu,
            kube_qps,
            kube_burst,
            log_format,
        } => {
            let idle = check_run_args(kube_qps, &idle, &landing)?;
            init_logs(log_format);
            let identity = identity
                .or_else(|| std::env::var("HOSTNAME").ok())
                .unwrap_or_else(|| format!("gpu-defrag-{}", std::process::id()));
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?;
            rt.block_on(async move {
                let limit = apiclient::RateLimit {
                    qps: kube_qps,
                    burst: kube_burst.max(1),
                };
                let client = run_client(&input::KubeArgs::default(), limit).await?;
                let metrics = metrics::Metrics::with_per_gpu(metrics_per_gpu);
                let ready = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
                let (leader, elector) = if leader_elect {
                    start_leader_election(
                        &client,
                        &metrics,
                        &lease_namespace,
                        &lease_name,
                        lease_duration,
                        &identity,
                    )
                } else {
                    metrics.set_leader(true);
                    (lease::LeaderState::always(), None)
                };
                tokio::spawn(http::serve(metrics_addr, metrics.clone(), ready.clone()));
                let result = controller::run(
                    client,
                    metrics,
                    leader,
                    ready,
                    controller::RunOptions {
                        identity,
                        policy_selector,
                        idle: idle.map(idle::IdleSource::new),
                        landing_namespace: landing.landing_namespace,
                        landing_configmap: landing.landing_configmap,
                    },
                )
                .await;
                // On shutdown, hand the lease over at once instead of letting it expire.
                if let Some(e) = elector {
                    e.release().await;
                }
                result
            })?;
        }
        Cmd::Crd { reference: false } => print!("{}", gpu_defrag_api::crd_yaml()),
        Cmd::Crd { reference: true } => print!("{}", gpu_defrag_api::crd_reference()),
        Cmd::Report {
            policy_name,
            snapshot,
            policy,
            output,
            max_rows,
            now,
            kube,
        } => {
            let (cluster, policy, _) = load_inputs(snapshot, policy, policy_name, now, &kube)?;
            print_report(&frag::report(&cluster, &policy), output, max_rows)?;
        }
        Cmd::Plan {
            policy_name,
            snapshot,
            policy,
            output,
            now,
            for_pod,
            kube,
        } => {
            let (cluster, policy, now) = load_inputs(snapshot, policy, policy_name, now, &kube)?;
            let before = frag::report(&cluster, &policy);
            if let Some(key) = for_pod {
                return demand_preview(&cluster, &policy, now, &key, &before, output);
            }
            print_plan(&cluster, &policy, now, &before, output)?;
        }
        Cmd::Status { name, output, kube } => {
            let objs = block_on(async {
                input::read_policy_objects(client(&kube).await?, name.as_deref()).await
            })?;
            let json = matches!(output, Output::Json);
            print!("{}", render::status(&objs, name.is_some(), json)?);
        }
    }
    Ok(())
}

/// Checks the arguments of `gpu-defrag run` the parser does not (`--kube-qps`, the idle
/// source, `--landing-configmap`); returns the idle source's configuration.
fn check_run_args(
    kube_qps: f64,
    idle: &idle::IdleArgs,
    landing: &LandingArgs,
) -> anyhow::Result<Option<idle::IdleConfig>> {
    if !(kube_qps.is_finite() && kube_qps >= 0.0) {
        return Err(
            input::InputError(format!("--kube-qps must be a number >= 0, not {kube_qps}")).into(),
        );
    }
    let idle = idle.config().map_err(input::InputError)?;
    if !is_dns_label(&landing.landing_configmap) {
        return Err(input::InputError(format!(
            "--landing-configmap must be a DNS label of at most 63 characters, not {:?}",
            landing.landing_configmap
        ))
        .into());
    }
    Ok(idle)
}

/// `s` is a DNS label (RFC 1123) usable as a label value: 1 to 63 lowercase letters,
/// digits and dashes, starting and ending with a letter or digit.
fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && s.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

/// Starts electing a leader through the Lease `lease_namespace/lease_name` (of
/// `lease_duration` seconds) as `identity`; returns the leadership state and the elector
/// (to hand the lease over on shutdown).
fn start_leader_election(
    client: &kube::Client,
    metrics: &metrics::Metrics,
    lease_namespace: &str,
    lease_name: &str,
    lease_duration: u64,
    identity: &str,
) -> (lease::LeaderState, Option<lease::LeaderElector>) {
    let state = lease::LeaderState::default();
    let e = lease::LeaderElector::new(
        client.clone(),
        lease_namespace,
        lease_name,
        identity,
        std::time::Duration::from_secs(lease_duration),
        std::time::Duration::from_secs((lease_duration / 3).max(1)),
    )
    .with_metrics(metrics.clone());
    tokio::spawn(e.clone().run(state.clone()));
    (state, Some(e))
}

/// Prints a fragmentation report (`gpu-defrag report`): as JSON, or the summary and the
/// heatmap of at most `max_rows` rows.
fn print_report(report: &frag::Report, output: Output, max_rows: usize) -> anyhow::Result<()> {
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(report)?),
        Output::Table => {
            print!("{}", render::summary(report));
            println!();
            print!("{}", render::heatmap(report, max_rows));
        }
    }
    Ok(())
}

/// Plans a defragmentation run and prints it (`gpu-defrag plan`): the report `before`,
/// the moves, and the report after them.
fn print_plan(
    cluster: &gpu_defrag_core::model::Cluster,
    policy: &Policy,
    now: Option<chrono::DateTime<chrono::Utc>>,
    before: &frag::Report,
    output: Output,
) -> anyhow::Result<()> {
    let plan = gpu_defrag_core::plan::plan(cluster, policy, now, &Default::default());
    let after_cluster = gpu_defrag_core::plan::apply(cluster, &plan);
    let after = frag::report(&after_cluster, policy);
    match output {
        Output::Json => {
            let v = serde_json::json!({
                "before": before,
                "after": after,
                "moves": plan.moves,
                "batches": plan.batches,
                "evictions": plan.moves.len(),
                "skipped": plan.skipped,
                "skippedPods": plan.skipped_pods,
                "unchecked": plan.unchecked,
                "fencedNodes": plan.fenced_nodes,
                "fencedDevices": plan.fenced_devices,
                "pendingServed": plan.pending_served,
            });
            println!("{}", serde_json::to_string_pretty(&v)?);
        }
        Output::Table => print!("{}", render::plan(before, &after, &plan)),
    }
    Ok(())
}

/// Runs a future on a single-threaded runtime (the CLI commands).
fn block_on<T>(f: impl std::future::Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(f)
}

/// A client from the kubeconfig or in-cluster config. Retries are ours to decide: the
/// client's built-in retry would re-send an eviction refused with 429 (a PDB) for minutes
/// instead of reporting it as blocked.
async fn client(kube: &input::KubeArgs) -> anyhow::Result<kube::Client> {
    let mut config = kube.config().await?;
    config.default_retry = false;
    Ok(kube::Client::try_from(config)?)
}

/// The operator's client: like [`client`], through the rate limit and request accounting
/// of [`apiclient`].
async fn run_client(
    kube: &input::KubeArgs,
    limit: apiclient::RateLimit,
) -> anyhow::Result<kube::Client> {
    let mut config = kube.config().await?;
    config.default_retry = false;
    apiclient::client(config, limit)
}

/// `--now`: an RFC 3339 instant.
fn parse_now(s: &str) -> Result<chrono::DateTime<chrono::Utc>, String> {
    crate::objects::parse_ts(s).ok_or_else(|| format!("{s:?} is not an RFC 3339 time"))
}

/// The cluster model (from a snapshot or the live cluster), the policy (from a file, from
/// the cluster by name, or the defaults) and the instant ages are measured at (`now`, or
/// the current time). Only reads.
fn load_inputs(
    snapshot: Option<PathBuf>,
    policy: Option<PathBuf>,
    policy_name: Option<String>,
    now: Option<chrono::DateTime<chrono::Utc>>,
    kube: &input::KubeArgs,
) -> anyhow::Result<(
    gpu_defrag_core::model::Cluster,
    Policy,
    Option<chrono::DateTime<chrono::Utc>>,
)> {
    let policy = match (policy, policy_name) {
        (Some(p), _) => input::read_policy(&p)?.1,
        (None, Some(name)) => {
            block_on(async { input::read_cluster_policy(client(kube).await?, &name).await })?.1
        }
        (None, None) => Policy::default(),
    };
    let objs = match snapshot {
        Some(path) => input::read_snapshot(&path)?,
        None => block_on(async { input::read_live(client(kube).await?).await })?,
    };
    let now = Some(now.unwrap_or_else(chrono::Utc::now));
    Ok((ingest::build_cluster(&objs, now), policy, now))
}

/// The log of `gpu-defrag run`: `RUST_LOG` filters (default `info,kube=warn`).
fn init_logs(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "info,kube=warn".into());
    let logs = tracing_subscriber::fmt().with_env_filter(filter);
    match format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().init(),
    }
}

/// `plan --for NS/POD`: the demand run the operator would start for the pod now.
fn demand_preview(
    cluster: &gpu_defrag_core::model::Cluster,
    policy: &gpu_defrag_core::policy::Policy,
    now: Option<chrono::DateTime<chrono::Utc>>,
    key: &str,
    before: &frag::Report,
    output: Output,
) -> anyhow::Result<()> {
    use gpu_defrag_core::plan::demand::{DemandLimits, plan_demand, served};
    let Some(pi) = cluster.pods.iter().position(|p| p.key() == key) else {
        anyhow::bail!("pod {key} is not in the cluster (NS/POD)");
    };
    // The operator's own decision first: a pod it would not serve gets no plan.
    let now_or_clock = now.unwrap_or_else(chrono::Utc::now);
    let verdict = match policy.demand {
        None => Err("demand runs are off in this policy (spec.demand is not set)".to_string()),
        Some(d) => {
            let min_wait = chrono::Duration::from_std(d.min_wait).unwrap_or(chrono::Duration::MAX);
            served(cluster, policy, now_or_clock, min_wait, pi)
                .map_err(|why| format!("{} ({})", why, why.code()))
        }
    };
    let served = match verdict {
        Ok(group) => group,
        Err(why) => {
            match output {
                Output::Json => {
                    let v = serde_json::json!({
                        "outcome": "NotServed",
                        "why": why,
                        "evictions": 0,
                        "moves": [],
                    });
                    println!("{}", serde_json::to_string_pretty(&v)?);
                }
                Output::Table => println!("{key} would not be served: {why}"),
            }
            return Ok(());
        }
    };
    let limits = DemandLimits {
        max_evictions: policy
            .demand
            .map_or(DemandLimits::default().max_evictions, |d| d.max_evictions),
        ..DemandLimits::default()
    };
    let d = plan_demand(cluster, policy, now, &Default::default(), &served, &limits);
    let after = frag::report(&gpu_defrag_core::plan::apply(cluster, &d.plan), policy);
    match output {
        Output::Json => {
            let v = serde_json::json!({
                "outcome": d.outcome,
                "why": d.why,
                "rooms": d.rooms,
                "moves": d.plan.moves,
                "evictions": d.plan.moves.len(),
                "fencedNodes": d.plan.fenced_nodes,
                "steps": d.steps,
                "before": before,
                "after": after,
            });
            println!("{}", serde_json::to_string_pretty(&v)?);
        }
        Output::Table => {
            println!("demand run for {key}: {} — {}", d.outcome.as_str(), d.why);
            if !d.plan.moves.is_empty() {
                println!();
                print!("{}", render::plan(before, &after, &d.plan));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plugin_refuses_to_run_the_operator_and_leader_election_is_on_by_default() {
        let cli = Cli::try_parse_from(["gpu-defrag", "run"]).unwrap();
        let Cmd::Run { leader_elect, .. } = &cli.cmd else {
            panic!("not run");
        };
        assert!(*leader_elect, "on unless turned off");
        let e = run(cli, true).unwrap_err();
        assert!(e.downcast_ref::<input::InputError>().is_some(), "{e}");
        assert!(e.to_string().contains("only reads"), "{e}");
        for (args, on) in [
            (&["gpu-defrag", "run", "--leader-elect"][..], true),
            (&["gpu-defrag", "run", "--leader-elect=false"][..], false),
        ] {
            match Cli::try_parse_from(args).unwrap().cmd {
                Cmd::Run { leader_elect, .. } => assert_eq!(leader_elect, on, "{args:?}"),
                _ => panic!("not run"),
            }
        }
    }
}
