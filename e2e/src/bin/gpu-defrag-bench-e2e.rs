//! `gpu-defrag-bench-e2e` (`make bench-e2e`): the real `sigs.k8s.io/descheduler` and
//! gpu-defrag side by side on the real control plane, from the same start state.
//!
//! ```text
//! trace (nodes, pods) ──seed──> start layout: nodes sampled, pods placed by an emulation of
//!                               the bin-packing scheduler, some departed, multi-GPU pods
//!                               that fit nowhere left pending
//! for each contender: fresh control plane ─> nodes ─> PDBs ─> pods bound to the layout's
//!     nodes ─> a ReplicaSet per pod (adopts it) ─> its Deployment (same template: adopts
//!     the ReplicaSet as its current one) ─> pending Deployments ─> measure ─> contender
//!     ─> settle ─> measure
//! ```
//!
//! Every contender gets a fresh control plane built from the same seed: the pods are bound
//! to the nodes the layout says (not left to the scheduler's random tie-breaks), so each
//! run starts from the identical placement; the start-state figures of every run are
//! printed to show it. The descheduler runs once (one pass, then it exits); gpu-defrag runs
//! as `make demo` runs it, with an Enforce policy whose window is open now. Replacements of evicted pods and the pending pods go through the
//! real kube-scheduler (`--scheduler-name`, default `gpu-binpack`, the bin-packing second
//! scheduler the control plane runs beside the stock default one).
#![forbid(unsafe_code)]

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    process::{Command, ExitCode},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, anyhow, bail};
use gpu_defrag_e2e::{
    ClusterOptions, GPU_RESOURCE, GpuNodes, TestCluster,
    fixtures::{create_all, pod_ready, wait_for},
    operator::{create_policy, open_window_this_minute, policy_status},
    process::{Component, free_port, group_alive},
    repo_root,
};
use k8s_openapi::api::{
    apps::v1::{Deployment, ReplicaSet},
    core::v1::{Namespace, Node, Pod},
    policy::v1::PodDisruptionBudget,
};
use kube::{
    Api, Client,
    api::{ListParams, PostParams},
};
use rand::{Rng, SeedableRng, rngs::StdRng, seq::SliceRandom};
use serde_json::{Value, json};

const NS: &str = "bench";
const POLICY: &str = "bench";
const ROLE: &str = "bench-role";
const DESCHEDULER_VERSION: &str = "v0.36.0";
/// `pod-template-hash` of the start pods and their ReplicaSets (the Deployment adopts a
/// ReplicaSet whose template equals its own, whatever the hash).
const TEMPLATE_HASH: &str = "start";

const USAGE: &str =
    "usage: gpu-defrag-bench-e2e [--trace DIR] [--workload W] [--seed S[,S…]] [--nodes N]
       [--load F] [--departures F] [--pending8 N] [--pending4 N] [--budget N]
       [--thresholds 20,40,60,80] [--scheduler-name NAME] [--descheduler BIN]
       [--only trace|demo|layout] [--doc FILE]

  Runs the real descheduler (HighNodeUtilization on nvidia.com/gpu, one run per threshold)
  and gpu-defrag (Enforce) with the same eviction budget, each on a fresh control plane
  with the same trace-sampled start state; then the descheduler on `make demo`'s workload.
  Prints a table; --doc writes the markdown report (docs/benchmarks-e2e.md).";

#[derive(Debug, Clone)]
struct Args {
    trace: PathBuf,
    workload: String,
    seeds: Vec<u64>,
    nodes: usize,
    load: f64,
    departures: f64,
    pending8: usize,
    pending4: usize,
    budget: u32,
    thresholds: Vec<u32>,
    scheduler_name: String,
    descheduler: Option<PathBuf>,
    only: Option<String>,
    doc: Option<PathBuf>,
}

fn parse_args() -> Result<Args> {
    let mut a = Args {
        trace: repo_root().join("../shared/data/alibaba-gpu-v2023/csv"),
        workload: "default".into(),
        seeds: vec![1],
        nodes: 64,
        load: 1.0,
        departures: 0.3,
        pending8: 8,
        pending4: 4,
        budget: 16,
        thresholds: vec![20, 40, 60, 80],
        scheduler_name: gpu_defrag_e2e::fixtures::GPU_SCHEDULER.into(),
        descheduler: None,
        only: None,
        doc: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--trace" => a.trace = PathBuf::from(value()?),
            "--workload" => a.workload = value()?,
            "--seed" | "--seeds" => {
                a.seeds = value()?
                    .split(',')
                    .filter(|s| !s.is_empty())
                    .map(|s| s.trim().parse().context("--seed"))
                    .collect::<Result<_>>()?
            }
            "--nodes" => a.nodes = value()?.parse().context("--nodes")?,
            "--load" => a.load = value()?.parse().context("--load")?,
            "--departures" => a.departures = value()?.parse().context("--departures")?,
            "--pending8" => a.pending8 = value()?.parse().context("--pending8")?,
            "--pending4" => a.pending4 = value()?.parse().context("--pending4")?,
            "--budget" => a.budget = value()?.parse().context("--budget")?,
            "--thresholds" => {
                a.thresholds = value()?
                    .split(',')
                    .filter(|s| !s.is_empty())
                    .map(|s| s.trim().parse().context("--thresholds"))
                    .collect::<Result<_>>()?
            }
            "--scheduler-name" => a.scheduler_name = value()?,
            "--descheduler" => a.descheduler = Some(PathBuf::from(value()?)),
            "--only" => a.only = Some(value()?),
            "--doc" => a.doc = Some(PathBuf::from(value()?)),
            "-h" | "--help" => bail!("help"),
            other => bail!("unknown argument {other}"),
        }
    }
    if !(0.0..=1.0).contains(&a.load) || !(0.0..1.0).contains(&a.departures) {
        bail!("--load must be in [0,1] and --departures in [0,1)");
    }
    Ok(a)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e:#}\n\n{USAGE}");
            return ExitCode::FAILURE;
        }
    };
    match run(&args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpu-defrag-bench-e2e: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: &Args) -> Result<()> {
    let started = chrono::Utc::now();
    if args.only.as_deref() == Some("layout") {
        for &seed in &args.seeds {
            println!(
                "seed {seed}: {}",
                Layout::from_trace(args, seed)?.describe()
            );
        }
        return Ok(());
    }
    let descheduler = match &args.descheduler {
        Some(b) => b.clone(),
        None => build_descheduler()?,
    };
    let gpu_defrag = gpu_defrag_e2e::operator::operator_binary().await?;
    let mut doc = String::new();
    if args.only.as_deref() != Some("demo") {
        let mut last_rows = Vec::new();
        let mut all_rows: Vec<(u64, Vec<Row>)> = Vec::new();
        for &seed in &args.seeds {
            let layout = Layout::from_trace(args, seed)?;
            eprintln!("seed {seed}: {}", layout.describe());
            let mut contenders: Vec<Contender> = args
                .thresholds
                .iter()
                .map(|&t| Contender::Descheduler(t))
                .collect();
            contenders.push(Contender::GpuDefrag);
            let mut rows = Vec::new();
            for c in &contenders {
                eprintln!("== seed {seed}: {}", c.name());
                let row = run_contender(args, &layout, c, &descheduler, &gpu_defrag).await?;
                eprintln!("{}", row.line());
                rows.push(row);
            }
            let table = table(&rows);
            println!("\nseed {seed}: {}\n{table}", layout.describe());
            if doc.is_empty() {
                doc.push_str(&trace_intro(args, &layout));
            }
            doc.push_str(&seed_section(seed, &layout, &rows, &table));
            all_rows.push((seed, rows.clone()));
            last_rows = rows;
        }
        let summary = summary_section(&all_rows);
        println!("{summary}");
        doc.push_str(&summary);
        doc.push_str(&commands_section(&last_rows));
    }
    if args.only.as_deref() != Some("trace") {
        eprintln!(
            "== make demo's workload: descheduler HighNodeUtilization at 60%, then gpu-defrag"
        );
        let demo = run_demo(&descheduler, &gpu_defrag).await?;
        println!("\n{}", demo.summary());
        doc.push_str(&demo.section());
    }
    if let Some(path) = &args.doc {
        let text = header(args, started) + &doc;
        fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

/// `e2e/cluster/build-descheduler.sh`: the cached descheduler binary (built once).
fn build_descheduler() -> Result<PathBuf> {
    let script = repo_root().join("e2e/cluster/build-descheduler.sh");
    let out = Command::new("bash")
        .arg(&script)
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        bail!("{} failed ({})", script.display(), out.status);
    }
    let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
    Ok(PathBuf::from(path))
}

// === the trace and the start layout ===

/// Rows of a CSV with a header (no quoted fields in the trace), as maps by column name.
fn read_csv(path: &Path) -> Result<Vec<BTreeMap<String, String>>> {
    let text = fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut lines = text.lines();
    let header: Vec<String> = lines
        .next()
        .ok_or_else(|| anyhow!("{} is empty", path.display()))?
        .split(',')
        .map(str::to_string)
        .collect();
    Ok(lines
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            header
                .iter()
                .cloned()
                .zip(l.split(',').map(str::to_string))
                .collect()
        })
        .collect())
}

fn num(row: &BTreeMap<String, String>, col: &str) -> Result<u64> {
    row.get(col)
        .ok_or_else(|| anyhow!("no column {col}"))?
        .trim()
        .parse()
        .with_context(|| format!("column {col}"))
}

#[derive(Debug, Clone)]
struct NodeSpec {
    name: String,
    gpus: u32,
    model: String,
    cpu_milli: u64,
    memory_mib: u64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct PodShape {
    gpus: u32,
    cpu_milli: u64,
    memory_mib: u64,
}

#[derive(Debug, Clone)]
struct Placed {
    app: String,
    shape: PodShape,
    node: usize,
}

/// The start state: nodes, running pods (each a 1-replica Deployment with a PDB) and the
/// pending multi-GPU pods.
#[derive(Debug, Clone)]
struct Layout {
    nodes: Vec<NodeSpec>,
    running: Vec<Placed>,
    pending: Vec<(String, PodShape)>,
    trace_pods: usize,
    shares_as_whole: usize,
}

#[derive(Debug, Clone, Default)]
struct Use {
    gpus: u32,
    cpu: u64,
    mem: u64,
    pods: u32,
}

fn fits(n: &NodeSpec, u: &Use, p: &PodShape) -> bool {
    u.gpus + p.gpus <= n.gpus
        && u.cpu + p.cpu_milli <= n.cpu_milli
        && u.mem + p.memory_mib <= n.memory_mib
        && u.pods < 110
}

/// The node the bin-packing scheduler (MostAllocated: GPU weight 100, cpu and memory 1)
/// would pick; ties go to the lowest index.
fn best_node(nodes: &[NodeSpec], used: &[Use], p: &PodShape) -> Option<usize> {
    let mut best: Option<(f64, usize)> = None;
    for (i, n) in nodes.iter().enumerate() {
        if !fits(n, &used[i], p) {
            continue;
        }
        let u = &used[i];
        let frac = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
        let score = 100.0 * frac((u.gpus + p.gpus) as f64, n.gpus as f64)
            + frac((u.cpu + p.cpu_milli) as f64, n.cpu_milli as f64)
            + frac((u.mem + p.memory_mib) as f64, n.memory_mib as f64);
        if best.is_none_or(|(s, _)| score > s + 1e-9) {
            best = Some((score, i));
        }
    }
    best.map(|(_, i)| i)
}

impl Layout {
    fn from_trace(args: &Args, seed: u64) -> Result<Self> {
        let mut rng = StdRng::seed_from_u64(seed);
        let node_rows = read_csv(&args.trace.join("openb_node_list_gpu_node.csv"))?;
        let mut all_nodes = Vec::new();
        for r in &node_rows {
            let gpus = num(r, "gpu")? as u32;
            if gpus == 0 {
                continue;
            }
            all_nodes.push((
                gpus,
                r.get("model").cloned().unwrap_or_default(),
                num(r, "cpu_milli")?,
                num(r, "memory_mib")?,
            ));
        }
        all_nodes.shuffle(&mut rng);
        all_nodes.truncate(args.nodes);
        // Biggest first, so names read well; the names carry the size.
        all_nodes.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        let nodes: Vec<NodeSpec> = all_nodes
            .into_iter()
            .enumerate()
            .map(|(i, (gpus, model, cpu_milli, memory_mib))| NodeSpec {
                name: format!("node-{i:02}-{gpus}g"),
                gpus,
                model: if model.is_empty() {
                    "unknown".into()
                } else {
                    model
                },
                cpu_milli,
                memory_mib,
            })
            .collect();
        let pod_rows = read_csv(
            &args
                .trace
                .join(format!("openb_pod_list_{}.csv", args.workload)),
        )?;
        let mut shapes = Vec::new();
        let mut shares = 0;
        for r in &pod_rows {
            let g = num(r, "num_gpu")? as u32;
            if g == 0 {
                continue;
            }
            if num(r, "gpu_milli")? < 1000 {
                shares += 1;
            }
            shapes.push(PodShape {
                gpus: g,
                cpu_milli: num(r, "cpu_milli")?,
                memory_mib: num(r, "memory_mib")?,
            });
        }
        let trace_pods = shapes.len();
        let big: Vec<PodShape> = shapes.iter().copied().filter(|s| s.gpus >= 4).collect();
        shapes.shuffle(&mut rng);
        let total: u32 = nodes.iter().map(|n| n.gpus).sum();
        let mut used = vec![Use::default(); nodes.len()];
        let mut placed: Vec<(PodShape, usize)> = Vec::new();
        let mut in_use = 0u32;
        for s in &shapes {
            if in_use as f64 >= args.load * total as f64 {
                break;
            }
            if let Some(i) = best_node(&nodes, &used, s) {
                let u = &mut used[i];
                u.gpus += s.gpus;
                u.cpu += s.cpu_milli;
                u.mem += s.memory_mib;
                u.pods += 1;
                in_use += s.gpus;
                placed.push((*s, i));
            }
        }
        // Departures: a seeded share of the placed pods ends.
        let mut order: Vec<usize> = (0..placed.len()).collect();
        order.shuffle(&mut rng);
        let gone: BTreeSet<usize> = order
            .into_iter()
            .take((args.departures * placed.len() as f64).round() as usize)
            .collect();
        let mut used = vec![Use::default(); nodes.len()];
        let mut running = Vec::new();
        for (k, (s, i)) in placed.iter().enumerate() {
            if gone.contains(&k) {
                continue;
            }
            let u = &mut used[*i];
            u.gpus += s.gpus;
            u.cpu += s.cpu_milli;
            u.mem += s.memory_mib;
            u.pods += 1;
            running.push((*s, *i));
        }
        // The queue: multi-GPU pods of the trace. Those that fit somewhere run (the
        // scheduler placed them); the rest are the pending pods the defragmentation serves.
        let mut pick = |gpus: u32, n: usize| -> Vec<PodShape> {
            let of: Vec<&PodShape> = big.iter().filter(|s| s.gpus == gpus).collect();
            (0..n)
                .map(|_| {
                    if of.is_empty() {
                        PodShape {
                            gpus,
                            cpu_milli: 8000 * gpus as u64,
                            memory_mib: 65536 * gpus as u64,
                        }
                    } else {
                        *of[rng.random_range(0..of.len())]
                    }
                })
                .collect()
        };
        let queue: Vec<PodShape> = pick(8, args.pending8)
            .into_iter()
            .chain(pick(4, args.pending4))
            .collect();
        let mut pending = Vec::new();
        for s in queue {
            match best_node(&nodes, &used, &s) {
                Some(i) => {
                    let u = &mut used[i];
                    u.gpus += s.gpus;
                    u.cpu += s.cpu_milli;
                    u.mem += s.memory_mib;
                    u.pods += 1;
                    running.push((s, i));
                }
                None => pending.push(s),
            }
        }
        let running = running
            .into_iter()
            .enumerate()
            .map(|(k, (shape, node))| Placed {
                app: format!("w-{k:03}"),
                shape,
                node,
            })
            .collect();
        let pending = pending
            .into_iter()
            .enumerate()
            .map(|(k, s)| (format!("pending-{}g-{k:02}", s.gpus), s))
            .collect();
        Ok(Self {
            nodes,
            running,
            pending,
            trace_pods,
            shares_as_whole: shares.min(trace_pods),
        })
    }

    fn total_gpus(&self) -> u32 {
        self.nodes.iter().map(|n| n.gpus).sum()
    }

    fn used_gpus(&self) -> u32 {
        self.running.iter().map(|p| p.shape.gpus).sum()
    }

    fn sizes(&self) -> String {
        let mut by: BTreeMap<u32, usize> = BTreeMap::new();
        for n in &self.nodes {
            *by.entry(n.gpus).or_default() += 1;
        }
        by.iter()
            .rev()
            .map(|(g, c)| format!("{c}×{g}-GPU"))
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn describe(&self) -> String {
        let pend: Vec<String> = self
            .pending
            .iter()
            .map(|(_, s)| format!("{}", s.gpus))
            .collect();
        format!(
            "start layout: {} nodes ({}), {} GPUs; {} running pods on {} GPUs ({:.0}%); pending multi-GPU pods: {} (GPUs: {})",
            self.nodes.len(),
            self.sizes(),
            self.total_gpus(),
            self.running.len(),
            self.used_gpus(),
            100.0 * self.used_gpus() as f64 / self.total_gpus().max(1) as f64,
            self.pending.len(),
            pend.join(",")
        )
    }
}

// === the cluster of one contender ===

fn pod_template(app: &str, role: &str, s: &PodShape, scheduler: &str) -> Value {
    json!({
        "metadata": {"labels": {"app": app, ROLE: role}},
        "spec": {
            "schedulerName": scheduler,
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "main",
                "image": gpu_defrag_e2e::fixtures::FAKE_IMAGE,
                "resources": {
                    "requests": {"cpu": format!("{}m", s.cpu_milli), "memory": format!("{}Mi", s.memory_mib)},
                    "limits": {GPU_RESOURCE: s.gpus.to_string()},
                },
            }],
        },
    })
}

fn deployment(
    app: &str,
    role: &str,
    s: &PodShape,
    replicas: i32,
    scheduler: &str,
) -> Result<Deployment> {
    serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": app, "labels": {"app": app, ROLE: role}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": app}},
            "template": pod_template(app, role, s, scheduler),
        },
    }))
    .context("building a Deployment")
}

/// Starts a fresh control plane and builds `layout` on it, exactly.
async fn build_cluster(args: &Args, layout: &Layout) -> Result<TestCluster> {
    let t0 = Instant::now();
    let cluster = TestCluster::start(ClusterOptions {
        nodes: 0,
        ..ClusterOptions::default()
    })
    .await?;
    let client = cluster.client()?;
    let mut nodes = Vec::new();
    for n in &layout.nodes {
        let mut spec = GpuNodes::new(1, n.gpus).model(n.model.clone());
        spec.cpu = format!("{}m", n.cpu_milli);
        spec.memory = format!("{}Mi", n.memory_mib);
        nodes.push(spec.node(&n.name)?);
    }
    let names: Vec<String> = layout.nodes.iter().map(|n| n.name.clone()).collect();
    create_all(&Api::<Node>::all(client.clone()), nodes, 16).await?;
    cluster
        .wait_nodes_ready(&names, Duration::from_secs(120))
        .await?;
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": NS}}))?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .context("creating the namespace")?;
    let deps: Api<Deployment> = Api::namespaced(client.clone(), NS);
    let sched = &args.scheduler_name;
    let want = layout.running.len();
    let sel = format!("{ROLE}=workload");
    let pdbs = layout
        .running
        .iter()
        .map(|p| {
            serde_json::from_value::<PodDisruptionBudget>(json!({
                "metadata": {"name": p.app},
                "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": p.app}}},
            }))
            .context("building a PDB")
        })
        .collect::<Result<Vec<_>>>()?;
    create_all(&Api::namespaced(client.clone(), NS), pdbs, 16).await?;
    // 1. The pods, bound to the layout's nodes, labelled as their ReplicaSet's pods.
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), NS);
    let mut pods = Vec::new();
    for p in &layout.running {
        let mut t = pod_template(&p.app, "workload", &p.shape, sched);
        t["metadata"]["name"] = json!(format!("{}-{TEMPLATE_HASH}-s0", p.app));
        t["metadata"]["labels"]["pod-template-hash"] = json!(TEMPLATE_HASH);
        t["spec"]["nodeName"] = json!(layout.nodes[p.node].name);
        pods.push(serde_json::from_value::<Pod>(t).context("building a Pod")?);
    }
    create_all(&pods_api, pods, 16).await?;
    gpu_defrag_e2e::fixtures::wait_ready_pods(&client, NS, &sel, want, Duration::from_secs(300))
        .await?;
    // Let the controller manager's pod informer see every pod before their owners exist.
    tokio::time::sleep(Duration::from_secs(2)).await;
    // 2. A ReplicaSet per pod (1 replica, the pod's labels): it adopts the pod.
    let rss: Api<ReplicaSet> = Api::namespaced(client.clone(), NS);
    let objects = layout
        .running
        .iter()
        .map(|p| {
            let mut t = pod_template(&p.app, "workload", &p.shape, sched);
            t["metadata"]["labels"]["pod-template-hash"] = json!(TEMPLATE_HASH);
            serde_json::from_value::<ReplicaSet>(json!({
                "metadata": {"name": format!("{}-{TEMPLATE_HASH}", p.app),
                             "labels": {"app": p.app, ROLE: "workload", "pod-template-hash": TEMPLATE_HASH}},
                "spec": {
                    "replicas": 1,
                    "selector": {"matchLabels": {"app": p.app, "pod-template-hash": TEMPLATE_HASH}},
                    "template": t,
                },
            }))
            .context("building a ReplicaSet")
        })
        .collect::<Result<Vec<_>>>()?;
    create_all(&rss, objects, 16).await?;
    wait_for(
        "the ReplicaSets to adopt the bound pods",
        Duration::from_secs(180),
        || async {
            let pods = pods_api
                .list(&ListParams::default().labels(&sel))
                .await?
                .items;
            Ok((pods.len() == want
                && pods.iter().all(|p| {
                    p.metadata
                        .owner_references
                        .as_ref()
                        .is_some_and(|o| !o.is_empty())
                }))
            .then_some(()))
        },
    )
    .await?;
    // 3. The Deployments (same template): each adopts its ReplicaSet as its current one.
    let objects = layout
        .running
        .iter()
        .map(|p| deployment(&p.app, "workload", &p.shape, 1, sched))
        .collect::<Result<Vec<_>>>()?;
    create_all(&deps, objects, 16).await?;
    let pdb_api: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), NS);
    wait_for(
        "every Deployment owning its ReplicaSet and ready, every PDB allowing one disruption",
        Duration::from_secs(180),
        || async {
            let pods = pods_api
                .list(&ListParams::default().labels(&sel))
                .await?
                .items;
            let adopted = pods.len() == want
                && pods.iter().all(|p| {
                    p.metadata
                        .owner_references
                        .as_ref()
                        .is_some_and(|o| !o.is_empty())
                        && pod_ready(p)
                });
            if !adopted {
                return Ok(None);
            }
            let ready = deps
                .list(&ListParams::default().labels(&sel))
                .await?
                .items
                .iter()
                .filter(|d| d.status.as_ref().and_then(|s| s.ready_replicas) == Some(1))
                .count();
            let pdbs = pdb_api
                .list(&ListParams::default())
                .await?
                .items
                .iter()
                .filter(|p| {
                    p.status.as_ref().is_some_and(|s| {
                        s.disruptions_allowed == Some(1)
                            && s.observed_generation == p.metadata.generation
                    })
                })
                .count();
            let rs = rss.list(&ListParams::default()).await?.items;
            let owned = rs.len() == want
                && rs.iter().all(|r| {
                    r.metadata
                        .owner_references
                        .as_ref()
                        .is_some_and(|o| o.iter().any(|o| o.kind == "Deployment"))
                });
            Ok((ready == want && pdbs == want && owned).then_some(()))
        },
    )
    .await?;
    // The layout holds exactly: every pod on the node the layout says.
    let on: BTreeMap<String, String> = pods_api
        .list(&ListParams::default().labels(&sel))
        .await?
        .items
        .iter()
        .filter_map(|p| Some((app_of(p).to_string(), p.spec.as_ref()?.node_name.clone()?)))
        .collect();
    for p in &layout.running {
        if on.get(&p.app) != Some(&layout.nodes[p.node].name) {
            bail!(
                "{} is not on {} as the layout says",
                p.app,
                layout.nodes[p.node].name
            );
        }
    }
    // The queue: pending multi-GPU Deployments (no PDB), through the real scheduler.
    let objects = layout
        .pending
        .iter()
        .map(|(app, s)| deployment(app, "pending", s, 1, sched))
        .collect::<Result<Vec<_>>>()?;
    create_all(&deps, objects, 8).await?;
    let n_pending = layout.pending.len();
    wait_for(
        "the pending pods to be found unschedulable",
        Duration::from_secs(120),
        || async {
            let pods = pods_api
                .list(&ListParams::default().labels(&format!("{ROLE}=pending")))
                .await?
                .items;
            let unsched = pods
                .iter()
                .filter(|p| {
                    p.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|cs| {
                            cs.iter().any(|c| {
                                c.type_ == "PodScheduled"
                                    && c.status == "False"
                                    && c.reason.as_deref() == Some("Unschedulable")
                            })
                        })
                })
                .count();
            if pods
                .iter()
                .any(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some())
            {
                bail!("a pending pod was scheduled: the layout is not what the cluster holds");
            }
            Ok((unsched == n_pending).then_some(()))
        },
    )
    .await?;
    // The queue waits a little before any contender starts: creation timestamps have whole
    // seconds, and gpu-defrag's maxPendingGpuPods guard counts pods created in the second its
    // run started as created by the run (a queue made under a second before a run stops it).
    tokio::time::sleep(Duration::from_secs(2)).await;
    eprintln!(
        "  start state built in {:.0}s (control plane {:.0}s)",
        t0.elapsed().as_secs_f64(),
        cluster.started_in().as_secs_f64()
    );
    Ok(cluster)
}

fn app_of(p: &Pod) -> &str {
    p.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("app"))
        .map(String::as_str)
        .unwrap_or("")
}

fn role_of(p: &Pod) -> &str {
    p.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(ROLE))
        .map(String::as_str)
        .unwrap_or("")
}

// === measuring ===

#[derive(Debug, Clone, Default)]
struct State {
    frag_rate: f64,
    free8: usize,
    pending_running: usize,
    pending_total: usize,
    /// Pending 8-GPU pods now Running (each holds a whole 8-GPU node).
    pending8_running: usize,
    /// GPUs of the pods bound to nodes, and of the nodes.
    used_gpus: u32,
    total_gpus: u32,
    /// uid → (app, node, ready) of the workload pods.
    pods: BTreeMap<String, (String, String, bool)>,
}

/// The cluster now: `gpu-defrag report -o json` (live) and the pods.
async fn measure(
    cluster: &TestCluster,
    gpu_defrag: &Path,
    report_policy: &Path,
    ns: &str,
) -> Result<State> {
    let out = Command::new(gpu_defrag)
        .args(["report", "-o", "json", "--policy"])
        .arg(report_policy)
        .env("KUBECONFIG", cluster.kubeconfig_path())
        .output()
        .context("running gpu-defrag report")?;
    if !out.status.success() {
        bail!(
            "gpu-defrag report failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let report: Value = serde_json::from_slice(&out.stdout).context("report json")?;
    let client = cluster.client()?;
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items;
    let pods = Api::<Pod>::namespaced(client, ns)
        .list(&ListParams::default())
        .await?
        .items;
    let mut used: BTreeMap<&str, u32> = BTreeMap::new();
    for p in &pods {
        if let Some(n) = p.spec.as_ref().and_then(|s| s.node_name.as_deref()) {
            *used.entry(n).or_default() += gpu_defrag_e2e::operator::pod_gpus(p);
        }
    }
    let free8 = nodes
        .iter()
        .filter(|n| {
            let cap = n
                .status
                .as_ref()
                .and_then(|s| s.allocatable.as_ref())
                .and_then(|a| a.get(GPU_RESOURCE))
                .map(|q| q.0.as_str())
                == Some("8");
            cap && used
                .get(n.metadata.name.as_deref().unwrap_or(""))
                .copied()
                .unwrap_or(0)
                == 0
        })
        .count();
    let total_gpus = nodes
        .iter()
        .filter_map(|n| {
            n.status
                .as_ref()?
                .allocatable
                .as_ref()?
                .get(GPU_RESOURCE)?
                .0
                .parse::<u32>()
                .ok()
        })
        .sum();
    let mut st = State {
        used_gpus: used.values().sum(),
        total_gpus,
        frag_rate: report["fragmentRate"].as_f64().unwrap_or(f64::NAN),
        free8,
        ..State::default()
    };
    for p in &pods {
        if p.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let uid = p.metadata.uid.clone().unwrap_or_default();
        let node = p
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        match role_of(p) {
            "pending" => {
                st.pending_total += 1;
                if pod_ready(p) {
                    st.pending_running += 1;
                    if gpu_defrag_e2e::operator::pod_gpus(p) == 8 {
                        st.pending8_running += 1;
                    }
                }
            }
            _ => {
                st.pods
                    .insert(uid, (app_of(p).to_string(), node, pod_ready(p)));
            }
        }
    }
    Ok(st)
}

/// The pods of `ns` as one string: names, nodes, readiness, deletion.
async fn fingerprint(api: &Api<Pod>) -> Result<String> {
    let pods = api.list(&ListParams::default()).await?.items;
    let mut fp: Vec<String> = pods
        .iter()
        .map(|p| {
            format!(
                "{}@{}:{}:{}",
                p.metadata.name.as_deref().unwrap_or(""),
                p.spec
                    .as_ref()
                    .and_then(|s| s.node_name.as_deref())
                    .unwrap_or("-"),
                pod_ready(p),
                p.metadata.deletion_timestamp.is_some()
            )
        })
        .collect();
    fp.sort();
    Ok(fp.join(","))
}

/// Watches the pods of a namespace every 250 ms from before a contender starts, recording
/// when they last changed (names, nodes, readiness, deletion).
struct Watch {
    last_change: Arc<Mutex<Option<Instant>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Watch {
    async fn start(client: &Client, ns: &str) -> Result<Self> {
        let api: Api<Pod> = Api::namespaced(client.clone(), ns);
        let mut last = fingerprint(&api).await?;
        let last_change = Arc::new(Mutex::new(None));
        let lc = last_change.clone();
        let task = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(250)).await;
                if let Ok(fp) = fingerprint(&api).await
                    && fp != last
                {
                    last = fp;
                    if let Ok(mut l) = lc.lock() {
                        *l = Some(Instant::now());
                    }
                }
            }
        });
        Ok(Self { last_change, task })
    }

    fn last_change(&self) -> Option<Instant> {
        self.last_change.lock().ok().and_then(|l| *l)
    }

    /// Waits until the pods have not changed for `quiet` since the contender finished at
    /// `done` (at most `timeout`); returns when the last change (or the contender's end, if
    /// later) was.
    async fn settled(self, done: Instant, quiet: Duration, timeout: Duration) -> Instant {
        loop {
            let end = self.last_change().map_or(done, |c| c.max(done));
            if end.elapsed() >= quiet || done.elapsed() >= timeout {
                self.task.abort();
                return end;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

// === contenders ===

#[derive(Debug, Clone)]
enum Contender {
    Descheduler(u32),
    GpuDefrag,
}

impl Contender {
    fn name(&self) -> String {
        match self {
            Self::Descheduler(t) => format!("descheduler HighNodeUtilization gpu<{t}%"),
            Self::GpuDefrag => "gpu-defrag Enforce".to_string(),
        }
    }
}

#[derive(Debug, Clone)]
struct Row {
    name: String,
    before: State,
    after: State,
    evictions: usize,
    back_on_source: usize,
    not_running: usize,
    wall: f64,
    note: String,
    command: String,
    config: String,
}

impl Row {
    /// 8-GPU nodes free now or running a formerly pending 8-GPU pod, less those free at the
    /// start.
    fn given_back(&self) -> i64 {
        (self.after.free8 + self.after.pending8_running) as i64
            - (self.before.free8 + self.before.pending8_running) as i64
    }

    fn line(&self) -> String {
        format!(
            "  {}: fragment rate {:.3} -> {:.3}, free 8-GPU nodes {} -> {}, pending running {}/{}, evictions {}, back on source {}, replacements not running {}, {:.1}s; {}",
            self.name,
            self.before.frag_rate,
            self.after.frag_rate,
            self.before.free8,
            self.after.free8,
            self.after.pending_running,
            self.after.pending_total,
            self.evictions,
            self.back_on_source,
            self.not_running,
            self.wall,
            self.note
        )
    }
}

fn descheduler_policy(threshold: u32, budget: u32, namespaces: &[&str]) -> String {
    let ns = if namespaces.is_empty() {
        String::new()
    } else {
        format!(
            "\n      evictableNamespaces:\n        exclude: [{}]",
            namespaces.join(", ")
        )
    };
    format!(
        "apiVersion: descheduler/v1alpha2
kind: DeschedulerPolicy
maxNoOfPodsToEvictTotal: {budget}
profiles:
- name: gpu-binpack
  pluginConfig:
  - name: DefaultEvictor
    args: {{}}
  - name: HighNodeUtilization
    args:
      thresholds:
        nvidia.com/gpu: {threshold}{ns}
  plugins:
    balance:
      enabled: [HighNodeUtilization]
"
    )
}

/// Runs the descheduler once (no `--descheduling-interval`: one pass, then it exits) as the
/// cluster admin; returns its command line, the log's notable lines and the log path.
async fn run_descheduler(
    cluster: &TestCluster,
    bin: &Path,
    policy: &str,
    tag: &str,
) -> Result<(String, Vec<String>, PathBuf)> {
    let dir = cluster.work_dir().join(format!("descheduler-{tag}"));
    fs::create_dir_all(&dir)?;
    let policy_path = dir.join("policy.yaml");
    fs::write(&policy_path, policy)?;
    let log = cluster.logs_dir().join(format!("descheduler-{tag}.log"));
    let args: Vec<String> = vec![
        format!("--kubeconfig={}", cluster.kubeconfig_path().display()),
        format!("--policy-config-file={}", policy_path.display()),
        "--secure-port=0".into(),
        "--v=3".into(),
    ];
    let command =
        "descheduler --kubeconfig=$KUBECONFIG --policy-config-file=policy.yaml --secure-port=0 --v=3"
            .to_string();
    let mut c = Component::spawn("descheduler", bin, &args, &[], &log)?;
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = c.exited() {
            break s;
        }
        if t0.elapsed() > Duration::from_secs(300) {
            c.stop(Duration::from_secs(2));
            bail!(
                "the descheduler did not finish within 300s; see {}",
                log.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let text = fs::read_to_string(&log).unwrap_or_default();
    let notable: Vec<String> = text
        .lines()
        .filter(|l| {
            [
                "Criteria for a node",
                "Number of underutilized",
                "nothing to do",
                "No node is underutilized",
                "Total capacity to be moved",
                "Evicting pods from node",
                "\"Evicted pod\"",
                "Number of evictions",
                "limit",
                "reached",
                "Error",
            ]
            .iter()
            .any(|k| l.contains(k))
        })
        .filter(|l| !l.contains("Unable to write event"))
        .map(|l| {
            // Drop klog's header (level, date, time, pid, file:line]).
            l.split_once("] ").map(|(_, r)| r).unwrap_or(l).to_string()
        })
        .collect();
    if !status.contains("exit status: 0") {
        bail!(
            "the descheduler exited with {status}; see {}:\n{}",
            log.display(),
            gpu_defrag_e2e::process::log_tail(&log, 20)
        );
    }
    Ok((command, notable, log))
}

fn report_policy_yaml(ns: &str) -> String {
    // Fixed shapes (no fromPending), so the fragment rate means the same before and after.
    format!(
        "apiVersion: gpu-defrag.io/v1alpha1
kind: DefragPolicy
metadata: {{name: report}}
spec:
  mode: DryRun
  namespaces: {{include: [{ns}]}}
  target:
    shapes:
    - {{gpus: 8, weight: 1}}
    - {{gpus: 4, weight: 1}}
    - {{gpus: 1, weight: 1}}
"
    )
}

fn gpu_defrag_spec(budget: u32, ns: &str) -> Value {
    json!({
        "mode": "Enforce",
        "namespaces": {"include": [ns]},
        "target": {
            "shapes": [{"gpus": 8, "weight": 1}, {"gpus": 4, "weight": 1}, {"gpus": 1, "weight": 1}],
            "fromPending": true,
        },
        "windows": [open_window_this_minute()],
        "limits": {
            "maxEvictionsPerRun": budget,
            "maxEvictionsPerNode": 8,
            "maxEvictionsPerNamespace": budget,
            "maxInFlight": 4,
        },
        "safety": {"minPodAge": "0s", "minNodeAge": "0s", "rescheduleTimeout": "2m"},
    })
}

/// Starts `gpu-defrag run` as `make demo` does (the cluster admin's kubeconfig, no leader
/// election, only the policy labelled `e2e-test=bench`), applies the Enforce policy with a
/// window open now, and waits for the run's result. The process dies with the returned
/// [`Component`].
async fn run_gpu_defrag(
    cluster: &TestCluster,
    bin: &Path,
    spec: Value,
) -> Result<(Value, Component)> {
    let log = cluster.logs_dir().join("gpu-defrag.log");
    let args: Vec<String> = vec![
        "run".into(),
        "--leader-elect=false".into(),
        format!("--metrics-addr=127.0.0.1:{}", free_port()?),
        "--policy-selector=e2e-test=bench".into(),
    ];
    let envs: [(&str, &Path); 2] = [
        ("KUBECONFIG", cluster.kubeconfig_path()),
        ("RUST_LOG", Path::new("info")),
    ];
    let op = Component::spawn("gpu-defrag", bin, &args, &envs, &log)?;
    let pgid = op.pgid;
    let client = cluster.client()?;
    create_policy(&client, POLICY, "bench", spec).await?;
    let run = wait_for(
        "gpu-defrag's run to finish",
        Duration::from_secs(600),
        || async {
            if !group_alive(pgid) {
                bail!("gpu-defrag exited; see {}", log.display());
            }
            let st = policy_status(&client, POLICY).await?;
            Ok(st
                .pointer("/lastRuns/0/result")
                .and_then(Value::as_str)
                .is_some()
                .then(|| st["lastRuns"][0].clone()))
        },
    )
    .await?;
    Ok((run, op))
}

async fn run_contender(
    args: &Args,
    layout: &Layout,
    c: &Contender,
    descheduler: &Path,
    gpu_defrag: &Path,
) -> Result<Row> {
    let cluster = build_cluster(args, layout).await?;
    let report_policy = cluster.work_dir().join("report-policy.yaml");
    fs::write(&report_policy, report_policy_yaml(NS))?;
    let before = measure(&cluster, gpu_defrag, &report_policy, NS).await?;
    let client = cluster.client()?;
    let watch = Watch::start(&client, NS).await?;
    let t0 = Instant::now();
    let (note, command, config, op) = match c {
        Contender::Descheduler(t) => {
            let policy = descheduler_policy(*t, args.budget, &[]);
            let (command, notable, _log) =
                run_descheduler(&cluster, descheduler, &policy, &format!("t{t}")).await?;
            let summary: Vec<String> = notable
                .iter()
                .filter(|l| {
                    l.contains("Number of evictions")
                        || l.contains("nothing to do")
                        || l.contains("Number of underutilized")
                        || l.contains("limit")
                        || l.contains("reached")
                })
                .take(6)
                .cloned()
                .collect();
            (summary.join(" / "), command, policy, None)
        }
        Contender::GpuDefrag => {
            let spec = gpu_defrag_spec(args.budget, NS);
            let (run, op) = run_gpu_defrag(&cluster, gpu_defrag, spec.clone()).await?;
            let note = format!(
                "run {} (\"{}\"): planned {}, evicted {}, blocked {}, bounced {}, failed {}",
                run["result"].as_str().unwrap_or("?"),
                run["message"].as_str().unwrap_or(""),
                run["planned"],
                run["evicted"],
                run["blocked"],
                run["bounced"],
                run["failed"]
            );
            let config = serde_norway::to_string(&json!({
                "apiVersion": "gpu-defrag.io/v1alpha1", "kind": "DefragPolicy",
                "metadata": {"name": POLICY}, "spec": spec,
            }))?;
            (
                note,
                "gpu-defrag run --leader-elect=false --policy-selector=e2e-test=bench (KUBECONFIG: the cluster admin's)".to_string(),
                config,
                Some(op),
            )
        }
    };
    let last = watch
        .settled(
            Instant::now(),
            Duration::from_secs(6),
            Duration::from_secs(300),
        )
        .await;
    let wall = last.saturating_duration_since(t0).as_secs_f64();
    let after = measure(&cluster, gpu_defrag, &report_policy, NS).await?;
    let mut evictions = 0;
    let mut back = 0;
    let mut not_running = 0;
    let now_by_app: BTreeMap<&str, (&str, bool)> = after
        .pods
        .values()
        .map(|(a, n, r)| (a.as_str(), (n.as_str(), *r)))
        .collect();
    for (uid, (app, node, _)) in &before.pods {
        if after.pods.contains_key(uid) {
            continue;
        }
        evictions += 1;
        match now_by_app.get(app.as_str()) {
            Some((n, true)) if n == node => back += 1,
            Some((_, true)) => {}
            _ => not_running += 1,
        }
    }
    drop(op);
    cluster.stop();
    Ok(Row {
        name: c.name(),
        before,
        after,
        evictions,
        back_on_source: back,
        not_running,
        wall,
        note,
        command,
        config,
    })
}

// === make demo's workload ===

struct Demo {
    before: State,
    desched_after: State,
    desched_evictions: usize,
    desched_lines: Vec<String>,
    desched_policy: String,
    gd_after: State,
    gd_run: Value,
    gd_evictions: usize,
}

async fn run_demo(descheduler: &Path, gpu_defrag: &Path) -> Result<Demo> {
    let cluster = TestCluster::start(ClusterOptions::default()).await?;
    let script = repo_root().join("hack/demo-workload.sh");
    let path = format!(
        "{}:{}",
        cluster.bin_dir().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let st = Command::new("bash")
        .arg(&script)
        .args(["demo", "64"])
        .env("KUBECONFIG", cluster.kubeconfig_path())
        .env("PATH", path)
        .status()
        .context("running hack/demo-workload.sh")?;
    if !st.success() {
        bail!("hack/demo-workload.sh failed ({st})");
    }
    let client = cluster.client()?;
    wait_for(
        "the 8-GPU training pod to be unschedulable",
        Duration::from_secs(60),
        || async {
            let pods = Api::<Pod>::namespaced(client.clone(), "demo")
                .list(&ListParams::default().labels("app=train-8gpu"))
                .await?
                .items;
            Ok(pods
                .iter()
                .any(|p| {
                    p.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|cs| {
                            cs.iter()
                                .any(|c| c.reason.as_deref() == Some("Unschedulable"))
                        })
                })
                .then_some(()))
        },
    )
    .await?;
    let report_policy = repo_root().join("config/samples/demo.yaml");
    let mark_train = |mut s: State| {
        // The demo's training pod is its pending multi-GPU pod.
        let train: Vec<String> = s
            .pods
            .iter()
            .filter(|(_, (a, _, _))| a == "train-8gpu")
            .map(|(u, _)| u.clone())
            .collect();
        for u in train {
            if let Some((_, _, r)) = s.pods.remove(&u) {
                s.pending_total += 1;
                s.pending_running += usize::from(r);
            }
        }
        s
    };
    let before = mark_train(measure(&cluster, gpu_defrag, &report_policy, "demo").await?);
    let desched_policy = descheduler_policy(60, 20, &[]);
    let watch = Watch::start(&client, "demo").await?;
    let (_, lines, _) = run_descheduler(&cluster, descheduler, &desched_policy, "demo").await?;
    watch
        .settled(
            Instant::now(),
            Duration::from_secs(4),
            Duration::from_secs(120),
        )
        .await;
    let desched_after = mark_train(measure(&cluster, gpu_defrag, &report_policy, "demo").await?);
    let desched_evictions = before
        .pods
        .keys()
        .filter(|u| !desched_after.pods.contains_key(*u))
        .count();
    // gpu-defrag on the same cluster, with make demo's policy switched to Enforce.
    let text = fs::read_to_string(&report_policy)?;
    let policy: Value = serde_norway::from_str(&text)?;
    let mut spec = policy["spec"].clone();
    spec["mode"] = json!("Enforce");
    spec["windows"] = json!([open_window_this_minute()]);
    let watch = Watch::start(&client, "demo").await?;
    let (run, op) = run_gpu_defrag(&cluster, gpu_defrag, spec).await?;
    watch
        .settled(
            Instant::now(),
            Duration::from_secs(4),
            Duration::from_secs(180),
        )
        .await;
    let gd_after = mark_train(measure(&cluster, gpu_defrag, &report_policy, "demo").await?);
    let gd_evictions = desched_after
        .pods
        .keys()
        .filter(|u| !gd_after.pods.contains_key(*u))
        .count();
    drop(op);
    cluster.stop();
    Ok(Demo {
        before,
        desched_after,
        desched_evictions,
        desched_lines: lines,
        desched_policy,
        gd_after,
        gd_run: run,
        gd_evictions,
    })
}

impl Demo {
    fn summary(&self) -> String {
        format!(
            "make demo's workload (8 nodes × 8 GPUs, every node half used, one pending 8-GPU pod):\n  start: fragment rate {:.3}, free 8-GPU nodes {}\n  descheduler HighNodeUtilization gpu<60%: evictions {}, fragment rate {:.3}, free 8-GPU nodes {}, 8-GPU pod running {}/{}\n    log: {}\n  gpu-defrag Enforce (config/samples/demo.yaml): evictions {}, fragment rate {:.3}, free 8-GPU nodes {} (+{} running the 8-GPU pod), run {}",
            self.before.frag_rate,
            self.before.free8,
            self.desched_evictions,
            self.desched_after.frag_rate,
            self.desched_after.free8,
            self.desched_after.pending_running,
            self.desched_after.pending_total,
            self.desched_lines
                .iter()
                .filter(|l| l.contains("nothing to do") || l.contains("Number of"))
                .cloned()
                .collect::<Vec<_>>()
                .join(" / "),
            self.gd_evictions,
            self.gd_after.frag_rate,
            self.gd_after.free8,
            self.gd_after.pending_running,
            self.gd_run["result"].as_str().unwrap_or("?"),
        )
    }

    fn section(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "\n## `make demo`'s workload: the descheduler finds nothing to do\n\n\
             The workload of `make demo` (`hack/demo-workload.sh demo 64`): 8 KWOK nodes × 8 GPUs, \
             64 one-GPU Deployments packed by the bin-packing scheduler, every other one removed \
             (each node 4 of 8 GPUs used, each kept Deployment with a PDB `maxUnavailable: 1`), \
             and one 8-GPU training pod that fits nowhere. First the real descheduler with this \
             policy, once (`descheduler --kubeconfig=$KUBECONFIG --policy-config-file=policy.yaml --secure-port=0 --v=3`):\n\n```yaml\n{}```\n",
            self.desched_policy
        );
        let _ = writeln!(
            s,
            "Its log (klog headers dropped; lines about utilization and evictions):\n\n```text"
        );
        for l in self.desched_lines.iter().take(20) {
            let _ = writeln!(s, "{l}");
        }
        let _ = writeln!(s, "```\n");
        let _ = writeln!(
            s,
            "| | evictions | fragment rate | free 8-GPU nodes | 8-GPU pod Running |\n|---|---:|---:|---:|---:|"
        );
        let _ = writeln!(
            s,
            "| start | – | {:.3} | {} | {}/{} |",
            self.before.frag_rate,
            self.before.free8,
            self.before.pending_running,
            self.before.pending_total
        );
        let _ = writeln!(
            s,
            "| descheduler HighNodeUtilization gpu<60% | {} | {:.3} | {} | {}/{} |",
            self.desched_evictions,
            self.desched_after.frag_rate,
            self.desched_after.free8,
            self.desched_after.pending_running,
            self.desched_after.pending_total
        );
        let _ = writeln!(
            s,
            "| then gpu-defrag Enforce (`config/samples/demo.yaml`, window open) | {} | {:.3} | {} | {}/{} |",
            self.gd_evictions,
            self.gd_after.frag_rate,
            self.gd_after.free8,
            self.gd_after.pending_running,
            self.gd_after.pending_total
        );
        let _ = writeln!(
            s,
            "\nEvery node is 50% used, below the 60% threshold, so every node is \"underutilized\" \
             and HighNodeUtilization has no node to pack onto. gpu-defrag's run: {} (planned {}, \
             evicted {}). Free 8-GPU nodes after gpu-defrag do not count the node the 8-GPU pod \
             now runs on. Fragment rate by `gpu-defrag report --policy config/samples/demo.yaml -o json`.",
            self.gd_run["result"].as_str().unwrap_or("?"),
            self.gd_run["planned"],
            self.gd_run["evicted"]
        );
        s
    }
}

// === output ===

fn table(rows: &[Row]) -> String {
    let mut s = String::from(
        "| contender | fragment rate before → after | free 8-GPU nodes before → after | 8-GPU nodes given back | pending multi-GPU pods Running | GPUs allocated | evictions | back on source node | replacements not Running | time (s) |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in rows {
        let _ = writeln!(
            s,
            "| {} | {:.3} → {:.3} | {} → {} | {} | {}/{} | {} → {} of {} | {} | {} | {} | {:.1} |",
            r.name,
            r.before.frag_rate,
            r.after.frag_rate,
            r.before.free8,
            r.after.free8,
            r.given_back(),
            r.after.pending_running,
            r.after.pending_total,
            r.before.used_gpus,
            r.after.used_gpus,
            r.after.total_gpus,
            r.evictions,
            r.back_on_source,
            r.not_running,
            r.wall
        );
    }
    s
}

fn machine() -> String {
    let uname = Command::new("uname")
        .arg("-srm")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, m)| m.trim().to_string())
        .unwrap_or_default();
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    format!("{uname}, {cores} cores ({model})")
}

fn header(args: &Args, started: chrono::DateTime<chrono::Utc>) -> String {
    let cmdline: Vec<String> = std::env::args().skip(1).collect();
    let _ = args;
    format!(
        "# The real descheduler and gpu-defrag, side by side on the real control plane\n\n\
         Generated by `make bench-e2e` (`hack/bench-e2e.sh`, which runs \
         `gpu-defrag-bench-e2e {}`) on {} (started {}). Do not edit by hand.\n\n\
         - Control plane: kube-apiserver, kube-controller-manager, kube-scheduler v1.37.2 \
         twice (the stock default scheduler, and `gpu-binpack` with \
         config/scheduler/gpu-binpack.yaml: MostAllocated on `nvidia.com/gpu`; the GPU pods \
         name the scheduler given), etcd v3.6.16, kwok v0.8.0, built from Go modules by \
         `e2e/cluster/build.sh`.\n\
         - Descheduler: `sigs.k8s.io/descheduler` {DESCHEDULER_VERSION}, built from its Go module by \
         `e2e/cluster/build-descheduler.sh` (e2e/cluster/descheduler/go.mod repeats its \
         `k8s.io/kube-openapi` replace), run as a process against the local API server.\n\
         - gpu-defrag: `gpu-defrag run` (debug build) started as `make demo` starts it (the \
         cluster admin's kubeconfig, `--leader-elect=false`), one process per control plane.\n",
        cmdline.join(" "),
        machine(),
        started.format("%Y-%m-%d %H:%M UTC"),
    )
}

fn trace_intro(args: &Args, layout: &Layout) -> String {
    format!(
        "\n## A trace-sampled fragmented cluster\n\n\
         **Start state** (per seed): {} nodes drawn from the Alibaba GPU trace's node list \
         (`openb_node_list_gpu_node.csv`, read in place from `{}`); pods drawn from \
         `openb_pod_list_{}.csv` ({} GPU pods, {} of them GPU shares, which get a whole GPU \
         here since the local nodes offer only whole `nvidia.com/gpu`; GPU models are node \
         labels only, pods do not select them) and placed by an emulation of the bin-packing \
         scheduler (MostAllocated, GPU weight 100, cpu and memory 1; cpu, memory, GPUs and \
         pod count must fit) until {:.0}% of the GPUs are used or no drawn pod fits, then \
         {:.0}% of them removed at random; then {} 8-GPU and {} 4-GPU pods of the trace \
         queued: those that fit run, the rest are the pending multi-GPU pods. Every running \
         pod is a 1-replica Deployment with a PodDisruptionBudget `maxUnavailable: 1`; the \
         pending pods are Deployments without one. Budget: {} evictions for every contender \
         (`maxNoOfPodsToEvictTotal` / `maxEvictionsPerRun`). Scheduler of the GPU pods: \
         `{}`.\n\n\
         **Same start state**: a fresh control plane for each contender, built from the same \
         seed. The running pods are created bound to the layout's nodes (`nodeName`), then \
         adopted by a ReplicaSet each, which its Deployment (same template) adopts as its \
         current one: the placement is exactly the layout's, not the scheduler's random \
         tie-breaks, so every contender starts from the identical state (the \"before\" \
         columns show it). Replacements of evicted pods and the pending pods go through the \
         real kube-scheduler.\n\n\
         **Measured** after the contender finished and the pods stopped changing for 6 s: \
         fragment rate (`gpu-defrag report --policy report-policy.yaml -o json` on the live \
         cluster; shapes 8, 4 and 1 GPU, weight 1 each; a pending pod that starts takes idle \
         GPUs, so it can raise the rate), 8-GPU nodes with no GPU in use, 8-GPU nodes given \
         back (free now or running a formerly pending 8-GPU pod, less those at the start), \
         pending multi-GPU pods now Running, GPUs allocated, evictions (start pods gone), \
         replacements that landed back on their source node, replacements not Running, and \
         the time from the contender's start to the last pod change (pods polled every \
         250 ms; the descheduler runs one pass and exits).\n",
        args.nodes,
        args.trace.display(),
        args.workload,
        layout.trace_pods,
        layout.shares_as_whole,
        args.load * 100.0,
        args.departures * 100.0,
        args.pending8,
        args.pending4,
        args.budget,
        args.scheduler_name,
    )
}

fn seed_section(seed: u64, layout: &Layout, rows: &[Row], table: &str) -> String {
    let mut s = format!("\n### Seed {seed}\n\n{}\n\n{table}\n", layout.describe());
    let _ = writeln!(s, "What each contender said (its log, its run record):\n");
    for r in rows {
        let _ = writeln!(s, "- **{}**: {}", r.name, r.note);
    }
    s
}

/// Sums over the seeds per contender, and what they say, as plain comparisons.
fn summary_section(all: &[(u64, Vec<Row>)]) -> String {
    #[derive(Default)]
    struct Sum {
        pending_running: usize,
        pending_total: usize,
        given_back: i64,
        evictions: usize,
        back: usize,
        not_running: usize,
        frag_delta: f64,
        wall: f64,
        n: usize,
    }
    let mut order: Vec<String> = Vec::new();
    let mut sums: BTreeMap<String, Sum> = BTreeMap::new();
    for (_, rows) in all {
        for r in rows {
            if !order.contains(&r.name) {
                order.push(r.name.clone());
            }
            let e = sums.entry(r.name.clone()).or_default();
            e.pending_running += r.after.pending_running;
            e.pending_total += r.after.pending_total;
            e.given_back += r.given_back();
            e.evictions += r.evictions;
            e.back += r.back_on_source;
            e.not_running += r.not_running;
            e.frag_delta += r.after.frag_rate - r.before.frag_rate;
            e.wall += r.wall;
            e.n += 1;
        }
    }
    let seeds: Vec<String> = all.iter().map(|(s, _)| s.to_string()).collect();
    let mut s = format!(
        "\n### Over the seeds ({})\n\n| contender | pending multi-GPU pods Running | 8-GPU nodes given back | evictions | back on source node | replacements not Running | fragment rate change (mean) | time (s, mean) |\n|---|---:|---:|---:|---:|---:|---:|---:|\n",
        seeds.join(", ")
    );
    for name in &order {
        let e = &sums[name];
        let n = e.n.max(1) as f64;
        let _ = writeln!(
            s,
            "| {name} | {}/{} | {} | {} | {} | {} | {:+.3} | {:.1} |",
            e.pending_running,
            e.pending_total,
            e.given_back,
            e.evictions,
            e.back,
            e.not_running,
            e.frag_delta / n,
            e.wall / n
        );
    }
    let gd = order.iter().find(|n| n.starts_with("gpu-defrag"));
    let best = order
        .iter()
        .filter(|n| n.starts_with("descheduler"))
        .max_by(|a, b| {
            let (x, y) = (&sums[*a], &sums[*b]);
            (x.pending_running, x.given_back)
                .cmp(&(y.pending_running, y.given_back))
                .then(y.evictions.cmp(&x.evictions))
        });
    if let (Some(gd), Some(best)) = (gd, best) {
        let (g, b) = (&sums[gd], &sums[best]);
        let cmp = |x: f64, y: f64, more: &str, fewer: &str| {
            if x > y {
                more.to_string()
            } else if x < y {
                fewer.to_string()
            } else {
                "as many as".to_string()
            }
        };
        let lowest_frag = order
            .iter()
            .min_by(|a, b| sums[*a].frag_delta.total_cmp(&sums[*b].frag_delta))
            .cloned()
            .unwrap_or_default();
        let fastest = order
            .iter()
            .filter(|n| sums[*n].evictions > 0)
            .min_by(|a, b| sums[*a].wall.total_cmp(&sums[*b].wall))
            .cloned()
            .unwrap_or_default();
        let _ = writeln!(
            s,
            "\nThe descheduler setting that started the most pending pods is **{best}**. \
             gpu-defrag started {} pending multi-GPU pods ({} it: {} against {}), gave back \
             {} 8-GPU nodes against {}, with {} evictions against {} and {} replacements back \
             on their source node against {}. The largest mean drop of the fragment rate is \
             **{lowest_frag}**'s ({:+.3}; gpu-defrag's {:+.3}); the fragment rate counts idle \
             GPUs, so pending pods that start can raise it. Fastest to settle among those that \
             evicted: **{fastest}** (the descheduler evicts its whole pass at once; gpu-defrag \
             keeps at most `maxInFlight` replacements un-Ready at a time and waits for them).",
            g.pending_running,
            cmp(
                g.pending_running as f64,
                b.pending_running as f64,
                "more than",
                "fewer than"
            ),
            g.pending_running,
            b.pending_running,
            g.given_back,
            b.given_back,
            g.evictions,
            b.evictions,
            g.back,
            b.back,
            sums[&lowest_frag].frag_delta / sums[&lowest_frag].n.max(1) as f64,
            g.frag_delta / g.n.max(1) as f64,
        );
    }
    s
}

fn commands_section(rows: &[Row]) -> String {
    let mut s = String::from("\n### The commands behind each row\n\n");
    let _ = writeln!(
        s,
        "Fragment rate: `gpu-defrag report --policy report-policy.yaml -o json` with\n\n```yaml\n{}```\n",
        report_policy_yaml(NS)
    );
    for r in rows {
        let _ = writeln!(
            s,
            "**{}**: `{}` with\n\n```yaml\n{}```\n",
            r.name, r.command, r.config
        );
    }
    s
}
