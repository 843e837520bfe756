//! The install path on a real control plane, as the guide writes it (docs/install.md,
//! docs/scheduler.md): `kubectl apply -k config/default`, `kubectl apply -k
//! config/scheduler`, then the operator and the `gpu-binpack` scheduler run the way their
//! Deployments run them — each with its own service account's token and in-cluster
//! configuration only (see [`gpu_defrag_e2e::inpod`]), the command line and environment of
//! its Deployment, its probes answering.
//!
//! KWOK runs no containers, so the two processes stand in for the Deployments' containers;
//! the Deployments themselves are applied for real, and their ReplicaSets must create
//! their pods in the `restricted` Pod Security namespace (the API server refuses a pod
//! that breaks the standard, and this test checks that it would).
//!
//! This binary starts its own control plane without the harness's `gpu-binpack`
//! scheduler: the installed one is the only scheduler of that name.

use std::{path::Path, time::Duration};

use anyhow::{Context, Result, anyhow, bail};
use gpu_defrag_e2e::{
    ClusterOptions, TestCluster,
    cluster::insecure_get,
    fixtures::{GPU_SCHEDULER, gpu_deployment, wait_for},
    inpod::{InPod, ServiceAccount},
    operator::{condition_parts, int_at, operator_binary, pod_node, policy_status},
    process::free_port,
    repo_root,
};
use k8s_openapi::api::{
    apps::v1::Deployment,
    coordination::v1::Lease,
    core::v1::{ConfigMap, Pod},
};
use kube::{
    Api, Client,
    api::{ListParams, PostParams},
};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(90);
const NS: &str = "gpu-defrag-system";
const NODES: usize = 4;

/// `kubectl kustomize DIR`, as objects.
fn kustomize(cluster: &TestCluster, dir: &str) -> Result<Vec<Value>> {
    let out = cluster
        .kubectl()
        .args(["kustomize"])
        .arg(repo_root().join(dir))
        .output()
        .context("running kubectl kustomize")?;
    if !out.status.success() {
        bail!(
            "kubectl kustomize {dir}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text = String::from_utf8(out.stdout)?;
    text.split("\n---\n")
        .filter(|d| !d.trim().is_empty())
        .map(|d| serde_norway::from_str(d).with_context(|| format!("a document of {dir}")))
        .collect()
}

/// `kubectl apply --server-side -k DIR`; fails on any refused object.
fn apply(cluster: &TestCluster, dir: &str) -> Result<()> {
    let out = cluster
        .kubectl()
        .args([
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=gpu-defrag-e2e-install",
            "-k",
        ])
        .arg(repo_root().join(dir))
        .output()
        .context("running kubectl apply")?;
    if !out.status.success() {
        bail!(
            "kubectl apply -k {dir}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

fn find<'a>(objs: &'a [Value], kind: &str, name: &str) -> Result<&'a Value> {
    objs.iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .ok_or_else(|| anyhow!("no {kind} {name}"))
}

/// The one container of a Deployment.
fn container(d: &Value) -> Result<&Value> {
    let cs = d["spec"]["template"]["spec"]["containers"]
        .as_array()
        .ok_or_else(|| anyhow!("a Deployment without containers"))?;
    match cs.as_slice() {
        [c] => Ok(c),
        _ => bail!("expected one container, found {}", cs.len()),
    }
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Waits until the Deployment's ReplicaSet has created all its pods: the API server
/// admitted the pod template in its namespace (Pod Security included).
async fn wait_pods_created(client: &Client, name: &str) -> Result<()> {
    let api: Api<Deployment> = Api::namespaced(client.clone(), NS);
    wait_for(&format!("Deployment {name} to create its pods"), T, || {
        let api = api.clone();
        async move {
            let d = api.get(name).await?;
            let want = d.spec.replicas.unwrap_or(1);
            let have = d.status.as_ref().and_then(|s| s.replicas).unwrap_or(0);
            Ok((want > 0 && have == want).then_some(()))
        }
    })
    .await
}

/// Waits until Lease `NS/name` is held by `holder` (or by anyone when `None`); returns it.
async fn wait_lease(client: &Client, name: &str, holder: Option<&str>) -> Result<String> {
    let api: Api<Lease> = Api::namespaced(client.clone(), NS);
    wait_for(&format!("Lease {NS}/{name} to be held"), T, || {
        let api = api.clone();
        async move {
            let l = api.get_opt(name).await?;
            let h = l
                .and_then(|l| l.spec)
                .and_then(|s| s.holder_identity)
                .filter(|h| !h.is_empty());
            Ok(h.filter(|h| holder.is_none_or(|want| h == want)))
        }
    })
    .await
}

async fn http_status(addr: &str, path: &str) -> Result<u16> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).await?;
    buf.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| anyhow!("no HTTP status in {buf:?}"))
}

/// The node each pod of `app` in `ns` is bound to, once all `n` are bound.
async fn placements(client: &Client, ns: &str, app: &str, n: usize) -> Result<Vec<String>> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    wait_for(&format!("{n} pods of {app} to be bound"), T, || {
        let api = api.clone();
        async move {
            let pods = api
                .list(&ListParams::default().labels(&format!("app={app}")))
                .await?;
            let nodes: Vec<String> = pods
                .items
                .iter()
                .filter_map(|p| pod_node(p).map(str::to_string))
                .collect();
            Ok((nodes.len() == n).then_some(nodes))
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn the_install_path_runs_as_written() {
    let cluster = TestCluster::start(ClusterOptions {
        binpack_scheduler: None,
        nodes: NODES,
        ..Default::default()
    })
    .await
    .expect("control plane");
    let client = cluster.client().unwrap();
    assert!(
        InPod::supported(),
        "this test runs processes in a private mount namespace (unshare --mount \
         --map-root-user): user namespaces must be allowed"
    );

    // ---- 1. config/default: every object accepted, the Deployment's pods admitted.
    let default = kustomize(&cluster, "config/default").unwrap();
    apply(&cluster, "config/default").unwrap();
    let operator = find(&default, "Deployment", "gpu-defrag").unwrap();
    assert_eq!(operator["metadata"]["namespace"], NS);
    wait_pods_created(&client, "gpu-defrag").await.unwrap();
    // The namespace enforces the restricted level, and would refuse a pod that breaks it:
    // the admission above is a real check.
    let mut loose: Pod = serde_json::from_value(json!({
        "metadata": {"name": "loose", "namespace": NS},
        "spec": {"containers": [{"name": "c", "image": "registry.invalid/x:1"}]},
    }))
    .unwrap();
    let refused = Api::<Pod>::namespaced(client.clone(), NS)
        .create(
            &PostParams {
                dry_run: true,
                ..Default::default()
            },
            &loose,
        )
        .await;
    match refused {
        Err(kube::Error::Api(e)) if e.code == 403 && e.message.contains("PodSecurity") => {}
        other => panic!("a pod breaking the restricted level was not refused: {other:?}"),
    }
    // The same pod with the operator's security contexts is admitted.
    loose.spec.as_mut().unwrap().security_context =
        serde_json::from_value(operator["spec"]["template"]["spec"]["securityContext"].clone())
            .unwrap();
    loose.spec.as_mut().unwrap().containers[0].security_context =
        serde_json::from_value(container(operator).unwrap()["securityContext"].clone()).unwrap();
    Api::<Pod>::namespaced(client.clone(), NS)
        .create(
            &PostParams {
                dry_run: true,
                ..Default::default()
            },
            &loose,
        )
        .await
        .expect("the operator's security contexts meet the restricted level");

    // ---- 2. The operator, as its Deployment runs it.
    let c = container(operator).unwrap();
    let metrics = format!("127.0.0.1:{}", free_port().unwrap());
    let mut args = strings(&c["args"]);
    let at = args
        .iter()
        .position(|a| a == "--metrics-addr")
        .expect("the Deployment passes --metrics-addr");
    let container_port = c["ports"][0]["containerPort"].as_i64().unwrap();
    assert!(
        args[at + 1].ends_with(&format!(":{container_port}")),
        "the metrics address {} is not the container port {container_port} the probes use",
        args[at + 1]
    );
    args[at + 1] = metrics.clone();
    assert!(
        args.iter().any(|a| a == "--leader-elect"),
        "the Deployment's replicas must elect a leader: {args:?}"
    );
    let env: Vec<(String, String)> = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let name = e["name"].as_str().unwrap().to_string();
            let value = match e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                Some("metadata.name") => "gpu-defrag-5d9c7b-x2x7q".to_string(),
                Some("metadata.namespace") => NS.to_string(),
                Some(other) => panic!("an unexpected fieldRef {other}"),
                None => e["value"].as_str().unwrap_or_default().to_string(),
            };
            (name, value)
        })
        .collect();
    let env_refs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let sa = operator["spec"]["template"]["spec"]["serviceAccountName"]
        .as_str()
        .unwrap();
    let mut op = InPod::start(
        &cluster,
        "gpu-defrag-in-pod",
        &ServiceAccount {
            namespace: NS,
            name: sa,
        },
        &operator_binary().await.unwrap(),
        &args,
        &env_refs,
    )
    .unwrap();

    // Its probes answer where the Deployment points them.
    for probe in ["livenessProbe", "readinessProbe"] {
        let path = c[probe]["httpGet"]["path"].as_str().unwrap();
        assert_eq!(
            c[probe]["httpGet"]["port"], c["ports"][0]["name"],
            "{probe}"
        );
        let path = path.to_string();
        let metrics = metrics.clone();
        wait_for(&format!("{probe} {path} to answer 200"), T, || {
            let (metrics, path) = (metrics.clone(), path.clone());
            async move { Ok((http_status(&metrics, &path).await? == 200).then_some(())) }
        })
        .await
        .unwrap_or_else(|e| panic!("{e:#}; log: {}", tail(&op.component.log)));
    }
    // It is the leader under its service account (the Lease of config/rbac).
    wait_lease(
        &client,
        "gpu-defrag-leader",
        Some("gpu-defrag-5d9c7b-x2x7q"),
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#}; log: {}", tail(&op.component.log)));
    // The first policy of the guide: measured and planned with the service account's
    // permissions only.
    apply(&cluster, "config/samples").unwrap();
    let status = wait_for("the sample policy's status", T, || {
        let client = client.clone();
        async move {
            let s = policy_status(&client, "dryrun").await?;
            Ok((int_at(&s, "/fragmentation/nodes").is_some()
                && condition_parts(&s, "Ready").is_some())
            .then_some(s))
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}; log: {}", tail(&op.component.log)));
    assert_eq!(
        condition_parts(&status, "Ready").map(|c| c.0),
        Some("True".to_string()),
        "{status:#}"
    );
    assert_eq!(
        int_at(&status, "/fragmentation/nodes"),
        Some(NODES as i64),
        "{status:#}"
    );
    assert_eq!(
        int_at(&status, "/fragmentation/gpus"),
        Some(8 * NODES as i64),
        "{status:#}"
    );
    op.ensure_running().unwrap();

    // ---- 3. config/scheduler: the gpu-binpack scheduler, as its Deployment runs it.
    let sched = kustomize(&cluster, "config/scheduler").unwrap();
    apply(&cluster, "config/scheduler").unwrap();
    wait_pods_created(&client, "gpu-binpack").await.unwrap();
    let deployment = find(&sched, "Deployment", "gpu-binpack").unwrap();
    let c = container(deployment).unwrap();
    let volume = &deployment["spec"]["template"]["spec"]["volumes"][0];
    let mount = c["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == volume["name"])
        .expect("the config volume is mounted");
    let config_map = volume["configMap"]["name"].as_str().unwrap();
    let cm = Api::<ConfigMap>::namespaced(client.clone(), NS)
        .get(config_map)
        .await
        .expect("the Deployment's ConfigMap exists (kustomize's hashed name)");
    let data = cm.data.unwrap_or_default();
    let mut command = strings(&c["command"]);
    let config_flag = command
        .iter()
        .position(|a| a.starts_with("--config="))
        .expect("kube-scheduler --config=");
    let in_pod_path = command[config_flag]
        .trim_start_matches("--config=")
        .to_string();
    let file = Path::new(&in_pod_path)
        .strip_prefix(mount["mountPath"].as_str().unwrap())
        .expect("--config points into the mounted ConfigMap");
    let text = data
        .get(file.to_str().unwrap())
        .unwrap_or_else(|| panic!("the ConfigMap has no {}", file.display()));
    let local = cluster.work_dir().join("gpu-binpack-installed.yaml");
    std::fs::write(&local, text).unwrap();
    command[config_flag] = format!("--config={}", local.display());
    let bin = cluster.bin_dir().join(
        Path::new(&command[0])
            .file_name()
            .expect("the command names kube-scheduler"),
    );
    let port = free_port().unwrap();
    let mut args: Vec<String> = command[1..].to_vec();
    // Loopback only, on a free port (in its pod it serves 0.0.0.0:10259).
    args.extend([
        "--bind-address=127.0.0.1".to_string(),
        format!("--secure-port={port}"),
    ]);
    let sa = deployment["spec"]["template"]["spec"]["serviceAccountName"]
        .as_str()
        .unwrap();
    let mut scheduler = InPod::start(
        &cluster,
        "gpu-binpack-in-pod",
        &ServiceAccount {
            namespace: NS,
            name: sa,
        },
        &bin,
        &args,
        &[],
    )
    .unwrap();
    for probe in ["livenessProbe", "readinessProbe"] {
        let path = c[probe]["httpGet"]["path"].as_str().unwrap().to_string();
        wait_for(&format!("the scheduler's {probe} {path}"), T, || {
            let path = path.clone();
            async move {
                Ok(insecure_get(port, &path)
                    .await
                    .ok()
                    .filter(|b| b.trim() == "ok"))
            }
        })
        .await
        .unwrap_or_else(|e| panic!("{e:#}; log: {}", tail(&scheduler.component.log)));
    }
    // Its own Lease, in the operator's namespace; never the default scheduler's.
    wait_lease(&client, "gpu-binpack", None)
        .await
        .unwrap_or_else(|e| panic!("{e:#}; log: {}", tail(&scheduler.component.log)));
    assert!(
        Api::<Lease>::namespaced(client.clone(), "kube-system")
            .get_opt("kube-scheduler")
            .await
            .unwrap()
            .is_none(),
        "gpu-binpack took the default scheduler's Lease"
    );
    // It bin-packs the pods that opt in: two 4-GPU pods share a node. The stock default
    // scheduler spreads the same pods over two nodes.
    let ns = cluster.namespace("install").await.unwrap();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns.name());
    let packed = gpu_deployment("packed", 2, 4).unwrap();
    assert_eq!(
        packed
            .spec
            .template
            .spec
            .as_ref()
            .unwrap()
            .scheduler_name
            .as_deref(),
        Some(GPU_SCHEDULER)
    );
    deployments
        .create(&PostParams::default(), &packed)
        .await
        .unwrap();
    let nodes = placements(&client, ns.name(), "packed", 2)
        .await
        .unwrap_or_else(|e| panic!("{e:#}; log: {}", tail(&scheduler.component.log)));
    assert_eq!(nodes[0], nodes[1], "gpu-binpack spread the pods: {nodes:?}");
    let mut spread = gpu_deployment("spread", 2, 4).unwrap();
    spread.spec.template.spec.as_mut().unwrap().scheduler_name = None;
    deployments
        .create(&PostParams::default(), &spread)
        .await
        .unwrap();
    let nodes = placements(&client, ns.name(), "spread", 2).await.unwrap();
    assert_ne!(
        nodes[0], nodes[1],
        "the default scheduler packed the pods: {nodes:?}"
    );

    scheduler.ensure_running().unwrap();
    op.ensure_running().unwrap();
    scheduler.stop();
    op.stop();
}

fn tail(log: &Path) -> String {
    gpu_defrag_e2e::process::log_tail(log, 40)
}
