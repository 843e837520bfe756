//! The notes of the built cluster: what the input did not let the model check or read
//! (object kinds not listed, DRA objects missing), one sentence each.
use crate::dra::Inventory;
use crate::model::*;
use crate::workload::Listed;

/// What the input did not let the model check, one sentence each.
pub(super) fn unchecked_notes(pods: &[Pod], listed: &Listed) -> Vec<String> {
    let mut notes = Vec::new();
    let not_checked = pods
        .iter()
        .filter(|p| {
            p.workload
                .as_ref()
                .is_some_and(|w| w.chain == Chain::NotChecked)
        })
        .count();
    if not_checked > 0 {
        let missing: Vec<&str> = [
            (listed.replica_sets, "replicasets"),
            (listed.stateful_sets, "statefulsets"),
            (listed.jobs, "jobs"),
        ]
        .into_iter()
        .filter(|(l, _)| !l)
        .map(|(_, k)| k)
        .collect();
        notes.push(format!(
            "owner chains of {not_checked} pods not checked: the input has no {} (judged by the pods' own owner references and labels)",
            missing.join(", ")
        ));
    }
    if !listed.namespaces {
        notes.push(
            "namespace opt-outs (gpu-defrag.io/do-not-disrupt on a Namespace) not checked: the input has no namespaces".into(),
        );
    }
    notes
}

/// What the DRA objects of the input did not let the model read, or the planner do
/// (`rules_listed`: DeviceTaintRules are served and readable).
pub(super) fn dra_notes(inv: &Inventory, dra_pods: usize, rules_listed: bool) -> Vec<String> {
    let mut notes = inv.notes.clone();
    // Without any DRA object, pods with claims keep their `resource-claim` skip.
    if !inv.present() {
        return notes;
    }
    if !rules_listed && !inv.nodes.is_empty() {
        notes.push(
            "DeviceTaintRules are not served (Kubernetes 1.37) or not readable: single GPUs of DRA nodes are not drained by themselves (DRA nodes are drained whole)".into(),
        );
    }
    let (slices, claims, classes) = inv.listed;
    if !slices {
        notes.push(
            "the input has no resourceslices: GPUs published through DRA are not counted".into(),
        );
    }
    if !claims && dra_pods > 0 {
        notes.push(format!(
            "the input has no resourceclaims: the DRA devices of {dra_pods} pods are not known (those pods are unknown on DRA nodes and never moved)"
        ));
    }
    if !classes {
        notes.push(
            "the input has no deviceclasses: extended resources backed by DRA (nvidia.com/gpu through a DeviceClass) are not recognised".into(),
        );
    }
    notes
}
