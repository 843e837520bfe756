//! Churn replay over days: the trace's GPU nodes under a stream of seeded Poisson
//! arrivals, a queueing scheduler, maintenance windows, and one descheduler (or none)
//! per run; queueing delay per shape class, allocation ratio, evictions, disruption.
//!
//! - **Arrivals**: pods drawn uniformly (seeded) from the workload's GPU pod list; their
//!   lifetime is drawn from the trace's own `deletion_time − creation_time` of the pods
//!   of the same shape class (`share`, `1`, `2-4`, `8` GPUs), capped at
//!   `max_lifetime_hours`; the lists without these columns (multigpu*) use the
//!   lifetimes of `default`. The Poisson rate offers `load` of the GPU capacity
//!   (rate = load · capacity / E[demand · lifetime]). At time 0 the cluster is filled
//!   with the stationary population of that process (as many pods as the rate times the
//!   mean lifetime, lifetimes drawn length-biased, each with a uniform residual), placed
//!   in random order by the run's scheduler; the warm-up then churns it.
//! - **Scheduler**: a queue in which a pod that does not fit waits without blocking the
//!   others (FIFO among those that fit). Bin-packing emulation (the `bench` one):
//!   MostAllocated node on GPU after placement (ties: node order), best-fit device.
//!   `fgd-placement` replaces it with FGD's scoring (the node and devices whose
//!   fragmentation F_n(M) rises least, M the workload's shapes covering 95% of its pods;
//!   ties: MostAllocated, then node order).
//! - **Windows**: the descheduler runs once per window opening (at its start), with a
//!   budget of `budget` · running GPU pods evictions. Evicted pods are replaced at once
//!   (their replacement enters the queue with the remaining lifetime); scheduling takes
//!   no time. The baselines evict their whole choice at once. gpu-defrag's run follows
//!   the executor over simulated time ([`step_run`]): its fences (drained nodes, and
//!   single GPUs where the node can fence them) hold from its start to its end; one
//!   eviction at a time (`maxInFlight`), the next once the replacement is Ready
//!   (`ready_seconds` after it is bound); before each eviction the run stops at the
//!   window's end, on a replacement not Ready within `rescheduleTimeout`, or when more
//!   GPU pods created since the run started are pending than `maxPendingGpuPods` plus
//!   the replacements in flight.
//! - `oracle`: at each window start every running pod is placed again from scratch,
//!   largest first on the node it leaves with the least free GPU (best fit decreasing),
//!   for free (no eviction counted), then the queue is served in order: a reference for
//!   what window-based defragmentation could reach (a good repacking, not a bound). A
//!   repacking that cannot place every running pod again is not used (that window is
//!   counted in `runsSkipped.repack-incomplete`).
//! - **Polled rows** ([`demand`]): `gpu-defrag-demand` (the nightly run plus demand runs
//!   at any time), `gpu-defrag-demand-only` (demand runs, no nightly run) and
//!   `kai-consolidation` look at the queue every `POLL_SECONDS`.
//! - **Services** (`--services FRACTION`, [`services`]): that share of the offered load is
//!   long-running, daily-scaled replicas of 40 services; the trace's jobs offer the rest.
//! - **Measures** after `warmup_days`: time-averaged GPU allocation ratio; queueing
//!   delay (arrival → running) of the pods arriving after warm-up, per class (pods still
//!   queued at the end count with their wait so far); pods queued at the end;
//!   evictions; disruption (eviction → replacement running).
use gpu_defrag_core::model::*;

mod arrivals;
mod demand;
mod oracle;
mod placement;
mod report;
mod run;
mod sim;
#[cfg(test)]
mod test_support;
mod view;
mod window;

pub use arrivals::Params;
pub use report::{Args, markdown, run_all, table};

use arrivals::Tpl;
use placement::node_ok;
use sim::{NodeS, Sim};
use view::{Ctx, gpu_defrag_policy, to_cluster_on};

#[cfg(doc)]
use crate::bench;
#[cfg(doc)]
use crate::services;
#[cfg(doc)]
use window::step_run;

/// Planners in report order. `gpu-defrag-unguarded` is gpu-defrag with
/// `maxPendingGpuPods` lifted; `gpu-defrag-8gpu` is that plus an 8-GPU target shape of weight
/// [`bench::WHOLE_NODE_SHAPE_WEIGHT`] (the policy a user who wants whole nodes writes).
///
/// `kai-consolidation` is a KAI-style consolidation at every poll, `gpu-defrag-demand`
/// gpu-defrag's nightly run plus demand runs at any time, `gpu-defrag-demand-only` the
/// demand runs alone ([`demand`]).
pub const PLANNERS: [&str; 11] = [
    "none",
    "high-node-utilization",
    "fgd-descheduler",
    "kai-consolidation",
    "gpu-defrag",
    "gpu-defrag-demand",
    "gpu-defrag-demand-only",
    "gpu-defrag-unguarded",
    "gpu-defrag-8gpu",
    "fgd-placement",
    "oracle",
];

/// Shape classes (GPUs asked).
pub const CLASSES: [&str; 4] = ["share", "1", "2-4", "8"];
/// Percentiles reported.
pub const PERCENTILES: [(&str, f64); 3] = [("p50", 50.0), ("p95", 95.0), ("p99", 99.0)];

const HOUR: f64 = 3600.0;
const DAY: f64 = 86400.0;
const NONE: u32 = u32::MAX;

/// How often a run looks again at a replacement that is still queued, seconds (and how
/// often the polled rows look at the queue, [`demand`]).
const POLL_SECONDS: f64 = 30.0;

/// The class of a shape: 0 share, 1 one GPU, 2 two to four, 3 more.
pub fn class_of(num_gpu: u32, milli: u32) -> usize {
    match num_gpu {
        0 | 1 if milli < GPU_MILLI => 0,
        0 | 1 => 1,
        2..=4 => 2,
        _ => 3,
    }
}

/// Nearest-rank percentile of sorted values (None when empty).
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

#[cfg(test)]
mod tests {
    use super::arrivals::base_time;
    use super::placement::Placer;
    use super::test_support::*;
    use super::*;
    use crate::scenario;

    #[test]
    fn percentile_is_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), Some(50.0));
        assert_eq!(percentile(&v, 95.0), Some(95.0));
        assert_eq!(percentile(&v, 99.0), Some(99.0));
        assert_eq!(percentile(&[7.0], 99.0), Some(7.0));
        assert_eq!(percentile(&[1.0, 2.0, 3.0], 50.0), Some(2.0));
        assert_eq!(percentile(&[], 50.0), None);
        assert_eq!(class_of(1, 250), 0);
        assert_eq!(class_of(1, 1000), 1);
        assert_eq!(class_of(2, 1000), 2);
        assert_eq!(class_of(4, 1000), 2);
        assert_eq!(class_of(8, 1000), 3);
    }

    /// Two 8-GPU nodes with two long 1-GPU pods each and an 8-GPU pod waiting: a demand
    /// run serves it once it has waited `minWait` (evicting the two pods of one node,
    /// which land on the other, and binding it on the room at once); KAI-style
    /// consolidation at the first poll.
    #[test]
    fn demand_runs_serve_a_waiting_8_gpu_pod() {
        let t = [tpl(1, 1000), tpl(8, 1000)];
        let trace = tiny_trace();
        let params = tiny_params();
        let base_nodes = scenario::nodes_of(&trace);
        let ctx = Ctx {
            trace: &trace,
            base_nodes: &base_nodes,
            params: &params,
            base: base_time(),
        };
        for planner in [
            "gpu-defrag-demand",
            "gpu-defrag-demand-only",
            "kai-consolidation",
        ] {
            let mut sim = Sim::new(&t, nodes(2, 8), Placer::BinPack, Vec::new());
            for i in 0..4 {
                sim.arrive(&arrival(0.0, 0, 10.0 * DAY), false);
                sim.unbind(i);
                sim.bind(i, i % 2, 1 << (i / 2), 0.0);
            }
            sim.arrive(&arrival(HOUR, 1, HOUR), true);
            assert_eq!(sim.queued(), 1);
            demand::poll(&mut sim, &ctx, planner, HOUR + 300.0);
            if planner != "kai-consolidation" {
                assert_eq!(sim.queued(), 1, "{planner}: not before minWait");
                demand::poll(&mut sim, &ctx, planner, HOUR + 600.0);
            }
            assert_eq!(sim.queued(), 0, "{planner}");
            assert_eq!(sim.evictions, 2, "{planner}");
            assert_eq!(sim.demand.runs, 1, "{planner}");
            assert_eq!(sim.demand.served_on_room, 1, "{planner}");
            assert_eq!(sim.demand.landed_as_planned, 2, "{planner}");
            let wait = if planner == "kai-consolidation" {
                300.0
            } else {
                600.0
            };
            assert_eq!(sim.waits[3], vec![wait], "{planner}");
            let n = sim.pods[4].node;
            assert!(
                sim.pods.iter().filter(|p| p.node == n).count() == 1,
                "{planner}: the 8-GPU pod alone on its node"
            );
        }
    }
}
