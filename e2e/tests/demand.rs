//! Demand runs on the real control plane (docs/operator.md, `spec.demand`): a pending GPU
//! pod of the gpu-binpack scheduler that has been unschedulable for `demand.minWait` and
//! fits no node gets the cheapest room made for it, held while it drains (fence) and once
//! free (nomination) until the real kube-scheduler binds it there.
//!
//! Every policy here is `Enforce` with no maintenance window and
//! `demand.outsideWindows: true` (demand runs only, which the API server admits): a
//! window run (which would also make room for a pending 8-GPU pod) never starts, so
//! whatever moves is a demand run's doing.
//!
//! Node layouts are built by hand: bare pods (no controller: never moved) are bound by
//! name, the movable Deployments are placed by cordoning the pool's other nodes while they
//! schedule ([`movers_on`]).

use std::{
    collections::BTreeSet,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use gpu_defrag_e2e::{
    case::{
        Case, QUIET, RUN_TIMEOUT, T, has_finished_run, hold_replacements, release_replacements,
    },
    fixtures::{
        FAKE_IMAGE, GPU_RESOURCE, GPU_SCHEDULER, pod_ready, pods, set_unschedulable, wait_for,
        wait_ready_pods,
    },
    operator::{
        Operator, PodWatch, Pool, allow_one_disruption, condition, int_at, patch_policy, pod_node,
        policy_status, str_at, strings_at, wait_deployments_ready, wait_status,
    },
};
use k8s_openapi::api::{
    apps::v1::Deployment,
    core::v1::{Event, Pod},
    scheduling::v1::PriorityClass,
};
use kube::{
    Api, Client,
    api::{ListParams, PostParams},
};
use serde_json::{Value, json};

/// `demand.minWait` of every policy here, seconds.
const MIN_WAIT_S: u64 = 10;
/// The gang label the safety rules read (scheduler-plugins coscheduling).
const GANG_LABEL: &str = "scheduling.x-k8s.io/pod-group";

// === building blocks ===

/// An Enforce policy over the case's pool and namespace that runs demand runs only: no
/// window, `demand.outsideWindows` on, `minWait` [`MIN_WAIT_S`].
fn demand_spec(c: &Case, limits: Value) -> Value {
    let mut spec = c.spec(json!([{"gpus": 8}]), limits);
    spec["mode"] = json!("Enforce");
    spec["windows"] = json!([]);
    spec["demand"] = json!({
        "minWait": format!("{MIN_WAIT_S}s"),
        "outsideWindows": true,
        "maxEvictions": 16,
        "maxEvictionsPerHour": 64,
        "holdTimeout": "2m",
    });
    spec
}

/// Limits that never stand in the way of the layouts here.
fn roomy_limits() -> Value {
    json!({"maxEvictionsPerRun": 8, "maxEvictionsPerNode": 4,
           "maxEvictionsPerNamespace": 20, "maxInFlight": 2})
}

/// A pod spec's containers asking for `gpus` whole GPUs, `cpu` and 1Gi.
fn containers(gpus: u32, cpu: &str) -> Value {
    let mut limits = json!({"cpu": cpu, "memory": "1Gi"});
    if gpus > 0 {
        limits[GPU_RESOURCE] = json!(gpus.to_string());
    }
    json!([{
        "name": "main",
        "image": FAKE_IMAGE,
        "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}, "limits": limits},
    }])
}

/// A bare pod (no controller: never moved) of `gpus` GPUs bound to `node` by name.
fn bare_pod(pool: &Pool, name: &str, node: &str, gpus: u32) -> Pod {
    let mut p: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": name, "e2e-role": "fill"}},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 0,
            "containers": containers(gpus, "100m"),
        },
    }))
    .unwrap();
    pool.place(p.spec.as_mut().unwrap()).unwrap();
    p
}

/// Bare pods using `gpus` GPUs of node `i` of the pool (one pod), running.
async fn fill(c: &Case, i: usize, gpus: u32) {
    let name = format!("fill-{i}");
    let p = bare_pod(&c.pool, &name, &c.pool.nodes[i], gpus);
    Api::<Pod>::namespaced(c.client.clone(), c.name())
        .create(&PostParams::default(), &p)
        .await
        .unwrap();
    wait_ready_pods(&c.client, c.name(), &format!("app={name}"), 1, T)
        .await
        .unwrap();
}

/// One-replica Deployments `(name, gpus)` placed on node `i` of the pool (the others are
/// cordoned while they schedule), with `priority_class` if given; returns once they run
/// there. Their PDBs are the caller's ([`allow_one_disruption`]).
async fn movers_on(c: &Case, i: usize, movers: &[(&str, u32)], priority_class: Option<&str>) {
    let nodes = &c.pool.nodes;
    for (j, n) in nodes.iter().enumerate() {
        if j != i {
            set_unschedulable(&c.client, n, true).await;
        }
    }
    for (name, gpus) in movers {
        let mut d = c.pool.deployment(name, 1, *gpus).unwrap();
        if let Some(pc) = priority_class {
            d.spec.template.spec.as_mut().unwrap().priority_class_name = Some(pc.to_string());
        }
        c.deployments()
            .create(&PostParams::default(), &d)
            .await
            .unwrap();
    }
    let selector = format!(
        "app in ({})",
        movers.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(",")
    );
    let running = wait_ready_pods(&c.client, c.name(), &selector, movers.len(), T)
        .await
        .unwrap();
    for (j, n) in nodes.iter().enumerate() {
        if j != i {
            set_unschedulable(&c.client, n, false).await;
        }
    }
    for p in &running {
        assert_eq!(
            pod_node(p),
            Some(nodes[i].as_str()),
            "mover {:?} placed off {}",
            p.metadata.name,
            nodes[i]
        );
    }
}

/// Waits until `n` pods `selector` in `ns` are pending with `PodScheduled=False`,
/// reason `Unschedulable` (the real scheduler found no node); returns them.
async fn wait_unschedulable(client: &Client, ns: &str, selector: &str, n: usize) -> Vec<Pod> {
    wait_for(
        &format!("{n} pods {selector} in {ns} to be Pending, unschedulable"),
        T,
        || async {
            let ps = pods(client, ns, selector).await?;
            let unschedulable = |p: &Pod| {
                pod_node(p).is_none()
                    && p.status.as_ref().is_some_and(|s| {
                        s.conditions.iter().flatten().any(|c| {
                            c.type_ == "PodScheduled"
                                && c.status == "False"
                                && c.reason.as_deref() == Some("Unschedulable")
                        })
                    })
            };
            Ok((ps.len() == n && ps.iter().all(unschedulable)).then_some(ps))
        },
    )
    .await
    .unwrap()
}

/// `namespace/name` of a pod.
fn key(p: &Pod) -> String {
    format!(
        "{}/{}",
        p.metadata.namespace.as_deref().unwrap_or_default(),
        p.metadata.name.as_deref().unwrap_or_default()
    )
}

fn uid(p: &Pod) -> String {
    p.metadata.uid.clone().unwrap_or_default()
}

/// The only pod `app=<app>` of the case's namespace.
async fn the_pod(c: &Case, app: &str) -> Pod {
    let mut ps = pods(&c.client, c.name(), &format!("app={app}"))
        .await
        .unwrap();
    assert_eq!(ps.len(), 1, "pods app={app}: {ps:?}");
    ps.pop().unwrap()
}

/// The `status.demand.recent` records that name every pod of `keys`.
fn records_for<'a>(st: &'a Value, keys: &[String]) -> Vec<&'a Value> {
    st.pointer("/demand/recent")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|r| {
            let pods = strings_at(r, "/pods");
            keys.iter().all(|k| pods.contains(k))
        })
        .collect()
}

/// The newest `status.demand.recent` record for `keys` whose result is `result`.
fn record<'a>(st: &'a Value, keys: &[String], result: &str) -> Option<&'a Value> {
    records_for(st, keys)
        .into_iter()
        .find(|r| str_at(r, "/result") == Some(result))
}

/// Waits for a `status.demand.recent` record for `keys` with `result`; returns it.
async fn wait_record(c: &Case, keys: &[String], result: &str, timeout: Duration) -> Value {
    let st = wait_status(
        &c.client,
        c.name(),
        &format!("a demand record {result} for {keys:?}"),
        timeout,
        |s| record(s, keys, result).is_some(),
    )
    .await
    .unwrap();
    record(&st, keys, result).unwrap().clone()
}

/// Messages of the `MakingRoom` Events on pod `name` of `ns`.
async fn making_room_events(client: &Client, ns: &str, name: &str) -> Vec<String> {
    Api::<Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some("MakingRoom")
                && e.involved_object.name.as_deref() == Some(name)
        })
        .map(|e| e.message.unwrap_or_default())
        .collect()
}

/// The pods of `ns` with their nodes and phases, for failure messages.
async fn where_pods_are(client: &Client, ns: &str) -> String {
    let mut out: Vec<String> = pods(client, ns, "")
        .await
        .unwrap_or_default()
        .iter()
        .map(|p| {
            format!(
                "{} on {} ({}{})",
                p.metadata.name.as_deref().unwrap_or_default(),
                pod_node(p).unwrap_or("-"),
                p.status
                    .as_ref()
                    .and_then(|s| s.phase.as_deref())
                    .unwrap_or("?"),
                p.status
                    .as_ref()
                    .and_then(|s| s.nominated_node_name.as_deref())
                    .map(|n| format!(", nominated {n}"))
                    .unwrap_or_default(),
            )
        })
        .collect();
    out.sort();
    out.join("; ")
}

/// The node the pod of `app` runs on once it runs, within `timeout`; on timeout fails
/// with where the case's pods are and the policy's status.
async fn running_on(c: &Case, app: &str, timeout: Duration) -> String {
    let r = wait_for(&format!("{app} to be Running"), timeout, || async {
        let ps = pods(&c.client, c.name(), &format!("app={app}")).await?;
        Ok(ps
            .iter()
            .find(|p| pod_ready(p))
            .and_then(|p| pod_node(p).map(str::to_string)))
    })
    .await;
    match r {
        Ok(n) => n,
        Err(e) => panic!(
            "{e:#}\npods: {}\nstatus: {:#}",
            where_pods_are(&c.client, c.name()).await,
            policy_status(&c.client, c.name()).await.unwrap_or_default()
        ),
    }
}

/// A 1-GPU bare pod of the gpu-binpack scheduler that may run on `node` only.
fn small_pod(pool: &Pool, name: &str, node: &str) -> Pod {
    let mut p: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": "small"}},
        "spec": {
            "schedulerName": GPU_SCHEDULER,
            "terminationGracePeriodSeconds": 0,
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [node]},
                ]}],
            }}},
            "containers": containers(1, "100m"),
        },
    }))
    .unwrap();
    pool.place(p.spec.as_mut().unwrap()).unwrap();
    p
}

/// Creates a [`small_pod`] for `node` in `ns` every 2 s until dropped.
struct SmallPodStream {
    stop: Arc<AtomicBool>,
    created: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl SmallPodStream {
    fn start(client: &Client, ns: &str, pool: &Pool, node: &str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let created = Arc::new(AtomicUsize::new(0));
        let api: Api<Pod> = Api::namespaced(client.clone(), ns);
        let (pool, node) = (pool.clone(), node.to_string());
        let (s, n) = (stop.clone(), created.clone());
        let task = tokio::spawn(async move {
            let mut i = 0;
            while !s.load(Ordering::Relaxed) {
                let p = small_pod(&pool, &format!("small-{i:03}"), &node);
                if api.create(&PostParams::default(), &p).await.is_ok() {
                    n.fetch_add(1, Ordering::Relaxed);
                }
                i += 1;
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        });
        Self {
            stop,
            created,
            task,
        }
    }

    /// Stops creating pods; returns how many were created.
    async fn stop(&mut self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        let _ = tokio::time::timeout(Duration::from_secs(10), &mut self.task).await;
        self.created.load(Ordering::Relaxed)
    }
}

impl Drop for SmallPodStream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The layout of the single-pod tests: node 0 holds two 4-GPU movers (one-replica
/// Deployments whose PDBs allow one disruption each), nodes 1 and 2 four GPUs each of bare
/// pods. No node has 8 GPUs free; node 0 is the only one a room can be made on (two
/// evictions, the movers re-placed on nodes 1 and 2). Returns the movers.
async fn one_room_layout(c: &Case) -> Vec<String> {
    fill(c, 1, 4).await;
    fill(c, 2, 4).await;
    movers_on(c, 0, &[("mover-a", 4), ("mover-b", 4)], None).await;
    let movers = vec!["mover-a".to_string(), "mover-b".to_string()];
    allow_one_disruption(&c.client, c.name(), &movers)
        .await
        .unwrap();
    movers
}

// === the tests ===

/// A pending 8-GPU pod that fits nowhere runs within minWait + 60 s, on the node the
/// demand run says it made room on, while 1-GPU pods that may run on that node only
/// arrive every 2 s: none of them ever binds there (the fence holds the room while it
/// drains, the nomination once it is free; without either, the first small pod after an
/// eviction would take it and the 8-GPU pod would never fit).
#[tokio::test]
async fn a_pending_8_gpu_pod_runs_on_a_room_held_against_small_pods() {
    let c = Case::new("demand-held", 3, 8).await;
    // The small pods' namespace is outside the policy: they are never served themselves.
    let small_ns = c.cluster.namespace("demand-held-small").await.unwrap();
    let room = c.pool.nodes[0].clone();
    one_room_layout(&c).await;
    let movers_before: BTreeSet<String> = pods(&c.client, c.name(), "app in (mover-a,mover-b)")
        .await
        .unwrap()
        .iter()
        .map(uid)
        .collect();
    let watch = PodWatch::start(&c.client, c.name(), &c.pool, c.name())
        .await
        .unwrap();
    c.create_policy(demand_spec(&c, roomy_limits())).await;
    let _op = Operator::start(c.cluster, c.name(), &[]).await.unwrap();
    c.pending_training_job().await;
    let t0 = Instant::now();
    let big = the_pod(&c, "train-8gpu").await;
    let big_key = key(&big);
    let mut stream = SmallPodStream::start(&c.client, small_ns.name(), &c.pool, &room);

    let budget = Duration::from_secs(MIN_WAIT_S + 60);
    let node = running_on(&c, "train-8gpu", budget + Duration::from_secs(30)).await;
    let took = t0.elapsed();
    // A few more small pods after the bind: the room is taken by the 8-GPU pod now.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let created = stream.stop().await;

    let small = pods(&c.client, small_ns.name(), "app=small").await.unwrap();
    let bound: Vec<String> = small
        .iter()
        .filter_map(|p| pod_node(p).map(|n| format!("{} on {n}", key(p))))
        .collect();
    assert!(
        bound.is_empty(),
        "small pods bound (the room was not held): {bound:?}; pods: {}",
        where_pods_are(&c.client, c.name()).await
    );
    assert!(created >= 5, "only {created} small pods were created");
    let seen = watch.seen();
    assert_eq!(
        seen.fenced.iter().collect::<Vec<_>>(),
        vec![&room],
        "only the room is fenced, while it drains"
    );
    assert!(seen.violations.is_empty(), "{:?}", seen.violations);
    assert_eq!(
        node, room,
        "the 8-GPU pod runs on the only node a room fits"
    );
    assert!(
        took <= budget,
        "the 8-GPU pod ran {:.1}s after it was unschedulable (minWait {MIN_WAIT_S}s + 60s)",
        took.as_secs_f64()
    );

    let rec = wait_record(&c, std::slice::from_ref(&big_key), "Served", T).await;
    assert_eq!(strings_at(&rec, "/nodes"), vec![node.clone()], "{rec:#}");
    assert_eq!(int_at(&rec, "/evictions"), Some(2), "{rec:#}");
    assert!(
        int_at(&rec, "/waitedSeconds").unwrap_or(0) >= MIN_WAIT_S as i64,
        "served before minWait: {rec:#}"
    );
    let st = wait_status(
        &c.client,
        c.name(),
        "the demand run to be recorded",
        T,
        has_finished_run,
    )
    .await
    .unwrap();
    assert_eq!(
        condition(&st, "InWindow").and_then(|c| str_at(c, "/message")),
        Some("no maintenance window: demand runs only"),
        "{st:#}"
    );
    let run = st.pointer("/lastRuns/0").unwrap();
    assert_eq!(str_at(run, "/result"), Some("Succeeded"), "{run:#}");
    assert_eq!(
        strings_at(run, "/demand/pods"),
        vec![big_key.clone()],
        "{run:#}"
    );
    assert_eq!(strings_at(run, "/demand/uids"), vec![uid(&big)], "{run:#}");
    assert_eq!(
        strings_at(run, "/demand/nodes"),
        vec![node.clone()],
        "{run:#}"
    );
    assert_eq!(
        strings_at(run, "/demand/served"),
        vec!["Served".to_string()],
        "{run:#}"
    );
    let events =
        making_room_events(&c.client, c.name(), big.metadata.name.as_deref().unwrap()).await;
    assert!(
        events.iter().any(|m| m.contains(&node)),
        "a MakingRoom Event on the pod names {node}: {events:?}"
    );
    // Every mover was evicted once and runs again off the room; no fence is left.
    let after = wait_ready_pods(&c.client, c.name(), "app in (mover-a,mover-b)", 2, T)
        .await
        .unwrap();
    for p in &after {
        assert!(!movers_before.contains(&uid(p)), "a mover was not moved");
        assert_ne!(
            pod_node(p),
            Some(room.as_str()),
            "a mover is back on the room"
        );
    }
    wait_for("the fences to be removed", T, || async {
        Ok(c.fenced_nodes().await.is_empty().then_some(()))
    })
    .await
    .unwrap();
    eprintln!(
        "E2E-FIGURE demand: a pending 8-GPU pod ran on {node} {:.1}s after it was unschedulable (minWait {MIN_WAIT_S}s, 2 evictions); {created} small pods for that node arrived meanwhile, none bound there",
        took.as_secs_f64()
    );
    c.cleanup(&[c.name()]).await;
}

/// The cheapest room (node 0: one eviction) is held by a pod of higher priority than the
/// pending one: it is never evicted, and the room is made on node 1 (two evictions of pods
/// of equal priority) instead.
#[tokio::test]
async fn a_higher_priority_pod_is_never_evicted_for_it() {
    let c = Case::new("demand-prio", 3, 8).await;
    let pc_name = format!("{}-high", c.name());
    let pc: PriorityClass = serde_json::from_value(json!({
        "metadata": {"name": pc_name}, "value": 1000, "globalDefault": false,
    }))
    .unwrap();
    Api::<PriorityClass>::all(c.client.clone())
        .create(&PostParams::default(), &pc)
        .await
        .unwrap();
    // n0: one 4-GPU pod of priority 1000 (one eviction frees the node); n1: two 2-GPU pods
    // of priority 0 (two evictions); n2: four GPUs of bare pods. Every node has 4 free.
    fill(&c, 2, 4).await;
    movers_on(&c, 0, &[("vip", 4)], Some(pc_name.as_str())).await;
    movers_on(&c, 1, &[("mover-a", 2), ("mover-b", 2)], None).await;
    let apps: Vec<String> = ["vip", "mover-a", "mover-b"].map(String::from).to_vec();
    allow_one_disruption(&c.client, c.name(), &apps)
        .await
        .unwrap();
    let vip = the_pod(&c, "vip").await;
    c.create_policy(demand_spec(&c, roomy_limits())).await;
    let _op = Operator::start(c.cluster, c.name(), &[]).await.unwrap();
    c.pending_training_job().await;
    let big = the_pod(&c, "train-8gpu").await;

    let node = running_on(
        &c,
        "train-8gpu",
        Duration::from_secs(MIN_WAIT_S) + RUN_TIMEOUT,
    )
    .await;
    let vip_now = the_pod(&c, "vip").await;
    assert_eq!(
        uid(&vip_now),
        uid(&vip),
        "the priority-1000 pod was evicted for a priority-0 pod: {}",
        where_pods_are(&c.client, c.name()).await
    );
    assert!(pod_ready(&vip_now) && pod_node(&vip_now) == pod_node(&vip));
    assert_eq!(
        node, c.pool.nodes[1],
        "the room is made where only pods of equal priority are evicted"
    );
    let rec = wait_record(&c, &[key(&big)], "Served", T).await;
    assert_eq!(strings_at(&rec, "/nodes"), vec![node.clone()], "{rec:#}");
    assert_eq!(int_at(&rec, "/evictions"), Some(2), "{rec:#}");
    eprintln!(
        "E2E-FIGURE demand (priority): room made on {node} (2 evictions) instead of the one-eviction node of a higher-priority pod, which kept running"
    );
    c.cleanup(&[c.name()]).await;
    Api::<PriorityClass>::all(c.client.clone())
        .delete(&pc_name, &Default::default())
        .await
        .unwrap();
}

/// A pending 8-GPU pod in a namespace the policy excludes starts nothing for minWait +
/// 30 s: no run, no eviction, nobody waiting. Then the same pod in the policy's own
/// namespace is served on the same pool (the scenario could have started a run).
#[tokio::test]
async fn a_pending_pod_outside_the_scope_starts_nothing() {
    let c = Case::new("demand-scope", 3, 8).await;
    let other = c.cluster.namespace("demand-scope-out").await.unwrap();
    one_room_layout(&c).await;
    let mut spec = demand_spec(&c, roomy_limits());
    spec["namespaces"] = json!({"include": [c.name(), other.name()], "exclude": [other.name()]});
    c.create_policy(spec).await;
    let _op = Operator::start(c.cluster, c.name(), &[]).await.unwrap();
    let outsider = c.pool.deployment("outsider", 1, 8).unwrap();
    Api::<Deployment>::namespaced(c.client.clone(), other.name())
        .create(&PostParams::default(), &outsider)
        .await
        .unwrap();
    let out_pod = wait_unschedulable(&c.client, other.name(), "app=outsider", 1)
        .await
        .pop()
        .unwrap();
    let out_key = key(&out_pod);
    let watch = PodWatch::start(&c.client, c.name(), &c.pool, c.name())
        .await
        .unwrap();
    let uids = c.uids().await;
    tokio::time::sleep(Duration::from_secs(MIN_WAIT_S + 30)).await;

    let st = policy_status(&c.client, c.name()).await.unwrap();
    assert!(st.get("activeRun").is_none(), "a run started: {st:#}");
    assert!(
        st.pointer("/lastRuns/0").is_none(),
        "a run was recorded: {st:#}"
    );
    assert_eq!(
        int_at(&st, "/demand/waiting"),
        Some(0),
        "status.demand.waiting: {st:#}"
    );
    assert!(
        records_for(&st, std::slice::from_ref(&out_key)).is_empty(),
        "a demand record for the excluded pod: {st:#}"
    );
    assert!(
        watch.seen().gone().is_empty(),
        "evicted: {:?}",
        watch.seen().gone()
    );
    assert_eq!(c.uids().await, uids);
    assert!(c.fenced_nodes().await.is_empty());
    assert!(
        making_room_events(
            &c.client,
            other.name(),
            out_pod.metadata.name.as_deref().unwrap()
        )
        .await
        .is_empty()
    );
    // The control: the same pod in scope is served.
    c.pending_training_job().await;
    let node = running_on(
        &c,
        "train-8gpu",
        Duration::from_secs(MIN_WAIT_S) + RUN_TIMEOUT,
    )
    .await;
    assert_eq!(node, c.pool.nodes[0]);
    let still = pods(&c.client, other.name(), "app=outsider").await.unwrap();
    assert!(
        still.iter().all(|p| pod_node(p).is_none()),
        "the excluded pod bound: {still:?}"
    );
    eprintln!(
        "E2E-FIGURE demand (scope): an excluded 8-GPU pod pending {}s started nothing; the same pod in scope ran on {node}",
        MIN_WAIT_S + 30
    );
    c.cleanup(&[c.name()]).await;
}

/// A demand run held after its first eviction (its replacement cannot be created), then
/// the policy suspended: the fence comes off, the pending pod is not nominated, the run
/// is recorded Stopped and the demand Stalled with why, and nothing more is evicted.
#[tokio::test]
async fn suspending_the_policy_mid_run_releases_the_hold() {
    let c = Case::new("demand-stop", 3, 8).await;
    let room = c.pool.nodes[0].clone();
    let movers = one_room_layout(&c).await;
    c.pending_training_job().await;
    let big = the_pod(&c, "train-8gpu").await;
    let big_key = key(&big);
    // The first evicted mover's replacement is held back: the run stays mid-drain.
    hold_replacements(&c, 1).await;
    c.create_policy(demand_spec(
        &c,
        json!({"maxEvictionsPerRun": 8, "maxEvictionsPerNode": 4,
               "maxEvictionsPerNamespace": 20, "maxInFlight": 1}),
    ))
    .await;
    let watch = PodWatch::start(&c.client, c.name(), &c.pool, c.name())
        .await
        .unwrap();
    let _op = Operator::start(c.cluster, c.name(), &[]).await.unwrap();
    let active = wait_status(
        &c.client,
        c.name(),
        "a demand run's first eviction",
        Duration::from_secs(MIN_WAIT_S) + RUN_TIMEOUT,
        |s| {
            s.pointer("/activeRun/demand").is_some()
                && int_at(s, "/activeRun/evicted").unwrap_or(0) >= 1
        },
    )
    .await
    .unwrap();
    assert_eq!(
        strings_at(&active, "/activeRun/demand/nodes"),
        vec![room.clone()],
        "{active:#}"
    );
    assert_eq!(
        strings_at(&active, "/activeRun/demand/pods"),
        vec![big_key.clone()],
        "{active:#}"
    );
    wait_for("the first evicted mover to be gone", T, || async {
        Ok((watch.seen().gone().len() == 1).then_some(()))
    })
    .await
    .unwrap();
    assert_eq!(
        c.fenced_nodes().await,
        vec![room.clone()],
        "the room is fenced while it drains"
    );
    let running = wait_record(&c, std::slice::from_ref(&big_key), "Running", T).await;
    assert_eq!(strings_at(&running, "/nodes"), vec![room.clone()]);

    let t = Instant::now();
    patch_policy(&c.client, c.name(), json!({"suspend": true}))
        .await
        .unwrap();
    wait_for("the fences to be removed", T, || async {
        Ok(c.fenced_nodes().await.is_empty().then_some(()))
    })
    .await
    .unwrap();
    let fence_gone = t.elapsed();
    let st = wait_status(
        &c.client,
        c.name(),
        "the run to be recorded as finished",
        T,
        has_finished_run,
    )
    .await
    .unwrap();
    let run = st.pointer("/lastRuns/0").unwrap();
    assert_eq!(str_at(run, "/result"), Some("Stopped"), "{run:#}");
    assert_eq!(
        strings_at(run, "/demand/pods"),
        vec![big_key.clone()],
        "{run:#}"
    );
    let st = wait_status(
        &c.client,
        c.name(),
        "the newest demand record to be Stalled",
        T,
        |s| {
            str_at(s, "/demand/recent/0/result") == Some("Stalled")
                && strings_at(s, "/demand/recent/0/pods").contains(&big_key)
        },
    )
    .await
    .unwrap();
    let rec = st.pointer("/demand/recent/0").unwrap().clone();
    let message = str_at(&rec, "/message").unwrap_or_default().to_lowercase();
    assert!(
        message.contains("stop") || message.contains("suspend"),
        "the record says it was stopped: {rec:#}"
    );
    // The hold is released: no nomination left on the pending pod.
    wait_for("the nomination to be cleared", T, || async {
        let p = the_pod(&c, "train-8gpu").await;
        Ok(p.status
            .as_ref()
            .and_then(|s| s.nominated_node_name.as_deref())
            .is_none_or(str::is_empty)
            .then_some(()))
    })
    .await
    .unwrap();
    // Nothing more is evicted, and no run starts while suspended.
    tokio::time::sleep(QUIET).await;
    assert_eq!(
        watch.seen().gone().len(),
        1,
        "an eviction after the stop: {:?}",
        watch.seen().gone()
    );
    let st = policy_status(&c.client, c.name()).await.unwrap();
    assert!(st.get("activeRun").is_none(), "{st:#}");
    release_replacements(&c).await;
    wait_deployments_ready(&c.client, c.name(), &movers, T)
        .await
        .unwrap();
    eprintln!(
        "E2E-FIGURE demand (stop): suspend mid-drain → fence gone in {:.1}s, run Stopped, demand Stalled, no eviction after it",
        fence_gone.as_secs_f64()
    );
    c.cleanup(&[c.name()]).await;
}

/// A gang of two 8-GPU pods (label `scheduling.x-k8s.io/pod-group`), pending.
async fn pending_gang(c: &Case) -> Vec<Pod> {
    let mut d = c.pool.deployment("gang", 2, 8).unwrap();
    d.spec
        .template
        .metadata
        .as_mut()
        .unwrap()
        .labels
        .as_mut()
        .unwrap()
        .insert(GANG_LABEL.to_string(), "gang".to_string());
    c.deployments()
        .create(&PostParams::default(), &d)
        .await
        .unwrap();
    wait_unschedulable(&c.client, c.name(), "app=gang", 2).await
}

/// Room for one member only (node 0: two 2-GPU movers; nodes 1 and 2 half full of bare
/// pods): nothing is evicted, the demand records NoRoom, no member binds.
async fn gang_without_room() -> (Case, f64) {
    let c = Case::new("gang-none", 3, 8).await;
    fill(&c, 1, 4).await;
    fill(&c, 2, 4).await;
    movers_on(&c, 0, &[("mover-a", 2), ("mover-b", 2)], None).await;
    let movers: Vec<String> = ["mover-a", "mover-b"].map(String::from).to_vec();
    allow_one_disruption(&c.client, c.name(), &movers)
        .await
        .unwrap();
    c.create_policy(demand_spec(&c, roomy_limits())).await;
    let _op = Operator::start(c.cluster, c.name(), &[]).await.unwrap();
    let watch = PodWatch::start(&c.client, c.name(), &c.pool, c.name())
        .await
        .unwrap();
    let uids = c.uids().await;
    let gang = pending_gang(&c).await;
    let t0 = Instant::now();
    let keys: Vec<String> = gang.iter().map(key).collect();
    let rec = wait_record(&c, &keys, "NoRoom", Duration::from_secs(MIN_WAIT_S) + T).await;
    let took = t0.elapsed().as_secs_f64();
    assert!(int_at(&rec, "/evictions").unwrap_or(0) == 0, "{rec:#}");
    tokio::time::sleep(QUIET).await;
    let st = policy_status(&c.client, c.name()).await.unwrap();
    assert!(st.get("activeRun").is_none(), "a run started: {st:#}");
    assert!(
        st.pointer("/lastRuns/0").is_none(),
        "a run was recorded: {st:#}"
    );
    assert!(
        watch.seen().gone().is_empty(),
        "evicted for a gang that cannot be served whole: {:?}",
        watch.seen().gone()
    );
    assert_eq!(c.uids().await.len(), uids.len() + 2);
    for (u, name) in &uids {
        assert!(c.uids().await.contains_key(u), "{name} was replaced");
    }
    let now = pods(&c.client, c.name(), "app=gang").await.unwrap();
    assert!(
        now.iter().all(|p| pod_node(p).is_none()),
        "a gang member bound alone: {}",
        where_pods_are(&c.client, c.name()).await
    );
    assert!(c.fenced_nodes().await.is_empty());
    (c, took)
}

/// Room for both members: node 0 holds two 2-GPU movers (4 GPUs free), node 1 four
/// movers of 2, 2, 1 and 1 GPUs (2 free), nodes 2 and 3 three GPUs each of bare pods (5
/// free). Both rooms can be made (six evictions, the movers re-placed on nodes 2 and 3),
/// but only if the first room's movers are not re-placed on node 1, the fullest node and so
/// the bin-packing choice for them: a search that takes the rooms one at a time without
/// keeping the second one free finds no room. Both members run, on nodes 0 and 1.
async fn gang_with_room() -> (Case, f64, Vec<String>) {
    let c = Case::new("gang-both", 4, 8).await;
    fill(&c, 2, 3).await;
    fill(&c, 3, 3).await;
    movers_on(&c, 0, &[("mover-a", 2), ("mover-b", 2)], None).await;
    movers_on(
        &c,
        1,
        &[
            ("mover-c", 2),
            ("mover-d", 2),
            ("mover-e", 1),
            ("mover-f", 1),
        ],
        None,
    )
    .await;
    let movers: Vec<String> = [
        "mover-a", "mover-b", "mover-c", "mover-d", "mover-e", "mover-f",
    ]
    .map(String::from)
    .to_vec();
    allow_one_disruption(&c.client, c.name(), &movers)
        .await
        .unwrap();
    c.create_policy(demand_spec(&c, roomy_limits())).await;
    let _op = Operator::start(c.cluster, c.name(), &[]).await.unwrap();
    let gang = pending_gang(&c).await;
    let t0 = Instant::now();
    let keys: Vec<String> = gang.iter().map(key).collect();
    let r = wait_ready_pods(
        &c.client,
        c.name(),
        "app=gang",
        2,
        Duration::from_secs(MIN_WAIT_S) + RUN_TIMEOUT,
    )
    .await;
    let running = match r {
        Ok(r) => r,
        Err(e) => panic!(
            "{e:#}\npods: {}\nstatus: {:#}",
            where_pods_are(&c.client, c.name()).await,
            policy_status(&c.client, c.name()).await.unwrap_or_default()
        ),
    };
    let took = t0.elapsed().as_secs_f64();
    let mut nodes: Vec<String> = running
        .iter()
        .filter_map(|p| pod_node(p).map(str::to_string))
        .collect();
    nodes.sort();
    let mut expected = c.pool.nodes[..2].to_vec();
    expected.sort();
    assert_eq!(nodes, expected, "one member on each emptied node");
    // The members are the pods that waited (not replacements).
    let uids: BTreeSet<String> = running.iter().map(uid).collect();
    assert_eq!(uids, gang.iter().map(uid).collect());
    let rec = wait_record(&c, &keys, "Served", T).await;
    let mut rec_nodes = strings_at(&rec, "/nodes");
    rec_nodes.sort();
    assert_eq!(rec_nodes, expected, "{rec:#}");
    assert_eq!(int_at(&rec, "/evictions"), Some(6), "{rec:#}");
    // Each member is told its own room's evictions: 2 on node 0, 4 on node 1.
    let mut told = Vec::new();
    for p in &gang {
        told.extend(
            making_room_events(&c.client, c.name(), p.metadata.name.as_deref().unwrap()).await,
        );
    }
    for (node, k) in [(&c.pool.nodes[0], 2), (&c.pool.nodes[1], 4)] {
        let says = format!("making room on {node}: {k} evictions there, 6 for the gang of 2");
        assert!(
            told.iter().any(|m| m.contains(&says)),
            "a MakingRoom Event says {says:?}: {told:?}"
        );
    }
    wait_deployments_ready(&c.client, c.name(), &movers, T)
        .await
        .unwrap();
    (c, took, nodes)
}

/// A gang of two 8-GPU pods is served whole or not at all: with room for one member only
/// nothing is evicted (NoRoom); with room for both each runs on a node of its own.
#[tokio::test]
async fn a_gang_gets_a_node_per_member_or_none() {
    let ((none, none_took), (both, both_took, nodes)) =
        tokio::join!(gang_without_room(), gang_with_room());
    eprintln!(
        "E2E-FIGURE demand (gang): room for one member → NoRoom after {none_took:.1}s, nothing evicted; room for two → both running on {nodes:?} {both_took:.1}s after they were unschedulable"
    );
    none.cleanup(&[none.name()]).await;
    both.cleanup(&[both.name()]).await;
}
