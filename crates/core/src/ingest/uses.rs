//! The passes over all pods once each is resolved: their GPU uses added to their nodes'
//! GPUs (device records, whole GPUs, MIG, confirmed KAI groups, NVIDIA-sharing replicas),
//! with over-commit making the node inconsistent and its pods unknown.
use std::collections::{BTreeMap, BTreeSet};

use crate::model::*;

use super::{KAI_GROUP, KAI_RESERVATION_NS};

/// Adds every known allocation to its node's GPUs; detects over-commit.
pub(super) fn apply_uses(nodes: &mut [Node], pods: &mut [Pod], kai: &[(usize, String, Milli)]) {
    let (sums, whole) = device_sums(nodes, pods);
    let (reservations, kai_groups_per_node) = kai_groups_per_node(nodes.len(), pods, kai);
    for (i, node) in nodes.iter_mut().enumerate() {
        // A DRA node's GPU use is its claims' allocations, over-allocation included, read
        // with the inventory (claims whose pods are gone still hold their devices).
        if node.scheme == Scheme::Dra {
            mark_kai_unknown(pods, &kai_groups_per_node[i], || {
                UnknownReason::DisagreesWithRequest("KAI fraction on a dra node".into())
            });
            continue;
        }
        apply_device_sums(node, i, &sums[i], pods);
        if node.granularity == Granularity::Node && node.scheme != Scheme::NvidiaSharing {
            let plain = whole[i].saturating_sub(reservations[i]);
            place_kai_and_whole(node, &kai_groups_per_node[i], plain, pods);
        } else {
            mark_kai_unknown(pods, &kai_groups_per_node[i], || {
                UnknownReason::DisagreesWithRequest(format!(
                    "KAI fraction on a {} node",
                    node.scheme.as_str()
                ))
            });
        }
    }
    for p in pods.iter() {
        if let (Some(i), GpuUse::Unknown(_)) = (p.node, &p.gpu) {
            nodes[i].unknown_pods += 1;
        }
    }
}

/// Per node, the milli each GPU's device records sum to (before capping: over-commit
/// shows) and the whole GPUs node-level pods hold; MIG uses are added to the node's pools
/// here (a profile the node does not offer marks it inconsistent).
fn device_sums(nodes: &mut [Node], pods: &[Pod]) -> (Vec<Vec<u64>>, Vec<u64>) {
    let mut sums: Vec<Vec<u64>> = nodes.iter().map(|n| vec![0; n.gpus.len()]).collect();
    let mut whole: Vec<u64> = vec![0; nodes.len()];
    for p in pods {
        let Some(i) = p.node else { continue };
        match &p.gpu {
            GpuUse::Devices(d) => {
                for (g, m) in d {
                    if let Some(s) = sums[i].get_mut(*g) {
                        *s += u64::from(*m);
                    }
                }
            }
            GpuUse::Whole(w) => whole[i] += u64::from(*w),
            // A DRA node's MIG pools already count every allocated partition.
            GpuUse::Mig(_) if nodes[i].scheme == Scheme::Dra => {}
            GpuUse::Mig(m) => {
                for (prof, c) in m {
                    if let Some(pool) = nodes[i].mig.iter_mut().find(|p| &p.profile == prof) {
                        pool.used += c;
                    } else {
                        nodes[i].inconsistent = Some(format!(
                            "pod uses MIG profile {prof} the node does not offer"
                        ));
                    }
                }
            }
            _ => {}
        }
    }
    (sums, whole)
}

/// A confirmed KAI group on a node: its fractions' milli sum and its members' pod indices.
type KaiGroup = (u64, Vec<usize>);

/// KAI groups confirmed by a reservation pod, per node as (milli sum, member pod indices),
/// and the number of KAI reservation pods per node. Fractions of an unconfirmed group
/// become unknown.
fn kai_groups_per_node(
    node_count: usize,
    pods: &mut [Pod],
    kai: &[(usize, String, Milli)],
) -> (Vec<u64>, Vec<Vec<KaiGroup>>) {
    // KAI groups: each group holds one reserved GPU; fractions share it.
    let mut groups: BTreeMap<(usize, String), KaiGroup> = BTreeMap::new();
    for (pi, g, m) in kai {
        if let Some(n) = pods[*pi].node {
            let e = groups.entry((n, g.clone())).or_default();
            e.0 += u64::from(*m);
            e.1.push(*pi);
        }
    }

    // KAI reservation pods per node, and their groups (one pass; a per-node scan would be
    // quadratic). Only a reservation pod — in the KAI namespace, holding a whole GPU, on
    // the same node — confirms a group: a fraction annotation and group label on a pod
    // are the tenant's own words.
    let mut reservations: Vec<u64> = vec![0; node_count];
    let mut reserved: BTreeSet<(usize, String)> = BTreeSet::new();
    for p in pods.iter() {
        if let Some(i) = p.node
            && p.namespace == KAI_RESERVATION_NS
            && matches!(p.gpu, GpuUse::Whole(_))
        {
            reservations[i] += 1;
            if let Some(g) = p.labels.get(KAI_GROUP) {
                reserved.insert((i, g.clone()));
            }
        }
    }
    let unconfirmed: Vec<usize> = groups
        .iter()
        .filter(|(k, _)| !reserved.contains(k))
        .flat_map(|(_, (_, members))| members.iter().copied())
        .collect();
    let groups: BTreeMap<(usize, String), KaiGroup> = groups
        .into_iter()
        .filter(|(k, _)| reserved.contains(k))
        .collect();
    for pi in unconfirmed {
        let why = format!(
            "KAI fraction of group {} without its reservation pod in {KAI_RESERVATION_NS} on the node",
            pods[pi]
                .labels
                .get(KAI_GROUP)
                .map(String::as_str)
                .unwrap_or("?")
        );
        pods[pi].gpu = GpuUse::Unknown(UnknownReason::Unconfirmed(why));
    }
    let mut per_node: Vec<Vec<KaiGroup>> = vec![Vec::new(); node_count];
    for ((n, _), v) in groups {
        per_node[n].push(v);
    }
    (reservations, per_node)
}

/// Makes every member of the KAI groups unknown, for the reason `why` gives.
fn mark_kai_unknown(pods: &mut [Pod], groups: &[KaiGroup], why: impl Fn() -> UnknownReason) {
    for (_, members) in groups {
        for pi in members {
            pods[*pi].gpu = GpuUse::Unknown(why());
        }
    }
}

/// Sets the node's (node `i`'s) GPU use from its device sums, capped at a whole GPU;
/// over-committed devices mark the node inconsistent and make every pod on them unknown.
fn apply_device_sums(node: &mut Node, i: usize, sums: &[u64], pods: &mut [Pod]) {
    // Over-committed devices: every pod on them becomes unknown.
    let over: Vec<usize> = sums
        .iter()
        .enumerate()
        .filter(|(_, s)| **s > u64::from(GPU_MILLI))
        .map(|(g, _)| g)
        .collect();
    if !over.is_empty() {
        let keys: Vec<&str> = over.iter().map(|g| node.gpus[*g].key.as_str()).collect();
        let msg = format!(
            "records on node {} over-commit GPU {}",
            node.name,
            keys.join(",")
        );
        node.inconsistent = Some(msg.clone());
        for p in pods.iter_mut().filter(|p| p.node == Some(i)) {
            if let GpuUse::Devices(d) = &p.gpu
                && d.iter().any(|(g, _)| over.contains(g))
            {
                p.gpu = GpuUse::Unknown(UnknownReason::Overcommitted(msg.clone()));
            }
        }
    }
    for (g, s) in sums.iter().enumerate() {
        node.gpus[g].used = (*s).min(u64::from(GPU_MILLI)) as Milli;
    }
}

/// On a node-level node, places the confirmed KAI groups (one GPU each, their fractions
/// pinned to it) and then the `plain` whole GPUs of the other pods, marking the node
/// inconsistent when they do not fit.
fn place_kai_and_whole(node: &mut Node, groups: &[KaiGroup], plain: u64, pods: &mut [Pod]) {
    // KAI reservation pods hold one whole GPU per group; the group's fractions
    // share it. Reserved GPUs come first, then the other whole-GPU pods.
    let total = node.gpus.len() as u64;
    if plain + groups.len() as u64 > total {
        node.inconsistent = Some(format!(
            "pods on node {} hold {} GPUs, node has {total}",
            node.name,
            plain + groups.len() as u64
        ));
    }
    let mut g = 0usize;
    for (sum, members) in groups {
        if *sum > u64::from(GPU_MILLI) {
            node.inconsistent = Some(format!(
                "KAI fractions on one GPU of {} sum to {sum}",
                node.name
            ));
            for pi in members {
                pods[*pi].gpu = GpuUse::Unknown(UnknownReason::Overcommitted(format!(
                    "KAI fractions on one GPU of {} sum to {sum}",
                    node.name
                )));
            }
        }
        if g < node.gpus.len() {
            node.gpus[g].used = (*sum).min(u64::from(GPU_MILLI)) as Milli;
            for pi in members {
                if !pods[*pi].is_unknown() {
                    let m = pods[*pi].shape.map(|s| s.milli).unwrap_or(0);
                    pods[*pi].gpu = GpuUse::Devices(vec![(g, m)]);
                    pods[*pi].scheme = Some(Scheme::Plain);
                }
            }
        }
        g += 1;
    }
    for _ in 0..plain {
        if let Some(gpu) = node.gpus.get_mut(g) {
            gpu.used = GPU_MILLI;
        }
        g += 1;
    }
}

/// Places the replicas NVIDIA-sharing pods hold on their nodes' GPUs. The device plugin
/// records no GPU per replica: the model spreads them as its default (distributed)
/// allocation does, each pod on distinct GPUs, least-used GPU first (ties: lowest
/// index). The spread is balanced, so it shows the fewest fully free GPUs the node's
/// replica count allows: a whole GPU is never shown free where a replica might be. More
/// replicas held than the node has make every replica pod on it unknown.
pub(super) fn apply_replicas(
    nodes: &mut [Node],
    pods: &mut [Pod],
    replicas: &[(usize, u32)],
    per_gpu: &[Option<u32>],
) {
    let mut on_node: Vec<Vec<(usize, u32)>> = vec![Vec::new(); nodes.len()];
    for &(pi, k) in replicas {
        if let Some(n) = pods[pi].node
            && !pods[pi].is_unknown()
        {
            on_node[n].push((pi, k));
        }
    }
    for (i, members) in on_node.iter().enumerate() {
        let (Some(r), false) = (per_gpu[i], members.is_empty()) else {
            continue;
        };
        let node = &mut nodes[i];
        let held: u64 = members.iter().map(|(_, k)| u64::from(*k)).sum();
        let cap = node.gpus.iter().filter(|g| g.healthy).count() as u64 * u64::from(r);
        if held > cap {
            let msg = format!(
                "pods on node {} hold {held} GPU replicas, node has {cap} ({} GPUs × {r})",
                node.name,
                node.gpus.len()
            );
            node.inconsistent = Some(msg.clone());
            for (pi, _) in members {
                pods[*pi].gpu = GpuUse::Unknown(UnknownReason::Overcommitted(msg.clone()));
                node.unknown_pods += 1;
            }
            continue;
        }
        let share = GPU_MILLI / r;
        let len = node.gpus.len();
        let mut count = vec![0u32; len];
        for &(pi, k) in members {
            let mut mine: BTreeMap<usize, Milli> = BTreeMap::new();
            let mut taken = vec![false; len];
            for _ in 0..k {
                let pick = |taken: &[bool]| {
                    (0..len)
                        .filter(|&g| !taken[g] && node.gpus[g].healthy && count[g] < r)
                        .min_by_key(|&g| (count[g], g))
                };
                // More replicas than GPUs with room: the pod's next round.
                let g = match pick(&taken) {
                    Some(g) => g,
                    None => {
                        taken.fill(false);
                        match pick(&taken) {
                            Some(g) => g,
                            None => break,
                        }
                    }
                };
                count[g] += 1;
                taken[g] = true;
                *mine.entry(g).or_default() += share;
            }
            pods[pi].gpu = GpuUse::Devices(mine.into_iter().collect());
        }
        for (g, c) in count.iter().enumerate() {
            node.gpus[g].used = (u64::from(*c) * u64::from(GPU_MILLI) / u64::from(r))
                .min(u64::from(GPU_MILLI)) as Milli;
        }
    }
}
