//! The migration planner: which pods to evict so the bin-packing scheduler gives back
//! the most usable GPU capacity for the target shapes, per eviction.
//!
//! Units are drained all or nothing: a whole node, one GPU (device-granularity
//! schemes), or the smallest group of whole-GPU pods whose departure lets a target shape
//! fit on a node (node granularity). A unit is chosen only when every pod on it is
//! movable and finds a place — by the same rules the scheduler uses (selectors,
//! affinity, taints, cpu, memory, GPU model; MostAllocated node, best-fit device) — on a
//! unit that is not being drained. Units are picked greedily by fragment drop per
//! eviction, with lazy re-evaluation, under every hard limit of the policy.
//! Deterministic: ties are broken by node, GPU and pod order.
use std::collections::BinaryHeap;

use chrono::{DateTime, Utc};

use crate::frag;
use crate::model::*;
use crate::policy::Policy;
use crate::sched;

mod after;
mod batches;
pub mod demand;
mod movability;
mod prepared;
mod readiness;
mod skip;
mod state;
mod types;
mod unit;

pub use after::apply;
pub use movability::{
    Live, PREFER_NO_EVICTION_COST, PdbIndex, Workloads, extra_cost, movable, workload_allows,
};
pub use readiness::{settling, warm};
pub use skip::Skip;
pub use types::{
    Batch, DraDevice, FencedDevice, History, Move, Plan, SettlingNode, SkippedPod, UnitKind,
};

use batches::{batch_of, fenced_devices_of, fenced_nodes_of, move_of};
use prepared::{Prepared, prepare};
use readiness::settling_nodes;
use unit::{Unit, unit_priority, units};

#[derive(PartialEq)]
struct Cand {
    score: f64,
    id: usize,
}
impl Eq for Cand {}
impl PartialOrd for Cand {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Cand {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        // Max-heap on score; lower id first on ties (deterministic).
        self.score.total_cmp(&o.score).then(o.id.cmp(&self.id))
    }
}

/// Plans a run. `now` measures pod ages (None: ages unknown — then `minPodAge > 0`
/// protects every pod only when a clock is given; snapshots without a clock skip it).
pub fn plan(
    cluster: &Cluster,
    policy: &Policy,
    now: Option<DateTime<Utc>>,
    history: &History,
) -> Plan {
    plan_with_activity(cluster, policy, now, history, &Activity::default())
}

/// What one eviction of a long-idle pod ([`Activity::is_idle`]) costs in the rank, in
/// evictions: its GPUs did no work over the lookback window, so moving it disturbs
/// little. Limits and budgets still count it as one eviction.
pub const IDLE_POD_COST: f64 = 0.5;

/// [`plan`], with the GPU activity of pods: units of long-idle pods rank as cheaper
/// (each such pod costs [`IDLE_POD_COST`] of an eviction in the drop per eviction).
pub fn plan_with_activity(
    cluster: &Cluster,
    policy: &Policy,
    now: Option<DateTime<Utc>>,
    history: &History,
    activity: &Activity,
) -> Plan {
    let Prepared {
        mut st,
        ok,
        skipped,
        skipped_pods,
        shapes,
        before,
        counted,
        pod_cost,
    } = prepare(cluster, policy, now, history, activity);
    let cost = |u: &Unit| -> f64 { u.pods.iter().map(|&pi| pod_cost[pi]).sum() };
    let all_units = units(cluster, &shapes, &ok, &counted, &st.cap.free);
    let mut heap = BinaryHeap::new();
    for (id, u) in all_units.iter().enumerate() {
        if let Some((gain, _)) = st.eval(u) {
            heap.push(Cand {
                score: gain / cost(u),
                id,
            });
        }
    }
    let mut moves = Vec::new();
    let mut batches = Vec::new();
    let mut pending_served = Vec::new();
    while let Some(top) = heap.pop() {
        if st.total >= policy.max_evictions_per_run {
            break;
        }
        let u = &all_units[top.id];
        let Some((gain, placed)) = st.eval(u) else {
            continue;
        };
        let score = gain / cost(u);
        if let Some(next) = heap.peek()
            && score + 1e-9 < next.score
        {
            heap.push(Cand { score, id: top.id });
            continue;
        }
        let frag_before = st.totals().fragment_milli;
        st.commit(u, &placed);
        let after_batch = st.totals();
        let mut newly_served = Vec::new();
        if policy.from_pending {
            let prio = unit_priority(cluster, u);
            if let Some(pos) = st.pending.iter().position(|&pi| {
                cluster.pods[pi].priority >= prio
                    && sched::fit(cluster, &st.occ, pi, u.node, st.cap.at(u.node)).fits()
            }) {
                newly_served.push(st.pending.remove(pos));
            }
        }
        let batch = batches.len();
        for (pi, n, devs) in &placed {
            let from = &cluster.nodes[u.node];
            let reason = match u.kind {
                UnitKind::Node => format!("empty node {}", from.name),
                UnitKind::Gpu => format!(
                    "empty GPU {} on {}",
                    u.gpu.map(|g| from.gpus[g].key.as_str()).unwrap_or("?"),
                    from.name
                ),
                UnitKind::Group => format!("free whole GPUs on {}", from.name),
            };
            moves.push(move_of(cluster, u.node, (*pi, *n, devs), batch, reason));
        }
        for pi in newly_served {
            pending_served.push(cluster.pods[pi].key());
        }
        batches.push(batch_of(
            cluster,
            u,
            placed.len(),
            frag_before - after_batch.fragment_milli,
            after_batch,
        ));
    }
    // The last batch's figures, recomputed exactly (the running sums drift by rounding).
    if let Some(last) = batches.last_mut() {
        last.after = frag::totals(cluster, &st.cap, &policy.scope, &shapes);
    }
    let after = batches.last().map(|b| b.after).unwrap_or(before);
    let fenced_nodes = fenced_nodes_of(&batches);
    let fenced_devices = fenced_devices_of(&batches);
    Plan {
        before,
        after,
        moves,
        batches,
        skipped,
        skipped_pods,
        shapes,
        fenced_nodes,
        fenced_devices,
        pending_served,
        unchecked: cluster.unchecked.clone(),
        settling_nodes: settling_nodes(cluster, &counted, policy, now),
    }
}
