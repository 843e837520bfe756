//! Volcano vGPU: the node register `volcano.sh/node-vgpu-register`, the pod record
//! `volcano.sh/vgpu-ids-new` (HAMi's pod format).
use std::collections::BTreeSet;

use super::hami::{read_register, resolve_vgpu};
use super::{Adapter, NodeCtx, NodeInput, PodInput, Resolved};
use crate::formats;
use crate::model::*;

/// Volcano vGPU node inventory annotation.
pub const VOLCANO_NODE_REGISTER: &str = "volcano.sh/node-vgpu-register";
/// Volcano vGPU pod record.
pub const VOLCANO_VGPU_IDS: &str = "volcano.sh/vgpu-ids-new";
/// Volcano vGPU card count resource.
const VGPU_NUMBER: &str = "volcano.sh/vgpu-number";

/// Volcano vGPU.
pub(super) struct VolcanoVgpu;

impl Adapter for VolcanoVgpu {
    fn name(&self) -> &'static str {
        "volcano-vgpu"
    }
    fn scheme(&self) -> Option<Scheme> {
        Some(Scheme::VolcanoVgpu)
    }
    fn share_resources(&self) -> &'static [&'static str] {
        &[
            VGPU_NUMBER,
            "volcano.sh/vgpu-memory",
            "volcano.sh/vgpu-cores",
            "volcano.sh/vgpu-memory-percentage",
        ]
    }
    fn claims_node(&self, node: &NodeInput<'_>) -> bool {
        node.annotations.contains_key(VOLCANO_NODE_REGISTER)
    }
    fn read_node(&self, node: &NodeInput<'_>, n: &mut Node, ctx: &mut NodeCtx) {
        if let Some(v) = node.annotations.get(VOLCANO_NODE_REGISTER) {
            let parsed = formats::parse_volcano_node_register(v);
            read_register(parsed, &BTreeSet::new(), n, ctx);
        }
    }
    fn claims_pod(&self, pod: &PodInput<'_>) -> bool {
        pod.annotations.contains_key(VOLCANO_VGPU_IDS)
    }
    fn resolve_pod(&self, pod: &PodInput<'_>, node: Option<(&Node, &NodeCtx)>) -> Resolved {
        resolve_vgpu(self, VOLCANO_VGPU_IDS, VGPU_NUMBER, pod, node)
    }
}
