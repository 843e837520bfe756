//! Planners side by side on one fragmented cluster, under one eviction budget.
//!
//! Every planner only chooses an **eviction set** (and, for gpu-defrag, the fences it
//! would put on its sources). Then the same measurement applies to all of them: the
//! evicted pods are removed, and re-placed in a fixed order (largest GPU request first,
//! then pod order) by the bin-packing scheduler emulation — MostAllocated node on GPU,
//! best-fit device — on the cluster without them, skipping fenced nodes and GPUs. Pods
//! that fit nowhere stay pending and are counted. gpu-defrag's expected targets are not
//! used (its `expectedFragmentRateAfter` is reported on the side).
//!
//! Baselines, written from their documented behaviour:
//! - `none`: no eviction.
//! - `high-node-utilization`: the descheduler plugin with one threshold on
//!   `nvidia.com/gpu` (default 50%): nodes whose GPU request utilisation is under the
//!   threshold are sources, least requested first; it exits early when no node or every
//!   node is under. Pods of a source are evicted (all priorities are equal here, so in
//!   pod order) while the aggregate free GPU of the non-source nodes stays above zero
//!   (aggregate check only, no per-pod fit), up to the budget. No fences: the
//!   descheduler relies on the scheduler.
//! - `fgd-descheduler`: repeatedly takes the most fragmented node (F_n(M), the same
//!   target shapes) that has a pod whose removal lowers F_n, and evicts the pod whose
//!   removal lowers it most; up to the budget. No fences.
//!
//! `gpu-defrag-8gpu` is gpu-defrag with an 8-GPU shape of weight
//! [`WHOLE_NODE_SHAPE_WEIGHT`] added to its policy's target shapes (what a user who
//! wants whole nodes for training jobs writes); it is measured with the same metric.
//!
//! The **bound** is an upper limit on what any eviction set of the budget could reach;
//! see [`Bound`].
use std::time::Instant;

use anyhow::Context as _;
use gpu_defrag_core::frag::{self, Capacity};
use gpu_defrag_core::model::*;
use gpu_defrag_core::plan::{self, History, UnitKind};
use gpu_defrag_core::policy::{Policy, TargetShape};
use gpu_defrag_core::sched;
use serde::Serialize;

/// Planners in report order.
pub const PLANNERS: [&str; 5] = [
    "none",
    "high-node-utilization",
    "fgd-descheduler",
    "gpu-defrag",
    "gpu-defrag-8gpu",
];

/// Indices of the baselines in [`PLANNERS`].
pub const BASELINES: std::ops::Range<usize> = 1..3;
/// Index of gpu-defrag (the derived target shapes) and of gpu-defrag with an 8-GPU shape
/// of weight [`WHOLE_NODE_SHAPE_WEIGHT`] added to its policy (the metric is the same).
pub const GPU_DEFRAG: usize = 3;
/// See [`GPU_DEFRAG`].
pub const GPU_DEFRAG_8GPU: usize = 4;

/// One planner's choice.
#[derive(Debug, Clone, Default)]
pub struct Choice {
    /// Evicted pods (indices), in eviction order.
    pub evicted: Vec<usize>,
    /// Nodes that receive no pod during re-placement.
    pub fenced_nodes: Vec<usize>,
    /// GPUs (node, gpu) that receive no pod during re-placement.
    pub fenced_gpus: Vec<(usize, usize)>,
    /// What the planner itself expects (gpu-defrag only).
    pub expected_rate: Option<f64>,
    /// Drained units by kind (gpu-defrag only).
    pub units: Option<std::collections::BTreeMap<String, usize>>,
}

/// One row of the results.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Result {
    /// Planner name.
    pub planner: String,
    /// Pods evicted.
    pub evictions: usize,
    /// Fragment rate before.
    pub fragment_rate_before: f64,
    /// Fragment rate after re-placement.
    pub fragment_rate_after: f64,
    /// Fragment milli before.
    pub fragment_milli_before: f64,
    /// Fragment milli after.
    pub fragment_milli_after: f64,
    /// Fully free GPUs before.
    pub fully_free_gpus_before: u64,
    /// Fully free GPUs after.
    pub fully_free_gpus_after: u64,
    /// Nodes with every GPU free, before.
    pub fully_free_nodes_before: u64,
    /// After.
    pub fully_free_nodes_after: u64,
    /// 8-GPU nodes with every GPU free, before.
    pub fully_free8_gpu_nodes_before: u64,
    /// After.
    pub fully_free8_gpu_nodes_after: u64,
    /// Time to choose the evictions, ms.
    pub plan_millis: f64,
    /// Evicted pods that found no place.
    pub pending_after: usize,
    /// Evicted pods that landed back on the node they left.
    pub landed_back: usize,
    /// The planner's own forecast of the rate (gpu-defrag only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expected_fragment_rate_after: Option<f64>,
    /// Units drained, by kind (gpu-defrag only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub units: Option<std::collections::BTreeMap<String, usize>>,
}

/// An upper limit on what any plan with the budget could reach (not a plan).
///
/// - Fully free GPUs: (a) packing: the used milli U can never occupy fewer than
///   ⌈U/1000⌉ GPUs, so at most G − ⌈U/1000⌉ are free; (b) budget: a GPU becomes free
///   only when every pod on it is evicted. A share GPU with c pods costs c evictions
///   for one GPU, a whole-GPU pod on k GPUs costs one eviction for k GPUs; the
///   fractional knapsack of these (best GPUs per eviction first) over the budget is an
///   upper limit of GPUs freed (re-placed pods can only fill GPUs, never free them).
///   The bound is min(a, before + b).
/// - Fully free nodes (and 8-GPU nodes): (a) packing: free the smallest nodes first
///   while their GPUs fit in G − ⌈U/1000⌉; (b) budget: a node becomes free only when
///   all its pods are evicted, so take the nodes with the fewest pods first while their
///   pod counts fit in the budget. min(a, before + b).
/// - Fragment rate. With single-GPU target shapes (no cpu, memory or model terms) the
///   metric is a sum over GPUs of f(R) = Σ_m w_m·R·[R < q_m], R the GPU's free milli.
///   A pod of s milli placed on a GPU lowers f there by at most s·W(s), W(s) = Σ_m w_m
///   [q_m > s] (f(R) − f(R−s) ≤ s·W(R) ≤ s·W(s), as W falls with R). So evicting a set
///   T of pods from a GPU lowers F by at most f(R) − f(R + s_T) + Σ_T s·W(s), wherever
///   they land. Per GPU, every subset T is an option of cost |T| (a pod on k GPUs costs
///   1/k on each); the most any budget B reaches is at most the LP relaxation of this
///   multiple-choice knapsack: the greedy over the increments of each GPU's upper
///   concave hull. Other shapes (k GPUs, cpu, memory, models) add the per-node limit:
///   draining a node lowers their term by at most their F_n, a placement by at most
///   w·q (the B largest marginals). Lower limit of the rate: max(0, F − both) / idle
///   (idle unchanged when every evicted pod is re-placed). A limit, not a plan: it
///   ignores whether the evicted pods fit where they would have to go.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Bound {
    /// Budget (evictions).
    pub budget: usize,
    /// Lowest fragment rate reachable (loose).
    pub fragment_rate_after_min: f64,
    /// Most fully free GPUs reachable.
    pub fully_free_gpus_after_max: u64,
    /// … from packing alone (no budget).
    pub fully_free_gpus_packing: u64,
    /// Most fully free nodes reachable.
    pub fully_free_nodes_after_max: u64,
    /// Most fully free 8-GPU nodes reachable.
    pub fully_free8_gpu_nodes_after_max: u64,
    /// … from packing alone (no budget).
    pub fully_free8_gpu_nodes_packing: u64,
}

/// The policy every planner and the metric use: fixed target shapes, and the budget as
/// the only binding limit.
pub fn bench_policy(shapes: Vec<TargetShape>, budget: u32) -> Policy {
    Policy {
        shapes,
        from_pending: false,
        max_evictions_per_run: budget,
        max_evictions_per_node: budget,
        max_evictions_per_namespace: budget,
        max_unavailable_per_workload: budget,
        max_in_flight: budget,
        min_pod_age: std::time::Duration::ZERO,
        max_priority: None,
        protected_classes: Vec::new(),
        // The trace's tasks carry no workload: each is its own, so every one would be
        // its workload's last Ready replica. The replay treats each as replaceable.
        evict_single_replicas: true,
        // The bench re-places evicted pods with its scheduler emulation, so it plans as
        // for `landing.mode: Scheduler` (targets the scheduler itself would pick);
        // [`land_as_planned`] plans with landing control.
        landing_control: false,
        ..Policy::default()
    }
}

fn gpu_pod(p: &Pod) -> bool {
    p.node.is_some() && p.is_active_bound() && p.held_milli() > 0
}

fn demand(p: &Pod) -> u64 {
    p.shape
        .map(|s| u64::from(s.gpus) * u64::from(s.milli))
        .unwrap_or(0)
}

/// Removes a bound pod from its node (it becomes pending).
pub fn unbind(c: &mut Cluster, pi: usize) {
    let Some(n) = c.pods[pi].node else { return };
    let gpu = std::mem::replace(&mut c.pods[pi].gpu, GpuUse::None);
    let node = &mut c.nodes[n];
    if let GpuUse::Devices(d) = &gpu {
        for (g, m) in d {
            node.gpus[*g].used = node.gpus[*g].used.saturating_sub(*m);
        }
    }
    let p = &mut c.pods[pi];
    node.cpu_used = node.cpu_used.saturating_sub(p.cpu);
    node.mem_used = node.mem_used.saturating_sub(p.mem);
    node.pods_used = node.pods_used.saturating_sub(1);
    p.node = None;
    p.node_name = None;
    p.phase = Phase::Pending;
}

/// Binds a pending pod to `n` on `devs`.
pub fn bind(c: &mut Cluster, pi: usize, n: usize, devs: &[usize]) {
    let milli = c.pods[pi].shape.map(|s| s.milli).unwrap_or(GPU_MILLI);
    let node = &mut c.nodes[n];
    for &g in devs {
        node.gpus[g].used = (node.gpus[g].used + milli).min(GPU_MILLI);
    }
    let p = &mut c.pods[pi];
    node.cpu_used += p.cpu;
    node.mem_used += p.mem;
    node.pods_used += 1;
    p.node = Some(n);
    p.node_name = Some(node.name.clone());
    p.phase = Phase::Running;
    p.gpu = GpuUse::Devices(devs.iter().map(|&g| (g, milli)).collect());
}

/// The bin-packing scheduler: the node with the highest MostAllocated score on GPU
/// after placement (ties: node order), best-fit devices. Fenced nodes and GPUs are
/// skipped.
pub fn binpack_target(
    c: &Cluster,
    occ: &sched::Occupancy,
    pi: usize,
    fenced_node: &[bool],
    fenced_gpu: &[Vec<bool>],
) -> Option<(usize, Vec<usize>)> {
    let p = &c.pods[pi];
    let add = demand(p);
    let inc = sched::Incoming::new(c, occ, pi);
    let mut best: Option<(u64, usize, Vec<usize>)> = None;
    for (n, node) in c.nodes.iter().enumerate() {
        if fenced_node[n] || node.gpus.is_empty() || node.scheme != p.scheme.unwrap_or(node.scheme)
        {
            continue;
        }
        let free: Vec<Milli> = node
            .gpus
            .iter()
            .enumerate()
            .map(|(g, x)| if fenced_gpu[n][g] { 0 } else { x.free() })
            .collect();
        let total: u64 = free.iter().map(|f| u64::from(*f)).sum();
        if total < add {
            continue;
        }
        let score = sched::most_allocated_score(node.gpus.len(), node.free_milli(), add);
        if best.as_ref().is_some_and(|(s, _, _)| score <= *s) {
            continue;
        }
        if let Some(devs) = inc.fit(n, sched::Free::of_node(node, &free)).devices() {
            best = Some((score, n, devs));
        }
    }
    best.map(|(_, n, d)| (n, d))
}

/// Applies a choice: evict, then re-place with the bin-packing emulation.
/// Returns the cluster after, pods left pending, pods that landed back on their node.
pub fn replace(c: &Cluster, ch: &Choice) -> (Cluster, usize, usize) {
    let mut out = c.clone();
    let mut fenced_node = vec![false; c.nodes.len()];
    for &n in &ch.fenced_nodes {
        fenced_node[n] = true;
    }
    let mut fenced_gpu: Vec<Vec<bool>> =
        c.nodes.iter().map(|n| vec![false; n.gpus.len()]).collect();
    for &(n, g) in &ch.fenced_gpus {
        fenced_gpu[n][g] = true;
    }
    let from: Vec<Option<usize>> = ch.evicted.iter().map(|&pi| c.pods[pi].node).collect();
    for &pi in &ch.evicted {
        unbind(&mut out, pi);
    }
    let mut order: Vec<(usize, Option<usize>)> = ch.evicted.iter().copied().zip(from).collect();
    order.sort_by_key(|&(pi, _)| (std::cmp::Reverse(demand(&c.pods[pi])), pi));
    let (mut pending, mut back) = (0, 0);
    let mut occ = sched::Occupancy::of(&out);
    for (pi, src) in order {
        match binpack_target(&out, &occ, pi, &fenced_node, &fenced_gpu) {
            Some((n, devs)) => {
                if src == Some(n) {
                    back += 1;
                }
                bind(&mut out, pi, n, &devs);
                occ.place(&out, pi, n);
            }
            None => pending += 1,
        }
    }
    (out, pending, back)
}

fn free8(c: &Cluster) -> u64 {
    c.nodes
        .iter()
        .filter(|n| n.gpus.len() == 8 && n.gpus.iter().all(|g| g.healthy && g.used == 0))
        .count() as u64
}

/// gpu-defrag: the core planner under the budget.
pub fn choose_gpu_defrag(c: &Cluster, policy: &Policy) -> Choice {
    let p = plan::plan(c, policy, None, &History::default());
    let mut ch = Choice {
        evicted: p.moves.iter().map(|m| m.pod_index).collect(),
        expected_rate: Some(p.after.fragment_rate),
        ..Default::default()
    };
    let mut units = std::collections::BTreeMap::new();
    for b in &p.batches {
        let k = match b.kind {
            UnitKind::Node => "node",
            UnitKind::Gpu => "gpu",
            UnitKind::Group => "group",
        };
        *units.entry(k.to_string()).or_default() += 1;
    }
    ch.units = Some(units);
    ch.fenced_nodes = p
        .fenced_nodes
        .iter()
        .filter_map(|n| c.node_index(n))
        .collect();
    for b in &p.batches {
        if b.kind == UnitKind::Gpu
            && let (Some(n), Some(key)) = (c.node_index(&b.node), &b.gpu)
            && let Some(g) = c.nodes[n].gpus.iter().position(|x| &x.key == key)
        {
            ch.fenced_gpus.push((n, g));
        }
    }
    ch
}

/// gpu-defrag with landing control: the core planner under the budget, and every moved
/// pod bound to the target the plan chose for it (its `toNode` and `toDevices`), as the
/// operator's nomination of each replacement makes it, instead of re-placed by the
/// bin-packing emulation. The device choice is the planner's own, made by the same
/// rule as the scheduler emulation's ([`sched::fit`]): for a share, the fullest GPU
/// that still fits (best fit); for whole or multi-GPU pods, the first GPUs in device
/// order with enough free milli. Every moved pod lands, so none is pending.
///
/// Returns the plan and the cluster after it. The cluster is built here from the plan's
/// moves (evict all, then bind each on its planned devices, checking that no GPU, cpu,
/// memory or pod slot is overfilled), so it is measured with the same metric, shapes
/// and scope as every other row, not taken from the plan's own forecast (`after`), which
/// it must agree with (tested).
pub fn land_as_planned(c: &Cluster, policy: &Policy) -> anyhow::Result<(plan::Plan, Cluster)> {
    let policy = Policy {
        landing_control: true,
        ..policy.clone()
    };
    let p = plan::plan(c, &policy, None, &History::default());
    let mut out = c.clone();
    for m in &p.moves {
        unbind(&mut out, m.pod_index);
    }
    for m in &p.moves {
        let n = c
            .node_index(&m.to_node)
            .with_context(|| format!("{}: no target node {}", m.pod, m.to_node))?;
        let node = &out.nodes[n];
        let pod = &out.pods[m.pod_index];
        let shape = pod.shape.unwrap_or(GpuShape { gpus: 0, milli: 0 });
        let devs: Vec<usize> = m
            .to_devices
            .iter()
            .map(|k| {
                node.gpus
                    .iter()
                    .position(|g| &g.key == k)
                    .with_context(|| format!("{}: no GPU {k} on {}", m.pod, m.to_node))
            })
            .collect::<anyhow::Result<_>>()?;
        anyhow::ensure!(
            devs.len() == shape.gpus as usize,
            "{}: {} planned devices for {} GPUs",
            m.pod,
            devs.len(),
            shape.gpus
        );
        for &g in &devs {
            let gpu = &node.gpus[g];
            anyhow::ensure!(
                gpu.healthy && gpu.used + shape.milli <= GPU_MILLI,
                "{}: GPU {} of {} overfilled",
                m.pod,
                gpu.key,
                node.name
            );
        }
        anyhow::ensure!(
            node.cpu_free() >= pod.cpu
                && node.mem_free() >= pod.mem
                && node.pods_used < node.pods_alloc,
            "{}: node {} overfilled",
            m.pod,
            node.name
        );
        bind(&mut out, m.pod_index, n, &devs);
    }
    Ok((p, out))
}

/// descheduler HighNodeUtilization with a GPU threshold (percent).
pub fn choose_high_node_utilization(c: &Cluster, budget: usize, threshold_pct: f64) -> Choice {
    let util: Vec<f64> = c
        .nodes
        .iter()
        .map(|n| {
            let cap = n.gpus.len() as f64 * f64::from(GPU_MILLI);
            if cap == 0.0 {
                0.0
            } else {
                100.0 * (cap - n.free_milli() as f64) / cap
            }
        })
        .collect();
    let schedulable: Vec<usize> = (0..c.nodes.len())
        .filter(|&n| c.nodes[n].ready && !c.nodes[n].unschedulable)
        .collect();
    let sources: Vec<usize> = schedulable
        .iter()
        .copied()
        .filter(|&n| util[n] < threshold_pct)
        .collect();
    if sources.is_empty() || sources.len() == schedulable.len() {
        return Choice::default();
    }
    let mut avail: i64 = schedulable
        .iter()
        .filter(|&&n| util[n] >= threshold_pct)
        .map(|&n| c.nodes[n].free_milli() as i64)
        .sum();
    let mut order = sources;
    order.sort_by(|&a, &b| util[a].total_cmp(&util[b]).then(a.cmp(&b)));
    let mut by_node: Vec<Vec<usize>> = vec![Vec::new(); c.nodes.len()];
    for (i, p) in c.pods.iter().enumerate() {
        if gpu_pod(p) {
            by_node[p.node.expect("bound")].push(i);
        }
    }
    let mut ch = Choice::default();
    'nodes: for n in order {
        for &pi in &by_node[n] {
            if ch.evicted.len() >= budget || avail <= 0 {
                break 'nodes;
            }
            ch.evicted.push(pi);
            avail -= demand(&c.pods[pi]) as i64;
        }
    }
    ch
}

/// FGD-style descheduler: most fragmented node first, the pod whose removal lowers its
/// F_n(M) most.
pub fn choose_fgd(c: &Cluster, budget: usize, shapes: &[TargetShape]) -> Choice {
    let mut cap = Capacity::of(c);
    let mut by_node: Vec<Vec<usize>> = vec![Vec::new(); c.nodes.len()];
    for (i, p) in c.pods.iter().enumerate() {
        if gpu_pod(p) {
            by_node[p.node.expect("bound")].push(i);
        }
    }
    let counted: Vec<bool> = c
        .nodes
        .iter()
        .map(|n| n.ready && !n.unschedulable && !n.gpus.is_empty())
        .collect();
    let f = |cap: &Capacity, n: usize| {
        frag::node_fragment(
            &c.nodes[n],
            &cap.free[n],
            cap.cpu_free[n],
            cap.mem_free[n],
            shapes,
        )
    };
    // Best removal per node: (drop, pod).
    let best = |cap: &mut Capacity, by_node: &[Vec<usize>], n: usize| -> Option<(f64, usize)> {
        let before = f(cap, n);
        let mut out: Option<(f64, usize)> = None;
        for &pi in &by_node[n] {
            let p = &c.pods[pi];
            let GpuUse::Devices(d) = &p.gpu else { continue };
            for (g, m) in d {
                cap.free[n][*g] += m;
            }
            cap.cpu_free[n] += p.cpu;
            cap.mem_free[n] += p.mem;
            let drop = before - f(cap, n);
            for (g, m) in d {
                cap.free[n][*g] -= m;
            }
            cap.cpu_free[n] -= p.cpu;
            cap.mem_free[n] -= p.mem;
            if drop > 1e-9 && out.is_none_or(|(b, _)| drop > b) {
                out = Some((drop, pi));
            }
        }
        out
    };
    let mut frag_n: Vec<f64> = (0..c.nodes.len())
        .map(|n| if counted[n] { f(&cap, n) } else { 0.0 })
        .collect();
    let mut best_n: Vec<Option<(f64, usize)>> = (0..c.nodes.len())
        .map(|n| {
            if counted[n] {
                best(&mut cap, &by_node, n)
            } else {
                None
            }
        })
        .collect();
    let mut ch = Choice::default();
    while ch.evicted.len() < budget {
        // The most fragmented node that has a helpful eviction.
        let pick = (0..c.nodes.len())
            .filter(|&n| best_n[n].is_some())
            .max_by(|&a, &b| frag_n[a].total_cmp(&frag_n[b]).then(b.cmp(&a)));
        let Some(n) = pick else { break };
        let (_, pi) = best_n[n].expect("filtered");
        let p = &c.pods[pi];
        if let GpuUse::Devices(d) = &p.gpu {
            for (g, m) in d {
                cap.free[n][*g] += m;
            }
        }
        cap.cpu_free[n] += p.cpu;
        cap.mem_free[n] += p.mem;
        by_node[n].retain(|&x| x != pi);
        ch.evicted.push(pi);
        frag_n[n] = f(&cap, n);
        best_n[n] = best(&mut cap, &by_node, n);
    }
    ch
}

/// The bound (see [`Bound`]).
pub fn bound(c: &Cluster, shapes: &[TargetShape], budget: usize) -> Bound {
    let cap = Capacity::of(c);
    let scope = Default::default();
    let t = frag::totals(c, &cap, &scope, shapes);
    let counted: Vec<bool> = c.nodes.iter().map(|n| frag::counted(n, &scope)).collect();
    let g_total: u64 = c
        .nodes
        .iter()
        .zip(&counted)
        .filter(|(_, k)| **k)
        .map(|(n, _)| n.gpus.iter().filter(|g| g.healthy).count() as u64)
        .sum();
    let used: u64 = c
        .pods
        .iter()
        .filter(|p| gpu_pod(p) && counted[p.node.expect("bound")])
        .map(Pod::held_milli)
        .sum();
    let gpus_needed = used.div_ceil(u64::from(GPU_MILLI));
    let free_packing = g_total.saturating_sub(gpus_needed);

    // Per GPU: pods on it; whole multi-GPU pods are items of their own.
    let mut items: Vec<(f64, f64)> = Vec::new(); // (value GPUs, cost evictions)
    let mut pods_on: Vec<Vec<u32>> = c.nodes.iter().map(|n| vec![0; n.gpus.len()]).collect();
    let mut pods_per_node = vec![0usize; c.nodes.len()];
    for p in c.pods.iter().filter(|p| gpu_pod(p)) {
        let n = p.node.expect("bound");
        pods_per_node[n] += 1;
        if let GpuUse::Devices(d) = &p.gpu {
            if d.len() > 1 || d.iter().all(|(_, m)| *m == GPU_MILLI) {
                items.push((d.len() as f64, 1.0));
            } else {
                for (g, _) in d {
                    pods_on[n][*g] += 1;
                }
            }
        }
    }
    for on in &pods_on {
        for &k in on {
            if k > 0 {
                items.push((1.0, f64::from(k)));
            }
        }
    }
    items.sort_by(|a, b| (b.0 / b.1).total_cmp(&(a.0 / a.1)));
    let mut left = budget as f64;
    let mut gain = 0.0;
    for (v, w) in items {
        if left <= 0.0 {
            break;
        }
        let take = (left / w).min(1.0);
        gain += v * take;
        left -= w * take.min(1.0) * 1.0;
        if take < 1.0 {
            break;
        }
    }
    let gpus_max = free_packing.min(t.fully_free_gpus + gain.floor() as u64);

    // Nodes.
    let nodes_budget = |only8: bool| -> u64 {
        let mut costs: Vec<usize> = (0..c.nodes.len())
            .filter(|&n| {
                counted[n] && pods_per_node[n] > 0 && (!only8 || c.nodes[n].gpus.len() == 8)
            })
            .map(|n| pods_per_node[n])
            .collect();
        costs.sort_unstable();
        let mut left = budget;
        let mut k = 0;
        for x in costs {
            if x > left {
                break;
            }
            left -= x;
            k += 1;
        }
        k
    };
    let mut sizes: Vec<u64> = (0..c.nodes.len())
        .filter(|&n| counted[n])
        .map(|n| c.nodes[n].gpus.len() as u64)
        .collect();
    sizes.sort_unstable();
    let mut room = free_packing;
    let mut nodes_packing = 0u64;
    for s in sizes {
        if s > room {
            break;
        }
        room -= s;
        nodes_packing += 1;
    }
    let n8 = (0..c.nodes.len())
        .filter(|&n| counted[n] && c.nodes[n].gpus.len() == 8)
        .count() as u64;
    let free8_packing = n8.min(free_packing / 8);
    let free8_before = free8(c);
    let nodes_max = nodes_packing.min(t.fully_free_nodes + nodes_budget(false));
    let free8_max = free8_packing.min(free8_before + nodes_budget(true));

    let drop_max = fragment_drop_max(c, &cap, &counted, shapes, budget);
    let rate_min = if t.idle_milli == 0 {
        0.0
    } else {
        ((t.fragment_milli - drop_max).max(0.0) / t.idle_milli as f64).clamp(0.0, 1.0)
    };
    Bound {
        budget,
        fragment_rate_after_min: rate_min,
        fully_free_gpus_after_max: gpus_max,
        fully_free_gpus_packing: free_packing,
        fully_free_nodes_after_max: nodes_max,
        fully_free8_gpu_nodes_after_max: free8_max,
        fully_free8_gpu_nodes_packing: free8_packing,
    }
}

/// The largest fragment drop (milli) any eviction set of `budget` pods could give: see
/// [`Bound`]. Single-GPU shapes without cpu, memory or model terms are separable per
/// GPU and get the exact per-GPU relaxation; every other shape gets the per-node one.
fn fragment_drop_max(
    c: &Cluster,
    cap: &Capacity,
    counted: &[bool],
    shapes: &[TargetShape],
    budget: usize,
) -> f64 {
    let separable = |m: &TargetShape| {
        m.gpus == 1 && m.cpu.is_none() && m.memory.is_none() && m.models.is_empty()
    };
    let (single, other): (Vec<TargetShape>, Vec<TargetShape>) =
        shapes.iter().cloned().partition(separable);
    // f(R) = Σ w·R·[R < q] over the single shapes; W(s) = Σ w·[q > s].
    let f = |r: Milli| -> f64 {
        single
            .iter()
            .filter(|m| r < m.milli_per_gpu)
            .map(|m| m.weight * f64::from(r))
            .sum()
    };
    let w_above = |s: Milli| -> f64 {
        single
            .iter()
            .filter(|m| m.milli_per_gpu > s)
            .map(|m| m.weight)
            .sum()
    };
    let w_other: f64 = other.iter().map(|m| m.weight).sum();

    // Per GPU: (milli on it, cost share, receiver credit) of each shared pod.
    let mut on_gpu: Vec<Vec<Vec<(Milli, f64, f64)>>> = c
        .nodes
        .iter()
        .map(|n| vec![Vec::new(); n.gpus.len()])
        .collect();
    let mut per_node: Vec<Vec<u64>> = vec![Vec::new(); c.nodes.len()];
    for p in c.pods.iter().filter(|p| gpu_pod(p)) {
        let n = p.node.expect("bound");
        if !counted[n] {
            continue;
        }
        per_node[n].push(p.held_milli());
        if let GpuUse::Devices(d) = &p.gpu {
            let share = 1.0 / d.len().max(1) as f64;
            for &(g, m) in d {
                if let Some(list) = on_gpu[n].get_mut(g) {
                    list.push((m, share, f64::from(m) * w_above(m)));
                }
            }
        }
    }
    // Each GPU's options (evictions, gain), reduced to the increments of their upper
    // concave hull: the LP relaxation of "one option per GPU" is the greedy over them.
    let mut steps: Vec<(f64, f64)> = Vec::new(); // (gain, cost)
    for (n, gpus) in on_gpu.iter().enumerate() {
        for (g, pods) in gpus.iter().enumerate() {
            if pods.is_empty() {
                continue;
            }
            let r = cap.free[n][g];
            let mut opts: Vec<(f64, f64)> = vec![(0.0, 0.0)];
            if pods.len() <= 12 {
                for mask in 1u32..(1 << pods.len()) {
                    let (mut s, mut cost, mut credit) = (0u32, 0.0, 0.0);
                    for (i, (m, sh, cr)) in pods.iter().enumerate() {
                        if mask & (1 << i) != 0 {
                            s += m;
                            cost += sh;
                            credit += cr;
                        }
                    }
                    let after = (r + s).min(GPU_MILLI);
                    opts.push((cost, f(r) - f(after) + credit));
                }
            } else {
                // Many pods: f(R) plus the best credits bounds every subset of a size.
                let mut cr: Vec<(f64, f64)> = pods.iter().map(|p| (p.2, p.1)).collect();
                cr.sort_by(|a, b| b.0.total_cmp(&a.0));
                let (mut cost, mut credit) = (0.0, f(r));
                for (x, sh) in cr {
                    cost += sh;
                    credit += x;
                    opts.push((cost, credit));
                }
            }
            steps.extend(hull_steps(opts));
        }
    }
    let mut drop = fill(&mut steps, budget as f64);

    // Other shapes: draining a node lowers its term by at most its F_n, each placement
    // lowers a receiver's by at most w·q.
    if !other.is_empty() {
        let mut marg: Vec<f64> = Vec::new();
        for (n, qs) in per_node.iter_mut().enumerate() {
            if qs.is_empty() {
                continue;
            }
            qs.sort_unstable_by(|a, b| b.cmp(a));
            let fnode = frag::node_fragment(
                &c.nodes[n],
                &cap.free[n],
                cap.cpu_free[n],
                cap.mem_free[n],
                &other,
            );
            for (i, q) in qs.iter().enumerate() {
                marg.push(w_other * *q as f64 + if i == 0 { fnode } else { 0.0 });
            }
        }
        marg.sort_by(|a, b| b.total_cmp(a));
        drop += marg.iter().take(budget).sum::<f64>();
    }
    drop
}

/// The increments (gain, cost) of the upper concave hull of options (cost, gain) that
/// include (0, 0): ratios fall from one increment to the next.
fn hull_steps(mut opts: Vec<(f64, f64)>) -> Vec<(f64, f64)> {
    opts.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.total_cmp(&a.1)));
    let mut hull: Vec<(f64, f64)> = Vec::new();
    for p in opts {
        if hull.last().is_some_and(|l| p.1 <= l.1) {
            continue; // costs more and gains no more
        }
        while hull.len() >= 2 {
            let (a, b) = (hull[hull.len() - 2], hull[hull.len() - 1]);
            // b is under the chord a→p: drop it.
            if (b.1 - a.1) * (p.0 - a.0) <= (p.1 - a.1) * (b.0 - a.0) {
                hull.pop();
            } else {
                break;
            }
        }
        hull.push(p);
    }
    hull.windows(2)
        .map(|w| (w[1].1 - w[0].1, w[1].0 - w[0].0))
        .filter(|(g, c)| *g > 0.0 && *c > 0.0)
        .collect()
}

/// Fractional knapsack: the most gain for `budget` cost, best ratio first.
fn fill(steps: &mut [(f64, f64)], budget: f64) -> f64 {
    steps.sort_by(|a, b| (b.0 / b.1).total_cmp(&(a.0 / a.1)));
    let mut left = budget;
    let mut gain = 0.0;
    for &(g, c) in steps.iter() {
        if left <= 0.0 {
            break;
        }
        let take = (left / c).min(1.0);
        gain += g * take;
        left -= c * take;
    }
    gain
}

/// The eviction budget: `fraction` of bound GPU pods, at least one.
pub fn budget_of(c: &Cluster, fraction: f64) -> usize {
    let bound = c.pods.iter().filter(|p| gpu_pod(p)).count();
    ((fraction.max(0.0) * bound as f64).floor() as usize).max(1)
}

/// Runs one planner and measures it.
pub fn run(
    name: &str,
    c: &Cluster,
    policy: &Policy,
    budget: usize,
    hnu_threshold: f64,
) -> anyhow::Result<Result> {
    let t0 = Instant::now();
    let ch = match name {
        "none" => Choice::default(),
        "high-node-utilization" => choose_high_node_utilization(c, budget, hnu_threshold),
        "fgd-descheduler" => choose_fgd(c, budget, &policy.shapes),
        "gpu-defrag" => choose_gpu_defrag(c, policy),
        "gpu-defrag-8gpu" => {
            choose_gpu_defrag(c, &with_whole_node_shape(policy, WHOLE_NODE_SHAPE_WEIGHT))
        }
        other => anyhow::bail!("unknown planner {other:?} (one of {})", PLANNERS.join(", ")),
    };
    measure(name, c, policy, budget, ch, t0)
}

/// gpu-defrag given the policy with an 8-GPU shape of weight `w` added
/// ([`with_whole_node_shape`]), measured like every other row (the policy's own shapes):
/// one point of the trade-off between fragment drop and whole free 8-GPU nodes.
pub fn run_whole_node_weight(
    c: &Cluster,
    policy: &Policy,
    budget: usize,
    w: f64,
) -> anyhow::Result<Result> {
    let t0 = Instant::now();
    let ch = choose_gpu_defrag(c, &with_whole_node_shape(policy, w));
    measure(&format!("gpu-defrag-8gpu@{w}"), c, policy, budget, ch, t0)
}

/// Re-places a choice's evictions and measures the result with `policy`'s shapes.
fn measure(
    name: &str,
    c: &Cluster,
    policy: &Policy,
    budget: usize,
    ch: Choice,
    t0: Instant,
) -> anyhow::Result<Result> {
    let plan_millis = t0.elapsed().as_secs_f64() * 1000.0;
    anyhow::ensure!(
        ch.evicted.len() <= budget,
        "{name} evicted {} pods, budget {budget}",
        ch.evicted.len()
    );
    let (after, pending, back) = replace(c, &ch);
    let scope = &policy.scope;
    let tb = frag::totals(c, &Capacity::of(c), scope, &policy.shapes);
    let ta = frag::totals(&after, &Capacity::of(&after), scope, &policy.shapes);
    Ok(Result {
        planner: name.into(),
        evictions: ch.evicted.len(),
        fragment_rate_before: tb.fragment_rate,
        fragment_rate_after: ta.fragment_rate,
        fragment_milli_before: tb.fragment_milli,
        fragment_milli_after: ta.fragment_milli,
        fully_free_gpus_before: tb.fully_free_gpus,
        fully_free_gpus_after: ta.fully_free_gpus,
        fully_free_nodes_before: tb.fully_free_nodes,
        fully_free_nodes_after: ta.fully_free_nodes,
        fully_free8_gpu_nodes_before: free8(c),
        fully_free8_gpu_nodes_after: free8(&after),
        plan_millis,
        pending_after: pending,
        landed_back: back,
        expected_fragment_rate_after: ch.expected_rate,
        units: ch.units,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::{self, tests::*};

    fn setup(seed: u64) -> (Cluster, Policy, usize) {
        let (c, _) = scenario::build(&tiny_trace(), &params(seed));
        let shapes = frag::default_shapes(&c, &Default::default());
        let budget = budget_of(&c, 0.2);
        (c.clone(), bench_policy(shapes, budget as u32), budget)
    }

    #[test]
    fn every_planner_respects_the_budget_and_keeps_the_cluster_consistent() {
        for seed in 0..6 {
            let (c, policy, budget) = setup(seed);
            let bound = bound(&c, &policy.shapes, budget);
            for name in PLANNERS {
                for b in [1, budget] {
                    let r = run(name, &c, &policy_with_budget(&policy, b), b, 90.0).unwrap();
                    assert!(r.evictions <= b, "{name}: {} > {b}", r.evictions);
                    if name == "none" {
                        assert_eq!(r.fragment_rate_after, r.fragment_rate_before);
                    }
                    if b == budget && r.pending_after == 0 {
                        assert!(
                            r.fully_free_gpus_after <= bound.fully_free_gpus_after_max,
                            "{name} {r:?} {bound:?}"
                        );
                        assert!(
                            r.fully_free_nodes_after <= bound.fully_free_nodes_after_max,
                            "{name} {r:?} {bound:?}"
                        );
                        assert!(
                            r.fully_free8_gpu_nodes_after <= bound.fully_free8_gpu_nodes_after_max
                        );
                        assert!(r.fragment_rate_after + 1e-9 >= bound.fragment_rate_after_min);
                    }
                }
            }
        }
    }

    /// The fragment bound holds for every eviction set of one and two pods, re-placed by
    /// the bin-packing emulation with and without fences on their GPUs.
    #[test]
    fn no_eviction_set_beats_the_fragment_bound() {
        for seed in 0..4 {
            let (c, policy, _) = setup(seed);
            // The derived shapes (multi-GPU ones included: the per-node part) and single-GPU
            // shapes alone (the per-GPU part, much tighter).
            let single = [(1000, 0.5), (500, 0.3), (250, 0.2)]
                .map(|(m, w)| TargetShape::of_gpus(1, m, w))
                .to_vec();
            for shapes in [&policy.shapes, &single] {
                let scope = Default::default();
                let before = frag::totals(&c, &Capacity::of(&c), &scope, shapes);
                let pods: Vec<usize> = (0..c.pods.len()).filter(|&i| gpu_pod(&c.pods[i])).collect();
                let mut sets: Vec<Vec<usize>> = pods.iter().map(|&p| vec![p]).collect();
                for (i, &a) in pods.iter().enumerate() {
                    for &b in &pods[i + 1..] {
                        sets.push(vec![a, b]);
                    }
                }
                let mut best = [0.0f64; 3];
                for set in sets {
                    let b = set.len();
                    for fence in [false, true] {
                        let mut ch = Choice {
                            evicted: set.clone(),
                            ..Default::default()
                        };
                        if fence {
                            for &pi in &set {
                                if let GpuUse::Devices(d) = &c.pods[pi].gpu {
                                    let n = c.pods[pi].node.unwrap();
                                    ch.fenced_gpus.extend(d.iter().map(|(g, _)| (n, *g)));
                                }
                            }
                        }
                        let (after, pending, _) = replace(&c, &ch);
                        if pending > 0 {
                            continue;
                        }
                        let t = frag::totals(&after, &Capacity::of(&after), &scope, shapes);
                        best[b] = best[b].max(before.fragment_milli - t.fragment_milli);
                    }
                }
                for b in [1, 2] {
                    let max = before.fragment_milli
                        - bound(&c, shapes, b).fragment_rate_after_min * before.idle_milli as f64;
                    eprintln!(
                        "seed {seed} b {b} best {} max {max} F {}",
                        best[b], before.fragment_milli
                    );
                    assert!(
                        best[b] <= max + 1e-6,
                        "seed {seed}, {b} evictions: {} > bound {max}",
                        best[b]
                    );
                }
            }
        }
    }

    /// Landing as planned puts every moved pod on its planned node and devices, leaves
    /// none pending, and the cluster it builds measures what the plan forecast.
    #[test]
    fn landing_as_planned_is_the_plans_own_forecast() {
        let mut moved = 0;
        for seed in 0..6 {
            let (c, policy, budget) = setup(seed);
            let (p, after) = land_as_planned(&c, &policy).unwrap();
            assert!(p.moves.len() <= budget);
            moved += p.moves.len();
            for m in &p.moves {
                let pod = &after.pods[m.pod_index];
                assert_eq!(
                    pod.node_name.as_deref(),
                    Some(m.to_node.as_str()),
                    "{}",
                    m.pod
                );
                let GpuUse::Devices(d) = &pod.gpu else {
                    panic!("{}: no devices", m.pod)
                };
                let n = &after.nodes[pod.node.unwrap()];
                let keys: Vec<&str> = d.iter().map(|(g, _)| n.gpus[*g].key.as_str()).collect();
                assert_eq!(keys, m.to_devices, "{}", m.pod);
            }
            assert!(after.pods.iter().all(|q| q.node.is_some() || !gpu_pod(q)));
            let scope = &policy.scope;
            let t = frag::totals(&after, &Capacity::of(&after), scope, &policy.shapes);
            assert!(
                (t.fragment_milli - p.after.fragment_milli).abs()
                    <= 1e-6 * t.fragment_milli.abs().max(1.0),
                "seed {seed}: measured {} forecast {}",
                t.fragment_milli,
                p.after.fragment_milli
            );
            assert_eq!(t.idle_milli, p.after.idle_milli, "seed {seed}");
            assert_eq!(t.fully_free_gpus, p.after.fully_free_gpus, "seed {seed}");
            let before = frag::totals(&c, &Capacity::of(&c), scope, &policy.shapes);
            assert!(
                t.fragment_milli <= before.fragment_milli + 1e-9,
                "seed {seed}"
            );
        }
        assert!(moved > 0, "no seed moved anything: the test checks nothing");
    }

    fn policy_with_budget(p: &Policy, b: usize) -> Policy {
        bench_policy(p.shapes.clone(), b as u32)
    }

    #[test]
    fn high_node_utilization_checks_capacity_in_aggregate_only() {
        let (c, _, _) = setup(3);
        // Threshold 100: every node is under it → early exit, as the plugin does.
        assert!(
            choose_high_node_utilization(&c, 1000, 101.0)
                .evicted
                .is_empty()
        );
        // Threshold 0: no node under it.
        assert!(
            choose_high_node_utilization(&c, 1000, 0.0)
                .evicted
                .is_empty()
        );
    }

    #[test]
    fn replace_is_deterministic_and_conserves_pods() {
        let (c, policy, budget) = setup(4);
        let ch = choose_fgd(&c, budget, &policy.shapes);
        let (a, pa, _) = replace(&c, &ch);
        let (b, pb, _) = replace(&c, &ch);
        assert_eq!(a, b);
        assert_eq!(pa, pb);
        let milli = |c: &Cluster| -> u64 {
            c.nodes
                .iter()
                .flat_map(|n| &n.gpus)
                .map(|g| u64::from(g.used))
                .sum()
        };
        let pending: u64 = a.pods.iter().filter(|p| p.node.is_none()).map(demand).sum();
        assert_eq!(milli(&a) + pending, milli(&c));
    }
}

/// Weight of the 8-GPU shape in the `gpu-defrag-8gpu` row's policy.
pub const WHOLE_NODE_SHAPE_WEIGHT: f64 = 0.1;

/// The policy with an 8-GPU whole-GPU target shape of weight `w` added (the others
/// scaled to 1 − w): what a user who wants whole 8-GPU nodes for training jobs writes.
pub fn with_whole_node_shape(policy: &Policy, w: f64) -> Policy {
    let mut p = policy.clone();
    for s in &mut p.shapes {
        s.weight *= 1.0 - w;
    }
    p.shapes.push(TargetShape::of_gpus(8, GPU_MILLI, w));
    p
}

#[cfg(test)]
mod bound_tests {
    use super::{fill, hull_steps};

    #[test]
    fn hull_keeps_the_upper_concave_envelope() {
        // (cost, gain): (1, 1) lies under the chord (0, 0)→(2, 5); (3, 4) gains less.
        let steps = hull_steps(vec![
            (0.0, 0.0),
            (1.0, 1.0),
            (2.0, 5.0),
            (3.0, 4.0),
            (4.0, 6.0),
        ]);
        assert_eq!(steps, vec![(5.0, 2.0), (1.0, 2.0)]);
    }

    #[test]
    fn knapsack_takes_best_ratio_first_and_a_fraction_of_the_last() {
        let mut steps = vec![(1.0, 1.0), (6.0, 2.0), (4.0, 4.0)];
        // 6/2 first (cost 2), then 1/1 (cost 1), then half of 4/4.
        assert_eq!(fill(&mut steps, 5.0), 6.0 + 1.0 + 2.0);
        assert_eq!(fill(&mut steps, 0.0), 0.0);
    }
}
