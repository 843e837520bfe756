//! Workloads, not pods: each pod's controller owner chain, its gang (if any), and the
//! namespaces whose owners opted out of disruption.
//!
//! The owner chain is read from the owner objects where they are at hand (the operator
//! watches ReplicaSets, StatefulSets and Jobs; a snapshot may carry them): Pod →
//! ReplicaSet → Deployment, Pod → StatefulSet, Pod → Job → CronJob, Pod → anything else.
//! Where they are not at hand, the pod is judged by its own owner reference and labels,
//! and the model says so ([`Chain::NotChecked`]). An owner object that should be at hand
//! but is not found makes the chain [`Chain::Broken`]: such a pod is never moved.
//!
//! Gangs are read from the labels and annotations the gang schedulers and training
//! operators write, and, for Volcano and KAI (which put *every* pod they schedule in a
//! pod group, a plain Deployment's pods too), from the PodGroup objects: a group whose
//! `spec.minMember` is above 1 is a gang; a group that cannot be read makes the pod
//! [`Gang::Unknown`].
use std::collections::{BTreeSet, HashMap};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

use crate::model::{Chain, Gang, Owner, Workload};

/// The kinds of owner objects the chain is read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ControllerKind {
    /// `apps/ReplicaSet`.
    ReplicaSet,
    /// `apps/StatefulSet`.
    StatefulSet,
    /// `batch/Job`.
    Job,
}

impl ControllerKind {
    /// API group.
    pub fn group(self) -> &'static str {
        match self {
            ControllerKind::ReplicaSet | ControllerKind::StatefulSet => "apps",
            ControllerKind::Job => "batch",
        }
    }
    /// Kind.
    pub fn kind(self) -> &'static str {
        match self {
            ControllerKind::ReplicaSet => "ReplicaSet",
            ControllerKind::StatefulSet => "StatefulSet",
            ControllerKind::Job => "Job",
        }
    }
    /// The kind of an owner reference, when it is one of these.
    pub fn of(group: &str, kind: &str) -> Option<Self> {
        [
            ControllerKind::ReplicaSet,
            ControllerKind::StatefulSet,
            ControllerKind::Job,
        ]
        .into_iter()
        .find(|k| k.group() == group && k.kind() == kind)
    }
}

/// A ReplicaSet, StatefulSet or Job, reduced to its metadata (what the chain needs).
#[derive(Debug, Clone, PartialEq)]
pub struct ControllerObject {
    /// Which kind.
    pub kind: ControllerKind,
    /// Its metadata (namespace, name, ownerReferences).
    pub metadata: ObjectMeta,
}

/// Which object kinds the input lists in full. A kind not listed is "not at hand": the
/// model judges pods without it and says so; a kind listed but missing an object a pod
/// points to is a broken chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Listed {
    /// ReplicaSets.
    pub replica_sets: bool,
    /// StatefulSets.
    pub stateful_sets: bool,
    /// Jobs.
    pub jobs: bool,
    /// Namespaces.
    pub namespaces: bool,
    /// Volcano PodGroups (`scheduling.volcano.sh`).
    pub volcano_pod_groups: bool,
    /// KAI PodGroups (`scheduling.run.ai`).
    pub kai_pod_groups: bool,
    /// DRA `DeviceTaintRule`s (`resource.k8s.io/v1`, Kubernetes 1.37): served, so a run
    /// can fence a single DRA device with one.
    pub device_taint_rules: bool,
}

impl Listed {
    /// Whether objects of `kind` are at hand.
    pub fn controllers(&self, kind: ControllerKind) -> bool {
        match kind {
            ControllerKind::ReplicaSet => self.replica_sets,
            ControllerKind::StatefulSet => self.stateful_sets,
            ControllerKind::Job => self.jobs,
        }
    }
}

/// Kinds of workload whose pods are movable by default.
pub const MOVABLE_KINDS: &[&str] = &["apps/Deployment", "apps/ReplicaSet", "apps/StatefulSet"];
/// Kinds of workload whose pods are movable only with `safety.evictJobPods`.
pub const JOB_KINDS: &[&str] = &["batch/Job", "batch/CronJob"];

/// Pod labels that make a pod a gang member whatever its owner, with who writes them.
pub const GANG_LABELS: &[(&str, &str)] = &[
    (
        "scheduling.x-k8s.io/pod-group",
        "scheduler-plugins coscheduling",
    ),
    (
        "scheduling.sigs.k8s.io/pod-group",
        "scheduler-plugins coscheduling (older)",
    ),
    (
        "pod-group.scheduling.sigs.k8s.io",
        "scheduler-plugins lightweight coscheduling",
    ),
    ("leaderworkerset.sigs.k8s.io/name", "LeaderWorkerSet"),
    ("jobset.sigs.k8s.io/jobset-name", "JobSet"),
    (
        "training.kubeflow.org/job-name",
        "Kubeflow training operator / MPI operator",
    ),
    (
        "training.kubeflow.org/replica-type",
        "Kubeflow training operator / MPI operator",
    ),
    ("ray.io/cluster", "KubeRay"),
];

/// Volcano's pod annotations naming its PodGroup.
pub const VOLCANO_GROUP_ANNOTATIONS: &[&str] = &[
    "scheduling.k8s.io/group-name",
    "scheduling.volcano.sh/group-name",
];
/// KAI's pod annotation naming its PodGroup.
pub const KAI_GROUP_ANNOTATION: &str = "pod-group-name";
/// API group of Volcano PodGroups.
pub const VOLCANO_GROUP_API: &str = "scheduling.volcano.sh";
/// API group of KAI PodGroups.
pub const KAI_GROUP_API: &str = "scheduling.run.ai";

/// Which scheduler a pod group belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum GroupSource {
    Volcano,
    Kai,
}

impl GroupSource {
    fn name(self) -> &'static str {
        match self {
            GroupSource::Volcano => "Volcano",
            GroupSource::Kai => "KAI",
        }
    }
}

/// Owner objects, pod groups and namespace opt-outs, indexed for the pods.
#[derive(Debug, Default)]
pub struct Index<'a> {
    controllers: HashMap<(ControllerKind, &'a str, &'a str), &'a ObjectMeta>,
    groups: HashMap<(GroupSource, String, String), Result<i64, String>>,
    listed: Listed,
}

/// The group of an `apiVersion` (`apps/v1` → `apps`, `v1` → empty).
pub fn api_group(api_version: &str) -> String {
    api_group_of(api_version).to_string()
}

/// [`api_group`], borrowed.
fn api_group_of(api_version: &str) -> &str {
    api_version
        .rsplit_once('/')
        .map(|(g, _)| g)
        .unwrap_or_default()
}

/// Reads a PodGroup object: its source, namespace, name and `spec.minMember`.
fn pod_group(v: &Value) -> Option<(GroupSource, String, String, Result<i64, String>)> {
    let api = v.get("apiVersion")?.as_str()?;
    let source = match api_group(api).as_str() {
        VOLCANO_GROUP_API => GroupSource::Volcano,
        KAI_GROUP_API => GroupSource::Kai,
        _ => return None,
    };
    let ns = v.pointer("/metadata/namespace")?.as_str()?.to_string();
    let name = v.pointer("/metadata/name")?.as_str()?.to_string();
    let min = match v.pointer("/spec/minMember") {
        // KAI's minMember is optional (a group of sub-groups): unknown, not 1.
        None => Err("no spec.minMember".to_string()),
        Some(m) => m
            .as_i64()
            .ok_or_else(|| format!("spec.minMember is not an integer: {m}")),
    };
    Some((source, ns, name, min))
}

impl<'a> Index<'a> {
    /// Indexes the owner objects and pod groups.
    pub fn new(
        controllers: &[(ControllerKind, &'a ObjectMeta)],
        groups: &[Value],
        listed: Listed,
    ) -> Self {
        let mut idx = Index {
            listed,
            ..Default::default()
        };
        for &(kind, meta) in controllers {
            if let (Some(ns), Some(name)) = (meta.namespace.as_deref(), meta.name.as_deref()) {
                idx.controllers.insert((kind, ns, name), meta);
            }
        }
        for g in groups {
            if let Some((source, ns, name, min)) = pod_group(g) {
                idx.groups.insert((source, ns, name), min);
            }
        }
        idx
    }

    /// The workload of a pod of namespace `ns` with controller `owner` and `labels`.
    pub fn workload(
        &self,
        ns: &str,
        owner: Option<&Owner>,
        labels: &std::collections::BTreeMap<String, String>,
    ) -> Option<Workload> {
        let owner = owner?;
        let own = || Workload::checked(&owner.group_kind(), &owner.name);
        let Some(kind) = ControllerKind::of(&owner.group, &owner.kind) else {
            return Some(own());
        };
        if !self.listed.controllers(kind) {
            // Judged by the pod. An Argo Rollout's ReplicaSet labels its pods
            // `rollouts-pod-template-hash`: a custom controller above the ReplicaSet.
            if kind == ControllerKind::ReplicaSet
                && let Some(h) = labels.get("rollouts-pod-template-hash")
            {
                let name = owner
                    .name
                    .strip_suffix(h.as_str())
                    .and_then(|p| p.strip_suffix('-'))
                    .unwrap_or(&owner.name);
                return Some(Workload {
                    kind: "argoproj.io/Rollout".into(),
                    name: name.to_string(),
                    chain: Chain::NotChecked,
                });
            }
            // A ReplicaSet named `<deployment>-<pod-template-hash>` belongs to that
            // Deployment.
            let deployment = (kind == ControllerKind::ReplicaSet)
                .then(|| labels.get("pod-template-hash"))
                .flatten()
                .and_then(|h| owner.name.strip_suffix(h.as_str()))
                .and_then(|p| p.strip_suffix('-'))
                .filter(|p| !p.is_empty());
            return Some(match deployment {
                Some(d) => Workload {
                    kind: "apps/Deployment".into(),
                    name: d.to_string(),
                    chain: Chain::NotChecked,
                },
                None => Workload {
                    chain: Chain::NotChecked,
                    ..own()
                },
            });
        }
        let Some(meta) = self.controllers.get(&(kind, ns, owner.name.as_str())) else {
            return Some(Workload {
                chain: Chain::Broken(format!("{} {ns}/{} not found", kind.kind(), owner.name)),
                ..own()
            });
        };
        // The controller's own controller, read in place (no copy of its reference).
        let up = meta
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true));
        Some(match up {
            None => own(),
            Some(up) => {
                let group = api_group_of(&up.api_version);
                match (kind, group, up.kind.as_str()) {
                    (ControllerKind::ReplicaSet, "apps", "Deployment") => {
                        Workload::checked("apps/Deployment", &up.name)
                    }
                    (ControllerKind::Job, "batch", "CronJob") => {
                        Workload::checked("batch/CronJob", &up.name)
                    }
                    // Anything else above: that controller decides what the pod is (an
                    // Argo Rollout above a ReplicaSet, a LeaderWorkerSet leader above a
                    // StatefulSet, a JobSet above a Job, …).
                    (_, "", _) => Workload::checked(&up.kind, &up.name),
                    _ => Workload::checked(&format!("{group}/{}", up.kind), &up.name),
                }
            }
        })
    }

    /// The gang a pod belongs to, if any (labels first, then Volcano and KAI groups).
    pub fn gang(
        &self,
        ns: &str,
        labels: &std::collections::BTreeMap<String, String>,
        annotations: &std::collections::BTreeMap<String, String>,
    ) -> Option<Gang> {
        for (key, who) in GANG_LABELS {
            if let Some(v) = labels.get(*key) {
                return Some(Gang::Member(format!("label {key}={v} ({who})")));
            }
        }
        let named = VOLCANO_GROUP_ANNOTATIONS
            .iter()
            .map(|k| (GroupSource::Volcano, *k))
            .chain([(GroupSource::Kai, KAI_GROUP_ANNOTATION)])
            .filter_map(|(s, k)| annotations.get(k).map(|v| (s, k, v)));
        for (source, key, group) in named {
            let listed = match source {
                GroupSource::Volcano => self.listed.volcano_pod_groups,
                GroupSource::Kai => self.listed.kai_pod_groups,
            };
            if !listed {
                return Some(Gang::Unknown(format!(
                    "{key}={group}: {} PodGroups not readable",
                    source.name()
                )));
            }
            match self
                .groups
                .get(&(source, ns.to_string(), group.to_string()))
            {
                None => {
                    return Some(Gang::Unknown(format!(
                        "{key}={group}: {} PodGroup {ns}/{group} not found",
                        source.name()
                    )));
                }
                Some(Err(e)) => {
                    return Some(Gang::Unknown(format!(
                        "{} PodGroup {ns}/{group}: {e}",
                        source.name()
                    )));
                }
                Some(Ok(min)) if *min > 1 => {
                    return Some(Gang::Member(format!(
                        "{} PodGroup {ns}/{group} with minMember {min}",
                        source.name()
                    )));
                }
                Some(Ok(_)) => {}
            }
        }
        None
    }
}

/// Whether a `gpu-defrag.io/do-not-disrupt` value opts out: any value but `"false"`.
pub fn opts_out(value: &str) -> bool {
    value.trim() != "false"
}

/// Namespaces whose metadata carries `gpu-defrag.io/do-not-disrupt` (any value but
/// `"false"`).
pub fn protected_namespaces<'a>(
    namespaces: impl IntoIterator<Item = &'a ObjectMeta>,
) -> BTreeSet<String> {
    namespaces
        .into_iter()
        .filter(|m| {
            m.annotations
                .as_ref()
                .and_then(|a| a.get(gpu_defrag_api::DO_NOT_DISRUPT))
                .is_some_and(|v| opts_out(v))
        })
        .filter_map(|m| m.name.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::collections::BTreeMap;

    fn meta(v: Value) -> ObjectMeta {
        serde_json::from_value(v).unwrap()
    }

    fn owner(group: &str, kind: &str, name: &str) -> Owner {
        Owner {
            group: group.into(),
            kind: kind.into(),
            name: name.into(),
        }
    }

    #[test]
    fn chains_are_read_from_the_owner_objects() {
        let rs = meta(json!({"namespace": "ml", "name": "web-5d8f",
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "uid": "u", "controller": true}]}));
        let rollout = meta(json!({"namespace": "ml", "name": "canary-1",
            "ownerReferences": [{"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout", "name": "canary", "uid": "u", "controller": true}]}));
        let bare = meta(json!({"namespace": "ml", "name": "bare-rs"}));
        let lws = meta(json!({"namespace": "ml", "name": "lws-0",
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "lws-0", "uid": "u", "controller": true}]}));
        let job = meta(json!({"namespace": "ml", "name": "nightly-1",
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "CronJob", "name": "nightly", "uid": "u", "controller": true}]}));
        let js = meta(json!({"namespace": "ml", "name": "js-w-0",
            "ownerReferences": [{"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": "js", "uid": "u", "controller": true}]}));
        let all = Listed {
            replica_sets: true,
            stateful_sets: true,
            jobs: true,
            ..Default::default()
        };
        let objs = [
            (ControllerKind::ReplicaSet, &rs),
            (ControllerKind::ReplicaSet, &rollout),
            (ControllerKind::ReplicaSet, &bare),
            (ControllerKind::StatefulSet, &lws),
            (ControllerKind::Job, &job),
            (ControllerKind::Job, &js),
        ];
        let idx = Index::new(&objs, &[], all);
        let l = BTreeMap::new();
        let w = |o: Owner| idx.workload("ml", Some(&o), &l).unwrap();
        for ((group, kind, name), (want_kind, want_name)) in [
            (
                ("apps", "ReplicaSet", "web-5d8f"),
                ("apps/Deployment", "web"),
            ),
            (
                ("apps", "ReplicaSet", "canary-1"),
                ("argoproj.io/Rollout", "canary"),
            ),
            (
                ("apps", "ReplicaSet", "bare-rs"),
                ("apps/ReplicaSet", "bare-rs"),
            ),
            (("apps", "StatefulSet", "lws-0"), ("Pod", "lws-0")),
            (("batch", "Job", "nightly-1"), ("batch/CronJob", "nightly")),
            (("batch", "Job", "js-w-0"), ("jobset.x-k8s.io/JobSet", "js")),
            (
                ("kubeflow.org", "PyTorchJob", "pt"),
                ("kubeflow.org/PyTorchJob", "pt"),
            ),
        ] {
            assert_eq!(
                w(owner(group, kind, name)),
                Workload::checked(want_kind, want_name)
            );
        }
        // A ReplicaSet of another group is not apps/ReplicaSet.
        assert_eq!(
            w(owner("example.com", "ReplicaSet", "x")).kind,
            "example.com/ReplicaSet"
        );
        // Listed but missing: broken.
        assert!(matches!(
            w(owner("apps", "ReplicaSet", "gone")).chain,
            Chain::Broken(_)
        ));
        assert!(idx.workload("ml", None, &l).is_none());
    }

    #[test]
    fn without_owner_objects_the_pod_is_judged_by_itself() {
        let idx = Index::new(&[], &[], Listed::default());
        let labels = BTreeMap::from([("pod-template-hash".to_string(), "5d8f".to_string())]);
        let w = idx
            .workload(
                "ml",
                Some(&owner("apps", "ReplicaSet", "web-5d8f")),
                &labels,
            )
            .unwrap();
        assert_eq!(
            (w.kind.as_str(), w.name.as_str(), w.chain),
            ("apps/Deployment", "web", Chain::NotChecked)
        );
        let w = idx
            .workload("ml", Some(&owner("apps", "ReplicaSet", "other")), &labels)
            .unwrap();
        assert_eq!(
            (w.kind.as_str(), w.chain),
            ("apps/ReplicaSet", Chain::NotChecked)
        );
        // An Argo Rollout's pods say so by their label.
        let rollout =
            BTreeMap::from([("rollouts-pod-template-hash".to_string(), "7f9c".to_string())]);
        let w = idx
            .workload(
                "ml",
                Some(&owner("apps", "ReplicaSet", "canary-7f9c")),
                &rollout,
            )
            .unwrap();
        assert_eq!(
            (w.kind.as_str(), w.name.as_str(), w.chain),
            ("argoproj.io/Rollout", "canary", Chain::NotChecked)
        );
    }

    #[test]
    fn gangs_from_labels_and_pod_groups() {
        let groups = [
            json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
                   "metadata": {"namespace": "ml", "name": "single"}, "spec": {"minMember": 1}}),
            json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
                   "metadata": {"namespace": "ml", "name": "gang"}, "spec": {"minMember": 4}}),
            json!({"apiVersion": "scheduling.run.ai/v2alpha2", "kind": "PodGroup",
                   "metadata": {"namespace": "ml", "name": "kai-sub"}, "spec": {"minSubGroup": 2}}),
            json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
                   "metadata": {"namespace": "ml", "name": "bad"}, "spec": {"minMember": "four"}}),
        ];
        let listed = Listed {
            volcano_pod_groups: true,
            kai_pod_groups: true,
            ..Default::default()
        };
        let idx = Index::new(&[], &groups, listed);
        let none = BTreeMap::new();
        let ann = |k: &str, v: &str| BTreeMap::from([(k.to_string(), v.to_string())]);
        assert_eq!(
            idx.gang("ml", &none, &ann("scheduling.k8s.io/group-name", "single")),
            None
        );
        assert!(matches!(
            idx.gang("ml", &none, &ann("scheduling.k8s.io/group-name", "gang")),
            Some(Gang::Member(_))
        ));
        assert!(matches!(
            idx.gang("ml", &none, &ann("scheduling.k8s.io/group-name", "missing")),
            Some(Gang::Unknown(_))
        ));
        assert!(matches!(
            idx.gang("ml", &none, &ann("scheduling.k8s.io/group-name", "bad")),
            Some(Gang::Unknown(_))
        ));
        // Same name, other namespace: not found.
        assert!(matches!(
            idx.gang(
                "other",
                &none,
                &ann("scheduling.k8s.io/group-name", "single")
            ),
            Some(Gang::Unknown(_))
        ));
        assert!(matches!(
            idx.gang("ml", &none, &ann("pod-group-name", "kai-sub")),
            Some(Gang::Unknown(_))
        ));
        for (k, _) in GANG_LABELS {
            assert!(
                matches!(idx.gang("ml", &ann(k, "x"), &none), Some(Gang::Member(_))),
                "{k}"
            );
        }
        // PodGroups not readable at all: unknown.
        let blind = Index::new(&[], &[], Listed::default());
        assert!(matches!(
            blind.gang("ml", &none, &ann("scheduling.k8s.io/group-name", "single")),
            Some(Gang::Unknown(_))
        ));
        assert_eq!(blind.gang("ml", &none, &none), None);
    }

    #[test]
    fn namespace_opt_out() {
        let a = meta(json!({"name": "a", "annotations": {"gpu-defrag.io/do-not-disrupt": "true"}}));
        let b =
            meta(json!({"name": "b", "annotations": {"gpu-defrag.io/do-not-disrupt": "false"}}));
        let c = meta(json!({"name": "c"}));
        assert_eq!(
            protected_namespaces([&a, &b, &c]),
            BTreeSet::from(["a".to_string()])
        );
    }
}
