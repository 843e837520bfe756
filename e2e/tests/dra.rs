//! Dynamic Resource Allocation on the real control plane: GPUs published only in
//! ResourceSlices by a fake `gpu.nvidia.com` driver ([`gpu_defrag_e2e::fakedra`]), and
//! allocated by the real kube-scheduler (the `gpu-binpack` scheduler, which scores the
//! DRA-backed `nvidia.com/gpu` with NodeResourcesFit MostAllocated) through the claims it
//! makes for pods that keep asking for `nvidia.com/gpu`.
//!
//! - The operator's report matches the allocations the scheduler made; the DryRun plan
//!   drains whole nodes; Enforce frees them, the 8-GPU pod starts there, and every
//!   replacement gets a claim of its own. How many replacements landed where the plan
//!   said is printed (`E2E-FIGURE dra`).
//! - Pods using a named claim (one shared by two pods, one used by a single pod) are never
//!   moved.
//! - A single GPU is drained behind the run's own DeviceTaintRule, gone after the run;
//!   the template-claim pod's replacement gets a new claim (`E2E-FIGURE dra-gpu`).
//! - Partitionable devices: a GPU half used by a MIG partition the scheduler allocated is
//!   reported per profile (`E2E-FIGURE dra-mig`).

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use gpu_defrag_e2e::{
    case::Case,
    cluster::GpuNodes,
    fakedra::{self, DRIVER, dra_pool},
    fixtures::{FAKE_IMAGE, GPU_SCHEDULER, pods, wait_for},
    operator::{
        Operator, POOL_LABEL, PodWatch, allow_one_disruption, float_at, fragment, int_at,
        open_window_every_minute, operator_binary, patch_policy, pod_app, pod_node, policy_status,
        str_at, strings_at, wait_deployments_ready, wait_status,
    },
    shared,
};
use k8s_openapi::api::{
    apps::v1::Deployment,
    core::v1::{Node, Pod},
    resource::v1::{DeviceTaintRule, ResourceClaim, ResourceClaimTemplate, ResourceSlice},
};
use kube::{
    Api, Client,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(120);

async fn dra_case(prefix: &str, nodes: usize) -> Case {
    let cluster = shared().await.expect("local control plane");
    let ns = cluster.namespace(prefix).await.unwrap();
    let client = cluster.client().unwrap();
    let pool = dra_pool(cluster, ns.name(), nodes, 8).await.unwrap();
    Case {
        cluster,
        ns,
        client,
        pool,
    }
}

/// The claim that holds a pod's DRA-backed `nvidia.com/gpu` (`status.extendedResourceClaimStatus`).
fn extended_claim(p: &Pod) -> Option<String> {
    p.status
        .as_ref()?
        .extended_resource_claim_status
        .as_ref()
        .map(|s| s.resource_claim_name.clone())
}

/// Devices the scheduler allocated from `gpu.nvidia.com`, per pool (= node), over every
/// claim of `ns`.
async fn allocated(client: &Client, ns: &str) -> BTreeMap<String, BTreeSet<String>> {
    let claims = Api::<ResourceClaim>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap();
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for c in &claims.items {
        let results = c
            .status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .and_then(|a| a.devices.as_ref())
            .and_then(|d| d.results.clone())
            .unwrap_or_default();
        for r in results.iter().filter(|r| r.driver == DRIVER) {
            out.entry(r.pool.clone())
                .or_default()
                .insert(r.device.clone());
        }
    }
    out
}

#[tokio::test]
async fn dra_backed_gpus_are_measured_planned_and_freed() {
    let c = dra_case("dra", 4).await;
    // 32 one-GPU pods through the DRA-backed nvidia.com/gpu, packed, then half removed:
    // 4 busy GPUs per node, no node with 8 free.
    let infer = fragment(&c.client, c.name(), &c.pool, &[4, 4, 4, 4])
        .await
        .unwrap();
    let running = pods(&c.client, c.name(), "e2e-role=infer").await.unwrap();
    for p in &running {
        assert!(
            extended_claim(p).is_some(),
            "{} has no claim for its nvidia.com/gpu: {:?}",
            p.metadata.name.as_deref().unwrap_or(""),
            p.status
        );
    }
    let held = allocated(&c.client, c.name()).await;
    assert_eq!(
        held.values().map(BTreeSet::len).sum::<usize>(),
        16,
        "{held:?}"
    );
    c.pending_training_job().await;
    c.dry_run_policy(
        json!([{"gpus": 8, "weight": 1}, {"gpus": 1, "weight": 1}]),
        json!({"maxEvictionsPerRun": 8, "maxEvictionsPerNode": 8,
               "maxEvictionsPerNamespace": 20, "maxInFlight": 2}),
    )
    .await;
    let _op = Operator::start(c.cluster, c.name(), &[]).await.unwrap();
    let st = wait_status(&c.client, c.name(), "a dry-run plan", T, |s| {
        int_at(s, "/plan/totalMoves").unwrap_or(0) > 0
    })
    .await
    .unwrap();

    // The report reads the GPUs from the slices and their use from the claims.
    assert_eq!(int_at(&st, "/fragmentation/nodes"), Some(4), "{st:#}");
    assert_eq!(int_at(&st, "/fragmentation/gpus"), Some(32), "{st:#}");
    assert_eq!(
        int_at(&st, "/fragmentation/fullyFreeGpus"),
        Some(16),
        "{st:#}"
    );
    assert_eq!(int_at(&st, "/fragmentation/unknownPods"), Some(0), "{st:#}");
    let rate_before = float_at(&st, "/fragmentation/fragmentRate").unwrap();
    assert!(rate_before > 0.0, "{st:#}");
    // Planned moves: pod → node, by the pod's Deployment (its replacement's app).
    let planned: BTreeMap<String, String> = st["plan"]["moves"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let pod = m["pod"].as_str().unwrap().rsplit('/').next().unwrap();
            let app = running
                .iter()
                .find(|p| p.metadata.name.as_deref() == Some(pod))
                .and_then(|p| p.metadata.labels.as_ref()?.get("app").cloned())
                .unwrap_or_else(|| panic!("planned pod {pod} is not one of the test's"));
            (app, m["toNode"].as_str().unwrap().to_string())
        })
        .collect();
    let old_claims: BTreeMap<String, String> = running
        .iter()
        .filter_map(|p| {
            Some((
                p.metadata.labels.as_ref()?.get("app")?.clone(),
                extended_claim(p)?,
            ))
        })
        .collect();

    let watch = PodWatch::start(&c.client, c.name(), &c.pool, c.name())
        .await
        .unwrap();
    patch_policy(
        &c.client,
        c.name(),
        json!({"mode": "Enforce", "windows": [open_window_every_minute()]}),
    )
    .await
    .unwrap();
    let st = c.finished_run().await;
    let run = st.pointer("/lastRuns/0").unwrap().clone();
    assert_eq!(str_at(&run, "/result"), Some("Succeeded"), "{run:#}");
    let evicted = int_at(&run, "/evicted").unwrap();
    assert!(evicted > 0, "{run:#}");
    let fenced: BTreeSet<String> = strings_at(&run, "/fencedNodes").into_iter().collect();
    let train_node = c.training_job_running(T).await;
    assert!(
        fenced.contains(&train_node),
        "the 8-GPU pod runs on {train_node}, not on a node the run emptied ({fenced:?})"
    );
    wait_deployments_ready(&c.client, c.name(), &infer, T)
        .await
        .unwrap();
    // The run's fences come off as its last replacements land: seen gone within the
    // usual timeout, never left behind.
    wait_for("the run's fences to be removed", T, || async {
        Ok(c.fenced_nodes().await.is_empty().then_some(()))
    })
    .await
    .unwrap();

    // Every replacement got a claim of its own, on an unfenced node; count the landings
    // where the plan said.
    let seen = watch.seen();
    assert_eq!(
        seen.violations,
        BTreeMap::new(),
        "pods bound to fenced nodes"
    );
    let now = pods(&c.client, c.name(), "e2e-role=infer").await.unwrap();
    let (mut as_planned, mut on_target, mut moved) = (0, 0, 0);
    let targets: BTreeSet<&String> = planned.values().collect();
    let mut landed: BTreeMap<String, usize> = BTreeMap::new();
    for p in &now {
        let app = p.metadata.labels.as_ref().unwrap()["app"].clone();
        let claim = extended_claim(p).expect("a replacement without a claim");
        if old_claims.get(&app) == Some(&claim) {
            continue; // not moved
        }
        moved += 1;
        let node = pod_node(p).unwrap_or_default().to_string();
        assert!(!fenced.contains(&node), "{app} landed on fenced {node}");
        if planned.get(&app) == Some(&node) {
            as_planned += 1;
        }
        on_target += usize::from(targets.contains(&node));
        *landed.entry(node).or_default() += 1;
    }
    // Receiving nodes in the same state are interchangeable: the scheduler breaks their tie
    // at random, so per-pod landings are a coin flip there; the counts per receiving node
    // (sorted) are what the plan can promise.
    let mut want_counts: BTreeMap<&String, usize> = BTreeMap::new();
    for n in planned.values() {
        *want_counts.entry(n).or_default() += 1;
    }
    let sorted = |m: Vec<usize>| {
        let mut v = m;
        v.sort();
        v
    };
    let (want_counts, got_counts) = (
        sorted(want_counts.into_values().collect()),
        sorted(landed.values().copied().collect()),
    );
    assert_eq!(
        moved as i64, evicted,
        "replacements with a new claim vs evictions"
    );
    // The scheduler's allocations after: the emptied nodes' devices are free but for the
    // 8-GPU pod's, the others hold the rest.
    let held = allocated(&c.client, c.name()).await;
    assert_eq!(
        held.get(&train_node).map(BTreeSet::len),
        Some(8),
        "{held:?}"
    );
    let st = wait_status(&c.client, c.name(), "a lower fragment rate", T, |s| {
        float_at(s, "/fragmentation/fragmentRate").is_some_and(|r| r < rate_before)
    })
    .await
    .unwrap();
    eprintln!(
        "E2E-FIGURE dra: {evicted} evictions, {} nodes freed ({fenced:?}), 8-GPU pod on {train_node}; replacements landed on the planned node {as_planned}/{moved}, on a node the plan receives pods on {on_target}/{moved}, pods per receiving node planned {want_counts:?} landed {got_counts:?}; fragment rate {rate_before:.3} -> {:.3}",
        fenced.len(),
        float_at(&st, "/fragmentation/fragmentRate").unwrap_or(f64::NAN),
    );
    c.cleanup(&[c.name()]).await;
}

/// A Deployment of one pod on the pool that uses the named claim `claim`.
fn named_claim_deployment(c: &Case, app: &str, claim: &str) -> Deployment {
    let mut d: Deployment = serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": app, "labels": {"app": app}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": app}},
            "template": {
                "metadata": {"labels": {"app": app}},
                "spec": {
                    "schedulerName": GPU_SCHEDULER,
                    "terminationGracePeriodSeconds": 0,
                    "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
                    "containers": [{
                        "name": "main", "image": FAKE_IMAGE,
                        "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                                      "claims": [{"name": "gpu"}]},
                    }],
                },
            },
        },
    }))
    .unwrap();
    c.pool
        .place(d.spec.template.spec.as_mut().unwrap())
        .unwrap();
    d
}

#[tokio::test]
async fn pods_using_a_named_claim_are_never_moved() {
    let c = dra_case("dra-named", 2).await;
    let claims = Api::<ResourceClaim>::namespaced(c.client.clone(), c.name());
    for name in ["shared-gpu", "own-gpu"] {
        let claim: ResourceClaim = serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": {"devices": {"requests": [
                {"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}},
        }))
        .unwrap();
        claims.create(&PostParams::default(), &claim).await.unwrap();
    }
    let deployments = c.deployments();
    for (app, claim) in [
        ("shared-a", "shared-gpu"),
        ("shared-b", "shared-gpu"),
        ("own", "own-gpu"),
    ] {
        deployments
            .create(
                &PostParams::default(),
                &named_claim_deployment(&c, app, claim),
            )
            .await
            .unwrap();
    }
    wait_deployments_ready(
        &c.client,
        c.name(),
        &["shared-a".into(), "shared-b".into(), "own".into()],
        T,
    )
    .await
    .unwrap();
    let uids_before = c.uids().await;
    c.dry_run_policy(
        json!([{"gpus": 8, "weight": 1}]),
        json!({"maxEvictionsPerRun": 8, "maxEvictionsPerNode": 8}),
    )
    .await;
    let _op = Operator::start(c.cluster, c.name(), &[]).await.unwrap();
    let st = wait_status(&c.client, c.name(), "the claim pods' skip codes", T, |s| {
        int_at(s, "/skipped/shared-resource-claim").is_some()
            && int_at(s, "/skipped/named-resource-claim").is_some()
    })
    .await
    .unwrap();
    assert_eq!(
        int_at(&st, "/skipped/shared-resource-claim"),
        Some(2),
        "{st:#}"
    );
    assert_eq!(
        int_at(&st, "/skipped/named-resource-claim"),
        Some(1),
        "{st:#}"
    );
    assert_eq!(int_at(&st, "/plan/totalMoves").unwrap_or(0), 0, "{st:#}");
    // Enforce, with the window open: nothing is evicted.
    patch_policy(
        &c.client,
        c.name(),
        json!({"mode": "Enforce", "windows": [open_window_every_minute()]}),
    )
    .await
    .unwrap();
    wait_for("two more reconciles", T, || async {
        let s = policy_status(&c.client, c.name()).await?;
        Ok((str_at(&s, "/conditions/0/type").is_some()
            && s["conditions"].as_array().is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["type"] == "InWindow" && c["status"] == "True")
            }))
        .then_some(()))
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let st: Value = policy_status(&c.client, c.name()).await.unwrap();
    assert!(
        st["lastRuns"].as_array().is_none_or(Vec::is_empty),
        "a run started: {st:#}"
    );
    assert_eq!(c.uids().await, uids_before, "a claim pod was replaced");
    c.cleanup(&[c.name()]).await;
}

/// Marks the pool's nodes unschedulable but `keep` (all schedulable with `None`): the
/// next pods land where the test wants them, their replacements anywhere.
async fn cordon_all_but(c: &Case, keep: Option<&str>) {
    let nodes: Api<Node> = Api::all(c.client.clone());
    for n in &c.pool.nodes {
        let unschedulable = keep.is_some_and(|k| k != n);
        nodes
            .patch(
                n,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"unschedulable": unschedulable}})),
            )
            .await
            .unwrap();
    }
}

/// A Deployment of one pod on the pool whose GPU comes from the ResourceClaimTemplate
/// `template` (the claim is the pod's own; its replacement gets a new one).
fn template_claim_deployment(c: &Case, app: &str, template: &str) -> Deployment {
    let mut d = named_claim_deployment(c, app, "unused");
    let spec = d.spec.template.spec.as_mut().unwrap();
    spec.resource_claims = Some(vec![
        serde_json::from_value(json!({"name": "gpu", "resourceClaimTemplateName": template}))
            .unwrap(),
    ]);
    d
}

/// The template claim a pod holds (`status.resourceClaimStatuses`).
fn template_claim(p: &Pod) -> Option<String> {
    p.status
        .as_ref()?
        .resource_claim_statuses
        .as_ref()?
        .iter()
        .find_map(|s| s.resource_claim_name.clone())
}

/// Single DRA GPUs are drained behind a DeviceTaintRule. Two 8-GPU DRA nodes: `a` holds a
/// pod using a named claim (never moved) and four pods that opted out
/// (`gpu-defrag.io/do-not-disrupt`); `b` five pods whose GPU comes from a
/// ResourceClaimTemplate. Three GPUs free on each, a 4-GPU shape fits nowhere. Neither
/// node can be emptied; one pod moving from `b` to `a` makes room for the shape on `b`.
/// The plan drains that one GPU; the run fences it with its own `NoSchedule`
/// DeviceTaintRule (selecting driver, pool and device), never taints the node, and
/// deletes the rule when it ends; the replacement gets a new claim. Where it landed is
/// printed (`E2E-FIGURE dra-gpu`).
#[tokio::test]
async fn a_single_dra_gpu_is_drained_behind_its_own_device_taint_rule() {
    let c = dra_case("dra-gpu", 2).await;
    let (a, b) = (c.pool.nodes[0].clone(), c.pool.nodes[1].clone());
    let claims = Api::<ResourceClaim>::namespaced(c.client.clone(), c.name());
    let claim: ResourceClaim = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "anchor-gpu"},
        "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}},
    }))
    .unwrap();
    claims.create(&PostParams::default(), &claim).await.unwrap();
    let template: ResourceClaimTemplate = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "one-gpu"},
        "spec": {"spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}}},
    }))
    .unwrap();
    Api::<ResourceClaimTemplate>::namespaced(c.client.clone(), c.name())
        .create(&PostParams::default(), &template)
        .await
        .unwrap();
    let deployments = c.deployments();

    // Node a: the named-claim pod and four pods that opted out.
    cordon_all_but(&c, Some(&a)).await;
    let mut on_a = vec!["anchor".to_string()];
    deployments
        .create(
            &PostParams::default(),
            &named_claim_deployment(&c, "anchor", "anchor-gpu"),
        )
        .await
        .unwrap();
    for i in 0..4 {
        let app = format!("keep-{i}");
        let mut d = c.pool.deployment(&app, 1, 1).unwrap();
        d.spec
            .template
            .metadata
            .get_or_insert_with(Default::default)
            .annotations
            .get_or_insert_with(Default::default)
            .insert("gpu-defrag.io/do-not-disrupt".into(), "true".into());
        deployments
            .create(&PostParams::default(), &d)
            .await
            .unwrap();
        on_a.push(app);
    }
    wait_deployments_ready(&c.client, c.name(), &on_a, T)
        .await
        .unwrap();
    // Node b: five template-claim pods, each free to move.
    cordon_all_but(&c, Some(&b)).await;
    let movable: Vec<String> = (0..5).map(|i| format!("tmpl-{i}")).collect();
    for app in &movable {
        deployments
            .create(
                &PostParams::default(),
                &template_claim_deployment(&c, app, "one-gpu"),
            )
            .await
            .unwrap();
    }
    wait_deployments_ready(&c.client, c.name(), &movable, T)
        .await
        .unwrap();
    cordon_all_but(&c, None).await;
    allow_one_disruption(&c.client, c.name(), &movable)
        .await
        .unwrap();
    let running = pods(&c.client, c.name(), "").await.unwrap();
    for p in &running {
        let (app, node) = (pod_app(p), pod_node(p).unwrap_or_default());
        let want = if movable.iter().any(|m| m == app) {
            &b
        } else {
            &a
        };
        assert_eq!(node, want.as_str(), "{app} runs on {node}");
    }
    let old_claims: BTreeMap<String, String> = running
        .iter()
        .filter_map(|p| Some((pod_app(p).to_string(), template_claim(p)?)))
        .collect();
    assert_eq!(old_claims.len(), 5, "{old_claims:?}");

    c.dry_run_policy(
        json!([{"gpus": 4}]),
        json!({"maxEvictionsPerRun": 4, "maxEvictionsPerNode": 4,
               "maxEvictionsPerNamespace": 10, "maxInFlight": 1}),
    )
    .await;
    let _op = Operator::start(c.cluster, c.name(), &[]).await.unwrap();
    let st = wait_status(&c.client, c.name(), "a plan draining one GPU", T, |s| {
        int_at(s, "/plan/totalMoves") == Some(1)
    })
    .await
    .unwrap();
    assert_eq!(int_at(&st, "/fragmentation/gpus"), Some(16), "{st:#}");
    assert_eq!(int_at(&st, "/fragmentation/unknownPods"), Some(0), "{st:#}");
    assert_eq!(
        int_at(&st, "/skipped/named-resource-claim"),
        Some(1),
        "{st:#}"
    );
    let m = &st["plan"]["moves"][0];
    assert_eq!(
        (str_at(m, "/fromNode"), str_at(m, "/toNode")),
        (Some(b.as_str()), Some(a.as_str())),
        "{st:#}"
    );
    let drained = strings_at(m, "/fromDevices");
    assert_eq!(drained.len(), 1, "{st:#}");
    let drained = drained[0].clone();
    let moved_pod = str_at(m, "/pod")
        .unwrap()
        .rsplit('/')
        .next()
        .unwrap()
        .to_string();
    let moved_app = running
        .iter()
        .find(|p| p.metadata.name.as_deref() == Some(moved_pod.as_str()))
        .map(|p| pod_app(p).to_string())
        .unwrap();

    // Every DeviceTaintRule seen while the run goes on, from a watch.
    let seen: std::sync::Arc<std::sync::Mutex<BTreeMap<String, Value>>> = Default::default();
    let watch = {
        let (seen, api) = (seen.clone(), Api::<DeviceTaintRule>::all(c.client.clone()));
        tokio::spawn(async move {
            use futures::StreamExt;
            use kube::runtime::WatchStreamExt;
            let mut events = kube::runtime::watcher(api, Default::default())
                .default_backoff()
                .applied_objects()
                .boxed();
            while let Some(event) = events.next().await {
                let Ok(r) = event else { continue };
                let v = serde_json::to_value(&r).unwrap_or_default();
                seen.lock()
                    .unwrap()
                    .insert(r.metadata.name.clone().unwrap_or_default(), v);
            }
        })
    };
    let node_watch = PodWatch::start(&c.client, c.name(), &c.pool, c.name())
        .await
        .unwrap();
    c.enforce_now().await;
    let st = c.finished_run().await;
    let run = st.pointer("/lastRuns/0").unwrap().clone();
    assert_eq!(str_at(&run, "/result"), Some("Succeeded"), "{run:#}");
    assert_eq!(int_at(&run, "/evicted"), Some(1), "{run:#}");
    assert_eq!(strings_at(&run, "/fencedNodes"), Vec::<String>::new());
    assert_eq!(
        run.pointer("/fencedDevices"),
        Some(&json!([{"node": b, "gpu": drained, "driver": DRIVER, "pool": b}])),
        "{run:#}"
    );
    wait_deployments_ready(&c.client, c.name(), &movable, T)
        .await
        .unwrap();
    watch.abort();
    let seen = seen.lock().unwrap().clone();
    // The run's rule: NoSchedule on exactly the drained device, labelled with its policy.
    let ours: Vec<&Value> = seen
        .values()
        .filter(|r| r.pointer("/metadata/labels/gpu-defrag.io~1fence") == Some(&json!(c.name())))
        .collect();
    assert_eq!(ours.len(), 1, "{seen:#?}");
    assert_eq!(
        ours[0]["spec"]["deviceSelector"],
        json!({"driver": DRIVER, "pool": b, "device": drained}),
        "{seen:#?}"
    );
    assert_eq!(ours[0]["spec"]["taint"]["effect"], "NoSchedule");
    // Gone after the run.
    let left = Api::<DeviceTaintRule>::all(c.client.clone())
        .list(&ListParams::default().labels(&format!("gpu-defrag.io/fence={}", c.name())))
        .await
        .unwrap();
    assert!(left.items.is_empty(), "{:?}", left.items);
    // No node was tainted; the replacement has a claim of its own; where it landed.
    assert_eq!(node_watch.seen().violations, BTreeMap::new());
    assert_eq!(c.fenced_nodes().await, Vec::<String>::new());
    let now = pods(&c.client, c.name(), &format!("app={moved_app}"))
        .await
        .unwrap();
    assert_eq!(now.len(), 1);
    let new_claim = template_claim(&now[0]).expect("the replacement has no claim");
    assert_ne!(
        Some(&new_claim),
        old_claims.get(&moved_app),
        "the claim was reused"
    );
    let landed = pod_node(&now[0]).unwrap_or_default().to_string();
    let held = allocated(&c.client, c.name()).await;
    assert!(
        !held.get(&b).is_some_and(|d| d.contains(&drained)) || landed == b,
        "the drained device was handed out again during the run: {held:?}"
    );
    let st = wait_status(&c.client, c.name(), "the new fragmentation", T, |s| {
        int_at(s, "/fragmentation/unknownPods") == Some(0)
    })
    .await
    .unwrap();
    eprintln!(
        "E2E-FIGURE dra-gpu: 1 eviction, GPU {drained} of {b} fenced by DeviceTaintRule {}; the template-claim pod's replacement landed on {landed} (plan: {a}) with a new claim; landings as planned {}/1; fragment rate {:.3} -> {:.3}",
        ours[0]["metadata"]["name"].as_str().unwrap_or("?"),
        u8::from(landed == a),
        float_at(&run, "/fragmentRateBefore").unwrap_or(f64::NAN),
        float_at(&st, "/fragmentation/fragmentRate").unwrap_or(f64::NAN),
    );
    c.cleanup(&[c.name()]).await;
}

/// Partitionable devices: one A100 published in the NVIDIA driver's DynamicMIG layout
/// ([`fakedra::mig_slices`]); a pod asks for a `3g.40gb` partition through a
/// ResourceClaimTemplate and the real scheduler allocates the first fitting one (memory
/// slices 0–3). The live report (`gpu-defrag report -o json`) shows the GPU half used by
/// that partition, the node with no free whole GPU, and per profile what still fits:
/// `3g.40gb` 1 of 2, `1g.10gb` 4 of 4 (slices 4–7 are free).
#[tokio::test]
async fn a_gpu_half_used_by_mig_partitions_is_reported_per_profile() {
    let cluster = shared().await.expect("local control plane");
    let ns = cluster.namespace("dra-mig").await.unwrap();
    let client = cluster.client().unwrap();
    fakedra::ensure_device_class(&client).await.unwrap();
    fakedra::ensure_mig_class(&client).await.unwrap();
    let name = ns.name().to_string();
    let nodes = cluster
        .add_nodes(
            &GpuNodes::new(1, 1)
                .dra()
                .name_prefix(&name)
                .label(POOL_LABEL, &name)
                .taint(POOL_LABEL, &name, "NoSchedule"),
        )
        .await
        .unwrap();
    let node = nodes[0].clone();
    let slices = Api::<ResourceSlice>::all(client.clone());
    for s in fakedra::mig_slices(&node).unwrap() {
        slices.create(&PostParams::default(), &s).await.unwrap();
    }
    let template: ResourceClaimTemplate = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "mig-3g"},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": fakedra::MIG_CLASS,
            "selectors": [{"cel": {"expression":
                "device.attributes['gpu.nvidia.com'].profile == '3g.40gb'"}}]}}]}}},
    }))
    .unwrap();
    Api::<ResourceClaimTemplate>::namespaced(client.clone(), &name)
        .create(&PostParams::default(), &template)
        .await
        .unwrap();
    let pool = gpu_defrag_e2e::operator::Pool {
        name: name.clone(),
        nodes: nodes.clone(),
        gpus_per_node: 1,
    };
    let c = Case {
        cluster,
        ns,
        client,
        pool,
    };
    c.deployments()
        .create(
            &PostParams::default(),
            &template_claim_deployment(&c, "mig-user", "mig-3g"),
        )
        .await
        .unwrap();
    wait_deployments_ready(&c.client, &name, &["mig-user".into()], T)
        .await
        .unwrap();
    let held = allocated(&c.client, &name).await;
    assert_eq!(
        held.get(&node),
        Some(&BTreeSet::from(["gpu-0-mig-3g40gb-0".to_string()])),
        "{held:?}"
    );

    let out = tokio::process::Command::new(operator_binary().await.unwrap())
        .args(["report", "-o", "json", "--kubeconfig"])
        .arg(c.cluster.kubeconfig_path())
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let row = report["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == json!(node))
        .unwrap_or_else(|| panic!("{node} not in the report"))
        .clone();
    assert_eq!(row["scheme"], "dra", "{row:#}");
    assert_eq!(row["gpus"], 1, "{row:#}");
    assert_eq!(
        row["used"],
        json!([500]),
        "half of the GPU's memory slices: {row:#}"
    );
    assert_eq!(row["fullyFreeGpus"], 0, "{row:#}");
    assert_eq!(
        row["devices"][0]["partitions"],
        json!(["3g.40gb"]),
        "{row:#}"
    );
    let mig: BTreeMap<String, (u64, u64, u64)> = report["mig"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["node"] == json!(node))
        .map(|m| {
            (
                m["profile"].as_str().unwrap().to_string(),
                (
                    m["used"].as_u64().unwrap(),
                    m["free"].as_u64().unwrap(),
                    m["capacity"].as_u64().unwrap(),
                ),
            )
        })
        .collect();
    assert_eq!(
        mig,
        BTreeMap::from([
            ("1g.10gb".to_string(), (0, 4, 4)),
            ("3g.40gb".to_string(), (1, 1, 2)),
        ]),
        "{:#}",
        report["mig"]
    );
    eprintln!(
        "E2E-FIGURE dra-mig: the scheduler allocated {:?}; report: GPU used {}, MIG 3g.40gb used/free/capacity {:?}, 1g.10gb {:?}",
        held.get(&node),
        row["used"],
        mig.get("3g.40gb"),
        mig.get("1g.10gb")
    );
    c.cleanup(&[]).await;
}
