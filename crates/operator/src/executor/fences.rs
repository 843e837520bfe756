//! Fences: the draining taint on nodes a run empties; single GPUs listed in
//! `hami.io/device-cordon` on HAMi nodes ([`gpu_defrag_core::fence`]); single DRA devices
//! fenced by a `DeviceTaintRule` of the run (`NoSchedule`, never `NoExecute`, which would
//! delete pods without regard to their PodDisruptionBudgets). Every node edit is a
//! read-modify-write guarded by the node's resourceVersion.
use std::collections::{BTreeMap, BTreeSet};

use gpu_defrag_api::v1alpha1::{FencedDevice, RunRecord};
use gpu_defrag_core::dra::DEVICE_FENCE_LABEL;
use gpu_defrag_core::fence;
use gpu_defrag_core::plan::{FencedDevice as PlannedDevice, Plan};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::DeviceTaintRule;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tracing::{info, warn};

use crate::context::{Error, FenceError};
use crate::objects::{
    draining_taint, draining_taint_key, fence_id, fence_owner, has_draining_taint, is_fence_of,
};

/// A planned single-GPU fence as the run's record holds it.
pub fn recorded(d: &PlannedDevice) -> FencedDevice {
    FencedDevice {
        node: d.node.clone(),
        gpu: d.gpu.clone(),
        driver: d.dra.as_ref().map(|x| x.driver.clone()),
        pool: d.dra.as_ref().map(|x| x.pool.clone()),
    }
}

/// What a run fences: whole nodes and single GPUs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Fences {
    /// Nodes tainted for the run.
    pub nodes: BTreeSet<String>,
    /// Single GPUs fenced for the run (HAMi GPUs and DRA devices).
    pub devices: BTreeSet<FencedDevice>,
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
                .cloned()
                .chain(devices.iter().map(recorded))
                .collect(),
        }
    }

    /// Writes them into the run's record (so a restart can take them back).
    pub fn record(&self, rec: &mut RunRecord) {
        rec.fenced_nodes = self.nodes.iter().cloned().collect();
        rec.fenced_devices = self.devices.iter().cloned().collect();
    }

    /// Whether a pod on `node` using `gpus` sits on one of these fences; the fenced GPU if
    /// it is a single one.
    pub fn hit(&self, node: &str, gpus: &[String]) -> Option<Option<String>> {
        let gpu = gpus
            .iter()
            .find(|g| self.devices.iter().any(|d| d.node == node && d.gpu == **g))
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

/// The single HAMi GPUs of a run's record, by node (DRA devices are fenced by rules).
fn devices_by_node(devices: &[FencedDevice]) -> BTreeMap<String, Vec<String>> {
    let mut by: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for d in devices.iter().filter(|d| d.dra().is_none()) {
        by.entry(d.node.clone()).or_default().push(d.gpu.clone());
    }
    by
}

/// The name of the `DeviceTaintRule` that fences DRA device `d` for `policy`: the same for
/// the same device and policy (a resumed run finds its rule), 16 hex digits of a hash of
/// both (device names, pools and policies may be long).
pub fn device_rule_name(policy: &str, d: &FencedDevice) -> String {
    let (driver, pool) = d.dra().unwrap_or_default();
    // FNV-1a: stable across versions and platforms (the name is written in the cluster).
    let hash = [policy, driver, pool, d.gpu.as_str()]
        .iter()
        .flat_map(|s| s.bytes().chain([0]))
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
    format!("gpu-defrag-{hash:016x}")
}

/// The `DeviceTaintRule` fencing DRA device `d` for `policy`: `NoSchedule` with the
/// policy's draining taint key, selecting exactly the device (driver, pool, name), labelled
/// with the policy's fence id.
pub fn device_rule(policy: &str, d: &FencedDevice) -> Result<DeviceTaintRule, Error> {
    let (driver, pool) = d.dra().unwrap_or_default();
    let rule = json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceTaintRule",
        "metadata": {
            "name": device_rule_name(policy, d),
            "labels": {
                DEVICE_FENCE_LABEL: fence_id(policy),
                "app.kubernetes.io/managed-by": "gpu-defrag",
            },
            "annotations": {
                "gpu-defrag.io/policy": policy,
                "gpu-defrag.io/node": d.node,
            },
        },
        "spec": {
            "deviceSelector": {"driver": driver, "pool": pool, "device": d.gpu},
            "taint": {"key": draining_taint_key(policy), "value": fence_id(policy), "effect": "NoSchedule"},
        },
    });
    serde_json::from_value(rule).map_err(|e| {
        FenceError::Unreadable {
            node: d.node.clone(),
            problem: format!("DeviceTaintRule for device {}: {e}", d.gpu),
        }
        .into()
    })
}

/// Creates the rule fencing DRA device `d` (kept as it is when it exists: its name is the
/// device's and the policy's).
async fn fence_dra_device(client: &Client, policy: &str, d: &FencedDevice) -> Result<(), Error> {
    let api: Api<DeviceTaintRule> = Api::all(client.clone());
    match api
        .create(&PostParams::default(), &device_rule(policy, d)?)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Deletes a fence rule by name (gone already is fine).
async fn delete_rule(client: &Client, name: &str) -> Result<(), Error> {
    let api: Api<DeviceTaintRule> = Api::all(client.clone());
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The fence id a rule of this operator carries, if it is one.
fn rule_fence(r: &DeviceTaintRule) -> Option<&str> {
    r.metadata
        .labels
        .as_ref()?
        .get(DEVICE_FENCE_LABEL)
        .map(String::as_str)
}

/// Sets a run's fences: the draining taint on its nodes, then its single GPUs (HAMi cordons
/// and DRA device rules).
pub async fn set(client: &Client, policy: &str, rec: &RunRecord) -> Result<(), Error> {
    for n in &rec.fenced_nodes {
        set_taint(client, n, policy).await?;
    }
    for (n, gpus) in devices_by_node(&rec.fenced_devices) {
        cordon_devices(client, &n, &gpus, policy).await?;
    }
    for d in rec.fenced_devices.iter().filter(|d| d.dra().is_some()) {
        fence_dra_device(client, policy, d).await?;
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
    for d in rec.fenced_devices.iter().filter(|d| d.dra().is_some()) {
        delete_rule(client, &device_rule_name(policy, d)).await?;
    }
    Ok(())
}

/// This policy's device fence rules, listed live (a deleted policy's last fences must not
/// be missed for a cache that lags); none where DeviceTaintRules are not served, or not
/// readable (without that right no run planned a device fence, and a deleted policy must
/// not be held back by it).
pub async fn list_rules(client: &Client, policy: &str) -> Result<Vec<DeviceTaintRule>, Error> {
    let api: Api<DeviceTaintRule> = Api::all(client.clone());
    let lp = ListParams::default().labels(&format!("{DEVICE_FENCE_LABEL}={}", fence_id(policy)));
    match api.list(&lp).await {
        Ok(l) => Ok(l.items),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(Vec::new()),
        Err(kube::Error::Api(s)) if s.code == 403 => {
            warn!(
                policy,
                "DeviceTaintRules cannot be listed (forbidden): none taken back"
            );
            Ok(Vec::new())
        }
        Err(e) => Err(e.into()),
    }
}

/// Removes every fence this policy left on any node (from the node cache): its draining
/// taints and its single-GPU fences, and its device fence rules (from `rules`).
pub async fn remove_stale(
    client: &Client,
    nodes: &[std::sync::Arc<Node>],
    rules: &[std::sync::Arc<DeviceTaintRule>],
    policy: &str,
) -> Result<(), Error> {
    let id = fence_id(policy);
    for r in rules.iter().filter(|r| rule_fence(r) == Some(id.as_str())) {
        info!(policy, rule = %r.name_any(), "removing a device fence no run owns");
        delete_rule(client, &r.name_any()).await?;
    }
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

/// Removes the fences of policies that no longer exist: draining taints and device fence
/// rules whose fence id, and single-GPU claims whose policy name, is not in `policies`
/// (every DefragPolicy of the cluster, whatever operator reconciles it). `nodes` and
/// `rules` must be read before `policies` were listed, so that no fence of a policy newer
/// than the list is ever seen.
pub async fn remove_orphans(
    client: &Client,
    nodes: &[std::sync::Arc<Node>],
    rules: &[std::sync::Arc<DeviceTaintRule>],
    policies: &BTreeSet<String>,
) -> Result<usize, Error> {
    let ids: BTreeSet<String> = policies.iter().map(|p| fence_id(p)).collect();
    let mut removed = 0;
    for r in rules {
        if let Some(id) = rule_fence(r)
            && !ids.contains(id)
        {
            info!(rule = %r.name_any(), fence = id, "removing a device fence of a policy that no longer exists");
            delete_rule(client, &r.name_any()).await?;
            removed += 1;
        }
    }
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
    use gpu_defrag_core::plan::DraDevice;

    fn hami(node: &str, gpu: &str) -> FencedDevice {
        FencedDevice {
            node: node.into(),
            gpu: gpu.into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_resumed_run_keeps_its_recorded_fences_and_adds_its_plans() {
        let rec = RunRecord {
            fenced_nodes: vec!["a".into()],
            fenced_devices: vec![hami("h", "GPU-1")],
            ..Default::default()
        };
        let f = Fences::of(
            &rec,
            &["b".into(), "a".into()],
            &[
                PlannedDevice {
                    node: "h".into(),
                    gpu: "GPU-2".into(),
                    dra: None,
                },
                PlannedDevice {
                    node: "d".into(),
                    gpu: "gpu-3".into(),
                    dra: Some(DraDevice {
                        driver: "gpu.nvidia.com".into(),
                        pool: "d".into(),
                    }),
                },
            ],
        );
        let mut out = RunRecord::default();
        f.record(&mut out);
        assert_eq!(out.fenced_nodes, ["a", "b"]);
        // HAMi GPUs are cordoned by node; the DRA device is fenced by its own rule.
        assert_eq!(
            devices_by_node(&out.fenced_devices),
            BTreeMap::from([(
                "h".to_string(),
                vec!["GPU-1".to_string(), "GPU-2".to_string()]
            )])
        );
        let dra: Vec<_> = out.fenced_devices.iter().filter_map(|d| d.dra()).collect();
        assert_eq!(dra, [("gpu.nvidia.com", "d")]);
        assert_eq!(f.hit("a", &[]), Some(None));
        assert_eq!(f.hit("h", &["GPU-2".into()]), Some(Some("GPU-2".into())));
        assert_eq!(f.hit("h", &["GPU-3".into()]), None);
        assert_eq!(f.hit("d", &["gpu-3".into()]), Some(Some("gpu-3".into())));
        assert_eq!(f.hit("h", &["gpu-3".into()]), None);
    }

    #[test]
    fn a_dra_device_fence_is_a_no_schedule_rule_selecting_exactly_the_device() {
        let d = FencedDevice {
            node: "n1".into(),
            gpu: "gpu-5".into(),
            driver: Some("gpu.nvidia.com".into()),
            pool: Some("n1".into()),
        };
        let r = device_rule("nightly", &d).unwrap();
        let sel = r.spec.device_selector.as_ref().unwrap();
        assert_eq!(
            (
                sel.driver.as_deref(),
                sel.pool.as_deref(),
                sel.device.as_deref()
            ),
            (Some("gpu.nvidia.com"), Some("n1"), Some("gpu-5"))
        );
        assert_eq!(r.spec.taint.effect, "NoSchedule");
        assert_eq!(r.spec.taint.key, draining_taint_key("nightly"));
        assert_eq!(rule_fence(&r), Some("nightly"));
        // The same device and policy give the same name (a resumed run finds its rule);
        // another device, pool or policy another one; always a valid object name.
        let name = device_rule_name("nightly", &d);
        assert_eq!(r.metadata.name.as_deref(), Some(name.as_str()));
        assert_eq!(name.len(), "gpu-defrag-".len() + 16);
        let other_gpu = FencedDevice {
            gpu: "gpu-6".into(),
            ..d.clone()
        };
        let other_pool = FencedDevice {
            pool: Some("n2".into()),
            ..d.clone()
        };
        let names: BTreeSet<String> = [
            device_rule_name("nightly", &d),
            device_rule_name("nightly", &other_gpu),
            device_rule_name("nightly", &other_pool),
            device_rule_name("weekly", &d),
        ]
        .into();
        assert_eq!(names.len(), 4);
        // A very long policy name still gives a label value within 63 characters.
        let long = "p".repeat(200);
        let r = device_rule(&long, &d).unwrap();
        assert!(rule_fence(&r).is_some_and(|id| id.len() <= 63));
    }
}
