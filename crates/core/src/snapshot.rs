//! Loading a saved cluster snapshot: a `v1` List (YAML or JSON), as
//! `kubectl get nodes,pods,pdb -A -o yaml` prints it, optionally with the pods' owners
//! (`replicasets,statefulsets,jobs`), `namespaces`, Volcano, KAI and Kubernetes
//! (`scheduling.k8s.io`) `podgroups` and Koordinator `Device` objects, and the DRA objects (`resourceslices,resourceclaims,
//! deviceclasses,devicetaintrules`, `resource.k8s.io/v1`). A kind the snapshot carries is "listed": the model
//! checks against it (a pod whose ReplicaSet is missing from a snapshot that has
//! ReplicaSets is never moved); a kind it lacks is reported as not checked. Errors name
//! the item and the field.
use k8s_openapi::api::core::v1 as corev1;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::resource::v1::{DeviceClass, DeviceTaintRule, ResourceClaim, ResourceSlice};
use serde::de::value::MapAccessDeserializer;
use serde::de::{
    DeserializeOwned, DeserializeSeed, Error as _, IgnoredAny, IntoDeserializer, MapAccess, Visitor,
};
use serde::{Deserialize, Deserializer};

use crate::ingest::Objects;

/// Largest snapshot accepted (bytes).
pub const MAX_SNAPSHOT_BYTES: usize = 2 * 1024 * 1024 * 1024;

/// Deepest nesting of YAML flow collections (`[`, `{`) accepted. The YAML parser's time
/// grows with the nesting depth for every token (100,000 nested `[` take tens of seconds),
/// and the deserializer refuses documents nested deeper than 128 levels anyway, so deeper
/// text is refused before parsing. Brackets are counted wherever they are, quoted strings
/// included; real snapshots (block YAML, JSON annotation values) stay far below.
pub const MAX_YAML_FLOW_DEPTH: usize = 128;

/// Whether `text` nests `[`/`{` no deeper than [`MAX_YAML_FLOW_DEPTH`] (a linear scan).
fn flow_depth_ok(text: &str) -> bool {
    let mut depth = 0usize;
    for b in text.bytes() {
        match b {
            b'[' | b'{' => {
                depth += 1;
                if depth > MAX_YAML_FLOW_DEPTH {
                    return false;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    true
}

/// A snapshot that could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// Not YAML/JSON, or not a List.
    #[error("snapshot is not a valid v1 List: {0}")]
    NotAList(String),
    /// An item could not be read as its kind.
    #[error("item {index} ({kind} {name}): field {path}: {message}")]
    BadItem {
        /// Position in `items`.
        index: usize,
        /// Its kind.
        kind: String,
        /// `namespace/name` or name.
        name: String,
        /// Field path.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// Too large.
    #[error("snapshot is {0} bytes, more than the {MAX_SNAPSHOT_BYTES} accepted")]
    TooLarge(usize),
}

#[derive(serde::Deserialize)]
struct List {
    #[serde(default)]
    items: Vec<serde_json::Value>,
    #[serde(default)]
    kind: Option<String>,
}

/// Keeps error messages one short line even when the parser quotes the input.
fn short(msg: String) -> String {
    let line = msg.lines().next().unwrap_or_default().to_string();
    if line.len() > 160 {
        format!("{}…", &line[..line.floor_char_boundary(160)])
    } else {
        line
    }
}

fn typed<T: DeserializeOwned>(
    index: usize,
    kind: &str,
    v: serde_json::Value,
) -> Result<T, SnapshotError> {
    let name = {
        let ns = v.pointer("/metadata/namespace").and_then(|x| x.as_str());
        let n = v
            .pointer("/metadata/name")
            .and_then(|x| x.as_str())
            .unwrap_or("<unnamed>");
        match ns {
            Some(ns) => format!("{ns}/{n}"),
            None => n.to_string(),
        }
    };
    serde_path_to_error::deserialize(v).map_err(|e| SnapshotError::BadItem {
        index,
        kind: kind.to_string(),
        name,
        path: e.path().to_string(),
        message: e.inner().to_string(),
    })
}

#[derive(serde::Deserialize)]
struct RawList<'a> {
    #[serde(borrow, default)]
    items: Vec<&'a serde_json::value::RawValue>,
    #[serde(default)]
    kind: Option<String>,
}

#[derive(serde::Deserialize)]
struct Head<'a> {
    #[serde(borrow, default)]
    kind: Option<std::borrow::Cow<'a, str>>,
}

/// A list item read in one pass: the fields before `kind` are buffered (kubectl prints
/// only `apiVersion` there), then the rest of the object streams into its type.
enum Item {
    Node(Box<corev1::Node>),
    Pod(Box<corev1::Pod>),
    Pdb(Box<PodDisruptionBudget>),
    Slice(Box<ResourceSlice>),
    Claim(Box<ResourceClaim>),
    Class(Box<DeviceClass>),
    Rule(Box<DeviceTaintRule>),
    Device(serde_json::Value),
    /// ReplicaSet, StatefulSet, Job, Namespace, PodGroup: read as a tree.
    Meta(String, serde_json::Value),
    Other,
}

impl<'de> Deserialize<'de> for Item {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(ItemVisitor)
    }
}

struct ItemVisitor;

impl<'de> Visitor<'de> for ItemVisitor {
    type Value = Item;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a Kubernetes object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Item, A::Error> {
        let mut front: Vec<(String, serde_json::Value)> = Vec::new();
        while let Some(key) = map.next_key::<String>()? {
            if key != "kind" {
                let v: serde_json::Value = map.next_value()?;
                front.push((key, v));
                continue;
            }
            let kind: String = map.next_value()?;
            front.push((key, serde_json::Value::String(kind.clone())));
            let rest = MapAccessDeserializer::new(Chain {
                front: front.into_iter(),
                pending: None,
                rest: map,
            });
            return Ok(match kind.as_str() {
                "Node" => Item::Node(Box::new(Deserialize::deserialize(rest)?)),
                "Pod" => Item::Pod(Box::new(Deserialize::deserialize(rest)?)),
                "PodDisruptionBudget" => Item::Pdb(Box::new(Deserialize::deserialize(rest)?)),
                "ResourceSlice" => Item::Slice(Box::new(Deserialize::deserialize(rest)?)),
                "ResourceClaim" => Item::Claim(Box::new(Deserialize::deserialize(rest)?)),
                "DeviceClass" => Item::Class(Box::new(Deserialize::deserialize(rest)?)),
                "DeviceTaintRule" => Item::Rule(Box::new(Deserialize::deserialize(rest)?)),
                "Device" => Item::Device(Deserialize::deserialize(rest)?),
                k if is_meta_kind(k) => Item::Meta(kind.clone(), Deserialize::deserialize(rest)?),
                _ => {
                    IgnoredAny::deserialize(rest)?;
                    Item::Other
                }
            });
        }
        Ok(Item::Other)
    }
}

/// The buffered entries, then the rest of the map.
struct Chain<A> {
    front: std::vec::IntoIter<(String, serde_json::Value)>,
    pending: Option<serde_json::Value>,
    rest: A,
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for Chain<A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        match self.front.next() {
            Some((k, v)) => {
                self.pending = Some(v);
                seed.deserialize(k.into_deserializer()).map(Some)
            }
            None => self.rest.next_key_seed(seed),
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, A::Error> {
        match self.pending.take() {
            Some(v) => seed.deserialize(v).map_err(A::Error::custom),
            None => self.rest.next_value_seed(seed),
        }
    }
}

#[derive(Deserialize)]
struct ItemList {
    #[serde(default)]
    items: Vec<Item>,
    #[serde(default)]
    kind: Option<String>,
}

/// JSON fast path: one pass over the text, each item streamed into its type. Any error
/// sends the text through the checked path, which names the item and field.
fn parse_json(text: &str) -> Result<Objects, SnapshotError> {
    let Ok(list) = serde_json::from_str::<ItemList>(text) else {
        return parse_json_checked(text);
    };
    check_kind(list.kind.as_deref())?;
    let mut objs = Objects::default();
    for (index, item) in list.items.into_iter().enumerate() {
        match item {
            Item::Node(n) => objs.nodes.push(*n),
            Item::Pod(p) => objs.pods.push(*p),
            Item::Pdb(p) => objs.pdbs.push(*p),
            Item::Slice(x) => objs.resource_slices.push(*x),
            Item::Claim(x) => objs.resource_claims.push(*x),
            Item::Class(x) => objs.device_classes.push(*x),
            Item::Rule(x) => objs.device_taint_rules.push(*x),
            Item::Device(d) => push_device(&mut objs, index, d)?,
            Item::Meta(kind, v) => push_meta(&mut objs, index, &kind, v)?,
            Item::Other => {}
        }
    }
    Ok(objs)
}

/// JSON with errors located: items are first split as raw text, each then read into its
/// type, and re-read with path tracking when that fails.
fn parse_json_checked(text: &str) -> Result<Objects, SnapshotError> {
    let list: RawList =
        serde_json::from_str(text).map_err(|e| SnapshotError::NotAList(short(e.to_string())))?;
    check_kind(list.kind.as_deref())?;
    let mut objs = Objects::default();
    for (index, raw) in list.items.into_iter().enumerate() {
        let head: Head = serde_json::from_str(raw.get())
            .map_err(|e| SnapshotError::NotAList(short(format!("item {index}: {e}"))))?;
        let kind = head.kind.as_deref().unwrap_or("");
        match kind {
            "Node" => objs.nodes.push(fast(index, kind, raw.get())?),
            "Pod" => objs.pods.push(fast(index, kind, raw.get())?),
            "PodDisruptionBudget" => objs.pdbs.push(fast(index, kind, raw.get())?),
            "ResourceSlice" => objs.resource_slices.push(fast(index, kind, raw.get())?),
            "ResourceClaim" => objs.resource_claims.push(fast(index, kind, raw.get())?),
            "DeviceClass" => objs.device_classes.push(fast(index, kind, raw.get())?),
            "DeviceTaintRule" => objs.device_taint_rules.push(fast(index, kind, raw.get())?),
            "Device" => {
                let v: serde_json::Value = serde_json::from_str(raw.get())
                    .map_err(|e| SnapshotError::NotAList(short(e.to_string())))?;
                push_device(&mut objs, index, v)?;
            }
            k if is_meta_kind(k) => {
                let v: serde_json::Value = serde_json::from_str(raw.get())
                    .map_err(|e| SnapshotError::NotAList(short(e.to_string())))?;
                push_meta(&mut objs, index, k, v)?;
            }
            _ => {}
        }
    }
    Ok(objs)
}

/// Deserialises an item straight into its type; only when that fails is it read again,
/// as a tree with path tracking, to name the object and field in the error.
fn fast<T: DeserializeOwned>(index: usize, kind: &str, raw: &str) -> Result<T, SnapshotError> {
    match serde_json::from_str::<T>(raw) {
        Ok(t) => Ok(t),
        Err(e) => {
            let v: serde_json::Value = serde_json::from_str(raw)
                .map_err(|_| SnapshotError::NotAList(short(format!("item {index}: {e}"))))?;
            typed::<T>(index, kind, v)
        }
    }
}

fn check_kind(kind: Option<&str>) -> Result<(), SnapshotError> {
    match kind {
        Some(k) if k.ends_with("List") => Ok(()),
        Some(k) => Err(SnapshotError::NotAList(format!(
            "kind is {k:?}, expected List"
        ))),
        None => Err(SnapshotError::NotAList("no `kind: List` at the top".into())),
    }
}

/// Parses a snapshot from text (JSON if it starts with `{`, else YAML). A snapshot is read
/// as of Kubernetes 1.37, where `DeviceTaintRule`s are served (a run could fence a single
/// DRA device), whether or not it lists any.
pub fn parse(text: &str) -> Result<Objects, SnapshotError> {
    let mut objs = parse_items(text)?;
    objs.listed.device_taint_rules = true;
    Ok(objs)
}

fn parse_items(text: &str) -> Result<Objects, SnapshotError> {
    if text.len() > MAX_SNAPSHOT_BYTES {
        return Err(SnapshotError::TooLarge(text.len()));
    }
    if text.trim_start().starts_with('{') {
        return parse_json(text);
    }
    if !flow_depth_ok(text) {
        return Err(SnapshotError::NotAList(format!(
            "YAML nested deeper than {MAX_YAML_FLOW_DEPTH} levels"
        )));
    }
    let list: List =
        serde_norway::from_str(text).map_err(|e| SnapshotError::NotAList(short(e.to_string())))?;
    check_kind(list.kind.as_deref())?;
    let mut objs = Objects::default();
    for (index, item) in list.items.into_iter().enumerate() {
        let kind = item
            .get("kind")
            .and_then(|k| k.as_str())
            .unwrap_or("")
            .to_string();
        match kind.as_str() {
            "Node" => objs.nodes.push(typed::<corev1::Node>(index, &kind, item)?),
            "Pod" => objs.pods.push(typed::<corev1::Pod>(index, &kind, item)?),
            "PodDisruptionBudget" => objs
                .pdbs
                .push(typed::<PodDisruptionBudget>(index, &kind, item)?),
            "ResourceSlice" => objs
                .resource_slices
                .push(typed::<ResourceSlice>(index, &kind, item)?),
            "ResourceClaim" => objs
                .resource_claims
                .push(typed::<ResourceClaim>(index, &kind, item)?),
            "DeviceClass" => objs
                .device_classes
                .push(typed::<DeviceClass>(index, &kind, item)?),
            "DeviceTaintRule" => objs
                .device_taint_rules
                .push(typed::<DeviceTaintRule>(index, &kind, item)?),
            "Device" => push_device(&mut objs, index, item)?,
            k if is_meta_kind(k) => push_meta(&mut objs, index, k, item)?,
            // Other kinds (Services, ConfigMaps, …) are not part of the model.
            _ => {}
        }
    }
    Ok(objs)
}

/// Kinds read for their metadata (owner chains, namespace opt-outs) or as pod groups.
fn is_meta_kind(kind: &str) -> bool {
    matches!(
        kind,
        "ReplicaSet" | "StatefulSet" | "Job" | "Namespace" | "PodGroup"
    )
}

/// Keeps an owner object (its metadata), a Namespace (its metadata) or a Volcano, KAI or
/// Kubernetes (`scheduling.k8s.io`) PodGroup (as is), and marks its kind listed. Objects
/// of the same kind name in other API groups (a CRD called `Job`, say) are not these and
/// are ignored.
fn push_meta(
    objs: &mut Objects,
    index: usize,
    kind: &str,
    item: serde_json::Value,
) -> Result<(), SnapshotError> {
    let group = item
        .get("apiVersion")
        .and_then(|v| v.as_str())
        .map(crate::workload::api_group)
        .unwrap_or_default();
    if kind == "PodGroup" {
        match group.as_str() {
            crate::workload::VOLCANO_GROUP_API => objs.listed.volcano_pod_groups = true,
            crate::workload::KAI_GROUP_API => objs.listed.kai_pod_groups = true,
            crate::workload::SCHEDULING_GROUP_API => objs.listed.scheduling_pod_groups = true,
            _ => return Ok(()),
        }
        objs.pod_groups.push(item);
        return Ok(());
    }
    let controller = crate::workload::ControllerKind::of(&group, kind);
    if controller.is_none() && !(kind == "Namespace" && group.is_empty()) {
        return Ok(());
    }
    #[derive(Deserialize)]
    struct MetaOnly {
        #[serde(default)]
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    }
    let meta = typed::<MetaOnly>(index, kind, item)?.metadata;
    match controller {
        Some(k) => {
            match k {
                crate::workload::ControllerKind::ReplicaSet => objs.listed.replica_sets = true,
                crate::workload::ControllerKind::StatefulSet => objs.listed.stateful_sets = true,
                crate::workload::ControllerKind::Job => objs.listed.jobs = true,
            }
            objs.controllers.push(crate::workload::ControllerObject {
                kind: k,
                metadata: meta,
            });
        }
        None => {
            objs.listed.namespaces = true;
            objs.namespaces.push(meta);
        }
    }
    Ok(())
}

/// Keeps a Koordinator `Device` object (it must be named after its node).
fn push_device(
    objs: &mut Objects,
    index: usize,
    item: serde_json::Value,
) -> Result<(), SnapshotError> {
    if item
        .pointer("/metadata/name")
        .and_then(|n| n.as_str())
        .is_none()
    {
        return Err(SnapshotError::BadItem {
            index,
            kind: "Device".into(),
            name: "<unnamed>".into(),
            path: "metadata.name".into(),
            message: "missing".into(),
        });
    }
    objs.devices.push(item);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_item_and_field() {
        let text = r#"{"apiVersion":"v1","kind":"List","items":[
            {"apiVersion":"v1","kind":"Node","metadata":{"name":"a"}},
            {"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"ns"},"spec":{"containers":"oops"}}]}"#;
        let e = parse(text).unwrap_err().to_string();
        assert!(e.contains("item 1 (Pod ns/p)"), "{e}");
        assert!(e.contains("spec.containers"), "{e}");
    }

    /// The one-pass reader and the checked reader agree, wherever `kind` sits.
    #[test]
    fn one_pass_matches_checked_path() {
        let text = r#"{"items":[
            {"apiVersion":"v1","kind":"Node","metadata":{"name":"a","labels":{"x":"y"}},
             "status":{"allocatable":{"nvidia.com/gpu":"8"}}},
            {"metadata":{"name":"p","namespace":"ns","annotations":{"k":"v"}},
             "spec":{"nodeName":"a","containers":[{"name":"c","resources":{"limits":{"nvidia.com/gpu":"2"}}}]},
             "status":{"phase":"Running"},"apiVersion":"v1","kind":"Pod"},
            {"kind":"Service","apiVersion":"v1","metadata":{"name":"s"},"spec":{"ports":[{"port":1}]}},
            {"apiVersion":"policy/v1","kind":"PodDisruptionBudget","metadata":{"name":"b","namespace":"ns"},
             "spec":{"maxUnavailable":1},"status":{"disruptionsAllowed":1,"currentHealthy":1,"desiredHealthy":1,"expectedPods":1}},
            {"apiVersion":"scheduling.koordinator.sh/v1alpha1","kind":"Device","metadata":{"name":"a"},"spec":{"devices":[]}},
            {"apiVersion":"v1","metadata":{"name":"nokind"}}
          ],"kind":"List","apiVersion":"v1"}"#;
        let one = parse_json(text).unwrap();
        let checked = parse_json_checked(text).unwrap();
        assert_eq!(one.nodes, checked.nodes);
        assert_eq!(one.pods, checked.pods);
        assert_eq!(one.pdbs, checked.pdbs);
        assert_eq!(one.devices, checked.devices);
        assert_eq!(
            (
                one.nodes.len(),
                one.pods.len(),
                one.pdbs.len(),
                one.devices.len()
            ),
            (1, 1, 1, 1)
        );
        assert_eq!(one.pods[0].metadata.namespace.as_deref(), Some("ns"));
        assert_eq!(
            one.pods[0].spec.as_ref().unwrap().node_name.as_deref(),
            Some("a")
        );
    }

    /// Errors found in one pass are reported by the checked path, naming the item.
    #[test]
    fn one_pass_errors_fall_back_to_located_errors() {
        let text = r#"{"kind":"List","items":[{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p","namespace":"n"},"spec":{"containers":[{"name":1}]}}]}"#;
        let e = parse(text).unwrap_err().to_string();
        assert!(e.contains("item 0 (Pod n/p)"), "{e}");
        assert!(e.contains("spec.containers[0].name"), "{e}");
        let e = parse(r#"{"kind":"List","items":[{"kind":"Device","metadata":{}}]}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("item 0 (Device"), "{e}");
        assert!(parse(r#"{"kind":"Pod","items":[]}"#).is_err());
        assert!(parse(r#"{"kind":"List","items":[{"kind":7}]}"#).is_err());
    }

    #[test]
    fn yaml_and_json_both_load() {
        let y = "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Node\n  metadata: {name: n1}\n";
        assert_eq!(parse(y).unwrap().nodes.len(), 1);
        assert!(parse("kind: Pod\n").is_err());
        assert!(parse("::: not yaml [").is_err());
    }
}
