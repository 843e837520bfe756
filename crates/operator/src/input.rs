//! Reading the inputs of the CLI: snapshot files, policy files, the live cluster.
use std::path::Path;

use anyhow::Context;
use gpu_defrag_api::v1alpha1::{DefragPolicy, DefragPolicySpec};
use gpu_defrag_core::ingest::Objects;
use gpu_defrag_core::policy::Policy;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, ApiResource, DynamicObject, ListParams};

/// An input problem the user must fix (exit code 2).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct InputError(pub String);

/// Reads a snapshot file.
pub fn read_snapshot(path: &Path) -> Result<Objects, InputError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| InputError(format!("{}: {e}", path.display())))?;
    gpu_defrag_core::snapshot::parse(&text)
        .map_err(|e| InputError(format!("{}: {e}", path.display())))
}

/// Reads a policy file: a DefragPolicy object, or just its spec.
pub fn read_policy(path: &Path) -> Result<(String, Policy), InputError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| InputError(format!("{}: {e}", path.display())))?;
    let value: serde_json::Value = serde_norway::from_str(&text)
        .map_err(|e| InputError(format!("{}: not YAML: {e}", path.display())))?;
    let (name, spec) = if value.get("spec").is_some() {
        let p: DefragPolicy = serde_path_to_error::deserialize(value).map_err(|e| {
            InputError(format!(
                "{}: field {}: {}",
                path.display(),
                e.path(),
                e.inner()
            ))
        })?;
        (
            p.metadata.name.clone().unwrap_or_else(|| "policy".into()),
            p.spec,
        )
    } else {
        let s: DefragPolicySpec = serde_path_to_error::deserialize(value).map_err(|e| {
            InputError(format!(
                "{}: field spec.{}: {}",
                path.display(),
                e.path(),
                e.inner()
            ))
        })?;
        ("policy".into(), s)
    };
    let policy =
        Policy::from_spec(&spec).map_err(|e| InputError(format!("{}: {e}", path.display())))?;
    Ok((name, policy))
}

/// Reads nodes, pods, PDBs (and Koordinator Devices when that CRD exists) from the
/// cluster of the current kubeconfig context. Read-only.
pub async fn read_live(client: kube::Client) -> anyhow::Result<Objects> {
    let lp = ListParams::default();
    let nodes = Api::<Node>::all(client.clone())
        .list(&lp)
        .await
        .context("listing nodes")?
        .items;
    let pods = Api::<Pod>::all(client.clone())
        .list(&lp)
        .await
        .context("listing pods")?
        .items;
    let pdbs = Api::<PodDisruptionBudget>::all(client.clone())
        .list(&lp)
        .await
        .context("listing poddisruptionbudgets")?
        .items;
    let ar = ApiResource {
        group: "scheduling.koordinator.sh".into(),
        version: "v1alpha1".into(),
        api_version: "scheduling.koordinator.sh/v1alpha1".into(),
        kind: "Device".into(),
        plural: "devices".into(),
    };
    let devices = match Api::<DynamicObject>::all_with(client, &ar).list(&lp).await {
        Ok(list) => list
            .items
            .into_iter()
            .filter_map(|d| serde_json::to_value(d).ok())
            .collect(),
        // Not a Koordinator cluster (404) or not allowed: Device objects are optional.
        Err(_) => Vec::new(),
    };
    Ok(Objects {
        nodes,
        pods,
        pdbs,
        devices,
    })
}
