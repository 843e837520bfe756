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

use std::{
    collections::BTreeMap,
    fs,
    io::{Read, Write},
    net::TcpStream,
    path::{Path, PathBuf},
    process::Command,
    sync::{
        Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context, Result, anyhow, bail};
use k8s_openapi::{
    api::core::v1::{Namespace, Node, Taint},
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{
    Api, Client, Config,
    api::{ListParams, Patch, PatchParams, PostParams},
    config::AuthInfo,
};
use serde::Deserialize;
use serde_json::json;

use crate::{
    pki::Pki,
    process::{Component, Reaper, free_port, log_tail},
};

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

/// A set of kwok GPU nodes to create; see [`TestCluster::add_nodes`].
#[derive(Debug, Clone)]
pub struct GpuNodes {
    /// How many nodes.
    pub count: usize,
    /// `nvidia.com/gpu` capacity of each.
    pub gpus_per_node: u32,
    /// GPU model (label `nvidia.com/gpu.product`).
    pub model: String,
    /// Name prefix; names are `<prefix>-<n>` with `n` unique in the cluster.
    pub name_prefix: String,
    /// CPU capacity (quantity).
    pub cpu: String,
    /// Memory capacity (quantity).
    pub memory: String,
    /// Pod capacity.
    pub pods: u32,
    /// Extra labels.
    pub labels: BTreeMap<String, String>,
    /// Extra annotations (e.g. GPU sharing settings).
    pub annotations: BTreeMap<String, String>,
    /// Taints (none by default).
    pub taints: Vec<Taint>,
    /// More allocatable resources (a sharing scheme's, e.g. `koordinator.sh/gpu-core`).
    pub resources: BTreeMap<String, String>,
    /// Whether the GPUs are an extended resource (`nvidia.com/gpu` in allocatable, a
    /// device plugin's way); off for GPUs published only in DRA ResourceSlices.
    pub extended_resource: bool,
}

impl GpuNodes {
    /// `count` nodes with `gpus_per_node` GPUs of the default model, 64 CPUs, 512Gi.
    pub fn new(count: usize, gpus_per_node: u32) -> Self {
        Self {
            count,
            gpus_per_node,
            model: DEFAULT_GPU_MODEL.to_string(),
            name_prefix: "gpu-node".to_string(),
            cpu: "64".to_string(),
            memory: "512Gi".to_string(),
            pods: 110,
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            taints: Vec::new(),
            resources: BTreeMap::new(),
            extended_resource: true,
        }
    }

    /// Adds an allocatable resource (capacity too).
    /// GPUs published only through DRA (no `nvidia.com/gpu` in the node's allocatable).
    pub fn dra(mut self) -> Self {
        self.extended_resource = false;
        self
    }

    pub fn resource(mut self, name: impl Into<String>, quantity: impl Into<String>) -> Self {
        self.resources.insert(name.into(), quantity.into());
        self
    }

    /// Sets the GPU model.
    pub fn model(mut self, model: impl Into<String>) -> Self {
        self.model = model.into();
        self
    }

    /// Sets the name prefix.
    pub fn name_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.name_prefix = prefix.into();
        self
    }

    /// Adds a label.
    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// Adds an annotation.
    pub fn annotation(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.annotations.insert(key.into(), value.into());
        self
    }

    /// Adds a taint (`effect`: NoSchedule, PreferNoSchedule or NoExecute).
    pub fn taint(mut self, key: &str, value: &str, effect: &str) -> Self {
        self.taints.push(Taint {
            key: key.to_string(),
            value: Some(value.to_string()),
            effect: effect.to_string(),
            ..Taint::default()
        });
        self
    }

    /// The Node object for `name`.
    pub fn node(&self, name: &str) -> Result<Node> {
        let mut labels = BTreeMap::from([
            ("kubernetes.io/hostname".to_string(), name.to_string()),
            ("kubernetes.io/os".to_string(), "linux".to_string()),
            ("kubernetes.io/arch".to_string(), "amd64".to_string()),
            ("type".to_string(), "kwok".to_string()),
            (GPU_PRODUCT_LABEL.to_string(), self.model.clone()),
            ("nvidia.com/gpu.present".to_string(), "true".to_string()),
            (
                "nvidia.com/gpu.count".to_string(),
                self.gpus_per_node.to_string(),
            ),
        ]);
        labels.extend(self.labels.clone());
        let mut annotations = self.annotations.clone();
        annotations.insert(KWOK_NODE_ANNOTATION.to_string(), "fake".to_string());
        let mut resources = json!({
            "cpu": self.cpu,
            "memory": self.memory,
            "pods": self.pods.to_string(),
            GPU_RESOURCE: self.gpus_per_node.to_string(),
        });
        for (k, v) in &self.resources {
            resources[k] = json!(v);
        }
        if !self.extended_resource
            && let Some(r) = resources.as_object_mut()
        {
            r.remove(GPU_RESOURCE);
        }
        serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": labels, "annotations": annotations},
            "spec": {"taints": self.taints},
            "status": {"capacity": resources, "allocatable": resources},
        }))
        .context("building a Node")
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

struct Started {
    component: Component,
    ports: Vec<u16>,
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

/// Writes a kubeconfig for `user` with client cert `crt`/`key`.
fn write_kubeconfig(
    path: &Path,
    server: &str,
    ca: &Path,
    user: &str,
    crt: &Path,
    key: &Path,
) -> Result<()> {
    let doc = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "gpu-defrag", "cluster": {"server": server, "certificate-authority": ca}}],
        "users": [{"name": user, "user": {"client-certificate": crt, "client-key": key}}],
        "contexts": [{"name": "gpu-defrag", "context": {"cluster": "gpu-defrag", "user": user}}],
        "current-context": "gpu-defrag",
    });
    let text = serde_norway::to_string(&doc).context("serializing a kubeconfig")?;
    fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

fn etcd_healthy(port: u16) -> bool {
    let Ok(mut s) =
        TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_secs(1))
    else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut buf = String::new();
    let _ = s.read_to_string(&mut buf);
    buf.contains("\"health\":\"true\"")
}

/// Whether a component's `/healthz` on `port` answers `ok`.
async fn healthz_ok(port: u16) -> bool {
    matches!(insecure_get(port, "/healthz").await, Ok(s) if s.trim() == "ok")
}

/// GET `path` on a component's secure port, without verifying its self-signed certificate.
pub async fn insecure_get(port: u16, path: &str) -> Result<String> {
    let url = format!("https://127.0.0.1:{port}")
        .parse()
        .context("component url")?;
    let mut config = Config::new(url);
    config.accept_invalid_certs = true;
    config.default_retry = false;
    config.connect_timeout = Some(Duration::from_secs(2));
    config.read_timeout = Some(Duration::from_secs(5));
    let client = Client::try_from(config).context("building an insecure client")?;
    let req = http::Request::get(path)
        .body(Vec::new())
        .context("building a request")?;
    Ok(client.request_text(req).await?)
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

    fn push(&self, c: Component) -> Result<()> {
        self.components
            .lock()
            .map_err(|_| anyhow!("components lock"))?
            .push(c);
        Ok(())
    }

    fn bin(&self, name: &str) -> PathBuf {
        self.bin_dir.join(component_binary(name))
    }

    fn log(&self, name: &str) -> PathBuf {
        self.work_dir.join("logs").join(format!("{name}.log"))
    }

    /// Starts a component and registers its process group with the reaper.
    fn spawn(&self, name: &str, args: Vec<String>) -> Result<Component> {
        let envs: Vec<(&str, &Path)> = vec![("HOME", self.work_dir.as_path())];
        let c = Component::spawn(name, &self.bin(name), &args, &envs, &self.log(name))?;
        let mut reaper = self.reaper.lock().map_err(|_| anyhow!("reaper lock"))?;
        if let Some(reaper) = reaper.as_mut()
            && let Err(e) = reaper.watch(c.pgid)
        {
            drop(c);
            return Err(e);
        }
        Ok(c)
    }

    /// Stops a component that did not make it, and tells the reaper.
    fn discard(&self, mut c: Component) {
        c.stop(Duration::from_secs(2));
        if let Ok(mut reaper) = self.reaper.lock()
            && let Some(reaper) = reaper.as_mut()
        {
            let _ = reaper.unwatch(c.pgid);
        }
    }

    /// Waits for `/healthz` of a component started on `port`; if it lost a port race,
    /// starts it again on fresh ports.
    async fn settle(
        &self,
        name: &str,
        mut c: Component,
        port: u16,
        timeout: Duration,
        args: impl Fn(u16) -> Vec<String>,
    ) -> Result<Component> {
        let deadline = Instant::now() + timeout;
        loop {
            if c.exited().is_some() {
                if c.port_clash() {
                    self.discard(c);
                    let started = self
                        .start_with_ports(name, 1, timeout, |p| args(p[0]), |p| healthz_ok(p[0]))
                        .await?;
                    return Ok(started.component);
                }
                let err = c.ensure_running().err();
                self.discard(c);
                return Err(err.unwrap_or_else(|| anyhow!("{name} exited")));
            }
            if healthz_ok(port).await {
                return Ok(c);
            }
            if Instant::now() > deadline {
                let log = c.log.clone();
                self.discard(c);
                bail!(
                    "{name} not healthy within {timeout:?}; log: {}",
                    log.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Starts a component with fresh ports until it is healthy, retrying on port clashes.
    async fn start_with_ports<F, H, Fut>(
        &self,
        name: &str,
        nports: usize,
        timeout: Duration,
        args: F,
        healthy: H,
    ) -> Result<Started>
    where
        F: Fn(&[u16]) -> Vec<String>,
        H: Fn(Vec<u16>) -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let ports = (0..nports)
                .map(|_| free_port())
                .collect::<Result<Vec<_>>>()?;
            let mut c = self.spawn(name, args(&ports))?;
            let deadline = Instant::now() + timeout;
            let mut result = Err(anyhow!("{name} not healthy within {timeout:?}"));
            while Instant::now() < deadline {
                if let Err(e) = c.ensure_running() {
                    result = Err(e);
                    break;
                }
                if healthy(ports.clone()).await {
                    return Ok(Started {
                        component: c,
                        ports,
                    });
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            let (clash, log) = (c.port_clash(), c.log.clone());
            self.discard(c);
            if attempt < 3 && clash {
                continue;
            }
            return result
                .with_context(|| format!("log: {}\n{}", log.display(), log_tail(&log, 20)));
        }
    }

    async fn start_etcd(&self, timeout: Duration) -> Result<Started> {
        let data = self.work_dir.join("etcd");
        self.start_with_ports(
            "etcd",
            2,
            timeout,
            |p| {
                let (client, peer) = (p[0], p[1]);
                vec![
                    "--name=node0".into(),
                    format!("--data-dir={}", data.display()),
                    format!("--listen-client-urls=http://127.0.0.1:{client}"),
                    format!("--advertise-client-urls=http://127.0.0.1:{client}"),
                    format!("--listen-peer-urls=http://127.0.0.1:{peer}"),
                    format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer}"),
                    format!("--initial-cluster=node0=http://127.0.0.1:{peer}"),
                    "--unsafe-no-fsync=true".into(),
                    "--quota-backend-bytes=4294967296".into(),
                    "--log-level=warn".into(),
                ]
            },
            |p| async move {
                tokio::task::spawn_blocking(move || etcd_healthy(p[0]))
                    .await
                    .unwrap_or(false)
            },
        )
        .await
    }

    /// The flags of kube-apiserver on `port`, backed by etcd on `etcd_port`.
    fn apiserver_args(&self, etcd_port: u16, port: u16) -> Vec<String> {
        let pki = &self.pki;
        let (ca, crt, key) = (
            pki.ca_crt.display(),
            pki.admin_crt.display(),
            pki.admin_key.display(),
        );
        vec![
            format!("--etcd-servers=http://127.0.0.1:{etcd_port}"),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={port}"),
            // A loopback bind needs an explicit advertise address, and a
            // loopback advertise address needs the endpoint reconciler off.
            "--advertise-address=127.0.0.1".into(),
            "--endpoint-reconciler-type=none".into(),
            format!("--cert-dir={}", self.work_dir.join("apiserver").display()),
            format!("--tls-cert-file={crt}"),
            format!("--tls-private-key-file={key}"),
            format!("--client-ca-file={ca}"),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            format!("--service-account-key-file={}", pki.sa_pub.display()),
            format!("--service-account-signing-key-file={key}"),
            "--authorization-mode=RBAC".into(),
            "--service-cluster-ip-range=10.96.0.0/16".into(),
            "--allow-privileged=true".into(),
            // Pods created right after their namespace would otherwise race
            // the serviceaccount controller ("serviceaccount default not found").
            "--disable-admission-plugins=ServiceAccount".into(),
            "--profiling=false".into(),
        ]
    }

    /// Whether the API server on `port` answers `/readyz` with `ok`.
    async fn apiserver_ready(&self, port: u16) -> bool {
        let Ok(client) = self.client_for_port(port) else {
            return false;
        };
        let Ok(req) = http::Request::get("/readyz").body(Vec::new()) else {
            return false;
        };
        matches!(client.request_text(req).await, Ok(s) if s.trim() == "ok")
    }

    async fn start_apiserver(&self, etcd_port: u16, timeout: Duration) -> Result<Started> {
        let pki = self.pki.clone();
        let kubeconfig = self.kubeconfig.clone();
        let started = self
            .start_with_ports(
                "kube-apiserver",
                1,
                timeout,
                |p| {
                    // The kubeconfig must name the port before the readiness probe uses it.
                    let server = format!("https://127.0.0.1:{}", p[0]);
                    let _ = write_kubeconfig(
                        &kubeconfig,
                        &server,
                        &pki.ca_crt,
                        "admin",
                        &pki.admin_crt,
                        &pki.admin_key,
                    );
                    self.apiserver_args(etcd_port, p[0])
                },
                |p| self.apiserver_ready(p[0]),
            )
            .await?;
        write_kubeconfig(
            &self.kubeconfig,
            &format!("https://127.0.0.1:{}", started.ports[0]),
            &pki.ca_crt,
            "admin",
            &pki.admin_crt,
            &pki.admin_key,
        )?;
        Ok(started)
    }

    // === API-server faults ===

    /// Stops kube-apiserver (SIGTERM, SIGKILL after `grace`), leaving etcd and every other
    /// component running: clients see connections refused until
    /// [`TestCluster::restart_apiserver`].
    pub fn stop_apiserver(&self, grace: Duration) -> Result<()> {
        let mut c = {
            let mut components = self
                .components
                .lock()
                .map_err(|_| anyhow!("components lock"))?;
            let i = components
                .iter()
                .position(|c| c.name == "kube-apiserver")
                .ok_or_else(|| anyhow!("kube-apiserver is not running"))?;
            components.remove(i)
        };
        c.stop(grace);
        if let Ok(mut reaper) = self.reaper.lock()
            && let Some(reaper) = reaper.as_mut()
        {
            let _ = reaper.unwatch(c.pgid);
        }
        Ok(())
    }

    /// Starts kube-apiserver again on the same port, flags and etcd (so with all the
    /// cluster's objects), and waits until `/readyz` is `ok`.
    pub async fn restart_apiserver(&self, timeout: Duration) -> Result<()> {
        if self
            .components()
            .iter()
            .any(|(n, _, _)| n == "kube-apiserver")
        {
            bail!("kube-apiserver is already running");
        }
        let mut c = self.spawn(
            "kube-apiserver",
            self.apiserver_args(self.etcd_port, self.api_port),
        )?;
        let deadline = Instant::now() + timeout;
        while !self.apiserver_ready(self.api_port).await {
            if let Err(e) = c.ensure_running() {
                self.discard(c);
                return Err(e.context("kube-apiserver did not restart"));
            }
            if Instant::now() > deadline {
                let log = c.log.clone();
                self.discard(c);
                bail!(
                    "kube-apiserver not ready within {timeout:?} after a restart; log: {}",
                    log.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        self.push(c)
    }

    async fn wait_default_namespace(&self, timeout: Duration) -> Result<()> {
        let api: Api<Namespace> = Api::all(self.client()?);
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(_)) = api.get_opt("default").await {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("namespace default not created within {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    fn write_scheduler_config(&self, template: &Path) -> Result<PathBuf> {
        let text = fs::read_to_string(template)
            .with_context(|| format!("reading {}", template.display()))?;
        let mut doc: serde_json::Value = serde_norway::from_str(&text)
            .with_context(|| format!("parsing {}", template.display()))?;
        let obj = doc
            .as_object_mut()
            .ok_or_else(|| anyhow!("{} is not a mapping", template.display()))?;
        for (section, key, value) in [
            ("clientConnection", "kubeconfig", json!(self.kubeconfig)),
            // One replica here; the file's Lease namespace need not exist.
            ("leaderElection", "leaderElect", json!(false)),
        ] {
            let entry = obj.entry(section).or_insert_with(|| json!({}));
            match entry.as_object_mut() {
                Some(entry) => {
                    entry.insert(key.into(), value);
                }
                None => bail!("{section} in {} is not a mapping", template.display()),
            }
        }
        let out = self.work_dir.join("gpu-binpack.yaml");
        fs::write(
            &out,
            serde_norway::to_string(&doc).context("serializing the scheduler config")?,
        )
        .with_context(|| format!("writing {}", out.display()))?;
        Ok(out)
    }

    fn secure_serving_args(port: u16) -> Vec<String> {
        vec![
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={port}"),
            "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics".into(),
        ]
    }

    fn kcm_args(&self, port: u16) -> Vec<String> {
        let mut args = vec![
            format!("--kubeconfig={}", self.kubeconfig.display()),
            "--leader-elect=false".into(),
            format!("--root-ca-file={}", self.pki.ca_crt.display()),
            // No --service-account-private-key-file: the token controller stays off.
            format!("--controllers={}", self.kcm_controllers),
            "--kube-api-qps=100".into(),
            "--kube-api-burst=200".into(),
        ];
        args.extend(Self::secure_serving_args(port));
        args
    }

    /// The stock default scheduler (`config: None`, upstream's default profile, as a
    /// cluster has it), or a scheduler run with a configuration file.
    fn scheduler_args(&self, port: u16, config: Option<&Path>) -> Vec<String> {
        let mut args = match config {
            Some(config) => vec![format!("--config={}", config.display())],
            None => vec![
                format!("--kubeconfig={}", self.kubeconfig.display()),
                "--leader-elect=false".into(),
                "--kube-api-qps=100".into(),
                "--kube-api-burst=200".into(),
            ],
        };
        args.extend(Self::secure_serving_args(port));
        args
    }

    fn spawn_kwok(&self) -> Result<Component> {
        let stages = self
            .bin_dir
            .parent()
            .map(|p| p.join("stages.yaml"))
            .filter(|p| p.exists())
            .ok_or_else(|| anyhow!("no stages.yaml next to {}", self.bin_dir.display()))?;
        let args = vec![
            format!("--kubeconfig={}", self.kubeconfig.display()),
            format!("--config={}", stages.display()),
            "--manage-all-nodes=false".into(),
            format!("--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake"),
            "--node-lease-duration-seconds=40".into(),
            "--cidr=10.244.0.0/16".into(),
            "--node-ip=10.1.0.1".into(),
        ];
        self.spawn("kwok", args)
    }

    /// Fails with the log's tail if any component has exited.
    pub fn ensure_running(&self) -> Result<()> {
        let mut components = self
            .components
            .lock()
            .map_err(|_| anyhow!("components lock"))?;
        for c in components.iter_mut() {
            c.ensure_running()?;
        }
        Ok(())
    }

    fn client_for_port(&self, port: u16) -> Result<Client> {
        self.client_as(port, &self.pki.admin_crt, &self.pki.admin_key)
    }

    fn client_as(&self, port: u16, crt: &Path, key: &Path) -> Result<Client> {
        let url = format!("https://127.0.0.1:{port}")
            .parse()
            .context("apiserver url")?;
        let mut config = Config::new(url);
        config.root_cert = Some(vec![self.ca_der.clone()]);
        config.auth_info = AuthInfo {
            client_certificate: Some(crt.display().to_string()),
            client_key: Some(key.display().to_string()),
            ..AuthInfo::default()
        };
        // Tests want the API's own answers: kube's default retry layer would retry a 429
        // from the Eviction API (a PDB refusal) for minutes.
        config.default_retry = false;
        config.read_timeout = Some(Duration::from_secs(60));
        Client::try_from(config).context("building a kube client")
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

    // === credentials ===

    /// Issues a client certificate for `user` in `groups` (never `system:masters` unless
    /// asked), signed by the cluster CA, and writes a kubeconfig for it. Such a user has
    /// only the permissions RBAC grants it, like an operator bound to its ClusterRole.
    pub fn user_kubeconfig(&self, user: &str, groups: &[&str]) -> Result<PathBuf> {
        if user.is_empty()
            || !user
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.:@".contains(c))
        {
            bail!("invalid user name {user:?}");
        }
        let dir = self.work_dir.join("users");
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let file = user.replace(':', "_");
        let (crt, key) = (
            dir.join(format!("{file}.crt")),
            dir.join(format!("{file}.key")),
        );
        self.pki.issue(user, groups, &[], false, &crt, &key)?;
        let kubeconfig = dir.join(format!("{file}.kubeconfig"));
        write_kubeconfig(
            &kubeconfig,
            &self.server_url(),
            &self.pki.ca_crt,
            user,
            &crt,
            &key,
        )?;
        Ok(kubeconfig)
    }

    /// A client authenticated as `user` in `groups`; see [`TestCluster::user_kubeconfig`].
    pub fn user_client(&self, user: &str, groups: &[&str]) -> Result<Client> {
        self.user_kubeconfig(user, groups)?;
        let dir = self.work_dir.join("users");
        let file = user.replace(':', "_");
        self.client_as(
            self.api_port,
            &dir.join(format!("{file}.crt")),
            &dir.join(format!("{file}.key")),
        )
    }

    // === CRDs ===

    /// Server-side applies every CustomResourceDefinition in the `*.yaml` files of `dir`
    /// and waits until each is Established. Empty files are skipped. Returns CRD names.
    pub async fn apply_crds(&self, dir: &Path) -> Result<Vec<String>> {
        let mut files: Vec<PathBuf> = fs::read_dir(dir)
            .with_context(|| format!("reading {}", dir.display()))?
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
            .collect();
        files.sort();
        let api: Api<CustomResourceDefinition> = Api::all(self.client()?);
        let mut names = Vec::new();
        for file in files {
            let text =
                fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
            for doc in serde_norway::Deserializer::from_str(&text) {
                let value = serde_json::Value::deserialize(doc)
                    .with_context(|| format!("parsing {}", file.display()))?;
                if value.is_null() {
                    continue;
                }
                let crd: CustomResourceDefinition =
                    serde_json::from_value(value).with_context(|| {
                        format!("{} holds something other than a CRD", file.display())
                    })?;
                let name = crd
                    .metadata
                    .name
                    .clone()
                    .ok_or_else(|| anyhow!("a CRD in {} has no name", file.display()))?;
                api.patch(
                    &name,
                    &PatchParams::apply(FIELD_MANAGER).force(),
                    &Patch::Apply(&crd),
                )
                .await
                .with_context(|| format!("applying CRD {name}"))?;
                names.push(name);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        for name in &names {
            loop {
                let crd = api
                    .get(name)
                    .await
                    .with_context(|| format!("reading CRD {name}"))?;
                let established = crd
                    .status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True");
                if established {
                    break;
                }
                if Instant::now() > deadline {
                    bail!("CRD {name} not Established within 30s");
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(names)
    }

    // === nodes ===

    /// Creates `count` kwok GPU nodes (`gpus_per_node` × `model`, extra labels and
    /// annotations) and waits until they are Ready and schedulable. Returns their names.
    pub async fn add_gpu_nodes(
        &self,
        count: usize,
        gpus_per_node: u32,
        model: &str,
        labels: &[(&str, &str)],
        annotations: &[(&str, &str)],
    ) -> Result<Vec<String>> {
        let mut nodes = GpuNodes::new(count, gpus_per_node).model(model);
        for (k, v) in labels {
            nodes = nodes.label(*k, *v);
        }
        for (k, v) in annotations {
            nodes = nodes.annotation(*k, *v);
        }
        self.add_nodes(&nodes).await
    }

    /// Creates the nodes described by `nodes` and waits until they are Ready and carry no
    /// `node.kubernetes.io/*` taint. Returns their names.
    pub async fn add_nodes(&self, nodes: &GpuNodes) -> Result<Vec<String>> {
        let api: Api<Node> = Api::all(self.client()?);
        let mut names = Vec::with_capacity(nodes.count);
        let mut objects = Vec::with_capacity(nodes.count);
        for _ in 0..nodes.count {
            let n = self.node_seq.fetch_add(1, Ordering::Relaxed);
            let name = format!("{}-{n}", nodes.name_prefix);
            objects.push(nodes.node(&name)?);
            names.push(name);
        }
        crate::fixtures::create_all(&api, objects, 16).await?;
        self.wait_nodes_ready(
            &names,
            Duration::from_secs(90).max(Duration::from_millis(90 * names.len() as u64)),
        )
        .await?;
        Ok(names)
    }

    /// Waits until every node in `names` is Ready, untainted by node conditions, and
    /// reports `nvidia.com/gpu` allocatable.
    pub async fn wait_nodes_ready(&self, names: &[String], timeout: Duration) -> Result<()> {
        let api: Api<Node> = Api::all(self.client()?);
        let deadline = Instant::now() + timeout;
        loop {
            self.ensure_running()?;
            let list = api
                .list(&ListParams::default())
                .await
                .context("listing nodes")?;
            let ready: Vec<&str> = list
                .items
                .iter()
                .filter(|n| node_usable(n))
                .filter_map(|n| n.metadata.name.as_deref())
                .collect();
            let missing: Vec<&String> = names
                .iter()
                .filter(|n| !ready.contains(&n.as_str()))
                .collect();
            if missing.is_empty() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "{} nodes not Ready within {timeout:?}, e.g. {:?}; see {}",
                    missing.len(),
                    &missing[..missing.len().min(10)],
                    self.logs_dir().display()
                );
            }
            // Listing a thousand nodes four times a second would load the API server.
            let pause = if names.len() > 100 { 1000 } else { 250 };
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
    }

    // === namespaces ===

    /// Creates a fresh namespace `<prefix>-<random>` labelled `e2e.gpu-defrag.io/test`.
    /// Dropping the guard deletes it; if the thread is panicking (a failing test) it keeps
    /// the namespace and the work dir and prints the pods and where the logs are.
    pub async fn namespace(&self, prefix: &str) -> Result<TestNamespace> {
        let prefix: String = prefix
            .to_ascii_lowercase()
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .take(40)
            .collect();
        let prefix = prefix.trim_matches('-');
        let prefix = if prefix.is_empty() { "test" } else { prefix };
        let name = format!("{prefix}-{}", unique_suffix());
        let api: Api<Namespace> = Api::all(self.client()?);
        let ns: Namespace = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {TEST_NAMESPACE_LABEL: "true"}}
        }))
        .context("building a Namespace")?;
        api.create(&PostParams::default(), &ns)
            .await
            .with_context(|| format!("creating namespace {name}"))?;
        Ok(TestNamespace {
            name,
            kubectl: self.kubectl_path(),
            kubeconfig: self.kubeconfig.clone(),
            work_dir: self.work_dir.clone(),
            describe: self.describe(),
        })
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

/// Ready=True and no `node.kubernetes.io/…` taint (not-ready, unreachable), with GPUs in
/// its allocatable — or, for a node whose GPUs are published through DRA, with the
/// allocatable it was created with (cpu).
pub fn node_usable(node: &Node) -> bool {
    let Some(status) = &node.status else {
        return false;
    };
    let ready = status
        .conditions
        .as_ref()
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    let tainted = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key.starts_with("node.kubernetes.io/")));
    let gpus = status.allocatable.as_ref().is_some_and(|a| {
        a.contains_key(GPU_RESOURCE)
            || (a.contains_key("cpu")
                && node
                    .metadata
                    .labels
                    .as_ref()
                    .is_some_and(|l| l.contains_key("nvidia.com/gpu.count")))
    });
    ready && !tainted && gpus
}

/// A namespace for one test; see [`TestCluster::namespace`].
#[derive(Debug)]
pub struct TestNamespace {
    name: String,
    kubectl: PathBuf,
    kubeconfig: PathBuf,
    work_dir: PathBuf,
    describe: String,
}

impl TestNamespace {
    /// The namespace name.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn kubectl(&self, args: &[&str]) -> Option<String> {
        let out = Command::new(&self.kubectl)
            .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .args(args)
            .output()
            .ok()?;
        Some(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }

    /// Prints the namespace's pods, PDBs and events and the nodes (for a failing test).
    pub fn dump(&self) {
        let ns = self.name.as_str();
        eprintln!("--- state of namespace {ns} ---");
        for args in [
            &[
                "get",
                "pods,deployments,replicasets,pdb",
                "-o",
                "wide",
                "-n",
                ns,
            ][..],
            &["get", "events", "--sort-by=.lastTimestamp", "-n", ns][..],
            &["get", "nodes", "-o", "wide"][..],
        ] {
            if let Some(out) = self.kubectl(args) {
                eprintln!("$ kubectl {}\n{out}", args.join(" "));
            }
        }
    }
}

impl std::fmt::Display for TestNamespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let _ = fs::write(self.work_dir.join("keep"), "");
            self.dump();
            eprintln!(
                "test failed in namespace {}; {} (kept)",
                self.name, self.describe
            );
        } else {
            let _ = self.kubectl(&["delete", "namespace", &self.name, "--wait=false"]);
        }
    }
}
