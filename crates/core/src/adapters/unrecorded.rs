//! Share requests that no record backs. Not a scheme: the rule, after every scheme's record
//! was looked for, that a pod asking for a share of a GPU ([`Adapter::share_resources`])
//! without a record is unknown, since nothing says which GPU it shares.
use super::{Adapter, KOORD_GPU_CORE, NVIDIA_GPU, NodeCtx, PodInput, Requests, Resolved, unknown};
use crate::model::*;

/// A share request without a record.
pub(super) struct UnrecordedShare;

impl Adapter for UnrecordedShare {
    fn name(&self) -> &'static str {
        "unrecorded-share"
    }
    fn claims_pod(&self, pod: &PodInput<'_>) -> bool {
        pod.req.has_shared()
    }
    fn resolve_pod(&self, pod: &PodInput<'_>, node: Option<(&Node, &NodeCtx)>) -> Resolved {
        if node.is_some() {
            return unknown(UnknownReason::MissingRecord);
        }
        match pending_shape(pod.req) {
            Ok(shape) => Resolved::Use(GpuUse::None, Some(shape), None),
            Err(r) => unknown(r),
        }
    }
}

/// Shape of a pending pod that asks for a share (no device chosen yet).
fn pending_shape(req: &Requests) -> Result<GpuShape, UnknownReason> {
    let pct = |name: &str| -> Result<Option<u64>, UnknownReason> {
        Ok(Some(req.total(name)?).filter(|v| *v > 0))
    };
    let milli = pct(KOORD_GPU_CORE)?
        .or(pct("koordinator.sh/gpu-memory-ratio")?)
        .or(pct("nvidia.com/gpucores")?)
        .or(pct("nvidia.com/gpumem-percentage")?)
        .or(pct("volcano.sh/vgpu-cores")?)
        .map(|p| (p.min(100) * 10) as Milli);
    let gpus = pct(NVIDIA_GPU)?
        .or(pct("volcano.sh/vgpu-number")?)
        .unwrap_or(1);
    Ok(GpuShape {
        gpus: u32::try_from(gpus).unwrap_or(1),
        milli: milli.unwrap_or(GPU_MILLI),
    })
}
