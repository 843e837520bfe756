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

/// The MIG DeviceClass name (NVIDIA's).
pub const MIG_CLASS: &str = "mig.nvidia.com";

/// Creates the DeviceClass `mig.nvidia.com` (MIG partitions of the driver) unless it exists.
pub async fn ensure_mig_class(client: &Client) -> Result<()> {
    let class: DeviceClass = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": MIG_CLASS},
        "spec": {"selectors": [{"cel": {"expression":
            "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'"}}]},
    }))?;
    match Api::<DeviceClass>::all(client.clone())
        .create(&PostParams::default(), &class)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e).context("creating the MIG DeviceClass"),
    }
}

/// One A100 of `node` published as a partitionable device, in the NVIDIA driver's
/// DynamicMIG layout: a slice with the GPU's counter set (8 memory slices) and a slice with
/// the whole GPU `gpu-0` (all 8), two `3g.40gb` partitions (slices 0–3 and 4–7) and four
/// `1g.10gb` partitions (slices 4, 5, 6, 7), in that order. A whole GPU and the partitions
/// it overlaps exclude each other through the counters.
pub fn mig_slices(node: &str) -> Result<Vec<ResourceSlice>> {
    let set = "gpu-0-counter-set";
    let counters = |slices: std::ops::Range<u32>| -> serde_json::Value {
        let m: serde_json::Map<String, serde_json::Value> = slices
            .map(|i| (format!("memory-slice-{i}"), json!({"value": "1"})))
            .collect();
        json!([{"counterSet": set, "counters": m}])
    };
    let uuid = format!("GPU-{node}-0000");
    let mig = |name: String, profile: &str, mem: &str, slices: std::ops::Range<u32>| {
        json!({
            "name": name,
            "attributes": {
                "type": {"string": "mig"},
                "profile": {"string": profile},
                "parentUUID": {"string": uuid},
                "uuid": {"string": format!("MIG-{node}-{profile}-{}", slices.start)},
                "productName": {"string": "NVIDIA A100-SXM4-80GB"},
            },
            "capacity": {"memory": {"value": mem}},
            "consumesCounters": counters(slices),
        })
    };
    let mut devices = vec![json!({
        "name": "gpu-0",
        "attributes": {
            "type": {"string": "gpu"},
            "uuid": {"string": uuid},
            "productName": {"string": "NVIDIA A100-SXM4-80GB"},
        },
        "capacity": {"memory": {"value": "80Gi"}},
        "consumesCounters": counters(0..8),
    })];
    devices.push(mig("gpu-0-mig-3g40gb-0".into(), "3g.40gb", "40Gi", 0..4));
    devices.push(mig("gpu-0-mig-3g40gb-4".into(), "3g.40gb", "40Gi", 4..8));
    for i in 4..8 {
        devices.push(mig(
            format!("gpu-0-mig-1g10gb-{i}"),
            "1g.10gb",
            "10Gi",
            i..i + 1,
        ));
    }
    let all: serde_json::Map<String, serde_json::Value> = (0..8)
        .map(|i| (format!("memory-slice-{i}"), json!({"value": "1"})))
        .collect();
    let pool = json!({"name": node, "generation": 1, "resourceSliceCount": 2});
    Ok(vec![
        serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": format!("{node}-counters")},
            "spec": {"driver": DRIVER, "nodeName": node, "pool": pool,
                     "sharedCounters": [{"name": set, "counters": all}]},
        }))?,
        serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": format!("{node}-gpu-0")},
            "spec": {"driver": DRIVER, "nodeName": node, "pool": pool, "devices": devices},
        }))?,
    ])
}
