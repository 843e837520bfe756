//! The cluster as a plan leaves it.

use super::Plan;
use crate::model::*;

/// The cluster as it is expected to be after the plan: every moved pod re-bound to its
/// expected target (node and devices), node and GPU use recomputed.
pub fn apply(cluster: &Cluster, plan: &Plan) -> Cluster {
    let mut c = cluster.clone();
    for m in &plan.moves {
        let Some(to) = c.node_index(&m.to_node) else {
            continue;
        };
        let pod = &c.pods[m.pod_index];
        let (from, held, cpu, mem, shape) =
            (pod.node, pod.gpu.clone(), pod.cpu, pod.mem, pod.shape);
        if let Some(f) = from {
            let n = &mut c.nodes[f];
            match &held {
                GpuUse::Devices(d) => {
                    for (g, v) in d {
                        if let Some(gpu) = n.gpus.get_mut(*g) {
                            gpu.used = gpu.used.saturating_sub(*v);
                        }
                    }
                }
                GpuUse::Whole(w) => {
                    let mut left = *w;
                    for gpu in n.gpus.iter_mut().rev() {
                        if left > 0 && gpu.used == GPU_MILLI {
                            gpu.used = 0;
                            left -= 1;
                        }
                    }
                }
                _ => {}
            }
            n.cpu_used = n.cpu_used.saturating_sub(cpu);
            n.mem_used = n.mem_used.saturating_sub(mem);
            n.pods_used = n.pods_used.saturating_sub(1);
        }
        let tn = &mut c.nodes[to];
        let milli = shape.map(|s| s.milli).unwrap_or(GPU_MILLI);
        let new_use = if tn.granularity == Granularity::Device {
            let devs: Vec<(usize, Milli)> = m
                .to_devices
                .iter()
                .filter_map(|k| tn.gpus.iter().position(|g| &g.key == k))
                .map(|g| (g, milli))
                .collect();
            for (g, v) in &devs {
                tn.gpus[*g].used = (tn.gpus[*g].used + v).min(GPU_MILLI);
            }
            GpuUse::Devices(devs)
        } else {
            let w = shape.map(|s| s.gpus).unwrap_or(0);
            let mut left = w;
            for gpu in tn.gpus.iter_mut() {
                if left > 0 && gpu.used == 0 {
                    gpu.used = GPU_MILLI;
                    left -= 1;
                }
            }
            GpuUse::Whole(w)
        };
        tn.cpu_used += cpu;
        tn.mem_used += mem;
        tn.pods_used += 1;
        let name = tn.name.clone();
        let pod = &mut c.pods[m.pod_index];
        pod.node = Some(to);
        pod.node_name = Some(name);
        pod.gpu = new_use;
    }
    c
}
