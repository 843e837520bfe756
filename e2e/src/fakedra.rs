//! A fake DRA GPU driver for the e2e tests: the objects the NVIDIA DRA driver
//! (`gpu.nvidia.com`) publishes, made by the test itself. kube-scheduler needs no kubelet
//! plugin to allocate claims from them (the scheduler's own performance tests run DRA the
//! same way), and KWOK starts the pods once bound.
//!
//! - DeviceClass `gpu.nvidia.com`: whole GPUs of the driver, with `extendedResourceName:
//!   nvidia.com/gpu`, so pods that keep asking for `nvidia.com/gpu` get their GPUs through
//!   DRA on nodes that do not advertise the resource (DRA-backed extended resources).
//! - One ResourceSlice per node (`pool.name` = the node, one slice, generation 1) with
//!   `gpu-0` … `gpu-N` in the driver's format (`type`, `uuid`, `productName`, memory).

use anyhow::{Context, Result};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceSlice};
use kube::{Api, Client, api::PostParams};
use serde_json::json;

use crate::{
    cluster::{GPU_RESOURCE, GpuNodes, TestCluster},
    operator::{POOL_LABEL, Pool},
};

/// The driver (and the DeviceClass) name.
pub const DRIVER: &str = "gpu.nvidia.com";

/// Creates the DeviceClass `gpu.nvidia.com` (whole GPUs, backing `nvidia.com/gpu`) unless
/// it exists.
pub async fn ensure_device_class(client: &Client) -> Result<()> {
    let class: DeviceClass = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": DRIVER},
        "spec": {
            "selectors": [{"cel": {"expression":
                "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"}}],
            "extendedResourceName": GPU_RESOURCE,
        },
    }))?;
    match Api::<DeviceClass>::all(client.clone())
        .create(&PostParams::default(), &class)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e).context("creating the DeviceClass"),
    }
}

/// The ResourceSlice of `node` with `gpus` whole A100s.
pub fn slice(node: &str, gpus: u32) -> Result<ResourceSlice> {
    let devices: Vec<_> = (0..gpus)
        .map(|i| {
            json!({
                "name": format!("gpu-{i}"),
                "attributes": {
                    "type": {"string": "gpu"},
                    "uuid": {"string": format!("GPU-{node}-{i:04}")},
                    "productName": {"string": "NVIDIA A100-SXM4-80GB"},
                    "index": {"int": i},
                },
                "capacity": {"memory": {"value": "80Gi"}},
            })
        })
        .collect();
    Ok(serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": format!("{node}-{DRIVER}")},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }))?)
}

/// A pool of `count` nodes whose `gpus` GPUs each are published only through DRA (no
/// `nvidia.com/gpu` in their allocatable), with the DeviceClass and their slices.
pub async fn dra_pool(cluster: &TestCluster, name: &str, count: usize, gpus: u32) -> Result<Pool> {
    let client = cluster.client()?;
    ensure_device_class(&client).await?;
    let nodes = cluster
        .add_nodes(
            &GpuNodes::new(count, gpus)
                .dra()
                .name_prefix(name)
                .label(POOL_LABEL, name)
                .taint(POOL_LABEL, name, "NoSchedule"),
        )
        .await?;
    let slices = Api::<ResourceSlice>::all(client);
    for n in &nodes {
        slices
            .create(&PostParams::default(), &slice(n, gpus)?)
            .await
            .with_context(|| format!("publishing the ResourceSlice of {n}"))?;
    }
    Ok(Pool {
        name: name.to_string(),
        nodes,
        gpus_per_node: gpus,
    })
}
