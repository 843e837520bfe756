//! Dynamic Resource Allocation: GPUs published in `ResourceSlice`s, held through
//! `ResourceClaim`s (see [`crate::dra`], which reads them). A node whose GPUs a driver
//! publishes is of this scheme, at device granularity; a pod is resolved here when it
//! asks for an extended resource DRA backs, or when its claims hold or ask for GPUs.
use std::collections::BTreeMap;

use super::{Adapter, NodeCtx, NodeInput, PodInput, Resolved, devices, unknown};
use crate::dra::{DeviceKind, Landing};
use crate::model::*;

/// DRA devices.
pub(super) struct Dra;

/// The extended resources DRA backs that the pod asks for: (name, kind, count).
fn extended(pod: &PodInput<'_>) -> Result<Vec<(String, DeviceKind, u64)>, UnknownReason> {
    let Some(d) = &pod.dra else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for (name, kind) in d.inv.extended() {
        if pod.req.has(name) {
            let n = pod.req.total(name)?;
            if n > 0 {
                out.push((name.to_string(), kind, n));
            }
        }
    }
    Ok(out)
}

impl Adapter for Dra {
    fn name(&self) -> &'static str {
        "dra"
    }
    fn scheme(&self) -> Option<Scheme> {
        Some(Scheme::Dra)
    }
    fn claims_node(&self, node: &NodeInput<'_>) -> bool {
        node.dra.is_some()
    }
    fn read_node(&self, node: &NodeInput<'_>, n: &mut Node, ctx: &mut NodeCtx) {
        let Some(d) = node.dra else { return };
        n.granularity = Granularity::Device;
        for (i, (gpu, info)) in d.gpus.iter().enumerate() {
            ctx.by_key.insert(gpu.key.clone(), i);
            n.gpus.push(gpu.clone());
            n.dra.push(info.clone());
        }
        n.mig.extend(d.mig.iter().cloned());
        if n.model.is_none() {
            n.model = d.model.clone();
        }
        if let Some(e) = &d.error {
            ctx.inventory_error = Some(format!("DRA: {e}"));
        }
    }
    fn claims_pod(&self, pod: &PodInput<'_>) -> bool {
        let Some(d) = &pod.dra else { return false };
        if !d.inv.present() {
            return false;
        }
        if d.claims.extended.is_some() || !matches!(extended(pod), Ok(v) if v.is_empty()) {
            return true;
        }
        // Claims that hold or ask for GPUs; on a DRA node, any claim the input lacks.
        d.claims.names().iter().any(|n| match n {
            Ok((c, _)) => match d.inv.claim(&pod.pod.namespace, c) {
                Some(cl) => {
                    cl.results()
                        .into_iter()
                        .flatten()
                        .any(|r| !matches!(d.inv.landing(r), Ok(Landing::NotGpu)))
                        || cl.requests().iter().any(|r| {
                            r.as_ref()
                                .is_none_or(|(class, _)| d.inv.class(class) != DeviceKind::Other)
                        })
                }
                None => d.node_is_dra,
            },
            Err(_) => d.node_is_dra,
        })
    }
    fn resolve_pod(&self, pod: &PodInput<'_>, node: Option<(&Node, &NodeCtx)>) -> Resolved {
        let Some(d) = &pod.dra else {
            return Resolved::Use(GpuUse::None, None, None);
        };
        let ns = pod.pod.namespace.as_str();
        let ext = match extended(pod) {
            Ok(e) => e,
            Err(r) => return unknown(r),
        };
        let ext_gpus: u64 = ext
            .iter()
            .filter(|(_, k, _)| *k == DeviceKind::Gpu)
            .map(|(_, _, n)| *n)
            .sum();
        let Some((n, _)) = node else {
            // Pending (or not active): the shape it asks for, whole GPUs only.
            let mut gpus = ext_gpus;
            for name in d.claims.names().into_iter().flatten() {
                if let Some(cl) = d.inv.claim(ns, &name.0) {
                    for r in cl.requests().iter().flatten() {
                        if d.inv.class(&r.0) == DeviceKind::Gpu {
                            gpus = gpus.saturating_add(r.1);
                        }
                    }
                }
            }
            let shape = (gpus > 0).then(|| GpuShape {
                gpus: u32::try_from(gpus).unwrap_or(u32::MAX),
                milli: GPU_MILLI,
            });
            return Resolved::Use(GpuUse::None, shape, Some(Scheme::Dra));
        };
        if n.scheme != Scheme::Dra {
            return unknown(UnknownReason::DisagreesWithRequest(format!(
                "DRA devices on a {} node (no ResourceSlice publishes its GPUs)",
                n.scheme.as_str()
            )));
        }
        let mut devs: Vec<(usize, Milli)> = Vec::new();
        let mut ext_devs = 0u64;
        let mut mig: BTreeMap<String, u64> = BTreeMap::new();
        for name in d.claims.names() {
            let c = match name {
                Ok((c, _)) => c,
                Err(pn) => {
                    return unknown(UnknownReason::ClaimUnresolved(format!(
                        "claim {pn} of the pod is not recorded in its status.resourceClaimStatuses"
                    )));
                }
            };
            let Some(cl) = d.inv.claim(ns, &c) else {
                return unknown(UnknownReason::ClaimUnresolved(format!(
                    "ResourceClaim {ns}/{c} is not in the input"
                )));
            };
            let Some(results) = cl.results() else {
                return unknown(UnknownReason::ClaimUnresolved(format!(
                    "ResourceClaim {ns}/{c} is not allocated"
                )));
            };
            if !cl.reserved_for(&pod.pod.name, &pod.pod.uid) {
                return unknown(UnknownReason::ClaimUnresolved(format!(
                    "ResourceClaim {ns}/{c} is not reserved for the pod"
                )));
            }
            let is_ext = d.claims.extended.as_deref() == Some(c.as_str());
            for r in results {
                match d.inv.landing(r) {
                    Ok(Landing::Gpu(on, slot, milli, _)) => {
                        if on != n.name {
                            return unknown(UnknownReason::DisagreesWithRequest(format!(
                                "claim {c} holds a GPU of node {on}, the pod runs on {}",
                                n.name
                            )));
                        }
                        devs.push((slot, milli));
                        ext_devs += u64::from(is_ext);
                    }
                    Ok(Landing::Mig(on, profile)) => {
                        if on != n.name {
                            return unknown(UnknownReason::DisagreesWithRequest(format!(
                                "claim {c} holds a MIG partition of node {on}, the pod runs on {}",
                                n.name
                            )));
                        }
                        *mig.entry(profile).or_default() += 1;
                    }
                    Ok(Landing::Other(dev)) => {
                        return unknown(UnknownReason::DisagreesWithRequest(format!(
                            "claim {c} holds GPU driver device {dev} of a type the model does not place"
                        )));
                    }
                    Ok(Landing::NotGpu) => {}
                    Err(e) => return unknown(e),
                }
            }
        }
        if ext_gpus > 0 && ext_devs != ext_gpus {
            return unknown(UnknownReason::DisagreesWithRequest(format!(
                "asks for {ext_gpus} DRA-backed GPUs, its extended-resource claim holds {ext_devs}"
            )));
        }
        match (devs.is_empty(), mig.is_empty()) {
            (true, true) => Resolved::Use(GpuUse::None, None, None),
            (false, true) => devices(devs, Scheme::Dra),
            (true, false) => Resolved::Use(
                GpuUse::Mig(mig.into_iter().collect()),
                None,
                Some(Scheme::Dra),
            ),
            (false, false) => unknown(UnknownReason::DisagreesWithRequest(
                "holds both whole GPUs and MIG partitions (not modelled)".into(),
            )),
        }
    }
}
