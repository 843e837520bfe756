#![forbid(unsafe_code)]
//! `gpu-defrag`: the operator and its CLI.
use std::process::ExitCode;

use gpu_defrag_operator::{cli, input, plugin};

// Reading a large cluster is mostly small allocations (see docs/benchmarks.md).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let as_plugin = plugin::is_plugin(std::env::args_os().next().as_ref());
    match cli::run(plugin::parse::<cli::Cli>(), as_plugin) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            if let Some(input) = e.downcast_ref::<input::InputError>() {
                eprintln!("error: {input}");
                return ExitCode::from(2);
            }
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
