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
    collections::BTreeMap,
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
    case::Case,
    fixtures::wait_for,
    operator::{Operator, delete_policy, float_at, fragment, int_at},
    process::{free_port, log_tail, signal_group},
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

/// One scrape job of the generated configuration.
struct Job {
    name: String,
    target: String,
    /// `honor_labels`: keep the target's own labels on conflicts (else Prometheus renames
    /// them `exported_<name>`).
    honor_labels: bool,
    /// Target labels added to every series.
    labels: Vec<(String, String)>,
}

impl Job {
    fn new(name: &str, target: &str) -> Self {
        Self {
            name: name.into(),
            target: target.into(),
            honor_labels: false,
            labels: Vec::new(),
        }
    }
}

/// A Prometheus server on loopback in its own process group, killed (SIGKILL, whole
/// group) on drop.
struct Prometheus {
    child: Option<Child>,
    stdin: Option<ChildStdin>,
    pgid: u32,
    addr: String,
    log: PathBuf,
    /// Started with a web config (TLS, users): the test's plain client cannot ask it.
    web_config: bool,
}

impl Prometheus {
    /// Writes `dir/prometheus.yml` (one job scraping `target` every second) and starts
    /// Prometheus with its data in `dir/data`, listening on a free loopback port.
    fn start(dir: &Path, target: &str) -> Result<Self> {
        Self::start_jobs(dir, &[Job::new(JOB, target)])
    }

    /// Like [`Prometheus::start`], scraping every job every second.
    fn start_jobs(dir: &Path, jobs: &[Job]) -> Result<Self> {
        Self::start_with_web_config(dir, jobs, None)
    }

    /// Like [`Prometheus::start_jobs`], serving its API as `web_config` says (TLS, users).
    fn start_with_web_config(dir: &Path, jobs: &[Job], web_config: Option<&Path>) -> Result<Self> {
        let bin = prometheus_binary()?;
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let config = dir.join("prometheus.yml");
        let mut text = String::from(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
             scrape_configs:\n",
        );
        for j in jobs {
            text += &format!(
                "  - job_name: {}\n    metrics_path: /metrics\n    honor_labels: {}\n    \
                 static_configs:\n      - targets: ['{}']\n",
                j.name, j.honor_labels, j.target
            );
            if !j.labels.is_empty() {
                text += "        labels:\n";
                for (k, v) in &j.labels {
                    text += &format!("          {k}: '{v}'\n");
                }
            }
        }
        std::fs::write(&config, text).with_context(|| format!("writing {}", config.display()))?;
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
            .args(web_config.map(|w| format!("--web.config.file={}", w.display())))
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
            web_config: web_config.is_some(),
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

    /// Waits for `/-/ready` (with a web config: for its log to say it is ready).
    async fn wait_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + PROM_T;
        loop {
            self.ensure_running()?;
            if self.web_config {
                let text = std::fs::read_to_string(&self.log).unwrap_or_default();
                if text.contains("Server is ready to receive web requests") {
                    return Ok(());
                }
            } else if let Ok((200, _)) = self.get("/-/ready").await {
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
    let c = Case::new("prom", 3, 4).await;
    let (cluster, client, name) = (c.cluster, c.client.clone(), c.name().to_string());
    // Three 4-GPU nodes holding 2, 2 and 1 1-GPU pods, 3-GPU targets: the 4 free GPUs of
    // the first two nodes are fragments, 4 of 7 (a rate with no short decimal form).
    fragment(&client, &name, &c.pool, &[2, 2, 1]).await.unwrap();
    c.dry_run_policy(
        json!([{"gpus": 3}]),
        json!({"maxEvictionsPerRun": 10, "maxEvictionsPerNode": 4, "maxEvictionsPerNamespace": 10}),
    )
    .await;
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

// === allocated-but-idle GPUs ===

/// A stand-in for dcgm-exporter (which needs GPUs): serves `/metrics` in the Prometheus text
/// format from loopback, with whatever body the test sets. Plain threads; stops on drop.
struct FakeDcgm {
    addr: String,
    body: std::sync::Arc<std::sync::Mutex<String>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl FakeDcgm {
    fn start() -> Result<Self> {
        use std::sync::atomic::Ordering;
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?.to_string();
        let body = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (shared, stopped) = (body.clone(), stop.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stopped.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(mut s) = conn else { continue };
                let body = shared.clone();
                std::thread::spawn(move || {
                    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                    let _ = s.set_write_timeout(Some(Duration::from_secs(5)));
                    // Read the request head (Prometheus sends no body), at most 16 KiB.
                    let mut head = Vec::new();
                    let mut buf = [0u8; 2048];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 << 10 {
                        match s.read(&mut buf) {
                            Ok(n) if n > 0 => head.extend_from_slice(&buf[..n]),
                            _ => return,
                        }
                    }
                    let text = body.lock().map(|b| b.clone()).unwrap_or_default();
                    let reply = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n\
                         Content-Length: {}\r\nConnection: close\r\n\r\n{text}",
                        text.len()
                    );
                    let _ = s.write_all(reply.as_bytes());
                    let _ = s.shutdown(std::net::Shutdown::Write);
                });
            }
        });
        Ok(Self { addr, body, stop })
    }

    fn serve(&self, text: String) {
        if let Ok(mut b) = self.body.lock() {
            *b = text;
        }
    }
}

impl Drop for FakeDcgm {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect(&self.addr);
    }
}

/// One GPU as dcgm-exporter reports it with its Kubernetes pod mapping.
#[derive(Clone)]
struct DcgmGpu {
    host: String,
    gpu: u32,
    /// `(namespace, pod)`; `None`: a free GPU (empty labels, as dcgm-exporter writes them).
    pod: Option<(String, String)>,
    /// `DCGM_FI_PROF_SM_ACTIVE` (0..1), if the GPU has profiling metrics.
    sm_active: Option<f64>,
    /// `DCGM_FI_DEV_GPU_UTIL` (0..100).
    gpu_util: Option<f64>,
}

/// The exposition text of `gpus`, labelled as dcgm-exporter labels them.
fn dcgm_text(gpus: &[DcgmGpu]) -> String {
    let mut out = String::new();
    for (metric, help, get) in [
        (
            "DCGM_FI_PROF_SM_ACTIVE",
            "The ratio of cycles an SM has at least 1 warp assigned.",
            (|g: &DcgmGpu| g.sm_active) as fn(&DcgmGpu) -> Option<f64>,
        ),
        (
            "DCGM_FI_DEV_GPU_UTIL",
            "GPU utilization (in %).",
            |g: &DcgmGpu| g.gpu_util,
        ),
    ] {
        out += &format!("# HELP {metric} {help}\n# TYPE {metric} gauge\n");
        for g in gpus {
            let Some(v) = get(g) else { continue };
            let (ns, pod) = g.pod.clone().unwrap_or_default();
            let container = if pod.is_empty() { "" } else { "main" };
            out += &format!(
                "{metric}{{gpu=\"{}\",UUID=\"GPU-{}-{}\",device=\"nvidia{}\",\
                 modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"{}\",container=\"{container}\",\
                 namespace=\"{ns}\",pod=\"{pod}\"}} {v}\n",
                g.gpu, g.host, g.gpu, g.gpu, g.host
            );
        }
    }
    out
}

/// `GET path` on the operator's metrics address: the body.
async fn scrape(addr: &str) -> Result<String> {
    let addr = addr.to_string();
    let (code, body) = tokio::task::spawn_blocking(move || http_get(&addr, "/metrics")).await??;
    if code != 200 {
        bail!("GET /metrics: HTTP {code}");
    }
    Ok(body)
}

/// Pods of the test whose DCGM series say idle are reported, exactly, in status and in
/// metrics (stored by the real Prometheus), through both label layouts (the exporter's own
/// `pod`/`namespace`, and `exported_pod`/`exported_namespace` after a scrape that renames
/// them); SM activity wins over GPU utilisation; a pod turning busy leaves the set; when
/// Prometheus goes away, status and metrics say so and report no idle GPUs at all.
#[tokio::test]
async fn idle_allocated_gpus_come_from_dcgm_series_in_prometheus() {
    prometheus_binary().unwrap();
    let c = Case::new("idle", 3, 4).await;
    let (cluster, client, name, pool) =
        (c.cluster, c.client.clone(), c.name().to_string(), &c.pool);
    fragment(&client, &name, pool, &[2, 2, 1]).await.unwrap();
    let mut running: Vec<(String, String)> =
        gpu_defrag_e2e::fixtures::pods(&client, &name, "e2e-role=infer")
            .await
            .unwrap()
            .iter()
            .filter_map(|p| {
                Some((
                    p.metadata.name.clone()?,
                    p.spec.as_ref()?.node_name.clone()?,
                ))
            })
            .collect();
    running.sort();
    assert_eq!(running.len(), 5, "{running:?}");

    // Five 1-GPU pods: idle by SM activity, busy by SM activity, busy by SM activity with a
    // low utilisation (SM activity wins), idle by utilisation (no SM series), busy by
    // utilisation. Plus the free GPUs of the pool and a pod that does not exist.
    let plan: [(Option<f64>, Option<f64>); 5] = [
        (Some(0.05), Some(40.0)),
        (Some(0.9), Some(99.0)),
        (Some(0.8), Some(5.0)),
        (None, Some(12.0)),
        (None, Some(95.0)),
    ];
    let mut next_gpu: BTreeMap<String, u32> = BTreeMap::new();
    let mut gpus: Vec<DcgmGpu> = running
        .iter()
        .zip(plan)
        .map(|((pod, node), (sm, util))| {
            let i = next_gpu.entry(node.clone()).or_default();
            *i += 1;
            DcgmGpu {
                host: node.clone(),
                gpu: *i - 1,
                pod: Some((name.clone(), pod.clone())),
                sm_active: sm,
                gpu_util: util,
            }
        })
        .collect();
    for node in &pool.nodes {
        let used = next_gpu.get(node).copied().unwrap_or(0);
        for g in used..pool.gpus_per_node {
            gpus.push(DcgmGpu {
                host: node.clone(),
                gpu: g,
                pod: None,
                sm_active: Some(0.0),
                gpu_util: Some(0.0),
            });
        }
    }
    gpus.push(DcgmGpu {
        host: "elsewhere".into(),
        gpu: 0,
        pod: Some((name.clone(), "no-such-pod".into())),
        sm_active: Some(0.0),
        gpu_util: Some(0.0),
    });
    let idle_pods = [
        format!("{name}/{}", running[0].0),
        format!("{name}/{}", running[3].0),
    ];
    // Exporter A (scraped with honor_labels: true) serves pods 0, 1, 4 and the free GPUs;
    // exporter B (scraped with target labels pod/namespace, honor_labels: false: the series'
    // own become exported_pod/exported_namespace) serves pods 2 and 3 and the stray pod.
    let on_b = |g: &DcgmGpu| {
        g.pod
            .as_ref()
            .is_some_and(|(_, p)| p == &running[2].0 || p == &running[3].0 || p == "no-such-pod")
    };
    let (a_gpus, b_gpus): (Vec<DcgmGpu>, Vec<DcgmGpu>) =
        gpus.iter().cloned().partition(|g| !on_b(g));
    let (a, b) = (FakeDcgm::start().unwrap(), FakeDcgm::start().unwrap());
    a.serve(dcgm_text(&a_gpus));
    b.serve(dcgm_text(&b_gpus));

    c.dry_run_policy(json!([{"gpus": 3}]), json!({})).await;
    let metrics_addr = format!("127.0.0.1:{}", free_port().unwrap());
    let mut dcgm_b = Job::new("dcgm-b", &b.addr);
    dcgm_b.labels = vec![
        ("pod".into(), "nvidia-dcgm-exporter-b".into()),
        ("namespace".into(), "gpu-operator".into()),
    ];
    let mut dcgm_a = Job::new("dcgm-a", &a.addr);
    dcgm_a.honor_labels = true;
    // Built first, so the clock below measures Prometheus's data, not the build.
    gpu_defrag_e2e::operator::operator_binary().await.unwrap();
    let started = Instant::now();
    let mut prom = Prometheus::start_jobs(
        &cluster.work_dir().join(format!("prometheus-{name}")),
        &[Job::new(JOB, &metrics_addr), dcgm_a, dcgm_b],
    )
    .unwrap();
    prom.wait_ready().await.unwrap();
    let lookback = 15;
    let op = Operator::start(
        cluster,
        &name,
        &[
            "--metrics-addr",
            &metrics_addr,
            "--prometheus-url",
            &format!("http://{}", prom.addr),
            "--idle-lookback",
            &format!("{lookback}s"),
            "--idle-refresh",
            "1s",
            "--prometheus-timeout",
            "3s",
        ],
    )
    .await
    .unwrap();

    // Prometheus renamed exporter B's labels (the layout the operator must also read).
    let renamed = prom
        .sample_after(
            &format!("DCGM_FI_DEV_GPU_UTIL{{exported_pod=\"{}\"}}", running[3].0),
            0.0,
        )
        .await
        .unwrap();
    assert_eq!(renamed.1, 12.0);

    let idle_names = |s: &Value| -> Vec<String> {
        let mut v: Vec<String> = s
            .pointer("/idleAllocated/idlePods")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|p| p["pod"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    };
    let status = gpu_defrag_e2e::operator::wait_status(
        &client,
        &name,
        "the idle pods in status.idleAllocated",
        Duration::from_secs(120),
        |s| int_at(s, "/idleAllocated/pods").unwrap_or(0) > 0,
    )
    .await
    .unwrap();
    op.ensure_running().unwrap();
    // A window without data at its start is never read as idle: the first pods appear only
    // once the series are older than the lookback.
    assert!(
        started.elapsed() >= Duration::from_secs(lookback),
        "idle pods {:?} after Prometheus started, before its series covered the {lookback}s window: {status:#}",
        started.elapsed()
    );
    eprintln!(
        "first idle pods after {:.1}s: {}",
        started.elapsed().as_secs_f64(),
        serde_json::to_string(&status["idleAllocated"]).unwrap()
    );
    // The two exporters are scraped at different moments, so one's series may cover the
    // window a scrape before the other's: the full answer is read once every pod is measured.
    let status = gpu_defrag_e2e::operator::wait_status(
        &client,
        &name,
        "all five GPU pods measured",
        Duration::from_secs(60),
        |s| int_at(s, "/idleAllocated/measuredPods") == Some(5),
    )
    .await
    .unwrap();
    assert_eq!(idle_names(&status), idle_pods, "{status:#}");
    let at = |p: &str| int_at(&status, &format!("/idleAllocated/{p}"));
    assert_eq!(
        (
            at("pods"),
            at("gpus"),
            at("milli"),
            at("gpuPods"),
            at("measuredPods")
        ),
        (Some(2), Some(2), Some(2000), Some(5), Some(5)),
        "{status:#}"
    );
    assert_eq!(float_at(&status, "/idleAllocated/threshold"), Some(0.3));
    assert_eq!(
        gpu_defrag_e2e::operator::str_at(&status, "/idleAllocated/lookback"),
        Some("15s")
    );
    let peaks: Vec<f64> = status["idleAllocated"]["idlePods"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["peakActivity"].as_f64())
        .collect();
    let mut peaks_sorted = peaks.clone();
    peaks_sorted.sort_by(f64::total_cmp);
    assert_eq!(peaks_sorted, [0.05, 0.12], "{status:#}");
    let (cs, reason, _) =
        gpu_defrag_e2e::operator::condition_parts(&status, "IdleData").expect("IdleData");
    assert_eq!((cs.as_str(), reason.as_str()), ("True", "Measured"));

    // The same numbers stored by Prometheus from the operator's /metrics, scraped after the
    // status was read (an instant query shows the evaluation time, so filter on the
    // sample's own timestamp).
    let read_at = unix_now();
    for (metric, want) in [
        ("gpu_defrag_idle_allocated_pods", 2.0),
        ("gpu_defrag_idle_allocated_gpus", 2.0),
        ("gpu_defrag_idle_allocated_milli", 2000.0),
    ] {
        let q = format!("{metric}{{policy=\"{name}\"}}");
        let (_, v) = prom
            .sample_after(&format!("{q} and timestamp({q}) >= {read_at:.3}"), read_at)
            .await
            .unwrap();
        assert_eq!(v, want, "{metric}");
    }

    // The idle pod by SM activity gets busy: it leaves the set at once (one busy sample in
    // the window is enough).
    let mut busier = a_gpus.clone();
    for g in &mut busier {
        if g.pod.as_ref().is_some_and(|(_, p)| p == &running[0].0) {
            g.sm_active = Some(0.6);
        }
    }
    a.serve(dcgm_text(&busier));
    let status = gpu_defrag_e2e::operator::wait_status(
        &client,
        &name,
        "only the utilisation-idle pod left",
        Duration::from_secs(60),
        |s| int_at(s, "/idleAllocated/pods") == Some(1),
    )
    .await
    .unwrap();
    assert_eq!(idle_names(&status), [idle_pods[1].clone()], "{status:#}");
    assert_eq!(int_at(&status, "/idleAllocated/milli"), Some(1000));

    // Prometheus goes away: no idle data at all, and a reason.
    drop(prom);
    let status = gpu_defrag_e2e::operator::wait_status(
        &client,
        &name,
        "IdleData=False after Prometheus stopped",
        Duration::from_secs(60),
        |s| {
            gpu_defrag_e2e::operator::condition_parts(s, "IdleData")
                .is_some_and(|(st, _, _)| st == "False")
        },
    )
    .await
    .unwrap();
    let (_, reason, message) =
        gpu_defrag_e2e::operator::condition_parts(&status, "IdleData").unwrap();
    assert_eq!(reason, "PrometheusUnreachable", "{message}");
    assert!(status.get("idleAllocated").is_none(), "{status:#}");
    let text = scrape(&metrics_addr).await.unwrap();
    assert!(
        !text.contains(&format!(
            "gpu_defrag_idle_allocated_gpus{{policy=\"{name}\"}}"
        )),
        "idle series still exported without data:\n{text}"
    );
    let errors: f64 = text
        .lines()
        .filter(|l| l.starts_with("gpu_defrag_idle_query_errors_total{kind=\"unreachable\"}"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(errors >= 1.0, "no unreachable errors counted:\n{text}");
    op.ensure_running().unwrap();

    drop(op);
    drop((a, b));
    delete_policy(&client, &name).await.unwrap();
}

/// bcrypt (cost 10) of [`PROM_PASSWORD`], for Prometheus's `basic_auth_users`.
const PROM_PASSWORD_BCRYPT: &str = "$2b$10$Bq2TeBBtGxzwkhnGJFcGN.4vBh4dygpHeBnT7lpEIYK7CJEG7rMLK";
/// The password of the test's Prometheus user.
const PROM_PASSWORD: &str = "e2e-prometheus-password";

/// A Prometheus that serves its API over TLS (a certificate of the test's own CA) to one
/// basic-auth user: the operator, given the CA and the user, reads the idle pods through
/// it. With a wrong password Prometheus refuses (401) and status says so; the password
/// file is read at every query, so writing the right one is enough, no restart.
#[tokio::test]
async fn idle_data_through_https_and_basic_auth() {
    prometheus_binary().unwrap();
    let c = Case::new("idletls", 1, 2).await;
    let (cluster, client, name) = (c.cluster, c.client.clone(), c.name().to_string());
    fragment(&client, &name, &c.pool, &[1]).await.unwrap();
    let pods = gpu_defrag_e2e::fixtures::pods(&client, &name, "e2e-role=infer")
        .await
        .unwrap();
    let [pod] = pods.as_slice() else {
        panic!("one pod expected, got {}", pods.len());
    };
    let pod_name = pod.metadata.name.clone().unwrap();
    let node = pod.spec.as_ref().unwrap().node_name.clone().unwrap();
    let dcgm = FakeDcgm::start().unwrap();
    dcgm.serve(dcgm_text(&[DcgmGpu {
        host: node,
        gpu: 0,
        pod: Some((name.clone(), pod_name.clone())),
        sm_active: Some(0.02),
        gpu_util: Some(3.0),
    }]));
    c.dry_run_policy(json!([{"gpus": 2}]), json!({})).await;

    // TLS and the user: a CA of the test's own, a certificate for 127.0.0.1.
    let dir = cluster.work_dir().join(format!("prometheus-{name}"));
    std::fs::create_dir_all(&dir).unwrap();
    let pki = gpu_defrag_e2e::pki::Pki::create(&dir).unwrap();
    let web = dir.join("web.yml");
    std::fs::write(
        &web,
        format!(
            "tls_server_config:\n  cert_file: {}\n  key_file: {}\nbasic_auth_users:\n  gpu-defrag: '{PROM_PASSWORD_BCRYPT}'\n",
            pki.admin_crt.display(),
            pki.admin_key.display()
        ),
    )
    .unwrap();
    let password = dir.join("password");
    std::fs::write(&password, "not-the-password\n").unwrap();
    let mut prom =
        Prometheus::start_with_web_config(&dir, &[Job::new("dcgm", &dcgm.addr)], Some(&web))
            .unwrap();
    prom.wait_ready().await.unwrap();
    let url = format!("https://{}", prom.addr);
    let op = Operator::start(
        cluster,
        &name,
        &[
            "--prometheus-url",
            &url,
            "--prometheus-ca-file",
            pki.ca_crt.to_str().unwrap(),
            "--prometheus-username",
            "gpu-defrag",
            "--prometheus-password-file",
            password.to_str().unwrap(),
            "--idle-lookback",
            "5s",
            "--idle-refresh",
            "1s",
            "--prometheus-timeout",
            "3s",
        ],
    )
    .await
    .unwrap();
    let idle_data = |s: &Value| gpu_defrag_e2e::operator::condition_parts(s, "IdleData");
    let status = gpu_defrag_e2e::operator::wait_status(
        &client,
        &name,
        "IdleData=False: the wrong password is refused",
        T,
        |s| idle_data(s).is_some_and(|(st, _, m)| st == "False" && m.contains("401")),
    )
    .await
    .unwrap();
    let (_, reason, _) = idle_data(&status).unwrap();
    assert_eq!(reason, "PrometheusError");
    assert!(status.get("idleAllocated").is_none(), "{status:#}");

    std::fs::write(&password, format!("{PROM_PASSWORD}\n")).unwrap();
    let status = gpu_defrag_e2e::operator::wait_status(
        &client,
        &name,
        "the idle pod read over https",
        Duration::from_secs(90),
        |s| int_at(s, "/idleAllocated/pods") == Some(1),
    )
    .await
    .unwrap();
    let (st, reason, _) = idle_data(&status).unwrap();
    assert_eq!((st.as_str(), reason.as_str()), ("True", "Measured"));
    assert_eq!(
        gpu_defrag_e2e::operator::str_at(&status, "/idleAllocated/idlePods/0/pod"),
        Some(format!("{name}/{pod_name}").as_str()),
        "{status:#}"
    );
    op.ensure_running().unwrap();
    drop(op);
    drop(prom);
    drop(dcgm);
    delete_policy(&client, &name).await.unwrap();
}
