//! Batches and their fences: what a committed unit becomes (its moves, its batch), what
//! a batch fences during a run, and a plan cut to its first batches.

use std::collections::BTreeSet;

use super::unit::Unit;
use super::{Batch, DraDevice, FencedDevice, Move, Plan, UnitKind};
use crate::frag::Totals;
use crate::model::*;

impl Batch {
    /// The node this batch fences during a run: node and group drains fence their node;
    /// a GPU drain fences only its GPU (the node keeps receiving pods).
    pub fn fenced_node(&self) -> Option<&str> {
        (self.kind != UnitKind::Gpu).then_some(self.node.as_str())
    }

    /// The GPU this batch fences by itself during a run, where the node's scheduler can
    /// keep pods off one GPU ([`Batch::device_fence`]); other GPU drains fence nothing.
    pub fn fenced_device(&self) -> Option<FencedDevice> {
        let gpu = self
            .gpu
            .as_ref()
            .filter(|_| self.kind == UnitKind::Gpu && self.device_fence)?;
        Some(FencedDevice {
            node: self.node.clone(),
            gpu: gpu.clone(),
            dra: self.dra_device.clone(),
        })
    }
}

/// The GPUs `batches` fence by themselves, sorted, each once.
pub(super) fn fenced_devices_of(batches: &[Batch]) -> Vec<FencedDevice> {
    batches
        .iter()
        .filter_map(Batch::fenced_device)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect()
}

/// The nodes `batches` fence, sorted, each once.
pub(super) fn fenced_nodes_of(batches: &[Batch]) -> Vec<String> {
    batches
        .iter()
        .filter_map(Batch::fenced_node)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .map(str::to_string)
        .collect()
}

impl Plan {
    /// The plan cut to its first `n` batches: the moves of those batches, their fences,
    /// and the totals expected after the last one kept. Skipped counts stay; the pending
    /// pods served are only known for the whole plan, so a cut plan lists none.
    pub fn first_batches(&self, n: usize) -> Plan {
        if n >= self.batches.len() {
            return self.clone();
        }
        let batches = self.batches[..n].to_vec();
        let moves = self.moves.iter().filter(|m| m.batch < n).cloned().collect();
        let fenced_nodes = fenced_nodes_of(&batches);
        let fenced_devices = fenced_devices_of(&batches);
        Plan {
            before: self.before,
            after: batches.last().map_or(self.before, |b| b.after),
            moves,
            batches,
            skipped: self.skipped.clone(),
            skipped_pods: self.skipped_pods.clone(),
            shapes: self.shapes.clone(),
            fenced_nodes,
            fenced_devices,
            pending_served: Vec::new(),
            unchecked: self.unchecked.clone(),
            settling_nodes: self.settling_nodes.clone(),
        }
    }
}

/// The move of pod `pi` from node `from` to its placement.
pub(super) fn move_of(
    cluster: &Cluster,
    from: usize,
    (pi, n, devs): (usize, usize, &[usize]),
    batch: usize,
    reason: String,
) -> Move {
    let p = &cluster.pods[pi];
    let from = &cluster.nodes[from];
    let from_devices = match &p.gpu {
        GpuUse::Devices(d) if from.granularity == Granularity::Device => {
            d.iter().map(|(g, _)| from.gpus[*g].key.clone()).collect()
        }
        _ => Vec::new(),
    };
    let to = &cluster.nodes[n];
    let to_devices = if to.granularity == Granularity::Device {
        devs.iter().map(|g| to.gpus[*g].key.clone()).collect()
    } else {
        Vec::new()
    };
    // kube-scheduler scores no device packing for claim pods: other plugins choose
    // their node, and the first fitting device in the driver's order is taken.
    let reason = if p.resource_claims && p.scheme == Some(Scheme::Dra) {
        format!("{reason} (DRA claim pod: landing not guaranteed)")
    } else {
        reason
    };
    Move {
        pod: p.key(),
        pod_index: pi,
        from_node: from.name.clone(),
        from_devices,
        to_node: to.name.clone(),
        to_devices,
        batch,
        reason,
    }
}

/// The batch of a committed unit.
pub(super) fn batch_of(
    cluster: &Cluster,
    u: &Unit,
    moves: usize,
    gain_milli: f64,
    after: Totals,
) -> Batch {
    let node = &cluster.nodes[u.node];
    Batch {
        kind: u.kind,
        node: node.name.clone(),
        gpu: u.gpu.map(|g| node.gpus[g].key.clone()),
        device_fence: u.kind == UnitKind::Gpu && matches!(node.scheme, Scheme::Hami | Scheme::Dra),
        dra_device: u
            .gpu
            .filter(|_| u.kind == UnitKind::Gpu && node.scheme == Scheme::Dra)
            .and_then(|g| node.dra.get(g))
            .map(|d| DraDevice {
                driver: d.driver.clone(),
                pool: d.pool.clone(),
            }),
        moves,
        gain_milli,
        after,
    }
}
