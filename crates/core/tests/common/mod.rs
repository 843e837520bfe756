//! Fixtures shared by the integration tests (`safety.rs`, `gangs.rs`): Kubernetes objects
//! as JSON, a [`World`] of them built through `ingest::build_cluster`, and plan helpers.
//! Each test binary uses some of them.
#![allow(dead_code)]

use chrono::{DateTime, SecondsFormat, Utc};
use gpu_defrag_core::ingest::{Objects, build_cluster};
use gpu_defrag_core::model::*;
use gpu_defrag_core::plan::{History, Plan, plan};
use gpu_defrag_core::policy::{Policy, TargetShape};
use gpu_defrag_core::workload::{ControllerKind, ControllerObject, Listed};
use serde_json::{Value, json};

// ---- Clock -----------------------------------------------------------------------------

/// The instant every cluster is built and planned at.
pub fn now() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2025-06-02T12:00:00Z")
        .unwrap()
        .with_timezone(&Utc)
}

/// `minutes` before [`now`], as a Kubernetes timestamp.
pub fn ago(minutes: i64) -> String {
    (now() - chrono::Duration::minutes(minutes)).to_rfc3339_opts(SecondsFormat::Secs, true)
}

pub const HOUR: i64 = 60;
pub const MONTH: i64 = 30 * 24 * 60;
/// The hash of every ReplicaSet (`<deployment>-<hash>`, label `pod-template-hash`).
pub const HASH: &str = "5f7c9d8b4";

pub fn from_json<T: serde::de::DeserializeOwned>(v: Value) -> T {
    let text = v.to_string();
    serde_json::from_value(v).unwrap_or_else(|e| panic!("{e}: {text}"))
}

// ---- Object fixtures -------------------------------------------------------------------

/// A plain `nvidia.com/gpu` node, Ready for a month.
pub fn gpu_node(name: &str, gpus: u32) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "creationTimestamp": ago(MONTH),
            "labels": {"kubernetes.io/hostname": name, "pool": "gpu"}},
        "status": {
            "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110",
                "nvidia.com/gpu": gpus.to_string()},
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": ago(MONTH)}]
        }
    })
}

/// A pod (JSON) under construction: Running, Ready, started an hour ago, unbound.
#[derive(Clone)]
pub struct PodJson(pub Value);

impl PodJson {
    /// Requests `gpus` whole GPUs (none at all when 0), 4 CPUs and 16 GiB.
    pub fn new(ns: &str, name: &str, gpus: u32) -> Self {
        let limits = if gpus == 0 {
            json!({})
        } else {
            json!({"nvidia.com/gpu": gpus.to_string()})
        };
        PodJson(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"namespace": ns, "name": name, "uid": format!("uid-{ns}-{name}"),
                "creationTimestamp": ago(HOUR), "labels": {}, "annotations": {}},
            "spec": {"schedulerName": "gpu-binpack",
                "containers": [{"name": "main", "image": "registry.example/app:1",
                "resources": {"limits": limits, "requests": {"cpu": "4", "memory": "16Gi"}}}]},
            "status": {"phase": "Running", "startTime": ago(HOUR),
                "conditions": [{"type": "Ready", "status": "True"}]}
        }))
    }
    pub fn key(&self) -> String {
        format!(
            "{}/{}",
            self.0["metadata"]["namespace"].as_str().unwrap(),
            self.0["metadata"]["name"].as_str().unwrap()
        )
    }
    pub fn renamed(mut self, name: &str) -> Self {
        self.0["metadata"]["name"] = json!(name);
        self.0["metadata"]["uid"] = json!(format!("uid-{name}"));
        self
    }
    pub fn on(mut self, node: &str) -> Self {
        self.0["spec"]["nodeName"] = json!(node);
        self
    }
    /// The controller owner reference.
    pub fn owner(mut self, api_version: &str, kind: &str, name: &str) -> Self {
        self.0["metadata"]["ownerReferences"] = json!([{"apiVersion": api_version,
            "kind": kind, "name": name, "uid": format!("uid-{name}"), "controller": true}]);
        self
    }
    pub fn label(mut self, k: &str, v: &str) -> Self {
        self.0["metadata"]["labels"][k] = json!(v);
        self
    }
    pub fn annotate(mut self, k: &str, v: &str) -> Self {
        self.0["metadata"]["annotations"][k] = json!(v);
        self
    }
    pub fn volume(mut self, v: Value) -> Self {
        match self.0["spec"]["volumes"].as_array_mut() {
            Some(list) => list.push(v),
            None => self.0["spec"]["volumes"] = json!([v]),
        }
        self
    }
    pub fn spec(mut self, k: &str, v: Value) -> Self {
        self.0["spec"][k] = v;
        self
    }
    pub fn not_ready(mut self) -> Self {
        self.0["status"]["conditions"] = json!([{"type": "Ready", "status": "False"}]);
        self
    }
    pub fn started(mut self, minutes_ago: i64) -> Self {
        self.0["status"]["startTime"] = json!(ago(minutes_ago));
        self
    }
    /// `spec.schedulerName`; `None` leaves the field out (the API server's default).
    pub fn scheduler(mut self, name: Option<&str>) -> Self {
        match name {
            Some(n) => self.0["spec"]["schedulerName"] = json!(n),
            None => {
                if let Some(spec) = self.0["spec"].as_object_mut() {
                    spec.remove("schedulerName");
                }
            }
        }
        self
    }
    pub fn created(mut self, minutes_ago: i64) -> Self {
        self.0["metadata"]["creationTimestamp"] = json!(ago(minutes_ago));
        self
    }
    /// Waiting for a node: no nodeName, phase Pending, not scheduled.
    pub fn pending(mut self) -> Self {
        if let Some(spec) = self.0["spec"].as_object_mut() {
            spec.remove("nodeName");
        }
        self.0["status"] = json!({"phase": "Pending", "conditions": [{"type": "PodScheduled",
            "status": "False", "reason": "Unschedulable"}]});
        self
    }
}

/// Objects under construction, with the skip code each risky pod must get.
pub struct World {
    pub objs: Objects,
    pub expected: Vec<(String, &'static str)>,
}

impl World {
    /// Every owner kind, namespace and Volcano PodGroup listed in full; KAI and Kubernetes
    /// (`scheduling.k8s.io`) PodGroups not readable (the operator may lack the CRD, the
    /// API or the permission).
    pub fn new() -> Self {
        let mut w = World {
            objs: Objects {
                listed: Listed {
                    replica_sets: true,
                    stateful_sets: true,
                    jobs: true,
                    namespaces: true,
                    volcano_pod_groups: true,
                    kai_pod_groups: false,
                    scheduling_pod_groups: false,
                    device_taint_rules: false,
                },
                ..Default::default()
            },
            expected: Vec::new(),
        };
        for ns in ["ml", "infra", "other", "kai-resource-reservation"] {
            w.namespace(ns, false);
        }
        w
    }

    pub fn node(&mut self, v: Value) {
        self.objs.nodes.push(from_json(v));
    }

    pub fn pod(&mut self, p: PodJson) -> String {
        let key = p.key();
        self.objs.pods.push(from_json(p.0));
        key
    }

    pub fn controller(&mut self, kind: ControllerKind, meta: Value) {
        let metadata = from_json(meta);
        if !self
            .objs
            .controllers
            .iter()
            .any(|c| c.kind == kind && c.metadata == metadata)
        {
            self.objs
                .controllers
                .push(ControllerObject { kind, metadata });
        }
    }

    /// A pod of Deployment `deployment` (through its ReplicaSet `<deployment>-<hash>`,
    /// which is added to the owner objects), labelled `app=<deployment>`.
    pub fn deployment_pod(&mut self, ns: &str, deployment: &str, name: &str, gpus: u32) -> PodJson {
        let rs = format!("{deployment}-{HASH}");
        self.controller(
            ControllerKind::ReplicaSet,
            json!({"namespace": ns, "name": rs, "uid": format!("uid-{rs}"),
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment",
                    "name": deployment, "uid": format!("uid-{deployment}"), "controller": true}]}),
        );
        PodJson::new(ns, name, gpus)
            .owner("apps/v1", "ReplicaSet", &rs)
            .label("app", deployment)
            .label("pod-template-hash", HASH)
    }

    /// A StatefulSet, with its own controller owner when it has one.
    pub fn stateful_set(&mut self, ns: &str, name: &str, owner: Option<(&str, &str, &str)>) {
        let mut meta = json!({"namespace": ns, "name": name, "uid": format!("uid-{name}")});
        if let Some((api, kind, up)) = owner {
            meta["ownerReferences"] = json!([{"apiVersion": api, "kind": kind, "name": up,
                "uid": format!("uid-{up}"), "controller": true}]);
        }
        self.controller(ControllerKind::StatefulSet, meta);
    }

    pub fn job(&mut self, ns: &str, name: &str) {
        self.controller(
            ControllerKind::Job,
            json!({"namespace": ns, "name": name, "uid": format!("uid-{name}")}),
        );
    }

    pub fn namespace(&mut self, name: &str, opted_out: bool) {
        let mut meta = json!({"name": name});
        if opted_out {
            meta["annotations"] = json!({"gpu-defrag.io/do-not-disrupt": "true"});
        }
        self.objs.namespaces.push(from_json(meta));
    }

    /// A PDB selecting `app=<app>`.
    pub fn pdb(&mut self, ns: &str, app: &str, allowed: i32, generation: i64, observed: i64) {
        self.objs.pdbs.push(from_json(json!({
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"namespace": ns, "name": app, "generation": generation},
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": app}}},
            "status": {"disruptionsAllowed": allowed, "observedGeneration": observed,
                "currentHealthy": 1, "desiredHealthy": 0, "expectedPods": 1}
        })));
    }

    /// `src-<id>` (8 GPUs) holding `pod`, and `recv-<id>` (8 GPUs, 4 held by an unowned
    /// filler pod): the receiver has room for the pod. Returns the pod's key.
    pub fn pair(&mut self, id: &str, pod: PodJson) -> String {
        let (src, recv) = (format!("src-{id}"), format!("recv-{id}"));
        self.node(gpu_node(&src, 8));
        self.node(gpu_node(&recv, 8));
        self.pod(
            PodJson::new("infra", &format!("filler-{id}"), 4)
                .label("app", "filler")
                .on(&recv),
        );
        self.pod(pod.on(&src))
    }

    /// [`World::pair`], plus a second Ready replica (the same pod renamed `<name>-b`) on
    /// the receiver, so that the workload rules alone would let the first one move.
    pub fn pair_with_twin(&mut self, id: &str, pod: PodJson) -> String {
        let name = pod.0["metadata"]["name"].as_str().unwrap().to_string();
        let twin = pod.clone().renamed(&format!("{name}-b"));
        let key = self.pair(id, pod);
        self.pod(twin.on(&format!("recv-{id}")));
        key
    }

    /// A risky case: `pod` on `src-<id>`, expected to be skipped with `code`.
    pub fn risky(&mut self, id: &str, code: &'static str, pod: PodJson, twin: bool) {
        let key = if twin {
            self.pair_with_twin(id, pod)
        } else {
            self.pair(id, pod)
        };
        self.expected.push((key, code));
    }

    pub fn build(&self) -> Cluster {
        build_cluster(&self.objs, Some(now()))
    }
}

// ---- Policies and plan helpers ------------------------------------------------------------

pub fn shape(gpus: u32) -> TargetShape {
    TargetShape::of_gpus(gpus, 1000, 1.0)
}

/// The default policy with an explicit 8-GPU target shape: an 8-GPU node with 7 GPUs
/// free is fragmentation, an empty one is not.
pub fn eight_gpu_policy() -> Policy {
    Policy {
        shapes: vec![shape(8)],
        ..Policy::default()
    }
}

pub fn run(c: &Cluster, policy: &Policy) -> Plan {
    plan(c, policy, Some(now()), &History::default())
}

pub fn moved(p: &Plan, key: &str) -> bool {
    p.moves.iter().any(|m| m.pod == key)
}

pub fn code_of(p: &Plan, key: &str) -> Option<&'static str> {
    p.skipped_pods.iter().find(|s| s.pod == key).map(|s| s.code)
}

/// `key` is skipped with exactly `code`, counted under it, and not moved.
pub fn assert_skipped(p: &Plan, key: &str, code: &str) {
    assert_eq!(
        code_of(p, key),
        Some(code),
        "{key}: skipped pods {:#?}",
        p.skipped_pods
    );
    assert!(
        p.skipped.get(code).copied().unwrap_or(0) >= 1,
        "{key}: {code} not counted in {:?}",
        p.skipped
    );
    assert!(!moved(p, key), "{key} is moved: {:#?}", p.moves);
}

/// `key` is moved off `src-<id>` and not reported as skipped.
pub fn assert_moved(p: &Plan, key: &str) {
    let Some(m) = p.moves.iter().find(|m| m.pod == key) else {
        panic!(
            "{key} not moved; moves {:#?}, skipped {:#?}",
            p.moves, p.skipped_pods
        );
    };
    assert!(m.from_node.starts_with("src-"), "{m:?}");
    assert_eq!(code_of(p, key), None, "{key}");
}

pub fn pod<'a>(c: &'a Cluster, key: &str) -> &'a Pod {
    c.pods
        .iter()
        .find(|p| p.key() == key)
        .unwrap_or_else(|| panic!("{key} not in the cluster"))
}

/// A model node (no Kubernetes object): `gpus` healthy H100s, HAMi at device granularity,
/// plain at node granularity; 64 CPUs, 512 GiB, 110 pods; labelled with its hostname.
pub fn model_node(
    name: &str,
    gpus: usize,
    granularity: gpu_defrag_core::model::Granularity,
) -> gpu_defrag_core::model::Node {
    use gpu_defrag_core::model::*;
    Node {
        name: name.into(),
        labels: std::collections::BTreeMap::from([(
            "kubernetes.io/hostname".to_string(),
            name.to_string(),
        )]),
        taints: vec![],
        ready: true,
        unschedulable: false,
        model: Some("H100".into()),
        scheme: if granularity == Granularity::Device {
            Scheme::Hami
        } else {
            Scheme::Plain
        },
        granularity,
        gpus: (0..gpus)
            .map(|g| Gpu {
                key: g.to_string(),
                used: 0,
                healthy: true,
                memory_mib: Some(81920),
            })
            .collect(),
        cpu_alloc: 64_000,
        mem_alloc: 512 << 30,
        pods_alloc: 110,
        cpu_used: 0,
        mem_used: 0,
        pods_used: 0,
        mig: vec![],
        unknown_pods: 0,
        inconsistent: None,
        ready_since: None,
        starting: None,
        dra: Vec::new(),
        extra_alloc: Vec::new(),
        extra_used: Vec::new(),
    }
}
