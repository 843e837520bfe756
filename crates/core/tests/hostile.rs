//! Hostile input: every annotation parser and the snapshot loader fed random bytes, huge
//! values, deep nesting and many entries must return a value or an error, never panic, and
//! finish quickly (each case is one bounded call: a pathological input shows as a hang of
//! this test binary in CI, not as a flaky timing assertion). Plus spoofed device records: a
//! tenant's fake record must never get another tenant's pod evicted.
//!
//! The per-parser unit tests (`never_panics*` in `src/formats`) cover short random text;
//! this file covers sizes and shapes those do not.
use std::collections::BTreeMap;

use gpu_defrag_core::formats::{self, MAX_RECORD_BYTES};
use gpu_defrag_core::ingest::build_cluster;
use gpu_defrag_core::model::*;
use gpu_defrag_core::plan::{History, movable, plan};
use gpu_defrag_core::policy::{Policy, TargetShape};
use gpu_defrag_core::snapshot;
use proptest::prelude::*;

/// Feeds one text to every text parser; none may panic.
fn all_text_parsers(s: &str) {
    let _ = formats::parse_hami_node_register(s);
    let _ = formats::parse_volcano_node_register(s);
    let _ = formats::parse_hami_pod_devices(s);
    let _ = formats::parse_koord_device_allocated(s);
    let _ = formats::parse_index_list(formats::keys::VOLCANO_GPU_INDEX, s);
    let _ = formats::parse_gpu_fraction(s);
    let _ = formats::parse_mig_resource(s);
    let _ = formats::parse_mig_profile(s);
    let _ = formats::quantity_to_milli(s);
    let _ = formats::quantity_to_bytes(s);
    let _ = formats::quantity_to_count(s);
    let ann = BTreeMap::from([
        (formats::keys::ALIYUN_GPU_MEM_IDX.to_string(), s.to_string()),
        (formats::keys::ALIYUN_GPU_MEM_POD.to_string(), s.to_string()),
        (formats::keys::ALIYUN_GPU_MEM_DEV.to_string(), s.to_string()),
    ]);
    let _ = formats::parse_aliyun(&ann);
    // The node's device fences: HAMi's list and the runs' claims, both from anyone.
    let fences = BTreeMap::from([
        (
            gpu_defrag_core::fence::HAMI_DEVICE_CORDON.to_string(),
            s.to_string(),
        ),
        (
            gpu_defrag_core::fence::OWNED_DEVICE_CORDONS.to_string(),
            s.to_string(),
        ),
    ]);
    let _ = gpu_defrag_core::fence::cordon(&fences, "p", &[s.to_string()]);
    let _ = gpu_defrag_core::fence::uncordon(&fences, "p");
    if let Ok(v) = serde_json::from_str::<serde_json::Value>(s) {
        let _ = formats::parse_koord_device_object(&v);
    }
    let _ = snapshot::parse(s);
}

/// Inputs every record parser must refuse: errors, not values.
fn refused_by_record_parsers(s: &str) {
    assert!(formats::parse_hami_node_register(s).is_err());
    assert!(formats::parse_volcano_node_register(s).is_err());
    assert!(formats::parse_hami_pod_devices(s).is_err());
    assert!(formats::parse_koord_device_allocated(s).is_err());
    assert!(formats::parse_index_list(formats::keys::VOLCANO_GPU_INDEX, s).is_err());
    assert!(formats::parse_gpu_fraction(s).is_err());
}

#[test]
fn megabyte_values_are_refused_unread() {
    for unit in ["a", "9", "[", "{", "GPU-x,NVIDIA,1,0:", "é"] {
        let s = unit.repeat((1 << 20) / unit.len() + 1);
        assert!(s.len() > MAX_RECORD_BYTES);
        refused_by_record_parsers(&s);
        all_text_parsers(&s);
    }
}

#[test]
fn records_just_under_the_size_limit_parse_in_linear_time() {
    // Largest accepted values, full of entries: many containers, many devices.
    let dev = "GPU-0000,NVIDIA,1024,10:";
    let many = dev.repeat(MAX_RECORD_BYTES / dev.len());
    let slots = ";".repeat(MAX_RECORD_BYTES);
    let commas = ",".repeat(MAX_RECORD_BYTES);
    let colons = ":".repeat(MAX_RECORD_BYTES);
    let json_objs = format!(
        "[{}]",
        vec![r#"{"minor":0}"#; MAX_RECORD_BYTES / 13].join(",")
    );
    for s in [&many, &slots, &commas, &colons, &json_objs] {
        assert!(s.len() <= MAX_RECORD_BYTES + 2);
        all_text_parsers(s);
    }
    assert!(formats::parse_hami_pod_devices(&many).is_err());
    assert!(formats::parse_hami_pod_devices(&slots).is_err());
    assert!(formats::parse_koord_device_allocated(&json_objs).is_err());
}

#[test]
fn deep_json_is_an_error_not_a_stack_overflow() {
    for depth in [1_000, 100_000] {
        let arr = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        let open = "[".repeat(depth);
        let obj = format!("{}1{}", r#"{"a":"#.repeat(depth), "}".repeat(depth));
        for s in [&arr, &open, &obj] {
            all_text_parsers(s);
            if s.len() <= MAX_RECORD_BYTES {
                refused_by_record_parsers(s);
            }
        }
        // Inside a snapshot: as a whole document, inside an item, inside an annotation.
        let item = format!(r#"{{"kind":"List","items":[{{"kind":"Pod","x":{arr}}}]}}"#);
        let front = format!(r#"{{"kind":"List","items":[{{"x":{arr},"kind":"Pod"}}]}}"#);
        let ann = format!(
            r#"{{"kind":"List","items":[{{"kind":"Node","metadata":{{"name":"n","annotations":{{"hami.io/node-nvidia-register":{:?}}}}}}}]}}"#,
            arr
        );
        // An unknown deep field may be skipped or refused; either way the loader returns.
        let _ = snapshot::parse(&item);
        let _ = snapshot::parse(&front);
        // A deep annotation is only text to the loader; the parser refuses it later.
        if let Ok(objs) = snapshot::parse(&ann) {
            let c = build_cluster(&objs, None);
            assert!(c.nodes.iter().all(|n| n.inconsistent.is_some()));
        }
        let yaml_flow = format!("kind: List\nitems:\n- kind: Pod\n  x: {arr}\n");
        let yaml_block = format!(
            "kind: List\nitems:\n- kind: Pod\n  x:\n{}",
            (0..depth.min(500))
                .map(|i| format!("{}- \n", " ".repeat(4 + 2 * i)))
                .collect::<String>()
        );
        // Refused before the YAML parser (whose time grows with the depth) sees it.
        assert!(snapshot::parse(&yaml_flow).is_err());
        let yaml_flat = format!(
            "kind: List\nitems:\n- kind: Pod\n  x: {}{}{}\n",
            "[".repeat(snapshot::MAX_YAML_FLOW_DEPTH),
            "a,".repeat(100_000),
            "]".repeat(snapshot::MAX_YAML_FLOW_DEPTH)
        );
        let _ = snapshot::parse(&yaml_flat);
        let _ = snapshot::parse(&yaml_block);
        // Deep Device object values (built directly) are walked only where expected.
        let v = serde_json::json!({"kind": "Device", "metadata": {"name": "n"},
            "spec": {"devices": [{"type": "gpu", "minor": serde_json::from_str::<serde_json::Value>(
                &format!("{}{}", "[".repeat(100), "]".repeat(100))).unwrap()}]}});
        assert!(formats::parse_koord_device_object(&v).is_err());
    }
}

#[test]
fn numbers_beyond_u64_are_range_errors() {
    let big = "9".repeat(400);
    let huge = format!("1{}", "0".repeat(20));
    for n in [&big, &huge, &"18446744073709551616".to_string()] {
        let register = format!(
            r#"[{{"id":"GPU-a","index":0,"count":{n},"devmem":{n},"devcore":100,"type":"T","health":true}}]"#
        );
        assert!(formats::parse_hami_node_register(&register).is_err());
        let legacy = format!("GPU-a,{n},{n},100,T,0,true:");
        assert!(formats::parse_hami_node_register(&legacy).is_err());
        assert!(
            formats::parse_volcano_node_register(&format!("GPU-a,{n},{n},T,true,hami-core:"))
                .is_err()
        );
        assert!(formats::parse_hami_pod_devices(&format!("GPU-a,NVIDIA,{n},{n}:;")).is_err());
        let koord = format!(
            r#"{{"gpu":[{{"minor":{n},"resources":{{"koordinator.sh/gpu-memory":"{n}Ei"}}}}]}}"#
        );
        assert!(formats::parse_koord_device_allocated(&koord).is_err());
        assert!(formats::parse_index_list(formats::keys::VOLCANO_GPU_INDEX, n).is_err());
        assert!(formats::parse_gpu_fraction(n).is_err());
        assert!(formats::quantity_to_bytes(&format!("{n}Ei")).is_err());
        assert!(formats::quantity_to_count(&format!("{n}E")).is_err());
        assert!(formats::quantity_to_milli(&format!("{n}e99999")).is_err());
        let ann = BTreeMap::from([
            (
                formats::keys::ALIYUN_GPU_MEM_IDX.to_string(),
                "0".to_string(),
            ),
            (formats::keys::ALIYUN_GPU_MEM_POD.to_string(), n.to_string()),
            (formats::keys::ALIYUN_GPU_MEM_DEV.to_string(), n.to_string()),
        ]);
        assert!(formats::parse_aliyun(&ann).is_err());
        // serde_json reads integers beyond u64 as floats (or refuses them past f64).
        if let Ok(minor) = serde_json::from_str::<serde_json::Value>(n) {
            let dev = serde_json::json!({"metadata": {"name": "n"},
                "spec": {"devices": [{"type": "gpu", "minor": minor}]}});
            assert!(formats::parse_koord_device_object(&dev).is_err());
        }
        let text = format!(
            r#"{{"metadata":{{"name":"n"}},"spec":{{"devices":[{{"type":"gpu","minor":0,"resources":{{"koordinator.sh/gpu-memory":"{n}"}}}}]}}}}"#
        );
        let dev: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert!(formats::parse_koord_device_object(&dev).is_err());
        assert!(formats::parse_mig_resource(&format!("nvidia.com/mig-{n}g.{n}gb")).is_none());
    }
    // Exponents that would take long to expand are refused, not computed.
    for q in [
        "1e999999999",
        "1e-999999999",
        "0.000000000000000000000000000000001",
    ] {
        let _ = formats::quantity_to_milli(q);
        let _ = formats::quantity_to_bytes(q);
    }
}

#[test]
fn many_entries_are_capped() {
    let n = formats::MAX_DEVICES_PER_NODE + 1;
    let json = format!(
        "[{}]",
        (0..n)
            .map(|i| format!(r#"{{"id":"GPU-{i}","index":{i},"count":10,"devmem":1024,"devcore":100,"type":"T","health":true}}"#))
            .collect::<Vec<_>>()
            .join(",")
    );
    assert!(formats::parse_hami_node_register(&json).is_err());
    let legacy: String = (0..n)
        .map(|i| format!("GPU-{i},10,1024,100,T,0,true:"))
        .collect();
    assert!(formats::parse_hami_node_register(&legacy).is_err());
    let containers = "GPU-a,NVIDIA,1,0:;".repeat(formats::MAX_CONTAINERS + 1);
    assert!(formats::parse_hami_pod_devices(&containers).is_err());
    let koord = format!(
        r#"{{"gpu":[{}]}}"#,
        (0..n)
            .map(|i| format!(r#"{{"minor":{i}}}"#))
            .collect::<Vec<_>>()
            .join(",")
    );
    assert!(formats::parse_koord_device_allocated(&koord).is_err());
    let idx = (0..n).map(|i| i.to_string()).collect::<Vec<_>>().join(",");
    assert!(formats::parse_index_list(formats::keys::VOLCANO_GPU_INDEX, &idx).is_err());
    let dev = serde_json::json!({"metadata": {"name": "n"}, "spec": {"devices":
        (0..10_000).map(|i| serde_json::json!({"type": "gpu", "minor": i})).collect::<Vec<_>>()}});
    assert!(formats::parse_koord_device_object(&dev).is_err());
    // A snapshot with very many small items loads (it is bounded by its byte size only).
    let items = vec![r#"{"kind":"ConfigMap"}"#; 200_000].join(",");
    let objs = snapshot::parse(&format!(r#"{{"kind":"List","items":[{items}]}}"#)).unwrap();
    assert!(objs.pods.is_empty());
}

fn arb_json(depth: u32) -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        any::<u64>().prop_map(serde_json::Value::from),
        any::<f64>().prop_map(|f| serde_json::json!(f)),
        "[a-zA-Z0-9.,:;\\- ]{0,20}".prop_map(serde_json::Value::from),
        prop_oneof![
            Just("gpu"),
            Just("Device"),
            Just("minor"),
            Just("100"),
            Just("1Gi")
        ]
        .prop_map(serde_json::Value::from),
    ];
    leaf.prop_recursive(depth, 64, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::from),
            proptest::collection::btree_map(
                prop_oneof![
                    Just("gpu".to_string()),
                    Just("minor".to_string()),
                    Just("resources".to_string()),
                    Just("kind".to_string()),
                    Just("metadata".to_string()),
                    Just("name".to_string()),
                    Just("spec".to_string()),
                    Just("devices".to_string()),
                    Just("type".to_string()),
                    Just("id".to_string()),
                    Just("devmem".to_string()),
                    Just("items".to_string()),
                    "[a-z]{1,8}",
                ],
                inner,
                0..6
            )
            .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Random snapshot-shaped JSON: a List with Node/Pod/Device items whose fields are random.
fn arb_snapshot() -> impl Strategy<Value = String> {
    let item = (
        prop_oneof![
            Just("Node"),
            Just("Pod"),
            Just("Device"),
            Just("PodDisruptionBudget"),
            Just("Other")
        ],
        arb_json(4),
        arb_json(3),
    )
        .prop_map(|(kind, spec, meta)| {
            serde_json::json!({"apiVersion": "v1", "kind": kind, "metadata": meta, "spec": spec, "status": spec})
        });
    proptest::collection::vec(item, 0..6).prop_map(|items| {
        serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..4096)) {
        all_text_parsers(&String::from_utf8_lossy(&b));
    }

    #[test]
    fn random_text_never_panics(s in "\\PC{0,2000}") {
        all_text_parsers(&s);
    }

    #[test]
    fn random_record_shaped_text_never_panics(
        s in "[\\[\\]{}\":,;GPU0-9a-fx. -]{0,3000}"
    ) {
        all_text_parsers(&s);
    }

    #[test]
    fn random_json_never_panics(v in arb_json(6)) {
        let s = v.to_string();
        all_text_parsers(&s);
        let _ = formats::parse_koord_device_object(&v);
        let wrapped = serde_json::json!({"metadata": {"name": "n"}, "spec": {"devices": [v.clone()]}});
        let _ = formats::parse_koord_device_object(&wrapped);
        let alloc = serde_json::json!({"gpu": [v]});
        let _ = formats::parse_koord_device_allocated(&alloc.to_string());
    }

    #[test]
    fn random_snapshots_load_or_fail_cleanly_and_ingest(s in arb_snapshot()) {
        // JSON and the same document as YAML (JSON is a YAML subset, minus the `{` fast path).
        for text in [s.clone(), format!("# yaml\n{s}")] {
            if let Ok(objs) = snapshot::parse(&text) {
                let c = build_cluster(&objs, None);
                let _ = plan(&c, &Policy::default(), None, &History::default());
            }
        }
    }

    #[test]
    fn random_pod_records_in_a_cluster_never_panic(
        rec in "[GPU\\-ab0-9,NVIDIA:;]{0,200}",
        key in prop_oneof![
            Just(formats::keys::HAMI_DEVICES_ALLOCATED),
            Just(formats::keys::VOLCANO_VGPU_IDS_NEW),
            Just(formats::keys::KOORD_DEVICE_ALLOCATED),
            Just(formats::keys::VOLCANO_GPU_INDEX),
            Just(formats::keys::KAI_GPU_FRACTION),
            Just(formats::keys::ALIYUN_GPU_MEM_IDX),
        ],
        gpus in "[0-9a-z.]{0,8}",
    ) {
        let mut objs = spoof_cluster();
        let mut p = pod_obj("tenant-x", "fuzz", "hami-a", &gpus, None);
        p.metadata.annotations = Some(BTreeMap::from([(key.to_string(), rec)]));
        objs.pods.push(p);
        let c = build_cluster(&objs, None);
        let _ = plan(&c, &Policy::default(), None, &History::default());
    }
}

// ---- Spoofing ------------------------------------------------------------------------

const REGISTER: &str = "hami.io/node-nvidia-register";

fn node_obj(name: &str, gpus: &[&str]) -> k8s_openapi::api::core::v1::Node {
    let reg: Vec<_> = gpus
        .iter()
        .enumerate()
        .map(|(i, id)| {
            serde_json::json!({"id": id, "index": i, "count": 10, "devmem": 81920,
                "devcore": 100, "type": "NVIDIA-H100", "numa": 0, "mode": "hami-core", "health": true})
        })
        .collect();
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name},
            "annotations": {REGISTER: serde_json::Value::from(reg).to_string()}},
        "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110",
            "nvidia.com/gpu": (gpus.len() * 10).to_string()},
            "conditions": [{"type": "Ready", "status": "True"}]}
    }))
    .unwrap()
}

/// A Running pod of a ReplicaSet in `ns`, bound to `node`, requesting `gpus` vGPUs, with an
/// optional HAMi record.
fn pod_obj(
    ns: &str,
    name: &str,
    node: &str,
    gpus: &str,
    record: Option<&str>,
) -> k8s_openapi::api::core::v1::Pod {
    let mut meta = serde_json::json!({"name": name, "namespace": ns, "uid": format!("{ns}-{name}"),
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": format!("{name}-rs"),
            "uid": "rs", "controller": true}]});
    if let Some(r) = record {
        meta["annotations"] = serde_json::json!({formats::keys::HAMI_DEVICES_ALLOCATED: r});
    }
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": meta,
        "spec": {"nodeName": node, "schedulerName": "gpu-binpack",
            "containers": [{"name": "c", "resources": {
            "limits": {"nvidia.com/gpu": gpus}, "requests": {"cpu": "1", "memory": "1Gi"}}}]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    }))
    .unwrap()
}

/// Two HAMi nodes of two 80 GiB GPUs. `victim` (tenant-b) holds half of GPU-a0 and `other`
/// (tenant-c) half of GPU-b0: merging them frees a whole GPU, so an honest cluster plans a
/// move.
fn spoof_cluster() -> gpu_defrag_core::ingest::Objects {
    gpu_defrag_core::ingest::Objects {
        nodes: vec![
            node_obj("hami-a", &["GPU-a0", "GPU-a1"]),
            node_obj("hami-b", &["GPU-b0", "GPU-b1"]),
        ],
        pods: vec![
            pod_obj(
                "tenant-b",
                "victim",
                "hami-a",
                "1",
                Some("GPU-a0,NVIDIA,40960,50:;"),
            ),
            pod_obj(
                "tenant-c",
                "other",
                "hami-b",
                "1",
                Some("GPU-b0,NVIDIA,40960,50:;"),
            ),
        ],
        ..Default::default()
    }
}

/// A policy targeting whole-GPU pods, so two half GPUs are fragmentation.
fn whole_gpu_policy() -> Policy {
    Policy {
        shapes: vec![TargetShape::of_gpus(1, 1000, 1.0)],
        // Each pod is its workload's only replica: the records are on trial here, not
        // the workload rules.
        evict_single_replicas: true,
        ..Policy::default()
    }
}

fn gpu_of<'a>(c: &'a Cluster, key: &str) -> &'a GpuUse {
    &c.pods.iter().find(|p| p.key() == key).unwrap().gpu
}

#[test]
fn the_honest_cluster_plans_a_move() {
    let c = build_cluster(&spoof_cluster(), None);
    assert!(c.nodes.iter().all(|n| n.inconsistent.is_none()));
    let p = plan(&c, &whole_gpu_policy(), None, &History::default());
    assert!(
        !p.moves.is_empty(),
        "control case: the planner merges the two halves"
    );
}

#[test]
fn a_spoofed_record_never_gets_another_tenants_pod_evicted() {
    let spoofs: [(&str, &str, &str); 5] = [
        // Claims the whole memory of the GPU tenant-b's pod holds: over-commit.
        ("full-memory", "1", "GPU-a0,NVIDIA,81920,100:;"),
        // Claims two GPUs while requesting one: disagrees with its request.
        (
            "two-devices",
            "1",
            "GPU-a0,NVIDIA,81920,100:GPU-a1,NVIDIA,81920,100:;",
        ),
        // Claims a GPU the node does not have.
        ("foreign-gpu", "1", "GPU-b0,NVIDIA,81920,100:;"),
        // Claims more memory than the GPU has.
        ("over-memory", "1", "GPU-a0,NVIDIA,999999,100:;"),
        // Claims a GPU without requesting any.
        ("no-request", "0", "GPU-a0,NVIDIA,40960,50:;"),
    ];
    let policy = whole_gpu_policy();
    for (what, gpus, record) in spoofs {
        let mut objs = spoof_cluster();
        objs.pods
            .push(pod_obj("tenant-a", "spoof", "hami-a", gpus, Some(record)));
        let c = build_cluster(&objs, None);
        let a = c.node_index("hami-a").unwrap();
        let node = &c.nodes[a];
        assert!(
            matches!(gpu_of(&c, "tenant-a/spoof"), GpuUse::Unknown(_)),
            "{what}: the spoofing pod is unknown, got {:?}",
            gpu_of(&c, "tenant-a/spoof")
        );
        assert!(
            node.unknown_pods > 0 || node.inconsistent.is_some(),
            "{what}: hami-a is marked"
        );
        // The victim either is unknown itself or sits on an undrainable node.
        let victim = c
            .pods
            .iter()
            .find(|p| p.key() == "tenant-b/victim")
            .unwrap();
        assert!(
            movable(victim, &c, &policy, None, &History::default()).is_err(),
            "{what}: the victim must not be movable"
        );
        let p = plan(&c, &policy, None, &History::default());
        for m in &p.moves {
            assert!(
                m.from_node != "hami-a",
                "{what}: move {m:?} drains the spoofed node"
            );
            assert!(
                m.to_node != "hami-a",
                "{what}: move {m:?} lands on the spoofed node, whose real use is unknown"
            );
            assert!(!m.pod.starts_with("tenant-b/"), "{what}: {m:?}");
        }
        assert!(
            p.skipped.values().sum::<u64>() >= 1,
            "{what}: the blocked pods are reported, got {:?}",
            p.skipped
        );
    }
}

#[test]
fn a_collision_makes_both_pods_unknown() {
    let mut objs = spoof_cluster();
    objs.pods.push(pod_obj(
        "tenant-a",
        "spoof",
        "hami-a",
        "1",
        Some("GPU-a0,NVIDIA,81920,100:;"),
    ));
    let c = build_cluster(&objs, None);
    assert!(
        c.nodes[c.node_index("hami-a").unwrap()]
            .inconsistent
            .is_some()
    );
    assert!(
        c.nodes[c.node_index("hami-b").unwrap()]
            .inconsistent
            .is_none()
    );
    for key in ["tenant-a/spoof", "tenant-b/victim"] {
        assert!(
            matches!(
                gpu_of(&c, key),
                GpuUse::Unknown(UnknownReason::Overcommitted(_))
            ),
            "{key}: {:?}",
            gpu_of(&c, key)
        );
    }
    assert!(!matches!(gpu_of(&c, "tenant-c/other"), GpuUse::Unknown(_)));
}

// ---- Unreadable quantities ---------------------------------------------------------------

/// Sets resource `name` of the pod's first container (`requests` or `limits`) to `value`.
fn set_resource(p: &mut k8s_openapi::api::core::v1::Pod, section: &str, name: &str, value: &str) {
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    let res = p.spec.as_mut().unwrap().containers[0]
        .resources
        .get_or_insert_with(Default::default);
    let list = match section {
        "requests" => &mut res.requests,
        _ => &mut res.limits,
    };
    list.get_or_insert_with(Default::default)
        .insert(name.into(), Quantity(value.into()));
}

/// No move starts on or lands on `node`.
fn assert_untouched(c: &Cluster, node: &str, what: &str) {
    let p = plan(c, &whole_gpu_policy(), None, &History::default());
    for m in &p.moves {
        assert!(
            m.from_node != node && m.to_node != node,
            "{what}: move {m:?} touches {node}"
        );
    }
}

#[test]
fn an_unreadable_request_makes_the_pod_unknown_instead_of_zero() {
    let cases: [(&str, &str, &str, &str); 7] = [
        ("requests", "cpu", "abc", "requests.cpu"),
        ("requests", "memory", "1Gb", "requests.memory"),
        ("limits", "cpu", "1.2.3", "limits.cpu"),
        ("limits", "nvidia.com/gpu", "one", "limits.nvidia.com/gpu"),
        (
            "limits",
            "nvidia.com/gpumem",
            "-40960",
            "limits.nvidia.com/gpumem",
        ),
        ("limits", "example.com/nic", "1x", "limits.example.com/nic"),
        // A count that is a quantity but not a whole number.
        ("limits", "nvidia.com/gpu", "500m", "nvidia.com/gpu"),
    ];
    for (section, name, value, named) in cases {
        let what = format!("{section}.{name}: {value}");
        let mut objs = spoof_cluster();
        let mut p = pod_obj(
            "tenant-a",
            "bad",
            "hami-a",
            "1",
            Some("GPU-a1,NVIDIA,40960,50:;"),
        );
        set_resource(&mut p, section, name, value);
        objs.pods.push(p);
        let c = build_cluster(&objs, None);
        let pod = c.pods.iter().find(|p| p.key() == "tenant-a/bad").unwrap();
        match &pod.gpu {
            GpuUse::Unknown(r @ UnknownReason::BadQuantity(m)) => {
                assert_eq!(r.code(), "bad-quantity");
                assert!(m.contains(named), "{what}: {m}");
                assert!(r.to_string().starts_with("bad-quantity: "), "{r}");
            }
            other => panic!("{what}: want bad-quantity, got {other:?}"),
        }
        let a = &c.nodes[c.node_index("hami-a").unwrap()];
        assert_eq!(a.unknown_pods, 1, "{what}");
        let victim = c
            .pods
            .iter()
            .find(|p| p.key() == "tenant-b/victim")
            .unwrap();
        assert_eq!(
            movable(victim, &c, &whole_gpu_policy(), None, &History::default()),
            Err(gpu_defrag_core::plan::Skip::NodeUndrainable),
            "{what}"
        );
        assert_untouched(&c, "hami-a", &what);
    }
}

#[test]
fn an_unreadable_init_container_request_makes_the_pod_unknown() {
    let mut objs = spoof_cluster();
    let mut p = pod_obj("tenant-a", "init", "hami-a", "0", None);
    let spec = p.spec.as_mut().unwrap();
    let mut init = spec.containers[0].clone();
    init.name = "setup".into();
    init.resources =
        Some(serde_json::from_value(serde_json::json!({"requests": {"cpu": "lots"}})).unwrap());
    spec.init_containers = Some(vec![init]);
    objs.pods.push(p);
    let c = build_cluster(&objs, None);
    let pod = c.pods.iter().find(|p| p.key() == "tenant-a/init").unwrap();
    assert!(
        matches!(&pod.gpu, GpuUse::Unknown(UnknownReason::BadQuantity(m)) if m.contains("init container setup: requests.cpu")),
        "{:?}",
        pod.gpu
    );
    assert_untouched(&c, "hami-a", "init container");
}

/// Before, a Volcano gpushare `gpu-number` that was not a whole number counted as 0 and the
/// pod was read as a memory share.
#[test]
fn a_gpu_count_that_is_not_whole_is_not_read_as_zero() {
    let text = r#"
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Node
  metadata: {name: volcano-0}
  status:
    allocatable: {cpu: "64", memory: 512Gi, pods: "110", volcano.sh/gpu-memory: "65536", volcano.sh/gpu-number: "4"}
    conditions: [{type: Ready, status: "True"}]
- apiVersion: v1
  kind: Pod
  metadata:
    name: half-card
    namespace: ml
    annotations: {volcano.sh/gpu-index: "1"}
  spec:
    nodeName: volcano-0
    containers: [{name: c, resources: {limits: {volcano.sh/gpu-number: "1.5", volcano.sh/gpu-memory: "4096"}}}]
  status: {phase: Running}
"#;
    let c = build_cluster(&snapshot::parse(text).unwrap(), None);
    let pod = &c.pods[0];
    assert!(
        matches!(&pod.gpu, GpuUse::Unknown(UnknownReason::BadQuantity(m)) if m.contains("volcano.sh/gpu-number")),
        "{:?}",
        pod.gpu
    );
    assert_eq!(c.nodes[0].unknown_pods, 1);
    assert!(c.nodes[0].gpus.iter().all(|g| g.used == 0));
}

#[test]
fn micro_and_nano_cpu_requests_are_read_and_round_up() {
    let mut objs = spoof_cluster();
    let mut p = pod_obj("tenant-a", "tiny", "hami-a", "0", None);
    set_resource(&mut p, "requests", "cpu", "250u");
    set_resource(&mut p, "requests", "memory", "1500000000n");
    objs.pods.push(p);
    let c = build_cluster(&objs, None);
    let pod = c.pods.iter().find(|p| p.key() == "tenant-a/tiny").unwrap();
    assert_eq!(
        (pod.cpu, pod.mem),
        (1, 2),
        "0.25 milli-CPU → 1 milli; 1.5 bytes → 2"
    );
    assert_eq!(pod.gpu, GpuUse::None);
    assert_eq!(c.nodes[c.node_index("hami-a").unwrap()].unknown_pods, 0);
}

/// A node whose allocatable cpu, memory, pod count or GPU count cannot be read is marked
/// inconsistent: nothing is moved from it and nothing onto it.
#[test]
fn a_node_with_unreadable_allocatable_is_neither_drained_nor_a_target() {
    let control = build_cluster(&spoof_cluster(), None);
    assert!(
        !plan(&control, &whole_gpu_policy(), None, &History::default())
            .moves
            .is_empty(),
        "control case: the planner merges the two halves"
    );
    for name in ["cpu", "memory", "pods"] {
        let mut objs = spoof_cluster();
        let node = &mut objs.nodes[1];
        node.status
            .as_mut()
            .unwrap()
            .allocatable
            .as_mut()
            .unwrap()
            .insert(
                name.into(),
                k8s_openapi::apimachinery::pkg::api::resource::Quantity("lots".into()),
            );
        let c = build_cluster(&objs, None);
        let b = &c.nodes[c.node_index("hami-b").unwrap()];
        let why = b.inconsistent.as_deref().unwrap_or_default();
        assert!(
            why.contains(&format!("allocatable {name}")),
            "{name}: {why:?}"
        );
        // Its GPU records stay readable: only the node is marked.
        assert!(
            matches!(gpu_of(&c, "tenant-c/other"), GpuUse::Devices(_)),
            "{name}"
        );
        let other = c.pods.iter().find(|p| p.key() == "tenant-c/other").unwrap();
        assert_eq!(
            movable(other, &c, &whole_gpu_policy(), None, &History::default()),
            Err(gpu_defrag_core::plan::Skip::NodeUndrainable),
            "{name}"
        );
        assert!(
            plan(&c, &whole_gpu_policy(), None, &History::default())
                .moves
                .is_empty(),
            "{name}: the only move would drain hami-b or land on it"
        );
    }
    // Plain nodes: an unreadable GPU count.
    let text = r#"
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Node
  metadata: {name: plain-a}
  status:
    allocatable: {cpu: "64", memory: 512Gi, pods: "110", nvidia.com/gpu: "eight"}
    conditions: [{type: Ready, status: "True"}]
- apiVersion: v1
  kind: Pod
  metadata: {name: p, namespace: ml}
  spec:
    nodeName: plain-a
    containers: [{name: c, resources: {limits: {nvidia.com/gpu: "1"}}}]
  status: {phase: Running}
"#;
    let c = build_cluster(&snapshot::parse(text).unwrap(), None);
    let n = &c.nodes[0];
    assert!(n.inconsistent.is_some() && n.gpus.is_empty());
    assert!(matches!(
        &c.pods[0].gpu,
        GpuUse::Unknown(UnknownReason::NodeInventory(_))
    ));
    assert_untouched(&c, "plain-a", "plain");
}

// ---- NVIDIA sharing (time-slicing, MPS): the node's labels are the only inventory.

/// The spoof cluster plus node `ts` with the given GPU feature discovery labels and GPU
/// allocatable, and one pod of tenant-d holding one `nvidia.com/gpu` there.
fn with_sharing_node(labels: &[(&str, &str)], alloc: &[(&str, &str)]) -> Cluster {
    let mut objs = spoof_cluster();
    let labels: serde_json::Map<String, serde_json::Value> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), serde_json::Value::from(*v)))
        .collect();
    let mut allocatable = serde_json::json!({"cpu": "64", "memory": "512Gi", "pods": "110"});
    for (k, v) in alloc {
        allocatable[*k] = serde_json::Value::from(*v);
    }
    objs.nodes.push(
        serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "ts", "labels": labels},
            "status": {"allocatable": allocatable,
                "conditions": [{"type": "Ready", "status": "True"}]}
        }))
        .unwrap(),
    );
    objs.pods.push(pod_obj("tenant-d", "rep", "ts", "1", None));
    build_cluster(&objs, None)
}

/// Label or allocatable entries: (key, value).
type Labels<'a> = Vec<(&'a str, &'a str)>;

const STRATEGY: &str = "nvidia.com/gpu.sharing-strategy";
const REPLICAS: &str = "nvidia.com/gpu.replicas";
const COUNT: &str = "nvidia.com/gpu.count";

#[test]
fn contradictory_sharing_labels_make_the_node_unreadable_never_a_guess() {
    let ts = (STRATEGY, "time-slicing");
    let huge = "9".repeat(40);
    let long = "x".repeat(1 << 16);
    let cases: Vec<(&str, Labels, Labels)> = vec![
        (
            "no replicas label",
            vec![ts],
            vec![("nvidia.com/gpu", "32")],
        ),
        (
            "replicas not a number",
            vec![ts, (REPLICAS, "four")],
            vec![("nvidia.com/gpu", "32")],
        ),
        (
            "replicas negative",
            vec![ts, (REPLICAS, "-4")],
            vec![("nvidia.com/gpu", "32")],
        ),
        (
            "replicas a fraction",
            vec![ts, (REPLICAS, "2.5")],
            vec![("nvidia.com/gpu", "32")],
        ),
        (
            "replicas beyond u64",
            vec![ts, (REPLICAS, &huge)],
            vec![("nvidia.com/gpu", "32")],
        ),
        (
            "replicas huge text",
            vec![(REPLICAS, &long)],
            vec![("nvidia.com/gpu", "32")],
        ),
        (
            "replicas 1 while shared",
            vec![ts, (REPLICAS, "1")],
            vec![("nvidia.com/gpu", "32")],
        ),
        (
            "replicas 0 while shared",
            vec![ts, (REPLICAS, "0")],
            vec![("nvidia.com/gpu", "32")],
        ),
        (
            "strategy none, 4 replicas",
            vec![(STRATEGY, "none"), (REPLICAS, "4")],
            vec![("nvidia.com/gpu", "32")],
        ),
        (
            "unknown strategy",
            vec![(STRATEGY, "mig"), (REPLICAS, "4")],
            vec![("nvidia.com/gpu", "32")],
        ),
        (
            "not a multiple",
            vec![ts, (REPLICAS, "4")],
            vec![("nvidia.com/gpu", "30")],
        ),
        (
            "count disagrees",
            vec![ts, (REPLICAS, "4"), (COUNT, "4")],
            vec![("nvidia.com/gpu", "32")],
        ),
        (
            "count not a number",
            vec![ts, (REPLICAS, "4"), (COUNT, "8 GPUs")],
            vec![("nvidia.com/gpu", "32")],
        ),
        (
            "allocatable not a count",
            vec![ts, (REPLICAS, "4")],
            vec![("nvidia.com/gpu", "32.5")],
        ),
        (
            "renamed, no labels",
            vec![],
            vec![("nvidia.com/gpu.shared", "32")],
        ),
        (
            "whole and shared",
            vec![ts, (REPLICAS, "4")],
            vec![("nvidia.com/gpu", "4"), ("nvidia.com/gpu.shared", "16")],
        ),
    ];
    let policy = whole_gpu_policy();
    for (what, labels, alloc) in cases {
        let c = with_sharing_node(&labels, &alloc);
        let n = &c.nodes[c.node_index("ts").unwrap()];
        let why = n.inconsistent.as_deref().unwrap_or_default();
        assert!(
            why.starts_with("node inventory unreadable: ") && why.len() < 400,
            "{what}: {why:?}"
        );
        assert!(n.gpus.is_empty(), "{what}: no GPU guessed");
        assert!(
            matches!(
                gpu_of(&c, "tenant-d/rep"),
                GpuUse::Unknown(UnknownReason::NodeInventory(_))
            ),
            "{what}: {:?}",
            gpu_of(&c, "tenant-d/rep")
        );
        let p = plan(&c, &policy, None, &History::default());
        assert!(!p.moves.is_empty(), "{what}: the honest nodes still merge");
        for m in &p.moves {
            assert!(m.from_node != "ts" && m.to_node != "ts", "{what}: {m:?}");
        }
    }
    // Control: the same node, consistent, is read as 8 GPUs with one replica held.
    let c = with_sharing_node(
        &[ts, (REPLICAS, "4"), (COUNT, "8")],
        &[("nvidia.com/gpu", "32")],
    );
    let n = &c.nodes[c.node_index("ts").unwrap()];
    assert_eq!((n.scheme, n.gpus.len()), (Scheme::NvidiaSharing, 8));
    assert!(n.inconsistent.is_none());
    assert_eq!(gpu_of(&c, "tenant-d/rep"), &GpuUse::Devices(vec![(0, 250)]));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]
    /// Any label and allocatable values: never a panic, and a sharing node is either
    /// unreadable or read exactly (physical GPUs × replicas = the allocatable).
    #[test]
    fn random_sharing_labels_never_panic_and_never_guess(
        strategy in prop_oneof![Just("time-slicing".to_string()), Just("mps".to_string()), "\\PC{0,12}"],
        replicas in prop_oneof!["[0-9]{1,4}", "\\PC{0,8}"],
        count in prop_oneof!["[0-9]{1,3}", "\\PC{0,8}"],
        alloc in prop_oneof!["[0-9]{1,5}", "\\PC{0,8}"],
        renamed in any::<bool>(),
    ) {
        let res = if renamed { "nvidia.com/gpu.shared" } else { "nvidia.com/gpu" };
        let c = with_sharing_node(
            &[(STRATEGY, &strategy), (REPLICAS, &replicas), (COUNT, &count)],
            &[(res, &alloc)],
        );
        let n = &c.nodes[c.node_index("ts").unwrap()];
        if n.scheme == Scheme::NvidiaSharing && n.inconsistent.is_none() {
            let r: u64 = replicas.trim().parse().unwrap();
            let a = formats::quantity_to_count(&alloc).unwrap();
            prop_assert_eq!(n.gpus.len() as u64 * r, a);
            prop_assert_eq!(n.gpus.len() as u64, count.trim().parse::<u64>().unwrap());
        }
    }
}
