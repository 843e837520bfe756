//! End-to-end tests of the operator (`gpu-defrag run`) on the real local control plane.
//!
//! One stack for this binary; every test has its own namespace, kwok node pool (labelled
//! and tainted `e2e-pool=<namespace>`), DefragPolicy (named after the namespace, labelled
//! `e2e-test=<namespace>`) and operator process (`--policy-selector e2e-test=<namespace>`),
//! running as a user bound to exactly config/rbac/role.yaml. So the tests run in parallel
//! without seeing each other.
//!
//! The fragmented workload is the one of `make demo`: 1-GPU Deployments packed onto the
//! pool by the bin-packing scheduler, then some removed, so every node is partly used and
//! an 8-GPU pod fits nowhere.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::{Duration, Instant},
};

use chrono::{Datelike, FixedOffset, TimeZone, Utc};
use gpu_defrag_e2e::{
    GpuNodes,
    case::{Case, QUIET, RUN_TIMEOUT, T, evicted_per_node, has_finished_run},
    cluster::repo_root,
    fixtures::{FAKE_IMAGE, min_available_pdb, pods, wait_for, wait_ready_pods},
    operator::{
        Operator, POOL_LABEL, PodWatch, Pool, allow_one_disruption, bind_lease_role, create_policy,
        fences, float_at, fragment, int_at, is_fence_key, open_window_every_minute, patch_policy,
        pod_node, policy_status, str_at, strings_at, wait_deployments_ready, wait_status,
    },
};
use k8s_openapi::api::{
    apps::v1::Deployment,
    coordination::v1::Lease,
    core::v1::{Node, Pod},
    policy::v1::PodDisruptionBudget,
    scheduling::v1::PriorityClass,
};
use kube::{
    Api,
    api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, PostParams},
};
use serde_json::{Value, json};

/// An operator whose Lease namespace does not exist says so in one line, with the fix,
/// within 10 s of its start, and does not say it again while nothing changes.
#[tokio::test]
async fn a_missing_lease_namespace_is_said_once_with_the_fix() {
    let c = Case::new("nolease", 1, 1).await;
    let absent = format!("{}-absent", c.name());
    let mut op = Operator::start(
        c.cluster,
        c.name(),
        &["--leader-elect", "--lease-namespace", &absent],
    )
    .await
    .unwrap();
    let since_start = || {
        let text = std::fs::read_to_string(op.log()).unwrap_or_default();
        let from = text.rfind("=== e2e: starting").unwrap_or(0);
        text[from..].to_string()
    };
    let said = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| l.contains("cannot lead"))
            .map(str::to_string)
            .collect()
    };
    let deadline = op.started() + Duration::from_secs(10);
    while said(&since_start()).is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let lines = said(&since_start());
    assert_eq!(lines.len(), 1, "one line within 10 s:\n{}", op.log_tail(20));
    assert!(
        lines[0].contains(&format!("kubectl create namespace {absent}"))
            && lines[0].contains("--lease-namespace"),
        "the line says how to fix it: {}",
        lines[0]
    );
    // Three more attempts (every 5 s): still one line.
    tokio::time::sleep(Duration::from_secs(12)).await;
    op.ensure_running().unwrap();
    assert_eq!(
        said(&since_start()).len(),
        1,
        "said again:\n{}",
        op.log_tail(20)
    );
    op.kill();
    c.cleanup(&[]).await;
}

/// DryRun: fragmentation and a plan checked server-side are published; nothing evicted,
/// nothing fenced. This operator also runs with leader election (the Lease Role of
/// config/rbac/leader_election_role.yaml bound in the test namespace).
#[tokio::test]
async fn dry_run_reports_plan_and_evicts_nothing() {
    let c = Case::new("dryrun", 2, 4).await;
    let kept = fragment(&c.client, c.name(), &c.pool, &[2, 2])
        .await
        .unwrap();
    assert_eq!(kept.len(), 4);
    c.dry_run_policy(
        json!([{"gpus": 4}]),
        json!({"maxEvictionsPerRun": 10, "maxEvictionsPerNode": 4, "maxEvictionsPerNamespace": 10}),
    )
    .await;
    let before = c.uids().await;
    // This one also elects itself leader, with the project's Lease Role in the namespace.
    bind_lease_role(&c.client, c.name()).await.unwrap();
    let identity = format!("e2e-{}", c.name());
    let op = Operator::start(
        c.cluster,
        c.name(),
        &[
            "--leader-elect",
            "--lease-namespace",
            c.name(),
            "--identity",
            &identity,
        ],
    )
    .await
    .unwrap();
    let st = wait_status(&c.client, c.name(), "a dry-run plan", T, |s| {
        int_at(s, "/plan/totalMoves").unwrap_or(0) > 0
            && float_at(s, "/fragmentation/fragmentRate").unwrap_or(0.0) > 0.0
            && int_at(s, "/plan/dryRunCheck/allowed").unwrap_or(0) > 0
    })
    .await
    .unwrap();
    let total = int_at(&st, "/plan/totalMoves").unwrap();
    assert_eq!(
        int_at(&st, "/plan/dryRunCheck/allowed"),
        Some(total.min(20)),
        "every checked eviction is allowed: {st:#}"
    );
    assert_eq!(int_at(&st, "/plan/dryRunCheck/blocked"), Some(0));
    assert_eq!(int_at(&st, "/fragmentation/nodes"), Some(2), "{st:#}");
    let moves = st.pointer("/plan/moves").and_then(Value::as_array).unwrap();
    assert_eq!(moves.len() as i64, total);
    for m in moves {
        assert!(
            c.pool
                .nodes
                .iter()
                .any(|n| Some(n.as_str()) == str_at(m, "/fromNode")),
            "a move off the pool: {m}"
        );
    }
    let exec = gpu_defrag_e2e::operator::condition_parts(&st, "Executing").unwrap();
    assert_eq!(exec.0, "False", "{exec:?}");
    let lease = Api::<Lease>::namespaced(c.client.clone(), c.name())
        .get("gpu-defrag-leader")
        .await
        .unwrap();
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity).as_deref(),
        Some(identity.as_str())
    );
    // The dry-run evictions and the time that passes evict nothing and fence nothing.
    let deadline = Instant::now() + QUIET;
    while Instant::now() < deadline {
        assert_eq!(c.fenced_nodes().await, Vec::<String>::new());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    op.ensure_running().unwrap();
    assert_eq!(c.uids().await, before, "a pod was evicted in DryRun");
    let st = policy_status(&c.client, c.name()).await.unwrap();
    assert!(st.get("activeRun").is_none(), "{st:#}");
    assert_eq!(
        st.get("lastRuns")
            .and_then(Value::as_array)
            .map(Vec::len)
            .unwrap_or(0),
        0
    );
    c.cleanup(&[c.name()]).await;
}

/// Enforce in an open window: the 8-GPU pod runs after the run, within the limits, with
/// no replacement landing on a fenced node; every workload is back to Ready.
#[tokio::test]
async fn enforce_in_open_window_makes_room_for_the_pending_8_gpu_pod() {
    let c = Case::new("enforce", 4, 8).await;
    let infer = fragment(&c.client, c.name(), &c.pool, &[4, 4, 4, 4])
        .await
        .unwrap();
    c.pending_training_job().await;
    let (max_run, max_node) = (8, 4);
    c.dry_run_policy(
        json!([{"gpus": 8, "weight": 1}, {"gpus": 1, "weight": 1}]),
        json!({"maxEvictionsPerRun": max_run, "maxEvictionsPerNode": max_node,
               "maxEvictionsPerNamespace": 20, "maxInFlight": 2}),
    )
    .await;
    let op = Operator::start(c.cluster, c.name(), &[]).await.unwrap();
    let st = wait_status(&c.client, c.name(), "a dry-run plan", T, |s| {
        int_at(s, "/plan/totalMoves").unwrap_or(0) > 0
    })
    .await
    .unwrap();
    let rate_before = float_at(&st, "/fragmentation/fragmentRate").unwrap();
    assert!(rate_before > 0.0, "{st:#}");

    let watch = PodWatch::start(&c.client, c.name(), &c.pool, c.name())
        .await
        .unwrap();
    // The benefit gate first: a plan freeing fewer whole nodes than trigger.minNodesFreed
    // starts no run, and the Executing condition says why.
    let frees = int_at(&st, "/plan/expectedFullyFreeNodes").unwrap_or(0)
        - int_at(&st, "/fragmentation/fullyFreeNodes").unwrap_or(0);
    patch_policy(
        &c.client,
        c.name(),
        json!({"mode": "Enforce", "windows": [open_window_every_minute()],
               "trigger": {"minNodesFreed": 99}}),
    )
    .await
    .unwrap();
    let gated = wait_status(&c.client, c.name(), "the benefit gate's message", T, |s| {
        gpu_defrag_e2e::operator::condition_parts(s, "Executing")
            .is_some_and(|(_, _, m)| m.contains("below trigger.minNodesFreed 99"))
    })
    .await
    .unwrap();
    assert!(
        gated["lastRuns"].as_array().is_none_or(Vec::is_empty) && gated.get("activeRun").is_none(),
        "a run started below the gate: {gated:#}"
    );
    let t0 = Instant::now();
    patch_policy(
        &c.client,
        c.name(),
        json!({"trigger": {"minNodesFreed": 1}}),
    )
    .await
    .unwrap();
    let st = c.finished_run().await;
    let run_end = Instant::now();
    let train_node = c.training_job_running(T).await;
    let to_running = t0.elapsed();
    let run = st.pointer("/lastRuns/0").unwrap().clone();
    assert_eq!(str_at(&run, "/result"), Some("Succeeded"), "{run:#}");

    let evicted = int_at(&run, "/evicted").unwrap();
    let planned = int_at(&run, "/planned").unwrap();
    assert!(evicted > 0 && evicted <= max_run, "{run:#}");
    // Landing control (on by default): the replacements land where the plan put them.
    let as_planned = int_at(&run, "/landedAsPlanned").unwrap_or(0);
    let elsewhere = int_at(&run, "/landedElsewhere").unwrap_or(0);
    assert_eq!(as_planned + elsewhere, evicted, "{run:#}");
    assert!(
        as_planned * 100 >= 95 * evicted,
        "{as_planned} of {evicted} replacements on their planned node: {run:#}"
    );
    for (node, n) in evicted_per_node(&run) {
        assert!(n <= max_node, "{n} evictions from {node}: {run:#}");
    }
    let fenced: BTreeSet<String> = strings_at(&run, "/fencedNodes").into_iter().collect();
    assert!(!fenced.is_empty(), "{run:#}");
    assert!(
        fenced.contains(&train_node),
        "the 8-GPU pod runs on {train_node}, not on a node the run emptied ({fenced:?})"
    );
    // It was nominated there when the run ended (landing control on by default).
    let m = op.metrics().await.unwrap();
    let nominated = gpu_defrag_e2e::operator::metric_sum(
        &m,
        "gpu_defrag_landing_actions_total",
        &[("kind", "pending_nominated")],
    );
    assert_eq!(nominated, 1.0, "the pending 8-GPU pod nominated once");

    // Every inference Deployment is back to one Ready pod; no fence is left.
    wait_deployments_ready(&c.client, c.name(), &infer, T)
        .await
        .unwrap();
    assert_eq!(c.fenced_nodes().await, Vec::<String>::new());
    let st = wait_status(&c.client, c.name(), "a lower fragment rate", T, |s| {
        float_at(s, "/fragmentation/fragmentRate").is_some_and(|r| r < rate_before)
    })
    .await
    .unwrap();
    let rate_after = float_at(&st, "/fragmentation/fragmentRate").unwrap();
    assert!(
        float_at(&run, "/fragmentRateAfter").is_some_and(|r| r < rate_before),
        "{run:#}"
    );

    // What the watch saw: evictions match the record, per node within the limit, and no
    // pod created during the run was bound to a fenced node.
    let seen = watch.seen();
    // The watch sampled throughout (a run takes a few seconds; a loaded machine samples
    // less often than every 200 ms).
    assert!(seen.samples >= 5, "{} samples", seen.samples);
    assert_eq!(
        seen.violations,
        BTreeMap::new(),
        "pods bound to fenced nodes"
    );
    let gone = seen.gone();
    assert_eq!(
        gone.len() as i64,
        evicted,
        "pods that disappeared vs. evictions recorded: {gone:?}"
    );
    let mut per_node: BTreeMap<&str, i64> = BTreeMap::new();
    for p in &gone {
        assert!(p.initial, "a replacement was evicted again: {p:?}");
        assert!(p.app.starts_with("infer-"), "{p:?}");
        *per_node.entry(p.node.as_deref().unwrap_or("")).or_default() += 1;
        assert!(
            fenced.contains(p.node.as_deref().unwrap_or("")),
            "{p:?} evicted from an unfenced node"
        );
    }
    assert!(per_node.values().all(|&n| n <= max_node), "{per_node:?}");
    for p in seen.pods.values() {
        if !p.initial && p.first_seen < run_end && p.app != "train-8gpu" {
            let node = p.node.as_deref().unwrap_or("");
            assert!(
                !fenced.contains(node),
                "replacement {p:?} landed on fenced node {node}"
            );
        }
    }
    let st = policy_status(&c.client, c.name()).await.unwrap();
    assert_eq!(
        st.get("lastRuns").and_then(Value::as_array).map(Vec::len),
        Some(1),
        "one run only: {st:#}"
    );
    eprintln!(
        "E2E-FIGURE enforce: gate held the run at minNodesFreed 99 (plan frees {frees}); window open -> 8-GPU pod Running in {:.1}s; evictions used {evicted} of {planned} planned (limit {max_run}/run, {max_node}/node); fenced nodes {}; replacements on their planned node {as_planned}/{evicted}; fragment rate {rate_before:.3} -> {rate_after:.3} (run record: forecast {:.3}, at run end {:.3}, result {}); {} nodes x 8 GPUs, {} one-GPU pods",
        to_running.as_secs_f64(),
        fenced.len(),
        float_at(&run, "/expectedFragmentRateAfter").unwrap_or(f64::NAN),
        float_at(&run, "/fragmentRateAfter").unwrap_or(f64::NAN),
        str_at(&run, "/result").unwrap_or(""),
        c.pool.nodes.len(),
        infer.len(),
    );
    assert!(frees >= 1, "the plan frees {frees} whole nodes: {st:#}");
    c.cleanup(&[c.name()]).await;
}

/// The next 03:00 on January 1st in Asia/Shanghai (UTC+8, no DST), as RFC 3339.
fn next_new_year_0300_shanghai() -> (String, String) {
    let tz = FixedOffset::east_opt(8 * 3600).unwrap();
    let now = Utc::now().with_timezone(&tz);
    let mut year = now.year();
    let at = |y: i32| tz.with_ymd_and_hms(y, 1, 1, 3, 0, 0).unwrap();
    if at(year) <= now {
        year += 1;
    }
    (
        at(year).to_rfc3339(),
        (at(year) + chrono::Duration::hours(1)).to_rfc3339(),
    )
}

/// Enforce with a closed window: nothing evicted; the next window in its own zone.
#[tokio::test]
async fn closed_window_evicts_nothing_and_reports_the_next_window() {
    let c = Case::new("closed", 2, 4).await;
    fragment(&c.client, c.name(), &c.pool, &[2, 2])
        .await
        .unwrap();
    let mut spec = c.spec(
        json!([{"gpus": 4}]),
        json!({"maxEvictionsPerRun": 10, "maxEvictionsPerNode": 4, "maxEvictionsPerNamespace": 10}),
    );
    spec["mode"] = json!("Enforce");
    spec["windows"] =
        json!([{"schedule": "0 3 1 1 *", "duration": "1h", "timeZone": "Asia/Shanghai"}]);
    c.create_policy(spec).await;
    let before = c.uids().await;
    let (start, end) = next_new_year_0300_shanghai();
    let op = Operator::start(c.cluster, c.name(), &[]).await.unwrap();
    let st = wait_status(&c.client, c.name(), "the next window and a plan", T, |s| {
        s.get("nextWindow").is_some() && int_at(s, "/plan/totalMoves").unwrap_or(0) > 0
    })
    .await
    .unwrap();
    assert_eq!(
        str_at(&st, "/nextWindow/start"),
        Some(start.as_str()),
        "{st:#}"
    );
    assert_eq!(str_at(&st, "/nextWindow/end"), Some(end.as_str()), "{st:#}");
    assert_eq!(
        st.pointer("/nextWindow/open").and_then(Value::as_bool),
        Some(false)
    );
    let (status, reason, message) =
        gpu_defrag_e2e::operator::condition_parts(&st, "InWindow").unwrap();
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "WindowClosed")
    );
    assert!(message.contains(&start), "{message}");
    let exec = gpu_defrag_e2e::operator::condition_parts(&st, "Executing").unwrap();
    assert_eq!(exec.0, "False", "{exec:?}");
    assert!(
        exec.2.contains("outside the maintenance windows"),
        "{exec:?}"
    );
    let deadline = Instant::now() + QUIET;
    while Instant::now() < deadline {
        assert_eq!(c.fenced_nodes().await, Vec::<String>::new());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    op.ensure_running().unwrap();
    assert_eq!(
        c.uids().await,
        before,
        "a pod was evicted outside the window"
    );
    let st = policy_status(&c.client, c.name()).await.unwrap();
    assert!(st.get("activeRun").is_none(), "{st:#}");
    assert_eq!(
        st.get("lastRuns")
            .and_then(Value::as_array)
            .map(Vec::len)
            .unwrap_or(0),
        0
    );
    c.cleanup(&[c.name()]).await;
}

/// Protected pods sit on nodes shaped like the one the plan drains; only that node's pods
/// are evicted.
#[tokio::test]
async fn protected_pods_are_never_evicted_and_are_reported() {
    let c = Case::new("protect", 5, 8).await;
    let ns = c.name().to_string();
    let n = &c.pool.nodes;
    // Priority above the policy's threshold.
    let pc_name = format!("{ns}-critical");
    let pc: PriorityClass = serde_json::from_value(json!({
        "metadata": {"name": pc_name}, "value": 1_000_000, "globalDefault": false,
    }))
    .unwrap();
    Api::<PriorityClass>::all(c.client.clone())
        .create(&PostParams::default(), &pc)
        .await
        .unwrap();
    let pinned = |name: &str, replicas: i32, node: &str| {
        let mut d = c.pool.deployment(name, replicas, 1).unwrap();
        d.spec.template.spec.as_mut().unwrap().node_name = Some(node.to_string());
        d
    };
    // n0: a workload whose PDB allows no disruption.
    let guarded = pinned("guarded", 2, &n[0]);
    // n1: priority above spec.priority.maxPriority.
    let mut vip = pinned("vip", 1, &n[1]);
    vip.spec.template.spec.as_mut().unwrap().priority_class_name = Some(pc_name.clone());
    // n2: opted out.
    let mut optout = pinned("optout", 1, &n[2]);
    optout.spec.template.metadata.as_mut().unwrap().annotations = Some(
        [(
            "gpu-defrag.io/do-not-disrupt".to_string(),
            "true".to_string(),
        )]
        .into(),
    );
    for d in [&guarded, &vip, &optout] {
        c.deployments()
            .create(&PostParams::default(), d)
            .await
            .unwrap();
    }
    Api::<PodDisruptionBudget>::namespaced(c.client.clone(), &ns)
        .create(
            &PostParams::default(),
            &min_available_pdb("guarded", "guarded", 2).unwrap(),
        )
        .await
        .unwrap();
    // n3: a bare pod (no controller).
    let mut bare: Pod = serde_json::from_value(json!({
        "metadata": {"name": "bare", "labels": {"app": "bare"}},
        "spec": {
            "nodeName": n[3],
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "main", "image": gpu_defrag_e2e::fixtures::FAKE_IMAGE,
                "resources": {
                    "requests": {"cpu": "1", "memory": "1Gi"},
                    "limits": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"},
                },
            }],
        },
    }))
    .unwrap();
    c.pool.place(bare.spec.as_mut().unwrap()).unwrap();
    Api::<Pod>::namespaced(c.client.clone(), &ns)
        .create(&PostParams::default(), &bare)
        .await
        .unwrap();
    let mut protected = BTreeMap::new();
    for (app, count) in [("guarded", 2), ("vip", 1), ("optout", 1), ("bare", 1)] {
        for p in wait_ready_pods(&c.client, &ns, &format!("app={app}"), count, T)
            .await
            .unwrap()
        {
            protected.insert(
                p.metadata.uid.clone().unwrap(),
                format!("{app} on {}", pod_node(&p).unwrap()),
            );
        }
    }
    // Every node half used: n0 2 guarded + 2 fillers, n1-n3 1 protected + 3, n4 4 fillers.
    fragment(&c.client, &ns, &c.pool, &[2, 3, 3, 3, 4])
        .await
        .unwrap();
    c.pending_training_job().await;
    let mut spec = c.spec(
        json!([{"gpus": 8}]),
        json!({"maxEvictionsPerRun": 20, "maxEvictionsPerNode": 8,
               "maxEvictionsPerNamespace": 20, "maxInFlight": 2}),
    );
    spec["priority"] = json!({"maxPriority": 1000});
    c.create_policy(spec).await;
    let _op = Operator::start(c.cluster, &ns, &[]).await.unwrap();
    let want_skipped = [
        ("pdb-exhausted", 2),
        ("priority-above-threshold", 1),
        ("opted-out", 1),
        ("no-controller", 1),
    ];
    let st = wait_status(
        &c.client,
        &ns,
        "a plan with the protected pods skipped",
        T,
        |s| {
            int_at(s, "/plan/totalMoves").unwrap_or(0) > 0
                && want_skipped.iter().all(|(k, v)| {
                    s.pointer(&format!("/skipped/{k}")).and_then(Value::as_i64) == Some(*v)
                })
        },
    )
    .await
    .unwrap();
    // The plan only drains the node without protected pods.
    for m in st.pointer("/plan/moves").and_then(Value::as_array).unwrap() {
        assert_eq!(str_at(m, "/fromNode"), Some(n[4].as_str()), "{m}");
    }
    assert_eq!(int_at(&st, "/plan/dryRunCheck/blocked"), Some(0), "{st:#}");

    let watch = PodWatch::start(&c.client, &ns, &c.pool, &ns).await.unwrap();
    patch_policy(
        &c.client,
        &ns,
        json!({"mode": "Enforce", "windows": [open_window_every_minute()]}),
    )
    .await
    .unwrap();
    let st = wait_status(
        &c.client,
        &ns,
        "the run to finish",
        RUN_TIMEOUT,
        has_finished_run,
    )
    .await
    .unwrap();
    let run = st.pointer("/lastRuns/0").unwrap().clone();
    assert!(int_at(&run, "/evicted").unwrap_or(0) > 0, "{run:#}");
    assert_eq!(
        evicted_per_node(&run).keys().cloned().collect::<Vec<_>>(),
        vec![n[4].clone()],
        "{run:#}"
    );
    for p in strings_at(&run, "/evictedPods") {
        assert!(p.starts_with(&format!("{ns}/infer-")), "evicted {p}");
    }
    let train_node = c.training_job_running(T).await;
    assert_eq!(train_node, n[4]);
    // Protected pods: same uids, never seen gone.
    let now = c.uids().await;
    for (uid, what) in &protected {
        assert!(now.contains_key(uid), "protected pod {what} was replaced");
    }
    let seen = watch.seen();
    for (uid, p) in seen.pods.iter().filter(|(_, p)| p.gone_at.is_some()) {
        assert!(
            !protected.contains_key(uid),
            "protected pod {p:?} disappeared"
        );
        assert_eq!(p.node.as_deref(), Some(n[4].as_str()), "{p:?}");
    }
    assert_eq!(seen.violations, BTreeMap::new());
    assert_eq!(c.fenced_nodes().await, Vec::<String>::new());
    let st = policy_status(&c.client, &ns).await.unwrap();
    for (k, v) in want_skipped {
        assert_eq!(
            st.pointer(&format!("/skipped/{k}")).and_then(Value::as_i64),
            Some(v),
            "skipped {k}: {st:#}"
        );
    }
    c.cleanup(&[&ns]).await;
    Api::<PriorityClass>::all(c.client.clone())
        .delete(&pc_name, &DeleteParams::default())
        .await
        .unwrap();
}

/// SIGKILL the operator right after the first eviction, restart it: the run is resumed or
/// cleaned up, no fence is left, the per-run limit holds across both processes, and every
/// workload is back.
#[tokio::test]
async fn operator_killed_mid_run_resumes_or_cleans_up() {
    let c = Case::new("restart", 4, 8).await;
    let infer = fragment(&c.client, c.name(), &c.pool, &[4, 4, 4, 4])
        .await
        .unwrap();
    // 7 per run: a fresh plan empties one node (4), a second would need 8. A resumed run
    // that forgot the evictions of the killed process would empty a second node.
    let max_run = 7;
    c.one_at_a_time_policy(max_run).await;
    let mut op = Operator::start(c.cluster, c.name(), &[]).await.unwrap();
    let planned = c.planned_moves().await;
    assert_eq!(planned, 4, "the dry-run plan");
    let watch = PodWatch::start(&c.client, c.name(), &c.pool, c.name())
        .await
        .unwrap();
    c.enforce_now().await;
    let active = c.first_eviction().await;
    op.kill();
    let killed_at = Instant::now();
    let st = policy_status(&c.client, c.name()).await.unwrap();
    let recorded = st
        .get("activeRun")
        .unwrap_or_else(|| panic!("the run finished before the kill: {st:#}"))
        .clone();
    let run_id = str_at(&recorded, "/id").unwrap().to_string();
    assert_eq!(str_at(&active, "/id"), Some(run_id.as_str()));
    let recorded_fences: BTreeSet<String> =
        strings_at(&recorded, "/fencedNodes").into_iter().collect();
    assert!(!recorded_fences.is_empty(), "{recorded:#}");
    // The fences outlive the process (a restart must find and remove them).
    let nodes: Vec<Node> = Api::<Node>::all(c.client.clone())
        .list(&ListParams::default().labels(&format!("e2e-pool={}", c.pool.name)))
        .await
        .unwrap()
        .items;
    for n in &nodes {
        let name = n.metadata.name.clone().unwrap();
        let fenced = fences(n).any(|v| v == c.name());
        assert_eq!(
            fenced,
            recorded_fences.contains(&name),
            "node {name}: fence {fenced}, recorded {recorded_fences:?}"
        );
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let evicted_by_first = watch.seen().gone().len();

    let _op2 = Operator::start(c.cluster, c.name(), &[]).await.unwrap();
    let st = wait_status(
        &c.client,
        c.name(),
        "the killed run to be finished by the new process",
        RUN_TIMEOUT,
        has_finished_run,
    )
    .await
    .unwrap();
    let finished_in = killed_at.elapsed();
    let run = st.pointer("/lastRuns/0").unwrap().clone();
    assert_eq!(str_at(&run, "/id"), Some(run_id.as_str()), "{st:#}");
    let result = str_at(&run, "/result").unwrap_or("").to_string();
    assert!(
        ["Succeeded", "Partial", "Aborted", "WindowClosed"].contains(&result.as_str()),
        "{run:#}"
    );
    assert_eq!(c.fenced_nodes().await, Vec::<String>::new(), "fences left");
    wait_deployments_ready(&c.client, c.name(), &infer, T)
        .await
        .unwrap();
    let seen = watch.seen();
    let gone = seen.gone();
    let recorded_evictions = int_at(&run, "/evicted").unwrap();
    assert!(
        gone.len() as i64 <= max_run,
        "{} pods evicted across the restart, limit {max_run}: {gone:?}",
        gone.len()
    );
    assert!(
        gone.len() as i64 <= planned,
        "{} pods evicted across the restart, the run planned {planned}: {gone:?}",
        gone.len()
    );
    // An eviction the killed process recorded as in flight but never got done (killed
    // while asking) is settled by the new process as failed, not evicted.
    assert!(
        recorded_evictions <= max_run
            && recorded_evictions + int_at(&run, "/failed").unwrap_or(0)
                >= int_at(&recorded, "/evicted").unwrap_or(0),
        "{run:#}"
    );
    assert_eq!(seen.violations, BTreeMap::new());
    // No pod lost: each Deployment has exactly one live pod.
    let live = pods(&c.client, c.name(), "e2e-role=infer").await.unwrap();
    assert_eq!(live.len(), infer.len());
    eprintln!(
        "E2E-FIGURE restart: operator SIGKILLed after {} recorded eviction(s) ({evicted_by_first} pods gone 2s later) of run {run_id}; new process finished it as {result} in {:.1}s; evictions observed {} (recorded {recorded_evictions}), planned {planned}, limit {max_run}",
        int_at(&recorded, "/evicted").unwrap_or(0),
        finished_in.as_secs_f64(),
        gone.len(),
    );
    c.cleanup(&[c.name()]).await;
}

/// What only the operator can judge (cron values, time zones) becomes a condition with a
/// message naming the field; nothing is evicted.
#[tokio::test]
async fn invalid_windows_become_conditions_and_nothing_is_evicted() {
    let c = Case::new("invalid", 2, 4).await;
    fragment(&c.client, c.name(), &c.pool, &[2, 2])
        .await
        .unwrap();
    let cron = format!("{}-cron", c.name());
    let zone = format!("{}-zone", c.name());
    let limits =
        json!({"maxEvictionsPerRun": 10, "maxEvictionsPerNode": 4, "maxEvictionsPerNamespace": 10});
    for (name, window) in [
        (&cron, json!({"schedule": "61 * * * *", "duration": "1h"})),
        (
            &zone,
            json!({"schedule": "* * * * *", "duration": "1h", "timeZone": "Mars/Olympus"}),
        ),
    ] {
        let mut spec = c.spec(json!([{"gpus": 4}]), limits.clone());
        spec["mode"] = json!("Enforce");
        spec["windows"] = json!([window]);
        create_policy(&c.client, name, c.name(), spec)
            .await
            .unwrap();
    }
    let before = c.uids().await;
    let t0 = Instant::now();
    let op = Operator::start(c.cluster, c.name(), &[]).await.unwrap();
    for (name, field, value) in [
        (&cron, "spec.windows[0].schedule", "61 * * * *"),
        (&zone, "spec.windows[0].timeZone", "Mars/Olympus"),
    ] {
        let st = wait_status(&c.client, name, "Ready=False", T, |s| {
            gpu_defrag_e2e::operator::condition_parts(s, "Ready").is_some_and(|r| r.0 == "False")
        })
        .await
        .unwrap();
        let (_, reason, message) = gpu_defrag_e2e::operator::condition_parts(&st, "Ready").unwrap();
        assert_eq!(reason, "InvalidWindow", "{st:#}");
        assert!(
            message.contains(field) && message.contains(value),
            "{name}: {message:?} should name {field} and {value:?}"
        );
        let degraded = gpu_defrag_e2e::operator::condition_parts(&st, "Degraded").unwrap();
        assert_eq!(degraded.0, "True", "{degraded:?}");
        assert!(degraded.2.contains(field), "{degraded:?}");
        let exec = gpu_defrag_e2e::operator::condition_parts(&st, "Executing").unwrap();
        assert_eq!(exec.0, "False", "{exec:?}");
    }
    while t0.elapsed() < QUIET {
        assert_eq!(c.fenced_nodes().await, Vec::<String>::new());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    op.ensure_running().unwrap();
    assert_eq!(
        c.uids().await,
        before,
        "a pod was evicted under an invalid policy"
    );
    for name in [&cron, &zone] {
        let st = policy_status(&c.client, name).await.unwrap();
        assert!(st.get("activeRun").is_none(), "{st:#}");
        assert!(
            st.get("plan").is_none(),
            "no plan for an invalid policy: {st:#}"
        );
    }
    c.cleanup(&[&cron, &zone]).await;
}

/// Two replicas with leader election; the leader is SIGKILLed mid-run. The standby takes
/// the Lease once it expires, finishes the same run, repeats no eviction and keeps the
/// limits; no fence is left and every workload is Ready again.
#[tokio::test]
async fn leader_killed_mid_run_the_standby_takes_over() {
    let c = Case::new("failover", 4, 8).await;
    let infer = fragment(&c.client, c.name(), &c.pool, &[4, 4, 4, 4])
        .await
        .unwrap();
    let max_run = 7;
    c.one_at_a_time_policy(max_run).await;
    bind_lease_role(&c.client, c.name()).await.unwrap();
    let lease_secs: u64 = 6;
    let lease_arg = lease_secs.to_string();
    let start = |identity: String| {
        let lease_arg = lease_arg.clone();
        let ns = c.name().to_string();
        async move {
            Operator::start(
                c.cluster,
                &ns,
                &[
                    "--leader-elect",
                    "--lease-namespace",
                    &ns,
                    "--identity",
                    &identity,
                    "--lease-duration",
                    &lease_arg,
                ],
            )
            .await
            .unwrap()
        }
    };
    let ids = [format!("{}-a", c.name()), format!("{}-b", c.name())];
    let mut replicas = [start(ids[0].clone()).await, start(ids[1].clone()).await];
    let leases = Api::<Lease>::namespaced(c.client.clone(), c.name());
    let holder = || async {
        Ok(leases
            .get_opt("gpu-defrag-leader")
            .await?
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity)
            .filter(|h| !h.is_empty()))
    };
    let leader = wait_for("a leader", T, holder).await.unwrap();
    let li = ids.iter().position(|i| *i == leader).unwrap();
    let planned = c.planned_moves().await;
    let watch = PodWatch::start(&c.client, c.name(), &c.pool, c.name())
        .await
        .unwrap();
    c.enforce_now().await;
    let active = c.first_eviction().await;
    let run_id = str_at(&active, "/id").unwrap().to_string();
    replicas[li].kill();
    let killed_at = Instant::now();
    let standby = ids[1 - li].clone();
    wait_for("the standby to hold the Lease", T, || async {
        Ok(holder().await?.filter(|h| *h == standby))
    })
    .await
    .unwrap();
    let took_over = killed_at.elapsed();
    // The Lease expires `lease_secs` after its last renew; the standby retries on a
    // shorter period. Allow one more retry period and scheduling noise on a busy machine.
    assert!(
        took_over <= Duration::from_secs(2 * lease_secs),
        "the standby took {took_over:?} with a {lease_secs}s lease"
    );
    let st = wait_status(
        &c.client,
        c.name(),
        "the run to be finished by the new leader",
        RUN_TIMEOUT,
        has_finished_run,
    )
    .await
    .unwrap();
    let finished_in = killed_at.elapsed();
    let run = st.pointer("/lastRuns/0").unwrap().clone();
    assert_eq!(str_at(&run, "/id"), Some(run_id.as_str()), "{st:#}");
    assert_eq!(c.fenced_nodes().await, Vec::<String>::new(), "fences left");
    wait_deployments_ready(&c.client, c.name(), &infer, T)
        .await
        .unwrap();
    let seen = watch.seen();
    let gone = seen.gone();
    assert!(
        gone.len() as i64 <= planned.min(max_run),
        "{} pods evicted across the failover; planned {planned}, limit {max_run}: {gone:?}",
        gone.len()
    );
    let recorded = int_at(&run, "/evicted").unwrap();
    assert!(
        recorded <= max_run && recorded >= int_at(&active, "/evicted").unwrap_or(0),
        "{run:#}"
    );
    assert_eq!(seen.violations, BTreeMap::new());
    let live = pods(&c.client, c.name(), "e2e-role=infer").await.unwrap();
    assert_eq!(live.len(), infer.len(), "a pod was lost");
    replicas[1 - li].ensure_running().unwrap();
    eprintln!(
        "E2E-FIGURE failover: leader {leader} SIGKILLed after {} eviction(s) of run {run_id}; standby {standby} held the Lease after {:.1}s (lease {lease_secs}s) and finished the run as {} {:.1}s after the kill; evictions observed {} (recorded {recorded}), planned {planned}, limit {max_run}",
        int_at(&active, "/evicted").unwrap_or(0),
        took_over.as_secs_f64(),
        str_at(&run, "/result").unwrap_or("?"),
        finished_in.as_secs_f64(),
        gone.len(),
    );
    c.cleanup(&[c.name()]).await;
}

/// The Device kind of [`KOORD_CRD_DIR`].
fn koord_devices(client: &kube::Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("scheduling.koordinator.sh", "v1alpha1", "Device");
    Api::all_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(&gvk, "devices"),
    )
}

/// A stand-in for Koordinator's Device CRD.
const KOORD_CRD_DIR: &str = "e2e/fixtures/koordinator";

/// The Device object of `node`: two 16 GiB GPUs, minors 0 and 1.
fn koord_device(node: &str) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "scheduling.koordinator.sh/v1alpha1",
        "kind": "Device",
        "metadata": {"name": node},
        "spec": {"devices": (0..2).map(|minor| json!({
            "type": "gpu", "minor": minor, "id": format!("GPU-{node}-{minor}"), "health": true,
            "resources": {"koordinator.sh/gpu-core": "100", "koordinator.sh/gpu-memory": "16Gi",
                          "koordinator.sh/gpu-memory-ratio": "100"},
        })).collect::<Vec<_>>()},
    }))
    .unwrap()
}

/// One pod of 8 GiB on GPU `minor` of `node`, as Koordinator's scheduler records it
/// (`scheduling.koordinator.sh/device-allocated`; the pod is pinned to the node so that
/// the kube-scheduler puts it where the record says).
fn koord_deployment(pool: &Pool, app: &str, node: &str, minor: u32) -> Deployment {
    let record = json!({"gpu": [{"minor": minor,
        "resources": {"koordinator.sh/gpu-memory": "8Gi"}}]});
    let res = json!({"cpu": "1", "memory": "1Gi", "koordinator.sh/gpu-memory": "8Gi"});
    recorded_deployment(
        pool,
        app,
        node,
        (
            "koord",
            (
                "scheduling.koordinator.sh/device-allocated",
                record.to_string(),
            ),
        ),
        res,
    )
}

/// A one-replica Deployment pinned to `node` whose pods (replacements included) carry
/// the allocation record `annotation` of the template, labelled `<label>=true`, with
/// `res` as requests and limits.
fn recorded_deployment(
    pool: &Pool,
    app: &str,
    node: &str,
    (label, annotation): (&str, (&str, String)),
    res: Value,
) -> Deployment {
    let mut d: Deployment = serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": app, "labels": {"app": app}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": app}},
            "template": {
                "metadata": {
                    "labels": {"app": app, label: "true"},
                    "annotations": {annotation.0: annotation.1},
                },
                "spec": {
                    "schedulerName": gpu_defrag_e2e::fixtures::GPU_SCHEDULER,
                    "terminationGracePeriodSeconds": 0,
                    "nodeSelector": {"kubernetes.io/hostname": node},
                    "containers": [{"name": "main", "image": FAKE_IMAGE,
                        "resources": {"requests": res, "limits": res}}],
                },
            },
        },
    }))
    .unwrap();
    pool.place(d.spec.template.spec.as_mut().unwrap()).unwrap();
    d
}

/// Koordinator: the pods' `device-allocated` records give GPU memory in bytes, and the
/// GPUs' memory is in the nodes' `Device` objects, which the operator watches. With them
/// the pods are known and the plan merges node 0's two half-used GPUs; when node 0's
/// Device object goes away its pods are unknown (nothing of that node is planned: never a
/// move on a guess); when it comes back, so does the plan. The nodes carry no
/// `nvidia.com/gpu.memory` label, so the Device objects are the only source.
#[tokio::test]
async fn koordinator_device_objects_are_watched() {
    let mut c = Case::new("koord", 0, 2).await;
    c.cluster
        .apply_crds(&repo_root().join(KOORD_CRD_DIR))
        .await
        .unwrap();
    let nodes = c
        .cluster
        .add_nodes(
            &GpuNodes::new(2, 2)
                .name_prefix(c.name())
                .label(POOL_LABEL, c.name())
                .taint(POOL_LABEL, c.name(), "NoSchedule")
                .resource("koordinator.sh/gpu-core", "200")
                .resource("koordinator.sh/gpu-memory-ratio", "200")
                .resource("koordinator.sh/gpu-memory", "32Gi"),
        )
        .await
        .unwrap();
    c.pool.nodes = nodes.clone();
    let devices = koord_devices(&c.client);
    for n in &nodes {
        devices
            .create(&PostParams::default(), &koord_device(n))
            .await
            .unwrap();
    }
    for (app, node, minor) in [
        ("a0", &nodes[0], 0),
        ("a1", &nodes[0], 1),
        ("b0", &nodes[1], 0),
    ] {
        c.deployments()
            .create(
                &PostParams::default(),
                &koord_deployment(&c.pool, app, node, minor),
            )
            .await
            .unwrap();
    }
    wait_ready_pods(&c.client, c.name(), "koord=true", 3, T)
        .await
        .unwrap();
    // Single replicas whose owners allow a disruption.
    allow_one_disruption(
        &c.client,
        c.name(),
        &["a0".into(), "a1".into(), "b0".into()],
    )
    .await
    .unwrap();
    c.dry_run_policy(
        json!([{"gpus": 1}]),
        json!({"maxEvictionsPerRun": 10, "maxEvictionsPerNode": 4, "maxEvictionsPerNamespace": 10}),
    )
    .await;
    let _op = Operator::start(c.cluster, c.name(), &[]).await.unwrap();
    let known = |s: &Value| s.pointer("/skipped/unknown-allocation").is_none();
    let st = wait_status(&c.client, c.name(), "a plan over known pods", T, |s| {
        int_at(s, "/plan/totalMoves").unwrap_or(0) > 0 && known(s)
    })
    .await
    .unwrap();
    let moved = str_at(&st, "/plan/moves/0/pod")
        .unwrap_or_default()
        .to_string();
    assert!(
        [format!("{}/a0", c.name()), format!("{}/a1", c.name())]
            .iter()
            .any(|p| moved.starts_with(&format!("{p}-"))),
        "a half GPU of node 0 moves: {st:#}"
    );
    assert_eq!(
        str_at(&st, "/plan/moves/0/fromNode"),
        Some(nodes[0].as_str())
    );
    // Node 0's inventory goes away: its two pods are unknown, nothing is planned.
    devices
        .delete(&nodes[0], &DeleteParams::default())
        .await
        .unwrap();
    wait_status(&c.client, c.name(), "node 0's pods unknown", T, |s| {
        int_at(s, "/skipped/unknown-allocation") == Some(2)
            && int_at(s, "/plan/totalMoves") == Some(0)
    })
    .await
    .unwrap();
    // Back: known again, planned again.
    devices
        .create(&PostParams::default(), &koord_device(&nodes[0]))
        .await
        .unwrap();
    wait_status(&c.client, c.name(), "node 0's pods known again", T, |s| {
        int_at(s, "/plan/totalMoves").unwrap_or(0) > 0 && known(s)
    })
    .await
    .unwrap();
    for n in &nodes {
        devices.delete(n, &DeleteParams::default()).await.unwrap();
    }
    c.cleanup(&[c.name()]).await;
}

/// A node's `hami.io/device-cordon` value and taint keys, as a watch saw them.
type NodeFenceState = (Option<String>, Vec<String>);

/// A HAMi node's GPU record: GPUs `uuids`, 80 GiB each, split in 10.
fn hami_register(uuids: &[String]) -> String {
    let devs: Vec<Value> = uuids
        .iter()
        .enumerate()
        .map(|(i, u)| {
            json!({"id": u, "index": i, "count": 10, "devmem": 81920, "devcore": 100,
                "type": "NVIDIA-H100", "numa": 0, "mode": "hami-core", "health": true})
        })
        .collect();
    Value::Array(devs).to_string()
}

/// A one-replica Deployment whose pods hold `cores`% of GPU `uuid` on `node`, as HAMi's
/// scheduler records it (the test plays HAMi: every pod of it, replacements included,
/// carries the record of the template).
fn hami_deployment(pool: &Pool, app: &str, node: &str, uuid: &str, cores: u32) -> Deployment {
    let record = format!("{uuid},NVIDIA,8192,{cores}:;");
    let res = json!({"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"});
    recorded_deployment(
        pool,
        app,
        node,
        ("hami", ("hami.io/vgpu-devices-allocated", record)),
        res,
    )
}

/// HAMi: draining one GPU fences that GPU only, in the node's `hami.io/device-cordon`
/// (the node keeps receiving pods: no taint). An administrator's cordon already there is
/// kept during the run and left after it; the run's own
/// entry is there while it evicts and gone when it ends. The replacement carries the old
/// record (this test plays a HAMi that ignores the cordon), so it lands back on the fenced
/// GPU: the run reports it as a bounce.
#[tokio::test]
async fn hami_single_gpu_drain_cordons_only_that_gpu() {
    let mut c = Case::new("hami", 0, 3).await;
    let uuids: Vec<String> = ["admin", "b", "c"]
        .iter()
        .map(|g| format!("GPU-{}-{g}", c.name()))
        .collect();
    let admin = &uuids[0];
    let nodes = c
        .cluster
        .add_nodes(
            &GpuNodes::new(1, 30)
                .name_prefix(c.name())
                .label(POOL_LABEL, c.name())
                .taint(POOL_LABEL, c.name(), "NoSchedule")
                .annotation("hami.io/node-nvidia-register", hami_register(&uuids))
                .annotation("hami.io/device-cordon", format!(" {admin} ")),
        )
        .await
        .unwrap();
    c.pool.nodes = nodes.clone();
    let node = nodes[0].clone();
    for (app, uuid, cores) in [("x", &uuids[1], 30), ("y", &uuids[2], 60)] {
        c.deployments()
            .create(
                &PostParams::default(),
                &hami_deployment(&c.pool, app, &node, uuid, cores),
            )
            .await
            .unwrap();
    }
    wait_ready_pods(&c.client, c.name(), "hami=true", 2, T)
        .await
        .unwrap();
    allow_one_disruption(&c.client, c.name(), &["x".into(), "y".into()])
        .await
        .unwrap();
    c.dry_run_policy(
        json!([{"gpus": 1}]),
        json!({"maxEvictionsPerRun": 1, "maxEvictionsPerNode": 1, "maxEvictionsPerNamespace": 1}),
    )
    .await;

    // Every value the node's cordon list takes, from a watch (no change is missed).
    let seen: std::sync::Arc<std::sync::Mutex<Vec<NodeFenceState>>> = Default::default();
    let watch = {
        let (seen, api) = (seen.clone(), Api::<Node>::all(c.client.clone()));
        let cfg =
            kube::runtime::watcher::Config::default().fields(&format!("metadata.name={node}"));
        tokio::spawn(async move {
            use futures::StreamExt;
            use kube::runtime::WatchStreamExt;
            let mut events = kube::runtime::watcher(api, cfg)
                .default_backoff()
                .applied_objects()
                .boxed();
            while let Some(event) = events.next().await {
                let Ok(n) = event else { continue };
                let a = n.metadata.annotations.unwrap_or_default();
                let taints: Vec<String> = n
                    .spec
                    .and_then(|s| s.taints)
                    .unwrap_or_default()
                    .into_iter()
                    .map(|t| t.key)
                    .collect();
                let mut s = seen.lock().unwrap();
                let v = (a.get("hami.io/device-cordon").cloned(), taints);
                if s.last() != Some(&v) {
                    s.push(v);
                }
            }
        })
    };

    let _op = Operator::start(c.cluster, c.name(), &[]).await.unwrap();
    let st = wait_status(&c.client, c.name(), "a plan draining one GPU", T, |s| {
        int_at(s, "/plan/totalMoves") == Some(1)
    })
    .await
    .unwrap();
    // One pod moves to the other used GPU of the node (the administrator's GPU takes none).
    let m = &st["plan"]["moves"][0];
    let (from, to) = (strings_at(m, "/fromDevices"), strings_at(m, "/toDevices"));
    assert_eq!((from.len(), to.len()), (1, 1), "{st:#}");
    let drained = from[0].clone();
    assert!(
        drained != *admin && to[0] != *admin && to[0] != drained,
        "{st:#}"
    );
    assert_eq!(str_at(m, "/toNode"), Some(node.as_str()));

    c.enforce_now().await;
    let st = c.finished_run().await;
    let run = &st["lastRuns"][0];
    assert_eq!(
        (int_at(run, "/evicted"), int_at(run, "/bounced")),
        (Some(1), Some(1)),
        "{run:#}"
    );
    assert_eq!(
        run.pointer("/fencedDevices"),
        Some(&json!([{"node": node, "gpu": drained}])),
        "{run:#}"
    );
    assert_eq!(strings_at(run, "/fencedNodes"), Vec::<String>::new());

    // The node as the run left it: the administrator's cordon, nothing of the run's.
    let n = Api::<Node>::all(c.client.clone()).get(&node).await.unwrap();
    let a = n.metadata.annotations.unwrap_or_default();
    assert_eq!(a.get("hami.io/device-cordon"), Some(admin), "{a:?}");
    assert!(!a.contains_key("gpu-defrag.io/device-cordon"), "{a:?}");
    watch.abort();
    let seen = seen.lock().unwrap().clone();
    let lists: Vec<Option<String>> = seen.iter().map(|(l, _)| l.clone()).collect();
    assert!(
        lists.contains(&Some(format!("{admin},{drained}"))),
        "the drained GPU was never cordoned: {seen:?}"
    );
    assert!(
        seen.iter().all(|(_, t)| !t.iter().any(|k| is_fence_key(k))),
        "a GPU drain tainted the node: {seen:?}"
    );
    assert_eq!(lists.last(), Some(&Some(admin.clone())), "{seen:?}");
    c.cleanup(&[c.name()]).await;
}

/// Cordons every pool node but `node` (or uncordons all with `None`).
async fn cordon_all_but(c: &Case, node: Option<&str>) {
    let nodes: Api<Node> = Api::all(c.client.clone());
    for n in &c.pool.nodes {
        let unschedulable = node.is_some_and(|keep| keep != n);
        nodes
            .patch(
                n,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(json!({"spec": {"unschedulable": unschedulable}})),
            )
            .await
            .unwrap();
    }
}

/// Bin-packing puts a workload's replicas together: three 8-GPU nodes, each holding the two
/// 2-GPU replicas of its own Deployment (no PDB), and a pending 8-GPU pod. With the default
/// limits (`maxUnavailablePerWorkload: 1`, `maxEvictionsPerNode: 4`) the plan drains one
/// node — both replicas of one workload — and the run evicts them one at a time, each
/// after the replacement of the previous one is Ready: the workload never has fewer than
/// one Ready replica, and the 8-GPU pod then runs on the emptied node.
#[tokio::test]
async fn replicas_packed_on_nodes_drain_one_at_a_time_with_default_limits() {
    let c = Case::new("replicas", 3, 8).await;
    let apps: Vec<String> = (0..3).map(|i| format!("svc-{i}")).collect();
    for (i, app) in apps.iter().enumerate() {
        cordon_all_but(&c, Some(&c.pool.nodes[i])).await;
        let d = c.pool.deployment(app, 2, 2).unwrap();
        c.deployments()
            .create(&PostParams::default(), &d)
            .await
            .unwrap();
        let running = wait_ready_pods(&c.client, c.name(), &format!("app={app}"), 2, T)
            .await
            .unwrap();
        for p in &running {
            assert_eq!(pod_node(p), Some(c.pool.nodes[i].as_str()));
        }
    }
    cordon_all_but(&c, None).await;
    c.pending_training_job().await;
    // Default limits: no `limits` at all.
    c.dry_run_policy(json!([{"gpus": 8}]), json!({})).await;
    let _op = Operator::start(c.cluster, c.name(), &[]).await.unwrap();
    let st = wait_status(&c.client, c.name(), "a plan draining one node", T, |s| {
        int_at(s, "/plan/totalMoves") == Some(2)
    })
    .await
    .unwrap();
    let moves = st.pointer("/plan/moves").and_then(Value::as_array).unwrap();
    let from: BTreeSet<&str> = moves
        .iter()
        .filter_map(|m| str_at(m, "/fromNode"))
        .collect();
    assert_eq!(from.len(), 1, "{st:#}");
    let planned_app: BTreeSet<String> = moves
        .iter()
        .filter_map(|m| str_at(m, "/pod"))
        .map(|p| {
            p.split('/')
                .nth(1)
                .unwrap()
                .rsplitn(3, '-')
                .nth(2)
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(
        planned_app.len(),
        1,
        "both moves are of one workload: {st:#}"
    );

    let watch = PodWatch::start(&c.client, c.name(), &c.pool, c.name())
        .await
        .unwrap();
    c.enforce_now().await;
    let st = c.finished_run().await;
    let run = st.pointer("/lastRuns/0").unwrap().clone();
    assert_eq!(str_at(&run, "/result"), Some("Succeeded"), "{run:#}");
    assert_eq!(int_at(&run, "/evicted"), Some(2), "{run:#}");
    let train_node = c.training_job_running(T).await;
    assert!(
        from.contains(train_node.as_str()),
        "the 8-GPU pod runs on {train_node}"
    );
    for app in &apps {
        wait_ready_pods(&c.client, c.name(), &format!("app={app}"), 2, T)
            .await
            .unwrap();
    }
    let seen = watch.seen();
    for app in &apps {
        let n = seen.ready_low[app];
        assert!(n >= 1, "{app} had {n} Ready replicas during the run");
    }
    assert_eq!(seen.violations, BTreeMap::new());
    assert_eq!(c.fenced_nodes().await, Vec::<String>::new());
    c.cleanup(&[c.name()]).await;
}

/// A Deployment pod that names a Volcano pod group (`scheduling.k8s.io/group-name`) may be a
/// gang member; where the group cannot be read (here: no Volcano CRD), it is never moved
/// (`gang-unknown`), even when draining its node would be the cheapest plan: the run
/// drains another node instead and the gang's pods keep running where they are.
#[tokio::test]
async fn gang_annotated_deployment_pod_is_never_moved() {
    let c = Case::new("gang", 3, 8).await;
    let n = &c.pool.nodes;
    // n0: two pods of a Deployment in a Volcano group, nothing else — the cheapest drain.
    let mut gang = c.pool.deployment("gang", 2, 1).unwrap();
    let tpl = gang.spec.template.metadata.as_mut().unwrap();
    tpl.annotations = Some(
        [(
            "scheduling.k8s.io/group-name".to_string(),
            "gang-pg".to_string(),
        )]
        .into(),
    );
    gang.spec.template.spec.as_mut().unwrap().node_name = Some(n[0].clone());
    c.deployments()
        .create(&PostParams::default(), &gang)
        .await
        .unwrap();
    let gang_uids: BTreeSet<String> = wait_ready_pods(&c.client, c.name(), "app=gang", 2, T)
        .await
        .unwrap()
        .iter()
        .filter_map(|p| p.metadata.uid.clone())
        .collect();
    // n1, n2: six fillers each.
    fragment(&c.client, c.name(), &c.pool, &[0, 6, 6])
        .await
        .unwrap();
    c.pending_training_job().await;
    c.dry_run_policy(
        json!([{"gpus": 8}]),
        json!({"maxEvictionsPerRun": 20, "maxEvictionsPerNode": 8,
               "maxEvictionsPerNamespace": 20, "maxInFlight": 2}),
    )
    .await;
    let _op = Operator::start(c.cluster, c.name(), &[]).await.unwrap();
    let st = wait_status(
        &c.client,
        c.name(),
        "a plan with the gang skipped",
        T,
        |s| {
            int_at(s, "/plan/totalMoves").unwrap_or(0) > 0
                && int_at(s, "/skipped/gang-unknown") == Some(2)
        },
    )
    .await
    .unwrap();
    for m in st.pointer("/plan/moves").and_then(Value::as_array).unwrap() {
        assert_ne!(str_at(m, "/fromNode"), Some(n[0].as_str()), "{m}");
        assert!(!str_at(m, "/pod").unwrap().contains("/gang-"), "{m}");
    }
    let watch = PodWatch::start(&c.client, c.name(), &c.pool, c.name())
        .await
        .unwrap();
    c.enforce_now().await;
    let st = c.finished_run().await;
    let run = st.pointer("/lastRuns/0").unwrap().clone();
    assert!(int_at(&run, "/evicted").unwrap_or(0) > 0, "{run:#}");
    for p in strings_at(&run, "/evictedPods") {
        assert!(
            p.starts_with(&format!("{}/infer-", c.name())),
            "evicted {p}"
        );
    }
    let train_node = c.training_job_running(T).await;
    assert_ne!(train_node, n[0]);
    let now = c.uids().await;
    for uid in &gang_uids {
        assert!(now.contains_key(uid), "a gang pod was replaced");
    }
    for p in watch.seen().gone() {
        assert_ne!(p.app, "gang", "{p:?}");
    }
    assert_eq!(c.fenced_nodes().await, Vec::<String>::new());
    c.cleanup(&[c.name()]).await;
}
