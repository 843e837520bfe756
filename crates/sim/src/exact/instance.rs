//! What the MILP is built from and what it gives back, in the model: the linearised
//! metric, the evictable pods and where each may land, a landing plan applied, and
//! per-GPU landing counts dealt into pods.

use anyhow::{Context, Result, ensure};
use gpu_defrag_core::frag;
use gpu_defrag_core::model::*;
use gpu_defrag_core::policy::TargetShape;
use gpu_defrag_core::sched;

use crate::bench;

/// The bench's fragment metric for a set of target shapes, in the linearised form the
/// MILP uses (see the module documentation).
#[derive(Debug, Clone, PartialEq)]
pub struct Metric {
    /// Lowest free milli of each level.
    pub lo: Vec<Milli>,
    /// Highest free milli of each level.
    pub hi: Vec<Milli>,
    /// Coefficient of a GPU's free milli on each level.
    pub coef: Vec<f64>,
    /// Multi-GPU shapes: (GPUs, milli per GPU, weight).
    pub multi: Vec<(u32, Milli, f64)>,
}

impl Metric {
    /// The levels and coefficients of `shapes`. Shapes with cpu, memory or GPU model
    /// terms are refused (the bench derives none; they would make a GPU's term depend
    /// on its node's cpu and memory).
    pub fn of(shapes: &[TargetShape]) -> Result<Metric> {
        let mut cuts: Vec<Milli> = Vec::new();
        for m in shapes {
            ensure!(
                m.cpu.is_none() && m.memory.is_none() && m.models.is_empty(),
                "target shape {}×{} has a cpu, memory or model term: not supported by the exact model",
                m.gpus,
                m.milli_per_gpu
            );
            let q = m.milli_per_gpu.min(GPU_MILLI);
            if m.gpus > 0 && q > 0 {
                cuts.push(q);
            }
        }
        cuts.sort_unstable();
        cuts.dedup();
        let mut lo = vec![0];
        lo.extend(cuts.iter().copied());
        lo.dedup();
        let hi: Vec<Milli> = (0..lo.len())
            .map(|j| lo.get(j + 1).map_or(GPU_MILLI, |n| n - 1))
            .collect();
        let coef = lo
            .iter()
            .map(|&l| {
                shapes
                    .iter()
                    .filter(|m| m.gpus != 1 || m.milli_per_gpu.min(GPU_MILLI) > l)
                    .map(|m| m.weight)
                    .sum()
            })
            .collect();
        let multi = shapes
            .iter()
            .filter(|m| m.gpus >= 2)
            .map(|m| (m.gpus, m.milli_per_gpu.min(GPU_MILLI), m.weight))
            .collect();
        Ok(Metric {
            lo,
            hi,
            coef,
            multi,
        })
    }

    /// The level of a GPU with `r` free milli.
    pub fn level(&self, r: Milli) -> usize {
        self.lo.partition_point(|&l| l <= r).saturating_sub(1)
    }

    /// A node's fragment milli computed from the levels: the MILP's objective term.
    pub fn node_value(&self, free: &[Milli]) -> f64 {
        let mut v: f64 = free
            .iter()
            .map(|&r| self.coef[self.level(r)] * f64::from(r))
            .sum();
        for &(k, q, w) in &self.multi {
            let above = free.iter().filter(|&&r| r >= q);
            if above.clone().count() >= k as usize {
                v -= w * above.map(|&r| f64::from(r)).sum::<f64>();
            }
        }
        v
    }
}

/// An evictable pod of the instance.
#[derive(Debug, Clone)]
pub struct Candidate {
    /// Pod index in the cluster.
    pub pod: usize,
    /// Its node.
    pub node: usize,
    /// Its devices and milli on each.
    pub devs: Vec<(usize, Milli)>,
    /// GPUs it asks for.
    pub gpus: u32,
    /// Milli per GPU.
    pub milli: Milli,
    /// Nodes it may land on (its own included).
    pub land: Vec<usize>,
}

/// What the MILP is built from: the evictable pods and where each may land.
#[derive(Debug, Clone)]
pub struct Instance {
    /// Evictable pods: bound GPU pods on counted nodes.
    pub cands: Vec<Candidate>,
    /// Nodes counted by the metric (the others are left alone).
    pub counted: Vec<bool>,
    /// The metric.
    pub metric: Metric,
    /// Eviction budget.
    pub budget: usize,
}

impl Instance {
    /// The instance of a cluster, target shapes and budget.
    pub fn of(c: &Cluster, shapes: &[TargetShape], budget: usize) -> Result<Instance> {
        let metric = Metric::of(shapes)?;
        let scope = Default::default();
        let counted: Vec<bool> = c.nodes.iter().map(|n| frag::counted(n, &scope)).collect();
        let mut cands = Vec::new();
        for (pi, p) in c.pods.iter().enumerate() {
            let Some(n) = p.node else { continue };
            if !(p.is_active_bound() && p.held_milli() > 0 && counted[n]) {
                continue;
            }
            let GpuUse::Devices(d) = &p.gpu else { continue };
            let shape = p
                .shape
                .with_context(|| format!("pod {} has no GPU shape", p.name))?;
            let land = (0..c.nodes.len())
                .filter(|&m| counted[m] && may_land(p, &c.nodes[m]))
                .collect();
            cands.push(Candidate {
                pod: pi,
                node: n,
                devs: d.clone(),
                gpus: shape.gpus,
                milli: shape.milli.min(GPU_MILLI),
                land,
            });
        }
        Ok(Instance {
            cands,
            counted,
            metric,
            budget,
        })
    }
}

/// Whether pod `p` may be placed on `node` at all (capacity left aside): placement rules,
/// scheme, a node whose use is known, enough healthy GPUs, cpu and memory.
fn may_land(p: &Pod, node: &Node) -> bool {
    let shape = p.shape.unwrap_or(GpuShape { gpus: 0, milli: 0 });
    node.unknown_pods == 0
        && node.inconsistent.is_none()
        && p.scheme.is_none_or(|s| s == node.scheme)
        && sched::placement_allowed(p, node)
        && node.gpus.iter().filter(|g| g.healthy).count() >= shape.gpus as usize
        && node.cpu_alloc >= p.cpu
        && node.mem_alloc >= p.mem
}

/// A plan in full: evicted pods and where each lands.
#[derive(Debug, Clone, Default)]
pub struct Landing {
    /// (pod, node, devices).
    pub moves: Vec<(usize, usize, Vec<usize>)>,
}

/// Applies a landing plan; fails when it overfills a GPU, cpu, memory or pod slots.
pub fn apply(c: &Cluster, plan: &Landing) -> Result<Cluster> {
    let mut out = c.clone();
    for (pi, _, _) in &plan.moves {
        bench::unbind(&mut out, *pi);
    }
    for (pi, n, devs) in &plan.moves {
        let p = &out.pods[*pi];
        let milli = p.shape.map_or(GPU_MILLI, |s| s.milli);
        let node = &out.nodes[*n];
        for &g in devs {
            let gpu = node.gpus.get(g).context("no such GPU")?;
            ensure!(
                gpu.healthy && gpu.used + milli <= GPU_MILLI,
                "GPU {g} of {} overfilled",
                node.name
            );
        }
        ensure!(
            node.cpu_free() >= p.cpu
                && node.mem_free() >= p.mem
                && node.pods_used < node.pods_alloc,
            "node {} overfilled",
            node.name
        );
        bench::bind(&mut out, *pi, *n, devs);
    }
    Ok(out)
}

/// Deals per-GPU landing counts of one class on one node into pods: `pods` each take
/// `k` distinct GPUs, largest remaining count first. `counts` (GPU, count) must satisfy
/// count ≤ pods.len() and Σ count = k·pods.len().
pub fn deal(pods: &[usize], k: usize, counts: &[(usize, u32)]) -> Result<Vec<(usize, Vec<usize>)>> {
    let mut left: Vec<(usize, u32)> = counts.iter().copied().filter(|c| c.1 > 0).collect();
    let mut out = Vec::new();
    for &p in pods {
        left.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        ensure!(
            left.len() >= k && left[..k].iter().all(|c| c.1 > 0),
            "landing counts cannot be dealt"
        );
        let mut devs: Vec<usize> = left[..k].iter().map(|c| c.0).collect();
        for c in &mut left[..k] {
            c.1 -= 1;
        }
        devs.sort_unstable();
        out.push((p, devs));
    }
    ensure!(left.iter().all(|c| c.1 == 0), "landing counts left over");
    Ok(out)
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    use super::*;
    use crate::scenario;
    use crate::scenario::tests::*;

    fn shape(gpus: u32, milli: Milli, weight: f64) -> TargetShape {
        TargetShape::of_gpus(gpus, milli, weight)
    }

    /// The linearised metric is the bench's metric, node by node, for single-GPU,
    /// multi-GPU and zero-GPU shapes.
    #[test]
    fn levels_give_the_metric_exactly() {
        let shapes = vec![
            shape(1, 250, 0.2),
            shape(1, 500, 0.15),
            shape(1, 1000, 0.25),
            shape(2, 1000, 0.1),
            shape(4, 1000, 0.1),
            shape(2, 600, 0.1),
            shape(0, 0, 0.1),
        ];
        let m = Metric::of(&shapes).unwrap();
        assert_eq!(m.lo, vec![0, 250, 500, 600, 1000]);
        assert_eq!(m.hi, vec![249, 499, 599, 999, 1000]);
        let mut rng = StdRng::seed_from_u64(3);
        let steps = [0, 1, 100, 249, 250, 251, 499, 500, 599, 600, 700, 999, 1000];
        for _ in 0..2000 {
            let n = 1 + rand::Rng::random_range(&mut rng, 0..8usize);
            let free: Vec<Milli> = (0..n)
                .map(|_| steps[rand::Rng::random_range(&mut rng, 0..steps.len())])
                .collect();
            let node = frag_node(&free);
            let want = frag::node_fragment(&node, &free, node.cpu_free(), node.mem_free(), &shapes);
            let got = m.node_value(&free);
            assert!((want - got).abs() < 1e-9, "{free:?}: {got} ≠ {want}");
        }
    }

    fn frag_node(free: &[Milli]) -> Node {
        let (c, _) = scenario::build(&tiny_trace(), &params(1));
        let mut n = c.nodes[0].clone();
        n.gpus = free
            .iter()
            .enumerate()
            .map(|(i, f)| Gpu {
                key: i.to_string(),
                used: GPU_MILLI - f,
                healthy: true,
                memory_mib: None,
            })
            .collect();
        n
    }

    #[test]
    fn shapes_with_cpu_terms_are_refused() {
        let mut s = shape(1, 500, 1.0);
        s.cpu = Some(1000);
        assert!(Metric::of(&[s]).is_err());
    }

    #[test]
    fn counts_are_dealt_on_distinct_gpus() {
        let d = deal(&[7, 8, 9], 2, &[(0, 3), (1, 1), (2, 2)]).unwrap();
        for (_, devs) in &d {
            assert_eq!(devs.len(), 2);
            assert_ne!(devs[0], devs[1]);
        }
        let mut used = [0; 3];
        for (_, devs) in &d {
            for &g in devs {
                used[g] += 1;
            }
        }
        assert_eq!(used, [3, 1, 2]);
        assert!(deal(&[1], 2, &[(0, 2)]).is_err());
    }

    #[test]
    fn landing_nodes_respect_models_and_sizes() {
        let (c, _) = scenario::build(&tiny_trace(), &params(2));
        let shapes = frag::default_shapes(&c, &Default::default());
        let inst = Instance::of(&c, &shapes, 3).unwrap();
        assert!(!inst.cands.is_empty());
        for cand in &inst.cands {
            let p = &c.pods[cand.pod];
            assert!(cand.land.contains(&cand.node), "{}", p.name);
            for &n in &cand.land {
                assert!(c.nodes[n].gpus.len() >= cand.gpus as usize);
                assert!(
                    p.models.is_empty() || p.models.contains(c.nodes[n].model.as_ref().unwrap())
                );
            }
        }
    }
}
