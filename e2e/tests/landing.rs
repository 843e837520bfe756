//! Landing control on the real control plane (docs/operator.md#landing-control): the
//! replacement of an evicted pod is created gated by the API server's
//! MutatingAdmissionPolicy (config/landing), nominated onto the node its move planned and
//! released; the real kube-scheduler (the gpu-binpack profile) then binds it there.
//!
//! This binary has its own control plane because one test takes the admission path away
//! (deletes the policy binding): it holds [`ADMISSION`] for writing, the others for reading.

use std::time::{Duration, Instant};

use gpu_defrag_e2e::{
    case::{Case, T},
    fixtures::{
        FAKE_IMAGE, GPU_RESOURCE, pod_ready, pods, set_unschedulable, wait_for, wait_ready_pods,
    },
    operator::{
        LANDING_GATE, LANDING_NAMESPACE, Operator, allow_one_disruption, apply_landing_admission,
        install_landing, int_at, landing_configmap, metric_sum, pod_node, str_at, wait_status,
    },
};
use k8s_openapi::api::{
    apps::v1::{Deployment, ReplicaSet},
    core::v1::{ConfigMap, Pod},
};
use kube::{
    Api,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};
use tokio::sync::RwLock;

/// Taken for writing by the test that removes the admission path, for reading by the rest.
static ADMISSION: RwLock<()> = RwLock::const_new(());

/// A bare pod (no controller: never moved) bound to `node` by name.
fn bare_pod(c: &Case, name: &str, node: &str, gpus: u32, cpu: &str) -> Pod {
    let mut limits = json!({"cpu": cpu, "memory": "1Gi"});
    if gpus > 0 {
        limits[GPU_RESOURCE] = json!(gpus.to_string());
    }
    let mut p: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "main",
                "image": FAKE_IMAGE,
                "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}, "limits": limits},
            }],
        },
    }))
    .unwrap();
    c.pool.place(p.spec.as_mut().unwrap()).unwrap();
    p
}

/// Where the two movers of [`tie_case`] were planned and where they landed.
struct TieResult {
    c: Case,
    planned: String,
    other: String,
    run: Value,
    landed: Vec<String>,
}

/// Three 8-GPU nodes: `n0` holds two 1-GPU movers (one-replica Deployments whose PDBs
/// allow one disruption each), `n1` and `n2` six GPUs each of bare pods (never moved); an
/// 8-GPU pod waits. The plan empties `n0` by moving both movers onto one of `n1`, `n2`
/// (equal GPU scores: the planner takes node order); then a CPU-heavy pod goes to the
/// other, so that the gpu-binpack scheduler's MostAllocated score, whose cpu weight breaks
/// the GPU tie, would put them there. Runs the plan in Enforce with the policy's `landing` set to `landing`.
async fn tie_case(prefix: &str, landing: Value) -> TieResult {
    let c = Case::new(prefix, 3, 8).await;
    let nodes = c.pool.nodes.clone();
    let pods_api: Api<Pod> = Api::namespaced(c.client.clone(), c.name());
    for (i, node) in nodes.iter().enumerate().skip(1) {
        let p = bare_pod(&c, &format!("fill-{i}"), node, 6, "100m");
        pods_api.create(&PostParams::default(), &p).await.unwrap();
    }
    // The movers go to n0: the others are cordoned while they are placed.
    set_unschedulable(&c.client, &nodes[1], true).await;
    set_unschedulable(&c.client, &nodes[2], true).await;
    let movers = vec!["mover-a".to_string(), "mover-b".to_string()];
    for m in &movers {
        let d = c.pool.deployment(m, 1, 1).unwrap();
        c.deployments()
            .create(&PostParams::default(), &d)
            .await
            .unwrap();
    }
    wait_ready_pods(&c.client, c.name(), "app in (mover-a,mover-b)", 2, T)
        .await
        .unwrap();
    wait_ready_pods(&c.client, c.name(), "app in (fill-1,fill-2)", 2, T)
        .await
        .unwrap();
    set_unschedulable(&c.client, &nodes[1], false).await;
    set_unschedulable(&c.client, &nodes[2], false).await;
    for p in pods(&c.client, c.name(), "app in (mover-a,mover-b)")
        .await
        .unwrap()
    {
        assert_eq!(pod_node(&p), Some(nodes[0].as_str()), "a mover off n0");
    }
    allow_one_disruption(&c.client, c.name(), &movers)
        .await
        .unwrap();
    c.pending_training_job().await;

    let mut spec = c.spec(
        json!([{"gpus": 8}]),
        json!({"maxEvictionsPerRun": 4, "maxEvictionsPerNode": 4,
               "maxEvictionsPerNamespace": 10, "maxInFlight": 2}),
    );
    spec["landing"] = landing;
    c.create_policy(spec).await;
    let op = Operator::start(c.cluster, c.name(), &[]).await.unwrap();
    let st = wait_status(&c.client, c.name(), "a plan of two moves", T, |s| {
        int_at(s, "/plan/totalMoves") == Some(2)
    })
    .await
    .unwrap();
    let targets: Vec<String> = st["plan"]["moves"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| str_at(m, "/toNode").unwrap_or_default().to_string())
        .collect();
    // n1 and n2 tie on GPUs: the planner takes node order. The CPU-heavy pod goes to the
    // other one, so that the scheduler's cpu tie-break prefers it (the planner's choice
    // does not depend on cpu as long as the movers fit).
    let planned = targets[0].clone();
    assert!(
        targets.iter().all(|t| t == &planned) && (planned == nodes[1] || planned == nodes[2]),
        "the scenario expects both moves planned onto one of {:?}: {:#}",
        &nodes[1..],
        st["plan"]
    );
    let other = if planned == nodes[1] {
        nodes[2].clone()
    } else {
        nodes[1].clone()
    };
    let hog = bare_pod(&c, "cpu-hog", &other, 0, "60");
    pods_api.create(&PostParams::default(), &hog).await.unwrap();
    wait_ready_pods(&c.client, c.name(), "app=cpu-hog", 1, T)
        .await
        .unwrap();
    c.enforce_now().await;
    let st = c.finished_run().await;
    let run = st.pointer("/lastRuns/0").unwrap().clone();
    assert_eq!(str_at(&run, "/result"), Some("Succeeded"), "{run:#}");
    let landed: Vec<String> =
        wait_ready_pods(&c.client, c.name(), "app in (mover-a,mover-b)", 2, T)
            .await
            .unwrap()
            .iter()
            .filter_map(|p| pod_node(p).map(str::to_string))
            .collect();
    let train = c.training_job_running(T).await;
    assert_eq!(train, nodes[0], "the 8-GPU pod runs on the emptied node");
    let metrics = op.metrics().await.unwrap();
    eprintln!(
        "{prefix}: landing_actions_total nominated {}, landings_total planned {} elsewhere {}",
        metric_sum(
            &metrics,
            "gpu_defrag_landing_actions_total",
            &[("kind", "nominated")]
        ),
        metric_sum(
            &metrics,
            "gpu_defrag_landings_total",
            &[("result", "planned")]
        ),
        metric_sum(
            &metrics,
            "gpu_defrag_landings_total",
            &[("result", "elsewhere")]
        ),
    );
    TieResult {
        planned,
        other,
        c,
        run,
        landed,
    }
}

/// Where MostAllocated would pick another node than the plan: with landing control
/// (`Nominate`, the default) every replacement lands on its planned node; with
/// `landing: {mode: Scheduler}` the scheduler puts them elsewhere. Both run side by side;
/// the second proves the scenario tells the two apart (a scheduler that ignored the
/// nomination fails the first).
#[tokio::test]
async fn replacements_land_on_their_planned_node_where_the_scheduler_would_not() {
    let _admission = ADMISSION.read().await;
    let (on, off) = tokio::join!(
        tie_case("land-on", json!({"mode": "Nominate", "holdTimeout": "30s"})),
        tie_case("land-off", json!({"mode": "Scheduler"})),
    );
    let share = |r: &TieResult| {
        let planned = int_at(&r.run, "/landedAsPlanned").unwrap_or(0);
        let elsewhere = int_at(&r.run, "/landedElsewhere").unwrap_or(0);
        (planned, elsewhere)
    };
    let (on_planned, on_elsewhere) = share(&on);
    let (off_planned, off_elsewhere) = share(&off);
    eprintln!(
        "E2E-FIGURE landing (tie): with landing control {on_planned}/{} replacements on their planned node (landed on {:?}, planned {}); with landing: Scheduler {off_planned}/{} (landed on {:?}, planned {})",
        on_planned + on_elsewhere,
        on.landed,
        on.planned,
        off_planned + off_elsewhere,
        off.landed,
        off.planned,
    );
    assert_eq!(
        (on_planned, on_elsewhere),
        (2, 0),
        "with landing control: {:#}",
        on.run
    );
    assert!(
        on.landed.iter().all(|n| n == &on.planned),
        "{:?} vs planned {}",
        on.landed,
        on.planned
    );
    // The scheduler alone breaks the GPU tie on cpu: the scenario is one where landing
    // control changes the outcome.
    assert!(
        off.landed.iter().all(|n| n == &off.other),
        "without landing control the replacements landed on {:?}, expected {}",
        off.landed,
        off.other
    );
    assert_eq!((off_planned, off_elsewhere), (0, 2), "{:#}", off.run);
    let messages = |r: &TieResult| str_at(&r.run, "/message").unwrap_or_default().to_string();
    assert!(
        messages(&off).contains("elsewhere"),
        "the run says its replacements landed elsewhere: {:#}",
        off.run
    );
    on.c.cleanup(&[on.c.name()]).await;
    off.c.cleanup(&[off.c.name()]).await;
}

/// The ReplicaSet of Deployment `app` in the case's namespace.
async fn replicaset_of(c: &Case, app: &str) -> String {
    let rs: Api<ReplicaSet> = Api::namespaced(c.client.clone(), c.name());
    rs.list(&ListParams::default().labels(&format!("app={app}")))
        .await
        .unwrap()
        .items
        .into_iter()
        .find_map(|r| r.metadata.name)
        .expect("the Deployment's ReplicaSet")
}

/// Writes, as the admin, the landing ConfigMap of the case's operator listing `app`'s
/// ReplicaSet: the state a process killed while an eviction was in flight leaves behind.
async fn list_workload(c: &Case, app: &str) -> String {
    let rs = replicaset_of(c, app).await;
    let name = landing_configmap(c.name());
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": LANDING_NAMESPACE,
                     "labels": {"gpu-defrag.io/landing-params": "true"}},
        "data": {format!("{}.ReplicaSet.{rs}", c.name()): c.name()},
    }))
    .unwrap();
    Api::<ConfigMap>::namespaced(c.client.clone(), LANDING_NAMESPACE)
        .patch(
            &name,
            &PatchParams::apply("e2e-landing").force(),
            &Patch::Apply(&cm),
        )
        .await
        .unwrap();
    name
}

async fn scale(c: &Case, app: &str, replicas: i32) {
    c.deployments()
        .patch(
            app,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": replicas}})),
        )
        .await
        .unwrap();
}

fn gated(p: &Pod) -> bool {
    p.spec
        .as_ref()
        .and_then(|s| s.scheduling_gates.as_ref())
        .is_some_and(|g| g.iter().any(|g| g.name == LANDING_GATE))
}

/// The newest pod of `app` once there are `n`.
async fn newest_pod(c: &Case, app: &str, n: usize) -> Pod {
    wait_for("the new pod", T, || async {
        let mut ps = pods(&c.client, c.name(), &format!("app={app}")).await?;
        if ps.len() < n {
            return Ok(None);
        }
        ps.sort_by_key(|p| p.metadata.creation_timestamp.clone());
        Ok(ps.pop())
    })
    .await
    .unwrap()
}

/// A process killed mid-hold leaves its ConfigMap listing a workload, and pods created
/// meanwhile stay gated: the next process's start-up sweep releases them (and empties the
/// ConfigMap), and they schedule.
#[tokio::test]
async fn a_pod_left_held_is_released_by_the_restart_sweep() {
    let _admission = ADMISSION.read().await;
    let c = Case::new("sweep", 1, 8).await;
    install_landing(c.cluster, &c.client).await.unwrap();
    let d = c.pool.deployment("held", 1, 1).unwrap();
    c.deployments()
        .create(&PostParams::default(), &d)
        .await
        .unwrap();
    wait_ready_pods(&c.client, c.name(), "app=held", 1, T)
        .await
        .unwrap();
    let cm = list_workload(&c, "held").await;
    // The API server reads admission parameters from its informer: retry until a new
    // pod is gated (each attempt scales up by one).
    let mut replicas = 1;
    let p = loop {
        replicas += 1;
        tokio::time::sleep(Duration::from_secs(1)).await;
        scale(&c, "held", replicas).await;
        let p = newest_pod(&c, "held", replicas as usize).await;
        if gated(&p) || replicas >= 5 {
            break p;
        }
    };
    assert!(
        gated(&p),
        "a pod of a listed workload is created gated: {p:?}"
    );
    let name = p.metadata.name.clone().unwrap();
    assert_eq!(
        p.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(LANDING_GATE))
            .map(String::as_str),
        Some(cm.as_str()),
        "labelled with the ConfigMap that listed it"
    );
    // Nobody releases it meanwhile.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let pods_api: Api<Pod> = Api::namespaced(c.client.clone(), c.name());
    let still = pods_api.get(&name).await.unwrap();
    assert!(gated(&still) && pod_node(&still).is_none(), "{still:?}");

    let op = Operator::start(c.cluster, c.name(), &[]).await.unwrap();
    let t0 = Instant::now();
    wait_for("the held pod to run", T, || async {
        let p = pods_api.get(&name).await?;
        Ok((pod_ready(&p) && !gated(&p)).then_some(()))
    })
    .await
    .unwrap();
    let released_in = t0.elapsed();
    let cms: Api<ConfigMap> = Api::namespaced(c.client.clone(), LANDING_NAMESPACE);
    wait_for("the ConfigMap to be emptied", T, || async {
        let m = cms.get(&cm).await?;
        Ok(m.data.unwrap_or_default().is_empty().then_some(()))
    })
    .await
    .unwrap();
    let metrics = op.metrics().await.unwrap();
    let released = metric_sum(
        &metrics,
        "gpu_defrag_landing_actions_total",
        &[("kind", "swept")],
    );
    assert!(released >= 1.0, "{metrics}");
    eprintln!(
        "E2E-FIGURE landing (sweep): a pod left held ran {:.1}s after the operator started",
        released_in.as_secs_f64()
    );
    // Every pod of the workload runs, none is gated.
    let all = wait_ready_pods(&c.client, c.name(), "app=held", replicas as usize, T)
        .await
        .unwrap();
    assert!(all.iter().all(|p| !gated(p)));
    cms.delete(&cm, &Default::default()).await.unwrap();
}

/// Re-applies config/landing/admission.yaml when dropped (the test removes its binding).
struct RestoreAdmission(&'static gpu_defrag_e2e::cluster::TestCluster);

impl Drop for RestoreAdmission {
    fn drop(&mut self) {
        if let Err(e) = apply_landing_admission(self.0) {
            eprintln!("could not restore the landing admission policy: {e:#}");
        }
    }
}

/// With the admission path gone (no policy binding), pods of a listed workload are created
/// ungated and schedule normally.
#[tokio::test]
async fn without_the_admission_path_pods_schedule_normally() {
    let _admission = ADMISSION.write().await;
    let c = Case::new("noadm", 1, 8).await;
    install_landing(c.cluster, &c.client).await.unwrap();
    let _restore = RestoreAdmission(c.cluster);
    let out = c
        .cluster
        .kubectl()
        .args([
            "delete",
            "mutatingadmissionpolicybinding",
            "gpu-defrag-landing",
            "--wait=true",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let d: Deployment = c.pool.deployment("free", 1, 1).unwrap();
    c.deployments()
        .create(&PostParams::default(), &d)
        .await
        .unwrap();
    wait_ready_pods(&c.client, c.name(), "app=free", 1, T)
        .await
        .unwrap();
    let cm = list_workload(&c, "free").await;
    // Long enough for the API server's admission informers to see both changes.
    tokio::time::sleep(Duration::from_secs(3)).await;
    scale(&c, "free", 3).await;
    let t0 = Instant::now();
    let all = wait_ready_pods(&c.client, c.name(), "app=free", 3, T)
        .await
        .unwrap();
    assert!(all.iter().all(|p| !gated(p)), "{all:?}");
    eprintln!(
        "E2E-FIGURE landing (no admission): 2 new pods of a listed workload ran {:.1}s after the scale-up, ungated",
        t0.elapsed().as_secs_f64()
    );
    Api::<ConfigMap>::namespaced(c.client.clone(), LANDING_NAMESPACE)
        .delete(&cm, &Default::default())
        .await
        .unwrap();
}

/// An HA inference Deployment (two replicas, required anti-affinity across nodes) moves
/// under landing control, and only to a node where its anti-affinity holds. Three 8-GPU
/// nodes: `n0` holds one replica, `n1` the other beside six GPUs of bare pods (one GPU
/// free: the fullest node, MostAllocated's first choice, but the twin is there), `n2` five
/// GPUs of bare pods (three free); an 8-GPU pod waits. The plan empties `n0` by moving its
/// replica to `n2`; the real scheduler binds the replacement there and both replicas stay
/// on different nodes.
#[tokio::test]
async fn an_ha_replica_moves_only_where_its_anti_affinity_holds() {
    let _admission = ADMISSION.read().await;
    let c = Case::new("land-ha", 3, 8).await;
    let nodes = c.pool.nodes.clone();
    let pods_api: Api<Pod> = Api::namespaced(c.client.clone(), c.name());
    for (i, gpus) in [(1, 6), (2, 5)] {
        let p = bare_pod(&c, &format!("fill-{i}"), &nodes[i], gpus, "100m");
        pods_api.create(&PostParams::default(), &p).await.unwrap();
    }
    set_unschedulable(&c.client, &nodes[2], true).await;
    let mut d = c.pool.deployment("infer", 2, 1).unwrap();
    let spec = d.spec.template.spec.as_mut().unwrap();
    spec.affinity = Some(
        serde_json::from_value(json!({"podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [{
                "labelSelector": {"matchLabels": {"app": "infer"}},
                "topologyKey": "kubernetes.io/hostname"}]}}))
        .unwrap(),
    );
    c.deployments()
        .create(&PostParams::default(), &d)
        .await
        .unwrap();
    let placed = wait_ready_pods(&c.client, c.name(), "app=infer", 2, T)
        .await
        .unwrap();
    wait_ready_pods(&c.client, c.name(), "app in (fill-1,fill-2)", 2, T)
        .await
        .unwrap();
    set_unschedulable(&c.client, &nodes[2], false).await;
    let mut on: Vec<String> = placed
        .iter()
        .filter_map(|p| pod_node(p).map(str::to_string))
        .collect();
    on.sort();
    let mut want = vec![nodes[0].clone(), nodes[1].clone()];
    want.sort();
    assert_eq!(on, want, "one replica each on n0, n1");
    allow_one_disruption(&c.client, c.name(), &["infer".to_string()])
        .await
        .unwrap();
    c.pending_training_job().await;

    let spec = c.spec(
        json!([{"gpus": 8}]),
        json!({"maxEvictionsPerRun": 4, "maxEvictionsPerNode": 4,
               "maxEvictionsPerNamespace": 10, "maxInFlight": 1}),
    );
    c.create_policy(spec).await;
    let _op = Operator::start(c.cluster, c.name(), &[]).await.unwrap();
    let st = wait_status(&c.client, c.name(), "a plan of one move", T, |s| {
        int_at(s, "/plan/totalMoves") == Some(1)
    })
    .await
    .unwrap();
    let planned = str_at(&st["plan"]["moves"][0], "/toNode")
        .unwrap_or_default()
        .to_string();
    assert_eq!(
        planned, nodes[2],
        "the replica's only target where its anti-affinity holds: {:#}",
        st["plan"]
    );
    c.enforce_now().await;
    let st = c.finished_run().await;
    let run = st.pointer("/lastRuns/0").unwrap().clone();
    assert_eq!(str_at(&run, "/result"), Some("Succeeded"), "{run:#}");
    assert_eq!(int_at(&run, "/landedAsPlanned"), Some(1), "{run:#}");
    let mut landed: Vec<String> = wait_ready_pods(&c.client, c.name(), "app=infer", 2, T)
        .await
        .unwrap()
        .iter()
        .filter_map(|p| pod_node(p).map(str::to_string))
        .collect();
    landed.sort();
    let mut want = vec![nodes[1].clone(), nodes[2].clone()];
    want.sort();
    assert_eq!(landed, want, "the replicas keep apart");
    let train = c.training_job_running(T).await;
    assert_eq!(train, nodes[0], "the 8-GPU pod runs on the emptied node");
    eprintln!(
        "E2E-FIGURE landing (HA anti-affinity): replica moved {} -> {planned}, replicas on {landed:?}",
        nodes[0]
    );
    c.cleanup(&[c.name()]).await;
}
