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
//! Gangs are read from the pod's `spec.schedulingGroup` (the Kubernetes PodGroup,
//! `scheduling.k8s.io/v1beta1`, 1.37: a group with `spec.schedulingPolicy.gang.minCount`
//! above 1 or `spec.disruptionMode.all` is a gang), from the labels and annotations the
//! gang schedulers, training operators and Kueue write, and, for Volcano and KAI (which
//! put *every* pod they schedule in a pod group, a plain Deployment's pods too), from
//! the PodGroup objects: a group whose `spec.minMember` is above 1 is a gang. A group
//! that cannot be read makes the pod [`Gang::Unknown`].
use std::collections::{BTreeSet, HashMap};

use k8s_openapi::api::scheduling::v1beta1::PodGroupSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
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
    /// Kubernetes PodGroups (`scheduling.k8s.io/v1beta1`, Kubernetes 1.37; served only
    /// with the `GenericWorkload` feature gate on), the groups pods name in
    /// `spec.schedulingGroup.podGroupName`.
    pub scheduling_pod_groups: bool,
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
/// API group of the Kubernetes PodGroups (`spec.schedulingGroup.podGroupName` of a pod).
pub const SCHEDULING_GROUP_API: &str = "scheduling.k8s.io";
/// The version of the Kubernetes PodGroups read (Kubernetes 1.37).
pub const SCHEDULING_GROUP_VERSION: &str = "v1beta1";
/// Kueue's pod label naming the pod group of plain pods (and of the pods of the workloads
/// Kueue admits as pod groups).
pub const KUEUE_GROUP_LABEL: &str = "kueue.x-k8s.io/pod-group-name";
/// Kueue's pod annotation giving the number of pods of that group.
pub const KUEUE_GROUP_COUNT_ANNOTATION: &str = "kueue.x-k8s.io/pod-group-total-count";

/// Which scheduler a pod group belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum GroupSource {
    Volcano,
    Kai,
    /// Kubernetes' own (`scheduling.k8s.io`).
    Scheduling,
}

impl GroupSource {
    fn name(self) -> &'static str {
        match self {
            GroupSource::Volcano => "Volcano",
            GroupSource::Kai => "KAI",
            GroupSource::Scheduling => "scheduling.k8s.io",
        }
    }
}

/// What a pod group object says of its pods: `Ok(Some(why))` a gang (`why`, e.g. "with
/// minMember 4", completes "PodGroup ns/name"), `Ok(None)` no gang, `Err` unreadable.
type GroupRule = Result<Option<String>, String>;

/// Owner objects, pod groups and namespace opt-outs, indexed for the pods.
#[derive(Debug, Default)]
pub struct Index<'a> {
    controllers: HashMap<(ControllerKind, &'a str, &'a str), &'a ObjectMeta>,
    groups: HashMap<(GroupSource, String, String), GroupRule>,
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

/// Reads a PodGroup object: its source, namespace, name and what it says of its pods
/// (Volcano and KAI: `spec.minMember`; Kubernetes: [`scheduling_group_rule`]).
fn pod_group(v: &Value) -> Option<(GroupSource, String, String, GroupRule)> {
    let api = v.get("apiVersion")?.as_str()?;
    if v.get("kind").and_then(Value::as_str) != Some("PodGroup") {
        return None;
    }
    let source = match api_group_of(api) {
        VOLCANO_GROUP_API => GroupSource::Volcano,
        KAI_GROUP_API => GroupSource::Kai,
        SCHEDULING_GROUP_API => GroupSource::Scheduling,
        _ => return None,
    };
    let ns = v.pointer("/metadata/namespace")?.as_str()?.to_string();
    let name = v.pointer("/metadata/name")?.as_str()?.to_string();
    let rule = match source {
        GroupSource::Scheduling => scheduling_group_rule(v.get("spec")),
        GroupSource::Volcano | GroupSource::Kai => match v.pointer("/spec/minMember") {
            // KAI's minMember is optional (a group of sub-groups): unknown, not 1.
            None => Err("no spec.minMember".to_string()),
            Some(m) => m
                .as_i64()
                .map(|min| (min > 1).then(|| format!("with minMember {min}")))
                .ok_or_else(|| format!("spec.minMember is not an integer: {m}")),
        },
    };
    Some((source, ns, name, rule))
}

/// What the `spec` of a Kubernetes PodGroup (`scheduling.k8s.io/v1beta1`) says of its
/// pods: a gang when `schedulingPolicy.gang.minCount` is above 1 (the scheduler places at
/// least that many together or none), or when `disruptionMode` is `all` (its pods may
/// only be disrupted together: moving one alone is what that forbids). `basic` with the
/// default `disruptionMode` (`single`) is no gang. A policy or mode of neither known
/// kind (a later API) is unreadable: the pod may be a gang.
fn scheduling_group_rule(spec: Option<&Value>) -> GroupRule {
    let spec = spec.ok_or("no spec")?;
    let spec = PodGroupSpec::deserialize(spec).map_err(|e| format!("spec unreadable: {e}"))?;
    let all = match &spec.disruption_mode {
        None => false,
        Some(m) if m.all.is_some() => true,
        Some(m) if m.single.is_some() => false,
        Some(_) => return Err("spec.disruptionMode is neither single nor all".into()),
    };
    let policy = &spec.scheduling_policy;
    let min = match (&policy.gang, &policy.basic) {
        (Some(g), _) => g.min_count,
        (None, Some(_)) => 1,
        (None, None) => return Err("spec.schedulingPolicy is neither basic nor gang".into()),
    };
    Ok(match (min > 1, all) {
        (true, true) => Some(format!("with gang minCount {min} and disruptionMode all")),
        (true, false) => Some(format!("with gang minCount {min}")),
        (false, true) => Some("with disruptionMode all".into()),
        (false, false) => None,
    })
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

    /// The gang a pod of namespace `ns` belongs to, if any: the Kubernetes PodGroup its
    /// `spec.schedulingGroup.podGroupName` (`scheduling_group`) names first (the
    /// scheduler's own group), then the gang labels, Kueue's pod group, and the Volcano
    /// and KAI groups its annotations name. A group that is no gang (a Kubernetes group
    /// with the `basic` policy, a Kueue group of 1, a Volcano or KAI group with
    /// `minMember` 1) lets the next source decide; a group that cannot be read makes the
    /// pod [`Gang::Unknown`].
    ///
    /// Every member of one group gets the same [`Gang::Member`] text: demand runs group
    /// a gang's pending pods by it.
    pub fn gang(
        &self,
        ns: &str,
        labels: &std::collections::BTreeMap<String, String>,
        annotations: &std::collections::BTreeMap<String, String>,
        scheduling_group: Option<&str>,
    ) -> Option<Gang> {
        if let Some(group) = scheduling_group.filter(|g| !g.is_empty()) {
            let key = "spec.schedulingGroup.podGroupName";
            if let Some(gang) = self.group_gang(GroupSource::Scheduling, key, ns, group) {
                return Some(gang);
            }
        }
        for (key, who) in GANG_LABELS {
            if let Some(v) = labels.get(*key) {
                return Some(Gang::Member(format!("label {key}={v} ({who})")));
            }
        }
        if let Some(gang) = kueue_gang(labels, annotations) {
            return Some(gang);
        }
        let named = VOLCANO_GROUP_ANNOTATIONS
            .iter()
            .map(|k| (GroupSource::Volcano, *k))
            .chain([(GroupSource::Kai, KAI_GROUP_ANNOTATION)])
            .filter_map(|(s, k)| annotations.get(k).map(|v| (s, k, v)));
        for (source, key, group) in named {
            if let Some(gang) = self.group_gang(source, key, ns, group) {
                return Some(gang);
            }
        }
        None
    }

    /// What pod group `group` of `source`, named by the pod's `key`, makes a pod of
    /// namespace `ns`: a member, unknown (not listed, not found, unreadable), or `None`
    /// (no gang).
    fn group_gang(&self, source: GroupSource, key: &str, ns: &str, group: &str) -> Option<Gang> {
        let (listed, why_not) = match source {
            GroupSource::Volcano => (self.listed.volcano_pod_groups, ""),
            GroupSource::Kai => (self.listed.kai_pod_groups, ""),
            GroupSource::Scheduling => (
                self.listed.scheduling_pod_groups,
                " (the API is served only with the GenericWorkload feature gate on)",
            ),
        };
        let name = source.name();
        if !listed {
            return Some(Gang::Unknown(format!(
                "{key}={group}: {name} PodGroups not readable{why_not}"
            )));
        }
        match self
            .groups
            .get(&(source, ns.to_string(), group.to_string()))
        {
            None => Some(Gang::Unknown(format!(
                "{key}={group}: {name} PodGroup {ns}/{group} not found"
            ))),
            Some(Err(e)) => Some(Gang::Unknown(format!("{name} PodGroup {ns}/{group}: {e}"))),
            Some(Ok(Some(why))) => {
                Some(Gang::Member(format!("{name} PodGroup {ns}/{group} {why}")))
            }
            Some(Ok(None)) => None,
        }
    }
}

/// Kueue's pod group (`kueue.x-k8s.io/pod-group-name`, an empty value is none, as for
/// Kueue): a gang when its `kueue.x-k8s.io/pod-group-total-count` is above 1, none when it
/// is 1, unknown when it is missing or not a positive integer. The text names the group
/// and its count only, the same for every member.
fn kueue_gang(
    labels: &std::collections::BTreeMap<String, String>,
    annotations: &std::collections::BTreeMap<String, String>,
) -> Option<Gang> {
    let group = labels.get(KUEUE_GROUP_LABEL).filter(|g| !g.is_empty())?;
    let Some(count) = annotations.get(KUEUE_GROUP_COUNT_ANNOTATION) else {
        return Some(Gang::Unknown(format!(
            "label {KUEUE_GROUP_LABEL}={group} (Kueue pod group) without annotation \
             {KUEUE_GROUP_COUNT_ANNOTATION}"
        )));
    };
    match count.trim().parse::<u64>() {
        Ok(n) if n > 1 => Some(Gang::Member(format!("Kueue pod group {group} of {n}"))),
        Ok(1) => None,
        _ => Some(Gang::Unknown(format!(
            "Kueue pod group {group}: annotation {KUEUE_GROUP_COUNT_ANNOTATION}={count:?} is \
             not a positive integer"
        ))),
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
            idx.gang(
                "ml",
                &none,
                &ann("scheduling.k8s.io/group-name", "single"),
                None
            ),
            None
        );
        assert!(matches!(
            idx.gang(
                "ml",
                &none,
                &ann("scheduling.k8s.io/group-name", "gang"),
                None
            ),
            Some(Gang::Member(_))
        ));
        assert!(matches!(
            idx.gang(
                "ml",
                &none,
                &ann("scheduling.k8s.io/group-name", "missing"),
                None
            ),
            Some(Gang::Unknown(_))
        ));
        assert!(matches!(
            idx.gang(
                "ml",
                &none,
                &ann("scheduling.k8s.io/group-name", "bad"),
                None
            ),
            Some(Gang::Unknown(_))
        ));
        // Same name, other namespace: not found.
        assert!(matches!(
            idx.gang(
                "other",
                &none,
                &ann("scheduling.k8s.io/group-name", "single"),
                None
            ),
            Some(Gang::Unknown(_))
        ));
        assert!(matches!(
            idx.gang("ml", &none, &ann("pod-group-name", "kai-sub"), None),
            Some(Gang::Unknown(_))
        ));
        for (k, _) in GANG_LABELS {
            assert!(
                matches!(
                    idx.gang("ml", &ann(k, "x"), &none, None),
                    Some(Gang::Member(_))
                ),
                "{k}"
            );
        }
        // PodGroups not readable at all: unknown.
        let blind = Index::new(&[], &[], Listed::default());
        assert!(matches!(
            blind.gang(
                "ml",
                &none,
                &ann("scheduling.k8s.io/group-name", "single"),
                None
            ),
            Some(Gang::Unknown(_))
        ));
        assert_eq!(blind.gang("ml", &none, &none, None), None);
    }

    #[test]
    fn gangs_from_kueue_pod_groups() {
        let idx = Index::new(&[], &[], Listed::default());
        let kueue = |group: &str, count: Option<&str>| {
            let labels = BTreeMap::from([(KUEUE_GROUP_LABEL.to_string(), group.to_string())]);
            let ann: BTreeMap<String, String> = count
                .map(|c| (KUEUE_GROUP_COUNT_ANNOTATION.to_string(), c.to_string()))
                .into_iter()
                .collect();
            idx.gang("ml", &labels, &ann, None)
        };
        assert_eq!(
            kueue("train", Some("4")),
            Some(Gang::Member("Kueue pod group train of 4".into()))
        );
        assert_eq!(kueue("solo", Some("1")), None);
        assert_eq!(kueue("", Some("4")), None, "an empty name is no group");
        for bad in [None, Some("four"), Some("0"), Some("-2"), Some("")] {
            assert!(
                matches!(kueue("train", bad), Some(Gang::Unknown(_))),
                "{bad:?}"
            );
        }
        // A group of 1 lets the other sources decide.
        let labels = BTreeMap::from([(KUEUE_GROUP_LABEL.to_string(), "solo".to_string())]);
        let ann = BTreeMap::from([
            (KUEUE_GROUP_COUNT_ANNOTATION.to_string(), "1".to_string()),
            ("scheduling.k8s.io/group-name".to_string(), "vg".to_string()),
        ]);
        assert!(matches!(
            idx.gang("ml", &labels, &ann, None),
            Some(Gang::Unknown(_))
        ));
    }

    #[test]
    fn gangs_from_scheduling_pod_groups() {
        let pg = |name: &str, spec: Value| {
            json!({"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
                   "metadata": {"namespace": "ml", "name": name}, "spec": spec})
        };
        let groups = [
            pg(
                "gang",
                json!({"schedulingPolicy": {"gang": {"minCount": 8}}}),
            ),
            pg(
                "gang-of-one",
                json!({"schedulingPolicy": {"gang": {"minCount": 1}}}),
            ),
            pg("basic", json!({"schedulingPolicy": {"basic": {}}})),
            pg(
                "basic-single",
                json!({"schedulingPolicy": {"basic": {}}, "disruptionMode": {"single": {}}}),
            ),
            pg(
                "basic-all",
                json!({"schedulingPolicy": {"basic": {}}, "disruptionMode": {"all": {}}}),
            ),
            pg(
                "gang-all",
                json!({"schedulingPolicy": {"gang": {"minCount": 2}}, "disruptionMode": {"all": {}}}),
            ),
            pg("no-policy", json!({"schedulingPolicy": {}})),
            pg(
                "odd-mode",
                json!({"schedulingPolicy": {"basic": {}}, "disruptionMode": {"some": {}}}),
            ),
            pg(
                "bad-count",
                json!({"schedulingPolicy": {"gang": {"minCount": "8"}}}),
            ),
            json!({"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
                   "metadata": {"namespace": "ml", "name": "no-spec"}}),
            // Another kind of the same group is no pod group.
            json!({"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "Workload",
                   "metadata": {"namespace": "ml", "name": "workload"},
                   "spec": {"podGroupTemplates": []}}),
        ];
        let listed = Listed {
            scheduling_pod_groups: true,
            ..Default::default()
        };
        let idx = Index::new(&[], &groups, listed);
        let none = BTreeMap::new();
        let gang = |ns: &str, group: &str| idx.gang(ns, &none, &none, Some(group));
        assert_eq!(
            gang("ml", "gang"),
            Some(Gang::Member(
                "scheduling.k8s.io PodGroup ml/gang with gang minCount 8".into()
            ))
        );
        assert_eq!(
            gang("ml", "basic-all"),
            Some(Gang::Member(
                "scheduling.k8s.io PodGroup ml/basic-all with disruptionMode all".into()
            ))
        );
        assert!(matches!(gang("ml", "gang-all"), Some(Gang::Member(_))));
        for no_gang in ["gang-of-one", "basic", "basic-single"] {
            assert_eq!(gang("ml", no_gang), None, "{no_gang}");
        }
        for unknown in [
            "no-policy",
            "odd-mode",
            "bad-count",
            "no-spec",
            "workload",
            "missing",
        ] {
            assert!(
                matches!(gang("ml", unknown), Some(Gang::Unknown(_))),
                "{unknown}"
            );
        }
        let Some(Gang::Unknown(why)) = gang("other", "gang") else {
            panic!("another namespace's group is not the pod's");
        };
        assert!(why.contains("PodGroup other/gang not found"), "{why}");
        assert_eq!(idx.gang("ml", &none, &none, Some("")), None);
        // The pod's own group decides before its labels; a group that is no gang lets
        // them decide.
        let jobset = BTreeMap::from([(
            "jobset.sigs.k8s.io/jobset-name".to_string(),
            "js".to_string(),
        )]);
        assert!(matches!(
            idx.gang("ml", &jobset, &none, Some("missing")),
            Some(Gang::Unknown(_))
        ));
        assert_eq!(
            idx.gang("ml", &jobset, &none, Some("basic")),
            Some(Gang::Member(
                "label jobset.sigs.k8s.io/jobset-name=js (JobSet)".into()
            ))
        );
        // The API not served (GenericWorkload off) or not readable: unknown, said so.
        let blind = Index::new(&[], &groups, Listed::default());
        let Some(Gang::Unknown(why)) = blind.gang("ml", &none, &none, Some("basic")) else {
            panic!("an unlisted group is unknown");
        };
        assert!(why.contains("not readable"), "{why}");
        // Volcano's annotation `scheduling.k8s.io/group-name` names a Volcano group, never
        // a Kubernetes one.
        assert!(matches!(
            idx.gang(
                "ml",
                &none,
                &BTreeMap::from([(
                    "scheduling.k8s.io/group-name".to_string(),
                    "gang".to_string()
                )]),
                None
            ),
            Some(Gang::Unknown(_))
        ));
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
