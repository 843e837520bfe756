//! A test's node pool ([`Pool`]: kwok GPU nodes labelled and tainted `e2e-pool=<name>`,
//! and Deployments placed on it) and the draining fences on nodes.
use anyhow::{Context, Result, anyhow};
use k8s_openapi::api::{
    apps::v1::Deployment,
    core::v1::{Node, PodSpec},
};
use kube::{Api, Client, api::ListParams};
use serde_json::{Value, json};

use crate::{
    cluster::{GpuNodes, TestCluster},
    fixtures::gpu_deployment,
};

use super::{DRAINING_TAINT_DOMAIN, POOL_LABEL};

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
