#![forbid(unsafe_code)]
//! `gpu-defrag-sim`: synthetic clusters, trace scenarios and benchmarks.
use std::path::PathBuf;
use std::time::Instant;

use clap::{Parser, Subcommand};
use gpu_defrag_core::{frag, ingest, policy::Policy, snapshot};

mod synth;

#[derive(Parser)]
#[command(
    name = "gpu-defrag-sim",
    version,
    about = "Simulator and benchmarks for gpu-defrag"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(clap::Args, Clone)]
struct SynthArgs {
    /// Nodes.
    #[arg(long, default_value_t = 16)]
    nodes: usize,
    /// GPUs per node.
    #[arg(long, default_value_t = 8)]
    gpus_per_node: u32,
    /// Pods to place.
    #[arg(long, default_value_t = 80)]
    pods: usize,
    /// Random seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Share of nodes using HAMi GPU sharing (0..1).
    #[arg(long, default_value_t = 0.5)]
    shared_nodes: f64,
}

impl SynthArgs {
    fn params(&self) -> synth::SynthParams {
        synth::SynthParams {
            nodes: self.nodes,
            gpus_per_node: self.gpus_per_node,
            pods: self.pods,
            seed: self.seed,
            shared_nodes: self.shared_nodes.clamp(0.0, 1.0),
            ..Default::default()
        }
    }
}

#[derive(Subcommand)]
enum Cmd {
    /// Write a synthetic fragmented cluster snapshot (a v1 List, JSON) to stdout or a file.
    Gen {
        #[command(flatten)]
        synth: SynthArgs,
        /// Output file (default: stdout).
        #[arg(short = 'f', long)]
        file: Option<PathBuf>,
    },
    /// Benchmark `report`: load (parse + normalise) and metric time on a synthetic cluster.
    ReportBench {
        #[command(flatten)]
        synth: SynthArgs,
        /// Repetitions of the metric computation (the median is printed).
        #[arg(long, default_value_t = 5)]
        reps: usize,
    },
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().cmd {
        Cmd::Gen { synth, file } => {
            let objs = synth::generate(&synth.params());
            let text = serde_json::to_string(&synth::to_list_json(&objs))?;
            match file {
                Some(f) => std::fs::write(f, text)?,
                None => println!("{text}"),
            }
        }
        Cmd::ReportBench { synth, reps } => {
            let t0 = Instant::now();
            let objs = synth::generate(&synth.params());
            let text = serde_json::to_string(&synth::to_list_json(&objs))?;
            let gen_s = t0.elapsed().as_secs_f64();
            drop(objs);
            let t1 = Instant::now();
            let objs = snapshot::parse(&text)?;
            let parse_s = t1.elapsed().as_secs_f64();
            let t2 = Instant::now();
            let cluster = ingest::build_cluster(&objs, None);
            let ingest_s = t2.elapsed().as_secs_f64();
            let policy = Policy::default();
            let mut times = Vec::new();
            let mut report = None;
            for _ in 0..reps.max(1) {
                let t = Instant::now();
                report = Some(frag::report(&cluster, &policy));
                times.push(t.elapsed().as_secs_f64());
            }
            times.sort_by(f64::total_cmp);
            let r = report.expect("at least one repetition");
            let out = serde_json::json!({
                "nodes": cluster.nodes.len(),
                "gpus": r.gpus,
                "pods": cluster.pods.len(),
                "snapshotBytes": text.len(),
                "generateSeconds": gen_s,
                "parseSeconds": parse_s,
                "normaliseSeconds": ingest_s,
                "loadSeconds": parse_s + ingest_s,
                "metricSeconds": times[times.len() / 2],
                "fragmentRate": r.fragment_rate,
                "unknownPods": r.unknown_pods,
            });
            println!("{}", serde_json::to_string_pretty(&out)?);
        }
    }
    Ok(())
}
