//! The units the planner drains all or nothing: whole nodes, single GPUs, and the
//! smallest groups of whole-GPU pods that make room for a target shape.

use std::collections::BTreeSet;

use super::UnitKind;
use crate::model::*;
use crate::policy::TargetShape;

#[derive(Debug, Clone)]
pub(super) struct Unit {
    pub(super) kind: UnitKind,
    pub(super) node: usize,
    pub(super) gpu: Option<usize>,
    pub(super) pods: Vec<usize>,
}

/// The highest priority among a unit's pods.
pub(super) fn unit_priority(c: &Cluster, u: &Unit) -> i32 {
    u.pods
        .iter()
        .map(|&pi| c.pods[pi].priority)
        .max()
        .unwrap_or(i32::MIN)
}

pub(super) fn units(
    c: &Cluster,
    shapes: &[TargetShape],
    ok: &[bool],
    counted: &[bool],
    free: &[Vec<Milli>],
) -> Vec<Unit> {
    let mut by_node: Vec<Vec<usize>> = vec![Vec::new(); c.nodes.len()];
    for (i, p) in c.pods.iter().enumerate() {
        if let Some(n) = p.node
            && p.is_active_bound()
            && p.held_milli() > 0
        {
            by_node[n].push(i);
        }
    }
    let mut out = Vec::new();
    for (n, pods) in by_node.iter().enumerate() {
        if !counted[n] || pods.is_empty() || !pods.iter().all(|&p| ok[p]) {
            // All or nothing: one unmovable GPU pod keeps the node from being drained…
            if counted[n] && !pods.is_empty() {
                // …but single GPUs / groups without it may still be.
                add_partial_units(c, n, pods, ok, shapes, free, &mut out);
            }
            continue;
        }
        out.push(Unit {
            kind: UnitKind::Node,
            node: n,
            gpu: None,
            pods: pods.clone(),
        });
        add_partial_units(c, n, pods, ok, shapes, free, &mut out);
    }
    // Placement order within a unit: largest first (hardest to place), then pod order.
    for u in &mut out {
        u.pods
            .sort_by_key(|&pi| (std::cmp::Reverse(c.pods[pi].held_milli()), pi));
    }
    out
}

fn add_partial_units(
    c: &Cluster,
    n: usize,
    pods: &[usize],
    ok: &[bool],
    shapes: &[TargetShape],
    free: &[Vec<Milli>],
    out: &mut Vec<Unit>,
) {
    let node = &c.nodes[n];
    match node.granularity {
        // A DRA GPU drained by itself is fenced with a DeviceTaintRule (else the
        // scheduler's first fit could hand the drained device straight back): without
        // them (served from Kubernetes 1.37 on), only whole-node drains, fenced by the node
        // taint, are planned there.
        Granularity::Device if node.scheme == Scheme::Dra && !c.dra_device_fences => {}
        Granularity::Device => {
            for g in 0..node.gpus.len() {
                if node.scheme == Scheme::Dra && node.dra.get(g).is_none() {
                    continue;
                }
                let on: Vec<usize> = pods
                    .iter()
                    .copied()
                    .filter(|&p| matches!(&c.pods[p].gpu, GpuUse::Devices(d) if d.iter().any(|(x, _)| *x == g)))
                    .collect();
                if !on.is_empty() && on.iter().all(|&p| ok[p]) && on.len() < pods.len() {
                    out.push(Unit {
                        kind: UnitKind::Gpu,
                        node: n,
                        gpu: Some(g),
                        pods: on,
                    });
                }
            }
        }
        Granularity::Node => {
            let have = free[n].iter().filter(|f| **f == GPU_MILLI).count();
            let mut movable: Vec<usize> = pods.iter().copied().filter(|&p| ok[p]).collect();
            movable.sort_by_key(|&p| (c.pods[p].held_milli(), p));
            let mut seen: BTreeSet<Vec<usize>> = BTreeSet::new();
            for s in shapes {
                let k = s.gpus as usize;
                if k == 0
                    || k <= have
                    || k > node.gpus.len()
                    || s.milli_per_gpu < GPU_MILLI && k == 1 && have > 0
                {
                    continue;
                }
                let mut got = have;
                let mut group = Vec::new();
                for &p in &movable {
                    if got >= k {
                        break;
                    }
                    group.push(p);
                    got += (c.pods[p].held_milli() / u64::from(GPU_MILLI)) as usize;
                }
                if got >= k && group.len() < pods.len() && seen.insert(group.clone()) {
                    out.push(Unit {
                        kind: UnitKind::Group,
                        node: n,
                        gpu: None,
                        pods: group,
                    });
                }
            }
        }
    }
}
