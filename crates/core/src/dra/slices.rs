//! ResourceSlices and DeviceTaintRules: the devices of complete pools, their
//! capacities, counters and taints, and the counters the pools share.
use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::resource::v1::{DeviceTaintRule, ResourceSlice};

use super::{DEVICE_FENCE_LABEL, DeviceKind, Inventory, PCIE_ROOT};
use crate::formats;

/// A device of a complete pool.
#[derive(Debug, Clone)]
pub(super) struct Dev {
    pub(super) driver: String,
    pub(super) pool: String,
    pub(super) name: String,
    pub(super) node: Option<String>,
    pub(super) kind: DeviceKind,
    pub(super) uuid: Option<String>,
    pub(super) parent_uuid: Option<String>,
    pub(super) profile: Option<String>,
    pub(super) product: Option<String>,
    pub(super) pcie_root: Option<String>,
    /// Capacities (bytes or counts, rounded up).
    pub(super) capacity: BTreeMap<String, u64>,
    /// Counter sets it consumes: (set, counter → amount).
    pub(super) consumes: Vec<(String, BTreeMap<String, u64>)>,
    /// `key=value:Effect`.
    pub(super) taints: Vec<String>,
    /// A taint keeps new allocations off it (NoSchedule, NoExecute).
    pub(super) tainted: bool,
    pub(super) multi: bool,
    /// Why it cannot be read (a capacity or counter that is not a quantity).
    pub(super) bad: Option<String>,
}

/// A string attribute of a device, under its short or driver-qualified name.
fn attr<'a>(
    attrs: Option<&'a BTreeMap<String, k8s_openapi::api::resource::v1::DeviceAttribute>>,
    driver: &str,
    name: &str,
) -> Option<&'a str> {
    let a = attrs?;
    a.get(name)
        .or_else(|| a.get(&format!("{driver}/{name}")))
        .and_then(|v| v.string.as_deref().or(v.version.as_deref()))
}

/// A quantity as an integer (bytes for memory, a count otherwise), rounded up.
pub(super) fn amount(q: &str) -> Result<u64, String> {
    formats::quantity_to_bytes(q).map_err(|e| e.to_string())
}

impl Inventory {
    /// Adds the taints of `DeviceTaintRule`s to the devices they select, as the scheduler
    /// does (a rule's taint adds to the slice's). Every set field of the selector must
    /// match; an empty selector matches every device, a rule without one none. The rules a
    /// run of this operator made ([`DEVICE_FENCE_LABEL`]) are left out.
    pub(super) fn apply_rules(&mut self, rules: &[&DeviceTaintRule]) {
        for r in rules {
            if r.metadata
                .labels
                .as_ref()
                .is_some_and(|l| l.contains_key(DEVICE_FENCE_LABEL))
            {
                continue;
            }
            let Some(sel) = r.spec.device_selector.as_ref() else {
                continue;
            };
            let t = &r.spec.taint;
            let text = format!(
                "{}={}:{} (DeviceTaintRule {})",
                t.key,
                t.value.as_deref().unwrap_or_default(),
                t.effect,
                r.metadata.name.as_deref().unwrap_or_default()
            );
            let keeps_off = t.effect == "NoSchedule" || t.effect == "NoExecute";
            for d in &mut self.devs {
                let hit = sel.driver.as_ref().is_none_or(|x| *x == d.driver)
                    && sel.pool.as_ref().is_none_or(|x| *x == d.pool)
                    && sel.device.as_ref().is_none_or(|x| *x == d.name);
                if hit {
                    d.taints.push(text.clone());
                    d.tainted |= keeps_off;
                }
            }
        }
    }

    pub(super) fn read_slices(&mut self, slices: &[&ResourceSlice]) {
        // Pools: the newest generation's slices, complete or not.
        let mut pools: BTreeMap<(String, String), Vec<&ResourceSlice>> = BTreeMap::new();
        for s in slices {
            pools
                .entry((s.spec.driver.clone(), s.spec.pool.name.clone()))
                .or_default()
                .push(s);
        }
        for ((driver, pool), mut ss) in pools {
            if !self.gpu_drivers.contains(&driver) {
                continue;
            }
            let newest = ss.iter().map(|s| s.spec.pool.generation).max().unwrap_or(0);
            ss.retain(|s| s.spec.pool.generation == newest);
            ss.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
            let want: BTreeSet<i64> = ss
                .iter()
                .map(|s| s.spec.pool.resource_slice_count)
                .collect();
            let complete = want.len() == 1 && want.first().copied() == Some(ss.len() as i64);
            if !complete {
                let why = format!(
                    "pool {pool} of driver {driver} is incomplete: {} slice(s) at generation {newest}, resourceSliceCount {}",
                    ss.len(),
                    want.iter()
                        .map(i64::to_string)
                        .collect::<Vec<_>>()
                        .join("/")
                );
                // Which node it serves, to mark that node.
                let node = ss
                    .iter()
                    .find_map(|s| s.spec.node_name.clone())
                    .or_else(|| {
                        ss.iter()
                            .flat_map(|s| s.spec.devices.iter().flatten())
                            .find_map(|d| d.node_name.clone())
                    });
                if let Some(n) = node {
                    let e = self.nodes.entry(n).or_default();
                    e.error.get_or_insert_with(|| why.clone());
                }
                self.notes
                    .push(format!("{why}: its devices are not counted"));
                self.incomplete.insert((driver.clone(), pool.clone()), why);
                continue;
            }
            let mut unplaced = 0usize;
            for s in &ss {
                for d in s.spec.devices.iter().flatten() {
                    let node = d.node_name.clone().or_else(|| s.spec.node_name.clone());
                    let dev = read_device(&driver, &pool, node, d);
                    if dev.node.is_none() && dev.kind != DeviceKind::Other {
                        unplaced += 1;
                    }
                    let id = (driver.clone(), pool.clone(), dev.name.clone());
                    if self.by_id.contains_key(&id) {
                        self.notes.push(format!(
                            "device {} of pool {pool} ({driver}) is published twice: the first is read",
                            dev.name
                        ));
                        continue;
                    }
                    self.by_id.insert(id, self.devs.len());
                    self.devs.push(dev);
                }
            }
            if unplaced > 0 {
                self.notes.push(format!(
                    "{unplaced} GPU device(s) of pool {pool} ({driver}) are not bound to one node (nodeSelector or allNodes): not counted"
                ));
            }
            // Shared counters of the pool.
            for s in &ss {
                for set in s.spec.shared_counters.iter().flatten() {
                    let mut counters = BTreeMap::new();
                    for (k, c) in &set.counters {
                        match amount(&c.value.0) {
                            Ok(v) => {
                                counters.insert(k.clone(), v);
                            }
                            Err(e) => {
                                self.notes.push(format!(
                                    "counter {k} of set {} in pool {pool} unreadable: {e}",
                                    set.name
                                ));
                            }
                        }
                    }
                    self.shared
                        .insert((driver.clone(), pool.clone(), set.name.clone()), counters);
                }
            }
        }
    }
}

/// Reads one published device.
fn read_device(
    driver: &str,
    pool: &str,
    node: Option<String>,
    d: &k8s_openapi::api::resource::v1::Device,
) -> Dev {
    let attrs = d.attributes.as_ref();
    let kind = match attr(attrs, driver, "type") {
        None | Some("gpu") => DeviceKind::Gpu,
        Some("mig") => DeviceKind::Mig,
        Some(_) => DeviceKind::Other,
    };
    let mut bad = None;
    let mut capacity = BTreeMap::new();
    for (k, c) in d.capacity.iter().flatten() {
        match amount(&c.value.0) {
            Ok(v) => {
                capacity.insert(k.clone(), v);
            }
            Err(e) => {
                bad.get_or_insert(format!("capacity {k} of device {}: {e}", d.name));
            }
        }
    }
    let mut consumes = Vec::new();
    for c in d.consumes_counters.iter().flatten() {
        let mut m = BTreeMap::new();
        for (k, v) in &c.counters {
            match amount(&v.value.0) {
                Ok(v) => {
                    m.insert(k.clone(), v);
                }
                Err(e) => {
                    bad.get_or_insert(format!("counter {k} of device {}: {e}", d.name));
                }
            }
        }
        consumes.push((c.counter_set.clone(), m));
    }
    let taints: Vec<String> = d
        .taints
        .iter()
        .flatten()
        .map(|t| {
            format!(
                "{}={}:{}",
                t.key,
                t.value.as_deref().unwrap_or_default(),
                t.effect
            )
        })
        .collect();
    let tainted = d
        .taints
        .iter()
        .flatten()
        .any(|t| t.effect == "NoSchedule" || t.effect == "NoExecute");
    Dev {
        driver: driver.to_string(),
        pool: pool.to_string(),
        name: d.name.clone(),
        node: node.filter(|n| !n.is_empty()),
        kind,
        uuid: attr(attrs, driver, "uuid").map(str::to_string),
        parent_uuid: attr(attrs, driver, "parentUUID").map(str::to_string),
        profile: attr(attrs, driver, "profile").map(str::to_string),
        product: attr(attrs, driver, "productName").map(str::to_string),
        pcie_root: attr(attrs, driver, PCIE_ROOT).map(str::to_string),
        capacity,
        consumes,
        taints,
        tainted,
        multi: d.allow_multiple_allocations.unwrap_or(false),
        bad,
    }
}
