//! Prometheus metrics of the operator (`gpu_defrag_*`, OpenMetrics text).
//!
//! ```text
//!   [reconcile] --set_report/set_plan/set_window--> [Metrics] --encode--> GET /metrics
//!   [executor]  --eviction/run_finished------------^
//!   [lease]     --set_leader-----------------------^
//! ```
//!
//! Labels are low-cardinality only: the policy name, and fixed words for `result`, `reason`
//! and `kind`. Never a pod name. Counters are exposed with a `_total` suffix and durations as
//! `_seconds` histograms.
//!
//! One family is opt-in because it grows with the cluster: `gpu_defrag_gpu_used_milli{node,
//! gpu}` (one series per GPU, `--metrics-per-gpu`), for per-node/per-GPU heatmaps. It is
//! refilled from the cluster model every reconcile; GPUs and nodes that vanished lose their
//! series.
//!
//! Only the leader computes anything, so a replica that is not the leader drops its gauges
//! of cluster state (fragmentation, plan, window, trigger, per-GPU use): what a standby would
//! otherwise export is the stale picture of its last term. Counters and histograms stay.
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

use gpu_defrag_core::model::{Milli, Node};

/// Defines a label vocabulary: an enum with `as_str()` (the label value) and `ALL`.
macro_rules! label_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident = $value:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vmeta])* $variant),+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The label value.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $value),+
                }
            }
        }
    };
}

label_enum! {
    /// The `result` values of `gpu_defrag_evictions_total`: the executor's outcomes, then
    /// the server-side dry-run checks of planned evictions. Each policy exports all of them
    /// from its first reconcile on (at 0), so `increase()` sees the first event too.
    Eviction {
        /// Accepted by the API server.
        Done = "done",
        /// Refused with 429 (a PodDisruptionBudget).
        Blocked = "blocked",
        /// The replacement landed on one of the run's fences.
        Bounced = "bounced",
        /// Refused otherwise, unanswered, or never taken effect.
        Failed = "failed",
        /// A dry-run eviction the API server would allow.
        DryRunAllowed = "dry_run_allowed",
        /// A dry-run eviction the API server would refuse.
        DryRunBlocked = "dry_run_blocked",
    }
}

label_enum! {
    /// The `result` values of `gpu_defrag_landings_total`.
    Landed {
        /// On the node its move planned.
        Planned = "planned",
        /// On another node.
        Elsewhere = "elsewhere",
    }
}

label_enum! {
    /// The `action` values of `gpu_defrag_landing_actions_total`.
    LandingAction {
        /// A held replacement nominated onto its planned node and released.
        Nominated = "nominated",
        /// A nomination that could not be written.
        NominateFailed = "nominate_failed",
        /// A pending pod nominated onto the room a run made for it.
        PendingNominated = "pending_nominated",
        /// Released by the first pass after start.
        Swept = "swept",
        /// Released after the hold timeout.
        TimedOut = "timed_out",
        /// Released without a nomination (not expected by the leader).
        Released = "released",
        /// A release that could not be written.
        ReleaseFailed = "release_failed",
    }
}

/// The fragmentation numbers of one policy's report, as exported.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReportNumbers {
    /// Fragment rate, 0..=1.
    pub fragment_rate: f64,
    /// Free GPU capacity in milli-GPUs.
    pub idle_milli: u64,
    /// Free capacity that no target shape can use, in milli-GPUs.
    pub fragment_milli: u64,
    /// GPUs with nothing allocated.
    pub fully_free_gpus: u64,
    /// Nodes whose GPUs are all free.
    pub fully_free_nodes: u64,
    /// Pods whose GPU placement could not be determined.
    pub unknown_pods: u64,
    /// Pending GPU pods that fit nowhere.
    pub pending_unplaceable: u64,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PolicyLabel {
    policy: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    policy: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MigLabels {
    policy: String,
    profile: String,
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    policy: String,
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    policy: String,
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
struct GpuLabels {
    /// Node name.
    node: String,
    /// Device index on the node (0-based, in the order of the node's GPUs).
    gpu: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VersionLabel {
    version: String,
}

type GaugeF64 = Gauge<f64, AtomicU64>;
type HistogramFamily<S> = Family<S, Histogram, fn() -> Histogram>;

/// Second-label values seen per policy, so [`Metrics::forget_policy`] can remove every series
/// of a policy (a `Family` cannot be enumerated).
#[derive(Default)]
struct Seen {
    skipped: BTreeSet<String>,
    mig: BTreeSet<String>,
    evictions: BTreeSet<String>,
    runs: BTreeSet<String>,
    errors: BTreeSet<String>,
    landings: BTreeSet<String>,
    demand: BTreeSet<String>,
}

struct Inner {
    registry: Registry,
    fragment_rate: Family<PolicyLabel, GaugeF64>,
    min_fragment_rate: Family<PolicyLabel, GaugeF64>,
    idle_milli: Family<PolicyLabel, Gauge>,
    fragment_milli: Family<PolicyLabel, Gauge>,
    fully_free_gpus: Family<PolicyLabel, Gauge>,
    fully_free_nodes: Family<PolicyLabel, Gauge>,
    unknown_pods: Family<PolicyLabel, Gauge>,
    pending_unplaceable: Family<PolicyLabel, Gauge>,
    plan_moves: Family<PolicyLabel, Gauge>,
    skipped_pods: Family<ReasonLabels, Gauge>,
    mig_partitions: Family<MigLabels, Gauge>,
    window_open: Family<PolicyLabel, Gauge>,
    evictions: Family<ResultLabels, Counter>,
    run_duration: HistogramFamily<PolicyLabel>,
    runs: Family<ResultLabels, Counter>,
    reconcile_errors: Family<KindLabels, Counter>,
    reconcile_duration: Histogram,
    is_leader: Gauge,
    idle_alloc_pods: Family<PolicyLabel, Gauge>,
    idle_alloc_gpus: Family<PolicyLabel, Gauge>,
    idle_alloc_milli: Family<PolicyLabel, Gauge>,
    idle_query_errors: Family<KindLabel, Counter>,
    landings: Family<ResultLabels, Counter>,
    landing_actions: Family<KindLabel, Counter>,
    landing_stuck: Gauge,
    demand_waiting: Family<PolicyLabel, Gauge>,
    demand_runs: Family<ResultLabels, Counter>,
    demand_wait: HistogramFamily<PolicyLabel>,
    demand_evictions: Family<PolicyLabel, Counter>,
    seen: Mutex<BTreeMap<String, Seen>>,
    /// `None` unless per-GPU series are enabled.
    gpu_used: Option<Family<GpuLabels, Gauge>>,
    /// The per-GPU series exported now (also serialises refills).
    gpus_seen: Mutex<BTreeSet<GpuLabels>>,
}

/// The operator's metrics and their registry. Cheap to clone; all clones share the series.
#[derive(Clone)]
pub struct Metrics(Arc<Inner>);

fn run_histogram() -> Histogram {
    // 1s .. ~4.5h: a run waits for replacements to become Ready.
    Histogram::new(exponential_buckets(1.0, 2.0, 15))
}

fn wait_histogram() -> Histogram {
    // 1s .. ~9h: how long a pod waited for its room.
    Histogram::new(exponential_buckets(1.0, 2.0, 16))
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn policy(p: &str) -> PolicyLabel {
    PolicyLabel {
        policy: p.to_string(),
    }
}

impl Inner {
    /// Every family, empty and not yet registered (the per-GPU one only when `per_gpu`).
    fn unregistered(per_gpu: bool) -> Self {
        Inner {
            registry: Registry::default(),
            fragment_rate: Family::default(),
            min_fragment_rate: Family::default(),
            idle_milli: Family::default(),
            fragment_milli: Family::default(),
            fully_free_gpus: Family::default(),
            fully_free_nodes: Family::default(),
            unknown_pods: Family::default(),
            pending_unplaceable: Family::default(),
            plan_moves: Family::default(),
            skipped_pods: Family::default(),
            mig_partitions: Family::default(),
            window_open: Family::default(),
            evictions: Family::default(),
            run_duration: Family::new_with_constructor(run_histogram as fn() -> Histogram),
            runs: Family::default(),
            reconcile_errors: Family::default(),
            // 5ms .. ~10s.
            reconcile_duration: Histogram::new(exponential_buckets(0.005, 2.0, 12)),
            is_leader: Gauge::default(),
            idle_alloc_pods: Family::default(),
            idle_alloc_gpus: Family::default(),
            idle_alloc_milli: Family::default(),
            idle_query_errors: Family::default(),
            landings: Family::default(),
            landing_actions: Family::default(),
            landing_stuck: Gauge::default(),
            demand_waiting: Family::default(),
            demand_runs: Family::default(),
            demand_wait: Family::new_with_constructor(wait_histogram as fn() -> Histogram),
            demand_evictions: Family::default(),
            seen: Mutex::default(),
            gpu_used: per_gpu.then(Family::default),
            gpus_seen: Mutex::default(),
        }
    }
}

/// Registers the gauges of cluster state: fragmentation, plan, skipped pods, MIG
/// partitions and the window.
fn register_cluster_gauges(r: &mut Registry, inner: &Inner) {
    r.register(
        "fragment_rate",
        "Fragment rate of the policy's GPUs (0..1)",
        inner.fragment_rate.clone(),
    );
    r.register(
        "policy_min_fragment_rate",
        "The policy's trigger: runs start only at or above this fragment rate (0..1)",
        inner.min_fragment_rate.clone(),
    );
    r.register(
        "idle_milli",
        "Free GPU capacity in milli-GPUs",
        inner.idle_milli.clone(),
    );
    r.register(
        "fragment_milli",
        "Free GPU capacity no target shape can use, in milli-GPUs",
        inner.fragment_milli.clone(),
    );
    r.register(
        "fully_free_gpus",
        "GPUs with nothing allocated",
        inner.fully_free_gpus.clone(),
    );
    r.register(
        "fully_free_nodes",
        "Nodes whose GPUs are all free",
        inner.fully_free_nodes.clone(),
    );
    r.register(
        "unknown_pods",
        "GPU pods whose placement could not be determined",
        inner.unknown_pods.clone(),
    );
    r.register(
        "pending_unplaceable_pods",
        "Pending GPU pods that fit on no node",
        inner.pending_unplaceable.clone(),
    );
    r.register(
        "plan_moves",
        "Moves in the current plan",
        inner.plan_moves.clone(),
    );
    r.register(
        "skipped_pods",
        "Pods the planner may not move, by reason",
        inner.skipped_pods.clone(),
    );
    r.register(
        "mig_partitions",
        "MIG partitions of the policy's nodes by profile: used, and free (how many more fit now)",
        inner.mig_partitions.clone(),
    );
    r.register(
        "window_open",
        "1 while the policy's maintenance window is open",
        inner.window_open.clone(),
    );
}

/// Registers the executor's and the reconciler's counters and histograms, and the
/// leader gauge.
fn register_run_metrics(r: &mut Registry, inner: &Inner) {
    r.register(
        "evictions",
        "Eviction attempts by result",
        inner.evictions.clone(),
    );
    r.register_with_unit(
        "run_duration",
        "Duration of executor runs",
        Unit::Seconds,
        inner.run_duration.clone(),
    );
    r.register("runs", "Executor runs by result", inner.runs.clone());
    r.register(
        "reconcile_errors",
        "Reconcile errors by kind",
        inner.reconcile_errors.clone(),
    );
    r.register_with_unit(
        "reconcile_duration",
        "Duration of policy reconciles",
        Unit::Seconds,
        inner.reconcile_duration.clone(),
    );
    r.register(
        "is_leader",
        "1 while this replica holds the leader lease",
        inner.is_leader.clone(),
    );
}

/// Registers the idle-GPU and landing-control families.
fn register_idle_and_landing(r: &mut Registry, inner: &Inner) {
    r.register(
        "idle_allocated_pods",
        "Pods holding GPUs whose activity stayed under the idle threshold over the lookback window (needs --prometheus-url)",
        inner.idle_alloc_pods.clone(),
    );
    r.register(
        "idle_allocated_gpus",
        "GPUs allocated only to idle pods (needs --prometheus-url)",
        inner.idle_alloc_gpus.clone(),
    );
    r.register(
        "idle_allocated_milli",
        "Milli-GPUs held by idle pods (needs --prometheus-url)",
        inner.idle_alloc_milli.clone(),
    );
    r.register(
        "idle_query_errors",
        "Failed Prometheus queries for GPU activity, by kind",
        inner.idle_query_errors.clone(),
    );
    r.register(
        "landings",
        "Replacements of evicted pods by where they landed: planned (the move's target node) or elsewhere",
        inner.landings.clone(),
    );
    r.register(
        "landing_actions",
        "Landing control on held replacements, by kind: nominated, released (no nomination), swept (at start-up), pending_nominated (a pending pod onto the node a run emptied), timed_out, release_failed, nominate_failed",
        inner.landing_actions.clone(),
    );
    r.register(
        "landing_stuck_pods",
        "Pods still held by the landing gate past their hold timeout (the gate could not be removed)",
        inner.landing_stuck.clone(),
    );
}

/// Registers the demand-run families.
fn register_demand(r: &mut Registry, inner: &Inner) {
    r.register(
        "demand_waiting",
        "Pending GPU pods (gangs counted once) a demand run would serve now: waited demand.minWait, fit no node",
        inner.demand_waiting.clone(),
    );
    r.register(
        "demand_runs",
        "Demand runs and searches by result (Served, Stalled, NoRoom, BudgetSpent)",
        inner.demand_runs.clone(),
    );
    r.register_with_unit(
        "demand_wait",
        "How long each pod a demand run served had been unschedulable when it bound",
        Unit::Seconds,
        inner.demand_wait.clone(),
    );
    r.register(
        "demand_evictions",
        "Evictions spent by demand runs",
        inner.demand_evictions.clone(),
    );
}

impl Metrics {
    /// Creates every family and registers it, plus `gpu_defrag_build_info{version}`; no
    /// per-GPU family.
    pub fn new() -> Self {
        Self::with_per_gpu(false)
    }

    /// Like [`Metrics::new`], plus `gpu_defrag_gpu_used_milli{node,gpu}` when `per_gpu`.
    pub fn with_per_gpu(per_gpu: bool) -> Self {
        let mut registry = Registry::with_prefix("gpu_defrag");
        let mut inner = Inner::unregistered(per_gpu);
        let r = &mut registry;
        register_cluster_gauges(r, &inner);
        register_run_metrics(r, &inner);
        register_idle_and_landing(r, &inner);
        register_demand(r, &inner);
        if let Some(f) = &inner.gpu_used {
            r.register(
                "gpu_used_milli",
                "Allocated milli-GPUs per GPU (0..1000), by node and device index",
                f.clone(),
            );
        }
        let build_info = Family::<VersionLabel, Gauge>::default();
        build_info
            .get_or_create(&VersionLabel {
                version: env!("CARGO_PKG_VERSION").to_string(),
            })
            .set(1);
        r.register("build_info", "Operator version (value 1)", build_info);
        crate::apiclient::stats().register(r);
        inner.registry = registry;
        Self(Arc::new(inner))
    }

    /// Exports a policy's fragmentation report.
    pub fn set_report(&self, policy_name: &str, r: &ReportNumbers) {
        let m = &self.0;
        let l = policy(policy_name);
        m.fragment_rate.get_or_create(&l).set(r.fragment_rate);
        m.idle_milli.get_or_create(&l).set(to_i64(r.idle_milli));
        m.fragment_milli
            .get_or_create(&l)
            .set(to_i64(r.fragment_milli));
        m.fully_free_gpus
            .get_or_create(&l)
            .set(to_i64(r.fully_free_gpus));
        m.fully_free_nodes
            .get_or_create(&l)
            .set(to_i64(r.fully_free_nodes));
        m.unknown_pods.get_or_create(&l).set(to_i64(r.unknown_pods));
        m.pending_unplaceable
            .get_or_create(&l)
            .set(to_i64(r.pending_unplaceable));
        for result in Eviction::ALL.iter().map(|e| e.as_str()) {
            self.remember(policy_name, |s| &mut s.evictions, result);
            drop(m.evictions.get_or_create(&ResultLabels {
                policy: policy_name.to_string(),
                result: result.to_string(),
            }));
        }
    }

    /// Exports a policy's allocated-but-idle `(pods, gpus, milli)`; `None` (no data)
    /// removes the series: no data is not zero.
    pub fn set_idle(&self, policy_name: &str, idle: Option<(u64, u64, u64)>) {
        let m = &self.0;
        let l = policy(policy_name);
        match idle {
            Some((pods, gpus, milli)) => {
                m.idle_alloc_pods.get_or_create(&l).set(to_i64(pods));
                m.idle_alloc_gpus.get_or_create(&l).set(to_i64(gpus));
                m.idle_alloc_milli.get_or_create(&l).set(to_i64(milli));
            }
            None => {
                m.idle_alloc_pods.remove(&l);
                m.idle_alloc_gpus.remove(&l);
                m.idle_alloc_milli.remove(&l);
            }
        }
    }

    /// Counts where a replacement landed: `planned` or `elsewhere`.
    pub fn landing(&self, policy_name: &str, landed: Landed) {
        let result = landed.as_str();
        self.remember(policy_name, |s| &mut s.landings, result);
        self.0
            .landings
            .get_or_create(&ResultLabels {
                policy: policy_name.to_string(),
                result: result.to_string(),
            })
            .inc();
    }

    /// Counts one landing-control action on a held pod (`kind`: a fixed word).
    pub fn landing_action(&self, action: LandingAction) {
        let kind = action.as_str();
        self.0
            .landing_actions
            .get_or_create(&KindLabel {
                kind: kind.to_string(),
            })
            .inc();
    }

    /// Sets how many pods are held past their hold timeout.
    pub fn set_landing_stuck(&self, pods: usize) {
        self.0.landing_stuck.set(to_i64(pods as u64));
    }

    /// Counts a failed GPU activity query; `kind` is [`crate::idle::QueryError::kind`].
    pub fn idle_query_error(&self, kind: &str) {
        self.0
            .idle_query_errors
            .get_or_create(&KindLabel {
                kind: kind.to_string(),
            })
            .inc();
    }

    /// Exports the policy's trigger (`spec.trigger.minFragmentRate`).
    pub fn set_trigger(&self, policy_name: &str, min_fragment_rate: f64) {
        self.0
            .min_fragment_rate
            .get_or_create(&policy(policy_name))
            .set(min_fragment_rate);
    }

    /// Exports the allocated milli of every GPU of `nodes` when per-GPU series are enabled
    /// (otherwise does nothing). Series of GPUs not in `nodes` are removed.
    pub fn set_gpus(&self, nodes: &[Node]) {
        if self.0.gpu_used.is_none() {
            return;
        }
        self.set_gpu_use(nodes.iter().flat_map(|n| {
            n.gpus
                .iter()
                .enumerate()
                .map(move |(i, g)| (n.name.as_str(), i, g.used))
        }));
    }

    /// `(node, device index, used milli)` of every GPU; replaces the previous set.
    fn set_gpu_use<'a>(&self, gpus: impl IntoIterator<Item = (&'a str, usize, Milli)>) {
        let Some(family) = &self.0.gpu_used else {
            return;
        };
        let mut seen = self.0.gpus_seen.lock().unwrap_or_else(|e| e.into_inner());
        let mut now = BTreeSet::new();
        for (node, index, used) in gpus {
            let l = GpuLabels {
                node: node.to_string(),
                gpu: index.to_string(),
            };
            family.get_or_create(&l).set(i64::from(used));
            now.insert(l);
        }
        // Remove after setting, so a scrape in between never sees a missing GPU.
        for gone in seen.difference(&now) {
            family.remove(gone);
        }
        *seen = now;
    }

    /// Exports the plan size and skipped pods by reason. Reasons seen before but absent now
    /// drop to 0.
    pub fn set_plan(&self, policy_name: &str, moves: u64, skipped: &BTreeMap<String, u64>) {
        let m = &self.0;
        m.plan_moves
            .get_or_create(&policy(policy_name))
            .set(to_i64(moves));
        let mut seen = m.seen.lock().unwrap_or_else(|e| e.into_inner());
        let entry = seen.entry(policy_name.to_string()).or_default();
        for reason in entry.skipped.iter() {
            if !skipped.contains_key(reason) {
                m.skipped_pods
                    .get_or_create(&ReasonLabels {
                        policy: policy_name.to_string(),
                        reason: reason.clone(),
                    })
                    .set(0);
            }
        }
        for (reason, n) in skipped {
            entry.skipped.insert(reason.clone());
            m.skipped_pods
                .get_or_create(&ReasonLabels {
                    policy: policy_name.to_string(),
                    reason: reason.clone(),
                })
                .set(to_i64(*n));
        }
    }

    /// Exports the MIG partitions of the policy's nodes per profile, summed over nodes:
    /// `(profile, used, free)`. Profiles seen before but absent now drop to 0.
    pub fn set_mig(&self, policy_name: &str, profiles: &BTreeMap<String, (u64, u64)>) {
        let m = &self.0;
        let labels = |profile: &str, state: &str| MigLabels {
            policy: policy_name.to_string(),
            profile: profile.to_string(),
            state: state.to_string(),
        };
        let mut seen = m.seen.lock().unwrap_or_else(|e| e.into_inner());
        let entry = seen.entry(policy_name.to_string()).or_default();
        for profile in entry.mig.iter().filter(|p| !profiles.contains_key(*p)) {
            for state in ["used", "free"] {
                m.mig_partitions
                    .get_or_create(&labels(profile, state))
                    .set(0);
            }
        }
        for (profile, (used, free)) in profiles {
            entry.mig.insert(profile.clone());
            m.mig_partitions
                .get_or_create(&labels(profile, "used"))
                .set(to_i64(*used));
            m.mig_partitions
                .get_or_create(&labels(profile, "free"))
                .set(to_i64(*free));
        }
    }

    /// Counts one eviction attempt; `result` is one of `done`, `blocked`, `bounced`, `failed`,
    /// `dry_run_allowed`, `dry_run_blocked`.
    pub fn eviction(&self, policy_name: &str, result: Eviction) {
        let result = result.as_str();
        self.remember(policy_name, |s| &mut s.evictions, result);
        self.0
            .evictions
            .get_or_create(&ResultLabels {
                policy: policy_name.to_string(),
                result: result.to_string(),
            })
            .inc();
    }

    /// Counts a finished executor run by `result` and observes its duration.
    pub fn run_finished(&self, policy_name: &str, result: &str, seconds: f64) {
        self.remember(policy_name, |s| &mut s.runs, result);
        self.0
            .runs
            .get_or_create(&ResultLabels {
                policy: policy_name.to_string(),
                result: result.to_string(),
            })
            .inc();
        self.0
            .run_duration
            .get_or_create(&policy(policy_name))
            .observe(seconds);
    }

    /// Sets how many groups wait for a demand run.
    pub fn set_demand_waiting(&self, policy_name: &str, groups: u64) {
        self.0
            .demand_waiting
            .get_or_create(&policy(policy_name))
            .set(to_i64(groups));
    }

    /// Counts a demand run or search by `result`; `evictions` it spent; the waits of the
    /// pods it served (seconds from unschedulable to bound).
    pub fn demand_finished(&self, policy_name: &str, result: &str, evictions: u64, waits: &[f64]) {
        self.remember(policy_name, |s| &mut s.demand, result);
        self.0
            .demand_runs
            .get_or_create(&ResultLabels {
                policy: policy_name.to_string(),
                result: result.to_string(),
            })
            .inc();
        self.0
            .demand_evictions
            .get_or_create(&policy(policy_name))
            .inc_by(evictions);
        let h = self.0.demand_wait.get_or_create(&policy(policy_name));
        for w in waits {
            h.observe(*w);
        }
    }

    /// Counts a reconcile error; `kind` is the error's low-cardinality label.
    pub fn reconcile_error(&self, policy_name: &str, kind: &str) {
        self.remember(policy_name, |s| &mut s.errors, kind);
        self.0
            .reconcile_errors
            .get_or_create(&KindLabels {
                policy: policy_name.to_string(),
                kind: kind.to_string(),
            })
            .inc();
    }

    /// Observes the duration of one reconcile.
    pub fn observe_reconcile(&self, seconds: f64) {
        self.0.reconcile_duration.observe(seconds);
    }

    /// Times a reconcile until the guard is dropped, whatever way it ends (success, error,
    /// early return).
    pub fn reconcile_timer(&self) -> ReconcileTimer<'_> {
        ReconcileTimer {
            metrics: self,
            started: std::time::Instant::now(),
        }
    }

    /// Exports whether the policy's maintenance window is open.
    pub fn set_window(&self, policy_name: &str, open: bool) {
        self.0
            .window_open
            .get_or_create(&policy(policy_name))
            .set(i64::from(open));
    }

    /// Exports whether this replica is the leader. A replica that is not drops its gauges
    /// of cluster state (see the module documentation).
    pub fn set_leader(&self, leader: bool) {
        let m = &self.0;
        m.is_leader.set(i64::from(leader));
        if leader {
            return;
        }
        for f in [
            &m.idle_milli,
            &m.fragment_milli,
            &m.fully_free_gpus,
            &m.fully_free_nodes,
            &m.unknown_pods,
            &m.pending_unplaceable,
            &m.plan_moves,
            &m.window_open,
            &m.idle_alloc_pods,
            &m.idle_alloc_gpus,
            &m.idle_alloc_milli,
        ] {
            f.clear();
        }
        m.fragment_rate.clear();
        m.min_fragment_rate.clear();
        m.skipped_pods.clear();
        m.mig_partitions.clear();
        if let Some(f) = &m.gpu_used {
            let mut seen = m.gpus_seen.lock().unwrap_or_else(|e| e.into_inner());
            f.clear();
            seen.clear();
        }
    }

    /// Removes every series of a deleted policy.
    pub fn forget_policy(&self, policy_name: &str) {
        let m = &self.0;
        let l = policy(policy_name);
        for f in [
            &m.idle_milli,
            &m.fragment_milli,
            &m.fully_free_gpus,
            &m.fully_free_nodes,
            &m.unknown_pods,
            &m.pending_unplaceable,
            &m.plan_moves,
            &m.window_open,
            &m.idle_alloc_pods,
            &m.idle_alloc_gpus,
            &m.idle_alloc_milli,
        ] {
            f.remove(&l);
        }
        m.fragment_rate.remove(&l);
        m.min_fragment_rate.remove(&l);
        m.run_duration.remove(&l);
        m.demand_waiting.remove(&l);
        m.demand_wait.remove(&l);
        m.demand_evictions.remove(&l);
        let seen = m
            .seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(policy_name)
            .unwrap_or_default();
        let p = || policy_name.to_string();
        for reason in seen.skipped {
            m.skipped_pods.remove(&ReasonLabels {
                policy: p(),
                reason,
            });
        }
        for profile in seen.mig {
            for state in ["used", "free"] {
                m.mig_partitions.remove(&MigLabels {
                    policy: p(),
                    profile: profile.clone(),
                    state: state.into(),
                });
            }
        }
        for result in seen.evictions {
            m.evictions.remove(&ResultLabels {
                policy: p(),
                result,
            });
        }
        for result in seen.runs {
            m.runs.remove(&ResultLabels {
                policy: p(),
                result,
            });
        }
        for result in seen.demand {
            m.demand_runs.remove(&ResultLabels {
                policy: p(),
                result,
            });
        }
        for kind in seen.errors {
            m.reconcile_errors.remove(&KindLabels { policy: p(), kind });
        }
        for result in seen.landings {
            m.landings.remove(&ResultLabels {
                policy: p(),
                result,
            });
        }
    }

    /// All metrics in the OpenMetrics text format (ends with `# EOF`).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.0.registry);
        out
    }

    fn remember(&self, policy_name: &str, set: fn(&mut Seen) -> &mut BTreeSet<String>, v: &str) {
        let mut seen = self.0.seen.lock().unwrap_or_else(|e| e.into_inner());
        let s = set(seen.entry(policy_name.to_string()).or_default());
        if !s.contains(v) {
            s.insert(v.to_string());
        }
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Observes `gpu_defrag_reconcile_duration_seconds` when dropped ([`Metrics::reconcile_timer`]).
pub struct ReconcileTimer<'a> {
    metrics: &'a Metrics,
    started: std::time::Instant,
}

impl Drop for ReconcileTimer<'_> {
    fn drop(&mut self) {
        self.metrics
            .observe_reconcile(self.started.elapsed().as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Metrics {
        let m = Metrics::new();
        m.set_report(
            "nightly",
            &ReportNumbers {
                fragment_rate: 0.25,
                idle_milli: 12_000,
                fragment_milli: 3_000,
                fully_free_gpus: 9,
                fully_free_nodes: 1,
                unknown_pods: 2,
                pending_unplaceable: 1,
            },
        );
        m.set_plan(
            "nightly",
            7,
            &BTreeMap::from([("pdb".to_string(), 3), ("bare-pod".to_string(), 1)]),
        );
        m.eviction("nightly", Eviction::Done);
        m.eviction("nightly", Eviction::Done);
        m.eviction("nightly", Eviction::Blocked);
        m.run_finished("nightly", "done", 42.0);
        m.reconcile_error("nightly", "kube");
        m.observe_reconcile(0.02);
        m.set_window("nightly", true);
        m.set_mig(
            "nightly",
            &BTreeMap::from([
                ("1g.10gb".to_string(), (2, 5)),
                ("3g.40gb".to_string(), (1, 0)),
            ]),
        );
        m.set_leader(true);
        m
    }

    #[test]
    fn encode_has_names_labels_and_suffixes() {
        let text = sample().encode();
        for want in [
            "gpu_defrag_fragment_rate{policy=\"nightly\"} 0.25",
            "gpu_defrag_idle_milli{policy=\"nightly\"} 12000",
            "gpu_defrag_fragment_milli{policy=\"nightly\"} 3000",
            "gpu_defrag_fully_free_gpus{policy=\"nightly\"} 9",
            "gpu_defrag_fully_free_nodes{policy=\"nightly\"} 1",
            "gpu_defrag_unknown_pods{policy=\"nightly\"} 2",
            "gpu_defrag_pending_unplaceable_pods{policy=\"nightly\"} 1",
            "gpu_defrag_plan_moves{policy=\"nightly\"} 7",
            "gpu_defrag_skipped_pods{policy=\"nightly\",reason=\"pdb\"} 3",
            "gpu_defrag_window_open{policy=\"nightly\"} 1",
            "gpu_defrag_mig_partitions{policy=\"nightly\",profile=\"1g.10gb\",state=\"used\"} 2",
            "gpu_defrag_mig_partitions{policy=\"nightly\",profile=\"1g.10gb\",state=\"free\"} 5",
            "gpu_defrag_mig_partitions{policy=\"nightly\",profile=\"3g.40gb\",state=\"free\"} 0",
            "gpu_defrag_evictions_total{policy=\"nightly\",result=\"done\"} 2",
            "gpu_defrag_evictions_total{policy=\"nightly\",result=\"blocked\"} 1",
            "gpu_defrag_runs_total{policy=\"nightly\",result=\"done\"} 1",
            "gpu_defrag_run_duration_seconds_count{policy=\"nightly\"} 1",
            "gpu_defrag_run_duration_seconds_sum{policy=\"nightly\"} 42.0",
            "gpu_defrag_reconcile_errors_total{policy=\"nightly\",kind=\"kube\"} 1",
            "gpu_defrag_reconcile_duration_seconds_count 1",
            "gpu_defrag_is_leader 1",
            "# TYPE gpu_defrag_evictions counter",
            "# TYPE gpu_defrag_run_duration_seconds histogram",
            "# UNIT gpu_defrag_run_duration_seconds seconds",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
        let version = format!(
            "gpu_defrag_build_info{{version=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION")
        );
        assert!(text.contains(&version), "{text}");
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn skipped_reasons_that_vanish_drop_to_zero() {
        let m = sample();
        m.set_plan("nightly", 0, &BTreeMap::new());
        let text = m.encode();
        assert!(text.contains("gpu_defrag_skipped_pods{policy=\"nightly\",reason=\"pdb\"} 0"));
        assert!(text.contains("gpu_defrag_plan_moves{policy=\"nightly\"} 0"));
    }

    #[test]
    fn mig_profiles_that_vanish_drop_to_zero() {
        let m = sample();
        m.set_mig(
            "nightly",
            &BTreeMap::from([("1g.10gb".to_string(), (3, 4))]),
        );
        let text = m.encode();
        for want in [
            "gpu_defrag_mig_partitions{policy=\"nightly\",profile=\"1g.10gb\",state=\"used\"} 3",
            "gpu_defrag_mig_partitions{policy=\"nightly\",profile=\"3g.40gb\",state=\"used\"} 0",
            "gpu_defrag_mig_partitions{policy=\"nightly\",profile=\"3g.40gb\",state=\"free\"} 0",
        ] {
            assert!(text.contains(want), "{want} missing:\n{text}");
        }
    }

    #[test]
    fn forget_policy_removes_all_its_series() {
        let m = sample();
        m.set_window("other", false);
        m.forget_policy("nightly");
        let text = m.encode();
        assert!(!text.contains("nightly"), "{text}");
        assert!(text.contains("gpu_defrag_window_open{policy=\"other\"} 0"));
        assert!(text.contains("gpu_defrag_is_leader 1"));
    }

    #[test]
    fn clones_share_series_across_threads() {
        let m = Metrics::new();
        let c = m.clone();
        std::thread::spawn(move || c.eviction("p", Eviction::Failed))
            .join()
            .unwrap();
        assert!(
            m.encode()
                .contains("gpu_defrag_evictions_total{policy=\"p\",result=\"failed\"} 1")
        );
    }

    #[test]
    fn trigger_is_exported_and_forgotten() {
        let m = sample();
        m.set_trigger("nightly", 0.2);
        assert!(
            m.encode()
                .contains("gpu_defrag_policy_min_fragment_rate{policy=\"nightly\"} 0.2")
        );
        m.forget_policy("nightly");
        assert!(!m.encode().contains("nightly"));
    }

    #[test]
    fn every_eviction_result_exists_from_the_first_report() {
        let m = Metrics::new();
        m.set_report("p", &ReportNumbers::default());
        let text = m.encode();
        for result in Eviction::ALL.iter().map(|e| e.as_str()) {
            let want = format!("gpu_defrag_evictions_total{{policy=\"p\",result=\"{result}\"}} 0");
            assert!(text.contains(&want), "missing {want:?} in\n{text}");
        }
        m.forget_policy("p");
        assert!(!m.encode().contains("gpu_defrag_evictions_total{"));
    }

    #[test]
    fn per_gpu_family_is_opt_in() {
        let m = Metrics::new();
        m.set_gpu_use([("node-a", 0, 500)]);
        assert!(!m.encode().contains("gpu_used_milli"));
        let m = Metrics::with_per_gpu(true);
        m.set_gpu_use([("node-a", 0, 500), ("node-a", 1, 0)]);
        let text = m.encode();
        assert!(
            text.contains("# TYPE gpu_defrag_gpu_used_milli gauge"),
            "{text}"
        );
        assert!(text.contains("gpu_defrag_gpu_used_milli{node=\"node-a\",gpu=\"0\"} 500"));
        assert!(text.contains("gpu_defrag_gpu_used_milli{node=\"node-a\",gpu=\"1\"} 0"));
    }

    #[test]
    fn per_gpu_series_of_vanished_nodes_and_gpus_are_removed() {
        let m = Metrics::with_per_gpu(true);
        m.set_gpu_use([("a", 0, 1000), ("a", 1, 250), ("b", 0, 0), ("b", 1, 0)]);
        // Node b is gone, node a lost a GPU, node c is new.
        m.set_gpu_use([("a", 0, 750), ("c", 0, 1000)]);
        let text = m.encode();
        let series: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("gpu_defrag_gpu_used_milli{"))
            .collect();
        assert_eq!(
            series.len(),
            2,
            "only a/0 and c/0 must remain, got {series:?}"
        );
        assert!(text.contains("gpu_defrag_gpu_used_milli{node=\"a\",gpu=\"0\"} 750"));
        assert!(text.contains("gpu_defrag_gpu_used_milli{node=\"c\",gpu=\"0\"} 1000"));
    }

    /// A Kubernetes object from JSON.
    fn object<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
        serde_json::from_value(v).unwrap()
    }

    fn gpu_node(name: &str, gpus: u32) -> k8s_openapi::api::core::v1::Node {
        let alloc = serde_json::json!({
            "cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": gpus.to_string()
        });
        object(serde_json::json!({
            "metadata": {"name": name},
            "status": {
                "allocatable": alloc, "capacity": alloc,
                "conditions": [{"type": "Ready", "status": "True"}]
            }
        }))
    }

    #[test]
    fn per_gpu_series_come_from_the_cluster_model() {
        let pod: k8s_openapi::api::core::v1::Pod = object(serde_json::json!({
            "metadata": {"name": "train", "namespace": "ml", "uid": "u1"},
            "spec": {
                "nodeName": "node-a",
                "containers": [{
                    "name": "c",
                    "resources": {"requests": {"nvidia.com/gpu": "2"},
                                  "limits": {"nvidia.com/gpu": "2"}}
                }]
            },
            "status": {"phase": "Running"}
        }));
        let objs = gpu_defrag_core::ingest::Objects {
            nodes: vec![
                gpu_node("node-a", 4),
                gpu_node("node-b", 2),
                gpu_node("cpu", 0),
            ],
            pods: vec![pod],
            ..Default::default()
        };
        let cluster = gpu_defrag_core::ingest::build_cluster(&objs, None);
        let m = Metrics::with_per_gpu(true);
        m.set_gpus(&cluster.nodes);
        let text = m.encode();
        let mut per_node: BTreeMap<String, (usize, i64)> = BTreeMap::new();
        for line in text
            .lines()
            .filter(|l| l.starts_with("gpu_defrag_gpu_used_milli{"))
        {
            let node = line.split('"').nth(1).unwrap().to_string();
            let v: i64 = line.rsplit(' ').next().unwrap().parse().unwrap();
            let e = per_node.entry(node).or_default();
            e.0 += 1;
            e.1 += v;
        }
        assert_eq!(
            per_node,
            BTreeMap::from([
                ("node-a".to_string(), (4, 2000)),
                ("node-b".to_string(), (2, 0)),
            ]),
            "{text}"
        );
        // The GPU-less node exports nothing; a later model without node-b drops its series.
        let smaller = gpu_defrag_core::ingest::Objects {
            nodes: vec![gpu_node("node-a", 4)],
            ..Default::default()
        };
        m.set_gpus(&gpu_defrag_core::ingest::build_cluster(&smaller, None).nodes);
        let text = m.encode();
        assert!(!text.contains("node-b"), "{text}");
        assert!(text.contains("gpu_defrag_gpu_used_milli{node=\"node-a\",gpu=\"3\"} 0"));
    }

    #[test]
    fn a_replica_that_is_not_leader_drops_its_gauges_of_cluster_state() {
        let m = Metrics::with_per_gpu(true);
        m.set_report("nightly", &ReportNumbers::default());
        m.set_trigger("nightly", 0.3);
        m.set_plan("nightly", 2, &BTreeMap::from([("pdb".to_string(), 1)]));
        m.set_window("nightly", true);
        m.set_mig(
            "nightly",
            &BTreeMap::from([("1g.10gb".to_string(), (1, 1))]),
        );
        m.set_gpu_use([("a", 0, 1000)]);
        m.eviction("nightly", Eviction::Done);
        m.run_finished("nightly", "Succeeded", 3.0);
        m.set_leader(true);
        m.set_leader(false);
        let text = m.encode();
        for gone in [
            "gpu_defrag_fragment_rate{",
            "gpu_defrag_policy_min_fragment_rate{",
            "gpu_defrag_idle_milli{",
            "gpu_defrag_plan_moves{",
            "gpu_defrag_skipped_pods{",
            "gpu_defrag_mig_partitions{",
            "gpu_defrag_window_open{",
            "gpu_defrag_gpu_used_milli{",
        ] {
            assert!(!text.contains(gone), "{gone} still exported:\n{text}");
        }
        for kept in [
            "gpu_defrag_is_leader 0",
            "gpu_defrag_evictions_total{policy=\"nightly\",result=\"done\"} 1",
            "gpu_defrag_runs_total{policy=\"nightly\",result=\"Succeeded\"} 1",
            "gpu_defrag_run_duration_seconds_count{policy=\"nightly\"} 1",
        ] {
            assert!(text.contains(kept), "missing {kept:?}:\n{text}");
        }
        // Leader again: the next reconcile exports everything anew.
        m.set_leader(true);
        m.set_gpu_use([("a", 0, 500)]);
        assert!(
            m.encode()
                .contains("gpu_defrag_gpu_used_milli{node=\"a\",gpu=\"0\"} 500")
        );
    }
}

/// The Grafana dashboard and the alert rules in `config/` against what the operator exports.
#[cfg(test)]
mod monitoring {
    use std::collections::BTreeSet;

    use serde::Deserialize;
    use serde_json::Value;

    use super::*;

    const DASHBOARD: &str = include_str!("../../../config/grafana/gpu-defrag.json");
    const RULES: &str = include_str!("../../../config/prometheus/rules.yaml");
    const RULES_TEST: &str = include_str!("../../../config/prometheus/rules_test.yaml");
    const PROMETHEUS_RULE: &str = include_str!("../../../config/prometheus/prometheusrule.yaml");

    /// Every family with at least one series (the per-GPU family included).
    fn populated() -> Metrics {
        let m = Metrics::with_per_gpu(true);
        m.set_report(
            "p",
            &ReportNumbers {
                fragment_rate: 0.5,
                idle_milli: 4000,
                fragment_milli: 2000,
                ..Default::default()
            },
        );
        m.set_trigger("p", 0.2);
        m.set_idle("p", Some((1, 2, 2000)));
        m.idle_query_error("timeout");
        m.set_plan("p", 3, &BTreeMap::from([("pdb".to_string(), 1)]));
        m.set_mig("p", &BTreeMap::from([("1g.10gb".to_string(), (1, 6))]));
        m.set_window("p", true);
        m.set_gpu_use([("node-a", 0, 1000)]);
        m.eviction("p", Eviction::Done);
        m.run_finished("p", "Succeeded", 10.0);
        m.reconcile_error("p", "ApiError");
        m.observe_reconcile(0.01);
        m.set_leader(true);
        m
    }

    /// Names of the samples in an OpenMetrics text (with `_total`, `_bucket`, … suffixes:
    /// the names Prometheus stores and queries use).
    fn sample_names(text: &str) -> BTreeSet<String> {
        text.lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .map(|l| l.split(['{', ' ']).next().unwrap_or_default().to_string())
            .collect()
    }

    /// Every `gpu_defrag_…` identifier in a text.
    fn used_names(text: &str) -> BTreeSet<String> {
        let ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
        let mut out = BTreeSet::new();
        for (i, _) in text.match_indices("gpu_defrag_") {
            if text[..i].chars().next_back().is_some_and(ident) {
                continue;
            }
            let end = text[i..]
                .find(|c: char| !ident(c))
                .map_or(text.len(), |e| i + e);
            out.insert(text[i..end].to_string());
        }
        out
    }

    fn yaml(text: &str) -> Value {
        Value::deserialize(serde_norway::Deserializer::from_str(text)).unwrap()
    }

    #[test]
    fn the_populated_registry_has_samples_of_every_family() {
        let text = populated().encode();
        let samples = sample_names(&text);
        let families: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split(' ').next())
            .collect();
        assert!(families.len() >= 19, "{families:?}");
        for f in families {
            assert!(
                samples.iter().any(|s| s.starts_with(f)),
                "family {f} has no sample; populate it in this test"
            );
        }
    }

    #[test]
    fn dashboard_and_rules_use_only_exported_metrics() {
        let exported = sample_names(&populated().encode());
        for (file, text) in [
            ("config/grafana/gpu-defrag.json", DASHBOARD),
            ("config/prometheus/rules.yaml", RULES),
            ("config/prometheus/rules_test.yaml", RULES_TEST),
            ("config/prometheus/prometheusrule.yaml", PROMETHEUS_RULE),
        ] {
            let used = used_names(text);
            assert!(!used.is_empty(), "{file} uses no gpu_defrag_ metric");
            let unknown: Vec<&String> = used.difference(&exported).collect();
            assert!(
                unknown.is_empty(),
                "{file} uses metrics the operator does not export: {unknown:?}\nexported: {exported:?}"
            );
        }
    }

    #[test]
    fn dashboard_shows_what_the_issue_asks_for() {
        let used = used_names(DASHBOARD);
        for want in [
            "gpu_defrag_fragment_rate",
            "gpu_defrag_policy_min_fragment_rate",
            "gpu_defrag_idle_milli",
            "gpu_defrag_fragment_milli",
            "gpu_defrag_gpu_used_milli",
            "gpu_defrag_evictions_total",
            "gpu_defrag_window_open",
            "gpu_defrag_plan_moves",
            "gpu_defrag_run_duration_seconds_bucket",
            "gpu_defrag_reconcile_errors_total",
        ] {
            assert!(used.contains(want), "the dashboard does not show {want}");
        }
    }

    #[test]
    fn dashboard_queries_the_datasource_variable() {
        let d: Value = serde_json::from_str(DASHBOARD).unwrap();
        let vars = d["templating"]["list"].as_array().unwrap();
        let var = |name: &str| {
            vars.iter()
                .find(|v| v["name"] == name)
                .unwrap_or_else(|| panic!("no variable {name}"))
        };
        assert_eq!(var("datasource")["type"], "datasource");
        assert_eq!(var("datasource")["query"], "prometheus");
        assert_eq!(
            var("policy")["query"]["query"],
            "label_values(gpu_defrag_fragment_rate, policy)"
        );
        let ds = serde_json::json!({"type": "prometheus", "uid": "${datasource}"});
        assert_eq!(var("policy")["datasource"], ds);
        let mut ids = BTreeSet::new();
        for p in d["panels"].as_array().unwrap() {
            assert!(ids.insert(p["id"].as_i64().unwrap()), "duplicate panel id");
            if p["type"] == "row" {
                continue;
            }
            let title = p["title"].as_str().unwrap();
            assert_eq!(p["datasource"], ds, "panel {title}");
            let targets = p["targets"].as_array().unwrap();
            assert!(!targets.is_empty(), "panel {title} has no query");
            for t in targets {
                assert_eq!(t["datasource"], ds, "panel {title}");
                assert!(t["expr"].as_str().is_some_and(|e| !e.is_empty()));
            }
        }
    }

    #[test]
    fn prometheus_rule_holds_the_groups_of_rules_yaml() {
        let rules = yaml(RULES);
        let wrapper = yaml(PROMETHEUS_RULE);
        assert_eq!(wrapper["apiVersion"], "monitoring.coreos.com/v1");
        assert_eq!(wrapper["kind"], "PrometheusRule");
        assert!(rules["groups"].as_array().is_some_and(|g| !g.is_empty()));
        assert_eq!(
            wrapper["spec"]["groups"], rules["groups"],
            "config/prometheus/prometheusrule.yaml is stale: run hack/prometheusrule.sh"
        );
    }

    #[test]
    fn rules_alert_on_what_the_issue_asks_for() {
        let rules = yaml(RULES);
        let alerts: BTreeMap<&str, &str> = rules["groups"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|g| g["rules"].as_array().unwrap())
            .filter_map(|r| Some((r["alert"].as_str()?, r["expr"].as_str()?)))
            .collect();
        let expr = |a: &str| *alerts.get(a).unwrap_or_else(|| panic!("no alert {a}"));
        assert!(expr("GpuDefragFragmentRateHigh").contains("gpu_defrag_policy_min_fragment_rate"));
        assert!(expr("GpuDefragEvictionsBlocked").contains("blocked|bounced"));
        assert!(expr("GpuDefragOperatorAbsent").contains("absent(gpu_defrag_build_info)"));
        assert!(expr("GpuAllocatedButIdle").contains("DCGM_FI_PROF_SM_ACTIVE{pod!=\"\"}"));
        // Every alert has a unit test in rules_test.yaml.
        for a in alerts.keys() {
            assert!(
                RULES_TEST.contains(&format!("alertname: {a}\n")),
                "no promtool test for {a}"
            );
        }
    }
}
