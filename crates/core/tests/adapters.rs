//! Every adapter on real-format records, through the snapshot loader, plus malformed
//! and spoofed records that must end up as unknown pods.
use gpu_defrag_core::frag;
use gpu_defrag_core::ingest::build_cluster;
use gpu_defrag_core::model::*;
use gpu_defrag_core::policy::{Policy, TargetShape};
use gpu_defrag_core::snapshot;

fn cluster() -> Cluster {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/mixed.yaml"
    ))
    .unwrap();
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

#[test]
fn plain_gpus_are_counted_per_node() {
    let c = cluster();
    let n = node(&c, "plain-0");
    assert_eq!(
        (n.scheme, n.granularity),
        (Scheme::Plain, Granularity::Node)
    );
    assert_eq!(
        used(n).iter().filter(|u| **u == 1000).count(),
        3,
        "2 + 1 GPUs; the Succeeded pod does not count"
    );
    assert_eq!(pod(&c, "ml/train-a").gpu, GpuUse::Whole(2));
    assert_eq!(n.cpu_used, 8000);
}

#[test]
fn hami_json_register_and_shares() {
    let c = cluster();
    let n = node(&c, "hami-0");
    assert_eq!(
        (n.scheme, n.granularity),
        (Scheme::Hami, Granularity::Device)
    );
    // 20480/81920 = 250; 8192/81920 = 100 vs 30 cores = 300 → 300. Same GPU: 550.
    assert_eq!(used(n), vec![550, 0]);
    assert_eq!(pod(&c, "ml/hami-core").gpu, GpuUse::Devices(vec![(0, 300)]));
}

#[test]
fn a_record_naming_a_device_the_node_lacks_is_unknown_and_blocks_draining() {
    let c = cluster();
    let p = pod(&c, "tenant/hami-spoof");
    assert!(
        matches!(&p.gpu, GpuUse::Unknown(UnknownReason::UnknownDevice(_))),
        "{:?}",
        p.gpu
    );
    assert_eq!(node(&c, "hami-0").unknown_pods, 1);
}

#[test]
fn hami_legacy_register_and_missing_record() {
    let c = cluster();
    let n = node(&c, "hami-legacy");
    assert_eq!(used(n), vec![0, 500]);
    assert_eq!(
        pod(&c, "ml/legacy-norecord").gpu,
        GpuUse::Unknown(UnknownReason::MissingRecord)
    );
}

#[test]
fn koordinator_uses_the_device_object() {
    let c = cluster();
    let n = node(&c, "koord-0");
    assert_eq!((n.scheme, n.gpus.len()), (Scheme::Koordinator, 2));
    // max(50% memory, 40% core) = 500 on minor 1.
    assert_eq!(used(n), vec![0, 500]);
    assert_eq!(n.gpus[1].memory_mib, Some(81920));
}

#[test]
fn volcano_gpushare_divides_memory_by_card_count() {
    let c = cluster();
    let n = node(&c, "volcano-0");
    assert_eq!(used(n), vec![0, 0, 250, 0]);
}

#[test]
fn aliyun_gpushare_reads_the_index_annotations() {
    let c = cluster();
    assert_eq!(used(node(&c, "aliyun-0")), vec![0, 250]);
}

#[test]
fn kai_fractions_share_the_reserved_gpu() {
    let c = cluster();
    let n = node(&c, "kai-0");
    assert_eq!(used(n), vec![750, 0, 0, 0]);
    assert_eq!(pod(&c, "ml/kai-half").gpu, GpuUse::Devices(vec![(0, 500)]));
}

#[test]
fn mig_pools_are_reported_separately() {
    let c = cluster();
    let n = node(&c, "mig-0");
    assert!(n.gpus.is_empty());
    let one = n.mig.iter().find(|p| p.profile == "1g.10gb").unwrap();
    assert_eq!((one.capacity, one.used), (7, 2));
    let r = frag::report(&c, &Policy::default());
    assert!(r.mig.iter().any(|m| m.profile == "1g.10gb" && m.free == 5));
    assert!(
        !r.nodes.iter().any(|n| n.name == "mig-0"),
        "MIG-only nodes are not in the milli metric"
    );
}

#[test]
fn report_counts_unknown_and_pending() {
    let c = cluster();
    let r = frag::report(&c, &Policy::default());
    assert_eq!(r.unknown_pods, 2);
    assert_eq!(
        r.unknown_by_reason.get("record-names-unknown-device"),
        Some(&1)
    );
    assert_eq!(r.unknown_by_reason.get("missing-record"), Some(&1));
    assert_eq!(r.pending_unplaceable, 1, "the 8-GPU pod fits no node");
}

fn with_pod(extra: &str) -> Cluster {
    let base = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/mixed.yaml"
    ))
    .unwrap();
    build_cluster(&snapshot::parse(&format!("{base}{extra}")).unwrap(), None)
}

#[test]
fn records_that_overcommit_a_device_make_every_pod_on_it_unknown() {
    // A tenant claims 90% of GPU-aaaa, which two other pods already use (55%).
    let c = with_pod(
        r#"- apiVersion: v1
  kind: Pod
  metadata:
    name: greedy
    namespace: tenant
    annotations: {hami.io/vgpu-devices-allocated: "GPU-aaaa,NVIDIA,73728,0:;"}
  spec:
    nodeName: hami-0
    containers: [{name: c, resources: {limits: {nvidia.com/gpu: "1"}}}]
  status: {phase: Running}
"#,
    );
    let n = node(&c, "hami-0");
    assert!(n.inconsistent.is_some());
    for key in ["tenant/greedy", "ml/hami-mem", "ml/hami-core"] {
        assert!(
            matches!(
                pod(&c, key).gpu,
                GpuUse::Unknown(UnknownReason::Overcommitted(_))
            ),
            "{key}"
        );
    }
}

#[test]
fn malformed_records_never_panic_and_become_unknown() {
    for bad in [
        "GPU-aaaa,NVIDIA,notanumber,0:;",
        "",
        ";;;;",
        "GPU-aaaa,NVIDIA,-5,0:;",
        "GPU-aaaa:;",
    ] {
        let c = with_pod(&format!(
            r#"- apiVersion: v1
  kind: Pod
  metadata:
    name: bad
    namespace: tenant
    annotations: {{hami.io/vgpu-devices-allocated: "{bad}"}}
  spec:
    nodeName: hami-0
    containers: [{{name: c, resources: {{limits: {{nvidia.com/gpu: "1"}}}}}}]
  status: {{phase: Running}}
"#
        ));
        assert!(
            pod(&c, "tenant/bad").is_unknown(),
            "{bad:?} → {:?}",
            pod(&c, "tenant/bad").gpu
        );
    }
}

#[test]
fn a_record_disagreeing_with_the_request_is_unknown() {
    let c = with_pod(
        r#"- apiVersion: v1
  kind: Pod
  metadata:
    name: two-claimed
    namespace: tenant
    annotations: {hami.io/vgpu-devices-allocated: "GPU-aaaa,NVIDIA,1024,0:GPU-bbbb,NVIDIA,1024,0:;"}
  spec:
    nodeName: hami-0
    containers: [{name: c, resources: {limits: {nvidia.com/gpu: "1"}}}]
  status: {phase: Running}
"#,
    );
    assert!(matches!(
        pod(&c, "tenant/two-claimed").gpu,
        GpuUse::Unknown(UnknownReason::DisagreesWithRequest(_))
    ));
}

/// GPUs a HAMi node lists in `hami.io/device-cordon` receive no pod: read as unhealthy,
/// unless a run of this operator cordoned them (it is emptying them). Unreadable claims
/// claim nothing, so every listed GPU is then out.
#[test]
fn hami_cordoned_gpus_receive_no_pod_unless_a_run_cordoned_them() {
    let register = r#"[{"id":"GPU-a","index":0,"count":10,"devmem":81920,"devcore":100,"type":"NVIDIA-H100","numa":0,"mode":"hami-core","health":true},{"id":"GPU-b","index":1,"count":10,"devmem":81920,"devcore":100,"type":"NVIDIA-H100","numa":0,"mode":"hami-core","health":true},{"id":"GPU-c","index":2,"count":10,"devmem":81920,"devcore":100,"type":"NVIDIA-H100","numa":0,"mode":"hami-core","health":true}]"#;
    let healthy = |claims: &str| -> Vec<bool> {
        let text = format!(
            "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Node\n  metadata:\n    name: h\n    annotations:\n      hami.io/node-nvidia-register: '{register}'\n      hami.io/device-cordon: ' GPU-b, GPU-c,'\n      gpu-defrag.io/device-cordon: '{claims}'\n  status:\n    allocatable: {{cpu: \"64\", memory: 512Gi, pods: \"110\", nvidia.com/gpu: \"30\"}}\n    conditions: [{{type: Ready, status: \"True\"}}]\n"
        );
        let c = build_cluster(&snapshot::parse(&text).unwrap(), None);
        node(&c, "h").gpus.iter().map(|g| g.healthy).collect()
    };
    assert_eq!(healthy(r#"{"p":["GPU-c"]}"#), [true, false, true]);
    assert_eq!(healthy("{}"), [true, false, false]);
    assert_eq!(healthy("not json"), [true, false, false]);
}

// ---- NVIDIA device plugin sharing (time-slicing, MPS).

fn sharing_text() -> String {
    std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/nvidia-sharing.yaml"
    ))
    .unwrap()
}

fn sharing(extra: &str) -> Cluster {
    build_cluster(
        &snapshot::parse(&format!("{}{extra}", sharing_text())).unwrap(),
        None,
    )
}

fn shape(gpus: u32, milli: Milli) -> TargetShape {
    TargetShape::of_gpus(gpus, milli, 1.0)
}

/// Whether shape `m` fits node `n` as the metric sees it (its fragment is not all of its
/// idle milli, or it has nothing idle left over).
fn fits(n: &Node, m: &TargetShape) -> bool {
    let free = frag::free_of(n);
    let idle: u64 = free.iter().map(|f| u64::from(*f)).sum();
    let fragment = frag::node_fragment_for(n, &free, n.cpu_free(), n.mem_free(), m);
    fragment < idle || free.iter().filter(|f| **f >= m.milli_per_gpu).count() >= m.gpus as usize
}

fn bound(name: &str, node: &str, res: &str, k: &str) -> String {
    format!(
        r#"- apiVersion: v1
  kind: Pod
  metadata: {{name: {name}, namespace: tenant}}
  spec:
    nodeName: {node}
    containers: [{{name: c, resources: {{limits: {{{res}: "{k}"}}}}}}]
  status: {{phase: Running}}
"#
    )
}

#[test]
fn a_time_sliced_node_reports_its_physical_gpus_and_replicas_as_shares() {
    let c = sharing("");
    let n = node(&c, "ts-0");
    assert_eq!(
        (n.scheme, n.granularity, n.gpus.len()),
        (Scheme::NvidiaSharing, Granularity::Node, 8),
        "8 physical GPUs, not the 32 replicas"
    );
    assert_eq!(n.model.as_deref(), Some("NVIDIA-A100-SXM4-80GB-SHARED"));
    assert_eq!(n.gpus[0].memory_mib, Some(81920));
    // 4 replicas held (the Succeeded pod holds none), spread least-used GPU first.
    assert_eq!(used(n), vec![250, 250, 250, 250, 0, 0, 0, 0]);
    assert_eq!(n.free_milli(), 7000, "28 free replicas of 250");
    assert_eq!(pod(&c, "ml/ts-a").gpu, GpuUse::Devices(vec![(0, 250)]));
    assert_eq!(
        pod(&c, "ml/ts-c").gpu,
        GpuUse::Devices(vec![(2, 250), (3, 250)])
    );
    assert_eq!(
        pod(&c, "ml/ts-c").shape,
        Some(GpuShape {
            gpus: 2,
            milli: 250
        })
    );
    assert_eq!(pod(&c, "ml/ts-c").scheme, Some(Scheme::NvidiaSharing));
    assert_eq!(pod(&c, "ml/ts-done").gpu, GpuUse::None);
    assert!(n.inconsistent.is_none() && n.unknown_pods == 0);
    // GFD's labels of an unshared node (replicas 1, strategy none) leave it plain.
    let p = node(&c, "plain-0");
    assert_eq!((p.scheme, p.gpus.len()), (Scheme::Plain, 8));
}

#[test]
fn a_whole_gpu_shape_fits_a_time_sliced_node_only_where_no_replica_can_be() {
    let c = sharing("");
    let ts = node(&c, "ts-0");
    let free = node(&c, "ts-free");
    let eight = shape(8, 1000);
    assert!(
        !fits(ts, &eight),
        "4 replicas held: 8 whole GPUs do not fit"
    );
    assert!(fits(free, &eight), "every replica of every GPU free");
    assert!(fits(ts, &shape(4, 1000)), "4 GPUs surely untouched");
    assert!(!fits(ts, &shape(5, 1000)));
    assert!(fits(ts, &shape(8, 250)), "a replica on every GPU");
    // One replica held is enough to keep the 8-GPU shape out.
    let one = sharing(&bound("one", "ts-free", "nvidia.com/gpu", "1"));
    assert!(!fits(node(&one, "ts-free"), &eight));
    assert!(fits(node(&one, "ts-free"), &shape(7, 1000)));
    // The report: 8 GPUs, 7000 idle milli, all of it fragment for the 8-GPU shape.
    let policy = Policy {
        shapes: vec![eight],
        ..Policy::default()
    };
    let r = frag::report(&c, &policy);
    let line = r.nodes.iter().find(|n| n.name == "ts-0").unwrap();
    assert_eq!(
        (
            line.gpus,
            line.idle_milli,
            line.fragment_milli,
            line.fully_free_gpus
        ),
        (8, 7000, 7000, 4)
    );
    assert_eq!(line.scheme, Scheme::NvidiaSharing);
    let free_line = r.nodes.iter().find(|n| n.name == "ts-free").unwrap();
    assert_eq!((free_line.idle_milli, free_line.fragment_milli), (8000, 0));
    // For one-replica shapes nothing on the time-sliced node is fragment.
    let r = frag::report(
        &c,
        &Policy {
            shapes: vec![shape(1, 250)],
            ..Policy::default()
        },
    );
    let line = r.nodes.iter().find(|n| n.name == "ts-0").unwrap();
    assert_eq!(line.fragment_milli, 0);
}

#[test]
fn mps_replicas_are_shares_of_their_gpu() {
    let c = sharing("");
    let n = node(&c, "mps-0");
    assert_eq!((n.scheme, n.gpus.len()), (Scheme::NvidiaSharing, 2));
    // 2 GPUs × 2 replicas of 500: three held, least-used GPU first.
    assert_eq!(used(n), vec![1000, 500]);
    assert_eq!(pod(&c, "ml/mps-c").gpu, GpuUse::Devices(vec![(0, 500)]));
    assert_eq!(n.free_milli(), 500);
    // A fourth fills the node; a fifth is more than it has: every replica pod unknown.
    let full = sharing(&bound("d", "mps-0", "nvidia.com/gpu", "1"));
    assert_eq!(used(node(&full, "mps-0")), vec![1000, 1000]);
    let over = sharing(&format!(
        "{}{}",
        bound("d", "mps-0", "nvidia.com/gpu", "1"),
        bound("e", "mps-0", "nvidia.com/gpu", "1")
    ));
    let n = node(&over, "mps-0");
    assert!(
        n.inconsistent
            .as_deref()
            .unwrap()
            .contains("hold 5 GPU replicas, node has 4")
    );
    assert_eq!(n.unknown_pods, 5);
    assert!(matches!(
        pod(&over, "ml/mps-a").gpu,
        GpuUse::Unknown(UnknownReason::Overcommitted(_))
    ));
}

#[test]
fn renamed_replicas_are_read_from_nvidia_com_gpu_shared() {
    let c = sharing(&format!(
        "{}{}{}",
        bound("whole", "ts-renamed", "nvidia.com/gpu", "1"),
        bound("shared-on-plain", "plain-0", "nvidia.com/gpu.shared", "1"),
        r#"- apiVersion: v1
  kind: Pod
  metadata: {name: waiting, namespace: tenant}
  spec:
    containers: [{name: c, resources: {limits: {nvidia.com/gpu.shared: "1"}}}]
  status: {phase: Pending}
"#
    ));
    let n = node(&c, "ts-renamed");
    assert_eq!((n.scheme, n.gpus.len()), (Scheme::NvidiaSharing, 2));
    assert_eq!(
        n.model.as_deref(),
        Some("NVIDIA-L4"),
        "no -SHARED when renamed"
    );
    assert_eq!(used(n), vec![250, 0]);
    assert_eq!(pod(&c, "ml/shared-a").gpu, GpuUse::Devices(vec![(0, 250)]));
    // nvidia.com/gpu on a node that advertises .shared, .shared on a plain node: neither
    // could have been admitted as read.
    for key in ["tenant/whole", "tenant/shared-on-plain"] {
        assert!(
            matches!(
                pod(&c, key).gpu,
                GpuUse::Unknown(UnknownReason::DisagreesWithRequest(_))
            ),
            "{key}: {:?}",
            pod(&c, key).gpu
        );
    }
    // A pending .shared pod: its replica size is its future node's.
    let w = pod(&c, "tenant/waiting");
    assert_eq!((w.shape, w.scheme), (None, Some(Scheme::NvidiaSharing)));
}

#[test]
fn the_planner_never_moves_a_replica_nor_places_a_pod_on_a_time_sliced_node() {
    // Two plain nodes with one 1-GPU pod each: the control case merges them.
    let plain2 = r#"- apiVersion: v1
  kind: Node
  metadata:
    name: plain-1
    labels: {nvidia.com/gpu.product: NVIDIA-A100-SXM4-80GB}
  status:
    allocatable: {cpu: "64", memory: 512Gi, pods: "110", nvidia.com/gpu: "8"}
    conditions: [{type: Ready, status: "True"}]
- apiVersion: v1
  kind: Pod
  metadata: {name: plain-b, namespace: ml, ownerReferences: [{apiVersion: apps/v1, kind: ReplicaSet, name: plain-b, uid: u5, controller: true}]}
  spec:
    nodeName: plain-1
    containers: [{name: c, resources: {limits: {nvidia.com/gpu: "1"}, requests: {cpu: "1", memory: 1Gi}}}]
  status: {phase: Running, conditions: [{type: Ready, status: "True"}]}
"#;
    let c = sharing(plain2);
    for shapes in [vec![shape(8, 1000)], vec![shape(1, 250)], vec![]] {
        let policy = Policy {
            shapes,
            evict_single_replicas: true,
            ..Policy::default()
        };
        let p = gpu_defrag_core::plan::plan(
            &c,
            &policy,
            None,
            &gpu_defrag_core::plan::History::default(),
        );
        for m in &p.moves {
            for n in [&m.from_node, &m.to_node] {
                assert_eq!(
                    node(&c, n).scheme,
                    Scheme::Plain,
                    "{m:?}: a replica's GPU is not recorded, its move not predictable"
                );
            }
        }
        if policy.shapes.first().is_some_and(|s| s.gpus == 8) {
            assert!(
                !p.moves.is_empty(),
                "control: the plain pods are merged, {:?}",
                p.skipped
            );
        }
    }
}
