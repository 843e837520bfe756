//! The exact comparison's report: each planner's share of the optimum per workload, as
//! Markdown, with the verdict on landing control.

use std::fmt::Write as _;

use anyhow::{Context, Result};

use super::{AS_PLANNED, InstanceResult, rows};
use crate::matrix::median;

/// A planner's share of the optimum on an instance: its drop over the optimum's (1 when
/// the optimum drops nothing and neither does the planner).
pub fn share(drop: f64, optimum: f64) -> f64 {
    if optimum <= 1e-12 {
        if drop <= 1e-12 { 1.0 } else { f64::INFINITY }
    } else {
        drop / optimum
    }
}

/// The summary per workload and planner, as Markdown.
pub fn markdown(results: &[InstanceResult], target: f64) -> Result<String> {
    let mut md = String::new();
    writeln!(
        md,
        "| workload | planner | instances | share of optimum, median | min | max | solved to optimality | pending (instances) | drop (pp), median |"
    )?;
    writeln!(md, "|---|---|---:|---:|---:|---:|---:|---:|---:|")?;
    let mut workloads: Vec<&str> = results.iter().map(|r| r.workload.as_str()).collect();
    workloads.dedup();
    let mut verdicts = String::new();
    for w in workloads {
        let rs: Vec<&InstanceResult> = results.iter().filter(|r| r.workload == w).collect();
        let wl = Workload {
            w,
            n: rs.len(),
            proven: rs.iter().filter(|r| r.solved.optimal).count(),
        };
        planner_rows(&mut md, &mut verdicts, &wl, &rs, target)?;
        reference_rows(&mut md, &wl, &rs)?;
    }
    writeln!(md)?;
    writeln!(md, "{}", instances_line(results))?;
    writeln!(md)?;
    write!(md, "{verdicts}")?;
    Ok(md)
}

/// One workload of the table: its name, instances, instances proved optimal.
struct Workload<'a> {
    w: &'a str,
    n: usize,
    proven: usize,
}

impl Workload<'_> {
    /// One row of the table.
    fn row(&self, name: &str, shares: Vec<f64>, pending: usize, drops: Vec<f64>) -> String {
        let Workload { w, n, proven } = self;
        let min = shares.iter().copied().fold(f64::INFINITY, f64::min);
        let max = shares.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        format!(
            "| {w} | {name} | {n} | {:.1}% | {:.1}% | {:.1}% | {proven}/{n} | {pending} | {:.2} |",
            100.0 * median(shares),
            100.0 * min,
            100.0 * max,
            100.0 * median(drops)
        )
    }
}

/// Every planner's row of one workload (in [`rows`] order), and the verdict on landing
/// control into `verdicts` at its row.
fn planner_rows(
    md: &mut String,
    verdicts: &mut String,
    wl: &Workload,
    rs: &[&InstanceResult],
    target: f64,
) -> Result<()> {
    let mut med_sched = f64::NAN;
    for name in rows() {
        let mut shares = Vec::new();
        let mut drops = Vec::new();
        let mut pending = 0;
        for r in rs {
            let p = r
                .planners
                .iter()
                .find(|p| p.planner == name)
                .context("planner missing")?;
            shares.push(share(p.drop, r.optimum_drop));
            drops.push(p.drop);
            pending += usize::from(p.pending > 0);
        }
        if name == "gpu-defrag" {
            med_sched = median(shares.clone());
        }
        if name == AS_PLANNED {
            write_verdict(verdicts, wl, &shares, med_sched, target)?;
        }
        writeln!(md, "{}", wl.row(name, shares, pending, drops))?;
    }
    Ok(())
}

/// The verdict on landing control of one workload: the median share of the optimum
/// landing as planned (`shares`) reaches `target` and beats the scheduler's landing
/// (`med_sched`).
fn write_verdict(
    verdicts: &mut String,
    wl: &Workload,
    shares: &[f64],
    med_sched: f64,
    target: f64,
) -> std::fmt::Result {
    let Workload { w, n, .. } = wl;
    let med = median(shares.to_vec());
    let verdict = if med >= target && med > med_sched {
        "met".to_string()
    } else if med >= target {
        "**not met** (no more than without)".to_string()
    } else {
        format!("**not met** ({:.1} pp short)", 100.0 * (target - med))
    };
    writeln!(
        verdicts,
        "- {w}: gpu-defrag with landing control (landing as planned) reaches {:.1}% of the exact optimum (median of {n}; min {:.1}%), without it (scheduler's landing) {:.1}% — target ≥ {:.0}% and more than without: {verdict}",
        100.0 * med,
        100.0 * shares.iter().copied().fold(f64::INFINITY, f64::min),
        100.0 * med_sched,
        100.0 * target
    )
}

/// The reference rows of one workload: the optimum's evictions landed by the
/// scheduler, the optimum, the solver's upper limit and the bench's bound.
fn reference_rows(md: &mut String, wl: &Workload, rs: &[&InstanceResult]) -> std::fmt::Result {
    let sched: Vec<f64> = rs
        .iter()
        .map(|r| share(r.optimum_evictions_scheduled.drop, r.optimum_drop))
        .collect();
    let sched_drop: Vec<f64> = rs
        .iter()
        .map(|r| r.optimum_evictions_scheduled.drop)
        .collect();
    let sched_pending = rs
        .iter()
        .filter(|r| r.optimum_evictions_scheduled.pending > 0)
        .count();
    writeln!(
        md,
        "{}",
        wl.row(
            "optimum's evictions, scheduler's landing",
            sched,
            sched_pending,
            sched_drop
        )
    )?;
    let opt: Vec<f64> = rs.iter().map(|r| r.optimum_drop).collect();
    writeln!(
        md,
        "{}",
        wl.row("**optimum** (MILP)", vec![1.0; wl.n], 0, opt)
    )?;
    let ub: Vec<f64> = rs
        .iter()
        .map(|r| share(r.optimum_drop_max, r.optimum_drop))
        .collect();
    let ub_drop: Vec<f64> = rs.iter().map(|r| r.optimum_drop_max).collect();
    writeln!(md, "{}", wl.row("solver's upper limit", ub, 0, ub_drop))?;
    let b: Vec<f64> = rs
        .iter()
        .map(|r| share(r.bound_drop, r.optimum_drop))
        .collect();
    let b_drop: Vec<f64> = rs.iter().map(|r| r.bound_drop).collect();
    writeln!(md, "{}", wl.row("bound (bench)", b, 0, b_drop))
}

/// The line on the instances: how many, proved optimal, their median size and the
/// solver's time.
fn instances_line(results: &[InstanceResult]) -> String {
    let secs: Vec<f64> = results.iter().map(|r| r.solved.seconds).collect();
    let max_s = secs.iter().copied().fold(0.0, f64::max);
    let proven = results.iter().filter(|r| r.solved.optimal).count();
    let sizes: Vec<f64> = results.iter().map(|r| r.solved.size[0] as f64).collect();
    let nodes: Vec<f64> = results.iter().map(|r| r.nodes as f64).collect();
    let pods: Vec<f64> = results.iter().map(|r| r.pods as f64).collect();
    let gpus: Vec<f64> = results.iter().map(|r| r.gpus as f64).collect();
    let budgets: Vec<f64> = results.iter().map(|r| r.budget as f64).collect();
    format!(
        "Instances: {} ({} proved optimal); per instance (medians): {:.0} nodes, {:.0} GPUs, {:.0} bound GPU pods, budget {:.0}, {:.0} binary variables; HiGHS time {:.1} s median, {:.1} s max.",
        results.len(),
        proven,
        median(nodes),
        median(gpus),
        median(pods),
        median(budgets),
        median(sizes),
        median(secs),
        max_s
    )
}

#[cfg(test)]
mod tests {
    use super::super::{PlannerResult, Solved, planners};
    use super::*;

    fn fake_instance(seed: u64, drops: &[(&str, f64)]) -> InstanceResult {
        let pr = |name: &str, drop: f64| PlannerResult {
            planner: name.to_string(),
            drop,
            evictions: 3,
            pending: 0,
        };
        InstanceResult {
            workload: "default".into(),
            seed,
            nodes: 4,
            gpus: 16,
            pods: 20,
            budget: 3,
            fragment_rate_before: 0.2,
            idle_milli: 1000,
            optimum_drop: 0.1,
            optimum_drop_max: 0.1,
            bound_drop: 0.12,
            optimum_evictions_scheduled: pr("optimum's evictions, scheduler's landing", 0.05),
            solved: Solved {
                optimal: true,
                fragment_milli_after: 100.0,
                objective: 100.0,
                fragment_milli_after_min: 100.0,
                evictions: 3,
                landed_back: 0,
                receiver_free_after: Vec::new(),
                evicted: Vec::new(),
                seconds: 1.0,
                size: [1, 1, 1, 1],
            },
            planners: drops.iter().map(|(n, d)| pr(n, *d)).collect(),
        }
    }

    /// The landing-as-planned row sits right after gpu-defrag's, and the verdict reads
    /// it against the target and against the scheduler's landing.
    #[test]
    fn markdown_shows_both_landings_and_the_verdict() {
        let wl = |planned: f64| -> Vec<InstanceResult> {
            (0..3)
                .map(|s| {
                    let mut d: Vec<(&str, f64)> =
                        planners().into_iter().map(|p| (p, 0.06)).collect();
                    d.push((AS_PLANNED, planned));
                    fake_instance(s, &d)
                })
                .collect()
        };
        let md = markdown(&wl(0.095), 0.9).unwrap();
        let lines: Vec<&str> = md.lines().collect();
        let at = lines
            .iter()
            .position(|l| l.starts_with("| default | gpu-defrag |"))
            .unwrap();
        assert!(
            lines[at + 1].starts_with(&format!("| default | {AS_PLANNED} | 3 | 95.0% |")),
            "{md}"
        );
        assert!(lines[at].contains("| 60.0% |"), "{md}");
        assert!(md.contains("reaches 95.0% of the exact optimum"), "{md}");
        assert!(
            md.contains("without it (scheduler's landing) 60.0%"),
            "{md}"
        );
        assert!(md.trim_end().ends_with(": met"), "{md}");
        let md = markdown(&wl(0.085), 0.9).unwrap();
        assert!(md.contains("**not met** (5.0 pp short)"), "{md}");
        let md = markdown(&wl(0.06), 0.5).unwrap();
        assert!(md.contains("**not met** (no more than without)"), "{md}");
    }
}
