//! Aliyun gpushare: allocatable `aliyun.com/gpu-mem` (and `aliyun.com/gpu-count`) on the
//! node (identical cards), the pod records `ALIYUN_COM_GPU_MEM_IDX`, `_POD` and `_DEV`.
use super::{Adapter, NodeCtx, NodeInput, PodInput, Resolved, read_index_cards, unknown};
use crate::formats;
use crate::model::*;

/// Aliyun gpushare memory resource.
pub const ALIYUN_GPU_MEM: &str = "aliyun.com/gpu-mem";
/// Aliyun gpushare card count resource.
pub const ALIYUN_GPU_COUNT: &str = "aliyun.com/gpu-count";
/// Aliyun pod record (device index).
pub const ALIYUN_MEM_IDX: &str = "ALIYUN_COM_GPU_MEM_IDX";

/// Aliyun gpushare.
pub(super) struct Aliyun;

impl Adapter for Aliyun {
    fn name(&self) -> &'static str {
        "aliyun-gpushare"
    }
    fn scheme(&self) -> Option<Scheme> {
        Some(Scheme::Aliyun)
    }
    fn share_resources(&self) -> &'static [&'static str] {
        &[ALIYUN_GPU_MEM]
    }
    fn claims_node(&self, node: &NodeInput<'_>) -> bool {
        node.allocatable(ALIYUN_GPU_MEM).is_some()
    }
    fn read_node(&self, node: &NodeInput<'_>, n: &mut Node, ctx: &mut NodeCtx) {
        read_index_cards(node, n, ctx, ALIYUN_GPU_COUNT, ALIYUN_GPU_MEM);
    }
    fn claims_pod(&self, pod: &PodInput<'_>) -> bool {
        pod.annotations.contains_key(ALIYUN_MEM_IDX)
    }
    fn resolve_pod(&self, pod: &PodInput<'_>, node: Option<(&Node, &NodeCtx)>) -> Resolved {
        let a = match formats::parse_aliyun(pod.annotations) {
            Ok(Some(a)) => a,
            Ok(None) => return Resolved::Use(GpuUse::None, None, None),
            Err(e) => return unknown(UnknownReason::Malformed(e.to_string())),
        };
        let (_, ctx) = match self.own_node(node) {
            Ok(x) => x,
            Err(r) => return r,
        };
        let Some(&d) = ctx.by_key.get(&a.index.to_string()) else {
            return unknown(UnknownReason::UnknownDevice(format!(
                "gpu index {} not on node",
                a.index
            )));
        };
        match pod.req.total(ALIYUN_GPU_MEM) {
            Ok(want) if want == a.pod_mem => {}
            Ok(want) => {
                return unknown(UnknownReason::DisagreesWithRequest(format!(
                    "ALIYUN_COM_GPU_MEM_POD {} but pod requests {ALIYUN_GPU_MEM} {want}",
                    a.pod_mem
                )));
            }
            Err(r) => return unknown(r),
        }
        if let Some(card) = ctx.card_mem
            && card != a.dev_mem
        {
            return unknown(UnknownReason::DisagreesWithRequest(format!(
                "ALIYUN_COM_GPU_MEM_DEV {} but node cards have {card}",
                a.dev_mem
            )));
        }
        match formats::share_milli(Some((a.pod_mem, a.dev_mem)), None) {
            Ok(m) => Resolved::Use(
                GpuUse::Devices(vec![(d, m)]),
                Some(GpuShape { gpus: 1, milli: m }),
                Some(Scheme::Aliyun),
            ),
            Err(e) => unknown(UnknownReason::Malformed(e.to_string())),
        }
    }
}
