//! Workloads on a pool: reading pods (GPUs, node, app), fragmenting the pool with filler
//! Deployments as `make demo` does, their PodDisruptionBudgets, and waiting for them.
use std::{collections::BTreeMap, time::Duration};

use anyhow::{Context, Result, anyhow, bail};
use k8s_openapi::api::{apps::v1::Deployment, core::v1::Pod, policy::v1::PodDisruptionBudget};
use kube::{
    Api, Client,
    api::{DeleteParams, PostParams},
};
use serde_json::json;

use crate::{
    cluster::GPU_RESOURCE,
    fixtures::{pod_ready, pods, wait_for},
};

use super::{Pool, ROLE_LABEL};

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
