//! The scheduler emulation, filter by filter: each test builds a small cluster from
//! Kubernetes objects (through the same ingest the operator uses) and checks
//! `sched::fit` against what kube-scheduler 1.37's Filter plugins decide for it.
use gpu_defrag_core::frag::Capacity;
use gpu_defrag_core::ingest::{Objects, build_cluster};
use gpu_defrag_core::model::Cluster;
use gpu_defrag_core::sched::{self, Filter, Fit};
use serde_json::{Value, json};

mod common;

fn node(name: &str, labels: Value, extra: Value) -> Value {
    let mut alloc = json!({"cpu": "16", "memory": "64Gi", "pods": "110", "nvidia.com/gpu": "8"});
    for (k, v) in extra.as_object().into_iter().flatten() {
        alloc[k] = v.clone();
    }
    let mut l = json!({"kubernetes.io/hostname": name});
    for (k, v) in labels.as_object().into_iter().flatten() {
        l[k] = v.clone();
    }
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": l},
        "status": {"allocatable": alloc, "capacity": alloc,
                   "conditions": [{"type": "Ready", "status": "True"}]}
    })
}

/// A pod of `ns/name` with `labels`, asking for `gpus` GPUs, with `spec` merged in; bound
/// to `on` (Running) or pending.
fn pod(ns: &str, name: &str, labels: Value, gpus: u32, on: Option<&str>, spec: Value) -> Value {
    let mut s = json!({
        "containers": [{"name": "c", "resources": {
            "requests": {"cpu": "1", "memory": "1Gi"},
            "limits": {"nvidia.com/gpu": gpus.to_string()}}}]
    });
    if gpus == 0 {
        s["containers"][0]["resources"]["limits"] = json!({});
    }
    for (k, v) in spec.as_object().into_iter().flatten() {
        s[k] = v.clone();
    }
    let status = match on {
        Some(n) => {
            s["nodeName"] = json!(n);
            json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]})
        }
        None => json!({"phase": "Pending"}),
    };
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"namespace": ns, "name": name, "uid": format!("uid-{name}"),
                     "labels": labels},
        "spec": s, "status": status
    })
}

fn cluster(nodes: Vec<Value>, pods: Vec<Value>) -> Cluster {
    let objs = Objects {
        nodes: nodes
            .into_iter()
            .map(|v| serde_json::from_value(v).unwrap())
            .collect(),
        pods: pods
            .into_iter()
            .map(|v| serde_json::from_value(v).unwrap())
            .collect(),
        ..Objects::default()
    };
    build_cluster(&objs, None)
}

/// `fit` of pod `key` on node `node` in `c` as it is.
fn verdict(c: &Cluster, key: &str, node: &str) -> Fit {
    let pi = c.pods.iter().position(|p| p.key() == key).expect("pod");
    let n = c.node_index(node).expect("node");
    let occ = sched::Occupancy::of(c);
    let cap = Capacity::of(c);
    sched::fit(c, &occ, pi, n, cap.at(n))
}

fn fits(c: &Cluster, key: &str, node: &str) -> bool {
    verdict(c, key, node).fits()
}

fn refused_by(c: &Cluster, key: &str, node: &str) -> Filter {
    match verdict(c, key, node) {
        Fit::No(f) => f,
        other => panic!("{key} on {node}: expected a refusal, got {other:?}"),
    }
}

#[test]
fn extended_resources_must_be_allocatable_and_free() {
    let efa = |name: &str, n: &str| {
        pod(
            "ml",
            name,
            json!({}),
            1,
            None,
            json!({"containers": [{"name": "c", "resources": {
                "limits": {"nvidia.com/gpu": "1", "vpc.amazonaws.com/efa": n}}}]}),
        )
    };
    let c = cluster(
        vec![
            node("plain", json!({}), json!({})),
            node("efa", json!({}), json!({"vpc.amazonaws.com/efa": "2"})),
        ],
        vec![
            efa("wants-1", "1"),
            efa("wants-4", "4"),
            pod(
                "ml",
                "holder",
                json!({}),
                1,
                Some("efa"),
                json!({"containers": [{"name": "c", "resources": {
                    "limits": {"nvidia.com/gpu": "1", "vpc.amazonaws.com/efa": "1"}}}]}),
            ),
            efa("wants-2", "2"),
        ],
    );
    assert_eq!(
        refused_by(&c, "ml/wants-1", "plain"),
        Filter::NodeResourcesFit
    );
    assert!(fits(&c, "ml/wants-1", "efa"));
    assert_eq!(
        refused_by(&c, "ml/wants-4", "efa"),
        Filter::NodeResourcesFit
    );
    assert_eq!(
        refused_by(&c, "ml/wants-2", "efa"),
        Filter::NodeResourcesFit,
        "one of two is used by the holder"
    );
}

#[test]
fn ephemeral_storage_hugepages_sidecars_and_overhead_count() {
    let c = cluster(
        vec![node(
            "n",
            json!({}),
            json!({"ephemeral-storage": "10Gi", "hugepages-2Mi": "1Gi"}),
        )],
        vec![
            pod(
                "a",
                "disk",
                json!({}),
                1,
                None,
                json!({"containers": [{"name": "c", "resources": {
                    "requests": {"ephemeral-storage": "6Gi"}, "limits": {"nvidia.com/gpu": "1"}}}],
                 "initContainers": [{"name": "side", "restartPolicy": "Always",
                    "resources": {"requests": {"ephemeral-storage": "5Gi"}}}]}),
            ),
            pod(
                "a",
                "small-disk",
                json!({}),
                1,
                None,
                json!({"containers": [{"name": "c", "resources": {
                    "requests": {"ephemeral-storage": "6Gi"}, "limits": {"nvidia.com/gpu": "1"}}}],
                 "initContainers": [{"name": "init",
                    "resources": {"requests": {"ephemeral-storage": "9Gi"}}}]}),
            ),
            pod(
                "a",
                "huge",
                json!({}),
                1,
                None,
                json!({"containers": [{"name": "c", "resources": {
                    "limits": {"hugepages-2Mi": "2Gi", "memory": "2Gi", "nvidia.com/gpu": "1"}}}]}),
            ),
        ],
    );
    assert_eq!(
        refused_by(&c, "a/disk", "n"),
        Filter::NodeResourcesFit,
        "6Gi + a 5Gi sidecar > 10Gi"
    );
    assert!(
        fits(&c, "a/small-disk", "n"),
        "an init container's 9Gi runs alone"
    );
    assert_eq!(refused_by(&c, "a/huge", "n"), Filter::NodeResourcesFit);
}

#[test]
fn host_ports_conflict_on_protocol_port_and_address() {
    let port = |p: i64, proto: &str, ip: &str| {
        let mut v = json!({"containerPort": 80, "hostPort": p, "protocol": proto});
        if !ip.is_empty() {
            v["hostIP"] = json!(ip);
        }
        json!({"containers": [{"name": "c", "ports": [v],
            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]})
    };
    let c = cluster(
        vec![node("n", json!({}), json!({}))],
        vec![
            pod(
                "a",
                "holder",
                json!({}),
                1,
                Some("n"),
                port(8080, "TCP", "10.0.0.1"),
            ),
            pod("a", "same", json!({}), 1, None, port(8080, "TCP", "")),
            pod("a", "udp", json!({}), 1, None, port(8080, "UDP", "")),
            pod(
                "a",
                "other-ip",
                json!({}),
                1,
                None,
                port(8080, "TCP", "10.0.0.2"),
            ),
            pod("a", "other-port", json!({}), 1, None, port(9090, "TCP", "")),
        ],
    );
    assert_eq!(refused_by(&c, "a/same", "n"), Filter::NodePorts);
    assert!(fits(&c, "a/udp", "n"));
    assert!(fits(&c, "a/other-ip", "n"));
    assert!(fits(&c, "a/other-port", "n"));
}

#[test]
fn node_affinity_selectors_taints_and_cordons() {
    let mut cordoned = node("cordoned", json!({}), json!({}));
    cordoned["spec"] = json!({"unschedulable": true});
    let mut tainted = node("tainted", json!({"pool": "a"}), json!({}));
    tainted["spec"] = json!({"taints": [{"key": "gpu", "value": "x", "effect": "NoSchedule"}]});
    let c = cluster(
        vec![
            node("a", json!({"pool": "a", "rank": "5"}), json!({})),
            node("b", json!({"pool": "b", "rank": "1"}), json!({})),
            cordoned,
            tainted,
        ],
        vec![
            pod(
                "x",
                "sel",
                json!({}),
                1,
                None,
                json!({"nodeSelector": {"pool": "a"}}),
            ),
            pod(
                "x",
                "gt",
                json!({}),
                1,
                None,
                json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                    {"nodeSelectorTerms": [{"matchExpressions": [
                        {"key": "rank", "operator": "Gt", "values": ["3"]}]}]}}}}),
            ),
            pod(
                "x",
                "empty-term",
                json!({}),
                1,
                None,
                json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                    {"nodeSelectorTerms": [{}]}}}}),
            ),
            pod(
                "x",
                "tolerant",
                json!({}),
                1,
                None,
                json!({"tolerations": [{"key": "gpu", "operator": "Exists"}]}),
            ),
        ],
    );
    assert!(fits(&c, "x/sel", "a"));
    assert_eq!(refused_by(&c, "x/sel", "b"), Filter::NodeAffinity);
    assert!(fits(&c, "x/gt", "a"));
    assert_eq!(refused_by(&c, "x/gt", "b"), Filter::NodeAffinity);
    assert_eq!(
        refused_by(&c, "x/empty-term", "a"),
        Filter::NodeAffinity,
        "an empty term matches no node"
    );
    assert_eq!(
        refused_by(&c, "x/sel", "cordoned"),
        Filter::NodeUnschedulable
    );
    assert_eq!(refused_by(&c, "x/sel", "tainted"), Filter::TaintToleration);
    assert!(fits(&c, "x/tolerant", "tainted"));
}

fn anti(app: &str, key: &str) -> Value {
    json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": key}]}}})
}

fn affinity(app: &str, key: &str) -> Value {
    json!({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": key}]}}})
}

#[test]
fn anti_affinity_in_both_directions_per_topology_domain() {
    let host = "kubernetes.io/hostname";
    let zone = "topology.kubernetes.io/zone";
    let c = cluster(
        vec![
            node("a1", json!({zone: "a"}), json!({})),
            node("a2", json!({zone: "a"}), json!({})),
            node("b1", json!({zone: "b"}), json!({})),
            node("nozone", json!({}), json!({})),
        ],
        vec![
            pod(
                "web",
                "r1",
                json!({"app": "web"}),
                1,
                Some("a1"),
                anti("web", host),
            ),
            pod(
                "web",
                "r2",
                json!({"app": "web"}),
                1,
                None,
                anti("web", host),
            ),
            pod(
                "web",
                "zonal",
                json!({"app": "z"}),
                1,
                Some("b1"),
                anti("web", zone),
            ),
            // No anti-affinity of its own: refused by the existing pods' terms alone.
            pod("web", "plain", json!({"app": "web"}), 1, None, json!({})),
            // Another namespace: the terms name their own namespace only.
            pod("other", "plain", json!({"app": "web"}), 1, None, json!({})),
        ],
    );
    assert_eq!(refused_by(&c, "web/r2", "a1"), Filter::InterPodAntiAffinity);
    assert!(fits(&c, "web/r2", "a2"));
    assert_eq!(
        refused_by(&c, "web/r2", "b1"),
        Filter::InterPodAntiAffinity,
        "the zonal pod's term forbids app=web in zone b"
    );
    assert!(
        fits(&c, "web/r2", "nozone"),
        "no zone label: the zonal term does not apply"
    );
    assert_eq!(
        refused_by(&c, "web/plain", "a1"),
        Filter::InterPodAntiAffinity
    );
    assert_eq!(
        refused_by(&c, "web/plain", "b1"),
        Filter::InterPodAntiAffinity
    );
    assert!(fits(&c, "web/plain", "a2"));
    assert!(fits(&c, "other/plain", "a1"));
    assert!(fits(&c, "other/plain", "b1"));
}

#[test]
fn affinity_needs_a_matching_pod_in_the_domain_unless_it_is_the_first() {
    let zone = "topology.kubernetes.io/zone";
    let c = cluster(
        vec![
            node("a1", json!({zone: "a"}), json!({})),
            node("a2", json!({zone: "a"}), json!({})),
            node("b1", json!({zone: "b"}), json!({})),
            node("nozone", json!({}), json!({})),
        ],
        vec![
            pod(
                "ml",
                "cache",
                json!({"app": "cache"}),
                0,
                Some("a1"),
                json!({}),
            ),
            pod(
                "ml",
                "near",
                json!({"app": "x"}),
                1,
                None,
                affinity("cache", zone),
            ),
            // Matches its own term, and no pod matches it yet: the first of its group.
            pod(
                "ml",
                "first",
                json!({"app": "grp"}),
                1,
                None,
                affinity("grp", zone),
            ),
            // Matches no pod and not itself: fits nowhere.
            pod(
                "ml",
                "lonely",
                json!({"app": "x"}),
                1,
                None,
                affinity("none", zone),
            ),
        ],
    );
    assert!(fits(&c, "ml/near", "a1"));
    assert!(fits(&c, "ml/near", "a2"), "same zone as the cache");
    assert_eq!(refused_by(&c, "ml/near", "b1"), Filter::InterPodAffinity);
    assert_eq!(
        refused_by(&c, "ml/near", "nozone"),
        Filter::InterPodAffinity
    );
    assert!(fits(&c, "ml/first", "b1"));
    assert_eq!(
        refused_by(&c, "ml/first", "nozone"),
        Filter::InterPodAffinity,
        "the topology key must exist on the node"
    );
    assert_eq!(refused_by(&c, "ml/lonely", "a1"), Filter::InterPodAffinity);
}

fn spread(app: &str, key: &str, skew: i32, extra: Value) -> Value {
    let mut c = json!({"maxSkew": skew, "topologyKey": key,
        "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": {"app": app}}});
    for (k, v) in extra.as_object().into_iter().flatten() {
        c[k] = v.clone();
    }
    json!({"topologySpreadConstraints": [c]})
}

#[test]
fn topology_spread_counts_domains_and_min_domains() {
    let zone = "topology.kubernetes.io/zone";
    let c = cluster(
        vec![
            node("a1", json!({zone: "a"}), json!({})),
            node("b1", json!({zone: "b"}), json!({})),
            node("c1", json!({zone: "c", "pool": "other"}), json!({})),
            node("nozone", json!({}), json!({})),
        ],
        vec![
            pod("s", "r1", json!({"app": "s"}), 1, Some("a1"), json!({})),
            pod("s", "r2", json!({"app": "s"}), 1, Some("a1"), json!({})),
            pod("s", "r3", json!({"app": "s"}), 1, Some("b1"), json!({})),
            pod(
                "s",
                "new",
                json!({"app": "s"}),
                1,
                None,
                spread("s", zone, 1, json!({})),
            ),
            // Zone c is left out by its node selector (nodeAffinityPolicy Honor): domains a
            // and b only, min 1.
            pod("s", "selected", json!({"app": "s"}), 1, None, {
                let mut v = spread("s", zone, 1, json!({}));
                v["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                        {"nodeSelectorTerms": [{"matchExpressions": [
                            {"key": "pool", "operator": "DoesNotExist"}]}]}}});
                v
            }),
            pod(
                "s",
                "min-domains",
                json!({"app": "s"}),
                1,
                None,
                spread("s", zone, 2, json!({"minDomains": 5})),
            ),
        ],
    );
    // Domains a=2, b=1, c=0: the minimum is 0, so only zone c takes a pod at skew 1.
    assert_eq!(refused_by(&c, "s/new", "a1"), Filter::PodTopologySpread);
    assert_eq!(refused_by(&c, "s/new", "b1"), Filter::PodTopologySpread);
    assert!(fits(&c, "s/new", "c1"));
    assert_eq!(
        refused_by(&c, "s/new", "nozone"),
        Filter::PodTopologySpread,
        "a node without the key"
    );
    assert!(
        fits(&c, "s/selected", "b1"),
        "b=1 → 2, minimum 1 over a and b"
    );
    assert_eq!(
        refused_by(&c, "s/selected", "a1"),
        Filter::PodTopologySpread
    );
    // Fewer domains (3) than minDomains (5): the minimum counts as 0.
    assert!(fits(&c, "s/min-domains", "b1"), "1 + 1 - 0 ≤ 2");
    assert_eq!(
        refused_by(&c, "s/min-domains", "a1"),
        Filter::PodTopologySpread
    );
}

#[test]
fn match_label_keys_and_namespace_selectors() {
    let host = "kubernetes.io/hostname";
    let c = cluster(
        vec![
            node("a", json!({}), json!({})),
            node("b", json!({}), json!({})),
        ],
        vec![
            pod(
                "w",
                "old",
                json!({"app": "w", "rev": "1"}),
                1,
                Some("a"),
                json!({}),
            ),
            pod(
                "w",
                "new",
                json!({"app": "w", "rev": "2"}),
                1,
                None,
                json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchLabels": {"app": "w"}}, "matchLabelKeys": ["rev"],
                     "topologyKey": host}]}}}),
            ),
            pod(
                "w",
                "selector",
                json!({"app": "x"}),
                1,
                None,
                json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchLabels": {"app": "w"}},
                     "namespaceSelector": {"matchLabels": {"team": "a"}},
                     "topologyKey": host}]}}}),
            ),
            pod(
                "w",
                "all-namespaces",
                json!({"app": "x"}),
                1,
                None,
                json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchLabels": {"app": "w"}}, "namespaceSelector": {},
                     "topologyKey": host}]}}}),
            ),
        ],
    );
    assert!(fits(&c, "w/new", "a"), "another revision: not counted");
    assert!(
        matches!(verdict(&c, "w/selector", "b"), Fit::Unknown(_)),
        "namespace labels are not read: unknown, never a target"
    );
    assert_eq!(
        refused_by(&c, "w/all-namespaces", "a"),
        Filter::InterPodAntiAffinity
    );
    assert!(fits(&c, "w/all-namespaces", "b"));
}

mod properties {
    //! Random clusters whose pods carry anti-affinity, extended resources and host ports:
    //! the planner's moves must leave every moved pod where the scheduler would accept it.
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use gpu_defrag_core::ingest::BINPACK_SCHEDULER;
    use gpu_defrag_core::model::*;
    use gpu_defrag_core::plan::{History, apply, plan};
    use gpu_defrag_core::policy::{Policy, TargetShape};
    use proptest::prelude::*;

    const ZONE: &str = "topology.kubernetes.io/zone";
    const HOST: &str = "kubernetes.io/hostname";
    const NIC: &str = "example.com/nic";

    fn node(i: usize, nic: u64) -> Node {
        let mut n = super::common::model_node(&format!("n{i}"), 4, Granularity::Node);
        n.labels.insert(ZONE.to_string(), format!("z{}", i % 2));
        if nic > 0 {
            n.extra_alloc = vec![(NIC.to_string(), nic * 1000)];
        }
        n
    }

    /// (node, gpus, app, anti: 0 none / 1 hostname / 2 zone, nic, host port)
    type Spec = (usize, u32, u8, u8, bool, bool);

    fn spec() -> impl Strategy<Value = Spec> {
        (
            0usize..5,
            1u32..3,
            0u8..3,
            prop_oneof![2 => Just(0u8), 1 => Just(1u8), 1 => Just(2u8)],
            prop::bool::weighted(0.3),
            prop::bool::weighted(0.2),
        )
    }

    fn build(nics: &[u64], specs: &[Spec]) -> Cluster {
        let mut c = Cluster {
            nodes: nics.iter().enumerate().map(|(i, n)| node(i, *n)).collect(),
            ..Default::default()
        };
        for (k, &(n, gpus, app, anti, nic, port)) in specs.iter().enumerate() {
            let n = n % c.nodes.len();
            let node = &mut c.nodes[n];
            let free: Vec<usize> = (0..4).filter(|&g| node.gpus[g].used == 0).collect();
            if free.len() < gpus as usize {
                continue;
            }
            let app = format!("app{app}");
            let mut cs = Constraints::default();
            if anti > 0 {
                cs.anti_affinity.push(PodAffinityTerm {
                    selector: Some(LabelSelector {
                        match_labels: BTreeMap::from([("app".to_string(), app.clone())]),
                        match_expressions: vec![],
                    }),
                    namespaces: TermNamespaces::List(vec!["ml".into()]),
                    topology_key: if anti == 1 { HOST } else { ZONE }.into(),
                });
            }
            if nic {
                cs.resources.push((NIC.to_string(), 1000));
                gpu_defrag_core_add(&mut node.extra_used, 1000);
            }
            if port {
                cs.host_ports.push(HostPort {
                    protocol: "TCP".into(),
                    ip: "0.0.0.0".into(),
                    port: 9000,
                });
            }
            for &g in free.iter().take(gpus as usize) {
                node.gpus[g].used = GPU_MILLI;
            }
            node.cpu_used += 1000;
            node.mem_used += 1 << 30;
            node.pods_used += 1;
            c.pods.push(Pod {
                namespace: "ml".into(),
                name: format!("p{k:02}"),
                uid: format!("u{k}"),
                node: Some(n),
                node_name: Some(node.name.clone()),
                phase: Phase::Running,
                labels: Arc::new(BTreeMap::from([("app".to_string(), app.clone())])),
                gpu: GpuUse::Whole(gpus),
                shape: Some(GpuShape {
                    gpus,
                    milli: GPU_MILLI,
                }),
                cpu: 1000,
                mem: 1 << 30,
                owner: Some(Owner {
                    group: "apps".into(),
                    kind: "ReplicaSet".into(),
                    name: app.clone(),
                }),
                workload: Some(Workload::checked("apps/ReplicaSet", &app)),
                ready: true,
                scheduler: BINPACK_SCHEDULER.into(),
                constraints: (cs != Constraints::default()).then(|| Box::new(cs)),
                ..Default::default()
            });
        }
        c.pods.sort_by_key(Pod::key);
        c
    }

    fn gpu_defrag_core_add(to: &mut Vec<(String, u64)>, v: u64) {
        match to.first_mut() {
            Some(e) => e.1 += v,
            None => to.push((NIC.to_string(), v)),
        }
    }

    /// Whether `a`'s anti-affinity forbids `b` beside it (same domain, `b` matches).
    fn forbids(c: &Cluster, a: &Pod, b: &Pod) -> bool {
        let (Some(na), Some(nb)) = (a.node, b.node) else {
            return false;
        };
        a.constraints().anti_affinity.iter().any(|t| {
            let (la, lb) = (&c.nodes[na].labels, &c.nodes[nb].labels);
            t.selector.as_ref().is_some_and(|s| s.matches(&b.labels))
                && la.get(&t.topology_key).is_some()
                && la.get(&t.topology_key) == lb.get(&t.topology_key)
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]
        #[test]
        fn moved_pods_land_where_the_scheduler_accepts_them(
            nics in prop::collection::vec(prop_oneof![Just(0u64), Just(1), Just(2)], 3..=5),
            specs in prop::collection::vec(spec(), 3..16),
            landing_control in any::<bool>(),
        ) {
            let c = build(&nics, &specs);
            let policy = Policy {
                shapes: vec![TargetShape::of_gpus(4, 1000, 1.0)],
                landing_control,
                max_evictions_per_run: 8,
                max_evictions_per_node: 4,
                max_evictions_per_namespace: 8,
                max_unavailable_per_workload: 8,
                ..Policy::default()
            };
            let p = plan(&c, &policy, None, &History::default());
            let after = apply(&c, &p);
            for m in &p.moves {
                let moved = after.pods.iter().find(|x| x.key() == m.pod).unwrap();
                let n = moved.node.unwrap();
                for (i, other) in after.pods.iter().enumerate() {
                    if other.key() == m.pod || !other.is_active_bound() || other.node.is_none() {
                        continue;
                    }
                    prop_assert!(
                        !forbids(&after, moved, other) && !forbids(&after, other, moved),
                        "{} moved to {} beside {} (#{i}) against an anti-affinity",
                        m.pod, m.to_node, other.key()
                    );
                    if other.node == Some(n) {
                        prop_assert!(
                            moved.constraints().host_ports.is_empty()
                                || other.constraints().host_ports.is_empty(),
                            "{} moved to {} where {} binds the same host port",
                            m.pod, m.to_node, other.key()
                        );
                    }
                }
                // The NIC is allocatable on the target and not over-used there.
                let used: u64 = after
                    .pods
                    .iter()
                    .filter(|x| x.node == Some(n) && x.is_active_bound())
                    .flat_map(|x| x.constraints().resources.iter())
                    .filter(|(k, _)| k == NIC)
                    .map(|(_, v)| *v)
                    .sum();
                let alloc = after.nodes[n]
                    .extra_alloc
                    .iter()
                    .find(|(k, _)| k == NIC)
                    .map_or(0, |(_, v)| *v);
                prop_assert!(
                    used <= alloc || moved.constraints().resources.is_empty(),
                    "{} moved to {}: NIC {used} of {alloc}", m.pod, m.to_node
                );
            }
        }
    }
}

/// Found by the differential test against the real scheduler: with two affinity terms,
/// each term's domain must hold a pod that matches *both* terms; two pods matching one
/// term each do not satisfy it.
#[test]
fn several_affinity_terms_need_one_pod_matching_all_of_them() {
    let zone = "topology.kubernetes.io/zone";
    let two_terms = json!({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": zone},
        {"labelSelector": {"matchLabels": {"group": "g1"}}, "topologyKey": zone}]}}});
    let c = cluster(
        vec![
            node("a1", json!({zone: "a"}), json!({})),
            node("b1", json!({zone: "b"}), json!({})),
        ],
        vec![
            pod(
                "ml",
                "web",
                json!({"app": "web", "group": "g2"}),
                0,
                Some("a1"),
                json!({}),
            ),
            pod(
                "ml",
                "cache",
                json!({"app": "cache", "group": "g1"}),
                0,
                Some("a1"),
                json!({}),
            ),
            pod(
                "ml",
                "both",
                json!({"app": "web", "group": "g1"}),
                0,
                Some("b1"),
                json!({}),
            ),
            pod("ml", "p", json!({"app": "x"}), 1, None, two_terms),
        ],
    );
    assert_eq!(refused_by(&c, "ml/p", "a1"), Filter::InterPodAffinity);
    assert!(fits(&c, "ml/p", "b1"));
}

/// An empty spread selector counts no pod (the pod itself still matches it): it never
/// refuses a node, as in kube-scheduler.
#[test]
fn an_empty_spread_selector_counts_no_pod() {
    let zone = "topology.kubernetes.io/zone";
    let c = cluster(
        vec![
            node("a1", json!({zone: "a"}), json!({})),
            node("b1", json!({zone: "b"}), json!({})),
        ],
        vec![
            pod("s", "r1", json!({"app": "s"}), 1, Some("a1"), json!({})),
            pod("s", "r2", json!({"app": "s"}), 1, Some("a1"), json!({})),
            pod(
                "s",
                "new",
                json!({"app": "s"}),
                1,
                None,
                json!({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": zone,
                    "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {}}]}),
            ),
        ],
    );
    assert!(fits(&c, "s/new", "a1"));
}
