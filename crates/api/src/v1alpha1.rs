//! `gpu-defrag.io/v1alpha1`.
use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// Pattern every duration field follows: a sequence of `<number><unit>` with unit
/// `ms`, `s`, `m` or `h` (Go's `time.ParseDuration` without `us`/`ns`), e.g. `90s`, `1h30m`.
pub const DURATION_PATTERN: &str = r"^([0-9]+(ms|s|m|h))+$";

/// A DefragPolicy tells gpu-defrag which GPU nodes and pods it may consider, what GPU
/// shapes the cluster needs to be able to place, when it may evict (maintenance windows)
/// and within which limits. In `DryRun` mode it only measures and plans.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "gpu-defrag.io",
    version = "v1alpha1",
    kind = "DefragPolicy",
    plural = "defragpolicies",
    singular = "defragpolicy",
    shortname = "dfp",
    status = "DefragPolicyStatus",
    derive = "PartialEq",
    printcolumn(
        name = "Mode",
        type_ = "string",
        json_path = ".spec.mode",
        description = "DryRun or Enforce"
    ),
    printcolumn(
        name = "GPU-Nodes",
        type_ = "integer",
        json_path = ".status.fragmentation.nodes"
    ),
    printcolumn(
        name = "Fragment",
        type_ = "number",
        json_path = ".status.fragmentation.fragmentRate",
        description = "Share of idle GPU capacity the target shapes cannot use"
    ),
    printcolumn(
        name = "Free-GPUs",
        type_ = "integer",
        json_path = ".status.fragmentation.fullyFreeGpus",
        description = "GPUs with nothing allocated"
    ),
    printcolumn(
        name = "Planned",
        type_ = "integer",
        json_path = ".status.plan.totalMoves",
        description = "Evictions in the current plan"
    ),
    printcolumn(
        name = "Next-Window",
        type_ = "string",
        json_path = ".status.nextWindow.start",
        description = "Start of the next maintenance window"
    ),
    printcolumn(
        name = "Last-Run",
        type_ = "string",
        json_path = ".status.lastRuns[0].result",
        description = "Outcome of the most recent run"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[x_kube(validation = Rule::new("self.mode == 'DryRun' || size(self.windows) > 0 || (has(self.demand) && has(self.demand.outsideWindows) && self.demand.outsideWindows)").message("mode Enforce needs at least one maintenance window in spec.windows, or demand.outsideWindows: true (demand runs only)"))]
#[serde(rename_all = "camelCase")]
pub struct DefragPolicySpec {
    /// `DryRun` (default) measures fragmentation and publishes the plan it would run, but
    /// never evicts. `Enforce` evicts, only inside a maintenance window and only when the
    /// fragment rate is at or above `trigger.minFragmentRate` (demand runs: see `demand`).
    #[serde(default)]
    pub mode: Mode,

    /// `true` stops the policy's run in progress before its next eviction (fences removed,
    /// outcome `Stopped`) and starts no new one, whatever the mode and windows; the policy
    /// keeps measuring and planning. Default `false`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub suspend: bool,

    /// Nodes this policy covers. Empty or absent: every node with GPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<LabelSelector>,

    /// Namespaces whose pods may be moved. Pods in other namespaces still count for
    /// fragmentation but are never evicted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespaces: Option<NamespaceFilter>,

    /// Only pods matching this selector may be moved. Absent: any GPU pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<LabelSelector>,

    /// The GPU shapes the cluster must be able to place: fragmentation is measured
    /// against them and the planner frees capacity for them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<Target>,

    /// When a run is worth it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<Trigger>,

    /// Maintenance windows. Evictions happen only while one is open. Required (at least
    /// one) in `Enforce` mode, unless `demand.outsideWindows` is true: with no window such
    /// a policy runs demand runs only, never a defragmentation run.
    #[serde(default)]
    #[schemars(length(max = 16))]
    pub windows: Vec<Window>,

    /// Upper bounds on disruption per run.
    #[serde(default)]
    pub limits: Limits,

    /// Pods protected by priority.
    #[serde(default)]
    pub priority: PriorityRules,

    /// Safety rules that decide which pods are movable at all.
    #[serde(default)]
    pub safety: Safety,

    /// Where the replacement of an evicted pod lands: on the node the plan chose for it
    /// (`Nominate`, default) or wherever the scheduler puts it (`Scheduler`).
    #[serde(default)]
    pub landing: Landing,

    /// Demand runs: make room now for a pending GPU pod (or a whole gang) that fits no
    /// node, with the room held for it. Off unless set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub demand: Option<Demand>,
}

/// Demand runs. A pending GPU pod in the policy's scope, placed by one of
/// `safety.binpackSchedulers`, unschedulable for at least `minWait` and fitting no node,
/// starts a demand run in `Enforce` mode: the fewest, cheapest evictions that make room
/// for it on one node and re-place every evicted pod elsewhere, never of a pod of higher
/// priority than its own, under every safety rule and limit. The room is fenced while it
/// drains; then the pod is nominated onto it and the fence lifted. A gang (PodGroup or
/// gang label) is served whole, a node per member, or not at all.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Demand {
    /// How long a pod must have been unschedulable before a demand run serves it.
    /// Default 10m.
    #[serde(default = "default_demand_min_wait")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"), length(max = 32))]
    pub min_wait: String,
    /// Run demand runs outside the maintenance windows too. Default false: only while a
    /// window is open.
    #[serde(default)]
    pub outside_windows: bool,
    /// Most evictions one demand run may make. Default 16.
    #[serde(default = "default_demand_max_evictions")]
    #[schemars(range(min = 1, max = 1000))]
    pub max_evictions: i32,
    /// Most evictions demand runs of this policy may make in any hour. Default 64.
    #[serde(default = "default_demand_per_hour")]
    #[schemars(range(min = 1, max = 100000))]
    pub max_evictions_per_hour: i32,
    /// How long the room is held for the pod once it is free: if the pod has not bound
    /// there by then, the nomination is cleared and the run ends `Stalled`. Default 5m.
    #[serde(default = "default_demand_hold")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"), length(max = 32))]
    pub hold_timeout: String,
}

impl Default for Demand {
    fn default() -> Self {
        Self {
            min_wait: default_demand_min_wait(),
            outside_windows: false,
            max_evictions: default_demand_max_evictions(),
            max_evictions_per_hour: default_demand_per_hour(),
            hold_timeout: default_demand_hold(),
        }
    }
}

fn default_demand_min_wait() -> String {
    "10m".into()
}
fn default_demand_max_evictions() -> i32 {
    16
}
fn default_demand_per_hour() -> i32 {
    64
}
fn default_demand_hold() -> String {
    "5m".into()
}

/// Landing control: the replacement of an evicted pod is held at creation (scheduling gate
/// `gpu-defrag.io/landing`, added by the API server's own MutatingAdmissionPolicy only
/// for the workloads with an eviction in flight), nominated onto the move's planned node
/// (`status.nominatedNodeName`) and released; kube-scheduler tries the nominated node
/// first and schedules the pod normally when it does not fit any more.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Landing {
    /// `Nominate` (default): hold, nominate, release. `Scheduler`: no hold; the scheduler
    /// alone chooses where replacements land (the behaviour before landing control).
    #[serde(default)]
    pub mode: LandingMode,
    /// The longest a replacement is held before it is released un-nominated, whatever
    /// the operator is doing (1s to 5m). Default 30s.
    #[serde(default = "default_hold_timeout")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m))+$"), length(max = 32))]
    pub hold_timeout: String,
}

impl Default for Landing {
    fn default() -> Self {
        Self {
            mode: LandingMode::default(),
            hold_timeout: default_hold_timeout(),
        }
    }
}

fn default_hold_timeout() -> String {
    "30s".into()
}

/// Nominate or Scheduler.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, schemars::JsonSchema,
)]
pub enum LandingMode {
    /// Hold each replacement, nominate its planned node, release it.
    #[default]
    Nominate,
    /// Leave landing to the scheduler.
    Scheduler,
}

/// DryRun or Enforce.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, schemars::JsonSchema,
)]
pub enum Mode {
    /// Measure and plan only; never evict.
    #[default]
    DryRun,
    /// Evict inside maintenance windows when the trigger is met.
    Enforce,
}

/// Namespace include/exclude lists. An empty `include` means all namespaces.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceFilter {
    /// Only these namespaces (empty: all).
    #[serde(default)]
    #[schemars(length(max = 256))]
    pub include: Vec<String>,
    /// Never these namespaces (applied after `include`). Absent: the system namespaces
    /// `kube-system`, `kube-public` and `kube-node-lease` (unless listed in `include`);
    /// `[]` excludes none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub exclude: Option<Vec<String>>,
}

/// Namespaces excluded when `namespaces.exclude` is absent.
pub const SYSTEM_NAMESPACES: &[&str] = &["kube-system", "kube-public", "kube-node-lease"];

/// Target shapes and demand handling.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Target {
    /// Task shapes the freed capacity must fit. Absent or empty: derived from the pods
    /// (the distinct GPU request shapes covering 95% of GPU pods).
    #[serde(default)]
    #[schemars(length(max = 32))]
    pub shapes: Vec<Shape>,
    /// Serve first the pending GPU pods that cannot be placed anywhere today.
    #[serde(default)]
    pub from_pending: bool,
}

/// One task shape: `gpus` GPUs with `milliPerGpu` thousandths of each.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[x_kube(validation = Rule::new("self.gpus <= 1 || self.milliPerGpu == 1000").message("a shape of more than one GPU must use whole GPUs (milliPerGpu 1000)"))]
#[serde(rename_all = "camelCase")]
pub struct Shape {
    /// Number of GPUs (0 means a task asking for no GPU: all idle GPU capacity is a
    /// fragment for it).
    #[schemars(range(min = 0, max = 64))]
    pub gpus: i32,
    /// Thousandths of one GPU per GPU (1000 = a whole GPU). More than one GPU implies 1000.
    #[serde(default = "default_milli")]
    #[schemars(range(min = 1, max = 1000))]
    pub milli_per_gpu: i32,
    /// CPU the task needs on the node (a Kubernetes quantity such as `8` or `500m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<String>,
    /// Memory the task needs on the node (a Kubernetes quantity such as `64Gi`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<String>,
    /// GPU models the task accepts (matched against the node's `nvidia.com/gpu.product`
    /// label). Empty: any model.
    #[serde(default)]
    #[schemars(length(max = 32))]
    pub models: Vec<String>,
    /// Relative weight of this shape in the workload mix (normalised over all shapes).
    #[serde(default = "default_weight")]
    #[x_kube(validation = Rule::new("self > 0.0").message("weight must be greater than 0"))]
    pub weight: f64,
}

fn default_milli() -> i32 {
    1000
}
fn default_weight() -> f64 {
    1.0
}

/// When a run is worth it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Trigger {
    /// Run only when the fragment rate is at least this (0..1).
    #[serde(default = "default_min_rate")]
    #[x_kube(validation = Rule::new("self >= 0.0 && self <= 1.0").message("minFragmentRate must be between 0 and 1"))]
    pub min_fragment_rate: f64,
    /// Start a run only when its plan is expected to free at least this many whole nodes
    /// (every GPU free) among the policy's nodes: an act-only-when-it-pays gate, shown in
    /// the `Executing` condition while it holds a run back. 0 (the default): no gate.
    #[serde(default)]
    #[schemars(range(min = 0, max = 100000))]
    pub min_nodes_freed: i32,
}

impl Default for Trigger {
    fn default() -> Self {
        Self {
            min_fragment_rate: default_min_rate(),
            min_nodes_freed: 0,
        }
    }
}

fn default_min_rate() -> f64 {
    0.1
}

/// An allow window: it opens at every time `schedule` matches and stays open for
/// `duration`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Window {
    /// Cron expression with five fields (minute hour day-of-month month day-of-week),
    /// e.g. `0 2 * * *` for 02:00 every day. Evaluated in `timeZone`.
    #[schemars(length(min = 9, max = 128))]
    #[x_kube(validation = Rule::new("self.split(' ').filter(f, f != '').size() == 5").message("schedule must be a cron expression with 5 fields"))]
    pub schedule: String,
    /// How long the window stays open, e.g. `3h` or `90m`.
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"), length(max = 32))]
    pub duration: String,
    /// IANA time zone the schedule is read in, e.g. `Asia/Shanghai`. Default `UTC`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub time_zone: Option<String>,
}

/// Disruption limits. Every limit holds across the whole run, including across an
/// operator restart.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Limits {
    /// Evictions per run (per window opening).
    #[serde(default = "default_per_run")]
    #[schemars(range(min = 0, max = 100000))]
    pub max_evictions_per_run: i32,
    /// Evictions from one node per run. Default 8 (an 8-GPU node of 1-GPU pods can be
    /// emptied).
    #[serde(default = "default_per_node")]
    #[schemars(range(min = 0, max = 1000))]
    pub max_evictions_per_node: i32,
    /// Evictions in one namespace per run.
    #[serde(default = "default_per_ns")]
    #[schemars(range(min = 0, max = 100000))]
    pub max_evictions_per_namespace: i32,
    /// Evictions whose replacement is not yet Ready, at once.
    #[serde(default = "default_in_flight")]
    #[schemars(range(min = 1, max = 100))]
    pub max_in_flight: i32,
    /// Replicas of one workload (Deployment, StatefulSet, …) that may be unavailable at
    /// once — not Ready, Pending or terminating, whatever the cause — counted from live
    /// state: a workload already at the limit loses no pod, and a run evicts a workload's
    /// next pod only once the replacement of its previous one is Ready. Not a cap on
    /// moves per plan.
    #[serde(default = "default_in_flight")]
    #[schemars(range(min = 1, max = 1000))]
    pub max_unavailable_per_workload: i32,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_evictions_per_run: default_per_run(),
            max_evictions_per_node: default_per_node(),
            max_evictions_per_namespace: default_per_ns(),
            max_in_flight: default_in_flight(),
            max_unavailable_per_workload: default_in_flight(),
        }
    }
}

fn default_per_run() -> i32 {
    10
}
fn default_per_node() -> i32 {
    8
}
fn default_per_ns() -> i32 {
    5
}
fn default_in_flight() -> i32 {
    1
}

/// Priority protection.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct PriorityRules {
    /// Pods with a priority above this are never moved. Absent: no threshold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_priority: Option<i32>,
    /// Priority classes never moved.
    #[serde(default = "default_protected")]
    #[schemars(length(max = 64))]
    pub protected_classes: Vec<String>,
}

impl Default for PriorityRules {
    fn default() -> Self {
        Self {
            max_priority: None,
            protected_classes: default_protected(),
        }
    }
}

fn default_protected() -> Vec<String> {
    vec![
        "system-cluster-critical".into(),
        "system-node-critical".into(),
    ]
}

/// Which pods are movable at all, and how long to wait for their replacements.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Safety {
    /// Pods younger than this are not moved (slow-starting ML pods need time to settle).
    #[serde(default = "default_min_age")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"), length(max = 32))]
    pub min_pod_age: String,
    /// Nodes that became Ready less recently than this receive no planned pod (a new
    /// node's GPU stack and device plugin may still be settling). Measured from the
    /// node's Ready condition's `lastTransitionTime`, else its creation time.
    #[serde(default = "default_min_node_age")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"), length(max = 32))]
    pub min_node_age: String,
    /// Allow evicting pods owned by a Job (or a CronJob's Job). An evicted Job pod is
    /// not moved, it is killed: the Job controller starts a new pod from scratch (all
    /// progress not checkpointed is lost), and the eviction counts against the Job's
    /// `backoffLimit` unless its `podFailurePolicy` ignores disruptions — a Job with
    /// `backoffLimit: 0` fails for good.
    #[serde(default)]
    pub evict_job_pods: bool,
    /// Allow evicting pods with disk-backed `emptyDir` or `hostPath` volumes (their data
    /// is lost). A memory-backed `emptyDir` (`medium: Memory`, the usual `/dev/shm`) is
    /// not local storage.
    #[serde(default)]
    pub evict_local_storage: bool,
    /// Allow evicting pods that mount a PersistentVolumeClaim (the replacement must be
    /// able to attach the same volume on its new node: zonal and ReadWriteOnce volumes
    /// often cannot).
    #[serde(default)]
    pub evict_pvc_pods: bool,
    /// Allow evicting pods with a generic ephemeral volume (its PVC is deleted with the
    /// pod and its data lost).
    #[serde(default)]
    pub evict_ephemeral_volume_pods: bool,
    /// Allow evicting the last Ready replica of a workload (a single-replica Deployment,
    /// say) even when no PodDisruptionBudget allows it. Without it, such a pod moves only
    /// when a PDB covering it allows a disruption: its owner said so.
    #[serde(default)]
    pub evict_single_replicas: bool,
    /// Controllers, besides Deployments, ReplicaSets and StatefulSets (and Jobs with
    /// `evictJobPods`), whose pods may be moved, as `group/Kind` (`Kind` alone for the
    /// core group), e.g. `example.com/InferenceServer`. Gangs are never moved, listed or
    /// not.
    #[serde(default)]
    #[schemars(
        length(max = 32),
        inner(
            regex(pattern = r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z][A-Za-z0-9]*$"),
            length(max = 253)
        )
    )]
    pub movable_owner_kinds: Vec<String>,
    /// Schedulers (`spec.schedulerName`) that bin-pack GPUs the way gpu-defrag's planner
    /// emulates (NodeResourcesFit MostAllocated on the GPU resources, as the `gpu-binpack`
    /// scheduler of `config/scheduler` does). A pod placed by any other scheduler is never
    /// moved (skip `scheduler-not-binpacking`): where its replacement would land cannot be
    /// predicted, and a spreading scheduler would put it on an empty node. Add
    /// `default-scheduler` only when the default profile itself was set to bin-pack GPUs.
    #[serde(default = "default_binpack_schedulers")]
    #[schemars(
        length(max = 16),
        inner(
            regex(pattern = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"),
            length(max = 253)
        )
    )]
    pub binpack_schedulers: Vec<String>,
    /// How long to wait for an evicted pod's replacement to be Ready before the run stops
    /// as stalled.
    #[serde(default = "default_reschedule")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"), length(max = 32))]
    pub reschedule_timeout: String,
    /// Stop the run when more GPU pods than this, created since the run started, are
    /// Pending in the policy's scope beyond the replacements in flight: what the run left
    /// unschedulable (the queue it came to serve does not count). Default 5.
    #[serde(default = "default_max_pending")]
    #[schemars(range(min = 0, max = 100000))]
    pub max_pending_gpu_pods: i32,
}

impl Default for Safety {
    fn default() -> Self {
        Self {
            min_pod_age: default_min_age(),
            min_node_age: default_min_node_age(),
            evict_job_pods: false,
            evict_local_storage: false,
            evict_pvc_pods: false,
            evict_ephemeral_volume_pods: false,
            evict_single_replicas: false,
            movable_owner_kinds: Vec::new(),
            binpack_schedulers: default_binpack_schedulers(),
            reschedule_timeout: default_reschedule(),
            max_pending_gpu_pods: default_max_pending(),
        }
    }
}

/// The scheduler name of `config/scheduler` (the `gpu-binpack` second scheduler).
pub const BINPACK_SCHEDULER: &str = "gpu-binpack";

fn default_binpack_schedulers() -> Vec<String> {
    vec![BINPACK_SCHEDULER.to_string()]
}

fn default_min_age() -> String {
    "10m".into()
}
fn default_min_node_age() -> String {
    "5m".into()
}
fn default_reschedule() -> String {
    "10m".into()
}
fn default_max_pending() -> i32 {
    5
}

// ---------------------------------------------------------------- status

/// What gpu-defrag observed, planned and did for this policy.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DefragPolicyStatus {
    /// `Ready`, `InWindow`, `Executing`, `Degraded`, `Conflict`.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// The `metadata.generation` this status was computed for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Fragmentation of the covered nodes, last measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fragmentation: Option<FragmentationSummary>,
    /// The plan a run would execute now (bounded: the first moves plus totals).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<PlanSummary>,
    /// The next (or current) maintenance window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_window: Option<WindowTimes>,
    /// The run in progress, recorded before its first eviction so a restart can resume
    /// or clean it up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_run: Option<RunRecord>,
    /// The most recent runs, newest first (at most 5).
    #[serde(default)]
    pub last_runs: Vec<RunRecord>,
    /// Pods not considered movable, counted by reason.
    #[serde(default)]
    pub skipped: BTreeMap<String, i64>,
    /// Allocated-but-idle GPUs of the covered nodes, from dcgm-exporter series (only with
    /// the operator's `--prometheus-url`; absent while Prometheus gives no usable answer,
    /// see the `IdleData` condition).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_allocated: Option<IdleAllocatedSummary>,
    /// Demand runs: who waits now, and the pods served recently (only with `demand`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub demand: Option<DemandStatus>,
}

/// What demand runs see and did.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DemandStatus {
    /// Pending GPU pods (or gangs) a demand run would serve now: waited `minWait`, fit no
    /// node.
    #[serde(default)]
    pub waiting: i64,
    /// Evictions of demand runs in the last hour (against `maxEvictionsPerHour`).
    #[serde(default)]
    pub evictions_last_hour: i64,
    /// The latest demand decisions, newest first (at most 5).
    #[serde(default)]
    pub recent: Vec<DemandRecord>,
}

/// One demand decision: a run that served (or failed to serve) pods, or a search that
/// found no room.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DemandRecord {
    /// `namespace/name` of the pods served (a gang's members; the first 4).
    pub pods: Vec<String>,
    /// The nodes made room on, one per pod (the first 4).
    #[serde(default)]
    pub nodes: Vec<String>,
    /// How long the first pod had been unschedulable when the run started, seconds.
    #[serde(default)]
    pub waited_seconds: i64,
    /// Evictions spent.
    #[serde(default)]
    pub evictions: i64,
    /// `Running`, `Served` (every pod bound on its room), `NoRoom` (no room can be made
    /// within the rules and limits), `BudgetSpent` (the search ran out of steps, or the
    /// hourly allowance is spent), `Stalled` (a pod did not bind on its room within
    /// `holdTimeout`, or the run ended otherwise; the message says).
    pub result: String,
    /// Why.
    #[serde(default)]
    pub message: String,
    /// When (RFC 3339).
    pub at: String,
    /// The demand run's id (absent for a search that planned nothing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
}

/// A status condition (same shape as `metav1.Condition`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// Condition type: `Ready`, `InWindow`, `Executing`, `Degraded`, `Conflict`,
    /// `IdleData` (with `--prometheus-url`).
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// PascalCase reason for the last transition. Every condition: `InvalidSpec`,
    /// `InvalidWindow` while the policy is invalid. `Ready`: `Reconciled`. `InWindow`: `WindowOpen`, `WindowClosed`, `NoWindow`. `Executing`:
    /// `RunInProgress`, `NotExecuting`. `Degraded`: `NoGpuNodes`, `PlanPartlyBlocked`,
    /// `AsExpected`.
    /// `Conflict`: `OverlappingPolicy`, `NoOverlap`. `IdleData`: `NotQueriedYet`,
    /// `Measured`, `NoSeries`, `PrometheusUnreachable`, `PrometheusTimeout`,
    /// `PrometheusError`, `MalformedResponse`, `CredentialsUnreadable`.
    pub reason: String,
    /// Human readable message.
    #[serde(default)]
    pub message: String,
    /// When the status last changed (RFC 3339).
    pub last_transition_time: String,
    /// Generation the condition was computed for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// Fragmentation summary (see docs/fragmentation.md for the exact metric).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FragmentationSummary {
    /// fragmentMilli / idleMilli (0..1).
    pub fragment_rate: f64,
    /// Idle GPU capacity the target shapes cannot use, in milli-GPU.
    pub fragment_milli: i64,
    /// All idle GPU capacity on counted nodes, in milli-GPU.
    pub idle_milli: i64,
    /// GPUs on counted nodes.
    pub gpus: i64,
    /// GPUs with nothing allocated.
    pub fully_free_gpus: i64,
    /// Nodes with every GPU free.
    pub fully_free_nodes: i64,
    /// Idle capacity on partly used GPUs, in milli-GPU.
    pub stranded_milli: i64,
    /// Pods whose GPU allocation could not be read (never moved).
    pub unknown_pods: i64,
    /// Pending GPU pods that fit no node today.
    pub pending_unplaceable: i64,
    /// Nodes counted.
    pub nodes: i64,
    /// When it was measured (RFC 3339).
    pub observed_at: String,
}

/// Allocated-but-idle GPUs: pods holding GPUs whose activity (`DCGM_FI_PROF_SM_ACTIVE`, or
/// `DCGM_FI_DEV_GPU_UTIL` / 100 where a GPU has no SM activity series) stayed under
/// `threshold` over the whole `lookback` window.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IdleAllocatedSummary {
    /// Idle pods.
    pub pods: i64,
    /// GPUs allocated only to idle pods.
    pub gpus: i64,
    /// Milli-GPUs held by idle pods.
    pub milli: i64,
    /// Bound pods holding GPUs on the covered nodes.
    pub gpu_pods: i64,
    /// Of those, the pods with DCGM series (the others have no data and are never idle).
    pub measured_pods: i64,
    /// The idle threshold (activity 0..1).
    pub threshold: f64,
    /// The window, e.g. `4h`.
    pub lookback: String,
    /// The idle pods holding the most milli (at most 20; `pods` counts them all).
    #[serde(default)]
    pub idle_pods: Vec<IdleAllocatedPod>,
    /// When Prometheus was read (RFC 3339).
    pub observed_at: String,
}

/// One allocated-but-idle pod.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IdleAllocatedPod {
    /// `namespace/name`.
    pub pod: String,
    /// Node.
    pub node: String,
    /// GPUs it holds.
    pub gpus: i64,
    /// Milli-GPUs it holds.
    pub milli: i64,
    /// Its highest GPU activity over the window (0..1).
    pub peak_activity: f64,
}

/// The plan, bounded for status.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlanSummary {
    /// Evictions in the whole plan.
    pub total_moves: i64,
    /// Batches in the whole plan.
    pub batches: i64,
    /// Fragment rate expected after the whole plan.
    pub expected_fragment_rate: f64,
    /// GPUs expected fully free after the whole plan.
    pub expected_fully_free_gpus: i64,
    /// Nodes expected with every GPU free after the whole plan (what
    /// `trigger.minNodesFreed` is held against).
    #[serde(default)]
    pub expected_fully_free_nodes: i64,
    /// The first moves (at most 50).
    #[serde(default)]
    pub moves: Vec<PlannedMove>,
    /// Result of the server-side dry-run of the planned evictions, when checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dry_run_check: Option<DryRunCheck>,
    /// When the plan was computed (RFC 3339).
    pub computed_at: String,
}

/// One planned move.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlannedMove {
    /// `namespace/name` of the pod.
    pub pod: String,
    /// Node it runs on.
    pub from_node: String,
    /// Devices it holds there (empty for node-granularity GPUs).
    #[serde(default)]
    pub from_devices: Vec<String>,
    /// Node the bin-packing scheduler is expected to pick.
    pub to_node: String,
    /// Devices expected there.
    #[serde(default)]
    pub to_devices: Vec<String>,
    /// Batch index (0-based).
    pub batch: i64,
    /// Why this move is in the plan.
    pub reason: String,
}

/// Server-side (`dryRun=All`) check of the planned evictions.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DryRunCheck {
    /// Evictions the API server would accept.
    pub allowed: i64,
    /// Evictions refused (a PodDisruptionBudget, usually).
    pub blocked: i64,
    /// Other errors.
    pub failed: i64,
    /// `namespace/name: reason` of the first refusals.
    #[serde(default)]
    pub blocked_pods: Vec<String>,
}

/// Start and end of a maintenance window.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WindowTimes {
    /// Opening time (RFC 3339, with the window's UTC offset).
    pub start: String,
    /// Closing time (RFC 3339).
    pub end: String,
    /// Whether the window is open now.
    #[serde(default)]
    pub open: bool,
}

/// One GPU fenced by itself.
#[derive(
    Serialize,
    Deserialize,
    Clone,
    Debug,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Default,
    schemars::JsonSchema,
)]
pub struct FencedDevice {
    /// Node of the GPU.
    pub node: String,
    /// The GPU: a HAMi GPU's UUID (fenced in `hami.io/device-cordon`), or a DRA device's
    /// name in its pool (fenced by a `DeviceTaintRule`).
    pub gpu: String,
    /// A DRA device's driver (`gpu.nvidia.com`); absent for a HAMi GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
    /// A DRA device's pool (the node's name for the NVIDIA driver); absent for a HAMi GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
}

impl FencedDevice {
    /// A DRA device's `(driver, pool)`: its fence is a `DeviceTaintRule`.
    pub fn dra(&self) -> Option<(&str, &str)> {
        Some((self.driver.as_deref()?, self.pool.as_deref()?))
    }
}

/// An eviction whose replacement is not Ready yet.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, schemars::JsonSchema)]
pub struct InFlightEviction {
    /// `namespace/name` of the evicted pod.
    pub pod: String,
    /// Its UID.
    pub uid: String,
    /// `Kind/name` of its controller (the replacement's owner).
    pub owner: String,
}

/// A run: one execution of the plan inside one window.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunRecord {
    /// Unique id of the run.
    pub id: String,
    /// When it started (RFC 3339).
    pub started_at: String,
    /// When it finished (RFC 3339); empty while running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    /// End of the window it runs in (RFC 3339).
    #[serde(default)]
    pub window_end: String,
    /// `Running` while it lasts, then how it ended: `Succeeded` (every planned move
    /// done), `Partial` (some moves blocked, failed or bounced), `Stalled` (a replacement
    /// was not Ready in time), `Stopped` (a safety guard), `WindowClosed`,
    /// `BenefitNotRealized` (every move done, but the fragment rate, measured without the
    /// GPU pods pending at the start, fell by less than half the forecast drop), `Aborted`.
    pub result: String,
    /// Why it ended that way.
    #[serde(default)]
    pub message: String,
    /// Nodes fenced (tainted) by the run.
    #[serde(default)]
    pub fenced_nodes: Vec<String>,
    /// Single GPUs fenced by the run (on HAMi nodes: listed in the node's
    /// `hami.io/device-cordon` annotation while the run lasts).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fenced_devices: Vec<FencedDevice>,
    /// Evictions planned at the start.
    pub planned: i64,
    /// Evictions the API server accepted (counted against the limits).
    pub evicted: i64,
    /// Evictions refused with 429 (PDB).
    pub blocked: i64,
    /// Replacements that landed back on a fenced unit.
    pub bounced: i64,
    /// Replacements that landed on the node the plan chose for them.
    #[serde(default)]
    pub landed_as_planned: i64,
    /// Replacements that landed on another node (nomination refused or not made, the
    /// target taken meanwhile, or landing left to the scheduler).
    #[serde(default)]
    pub landed_elsewhere: i64,
    /// Evictions that failed otherwise.
    pub failed: i64,
    /// Planned evictions not sent: the pod was no longer safe to move when its turn came
    /// (re-checked before each eviction), or another eviction of its drain unit was
    /// refused (a unit is drained whole or not at all).
    #[serde(default)]
    pub skipped: i64,
    /// Evictions whose replacement is not Ready yet: a run resumed after a restart waits
    /// for them before it evicts anything else.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub in_flight: Vec<InFlightEviction>,
    /// `namespace/name` of every pod evicted so far, so a restart never repeats one (the
    /// active run's record stays under 48 KiB; a finished run keeps the first 20).
    #[serde(default)]
    pub evicted_pods: Vec<String>,
    /// Evictions so far per source node (limits hold across a restart).
    #[serde(default)]
    pub evicted_per_node: BTreeMap<String, i64>,
    /// Fragment rate at the start.
    pub fragment_rate_before: f64,
    /// Fragment rate the plan forecast for the end of the run (absent in records of older
    /// versions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_fragment_rate_after: Option<f64>,
    /// Fragment rate at the end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fragment_rate_after: Option<f64>,
    /// Fully free GPUs at the start.
    #[serde(default)]
    pub fully_free_gpus_before: i64,
    /// Fully free GPUs at the end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fully_free_gpus_after: Option<i64>,
    /// A demand run: the pods it serves and their rooms (absent for window runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub demand: Option<DemandRun>,
}

/// The pods a demand run serves.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DemandRun {
    /// `namespace/name` of each served pod.
    pub pods: Vec<String>,
    /// UID of each served pod (a pod re-created under the same name is not the one served).
    #[serde(default)]
    pub uids: Vec<String>,
    /// The room of each served pod.
    pub nodes: Vec<String>,
    /// How long the first pod had been unschedulable when the run started, seconds.
    #[serde(default)]
    pub waited_seconds: i64,
    /// How each served pod fared: `Binding` until it binds on its room, then `Served`.
    #[serde(default)]
    pub served: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_fill_an_empty_spec() {
        let spec: DefragPolicySpec = serde_json::from_str("{}").unwrap();
        assert_eq!(spec.mode, Mode::DryRun);
        assert_eq!(spec.limits.max_evictions_per_run, 10);
        assert_eq!(spec.safety.min_pod_age, "10m");
        assert!(
            spec.priority
                .protected_classes
                .contains(&"system-node-critical".to_string())
        );
    }

    #[test]
    fn sample_from_the_design_parses() {
        let yaml = r#"
mode: Enforce
nodeSelector: {matchLabels: {nvidia.com/gpu.present: "true"}}
namespaces: {exclude: [kube-system]}
target: {shapes: [{gpus: 8, weight: 1}, {gpus: 1, milliPerGpu: 500, weight: 3}]}
trigger: {minFragmentRate: 0.2}
windows: [{schedule: "0 2 * * *", duration: 3h, timeZone: Asia/Shanghai}]
limits: {maxEvictionsPerRun: 20, maxEvictionsPerNode: 4, maxEvictionsPerNamespace: 5, maxInFlight: 2, maxUnavailablePerWorkload: 1}
priority: {maxPriority: 1000, protectedClasses: [system-cluster-critical]}
safety: {minPodAge: 10m, evictJobPods: false, evictLocalStorage: false, rescheduleTimeout: 10m}
"#;
        let spec: DefragPolicySpec = serde_norway::from_str(yaml).unwrap();
        assert_eq!(spec.mode, Mode::Enforce);
        let shapes = &spec.target.as_ref().unwrap().shapes;
        assert_eq!(shapes[0].milli_per_gpu, 1000);
        assert_eq!(shapes[1].milli_per_gpu, 500);
        assert_eq!(spec.windows[0].time_zone.as_deref(), Some("Asia/Shanghai"));
    }

    #[test]
    fn schema_carries_the_cel_rules() {
        use kube::CustomResourceExt;
        let crd = serde_json::to_string(&DefragPolicy::crd()).unwrap();
        for needle in [
            "mode Enforce needs at least one maintenance window",
            "weight must be greater than 0",
            "minFragmentRate must be between 0 and 1",
            "a shape of more than one GPU must use whole GPUs",
            "schedule must be a cron expression with 5 fields",
        ] {
            assert!(crd.contains(needle), "missing rule: {needle}");
        }
    }
}
