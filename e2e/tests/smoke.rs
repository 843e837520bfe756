//! Smoke tests of the local control plane: the properties gpu-defrag relies on, checked
//! against real components. One stack for this binary, one namespace per test.

use std::{path::Path, time::Duration};

use gpu_defrag_e2e::{
    GPU_RESOURCE, GpuNodes, TestCluster,
    fixtures::{gpu_deployment, min_available_pdb, pods, wait_for, wait_ready_pods},
    node_usable, repo_root, shared,
};
use k8s_openapi::{
    api::{apps::v1::Deployment, core::v1::Node, core::v1::Pod, policy::v1::PodDisruptionBudget},
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{
    Api, Client,
    api::{
        ApiResource, DeleteParams, DynamicObject, EvictParams, GroupVersionKind, ListParams, Patch,
        PatchParams, PostParams,
    },
};
use serde_json::json;

const T: Duration = Duration::from_secs(60);

async fn cluster() -> &'static TestCluster {
    shared().await.expect("local control plane")
}

fn api_code(err: &kube::Error) -> Option<u16> {
    match err {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

#[tokio::test]
async fn nodes_are_ready_with_gpus_allocatable() {
    let cluster = cluster().await;
    let nodes = Api::<Node>::all(cluster.client().unwrap())
        .list(&ListParams::default().labels("type=kwok"))
        .await
        .unwrap()
        .items;
    let default: Vec<&Node> = nodes
        .iter()
        .filter(|n| {
            n.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with("gpu-node-"))
        })
        .collect();
    assert!(
        default.len() >= 8,
        "expected the 8 default nodes, got {}",
        default.len()
    );
    for node in default {
        assert!(
            node_usable(node),
            "node not Ready/usable: {:?}",
            node.metadata.name
        );
        let gpus = &node.status.as_ref().unwrap().allocatable.as_ref().unwrap()[GPU_RESOURCE];
        assert_eq!(gpus.0, "8");
    }
}

/// MostAllocated must put the second pod next to the first, on an otherwise empty pool.
/// The pool is tainted so that other tests' pods stay off it; several rounds rule out luck
/// (with 8 empty nodes, spreading would pick the same node 1 time in 8).
#[tokio::test]
async fn deployment_pods_bin_pack_onto_one_node() {
    let cluster = cluster().await;
    let ns = cluster.namespace("binpack").await.unwrap();
    let client = cluster.client().unwrap();
    let pool = ns.name().to_string();
    let nodes = cluster
        .add_nodes(
            &GpuNodes::new(8, 8)
                .name_prefix(format!("{pool}-node"))
                .label("e2e.gpu-defrag.io/pool", &pool)
                .taint("e2e.gpu-defrag.io/pool", &pool, "NoSchedule"),
        )
        .await
        .unwrap();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns.name());
    for round in 0..5 {
        let name = format!("pair-{round}");
        let mut d = gpu_deployment(&name, 2, 1).unwrap();
        let spec = d.spec.template.spec.as_mut().unwrap();
        spec.node_selector = Some([("e2e.gpu-defrag.io/pool".to_string(), pool.clone())].into());
        spec.tolerations = Some(vec![serde_json::from_value(json!({
            "key": "e2e.gpu-defrag.io/pool", "operator": "Equal", "value": pool, "effect": "NoSchedule"
        }))
        .unwrap()]);
        deployments
            .create(&PostParams::default(), &d)
            .await
            .unwrap();
        let running = wait_ready_pods(&client, ns.name(), &format!("app={name}"), 2, T)
            .await
            .unwrap();
        let placed: Vec<&str> = running
            .iter()
            .map(|p| p.spec.as_ref().unwrap().node_name.as_deref().unwrap())
            .collect();
        assert_eq!(
            placed[0], placed[1],
            "round {round}: pods spread over {placed:?}"
        );
        assert!(nodes.iter().any(|n| n == placed[0]));
        deployments
            .delete(&name, &DeleteParams::foreground())
            .await
            .unwrap();
        wait_for("the pool to be empty", T, || async {
            Ok(pods(&client, ns.name(), &format!("app={name}"))
                .await?
                .is_empty()
                .then_some(()))
        })
        .await
        .unwrap();
    }
    let node_api: Api<Node> = Api::all(client);
    for n in &nodes {
        node_api.delete(n, &DeleteParams::default()).await.unwrap();
    }
}

async fn wait_pdb(api: &Api<PodDisruptionBudget>, name: &str, healthy: i32, allowed: i32) {
    wait_for(
        &format!("PDB {name}: {healthy} healthy, {allowed} allowed"),
        T,
        || async {
            let pdb = api.get(name).await?;
            let generation = pdb.metadata.generation;
            Ok(pdb.status.filter(|s| {
                s.observed_generation == generation
                    && s.current_healthy == Some(healthy)
                    && s.disruptions_allowed == Some(allowed)
            }))
        },
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn eviction_respects_a_saturated_pdb() {
    let cluster = cluster().await;
    let ns = cluster.namespace("pdb").await.unwrap();
    let client = cluster.client().unwrap();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns.name());
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), ns.name());
    let pod_api: Api<Pod> = Api::namespaced(client.clone(), ns.name());
    deployments
        .create(
            &PostParams::default(),
            &gpu_deployment("web", 2, 1).unwrap(),
        )
        .await
        .unwrap();
    pdbs.create(
        &PostParams::default(),
        &min_available_pdb("web", "web", 2).unwrap(),
    )
    .await
    .unwrap();
    let running = wait_ready_pods(&client, ns.name(), "app=web", 2, T)
        .await
        .unwrap();
    wait_pdb(&pdbs, "web", 2, 0).await;

    let victim = running[0].metadata.name.clone().unwrap();
    let err = pod_api
        .evict(&victim, &EvictParams::default())
        .await
        .unwrap_err();
    assert_eq!(api_code(&err), Some(429), "expected 429, got {err:?}");

    // Room for one disruption: a third replica.
    deployments
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 3}})),
        )
        .await
        .unwrap();
    wait_ready_pods(&client, ns.name(), "app=web", 3, T)
        .await
        .unwrap();
    wait_pdb(&pdbs, "web", 3, 1).await;
    pod_api
        .evict(&victim, &EvictParams::default())
        .await
        .unwrap();
    // The budget is spent until the ReplicaSet replaces the pod.
    wait_ready_pods(&client, ns.name(), "app=web", 3, T)
        .await
        .unwrap();
    let names: Vec<String> = pods(&client, ns.name(), "app=web")
        .await
        .unwrap()
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    assert!(!names.contains(&victim), "{victim} still exists: {names:?}");
}

#[tokio::test]
async fn evicted_deployment_pod_is_recreated_and_ready() {
    let cluster = cluster().await;
    let ns = cluster.namespace("recreate").await.unwrap();
    let client = cluster.client().unwrap();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns.name());
    deployments
        .create(
            &PostParams::default(),
            &gpu_deployment("job", 1, 2).unwrap(),
        )
        .await
        .unwrap();
    let before = wait_ready_pods(&client, ns.name(), "app=job", 1, T)
        .await
        .unwrap();
    let old = before[0].metadata.uid.clone().unwrap();
    Api::<Pod>::namespaced(client.clone(), ns.name())
        .evict(
            before[0].metadata.name.as_deref().unwrap(),
            &EvictParams::default(),
        )
        .await
        .unwrap();
    let after = wait_for("a replacement pod", T, || async {
        let ready = wait_ready_pods(&client, ns.name(), "app=job", 1, Duration::from_secs(1)).await;
        Ok(ready
            .ok()
            .filter(|p| p[0].metadata.uid.as_deref() != Some(&old)))
    })
    .await
    .unwrap();
    assert!(after[0].spec.as_ref().unwrap().node_name.is_some());
}

/// A user certificate outside system:masters gets only what RBAC grants it.
#[tokio::test]
async fn restricted_user_is_bound_by_rbac() {
    let cluster = cluster().await;
    let ns = cluster.namespace("rbac").await.unwrap();
    let user = format!("viewer-{}", ns.name());
    let restricted = cluster.user_client(&user, &["e2e:viewers"]).unwrap();
    let pods_as_user: Api<Pod> = Api::namespaced(restricted, ns.name());
    let err = pods_as_user.list(&ListParams::default()).await.unwrap_err();
    assert_eq!(api_code(&err), Some(403), "{err:?}");

    let binding: k8s_openapi::api::rbac::v1::RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "view"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }))
    .unwrap();
    Api::namespaced(cluster.client().unwrap(), ns.name())
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    wait_for("RBAC to allow listing pods", T, || async {
        Ok(pods_as_user
            .list(&ListParams::default())
            .await
            .ok()
            .map(|_| ()))
    })
    .await
    .unwrap();
    let kubeconfig = cluster.user_kubeconfig(&user, &[]).unwrap();
    let out = std::process::Command::new(cluster.kubectl_path())
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args(["auth", "can-i", "list", "nodes"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "no");
}

/// The DefragPolicy CRD from crds/: where it is served and how it is scoped.
fn defragpolicy_resource(crds: &Path) -> Option<(ApiResource, bool)> {
    let text = std::fs::read_to_string(crds.join("defragpolicy.yaml")).ok()?;
    let crd: CustomResourceDefinition = serde_norway::from_str(&text).ok()?;
    let version = crd.spec.versions.iter().find(|v| v.served)?.name.clone();
    let gvk = GroupVersionKind::gvk(&crd.spec.group, &version, &crd.spec.names.kind);
    Some((
        ApiResource::from_gvk_with_plural(&gvk, &crd.spec.names.plural),
        crd.spec.scope == "Namespaced",
    ))
}

async fn create_policy(
    client: &Client,
    ar: &ApiResource,
    namespaced: bool,
    ns: &str,
    spec: serde_json::Value,
) -> kube::Error {
    let api: Api<DynamicObject> = if namespaced {
        Api::namespaced_with(client.clone(), ns, ar)
    } else {
        Api::all_with(client.clone(), ar)
    };
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": ar.api_version, "kind": ar.kind,
        "metadata": {"name": format!("invalid-{ns}")},
        "spec": spec,
    }))
    .unwrap();
    match api.create(&PostParams::default(), &obj).await {
        Ok(_) => panic!("an invalid DefragPolicy was accepted: {spec}"),
        Err(e) => e,
    }
}

#[tokio::test]
async fn kubectl_applies_crds_and_cel_rejects_invalid_policies() {
    let cluster = cluster().await;
    let ns = cluster.namespace("crd").await.unwrap();
    let crds = repo_root().join("crds");
    let out = cluster
        .kubectl()
        .args(["apply", "-f"])
        .arg(&crds)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kubectl apply -f crds/ failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let (ar, namespaced) =
        defragpolicy_resource(&crds).expect("a DefragPolicy CRD in crds/defragpolicy.yaml");
    cluster.apply_crds(&crds).await.unwrap();
    let client = cluster.client().unwrap();
    for (spec, message) in [
        (
            json!({"mode": "Enforce"}),
            "mode Enforce needs at least one maintenance window in spec.windows",
        ),
        (
            json!({"target": {"shapes": [{"gpus": 1, "weight": 0}]}}),
            "weight must be greater than 0",
        ),
    ] {
        let err = create_policy(&client, &ar, namespaced, ns.name(), spec.clone()).await;
        let kube::Error::Api(status) = &err else {
            panic!("unexpected error {err:?}")
        };
        let (code, got) = (status.code, &status.message);
        assert_eq!(code, 422, "{got}");
        assert!(
            got.contains(message),
            "{spec}: expected {message:?} in {got:?}"
        );
    }
}
