//! A pod as the model and the executor read it: the fields of a Kubernetes `Pod` that
//! building the [`Cluster`](crate::model::Cluster) and moving a pod need, and nothing else.
//!
//! A watch cache holds one of these per pod instead of the whole object: a Kubernetes
//! `Pod` is about 2.4 KiB before any field is set and 2.3 KiB more per container (each
//! volume 3.3 KiB), so at 200,000 pods the objects alone take gigabytes. The projection is
//! made once per watch event; the model built from it is the one the whole object gives
//! (`ingest` builds every model, snapshots included, through it).
use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1 as corev1;

pub use crate::adapters::Requests;
use crate::dra::PodClaims;
use crate::model::{
    Constraints, HostPort, LabelSelector, NodeSelectorRequirement, Owner, Phase, PodAffinityTerm,
    SpreadConstraint, TermNamespaces, Toleration,
};
use crate::workload;

/// The annotation `kubectl apply` keeps the whole last applied object in: never read.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// A pod, projected to what the model and the executor read.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CompactPod {
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// `metadata.uid`.
    pub uid: String,
    /// `metadata.resourceVersion`.
    pub resource_version: Option<String>,
    /// `metadata.creationTimestamp`.
    pub created: Option<DateTime<Utc>>,
    /// `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    /// `metadata.labels`.
    pub labels: BTreeMap<String, String>,
    /// `metadata.annotations`, but `kubectl apply`'s copy of the object.
    pub annotations: BTreeMap<String, String>,
    /// The controller among `metadata.ownerReferences` (its API group, kind and name).
    pub controller: Option<Owner>,
    /// `spec.nodeName`.
    pub node_name: Option<String>,
    /// `spec.schedulerName`.
    pub scheduler_name: Option<String>,
    /// `spec.priority`.
    pub priority: Option<i32>,
    /// `spec.priorityClassName`.
    pub priority_class_name: Option<String>,
    /// `spec.schedulingGroup.podGroupName`: the Kubernetes PodGroup (`scheduling.k8s.io`)
    /// the pod belongs to.
    pub scheduling_group: Option<String>,
    /// The containers' resource requests (and limits), read.
    pub requests: Requests,
    /// A volume holds data on the node: a `hostPath` or a disk-backed `emptyDir` (a
    /// memory-backed one, `/dev/shm` or hugepages, holds nothing that outlives the
    /// container).
    pub local_storage: bool,
    /// A `persistentVolumeClaim` volume.
    pub pvc: bool,
    /// A generic `ephemeral` volume.
    pub ephemeral_volume: bool,
    /// What the scheduler's filters read beyond GPUs, CPU, memory and node rules (other
    /// resources, host ports, required inter-pod (anti-)affinity, `DoNotSchedule` spread).
    pub constraints: Option<Box<Constraints>>,
    /// Carries the scheduling gate of landing control ([`LANDING_GATE`]).
    pub landing_gated: bool,
    /// `spec.resourceClaims` and their status (Dynamic Resource Allocation).
    pub claims: PodClaims,
    /// `spec.nodeSelector`.
    pub node_selector: BTreeMap<String, String>,
    /// The terms of the required node affinity.
    pub affinity: Vec<Vec<NodeSelectorRequirement>>,
    /// `spec.tolerations`.
    pub tolerations: Vec<Toleration>,
    /// `status.phase`.
    pub phase: Phase,
    /// Its `Ready` condition is `True`.
    pub ready: bool,
    /// `status.startTime`.
    pub started: Option<DateTime<Utc>>,
    /// Since when the scheduler has found no node for it: the last transition of its
    /// `PodScheduled` condition, when that is `False` with reason `Unschedulable`.
    pub unschedulable_since: Option<DateTime<Utc>>,
    /// `status.nominatedNodeName`.
    pub nominated_node: Option<String>,
}

/// A Kubernetes time as chrono's.
pub(crate) fn to_chrono(
    t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
) -> Option<DateTime<Utc>> {
    let ts = t.0;
    DateTime::from_timestamp(
        ts.as_second(),
        u32::try_from(ts.subsec_nanosecond()).unwrap_or(0),
    )
}

impl CompactPod {
    /// The projection of a Kubernetes pod.
    pub fn of(p: &corev1::Pod) -> CompactPod {
        let meta = &p.metadata;
        let spec = p.spec.as_ref();
        let status = p.status.as_ref();
        let volumes = || spec.into_iter().flat_map(|s| s.volumes.iter().flatten());
        CompactPod {
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            uid: meta.uid.clone().unwrap_or_default(),
            resource_version: meta.resource_version.clone(),
            created: meta.creation_timestamp.as_ref().and_then(to_chrono),
            deleting: meta.deletion_timestamp.is_some(),
            labels: meta.labels.clone().unwrap_or_default(),
            annotations: meta
                .annotations
                .iter()
                .flatten()
                .filter(|(k, _)| k.as_str() != LAST_APPLIED)
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            controller: meta
                .owner_references
                .iter()
                .flatten()
                .find(|o| o.controller == Some(true))
                .map(|o| Owner {
                    group: workload::api_group(&o.api_version),
                    kind: o.kind.clone(),
                    name: o.name.clone(),
                }),
            node_name: spec.and_then(|s| s.node_name.clone()),
            scheduler_name: spec.and_then(|s| s.scheduler_name.clone()),
            priority: spec.and_then(|s| s.priority),
            priority_class_name: spec.and_then(|s| s.priority_class_name.clone()),
            scheduling_group: spec
                .and_then(|s| s.scheduling_group.as_ref())
                .and_then(|g| g.pod_group_name.clone()),
            requests: spec.map(Requests::of).unwrap_or_default(),
            local_storage: volumes().any(|v| {
                v.host_path.is_some()
                    || v.empty_dir.as_ref().is_some_and(|e| {
                        e.medium
                            .as_deref()
                            .is_none_or(|m| m != "Memory" && !m.starts_with("HugePages"))
                    })
            }),
            pvc: volumes().any(|v| v.persistent_volume_claim.is_some()),
            ephemeral_volume: volumes().any(|v| v.ephemeral.is_some()),
            constraints: spec.and_then(|s| constraints_of(meta, s)),
            landing_gated: spec
                .and_then(|s| s.scheduling_gates.as_ref())
                .is_some_and(|g| g.iter().any(|g| g.name == LANDING_GATE)),
            claims: PodClaims::of(p),
            node_selector: spec
                .and_then(|s| s.node_selector.clone())
                .unwrap_or_default(),
            affinity: spec.map(affinity_of).unwrap_or_default(),
            tolerations: spec
                .into_iter()
                .flat_map(|s| s.tolerations.iter().flatten())
                .map(|t| Toleration {
                    key: t.key.clone().unwrap_or_default(),
                    operator: t.operator.clone().unwrap_or_else(|| "Equal".into()),
                    value: t.value.clone().unwrap_or_default(),
                    effect: t.effect.clone().unwrap_or_default(),
                })
                .collect(),
            phase: match status.and_then(|s| s.phase.as_deref()) {
                Some("Pending") => Phase::Pending,
                Some("Running") => Phase::Running,
                Some("Succeeded") => Phase::Succeeded,
                Some("Failed") => Phase::Failed,
                _ => Phase::Unknown,
            },
            ready: status
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True")),
            started: status
                .and_then(|s| s.start_time.as_ref())
                .and_then(to_chrono),
            unschedulable_since: status
                .and_then(|s| s.conditions.as_ref())
                .and_then(|cs| {
                    cs.iter().find(|c| {
                        c.type_ == "PodScheduled"
                            && c.status == "False"
                            && c.reason.as_deref() == Some("Unschedulable")
                    })
                })
                .and_then(|c| c.last_transition_time.as_ref())
                .and_then(to_chrono),
            nominated_node: status
                .and_then(|s| s.nominated_node_name.clone())
                .filter(|n| !n.is_empty()),
        }
    }

    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// `(kind, name)` of the pod's controller.
    pub fn controller_of(&self) -> Option<(String, String)> {
        self.controller
            .as_ref()
            .map(|o| (o.kind.clone(), o.name.clone()))
    }

    /// A reference to the pod, for events.
    pub fn object_reference(&self) -> corev1::ObjectReference {
        corev1::ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            namespace: Some(self.namespace.clone()),
            name: Some(self.name.clone()),
            uid: Some(self.uid.clone()).filter(|u| !u.is_empty()),
            resource_version: self.resource_version.clone(),
            ..Default::default()
        }
    }
}

/// Converts a Kubernetes label selector.
pub fn label_selector(
    sel: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
) -> LabelSelector {
    LabelSelector {
        match_labels: sel.match_labels.clone().unwrap_or_default(),
        match_expressions: sel
            .match_expressions
            .iter()
            .flatten()
            .map(|e| {
                (
                    e.key.clone(),
                    e.operator.clone(),
                    e.values.clone().unwrap_or_default(),
                )
            })
            .collect(),
    }
}

/// The scheduling gate landing control holds a replacement with until it is nominated.
pub const LANDING_GATE: &str = "gpu-defrag.io/landing";

/// A pod's constraints beyond GPUs, CPU, memory and node rules, as kube-scheduler's
/// NodeResourcesFit (other resources), NodePorts, InterPodAffinity and PodTopologySpread
/// read them; None when it has none.
fn constraints_of(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    spec: &corev1::PodSpec,
) -> Option<Box<Constraints>> {
    let ns = meta.namespace.as_deref().unwrap_or_default();
    let empty = BTreeMap::new();
    let labels = meta.labels.as_ref().unwrap_or(&empty);
    let mut c = Constraints {
        resources: other_requests(spec),
        ..Constraints::default()
    };
    c.host_ports = host_ports(spec);
    let a = spec.affinity.as_ref();
    let mut unreadable: Vec<String> = Vec::new();
    let mut terms = |list: Option<&Vec<corev1::PodAffinityTerm>>, what: &str| {
        let mut out = Vec::new();
        for t in list.into_iter().flatten() {
            let t = affinity_term(t, ns, labels);
            if t.namespaces == TermNamespaces::Unread {
                unreadable.push(format!(
                    "{what}: a namespaceSelector (namespace labels are not read)"
                ));
            }
            out.push(t);
        }
        out
    };
    c.affinity = terms(
        a.and_then(|a| a.pod_affinity.as_ref()).and_then(|x| {
            x.required_during_scheduling_ignored_during_execution
                .as_ref()
        }),
        "pod affinity",
    );
    c.anti_affinity = terms(
        a.and_then(|a| a.pod_anti_affinity.as_ref()).and_then(|x| {
            x.required_during_scheduling_ignored_during_execution
                .as_ref()
        }),
        "pod anti-affinity",
    );
    for t in spec.topology_spread_constraints.iter().flatten() {
        match spread_constraint(t, labels) {
            Ok(Some(sc)) => c.spread.push(sc),
            Ok(None) => {}
            Err(why) => unreadable.push(why),
        }
    }
    if !unreadable.is_empty() {
        c.unreadable = Some(unreadable.join("; "));
    }
    (c != Constraints::default()).then(|| Box::new(c))
}

/// The host ports a pod holds while it runs: its app containers' and its sidecars'
/// (restartable init containers').
fn host_ports(spec: &corev1::PodSpec) -> Vec<HostPort> {
    let mut out = Vec::new();
    // The app containers' and the sidecars' (restartable init containers): a plain init
    // container's ports are not held while the pod runs (kube-scheduler's NodePorts).
    let sidecars = spec
        .init_containers
        .iter()
        .flatten()
        .filter(|c| c.restart_policy.as_deref() == Some("Always"));
    for ctr in spec.containers.iter().chain(sidecars) {
        for port in ctr.ports.iter().flatten() {
            if let Some(hp) = port.host_port.filter(|p| *p > 0) {
                out.push(HostPort {
                    protocol: port.protocol.clone().unwrap_or_else(|| "TCP".into()),
                    ip: port
                        .host_ip
                        .clone()
                        .filter(|i| !i.is_empty())
                        .unwrap_or_else(|| "0.0.0.0".into()),
                    port: hp,
                });
            }
        }
    }
    out
}

/// One topology spread constraint of a pod with `labels`, `matchLabelKeys` merged into its
/// selector: `None` for a `ScheduleAnyway` one (the scheduler only scores it), an error
/// saying what cannot be read for one the model cannot honour.
fn spread_constraint(
    t: &corev1::TopologySpreadConstraint,
    labels: &BTreeMap<String, String>,
) -> Result<Option<SpreadConstraint>, String> {
    if t.when_unsatisfiable == "ScheduleAnyway" {
        return Ok(None);
    }
    if t.when_unsatisfiable != "DoNotSchedule" {
        return Err(format!(
            "topology spread whenUnsatisfiable {:?}",
            t.when_unsatisfiable
        ));
    }
    let (Ok(max_skew), Ok(min_domains)) = (
        u32::try_from(t.max_skew),
        t.min_domains.map(u32::try_from).transpose(),
    ) else {
        return Err("topology spread: a negative maxSkew or minDomains".into());
    };
    let honor_node_affinity = match t.node_affinity_policy.as_deref() {
        None | Some("Honor") => true,
        Some("Ignore") => false,
        Some(x) => return Err(format!("topology spread nodeAffinityPolicy {x:?}")),
    };
    let honor_taints = match t.node_taints_policy.as_deref() {
        None | Some("Ignore") => false,
        Some("Honor") => true,
        Some(x) => return Err(format!("topology spread nodeTaintsPolicy {x:?}")),
    };
    let selector = t.label_selector.as_ref().map(|s| {
        let mut sel = label_selector(s);
        for k in t.match_label_keys.iter().flatten() {
            if let Some(v) = labels.get(k) {
                sel.match_expressions
                    .push((k.clone(), "In".into(), vec![v.clone()]));
            }
        }
        sel
    });
    Ok(Some(SpreadConstraint {
        max_skew,
        topology_key: t.topology_key.clone(),
        selector,
        min_domains,
        honor_node_affinity,
        honor_taints,
    }))
}

/// One required pod (anti-)affinity term of a pod of namespace `ns` with `labels`:
/// `matchLabelKeys` and `mismatchLabelKeys` merged into its selector, its namespaces
/// resolved (a `namespaceSelector` other than the empty one needs the namespaces' labels,
/// which the model does not read: [`TermNamespaces::Unread`]).
fn affinity_term(
    t: &corev1::PodAffinityTerm,
    ns: &str,
    labels: &BTreeMap<String, String>,
) -> PodAffinityTerm {
    let selector = t.label_selector.as_ref().map(|s| {
        let mut sel: LabelSelector = label_selector(s);
        for (keys, op) in [
            (&t.match_label_keys, "In"),
            (&t.mismatch_label_keys, "NotIn"),
        ] {
            for k in keys.iter().flatten() {
                if let Some(v) = labels.get(k) {
                    sel.match_expressions
                        .push((k.clone(), op.into(), vec![v.clone()]));
                }
            }
        }
        sel
    });
    let listed: Vec<String> = t.namespaces.clone().unwrap_or_default();
    let namespaces = match &t.namespace_selector {
        Some(sel)
            if sel.match_labels.as_ref().is_none_or(|m| m.is_empty())
                && sel.match_expressions.as_ref().is_none_or(|e| e.is_empty()) =>
        {
            TermNamespaces::All
        }
        Some(_) => TermNamespaces::Unread,
        None if listed.is_empty() => TermNamespaces::List(vec![ns.to_string()]),
        None => TermNamespaces::List(listed),
    };
    PodAffinityTerm {
        selector,
        namespaces,
        topology_key: t.topology_key.clone(),
    }
}

/// The pod's effective requests of resources other than CPU, memory and the GPU resources
/// the adapters read, in milli-units by name: the larger of the app containers' sum (with
/// the sidecars, restartable init containers) and each init container's need at its
/// turn, plus `spec.overhead` (kube-scheduler's rule). Unreadable quantities are left out
/// here: the pod's allocation is unknown then (see `Requests`).
fn other_requests(spec: &corev1::PodSpec) -> Vec<(String, u64)> {
    type Res = BTreeMap<String, u128>;
    fn of(c: &corev1::Container) -> Res {
        let mut out = Res::new();
        let Some(r) = &c.resources else {
            return out;
        };
        for list in [&r.limits, &r.requests] {
            for (k, v) in list.iter().flatten() {
                if k == "cpu" || k == "memory" || crate::adapters::is_gpu_resource(k) {
                    continue;
                }
                if let Ok(m) = crate::formats::quantity::parse_milli(
                    crate::formats::keys::QUANTITY,
                    &v.0,
                    true,
                ) {
                    // A request replaces the limit of the same name.
                    out.insert(k.clone(), m);
                }
            }
        }
        out
    }
    fn add(a: &mut Res, b: &Res) {
        for (k, v) in b {
            *a.entry(k.clone()).or_default() += v;
        }
    }
    fn max(a: &mut Res, b: &Res) {
        for (k, v) in b {
            let e = a.entry(k.clone()).or_default();
            *e = (*e).max(*v);
        }
    }
    let mut apps = Res::new();
    for c in &spec.containers {
        add(&mut apps, &of(c));
    }
    let mut sidecars = Res::new();
    let mut init_peak = Res::new();
    for c in spec.init_containers.iter().flatten() {
        let r = of(c);
        if c.restart_policy.as_deref() == Some("Always") {
            add(&mut sidecars, &r);
            max(&mut init_peak, &sidecars);
        } else {
            let mut at = sidecars.clone();
            add(&mut at, &r);
            max(&mut init_peak, &at);
        }
    }
    add(&mut apps, &sidecars);
    max(&mut apps, &init_peak);
    for (k, v) in spec.overhead.iter().flatten() {
        if k == "cpu" || k == "memory" || crate::adapters::is_gpu_resource(k) {
            continue;
        }
        if let Ok(m) =
            crate::formats::quantity::parse_milli(crate::formats::keys::QUANTITY, &v.0, true)
        {
            *apps.entry(k.clone()).or_default() += m;
        }
    }
    apps.into_iter()
        .filter(|(_, v)| *v > 0)
        .map(|(k, v)| (k, u64::try_from(v).unwrap_or(u64::MAX)))
        .collect()
}

/// The terms of a pod's required node affinity.
fn affinity_of(spec: &corev1::PodSpec) -> Vec<Vec<NodeSelectorRequirement>> {
    let Some(sel) = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|na| {
            na.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
    else {
        return Vec::new();
    };
    let req = |field: bool| {
        move |e: &corev1::NodeSelectorRequirement| NodeSelectorRequirement {
            key: e.key.clone(),
            operator: e.operator.clone(),
            values: e.values.clone().unwrap_or_default(),
            field,
        }
    };
    sel.node_selector_terms
        .iter()
        .map(|t| {
            let exprs = t.match_expressions.iter().flatten().map(req(false));
            let fields = t.match_fields.iter().flatten().map(req(true));
            exprs.chain(fields).collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_projection_keeps_what_the_model_and_the_executor_read() {
        let pod: corev1::Pod = serde_json::from_value(json!({
            "metadata": {
                "name": "p", "namespace": "ml", "uid": "u1", "resourceVersion": "7",
                "creationTimestamp": "2026-01-01T00:00:00Z",
                "deletionTimestamp": "2026-01-01T01:00:00Z",
                "labels": {"app": "a"},
                "annotations": {
                    "kubectl.kubernetes.io/last-applied-configuration": "{}",
                    "hami.io/vgpu-devices-allocated": "GPU-1,NVIDIA,1024,30:;"
                },
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Node", "name": "n", "uid": "x"},
                    {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "y",
                     "controller": true}
                ]
            },
            "spec": {
                "nodeName": "n1", "schedulerName": "gpu-binpack", "priority": 5,
                "priorityClassName": "hi",
                "containers": [{"name": "c", "resources": {
                    "requests": {"cpu": "1", "nvidia.com/gpu": "1"},
                    "limits": {"cpu": "2", "nvidia.com/gpu": "1"}}}],
                "initContainers": [{"name": "i", "resources": {"limits": {"memory": "1Gi"}}}],
                "volumes": [
                    {"name": "shm", "emptyDir": {"medium": "Memory"}},
                    {"name": "d", "persistentVolumeClaim": {"claimName": "d"}}
                ],
                "resourceClaims": [{"name": "gpu", "resourceClaimName": "c1"}],
                "nodeSelector": {"nvidia.com/gpu.product": "H100"},
                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{
                        "matchExpressions": [{"key": "k", "operator": "In", "values": ["v"]}],
                        "matchFields": [{"key": "metadata.name", "operator": "In",
                                         "values": ["n1"]}]
                    }]}}},
                "tolerations": [{"key": "t", "effect": "NoSchedule"}]
            },
            "status": {
                "phase": "Running", "startTime": "2026-01-01T00:00:05Z",
                "conditions": [{"type": "Ready", "status": "True"}]
            }
        }))
        .unwrap();
        let c = CompactPod::of(&pod);
        assert_eq!(c.key(), "ml/p");
        assert_eq!(
            (c.uid.as_str(), c.resource_version.as_deref()),
            ("u1", Some("7"))
        );
        assert!(c.deleting && c.ready && c.phase == Phase::Running);
        assert_eq!(c.created.unwrap().to_rfc3339(), "2026-01-01T00:00:00+00:00");
        assert_eq!(c.started.unwrap().to_rfc3339(), "2026-01-01T00:00:05+00:00");
        assert_eq!(
            c.annotations.keys().collect::<Vec<_>>(),
            ["hami.io/vgpu-devices-allocated"],
            "kubectl's copy of the object is not kept"
        );
        assert_eq!(
            c.controller_of(),
            Some(("ReplicaSet".into(), "rs".into())),
            "the controller, not the first owner"
        );
        assert_eq!(c.node_name.as_deref(), Some("n1"));
        assert_eq!(c.scheduler_name.as_deref(), Some("gpu-binpack"));
        assert_eq!(
            (c.priority, c.priority_class_name.as_deref()),
            (Some(5), Some("hi"))
        );
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(c.requests, Requests::of(spec), "the requests, read once");
        assert_eq!((c.requests.cpu, c.requests.mem), (1000, 1 << 30));
        assert_eq!(c.requests.total("nvidia.com/gpu"), Ok(1));
        assert!(
            !c.local_storage,
            "a memory-backed emptyDir is not local storage"
        );
        assert!(c.pvc && !c.ephemeral_volume);
        assert_eq!(c.claims.spec, [("gpu".to_string(), Some("c1".to_string()))]);
        assert_eq!(c.node_selector["nvidia.com/gpu.product"], "H100");
        assert_eq!(c.affinity.len(), 1);
        assert_eq!(
            c.affinity[0].iter().map(|r| r.field).collect::<Vec<_>>(),
            [false, true]
        );
        assert_eq!(c.tolerations[0].operator, "Equal");
        let r = c.object_reference();
        assert_eq!(
            (r.kind.as_deref(), r.name.as_deref(), r.uid.as_deref()),
            (Some("Pod"), Some("p"), Some("u1"))
        );
    }

    #[test]
    fn an_empty_pod_projects_to_defaults_without_a_panic() {
        let c = CompactPod::of(&corev1::Pod::default());
        assert_eq!(c, CompactPod::default());
    }
}
