//! Koordinator device share: `Device` objects (or allocatable `koordinator.sh/gpu-core`) on
//! the node, the pod record `scheduling.koordinator.sh/device-allocated`.
use super::{
    Adapter, NVIDIA_GPU, NodeCtx, NodeInput, PodInput, Resolved, devices, unknown, whole_gpus,
};
use crate::formats;
use crate::model::*;

/// Koordinator pod record.
pub const KOORD_DEVICE_ALLOCATED: &str = "scheduling.koordinator.sh/device-allocated";
/// Koordinator GPU compute resource (100 per GPU).
pub const KOORD_GPU_CORE: &str = "koordinator.sh/gpu-core";

/// Koordinator device share.
pub(super) struct Koordinator;

impl Adapter for Koordinator {
    fn name(&self) -> &'static str {
        "koordinator"
    }
    fn scheme(&self) -> Option<Scheme> {
        Some(Scheme::Koordinator)
    }
    /// Also the resources that let a pod carry a `device-allocated` record (with
    /// `nvidia.com/gpu`).
    fn share_resources(&self) -> &'static [&'static str] {
        &[
            KOORD_GPU_CORE,
            "koordinator.sh/gpu-memory",
            "koordinator.sh/gpu-memory-ratio",
            "koordinator.sh/gpu.shared",
            "koordinator.sh/gpu",
        ]
    }
    fn claims_node(&self, node: &NodeInput<'_>) -> bool {
        node.koord_devices.is_some() || node.allocatable(KOORD_GPU_CORE).is_some()
    }
    fn read_node(&self, node: &NodeInput<'_>, n: &mut Node, ctx: &mut NodeCtx) {
        n.granularity = Granularity::Device;
        match node.koord_devices {
            Some(Ok(devs)) => {
                for (i, d) in devs.iter().take(formats::MAX_DEVICES_PER_NODE).enumerate() {
                    let key = d.uuid.clone().unwrap_or_else(|| d.minor.to_string());
                    ctx.by_key.insert(key.clone(), i);
                    ctx.by_minor.insert(d.minor, i);
                    let mem = d.memory_bytes.map(|b| b / (1024 * 1024)).or(node.label_mem);
                    n.gpus.push(Gpu {
                        key,
                        used: 0,
                        healthy: d.healthy,
                        memory_mib: mem,
                    });
                }
            }
            Some(Err(e)) => ctx.inventory_error = Some(format!("Device object: {e}")),
            None => {
                let count = match node.count(KOORD_GPU_CORE) {
                    Ok(Some(core)) => Ok(core / 100),
                    Ok(None) => node.count(NVIDIA_GPU).map(|c| c.unwrap_or(0)),
                    Err(e) => Err(e),
                };
                match count {
                    Ok(c) => {
                        whole_gpus(n, c, node.label_mem);
                        for i in 0..n.gpus.len() {
                            ctx.by_minor.insert(i as u32, i);
                            ctx.by_key.insert(i.to_string(), i);
                        }
                    }
                    Err(e) => {
                        ctx.inventory_error = Some(format!("allocatable {KOORD_GPU_CORE}: {e}"))
                    }
                }
            }
        }
    }
    fn claims_pod(&self, pod: &PodInput<'_>) -> bool {
        pod.annotations.contains_key(KOORD_DEVICE_ALLOCATED)
    }
    fn resolve_pod(&self, pod: &PodInput<'_>, node: Option<(&Node, &NodeCtx)>) -> Resolved {
        let Some(v) = pod.annotations.get(KOORD_DEVICE_ALLOCATED) else {
            return Resolved::Use(GpuUse::None, None, None);
        };
        let (n, ctx) = match self.own_node(node) {
            Ok(x) => x,
            Err(r) => return r,
        };
        let req = pod.req;
        let requests_gpu = self
            .share_resources()
            .iter()
            .chain([&NVIDIA_GPU])
            .any(|r| req.has(r));
        if !requests_gpu {
            return unknown(UnknownReason::DisagreesWithRequest(format!(
                "{KOORD_DEVICE_ALLOCATED} on a pod that requests no GPU resource"
            )));
        }
        let allocs = match formats::parse_koord_device_allocated(v) {
            Ok(a) => a,
            Err(e) => return unknown(UnknownReason::Malformed(e.to_string())),
        };
        let mut devs = Vec::new();
        let mut core_sum = 0u64;
        for a in &allocs {
            let Some(&idx) = ctx.by_minor.get(&a.minor) else {
                return unknown(UnknownReason::UnknownDevice(format!(
                    "gpu minor {} not on node",
                    a.minor
                )));
            };
            let mem = match (a.memory_ratio, a.memory_bytes) {
                (Some(r), _) => Some((u64::from(r), 100)),
                (None, Some(b)) => match n.gpus.get(idx).and_then(|g| g.memory_mib) {
                    Some(mib) => Some((b, mib.saturating_mul(1024 * 1024))),
                    None => {
                        return unknown(UnknownReason::NodeInventory(
                            "gpu-memory record but device memory unknown (no Device object or nvidia.com/gpu.memory label)".into(),
                        ));
                    }
                },
                (None, None) => None,
            };
            if mem.is_none() && a.core.is_none() {
                return unknown(UnknownReason::Malformed(format!(
                    "gpu minor {}: no core or memory",
                    a.minor
                )));
            }
            core_sum += u64::from(a.core.unwrap_or(0));
            match formats::share_milli(mem, a.core) {
                Ok(m) => devs.push((idx, m)),
                Err(e) => return unknown(UnknownReason::Malformed(e.to_string())),
            }
        }
        if req.has(KOORD_GPU_CORE) {
            match req.total(KOORD_GPU_CORE) {
                Ok(want) if want == core_sum => {}
                Ok(want) => {
                    return unknown(UnknownReason::DisagreesWithRequest(format!(
                        "record gives gpu-core {core_sum}, pod requests {want}"
                    )));
                }
                Err(r) => return unknown(r),
            }
        } else if req.has(NVIDIA_GPU) {
            match req.total(NVIDIA_GPU) {
                Ok(want) if want == allocs.len() as u64 => {}
                Ok(want) => {
                    return unknown(UnknownReason::DisagreesWithRequest(format!(
                        "record lists {} GPUs, pod requests {want}",
                        allocs.len()
                    )));
                }
                Err(r) => return unknown(r),
            }
        }
        devices(devs, Scheme::Koordinator)
    }
}
