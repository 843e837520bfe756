//! Reading the inputs of the CLI: snapshot files, policy files, the live cluster.
use std::path::{Path, PathBuf};

use anyhow::Context;
use gpu_defrag_api::v1alpha1::{DefragPolicy, DefragPolicySpec};
use gpu_defrag_core::ingest::Objects;
use gpu_defrag_core::policy::Policy;
use gpu_defrag_core::workload::{
    ControllerKind, ControllerObject, KAI_GROUP_API, Listed, VOLCANO_GROUP_API,
};
use k8s_openapi::api::apps::v1::{ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig};

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

/// Which cluster the CLI reads: the current context of the kubeconfig (`$KUBECONFIG`,
/// else `~/.kube/config`, else the in-cluster service account) unless told otherwise.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct KubeArgs {
    /// Kubeconfig file to use instead of `$KUBECONFIG` / `~/.kube/config`.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context to use instead of the current one.
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
}

impl KubeArgs {
    /// The client configuration these arguments select.
    pub async fn config(&self) -> anyhow::Result<kube::Config> {
        let opts = KubeConfigOptions {
            context: self.context.clone(),
            ..Default::default()
        };
        Ok(match (&self.kubeconfig, &self.context) {
            (Some(path), _) => {
                let kc = Kubeconfig::read_from(path)
                    .map_err(|e| InputError(format!("{}: {e}", path.display())))?;
                kube::Config::from_custom_kubeconfig(kc, &opts).await?
            }
            (None, Some(_)) => kube::Config::from_kubeconfig(&opts).await?,
            (None, None) => kube::Config::infer().await?,
        })
    }
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

/// Reads DefragPolicy `name` from the cluster and checks its spec as the operator does.
pub async fn read_cluster_policy(
    client: kube::Client,
    name: &str,
) -> anyhow::Result<(String, Policy)> {
    let p = Api::<DefragPolicy>::all(client)
        .get(name)
        .await
        .map_err(|e| not_found(e, name))?;
    let policy =
        Policy::from_spec(&p.spec).map_err(|e| InputError(format!("DefragPolicy {name}: {e}")))?;
    Ok((name.to_string(), policy))
}

/// DefragPolicy objects as the API server returns them (spec and status untouched):
/// `name`, or all of them sorted by name.
pub async fn read_policy_objects(
    client: kube::Client,
    name: Option<&str>,
) -> anyhow::Result<Vec<DynamicObject>> {
    let api = Api::<DynamicObject>::all_with(client, &ApiResource::erase::<DefragPolicy>(&()));
    let mut items = match name {
        Some(n) => vec![api.get(n).await.map_err(|e| not_found(e, n))?],
        None => api
            .list(&ListParams::default())
            .await
            .map_err(|e| match e {
                kube::Error::Api(s) if s.code == 404 => anyhow::Error::new(InputError(
                    "the DefragPolicy CRD (defragpolicies.gpu-defrag.io) is not installed in this cluster"
                        .into(),
                )),
                e => anyhow::Error::new(e).context("listing DefragPolicies"),
            })?
            .items,
    };
    items.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    Ok(items)
}

/// The metadata of every `K` in the cluster (`what` names it in errors).
async fn list_meta<K>(
    client: &kube::Client,
    what: &str,
) -> anyhow::Result<Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    Ok(Api::<K>::all(client.clone())
        .list_metadata(&ListParams::default())
        .await
        .with_context(|| format!("listing {what}"))?
        .items
        .into_iter()
        .map(|o| o.metadata)
        .collect())
}

/// A 404 on DefragPolicy `name` is the user's to fix (exit code 2).
fn not_found(e: kube::Error, name: &str) -> anyhow::Error {
    match e {
        kube::Error::Api(s) if s.code == 404 => anyhow::Error::new(InputError(format!(
            "DefragPolicy {name:?} not found ({}); `kubectl get dfp` lists them",
            s.message
        ))),
        e => anyhow::Error::new(e).context(format!("reading DefragPolicy {name}")),
    }
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
    let devices = match Api::<DynamicObject>::all_with(client.clone(), &ar)
        .list(&lp)
        .await
    {
        Ok(list) => list
            .items
            .into_iter()
            .filter_map(|d| serde_json::to_value(d).ok())
            .collect(),
        // Not a Koordinator cluster (404) or not allowed: Device objects are optional.
        Err(_) => Vec::new(),
    };
    let rs = list_meta::<ReplicaSet>(&client, "replicasets").await?;
    let ss = list_meta::<StatefulSet>(&client, "statefulsets").await?;
    let jobs = list_meta::<Job>(&client, "jobs").await?;
    let namespaces = list_meta::<Namespace>(&client, "namespaces").await?;
    let mut controllers = Vec::new();
    let object = |kind| move |metadata| ControllerObject { kind, metadata };
    controllers.extend(rs.into_iter().map(object(ControllerKind::ReplicaSet)));
    controllers.extend(ss.into_iter().map(object(ControllerKind::StatefulSet)));
    controllers.extend(jobs.into_iter().map(object(ControllerKind::Job)));
    // Volcano and KAI PodGroups, where served: a pod naming a group that cannot be read
    // is never moved (gang-unknown).
    let mut pod_groups = Vec::new();
    let mut groups_listed = [false; 2];
    for (i, (group, version)) in [(VOLCANO_GROUP_API, "v1beta1"), (KAI_GROUP_API, "v2alpha2")]
        .into_iter()
        .enumerate()
    {
        let ar = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(group, version, "PodGroup"),
            "podgroups",
        );
        if let Ok(list) = Api::<DynamicObject>::all_with(client.clone(), &ar)
            .list(&lp)
            .await
        {
            groups_listed[i] = true;
            pod_groups.extend(
                list.items
                    .into_iter()
                    .filter_map(|g| serde_json::to_value(g).ok()),
            );
        }
    }
    Ok(Objects {
        nodes,
        pods,
        pdbs,
        devices,
        controllers,
        namespaces,
        pod_groups,
        listed: Listed {
            replica_sets: true,
            stateful_sets: true,
            jobs: true,
            namespaces: true,
            volcano_pod_groups: groups_listed[0],
            kai_pod_groups: groups_listed[1],
        },
    })
}
