//! The gpu-defrag operator in e2e tests: built once per test binary, run as a user bound to
//! exactly the project's ClusterRole (config/rbac/role.yaml), one process per test, each
//! reconciling only its own DefragPolicies (`--policy-selector e2e-test=<test>`).
//!
//! ```text
//! Pool::create ──> kwok nodes labelled and tainted e2e-pool=<test> (other tests stay off)
//! fragment     ──> 1-GPU Deployments fill the pool, some removed: each node partly used
//! Operator     ──> target/debug/gpu-defrag run, KUBECONFIG = the RBAC-bound user
//! PodWatch     ──> every 200 ms: pods of the namespace (uid, node, gone) and the fences
//! ```
//!
//! Isolation: every test has its own namespace, node pool and policy; its pods select and
//! tolerate only its pool, its policy covers only that pool and namespace.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs::File,
    io::Write,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, ChildStdin, Command, Stdio},
    sync::{Arc, Mutex, OnceLock, atomic::AtomicUsize, atomic::Ordering},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, anyhow, bail};
use k8s_openapi::api::{
    apps::v1::Deployment,
    core::v1::{Node, Pod, PodSpec},
    policy::v1::PodDisruptionBudget,
    rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding},
};
use kube::{
    Api, Client,
    api::{
        ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
        PostParams,
    },
    config::{KubeConfigOptions, Kubeconfig},
};
use serde_json::{Value, json};

use crate::{
    cluster::{FIELD_MANAGER, GPU_RESOURCE, GpuNodes, TestCluster, repo_root},
    fixtures::{gpu_deployment, pod_ready, pods, wait_for},
    process::{free_port, log_tail, signal_group},
};

/// The user the operator runs as; bound to the `gpu-defrag` ClusterRole only.
pub const OPERATOR_USER: &str = "gpu-defrag-e2e-operator";
/// Label on each test's DefragPolicies; its operator selects on it.
pub const POLICY_LABEL: &str = "e2e-test";
/// Label and taint key of a test's node pool.
pub const POOL_LABEL: &str = "e2e-pool";
/// Domain of the fences the executor puts on nodes it empties: one taint key per policy,
/// `draining.gpu-defrag.io/<policy>`, with the policy name as value.
pub const DRAINING_TAINT_DOMAIN: &str = "draining.gpu-defrag.io";
/// The namespace of the landing-control ConfigMaps (the one config/landing's binding reads).
pub const LANDING_NAMESPACE: &str = "gpu-defrag-system";
/// The landing gate and the label of the pods it holds.
pub const LANDING_GATE: &str = "gpu-defrag.io/landing";
/// Label of the filler Deployments made by [`fragment`].
pub const ROLE_LABEL: &str = "e2e-role";

// === the binary ===

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

// === credentials ===

static KUBECONFIG: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();

/// Applies config/rbac/role.yaml and binds it to [`OPERATOR_USER`]; returns that user's
/// kubeconfig once the API server grants what the operator needs at start.
pub async fn operator_kubeconfig(cluster: &TestCluster) -> Result<PathBuf> {
    let admin = cluster.client()?;
    let path = repo_root().join("config/rbac/role.yaml");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let role: ClusterRole = serde_norway::from_str(&text)
        .with_context(|| format!("{} is not a ClusterRole", path.display()))?;
    let role_name = role
        .metadata
        .name
        .clone()
        .ok_or_else(|| anyhow!("the ClusterRole has no name"))?;
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    Api::<ClusterRole>::all(admin.clone())
        .patch(&role_name, &pp, &Patch::Apply(&role))
        .await
        .context("applying the operator's ClusterRole")?;
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": OPERATOR_USER},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role_name},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": OPERATOR_USER}],
    }))?;
    Api::<ClusterRoleBinding>::all(admin.clone())
        .patch(OPERATOR_USER, &pp, &Patch::Apply(&binding))
        .await
        .context("binding the operator's ClusterRole")?;
    install_landing(cluster, &admin).await?;
    // Issued once: concurrent tests must not rewrite the certificate under a running operator.
    let kubeconfig = KUBECONFIG
        .get_or_init(|| {
            cluster
                .user_kubeconfig(OPERATOR_USER, &[])
                .map_err(|e| format!("{e:#}"))
        })
        .clone()
        .map_err(|e| anyhow!(e))?;
    let user = client_from(&kubeconfig).await?;
    wait_for(
        "RBAC to let the operator user list policies, pods and nodes",
        Duration::from_secs(30),
        || async {
            policies(&user)
                .list(&ListParams::default().limit(1))
                .await?;
            Api::<Pod>::all(user.clone())
                .list(&ListParams::default().limit(1))
                .await?;
            Api::<Node>::all(user.clone())
                .list(&ListParams::default().limit(1))
                .await?;
            Ok(Some(()))
        },
    )
    .await?;
    Ok(kubeconfig)
}

/// Installs landing control as config/ does: the namespace [`LANDING_NAMESPACE`], the
/// leader election Role there (it grants the ConfigMaps) and config/landing/admission.yaml
/// (the MutatingAdmissionPolicy and its binding). Idempotent.
pub async fn install_landing(cluster: &TestCluster, admin: &Client) -> Result<()> {
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    let ns: k8s_openapi::api::core::v1::Namespace = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": LANDING_NAMESPACE},
    }))?;
    Api::<k8s_openapi::api::core::v1::Namespace>::all(admin.clone())
        .patch(LANDING_NAMESPACE, &pp, &Patch::Apply(&ns))
        .await
        .context("creating the landing namespace")?;
    bind_lease_role(admin, LANDING_NAMESPACE).await?;
    apply_landing_admission(cluster)
}

/// `kubectl apply --server-side` of config/landing/admission.yaml.
pub fn apply_landing_admission(cluster: &TestCluster) -> Result<()> {
    let file = repo_root().join("config/landing/admission.yaml");
    let out = cluster
        .kubectl()
        .args(["apply", "--server-side", "--force-conflicts"])
        .arg(format!("--field-manager={FIELD_MANAGER}"))
        .arg("-f")
        .arg(&file)
        .output()
        .context("running kubectl apply")?;
    if !out.status.success() {
        bail!(
            "kubectl apply -f {}: {}",
            file.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// The landing ConfigMap of the operator of `selector` ([`Operator::start`] names it).
pub fn landing_configmap(selector: &str) -> String {
    let mut name: String = format!("landing-{selector}")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .take(63)
        .collect();
    while name.ends_with('-') {
        name.pop();
    }
    name
}

/// Applies config/rbac/leader_election_role.yaml into `ns` and binds it to
/// [`OPERATOR_USER`], for an operator started with `--leader-elect --lease-namespace <ns>`.
pub async fn bind_lease_role(client: &Client, ns: &str) -> Result<()> {
    let path = repo_root().join("config/rbac/leader_election_role.yaml");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let mut role: Role = serde_norway::from_str(&text)
        .with_context(|| format!("{} is not a Role", path.display()))?;
    role.metadata.namespace = Some(ns.to_string());
    let name = role
        .metadata
        .name
        .clone()
        .ok_or_else(|| anyhow!("the Role has no name"))?;
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    Api::<Role>::namespaced(client.clone(), ns)
        .patch(&name, &pp, &Patch::Apply(&role))
        .await
        .context("applying the leader election Role")?;
    let binding: RoleBinding = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": name, "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": OPERATOR_USER}],
    }))?;
    Api::<RoleBinding>::namespaced(client.clone(), ns)
        .patch(&name, &pp, &Patch::Apply(&binding))
        .await
        .context("binding the leader election Role")?;
    Ok(())
}

/// A client from a kubeconfig file (no retries of its own, like the harness clients).
pub async fn client_from(kubeconfig: &Path) -> Result<Client> {
    let kc = Kubeconfig::read_from(kubeconfig)
        .with_context(|| format!("reading {}", kubeconfig.display()))?;
    let mut config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .context("kubeconfig")?;
    config.default_retry = false;
    Client::try_from(config).context("building a client")
}

// === the process ===

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
    /// [`OPERATOR_USER`]; `extra` are more `run` flags. Metrics listen on a free loopback port
    /// unless `extra` has its own `--metrics-addr` ([`Operator::metrics`]). Output goes to
    /// `<logs>/gpu-defrag-<selector>.log` (appended across restarts).
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

// === DefragPolicies ===

/// Where DefragPolicies are served.
pub fn policy_resource() -> ApiResource {
    let gvk = GroupVersionKind::gvk("gpu-defrag.io", "v1alpha1", "DefragPolicy");
    ApiResource::from_gvk_with_plural(&gvk, "defragpolicies")
}

/// The (cluster-scoped) DefragPolicy API.
pub fn policies(client: &Client) -> Api<DynamicObject> {
    Api::all_with(client.clone(), &policy_resource())
}

/// Creates policy `name` labelled `e2e-test=<selector>`.
pub async fn create_policy(client: &Client, name: &str, selector: &str, spec: Value) -> Result<()> {
    let ar = policy_resource();
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": ar.api_version, "kind": ar.kind,
        "metadata": {"name": name, "labels": {POLICY_LABEL: selector}},
        "spec": spec,
    }))?;
    policies(client)
        .create(&PostParams::default(), &obj)
        .await
        .with_context(|| format!("creating DefragPolicy {name}"))?;
    Ok(())
}

/// Merge-patches the spec of policy `name`.
pub async fn patch_policy(client: &Client, name: &str, spec: Value) -> Result<()> {
    policies(client)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": spec})),
        )
        .await
        .with_context(|| format!("patching DefragPolicy {name}"))?;
    Ok(())
}

/// Deletes policy `name` (absent is fine).
pub async fn delete_policy(client: &Client, name: &str) -> Result<()> {
    match policies(client)
        .delete(name, &DeleteParams::default())
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e).with_context(|| format!("deleting DefragPolicy {name}")),
    }
}

/// The status of policy `name` (`null` when it has none yet).
pub async fn policy_status(client: &Client, name: &str) -> Result<Value> {
    let p = policies(client)
        .get(name)
        .await
        .with_context(|| format!("reading DefragPolicy {name}"))?;
    Ok(p.data.get("status").cloned().unwrap_or(Value::Null))
}

/// Polls the status of `name` until `pred` holds; returns that status.
pub async fn wait_status(
    client: &Client,
    name: &str,
    what: &str,
    timeout: Duration,
    pred: impl Fn(&Value) -> bool,
) -> Result<Value> {
    let last = Mutex::new(Value::Null);
    let r = wait_for(what, timeout, || async {
        let st = policy_status(client, name).await?;
        let ok = pred(&st);
        *last.lock().map_err(|_| anyhow!("lock"))? = st.clone();
        Ok(ok.then_some(st))
    })
    .await;
    r.map_err(|e| {
        let last = last.lock().map(|v| v.clone()).unwrap_or_default();
        e.context(format!(
            "last status of {name}: {}",
            serde_json::to_string_pretty(&last).unwrap_or_default()
        ))
    })
}

/// The condition `type_` of a status.
pub fn condition<'a>(status: &'a Value, type_: &str) -> Option<&'a Value> {
    status
        .get("conditions")?
        .as_array()?
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(type_))
}

/// `(status, reason, message)` of condition `type_`.
pub fn condition_parts(status: &Value, type_: &str) -> Option<(String, String, String)> {
    let c = condition(status, type_)?;
    let s = |k: &str| c.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    Some((s("status"), s("reason"), s("message")))
}

/// An i64 at a JSON pointer.
pub fn int_at(v: &Value, pointer: &str) -> Option<i64> {
    v.pointer(pointer).and_then(Value::as_i64)
}

/// An f64 at a JSON pointer.
pub fn float_at(v: &Value, pointer: &str) -> Option<f64> {
    v.pointer(pointer).and_then(Value::as_f64)
}

/// A string at a JSON pointer.
pub fn str_at<'a>(v: &'a Value, pointer: &str) -> Option<&'a str> {
    v.pointer(pointer).and_then(Value::as_str)
}

/// Strings of an array at a JSON pointer.
pub fn strings_at(v: &Value, pointer: &str) -> Vec<String> {
    v.pointer(pointer)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// A window open now and for the next hour, re-opening every minute (as `make demo`).
pub fn open_window_every_minute() -> Value {
    json!({"schedule": "* * * * *", "duration": "1h", "timeZone": "UTC"})
}

/// A daily window that opened at the start of the current UTC minute and lasts 1h: open
/// now, with the same end for the whole hour (a run keeps its window across restarts).
pub fn open_window_this_minute() -> Value {
    use chrono::Timelike;
    let now = chrono::Utc::now();
    json!({
        "schedule": format!("{} {} * * *", now.minute(), now.hour()),
        "duration": "1h",
        "timeZone": "UTC",
    })
}

// === node pools and workloads ===

/// A test's own kwok GPU nodes, labelled and tainted `e2e-pool=<name>`.
#[derive(Debug, Clone)]
pub struct Pool {
    /// The label (and taint) value.
    pub name: String,
    /// Node names, in creation order.
    pub nodes: Vec<String>,
    /// GPUs per node.
    pub gpus_per_node: u32,
}

impl Pool {
    /// Creates `count` nodes of `gpus` GPUs named `<name>-<n>` and waits until Ready.
    pub async fn create(
        cluster: &TestCluster,
        name: &str,
        count: usize,
        gpus: u32,
    ) -> Result<Self> {
        let nodes = cluster
            .add_nodes(
                &GpuNodes::new(count, gpus)
                    .name_prefix(name)
                    .label(POOL_LABEL, name)
                    .taint(POOL_LABEL, name, "NoSchedule"),
            )
            .await?;
        Ok(Self {
            name: name.to_string(),
            nodes,
            gpus_per_node: gpus,
        })
    }

    /// Makes a pod spec select and tolerate this pool.
    pub fn place(&self, spec: &mut PodSpec) -> Result<()> {
        spec.node_selector
            .get_or_insert_with(Default::default)
            .insert(POOL_LABEL.to_string(), self.name.clone());
        spec.tolerations
            .get_or_insert_with(Vec::new)
            .push(serde_json::from_value(json!({
                "key": POOL_LABEL, "operator": "Equal", "value": self.name, "effect": "NoSchedule"
            }))?);
        Ok(())
    }

    /// A [`gpu_deployment`] placed on this pool.
    pub fn deployment(&self, name: &str, replicas: i32, gpus: u32) -> Result<Deployment> {
        let mut d = gpu_deployment(name, replicas, gpus)?;
        let spec = d
            .spec
            .template
            .spec
            .as_mut()
            .ok_or_else(|| anyhow!("a Deployment without a pod spec"))?;
        self.place(spec)?;
        Ok(d)
    }

    /// `spec.nodeSelector` of a policy covering exactly this pool.
    pub fn selector(&self) -> Value {
        json!({"matchLabels": {POOL_LABEL: self.name}})
    }

    /// Nodes of the pool that carry a draining fence (of any policy).
    pub async fn fenced(&self, client: &Client) -> Result<Vec<String>> {
        let nodes = Api::<Node>::all(client.clone())
            .list(&ListParams::default().labels(&format!("{POOL_LABEL}={}", self.name)))
            .await
            .context("listing pool nodes")?;
        Ok(nodes
            .items
            .iter()
            .filter(|n| fences(n).next().is_some())
            .filter_map(|n| n.metadata.name.clone())
            .collect())
    }
}

/// Whether a taint key is a draining fence (`draining.gpu-defrag.io/<policy>`).
pub fn is_fence_key(key: &str) -> bool {
    key.strip_prefix(DRAINING_TAINT_DOMAIN)
        .is_some_and(|rest| rest.starts_with('/'))
}

/// The policies whose draining fence a node carries (the taints' values).
pub fn fences(node: &Node) -> impl Iterator<Item = String> + '_ {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .filter(|t| is_fence_key(&t.key))
        .map(|t| t.value.clone().unwrap_or_default())
}

/// Whole GPUs a pod asks for (limits).
pub fn pod_gpus(p: &Pod) -> u32 {
    p.spec
        .as_ref()
        .map(|s| {
            s.containers
                .iter()
                .filter_map(|c| c.resources.as_ref()?.limits.as_ref()?.get(GPU_RESOURCE))
                .filter_map(|q| q.0.parse::<u32>().ok())
                .sum()
        })
        .unwrap_or(0)
}

/// The node a pod is bound to.
pub fn pod_node(p: &Pod) -> Option<&str> {
    p.spec.as_ref()?.node_name.as_deref()
}

/// The `app` label of a pod.
pub fn pod_app(p: &Pod) -> &str {
    p.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("app"))
        .map(String::as_str)
        .unwrap_or("")
}

/// Labels a Deployment and its pods `e2e-role=<role>`.
pub fn with_role(mut d: Deployment, role: &str) -> Result<Deployment> {
    for labels in [
        d.metadata.labels.get_or_insert_with(Default::default),
        d.spec
            .template
            .metadata
            .as_mut()
            .and_then(|m| m.labels.as_mut())
            .ok_or_else(|| anyhow!("no template labels"))?,
    ] {
        labels.insert(ROLE_LABEL.to_string(), role.to_string());
    }
    Ok(d)
}

/// Fragments `pool` the way `make demo` does: fills every free GPU of the pool with
/// single-replica 1-GPU Deployments `infer-NN` (labelled `e2e-role=infer`), waits until
/// they run, then deletes Deployments until node `i` of the pool holds `keep[i]` of them.
/// Each kept Deployment gets a PodDisruptionBudget `maxUnavailable: 1` (what the owner of
/// a single-replica service that may be moved writes: without it, gpu-defrag never moves
/// a workload's last Ready replica), and the call returns once the disruption controller
/// has caught up with every one. Returns the names of the Deployments kept, sorted.
pub async fn fragment(
    client: &Client,
    ns: &str,
    pool: &Pool,
    keep: &[usize],
) -> Result<Vec<String>> {
    let kept = fragment_without_pdbs(client, ns, pool, keep).await?;
    allow_one_disruption(client, ns, &kept).await?;
    Ok(kept)
}

/// Gives each Deployment `app` of `apps` a PodDisruptionBudget `maxUnavailable: 1` named
/// after it (what the owner of a single-replica service that may be moved writes), and
/// returns once the disruption controller has caught up with every one.
pub async fn allow_one_disruption(client: &Client, ns: &str, apps: &[String]) -> Result<()> {
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), ns);
    for app in apps {
        let pdb: PodDisruptionBudget = serde_json::from_value(json!({
            "metadata": {"name": app},
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": app}}},
        }))?;
        pdbs.create(&PostParams::default(), &pdb)
            .await
            .with_context(|| format!("creating PDB {app}"))?;
    }
    wait_for(
        "the PDBs to allow one disruption each",
        Duration::from_secs(120),
        || async {
            let mut ready = 0;
            for app in apps {
                let p = pdbs.get(app).await?;
                if p.status.as_ref().is_some_and(|s| {
                    s.disruptions_allowed == Some(1)
                        && s.observed_generation.is_some()
                        && s.observed_generation == p.metadata.generation
                }) {
                    ready += 1;
                }
            }
            Ok((ready == apps.len()).then_some(()))
        },
    )
    .await
}

/// [`fragment`] without the PodDisruptionBudgets (for tests that set their own).
pub async fn fragment_without_pdbs(
    client: &Client,
    ns: &str,
    pool: &Pool,
    keep: &[usize],
) -> Result<Vec<String>> {
    if keep.len() != pool.nodes.len() {
        bail!(
            "keep has {} entries for {} nodes",
            keep.len(),
            pool.nodes.len()
        );
    }
    let used: u32 = pods(client, ns, "")
        .await?
        .iter()
        .filter(|p| pod_node(p).is_some_and(|n| pool.nodes.iter().any(|x| x == n)))
        .map(pod_gpus)
        .sum();
    let free = pool.nodes.len() as u32 * pool.gpus_per_node - used;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    for i in 0..free {
        let name = format!("infer-{i:02}");
        let d = with_role(pool.deployment(&name, 1, 1)?, "infer")?;
        deployments
            .create(&PostParams::default(), &d)
            .await
            .with_context(|| format!("creating {name}"))?;
    }
    let selector = format!("{ROLE_LABEL}=infer");
    let running = crate::fixtures::wait_ready_pods(
        client,
        ns,
        &selector,
        free as usize,
        Duration::from_secs(180),
    )
    .await?;
    let mut by_node: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for p in &running {
        by_node
            .entry(pod_node(p).unwrap_or(""))
            .or_default()
            .push(pod_app(p));
    }
    let mut kept = Vec::new();
    for (i, node) in pool.nodes.iter().enumerate() {
        let mut apps = by_node.remove(node.as_str()).unwrap_or_default();
        apps.sort();
        if apps.len() < keep[i] {
            bail!(
                "node {node} runs {} filler pods, fewer than the {} to keep",
                apps.len(),
                keep[i]
            );
        }
        for app in apps.iter().skip(keep[i]) {
            deployments
                .delete(app, &DeleteParams::background())
                .await
                .with_context(|| format!("deleting {app}"))?;
        }
        kept.extend(apps.iter().take(keep[i]).map(|a| a.to_string()));
    }
    if !by_node.is_empty() {
        bail!("filler pods outside the pool: {by_node:?}");
    }
    wait_for(
        "the removed fillers to be gone",
        Duration::from_secs(120),
        || async {
            let left = pods(client, ns, &selector).await?;
            Ok((left.len() == kept.len() && left.iter().all(pod_ready)).then_some(()))
        },
    )
    .await?;
    kept.sort();
    Ok(kept)
}

/// A Deployment's ready replicas.
pub async fn ready_replicas(client: &Client, ns: &str, name: &str) -> Result<i32> {
    let d = Api::<Deployment>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .with_context(|| format!("reading Deployment {name}"))?;
    Ok(d.status.and_then(|s| s.ready_replicas).unwrap_or(0))
}

/// Waits until every Deployment in `names` has `readyReplicas` 1.
pub async fn wait_deployments_ready(
    client: &Client,
    ns: &str,
    names: &[String],
    timeout: Duration,
) -> Result<()> {
    wait_for(
        "every Deployment back to 1 ready replica",
        timeout,
        || async {
            for n in names {
                if ready_replicas(client, ns, n).await? != 1 {
                    return Ok(None);
                }
            }
            Ok(Some(()))
        },
    )
    .await
}

/// `uid -> name` of the pods of a namespace.
pub async fn pod_uids(client: &Client, ns: &str) -> Result<BTreeMap<String, String>> {
    Ok(pods(client, ns, "")
        .await?
        .into_iter()
        .filter_map(|p| Some((p.metadata.uid?, p.metadata.name?)))
        .collect())
}

// === watching pods and fences ===

/// One pod seen by a [`PodWatch`].
#[derive(Debug, Clone)]
pub struct SeenPod {
    /// Name.
    pub name: String,
    /// `app` label.
    pub app: String,
    /// Node it was bound to (first seen bound).
    pub node: Option<String>,
    /// First sample that listed it.
    pub first_seen: Instant,
    /// First sample that no longer listed it.
    pub gone_at: Option<Instant>,
    /// Listed by the first sample.
    pub initial: bool,
}

/// What a [`PodWatch`] saw.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    /// Pods by uid.
    pub pods: BTreeMap<String, SeenPod>,
    /// A pod that was not there at the start seen bound to a node carrying the fence.
    pub violations: BTreeMap<String, String>,
    /// Pool nodes ever seen fenced by the policy.
    pub fenced: BTreeSet<String>,
    /// Pool nodes fenced in the previous sample.
    pub fenced_before: BTreeSet<String>,
    /// Samples taken.
    pub samples: usize,
    /// The fewest Ready pods seen at once per `app` label (from the first sample that
    /// listed the app on; a sample without any of its pods counts 0).
    pub ready_low: BTreeMap<String, usize>,
}

impl Seen {
    /// Pods that were there at the start and disappeared, by node they ran on.
    pub fn initial_gone(&self) -> Vec<&SeenPod> {
        self.pods
            .values()
            .filter(|p| p.initial && p.gone_at.is_some())
            .collect()
    }

    /// Every pod that disappeared (initial or not).
    pub fn gone(&self) -> Vec<&SeenPod> {
        self.pods.values().filter(|p| p.gone_at.is_some()).collect()
    }
}

/// Samples the pods of a namespace and the fences of a pool every 200 ms until dropped.
/// Pods are listed before nodes in each sample, so a pod seen bound to a node that the
/// same sample shows fenced was bound while the fence was there.
#[derive(Debug)]
pub struct PodWatch {
    seen: Arc<Mutex<Seen>>,
    task: tokio::task::JoinHandle<()>,
}

impl PodWatch {
    /// Takes a first sample (the initial pods), then keeps sampling in the background.
    pub async fn start(client: &Client, ns: &str, pool: &Pool, policy: &str) -> Result<Self> {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (client, ns, pool_name, policy) = (
            client.clone(),
            ns.to_string(),
            pool.name.clone(),
            policy.to_string(),
        );
        sample(&client, &ns, &pool_name, &policy, &seen, true).await?;
        let s2 = seen.clone();
        let task = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                let _ = sample(&client, &ns, &pool_name, &policy, &s2, false).await;
            }
        });
        Ok(Self { seen, task })
    }

    /// What was seen so far.
    pub fn seen(&self) -> Seen {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

impl Drop for PodWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn sample(
    client: &Client,
    ns: &str,
    pool: &str,
    policy: &str,
    seen: &Mutex<Seen>,
    initial: bool,
) -> Result<()> {
    let listed = pods(client, ns, "").await?;
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default().labels(&format!("{POOL_LABEL}={pool}")))
        .await?;
    let now = Instant::now();
    let fenced: BTreeSet<String> = nodes
        .items
        .iter()
        .filter(|n| fences(n).any(|v| v == policy))
        .filter_map(|n| n.metadata.name.clone())
        .collect();
    let mut s = seen.lock().map_err(|_| anyhow!("lock"))?;
    s.samples += 1;
    s.fenced.extend(fenced.iter().cloned());
    let mut alive = BTreeSet::new();
    for p in &listed {
        let Some(uid) = p.metadata.uid.clone() else {
            continue;
        };
        alive.insert(uid.clone());
        let node = pod_node(p).map(str::to_string);
        let entry = s.pods.entry(uid.clone()).or_insert_with(|| SeenPod {
            name: p.metadata.name.clone().unwrap_or_default(),
            app: pod_app(p).to_string(),
            node: None,
            first_seen: now,
            gone_at: None,
            initial,
        });
        // Bound since the previous sample (unbound or not listed then).
        let newly_bound = entry.node.is_none() && node.is_some();
        if entry.node.is_none() {
            entry.node = node.clone();
        }
        let is_new = !entry.initial;
        let name = entry.name.clone();
        // Bound between two samples that both show the fence: bound while it was there (a
        // pod bound just before the fence appeared is not a violation).
        if is_new
            && newly_bound
            && let Some(n) = node.filter(|n| fenced.contains(n) && s.fenced_before.contains(n))
        {
            s.violations
                .entry(uid)
                .or_insert_with(|| format!("{ns}/{name} bound to {n} while it was fenced"));
        }
    }
    for (uid, p) in s.pods.iter_mut() {
        if p.gone_at.is_none() && !alive.contains(uid) {
            p.gone_at = Some(now);
        }
    }
    let mut ready: BTreeMap<String, usize> = BTreeMap::new();
    for p in &listed {
        *ready.entry(pod_app(p).to_string()).or_default() += usize::from(pod_ready(p));
    }
    for (app, low) in s.ready_low.iter_mut() {
        *low = (*low).min(ready.get(app).copied().unwrap_or(0));
    }
    for (app, n) in ready {
        s.ready_low.entry(app).or_insert(n);
    }
    s.fenced_before = fenced;
    Ok(())
}

// === metrics ===

/// The sum of the samples of metric `name` (exact series name, e.g.
/// `gpu_defrag_api_requests_total`) whose labels include every `labels` pair; 0 if none.
pub fn metric_sum(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (n, rest) = match series.split_once('{') {
                Some((n, rest)) => (n, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            if n != name {
                return None;
            }
            let has = |k: &str, v: &str| {
                rest.split(',').any(|kv| {
                    kv.split_once('=')
                        .is_some_and(|(a, b)| a == k && b.trim_matches('"') == v)
                })
            };
            labels
                .iter()
                .all(|(k, v)| has(k, v))
                .then(|| value.parse::<f64>().ok())
                .flatten()
        })
        .sum()
}
