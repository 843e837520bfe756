//! Fences: the draining taint on nodes a run empties, and single GPUs listed in
//! `hami.io/device-cordon` on HAMi nodes ([`gpu_defrag_core::fence`]). Every edit is a
//! read-modify-write guarded by the node's resourceVersion.
use std::collections::{BTreeMap, BTreeSet};

use gpu_defrag_api::v1alpha1::{FencedDevice, RunRecord};
use gpu_defrag_core::fence;
use gpu_defrag_core::plan::{FencedDevice as PlannedDevice, Plan};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tracing::info;

use crate::context::{Error, FenceError};
use crate::objects::{draining_taint, fence_owner, has_draining_taint, is_fence_of};

/// What a run fences: whole nodes and single GPUs `(node, gpu)`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Fences {
    /// Nodes tainted for the run.
    pub nodes: BTreeSet<String>,
    /// Single GPUs fenced for the run.
    pub devices: BTreeSet<(String, String)>,
}

impl Fences {
    /// The fences a run holds: those it recorded before (resume) and those of its plan.
    pub fn of_run(rec: &RunRecord, plan: &Plan) -> Self {
        Self::of(rec, &plan.fenced_nodes, &plan.fenced_devices)
    }

    fn of(rec: &RunRecord, nodes: &[String], devices: &[PlannedDevice]) -> Self {
        Fences {
            nodes: rec
                .fenced_nodes
                .iter()
                .cloned()
                .chain(nodes.iter().cloned())
                .collect(),
            devices: rec
                .fenced_devices
                .iter()
                .map(|d| (d.node.clone(), d.gpu.clone()))
                .chain(devices.iter().map(|d| (d.node.clone(), d.gpu.clone())))
                .collect(),
        }
    }

    /// Writes them into the run's record (so a restart can take them back).
    pub fn record(&self, rec: &mut RunRecord) {
        rec.fenced_nodes = self.nodes.iter().cloned().collect();
        rec.fenced_devices = self
            .devices
            .iter()
            .map(|(node, gpu)| FencedDevice {
                node: node.clone(),
                gpu: gpu.clone(),
            })
            .collect();
    }

    /// Whether a pod on `node` using `gpus` sits on one of these fences; the fenced GPU if
    /// it is a single one.
    pub fn hit(&self, node: &str, gpus: &[String]) -> Option<Option<String>> {
        let gpu = gpus
            .iter()
            .find(|g| self.devices.contains(&(node.to_string(), (*g).clone())))
            .cloned();
        (self.nodes.contains(node) || gpu.is_some()).then_some(gpu)
    }
}

/// A node's fences as an edit sees them: its taints and annotations.
struct NodeFences {
    taints: Vec<serde_json::Value>,
    annotations: BTreeMap<String, String>,
}

/// Rewrites a node's taints and annotations with `edit`, guarded by its resourceVersion
/// (retried on conflicts), so a concurrent change by another controller is never lost.
/// An edit that cannot be made (unreadable fence annotations) is an error, nothing is
/// written.
async fn edit_node(
    client: &Client,
    node: &str,
    edit: impl Fn(&mut NodeFences) -> Result<(), String>,
) -> Result<(), Error> {
    let api: Api<Node> = Api::all(client.clone());
    let mut last = None;
    for _ in 0..5 {
        let n = match api.get(node).await {
            Ok(n) => n,
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        let before = NodeFences {
            taints: n
                .spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .map(|t| {
                    t.iter()
                        .filter_map(|t| serde_json::to_value(t).ok())
                        .collect()
                })
                .unwrap_or_default(),
            annotations: n.metadata.annotations.clone().unwrap_or_default(),
        };
        let mut after = NodeFences {
            taints: before.taints.clone(),
            annotations: before.annotations.clone(),
        };
        edit(&mut after).map_err(|problem| FenceError::Unreadable {
            node: node.to_string(),
            problem,
        })?;
        let mut patch = json!({"metadata": {"resourceVersion": n.metadata.resource_version}});
        if after.taints != before.taints {
            patch["spec"] = json!({"taints": after.taints});
        }
        let mut changed: serde_json::Map<String, serde_json::Value> = serde_json::Map::new();
        for (k, v) in &after.annotations {
            if before.annotations.get(k) != Some(v) {
                changed.insert(k.clone(), json!(v));
            }
        }
        for k in before.annotations.keys() {
            if !after.annotations.contains_key(k) {
                changed.insert(k.clone(), serde_json::Value::Null);
            }
        }
        if !changed.is_empty() {
            patch["metadata"]["annotations"] = serde_json::Value::Object(changed);
        } else if patch.get("spec").is_none() {
            return Ok(());
        }
        match api
            .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => last = Some(kube::Error::Api(s)),
            Err(e) => return Err(e.into()),
        }
    }
    Err(last.map(Error::from).unwrap_or_else(|| {
        FenceError::KeptConflicting {
            node: node.to_string(),
        }
        .into()
    }))
}

/// `(key, value)` of a taint as an edit sees it.
fn key_value(t: &serde_json::Value) -> (&str, Option<&str>) {
    (
        t.get("key").and_then(|k| k.as_str()).unwrap_or_default(),
        t.get("value").and_then(|v| v.as_str()),
    )
}

/// Puts the policy's draining taint on a node (its own key: other policies' fences stay).
async fn set_taint(client: &Client, node: &str, policy: &str) -> Result<(), Error> {
    let want = draining_taint(policy);
    edit_node(client, node, |n| {
        n.taints.retain(|t| {
            let (k, v) = key_value(t);
            !is_fence_of(k, v, policy)
        });
        n.taints.push(want.clone());
        Ok(())
    })
    .await
}

/// Removes this policy's fence from a node (fences of other policies stay).
async fn remove_taint(client: &Client, node: &str, policy: &str) -> Result<(), Error> {
    edit_node(client, node, |n| {
        n.taints.retain(|t| {
            let (k, v) = key_value(t);
            !is_fence_of(k, v, policy)
        });
        Ok(())
    })
    .await
}

/// Removes the draining taints whose fence id is not in `known` (their policy is gone).
async fn remove_orphan_taints(
    client: &Client,
    node: &str,
    known: &BTreeSet<String>,
) -> Result<(), Error> {
    edit_node(client, node, |n| {
        n.taints.retain(|t| {
            let (k, v) = key_value(t);
            fence_owner(k, v).is_none_or(|id| known.contains(&id))
        });
        Ok(())
    })
    .await
}

/// Applies annotation changes computed by [`fence`].
fn apply_changes(annotations: &mut BTreeMap<String, String>, changes: fence::Changes) {
    for (k, v) in changes {
        match v {
            Some(v) => annotations.insert(k, v),
            None => annotations.remove(&k),
        };
    }
}

/// Fences single GPUs of a node for this policy (`hami.io/device-cordon`, see [`fence`]).
async fn cordon_devices(
    client: &Client,
    node: &str,
    gpus: &[String],
    policy: &str,
) -> Result<(), Error> {
    edit_node(client, node, |n| {
        let changes = fence::cordon(&n.annotations, policy, gpus)?;
        apply_changes(&mut n.annotations, changes);
        Ok(())
    })
    .await
}

/// Takes back every single-GPU fence this policy set on a node (fences of
/// administrators and other policies stay).
async fn uncordon_devices(client: &Client, node: &str, policy: &str) -> Result<(), Error> {
    edit_node(client, node, |n| {
        let changes = fence::uncordon(&n.annotations, policy)?;
        apply_changes(&mut n.annotations, changes);
        Ok(())
    })
    .await
}

/// The single GPUs of a run's record, by node.
fn devices_by_node(devices: &[FencedDevice]) -> BTreeMap<String, Vec<String>> {
    let mut by: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for d in devices {
        by.entry(d.node.clone()).or_default().push(d.gpu.clone());
    }
    by
}

/// Sets a run's fences: the draining taint on its nodes, then its single GPUs.
pub async fn set(client: &Client, policy: &str, rec: &RunRecord) -> Result<(), Error> {
    for n in &rec.fenced_nodes {
        set_taint(client, n, policy).await?;
    }
    for (n, gpus) in devices_by_node(&rec.fenced_devices) {
        cordon_devices(client, &n, &gpus, policy).await?;
    }
    Ok(())
}

/// Takes back the fences a run's record names.
pub async fn remove(client: &Client, policy: &str, rec: &RunRecord) -> Result<(), Error> {
    for n in &rec.fenced_nodes {
        remove_taint(client, n, policy).await?;
    }
    for n in devices_by_node(&rec.fenced_devices).keys() {
        uncordon_devices(client, n, policy).await?;
    }
    Ok(())
}

/// Removes every fence this policy left on any node (from the node cache): its draining
/// taints and its single-GPU fences.
pub async fn remove_stale(
    client: &Client,
    nodes: &[std::sync::Arc<Node>],
    policy: &str,
) -> Result<(), Error> {
    for n in nodes.iter().filter(|n| has_draining_taint(n, policy)) {
        info!(policy, node = %n.name_any(), "removing a fence no run owns");
        remove_taint(client, &n.name_any(), policy).await?;
    }
    let cordoned = nodes.iter().filter(|n| {
        n.metadata
            .annotations
            .as_ref()
            .is_some_and(|a| !fence::claimed_by(a, policy).is_empty())
    });
    for n in cordoned {
        info!(policy, node = %n.name_any(), "removing single-GPU fences no run owns");
        uncordon_devices(client, &n.name_any(), policy).await?;
    }
    Ok(())
}

/// Removes the fences of policies that no longer exist: draining taints whose fence id
/// and single-GPU claims whose policy name is not in `policies` (every DefragPolicy of the
/// cluster, whatever operator reconciles it). `nodes` must be read before `policies` were
/// listed, so that no fence of a policy newer than the list is ever seen.
pub async fn remove_orphans(
    client: &Client,
    nodes: &[std::sync::Arc<Node>],
    policies: &BTreeSet<String>,
) -> Result<usize, Error> {
    let ids: BTreeSet<String> = policies
        .iter()
        .map(|p| crate::objects::fence_id(p))
        .collect();
    let mut removed = 0;
    for n in nodes {
        let name = n.name_any();
        let orphan_taints = n
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|ts| {
                ts.iter().any(|t| {
                    fence_owner(&t.key, t.value.as_deref()).is_some_and(|id| !ids.contains(&id))
                })
            });
        if orphan_taints {
            info!(node = %name, "removing draining taints of policies that no longer exist");
            remove_orphan_taints(client, &name, &ids).await?;
            removed += 1;
        }
        let claims = n
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| fence::claims(a).ok())
            .unwrap_or_default();
        for policy in claims.keys().filter(|p| !policies.contains(*p)) {
            info!(node = %name, policy = %policy, "removing single-GPU fences of a policy that no longer exists");
            uncordon_devices(client, &name, policy).await?;
            removed += 1;
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resumed_run_keeps_its_recorded_fences_and_adds_its_plans() {
        let rec = RunRecord {
            fenced_nodes: vec!["a".into()],
            fenced_devices: vec![FencedDevice {
                node: "h".into(),
                gpu: "GPU-1".into(),
            }],
            ..Default::default()
        };
        let f = Fences::of(
            &rec,
            &["b".into(), "a".into()],
            &[PlannedDevice {
                node: "h".into(),
                gpu: "GPU-2".into(),
            }],
        );
        let mut out = RunRecord::default();
        f.record(&mut out);
        assert_eq!(out.fenced_nodes, ["a", "b"]);
        assert_eq!(
            devices_by_node(&out.fenced_devices).get("h"),
            Some(&vec!["GPU-1".to_string(), "GPU-2".to_string()])
        );
        assert_eq!(f.hit("a", &[]), Some(None));
        assert_eq!(f.hit("h", &["GPU-2".into()]), Some(Some("GPU-2".into())));
        assert_eq!(f.hit("h", &["GPU-3".into()]), None);
    }
}
