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

/// Parses a snapshot from text (JSON if it starts with `{`, else YAML).
pub fn parse(text: &str) -> Result<Objects, SnapshotError> {
    if text.len() > MAX_SNAPSHOT_BYTES {
        return Err(SnapshotError::TooLarge(text.len()));
    }
    let list: List = if text.trim_start().starts_with('{') {
        serde_json::from_str(text).map_err(|e| SnapshotError::NotAList(short(e.to_string())))?
    } else {
        serde_norway::from_str(text).map_err(|e| SnapshotError::NotAList(short(e.to_string())))?
    };
    match list.kind.as_deref() {
        Some(k) if k.ends_with("List") => {}
        Some(k) => {
            return Err(SnapshotError::NotAList(format!(
                "kind is {k:?}, expected List"
            )));
        }
        None => return Err(SnapshotError::NotAList("no `kind: List` at the top".into())),
    }
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
            "Device" => {
                if item
                    .pointer("/metadata/name")
                    .and_then(|n| n.as_str())
                    .is_none()
                {
                    return Err(SnapshotError::BadItem {
                        index,
                        kind,
                        name: "<unnamed>".into(),
                        path: "metadata.name".into(),
                        message: "missing".into(),
                    });
                }
                objs.devices.push(item)
            }
            // Other kinds (Services, ConfigMaps, …) are not part of the model.
            _ => {}
        }
    }
    Ok(objs)
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
