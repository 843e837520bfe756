//! HAMi records, and the Volcano vGPU records that share HAMi's pod format.
//!
//! * Node inventory `hami.io/node-nvidia-register`: a JSON array since HAMi v2.8.0, a
//!   `UUID,count,devmem,devcore,type,numa,health[,index,mode]:` string before.
//! * Node inventory `volcano.sh/node-vgpu-register`: `UUID,count,devmem,type,health,mode:`.
//! * Pod record `hami.io/vgpu-devices-allocated` / `volcano.sh/vgpu-ids-new`: per container a
//!   list of `UUID,Type,usedMemMiB,usedCores:` devices, each container ended by `;`.

use std::collections::BTreeSet;

use serde_json::Value;

use super::common::{
    at, check_id, check_text, checked_record, json_bool, json_kind, json_str, json_uint,
    parse_bool, parse_index, parse_json, parse_u32, parse_uint, snippet,
};
use super::{FormatError, MAX_CONTAINERS, MAX_DEVICE_MEM_MIB, MAX_DEVICES_PER_NODE, keys};

/// One physical GPU as a HAMi (or Volcano vGPU) device plugin registers it on its node.
#[derive(Debug, Clone, PartialEq)]
pub struct HamiNodeDevice {
    /// GPU UUID (`GPU-…`), unique within the node.
    pub id: String,
    /// Device index on the node, when the record carries one.
    pub index: Option<u32>,
    /// Number of vGPU slots the GPU is split into (how many containers may share it).
    pub count: u32,
    /// Device memory in MiB (at most [`super::MAX_DEVICE_MEM_MIB`]).
    pub devmem_mib: u64,
    /// Compute capacity in percent of the GPU, usually 100.
    pub devcore: u32,
    /// GPU model (the `type` field), e.g. `NVIDIA-Tesla V100-PCIE-32GB`.
    pub model: String,
    /// NUMA node, when known (`-1` in the record means unknown).
    pub numa: Option<u32>,
    /// Whether the device plugin reports the GPU healthy.
    pub healthy: bool,
    /// Sharing mode (`hami-core`, `mig`, `mps`), when the record carries one.
    pub mode: Option<String>,
}

/// Reads `hami.io/node-nvidia-register`.
///
/// Accepts the v2.8+ JSON array `[{"id","index","count","devmem","devcore","type","numa",
/// "mode","health",...}]` (unknown fields such as `migProfiles` are ignored; `index`, `numa`
/// and `mode` are optional; `health` may be a boolean or `"true"`/`"false"`) and the legacy
/// string `UUID,count,devmem,devcore,type,numa,health[,index[,mode]]:` repeated, the last `:`
/// optional. Errors on duplicate UUIDs or indices and on more than
/// [`MAX_DEVICES_PER_NODE`] devices.
pub fn parse_hami_node_register(value: &str) -> Result<Vec<HamiNodeDevice>, FormatError> {
    const KEY: &str = keys::HAMI_NODE_REGISTER;
    let t = checked_record(KEY, value)?;
    let devices = if t.starts_with('[') || t.starts_with('{') {
        parse_register_json(KEY, t)?
    } else {
        parse_legacy(KEY, t, parse_hami_legacy_device)?
    };
    check_unique(KEY, &devices)?;
    Ok(devices)
}

/// Reads Volcano's `volcano.sh/node-vgpu-register`: `UUID,count,devmem,type,health,mode:`
/// repeated, the last `:` optional. The older 5-field form without `mode` is accepted too.
/// `devcore` is 100; `index` and `numa` are `None`. Errors on duplicate UUIDs and on more than
/// [`MAX_DEVICES_PER_NODE`] devices.
pub fn parse_volcano_node_register(value: &str) -> Result<Vec<HamiNodeDevice>, FormatError> {
    const KEY: &str = keys::VOLCANO_NODE_VGPU_REGISTER;
    let t = checked_record(KEY, value)?;
    let devices = parse_legacy(KEY, t, parse_volcano_device)?;
    check_unique(KEY, &devices)?;
    Ok(devices)
}

/// One device of one container in a HAMi / Volcano vGPU pod record.
#[derive(Debug, Clone, PartialEq)]
pub struct HamiContainerDevice {
    /// GPU UUID, with any `[..]` MIG slice suffix (HAMi v2.7) stripped.
    pub uuid: String,
    /// Device type as written by the scheduler (usually `NVIDIA`).
    pub model: String,
    /// Memory granted, in MiB.
    pub used_mem_mib: u64,
    /// Compute granted, in percent of the GPU (0 means "not limited" to HAMi).
    pub used_cores: u32,
}

/// Reads `hami.io/vgpu-devices-allocated` (or `hami.io/vgpu-devices-to-allocate`,
/// `volcano.sh/vgpu-ids-new`, `volcano.sh/devices-to-allocate`: same format).
///
/// Each container's entry ends with `;`; inside it each device is `UUID,Type,usedMemMiB,
/// usedCores:`. Returns one `Vec` per container slot, in order; empty slots (containers without
/// a GPU) are kept as empty `Vec`s so indices match the pod's containers. A final entry without
/// its `;` or a device without its `:` is accepted. Errors name `hami.io/vgpu-devices-allocated`;
/// use [`FormatError::with_key`] to name another annotation.
pub fn parse_hami_pod_devices(value: &str) -> Result<Vec<Vec<HamiContainerDevice>>, FormatError> {
    const KEY: &str = keys::HAMI_DEVICES_ALLOCATED;
    let t = checked_record(KEY, value)?;
    let mut slots = t.split(';').peekable();
    let mut containers = Vec::new();
    while let Some(slot) = slots.next() {
        if slots.peek().is_none() && slot.trim().is_empty() && !containers.is_empty() {
            break; // the terminator of the last container
        }
        if containers.len() == MAX_CONTAINERS {
            return Err(FormatError::TooMany {
                key: KEY,
                what: "containers",
                max: MAX_CONTAINERS,
            });
        }
        let c = containers.len();
        let devices = parse_container(KEY, slot).map_err(|e| at(e, &format!("container {c}")))?;
        containers.push(devices);
    }
    Ok(containers)
}

fn parse_container(key: &'static str, slot: &str) -> Result<Vec<HamiContainerDevice>, FormatError> {
    let slot = slot.trim();
    let mut out: Vec<HamiContainerDevice> = Vec::new();
    if slot.is_empty() {
        return Ok(out);
    }
    let mut entries = slot.split(':').peekable();
    while let Some(entry) = entries.next() {
        let entry = entry.trim();
        if entry.is_empty() {
            if entries.peek().is_none() {
                break; // trailing ':'
            }
            return Err(FormatError::Malformed {
                key,
                detail: format!("empty device entry in {}", snippet(slot)),
            });
        }
        if out.len() == MAX_DEVICES_PER_NODE {
            return Err(FormatError::TooMany {
                key,
                what: "devices in one container",
                max: MAX_DEVICES_PER_NODE,
            });
        }
        let d =
            parse_pod_device(key, entry).map_err(|e| at(e, &format!("device {}", out.len())))?;
        // At most MAX_DEVICES_PER_NODE devices: a scan of those before is cheap.
        if out.iter().any(|x| x.uuid == d.uuid) {
            return Err(FormatError::Duplicate {
                key,
                what: "device UUID in one container",
                value: snippet(&d.uuid),
            });
        }
        out.push(d);
    }
    Ok(out)
}

fn parse_pod_device(key: &'static str, entry: &str) -> Result<HamiContainerDevice, FormatError> {
    let mut parts = entry.splitn(5, ',');
    let mut fields = [""; 4];
    let mut n = 0;
    for (slot, part) in fields.iter_mut().zip(parts.by_ref()) {
        *slot = part;
        n += 1;
    }
    if n != 4 || parts.next().is_some() {
        return Err(FormatError::Malformed {
            key,
            detail: format!(
                "device entry needs 4 fields UUID,Type,usedMem,usedCores: {}",
                snippet(entry)
            ),
        });
    }
    let raw_uuid = fields[0].trim();
    let uuid = match raw_uuid.find('[') {
        None => raw_uuid,
        Some(i) if raw_uuid.ends_with(']') && !raw_uuid[i + 1..].contains('[') => &raw_uuid[..i],
        Some(_) => {
            return Err(FormatError::Malformed {
                key,
                detail: format!("bad MIG suffix on UUID {}", snippet(raw_uuid)),
            });
        }
    };
    Ok(HamiContainerDevice {
        uuid: check_id(key, "UUID", uuid)?,
        model: check_text(key, "type", fields[1])?,
        used_mem_mib: parse_uint(key, "usedMem", fields[2], MAX_DEVICE_MEM_MIB)?,
        used_cores: parse_u32(key, "usedCores", fields[3])?,
    })
}

/// Splits a `:`-separated device list (last `:` optional) and parses each entry with `one`.
fn parse_legacy(
    key: &'static str,
    t: &str,
    one: fn(&'static str, &[&str]) -> Result<HamiNodeDevice, FormatError>,
) -> Result<Vec<HamiNodeDevice>, FormatError> {
    let mut out = Vec::new();
    let mut entries = t.split(':').peekable();
    while let Some(entry) = entries.next() {
        let entry = entry.trim();
        if entry.is_empty() {
            if entries.peek().is_none() && !out.is_empty() {
                break; // trailing ':'
            }
            return Err(FormatError::Malformed {
                key,
                detail: format!("empty device entry at position {}", out.len()),
            });
        }
        if out.len() == MAX_DEVICES_PER_NODE {
            return Err(FormatError::TooMany {
                key,
                what: "devices",
                max: MAX_DEVICES_PER_NODE,
            });
        }
        // At most 10 pieces are looked at, so a field-heavy entry costs no more than a short one.
        let fields: Vec<&str> = entry.splitn(10, ',').collect();
        let d = one(key, &fields).map_err(|e| at(e, &format!("device {}", out.len())))?;
        out.push(d);
    }
    Ok(out)
}

fn parse_numa(key: &'static str, s: &str) -> Result<Option<u32>, FormatError> {
    if s.trim() == "-1" {
        return Ok(None);
    }
    parse_u32(key, "numa", s).map(Some)
}

fn mode_field(key: &'static str, s: &str) -> Result<Option<String>, FormatError> {
    if s.trim().is_empty() {
        Ok(None)
    } else {
        check_text(key, "mode", s).map(Some)
    }
}

fn parse_hami_legacy_device(key: &'static str, f: &[&str]) -> Result<HamiNodeDevice, FormatError> {
    if !(7..=9).contains(&f.len()) {
        return Err(FormatError::Malformed {
            key,
            detail: format!(
                "device entry has {}{} fields, expected UUID,count,devmem,devcore,type,numa,health[,index,mode]",
                f.len(),
                if f.len() == 10 { " or more" } else { "" }
            ),
        });
    }
    Ok(HamiNodeDevice {
        id: check_id(key, "UUID", f[0])?,
        count: parse_u32(key, "count", f[1])?,
        devmem_mib: parse_uint(key, "devmem", f[2], MAX_DEVICE_MEM_MIB)?,
        devcore: parse_u32(key, "devcore", f[3])?,
        model: check_text(key, "type", f[4])?,
        numa: parse_numa(key, f[5])?,
        healthy: parse_bool(key, "health", f[6])?,
        index: f.get(7).map(|s| parse_index(key, "index", s)).transpose()?,
        mode: f.get(8).map(|s| mode_field(key, s)).transpose()?.flatten(),
    })
}

fn parse_volcano_device(key: &'static str, f: &[&str]) -> Result<HamiNodeDevice, FormatError> {
    if !(5..=6).contains(&f.len()) {
        return Err(FormatError::Malformed {
            key,
            detail: format!(
                "device entry has {}{} fields, expected UUID,count,devmem,type,health,mode",
                f.len(),
                if f.len() == 10 { " or more" } else { "" }
            ),
        });
    }
    Ok(HamiNodeDevice {
        id: check_id(key, "UUID", f[0])?,
        count: parse_u32(key, "count", f[1])?,
        devmem_mib: parse_uint(key, "devmem", f[2], MAX_DEVICE_MEM_MIB)?,
        devcore: 100,
        model: check_text(key, "type", f[3])?,
        healthy: parse_bool(key, "health", f[4])?,
        mode: f.get(5).map(|s| mode_field(key, s)).transpose()?.flatten(),
        index: None,
        numa: None,
    })
}

fn parse_register_json(key: &'static str, t: &str) -> Result<Vec<HamiNodeDevice>, FormatError> {
    let v = parse_json(key, t)?;
    let Value::Array(items) = v else {
        return Err(FormatError::Malformed {
            key,
            detail: format!("expected a JSON array of devices, got {}", json_kind(&v)),
        });
    };
    if items.len() > MAX_DEVICES_PER_NODE {
        return Err(FormatError::TooMany {
            key,
            what: "devices",
            max: MAX_DEVICES_PER_NODE,
        });
    }
    items
        .iter()
        .enumerate()
        .map(|(i, item)| json_device(key, item).map_err(|e| at(e, &format!("device {i}"))))
        .collect()
}

fn json_device(key: &'static str, item: &Value) -> Result<HamiNodeDevice, FormatError> {
    let Value::Object(obj) = item else {
        return Err(FormatError::Malformed {
            key,
            detail: format!("device must be an object, got {}", json_kind(item)),
        });
    };
    let req = |field: &'static str| {
        obj.get(field).ok_or_else(|| FormatError::Missing {
            key,
            what: format!("field \"{field}\""),
        })
    };
    let opt = |field: &str| obj.get(field).filter(|v| !v.is_null());
    let numa = match opt("numa") {
        None => None,
        Some(Value::Number(n)) if n.as_i64() == Some(-1) => None,
        Some(v) => Some(json_uint(key, "numa", v, u64::from(u32::MAX))? as u32),
    };
    let mode = match opt("mode") {
        None => None,
        Some(v) => mode_field(key, json_str(key, "mode", v)?)?,
    };
    Ok(HamiNodeDevice {
        id: check_id(key, "id", json_str(key, "id", req("id")?)?)?,
        index: opt("index")
            .map(|v| json_uint(key, "index", v, MAX_DEVICES_PER_NODE as u64 - 1))
            .transpose()?
            .map(|i| i as u32),
        count: json_uint(key, "count", req("count")?, u64::from(u32::MAX))? as u32,
        devmem_mib: json_uint(key, "devmem", req("devmem")?, MAX_DEVICE_MEM_MIB)?,
        devcore: json_uint(key, "devcore", req("devcore")?, u64::from(u32::MAX))? as u32,
        model: check_text(key, "type", json_str(key, "type", req("type")?)?)?,
        numa,
        healthy: json_bool(key, "health", req("health")?)?,
        mode,
    })
}

fn check_unique(key: &'static str, devices: &[HamiNodeDevice]) -> Result<(), FormatError> {
    let mut ids = BTreeSet::new();
    let mut indices = BTreeSet::new();
    for d in devices {
        if !ids.insert(d.id.as_str()) {
            return Err(FormatError::Duplicate {
                key,
                what: "device UUID",
                value: snippet(&d.id),
            });
        }
        if let Some(i) = d.index
            && !indices.insert(i)
        {
            return Err(FormatError::Duplicate {
                key,
                what: "device index",
                value: i.to_string(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The legacy example from HAMi's protocol documentation (two V100s).
    const LEGACY: &str = "GPU-00552014-5c87-89ac-b1a6-7b53aa24b0ec,10,32768,100,NVIDIA-Tesla V100-PCIE-32GB,0,true,0,hami-core:GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448,10,32768,100,NVIDIA-Tesla V100-PCIE-32GB,0,true,1,hami-core:";

    const JSON: &str = r#"[{"id":"GPU-8f6b4e2a-1c3d-4e5f-9a0b-112233445566","index":0,"count":10,"devmem":81920,"devcore":100,"type":"NVIDIA-NVIDIA A100-SXM4-80GB","numa":0,"mode":"hami-core","health":true,"migProfiles":null,"devicevendor":"NVIDIA","custominfo":{"x":1}},
      {"id":"GPU-9a7c5f3b-2d4e-5f60-ab1c-223344556677","index":1,"count":10,"devmem":81920,"devcore":100,"type":"NVIDIA-NVIDIA A100-SXM4-80GB","numa":1,"mode":"mig","health":false}]"#;

    fn err_text(r: Result<impl std::fmt::Debug, FormatError>) -> String {
        r.expect_err("expected an error").to_string()
    }

    #[test]
    fn legacy_hami_register() {
        let d = parse_hami_node_register(LEGACY).unwrap();
        assert_eq!(d.len(), 2);
        assert_eq!(
            d[0],
            HamiNodeDevice {
                id: "GPU-00552014-5c87-89ac-b1a6-7b53aa24b0ec".into(),
                index: Some(0),
                count: 10,
                devmem_mib: 32768,
                devcore: 100,
                model: "NVIDIA-Tesla V100-PCIE-32GB".into(),
                numa: Some(0),
                healthy: true,
                mode: Some("hami-core".into()),
            }
        );
        assert_eq!(d[1].index, Some(1));
        // 7-field form (pre-index), no trailing ':', whitespace around fields, -1 NUMA.
        let d =
            parse_hami_node_register(" GPU-a , 10 , 24576 , 100 , NVIDIA-NVIDIA L4 , -1 , false ")
                .unwrap();
        assert_eq!(d[0].id, "GPU-a");
        assert_eq!(d[0].model, "NVIDIA-NVIDIA L4");
        assert_eq!(d[0].numa, None);
        assert!(!d[0].healthy);
        assert_eq!(d[0].index, None);
        assert_eq!(d[0].mode, None);
        // 8 fields: index without mode.
        let d = parse_hami_node_register("GPU-a,10,24576,100,L4,0,true,3:").unwrap();
        assert_eq!(d[0].index, Some(3));
    }

    #[test]
    fn json_hami_register() {
        let d = parse_hami_node_register(JSON).unwrap();
        assert_eq!(d.len(), 2);
        assert_eq!(d[0].id, "GPU-8f6b4e2a-1c3d-4e5f-9a0b-112233445566");
        assert_eq!(d[0].devmem_mib, 81920);
        assert_eq!(d[0].model, "NVIDIA-NVIDIA A100-SXM4-80GB");
        assert_eq!(d[1].numa, Some(1));
        assert_eq!(d[1].mode.as_deref(), Some("mig"));
        assert!(!d[1].healthy);
        // Optional fields absent / null; health as a string.
        let d = parse_hami_node_register(
            r#"[{"id":"GPU-x","count":4,"devmem":16384,"devcore":100,"type":"T4","health":"true","numa":null}]"#,
        )
        .unwrap();
        assert_eq!(d[0].index, None);
        assert_eq!(d[0].numa, None);
        assert!(d[0].healthy);
        assert_eq!(parse_hami_node_register("[]"), Ok(vec![]));
    }

    #[test]
    fn hami_register_errors() {
        let cases: &[(&str, &str)] = &[
            ("", "hami.io/node-nvidia-register: empty value"),
            ("GPU-a,10,32768,100,V100,0", "6 fields"),
            (
                "GPU-a,10,32768,100,V100,0,true,0,hami-core,extra",
                "10 or more fields",
            ),
            (
                "GPU-a,ten,32768,100,V100,0,true",
                "count is not a non-negative integer: \"ten\" (device 0)",
            ),
            ("GPU-a,10,-5,100,V100,0,true", "devmem must not be negative"),
            (
                "GPU-a,10,99999999999999999999999,100,V100,0,true",
                "devmem exceeds",
            ),
            (
                "GPU-a,10,32768,100,V100,0,yes",
                "health is not a boolean: \"yes\"",
            ),
            ("GPU-a,10,32768,100,,0,true", "type is empty"),
            ("GPU-a,10,32768,100,V100,0,true,64", "index exceeds 63"),
            (",10,32768,100,V100,0,true", "UUID is empty"),
            (
                "GPU a,10,32768,100,V100,0,true",
                "UUID has a forbidden character",
            ),
            (
                "GPU-a,10,32768,100,V100,0,true::GPU-b,10,1,100,V100,0,true",
                "empty device entry at position 1",
            ),
            (":", "empty device entry at position 0"),
            (
                "GPU-a,10,1,100,V100,0,true:GPU-a,10,1,100,V100,0,true",
                "duplicate device UUID \"GPU-a\"",
            ),
            (
                "GPU-a,10,1,100,V100,0,true,1:GPU-b,10,1,100,V100,0,true,1",
                "duplicate device index 1",
            ),
            ("[", "invalid JSON"),
            (
                r#"[{"id":"GPU-a","count":1,"devmem":1,"devcore":100,"type":"T4","health":true}"#,
                "invalid JSON",
            ),
            ("{}", "expected a JSON array of devices, got an object"),
            ("[1]", "device must be an object, got a number (device 0)"),
            (
                r#"[{"id":"GPU-a","devmem":1,"devcore":100,"type":"T4","health":true}]"#,
                "missing field \"count\" (device 0)",
            ),
            (
                r#"[{"id":"GPU-a","count":-1,"devmem":1,"devcore":100,"type":"T4","health":true}]"#,
                "count must not be negative",
            ),
            (
                r#"[{"id":"GPU-a","count":1.5,"devmem":1,"devcore":100,"type":"T4","health":true}]"#,
                "count is not an integer: \"1.5\"",
            ),
            (
                r#"[{"id":"GPU-a","count":1,"devmem":1e30,"devcore":100,"type":"T4","health":true}]"#,
                "devmem exceeds",
            ),
            (
                r#"[{"id":"GPU-a","count":"1","devmem":1,"devcore":100,"type":"T4","health":true}]"#,
                "count must be a number, got a string",
            ),
            (
                r#"[{"id":7,"count":1,"devmem":1,"devcore":100,"type":"T4","health":true}]"#,
                "id must be a string",
            ),
            (
                r#"[{"id":"GPU-a","count":1,"devmem":1,"devcore":100,"type":"T4","health":1}]"#,
                "health must be a boolean",
            ),
            (
                r#"[{"id":"GPU-a","count":1,"devmem":1,"devcore":100,"type":"T4","health":true},{"id":"GPU-a","count":1,"devmem":1,"devcore":100,"type":"T4","health":true}]"#,
                "duplicate device UUID",
            ),
        ];
        for (input, want) in cases {
            let got = err_text(parse_hami_node_register(input));
            assert!(got.contains(want), "{input:?}: got {got:?}, want {want:?}");
            assert!(got.starts_with("hami.io/node-nvidia-register: "), "{got}");
            assert!(!got.contains('\n'), "{got}");
        }
    }

    #[test]
    fn hostile_sizes_and_nesting() {
        let deep = "[".repeat(10_000);
        let got = err_text(parse_hami_node_register(&deep));
        assert!(got.contains("recursion limit"), "{got}");
        let deep_obj = format!("[{}", "{\"a\":".repeat(5_000));
        assert!(parse_hami_node_register(&deep_obj).is_err());
        let huge = "x".repeat(1 << 20);
        assert!(matches!(
            parse_hami_node_register(&huge),
            Err(FormatError::TooLarge { len, .. }) if len == 1 << 20
        ));
        let many: String = (0..65)
            .map(|i| format!("GPU-{i},10,1024,100,T4,0,true:"))
            .collect();
        assert_eq!(
            err_text(parse_hami_node_register(&many)),
            "hami.io/node-nvidia-register: more than 64 devices"
        );
        let many_json = format!(
            "[{}]",
            (0..65)
                .map(|i| format!(r#"{{"id":"GPU-{i}","count":1,"devmem":1,"devcore":100,"type":"T4","health":true}}"#))
                .collect::<Vec<_>>()
                .join(",")
        );
        assert!(matches!(
            parse_hami_node_register(&many_json),
            Err(FormatError::TooMany { .. })
        ));
        // A long value in a field is quoted truncated.
        let long = format!("GPU-a,{},1,100,T4,0,true", "9".repeat(5000));
        let got = err_text(parse_hami_node_register(&long));
        assert!(got.len() < 200, "{got}");
        // Unicode and control characters.
        let got = err_text(parse_hami_node_register("GPU-é\u{0},1,1,100,T4,0,true"));
        assert!(got.contains("forbidden character"), "{got}");
        let d = parse_hami_node_register("GPU-é,1,1,100,ＮＶＩＤＩＡ,0,true").unwrap();
        assert_eq!(d[0].model, "ＮＶＩＤＩＡ");
    }

    #[test]
    fn volcano_register() {
        let v = "GPU-f571c8f8-948a-71b4-3be1-2bf02c7a1b20,10,32768,NVIDIA-Tesla V100S-PCIE-32GB,true,hami-core:GPU-uuid-1,8,24000,NVIDIA-A100-SXM4-40GB,false,mig";
        let d = parse_volcano_node_register(v).unwrap();
        assert_eq!(d.len(), 2);
        assert_eq!(
            d[0],
            HamiNodeDevice {
                id: "GPU-f571c8f8-948a-71b4-3be1-2bf02c7a1b20".into(),
                index: None,
                count: 10,
                devmem_mib: 32768,
                devcore: 100,
                model: "NVIDIA-Tesla V100S-PCIE-32GB".into(),
                numa: None,
                healthy: true,
                mode: Some("hami-core".into()),
            }
        );
        assert!(!d[1].healthy);
        assert_eq!(
            parse_volcano_node_register("GPU-a,10,4914,NVIDIA-RTX4090,true:").unwrap()[0].mode,
            None
        );
        for (bad, want) in [
            ("GPU-a,10,32768,100,V100,0,true", "7 fields"),
            ("GPU-a,10,32768", "3 fields"),
            (
                "GPU-a,10,x,T4,true,hami-core",
                "devmem is not a non-negative integer",
            ),
            (
                "GPU-a,1,1,T4,true,hami-core:GPU-a,1,1,T4,true,hami-core",
                "duplicate device UUID",
            ),
            ("  ", "empty value"),
        ] {
            let got = err_text(parse_volcano_node_register(bad));
            assert!(got.starts_with("volcano.sh/node-vgpu-register: "), "{got}");
            assert!(got.contains(want), "{bad:?}: {got}");
        }
    }

    #[test]
    fn pod_devices() {
        // The example from PEERS.md (two containers on the same GPU).
        let v = "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448,NVIDIA,3000,0:;GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448,NVIDIA,5000,0:;";
        let c = parse_hami_pod_devices(v).unwrap();
        assert_eq!(c.len(), 2);
        assert_eq!(
            c[0],
            vec![HamiContainerDevice {
                uuid: "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448".into(),
                model: "NVIDIA".into(),
                used_mem_mib: 3000,
                used_cores: 0,
            }]
        );
        assert_eq!(c[1][0].used_mem_mib, 5000);
        // Empty slots are kept; several devices in one container; MIG suffix stripped.
        let v = ";GPU-a,NVIDIA,1000,30:GPU-b[1-2],NVIDIA,2000,50:;;";
        let c = parse_hami_pod_devices(v).unwrap();
        assert_eq!(c.len(), 3);
        assert!(c[0].is_empty());
        assert_eq!(c[1].len(), 2);
        assert_eq!(c[1][1].uuid, "GPU-b");
        assert_eq!(c[1][1].used_cores, 50);
        assert!(c[2].is_empty());
        // A single empty slot, a record without terminators.
        assert_eq!(parse_hami_pod_devices(";"), Ok(vec![vec![]]));
        assert_eq!(
            parse_hami_pod_devices("GPU-a,NVIDIA,1,2").unwrap()[0][0].used_cores,
            2
        );
    }

    #[test]
    fn pod_device_errors() {
        for (bad, want) in [
            ("", "empty value"),
            ("GPU-a,NVIDIA,1000:;", "needs 4 fields"),
            ("GPU-a,NVIDIA,1000,30,9:;", "needs 4 fields"),
            ("GPU-a,NVIDIA,-1,30:;", "usedMem must not be negative"),
            (
                "GPU-a,NVIDIA,1000,lots:;",
                "usedCores is not a non-negative integer: \"lots\" (device 0) (container 0)",
            ),
            (
                ";GPU-a,NVIDIA,1,1::GPU-b,NVIDIA,1,1:;",
                "empty device entry",
            ),
            (
                "GPU-a,NVIDIA,1,1:GPU-a,NVIDIA,1,1:;",
                "duplicate device UUID in one container",
            ),
            ("GPU-a[1-2,NVIDIA,1,1:;", "bad MIG suffix"),
            ("GPU-a[1][2],NVIDIA,1,1:;", "bad MIG suffix"),
            ("[1-2],NVIDIA,1,1:;", "UUID is empty"),
            ("GPU-a,,1,1:;", "type is empty"),
            (
                "GPU-a,NVIDIA,1,1\u{7}:;",
                "usedCores is not a non-negative integer",
            ),
        ] {
            let got = err_text(parse_hami_pod_devices(bad));
            assert!(got.starts_with("hami.io/vgpu-devices-allocated: "), "{got}");
            assert!(got.contains(want), "{bad:?}: {got}");
        }
        let many = "GPU-a,NVIDIA,1,1:;".repeat(65);
        assert_eq!(
            err_text(parse_hami_pod_devices(&many)),
            "hami.io/vgpu-devices-allocated: more than 64 containers"
        );
        let many_dev: String = (0..65).map(|i| format!("GPU-{i},NVIDIA,1,1:")).collect();
        assert!(matches!(
            parse_hami_pod_devices(&many_dev),
            Err(FormatError::TooMany { .. })
        ));
        assert!(matches!(
            parse_hami_pod_devices(&";".repeat(1 << 20)),
            Err(FormatError::TooLarge { .. })
        ));
        let e = parse_hami_pod_devices("x")
            .unwrap_err()
            .with_key(keys::VOLCANO_VGPU_IDS_NEW);
        assert!(e.to_string().starts_with("volcano.sh/vgpu-ids-new: "));
    }

    fn arb_node_device(with_index: bool) -> impl Strategy<Value = HamiNodeDevice> {
        (
            "GPU-[0-9a-f]{8}",
            any::<u32>(),
            0..=MAX_DEVICE_MEM_MIB,
            0u32..1000,
            "[A-Za-z0-9][A-Za-z0-9 ._-]{0,30}[A-Za-z0-9]",
            proptest::option::of(0u32..8),
            any::<bool>(),
            proptest::option::of("(hami-core|mig|mps)"),
        )
            .prop_map(
                move |(id, count, devmem_mib, devcore, model, numa, healthy, mode)| {
                    HamiNodeDevice {
                        id,
                        index: None,
                        count,
                        devmem_mib,
                        devcore,
                        model,
                        numa,
                        healthy,
                        mode: if with_index { mode } else { None },
                    }
                },
            )
    }

    fn dedup(mut v: Vec<HamiNodeDevice>, with_index: bool) -> Vec<HamiNodeDevice> {
        let mut seen = BTreeSet::new();
        v.retain(|d| seen.insert(d.id.clone()));
        if with_index {
            for (i, d) in v.iter_mut().enumerate() {
                d.index = Some(i as u32);
            }
        }
        v
    }

    proptest! {
        #[test]
        fn never_panics_on_text(s in ".{0,200}") {
            let _ = parse_hami_node_register(&s);
            let _ = parse_volcano_node_register(&s);
            let _ = parse_hami_pod_devices(&s);
        }

        #[test]
        fn never_panics_on_record_like_text(s in "[GPU0-9a-f,:;\\[\\]{}\" -]{0,200}") {
            let _ = parse_hami_node_register(&s);
            let _ = parse_volcano_node_register(&s);
            let _ = parse_hami_pod_devices(&s);
        }

        #[test]
        fn never_panics_on_bytes(b in proptest::collection::vec(any::<u8>(), 0..300)) {
            let s = String::from_utf8_lossy(&b);
            let _ = parse_hami_node_register(&s);
            let _ = parse_volcano_node_register(&s);
            let _ = parse_hami_pod_devices(&s);
        }

        #[test]
        fn legacy_round_trip(devs in proptest::collection::vec(arb_node_device(true), 1..8)) {
            let devs = dedup(devs, true);
            let text: String = devs.iter().map(|d| format!(
                "{},{},{},{},{},{},{},{},{}:",
                d.id, d.count, d.devmem_mib, d.devcore, d.model,
                d.numa.map_or("-1".to_string(), |n| n.to_string()),
                d.healthy, d.index.unwrap(), d.mode.clone().unwrap_or_default(),
            )).collect();
            prop_assert_eq!(parse_hami_node_register(&text), Ok(devs));
        }

        #[test]
        fn json_round_trip(devs in proptest::collection::vec(arb_node_device(true), 0..8)) {
            let devs = dedup(devs, true);
            let json = serde_json::Value::Array(devs.iter().map(|d| serde_json::json!({
                "id": d.id, "index": d.index, "count": d.count, "devmem": d.devmem_mib,
                "devcore": d.devcore, "type": d.model, "numa": d.numa, "mode": d.mode,
                "health": d.healthy,
            })).collect());
            prop_assert_eq!(parse_hami_node_register(&json.to_string()), Ok(devs));
        }

        #[test]
        fn volcano_round_trip(devs in proptest::collection::vec(arb_node_device(false), 1..8)) {
            let devs: Vec<_> = dedup(devs, false).into_iter().map(|mut d| {
                d.devcore = 100;
                d.numa = None;
                d.mode = Some("hami-core".into());
                d
            }).collect();
            let text: String = devs.iter().map(|d| format!(
                "{},{},{},{},{},hami-core:", d.id, d.count, d.devmem_mib, d.model, d.healthy
            )).collect();
            prop_assert_eq!(parse_volcano_node_register(&text), Ok(devs));
        }

        #[test]
        fn pod_round_trip(containers in proptest::collection::vec(
            proptest::collection::vec(("GPU-[0-9a-f]{6}", 0..=MAX_DEVICE_MEM_MIB, 0u32..=100), 0..4), 1..6)
        ) {
            let want: Vec<Vec<HamiContainerDevice>> = containers.into_iter().map(|c| {
                let mut seen = BTreeSet::new();
                c.into_iter().filter(|(u, _, _)| seen.insert(u.clone())).map(|(uuid, m, k)| HamiContainerDevice {
                    uuid, model: "NVIDIA".into(), used_mem_mib: m, used_cores: k,
                }).collect()
            }).collect();
            let text: String = want.iter().map(|c| {
                let mut s: String = c.iter().map(|d| format!("{},{},{},{}:", d.uuid, d.model, d.used_mem_mib, d.used_cores)).collect();
                s.push(';');
                s
            }).collect();
            prop_assert_eq!(parse_hami_pod_devices(&text), Ok(want));
        }
    }
}
