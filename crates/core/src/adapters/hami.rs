//! HAMi vGPU: the node register `hami.io/node-nvidia-register`, the pod record
//! `hami.io/vgpu-devices-allocated`. Volcano vGPU ([`super::volcano_vgpu`]) shares the pod
//! format and [`resolve_vgpu`].
use std::collections::{BTreeMap, BTreeSet};

use super::{
    Adapter, NVIDIA_GPU, NodeCtx, NodeInput, PodInput, Resolved, count, device_list, devices,
    trunc, unknown,
};
use crate::formats::{self, FormatError, HamiNodeDevice};
use crate::model::*;

/// HAMi node inventory annotation.
pub const HAMI_NODE_REGISTER: &str = "hami.io/node-nvidia-register";
/// HAMi pod record.
pub const HAMI_POD_ALLOCATED: &str = "hami.io/vgpu-devices-allocated";

/// The GPUs (UUIDs) the HAMi record `hami.io/vgpu-devices-allocated` among a pod's annotations names, in record
/// order, container after container (a GPU two containers share is listed twice). Empty
/// when the pod has no record or the record does not parse.
pub fn hami_pod_gpus(annotations: &BTreeMap<String, String>) -> Vec<String> {
    annotations
        .get(HAMI_POD_ALLOCATED)
        .and_then(|v| formats::parse_hami_pod_devices(v).ok())
        .map(|c| c.into_iter().flatten().map(|d| d.uuid).collect())
        .unwrap_or_default()
}

/// HAMi vGPU.
pub(super) struct Hami;

impl Adapter for Hami {
    fn name(&self) -> &'static str {
        "hami"
    }
    fn scheme(&self) -> Option<Scheme> {
        Some(Scheme::Hami)
    }
    fn share_resources(&self) -> &'static [&'static str] {
        &[
            "nvidia.com/gpumem",
            "nvidia.com/gpumem-percentage",
            "nvidia.com/gpucores",
        ]
    }
    fn claims_node(&self, node: &NodeInput<'_>) -> bool {
        node.annotations.contains_key(HAMI_NODE_REGISTER)
    }
    fn read_node(&self, node: &NodeInput<'_>, n: &mut Node, ctx: &mut NodeCtx) {
        let Some(v) = node.annotations.get(HAMI_NODE_REGISTER) else {
            return;
        };
        // GPUs cordoned on a HAMi node (by an administrator or another tool) receive no
        // pod: they are read as unhealthy. Those a run of this operator cordoned stay as
        // they are (the run is emptying them; its plan counts them as freed).
        let cordoned: BTreeSet<String> =
            match node.annotations.get(crate::fence::HAMI_DEVICE_CORDON) {
                Some(list) => {
                    let ours: BTreeSet<String> = crate::fence::claims(node.annotations)
                        .unwrap_or_default()
                        .into_values()
                        .flatten()
                        .collect();
                    crate::fence::cordoned(list)
                        .into_iter()
                        .filter(|g| !ours.contains(g))
                        .collect()
                }
                None => BTreeSet::new(),
            };
        read_register(formats::parse_hami_node_register(v), &cordoned, n, ctx);
    }
    fn claims_pod(&self, pod: &PodInput<'_>) -> bool {
        pod.annotations.contains_key(HAMI_POD_ALLOCATED)
    }
    fn resolve_pod(&self, pod: &PodInput<'_>, node: Option<(&Node, &NodeCtx)>) -> Resolved {
        resolve_vgpu(self, HAMI_POD_ALLOCATED, NVIDIA_GPU, pod, node)
    }
}

/// Gives the node the GPUs of a HAMi-format register (those in `cordoned` unhealthy).
pub(super) fn read_register(
    parsed: Result<Vec<HamiNodeDevice>, FormatError>,
    cordoned: &BTreeSet<String>,
    n: &mut Node,
    ctx: &mut NodeCtx,
) {
    match parsed {
        Ok(devs) => {
            if n.model.is_none() {
                n.model = devs.first().map(|d| d.model.clone());
            }
            device_list(
                n,
                ctx,
                devs.into_iter()
                    .map(|d| {
                        let healthy = d.healthy && !cordoned.contains(&d.id);
                        (d.id, Some(d.devmem_mib), healthy)
                    })
                    .collect(),
            );
        }
        Err(e) => {
            n.granularity = Granularity::Device;
            ctx.inventory_error = Some(e.to_string());
        }
    }
}

/// Resolves a HAMi-format pod record under `key`: each container slot must list as many
/// devices as the container requests of `count_res`, each a device of the node.
pub(super) fn resolve_vgpu(
    adapter: &dyn Adapter,
    key: &str,
    count_res: &str,
    pod: &PodInput<'_>,
    node: Option<(&Node, &NodeCtx)>,
) -> Resolved {
    let Some(v) = pod.annotations.get(key) else {
        return Resolved::Use(GpuUse::None, None, None);
    };
    let (n, ctx) = match adapter.own_node(node) {
        Ok(x) => x,
        Err(r) => return r,
    };
    let req = pod.req;
    let slots = match formats::parse_hami_pod_devices(v) {
        Ok(s) => s,
        Err(e) => return unknown(UnknownReason::Malformed(e.to_string())),
    };
    if slots.len() > req.per_container.len().max(1) {
        return unknown(UnknownReason::DisagreesWithRequest(format!(
            "{key} has {} container slots, pod has {} containers",
            slots.len(),
            req.per_container.len()
        )));
    }
    let mut devs = Vec::new();
    for (i, slot) in slots.iter().enumerate() {
        let want = req
            .per_container
            .get(i)
            .and_then(|c| c.get(count_res))
            .map(|q| count(count_res, q));
        let want = match want {
            Some(Ok(w)) => w,
            Some(Err(r)) => return unknown(r),
            None => 0,
        };
        if slot.len() as u64 != want {
            return unknown(UnknownReason::DisagreesWithRequest(format!(
                "container {i}: {key} lists {} devices, {count_res} requests {want}",
                slot.len()
            )));
        }
        for d in slot {
            let Some(&idx) = ctx.by_key.get(&d.uuid) else {
                return unknown(UnknownReason::UnknownDevice(format!(
                    "{} not in node inventory",
                    trunc(&d.uuid)
                )));
            };
            let total = n.gpus.get(idx).and_then(|g| g.memory_mib).unwrap_or(0);
            let cores = if d.used_cores == 0 {
                None
            } else {
                Some(d.used_cores)
            };
            match formats::share_milli(Some((d.used_mem_mib, total)), cores) {
                Ok(m) => devs.push((idx, m)),
                Err(e) => return unknown(UnknownReason::Malformed(e.to_string())),
            }
        }
    }
    devices(devs, n.scheme)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hami_pod_gpus_lists_the_record_s_gpus() {
        assert!(hami_pod_gpus(&BTreeMap::new()).is_empty(), "no annotations");
        let with = |k: &str, v: &str| hami_pod_gpus(&BTreeMap::from([(k.into(), v.into())]));
        assert_eq!(
            with(
                HAMI_POD_ALLOCATED,
                "GPU-a,NVIDIA,1024,0:GPU-b,NVIDIA,1024,0:;;GPU-a,NVIDIA,2048,30:;"
            ),
            ["GPU-a", "GPU-b", "GPU-a"]
        );
        assert!(with(HAMI_POD_ALLOCATED, "not a record").is_empty());
        assert!(with(HAMI_POD_ALLOCATED, "").is_empty());
        assert!(
            with("volcano.sh/vgpu-ids-new", "GPU-a,NVIDIA,1024,0:;").is_empty(),
            "only the HAMi record counts"
        );
    }
}
