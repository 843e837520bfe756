//! From Kubernetes objects to the normalised [`Cluster`]: scheme detection per node and
//! pod, allocation records read through [`crate::formats`], consistency checks.
//!
//! Rule: a pod whose GPU record is missing, malformed or contradicts its requests, its
//! node's inventory or other pods' records becomes [`GpuUse::Unknown`]; its node is never
//! drained. Nothing here panics on any input.
use std::collections::{BTreeMap, BTreeSet, HashMap};

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1 as corev1;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::formats::{self, FormatError};
use crate::model::*;
use crate::workload::{self, ControllerKind, ControllerObject, Listed};

/// Resource name of whole NVIDIA GPUs.
pub const NVIDIA_GPU: &str = "nvidia.com/gpu";
/// Node label carrying the GPU model.
pub const GPU_PRODUCT_LABEL: &str = "nvidia.com/gpu.product";
/// Node label carrying per-GPU memory in MiB.
pub const GPU_MEMORY_LABEL: &str = "nvidia.com/gpu.memory";

/// HAMi node inventory annotation.
pub const HAMI_NODE_REGISTER: &str = "hami.io/node-nvidia-register";
/// HAMi pod record.
pub const HAMI_POD_ALLOCATED: &str = "hami.io/vgpu-devices-allocated";
/// Volcano vGPU node inventory annotation.
pub const VOLCANO_NODE_REGISTER: &str = "volcano.sh/node-vgpu-register";
/// Volcano vGPU pod record.
pub const VOLCANO_VGPU_IDS: &str = "volcano.sh/vgpu-ids-new";
/// Koordinator pod record.
pub const KOORD_DEVICE_ALLOCATED: &str = "scheduling.koordinator.sh/device-allocated";
/// Koordinator GPU compute resource (100 per GPU).
pub const KOORD_GPU_CORE: &str = "koordinator.sh/gpu-core";
/// Volcano gpushare pod record.
pub const VOLCANO_GPU_INDEX: &str = "volcano.sh/gpu-index";
/// Volcano gpushare memory resource.
pub const VOLCANO_GPU_MEMORY: &str = "volcano.sh/gpu-memory";
/// Volcano gpushare card count resource.
pub const VOLCANO_GPU_NUMBER: &str = "volcano.sh/gpu-number";
/// Aliyun gpushare memory resource.
pub const ALIYUN_GPU_MEM: &str = "aliyun.com/gpu-mem";
/// Aliyun gpushare card count resource.
pub const ALIYUN_GPU_COUNT: &str = "aliyun.com/gpu-count";
/// Aliyun pod record (device index).
pub const ALIYUN_MEM_IDX: &str = "ALIYUN_COM_GPU_MEM_IDX";
/// KAI fraction annotation.
pub const KAI_FRACTION: &str = "gpu-fraction";
/// KAI group label.
pub const KAI_GROUP: &str = "runai-gpu-group";
/// Namespace of KAI's reservation pods.
pub const KAI_RESERVATION_NS: &str = "kai-resource-reservation";

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
/// Resources of the Koordinator device share: a `device-allocated` record counts only
/// on a pod that requests one of them (or `nvidia.com/gpu`).
const KOORD_RESOURCES: &[&str] = &[
    KOORD_GPU_CORE,
    "koordinator.sh/gpu-memory",
    "koordinator.sh/gpu-memory-ratio",
    "koordinator.sh/gpu.shared",
    "koordinator.sh/gpu",
    NVIDIA_GPU,
];

/// Resources that mean "a share of a GPU": a pod asking for any of them must carry a record.
const SHARED_RESOURCES: &[&str] = &[
    "nvidia.com/gpumem",
    "nvidia.com/gpumem-percentage",
    "nvidia.com/gpucores",
    KOORD_GPU_CORE,
    "koordinator.sh/gpu-memory",
    "koordinator.sh/gpu-memory-ratio",
    "koordinator.sh/gpu.shared",
    "koordinator.sh/gpu",
    VOLCANO_GPU_MEMORY,
    VOLCANO_GPU_NUMBER,
    "volcano.sh/vgpu-number",
    "volcano.sh/vgpu-memory",
    "volcano.sh/vgpu-cores",
    "volcano.sh/vgpu-memory-percentage",
    ALIYUN_GPU_MEM,
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
    /// Volcano and KAI PodGroup objects (raw JSON).
    pub pod_groups: Vec<serde_json::Value>,
    /// Which of these kinds the input lists in full.
    pub listed: Listed,
}

/// Per-pod resource requests, summed over containers (init containers: the max).
#[derive(Debug, Default, Clone)]
struct Requests {
    /// Name → per-container quantities (strings), containers in order.
    per_container: Vec<BTreeMap<String, String>>,
    cpu: u64,
    mem: u64,
}

impl Requests {
    fn total(&self, name: &str) -> Result<u64, FormatError> {
        let mut sum = 0u64;
        for c in &self.per_container {
            if let Some(q) = c.get(name) {
                sum = sum.saturating_add(formats::quantity_to_count(q)?);
            }
        }
        Ok(sum)
    }
    fn has(&self, name: &str) -> bool {
        self.per_container.iter().any(|c| c.contains_key(name))
    }
    fn has_shared(&self) -> bool {
        SHARED_RESOURCES.iter().any(|r| self.has(r))
    }
    fn mig(&self) -> Result<Vec<(String, u64)>, FormatError> {
        let mut out: BTreeMap<String, u64> = BTreeMap::new();
        for c in &self.per_container {
            for (k, q) in c {
                if let Some(p) = formats::parse_mig_resource(k) {
                    let n = formats::quantity_to_count(q)?;
                    *out.entry(p.name()).or_default() += n;
                }
            }
        }
        Ok(out.into_iter().filter(|(_, n)| *n > 0).collect())
    }
}

fn requests_of(spec: &corev1::PodSpec) -> Requests {
    let mut r = Requests::default();
    let mut cpu = 0u64;
    let mut mem = 0u64;
    for c in &spec.containers {
        let mut m = BTreeMap::new();
        if let Some(res) = &c.resources {
            // Extended resources must have requests == limits; take limits, then requests.
            for src in [&res.requests, &res.limits].into_iter().flatten() {
                for (k, v) in src {
                    m.insert(k.clone(), v.0.clone());
                }
            }
            let req = res.requests.as_ref().or(res.limits.as_ref());
            if let Some(req) = req {
                cpu = cpu.saturating_add(
                    req.get("cpu")
                        .and_then(|q| formats::quantity_to_milli(&q.0).ok())
                        .unwrap_or(0),
                );
                mem = mem.saturating_add(
                    req.get("memory")
                        .and_then(|q| formats::quantity_to_bytes(&q.0).ok())
                        .unwrap_or(0),
                );
            }
        }
        r.per_container.push(m);
    }
    for c in spec.init_containers.iter().flatten() {
        if let Some(req) = c
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref().or(r.limits.as_ref()))
        {
            cpu = cpu.max(
                req.get("cpu")
                    .and_then(|q| formats::quantity_to_milli(&q.0).ok())
                    .unwrap_or(0),
            );
            mem = mem.max(
                req.get("memory")
                    .and_then(|q| formats::quantity_to_bytes(&q.0).ok())
                    .unwrap_or(0),
            );
        }
    }
    r.cpu = cpu;
    r.mem = mem;
    r
}

/// Node-level facts the pod resolution needs.
struct NodeCtx {
    /// Device key (UUID or index string) → index into `gpus`.
    by_key: HashMap<String, usize>,
    /// Koordinator minor → index.
    by_minor: HashMap<u32, usize>,
    /// Per-card memory for index-only schemes (homogeneous by their own definition).
    card_mem: Option<u64>,
    inventory_error: Option<String>,
}

fn to_chrono(t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time) -> Option<DateTime<Utc>> {
    let ts = t.0;
    DateTime::from_timestamp(
        ts.as_second(),
        u32::try_from(ts.subsec_nanosecond()).unwrap_or(0),
    )
}

fn alloc_quantity<'a>(node: &'a corev1::Node, name: &str) -> Option<&'a str> {
    node.status
        .as_ref()?
        .allocatable
        .as_ref()?
        .get(name)
        .map(|q| q.0.as_str())
}

fn count_of(node: &corev1::Node, name: &str) -> Result<Option<u64>, FormatError> {
    alloc_quantity(node, name)
        .map(formats::quantity_to_count)
        .transpose()
}

fn build_node(
    node: &corev1::Node,
    koord: Option<&Result<Vec<formats::KoordDevice>, FormatError>>,
) -> (Node, NodeCtx) {
    let meta = &node.metadata;
    let name = meta.name.clone().unwrap_or_default();
    let labels = meta.labels.clone().unwrap_or_default();
    let annotations = meta.annotations.clone().unwrap_or_default();
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
    let q = |n: &str, f: fn(&str) -> Result<u64, FormatError>| {
        alloc_quantity(node, n).and_then(|v| f(v).ok()).unwrap_or(0)
    };
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
        model: label_model.clone(),
        scheme: Scheme::Plain,
        granularity: Granularity::Node,
        gpus: Vec::new(),
        cpu_alloc: q("cpu", formats::quantity_to_milli),
        mem_alloc: q("memory", formats::quantity_to_bytes),
        pods_alloc: q("pods", formats::quantity_to_count),
        cpu_used: 0,
        mem_used: 0,
        pods_used: 0,
        mig: Vec::new(),
        unknown_pods: 0,
        inconsistent: None,
        ready_since,
        starting,
    };
    let mut ctx = NodeCtx {
        by_key: HashMap::new(),
        by_minor: HashMap::new(),
        card_mem: None,
        inventory_error: None,
    };

    // MIG pools (mixed strategy) are reported separately from the milli metric.
    if let Some(alloc) = status.and_then(|s| s.allocatable.as_ref()) {
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

    let whole = |n: &mut Node, count: u64, mem: Option<u64>| {
        let count = count.min(formats::MAX_DEVICES_PER_NODE as u64);
        n.gpus = (0..count)
            .map(|i| Gpu {
                key: i.to_string(),
                used: 0,
                healthy: true,
                memory_mib: mem,
            })
            .collect();
    };

    let device_list = |n: &mut Node, ctx: &mut NodeCtx, devs: Vec<(String, Option<u64>, bool)>| {
        n.granularity = Granularity::Device;
        for (i, (key, mem, healthy)) in devs.into_iter().enumerate() {
            ctx.by_key.insert(key.clone(), i);
            n.gpus.push(Gpu {
                key,
                used: 0,
                healthy,
                memory_mib: mem,
            });
        }
    };

    if let Some(v) = annotations
        .get(HAMI_NODE_REGISTER)
        .or(annotations.get(VOLCANO_NODE_REGISTER))
    {
        let hami = annotations.contains_key(HAMI_NODE_REGISTER);
        n.scheme = if hami {
            Scheme::Hami
        } else {
            Scheme::VolcanoVgpu
        };
        let parsed = if hami {
            formats::parse_hami_node_register(v)
        } else {
            formats::parse_volcano_node_register(v)
        };
        // GPUs cordoned on a HAMi node (by an administrator or another tool) receive no
        // pod: they are read as unhealthy. Those a run of this operator cordoned stay as
        // they are (the run is emptying them; its plan counts them as freed).
        let cordoned: BTreeSet<String> = match annotations.get(crate::fence::HAMI_DEVICE_CORDON) {
            Some(list) if hami => {
                let ours: BTreeSet<String> = crate::fence::claims(&annotations)
                    .unwrap_or_default()
                    .into_values()
                    .flatten()
                    .collect();
                crate::fence::cordoned(list)
                    .into_iter()
                    .filter(|g| !ours.contains(g))
                    .collect()
            }
            _ => BTreeSet::new(),
        };
        match parsed {
            Ok(devs) => {
                if n.model.is_none() {
                    n.model = devs.first().map(|d| d.model.clone());
                }
                device_list(
                    &mut n,
                    &mut ctx,
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
    } else if koord.is_some() || alloc_quantity(node, KOORD_GPU_CORE).is_some() {
        n.scheme = Scheme::Koordinator;
        n.granularity = Granularity::Device;
        match koord {
            Some(Ok(devs)) => {
                for (i, d) in devs.iter().take(formats::MAX_DEVICES_PER_NODE).enumerate() {
                    let key = d.uuid.clone().unwrap_or_else(|| d.minor.to_string());
                    ctx.by_key.insert(key.clone(), i);
                    ctx.by_minor.insert(d.minor, i);
                    let mem = d.memory_bytes.map(|b| b / (1024 * 1024)).or(label_mem);
                    n.gpus.push(Gpu {
                        key,
                        used: 0,
                        healthy: d.healthy,
                        memory_mib: mem,
                    });
                }
            }
            Some(Err(e)) => ctx.inventory_error = Some(format!("Device object: {e}")),
            None => {
                let count = match count_of(node, KOORD_GPU_CORE) {
                    Ok(Some(core)) => Ok(core / 100),
                    Ok(None) => count_of(node, NVIDIA_GPU).map(|c| c.unwrap_or(0)),
                    Err(e) => Err(e),
                };
                match count {
                    Ok(c) => {
                        whole(&mut n, c, label_mem);
                        for i in 0..n.gpus.len() {
                            ctx.by_minor.insert(i as u32, i);
                            ctx.by_key.insert(i.to_string(), i);
                        }
                    }
                    Err(e) => {
                        ctx.inventory_error = Some(format!("allocatable {KOORD_GPU_CORE}: {e}"))
                    }
                }
            }
        }
    } else if alloc_quantity(node, VOLCANO_GPU_NUMBER).is_some()
        || alloc_quantity(node, ALIYUN_GPU_MEM).is_some()
    {
        let volcano = alloc_quantity(node, VOLCANO_GPU_NUMBER).is_some();
        n.scheme = if volcano {
            Scheme::VolcanoShare
        } else {
            Scheme::Aliyun
        };
        n.granularity = Granularity::Device;
        let (count_res, mem_res) = if volcano {
            (VOLCANO_GPU_NUMBER, VOLCANO_GPU_MEMORY)
        } else {
            (ALIYUN_GPU_COUNT, ALIYUN_GPU_MEM)
        };
        let count = count_of(node, count_res).and_then(|c| match c {
            Some(c) => Ok(c),
            None => count_of(node, NVIDIA_GPU).map(|c| c.unwrap_or(0)),
        });
        let mem = count_of(node, mem_res);
        match (count, mem) {
            (Ok(count), Ok(mem)) if count > 0 => {
                // Both schemes assume homogeneous cards: per-card memory = total / count.
                let card = mem.map(|m| m / count);
                ctx.card_mem = card;
                whole(&mut n, count, None);
                for i in 0..n.gpus.len() {
                    ctx.by_key.insert(i.to_string(), i);
                }
            }
            (Ok(_), Ok(_)) => {}
            (Err(e), _) | (_, Err(e)) => {
                ctx.inventory_error = Some(format!("allocatable {count_res}/{mem_res}: {e}"))
            }
        }
    } else {
        match count_of(node, NVIDIA_GPU) {
            Ok(c) => whole(&mut n, c.unwrap_or(0), label_mem),
            Err(e) => ctx.inventory_error = Some(format!("allocatable {NVIDIA_GPU}: {e}")),
        }
    }
    if let Some(e) = &ctx.inventory_error {
        n.inconsistent = Some(format!("node inventory unreadable: {e}"));
    }
    (n, ctx)
}

fn models_of(spec: &corev1::PodSpec) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(m) = spec
        .node_selector
        .as_ref()
        .and_then(|s| s.get(GPU_PRODUCT_LABEL))
    {
        out.push(m.clone());
    }
    out
}

fn affinity_of(spec: &corev1::PodSpec) -> Vec<Vec<NodeSelectorRequirement>> {
    let Some(sel) = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|na| {
            na.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
    else {
        return Vec::new();
    };
    sel.node_selector_terms
        .iter()
        .map(|t| {
            let exprs = t
                .match_expressions
                .iter()
                .flatten()
                .map(|e| NodeSelectorRequirement {
                    key: e.key.clone(),
                    operator: e.operator.clone(),
                    values: e.values.clone().unwrap_or_default(),
                    field: false,
                });
            let fields = t
                .match_fields
                .iter()
                .flatten()
                .map(|e| NodeSelectorRequirement {
                    key: e.key.clone(),
                    operator: e.operator.clone(),
                    values: e.values.clone().unwrap_or_default(),
                    field: true,
                });
            exprs.chain(fields).collect()
        })
        .collect()
}

/// Converts a Kubernetes label selector.
pub fn label_selector(
    sel: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
) -> LabelSelector {
    LabelSelector {
        match_labels: sel.match_labels.clone().unwrap_or_default(),
        match_expressions: sel
            .match_expressions
            .iter()
            .flatten()
            .map(|e| {
                (
                    e.key.clone(),
                    e.operator.clone(),
                    e.values.clone().unwrap_or_default(),
                )
            })
            .collect(),
    }
}

fn base_pod(p: &corev1::Pod, nodes: &[Node]) -> (Pod, Requests) {
    let meta = &p.metadata;
    let empty_spec = corev1::PodSpec::default();
    let spec = p.spec.as_ref().unwrap_or(&empty_spec);
    let req = requests_of(spec);
    let empty = BTreeMap::new();
    let annotations = meta.annotations.as_ref().unwrap_or(&empty);
    let phase = match p.status.as_ref().and_then(|s| s.phase.as_deref()) {
        Some("Pending") => Phase::Pending,
        Some("Running") => Phase::Running,
        Some("Succeeded") => Phase::Succeeded,
        Some("Failed") => Phase::Failed,
        _ => Phase::Unknown,
    };
    let node_name = spec.node_name.clone().filter(|n| !n.is_empty());
    let node = node_name
        .as_deref()
        .and_then(|n| nodes.binary_search_by(|x| x.name.as_str().cmp(n)).ok());
    let owner = meta
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
        .map(|o| Owner {
            group: workload::api_group(&o.api_version),
            kind: o.kind.clone(),
            name: o.name.clone(),
        });
    let volumes = || spec.volumes.iter().flatten();
    // A memory-backed emptyDir (`/dev/shm`, hugepages) holds nothing that outlives the
    // container: not local storage.
    let local_storage = volumes().any(|v| {
        v.host_path.is_some()
            || v.empty_dir.as_ref().is_some_and(|e| {
                e.medium
                    .as_deref()
                    .is_none_or(|m| m != "Memory" && !m.starts_with("HugePages"))
            })
    });
    let status = p.status.as_ref();
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    let pod = Pod {
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
        node,
        node_name,
        phase,
        labels: meta.labels.clone().unwrap_or_default(),
        annotations: KEPT_ANNOTATIONS
            .iter()
            .filter_map(|k| annotations.get(*k).map(|v| ((*k).to_string(), v.clone())))
            .collect(),
        gpu: GpuUse::None,
        shape: None,
        scheme: None,
        cpu: req.cpu,
        mem: req.mem,
        priority: spec.priority.unwrap_or(0),
        priority_class: spec.priority_class_name.clone(),
        owner,
        workload: None,
        gang: None,
        started: status
            .and_then(|s| s.start_time.as_ref())
            .and_then(to_chrono),
        ready,
        deleting: meta.deletion_timestamp.is_some(),
        mirror: annotations.contains_key("kubernetes.io/config.mirror"),
        local_storage,
        pvc: volumes().any(|v| v.persistent_volume_claim.is_some()),
        ephemeral_volume: volumes().any(|v| v.ephemeral.is_some()),
        resource_claims: spec.resource_claims.as_ref().is_some_and(|c| !c.is_empty()),
        node_selector: spec.node_selector.clone().unwrap_or_default(),
        affinity: affinity_of(spec),
        tolerations: spec
            .tolerations
            .iter()
            .flatten()
            .map(|t| Toleration {
                key: t.key.clone().unwrap_or_default(),
                operator: t.operator.clone().unwrap_or_else(|| "Equal".into()),
                value: t.value.clone().unwrap_or_default(),
                effect: t.effect.clone().unwrap_or_default(),
            })
            .collect(),
        models: models_of(spec),
    };
    (pod, req)
}

/// A pod's allocation, before it is applied to its node.
enum Resolved {
    Use(GpuUse, Option<GpuShape>, Option<Scheme>),
    /// KAI fraction: group, milli.
    Kai(String, Milli),
}

fn unknown(r: UnknownReason) -> Resolved {
    Resolved::Use(GpuUse::Unknown(r), None, None)
}

fn shape_of(devs: &[(usize, Milli)]) -> Option<GpuShape> {
    let max = devs.iter().map(|d| d.1).max()?;
    Some(GpuShape {
        gpus: devs.len() as u32,
        milli: max,
    })
}

/// Merges entries naming the same device (several containers on one GPU).
fn merge(devs: Vec<(usize, Milli)>) -> Vec<(usize, Milli)> {
    let mut m: BTreeMap<usize, Milli> = BTreeMap::new();
    for (i, v) in devs {
        let e = m.entry(i).or_default();
        *e = (*e + v).min(GPU_MILLI);
    }
    m.into_iter().collect()
}

fn resolve(
    pod: &Pod,
    req: &Requests,
    annotations: &BTreeMap<String, String>,
    node: Option<(&Node, &NodeCtx)>,
) -> Resolved {
    let scheme_of_node = node.map(|(n, _)| n.scheme);
    let mismatch = |s: Scheme| {
        unknown(UnknownReason::DisagreesWithRequest(format!(
            "{} record on a {} node",
            s.as_str(),
            scheme_of_node.map(Scheme::as_str).unwrap_or("missing")
        )))
    };
    // 1. HAMi / Volcano vGPU records.
    for (key, scheme, count_res) in [
        (HAMI_POD_ALLOCATED, Scheme::Hami, NVIDIA_GPU),
        (
            VOLCANO_VGPU_IDS,
            Scheme::VolcanoVgpu,
            "volcano.sh/vgpu-number",
        ),
    ] {
        let Some(v) = annotations.get(key) else {
            continue;
        };
        let Some((n, ctx)) = node else {
            return Resolved::Use(GpuUse::None, None, Some(scheme));
        };
        if n.scheme != scheme {
            return mismatch(scheme);
        }
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
                .map(|q| formats::quantity_to_count(q));
            let want = match want {
                Some(Ok(w)) => w,
                Some(Err(e)) => {
                    return unknown(UnknownReason::Malformed(format!("{count_res}: {e}")));
                }
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
                let total = n.gpus[idx].memory_mib.unwrap_or(0);
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
        let devs = merge(devs);
        return Resolved::Use(GpuUse::Devices(devs.clone()), shape_of(&devs), Some(scheme));
    }
    // 2. Koordinator.
    if let Some(v) = annotations.get(KOORD_DEVICE_ALLOCATED) {
        let Some((n, ctx)) = node else {
            return Resolved::Use(GpuUse::None, None, Some(Scheme::Koordinator));
        };
        if n.scheme != Scheme::Koordinator {
            return mismatch(Scheme::Koordinator);
        }
        if !KOORD_RESOURCES.iter().any(|r| req.has(r)) {
            return unknown(UnknownReason::DisagreesWithRequest(format!(
                "{KOORD_DEVICE_ALLOCATED} on a pod that requests no GPU resource"
            )));
        }
        let allocs = match formats::parse_koord_device_allocated(v) {
            Ok(a) => a,
            Err(e) => return unknown(UnknownReason::Malformed(e.to_string())),
        };
        let mut devs = Vec::new();
        let mut core_sum = 0u64;
        for a in &allocs {
            let Some(&idx) = ctx.by_minor.get(&a.minor) else {
                return unknown(UnknownReason::UnknownDevice(format!(
                    "gpu minor {} not on node",
                    a.minor
                )));
            };
            let mem = match (a.memory_ratio, a.memory_bytes) {
                (Some(r), _) => Some((u64::from(r), 100)),
                (None, Some(b)) => match n.gpus[idx].memory_mib {
                    Some(mib) => Some((b, mib.saturating_mul(1024 * 1024))),
                    None => {
                        return unknown(UnknownReason::NodeInventory(
                            "gpu-memory record but device memory unknown (no Device object or nvidia.com/gpu.memory label)".into(),
                        ));
                    }
                },
                (None, None) => None,
            };
            if mem.is_none() && a.core.is_none() {
                return unknown(UnknownReason::Malformed(format!(
                    "gpu minor {}: no core or memory",
                    a.minor
                )));
            }
            core_sum += u64::from(a.core.unwrap_or(0));
            match formats::share_milli(mem, a.core) {
                Ok(m) => devs.push((idx, m)),
                Err(e) => return unknown(UnknownReason::Malformed(e.to_string())),
            }
        }
        if req.has(KOORD_GPU_CORE) {
            match req.total(KOORD_GPU_CORE) {
                Ok(want) if want == core_sum => {}
                Ok(want) => {
                    return unknown(UnknownReason::DisagreesWithRequest(format!(
                        "record gives gpu-core {core_sum}, pod requests {want}"
                    )));
                }
                Err(e) => return unknown(UnknownReason::Malformed(e.to_string())),
            }
        } else if req.has(NVIDIA_GPU) {
            match req.total(NVIDIA_GPU) {
                Ok(want) if want == allocs.len() as u64 => {}
                Ok(want) => {
                    return unknown(UnknownReason::DisagreesWithRequest(format!(
                        "record lists {} GPUs, pod requests {want}",
                        allocs.len()
                    )));
                }
                Err(e) => return unknown(UnknownReason::Malformed(e.to_string())),
            }
        }
        let devs = merge(devs);
        return Resolved::Use(
            GpuUse::Devices(devs.clone()),
            shape_of(&devs),
            Some(Scheme::Koordinator),
        );
    }
    // 3. Volcano gpushare.
    if let Some(v) = annotations.get(VOLCANO_GPU_INDEX) {
        let Some((n, ctx)) = node else {
            return Resolved::Use(GpuUse::None, None, Some(Scheme::VolcanoShare));
        };
        if n.scheme != Scheme::VolcanoShare {
            return mismatch(Scheme::VolcanoShare);
        }
        let idx = match formats::parse_index_list(VOLCANO_GPU_INDEX, v) {
            Ok(i) => i,
            Err(e) => return unknown(UnknownReason::Malformed(e.to_string())),
        };
        let number = req.total(VOLCANO_GPU_NUMBER).unwrap_or(0);
        let mem = req.total(VOLCANO_GPU_MEMORY);
        let mut devs = Vec::new();
        for i in &idx {
            let Some(&d) = ctx.by_key.get(&i.to_string()) else {
                return unknown(UnknownReason::UnknownDevice(format!(
                    "gpu index {i} not on node"
                )));
            };
            let milli = if number > 0 {
                GPU_MILLI
            } else {
                match (&mem, ctx.card_mem) {
                    (Ok(m), Some(card)) if *m > 0 => {
                        match formats::share_milli(Some((*m, card)), None) {
                            Ok(x) => x,
                            Err(e) => return unknown(UnknownReason::Malformed(e.to_string())),
                        }
                    }
                    (Err(e), _) => return unknown(UnknownReason::Malformed(e.to_string())),
                    _ => {
                        return unknown(UnknownReason::DisagreesWithRequest(
                            "gpu-index record without a volcano.sh/gpu-memory or gpu-number request".into(),
                        ));
                    }
                }
            };
            devs.push((d, milli));
        }
        if number > 0 && number != idx.len() as u64 {
            return unknown(UnknownReason::DisagreesWithRequest(format!(
                "gpu-index lists {} cards, gpu-number requests {number}",
                idx.len()
            )));
        }
        let devs = merge(devs);
        return Resolved::Use(
            GpuUse::Devices(devs.clone()),
            shape_of(&devs),
            Some(Scheme::VolcanoShare),
        );
    }
    // 4. Aliyun gpushare.
    match formats::parse_aliyun(annotations) {
        Ok(Some(a)) => {
            let Some((n, ctx)) = node else {
                return Resolved::Use(GpuUse::None, None, Some(Scheme::Aliyun));
            };
            if n.scheme != Scheme::Aliyun {
                return mismatch(Scheme::Aliyun);
            }
            let Some(&d) = ctx.by_key.get(&a.index.to_string()) else {
                return unknown(UnknownReason::UnknownDevice(format!(
                    "gpu index {} not on node",
                    a.index
                )));
            };
            match req.total(ALIYUN_GPU_MEM) {
                Ok(want) if want == a.pod_mem => {}
                Ok(want) => {
                    return unknown(UnknownReason::DisagreesWithRequest(format!(
                        "ALIYUN_COM_GPU_MEM_POD {} but pod requests {ALIYUN_GPU_MEM} {want}",
                        a.pod_mem
                    )));
                }
                Err(e) => return unknown(UnknownReason::Malformed(e.to_string())),
            }
            if let Some(card) = ctx.card_mem
                && card != a.dev_mem
            {
                return unknown(UnknownReason::DisagreesWithRequest(format!(
                    "ALIYUN_COM_GPU_MEM_DEV {} but node cards have {card}",
                    a.dev_mem
                )));
            }
            return match formats::share_milli(Some((a.pod_mem, a.dev_mem)), None) {
                Ok(m) => Resolved::Use(
                    GpuUse::Devices(vec![(d, m)]),
                    Some(GpuShape { gpus: 1, milli: m }),
                    Some(Scheme::Aliyun),
                ),
                Err(e) => unknown(UnknownReason::Malformed(e.to_string())),
            };
        }
        Ok(None) => {}
        Err(e) => return unknown(UnknownReason::Malformed(e.to_string())),
    }
    // 5. KAI fractions.
    if let Some(v) = annotations.get(KAI_FRACTION) {
        let milli = match formats::parse_gpu_fraction(v) {
            Ok(m) => m,
            Err(e) => return unknown(UnknownReason::Malformed(e.to_string())),
        };
        if node.is_none() {
            return Resolved::Use(GpuUse::None, Some(GpuShape { gpus: 1, milli }), None);
        }
        return match pod.labels.get(KAI_GROUP) {
            Some(g) => Resolved::Kai(g.clone(), milli),
            None => unknown(UnknownReason::MissingRecord),
        };
    }
    // 6. Requests without records.
    if req.has_shared() {
        if node.is_none() {
            return Resolved::Use(GpuUse::None, shared_pending_shape(req), None);
        }
        return unknown(UnknownReason::MissingRecord);
    }
    let mig = match req.mig() {
        Ok(m) => m,
        Err(e) => return unknown(UnknownReason::Malformed(e.to_string())),
    };
    let whole = match req.total(NVIDIA_GPU) {
        Ok(w) => w,
        Err(e) => return unknown(UnknownReason::Malformed(format!("{NVIDIA_GPU}: {e}"))),
    };
    if !mig.is_empty() {
        if whole > 0 {
            return unknown(UnknownReason::DisagreesWithRequest(
                "both MIG and whole-GPU requests".into(),
            ));
        }
        return Resolved::Use(GpuUse::Mig(mig), None, None);
    }
    if whole == 0 {
        return Resolved::Use(GpuUse::None, None, None);
    }
    let whole32 = u32::try_from(whole).unwrap_or(u32::MAX);
    let shape = Some(GpuShape {
        gpus: whole32,
        milli: GPU_MILLI,
    });
    match node {
        None => Resolved::Use(GpuUse::None, shape, Some(Scheme::Plain)),
        Some((n, _)) if n.granularity == Granularity::Node => {
            Resolved::Use(GpuUse::Whole(whole32), shape, Some(Scheme::Plain))
        }
        // Device-granularity nodes record every GPU pod; a bare count there is a guess.
        Some(_) => unknown(UnknownReason::MissingRecord),
    }
}

/// Shape of a pending pod that asks for a share (no device chosen yet).
fn shared_pending_shape(req: &Requests) -> Option<GpuShape> {
    let pct = |name: &str| req.total(name).ok().filter(|v| *v > 0);
    let milli = pct(KOORD_GPU_CORE)
        .or(pct("koordinator.sh/gpu-memory-ratio"))
        .or(pct("nvidia.com/gpucores"))
        .or(pct("nvidia.com/gpumem-percentage"))
        .or(pct("volcano.sh/vgpu-cores"))
        .map(|p| (p.min(100) * 10) as Milli);
    let gpus = pct(NVIDIA_GPU)
        .or(pct("volcano.sh/vgpu-number"))
        .unwrap_or(1);
    Some(GpuShape {
        gpus: u32::try_from(gpus).unwrap_or(1),
        milli: milli.unwrap_or(GPU_MILLI),
    })
}

fn trunc(s: &str) -> String {
    if s.len() <= 64 {
        s.to_string()
    } else {
        format!("{}…", &s[..s.floor_char_boundary(64)])
    }
}

/// Builds the normalised cluster. `now` is the instant ages are measured from.
pub fn build_cluster(objs: &Objects, now: Option<DateTime<Utc>>) -> Cluster {
    build_cluster_from(
        ObjectRefs {
            nodes: objs.nodes.iter().collect(),
            pods: objs.pods.iter().collect(),
            pdbs: objs.pdbs.iter().collect(),
            devices: &objs.devices,
            controllers: objs
                .controllers
                .iter()
                .map(|c| (c.kind, &c.metadata))
                .collect(),
            namespaces: objs.namespaces.iter().collect(),
            pod_groups: &objs.pod_groups,
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
    /// Pods.
    pub pods: Vec<&'a corev1::Pod>,
    /// PodDisruptionBudgets.
    pub pdbs: Vec<&'a PodDisruptionBudget>,
    /// Koordinator `Device` objects (raw JSON).
    pub devices: &'a [serde_json::Value],
    /// ReplicaSets, StatefulSets and Jobs (metadata).
    pub controllers: Vec<(ControllerKind, &'a ObjectMeta)>,
    /// Namespaces (metadata).
    pub namespaces: Vec<&'a ObjectMeta>,
    /// Volcano and KAI PodGroup objects (raw JSON).
    pub pod_groups: &'a [serde_json::Value],
    /// Which kinds are listed in full.
    pub listed: Listed,
}

/// [`build_cluster`] from borrowed objects (the operator's caches: a copy of 6,000 pods per
/// reconcile would double its memory).
pub fn build_cluster_from(objs: ObjectRefs<'_>, now: Option<DateTime<Utc>>) -> Cluster {
    // Koordinator Device objects by node name.
    let mut koord: HashMap<String, Result<Vec<formats::KoordDevice>, FormatError>> = HashMap::new();
    for d in objs.devices {
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
    let mut built: Vec<(Node, NodeCtx)> = objs
        .nodes
        .iter()
        .copied()
        .filter(|n| n.metadata.name.as_deref().is_some_and(|s| !s.is_empty()))
        .map(|n| {
            let name = n.metadata.name.as_deref().unwrap_or_default();
            build_node(n, koord.get(name))
        })
        .collect();
    built.sort_by(|a, b| a.0.name.cmp(&b.0.name));
    built.dedup_by(|a, b| a.0.name == b.0.name);
    let (mut nodes, ctxs): (Vec<Node>, Vec<NodeCtx>) = built.into_iter().unzip();

    let index = workload::Index::new(&objs.controllers, objs.pod_groups, objs.listed);
    let mut pods = Vec::with_capacity(objs.pods.len());
    let mut kai: Vec<(usize, String, Milli)> = Vec::new(); // (pod index, group, milli)
    for &p in &objs.pods {
        let (mut pod, req) = base_pod(p, &nodes);
        let empty = BTreeMap::new();
        let annotations = p.metadata.annotations.as_ref().unwrap_or(&empty);
        pod.workload = index.workload(&pod.namespace, pod.owner.as_ref(), &pod.labels);
        pod.gang = index.gang(&pod.namespace, &pod.labels, annotations);
        let node = pod.node.map(|i| (&nodes[i], &ctxs[i]));
        let active = pod.is_active_bound() && pod.node.is_some();
        let resolved = if let Some(e) = node.and_then(|(_, c)| c.inventory_error.clone()) {
            if active && (req.has_shared() || req.has(NVIDIA_GPU) || !annotations.is_empty()) {
                unknown(UnknownReason::NodeInventory(e))
            } else {
                Resolved::Use(GpuUse::None, None, None)
            }
        } else {
            resolve(&pod, &req, annotations, if active { node } else { None })
        };
        match resolved {
            Resolved::Use(u, shape, scheme) => {
                pod.gpu = if active { u } else { GpuUse::None };
                pod.shape = shape;
                pod.scheme = scheme;
            }
            Resolved::Kai(g, m) => {
                pod.shape = Some(GpuShape { gpus: 1, milli: m });
                kai.push((pods.len(), g, m));
            }
        }
        if active && let Some(i) = pod.node {
            let n = &mut nodes[i];
            n.cpu_used = n.cpu_used.saturating_add(pod.cpu);
            n.mem_used = n.mem_used.saturating_add(pod.mem);
            n.pods_used += 1;
        }
        pods.push(pod);
    }
    apply_uses(&mut nodes, &mut pods, &kai);
    let pdbs = objs.pdbs.iter().copied().map(pdb_of).collect();
    let unchecked = unchecked_notes(&pods, &objs.listed);
    let mut c = Cluster {
        nodes,
        pods,
        pdbs,
        now,
        protected_namespaces: workload::protected_namespaces(objs.namespaces.iter().copied()),
        unchecked,
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
    // Device-level sums, per node, before capping: detect over-commit.
    let mut sums: Vec<Vec<u64>> = nodes.iter().map(|n| vec![0; n.gpus.len()]).collect();
    let mut whole: Vec<u64> = vec![0; nodes.len()];
    for p in pods.iter() {
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
    // KAI groups: each group holds one reserved GPU; fractions share it.
    let mut groups: BTreeMap<(usize, String), (u64, Vec<usize>)> = BTreeMap::new();
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
    let mut reservations: Vec<u64> = vec![0; nodes.len()];
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
    let groups: BTreeMap<(usize, String), (u64, Vec<usize>)> = groups
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
    let mut kai_groups_per_node: Vec<Vec<(u64, Vec<usize>)>> = vec![Vec::new(); nodes.len()];
    for ((n, _), v) in groups {
        kai_groups_per_node[n].push(v);
    }
    for (i, node) in nodes.iter_mut().enumerate() {
        // Over-committed devices: every pod on them becomes unknown.
        let over: Vec<usize> = sums[i]
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
        for (g, s) in sums[i].iter().enumerate() {
            node.gpus[g].used = (*s).min(u64::from(GPU_MILLI)) as Milli;
        }
        if node.granularity == Granularity::Node {
            // KAI reservation pods hold one whole GPU per group; the group's fractions
            // share it. Reserved GPUs come first, then the other whole-GPU pods.
            let groups = &kai_groups_per_node[i];
            let reservation_pods = reservations[i];
            let plain = whole[i].saturating_sub(reservation_pods);
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
        } else {
            for (_, members) in &kai_groups_per_node[i] {
                for pi in members {
                    pods[*pi].gpu = GpuUse::Unknown(UnknownReason::DisagreesWithRequest(format!(
                        "KAI fraction on a {} node",
                        node.scheme.as_str()
                    )));
                }
            }
        }
    }
    for p in pods.iter() {
        if let (Some(i), GpuUse::Unknown(_)) = (p.node, &p.gpu) {
            nodes[i].unknown_pods += 1;
        }
    }
}
