//! The GPU allocation schemes, one type each behind the [`Adapter`] trait.
//!
//! An adapter knows one scheme: how its nodes list their GPUs and how its pods record which
//! GPUs they hold. [`crate::ingest`] asks the adapters of [`ADAPTERS`], in order, which one
//! recognises a node (the first wins), then which one recognises each pod (the first wins)
//! and lets it resolve the pod's allocation. Adding a scheme is one type implementing
//! [`Adapter`] and one line in [`ADAPTERS`].
//!
//! The records are parsed by [`crate::formats`]; the adapters check them against the pod's
//! requests and the node's inventory. Nothing here panics on any input.
use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1 as corev1;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::formats::{self, FormatError};
use crate::model::*;

mod aliyun;
mod dra;
mod hami;
mod kai;
mod koord;
mod mig;
mod nvidia_sharing;
mod plain;
mod unrecorded;
mod volcano_share;
mod volcano_vgpu;

pub use aliyun::{ALIYUN_GPU_COUNT, ALIYUN_GPU_MEM, ALIYUN_MEM_IDX};
pub use hami::{HAMI_NODE_REGISTER, HAMI_POD_ALLOCATED, hami_pod_gpus};
pub use kai::{KAI_FRACTION, KAI_GROUP, KAI_RESERVATION_NS};
pub use koord::{KOORD_DEVICE_ALLOCATED, KOORD_GPU_CORE};
pub(crate) use mig::read_pools as read_mig_pools;
pub use nvidia_sharing::{
    GPU_COUNT_LABEL, GPU_REPLICAS_LABEL, GPU_SHARING_STRATEGY_LABEL, NVIDIA_GPU_SHARED,
};
pub use plain::{GPU_MEMORY_LABEL, GPU_PRODUCT_LABEL, NVIDIA_GPU};
pub use volcano_share::{VOLCANO_GPU_INDEX, VOLCANO_GPU_MEMORY, VOLCANO_GPU_NUMBER};
pub use volcano_vgpu::{VOLCANO_NODE_REGISTER, VOLCANO_VGPU_IDS};

/// Every adapter, in precedence order: a node belongs to the first that recognises it, a pod
/// is resolved by the first that recognises it. Pod records come first (HAMi, Volcano vGPU,
/// Koordinator, Volcano gpushare, Aliyun, KAI), then the share requests no record backs,
/// then the schemes read from requests alone (MIG; NVIDIA time-slicing and MPS replicas,
/// recognised on the node by GPU feature discovery's labels; plain `nvidia.com/gpu`, which
/// recognises every node and every pod).
pub(crate) static ADAPTERS: &[&dyn Adapter] = &[
    &hami::Hami,
    &volcano_vgpu::VolcanoVgpu,
    &koord::Koordinator,
    &volcano_share::VolcanoShare,
    &aliyun::Aliyun,
    &kai::Kai,
    &unrecorded::UnrecordedShare,
    &dra::Dra,
    &mig::Mig,
    &nvidia_sharing::NvidiaSharing,
    &plain::Plain,
];

/// One GPU allocation scheme.
pub(crate) trait Adapter: Sync {
    /// Short name, unique among [`ADAPTERS`]; the model's [`Scheme::as_str`] for adapters
    /// that stand for a [`Scheme`].
    fn name(&self) -> &'static str;

    /// The scheme of the nodes this adapter recognises; `None` for adapters that recognise
    /// no node (KAI rides on plain nodes, MIG pools are read on every node).
    fn scheme(&self) -> Option<Scheme> {
        None
    }

    /// Resources whose request means "a share of a GPU" in this scheme: a pod asking for
    /// one must carry a record.
    fn share_resources(&self) -> &'static [&'static str] {
        &[]
    }

    /// Whether the node carries this scheme's inventory.
    fn claims_node(&self, _node: &NodeInput<'_>) -> bool {
        false
    }

    /// Reads the GPUs of a node this adapter recognised into `n` (GPUs, granularity, model)
    /// and `ctx` (device keys, read errors). `n.scheme` is already set.
    fn read_node(&self, _node: &NodeInput<'_>, _n: &mut Node, _ctx: &mut NodeCtx) {}

    /// Whether the pod's record (or, for schemes without records, its requests) belongs to
    /// this scheme.
    fn claims_pod(&self, pod: &PodInput<'_>) -> bool;

    /// The allocation of a pod this adapter recognised. `node` is the pod's node when the pod
    /// is bound and active, else `None`: then only the pod's shape (what it asks for) counts.
    fn resolve_pod(&self, pod: &PodInput<'_>, node: Option<(&Node, &NodeCtx)>) -> Resolved;

    /// The pod's node when it is of this adapter's scheme, else the pod's resolution: no use
    /// when it has no node, unknown when the node is of another scheme.
    fn own_node<'a>(
        &self,
        node: Option<(&'a Node, &'a NodeCtx)>,
    ) -> Result<(&'a Node, &'a NodeCtx), Resolved> {
        let Some((n, ctx)) = node else {
            return Err(Resolved::Use(GpuUse::None, None, self.scheme()));
        };
        if Some(n.scheme) != self.scheme() {
            return Err(unknown(UnknownReason::DisagreesWithRequest(format!(
                "{} record on a {} node",
                self.name(),
                n.scheme.as_str()
            ))));
        }
        Ok((n, ctx))
    }
}

/// What an adapter reads of a node.
pub(crate) struct NodeInput<'a> {
    /// The node object.
    pub obj: &'a corev1::Node,
    /// Its annotations (empty when it has none).
    pub annotations: &'a BTreeMap<String, String>,
    /// Its Koordinator `Device` object, read, when there is one.
    pub koord_devices: Option<&'a Result<Vec<formats::KoordDevice>, FormatError>>,
    /// Per-GPU memory in MiB from the `nvidia.com/gpu.memory` label.
    pub label_mem: Option<u64>,
    /// Its GPUs published through DRA, when a driver publishes any.
    pub dra: Option<&'a crate::dra::NodeDevices>,
}

impl NodeInput<'_> {
    /// The node's allocatable quantity `name`, as written.
    pub fn allocatable(&self, name: &str) -> Option<&str> {
        alloc_quantity(self.obj, name)
    }

    /// The node's allocatable `name` as a count (`None` when absent).
    pub fn count(&self, name: &str) -> Result<Option<u64>, FormatError> {
        self.allocatable(name)
            .map(formats::quantity_to_count)
            .transpose()
    }
}

/// The node's allocatable quantity `name`, as written.
pub(crate) fn alloc_quantity<'a>(node: &'a corev1::Node, name: &str) -> Option<&'a str> {
    node.status
        .as_ref()?
        .allocatable
        .as_ref()?
        .get(name)
        .map(|q| q.0.as_str())
}

/// Node-level facts the pod resolution needs.
#[derive(Debug, Default)]
pub(crate) struct NodeCtx {
    /// Device key (UUID or index string) → index into the node's `gpus`.
    pub by_key: HashMap<String, usize>,
    /// Koordinator minor → index.
    pub by_minor: HashMap<u32, usize>,
    /// Per-card memory for index-only schemes (homogeneous by their own definition).
    pub card_mem: Option<u64>,
    /// Why the node's GPU inventory could not be read.
    pub inventory_error: Option<String>,
    /// NVIDIA sharing: replicas per GPU and the resource they are advertised as.
    pub replicas: Option<(u32, &'static str)>,
}

/// What an adapter reads of a pod.
pub(crate) struct PodInput<'a> {
    /// The pod as modelled so far (labels, phase, node).
    pub pod: &'a Pod,
    /// Its resource requests.
    pub req: &'a Requests,
    /// Its annotations (empty when it has none).
    pub annotations: &'a BTreeMap<String, String>,
    /// Its DRA claims and the DRA inventory, when the input has DRA objects.
    pub dra: Option<DraPodInput<'a>>,
}

/// What the DRA adapter reads of a pod.
pub(crate) struct DraPodInput<'a> {
    /// The DRA inventory.
    pub inv: &'a crate::dra::Inventory,
    /// The pod's claims.
    pub claims: &'a crate::dra::PodClaims,
    /// Its node is a DRA node.
    pub node_is_dra: bool,
}

/// One container's resources: name → quantity (a limit where it differs from the
/// request of the same name, as the API server requires of extended resources), in name
/// order.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct ContainerRequests(Vec<(String, String)>);

impl ContainerRequests {
    /// The quantity of `name`.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .binary_search_by(|(k, _)| k.as_str().cmp(name))
            .ok()
            .map(|i| self.0[i].1.as_str())
    }
    /// Whether it asks for `name`.
    pub fn contains_key(&self, name: &str) -> bool {
        self.get(name).is_some()
    }
    /// (name, quantity), in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> + '_ {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }
}

/// `(name, quantity)` of a container's requests and limits in name order, a limit in
/// place of the request of the same name.
fn merge_limits(
    requests: Option<&BTreeMap<String, Quantity>>,
    limits: Option<&BTreeMap<String, Quantity>>,
) -> Vec<(String, String)> {
    let mut req = requests.into_iter().flatten().peekable();
    let mut lim = limits.into_iter().flatten().peekable();
    let n = requests.map_or(0, |x| x.len()) + limits.map_or(0, |x| x.len());
    let mut out = Vec::with_capacity(n);
    loop {
        let next = match (req.peek(), lim.peek()) {
            (Some(r), Some(l)) => match r.0.cmp(l.0) {
                std::cmp::Ordering::Less => req.next(),
                std::cmp::Ordering::Greater => lim.next(),
                std::cmp::Ordering::Equal => {
                    req.next();
                    lim.next()
                }
            },
            (Some(_), None) => req.next(),
            (None, _) => lim.next(),
        };
        match next {
            Some((k, v)) => out.push((k.clone(), v.0.clone())),
            None => {
                out.shrink_to_fit();
                return out;
            }
        }
    }
}

/// Per-pod resource requests, summed over containers (init containers: the max): read
/// once, when the pod is projected ([`CompactPod`]).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Requests {
    /// Name → per-container quantities (strings), containers in order.
    pub(crate) per_container: Vec<ContainerRequests>,
    /// CPU, milli.
    pub cpu: u64,
    /// Memory, bytes.
    pub mem: u64,
    /// The first request or limit that is not a quantity, described.
    bad: Option<String>,
}

impl Requests {
    /// Reads a pod spec's requests (limits where a container has no requests).
    pub fn of(spec: &corev1::PodSpec) -> Requests {
        let mut r = Requests::default();
        let mut cpu = 0u64;
        let mut mem = 0u64;
        for c in &spec.containers {
            let (c_cpu, c_mem) = r.read(c, "container");
            cpu = cpu.saturating_add(c_cpu);
            mem = mem.saturating_add(c_mem);
            // Extended resources must have requests == limits; take limits, then requests:
            // a limit replaces the request of the same name. Both maps are in name order:
            // one merge keeps that order.
            let m = c.resources.as_ref().map_or_else(Vec::new, |res| {
                merge_limits(res.requests.as_ref(), res.limits.as_ref())
            });
            r.per_container.push(ContainerRequests(m));
        }
        // kube-scheduler's rule: sidecars (restartable init containers) run beside the
        // app containers and beside every init container after them; an init container
        // runs alone otherwise; `spec.overhead` comes on top.
        let (mut side_cpu, mut side_mem) = (0u64, 0u64);
        let (mut init_cpu, mut init_mem) = (0u64, 0u64);
        for c in spec.init_containers.iter().flatten() {
            let (c_cpu, c_mem) = r.read(c, "init container");
            if c.restart_policy.as_deref() == Some("Always") {
                side_cpu = side_cpu.saturating_add(c_cpu);
                side_mem = side_mem.saturating_add(c_mem);
                init_cpu = init_cpu.max(side_cpu);
                init_mem = init_mem.max(side_mem);
            } else {
                init_cpu = init_cpu.max(side_cpu.saturating_add(c_cpu));
                init_mem = init_mem.max(side_mem.saturating_add(c_mem));
            }
        }
        cpu = cpu.saturating_add(side_cpu).max(init_cpu);
        mem = mem.saturating_add(side_mem).max(init_mem);
        for (k, v) in spec.overhead.iter().flatten() {
            match k.as_str() {
                "cpu" => cpu = cpu.saturating_add(formats::quantity_to_milli(&v.0).unwrap_or(0)),
                "memory" => mem = mem.saturating_add(formats::quantity_to_bytes(&v.0).unwrap_or(0)),
                _ => {}
            }
        }
        r.cpu = cpu;
        r.mem = mem;
        r
    }

    /// A container's CPU (milli) and memory (bytes) requests (its limits where it has no
    /// requests; 0 where unreadable), each quantity read once. Records the first request
    /// or limit of `c` that is not a quantity (`cpu` must read as milli-CPU, `memory` as
    /// bytes), unless one was recorded already.
    fn read(&mut self, c: &corev1::Container, what: &str) -> (u64, u64) {
        let Some(res) = &c.resources else {
            return (0, 0);
        };
        let (mut cpu, mut mem) = (0, 0);
        for (section, list) in [("requests", &res.requests), ("limits", &res.limits)] {
            // The requests, or the limits of a container without requests.
            let counted = (section == "requests") == res.requests.is_some();
            for (k, v) in list.iter().flatten() {
                let wanted = counted && (k == "cpu" || k == "memory");
                // A limit equal to its request was read with the request.
                let checked = self.bad.is_none()
                    && !(section == "limits"
                        && res
                            .requests
                            .as_ref()
                            .and_then(|r| r.get(k))
                            .is_some_and(|r| r.0 == v.0));
                if !wanted && !checked {
                    continue;
                }
                let read = match k.as_str() {
                    "cpu" => formats::quantity_to_milli(&v.0),
                    "memory" => formats::quantity_to_bytes(&v.0),
                    _ => formats::quantity::parse_milli(formats::keys::QUANTITY, &v.0, true)
                        .map(|_| 0),
                };
                if wanted {
                    let x = read.as_ref().map_or(0, |x| *x);
                    if k == "cpu" {
                        cpu = x;
                    } else {
                        mem = x;
                    }
                }
                if checked && let Err(e) = read {
                    self.bad = Some(format!(
                        "{what} {}: {section}.{}: {e}",
                        trunc(&c.name),
                        trunc(k)
                    ));
                }
            }
        }
        (cpu, mem)
    }

    /// Why the pod's requests cannot be read: its first request or limit that is not a
    /// quantity.
    pub fn unreadable(&self) -> Option<&str> {
        self.bad.as_deref()
    }

    /// The count of `name` summed over the containers; [`UnknownReason::BadQuantity`] when
    /// one is not a whole number.
    pub fn total(&self, name: &str) -> Result<u64, UnknownReason> {
        let mut sum = 0u64;
        for c in &self.per_container {
            if let Some(q) = c.get(name) {
                sum = sum.saturating_add(count(name, q)?);
            }
        }
        Ok(sum)
    }

    /// Whether any container asks for `name`.
    pub fn has(&self, name: &str) -> bool {
        self.per_container.iter().any(|c| c.contains_key(name))
    }

    /// Whether the pod asks for a share of a GPU in any scheme.
    pub fn has_shared(&self) -> bool {
        ADAPTERS
            .iter()
            .flat_map(|a| a.share_resources())
            .any(|r| self.has(r))
    }
}

/// Whether resource `name` is a GPU resource the allocation adapters account for (whole
/// GPUs, MIG pools, the sharing schemes' shares and counts): the scheduler emulation's
/// resource filter leaves those to the GPU model and checks every other resource.
pub fn is_gpu_resource(name: &str) -> bool {
    name == NVIDIA_GPU
        || name == nvidia_sharing::NVIDIA_GPU_SHARED
        || name.starts_with(crate::formats::mig::MIG_RESOURCE_PREFIX)
        || name == aliyun::ALIYUN_GPU_COUNT
        || name == volcano_share::VOLCANO_GPU_NUMBER
        || ADAPTERS
            .iter()
            .flat_map(|a| a.share_resources())
            .any(|r| *r == name)
}

/// The count `q` of resource `name`; [`UnknownReason::BadQuantity`] when it is not a whole
/// number.
fn count(name: &str, q: &str) -> Result<u64, UnknownReason> {
    formats::quantity_to_count(q)
        .map_err(|e| UnknownReason::BadQuantity(format!("{}: {e}", trunc(name))))
}

/// A pod's allocation, before it is applied to its node.
pub(crate) enum Resolved {
    /// The pod's use, its shape and its scheme.
    Use(GpuUse, Option<GpuShape>, Option<Scheme>),
    /// KAI fraction: group, milli.
    Kai(String, Milli),
    /// NVIDIA sharing: replicas held on the pod's node (which GPUs is not recorded), and
    /// the pod's shape.
    Replicas(u32, GpuShape),
}

/// An unknown allocation.
pub(crate) fn unknown(r: UnknownReason) -> Resolved {
    Resolved::Use(GpuUse::Unknown(r), None, None)
}

/// A pod's known use of devices of its node, with its shape and scheme.
fn devices(devs: Vec<(usize, Milli)>, scheme: Scheme) -> Resolved {
    let devs = merge(devs);
    let shape = shape_of(&devs);
    Resolved::Use(GpuUse::Devices(devs), shape, Some(scheme))
}

fn shape_of(devs: &[(usize, Milli)]) -> Option<GpuShape> {
    let max = devs.iter().map(|d| d.1).max()?;
    Some(GpuShape {
        gpus: devs.len() as u32,
        milli: max,
    })
}

/// Merges entries naming the same device (several containers on one GPU).
fn merge(mut devs: Vec<(usize, Milli)>) -> Vec<(usize, Milli)> {
    devs.sort_by_key(|d| d.0);
    devs.dedup_by(|next, kept| {
        let same = next.0 == kept.0;
        if same {
            kept.1 = kept.1.saturating_add(next.1);
        }
        same
    });
    for d in &mut devs {
        d.1 = d.1.min(GPU_MILLI);
    }
    devs
}

/// Gives the node `count` whole GPUs keyed by index (at most
/// [`formats::MAX_DEVICES_PER_NODE`]).
fn whole_gpus(n: &mut Node, count: u64, mem: Option<u64>) {
    let count = count.min(formats::MAX_DEVICES_PER_NODE as u64);
    n.gpus = (0..count)
        .map(|i| Gpu {
            key: i.to_string(),
            used: 0,
            healthy: true,
            memory_mib: mem,
        })
        .collect();
}

/// Gives the node the listed devices (key, memory in MiB, healthy), at device granularity.
fn device_list(n: &mut Node, ctx: &mut NodeCtx, devs: Vec<(String, Option<u64>, bool)>) {
    n.granularity = Granularity::Device;
    for (i, (key, mem, healthy)) in devs.into_iter().enumerate() {
        ctx.by_key.insert(key.clone(), i);
        n.gpus.push(Gpu {
            key,
            used: 0,
            healthy,
            memory_mib: mem,
        });
    }
}

/// Reads an index-only shared node (Volcano gpushare, Aliyun gpushare): `count_res` cards
/// (else `nvidia.com/gpu`) sharing `mem_res` memory equally.
fn read_index_cards(
    node: &NodeInput<'_>,
    n: &mut Node,
    ctx: &mut NodeCtx,
    count_res: &str,
    mem_res: &str,
) {
    n.granularity = Granularity::Device;
    let count = node.count(count_res).and_then(|c| match c {
        Some(c) => Ok(c),
        None => node.count(NVIDIA_GPU).map(|c| c.unwrap_or(0)),
    });
    let mem = node.count(mem_res);
    match (count, mem) {
        (Ok(count), Ok(mem)) if count > 0 => {
            // Both schemes assume homogeneous cards: per-card memory = total / count.
            let card = mem.map(|m| m / count);
            ctx.card_mem = card;
            whole_gpus(n, count, None);
            for i in 0..n.gpus.len() {
                ctx.by_key.insert(i.to_string(), i);
            }
        }
        (Ok(_), Ok(_)) => {}
        (Err(e), _) | (_, Err(e)) => {
            ctx.inventory_error = Some(format!("allocatable {count_res}/{mem_res}: {e}"))
        }
    }
}

/// `s`, cut to 64 bytes.
fn trunc(s: &str) -> String {
    if s.len() <= 64 {
        s.to_string()
    } else {
        format!("{}…", &s[..s.floor_char_boundary(64)])
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn adapters_are_in_precedence_order_with_unique_names() {
        let names: Vec<&str> = ADAPTERS.iter().map(|a| a.name()).collect();
        assert_eq!(
            names,
            [
                "hami",
                "volcano-vgpu",
                "koordinator",
                "volcano-gpushare",
                "aliyun-gpushare",
                "kai",
                "unrecorded-share",
                "dra",
                "mig",
                "nvidia-sharing",
                "plain",
            ]
        );
        let unique: BTreeSet<&str> = names.iter().copied().collect();
        assert_eq!(unique.len(), names.len());
        for a in ADAPTERS {
            if let Some(s) = a.scheme() {
                assert_eq!(a.name(), s.as_str(), "an adapter is named after its scheme");
            }
        }
        let schemes: Vec<Scheme> = ADAPTERS.iter().filter_map(|a| a.scheme()).collect();
        assert_eq!(
            schemes,
            [
                Scheme::Hami,
                Scheme::VolcanoVgpu,
                Scheme::Koordinator,
                Scheme::VolcanoShare,
                Scheme::Aliyun,
                Scheme::Dra,
                Scheme::NvidiaSharing,
                Scheme::Plain,
            ],
            "every scheme has exactly one adapter"
        );
    }

    #[test]
    fn the_last_adapter_recognises_every_node_and_pod() {
        let node = corev1::Node::default();
        let empty = BTreeMap::new();
        let input = NodeInput {
            obj: &node,
            annotations: &empty,
            koord_devices: None,
            label_mem: None,
            dra: None,
        };
        let pod = Pod::default();
        let req = Requests::default();
        let p = PodInput {
            pod: &pod,
            req: &req,
            annotations: &empty,
            dra: None,
        };
        let last = ADAPTERS.last().unwrap();
        assert!(last.claims_node(&input) && last.claims_pod(&p));
        let first_node = ADAPTERS.iter().find(|a| a.claims_node(&input)).unwrap();
        assert_eq!(first_node.name(), "plain");
        let first_pod = ADAPTERS.iter().find(|a| a.claims_pod(&p)).unwrap();
        assert_eq!(first_pod.name(), "plain");
    }

    #[test]
    fn share_resources_are_those_of_every_sharing_scheme() {
        let all: BTreeSet<&str> = ADAPTERS
            .iter()
            .flat_map(|a| a.share_resources())
            .copied()
            .collect();
        let want: BTreeSet<&str> = [
            "nvidia.com/gpumem",
            "nvidia.com/gpumem-percentage",
            "nvidia.com/gpucores",
            "koordinator.sh/gpu-core",
            "koordinator.sh/gpu-memory",
            "koordinator.sh/gpu-memory-ratio",
            "koordinator.sh/gpu.shared",
            "koordinator.sh/gpu",
            "volcano.sh/gpu-memory",
            "volcano.sh/gpu-number",
            "volcano.sh/vgpu-number",
            "volcano.sh/vgpu-memory",
            "volcano.sh/vgpu-cores",
            "volcano.sh/vgpu-memory-percentage",
            "aliyun.com/gpu-mem",
        ]
        .into();
        assert_eq!(all, want);
    }

    #[test]
    fn entries_naming_one_device_merge_in_device_order_at_most_one_gpu() {
        assert_eq!(merge(vec![]), []);
        assert_eq!(
            merge(vec![(3, 300), (1, 200), (3, 400), (1, 900), (2, 5)]),
            [(1, GPU_MILLI), (2, 5), (3, 700)]
        );
        assert_eq!(merge(vec![(0, u32::MAX), (0, u32::MAX)]), [(0, GPU_MILLI)]);
    }

    #[test]
    fn a_limit_replaces_the_request_of_its_name_in_name_order() {
        let map = |kv: &[(&str, &str)]| -> BTreeMap<String, Quantity> {
            kv.iter()
                .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                .collect()
        };
        let req = map(&[("cpu", "1"), ("memory", "1Gi"), ("nvidia.com/gpu", "1")]);
        let lim = map(&[("a.io/x", "2"), ("memory", "2Gi"), ("nvidia.com/gpu", "1")]);
        let pairs = |kv: &[(&str, &str)]| -> Vec<(String, String)> {
            kv.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert_eq!(
            merge_limits(Some(&req), Some(&lim)),
            pairs(&[
                ("a.io/x", "2"),
                ("cpu", "1"),
                ("memory", "2Gi"),
                ("nvidia.com/gpu", "1")
            ])
        );
        assert_eq!(merge_limits(None, Some(&lim)).len(), 3);
        assert_eq!(
            merge_limits(Some(&req), None)[1],
            pairs(&[("memory", "1Gi")])[0]
        );
        assert!(merge_limits(None, None).is_empty());
    }

    #[test]
    fn cpu_and_memory_come_from_requests_else_limits_init_containers_at_most() {
        let res = |req: &[(&str, &str)], lim: &[(&str, &str)]| {
            let map = |kv: &[(&str, &str)]| {
                (!kv.is_empty()).then(|| {
                    kv.iter()
                        .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                        .collect::<BTreeMap<_, _>>()
                })
            };
            corev1::Container {
                resources: Some(corev1::ResourceRequirements {
                    requests: map(req),
                    limits: map(lim),
                    ..Default::default()
                }),
                ..Default::default()
            }
        };
        let spec = corev1::PodSpec {
            containers: vec![
                // requests win; the limit's cpu is not counted
                res(&[("cpu", "500m")], &[("cpu", "2"), ("memory", "1Gi")]),
                // no requests: the limits count
                res(&[], &[("cpu", "1"), ("memory", "1Ki")]),
                corev1::Container::default(),
            ],
            init_containers: Some(vec![
                res(&[("cpu", "3")], &[]),
                res(&[("memory", "2Ki")], &[]),
            ]),
            ..Default::default()
        };
        let r = Requests::of(&spec);
        assert_eq!((r.cpu, r.mem), (3000, 2048));
        assert!(r.unreadable().is_none());
        let spec = corev1::PodSpec {
            containers: vec![res(&[("cpu", "x"), ("memory", "1Ki")], &[("memory", "y")])],
            ..Default::default()
        };
        let r = Requests::of(&spec);
        assert_eq!((r.cpu, r.mem), (0, 1024), "an unreadable cpu counts 0");
        let bad = r.unreadable().unwrap_or_default();
        assert!(
            bad.starts_with("container : requests.cpu: "),
            "the first is reported: {bad}"
        );
    }
}
