//! The model's nodes from Node objects: each node's scheme, GPUs and allocatable, read by
//! the first allocation adapter that recognises it (with its Koordinator `Device` and DRA
//! inventory), and the name index the pods are bound through.
use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1 as corev1;

use crate::adapters::{self, ADAPTERS, NodeCtx, NodeInput, alloc_quantity};
use crate::compact::to_chrono;
use crate::dra::{self, Inventory};
use crate::formats::{self, FormatError};
use crate::model::*;

use super::{GPU_MEMORY_LABEL, GPU_PRODUCT_LABEL, STARTUP_TAINTS};

fn build_node(
    node: &corev1::Node,
    koord: Option<&Result<Vec<formats::KoordDevice>, FormatError>>,
    dra: Option<&dra::NodeDevices>,
) -> (Node, NodeCtx) {
    let meta = &node.metadata;
    let name = meta.name.clone().unwrap_or_default();
    let labels = meta.labels.clone().unwrap_or_default();
    let empty = BTreeMap::new();
    let annotations = meta.annotations.as_ref().unwrap_or(&empty);
    let spec = node.spec.clone().unwrap_or_default();
    let status = node.status.as_ref();
    let ready_condition = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready" && c.status == "True"));
    let ready = ready_condition.is_some();
    let ready_since = ready_condition.and_then(|c| {
        c.last_transition_time
            .as_ref()
            .or(meta.creation_timestamp.as_ref())
            .and_then(to_chrono)
    });
    let starting = spec
        .taints
        .iter()
        .flatten()
        .find(|t| STARTUP_TAINTS.contains(&t.key.as_str()))
        .map(|t| format!("start-up taint {}", t.key));
    let taints = spec
        .taints
        .unwrap_or_default()
        .into_iter()
        .map(|t| Taint {
            key: t.key,
            value: t.value.unwrap_or_default(),
            effect: t.effect,
        })
        .collect();
    // Unreadable cpu, memory or pods count as 0 and mark the node (see below).
    let mut unreadable: Option<String> = None;
    let mut q = |n: &str, f: fn(&str) -> Result<u64, FormatError>| match alloc_quantity(node, n) {
        None => 0,
        Some(v) => f(v).unwrap_or_else(|e| {
            unreadable.get_or_insert_with(|| format!("allocatable {n}: {e}"));
            0
        }),
    };
    let cpu_alloc = q("cpu", formats::quantity_to_milli);
    let mem_alloc = q("memory", formats::quantity_to_bytes);
    let pods_alloc = q("pods", formats::quantity_to_count);
    let label_model = labels.get(GPU_PRODUCT_LABEL).cloned();
    let label_mem = labels
        .get(GPU_MEMORY_LABEL)
        .and_then(|v| v.trim().parse::<u64>().ok());
    let mut n = Node {
        name,
        labels,
        taints,
        ready,
        unschedulable: spec.unschedulable.unwrap_or(false),
        model: label_model,
        scheme: Scheme::Plain,
        granularity: Granularity::Node,
        gpus: Vec::new(),
        cpu_alloc,
        mem_alloc,
        pods_alloc,
        cpu_used: 0,
        mem_used: 0,
        pods_used: 0,
        mig: Vec::new(),
        unknown_pods: 0,
        inconsistent: None,
        ready_since,
        starting,
        dra: Vec::new(),
        extra_alloc: extra_allocatable(node),
        extra_used: Vec::new(),
    };
    let mut ctx = NodeCtx::default();
    let input = NodeInput {
        obj: node,
        annotations,
        koord_devices: koord,
        label_mem,
        dra,
    };
    // MIG pools (mixed strategy) are reported separately from the milli metric.
    adapters::read_mig_pools(&input, &mut n, &mut ctx);
    // The node's scheme: the first adapter that recognises it.
    if let Some(a) = ADAPTERS.iter().find(|a| a.claims_node(&input)) {
        if let Some(s) = a.scheme() {
            n.scheme = s;
        }
        a.read_node(&input, &mut n, &mut ctx);
    }
    // A node whose inventory cannot be read is neither drained nor given pods. An unreadable
    // cpu, memory or pod count leaves its GPU records readable: only the node is marked.
    if let Some(e) = ctx.inventory_error.as_ref().or(unreadable.as_ref()) {
        n.inconsistent = Some(format!("node inventory unreadable: {e}"));
    }
    (n, ctx)
}

/// A node's allocatable of the resources other than CPU, memory, pods and the GPU
/// resources the adapters read, milli-units by name (an unreadable one is left out: no pod
/// requesting it fits there).
fn extra_allocatable(node: &corev1::Node) -> Vec<(String, u64)> {
    node.status
        .as_ref()
        .and_then(|s| s.allocatable.as_ref())
        .into_iter()
        .flatten()
        .filter(|(k, _)| {
            !matches!(k.as_str(), "cpu" | "memory" | "pods") && !crate::adapters::is_gpu_resource(k)
        })
        .filter_map(|(k, v)| {
            let m = formats::quantity::parse_milli(formats::keys::QUANTITY, &v.0, true).ok()?;
            Some((k.clone(), u64::try_from(m).unwrap_or(u64::MAX)))
        })
        .collect()
}

/// Koordinator Device objects by node name: their devices, or why they cannot be read.
pub(super) fn koord_devices_by_node(
    devices: &[serde_json::Value],
) -> HashMap<String, Result<Vec<formats::KoordDevice>, FormatError>> {
    let mut koord: HashMap<String, Result<Vec<formats::KoordDevice>, FormatError>> = HashMap::new();
    for d in devices {
        match formats::parse_koord_device_object(d) {
            Ok((name, devs)) => {
                koord.insert(name, Ok(devs));
            }
            Err(e) => {
                if let Some(name) = d.pointer("/metadata/name").and_then(|v| v.as_str()) {
                    koord.insert(name.to_string(), Err(e));
                }
            }
        }
    }
    koord
}

/// The model's nodes (named ones, by name, without duplicates) and their adapters' context.
pub(super) fn build_nodes(
    objs: &[&corev1::Node],
    koord: &HashMap<String, Result<Vec<formats::KoordDevice>, FormatError>>,
    inv: &Inventory,
) -> (Vec<Node>, Vec<NodeCtx>) {
    let mut built: Vec<(Node, NodeCtx)> = objs
        .iter()
        .copied()
        .filter(|n| n.metadata.name.as_deref().is_some_and(|s| !s.is_empty()))
        .map(|n| {
            let name = n.metadata.name.as_deref().unwrap_or_default();
            build_node(n, koord.get(name), inv.nodes.get(name))
        })
        .collect();
    built.sort_by(|a, b| a.0.name.cmp(&b.0.name));
    built.dedup_by(|a, b| a.0.name == b.0.name);
    built.into_iter().unzip()
}

/// Node name → index in `nodes`, for the pods (a hash look-up each: names share long
/// prefixes).
pub(super) fn index_nodes<'a>(
    objs: &[&'a corev1::Node],
    nodes: &[Node],
) -> HashMap<&'a str, usize> {
    objs.iter()
        .filter_map(|n| n.metadata.name.as_deref())
        .filter_map(|name| {
            let i = nodes.binary_search_by(|x| x.name.as_str().cmp(name)).ok()?;
            Some((name, i))
        })
        .collect()
}
