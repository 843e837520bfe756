//! KAI fractions: the pod annotation `gpu-fraction` and label `runai-gpu-group`, on plain
//! nodes. A group's fractions share the whole GPU its reservation pod holds; the groups are
//! confirmed and placed once every pod is read ([`crate::ingest`]).
use super::{Adapter, NodeCtx, PodInput, Resolved, unknown};
use crate::formats;
use crate::model::*;

/// KAI fraction annotation.
pub const KAI_FRACTION: &str = "gpu-fraction";
/// KAI group label.
pub const KAI_GROUP: &str = "runai-gpu-group";
/// Namespace of KAI's reservation pods.
pub const KAI_RESERVATION_NS: &str = "kai-resource-reservation";

/// KAI fractions.
pub(super) struct Kai;

impl Adapter for Kai {
    fn name(&self) -> &'static str {
        "kai"
    }
    fn claims_pod(&self, pod: &PodInput<'_>) -> bool {
        pod.annotations.contains_key(KAI_FRACTION)
    }
    fn resolve_pod(&self, pod: &PodInput<'_>, node: Option<(&Node, &NodeCtx)>) -> Resolved {
        let Some(v) = pod.annotations.get(KAI_FRACTION) else {
            return Resolved::Use(GpuUse::None, None, None);
        };
        let milli = match formats::parse_gpu_fraction(v) {
            Ok(m) => m,
            Err(e) => return unknown(UnknownReason::Malformed(e.to_string())),
        };
        if node.is_none() {
            return Resolved::Use(GpuUse::None, Some(GpuShape { gpus: 1, milli }), None);
        }
        match pod.pod.labels.get(KAI_GROUP) {
            Some(g) => Resolved::Kai(g.clone(), milli),
            None => unknown(UnknownReason::MissingRecord),
        }
    }
}
