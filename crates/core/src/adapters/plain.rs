//! Plain `nvidia.com/gpu`: whole GPUs counted per node (which GPU a pod holds is not known).
//! Recognises every node and pod the other adapters leave.
use super::{Adapter, NodeCtx, NodeInput, PodInput, Resolved, unknown, whole_gpus};
use crate::model::*;

/// Resource name of whole NVIDIA GPUs.
pub const NVIDIA_GPU: &str = "nvidia.com/gpu";
/// Node label carrying the GPU model.
pub const GPU_PRODUCT_LABEL: &str = "nvidia.com/gpu.product";
/// Node label carrying per-GPU memory in MiB.
pub const GPU_MEMORY_LABEL: &str = "nvidia.com/gpu.memory";

/// Plain device plugin.
pub(super) struct Plain;

impl Adapter for Plain {
    fn name(&self) -> &'static str {
        "plain"
    }
    fn scheme(&self) -> Option<Scheme> {
        Some(Scheme::Plain)
    }
    fn claims_node(&self, _node: &NodeInput<'_>) -> bool {
        true
    }
    fn read_node(&self, node: &NodeInput<'_>, n: &mut Node, ctx: &mut NodeCtx) {
        match node.count(NVIDIA_GPU) {
            Ok(c) => whole_gpus(n, c.unwrap_or(0), node.label_mem),
            Err(e) => ctx.inventory_error = Some(format!("allocatable {NVIDIA_GPU}: {e}")),
        }
    }
    fn claims_pod(&self, _pod: &PodInput<'_>) -> bool {
        true
    }
    fn resolve_pod(&self, pod: &PodInput<'_>, node: Option<(&Node, &NodeCtx)>) -> Resolved {
        let whole = match pod.req.total(NVIDIA_GPU) {
            Ok(w) => w,
            Err(r) => return unknown(r),
        };
        if whole == 0 {
            return Resolved::Use(GpuUse::None, None, None);
        }
        let whole32 = u32::try_from(whole).unwrap_or(u32::MAX);
        let shape = Some(GpuShape {
            gpus: whole32,
            milli: GPU_MILLI,
        });
        match node {
            None => Resolved::Use(GpuUse::None, shape, Some(Scheme::Plain)),
            Some((n, _)) if n.granularity == Granularity::Node => {
                Resolved::Use(GpuUse::Whole(whole32), shape, Some(Scheme::Plain))
            }
            // Device-granularity nodes record every GPU pod; a bare count there is a guess.
            Some(_) => unknown(UnknownReason::MissingRecord),
        }
    }
}
