//! Demand runs (docs/operator.md#demand-runs): a pending GPU pod, or a whole gang, that
//! has waited `demand.minWait` and fits no node gets a run of its own that makes room for
//! it now ([`gpu_defrag_core::plan::demand`]), and the room is held for it.
//!
//! This module decides (pure, over the reconcile's snapshot): which group to serve, the
//! plan, and the policy's `status.demand`. The executor carries the run out.
use std::collections::BTreeMap;

use chrono::{DateTime, Duration, Utc};
use gpu_defrag_api::v1alpha1::{
    DefragPolicyStatus, DemandRecord, DemandRun, DemandStatus, RunRecord,
};
use gpu_defrag_api::values::{DemandResult, RunResult};
use gpu_defrag_core::model::Cluster;
use gpu_defrag_core::plan::History;
use gpu_defrag_core::plan::demand::{
    DemandLimits, DemandOutcome, DemandPlan, plan_demand, waiting,
};
use gpu_defrag_core::policy::{DemandPolicy, Policy};
use gpu_defrag_core::run::Fate;

use crate::objects::{parse_ts, ts};

/// Most waiting groups one reconcile searches rooms for.
pub use gpu_defrag_core::plan::demand::GROUPS_PER_LOOK as GROUPS_PER_RECONCILE;
/// Records kept in `status.demand.recent`.
pub const RECENT: usize = 5;
/// A served pod's fate when it bound on its room (`status.activeRun.demand.served[]`).
pub const SERVED: &str = gpu_defrag_core::run::Fate::Served.as_str();
/// Pods one record names at most (a larger gang is shown by its first ones).
pub const MAX_SERVED: usize = 4;
/// Largest gang a demand run serves (its record lists every member).
pub use gpu_defrag_core::plan::demand::MAX_GANG;
/// Longest message of a record, bytes.
pub const MAX_MESSAGE: usize = 512;
/// A demand run outside the windows stops sending evictions after this long.
pub const OUTSIDE_WINDOW_RUN: Duration = Duration::hours(1);

/// A demand run to start.
#[derive(Debug, Clone, PartialEq)]
pub struct DemandStart {
    /// The plan and the rooms.
    pub plan: DemandPlan,
    /// Its record part.
    pub run: DemandRun,
    /// Since when the first served pod is unschedulable.
    pub since: DateTime<Utc>,
}

/// What one reconcile decides about demand.
#[derive(Debug, Clone, Default)]
pub struct Considered {
    /// The run to start, if any.
    pub start: Option<DemandStart>,
    /// `status.demand`.
    pub status: DemandStatus,
    /// Records new in this reconcile (for events on the pending pods): (pod keys, record).
    pub new_records: Vec<DemandRecord>,
    /// Groups waiting now.
    pub waiting: usize,
}

/// Whether a record is the demand run's.
fn is_demand(r: &RunRecord) -> bool {
    r.demand.is_some()
}

/// Evictions of demand runs started within the hour before `now` (the active run too).
pub fn evictions_last_hour(old: &DefragPolicyStatus, now: DateTime<Utc>) -> u32 {
    old.active_run
        .iter()
        .chain(&old.last_runs)
        .filter(|r| is_demand(r))
        .filter(|r| parse_ts(&r.started_at).is_some_and(|t| now - t < Duration::hours(1)))
        .map(|r| r.evicted.max(0) as u32)
        .sum()
}

/// The record of a demand run, as `status.demand.recent` shows it.
pub fn record_of_run(r: &RunRecord) -> Option<DemandRecord> {
    let d = r.demand.as_ref()?;
    let result = if r.result == RunResult::Running.as_str() {
        DemandResult::Running
    } else if !d.served.is_empty() && d.served.iter().all(|s| s == SERVED) {
        DemandResult::Served
    } else {
        DemandResult::Stalled
    };
    Some(DemandRecord {
        pods: d.pods.clone(),
        nodes: d.nodes.clone(),
        waited_seconds: d.waited_seconds,
        evictions: r.evicted,
        result: result.as_str().into(),
        message: r.message.clone(),
        at: r
            .finished_at
            .clone()
            .unwrap_or_else(|| r.started_at.clone()),
        run: Some(r.id.clone()),
    })
}

/// A record within its bounds ([`MAX_SERVED`] pods and nodes, [`MAX_MESSAGE`]).
pub fn bounded(mut r: DemandRecord) -> DemandRecord {
    r.pods.truncate(MAX_SERVED);
    r.nodes.truncate(MAX_SERVED);
    r.message = crate::status::truncate(&r.message, MAX_MESSAGE);
    r
}

/// `status.demand.recent`: the records of the runs still listed (fresh), the older
/// records kept as they were, and this reconcile's findings; a finding equal to the last
/// one for the same pods keeps its time (no status write for nothing new). Newest first.
fn compose(
    old: &DefragPolicyStatus,
    findings: &[DemandRecord],
) -> (Vec<DemandRecord>, Vec<DemandRecord>) {
    let prev: &[DemandRecord] = old.demand.as_ref().map_or(&[], |d| &d.recent);
    let runs: Vec<DemandRecord> = old
        .active_run
        .iter()
        .chain(&old.last_runs)
        .filter_map(record_of_run)
        .collect();
    let mut by_run: BTreeMap<String, DemandRecord> = BTreeMap::new();
    let mut out: Vec<DemandRecord> = Vec::new();
    for r in prev {
        match &r.run {
            Some(id) => {
                by_run.insert(id.clone(), r.clone());
            }
            // Findings for pods served since, or found again below, are dropped.
            None => {
                if !findings.iter().any(|f| f.pods == r.pods)
                    && !runs.iter().any(|x| x.pods == r.pods)
                {
                    out.push(r.clone());
                }
            }
        }
    }
    for r in runs {
        by_run.insert(r.run.clone().unwrap_or_default(), r);
    }
    out.extend(by_run.into_values());
    let mut new_records = Vec::new();
    for f in findings {
        match prev
            .iter()
            .find(|r| r.run.is_none() && r.pods == f.pods && r.result == f.result)
        {
            Some(same) if same.message == f.message => out.push(same.clone()),
            _ => {
                out.push(f.clone());
                new_records.push(f.clone());
            }
        }
    }
    out.sort_by(|a, b| b.at.cmp(&a.at).then(a.pods.cmp(&b.pods)));
    out.truncate(RECENT);
    (out.into_iter().map(bounded).collect(), new_records)
}

/// Decides about demand for one reconcile. `may_start`: the policy may start a run now
/// (Enforce, not suspended, no conflict, no run alive or recorded, and a window open or
/// `outsideWindows`).
pub fn consider(
    d: &DemandPolicy,
    policy: &Policy,
    cluster: &Cluster,
    old: &DefragPolicyStatus,
    now: DateTime<Utc>,
    may_start: bool,
) -> Considered {
    let min_wait = Duration::from_std(d.min_wait).unwrap_or(Duration::MAX);
    let groups = waiting(cluster, policy, now, min_wait);
    let spent = evictions_last_hour(old, now);
    let allowance = d.allowance(spent);
    let since = |g: &[usize]| {
        g.iter()
            .filter_map(|&i| cluster.pods[i].unschedulable_since)
            .min()
            .unwrap_or(now)
    };
    let keys = |g: &[usize]| -> Vec<String> { g.iter().map(|&i| cluster.pods[i].key()).collect() };
    let mut findings = Vec::new();
    let mut start = None;
    if may_start {
        for g in groups.iter().take(GROUPS_PER_RECONCILE) {
            let waited = (now - since(g)).num_seconds().max(0);
            let finding = |result: &str, message: String| DemandRecord {
                pods: keys(g),
                nodes: Vec::new(),
                waited_seconds: waited,
                evictions: 0,
                result: result.into(),
                message,
                at: ts(now),
                run: None,
            };
            if g.len() > MAX_GANG {
                findings.push(finding(
                    DemandOutcome::NoRoom.as_str(),
                    format!(
                        "a gang of {} pending pods: demand runs serve gangs of at most {MAX_GANG}",
                        g.len()
                    ),
                ));
                continue;
            }
            let Some(max_evictions) = allowance else {
                findings.push(finding(
                    DemandOutcome::BudgetSpent.as_str(),
                    format!(
                        "demand runs spent their {} evictions of the last hour \
                         (demand.maxEvictionsPerHour)",
                        d.max_evictions_per_hour
                    ),
                ));
                continue;
            };
            let limits = DemandLimits {
                max_evictions,
                ..DemandLimits::default()
            };
            let plan = plan_demand(cluster, policy, Some(now), &History::default(), g, &limits);
            match plan.outcome {
                DemandOutcome::Planned if !plan.plan.moves.is_empty() => {
                    let run = DemandRun {
                        pods: plan.rooms.iter().map(|r| r.pod_key.clone()).collect(),
                        uids: plan
                            .rooms
                            .iter()
                            .map(|r| cluster.pods[r.pod].uid.clone())
                            .collect(),
                        nodes: plan.rooms.iter().map(|r| r.node_name.clone()).collect(),
                        waited_seconds: waited,
                        served: vec![Fate::Binding.as_str().into(); plan.rooms.len()],
                    };
                    start = Some(DemandStart {
                        plan,
                        run,
                        since: since(g),
                    });
                    break;
                }
                // Every member fits as it is: the scheduler places it without a run.
                DemandOutcome::Planned => {}
                o => findings.push(finding(o.as_str(), plan.why)),
            }
        }
    }
    let (recent, new_records) = compose(old, &findings);
    Considered {
        start,
        status: DemandStatus {
            waiting: groups.len() as i64,
            evictions_last_hour: i64::from(spent),
            recent,
        },
        new_records,
        waiting: groups.len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(id: &str, started: &str, evicted: i64, result: &str, served: &[&str]) -> RunRecord {
        RunRecord {
            id: id.into(),
            started_at: started.into(),
            result: result.into(),
            evicted,
            demand: Some(DemandRun {
                pods: vec!["ml/train".into()],
                uids: vec!["u".into()],
                nodes: vec!["n0".into()],
                waited_seconds: 600,
                served: served.iter().map(|s| s.to_string()).collect(),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn the_hourly_allowance_counts_demand_runs_of_the_last_hour_only() {
        let now = parse_ts("2026-01-01T12:00:00Z").unwrap();
        let mut window_run = run("w", "2026-01-01T11:30:00Z", 9, "Succeeded", &[]);
        window_run.demand = None;
        let old = DefragPolicyStatus {
            active_run: Some(run("a", "2026-01-01T11:59:00Z", 2, "Running", &["Binding"])),
            last_runs: vec![
                window_run,
                run("b", "2026-01-01T11:10:00Z", 3, "Succeeded", &[SERVED]),
                run("c", "2026-01-01T10:59:00Z", 5, "Succeeded", &[SERVED]),
            ],
            ..Default::default()
        };
        assert_eq!(evictions_last_hour(&old, now), 5);
    }

    #[test]
    fn run_records_say_served_only_when_every_pod_bound_on_its_room() {
        let r = |served: &[&str], result: &str| {
            record_of_run(&run("x", "2026-01-01T11:00:00Z", 3, result, served))
                .unwrap()
                .result
        };
        assert_eq!(r(&[SERVED], "Succeeded"), "Served");
        assert_eq!(r(&["Binding"], "Stalled"), "Stalled");
        assert_eq!(r(&[SERVED, "Binding"], "Stopped"), "Stalled");
        assert_eq!(r(&["Binding"], "Running"), "Running");
        let mut plain = run("y", "2026-01-01T11:00:00Z", 3, "Succeeded", &[]);
        plain.demand = None;
        assert!(record_of_run(&plain).is_none());
    }

    #[test]
    fn an_unchanged_finding_keeps_its_time_and_is_not_new() {
        let f = |at: &str, msg: &str| DemandRecord {
            pods: vec!["ml/train".into()],
            result: "NoRoom".into(),
            message: msg.into(),
            at: at.into(),
            ..Default::default()
        };
        let old = DefragPolicyStatus {
            demand: Some(DemandStatus {
                recent: vec![f("2026-01-01T10:00:00Z", "no room")],
                ..Default::default()
            }),
            ..Default::default()
        };
        let (recent, new) = compose(&old, &[f("2026-01-01T11:00:00Z", "no room")]);
        assert_eq!(recent.len(), 1);
        assert_eq!(recent[0].at, "2026-01-01T10:00:00Z");
        assert!(new.is_empty());
        let (recent, new) = compose(&old, &[f("2026-01-01T11:00:00Z", "other")]);
        assert_eq!(recent.len(), 1);
        assert_eq!(recent[0].message, "other");
        assert_eq!(new.len(), 1);
        // A run for the same pods replaces the finding.
        let old2 = DefragPolicyStatus {
            last_runs: vec![run("r", "2026-01-01T11:30:00Z", 3, "Succeeded", &[SERVED])],
            ..old
        };
        let (recent, _) = compose(&old2, &[]);
        assert_eq!(recent.len(), 1);
        assert_eq!(recent[0].result, DemandResult::Served.as_str());
        assert_eq!(recent[0].run.as_deref(), Some("r"));
    }
}
