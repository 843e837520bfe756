//! A run's bookkeeping and result, pure: what an eviction does to the run's record, why a
//! run stopped, its result and message, and the list of last runs.
use gpu_defrag_api::v1alpha1::{InFlightEviction, RunRecord};
use gpu_defrag_api::values::RunResult;
use gpu_defrag_core::plan::Move;

use crate::metrics::Eviction;
use crate::status::MAX_LAST_RUNS;

pub use gpu_defrag_core::run::Stop;

/// What the API server answered to one eviction.
#[derive(Clone, Debug, PartialEq)]
pub enum EvictionResult {
    /// Accepted: the pod is being evicted.
    Evicted,
    /// Refused with 429, a PodDisruptionBudget (the server's message).
    Blocked(String),
    /// The pod is gone already (404).
    Gone,
    /// Refused otherwise (the error).
    Refused(String),
    /// No answer (the connection broke, the server went away, the request timed out): it
    /// may have happened (the error).
    Unanswered(String),
}

impl EvictionResult {
    /// Whether the API server answered, so the eviction surely did not happen unless it
    /// says `Evicted`.
    pub fn answered(&self) -> bool {
        !matches!(
            self,
            EvictionResult::Evicted | EvictionResult::Unanswered(_)
        )
    }

    /// The `result` label of `gpu_defrag_evictions_total` (none for a pod already gone).
    pub fn metric(&self) -> Option<Eviction> {
        match self {
            EvictionResult::Evicted => Some(Eviction::Done),
            EvictionResult::Blocked(_) => Some(Eviction::Blocked),
            EvictionResult::Gone => None,
            EvictionResult::Refused(_) | EvictionResult::Unanswered(_) => Some(Eviction::Failed),
        }
    }
}

/// Counts an eviction in the record before it is asked for, as in flight: a crash in
/// between then counts one eviction too many against the limits, never one too few, and
/// the resumed run waits for its replacement.
pub fn count_eviction(rec: &mut RunRecord, m: &Move, in_flight: InFlightEviction) {
    rec.evicted += 1;
    rec.evicted_pods.push(m.pod.clone());
    *rec.evicted_per_node.entry(m.from_node.clone()).or_default() += 1;
    rec.in_flight.push(in_flight);
}

/// The replacement of `uid` is Ready (or no longer awaited): it is not in flight any more.
pub fn landed(rec: &mut RunRecord, uid: &str) {
    rec.in_flight.retain(|f| f.uid != uid);
}

/// An eviction recorded as in flight by an earlier process that never took effect (the
/// pod `key` with `uid` is still there, not terminating, on `node`): it no longer counts as
/// evicted, nor against the node's limit; it counts as failed.
pub fn not_evicted(rec: &mut RunRecord, key: &str, uid: &str, node: &str) {
    rec.in_flight.retain(|f| f.uid != uid);
    if let Some(i) = rec.evicted_pods.iter().rposition(|p| p == key) {
        rec.evicted_pods.remove(i);
        rec.evicted = rec.evicted.saturating_sub(1);
        if let Some(n) = rec.evicted_per_node.get_mut(node) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                rec.evicted_per_node.remove(node);
            }
        }
    }
    rec.failed += 1;
}

/// Settles the record once the API server's answer is known. `before` is the record as it
/// was before [`count_eviction`]: only an answer from the API server says the eviction did
/// not happen; without one it may have, so the record keeps it (the limits count it and a
/// resumed run never evicts the pod again).
pub fn account(rec: &mut RunRecord, before: RunRecord, result: &EvictionResult) {
    if result.answered() {
        *rec = before;
    }
    match result {
        EvictionResult::Blocked(_) => rec.blocked += 1,
        EvictionResult::Refused(_) | EvictionResult::Unanswered(_) => rec.failed += 1,
        EvictionResult::Evicted | EvictionResult::Gone => {}
    }
}

/// The result of a finished run and why.
/// `realised` is the fragment rate after the run without the pods that were queued at its
/// start (`None`: no verdict on the forecast).
pub fn result_of(
    stop: Option<&Stop>,
    rec: &RunRecord,
    realised: Option<f64>,
) -> (RunResult, String) {
    match stop {
        Some(Stop::WindowClosed) => (
            RunResult::WindowClosed,
            "the window closed; moves in flight were finished".to_string(),
        ),
        Some(Stop::Stalled(m)) => (RunResult::Stalled, m.clone()),
        Some(Stop::PendingPileUp(n)) => (
            RunResult::Stopped,
            format!("{n} GPU pods pending (more than safety.maxPendingGpuPods)"),
        ),
        Some(Stop::LostLeadership) => (RunResult::Aborted, "lost leadership".to_string()),
        Some(Stop::Requested(why)) => (RunResult::Stopped, format!("stopped: {why}")),
        None if rec.blocked + rec.failed + rec.bounced + rec.skipped > 0 => (
            RunResult::Partial,
            "some moves were blocked, failed, bounced or skipped".to_string(),
        ),
        None => match shortfall(rec, realised) {
            Some((forecast, realised)) => (
                RunResult::BenefitNotRealized,
                format!(
                    "every planned move done, but the fragment rate fell by {:.1} points (the \
                     pods queued at the start left out) where the plan forecast {:.1}",
                    realised * 100.0,
                    forecast * 100.0
                ),
            ),
            None => (RunResult::Succeeded, "every planned move done".to_string()),
        },
    }
}

/// Forecast drops smaller than this are noise: no shortfall is reported for them.
pub const MIN_FORECAST_DROP: f64 = 0.01;
/// A run realised its benefit when the fragment rate fell by at least this share of the
/// forecast drop.
pub const REALISED_SHARE: f64 = 0.5;

/// `(forecast drop, realised drop)` of the fragment rate when the run fell short of its
/// forecast by more than the margin ([`REALISED_SHARE`]); `None` when it did not, or when
/// there is no forecast or no measure (`after`) to hold it against.
pub fn shortfall(rec: &RunRecord, after: Option<f64>) -> Option<(f64, f64)> {
    let forecast = rec.fragment_rate_before - rec.expected_fragment_rate_after?;
    let realised = rec.fragment_rate_before - after?;
    (forecast >= MIN_FORECAST_DROP && realised < REALISED_SHARE * forecast)
        .then_some((forecast, realised))
}

/// The message of a finished run: why it ended (and why its plan was cut), its counts, and
/// the fragmentation before and after (the `fragment_rate_after` and
/// `fully_free_gpus_after` of `rec`).
pub fn message(why: &str, cut: Option<&str>, rec: &RunRecord) -> String {
    let why = match cut {
        Some(cut) => format!("{why}; {cut}"),
        None => why.to_string(),
    };
    let skipped = match rec.skipped {
        0 => String::new(),
        n => format!(", skipped {n}"),
    };
    let landed = match (rec.landed_as_planned, rec.landed_elsewhere) {
        (0, 0) => String::new(),
        (p, e) => format!(", landed as planned {p}, elsewhere {e}"),
    };
    format!(
        "{why}; evicted {}, blocked {}, bounced {}, failed {}{skipped}{landed}; fragment rate {:.3} → {:.3}, fully free GPUs {} → {}",
        rec.evicted,
        rec.blocked,
        rec.bounced,
        rec.failed,
        rec.fragment_rate_before,
        rec.fragment_rate_after.unwrap_or_default(),
        rec.fully_free_gpus_before,
        rec.fully_free_gpus_after.unwrap_or_default()
    )
}

/// The last runs with `rec` first (a record of the same run is replaced), at most
/// [`MAX_LAST_RUNS`].
pub fn last_runs(rec: &RunRecord, previous: &[RunRecord]) -> Vec<RunRecord> {
    let mut last = vec![rec.clone()];
    last.extend(
        previous
            .iter()
            .filter(|r| r.id != rec.id)
            .take(MAX_LAST_RUNS - 1)
            .cloned(),
    );
    last
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mv(pod: &str, node: &str) -> Move {
        Move {
            pod: pod.into(),
            pod_index: 0,
            from_node: node.into(),
            from_devices: Vec::new(),
            to_node: "n2".into(),
            to_devices: Vec::new(),
            batch: 0,
            reason: "test".into(),
        }
    }

    #[test]
    fn an_answered_refusal_is_not_counted_against_the_limits() {
        let mut rec = RunRecord::default();
        for (result, evicted, blocked, failed) in [
            (EvictionResult::Evicted, 1, 0, 0),
            (EvictionResult::Gone, 0, 0, 0),
            (EvictionResult::Blocked("pdb".into()), 0, 1, 0),
            (EvictionResult::Refused("403".into()), 0, 0, 1),
            // No answer: it may have happened, so it counts (and is never repeated).
            (EvictionResult::Unanswered("reset".into()), 1, 0, 1),
        ] {
            let before = rec.clone();
            let flight = InFlightEviction {
                pod: "ns/p".into(),
                uid: "u".into(),
                owner: "ReplicaSet/web".into(),
            };
            count_eviction(&mut rec, &mv("ns/p", "n1"), flight);
            account(&mut rec, before.clone(), &result);
            assert_eq!(
                rec.in_flight.len() as i64,
                rec.evicted - before.evicted,
                "in flight until it lands"
            );
            landed(&mut rec, "u");
            assert!(rec.in_flight.is_empty());
            assert_eq!(
                (
                    rec.evicted - before.evicted,
                    rec.blocked - before.blocked,
                    rec.failed - before.failed
                ),
                (evicted, blocked, failed),
                "{result:?}"
            );
            assert_eq!(
                rec.evicted_pods.len() as i64,
                rec.evicted,
                "names follow the count"
            );
            assert_eq!(
                rec.evicted_per_node.get("n1").copied().unwrap_or(0),
                rec.evicted
            );
        }
    }

    #[test]
    fn a_run_that_fell_short_of_its_forecast_says_so() {
        let run = |before: f64, forecast: Option<f64>| RunRecord {
            fragment_rate_before: before,
            expected_fragment_rate_after: forecast,
            fragment_rate_after: Some(0.9),
            ..Default::default()
        };
        // Forecast 0.50 → 0.10 (40 points): 0.25 realises 25 points (> half), 0.35 only 15.
        assert_eq!(
            result_of(None, &run(0.5, Some(0.1)), Some(0.25)).0,
            RunResult::Succeeded
        );
        let (r, why) = result_of(None, &run(0.5, Some(0.1)), Some(0.35));
        assert_eq!(r, RunResult::BenefitNotRealized);
        assert!(why.contains("15.0 points"), "{why}");
        assert!(why.contains("forecast 40.0"), "{why}");
        // Worse than before: short too.
        assert_eq!(
            result_of(None, &run(0.5, Some(0.1)), Some(0.6)).0,
            RunResult::BenefitNotRealized
        );
        // The verdict is on the realised rate (queued pods left out), not on the rate
        // after (0.9 here: the queue it served took the freed capacity).
        assert_eq!(
            result_of(None, &run(0.5, Some(0.1)), Some(0.1)).0,
            RunResult::Succeeded
        );
        // No forecast (a record of an older version), a negligible one, or no measure (a
        // resumed run): no verdict.
        assert_eq!(
            result_of(None, &run(0.5, None), Some(0.5)).0,
            RunResult::Succeeded
        );
        assert_eq!(
            result_of(None, &run(0.5, Some(0.495)), Some(0.5)).0,
            RunResult::Succeeded
        );
        assert_eq!(
            result_of(None, &run(0.5, Some(0.1)), None).0,
            RunResult::Succeeded
        );
        // A run that stopped or was partial keeps that result.
        let partial = RunRecord {
            blocked: 1,
            ..run(0.5, Some(0.1))
        };
        assert_eq!(result_of(None, &partial, Some(0.5)).0, RunResult::Partial);
    }

    #[test]
    fn a_run_ends_with_the_first_reason_to_stop_or_by_its_counts() {
        let clean = RunRecord::default();
        let bumpy = RunRecord {
            bounced: 1,
            ..Default::default()
        };
        assert_eq!(result_of(None, &clean, None).0, RunResult::Succeeded);
        assert_eq!(result_of(None, &bumpy, None).0, RunResult::Partial);
        let stalled = Stop::Stalled("the replacement of a/b was not Ready within 5s".into());
        assert_eq!(
            result_of(Some(&stalled), &bumpy, None),
            (
                RunResult::Stalled,
                "the replacement of a/b was not Ready within 5s".into()
            )
        );
        assert_eq!(
            result_of(Some(&Stop::PendingPileUp(7)), &clean, None).0,
            RunResult::Stopped
        );
        assert_eq!(
            result_of(Some(&Stop::WindowClosed), &clean, None).0,
            RunResult::WindowClosed
        );
        assert_eq!(
            result_of(Some(&Stop::LostLeadership), &clean, None).0,
            RunResult::Aborted
        );
        assert_eq!(
            result_of(
                Some(&Stop::Requested("the policy was deleted".into())),
                &bumpy,
                None
            ),
            (RunResult::Stopped, "stopped: the policy was deleted".into())
        );
    }

    #[test]
    fn the_message_names_the_cut_and_the_counts() {
        let rec = RunRecord {
            evicted: 3,
            blocked: 1,
            fragment_rate_before: 0.5,
            fully_free_gpus_before: 2,
            fragment_rate_after: Some(0.25),
            fully_free_gpus_after: Some(10),
            ..Default::default()
        };
        let m = message("done", Some("plan cut"), &rec);
        assert_eq!(
            m,
            "done; plan cut; evicted 3, blocked 1, bounced 0, failed 0; fragment rate 0.500 → 0.250, fully free GPUs 2 → 10"
        );
        let skipping = RunRecord { skipped: 2, ..rec };
        assert!(message("done", None, &skipping).contains("failed 0, skipped 2;"));
        assert_eq!(result_of(None, &skipping, None).0, RunResult::Partial);
    }

    #[test]
    fn last_runs_keep_the_newest_once_and_at_most_five() {
        let run = |id: &str| RunRecord {
            id: id.into(),
            ..Default::default()
        };
        let previous: Vec<RunRecord> = ["r", "a", "b", "c", "d", "e"].map(run).to_vec();
        let last = last_runs(&run("r"), &previous);
        let ids: Vec<&str> = last.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids, ["r", "a", "b", "c", "d"]);
    }
}
