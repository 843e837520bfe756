//! The simulated cluster: nodes, pods and the scheduler's queue, and what happens to
//! them (binding, departures, arrivals, evictions, services scaling, the measures).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use gpu_defrag_core::model::*;
use gpu_defrag_core::policy::TargetShape;

use super::arrivals::{Arrival, Tpl};
use super::placement::{Placer, node_ok};
use super::window::RunSim;
use super::{NONE, demand};
use crate::plot::Sample;
use crate::services::Service;

#[derive(Debug, Clone)]
pub(super) struct NodeS {
    pub(super) gpus: usize,
    pub(super) free: [u32; 8],
    pub(super) cpu_free: u64,
    pub(super) mem_free: u64,
    pub(super) pods_free: u64,
    pub(super) model: u64, // bit
    pub(super) group: usize,
}

impl NodeS {
    pub(super) fn free_total(&self) -> u64 {
        self.free[..self.gpus].iter().map(|&f| u64::from(f)).sum()
    }
}

#[derive(Debug, Clone)]
pub(super) struct PodS {
    pub(super) tpl: u32,
    /// When this incarnation entered the queue.
    pub(super) queued_at: f64,
    /// Lifetime left when it starts.
    pub(super) remaining: f64,
    pub(super) end: f64,
    pub(super) node: u32,
    pub(super) devs: u8,
    pub(super) epoch: u32,
    pub(super) seq: u64,
    /// Evicted (or displaced) at: its replacement's disruption is measured.
    pub(super) evicted_at: Option<f64>,
    /// Counted in the queueing delay (arrived after warm-up, not a replacement).
    pub(super) measured: bool,
    pub(super) bound_at: f64,
    /// The service it is a replica of ([`NONE`]: a trace job).
    pub(super) svc: u32,
}

#[derive(Clone)]
pub(super) struct Fences {
    pub(super) node: Vec<bool>,
    pub(super) gpu: Vec<u8>,
}

#[derive(Clone)]
pub(super) struct Sim<'a> {
    pub(super) tpl: &'a [Tpl],
    pub(super) nodes: Vec<NodeS>,
    /// Per group (GPU count, model): (free milli, node) in order.
    pub(super) index: Vec<std::collections::BTreeSet<(u64, u32)>>,
    pub(super) group_gpus: Vec<usize>,
    pub(super) group_model: Vec<u64>,
    pub(super) pods: Vec<PodS>,
    /// Queue buckets: 0 share, k whole k-GPU pods (k ≤ 8); seq → pod.
    pub(super) queue: Vec<BTreeMap<u64, usize>>,
    pub(super) seq: u64,
    pub(super) heap: BinaryHeap<Reverse<(u64, usize, u32)>>,
    pub(super) placer: Placer,
    pub(super) fgd_shapes: Vec<TargetShape>,
    /// Fences in force (a gpu-defrag run): the scheduler skips them.
    pub(super) fences: Option<Fences>,
    /// The gpu-defrag run in progress.
    pub(super) run: Option<RunSim>,
    pub(super) capacity: u64,
    pub(super) alloc: u64,
    // measures
    pub(super) t_prev: f64,
    pub(super) warmup: f64,
    pub(super) alloc_integral: f64,
    pub(super) waits: [Vec<f64>; 4],
    pub(super) disruptions: Vec<f64>,
    pub(super) evictions: usize,
    pub(super) displaced: usize,
    pub(super) runs: usize,
    pub(super) runs_skipped: BTreeMap<String, usize>,
    pub(super) runs_ended: BTreeMap<String, usize>,
    /// Allocated milli integrated from time 0 (for the time series).
    pub(super) alloc_integral_all: f64,
    /// `alloc_integral_all` at the last sample.
    pub(super) sample_integral: f64,
    /// Replicas of each service, in creation order.
    pub(super) svc_pods: Vec<Vec<usize>>,
    /// Evictions of service replicas.
    pub(super) svc_evictions: usize,
    /// What the polled rows did ([`demand`]).
    pub(super) demand: demand::Stats,
}

pub(super) fn bucket_of(t: &Tpl) -> usize {
    if t.gpus == 1 && t.milli < GPU_MILLI {
        0
    } else {
        (t.gpus as usize).min(8)
    }
}

impl<'a> Sim<'a> {
    pub(super) fn new(
        tpl: &'a [Tpl],
        nodes: Vec<NodeS>,
        placer: Placer,
        shapes: Vec<TargetShape>,
    ) -> Self {
        let groups = nodes.iter().map(|n| n.group).max().map_or(0, |g| g + 1);
        let mut group_gpus = vec![0; groups];
        let mut group_model = vec![0; groups];
        let mut index = vec![std::collections::BTreeSet::new(); groups];
        for (i, n) in nodes.iter().enumerate() {
            group_gpus[n.group] = n.gpus;
            group_model[n.group] = n.model;
            index[n.group].insert((n.free_total(), i as u32));
        }
        let capacity = nodes.iter().map(|n| n.gpus as u64 * 1000).sum();
        Sim {
            tpl,
            nodes,
            index,
            group_gpus,
            group_model,
            pods: Vec::new(),
            queue: vec![BTreeMap::new(); 9],
            seq: 0,
            heap: BinaryHeap::new(),
            placer,
            fgd_shapes: shapes,
            fences: None,
            run: None,
            capacity,
            alloc: 0,
            t_prev: 0.0,
            warmup: 0.0,
            alloc_integral: 0.0,
            waits: Default::default(),
            disruptions: Vec::new(),
            evictions: 0,
            displaced: 0,
            runs: 0,
            runs_skipped: BTreeMap::new(),
            runs_ended: BTreeMap::new(),
            alloc_integral_all: 0.0,
            sample_integral: 0.0,
            svc_pods: Vec::new(),
            svc_evictions: 0,
            demand: demand::Stats::default(),
        }
    }

    pub(super) fn advance(&mut self, t: f64) {
        let from = self.t_prev.max(self.warmup);
        if t > from {
            self.alloc_integral += self.alloc as f64 * (t - from);
        }
        if t > self.t_prev {
            self.alloc_integral_all += self.alloc as f64 * (t - self.t_prev);
        }
        self.t_prev = t;
    }

    fn set_free(&mut self, n: usize, f: impl FnOnce(&mut NodeS)) {
        let node = &mut self.nodes[n];
        let g = node.group;
        self.index[g].remove(&(node.free_total(), n as u32));
        f(node);
        self.index[g].insert((node.free_total(), n as u32));
    }

    pub(super) fn bind(&mut self, pi: usize, n: usize, devs: u8, t: f64) {
        let tp = &self.tpl[self.pods[pi].tpl as usize];
        let (milli, cpu, mem, demand) = (tp.milli, tp.cpu, tp.mem, tp.demand);
        self.set_free(n, |node| {
            for g in 0..node.gpus {
                if devs & (1 << g) != 0 {
                    node.free[g] -= milli;
                }
            }
            node.cpu_free -= cpu;
            node.mem_free -= mem;
            node.pods_free -= 1;
        });
        self.alloc += demand;
        let p = &mut self.pods[pi];
        p.node = n as u32;
        p.devs = devs;
        p.bound_at = t;
        p.end = t + p.remaining;
        p.epoch += 1;
        if p.measured {
            let c = tp.class;
            self.waits[c].push(t - p.queued_at);
            self.pods[pi].measured = false;
        }
        if let Some(e) = self.pods[pi].evicted_at.take() {
            self.disruptions.push(t - e);
        }
        let p = &self.pods[pi];
        self.heap.push(Reverse((p.end.to_bits(), pi, p.epoch)));
    }

    pub(super) fn unbind(&mut self, pi: usize) -> usize {
        let p = &self.pods[pi];
        let n = p.node as usize;
        let devs = p.devs;
        let tp = &self.tpl[p.tpl as usize];
        let (milli, cpu, mem, demand) = (tp.milli, tp.cpu, tp.mem, tp.demand);
        self.set_free(n, |node| {
            for g in 0..node.gpus {
                if devs & (1 << g) != 0 {
                    node.free[g] += milli;
                }
            }
            node.cpu_free += cpu;
            node.mem_free += mem;
            node.pods_free += 1;
        });
        self.alloc -= demand;
        let p = &mut self.pods[pi];
        p.node = NONE;
        p.devs = 0;
        p.epoch += 1;
        n
    }

    pub(super) fn enqueue(&mut self, pi: usize) {
        self.seq += 1;
        self.pods[pi].seq = self.seq;
        let b = bucket_of(&self.tpl[self.pods[pi].tpl as usize]);
        self.queue[b].insert(self.seq, pi);
    }

    pub(super) fn dequeue(&mut self, pi: usize) {
        let b = bucket_of(&self.tpl[self.pods[pi].tpl as usize]);
        self.queue[b].remove(&self.pods[pi].seq);
    }

    pub(super) fn queued(&self) -> usize {
        self.queue.iter().map(BTreeMap::len).sum()
    }

    /// Appends the point of the interval ending at `t` (state before the events at `t`).
    pub(super) fn sample(&mut self, t: f64, every: f64, series: &mut Vec<Sample>) {
        self.advance(t);
        let prev = series.last().map_or(0.0, |s: &Sample| s.t);
        let integral_prev = self.sample_integral;
        self.sample_integral = self.alloc_integral_all;
        series.push(Sample {
            t,
            allocation_ratio: (self.alloc_integral_all - integral_prev)
                / (t - prev).max(every * 1e-9)
                / self.capacity.max(1) as f64,
            queued_8gpu: self.queue[5..].iter().map(BTreeMap::len).sum(),
        });
    }

    pub(super) fn try_place(&mut self, pi: usize, t: f64) -> bool {
        match self.target(pi) {
            Some((n, d)) => {
                self.bind(pi, n, d, t);
                true
            }
            None => false,
        }
    }

    /// Serves the whole queue in order.
    pub(super) fn serve_all(&mut self, t: f64) {
        let mut all: Vec<(u64, usize)> = self
            .queue
            .iter()
            .flat_map(|q| q.iter().map(|(s, p)| (*s, *p)))
            .collect();
        all.sort_unstable();
        for (_, pi) in all {
            if self.target(pi).is_some() {
                self.dequeue(pi);
                self.try_place(pi, t);
            }
        }
    }

    /// Serves the queue after node `n` gained capacity: only `n` can take a queued pod
    /// (every other node refused each of them since and gained nothing).
    pub(super) fn serve_node(&mut self, n: usize, t: f64) {
        if self.fences.as_ref().is_some_and(|f| f.node[n]) {
            return;
        }
        let mut cursor = [0u64; 9];
        loop {
            let node = &self.nodes[n];
            let seen = self.free_seen(n);
            let seen = &seen[..node.gpus];
            let max_free = seen.iter().copied().max().unwrap_or(0);
            let whole = seen.iter().filter(|&&f| f == GPU_MILLI).count();
            let mut next: Option<(u64, usize, usize)> = None;
            for (b, &cur) in cursor.iter().enumerate() {
                let ok = if b == 0 {
                    max_free > 0
                } else {
                    whole >= b && b <= node.gpus
                };
                if !ok {
                    continue;
                }
                if let Some((&s, &pi)) = self.queue[b]
                    .range((std::ops::Bound::Excluded(cur), std::ops::Bound::Unbounded))
                    .next()
                    && next.is_none_or(|(ns, _, _)| s < ns)
                {
                    next = Some((s, pi, b));
                }
            }
            let Some((s, pi, b)) = next else { break };
            cursor[b] = s;
            let tp = &self.tpl[self.pods[pi].tpl as usize];
            let node = &self.nodes[n];
            if node_ok(node, tp)
                && let Some(d) = self.node_devs(n, tp)
            {
                self.dequeue(pi);
                self.bind(pi, n, d, t);
            }
        }
    }

    pub(super) fn depart(&mut self, pi: usize, t: f64) {
        let n = self.unbind(pi);
        self.serve_node(n, t);
    }

    pub(super) fn arrive(&mut self, a: &Arrival, measured: bool) {
        let pi = self.pods.len();
        self.pods.push(PodS {
            tpl: a.tpl,
            queued_at: a.t,
            remaining: a.life,
            end: 0.0,
            node: NONE,
            devs: 0,
            epoch: 0,
            seq: 0,
            evicted_at: None,
            measured,
            bound_at: 0.0,
            svc: NONE,
        });
        if !self.try_place(pi, a.t) {
            self.enqueue(pi);
        }
    }

    /// Evicts pods: each replacement enters the queue at once with its remaining life.
    pub(super) fn evict(&mut self, pis: &[usize], t: f64) {
        for &pi in pis {
            if self.pods[pi].node == NONE {
                continue;
            }
            self.unbind(pi);
            let p = &mut self.pods[pi];
            p.remaining = (p.end - t).max(1.0);
            p.evicted_at = Some(t);
            p.queued_at = t;
            self.evictions += 1;
            if p.svc != NONE {
                self.svc_evictions += 1;
            }
            self.enqueue(pi);
        }
    }

    /// Scales every service to its replicas wanted at `t` (the hour): new replicas enter
    /// the queue (placed at once when they fit); scale-down deletes pending replicas
    /// first, then the newest running ones.
    pub(super) fn scale_services(&mut self, svcs: &[Service], t: f64, measured: bool) {
        if self.svc_pods.len() < svcs.len() {
            self.svc_pods.resize(svcs.len(), Vec::new());
        }
        for (k, s) in svcs.iter().enumerate() {
            let want = s.replicas(t);
            let have = self.svc_pods[k].len();
            for _ in have..want {
                let pi = self.pods.len();
                self.pods.push(PodS {
                    tpl: s.tpl,
                    queued_at: t,
                    remaining: SERVICE_LIFE,
                    end: 0.0,
                    node: NONE,
                    devs: 0,
                    epoch: 0,
                    seq: 0,
                    evicted_at: None,
                    measured,
                    bound_at: 0.0,
                    svc: k as u32,
                });
                self.svc_pods[k].push(pi);
                if !self.try_place(pi, t) {
                    self.enqueue(pi);
                }
            }
            if want < have {
                let mut list = std::mem::take(&mut self.svc_pods[k]);
                // Pending first (newest first), then running, newest first.
                let mut order: Vec<(bool, Reverse<usize>, usize)> = list
                    .iter()
                    .enumerate()
                    .map(|(i, &pi)| (self.pods[pi].node != NONE, Reverse(i), pi))
                    .collect();
                order.sort_unstable();
                let gone: Vec<usize> = order.iter().take(have - want).map(|x| x.2).collect();
                let mut freed = Vec::new();
                for &pi in &gone {
                    if self.pods[pi].node == NONE {
                        self.dequeue(pi);
                        self.pods[pi].epoch += 1;
                    } else {
                        freed.push(self.unbind(pi));
                    }
                    self.pods[pi].evicted_at = None;
                    self.pods[pi].measured = false;
                }
                list.retain(|pi| !gone.contains(pi));
                self.svc_pods[k] = list;
                freed.sort_unstable();
                freed.dedup();
                for n in freed {
                    self.serve_node(n, t);
                }
            }
        }
    }

    pub(super) fn running(&self) -> Vec<usize> {
        (0..self.pods.len())
            .filter(|&i| self.pods[i].node != NONE)
            .collect()
    }

    pub(super) fn queued_pods(&self) -> Vec<usize> {
        let mut v: Vec<(u64, usize)> = self
            .queue
            .iter()
            .flat_map(|q| q.iter().map(|(s, p)| (*s, *p)))
            .collect();
        v.sort_unstable();
        v.into_iter().map(|(_, p)| p).collect()
    }
}

/// Lifetime of a service replica: beyond any replay (it runs until scaled down).
const SERVICE_LIFE: f64 = 1e12;

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::super::{DAY, HOUR};
    use super::*;
    use crate::services;

    #[test]
    fn a_pod_that_does_not_fit_waits_without_blocking_others() {
        // One 8-GPU node, a 1-GPU pod running: an 8-GPU pod waits, 1-GPU pods after it
        // still run; the 8-GPU pod runs once every GPU is free again.
        let t = [tpl(1, 1000), tpl(8, 1000)];
        let mut sim = Sim::new(&t, nodes(1, 8), Placer::BinPack, Vec::new());
        sim.arrive(&arrival(0.0, 0, 100.0), true);
        sim.arrive(&arrival(1.0, 1, 100.0), true);
        assert_eq!(sim.queued(), 1);
        sim.arrive(&arrival(2.0, 0, 10.0), true);
        assert_eq!(
            sim.queued(),
            1,
            "the 1-GPU pod did not wait behind the 8-GPU one"
        );
        assert_eq!(sim.pods[2].node, 0);
        // Departures: the second 1-GPU pod (t = 12), the first (t = 100).
        sim.depart(2, 12.0);
        assert_eq!(sim.queued(), 1);
        sim.depart(0, 100.0);
        assert_eq!(sim.queued(), 0);
        assert_eq!(sim.pods[1].node, 0);
        assert_eq!(sim.waits[3], vec![99.0]);
        // Queue order among pods that fit: first come, first served.
        let mut sim = Sim::new(&t, nodes(1, 8), Placer::BinPack, Vec::new());
        sim.arrive(&arrival(0.0, 1, 100.0), true);
        sim.arrive(&arrival(1.0, 1, 100.0), true);
        sim.arrive(&arrival(2.0, 0, 100.0), true);
        assert_eq!(sim.queued(), 2);
        sim.depart(0, 50.0);
        assert_eq!(sim.pods[1].node, 0, "the older pod goes first");
        assert_eq!(sim.queued(), 1);
    }

    /// Services follow their replica counts; scale-down deletes pending replicas first,
    /// then the newest running ones.
    #[test]
    fn services_scale_up_and_down() {
        let t = [tpl(1, 1000), tpl(8, 1000)];
        let mut sim = Sim::new(&t, nodes(1, 8), Placer::BinPack, Vec::new());
        let mut svc = Service {
            tpl: 0,
            mean: 10.0,
            phase_hours: 0.0,
        };
        let at = |s: &Service, want: usize| {
            // The hour of the curve where `want` replicas are asked (search a day).
            (0..24)
                .map(|h| f64::from(h) * HOUR)
                .find(|&x| s.replicas(x) == want)
        };
        // 10 replicas wanted at some hour: 8 run, 2 wait (one 8-GPU node).
        let t10 = at(&svc, 10).expect("the curve passes 10");
        sim.scale_services(std::slice::from_ref(&svc), t10, true);
        assert_eq!(sim.svc_pods[0].len(), 10);
        assert_eq!(sim.queued(), 2);
        assert_eq!(sim.running().len(), 8);
        // Fewer wanted: the two pending go first, then the newest running one.
        svc.mean = 7.0 / (1.0 + services::AMPLITUDE * 1.0);
        let tp = services::PEAK_HOUR * HOUR;
        assert_eq!(svc.replicas(tp), 7);
        sim.scale_services(std::slice::from_ref(&svc), tp + DAY, true);
        assert_eq!(sim.svc_pods[0].len(), 7);
        assert_eq!(sim.queued(), 0);
        assert_eq!(sim.running(), (0..7).collect::<Vec<_>>());
    }
}
