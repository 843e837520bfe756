//! The executor's last look before each eviction: is the planned move still safe now?
//!
//! A plan is computed at the start of a run; evictions follow over minutes. Before each
//! one, the pod is judged again on a fresh model of the cluster: still the same pod (UID)
//! on the same node, still movable by every rule of the planner (opt-outs added during
//! the run, readiness, its PodDisruptionBudget, its workload's live availability), and
//! still room for it: on its planned target, or on another node it may go to. Anything
//! else: the eviction is not sent.

use chrono::{DateTime, Utc};

use crate::frag;
use crate::model::Cluster;
use crate::plan::{History, Skip, Workloads, movable, workload_allows};
use crate::policy::Policy;
use crate::sched;

/// A planned eviction as the executor is about to send it.
#[derive(Debug, Clone, Copy)]
pub struct Planned<'a> {
    /// `namespace/name` of the pod.
    pub pod: &'a str,
    /// Its UID when the plan was made.
    pub uid: &'a str,
    /// The node it ran on.
    pub from: &'a str,
    /// The node the plan expects it to land on.
    pub to: &'a str,
}

/// Why a planned eviction is no longer sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The pod is gone, or a new pod has its name (another UID).
    Gone,
    /// The pod runs on another node than planned.
    Moved,
    /// The pod is no longer movable (the planner's skip code).
    Unmovable(Skip),
    /// No node has room for it now: not its planned target, nor any other it may go to
    /// (not cordoned, no taint it does not tolerate — the run's own fences included).
    NoRoom,
}

impl Refusal {
    /// The stable code: `gone`, `moved`, `no-room`, or the skip code.
    pub fn code(self) -> &'static str {
        match self {
            Refusal::Gone => "gone",
            Refusal::Moved => "moved",
            Refusal::Unmovable(s) => s.code(),
            Refusal::NoRoom => "no-room",
        }
    }
}

/// Whether `planned` may be evicted now, judged on `cluster` (a fresh model) with the
/// run's `history` (what it evicted so far).
pub fn recheck(
    cluster: &Cluster,
    planned: Planned,
    policy: &Policy,
    now: DateTime<Utc>,
    history: &History,
) -> Result<(), Refusal> {
    let pi = cluster
        .pods
        .iter()
        .position(|p| p.key() == planned.pod && !p.phase.is_terminal())
        .ok_or(Refusal::Gone)?;
    let pod = &cluster.pods[pi];
    if pod.uid != planned.uid {
        return Err(Refusal::Gone);
    }
    if pod.node_name.as_deref() != Some(planned.from) {
        return Err(Refusal::Moved);
    }
    movable(pod, cluster, policy, Some(now), history).map_err(Refusal::Unmovable)?;
    let pdb = cluster.pdbs.iter().find(|b| {
        b.namespace == pod.namespace && b.selector.as_ref().is_some_and(|s| s.matches(&pod.labels))
    });
    if pdb.is_some_and(|b| b.disruptions_allowed <= 0) {
        return Err(Refusal::Unmovable(Skip::PdbExhausted));
    }
    workload_allows(Workloads::of(cluster).live(pod), policy, pdb.is_some())
        .map_err(Refusal::Unmovable)?;
    // Its planned target first; the scheduler breaks ties between equally full nodes at
    // random, so a replacement that landed elsewhere than planned may have taken that room
    // while another node still has it.
    // Judged with the pod gone from its node, as its replacement would be placed.
    let mut occ = sched::Occupancy::of(cluster);
    occ.leave(cluster, pi);
    let inc = sched::Incoming::new(cluster, &occ, pi);
    let fits = |i: usize| {
        let n = &cluster.nodes[i];
        let gpus = frag::free_of(n);
        inc.fit(i, sched::Free::of_node(n, &gpus)).fits()
    };
    let target = cluster.node_index(planned.to);
    // Its own node counts only when the plan moves it there (a GPU drain).
    let may_go = |i: &usize| cluster.nodes[*i].name != planned.from || planned.to == planned.from;
    if target.is_some_and(fits) || (0..cluster.nodes.len()).filter(may_go).any(fits) {
        Ok(())
    } else {
        Err(Refusal::NoRoom)
    }
}
