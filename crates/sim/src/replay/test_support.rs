//! Builders shared by the replay's tests: pod shapes, nodes, arrivals, a tiny trace.

use gpu_defrag_core::model::*;

use super::arrivals::{Arrival, Params, Tpl};
use super::class_of;
use super::sim::NodeS;
use crate::trace::Trace;

pub(super) fn tpl(gpus: u32, milli: u32) -> Tpl {
    Tpl {
        gpus,
        milli,
        cpu: 1000,
        mem: 1 << 30,
        models: 0,
        class: class_of(gpus, milli),
        demand: u64::from(gpus) * u64::from(milli),
    }
}

pub(super) fn nodes(n: usize, gpus: usize) -> Vec<NodeS> {
    (0..n)
        .map(|_| {
            let mut free = [0; 8];
            free[..gpus].fill(GPU_MILLI);
            NodeS {
                gpus,
                free,
                cpu_free: 96_000,
                mem_free: 512 << 30,
                pods_free: 256,
                model: 1,
                group: 0,
            }
        })
        .collect()
}

pub(super) fn arrival(t: f64, tpl: u32, life: f64) -> Arrival {
    Arrival { t, tpl, life }
}

pub(super) fn tiny_trace() -> Trace {
    Trace {
        nodes: (0..2)
            .map(|i| crate::trace::TraceNode {
                name: format!("n-{i}"),
                cpu_milli: 96_000,
                memory_mib: 512 << 10,
                gpus: 8,
                model: "A".into(),
            })
            .collect(),
        pods: [(1, 1000), (8, 1000)]
            .iter()
            .map(|&(g, m)| crate::trace::TracePod {
                name: format!("t{g}"),
                cpu_milli: 1000,
                memory_mib: 1 << 10,
                num_gpu: g,
                gpu_milli: m,
                models: vec![],
            })
            .collect(),
        cpu_only_skipped: 0,
    }
}

pub(super) fn tiny_params() -> Params {
    Params {
        workload: "tiny".into(),
        seed: 1,
        days: 2.0,
        warmup_days: 0.0,
        load: 0.9,
        windows: vec![],
        window_hours: 3.0,
        budget: 0.5,
        max_lifetime_hours: 1e6,
        hnu_threshold: 50.0,
        max_pending_gpu_pods: 5,
        ready_seconds: 30.0,
        services: 0.0,
    }
}
