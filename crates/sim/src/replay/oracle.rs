//! The `oracle` row: every running pod placed again from scratch at a window (best fit
//! decreasing), for free, then the queue in order.

use std::cmp::Reverse;

use super::placement::{node_ok, pick};
use super::sim::Sim;

/// GPU milli, cpu milli, memory bytes.
type Size = (u64, u64, u64);

impl<'a> Sim<'a> {
    /// Best fit for the oracle's repacking: the node left with the least free GPU milli
    /// after placement (small nodes fill first, big ones stay whole), ties node order.
    fn best_fit(&self, pi: usize) -> Option<(usize, u8)> {
        let t = &self.tpl[self.pods[pi].tpl as usize];
        let mut best: Option<(u64, usize, u8)> = None;
        for (n, node) in self.nodes.iter().enumerate() {
            let free = node.free_total();
            if free < t.demand || !node_ok(node, t) {
                continue;
            }
            let left = free - t.demand;
            if best.is_some_and(|(b, _, _)| left >= b) {
                continue;
            }
            if let Some(d) = pick(&node.free[..node.gpus], t.gpus, t.milli) {
                best = Some((left, n, d));
            }
        }
        best.map(|(_, n, d)| (n, d))
    }

    /// Oracle: every running pod placed again from scratch (best fit decreasing), for
    /// free; then the queue in order.
    pub(super) fn oracle(&mut self, t: f64) {
        let running = self.running();
        let queued = self.queued_pods();
        // (GPU, cpu, memory: largest first), running first, queue order.
        let mut all: Vec<(Reverse<Size>, u8, u64, usize)> = Vec::new();
        for &pi in &running {
            let tp = &self.tpl[self.pods[pi].tpl as usize];
            all.push((
                Reverse((tp.demand, tp.cpu, tp.mem)),
                0,
                self.pods[pi].seq,
                pi,
            ));
            let p = &mut self.pods[pi];
            p.remaining = (p.end - t).max(1.0);
            self.unbind(pi);
        }
        // Running pods first (they keep running), largest first; then the queue in order.
        all.sort_unstable();
        for &pi in &queued {
            all.push((Reverse((0, 0, 0)), 1, self.pods[pi].seq, pi));
            self.dequeue(pi);
        }
        for (_, was_queued, _, pi) in all {
            let bound_at = self.pods[pi].bound_at;
            let placed = if was_queued == 0 {
                match self.best_fit(pi) {
                    Some((n, d)) => {
                        self.bind(pi, n, d, t);
                        true
                    }
                    None => false,
                }
            } else {
                self.try_place(pi, t)
            };
            if placed {
                if was_queued == 0 {
                    // A running pod moved for free: it keeps its age.
                    self.pods[pi].bound_at = bound_at;
                }
            } else {
                if was_queued == 0 {
                    self.displaced += 1;
                    self.pods[pi].evicted_at = Some(t);
                    self.pods[pi].queued_at = t;
                }
                self.enqueue(pi);
            }
        }
    }
}
