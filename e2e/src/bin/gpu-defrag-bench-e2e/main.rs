//! `gpu-defrag-bench-e2e` (`make bench-e2e`): the real `sigs.k8s.io/descheduler` and
//! gpu-defrag side by side on the real control plane, from the same start state.
//!
//! ```text
//! trace (nodes, pods) ──seed──> start layout: nodes sampled, pods placed by an emulation of
//!                               the bin-packing scheduler, some departed, multi-GPU pods
//!                               that fit nowhere left pending
//! for each contender: fresh control plane ─> nodes ─> PDBs ─> pods bound to the layout's
//!     nodes ─> a ReplicaSet per pod (adopts it) ─> its Deployment (same template: adopts
//!     the ReplicaSet as its current one) ─> pending Deployments ─> measure ─> contender
//!     ─> settle ─> measure
//! ```
//!
//! Every contender gets a fresh control plane built from the same seed: the pods are bound
//! to the nodes the layout says (not left to the scheduler's random tie-breaks), so each
//! run starts from the identical placement; the start-state figures of every run are
//! printed to show it. The descheduler runs once (one pass, then it exits); gpu-defrag runs
//! as `make demo` runs it, with an Enforce policy whose window is open now. Replacements of evicted pods and the pending pods go through the
//! real kube-scheduler (`--scheduler-name`, default `gpu-binpack`, the bin-packing second
//! scheduler the control plane runs beside the stock default one).
#![forbid(unsafe_code)]

mod args;
mod cluster;
mod contenders;
mod demo;
mod layout;
mod measure;
mod report;

use std::{fs, process::ExitCode};

use anyhow::{Context, Result};

use args::{Args, USAGE, parse_args};
use contenders::{Contender, Row, build_descheduler, run_contender};
use demo::run_demo;
use layout::Layout;
use report::{commands_section, header, seed_section, summary_section, table, trace_intro};

const NS: &str = "bench";
const ROLE: &str = "bench-role";

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e:#}\n\n{USAGE}");
            return ExitCode::FAILURE;
        }
    };
    match run(&args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpu-defrag-bench-e2e: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: &Args) -> Result<()> {
    let started = chrono::Utc::now();
    if args.only.as_deref() == Some("layout") {
        for &seed in &args.seeds {
            println!(
                "seed {seed}: {}",
                Layout::from_trace(args, seed)?.describe()
            );
        }
        return Ok(());
    }
    let descheduler = match &args.descheduler {
        Some(b) => b.clone(),
        None => build_descheduler()?,
    };
    let gpu_defrag = gpu_defrag_e2e::operator::operator_binary().await?;
    let mut doc = String::new();
    if args.only.as_deref() != Some("demo") {
        let mut last_rows = Vec::new();
        let mut all_rows: Vec<(u64, Vec<Row>)> = Vec::new();
        for &seed in &args.seeds {
            let layout = Layout::from_trace(args, seed)?;
            eprintln!("seed {seed}: {}", layout.describe());
            let mut contenders: Vec<Contender> = args
                .thresholds
                .iter()
                .map(|&t| Contender::Descheduler(t))
                .collect();
            contenders.push(Contender::GpuDefrag);
            let mut rows = Vec::new();
            for c in &contenders {
                eprintln!("== seed {seed}: {}", c.name());
                let row = run_contender(args, &layout, c, &descheduler, &gpu_defrag).await?;
                eprintln!("{}", row.line());
                rows.push(row);
            }
            let table = table(&rows);
            println!("\nseed {seed}: {}\n{table}", layout.describe());
            if doc.is_empty() {
                doc.push_str(&trace_intro(args, &layout));
            }
            doc.push_str(&seed_section(seed, &layout, &rows, &table));
            all_rows.push((seed, rows.clone()));
            last_rows = rows;
        }
        let summary = summary_section(&all_rows);
        println!("{summary}");
        doc.push_str(&summary);
        doc.push_str(&commands_section(&last_rows));
    }
    if args.only.as_deref() != Some("trace") {
        eprintln!(
            "== make demo's workload: descheduler HighNodeUtilization at 60%, then gpu-defrag"
        );
        let demo = run_demo(&descheduler, &gpu_defrag).await?;
        println!("\n{}", demo.summary());
        doc.push_str(&demo.section());
    }
    if let Some(path) = &args.doc {
        let text = header(args, started) + &doc;
        fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}
