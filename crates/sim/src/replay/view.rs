//! What a planner sees: the cluster model of the simulated state, and the policy
//! gpu-defrag runs with.

use std::collections::BTreeMap;

use chrono::{DateTime, TimeDelta, Utc};
use gpu_defrag_core::model::*;
use gpu_defrag_core::policy::Policy;

use super::sim::Sim;
use super::{NONE, Params};
use crate::scenario;
use crate::trace::Trace;

#[cfg(doc)]
use super::demand;

pub(super) struct Ctx<'a> {
    pub(super) trace: &'a Trace,
    pub(super) base_nodes: &'a [Node],
    pub(super) params: &'a Params,
    pub(super) base: DateTime<Utc>,
}

/// The cluster model of the state: running pods bound, queued pods pending. Returns it
/// with the sim pod index of every model pod.
pub(super) fn to_cluster(sim: &Sim, ctx: &Ctx) -> (Cluster, Vec<usize>) {
    to_cluster_on(sim, ctx, None)
}

/// [`to_cluster`] for a demand search serving queued pod `served` on one of the nodes
/// `on` ([`demand`]): every node's capacity (read from the nodes, not summed from the
/// pods), the running pods of those nodes only, and of the queued pods the served one
/// and the service replicas (their workload's availability).
pub(super) fn to_cluster_on(
    sim: &Sim,
    ctx: &Ctx,
    on: Option<(&[bool], usize)>,
) -> (Cluster, Vec<usize>) {
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
