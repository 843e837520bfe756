//! Gangs the pods' own objects declare, end to end (Kubernetes objects →
//! `ingest::build_cluster` → `plan::plan` and `plan::demand`): Kueue pod groups (label
//! `kueue.x-k8s.io/pod-group-name`, annotation `kueue.x-k8s.io/pod-group-total-count`) and
//! Kubernetes PodGroups (`spec.schedulingGroup.podGroupName` → `scheduling.k8s.io/v1beta1`
//! `PodGroup`, Kubernetes 1.37). A gang member is never moved (`gang`); a pod whose group
//! cannot be read is never moved and never served (`gang-unknown`).
use chrono::Duration;
use gpu_defrag_core::model::{Cluster, Gang};
use gpu_defrag_core::plan::demand::{served, waiting};
use gpu_defrag_core::policy::Policy;
use gpu_defrag_core::snapshot;
use serde_json::{Value, json};

/// The fixtures: objects, [`World`], plan helpers (shared with `safety.rs`).
mod common;
use common::*;

const KUEUE_GROUP: &str = "kueue.x-k8s.io/pod-group-name";
const KUEUE_COUNT: &str = "kueue.x-k8s.io/pod-group-total-count";

/// A Kubernetes PodGroup `ml/<name>` with `spec`.
fn scheduling_group(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
           "metadata": {"namespace": "ml", "name": name}, "spec": spec})
}

/// `pod` in Kubernetes PodGroup `group`.
fn in_group(pod: PodJson, group: &str) -> PodJson {
    pod.spec("schedulingGroup", json!({"podGroupName": group}))
}

/// `pod` in Kueue pod group `group`, with the total count annotation when given.
fn in_kueue(pod: PodJson, group: &str, count: Option<&str>) -> PodJson {
    let pod = pod.label(KUEUE_GROUP, group);
    match count {
        Some(c) => pod.annotate(KUEUE_COUNT, c),
        None => pod,
    }
}

fn gang(c: &Cluster, key: &str) -> Option<Gang> {
    pod(c, key).gang.clone()
}

// ---- Planner: gang members stay, groups that are no gang move ------------------------------

/// Deployment pods (each with a Ready twin on its receiver, so that the workload rules
/// alone would move it) in Kueue and Kubernetes pod groups; Kubernetes PodGroups listed
/// when `listed`. Returns the world and the keys of the pods that move.
fn group_world(listed: bool) -> (World, Vec<String>) {
    let mut w = World::new();
    w.objs.listed.scheduling_pod_groups = listed;
    for (name, spec) in [
        (
            "pg-gang",
            json!({"schedulingPolicy": {"gang": {"minCount": 4}}}),
        ),
        ("pg-basic", json!({"schedulingPolicy": {"basic": {}}})),
        (
            "pg-all",
            json!({"schedulingPolicy": {"basic": {}}, "disruptionMode": {"all": {}}}),
        ),
        (
            "pg-single",
            json!({"schedulingPolicy": {"gang": {"minCount": 1}}, "disruptionMode": {"single": {}}}),
        ),
    ] {
        w.objs.pod_groups.push(scheduling_group(name, spec));
    }
    let mut controls = Vec::new();

    // Kueue.
    let p = w.deployment_pod("ml", "kq", "kq-a", 1);
    w.risky("kueue", "gang", in_kueue(p, "train", Some("4")), true);
    let p = w.deployment_pod("ml", "kq-one", "kq-one-a", 1);
    controls.push(w.pair_with_twin("kueue-one", in_kueue(p, "solo", Some("1"))));
    let p = w.deployment_pod("ml", "kq-nocount", "kq-nocount-a", 1);
    w.risky(
        "kueue-nocount",
        "gang-unknown",
        in_kueue(p, "lost", None),
        true,
    );
    let p = w.deployment_pod("ml", "kq-bad", "kq-bad-a", 1);
    w.risky(
        "kueue-bad",
        "gang-unknown",
        in_kueue(p, "odd", Some("four")),
        true,
    );

    // Kubernetes PodGroups.
    let p = w.deployment_pod("ml", "sg", "sg-a", 1);
    w.risky(
        "sched-gang",
        gang_code(listed),
        in_group(p, "pg-gang"),
        true,
    );
    let p = w.deployment_pod("ml", "sg-all", "sg-all-a", 1);
    w.risky("sched-all", gang_code(listed), in_group(p, "pg-all"), true);
    let p = w.deployment_pod("ml", "sg-missing", "sg-missing-a", 1);
    w.risky(
        "sched-missing",
        "gang-unknown",
        in_group(p, "pg-missing"),
        true,
    );
    for (id, group) in [("sched-basic", "pg-basic"), ("sched-single", "pg-single")] {
        let p = w.deployment_pod("ml", id, &format!("{id}-a"), 1);
        let p = in_group(p, group);
        if listed {
            controls.push(w.pair_with_twin(id, p));
        } else {
            w.risky(id, "gang-unknown", p, true);
        }
    }
    (w, controls)
}

/// A member's code: `gang` when the group can be read, else `gang-unknown`.
fn gang_code(listed: bool) -> &'static str {
    if listed { "gang" } else { "gang-unknown" }
}

#[test]
fn kueue_and_scheduling_gangs_are_never_moved() {
    let (w, controls) = group_world(true);
    let c = w.build();
    let p = run(&c, &eight_gpu_policy());
    for (key, code) in &w.expected {
        assert_skipped(&p, key, code);
    }
    for key in &controls {
        assert_moved(&p, key);
        assert_eq!(gang(&c, key), None, "{key}");
    }
    assert_eq!(
        gang(&c, "ml/kq-a"),
        Some(Gang::Member("Kueue pod group train of 4".into()))
    );
    assert_eq!(
        gang(&c, "ml/sg-a"),
        Some(Gang::Member(
            "scheduling.k8s.io PodGroup ml/pg-gang with gang minCount 4".into()
        ))
    );
    assert_eq!(
        gang(&c, "ml/sg-all-a"),
        Some(Gang::Member(
            "scheduling.k8s.io PodGroup ml/pg-all with disruptionMode all".into()
        ))
    );
    let Some(Gang::Unknown(why)) = gang(&c, "ml/sg-missing-a") else {
        panic!("a missing group is unknown");
    };
    assert!(why.contains("ml/pg-missing not found"), "{why}");
}

#[test]
fn without_the_podgroup_api_every_scheduling_group_is_unknown() {
    // GenericWorkload off (the API not served) or no right to list PodGroups.
    let (w, controls) = group_world(false);
    assert_eq!(controls.len(), 1, "only the Kueue group of 1");
    let c = w.build();
    let p = run(&c, &eight_gpu_policy());
    for (key, code) in &w.expected {
        assert_skipped(&p, key, code);
    }
    assert_moved(&p, &controls[0]);
    let Some(Gang::Unknown(why)) = gang(&c, "ml/sched-basic-a") else {
        panic!("an unlisted group is unknown");
    };
    assert!(
        why.contains("scheduling.k8s.io PodGroups not readable"),
        "{why}"
    );
}

// ---- Demand: a gang is served whole, an unknown one not at all ------------------------------

/// Waiting since an hour: unschedulable, 8 GPUs (no node has 8 free).
fn waiting_pod(name: &str) -> PodJson {
    let mut p = PodJson::new("ml", name, 8).pending();
    p.0["status"]["conditions"][0]["lastTransitionTime"] = json!(ago(HOUR));
    p
}

#[test]
fn demand_serves_a_kueue_or_scheduling_gang_whole_and_an_unknown_one_never() {
    let mut w = World::new();
    w.objs.listed.scheduling_pod_groups = true;
    w.node(gpu_node("n1", 8));
    w.pod(
        PodJson::new("infra", "filler", 4)
            .label("app", "filler")
            .on("n1"),
    );
    w.objs.pod_groups.push(scheduling_group(
        "pg",
        json!({"schedulingPolicy": {"gang": {"minCount": 2}}}),
    ));
    for name in ["kq-0", "kq-1"] {
        w.pod(in_kueue(waiting_pod(name), "train", Some("2")));
    }
    w.pod(in_kueue(waiting_pod("kq-lost"), "lost", None));
    for name in ["sg-0", "sg-1"] {
        w.pod(in_group(waiting_pod(name), "pg"));
    }
    w.pod(in_group(waiting_pod("sg-lost"), "pg-missing"));
    w.pod(waiting_pod("solo"));
    let c = w.build();
    let policy = Policy::default();
    let keys = |g: &Vec<usize>| -> Vec<String> { g.iter().map(|&i| c.pods[i].key()).collect() };
    let groups: Vec<Vec<String>> = waiting(&c, &policy, now(), Duration::minutes(10))
        .iter()
        .map(keys)
        .collect();
    let want = |names: &[&str]| names.iter().map(|n| format!("ml/{n}")).collect::<Vec<_>>();
    assert!(groups.contains(&want(&["kq-0", "kq-1"])), "{groups:?}");
    assert!(groups.contains(&want(&["sg-0", "sg-1"])), "{groups:?}");
    assert!(groups.contains(&want(&["solo"])), "{groups:?}");
    assert_eq!(
        groups.len(),
        3,
        "the unknown gangs are not served: {groups:?}"
    );
    for lost in ["ml/kq-lost", "ml/sg-lost"] {
        let i = c.pods.iter().position(|p| p.key() == lost).unwrap();
        let why = served(&c, &policy, now(), Duration::minutes(10), i).unwrap_err();
        assert_eq!(why.code(), "gang-unknown", "{lost}: {why}");
    }
    let i = c.pods.iter().position(|p| p.key() == "ml/kq-1").unwrap();
    assert_eq!(
        keys(&served(&c, &policy, now(), Duration::minutes(10), i).unwrap()),
        want(&["kq-0", "kq-1"])
    );
}

// ---- Snapshots carry Kubernetes PodGroups ------------------------------------------------

#[test]
fn snapshots_route_scheduling_podgroups() {
    let pod = in_group(PodJson::new("ml", "w-0", 1), "pg").on("n1");
    let list = |items: Vec<Value>| json!({"apiVersion": "v1", "kind": "List", "items": items});
    let with = list(vec![
        gpu_node("n1", 8),
        pod.0.clone(),
        scheduling_group("pg", json!({"schedulingPolicy": {"gang": {"minCount": 2}}})),
        // Other kinds of the group are not pod groups.
        json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
               "metadata": {"name": "high"}, "value": 1000}),
    ]);
    let objs = snapshot::parse(&with.to_string()).unwrap();
    assert!(objs.listed.scheduling_pod_groups);
    assert!(!objs.listed.volcano_pod_groups && !objs.listed.kai_pod_groups);
    assert_eq!(objs.pod_groups.len(), 1);
    let c = gpu_defrag_core::ingest::build_cluster(&objs, Some(now()));
    assert!(matches!(gang(&c, "ml/w-0"), Some(Gang::Member(_))));

    // Without the PodGroup in it: not listed, unknown.
    let without = list(vec![gpu_node("n1", 8), pod.0.clone()]);
    let objs = snapshot::parse(&without.to_string()).unwrap();
    assert!(!objs.listed.scheduling_pod_groups);
    let c = gpu_defrag_core::ingest::build_cluster(&objs, Some(now()));
    assert!(matches!(gang(&c, "ml/w-0"), Some(Gang::Unknown(_))));
}
