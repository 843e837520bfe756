//! The fragmentation metric (docs/fragmentation.md is its contract).
//!
//! For node n with free milli R_g per GPU and target shape m (k GPUs of q milli, optional
//! cpu/memory/models): F_n(m) = Σ_g R_g when m cannot be placed on n or asks for no GPU,
//! else Σ_g R_g·[R_g < q]. F_n(M) = Σ_m p_m F_n(m); fragmentMilli = Σ_n F_n(M);
//! idleMilli = Σ_n Σ_g R_g; fragmentRate = fragmentMilli / idleMilli (0 when idle is 0).
use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::model::*;
use crate::policy::{Policy, Scope, TargetShape, normalise};
use crate::sched;

/// Share of GPU pods the derived shape list must cover.
pub const DEFAULT_SHAPE_COVERAGE: f64 = 0.95;

/// Whether a node is counted: Ready, not cordoned, covered by the policy, ≥ 1 GPU.
pub fn counted(node: &Node, scope: &Scope) -> bool {
    node.ready && !node.unschedulable && !node.gpus.is_empty() && scope.covers_node(node)
}

/// F_n(m) for one node given its free milli per GPU (in milli, exact).
pub fn node_fragment_for(
    node: &Node,
    free: &[Milli],
    cpu_free: u64,
    mem_free: u64,
    m: &TargetShape,
) -> u64 {
    let idle: u64 = free.iter().map(|r| u64::from(*r)).sum();
    if m.gpus == 0 {
        return idle;
    }
    let fits_gpus = free.iter().filter(|r| **r >= m.milli_per_gpu).count() >= m.gpus as usize;
    let fits_cpu = m.cpu.is_none_or(|c| c <= cpu_free);
    let fits_mem = m.memory.is_none_or(|b| b <= mem_free);
    let model_ok = m.models.is_empty() || node.model.as_ref().is_some_and(|x| m.models.contains(x));
    if !(fits_gpus && fits_cpu && fits_mem && model_ok) {
        return idle;
    }
    free.iter()
        .filter(|r| **r < m.milli_per_gpu)
        .map(|r| u64::from(*r))
        .sum()
}

/// F_n(M): weighted over the shapes (weights sum to 1).
pub fn node_fragment(
    node: &Node,
    free: &[Milli],
    cpu_free: u64,
    mem_free: u64,
    shapes: &[TargetShape],
) -> f64 {
    shapes
        .iter()
        .map(|m| m.weight * node_fragment_for(node, free, cpu_free, mem_free, m) as f64)
        .sum()
}

/// Free milli per GPU of a node, as the metric sees it.
pub fn free_of(node: &Node) -> Vec<Milli> {
    node.gpus.iter().map(Gpu::free).collect()
}

/// The target shapes: the policy's, else derived from the pods.
pub fn target_shapes(cluster: &Cluster, policy: &Policy) -> Vec<TargetShape> {
    if policy.shapes.is_empty() {
        default_shapes(cluster, &policy.scope)
    } else {
        policy.shapes.clone()
    }
}

/// The distinct GPU request shapes of bound and pending pods (in scope), most common
/// first, until 95% of those pods are covered; weights are the counts, normalised.
/// A cluster with no GPU pods gets one whole-GPU shape.
pub fn default_shapes(cluster: &Cluster, scope: &Scope) -> Vec<TargetShape> {
    let mut counts: BTreeMap<GpuShape, u64> = BTreeMap::new();
    for p in &cluster.pods {
        if p.phase.is_terminal() || p.deleting {
            continue;
        }
        let in_scope = match p.node {
            Some(i) => scope.covers_node(&cluster.nodes[i]),
            None => p.node_name.is_none() && scope.covers_namespace(&p.namespace),
        };
        if !in_scope {
            continue;
        }
        if let Some(s) = p.shape.filter(|s| s.gpus > 0) {
            *counts.entry(s).or_default() += 1;
        }
    }
    let total: u64 = counts.values().sum();
    if total == 0 {
        return vec![TargetShape::of_gpus(1, GPU_MILLI, 1.0)];
    }
    let mut sorted: Vec<(GpuShape, u64)> = counts.into_iter().collect();
    // Most common first; ties: larger shapes first (stable, deterministic).
    sorted.sort_by(|a, b| b.1.cmp(&a.1).then(b.0.cmp(&a.0)));
    let mut out = Vec::new();
    let mut covered = 0u64;
    for (s, c) in sorted {
        if covered as f64 >= DEFAULT_SHAPE_COVERAGE * total as f64 {
            break;
        }
        covered += c;
        out.push(TargetShape::of_gpus(
            s.gpus,
            s.milli.min(GPU_MILLI),
            c as f64,
        ));
    }
    normalise(&mut out);
    out
}

/// Per-node line of the report.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeReport {
    /// Node name.
    pub name: String,
    /// GPUs.
    pub gpus: usize,
    /// Idle milli.
    pub idle_milli: u64,
    /// Fragment milli (F_n(M), rounded).
    pub fragment_milli: u64,
    /// Fully free GPUs.
    pub fully_free_gpus: usize,
    /// Scheme.
    pub scheme: Scheme,
    /// GPU model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Used milli per GPU (for the heatmap).
    pub used: Vec<Milli>,
    /// DRA nodes: where each GPU of `used` is published (driver, pool, device) and the
    /// MIG partitions allocated on it; empty for other schemes.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<DraGpu>,
    /// Pods with unknown allocation on it.
    #[serde(skip_serializing_if = "is_zero")]
    pub unknown_pods: u32,
    /// Why its records contradict each other, if they do.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inconsistent: Option<String>,
}

fn is_zero(v: &u32) -> bool {
    *v == 0
}

/// MIG profile pool of one Ready node in scope: the mixed strategy's allocatable
/// `nvidia.com/mig-*` resources, or DRA partitions (capacity = used + how many more of
/// the profile still fit, first fit in the driver's order).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MigReport {
    /// Node.
    pub node: String,
    /// Profile, e.g. `1g.10gb`.
    pub profile: String,
    /// Capacity.
    pub capacity: u64,
    /// Used.
    pub used: u64,
    /// Free.
    pub free: u64,
}

/// A pod with an unknown allocation.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UnknownPod {
    /// `namespace/name`.
    pub pod: String,
    /// Node.
    pub node: String,
    /// Reason code.
    pub reason: String,
    /// Details.
    pub message: String,
}

/// The fragmentation report (`gpu-defrag report -o json`).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// fragmentMilli / idleMilli.
    pub fragment_rate: f64,
    /// Σ_n F_n(M), rounded to the milli.
    pub fragment_milli: u64,
    /// Σ_n Σ_g R_g.
    pub idle_milli: u64,
    /// GPUs on counted nodes.
    pub gpus: u64,
    /// GPUs with nothing allocated.
    pub fully_free_gpus: u64,
    /// Nodes with every GPU free.
    pub fully_free_nodes: u64,
    /// Idle milli on partly used GPUs.
    pub stranded_milli: u64,
    /// Largest number of whole GPUs free on one counted node.
    pub largest_free_gpus_on_a_node: u64,
    /// Pods with unknown allocation (bound, anywhere).
    pub unknown_pods: u64,
    /// Unknown pods by reason code.
    pub unknown_by_reason: BTreeMap<String, u64>,
    /// Pending GPU pods (in the policy's namespaces) no node of the cluster can take
    /// today, in the policy's node scope or not (by every filter of `sched::fit`).
    pub pending_unplaceable: u64,
    /// Counted nodes.
    pub nodes_counted: u64,
    /// Target shapes used.
    pub target_shapes: Vec<TargetShape>,
    /// Per counted node, sorted by name.
    pub nodes: Vec<NodeReport>,
    /// MIG pools (mixed strategy), per node and profile.
    pub mig: Vec<MigReport>,
    /// Unknown pods (first 100).
    pub unknown: Vec<UnknownPod>,
}

/// Free milli per GPU and free cpu/memory/pod slots of every node: the mutable state
/// the planner and simulations work on.
#[derive(Debug, Clone, PartialEq)]
pub struct Capacity {
    /// Per node, per GPU.
    pub free: Vec<Vec<Milli>>,
    /// Per node.
    pub cpu_free: Vec<u64>,
    /// Per node.
    pub mem_free: Vec<u64>,
    /// Per node.
    pub pods_free: Vec<u64>,
}

impl Capacity {
    /// Current free capacity of the cluster.
    pub fn of(cluster: &Cluster) -> Capacity {
        Capacity {
            free: cluster.nodes.iter().map(free_of).collect(),
            cpu_free: cluster.nodes.iter().map(Node::cpu_free).collect(),
            mem_free: cluster.nodes.iter().map(Node::mem_free).collect(),
            pods_free: cluster
                .nodes
                .iter()
                .map(|n| n.pods_alloc.saturating_sub(n.pods_used))
                .collect(),
        }
    }

    /// What node `n` has free, for [`sched::fit`].
    pub fn at(&self, n: usize) -> sched::Free<'_> {
        sched::Free {
            gpus: &self.free[n],
            cpu: self.cpu_free[n],
            mem: self.mem_free[n],
            pods: self.pods_free[n],
        }
    }
}

/// Cluster-level numbers for a capacity state (no per-node detail): what the planner
/// evaluates after every batch.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Totals {
    /// Rate.
    pub fragment_rate: f64,
    /// Fragment milli (exact).
    pub fragment_milli: f64,
    /// Idle milli.
    pub idle_milli: u64,
    /// Fully free GPUs.
    pub fully_free_gpus: u64,
    /// Fully free nodes.
    pub fully_free_nodes: u64,
}

/// Totals over counted nodes for a capacity state.
pub fn totals(cluster: &Cluster, cap: &Capacity, scope: &Scope, shapes: &[TargetShape]) -> Totals {
    let mut t = Totals::default();
    for (i, n) in cluster.nodes.iter().enumerate() {
        if !counted(n, scope) {
            continue;
        }
        let free = &cap.free[i];
        t.fragment_milli += node_fragment(n, free, cap.cpu_free[i], cap.mem_free[i], shapes);
        t.idle_milli += free.iter().map(|r| u64::from(*r)).sum::<u64>();
        let ff = free
            .iter()
            .zip(&n.gpus)
            .filter(|(r, g)| g.healthy && **r == GPU_MILLI)
            .count() as u64;
        t.fully_free_gpus += ff;
        if ff == n.gpus.len() as u64 {
            t.fully_free_nodes += 1;
        }
    }
    t.fragment_rate = if t.idle_milli == 0 {
        0.0
    } else {
        (t.fragment_milli / t.idle_milli as f64).clamp(0.0, 1.0)
    };
    t
}

/// Computes the full report for a cluster and policy.
pub fn report(cluster: &Cluster, policy: &Policy) -> Report {
    let shapes = target_shapes(cluster, policy);
    let cap = Capacity::of(cluster);
    let t = totals(cluster, &cap, &policy.scope, &shapes);
    let mut nodes = Vec::new();
    let mut stranded = 0u64;
    let mut gpus = 0u64;
    let mut largest = 0u64;
    let mut mig = Vec::new();
    for (i, n) in cluster.nodes.iter().enumerate() {
        if n.ready && policy.scope.covers_node(n) {
            for p in &n.mig {
                mig.push(MigReport {
                    node: n.name.clone(),
                    profile: p.profile.clone(),
                    capacity: p.capacity,
                    used: p.used,
                    free: p.capacity.saturating_sub(p.used),
                });
            }
        }
        if !counted(n, &policy.scope) {
            continue;
        }
        let free = &cap.free[i];
        gpus += n.gpus.len() as u64;
        stranded += n
            .gpus
            .iter()
            .filter(|g| g.healthy && g.used > 0 && g.used < GPU_MILLI)
            .map(|g| u64::from(g.free()))
            .sum::<u64>();
        let ff = n.fully_free_gpus();
        largest = largest.max(ff as u64);
        nodes.push(NodeReport {
            name: n.name.clone(),
            gpus: n.gpus.len(),
            idle_milli: n.free_milli(),
            fragment_milli: node_fragment(n, free, cap.cpu_free[i], cap.mem_free[i], &shapes)
                .round() as u64,
            fully_free_gpus: ff,
            scheme: n.scheme,
            model: n.model.clone(),
            used: n
                .gpus
                .iter()
                .map(|g| if g.healthy { g.used } else { GPU_MILLI })
                .collect(),
            unknown_pods: n.unknown_pods,
            inconsistent: n.inconsistent.clone(),
            devices: n.dra.clone(),
        });
    }
    let mut unknown = Vec::new();
    let mut by_reason: BTreeMap<String, u64> = BTreeMap::new();
    let mut unknown_count = 0u64;
    for p in &cluster.pods {
        if let (Some(i), GpuUse::Unknown(r)) = (p.node, &p.gpu) {
            unknown_count += 1;
            *by_reason.entry(r.code().to_string()).or_default() += 1;
            if unknown.len() < 100 {
                unknown.push(UnknownPod {
                    pod: p.key(),
                    node: cluster.nodes[i].name.clone(),
                    reason: r.code().into(),
                    message: r.to_string(),
                });
            }
        }
    }
    Report {
        fragment_rate: t.fragment_rate,
        fragment_milli: t.fragment_milli.round() as u64,
        idle_milli: t.idle_milli,
        gpus,
        fully_free_gpus: t.fully_free_gpus,
        fully_free_nodes: t.fully_free_nodes,
        stranded_milli: stranded,
        largest_free_gpus_on_a_node: largest,
        unknown_pods: unknown_count,
        unknown_by_reason: by_reason,
        pending_unplaceable: pending_unplaceable(cluster, &cap, &policy.scope) as u64,
        nodes_counted: nodes.len() as u64,
        target_shapes: shapes,
        nodes,
        mig,
        unknown,
    }
}

/// Pending GPU pods (in scope) that fit no counted node with the given capacity.
pub fn pending_unplaceable(cluster: &Cluster, cap: &Capacity, scope: &Scope) -> usize {
    unplaceable_pending(cluster, cap, scope).len()
}

/// Indices of the pending GPU pods (in the scope's namespaces) that fit no node of the
/// cluster, in scope or not: a pod that fits somewhere needs no room made for it.
pub fn unplaceable_pending(cluster: &Cluster, cap: &Capacity, scope: &Scope) -> Vec<usize> {
    let pending: Vec<usize> = cluster
        .pods
        .iter()
        .enumerate()
        // Only pending pods the policy's namespaces cover are its demand: a pod in a
        // namespace the policy excludes must not steer what it evicts.
        .filter(|(_, p)| {
            p.is_pending()
                && p.shape.is_some_and(|s| s.gpus > 0)
                && scope.covers_namespace(&p.namespace)
        })
        .map(|(i, _)| i)
        .collect();
    if pending.is_empty() {
        return pending;
    }
    let occ = sched::Occupancy::of(cluster);
    // Pending pods mostly come in a few kinds: decide once per placement signature
    // (shape, scheme, requests, selectors, affinity, tolerations, models) for the pods
    // whose placement no other pod affects, not once per pod.
    let mut memo: HashMap<String, bool> = HashMap::new();
    let mut out = Vec::new();
    for pi in pending {
        let p = &cluster.pods[pi];
        let anywhere = || {
            let inc = sched::Incoming::new(cluster, &occ, pi);
            (0..cluster.nodes.len()).any(|i| inc.fit(i, cap.at(i)).fits())
        };
        let placeable = if p.constraints().inter_pod() || occ.has_anti_affinity() {
            anywhere()
        } else {
            let key = format!(
                "{:?}|{:?}|{}|{}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}",
                p.shape,
                p.scheme,
                p.cpu,
                p.mem,
                p.node_selector,
                p.affinity,
                p.tolerations,
                p.models,
                p.constraints,
                p.node_name
            );
            *memo.entry(key).or_insert_with(anywhere)
        };
        if !placeable {
            out.push(pi);
        }
    }
    out
}

/// A pod holding GPUs that stayed idle over the lookback window ([`Activity::is_idle`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct IdlePod {
    /// `namespace/name`.
    pub pod: String,
    /// Node.
    pub node: String,
    /// Index in `Cluster::pods`.
    #[serde(skip)]
    pub pod_index: usize,
    /// GPUs it holds (devices, or whole GPUs counted per node).
    pub gpus: u32,
    /// Milli it holds.
    pub milli: u64,
    /// Its highest GPU activity over the window, 0..=1.
    pub peak: f64,
}

/// Allocated-but-idle GPUs on the nodes a policy counts (the nodes of the fragmentation
/// report), from an [`Activity`] the caller measured.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct IdleAllocated {
    /// Idle pods.
    pub pods: u64,
    /// GPUs allocated only to idle pods: a shared device counts when every pod on it is
    /// idle; whole GPUs counted per node count one per GPU the idle pod holds.
    pub gpus: u64,
    /// Milli held by idle pods.
    pub milli: u64,
    /// Bound pods holding GPUs on these nodes (MIG instances are not counted).
    pub gpu_pods: u64,
    /// Of those, the ones with a measurement (idle or not): the rest have no data.
    pub measured_pods: u64,
    /// Every idle pod, most milli first, then by key.
    pub idle: Vec<IdlePod>,
}

/// Allocated-but-idle GPUs of the nodes `policy` counts. Pods of every namespace count
/// (the capacity is the node's, as in the fragmentation report).
pub fn idle_allocated(cluster: &Cluster, policy: &Policy, activity: &Activity) -> IdleAllocated {
    let mut out = IdleAllocated::default();
    // Per device of a node: milli held by idle pods and by the others.
    let mut devices: HashMap<(usize, usize), (u64, u64)> = HashMap::new();
    for (pi, p) in cluster.pods.iter().enumerate() {
        let Some(ni) = p.node else { continue };
        let node = &cluster.nodes[ni];
        if !counted(node, &policy.scope) || !p.is_active_bound() || p.held_milli() == 0 {
            continue;
        }
        out.gpu_pods += 1;
        let measured = activity.of(p);
        if measured.is_some() {
            out.measured_pods += 1;
        }
        let idle = activity.is_idle(p, cluster.now);
        let gpus = match &p.gpu {
            GpuUse::Whole(n) => {
                if idle {
                    out.gpus += u64::from(*n);
                }
                *n
            }
            GpuUse::Devices(d) => {
                for (dev, m) in d {
                    let e = devices.entry((ni, *dev)).or_default();
                    if idle {
                        e.0 += u64::from(*m);
                    } else {
                        e.1 += u64::from(*m);
                    }
                }
                d.len() as u32
            }
            _ => 0,
        };
        if idle {
            out.pods += 1;
            out.milli += p.held_milli();
            out.idle.push(IdlePod {
                pod: p.key(),
                node: node.name.clone(),
                pod_index: pi,
                gpus,
                milli: p.held_milli(),
                peak: measured.map_or(0.0, |a| a.peak),
            });
        }
    }
    out.gpus += devices
        .values()
        .filter(|(idle, busy)| *idle > 0 && *busy == 0)
        .count() as u64;
    out.idle
        .sort_by(|a, b| b.milli.cmp(&a.milli).then_with(|| a.pod.cmp(&b.pod)));
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    pub(crate) fn node(name: &str, used: &[Milli]) -> Node {
        Node {
            name: name.into(),
            labels: Default::default(),
            taints: vec![],
            ready: true,
            unschedulable: false,
            model: Some("H100".into()),
            scheme: Scheme::Hami,
            granularity: Granularity::Device,
            gpus: used
                .iter()
                .enumerate()
                .map(|(i, u)| Gpu {
                    key: i.to_string(),
                    used: *u,
                    healthy: true,
                    memory_mib: Some(81920),
                })
                .collect(),
            cpu_alloc: 64_000,
            mem_alloc: 512 << 30,
            pods_alloc: 110,
            cpu_used: 0,
            mem_used: 0,
            pods_used: 0,
            mig: vec![],
            unknown_pods: 0,
            inconsistent: None,
            ready_since: None,
            starting: None,
            dra: Vec::new(),
            extra_alloc: Vec::new(),
            extra_used: Vec::new(),
        }
    }

    fn shape(gpus: u32, milli: Milli, weight: f64) -> TargetShape {
        TargetShape::of_gpus(gpus, milli, weight)
    }

    fn policy_with(shapes: Vec<TargetShape>) -> Policy {
        let mut p = Policy {
            shapes,
            ..Policy::default()
        };
        normalise(&mut p.shapes);
        p
    }

    #[test]
    fn worked_example_from_the_docs() {
        let cluster = Cluster {
            nodes: vec![
                node("a", &[1000, 500, 0, 0]),
                node("b", &[1000, 1000, 1000, 750]),
            ],
            ..Default::default()
        };
        let r = report(
            &cluster,
            &policy_with(vec![shape(2, 1000, 1.0), shape(1, 500, 1.0)]),
        );
        assert_eq!(r.nodes[0].fragment_milli, 250);
        assert_eq!(r.nodes[1].fragment_milli, 250);
        assert_eq!(r.fragment_milli, 500);
        assert_eq!(r.idle_milli, 2750);
        assert!((r.fragment_rate - 500.0 / 2750.0).abs() < 1e-12);
        assert_eq!(
            (r.fully_free_gpus, r.fully_free_nodes, r.stranded_milli),
            (2, 0, 750)
        );
        assert_eq!(r.largest_free_gpus_on_a_node, 2);
    }

    #[test]
    fn cpu_memory_and_model_make_a_shape_unplaceable() {
        let n = node("a", &[0, 0]);
        let free = free_of(&n);
        let mut m = shape(1, 1000, 1.0);
        assert_eq!(node_fragment_for(&n, &free, 1000, 1 << 30, &m), 0);
        m.cpu = Some(2000);
        assert_eq!(node_fragment_for(&n, &free, 1000, 1 << 30, &m), 2000);
        m.cpu = None;
        m.memory = Some(2 << 30);
        assert_eq!(node_fragment_for(&n, &free, 1000, 1 << 30, &m), 2000);
        m.memory = None;
        m.models = vec!["A100".into()];
        assert_eq!(node_fragment_for(&n, &free, 1000, 1 << 30, &m), 2000);
        assert_eq!(
            node_fragment_for(&n, &free, 1000, 1 << 30, &shape(0, 1000, 1.0)),
            2000
        );
    }

    #[test]
    fn cordoned_not_ready_and_unselected_nodes_are_not_counted() {
        let mut a = node("a", &[500]);
        a.unschedulable = true;
        let mut b = node("b", &[500]);
        b.ready = false;
        let mut c = node("c", &[500]);
        c.labels.insert("pool".into(), "other".into());
        let d = node("d", &[]);
        let mut p = policy_with(vec![shape(1, 1000, 1.0)]);
        p.scope.node_selector = Some(LabelSelector {
            match_labels: [("pool".to_string(), "train".to_string())].into(),
            ..Default::default()
        });
        let cluster = Cluster {
            nodes: vec![a, b, c, d],
            ..Default::default()
        };
        let r = report(&cluster, &p);
        assert_eq!(
            (r.nodes_counted, r.idle_milli, r.fragment_rate),
            (0, 0, 0.0)
        );
    }

    #[test]
    fn default_shapes_cover_95_percent_most_common_first() {
        let mut cluster = Cluster {
            nodes: vec![node("a", &[0; 8])],
            ..Default::default()
        };
        let mk = |g: u32, m: Milli| Pod {
            namespace: "ns".into(),
            name: format!("p{g}-{m}-{}", rand_suffix()),
            node: Some(0),
            node_name: Some("a".into()),
            phase: Phase::Running,
            labels: Default::default(),
            annotations: Default::default(),
            gpu: GpuUse::None,
            shape: Some(GpuShape { gpus: g, milli: m }),
            scheme: None,
            cpu: 0,
            mem: 0,
            priority: 0,
            priority_class: None,
            owner: None,
            started: None,
            deleting: false,
            mirror: false,
            local_storage: false,
            ready: true,
            workload: None,
            node_selector: Default::default(),
            affinity: vec![],
            tolerations: vec![],
            models: vec![],
            ..Default::default()
        };
        for _ in 0..90 {
            cluster.pods.push(mk(1, 1000));
        }
        for _ in 0..6 {
            cluster.pods.push(mk(8, 1000));
        }
        for _ in 0..4 {
            cluster.pods.push(mk(1, 300));
        }
        let shapes = default_shapes(&cluster, &Scope::default());
        assert_eq!(shapes.len(), 2, "{shapes:?}");
        assert_eq!((shapes[0].gpus, shapes[1].gpus), (1, 8));
        assert!((shapes[0].weight - 90.0 / 96.0).abs() < 1e-9);
    }

    fn gpu_pod(name: &str, node: usize, node_name: &str, gpu: GpuUse) -> Pod {
        let milli = match &gpu {
            GpuUse::Whole(_) => 1000,
            GpuUse::Devices(d) => d.first().map_or(0, |x| x.1),
            _ => 0,
        };
        Pod {
            namespace: "ml".into(),
            name: name.into(),
            node: Some(node),
            node_name: Some(node_name.into()),
            phase: Phase::Running,
            labels: Default::default(),
            annotations: Default::default(),
            gpu,
            shape: Some(GpuShape { gpus: 1, milli }),
            scheme: None,
            cpu: 0,
            mem: 0,
            priority: 0,
            priority_class: None,
            owner: None,
            started: Some(chrono::DateTime::<chrono::Utc>::UNIX_EPOCH),
            deleting: false,
            mirror: false,
            local_storage: false,
            ready: true,
            workload: None,
            node_selector: Default::default(),
            affinity: vec![],
            tolerations: vec![],
            models: vec![],
            ..Default::default()
        }
    }

    fn activity(peaks: &[(&str, f64)]) -> Activity {
        Activity {
            pods: peaks
                .iter()
                .map(|(k, p)| (format!("ml/{k}"), PodActivity { peak: *p, gpus: 1 }))
                .collect(),
            threshold: 0.3,
            lookback: std::time::Duration::from_secs(4 * 3600),
        }
    }

    #[test]
    fn idle_allocated_counts_devices_whole_gpus_and_milli_of_idle_pods_only() {
        let t0 = chrono::DateTime::<chrono::Utc>::UNIX_EPOCH;
        let mut cluster = Cluster {
            // a: device granularity, GPU 0 shared by two pods, GPU 1 by one, GPU 2 whole.
            // b: whole GPUs counted per node.
            nodes: vec![node("a", &[1000, 500, 1000, 0]), node("b", &[0; 4])],
            now: Some(t0 + chrono::Duration::hours(5)),
            ..Default::default()
        };
        cluster.nodes[1].granularity = Granularity::Node;
        cluster.pods = vec![
            gpu_pod("share-idle", 0, "a", GpuUse::Devices(vec![(0, 500)])),
            gpu_pod("share-busy", 0, "a", GpuUse::Devices(vec![(0, 500)])),
            gpu_pod("half-idle", 0, "a", GpuUse::Devices(vec![(1, 500)])),
            gpu_pod("whole-idle", 0, "a", GpuUse::Devices(vec![(2, 1000)])),
            gpu_pod("two-idle", 1, "b", GpuUse::Whole(2)),
            gpu_pod("one-busy", 1, "b", GpuUse::Whole(1)),
            gpu_pod("unmeasured", 1, "b", GpuUse::Whole(1)),
        ];
        let a = activity(&[
            ("share-idle", 0.05),
            ("share-busy", 0.9),
            ("half-idle", 0.0),
            ("whole-idle", 0.299),
            ("two-idle", 0.1),
            ("one-busy", 0.3),
        ]);
        let r = idle_allocated(&cluster, &Policy::default(), &a);
        let names: Vec<&str> = r.idle.iter().map(|p| p.pod.as_str()).collect();
        assert_eq!(
            names,
            [
                "ml/two-idle",
                "ml/whole-idle",
                "ml/half-idle",
                "ml/share-idle"
            ]
        );
        // Devices: GPU 1 (half-idle) and GPU 2 (whole-idle); GPU 0 also holds a busy pod.
        // Whole: the 2 GPUs of two-idle. The threshold is strict: 0.3 is busy.
        assert_eq!((r.pods, r.gpus, r.milli), (4, 4, 500 + 500 + 1000 + 2000));
        assert_eq!((r.gpu_pods, r.measured_pods), (7, 6));
        assert_eq!(r.idle[0].gpus, 2);
        assert_eq!(r.idle[0].peak, 0.1);
        assert_eq!(
            a.idle_flags(&cluster),
            [true, false, true, true, true, false, false]
        );
    }

    #[test]
    fn no_data_young_pods_and_bad_numbers_are_never_idle() {
        let t0 = chrono::DateTime::<chrono::Utc>::UNIX_EPOCH;
        let now = t0 + chrono::Duration::hours(4);
        let mut young = gpu_pod("young", 0, "a", GpuUse::Whole(1));
        young.started = Some(now - chrono::Duration::minutes(239));
        let mut ageless = gpu_pod("ageless", 0, "a", GpuUse::Whole(1));
        ageless.started = None;
        let mut done = gpu_pod("done", 0, "a", GpuUse::Whole(1));
        done.phase = Phase::Succeeded;
        let unknown = gpu_pod(
            "unknown",
            0,
            "a",
            GpuUse::Unknown(UnknownReason::MissingRecord),
        );
        let old = gpu_pod("old", 0, "a", GpuUse::Whole(1));
        let nan = gpu_pod("nan", 0, "a", GpuUse::Whole(1));
        let cpu = gpu_pod("cpu", 0, "a", GpuUse::None);
        let mut cluster = Cluster {
            nodes: vec![node("a", &[0; 8])],
            now: Some(now),
            pods: vec![young, ageless, done, unknown, old, nan, cpu],
            ..Default::default()
        };
        cluster.nodes[0].granularity = Granularity::Node;
        let mut a = activity(&[
            ("young", 0.0),
            ("ageless", 0.0),
            ("done", 0.0),
            ("unknown", 0.0),
            ("old", 0.0),
            ("nan", f64::NAN),
            ("cpu", 0.0),
        ]);
        assert_eq!(
            a.idle_flags(&cluster),
            [false, false, false, false, true, false, false]
        );
        // Without the model's instant the measurement vouches for the age.
        cluster.now = None;
        assert_eq!(
            a.idle_flags(&cluster),
            [true, true, false, false, true, false, false]
        );
        // A measurement with no GPU, an infinite peak, a NaN threshold: not idle.
        a.pods
            .insert("ml/old".into(), PodActivity { peak: 0.0, gpus: 0 });
        a.pods.insert(
            "ml/young".into(),
            PodActivity {
                peak: f64::NEG_INFINITY,
                gpus: 1,
            },
        );
        a.threshold = f64::NAN;
        assert_eq!(a.idle_flags(&cluster), [false; 7]);
        // No activity at all: nothing idle, nothing measured.
        let r = idle_allocated(&cluster, &Policy::default(), &Activity::default());
        assert_eq!((r.pods, r.gpus, r.milli, r.measured_pods), (0, 0, 0, 0));
        assert_eq!(r.gpu_pods, 4, "young, ageless, old, nan hold GPUs");
    }

    #[test]
    fn idle_allocated_counts_only_the_policys_nodes() {
        let t0 = chrono::DateTime::<chrono::Utc>::UNIX_EPOCH;
        let mut b = node("b", &[1000]);
        b.labels.insert("pool".into(), "other".into());
        let cluster = Cluster {
            nodes: vec![node("a", &[1000]), b],
            now: Some(t0 + chrono::Duration::hours(5)),
            pods: vec![
                gpu_pod("on-a", 0, "a", GpuUse::Devices(vec![(0, 1000)])),
                gpu_pod("on-b", 1, "b", GpuUse::Devices(vec![(0, 1000)])),
            ],
            ..Default::default()
        };
        let mut p = Policy::default();
        p.scope.node_selector = Some(LabelSelector {
            match_labels: [("pool".to_string(), "other".to_string())].into(),
            ..Default::default()
        });
        let r = idle_allocated(&cluster, &p, &activity(&[("on-a", 0.0), ("on-b", 0.0)]));
        assert_eq!((r.pods, r.gpus, r.milli), (1, 1, 1000));
        assert_eq!(r.idle[0].node, "b");
    }

    fn rand_suffix() -> u64 {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        N.fetch_add(1, Ordering::Relaxed)
    }

    fn arb_cluster() -> impl Strategy<Value = Cluster> {
        prop::collection::vec(
            prop::collection::vec(prop_oneof![Just(0u32), Just(1000u32), 0u32..=1000], 1..9),
            0..12,
        )
        .prop_map(|nodes| Cluster {
            nodes: nodes
                .iter()
                .enumerate()
                .map(|(i, u)| node(&format!("n{i:02}"), u))
                .collect(),
            ..Default::default()
        })
    }

    fn arb_shapes() -> impl Strategy<Value = Vec<TargetShape>> {
        prop::collection::vec((0u32..9, 1u32..=1000, 0.01f64..10.0), 1..4).prop_map(|v| {
            v.into_iter()
                .map(|(g, m, w)| shape(g, if g > 1 { 1000 } else { m }, w))
                .collect()
        })
    }

    proptest! {
        #[test]
        fn rate_is_a_fraction_and_fragment_never_exceeds_idle(c in arb_cluster(), s in arb_shapes()) {
            let r = report(&c, &policy_with(s));
            prop_assert!((0.0..=1.0).contains(&r.fragment_rate));
            prop_assert!(r.fragment_milli <= r.idle_milli);
            prop_assert!(r.stranded_milli <= r.idle_milli);
            prop_assert!(r.fully_free_gpus * 1000 <= r.idle_milli);
            let per_node: u64 = r.nodes.iter().map(|n| n.idle_milli).sum();
            prop_assert_eq!(per_node, r.idle_milli);
        }

        #[test]
        fn a_fully_free_cluster_has_rate_zero_for_whole_gpu_shapes(sizes in prop::collection::vec(8usize..9, 1..10), k in 1u32..=8) {
            let c = Cluster { nodes: sizes.iter().enumerate().map(|(i, s)| node(&format!("n{i}"), &vec![0; *s])).collect(), ..Default::default() };
            let r = report(&c, &policy_with(vec![shape(k, 1000, 1.0)]));
            prop_assert_eq!(r.fragment_milli, 0);
            prop_assert_eq!(r.fragment_rate, 0.0);
            prop_assert_eq!(r.fully_free_nodes, sizes.len() as u64);
        }

        #[test]
        fn a_fully_free_node_with_room_contributes_no_fragment(c in arb_cluster(), k in 1u32..=8) {
            prop_assume!(!c.nodes.is_empty());
            let p = policy_with(vec![shape(k, 1000, 1.0)]);
            let mut c2 = c.clone();
            for g in &mut c2.nodes[0].gpus { g.used = 0; }
            let r = report(&c2, &p);
            let n0 = &r.nodes[0];
            if n0.gpus >= k as usize {
                prop_assert_eq!(n0.fragment_milli, 0);
            } else {
                prop_assert_eq!(n0.fragment_milli, n0.idle_milli);
            }
        }
    }
}
