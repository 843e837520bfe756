//! What every planner starts from: the planning state over the cluster, which GPU pods
//! are movable (and why the others are not), the target shapes and the totals now.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};

use super::movability::{movable_but_pdbs, pdb_rules};
use super::state::State;
use super::{
    History, IDLE_POD_COST, PdbIndex, Skip, SkippedPod, Workloads, extra_cost, warm,
    workload_allows,
};
use crate::frag::{self, Capacity, Totals};
use crate::model::*;
use crate::policy::{Policy, TargetShape};
use crate::sched;

/// What every planner starts from: the planning state over the cluster (capacity,
/// limits, PDB allowances, what the run already did), which GPU pods are movable, the
/// skipped ones with their codes, the target shapes and the totals now.
pub(super) struct Prepared<'a> {
    pub(super) st: State<'a>,
    pub(super) ok: Vec<bool>,
    pub(super) skipped: BTreeMap<String, u64>,
    pub(super) skipped_pods: Vec<SkippedPod>,
    pub(super) shapes: Vec<TargetShape>,
    pub(super) before: Totals,
    pub(super) counted: Vec<bool>,
    /// Cost of each pod's eviction in the rank ([`IDLE_POD_COST`], [`extra_cost`]).
    pub(super) pod_cost: Vec<f64>,
}

/// Prepares what every planner starts from ([`Prepared`]).
pub(super) fn prepare<'a>(
    cluster: &'a Cluster,
    policy: &'a Policy,
    now: Option<DateTime<Utc>>,
    history: &History,
    activity: &Activity,
) -> Prepared<'a> {
    let pod_cost = pod_costs(cluster, activity);
    let shapes = frag::target_shapes(cluster, policy);
    let cap = Capacity::of(cluster);
    let counted: Vec<bool> = cluster
        .nodes
        .iter()
        .map(|n| frag::counted(n, &policy.scope))
        .collect();
    let before = frag::totals(cluster, &cap, &policy.scope, &shapes);

    // PDB per pod and remaining allowances.
    let pdb_left: Vec<i64> = cluster
        .pdbs
        .iter()
        .map(|b| b.disruptions_allowed.max(0))
        .collect();
    let m = movable_pods(cluster, policy, now, history, &pdb_left);
    let (class_gpus, size_class) = size_classes(cluster, &counted);
    let nodes_n = cluster.nodes.len();
    let mut st = State {
        c: cluster,
        p: policy,
        shapes: shapes.clone(),
        node_free: vec![u64::MAX; nodes_n],
        cap,
        counted: counted.clone(),
        no_target: cluster
            .nodes
            .iter()
            .map(|n| !warm(n, policy, now))
            .collect(),
        no_target_gpu: BTreeSet::new(),
        received: vec![false; nodes_n],
        moved: vec![false; cluster.pods.len()],
        index: vec![BTreeSet::new(); class_gpus.len()],
        size_class,
        class_gpus,
        max_free: vec![0; nodes_n],
        whole_free: vec![0; nodes_n],
        frag_cache: vec![0.0; nodes_n],
        sums: Totals::default(),
        per_node: per_node_history(cluster, history),
        per_ns: history
            .per_namespace
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect(),
        pdb_left,
        pod_pdb: m.pod_pdb,
        total: history.evicted.len() as u32,
        pending: Vec::new(),
        occ: sched::Occupancy::of(cluster),
    };
    init_state(&mut st, &counted, before);

    Prepared {
        st,
        ok: m.ok,
        skipped: m.skipped,
        skipped_pods: m.skipped_pods,
        shapes,
        before,
        counted,
        pod_cost,
    }
}

/// Cost of each pod's eviction in the rank: [`IDLE_POD_COST`] for an idle pod, else 1,
/// plus its soft opt-outs ([`extra_cost`]).
fn pod_costs(cluster: &Cluster, activity: &Activity) -> Vec<f64> {
    let idle = activity.idle_flags(cluster);
    let extra: Vec<f64> = cluster.pods.iter().map(extra_cost).collect();
    idle.iter()
        .zip(&extra)
        .map(|(i, e)| if *i { IDLE_POD_COST } else { 1.0 } + e)
        .collect()
}

/// Which bound GPU pods may move, the PDB of each, and the others with their skip codes.
struct Movable {
    ok: Vec<bool>,
    pod_pdb: Vec<Option<usize>>,
    skipped: BTreeMap<String, u64>,
    skipped_pods: Vec<SkippedPod>,
}

/// Every rule of movability, the PDB rules (`pdb_left`: each PDB's allowance) and the
/// workload rules, per bound GPU pod.
fn movable_pods(
    cluster: &Cluster,
    policy: &Policy,
    now: Option<DateTime<Utc>>,
    history: &History,
    pdb_left: &[i64],
) -> Movable {
    let mut pod_pdb = vec![None; cluster.pods.len()];
    let mut skipped: BTreeMap<String, u64> = BTreeMap::new();
    let mut skipped_pods = Vec::new();
    let workloads = Workloads::of(cluster);
    let pdb_index = PdbIndex::of(&cluster.pdbs);
    let mut ok = vec![false; cluster.pods.len()];
    for (i, p) in cluster.pods.iter().enumerate() {
        if !(p.is_active_bound() && p.node.is_some() && (p.held_milli() > 0 || p.is_unknown())) {
            continue;
        }
        let r = movable_but_pdbs(p, cluster, policy, now, history).and_then(|()| {
            let covering = pdb_index.covering(&cluster.pdbs, p);
            pdb_rules(cluster, &covering)?;
            let b = covering.first().copied();
            pod_pdb[i] = b;
            match b {
                Some(b) if pdb_left[b] <= 0 => Err(Skip::PdbExhausted),
                _ => workload_allows(workloads.live(p), policy, b.is_some()),
            }
        });
        match r {
            Ok(()) => ok[i] = true,
            Err(s) => {
                *skipped.entry(s.code().to_string()).or_default() += 1;
                skipped_pods.push(SkippedPod {
                    pod: p.key(),
                    code: s.code(),
                });
            }
        }
    }
    Movable {
        ok,
        pod_pdb,
        skipped,
        skipped_pods,
    }
}

/// Evictions of the run so far per node (by index).
fn per_node_history(cluster: &Cluster, history: &History) -> Vec<u32> {
    let mut per_node = vec![0u32; cluster.nodes.len()];
    for (name, v) in &history.per_node {
        if let Some(i) = cluster.node_index(name) {
            per_node[i] = *v;
        }
    }
    per_node
}

/// Node sizes (GPU counts) of counted nodes, each with its own target index, and the
/// index of every node's size.
fn size_classes(cluster: &Cluster, counted: &[bool]) -> (Vec<usize>, Vec<usize>) {
    let mut class_gpus: Vec<usize> = cluster
        .nodes
        .iter()
        .zip(counted)
        .filter(|(_, c)| **c)
        .map(|(n, _)| n.gpus.len())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    if class_gpus.is_empty() {
        class_gpus.push(0);
    }
    let size_class: Vec<usize> = cluster
        .nodes
        .iter()
        .map(|n| class_gpus.binary_search(&n.gpus.len()).unwrap_or(0))
        .collect();
    (class_gpus, size_class)
}

/// Fills the per-node caches and the target index, starts the running totals from the
/// exact ones (`before`), and lists the pending pods the plan serves.
fn init_state(st: &mut State, counted: &[bool], before: Totals) {
    let cluster = st.c;
    for (n, &is_counted) in counted.iter().enumerate() {
        st.set_free(n);
        if is_counted {
            st.index[st.size_class[n]].insert((st.node_free[n], n));
        }
        st.refresh(n);
    }
    // The running totals start from the exact ones: the refreshes above only move them by
    // differences, so without this every batch but the last (recomputed below) would
    // report zero idle capacity and a zero fragment rate.
    st.sums = before;
    if st.p.from_pending {
        // A pod the scheduler has nominated a node for is being served there already.
        st.pending = frag::unplaceable_pending(cluster, &st.cap, &st.p.scope);
        st.pending
            .retain(|&pi| cluster.pods[pi].nominated.is_none());
    }
}
