//! Every adapter on real-format records, through the snapshot loader, plus malformed
//! and spoofed records that must end up as unknown pods.
use gpu_defrag_core::frag;
use gpu_defrag_core::ingest::build_cluster;
use gpu_defrag_core::model::*;
use gpu_defrag_core::policy::Policy;
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
