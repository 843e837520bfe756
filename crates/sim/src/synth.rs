//! Synthetic fragmented clusters as Kubernetes objects, reproducible from a seed.
//!
//! Half the nodes (by default) share GPUs through HAMi (device-level records), the rest
//! hand out whole `nvidia.com/gpu`. Pods arrive in random order and are placed by a
//! spreading scheduler (least allocated node, random device), which is what leaves the
//! fragments a defragmenter has to clean up.
use std::collections::BTreeMap;

use gpu_defrag_core::ingest::{
    BINPACK_SCHEDULER, HAMI_NODE_REGISTER, HAMI_POD_ALLOCATED, NVIDIA_GPU, Objects,
};
use k8s_openapi::api::core::v1::{
    Container, Node, NodeCondition, NodeSpec, NodeStatus, Pod, PodSpec, PodStatus,
    ResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Parameters of a synthetic cluster.
#[derive(Debug, Clone)]
pub struct SynthParams {
    /// Nodes.
    pub nodes: usize,
    /// GPUs per node.
    pub gpus_per_node: u32,
    /// Pods to try to place.
    pub pods: usize,
    /// Seed.
    pub seed: u64,
    /// Share of nodes using HAMi sharing (0..1).
    pub shared_nodes: f64,
    /// GPU memory per device, MiB.
    pub gpu_mem_mib: u64,
}

impl Default for SynthParams {
    fn default() -> Self {
        SynthParams {
            nodes: 16,
            gpus_per_node: 8,
            pods: 80,
            seed: 1,
            shared_nodes: 0.5,
            gpu_mem_mib: 81920,
        }
    }
}

fn q(s: impl Into<String>) -> Quantity {
    Quantity(s.into())
}

fn uuid(node: usize, gpu: u32) -> String {
    format!("GPU-{node:08x}-{gpu:04x}-4000-8000-000000000000")
}

fn node_obj(i: usize, p: &SynthParams, shared: bool) -> Node {
    let name = format!("gpu-node-{i:05}");
    let mut labels = BTreeMap::new();
    labels.insert("kubernetes.io/hostname".to_string(), name.clone());
    labels.insert(
        "nvidia.com/gpu.product".to_string(),
        "NVIDIA-H100-80GB-HBM3".to_string(),
    );
    labels.insert("nvidia.com/gpu.present".to_string(), "true".to_string());
    let mut annotations = BTreeMap::new();
    let gpu_alloc = if shared {
        let devs: Vec<String> = (0..p.gpus_per_node)
            .map(|g| {
                format!(
                    "{},10,{},100,NVIDIA-H100-80GB-HBM3,0,true,{g},hami-core:",
                    uuid(i, g),
                    p.gpu_mem_mib
                )
            })
            .collect();
        annotations.insert(HAMI_NODE_REGISTER.to_string(), devs.concat());
        p.gpus_per_node * 10
    } else {
        p.gpus_per_node
    };
    let res: BTreeMap<String, Quantity> = [
        ("cpu".to_string(), q("128")),
        ("memory".to_string(), q("1Ti")),
        ("pods".to_string(), q("110")),
        (NVIDIA_GPU.to_string(), q(gpu_alloc.to_string())),
    ]
    .into();
    Node {
        metadata: ObjectMeta {
            name: Some(name),
            labels: Some(labels),
            annotations: Some(annotations),
            ..Default::default()
        },
        spec: Some(NodeSpec::default()),
        status: Some(NodeStatus {
            capacity: Some(res.clone()),
            allocatable: Some(res),
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: "True".into(),
                ..Default::default()
            }]),
            ..Default::default()
        }),
    }
}

fn pod_obj(
    name: String,
    ns: &str,
    node: Option<&str>,
    requests: BTreeMap<String, Quantity>,
    annotations: BTreeMap<String, String>,
) -> Pod {
    let owner = OwnerReference {
        api_version: "apps/v1".into(),
        kind: "ReplicaSet".into(),
        name: format!("{name}-rs"),
        uid: format!("uid-{name}"),
        controller: Some(true),
        ..Default::default()
    };
    Pod {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(ns.into()),
            labels: Some([("app".to_string(), name.clone())].into()),
            annotations: Some(annotations),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: node.map(str::to_string),
            scheduler_name: Some(BINPACK_SCHEDULER.into()),
            containers: vec![Container {
                name: "main".into(),
                resources: Some(ResourceRequirements {
                    limits: Some(requests.clone()),
                    requests: Some(requests),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: Some(PodStatus {
            phase: Some(if node.is_some() { "Running" } else { "Pending" }.into()),
            ..Default::default()
        }),
    }
}

/// A random node that fits, found by random probes (constant time per pod, so huge
/// clusters generate fast); a pod that misses every probe stays Pending.
fn random_fit(rng: &mut StdRng, nodes: usize, fits: impl Fn(usize) -> bool) -> Option<usize> {
    if nodes == 0 {
        return None;
    }
    (0..64)
        .map(|_| rng.random_range(0..nodes))
        .find(|&n| fits(n))
}

/// Builds the cluster. Pods that fit nowhere stay Pending (unbound).
pub fn generate(p: &SynthParams) -> Objects {
    let mut rng = StdRng::seed_from_u64(p.seed);
    let g = p.gpus_per_node as usize;
    let shared: Vec<bool> = (0..p.nodes)
        .map(|i| (i as f64) < p.shared_nodes * p.nodes as f64)
        .collect();
    let nodes: Vec<Node> = (0..p.nodes).map(|i| node_obj(i, p, shared[i])).collect();
    let mut free: Vec<Vec<u32>> = vec![vec![1000; g]; p.nodes];
    let mut cpu_free: Vec<u64> = vec![128_000; p.nodes];
    let mut slots: Vec<u32> = vec![110; p.nodes];
    let mut pods = Vec::with_capacity(p.pods);
    for k in 0..p.pods {
        let ns = format!("team-{}", k % 7);
        let name = format!("job-{k:06}");
        // Mostly shares, a few whole-GPU jobs: about 0.45 GPU per pod on average, so
        // 200,000 pods nearly fill 80,000 GPUs.
        let share = rng.random_bool(0.95);
        let cpu: u64 = [2_000u64, 4_000, 8_000][rng.random_range(0..3)];
        let mut req: BTreeMap<String, Quantity> = [
            ("cpu".to_string(), q(format!("{cpu}m"))),
            ("memory".to_string(), q("16Gi")),
        ]
        .into();
        if share {
            let milli: u32 = [100u32, 250, 300, 500, 700][rng.random_range(0..5)];
            let mem = p.gpu_mem_mib * u64::from(milli) / 1000;
            req.insert(NVIDIA_GPU.into(), q("1"));
            req.insert("nvidia.com/gpumem".into(), q(mem.to_string()));
            // Spread: a random shared node with room, a random device with room.
            let found = random_fit(&mut rng, p.nodes, |n| {
                shared[n]
                    && slots[n] > 0
                    && cpu_free[n] >= cpu
                    && free[n].iter().any(|f| *f >= milli)
            });
            let Some(n) = found else {
                pods.push(pod_obj(name, &ns, None, req, BTreeMap::new()));
                continue;
            };
            let devs: Vec<usize> = (0..g).filter(|&d| free[n][d] >= milli).collect();
            let d = devs[rng.random_range(0..devs.len())];
            free[n][d] -= milli;
            cpu_free[n] -= cpu;
            slots[n] -= 1;
            let rec = format!("{},NVIDIA,{mem},0:;", uuid(n, d as u32));
            let ann: BTreeMap<String, String> = [(HAMI_POD_ALLOCATED.to_string(), rec)].into();
            pods.push(pod_obj(
                name,
                &ns,
                Some(&format!("gpu-node-{n:05}")),
                req,
                ann,
            ));
        } else {
            let want: u32 = [1u32, 1, 1, 2, 2, 4, 8][rng.random_range(0..7)];
            req.insert(NVIDIA_GPU.into(), q(want.to_string()));
            let found = random_fit(&mut rng, p.nodes, |n| {
                !shared[n]
                    && slots[n] > 0
                    && cpu_free[n] >= cpu
                    && free[n].iter().filter(|f| **f == 1000).count() >= want as usize
            });
            let Some(n) = found else {
                pods.push(pod_obj(name, &ns, None, req, BTreeMap::new()));
                continue;
            };
            let mut left = want;
            for f in free[n].iter_mut() {
                if left > 0 && *f == 1000 {
                    *f = 0;
                    left -= 1;
                }
            }
            cpu_free[n] -= cpu;
            slots[n] -= 1;
            pods.push(pod_obj(
                name,
                &ns,
                Some(&format!("gpu-node-{n:05}")),
                req,
                BTreeMap::new(),
            ));
        }
    }
    Objects {
        nodes,
        pods,
        pdbs: Vec::new(),
        devices: Vec::new(),
        ..Default::default()
    }
}

/// The objects as a `v1` List in JSON.
pub fn to_list_json(objs: &Objects) -> serde_json::Value {
    let mut items = Vec::with_capacity(objs.nodes.len() + objs.pods.len());
    for n in &objs.nodes {
        let mut v = serde_json::to_value(n).unwrap_or_default();
        v["apiVersion"] = "v1".into();
        v["kind"] = "Node".into();
        items.push(v);
    }
    for p in &objs.pods {
        let mut v = serde_json::to_value(p).unwrap_or_default();
        v["apiVersion"] = "v1".into();
        v["kind"] = "Pod".into();
        items.push(v);
    }
    for p in &objs.pdbs {
        let mut v = serde_json::to_value(p).unwrap_or_default();
        v["apiVersion"] = "policy/v1".into();
        v["kind"] = "PodDisruptionBudget".into();
        items.push(v);
    }
    serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items})
}
