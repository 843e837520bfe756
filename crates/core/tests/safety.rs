//! Safe plans by default, end to end: Kubernetes objects (JSON, deserialised into
//! `k8s_openapi` types) → `ingest::build_cluster` → `plan::plan`.
//!
//! The scenario is the issue's "one risky pod per node, each next to a node with room":
//! every risky pod sits alone on an 8-GPU node `src-<id>` (7 GPUs free, useless for the
//! 8-GPU target shape), next to a receiver `recv-<id>` with room for it. Draining any
//! `src-<id>` would free a whole node, so a harmless pod there IS planned (the control
//! cases prove it); each risky pod must instead be reported with its exact skip code.
use std::collections::BTreeSet;

use gpu_defrag_core::model::*;
use gpu_defrag_core::plan::{History, Live, Plan, Skip, Workloads};
use gpu_defrag_core::policy::Policy;
use gpu_defrag_core::workload::Listed;
use serde_json::{Value, json};

/// The fixtures: objects, [`World`], plan helpers (shared with `gangs.rs`).
mod common;
use common::*;

// ---- The scenario ------------------------------------------------------------------------

/// Keys of the two control pods of [`risky_world`].
const SHM: &str = "ml/shm-a";
const SOLO: &str = "ml/solo-a";
/// The local-storage and Job pods of [`risky_world`] (their rules are policy switches).
const SCRATCH: &str = "ml/scratch-a";
const BATCH: &str = "ml/nightly-1-x7k2p";

/// One risky pod per node, each next to a node with room, plus two harmless controls.
fn risky_world() -> World {
    let mut w = World::new();

    // -- Training operators and other custom controllers: custom-controller.
    for (id, api, kind) in [
        ("pytorch", "kubeflow.org/v1", "PyTorchJob"),
        ("mpi", "kubeflow.org/v2beta1", "MPIJob"),
        ("tf", "kubeflow.org/v1", "TFJob"),
        ("xgb", "kubeflow.org/v1", "XGBoostJob"),
    ] {
        let p = PodJson::new("ml", &format!("{id}-worker-0"), 1)
            .owner(api, kind, id)
            .label("training.kubeflow.org/job-name", id)
            .label("training.kubeflow.org/replica-type", "worker");
        w.risky(id, "custom-controller", p, false);
    }
    // LeaderWorkerSet: the workers' StatefulSet is owned by the leader Pod; the leader's
    // StatefulSet by the LeaderWorkerSet.
    w.stateful_set("ml", "lws-0", Some(("v1", "Pod", "lws-0")));
    w.stateful_set(
        "ml",
        "lws",
        Some(("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "lws")),
    );
    let worker = PodJson::new("ml", "lws-0-1", 1)
        .owner("apps/v1", "StatefulSet", "lws-0")
        .label("leaderworkerset.sigs.k8s.io/name", "lws");
    w.risky("lws-worker", "custom-controller", worker, false);
    let leader = PodJson::new("ml", "lws-0", 1)
        .owner("apps/v1", "StatefulSet", "lws")
        .label("leaderworkerset.sigs.k8s.io/name", "lws");
    w.risky("lws-leader", "custom-controller", leader, false);
    let ray = PodJson::new("ml", "rc-worker-gpu-abcde", 1)
        .owner("ray.io/v1", "RayCluster", "rc")
        .label("ray.io/cluster", "rc");
    w.risky("ray", "custom-controller", ray, false);
    let step = PodJson::new("ml", "wf-step-123", 1).owner("argoproj.io/v1alpha1", "Workflow", "wf");
    w.risky("argo", "custom-controller", step, false);
    // Spark: the driver has no owner; the executors are owned by the driver Pod.
    let driver = PodJson::new("ml", "spark-driver", 1).label("spark-role", "driver");
    w.risky("spark-driver", "no-controller", driver, false);
    let exec = PodJson::new("ml", "spark-exec-1", 1)
        .owner("v1", "Pod", "spark-driver")
        .label("spark-role", "executor");
    w.risky("spark-exec", "custom-controller", exec, false);
    let widget = PodJson::new("ml", "widget-0", 1).owner("example.com/v1", "Widget", "widget");
    w.risky("crd", "custom-controller", widget, false);

    // -- Gangs: plain Deployment pods that a gang scheduler groups.
    w.objs.pod_groups.push(json!({
        "apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
        "metadata": {"namespace": "ml", "name": "pg-four"}, "spec": {"minMember": 4}
    }));
    let p = w
        .deployment_pod("ml", "vc", "vc-a", 1)
        .annotate("scheduling.k8s.io/group-name", "pg-four");
    w.risky("volcano", "gang", p, true);
    let p = w
        .deployment_pod("ml", "vc-lost", "vc-lost-a", 1)
        .annotate("scheduling.k8s.io/group-name", "pg-missing");
    w.risky("volcano-missing", "gang-unknown", p, true);
    let p = w
        .deployment_pod("ml", "cosched", "cosched-a", 1)
        .label("scheduling.x-k8s.io/pod-group", "cg");
    w.risky("cosched", "gang", p, true);
    let p = w
        .deployment_pod("ml", "kai", "kai-a", 1)
        .annotate("pod-group-name", "kg");
    w.risky("kai-group", "gang-unknown", p, true);

    // -- Storage and claims.
    w.stateful_set("ml", "db", None);
    let p = PodJson::new("ml", "db-0", 1)
        .owner("apps/v1", "StatefulSet", "db")
        .label("app", "db")
        .volume(json!({"name": "data", "persistentVolumeClaim": {"claimName": "data-db-0"}}));
    w.risky("pvc", "pvc", p, true);
    let p = w.deployment_pod("ml", "eph", "eph-a", 1).volume(json!({
        "name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {
            "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "10Gi"}}}}}
    }));
    w.risky("ephemeral", "ephemeral-volume", p, true);
    let p = w.deployment_pod("ml", "dra", "dra-a", 1).spec(
        "resourceClaims",
        json!([{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]),
    );
    w.risky("claim", "resource-claim", p, true);
    let p = w
        .deployment_pod("ml", "scratch", "scratch-a", 1)
        .volume(json!({"name": "tmp", "emptyDir": {}}));
    w.risky("scratch", "local-storage", p, true);

    // -- Opt-outs written by the pods' owners.
    let p = w
        .deployment_pod("ml", "ca", "ca-a", 1)
        .annotate("cluster-autoscaler.kubernetes.io/safe-to-evict", "false");
    w.risky("ca-opt-out", "opted-out", p, true);
    let p = w
        .deployment_pod("ml", "koord", "koord-a", 1)
        .annotate("scheduling.koordinator.sh/eviction-cost", "2147483647");
    w.risky("koord-opt-out", "opted-out", p, true);
    w.namespace("locked", true);
    let p = w.deployment_pod("locked", "guarded", "guarded-a", 1);
    w.risky("ns-opt-out", "namespace-opted-out", p, true);

    // -- Workload state.
    // Not Ready, while its other replica (on the receiver) is.
    let sick = w.deployment_pod("ml", "sick", "sick-a", 1);
    let key = w.pair("not-ready", sick.clone().not_ready());
    w.pod(sick.renamed("sick-a-b").on("recv-not-ready"));
    w.expected.push((key, "not-ready"));
    let p = w.deployment_pod("ml", "single", "single-a", 1);
    w.risky("single", "last-ready-replica", p, false);
    let p = w.deployment_pod("ml", "stale", "stale-a", 1);
    w.pdb("ml", "stale", 1, 2, 1);
    w.risky("pdb-stale", "pdb-stale", p, false);
    let p = w.deployment_pod("ml", "half", "half-a", 1);
    w.risky("half-up", "workload-unavailable", p, false);
    let waiting = w.deployment_pod("ml", "half", "half-b", 1).pending();
    w.pod(waiting);

    // -- Owner chains.
    let p = PodJson::new("ml", "ghost-7f9c-q2w3e", 1)
        .owner("apps/v1", "ReplicaSet", "ghost-7f9c")
        .label("app", "ghost");
    w.risky("orphan", "owner-unknown", p, true);
    w.job("ml", "nightly-1");
    let p = PodJson::new("ml", "nightly-1-x7k2p", 1).owner("batch/v1", "Job", "nightly-1");
    w.risky("job", "job-pod", p, false);

    // -- Controls: harmless pods, planned.
    let shm = w
        .deployment_pod("ml", "shm", "shm-a", 1)
        .volume(json!({"name": "dshm", "emptyDir": {"medium": "Memory"}}));
    assert_eq!(w.pair_with_twin("shm", shm), SHM);
    let solo = w.deployment_pod("ml", "solo", "solo-a", 1);
    w.pdb("ml", "solo", 1, 3, 3);
    assert_eq!(w.pair("solo", solo), SOLO);
    w
}

// ---- 1. Default policy: no risky pod is planned, each with its code ----------------------

#[test]
fn risky_pods_are_never_planned_by_default() {
    let w = risky_world();
    let c = w.build();
    assert!(
        c.nodes
            .iter()
            .all(|n| n.inconsistent.is_none() && n.unknown_pods == 0),
        "every record is readable"
    );
    assert!(
        c.unchecked.is_empty(),
        "everything listed: {:?}",
        c.unchecked
    );
    let p = run(&c, &eight_gpu_policy());
    for (key, code) in &w.expected {
        assert_skipped(&p, key, code);
    }
    // Every skip code the scenario is about shows up.
    let codes: BTreeSet<&str> = w.expected.iter().map(|(_, c)| *c).collect();
    assert_eq!(codes.len(), 16, "{codes:?}");
    // Only the controls move, and each empties its source node.
    let keys: BTreeSet<&str> = p.moves.iter().map(|m| m.pod.as_str()).collect();
    assert_eq!(keys, BTreeSet::from([SHM, SOLO]), "{:#?}", p.moves);
    for m in &p.moves {
        assert!(m.to_node.starts_with("recv-"), "{m:?}");
    }
}

// ---- 2. Controls: harmless pods are planned ----------------------------------------------

#[test]
fn harmless_pods_next_to_room_are_planned() {
    let c = risky_world().build();
    let p = run(&c, &eight_gpu_policy());
    // A memory-backed emptyDir (/dev/shm) is not local storage; another replica is Ready.
    assert!(!pod(&c, SHM).local_storage);
    assert_moved(&p, SHM);
    // The only replica, covered by a PDB (status current) that allows one disruption.
    assert_moved(&p, SOLO);
    assert!(p.fenced_nodes.contains(&"src-shm".to_string()));
    assert!(p.fenced_nodes.contains(&"src-solo".to_string()));
}

// ---- 3. Switches for local storage and Job pods leave the other rules alone --------------

#[test]
fn local_storage_and_job_switches_move_nothing_else() {
    let w = risky_world();
    let c = w.build();
    let policy = Policy {
        evict_local_storage: true,
        evict_job_pods: true,
        ..eight_gpu_policy()
    };
    let p = run(&c, &policy);
    // Gangs, training jobs, custom controllers, PVCs, claims and opt-outs: as before.
    for (key, code) in &w.expected {
        if *code != "local-storage" && *code != "job-pod" {
            assert_skipped(&p, key, code);
        }
    }
    // The switches took effect: the disk emptyDir pod (another replica Ready) moves; the
    // Job's only pod now meets the workload rule instead.
    assert_moved(&p, SCRATCH);
    assert_skipped(&p, BATCH, "last-ready-replica");
}

// ---- 4. safety.movableOwnerKinds opens a controller, never a gang --------------------------

#[test]
fn movable_owner_kinds_open_a_controller_but_never_a_gang() {
    let mut w = World::new();
    let srv = PodJson::new("ml", "srv-0", 1)
        .owner("example.com/v1", "InferenceServer", "srv")
        .label("app", "srv");
    let srv = w.pair_with_twin("srv", srv);
    let pt = PodJson::new("ml", "pt-worker-0", 1)
        .owner("kubeflow.org/v1", "PyTorchJob", "pt")
        .label("training.kubeflow.org/job-name", "pt");
    let pt = w.pair_with_twin("pt", pt);
    let c = w.build();

    let p = run(&c, &eight_gpu_policy());
    assert_skipped(&p, &srv, "custom-controller");
    assert_skipped(&p, &pt, "custom-controller");

    let policy = Policy {
        movable_owner_kinds: vec![
            "example.com/InferenceServer".into(),
            "kubeflow.org/PyTorchJob".into(),
        ],
        ..eight_gpu_policy()
    };
    let p = run(&c, &policy);
    assert_moved(&p, &srv);
    assert_skipped(&p, &pt, "gang");
}

// ---- 5. Without owner objects: judged by the pod, said so ----------------------------------

#[test]
fn without_owner_objects_pods_are_judged_by_themselves() {
    let mut w = World::new();
    let web = w.deployment_pod("ml", "web", "web-5f7c9d8b4-aaaaa", 1);
    let web = w.pair_with_twin("web", web);
    let twin = "ml/web-5f7c9d8b4-aaaaa-b";
    // A ReplicaSet without the pod-template-hash label stays a ReplicaSet.
    let bare = PodJson::new("ml", "api-x1-zzzzz", 1)
        .owner("apps/v1", "ReplicaSet", "api-x1")
        .label("app", "api");
    let bare = w.pair("bare", bare);
    w.objs.controllers.clear();
    w.objs.namespaces.clear();
    w.objs.listed = Listed::default();
    let c = w.build();

    let deployment = Workload {
        kind: "apps/Deployment".into(),
        name: "web".into(),
        chain: Chain::NotChecked,
    };
    assert_eq!(pod(&c, &web).workload.as_ref(), Some(&deployment));
    assert_eq!(pod(&c, twin).workload.as_ref(), Some(&deployment));
    let live = Workloads::of(&c);
    assert_eq!(
        live.live(pod(&c, &web)),
        Live {
            ready: 2,
            unavailable: 0
        }
    );
    assert_eq!(
        pod(&c, &bare).workload,
        Some(Workload {
            kind: "apps/ReplicaSet".into(),
            name: "api-x1".into(),
            chain: Chain::NotChecked,
        })
    );

    let p = run(&c, &eight_gpu_policy());
    assert!(!p.unchecked.is_empty());
    assert!(
        p.unchecked.iter().any(|u| u.contains("replicasets")),
        "{:?}",
        p.unchecked
    );
    assert_moved(&p, &web);
    assert_skipped(&p, &bare, "last-ready-replica");
}

// ---- 6. Pending pods: only the policy's namespaces, never above their priority ------------

/// `src-web` holds one replica of `web` (priority `prio`), `recv-web` the other and room.
/// With a 1-GPU target shape, draining `src-web` lowers no metric: only serving a pending
/// 8-GPU pod could justify it.
fn pending_world(prio: i32, pending: Option<(&str, i32)>) -> Cluster {
    let mut w = World::new();
    let web = w
        .deployment_pod("ml", "web", "web-a", 1)
        .spec("priority", json!(prio));
    w.pair_with_twin("web", web);
    if let Some((ns, p)) = pending {
        w.pod(
            PodJson::new(ns, "big", 8)
                .spec("priority", json!(p))
                .pending(),
        );
    }
    w.build()
}

fn pending_policy() -> Policy {
    let mut p = Policy {
        shapes: vec![shape(1)],
        from_pending: true,
        ..Policy::default()
    };
    p.scope.include = vec!["ml".into()];
    p
}

#[test]
fn pending_pods_outside_the_scope_steer_nothing() {
    let policy = pending_policy();
    let baseline = run(&pending_world(0, None), &policy);
    assert!(baseline.moves.is_empty(), "{:#?}", baseline.moves);
    // Control: the same pending pod in a covered namespace does cause the drain.
    let served = run(&pending_world(0, Some(("ml", 0))), &policy);
    assert!(moved(&served, "ml/web-a"), "{:#?}", served);
    assert_eq!(served.pending_served, vec!["ml/big".to_string()]);
    // Outside `scope.include`: exactly the baseline.
    let other = run(&pending_world(0, Some(("other", 0))), &policy);
    assert_eq!(other.moves, baseline.moves);
    assert!(other.pending_served.is_empty());
}

#[test]
fn pending_pods_never_evict_higher_priority_pods() {
    let policy = pending_policy();
    let low = run(&pending_world(100, Some(("ml", 0))), &policy);
    assert!(low.moves.is_empty(), "{:#?}", low.moves);
    assert!(low.pending_served.is_empty());
    let high = run(&pending_world(100, Some(("ml", 1000))), &policy);
    assert!(moved(&high, "ml/web-a"), "{:#?}", high);
    assert_eq!(high.pending_served, vec!["ml/big".to_string()]);
}

// ---- 7. Records a tenant can forge are confirmed by the scheduler's side ------------------

fn kai_world(reservation: Option<(&str, &str, &str)>) -> Cluster {
    let mut w = World::new();
    w.node(gpu_node("kai-node", 8));
    w.node(gpu_node("kai-other", 8));
    let frac = w
        .deployment_pod("ml", "frac", "frac-a", 0)
        .annotate("gpu-fraction", "0.5")
        .label("runai-gpu-group", "g1")
        .on("kai-node");
    w.pod(frac);
    if let Some((ns, group, node)) = reservation {
        let r = PodJson::new(ns, &format!("runai-reservation-{group}"), 1)
            .label("runai-gpu-group", group)
            .label("app", "runai-reservation")
            .on(node);
        w.pod(r);
    }
    w.build()
}

#[test]
fn a_kai_fraction_counts_only_with_its_reservation_pod() {
    // No reservation pod at all, one of another group, one in a tenant namespace, one on
    // another node: the tenant's own annotation and label confirm nothing.
    for reservation in [
        None,
        Some(("kai-resource-reservation", "g2", "kai-node")),
        Some(("ml", "g1", "kai-node")),
        Some(("kai-resource-reservation", "g1", "kai-other")),
    ] {
        let c = kai_world(reservation);
        let frac = pod(&c, "ml/frac-a");
        match &frac.gpu {
            GpuUse::Unknown(r) => assert_eq!(r.code(), "record-unconfirmed", "{reservation:?}"),
            other => panic!("{reservation:?}: {other:?}"),
        }
        let node = &c.nodes[c.node_index("kai-node").unwrap()];
        assert!(node.unknown_pods >= 1, "{reservation:?}");
        let p = run(&c, &eight_gpu_policy());
        assert_skipped(&p, "ml/frac-a", "unknown-allocation");
    }
    // With KAI's reservation pod of g1 on the node, the half GPU is counted.
    let c = kai_world(Some(("kai-resource-reservation", "g1", "kai-node")));
    assert_eq!(pod(&c, "ml/frac-a").gpu, GpuUse::Devices(vec![(0, 500)]));
    let node = &c.nodes[c.node_index("kai-node").unwrap()];
    assert_eq!(node.gpus[0].used, 500);
    assert_eq!(node.unknown_pods, 0);
}

/// An 8-GPU Koordinator node (no Device object: the GPUs are counted from
/// `koordinator.sh/gpu-core`).
fn koord_node(name: &str) -> Value {
    let mut n = gpu_node(name, 0);
    n["status"]["allocatable"] = json!({"cpu": "64", "memory": "512Gi", "pods": "110",
        "koordinator.sh/gpu-core": "800", "koordinator.sh/gpu-memory-ratio": "800"});
    n
}

#[test]
fn a_koordinator_record_without_a_gpu_request_is_unknown() {
    const RECORD: &str = r#"{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":100}}]}"#;
    let mut w = World::new();
    w.node(koord_node("koord-node"));
    let forged = w
        .deployment_pod("ml", "forged", "forged-a", 0)
        .annotate("scheduling.koordinator.sh/device-allocated", RECORD)
        .on("koord-node");
    w.pod(forged);
    let c = w.build();
    let node = &c.nodes[c.node_index("koord-node").unwrap()];
    assert_eq!((node.scheme, node.gpus.len()), (Scheme::Koordinator, 8));
    match &pod(&c, "ml/forged-a").gpu {
        GpuUse::Unknown(r) => assert_eq!(r.code(), "record-disagrees-with-request"),
        other => panic!("{other:?}"),
    }
    assert_eq!(node.unknown_pods, 1);

    // Control: the same record on a pod that asks for the GPU core is read.
    let mut w = World::new();
    w.node(koord_node("koord-node"));
    let mut honest = w
        .deployment_pod("ml", "honest", "honest-a", 0)
        .annotate("scheduling.koordinator.sh/device-allocated", RECORD)
        .on("koord-node");
    honest.0["spec"]["containers"][0]["resources"]["limits"] =
        json!({"koordinator.sh/gpu-core": "100"});
    w.pod(honest);
    let c = w.build();
    assert_eq!(pod(&c, "ml/honest-a").gpu, GpuUse::Devices(vec![(0, 1000)]));
}

// ---- 8. Node warm-up: young or starting nodes receive nothing ----------------------------

/// `src-web` holds one replica of `web` (the other is on `recv-web`); `recv-web` is the
/// only node with room. `young`: it became Ready a minute ago; `taint`: it carries the
/// cloud provider's start-up taint (which the pods tolerate, so only the start-up rule
/// can keep them off).
fn warmup_world(young: bool, taint: bool) -> Cluster {
    let mut w = World::new();
    let tolerate = json!([{"key": "node.cloudprovider.kubernetes.io/uninitialized",
        "operator": "Exists"}]);
    let web = w
        .deployment_pod("ml", "web", "web-a", 1)
        .spec("tolerations", tolerate);
    w.pair_with_twin("web", web);
    let mut recv: k8s_openapi::api::core::v1::Node = {
        let mut n = gpu_node("recv-web", 8);
        if young {
            n["status"]["conditions"][0]["lastTransitionTime"] = json!(ago(1));
        }
        if taint {
            n["spec"] = json!({"taints": [{"key": "node.cloudprovider.kubernetes.io/uninitialized",
                "value": "true", "effect": "NoSchedule"}]});
        }
        from_json(n)
    };
    let i = w
        .objs
        .nodes
        .iter()
        .position(|n| n.metadata.name.as_deref() == Some("recv-web"))
        .unwrap();
    std::mem::swap(&mut w.objs.nodes[i], &mut recv);
    w.build()
}

#[test]
fn young_and_starting_nodes_receive_no_planned_pod() {
    let policy = eight_gpu_policy();
    // The nodes that receive nothing yet are listed, each with why (an empty plan on a
    // new cluster says so).
    let settling = |p: &Plan| -> Vec<(String, String)> {
        p.settling_nodes
            .iter()
            .map(|s| (s.node.clone(), s.why.clone()))
            .collect()
    };
    // Control: a node Ready for a month receives the pod.
    let p = run(&warmup_world(false, false), &policy);
    assert_moved(&p, "ml/web-a");
    assert_eq!(p.moves[0].to_node, "recv-web");
    assert_eq!(settling(&p), []);
    // Ready 1 minute ago, minNodeAge 5m: nothing planned.
    let p = run(&warmup_world(true, false), &policy);
    assert!(p.moves.is_empty(), "{:#?}", p.moves);
    let s = settling(&p);
    assert_eq!(s.len(), 1, "{s:?}");
    assert_eq!(s[0].0, "recv-web");
    assert!(
        s[0].1.starts_with("Ready for 1m") && s[0].1.ends_with("under safety.minNodeAge 5m"),
        "{s:?}"
    );
    // Start-up taint: nothing planned, whatever its age.
    let p = run(&warmup_world(false, true), &policy);
    assert!(p.moves.is_empty(), "{:#?}", p.moves);
    assert_eq!(
        settling(&p),
        [(
            "recv-web".to_string(),
            "start-up taint node.cloudprovider.kubernetes.io/uninitialized".to_string()
        )]
    );
    // minNodeAge 0 and no taint: the young node receives it.
    let zero = Policy {
        min_node_age: std::time::Duration::ZERO,
        ..eight_gpu_policy()
    };
    let p = run(&warmup_world(true, false), &zero);
    assert_moved(&p, "ml/web-a");
    assert_eq!(p.moves[0].to_node, "recv-web");
    assert_eq!(settling(&p), []);
    // minNodeAge 0 does not lift the start-up taint.
    let p = run(&warmup_world(true, true), &zero);
    assert!(p.moves.is_empty(), "{:#?}", p.moves);
    assert_eq!(settling(&p).len(), 1);
}

/// A node whose records cannot all be read has no known free capacity: it receives no
/// planned pod (here a tenant's unconfirmed KAI fraction sits on the only node with room;
/// `sched::fits` refuses such a node).
#[test]
fn a_node_with_an_unknown_pod_receives_no_planned_pod() {
    let world = |forged: bool| {
        let mut w = World::new();
        let web = w.deployment_pod("ml", "web", "web-a", 1);
        w.pair_with_twin("web", web);
        if forged {
            let f = w
                .deployment_pod("ml", "frac", "frac-a", 0)
                .annotate("gpu-fraction", "0.5")
                .label("runai-gpu-group", "g9")
                .on("recv-web");
            w.pod(f);
        }
        w.build()
    };
    let policy = eight_gpu_policy();
    let p = run(&world(false), &policy);
    assert_moved(&p, "ml/web-a");
    let p = run(&world(true), &policy);
    assert!(
        p.moves.iter().all(|m| m.to_node != "recv-web"),
        "{:#?}",
        p.moves
    );
}

/// The soft opt-outs only rank: of two equal drains, the one whose pod carries
/// `prefer-no-eviction`, a positive Koordinator `eviction-cost` or a positive
/// `pod-deletion-cost` is left for last (here: out of a one-eviction run).
#[test]
fn soft_opt_outs_are_moved_last() {
    let world = |on: Option<&str>, k: &str, v: &str| {
        let mut w = World::new();
        for id in ["a", "b"] {
            let mut p = w.deployment_pod("ml", &format!("web{id}"), &format!("web{id}-x"), 1);
            if on == Some(id) {
                p = p.annotate(k, v);
            }
            w.pair_with_twin(id, p);
        }
        w.build()
    };
    let policy = Policy {
        max_evictions_per_run: 1,
        ..eight_gpu_policy()
    };
    let plain = run(&world(None, "", ""), &policy);
    assert_eq!(plain.moves.len(), 1, "{:#?}", plain.moves);
    let (first, other) = if plain.moves[0].pod == "ml/weba-x" {
        ("a", "ml/webb-x")
    } else {
        ("b", "ml/weba-x")
    };
    for (k, v) in [
        ("descheduler.alpha.kubernetes.io/prefer-no-eviction", ""),
        ("scheduling.koordinator.sh/eviction-cost", "100"),
        ("controller.kubernetes.io/pod-deletion-cost", "1000"),
    ] {
        let p = run(&world(Some(first), k, v), &policy);
        assert_eq!(p.moves.len(), 1, "{k}: {:#?}", p.moves);
        assert_eq!(p.moves[0].pod, other, "{k}");
    }
    // A negative cost is no opt-out: the order stays.
    let p = run(
        &world(
            Some(first),
            "controller.kubernetes.io/pod-deletion-cost",
            "-5",
        ),
        &policy,
    );
    assert_eq!(p.moves[0].pod, plain.moves[0].pod);
}

// ---- 9. Pod age counts from status.startTime ----------------------------------------------

#[test]
fn pod_age_counts_from_start_time_not_creation() {
    let age_world = |started: i64| {
        let mut w = World::new();
        let web = w
            .deployment_pod("ml", "web", "web-a", 1)
            .created(2 * HOUR)
            .started(started);
        w.pair_with_twin("web", web);
        w.build()
    };
    let policy = eight_gpu_policy();
    // Created 2 h ago, waited Pending, started 1 minute ago: too young (minPodAge 10m).
    let p = run(&age_world(1), &policy);
    assert_skipped(&p, "ml/web-a", "too-young");
    // Control: started an hour ago.
    let p = run(&age_world(HOUR), &policy);
    assert_moved(&p, "ml/web-a");
}

// ---- 9b. Only pods of a bin-packing scheduler move --------------------------------------------

#[test]
fn pods_of_a_scheduler_not_listed_as_binpacking_stay_put() {
    let sched_world = |name: Option<&str>| {
        let mut w = World::new();
        let web = w.deployment_pod("ml", "web", "web-a", 1).scheduler(name);
        w.pair_with_twin("web", web);
        w.build()
    };
    let policy = eight_gpu_policy();
    // The default scheduler spreads: its replacement would land on an empty node.
    for name in [None, Some("default-scheduler"), Some("volcano")] {
        let p = run(&sched_world(name), &policy);
        assert_skipped(&p, "ml/web-a", "scheduler-not-binpacking");
    }
    // Control: the gpu-binpack scheduler of config/scheduler.
    let p = run(&sched_world(Some("gpu-binpack")), &policy);
    assert_moved(&p, "ml/web-a");
    // Listing the default scheduler (its default profile set to bin-pack) opens it.
    let listed = Policy {
        binpack_schedulers: vec!["default-scheduler".into()],
        ..eight_gpu_policy()
    };
    let p = run(&sched_world(None), &listed);
    assert_moved(&p, "ml/web-a");
}

/// A pod whose scheduling depends on other pods (required anti-affinity against its own
/// replicas) moves only to a node where the constraint holds: never next to its twin,
/// in either landing mode; with no such node it stays. A term the model cannot evaluate
/// (a `namespaceSelector` over namespace labels) makes it `no-target`.
#[test]
fn pods_with_inter_pod_constraints_move_only_where_they_hold() {
    let anti = |ns_selector: bool| {
        let mut term = json!({"labelSelector": {"matchLabels": {"app": "web"}},
             "topologyKey": "kubernetes.io/hostname"});
        if ns_selector {
            term["namespaceSelector"] = json!({"matchLabels": {"team": "web"}});
        }
        json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}})
    };
    let world = |ns_selector: bool, spare: bool| {
        let mut w = World::new();
        let web = w
            .deployment_pod("ml", "web", "web-a", 1)
            .spec("affinity", anti(ns_selector));
        w.pair_with_twin("web", web);
        if spare {
            w.node(gpu_node("spare", 8));
            w.pod(
                PodJson::new("infra", "filler-spare", 6)
                    .label("app", "filler")
                    .on("spare"),
            );
        }
        w.build()
    };
    for landing_control in [true, false] {
        let policy = Policy {
            landing_control,
            ..eight_gpu_policy()
        };
        let p = run(&world(false, true), &policy);
        assert_moved(&p, "ml/web-a");
        let m = p.moves.iter().find(|m| m.pod == "ml/web-a").unwrap();
        assert_eq!(m.to_node, "spare", "never next to its twin on recv-web");
        let p = run(&world(false, false), &policy);
        assert!(!moved(&p, "ml/web-a"), "only the twin's node has room");
        let p = run(&world(true, true), &policy);
        assert_skipped(&p, "ml/web-a", "no-target");
    }
}

// ---- 10. Skip codes --------------------------------------------------------------------------

/// Fails to compile when a `Skip` is added, so that [`Skip::ALL`] is checked again.
fn variant_count(s: Skip) -> usize {
    match s {
        Skip::OutOfScope
        | Skip::UnknownAllocation
        | Skip::NodeUndrainable
        | Skip::Terminating
        | Skip::NotRunning
        | Skip::MirrorPod
        | Skip::NoController
        | Skip::DaemonSet
        | Skip::JobPod
        | Skip::LocalStorage
        | Skip::Priority
        | Skip::ProtectedClass
        | Skip::OptOut
        | Skip::TooYoung
        | Skip::MultiplePdbs
        | Skip::PdbExhausted
        | Skip::KaiReservation
        | Skip::SchedulerNotBinpacking
        | Skip::AlreadyMoved
        | Skip::NotReady
        | Skip::CustomController
        | Skip::OwnerUnknown
        | Skip::Gang
        | Skip::GangUnknown
        | Skip::NamespaceOptOut
        | Skip::Pvc
        | Skip::EphemeralVolume
        | Skip::ResourceClaim
        | Skip::NamedClaim
        | Skip::SharedClaim
        | Skip::PdbStale
        | Skip::WorkloadUnavailable
        | Skip::LastReadyReplica
        | Skip::NoTarget => 34,
    }
}

#[test]
fn every_skip_has_a_distinct_code() {
    assert_eq!(Skip::ALL.len(), variant_count(Skip::Gang));
    let variants: BTreeSet<Skip> = Skip::ALL.iter().copied().collect();
    assert_eq!(variants.len(), Skip::ALL.len(), "a skip listed twice");
    let codes: BTreeSet<&str> = Skip::ALL.iter().map(|s| s.code()).collect();
    assert_eq!(codes.len(), Skip::ALL.len(), "two skips share a code");
    for s in Skip::ALL {
        let c = s.code();
        assert!(!c.is_empty(), "{s:?}");
        assert!(
            c.chars().all(|ch| ch.is_ascii_lowercase() || ch == '-'),
            "{s:?}: {c}"
        );
    }
}

// ---- The executor's re-check before each eviction -------------------------------------------

/// A planned move, re-checked on a cluster changed after the plan: every change that makes
/// the eviction unsafe refuses it with its code; the unchanged cluster lets it go.
#[test]
fn a_planned_eviction_is_rechecked_on_the_cluster_of_the_moment() {
    use gpu_defrag_core::recheck::{Planned, Refusal, recheck};
    let world = |change: &dyn Fn(&mut World, PodJson) -> PodJson| {
        let mut w = World::new();
        let pod = w.deployment_pod("ml", "web", "web-1", 1);
        let twin = w.deployment_pod("ml", "web", "web-2", 1);
        let pod = change(&mut w, pod);
        w.pair("a", pod);
        w.pod(twin.on("recv-a"));
        w.build()
    };
    let planned = Planned {
        pod: "ml/web-1",
        uid: "uid-ml-web-1",
        from: "src-a",
        to: "recv-a",
    };
    let check = |c: &Cluster| recheck(c, planned, &eight_gpu_policy(), now(), &History::default());
    // Unchanged: the plan moves it, and the re-check lets it go.
    let unchanged = world(&|_, p| p);
    assert!(moved(&run(&unchanged, &eight_gpu_policy()), "ml/web-1"));
    assert_eq!(check(&unchanged), Ok(()));
    // An opt-out added during the run.
    let opted = world(&|_, p| p.annotate("gpu-defrag.io/do-not-disrupt", "true"));
    assert_eq!(check(&opted), Err(Refusal::Unmovable(Skip::OptOut)));
    // No longer Ready.
    let unready = world(&|_, p| p.not_ready());
    assert_eq!(check(&unready), Err(Refusal::Unmovable(Skip::NotReady)));
    // Another pod under the same name (a StatefulSet would do that): another UID.
    let replaced = world(&|_, p| {
        let mut p = p;
        p.0["metadata"]["uid"] = json!("uid-new");
        p
    });
    assert_eq!(check(&replaced).map_err(Refusal::code), Err("gone"));
    // Gone altogether, or elsewhere.
    assert_eq!(
        recheck(
            &unchanged,
            Planned {
                pod: "ml/web-9",
                ..planned
            },
            &eight_gpu_policy(),
            now(),
            &History::default()
        ),
        Err(Refusal::Gone)
    );
    assert_eq!(
        recheck(
            &unchanged,
            Planned {
                from: "recv-a",
                ..planned
            },
            &eight_gpu_policy(),
            now(),
            &History::default()
        ),
        Err(Refusal::Moved)
    );
    // Its workload lost a replica in the meantime (the twin is not Ready).
    let degraded = {
        let mut w = World::new();
        let pod = w.deployment_pod("ml", "web", "web-1", 1);
        let twin = w.deployment_pod("ml", "web", "web-2", 1).not_ready();
        w.pair("a", pod);
        w.pod(twin.on("recv-a"));
        w.build()
    };
    assert_eq!(
        check(&degraded),
        Err(Refusal::Unmovable(Skip::WorkloadUnavailable))
    );
    // The target filled up (another pod took its last 3 free GPUs) and no other node has
    // room (its own node is the one being drained).
    let full = world(&|w, p| {
        w.pod(
            PodJson::new("infra", "late", 3)
                .label("app", "late")
                .on("recv-a"),
        );
        p
    });
    assert_eq!(check(&full), Err(Refusal::NoRoom));
    assert_eq!(Refusal::NoRoom.code(), "no-room");
    // The target filled up, but another node has room: the scheduler places it there.
    let elsewhere = world(&|w, p| {
        w.pod(
            PodJson::new("infra", "late", 3)
                .label("app", "late")
                .on("recv-a"),
        );
        w.node(gpu_node("spare", 8));
        p
    });
    assert_eq!(check(&elsewhere), Ok(()));
    // Already evicted by this run.
    let history = History {
        evicted: vec!["ml/web-1".into()],
        ..Default::default()
    };
    assert_eq!(
        recheck(&unchanged, planned, &eight_gpu_policy(), now(), &history),
        Err(Refusal::Unmovable(Skip::AlreadyMoved))
    );
}
