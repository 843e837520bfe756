//! Which pods may move: every rule of [`movable`], the workload rules from live state,
//! the PDB index, and the soft opt-outs that only raise a move's cost.

use std::collections::HashMap;

use chrono::{DateTime, Utc};

use super::{History, Skip};
use crate::model::*;
use crate::policy::{Policy, parse_duration};

/// A workload's live state: pods Ready, and pods unavailable (not Ready, Pending or
/// terminating), over every non-terminal pod of it in the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Live {
    /// Running, Ready, not terminating.
    pub ready: u32,
    /// The others.
    pub unavailable: u32,
}

/// Live state of every workload of one cluster, by (namespace, kind, name).
#[derive(Debug, Clone, Default)]
pub struct Workloads<'a> {
    live: HashMap<(&'a str, &'a str, &'a str), Live>,
}

impl<'a> Workloads<'a> {
    /// Counts the live state of every workload of `cluster`.
    pub fn of(cluster: &'a Cluster) -> Self {
        let mut live: HashMap<(&str, &str, &str), Live> = HashMap::new();
        for p in cluster.pods.iter().filter(|p| !p.phase.is_terminal()) {
            let Some(w) = &p.workload else { continue };
            let e = live
                .entry((p.namespace.as_str(), w.kind.as_str(), w.name.as_str()))
                .or_default();
            if p.phase == Phase::Running && p.ready && !p.deleting {
                e.ready += 1;
            } else {
                e.unavailable += 1;
            }
        }
        Workloads { live }
    }

    /// The live state of `pod`'s workload.
    pub fn live(&self, pod: &Pod) -> Live {
        pod.workload
            .as_ref()
            .and_then(|w| {
                self.live
                    .get(&(pod.namespace.as_str(), w.kind.as_str(), w.name.as_str()))
                    .copied()
            })
            .unwrap_or_default()
    }
}

/// How much more a move of `pod` costs, in evictions, for the soft opt-outs its owner
/// wrote: the descheduler's `prefer-no-eviction`, Koordinator's `eviction-cost` and the
/// ReplicaSet `pod-deletion-cost` (positive values: the pod is moved last). The cost
/// only ranks; it never makes a pod movable that is not.
pub fn extra_cost(pod: &Pod) -> f64 {
    let mut extra = 0.0;
    if pod
        .annotations
        .contains_key(gpu_defrag_api::DESCHEDULER_PREFER_NO_EVICTION)
    {
        extra += PREFER_NO_EVICTION_COST;
    }
    for key in [
        crate::ingest::KOORD_EVICTION_COST,
        crate::ingest::POD_DELETION_COST,
    ] {
        if let Some(v) = pod
            .annotations
            .get(key)
            .and_then(|v| v.trim().parse::<i64>().ok())
            && v > 0
        {
            // 1 more eviction per decade of cost, at most 3 (both scales are int32).
            extra += ((v as f64).log10() + 1.0).min(3.0) / 3.0 * PREFER_NO_EVICTION_COST;
        }
    }
    extra
}

/// What the descheduler's `prefer-no-eviction` adds to a move's cost, in evictions.
pub const PREFER_NO_EVICTION_COST: f64 = 3.0;

/// [`movable`] but its PDB rules ([`pdb_rules`]).
pub(super) fn movable_but_pdbs(
    pod: &Pod,
    cluster: &Cluster,
    policy: &Policy,
    now: Option<DateTime<Utc>>,
    history: &History,
) -> Result<(), Skip> {
    state_rules(pod, cluster, policy)?;
    owner_rules(pod, policy)?;
    namespace_storage_and_claim_rules(pod, cluster, policy)?;
    scheduling_rules(pod, policy)?;
    opt_out_rules(pod, policy, now)?;
    if history.evicted.contains(&pod.key()) {
        return Err(Skip::AlreadyMoved);
    }
    Ok(())
}

/// The pod's scope, allocation, node and state: in scope, its allocation known, its
/// node drainable, running, Ready, not terminating, not a mirror pod, not a KAI
/// reservation.
fn state_rules(pod: &Pod, cluster: &Cluster, policy: &Policy) -> Result<(), Skip> {
    if !policy.scope.covers_pod(pod) {
        return Err(Skip::OutOfScope);
    }
    if pod.is_unknown() {
        return Err(Skip::UnknownAllocation);
    }
    if let Some(n) = pod.node.map(|i| &cluster.nodes[i])
        && (n.unknown_pods > 0 || n.inconsistent.is_some())
    {
        return Err(Skip::NodeUndrainable);
    }
    if pod.deleting {
        return Err(Skip::Terminating);
    }
    if pod.phase != Phase::Running {
        return Err(Skip::NotRunning);
    }
    if !pod.ready {
        return Err(Skip::NotReady);
    }
    if pod.mirror
        || pod
            .annotations
            .get("kubernetes.io/config.source")
            .is_some_and(|s| s != "api")
    {
        return Err(Skip::MirrorPod);
    }
    if pod.namespace == crate::ingest::KAI_RESERVATION_NS {
        return Err(Skip::KaiReservation);
    }
    Ok(())
}

/// The pod's owner: a known controller of a kind that recreates it (Job kinds when the
/// policy evicts Job pods), and no gang.
fn owner_rules(pod: &Pod, policy: &Policy) -> Result<(), Skip> {
    let Some(w) = &pod.workload else {
        return Err(Skip::NoController);
    };
    if let Chain::Broken(_) = w.chain {
        return Err(Skip::OwnerUnknown);
    }
    match w.kind.as_str() {
        "Node" => return Err(Skip::NoController),
        "apps/DaemonSet" => return Err(Skip::DaemonSet),
        k if crate::workload::MOVABLE_KINDS.contains(&k) => {}
        k if crate::workload::JOB_KINDS.contains(&k) => {
            if !policy.evict_job_pods {
                return Err(Skip::JobPod);
            }
        }
        k if policy.movable_owner_kinds.iter().any(|m| m == k) => {}
        _ => return Err(Skip::CustomController),
    }
    match &pod.gang {
        Some(Gang::Member(_)) => return Err(Skip::Gang),
        Some(Gang::Unknown(_)) => return Err(Skip::GangUnknown),
        None => {}
    }
    Ok(())
}

/// The pod's namespace opt-out, volumes (as the policy allows), readable constraints
/// and resource claims.
fn namespace_storage_and_claim_rules(
    pod: &Pod,
    cluster: &Cluster,
    policy: &Policy,
) -> Result<(), Skip> {
    if cluster.protected_namespaces.contains(&pod.namespace) {
        return Err(Skip::NamespaceOptOut);
    }
    if pod.local_storage && !policy.evict_local_storage {
        return Err(Skip::LocalStorage);
    }
    if pod.pvc && !policy.evict_pvc_pods {
        return Err(Skip::Pvc);
    }
    if pod.ephemeral_volume && !policy.evict_ephemeral_volume_pods {
        return Err(Skip::EphemeralVolume);
    }
    if pod.constraints().unreadable.is_some() {
        return Err(Skip::NoTarget);
    }
    match &pod.claim_source {
        ClaimSource::Movable => {}
        ClaimSource::Shared(_) => return Err(Skip::SharedClaim),
        ClaimSource::Named(_) => return Err(Skip::NamedClaim),
        ClaimSource::Unsure(_) => return Err(Skip::ResourceClaim),
        ClaimSource::None if pod.resource_claims => return Err(Skip::ResourceClaim),
        ClaimSource::None => {}
    }
    Ok(())
}

/// The pod's scheduler (a bin-packing one) and priority (not protected, not above the
/// policy's maximum).
fn scheduling_rules(pod: &Pod, policy: &Policy) -> Result<(), Skip> {
    if !policy
        .binpack_schedulers
        .iter()
        .any(|s| *s == pod.scheduler)
    {
        return Err(Skip::SchedulerNotBinpacking);
    }
    if let Some(pc) = &pod.priority_class
        && policy.protected_classes.contains(pc)
    {
        return Err(Skip::ProtectedClass);
    }
    if policy.max_priority.is_some_and(|m| pod.priority > m) {
        return Err(Skip::Priority);
    }
    Ok(())
}

/// The opt-out annotations (do-not-disrupt, safe-to-evict, the highest eviction cost,
/// Karpenter's do-not-disrupt while younger than its duration) and `minPodAge`.
fn opt_out_rules(pod: &Pod, policy: &Policy, now: Option<DateTime<Utc>>) -> Result<(), Skip> {
    let age = match (now, pod.started) {
        (Some(now), Some(c)) => Some((now - c).to_std().unwrap_or_default()),
        _ => None,
    };
    if pod
        .annotations
        .get(gpu_defrag_api::DO_NOT_DISRUPT)
        .is_some_and(|v| crate::workload::opts_out(v))
        || pod
            .annotations
            .get(crate::ingest::SAFE_TO_EVICT)
            .is_some_and(|v| v.trim() == "false")
        || pod
            .annotations
            .get(crate::ingest::KOORD_EVICTION_COST)
            .is_some_and(|v| v.trim() == i32::MAX.to_string())
    {
        return Err(Skip::OptOut);
    }
    if let Some(v) = pod
        .annotations
        .get(gpu_defrag_api::KARPENTER_DO_NOT_DISRUPT)
    {
        let v = v.trim();
        if v != "false" {
            // "true", or a duration: protected while younger than it. Anything else, or
            // an unknown age: protected (never evict on a guess).
            let protected = match parse_duration(v) {
                Ok(d) => age.is_none_or(|a| a < d),
                Err(_) => true,
            };
            if protected {
                return Err(Skip::OptOut);
            }
        }
    }
    if !policy.min_pod_age.is_zero() && age.is_none_or(|a| a < policy.min_pod_age) && now.is_some()
    {
        return Err(Skip::TooYoung);
    }
    Ok(())
}

/// The PDB rules of [`movable`], given the indices of the PDBs covering the pod (in
/// order; two are enough): more than one, or a stale one, and it stays.
pub(super) fn pdb_rules(cluster: &Cluster, covering: &[usize]) -> Result<(), Skip> {
    if covering.len() > 1 {
        return Err(Skip::MultiplePdbs);
    }
    if covering.first().is_some_and(|&b| cluster.pdbs[b].stale) {
        return Err(Skip::PdbStale);
    }
    Ok(())
}

/// The PDBs that may cover a pod, found without a scan of every PDB: by namespace, then
/// by one `matchLabels` pair of the selector (a pod it covers carries that label); PDBs
/// whose selector has no `matchLabels` are checked for every pod of their namespace.
/// [`PdbIndex::covering`] gives exactly the PDBs a scan would, in the same order.
pub struct PdbIndex<'a> {
    by_ns: HashMap<&'a str, NsPdbs<'a>>,
}

#[derive(Default)]
struct NsPdbs<'a> {
    by_label: HashMap<(&'a str, &'a str), Vec<usize>>,
    other: Vec<usize>,
}

impl<'a> PdbIndex<'a> {
    /// The index of `pdbs`.
    pub fn of(pdbs: &'a [Pdb]) -> Self {
        let mut by_ns: HashMap<&str, NsPdbs> = HashMap::new();
        for (i, b) in pdbs.iter().enumerate() {
            // A null selector covers nothing.
            let Some(sel) = &b.selector else { continue };
            let ns = by_ns.entry(b.namespace.as_str()).or_default();
            match sel.match_labels.iter().next() {
                Some((k, v)) => ns
                    .by_label
                    .entry((k.as_str(), v.as_str()))
                    .or_default()
                    .push(i),
                None => ns.other.push(i),
            }
        }
        PdbIndex { by_ns }
    }

    /// Indices of the PDBs covering `pod`, in order.
    pub fn covering(&self, pdbs: &[Pdb], pod: &Pod) -> Vec<usize> {
        let Some(ns) = self.by_ns.get(pod.namespace.as_str()) else {
            return Vec::new();
        };
        let mut out: Vec<usize> = ns.other.clone();
        if !ns.by_label.is_empty() {
            for (k, v) in pod.labels.iter() {
                if let Some(v) = ns.by_label.get(&(k.as_str(), v.as_str())) {
                    out.extend_from_slice(v);
                }
            }
        }
        out.retain(|&i| pdbs[i].covers(pod));
        out.sort_unstable();
        out
    }
}

/// Whether a pod may be moved at all (independent of the plan), or why not. The
/// workload rules that need the whole cluster's live state (`workload-unavailable`,
/// `last-ready-replica`) are [`workload_allows`].
pub fn movable(
    pod: &Pod,
    cluster: &Cluster,
    policy: &Policy,
    now: Option<DateTime<Utc>>,
    history: &History,
) -> Result<(), Skip> {
    movable_but_pdbs(pod, cluster, policy, now, history)?;
    let covering: Vec<usize> = (0..cluster.pdbs.len())
        .filter(|&i| cluster.pdbs[i].covers(pod))
        .take(2)
        .collect();
    pdb_rules(cluster, &covering)
}

/// The workload rules, from live state: a workload with `maxUnavailablePerWorkload`
/// replicas already unavailable loses no other; the last Ready replica moves only when
/// a PDB covering it allows a disruption (`pdb_allows`) or the policy says
/// `evictSingleReplicas`.
pub fn workload_allows(live: Live, policy: &Policy, pdb_allows: bool) -> Result<(), Skip> {
    if live.unavailable >= policy.max_unavailable_per_workload {
        return Err(Skip::WorkloadUnavailable);
    }
    if live.ready <= 1 && !pdb_allows && !policy.evict_single_replicas {
        return Err(Skip::LastReadyReplica);
    }
    Ok(())
}

#[cfg(test)]
mod pdb_index_tests {
    use std::collections::BTreeMap;

    use super::*;

    /// The index gives exactly the PDBs a scan of every PDB gives, in the same order.
    #[test]
    fn the_pdb_index_agrees_with_the_scan() {
        let sel = |labels: &[(&str, &str)], exprs: &[(&str, &str, &[&str])]| LabelSelector {
            match_labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            match_expressions: exprs
                .iter()
                .map(|(k, op, vs)| {
                    (
                        k.to_string(),
                        op.to_string(),
                        vs.iter().map(|v| v.to_string()).collect(),
                    )
                })
                .collect(),
        };
        let pdb = |ns: &str, s: Option<LabelSelector>| Pdb {
            namespace: ns.into(),
            name: format!("b-{ns}"),
            selector: s,
            disruptions_allowed: 1,
            stale: false,
        };
        let pdbs = vec![
            pdb("a", Some(sel(&[("app", "x")], &[]))),
            pdb("a", Some(sel(&[("app", "x"), ("tier", "1")], &[]))),
            pdb("a", Some(sel(&[], &[("app", "In", &["x", "y"])]))),
            pdb("a", Some(sel(&[], &[]))),
            pdb("a", None),
            pdb("b", Some(sel(&[("app", "x")], &[]))),
            pdb(
                "b",
                Some(sel(&[("tier", "1")], &[("app", "NotIn", &["y"])])),
            ),
            pdb("a", Some(sel(&[("app", "y")], &[]))),
        ];
        let idx = PdbIndex::of(&pdbs);
        for ns in ["a", "b", "c"] {
            for app in [None, Some("x"), Some("y"), Some("z")] {
                for tier in [None, Some("1"), Some("2")] {
                    let mut labels = BTreeMap::new();
                    if let Some(a) = app {
                        labels.insert("app".to_string(), a.to_string());
                    }
                    if let Some(t) = tier {
                        labels.insert("tier".to_string(), t.to_string());
                    }
                    let pod = Pod {
                        namespace: ns.into(),
                        labels: labels.into(),
                        ..Default::default()
                    };
                    let scan: Vec<usize> =
                        (0..pdbs.len()).filter(|&i| pdbs[i].covers(&pod)).collect();
                    assert_eq!(idx.covering(&pdbs, &pod), scan, "{ns} {app:?} {tier:?}");
                }
            }
        }
    }
}
