//! Components as process groups: spawning one (registered with the reaper), waiting for
//! its `/healthz`, and starting it again on fresh loopback ports when it lost a port race.
use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, anyhow, bail};
use kube::{Client, Config};

use crate::process::{Component, free_port, log_tail};

use super::{TestCluster, component_binary};

pub(super) struct Started {
    pub(super) component: Component,
    pub(super) ports: Vec<u16>,
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
    pub(super) fn push(&self, c: Component) -> Result<()> {
        self.components
            .lock()
            .map_err(|_| anyhow!("components lock"))?
            .push(c);
        Ok(())
    }

    pub(super) fn bin(&self, name: &str) -> PathBuf {
        self.bin_dir.join(component_binary(name))
    }

    fn log(&self, name: &str) -> PathBuf {
        self.work_dir.join("logs").join(format!("{name}.log"))
    }

    /// Starts a component and registers its process group with the reaper.
    pub(super) fn spawn(&self, name: &str, args: Vec<String>) -> Result<Component> {
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
    pub(super) fn discard(&self, mut c: Component) {
        c.stop(Duration::from_secs(2));
        if let Ok(mut reaper) = self.reaper.lock()
            && let Some(reaper) = reaper.as_mut()
        {
            let _ = reaper.unwatch(c.pgid);
        }
    }

    /// Waits for `/healthz` of a component started on `port`; if it lost a port race,
    /// starts it again on fresh ports.
    pub(super) async fn settle(
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
    pub(super) async fn start_with_ports<F, H, Fut>(
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
}
