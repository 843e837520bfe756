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
mod account;
mod claims;
mod classes;
mod placement;
mod slices;

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::api::resource::v1::{DeviceClass, DeviceTaintRule, ResourceClaim, ResourceSlice};

use crate::model::{DraGpu, Gpu, MigPool};

use claims::{Claim, read_claim};
use classes::class_kind;
use slices::Dev;

pub use claims::PodClaims;
pub(crate) use placement::Landing;

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
}
