//! The operator binary: `target/debug/gpu-defrag`, built once per test binary, or the one
//! `$GPU_DEFRAG_OPERATOR_BIN` names.
use std::{
    path::PathBuf,
    process::{Command, Stdio},
    sync::OnceLock,
    time::Instant,
};

use anyhow::{Context, Result, anyhow};

use crate::cluster::repo_root;

static BINARY: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();

/// `target/debug/gpu-defrag`, built once per test binary (`$CARGO` or `cargo`), or
/// `$GPU_DEFRAG_OPERATOR_BIN` if set (e.g. a release build, for the scale figures).
pub async fn operator_binary() -> Result<PathBuf> {
    tokio::task::spawn_blocking(|| {
        BINARY
            .get_or_init(|| {
                if let Some(bin) = std::env::var_os("GPU_DEFRAG_OPERATOR_BIN") {
                    return Ok(PathBuf::from(bin));
                }
                let root = repo_root();
                let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
                let t0 = Instant::now();
                let out = Command::new(cargo)
                    .args([
                        "build",
                        "-q",
                        "-p",
                        "gpu-defrag-operator",
                        "--bin",
                        "gpu-defrag",
                    ])
                    .current_dir(&root)
                    .stdin(Stdio::null())
                    .output()
                    .map_err(|e| format!("running cargo build: {e}"))?;
                if !out.status.success() {
                    return Err(format!(
                        "cargo build -p gpu-defrag-operator failed ({}):\n{}",
                        out.status,
                        String::from_utf8_lossy(&out.stderr)
                    ));
                }
                let target = std::env::var_os("CARGO_TARGET_DIR")
                    .map(PathBuf::from)
                    .unwrap_or_else(|| root.join("target"));
                let bin = target.join("debug/gpu-defrag");
                eprintln!(
                    "built {} in {:.1}s",
                    bin.display(),
                    t0.elapsed().as_secs_f64()
                );
                Ok(bin)
            })
            .clone()
            .map_err(|e| anyhow!(e))
    })
    .await
    .context("build task")?
}
