//! The operator's own cost at scale: one reconcile's computation (model build → fragmentation
//! → plan → conflicts → decision → conditions → status → metrics) on objects held as the
//! watch caches hold them, with no API server.
//!
//! ```sh
//! cargo run --release -p gpu-defrag-operator --example reconcile_cost -- \
//!     --nodes 10000 --gpus-per-node 8 --pods 200000
//! ```
//!
//! - **Objects**: generated in this process (seeded), then trimmed or projected as the
//!   caches do (`trim_node`, `CachedPod::of`) and put into kube-runtime reflector stores
//!   (`reflector::store()`), as the operator's watches do: Nodes (a share of them with HAMi
//!   device records, the rest whole `nvidia.com/gpu`), Pods of 4-replica Deployments
//!   (owner references to ReplicaSets; HAMi pods carry their device record), Running and
//!   Ready, placed by a spreading scheduler (random node and device that fit: fragmented;
//!   a pod that fits nowhere stays Pending), ReplicaSet metadata (owner reference to its
//!   Deployment), Namespaces, and a PodDisruptionBudget per tenth workload.
//! - **Measured**: each repetition does what one reconcile computes from the caches, by
//!   the reconcile's own functions (`reconcile.rs`): `decide::validate`, the model of the
//!   stores' objects (`ingest::build_cluster_from`, as `Ctx::cluster`), `Observed::of`
//!   (report and plan, as `Ctx::observe`), `decide::conflicts_with`, `Situation::of`,
//!   `decide::decide` (the run decision with its demand arm), `decide::reconciled_status`,
//!   `status_changed`, the status patch body, and `reconcile::record_metrics`. CPU time of the
//!   thread (`/proc/thread-self/schedstat`) and wall time; the median is printed.
//! - **Peak RSS**: `VmHWM` of `/proc/self/status` at the end. It includes the generation
//!   of the objects (built one at a time straight into the stores; the generator keeps
//!   only per-node counters) and the stores themselves, which a running operator holds too.
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use chrono::{TimeDelta, Utc};
use clap::Parser;
use gpu_defrag_api::v1alpha1::{DefragPolicy, DefragPolicySpec, DefragPolicyStatus};
use gpu_defrag_core::ingest::{self, HAMI_NODE_REGISTER, HAMI_POD_ALLOCATED, NVIDIA_GPU};
use gpu_defrag_core::model::Activity;
use gpu_defrag_core::workload::{ControllerKind, Listed};
use gpu_defrag_operator::context::Observed;
use gpu_defrag_operator::controller::decide::{self, Situation};
use gpu_defrag_operator::controller::reconcile::record_metrics;
use gpu_defrag_operator::metrics::Metrics;
use gpu_defrag_operator::objects::{CachedPod, trim_node};
use k8s_openapi::api::core::v1::{
    Container, Node, NodeCondition, NodeSpec, NodeStatus, Pod, PodCondition, PodSpec, PodStatus,
    ResourceRequirements,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, ObjectMeta, OwnerReference, Time,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
struct Args {
    /// Nodes.
    #[arg(long, default_value_t = 10_000)]
    nodes: usize,
    /// GPUs per node.
    #[arg(long, default_value_t = 8)]
    gpus_per_node: u32,
    /// Pods.
    #[arg(long, default_value_t = 200_000)]
    pods: usize,
    /// Share of nodes whose GPUs are shared through HAMi.
    #[arg(long, default_value_t = 0.75)]
    shared_nodes: f64,
    /// Seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Repetitions (the median is printed).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// The policy's `landing.mode`: `Nominate` (landing control, the default) or
    /// `Scheduler` (targets as the scheduler picks them).
    #[arg(long, default_value = "Nominate")]
    landing: String,
    /// Set `spec.demand` (minWait 0s, outside windows) and measure its part of the
    /// reconcile: the waiting pods found, and up to three demand searches.
    #[arg(long)]
    demand: bool,
    /// Pending 8-GPU pods (Unschedulable, of the bin-packing scheduler) added after the
    /// others: with `--demand`, the pods its searches serve.
    #[arg(long, default_value_t = 0)]
    pending_8gpu: usize,
}

const REPLICAS: usize = 4;
const NAMESPACES: usize = 20;
const GPU_MEM_MIB: u64 = 81_920;
const MODEL: &str = "NVIDIA-H100-80GB-HBM3";

fn q(s: impl Into<String>) -> Quantity {
    Quantity(s.into())
}

fn uuid(node: usize, gpu: usize) -> String {
    format!("GPU-{node:08x}-{gpu:04x}-4000-8000-000000000000")
}

fn node_name(i: usize) -> String {
    format!("gpu-node-{i:05}")
}

fn node_obj(i: usize, gpus: u32, shared: bool) -> Node {
    let name = node_name(i);
    let labels: BTreeMap<String, String> = [
        ("kubernetes.io/hostname".to_string(), name.clone()),
        ("nvidia.com/gpu.product".to_string(), MODEL.to_string()),
        ("nvidia.com/gpu.present".to_string(), "true".to_string()),
        ("nvidia.com/gpu.count".to_string(), gpus.to_string()),
    ]
    .into();
    let mut annotations = BTreeMap::new();
    let gpu_alloc = if shared {
        let devs: String = (0..gpus as usize)
            .map(|g| {
                format!(
                    "{},10,{GPU_MEM_MIB},100,{MODEL},0,true,{g},hami-core:",
                    uuid(i, g)
                )
            })
            .collect();
        annotations.insert(HAMI_NODE_REGISTER.to_string(), devs);
        gpus * 10
    } else {
        gpus
    };
    let res: BTreeMap<String, Quantity> = [
        ("cpu".to_string(), q("128")),
        ("memory".to_string(), q("1Ti")),
        ("pods".to_string(), q("110")),
        ("ephemeral-storage".to_string(), q("1Ti")),
        (NVIDIA_GPU.to_string(), q(gpu_alloc.to_string())),
    ]
    .into();
    let ready_since = Time(
        (Utc::now() - TimeDelta::days(30))
            .to_rfc3339()
            .parse()
            .expect("valid"),
    );
    Node {
        metadata: ObjectMeta {
            name: Some(name),
            uid: Some(format!("node-uid-{i}")),
            labels: Some(labels),
            annotations: Some(annotations),
            creation_timestamp: Some(ready_since.clone()),
            ..Default::default()
        },
        spec: Some(NodeSpec::default()),
        status: Some(NodeStatus {
            capacity: Some(res.clone()),
            allocatable: Some(res),
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: "True".into(),
                last_transition_time: Some(ready_since),
                ..Default::default()
            }]),
            ..Default::default()
        }),
    }
}

/// Workload `w`'s names: (namespace, deployment).
fn workload(w: usize) -> (String, String) {
    (format!("team-{}", w % NAMESPACES), format!("svc-{w:06}"))
}

fn pod_obj(
    k: usize,
    node: Option<usize>,
    requests: BTreeMap<String, Quantity>,
    annotations: BTreeMap<String, String>,
    started: &Time,
) -> Pod {
    let w = k / REPLICAS;
    let (ns, deploy) = workload(w);
    let rs = format!("{deploy}-6d4cf56db6");
    let name = format!("{rs}-{:05x}", k % REPLICAS + 0x1000 * (k % 7));
    let owner = OwnerReference {
        api_version: "apps/v1".into(),
        kind: "ReplicaSet".into(),
        name: rs,
        uid: format!("rs-uid-{w}"),
        controller: Some(true),
        block_owner_deletion: Some(true),
    };
    let running = node.is_some();
    Pod {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(ns),
            uid: Some(format!("pod-uid-{k}")),
            labels: Some(
                [
                    ("app".to_string(), deploy),
                    ("pod-template-hash".to_string(), "6d4cf56db6".to_string()),
                ]
                .into(),
            ),
            annotations: Some(annotations),
            owner_references: Some(vec![owner]),
            creation_timestamp: Some(started.clone()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: node.map(node_name),
            scheduler_name: Some(gpu_defrag_api::v1alpha1::BINPACK_SCHEDULER.to_string()),
            containers: vec![Container {
                name: "main".into(),
                image: Some("registry.example/inference:1.0".into()),
                resources: Some(ResourceRequirements {
                    limits: Some(requests.clone()),
                    requests: Some(requests),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: Some(PodStatus {
            phase: Some(if running { "Running" } else { "Pending" }.into()),
            start_time: running.then(|| started.clone()),
            conditions: Some(vec![PodCondition {
                type_: if running { "Ready" } else { "PodScheduled" }.into(),
                status: if running { "True" } else { "False" }.into(),
                reason: (!running).then(|| "Unschedulable".to_string()),
                last_transition_time: (!running).then(|| started.clone()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
    }
}

/// The caches: reflector stores as the watches fill them, plus the owner metadata.
struct Caches {
    nodes: Store<Node>,
    pods: Store<CachedPod>,
    pdbs: Store<PodDisruptionBudget>,
    replica_sets: Vec<ObjectMeta>,
    namespaces: Vec<ObjectMeta>,
    pending: usize,
    /// Wall time spent projecting the pods for the cache (a watch event's cost, once
    /// per pod change; not part of a reconcile).
    projection: std::time::Duration,
}

/// Generates every object, straight into the stores as the watches would fill them.
fn generate(a: &Args) -> Caches {
    let mut rng = StdRng::seed_from_u64(a.seed);
    let shared: Vec<bool> = (0..a.nodes)
        .map(|i| (i as f64) < a.shared_nodes * a.nodes as f64)
        .collect();
    let (nodes, mut nodes_w) = reflector::store::<Node>();
    for (i, &sh) in shared.iter().enumerate() {
        let mut n = node_obj(i, a.gpus_per_node, sh);
        trim_node(&mut n);
        nodes_w.apply_watcher_event(&watcher::Event::Apply(n));
    }
    let started = Time(
        (Utc::now() - TimeDelta::days(1))
            .to_rfc3339()
            .parse()
            .expect("valid"),
    );
    let mut c = Counters {
        free: vec![[1000; 8]; a.nodes],
        cpu_free: vec![128_000; a.nodes],
        slots: vec![110; a.nodes],
        shared,
    };
    let (pods, mut pods_w) = reflector::store::<CachedPod>();
    let mut pending = 0;
    let mut projection = std::time::Duration::ZERO;
    for k in 0..a.pods {
        let (p, placed) = gen_pod(a, k, &mut rng, &mut c, &started);
        if !placed {
            pending += 1;
        }
        let t = Instant::now();
        let p = CachedPod::of(&p);
        projection += t.elapsed();
        pods_w.apply_watcher_event(&watcher::Event::Apply(p));
    }
    for k in a.pods..a.pods + a.pending_8gpu {
        let req: BTreeMap<String, Quantity> = [
            ("cpu".to_string(), q("8000m")),
            ("memory".to_string(), q("16Gi")),
            (NVIDIA_GPU.to_string(), q("8")),
        ]
        .into();
        let p = pod_obj(k, None, req, BTreeMap::new(), &started);
        pods_w.apply_watcher_event(&watcher::Event::Apply(CachedPod::of(&p)));
        pending += 1;
    }
    let workloads = (a.pods + a.pending_8gpu).div_ceil(REPLICAS);
    let namespaces = (0..NAMESPACES)
        .map(|i| ObjectMeta {
            name: Some(format!("team-{i}")),
            uid: Some(format!("ns-uid-{i}")),
            ..Default::default()
        })
        .collect();
    Caches {
        nodes,
        pods,
        pdbs: pdb_store(workloads),
        replica_sets: replica_sets(workloads),
        namespaces,
        pending,
        projection,
    }
}

/// Per-node counters of the spreading scheduler: which nodes share their GPUs (HAMi),
/// free milli per GPU, free cpu milli, free pod slots.
struct Counters {
    shared: Vec<bool>,
    free: Vec<[u16; 8]>,
    cpu_free: Vec<u32>,
    slots: Vec<u8>,
}

/// Up to 64 random nodes of `nodes`: the first that `fits`.
fn probe(rng: &mut StdRng, nodes: usize, fits: impl Fn(usize) -> bool) -> Option<usize> {
    (0..64)
        .map(|_| rng.random_range(0..nodes))
        .find(|&n| fits(n))
}

impl Counters {
    /// A shared node with `cpu` and a GPU with `milli` free, and a random such GPU of
    /// it (taken): (node, GPU).
    fn place_share(
        &mut self,
        rng: &mut StdRng,
        a: &Args,
        cpu: u32,
        milli: u16,
    ) -> Option<(usize, usize)> {
        let g = a.gpus_per_node as usize;
        let n = probe(rng, a.nodes, |n| {
            self.shared[n]
                && self.slots[n] > 0
                && self.cpu_free[n] >= cpu
                && self.free[n][..g].iter().any(|f| *f >= milli)
        })?;
        let devs: Vec<usize> = (0..g).filter(|&d| self.free[n][d] >= milli).collect();
        let d = devs[rng.random_range(0..devs.len())];
        self.free[n][d] -= milli;
        Some((n, d))
    }

    /// A whole-GPU node with `cpu` and `want` GPUs free (its first free ones taken).
    fn place_whole(&mut self, rng: &mut StdRng, a: &Args, cpu: u32, want: usize) -> Option<usize> {
        let g = a.gpus_per_node as usize;
        let n = probe(rng, a.nodes, |n| {
            !self.shared[n]
                && self.slots[n] > 0
                && self.cpu_free[n] >= cpu
                && self.free[n][..g].iter().filter(|f| **f == 1000).count() >= want
        })?;
        let mut left = want;
        for f in self.free[n][..g].iter_mut() {
            if left > 0 && *f == 1000 {
                *f = 0;
                left -= 1;
            }
        }
        Some(n)
    }
}

/// Pod `k`: its workload's shape (a HAMi share or whole GPUs), placed by the spreading
/// scheduler; whether it found a node (else it is Pending).
fn gen_pod(a: &Args, k: usize, rng: &mut StdRng, c: &mut Counters, started: &Time) -> (Pod, bool) {
    // The workload decides the pod's shape: its replicas are alike.
    let mut wr = StdRng::seed_from_u64(a.seed ^ (k / REPLICAS) as u64);
    let is_share = wr.random_bool(0.95);
    let cpu: u32 = [2_000, 4_000, 8_000][wr.random_range(0..3)];
    let mut req: BTreeMap<String, Quantity> = [
        ("cpu".to_string(), q(format!("{cpu}m"))),
        ("memory".to_string(), q("16Gi")),
    ]
    .into();
    let mut ann = BTreeMap::new();
    let node = if is_share {
        let milli: u16 = [100, 200, 250, 300, 500][wr.random_range(0..5)];
        let mem = GPU_MEM_MIB * u64::from(milli) / 1000;
        req.insert(NVIDIA_GPU.into(), q("1"));
        req.insert("nvidia.com/gpumem".into(), q(mem.to_string()));
        c.place_share(rng, a, cpu, milli).map(|(n, d)| {
            ann.insert(
                HAMI_POD_ALLOCATED.to_string(),
                format!("{},NVIDIA,{mem},0:;", uuid(n, d)),
            );
            n
        })
    } else {
        let want: usize = [1, 1, 1, 1, 2, 2, 4][wr.random_range(0..7)];
        req.insert(NVIDIA_GPU.into(), q(want.to_string()));
        c.place_whole(rng, a, cpu, want)
    };
    if let Some(n) = node {
        c.cpu_free[n] -= cpu;
        c.slots[n] -= 1;
    }
    (pod_obj(k, node, req, ann, started), node.is_some())
}

/// The ReplicaSets' metadata: one per workload, owned by its Deployment.
fn replica_sets(workloads: usize) -> Vec<ObjectMeta> {
    (0..workloads)
        .map(|w| {
            let (ns, deploy) = workload(w);
            ObjectMeta {
                name: Some(format!("{deploy}-6d4cf56db6")),
                namespace: Some(ns),
                uid: Some(format!("rs-uid-{w}")),
                owner_references: Some(vec![OwnerReference {
                    api_version: "apps/v1".into(),
                    kind: "Deployment".into(),
                    name: deploy,
                    uid: format!("deploy-uid-{w}"),
                    controller: Some(true),
                    block_owner_deletion: Some(true),
                }]),
                ..Default::default()
            }
        })
        .collect()
}

/// A PodDisruptionBudget (maxUnavailable 1, one disruption allowed) per tenth workload.
fn pdb_store(workloads: usize) -> Store<PodDisruptionBudget> {
    let (pdbs, mut pdbs_w) = reflector::store::<PodDisruptionBudget>();
    for w in (0..workloads).step_by(10) {
        let (ns, deploy) = workload(w);
        let pdb = PodDisruptionBudget {
            metadata: ObjectMeta {
                name: Some(deploy.clone()),
                namespace: Some(ns),
                uid: Some(format!("pdb-uid-{w}")),
                ..Default::default()
            },
            spec: Some(PodDisruptionBudgetSpec {
                max_unavailable: Some(IntOrString::Int(1)),
                selector: Some(LabelSelector {
                    match_labels: Some([("app".to_string(), deploy)].into()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            status: Some(k8s_openapi::api::policy::v1::PodDisruptionBudgetStatus {
                current_healthy: Some(REPLICAS as i32),
                desired_healthy: Some(REPLICAS as i32 - 1),
                disruptions_allowed: Some(1),
                expected_pods: Some(REPLICAS as i32),
                ..Default::default()
            }),
        };
        pdbs_w.apply_watcher_event(&watcher::Event::Apply(pdb));
    }
    pdbs
}

/// Nanoseconds this thread has run (Linux `/proc/thread-self/schedstat`).
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|t| t.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// A `/proc/self/status` field in KiB.
fn proc_kib(field: &str) -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    s.lines()
        .find(|l| l.starts_with(field))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Seconds (CPU, wall) of the phases of one reconcile.
#[derive(Default, Clone)]
struct Phases {
    cpu: BTreeMap<&'static str, f64>,
    wall: BTreeMap<&'static str, f64>,
}

struct Clock {
    cpu: u64,
    wall: Instant,
}

impl Clock {
    fn now() -> Self {
        Clock {
            cpu: thread_cpu_ns(),
            wall: Instant::now(),
        }
    }
}

impl Phases {
    fn lap(&mut self, name: &'static str, since: &mut Clock) {
        let now = Clock::now();
        *self.cpu.entry(name).or_default() += now.cpu.saturating_sub(since.cpu) as f64 / 1e9;
        *self.wall.entry(name).or_default() += (now.wall - since.wall).as_secs_f64();
        *since = now;
    }
}

struct Outcome {
    /// With `--demand`: groups waiting, evictions of the demand run started, its search
    /// steps, and the first record's result.
    demand: Option<(usize, usize, Option<u64>, Option<String>)>,
    phases: Phases,
    moves: usize,
    fragment_rate: f64,
    pods_in_model: usize,
    status_bytes: usize,
}

/// One reconcile's computation, as `reconcile.rs` runs it (without the API calls).
fn reconcile_once(caches: &Caches, dp: &DefragPolicy, metrics: &Metrics) -> Outcome {
    let mut ph = Phases::default();
    let mut clock = Clock::now();
    let now = Utc::now();
    let (policy, windows) = decide::validate(dp).expect("a valid policy");
    let old = dp.status.clone().unwrap_or_default();
    // Ctx::cluster: the stores' objects, borrowed.
    let (nodes, pods, pdbs) = (
        caches.nodes.state(),
        caches.pods.state(),
        caches.pdbs.state(),
    );
    let cluster = ingest::build_cluster_from(
        ingest::ObjectRefs {
            nodes: nodes.iter().map(|n| n.as_ref()).collect(),
            pods: pods.iter().map(|p| &p.0).collect(),
            pdbs: pdbs.iter().map(|p| p.as_ref()).collect(),
            devices: &[],
            controllers: caches
                .replica_sets
                .iter()
                .map(|m| (ControllerKind::ReplicaSet, m))
                .collect(),
            namespaces: caches.namespaces.iter().collect(),
            pod_groups: &[],
            resource_slices: Vec::new(),
            resource_claims: Vec::new(),
            device_classes: Vec::new(),
            device_taint_rules: Vec::new(),
            listed: Listed {
                device_taint_rules: true,
                replica_sets: true,
                stateful_sets: true,
                jobs: true,
                namespaces: true,
                volcano_pod_groups: false,
                kai_pod_groups: false,
                scheduling_pod_groups: false,
            },
        },
        Some(now),
    );
    drop((nodes, pods, pdbs));
    ph.lap("model", &mut clock);
    let obs = Observed::of(
        cluster,
        &policy,
        old.active_run.as_ref(),
        now,
        &Activity::default(),
    );
    ph.lap("report+plan", &mut clock);
    let all = [Arc::new(dp.clone())];
    let conflict = decide::conflicts_with(dp, &all, &obs.cluster);
    // The reconcile's own functions, in its order (the API calls left out: no run acted
    // on, no dry-run check).
    let s = Situation::of(dp, &policy, &windows, &old, &obs, conflict.as_deref(), now);
    let _ = decide::newly_without_gpu_nodes(&s);
    let decided = decide::decide(&s, false, &policy, &obs.cluster);
    ph.lap("decide", &mut clock);
    let st = decide::reconciled_status(
        &s,
        dp,
        &windows,
        false,
        "",
        None,
        None,
        decided.demand.as_ref(),
    );
    let changed = decide::status_changed(&old, &st);
    let body = serde_json::to_vec(&st).expect("status serialises");
    std::hint::black_box(changed);
    record_metrics(metrics, "bench", &policy, &obs, None, s.open.is_some());
    ph.lap("status+metrics", &mut clock);
    let demand = decided.demand.as_ref().map(|c| {
        let start = match &decided.run {
            decide::RunDecision::Demand { start, .. } => Some(start),
            _ => None,
        };
        (
            c.waiting,
            start.map_or(0, |st| st.plan.plan.moves.len()),
            start
                .map(|st| st.plan.steps)
                .or_else(|| c.status.recent.first().map(|_| 0)),
            c.status.recent.first().map(|r| r.result.clone()),
        )
    });
    let (moves, fragment_rate, pods_in_model) = (
        obs.plan.moves.len(),
        obs.report.fragment_rate,
        obs.cluster.pods.len(),
    );
    drop(obs);
    ph.lap("free", &mut clock);
    Outcome {
        demand,
        phases: ph,
        moves,
        fragment_rate,
        pods_in_model,
        status_bytes: body.len(),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let t = Instant::now();
    let caches = generate(&a);
    let gen_s = t.elapsed().as_secs_f64();
    let rss_after_gen = proc_kib("VmRSS:");
    let spec: DefragPolicySpec = serde_json::from_value(serde_json::json!({
        "mode": "Enforce",
        "windows": [{"schedule": "0 2 * * *", "duration": "3h"}],
        "limits": {"maxEvictionsPerRun": 100, "maxEvictionsPerNamespace": 100},
        "landing": {"mode": a.landing},
    }))?;
    let mut spec = spec;
    if a.demand {
        spec.demand = Some(serde_json::from_value(
            serde_json::json!({"minWait": "0s", "outsideWindows": true}),
        )?);
    }
    let mut dp = DefragPolicy::new("bench", spec);
    dp.metadata.generation = Some(1);
    dp.status = Some(DefragPolicyStatus::default());
    let metrics = Metrics::new();
    let mut runs = Vec::new();
    for _ in 0..a.reps.max(1) {
        runs.push(reconcile_once(&caches, &dp, &metrics));
    }
    let total = |o: &Outcome| o.phases.cpu.values().sum::<f64>();
    let total_wall = |o: &Outcome| o.phases.wall.values().sum::<f64>();
    let mut phase_cpu = serde_json::Map::new();
    let mut phase_wall = serde_json::Map::new();
    for k in runs[0].phases.cpu.keys() {
        phase_cpu.insert(
            k.to_string(),
            median(runs.iter().map(|o| o.phases.cpu[k]).collect()).into(),
        );
        phase_wall.insert(
            k.to_string(),
            median(runs.iter().map(|o| o.phases.wall[k]).collect()).into(),
        );
    }
    let last = runs.last().expect("one run");
    let out = serde_json::json!({
        "nodes": a.nodes,
        "gpus": a.nodes * a.gpus_per_node as usize,
        "pods": a.pods,
        "pendingPods": caches.pending,
        "podsInModel": last.pods_in_model,
        "pdbs": caches.pdbs.state().len(),
        "replicaSets": caches.replica_sets.len(),
        "reps": runs.len(),
        "reconcileCpuSeconds": median(runs.iter().map(total).collect()),
        "reconcileWallSeconds": median(runs.iter().map(total_wall).collect()),
        "phaseCpuSeconds": phase_cpu,
        "phaseWallSeconds": phase_wall,
        "plannedEvictions": last.moves,
        "fragmentRate": last.fragment_rate,
        "statusBytes": last.status_bytes,
        "demand": last.demand.as_ref().map(|(w, e, steps, r)| serde_json::json!({
            "waitingGroups": w, "evictions": e, "steps": steps, "firstResult": r,
        })),
        "generateSeconds": gen_s,
        "projectionSeconds": caches.projection.as_secs_f64(),
        "rssAfterGenerateMiB": rss_after_gen.map(|k| k as f64 / 1024.0),
        "peakRssMiB": proc_kib("VmHWM:").map(|k| k as f64 / 1024.0),
    });
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}
