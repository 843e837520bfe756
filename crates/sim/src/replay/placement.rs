//! The scheduler emulation of the replay: bin-packing (MostAllocated node, best-fit
//! device, through an index of nodes by free milli) or FGD's scoring, fences skipped.

use gpu_defrag_core::model::*;
use gpu_defrag_core::policy::TargetShape;
use gpu_defrag_core::sched;

use super::arrivals::Tpl;
use super::sim::{Fences, NodeS, Sim};

/// Best-fit devices on free milli per GPU (the `sched::pick_devices` rule): for a
/// share the fullest GPU that fits, for whole GPUs the first fully free ones. A bit mask.
pub(super) fn pick(free: &[u32], gpus: u32, milli: u32) -> Option<u8> {
    if gpus == 1 && milli < GPU_MILLI {
        let mut best: Option<(u32, usize)> = None;
        for (i, &f) in free.iter().enumerate() {
            if f >= milli && best.is_none_or(|(bf, _)| f < bf) {
                best = Some((f, i));
            }
        }
        return best.map(|(_, i)| 1u8 << i);
    }
    let mut mask = 0u8;
    let mut k = 0;
    for (i, &f) in free.iter().enumerate() {
        if k < gpus && f >= milli {
            mask |= 1 << i;
            k += 1;
        }
    }
    (k == gpus).then_some(mask)
}

pub(super) fn node_ok(n: &NodeS, t: &Tpl) -> bool {
    (t.models == 0 || t.models & n.model != 0)
        && n.cpu_free >= t.cpu
        && n.mem_free >= t.mem
        && n.pods_free > 0
        && n.gpus >= t.gpus as usize
}

/// F_n(M) of free milli per GPU, for shapes without cpu, memory or model terms.
fn frag_of(free: &[u32], shapes: &[TargetShape]) -> f64 {
    let idle: u64 = free.iter().map(|&r| u64::from(r)).sum();
    shapes
        .iter()
        .map(|m| {
            let fits = free.iter().filter(|&&r| r >= m.milli_per_gpu).count() >= m.gpus as usize;
            let f = if fits {
                free.iter()
                    .filter(|&&r| r < m.milli_per_gpu)
                    .map(|&r| u64::from(r))
                    .sum()
            } else {
                idle
            };
            m.weight * f as f64
        })
        .sum()
}

/// Which scheduler places pods.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Placer {
    BinPack,
    Fgd,
}

impl<'a> Sim<'a> {
    /// Where the scheduler puts pod `pi` (the fences in force are skipped).
    pub(super) fn target(&self, pi: usize) -> Option<(usize, u8)> {
        let t = &self.tpl[self.pods[pi].tpl as usize];
        if self.placer == Placer::BinPack {
            return self.target_indexed(t, self.fences.as_ref());
        }
        self.target_scan(pi, self.fences.as_ref())
    }

    /// Free milli per GPU of node `n` as the scheduler sees it (fenced GPUs: none).
    pub(super) fn free_seen(&self, n: usize) -> [u32; 8] {
        let node = &self.nodes[n];
        let mut free = node.free;
        if let Some(f) = &self.fences {
            if f.node[n] {
                return [0; 8];
            }
            for (g, x) in free.iter_mut().enumerate().take(node.gpus) {
                if f.gpu[n] & (1 << g) != 0 {
                    *x = 0;
                }
            }
        }
        free
    }

    /// [`Sim::target`] by a scan of every node (FGD's scoring; the reference the
    /// index is tested against).
    fn target_scan(&self, pi: usize, fences: Option<&Fences>) -> Option<(usize, u8)> {
        let t = &self.tpl[self.pods[pi].tpl as usize];
        let mut best: Option<(f64, u64, usize, u8)> = None; // (Δfrag, -, node, devs)
        for (n, node) in self.nodes.iter().enumerate() {
            if !node_ok(node, t) || node.free_total() < t.demand {
                continue;
            }
            let mut free = node.free;
            if let Some(f) = fences {
                if f.node[n] {
                    continue;
                }
                for (g, x) in free.iter_mut().enumerate().take(node.gpus) {
                    if f.gpu[n] & (1 << g) != 0 {
                        *x = 0;
                    }
                }
            }
            let free = &free[..node.gpus];
            let score = sched::most_allocated_score(node.gpus, node.free_total(), t.demand);
            match self.placer {
                Placer::BinPack => {
                    if best.as_ref().is_some_and(|b| score <= b.1) {
                        continue;
                    }
                    if let Some(d) = pick(free, t.gpus, t.milli) {
                        best = Some((0.0, score, n, d));
                    }
                }
                Placer::Fgd => {
                    let before = frag_of(free, &self.fgd_shapes);
                    let try_devs = |d: u8, best: &mut Option<(f64, u64, usize, u8)>| {
                        let mut after = [0u32; 8];
                        after[..free.len()].copy_from_slice(free);
                        for (g, x) in after.iter_mut().enumerate().take(free.len()) {
                            if d & (1 << g) != 0 {
                                *x -= t.milli;
                            }
                        }
                        let delta = frag_of(&after[..free.len()], &self.fgd_shapes) - before;
                        let better = match best {
                            None => true,
                            Some((bd, bs, _, _)) => {
                                delta < *bd - 1e-9 || ((delta - *bd).abs() <= 1e-9 && score > *bs)
                            }
                        };
                        if better {
                            *best = Some((delta, score, n, d));
                        }
                    };
                    if t.gpus == 1 && t.milli < GPU_MILLI {
                        let mut seen = [u32::MAX; 8];
                        for (g, &f) in free.iter().enumerate() {
                            if f >= t.milli && !seen.contains(&f) {
                                seen[g] = f;
                                try_devs(1 << g, &mut best);
                            }
                        }
                    } else if let Some(d) = pick(free, t.gpus, t.milli) {
                        try_devs(d, &mut best);
                    }
                }
            }
        }
        best.map(|(_, _, n, d)| (n, d))
    }

    /// Bin-packing through the index: per group (same size, same model) the first node
    /// in free-milli order that fits is the group's best; the best group wins.
    /// Fenced nodes are passed over; fenced GPUs count as full for the device pick (the
    /// score is the node's, as the scan has it).
    fn target_indexed(&self, t: &Tpl, fences: Option<&Fences>) -> Option<(usize, u8)> {
        let mut best: Option<(u64, usize, u8)> = None;
        for g in 0..self.index.len() {
            if self.group_gpus[g] < t.gpus as usize
                || (t.models != 0 && t.models & self.group_model[g] == 0)
            {
                continue;
            }
            for &(free_total, n) in self.index[g].range((t.demand, 0)..) {
                let node = &self.nodes[n as usize];
                let score = sched::most_allocated_score(node.gpus, free_total, t.demand);
                if best.is_some_and(|(s, bn, _)| score < s || (score == s && bn < n as usize)) {
                    break;
                }
                if !node_ok(node, t) {
                    continue;
                }
                let mut free = node.free;
                if let Some(f) = fences {
                    if f.node[n as usize] {
                        continue;
                    }
                    let m = f.gpu[n as usize];
                    if m != 0 {
                        for (g, x) in free.iter_mut().enumerate().take(node.gpus) {
                            if m & (1 << g) != 0 {
                                *x = 0;
                            }
                        }
                    }
                }
                if let Some(d) = pick(&free[..node.gpus], t.gpus, t.milli) {
                    best = Some((score, n as usize, d));
                    break;
                }
            }
        }
        best.map(|(_, n, d)| (n, d))
    }

    /// Devices of `tp` on node `n` as the scheduler would pick them.
    pub(super) fn node_devs(&self, n: usize, tp: &Tpl) -> Option<u8> {
        let node = &self.nodes[n];
        let seen = self.free_seen(n);
        let free = &seen[..node.gpus];
        match self.placer {
            Placer::BinPack => pick(free, tp.gpus, tp.milli),
            Placer::Fgd => {
                if tp.gpus == 1 && tp.milli < GPU_MILLI {
                    let before = frag_of(free, &self.fgd_shapes);
                    let mut best: Option<(f64, u8)> = None;
                    for (g, &f) in free.iter().enumerate() {
                        if f >= tp.milli {
                            let mut after = seen;
                            after[g] -= tp.milli;
                            let d = frag_of(&after[..node.gpus], &self.fgd_shapes) - before;
                            if best.is_none_or(|(bd, _)| d < bd - 1e-9) {
                                best = Some((d, 1 << g));
                            }
                        }
                    }
                    best.map(|(_, m)| m)
                } else {
                    pick(free, tp.gpus, tp.milli)
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::super::NONE;
    use super::super::sim::PodS;
    use super::super::test_support::*;

    #[test]
    fn the_index_agrees_with_the_full_scan() {
        let t = [
            tpl(1, 300),
            tpl(1, 1000),
            tpl(2, 1000),
            tpl(4, 1000),
            tpl(8, 1000),
            tpl(1, 700),
        ];
        let mut ns = nodes(6, 8);
        ns.extend(nodes(4, 4).into_iter().map(|mut n| {
            n.group = 1;
            n
        }));
        ns.extend(nodes(3, 2).into_iter().map(|mut n| {
            n.group = 2;
            n
        }));
        let mut sim = Sim::new(&t, ns, Placer::BinPack, Vec::new());
        let mut rng = StdRng::seed_from_u64(9);
        let none = Fences {
            node: vec![false; 13],
            gpu: vec![0; 13],
        };
        // Some fences: two nodes, single GPUs of three others.
        let mut some = none.clone();
        some.node[1] = true;
        some.node[7] = true;
        some.gpu[0] = 0b101;
        some.gpu[8] = 0b1;
        some.gpu[11] = 0b10;
        for i in 0..400 {
            let k = rng.random_range(0..t.len()) as u32;
            sim.pods.push(PodS {
                tpl: k,
                queued_at: 0.0,
                remaining: 1.0,
                end: 0.0,
                node: NONE,
                devs: 0,
                epoch: 0,
                seq: 0,
                evicted_at: None,
                measured: false,
                bound_at: 0.0,
                svc: NONE,
            });
            let pi = sim.pods.len() - 1;
            let tp = &t[k as usize];
            let a = sim.target_indexed(tp, None);
            let b = sim.target_scan(pi, Some(&none));
            assert_eq!(a, b, "pod {i}");
            let fa = sim.target_indexed(tp, Some(&some));
            let fb = sim.target_scan(pi, Some(&some));
            assert_eq!(fa, fb, "pod {i}, fenced");
            if let Some((n, d)) = a {
                sim.bind(pi, n, d, 0.0);
            }
            if i % 3 == 0 {
                let running = sim.running();
                if !running.is_empty() {
                    let r = running[rng.random_range(0..running.len())];
                    sim.unbind(r);
                }
            }
        }
    }
}
