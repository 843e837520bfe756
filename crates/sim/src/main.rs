#![forbid(unsafe_code)]
//! `gpu-defrag-sim`: synthetic clusters, trace scenarios and benchmarks.
use std::path::PathBuf;
use std::time::Instant;

use clap::{Parser, Subcommand};
use gpu_defrag_core::{frag, ingest, policy::Policy, snapshot};

mod bench;
mod cputime;
mod exact;
mod matrix;
mod plot;
mod replay;
mod scale;
mod scenario;
mod services;
mod synth;
mod trace;

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "gpu-defrag-sim",
    version,
    about = "Simulator and benchmarks for gpu-defrag"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(clap::Args, Clone)]
struct SynthArgs {
    /// Nodes.
    #[arg(long, default_value_t = 16)]
    nodes: usize,
    /// GPUs per node.
    #[arg(long, default_value_t = 8)]
    gpus_per_node: u32,
    /// Pods to place.
    #[arg(long, default_value_t = 80)]
    pods: usize,
    /// Random seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Share of nodes using HAMi GPU sharing (0..1).
    #[arg(long, default_value_t = 0.5)]
    shared_nodes: f64,
}

impl SynthArgs {
    fn params(&self) -> synth::SynthParams {
        synth::SynthParams {
            nodes: self.nodes,
            gpus_per_node: self.gpus_per_node,
            pods: self.pods,
            seed: self.seed,
            shared_nodes: self.shared_nodes.clamp(0.0, 1.0),
            ..Default::default()
        }
    }
}

/// Output format of `replay`.
#[derive(clap::ValueEnum, Clone, Copy, PartialEq, Eq)]
enum ReplayOutput {
    /// JSON document.
    Json,
    /// Table for people, one row per run.
    Table,
    /// Markdown: medians over seeds per workload and planner.
    Markdown,
}

/// Output format of `exact`.
#[derive(clap::ValueEnum, Clone, Copy, PartialEq, Eq)]
enum ExactOutput {
    /// JSON document: every instance.
    Json,
    /// Markdown: share of the optimum per workload and planner.
    Markdown,
}

/// Output format.
#[derive(clap::ValueEnum, Clone, Copy, PartialEq, Eq)]
enum Output {
    /// JSON document.
    Json,
    /// Table for people.
    Table,
}

/// How a trace scenario is fragmented, and the budget and baseline setting every
/// planner gets (`bench`, `matrix`, `exact`).
#[derive(clap::Args, Clone, Copy, Debug)]
struct ScenarioArgs {
    /// Requested GPU to reach before departures (fraction of capacity).
    #[arg(long, default_value_t = 0.9)]
    load: f64,
    /// Fraction of placed pods that leave.
    #[arg(long, default_value_t = 0.3)]
    departures: f64,
    /// Eviction budget: fraction of bound GPU pods.
    #[arg(long, default_value_t = 0.05)]
    budget: f64,
    /// HighNodeUtilization `nvidia.com/gpu` threshold, percent.
    #[arg(long, default_value_t = 50.0)]
    hnu_threshold: f64,
}

/// The trace directory of the subcommands that point at `bench` for it.
#[derive(clap::Args, Clone, Debug)]
struct TraceArg {
    /// Trace CSV directory (as for `bench`).
    #[arg(long)]
    trace: Option<PathBuf>,
}

impl TraceArg {
    /// The trace directory: `--trace`, or the default found by [`trace::resolve_dir`].
    fn dir(&self) -> PathBuf {
        trace::resolve_dir(self.trace.as_deref())
    }
}

#[derive(Subcommand)]
enum Cmd {
    /// Build a fragmented cluster from the Alibaba trace and run every planner on it
    /// with the same eviction budget.
    Bench(BenchCmd),
    /// Run the benchmark matrix (workloads × seeds) and print the medians as Markdown.
    Matrix(MatrixCmd),
    /// Churn replay over days: seeded Poisson arrivals of the trace's pods on its GPU
    /// nodes, a queueing bin-packing scheduler, a descheduler once per maintenance window
    /// opening; queueing delay per shape class, allocation ratio, evictions.
    Replay(ReplayCmd),
    /// Time the planner on a large synthetic cluster built directly as a model.
    Scale(ScaleCmd),
    /// Write a synthetic fragmented cluster snapshot (a v1 List, JSON) to stdout or a file.
    Gen {
        #[command(flatten)]
        synth: SynthArgs,
        /// Output file (default: stdout).
        #[arg(short = 'f', long)]
        file: Option<PathBuf>,
    },
    /// The exact optimum on trace sub-clusters (a MILP solved with HiGHS; needs a build
    /// with `--features exact`): every planner's share of it, and the bench's bound.
    Exact(ExactCmd),
    /// Benchmark `report`: load (parse + normalise) and metric time on a synthetic cluster.
    ReportBench {
        #[command(flatten)]
        synth: SynthArgs,
        /// Repetitions of the metric computation (the median is printed).
        #[arg(long, default_value_t = 5)]
        reps: usize,
    },
}

/// Arguments of `bench`.
#[derive(clap::Args)]
struct BenchCmd {
    /// Trace CSV directory (default: ../shared/data/alibaba-gpu-v2023/csv relative to
    /// the current directory or to the workspace of this executable).
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Pod list: default, gpushare40, multigpu30, …
    #[arg(long, default_value = "default")]
    workload: String,
    /// Random seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[command(flatten)]
    scenario: ScenarioArgs,
    /// Planners to run (comma-separated; default: all).
    #[arg(long, value_delimiter = ',')]
    planners: Vec<String>,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
    output: Output,
}

/// Arguments of `matrix`.
#[derive(clap::Args)]
struct MatrixCmd {
    #[command(flatten)]
    trace: TraceArg,
    /// Workloads (comma-separated).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "default,gpushare40,gpushare80,multigpu30,multigpu50"
    )]
    workloads: Vec<String>,
    /// Seeds 1..=N.
    #[arg(long, default_value_t = 10)]
    seeds: u64,
    #[command(flatten)]
    scenario: ScenarioArgs,
    /// Also write every run's JSON lines to this file.
    #[arg(long)]
    raw: Option<PathBuf>,
    /// Weights of an 8-GPU shape added to gpu-defrag's policy (comma-separated): one
    /// more run each, and a table of fragment drop against free 8-GPU nodes.
    #[arg(long, value_delimiter = ',')]
    whole_node_weights: Vec<f64>,
}

/// Arguments of `replay`.
#[derive(clap::Args)]
struct ReplayCmd {
    #[command(flatten)]
    trace: TraceArg,
    /// Pod lists (comma-separated): default, gpushare40, multigpu50, …
    #[arg(long, value_delimiter = ',', default_value = "default")]
    workload: Vec<String>,
    /// Seeds (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1")]
    seed: Vec<u64>,
    /// Simulated days (warm-up included).
    #[arg(long, default_value_t = 14.0)]
    days: f64,
    /// Warm-up days, not measured.
    #[arg(long, default_value_t = 1.0)]
    warmup_days: f64,
    /// Offered GPU load: fraction of capacity the arrivals ask for on average.
    #[arg(long, default_value_t = 0.9)]
    load: f64,
    /// Maintenance window schedule (cron, UTC); repeat for several.
    #[arg(long = "window", default_value = "0 2 * * *")]
    windows: Vec<String>,
    /// Window length, hours.
    #[arg(long, default_value_t = 3.0)]
    window_hours: f64,
    /// Eviction budget per run: fraction of running GPU pods.
    #[arg(long, default_value_t = 0.05)]
    budget: f64,
    /// Lifetimes drawn from the trace are capped at this, hours.
    #[arg(long, default_value_t = 168.0)]
    max_lifetime_hours: f64,
    /// HighNodeUtilization `nvidia.com/gpu` threshold, percent.
    #[arg(long, default_value_t = 50.0)]
    hnu_threshold: f64,
    /// gpu-defrag's `safety.maxPendingGpuPods` (policy default 5): a run stops before
    /// its next eviction when more GPU pods created since it started are pending,
    /// beyond its replacements in flight.
    #[arg(long, default_value_t = 5)]
    max_pending_gpu_pods: u32,
    /// gpu-defrag: seconds from a replacement's binding to its being Ready (with
    /// `maxInFlight: 1`, the time per eviction of a run).
    #[arg(long, default_value_t = 30.0)]
    ready_seconds: f64,
    /// Share of the offered GPU load that is long-running inference services (run
    /// for the whole replay, replicas scaled daily, shares and one-GPU shapes); the
    /// trace's jobs offer the rest.
    #[arg(long, default_value_t = 0.0)]
    services: f64,
    /// Draw allocation ratio and the 8-GPU queue over time for every planner of the
    /// first workload and seed into this PNG file.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Planners (comma-separated; default: all).
    #[arg(long, value_delimiter = ',')]
    planners: Vec<String>,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = ReplayOutput::Table)]
    output: ReplayOutput,
    /// Also write the JSON document to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// Arguments of `scale`.
#[derive(clap::Args)]
struct ScaleCmd {
    /// Nodes.
    #[arg(long, default_value_t = 10_000)]
    nodes: usize,
    /// GPUs per node.
    #[arg(long, default_value_t = 8)]
    gpus_per_node: u32,
    /// Pods.
    #[arg(long, default_value_t = 200_000)]
    pods: usize,
    /// Seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Share of nodes with GPU sharing (0..1).
    #[arg(long, default_value_t = 0.8)]
    shared_nodes: f64,
    /// Eviction budget per run.
    #[arg(long, default_value_t = 100)]
    max_evictions: u32,
    /// Repetitions (the median is printed).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Json)]
    output: Output,
}

/// Arguments of `exact`.
#[derive(clap::Args)]
struct ExactCmd {
    #[command(flatten)]
    trace: TraceArg,
    /// Workloads (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "default")]
    workloads: Vec<String>,
    /// Seeds: a range `A..B` (both included) or a comma-separated list.
    #[arg(long, default_value = "1..10")]
    seeds: String,
    /// Trace nodes per sub-cluster (drawn at random, seeded).
    #[arg(long, default_value_t = 40)]
    nodes: usize,
    #[command(flatten)]
    scenario: ScenarioArgs,
    /// Least eviction budget (with `--budget`).
    #[arg(long, default_value_t = 3)]
    min_budget: usize,
    /// HiGHS time limit per instance, seconds (an instance that hits it is reported
    /// as not proved optimal, with the solver's upper limit).
    #[arg(long, default_value_t = 60.0)]
    time_limit: f64,
    /// Share of the optimum gpu-defrag with landing control (landing as planned)
    /// should reach, median per workload (the verdict; it must also beat the
    /// scheduler's landing).
    #[arg(long, default_value_t = 0.90)]
    target: f64,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = ExactOutput::Markdown)]
    output: ExactOutput,
    /// Also write the per-instance JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().cmd {
        Cmd::Bench(a) => run_bench(a),
        Cmd::Matrix(a) => run_matrix(a),
        Cmd::Replay(a) => run_replay(a),
        Cmd::Scale(a) => run_scale(a),
        Cmd::Exact(a) => run_exact(a),
        Cmd::Gen { synth, file } => run_gen(&synth, file),
        Cmd::ReportBench { synth, reps } => run_report_bench(&synth, reps),
    }
}

/// `matrix`: runs the matrix and prints its Markdown.
fn run_matrix(a: MatrixCmd) -> anyhow::Result<()> {
    let md = matrix::run(&matrix::MatrixArgs {
        dir: a.trace.dir(),
        workloads: a.workloads,
        seeds: a.seeds,
        scenario: a.scenario,
        raw: a.raw,
        whole_node_weights: a.whole_node_weights,
    })?;
    print!("{md}");
    Ok(())
}

/// `replay`: runs every (workload, seed, planner) and prints the report.
fn run_replay(a: ReplayCmd) -> anyhow::Result<()> {
    anyhow::ensure!(
        (0.0..1.0).contains(&a.services),
        "--services must be in [0, 1)"
    );
    let out = replay::run_all(&replay::Args {
        dir: a.trace.dir(),
        workloads: a.workload,
        seeds: a.seed,
        params: replay::Params {
            workload: String::new(),
            seed: 0,
            days: a.days,
            warmup_days: a.warmup_days,
            load: a.load,
            windows: a.windows,
            window_hours: a.window_hours,
            budget: a.budget,
            max_lifetime_hours: a.max_lifetime_hours,
            hnu_threshold: a.hnu_threshold,
            max_pending_gpu_pods: a.max_pending_gpu_pods,
            ready_seconds: a.ready_seconds,
            services: a.services,
        },
        planners: a.planners,
        plot: a.plot,
    })?;
    if let Some(f) = a.json {
        std::fs::write(f, serde_json::to_string_pretty(&out)?)?;
    }
    match a.output {
        ReplayOutput::Json => println!("{}", serde_json::to_string_pretty(&out)?),
        ReplayOutput::Table => print!("{}", replay::table(&out)),
        ReplayOutput::Markdown => print!("{}", replay::markdown(&out)),
    }
    Ok(())
}

/// `scale`: builds the synthetic cluster, times the planner on it and prints the
/// figures.
fn run_scale(a: ScaleCmd) -> anyhow::Result<()> {
    let t0 = Instant::now();
    let c = scale::build(&scale::ScaleParams {
        nodes: a.nodes,
        gpus_per_node: a.gpus_per_node,
        pods: a.pods,
        seed: a.seed,
        shared_nodes: a.shared_nodes,
    });
    let build_s = t0.elapsed().as_secs_f64();
    let policy = bench::bench_policy(Vec::new(), a.max_evictions);
    let (times, cpu_times, p) = time_plans(&c, &policy, a.reps);
    let out = serde_json::json!({
        "nodes": c.nodes.len(),
        "gpus": c.nodes.iter().map(|n| n.gpus.len()).sum::<usize>(),
        "pods": c.pods.len(),
        "boundPods": c.pods.iter().filter(|p| p.node.is_some()).count(),
        "buildSeconds": build_s,
        "maxEvictions": a.max_evictions,
        "evictions": p.moves.len(),
        "batches": p.batches.len(),
        "fragmentRateBefore": p.before.fragment_rate,
        "fragmentRateExpectedAfter": p.after.fragment_rate,
        "planMillis": times[times.len() / 2],
        "planMillisAll": times,
        "planCpuMillis": cpu_times[cpu_times.len() / 2],
    });
    match a.output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&out)?),
        Output::Table => {
            for (k, v) in out.as_object().expect("object") {
                println!("{k:<28} {v}");
            }
        }
    }
    Ok(())
}

/// Plans `reps` times (at least once): the wall and CPU milliseconds of each, sorted,
/// and the last plan.
fn time_plans(
    c: &gpu_defrag_core::model::Cluster,
    policy: &Policy,
    reps: usize,
) -> (Vec<f64>, Vec<f64>, gpu_defrag_core::plan::Plan) {
    let mut times = Vec::new();
    let mut cpu_times = Vec::new();
    let mut last = None;
    for _ in 0..reps.max(1) {
        let t = cputime::Timer::start();
        let p = gpu_defrag_core::plan::plan(c, policy, None, &Default::default());
        let (wall, cpu) = t.stop();
        times.push(wall * 1000.0);
        cpu_times.push(cpu * 1000.0);
        last = Some(p);
    }
    times.sort_by(f64::total_cmp);
    cpu_times.sort_by(f64::total_cmp);
    (times, cpu_times, last.expect("one repetition"))
}

/// `exact`: solves every instance and prints the report (JSON or Markdown).
fn run_exact(a: ExactCmd) -> anyhow::Result<()> {
    if !cfg!(feature = "exact") {
        anyhow::bail!("{}", exact::NO_SOLVER);
    }
    let results = exact::run(&exact::ExactArgs {
        dir: a.trace.dir(),
        workloads: a.workloads,
        seeds: parse_seeds(&a.seeds)?,
        nodes: a.nodes,
        scenario: a.scenario,
        min_budget: a.min_budget,
        time_limit: a.time_limit,
    })?;
    let doc = serde_json::to_string_pretty(&results)?;
    if let Some(f) = a.json {
        std::fs::write(f, &doc)?;
    }
    match a.output {
        ExactOutput::Json => println!("{doc}"),
        ExactOutput::Markdown => print!("{}", exact::markdown(&results, a.target)?),
    }
    Ok(())
}

/// `gen`: writes the synthetic snapshot to `file` or stdout.
fn run_gen(synth: &SynthArgs, file: Option<PathBuf>) -> anyhow::Result<()> {
    let objs = synth::generate(&synth.params());
    let text = serde_json::to_string(&synth::to_list_json(&objs))?;
    match file {
        Some(f) => std::fs::write(f, text)?,
        None => println!("{text}"),
    }
    Ok(())
}

/// `report-bench`: times loading a synthetic snapshot and computing its report.
fn run_report_bench(synth: &SynthArgs, reps: usize) -> anyhow::Result<()> {
    let t0 = Instant::now();
    let objs = synth::generate(&synth.params());
    let text = serde_json::to_string(&synth::to_list_json(&objs))?;
    let gen_s = t0.elapsed().as_secs_f64();
    drop(objs);
    let t1 = cputime::Timer::start();
    let objs = snapshot::parse(&text)?;
    let (parse_s, parse_cpu) = t1.stop();
    let t2 = cputime::Timer::start();
    let cluster = ingest::build_cluster(&objs, None);
    let (ingest_s, ingest_cpu) = t2.stop();
    let policy = Policy::default();
    let mut times = Vec::new();
    let mut report = None;
    for _ in 0..reps.max(1) {
        let t = cputime::Timer::start();
        report = Some(frag::report(&cluster, &policy));
        times.push(t.stop());
    }
    times.sort_by(|a, b| a.1.total_cmp(&b.1));
    let (metric_s, metric_cpu) = times[times.len() / 2];
    let r = report.expect("at least one repetition");
    let out = serde_json::json!({
        "nodes": cluster.nodes.len(),
        "gpus": r.gpus,
        "pods": cluster.pods.len(),
        "snapshotBytes": text.len(),
        "generateSeconds": gen_s,
        "parseSeconds": parse_s,
        "normaliseSeconds": ingest_s,
        "loadSeconds": parse_s + ingest_s,
        "metricSeconds": metric_s,
        "cpuSeconds": {
            "parse": parse_cpu,
            "normalise": ingest_cpu,
            "load": parse_cpu + ingest_cpu,
            "metric": metric_cpu,
        },
        "fragmentRate": r.fragment_rate,
        "unknownPods": r.unknown_pods,
    });
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}

/// Seeds from `A..B` (both included) or `a,b,c`.
fn parse_seeds(s: &str) -> anyhow::Result<Vec<u64>> {
    use anyhow::Context as _;
    let seeds: Vec<u64> = if let Some((a, b)) = s.split_once("..") {
        let a: u64 = a.trim().parse().with_context(|| format!("seeds {s:?}"))?;
        let b: u64 = b.trim().parse().with_context(|| format!("seeds {s:?}"))?;
        (a..=b).collect()
    } else {
        s.split(',')
            .map(|x| x.trim().parse().with_context(|| format!("seeds {s:?}")))
            .collect::<anyhow::Result<_>>()?
    };
    anyhow::ensure!(!seeds.is_empty(), "seeds {s:?}: none");
    Ok(seeds)
}

/// `bench`: builds the scenario, runs every planner on it and prints the results.
fn run_bench(a: BenchCmd) -> anyhow::Result<()> {
    let sc = a.scenario;
    let dir = trace::resolve_dir(a.trace.as_deref());
    let t0 = Instant::now();
    let tr = trace::load(&dir, &a.workload)?;
    let params = scenario::Params {
        workload: a.workload.clone(),
        seed: a.seed,
        load: sc.load,
        departures: sc.departures,
    };
    let (cluster, summary) = scenario::build(&tr, &params);
    eprintln!(
        "scenario {} seed {}: {} nodes, {} GPUs, {} pods bound ({:.2}s)",
        a.workload,
        a.seed,
        summary.nodes,
        summary.gpus,
        summary.bound_pods,
        t0.elapsed().as_secs_f64()
    );
    let shapes = frag::default_shapes(&cluster, &Default::default());
    let budget = bench::budget_of(&cluster, sc.budget);
    let policy = bench::bench_policy(shapes.clone(), budget as u32);
    let bound = bench::bound(&cluster, &shapes, budget);
    let names: Vec<String> = if a.planners.is_empty() {
        bench::PLANNERS.iter().map(|s| s.to_string()).collect()
    } else {
        a.planners.clone()
    };
    let mut results = Vec::new();
    for (i, name) in names.iter().enumerate() {
        eprint!("[{}/{}] {name} … ", i + 1, names.len());
        let r = bench::run(name, &cluster, &policy, budget, sc.hnu_threshold)?;
        eprintln!("{} evictions, {:.1} ms", r.evictions, r.plan_millis);
        results.push(r);
    }
    match a.output {
        Output::Json => {
            let out = serde_json::json!({
                "scenario": {
                    "workload": a.workload,
                    "seed": a.seed,
                    "load": sc.load,
                    "departures": sc.departures,
                    "budgetFraction": sc.budget,
                    "budget": budget,
                    "hnuThresholdPercent": sc.hnu_threshold,
                    "trace": dir.display().to_string(),
                    "summary": summary,
                    "targetShapes": shapes,
                },
                "bound": bound,
                "results": results,
            });
            println!("{}", serde_json::to_string_pretty(&out)?);
        }
        Output::Table => print_bench_table(&a, &summary, budget, &bound, &results),
    }
    Ok(())
}

/// The `bench` results as a table for people.
fn print_bench_table(
    a: &BenchCmd,
    summary: &scenario::Summary,
    budget: usize,
    bound: &bench::Bound,
    results: &[bench::Result],
) {
    println!(
        "workload {} seed {}: {} nodes, {} GPUs, {} pods bound, load {:.3} → {:.3}, budget {} evictions",
        a.workload,
        a.seed,
        summary.nodes,
        summary.gpus,
        summary.bound_pods,
        summary.load_reached,
        summary.load_after_departures,
        budget
    );
    println!(
        "{:<22} {:>5} {:>15} {:>13} {:>13} {:>9} {:>9} {:>9}",
        "PLANNER", "EVICT", "FRAG RATE", "FREE GPUS", "FREE 8-NODES", "DROP", "PENDING", "PLAN MS"
    );
    for r in results {
        println!(
            "{:<22} {:>5} {:>6.4}→{:<6.4} {:>6}→{:<6} {:>6}→{:<6} {:>9.4} {:>9} {:>9.1}",
            r.planner,
            r.evictions,
            r.fragment_rate_before,
            r.fragment_rate_after,
            r.fully_free_gpus_before,
            r.fully_free_gpus_after,
            r.fully_free8_gpu_nodes_before,
            r.fully_free8_gpu_nodes_after,
            r.fragment_rate_before - r.fragment_rate_after,
            r.pending_after,
            r.plan_millis
        );
    }
    println!(
        "{:<22} {:>5} {:>6}≥{:<6.4} {:>6}≤{:<6} {:>6}≤{:<6}",
        "bound",
        budget,
        "",
        bound.fragment_rate_after_min,
        "",
        bound.fully_free_gpus_after_max,
        "",
        bound.fully_free8_gpu_nodes_after_max
    );
}
