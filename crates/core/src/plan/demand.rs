//! Demand runs: make room now for a pending GPU pod, or a whole gang, that fits no node.
//!
//! The plan is the cheapest set of evictions (fewest, then the lowest move cost) that
//! frees a node's room for the pending pod **and** re-places every evicted pod elsewhere
//! in the modelled state, under every rule of the nightly planner (what may move, PDB
//! allowances, the per-node and per-namespace limits), evicting no pod of higher
//! priority than the one served. A gang is served whole (each member on its own node)
//! or not at all. A search that exceeds its step budget plans nothing.

use std::collections::BTreeMap;

use chrono::{DateTime, Duration, Utc};
use serde::Serialize;

use super::batches::{batch_of, fenced_nodes_of, move_of};
use super::prepared::{Prepared, prepare};
use super::readiness::settling_nodes;
use super::state::{Placement, State};
use super::unit::Unit;
use super::{History, Plan, UnitKind};
use crate::frag::{self, Capacity};
use crate::model::*;
use crate::policy::Policy;
use crate::sched;

/// Limits of one demand run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DemandLimits {
    /// Most evictions the run may plan (`demand.maxEvictions`, lowered to what the hourly
    /// allowance has left).
    pub max_evictions: u32,
    /// Most search steps (fit checks); past it the search plans nothing.
    pub max_steps: u64,
}

/// `demand.maxEvictions` by default.
pub const DEFAULT_DEMAND_EVICTIONS: u32 = 16;

/// Most waiting groups one look (a reconcile) searches rooms for, oldest first; the first
/// one planned runs.
pub const GROUPS_PER_LOOK: usize = 3;

/// Largest gang a demand run serves (its run record lists every member).
pub const MAX_GANG: usize = 16;

impl Default for DemandLimits {
    fn default() -> Self {
        DemandLimits {
            max_evictions: DEFAULT_DEMAND_EVICTIONS,
            max_steps: 200_000,
        }
    }
}

/// What the search found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum DemandOutcome {
    /// A room for every served pod, with every evicted pod re-placed.
    Planned,
    /// No room can be made within the rules and limits.
    NoRoom,
    /// The search did not finish within its step budget: nothing planned.
    BudgetSpent,
}

impl DemandOutcome {
    /// The name users read in the status.
    pub fn as_str(self) -> &'static str {
        match self {
            DemandOutcome::Planned => "Planned",
            DemandOutcome::NoRoom => "NoRoom",
            DemandOutcome::BudgetSpent => "BudgetSpent",
        }
    }
}

/// The room made for one served pod.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Room {
    /// The served pod's index in the cluster.
    #[serde(skip)]
    pub pod: usize,
    /// `namespace/name` of the served pod.
    pub pod_key: String,
    /// The node's index.
    #[serde(skip)]
    pub node: usize,
    /// The node it will run on.
    pub node_name: String,
    /// Device indices it takes there (the scheme's best fit after the evictions).
    pub devices: Vec<usize>,
    /// Evictions that make this room.
    pub evictions: u32,
}

/// A demand plan: the moves (in the [`Plan`] form every run executes) and the rooms.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DemandPlan {
    /// What the search found.
    pub outcome: DemandOutcome,
    /// The moves; empty unless [`DemandOutcome::Planned`]. `pending_served` names the
    /// served pods, `fenced_nodes` the rooms that drain.
    pub plan: Plan,
    /// One room per served pod (empty unless planned).
    pub rooms: Vec<Room>,
    /// Why, in words (what was made, or what stood in the way).
    pub why: String,
    /// Search steps taken.
    pub steps: u64,
}

/// Why candidate nodes were turned down, counted for the message.
#[derive(Default)]
struct Rejections {
    /// Nodes in scope of too few GPUs, another scheme, or not warm yet.
    unfit: u32,
    /// The pod cannot run there even with every pod it may evict gone (size, scheme,
    /// selectors, taints, pods it may not evict).
    no_fit: u32,
    /// A room needs more evictions than the limits leave.
    limits: u32,
    /// Some evicted pod would fit nowhere else.
    no_replace: u32,
}

/// Plans a demand run for `served` (pending pods; a gang's members, served all or none).
pub fn plan_demand(
    cluster: &Cluster,
    policy: &Policy,
    now: Option<DateTime<Utc>>,
    history: &History,
    served: &[usize],
    limits: &DemandLimits,
) -> DemandPlan {
    let Prepared {
        mut st,
        ok,
        skipped,
        skipped_pods,
        shapes,
        before,
        counted,
        pod_cost,
    } = prepare(cluster, policy, now, history, &Activity::default());
    let mut search = Search {
        steps: 0,
        max_steps: limits.max_steps,
        ok: &ok,
        pod_cost: &pod_cost,
        on_node: pods_by_node(cluster),
        why: Rejections::default(),
        avoid: Vec::new(),
    };
    let found = search.run(&mut st, served, limits.max_evictions);
    let steps = search.steps;
    let mut plan = Plan {
        before,
        after: before,
        moves: Vec::new(),
        batches: Vec::new(),
        skipped,
        skipped_pods,
        shapes,
        fenced_nodes: Vec::new(),
        fenced_devices: Vec::new(),
        pending_served: Vec::new(),
        unchecked: cluster.unchecked.clone(),
        settling_nodes: settling_nodes(cluster, &counted, policy, now),
    };
    let rooms = match found {
        Err((outcome, why)) => {
            return DemandPlan {
                outcome,
                plan,
                rooms: Vec::new(),
                why,
                steps,
            };
        }
        Ok(rooms) => rooms,
    };
    let mut out = Vec::new();
    for (room, placed, gain) in rooms {
        let served_key = cluster.pods[room.pod].key();
        let node = &cluster.nodes[room.node];
        if !placed.is_empty() {
            let batch = plan.batches.len();
            for (pi, n, devs) in &placed {
                let reason = format!("make room for {served_key} on {}", node.name);
                plan.moves
                    .push(move_of(cluster, room.node, (*pi, *n, devs), batch, reason));
            }
            let victims: Vec<usize> = placed.iter().map(|(pi, _, _)| *pi).collect();
            let all_gpu_pods = search.on_node[room.node]
                .iter()
                .all(|pi| victims.contains(pi) || cluster.pods[*pi].held_milli() == 0);
            let unit = Unit {
                kind: if all_gpu_pods {
                    UnitKind::Node
                } else {
                    UnitKind::Group
                },
                node: room.node,
                gpu: None,
                pods: victims,
            };
            plan.batches
                .push(batch_of(cluster, &unit, placed.len(), gain, st.totals()));
        }
        plan.pending_served.push(served_key.clone());
        out.push(Room {
            pod: room.pod,
            pod_key: served_key,
            node: room.node,
            node_name: node.name.clone(),
            devices: room.devices,
            evictions: placed.len() as u32,
        });
    }
    if let Some(last) = plan.batches.last_mut() {
        last.after = frag::totals(cluster, &st.cap, &policy.scope, &plan.shapes);
    }
    plan.after = plan.batches.last().map(|b| b.after).unwrap_or(before);
    plan.fenced_nodes = fenced_nodes_of(&plan.batches);
    let why = out
        .iter()
        .map(|r| match r.evictions {
            0 => format!("{} fits on {} as it is", r.pod_key, r.node_name),
            k => format!(
                "making room on {} for {}: {k} eviction{}",
                r.node_name,
                r.pod_key,
                if k == 1 { "" } else { "s" }
            ),
        })
        .collect::<Vec<_>>()
        .join("; ");
    DemandPlan {
        outcome: DemandOutcome::Planned,
        plan,
        rooms: out,
        why,
        steps,
    }
}

/// The room chosen for one served pod, before it becomes a [`Room`].
struct Chosen {
    pod: usize,
    node: usize,
    devices: Vec<usize>,
}

struct Search<'s> {
    steps: u64,
    max_steps: u64,
    ok: &'s [bool],
    pod_cost: &'s [f64],
    /// Active bound pods per node.
    on_node: Vec<Vec<usize>>,
    why: Rejections,
    /// Nodes no evicted pod may land on: the rooms reserved for a gang's later members.
    avoid: Vec<usize>,
}

type Found = Vec<(Chosen, Vec<Placement>, f64)>;

/// A candidate room: (evictions, cost, node, victims).
type Candidate = (usize, f64, usize, Vec<usize>);

/// A verified room: the served pod's devices and the victims' placements.
type Verified = (Vec<usize>, Vec<Placement>);

/// Why a search ends without a plan.
type Stop = (DemandOutcome, String);

fn pods_by_node(c: &Cluster) -> Vec<Vec<usize>> {
    let mut on_node = vec![Vec::new(); c.nodes.len()];
    for (i, p) in c.pods.iter().enumerate() {
        if let (true, Some(n)) = (p.is_active_bound(), p.node) {
            on_node[n].push(i);
        }
    }
    on_node
}

/// GPUs a pod asks for, in milli, for the largest-first order.
fn asked(p: &Pod) -> u64 {
    p.shape
        .map(|s| u64::from(s.gpus) * u64::from(s.milli))
        .unwrap_or(0)
}

impl Search<'_> {
    fn step(&mut self, n: u64) -> Result<(), Stop> {
        self.steps += n;
        if self.steps > self.max_steps {
            return Err((
                DemandOutcome::BudgetSpent,
                format!(
                    "the search did not finish within {} steps: nothing planned",
                    self.max_steps
                ),
            ));
        }
        Ok(())
    }

    fn run(&mut self, st: &mut State, served: &[usize], max_evictions: u32) -> Result<Found, Stop> {
        let c = st.c;
        let no_room = |why: String| Err((DemandOutcome::NoRoom, why));
        if served.is_empty() {
            return no_room("no pod to serve".into());
        }
        for &pi in served {
            let Some(p) = c.pods.get(pi) else {
                return no_room(format!("pod index {pi} is not in the snapshot"));
            };
            if !(p.is_pending() && p.shape.is_some_and(|s| s.gpus > 0) && st.p.scope.covers_pod(p))
            {
                return no_room(format!(
                    "{} is not a pending pod asking for whole GPUs or GPU shares (MIG partitions are \
                     not served) in the policy's scope",
                    p.key()
                ));
            }
        }
        let mut order: Vec<usize> = served.to_vec();
        order.sort_by_key(|&pi| (std::cmp::Reverse(asked(&c.pods[pi])), pi));
        order.dedup();
        let start_total = st.total;
        let mut found: Found = Vec::new();
        // A gang: each member's cheapest room, distinct, decided up front; while a member's
        // room is made, its evicted pods may not land on the rooms of the members after
        // it (else the first room's pods fill the second's). Without such a room, the
        // member's search runs again with no reservation.
        let reserved: Vec<Option<usize>> = if order.len() > 1 {
            let mut taken: Vec<usize> = Vec::new();
            let mut out = Vec::new();
            for &pi in &order {
                let cands = self.candidates(st, pi)?;
                let pick = cands.iter().map(|c| c.2).find(|n| !taken.contains(n));
                taken.extend(pick);
                out.push(pick);
            }
            out
        } else {
            vec![None]
        };
        for (k, &pi) in order.iter().enumerate() {
            let left = max_evictions.saturating_sub(st.total - start_total);
            self.avoid = reserved[k + 1..].iter().flatten().copied().collect();
            let mut best = self.best_room(st, pi, left)?;
            if best.is_none() && !self.avoid.is_empty() {
                self.avoid.clear();
                best = self.best_room(st, pi, left)?;
            }
            self.avoid.clear();
            let Some((node, victims, (devices, placed))) = best else {
                let p = &c.pods[pi];
                let r = &self.why;
                let gang = if order.len() > 1 {
                    format!(" (gang of {}: served whole or not at all)", order.len())
                } else {
                    String::new()
                };
                return no_room(format!(
                    "no room for {} ({} GPU{} of {} milli, priority {}){gang}: {} node(s) in \
                     scope too small, of another scheme, new or already taken; on {} it \
                     cannot run even with every pod it may evict gone, {} need more evictions \
                     than the limits leave ({left} left), on {} the evicted pods would fit \
                     nowhere else",
                    p.key(),
                    p.shape.map(|s| s.gpus).unwrap_or(0),
                    if p.shape.is_some_and(|s| s.gpus == 1) {
                        ""
                    } else {
                        "s"
                    },
                    p.shape.map(|s| s.milli).unwrap_or(0),
                    p.priority,
                    r.unfit,
                    r.no_fit,
                    r.limits,
                    r.no_replace
                ));
            };
            let gain_before = st.totals().fragment_milli;
            if !victims.is_empty() {
                let unit = Unit {
                    kind: UnitKind::Group,
                    node,
                    gpu: None,
                    pods: victims,
                };
                st.commit(&unit, &placed);
            }
            st.no_target[node] = true;
            st.put(pi, node, &devices, true);
            st.refresh(node);
            let gain = gain_before - st.totals().fragment_milli;
            found.push((
                Chosen {
                    pod: pi,
                    node,
                    devices,
                },
                placed,
                gain,
            ));
        }
        Ok(found)
    }

    /// The cheapest room for pod `pi` that verifies: (node, victims, its placements).
    fn best_room(
        &mut self,
        st: &mut State,
        pi: usize,
        left: u32,
    ) -> Result<Option<(usize, Vec<usize>, Verified)>, Stop> {
        self.why = Rejections::default();
        let cands = self.candidates(st, pi)?;
        for (_, _, n, v) in cands {
            if !self.within_limits(st, n, &v, left) {
                self.why.limits += 1;
                continue;
            }
            if let Some(verified) = self.verify(st, pi, n, &v)? {
                return Ok(Some((n, v, verified)));
            }
            self.why.no_replace += 1;
        }
        Ok(None)
    }

    /// Candidate rooms for pod `pi`, cheapest first: (evictions, cost, node, victims),
    /// not verified yet.
    fn candidates(&mut self, st: &mut State, pi: usize) -> Result<Vec<Candidate>, Stop> {
        let c = st.c;
        let p = &c.pods[pi];
        let Some(shape) = p.shape else {
            return Ok(Vec::new());
        };
        let mut cands: Vec<(usize, f64, usize, Vec<usize>)> = Vec::new();
        for n in 0..c.nodes.len() {
            let node = &c.nodes[n];
            if !st.counted[n]
                || st.no_target[n]
                || node.gpus.len() < shape.gpus as usize
                || node.scheme != p.scheme.unwrap_or(node.scheme)
                || (node.granularity == Granularity::Node && shape.milli < GPU_MILLI)
            {
                self.why.unfit += u32::from(st.counted[n]);
                continue;
            }
            self.step(1)?;
            match self.victims(st, pi, n) {
                Some(v) => {
                    let cost: f64 = v.iter().map(|&x| self.pod_cost[x]).sum();
                    cands.push((v.len(), cost, n, v));
                }
                None => self.why.no_fit += 1,
            }
        }
        cands.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)).then(a.2.cmp(&b.2)));
        Ok(cands)
    }

    /// Pods on node `n` pod `pi` may have evicted for it: movable by the policy, not
    /// moved yet, of priority at most its own, holding GPUs.
    fn eligible(&self, st: &State, pi: usize, n: usize) -> Vec<usize> {
        let c = st.c;
        let prio = c.pods[pi].priority;
        let mut v: Vec<usize> = self.on_node[n]
            .iter()
            .copied()
            .filter(|&x| {
                self.ok[x]
                    && !st.moved[x]
                    && c.pods[x].priority <= prio
                    && c.pods[x].held_milli() > 0
            })
            .collect();
        // Largest first, then cheapest, then pod order.
        v.sort_by(|&a, &b| {
            c.pods[b]
                .held_milli()
                .cmp(&c.pods[a].held_milli())
                .then(self.pod_cost[a].total_cmp(&self.pod_cost[b]))
                .then(a.cmp(&b))
        });
        v
    }

    /// The smallest victim set found on node `n` that lets pod `pi` fit there (the state
    /// is left as it was), or None when even every eligible pod gone is not enough.
    fn victims(&mut self, st: &mut State, pi: usize, n: usize) -> Option<Vec<usize>> {
        let c = st.c;
        let p = &c.pods[pi];
        let shape = p.shape?;
        let node = &c.nodes[n];
        let eligible = self.eligible(st, pi, n);
        let fits = |st: &State| sched::fit(c, &st.occ, pi, n, st.cap.at(n)).fits();
        if fits(st) {
            return Some(Vec::new());
        }
        // Device granularity: per GPU, the fewest (then cheapest) pods whose eviction
        // leaves it free enough; the pod's GPU count of the cheapest such GPUs first.
        let mut chosen: Vec<usize> = Vec::new();
        if node.granularity == Granularity::Device {
            let mut per_gpu: Vec<(usize, f64, usize, Vec<usize>)> = Vec::new();
            for (g, gpu) in node.gpus.iter().enumerate() {
                if !gpu.healthy {
                    continue;
                }
                let mut free = u64::from(st.cap.free[n][g]);
                let mut set = Vec::new();
                let mut cost = 0.0;
                let mut blocked = false;
                // Pods on this GPU, largest share first.
                let mut on: Vec<(u64, usize)> = self.on_node[n]
                    .iter()
                    .filter(|&&x| !st.moved[x])
                    .filter_map(|&x| match &c.pods[x].gpu {
                        GpuUse::Devices(d) => d
                            .iter()
                            .find(|(i, _)| *i == g)
                            .map(|(_, m)| (u64::from(*m), x)),
                        _ => None,
                    })
                    .collect();
                on.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
                for (m, x) in on {
                    if free >= u64::from(shape.milli) {
                        break;
                    }
                    if !eligible.contains(&x) {
                        blocked = true;
                        break;
                    }
                    free += m;
                    cost += self.pod_cost[x];
                    set.push(x);
                }
                if !blocked && free >= u64::from(shape.milli) {
                    per_gpu.push((set.len(), cost, g, set));
                }
            }
            if per_gpu.len() < shape.gpus as usize {
                return None;
            }
            per_gpu.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)).then(a.2.cmp(&b.2)));
            for (_, _, _, set) in per_gpu.into_iter().take(shape.gpus as usize) {
                for x in set {
                    if !chosen.contains(&x) {
                        chosen.push(x);
                    }
                }
            }
        }
        for &x in &chosen {
            st.take(x, false);
        }
        // Top up, largest first, until the pod fits (whole GPUs at node granularity, or
        // CPU, memory and pod slots anywhere).
        let mut ok = fits(st);
        for &x in &eligible {
            if ok {
                break;
            }
            if chosen.contains(&x) {
                continue;
            }
            st.take(x, false);
            chosen.push(x);
            ok = fits(st);
        }
        for &x in chosen.iter().rev() {
            st.untake(x, false);
        }
        if !ok {
            return None;
        }
        // Drop any pod the room does not need after all (a later, larger pod may have
        // made an earlier one unnecessary).
        let mut k = 0;
        while k < chosen.len() {
            let x = chosen[k];
            for &y in &chosen {
                if y != x {
                    st.take(y, false);
                }
            }
            let still = fits(st);
            for &y in chosen.iter().rev() {
                if y != x {
                    st.untake(y, false);
                }
            }
            if still {
                chosen.remove(k);
            } else {
                k += 1;
            }
        }
        Some(chosen)
    }

    fn within_limits(&self, st: &State, n: usize, victims: &[usize], left: u32) -> bool {
        let k = victims.len() as u32;
        if k > left || st.per_node[n] + k > st.p.max_evictions_per_node {
            return false;
        }
        let mut ns: BTreeMap<&str, u32> = BTreeMap::new();
        let mut pdb: BTreeMap<usize, i64> = BTreeMap::new();
        for &x in victims {
            let p = &st.c.pods[x];
            let here = ns.entry(p.namespace.as_str()).or_default();
            *here += 1;
            if st.per_ns.get(&p.namespace).copied().unwrap_or(0) + *here
                > st.p.max_evictions_per_namespace
            {
                return false;
            }
            if let Some(b) = st.pod_pdb[x] {
                let here = pdb.entry(b).or_default();
                *here += 1;
                if *here > st.pdb_left[b] {
                    return false;
                }
            }
        }
        true
    }

    /// Whether the room verifies on the current state: with the victims gone pod `pi`
    /// fits on `n`, and every victim has a target elsewhere (largest first). Returns the
    /// pod's devices and the victims' placements; the state is left as it was.
    fn verify(
        &mut self,
        st: &mut State,
        pi: usize,
        n: usize,
        victims: &[usize],
    ) -> Result<Option<Verified>, Stop> {
        self.step(1 + victims.len() as u64)?;
        let c = st.c;
        for &x in victims {
            st.take(x, false);
        }
        let was = std::mem::replace(&mut st.no_target[n], true);
        let avoided: Vec<(usize, bool)> = self
            .avoid
            .iter()
            .filter(|&&a| a != n)
            .map(|&a| (a, std::mem::replace(&mut st.no_target[a], true)))
            .collect();
        let devs = sched::fit(c, &st.occ, pi, n, st.cap.at(n)).devices();
        let mut placed: Vec<Placement> = Vec::new();
        let mut ok = devs.is_some();
        if let Some(d) = &devs {
            st.put(pi, n, d, false);
            let mut order = victims.to_vec();
            order.sort_by_key(|&x| (std::cmp::Reverse(asked(&c.pods[x])), x));
            let unit = Unit {
                kind: UnitKind::Group,
                node: n,
                gpu: None,
                pods: order.clone(),
            };
            for &x in &order {
                match st.target(x, n, &unit) {
                    Some((t, td)) => {
                        st.put(x, t, &td, true);
                        placed.push((x, t, td));
                    }
                    None => {
                        ok = false;
                        break;
                    }
                }
            }
            for (x, t, td) in placed.iter().rev() {
                st.unput(*x, *t, td, true);
            }
            st.unput(pi, n, d, false);
        }
        for (a, w) in avoided.into_iter().rev() {
            st.no_target[a] = w;
        }
        st.no_target[n] = was;
        for &x in victims.iter().rev() {
            st.untake(x, false);
        }
        Ok(match (ok, devs) {
            (true, Some(d)) => Some((d, placed)),
            _ => None,
        })
    }
}

/// Why the operator would not start a demand run for a pending pod now: the served-pod
/// checks of [`waiting`], one by one, so that `plan --for` says what the operator would do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotServed {
    /// Not pending (bound, finished or being deleted).
    NotPending,
    /// It asks for no GPU (or only MIG partitions, which demand runs do not serve).
    NoGpu,
    /// The policy's namespaces or pod selector leave it out.
    OutOfScope,
    /// Placed by a scheduler not in `safety.binpackSchedulers`.
    Scheduler(String),
    /// The scheduler has not marked it unschedulable (no `PodScheduled=False` with reason
    /// `Unschedulable`: not tried yet, or held by a scheduling gate).
    NotUnschedulable,
    /// Unschedulable for less than `demand.minWait`: (waited, minWait).
    TooSoon(Duration, Duration),
    /// The scheduler has nominated a node for it (it is preempting there), or landing
    /// control has: room is being made already.
    Nominated(String),
    /// It fits a node as the cluster is (in the policy's scope or not): the scheduler will
    /// place it without any eviction.
    FitsAsItIs,
    /// It names a pod group that cannot be read: it may need more pods than are pending.
    GangUnknown(String),
    /// It mounts a PersistentVolumeClaim (or a generic ephemeral volume) whose volume may
    /// bind it to a zone gpu-defrag does not read, and the policy does not vouch for the
    /// volumes (`safety.evictPvcPods` / `safety.evictEphemeralVolumePods`).
    Volumes,
}

impl NotServed {
    /// Stable code.
    pub fn code(&self) -> &'static str {
        match self {
            NotServed::NotPending => "not-pending",
            NotServed::NoGpu => "no-gpu",
            NotServed::OutOfScope => "out-of-scope",
            NotServed::Scheduler(_) => "scheduler-not-binpacking",
            NotServed::NotUnschedulable => "not-unschedulable",
            NotServed::TooSoon(..) => "min-wait",
            NotServed::Nominated(_) => "nominated",
            NotServed::FitsAsItIs => "fits-as-it-is",
            NotServed::GangUnknown(_) => "gang-unknown",
            NotServed::Volumes => "volume-topology-unknown",
        }
    }
}

fn minutes(d: Duration) -> String {
    let s = d.num_seconds().max(0);
    if s < 120 {
        format!("{s}s")
    } else {
        format!("{}m", s / 60)
    }
}

impl std::fmt::Display for NotServed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotServed::NotPending => f.write_str("it is not pending"),
            NotServed::NoGpu => {
                f.write_str("it asks for no whole GPU or GPU share (MIG partitions are not served)")
            }
            NotServed::OutOfScope => {
                f.write_str("the policy's namespaces or pod selector leave it out")
            }
            NotServed::Scheduler(s) => write!(
                f,
                "its scheduler {s:?} is not one of safety.binpackSchedulers"
            ),
            NotServed::NotUnschedulable => f.write_str(
                "the scheduler has not marked it Unschedulable (not tried yet, or held by a \
                 scheduling gate)",
            ),
            NotServed::TooSoon(w, m) => write!(
                f,
                "unschedulable for {}, under demand.minWait {}",
                minutes(*w),
                minutes(*m)
            ),
            NotServed::Nominated(n) => write!(
                f,
                "nominated for node {n} (the scheduler is preempting there, or its room is \
                 held)"
            ),
            NotServed::FitsAsItIs => {
                f.write_str("it fits a node as the cluster is: the scheduler places it")
            }
            NotServed::GangUnknown(g) => write!(f, "its pod group cannot be read: {g}"),
            NotServed::Volumes => f.write_str(
                "it mounts a volume whose zone is not read (a PersistentVolumeClaim or a \
                 generic ephemeral volume): the room might be where the volume cannot go; \
                 safety.evictPvcPods / evictEphemeralVolumePods vouch for the volumes",
            ),
        }
    }
}

/// The checks of pod `pi` that need no fit: pending, GPUs, scope, scheduler, unschedulable
/// long enough, not nominated, a readable gang.
fn not_served_before_fit(
    cluster: &Cluster,
    policy: &Policy,
    now: DateTime<Utc>,
    min_wait: Duration,
    pi: usize,
) -> Option<NotServed> {
    let p = &cluster.pods[pi];
    if !p.is_pending() {
        return Some(NotServed::NotPending);
    }
    if p.shape.is_none_or(|s| s.gpus == 0) {
        return Some(NotServed::NoGpu);
    }
    // The pod selector too: a pending pod the policy does not cover starts nothing.
    if !policy.scope.covers_pod(p) {
        return Some(NotServed::OutOfScope);
    }
    if !policy.binpack_schedulers.iter().any(|s| *s == p.scheduler) {
        return Some(NotServed::Scheduler(p.scheduler.to_string()));
    }
    let Some(since) = p.unschedulable_since else {
        return Some(NotServed::NotUnschedulable);
    };
    if now - since < min_wait {
        return Some(NotServed::TooSoon(now - since, min_wait));
    }
    if let Some(n) = &p.nominated {
        return Some(NotServed::Nominated(n.clone()));
    }
    if let Some(Gang::Unknown(g)) = &p.gang {
        return Some(NotServed::GangUnknown(g.clone()));
    }
    if (p.pvc && !policy.evict_pvc_pods)
        || (p.ephemeral_volume && !policy.evict_ephemeral_volume_pods)
    {
        return Some(NotServed::Volumes);
    }
    None
}

/// Whether the operator would serve pending pod `pi` with a demand run now, by the same
/// checks as [`waiting`]: `Ok` with the group served (the pod, or its gang's pending
/// members), or why not.
pub fn served(
    cluster: &Cluster,
    policy: &Policy,
    now: DateTime<Utc>,
    min_wait: Duration,
    pi: usize,
) -> Result<Vec<usize>, NotServed> {
    if pi >= cluster.pods.len() {
        return Err(NotServed::NotPending);
    }
    if let Some(why) = not_served_before_fit(cluster, policy, now, min_wait, pi) {
        return Err(why);
    }
    let groups = waiting(cluster, policy, now, min_wait);
    groups
        .into_iter()
        .find(|g| g.contains(&pi))
        .ok_or(NotServed::FitsAsItIs)
}

/// Pending GPU pods a demand run may serve now, grouped (a gang's pending members in one
/// group), oldest wait first: in the policy's scope (namespaces and pod selector), placed
/// by one of its bin-packing schedulers, unschedulable for at least `min_wait`, not
/// nominated to a node, and fitting no node of the cluster (in scope or not) as it is. A
/// pod whose gang cannot be read is not served (it may need more pods).
pub fn waiting(
    cluster: &Cluster,
    policy: &Policy,
    now: DateTime<Utc>,
    min_wait: Duration,
) -> Vec<Vec<usize>> {
    let cap = Capacity::of(cluster);
    let unplaceable = frag::unplaceable_pending(cluster, &cap, &policy.scope);
    let binpack = |p: &Pod| policy.binpack_schedulers.iter().any(|s| *s == p.scheduler);
    // (gang key or pod key) → (oldest wait, members)
    let mut groups: BTreeMap<(String, String), (DateTime<Utc>, Vec<usize>)> = BTreeMap::new();
    for &pi in &unplaceable {
        let p = &cluster.pods[pi];
        if not_served_before_fit(cluster, policy, now, min_wait, pi).is_some() {
            continue;
        }
        let since = p.unschedulable_since.unwrap_or(now);
        match &p.gang {
            Some(Gang::Unknown(_)) => continue,
            Some(Gang::Member(g)) => {
                let e = groups
                    .entry((p.namespace.clone(), g.clone()))
                    .or_insert((since, Vec::new()));
                e.0 = e.0.min(since);
            }
            None => {
                groups.insert(
                    (p.namespace.clone(), format!("pod {}", p.name)),
                    (since, vec![pi]),
                );
            }
        }
    }
    // A gang's group holds every pending GPU member in scope, placeable or not.
    for (pi, p) in cluster.pods.iter().enumerate() {
        if let Some(Gang::Member(g)) = &p.gang
            && p.is_pending()
            && p.shape.is_some_and(|s| s.gpus > 0)
            && binpack(p)
            && policy.scope.covers_pod(p)
            && let Some(e) = groups.get_mut(&(p.namespace.clone(), g.clone()))
        {
            e.1.push(pi);
        }
    }
    let mut out: Vec<(DateTime<Utc>, Vec<usize>)> = groups
        .into_values()
        .filter(|(_, m)| !m.is_empty())
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)));
    out.into_iter().map(|(_, m)| m).collect()
}
