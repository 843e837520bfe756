//! Accounting: the uses of every device by allocated claims, over-allocations, the
//! counters left, and each node's GPUs and MIG pools.
use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::slices::Dev;
use super::{DeviceKind, Inventory, NodeDevices};
use crate::formats;
use crate::model::{DraGpu, GPU_MILLI, Gpu, MigPool, Milli};

/// Most devices read per node (as for the other schemes).
const MAX_DEVICES_PER_NODE: usize = formats::MAX_DEVICES_PER_NODE;

/// One use of a device by an allocated claim.
#[derive(Debug, Clone)]
struct Use {
    claim: (String, String),
    share: bool,
    consumed: BTreeMap<String, u64>,
}

/// The milli of a device a consumable-capacity share holds: its `memory` share, else its
/// largest share of any capacity the device publishes (None: no capacity to compare).
pub(super) fn share_milli(dev: &Dev, consumed: &BTreeMap<String, u64>) -> Option<Milli> {
    let ratio = |k: &str| -> Option<u64> {
        let total = *dev.capacity.get(k)?;
        let c = *consumed.get(k)?;
        (total > 0).then(|| (u128::from(c) * 1000).div_ceil(u128::from(total)).min(1000) as u64)
    };
    let m = ratio("memory").or_else(|| consumed.keys().filter_map(|k| ratio(k)).max())?;
    Some(m as Milli)
}

/// A counter's family: its name without a trailing index (`memory-slice-3` →
/// `memory-slice`, `memorySlice3` → `memorySlice`).
fn family(counter: &str) -> &str {
    let t = counter.trim_end_matches(|c: char| c.is_ascii_digit());
    let t = t.strip_suffix('-').unwrap_or(t);
    if t.is_empty() { counter } else { t }
}

impl Inventory {
    /// Uses per device, over-allocations, counters left, and each node's GPUs.
    pub(super) fn account(&mut self) {
        let mut uses: HashMap<usize, Vec<Use>> = HashMap::new();
        for (key, c) in &self.claims {
            for r in c.results().into_iter().flatten() {
                let id = (r.driver.clone(), r.pool.clone(), r.device.clone());
                if let Some(&i) = self.by_id.get(&id) {
                    uses.entry(i).or_default().push(Use {
                        claim: key.clone(),
                        share: r.share,
                        consumed: r.consumed.clone(),
                    });
                }
            }
        }
        // Over-allocated devices.
        for (&i, us) in &uses {
            let d = &self.devs[i];
            let claims: BTreeSet<String> = us
                .iter()
                .map(|u| format!("{}/{}", u.claim.0, u.claim.1))
                .collect();
            if !d.multi && (us.len() > 1 || us.iter().any(|u| u.share)) {
                if us.len() > 1 {
                    self.overused.insert(
                        i,
                        format!(
                            "device {} of pool {} is allocated to {} claims ({}) but allows one allocation",
                            d.name,
                            d.pool,
                            us.len(),
                            claims.into_iter().collect::<Vec<_>>().join(", ")
                        ),
                    );
                }
                continue;
            }
            for (k, total) in &d.capacity {
                let sum: u64 = us
                    .iter()
                    .map(|u| {
                        if u.share {
                            u.consumed.get(k).copied().unwrap_or(0)
                        } else {
                            *total
                        }
                    })
                    .fold(0u64, u64::saturating_add);
                if sum > *total {
                    self.overused.insert(
                        i,
                        format!(
                            "claims on device {} of pool {} consume {sum} of its {k} ({total})",
                            d.name, d.pool
                        ),
                    );
                }
            }
        }
        // Counters: what every allocated device consumes, against what the pool shares.
        let mut consumed: HashMap<(String, String, String), BTreeMap<String, u64>> = HashMap::new();
        for &i in uses.keys() {
            let d = &self.devs[i];
            for (set, cs) in &d.consumes {
                let e = consumed
                    .entry((d.driver.clone(), d.pool.clone(), set.clone()))
                    .or_default();
                for (k, v) in cs {
                    let x = e.entry(k.clone()).or_default();
                    *x = x.saturating_add(*v);
                }
            }
        }
        self.remaining = self.shared.clone();
        for (set, cs) in &consumed {
            let shared = self.shared.get(set);
            for (k, v) in cs {
                let total = shared.and_then(|s| s.get(k)).copied().unwrap_or(0);
                if *v > total {
                    let why = format!(
                        "allocated devices of pool {} consume {v} of counter {k} in set {}, which shares {total}",
                        set.1, set.2
                    );
                    for &i in uses.keys() {
                        let d = &self.devs[i];
                        if (d.driver.as_str(), d.pool.as_str()) == (set.0.as_str(), set.1.as_str())
                            && d.consumes.iter().any(|(s, _)| *s == set.2)
                        {
                            self.overused.entry(i).or_insert_with(|| why.clone());
                        }
                    }
                }
                if let Some(r) = self.remaining.get_mut(set).and_then(|r| r.get_mut(k)) {
                    *r = r.saturating_sub(*v);
                }
            }
        }
        // Each node's GPUs, in published order.
        let mut per_node: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for (i, d) in self.devs.iter().enumerate() {
            if let (Some(n), false) = (&d.node, d.kind == DeviceKind::Other) {
                per_node.entry(n.clone()).or_default().push(i);
            }
        }
        for (node, devs) in per_node {
            let nd = self.node_devices(&devs, &uses);
            let e = self.nodes.entry(node).or_default();
            e.gpus = nd.gpus;
            e.mig = nd.mig;
            e.model = nd.model;
            if e.error.is_none() {
                e.error = nd.error;
            }
        }
    }

    /// The parent GPU (device index) of MIG device `m` among `gpus`: the GPU consuming
    /// the same counter set, else the GPU whose `uuid` is its `parentUUID`.
    fn parent(&self, m: usize, gpus: &[usize]) -> Option<usize> {
        let d = &self.devs[m];
        gpus.iter()
            .copied()
            .find(|&g| {
                let p = &self.devs[g];
                p.pool == d.pool
                    && p.consumes
                        .iter()
                        .any(|(s, _)| d.consumes.iter().any(|(t, _)| s == t))
            })
            .or_else(|| {
                let want = d.parent_uuid.as_ref()?;
                gpus.iter()
                    .copied()
                    .find(|&g| self.devs[g].uuid.as_ref() == Some(want))
            })
    }

    fn node_devices(&mut self, devs: &[usize], uses: &HashMap<usize, Vec<Use>>) -> NodeDevices {
        let mut out = NodeDevices::default();
        let gpus: Vec<usize> = devs
            .iter()
            .copied()
            .filter(|&i| self.devs[i].kind == DeviceKind::Gpu)
            .take(MAX_DEVICES_PER_NODE)
            .collect();
        let migs: Vec<usize> = devs
            .iter()
            .copied()
            .filter(|&i| self.devs[i].kind == DeviceKind::Mig)
            .collect();
        let parents: HashMap<usize, Option<usize>> =
            migs.iter().map(|&m| (m, self.parent(m, &gpus))).collect();
        for (slot, &g) in gpus.iter().enumerate() {
            self.gpu_slot.insert(g, slot);
            let d = &self.devs[g];
            if let Some(b) = &d.bad {
                out.error.get_or_insert_with(|| b.clone());
            }
            if out.model.is_none() {
                out.model = d.product.clone();
            }
            out.gpus.push(self.gpu_entry(g, &migs, &parents, uses));
        }
        out.mig = self.mig_pools(&migs, &parents, uses);
        for &i in devs {
            if let Some(b) = &self.devs[i].bad {
                out.error.get_or_insert_with(|| b.clone());
            }
        }
        out
    }

    /// GPU `g` as the model reads it: its use (its claims' shares or whole use, or the
    /// share its allocated MIG partitions carve, whichever is larger) and its DRA
    /// identity, partitions included.
    fn gpu_entry(
        &self,
        g: usize,
        migs: &[usize],
        parents: &HashMap<usize, Option<usize>>,
        uses: &HashMap<usize, Vec<Use>>,
    ) -> (Gpu, DraGpu) {
        let d = &self.devs[g];
        let mut used: u64 = 0;
        for u in uses.get(&g).into_iter().flatten() {
            used += if u.share {
                u64::from(share_milli(d, &u.consumed).unwrap_or(GPU_MILLI))
            } else {
                u64::from(GPU_MILLI)
            };
        }
        // MIG partitions allocated on it.
        let children: Vec<usize> = migs
            .iter()
            .copied()
            .filter(|m| parents.get(m) == Some(&Some(g)) && uses.contains_key(m))
            .collect();
        if !children.is_empty() {
            used = used.max(u64::from(self.carved(g, &children)));
        }
        let partitions = children
            .iter()
            .map(|&m| self.devs[m].profile.clone().unwrap_or_else(|| "mig".into()))
            .collect();
        (
            Gpu {
                key: d.name.clone(),
                used: used.min(u64::from(GPU_MILLI)) as Milli,
                healthy: !d.tainted,
                memory_mib: d.capacity.get("memory").map(|b| b / (1 << 20)),
            },
            DraGpu {
                driver: d.driver.clone(),
                pool: d.pool.clone(),
                device: d.name.clone(),
                uuid: d.uuid.clone(),
                pcie_root: d.pcie_root.clone(),
                partitions,
                taints: d.taints.clone(),
            },
        )
    }

    /// The node's MIG pools, one per profile: partitions used, and how many more of each
    /// profile fit (first fit, in order, against the counters left).
    fn mig_pools(
        &self,
        migs: &[usize],
        parents: &HashMap<usize, Option<usize>>,
        uses: &HashMap<usize, Vec<Use>>,
    ) -> Vec<MigPool> {
        // MIG pools: used, and how many more of each profile fit (first fit, in order).
        let mut profiles: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for &m in migs {
            let p = self.devs[m].profile.clone().unwrap_or_else(|| "mig".into());
            profiles.entry(p).or_default().push(m);
        }
        profiles
            .into_iter()
            .map(|(profile, ms)| {
                let used = ms.iter().filter(|m| uses.contains_key(m)).count() as u64;
                let free = self.free_partitions(&ms, parents, uses);
                MigPool {
                    profile,
                    capacity: used + free,
                    used,
                }
            })
            .collect()
    }

    /// How many of the partitions `ms` (one profile) can still be allocated, taking them
    /// first fit, in order, from a copy of the counters left.
    fn free_partitions(
        &self,
        ms: &[usize],
        parents: &HashMap<usize, Option<usize>>,
        uses: &HashMap<usize, Vec<Use>>,
    ) -> u64 {
        let mut left = self.remaining.clone();
        let mut free = 0u64;
        for &m in ms {
            let d = &self.devs[m];
            if uses.contains_key(&m) || d.tainted || d.bad.is_some() {
                continue;
            }
            // Without counters, a partition is free only while its parent is unused.
            if let Some(Some(p)) = parents.get(&m)
                && d.consumes.is_empty()
                && uses.contains_key(p)
            {
                continue;
            }
            let fits = d.consumes.iter().all(|(set, cs)| {
                let key = (d.driver.clone(), d.pool.clone(), set.clone());
                cs.iter().all(|(k, v)| {
                    left.get(&key)
                        .and_then(|s| s.get(k))
                        .is_some_and(|have| have >= v)
                })
            });
            if !fits {
                continue;
            }
            for (set, cs) in &d.consumes {
                let key = (d.driver.clone(), d.pool.clone(), set.clone());
                if let Some(s) = left.get_mut(&key) {
                    for (k, v) in cs {
                        if let Some(x) = s.get_mut(k) {
                            *x = x.saturating_sub(*v);
                        }
                    }
                }
            }
            free += 1;
        }
        free
    }

    /// The milli of GPU `g` its allocated MIG partitions take: per family of counters of
    /// its counter set (`memory-slice-0` … `memory-slice-7` are one family, counted
    /// together; `multiprocessors` is another), the share they consume; the largest
    /// family wins. Without counters, their share of its memory.
    fn carved(&self, g: usize, children: &[usize]) -> Milli {
        let gpu = &self.devs[g];
        let mut best = 0u64;
        for (set, _) in &gpu.consumes {
            let key = (gpu.driver.clone(), gpu.pool.clone(), set.clone());
            let Some(shared) = self.shared.get(&key) else {
                continue;
            };
            // Family → (consumed, shared).
            let mut families: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
            for (k, total) in shared {
                let c: u64 = children
                    .iter()
                    .flat_map(|&m| self.devs[m].consumes.iter())
                    .filter(|(s, _)| s == set)
                    .filter_map(|(_, cs)| cs.get(k))
                    .fold(0u64, |a, v| a.saturating_add(*v));
                let e = families.entry(family(k)).or_default();
                e.0 = e.0.saturating_add(c);
                e.1 = e.1.saturating_add(*total);
            }
            for (c, total) in families.values() {
                if *total > 0 {
                    best = best.max(
                        (u128::from(*c) * 1000)
                            .div_ceil(u128::from(*total))
                            .min(1000) as u64,
                    );
                }
            }
        }
        if best == 0
            && let Some(total) = gpu.capacity.get("memory").filter(|t| **t > 0)
        {
            let c: u64 = children
                .iter()
                .filter_map(|&m| self.devs[m].capacity.get("memory"))
                .fold(0u64, |a, v| a.saturating_add(*v));
            best = (u128::from(c) * 1000)
                .div_ceil(u128::from(*total))
                .min(1000) as u64;
        }
        // Any partition takes something: a carved GPU is never a free whole GPU.
        best.max(1) as Milli
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_families_drop_the_trailing_index() {
        assert_eq!(family("memory-slice-3"), "memory-slice");
        assert_eq!(family("memorySlice12"), "memorySlice");
        assert_eq!(family("multiprocessors"), "multiprocessors");
        assert_eq!(family("7"), "7");
        assert_eq!(family(""), "");
    }

    #[test]
    fn shares_are_measured_on_memory_first() {
        let dev = Dev {
            driver: String::new(),
            pool: String::new(),
            name: "g".into(),
            node: None,
            kind: DeviceKind::Gpu,
            uuid: None,
            parent_uuid: None,
            profile: None,
            product: None,
            pcie_root: None,
            capacity: BTreeMap::from([("memory".into(), 80), ("cores".into(), 100)]),
            consumes: vec![],
            taints: vec![],
            tainted: false,
            multi: true,
            bad: None,
        };
        let c = |v: &[(&str, u64)]| v.iter().map(|(k, x)| (k.to_string(), *x)).collect();
        assert_eq!(
            share_milli(&dev, &c(&[("memory", 20), ("cores", 90)])),
            Some(250)
        );
        assert_eq!(share_milli(&dev, &c(&[("cores", 30)])), Some(300));
        assert_eq!(share_milli(&dev, &c(&[("memory", 1)])), Some(13));
        assert_eq!(share_milli(&dev, &c(&[("other", 1)])), None);
        assert_eq!(share_milli(&dev, &c(&[("memory", 800)])), Some(1000));
    }
}
