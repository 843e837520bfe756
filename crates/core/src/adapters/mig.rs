//! MIG, mixed strategy: allocatable `nvidia.com/mig-<g>g.<mem>gb` pools on the node, requests
//! of those resources on the pod. Reported per profile, apart from the milli metric.
use std::collections::BTreeMap;

use super::{
    Adapter, NVIDIA_GPU, NodeCtx, NodeInput, PodInput, Requests, Resolved, count, unknown,
};
use crate::formats;
use crate::model::*;

/// MIG instances (mixed strategy).
pub(super) struct Mig;

impl Adapter for Mig {
    fn name(&self) -> &'static str {
        "mig"
    }
    /// A pod asking for at least one MIG instance (or for an unreadable count of one).
    fn claims_pod(&self, pod: &PodInput<'_>) -> bool {
        !matches!(instances(pod.req), Ok(m) if m.is_empty())
    }
    fn resolve_pod(&self, pod: &PodInput<'_>, _node: Option<(&Node, &NodeCtx)>) -> Resolved {
        let mig = match instances(pod.req) {
            Ok(m) => m,
            Err(r) => return unknown(r),
        };
        let whole = match pod.req.total(NVIDIA_GPU) {
            Ok(w) => w,
            Err(r) => return unknown(r),
        };
        if whole > 0 {
            return unknown(UnknownReason::DisagreesWithRequest(
                "both MIG and whole-GPU requests".into(),
            ));
        }
        Resolved::Use(GpuUse::Mig(mig), None, None)
    }
}

/// The MIG instances a pod asks for, per profile (profiles asked 0 times left out).
fn instances(req: &Requests) -> Result<Vec<(String, u64)>, UnknownReason> {
    let mut out: BTreeMap<String, u64> = BTreeMap::new();
    for c in &req.per_container {
        for (k, q) in c.iter() {
            if let Some(p) = formats::parse_mig_resource(k) {
                let n = count(k, q)?;
                *out.entry(p.name()).or_default() += n;
            }
        }
    }
    Ok(out.into_iter().filter(|(_, n)| *n > 0).collect())
}

/// Reads the node's MIG pools (every node, whatever its scheme).
pub(crate) fn read_pools(node: &NodeInput<'_>, n: &mut Node, ctx: &mut NodeCtx) {
    let Some(alloc) = node
        .obj
        .status
        .as_ref()
        .and_then(|s| s.allocatable.as_ref())
    else {
        return;
    };
    for (k, v) in alloc {
        if let Some(p) = formats::parse_mig_resource(k) {
            match formats::quantity_to_count(&v.0) {
                Ok(c) if c > 0 => n.mig.push(MigPool {
                    profile: p.name(),
                    capacity: c,
                    used: 0,
                }),
                Ok(_) => {}
                Err(e) => ctx.inventory_error = Some(format!("allocatable {k}: {e}")),
            }
        }
    }
}
