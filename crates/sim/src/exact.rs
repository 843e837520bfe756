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
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use gpu_defrag_core::frag::{self, Capacity};
use gpu_defrag_core::model::*;
use gpu_defrag_core::policy::TargetShape;
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use serde::Serialize;

use crate::trace::Trace;
use crate::{ScenarioArgs, bench, scenario};

mod instance;
#[cfg(feature = "exact")]
mod milp;
mod report;

pub use report::markdown;

use instance::Instance;
#[cfg(doc)]
use instance::Metric;

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
    /// Load before departures, departures, budget fraction of bound GPU pods,
    /// HighNodeUtilization threshold.
    pub scenario: ScenarioArgs,
    /// Least budget.
    pub min_budget: usize,
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
            load: a.scenario.load,
            departures: a.scenario.departures,
        },
    );
    let shapes = frag::default_shapes(&c, &Default::default());
    let budget = bench::budget_of(&c, a.scenario.budget).max(a.min_budget);
    let policy = bench::bench_policy(shapes.clone(), budget as u32);
    let scope = Default::default();
    let before = frag::totals(&c, &Capacity::of(&c), &scope, &shapes);
    let bound = bench::bound(&c, &shapes, budget);
    let mut planners_out = Vec::new();
    for name in planners() {
        let r = bench::run(name, &c, &policy, budget, a.scenario.hnu_threshold)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::tests::*;

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
