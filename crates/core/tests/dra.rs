//! Dynamic Resource Allocation through the snapshot loader: GPUs published only in
//! ResourceSlices (NVIDIA DRA driver format), partitionable devices (MIG), named and
//! shared claims, consumable capacity, incomplete pools and malformed objects.
use gpu_defrag_core::frag;
use gpu_defrag_core::ingest::build_cluster;
use gpu_defrag_core::model::*;
use gpu_defrag_core::plan::{self, Skip};
use gpu_defrag_core::policy::{Policy, TargetShape};
use gpu_defrag_core::snapshot;
use proptest::prelude::*;
use serde_json::{Value, json};

fn fixture(name: &str) -> Cluster {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(path).unwrap();
    build_cluster(&snapshot::parse(&text).unwrap(), None)
}

fn node<'a>(c: &'a Cluster, name: &str) -> &'a Node {
    &c.nodes[c.node_index(name).unwrap()]
}

fn pod<'a>(c: &'a Cluster, key: &str) -> &'a Pod {
    c.pods.iter().find(|p| p.key() == key).unwrap()
}

fn used(n: &Node) -> Vec<Milli> {
    n.gpus.iter().map(|g| g.used).collect()
}

fn eight_gpu_policy() -> Policy {
    whole_gpus_policy(8)
}

/// A policy whose one target shape is `gpus` whole GPUs, moving single replicas too.
fn whole_gpus_policy(gpus: u32) -> Policy {
    Policy {
        shapes: vec![TargetShape::of_gpus(gpus, 1000, 1.0)],
        evict_single_replicas: true,
        ..Default::default()
    }
}

// ---- The acceptance snapshot: 4 nodes, 32 GPUs only in ResourceSlices ----------------------

#[test]
fn gpus_published_only_in_resource_slices_are_counted() {
    let c = fixture("dra-whole.yaml");
    let r = frag::report(&c, &Policy::default());
    assert_eq!(r.gpus, 32, "4 nodes × 8 GPUs");
    assert_eq!(r.nodes_counted, 4);
    assert_eq!(r.unknown_pods, 0, "{:?}", r.unknown);
    for n in &c.nodes {
        assert_eq!(
            (n.scheme, n.granularity),
            (Scheme::Dra, Granularity::Device)
        );
        assert_eq!(n.model.as_deref(), Some("NVIDIA A100-SXM4-80GB"));
        assert_eq!(n.dra.len(), 8);
        assert_eq!(n.gpus[0].memory_mib, Some(81920));
    }
    let d0 = node(&c, "dra-0");
    assert_eq!(used(d0), [0, 0, 0, 1000, 0, 0, 1000, 0]);
    assert_eq!(d0.gpus[3].key, "gpu-3");
    assert_eq!(d0.dra[3].pool, "dra-0");
    assert_eq!(d0.dra[3].driver, "gpu.nvidia.com");
    assert_eq!(d0.dra[3].uuid.as_deref(), Some("GPU-dra-0-0003"));
    assert_eq!(d0.dra[3].pcie_root.as_deref(), Some("pci0000:03"));
    assert_eq!(
        used(node(&c, "dra-2"))
            .iter()
            .filter(|u| **u == 1000)
            .count(),
        5
    );
    // DRA-backed nvidia.com/gpu: the scheduler's claim, named by the pod's status.
    let a = pod(&c, "ml/infer-a");
    assert_eq!(a.gpu, GpuUse::Devices(vec![(3, 1000)]));
    assert_eq!(
        (a.scheme, a.claim_source.clone()),
        (Some(Scheme::Dra), ClaimSource::Movable)
    );
    // A template claim.
    let e = pod(&c, "ml/embed-a");
    assert_eq!(e.gpu, GpuUse::Devices(vec![(0, 1000)]));
    assert_eq!(e.claim_source, ClaimSource::Movable);
    // The pending 8-GPU pod asks through the DRA-backed extended resource.
    let t = pod(&c, "ml/train-0");
    assert_eq!(
        t.shape,
        Some(GpuShape {
            gpus: 8,
            milli: 1000
        })
    );
    assert_eq!(t.scheme, Some(Scheme::Dra));
    assert_eq!(r.pending_unplaceable, 1, "no node has 8 free GPUs");
    assert!(
        c.unchecked
            .iter()
            .all(|u| !u.contains("DRA") && !u.contains("resource")),
        "{:?}",
        c.unchecked
    );
}

#[test]
fn the_planner_packs_dra_gpus_and_frees_a_node() {
    let c = fixture("dra-whole.yaml");
    let policy = eight_gpu_policy();
    let p = plan::plan(&c, &policy, None, &Default::default());
    assert!(!p.moves.is_empty(), "{p:?}");
    assert!(
        p.after.fully_free_nodes > p.before.fully_free_nodes,
        "{:?}",
        p.after
    );
    assert!(p.after.fragment_rate < p.before.fragment_rate);
    // Node drains free the 8-GPU nodes here (the node taint fences them).
    for b in &p.batches {
        assert_eq!(b.kind, plan::UnitKind::Node, "{b:?}");
    }
    for m in &p.moves {
        assert_eq!(m.to_devices.len(), 1, "{m:?}");
        assert!(m.to_devices[0].starts_with("gpu-"), "{m:?}");
        assert_ne!(m.from_node, m.to_node);
    }
    // Template-claim pods carry the landing caveat; extended-resource pods do not.
    for m in &p.moves {
        let claim_pod = m.pod.starts_with("ml/embed");
        assert_eq!(
            m.reason.contains("landing not guaranteed"),
            claim_pod,
            "{m:?}"
        );
    }
    let after = plan::apply(&c, &p);
    let r = frag::report(&after, &policy);
    assert_eq!(
        r.pending_unplaceable, 0,
        "the 8-GPU pod fits after the plan"
    );
}

// ---- Partitionable devices (MIG) ------------------------------------------------------------

#[test]
fn mig_partitions_and_whole_gpus_exclude_each_other() {
    let c = fixture("dra-mig.yaml");
    let n = node(&c, "mig-0");
    assert_eq!(n.scheme, Scheme::Dra);
    assert!(n.inconsistent.is_none(), "{:?}", n.inconsistent);
    assert_eq!(n.gpus.len(), 2, "the stale generation's gpu-5 is not read");
    // gpu-0: memory slices 0,1 (two 1g.10gb) and 4-7 (3g.40gb) of 8 → 750 milli.
    assert_eq!(used(n), [750, 1000]);
    assert_eq!(n.dra[0].partitions, ["1g.10gb", "1g.10gb", "3g.40gb"]);
    assert!(n.dra[1].partitions.is_empty());
    let pools: Vec<(&str, u64, u64)> = n
        .mig
        .iter()
        .map(|p| (p.profile.as_str(), p.capacity, p.used))
        .collect();
    // 1g.10gb: 2 used, 2 more fit (slices 2 and 3); 3g.40gb: 1 used, none fits (slices
    // 0-3 are half taken, gpu-1 is held whole); 7g.80gb: none.
    assert_eq!(
        pools,
        [("1g.10gb", 4, 2), ("3g.40gb", 1, 1), ("7g.80gb", 0, 0)]
    );
    assert_eq!(
        pod(&c, "ml/small-a").gpu,
        GpuUse::Mig(vec![("1g.10gb".into(), 1)])
    );
    assert!(matches!(
        pod(&c, "ml/small-a").claim_source,
        ClaimSource::Unsure(_)
    ));
    assert_eq!(pod(&c, "ml/whole-a").gpu, GpuUse::Devices(vec![(1, 1000)]));
    let r = frag::report(&c, &Policy::default());
    assert_eq!(r.fully_free_gpus, 0);
    let free: Vec<(&str, u64)> = r.mig.iter().map(|m| (m.profile.as_str(), m.free)).collect();
    assert_eq!(free, [("1g.10gb", 2), ("3g.40gb", 0), ("7g.80gb", 0)]);
    assert_eq!(r.nodes[0].used, [750, 1000]);
}

#[test]
fn mig_pods_are_never_planned() {
    let c = fixture("dra-mig.yaml");
    let p = plan::plan(&c, &eight_gpu_policy(), None, &Default::default());
    assert!(
        p.moves
            .iter()
            .all(|m| !m.pod.contains("small") && !m.pod.contains("mid")),
        "{:?}",
        p.moves
    );
}

// ---- Named and shared claims ----------------------------------------------------------------

#[test]
fn pods_with_named_claims_never_move() {
    let c = fixture("dra-named.yaml");
    assert_eq!(
        pod(&c, "ml/shared-a").claim_source,
        ClaimSource::Shared("ml/team-gpu".into())
    );
    assert_eq!(
        pod(&c, "ml/solo-a").claim_source,
        ClaimSource::Named("ml/solo-gpu".into())
    );
    assert_eq!(pod(&c, "ml/tpl-a").claim_source, ClaimSource::Movable);
    assert_eq!(pod(&c, "ml/shared-b").gpu, GpuUse::Devices(vec![(0, 1000)]));
    assert_eq!(used(node(&c, "dra-0"))[..3], [1000, 1000, 1000]);
    let policy = Policy {
        evict_single_replicas: true,
        ..Default::default()
    };
    let p = plan::plan(&c, &policy, None, &Default::default());
    let code = |k: &str| p.skipped_pods.iter().find(|s| s.pod == k).map(|s| s.code);
    assert_eq!(code("ml/shared-a"), Some("shared-resource-claim"));
    assert_eq!(code("ml/shared-b"), Some("shared-resource-claim"));
    assert_eq!(code("ml/solo-a"), Some("named-resource-claim"));
    assert_eq!(code("ml/tpl-a"), None);
    assert!(
        p.moves
            .iter()
            .all(|m| m.pod == "ml/tpl-a" || m.pod.starts_with("ml/fill"))
    );
    assert_eq!(Skip::NamedClaim.code(), "named-resource-claim");
}

// ---- Built objects: counters, capacity, pools, malformed input ------------------------------

fn list(items: Vec<Value>) -> String {
    json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string()
}

fn k_node(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
        "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True"}]}})
}

fn device(name: &str, extra: Value) -> Value {
    let mut d = json!({"name": name, "attributes": {"type": {"string": "gpu"}},
        "capacity": {"memory": {"value": "80Gi"}}});
    if let (Some(d), Some(e)) = (d.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            d.insert(k.clone(), v.clone());
        }
    }
    d
}

fn k_slice(name: &str, node: &str, devices: Vec<Value>, count: i64, generation: i64) -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": count},
            "devices": devices}})
}

fn gpu_class() -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpu.nvidia.com"},
        "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}],
            "extendedResourceName": "nvidia.com/gpu"}})
}

/// A running template-claim pod on `node` whose claim `<name>-c` holds `results`.
fn claim_pod(name: &str, node: &str, results: Value) -> Vec<Value> {
    vec![
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ml", "uid": format!("u-{name}"),
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "r", "controller": true}]},
            "spec": {"nodeName": node, "schedulerName": "gpu-binpack", "containers": [{"name": "c"}],
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}],
                "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": format!("{name}-c")}]}}),
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": format!("{name}-c"), "namespace": "ml"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}},
            "status": {"allocation": {"devices": {"results": results}},
                "reservedFor": [{"resource": "pods", "name": name, "uid": format!("u-{name}")}]}}),
    ]
}

fn result(device: &str, extra: Value) -> Value {
    let mut r =
        json!({"request": "gpu", "driver": "gpu.nvidia.com", "pool": "n0", "device": device});
    if let (Some(r), Some(e)) = (r.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            r.insert(k.clone(), v.clone());
        }
    }
    r
}

fn build(items: Vec<Value>) -> Cluster {
    build_cluster(&snapshot::parse(&list(items)).unwrap(), None)
}

fn two_gpus(extra: Value) -> Vec<Value> {
    vec![
        k_node("n0"),
        gpu_class(),
        k_slice(
            "s0",
            "n0",
            vec![device("gpu-0", extra.clone()), device("gpu-1", extra)],
            1,
            1,
        ),
    ]
}

#[test]
fn consumable_capacity_shares_one_device() {
    let mut items = two_gpus(json!({"allowMultipleAllocations": true}));
    items.extend(claim_pod(
        "a",
        "n0",
        json!([result(
            "gpu-0",
            json!({"shareID": "s1", "consumedCapacity": {"memory": "20Gi"}})
        )]),
    ));
    items.extend(claim_pod(
        "b",
        "n0",
        json!([result(
            "gpu-0",
            json!({"shareID": "s2", "consumedCapacity": {"memory": "40Gi"}})
        )]),
    ));
    let c = build(items.clone());
    assert_eq!(used(node(&c, "n0")), [750, 0]);
    assert_eq!(pod(&c, "ml/a").gpu, GpuUse::Devices(vec![(0, 250)]));
    assert_eq!(
        pod(&c, "ml/b").shape,
        Some(GpuShape {
            gpus: 1,
            milli: 500
        })
    );
    assert!(
        matches!(pod(&c, "ml/a").claim_source, ClaimSource::Unsure(ref m) if m.contains("consumable-capacity"))
    );
    // A third share beyond the device's memory: every pod on it is unknown.
    items.extend(claim_pod(
        "x",
        "n0",
        json!([result(
            "gpu-0",
            json!({"shareID": "s3", "consumedCapacity": {"memory": "40Gi"}})
        )]),
    ));
    let c = build(items);
    for k in ["ml/a", "ml/b", "ml/x"] {
        assert!(
            matches!(
                pod(&c, k).gpu,
                GpuUse::Unknown(UnknownReason::Overcommitted(_))
            ),
            "{k}: {:?}",
            pod(&c, k).gpu
        );
    }
    assert_eq!(node(&c, "n0").unknown_pods, 3);
}

#[test]
fn two_claims_on_a_device_that_allows_one_are_unknown() {
    let mut items = two_gpus(json!({}));
    items.extend(claim_pod("a", "n0", json!([result("gpu-1", json!({}))])));
    items.extend(claim_pod("b", "n0", json!([result("gpu-1", json!({}))])));
    let c = build(items);
    let g = &pod(&c, "ml/a").gpu;
    assert!(
        matches!(g, GpuUse::Unknown(UnknownReason::Overcommitted(m)) if m.contains("allows one")),
        "{g:?}"
    );
    let p = plan::plan(&c, &eight_gpu_policy(), None, &Default::default());
    assert!(p.moves.is_empty());
}

#[test]
fn a_whole_gpu_and_a_partition_of_it_cannot_both_be_allocated() {
    let counters = json!([{"counterSet": "cs0", "counters": {"slice": {"value": "2"}}}]);
    let half = json!([{"counterSet": "cs0", "counters": {"slice": {"value": "1"}}}]);
    let mig = json!({"attributes": {"type": {"string": "mig"}, "profile": {"string": "3g.40gb"}},
        "consumesCounters": half});
    let items = vec![
        k_node("n0"),
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "c"},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": "n0",
                "pool": {"name": "n0", "generation": 1, "resourceSliceCount": 2},
                "sharedCounters": [{"name": "cs0", "counters": {"slice": {"value": "2"}}}]}}),
        k_slice(
            "d",
            "n0",
            vec![
                device("gpu-0", json!({"consumesCounters": counters})),
                device("gpu-0-mig-a", mig.clone()),
                device("gpu-0-mig-b", mig),
            ],
            2,
            1,
        ),
    ];
    // One partition: the GPU is half carved, one more partition fits.
    let mut one = items.clone();
    one.extend(claim_pod(
        "m",
        "n0",
        json!([result("gpu-0-mig-a", json!({}))]),
    ));
    let c = build(one);
    let n = node(&c, "n0");
    assert_eq!(used(n), [500]);
    assert_eq!(
        n.mig[0],
        MigPool {
            profile: "3g.40gb".into(),
            capacity: 2,
            used: 1
        }
    );
    // The whole GPU as well: the counters are over-committed.
    let mut both = items;
    both.extend(claim_pod(
        "m",
        "n0",
        json!([result("gpu-0-mig-a", json!({}))]),
    ));
    both.extend(claim_pod("w", "n0", json!([result("gpu-0", json!({}))])));
    let c = build(both);
    for k in ["ml/m", "ml/w"] {
        assert!(
            matches!(
                pod(&c, k).gpu,
                GpuUse::Unknown(UnknownReason::Overcommitted(_))
            ),
            "{k}"
        );
    }
}

#[test]
fn an_incomplete_pool_is_not_counted_and_its_node_is_never_drained() {
    let mut items = vec![
        k_node("n0"),
        gpu_class(),
        k_slice("s0", "n0", vec![device("gpu-0", json!({}))], 2, 3),
    ];
    items.extend(claim_pod("a", "n0", json!([result("gpu-0", json!({}))])));
    let c = build(items);
    let n = node(&c, "n0");
    assert!(n.gpus.is_empty());
    assert!(
        n.inconsistent
            .as_deref()
            .is_some_and(|m| m.contains("incomplete")),
        "{:?}",
        n.inconsistent
    );
    assert!(pod(&c, "ml/a").is_unknown());
    assert!(
        c.unchecked.iter().any(|u| u.contains("incomplete")),
        "{:?}",
        c.unchecked
    );
}

#[test]
fn unresolvable_claims_make_their_pods_unknown() {
    // Not in the input.
    let mut items = two_gpus(json!({}));
    let mut p = claim_pod("a", "n0", json!([]));
    p.truncate(1);
    items.extend(p);
    // Not reserved for the pod.
    let mut q = claim_pod("b", "n0", json!([result("gpu-0", json!({}))]));
    q[1]["status"]["reservedFor"] =
        json!([{"resource": "pods", "name": "other", "uid": "u-other"}]);
    items.extend(q);
    // Names a device no slice publishes.
    items.extend(claim_pod("c", "n0", json!([result("gpu-9", json!({}))])));
    // Template claim not recorded in the status.
    let mut r = claim_pod("d", "n0", json!([result("gpu-1", json!({}))]));
    r[0]["status"]
        .as_object_mut()
        .unwrap()
        .remove("resourceClaimStatuses");
    items.extend(r);
    // Not allocated.
    let mut s = claim_pod("e", "n0", json!([]));
    s[1]["status"].as_object_mut().unwrap().remove("allocation");
    items.extend(s);
    // Unreadable consumed capacity.
    items.extend(claim_pod(
        "f",
        "n0",
        json!([result(
            "gpu-1",
            json!({"consumedCapacity": {"memory": "lots"}})
        )]),
    ));
    let c = build(items);
    let reason = |k: &str| match &pod(&c, k).gpu {
        GpuUse::Unknown(r) => r.code(),
        g => panic!("{k}: {g:?}"),
    };
    assert_eq!(reason("ml/a"), "claim-unresolved");
    assert_eq!(reason("ml/b"), "claim-unresolved");
    assert_eq!(reason("ml/c"), "record-names-unknown-device");
    assert_eq!(reason("ml/d"), "claim-unresolved");
    assert_eq!(reason("ml/e"), "claim-unresolved");
    assert_eq!(reason("ml/f"), "malformed-record");
    assert!(node(&c, "n0").unknown_pods >= 6);
}

#[test]
fn unreadable_capacity_marks_the_node() {
    let mut items = vec![
        k_node("n0"),
        k_slice(
            "s0",
            "n0",
            vec![device(
                "gpu-0",
                json!({"capacity": {"memory": {"value": "80Gx"}}}),
            )],
            1,
            1,
        ),
    ];
    items.extend(claim_pod("a", "n0", json!([result("gpu-0", json!({}))])));
    // The API server would refuse such a quantity; the typed reader names the item.
    let text = list(items);
    match snapshot::parse(&text) {
        Err(e) => assert!(e.to_string().contains("ResourceSlice"), "{e}"),
        Ok(objs) => {
            let c = build_cluster(&objs, None);
            assert!(node(&c, "n0").inconsistent.is_some());
        }
    }
}

#[test]
fn other_drivers_and_pending_template_pods() {
    let mut items = two_gpus(json!({}));
    // A NIC claim on the GPU node: no GPU use, and not moved (its device is not modelled).
    let mut nic = claim_pod(
        "nic",
        "n0",
        json!([{"request": "gpu", "driver": "nic.example.com", "pool": "n0", "device": "eth1"}]),
    );
    nic[1]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] =
        json!("nic.example.com");
    items.extend(nic);
    // A pending pod whose generated claim asks for 2 GPUs.
    let mut pend = claim_pod("wait", "n0", json!([]));
    pend[0]["spec"].as_object_mut().unwrap().remove("nodeName");
    pend[0]["status"]["phase"] = json!("Pending");
    pend[1]["status"] = json!({});
    pend[1]["spec"]["devices"]["requests"][0]["exactly"]["count"] = json!(2);
    items.extend(pend);
    // A custom driver whose class the CEL selector names.
    items.push(json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "acme-gpu"},
        "spec": {"selectors": [{"cel": {"expression": "device.driver == \"gpu.acme.example\" && device.attributes[\"gpu.acme.example\"].type == \"gpu\""}}]}}));
    items.push(k_node("n1"));
    items.push(json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "acme"},
        "spec": {"driver": "gpu.acme.example", "nodeName": "n1", "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "g0"}, {"name": "g1"}]}}));
    let c = build(items);
    let nic = pod(&c, "ml/nic");
    assert_eq!(nic.gpu, GpuUse::None);
    assert!(
        matches!(&nic.claim_source, ClaimSource::Unsure(m) if m.contains("nic.example.com")),
        "{:?}",
        nic.claim_source
    );
    let w = pod(&c, "ml/wait");
    assert_eq!(
        w.shape,
        Some(GpuShape {
            gpus: 2,
            milli: 1000
        })
    );
    assert_eq!(node(&c, "n1").gpus.len(), 2);
    assert_eq!(node(&c, "n1").scheme, Scheme::Dra);
}

#[test]
fn static_mig_devices_are_reported_per_profile_only() {
    let mig = |name: &str| {
        device(
            name,
            json!({"attributes": {"type": {"string": "mig"}, "profile": {"string": "1g.10gb"},
            "parentUUID": {"string": "GPU-x"}}}),
        )
    };
    let mut items = vec![
        k_node("n0"),
        k_slice(
            "s0",
            "n0",
            vec![
                mig("gpu-0-mig-1"),
                mig("gpu-0-mig-2"),
                device("gpu-1", json!({})),
            ],
            1,
            1,
        ),
    ];
    items.extend(claim_pod(
        "a",
        "n0",
        json!([result("gpu-0-mig-2", json!({}))]),
    ));
    let c = build(items);
    let n = node(&c, "n0");
    assert_eq!(n.gpus.len(), 1, "MIG-only parents are not whole GPUs");
    assert_eq!(
        n.mig,
        [MigPool {
            profile: "1g.10gb".into(),
            capacity: 2,
            used: 1
        }]
    );
    assert_eq!(
        pod(&c, "ml/a").gpu,
        GpuUse::Mig(vec![("1g.10gb".into(), 1)])
    );
}

#[test]
fn tainted_devices_are_not_free() {
    let items = vec![
        k_node("n0"),
        k_slice(
            "s0",
            "n0",
            vec![
                device(
                    "gpu-0",
                    json!({"taints": [{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}]}),
                ),
                device(
                    "gpu-1",
                    json!({"taints": [{"key": "gpu.nvidia.com/unmonitored", "effect": "None"}]}),
                ),
            ],
            1,
            1,
        ),
    ];
    let c = build(items);
    let n = node(&c, "n0");
    assert_eq!(
        n.gpus.iter().map(|g| g.healthy).collect::<Vec<_>>(),
        [false, true]
    );
    assert_eq!(n.dra[0].taints, ["gpu.nvidia.com/xid=79:NoSchedule"]);
    assert_eq!(frag::report(&c, &Policy::default()).fully_free_gpus, 1);
}

#[test]
fn a_dra_object_of_another_version_is_an_error_naming_it() {
    let mut s = k_slice("old", "n0", vec![], 1, 1);
    s["apiVersion"] = json!("resource.k8s.io/v1beta1");
    let e = snapshot::parse(&list(vec![s])).unwrap_err().to_string();
    assert!(e.contains("item 0 (ResourceSlice old)"), "{e}");
}

// ---- Property: any allocation pattern is read without panic, and consistently ---------------

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]
    #[test]
    fn random_allocations_never_panic_and_stay_consistent(
        allocs in proptest::collection::vec((0usize..4, 0u8..4, prop::option::of(0u64..100)), 0..10),
        multi in any::<bool>(),
        count in 1i64..3,
    ) {
        let extra = if multi { json!({"allowMultipleAllocations": true}) } else { json!({}) };
        let mut items = vec![
            k_node("n0"),
            gpu_class(),
            k_slice("s0", "n0", (0..3).map(|i| device(&format!("gpu-{i}"), extra.clone())).collect(), count, 1),
        ];
        for (k, (dev, kind, gi)) in allocs.iter().enumerate() {
            let mut r = result(&format!("gpu-{dev}"), json!({}));
            if let Some(g) = gi {
                r["shareID"] = json!(format!("s{k}"));
                r["consumedCapacity"] = json!({"memory": format!("{g}Gi")});
            }
            if *kind == 3 {
                r["driver"] = json!("nic.example.com");
            }
            items.extend(claim_pod(&format!("p{k}"), "n0", json!([r])));
        }
        let c = build(items);
        let n = node(&c, "n0");
        prop_assert!(n.gpus.iter().all(|g| g.used <= GPU_MILLI));
        prop_assert_eq!(n.gpus.is_empty(), count != 1);
        for p in &c.pods {
            if let GpuUse::Devices(d) = &p.gpu {
                prop_assert!(d.iter().all(|(g, m)| *g < n.gpus.len() && *m <= n.gpus[*g].used));
            }
        }
        let _ = frag::report(&c, &eight_gpu_policy());
        let p = plan::plan(&c, &eight_gpu_policy(), None, &Default::default());
        for m in &p.moves {
            prop_assert_eq!(pod(&c, &m.pod).claim_source.clone(), ClaimSource::Movable);
        }
    }
}

// ---- DeviceTaintRules: administrators' taints, the runs' own device fences ------------------

fn rule(name: &str, selector: Option<Value>, effect: &str, fence: bool) -> Value {
    let mut r = json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule",
        "metadata": {"name": name},
        "spec": {"taint": {"key": "example.com/broken", "value": "yes", "effect": effect}}});
    if let Some(sel) = selector {
        r["spec"]["deviceSelector"] = sel;
    }
    if fence {
        r["metadata"]["labels"] = json!({"gpu-defrag.io/fence": "nightly"});
    }
    r
}

#[test]
fn device_taint_rules_of_administrators_taint_devices_those_of_runs_do_not() {
    let c = build({
        let mut items = two_gpus(json!({}));
        items.push(rule(
            "broken",
            Some(json!({"driver": "gpu.nvidia.com", "pool": "n0", "device": "gpu-0"})),
            "NoSchedule",
            false,
        ));
        // A run's own fence: the run is emptying the device, its plan counts it freed.
        items.push(rule(
            "gpu-defrag-0123456789abcdef",
            Some(json!({"driver": "gpu.nvidia.com", "pool": "n0", "device": "gpu-1"})),
            "NoSchedule",
            true,
        ));
        // Informational, another pool, and a rule without a selector (matches nothing).
        items.push(rule("note", Some(json!({"pool": "n0"})), "None", false));
        items.push(rule(
            "elsewhere",
            Some(json!({"pool": "n9"})),
            "NoExecute",
            false,
        ));
        items.push(rule("no-selector", None, "NoSchedule", false));
        items
    });
    let n = node(&c, "n0");
    assert_eq!(
        n.gpus.iter().map(|g| g.healthy).collect::<Vec<_>>(),
        [false, true]
    );
    assert_eq!(
        n.dra[0].taints,
        [
            "example.com/broken=yes:NoSchedule (DeviceTaintRule broken)",
            "example.com/broken=yes:None (DeviceTaintRule note)"
        ]
    );
    assert_eq!(
        n.dra[1].taints,
        ["example.com/broken=yes:None (DeviceTaintRule note)"]
    );
    assert_eq!(frag::report(&c, &Policy::default()).fully_free_gpus, 1);
    // An empty selector matches every device.
    let c = build({
        let mut items = two_gpus(json!({}));
        items.push(rule("all", Some(json!({})), "NoSchedule", false));
        items
    });
    assert!(node(&c, "n0").gpus.iter().all(|g| !g.healthy));
}

/// Two 8-GPU DRA nodes: `a` holds a pod with a named claim and four template-claim pods
/// that opted out, `b` five template-claim pods; three GPUs free on each, a 4-GPU shape
/// fits nowhere.
fn one_gpu_apart() -> Cluster {
    let mut items = vec![k_node("a"), k_node("b"), gpu_class()];
    for n in ["a", "b"] {
        let devices = (0..8)
            .map(|i| device(&format!("gpu-{i}"), json!({})))
            .collect();
        items.push(k_slice(&format!("s-{n}"), n, devices, 1, 1));
    }
    let on = |pod: &str, node: &str, dev: usize, named: bool| -> Vec<Value> {
        let claim = format!("{pod}-c");
        let source = if named {
            json!({"name": "gpu", "resourceClaimName": claim})
        } else {
            json!({"name": "gpu", "resourceClaimTemplateName": "t"})
        };
        let mut p = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod, "namespace": "ml", "uid": format!("u-{pod}"),
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": format!("rs-{pod}"), "uid": "r", "controller": true}]},
            "spec": {"nodeName": node, "schedulerName": "gpu-binpack",
                "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}],
                "resourceClaims": [source]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}});
        if !named {
            p["status"]["resourceClaimStatuses"] =
                json!([{"name": "gpu", "resourceClaimName": claim}]);
        }
        vec![
            p,
            json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": claim, "namespace": "ml"},
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}},
                "status": {"allocation": {"devices": {"results": [
                    {"request": "gpu", "driver": "gpu.nvidia.com", "pool": node, "device": format!("gpu-{dev}")}]}},
                    "reservedFor": [{"resource": "pods", "name": pod, "uid": format!("u-{pod}")}]}}),
        ]
    };
    items.extend(on("anchor", "a", 0, true));
    for i in 1..5 {
        // Opted out: only `b`'s pods can move.
        let mut a = on(&format!("a-{i}"), "a", i, false);
        a[0]["metadata"]["annotations"] = json!({"gpu-defrag.io/do-not-disrupt": "true"});
        items.extend(a);
    }
    for i in 0..5 {
        items.extend(on(&format!("b-{i}"), "b", i, false));
    }
    build(items)
}

#[test]
fn a_single_dra_gpu_is_drained_behind_a_device_fence_only_where_rules_are_served() {
    let policy = whole_gpus_policy(4);
    let c = one_gpu_apart();
    assert!(c.dra_device_fences, "a snapshot is read as of 1.37");
    assert_eq!(frag::report(&c, &policy).unknown_pods, 0);
    let p = plan::plan(&c, &policy, None, &Default::default());
    // Neither node can be emptied; one pod moving to the other node frees room for the
    // shape: a single-GPU drain, fenced by itself.
    assert_eq!(p.moves.len(), 1, "{p:#?}");
    assert_eq!(p.batches.len(), 1);
    let b = &p.batches[0];
    assert_eq!(b.kind, plan::UnitKind::Gpu);
    assert!(b.device_fence);
    let m = &p.moves[0];
    assert_ne!(m.from_node, m.to_node);
    assert_eq!(b.node, m.from_node);
    assert_eq!(
        b.dra_device,
        Some(plan::DraDevice {
            driver: "gpu.nvidia.com".into(),
            pool: m.from_node.clone(),
        })
    );
    assert_eq!(
        p.fenced_devices,
        [plan::FencedDevice {
            node: m.from_node.clone(),
            gpu: m.from_devices[0].clone(),
            dra: b.dra_device.clone(),
        }]
    );
    assert!(p.fenced_nodes.is_empty());
    assert!(p.after.fragment_rate < p.before.fragment_rate);
    // Where DeviceTaintRules are not served, a DRA GPU is never drained by itself.
    let mut without = c.clone();
    without.dra_device_fences = false;
    let p = plan::plan(&without, &policy, None, &Default::default());
    assert!(p.moves.is_empty(), "{p:#?}");
}
