//! Small building blocks for e2e tests: GPU workloads and polling.

use std::{future::Future, time::Duration};

use anyhow::{Context, Result, anyhow};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::{apps::v1::Deployment, core::v1::Pod, policy::v1::PodDisruptionBudget};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{ListParams, PostParams},
};
use serde_json::json;

/// Extended resource name of NVIDIA GPUs.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";
/// The scheduler GPU pods opt in to: the `gpu-binpack` second scheduler the test control
/// plane runs (config/scheduler); other pods keep the stock default scheduler.
pub const GPU_SCHEDULER: &str = gpu_defrag_api::v1alpha1::BINPACK_SCHEDULER;
/// Image of the fake workloads; kwok never pulls it.
pub const FAKE_IMAGE: &str = "registry.invalid/gpu-defrag/fake-gpu-workload:latest";

/// Polls `probe` every 200 ms until it returns `Ok(Some(_))`, for at most `timeout`.
/// Errors from `probe` are retried; the last one is reported on timeout.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, probe: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    wait_for_every(what, timeout, Duration::from_millis(200), probe).await
}

/// [`wait_for`], polling every `every`.
pub async fn wait_for_every<T, F, Fut>(
    what: &str,
    timeout: Duration,
    every: Duration,
    mut probe: F,
) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut last_error = None;
    loop {
        match probe().await {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last_error = Some(e),
        }
        if tokio::time::Instant::now() >= deadline {
            let msg = format!("timed out after {timeout:?} waiting for {what}");
            return Err(match last_error {
                Some(e) => e.context(msg),
                None => anyhow!(msg),
            });
        }
        tokio::time::sleep(every).await;
    }
}

/// Creates `objects` with up to `concurrency` requests at once (bulk creation of nodes and
/// pods); fails on the first error, naming the object.
pub async fn create_all<K>(api: &Api<K>, objects: Vec<K>, concurrency: usize) -> Result<()>
where
    K: Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
    K::DynamicType: Default,
{
    futures::stream::iter(objects)
        .map(|o| async move {
            let name = o.name_any();
            api.create(&PostParams::default(), &o)
                .await
                .map(|_| ())
                .with_context(|| format!("creating {} {name}", K::kind(&Default::default())))
        })
        .buffer_unordered(concurrency.max(1))
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// A Deployment of `replicas` pods labelled `app=<name>`, each asking for `gpus` whole
/// GPUs (limits), 1 CPU and 1Gi.
pub fn gpu_deployment(name: &str, replicas: i32, gpus: u32) -> Result<Deployment> {
    serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "schedulerName": GPU_SCHEDULER,
                    "terminationGracePeriodSeconds": 0,
                    "containers": [{
                        "name": "main",
                        "image": FAKE_IMAGE,
                        "resources": {
                            "requests": {"cpu": "1", "memory": "1Gi"},
                            "limits": {"cpu": "1", "memory": "1Gi", GPU_RESOURCE: gpus.to_string()},
                        },
                    }],
                },
            },
        },
    }))
    .context("building a Deployment")
}

/// A PodDisruptionBudget `name` over `app=<app>` with an integer `minAvailable`.
pub fn min_available_pdb(name: &str, app: &str, min_available: i32) -> Result<PodDisruptionBudget> {
    serde_json::from_value(json!({
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name},
        "spec": {"minAvailable": min_available, "selector": {"matchLabels": {"app": app}}},
    }))
    .context("building a PodDisruptionBudget")
}

/// Whether the pod is Running, Ready and not being deleted.
pub fn pod_ready(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod.status.as_ref().is_some_and(|s| {
            s.phase.as_deref() == Some("Running")
                && s.conditions
                    .as_ref()
                    .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
}

/// Pods in `ns` matching `selector`.
pub async fn pods(client: &Client, ns: &str, selector: &str) -> Result<Vec<Pod>> {
    Ok(Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(selector))
        .await
        .with_context(|| format!("listing pods {selector} in {ns}"))?
        .items)
}

/// Waits until exactly `n` pods match `selector` in `ns`, all Ready; returns them.
pub async fn wait_ready_pods(
    client: &Client,
    ns: &str,
    selector: &str,
    n: usize,
    timeout: Duration,
) -> Result<Vec<Pod>> {
    wait_for(
        &format!("{n} ready pods {selector} in {ns}"),
        timeout,
        || async {
            let pods = pods(client, ns, selector).await?;
            let live: Vec<&Pod> = pods
                .iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .collect();
            Ok((live.len() == n && live.iter().all(|p| pod_ready(p)))
                .then(|| live.into_iter().cloned().collect()))
        },
    )
    .await
}

/// Cordons (`true`) or uncordons a node (`spec.unschedulable`).
pub async fn set_unschedulable(client: &Client, node: &str, unschedulable: bool) {
    Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
        .patch(
            node,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"unschedulable": unschedulable}})),
        )
        .await
        .unwrap();
}
