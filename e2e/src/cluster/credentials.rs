//! Credentials: kubeconfig files, admin clients by port, and users with a client
//! certificate signed by the cluster CA (only the permissions RBAC grants them).
use std::{
    fs,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context, Result, bail};
use kube::{Client, Config, config::AuthInfo};
use serde_json::json;

use super::TestCluster;

/// Writes a kubeconfig for `user` with client cert `crt`/`key`.
pub(super) fn write_kubeconfig(
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

impl TestCluster {
    pub(super) fn client_for_port(&self, port: u16) -> Result<Client> {
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
}
