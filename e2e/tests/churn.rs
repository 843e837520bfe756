//! No data loss under churn: while a run executes, the test keeps creating and deleting
//! small GPU Deployments in the same namespace and pool, and records every PDB's status
//! and every group's Ready pods five times a second.
//!
//! ```text
//! 6 nodes × 8 GPUs: 16 one-GPU Deployments infer-NN (4 nodes half full, 2 empty)
//!   4 PDBs over groups of 4 of them, minAvailable 2 (2 disruptions allowed per group)
//! churn task:  every 300 ms create a churn-N Deployment (1 GPU) or delete the oldest
//! sampler:     every 200 ms: PDB status (currentHealthy, desiredHealthy, allowed) and the
//!              Ready pods of each group
//! Enforce run (maxInFlight 2) over the infer pods only (podSelector e2e-role=infer)
//! ```
//!
//! What "a PDB was violated" means here: a group's Ready pods (counted from the pods
//! themselves, and the PDB's own `currentHealthy`) below its `minAvailable` at any sample
//! after the group was first whole. Only the operator disrupts infer pods (churn touches
//! only its own Deployments), so a dip is attributable to the operator's evictions; churn
//! pods are outside every PDB and the policy's scope, and their not-yet-Ready phases do
//! not count.

use std::{
    collections::{BTreeMap, VecDeque},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use gpu_defrag_e2e::{
    case::{Case, T},
    fixtures::{pod_ready, pods, wait_for},
    operator::{
        Operator, PodWatch, ROLE_LABEL, fragment_without_pdbs, int_at, pod_app, str_at, strings_at,
        with_role,
    },
};
use k8s_openapi::api::{apps::v1::Deployment, policy::v1::PodDisruptionBudget};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, PostParams},
};
use serde_json::json;

const GROUPS: usize = 4;
const MIN_AVAILABLE: i32 = 2;
/// Churn Deployments alive at once, at most.
const CHURN_ALIVE: usize = 3;
/// A churn change (create or delete) this often.
const CHURN_EVERY: Duration = Duration::from_millis(300);

/// One sample of a group.
#[derive(Debug, Clone)]
struct GroupSample {
    at: Duration,
    /// Ready, not terminating pods of the group's Deployments.
    ready: usize,
    /// The PDB's status (`None` before the disruption controller wrote one).
    current_healthy: Option<i32>,
    desired_healthy: Option<i32>,
    disruptions_allowed: Option<i32>,
}

type History = BTreeMap<String, Vec<GroupSample>>;

async fn sample(
    client: &Client,
    ns: &str,
    groups: &BTreeMap<String, Vec<String>>,
    t0: Instant,
    history: &Mutex<History>,
) -> anyhow::Result<()> {
    let listed = pods(client, ns, &format!("{ROLE_LABEL}=infer")).await?;
    let pdbs = Api::<PodDisruptionBudget>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await?;
    let at = t0.elapsed();
    let mut h = history.lock().map_err(|_| anyhow::anyhow!("lock"))?;
    for (group, apps) in groups {
        let ready = listed
            .iter()
            .filter(|p| pod_ready(p) && apps.iter().any(|a| a == pod_app(p)))
            .count();
        let status = pdbs
            .items
            .iter()
            .find(|p| p.metadata.name.as_deref() == Some(group))
            .and_then(|p| p.status.clone());
        h.entry(group.clone()).or_default().push(GroupSample {
            at,
            ready,
            current_healthy: status.as_ref().and_then(|s| s.current_healthy),
            desired_healthy: status.as_ref().and_then(|s| s.desired_healthy),
            disruptions_allowed: status.as_ref().and_then(|s| s.disruptions_allowed),
        });
    }
    Ok(())
}

/// Samples of each group after it was first whole whose Ready pods (counted, or the PDB's
/// `currentHealthy`) are below `minAvailable`, described.
fn violations(history: &History, size: usize) -> Vec<String> {
    let mut out = Vec::new();
    for (group, samples) in history {
        let Some(first_whole) = samples.iter().position(|s| s.ready == size) else {
            out.push(format!("{group} never had its {size} pods Ready"));
            continue;
        };
        for s in &samples[first_whole..] {
            let pdb_low =
                matches!((s.current_healthy, s.desired_healthy), (Some(c), Some(d)) if c < d);
            if s.ready < MIN_AVAILABLE as usize || pdb_low || s.disruptions_allowed < Some(0) {
                out.push(format!(
                    "{group} at {:.1}s: {} Ready, PDB currentHealthy {:?} desiredHealthy {:?} disruptionsAllowed {:?}",
                    s.at.as_secs_f64(),
                    s.ready,
                    s.current_healthy,
                    s.desired_healthy,
                    s.disruptions_allowed
                ));
            }
        }
    }
    out
}

/// Creates and deletes `churn-N` Deployments (1 GPU, on the pool) until `stop`; returns
/// how many it created and deleted, and when (since `t0`) each change was made.
async fn churn(c: &Case, stop: Arc<AtomicBool>, t0: Instant) -> (usize, usize, Vec<Duration>) {
    let deployments = c.deployments();
    let mut alive: VecDeque<String> = VecDeque::new();
    let (mut created, mut deleted, mut n) = (0, 0, 0);
    let mut at = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        // Grow to CHURN_ALIVE, then alternate: delete the oldest, create a new one.
        if alive.len() < CHURN_ALIVE && (n % 2 == 0 || alive.is_empty()) {
            let name = format!("churn-{created:03}");
            let d = with_role(c.pool.deployment(&name, 1, 1).unwrap(), "churn").unwrap();
            deployments
                .create(&PostParams::default(), &d)
                .await
                .unwrap();
            alive.push_back(name);
            created += 1;
        } else if let Some(old) = alive.pop_front() {
            deployments
                .delete(&old, &DeleteParams::background())
                .await
                .unwrap();
            deleted += 1;
        }
        n += 1;
        at.push(t0.elapsed());
        tokio::time::sleep(CHURN_EVERY).await;
    }
    (created, deleted, at)
}

#[tokio::test]
async fn churn_during_a_run_loses_no_pod_and_violates_no_pdb() {
    let c = Case::new("churn", 6, 8).await;
    let infer = fragment_without_pdbs(&c.client, c.name(), &c.pool, &[4, 4, 4, 4, 0, 0])
        .await
        .unwrap();
    assert_eq!(infer.len(), 16);
    // Groups across nodes: infer[i] belongs to group i % 4 (each node holds one of each).
    let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (i, app) in infer.iter().enumerate() {
        groups
            .entry(format!("group-{}", i % GROUPS))
            .or_default()
            .push(app.clone());
    }
    let size = infer.len() / GROUPS;
    let pdbs = Api::<PodDisruptionBudget>::namespaced(c.client.clone(), c.name());
    for (group, apps) in &groups {
        let pdb: PodDisruptionBudget = serde_json::from_value(json!({
            "metadata": {"name": group},
            "spec": {
                "minAvailable": MIN_AVAILABLE,
                "selector": {"matchExpressions": [{"key": "app", "operator": "In", "values": apps}]},
            },
        }))
        .unwrap();
        pdbs.create(&PostParams::default(), &pdb).await.unwrap();
    }
    wait_for("every PDB to allow 2 disruptions", T, || async {
        let list = pdbs.list(&ListParams::default()).await?;
        Ok((list.items.len() == GROUPS
            && list.items.iter().all(|p| {
                p.status.as_ref().is_some_and(|s| {
                    s.disruptions_allowed == Some(size as i32 - MIN_AVAILABLE)
                        && s.observed_generation == p.metadata.generation
                })
            }))
        .then_some(()))
    })
    .await
    .unwrap();

    let max_run = 8;
    let mut spec = c.spec(
        json!([{"gpus": 8}]),
        json!({"maxEvictionsPerRun": max_run, "maxEvictionsPerNode": 8,
               "maxEvictionsPerNamespace": 20, "maxInFlight": 2}),
    );
    spec["podSelector"] = json!({"matchLabels": {ROLE_LABEL: "infer"}});
    // Churn makes GPU pods wait for room while nodes are fenced: allow a few.
    spec["safety"]["maxPendingGpuPods"] = json!(CHURN_ALIVE + 2);
    gpu_defrag_e2e::operator::create_policy(&c.client, c.name(), c.name(), spec)
        .await
        .unwrap();
    let op = Operator::start(c.cluster, c.name(), &[]).await.unwrap();
    let planned = c.planned_moves().await;

    // Start sampling and churning, then open the window.
    let watch = PodWatch::start(&c.client, c.name(), &c.pool, c.name())
        .await
        .unwrap();
    let history = Arc::new(Mutex::new(History::new()));
    let t0 = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (client, ns, groups, history, stop) = (
            c.client.clone(),
            c.name().to_string(),
            groups.clone(),
            history.clone(),
            stop.clone(),
        );
        tokio::spawn(async move {
            let mut errors = 0;
            while !stop.load(Ordering::SeqCst) {
                if sample(&client, &ns, &groups, t0, &history).await.is_err() {
                    errors += 1;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            errors
        })
    };
    let churner = churn(&c, stop.clone(), t0);
    let run = async {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let enforced = t0.elapsed();
        c.enforce_now().await;
        let st = c.finished_run().await;
        let finished = t0.elapsed();
        // Keep churning a little after the run.
        tokio::time::sleep(Duration::from_secs(2)).await;
        stop.store(true, Ordering::SeqCst);
        (st, enforced, finished)
    };
    let ((created, deleted, changes), (st, enforced, finished)) = tokio::join!(churner, run);
    let during = changes
        .iter()
        .filter(|t| **t >= enforced && **t <= finished)
        .count();
    let sample_errors = sampler.await.unwrap();
    let churn_secs = t0.elapsed().as_secs_f64();
    let run = st.pointer("/lastRuns/0").unwrap().clone();
    let result = str_at(&run, "/result").unwrap_or("").to_string();
    let evicted = int_at(&run, "/evicted").unwrap_or(0);
    assert!(evicted > 0, "the run evicted nothing: {run:#}");
    assert!(
        ["Succeeded", "Partial"].contains(&result.as_str()),
        "{run:#}"
    );
    assert!(
        during >= 3,
        "{during} churn changes while the run executed ({:.1}s to {:.1}s)",
        enforced.as_secs_f64(),
        finished.as_secs_f64()
    );

    // Every Deployment, churn ones included, has its replicas Ready.
    let deployments = c.deployments();
    wait_for("every Deployment Ready", T, || async {
        let list = deployments.list(&ListParams::default()).await?;
        Ok(list
            .items
            .iter()
            .all(|d: &Deployment| {
                let want = d.spec.replicas.unwrap_or(1);
                d.status
                    .as_ref()
                    .and_then(|s| s.ready_replicas)
                    .unwrap_or(0)
                    == want
                    && d.status.as_ref().and_then(|s| s.replicas).unwrap_or(0) == want
            })
            .then_some(list.items.len()))
    })
    .await
    .unwrap();
    let live = pods(&c.client, c.name(), &format!("{ROLE_LABEL}=infer"))
        .await
        .unwrap();
    assert_eq!(
        live.iter().filter(|p| pod_ready(p)).count(),
        infer.len(),
        "an infer pod was lost"
    );
    assert_eq!(c.fenced_nodes().await, Vec::<String>::new(), "fences left");
    let seen = watch.seen();
    assert_eq!(
        seen.violations,
        BTreeMap::new(),
        "pods bound to fenced nodes"
    );

    // The PDB history.
    let history = history.lock().unwrap().clone();
    let samples = history.values().map(Vec::len).min().unwrap_or(0);
    assert!(
        samples > 20,
        "{samples} samples per group ({sample_errors} errors)"
    );
    let bad = violations(&history, size);
    assert!(bad.is_empty(), "PDB violated: {bad:#?}");
    // The run did disrupt PDB-covered pods (else the check proves nothing): some group's
    // Ready pods dipped below its size during the run.
    let evicted_pods = strings_at(&run, "/evictedPods");
    let dipped: Vec<&String> = history
        .iter()
        .filter(|(_, s)| {
            let first = s.iter().position(|x| x.ready == size).unwrap_or(0);
            s[first..].iter().any(|x| x.ready < size)
        })
        .map(|(g, _)| g)
        .collect();
    let lowest: BTreeMap<&String, usize> = history
        .iter()
        .map(|(g, s)| {
            (
                g,
                s.iter()
                    .skip_while(|x| x.ready < size)
                    .map(|x| x.ready)
                    .min()
                    .unwrap_or(0),
            )
        })
        .collect();
    assert!(
        evicted_pods.iter().all(|p| p.contains("/infer-")),
        "{evicted_pods:?}"
    );
    eprintln!(
        "E2E-FIGURE churn: run {result}, {evicted} evictions (the run planned {}, the dry run before it {planned}; blocked {}) while {created} churn Deployments were created and {deleted} deleted in {churn_secs:.0}s ({during} changes during the {:.1}s from Enforce to the run's end); {samples}+ samples per PDB group, groups that dipped {dipped:?}, lowest Ready per group {lowest:?} (minAvailable {MIN_AVAILABLE} of {size}); 0 violations",
        int_at(&run, "/planned").unwrap_or(0),
        int_at(&run, "/blocked").unwrap_or(0),
        (finished - enforced).as_secs_f64(),
    );
    op.ensure_running().unwrap();
    c.cleanup(&[c.name()]).await;
}
