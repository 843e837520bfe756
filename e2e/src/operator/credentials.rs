//! The operator's credentials and installation: its ClusterRole bound to
//! [`OPERATOR_USER`] and that user's kubeconfig, the leader election Role, landing control
//! as config/ installs it, and clients from kubeconfig files.
use std::{
    path::{Path, PathBuf},
    sync::OnceLock,
    time::Duration,
};

use anyhow::{Context, Result, anyhow, bail};
use k8s_openapi::api::{
    core::v1::{Node, Pod},
    rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding},
};
use kube::{
    Api, Client,
    api::{ListParams, Patch, PatchParams},
    config::{KubeConfigOptions, Kubeconfig},
};
use serde_json::json;

use crate::{
    cluster::{FIELD_MANAGER, TestCluster, repo_root},
    fixtures::wait_for,
};

use super::{LANDING_NAMESPACE, OPERATOR_USER, policies};

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

/// The landing ConfigMap of the operator of `selector`
/// ([`Operator::start`](super::Operator::start) names it).
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
