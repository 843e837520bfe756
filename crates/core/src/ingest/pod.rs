//! The model's pods from their compact form: the fields the planner reads (shared label
//! maps, kept annotations, scheduler), their GPU allocation as the first adapter that
//! recognises the pod resolves it, and what each active pod charges its node.
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::adapters::{ADAPTERS, DraPodInput, NodeCtx, PodInput, Resolved, unknown};
use crate::compact::CompactPod;
use crate::dra::{Inventory, PodClaims};
use crate::model::*;

use super::{
    DEFAULT_SCHEDULER, GPU_PRODUCT_LABEL, KEPT_ANNOTATIONS, NVIDIA_GPU, NVIDIA_GPU_SHARED,
};

fn models_of(pod: &CompactPod) -> Vec<String> {
    pod.node_selector
        .get(GPU_PRODUCT_LABEL)
        .into_iter()
        .cloned()
        .collect()
}

/// The scheduler a pod names (`default-scheduler` when none); the common names are not
/// copied per pod.
fn scheduler_of(name: Option<&str>) -> Cow<'static, str> {
    match name {
        None | Some(DEFAULT_SCHEDULER) => Cow::Borrowed(DEFAULT_SCHEDULER),
        Some(gpu_defrag_api::v1alpha1::BINPACK_SCHEDULER) => {
            Cow::Borrowed(gpu_defrag_api::v1alpha1::BINPACK_SCHEDULER)
        }
        Some(other) => Cow::Owned(other.to_string()),
    }
}

/// The pods' label maps, one shared map per distinct set: the replicas of a workload have
/// the same labels, and a copy per pod is most of what building the model allocates.
pub(super) struct LabelSets<'p> {
    sets: HashMap<&'p BTreeMap<String, String>, Arc<BTreeMap<String, String>>>,
    empty: Arc<BTreeMap<String, String>>,
}

impl<'p> LabelSets<'p> {
    pub(super) fn with_capacity(pods: usize) -> Self {
        LabelSets {
            sets: HashMap::with_capacity(pods),
            empty: Arc::default(),
        }
    }

    fn of(&mut self, labels: &'p BTreeMap<String, String>) -> Arc<BTreeMap<String, String>> {
        if labels.is_empty() {
            return self.empty.clone();
        }
        self.sets
            .entry(labels)
            .or_insert_with(|| Arc::new(labels.clone()))
            .clone()
    }
}

pub(super) fn base_pod<'p>(
    p: &'p CompactPod,
    node_index: &HashMap<&str, usize>,
    label_sets: &mut LabelSets<'p>,
) -> Pod {
    let req = &p.requests;
    let node_name = p.node_name.clone().filter(|n| !n.is_empty());
    let node = node_name
        .as_deref()
        .and_then(|n| node_index.get(n).copied());
    Pod {
        namespace: p.namespace.clone(),
        name: p.name.clone(),
        uid: p.uid.clone(),
        node,
        node_name,
        phase: p.phase,
        labels: label_sets.of(&p.labels),
        // A pod has few annotations: each is looked up in the short list.
        annotations: p
            .annotations
            .iter()
            .filter(|(k, _)| KEPT_ANNOTATIONS.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        gpu: GpuUse::None,
        shape: None,
        scheme: None,
        cpu: req.cpu,
        mem: req.mem,
        priority: p.priority.unwrap_or(0),
        priority_class: p.priority_class_name.clone(),
        owner: p.controller.clone(),
        workload: None,
        gang: None,
        started: p.started,
        unschedulable_since: p.unschedulable_since,
        nominated: p.nominated_node.clone(),
        ready: p.ready,
        deleting: p.deleting,
        mirror: p.annotations.contains_key("kubernetes.io/config.mirror"),
        scheduler: scheduler_of(p.scheduler_name.as_deref()),
        local_storage: p.local_storage,
        pvc: p.pvc,
        ephemeral_volume: p.ephemeral_volume,
        constraints: p.constraints.clone(),
        resource_claims: !p.claims.spec.is_empty(),
        claim_source: ClaimSource::None,
        node_selector: p.node_selector.clone(),
        affinity: p.affinity.clone(),
        tolerations: p.tolerations.clone(),
        models: models_of(p),
    }
}

/// A pod's allocation: resolved by the first adapter that recognises the pod.
fn resolve(pod: &PodInput<'_>, node: Option<(&Node, &NodeCtx)>) -> Resolved {
    match ADAPTERS.iter().find(|a| a.claims_pod(pod)) {
        Some(a) => a.resolve_pod(pod, node),
        None => Resolved::Use(GpuUse::None, None, None),
    }
}

/// A pod's allocation as its requests, its node's inventory and its adapter give it
/// (`node`: the pod's node and its context; `dra_ext`: it requests DRA-backed extended
/// resources).
pub(super) fn resolve_allocation(
    p: &CompactPod,
    pod: &Pod,
    node: Option<(&Node, &NodeCtx)>,
    active: bool,
    claims: &PodClaims,
    dra_ext: bool,
    inv: &Inventory,
) -> Resolved {
    let (req, annotations) = (&p.requests, &p.annotations);
    // A pod whose requests cannot be read is unknown, whatever its records say.
    if let Some(bad) = req.unreadable() {
        unknown(UnknownReason::BadQuantity(bad.to_string()))
    } else if let Some(e) = node.and_then(|(_, c)| c.inventory_error.clone()) {
        if active
            && (req.has_shared()
                || req.has(NVIDIA_GPU)
                || req.has(NVIDIA_GPU_SHARED)
                || claims.any()
                || dra_ext
                || !annotations.is_empty())
        {
            unknown(UnknownReason::NodeInventory(e))
        } else {
            Resolved::Use(GpuUse::None, None, None)
        }
    } else {
        let input = PodInput {
            pod,
            req,
            annotations,
            dra: inv.present().then_some(DraPodInput {
                inv,
                claims,
                node_is_dra: node.is_some_and(|(n, _)| n.scheme == Scheme::Dra),
            }),
        };
        resolve(&input, if active { node } else { None })
    }
}

/// Writes a resolved allocation into the pod; KAI fractions and NVIDIA-sharing replicas
/// are noted (with the pod's index `at`) for the passes over all pods.
pub(super) fn record_resolved(
    pod: &mut Pod,
    resolved: Resolved,
    active: bool,
    at: usize,
    kai: &mut Vec<(usize, String, Milli)>,
    replicas: &mut Vec<(usize, u32)>,
) {
    match resolved {
        Resolved::Use(u, shape, scheme) => {
            pod.gpu = if active { u } else { GpuUse::None };
            pod.shape = shape;
            pod.scheme = scheme;
        }
        Resolved::Kai(g, m) => {
            pod.shape = Some(GpuShape { gpus: 1, milli: m });
            kai.push((at, g, m));
        }
        Resolved::Replicas(k, shape) => {
            pod.shape = Some(shape);
            pod.scheme = Some(Scheme::NvidiaSharing);
            if active {
                replicas.push((at, k));
            }
        }
    }
}

/// Removes DRA-backed extended resources from the pod's other resources.
pub(super) fn drop_dra_extended(pod: &mut Pod, inv: &Inventory) {
    // DRA-backed extended resources are the claims' (the scheduler checks them
    // against ResourceSlices, not against the node's allocatable).
    if inv.present()
        && let Some(c) = pod.constraints.as_mut()
    {
        c.resources
            .retain(|(k, _)| !inv.extended().any(|(name, _)| name == k));
    }
}

/// Adds an active pod's CPU, memory, pod slot and other resources to its node's use.
pub(super) fn charge_node(n: &mut Node, pod: &Pod) {
    n.cpu_used = n.cpu_used.saturating_add(pod.cpu);
    n.mem_used = n.mem_used.saturating_add(pod.mem);
    n.pods_used += 1;
    if let Some(c) = &pod.constraints {
        crate::model::add_resources(&mut n.extra_used, &c.resources);
    }
}
