//! The decisions of a reconcile, pure: whether the policy can be used, whether a run
//! starts, resumes or is cleaned up, the conditions and why nothing is executing, policy
//! conflicts, the status to write and when to come back.
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use gpu_defrag_api::v1alpha1::{
    DefragPolicy, DefragPolicyStatus, DryRunCheck, IdleAllocatedSummary, Mode, RunRecord,
};
use gpu_defrag_api::values::{ConditionType, Reason, RunResult};
use gpu_defrag_core::frag::{self, IdleAllocated, Report};
use gpu_defrag_core::model::Cluster;
use gpu_defrag_core::plan::{Plan, Skip};
use gpu_defrag_core::policy::Policy;
use gpu_defrag_core::windows::{Span, Windows};
use kube::ResourceExt;

use crate::context::{EventReason, Observed};
use crate::demand::{self, Considered, DemandStart};
use crate::executor::evictor::DRY_RUN_CHECKS;
use crate::idle::{GPU_UTIL, IdleSource, IdleState, SM_ACTIVE};
use crate::objects::{parse_ts, ts};
use crate::status::{self, Want};

/// The `Degraded` message (and event) of a policy that covers no node with GPUs.
pub const NO_GPU_NODES: &str = "the policy covers no node with GPUs, so nothing is measured or moved: check spec.nodeSelector (a label such as nvidia.com/gpu.present is only set where GPU feature discovery runs) and that the nodes advertise GPUs (allocatable nvidia.com/gpu or a sharing scheme's resources)";

/// Whether this reconcile newly finds the policy covering no GPU node (announced once).
pub fn newly_without_gpu_nodes(s: &Situation) -> bool {
    s.report.nodes_counted == 0
        && !s
            .old
            .conditions
            .iter()
            .any(|c| c.type_ == "Degraded" && c.reason == Reason::NoGpuNodes.as_str())
}

/// How often every policy is reconciled without any change.
pub const RESYNC: Duration = Duration::from_secs(30);
/// How long an invalid policy waits before it is looked at again (unless it changes).
pub const INVALID_RESYNC: Duration = Duration::from_secs(300);

/// Why a policy cannot be used.
#[derive(Debug, Clone, PartialEq)]
pub struct Invalid {
    /// `InvalidSpec` or `InvalidWindow`.
    pub reason: Reason,
    /// What is wrong (names the field).
    pub message: String,
}

impl Invalid {
    /// The event that announces it.
    pub fn event(&self) -> EventReason {
        match self.reason {
            Reason::InvalidWindow => EventReason::InvalidWindow,
            _ => EventReason::InvalidSpec,
        }
    }

    /// The conditions of an invalid policy: nothing is evaluated, nothing is evicted.
    pub fn conditions(&self) -> Vec<Want> {
        let (reason, msg) = (self.reason, self.message.clone());
        vec![
            Want::of(ConditionType::Ready, false, reason, msg.clone()),
            Want::of(ConditionType::Degraded, true, reason, msg),
            Want::of(
                ConditionType::InWindow,
                false,
                reason,
                "windows not evaluated: the policy is invalid",
            ),
            Want::of(
                ConditionType::Executing,
                false,
                reason,
                "nothing is evicted while the policy is invalid",
            ),
        ]
    }
}

/// The policy and its windows, or why the spec cannot be used (what the schema cannot
/// judge).
pub fn validate(dp: &DefragPolicy) -> Result<(Policy, Windows), Invalid> {
    let policy = Policy::from_spec(&dp.spec).map_err(|e| Invalid {
        reason: Reason::InvalidSpec,
        message: e.to_string(),
    })?;
    let windows = Windows::parse(&dp.spec.windows).map_err(|e| Invalid {
        reason: Reason::InvalidWindow,
        message: e.to_string(),
    })?;
    Ok((policy, windows))
}

/// What the reconcile measured and planned, as the decisions need it.
pub struct Situation<'a> {
    /// The instant.
    pub now: DateTime<Utc>,
    /// The policy's own status before this reconcile.
    pub old: &'a DefragPolicyStatus,
    /// `mode: Enforce`.
    pub enforce: bool,
    /// `suspend: true`.
    pub suspended: bool,
    /// The conflict with an older policy, if any.
    pub conflict: Option<&'a str>,
    /// The window open now.
    pub open: Option<Span>,
    /// Fragmentation now.
    pub report: &'a Report,
    /// The plan now.
    pub plan: &'a Plan,
    /// The trigger (`minFragmentRate`).
    pub min_fragment_rate: f64,
    /// The benefit gate (`trigger.minNodesFreed`; 0: none).
    pub min_nodes_freed: u32,
    /// `demand.outsideWindows: true`: demand runs may start with no window open.
    pub demand_anytime: bool,
}

impl Situation<'_> {
    /// Whether fragmentation reaches the trigger.
    pub fn triggered(&self) -> bool {
        self.report.fragment_rate >= self.min_fragment_rate
    }

    /// Whole nodes the plan is expected to free.
    pub fn nodes_freed(&self) -> u64 {
        self.plan
            .after
            .fully_free_nodes
            .saturating_sub(self.plan.before.fully_free_nodes)
    }

    /// Whether the plan pays enough to run (`trigger.minNodesFreed`).
    pub fn pays(&self) -> bool {
        self.nodes_freed() >= u64::from(self.min_nodes_freed)
    }
}

impl<'a> Situation<'a> {
    /// The situation of policy `dp` at `now`: `old` its status, `obs` what the reconcile
    /// observed, `conflict` the older policy it overlaps, if any.
    pub fn of(
        dp: &DefragPolicy,
        policy: &Policy,
        windows: &Windows,
        old: &'a DefragPolicyStatus,
        obs: &'a Observed,
        conflict: Option<&'a str>,
        now: DateTime<Utc>,
    ) -> Self {
        Situation {
            now,
            old,
            enforce: enforces(dp),
            suspended: dp.spec.suspend,
            conflict,
            open: windows.open_at(now),
            report: &obs.report,
            plan: &obs.plan,
            min_fragment_rate: policy.min_fragment_rate,
            min_nodes_freed: policy.min_nodes_freed,
            demand_anytime: policy.demand.as_ref().is_some_and(|d| d.outside_windows),
        }
    }
}

/// The reconciler's part of the status after a reconcile: the conditions (with what the
/// reconcile did, `run_note`, and the dry-run check), the window, the report and plan, and
/// what demand found.
#[allow(clippy::too_many_arguments)]
pub fn reconciled_status(
    s: &Situation,
    dp: &DefragPolicy,
    windows: &Windows,
    running: bool,
    run_note: &str,
    check: Option<DryRunCheck>,
    idle: Option<&IdleView>,
    demand: Option<&Considered>,
) -> DefragPolicyStatus {
    let window = windows.status(s.now);
    let wanted = conditions(s, window.as_ref(), running, run_note, check.as_ref(), idle);
    let conds = status::conditions(
        &s.old.conditions,
        &wanted,
        dp.metadata.generation,
        &ts(s.now),
    );
    let mut st = status(s, conds, dp.metadata.generation, window, check, idle);
    st.demand = demand.map(|c| c.status.clone());
    st
}

/// What to do about runs.
#[derive(Debug, Clone, PartialEq)]
pub enum RunDecision {
    /// A run is in progress, or this window's run has finished: nothing.
    Nothing,
    /// The recorded run's own window is still open: resume it, with its own end.
    Resume {
        /// The recorded run.
        record: Box<RunRecord>,
        /// Its window's end.
        end: DateTime<Utc>,
    },
    /// The run in progress must stop before its next eviction (why).
    Stop(String),
    /// A recorded run no task owns cannot go on: end it with this result and message, and
    /// remove its fences.
    Abandon(RunResult, String),
    /// Start a run that ends at the window's end.
    Start(DateTime<Utc>),
    /// No run: remove fences this policy may have left.
    RemoveStaleFences,
    /// Remove fences this policy may have left, then start a demand run that stops
    /// sending evictions at `end` (the window's end, or [`demand::OUTSIDE_WINDOW_RUN`]
    /// from now outside the windows).
    Demand {
        /// The run.
        start: Box<DemandStart>,
        /// When it stops sending evictions.
        end: DateTime<Utc>,
    },
}

/// What one reconcile decides about runs: one decision, a demand run being one of its
/// arms, and what demand found (for `status.demand`).
#[derive(Debug, Clone)]
pub struct Decided {
    /// What to do about runs.
    pub run: RunDecision,
    /// What demand found (`None`: no `spec.demand`); its run, if any, is in `run`.
    pub demand: Option<Considered>,
}

/// The reconcile's decision: the window run's ([`run_decision`]); when that leaves the
/// policy idle (no run alive or recorded) and it may act (Enforce, not suspended, no
/// conflict, a window open or `demand.outsideWindows`), a demand run for the oldest group
/// waiting ([`demand::consider`]).
pub fn decide(s: &Situation, running: bool, policy: &Policy, cluster: &Cluster) -> Decided {
    let mut run = run_decision(s, running);
    let idle = !running
        && s.old.active_run.is_none()
        && matches!(run, RunDecision::Nothing | RunDecision::RemoveStaleFences);
    let may_start = idle
        && must_stop(s).is_none()
        && s.conflict.is_none()
        && (s.open.is_some() || s.demand_anytime);
    let mut demand = policy
        .demand
        .as_ref()
        .map(|d| demand::consider(d, policy, cluster, s.old, s.now, may_start));
    if let Some(start) = demand.as_mut().and_then(|c| c.start.take()) {
        let end = match s.open {
            Some(span) => span.end,
            None => s.now + demand::OUTSIDE_WINDOW_RUN,
        };
        run = RunDecision::Demand {
            start: Box::new(start),
            end,
        };
    }
    Decided { run, demand }
}

/// Why a run of this policy must not go on, if it must not: suspended or DryRun.
pub fn must_stop(s: &Situation) -> Option<&'static str> {
    if s.suspended {
        Some("the policy was suspended (spec.suspend)")
    } else if !s.enforce {
        Some("the policy was switched to DryRun")
    } else {
        None
    }
}

/// The run decision; `running` says whether a run task of the policy is alive.
pub fn run_decision(s: &Situation, running: bool) -> RunDecision {
    let stop = must_stop(s);
    if running {
        return match stop {
            Some(why) => RunDecision::Stop(why.to_string()),
            None => RunDecision::Nothing,
        };
    }
    let may_act = stop.is_none() && s.conflict.is_none();
    let restarted =
        "the operator restarted outside the run's window (or the policy changed); fences removed";
    match (&s.old.active_run, s.open) {
        // A demand run serves pods that waited then: after a restart its pods, if they
        // still wait, get a new demand run on a fresh plan.
        (Some(active), _) if active.demand.is_some() && stop.is_none() => RunDecision::Abandon(
            RunResult::Aborted,
            "the operator restarted during a demand run; fences removed (its pods are served \
             again if they still wait)"
                .to_string(),
        ),
        (Some(active), Some(_)) if may_act => match parse_ts(&active.window_end) {
            Some(end) if end > s.now => RunDecision::Resume {
                record: Box::new(active.clone()),
                end,
            },
            _ => RunDecision::Abandon(RunResult::Aborted, restarted.to_string()),
        },
        (Some(_), _) if stop.is_some() => RunDecision::Abandon(
            RunResult::Stopped,
            format!("stopped: {}; fences removed", stop.unwrap_or_default()),
        ),
        (Some(_), open) => RunDecision::Abandon(
            if open.is_none() {
                RunResult::WindowClosed
            } else {
                RunResult::Aborted
            },
            restarted.to_string(),
        ),
        (None, Some(span)) if may_act && s.triggered() && s.pays() && !s.plan.moves.is_empty() => {
            // One run per window: overlapping openings (e.g. `* * * * *` with a 1h
            // duration) count as the window of the last run until it ends.
            let already = s
                .old
                .last_runs
                .iter()
                .find(|r| r.demand.is_none())
                .and_then(|r| parse_ts(&r.window_end))
                .is_some_and(|end| end > s.now);
            if already {
                RunDecision::Nothing
            } else {
                RunDecision::Start(span.end)
            }
        }
        (None, _) => RunDecision::RemoveStaleFences,
    }
}

/// Why no run is executing, for the `Executing=False` message.
pub fn why_not_executing(s: &Situation) -> String {
    if s.suspended {
        "suspended (spec.suspend): plan only".to_string()
    } else if !s.enforce {
        "mode DryRun: plan only".to_string()
    } else if s.conflict.is_some() {
        "conflict with an older policy".to_string()
    } else if s.open.is_none() {
        "outside the maintenance windows".to_string()
    } else if !s.triggered() {
        format!(
            "fragment rate {:.3} is below the trigger {:.3}",
            s.report.fragment_rate, s.min_fragment_rate
        )
    } else if !s.plan.moves.is_empty() && !s.pays() {
        format!(
            "the plan frees {} whole nodes, below trigger.minNodesFreed {}",
            s.nodes_freed(),
            s.min_nodes_freed
        )
    } else if s.plan.moves.is_empty() {
        let other_scheduler = s
            .plan
            .skipped
            .get(Skip::SchedulerNotBinpacking.code())
            .copied()
            .unwrap_or(0);
        let mut why = "no move would reduce fragmentation within the limits".to_string();
        if other_scheduler > 0 {
            why += &format!(
                "; {other_scheduler} GPU pods stay put because a scheduler not listed in \
                 safety.binpackSchedulers placed them (skip scheduler-not-binpacking; \
                 docs/scheduler.md)"
            );
        }
        let settling = &s.plan.settling_nodes;
        if !settling.is_empty() {
            why += &format!(
                "; {} nodes receive no pod yet: {}",
                settling.len(),
                crate::render::settling_text(settling, 3)
            );
        }
        why
    } else {
        "this window's run has finished".to_string()
    }
}

/// The conditions of a reconciled policy. `run_note` says what this reconcile did about
/// runs (empty: nothing); `running` whether a run task was alive already.
pub fn conditions(
    s: &Situation,
    window: Option<&gpu_defrag_api::v1alpha1::WindowTimes>,
    running: bool,
    run_note: &str,
    check: Option<&DryRunCheck>,
    idle: Option<&IdleView>,
) -> Vec<Want> {
    let mut wanted = vec![Want::of(
        ConditionType::Ready,
        true,
        Reason::Reconciled,
        format!(
            "measured {} nodes, plan of {} evictions",
            s.report.nodes_counted,
            s.plan.moves.len()
        ),
    )];
    wanted.push(match (s.open, window) {
        (Some(span), _) => Want::of(
            ConditionType::InWindow,
            true,
            Reason::WindowOpen,
            format!("window open until {}", ts(span.end)),
        ),
        (None, Some(w)) => Want::of(
            ConditionType::InWindow,
            false,
            Reason::WindowClosed,
            format!("next window opens at {}", w.start),
        ),
        (None, None) => Want::of(
            ConditionType::InWindow,
            false,
            Reason::NoWindow,
            if s.enforce && s.demand_anytime {
                "no maintenance window: demand runs only"
            } else {
                "no maintenance window: dry run only"
            },
        ),
    });
    wanted.push(if running || !run_note.is_empty() {
        Want::of(
            ConditionType::Executing,
            true,
            Reason::RunInProgress,
            if run_note.is_empty() {
                "a run is in progress"
            } else {
                run_note
            },
        )
    } else {
        Want::of(
            ConditionType::Executing,
            false,
            Reason::NotExecuting,
            why_not_executing(s),
        )
    });
    let degraded = match check {
        _ if s.report.nodes_counted == 0 => None,
        Some(c) if c.blocked > 0 || c.failed > 0 => Some(format!(
            "{} of the first planned evictions would be refused (PodDisruptionBudget or error): {}",
            c.blocked + c.failed,
            c.blocked_pods.join("; ")
        )),
        _ if s.report.unknown_pods > 0 => Some(format!(
            "{} GPU pods have unreadable allocation records and are never moved; their nodes are never drained",
            s.report.unknown_pods
        )),
        _ => None,
    };
    wanted.push(match degraded {
        _ if s.report.nodes_counted == 0 => Want::of(
            ConditionType::Degraded,
            true,
            Reason::NoGpuNodes,
            NO_GPU_NODES,
        ),
        Some(m) => Want::of(ConditionType::Degraded, true, Reason::PlanPartlyBlocked, m),
        None => Want::of(
            ConditionType::Degraded,
            false,
            Reason::AsExpected,
            "all checks passed",
        ),
    });
    wanted.push(match s.conflict {
        Some(m) => Want::of(ConditionType::Conflict, true, Reason::OverlappingPolicy, m),
        None => Want::of(
            ConditionType::Conflict,
            false,
            Reason::NoOverlap,
            "no older policy covers these nodes",
        ),
    });
    if let Some(v) = idle {
        wanted.push(v.condition.clone());
    }
    wanted
}

/// The reconciler's part of the status (the run records belong to the executor).
pub fn status(
    s: &Situation,
    conditions: Vec<gpu_defrag_api::v1alpha1::Condition>,
    generation: Option<i64>,
    window: Option<gpu_defrag_api::v1alpha1::WindowTimes>,
    check: Option<DryRunCheck>,
    idle: Option<&IdleView>,
) -> DefragPolicyStatus {
    let now = ts(s.now);
    let mut plan_summary = status::plan_summary(s.plan, &now);
    plan_summary.dry_run_check = check;
    let skipped: BTreeMap<String, i64> = s
        .plan
        .skipped
        .iter()
        .map(|(k, v)| (k.clone(), *v as i64))
        .collect();
    DefragPolicyStatus {
        conditions,
        observed_generation: generation,
        fragmentation: Some(status::summary(s.report, &now)),
        plan: Some(plan_summary),
        next_window: window,
        active_run: None,
        last_runs: Vec::new(),
        skipped,
        idle_allocated: idle.and_then(|v| v.summary.clone()),
        demand: None,
    }
}

/// Whether anything but timestamps changed (avoids a status write every resync).
pub fn status_changed(old: &DefragPolicyStatus, new: &DefragPolicyStatus) -> bool {
    let mut a = old.clone();
    let mut b = new.clone();
    for s in [&mut a, &mut b] {
        s.active_run = None;
        s.last_runs.clear();
        if let Some(f) = s.fragmentation.as_mut() {
            f.observed_at.clear();
        }
        if let Some(p) = s.plan.as_mut() {
            p.computed_at.clear();
        }
        if let Some(i) = s.idle_allocated.as_mut() {
            i.observed_at.clear();
        }
    }
    a != b
}

/// When to reconcile again: periodically, and right when the next window opens.
pub fn requeue_after(windows: &Windows, now: DateTime<Utc>) -> Duration {
    windows
        .next(now)
        .map(|s| (s.start - now).to_std().unwrap_or_default())
        .filter(|d| !d.is_zero())
        .map(|d| d.min(RESYNC) + Duration::from_millis(200))
        .unwrap_or(RESYNC)
}

/// Policies whose covered nodes overlap with an older policy (the older wins).
pub fn conflicts_with(
    me: &DefragPolicy,
    all: &[Arc<DefragPolicy>],
    cluster: &Cluster,
) -> Option<String> {
    let key = |p: &DefragPolicy| {
        (
            p.metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0.as_second())
                .unwrap_or(i64::MAX),
            p.name_any(),
        )
    };
    let mine = Policy::from_spec(&me.spec).ok()?;
    for other in all {
        if other.name_any() == me.name_any() || key(other) >= key(me) {
            continue;
        }
        let Ok(theirs) = Policy::from_spec(&other.spec) else {
            continue;
        };
        if let Some(n) = cluster.nodes.iter().find(|n| {
            !n.gpus.is_empty() && mine.scope.covers_node(n) && theirs.scope.covers_node(n)
        }) {
            return Some(format!(
                "node {} is also covered by the older policy {}; that policy acts on it, this one only reports",
                n.name,
                other.name_any()
            ));
        }
    }
    None
}

/// A fingerprint of the planned evictions (to re-check them only when they change).
pub fn fingerprint(p: &Plan) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for m in p.moves.iter().take(DRY_RUN_CHECKS) {
        m.pod.hash(&mut h);
    }
    h.finish()
}

/// Whether the policy is `mode: Enforce`.
pub fn enforces(dp: &DefragPolicy) -> bool {
    dp.spec.mode == Mode::Enforce
}

/// What a reconcile reports about allocated-but-idle GPUs.
pub struct IdleView {
    /// The `IdleData` condition.
    pub condition: Want,
    /// `status.idleAllocated` (None: no data).
    pub summary: Option<IdleAllocatedSummary>,
    /// The numbers for metrics (None: no data, the series are removed).
    pub numbers: Option<IdleAllocated>,
}

/// The idle report of a policy from the source's last answer (no I/O).
pub fn idle_view(src: &IdleSource, cluster: &Cluster, policy: &Policy) -> IdleView {
    let cfg = src.config();
    match src.state() {
        IdleState::Pending => IdleView {
            condition: Want::of(
                ConditionType::IdleData,
                false,
                Reason::NotQueriedYet,
                "waiting for the first answer from Prometheus",
            ),
            summary: None,
            numbers: None,
        },
        IdleState::Failed { error, at } => IdleView {
            condition: Want::new(
                ConditionType::IdleData.as_str(),
                false,
                error.reason(),
                format!("no idle GPU data since {}: {error}", ts(at)),
            ),
            summary: None,
            numbers: None,
        },
        IdleState::Ready(m) => {
            let r = frag::idle_allocated(cluster, policy, &m.activity);
            let s = m.stats;
            let message = format!(
                "{} GPU series ({} by {SM_ACTIVE}, {} by {GPU_UTIL}), {} without a pod, {} skipped as invalid; \
                 {} of {} GPU pods measured",
                s.sm_active + s.gpu_util + s.without_pod,
                s.sm_active,
                s.gpu_util,
                s.without_pod,
                s.invalid,
                r.measured_pods,
                r.gpu_pods
            );
            let reason = if s.sm_active + s.gpu_util + s.without_pod == 0 {
                Reason::NoSeries
            } else {
                Reason::Measured
            };
            IdleView {
                condition: Want::of(ConditionType::IdleData, true, reason, message),
                summary: Some(status::idle_summary(
                    &r,
                    cfg.threshold,
                    &cfg.lookback_text(),
                    &ts(m.at),
                )),
                numbers: Some(r),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu_defrag_api::v1alpha1::DefragPolicySpec;
    use gpu_defrag_core::ingest;
    use gpu_defrag_core::ingest::Objects;
    use k8s_openapi::api::core::v1::{Node, Pod};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use serde_json::json;

    fn policy(name: &str, created: i64, selector: serde_json::Value) -> Arc<DefragPolicy> {
        let spec: DefragPolicySpec =
            serde_json::from_value(json!({"nodeSelector": selector})).unwrap();
        let mut p = DefragPolicy::new(name, spec);
        p.metadata.creation_timestamp = Some(Time(
            k8s_openapi::jiff::Timestamp::from_second(created).unwrap(),
        ));
        Arc::new(p)
    }

    fn cluster() -> Cluster {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": "n1", "labels": {"pool": "a", "team": "x"}},
            "status": {"allocatable": {"nvidia.com/gpu": "8"}, "conditions": [{"type": "Ready", "status": "True"}]}
        }))
        .unwrap();
        ingest::build_cluster(
            &Objects {
                nodes: vec![node],
                ..Default::default()
            },
            None,
        )
    }

    #[test]
    fn the_older_policy_wins_an_overlap() {
        let older = policy("older", 100, json!({"matchLabels": {"pool": "a"}}));
        let newer = policy("newer", 200, json!({"matchLabels": {"team": "x"}}));
        let elsewhere = policy("elsewhere", 50, json!({"matchLabels": {"pool": "b"}}));
        let all = vec![older.clone(), newer.clone(), elsewhere.clone()];
        let c = cluster();
        assert!(conflicts_with(&older, &all, &c).is_none());
        let msg = conflicts_with(&newer, &all, &c).expect("newer overlaps older");
        assert!(
            msg.contains("older policy older") && msg.contains("n1"),
            "{msg}"
        );
        assert!(conflicts_with(&elsewhere, &all, &c).is_none());
    }

    #[test]
    fn idle_view_reports_nothing_without_a_good_answer() {
        use crate::idle::{IdleArgs, IdleSource, IdleState, Measured, QueryError, SeriesStats};
        use gpu_defrag_core::model::PodActivity;
        let cfg = IdleArgs {
            idle_lookback: Duration::from_secs(3600),
            prometheus_timeout: Duration::from_secs(1),
            ..IdleArgs::for_url("http://127.0.0.1:9")
        }
        .config()
        .unwrap()
        .unwrap();
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ml", "uid": "u",
                         "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "resources": {
                "limits": {"nvidia.com/gpu": "2"}, "requests": {"nvidia.com/gpu": "2"}}}]},
            // Idle time counts from the pod's start.
            "status": {"phase": "Running", "startTime": "2026-01-01T00:00:00Z",
                       "conditions": [{"type": "Ready", "status": "True"}]}
        }))
        .unwrap();
        let objs = Objects {
            nodes: vec![
                serde_json::from_value(json!({
                    "metadata": {"name": "n1"},
                    "status": {"allocatable": {"nvidia.com/gpu": "8"},
                               "conditions": [{"type": "Ready", "status": "True"}]}
                }))
                .unwrap(),
            ],
            pods: vec![pod],
            ..Default::default()
        };
        let now = crate::objects::parse_ts("2026-01-02T00:00:00Z");
        let c = ingest::build_cluster(&objs, now);
        let policy = Policy::default();
        let failed = IdleSource::with_state(
            cfg.clone(),
            IdleState::Failed {
                error: QueryError::Unreachable("refused".into()),
                at: now.unwrap(),
            },
        );
        for (src, reason) in [
            (
                IdleSource::with_state(cfg.clone(), IdleState::Pending),
                "NotQueriedYet",
            ),
            (failed, "PrometheusUnreachable"),
        ] {
            let v = idle_view(&src, &c, &policy);
            assert_eq!(
                (v.condition.status, v.condition.reason.as_str()),
                (false, reason)
            );
            assert!(v.summary.is_none() && v.numbers.is_none());
        }
        let measured = Measured {
            activity: gpu_defrag_core::model::Activity {
                pods: [("ml/p".to_string(), PodActivity { peak: 0.1, gpus: 2 })].into(),
                threshold: 0.3,
                lookback: Duration::from_secs(3600),
            },
            at: now.unwrap(),
            stats: SeriesStats {
                sm_active: 2,
                ..Default::default()
            },
        };
        let v = idle_view(
            &IdleSource::with_state(cfg, IdleState::Ready(Arc::new(measured))),
            &c,
            &policy,
        );
        assert_eq!(
            (v.condition.status, v.condition.reason.as_str()),
            (true, "Measured")
        );
        let s = v.summary.unwrap();
        assert_eq!(
            (s.pods, s.gpus, s.milli, s.gpu_pods, s.measured_pods),
            (1, 2, 2000, 1, 1)
        );
        assert_eq!(
            (s.lookback.as_str(), s.idle_pods[0].pod.as_str()),
            ("1h", "ml/p")
        );
    }

    /// A policy from its spec as JSON.
    fn spec(v: serde_json::Value) -> DefragPolicy {
        DefragPolicy::new("p", serde_json::from_value::<DefragPolicySpec>(v).unwrap())
    }

    fn at(s: &str) -> DateTime<Utc> {
        crate::objects::parse_ts(s).unwrap()
    }

    /// An empty plan and report of the one-node cluster, and the same plan with one move.
    fn plans() -> (Report, Plan, Plan) {
        let c = cluster();
        let policy = Policy::default();
        let report = frag::report(&c, &policy);
        let empty = gpu_defrag_core::plan::plan(&c, &policy, None, &Default::default());
        let mut one = empty.clone();
        one.moves.push(gpu_defrag_core::plan::Move {
            pod: "ml/a".into(),
            pod_index: 0,
            from_node: "n1".into(),
            from_devices: Vec::new(),
            to_node: "n2".into(),
            to_devices: Vec::new(),
            batch: 0,
            reason: "drain n1".into(),
        });
        (report, empty, one)
    }

    /// A DryRun situation at 02:30 with no window, no conflict and no trigger; tests
    /// override what they vary.
    fn situation<'a>(
        old: &'a DefragPolicyStatus,
        report: &'a Report,
        plan: &'a Plan,
    ) -> Situation<'a> {
        Situation {
            now: at("2026-12-04T02:30:00Z"),
            old,
            enforce: false,
            suspended: false,
            conflict: None,
            open: None,
            report,
            plan,
            min_fragment_rate: 0.0,
            min_nodes_freed: 0,
            demand_anytime: false,
        }
    }

    fn span(start: &str, end: &str) -> Span {
        Span {
            start: at(start),
            end: at(end),
        }
    }

    #[test]
    fn an_unusable_spec_or_window_is_named_and_stops_everything() {
        let bad_window = spec(json!({"windows": [{"schedule": "61 * * * *", "duration": "1h"}]}));
        let invalid = validate(&bad_window).unwrap_err();
        assert_eq!(invalid.reason, Reason::InvalidWindow);
        assert_eq!(invalid.event(), EventReason::InvalidWindow);
        let conds = invalid.conditions();
        let by_type: BTreeMap<&str, bool> = conds.iter().map(|w| (w.type_, w.status)).collect();
        assert_eq!(
            by_type,
            [
                ("Ready", false),
                ("Degraded", true),
                ("InWindow", false),
                ("Executing", false)
            ]
            .into()
        );
        assert!(conds.iter().all(|w| w.reason == "InvalidWindow"));
        let bad_spec = spec(json!({"trigger": {"minFragmentRate": 2.0}}));
        let invalid = validate(&bad_spec).unwrap_err();
        assert_eq!(
            (invalid.reason, invalid.event()),
            (Reason::InvalidSpec, EventReason::InvalidSpec)
        );
        assert!(
            invalid.message.contains("minFragmentRate"),
            "{}",
            invalid.message
        );
        assert!(validate(&spec(json!({}))).is_ok());
    }

    #[test]
    fn run_decisions_follow_the_recorded_run_and_the_window() {
        let (report, empty, one) = plans();
        let now = at("2026-12-04T02:30:00Z");
        let open = Some(span("2026-12-04T02:00:00Z", "2026-12-04T03:00:00Z"));
        let active = RunRecord {
            id: "r1".into(),
            window_end: "2026-12-04T03:00:00Z".into(),
            ..Default::default()
        };
        let with_run = DefragPolicyStatus {
            active_run: Some(active.clone()),
            ..Default::default()
        };
        let none = DefragPolicyStatus::default();
        let restarted = "the operator restarted outside the run's window (or the policy changed); fences removed";
        let sit = |old, enforce, conflict, open, plan| Situation {
            now,
            enforce,
            conflict,
            open,
            ..situation(old, &report, plan)
        };
        // A live task: nothing, whatever else holds.
        assert_eq!(
            run_decision(&sit(&with_run, true, None, open, &one), true),
            RunDecision::Nothing
        );
        // The recorded run's window is open: resume it with its own end.
        assert_eq!(
            run_decision(&sit(&with_run, true, None, open, &one), false),
            RunDecision::Resume {
                record: Box::new(active.clone()),
                end: at("2026-12-04T03:00:00Z")
            }
        );
        // Closed window, DryRun, or a conflict: the recorded run is abandoned.
        assert_eq!(
            run_decision(&sit(&with_run, true, None, None, &one), false),
            RunDecision::Abandon(RunResult::WindowClosed, restarted.into())
        );
        assert_eq!(
            run_decision(&sit(&with_run, false, None, open, &one), false),
            RunDecision::Abandon(
                RunResult::Stopped,
                "stopped: the policy was switched to DryRun; fences removed".into()
            )
        );
        assert_eq!(
            run_decision(&sit(&with_run, true, Some("older"), open, &one), false),
            RunDecision::Abandon(RunResult::Aborted, restarted.into())
        );
        // No run: start one only with moves, in Enforce, without a conflict.
        assert_eq!(
            run_decision(&sit(&none, true, None, open, &one), false),
            RunDecision::Start(at("2026-12-04T03:00:00Z"))
        );
        // A recorded demand run is never resumed: it is ended, in or out of a window.
        let demand_run = DefragPolicyStatus {
            active_run: Some(RunRecord {
                demand: Some(Default::default()),
                ..active.clone()
            }),
            ..Default::default()
        };
        for w in [open, None] {
            assert!(matches!(
                run_decision(&sit(&demand_run, true, None, w, &one), false),
                RunDecision::Abandon(RunResult::Aborted, _)
            ));
        }
        // A demand run that ended in this window does not count as the window's run.
        let after_demand = DefragPolicyStatus {
            last_runs: vec![RunRecord {
                demand: Some(Default::default()),
                ..active.clone()
            }],
            ..Default::default()
        };
        assert_eq!(
            run_decision(&sit(&after_demand, true, None, open, &one), false),
            RunDecision::Start(at("2026-12-04T03:00:00Z"))
        );
        let after_window_run = DefragPolicyStatus {
            last_runs: vec![active.clone()],
            ..Default::default()
        };
        assert_eq!(
            run_decision(&sit(&after_window_run, true, None, open, &one), false),
            RunDecision::Nothing
        );
        // The benefit gate: a plan freeing fewer whole nodes than trigger.minNodesFreed
        // starts nothing, and the condition says why; one freeing enough starts.
        let mut frees_one = one.clone();
        frees_one.after.fully_free_nodes = frees_one.before.fully_free_nodes + 1;
        for (min, plan, starts) in [
            (1, &one, false),
            (1, &frees_one, true),
            (2, &frees_one, false),
        ] {
            let gated = Situation {
                min_nodes_freed: min,
                ..sit(&none, true, None, open, plan)
            };
            assert_eq!(
                run_decision(&gated, false) == RunDecision::Start(at("2026-12-04T03:00:00Z")),
                starts,
                "minNodesFreed {min}, frees {}",
                gated.nodes_freed()
            );
            if !starts {
                assert_eq!(
                    why_not_executing(&gated),
                    format!(
                        "the plan frees {} whole nodes, below trigger.minNodesFreed {min}",
                        gated.nodes_freed()
                    )
                );
            }
        }
        for (enforce, conflict, plan) in [
            (false, None, &one),
            (true, Some("older"), &one),
            (true, None, &empty),
        ] {
            assert_eq!(
                run_decision(&sit(&none, enforce, conflict, open, plan), false),
                RunDecision::RemoveStaleFences
            );
        }
        // One run per window: a run of this window has finished already.
        let finished = DefragPolicyStatus {
            last_runs: vec![active.clone()],
            ..Default::default()
        };
        assert_eq!(
            run_decision(&sit(&finished, true, None, open, &one), false),
            RunDecision::Nothing
        );
        assert_eq!(
            why_not_executing(&sit(&finished, true, None, open, &one)),
            "this window's run has finished"
        );
    }

    #[test]
    fn executing_says_why_not_in_order_of_the_first_reason() {
        let (report, empty, one) = plans();
        let old = DefragPolicyStatus::default();
        let open = Some(span("2026-12-04T02:00:00Z", "2026-12-04T03:00:00Z"));
        let sit = |enforce, conflict, open, plan, trigger| Situation {
            enforce,
            conflict,
            open,
            min_fragment_rate: trigger,
            ..situation(&old, &report, plan)
        };
        assert_eq!(
            why_not_executing(&sit(false, Some("x"), None, &one, 0.0)),
            "mode DryRun: plan only"
        );
        assert_eq!(
            why_not_executing(&sit(true, Some("x"), None, &one, 0.0)),
            "conflict with an older policy"
        );
        assert_eq!(
            why_not_executing(&sit(true, None, None, &one, 0.0)),
            "outside the maintenance windows"
        );
        assert!(
            why_not_executing(&sit(true, None, open, &one, 2.0))
                .contains("below the trigger 2.000")
        );
        assert_eq!(
            why_not_executing(&sit(true, None, open, &empty, 0.0)),
            "no move would reduce fragmentation within the limits"
        );
        // Pods of a scheduler the planner cannot predict: the message says so.
        let mut others = empty.clone();
        others
            .skipped
            .insert(Skip::SchedulerNotBinpacking.code().to_string(), 7);
        let why = why_not_executing(&sit(true, None, open, &others, 0.0));
        assert!(
            why.contains("7 GPU pods stay put") && why.contains("safety.binpackSchedulers"),
            "{why}"
        );
        // Nodes that receive nothing yet (a new cluster): named, a few, with why.
        let mut young = empty.clone();
        young.settling_nodes = (0..5)
            .map(|i| gpu_defrag_core::plan::SettlingNode {
                node: format!("gpu-{i}"),
                why: "Ready for 2m, under safety.minNodeAge 5m".into(),
            })
            .collect();
        let why = why_not_executing(&sit(true, None, open, &young, 0.0));
        assert!(
            why.contains(
                "; 5 nodes receive no pod yet: gpu-0 (Ready for 2m, under safety.minNodeAge 5m), "
            ) && why.ends_with("… 2 more"),
            "{why}"
        );
        let s = sit(true, None, open, &one, 0.0);
        let conds = conditions(&s, None, false, "run started", None, None);
        let executing = conds.iter().find(|w| w.type_ == "Executing").unwrap();
        assert_eq!(
            (
                executing.status,
                executing.reason.as_str(),
                executing.message.as_str()
            ),
            (true, "RunInProgress", "run started")
        );
        let window = conds.iter().find(|w| w.type_ == "InWindow").unwrap();
        assert_eq!(
            (window.status, window.message.as_str()),
            (true, "window open until 2026-12-04T03:00:00Z")
        );
    }

    #[test]
    fn a_refused_dry_run_degrades_the_policy() {
        let (report, _, one) = plans();
        let old = DefragPolicyStatus::default();
        let s = situation(&old, &report, &one);
        let check = DryRunCheck {
            allowed: 3,
            blocked: 1,
            failed: 0,
            blocked_pods: vec!["ml/a: pdb".into()],
        };
        let conds = conditions(&s, None, false, "", Some(&check), None);
        let degraded = conds.iter().find(|w| w.type_ == "Degraded").unwrap();
        assert_eq!(
            (degraded.status, degraded.reason.as_str()),
            (true, "PlanPartlyBlocked")
        );
        assert!(
            degraded
                .message
                .contains("1 of the first planned evictions")
                && degraded.message.contains("ml/a: pdb")
        );
        let fine = conditions(&s, None, false, "", None, None);
        let degraded = fine.iter().find(|w| w.type_ == "Degraded").unwrap();
        assert_eq!(
            (degraded.status, degraded.reason.as_str()),
            (false, "AsExpected")
        );
        let none = conds.iter().find(|w| w.type_ == "InWindow").unwrap();
        assert_eq!(none.reason, "NoWindow");
        assert_eq!(none.message, "no maintenance window: dry run only");
        // Enforce with no window and demand runs at any time: demand runs only.
        let demand_only = Situation {
            enforce: true,
            demand_anytime: true,
            ..s
        };
        let conds = conditions(&demand_only, None, false, "", None, None);
        let w = conds.iter().find(|w| w.type_ == "InWindow").unwrap();
        assert_eq!(
            (w.reason.as_str(), w.message.as_str()),
            ("NoWindow", "no maintenance window: demand runs only")
        );
    }

    #[test]
    fn status_is_written_only_when_more_than_timestamps_change() {
        let (report, _, one) = plans();
        let old = DefragPolicyStatus::default();
        let s = |now| Situation {
            now: at(now),
            ..situation(&old, &report, &one)
        };
        let a = status(
            &s("2026-12-04T02:30:00Z"),
            Vec::new(),
            Some(1),
            None,
            None,
            None,
        );
        let b = status(
            &s("2026-12-04T02:31:00Z"),
            Vec::new(),
            Some(1),
            None,
            None,
            None,
        );
        assert_ne!(a, b, "timestamps differ");
        assert!(!status_changed(&a, &b));
        let c = status(
            &s("2026-12-04T02:31:00Z"),
            Vec::new(),
            Some(2),
            None,
            None,
            None,
        );
        assert!(status_changed(&a, &c));
        assert_eq!(a.plan.as_ref().map(|p| p.total_moves), Some(1));
    }

    #[test]
    fn requeue_comes_right_after_the_next_window_opens_or_at_the_resync() {
        let policy = spec(json!({"windows": [{"schedule": "0 2 * * *", "duration": "1h"}]}));
        let (_, windows) = validate(&policy).unwrap();
        let soon = requeue_after(&windows, at("2026-12-04T01:59:50Z"));
        assert_eq!(soon, Duration::from_millis(10_200));
        assert_eq!(
            requeue_after(&windows, at("2026-12-04T00:00:00Z")),
            RESYNC + Duration::from_millis(200)
        );
        let (_, none) = validate(&spec(json!({}))).unwrap();
        assert_eq!(requeue_after(&none, at("2026-12-04T00:00:00Z")), RESYNC);
    }

    #[test]
    fn dry_run_or_suspend_stops_a_live_run_and_ends_a_recorded_one() {
        let (report, _, one) = plans();
        let open = Some(span("2026-12-04T02:00:00Z", "2026-12-04T03:00:00Z"));
        let with_run = DefragPolicyStatus {
            active_run: Some(RunRecord {
                id: "r1".into(),
                window_end: "2026-12-04T03:00:00Z".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let none = DefragPolicyStatus::default();
        let sit = |old, enforce, suspended| Situation {
            enforce,
            suspended,
            open,
            ..situation(old, &report, &one)
        };
        assert_eq!(
            run_decision(&sit(&with_run, false, false), true),
            RunDecision::Stop("the policy was switched to DryRun".into())
        );
        assert_eq!(
            run_decision(&sit(&with_run, true, true), true),
            RunDecision::Stop("the policy was suspended (spec.suspend)".into())
        );
        assert_eq!(
            run_decision(&sit(&with_run, true, false), true),
            RunDecision::Nothing
        );
        assert_eq!(
            run_decision(&sit(&with_run, true, true), false),
            RunDecision::Abandon(
                RunResult::Stopped,
                "stopped: the policy was suspended (spec.suspend); fences removed".into()
            )
        );
        // Suspended: no run starts, and Executing says why.
        assert_eq!(
            run_decision(&sit(&none, true, true), false),
            RunDecision::RemoveStaleFences
        );
        assert_eq!(
            why_not_executing(&sit(&none, true, true)),
            "suspended (spec.suspend): plan only"
        );
    }

    #[test]
    fn a_policy_over_no_gpu_node_says_so_once() {
        let empty = Cluster::default();
        let policy = Policy::default();
        let report = frag::report(&empty, &policy);
        let plan = gpu_defrag_core::plan::plan(&empty, &policy, None, &Default::default());
        let mut old = DefragPolicyStatus::default();
        let conds = {
            let s = situation(&old, &report, &plan);
            assert!(newly_without_gpu_nodes(&s));
            conditions(&s, None, false, "", None, None)
        };
        let degraded = conds.iter().find(|w| w.type_ == "Degraded").unwrap();
        assert_eq!(
            (degraded.status, degraded.reason.as_str()),
            (true, "NoGpuNodes")
        );
        assert!(degraded.message.contains("spec.nodeSelector"));
        old.conditions = status::conditions(&[], &conds, None, "2026-12-04T02:30:00Z");
        let s = Situation {
            now: at("2026-12-04T02:31:00Z"),
            ..situation(&old, &report, &plan)
        };
        assert!(!newly_without_gpu_nodes(&s), "announced once");
    }
}
