//! A real Prometheus scraping the operator: Debian's `prometheus` package (installed by
//! `hack/install-prometheus.sh`, which `make check-monitoring` runs), started on loopback
//! with a generated config, its data in a temp dir under the stack's work dir.
//!
//! ```text
//! operator (127.0.0.1:<m>/metrics) <── scrape every 1 s ── prometheus (127.0.0.1:<p>)
//!                                                               │
//! test ── /api/v1/query?query=gpu_defrag_fragment_rate{policy=…} ┘  == status.fragmentRate
//! ```
//!
//! Prometheus runs in its own process group under a small `sh` that kills the group when
//! this process's end of its stdin closes; [`Prometheus`] kills the group on drop, so it
//! never outlives the test, even one that panics or is killed.

use std::{
    fs::File,
    io::{Read, Write},
    net::TcpStream,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, ChildStdin, Command, Stdio},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context, Result, anyhow, bail};
use gpu_defrag_e2e::{
    fixtures::wait_for,
    operator::{Operator, Pool, create_policy, delete_policy, float_at, fragment, int_at},
    process::{free_port, log_tail, signal_group},
    shared,
};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(60);
/// How long Prometheus may take to be ready and to hold a first sample.
const PROM_T: Duration = Duration::from_secs(60);
const JOB: &str = "gpu-defrag";

/// `prometheus` on `PATH`, else `/usr/bin/prometheus`; a clear failure when neither exists.
fn prometheus_binary() -> Result<PathBuf> {
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("prometheus"))
        .find(|p| p.is_file());
    let fallback = PathBuf::from("/usr/bin/prometheus");
    on_path
        .or_else(|| fallback.is_file().then_some(fallback))
        .ok_or_else(|| {
            anyhow!(
                "the `prometheus` binary is not installed (not on PATH, no /usr/bin/prometheus); \
                 run `hack/install-prometheus.sh` (or `make check-monitoring`) first"
            )
        })
}

/// A Prometheus server on loopback in its own process group, killed (SIGKILL, whole
/// group) on drop.
struct Prometheus {
    child: Option<Child>,
    stdin: Option<ChildStdin>,
    pgid: u32,
    addr: String,
    log: PathBuf,
}

impl Prometheus {
    /// Writes `dir/prometheus.yml` (one job scraping `target` every second) and starts
    /// Prometheus with its data in `dir/data`, listening on a free loopback port.
    fn start(dir: &Path, target: &str) -> Result<Self> {
        let bin = prometheus_binary()?;
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
                 scrape_configs:\n  - job_name: {JOB}\n    metrics_path: /metrics\n    \
                 static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .with_context(|| format!("writing {}", config.display()))?;
        let port = free_port()?;
        let addr = format!("127.0.0.1:{port}");
        let log = dir.join("prometheus.log");
        let out = File::options()
            .create(true)
            .append(true)
            .open(&log)
            .with_context(|| format!("opening {}", log.display()))?;
        let err = out.try_clone()?;
        let mut child = Command::new("sh")
            .args(["-c", r#""$@" & read -r _; kill -9 0"#, "prometheus-e2e"])
            .arg(&bin)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .arg(format!("--web.console.templates={}", dir.display()))
            .arg(format!("--web.console.libraries={}", dir.display()))
            .arg("--log.level=info")
            .current_dir(dir)
            .stdin(Stdio::piped())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        Ok(Self {
            pgid: child.id(),
            stdin: child.stdin.take(),
            child: Some(child),
            addr,
            log,
        })
    }

    /// Fails with the log's tail if Prometheus (or its `sh`) has exited.
    fn ensure_running(&mut self) -> Result<()> {
        let exited = !matches!(self.child.as_mut().map(Child::try_wait), Some(Ok(None)));
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        if exited || text.contains("See you next time") {
            bail!(
                "prometheus exited; last lines of {}:\n{}",
                self.log.display(),
                log_tail(&self.log, 30)
            );
        }
        Ok(())
    }

    /// `GET path` on Prometheus: `(status code, body)`.
    async fn get(&self, path: &str) -> Result<(u16, String)> {
        let (addr, path) = (self.addr.clone(), path.to_string());
        tokio::task::spawn_blocking(move || http_get(&addr, &path))
            .await
            .context("http task")?
    }

    /// Waits for `/-/ready`.
    async fn wait_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + PROM_T;
        loop {
            self.ensure_running()?;
            if let Ok((200, _)) = self.get("/-/ready").await {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!(
                    "prometheus at {} not ready after {PROM_T:?}; last lines of {}:\n{}",
                    self.addr,
                    self.log.display(),
                    log_tail(&self.log, 30)
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// `/api/v1/query?query=<promql>`: the result vector (`[{metric, value: [t, "v"]}]`).
    async fn query(&self, promql: &str) -> Result<Vec<Value>> {
        let (code, body) = self
            .get(&format!("/api/v1/query?query={}", url_encode(promql)))
            .await?;
        let v: Value = serde_json::from_str(&body)
            .with_context(|| format!("query {promql}: HTTP {code}, not JSON: {body}"))?;
        if code != 200 || v["status"] != "success" {
            bail!("query {promql}: HTTP {code}: {body}");
        }
        if v["data"]["resultType"] != "vector" {
            bail!("query {promql}: not a vector: {body}");
        }
        Ok(v["data"]["result"].as_array().cloned().unwrap_or_default())
    }

    /// Polls `promql` until it returns exactly one sample taken at or after `after`
    /// (Unix seconds); returns `(timestamp, value)`.
    async fn sample_after(&mut self, promql: &str, after: f64) -> Result<(f64, f64)> {
        let deadline = Instant::now() + PROM_T;
        loop {
            self.ensure_running()?;
            let last = match self.query(promql).await {
                Ok(result) => {
                    if let [one] = result.as_slice()
                        && let Some((t, v)) = sample(one)
                        && t >= after
                    {
                        return Ok((t, v));
                    }
                    format!("{result:?}")
                }
                Err(e) => format!("{e:#}"),
            };
            if Instant::now() >= deadline {
                let targets = self
                    .get("/api/v1/targets")
                    .await
                    .map(|(_, b)| b)
                    .unwrap_or_default();
                bail!(
                    "no sample of {promql} after t={after:.3} within {PROM_T:?}; last answer: \
                     {last}\ntargets: {targets}\nlast lines of {}:\n{}",
                    self.log.display(),
                    log_tail(&self.log, 20)
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "prometheus log {} (last lines):\n{}",
                self.log.display(),
                log_tail(&self.log, 30)
            );
        }
        if let Some(mut child) = self.child.take() {
            signal_group(self.pgid, "KILL");
            self.stdin = None;
            let _ = child.wait();
        }
    }
}

/// `(timestamp, value)` of one instant-vector element.
fn sample(v: &Value) -> Option<(f64, f64)> {
    let t = v["value"][0].as_f64()?;
    let x = v["value"][1].as_str()?.parse().ok()?;
    Some((t, x))
}

/// Percent-encodes everything but RFC 3986 unreserved characters.
fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A plain HTTP/1.0 GET on loopback (no chunked encoding; the server closes).
fn http_get(addr: &str, path: &str) -> Result<(u16, String)> {
    let mut stream = TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    stream.set_write_timeout(Some(Duration::from_secs(10)))?;
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: {addr}\r\nAccept: */*\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    stream
        .read_to_end(&mut raw)
        .with_context(|| format!("reading GET {path}"))?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow!("GET {path}: no end of headers in {text:?}"))?;
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| anyhow!("GET {path}: bad status line in {head:?}"))?;
    Ok((code, body.to_string()))
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Prometheus scrapes the running operator; what it stored for the policy equals the
/// policy's status: the fragment rate and the plan size; the eviction counters and the
/// window gauge are there too.
#[tokio::test]
async fn prometheus_stores_the_status_fragment_rate() {
    // Before anything else: without the package this test fails, it does not skip.
    prometheus_binary().unwrap();
    let cluster = shared().await.expect("local control plane");
    let ns = cluster.namespace("prom").await.unwrap();
    let name = ns.name().to_string();
    let client = cluster.client().unwrap();
    let pool = Pool::create(cluster, &name, 3, 4).await.unwrap();
    // Three 4-GPU nodes holding 2, 2 and 1 1-GPU pods, 3-GPU targets: the 4 free GPUs of
    // the first two nodes are fragments, 4 of 7 (a rate with no short decimal form).
    fragment(&client, &name, &pool, &[2, 2, 1]).await.unwrap();
    create_policy(
        &client,
        &name,
        &name,
        json!({
            "mode": "DryRun",
            "nodeSelector": pool.selector(),
            "namespaces": {"include": [name]},
            "target": {"shapes": [{"gpus": 3}]},
            "limits": {"maxEvictionsPerRun": 10, "maxEvictionsPerNode": 4,
                       "maxEvictionsPerNamespace": 10},
            "safety": {"minPodAge": "0s"},
        }),
    )
    .await
    .unwrap();
    let metrics_addr = format!("127.0.0.1:{}", free_port().unwrap());
    let op = Operator::start(cluster, &name, &["--metrics-addr", &metrics_addr])
        .await
        .unwrap();
    let mut prom = Prometheus::start(
        &cluster.work_dir().join(format!("prometheus-{name}")),
        &metrics_addr,
    )
    .unwrap();
    prom.wait_ready().await.unwrap();

    let status =
        gpu_defrag_e2e::operator::wait_status(&client, &name, "a checked dry-run plan", T, |s| {
            int_at(s, "/plan/totalMoves").unwrap_or(0) > 0
                && int_at(s, "/plan/dryRunCheck/allowed").unwrap_or(0) > 0
        })
        .await
        .unwrap();
    op.ensure_running().unwrap();
    let rate = float_at(&status, "/fragmentation/fragmentRate").unwrap();
    let moves = int_at(&status, "/plan/totalMoves").unwrap();
    assert!(rate > 0.0, "{status:#}");
    let read_at = unix_now();

    // The target is up, and scraped after the status was read.
    let (_, up) = prom
        .sample_after(&format!("up{{job=\"{JOB}\"}}"), read_at)
        .await
        .unwrap();
    assert_eq!(up, 1.0, "the operator's target is down");
    let (t, stored) = prom
        .sample_after(
            &format!("gpu_defrag_fragment_rate{{policy=\"{name}\"}}"),
            read_at,
        )
        .await
        .unwrap();
    eprintln!(
        "prometheus at t={t:.3}: gpu_defrag_fragment_rate{{policy=\"{name}\"}} = {stored}; \
         status fragmentRate = {rate}"
    );
    // The status did not change meanwhile: the scrape saw the same state.
    let again = gpu_defrag_e2e::operator::policy_status(&client, &name)
        .await
        .unwrap();
    assert_eq!(
        float_at(&again, "/fragmentation/fragmentRate"),
        Some(rate),
        "the status changed during the test: {again:#}"
    );
    // The status rounds the rate to 4 decimals; the metric has every digit.
    assert!(
        (stored - rate).abs() <= 0.5e-4 + 1e-12,
        "prometheus stored fragment rate {stored}, the status says {rate}"
    );
    // The milli behind the rate are integers in both: equal exactly.
    for (metric, field) in [
        ("gpu_defrag_fragment_milli", "/fragmentation/fragmentMilli"),
        ("gpu_defrag_idle_milli", "/fragmentation/idleMilli"),
    ] {
        let (_, v) = prom
            .sample_after(&format!("{metric}{{policy=\"{name}\"}}"), read_at)
            .await
            .unwrap();
        let want = int_at(&status, field).unwrap();
        assert_eq!(v, want as f64, "{metric} vs status {field}");
    }

    let (_, planned) = prom
        .sample_after(
            &format!("gpu_defrag_plan_moves{{policy=\"{name}\"}}"),
            read_at,
        )
        .await
        .unwrap();
    assert_eq!(planned, moves as f64, "plan size: prometheus vs status");
    let (_, window) = prom
        .sample_after(
            &format!("gpu_defrag_window_open{{policy=\"{name}\"}}"),
            read_at,
        )
        .await
        .unwrap();
    assert_eq!(window, 0.0, "a policy without windows has no open window");
    // The eviction counter family: every result exists; the dry-run checks were counted
    // (polled: the counter may trail the status by a scrape).
    let results = wait_for(
        "the dry-run checks in gpu_defrag_evictions_total",
        PROM_T,
        || {
            let prom = &prom;
            let name = &name;
            async move {
                let evictions = prom
                    .query(&format!("gpu_defrag_evictions_total{{policy=\"{name}\"}}"))
                    .await?;
                let mut results: Vec<(String, f64)> = evictions
                    .iter()
                    .filter_map(|s| {
                        Some((s["metric"]["result"].as_str()?.to_string(), sample(s)?.1))
                    })
                    .collect();
                results.sort_by(|a, b| a.0.cmp(&b.0));
                let allowed = results
                    .iter()
                    .any(|r| r.0 == "dry_run_allowed" && r.1 > 0.0);
                Ok(allowed.then_some(results))
            }
        },
    )
    .await
    .unwrap();
    let names: Vec<&str> = results.iter().map(|r| r.0.as_str()).collect();
    assert_eq!(
        names,
        [
            "blocked",
            "bounced",
            "done",
            "dry_run_allowed",
            "dry_run_blocked",
            "failed"
        ],
        "{results:?}"
    );
    assert!(
        results
            .iter()
            .all(|r| r.0.starts_with("dry_run") || r.1 == 0.0),
        "a DryRun policy evicted: {results:?}"
    );

    drop(prom);
    drop(op);
    delete_policy(&client, &name).await.unwrap();
}
