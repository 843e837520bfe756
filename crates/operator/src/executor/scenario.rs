//! The run's shell against a mocked API server, end to end: start → record → fence → evict
//! → the replacement Ready → unfence → the run recorded as succeeded. The mocked server
//! keeps the node (taints patched in) and, when the eviction is accepted, the pod cache
//! sees the evicted pod go and its replacement come up Ready on the planned node, as the
//! ReplicaSet and the scheduler would.
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{TimeDelta, Utc};
use gpu_defrag_api::v1alpha1::{DefragPolicy, DefragPolicySpec, RunRecord};
use http::{Request, Response};
use http_body_util::BodyExt;
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Client;
use kube::core::PartialObjectMeta;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher;
use serde_json::{Value, json};

use crate::context::{Ctx, Events};
use crate::dra::DraObjects;
use crate::koord::Devices;
use crate::landing::Landing;
use crate::lease::LeaderState;
use crate::metrics::Metrics;
use crate::objects::{CachedPod, trim_node};
use crate::owners::Owners;

/// What the mocked server saw: method and path, and the JSON body.
type Seen = Arc<Mutex<Vec<(String, Value)>>>;

fn ago(minutes: i64) -> String {
    (Utc::now() - TimeDelta::minutes(minutes)).to_rfc3339()
}

fn node(name: &str) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": name, "resourceVersion": "1"},
        "status": {
            "allocatable": {"nvidia.com/gpu": "8", "cpu": "64", "memory": "512Gi", "pods": "110"},
            "capacity": {"nvidia.com/gpu": "8", "cpu": "64", "memory": "512Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": ago(600)}]
        }
    }))
    .unwrap()
}

/// A Running, Ready pod of ReplicaSet `rs` on `node` asking `gpus` GPUs.
fn pod(name: &str, uid: &str, rs: &str, node: &str, gpus: u32, age_minutes: i64) -> CachedPod {
    let p: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ml", "uid": uid,
            "creationTimestamp": ago(age_minutes),
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": rs,
                                 "uid": format!("rs-{rs}"), "controller": true}]},
        "spec": {"nodeName": node, "schedulerName": "gpu-binpack", "containers": [{"name": "c", "resources": {
            "requests": {"nvidia.com/gpu": gpus.to_string(), "cpu": "1", "memory": "1Gi"},
            "limits": {"nvidia.com/gpu": gpus.to_string()}}}]},
        "status": {"phase": "Running", "startTime": ago(age_minutes),
                   "conditions": [{"type": "Ready", "status": "True"}]}
    }))
    .unwrap();
    CachedPod::of(&p)
}

fn replica_set(name: &str) -> PartialObjectMeta<ReplicaSet> {
    serde_json::from_value(json!({
        "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
        "metadata": {"name": name, "namespace": "ml", "uid": format!("rs-{name}"),
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": name,
                                 "uid": format!("d-{name}"), "controller": true}]}
    }))
    .unwrap()
}

/// The mocked API server (see the module doc).
fn mocked(
    nodes: Arc<Mutex<HashMap<String, Value>>>,
    pods: Arc<Mutex<Writer<CachedPod>>>,
) -> (Client, Seen) {
    let seen: Seen = Arc::default();
    let log = seen.clone();
    let service = tower::service_fn(move |req: Request<kube::client::Body>| {
        let (log, nodes, pods) = (log.clone(), nodes.clone(), pods.clone());
        async move {
            let method = req.method().to_string();
            let path = req.uri().path().to_string();
            let body = req.into_body().collect().await?.to_bytes();
            let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            log.lock()
                .unwrap()
                .push((format!("{method} {path}"), body.clone()));
            let (code, reply) = if let Some(name) = path.strip_prefix("/api/v1/nodes/") {
                let mut nodes = nodes.lock().unwrap();
                match nodes.get_mut(name) {
                    None => (
                        404,
                        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404, "reason": "NotFound"}),
                    ),
                    Some(n) => {
                        if method == "PATCH" {
                            if let Some(t) = body.pointer("/spec/taints") {
                                n["spec"]["taints"] = t.clone();
                            }
                            let rv: u64 = n["metadata"]["resourceVersion"]
                                .as_str()
                                .unwrap_or("1")
                                .parse()
                                .unwrap_or(1);
                            n["metadata"]["resourceVersion"] = json!((rv + 1).to_string());
                        }
                        (200, n.clone())
                    }
                }
            } else if path.ends_with("/eviction") {
                // The ReplicaSet replaces the pod; the scheduler binds it on n2; it is Ready.
                let name = path.rsplit('/').nth(1).unwrap_or_default().to_string();
                let mut w = pods.lock().unwrap();
                w.apply_watcher_event(&watcher::Event::Delete(pod(
                    &name,
                    &format!("uid-{name}"),
                    "web",
                    "n1",
                    1,
                    60,
                )));
                w.apply_watcher_event(&watcher::Event::Apply(pod(
                    "web-new",
                    "uid-web-new",
                    "web",
                    "n2",
                    1,
                    0,
                )));
                (
                    201,
                    json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}),
                )
            } else if path.contains("/defragpolicies/") {
                (
                    200,
                    json!({"apiVersion": "gpu-defrag.io/v1alpha1", "kind": "DefragPolicy",
                             "metadata": {"name": "nightly"}, "spec": {}}),
                )
            } else {
                (201, body)
            };
            Ok::<_, kube::Error>(
                Response::builder()
                    .status(code)
                    .header("content-type", "application/json")
                    .body(kube::client::Body::from(
                        serde_json::to_vec(&reply).unwrap(),
                    ))
                    .unwrap(),
            )
        }
    });
    (Client::new(service, "default"), seen)
}

/// The status patches' `lastRuns[0]` and `activeRun`, in order.
fn status_patches(seen: &Seen) -> Vec<Value> {
    seen.lock()
        .unwrap()
        .iter()
        .filter(|(t, _)| t.contains("/defragpolicies/nightly/status"))
        .map(|(_, b)| b["status"].clone())
        .collect()
}

#[tokio::test]
async fn a_run_fences_evicts_waits_for_the_replacement_unfences_and_succeeds() {
    // n1: one 1-GPU replica of `web` (2 replicas); n2: the other one and a 4-GPU pod of a
    // single-replica workload (never moved). Moving web-a onto n2 frees n1.
    let nodes: HashMap<String, Value> = ["n1", "n2"]
        .iter()
        .map(|n| (n.to_string(), serde_json::to_value(node(n)).unwrap()))
        .collect();
    let nodes = Arc::new(Mutex::new(nodes));
    let (pod_store, mut pod_writer) = kube::runtime::reflector::store::<CachedPod>();
    for p in [
        pod("web-a", "uid-web-a", "web", "n1", 1, 60),
        pod("web-b", "uid-web-b", "web", "n2", 1, 60),
        pod("big", "uid-big", "big", "n2", 4, 60),
    ] {
        pod_writer.apply_watcher_event(&watcher::Event::Apply(p));
    }
    let pod_writer = Arc::new(Mutex::new(pod_writer));
    let (node_store, mut node_writer) = kube::runtime::reflector::store::<Node>();
    for n in ["n1", "n2"] {
        let mut n = node(n);
        trim_node(&mut n);
        node_writer.apply_watcher_event(&watcher::Event::Apply(n));
    }
    let (rs_store, mut rs_writer) =
        kube::runtime::reflector::store::<PartialObjectMeta<ReplicaSet>>();
    for rs in ["web", "big"] {
        rs_writer.apply_watcher_event(&watcher::Event::Apply(replica_set(rs)));
    }
    let (client, seen) = mocked(nodes.clone(), pod_writer.clone());
    let reporter = Reporter {
        controller: "gpu-defrag".into(),
        instance: None,
    };
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        nodes: node_store,
        pods: pod_store,
        pdbs: Writer::default().as_reader(),
        policies: Writer::default().as_reader(),
        metrics: Metrics::new(),
        leader: LeaderState::always(),
        events: Events::new(Recorder::new(client.clone(), reporter)),
        runs: tokio::sync::Mutex::new(HashMap::new()),
        caches_ready: Arc::new(std::sync::atomic::AtomicBool::new(true)),
        failures: Default::default(),
        devices: Devices::unwatched(),
        owners: Owners::fixed(rs_store),
        dra: DraObjects::unwatched(),
        dry_checks: tokio::sync::Mutex::new(HashMap::new()),
        idle: None,
        landing: Arc::new(Landing::new(
            client,
            "gpu-defrag-system",
            "gpu-defrag-landing",
        )),
    });
    let spec: DefragPolicySpec = serde_json::from_value(json!({
        "mode": "Enforce", "landing": {"mode": "Scheduler"}, "target": {"shapes": [{"gpus": 8}]}
    }))
    .unwrap();
    let dp = Arc::new(DefragPolicy::new("nightly", spec));
    let policy = gpu_defrag_core::policy::Policy::from_spec(&dp.spec).unwrap();
    let end = Utc::now() + TimeDelta::hours(1);
    super::start(ctx.clone(), dp, policy, end, super::Start::Window).await;
    let handle = ctx.runs.lock().await.remove("nightly").expect("a run task");
    tokio::time::timeout(Duration::from_secs(20), handle.task)
        .await
        .expect("the run ends")
        .expect("the run task does not panic");

    // The order of the effects: recorded, fenced, evicted, unfenced, recorded.
    let effects: Vec<String> = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|(t, _)| !t.contains("/events") && !t.starts_with("GET"))
        .map(|(t, b)| match t.as_str() {
            t if t.ends_with("/status") && b["status"]["activeRun"].is_object() => {
                "record".to_string()
            }
            t if t.ends_with("/status") => "finish".to_string(),
            t if t.ends_with("/eviction") => {
                format!("evict {}", t.rsplit('/').nth(1).unwrap_or_default())
            }
            t if t.starts_with("PATCH /api/v1/nodes/") => {
                let fenced = b
                    .pointer("/spec/taints")
                    .and_then(Value::as_array)
                    .is_some_and(|t| !t.is_empty());
                format!(
                    "{} {}",
                    if fenced { "fence" } else { "unfence" },
                    t.rsplit('/').next().unwrap_or_default()
                )
            }
            other => other.to_string(),
        })
        .collect();
    let first = |what: &str| {
        effects
            .iter()
            .position(|e| e == what)
            .unwrap_or_else(|| panic!("no {what} in {effects:?}"))
    };
    assert!(first("record") < first("fence n1"), "{effects:?}");
    assert!(first("fence n1") < first("evict web-a"), "{effects:?}");
    assert!(first("evict web-a") < first("unfence n1"), "{effects:?}");
    assert!(first("unfence n1") < first("finish"), "{effects:?}");
    assert_eq!(
        effects.iter().filter(|e| e.starts_with("evict")).count(),
        1,
        "{effects:?}"
    );
    // The taint is off n1 at the end.
    let n1 = nodes.lock().unwrap()["n1"].clone();
    assert!(
        n1.pointer("/spec/taints")
            .and_then(Value::as_array)
            .is_none_or(|t| t.is_empty()),
        "{n1}"
    );
    // Recorded in flight before the eviction, then the run's result.
    let patches = status_patches(&seen);
    let in_flight = patches.iter().position(|s| {
        s["activeRun"]["inFlight"]
            .as_array()
            .is_some_and(|f| !f.is_empty())
    });
    assert!(
        in_flight.is_some(),
        "the eviction was recorded as in flight: {patches:?}"
    );
    let last = patches.last().unwrap();
    assert!(last.get("activeRun").is_none_or(Value::is_null), "{last}");
    let run: RunRecord = serde_json::from_value(last["lastRuns"][0].clone()).unwrap();
    assert_eq!(run.result, "Succeeded", "{}", run.message);
    assert_eq!((run.planned, run.evicted, run.skipped), (1, 1, 0));
    assert!(run.in_flight.is_empty());
    assert_eq!(run.evicted_pods, ["ml/web-a"]);
}
