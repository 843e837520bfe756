//! The control plane's components: etcd, kube-apiserver (and its stop and restart, the
//! API-server faults), kube-controller-manager, the kube-schedulers and kwok — their flags,
//! start and readiness.
use std::{
    fs,
    io::{Read, Write},
    net::TcpStream,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, anyhow, bail};
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use serde_json::json;

use crate::process::Component;

use super::{KWOK_NODE_ANNOTATION, TestCluster, credentials::write_kubeconfig, spawn::Started};

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

impl TestCluster {
    pub(super) async fn start_etcd(&self, timeout: Duration) -> Result<Started> {
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

    pub(super) async fn start_apiserver(
        &self,
        etcd_port: u16,
        timeout: Duration,
    ) -> Result<Started> {
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

    pub(super) async fn wait_default_namespace(&self, timeout: Duration) -> Result<()> {
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

    pub(super) fn write_scheduler_config(&self, template: &Path) -> Result<PathBuf> {
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

    pub(super) fn kcm_args(&self, port: u16) -> Vec<String> {
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
    pub(super) fn scheduler_args(&self, port: u16, config: Option<&Path>) -> Vec<String> {
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

    pub(super) fn spawn_kwok(&self) -> Result<Component> {
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
}
