//! [`TestCluster`]: etcd, kube-apiserver, kube-controller-manager, two kube-schedulers (the
//! stock default scheduler, and `gpu-binpack` with `config/scheduler/gpu-binpack.yaml`) and
//! kwok on free loopback ports, with their own PKI, in one work dir. GPU pods opt in to
//! `gpu-binpack` by `spec.schedulerName` ([`crate::fixtures::GPU_SCHEDULER`]).
//!
//! ```text
//! work dir/
//!   pki/{ca,admin}.{crt,key}   kubeconfig          gpu-binpack.yaml stages.yaml (copy)
//!   logs/<component>.log       etcd/ (data)        apiserver/ (cert dir)
//!   users/<user>.{crt,key,kubeconfig}              keep (present = not removed at exit)
//! ```
//!
//! Start order: etcd → kube-apiserver (`/readyz`, namespace `default`) → CRDs (Established)
//! → kube-controller-manager, kube-schedulers, kwok (`/healthz`) → GPU nodes (Ready).

mod components;
mod crds;
mod credentials;
mod namespace;
mod nodes;
mod spawn;

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    sync::{
        Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context, Result, anyhow, bail};
use kube::Client;

use crate::{
    pki::Pki,
    process::{Component, Reaper, free_port},
};

pub use namespace::TestNamespace;
pub use nodes::{GpuNodes, node_usable};
pub use spawn::insecure_get;

/// Field manager of everything the harness applies.
pub const FIELD_MANAGER: &str = "gpu-defrag-e2e";
/// Annotation that puts a node under kwok's management.
pub const KWOK_NODE_ANNOTATION: &str = "kwok.x-k8s.io/node";
pub use crate::fixtures::GPU_RESOURCE;
/// Label with the GPU model (as published by NVIDIA GPU feature discovery).
pub const GPU_PRODUCT_LABEL: &str = "nvidia.com/gpu.product";
/// Label on namespaces created by [`TestCluster::namespace`].
pub const TEST_NAMESPACE_LABEL: &str = "e2e.gpu-defrag.io/test";
/// Process (and log) name of the `gpu-binpack` scheduler; the binary is kube-scheduler.
pub const BINPACK_COMPONENT: &str = "gpu-binpack";

/// The binary a component runs: its name, but for the second scheduler, which is the same
/// binary as the first.
pub fn component_binary(name: &str) -> &str {
    if name == BINPACK_COMPONENT {
        "kube-scheduler"
    } else {
        name
    }
}
/// Default GPU model of the nodes.
pub const DEFAULT_GPU_MODEL: &str = "NVIDIA-A100-SXM4-80GB";

/// Root of the repository (the e2e crate's parent dir).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// The control plane binaries: `$GPU_DEFRAG_CLUSTER_BIN` if set, else the output of
/// `e2e/cluster/build.sh`, which builds them once (tens of minutes cold) and then returns
/// the cached dir immediately.
pub fn bin_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("GPU_DEFRAG_CLUSTER_BIN") {
        return Ok(PathBuf::from(dir));
    }
    let script = repo_root().join("e2e/cluster/build.sh");
    let out = Command::new("bash")
        .arg(&script)
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        bail!("{} failed ({})", script.display(), out.status);
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let dir = stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .ok_or_else(|| anyhow!("{} printed no bin dir", script.display()))?;
    Ok(PathBuf::from(dir.trim()))
}

/// How to start a [`TestCluster`].
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// Work dir; `None` makes a fresh one under the system temp dir.
    pub work_dir: Option<PathBuf>,
    /// Dir with the binaries; `None` runs [`bin_dir`].
    pub bin_dir: Option<PathBuf>,
    /// Every `*.yaml` in it is applied (CRDs); `None` skips.
    pub crds_dir: Option<PathBuf>,
    /// The `gpu-binpack` second scheduler's KubeSchedulerConfiguration
    /// (`config/scheduler/gpu-binpack.yaml`), run beside the stock default scheduler with
    /// `clientConnection.kubeconfig` filled in and leader election off; `None` runs the
    /// default scheduler alone (the install test runs gpu-binpack as its Deployment would).
    pub binpack_scheduler: Option<PathBuf>,
    /// GPU nodes to create at start.
    pub nodes: usize,
    /// GPUs per node.
    pub gpus_per_node: u32,
    /// GPU model (label `nvidia.com/gpu.product`).
    pub gpu_model: String,
    /// Budget for each component to become healthy.
    pub timeout: Duration,
    /// No reaper: the processes outlive this process (`cluster-up`); see
    /// [`TestCluster::detach`].
    pub detached: bool,
    /// Keep the work dir after the stack stops (also `GPU_DEFRAG_E2E_KEEP=1`).
    pub keep: bool,
    /// kube-controller-manager's `--controllers` (default `*`, all of them). The scale test
    /// turns the ReplicaSet controller off so that it can create the pods of 600
    /// ReplicaSets itself, already bound, in seconds.
    pub kcm_controllers: String,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        let root = repo_root();
        Self {
            work_dir: None,
            bin_dir: None,
            crds_dir: Some(root.join("crds")),
            binpack_scheduler: Some(root.join("config/scheduler/gpu-binpack.yaml")),
            nodes: 8,
            gpus_per_node: 8,
            gpu_model: DEFAULT_GPU_MODEL.to_string(),
            timeout: Duration::from_secs(90),
            detached: false,
            keep: std::env::var("GPU_DEFRAG_E2E_KEEP").is_ok_and(|v| v == "1" || v == "true"),
            kcm_controllers: "*".to_string(),
        }
    }
}

/// A running local control plane. Dropping it (or [`TestCluster::stop`]) kills every
/// component; a reaper kills them too if the process exits without dropping it.
#[derive(Debug)]
pub struct TestCluster {
    work_dir: PathBuf,
    bin_dir: PathBuf,
    pki: Pki,
    kubeconfig: PathBuf,
    api_port: u16,
    etcd_port: u16,
    kcm_controllers: String,
    ca_der: Vec<u8>,
    components: Mutex<Vec<Component>>,
    reaper: Mutex<Option<Reaper>>,
    node_seq: AtomicUsize,
    detached: bool,
    started_in: Duration,
}

fn unique_suffix() -> String {
    static SEQ: AtomicUsize = AtomicUsize::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    format!(
        "{:x}{:x}",
        (nanos ^ std::process::id().rotate_left(16)) & 0xfffff,
        n
    )
}

impl TestCluster {
    /// Starts a whole stack and waits until it is usable; see the module docs.
    pub async fn start(opts: ClusterOptions) -> Result<Self> {
        let t0 = Instant::now();
        let bin_dir = match &opts.bin_dir {
            Some(d) => d.clone(),
            None => tokio::task::spawn_blocking(bin_dir)
                .await
                .context("build task")??,
        };
        let work_dir = match &opts.work_dir {
            Some(d) => d.clone(),
            None => std::env::temp_dir().join(format!("gpu-defrag-e2e-{}", unique_suffix())),
        };
        fs::create_dir_all(work_dir.join("logs"))
            .with_context(|| format!("creating {}", work_dir.display()))?;
        let work_dir = work_dir.canonicalize().context("resolving the work dir")?;
        if opts.keep {
            fs::write(work_dir.join("keep"), "").context("writing the keep marker")?;
        }
        let reaper = if opts.detached {
            None
        } else {
            Some(Reaper::start(&work_dir)?)
        };
        let pki = Pki::create(&work_dir)?;
        let ca_der = pki.ca_der()?;
        let mut cluster = Self {
            kubeconfig: work_dir.join("kubeconfig"),
            work_dir,
            bin_dir,
            pki,
            api_port: 0,
            etcd_port: 0,
            kcm_controllers: opts.kcm_controllers.clone(),
            ca_der,
            components: Mutex::new(Vec::new()),
            reaper: Mutex::new(reaper),
            node_seq: AtomicUsize::new(0),
            detached: false,
            started_in: Duration::ZERO,
        };
        match cluster.boot(&opts).await {
            Ok(()) => {
                cluster.started_in = t0.elapsed();
                cluster.detached = opts.detached;
                Ok(cluster)
            }
            Err(e) => {
                cluster.keep();
                Err(e.context(format!(
                    "starting the local control plane failed; logs kept in {}",
                    cluster.logs_dir().display()
                )))
            }
        }
    }

    async fn boot(&mut self, opts: &ClusterOptions) -> Result<()> {
        let etcd = self.start_etcd(opts.timeout).await?;
        let etcd_port = etcd.ports[0];
        self.etcd_port = etcd_port;
        self.push(etcd.component)?;
        let api = self.start_apiserver(etcd_port, opts.timeout).await?;
        self.api_port = api.ports[0];
        self.push(api.component)?;
        self.wait_default_namespace(opts.timeout).await?;
        if let Some(dir) = &opts.crds_dir {
            self.apply_crds(dir).await?;
        }
        let binpack_cfg = match &opts.binpack_scheduler {
            Some(template) => Some(self.write_scheduler_config(template)?),
            None => None,
        };
        // The clients start in parallel; their health is checked afterwards.
        let kcm_port = free_port()?;
        let kcm = self.spawn("kube-controller-manager", self.kcm_args(kcm_port))?;
        let sched_port = free_port()?;
        let sched = self.spawn("kube-scheduler", self.scheduler_args(sched_port, None))?;
        let binpack = match &binpack_cfg {
            Some(cfg) => {
                let port = free_port()?;
                let c = self.spawn(BINPACK_COMPONENT, self.scheduler_args(port, Some(cfg)))?;
                Some((c, port, cfg))
            }
            None => None,
        };
        let kwok = self.spawn_kwok()?;
        self.push(kwok)?;
        let kcm = self
            .settle(
                "kube-controller-manager",
                kcm,
                kcm_port,
                opts.timeout,
                |p| self.kcm_args(p),
            )
            .await?;
        self.push(kcm)?;
        let sched = self
            .settle("kube-scheduler", sched, sched_port, opts.timeout, |p| {
                self.scheduler_args(p, None)
            })
            .await?;
        self.push(sched)?;
        if let Some((c, port, cfg)) = binpack {
            let c = self
                .settle(BINPACK_COMPONENT, c, port, opts.timeout, |p| {
                    self.scheduler_args(p, Some(cfg))
                })
                .await?;
            self.push(c)?;
        }
        if opts.nodes > 0 {
            let nodes = GpuNodes::new(opts.nodes, opts.gpus_per_node).model(opts.gpu_model.clone());
            self.add_nodes(&nodes).await?;
        }
        Ok(())
    }

    // === accessors ===

    /// An admin (`system:masters`) client. Make it inside the runtime that uses it: a
    /// client is bound to the tokio runtime it was built in (each `#[tokio::test]` has its
    /// own), so build one per test rather than sharing it.
    pub fn client(&self) -> Result<Client> {
        self.client_for_port(self.api_port)
    }

    /// The admin kubeconfig.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// `https://127.0.0.1:<port>`.
    pub fn server_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.api_port)
    }

    /// The work dir (PKI, kubeconfigs, logs, data).
    pub fn work_dir(&self) -> &Path {
        &self.work_dir
    }

    /// The dir of the component logs (`<component>.log`).
    pub fn logs_dir(&self) -> PathBuf {
        self.work_dir.join("logs")
    }

    /// The dir of the control plane binaries.
    pub fn bin_dir(&self) -> &Path {
        &self.bin_dir
    }

    /// The built kubectl.
    pub fn kubectl_path(&self) -> PathBuf {
        self.bin("kubectl")
    }

    /// A `kubectl` command bound to the admin kubeconfig.
    pub fn kubectl(&self) -> Command {
        let mut cmd = Command::new(self.kubectl_path());
        cmd.arg(format!("--kubeconfig={}", self.kubeconfig.display()));
        cmd
    }

    /// The CA certificate file.
    pub fn ca_path(&self) -> &Path {
        &self.pki.ca_crt
    }

    /// How long [`TestCluster::start`] took (binaries present, through nodes Ready).
    pub fn started_in(&self) -> Duration {
        self.started_in
    }

    /// `(name, process group id, log file)` of each component.
    pub fn components(&self) -> Vec<(String, u32, PathBuf)> {
        self.components
            .lock()
            .map(|cs| {
                cs.iter()
                    .map(|c| (c.name.clone(), c.pgid, c.log.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Keeps the work dir after the stack stops (for a failing test's logs).
    pub fn keep(&self) {
        let _ = fs::write(self.work_dir.join("keep"), "");
    }

    /// One line telling where the logs are.
    pub fn describe(&self) -> String {
        format!(
            "local control plane at {} (kubeconfig {}); component logs in {}",
            self.server_url(),
            self.kubeconfig.display(),
            self.logs_dir().display()
        )
    }

    // === teardown ===

    /// Kills every component (SIGTERM, then SIGKILL, by process group), newest first.
    /// Idempotent. The work dir is removed unless it was kept.
    pub fn stop(&self) {
        if let Ok(mut components) = self.components.lock() {
            while let Some(mut c) = components.pop() {
                c.stop(Duration::from_secs(5));
            }
        }
        if let Ok(mut reaper) = self.reaper.lock()
            && let Some(mut reaper) = reaper.take()
        {
            reaper.finish();
        }
    }

    /// Leaves the processes running after this value is gone (the `cluster-up` stack);
    /// returns `(name, process group id, log)` of each.
    pub fn detach(mut self) -> Vec<(String, u32, PathBuf)> {
        let list = self.components();
        if let Ok(mut components) = self.components.lock() {
            for c in components.iter_mut() {
                c.detach();
            }
        }
        self.detached = true;
        list
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        if self.detached {
            return;
        }
        if std::thread::panicking() {
            self.keep();
            eprintln!("{}", self.describe());
        }
        self.stop();
    }
}
