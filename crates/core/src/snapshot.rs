//! Loading a saved cluster snapshot: a `v1` List (YAML or JSON), as
//! `kubectl get nodes,pods,pdb -A -o yaml` prints it, optionally with Koordinator
//! `Device` objects. Errors name the item and the field.
use k8s_openapi::api::core::v1 as corev1;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use serde::de::DeserializeOwned;

use crate::ingest::Objects;

/// Largest snapshot accepted (bytes).
pub const MAX_SNAPSHOT_BYTES: usize = 2 * 1024 * 1024 * 1024;

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

/// JSON fast path: items are deserialised straight into their types (no intermediate
/// JSON tree), which matters for snapshots of 200,000 pods.
fn parse_json(text: &str) -> Result<Objects, SnapshotError> {
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
            "Device" => {
                let v: serde_json::Value = serde_json::from_str(raw.get())
                    .map_err(|e| SnapshotError::NotAList(short(e.to_string())))?;
                push_device(&mut objs, index, v)?;
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

/// Parses a snapshot from text (JSON if it starts with `{`, else YAML).
pub fn parse(text: &str) -> Result<Objects, SnapshotError> {
    if text.len() > MAX_SNAPSHOT_BYTES {
        return Err(SnapshotError::TooLarge(text.len()));
    }
    if text.trim_start().starts_with('{') {
        return parse_json(text);
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
            "Device" => push_device(&mut objs, index, item)?,
            // Other kinds (Services, ConfigMaps, …) are not part of the model.
            _ => {}
        }
    }
    Ok(objs)
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

    #[test]
    fn yaml_and_json_both_load() {
        let y = "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Node\n  metadata: {name: n1}\n";
        assert_eq!(parse(y).unwrap().nodes.len(), 1);
        assert!(parse("kind: Pod\n").is_err());
        assert!(parse("::: not yaml [").is_err());
    }
}
