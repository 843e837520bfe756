//! The benchmark matrix: every workload × seed, medians per workload and planner, as
//! Markdown (what `make bench` writes into docs/benchmarks.md).
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;
use std::time::Instant;

use gpu_defrag_core::frag;

use crate::{ScenarioArgs, bench, scenario, trace};

/// Matrix parameters.
pub struct MatrixArgs {
    /// Trace directory.
    pub dir: PathBuf,
    /// Workloads.
    pub workloads: Vec<String>,
    /// Seeds 1..=N.
    pub seeds: u64,
    /// Load, departures, budget fraction, HighNodeUtilization threshold.
    pub scenario: ScenarioArgs,
    /// Raw JSON lines output.
    pub raw: Option<PathBuf>,
    /// Weights of an 8-GPU shape added to gpu-defrag's policy, one run each: the
    /// trade-off table between fragment drop and free 8-GPU nodes (empty: no table).
    pub whole_node_weights: Vec<f64>,
}

/// Median of a list (mean of the two middle values for even lengths); 0 when empty.
pub fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Runs the matrix; returns the Markdown section.
pub fn run(a: &MatrixArgs) -> anyhow::Result<String> {
    let mut raw = match &a.raw {
        Some(p) => Some(std::fs::File::create(p)?),
        None => None,
    };
    let mut md = String::new();
    writeln!(
        md,
        "| workload | planner | evictions | fragment rate before → after | drop (pp) | drop vs best baseline | fully free GPUs before → after | free 8-GPU nodes before → after | pending | plan ms |"
    )?;
    writeln!(md, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")?;
    let mut verdicts = Vec::new();
    let mut tradeoff = String::new();
    let mut progress = Progress {
        done: 0,
        total: a.workloads.len() as u64 * a.seeds,
        t0: Instant::now(),
    };
    for w in &a.workloads {
        let runs = run_workload(a, w, raw.as_mut(), &mut progress)?;
        planner_rows(&mut md, w, &runs)?;
        let baselines: Vec<Point> = bench::BASELINES
            .map(|i| Point {
                name: bench::PLANNERS[i],
                drop: runs.med(i, &drop),
                nodes: runs.med(i, &|r| r.fully_free8_gpu_nodes_after as f64),
            })
            .collect();
        for (i, wt) in a.whole_node_weights.iter().enumerate() {
            let p = Point {
                name: "",
                drop: median(runs.weighted[i].iter().map(drop).collect()),
                nodes: median(
                    runs.weighted[i]
                        .iter()
                        .map(|r| r.fully_free8_gpu_nodes_after as f64)
                        .collect(),
                ),
            };
            tradeoff_row(&mut tradeoff, w, *wt, &p, &baselines)?;
        }
        bound_row(&mut md, w, &runs)?;
        verdicts.push(verdict(w, &runs));
    }
    eprintln!();
    std::io::stderr().flush().ok();
    md.push('\n');
    for v in verdicts {
        md.push_str(&v);
        md.push('\n');
    }
    if !a.whole_node_weights.is_empty() {
        md.push_str(TRADEOFF_HEAD);
        md.push_str(&tradeoff);
    }
    Ok(md)
}

/// Progress over the whole matrix, shown on stderr.
struct Progress {
    done: u64,
    total: u64,
    t0: Instant,
}

/// Every seed's results of one workload.
struct WorkloadRuns {
    /// Per planner of [`bench::PLANNERS`], one result per seed.
    rows: Vec<Vec<bench::Result>>,
    /// The bench's bound, one per seed.
    bounds: Vec<bench::Bound>,
    /// Per whole-node weight of [`MatrixArgs::whole_node_weights`], one result per seed.
    weighted: Vec<Vec<bench::Result>>,
}

impl WorkloadRuns {
    /// Median over the seeds of `f` of planner `i`.
    fn med(&self, i: usize, f: &dyn Fn(&bench::Result) -> f64) -> f64 {
        median(self.rows[i].iter().map(f).collect())
    }

    /// Median over the seeds of `f` of the bound.
    fn bm(&self, f: &dyn Fn(&bench::Bound) -> f64) -> f64 {
        median(self.bounds.iter().map(f).collect())
    }

    /// The best baseline's median fragment drop (0 when none drops).
    fn best_baseline(&self) -> f64 {
        bench::BASELINES
            .map(|i| self.med(i, &drop))
            .fold(0.0, f64::max)
    }
}

/// A result's fragment rate drop.
fn drop(r: &bench::Result) -> f64 {
    r.fragment_rate_before - r.fragment_rate_after
}

/// Runs every seed of workload `w`: every planner and every whole-node weight on its
/// scenario; each seed's JSON line to `raw`.
fn run_workload(
    a: &MatrixArgs,
    w: &str,
    mut raw: Option<&mut std::fs::File>,
    progress: &mut Progress,
) -> anyhow::Result<WorkloadRuns> {
    let tr = trace::load(&a.dir, w)?;
    let mut runs = WorkloadRuns {
        rows: vec![Vec::new(); bench::PLANNERS.len()],
        bounds: Vec::new(),
        weighted: vec![Vec::new(); a.whole_node_weights.len()],
    };
    for seed in 1..=a.seeds {
        let (c, summary) = scenario::build(
            &tr,
            &scenario::Params {
                workload: w.to_string(),
                seed,
                load: a.scenario.load,
                departures: a.scenario.departures,
            },
        );
        let shapes = frag::default_shapes(&c, &Default::default());
        let budget = bench::budget_of(&c, a.scenario.budget);
        let policy = bench::bench_policy(shapes.clone(), budget as u32);
        let b = bench::bound(&c, &shapes, budget);
        let mut results = Vec::new();
        for (i, name) in bench::PLANNERS.iter().enumerate() {
            let r = bench::run(name, &c, &policy, budget, a.scenario.hnu_threshold)?;
            runs.rows[i].push(r.clone());
            results.push(r);
        }
        for (i, wt) in a.whole_node_weights.iter().enumerate() {
            let r = bench::run_whole_node_weight(&c, &policy, budget, *wt)?;
            runs.weighted[i].push(r.clone());
            results.push(r);
        }
        if let Some(f) = raw.as_deref_mut() {
            let line = serde_json::json!({
                "scenario": {"workload": w, "seed": seed, "load": a.scenario.load,
                    "departures": a.scenario.departures, "budget": budget, "summary": summary},
                "bound": b, "results": results});
            writeln!(f, "{line}")?;
        }
        runs.bounds.push(b);
        progress.done += 1;
        eprint!(
            "\r[{}/{}] {w} seed {seed} ({:.0}s)      ",
            progress.done,
            progress.total,
            progress.t0.elapsed().as_secs_f64()
        );
    }
    Ok(runs)
}

/// The table's row of every planner of workload `w`: medians over the seeds.
fn planner_rows(md: &mut String, w: &str, runs: &WorkloadRuns) -> std::fmt::Result {
    let med = |i: usize, f: &dyn Fn(&bench::Result) -> f64| runs.med(i, f);
    let best_baseline = runs.best_baseline();
    for (i, name) in bench::PLANNERS.iter().enumerate() {
        let d = med(i, &drop);
        let ratio = if *name == "none" || best_baseline <= 0.0 {
            "".to_string()
        } else {
            format!("{:.2}×", d / best_baseline)
        };
        writeln!(
            md,
            "| {w} | {name} | {:.0} | {:.4} → {:.4} | {:.2} | {ratio} | {:.0} → {:.0} | {:.0} → {:.0} | {:.0} | {:.1} |",
            med(i, &|r| r.evictions as f64),
            med(i, &|r| r.fragment_rate_before),
            med(i, &|r| r.fragment_rate_after),
            100.0 * d,
            med(i, &|r| r.fully_free_gpus_before as f64),
            med(i, &|r| r.fully_free_gpus_after as f64),
            med(i, &|r| r.fully_free8_gpu_nodes_before as f64),
            med(i, &|r| r.fully_free8_gpu_nodes_after as f64),
            med(i, &|r| r.pending_after as f64),
            med(i, &|r| r.plan_millis),
        )?;
    }
    Ok(())
}

/// The table's row of the bench's bound for workload `w`.
fn bound_row(md: &mut String, w: &str, runs: &WorkloadRuns) -> std::fmt::Result {
    let before = runs.med(0, &|r| r.fragment_rate_before);
    writeln!(
        md,
        "| {w} | *bound* | {:.0} | ≥ {:.4} | ≤ {:.2} | | ≤ {:.0} | ≤ {:.0} | | |",
        runs.bm(&|b| b.budget as f64),
        runs.bm(&|b| b.fragment_rate_after_min),
        100.0 * (before - runs.bm(&|b| b.fragment_rate_after_min)),
        runs.bm(&|b| b.fully_free_gpus_after_max as f64),
        runs.bm(&|b| b.fully_free8_gpu_nodes_after_max as f64),
    )
}

/// The verdict line of workload `w`: gpu-defrag against the best baseline, its
/// 8-GPU variant and the bound.
fn verdict(w: &str, runs: &WorkloadRuns) -> String {
    let med = |i: usize, f: &dyn Fn(&bench::Result) -> f64| runs.med(i, f);
    let bm = |f: &dyn Fn(&bench::Bound) -> f64| runs.bm(f);
    let best_baseline = runs.best_baseline();
    let best_nodes = bench::BASELINES
        .map(|i| med(i, &|r| r.fully_free8_gpu_nodes_after as f64))
        .fold(0.0, f64::max);
    let before = med(0, &|r| r.fragment_rate_before);
    let g = bench::GPU_DEFRAG;
    let g8 = bench::GPU_DEFRAG_8GPU;
    let gd = med(g, &drop);
    let gn = med(g, &|r| r.fully_free8_gpu_nodes_after as f64);
    let g8d = med(g8, &drop);
    let g8n = med(g8, &|r| r.fully_free8_gpu_nodes_after as f64);
    let bound_drop = before - bm(&|b| b.fragment_rate_after_min);
    let ratio = |x: f64| {
        if best_baseline > 0.0 {
            x / best_baseline
        } else {
            f64::INFINITY
        }
    };
    let verdict = |ok: bool| if ok { "met" } else { "**not met**" };
    let expected = median(
        runs.rows[g]
            .iter()
            .filter_map(|r| r.expected_fragment_rate_after)
            .collect(),
    );
    format!(
        "- **{w}**: gpu-defrag drop {:.2} pp vs best baseline {:.2} pp → {:.2}× (target ≥ 1.5×: {}; the bound allows at most {:.2}×, so the target is {}); free 8-GPU nodes after {:.0} vs best baseline {:.0} (target more: {}); with an 8-GPU shape in its policy (`gpu-defrag-8gpu`): {:.0} free 8-GPU nodes ({}) at a drop of {:.2} pp ({:.2}×); gap to the bound: {:.2} pp of fragment rate ({:.0}% of the bound's drop reached), {:.0} fully free GPUs, {:.0} free 8-GPU nodes; the planner's own forecast of the rate after: {:.4} (measured {:.4}).",
        100.0 * gd,
        100.0 * best_baseline,
        ratio(gd),
        verdict(gd >= 1.5 * best_baseline),
        ratio(bound_drop),
        if bound_drop < 1.5 * best_baseline {
            "out of reach on this workload"
        } else {
            "not ruled out by it"
        },
        gn,
        best_nodes,
        verdict(gn > best_nodes),
        g8n,
        if g8n > best_nodes {
            "more than the best baseline"
        } else {
            "not more than the best baseline"
        },
        100.0 * g8d,
        ratio(g8d),
        100.0 * (med(g, &|r| r.fragment_rate_after) - bm(&|b| b.fragment_rate_after_min)),
        if bound_drop > 0.0 {
            100.0 * gd / bound_drop
        } else {
            100.0
        },
        bm(&|b| b.fully_free_gpus_after_max as f64) - med(g, &|r| r.fully_free_gpus_after as f64),
        bm(&|b| b.fully_free8_gpu_nodes_after_max as f64) - gn,
        expected,
        med(g, &|r| r.fragment_rate_after),
    )
}

const TRADEOFF_HEAD: &str = "
### Fragment drop against whole free 8-GPU nodes

gpu-defrag with an 8-GPU shape of weight *w* added to the derived shapes (the others
scaled to 1 − *w*), each measured with the derived shapes like every row above.
*beats on both counts*: the baselines whose drop it reaches or exceeds while freeing
more 8-GPU nodes; *best of both*: its drop reaches the best baseline's and it frees more
8-GPU nodes than the best baseline.

| workload | w | drop (pp) | drop vs best baseline | free 8-GPU nodes after | beats on both counts | best of both |
|---|---:|---:|---:|---:|---|---|
";

/// A planner's median drop and free 8-GPU nodes.
struct Point {
    name: &'static str,
    drop: f64,
    nodes: f64,
}

/// One row of the trade-off table.
fn tradeoff_row(
    md: &mut String,
    workload: &str,
    w: f64,
    p: &Point,
    baselines: &[Point],
) -> std::fmt::Result {
    let best_drop = baselines.iter().map(|b| b.drop).fold(0.0, f64::max);
    let best_nodes = baselines.iter().map(|b| b.nodes).fold(0.0, f64::max);
    let ratio = if best_drop > 0.0 {
        format!("{:.2}×", p.drop / best_drop)
    } else {
        String::new()
    };
    let beaten: Vec<&str> = baselines
        .iter()
        .filter(|b| p.drop >= b.drop && p.nodes > b.nodes)
        .map(|b| b.name)
        .collect();
    let beaten = if beaten.is_empty() {
        "—".to_string()
    } else {
        beaten.join(", ")
    };
    let both = if p.drop >= best_drop && p.nodes > best_nodes {
        "yes"
    } else {
        "no"
    };
    writeln!(
        md,
        "| {workload} | {w} | {:.2} | {ratio} | {:.0} | {beaten} | {both} |",
        100.0 * p.drop,
        p.nodes
    )
}

#[cfg(test)]
mod tests {
    use super::{Point, median, tradeoff_row};

    #[test]
    fn tradeoff_rows_name_the_baselines_beaten_on_both_counts() {
        let baselines = [
            Point {
                name: "hnu",
                drop: 0.04,
                nodes: 26.0,
            },
            Point {
                name: "fgd",
                drop: 0.06,
                nodes: 1.0,
            },
        ];
        let row = |drop, nodes| {
            let mut md = String::new();
            tradeoff_row(
                &mut md,
                "w",
                0.1,
                &Point {
                    name: "",
                    drop,
                    nodes,
                },
                &baselines,
            )
            .unwrap();
            md
        };
        assert_eq!(
            row(0.05, 30.0),
            "| w | 0.1 | 5.00 | 0.83× | 30 | hnu | no |\n"
        );
        assert_eq!(
            row(0.06, 2.0),
            "| w | 0.1 | 6.00 | 1.00× | 2 | fgd | no |\n"
        );
        assert_eq!(
            row(0.07, 27.0),
            "| w | 0.1 | 7.00 | 1.17× | 27 | hnu, fgd | yes |\n"
        );
        assert_eq!(
            row(0.03, 26.0),
            "| w | 0.1 | 3.00 | 0.50× | 26 | — | no |\n"
        );
    }

    #[test]
    fn medians() {
        assert_eq!(median(vec![]), 0.0);
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
    }
}
