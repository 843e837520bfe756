//! Prometheus metrics of the operator (`gpu_defrag_*`, OpenMetrics text).
//!
//! ```text
//!   [reconcile] --set_report/set_plan/set_window--> [Metrics] --encode--> GET /metrics
//!   [executor]  --eviction/run_finished------------^
//!   [lease]     --set_leader-----------------------^
//! ```
//!
//! Labels are low-cardinality only: the policy name, and fixed words for `result`, `reason`
//! and `kind`. Never a pod or node name. Counters are exposed with a `_total` suffix and
//! durations as `_seconds` histograms.
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

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
struct ResultLabels {
    policy: String,
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    policy: String,
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
    evictions: BTreeSet<String>,
    runs: BTreeSet<String>,
    errors: BTreeSet<String>,
}

struct Inner {
    registry: Registry,
    fragment_rate: Family<PolicyLabel, GaugeF64>,
    idle_milli: Family<PolicyLabel, Gauge>,
    fragment_milli: Family<PolicyLabel, Gauge>,
    fully_free_gpus: Family<PolicyLabel, Gauge>,
    fully_free_nodes: Family<PolicyLabel, Gauge>,
    unknown_pods: Family<PolicyLabel, Gauge>,
    pending_unplaceable: Family<PolicyLabel, Gauge>,
    plan_moves: Family<PolicyLabel, Gauge>,
    skipped_pods: Family<ReasonLabels, Gauge>,
    window_open: Family<PolicyLabel, Gauge>,
    evictions: Family<ResultLabels, Counter>,
    run_duration: HistogramFamily<PolicyLabel>,
    runs: Family<ResultLabels, Counter>,
    reconcile_errors: Family<KindLabels, Counter>,
    reconcile_duration: Histogram,
    is_leader: Gauge,
    seen: Mutex<BTreeMap<String, Seen>>,
}

/// The operator's metrics and their registry. Cheap to clone; all clones share the series.
#[derive(Clone)]
pub struct Metrics(Arc<Inner>);

fn run_histogram() -> Histogram {
    // 1s .. ~4.5h: a run waits for replacements to become Ready.
    Histogram::new(exponential_buckets(1.0, 2.0, 15))
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn policy(p: &str) -> PolicyLabel {
    PolicyLabel {
        policy: p.to_string(),
    }
}

impl Metrics {
    /// Creates every family and registers it, plus `gpu_defrag_build_info{version}`.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("gpu_defrag");
        let mut inner = Inner {
            registry: Registry::default(),
            fragment_rate: Family::default(),
            idle_milli: Family::default(),
            fragment_milli: Family::default(),
            fully_free_gpus: Family::default(),
            fully_free_nodes: Family::default(),
            unknown_pods: Family::default(),
            pending_unplaceable: Family::default(),
            plan_moves: Family::default(),
            skipped_pods: Family::default(),
            window_open: Family::default(),
            evictions: Family::default(),
            run_duration: Family::new_with_constructor(run_histogram as fn() -> Histogram),
            runs: Family::default(),
            reconcile_errors: Family::default(),
            // 5ms .. ~10s.
            reconcile_duration: Histogram::new(exponential_buckets(0.005, 2.0, 12)),
            is_leader: Gauge::default(),
            seen: Mutex::default(),
        };
        let r = &mut registry;
        r.register(
            "fragment_rate",
            "Fragment rate of the policy's GPUs (0..1)",
            inner.fragment_rate.clone(),
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
            "window_open",
            "1 while the policy's maintenance window is open",
            inner.window_open.clone(),
        );
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
        let build_info = Family::<VersionLabel, Gauge>::default();
        build_info
            .get_or_create(&VersionLabel {
                version: env!("CARGO_PKG_VERSION").to_string(),
            })
            .set(1);
        r.register("build_info", "Operator version (value 1)", build_info);
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

    /// Counts one eviction attempt; `result` is one of `done`, `blocked`, `bounced`, `failed`,
    /// `dry_run_allowed`, `dry_run_blocked`.
    pub fn eviction(&self, policy_name: &str, result: &str) {
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

    /// Exports whether the policy's maintenance window is open.
    pub fn set_window(&self, policy_name: &str, open: bool) {
        self.0
            .window_open
            .get_or_create(&policy(policy_name))
            .set(i64::from(open));
    }

    /// Exports whether this replica is the leader.
    pub fn set_leader(&self, leader: bool) {
        self.0.is_leader.set(i64::from(leader));
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
        ] {
            f.remove(&l);
        }
        m.fragment_rate.remove(&l);
        m.run_duration.remove(&l);
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
        for kind in seen.errors {
            m.reconcile_errors.remove(&KindLabels { policy: p(), kind });
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
        m.eviction("nightly", "done");
        m.eviction("nightly", "done");
        m.eviction("nightly", "blocked");
        m.run_finished("nightly", "done", 42.0);
        m.reconcile_error("nightly", "kube");
        m.observe_reconcile(0.02);
        m.set_window("nightly", true);
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
        std::thread::spawn(move || c.eviction("p", "failed"))
            .join()
            .unwrap();
        assert!(
            m.encode()
                .contains("gpu_defrag_evictions_total{policy=\"p\",result=\"failed\"} 1")
        );
    }
}
