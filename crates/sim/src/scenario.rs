//! Builds a fragmented cluster from the trace, reproducibly from a seed.
//!
//! 1. Every GPU node of the trace becomes a [`Node`] of device granularity (the trace
//!    shares single GPUs: `gpu_milli < 1000` for `num_gpu == 1`), one HAMi-like scheme.
//! 2. The workload's GPU pods arrive in a shuffled order and are placed by a
//!    **spreading** scheduler: among the nodes that fit (GPU model, cpu, memory, GPUs),
//!    the least allocated one on GPU after placement (ties: random), and a random device
//!    among those that fit. Pods that fit nowhere are skipped. Arrivals continue until
//!    the requested GPU reaches `load` of the capacity; a workload whose pod list is
//!    used up first is drawn again in a fresh shuffle (names get a `-r<pass>` suffix).
//! 3. `departures` of the placed pods (a fraction) leave at random.
//!
//! CPU-only pods of the trace are skipped (they would take CPU only; the trace nodes
//! have CPU to spare at these loads and the metric ignores them).
use std::collections::BTreeMap;

use gpu_defrag_core::ingest::BINPACK_SCHEDULER;
use gpu_defrag_core::model::*;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::trace::{Trace, TracePod};

/// Namespace of the trace pods.
pub const NAMESPACE: &str = "openb";
/// Pods a trace node may hold (not a limit in practice).
pub const PODS_PER_NODE: u64 = 256;

/// Scenario parameters.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Params {
    /// Workload name (pod list).
    pub workload: String,
    /// Seed.
    pub seed: u64,
    /// Requested GPU to reach, fraction of capacity.
    pub load: f64,
    /// Fraction of placed pods removed.
    pub departures: f64,
}

/// What the builder did.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    /// Nodes.
    pub nodes: usize,
    /// GPUs.
    pub gpus: u64,
    /// GPU pods in the workload's list.
    pub workload_gpu_pods: usize,
    /// CPU-only pods of the list, skipped.
    pub cpu_only_skipped: usize,
    /// Arrivals placed.
    pub placed: usize,
    /// Arrivals that fit nowhere (skipped).
    pub unplaced_arrivals: usize,
    /// Passes over the pod list.
    pub passes: usize,
    /// Requested GPU / capacity after arrivals.
    pub load_reached: f64,
    /// Pods removed.
    pub departed: usize,
    /// Pods bound at the end.
    pub bound_pods: usize,
    /// Requested GPU / capacity at the end.
    pub load_after_departures: f64,
}

struct Placed {
    pod: usize,
    name: String,
    node: usize,
    devs: Vec<usize>,
}

/// Nodes of the model from the trace nodes (sorted by name already).
pub fn nodes_of(trace: &Trace) -> Vec<Node> {
    trace
        .nodes
        .iter()
        .map(|t| Node {
            name: t.name.clone(),
            labels: BTreeMap::from([("kubernetes.io/hostname".to_string(), t.name.clone())]),
            taints: vec![],
            ready: true,
            unschedulable: false,
            model: Some(t.model.clone()),
            scheme: Scheme::Hami,
            granularity: Granularity::Device,
            gpus: (0..t.gpus)
                .map(|g| Gpu {
                    key: g.to_string(),
                    used: 0,
                    healthy: true,
                    memory_mib: None,
                })
                .collect(),
            cpu_alloc: t.cpu_milli,
            mem_alloc: t.memory_mib << 20,
            pods_alloc: PODS_PER_NODE,
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
        })
        .collect()
}

fn demand(p: &TracePod) -> u64 {
    u64::from(p.num_gpu) * u64::from(p.gpu_milli)
}

/// Devices a spreading scheduler would pick: random among those that fit.
fn spread_devices(free: &[Milli], p: &TracePod, rng: &mut StdRng) -> Option<Vec<usize>> {
    let mut fit: Vec<usize> = (0..free.len())
        .filter(|&g| free[g] >= p.gpu_milli)
        .collect();
    if fit.len() < p.num_gpu as usize {
        return None;
    }
    fit.shuffle(rng);
    fit.truncate(p.num_gpu as usize);
    fit.sort_unstable();
    Some(fit)
}

fn model_ok(p: &TracePod, n: &Node) -> bool {
    p.models.is_empty() || n.model.as_ref().is_some_and(|m| p.models.contains(m))
}

/// A GPU pod of the model for a trace pod, bound to `node` on `devs`.
pub fn pod_of(t: &TracePod, name: String, node: Option<(usize, &str)>, devs: &[usize]) -> Pod {
    Pod {
        namespace: NAMESPACE.into(),
        name: name.clone(),
        node: node.map(|(i, _)| i),
        node_name: node.map(|(_, n)| n.to_string()),
        phase: if node.is_some() {
            Phase::Running
        } else {
            Phase::Pending
        },
        labels: BTreeMap::from([("app".to_string(), name.clone())]).into(),
        annotations: BTreeMap::new(),
        gpu: if node.is_some() {
            GpuUse::Devices(devs.iter().map(|&g| (g, t.gpu_milli)).collect())
        } else {
            GpuUse::None
        },
        shape: Some(GpuShape {
            gpus: t.num_gpu,
            milli: t.gpu_milli,
        }),
        scheme: Some(Scheme::Hami),
        cpu: t.cpu_milli,
        mem: t.memory_mib << 20,
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
        models: t.models.clone(),
        scheduler: BINPACK_SCHEDULER.into(),
        ..Default::default()
    }
}

/// Builds the fragmented cluster.
pub fn build(trace: &Trace, p: &Params) -> (Cluster, Summary) {
    let mut rng = StdRng::seed_from_u64(p.seed);
    let nodes = nodes_of(trace);
    let cap: u64 = nodes.iter().map(|n| n.gpus.len() as u64 * 1000).sum();
    let target = (p.load.clamp(0.0, 1.0) * cap as f64).round() as u64;
    let mut f = Fill {
        node_cap: nodes.iter().map(|n| n.gpus.len() as u64 * 1000).collect(),
        free: nodes.iter().map(|n| vec![1000; n.gpus.len()]).collect(),
        used: vec![0; nodes.len()],
        nodes,
        placed: Vec::new(),
        requested: 0,
    };
    let (unplaced, passes) = f.arrivals(trace, target, &mut rng);
    let load_reached = f.requested as f64 / cap.max(1) as f64;
    let n_placed = f.placed.len();
    let (gone, leave) = f.departures(trace, p.departures, &mut rng);
    let Fill {
        nodes,
        placed,
        requested,
        ..
    } = f;
    let mut pods: Vec<Pod> = placed
        .iter()
        .zip(&gone)
        .filter(|(_, g)| !**g)
        .map(|(pl, _)| {
            pod_of(
                &trace.pods[pl.pod],
                pl.name.clone(),
                Some((pl.node, &nodes[pl.node].name)),
                &pl.devs,
            )
        })
        .collect();
    pods.sort_by(|a, b| a.name.cmp(&b.name));
    let summary = Summary {
        nodes: nodes.len(),
        gpus: cap / 1000,
        workload_gpu_pods: trace.pods.len(),
        cpu_only_skipped: trace.cpu_only_skipped,
        placed: n_placed,
        unplaced_arrivals: unplaced,
        passes,
        load_reached,
        departed: leave,
        bound_pods: pods.len(),
        load_after_departures: requested as f64 / cap.max(1) as f64,
    };
    (
        Cluster {
            nodes,
            pods,
            pdbs: vec![],
            now: None,
            ..Default::default()
        },
        summary,
    )
}

/// The cluster while [`build`] fills it.
struct Fill {
    nodes: Vec<Node>,
    /// GPU milli per node.
    node_cap: Vec<u64>,
    /// Free milli per GPU, by node.
    free: Vec<Vec<Milli>>,
    /// Requested GPU milli per node.
    used: Vec<u64>,
    placed: Vec<Placed>,
    /// Requested GPU milli in all.
    requested: u64,
}

impl Fill {
    /// Arrivals in shuffled passes over the pod list until the requested GPU reaches
    /// `target` (at most 20 passes; stops when a pass places nothing). Returns the
    /// arrivals that fit nowhere and the passes.
    fn arrivals(&mut self, trace: &Trace, target: u64, rng: &mut StdRng) -> (usize, usize) {
        let mut unplaced = 0usize;
        let mut passes = 0usize;
        let max_passes = 20;
        'outer: while self.requested < target && !trace.pods.is_empty() && passes < max_passes {
            passes += 1;
            let mut order: Vec<usize> = (0..trace.pods.len()).collect();
            order.shuffle(rng);
            let mut placed_this_pass = 0;
            for pi in order {
                if self.requested >= target {
                    break 'outer;
                }
                let t = &trace.pods[pi];
                let Some(n) = self.least_allocated(t, rng) else {
                    unplaced += 1;
                    continue;
                };
                self.place(trace, pi, n, passes, rng);
                placed_this_pass += 1;
            }
            if placed_this_pass == 0 {
                break;
            }
        }
        (unplaced, passes)
    }

    /// The node the spreading scheduler picks for `t`: least allocated on GPU after
    /// placement among those that fit; ties broken at random (reservoir).
    fn least_allocated(&self, t: &TracePod, rng: &mut StdRng) -> Option<usize> {
        let d = demand(t);
        let mut best: Option<(u64, usize)> = None;
        let mut ties = 0u32;
        for (n, node) in self.nodes.iter().enumerate() {
            if node.cpu_free() < t.cpu_milli
                || node.mem_free() < t.memory_mib << 20
                || node.pods_used >= node.pods_alloc
                || !model_ok(t, node)
                || self.free[n].iter().filter(|f| **f >= t.gpu_milli).count() < t.num_gpu as usize
            {
                continue;
            }
            let score = (self.used[n] + d) * 1_000_000 / self.node_cap[n];
            match best {
                Some((s, _)) if score > s => {}
                Some((s, _)) if score == s => {
                    ties += 1;
                    if rng.random_range(0..ties + 1) == 0 {
                        best = Some((score, n));
                    }
                }
                _ => {
                    best = Some((score, n));
                    ties = 0;
                }
            }
        }
        best.map(|(_, n)| n)
    }

    /// Places trace pod `pi` on node `n` (random devices that fit), in pass `passes`.
    fn place(&mut self, trace: &Trace, pi: usize, n: usize, passes: usize, rng: &mut StdRng) {
        let t = &trace.pods[pi];
        let d = demand(t);
        let devs = spread_devices(&self.free[n], t, rng).expect("checked above");
        for &g in &devs {
            self.free[n][g] -= t.gpu_milli;
            self.nodes[n].gpus[g].used += t.gpu_milli;
        }
        self.nodes[n].cpu_used += t.cpu_milli;
        self.nodes[n].mem_used += t.memory_mib << 20;
        self.nodes[n].pods_used += 1;
        self.used[n] += d;
        self.requested += d;
        let name = if passes == 1 {
            t.name.clone()
        } else {
            format!("{}-r{}", t.name, passes - 1)
        };
        self.placed.push(Placed {
            pod: pi,
            name,
            node: n,
            devs,
        });
    }

    /// `departures` of the placed pods (a fraction) leave at random. Returns which
    /// left, and how many.
    fn departures(
        &mut self,
        trace: &Trace,
        departures: f64,
        rng: &mut StdRng,
    ) -> (Vec<bool>, usize) {
        let n_placed = self.placed.len();
        let leave = ((departures.clamp(0.0, 1.0) * n_placed as f64).round() as usize).min(n_placed);
        let mut idx: Vec<usize> = (0..n_placed).collect();
        idx.shuffle(rng);
        let mut gone = vec![false; n_placed];
        for &i in &idx[..leave] {
            gone[i] = true;
            let pl = &self.placed[i];
            let t = &trace.pods[pl.pod];
            let node = &mut self.nodes[pl.node];
            for &g in &pl.devs {
                node.gpus[g].used -= t.gpu_milli;
            }
            node.cpu_used -= t.cpu_milli;
            node.mem_used -= t.memory_mib << 20;
            node.pods_used -= 1;
            self.requested -= demand(t);
        }
        (gone, leave)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::trace::TraceNode;

    /// A small trace: 6 nodes (8, 4 and 2 GPUs), 60 pods of mixed shapes.
    pub(crate) fn tiny_trace() -> Trace {
        let mut nodes = Vec::new();
        for (i, g) in [8u32, 8, 8, 4, 4, 2].iter().enumerate() {
            nodes.push(TraceNode {
                name: format!("n-{i}"),
                cpu_milli: 96_000,
                memory_mib: 786_432,
                gpus: *g,
                model: if i % 2 == 0 { "A".into() } else { "B".into() },
            });
        }
        let shapes = [
            (1, 250),
            (1, 500),
            (1, 1000),
            (2, 1000),
            (1, 300),
            (4, 1000),
        ];
        let pods = (0..60)
            .map(|i| {
                let (g, m) = shapes[i % shapes.len()];
                TracePod {
                    name: format!("p-{i:03}"),
                    cpu_milli: 2000,
                    memory_mib: 4096,
                    num_gpu: g,
                    gpu_milli: m,
                    models: if i % 7 == 0 { vec!["A".into()] } else { vec![] },
                }
            })
            .collect();
        Trace {
            nodes,
            pods,
            cpu_only_skipped: 0,
        }
    }

    pub(crate) fn params(seed: u64) -> Params {
        Params {
            workload: "tiny".into(),
            seed,
            load: 0.9,
            departures: 0.3,
        }
    }

    fn check_consistent(c: &Cluster) {
        let mut used: Vec<Vec<Milli>> = c.nodes.iter().map(|n| vec![0; n.gpus.len()]).collect();
        for p in &c.pods {
            let n = p.node.unwrap();
            assert_eq!(c.nodes[n].name, *p.node_name.as_ref().unwrap());
            if let GpuUse::Devices(d) = &p.gpu {
                for (g, m) in d {
                    used[n][*g] += m;
                }
            }
            assert!(p.models.is_empty() || p.models.contains(c.nodes[n].model.as_ref().unwrap()));
        }
        for (n, node) in c.nodes.iter().enumerate() {
            for (g, gpu) in node.gpus.iter().enumerate() {
                assert_eq!(gpu.used, used[n][g]);
                assert!(gpu.used <= 1000);
            }
        }
        assert!(c.pods.windows(2).all(|w| w[0].name < w[1].name));
    }

    #[test]
    fn same_seed_same_cluster_other_seed_other_cluster() {
        let t = tiny_trace();
        let (a, sa) = build(&t, &params(7));
        let (b, sb) = build(&t, &params(7));
        let (c, _) = build(&t, &params(8));
        assert_eq!(a, b);
        assert_eq!(sa, sb);
        assert_ne!(a, c);
        check_consistent(&a);
        check_consistent(&c);
        assert!(sa.load_reached >= 0.85, "{sa:?}");
        assert_eq!(sa.bound_pods + sa.departed, sa.placed);
        assert!(sa.load_after_departures < sa.load_reached);
    }
}
