//! What the model needs to judge workloads, not pods: the pods' owner objects
//! (ReplicaSets, StatefulSets, Jobs — metadata only, trimmed to names and owner
//! references), Namespaces (their `gpu-defrag.io/do-not-disrupt` opt-out), Volcano and
//! KAI PodGroups where those CRDs are served (a group with `minMember` above 1 is a
//! gang), and Kubernetes PodGroups (`scheduling.k8s.io/v1beta1`, 1.37) where that API is
//! served (the `GenericWorkload` feature gate). See `gpu_defrag_core::workload`.
use std::sync::Arc;

use futures::{Stream, StreamExt};
use gpu_defrag_core::workload::{
    ControllerKind, KAI_GROUP_API, Listed, SCHEDULING_GROUP_API, SCHEDULING_GROUP_VERSION,
    VOLCANO_GROUP_API,
};
use k8s_openapi::api::apps::v1::{ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, GroupVersionKind};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::optional::OptionalKind;

/// Keeps only what the owner chain and the namespace opt-out read.
fn trim(meta: &mut ObjectMeta, keep_annotation: Option<&str>) {
    meta.managed_fields = None;
    meta.labels = None;
    meta.annotations = match (keep_annotation, meta.annotations.take()) {
        (Some(k), Some(mut a)) => a.remove_entry(k).map(|(k, v)| [(k, v)].into()),
        _ => None,
    };
    if let Some(refs) = meta.owner_references.as_mut() {
        refs.retain(|r| r.controller == Some(true));
    }
}

/// A metadata-only reflector of `K`, trimmed; every change calls `changed`.
fn reflect<K>(
    client: &Client,
    keep_annotation: Option<&'static str>,
) -> (
    Store<PartialObjectMeta<K>>,
    impl Stream<Item = ()> + Send + 'static,
)
where
    K: Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = reflector::store::<PartialObjectMeta<K>>();
    let stream = watcher(
        Api::<PartialObjectMeta<K>>::all(client.clone()),
        watcher::Config::default().any_semantic(),
    )
    .modify(move |m: &mut PartialObjectMeta<K>| trim(&mut m.metadata, keep_annotation))
    .default_backoff()
    .reflect(writer)
    .touched_objects()
    .map(|_| ());
    (store, stream)
}

/// The watched owner objects, namespaces and pod groups.
#[derive(Clone)]
pub struct Owners {
    replica_sets: Store<PartialObjectMeta<ReplicaSet>>,
    stateful_sets: Store<PartialObjectMeta<StatefulSet>>,
    jobs: Store<PartialObjectMeta<Job>>,
    namespaces: Store<PartialObjectMeta<Namespace>>,
    volcano: OptionalKind,
    kai: OptionalKind,
    scheduling: OptionalKind,
}

impl Owners {
    /// Starts the watches; `changed` is called on every change.
    pub async fn start(client: Client, changed: impl Fn() + Clone + Send + Sync + 'static) -> Self {
        let (replica_sets, rs) = reflect::<ReplicaSet>(&client, None);
        let (stateful_sets, ss) = reflect::<StatefulSet>(&client, None);
        let (jobs, js) = reflect::<Job>(&client, None);
        let (namespaces, ns) = reflect::<Namespace>(&client, Some(gpu_defrag_api::DO_NOT_DISRUPT));
        for s in [rs.boxed(), ss.boxed(), js.boxed(), ns.boxed()] {
            let changed = changed.clone();
            tokio::spawn(async move {
                let mut s = s;
                while s.next().await.is_some() {
                    changed();
                }
            });
        }
        let volcano = OptionalKind::start(
            client.clone(),
            GroupVersionKind::gvk(VOLCANO_GROUP_API, "v1beta1", "PodGroup"),
            "podgroups",
            "pods naming a Volcano pod group are never moved (gang-unknown)",
            changed.clone(),
        )
        .await;
        let kai = OptionalKind::start(
            client.clone(),
            GroupVersionKind::gvk(KAI_GROUP_API, "v2alpha2", "PodGroup"),
            "podgroups",
            "pods naming a KAI pod group are never moved (gang-unknown)",
            changed.clone(),
        )
        .await;
        // Served only with the GenericWorkload feature gate (Kubernetes 1.37).
        let scheduling = OptionalKind::start(
            client,
            GroupVersionKind::gvk(SCHEDULING_GROUP_API, SCHEDULING_GROUP_VERSION, "PodGroup"),
            "podgroups",
            "pods naming a pod group in spec.schedulingGroup are never moved (gang-unknown)",
            changed,
        )
        .await;
        Owners {
            replica_sets,
            stateful_sets,
            jobs,
            namespaces,
            volcano,
            kai,
            scheduling,
        }
    }

    /// Fixed stores no watch fills (tests, tools): these ReplicaSets, no other owner object,
    /// no namespace, no pod group kind served.
    pub fn fixed(replica_sets: Store<PartialObjectMeta<ReplicaSet>>) -> Self {
        let group = |g: &str, v: &str| {
            OptionalKind::unwatched(&GroupVersionKind::gvk(g, v, "PodGroup"), "podgroups")
        };
        Owners {
            replica_sets,
            stateful_sets: kube::runtime::reflector::store::Writer::default().as_reader(),
            jobs: kube::runtime::reflector::store::Writer::default().as_reader(),
            namespaces: kube::runtime::reflector::store::Writer::default().as_reader(),
            volcano: group(VOLCANO_GROUP_API, "v1beta1"),
            kai: group(KAI_GROUP_API, "v2alpha2"),
            scheduling: group(SCHEDULING_GROUP_API, SCHEDULING_GROUP_VERSION),
        }
    }

    /// Returns once every watch holds a full list (optional kinds: when served at start).
    pub async fn wait_until_ready(&self) {
        let _ = tokio::join!(
            self.replica_sets.wait_until_ready(),
            self.stateful_sets.wait_until_ready(),
            self.jobs.wait_until_ready(),
            self.namespaces.wait_until_ready(),
            self.volcano.wait_until_ready(),
            self.kai.wait_until_ready(),
            self.scheduling.wait_until_ready(),
        );
    }

    /// The objects now (shared, not copied).
    pub fn snapshot(&self) -> OwnersSnapshot {
        let groups = [&self.volcano, &self.kai, &self.scheduling]
            .into_iter()
            .flat_map(|k| k.state())
            .map(|g| pod_group_value(&g))
            .collect();
        OwnersSnapshot {
            replica_sets: self.replica_sets.state(),
            stateful_sets: self.stateful_sets.state(),
            jobs: self.jobs.state(),
            namespaces: self.namespaces.state(),
            pod_groups: groups,
            listed: Listed {
                replica_sets: true,
                stateful_sets: true,
                jobs: true,
                namespaces: true,
                volcano_pod_groups: self.volcano.listed(),
                kai_pod_groups: self.kai.listed(),
                scheduling_pod_groups: self.scheduling.listed(),
                // Set from the DRA watches ([`crate::dra`]).
                device_taint_rules: false,
            },
        }
    }
}

/// A PodGroup as the core reads it: apiVersion, namespace, name and spec.
fn pod_group_value(g: &kube::api::DynamicObject) -> Value {
    json!({
        "apiVersion": g.types.as_ref().map(|t| t.api_version.as_str()).unwrap_or_default(),
        "kind": "PodGroup",
        "metadata": {"namespace": g.metadata.namespace, "name": g.metadata.name},
        "spec": g.data.get("spec").cloned().unwrap_or(Value::Null),
    })
}

/// The owner objects, namespaces and pod groups at one instant.
pub struct OwnersSnapshot {
    replica_sets: Vec<Arc<PartialObjectMeta<ReplicaSet>>>,
    stateful_sets: Vec<Arc<PartialObjectMeta<StatefulSet>>>,
    jobs: Vec<Arc<PartialObjectMeta<Job>>>,
    namespaces: Vec<Arc<PartialObjectMeta<Namespace>>>,
    /// PodGroup objects as values.
    pub pod_groups: Vec<Value>,
    /// What is listed in full.
    pub listed: Listed,
}

impl OwnersSnapshot {
    /// The owner objects, for `ObjectRefs::controllers`.
    pub fn controllers(&self) -> Vec<(ControllerKind, &ObjectMeta)> {
        let rs = self
            .replica_sets
            .iter()
            .map(|o| (ControllerKind::ReplicaSet, &o.metadata));
        let ss = self
            .stateful_sets
            .iter()
            .map(|o| (ControllerKind::StatefulSet, &o.metadata));
        let js = self.jobs.iter().map(|o| (ControllerKind::Job, &o.metadata));
        rs.chain(ss).chain(js).collect()
    }

    /// The namespaces, for `ObjectRefs::namespaces`.
    pub fn namespaces(&self) -> Vec<&ObjectMeta> {
        self.namespaces.iter().map(|n| &n.metadata).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trimming_keeps_the_chain_and_the_opt_out() {
        let mut m: ObjectMeta = serde_json::from_value(json!({
            "name": "web-5d8f", "namespace": "ml",
            "labels": {"app": "web"},
            "annotations": {"deployment.kubernetes.io/revision": "3", "gpu-defrag.io/do-not-disrupt": "true"},
            "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "uid": "u", "controller": true},
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "v"},
            ],
        }))
        .unwrap();
        let mut ns = m.clone();
        trim(&mut m, None);
        assert_eq!(m.labels, None);
        assert_eq!(m.annotations, None);
        assert_eq!(m.owner_references.as_ref().unwrap().len(), 1);
        assert_eq!(m.name.as_deref(), Some("web-5d8f"));
        trim(&mut ns, Some(gpu_defrag_api::DO_NOT_DISRUPT));
        assert_eq!(
            ns.annotations,
            Some(
                [(
                    "gpu-defrag.io/do-not-disrupt".to_string(),
                    "true".to_string()
                )]
                .into()
            )
        );
    }
}
