//! What a plan is: its moves, batches, fences, skipped pods and settling nodes, and the
//! history of the run it continues.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::frag::Totals;
use crate::policy::TargetShape;

#[cfg(doc)]
use super::{Skip, settling};
#[cfg(doc)]
use crate::model::Cluster;

/// What already happened in the current run (so limits hold across restarts).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct History {
    /// `namespace/name` of pods already evicted in this run.
    pub evicted: Vec<String>,
    /// Evictions already done per source node.
    pub per_node: BTreeMap<String, u32>,
    /// Evictions already done per namespace.
    pub per_namespace: BTreeMap<String, u32>,
}

/// One planned eviction.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Move {
    /// `namespace/name`.
    pub pod: String,
    /// Index of the pod in the cluster.
    #[serde(skip)]
    pub pod_index: usize,
    /// Source node.
    pub from_node: String,
    /// Source devices (empty at node granularity).
    pub from_devices: Vec<String>,
    /// Expected target node.
    pub to_node: String,
    /// Expected target devices.
    pub to_devices: Vec<String>,
    /// Batch index.
    pub batch: usize,
    /// Why.
    pub reason: String,
}

/// What a batch drains.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum UnitKind {
    /// Every GPU pod of a node.
    Node,
    /// Every pod on one GPU.
    Gpu,
    /// The smallest group of whole-GPU pods that makes room for a target shape.
    Group,
}

/// One batch: one drained unit.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Batch {
    /// Kind of unit.
    pub kind: UnitKind,
    /// Node.
    pub node: String,
    /// GPU key, for GPU units.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu: Option<String>,
    /// The GPU of this GPU unit can be fenced by itself during a run: the node is a HAMi
    /// node, whose scheduler keeps new pods off the GPUs listed in `hami.io/device-cordon`,
    /// or a DRA node, where a `DeviceTaintRule` keeps new claims off the device.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub device_fence: bool,
    /// The DRA device of this GPU unit, where its fence is a `DeviceTaintRule`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dra_device: Option<DraDevice>,
    /// Moves in it.
    pub moves: usize,
    /// Fragment milli it removes (expected).
    pub gain_milli: f64,
    /// Cluster totals expected after it.
    pub after: Totals,
}

/// The plan.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    /// Totals now.
    pub before: Totals,
    /// Totals expected after every batch.
    pub after: Totals,
    /// Moves in order.
    pub moves: Vec<Move>,
    /// Batches in order.
    pub batches: Vec<Batch>,
    /// GPU pods not movable, by reason code.
    pub skipped: BTreeMap<String, u64>,
    /// GPU pods not movable, each with its code (`namespace/name`, in pod order).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub skipped_pods: Vec<SkippedPod>,
    /// Target shapes used.
    pub shapes: Vec<TargetShape>,
    /// Nodes that receive no pod back during the run (fence them).
    pub fenced_nodes: Vec<String>,
    /// Single GPUs that receive no pod back during the run (fence them by themselves).
    pub fenced_devices: Vec<FencedDevice>,
    /// Pending pods expected to fit after the plan (fromPending).
    pub pending_served: Vec<String>,
    /// What the input did not let the planner check ([`Cluster::unchecked`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unchecked: Vec<String>,
    /// Nodes in the policy's scope that receive no planned pod yet, and why ([`settling`]):
    /// an empty plan on a new cluster is explained by them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub settling_nodes: Vec<SettlingNode>,
}

/// A node that receives no planned pod yet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SettlingNode {
    /// Its name.
    pub node: String,
    /// Why: a start-up taint, not Ready, or Ready for less than `safety.minNodeAge`.
    pub why: String,
}

/// A GPU pod the plan does not move, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SkippedPod {
    /// `namespace/name`.
    pub pod: String,
    /// The skip code ([`Skip::code`]).
    pub code: &'static str,
}

/// One GPU fenced by itself during a run.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct FencedDevice {
    /// Node.
    pub node: String,
    /// GPU key: a HAMi device UUID, or a DRA device's name in its pool.
    pub gpu: String,
    /// A DRA device's driver and pool (its fence is a `DeviceTaintRule` selecting driver,
    /// pool and device); none for a HAMi GPU (fenced in `hami.io/device-cordon`).
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub dra: Option<DraDevice>,
}

/// Where a DRA device is published: what a `DeviceTaintRule` selects, with its name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct DraDevice {
    /// Driver (`gpu.nvidia.com`).
    pub driver: String,
    /// Pool (the node's name for the NVIDIA driver).
    pub pool: String,
}
