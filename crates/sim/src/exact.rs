//! The exact optimum on trace sub-clusters: a MILP of "choose at most B evictions and
//! where every evicted pod lands, to minimise the fragment rate after", solved with
//! HiGHS (feature `exact`), next to what each planner reaches on the same sub-cluster.
//!
//! # Sub-clusters
//!
//! `nodes` GPU nodes of the trace, drawn at random (seeded) from its node list, then
//! fragmented the bench's way ([`scenario::build`]: spreading scheduler to `load` of
//! GPU capacity, `departures` of the pods leave). Budget: `budget` of the bound GPU
//! pods, at least `min_budget`. Target shapes: derived from the pods, as in the bench.
//!
//! # The metric, linearised exactly
//!
//! With the bench's target shapes (k GPUs of q milli, weight w; no cpu, memory or model
//! term) the fragment milli of node n with free milli R_g per GPU is
//!
//! ```text
//!   F_n = Σ_{m: k=1} w_m Σ_g R_g·[R_g < q_m]                          (separable per GPU)
//!       + Σ_{m: k≥2} w_m (Σ_g R_g − fits_{n,m}·Σ_g R_g·[R_g ≥ q_m])
//!       + Σ_{m: k=0} w_m Σ_g R_g
//!   fits_{n,m} = [ #{g : R_g ≥ q_m} ≥ k_m ]
//! ```
//!
//! (a single-GPU shape is the k = 1 case of the second line, where the two agree). The
//! distinct q of the shapes cut a GPU's free milli 0..=1000 into **levels**; on a level
//! every indicator [R < q] is constant:
//!
//! ```text
//!   free milli  0 ─────── q1 ─────── q2 ──── … ──── 1000
//!   level         0          1          2            L
//!   z_{g,j} ∈ {0,1}, Σ_j z_{g,j} = 1          (the GPU's level)
//!   lo_j·z_{g,j} ≤ ρ_{g,j} ≤ hi_j·z_{g,j}     (its free milli, if on level j, else 0)
//!   R_g = Σ_j ρ_{g,j}
//! ```
//!
//! so Σ_m w_m R_g [R_g < q_m] = Σ_j c_j ρ_{g,j} with c_j the weight of the shapes whose
//! q is above level j (plus the k ≥ 2 and k = 0 shapes' weight, whose first term is
//! w·R_g). For a multi-GPU shape m on node n: y_{n,m} ∈ {0,1} with Σ_g Σ_{j: lo_j ≥ q}
//! z_{g,j} ≥ k·y_{n,m}, and v_{n,m} ≥ 0 with v ≤ Σ_g Σ_{j: lo_j ≥ q} ρ_{g,j} and
//! v ≤ 1000·|G_n|·y; the objective has −w_m·v_{n,m}. Minimising, v takes
//! fits·Σ R_g[R_g ≥ q] exactly. Nothing is approximated: the MILP's objective is the
//! bench's fragment milli of the state it describes ([`Metric::node_value`] is that
//! linearised form, tested against `frag::node_fragment`).
//!
//! The rate is fragment milli / idle milli. Every evicted pod must land, so idle milli
//! does not change and minimising the fragment milli minimises the rate. (A plan that
//! leaves pods pending raises idle milli and can lower the *rate* that way; the MILP
//! does not count that as a gain. The tables give each planner's pending pods.)
//!
//! # Evictions and landings
//!
//! ```text
//!   x_p ∈ {0,1}                 pod p evicted           Σ_p x_p ≤ B
//!   u_{p,n} ∈ {0,1}             p lands on node n       Σ_n u_{p,n} = x_p
//!   N_{s,g} ∈ ℤ≥0               single-GPU pods of s milli landing on GPU g
//!                               Σ_{g∈n} N_{s,g} = Σ_{p: share s} u_{p,n}
//!   D_{c,g} ∈ ℤ≥0               multi-GPU pods of class c = (k, s) using GPU g
//!                               Σ_{g∈n} D_{c,g} = k·Σ_{p∈c} u_{p,n},  D_{c,g} ≤ Σ_{p∈c} u_{p,n}
//!   used_g = used⁰_g − Σ_{p on g} s_p x_p + Σ_s s·N_{s,g} + Σ_c s_c·D_{c,g} ≤ 1000
//!   R_g = 1000 − used_g
//!   cpu, memory, pod slots of n: used⁰ − Σ_{p from n} x_p·r_p + Σ_p u_{p,n}·r_p ≤ alloc
//! ```
//!
//! Pods of one share size are interchangeable for the GPU a node gives them, so landings
//! on GPUs are counted per size, not per pod (far fewer variables); the node of each pod
//! is its own variable (cpu and memory differ per pod). For multi-GPU pods, counts with
//! D_{c,g} ≤ U and Σ_g D_{c,g} = k·U can always be dealt as U pods on k distinct GPUs
//! each (largest counts first), so the counts lose nothing. `u_{p,n}` exists only for
//! nodes p may use (GPU model, node selector, taints, scheme, enough GPUs, cpu and
//! memory). A pod may land back where it was.
//!
//! This is "you choose the landing": the evicted pods go where the optimum wants them,
//! which the real scheduler (the bench's bin-packing emulation) need not do. The
//! optimum is therefore above what any planner realises through the scheduler, and
//! below the bench's [`bench::Bound`], which ignores fit altogether.
//!
//! The operator's landing control (each replacement nominated onto its planned node)
//! makes gpu-defrag choose the landing too: the row [`AS_PLANNED`] binds every moved pod
//! to its planned node and devices ([`bench::land_as_planned`]) and measures the result
//! like every other row; the `gpu-defrag` row beside it is the same eviction set landed
//! by the scheduler emulation. Both are plans the MILP may choose, so both are at most
//! the optimum.
//!
//! Solution check: the solver's choice is dealt into pods and devices, applied to the
//! cluster, and measured with `frag::totals` (the bench's metric); that measured value
//! is the one reported (it must agree with the MILP's objective).
// Without the solver only the tests use the model's parts.
#![cfg_attr(not(feature = "exact"), allow(dead_code))]
use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{Context, Result, bail, ensure};
use gpu_defrag_core::frag::{self, Capacity};
use gpu_defrag_core::model::*;
use gpu_defrag_core::policy::TargetShape;
use gpu_defrag_core::sched;
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use serde::Serialize;

use crate::matrix::median;
use crate::trace::Trace;
use crate::{bench, scenario};

/// The bench's fragment metric for a set of target shapes, in the linearised form the
/// MILP uses (see the module documentation).
#[derive(Debug, Clone, PartialEq)]
pub struct Metric {
    /// Lowest free milli of each level.
    pub lo: Vec<Milli>,
    /// Highest free milli of each level.
    pub hi: Vec<Milli>,
    /// Coefficient of a GPU's free milli on each level.
    pub coef: Vec<f64>,
    /// Multi-GPU shapes: (GPUs, milli per GPU, weight).
    pub multi: Vec<(u32, Milli, f64)>,
}

impl Metric {
    /// The levels and coefficients of `shapes`. Shapes with cpu, memory or GPU model
    /// terms are refused (the bench derives none; they would make a GPU's term depend
    /// on its node's cpu and memory).
    pub fn of(shapes: &[TargetShape]) -> Result<Metric> {
        let mut cuts: Vec<Milli> = Vec::new();
        for m in shapes {
            ensure!(
                m.cpu.is_none() && m.memory.is_none() && m.models.is_empty(),
                "target shape {}×{} has a cpu, memory or model term: not supported by the exact model",
                m.gpus,
                m.milli_per_gpu
            );
            let q = m.milli_per_gpu.min(GPU_MILLI);
            if m.gpus > 0 && q > 0 {
                cuts.push(q);
            }
        }
        cuts.sort_unstable();
        cuts.dedup();
        let mut lo = vec![0];
        lo.extend(cuts.iter().copied());
        lo.dedup();
        let hi: Vec<Milli> = (0..lo.len())
            .map(|j| lo.get(j + 1).map_or(GPU_MILLI, |n| n - 1))
            .collect();
        let coef = lo
            .iter()
            .map(|&l| {
                shapes
                    .iter()
                    .filter(|m| m.gpus != 1 || m.milli_per_gpu.min(GPU_MILLI) > l)
                    .map(|m| m.weight)
                    .sum()
            })
            .collect();
        let multi = shapes
            .iter()
            .filter(|m| m.gpus >= 2)
            .map(|m| (m.gpus, m.milli_per_gpu.min(GPU_MILLI), m.weight))
            .collect();
        Ok(Metric {
            lo,
            hi,
            coef,
            multi,
        })
    }

    /// The level of a GPU with `r` free milli.
    pub fn level(&self, r: Milli) -> usize {
        self.lo.partition_point(|&l| l <= r).saturating_sub(1)
    }

    /// A node's fragment milli computed from the levels: the MILP's objective term.
    pub fn node_value(&self, free: &[Milli]) -> f64 {
        let mut v: f64 = free
            .iter()
            .map(|&r| self.coef[self.level(r)] * f64::from(r))
            .sum();
        for &(k, q, w) in &self.multi {
            let above = free.iter().filter(|&&r| r >= q);
            if above.clone().count() >= k as usize {
                v -= w * above.map(|&r| f64::from(r)).sum::<f64>();
            }
        }
        v
    }
}

/// An evictable pod of the instance.
#[derive(Debug, Clone)]
pub struct Candidate {
    /// Pod index in the cluster.
    pub pod: usize,
    /// Its node.
    pub node: usize,
    /// Its devices and milli on each.
    pub devs: Vec<(usize, Milli)>,
    /// GPUs it asks for.
    pub gpus: u32,
    /// Milli per GPU.
    pub milli: Milli,
    /// Nodes it may land on (its own included).
    pub land: Vec<usize>,
}

/// What the MILP is built from: the evictable pods and where each may land.
#[derive(Debug, Clone)]
pub struct Instance {
    /// Evictable pods: bound GPU pods on counted nodes.
    pub cands: Vec<Candidate>,
    /// Nodes counted by the metric (the others are left alone).
    pub counted: Vec<bool>,
    /// The metric.
    pub metric: Metric,
    /// Eviction budget.
    pub budget: usize,
}

impl Instance {
    /// The instance of a cluster, target shapes and budget.
    pub fn of(c: &Cluster, shapes: &[TargetShape], budget: usize) -> Result<Instance> {
        let metric = Metric::of(shapes)?;
        let scope = Default::default();
        let counted: Vec<bool> = c.nodes.iter().map(|n| frag::counted(n, &scope)).collect();
        let mut cands = Vec::new();
        for (pi, p) in c.pods.iter().enumerate() {
            let Some(n) = p.node else { continue };
            if !(p.is_active_bound() && p.held_milli() > 0 && counted[n]) {
                continue;
            }
            let GpuUse::Devices(d) = &p.gpu else { continue };
            let shape = p
                .shape
                .with_context(|| format!("pod {} has no GPU shape", p.name))?;
            let land = (0..c.nodes.len())
                .filter(|&m| counted[m] && may_land(p, &c.nodes[m]))
                .collect();
            cands.push(Candidate {
                pod: pi,
                node: n,
                devs: d.clone(),
                gpus: shape.gpus,
                milli: shape.milli.min(GPU_MILLI),
                land,
            });
        }
        Ok(Instance {
            cands,
            counted,
            metric,
            budget,
        })
    }
}

/// Whether pod `p` may be placed on `node` at all (capacity left aside): placement rules,
/// scheme, a node whose use is known, enough healthy GPUs, cpu and memory.
fn may_land(p: &Pod, node: &Node) -> bool {
    let shape = p.shape.unwrap_or(GpuShape { gpus: 0, milli: 0 });
    node.unknown_pods == 0
        && node.inconsistent.is_none()
        && p.scheme.is_none_or(|s| s == node.scheme)
        && sched::placement_allowed(p, node)
        && node.gpus.iter().filter(|g| g.healthy).count() >= shape.gpus as usize
        && node.cpu_alloc >= p.cpu
        && node.mem_alloc >= p.mem
}

/// A plan in full: evicted pods and where each lands.
#[derive(Debug, Clone, Default)]
pub struct Landing {
    /// (pod, node, devices).
    pub moves: Vec<(usize, usize, Vec<usize>)>,
}

/// Applies a landing plan; fails when it overfills a GPU, cpu, memory or pod slots.
pub fn apply(c: &Cluster, plan: &Landing) -> Result<Cluster> {
    let mut out = c.clone();
    for (pi, _, _) in &plan.moves {
        bench::unbind(&mut out, *pi);
    }
    for (pi, n, devs) in &plan.moves {
        let p = &out.pods[*pi];
        let milli = p.shape.map_or(GPU_MILLI, |s| s.milli);
        let node = &out.nodes[*n];
        for &g in devs {
            let gpu = node.gpus.get(g).context("no such GPU")?;
            ensure!(
                gpu.healthy && gpu.used + milli <= GPU_MILLI,
                "GPU {g} of {} overfilled",
                node.name
            );
        }
        ensure!(
            node.cpu_free() >= p.cpu
                && node.mem_free() >= p.mem
                && node.pods_used < node.pods_alloc,
            "node {} overfilled",
            node.name
        );
        bench::bind(&mut out, *pi, *n, devs);
    }
    Ok(out)
}

/// Deals per-GPU landing counts of one class on one node into pods: `pods` each take
/// `k` distinct GPUs, largest remaining count first. `counts` (GPU, count) must satisfy
/// count ≤ pods.len() and Σ count = k·pods.len().
pub fn deal(pods: &[usize], k: usize, counts: &[(usize, u32)]) -> Result<Vec<(usize, Vec<usize>)>> {
    let mut left: Vec<(usize, u32)> = counts.iter().copied().filter(|c| c.1 > 0).collect();
    let mut out = Vec::new();
    for &p in pods {
        left.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        ensure!(
            left.len() >= k && left[..k].iter().all(|c| c.1 > 0),
            "landing counts cannot be dealt"
        );
        let mut devs: Vec<usize> = left[..k].iter().map(|c| c.0).collect();
        for c in &mut left[..k] {
            c.1 -= 1;
        }
        devs.sort_unstable();
        out.push((p, devs));
    }
    ensure!(left.iter().all(|c| c.1 == 0), "landing counts left over");
    Ok(out)
}

/// A sub-trace: `nodes` of the trace's nodes drawn at random (seeded), every pod.
pub fn sub_trace(tr: &Trace, nodes: usize, seed: u64) -> Trace {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x05ee_d0f5_abc1_u64);
    let mut idx: Vec<usize> = (0..tr.nodes.len()).collect();
    idx.shuffle(&mut rng);
    idx.truncate(nodes);
    idx.sort_unstable();
    Trace {
        nodes: idx.iter().map(|&i| tr.nodes[i].clone()).collect(),
        pods: tr.pods.clone(),
        cpu_only_skipped: tr.cpu_only_skipped,
    }
}

/// Parameters of `gpu-defrag-sim exact`.
#[derive(Debug, Clone)]
pub struct ExactArgs {
    /// Trace directory.
    pub dir: PathBuf,
    /// Workloads.
    pub workloads: Vec<String>,
    /// Seeds.
    pub seeds: Vec<u64>,
    /// Nodes per sub-cluster.
    pub nodes: usize,
    /// Load before departures.
    pub load: f64,
    /// Departures.
    pub departures: f64,
    /// Budget fraction of bound GPU pods.
    pub budget: f64,
    /// Least budget.
    pub min_budget: usize,
    /// HighNodeUtilization threshold.
    pub hnu_threshold: f64,
    /// HiGHS time limit per instance, seconds.
    pub time_limit: f64,
}

/// What the solver reached on one instance.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Solved {
    /// Proved optimal (within 1e-6 relative or 0.01 milli absolute).
    pub optimal: bool,
    /// Fragment milli after the best plan found, measured with the bench's metric.
    pub fragment_milli_after: f64,
    /// The MILP's own objective for it (agrees with the measurement).
    pub objective: f64,
    /// Lowest fragment milli any plan could reach (the solver's dual bound).
    pub fragment_milli_after_min: f64,
    /// Evictions of the best plan found.
    pub evictions: usize,
    /// Evicted pods that land back on their node.
    pub landed_back: usize,
    /// Free milli after the plan of each GPU an evicted pod landed on (once per GPU).
    pub receiver_free_after: Vec<Milli>,
    /// The evicted pods of the best plan found.
    #[serde(skip)]
    pub evicted: Vec<usize>,
    /// Seconds.
    pub seconds: f64,
    /// Variables (binary, integer, continuous) and rows.
    pub size: [usize; 4],
}

/// One instance: a sub-cluster and every planner on it.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceResult {
    /// Workload.
    pub workload: String,
    /// Seed.
    pub seed: u64,
    /// Nodes, GPUs, bound GPU pods.
    pub nodes: usize,
    /// GPUs.
    pub gpus: u64,
    /// Bound GPU pods.
    pub pods: usize,
    /// Budget.
    pub budget: usize,
    /// Fragment rate before.
    pub fragment_rate_before: f64,
    /// Idle milli (unchanged by the optimum).
    pub idle_milli: u64,
    /// The optimum's rate drop (of the best plan found).
    pub optimum_drop: f64,
    /// Largest rate drop possible (the solver's dual bound).
    pub optimum_drop_max: f64,
    /// The bench's bound's rate drop.
    pub bound_drop: f64,
    /// The optimum's eviction set landed by the bench's scheduler emulation instead
    /// (no fences): rate drop and pods left pending. Tells the choice of pods from the
    /// choice of landings.
    pub optimum_evictions_scheduled: PlannerResult,
    /// The solver's result.
    pub solved: Solved,
    /// Per planner: rate drop, pending pods.
    pub planners: Vec<PlannerResult>,
}

/// One planner on one instance.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PlannerResult {
    /// Name.
    pub planner: String,
    /// Rate drop measured by the bench (evict, bin-packing re-placement).
    pub drop: f64,
    /// Evictions.
    pub evictions: usize,
    /// Evicted pods left pending.
    pub pending: usize,
}

/// The planners compared (the bench's, without `none`).
pub fn planners() -> Vec<&'static str> {
    bench::PLANNERS
        .iter()
        .copied()
        .filter(|p| *p != "none")
        .collect()
}

/// The row of gpu-defrag with landing control ([`bench::land_as_planned`]).
pub const AS_PLANNED: &str = "gpu-defrag, landing as planned";

/// The rows of the tables, in order: every planner, gpu-defrag's landing as planned
/// right after gpu-defrag's (scheduler's landing).
pub fn rows() -> Vec<&'static str> {
    let mut out = Vec::new();
    for p in planners() {
        out.push(p);
        if p == "gpu-defrag" {
            out.push(AS_PLANNED);
        }
    }
    out
}

/// gpu-defrag's plan with every moved pod landing on its planned target, measured with
/// the bench's metric (the policy's shapes and scope, like every other row).
pub fn as_planned(c: &Cluster, policy: &gpu_defrag_core::policy::Policy) -> Result<PlannerResult> {
    let (p, after) = bench::land_as_planned(c, policy)?;
    let tb = frag::totals(c, &Capacity::of(c), &policy.scope, &policy.shapes);
    let ta = frag::totals(&after, &Capacity::of(&after), &policy.scope, &policy.shapes);
    Ok(PlannerResult {
        planner: AS_PLANNED.to_string(),
        drop: tb.fragment_rate - ta.fragment_rate,
        evictions: p.moves.len(),
        pending: 0,
    })
}

/// Builds one sub-cluster and measures every planner and the optimum on it.
pub fn run_instance(
    tr: &Trace,
    a: &ExactArgs,
    workload: &str,
    seed: u64,
) -> Result<InstanceResult> {
    let sub = sub_trace(tr, a.nodes, seed);
    let (c, summary) = scenario::build(
        &sub,
        &scenario::Params {
            workload: workload.to_string(),
            seed,
            load: a.load,
            departures: a.departures,
        },
    );
    let shapes = frag::default_shapes(&c, &Default::default());
    let budget = bench::budget_of(&c, a.budget).max(a.min_budget);
    let policy = bench::bench_policy(shapes.clone(), budget as u32);
    let scope = Default::default();
    let before = frag::totals(&c, &Capacity::of(&c), &scope, &shapes);
    let bound = bench::bound(&c, &shapes, budget);
    let mut planners_out = Vec::new();
    for name in planners() {
        let r = bench::run(name, &c, &policy, budget, a.hnu_threshold)?;
        planners_out.push(PlannerResult {
            planner: name.to_string(),
            drop: r.fragment_rate_before - r.fragment_rate_after,
            evictions: r.evictions,
            pending: r.pending_after,
        });
    }
    planners_out.push(
        as_planned(&c, &policy)
            .with_context(|| format!("{workload} seed {seed}: landing as planned"))?,
    );
    let inst = Instance::of(&c, &shapes, budget)?;
    let solved = solve(&c, &inst, &shapes, a.time_limit)
        .with_context(|| format!("{workload} seed {seed}: solving"))?;
    let idle = before.idle_milli.max(1) as f64;
    let ch = bench::Choice {
        evicted: solved.evicted.clone(),
        ..Default::default()
    };
    let (after, pending, _) = bench::replace(&c, &ch);
    let t = frag::totals(&after, &Capacity::of(&after), &scope, &shapes);
    let optimum_evictions_scheduled = PlannerResult {
        planner: "optimum's evictions, scheduler's landing".into(),
        drop: before.fragment_rate - t.fragment_rate,
        evictions: ch.evicted.len(),
        pending,
    };
    Ok(InstanceResult {
        workload: workload.to_string(),
        seed,
        nodes: summary.nodes,
        gpus: summary.gpus,
        pods: summary.bound_pods,
        budget,
        fragment_rate_before: before.fragment_rate,
        idle_milli: before.idle_milli,
        optimum_drop: (before.fragment_milli - solved.fragment_milli_after) / idle,
        optimum_drop_max: (before.fragment_milli - solved.fragment_milli_after_min) / idle,
        bound_drop: before.fragment_rate - bound.fragment_rate_after_min,
        optimum_evictions_scheduled,
        solved,
        planners: planners_out,
    })
}

/// Runs every workload × seed; returns the instances.
pub fn run(a: &ExactArgs) -> Result<Vec<InstanceResult>> {
    let mut out = Vec::new();
    let total = a.workloads.len() * a.seeds.len();
    for w in &a.workloads {
        let tr = crate::trace::load(&a.dir, w)?;
        for &seed in &a.seeds {
            let r = run_instance(&tr, a, w, seed)?;
            eprintln!(
                "[{}/{total}] {w} seed {seed}: {} nodes, {} pods, budget {}, optimum drop {:.2} pp ({}, {:.1} s)",
                out.len() + 1,
                r.nodes,
                r.pods,
                r.budget,
                100.0 * r.optimum_drop,
                if r.solved.optimal {
                    "optimal"
                } else {
                    "time limit"
                },
                r.solved.seconds
            );
            out.push(r);
        }
    }
    Ok(out)
}

/// A planner's share of the optimum on an instance: its drop over the optimum's (1 when
/// the optimum drops nothing and neither does the planner).
pub fn share(drop: f64, optimum: f64) -> f64 {
    if optimum <= 1e-12 {
        if drop <= 1e-12 { 1.0 } else { f64::INFINITY }
    } else {
        drop / optimum
    }
}

/// The summary per workload and planner, as Markdown.
pub fn markdown(results: &[InstanceResult], target: f64) -> Result<String> {
    let mut md = String::new();
    writeln!(
        md,
        "| workload | planner | instances | share of optimum, median | min | max | solved to optimality | pending (instances) | drop (pp), median |"
    )?;
    writeln!(md, "|---|---|---:|---:|---:|---:|---:|---:|---:|")?;
    let mut workloads: Vec<&str> = results.iter().map(|r| r.workload.as_str()).collect();
    workloads.dedup();
    let mut verdicts = String::new();
    for w in workloads {
        let rs: Vec<&InstanceResult> = results.iter().filter(|r| r.workload == w).collect();
        let proven = rs.iter().filter(|r| r.solved.optimal).count();
        let n = rs.len();
        let row = |name: &str, shares: Vec<f64>, pending: usize, drops: Vec<f64>| -> String {
            let min = shares.iter().copied().fold(f64::INFINITY, f64::min);
            let max = shares.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            format!(
                "| {w} | {name} | {n} | {:.1}% | {:.1}% | {:.1}% | {proven}/{n} | {pending} | {:.2} |",
                100.0 * median(shares),
                100.0 * min,
                100.0 * max,
                100.0 * median(drops)
            )
        };
        let mut med_sched = f64::NAN;
        for name in rows() {
            let mut shares = Vec::new();
            let mut drops = Vec::new();
            let mut pending = 0;
            for r in &rs {
                let p = r
                    .planners
                    .iter()
                    .find(|p| p.planner == name)
                    .context("planner missing")?;
                shares.push(share(p.drop, r.optimum_drop));
                drops.push(p.drop);
                pending += usize::from(p.pending > 0);
            }
            if name == "gpu-defrag" {
                med_sched = median(shares.clone());
            }
            if name == AS_PLANNED {
                let med = median(shares.clone());
                let verdict = if med >= target && med > med_sched {
                    "met".to_string()
                } else if med >= target {
                    "**not met** (no more than without)".to_string()
                } else {
                    format!("**not met** ({:.1} pp short)", 100.0 * (target - med))
                };
                writeln!(
                    verdicts,
                    "- {w}: gpu-defrag with landing control (landing as planned) reaches {:.1}% of the exact optimum (median of {n}; min {:.1}%), without it (scheduler's landing) {:.1}% — target ≥ {:.0}% and more than without: {verdict}",
                    100.0 * med,
                    100.0 * shares.iter().copied().fold(f64::INFINITY, f64::min),
                    100.0 * med_sched,
                    100.0 * target
                )?;
            }
            writeln!(md, "{}", row(name, shares, pending, drops))?;
        }
        let sched: Vec<f64> = rs
            .iter()
            .map(|r| share(r.optimum_evictions_scheduled.drop, r.optimum_drop))
            .collect();
        let sched_drop: Vec<f64> = rs
            .iter()
            .map(|r| r.optimum_evictions_scheduled.drop)
            .collect();
        let sched_pending = rs
            .iter()
            .filter(|r| r.optimum_evictions_scheduled.pending > 0)
            .count();
        writeln!(
            md,
            "{}",
            row(
                "optimum's evictions, scheduler's landing",
                sched,
                sched_pending,
                sched_drop
            )
        )?;
        let opt: Vec<f64> = rs.iter().map(|r| r.optimum_drop).collect();
        writeln!(md, "{}", row("**optimum** (MILP)", vec![1.0; n], 0, opt))?;
        let ub: Vec<f64> = rs
            .iter()
            .map(|r| share(r.optimum_drop_max, r.optimum_drop))
            .collect();
        let ub_drop: Vec<f64> = rs.iter().map(|r| r.optimum_drop_max).collect();
        writeln!(md, "{}", row("solver's upper limit", ub, 0, ub_drop))?;
        let b: Vec<f64> = rs
            .iter()
            .map(|r| share(r.bound_drop, r.optimum_drop))
            .collect();
        let b_drop: Vec<f64> = rs.iter().map(|r| r.bound_drop).collect();
        writeln!(md, "{}", row("bound (bench)", b, 0, b_drop))?;
    }
    let secs: Vec<f64> = results.iter().map(|r| r.solved.seconds).collect();
    let max_s = secs.iter().copied().fold(0.0, f64::max);
    let proven = results.iter().filter(|r| r.solved.optimal).count();
    let sizes: Vec<f64> = results.iter().map(|r| r.solved.size[0] as f64).collect();
    let nodes: Vec<f64> = results.iter().map(|r| r.nodes as f64).collect();
    let pods: Vec<f64> = results.iter().map(|r| r.pods as f64).collect();
    let gpus: Vec<f64> = results.iter().map(|r| r.gpus as f64).collect();
    let budgets: Vec<f64> = results.iter().map(|r| r.budget as f64).collect();
    writeln!(md)?;
    writeln!(
        md,
        "Instances: {} ({} proved optimal); per instance (medians): {:.0} nodes, {:.0} GPUs, {:.0} bound GPU pods, budget {:.0}, {:.0} binary variables; HiGHS time {:.1} s median, {:.1} s max.",
        results.len(),
        proven,
        median(nodes),
        median(gpus),
        median(pods),
        median(budgets),
        median(sizes),
        median(secs),
        max_s
    )?;
    writeln!(md)?;
    write!(md, "{verdicts}")?;
    Ok(md)
}

#[cfg(feature = "exact")]
pub use milp::solve;

/// Without the `exact` feature there is no solver.
#[cfg(not(feature = "exact"))]
pub fn solve(_: &Cluster, _: &Instance, _: &[TargetShape], _: f64) -> Result<Solved> {
    bail!("{NO_SOLVER}")
}

/// The error of `exact` in a build without the feature.
pub const NO_SOLVER: &str = "gpu-defrag-sim was built without the `exact` feature (the HiGHS MILP solver): \
build it with `bash hack/exact-deps.sh && cargo build --release -p gpu-defrag-sim --features exact` \
(HiGHS builds from source: cmake, a C++ compiler and libclang)";

#[cfg(feature = "exact")]
mod milp {
    //! The MILP (see the module above) with good_lp, solved by HiGHS.
    use std::collections::BTreeMap;
    use std::time::Instant;

    use ::highs::HighsModelStatus;
    use good_lp::solvers::highs::highs as highs_solver;
    use good_lp::{Expression, ProblemVariables, SolverModel, Variable, variable};

    use super::*;

    /// Landing counts: (class (GPUs, milli), node) → per GPU (GPU, variable, column).
    type Counts = BTreeMap<((u32, Milli), usize), Vec<(usize, Variable, usize)>>;

    /// Columns in creation order: good_lp hands its variables to HiGHS in that order,
    /// so column i of HiGHS' solution is the i-th variable created.
    struct Vars {
        vars: ProblemVariables,
        n: usize,
        bin: usize,
        int: usize,
    }

    impl Vars {
        fn add(&mut self, def: good_lp::VariableDefinition, kind: u8) -> (Variable, usize) {
            match kind {
                0 => self.bin += 1,
                1 => self.int += 1,
                _ => {}
            }
            let v = self.vars.add(def);
            self.n += 1;
            (v, self.n - 1)
        }
        fn binary(&mut self) -> (Variable, usize) {
            self.add(variable().binary(), 0)
        }
        fn integer(&mut self, max: f64) -> (Variable, usize) {
            self.add(variable().integer().min(0).max(max), 1)
        }
        fn real(&mut self, max: f64) -> (Variable, usize) {
            self.add(variable().min(0).max(max), 2)
        }
    }

    /// Solves the instance; the best plan found is applied and measured.
    pub fn solve(
        c: &Cluster,
        inst: &Instance,
        shapes: &[TargetShape],
        time_limit: f64,
    ) -> Result<Solved> {
        let t0 = Instant::now();
        let metric = &inst.metric;
        let mut v = Vars {
            vars: ProblemVariables::new(),
            n: 0,
            bin: 0,
            int: 0,
        };
        let mut rows: Vec<good_lp::Constraint> = Vec::new();
        let nn = c.nodes.len();
        let levels = metric.lo.len();

        // Evictions and landing nodes.
        let mut x = Vec::new();
        let mut u: Vec<Vec<(usize, Variable, usize)>> = Vec::new();
        let mut evict_all = Expression::default();
        for cand in &inst.cands {
            let (xv, xi) = v.binary();
            evict_all += xv;
            let mut lands = Vec::new();
            let mut sum = Expression::default();
            for &n in &cand.land {
                let (uv, ui) = v.binary();
                sum += uv;
                lands.push((n, uv, ui));
            }
            rows.push(sum.eq(xv));
            x.push((xv, xi));
            u.push(lands);
        }
        rows.push(evict_all.leq(inst.budget as f64));

        // Per node: incoming pods by class; per GPU the milli that leaves and arrives.
        let mut gpu_delta: Vec<Vec<Expression>> = c
            .nodes
            .iter()
            .map(|n| vec![Expression::default(); n.gpus.len()])
            .collect();
        let mut node_delta: Vec<[Expression; 3]> = (0..nn).map(|_| Default::default()).collect();
        for (ci, cand) in inst.cands.iter().enumerate() {
            let p = &c.pods[cand.pod];
            let (xv, _) = x[ci];
            for &(g, m) in &cand.devs {
                gpu_delta[cand.node][g] -= f64::from(m) * xv;
            }
            node_delta[cand.node][0] -= p.cpu as f64 * xv;
            node_delta[cand.node][1] -= p.mem as f64 * xv;
            node_delta[cand.node][2] -= xv;
            for &(n, uv, _) in &u[ci] {
                node_delta[n][0] += p.cpu as f64 * uv;
                node_delta[n][1] += p.mem as f64 * uv;
                node_delta[n][2] += uv;
            }
        }
        // Classes (GPUs, milli) and the pods of each landing on each node.
        let mut classes: BTreeMap<(u32, Milli), Vec<usize>> = BTreeMap::new();
        for (ci, cand) in inst.cands.iter().enumerate() {
            classes.entry((cand.gpus, cand.milli)).or_default().push(ci);
        }
        // (class, node) → per GPU (count variable, column).
        let mut counts: Counts = BTreeMap::new();
        for (&(k, s), members) in &classes {
            for (n, node_delta_gpu) in gpu_delta.iter_mut().enumerate() {
                let mut incoming = Expression::default();
                let mut any = false;
                for &ci in members {
                    if let Some(&(_, uv, _)) = u[ci].iter().find(|(m, _, _)| *m == n) {
                        incoming += uv;
                        any = true;
                    }
                }
                if !any {
                    continue;
                }
                let mut total = Expression::default();
                let mut per_gpu = Vec::new();
                for (g, gpu) in c.nodes[n].gpus.iter().enumerate() {
                    if !gpu.healthy || s == 0 {
                        continue;
                    }
                    let cap = if k == 1 {
                        f64::from(GPU_MILLI / s.max(1))
                    } else {
                        members.len() as f64
                    };
                    let (dv, di) = v.integer(cap.min(members.len() as f64));
                    total += dv;
                    node_delta_gpu[g] += f64::from(s) * dv;
                    if k >= 2 {
                        rows.push(Expression::from(dv).leq(incoming.clone()));
                    }
                    per_gpu.push((g, dv, di));
                }
                if s == 0 {
                    continue;
                }
                rows.push(total.eq(f64::from(k) * incoming));
                counts.insert(((k, s), n), per_gpu);
            }
        }
        for (n, node) in c.nodes.iter().enumerate() {
            let [cpu, mem, pods] = std::mem::take(&mut node_delta[n]);
            rows.push((cpu + node.cpu_used as f64).leq(node.cpu_alloc as f64));
            rows.push((mem + node.mem_used as f64).leq(node.mem_alloc as f64));
            rows.push((pods + node.pods_used as f64).leq(node.pods_alloc as f64));
        }

        // Levels and the objective.
        let mut objective = Expression::default();
        for (n, node) in c.nodes.iter().enumerate() {
            if !inst.counted[n] {
                continue;
            }
            // Per GPU: Σ_j ρ_{g,j} over the levels at or above each multi shape's q,
            // and Σ_j z_{g,j} likewise.
            let mut above_r: Vec<Expression> = vec![Expression::default(); metric.multi.len()];
            let mut above_z: Vec<Expression> = vec![Expression::default(); metric.multi.len()];
            for (g, gpu) in node.gpus.iter().enumerate() {
                let delta = std::mem::take(&mut gpu_delta[n][g]);
                if !gpu.healthy {
                    // No landing: its free milli (0) is what evictions give back.
                    continue;
                }
                // used = used⁰ + delta, R = 1000 − used ∈ [0, 1000] by the levels.
                let used = delta + f64::from(gpu.used);
                let mut zs = Expression::default();
                let mut rs = Expression::default();
                for j in 0..levels {
                    let (z, _) = v.binary();
                    let (r, _) = v.real(f64::from(metric.hi[j]));
                    rows.push(Expression::from(r).leq(f64::from(metric.hi[j]) * z));
                    rows.push(Expression::from(r).geq(f64::from(metric.lo[j]) * z));
                    zs += z;
                    rs += r;
                    objective += metric.coef[j] * r;
                    for (mi, &(_, q, _)) in metric.multi.iter().enumerate() {
                        if metric.lo[j] >= q {
                            above_r[mi] += r;
                            above_z[mi] += z;
                        }
                    }
                }
                rows.push(zs.eq(1.0));
                rows.push((rs + used).eq(f64::from(GPU_MILLI)));
            }
            let healthy = node.gpus.iter().filter(|g| g.healthy).count();
            for (mi, &(k, _, w)) in metric.multi.iter().enumerate() {
                if healthy < k as usize {
                    continue; // never fits: its term is w·idle, in the coefficients
                }
                let (y, _) = v.binary();
                let (val, _) = v.real(f64::from(GPU_MILLI) * healthy as f64);
                rows.push(std::mem::take(&mut above_z[mi]).geq(f64::from(k) * y));
                rows.push(Expression::from(val).leq(std::mem::take(&mut above_r[mi])));
                rows.push(Expression::from(val).leq(f64::from(GPU_MILLI) * healthy as f64 * y));
                objective -= w * val;
            }
        }
        // Unhealthy GPUs free no milli to the metric (free() is 0): nothing to add.

        let size_vars = [v.bin, v.int, v.n - v.bin - v.int];
        let mut problem = v.vars.minimise(objective).using(highs_solver);
        problem = rows.into_iter().fold(problem, |p, r| p.with(r));
        let mut model = problem
            .try_into_inner()
            .map_err(|e| anyhow::anyhow!("building the HiGHS model: {e}"))?;
        let n_rows = model.num_rows();
        model.make_quiet();
        model.set_option("time_limit", time_limit);
        model.set_option("threads", 1);
        model.set_option("mip_rel_gap", 1e-6);
        model.set_option("mip_abs_gap", 1e-2);
        let solved = model
            .try_solve()
            .map_err(|e| anyhow::anyhow!("HiGHS: {e:?}"))?;
        let status = solved.status();
        let optimal = match status {
            HighsModelStatus::Optimal => true,
            HighsModelStatus::ReachedTimeLimit => false,
            other => bail!("HiGHS ended with {other:?}"),
        };
        ensure!(
            solved.primal_solution_status() == ::highs::HighsSolutionStatus::Feasible,
            "HiGHS found no feasible plan within the time limit"
        );
        let objective_value = solved.objective_value();
        let dual = if optimal {
            objective_value
        } else {
            solved
                .double_info_value(c"mip_dual_bound")
                .map_err(|e| anyhow::anyhow!("HiGHS dual bound: {e:?}"))?
        };
        let cols = solved.get_solution().columns().to_vec();
        ensure!(
            cols.len() == v.n,
            "HiGHS returned {} columns, {} expected",
            cols.len(),
            v.n
        );
        let on = |i: usize| cols[i] > 0.5;

        // Deal the solution into pods and devices.
        let mut plan = Landing::default();
        let mut landing_on: BTreeMap<((u32, Milli), usize), Vec<usize>> = BTreeMap::new();
        for (ci, cand) in inst.cands.iter().enumerate() {
            if !on(x[ci].1) {
                continue;
            }
            let n = u[ci]
                .iter()
                .find(|(_, _, i)| on(*i))
                .map(|(n, _, _)| *n)
                .context("an evicted pod without a landing node")?;
            landing_on
                .entry(((cand.gpus, cand.milli), n))
                .or_default()
                .push(cand.pod);
        }
        for ((class, n), pods) in &landing_on {
            let per_gpu = counts.get(&(*class, *n)).context("no landing counts")?;
            let cs: Vec<(usize, u32)> = per_gpu
                .iter()
                .map(|(g, _, i)| (*g, cols[*i].round().max(0.0) as u32))
                .collect();
            let dealt = if class.0 == 1 {
                // Shares: pods of one size are interchangeable; a GPU may take several.
                let mut out = Vec::new();
                let mut it = pods.iter();
                for (g, k) in cs {
                    for _ in 0..k {
                        let p = it.next().context("more landing counts than pods")?;
                        out.push((*p, vec![g]));
                    }
                }
                ensure!(it.next().is_none(), "fewer landing counts than pods");
                out
            } else {
                deal(pods, class.0 as usize, &cs)?
            };
            plan.moves
                .extend(dealt.into_iter().map(|(p, devs)| (p, *n, devs)));
        }
        let landed_back = plan
            .moves
            .iter()
            .filter(|(p, n, _)| c.pods[*p].node == Some(*n))
            .count();
        let after = apply(c, &plan)?;
        let scope = Default::default();
        let t = frag::totals(&after, &Capacity::of(&after), &scope, shapes);
        let linear: f64 = (0..after.nodes.len())
            .filter(|&n| inst.counted[n])
            .map(|n| metric.node_value(&frag::free_of(&after.nodes[n])))
            .sum();
        ensure!(
            (t.fragment_milli - linear).abs() <= 1e-6 * t.fragment_milli.abs().max(1.0),
            "the levels' value {linear} differs from the metric {}",
            t.fragment_milli
        );
        ensure!(
            (t.fragment_milli - objective_value).abs() <= 1e-3 * t.fragment_milli.abs().max(1.0),
            "the MILP's objective {objective_value} differs from the measured fragment milli {}",
            t.fragment_milli
        );
        let mut receivers: Vec<(usize, usize)> = plan
            .moves
            .iter()
            .flat_map(|(_, n, devs)| devs.iter().map(move |g| (*n, *g)))
            .collect();
        receivers.sort_unstable();
        receivers.dedup();
        let receiver_free_after = receivers
            .iter()
            .map(|&(n, g)| after.nodes[n].gpus[g].free())
            .collect();
        Ok(Solved {
            receiver_free_after,
            optimal,
            fragment_milli_after: t.fragment_milli,
            objective: objective_value,
            fragment_milli_after_min: dual.min(t.fragment_milli),
            evictions: plan.moves.len(),
            evicted: plan.moves.iter().map(|m| m.0).collect(),
            landed_back,
            seconds: t0.elapsed().as_secs_f64(),
            size: [size_vars[0], size_vars[1], size_vars[2], n_rows],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::tests::*;

    fn shape(gpus: u32, milli: Milli, weight: f64) -> TargetShape {
        TargetShape::of_gpus(gpus, milli, weight)
    }

    /// The linearised metric is the bench's metric, node by node, for single-GPU,
    /// multi-GPU and zero-GPU shapes.
    #[test]
    fn levels_give_the_metric_exactly() {
        let shapes = vec![
            shape(1, 250, 0.2),
            shape(1, 500, 0.15),
            shape(1, 1000, 0.25),
            shape(2, 1000, 0.1),
            shape(4, 1000, 0.1),
            shape(2, 600, 0.1),
            shape(0, 0, 0.1),
        ];
        let m = Metric::of(&shapes).unwrap();
        assert_eq!(m.lo, vec![0, 250, 500, 600, 1000]);
        assert_eq!(m.hi, vec![249, 499, 599, 999, 1000]);
        let mut rng = StdRng::seed_from_u64(3);
        let steps = [0, 1, 100, 249, 250, 251, 499, 500, 599, 600, 700, 999, 1000];
        for _ in 0..2000 {
            let n = 1 + rand::Rng::random_range(&mut rng, 0..8usize);
            let free: Vec<Milli> = (0..n)
                .map(|_| steps[rand::Rng::random_range(&mut rng, 0..steps.len())])
                .collect();
            let node = frag_node(&free);
            let want = frag::node_fragment(&node, &free, node.cpu_free(), node.mem_free(), &shapes);
            let got = m.node_value(&free);
            assert!((want - got).abs() < 1e-9, "{free:?}: {got} ≠ {want}");
        }
    }

    fn frag_node(free: &[Milli]) -> Node {
        let (c, _) = scenario::build(&tiny_trace(), &params(1));
        let mut n = c.nodes[0].clone();
        n.gpus = free
            .iter()
            .enumerate()
            .map(|(i, f)| Gpu {
                key: i.to_string(),
                used: GPU_MILLI - f,
                healthy: true,
                memory_mib: None,
            })
            .collect();
        n
    }

    #[test]
    fn shapes_with_cpu_terms_are_refused() {
        let mut s = shape(1, 500, 1.0);
        s.cpu = Some(1000);
        assert!(Metric::of(&[s]).is_err());
    }

    #[test]
    fn counts_are_dealt_on_distinct_gpus() {
        let d = deal(&[7, 8, 9], 2, &[(0, 3), (1, 1), (2, 2)]).unwrap();
        for (_, devs) in &d {
            assert_eq!(devs.len(), 2);
            assert_ne!(devs[0], devs[1]);
        }
        let mut used = [0; 3];
        for (_, devs) in &d {
            for &g in devs {
                used[g] += 1;
            }
        }
        assert_eq!(used, [3, 1, 2]);
        assert!(deal(&[1], 2, &[(0, 2)]).is_err());
    }

    #[test]
    fn landing_nodes_respect_models_and_sizes() {
        let (c, _) = scenario::build(&tiny_trace(), &params(2));
        let shapes = frag::default_shapes(&c, &Default::default());
        let inst = Instance::of(&c, &shapes, 3).unwrap();
        assert!(!inst.cands.is_empty());
        for cand in &inst.cands {
            let p = &c.pods[cand.pod];
            assert!(cand.land.contains(&cand.node), "{}", p.name);
            for &n in &cand.land {
                assert!(c.nodes[n].gpus.len() >= cand.gpus as usize);
                assert!(
                    p.models.is_empty() || p.models.contains(c.nodes[n].model.as_ref().unwrap())
                );
            }
        }
    }

    fn fake_instance(seed: u64, drops: &[(&str, f64)]) -> InstanceResult {
        let pr = |name: &str, drop: f64| PlannerResult {
            planner: name.to_string(),
            drop,
            evictions: 3,
            pending: 0,
        };
        InstanceResult {
            workload: "default".into(),
            seed,
            nodes: 4,
            gpus: 16,
            pods: 20,
            budget: 3,
            fragment_rate_before: 0.2,
            idle_milli: 1000,
            optimum_drop: 0.1,
            optimum_drop_max: 0.1,
            bound_drop: 0.12,
            optimum_evictions_scheduled: pr("optimum's evictions, scheduler's landing", 0.05),
            solved: Solved {
                optimal: true,
                fragment_milli_after: 100.0,
                objective: 100.0,
                fragment_milli_after_min: 100.0,
                evictions: 3,
                landed_back: 0,
                receiver_free_after: Vec::new(),
                evicted: Vec::new(),
                seconds: 1.0,
                size: [1, 1, 1, 1],
            },
            planners: drops.iter().map(|(n, d)| pr(n, *d)).collect(),
        }
    }

    /// The landing-as-planned row sits right after gpu-defrag's, and the verdict reads
    /// it against the target and against the scheduler's landing.
    #[test]
    fn markdown_shows_both_landings_and_the_verdict() {
        let rows_of = |planned: f64| -> Vec<InstanceResult> {
            (0..3)
                .map(|s| {
                    let mut d: Vec<(&str, f64)> =
                        planners().into_iter().map(|p| (p, 0.06)).collect();
                    d.push((AS_PLANNED, planned));
                    fake_instance(s, &d)
                })
                .collect()
        };
        let md = markdown(&rows_of(0.095), 0.9).unwrap();
        let lines: Vec<&str> = md.lines().collect();
        let at = lines
            .iter()
            .position(|l| l.starts_with("| default | gpu-defrag |"))
            .unwrap();
        assert!(
            lines[at + 1].starts_with(&format!("| default | {AS_PLANNED} | 3 | 95.0% |")),
            "{md}"
        );
        assert!(lines[at].contains("| 60.0% |"), "{md}");
        assert!(md.contains("reaches 95.0% of the exact optimum"), "{md}");
        assert!(
            md.contains("without it (scheduler's landing) 60.0%"),
            "{md}"
        );
        assert!(md.trim_end().ends_with(": met"), "{md}");
        let md = markdown(&rows_of(0.085), 0.9).unwrap();
        assert!(md.contains("**not met** (5.0 pp short)"), "{md}");
        let md = markdown(&rows_of(0.06), 0.5).unwrap();
        assert!(md.contains("**not met** (no more than without)"), "{md}");
    }

    #[test]
    fn sub_trace_is_seeded() {
        let t = tiny_trace();
        let a = sub_trace(&t, 4, 1);
        assert_eq!(a.nodes.len(), 4);
        assert_eq!(a.nodes, sub_trace(&t, 4, 1).nodes);
        assert!(a.nodes.windows(2).all(|w| w[0].name < w[1].name));
    }

    #[cfg(not(feature = "exact"))]
    #[test]
    fn without_the_feature_solve_says_how_to_build_it() {
        let (c, _) = scenario::build(&tiny_trace(), &params(2));
        let shapes = frag::default_shapes(&c, &Default::default());
        let inst = Instance::of(&c, &shapes, 3).unwrap();
        let e = solve(&c, &inst, &shapes, 1.0).unwrap_err().to_string();
        assert!(e.contains("--features exact"), "{e}");
    }
}

/// Tests of the solver (feature `exact`: `cargo test -p gpu-defrag-sim --features exact`).
#[cfg(all(test, feature = "exact"))]
mod solver_tests {
    use super::*;
    use crate::scenario::tests::*;

    fn setup(seed: u64, budget: usize) -> (Cluster, Vec<TargetShape>, Instance) {
        let (c, _) = scenario::build(&tiny_trace(), &params(seed));
        let shapes = frag::default_shapes(&c, &Default::default());
        let inst = Instance::of(&c, &shapes, budget).unwrap();
        (c, shapes, inst)
    }

    /// With one eviction, the optimum is what trying every pod and every landing gives.
    #[test]
    fn one_eviction_matches_brute_force() {
        for seed in 0..4 {
            let (c, shapes, inst) = setup(seed, 1);
            let scope = Default::default();
            let before = frag::totals(&c, &Capacity::of(&c), &scope, &shapes);
            let mut best = before.fragment_milli;
            for cand in &inst.cands {
                for &n in &cand.land {
                    let g = c.nodes[n].gpus.len();
                    // Every set of `gpus` devices of node n.
                    for mask in 0u32..(1 << g) {
                        if mask.count_ones() != cand.gpus {
                            continue;
                        }
                        let devs: Vec<usize> = (0..g).filter(|i| mask & (1 << i) != 0).collect();
                        let plan = Landing {
                            moves: vec![(cand.pod, n, devs)],
                        };
                        if let Ok(after) = apply(&c, &plan) {
                            let t = frag::totals(&after, &Capacity::of(&after), &scope, &shapes);
                            best = best.min(t.fragment_milli);
                        }
                    }
                }
            }
            let s = solve(&c, &inst, &shapes, 60.0).unwrap();
            assert!(s.optimal);
            assert!(
                (s.fragment_milli_after - best).abs() < 1e-6,
                "seed {seed}: MILP {} brute force {best}",
                s.fragment_milli_after
            );
        }
    }

    /// The optimum is at least what every planner reaches without pending pods, and at
    /// most what the bench's bound allows.
    #[test]
    fn optimum_lies_between_the_planners_and_the_bound() {
        for seed in 0..4 {
            let (c, shapes, inst) = setup(seed, 4);
            let policy = bench::bench_policy(shapes.clone(), 4);
            let scope = Default::default();
            let before = frag::totals(&c, &Capacity::of(&c), &scope, &shapes);
            let s = solve(&c, &inst, &shapes, 60.0).unwrap();
            assert!(s.optimal);
            assert!(s.evictions <= 4);
            let opt = (before.fragment_milli - s.fragment_milli_after) / before.idle_milli as f64;
            for name in planners() {
                let r = bench::run(name, &c, &policy, 4, 50.0).unwrap();
                if r.pending_after == 0 {
                    let d = r.fragment_rate_before - r.fragment_rate_after;
                    assert!(d <= opt + 1e-9, "seed {seed} {name}: {d} > optimum {opt}");
                }
            }
            // Landing as planned is a plan the MILP may choose (every planned target
            // passes the filters the MILP's landings do): never above the optimum.
            let ap = as_planned(&c, &policy).unwrap();
            assert!(ap.evictions <= 4);
            assert!(
                ap.drop <= opt + 1e-9,
                "seed {seed} {AS_PLANNED}: {} > optimum {opt}",
                ap.drop
            );
            let b = bench::bound(&c, &shapes, 4);
            let bd = before.fragment_rate - b.fragment_rate_after_min;
            assert!(opt <= bd + 1e-9, "seed {seed}: optimum {opt} > bound {bd}");
        }
    }
}
