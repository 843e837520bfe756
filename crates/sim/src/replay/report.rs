//! Every (workload, seed, planner) of a replay, and its report: JSON, Markdown medians
//! over seeds, a table for people.

use std::path::PathBuf;

use gpu_defrag_core::policy::DemandPolicy;

use super::arrivals::prepare;
use super::run::run;
use super::{DAY, PLANNERS, POLL_SECONDS, Params, demand};

/// Command-line arguments of `replay`.
pub struct Args {
    /// Trace directory.
    pub dir: PathBuf,
    /// Workloads.
    pub workloads: Vec<String>,
    /// Seeds.
    pub seeds: Vec<u64>,
    /// Parameters (workload and seed are overwritten per run).
    pub params: Params,
    /// Planners.
    pub planners: Vec<String>,
    /// `--plot`: the time series of the first (workload, seed), drawn into this PNG.
    pub plot: Option<PathBuf>,
}

/// Runs every (workload, seed, planner).
pub fn run_all(a: &Args) -> anyhow::Result<serde_json::Value> {
    let planners: Vec<String> = if a.planners.is_empty() {
        PLANNERS.iter().map(|s| s.to_string()).collect()
    } else {
        a.planners.clone()
    };
    let mut results = Vec::new();
    let mut streams = Vec::new();
    let mut plotted = false;
    for w in &a.workloads {
        for &seed in &a.seeds {
            let mut p = a.params.clone();
            p.workload = w.clone();
            p.seed = seed;
            let prep = prepare(&a.dir, &p)?;
            eprintln!(
                "{w} seed {seed}: {} arrivals ({:.0}/h, {} at t=0), lifetimes of {}",
                prep.arrivals.len(),
                prep.rate_per_hour,
                prep.initial_pods,
                prep.lifetimes_from
            );
            streams.push(serde_json::json!({
                "workload": w, "seed": seed, "arrivals": prep.arrivals.len(),
                "arrivalsPerHour": prep.rate_per_hour, "initialPods": prep.initial_pods,
                "lifetimesFrom": prep.lifetimes_from,
            }));
            let mut series = Vec::new();
            for name in &planners {
                let mut o = run(&prep, &p, name)?;
                series.push((name.clone(), std::mem::take(&mut o.series)));
                eprintln!(
                    "  {name:<22} alloc {:.4}  evictions {:>5}  pending {:>4}  {:.1}s",
                    o.allocation_ratio, o.evictions, o.pending_at_end, o.cpu_seconds
                );
                let mut v = serde_json::to_value(&o)?;
                v["workload"] = serde_json::json!(w);
                results.push(v);
            }
            if let Some(file) = a.plot.as_ref().filter(|_| !plotted) {
                plotted = true;
                let title = format!(
                    "{w}, seed {seed}: load {}, window {} for {} h, budget {}",
                    p.load,
                    p.windows.join(" + "),
                    p.window_hours,
                    p.budget
                );
                crate::plot::replay(file, &title, p.warmup_days * DAY, &series)?;
                eprintln!("plot: {}", file.display());
            }
        }
    }
    Ok(serde_json::json!({
        "parameters": {
            "trace": a.dir.display().to_string(),
            "workloads": a.workloads,
            "seeds": a.seeds,
            "days": a.params.days,
            "warmupDays": a.params.warmup_days,
            "load": a.params.load,
            "windows": a.params.windows,
            "windowHours": a.params.window_hours,
            "budget": a.params.budget,
            "maxLifetimeHours": a.params.max_lifetime_hours,
            "hnuThresholdPercent": a.params.hnu_threshold,
            "maxPendingGpuPods": a.params.max_pending_gpu_pods,
            "readySeconds": a.params.ready_seconds,
            "services": a.params.services,
            "descheduler": "once per window opening, at its start",
            "demand": {
                "minWaitSeconds": DemandPolicy::default().min_wait.as_secs_f64(),
                "maxEvictions": DemandPolicy::default().max_evictions,
                "maxEvictionsPerHour": DemandPolicy::default().max_evictions_per_hour,
                "pollSeconds": POLL_SECONDS,
                "triesPerPoll": gpu_defrag_core::plan::demand::GROUPS_PER_LOOK,
                "kaiPodsPerPoll": demand::KAI_PER_POLL,
            },
        },
        "streams": streams,
        "results": results,
    }))
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

fn fmt_s(x: Option<f64>) -> String {
    match x {
        None => "–".into(),
        Some(s) if s < 60.0 => format!("{s:.0}s"),
        Some(s) if s < 3600.0 => format!("{:.1}m", s / 60.0),
        Some(s) => format!("{:.1}h", s / 3600.0),
    }
}

/// Markdown: per workload, medians over seeds of every planner.
pub fn markdown(out: &serde_json::Value) -> String {
    let results = out["results"].as_array().cloned().unwrap_or_default();
    let mut workloads: Vec<String> = Vec::new();
    let mut planners: Vec<String> = Vec::new();
    for r in &results {
        let w = r["workload"].as_str().unwrap_or("").to_string();
        let p = r["planner"].as_str().unwrap_or("").to_string();
        if !workloads.contains(&w) {
            workloads.push(w);
        }
        if !planners.contains(&p) {
            planners.push(p);
        }
    }
    let mut s = String::new();
    let par = &out["parameters"];
    let services = par["services"].as_f64().unwrap_or(0.0);
    for w in &workloads {
        let seeds = par["seeds"].to_string();
        let mix = if services > 0.0 {
            format!(
                "trace jobs + services at {:.0}% of the load",
                services * 100.0
            )
        } else {
            "trace jobs only".to_string()
        };
        s.push_str(&format!(
            "\n**{w}**, load {}, {mix} (medians over seeds {seeds}; wait = queueing delay, \
             arrival → running)\n\n",
            par["load"]
        ));
        s.push_str("| planner | alloc. ratio | evictions | pending at end | p95 wait share | p95 wait 1 | p95 wait 2-4 | p95 wait 8 | p99 wait 8 | p50 wait 8 | p50 wait share / 1 / 2-4 | mean disruption |");
        s.push_str(if services > 0.0 {
            " service replicas evicted |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
        } else {
            "\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
        });
        for p in &planners {
            let rows: Vec<&serde_json::Value> = results
                .iter()
                .filter(|r| r["workload"] == *w && r["planner"] == *p)
                .collect();
            let med = |f: &dyn Fn(&serde_json::Value) -> Option<f64>| {
                median(rows.iter().filter_map(|r| f(r)).collect())
            };
            let wait = |q: &'static str, c: &'static str| {
                med(&move |r: &serde_json::Value| r["waitSeconds"][q][c].as_f64())
            };
            s.push_str(&format!(
                "| {p} | {:.4} | {:.0} | {:.0} | {} | {} | {} | {} | {} | {} | {} / {} / {} | {} |",
                med(&|r| r["allocationRatio"].as_f64()).unwrap_or(f64::NAN),
                med(&|r| r["evictions"].as_f64()).unwrap_or(0.0),
                med(&|r| r["pendingAtEnd"].as_f64()).unwrap_or(0.0),
                fmt_s(wait("p95", "share")),
                fmt_s(wait("p95", "1")),
                fmt_s(wait("p95", "2-4")),
                fmt_s(wait("p95", "8")),
                fmt_s(wait("p99", "8")),
                fmt_s(wait("p50", "8")),
                fmt_s(wait("p50", "share")),
                fmt_s(wait("p50", "1")),
                fmt_s(wait("p50", "2-4")),
                fmt_s(med(&|r| r["disruptionSeconds"]["mean"].as_f64())),
            ));
            if services > 0.0 {
                s.push_str(&format!(
                    " {:.0} |",
                    med(&|r| r["serviceEvictions"].as_f64().or(Some(0.0))).unwrap_or(0.0)
                ));
            }
            s.push('\n');
        }
    }
    s
}

/// A table for people: one row per run.
pub fn table(out: &serde_json::Value) -> String {
    let mut s = format!(
        "{:<12} {:>4} {:<22} {:>7} {:>6} {:>6} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}\n",
        "WORKLOAD",
        "SEED",
        "PLANNER",
        "ALLOC",
        "EVICT",
        "PEND",
        "p95 sh",
        "p95 1",
        "p95 2-4",
        "p95 8",
        "p99 8",
        "p50 8",
        "DISRUPT"
    );
    for r in out["results"].as_array().into_iter().flatten() {
        let w = |q: &str, c: &str| fmt_s(r["waitSeconds"][q][c].as_f64());
        s.push_str(&format!(
            "{:<12} {:>4} {:<22} {:>7.4} {:>6} {:>6} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}\n",
            r["workload"].as_str().unwrap_or(""),
            r["seed"],
            r["planner"].as_str().unwrap_or(""),
            r["allocationRatio"].as_f64().unwrap_or(f64::NAN),
            r["evictions"],
            r["pendingAtEnd"],
            w("p95", "share"),
            w("p95", "1"),
            w("p95", "2-4"),
            w("p95", "8"),
            w("p99", "8"),
            w("p50", "8"),
            fmt_s(r["disruptionSeconds"]["mean"].as_f64()),
        ));
    }
    s
}
