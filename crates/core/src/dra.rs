//! Dynamic Resource Allocation (`resource.k8s.io/v1`): the GPUs drivers publish in
//! `ResourceSlice`s, the `DeviceClass`es that select them (and may back an extended
//! resource such as `nvidia.com/gpu`), and the `ResourceClaim`s that hold them.
//!
//! ```text
//! ResourceSlices ─┬─> complete pools ─> devices (gpu | mig | other) ─┬─> per node: GPUs, MIG pools
//! DeviceClasses ──┘   (generation,      shared counters              │
//!                      sliceCount)                                    │
//! ResourceClaims ──> allocation results ─> use per device ────────────┘
//!                    reservedFor        ─> which pods hold them (pod.status)
//! ```
//!
//! [`Inventory::build`] reads everything once; the `dra` adapter reads a node's GPUs and
//! a pod's allocation from it. Rules: only complete pools count (all `resourceSliceCount`
//! slices at the newest `generation`); a whole GPU and the MIG partitions that consume
//! its counters exclude each other; a device allocated beyond what it allows (two claims
//! on a device without `allowMultipleAllocations`, consumed capacity above the device's,
//! counters above the shared ones) makes every pod on it unknown. Nothing panics on any
//! input.
use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::api::core::v1 as corev1;
use k8s_openapi::api::resource::v1::{DeviceClass, DeviceTaintRule, ResourceClaim, ResourceSlice};

use crate::formats;
use crate::model::{DraGpu, GPU_MILLI, Gpu, MigPool, Milli};

/// The NVIDIA DRA driver (`NVIDIA/k8s-dra-driver-gpu`).
pub const NVIDIA_DRIVER: &str = "gpu.nvidia.com";
/// NVIDIA's DeviceClass of whole GPUs (it sets `extendedResourceName: nvidia.com/gpu`).
pub const NVIDIA_GPU_CLASS: &str = "gpu.nvidia.com";
/// NVIDIA's DeviceClass of MIG partitions.
pub const NVIDIA_MIG_CLASS: &str = "mig.nvidia.com";
/// The standard attribute naming a device's PCIe root complex.
pub const PCIE_ROOT: &str = "resource.kubernetes.io/pcieRoot";
/// The label on the `DeviceTaintRule`s a run of this operator creates to fence single DRA
/// devices; its value is the policy's fence id. Such rules are the run's own fence: the
/// device stays as it is in the model (the run is emptying it, its plan counts it freed).
pub const DEVICE_FENCE_LABEL: &str = "gpu-defrag.io/fence";
/// Most devices read per node (as for the other schemes).
const MAX_DEVICES_PER_NODE: usize = formats::MAX_DEVICES_PER_NODE;

/// What kind of device a DeviceClass or a published device is, for the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    /// A whole GPU (`type: gpu`, or a GPU driver's device without a `type`).
    Gpu,
    /// A MIG partition (`type: mig`).
    Mig,
    /// Anything else (`vfio`, other drivers' devices): not modelled.
    Other,
}

/// A pod's claims, as its spec and status name them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodClaims {
    /// `spec.resourceClaims`: (name in the pod, `resourceClaimName` when named).
    pub spec: Vec<(String, Option<String>)>,
    /// `status.resourceClaimStatuses`: name in the pod → generated claim (None: none needed).
    pub status: BTreeMap<String, Option<String>>,
    /// `status.extendedResourceClaimStatus.resourceClaimName`.
    pub extended: Option<String>,
}

impl PodClaims {
    /// Reads them from a pod.
    pub fn of(pod: &corev1::Pod) -> PodClaims {
        let spec = pod
            .spec
            .as_ref()
            .and_then(|s| s.resource_claims.as_ref())
            .into_iter()
            .flatten()
            .map(|c| (c.name.clone(), c.resource_claim_name.clone()))
            .collect();
        let status = pod.status.as_ref();
        PodClaims {
            spec,
            status: status
                .and_then(|s| s.resource_claim_statuses.as_ref())
                .into_iter()
                .flatten()
                .map(|c| (c.name.clone(), c.resource_claim_name.clone()))
                .collect(),
            extended: status
                .and_then(|s| s.extended_resource_claim_status.as_ref())
                .map(|e| e.resource_claim_name.clone()),
        }
    }

    /// Whether the pod has any claim at all.
    pub fn any(&self) -> bool {
        !self.spec.is_empty() || self.extended.is_some()
    }

    /// The claim objects the pod uses: (claim name, named in the spec). A template
    /// claim whose generated name is not recorded yet is `Err(name in the pod)`.
    pub fn names(&self) -> Vec<Result<(String, bool), String>> {
        let mut out = Vec::new();
        for (name, named) in &self.spec {
            match named {
                Some(c) => out.push(Ok((c.clone(), true))),
                None => match self.status.get(name) {
                    Some(Some(c)) => out.push(Ok((c.clone(), false))),
                    // Recorded as "no claim needed" (a template that was not used).
                    Some(None) => {}
                    None => out.push(Err(name.clone())),
                },
            }
        }
        if let Some(e) = &self.extended {
            out.push(Ok((e.clone(), false)));
        }
        out
    }
}

/// A device of a complete pool.
#[derive(Debug, Clone)]
struct Dev {
    driver: String,
    pool: String,
    name: String,
    node: Option<String>,
    kind: DeviceKind,
    uuid: Option<String>,
    parent_uuid: Option<String>,
    profile: Option<String>,
    product: Option<String>,
    pcie_root: Option<String>,
    /// Capacities (bytes or counts, rounded up).
    capacity: BTreeMap<String, u64>,
    /// Counter sets it consumes: (set, counter → amount).
    consumes: Vec<(String, BTreeMap<String, u64>)>,
    /// `key=value:Effect`.
    taints: Vec<String>,
    /// A taint keeps new allocations off it (NoSchedule, NoExecute).
    tainted: bool,
    multi: bool,
    /// Why it cannot be read (a capacity or counter that is not a quantity).
    bad: Option<String>,
}

/// One use of a device by an allocated claim.
#[derive(Debug, Clone)]
struct Use {
    claim: (String, String),
    share: bool,
    consumed: BTreeMap<String, u64>,
}

/// An allocation result of a claim, as read.
#[derive(Debug, Clone)]
pub(crate) struct AllocResult {
    driver: String,
    pool: String,
    device: String,
    share: bool,
    consumed: BTreeMap<String, u64>,
    bad: Option<String>,
}

/// A claim, as read.
#[derive(Debug, Clone)]
pub(crate) struct Claim {
    /// Allocation results (None: not allocated).
    results: Option<Vec<AllocResult>>,
    /// `reservedFor` pods: (name, uid).
    reserved: Vec<(String, String)>,
    /// Exact requests: (device class, count), for pending pods' shapes (None: a request
    /// whose count cannot be told — `All`, `firstAvailable`).
    requests: Vec<Option<(String, u64)>>,
}

/// Where an allocation result lands in the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Landing {
    /// A whole-GPU device: its node, its index in the node's GPUs, and the milli this
    /// result holds (1000, or a consumable-capacity share).
    Gpu(String, usize, Milli, bool),
    /// A MIG partition: its node and profile.
    Mig(String, String),
    /// A device of a GPU driver the model does not place (`vfio`): its type.
    Other(String),
    /// A device of a driver that is not a GPU driver.
    NotGpu,
}

/// One node's DRA GPUs.
#[derive(Debug, Clone, Default)]
pub(crate) struct NodeDevices {
    /// Whole GPUs in published order, with where they are published.
    pub gpus: Vec<(Gpu, DraGpu)>,
    /// MIG partitions per profile: capacity = used + what still fits.
    pub mig: Vec<MigPool>,
    /// `productName` of its first GPU.
    pub model: Option<String>,
    /// Why its inventory cannot be trusted (an incomplete pool, an over-allocated device).
    pub error: Option<String>,
}

/// Everything read from the DRA objects of one snapshot.
#[derive(Debug, Default)]
pub struct Inventory {
    /// Drivers whose devices are GPUs.
    gpu_drivers: BTreeSet<String>,
    /// DeviceClass name → kind.
    classes: HashMap<String, DeviceKind>,
    /// Extended resource name → kind of its class (`nvidia.com/gpu` → Gpu).
    extended: BTreeMap<String, DeviceKind>,
    devs: Vec<Dev>,
    by_id: HashMap<(String, String, String), usize>,
    /// Device index → its place in its node's GPUs.
    gpu_slot: HashMap<usize, usize>,
    /// Shared counters: (driver, pool, set) → counter → amount.
    shared: HashMap<(String, String, String), BTreeMap<String, u64>>,
    /// What is left of them after every allocated device.
    remaining: HashMap<(String, String, String), BTreeMap<String, u64>>,
    /// Incomplete pools: (driver, pool) → why.
    incomplete: HashMap<(String, String), String>,
    /// Devices used beyond what they allow: index → why.
    overused: HashMap<usize, String>,
    pub(crate) nodes: HashMap<String, NodeDevices>,
    claims: HashMap<(String, String), Claim>,
    /// Whether any DRA object was given at all.
    present: bool,
    /// Whether the input has ResourceSlices, ResourceClaims, DeviceClasses.
    pub(crate) listed: (bool, bool, bool),
    /// What could not be read, one sentence each (reports print them).
    pub notes: Vec<String>,
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
fn amount(q: &str) -> Result<u64, String> {
    formats::quantity_to_bytes(q).map_err(|e| e.to_string())
}

/// The kind of devices a DeviceClass selects, and the drivers its selectors name: from
/// its name (NVIDIA's classes) or from its CEL selectors (`type == 'gpu'`,
/// `device.driver == '…'`). No CEL is evaluated: a class the model cannot read is Other.
fn class_kind(c: &DeviceClass) -> (DeviceKind, Vec<String>) {
    let name = c.metadata.name.as_deref().unwrap_or_default();
    let exprs: Vec<&str> = c
        .spec
        .as_ref()
        .and_then(|s| s.selectors.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|s| s.cel.as_ref().map(|c| c.expression.as_str()))
        .collect();
    let mut drivers = Vec::new();
    for e in &exprs {
        let mut rest = *e;
        while let Some(i) = rest.find("device.driver") {
            rest = &rest[i + "device.driver".len()..];
            let t = rest.trim_start();
            if let Some(t) = t.strip_prefix("==") {
                let t = t.trim_start();
                if let Some(q) = t.chars().next().filter(|q| *q == '\'' || *q == '"')
                    && let Some(end) = t[1..].find(q)
                {
                    drivers.push(t[1..1 + end].to_string());
                }
            }
        }
    }
    let says = |v: &str| {
        exprs.iter().any(|e| {
            e.contains(".type")
                && (e.contains(&format!("'{v}'")) || e.contains(&format!("\"{v}\"")))
        })
    };
    let kind = if name == NVIDIA_GPU_CLASS || says("gpu") {
        DeviceKind::Gpu
    } else if name == NVIDIA_MIG_CLASS || says("mig") {
        DeviceKind::Mig
    } else if c
        .spec
        .as_ref()
        .and_then(|s| s.extended_resource_name.as_deref())
        .is_some_and(|r| r.ends_with("/gpu"))
    {
        DeviceKind::Gpu
    } else {
        DeviceKind::Other
    };
    (kind, drivers)
}

impl Inventory {
    /// Reads the DRA objects of a snapshot or of the operator's caches.
    pub fn build(
        slices: &[&ResourceSlice],
        claims: &[&ResourceClaim],
        classes: &[&DeviceClass],
        rules: &[&DeviceTaintRule],
    ) -> Inventory {
        let mut inv = Inventory {
            present: !(slices.is_empty() && claims.is_empty() && classes.is_empty()),
            listed: (!slices.is_empty(), !claims.is_empty(), !classes.is_empty()),
            ..Default::default()
        };
        inv.gpu_drivers.insert(NVIDIA_DRIVER.to_string());
        for c in classes {
            let (kind, drivers) = class_kind(c);
            if let Some(name) = &c.metadata.name {
                inv.classes.insert(name.clone(), kind);
            }
            if kind != DeviceKind::Other {
                inv.gpu_drivers.extend(drivers);
            }
            if let Some(r) = c
                .spec
                .as_ref()
                .and_then(|s| s.extended_resource_name.as_ref())
            {
                inv.extended.insert(r.clone(), kind);
            }
        }
        // Implicit extended resources of every class (KEP-5004).
        let implicit: Vec<(String, DeviceKind)> = inv
            .classes
            .iter()
            .map(|(n, k)| (format!("deviceclass.resource.kubernetes.io/{n}"), *k))
            .collect();
        inv.extended.extend(implicit);
        inv.read_slices(slices);
        inv.apply_rules(rules);
        for c in claims {
            let ns = c.metadata.namespace.clone().unwrap_or_default();
            let Some(name) = c.metadata.name.clone() else {
                continue;
            };
            inv.claims.insert((ns, name), read_claim(c));
        }
        inv.account();
        inv
    }

    /// Whether any DRA object was given.
    pub fn present(&self) -> bool {
        self.present
    }

    /// Whether `driver` publishes GPUs.
    pub fn is_gpu_driver(&self, driver: &str) -> bool {
        self.gpu_drivers.contains(driver)
    }

    /// The kind of the class backing extended resource `name`, when DRA backs it.
    pub fn extended_kind(&self, name: &str) -> Option<DeviceKind> {
        self.extended.get(name).copied()
    }

    /// The DRA-backed extended resources, with their kinds.
    pub(crate) fn extended(&self) -> impl Iterator<Item = (&str, DeviceKind)> {
        self.extended.iter().map(|(k, v)| (k.as_str(), *v))
    }

    /// The kind of DeviceClass `name` (Other when unknown).
    pub(crate) fn class(&self, name: &str) -> DeviceKind {
        self.classes.get(name).copied().unwrap_or(DeviceKind::Other)
    }

    /// A claim by namespace and name.
    pub(crate) fn claim(&self, ns: &str, name: &str) -> Option<&Claim> {
        self.claims.get(&(ns.to_string(), name.to_string()))
    }

    /// Adds the taints of `DeviceTaintRule`s to the devices they select, as the scheduler
    /// does (a rule's taint adds to the slice's). Every set field of the selector must
    /// match; an empty selector matches every device, a rule without one none. The rules a
    /// run of this operator made ([`DEVICE_FENCE_LABEL`]) are left out.
    fn apply_rules(&mut self, rules: &[&DeviceTaintRule]) {
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

    fn read_slices(&mut self, slices: &[&ResourceSlice]) {
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

/// A counter's family: its name without a trailing index (`memory-slice-3` →
/// `memory-slice`, `memorySlice3` → `memorySlice`).
fn family(counter: &str) -> &str {
    let t = counter.trim_end_matches(|c: char| c.is_ascii_digit());
    let t = t.strip_suffix('-').unwrap_or(t);
    if t.is_empty() { counter } else { t }
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

/// Reads one claim.
fn read_claim(c: &ResourceClaim) -> Claim {
    let status = c.status.as_ref();
    let results = status.and_then(|s| s.allocation.as_ref()).map(|a| {
        a.devices
            .as_ref()
            .and_then(|d| d.results.as_ref())
            .into_iter()
            .flatten()
            .map(|r| {
                let mut bad = None;
                let mut consumed = BTreeMap::new();
                for (k, q) in r.consumed_capacity.iter().flatten() {
                    match amount(&q.0) {
                        Ok(v) => {
                            consumed.insert(k.clone(), v);
                        }
                        Err(e) => {
                            bad.get_or_insert(format!("consumedCapacity {k}: {e}"));
                        }
                    }
                }
                AllocResult {
                    driver: r.driver.clone(),
                    pool: r.pool.clone(),
                    device: r.device.clone(),
                    share: r.share_id.is_some() || !consumed.is_empty(),
                    consumed,
                    bad,
                }
            })
            .collect()
    });
    let reserved = status
        .and_then(|s| s.reserved_for.as_ref())
        .into_iter()
        .flatten()
        .filter(|r| r.resource == "pods" && r.api_group.as_deref().unwrap_or_default().is_empty())
        .map(|r| (r.name.clone(), r.uid.clone()))
        .collect();
    let requests = c
        .spec
        .as_ref()
        .and_then(|s| s.devices.as_ref())
        .and_then(|d| d.requests.as_ref())
        .into_iter()
        .flatten()
        .map(|r| {
            let e = r.exactly.as_ref()?;
            if e.allocation_mode
                .as_deref()
                .is_some_and(|m| m != "ExactCount")
            {
                return None;
            }
            let count = u64::try_from(e.count.unwrap_or(1)).ok()?;
            Some((e.device_class_name.clone(), count))
        })
        .collect();
    Claim {
        results,
        reserved,
        requests,
    }
}

impl Claim {
    /// Its allocation results (None: not allocated).
    pub(crate) fn results(&self) -> Option<&[AllocResult]> {
        self.results.as_deref()
    }

    /// Whether `reservedFor` holds the pod (by UID when both are known, else by name).
    pub(crate) fn reserved_for(&self, name: &str, uid: &str) -> bool {
        self.reserved.iter().any(|(n, u)| {
            if uid.is_empty() || u.is_empty() {
                n == name
            } else {
                u == uid
            }
        })
    }

    /// How many pods it is reserved for.
    pub(crate) fn consumers(&self) -> usize {
        self.reserved.len()
    }

    /// Its exact requests: (device class, count); None for one whose count cannot be told.
    pub(crate) fn requests(&self) -> &[Option<(String, u64)>] {
        &self.requests
    }
}

/// The milli of a device a consumable-capacity share holds: its `memory` share, else its
/// largest share of any capacity the device publishes (None: no capacity to compare).
fn share_milli(dev: &Dev, consumed: &BTreeMap<String, u64>) -> Option<Milli> {
    let ratio = |k: &str| -> Option<u64> {
        let total = *dev.capacity.get(k)?;
        let c = *consumed.get(k)?;
        (total > 0).then(|| (u128::from(c) * 1000).div_ceil(u128::from(total)).min(1000) as u64)
    };
    let m = ratio("memory").or_else(|| consumed.keys().filter_map(|k| ratio(k)).max())?;
    Some(m as Milli)
}

impl Inventory {
    /// Uses per device, over-allocations, counters left, and each node's GPUs.
    fn account(&mut self) {
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
            if out.model.is_none() {
                out.model = d.product.clone();
            }
            out.gpus.push((
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
            ));
        }
        // MIG pools: used, and how many more of each profile fit (first fit, in order).
        let mut profiles: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for &m in &migs {
            let p = self.devs[m].profile.clone().unwrap_or_else(|| "mig".into());
            profiles.entry(p).or_default().push(m);
        }
        for (profile, ms) in profiles {
            let used = ms.iter().filter(|m| uses.contains_key(m)).count() as u64;
            let mut left = self.remaining.clone();
            let mut free = 0u64;
            for &m in &ms {
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
            out.mig.push(MigPool {
                profile,
                capacity: used + free,
                used,
            });
        }
        for &i in devs {
            if let Some(b) = &self.devs[i].bad {
                out.error.get_or_insert_with(|| b.clone());
            }
        }
        out
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

    /// Where allocation result `r` lands in the model, or why it cannot be read.
    pub(crate) fn landing(&self, r: &AllocResult) -> Result<Landing, crate::model::UnknownReason> {
        use crate::model::UnknownReason as U;
        if !self.is_gpu_driver(&r.driver) {
            return Ok(Landing::NotGpu);
        }
        if let Some(b) = &r.bad {
            return Err(U::Malformed(format!(
                "allocation of device {}: {b}",
                r.device
            )));
        }
        let id = (r.driver.clone(), r.pool.clone(), r.device.clone());
        let Some(&i) = self.by_id.get(&id) else {
            let why = match self.incomplete.get(&(r.driver.clone(), r.pool.clone())) {
                Some(w) => w.clone(),
                None => "no complete pool publishes it".into(),
            };
            return Err(U::UnknownDevice(format!(
                "device {} of pool {} ({}): {why}",
                r.device, r.pool, r.driver
            )));
        };
        if let Some(w) = self.overused.get(&i) {
            return Err(U::Overcommitted(w.clone()));
        }
        let d = &self.devs[i];
        let Some(node) = d.node.clone() else {
            return Err(U::UnknownDevice(format!(
                "device {} of pool {} is not bound to one node",
                d.name, d.pool
            )));
        };
        match d.kind {
            DeviceKind::Gpu => {
                let Some(&slot) = self.gpu_slot.get(&i) else {
                    return Err(U::UnknownDevice(format!(
                        "device {} of pool {}: more GPUs on its node than the model reads",
                        d.name, d.pool
                    )));
                };
                let milli = if r.share {
                    share_milli(d, &r.consumed).ok_or_else(|| {
                        U::Malformed(format!(
                            "share of device {} consumes no capacity the device publishes",
                            d.name
                        ))
                    })?
                } else {
                    GPU_MILLI
                };
                Ok(Landing::Gpu(node, slot, milli, r.share))
            }
            DeviceKind::Mig => Ok(Landing::Mig(
                node,
                d.profile.clone().unwrap_or_else(|| "mig".into()),
            )),
            DeviceKind::Other => Ok(Landing::Other(format!("{} ({})", d.name, d.driver))),
        }
    }
}

impl Inventory {
    /// Where the devices of a pod come from, for the move rules. `ext` says whether the
    /// pod asks for an extended resource DRA backs.
    pub(crate) fn claim_source(
        &self,
        ns: &str,
        claims: &PodClaims,
        ext: bool,
    ) -> crate::model::ClaimSource {
        use crate::model::ClaimSource as S;
        if !(claims.any() || ext) || !self.present {
            return S::None;
        }
        // A named claim never moves, shared or not.
        for (_, named) in &claims.spec {
            if let Some(c) = named {
                let key = format!("{ns}/{c}");
                return match self.claim(ns, c) {
                    Some(cl) if cl.consumers() > 1 => S::Shared(key),
                    _ => S::Named(key),
                };
            }
        }
        if ext && claims.extended.is_none() {
            return S::Unsure(
                "asks for a DRA-backed extended resource but its status names no claim".into(),
            );
        }
        for name in claims.names() {
            let c = match name {
                Ok((c, _)) => c,
                Err(n) => {
                    return S::Unsure(format!("claim {n} is not recorded in the pod's status"));
                }
            };
            let Some(cl) = self.claim(ns, &c) else {
                return S::Unsure(format!("ResourceClaim {ns}/{c} is not in the input"));
            };
            if cl.consumers() > 1 {
                return S::Shared(format!("{ns}/{c}"));
            }
            let Some(results) = cl.results() else {
                return S::Unsure(format!("ResourceClaim {ns}/{c} is not allocated"));
            };
            for r in results {
                match self.landing(r) {
                    Ok(Landing::Gpu(_, _, _, false)) => {}
                    Ok(Landing::Gpu(_, _, _, true)) => {
                        return S::Unsure(format!(
                            "claim {c} holds a consumable-capacity share of {} (shares are not planned yet)",
                            r.device
                        ));
                    }
                    Ok(Landing::Mig(_, p)) => {
                        return S::Unsure(format!(
                            "claim {c} holds MIG partition {} ({p}): MIG moves are not planned yet",
                            r.device
                        ));
                    }
                    Ok(Landing::Other(d)) => {
                        return S::Unsure(format!(
                            "claim {c} holds device {d}, which gpu-defrag does not place"
                        ));
                    }
                    Ok(Landing::NotGpu) => {
                        return S::Unsure(format!(
                            "claim {c} holds a device of driver {}, which gpu-defrag does not model",
                            r.driver
                        ));
                    }
                    Err(e) => return S::Unsure(format!("claim {c}: {e}")),
                }
            }
        }
        S::Movable
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(name: &str, cel: &str, ext: Option<&str>) -> DeviceClass {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": cel}}], "extendedResourceName": ext}
        }))
        .unwrap()
    }

    #[test]
    fn counter_families_drop_the_trailing_index() {
        assert_eq!(family("memory-slice-3"), "memory-slice");
        assert_eq!(family("memorySlice12"), "memorySlice");
        assert_eq!(family("multiprocessors"), "multiprocessors");
        assert_eq!(family("7"), "7");
        assert_eq!(family(""), "");
    }

    #[test]
    fn classes_are_read_from_names_and_selectors() {
        let nv = class("gpu.nvidia.com", "true", Some("nvidia.com/gpu"));
        assert_eq!(class_kind(&nv).0, DeviceKind::Gpu);
        let mig = class("mig.nvidia.com", "true", None);
        assert_eq!(class_kind(&mig).0, DeviceKind::Mig);
        let acme = class(
            "a",
            "device.driver == 'gpu.acme.io' && device.attributes['gpu.acme.io'].type == 'gpu'",
            None,
        );
        assert_eq!(
            class_kind(&acme),
            (DeviceKind::Gpu, vec!["gpu.acme.io".into()])
        );
        let nic = class("nic", "device.driver == \"nic.io\"", None);
        assert_eq!(class_kind(&nic), (DeviceKind::Other, vec!["nic.io".into()]));
        // Unterminated or odd text: no driver, no panic.
        let odd = class("o", "device.driver == 'x", None);
        assert_eq!(class_kind(&odd).1, Vec::<String>::new());
        let odd = class("o", "device.driver", None);
        assert_eq!(class_kind(&odd).1, Vec::<String>::new());
        let inv = Inventory::build(&[], &[], &[&nv, &acme], &[]);
        assert!(inv.is_gpu_driver("gpu.acme.io") && inv.is_gpu_driver(NVIDIA_DRIVER));
        assert_eq!(inv.extended_kind("nvidia.com/gpu"), Some(DeviceKind::Gpu));
        assert_eq!(
            inv.extended_kind("deviceclass.resource.kubernetes.io/a"),
            Some(DeviceKind::Gpu)
        );
    }

    #[test]
    fn pod_claims_name_their_claim_objects() {
        let pod: corev1::Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {"containers": [], "resourceClaims": [
                {"name": "a", "resourceClaimTemplateName": "t"},
                {"name": "b", "resourceClaimName": "shared"},
                {"name": "c", "resourceClaimTemplateName": "t"},
                {"name": "d", "resourceClaimTemplateName": "t"}]},
            "status": {"resourceClaimStatuses": [
                {"name": "a", "resourceClaimName": "p-a-x"}, {"name": "c"}],
                "extendedResourceClaimStatus": {"resourceClaimName": "p-ext", "requestMappings": []}}
        }))
        .unwrap();
        let c = PodClaims::of(&pod);
        assert!(c.any());
        assert_eq!(
            c.names(),
            [
                Ok(("p-a-x".to_string(), false)),
                Ok(("shared".to_string(), true)),
                Err("d".to_string()),
                Ok(("p-ext".to_string(), false)),
            ]
        );
        assert!(!PodClaims::default().any());
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
