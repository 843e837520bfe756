//! From Kubernetes objects to the normalised [`Cluster`]: each node and pod goes to the first
//! allocation adapter (one per GPU-sharing scheme, in a fixed precedence order) that
//! recognises it, which reads its records through [`crate::formats`]; then the consistency
//! checks across pods.
//!
//! Rule: a pod whose GPU record is missing, malformed or contradicts its requests, its
//! node's inventory or other pods' records becomes [`GpuUse::Unknown`]; its node is never
//! drained. Nothing here panics on any input.
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1 as corev1;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::resource::v1::{DeviceClass, DeviceTaintRule, ResourceClaim, ResourceSlice};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::adapters::{
    self, ADAPTERS, DraPodInput, NodeCtx, NodeInput, PodInput, Resolved, alloc_quantity, unknown,
};
use crate::compact::{CompactPod, to_chrono};
use crate::dra::{self, Inventory, PodClaims};
use crate::formats::{self, FormatError};
use crate::model::*;
use crate::workload::{self, ControllerKind, ControllerObject, Listed};

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

fn models_of(pod: &CompactPod) -> Vec<String> {
    pod.node_selector
        .get(GPU_PRODUCT_LABEL)
        .into_iter()
        .cloned()
        .collect()
}

pub use crate::compact::label_selector;

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
struct LabelSets<'p> {
    sets: HashMap<&'p BTreeMap<String, String>, Arc<BTreeMap<String, String>>>,
    empty: Arc<BTreeMap<String, String>>,
}

impl<'p> LabelSets<'p> {
    fn with_capacity(pods: usize) -> Self {
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

fn base_pod<'p>(
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

/// Koordinator Device objects by node name: their devices, or why they cannot be read.
fn koord_devices_by_node(
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
fn build_nodes(
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
fn index_nodes<'a>(objs: &[&'a corev1::Node], nodes: &[Node]) -> HashMap<&'a str, usize> {
    objs.iter()
        .filter_map(|n| n.metadata.name.as_deref())
        .filter_map(|name| {
            let i = nodes.binary_search_by(|x| x.name.as_str().cmp(name)).ok()?;
            Some((name, i))
        })
        .collect()
}

/// A pod's allocation as its requests, its node's inventory and its adapter give it
/// (`node`: the pod's node and its context; `dra_ext`: it requests DRA-backed extended
/// resources).
fn resolve_allocation(
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
fn record_resolved(
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
fn drop_dra_extended(pod: &mut Pod, inv: &Inventory) {
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
fn charge_node(n: &mut Node, pod: &Pod) {
    n.cpu_used = n.cpu_used.saturating_add(pod.cpu);
    n.mem_used = n.mem_used.saturating_add(pod.mem);
    n.pods_used += 1;
    if let Some(c) = &pod.constraints {
        crate::model::add_resources(&mut n.extra_used, &c.resources);
    }
}

/// What the input did not let the model check, one sentence each.
fn unchecked_notes(pods: &[Pod], listed: &Listed) -> Vec<String> {
    let mut notes = Vec::new();
    let not_checked = pods
        .iter()
        .filter(|p| {
            p.workload
                .as_ref()
                .is_some_and(|w| w.chain == Chain::NotChecked)
        })
        .count();
    if not_checked > 0 {
        let missing: Vec<&str> = [
            (listed.replica_sets, "replicasets"),
            (listed.stateful_sets, "statefulsets"),
            (listed.jobs, "jobs"),
        ]
        .into_iter()
        .filter(|(l, _)| !l)
        .map(|(_, k)| k)
        .collect();
        notes.push(format!(
            "owner chains of {not_checked} pods not checked: the input has no {} (judged by the pods' own owner references and labels)",
            missing.join(", ")
        ));
    }
    if !listed.namespaces {
        notes.push(
            "namespace opt-outs (gpu-defrag.io/do-not-disrupt on a Namespace) not checked: the input has no namespaces".into(),
        );
    }
    notes
}

/// What the DRA objects of the input did not let the model read, or the planner do
/// (`rules_listed`: DeviceTaintRules are served and readable).
fn dra_notes(inv: &Inventory, dra_pods: usize, rules_listed: bool) -> Vec<String> {
    let mut notes = inv.notes.clone();
    // Without any DRA object, pods with claims keep their `resource-claim` skip.
    if !inv.present() {
        return notes;
    }
    if !rules_listed && !inv.nodes.is_empty() {
        notes.push(
            "DeviceTaintRules are not served (Kubernetes 1.37) or not readable: single GPUs of DRA nodes are not drained by themselves (DRA nodes are drained whole)".into(),
        );
    }
    let (slices, claims, classes) = inv.listed;
    if !slices {
        notes.push(
            "the input has no resourceslices: GPUs published through DRA are not counted".into(),
        );
    }
    if !claims && dra_pods > 0 {
        notes.push(format!(
            "the input has no resourceclaims: the DRA devices of {dra_pods} pods are not known (those pods are unknown on DRA nodes and never moved)"
        ));
    }
    if !classes {
        notes.push(
            "the input has no deviceclasses: extended resources backed by DRA (nvidia.com/gpu through a DeviceClass) are not recognised".into(),
        );
    }
    notes
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

/// Adds every known allocation to its node's GPUs; detects over-commit.
fn apply_uses(nodes: &mut [Node], pods: &mut [Pod], kai: &[(usize, String, Milli)]) {
    let (sums, whole) = device_sums(nodes, pods);
    let (reservations, kai_groups_per_node) = kai_groups_per_node(nodes.len(), pods, kai);
    for (i, node) in nodes.iter_mut().enumerate() {
        // A DRA node's GPU use is its claims' allocations, over-allocation included, read
        // with the inventory (claims whose pods are gone still hold their devices).
        if node.scheme == Scheme::Dra {
            mark_kai_unknown(pods, &kai_groups_per_node[i], || {
                UnknownReason::DisagreesWithRequest("KAI fraction on a dra node".into())
            });
            continue;
        }
        apply_device_sums(node, i, &sums[i], pods);
        if node.granularity == Granularity::Node && node.scheme != Scheme::NvidiaSharing {
            let plain = whole[i].saturating_sub(reservations[i]);
            place_kai_and_whole(node, &kai_groups_per_node[i], plain, pods);
        } else {
            mark_kai_unknown(pods, &kai_groups_per_node[i], || {
                UnknownReason::DisagreesWithRequest(format!(
                    "KAI fraction on a {} node",
                    node.scheme.as_str()
                ))
            });
        }
    }
    for p in pods.iter() {
        if let (Some(i), GpuUse::Unknown(_)) = (p.node, &p.gpu) {
            nodes[i].unknown_pods += 1;
        }
    }
}

/// Per node, the milli each GPU's device records sum to (before capping: over-commit
/// shows) and the whole GPUs node-level pods hold; MIG uses are added to the node's pools
/// here (a profile the node does not offer marks it inconsistent).
fn device_sums(nodes: &mut [Node], pods: &[Pod]) -> (Vec<Vec<u64>>, Vec<u64>) {
    let mut sums: Vec<Vec<u64>> = nodes.iter().map(|n| vec![0; n.gpus.len()]).collect();
    let mut whole: Vec<u64> = vec![0; nodes.len()];
    for p in pods {
        let Some(i) = p.node else { continue };
        match &p.gpu {
            GpuUse::Devices(d) => {
                for (g, m) in d {
                    if let Some(s) = sums[i].get_mut(*g) {
                        *s += u64::from(*m);
                    }
                }
            }
            GpuUse::Whole(w) => whole[i] += u64::from(*w),
            // A DRA node's MIG pools already count every allocated partition.
            GpuUse::Mig(_) if nodes[i].scheme == Scheme::Dra => {}
            GpuUse::Mig(m) => {
                for (prof, c) in m {
                    if let Some(pool) = nodes[i].mig.iter_mut().find(|p| &p.profile == prof) {
                        pool.used += c;
                    } else {
                        nodes[i].inconsistent = Some(format!(
                            "pod uses MIG profile {prof} the node does not offer"
                        ));
                    }
                }
            }
            _ => {}
        }
    }
    (sums, whole)
}

/// A confirmed KAI group on a node: its fractions' milli sum and its members' pod indices.
type KaiGroup = (u64, Vec<usize>);

/// KAI groups confirmed by a reservation pod, per node as (milli sum, member pod indices),
/// and the number of KAI reservation pods per node. Fractions of an unconfirmed group
/// become unknown.
fn kai_groups_per_node(
    node_count: usize,
    pods: &mut [Pod],
    kai: &[(usize, String, Milli)],
) -> (Vec<u64>, Vec<Vec<KaiGroup>>) {
    // KAI groups: each group holds one reserved GPU; fractions share it.
    let mut groups: BTreeMap<(usize, String), KaiGroup> = BTreeMap::new();
    for (pi, g, m) in kai {
        if let Some(n) = pods[*pi].node {
            let e = groups.entry((n, g.clone())).or_default();
            e.0 += u64::from(*m);
            e.1.push(*pi);
        }
    }

    // KAI reservation pods per node, and their groups (one pass; a per-node scan would be
    // quadratic). Only a reservation pod — in the KAI namespace, holding a whole GPU, on
    // the same node — confirms a group: a fraction annotation and group label on a pod
    // are the tenant's own words.
    let mut reservations: Vec<u64> = vec![0; node_count];
    let mut reserved: BTreeSet<(usize, String)> = BTreeSet::new();
    for p in pods.iter() {
        if let Some(i) = p.node
            && p.namespace == KAI_RESERVATION_NS
            && matches!(p.gpu, GpuUse::Whole(_))
        {
            reservations[i] += 1;
            if let Some(g) = p.labels.get(KAI_GROUP) {
                reserved.insert((i, g.clone()));
            }
        }
    }
    let unconfirmed: Vec<usize> = groups
        .iter()
        .filter(|(k, _)| !reserved.contains(k))
        .flat_map(|(_, (_, members))| members.iter().copied())
        .collect();
    let groups: BTreeMap<(usize, String), KaiGroup> = groups
        .into_iter()
        .filter(|(k, _)| reserved.contains(k))
        .collect();
    for pi in unconfirmed {
        let why = format!(
            "KAI fraction of group {} without its reservation pod in {KAI_RESERVATION_NS} on the node",
            pods[pi]
                .labels
                .get(KAI_GROUP)
                .map(String::as_str)
                .unwrap_or("?")
        );
        pods[pi].gpu = GpuUse::Unknown(UnknownReason::Unconfirmed(why));
    }
    let mut per_node: Vec<Vec<KaiGroup>> = vec![Vec::new(); node_count];
    for ((n, _), v) in groups {
        per_node[n].push(v);
    }
    (reservations, per_node)
}

/// Makes every member of the KAI groups unknown, for the reason `why` gives.
fn mark_kai_unknown(pods: &mut [Pod], groups: &[KaiGroup], why: impl Fn() -> UnknownReason) {
    for (_, members) in groups {
        for pi in members {
            pods[*pi].gpu = GpuUse::Unknown(why());
        }
    }
}

/// Sets the node's (node `i`'s) GPU use from its device sums, capped at a whole GPU;
/// over-committed devices mark the node inconsistent and make every pod on them unknown.
fn apply_device_sums(node: &mut Node, i: usize, sums: &[u64], pods: &mut [Pod]) {
    // Over-committed devices: every pod on them becomes unknown.
    let over: Vec<usize> = sums
        .iter()
        .enumerate()
        .filter(|(_, s)| **s > u64::from(GPU_MILLI))
        .map(|(g, _)| g)
        .collect();
    if !over.is_empty() {
        let keys: Vec<&str> = over.iter().map(|g| node.gpus[*g].key.as_str()).collect();
        let msg = format!(
            "records on node {} over-commit GPU {}",
            node.name,
            keys.join(",")
        );
        node.inconsistent = Some(msg.clone());
        for p in pods.iter_mut().filter(|p| p.node == Some(i)) {
            if let GpuUse::Devices(d) = &p.gpu
                && d.iter().any(|(g, _)| over.contains(g))
            {
                p.gpu = GpuUse::Unknown(UnknownReason::Overcommitted(msg.clone()));
            }
        }
    }
    for (g, s) in sums.iter().enumerate() {
        node.gpus[g].used = (*s).min(u64::from(GPU_MILLI)) as Milli;
    }
}

/// On a node-level node, places the confirmed KAI groups (one GPU each, their fractions
/// pinned to it) and then the `plain` whole GPUs of the other pods, marking the node
/// inconsistent when they do not fit.
fn place_kai_and_whole(node: &mut Node, groups: &[KaiGroup], plain: u64, pods: &mut [Pod]) {
    // KAI reservation pods hold one whole GPU per group; the group's fractions
    // share it. Reserved GPUs come first, then the other whole-GPU pods.
    let total = node.gpus.len() as u64;
    if plain + groups.len() as u64 > total {
        node.inconsistent = Some(format!(
            "pods on node {} hold {} GPUs, node has {total}",
            node.name,
            plain + groups.len() as u64
        ));
    }
    let mut g = 0usize;
    for (sum, members) in groups {
        if *sum > u64::from(GPU_MILLI) {
            node.inconsistent = Some(format!(
                "KAI fractions on one GPU of {} sum to {sum}",
                node.name
            ));
            for pi in members {
                pods[*pi].gpu = GpuUse::Unknown(UnknownReason::Overcommitted(format!(
                    "KAI fractions on one GPU of {} sum to {sum}",
                    node.name
                )));
            }
        }
        if g < node.gpus.len() {
            node.gpus[g].used = (*sum).min(u64::from(GPU_MILLI)) as Milli;
            for pi in members {
                if !pods[*pi].is_unknown() {
                    let m = pods[*pi].shape.map(|s| s.milli).unwrap_or(0);
                    pods[*pi].gpu = GpuUse::Devices(vec![(g, m)]);
                    pods[*pi].scheme = Some(Scheme::Plain);
                }
            }
        }
        g += 1;
    }
    for _ in 0..plain {
        if let Some(gpu) = node.gpus.get_mut(g) {
            gpu.used = GPU_MILLI;
        }
        g += 1;
    }
}

/// Places the replicas NVIDIA-sharing pods hold on their nodes' GPUs. The device plugin
/// records no GPU per replica: the model spreads them as its default (distributed)
/// allocation does, each pod on distinct GPUs, least-used GPU first (ties: lowest
/// index). The spread is balanced, so it shows the fewest fully free GPUs the node's
/// replica count allows: a whole GPU is never shown free where a replica might be. More
/// replicas held than the node has make every replica pod on it unknown.
fn apply_replicas(
    nodes: &mut [Node],
    pods: &mut [Pod],
    replicas: &[(usize, u32)],
    per_gpu: &[Option<u32>],
) {
    let mut on_node: Vec<Vec<(usize, u32)>> = vec![Vec::new(); nodes.len()];
    for &(pi, k) in replicas {
        if let Some(n) = pods[pi].node
            && !pods[pi].is_unknown()
        {
            on_node[n].push((pi, k));
        }
    }
    for (i, members) in on_node.iter().enumerate() {
        let (Some(r), false) = (per_gpu[i], members.is_empty()) else {
            continue;
        };
        let node = &mut nodes[i];
        let held: u64 = members.iter().map(|(_, k)| u64::from(*k)).sum();
        let cap = node.gpus.iter().filter(|g| g.healthy).count() as u64 * u64::from(r);
        if held > cap {
            let msg = format!(
                "pods on node {} hold {held} GPU replicas, node has {cap} ({} GPUs × {r})",
                node.name,
                node.gpus.len()
            );
            node.inconsistent = Some(msg.clone());
            for (pi, _) in members {
                pods[*pi].gpu = GpuUse::Unknown(UnknownReason::Overcommitted(msg.clone()));
                node.unknown_pods += 1;
            }
            continue;
        }
        let share = GPU_MILLI / r;
        let len = node.gpus.len();
        let mut count = vec![0u32; len];
        for &(pi, k) in members {
            let mut mine: BTreeMap<usize, Milli> = BTreeMap::new();
            let mut taken = vec![false; len];
            for _ in 0..k {
                let pick = |taken: &[bool]| {
                    (0..len)
                        .filter(|&g| !taken[g] && node.gpus[g].healthy && count[g] < r)
                        .min_by_key(|&g| (count[g], g))
                };
                // More replicas than GPUs with room: the pod's next round.
                let g = match pick(&taken) {
                    Some(g) => g,
                    None => {
                        taken.fill(false);
                        match pick(&taken) {
                            Some(g) => g,
                            None => break,
                        }
                    }
                };
                count[g] += 1;
                taken[g] = true;
                *mine.entry(g).or_default() += share;
            }
            pods[pi].gpu = GpuUse::Devices(mine.into_iter().collect());
        }
        for (g, c) in count.iter().enumerate() {
            node.gpus[g].used = (u64::from(*c) * u64::from(GPU_MILLI) / u64::from(r))
                .min(u64::from(GPU_MILLI)) as Milli;
        }
    }
}
