//! Pure helpers for the policy status: conditions with stable transition times, and the
//! bounded plan summary and run records.
//!
//! The status must stay small whatever the cluster size (etcd refuses objects over
//! 1.5 MiB): every list in it is capped by one of the constants below, and each cap sits
//! next to an explicit total (`plan.totalMoves`, a run's `planned`/`evicted`), so a large
//! plan or run is summarised, never cut silently. The sum of the caps keeps the status
//! under [`MAX_STATUS_BYTES`] (checked by a test on a worst-case status).
use gpu_defrag_api::v1alpha1::{
    Condition, FragmentationSummary, IdleAllocatedPod, IdleAllocatedSummary, PlanSummary,
    PlannedMove, RunRecord,
};
use gpu_defrag_api::values::{ConditionType, Reason};
use gpu_defrag_core::frag::{IdleAllocated, Report};
use gpu_defrag_core::plan::Plan;

/// Size the serialized policy status stays under (etcd's limit is 1.5 MiB per object).
pub const MAX_STATUS_BYTES: usize = 256 * 1024;
/// Moves listed in status at most (`plan.totalMoves` counts them all).
pub const MAX_STATUS_MOVES: usize = 50;
/// Runs kept in `lastRuns`.
pub const MAX_LAST_RUNS: usize = 5;
/// Size the active run record stays under. It lists every pod the run evicted (so a
/// restarted operator never repeats an eviction), every source node's count (per-node
/// limits hold across a restart) and every fenced node and GPU; a plan whose record would not fit
/// is cut to its first batches that do ([`batches_within_record`]), and the run says so.
pub const MAX_ACTIVE_RUN_BYTES: usize = 48 * 1024;
/// Evicted pod names kept in a finished run in `lastRuns` (its `evicted` counts them all).
pub const MAX_FINISHED_RUN_PODS: usize = 20;
/// Fences (nodes, then GPUs) and per-node eviction counts kept in a finished run (the
/// nodes with the most evictions first).
pub const MAX_FINISHED_RUN_NODES: usize = 20;
/// Idle pods listed in `idleAllocated.idlePods` at most (`idleAllocated.pods` counts them
/// all).
pub const MAX_STATUS_IDLE_PODS: usize = 20;
/// Longest condition or run message, in bytes.
pub const MAX_MESSAGE_BYTES: usize = 1024;

/// A condition to set: type, status, reason, message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Want {
    /// Type.
    pub type_: &'static str,
    /// True/False/Unknown.
    pub status: bool,
    /// PascalCase reason.
    pub reason: String,
    /// Message.
    pub message: String,
}

impl Want {
    /// A condition of a known type with a known reason.
    pub fn of(
        type_: ConditionType,
        status: bool,
        reason: Reason,
        message: impl Into<String>,
    ) -> Self {
        Want::new(type_.as_str(), status, reason.as_str(), message)
    }

    /// Shorthand.
    pub fn new(
        type_: &'static str,
        status: bool,
        reason: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Want {
            type_,
            status,
            reason: reason.into(),
            message: message.into(),
        }
    }
}

/// New conditions from the wanted ones: `lastTransitionTime` changes only when the
/// status flips; `observedGeneration` is set on every condition.
pub fn conditions(
    old: &[Condition],
    wanted: &[Want],
    generation: Option<i64>,
    now: &str,
) -> Vec<Condition> {
    wanted
        .iter()
        .map(|w| {
            let status = if w.status { "True" } else { "False" }.to_string();
            let prev = old.iter().find(|c| c.type_ == w.type_);
            let last = match prev {
                Some(p) if p.status == status => p.last_transition_time.clone(),
                _ => now.to_string(),
            };
            Condition {
                type_: w.type_.to_string(),
                status,
                reason: w.reason.clone(),
                message: truncate(&w.message, MAX_MESSAGE_BYTES),
                last_transition_time: last,
                observed_generation: generation,
            }
        })
        .collect()
}

/// Cuts a message to `max` bytes on a char boundary.
pub fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        s.to_string()
    } else {
        format!("{}…", &s[..s.floor_char_boundary(max)])
    }
}

/// The fragmentation summary for status.
pub fn summary(r: &Report, now: &str) -> FragmentationSummary {
    FragmentationSummary {
        fragment_rate: (r.fragment_rate * 10_000.0).round() / 10_000.0,
        fragment_milli: r.fragment_milli as i64,
        idle_milli: r.idle_milli as i64,
        gpus: r.gpus as i64,
        fully_free_gpus: r.fully_free_gpus as i64,
        fully_free_nodes: r.fully_free_nodes as i64,
        stranded_milli: r.stranded_milli as i64,
        unknown_pods: r.unknown_pods as i64,
        pending_unplaceable: r.pending_unplaceable as i64,
        nodes: r.nodes_counted as i64,
        observed_at: now.to_string(),
    }
}

/// The bounded allocated-but-idle summary for status: the [`MAX_STATUS_IDLE_PODS`] idle
/// pods holding the most milli, with exact totals.
pub fn idle_summary(
    r: &IdleAllocated,
    threshold: f64,
    lookback: &str,
    observed_at: &str,
) -> IdleAllocatedSummary {
    IdleAllocatedSummary {
        pods: r.pods as i64,
        gpus: r.gpus as i64,
        milli: r.milli as i64,
        gpu_pods: r.gpu_pods as i64,
        measured_pods: r.measured_pods as i64,
        threshold,
        lookback: lookback.to_string(),
        idle_pods: r
            .idle
            .iter()
            .take(MAX_STATUS_IDLE_PODS)
            .map(|p| IdleAllocatedPod {
                pod: p.pod.clone(),
                node: p.node.clone(),
                gpus: i64::from(p.gpus),
                milli: p.milli as i64,
                peak_activity: (p.peak * 10_000.0).round() / 10_000.0,
            })
            .collect(),
        observed_at: observed_at.to_string(),
    }
}

/// The bounded plan for status.
pub fn plan_summary(p: &Plan, now: &str) -> PlanSummary {
    PlanSummary {
        total_moves: p.moves.len() as i64,
        batches: p.batches.len() as i64,
        expected_fragment_rate: (p.after.fragment_rate * 10_000.0).round() / 10_000.0,
        expected_fully_free_gpus: p.after.fully_free_gpus as i64,
        expected_fully_free_nodes: p.after.fully_free_nodes as i64,
        moves: p
            .moves
            .iter()
            .take(MAX_STATUS_MOVES)
            .map(|m| PlannedMove {
                pod: m.pod.clone(),
                from_node: m.from_node.clone(),
                from_devices: m.from_devices.clone(),
                to_node: m.to_node.clone(),
                to_devices: m.to_devices.clone(),
                batch: m.batch as i64,
                reason: m.reason.clone(),
            })
            .collect(),
        dry_run_check: None,
        computed_at: now.to_string(),
    }
}

/// How many of `plan`'s leading batches a run can take so that its record, `rec` with
/// every pod of those batches evicted and their nodes counted and fenced, stays under
/// [`MAX_ACTIVE_RUN_BYTES`]. The estimate is from above: each name costs its bytes plus
/// JSON quotes and separators, each per-node count the longest number.
pub fn batches_within_record(rec: &RunRecord, plan: &Plan, in_flight_max: usize) -> usize {
    // The counters may grow to their widest while the run goes on; up to `in_flight_max`
    // evictions are listed as in flight at once.
    const SLACK: usize = 256;
    const IN_FLIGHT_ENTRY: usize = 200;
    let mut bytes = serde_json::to_vec(rec).map_or(usize::MAX, |v| v.len())
        + SLACK
        + in_flight_max * IN_FLIGHT_ENTRY;
    let mut counted: std::collections::BTreeSet<&str> =
        rec.evicted_per_node.keys().map(String::as_str).collect();
    let mut fenced: std::collections::BTreeSet<&str> =
        rec.fenced_nodes.iter().map(String::as_str).collect();
    let mut fenced_gpus: std::collections::BTreeSet<(&str, &str)> = rec
        .fenced_devices
        .iter()
        .map(|d| (d.node.as_str(), d.gpu.as_str()))
        .collect();
    let mut moves = plan.moves.iter().peekable();
    for (i, b) in plan.batches.iter().enumerate() {
        if let Some(node) = b.fenced_node()
            && fenced.insert(node)
        {
            bytes += node.len() + 3;
        }
        if let (Some(gpu), true) = (b.gpu.as_deref(), b.fenced_device().is_some())
            && fenced_gpus.insert((b.node.as_str(), gpu))
        {
            // {"node":"…","gpu":"…"}, and ,"driver":"…","pool":"…" for a DRA device.
            bytes += b.node.len() + gpu.len() + 20;
            if let Some(d) = &b.dra_device {
                bytes += d.driver.len() + d.pool.len() + 22;
            }
        }
        while let Some(m) = moves.next_if(|m| m.batch == i) {
            bytes += m.pod.len() + 3;
            if counted.insert(&m.from_node) {
                bytes += m.from_node.len() + 3 + 1 + 20;
            }
        }
        if bytes > MAX_ACTIVE_RUN_BYTES {
            return i;
        }
    }
    plan.batches.len()
}

/// `lastRuns` as written: the newest [`MAX_LAST_RUNS`] runs, each compacted. Only the
/// active run is read back for limits and resumption, so a finished run keeps its counts
/// (`planned`, `evicted`, …) in full but only the first [`MAX_FINISHED_RUN_PODS`] pod
/// names, the first [`MAX_FINISHED_RUN_NODES`] fences and the [`MAX_FINISHED_RUN_NODES`]
/// nodes with the most evictions.
pub fn finished_runs(runs: &[RunRecord]) -> Vec<RunRecord> {
    runs.iter()
        .take(MAX_LAST_RUNS)
        .map(|r| {
            let mut r = r.clone();
            r.evicted_pods.truncate(MAX_FINISHED_RUN_PODS);
            r.fenced_nodes.truncate(MAX_FINISHED_RUN_NODES);
            // One budget for both kinds of fence: nodes first, then GPUs.
            r.fenced_devices
                .truncate(MAX_FINISHED_RUN_NODES.saturating_sub(r.fenced_nodes.len()));
            if r.evicted_per_node.len() > MAX_FINISHED_RUN_NODES {
                let mut by_count: Vec<(String, i64)> = std::mem::take(&mut r.evicted_per_node)
                    .into_iter()
                    .collect();
                by_count.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
                by_count.truncate(MAX_FINISHED_RUN_NODES);
                r.evicted_per_node = by_count.into_iter().collect();
            }
            r.message = truncate(&r.message, MAX_MESSAGE_BYTES);
            r.in_flight.clear();
            r
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transition_time_moves_only_on_flips() {
        let first = conditions(
            &[],
            &[Want::new("Ready", true, "Reconciled", "ok")],
            Some(1),
            "t1",
        );
        assert_eq!(first[0].last_transition_time, "t1");
        let same = conditions(
            &first,
            &[Want::new("Ready", true, "Reconciled", "still ok")],
            Some(2),
            "t2",
        );
        assert_eq!(same[0].last_transition_time, "t1");
        assert_eq!(same[0].observed_generation, Some(2));
        let flip = conditions(
            &same,
            &[Want::new("Ready", false, "InvalidSpec", "bad")],
            Some(3),
            "t3",
        );
        assert_eq!(
            (
                flip[0].status.as_str(),
                flip[0].last_transition_time.as_str()
            ),
            ("False", "t3")
        );
    }

    #[test]
    fn truncation_respects_char_boundaries() {
        let s = "é".repeat(600);
        let t = truncate(&s, 1001);
        assert!(t.len() <= 1004);
        assert!(t.ends_with('…'));
    }
}

#[cfg(test)]
mod bounds {
    use std::collections::BTreeMap;

    use gpu_defrag_api::v1alpha1::{
        DefragPolicyStatus, DryRunCheck, FencedDevice as ApiFencedDevice, WindowTimes,
    };
    use gpu_defrag_core::frag::Totals;
    use gpu_defrag_core::plan::{Batch, DraDevice, FencedDevice, Move, UnitKind};

    use super::*;

    /// A name of exactly `len` bytes ending in `i` (so names differ).
    fn name(prefix: &str, i: usize, len: usize) -> String {
        let tail = format!("-{i}");
        format!(
            "{prefix}{}{tail}",
            "x".repeat(len - prefix.len() - tail.len())
        )
    }

    /// The longest names Kubernetes accepts: 63-byte namespaces, 253-byte pod and node
    /// names; 40-byte GPU UUIDs.
    fn pod_key(i: usize) -> String {
        format!("{}/{}", name("tenant", i % 1000, 63), name("pod", i, 253))
    }

    fn node_name(i: usize) -> String {
        name("node", i, 253)
    }

    fn gpu(i: usize) -> String {
        name("GPU-", i, 40)
    }

    fn huge_plan(moves: usize) -> Plan {
        Plan {
            before: Totals::default(),
            after: Totals::default(),
            moves: (0..moves)
                .map(|i| Move {
                    pod: pod_key(i),
                    pod_index: i,
                    from_node: node_name(i / 4),
                    from_devices: vec![gpu(2 * i), gpu(2 * i + 1)],
                    to_node: node_name(i + 1),
                    to_devices: vec![gpu(2 * i + 2), gpu(2 * i + 3)],
                    batch: i / 4,
                    reason: format!("empty node {}", node_name(i)),
                })
                .collect(),
            batches: (0..moves / 4)
                // Node drains and single-GPU drains of HAMi nodes, in turn.
                .map(|i| Batch {
                    kind: if i % 2 == 0 {
                        UnitKind::Node
                    } else {
                        UnitKind::Gpu
                    },
                    node: node_name(i),
                    gpu: (i % 2 == 1).then(|| gpu(i)),
                    device_fence: i % 2 == 1,
                    // Every other single GPU is a DRA device (its rule's selector recorded).
                    dra_device: (i % 4 == 3).then(|| DraDevice {
                        driver: "gpu.nvidia.com".into(),
                        pool: node_name(i),
                    }),
                    moves: 4,
                    gain_milli: 1000.0,
                    after: Totals::default(),
                })
                .collect(),
            skipped: (0..5_000).map(|i| (name("reason", i, 60), 1)).collect(),
            shapes: vec![],
            fenced_nodes: (0..moves / 4).step_by(2).map(node_name).collect(),
            fenced_devices: (1..moves / 4)
                .step_by(2)
                .map(|i| FencedDevice {
                    node: node_name(i),
                    gpu: gpu(i),
                    dra: (i % 4 == 3).then(|| DraDevice {
                        driver: "gpu.nvidia.com".into(),
                        pool: node_name(i),
                    }),
                })
                .collect(),
            pending_served: (0..moves).map(pod_key).collect(),
            unchecked: Vec::new(),
            settling_nodes: Vec::new(),
            skipped_pods: Vec::new(),
        }
    }

    /// A run that evicted `n` pods, each from its own node.
    fn run(id: usize, n: usize) -> RunRecord {
        RunRecord {
            id: format!("run-{id}"),
            started_at: "2026-01-01T00:00:00Z".into(),
            finished_at: Some("2026-01-01T01:00:00Z".into()),
            window_end: "2026-01-01T02:00:00Z".into(),
            result: "Partial".into(),
            message: "m".repeat(100_000),
            fenced_nodes: (0..n).map(node_name).collect(),
            fenced_devices: (0..n)
                .map(|i| ApiFencedDevice {
                    node: node_name(i),
                    gpu: gpu(i),
                    ..Default::default()
                })
                .collect(),
            planned: 20_000,
            evicted: n as i64,
            evicted_pods: (0..n).map(pod_key).collect(),
            evicted_per_node: (0..n).map(|i| (node_name(i), 1 + (i % 7) as i64)).collect(),
            fragment_rate_before: 0.5,
            fragment_rate_after: Some(0.1),
            ..Default::default()
        }
    }

    #[test]
    fn a_worst_case_status_stays_under_the_bound_and_counts_what_it_omits() {
        let plan = huge_plan(20_000);
        let mut summary = plan_summary(&plan, "2026-01-01T00:00:00Z");
        summary.dry_run_check = Some(DryRunCheck {
            allowed: 10,
            blocked: 10,
            failed: 0,
            blocked_pods: (0..10)
                .map(|i| truncate(&"b".repeat(1000), 200 + i))
                .collect(),
        });
        // The status counts skipped pods by reason code; at most one entry per code.
        let skipped: BTreeMap<String, i64> = plan
            .skipped
            .iter()
            .take(32)
            .map(|(k, v)| (k.clone(), *v as i64))
            .collect();
        let wanted: Vec<Want> = ["Ready", "InWindow", "Executing", "Degraded", "Conflict"]
            .into_iter()
            .map(|t| Want::new(t, false, "SomeReason", "why ".repeat(100_000)))
            .collect();
        // Finished runs of 500 evictions from 500 nodes each.
        let runs: Vec<RunRecord> = (0..MAX_LAST_RUNS + 3).map(|i| run(i, 500)).collect();
        // The active run took the part of the huge plan its record holds, and did it all.
        let mut active = run(99, 0);
        active.finished_at = None;
        active.message.clear();
        let fit = batches_within_record(&active, &plan, 1);
        assert!(fit > 0 && fit < plan.batches.len(), "cut at {fit}");
        let taken = plan.first_batches(fit);
        active.fenced_nodes = taken.fenced_nodes.clone();
        active.fenced_devices = taken
            .fenced_devices
            .iter()
            .map(crate::executor::fences::recorded)
            .collect();
        assert!(!active.fenced_devices.is_empty());
        for m in &taken.moves {
            active.evicted_pods.push(m.pod.clone());
            *active
                .evicted_per_node
                .entry(m.from_node.clone())
                .or_default() += 1;
        }
        // The widest counters.
        (active.evicted, active.blocked, active.failed) = (i64::MAX, i64::MAX, i64::MAX);
        for v in active.evicted_per_node.values_mut() {
            *v = i64::MAX;
        }
        let active_bytes = serde_json::to_vec(&active).unwrap().len();
        assert!(
            active_bytes <= MAX_ACTIVE_RUN_BYTES,
            "active run {active_bytes} bytes"
        );
        // One batch more would not have fit.
        let more = plan.first_batches(fit + 1);
        let more_bytes: usize = more.moves[taken.moves.len()..]
            .iter()
            .map(|m| m.pod.len() + m.from_node.len() + 6)
            .sum();
        assert!(active_bytes + more_bytes > MAX_ACTIVE_RUN_BYTES - 1024);
        let status = DefragPolicyStatus {
            conditions: conditions(&[], &wanted, Some(1), "2026-01-01T00:00:00Z"),
            observed_generation: Some(1),
            fragmentation: Some(FragmentationSummary::default()),
            plan: Some(summary),
            next_window: Some(WindowTimes::default()),
            active_run: Some(active),
            last_runs: finished_runs(&runs),
            skipped,
            idle_allocated: Some(idle_summary(
                &IdleAllocated {
                    pods: 20_000,
                    gpus: 20_000,
                    milli: 20_000_000,
                    gpu_pods: 40_000,
                    measured_pods: 40_000,
                    idle: (0..20_000)
                        .map(|i| gpu_defrag_core::frag::IdlePod {
                            pod: pod_key(i),
                            node: node_name(i),
                            pod_index: i,
                            gpus: 8,
                            milli: 8000,
                            peak: 0.1234567,
                        })
                        .collect(),
                },
                0.3,
                "4h",
                "2026-01-01T00:00:00Z",
            )),
            // Demand records at their bound: 10, each for a gang of 16 long names with
            // the longest message.
            demand: Some(gpu_defrag_api::v1alpha1::DemandStatus {
                waiting: 1000,
                evictions_last_hour: 64,
                recent: (0..crate::demand::RECENT)
                    .map(|i| gpu_defrag_api::v1alpha1::DemandRecord {
                        pods: (0..crate::demand::MAX_SERVED).map(pod_key).collect(),
                        nodes: (0..crate::demand::MAX_SERVED).map(node_name).collect(),
                        waited_seconds: 86_400,
                        evictions: 16,
                        result: "NoRoom".into(),
                        message: "x".repeat(crate::demand::MAX_MESSAGE + 100),
                        at: "2026-01-01T00:00:00Z".into(),
                        run: Some(format!("run-{i}")),
                    })
                    .map(crate::demand::bounded)
                    .collect(),
            }),
        };
        let bytes = serde_json::to_vec(&status).unwrap().len();
        eprintln!(
            "worst-case status: {bytes} bytes; active run: {} evictions in {fit} batches, {active_bytes} bytes",
            taken.moves.len()
        );
        assert!(
            bytes < MAX_STATUS_BYTES,
            "status is {bytes} bytes, bound {MAX_STATUS_BYTES}"
        );
        // Summarised, not cut silently: totals beside every capped list.
        let p = status.plan.as_ref().unwrap();
        assert_eq!(p.total_moves, 20_000);
        assert_eq!(p.moves.len(), MAX_STATUS_MOVES);
        assert_eq!(p.batches, 5_000);
        assert_eq!(status.last_runs.len(), MAX_LAST_RUNS);
        for r in &status.last_runs {
            assert_eq!(r.evicted, 500);
            assert_eq!(r.planned, 20_000);
            assert_eq!(r.evicted_pods.len(), MAX_FINISHED_RUN_PODS);
            assert_eq!(r.evicted_per_node.len(), MAX_FINISHED_RUN_NODES);
            assert!(
                r.evicted_per_node.values().all(|v| *v == 7),
                "busiest nodes kept"
            );
            assert!(r.message.len() <= MAX_MESSAGE_BYTES + 3);
        }
        assert_eq!(status.last_runs[0].id, "run-0", "newest first, kept");
        let idle = status.idle_allocated.as_ref().unwrap();
        assert_eq!(
            (idle.pods, idle.idle_pods.len()),
            (20_000, MAX_STATUS_IDLE_PODS)
        );
        assert_eq!(idle.idle_pods[0].peak_activity, 0.1235);
        assert!(
            status
                .conditions
                .iter()
                .all(|c| c.message.len() <= MAX_MESSAGE_BYTES + 3)
        );
    }

    #[test]
    fn small_runs_are_kept_whole() {
        let r = run(1, 3);
        let out = finished_runs(std::slice::from_ref(&r));
        assert_eq!(out[0].evicted_pods, r.evicted_pods);
        assert_eq!(out[0].evicted_per_node, r.evicted_per_node);
        assert_eq!(out[0].fenced_nodes, r.fenced_nodes);
    }
}
