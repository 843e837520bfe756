//! Churn replay over days: the trace's GPU nodes under a stream of seeded Poisson
//! arrivals, a queueing scheduler, maintenance windows, and one descheduler (or none)
//! per run; queueing delay per shape class, allocation ratio, evictions, disruption.
//!
//! - **Arrivals**: pods drawn uniformly (seeded) from the workload's GPU pod list; their
//!   lifetime is drawn from the trace's own `deletion_time − creation_time` of the pods
//!   of the same shape class (`share`, `1`, `2-4`, `8` GPUs), capped at
//!   `max_lifetime_hours`; the lists without these columns (multigpu*) use the
//!   lifetimes of `default`. The Poisson rate offers `load` of the GPU capacity
//!   (rate = load · capacity / E[demand · lifetime]). At time 0 the cluster is filled
//!   with the stationary population of that process (as many pods as the rate times the
//!   mean lifetime, lifetimes drawn length-biased, each with a uniform residual), placed
//!   in random order by the run's scheduler; the warm-up then churns it.
//! - **Scheduler**: a queue in which a pod that does not fit waits without blocking the
//!   others (FIFO among those that fit). Bin-packing emulation (the `bench` one):
//!   MostAllocated node on GPU after placement (ties: node order), best-fit device.
//!   `fgd-placement` replaces it with FGD's scoring (the node and devices whose
//!   fragmentation F_n(M) rises least, M the workload's shapes covering 95% of its pods;
//!   ties: MostAllocated, then node order).
//! - **Windows**: the descheduler runs once per window opening (at its start), with a
//!   budget of `budget` · running GPU pods evictions. Evicted pods are replaced at once
//!   (their replacement enters the queue with the remaining lifetime); scheduling takes
//!   no time. The baselines evict their whole choice at once. gpu-defrag's run follows
//!   the executor over simulated time ([`step_run`]): its fences (drained nodes, and
//!   single GPUs where the node can fence them) hold from its start to its end; one
//!   eviction at a time (`maxInFlight`), the next once the replacement is Ready
//!   (`ready_seconds` after it is bound); before each eviction the run stops at the
//!   window's end, on a replacement not Ready within `rescheduleTimeout`, or when more
//!   GPU pods created since the run started are pending than `maxPendingGpuPods` plus
//!   the replacements in flight.
//! - `oracle`: at each window start every running pod is placed again from scratch,
//!   largest first on the node it leaves with the least free GPU (best fit decreasing),
//!   for free (no eviction counted), then the queue is served in order: a reference for
//!   what window-based defragmentation could reach (a good repacking, not a bound). A
//!   repacking that cannot place every running pod again is not used (that window is
//!   counted in `runsSkipped.repack-incomplete`).
//! - **Polled rows** ([`demand`]): `gpu-defrag-demand` (the nightly run plus demand runs
//!   at any time), `gpu-defrag-demand-only` (demand runs, no nightly run) and
//!   `kai-consolidation` look at the queue every `POLL_SECONDS`.
//! - **Services** (`--services FRACTION`, [`services`]): that share of the offered load is
//!   long-running, daily-scaled replicas of 40 services; the trace's jobs offer the rest.
//! - **Measures** after `warmup_days`: time-averaged GPU allocation ratio; queueing
//!   delay (arrival → running) of the pods arriving after warm-up, per class (pods still
//!   queued at the end count with their wait so far); pods queued at the end;
//!   evictions; disruption (eviction → replacement running).
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::path::PathBuf;

use chrono::{DateTime, TimeDelta, Utc};
use gpu_defrag_api::v1alpha1::Window;
use gpu_defrag_core::frag;
use gpu_defrag_core::model::*;
use gpu_defrag_core::plan::{self, History};
use gpu_defrag_core::policy::{DemandPolicy, Policy, TargetShape};
use gpu_defrag_core::run::{self, Ended, Limits, RunState, Sent, Stop, Verdict};
use gpu_defrag_core::sched;
use gpu_defrag_core::windows::Windows;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::bench;
use crate::scenario;
use crate::services::{self, Service};

mod demand;
use crate::trace::{self, Trace};

/// Planners in report order. `gpu-defrag-unguarded` is gpu-defrag with
/// `maxPendingGpuPods` lifted; `gpu-defrag-8gpu` is that plus an 8-GPU target shape of weight
/// [`bench::WHOLE_NODE_SHAPE_WEIGHT`] (the policy a user who wants whole nodes writes).
///
/// `kai-consolidation` is a KAI-style consolidation at every poll, `gpu-defrag-demand`
/// gpu-defrag's nightly run plus demand runs at any time, `gpu-defrag-demand-only` the
/// demand runs alone ([`demand`]).
pub const PLANNERS: [&str; 11] = [
    "none",
    "high-node-utilization",
    "fgd-descheduler",
    "kai-consolidation",
    "gpu-defrag",
    "gpu-defrag-demand",
    "gpu-defrag-demand-only",
    "gpu-defrag-unguarded",
    "gpu-defrag-8gpu",
    "fgd-placement",
    "oracle",
];

/// Shape classes (GPUs asked).
pub const CLASSES: [&str; 4] = ["share", "1", "2-4", "8"];
/// Percentiles reported.
pub const PERCENTILES: [(&str, f64); 3] = [("p50", 50.0), ("p95", 95.0), ("p99", 99.0)];

const HOUR: f64 = 3600.0;
const DAY: f64 = 86400.0;
const NONE: u32 = u32::MAX;

/// The class of a shape: 0 share, 1 one GPU, 2 two to four, 3 more.
pub fn class_of(num_gpu: u32, milli: u32) -> usize {
    match num_gpu {
        0 | 1 if milli < GPU_MILLI => 0,
        0 | 1 => 1,
        2..=4 => 2,
        _ => 3,
    }
}

/// Nearest-rank percentile of sorted values (None when empty).
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// Replay parameters.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Params {
    /// Workload (pod list).
    pub workload: String,
    /// Seed.
    pub seed: u64,
    /// Simulated days (warm-up included).
    pub days: f64,
    /// Warm-up days (not measured).
    pub warmup_days: f64,
    /// Offered GPU load (fraction of capacity).
    pub load: f64,
    /// Window schedules (cron, UTC).
    pub windows: Vec<String>,
    /// Window length, hours.
    pub window_hours: f64,
    /// Budget per run: fraction of running GPU pods.
    pub budget: f64,
    /// Lifetime cap, hours.
    pub max_lifetime_hours: f64,
    /// HighNodeUtilization threshold, percent.
    pub hnu_threshold: f64,
    /// gpu-defrag: `safety.maxPendingGpuPods` (the run stops before its next eviction
    /// when more GPU pods created since it started are pending, beyond the replacements
    /// in flight).
    pub max_pending_gpu_pods: u32,
    /// gpu-defrag: seconds from a replacement's binding to its being Ready (the pace of
    /// a run: with `maxInFlight: 1` one eviction per replacement Ready).
    pub ready_seconds: f64,
    /// Share of the offered GPU load that is long-running inference services
    /// ([`services`]); the trace's jobs offer the rest.
    pub services: f64,
}

/// One pod shape of the workload.
#[derive(Debug, Clone)]
struct Tpl {
    gpus: u32,
    milli: u32,
    cpu: u64,
    mem: u64,
    /// Allowed model ids as a bit mask (0: any).
    models: u64,
    class: usize,
    demand: u64,
}

/// One arrival of the shared stream.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Arrival {
    /// Time, seconds.
    pub t: f64,
    /// Trace pod index.
    pub tpl: u32,
    /// Lifetime, seconds.
    pub life: f64,
}

/// The arrival stream of a seed: the stationary population at t = 0, then Poisson
/// arrivals until `horizon`. `life_by_class[c]` are the lifetimes to draw from (capped).
pub fn arrivals(
    classes: &[usize],
    demand: &[u64],
    life_by_class: &[Vec<f64>; 4],
    capacity_milli: f64,
    load: f64,
    horizon: f64,
    seed: u64,
) -> (Vec<Arrival>, f64) {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed_a771_7a15);
    let n = classes.len();
    let mean = |v: &Vec<f64>| {
        if v.is_empty() {
            0.0
        } else {
            v.iter().sum::<f64>() / v.len() as f64
        }
    };
    let mean_life: Vec<f64> = life_by_class.iter().map(mean).collect();
    let max_life = life_by_class
        .iter()
        .flatten()
        .fold(1.0f64, |a, &b| a.max(b));
    let usable: Vec<usize> = (0..n)
        .filter(|&i| !life_by_class[classes[i]].is_empty())
        .collect();
    if usable.is_empty() {
        return (Vec::new(), 0.0);
    }
    let e_dt: f64 = usable
        .iter()
        .map(|&i| demand[i] as f64 * mean_life[classes[i]])
        .sum::<f64>()
        / usable.len() as f64;
    let e_t: f64 = usable.iter().map(|&i| mean_life[classes[i]]).sum::<f64>() / usable.len() as f64;
    let rate = load * capacity_milli / e_dt.max(1e-9);
    let draw = |rng: &mut StdRng| -> (u32, f64) {
        let i = usable[rng.random_range(0..usable.len())];
        let v = &life_by_class[classes[i]];
        (i as u32, v[rng.random_range(0..v.len())].max(1.0))
    };
    let mut out = Vec::new();
    // Stationary population: length-biased lifetimes (rejection), uniform residual.
    let initial = (rate * e_t).round() as usize;
    while out.len() < initial {
        let (tpl, life) = draw(&mut rng);
        if rng.random::<f64>() * max_life <= life {
            let residual = (rng.random::<f64>() * life).max(1.0);
            out.push(Arrival {
                t: 0.0,
                tpl,
                life: residual,
            });
        }
    }
    let mut t = 0.0;
    loop {
        t += -(1.0 - rng.random::<f64>()).ln() / rate;
        if t >= horizon {
            break;
        }
        let (tpl, life) = draw(&mut rng);
        out.push(Arrival { t, tpl, life });
    }
    (out, rate)
}

/// Window openings `[start, end)` in seconds from `base`, up to `horizon`.
pub fn window_openings(
    schedules: &[String],
    hours: f64,
    base: DateTime<Utc>,
    horizon: f64,
) -> anyhow::Result<Vec<(f64, f64)>> {
    if schedules.is_empty() {
        return Ok(Vec::new());
    }
    let minutes = (hours * 60.0).round() as i64;
    anyhow::ensure!(minutes > 0, "--window-hours must be positive");
    let ws: Vec<Window> = schedules
        .iter()
        .map(|s| Window {
            schedule: s.clone(),
            duration: format!("{minutes}m"),
            time_zone: None,
        })
        .collect();
    let ws = Windows::parse(&ws).map_err(|e| anyhow::anyhow!("--window: {e}"))?;
    let mut out = Vec::new();
    let mut now = base;
    while let Some(span) = ws.next(now) {
        let s = (span.start - base).num_milliseconds() as f64 / 1000.0;
        if s >= horizon {
            break;
        }
        let e = (span.end - base).num_milliseconds() as f64 / 1000.0;
        if out.last().is_none_or(|&(ls, _)| s > ls) {
            out.push((s.max(0.0), e));
        }
        now = span.end.max(span.start + TimeDelta::seconds(1));
    }
    Ok(out)
}

/// The simulated start: midnight UTC (windows are read from it).
pub fn base_time() -> DateTime<Utc> {
    DateTime::from_timestamp(1_767_225_600, 0).expect("valid") // 2026-01-01T00:00:00Z
}

// ------------------------------------------------------------------ cluster state

#[derive(Debug, Clone)]
struct NodeS {
    gpus: usize,
    free: [u32; 8],
    cpu_free: u64,
    mem_free: u64,
    pods_free: u64,
    model: u64, // bit
    group: usize,
}

impl NodeS {
    fn free_total(&self) -> u64 {
        self.free[..self.gpus].iter().map(|&f| u64::from(f)).sum()
    }
}

/// Best-fit devices on free milli per GPU (the `sched::pick_devices` rule): for a
/// share the fullest GPU that fits, for whole GPUs the first fully free ones. A bit mask.
fn pick(free: &[u32], gpus: u32, milli: u32) -> Option<u8> {
    if gpus == 1 && milli < GPU_MILLI {
        let mut best: Option<(u32, usize)> = None;
        for (i, &f) in free.iter().enumerate() {
            if f >= milli && best.is_none_or(|(bf, _)| f < bf) {
                best = Some((f, i));
            }
        }
        return best.map(|(_, i)| 1u8 << i);
    }
    let mut mask = 0u8;
    let mut k = 0;
    for (i, &f) in free.iter().enumerate() {
        if k < gpus && f >= milli {
            mask |= 1 << i;
            k += 1;
        }
    }
    (k == gpus).then_some(mask)
}

fn node_ok(n: &NodeS, t: &Tpl) -> bool {
    (t.models == 0 || t.models & n.model != 0)
        && n.cpu_free >= t.cpu
        && n.mem_free >= t.mem
        && n.pods_free > 0
        && n.gpus >= t.gpus as usize
}

/// F_n(M) of free milli per GPU, for shapes without cpu, memory or model terms.
fn frag_of(free: &[u32], shapes: &[TargetShape]) -> f64 {
    let idle: u64 = free.iter().map(|&r| u64::from(r)).sum();
    shapes
        .iter()
        .map(|m| {
            let fits = free.iter().filter(|&&r| r >= m.milli_per_gpu).count() >= m.gpus as usize;
            let f = if fits {
                free.iter()
                    .filter(|&&r| r < m.milli_per_gpu)
                    .map(|&r| u64::from(r))
                    .sum()
            } else {
                idle
            };
            m.weight * f as f64
        })
        .sum()
}

/// GPU milli, cpu milli, memory bytes.
type Size = (u64, u64, u64);

#[derive(Debug, Clone)]
struct PodS {
    tpl: u32,
    /// When this incarnation entered the queue.
    queued_at: f64,
    /// Lifetime left when it starts.
    remaining: f64,
    end: f64,
    node: u32,
    devs: u8,
    epoch: u32,
    seq: u64,
    /// Evicted (or displaced) at: its replacement's disruption is measured.
    evicted_at: Option<f64>,
    /// Counted in the queueing delay (arrived after warm-up, not a replacement).
    measured: bool,
    bound_at: f64,
    /// The service it is a replica of ([`NONE`]: a trace job).
    svc: u32,
}

/// Which scheduler places pods.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Placer {
    BinPack,
    Fgd,
}

#[derive(Clone)]
struct Fences {
    node: Vec<bool>,
    gpu: Vec<u8>,
}

/// The `runsEnded` key of how a run ended.
fn end_key(stop: Option<&Stop>) -> &'static str {
    match stop {
        None => "succeeded",
        Some(Stop::PendingPileUp(_)) => "pending",
        Some(Stop::Stalled(_)) => "stalled",
        Some(Stop::WindowClosed) => "window-closed",
        Some(Stop::LostLeadership) => "lost-leadership",
        Some(Stop::Requested(_)) => "stopped",
    }
}

/// A gpu-defrag run in progress: the operator's own run ([`gpu_defrag_core::run`]) over
/// simulated time. A replacement is Ready `ready_seconds` after it is bound; the fences
/// hold until the run ends.
#[derive(Clone)]
struct RunSim {
    /// The queue's sequence number when the run started: pods queued after it were
    /// created since (replacements, arrivals).
    start_seq: u64,
    /// Planned evictions in plan order: (pod, its node then, its epoch then).
    moves: Vec<(usize, u32, u32)>,
    /// The run's decisions; each wait keeps its pod (= its replacement).
    state: RunState<usize>,
    /// When the run looks again.
    next_step: f64,
    ready_seconds: f64,
    /// Simulated time 0.
    base: DateTime<Utc>,
}

impl RunSim {
    fn at(&self, t: f64) -> DateTime<Utc> {
        self.base + TimeDelta::milliseconds((t * 1000.0).round() as i64)
    }

    fn seconds(&self, at: DateTime<Utc>) -> f64 {
        (at - self.base).num_milliseconds() as f64 / 1000.0
    }
}

/// The workload of a replay pod in the run's state machine: its service, or itself (each
/// trace task is its own workload).
fn workload_of(sim: &Sim, pi: usize) -> String {
    match sim.pods[pi].svc {
        NONE => format!("pod-{pi}"),
        s => format!("svc-{s}"),
    }
}

#[derive(Clone)]
struct Sim<'a> {
    tpl: &'a [Tpl],
    nodes: Vec<NodeS>,
    /// Per group (GPU count, model): (free milli, node) in order.
    index: Vec<std::collections::BTreeSet<(u64, u32)>>,
    group_gpus: Vec<usize>,
    group_model: Vec<u64>,
    pods: Vec<PodS>,
    /// Queue buckets: 0 share, k whole k-GPU pods (k ≤ 8); seq → pod.
    queue: Vec<BTreeMap<u64, usize>>,
    seq: u64,
    heap: BinaryHeap<Reverse<(u64, usize, u32)>>,
    placer: Placer,
    fgd_shapes: Vec<TargetShape>,
    /// Fences in force (a gpu-defrag run): the scheduler skips them.
    fences: Option<Fences>,
    /// The gpu-defrag run in progress.
    run: Option<RunSim>,
    capacity: u64,
    alloc: u64,
    // measures
    t_prev: f64,
    warmup: f64,
    alloc_integral: f64,
    waits: [Vec<f64>; 4],
    disruptions: Vec<f64>,
    evictions: usize,
    displaced: usize,
    runs: usize,
    runs_skipped: BTreeMap<String, usize>,
    runs_ended: BTreeMap<String, usize>,
    /// Allocated milli integrated from time 0 (for the time series).
    alloc_integral_all: f64,
    /// `alloc_integral_all` at the last sample.
    sample_integral: f64,
    /// Replicas of each service, in creation order.
    svc_pods: Vec<Vec<usize>>,
    /// Evictions of service replicas.
    svc_evictions: usize,
    /// What the polled rows did ([`demand`]).
    demand: demand::Stats,
}

fn bucket_of(t: &Tpl) -> usize {
    if t.gpus == 1 && t.milli < GPU_MILLI {
        0
    } else {
        (t.gpus as usize).min(8)
    }
}

impl<'a> Sim<'a> {
    fn new(tpl: &'a [Tpl], nodes: Vec<NodeS>, placer: Placer, shapes: Vec<TargetShape>) -> Self {
        let groups = nodes.iter().map(|n| n.group).max().map_or(0, |g| g + 1);
        let mut group_gpus = vec![0; groups];
        let mut group_model = vec![0; groups];
        let mut index = vec![std::collections::BTreeSet::new(); groups];
        for (i, n) in nodes.iter().enumerate() {
            group_gpus[n.group] = n.gpus;
            group_model[n.group] = n.model;
            index[n.group].insert((n.free_total(), i as u32));
        }
        let capacity = nodes.iter().map(|n| n.gpus as u64 * 1000).sum();
        Sim {
            tpl,
            nodes,
            index,
            group_gpus,
            group_model,
            pods: Vec::new(),
            queue: vec![BTreeMap::new(); 9],
            seq: 0,
            heap: BinaryHeap::new(),
            placer,
            fgd_shapes: shapes,
            fences: None,
            run: None,
            capacity,
            alloc: 0,
            t_prev: 0.0,
            warmup: 0.0,
            alloc_integral: 0.0,
            waits: Default::default(),
            disruptions: Vec::new(),
            evictions: 0,
            displaced: 0,
            runs: 0,
            runs_skipped: BTreeMap::new(),
            runs_ended: BTreeMap::new(),
            alloc_integral_all: 0.0,
            sample_integral: 0.0,
            svc_pods: Vec::new(),
            svc_evictions: 0,
            demand: demand::Stats::default(),
        }
    }

    fn advance(&mut self, t: f64) {
        let from = self.t_prev.max(self.warmup);
        if t > from {
            self.alloc_integral += self.alloc as f64 * (t - from);
        }
        if t > self.t_prev {
            self.alloc_integral_all += self.alloc as f64 * (t - self.t_prev);
        }
        self.t_prev = t;
    }

    fn set_free(&mut self, n: usize, f: impl FnOnce(&mut NodeS)) {
        let node = &mut self.nodes[n];
        let g = node.group;
        self.index[g].remove(&(node.free_total(), n as u32));
        f(node);
        self.index[g].insert((node.free_total(), n as u32));
    }

    fn bind(&mut self, pi: usize, n: usize, devs: u8, t: f64) {
        let tp = &self.tpl[self.pods[pi].tpl as usize];
        let (milli, cpu, mem, demand) = (tp.milli, tp.cpu, tp.mem, tp.demand);
        self.set_free(n, |node| {
            for g in 0..node.gpus {
                if devs & (1 << g) != 0 {
                    node.free[g] -= milli;
                }
            }
            node.cpu_free -= cpu;
            node.mem_free -= mem;
            node.pods_free -= 1;
        });
        self.alloc += demand;
        let p = &mut self.pods[pi];
        p.node = n as u32;
        p.devs = devs;
        p.bound_at = t;
        p.end = t + p.remaining;
        p.epoch += 1;
        if p.measured {
            let c = tp.class;
            self.waits[c].push(t - p.queued_at);
            self.pods[pi].measured = false;
        }
        if let Some(e) = self.pods[pi].evicted_at.take() {
            self.disruptions.push(t - e);
        }
        let p = &self.pods[pi];
        self.heap.push(Reverse((p.end.to_bits(), pi, p.epoch)));
    }

    fn unbind(&mut self, pi: usize) -> usize {
        let p = &self.pods[pi];
        let n = p.node as usize;
        let devs = p.devs;
        let tp = &self.tpl[p.tpl as usize];
        let (milli, cpu, mem, demand) = (tp.milli, tp.cpu, tp.mem, tp.demand);
        self.set_free(n, |node| {
            for g in 0..node.gpus {
                if devs & (1 << g) != 0 {
                    node.free[g] += milli;
                }
            }
            node.cpu_free += cpu;
            node.mem_free += mem;
            node.pods_free += 1;
        });
        self.alloc -= demand;
        let p = &mut self.pods[pi];
        p.node = NONE;
        p.devs = 0;
        p.epoch += 1;
        n
    }

    fn enqueue(&mut self, pi: usize) {
        self.seq += 1;
        self.pods[pi].seq = self.seq;
        let b = bucket_of(&self.tpl[self.pods[pi].tpl as usize]);
        self.queue[b].insert(self.seq, pi);
    }

    fn dequeue(&mut self, pi: usize) {
        let b = bucket_of(&self.tpl[self.pods[pi].tpl as usize]);
        self.queue[b].remove(&self.pods[pi].seq);
    }

    fn queued(&self) -> usize {
        self.queue.iter().map(BTreeMap::len).sum()
    }

    /// Appends the point of the interval ending at `t` (state before the events at `t`).
    fn sample(&mut self, t: f64, every: f64, series: &mut Vec<Sample>) {
        self.advance(t);
        let prev = series.last().map_or(0.0, |s: &Sample| s.t);
        let integral_prev = self.sample_integral;
        self.sample_integral = self.alloc_integral_all;
        series.push(Sample {
            t,
            allocation_ratio: (self.alloc_integral_all - integral_prev)
                / (t - prev).max(every * 1e-9)
                / self.capacity.max(1) as f64,
            queued_8gpu: self.queue[5..].iter().map(BTreeMap::len).sum(),
        });
    }

    /// Where the scheduler puts pod `pi` (the fences in force are skipped).
    fn target(&self, pi: usize) -> Option<(usize, u8)> {
        let t = &self.tpl[self.pods[pi].tpl as usize];
        if self.placer == Placer::BinPack {
            return self.target_indexed(t, self.fences.as_ref());
        }
        self.target_scan(pi, self.fences.as_ref())
    }

    /// Free milli per GPU of node `n` as the scheduler sees it (fenced GPUs: none).
    fn free_seen(&self, n: usize) -> [u32; 8] {
        let node = &self.nodes[n];
        let mut free = node.free;
        if let Some(f) = &self.fences {
            if f.node[n] {
                return [0; 8];
            }
            for (g, x) in free.iter_mut().enumerate().take(node.gpus) {
                if f.gpu[n] & (1 << g) != 0 {
                    *x = 0;
                }
            }
        }
        free
    }

    /// [`Sim::target`] by a scan of every node (FGD's scoring; the reference the
    /// index is tested against).
    fn target_scan(&self, pi: usize, fences: Option<&Fences>) -> Option<(usize, u8)> {
        let t = &self.tpl[self.pods[pi].tpl as usize];
        let mut best: Option<(f64, u64, usize, u8)> = None; // (Δfrag, -, node, devs)
        for (n, node) in self.nodes.iter().enumerate() {
            if !node_ok(node, t) || node.free_total() < t.demand {
                continue;
            }
            let mut free = node.free;
            if let Some(f) = fences {
                if f.node[n] {
                    continue;
                }
                for (g, x) in free.iter_mut().enumerate().take(node.gpus) {
                    if f.gpu[n] & (1 << g) != 0 {
                        *x = 0;
                    }
                }
            }
            let free = &free[..node.gpus];
            let score = sched::most_allocated_score(node.gpus, node.free_total(), t.demand);
            match self.placer {
                Placer::BinPack => {
                    if best.as_ref().is_some_and(|b| score <= b.1) {
                        continue;
                    }
                    if let Some(d) = pick(free, t.gpus, t.milli) {
                        best = Some((0.0, score, n, d));
                    }
                }
                Placer::Fgd => {
                    let before = frag_of(free, &self.fgd_shapes);
                    let try_devs = |d: u8, best: &mut Option<(f64, u64, usize, u8)>| {
                        let mut after = [0u32; 8];
                        after[..free.len()].copy_from_slice(free);
                        for (g, x) in after.iter_mut().enumerate().take(free.len()) {
                            if d & (1 << g) != 0 {
                                *x -= t.milli;
                            }
                        }
                        let delta = frag_of(&after[..free.len()], &self.fgd_shapes) - before;
                        let better = match best {
                            None => true,
                            Some((bd, bs, _, _)) => {
                                delta < *bd - 1e-9 || ((delta - *bd).abs() <= 1e-9 && score > *bs)
                            }
                        };
                        if better {
                            *best = Some((delta, score, n, d));
                        }
                    };
                    if t.gpus == 1 && t.milli < GPU_MILLI {
                        let mut seen = [u32::MAX; 8];
                        for (g, &f) in free.iter().enumerate() {
                            if f >= t.milli && !seen.contains(&f) {
                                seen[g] = f;
                                try_devs(1 << g, &mut best);
                            }
                        }
                    } else if let Some(d) = pick(free, t.gpus, t.milli) {
                        try_devs(d, &mut best);
                    }
                }
            }
        }
        best.map(|(_, _, n, d)| (n, d))
    }

    /// Bin-packing through the index: per group (same size, same model) the first node
    /// in free-milli order that fits is the group's best; the best group wins.
    /// Fenced nodes are passed over; fenced GPUs count as full for the device pick (the
    /// score is the node's, as the scan has it).
    fn target_indexed(&self, t: &Tpl, fences: Option<&Fences>) -> Option<(usize, u8)> {
        let mut best: Option<(u64, usize, u8)> = None;
        for g in 0..self.index.len() {
            if self.group_gpus[g] < t.gpus as usize
                || (t.models != 0 && t.models & self.group_model[g] == 0)
            {
                continue;
            }
            for &(free_total, n) in self.index[g].range((t.demand, 0)..) {
                let node = &self.nodes[n as usize];
                let score = sched::most_allocated_score(node.gpus, free_total, t.demand);
                if best.is_some_and(|(s, bn, _)| score < s || (score == s && bn < n as usize)) {
                    break;
                }
                if !node_ok(node, t) {
                    continue;
                }
                let mut free = node.free;
                if let Some(f) = fences {
                    if f.node[n as usize] {
                        continue;
                    }
                    let m = f.gpu[n as usize];
                    if m != 0 {
                        for (g, x) in free.iter_mut().enumerate().take(node.gpus) {
                            if m & (1 << g) != 0 {
                                *x = 0;
                            }
                        }
                    }
                }
                if let Some(d) = pick(&free[..node.gpus], t.gpus, t.milli) {
                    best = Some((score, n as usize, d));
                    break;
                }
            }
        }
        best.map(|(_, n, d)| (n, d))
    }

    fn try_place(&mut self, pi: usize, t: f64) -> bool {
        match self.target(pi) {
            Some((n, d)) => {
                self.bind(pi, n, d, t);
                true
            }
            None => false,
        }
    }

    /// Serves the whole queue in order.
    fn serve_all(&mut self, t: f64) {
        let mut all: Vec<(u64, usize)> = self
            .queue
            .iter()
            .flat_map(|q| q.iter().map(|(s, p)| (*s, *p)))
            .collect();
        all.sort_unstable();
        for (_, pi) in all {
            if self.target(pi).is_some() {
                self.dequeue(pi);
                self.try_place(pi, t);
            }
        }
    }

    /// Serves the queue after node `n` gained capacity: only `n` can take a queued pod
    /// (every other node refused each of them since and gained nothing).
    fn serve_node(&mut self, n: usize, t: f64) {
        if self.fences.as_ref().is_some_and(|f| f.node[n]) {
            return;
        }
        let mut cursor = [0u64; 9];
        loop {
            let node = &self.nodes[n];
            let seen = self.free_seen(n);
            let seen = &seen[..node.gpus];
            let max_free = seen.iter().copied().max().unwrap_or(0);
            let whole = seen.iter().filter(|&&f| f == GPU_MILLI).count();
            let mut next: Option<(u64, usize, usize)> = None;
            for (b, &cur) in cursor.iter().enumerate() {
                let ok = if b == 0 {
                    max_free > 0
                } else {
                    whole >= b && b <= node.gpus
                };
                if !ok {
                    continue;
                }
                if let Some((&s, &pi)) = self.queue[b]
                    .range((std::ops::Bound::Excluded(cur), std::ops::Bound::Unbounded))
                    .next()
                    && next.is_none_or(|(ns, _, _)| s < ns)
                {
                    next = Some((s, pi, b));
                }
            }
            let Some((s, pi, b)) = next else { break };
            cursor[b] = s;
            let tp = &self.tpl[self.pods[pi].tpl as usize];
            let node = &self.nodes[n];
            if node_ok(node, tp)
                && let Some(d) = self.node_devs(n, tp)
            {
                self.dequeue(pi);
                self.bind(pi, n, d, t);
            }
        }
    }

    /// Devices of `tp` on node `n` as the scheduler would pick them.
    fn node_devs(&self, n: usize, tp: &Tpl) -> Option<u8> {
        let node = &self.nodes[n];
        let seen = self.free_seen(n);
        let free = &seen[..node.gpus];
        match self.placer {
            Placer::BinPack => pick(free, tp.gpus, tp.milli),
            Placer::Fgd => {
                if tp.gpus == 1 && tp.milli < GPU_MILLI {
                    let before = frag_of(free, &self.fgd_shapes);
                    let mut best: Option<(f64, u8)> = None;
                    for (g, &f) in free.iter().enumerate() {
                        if f >= tp.milli {
                            let mut after = seen;
                            after[g] -= tp.milli;
                            let d = frag_of(&after[..node.gpus], &self.fgd_shapes) - before;
                            if best.is_none_or(|(bd, _)| d < bd - 1e-9) {
                                best = Some((d, 1 << g));
                            }
                        }
                    }
                    best.map(|(_, m)| m)
                } else {
                    pick(free, tp.gpus, tp.milli)
                }
            }
        }
    }

    fn depart(&mut self, pi: usize, t: f64) {
        let n = self.unbind(pi);
        self.serve_node(n, t);
    }

    fn arrive(&mut self, a: &Arrival, measured: bool) {
        let pi = self.pods.len();
        self.pods.push(PodS {
            tpl: a.tpl,
            queued_at: a.t,
            remaining: a.life,
            end: 0.0,
            node: NONE,
            devs: 0,
            epoch: 0,
            seq: 0,
            evicted_at: None,
            measured,
            bound_at: 0.0,
            svc: NONE,
        });
        if !self.try_place(pi, a.t) {
            self.enqueue(pi);
        }
    }

    /// Evicts pods: each replacement enters the queue at once with its remaining life.
    fn evict(&mut self, pis: &[usize], t: f64) {
        for &pi in pis {
            if self.pods[pi].node == NONE {
                continue;
            }
            self.unbind(pi);
            let p = &mut self.pods[pi];
            p.remaining = (p.end - t).max(1.0);
            p.evicted_at = Some(t);
            p.queued_at = t;
            self.evictions += 1;
            if p.svc != NONE {
                self.svc_evictions += 1;
            }
            self.enqueue(pi);
        }
    }

    /// Scales every service to its replicas wanted at `t` (the hour): new replicas enter
    /// the queue (placed at once when they fit); scale-down deletes pending replicas
    /// first, then the newest running ones.
    fn scale_services(&mut self, svcs: &[Service], t: f64, measured: bool) {
        if self.svc_pods.len() < svcs.len() {
            self.svc_pods.resize(svcs.len(), Vec::new());
        }
        for (k, s) in svcs.iter().enumerate() {
            let want = s.replicas(t);
            let have = self.svc_pods[k].len();
            for _ in have..want {
                let pi = self.pods.len();
                self.pods.push(PodS {
                    tpl: s.tpl,
                    queued_at: t,
                    remaining: SERVICE_LIFE,
                    end: 0.0,
                    node: NONE,
                    devs: 0,
                    epoch: 0,
                    seq: 0,
                    evicted_at: None,
                    measured,
                    bound_at: 0.0,
                    svc: k as u32,
                });
                self.svc_pods[k].push(pi);
                if !self.try_place(pi, t) {
                    self.enqueue(pi);
                }
            }
            if want < have {
                let mut list = std::mem::take(&mut self.svc_pods[k]);
                // Pending first (newest first), then running, newest first.
                let mut order: Vec<(bool, Reverse<usize>, usize)> = list
                    .iter()
                    .enumerate()
                    .map(|(i, &pi)| (self.pods[pi].node != NONE, Reverse(i), pi))
                    .collect();
                order.sort_unstable();
                let gone: Vec<usize> = order.iter().take(have - want).map(|x| x.2).collect();
                let mut freed = Vec::new();
                for &pi in &gone {
                    if self.pods[pi].node == NONE {
                        self.dequeue(pi);
                        self.pods[pi].epoch += 1;
                    } else {
                        freed.push(self.unbind(pi));
                    }
                    self.pods[pi].evicted_at = None;
                    self.pods[pi].measured = false;
                }
                list.retain(|pi| !gone.contains(pi));
                self.svc_pods[k] = list;
                freed.sort_unstable();
                freed.dedup();
                for n in freed {
                    self.serve_node(n, t);
                }
            }
        }
    }

    fn running(&self) -> Vec<usize> {
        (0..self.pods.len())
            .filter(|&i| self.pods[i].node != NONE)
            .collect()
    }

    fn queued_pods(&self) -> Vec<usize> {
        let mut v: Vec<(u64, usize)> = self
            .queue
            .iter()
            .flat_map(|q| q.iter().map(|(s, p)| (*s, *p)))
            .collect();
        v.sort_unstable();
        v.into_iter().map(|(_, p)| p).collect()
    }

    /// Best fit for the oracle's repacking: the node left with the least free GPU milli
    /// after placement (small nodes fill first, big ones stay whole), ties node order.
    fn best_fit(&self, pi: usize) -> Option<(usize, u8)> {
        let t = &self.tpl[self.pods[pi].tpl as usize];
        let mut best: Option<(u64, usize, u8)> = None;
        for (n, node) in self.nodes.iter().enumerate() {
            let free = node.free_total();
            if free < t.demand || !node_ok(node, t) {
                continue;
            }
            let left = free - t.demand;
            if best.is_some_and(|(b, _, _)| left >= b) {
                continue;
            }
            if let Some(d) = pick(&node.free[..node.gpus], t.gpus, t.milli) {
                best = Some((left, n, d));
            }
        }
        best.map(|(_, n, d)| (n, d))
    }

    /// Oracle: every running pod placed again from scratch (best fit decreasing), for
    /// free; then the queue in order.
    fn oracle(&mut self, t: f64) {
        let running = self.running();
        let queued = self.queued_pods();
        // (GPU, cpu, memory: largest first), running first, queue order.
        let mut all: Vec<(Reverse<Size>, u8, u64, usize)> = Vec::new();
        for &pi in &running {
            let tp = &self.tpl[self.pods[pi].tpl as usize];
            all.push((
                Reverse((tp.demand, tp.cpu, tp.mem)),
                0,
                self.pods[pi].seq,
                pi,
            ));
            let p = &mut self.pods[pi];
            p.remaining = (p.end - t).max(1.0);
            self.unbind(pi);
        }
        // Running pods first (they keep running), largest first; then the queue in order.
        all.sort_unstable();
        for &pi in &queued {
            all.push((Reverse((0, 0, 0)), 1, self.pods[pi].seq, pi));
            self.dequeue(pi);
        }
        for (_, was_queued, _, pi) in all {
            let bound_at = self.pods[pi].bound_at;
            let placed = if was_queued == 0 {
                match self.best_fit(pi) {
                    Some((n, d)) => {
                        self.bind(pi, n, d, t);
                        true
                    }
                    None => false,
                }
            } else {
                self.try_place(pi, t)
            };
            if placed {
                if was_queued == 0 {
                    // A running pod moved for free: it keeps its age.
                    self.pods[pi].bound_at = bound_at;
                }
            } else {
                if was_queued == 0 {
                    self.displaced += 1;
                    self.pods[pi].evicted_at = Some(t);
                    self.pods[pi].queued_at = t;
                }
                self.enqueue(pi);
            }
        }
    }
}

// ------------------------------------------------------------------ planners at a window

struct Ctx<'a> {
    trace: &'a Trace,
    base_nodes: &'a [Node],
    params: &'a Params,
    base: DateTime<Utc>,
}

/// The cluster model of the state: running pods bound, queued pods pending. Returns it
/// with the sim pod index of every model pod.
fn to_cluster(sim: &Sim, ctx: &Ctx) -> (Cluster, Vec<usize>) {
    to_cluster_on(sim, ctx, None)
}

/// [`to_cluster`] for a demand search serving queued pod `served` on one of the nodes
/// `on` ([`demand`]): every node's capacity (read from the nodes, not summed from the
/// pods), the running pods of those nodes only, and of the queued pods the served one
/// and the service replicas (their workload's availability).
fn to_cluster_on(sim: &Sim, ctx: &Ctx, on: Option<(&[bool], usize)>) -> (Cluster, Vec<usize>) {
    let mut nodes = ctx.base_nodes.to_vec();
    for (n, s) in sim.nodes.iter().enumerate() {
        let node = &mut nodes[n];
        // Every node was Ready before the replay began (old enough for minNodeAge).
        node.ready_since = Some(ctx.base - TimeDelta::days(1));
        for g in 0..s.gpus {
            node.gpus[g].used = GPU_MILLI - s.free[g];
        }
        node.cpu_used = node.cpu_alloc - s.cpu_free;
        node.mem_used = node.mem_alloc - s.mem_free;
        node.pods_used = node.pods_alloc - s.pods_free;
    }
    let mut pods = Vec::new();
    let mut ids = Vec::new();
    let running = sim
        .running()
        .into_iter()
        .filter(|&pi| on.is_none_or(|(on, _)| on[sim.pods[pi].node as usize]));
    let queued = sim
        .queued_pods()
        .into_iter()
        .filter(|&pi| on.is_none_or(|(_, served)| pi == served || sim.pods[pi].svc != NONE));
    for pi in running.chain(queued) {
        let p = &sim.pods[pi];
        let tp = &ctx.trace.pods[p.tpl as usize];
        let name = format!("p{pi}");
        let mut pod = if p.node == NONE {
            scenario::pod_of(tp, name, None, &[])
        } else {
            let n = p.node as usize;
            let devs: Vec<usize> = (0..8).filter(|g| p.devs & (1 << g) != 0).collect();
            scenario::pod_of(tp, name, Some((n, &nodes[n].name)), &devs)
        };
        if p.node != NONE {
            pod.started =
                Some(ctx.base + TimeDelta::milliseconds((p.bound_at * 1000.0).round() as i64));
        } else {
            pod.unschedulable_since =
                Some(ctx.base + TimeDelta::milliseconds((p.queued_at * 1000.0).round() as i64));
        }
        if p.svc != NONE {
            // A replica of a Deployment: the replicas share their ReplicaSet.
            let rs = format!("svc-{}", p.svc);
            pod.labels = BTreeMap::from([("app".to_string(), rs.clone())]).into();
            pod.owner = Some(Owner {
                group: "apps".into(),
                kind: "ReplicaSet".into(),
                name: rs.clone(),
            });
            pod.workload = Some(Workload::checked("apps/ReplicaSet", &rs));
        }
        pods.push(pod);
        ids.push(pi);
    }
    (
        Cluster {
            nodes,
            pods,
            pdbs: vec![],
            now: None,
            ..Default::default()
        },
        ids,
    )
}

/// The policy gpu-defrag runs with: the default policy, the budget as
/// `maxEvictionsPerRun`; the per-namespace limit lifted to it (the trace has one
/// namespace) and `evictSingleReplicas` (each trace task is its own workload).
pub fn gpu_defrag_policy(budget: u32, max_pending: u32) -> Policy {
    Policy {
        max_evictions_per_run: budget,
        max_evictions_per_namespace: budget,
        evict_single_replicas: true,
        max_pending_gpu_pods: max_pending,
        ..Policy::default()
    }
}

/// One window opening: the planner's evictions, then the queue. gpu-defrag starts a run
/// (its evictions then follow over time, [`step_run`]).
fn window(sim: &mut Sim, ctx: &Ctx, planner: &str, t: f64, window_end: f64) {
    if planner == "oracle" {
        // The repacking is kept only when every running pod found a place again (greedy
        // best fit can fail at high load): the oracle never displaces a running pod.
        let mut trial = sim.clone();
        trial.oracle(t);
        if trial.displaced == sim.displaced {
            *sim = trial;
            sim.runs += 1;
        } else {
            *sim.runs_skipped
                .entry("repack-incomplete".into())
                .or_default() += 1;
        }
        return;
    }
    if sim.run.is_some() {
        // The previous run is still going (windows closer than a run): no second one.
        *sim.runs_skipped.entry("running".into()).or_default() += 1;
        return;
    }
    let running_gpu = sim.pods.iter().filter(|p| p.node != NONE).count();
    let budget = ((ctx.params.budget.max(0.0) * running_gpu as f64).floor() as usize).max(1);
    let (c, ids) = to_cluster(sim, ctx);
    let chosen: Vec<usize> = match planner {
        "high-node-utilization" => {
            bench::choose_high_node_utilization(&c, budget, ctx.params.hnu_threshold).evicted
        }
        "fgd-descheduler" => {
            let shapes = frag::default_shapes(&c, &Default::default());
            bench::choose_fgd(&c, budget, &shapes).evicted
        }
        "gpu-defrag" | "gpu-defrag-demand" | "gpu-defrag-unguarded" | "gpu-defrag-8gpu" => {
            let mut policy = gpu_defrag_policy(budget as u32, ctx.params.max_pending_gpu_pods);
            if !matches!(planner, "gpu-defrag" | "gpu-defrag-demand") {
                policy.max_pending_gpu_pods = u32::MAX;
            }
            if planner == "gpu-defrag-8gpu" {
                let shapes = frag::default_shapes(&c, &Default::default());
                policy.shapes = bench::with_whole_node_shape(
                    &bench::bench_policy(shapes, budget as u32),
                    bench::WHOLE_NODE_SHAPE_WEIGHT,
                )
                .shapes;
            }
            let now = ctx.base + TimeDelta::milliseconds((t * 1000.0).round() as i64);
            let p = plan::plan(&c, &policy, Some(now), &History::default());
            if std::env::var_os("REPLAY_DEBUG").is_some() {
                eprintln!(
                    "t={:.1}h pending={} rate={:.4} moves={} skipped={:?} shapes={}",
                    t / HOUR,
                    sim.queued(),
                    p.before.fragment_rate,
                    p.moves.len(),
                    p.skipped,
                    p.shapes.len()
                );
            }
            if p.before.fragment_rate < policy.min_fragment_rate {
                *sim.runs_skipped.entry("trigger".into()).or_default() += 1;
            } else if !p.moves.is_empty() {
                let mut f = Fences {
                    node: vec![false; c.nodes.len()],
                    gpu: vec![0; c.nodes.len()],
                };
                for n in &p.fenced_nodes {
                    if let Some(i) = c.node_index(n) {
                        f.node[i] = true;
                    }
                }
                for d in &p.fenced_devices {
                    if let Some(i) = c.node_index(&d.node)
                        && let Some(g) = c.nodes[i].gpus.iter().position(|x| x.key == d.gpu)
                    {
                        f.gpu[i] |= 1 << g;
                    }
                }
                let moves: Vec<(usize, u32, u32)> = p
                    .moves
                    .iter()
                    .map(|m| {
                        let pi = ids[m.pod_index];
                        (pi, sim.pods[pi].node, sim.pods[pi].epoch)
                    })
                    .collect();
                let steps = p
                    .moves
                    .iter()
                    .zip(&moves)
                    .map(|(m, &(pi, _, _))| run::Planned {
                        pod: m.pod.clone(),
                        batch: m.batch,
                        workload: Some(workload_of(sim, pi)),
                    })
                    .collect();
                sim.fences = Some(f);
                let end = ctx.base + TimeDelta::milliseconds((window_end * 1000.0).round() as i64);
                sim.run = Some(RunSim {
                    start_seq: sim.seq,
                    moves,
                    state: RunState::new(steps, Limits::of(&policy), end),
                    next_step: t,
                    ready_seconds: ctx.params.ready_seconds.max(0.0),
                    base: ctx.base,
                });
                sim.runs += 1;
                step_run(sim, t);
            }
            return;
        }
        _ => Vec::new(),
    };
    let pis: Vec<usize> = chosen.iter().map(|&i| ids[i]).collect();
    if !pis.is_empty() {
        sim.runs += 1;
    }
    sim.evict(&pis, t);
    sim.serve_all(t);
}

/// One look of the gpu-defrag run at time `t`: the executor's shell over simulated time.
/// A wait ends when its replacement has been bound `ready_seconds` (or its pod ended); the
/// re-check verdict is the plan's own (the pod still on its node, same incarnation, else
/// passed over); GPU pods pending since the start are those queued after it.
fn step_run(sim: &mut Sim, t: f64) {
    let Some(mut r) = sim.run.take() else { return };
    let now = r.at(t);
    r.state.settle(|w| {
        let p = &sim.pods[w.detail];
        if p.node != NONE {
            return (t >= p.bound_at + r.ready_seconds)
                .then_some(Ended::Replaced { bounced: false });
        }
        let b = bucket_of(&sim.tpl[p.tpl as usize]);
        // Not queued, not bound: it ended.
        (!sim.queue[b].contains_key(&p.seq)).then_some(Ended::Replaced { bounced: false })
    });
    let mut step = r.state.next(None, true, now);
    let stop = loop {
        match step {
            run::Step::Wait { until } => {
                // The next look: a replacement's Ready, a poll while one is queued, a
                // timeout.
                let (mut next_ready, mut poll) = (f64::INFINITY, f64::INFINITY);
                for w in r.state.in_flight() {
                    let p = &sim.pods[w.detail];
                    if p.node == NONE {
                        poll = t + POLL_SECONDS;
                    } else {
                        next_ready = next_ready.min(p.bound_at + r.ready_seconds);
                    }
                }
                let until = until.map_or(f64::INFINITY, |u| r.seconds(u));
                r.next_step = next_ready.min(poll).min(until).max(t + 1e-3);
                sim.run = Some(r);
                return;
            }
            run::Step::Check(i) => {
                let pending: usize = sim
                    .queue
                    .iter()
                    .map(|q| q.range(r.start_seq + 1..).count())
                    .sum();
                let (pi, node, epoch) = r.moves[i];
                let verdict = if sim.pods[pi].node == node && sim.pods[pi].epoch == epoch {
                    Verdict::Go
                } else {
                    Verdict::PassOver // gone (ended) or elsewhere: its unit goes on
                };
                step = match r.state.judged(i, pending, verdict) {
                    Some(s) => s,
                    None => r.state.next(None, true, now),
                };
            }
            run::Step::Evict(i) => {
                let (pi, node, _) = r.moves[i];
                sim.evict(&[pi], t);
                sim.dequeue(pi);
                if !sim.try_place(pi, t) {
                    sim.enqueue(pi);
                }
                sim.serve_node(node as usize, t);
                r.state.sent(i, Sent::Evicted(pi), now);
                step = r.state.next(None, true, now);
            }
            run::Step::GiveUp { .. } => step = r.state.next(None, true, now),
            run::Step::Done(stop) => break stop,
        }
    };
    *sim.runs_ended
        .entry(end_key(stop.as_ref()).into())
        .or_default() += 1;
    sim.fences = None;
    sim.serve_all(t);
}

/// How often a run looks again at a replacement that is still queued, seconds (and how
/// often the polled rows look at the queue, [`demand`]).
const POLL_SECONDS: f64 = 30.0;

/// Lifetime of a service replica: beyond any replay (it runs until scaled down).
const SERVICE_LIFE: f64 = 1e12;

// ------------------------------------------------------------------ one run

/// What one planner reached.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Outcome {
    /// Planner.
    pub planner: String,
    /// Seed.
    pub seed: u64,
    /// Time-averaged allocated GPU / capacity after warm-up.
    pub allocation_ratio: f64,
    /// Pods evicted.
    pub evictions: usize,
    /// Runs that evicted (or re-placed, oracle).
    pub runs: usize,
    /// Window openings without a run, by reason (gpu-defrag: `pending`, more pending
    /// GPU pods than `maxPendingGpuPods`; `trigger`, fragment rate under the trigger;
    /// oracle: `repack-incomplete`, its repacking could not place every running pod).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub runs_skipped: BTreeMap<String, usize>,
    /// gpu-defrag: how its runs ended (`succeeded`; `pending`, stopped by
    /// `maxPendingGpuPods`; `stalled`, a replacement not Ready within
    /// `rescheduleTimeout`; `window-closed`).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub runs_ended: BTreeMap<String, usize>,
    /// Oracle: running pods its re-placement could not fit (back in the queue).
    #[serde(skip_serializing_if = "is_zero")]
    pub displaced: usize,
    /// Evictions of service replicas (`--services`).
    #[serde(skip_serializing_if = "is_zero")]
    pub service_evictions: usize,
    /// The polled rows (`gpu-defrag-demand`, `gpu-defrag-demand-only`,
    /// `kai-consolidation`): planner calls by
    /// outcome, runs, evictions, where the served and evicted pods went.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub demand: Option<demand::Stats>,
    /// Pods queued at the end.
    pub pending_at_end: usize,
    /// Pods queued at the end, per class.
    pub pending_at_end_by_class: BTreeMap<String, usize>,
    /// Queueing delay percentiles, seconds, per class.
    pub wait_seconds: BTreeMap<String, BTreeMap<String, f64>>,
    /// Pods measured per class.
    pub measured_pods: BTreeMap<String, usize>,
    /// Eviction → replacement running, seconds (replacements still queued count with
    /// their wait so far).
    pub disruption_seconds: BTreeMap<String, f64>,
    /// CPU seconds of the run.
    pub cpu_seconds: f64,
    /// Time series for `--plot`: one point per [`SAMPLE_SECONDS`].
    #[serde(skip)]
    pub series: Vec<Sample>,
}

pub use crate::plot::Sample;

/// Interval of the time series, seconds.
pub const SAMPLE_SECONDS: f64 = 1800.0;

fn is_zero(x: &usize) -> bool {
    *x == 0
}

/// The workload prepared once per (workload, seed): shapes, arrivals.
pub struct Prepared {
    trace: Trace,
    tpl: Vec<Tpl>,
    nodes: Vec<NodeS>,
    base_nodes: Vec<Node>,
    arrivals: Vec<Arrival>,
    shapes: Vec<TargetShape>,
    /// Long-running services (`--services`).
    services: Vec<Service>,
    /// Arrivals per hour.
    pub rate_per_hour: f64,
    /// Pods at time 0.
    pub initial_pods: usize,
    /// Where lifetimes came from.
    pub lifetimes_from: String,
}

/// Loads the trace and draws the arrival stream.
pub fn prepare(dir: &std::path::Path, p: &Params) -> anyhow::Result<Prepared> {
    let trace = trace::load(dir, &p.workload)?;
    let (life, from) = match trace::load_lifetimes(dir, &p.workload)? {
        Some(l) => (l, p.workload.clone()),
        None => {
            let l = trace::load_lifetimes(dir, "default")?
                .ok_or_else(|| anyhow::anyhow!("default pod list has no lifetimes"))?;
            (l, "default".to_string())
        }
    };
    let life_src = if from == p.workload {
        trace.pods.clone()
    } else {
        trace::load(dir, "default")?.pods
    };
    anyhow::ensure!(life.len() == life_src.len(), "lifetimes do not match pods");
    let cap = p.max_lifetime_hours * HOUR;
    let mut life_by_class: [Vec<f64>; 4] = Default::default();
    for (tp, l) in life_src.iter().zip(&life) {
        life_by_class[class_of(tp.num_gpu, tp.gpu_milli)].push((*l as f64).min(cap));
    }
    // Model ids.
    let mut models: HashMap<String, u32> = HashMap::new();
    for n in &trace.nodes {
        let k = models.len() as u32;
        models.entry(n.model.clone()).or_insert(k);
    }
    anyhow::ensure!(models.len() <= 64, "more than 64 GPU models");
    let mut groups: HashMap<(u32, u32), usize> = HashMap::new();
    let nodes: Vec<NodeS> = trace
        .nodes
        .iter()
        .map(|n| {
            let m = models[&n.model];
            let k = groups.len();
            let group = *groups.entry((n.gpus, m)).or_insert(k);
            let gpus = (n.gpus as usize).min(8);
            let mut free = [0; 8];
            free[..gpus].fill(GPU_MILLI);
            NodeS {
                gpus,
                free,
                cpu_free: n.cpu_milli,
                mem_free: n.memory_mib << 20,
                pods_free: scenario::PODS_PER_NODE,
                model: 1 << m,
                group,
            }
        })
        .collect();
    let tpl: Vec<Tpl> = trace
        .pods
        .iter()
        .map(|t| Tpl {
            gpus: t.num_gpu,
            milli: t.gpu_milli,
            cpu: t.cpu_milli,
            mem: t.memory_mib << 20,
            models: t
                .models
                .iter()
                .filter_map(|m| models.get(m))
                .fold(0u64, |a, &b| a | (1 << b))
                | if t.models.is_empty() { 0 } else { 1 << 63 },
            class: class_of(t.num_gpu, t.gpu_milli),
            demand: u64::from(t.num_gpu) * u64::from(t.gpu_milli),
        })
        .collect();
    let classes: Vec<usize> = tpl.iter().map(|t| t.class).collect();
    let demand: Vec<u64> = tpl.iter().map(|t| t.demand).collect();
    let capacity: u64 = nodes.iter().map(|n| n.gpus as u64 * 1000).sum();
    let svc_share = p.services.clamp(0.0, 1.0);
    // Services: shapes of the list's shares and one-GPU pods that name no GPU model.
    let small: Vec<u32> = trace
        .pods
        .iter()
        .enumerate()
        .filter(|(_, t)| t.models.is_empty() && class_of(t.num_gpu, t.gpu_milli) <= 1)
        .map(|(i, _)| i as u32)
        .collect();
    let services = services::draw(
        &small,
        &demand,
        svc_share * p.load * capacity as f64,
        p.seed,
    );
    let (arrivals, rate) = arrivals(
        &classes,
        &demand,
        &life_by_class,
        capacity as f64,
        p.load * (1.0 - svc_share),
        p.days * DAY,
        p.seed,
    );
    let initial_pods = arrivals.iter().take_while(|a| a.t == 0.0).count();
    // FGD's target workload: the shapes of the pod list covering 95% of its pods.
    let list = Cluster {
        pods: trace
            .pods
            .iter()
            .map(|t| scenario::pod_of(t, t.name.clone(), None, &[]))
            .collect(),
        ..Default::default()
    };
    let shapes = frag::default_shapes(&list, &Default::default());
    let base_nodes = scenario::nodes_of(&trace);
    Ok(Prepared {
        trace,
        tpl,
        nodes,
        base_nodes,
        arrivals,
        shapes,
        services,
        rate_per_hour: rate * HOUR,
        initial_pods,
        lifetimes_from: from,
    })
}

/// Runs one planner over the prepared stream.
pub fn run(prep: &Prepared, p: &Params, planner: &str) -> anyhow::Result<Outcome> {
    anyhow::ensure!(
        PLANNERS.contains(&planner),
        "unknown planner {planner:?} (one of {})",
        PLANNERS.join(", ")
    );
    let timer = crate::cputime::Timer::start();
    let horizon = p.days * DAY;
    let warmup = (p.warmup_days * DAY).min(horizon);
    let base = base_time();
    let windows = if matches!(
        planner,
        "none" | "fgd-placement" | "kai-consolidation" | "gpu-defrag-demand-only"
    ) {
        Vec::new()
    } else {
        window_openings(&p.windows, p.window_hours, base, horizon)?
    };
    let placer = if planner == "fgd-placement" {
        Placer::Fgd
    } else {
        Placer::BinPack
    };
    let mut sim = Sim::new(&prep.tpl, prep.nodes.clone(), placer, prep.shapes.clone());
    sim.warmup = warmup;
    let ctx = Ctx {
        trace: &prep.trace,
        base_nodes: &prep.base_nodes,
        params: p,
        base,
    };
    let mut ai = 0;
    let mut wi = 0;
    let sample_every = SAMPLE_SECONDS;
    let mut next_sample = sample_every;
    let mut series = Vec::new();
    // Services: their replicas at t = 0 are placed first, then scaled at every hour.
    let mut next_hour = if prep.services.is_empty() {
        None
    } else {
        sim.scale_services(&prep.services, 0.0, false);
        Some(HOUR)
    };
    let mut next_poll = demand::polled(planner).then_some(POLL_SECONDS);
    loop {
        let next_dep = sim.heap.peek().map(|Reverse((b, _, _))| f64::from_bits(*b));
        let next_arr = prep.arrivals.get(ai).map(|a| a.t);
        let next_win = windows.get(wi).map(|w| w.0);
        let next_step = sim.run.as_ref().map(|r| r.next_step);
        let t = [
            next_dep, next_arr, next_win, next_step, next_hour, next_poll,
        ]
        .into_iter()
        .flatten()
        .fold(f64::INFINITY, f64::min);
        if t >= horizon || !t.is_finite() {
            break;
        }
        while next_sample <= t && next_sample < horizon {
            sim.sample(next_sample, sample_every, &mut series);
            next_sample += sample_every;
        }
        sim.advance(t);
        if next_step == Some(t) {
            step_run(&mut sim, t);
        } else if next_hour == Some(t) {
            sim.scale_services(&prep.services, t, t >= warmup);
            next_hour = Some(t + HOUR);
        } else if next_poll == Some(t) {
            demand::poll(&mut sim, &ctx, planner, t);
            next_poll = Some(t + POLL_SECONDS);
        } else if next_dep == Some(t) {
            let Reverse((_, pi, epoch)) = sim.heap.pop().expect("peeked");
            if sim.pods[pi].epoch == epoch && sim.pods[pi].node != NONE {
                sim.depart(pi, t);
            }
        } else if next_win == Some(t) {
            window(&mut sim, &ctx, planner, t, windows[wi].1);
            wi += 1;
        } else {
            let a = prep.arrivals[ai];
            sim.arrive(&a, a.t >= warmup);
            ai += 1;
        }
    }
    while next_sample < horizon {
        sim.sample(next_sample, sample_every, &mut series);
        next_sample += sample_every;
    }
    sim.advance(horizon);
    // Pods still queued: their wait so far.
    let mut pending_by_class: BTreeMap<String, usize> = BTreeMap::new();
    let mut disruptions = sim.disruptions.clone();
    for pi in sim.queued_pods() {
        let pod = &sim.pods[pi];
        let c = prep.tpl[pod.tpl as usize].class;
        *pending_by_class.entry(CLASSES[c].to_string()).or_default() += 1;
        if pod.measured {
            sim.waits[c].push(horizon - pod.queued_at);
        }
        if let Some(e) = pod.evicted_at {
            disruptions.push(horizon - e);
        }
    }
    let mut wait_seconds: BTreeMap<String, BTreeMap<String, f64>> = BTreeMap::new();
    let mut measured = BTreeMap::new();
    for (c, w) in sim.waits.iter_mut().enumerate() {
        if w.is_empty() {
            continue;
        }
        w.sort_by(f64::total_cmp);
        measured.insert(CLASSES[c].to_string(), w.len());
        for (name, q) in PERCENTILES {
            wait_seconds
                .entry(name.to_string())
                .or_default()
                .insert(CLASSES[c].to_string(), percentile(w, q).expect("non-empty"));
        }
    }
    disruptions.sort_by(f64::total_cmp);
    let mut disruption_seconds = BTreeMap::new();
    if !disruptions.is_empty() {
        disruption_seconds.insert(
            "mean".to_string(),
            disruptions.iter().sum::<f64>() / disruptions.len() as f64,
        );
        for (name, q) in PERCENTILES {
            disruption_seconds.insert(name.to_string(), percentile(&disruptions, q).expect("x"));
        }
        disruption_seconds.insert("total".to_string(), disruptions.iter().sum::<f64>());
    }
    let span = (horizon - warmup).max(1e-9);
    Ok(Outcome {
        planner: planner.to_string(),
        seed: p.seed,
        allocation_ratio: sim.alloc_integral / span / sim.capacity.max(1) as f64,
        evictions: sim.evictions,
        runs: sim.runs,
        runs_skipped: sim.runs_skipped.clone(),
        runs_ended: sim.runs_ended.clone(),
        displaced: sim.displaced,
        service_evictions: sim.svc_evictions,
        demand: demand::polled(planner).then(|| sim.demand.clone()),
        pending_at_end: sim.queued(),
        pending_at_end_by_class: pending_by_class,
        wait_seconds,
        measured_pods: measured,
        disruption_seconds,
        cpu_seconds: timer.stop().1,
        series,
    })
}

/// Command-line arguments of `replay`.
pub struct Args {
    /// Trace directory.
    pub dir: PathBuf,
    /// Workloads.
    pub workloads: Vec<String>,
    /// Seeds.
    pub seeds: Vec<u64>,
    /// Parameters (workload and seed are overwritten per run).
    pub params: Params,
    /// Planners.
    pub planners: Vec<String>,
    /// `--plot`: the time series of the first (workload, seed), drawn into this PNG.
    pub plot: Option<PathBuf>,
}

/// Runs every (workload, seed, planner).
pub fn run_all(a: &Args) -> anyhow::Result<serde_json::Value> {
    let planners: Vec<String> = if a.planners.is_empty() {
        PLANNERS.iter().map(|s| s.to_string()).collect()
    } else {
        a.planners.clone()
    };
    let mut results = Vec::new();
    let mut streams = Vec::new();
    let mut plotted = false;
    for w in &a.workloads {
        for &seed in &a.seeds {
            let mut p = a.params.clone();
            p.workload = w.clone();
            p.seed = seed;
            let prep = prepare(&a.dir, &p)?;
            eprintln!(
                "{w} seed {seed}: {} arrivals ({:.0}/h, {} at t=0), lifetimes of {}",
                prep.arrivals.len(),
                prep.rate_per_hour,
                prep.initial_pods,
                prep.lifetimes_from
            );
            streams.push(serde_json::json!({
                "workload": w, "seed": seed, "arrivals": prep.arrivals.len(),
                "arrivalsPerHour": prep.rate_per_hour, "initialPods": prep.initial_pods,
                "lifetimesFrom": prep.lifetimes_from,
            }));
            let mut series = Vec::new();
            for name in &planners {
                let mut o = run(&prep, &p, name)?;
                series.push((name.clone(), std::mem::take(&mut o.series)));
                eprintln!(
                    "  {name:<22} alloc {:.4}  evictions {:>5}  pending {:>4}  {:.1}s",
                    o.allocation_ratio, o.evictions, o.pending_at_end, o.cpu_seconds
                );
                let mut v = serde_json::to_value(&o)?;
                v["workload"] = serde_json::json!(w);
                results.push(v);
            }
            if let Some(file) = a.plot.as_ref().filter(|_| !plotted) {
                plotted = true;
                let title = format!(
                    "{w}, seed {seed}: load {}, window {} for {} h, budget {}",
                    p.load,
                    p.windows.join(" + "),
                    p.window_hours,
                    p.budget
                );
                crate::plot::replay(file, &title, p.warmup_days * DAY, &series)?;
                eprintln!("plot: {}", file.display());
            }
        }
    }
    Ok(serde_json::json!({
        "parameters": {
            "trace": a.dir.display().to_string(),
            "workloads": a.workloads,
            "seeds": a.seeds,
            "days": a.params.days,
            "warmupDays": a.params.warmup_days,
            "load": a.params.load,
            "windows": a.params.windows,
            "windowHours": a.params.window_hours,
            "budget": a.params.budget,
            "maxLifetimeHours": a.params.max_lifetime_hours,
            "hnuThresholdPercent": a.params.hnu_threshold,
            "maxPendingGpuPods": a.params.max_pending_gpu_pods,
            "readySeconds": a.params.ready_seconds,
            "services": a.params.services,
            "descheduler": "once per window opening, at its start",
            "demand": {
                "minWaitSeconds": DemandPolicy::default().min_wait.as_secs_f64(),
                "maxEvictions": DemandPolicy::default().max_evictions,
                "maxEvictionsPerHour": DemandPolicy::default().max_evictions_per_hour,
                "pollSeconds": POLL_SECONDS,
                "triesPerPoll": gpu_defrag_core::plan::demand::GROUPS_PER_LOOK,
                "kaiPodsPerPoll": demand::KAI_PER_POLL,
            },
        },
        "streams": streams,
        "results": results,
    }))
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

fn fmt_s(x: Option<f64>) -> String {
    match x {
        None => "–".into(),
        Some(s) if s < 60.0 => format!("{s:.0}s"),
        Some(s) if s < 3600.0 => format!("{:.1}m", s / 60.0),
        Some(s) => format!("{:.1}h", s / 3600.0),
    }
}

/// Markdown: per workload, medians over seeds of every planner.
pub fn markdown(out: &serde_json::Value) -> String {
    let results = out["results"].as_array().cloned().unwrap_or_default();
    let mut workloads: Vec<String> = Vec::new();
    let mut planners: Vec<String> = Vec::new();
    for r in &results {
        let w = r["workload"].as_str().unwrap_or("").to_string();
        let p = r["planner"].as_str().unwrap_or("").to_string();
        if !workloads.contains(&w) {
            workloads.push(w);
        }
        if !planners.contains(&p) {
            planners.push(p);
        }
    }
    let mut s = String::new();
    let par = &out["parameters"];
    let services = par["services"].as_f64().unwrap_or(0.0);
    for w in &workloads {
        let seeds = par["seeds"].to_string();
        let mix = if services > 0.0 {
            format!(
                "trace jobs + services at {:.0}% of the load",
                services * 100.0
            )
        } else {
            "trace jobs only".to_string()
        };
        s.push_str(&format!(
            "\n**{w}**, load {}, {mix} (medians over seeds {seeds}; wait = queueing delay, \
             arrival → running)\n\n",
            par["load"]
        ));
        s.push_str("| planner | alloc. ratio | evictions | pending at end | p95 wait share | p95 wait 1 | p95 wait 2-4 | p95 wait 8 | p99 wait 8 | p50 wait 8 | p50 wait share / 1 / 2-4 | mean disruption |");
        s.push_str(if services > 0.0 {
            " service replicas evicted |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
        } else {
            "\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
        });
        for p in &planners {
            let rows: Vec<&serde_json::Value> = results
                .iter()
                .filter(|r| r["workload"] == *w && r["planner"] == *p)
                .collect();
            let med = |f: &dyn Fn(&serde_json::Value) -> Option<f64>| {
                median(rows.iter().filter_map(|r| f(r)).collect())
            };
            let wait = |q: &'static str, c: &'static str| {
                med(&move |r: &serde_json::Value| r["waitSeconds"][q][c].as_f64())
            };
            s.push_str(&format!(
                "| {p} | {:.4} | {:.0} | {:.0} | {} | {} | {} | {} | {} | {} | {} / {} / {} | {} |",
                med(&|r| r["allocationRatio"].as_f64()).unwrap_or(f64::NAN),
                med(&|r| r["evictions"].as_f64()).unwrap_or(0.0),
                med(&|r| r["pendingAtEnd"].as_f64()).unwrap_or(0.0),
                fmt_s(wait("p95", "share")),
                fmt_s(wait("p95", "1")),
                fmt_s(wait("p95", "2-4")),
                fmt_s(wait("p95", "8")),
                fmt_s(wait("p99", "8")),
                fmt_s(wait("p50", "8")),
                fmt_s(wait("p50", "share")),
                fmt_s(wait("p50", "1")),
                fmt_s(wait("p50", "2-4")),
                fmt_s(med(&|r| r["disruptionSeconds"]["mean"].as_f64())),
            ));
            if services > 0.0 {
                s.push_str(&format!(
                    " {:.0} |",
                    med(&|r| r["serviceEvictions"].as_f64().or(Some(0.0))).unwrap_or(0.0)
                ));
            }
            s.push('\n');
        }
    }
    s
}

/// A table for people: one row per run.
pub fn table(out: &serde_json::Value) -> String {
    let mut s = format!(
        "{:<12} {:>4} {:<22} {:>7} {:>6} {:>6} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}\n",
        "WORKLOAD",
        "SEED",
        "PLANNER",
        "ALLOC",
        "EVICT",
        "PEND",
        "p95 sh",
        "p95 1",
        "p95 2-4",
        "p95 8",
        "p99 8",
        "p50 8",
        "DISRUPT"
    );
    for r in out["results"].as_array().into_iter().flatten() {
        let w = |q: &str, c: &str| fmt_s(r["waitSeconds"][q][c].as_f64());
        s.push_str(&format!(
            "{:<12} {:>4} {:<22} {:>7.4} {:>6} {:>6} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}\n",
            r["workload"].as_str().unwrap_or(""),
            r["seed"],
            r["planner"].as_str().unwrap_or(""),
            r["allocationRatio"].as_f64().unwrap_or(f64::NAN),
            r["evictions"],
            r["pendingAtEnd"],
            w("p95", "share"),
            w("p95", "1"),
            w("p95", "2-4"),
            w("p95", "8"),
            w("p99", "8"),
            w("p50", "8"),
            fmt_s(r["disruptionSeconds"]["mean"].as_f64()),
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_is_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), Some(50.0));
        assert_eq!(percentile(&v, 95.0), Some(95.0));
        assert_eq!(percentile(&v, 99.0), Some(99.0));
        assert_eq!(percentile(&[7.0], 99.0), Some(7.0));
        assert_eq!(percentile(&[1.0, 2.0, 3.0], 50.0), Some(2.0));
        assert_eq!(percentile(&[], 50.0), None);
        assert_eq!(class_of(1, 250), 0);
        assert_eq!(class_of(1, 1000), 1);
        assert_eq!(class_of(2, 1000), 2);
        assert_eq!(class_of(4, 1000), 2);
        assert_eq!(class_of(8, 1000), 3);
    }

    fn lives() -> [Vec<f64>; 4] {
        [
            vec![60.0, 600.0, 6000.0],
            vec![100.0, 1000.0],
            vec![3600.0],
            vec![7200.0, 36000.0],
        ]
    }

    #[test]
    fn arrivals_are_seeded_and_offer_the_load() {
        let classes = [0, 1, 2, 3, 1];
        let demand = [500, 1000, 2000, 8000, 1000];
        let (a, rate) = arrivals(&classes, &demand, &lives(), 64_000.0, 0.9, 30.0 * DAY, 3);
        let (b, _) = arrivals(&classes, &demand, &lives(), 64_000.0, 0.9, 30.0 * DAY, 3);
        let (c, _) = arrivals(&classes, &demand, &lives(), 64_000.0, 0.9, 30.0 * DAY, 4);
        assert_eq!(a, b, "same seed, same stream");
        assert_ne!(a, c);
        assert!(a.windows(2).all(|w| w[0].t <= w[1].t), "in time order");
        // Poisson: the count after t = 0 is close to rate × horizon.
        let n = a.iter().filter(|x| x.t > 0.0).count() as f64;
        let expect = rate * 30.0 * DAY;
        assert!((n - expect).abs() < 4.0 * expect.sqrt(), "{n} vs {expect}");
        // Offered load: Σ demand × life over the arrivals ≈ load × capacity × horizon.
        let work: f64 = a
            .iter()
            .filter(|x| x.t > 0.0)
            .map(|x| demand[x.tpl as usize] as f64 * x.life)
            .sum();
        let offered = work / (64_000.0 * 30.0 * DAY);
        assert!((offered - 0.9).abs() < 0.05, "offered {offered}");
        // Lifetimes come from the arrival's own class.
        for x in &a {
            if x.t > 0.0 {
                assert!(lives()[classes[x.tpl as usize]].contains(&x.life), "{x:?}");
            }
        }
    }

    #[test]
    fn windows_open_when_expected() {
        let base = base_time();
        let w = window_openings(&["0 2 * * *".into()], 3.0, base, 3.0 * DAY).unwrap();
        assert_eq!(
            w,
            vec![
                (2.0 * HOUR, 5.0 * HOUR),
                (DAY + 2.0 * HOUR, DAY + 5.0 * HOUR),
                (2.0 * DAY + 2.0 * HOUR, 2.0 * DAY + 5.0 * HOUR)
            ]
        );
        let w = window_openings(&["30 */6 * * *".into()], 1.0, base, DAY).unwrap();
        let starts: Vec<f64> = w.iter().map(|x| x.0 / HOUR).collect();
        assert_eq!(starts, vec![0.5, 6.5, 12.5, 18.5]);
        assert!(window_openings(&["nonsense".into()], 1.0, base, DAY).is_err());
        assert!(window_openings(&[], 1.0, base, DAY).unwrap().is_empty());
    }

    fn tpl(gpus: u32, milli: u32) -> Tpl {
        Tpl {
            gpus,
            milli,
            cpu: 1000,
            mem: 1 << 30,
            models: 0,
            class: class_of(gpus, milli),
            demand: u64::from(gpus) * u64::from(milli),
        }
    }

    fn nodes(n: usize, gpus: usize) -> Vec<NodeS> {
        (0..n)
            .map(|_| {
                let mut free = [0; 8];
                free[..gpus].fill(GPU_MILLI);
                NodeS {
                    gpus,
                    free,
                    cpu_free: 96_000,
                    mem_free: 512 << 30,
                    pods_free: 256,
                    model: 1,
                    group: 0,
                }
            })
            .collect()
    }

    fn arrival(t: f64, tpl: u32, life: f64) -> Arrival {
        Arrival { t, tpl, life }
    }

    #[test]
    fn a_pod_that_does_not_fit_waits_without_blocking_others() {
        // One 8-GPU node, a 1-GPU pod running: an 8-GPU pod waits, 1-GPU pods after it
        // still run; the 8-GPU pod runs once every GPU is free again.
        let t = [tpl(1, 1000), tpl(8, 1000)];
        let mut sim = Sim::new(&t, nodes(1, 8), Placer::BinPack, Vec::new());
        sim.arrive(&arrival(0.0, 0, 100.0), true);
        sim.arrive(&arrival(1.0, 1, 100.0), true);
        assert_eq!(sim.queued(), 1);
        sim.arrive(&arrival(2.0, 0, 10.0), true);
        assert_eq!(
            sim.queued(),
            1,
            "the 1-GPU pod did not wait behind the 8-GPU one"
        );
        assert_eq!(sim.pods[2].node, 0);
        // Departures: the second 1-GPU pod (t = 12), the first (t = 100).
        sim.depart(2, 12.0);
        assert_eq!(sim.queued(), 1);
        sim.depart(0, 100.0);
        assert_eq!(sim.queued(), 0);
        assert_eq!(sim.pods[1].node, 0);
        assert_eq!(sim.waits[3], vec![99.0]);
        // Queue order among pods that fit: first come, first served.
        let mut sim = Sim::new(&t, nodes(1, 8), Placer::BinPack, Vec::new());
        sim.arrive(&arrival(0.0, 1, 100.0), true);
        sim.arrive(&arrival(1.0, 1, 100.0), true);
        sim.arrive(&arrival(2.0, 0, 100.0), true);
        assert_eq!(sim.queued(), 2);
        sim.depart(0, 50.0);
        assert_eq!(sim.pods[1].node, 0, "the older pod goes first");
        assert_eq!(sim.queued(), 1);
    }

    #[test]
    fn the_index_agrees_with_the_full_scan() {
        let t = [
            tpl(1, 300),
            tpl(1, 1000),
            tpl(2, 1000),
            tpl(4, 1000),
            tpl(8, 1000),
            tpl(1, 700),
        ];
        let mut ns = nodes(6, 8);
        ns.extend(nodes(4, 4).into_iter().map(|mut n| {
            n.group = 1;
            n
        }));
        ns.extend(nodes(3, 2).into_iter().map(|mut n| {
            n.group = 2;
            n
        }));
        let mut sim = Sim::new(&t, ns, Placer::BinPack, Vec::new());
        let mut rng = StdRng::seed_from_u64(9);
        let none = Fences {
            node: vec![false; 13],
            gpu: vec![0; 13],
        };
        // Some fences: two nodes, single GPUs of three others.
        let mut some = none.clone();
        some.node[1] = true;
        some.node[7] = true;
        some.gpu[0] = 0b101;
        some.gpu[8] = 0b1;
        some.gpu[11] = 0b10;
        for i in 0..400 {
            let k = rng.random_range(0..t.len()) as u32;
            sim.pods.push(PodS {
                tpl: k,
                queued_at: 0.0,
                remaining: 1.0,
                end: 0.0,
                node: NONE,
                devs: 0,
                epoch: 0,
                seq: 0,
                evicted_at: None,
                measured: false,
                bound_at: 0.0,
                svc: NONE,
            });
            let pi = sim.pods.len() - 1;
            let tp = &t[k as usize];
            let a = sim.target_indexed(tp, None);
            let b = sim.target_scan(pi, Some(&none));
            assert_eq!(a, b, "pod {i}");
            let fa = sim.target_indexed(tp, Some(&some));
            let fb = sim.target_scan(pi, Some(&some));
            assert_eq!(fa, fb, "pod {i}, fenced");
            if let Some((n, d)) = a {
                sim.bind(pi, n, d, 0.0);
            }
            if i % 3 == 0 {
                let running = sim.running();
                if !running.is_empty() {
                    let r = running[rng.random_range(0..running.len())];
                    sim.unbind(r);
                }
            }
        }
    }

    /// `maxPendingGpuPods` counts GPU pods created since the run started that are pending,
    /// beyond the replacements in flight; the queue that was there before does not count.
    #[test]
    fn the_pending_guard_counts_only_pods_created_since_the_run_started() {
        let t = [tpl(1, 1000), tpl(8, 1000)];
        // One 8-GPU node with one long 1-GPU pod: 8-GPU pods can never run.
        let setup = |sim: &mut Sim| {
            sim.arrive(&arrival(0.0, 0, 100.0 * DAY), true);
            let mut f = Fences {
                node: vec![false; 1],
                gpu: vec![0; 1],
            };
            f.gpu[0] = 0;
            sim.fences = Some(f);
        };
        let run = |sim: &Sim, moves: Vec<(usize, u32, u32)>| {
            let steps = moves
                .iter()
                .map(|&(pi, _, _)| run::Planned {
                    pod: format!("ns/p{pi}"),
                    batch: 0,
                    workload: Some(workload_of(sim, pi)),
                })
                .collect();
            let limits = Limits {
                max_in_flight: 1,
                per_workload: 1,
                reschedule_timeout: std::time::Duration::from_secs(600),
                max_pending: 2,
            };
            let base = base_time();
            RunSim {
                start_seq: sim.seq,
                moves,
                state: RunState::new(steps, limits, base + TimeDelta::hours(10)),
                next_step: HOUR,
                ready_seconds: 30.0,
                base,
            }
        };
        // Ten 8-GPU pods queued before the run: it still evicts.
        let mut sim = Sim::new(&t, nodes(1, 8), Placer::BinPack, Vec::new());
        setup(&mut sim);
        for i in 0..10 {
            sim.arrive(&arrival(1.0 + f64::from(i), 1, HOUR), true);
        }
        assert_eq!(sim.queued(), 10);
        let m = vec![(0, 0, sim.pods[0].epoch)];
        sim.run = Some(run(&sim, m.clone()));
        step_run(&mut sim, HOUR);
        assert_eq!(sim.evictions, 1, "the old queue does not stop the run");
        // Three 8-GPU pods arriving after the run started: more than 2 → stopped before
        // its eviction.
        let mut sim = Sim::new(&t, nodes(1, 8), Placer::BinPack, Vec::new());
        setup(&mut sim);
        sim.run = Some(run(&sim, m.clone()));
        sim.run.as_mut().expect("run").next_step = 2.0 * HOUR;
        for i in 0..3 {
            sim.arrive(&arrival(HOUR + f64::from(i), 1, HOUR), true);
        }
        step_run(&mut sim, 2.0 * HOUR);
        assert_eq!(sim.evictions, 0);
        assert_eq!(sim.runs_ended.get("pending"), Some(&1));
        assert!(sim.run.is_none() && sim.fences.is_none(), "fences lifted");
        // Two: within the limit.
        let mut sim = Sim::new(&t, nodes(1, 8), Placer::BinPack, Vec::new());
        setup(&mut sim);
        sim.run = Some(run(&sim, m));
        for i in 0..2 {
            sim.arrive(&arrival(HOUR + f64::from(i), 1, HOUR), true);
        }
        step_run(&mut sim, 2.0 * HOUR);
        assert_eq!(sim.evictions, 1);
    }

    /// Two 8-GPU nodes, each with two 1-GPU pods of long life; an 8-GPU pod waits. Without
    /// a descheduler it waits until they end; one eviction run that moves the two pods of
    /// one node onto the other lets it start at the window.
    #[test]
    fn defragmentation_shortens_the_wait_of_an_8_gpu_pod() {
        let t = [tpl(1, 1000), tpl(8, 1000)];
        let trace = tiny_trace();
        let stream = |sim: &mut Sim| {
            // A spreading start: 1-GPU pods alternate between the nodes.
            for i in 0..4 {
                sim.pods.push(PodS {
                    tpl: 0,
                    queued_at: 0.0,
                    remaining: 10.0 * DAY,
                    end: 0.0,
                    node: NONE,
                    devs: 0,
                    epoch: 0,
                    seq: 0,
                    evicted_at: None,
                    measured: false,
                    bound_at: 0.0,
                    svc: NONE,
                });
                sim.bind(i, i % 2, 1 << (i / 2), 0.0);
            }
            sim.arrive(&arrival(HOUR, 1, HOUR), true);
            assert_eq!(sim.queued(), 1);
        };
        let params = Params {
            workload: "tiny".into(),
            seed: 1,
            days: 2.0,
            warmup_days: 0.0,
            load: 0.9,
            windows: vec!["0 2 * * *".into()],
            window_hours: 3.0,
            budget: 0.5,
            max_lifetime_hours: 1e6,
            hnu_threshold: 50.0,
            max_pending_gpu_pods: 5,
            ready_seconds: 30.0,
            services: 0.0,
        };
        let base_nodes = scenario::nodes_of(&trace);
        let ctx = Ctx {
            trace: &trace,
            base_nodes: &base_nodes,
            params: &params,
            base: base_time(),
        };
        for planner in ["gpu-defrag", "oracle"] {
            let mut sim = Sim::new(&t, nodes(2, 8), Placer::BinPack, Vec::new());
            stream(&mut sim);
            window(&mut sim, &ctx, planner, 2.0 * HOUR, 5.0 * HOUR);
            // gpu-defrag's run: one eviction per replacement Ready (30 s each); the
            // drained node stays fenced until the run ends.
            while let Some(r) = &sim.run {
                assert!(sim.queued() == 1, "{planner}: fenced during the run");
                let s = r.next_step;
                step_run(&mut sim, s);
            }
            assert_eq!(
                sim.queued(),
                0,
                "{planner}: the 8-GPU pod runs at the window"
            );
            if planner == "oracle" {
                assert_eq!(sim.waits[3], vec![HOUR], "{planner}");
            } else {
                assert_eq!(sim.waits[3], vec![HOUR + 60.0], "{planner}");
                assert_eq!(sim.evictions, 2, "{planner}");
                assert_eq!(sim.disruptions, vec![0.0, 0.0], "{planner}");
                assert_eq!(sim.runs_ended.get("succeeded"), Some(&1));
            }
        }
        let mut sim = Sim::new(&t, nodes(2, 8), Placer::BinPack, Vec::new());
        stream(&mut sim);
        window(&mut sim, &ctx, "none", 2.0 * HOUR, 5.0 * HOUR);
        assert_eq!(sim.queued(), 1, "no descheduler: still waiting");
    }

    fn tiny_trace() -> Trace {
        Trace {
            nodes: (0..2)
                .map(|i| crate::trace::TraceNode {
                    name: format!("n-{i}"),
                    cpu_milli: 96_000,
                    memory_mib: 512 << 10,
                    gpus: 8,
                    model: "A".into(),
                })
                .collect(),
            pods: [(1, 1000), (8, 1000)]
                .iter()
                .map(|&(g, m)| crate::trace::TracePod {
                    name: format!("t{g}"),
                    cpu_milli: 1000,
                    memory_mib: 1 << 10,
                    num_gpu: g,
                    gpu_milli: m,
                    models: vec![],
                })
                .collect(),
            cpu_only_skipped: 0,
        }
    }

    fn tiny_params() -> Params {
        Params {
            workload: "tiny".into(),
            seed: 1,
            days: 2.0,
            warmup_days: 0.0,
            load: 0.9,
            windows: vec![],
            window_hours: 3.0,
            budget: 0.5,
            max_lifetime_hours: 1e6,
            hnu_threshold: 50.0,
            max_pending_gpu_pods: 5,
            ready_seconds: 30.0,
            services: 0.0,
        }
    }

    /// Two 8-GPU nodes with two long 1-GPU pods each and an 8-GPU pod waiting: a demand
    /// run serves it once it has waited `minWait` (evicting the two pods of one node,
    /// which land on the other, and binding it on the room at once); KAI-style
    /// consolidation at the first poll.
    #[test]
    fn demand_runs_serve_a_waiting_8_gpu_pod() {
        let t = [tpl(1, 1000), tpl(8, 1000)];
        let trace = tiny_trace();
        let params = tiny_params();
        let base_nodes = scenario::nodes_of(&trace);
        let ctx = Ctx {
            trace: &trace,
            base_nodes: &base_nodes,
            params: &params,
            base: base_time(),
        };
        for planner in [
            "gpu-defrag-demand",
            "gpu-defrag-demand-only",
            "kai-consolidation",
        ] {
            let mut sim = Sim::new(&t, nodes(2, 8), Placer::BinPack, Vec::new());
            for i in 0..4 {
                sim.arrive(&arrival(0.0, 0, 10.0 * DAY), false);
                sim.unbind(i);
                sim.bind(i, i % 2, 1 << (i / 2), 0.0);
            }
            sim.arrive(&arrival(HOUR, 1, HOUR), true);
            assert_eq!(sim.queued(), 1);
            demand::poll(&mut sim, &ctx, planner, HOUR + 300.0);
            if planner != "kai-consolidation" {
                assert_eq!(sim.queued(), 1, "{planner}: not before minWait");
                demand::poll(&mut sim, &ctx, planner, HOUR + 600.0);
            }
            assert_eq!(sim.queued(), 0, "{planner}");
            assert_eq!(sim.evictions, 2, "{planner}");
            assert_eq!(sim.demand.runs, 1, "{planner}");
            assert_eq!(sim.demand.served_on_room, 1, "{planner}");
            assert_eq!(sim.demand.landed_as_planned, 2, "{planner}");
            let wait = if planner == "kai-consolidation" {
                300.0
            } else {
                600.0
            };
            assert_eq!(sim.waits[3], vec![wait], "{planner}");
            let n = sim.pods[4].node;
            assert!(
                sim.pods.iter().filter(|p| p.node == n).count() == 1,
                "{planner}: the 8-GPU pod alone on its node"
            );
        }
    }

    /// Services follow their replica counts; scale-down deletes pending replicas first,
    /// then the newest running ones.
    #[test]
    fn services_scale_up_and_down() {
        let t = [tpl(1, 1000), tpl(8, 1000)];
        let mut sim = Sim::new(&t, nodes(1, 8), Placer::BinPack, Vec::new());
        let mut svc = Service {
            tpl: 0,
            mean: 10.0,
            phase_hours: 0.0,
        };
        let at = |s: &Service, want: usize| {
            // The hour of the curve where `want` replicas are asked (search a day).
            (0..24)
                .map(|h| f64::from(h) * HOUR)
                .find(|&x| s.replicas(x) == want)
        };
        // 10 replicas wanted at some hour: 8 run, 2 wait (one 8-GPU node).
        let t10 = at(&svc, 10).expect("the curve passes 10");
        sim.scale_services(std::slice::from_ref(&svc), t10, true);
        assert_eq!(sim.svc_pods[0].len(), 10);
        assert_eq!(sim.queued(), 2);
        assert_eq!(sim.running().len(), 8);
        // Fewer wanted: the two pending go first, then the newest running one.
        svc.mean = 7.0 / (1.0 + services::AMPLITUDE * 1.0);
        let tp = services::PEAK_HOUR * HOUR;
        assert_eq!(svc.replicas(tp), 7);
        sim.scale_services(std::slice::from_ref(&svc), tp + DAY, true);
        assert_eq!(sim.svc_pods[0].len(), 7);
        assert_eq!(sim.queued(), 0);
        assert_eq!(sim.running(), (0..7).collect::<Vec<_>>());
    }
}
