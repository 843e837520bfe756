//! Safe runs on the real local control plane: a run stops at once when its policy is
//! switched to DryRun, suspended or deleted (also with the operator down at the time), its
//! fences belong to it alone, a drain unit is given up at its first unsafe eviction, a
//! resumed run waits for the replacement its last process did not see, and evictions
//! carry the pod's UID as a precondition.
//!
//! A run is held in the middle of its plan with a ResourceQuota that lets no replacement
//! be created ([`hold_replacements`]): the run has evicted one pod and waits for its
//! replacement, which is exactly when an SRE's stop must take effect.

use std::time::{Duration, Instant};

use gpu_defrag_e2e::{
    case::{
        Case, QUIET, RUN_TIMEOUT, T, has_finished_run, hold_replacements, release_replacements,
    },
    fixtures::{FAKE_IMAGE, pods, wait_for},
    operator::{
        Operator, PodWatch, create_policy, delete_policy, fences, fragment, int_at,
        open_window_this_minute, patch_policy, pod_node, policies, policy_status, str_at,
        strings_at, wait_deployments_ready, wait_status,
    },
};
use k8s_openapi::api::{
    core::v1::{Node, Pod},
    policy::v1::PodDisruptionBudget,
};
use kube::{
    Api,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};

/// A run held after its first eviction: the pool fragmented as `make demo` does (4 nodes,
/// 4 one-GPU pods each), a policy evicting one pod at a time, its operator, and the
/// replacement of the first evicted pod held back. Returns the kept Deployments, the
/// operator and a watch of the pods.
async fn held_run(c: &Case) -> (Vec<String>, Operator, PodWatch) {
    let infer = fragment(&c.client, c.name(), &c.pool, &[4, 4, 4, 4])
        .await
        .unwrap();
    c.one_at_a_time_policy(7).await;
    let op = Operator::start(c.cluster, c.name(), &[]).await.unwrap();
    assert_eq!(
        c.planned_moves().await,
        4,
        "the dry-run plan empties one node"
    );
    hold_replacements(c, 1).await;
    let watch = PodWatch::start(&c.client, c.name(), &c.pool, c.name())
        .await
        .unwrap();
    c.enforce_now().await;
    c.first_eviction().await;
    wait_for("the first evicted pod to be gone", T, || async {
        Ok((watch.seen().gone().len() == 1).then_some(()))
    })
    .await
    .unwrap();
    assert!(
        !c.fenced_nodes().await.is_empty(),
        "the run fenced its node"
    );
    (infer, op, watch)
}

/// Waits until the pool carries no fence; returns how long that took.
async fn fences_gone(c: &Case, since: Instant) -> Duration {
    wait_for("the fences to be removed", T, || async {
        Ok(c.fenced_nodes().await.is_empty().then_some(()))
    })
    .await
    .unwrap();
    since.elapsed()
}

/// Nothing else is evicted for [`QUIET`]; then the held replacement is let go and every
/// Deployment is Ready again.
async fn nothing_more_and_release(c: &Case, infer: &[String], watch: &PodWatch) {
    tokio::time::sleep(QUIET).await;
    assert_eq!(
        watch.seen().gone().len(),
        1,
        "an eviction after the stop: {:?}",
        watch.seen().gone()
    );
    release_replacements(c).await;
    wait_deployments_ready(&c.client, c.name(), infer, T)
        .await
        .unwrap();
}

/// Waits until the case's policy object is gone (its finalizer removed).
async fn policy_gone(c: &Case) {
    wait_for("the policy to be gone", T, || async {
        Ok(policies(&c.client)
            .get_opt(c.name())
            .await?
            .is_none()
            .then_some(()))
    })
    .await
    .unwrap();
}

/// The last run's result and message once it has finished.
async fn last_run(c: &Case) -> (String, String) {
    let st = wait_status(
        &c.client,
        c.name(),
        "the run to be recorded as finished",
        T,
        has_finished_run,
    )
    .await
    .unwrap();
    (
        str_at(&st, "/lastRuns/0/result").unwrap_or("").to_string(),
        str_at(&st, "/lastRuns/0/message").unwrap_or("").to_string(),
    )
}

#[tokio::test]
async fn switching_to_dry_run_stops_the_run_and_takes_its_fences_back() {
    let c = Case::new("stop-dryrun", 4, 8).await;
    let (infer, _op, watch) = held_run(&c).await;
    let t = Instant::now();
    patch_policy(&c.client, c.name(), json!({"mode": "DryRun"}))
        .await
        .unwrap();
    let took = fences_gone(&c, t).await;
    let (result, message) = last_run(&c).await;
    assert_eq!(result, "Stopped", "{message}");
    assert!(message.contains("switched to DryRun"), "{message}");
    nothing_more_and_release(&c, &infer, &watch).await;
    eprintln!(
        "E2E-FIGURE stop: DryRun switch mid-run (a replacement pending) → fences gone in {:.1}s, run Stopped, no eviction after it",
        took.as_secs_f64()
    );
    c.cleanup(&[c.name()]).await;
}

#[tokio::test]
async fn suspend_stops_the_run_and_no_new_run_starts() {
    let c = Case::new("stop-suspend", 4, 8).await;
    let (infer, _op, watch) = held_run(&c).await;
    let t = Instant::now();
    patch_policy(&c.client, c.name(), json!({"suspend": true}))
        .await
        .unwrap();
    let took = fences_gone(&c, t).await;
    let (result, message) = last_run(&c).await;
    assert_eq!(result, "Stopped", "{message}");
    assert!(message.contains("suspended"), "{message}");
    nothing_more_and_release(&c, &infer, &watch).await;
    // Still suspended in an open window with a plan: no run, and the condition says why.
    let st = policy_status(&c.client, c.name()).await.unwrap();
    assert!(st.get("activeRun").is_none(), "{st:#}");
    let executing = st["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Executing")
        .cloned()
        .unwrap_or_default();
    assert_eq!(executing["status"], "False", "{executing}");
    assert!(
        executing["message"]
            .as_str()
            .unwrap_or("")
            .contains("suspended"),
        "{executing}"
    );
    eprintln!(
        "E2E-FIGURE stop: suspend mid-run → fences gone in {:.1}s, run Stopped",
        took.as_secs_f64()
    );
    c.cleanup(&[c.name()]).await;
}

#[tokio::test]
async fn deleting_the_policy_mid_run_leaves_no_fence_even_with_the_operator_down() {
    let c = Case::new("stop-delete", 4, 8).await;
    let (infer, mut op, watch) = held_run(&c).await;
    // The operator goes away; the policy is deleted while it is down.
    op.kill();
    delete_policy(&c.client, c.name()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let still = policies(&c.client).get_opt(c.name()).await.unwrap();
    let still = still.expect("the finalizer keeps the policy until its fences are gone");
    assert!(still.metadata.deletion_timestamp.is_some());
    assert!(
        !c.fenced_nodes().await.is_empty(),
        "nobody removed the fences yet"
    );
    // A new process takes the fences back, then lets the policy go.
    let t = Instant::now();
    let _op2 = Operator::start(c.cluster, c.name(), &[]).await.unwrap();
    let took = fences_gone(&c, t).await;
    policy_gone(&c).await;
    nothing_more_and_release(&c, &infer, &watch).await;
    eprintln!(
        "E2E-FIGURE stop: policy deleted mid-run with the operator down → restarted operator removed the fences in {:.1}s and released the policy",
        took.as_secs_f64()
    );
}

#[tokio::test]
async fn deleting_the_policy_mid_run_stops_it_at_once() {
    let c = Case::new("stop-delete-live", 4, 8).await;
    let (infer, _op, watch) = held_run(&c).await;
    let t = Instant::now();
    delete_policy(&c.client, c.name()).await.unwrap();
    let took = fences_gone(&c, t).await;
    policy_gone(&c).await;
    nothing_more_and_release(&c, &infer, &watch).await;
    eprintln!(
        "E2E-FIGURE stop: policy deleted mid-run → fences gone in {:.1}s, policy released",
        took.as_secs_f64()
    );
}

#[tokio::test]
async fn two_policies_on_the_same_nodes_each_keep_their_own_fence() {
    let c = Case::new("own-fences", 4, 8).await;
    let infer = fragment(&c.client, c.name(), &c.pool, &[4, 4, 4, 4])
        .await
        .unwrap();
    // Two operators, each reconciling one of two policies over the same pool (each sees
    // only its own policy, so neither knows of a conflict).
    let (a, b) = (format!("{}-a", c.name()), format!("{}-b", c.name()));
    let limits = json!({"maxEvictionsPerRun": 7, "maxEvictionsPerNode": 8,
                        "maxEvictionsPerNamespace": 20, "maxInFlight": 1});
    for p in [&a, &b] {
        create_policy(
            &c.client,
            p,
            p,
            c.spec(json!([{"gpus": 8}]), limits.clone()),
        )
        .await
        .unwrap();
    }
    let _op_a = Operator::start(c.cluster, &a, &[]).await.unwrap();
    let _op_b = Operator::start(c.cluster, &b, &[]).await.unwrap();
    for p in [&a, &b] {
        wait_status(&c.client, p, "a dry-run plan", T, |s| {
            int_at(s, "/plan/totalMoves").unwrap_or(0) > 0
        })
        .await
        .unwrap();
    }
    // Each run evicts one pod and then waits for its replacement. A goes first; B starts
    // while A holds its fences (both plans are made on the same cluster, so B would
    // otherwise race A for the same first pod).
    hold_replacements(&c, 2).await;
    let enforce = json!({"mode": "Enforce", "windows": [open_window_this_minute()]});
    let fenced_by = |p: String| {
        let client = c.client.clone();
        async move {
            wait_status(
                &client,
                &p,
                "the run to evict and fence",
                RUN_TIMEOUT,
                |s| int_at(s, "/activeRun/evicted").unwrap_or(0) >= 1,
            )
            .await
            .unwrap();
            let st = policy_status(&client, &p).await.unwrap();
            let nodes = strings_at(&st, "/activeRun/fencedNodes");
            assert!(!nodes.is_empty(), "{st:#}");
            nodes
        }
    };
    let node_fences = |node: String| {
        let client = c.client.clone();
        async move {
            let n = Api::<Node>::all(client).get(&node).await.unwrap();
            fences(&n).collect::<Vec<String>>()
        }
    };
    patch_policy(&c.client, &a, enforce.clone()).await.unwrap();
    let fenced_a = fenced_by(a.clone()).await;
    patch_policy(&c.client, &b, enforce).await.unwrap();
    let fenced_b = fenced_by(b.clone()).await;
    for n in &fenced_b {
        wait_for("B's fence on its node", T, || async {
            Ok(node_fences(n.clone()).await.contains(&b).then_some(()))
        })
        .await
        .unwrap();
    }
    // B's fences did not take A's away.
    for n in &fenced_a {
        assert!(
            node_fences(n.clone()).await.contains(&a),
            "{n}: A's fence lost"
        );
    }
    let shared: Vec<&String> = fenced_a.iter().filter(|n| fenced_b.contains(n)).collect();
    // A stops: its fences go, B's stay.
    patch_policy(&c.client, &a, json!({"mode": "DryRun"}))
        .await
        .unwrap();
    for n in &fenced_a {
        wait_for("A's fence to go", T, || async {
            Ok((!node_fences(n.clone()).await.contains(&a)).then_some(()))
        })
        .await
        .unwrap();
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    for n in &fenced_b {
        assert_eq!(
            node_fences(n.clone()).await,
            vec![b.clone()],
            "{n}: B's fence stays"
        );
    }
    let st = policy_status(&c.client, &b).await.unwrap();
    assert!(st.get("activeRun").is_some(), "B's run goes on: {st:#}");
    eprintln!(
        "E2E-FIGURE fences: A fenced {fenced_a:?}, B fenced {fenced_b:?} (both: {shared:?}); A's stop left B's fences in place"
    );
    // Then B stops too: nothing left.
    patch_policy(&c.client, &b, json!({"mode": "DryRun"}))
        .await
        .unwrap();
    fences_gone(&c, Instant::now()).await;
    release_replacements(&c).await;
    wait_deployments_ready(&c.client, c.name(), &infer, T)
        .await
        .unwrap();
    c.cleanup(&[&a, &b]).await;
}

#[tokio::test]
async fn a_drain_unit_is_given_up_at_its_first_unsafe_eviction() {
    let c = Case::new("unit-given-up", 4, 8).await;
    let (infer, _op, watch) = held_run(&c).await;
    let st = policy_status(&c.client, c.name()).await.unwrap();
    let drained = strings_at(&st, "/activeRun/fencedNodes");
    assert_eq!(drained.len(), 1, "{st:#}");
    // The pods left on the drained node may no longer be disrupted (their owners said so
    // during the run): every PDB of theirs allows no disruption.
    let left: Vec<Pod> = pods(&c.client, c.name(), "e2e-role=infer")
        .await
        .unwrap()
        .into_iter()
        .filter(|p| {
            pod_node(p) == Some(drained[0].as_str()) && p.metadata.deletion_timestamp.is_none()
        })
        .collect();
    assert_eq!(left.len(), 3, "three pods still to move off {}", drained[0]);
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(c.client.clone(), c.name());
    for p in &left {
        let app = p.metadata.labels.as_ref().unwrap()["app"].clone();
        pdbs.patch(
            &app,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"maxUnavailable": 0}})),
        )
        .await
        .unwrap();
        wait_for("the PDB to allow no disruption", T, || async {
            let b = pdbs.get(&app).await?;
            Ok(b.status
                .filter(|s| {
                    s.disruptions_allowed == Some(0)
                        && s.observed_generation == b.metadata.generation
                })
                .map(|_| ()))
        })
        .await
        .unwrap();
    }
    // The held replacement goes; the run takes the next pod of the unit, finds it unsafe
    // and sends nothing more of the unit.
    release_replacements(&c).await;
    let st = wait_status(
        &c.client,
        c.name(),
        "the run to finish",
        RUN_TIMEOUT,
        has_finished_run,
    )
    .await
    .unwrap();
    let run = st.pointer("/lastRuns/0").unwrap();
    assert_eq!(str_at(run, "/result"), Some("Partial"), "{run:#}");
    assert_eq!(int_at(run, "/evicted"), Some(1), "{run:#}");
    assert_eq!(int_at(run, "/skipped"), Some(3), "{run:#}");
    assert_eq!(watch.seen().gone().len(), 1, "{:?}", watch.seen().gone());
    assert!(c.fenced_nodes().await.is_empty());
    let events = skipped_events(&c).await;
    assert!(
        events
            .iter()
            .any(|m| m.contains("pdb-exhausted") && m.contains("the rest of its unit is not sent")),
        "{events:?}"
    );
    wait_deployments_ready(&c.client, c.name(), &infer, T)
        .await
        .unwrap();
    c.cleanup(&[c.name()]).await;
}

/// Notes of the `EvictionSkipped` events on the case's policy.
async fn skipped_events(c: &Case) -> Vec<String> {
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(c.client.clone());
    events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some("EvictionSkipped")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(c.name())
        })
        .filter_map(|e| e.note)
        .collect()
}

#[tokio::test]
async fn a_resumed_run_waits_for_the_replacement_its_last_process_missed() {
    let c = Case::new("resume-wait", 4, 8).await;
    let (infer, mut op, watch) = held_run(&c).await;
    let st = policy_status(&c.client, c.name()).await.unwrap();
    let in_flight = st
        .pointer("/activeRun/inFlight")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        in_flight.len(),
        1,
        "the record lists the eviction in flight: {st:#}"
    );
    op.kill();
    let _op2 = Operator::start(c.cluster, c.name(), &[]).await.unwrap();
    wait_status(&c.client, c.name(), "the run to be resumed", T, |s| {
        s["conditions"].as_array().is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Executing" && c["status"] == "True")
        })
    })
    .await
    .unwrap();
    // The replacement is still missing: the resumed run evicts nothing.
    tokio::time::sleep(QUIET).await;
    assert_eq!(
        watch.seen().gone().len(),
        1,
        "the resumed run evicted while a replacement was missing: {:?}",
        watch.seen().gone()
    );
    // Once it is there, the run goes on and finishes.
    release_replacements(&c).await;
    let st = wait_status(
        &c.client,
        c.name(),
        "the run to finish",
        RUN_TIMEOUT,
        has_finished_run,
    )
    .await
    .unwrap();
    let run = st.pointer("/lastRuns/0").unwrap();
    assert!(
        ["Succeeded", "Partial"].contains(&str_at(run, "/result").unwrap_or("")),
        "{run:#}"
    );
    assert!(
        watch.seen().gone().len() > 1,
        "the run went on after the wait"
    );
    assert!(c.fenced_nodes().await.is_empty());
    wait_deployments_ready(&c.client, c.name(), &infer, T)
        .await
        .unwrap();
    c.cleanup(&[c.name()]).await;
}

/// The evictor against the real API server: an eviction names the pod's UID, so a new pod
/// under the same name is never evicted in place of the planned one.
#[tokio::test]
async fn an_eviction_never_hits_a_new_pod_under_the_planned_name() {
    use gpu_defrag_operator::{
        context::Events,
        executor::evictor::{EvictionResult, Evictor},
        metrics::Metrics,
    };
    let c = Case::new("uid-precondition", 1, 8).await;
    let api: Api<Pod> = Api::namespaced(c.client.clone(), c.name());
    let mut spec = json!({"containers": [{"name": "main", "image": FAKE_IMAGE}]});
    let mut pod_spec: k8s_openapi::api::core::v1::PodSpec =
        serde_json::from_value(spec.take()).unwrap();
    c.pool.place(&mut pod_spec).unwrap();
    let pod = |spec: &k8s_openapi::api::core::v1::PodSpec| Pod {
        metadata: kube::api::ObjectMeta {
            name: Some("web-0".into()),
            ..Default::default()
        },
        spec: Some(spec.clone()),
        ..Default::default()
    };
    let first = api
        .create(&PostParams::default(), &pod(&pod_spec))
        .await
        .unwrap();
    let old_uid = first.metadata.uid.clone().unwrap();
    // The planned pod goes away and a new one takes its name (as a StatefulSet does).
    api.delete("web-0", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    wait_for("web-0 to be gone", T, || async {
        Ok(api.get_opt("web-0").await?.is_none().then_some(()))
    })
    .await
    .unwrap();
    let second = api
        .create(&PostParams::default(), &pod(&pod_spec))
        .await
        .unwrap();
    let new_uid = second.metadata.uid.clone().unwrap();
    assert_ne!(old_uid, new_uid);

    let policy = gpu_defrag_api::v1alpha1::DefragPolicy::new(
        c.name(),
        serde_json::from_value(json!({})).unwrap(),
    );
    let recorder = kube::runtime::events::Recorder::new(
        c.client.clone(),
        kube::runtime::events::Reporter {
            controller: "gpu-defrag-e2e".into(),
            instance: None,
        },
    );
    let evictor = Evictor::new(
        c.client.clone(),
        Metrics::new(),
        Events::new(recorder),
        &policy,
    );
    let m = gpu_defrag_core::plan::Move {
        pod: format!("{}/web-0", c.name()),
        pod_index: 0,
        from_node: String::new(),
        to_node: String::new(),
        from_devices: Vec::new(),
        to_devices: Vec::new(),
        batch: 0,
        reason: "e2e".into(),
    };
    let second = gpu_defrag_core::compact::CompactPod::of(&second);
    let result = evictor.evict(&m, &second, &old_uid).await;
    assert_eq!(result, EvictionResult::Gone, "the planned pod is gone");
    let still = api.get("web-0").await.unwrap();
    assert_eq!(still.metadata.uid.as_deref(), Some(new_uid.as_str()));
    assert!(
        still.metadata.deletion_timestamp.is_none(),
        "the new pod was not touched"
    );
    // With its own UID it is evicted.
    assert_eq!(
        evictor.evict(&m, &second, &new_uid).await,
        EvictionResult::Evicted
    );
}

/// Fences whose policy no longer exists are removed when an operator starts (any
/// operator: every policy of the cluster counts, whatever its selector), fences of
/// policies that exist are left alone, and the earlier single-key form is recognised.
#[tokio::test]
async fn fences_of_deleted_policies_are_swept_at_start() {
    let c = Case::new("orphans", 2, 8).await;
    // Another operator's policy (this test's operator does not select it) and this one's.
    let other = format!("{}-other", c.name());
    create_policy(
        &c.client,
        &other,
        &other,
        c.spec(json!([{"gpus": 8}]), json!({})),
    )
    .await
    .unwrap();
    c.dry_run_policy(json!([{"gpus": 8}]), json!({})).await;
    let nodes: Api<Node> = Api::all(c.client.clone());
    let node = nodes
        .list(&ListParams::default().labels(&format!("e2e-pool={}", c.pool.name)))
        .await
        .unwrap()
        .items[0]
        .metadata
        .name
        .clone()
        .unwrap();
    let ghost = format!("{}-deleted", c.name());
    let taint =
        |key: String, value: &str| json!({"key": key, "value": value, "effect": "NoSchedule"});
    let mut taints = nodes
        .get(&node)
        .await
        .unwrap()
        .spec
        .unwrap()
        .taints
        .unwrap_or_default();
    for t in [
        taint(format!("draining.gpu-defrag.io/{ghost}"), &ghost),
        taint("gpu-defrag.io/draining".into(), &format!("{ghost}-old")),
        taint(format!("draining.gpu-defrag.io/{other}"), &other),
    ] {
        taints.push(serde_json::from_value(t).unwrap());
    }
    nodes
        .patch(
            &node,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"taints": taints}})),
        )
        .await
        .unwrap();
    let t = Instant::now();
    let _op = Operator::start(c.cluster, c.name(), &[]).await.unwrap();
    let fenced = || async {
        let n = nodes.get(&node).await.unwrap();
        fences(&n).collect::<Vec<String>>()
    };
    wait_for("the deleted policy's fences to be swept", T, || async {
        let f = fenced().await;
        let legacy = nodes
            .get(&node)
            .await?
            .spec
            .and_then(|s| s.taints)
            .unwrap_or_default()
            .iter()
            .any(|t| t.key == "gpu-defrag.io/draining");
        Ok((!f.contains(&ghost) && !legacy).then_some(()))
    })
    .await
    .unwrap();
    let took = t.elapsed();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        fenced().await,
        vec![other.clone()],
        "an existing policy's fence stays"
    );
    eprintln!(
        "E2E-FIGURE sweep: fences of a deleted policy (current and earlier key) removed {:.1}s after the operator started; another operator's fence kept",
        took.as_secs_f64()
    );
    c.cleanup(&[c.name(), &other]).await;
}
