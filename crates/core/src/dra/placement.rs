//! Where an allocation result lands in the model, and where a pod's devices come from
//! (the move rules).
use super::account::share_milli;
use super::claims::{AllocResult, PodClaims};
use super::{DeviceKind, Inventory};
use crate::model::{GPU_MILLI, Milli};

/// Where an allocation result lands in the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Landing {
    /// A whole-GPU device: its node, its index in the node's GPUs, and the milli this
    /// result holds (1000, or a consumable-capacity share).
    Gpu(String, usize, Milli, bool),
    /// A MIG partition: its node and profile.
    Mig(String, String),
    /// A device of a GPU driver the model does not place (`vfio`): its type.
    Other(String),
    /// A device of a driver that is not a GPU driver.
    NotGpu,
}

impl Inventory {
    /// Where allocation result `r` lands in the model, or why it cannot be read.
    pub(crate) fn landing(&self, r: &AllocResult) -> Result<Landing, crate::model::UnknownReason> {
        use crate::model::UnknownReason as U;
        if !self.is_gpu_driver(&r.driver) {
            return Ok(Landing::NotGpu);
        }
        if let Some(b) = &r.bad {
            return Err(U::Malformed(format!(
                "allocation of device {}: {b}",
                r.device
            )));
        }
        let id = (r.driver.clone(), r.pool.clone(), r.device.clone());
        let Some(&i) = self.by_id.get(&id) else {
            let why = match self.incomplete.get(&(r.driver.clone(), r.pool.clone())) {
                Some(w) => w.clone(),
                None => "no complete pool publishes it".into(),
            };
            return Err(U::UnknownDevice(format!(
                "device {} of pool {} ({}): {why}",
                r.device, r.pool, r.driver
            )));
        };
        if let Some(w) = self.overused.get(&i) {
            return Err(U::Overcommitted(w.clone()));
        }
        let d = &self.devs[i];
        let Some(node) = d.node.clone() else {
            return Err(U::UnknownDevice(format!(
                "device {} of pool {} is not bound to one node",
                d.name, d.pool
            )));
        };
        match d.kind {
            DeviceKind::Gpu => {
                let Some(&slot) = self.gpu_slot.get(&i) else {
                    return Err(U::UnknownDevice(format!(
                        "device {} of pool {}: more GPUs on its node than the model reads",
                        d.name, d.pool
                    )));
                };
                let milli = if r.share {
                    share_milli(d, &r.consumed).ok_or_else(|| {
                        U::Malformed(format!(
                            "share of device {} consumes no capacity the device publishes",
                            d.name
                        ))
                    })?
                } else {
                    GPU_MILLI
                };
                Ok(Landing::Gpu(node, slot, milli, r.share))
            }
            DeviceKind::Mig => Ok(Landing::Mig(
                node,
                d.profile.clone().unwrap_or_else(|| "mig".into()),
            )),
            DeviceKind::Other => Ok(Landing::Other(format!("{} ({})", d.name, d.driver))),
        }
    }
}

impl Inventory {
    /// Where the devices of a pod come from, for the move rules. `ext` says whether the
    /// pod asks for an extended resource DRA backs.
    pub(crate) fn claim_source(
        &self,
        ns: &str,
        claims: &PodClaims,
        ext: bool,
    ) -> crate::model::ClaimSource {
        use crate::model::ClaimSource as S;
        if !(claims.any() || ext) || !self.present {
            return S::None;
        }
        // A named claim never moves, shared or not.
        for (_, named) in &claims.spec {
            if let Some(c) = named {
                let key = format!("{ns}/{c}");
                return match self.claim(ns, c) {
                    Some(cl) if cl.consumers() > 1 => S::Shared(key),
                    _ => S::Named(key),
                };
            }
        }
        if ext && claims.extended.is_none() {
            return S::Unsure(
                "asks for a DRA-backed extended resource but its status names no claim".into(),
            );
        }
        for name in claims.names() {
            let c = match name {
                Ok((c, _)) => c,
                Err(n) => {
                    return S::Unsure(format!("claim {n} is not recorded in the pod's status"));
                }
            };
            let Some(cl) = self.claim(ns, &c) else {
                return S::Unsure(format!("ResourceClaim {ns}/{c} is not in the input"));
            };
            if cl.consumers() > 1 {
                return S::Shared(format!("{ns}/{c}"));
            }
            let Some(results) = cl.results() else {
                return S::Unsure(format!("ResourceClaim {ns}/{c} is not allocated"));
            };
            for r in results {
                match self.landing(r) {
                    Ok(Landing::Gpu(_, _, _, false)) => {}
                    Ok(Landing::Gpu(_, _, _, true)) => {
                        return S::Unsure(format!(
                            "claim {c} holds a consumable-capacity share of {} (shares are not planned yet)",
                            r.device
                        ));
                    }
                    Ok(Landing::Mig(_, p)) => {
                        return S::Unsure(format!(
                            "claim {c} holds MIG partition {} ({p}): MIG moves are not planned yet",
                            r.device
                        ));
                    }
                    Ok(Landing::Other(d)) => {
                        return S::Unsure(format!(
                            "claim {c} holds device {d}, which gpu-defrag does not place"
                        ));
                    }
                    Ok(Landing::NotGpu) => {
                        return S::Unsure(format!(
                            "claim {c} holds a device of driver {}, which gpu-defrag does not model",
                            r.driver
                        ));
                    }
                    Err(e) => return S::Unsure(format!("claim {c}: {e}")),
                }
            }
        }
        S::Movable
    }
}
