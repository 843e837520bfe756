//! A large synthetic cluster built directly as a model (no Kubernetes objects), for
//! timing the planner: `nodes` × `gpus_per_node`, a share of them HAMi-shared (device
//! granularity), the rest plain `nvidia.com/gpu` (node granularity). Pods are placed
//! at a random node that fits (up to 16 tries, random device), which fragments like a
//! spreading scheduler; those that fit nowhere stay pending.
use std::collections::BTreeMap;

use gpu_defrag_core::ingest::BINPACK_SCHEDULER;
use gpu_defrag_core::model::*;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

/// Parameters.
#[derive(Debug, Clone)]
pub struct ScaleParams {
    /// Nodes.
    pub nodes: usize,
    /// GPUs per node.
    pub gpus_per_node: u32,
    /// Pods.
    pub pods: usize,
    /// Seed.
    pub seed: u64,
    /// Share of nodes with GPU sharing.
    pub shared_nodes: f64,
}

fn shape(rng: &mut StdRng) -> GpuShape {
    if rng.random_bool(0.9) {
        GpuShape {
            gpus: 1,
            milli: [100, 150, 200, 250, 300][rng.random_range(0..5)],
        }
    } else {
        let gpus = match rng.random_range(0..100) {
            0..75 => 1,
            75..90 => 2,
            90..97 => 4,
            _ => 8,
        };
        GpuShape { gpus, milli: 1000 }
    }
}

/// Builds the cluster.
pub fn build(p: &ScaleParams) -> Cluster {
    let mut rng = StdRng::seed_from_u64(p.seed);
    let shared_n = (p.shared_nodes.clamp(0.0, 1.0) * p.nodes as f64).round() as usize;
    let mut nodes: Vec<Node> = (0..p.nodes)
        .map(|i| node(i, i < shared_n, p.gpus_per_node))
        .collect();
    let mut pods = Vec::with_capacity(p.pods);
    for k in 0..p.pods {
        let s = shape(&mut rng);
        let placed = place(&mut rng, &nodes, s, shared_n);
        pods.push(pod(
            k,
            s,
            placed.map(|(n, devs)| bind(&mut nodes, n, &devs, s)),
        ));
    }
    pods.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    Cluster {
        nodes,
        pods,
        pdbs: vec![],
        now: None,
        ..Default::default()
    }
}

/// Node `i`, empty: HAMi-shared (device granularity) or plain (node granularity).
fn node(i: usize, shared: bool, gpus_per_node: u32) -> Node {
    let name = format!("node-{i:06}");
    Node {
        name: name.clone(),
        labels: BTreeMap::from([("kubernetes.io/hostname".to_string(), name)]),
        taints: vec![],
        ready: true,
        unschedulable: false,
        model: Some("H100".into()),
        scheme: if shared { Scheme::Hami } else { Scheme::Plain },
        granularity: if shared {
            Granularity::Device
        } else {
            Granularity::Node
        },
        gpus: (0..gpus_per_node)
            .map(|g| Gpu {
                key: g.to_string(),
                used: 0,
                healthy: true,
                memory_mib: Some(81920),
            })
            .collect(),
        cpu_alloc: 256_000,
        mem_alloc: 2048 << 30,
        pods_alloc: 256,
        cpu_used: 0,
        mem_used: 0,
        pods_used: 0,
        mig: vec![],
        unknown_pods: 0,
        inconsistent: None,
        ready_since: None,
        starting: None,
        dra: Vec::new(),
        extra_alloc: Vec::new(),
        extra_used: Vec::new(),
    }
}

/// Where a pod of shape `s` lands: a random node that fits (a shared one for a share;
/// up to 16 tries), random devices among those that fit; `None` when no try fits.
fn place(
    rng: &mut StdRng,
    nodes: &[Node],
    s: GpuShape,
    shared_n: usize,
) -> Option<(usize, Vec<usize>)> {
    let share = s.milli < GPU_MILLI;
    for _ in 0..16 {
        let n = if share {
            if shared_n == 0 {
                break;
            }
            rng.random_range(0..shared_n)
        } else {
            rng.random_range(0..nodes.len().max(1))
        };
        let node = &nodes[n];
        if node.pods_used >= node.pods_alloc {
            continue;
        }
        let mut fit: Vec<usize> = (0..node.gpus.len())
            .filter(|&g| GPU_MILLI - node.gpus[g].used >= s.milli)
            .collect();
        if fit.len() < s.gpus as usize {
            continue;
        }
        fit.shuffle(rng);
        fit.truncate(s.gpus as usize);
        return Some((n, fit));
    }
    None
}

/// A pod's binding: node index, node name, GPU use, scheme.
type Binding = (usize, String, GpuUse, Scheme);

/// Binds a pod of shape `s` on node `n`, devices `devs`: the node's use grows.
fn bind(nodes: &mut [Node], n: usize, devs: &[usize], s: GpuShape) -> Binding {
    let node = &mut nodes[n];
    for &g in devs {
        node.gpus[g].used += s.milli;
    }
    node.pods_used += 1;
    node.cpu_used += 2000;
    node.mem_used += 8 << 30;
    let gpu = if node.granularity == Granularity::Device {
        GpuUse::Devices(devs.iter().map(|&g| (g, s.milli)).collect())
    } else {
        GpuUse::Whole(s.gpus)
    };
    (n, node.name.clone(), gpu, node.scheme)
}

/// Pod `k` of shape `s`: running where bound, else pending.
fn pod(k: usize, s: GpuShape, bound: Option<Binding>) -> Pod {
    let ns = format!("team-{}", k % 7);
    let name = format!("job-{k:07}");
    let (node, node_name, gpu, scheme, phase) = match bound {
        Some((n, node_name, gpu, scheme)) => {
            (Some(n), Some(node_name), gpu, Some(scheme), Phase::Running)
        }
        None => (None, None, GpuUse::None, None, Phase::Pending),
    };
    Pod {
        namespace: ns,
        name: name.clone(),
        node,
        node_name,
        phase,
        labels: BTreeMap::from([("app".to_string(), name.clone())]).into(),
        annotations: BTreeMap::new(),
        gpu,
        shape: Some(s),
        scheme,
        cpu: 2000,
        mem: 8 << 30,
        priority: 0,
        priority_class: None,
        owner: Some(Owner {
            group: "apps".into(),
            kind: "ReplicaSet".into(),
            name: name.clone(),
        }),
        started: None,
        deleting: false,
        mirror: false,
        local_storage: false,
        ready: true,
        workload: Some(Workload::checked("apps/ReplicaSet", &name)),
        node_selector: BTreeMap::new(),
        affinity: vec![],
        tolerations: vec![],
        models: vec![],
        scheduler: BINPACK_SCHEDULER.into(),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_scale_cluster_is_consistent_and_reproducible() {
        let p = ScaleParams {
            nodes: 50,
            gpus_per_node: 8,
            pods: 600,
            seed: 3,
            shared_nodes: 0.5,
        };
        let a = build(&p);
        assert_eq!(a, build(&p));
        assert_eq!(a.pods.len(), 600);
        assert!(a.nodes.windows(2).all(|w| w[0].name < w[1].name));
        let bound = a.pods.iter().filter(|p| p.node.is_some()).count();
        assert!(bound > 300, "{bound}");
        for p in &a.pods {
            if let (Some(n), GpuUse::Devices(_)) = (p.node, &p.gpu) {
                assert_eq!(a.nodes[n].granularity, Granularity::Device);
            }
        }
    }
}
