//! Pure helpers for the policy status: conditions with stable transition times, and the
//! bounded plan summary.
use gpu_defrag_api::v1alpha1::{Condition, FragmentationSummary, PlanSummary, PlannedMove};
use gpu_defrag_core::frag::Report;
use gpu_defrag_core::plan::Plan;

/// Moves listed in status at most (the totals cover the rest).
pub const MAX_STATUS_MOVES: usize = 50;
/// Runs kept in `lastRuns`.
pub const MAX_LAST_RUNS: usize = 5;
/// Evicted pod names kept in a run record.
pub const MAX_RECORDED_PODS: usize = 500;

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
                message: truncate(&w.message, 1024),
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

/// The bounded plan for status.
pub fn plan_summary(p: &Plan, now: &str) -> PlanSummary {
    PlanSummary {
        total_moves: p.moves.len() as i64,
        batches: p.batches.len() as i64,
        expected_fragment_rate: (p.after.fragment_rate * 10_000.0).round() / 10_000.0,
        expected_fully_free_gpus: p.after.fully_free_gpus as i64,
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
