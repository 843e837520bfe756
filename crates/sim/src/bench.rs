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
//! The **bound** is an upper limit on what any eviction set of the budget could reach;
//! see [`Bound`].
use std::time::Instant;

use gpu_defrag_core::frag::{self, Capacity};
use gpu_defrag_core::model::*;
use gpu_defrag_core::plan::{self, History, UnitKind};
use gpu_defrag_core::policy::{Policy, TargetShape};
use gpu_defrag_core::sched;
use serde::Serialize;

/// Planners in report order.
pub const PLANNERS: [&str; 4] = [
    "none",
    "high-node-utilization",
    "fgd-descheduler",
    "gpu-defrag",
];

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
/// - Fragment rate: a placement of a pod of q milli lowers any node's F_n(M) by at most
///   q, and draining pods from node n lowers F_n by at most F_n. So evicting set S
///   lowers F by at most Σ_{n touched} F_n + Σ_{p∈S} q_p. The largest value over sets
///   of at most B pods is the sum of the B largest marginals (F_n + q of a node's
///   largest pod, then q of its next ones). Lower limit of the rate:
///   max(0, F − that) / idle (idle unchanged when every evicted pod is re-placed).
///   This one is loose: it is a limit, not an achievable plan.
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
    pi: usize,
    fenced_node: &[bool],
    fenced_gpu: &[Vec<bool>],
) -> Option<(usize, Vec<usize>)> {
    let p = &c.pods[pi];
    let add = demand(p);
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
        if let Some(devs) = sched::fits(
            p,
            node,
            &free,
            node.cpu_free(),
            node.mem_free(),
            node.pods_alloc.saturating_sub(node.pods_used),
        ) {
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
    for (pi, src) in order {
        match binpack_target(&out, pi, &fenced_node, &fenced_gpu) {
            Some((n, devs)) => {
                if src == Some(n) {
                    back += 1;
                }
                bind(&mut out, pi, n, &devs);
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

    // Fragment: marginals per node, descending.
    let mut marg: Vec<f64> = Vec::new();
    let mut per_node: Vec<Vec<u64>> = vec![Vec::new(); c.nodes.len()];
    for p in c.pods.iter().filter(|p| gpu_pod(p)) {
        per_node[p.node.expect("bound")].push(p.held_milli());
    }
    for (n, qs) in per_node.iter_mut().enumerate() {
        if !counted[n] || qs.is_empty() {
            continue;
        }
        qs.sort_unstable_by(|a, b| b.cmp(a));
        let fnode = frag::node_fragment(
            &c.nodes[n],
            &cap.free[n],
            cap.cpu_free[n],
            cap.mem_free[n],
            shapes,
        );
        for (i, q) in qs.iter().enumerate() {
            marg.push(*q as f64 + if i == 0 { fnode } else { 0.0 });
        }
    }
    marg.sort_by(|a, b| b.total_cmp(a));
    let drop_max: f64 = marg.iter().take(budget).sum();
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
        other => anyhow::bail!("unknown planner {other:?} (one of {})", PLANNERS.join(", ")),
    };
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
