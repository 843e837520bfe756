//! Small helpers over Kubernetes objects and timestamps: no client, no shared state.
use std::borrow::Cow;

use chrono::{DateTime, SecondsFormat, Utc};
use gpu_defrag_api::{DRAINING_TAINT_DOMAIN, LEGACY_DRAINING_TAINT};
use gpu_defrag_core::compact::CompactPod;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::reflector::Lookup;
use kube::runtime::watcher;
use serde_json::json;

/// A pod as the watch cache holds it: its projection to what the model and the executor
/// read ([`CompactPod`]), a few hundred bytes where the whole object takes several
/// kilobytes (a reflector store needs a type of this crate to know it as a Pod).
#[derive(Debug, Clone, PartialEq)]
pub struct CachedPod(pub CompactPod);

impl CachedPod {
    /// The projection of a pod.
    pub fn of(p: &Pod) -> Self {
        CachedPod(CompactPod::of(p))
    }
}

impl std::ops::Deref for CachedPod {
    type Target = CompactPod;
    fn deref(&self) -> &CompactPod {
        &self.0
    }
}

impl Lookup for CachedPod {
    type DynamicType = ();
    fn kind(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("Pod")
    }
    fn group(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("")
    }
    fn version(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("v1")
    }
    fn plural(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("pods")
    }
    fn name(&self) -> Option<Cow<'_, str>> {
        Some(Cow::Borrowed(self.0.name.as_str()))
    }
    fn namespace(&self) -> Option<Cow<'_, str>> {
        Some(Cow::Borrowed(self.0.namespace.as_str()))
    }
    fn resource_version(&self) -> Option<Cow<'_, str>> {
        self.0.resource_version.as_deref().map(Cow::Borrowed)
    }
    fn uid(&self) -> Option<Cow<'_, str>> {
        (!self.0.uid.is_empty()).then_some(Cow::Borrowed(self.0.uid.as_str()))
    }
}

/// A pod watch event with the pod projected ([`CachedPod`]), for the cache.
pub fn cached_pod_event(e: watcher::Event<Pod>) -> watcher::Event<CachedPod> {
    use watcher::Event;
    match e {
        Event::Apply(p) => Event::Apply(CachedPod::of(&p)),
        Event::Delete(p) => Event::Delete(CachedPod::of(&p)),
        Event::Init => Event::Init,
        Event::InitApply(p) => Event::InitApply(CachedPod::of(&p)),
        Event::InitDone => Event::InitDone,
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
    fn the_cache_knows_a_projected_pod_as_the_pod() {
        use kube::runtime::reflector;
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ml", "uid": "u", "resourceVersion": "3"}
        }))
        .unwrap();
        let (store, mut w) = reflector::store::<CachedPod>();
        w.apply_watcher_event(&cached_pod_event(watcher::Event::Apply(pod.clone())));
        let key = reflector::ObjectRef::<CachedPod>::new("p").within("ml");
        assert_eq!(store.get(&key).map(|p| p.uid.clone()).as_deref(), Some("u"));
        w.apply_watcher_event(&cached_pod_event(watcher::Event::Delete(pod)));
        assert!(store.state().is_empty(), "deleted by name and namespace");
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
        assert_eq!(
            CachedPod::of(&p).controller_of(),
            Some(("ReplicaSet".into(), "rs".into()))
        );
        assert_eq!(CachedPod::of(&Pod::default()).controller_of(), None);
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
