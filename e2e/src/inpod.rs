//! Running a binary the way it runs in its pod: with in-cluster configuration only.
//!
//! A pod's container finds the API server in `KUBERNETES_SERVICE_HOST` and
//! `KUBERNETES_SERVICE_PORT`, and its service account's token, the cluster CA and its
//! namespace in `/var/run/secrets/kubernetes.io/serviceaccount/`. [`InPod::start`] gives a
//! local process exactly that: it runs it in a private mount namespace (`unshare --mount
//! --map-root-user`, no privilege needed where user namespaces are allowed) whose
//! `/var/run` is a fresh tmpfs holding those three files, with an environment that has no
//! kubeconfig at all (`env -i`), so the client library can only take the in-cluster path.
//! Nothing outside the namespace sees the mount.

use std::{fs, path::Path, process::Command, time::Duration};

use anyhow::{Context, Result, bail};

use crate::{cluster::TestCluster, process::Component};

/// Where a pod's service account files are mounted.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// Mounts the tmpfs, copies the files in and execs the command (`$@`).
const ENTRYPOINT: &str = r#"set -e
mount -t tmpfs -o mode=0755 tmpfs /var/run
mkdir -p "$SA_MOUNT"
cp "$SA_FILES/token" "$SA_FILES/ca.crt" "$SA_FILES/namespace" "$SA_MOUNT/"
unset SA_FILES SA_MOUNT
exec "$@""#;

/// A service account, as the test pod would run under it.
#[derive(Debug, Clone)]
pub struct ServiceAccount<'a> {
    /// Its namespace.
    pub namespace: &'a str,
    /// Its name.
    pub name: &'a str,
}

/// A process started by [`InPod::start`].
#[derive(Debug)]
pub struct InPod {
    /// The process (group); stopped on drop.
    pub component: Component,
}

impl InPod {
    /// Whether this machine lets an unprivileged process make a private mount namespace.
    pub fn supported() -> bool {
        Command::new("unshare")
            .args(["--mount", "--map-root-user", "true"])
            .status()
            .is_ok_and(|s| s.success())
    }

    /// Starts `bin args…` as a pod of service account `sa` would run: a token issued for
    /// `sa` (TokenRequest, one hour), the cluster's CA, `env` and nothing else in its
    /// environment. Output goes to `<logs>/<name>.log`.
    pub fn start(
        cluster: &TestCluster,
        name: &str,
        sa: &ServiceAccount<'_>,
        bin: &Path,
        args: &[String],
        env: &[(&str, &str)],
    ) -> Result<Self> {
        let files = cluster.work_dir().join("serviceaccounts").join(name);
        fs::create_dir_all(&files).with_context(|| format!("creating {}", files.display()))?;
        let out = cluster
            .kubectl()
            .args([
                "create",
                "token",
                sa.name,
                "-n",
                sa.namespace,
                "--duration=1h",
            ])
            .output()
            .context("running kubectl create token")?;
        if !out.status.success() {
            bail!(
                "kubectl create token {}/{}: {}",
                sa.namespace,
                sa.name,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let token = String::from_utf8(out.stdout).context("the token is not UTF-8")?;
        fs::write(files.join("token"), token.trim())?;
        fs::copy(cluster.ca_path(), files.join("ca.crt"))?;
        fs::write(files.join("namespace"), sa.namespace)?;

        let port = cluster
            .server_url()
            .rsplit_once(':')
            .map(|(_, p)| p.trim_end_matches('/').to_string())
            .context("the API server URL has no port")?;
        let home = cluster.work_dir().join("home").join(name);
        fs::create_dir_all(&home)?;
        let mut argv: Vec<String> = vec![
            "-i".into(),
            format!("PATH={}", std::env::var("PATH").unwrap_or_default()),
            format!("HOME={}", home.display()),
            "KUBERNETES_SERVICE_HOST=127.0.0.1".into(),
            format!("KUBERNETES_SERVICE_PORT={port}"),
            format!("SA_FILES={}", files.display()),
            format!("SA_MOUNT={SERVICE_ACCOUNT_DIR}"),
        ];
        argv.extend(env.iter().map(|(k, v)| format!("{k}={v}")));
        argv.extend(
            [
                "unshare",
                "--mount",
                "--map-root-user",
                "sh",
                "-c",
                ENTRYPOINT,
                name,
            ]
            .map(String::from),
        );
        argv.push(bin.display().to_string());
        argv.extend(args.iter().cloned());
        let log = cluster.logs_dir().join(format!("{name}.log"));
        let component = Component::spawn(name, Path::new("env"), &argv, &[], &log)?;
        Ok(Self { component })
    }

    /// Fails with the log's tail when the process has exited.
    pub fn ensure_running(&mut self) -> Result<()> {
        self.component.ensure_running()
    }

    /// Stops the process group.
    pub fn stop(&mut self) {
        self.component.stop(Duration::from_secs(5));
    }
}
