//! The command line.
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use gpu_defrag_e2e::repo_root;

pub(crate) const USAGE: &str =
    "usage: gpu-defrag-bench-e2e [--trace DIR] [--workload W] [--seed S[,S…]] [--nodes N]
       [--load F] [--departures F] [--pending8 N] [--pending4 N] [--budget N]
       [--thresholds 20,40,60,80] [--scheduler-name NAME] [--descheduler BIN]
       [--only trace|demo|layout] [--doc FILE]

  Runs the real descheduler (HighNodeUtilization on nvidia.com/gpu, one run per threshold)
  and gpu-defrag (Enforce) with the same eviction budget, each on a fresh control plane
  with the same trace-sampled start state; then the descheduler on `make demo`'s workload.
  Prints a table; --doc writes the markdown report (docs/benchmarks-e2e.md).";

#[derive(Debug, Clone)]
pub(crate) struct Args {
    pub(crate) trace: PathBuf,
    pub(crate) workload: String,
    pub(crate) seeds: Vec<u64>,
    pub(crate) nodes: usize,
    pub(crate) load: f64,
    pub(crate) departures: f64,
    pub(crate) pending8: usize,
    pub(crate) pending4: usize,
    pub(crate) budget: u32,
    pub(crate) thresholds: Vec<u32>,
    pub(crate) scheduler_name: String,
    pub(crate) descheduler: Option<PathBuf>,
    pub(crate) only: Option<String>,
    pub(crate) doc: Option<PathBuf>,
}

pub(crate) fn parse_args() -> Result<Args> {
    let mut a = Args {
        trace: repo_root().join("../shared/data/alibaba-gpu-v2023/csv"),
        workload: "default".into(),
        seeds: vec![1],
        nodes: 64,
        load: 1.0,
        departures: 0.3,
        pending8: 8,
        pending4: 4,
        budget: 16,
        thresholds: vec![20, 40, 60, 80],
        scheduler_name: gpu_defrag_e2e::fixtures::GPU_SCHEDULER.into(),
        descheduler: None,
        only: None,
        doc: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--trace" => a.trace = PathBuf::from(value()?),
            "--workload" => a.workload = value()?,
            "--seed" | "--seeds" => {
                a.seeds = value()?
                    .split(',')
                    .filter(|s| !s.is_empty())
                    .map(|s| s.trim().parse().context("--seed"))
                    .collect::<Result<_>>()?
            }
            "--nodes" => a.nodes = value()?.parse().context("--nodes")?,
            "--load" => a.load = value()?.parse().context("--load")?,
            "--departures" => a.departures = value()?.parse().context("--departures")?,
            "--pending8" => a.pending8 = value()?.parse().context("--pending8")?,
            "--pending4" => a.pending4 = value()?.parse().context("--pending4")?,
            "--budget" => a.budget = value()?.parse().context("--budget")?,
            "--thresholds" => {
                a.thresholds = value()?
                    .split(',')
                    .filter(|s| !s.is_empty())
                    .map(|s| s.trim().parse().context("--thresholds"))
                    .collect::<Result<_>>()?
            }
            "--scheduler-name" => a.scheduler_name = value()?,
            "--descheduler" => a.descheduler = Some(PathBuf::from(value()?)),
            "--only" => a.only = Some(value()?),
            "--doc" => a.doc = Some(PathBuf::from(value()?)),
            "-h" | "--help" => bail!("help"),
            other => bail!("unknown argument {other}"),
        }
    }
    if !(0.0..=1.0).contains(&a.load) || !(0.0..1.0).contains(&a.departures) {
        bail!("--load must be in [0,1] and --departures in [0,1)");
    }
    Ok(a)
}
