//! kwok GPU nodes: [`GpuNodes`] (how many, GPUs, model, labels, taints, resources) and the
//! Node objects it makes, [`TestCluster::add_nodes`] and the wait until they are usable.
use std::{
    collections::BTreeMap,
    sync::atomic::Ordering,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::{Node, Taint};
use kube::{Api, api::ListParams};
use serde_json::json;

use super::{
    DEFAULT_GPU_MODEL, GPU_PRODUCT_LABEL, GPU_RESOURCE, KWOK_NODE_ANNOTATION, TestCluster,
};

/// A set of kwok GPU nodes to create; see [`TestCluster::add_nodes`].
#[derive(Debug, Clone)]
pub struct GpuNodes {
    /// How many nodes.
    pub count: usize,
    /// `nvidia.com/gpu` capacity of each.
    pub gpus_per_node: u32,
    /// GPU model (label `nvidia.com/gpu.product`).
    pub model: String,
    /// Name prefix; names are `<prefix>-<n>` with `n` unique in the cluster.
    pub name_prefix: String,
    /// CPU capacity (quantity).
    pub cpu: String,
    /// Memory capacity (quantity).
    pub memory: String,
    /// Pod capacity.
    pub pods: u32,
    /// Extra labels.
    pub labels: BTreeMap<String, String>,
    /// Extra annotations (e.g. GPU sharing settings).
    pub annotations: BTreeMap<String, String>,
    /// Taints (none by default).
    pub taints: Vec<Taint>,
    /// More allocatable resources (a sharing scheme's, e.g. `koordinator.sh/gpu-core`).
    pub resources: BTreeMap<String, String>,
    /// Whether the GPUs are an extended resource (`nvidia.com/gpu` in allocatable, a
    /// device plugin's way); off for GPUs published only in DRA ResourceSlices.
    pub extended_resource: bool,
}

impl GpuNodes {
    /// `count` nodes with `gpus_per_node` GPUs of the default model, 64 CPUs, 512Gi.
    pub fn new(count: usize, gpus_per_node: u32) -> Self {
        Self {
            count,
            gpus_per_node,
            model: DEFAULT_GPU_MODEL.to_string(),
            name_prefix: "gpu-node".to_string(),
            cpu: "64".to_string(),
            memory: "512Gi".to_string(),
            pods: 110,
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            taints: Vec::new(),
            resources: BTreeMap::new(),
            extended_resource: true,
        }
    }

    /// Adds an allocatable resource (capacity too).
    /// GPUs published only through DRA (no `nvidia.com/gpu` in the node's allocatable).
    pub fn dra(mut self) -> Self {
        self.extended_resource = false;
        self
    }

    pub fn resource(mut self, name: impl Into<String>, quantity: impl Into<String>) -> Self {
        self.resources.insert(name.into(), quantity.into());
        self
    }

    /// Sets the GPU model.
    pub fn model(mut self, model: impl Into<String>) -> Self {
        self.model = model.into();
        self
    }

    /// Sets the name prefix.
    pub fn name_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.name_prefix = prefix.into();
        self
    }

    /// Adds a label.
    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// Adds an annotation.
    pub fn annotation(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.annotations.insert(key.into(), value.into());
        self
    }

    /// Adds a taint (`effect`: NoSchedule, PreferNoSchedule or NoExecute).
    pub fn taint(mut self, key: &str, value: &str, effect: &str) -> Self {
        self.taints.push(Taint {
            key: key.to_string(),
            value: Some(value.to_string()),
            effect: effect.to_string(),
            ..Taint::default()
        });
        self
    }

    /// The Node object for `name`.
    pub fn node(&self, name: &str) -> Result<Node> {
        let mut labels = BTreeMap::from([
            ("kubernetes.io/hostname".to_string(), name.to_string()),
            ("kubernetes.io/os".to_string(), "linux".to_string()),
            ("kubernetes.io/arch".to_string(), "amd64".to_string()),
            ("type".to_string(), "kwok".to_string()),
            (GPU_PRODUCT_LABEL.to_string(), self.model.clone()),
            ("nvidia.com/gpu.present".to_string(), "true".to_string()),
            (
                "nvidia.com/gpu.count".to_string(),
                self.gpus_per_node.to_string(),
            ),
        ]);
        labels.extend(self.labels.clone());
        let mut annotations = self.annotations.clone();
        annotations.insert(KWOK_NODE_ANNOTATION.to_string(), "fake".to_string());
        let mut resources = json!({
            "cpu": self.cpu,
            "memory": self.memory,
            "pods": self.pods.to_string(),
            GPU_RESOURCE: self.gpus_per_node.to_string(),
        });
        for (k, v) in &self.resources {
            resources[k] = json!(v);
        }
        if !self.extended_resource
            && let Some(r) = resources.as_object_mut()
        {
            r.remove(GPU_RESOURCE);
        }
        serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": labels, "annotations": annotations},
            "spec": {"taints": self.taints},
            "status": {"capacity": resources, "allocatable": resources},
        }))
        .context("building a Node")
    }
}

impl TestCluster {
    /// Creates `count` kwok GPU nodes (`gpus_per_node` × `model`, extra labels and
    /// annotations) and waits until they are Ready and schedulable. Returns their names.
    pub async fn add_gpu_nodes(
        &self,
        count: usize,
        gpus_per_node: u32,
        model: &str,
        labels: &[(&str, &str)],
        annotations: &[(&str, &str)],
    ) -> Result<Vec<String>> {
        let mut nodes = GpuNodes::new(count, gpus_per_node).model(model);
        for (k, v) in labels {
            nodes = nodes.label(*k, *v);
        }
        for (k, v) in annotations {
            nodes = nodes.annotation(*k, *v);
        }
        self.add_nodes(&nodes).await
    }

    /// Creates the nodes described by `nodes` and waits until they are Ready and carry no
    /// `node.kubernetes.io/*` taint. Returns their names.
    pub async fn add_nodes(&self, nodes: &GpuNodes) -> Result<Vec<String>> {
        let api: Api<Node> = Api::all(self.client()?);
        let mut names = Vec::with_capacity(nodes.count);
        let mut objects = Vec::with_capacity(nodes.count);
        for _ in 0..nodes.count {
            let n = self.node_seq.fetch_add(1, Ordering::Relaxed);
            let name = format!("{}-{n}", nodes.name_prefix);
            objects.push(nodes.node(&name)?);
            names.push(name);
        }
        crate::fixtures::create_all(&api, objects, 16).await?;
        self.wait_nodes_ready(
            &names,
            Duration::from_secs(90).max(Duration::from_millis(90 * names.len() as u64)),
        )
        .await?;
        Ok(names)
    }

    /// Waits until every node in `names` is Ready, untainted by node conditions, and
    /// reports `nvidia.com/gpu` allocatable.
    pub async fn wait_nodes_ready(&self, names: &[String], timeout: Duration) -> Result<()> {
        let api: Api<Node> = Api::all(self.client()?);
        let deadline = Instant::now() + timeout;
        loop {
            self.ensure_running()?;
            let list = api
                .list(&ListParams::default())
                .await
                .context("listing nodes")?;
            let ready: Vec<&str> = list
                .items
                .iter()
                .filter(|n| node_usable(n))
                .filter_map(|n| n.metadata.name.as_deref())
                .collect();
            let missing: Vec<&String> = names
                .iter()
                .filter(|n| !ready.contains(&n.as_str()))
                .collect();
            if missing.is_empty() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "{} nodes not Ready within {timeout:?}, e.g. {:?}; see {}",
                    missing.len(),
                    &missing[..missing.len().min(10)],
                    self.logs_dir().display()
                );
            }
            // Listing a thousand nodes four times a second would load the API server.
            let pause = if names.len() > 100 { 1000 } else { 250 };
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
    }
}

/// Ready=True and no `node.kubernetes.io/…` taint (not-ready, unreachable), with GPUs in
/// its allocatable — or, for a node whose GPUs are published through DRA, with the
/// allocatable it was created with (cpu).
pub fn node_usable(node: &Node) -> bool {
    let Some(status) = &node.status else {
        return false;
    };
    let ready = status
        .conditions
        .as_ref()
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    let tainted = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key.starts_with("node.kubernetes.io/")));
    let gpus = status.allocatable.as_ref().is_some_and(|a| {
        a.contains_key(GPU_RESOURCE)
            || (a.contains_key("cpu")
                && node
                    .metadata
                    .labels
                    .as_ref()
                    .is_some_and(|l| l.contains_key("nvidia.com/gpu.count")))
    });
    ready && !tainted && gpus
}
