//! Small helpers over Kubernetes objects and timestamps: no client, no shared state.
use chrono::{DateTime, SecondsFormat, Utc};
use gpu_defrag_api::{DRAINING_TAINT_DOMAIN, LEGACY_DRAINING_TAINT};
use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::json;

/// Strips what the operator never reads from a Pod, so the watch cache of a large cluster
/// stays small. Kept: metadata (less managed fields and the last applied configuration),
/// the containers' names and resources (a limit only where it differs from the request of
/// the same name: `Requests::of` reads the request and the limit alike), the spec fields
/// the model reads (node, scheduler, priority, node selector, required node affinity,
/// tolerations, the volumes that pin a pod — hostPath, emptyDir, PersistentVolumeClaim,
/// generic ephemeral — and DRA claims), phase, start time, the Ready condition and the DRA
/// claim statuses.
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
            c.volume_devices = None;
            c.ports = None;
            c.lifecycle = None;
            c.image = None;
            c.image_pull_policy = None;
            c.termination_message_path = None;
            c.termination_message_policy = None;
            c.working_dir = None;
            c.security_context = None;
            c.resize_policy = None;
            if let Some(res) = c.resources.as_mut()
                && let (Some(req), Some(lim)) = (res.requests.as_ref(), res.limits.as_mut())
            {
                lim.retain(|k, v| req.get(k) != Some(v));
                if lim.is_empty() {
                    res.limits = None;
                }
            }
        }
        spec.ephemeral_containers = None;
        if let Some(vs) = spec.volumes.as_mut() {
            vs.retain(|v| {
                v.host_path.is_some()
                    || v.empty_dir.is_some()
                    || v.persistent_volume_claim.is_some()
                    || v.ephemeral.is_some()
            });
            if vs.is_empty() {
                spec.volumes = None;
            }
        }
        if let Some(a) = spec.affinity.as_mut() {
            a.pod_affinity = None;
            a.pod_anti_affinity = None;
            if let Some(na) = a.node_affinity.as_mut() {
                na.preferred_during_scheduling_ignored_during_execution = None;
            }
        }
        spec.security_context = None;
        spec.topology_spread_constraints = None;
        spec.dns_config = None;
        spec.host_aliases = None;
        spec.image_pull_secrets = None;
        spec.readiness_gates = None;
    }
    if let Some(st) = p.status.as_mut() {
        st.container_statuses = None;
        st.init_container_statuses = None;
        st.ephemeral_container_statuses = None;
        if let Some(cs) = st.conditions.as_mut() {
            cs.retain(|c| c.type_ == "Ready");
        }
        st.message = None;
        st.pod_ips = None;
        st.host_ips = None;
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

/// The id of a policy's fences: its name when that fits the name part of a taint key
/// and a label value (63 characters), else its first 46 characters, `-` and 16 hex digits
/// of a hash of the whole name.
pub fn fence_id(policy: &str) -> String {
    if policy.len() <= 63 {
        return policy.to_string();
    }
    // FNV-1a: stable across versions and platforms (the id is written on nodes).
    let hash = policy.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let head = policy[..46].trim_end_matches(['-', '.']);
    format!("{head}-{hash:016x}")
}

/// The key of a policy's draining taint: `draining.gpu-defrag.io/<fence id>`.
pub fn draining_taint_key(policy: &str) -> String {
    format!("{DRAINING_TAINT_DOMAIN}/{}", fence_id(policy))
}

/// The taint a run puts on nodes it empties.
pub fn draining_taint(policy: &str) -> serde_json::Value {
    json!({"key": draining_taint_key(policy), "value": fence_id(policy), "effect": "NoSchedule"})
}

/// Whether a taint (`key`, `value`) is a draining fence of this policy (its own key, or the
/// earlier single key with its name as value).
pub fn is_fence_of(key: &str, value: Option<&str>, policy: &str) -> bool {
    key == draining_taint_key(policy) || (key == LEGACY_DRAINING_TAINT && value == Some(policy))
}

/// The fence id of a draining taint (`key`, `value`) of any policy; None for other taints.
/// An earlier single-key fence gives its value (the policy name) as id.
pub fn fence_owner(key: &str, value: Option<&str>) -> Option<String> {
    if key == LEGACY_DRAINING_TAINT {
        return Some(fence_id(value.unwrap_or_default()));
    }
    key.strip_prefix(DRAINING_TAINT_DOMAIN)
        .and_then(|rest| rest.strip_prefix('/'))
        .map(str::to_string)
}

/// Whether a node carries this policy's draining taint.
pub fn has_draining_taint(n: &Node, policy: &str) -> bool {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| {
            ts.iter()
                .any(|t| is_fence_of(&t.key, t.value.as_deref(), policy))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trimmed_pod_makes_the_same_model() {
        use gpu_defrag_core::ingest::{Objects, build_cluster};
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": "n1", "labels": {"nvidia.com/gpu.product": "H100"}},
            "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110",
                "nvidia.com/gpu": "8"},
                "conditions": [{"type": "Ready", "status": "True"}]}
        }))
        .unwrap();
        let pod = |name: &str, vol: serde_json::Value| -> Pod {
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "ml", "uid": name,
                    "labels": {"app": "a", "pod-template-hash": "h"},
                    "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}",
                        "controller.kubernetes.io/pod-deletion-cost": "5"},
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                        "name": "a-h", "uid": "rs", "controller": true}]},
                "spec": {"nodeName": "n1", "schedulerName": "gpu-binpack", "priority": 7,
                    "containers": [{"name": "c", "image": "img", "imagePullPolicy": "Always",
                        "terminationMessagePath": "/dev/termination-log",
                        "securityContext": {"privileged": false},
                        "resources": {
                            "requests": {"cpu": "2", "memory": "1Gi", "nvidia.com/gpu": "2"},
                            "limits": {"cpu": "4", "memory": "1Gi", "nvidia.com/gpu": "2",
                                "example.com/other": "1"}}}],
                    "initContainers": [{"name": "i", "image": "init",
                        "resources": {"limits": {"cpu": "8"}}}],
                    "volumes": [{"name": "token", "projected": {"sources": []}},
                        {"name": "cfg", "configMap": {"name": "x"}}, vol],
                    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                        {"nodeSelectorTerms": [{"matchExpressions": [
                            {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["H100"]}]}]}},
                        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                            {"topologyKey": "kubernetes.io/hostname"}]}},
                    "tolerations": [{"key": "gpu", "operator": "Exists"}]},
                "status": {"phase": "Running", "startTime": "2026-01-01T00:00:00Z",
                    "conditions": [{"type": "PodScheduled", "status": "True"},
                        {"type": "Ready", "status": "True"}],
                    "podIPs": [{"ip": "10.0.0.1"}]}
            }))
            .unwrap()
        };
        let pods = vec![
            pod("p1", json!({"name": "scratch", "emptyDir": {}})),
            pod(
                "p2",
                json!({"name": "shm", "emptyDir": {"medium": "Memory"}}),
            ),
            pod(
                "p3",
                json!({"name": "data", "persistentVolumeClaim": {"claimName": "d"}}),
            ),
            pod("p4", json!({"name": "host", "hostPath": {"path": "/x"}})),
        ];
        let model = |pods: Vec<Pod>| {
            build_cluster(
                &Objects {
                    nodes: vec![node.clone()],
                    pods,
                    ..Default::default()
                },
                None,
            )
        };
        let mut trimmed = pods.clone();
        trimmed.iter_mut().for_each(trim_pod);
        let c = trimmed[0].spec.as_ref().unwrap();
        assert_eq!(c.volumes.as_ref().unwrap().len(), 1, "only the volume read");
        let lim = c.containers[0].resources.as_ref().unwrap().limits.as_ref();
        assert_eq!(
            lim.unwrap().keys().collect::<Vec<_>>(),
            ["cpu", "example.com/other"],
            "limits equal to their request go"
        );
        assert!(pod_ready(&trimmed[0]));
        assert_eq!(model(trimmed), model(pods));
    }

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
    fn each_policy_has_its_own_fence_key() {
        let n: Node =
            serde_json::from_value(json!({"metadata": {"name": "n"}, "spec": {"taints": [
            draining_taint("other"),
            {"key": LEGACY_DRAINING_TAINT, "value": "old", "effect": "NoSchedule"}]}}))
            .unwrap();
        assert_eq!(draining_taint_key("other"), "draining.gpu-defrag.io/other");
        assert!(!has_draining_taint(&n, "mine"));
        assert!(has_draining_taint(&n, "other"));
        assert!(
            has_draining_taint(&n, "old"),
            "an earlier single-key fence is still known"
        );
        assert_eq!(
            fence_owner("draining.gpu-defrag.io/other", Some("other")),
            Some("other".into())
        );
        assert_eq!(
            fence_owner(LEGACY_DRAINING_TAINT, Some("old")),
            Some("old".into())
        );
        assert_eq!(fence_owner("node.kubernetes.io/unschedulable", None), None);
    }

    #[test]
    fn long_policy_names_get_a_short_stable_distinct_id() {
        let a = format!("{}-a", "x".repeat(70));
        let b = format!("{}-b", "x".repeat(70));
        let (ia, ib) = (fence_id(&a), fence_id(&b));
        assert!(ia.len() <= 63 && ib.len() <= 63, "{ia}");
        assert_ne!(ia, ib);
        assert_eq!(ia, fence_id(&a), "stable");
        assert!(ia.starts_with(&"x".repeat(46)));
        assert_eq!(fence_id("nightly"), "nightly");
        assert_eq!(fence_id(&"y".repeat(63)), "y".repeat(63));
    }
}
