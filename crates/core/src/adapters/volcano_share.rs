//! Volcano gpushare: allocatable `volcano.sh/gpu-number` and `volcano.sh/gpu-memory` on the
//! node (identical cards), the pod record `volcano.sh/gpu-index`.
use super::{Adapter, NodeCtx, NodeInput, PodInput, Resolved, devices, read_index_cards, unknown};
use crate::formats;
use crate::model::*;

/// Volcano gpushare pod record.
pub const VOLCANO_GPU_INDEX: &str = "volcano.sh/gpu-index";
/// Volcano gpushare memory resource.
pub const VOLCANO_GPU_MEMORY: &str = "volcano.sh/gpu-memory";
/// Volcano gpushare card count resource.
pub const VOLCANO_GPU_NUMBER: &str = "volcano.sh/gpu-number";

/// Volcano gpushare.
pub(super) struct VolcanoShare;

impl Adapter for VolcanoShare {
    fn name(&self) -> &'static str {
        "volcano-gpushare"
    }
    fn scheme(&self) -> Option<Scheme> {
        Some(Scheme::VolcanoShare)
    }
    fn share_resources(&self) -> &'static [&'static str] {
        &[VOLCANO_GPU_MEMORY, VOLCANO_GPU_NUMBER]
    }
    fn claims_node(&self, node: &NodeInput<'_>) -> bool {
        node.allocatable(VOLCANO_GPU_NUMBER).is_some()
    }
    fn read_node(&self, node: &NodeInput<'_>, n: &mut Node, ctx: &mut NodeCtx) {
        read_index_cards(node, n, ctx, VOLCANO_GPU_NUMBER, VOLCANO_GPU_MEMORY);
    }
    fn claims_pod(&self, pod: &PodInput<'_>) -> bool {
        pod.annotations.contains_key(VOLCANO_GPU_INDEX)
    }
    fn resolve_pod(&self, pod: &PodInput<'_>, node: Option<(&Node, &NodeCtx)>) -> Resolved {
        let Some(v) = pod.annotations.get(VOLCANO_GPU_INDEX) else {
            return Resolved::Use(GpuUse::None, None, None);
        };
        let (_, ctx) = match self.own_node(node) {
            Ok(x) => x,
            Err(r) => return r,
        };
        let idx = match formats::parse_index_list(VOLCANO_GPU_INDEX, v) {
            Ok(i) => i,
            Err(e) => return unknown(UnknownReason::Malformed(e.to_string())),
        };
        let number = match pod.req.total(VOLCANO_GPU_NUMBER) {
            Ok(n) => n,
            Err(r) => return unknown(r),
        };
        let mem = pod.req.total(VOLCANO_GPU_MEMORY);
        let mut devs = Vec::new();
        for i in &idx {
            let Some(&d) = ctx.by_key.get(&i.to_string()) else {
                return unknown(UnknownReason::UnknownDevice(format!(
                    "gpu index {i} not on node"
                )));
            };
            let milli = if number > 0 {
                GPU_MILLI
            } else {
                match (&mem, ctx.card_mem) {
                    (Ok(m), Some(card)) if *m > 0 => {
                        match formats::share_milli(Some((*m, card)), None) {
                            Ok(x) => x,
                            Err(e) => return unknown(UnknownReason::Malformed(e.to_string())),
                        }
                    }
                    (Err(r), _) => return unknown(r.clone()),
                    _ => {
                        return unknown(UnknownReason::DisagreesWithRequest(
                            "gpu-index record without a volcano.sh/gpu-memory or gpu-number request".into(),
                        ));
                    }
                }
            };
            devs.push((d, milli));
        }
        if number > 0 && number != idx.len() as u64 {
            return unknown(UnknownReason::DisagreesWithRequest(format!(
                "gpu-index lists {} cards, gpu-number requests {number}",
                idx.len()
            )));
        }
        devices(devs, Scheme::VolcanoShare)
    }
}
