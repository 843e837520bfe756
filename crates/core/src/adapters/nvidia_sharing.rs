//! NVIDIA device plugin sharing, time-slicing or MPS: the device plugin advertises every
//! GPU `replicas` times (`nvidia.com/gpu`, or `nvidia.com/gpu.shared` with
//! `renameByDefault`), and GPU feature discovery labels the node with the physical count
//! (`nvidia.com/gpu.count`), the replicas (`nvidia.com/gpu.replicas`) and the strategy
//! (`nvidia.com/gpu.sharing-strategy`: `time-slicing` or `mps`).
//!
//! A pod asking for `k` of the replicated resource holds `k` replicas, each a share of
//! 1000 / replicas milli of one GPU. Which GPU a replica is on is recorded nowhere in the
//! API: usage is known per node only. [`crate::ingest`] spreads a node's replicas over its
//! GPUs as the device plugin's default (distributed) allocation does, least-used GPU
//! first: that spread never shows a GPU fully free that could be holding a replica
//! (with `R` replicas in use on `G` GPUs, `max(0, G − R)` are fully free), so a whole-GPU
//! shape fits only where it surely would. The spread is the model's, not a record: a
//! pod of this scheme has a share shape (under 1000 milli at node granularity), so the
//! planner finds no target for it and never moves it, and no other scheme's pod is
//! planned onto such a node.
//!
//! Labels that contradict each other or the allocatable make the node's inventory
//! unreadable (its pods unknown, the node never drained): never a guess.
use super::{Adapter, NVIDIA_GPU, NodeCtx, NodeInput, PodInput, Resolved, plain, unknown};
use crate::model::*;

/// Resource name of GPU replicas with `renameByDefault: true`.
pub const NVIDIA_GPU_SHARED: &str = "nvidia.com/gpu.shared";
/// GFD label: physical GPUs of the node.
pub const GPU_COUNT_LABEL: &str = "nvidia.com/gpu.count";
/// GFD label: replicas per GPU (`0`: sharing disabled, `1`: not shared).
pub const GPU_REPLICAS_LABEL: &str = "nvidia.com/gpu.replicas";
/// GFD label: `none`, `time-slicing` or `mps`.
pub const GPU_SHARING_STRATEGY_LABEL: &str = "nvidia.com/gpu.sharing-strategy";
/// Most replicas per GPU read: a replica must be worth at least one milli-GPU.
const MAX_REPLICAS: u64 = GPU_MILLI as u64;

/// NVIDIA time-slicing and MPS replicas.
pub(super) struct NvidiaSharing;

impl Adapter for NvidiaSharing {
    fn name(&self) -> &'static str {
        "nvidia-sharing"
    }
    fn scheme(&self) -> Option<Scheme> {
        Some(Scheme::NvidiaSharing)
    }
    /// A sharing strategy, more than one replica per GPU (or a replicas label that does
    /// not read as 0 or 1), or the renamed resource in the allocatable.
    fn claims_node(&self, node: &NodeInput<'_>) -> bool {
        let strategy = label(node, GPU_SHARING_STRATEGY_LABEL);
        let replicated = label(node, GPU_REPLICAS_LABEL)
            .is_some_and(|r| r.parse::<u64>().map_or(true, |v| v > 1));
        matches!(strategy, Some("time-slicing" | "mps"))
            || replicated
            || node.allocatable(NVIDIA_GPU_SHARED).is_some()
    }
    fn read_node(&self, node: &NodeInput<'_>, n: &mut Node, ctx: &mut NodeCtx) {
        n.granularity = Granularity::Node;
        match read(node) {
            Ok(inv) => {
                super::whole_gpus(n, inv.gpus, node.label_mem);
                ctx.replicas = Some((inv.replicas, inv.resource));
            }
            Err(e) => ctx.inventory_error = Some(e),
        }
    }
    fn claims_pod(&self, pod: &PodInput<'_>) -> bool {
        pod.req.has(NVIDIA_GPU_SHARED) || pod.req.has(NVIDIA_GPU)
    }
    fn resolve_pod(&self, pod: &PodInput<'_>, node: Option<(&Node, &NodeCtx)>) -> Resolved {
        let shared = match pod.req.total(NVIDIA_GPU_SHARED) {
            Ok(s) => s,
            Err(r) => return unknown(r),
        };
        match node {
            Some((n, ctx)) if n.scheme == Scheme::NvidiaSharing => replicas(pod, n, ctx),
            Some((n, _)) if shared > 0 => unknown(UnknownReason::DisagreesWithRequest(format!(
                "{NVIDIA_GPU_SHARED} on a {} node",
                n.scheme.as_str()
            ))),
            // A pending pod's replica size is the node's: unknown until it is bound.
            None if shared > 0 => Resolved::Use(GpuUse::None, None, Some(Scheme::NvidiaSharing)),
            // `nvidia.com/gpu` anywhere else is a whole GPU.
            _ => plain::Plain.resolve_pod(pod, node),
        }
    }
}

/// What a sharing node advertises.
#[derive(Debug, PartialEq)]
struct Inventory {
    /// Physical GPUs.
    gpus: u64,
    /// Replicas per GPU (≥ 2).
    replicas: u32,
    /// The resource the replicas are advertised as.
    resource: &'static str,
}

/// The node label `key`, trimmed.
fn label<'a>(node: &'a NodeInput<'_>, key: &str) -> Option<&'a str> {
    node.obj
        .metadata
        .labels
        .as_ref()?
        .get(key)
        .map(|v| v.trim())
}

/// Reads the labels and the allocatable; every contradiction is an error that says which.
fn read(node: &NodeInput<'_>) -> Result<Inventory, String> {
    let strategy = label(node, GPU_SHARING_STRATEGY_LABEL);
    let raw = label(node, GPU_REPLICAS_LABEL).ok_or_else(|| {
        format!(
            "GPUs shared without a {GPU_REPLICAS_LABEL} label: the size of a replica is unknown"
        )
    })?;
    let replicas: u64 = raw.parse().map_err(|_| {
        format!(
            "{GPU_REPLICAS_LABEL} {:?} is not a positive integer",
            super::trunc(raw)
        )
    })?;
    if replicas < 2 {
        return Err(format!(
            "{GPU_REPLICAS_LABEL} is {replicas}, yet the node shares its GPUs ({})",
            match strategy {
                Some(s) => format!("{GPU_SHARING_STRATEGY_LABEL} {}", super::trunc(s)),
                None => format!("{NVIDIA_GPU_SHARED} in its allocatable"),
            }
        ));
    }
    if replicas > MAX_REPLICAS {
        return Err(format!(
            "{GPU_REPLICAS_LABEL} {replicas} is more than {MAX_REPLICAS} replicas per GPU"
        ));
    }
    // Older GPU feature discovery wrote no strategy label; it only time-sliced.
    if let Some(s) = strategy
        && !matches!(s, "time-slicing" | "mps")
    {
        return Err(format!(
            "{GPU_SHARING_STRATEGY_LABEL} {:?} with {replicas} replicas per GPU (time-slicing or mps expected)",
            super::trunc(s)
        ));
    }
    let count = |res: &str| {
        node.count(res)
            .map_err(|e| format!("allocatable {res}: {e}"))
    };
    let whole = count(NVIDIA_GPU)?.unwrap_or(0);
    let shared = count(NVIDIA_GPU_SHARED)?.unwrap_or(0);
    let (resource, total) = match (whole, shared) {
        (w, s) if w > 0 && s > 0 => {
            return Err(format!(
                "allocatable has both {NVIDIA_GPU} {w} and {NVIDIA_GPU_SHARED} {s}: whole and shared GPUs on one node are not modelled"
            ));
        }
        (_, s) if s > 0 => (NVIDIA_GPU_SHARED, s),
        (w, _) if node.allocatable(NVIDIA_GPU_SHARED).is_some() && w == 0 => (NVIDIA_GPU_SHARED, 0),
        (w, _) => (NVIDIA_GPU, w),
    };
    if total % replicas != 0 {
        return Err(format!(
            "allocatable {resource} {total} is not a multiple of {GPU_REPLICAS_LABEL} {replicas}"
        ));
    }
    let gpus = total / replicas;
    if let Some(c) = label(node, GPU_COUNT_LABEL) {
        let c: u64 = c.parse().map_err(|_| {
            format!(
                "{GPU_COUNT_LABEL} {:?} is not a whole number",
                super::trunc(c)
            )
        })?;
        if c != gpus {
            return Err(format!(
                "{GPU_COUNT_LABEL} {c} disagrees with allocatable {resource} {total} / {replicas} replicas = {gpus} GPUs"
            ));
        }
    }
    Ok(Inventory {
        gpus,
        replicas: replicas as u32,
        resource,
    })
}

/// A bound pod's replicas on a sharing node, with its shape: `k` replicas of 1000 /
/// replicas milli, on at most as many GPUs as the node has.
fn replicas(pod: &PodInput<'_>, n: &Node, ctx: &NodeCtx) -> Resolved {
    let Some((per_gpu, res)) = ctx.replicas else {
        return unknown(UnknownReason::NodeInventory(format!(
            "{} has no readable GPU replicas",
            n.name
        )));
    };
    let other = if res == NVIDIA_GPU {
        NVIDIA_GPU_SHARED
    } else {
        NVIDIA_GPU
    };
    match pod.req.total(other) {
        Ok(0) => {}
        Ok(k) => {
            return unknown(UnknownReason::DisagreesWithRequest(format!(
                "asks for {k} {other}, node {} advertises its GPU replicas as {res}",
                super::trunc(&n.name)
            )));
        }
        Err(r) => return unknown(r),
    }
    let k = match pod.req.total(res) {
        Ok(k) => k,
        Err(r) => return unknown(r),
    };
    if k == 0 {
        return Resolved::Use(GpuUse::None, None, None);
    }
    let k = u32::try_from(k).unwrap_or(u32::MAX);
    let gpus = u32::try_from(n.gpus.len()).unwrap_or(u32::MAX).max(1);
    Resolved::Replicas(
        k,
        GpuShape {
            gpus: k.min(gpus),
            milli: GPU_MILLI / per_gpu.max(2),
        },
    )
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1 as corev1;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    use super::*;

    fn node(labels: &[(&str, &str)], alloc: &[(&str, &str)]) -> corev1::Node {
        let mut n = corev1::Node::default();
        n.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        n.status = Some(corev1::NodeStatus {
            allocatable: Some(
                alloc
                    .iter()
                    .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                    .collect(),
            ),
            ..Default::default()
        });
        n
    }

    fn input(n: &corev1::Node) -> NodeInput<'_> {
        static EMPTY: BTreeMap<String, String> = BTreeMap::new();
        NodeInput {
            obj: n,
            annotations: &EMPTY,
            koord_devices: None,
            label_mem: None,
            dra: None,
        }
    }

    const TS: (&str, &str) = (GPU_SHARING_STRATEGY_LABEL, "time-slicing");

    #[test]
    fn recognises_sharing_nodes_only() {
        let claims = |labels: &[(&str, &str)], alloc: &[(&str, &str)]| {
            NvidiaSharing.claims_node(&input(&node(labels, alloc)))
        };
        assert!(claims(
            &[TS, (GPU_REPLICAS_LABEL, "4")],
            &[(NVIDIA_GPU, "32")]
        ));
        assert!(claims(
            &[
                (GPU_SHARING_STRATEGY_LABEL, "mps"),
                (GPU_REPLICAS_LABEL, "2")
            ],
            &[]
        ));
        assert!(claims(&[(GPU_REPLICAS_LABEL, "4")], &[]), "older GFD");
        assert!(claims(&[], &[(NVIDIA_GPU_SHARED, "8")]));
        assert!(claims(&[(GPU_REPLICAS_LABEL, "four")], &[]), "unreadable");
        // GFD on an unshared node: replicas 1 (0 with sharing disabled), strategy none.
        for r in ["0", "1"] {
            assert!(!claims(
                &[
                    (GPU_SHARING_STRATEGY_LABEL, "none"),
                    (GPU_REPLICAS_LABEL, r),
                    (GPU_COUNT_LABEL, "8")
                ],
                &[(NVIDIA_GPU, "8")]
            ));
        }
        assert!(!claims(&[], &[(NVIDIA_GPU, "8")]));
    }

    #[test]
    fn reads_physical_gpus_and_replicas() {
        let r =
            |labels: &[(&str, &str)], alloc: &[(&str, &str)]| read(&input(&node(labels, alloc)));
        let ts = [TS, (GPU_REPLICAS_LABEL, "4"), (GPU_COUNT_LABEL, "8")];
        assert_eq!(
            r(&ts, &[(NVIDIA_GPU, "32")]),
            Ok(Inventory {
                gpus: 8,
                replicas: 4,
                resource: NVIDIA_GPU
            })
        );
        // renameByDefault: nvidia.com/gpu is 0, the replicas are nvidia.com/gpu.shared.
        assert_eq!(
            r(&ts, &[(NVIDIA_GPU, "0"), (NVIDIA_GPU_SHARED, "32")]),
            Ok(Inventory {
                gpus: 8,
                replicas: 4,
                resource: NVIDIA_GPU_SHARED
            })
        );
        // No count label: allocatable / replicas.
        assert_eq!(
            r(&[TS, (GPU_REPLICAS_LABEL, "4")], &[(NVIDIA_GPU, "32")]).map(|i| i.gpus),
            Ok(8)
        );
        assert_eq!(
            r(
                &[
                    (GPU_SHARING_STRATEGY_LABEL, "mps"),
                    (GPU_REPLICAS_LABEL, "10")
                ],
                &[(NVIDIA_GPU, "20")]
            )
            .map(|i| (i.gpus, i.replicas)),
            Ok((2, 10))
        );
    }

    #[test]
    fn contradictions_are_errors_that_say_which() {
        let r = |labels: &[(&str, &str)], alloc: &[(&str, &str)]| {
            read(&input(&node(labels, alloc))).unwrap_err()
        };
        let gpu32 = [(NVIDIA_GPU, "32")];
        for (labels, alloc, says) in [
            (vec![TS], &gpu32[..], "without a nvidia.com/gpu.replicas"),
            (
                vec![TS, (GPU_REPLICAS_LABEL, "four")],
                &gpu32[..],
                "not a positive integer",
            ),
            (
                vec![TS, (GPU_REPLICAS_LABEL, "-4")],
                &gpu32[..],
                "not a positive integer",
            ),
            (vec![TS, (GPU_REPLICAS_LABEL, "1")], &gpu32[..], "is 1, yet"),
            (vec![TS, (GPU_REPLICAS_LABEL, "0")], &gpu32[..], "is 0, yet"),
            (
                vec![TS, (GPU_REPLICAS_LABEL, "1001")],
                &gpu32[..],
                "more than 1000",
            ),
            (
                vec![
                    (GPU_SHARING_STRATEGY_LABEL, "none"),
                    (GPU_REPLICAS_LABEL, "4"),
                ],
                &gpu32[..],
                "time-slicing or mps expected",
            ),
            (
                vec![TS, (GPU_REPLICAS_LABEL, "3")],
                &gpu32[..],
                "not a multiple",
            ),
            (
                vec![TS, (GPU_REPLICAS_LABEL, "4"), (GPU_COUNT_LABEL, "4")],
                &gpu32[..],
                "disagrees with allocatable",
            ),
            (
                vec![TS, (GPU_REPLICAS_LABEL, "4"), (GPU_COUNT_LABEL, "eight")],
                &gpu32[..],
                "not a whole number",
            ),
            (
                vec![TS, (GPU_REPLICAS_LABEL, "4")],
                &[(NVIDIA_GPU, "4"), (NVIDIA_GPU_SHARED, "16")][..],
                "whole and shared",
            ),
            (
                vec![TS, (GPU_REPLICAS_LABEL, "4")],
                &[(NVIDIA_GPU, "1.5")][..],
                "allocatable nvidia.com/gpu",
            ),
            (
                vec![],
                &[(NVIDIA_GPU_SHARED, "32")][..],
                "without a nvidia.com/gpu.replicas",
            ),
        ] {
            let e = r(&labels, alloc);
            assert!(e.contains(says), "{labels:?} {alloc:?}: {e}");
        }
    }
}
