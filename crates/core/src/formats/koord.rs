//! Koordinator records: the pod annotation `scheduling.koordinator.sh/device-allocated` and the
//! cluster-scoped `Device` object (one per node, named after it).
//!
//! Resource values are Kubernetes quantities; the scheduler writes them as JSON strings
//! (`"100"`, `"16Gi"`), while documentation examples use bare numbers (`100`). Both are accepted.

use std::collections::BTreeSet;

use serde_json::{Map, Value};

use super::common::{
    at, check_id, checked_record, json_bool, json_kind, json_str, json_uint, parse_json, snippet,
};
use super::quantity::parse_milli;
use super::{FormatError, MAX_DEVICE_MEM_BYTES, MAX_DEVICES_PER_NODE, keys};

/// One GPU entry of a pod's `device-allocated` record.
#[derive(Debug, Clone, PartialEq)]
pub struct KoordGpuAlloc {
    /// GPU minor number on the node (`/dev/nvidia<minor>`).
    pub minor: u32,
    /// `koordinator.sh/gpu-core`: compute in percent of one GPU (100 = the whole GPU).
    pub core: Option<u32>,
    /// `koordinator.sh/gpu-memory-ratio`: memory in percent of the GPU's memory.
    pub memory_ratio: Option<u32>,
    /// `koordinator.sh/gpu-memory`: memory in bytes (at most [`super::MAX_DEVICE_MEM_BYTES`]).
    pub memory_bytes: Option<u64>,
}

/// Reads `scheduling.koordinator.sh/device-allocated`, a JSON map from device type to
/// allocations, e.g. `{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":100,
/// "koordinator.sh/gpu-memory":"16Gi"}}],"rdma":[...]}`.
///
/// Returns the `"gpu"` entries only (an empty `Vec` when there are none); other device types and
/// unknown fields are ignored. Errors on a missing or repeated `minor`, on resource values that
/// are not non-negative quantities (`gpu-core` and `gpu-memory-ratio` must be whole numbers),
/// and on more than [`MAX_DEVICES_PER_NODE`] GPU entries.
pub fn parse_koord_device_allocated(value: &str) -> Result<Vec<KoordGpuAlloc>, FormatError> {
    const KEY: &str = keys::KOORD_DEVICE_ALLOCATED;
    let t = checked_record(KEY, value)?;
    let v = parse_json(KEY, t)?;
    let Value::Object(map) = v else {
        return Err(FormatError::Malformed {
            key: KEY,
            detail: format!(
                "expected a JSON object of device types, got {}",
                json_kind(&v)
            ),
        });
    };
    let entries = match map.get("gpu") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(a)) => a,
        Some(other) => {
            return Err(FormatError::Malformed {
                key: KEY,
                detail: format!("\"gpu\" must be an array, got {}", json_kind(other)),
            });
        }
    };
    if entries.len() > MAX_DEVICES_PER_NODE {
        return Err(FormatError::TooMany {
            key: KEY,
            what: "GPU entries",
            max: MAX_DEVICES_PER_NODE,
        });
    }
    let mut minors = BTreeSet::new();
    let mut out = Vec::with_capacity(entries.len());
    for (i, e) in entries.iter().enumerate() {
        let a = alloc_entry(KEY, e).map_err(|err| at(err, &format!("gpu entry {i}")))?;
        if !minors.insert(a.minor) {
            return Err(FormatError::Duplicate {
                key: KEY,
                what: "GPU minor",
                value: a.minor.to_string(),
            });
        }
        out.push(a);
    }
    Ok(out)
}

fn alloc_entry(key: &'static str, e: &Value) -> Result<KoordGpuAlloc, FormatError> {
    let obj = as_object(key, "GPU entry", e)?;
    let minor = obj.get("minor").ok_or_else(|| FormatError::Missing {
        key,
        what: "field \"minor\"".into(),
    })?;
    let minor = json_uint(key, "minor", minor, MAX_DEVICES_PER_NODE as u64 - 1)? as u32;
    let res = resources(key, obj)?;
    Ok(KoordGpuAlloc {
        minor,
        core: res
            .map(|r| count_res(key, r, keys::KOORD_GPU_CORE))
            .transpose()?
            .flatten(),
        memory_ratio: res
            .map(|r| count_res(key, r, keys::KOORD_GPU_MEMORY_RATIO))
            .transpose()?
            .flatten(),
        memory_bytes: res.map(|r| bytes_res(key, r)).transpose()?.flatten(),
    })
}

/// One GPU of a Koordinator `Device` object.
#[derive(Debug, Clone, PartialEq)]
pub struct KoordDevice {
    /// GPU minor number on the node.
    pub minor: u32,
    /// GPU UUID (`id`), when present.
    pub uuid: Option<String>,
    /// The `health` flag (absent means false, as in the CRD default).
    pub healthy: bool,
    /// `koordinator.sh/gpu-memory` capacity in bytes, when present.
    pub memory_bytes: Option<u64>,
    /// `koordinator.sh/gpu-core` capacity (100 per GPU), when present.
    pub core: Option<u32>,
}

/// Reads a Koordinator `Device` object (already decoded from JSON): returns `metadata.name`
/// (the node's name) and the `spec.devices[]` entries of type `"gpu"`. Other device types are
/// ignored; a missing `spec` or `devices` gives an empty list.
///
/// Errors when `metadata.name` is missing, when `kind` is present but not `Device`, on a GPU
/// entry without `minor`, on repeated minors or UUIDs, on bad resource quantities, and on more
/// than [`MAX_DEVICES_PER_NODE`] GPUs.
pub fn parse_koord_device_object(obj: &Value) -> Result<(String, Vec<KoordDevice>), FormatError> {
    const KEY: &str = keys::KOORD_DEVICE_OBJECT;
    let root = as_object(KEY, "Device object", obj)?;
    if let Some(kind) = root.get("kind") {
        let kind = json_str(KEY, "kind", kind)?;
        if kind != "Device" {
            return Err(FormatError::Malformed {
                key: KEY,
                detail: format!("kind is {}, expected \"Device\"", snippet(kind)),
            });
        }
    }
    let name = root
        .get("metadata")
        .and_then(|m| m.get("name"))
        .ok_or_else(|| FormatError::Missing {
            key: KEY,
            what: "metadata.name".into(),
        })?;
    let name = check_id(KEY, "metadata.name", json_str(KEY, "metadata.name", name)?)?;
    let at_node = |e| at(e, &format!("node {}", snippet(&name)));

    let devices = match root.get("spec").and_then(|s| s.get("devices")) {
        None | Some(Value::Null) => return Ok((name, Vec::new())),
        Some(Value::Array(a)) => a,
        Some(other) => {
            return Err(at_node(FormatError::Malformed {
                key: KEY,
                detail: format!("spec.devices must be an array, got {}", json_kind(other)),
            }));
        }
    };
    let mut out: Vec<KoordDevice> = Vec::new();
    let mut minors = BTreeSet::new();
    let mut uuids = BTreeSet::new();
    for (i, d) in devices.iter().enumerate() {
        let d = as_object(KEY, "device", d).map_err(|e| at_node(at(e, &format!("device {i}"))))?;
        match d.get("type") {
            Some(Value::String(s)) if s == "gpu" => {}
            _ => continue,
        }
        if out.len() == MAX_DEVICES_PER_NODE {
            return Err(at_node(FormatError::TooMany {
                key: KEY,
                what: "GPUs",
                max: MAX_DEVICES_PER_NODE,
            }));
        }
        let dev = device_entry(KEY, d).map_err(|e| at_node(at(e, &format!("device {i}"))))?;
        if !minors.insert(dev.minor) {
            return Err(at_node(FormatError::Duplicate {
                key: KEY,
                what: "GPU minor",
                value: dev.minor.to_string(),
            }));
        }
        if let Some(u) = &dev.uuid
            && !uuids.insert(u.clone())
        {
            return Err(at_node(FormatError::Duplicate {
                key: KEY,
                what: "GPU UUID",
                value: snippet(u),
            }));
        }
        out.push(dev);
    }
    Ok((name, out))
}

fn device_entry(key: &'static str, d: &Map<String, Value>) -> Result<KoordDevice, FormatError> {
    let minor = match d.get("minor") {
        None | Some(Value::Null) => {
            return Err(FormatError::Missing {
                key,
                what: "field \"minor\"".into(),
            });
        }
        Some(m) => json_uint(key, "minor", m, MAX_DEVICES_PER_NODE as u64 - 1)? as u32,
    };
    let uuid = match d.get("id") {
        None | Some(Value::Null) => None,
        Some(v) => {
            let s = json_str(key, "id", v)?;
            if s.trim().is_empty() {
                None
            } else {
                Some(check_id(key, "id", s)?)
            }
        }
    };
    let healthy = match d.get("health") {
        None | Some(Value::Null) => false,
        Some(v) => json_bool(key, "health", v)?,
    };
    let res = resources(key, d)?;
    Ok(KoordDevice {
        minor,
        uuid,
        healthy,
        memory_bytes: res.map(|r| bytes_res(key, r)).transpose()?.flatten(),
        core: res
            .map(|r| count_res(key, r, keys::KOORD_GPU_CORE))
            .transpose()?
            .flatten(),
    })
}

fn as_object<'a>(
    key: &'static str,
    what: &str,
    v: &'a Value,
) -> Result<&'a Map<String, Value>, FormatError> {
    v.as_object().ok_or_else(|| FormatError::Malformed {
        key,
        detail: format!("{what} must be an object, got {}", json_kind(v)),
    })
}

/// The `resources` map of an entry, if any.
fn resources<'a>(
    key: &'static str,
    obj: &'a Map<String, Value>,
) -> Result<Option<&'a Map<String, Value>>, FormatError> {
    match obj.get("resources") {
        None | Some(Value::Null) => Ok(None),
        Some(v) => as_object(key, "resources", v).map(Some),
    }
}

/// A resource quantity in thousandths, from a JSON string or number; `None` when absent.
fn quantity_res(
    key: &'static str,
    res: &Map<String, Value>,
    name: &'static str,
) -> Result<Option<u128>, FormatError> {
    let text = match res.get(name) {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        Some(other) => {
            return Err(FormatError::Malformed {
                key,
                detail: format!("{name} must be a quantity, got {}", json_kind(other)),
            });
        }
    };
    parse_milli(key, &text, true)
        .map(Some)
        .map_err(|e| at(e, name))
}

fn count_res(
    key: &'static str,
    res: &Map<String, Value>,
    name: &'static str,
) -> Result<Option<u32>, FormatError> {
    let Some(milli) = quantity_res(key, res, name)? else {
        return Ok(None);
    };
    if milli % 1000 != 0 {
        return Err(FormatError::Malformed {
            key,
            detail: format!("{name} is not a whole number"),
        });
    }
    u32::try_from(milli / 1000)
        .map(Some)
        .map_err(|_| FormatError::OutOfRange {
            key,
            field: name,
            detail: format!("exceeds {}", u32::MAX),
        })
}

fn bytes_res(key: &'static str, res: &Map<String, Value>) -> Result<Option<u64>, FormatError> {
    let name = keys::KOORD_GPU_MEMORY;
    let Some(milli) = quantity_res(key, res, name)? else {
        return Ok(None);
    };
    let bytes = milli.div_ceil(1000);
    if bytes > u128::from(MAX_DEVICE_MEM_BYTES) {
        return Err(FormatError::OutOfRange {
            key,
            field: name,
            detail: format!("exceeds {MAX_DEVICE_MEM_BYTES} bytes"),
        });
    }
    Ok(Some(bytes as u64))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    /// The example from PEERS.md.
    const ALLOCATED: &str = r#"{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":100,"koordinator.sh/gpu-memory-ratio":100,"koordinator.sh/gpu-memory":"16Gi"}}],"rdma":[{"minor":0,"id":"0000:09:00.0","resources":{"koordinator.sh/rdma":100}}]}"#;

    fn err_text<T: std::fmt::Debug>(r: Result<T, FormatError>) -> String {
        r.expect_err("expected an error").to_string()
    }

    #[test]
    fn device_allocated_example() {
        assert_eq!(
            parse_koord_device_allocated(ALLOCATED),
            Ok(vec![KoordGpuAlloc {
                minor: 0,
                core: Some(100),
                memory_ratio: Some(100),
                memory_bytes: Some(16 << 30),
            }])
        );
    }

    #[test]
    fn device_allocated_as_the_scheduler_writes_it() {
        // corev1.ResourceList serialises quantities as strings; shared GPUs on two minors.
        let v = r#"{"gpu":[{"minor":1,"resources":{"koordinator.sh/gpu-core":"50","koordinator.sh/gpu-memory":"8589934592","koordinator.sh/gpu-memory-ratio":"50"},"extension":{"vfs":[{"minor":3,"busID":"0000:1f:00.3"}]}},{"minor":3,"resources":{"koordinator.sh/gpu-core":"50","koordinator.sh/gpu-memory-ratio":"50"}}],"fpga":[]}"#;
        let a = parse_koord_device_allocated(v).unwrap();
        assert_eq!(a.len(), 2);
        assert_eq!(a[0].core, Some(50));
        assert_eq!(a[0].memory_bytes, Some(8 << 30));
        assert_eq!(a[1].memory_bytes, None);
        assert_eq!(a[1].minor, 3);
        // No GPU entries.
        assert_eq!(parse_koord_device_allocated(r#"{"rdma":[]}"#), Ok(vec![]));
        assert_eq!(parse_koord_device_allocated(r#"{"gpu":null}"#), Ok(vec![]));
        assert_eq!(
            parse_koord_device_allocated(r#"{"gpu":[{"minor":2}]}"#),
            Ok(vec![KoordGpuAlloc {
                minor: 2,
                core: None,
                memory_ratio: None,
                memory_bytes: None
            }])
        );
    }

    #[test]
    fn device_allocated_errors() {
        for (bad, want) in [
            ("", "empty value"),
            ("{", "invalid JSON"),
            ("[]", "expected a JSON object of device types, got an array"),
            (r#"{"gpu":{}}"#, "\"gpu\" must be an array, got an object"),
            (
                r#"{"gpu":[1]}"#,
                "GPU entry must be an object, got a number (gpu entry 0)",
            ),
            (
                r#"{"gpu":[{"resources":{}}]}"#,
                "missing field \"minor\" (gpu entry 0)",
            ),
            (r#"{"gpu":[{"minor":-1}]}"#, "minor must not be negative"),
            (
                r#"{"gpu":[{"minor":"0"}]}"#,
                "minor must be a number, got a string",
            ),
            (r#"{"gpu":[{"minor":99999999999}]}"#, "minor exceeds 63"),
            (
                r#"{"gpu":[{"minor":0},{"minor":0}]}"#,
                "duplicate GPU minor 0",
            ),
            (
                r#"{"gpu":[{"minor":0,"resources":[]}]}"#,
                "resources must be an object",
            ),
            (
                r#"{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"lots"}}]}"#,
                "not a quantity: \"lots\" (koordinator.sh/gpu-core) (gpu entry 0)",
            ),
            (
                r#"{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":-5}}]}"#,
                "must not be negative",
            ),
            (
                r#"{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"50.5"}}]}"#,
                "koordinator.sh/gpu-core is not a whole number",
            ),
            (
                r#"{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"5e12"}}]}"#,
                "koordinator.sh/gpu-core exceeds",
            ),
            (
                r#"{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-memory":"2Pi"}}]}"#,
                "koordinator.sh/gpu-memory exceeds",
            ),
            (
                r#"{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-memory":true}}]}"#,
                "must be a quantity, got a boolean",
            ),
        ] {
            let got = err_text(parse_koord_device_allocated(bad));
            assert!(
                got.starts_with("scheduling.koordinator.sh/device-allocated: "),
                "{got}"
            );
            assert!(got.contains(want), "{bad:?}: {got}");
        }
        let deep = format!("{{\"gpu\":{}", "[".repeat(10_000));
        assert!(err_text(parse_koord_device_allocated(&deep)).contains("recursion limit"));
        let many = format!(
            r#"{{"gpu":[{}]}}"#,
            (0..65)
                .map(|i| format!(r#"{{"minor":{i}}}"#))
                .collect::<Vec<_>>()
                .join(",")
        );
        assert!(matches!(
            parse_koord_device_allocated(&many),
            Err(FormatError::TooMany { .. })
        ));
        assert!(matches!(
            parse_koord_device_allocated(&" ".repeat(1 << 20)),
            Err(FormatError::TooLarge { .. })
        ));
    }

    fn device_object() -> Value {
        json!({
            "apiVersion": "scheduling.koordinator.sh/v1alpha1",
            "kind": "Device",
            "metadata": {"name": "gpu-node-7", "resourceVersion": "123"},
            "spec": {"devices": [
                {"type": "gpu", "id": "GPU-2a3b4c5d-0000-1111-2222-333344445555", "minor": 0, "moduleID": 0,
                 "health": true,
                 "resources": {"koordinator.sh/gpu-core": "100", "koordinator.sh/gpu-memory": "80Gi",
                               "koordinator.sh/gpu-memory-ratio": "100"},
                 "topology": {"socketID": 0, "nodeID": 0, "pcieID": "pci0000:3a", "busID": "0000:3b:00.0"}},
                {"type": "gpu", "id": "GPU-2a3b4c5d-0000-1111-2222-333344445556", "minor": 1, "moduleID": 1,
                 "health": false,
                 "resources": {"koordinator.sh/gpu-core": "100", "koordinator.sh/gpu-memory": "85899345920",
                               "koordinator.sh/gpu-memory-ratio": "100"}},
                {"type": "rdma", "id": "0000:1f:00.0", "minor": 0, "health": true,
                 "resources": {"koordinator.sh/rdma": "100"}}
            ]},
            "status": {}
        })
    }

    #[test]
    fn device_object_example() {
        let (name, devs) = parse_koord_device_object(&device_object()).unwrap();
        assert_eq!(name, "gpu-node-7");
        assert_eq!(devs.len(), 2);
        assert_eq!(
            devs[0],
            KoordDevice {
                minor: 0,
                uuid: Some("GPU-2a3b4c5d-0000-1111-2222-333344445555".into()),
                healthy: true,
                memory_bytes: Some(80 << 30),
                core: Some(100),
            }
        );
        assert!(!devs[1].healthy);
        assert_eq!(devs[1].memory_bytes, Some(80 << 30));
        let (_, none) = parse_koord_device_object(&json!({"metadata": {"name": "n"}})).unwrap();
        assert!(none.is_empty());
        let (_, d) = parse_koord_device_object(
            &json!({"metadata": {"name": "n"}, "spec": {"devices": [{"type": "gpu", "minor": 4}]}}),
        )
        .unwrap();
        assert_eq!(
            d,
            vec![KoordDevice {
                minor: 4,
                uuid: None,
                healthy: false,
                memory_bytes: None,
                core: None
            }]
        );
    }

    #[test]
    fn device_object_errors() {
        let with = |f: &dyn Fn(&mut Value)| {
            let mut v = device_object();
            f(&mut v);
            err_text(parse_koord_device_object(&v))
        };
        let cases: Vec<(String, &str)> = vec![
            (
                err_text(parse_koord_device_object(&json!([]))),
                "Device object must be an object, got an array",
            ),
            (
                err_text(parse_koord_device_object(&json!({}))),
                "missing metadata.name",
            ),
            (with(&|v| v["kind"] = json!("Pod")), "kind is \"Pod\""),
            (
                with(&|v| v["metadata"]["name"] = json!(5)),
                "metadata.name must be a string",
            ),
            (
                with(&|v| v["metadata"]["name"] = json!("")),
                "metadata.name is empty",
            ),
            (
                with(&|v| v["spec"]["devices"] = json!({})),
                "spec.devices must be an array",
            ),
            (
                with(&|v| v["spec"]["devices"][0]["minor"] = json!(null)),
                "missing field \"minor\" (device 0) (node \"gpu-node-7\")",
            ),
            (
                with(&|v| v["spec"]["devices"][1]["minor"] = json!(0)),
                "duplicate GPU minor 0",
            ),
            (
                with(&|v| v["spec"]["devices"][1]["id"] = v["spec"]["devices"][0]["id"].clone()),
                "duplicate GPU UUID",
            ),
            (
                with(&|v| v["spec"]["devices"][0]["health"] = json!("maybe")),
                "health is not a boolean",
            ),
            (
                with(&|v| v["spec"]["devices"][0]["id"] = json!("GPU 1")),
                "id has a forbidden character",
            ),
            (
                with(&|v| {
                    v["spec"]["devices"][0]["resources"]["koordinator.sh/gpu-memory"] =
                        json!("80GB")
                }),
                "unknown suffix",
            ),
            (
                with(&|v| v["spec"]["devices"][0] = json!("gpu")),
                "device must be an object, got a string (device 0)",
            ),
        ];
        for (got, want) in cases {
            assert!(got.starts_with("Device: "), "{got}");
            assert!(got.contains(want), "got {got:?}, want {want:?}");
        }
        let many: Vec<Value> = (0..65)
            .map(|i| json!({"type": "gpu", "minor": i % 64}))
            .collect();
        assert!(matches!(
            parse_koord_device_object(
                &json!({"metadata": {"name": "n"}, "spec": {"devices": many}})
            ),
            Err(FormatError::TooMany { .. })
        ));
    }

    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            any::<f64>().prop_map(|f| json!(f)),
            "[a-z0-9.\\-]{0,8}".prop_map(Value::String),
            Just(json!("gpu")),
            Just(json!("16Gi")),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            let keys = prop_oneof![
                Just("gpu".to_string()),
                Just("minor".to_string()),
                Just("resources".to_string()),
                Just("koordinator.sh/gpu-core".to_string()),
                Just("koordinator.sh/gpu-memory".to_string()),
                Just("type".to_string()),
                Just("id".to_string()),
                Just("health".to_string()),
                Just("spec".to_string()),
                Just("devices".to_string()),
                Just("metadata".to_string()),
                Just("name".to_string()),
                "[a-z]{1,4}",
            ];
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                proptest::collection::btree_map(keys, inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn never_panics_on_text(s in ".{0,200}") {
            let _ = parse_koord_device_allocated(&s);
        }

        #[test]
        fn never_panics_on_bytes(b in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = parse_koord_device_allocated(&String::from_utf8_lossy(&b));
        }

        #[test]
        fn never_panics_on_json(v in arb_json()) {
            let _ = parse_koord_device_allocated(&v.to_string());
            let _ = parse_koord_device_object(&v);
            let _ = parse_koord_device_object(&json!({"metadata": {"name": "n"}, "spec": {"devices": [v.clone()]}}));
            let _ = parse_koord_device_allocated(&json!({"gpu": [v]}).to_string());
        }

        #[test]
        fn allocated_round_trip(entries in proptest::collection::btree_map(
            0u32..64,
            (proptest::option::of(0u32..=100), proptest::option::of(0u32..=100), proptest::option::of(0u64..=(80u64 << 30))),
            0..8,
        )) {
            let want: Vec<KoordGpuAlloc> = entries.iter().map(|(&minor, &(core, memory_ratio, memory_bytes))| {
                KoordGpuAlloc { minor, core, memory_ratio, memory_bytes }
            }).collect();
            let gpu: Vec<Value> = want.iter().map(|a| {
                let mut r = Map::new();
                if let Some(c) = a.core { r.insert(keys::KOORD_GPU_CORE.into(), json!(c)); }
                if let Some(c) = a.memory_ratio { r.insert(keys::KOORD_GPU_MEMORY_RATIO.into(), json!(c.to_string())); }
                if let Some(b) = a.memory_bytes { r.insert(keys::KOORD_GPU_MEMORY.into(), json!(b.to_string())); }
                json!({"minor": a.minor, "resources": r})
            }).collect();
            let text = json!({"gpu": gpu}).to_string();
            prop_assert_eq!(parse_koord_device_allocated(&text), Ok(want));
        }
    }
}
