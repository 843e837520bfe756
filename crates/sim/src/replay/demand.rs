//! Polled rows of the replay: gpu-defrag's demand runs (`gpu-defrag-demand`) and a
//! KAI-style consolidation baseline (`kai-consolidation`), both through the core's
//! demand planner ([`plan_demand`]).
//!
//! - `gpu-defrag-demand`: the nightly `gpu-defrag` row, plus at every poll
//!   (`POLL_SECONDS`, 30 s) while no nightly run is in progress: the oldest pending GPU pods
//!   that have waited at least `demand.minWait` and fit no node, oldest first, up to
//!   [`GROUPS_PER_LOOK`] of them, are offered to the planner one at a time with the nightly
//!   policy (default limits: 8 per node, minPodAge 10 m, one unavailable replica per
//!   workload) and at most `demand.maxEvictions`, lowered to what
//!   `demand.maxEvictionsPerHour` leaves ([`DemandPolicy::allowance`]; the operator's own
//!   defaults and rule, from the core); the first `Planned` one
//!   runs: its pods are evicted (instant in the replay) and the served pod is bound on
//!   its room at once, before the queue is served (the hold: no other pod takes the room
//!   first); then the queue, the evicted pods among it, is served by the bin-packing
//!   placer.
//! - `gpu-defrag-demand-only`: the same demand runs with no nightly run (a policy in
//!   `Enforce` with no window and `demand.outsideWindows: true`).
//! - `kai-consolidation`: no windows; at every poll, the pending GPU pods that fit no
//!   node (no minimum wait: KAI consolidates in every scheduling cycle), oldest first, up
//!   to [`KAI_PER_POLL`] of them, each through the same planner with a loosened policy:
//!   no PDBs (the replay has none), no per-node, per-namespace, per-workload or per-run
//!   limit, `minPodAge` 0, no hourly cap, at most [`KAI_MAX_EVICTIONS`] evictions of pods of
//!   lower or equal priority (all pods of the replay have priority 0) that all re-fit
//!   elsewhere. The pods are evicted and the queue is served in its order: no hold, the
//!   room goes to whichever queued pod the scheduler gives it.
use std::collections::{BTreeMap, HashMap, VecDeque};

use chrono::TimeDelta;
use gpu_defrag_core::plan::History;
use gpu_defrag_core::plan::demand::{DemandLimits, DemandOutcome, GROUPS_PER_LOOK, plan_demand};
use gpu_defrag_core::policy::{DemandPolicy, Policy};
use serde::Serialize;

use super::{Ctx, GPU_MILLI, NONE, Sim, gpu_defrag_policy, to_cluster_on};

/// KAI's consolidation limit: evictions per consolidation.
pub const KAI_MAX_EVICTIONS: u32 = 16;
/// Pods KAI consolidation tries per poll (oldest first).
pub const KAI_PER_POLL: usize = 4;
/// After a search found no room for a pod, pods of the same GPU shape (GPUs, milli per
/// GPU, models) are not offered again for this long, seconds: a bound on the replay's
/// CPU time (an overloaded queue would otherwise cost a search per pod and poll).
pub const RETRY_SECONDS: f64 = 120.0;

type ShapeKey = (u32, u32, u64);

/// What the polled planner did.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Stats {
    /// Planner calls by outcome (`Planned`, `NoRoom`, `BudgetSpent`), and polls skipped
    /// on the hourly cap (`hourlyCap`).
    pub outcomes: BTreeMap<String, usize>,
    /// Runs that evicted (a planned room with at least one eviction).
    pub runs: usize,
    /// Evictions of these runs.
    pub evictions: usize,
    /// Served pods bound on their room right after the evictions (gpu-defrag: the
    /// hold; KAI: the scheduler happened to give it the room).
    pub served_on_room: usize,
    /// Served pods that did not get the room at once.
    pub served_elsewhere: usize,
    /// Evicted pods that landed on the node the plan named.
    pub landed_as_planned: usize,
    /// Evicted pods placed on another node.
    pub landed_elsewhere: usize,
    /// Evicted pods still queued right after the run.
    pub landed_queued: usize,
    /// Times of the demand evictions of the last hour.
    #[serde(skip)]
    pub log: VecDeque<f64>,
    /// Shapes not offered again before these times ([`RETRY_SECONDS`]).
    #[serde(skip)]
    pub retry: HashMap<ShapeKey, f64>,
}

fn key_of(sim: &Sim, pi: usize) -> ShapeKey {
    let tp = &sim.tpl[sim.pods[pi].tpl as usize];
    (tp.gpus, tp.milli, tp.models)
}

/// Whether `planner` is polled.
pub fn polled(planner: &str) -> bool {
    matches!(
        planner,
        "gpu-defrag-demand" | "gpu-defrag-demand-only" | "kai-consolidation"
    )
}

/// A limit no run reaches (not `u32::MAX`: limits are added to counts).
const UNLIMITED: u32 = 1_000_000;

/// The policy of KAI-style consolidation (see the module doc).
fn kai_policy() -> Policy {
    Policy {
        max_evictions_per_run: UNLIMITED,
        max_evictions_per_node: UNLIMITED,
        max_evictions_per_namespace: UNLIMITED,
        max_unavailable_per_workload: UNLIMITED,
        min_pod_age: std::time::Duration::ZERO,
        evict_single_replicas: true,
        evict_job_pods: true,
        max_pending_gpu_pods: UNLIMITED,
        ..Policy::default()
    }
}

/// Queued pods that fit no node, oldest first, waited at least `min_wait`.
fn candidates(sim: &Sim, t: f64, min_wait: f64, max: usize) -> Vec<usize> {
    let mut out = Vec::new();
    for pi in sim.queued_pods() {
        if out.len() >= max {
            break;
        }
        if t - sim.pods[pi].queued_at >= min_wait
            && sim
                .demand
                .retry
                .get(&key_of(sim, pi))
                .is_none_or(|&r| r <= t)
            && sim.target(pi).is_none()
        {
            out.push(pi);
        }
    }
    out
}

/// Running pods per node: (its devices, its milli per device, cpu, memory).
struct Occupancy {
    on: Vec<Vec<(u8, u32, u64, u64)>>,
}

fn occupancy(sim: &Sim) -> Occupancy {
    let mut on = vec![Vec::new(); sim.nodes.len()];
    for p in &sim.pods {
        if p.node != NONE {
            let tp = &sim.tpl[p.tpl as usize];
            on[p.node as usize].push((p.devs, tp.milli, tp.cpu, tp.mem));
        }
    }
    Occupancy { on }
}

/// The fewest of `amounts` (largest first) that add `need` to `free`.
fn fewest(free: u64, need: u64, mut amounts: Vec<u64>) -> usize {
    if free >= need {
        return 0;
    }
    amounts.sort_unstable_by(|a, b| b.cmp(a));
    let mut f = free;
    for (k, a) in amounts.iter().enumerate() {
        f += a;
        if f >= need {
            return k + 1;
        }
    }
    usize::MAX
}

/// A lower bound of the evictions node `n` needs to hold pod `tp` (the planner's own
/// search decides): for whole GPUs, the pods on the least occupied GPU of the best
/// `gpus` (every pod of the node when it takes all its GPUs); for a share, the fewest
/// pods of one GPU that leave it room; for CPU and memory, the fewest pods of the node
/// that free enough.
fn evictions_needed(sim: &Sim, occ: &Occupancy, tp: &super::Tpl, n: usize) -> usize {
    let node = &sim.nodes[n];
    let pods = &occ.on[n];
    let cpu = fewest(node.cpu_free, tp.cpu, pods.iter().map(|p| p.2).collect());
    let mem = fewest(node.mem_free, tp.mem, pods.iter().map(|p| p.3).collect());
    gpu_evictions(node, pods, tp).max(cpu).max(mem)
}

fn gpu_evictions(node: &super::NodeS, pods: &[(u8, u32, u64, u64)], tp: &super::Tpl) -> usize {
    let g = tp.gpus as usize;
    if tp.milli >= GPU_MILLI {
        if g >= node.gpus {
            return pods.len();
        }
        let mut per: Vec<usize> = (0..node.gpus)
            .map(|i| pods.iter().filter(|p| p.0 & (1 << i) != 0).count())
            .collect();
        per.sort_unstable();
        return per[g.max(1) - 1];
    }
    let mut best = usize::MAX;
    for i in 0..node.gpus {
        let free = node.free[i];
        let on: Vec<u64> = pods
            .iter()
            .filter(|p| p.0 & (1 << i) != 0)
            .map(|p| u64::from(p.1))
            .collect();
        best = best.min(fewest(u64::from(free), u64::from(tp.milli), on));
    }
    best
}

/// The nodes that may hold the room of pod `pi`: of its GPU count and model, and needing
/// at most `k` evictions by the lower bound [`evictions_needed`]. Only their pods are
/// given to the planner (a bound on the replay's CPU time that changes no plan).
fn room_nodes(sim: &Sim, occ: &Occupancy, pi: usize, k: usize) -> Vec<bool> {
    let tp = &sim.tpl[sim.pods[pi].tpl as usize];
    let g = (tp.gpus as usize).max(1);
    let cands: Vec<(usize, usize)> = sim
        .nodes
        .iter()
        .enumerate()
        .filter(|(_, node)| node.gpus >= g && (tp.models == 0 || tp.models & node.model != 0))
        .map(|(n, _)| (evictions_needed(sim, occ, tp, n), n))
        .filter(|&(e, _)| e <= k)
        .collect();
    let mut on = vec![false; sim.nodes.len()];
    for (_, n) in cands {
        on[n] = true;
    }
    on
}

/// One poll of a polled row at time `t`.
pub(super) fn poll(sim: &mut Sim, ctx: &Ctx, planner: &str, t: f64) {
    let kai = planner == "kai-consolidation";
    if !kai && sim.run.is_some() {
        return; // the nightly run is in progress
    }
    let demand = DemandPolicy::default();
    let (min_wait, tries) = if kai {
        (0.0, KAI_PER_POLL)
    } else {
        (demand.min_wait.as_secs_f64(), GROUPS_PER_LOOK)
    };
    let cands = candidates(sim, t, min_wait, tries);
    if cands.is_empty() {
        return;
    }
    let policy = if kai {
        kai_policy()
    } else {
        let running_gpu = sim.pods.iter().filter(|p| p.node != NONE).count();
        let budget = ((ctx.params.budget.max(0.0) * running_gpu as f64).floor() as u32).max(1);
        gpu_defrag_policy(budget, ctx.params.max_pending_gpu_pods)
    };
    let now = ctx.base + TimeDelta::milliseconds((t * 1000.0).round() as i64);
    let mut occ: Option<Occupancy> = None;
    for pi in cands {
        if sim.pods[pi].node != NONE
            || sim.target(pi).is_some()
            || sim
                .demand
                .retry
                .get(&key_of(sim, pi))
                .is_some_and(|&r| r > t)
        {
            continue; // placed or placeable after an earlier consolidation of this poll
        }
        let Some(max) = max_evictions(sim, &demand, kai, t) else {
            return;
        };
        let per_node = if kai {
            max
        } else {
            max.min(policy.max_evictions_per_node)
        };
        let on = room_nodes(
            sim,
            occ.get_or_insert_with(|| occupancy(sim)),
            pi,
            per_node as usize,
        );
        if !on.contains(&true) {
            *sim.demand.outcomes.entry("NoRoom".into()).or_default() += 1;
            sim.demand.retry.insert(key_of(sim, pi), t + RETRY_SECONDS);
            continue;
        }
        let offer = Offer {
            planner,
            policy: &policy,
            now,
            max,
            t,
        };
        let Some((room_node, moves)) = offer.plan(sim, ctx, pi, &on) else {
            continue;
        };
        occ = None; // the state changes
        carry_out(sim, pi, room_node, moves, kai, t);
        if !kai {
            return; // one demand run per poll
        }
    }
}

/// The most evictions the next run may make: KAI's limit, or gpu-defrag's allowance
/// after the demand evictions of the last hour (`None`, counted as `hourlyCap`, when
/// the hour's allowance is spent).
fn max_evictions(sim: &mut Sim, demand: &DemandPolicy, kai: bool, t: f64) -> Option<u32> {
    if kai {
        return Some(KAI_MAX_EVICTIONS);
    }
    while sim.demand.log.front().is_some_and(|&e| e <= t - 3600.0) {
        sim.demand.log.pop_front();
    }
    let spent = u32::try_from(sim.demand.log.len()).unwrap_or(u32::MAX);
    let max = demand.allowance(spent);
    if max.is_none() {
        *sim.demand.outcomes.entry("hourlyCap".into()).or_default() += 1;
    }
    max
}

/// The moves of a planned run: (sim pod, the node the plan names, if any).
type Moves = Vec<(usize, Option<usize>)>;

/// One offer of a pod to the demand planner at time `t`.
struct Offer<'a> {
    planner: &'a str,
    policy: &'a Policy,
    now: chrono::DateTime<chrono::Utc>,
    /// Evictions the run may make.
    max: u32,
    t: f64,
}

impl Offer<'_> {
    /// Plans a room for pod `pi` among the nodes `on` (their pods only); counts the
    /// outcome (a shape without a plan is not offered again for [`RETRY_SECONDS`]).
    /// Returns the room's node and every move (sim pod, planned node) when planned.
    fn plan(&self, sim: &mut Sim, ctx: &Ctx, pi: usize, on: &[bool]) -> Option<(usize, Moves)> {
        let t = self.t;
        let (c, ids) = to_cluster_on(sim, ctx, Some((on, pi)));
        let ci = ids.iter().position(|&x| x == pi)?;
        let limits = DemandLimits {
            max_evictions: self.max,
            ..DemandLimits::default()
        };
        let d = plan_demand(
            &c,
            self.policy,
            Some(self.now),
            &History::default(),
            &[ci],
            &limits,
        );

        let key = match d.outcome {
            DemandOutcome::Planned => "Planned",
            DemandOutcome::NoRoom => "NoRoom",
            DemandOutcome::BudgetSpent => "BudgetSpent",
        };
        *sim.demand.outcomes.entry(key.into()).or_default() += 1;
        if std::env::var_os("REPLAY_DEBUG").is_some() {
            eprintln!(
                "t={:.2}h {} pod {pi} ({} GPUs, waited {:.0}s, {} room nodes): {key}: {}",
                t / 3600.0,
                self.planner,
                sim.tpl[sim.pods[pi].tpl as usize].gpus,
                t - sim.pods[pi].queued_at,
                on.iter().filter(|&&x| x).count(),
                d.why
            );
        }
        if d.outcome != DemandOutcome::Planned {
            sim.demand.retry.insert(key_of(sim, pi), t + RETRY_SECONDS);
            return None;
        }
        let room = d.rooms.first()?;
        let moves = d
            .plan
            .moves
            .iter()
            .map(|m| (ids[m.pod_index], c.node_index(&m.to_node)))
            .collect();
        Some((room.node, moves))
    }
}

/// Carries out a planned run for pod `pi` at time `t`: its evictions, the hold
/// (gpu-defrag: the served pod takes its room before anyone else), the queue served;
/// counts where the served and the evicted pods went.
fn carry_out(sim: &mut Sim, pi: usize, room_node: usize, moves: Moves, kai: bool, t: f64) {
    let victims: Vec<usize> = moves.iter().map(|m| m.0).collect();
    if !victims.is_empty() {
        sim.demand.runs += 1;
    }
    let before = sim.evictions;
    sim.evict(&victims, t);
    let evicted = sim.evictions - before;
    sim.demand.evictions += evicted;
    if !kai {
        for _ in 0..evicted {
            sim.demand.log.push_back(t);
        }
    }
    // The hold (gpu-defrag): the served pod takes its room before anyone else.
    let mut on_room = false;
    if !kai {
        let tp = &sim.tpl[sim.pods[pi].tpl as usize];
        if super::node_ok(&sim.nodes[room_node], tp)
            && let Some(devs) = sim.node_devs(room_node, tp)
        {
            sim.dequeue(pi);
            sim.bind(pi, room_node, devs, t);
            on_room = true;
        }
    }
    sim.serve_all(t);
    if kai {
        on_room = sim.pods[pi].node == room_node as u32;
    }
    if on_room {
        sim.demand.served_on_room += 1;
    } else {
        sim.demand.served_elsewhere += 1;
    }
    for (v, to) in moves {
        match sim.pods[v].node {
            NONE => sim.demand.landed_queued += 1,
            n if Some(n as usize) == to => sim.demand.landed_as_planned += 1,
            _ => sim.demand.landed_elsewhere += 1,
        }
    }
}
