//! The normalised cluster model every other part of the core works on.
//!
//! Every GPU allocation, whatever scheme wrote it, becomes milli-GPU per device
//! (a whole GPU = 1000). Nodes and pods are plain data; indices tie them together.
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};

/// Milli-GPU: 1000 is one whole GPU.
pub type Milli = u32;
/// One whole GPU in milli.
pub const GPU_MILLI: Milli = 1000;

/// The allocation scheme a node's GPUs are handed out by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scheme {
    /// Plain device plugin: `nvidia.com/gpu` whole GPUs (KAI fractions ride on top).
    Plain,
    /// HAMi vGPU (`hami.io/node-nvidia-register`).
    Hami,
    /// Volcano vGPU (`volcano.sh/node-vgpu-register`).
    VolcanoVgpu,
    /// Koordinator device share (`koordinator.sh/gpu-core`, `Device` objects).
    Koordinator,
    /// Volcano gpushare (`volcano.sh/gpu-memory`, `volcano.sh/gpu-number`).
    VolcanoShare,
    /// Aliyun gpushare (`aliyun.com/gpu-mem`, `aliyun.com/gpu-count`).
    Aliyun,
    /// NVIDIA device plugin sharing, time-slicing or MPS: each GPU advertised as
    /// `nvidia.com/gpu.replicas` replicas (`nvidia.com/gpu` or `nvidia.com/gpu.shared`).
    /// Which GPU a replica is on is not recorded: counted per node.
    NvidiaSharing,
    /// Dynamic Resource Allocation: GPUs published in `ResourceSlice`s (`resource.k8s.io/v1`),
    /// allocated through `ResourceClaim`s (see [`crate::dra`]).
    Dra,
}

impl Scheme {
    /// Short name used in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Plain => "plain",
            Scheme::Hami => "hami",
            Scheme::VolcanoVgpu => "volcano-vgpu",
            Scheme::Koordinator => "koordinator",
            Scheme::VolcanoShare => "volcano-gpushare",
            Scheme::Aliyun => "aliyun-gpushare",
            Scheme::NvidiaSharing => "nvidia-sharing",
            Scheme::Dra => "dra",
        }
    }
}

/// Whether allocations name devices or only count GPUs per node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Granularity {
    /// Each allocation names a device (UUID or index).
    Device,
    /// Only a count per node is known (any free whole GPU is as good as another).
    Node,
}

/// One physical GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct Gpu {
    /// UUID, or the index as a string.
    pub key: String,
    /// Milli allocated on it (0..=1000).
    pub used: Milli,
    /// Unhealthy GPUs are not counted as free capacity.
    pub healthy: bool,
    /// Device memory, when known.
    pub memory_mib: Option<u64>,
}

impl Gpu {
    /// Free milli on this GPU (0 when unhealthy).
    pub fn free(&self) -> Milli {
        if self.healthy {
            GPU_MILLI.saturating_sub(self.used)
        } else {
            0
        }
    }
}

/// A node taint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Taint {
    /// Key.
    pub key: String,
    /// Value (may be empty).
    pub value: String,
    /// `NoSchedule`, `PreferNoSchedule` or `NoExecute`.
    pub effect: String,
}

/// A pod toleration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Toleration {
    /// Key; empty with operator Exists tolerates everything.
    pub key: String,
    /// `Equal` (default) or `Exists`.
    pub operator: String,
    /// Value for `Equal`.
    pub value: String,
    /// Empty tolerates every effect.
    pub effect: String,
}

/// A MIG profile pool on one node (mixed strategy): capacity and use of one profile.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MigPool {
    /// Profile name, e.g. `1g.10gb`.
    pub profile: String,
    /// Allocatable instances.
    pub capacity: u64,
    /// Instances requested by bound pods.
    pub used: u64,
}

/// Where a GPU of a [`Scheme::Dra`] node is published, and what is carved out of it.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DraGpu {
    /// Driver (`gpu.nvidia.com`).
    pub driver: String,
    /// Pool (the node's name for the NVIDIA driver).
    pub pool: String,
    /// Device name in the pool (`gpu-0`): what a `DeviceTaintRule` selects.
    pub device: String,
    /// `uuid` attribute.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// `resource.kubernetes.io/pcieRoot` attribute.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pcie_root: Option<String>,
    /// Profiles of the MIG partitions allocated on it (partitionable devices), in order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub partitions: Vec<String>,
    /// Its taints (`key=value:Effect`), from the ResourceSlice.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub taints: Vec<String>,
}

/// One node, normalised.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// Name.
    pub name: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Taints.
    pub taints: Vec<Taint>,
    /// Ready condition is True.
    pub ready: bool,
    /// Cordoned (`spec.unschedulable`).
    pub unschedulable: bool,
    /// GPU model (`nvidia.com/gpu.product` label, or from the scheme's inventory).
    pub model: Option<String>,
    /// Allocation scheme.
    pub scheme: Scheme,
    /// Device or node granularity.
    pub granularity: Granularity,
    /// GPUs with their current use.
    pub gpus: Vec<Gpu>,
    /// Allocatable CPU, milli.
    pub cpu_alloc: u64,
    /// Allocatable memory, bytes.
    pub mem_alloc: u64,
    /// Allocatable pod count.
    pub pods_alloc: u64,
    /// CPU requested by bound pods, milli.
    pub cpu_used: u64,
    /// Memory requested by bound pods, bytes.
    pub mem_used: u64,
    /// Bound, non-terminal pods.
    pub pods_used: u64,
    /// MIG pools (mixed strategy), separate from the milli metric.
    pub mig: Vec<MigPool>,
    /// Pods on this node whose allocation could not be read. A node with any is never
    /// drained.
    pub unknown_pods: u32,
    /// Why this node's records contradict each other (over-committed device, a record
    /// naming a device it lacks, …). Such a node is never drained.
    pub inconsistent: Option<String>,
    /// Since when it is Ready (its Ready condition's `lastTransitionTime`, else its
    /// creation time): a node younger than `safety.minNodeAge` receives no planned pod.
    pub ready_since: Option<DateTime<Utc>>,
    /// Why the node is still starting up (a start-up taint), when it is: it receives no
    /// planned pod.
    pub starting: Option<String>,
    /// [`Scheme::Dra`] nodes: where each GPU of `gpus` is published (same order); empty
    /// for other schemes.
    pub dra: Vec<DraGpu>,
    /// Allocatable of other resources (ephemeral-storage, hugepages-*, extended
    /// resources), milli-units, by name (sorted); GPU resources are the adapters'.
    pub extra_alloc: Vec<(String, u64)>,
    /// What bound pods request of those, by name (sorted).
    pub extra_used: Vec<(String, u64)>,
}

impl Node {
    /// Free milli summed over the node's GPUs.
    pub fn free_milli(&self) -> u64 {
        self.gpus.iter().map(|g| u64::from(g.free())).sum()
    }
    /// GPUs with nothing allocated (and healthy).
    pub fn fully_free_gpus(&self) -> usize {
        self.gpus
            .iter()
            .filter(|g| g.healthy && g.used == 0)
            .count()
    }
    /// Free CPU, milli.
    pub fn cpu_free(&self) -> u64 {
        self.cpu_alloc.saturating_sub(self.cpu_used)
    }
    /// Free memory, bytes.
    pub fn mem_free(&self) -> u64 {
        self.mem_alloc.saturating_sub(self.mem_used)
    }
}

/// Pod lifecycle phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Phase {
    /// Pending.
    Pending,
    /// Running.
    Running,
    /// Succeeded (terminal).
    Succeeded,
    /// Failed (terminal).
    Failed,
    /// Unknown or absent.
    #[default]
    Unknown,
}

impl Phase {
    /// Succeeded or Failed.
    pub fn is_terminal(self) -> bool {
        matches!(self, Phase::Succeeded | Phase::Failed)
    }
}

/// The GPU shape a pod asks for: `gpus` GPUs with `milli` each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuShape {
    /// Number of GPUs.
    pub gpus: u32,
    /// Milli per GPU (1000 for whole GPUs).
    pub milli: Milli,
}

/// Why a pod's GPU allocation is unknown.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum UnknownReason {
    /// The pod asks for shared GPU resources but carries no allocation record.
    MissingRecord,
    /// The record could not be parsed (message from the parser).
    Malformed(String),
    /// The record does not match the pod's requests.
    DisagreesWithRequest(String),
    /// The record names a device the node does not have.
    UnknownDevice(String),
    /// The records on this node, together, over-commit a device.
    Overcommitted(String),
    /// The node's inventory could not be read.
    NodeInventory(String),
    /// A record the pod's owner can write itself, not confirmed by the scheme's own
    /// side (a KAI fraction without its reservation pod, say).
    Unconfirmed(String),
    /// A resource request or limit of the pod is not a quantity (or not a whole count
    /// where one is needed): what the pod asks for cannot be read.
    BadQuantity(String),
    /// A Dynamic Resource Allocation claim of the pod is missing from the input, not
    /// allocated, or not reserved for the pod.
    ClaimUnresolved(String),
}

impl UnknownReason {
    /// Stable, low-cardinality reason code (for counts, metrics and status).
    pub fn code(&self) -> &'static str {
        match self {
            UnknownReason::MissingRecord => "missing-record",
            UnknownReason::Malformed(_) => "malformed-record",
            UnknownReason::DisagreesWithRequest(_) => "record-disagrees-with-request",
            UnknownReason::UnknownDevice(_) => "record-names-unknown-device",
            UnknownReason::Overcommitted(_) => "device-overcommitted",
            UnknownReason::NodeInventory(_) => "node-inventory-unreadable",
            UnknownReason::Unconfirmed(_) => "record-unconfirmed",
            UnknownReason::BadQuantity(_) => "bad-quantity",
            UnknownReason::ClaimUnresolved(_) => "claim-unresolved",
        }
    }
}

impl std::fmt::Display for UnknownReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UnknownReason::MissingRecord => {
                f.write_str("missing-record: no allocation record for shared GPU request")
            }
            UnknownReason::Malformed(m)
            | UnknownReason::DisagreesWithRequest(m)
            | UnknownReason::UnknownDevice(m)
            | UnknownReason::Overcommitted(m)
            | UnknownReason::NodeInventory(m)
            | UnknownReason::Unconfirmed(m)
            | UnknownReason::BadQuantity(m)
            | UnknownReason::ClaimUnresolved(m) => write!(f, "{}: {m}", self.code()),
        }
    }
}

/// A pod's GPU use on its node.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum GpuUse {
    /// No GPU.
    #[default]
    None,
    /// Whole GPUs counted at node granularity (the device is not known).
    Whole(u32),
    /// Milli per device (index into the node's `gpus`).
    Devices(Vec<(usize, Milli)>),
    /// MIG instances: (profile, count).
    Mig(Vec<(String, u64)>),
    /// Not readable: never moved, its node never drained.
    Unknown(UnknownReason),
}

/// The controller that owns a pod (its `ownerReferences` entry with `controller: true`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Owner {
    /// API group (from `apiVersion`; empty for the core group).
    pub group: String,
    /// Kind (ReplicaSet, StatefulSet, Job, DaemonSet, …).
    pub kind: String,
    /// Name.
    pub name: String,
}

impl Owner {
    /// `group/Kind`, or `Kind` for the core group: the form `safety.movableOwnerKinds` uses.
    pub fn group_kind(&self) -> String {
        if self.group.is_empty() {
            self.kind.clone()
        } else {
            format!("{}/{}", self.group, self.kind)
        }
    }
}

/// How far a pod's controller owner chain was read from the owner objects themselves.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Chain {
    /// Every link was read from its object (the operator; snapshots that carry them).
    Checked,
    /// The owner objects were not at hand (a snapshot of nodes, pods and PDBs alone):
    /// the workload is judged from the pod's own owner reference and labels.
    NotChecked,
    /// An owner object that should be at hand is missing or unreadable (the message
    /// says which): the pod is never moved.
    Broken(String),
}

/// A pod's workload: the top of its controller owner chain (Pod → ReplicaSet →
/// Deployment, Pod → StatefulSet, Pod → Job → CronJob, Pod → anything else).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Workload {
    /// `group/Kind` of the top controller (`apps/Deployment`, `batch/Job`,
    /// `kubeflow.org/PyTorchJob`, …; `Kind` alone for the core group).
    pub kind: String,
    /// Its name.
    pub name: String,
    /// How the chain was read.
    pub chain: Chain,
}

impl Workload {
    /// A workload read from its objects.
    pub fn checked(kind: &str, name: &str) -> Self {
        Workload {
            kind: kind.to_string(),
            name: name.to_string(),
            chain: Chain::Checked,
        }
    }
}

/// Whether a pod belongs to a gang: a group of pods scheduled and run together, where
/// evicting one member restarts or stalls all of them.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Gang {
    /// A member of a gang (what says so: the label, or the PodGroup and its minimum).
    Member(String),
    /// The pod names a pod group whose object cannot be read (not served, not found,
    /// malformed): it may be a gang.
    Unknown(String),
}

/// Where a pod's Dynamic Resource Allocation devices come from, as far as its move is
/// concerned.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ClaimSource {
    /// No claim read (none, or the claims were not read).
    #[default]
    None,
    /// Every claim is the pod's own (made from a `ResourceClaimTemplate`, or by the
    /// scheduler for a DRA-backed extended resource) and holds only whole GPUs the model
    /// knows: the replacement gets new claims, allocated afresh.
    Movable,
    /// It uses a claim named in its spec (`resourceClaimName`), which stays allocated
    /// on its node: the replacement could only land back there.
    Named(String),
    /// It uses a claim other pods use too: the devices stay allocated while any of them
    /// runs.
    Shared(String),
    /// Its claims could not be judged, or hold devices the planner does not place
    /// (MIG partitions, consumable-capacity shares, other drivers' devices): the message
    /// says which.
    Unsure(String),
}

/// A required node-affinity expression (`matchExpressions` or `matchFields` entry).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSelectorRequirement {
    /// Label key, or `metadata.name` for a field.
    pub key: String,
    /// In, NotIn, Exists, DoesNotExist, Gt, Lt.
    pub operator: String,
    /// Values.
    pub values: Vec<String>,
    /// True for `matchFields` (only `metadata.name` is defined).
    pub field: bool,
}

/// Which namespaces a pod (anti-)affinity term or spread constraint counts pods of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TermNamespaces {
    /// These (the pod's own when the term names none).
    List(Vec<String>),
    /// Every namespace (an empty `namespaceSelector`).
    All,
    /// Chosen by a `namespaceSelector` over namespace labels, which the model does not
    /// read: whether a pod's namespace is in is unknown.
    Unread,
}

impl TermNamespaces {
    /// Whether a pod of namespace `ns` is counted (None: cannot be told).
    pub fn contains(&self, ns: &str) -> Option<bool> {
        match self {
            TermNamespaces::All => Some(true),
            TermNamespaces::List(l) => Some(l.iter().any(|x| x == ns)),
            TermNamespaces::Unread => None,
        }
    }
}

/// A required pod affinity or anti-affinity term.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodAffinityTerm {
    /// The pods it is about (`matchLabelKeys` / `mismatchLabelKeys` already merged in);
    /// None matches no pod (a null `labelSelector`).
    pub selector: Option<LabelSelector>,
    /// Their namespaces.
    pub namespaces: TermNamespaces,
    /// The node label that makes a topology domain.
    pub topology_key: String,
}

/// A `whenUnsatisfiable: DoNotSchedule` topology spread constraint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpreadConstraint {
    /// `maxSkew`.
    pub max_skew: u32,
    /// The node label that makes a topology domain.
    pub topology_key: String,
    /// The pods counted (`matchLabelKeys` merged in; None counts none).
    pub selector: Option<LabelSelector>,
    /// `minDomains`, when set.
    pub min_domains: Option<u32>,
    /// `nodeAffinityPolicy: Honor` (the default): only nodes the pod's node selector and
    /// required node affinity allow make domains.
    pub honor_node_affinity: bool,
    /// `nodeTaintsPolicy: Honor` (default `Ignore`): only nodes whose taints the pod
    /// tolerates make domains.
    pub honor_taints: bool,
}

/// A host port a container binds (`hostPort` > 0).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct HostPort {
    /// `TCP`, `UDP` or `SCTP`.
    pub protocol: String,
    /// `hostIP` (`0.0.0.0` when unset).
    pub ip: String,
    /// The port.
    pub port: i32,
}

impl HostPort {
    /// Whether two host ports cannot share a node (kube-scheduler's NodePorts rule).
    pub fn conflicts(&self, o: &HostPort) -> bool {
        self.port == o.port
            && self.protocol == o.protocol
            && (self.ip == o.ip || self.ip == "0.0.0.0" || o.ip == "0.0.0.0")
    }
}

/// A pod's scheduling constraints beyond GPUs, CPU, memory and node rules.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Constraints {
    /// Requests of other resources (ephemeral-storage, hugepages-*, extended resources
    /// such as an RDMA NIC), in milli-units, by name; the GPU resources of the sharing
    /// schemes are the adapters' and are not here.
    pub resources: Vec<(String, u64)>,
    /// Host ports its containers bind.
    pub host_ports: Vec<HostPort>,
    /// Required pod affinity terms (all must hold).
    pub affinity: Vec<PodAffinityTerm>,
    /// Required pod anti-affinity terms (none may be violated).
    pub anti_affinity: Vec<PodAffinityTerm>,
    /// `DoNotSchedule` topology spread constraints.
    pub spread: Vec<SpreadConstraint>,
    /// What of its constraints cannot be evaluated from the model (a term's
    /// `namespaceSelector`, say): no target is ever proven for it.
    pub unreadable: Option<String>,
}

impl Constraints {
    /// Whether it has required inter-pod affinity or anti-affinity or a spread constraint.
    pub fn inter_pod(&self) -> bool {
        !self.affinity.is_empty() || !self.anti_affinity.is_empty() || !self.spread.is_empty()
    }
}

/// One pod, normalised. The default is an unbound pod of unknown phase with no GPU, no
/// owner, not Ready and no volumes (fixtures fill in what they need).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Pod {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID (empty when the input has none).
    pub uid: String,
    /// Index of the node it is bound to, when that node is in the model.
    pub node: Option<usize>,
    /// `spec.nodeName`, when set.
    pub node_name: Option<String>,
    /// Phase.
    pub phase: Phase,
    /// Labels (one map shared by the pods that have the same: the replicas of a workload).
    pub labels: Arc<BTreeMap<String, String>>,
    /// Annotations the planner reads (opt-outs, costs).
    pub annotations: BTreeMap<String, String>,
    /// GPU use on its node (bound pods).
    pub gpu: GpuUse,
    /// The GPU shape it asks for (None: no GPU).
    pub shape: Option<GpuShape>,
    /// Scheme of its allocation record, when any.
    pub scheme: Option<Scheme>,
    /// Requested CPU, milli.
    pub cpu: u64,
    /// Requested memory, bytes.
    pub mem: u64,
    /// Priority (0 when absent).
    pub priority: i32,
    /// Priority class name.
    pub priority_class: Option<String>,
    /// Controller owner.
    pub owner: Option<Owner>,
    /// The workload at the top of the owner chain (None: no controller).
    pub workload: Option<Workload>,
    /// Gang membership, when any.
    pub gang: Option<Gang>,
    /// `status.startTime`: pod ages count from it (a pod that waited Pending for an hour
    /// is not an hour old).
    pub started: Option<DateTime<Utc>>,
    /// Since when the scheduler has found no node for it (pending pods whose
    /// `PodScheduled` condition is `False`, reason `Unschedulable`).
    pub unschedulable_since: Option<DateTime<Utc>>,
    /// `status.nominatedNodeName`: the scheduler is preempting for it there (or landing
    /// control nominated it).
    pub nominated: Option<String>,
    /// The Ready condition is True.
    pub ready: bool,
    /// Has a deletion timestamp.
    pub deleting: bool,
    /// Mirror/static pod.
    pub mirror: bool,
    /// `spec.schedulerName` (`default-scheduler` when the input has none, as the API
    /// server defaults it).
    pub scheduler: Cow<'static, str>,
    /// Uses a disk-backed emptyDir or a hostPath volume (a memory-backed emptyDir such as
    /// `/dev/shm` is not local storage: nothing in it outlives the container anyway).
    pub local_storage: bool,
    /// Mounts a PersistentVolumeClaim.
    pub pvc: bool,
    /// Has a generic ephemeral volume (a PVC made for the pod).
    pub ephemeral_volume: bool,
    /// What the scheduler's filters read beyond GPUs, CPU, memory and node rules: other
    /// resources, host ports, required inter-pod (anti-)affinity, `DoNotSchedule` spread
    /// (None: nothing of these).
    pub constraints: Option<Box<Constraints>>,
    /// Has `spec.resourceClaims` (Dynamic Resource Allocation).
    pub resource_claims: bool,
    /// Where its DRA devices come from, for the move rules ([`ClaimSource::None`] when
    /// it has no claim, or when they were not read: then `resource_claims` decides).
    pub claim_source: ClaimSource,
    /// `spec.nodeSelector`.
    pub node_selector: BTreeMap<String, String>,
    /// Required node affinity: OR of terms, each an AND of requirements.
    pub affinity: Vec<Vec<NodeSelectorRequirement>>,
    /// Tolerations.
    pub tolerations: Vec<Toleration>,
    /// A GPU model constraint (`nvidia.com/gpu.product` via nodeSelector), if any.
    pub models: Vec<String>,
}

impl Pod {
    /// Its constraints beyond GPUs, CPU, memory and node rules (empty when none).
    pub fn constraints(&self) -> &Constraints {
        static NONE: Constraints = Constraints {
            resources: Vec::new(),
            host_ports: Vec::new(),
            affinity: Vec::new(),
            anti_affinity: Vec::new(),
            spread: Vec::new(),
            unreadable: None,
        };
        self.constraints.as_deref().unwrap_or(&NONE)
    }
    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
    /// Bound and not terminal.
    pub fn is_active_bound(&self) -> bool {
        self.node_name.is_some() && !self.phase.is_terminal()
    }
    /// Waiting for a node, not terminal, not being deleted.
    pub fn is_pending(&self) -> bool {
        self.node_name.is_none() && !self.phase.is_terminal() && !self.deleting
    }
    /// Whether its allocation is unknown.
    pub fn is_unknown(&self) -> bool {
        matches!(self.gpu, GpuUse::Unknown(_))
    }
    /// Total milli it holds (0 when none or unknown).
    pub fn held_milli(&self) -> u64 {
        match &self.gpu {
            GpuUse::Whole(n) => u64::from(*n) * u64::from(GPU_MILLI),
            GpuUse::Devices(d) => d.iter().map(|(_, m)| u64::from(*m)).sum(),
            _ => 0,
        }
    }
}

/// A PodDisruptionBudget, reduced to what the planner needs.
#[derive(Debug, Clone, PartialEq)]
pub struct Pdb {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Label selector (None: matches nothing, as Kubernetes does for a null selector).
    pub selector: Option<LabelSelector>,
    /// `status.disruptionsAllowed`.
    pub disruptions_allowed: i64,
    /// `status.observedGeneration` is behind `metadata.generation` (or absent): the
    /// disruption controller has not caught up with the spec, so the allowance is stale.
    pub stale: bool,
}

impl Pdb {
    /// Whether the PDB covers `pod`: same namespace, and its selector (not null) matches.
    pub fn covers(&self, pod: &Pod) -> bool {
        self.namespace == pod.namespace
            && self
                .selector
                .as_ref()
                .is_some_and(|s| s.matches(&pod.labels))
    }
}

/// A label selector (matchLabels + matchExpressions).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LabelSelector {
    /// Exact labels.
    pub match_labels: BTreeMap<String, String>,
    /// Expressions: (key, operator In/NotIn/Exists/DoesNotExist, values).
    pub match_expressions: Vec<(String, String, Vec<String>)>,
}

impl LabelSelector {
    /// No label and no expression.
    pub fn is_empty(&self) -> bool {
        self.match_labels.is_empty() && self.match_expressions.is_empty()
    }

    /// Whether `labels` satisfy the selector. An empty selector matches everything.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
            && self
                .match_expressions
                .iter()
                .all(|(k, op, vals)| match op.as_str() {
                    "In" => labels.get(k).is_some_and(|v| vals.contains(v)),
                    "NotIn" => labels.get(k).is_none_or(|v| !vals.contains(v)),
                    "Exists" => labels.contains_key(k),
                    "DoesNotExist" => !labels.contains_key(k),
                    _ => false,
                })
    }
}

/// A whole cluster: nodes, pods and PDBs, at one instant.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Cluster {
    /// Nodes (sorted by name).
    pub nodes: Vec<Node>,
    /// Pods (sorted by namespace/name).
    pub pods: Vec<Pod>,
    /// PodDisruptionBudgets.
    pub pdbs: Vec<Pdb>,
    /// The instant the snapshot describes (pod ages are measured from it).
    pub now: Option<DateTime<Utc>>,
    /// Namespaces annotated `gpu-defrag.io/do-not-disrupt`: none of their pods is moved.
    pub protected_namespaces: std::collections::BTreeSet<String>,
    /// What the input did not let the model check (owner chains, namespaces, pod
    /// groups), one sentence each; reports and plans print them.
    pub unchecked: Vec<String>,
    /// A run can fence a single DRA device (`DeviceTaintRule`s are served): only then are
    /// single GPUs of DRA nodes drained by themselves.
    pub dra_device_fences: bool,
}

impl Cluster {
    /// Index of a node by name.
    pub fn node_index(&self, name: &str) -> Option<usize> {
        self.nodes
            .binary_search_by(|n| n.name.as_str().cmp(name))
            .ok()
    }
}

/// How busy one pod's GPUs were over a lookback window, measured outside the core (the
/// operator reads dcgm-exporter series through Prometheus; see docs/observability.md).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodActivity {
    /// The highest activity of any of the pod's GPUs over the window, 0..=1
    /// (`DCGM_FI_PROF_SM_ACTIVE`, or `DCGM_FI_DEV_GPU_UTIL` / 100 for GPUs without it).
    pub peak: f64,
    /// GPUs of the pod the measurement covers (series seen).
    pub gpus: u32,
}

/// GPU activity of pods over one lookback window, supplied by the caller: the core never
/// measures anything. A pod is *idle* when it holds GPUs, has a measurement whose `peak`
/// is under `threshold`, and (when its start time and the model's `now` are known) is
/// at least `lookback` old. Pods without a measurement are never idle: no data is never
/// read as idle.
///
/// The planner reads it through [`Activity::is_idle`] (one pod) or [`Activity::idle_flags`]
/// (a `Vec<bool>` aligned with `Cluster::pods`, for hot loops): long-idle pods are cheaper
/// to move.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Activity {
    /// Measurements by pod key (`namespace/name`).
    pub pods: std::collections::HashMap<String, PodActivity>,
    /// Idle means `peak < threshold` (0..=1; the operator's default is 0.3).
    pub threshold: f64,
    /// Length of the window the peaks were taken over (the operator's default is 4 h).
    pub lookback: std::time::Duration,
}

impl Activity {
    /// The measurement of a pod, if any.
    pub fn of(&self, pod: &Pod) -> Option<&PodActivity> {
        if self.pods.is_empty() {
            return None;
        }
        self.pods.get(&pod.key())
    }

    /// Whether `pod` has been idle for the whole lookback window, measured at `now` (the
    /// model's instant; `None` skips the age check, the measurement vouches for it).
    pub fn is_idle(&self, pod: &Pod, now: Option<DateTime<Utc>>) -> bool {
        if !pod.is_active_bound() || pod.is_unknown() || pod.held_milli() == 0 {
            return false;
        }
        let Some(a) = self.of(pod) else {
            return false;
        };
        let below = a.peak < self.threshold;
        if a.gpus == 0 || !a.peak.is_finite() || !below {
            return false;
        }
        match (now, pod.started) {
            (Some(now), Some(started)) => chrono::Duration::from_std(self.lookback)
                .is_ok_and(|lookback| now.signed_duration_since(started) >= lookback),
            (Some(_), None) => false,
            (None, _) => true,
        }
    }

    /// [`Activity::is_idle`] of every pod of `cluster`, aligned with `cluster.pods` (index
    /// `i` is `cluster.pods[i]`), at `cluster.now`.
    pub fn idle_flags(&self, cluster: &Cluster) -> Vec<bool> {
        cluster
            .pods
            .iter()
            .map(|p| self.is_idle(p, cluster.now))
            .collect()
    }
}

/// Adds `add` to the sorted list `to`, name by name.
pub fn add_resources(to: &mut Vec<(String, u64)>, add: &[(String, u64)]) {
    for (k, v) in add {
        match to.binary_search_by(|(x, _)| x.as_str().cmp(k)) {
            Ok(i) => to[i].1 = to[i].1.saturating_add(*v),
            Err(i) => to.insert(i, (k.clone(), *v)),
        }
    }
}
