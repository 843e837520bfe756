//! Small helpers over Kubernetes objects and timestamps: no client, no shared state.
use chrono::{DateTime, SecondsFormat, Utc};
use gpu_defrag_api::DRAINING_TAINT;
use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::json;

/// Strips what the model never reads from a Pod, so 6,000 pods stay cheap in memory.
pub fn trim_pod(p: &mut Pod) {
    p.metadata.managed_fields = None;
    if let Some(a) = p.metadata.annotations.as_mut() {
        a.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
    if let Some(spec) = p.spec.as_mut() {
        for c in spec
            .containers
            .iter_mut()
            .chain(spec.init_containers.iter_mut().flatten())
        {
            c.env = None;
            c.env_from = None;
            c.command = None;
            c.args = None;
            c.liveness_probe = None;
            c.readiness_probe = None;
            c.startup_probe = None;
            c.volume_mounts = None;
            c.ports = None;
            c.lifecycle = None;
        }
    }
    if let Some(st) = p.status.as_mut() {
        st.container_statuses = None;
        st.init_container_statuses = None;
        st.ephemeral_container_statuses = None;
    }
}

/// Strips what the model never reads from a Node: image lists are the bulk of a real node
/// object.
pub fn trim_node(n: &mut Node) {
    n.metadata.managed_fields = None;
    if let Some(st) = n.status.as_mut() {
        st.images = None;
    }
}

/// Whether a pod is Ready (condition).
pub fn pod_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The node a pod is bound to.
pub fn pod_node(p: &Pod) -> Option<&str> {
    p.spec.as_ref().and_then(|s| s.node_name.as_deref())
}

/// `(kind, name)` of a pod's controller.
pub fn controller_of(p: &Pod) -> Option<(String, String)> {
    p.metadata
        .owner_references
        .as_ref()?
        .iter()
        .find(|o| o.controller == Some(true))
        .map(|o| (o.kind.clone(), o.name.clone()))
}

/// Parses an RFC 3339 time from status.
pub fn parse_ts(s: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(s)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

/// A time as status writes it (RFC 3339, seconds, `Z`).
pub fn ts(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// The taint a run puts on nodes it empties.
pub fn draining_taint(policy: &str) -> serde_json::Value {
    json!({"key": DRAINING_TAINT, "value": policy, "effect": "NoSchedule"})
}

/// Whether a node carries this policy's draining taint.
pub fn has_draining_taint(n: &Node, policy: &str) -> bool {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| {
            ts.iter()
                .any(|t| t.key == DRAINING_TAINT && t.value.as_deref() == Some(policy))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_round_trip_at_second_precision() {
        let t = parse_ts("2026-03-01T02:00:00+08:00").unwrap();
        assert_eq!(ts(t), "2026-02-28T18:00:00Z");
        assert_eq!(parse_ts(&ts(t)), Some(t));
        assert!(parse_ts("yesterday").is_none());
    }

    #[test]
    fn a_pods_controller_is_its_controller_reference_only() {
        let p: Pod = serde_json::from_value(json!({"metadata": {"name": "p", "ownerReferences": [
            {"apiVersion": "v1", "kind": "Other", "name": "x", "uid": "1"},
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "2", "controller": true}
        ]}}))
        .unwrap();
        assert_eq!(controller_of(&p), Some(("ReplicaSet".into(), "rs".into())));
        assert_eq!(controller_of(&Pod::default()), None);
    }

    #[test]
    fn only_this_policys_taint_counts() {
        let n: Node =
            serde_json::from_value(json!({"metadata": {"name": "n"}, "spec": {"taints": [
            {"key": DRAINING_TAINT, "value": "other", "effect": "NoSchedule"}]}}))
            .unwrap();
        assert!(!has_draining_taint(&n, "mine"));
        assert!(has_draining_taint(&n, "other"));
    }
}
