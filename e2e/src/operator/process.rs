//! [`Operator`]: a running `gpu-defrag run` in its own process group, as the RBAC-bound
//! user, with its log, `/metrics` and memory figures.
use std::{
    fs::File,
    io::Write,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, ChildStdin, Command, Stdio},
    sync::atomic::{AtomicUsize, Ordering},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, anyhow, bail};

use crate::{
    cluster::TestCluster,
    process::{free_port, log_tail, signal_group},
};

use super::{
    LANDING_NAMESPACE, POLICY_LABEL, landing_configmap, operator_binary, operator_kubeconfig,
};

static STARTS: AtomicUsize = AtomicUsize::new(0);

/// A running `gpu-defrag run` in its own process group, killed (SIGKILL, whole group) on
/// [`Operator::kill`] and on drop. A small `sh` leads the group and kills it when this
/// process's end of its stdin closes, so the operator never outlives the test binary.
#[derive(Debug)]
pub struct Operator {
    child: Option<Child>,
    stdin: Option<ChildStdin>,
    pgid: u32,
    log: PathBuf,
    metrics_addr: String,
    started: Instant,
}

impl Operator {
    /// Starts the operator for the policies labelled `e2e-test=<selector>`, as
    /// [`OPERATOR_USER`](super::OPERATOR_USER); `extra` are more `run` flags. Metrics listen
    /// on a free loopback port unless `extra` has its own `--metrics-addr`
    /// ([`Operator::metrics`]). Output goes to `<logs>/gpu-defrag-<selector>.log` (appended
    /// across restarts).
    pub async fn start(cluster: &TestCluster, selector: &str, extra: &[&str]) -> Result<Self> {
        let bin = operator_binary().await?;
        let kubeconfig = operator_kubeconfig(cluster).await?;
        let log = cluster
            .logs_dir()
            .join(format!("gpu-defrag-{selector}.log"));
        let mut out = File::options()
            .create(true)
            .append(true)
            .open(&log)
            .with_context(|| format!("opening {}", log.display()))?;
        let n = STARTS.fetch_add(1, Ordering::Relaxed);
        writeln!(
            out,
            "=== e2e: starting gpu-defrag (start #{n}) at {} ===",
            chrono::Utc::now().to_rfc3339()
        )?;
        let err = out.try_clone()?;
        let mut cmd = Command::new("sh");
        cmd.args([
            "-c",
            r#"{ "$@"; echo "=== e2e: gpu-defrag exited with status $? ==="; } & read -r _; kill -9 0"#,
            "gpu-defrag-e2e",
        ])
        .arg(&bin)
        .args(["run", "--policy-selector", &format!("{POLICY_LABEL}={selector}")]);
        let given = extra
            .iter()
            .position(|a| a.starts_with("--metrics-addr"))
            .and_then(|i| match extra[i].split_once('=') {
                Some((_, v)) => Some(v.to_string()),
                None => extra.get(i + 1).map(|v| v.to_string()),
            });
        let metrics_addr = match given {
            Some(a) => a,
            None => {
                let a = format!("127.0.0.1:{}", free_port()?);
                cmd.args(["--metrics-addr", &a]);
                a
            }
        };
        // Leader election is on by default; a test that does not ask for it runs its
        // operator alone (its user may not touch Leases outside the test's namespace).
        if !extra.iter().any(|a| a.starts_with("--leader-elect")) {
            cmd.arg("--leader-elect=false");
        }
        // Landing control as installed by config/, one ConfigMap per test's operator.
        if !extra.iter().any(|a| a.starts_with("--landing-")) {
            cmd.args(["--landing-namespace", LANDING_NAMESPACE])
                .args(["--landing-configmap", &landing_configmap(selector)]);
        }
        cmd.args(extra)
            .env("KUBECONFIG", &kubeconfig)
            .env("RUST_LOG", "info")
            .stdin(Stdio::piped())
            .stdout(out)
            .stderr(err)
            .process_group(0);
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        Ok(Self {
            pgid: child.id(),
            stdin: child.stdin.take(),
            child: Some(child),
            log,
            metrics_addr,
            started: Instant::now(),
        })
    }

    /// When the process was started (after the build and the RBAC setup).
    pub fn started(&self) -> Instant {
        self.started
    }

    /// The process id of `gpu-defrag` itself (the group is led by a small `sh`).
    pub fn pid(&self) -> Option<u32> {
        let entries = std::fs::read_dir("/proc").ok()?;
        entries.flatten().find_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            // pid (comm) state ppid pgrp …
            let (head, rest) = stat.rsplit_once(')')?;
            let comm = head.split_once('(')?.1;
            let fields: Vec<&str> = rest.split_whitespace().collect();
            (comm == "gpu-defrag" && fields.get(2) == Some(&self.pgid.to_string().as_str()))
                .then_some(pid)
        })
    }

    /// `(VmRSS, VmHWM)` of the operator process in KiB: resident memory now and at its peak.
    pub fn memory_kib(&self) -> Result<(u64, u64)> {
        let pid = self.pid().ok_or_else(|| anyhow!("no gpu-defrag process"))?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .with_context(|| format!("reading /proc/{pid}/status"))?;
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                .ok_or_else(|| anyhow!("no {name} in /proc/{pid}/status"))
        };
        Ok((field("VmRSS:")?, field("VmHWM:")?))
    }

    /// The `host:port` of its `/metrics`.
    pub fn metrics_addr(&self) -> &str {
        &self.metrics_addr
    }

    /// Its `/metrics` (OpenMetrics text).
    pub async fn metrics(&self) -> Result<String> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let addr = &self.metrics_addr;
        let fetch = async {
            let mut s = tokio::net::TcpStream::connect(addr).await?;
            s.write_all(
                format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")
                    .as_bytes(),
            )
            .await?;
            let mut raw = Vec::new();
            s.read_to_end(&mut raw).await?;
            Ok::<_, std::io::Error>(raw)
        };
        let raw = tokio::time::timeout(Duration::from_secs(10), fetch)
            .await
            .map_err(|_| anyhow!("GET http://{addr}/metrics timed out"))?
            .with_context(|| format!("GET http://{addr}/metrics"))?;
        let text = String::from_utf8_lossy(&raw);
        match text.split_once("\r\n\r\n") {
            Some((head, body)) if head.starts_with("HTTP/1.1 200") => Ok(body.to_string()),
            _ => bail!("GET http://{addr}/metrics: unexpected answer {text:.200}"),
        }
    }

    /// SIGKILL to the whole group (the operator gets no chance to clean up).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            signal_group(self.pgid, "KILL");
            self.stdin = None;
            let _ = child.wait();
        }
    }

    /// The log file.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// The last `n` lines of the log.
    pub fn log_tail(&self, n: usize) -> String {
        log_tail(&self.log, n)
    }

    /// Fails with the log's tail if the operator process has exited.
    pub fn ensure_running(&self) -> Result<()> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let last_start = text.rfind("=== e2e: starting").unwrap_or(0);
        if text[last_start..].contains("=== e2e: gpu-defrag exited") {
            bail!(
                "the operator exited; last lines of {}:\n{}",
                self.log.display(),
                self.log_tail(30)
            );
        }
        Ok(())
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "operator log {} (last lines):\n{}",
                self.log.display(),
                self.log_tail(40)
            );
        }
        self.kill();
    }
}
