//! The cluster of one contender: a fresh control plane holding the start layout exactly.
use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use gpu_defrag_e2e::{
    ClusterOptions, GPU_RESOURCE, GpuNodes, TestCluster,
    fixtures::{create_all, pod_ready, wait_for},
};
use k8s_openapi::api::{
    apps::v1::{Deployment, ReplicaSet},
    core::v1::{Namespace, Node, Pod},
    policy::v1::PodDisruptionBudget,
};
use kube::{
    Api,
    api::{ListParams, PostParams},
};
use serde_json::{Value, json};

use crate::args::Args;
use crate::layout::{Layout, PodShape};
use crate::{NS, ROLE};

/// `pod-template-hash` of the start pods and their ReplicaSets (the Deployment adopts a
/// ReplicaSet whose template equals its own, whatever the hash).
const TEMPLATE_HASH: &str = "start";

fn pod_template(app: &str, role: &str, s: &PodShape, scheduler: &str) -> Value {
    json!({
        "metadata": {"labels": {"app": app, ROLE: role}},
        "spec": {
            "schedulerName": scheduler,
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "main",
                "image": gpu_defrag_e2e::fixtures::FAKE_IMAGE,
                "resources": {
                    "requests": {"cpu": format!("{}m", s.cpu_milli), "memory": format!("{}Mi", s.memory_mib)},
                    "limits": {GPU_RESOURCE: s.gpus.to_string()},
                },
            }],
        },
    })
}

fn deployment(
    app: &str,
    role: &str,
    s: &PodShape,
    replicas: i32,
    scheduler: &str,
) -> Result<Deployment> {
    serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": app, "labels": {"app": app, ROLE: role}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": app}},
            "template": pod_template(app, role, s, scheduler),
        },
    }))
    .context("building a Deployment")
}

/// Starts a fresh control plane and builds `layout` on it, exactly.
pub(crate) async fn build_cluster(args: &Args, layout: &Layout) -> Result<TestCluster> {
    let t0 = Instant::now();
    let cluster = TestCluster::start(ClusterOptions {
        nodes: 0,
        ..ClusterOptions::default()
    })
    .await?;
    let client = cluster.client()?;
    create_nodes(&cluster, &client, layout).await?;
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": NS}}))?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .context("creating the namespace")?;
    let sched = &args.scheduler_name;
    create_pdbs(&client, layout).await?;
    // 1. The pods, bound to the layout's nodes, labelled as their ReplicaSet's pods.
    create_bound_pods(&client, layout, sched).await?;
    // 2. A ReplicaSet per pod (1 replica, the pod's labels): it adopts the pod.
    create_replica_sets(&client, layout, sched).await?;
    // 3. The Deployments (same template): each adopts its ReplicaSet as its current one.
    create_deployments(&client, layout, sched).await?;
    check_layout(&client, layout).await?;
    // The queue: pending multi-GPU Deployments (no PDB), through the real scheduler.
    create_queue(&client, layout, sched).await?;
    // The queue waits a little before any contender starts: creation timestamps have whole
    // seconds, and gpu-defrag's maxPendingGpuPods guard counts pods created in the second its
    // run started as created by the run (a queue made under a second before a run stops it).
    tokio::time::sleep(Duration::from_secs(2)).await;
    eprintln!(
        "  start state built in {:.0}s (control plane {:.0}s)",
        t0.elapsed().as_secs_f64(),
        cluster.started_in().as_secs_f64()
    );
    Ok(cluster)
}

/// The selector of the layout's running pods and their objects.
fn workload_selector() -> String {
    format!("{ROLE}=workload")
}

/// Whether a pod has an owner.
fn owned(p: &Pod) -> bool {
    p.metadata
        .owner_references
        .as_ref()
        .is_some_and(|o| !o.is_empty())
}

/// The layout's nodes, created and Ready.
async fn create_nodes(cluster: &TestCluster, client: &kube::Client, layout: &Layout) -> Result<()> {
    let mut nodes = Vec::new();
    for n in &layout.nodes {
        let mut spec = GpuNodes::new(1, n.gpus).model(n.model.clone());
        spec.cpu = format!("{}m", n.cpu_milli);
        spec.memory = format!("{}Mi", n.memory_mib);
        nodes.push(spec.node(&n.name)?);
    }
    let names: Vec<String> = layout.nodes.iter().map(|n| n.name.clone()).collect();
    create_all(&Api::<Node>::all(client.clone()), nodes, 16).await?;
    cluster
        .wait_nodes_ready(&names, Duration::from_secs(120))
        .await
}

/// A PDB (maxUnavailable 1) per running pod of the layout.
async fn create_pdbs(client: &kube::Client, layout: &Layout) -> Result<()> {
    let pdbs = layout
        .running
        .iter()
        .map(|p| {
            serde_json::from_value::<PodDisruptionBudget>(json!({
                "metadata": {"name": p.app},
                "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": p.app}}},
            }))
            .context("building a PDB")
        })
        .collect::<Result<Vec<_>>>()?;
    create_all(&Api::namespaced(client.clone(), NS), pdbs, 16).await
}

/// The running pods, bound to the layout's nodes and labelled as their ReplicaSet's
/// pods; waits until they are Ready (and a little more, for the controller manager's
/// pod informer to see every pod before their owners exist).
async fn create_bound_pods(client: &kube::Client, layout: &Layout, sched: &str) -> Result<()> {
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), NS);
    let mut pods = Vec::new();
    for p in &layout.running {
        let mut t = pod_template(&p.app, "workload", &p.shape, sched);
        t["metadata"]["name"] = json!(format!("{}-{TEMPLATE_HASH}-s0", p.app));
        t["metadata"]["labels"]["pod-template-hash"] = json!(TEMPLATE_HASH);
        t["spec"]["nodeName"] = json!(layout.nodes[p.node].name);
        pods.push(serde_json::from_value::<Pod>(t).context("building a Pod")?);
    }
    create_all(&pods_api, pods, 16).await?;
    let want = layout.running.len();
    gpu_defrag_e2e::fixtures::wait_ready_pods(
        client,
        NS,
        &workload_selector(),
        want,
        Duration::from_secs(300),
    )
    .await?;
    // Let the controller manager's pod informer see every pod before their owners exist.
    tokio::time::sleep(Duration::from_secs(2)).await;
    Ok(())
}

/// A ReplicaSet per running pod (1 replica, the pod's labels); waits until each has
/// adopted its pod.
async fn create_replica_sets(client: &kube::Client, layout: &Layout, sched: &str) -> Result<()> {
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), NS);
    let rss: Api<ReplicaSet> = Api::namespaced(client.clone(), NS);
    let sel = workload_selector();
    let want = layout.running.len();
    let objects = layout
        .running
        .iter()
        .map(|p| {
            let mut t = pod_template(&p.app, "workload", &p.shape, sched);
            t["metadata"]["labels"]["pod-template-hash"] = json!(TEMPLATE_HASH);
            serde_json::from_value::<ReplicaSet>(json!({
                "metadata": {"name": format!("{}-{TEMPLATE_HASH}", p.app),
                             "labels": {"app": p.app, ROLE: "workload", "pod-template-hash": TEMPLATE_HASH}},
                "spec": {
                    "replicas": 1,
                    "selector": {"matchLabels": {"app": p.app, "pod-template-hash": TEMPLATE_HASH}},
                    "template": t,
                },
            }))
            .context("building a ReplicaSet")
        })
        .collect::<Result<Vec<_>>>()?;
    create_all(&rss, objects, 16).await?;
    wait_for(
        "the ReplicaSets to adopt the bound pods",
        Duration::from_secs(180),
        || async {
            let pods = pods_api
                .list(&ListParams::default().labels(&sel))
                .await?
                .items;
            Ok((pods.len() == want && pods.iter().all(owned)).then_some(()))
        },
    )
    .await
}

/// A Deployment per running pod (its template); waits until every Deployment owns its
/// ReplicaSet and is ready, and every PDB allows one disruption.
async fn create_deployments(client: &kube::Client, layout: &Layout, sched: &str) -> Result<()> {
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), NS);
    let deps: Api<Deployment> = Api::namespaced(client.clone(), NS);
    let rss: Api<ReplicaSet> = Api::namespaced(client.clone(), NS);
    let pdb_api: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), NS);
    let sel = workload_selector();
    let want = layout.running.len();
    let objects = layout
        .running
        .iter()
        .map(|p| deployment(&p.app, "workload", &p.shape, 1, sched))
        .collect::<Result<Vec<_>>>()?;
    create_all(&deps, objects, 16).await?;
    wait_for(
        "every Deployment owning its ReplicaSet and ready, every PDB allowing one disruption",
        Duration::from_secs(180),
        || async {
            let pods = pods_api
                .list(&ListParams::default().labels(&sel))
                .await?
                .items;
            let adopted = pods.len() == want && pods.iter().all(|p| owned(p) && pod_ready(p));
            if !adopted {
                return Ok(None);
            }
            let ready = deps
                .list(&ListParams::default().labels(&sel))
                .await?
                .items
                .iter()
                .filter(|d| d.status.as_ref().and_then(|s| s.ready_replicas) == Some(1))
                .count();
            let pdbs = pdb_api
                .list(&ListParams::default())
                .await?
                .items
                .iter()
                .filter(|p| {
                    p.status.as_ref().is_some_and(|s| {
                        s.disruptions_allowed == Some(1)
                            && s.observed_generation == p.metadata.generation
                    })
                })
                .count();
            let rs = rss.list(&ListParams::default()).await?.items;
            let owned = rs.len() == want
                && rs.iter().all(|r| {
                    r.metadata
                        .owner_references
                        .as_ref()
                        .is_some_and(|o| o.iter().any(|o| o.kind == "Deployment"))
                });
            Ok((ready == want && pdbs == want && owned).then_some(()))
        },
    )
    .await
}

/// The layout holds exactly: every pod on the node the layout says.
async fn check_layout(client: &kube::Client, layout: &Layout) -> Result<()> {
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), NS);
    let on: BTreeMap<String, String> = pods_api
        .list(&ListParams::default().labels(&workload_selector()))
        .await?
        .items
        .iter()
        .filter_map(|p| Some((app_of(p).to_string(), p.spec.as_ref()?.node_name.clone()?)))
        .collect();
    for p in &layout.running {
        if on.get(&p.app) != Some(&layout.nodes[p.node].name) {
            bail!(
                "{} is not on {} as the layout says",
                p.app,
                layout.nodes[p.node].name
            );
        }
    }
    Ok(())
}

/// The queue: a Deployment per pending pod of the layout (no PDB), through the real
/// scheduler; waits until every pending pod is found unschedulable (and fails if one is
/// scheduled).
async fn create_queue(client: &kube::Client, layout: &Layout, sched: &str) -> Result<()> {
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), NS);
    let deps: Api<Deployment> = Api::namespaced(client.clone(), NS);
    let objects = layout
        .pending
        .iter()
        .map(|(app, s)| deployment(app, "pending", s, 1, sched))
        .collect::<Result<Vec<_>>>()?;
    create_all(&deps, objects, 8).await?;
    let n_pending = layout.pending.len();
    wait_for(
        "the pending pods to be found unschedulable",
        Duration::from_secs(120),
        || async {
            let pods = pods_api
                .list(&ListParams::default().labels(&format!("{ROLE}=pending")))
                .await?
                .items;
            let unsched = pods.iter().filter(|p| unschedulable(p)).count();
            if pods
                .iter()
                .any(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some())
            {
                bail!("a pending pod was scheduled: the layout is not what the cluster holds");
            }
            Ok((unsched == n_pending).then_some(()))
        },
    )
    .await
}

/// Whether the scheduler found the pod unschedulable (`PodScheduled` False,
/// `Unschedulable`).
fn unschedulable(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter().any(|c| {
                c.type_ == "PodScheduled"
                    && c.status == "False"
                    && c.reason.as_deref() == Some("Unschedulable")
            })
        })
}

pub(crate) fn app_of(p: &Pod) -> &str {
    p.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("app"))
        .map(String::as_str)
        .unwrap_or("")
}

pub(crate) fn role_of(p: &Pod) -> &str {
    p.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(ROLE))
        .map(String::as_str)
        .unwrap_or("")
}
