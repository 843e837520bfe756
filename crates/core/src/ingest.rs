//! From Kubernetes objects to the normalised [`Cluster`]: each node and pod goes to the first
//! allocation adapter (one per GPU-sharing scheme, in a fixed precedence order) that
//! recognises it, which reads its records through [`crate::formats`]; then the consistency
//! checks across pods.
//!
//! Rule: a pod whose GPU record is missing, malformed or contradicts its requests, its
//! node's inventory or other pods' records becomes [`GpuUse::Unknown`]; its node is never
//! drained. Nothing here panics on any input.
use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1 as corev1;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::resource::v1::{DeviceClass, DeviceTaintRule, ResourceClaim, ResourceSlice};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::compact::CompactPod;
use crate::dra::{Inventory, PodClaims};
use crate::model::*;
use crate::workload::{self, ControllerKind, ControllerObject, Listed};

mod node;
mod notes;
mod pod;
mod uses;

use node::{build_nodes, index_nodes, koord_devices_by_node};
use notes::{dra_notes, unchecked_notes};
use pod::{
    LabelSets, base_pod, charge_node, drop_dra_extended, record_resolved, resolve_allocation,
};
use uses::{apply_replicas, apply_uses};

pub use crate::adapters::{
    ALIYUN_GPU_COUNT, ALIYUN_GPU_MEM, ALIYUN_MEM_IDX, GPU_COUNT_LABEL, GPU_MEMORY_LABEL,
    GPU_PRODUCT_LABEL, GPU_REPLICAS_LABEL, GPU_SHARING_STRATEGY_LABEL, HAMI_NODE_REGISTER,
    HAMI_POD_ALLOCATED, KAI_FRACTION, KAI_GROUP, KAI_RESERVATION_NS, KOORD_DEVICE_ALLOCATED,
    KOORD_GPU_CORE, NVIDIA_GPU, NVIDIA_GPU_SHARED, VOLCANO_GPU_INDEX, VOLCANO_GPU_MEMORY,
    VOLCANO_GPU_NUMBER, VOLCANO_NODE_REGISTER, VOLCANO_VGPU_IDS, hami_pod_gpus,
};

/// The scheduler a pod without `spec.schedulerName` gets (the API server's default).
pub const DEFAULT_SCHEDULER: &str = "default-scheduler";
/// The bin-packing second scheduler of `config/scheduler`.
pub use gpu_defrag_api::v1alpha1::BINPACK_SCHEDULER;
/// Kubernetes' ReplicaSet scale-down cost; gpu-defrag reads it as a move cost.
pub const POD_DELETION_COST: &str = "controller.kubernetes.io/pod-deletion-cost";
/// Cluster Autoscaler's opt-out (`"false"`: never evicted).
pub const SAFE_TO_EVICT: &str = "cluster-autoscaler.kubernetes.io/safe-to-evict";
/// Koordinator's eviction cost (int32; its maximum means "never evict").
pub const KOORD_EVICTION_COST: &str = "scheduling.koordinator.sh/eviction-cost";
/// Start-up taints: a node carrying one is still joining and receives no planned pod.
pub const STARTUP_TAINTS: &[&str] = &[
    "node.kubernetes.io/not-ready",
    "node.kubernetes.io/unreachable",
    "node.kubernetes.io/network-unavailable",
    "node.cloudprovider.kubernetes.io/uninitialized",
    "node.cluster.x-k8s.io/uninitialized",
    "karpenter.sh/unregistered",
];
/// Annotations copied into the model (the planner reads them).
const KEPT_ANNOTATIONS: &[&str] = &[
    gpu_defrag_api::DO_NOT_DISRUPT,
    gpu_defrag_api::KARPENTER_DO_NOT_DISRUPT,
    gpu_defrag_api::DESCHEDULER_PREFER_NO_EVICTION,
    POD_DELETION_COST,
    SAFE_TO_EVICT,
    KOORD_EVICTION_COST,
    "kubernetes.io/config.mirror",
    "kubernetes.io/config.source",
];

/// Kubernetes objects that make up a snapshot.
#[derive(Debug, Default, Clone)]
pub struct Objects {
    /// Nodes.
    pub nodes: Vec<corev1::Node>,
    /// Pods.
    pub pods: Vec<corev1::Pod>,
    /// PodDisruptionBudgets.
    pub pdbs: Vec<PodDisruptionBudget>,
    /// Koordinator `Device` objects (raw JSON).
    pub devices: Vec<serde_json::Value>,
    /// ReplicaSets, StatefulSets and Jobs (metadata): the pods' owner chains.
    pub controllers: Vec<ControllerObject>,
    /// Namespaces (metadata): their `gpu-defrag.io/do-not-disrupt` opt-out.
    pub namespaces: Vec<ObjectMeta>,
    /// Volcano, KAI and Kubernetes (`scheduling.k8s.io`) PodGroup objects (raw JSON).
    pub pod_groups: Vec<serde_json::Value>,
    /// DRA `ResourceSlice`s (`resource.k8s.io/v1`).
    pub resource_slices: Vec<ResourceSlice>,
    /// DRA `ResourceClaim`s.
    pub resource_claims: Vec<ResourceClaim>,
    /// DRA `DeviceClass`es.
    pub device_classes: Vec<DeviceClass>,
    /// DRA `DeviceTaintRule`s.
    pub device_taint_rules: Vec<DeviceTaintRule>,
    /// Which of these kinds the input lists in full.
    pub listed: Listed,
}

pub use crate::compact::label_selector;

/// Builds the normalised cluster. `now` is the instant ages are measured from.
pub fn build_cluster(objs: &Objects, now: Option<DateTime<Utc>>) -> Cluster {
    let pods: Vec<CompactPod> = objs.pods.iter().map(CompactPod::of).collect();
    build_cluster_from(
        ObjectRefs {
            nodes: objs.nodes.iter().collect(),
            pods: pods.iter().collect(),
            pdbs: objs.pdbs.iter().collect(),
            devices: &objs.devices,
            controllers: objs
                .controllers
                .iter()
                .map(|c| (c.kind, &c.metadata))
                .collect(),
            namespaces: objs.namespaces.iter().collect(),
            pod_groups: &objs.pod_groups,
            resource_slices: objs.resource_slices.iter().collect(),
            resource_claims: objs.resource_claims.iter().collect(),
            device_classes: objs.device_classes.iter().collect(),
            device_taint_rules: objs.device_taint_rules.iter().collect(),
            listed: objs.listed,
        },
        now,
    )
}

/// Borrowed [`Objects`]: what a watch cache holds (`Arc`s), without copying the objects.
#[derive(Debug, Default)]
pub struct ObjectRefs<'a> {
    /// Nodes.
    pub nodes: Vec<&'a corev1::Node>,
    /// Pods, as the model reads them.
    pub pods: Vec<&'a CompactPod>,
    /// PodDisruptionBudgets.
    pub pdbs: Vec<&'a PodDisruptionBudget>,
    /// Koordinator `Device` objects (raw JSON).
    pub devices: &'a [serde_json::Value],
    /// ReplicaSets, StatefulSets and Jobs (metadata).
    pub controllers: Vec<(ControllerKind, &'a ObjectMeta)>,
    /// Namespaces (metadata).
    pub namespaces: Vec<&'a ObjectMeta>,
    /// Volcano, KAI and Kubernetes (`scheduling.k8s.io`) PodGroup objects (raw JSON).
    pub pod_groups: &'a [serde_json::Value],
    /// DRA `ResourceSlice`s.
    pub resource_slices: Vec<&'a ResourceSlice>,
    /// DRA `ResourceClaim`s.
    pub resource_claims: Vec<&'a ResourceClaim>,
    /// DRA `DeviceClass`es.
    pub device_classes: Vec<&'a DeviceClass>,
    /// DRA `DeviceTaintRule`s.
    pub device_taint_rules: Vec<&'a DeviceTaintRule>,
    /// Which kinds are listed in full.
    pub listed: Listed,
}

/// [`build_cluster`] from borrowed objects (the operator's caches: a copy of 6,000 pods per
/// reconcile would double its memory).
pub fn build_cluster_from(mut objs: ObjectRefs<'_>, now: Option<DateTime<Utc>>) -> Cluster {
    sort_pod_refs(&mut objs.pods);
    let koord = koord_devices_by_node(objs.devices);
    let inv = Inventory::build(
        &objs.resource_slices,
        &objs.resource_claims,
        &objs.device_classes,
        &objs.device_taint_rules,
    );
    let (mut nodes, ctxs) = build_nodes(&objs.nodes, &koord, &inv);
    let node_index = index_nodes(&objs.nodes, &nodes);

    let index = workload::Index::new(&objs.controllers, objs.pod_groups, objs.listed);
    let mut pods = Vec::with_capacity(objs.pods.len());
    let mut kai: Vec<(usize, String, Milli)> = Vec::new(); // (pod index, group, milli)
    let mut replicas: Vec<(usize, u32)> = Vec::new(); // (pod index, replicas held)
    let mut dra_pods = 0usize; // pods with DRA claims or DRA-backed extended resources
    let mut label_sets = LabelSets::with_capacity(objs.pods.len());
    let no_claims = PodClaims::default();
    for &p in &objs.pods {
        let mut pod = base_pod(p, &node_index, &mut label_sets);
        pod.workload = index.workload(&pod.namespace, pod.owner.as_ref(), &pod.labels);
        pod.gang = index.gang(
            &pod.namespace,
            &pod.labels,
            &p.annotations,
            p.scheduling_group.as_deref(),
        );
        let node = pod.node.map(|i| (&nodes[i], &ctxs[i]));
        let active = pod.is_active_bound() && pod.node.is_some();
        let claims = if inv.present() { &p.claims } else { &no_claims };
        let dra_ext = inv.present()
            && inv
                .extended()
                .any(|(name, _)| p.requests.total(name).is_ok_and(|n| n > 0));
        pod.claim_source = inv.claim_source(&pod.namespace, claims, dra_ext);
        if claims.any() || dra_ext {
            dra_pods += 1;
        }
        let resolved = resolve_allocation(p, &pod, node, active, claims, dra_ext, &inv);
        record_resolved(
            &mut pod,
            resolved,
            active,
            pods.len(),
            &mut kai,
            &mut replicas,
        );
        drop_dra_extended(&mut pod, &inv);
        if active && let Some(i) = pod.node {
            charge_node(&mut nodes[i], &pod);
        }
        pods.push(pod);
    }
    let per_gpu: Vec<Option<u32>> = ctxs.iter().map(|c| c.replicas.map(|r| r.0)).collect();
    apply_uses(&mut nodes, &mut pods, &kai);
    apply_replicas(&mut nodes, &mut pods, &replicas, &per_gpu);
    let pdbs = objs.pdbs.iter().copied().map(pdb_of).collect();
    let mut unchecked = unchecked_notes(&pods, &objs.listed);
    unchecked.extend(dra_notes(&inv, dra_pods, objs.listed.device_taint_rules));
    let mut c = Cluster {
        nodes,
        pods,
        pdbs,
        now,
        protected_namespaces: workload::protected_namespaces(objs.namespaces.iter().copied()),
        unchecked,
        dra_device_fences: objs.listed.device_taint_rules,
    };
    // kubectl lists pods in this order already; checking is cheaper than sorting.
    fn key(p: &Pod) -> (&str, &str) {
        (&p.namespace, &p.name)
    }
    if !c.pods.is_sorted_by(|a, b| key(a) <= key(b)) {
        c.pods.sort_by(|a, b| key(a).cmp(&key(b)));
    }
    c
}

/// Puts the pod references in (namespace, name) order, the model's pod order.
fn sort_pod_refs(pods: &mut Vec<&CompactPod>) {
    // The model's pods are in (namespace, name) order: the references are put in that
    // order (a stable sort, as sorting the built pods was), not the built pods, which are
    // large to move (a watch cache gives its objects in hash order).
    fn meta_key(p: &CompactPod) -> (&str, &str) {
        (&p.namespace, &p.name)
    }
    if !pods.is_sorted_by(|a, b| meta_key(a) <= meta_key(b)) {
        // The keys read once, next to their references: comparing them then touches no
        // pod object.
        let mut keyed: Vec<((&str, &str), &CompactPod)> =
            pods.iter().map(|&p| (meta_key(p), p)).collect();
        keyed.sort_by(|a, b| a.0.cmp(&b.0));
        pods.clear();
        pods.extend(keyed.into_iter().map(|(_, p)| p));
    }
}

fn pdb_of(p: &PodDisruptionBudget) -> Pdb {
    Pdb {
        namespace: p.metadata.namespace.clone().unwrap_or_default(),
        name: p.metadata.name.clone().unwrap_or_default(),
        selector: p
            .spec
            .as_ref()
            .and_then(|s| s.selector.as_ref())
            .map(label_selector),
        disruptions_allowed: p
            .status
            .as_ref()
            .and_then(|s| s.disruptions_allowed)
            .map(i64::from)
            .unwrap_or(0),
        stale: match (
            p.metadata.generation,
            p.status.as_ref().and_then(|s| s.observed_generation),
        ) {
            (Some(g), Some(o)) => o < g,
            (Some(_), None) => true,
            (None, _) => false,
        },
    }
}
