//! Aliyun gpushare-scheduler-extender records: the `ALIYUN_COM_GPU_MEM_*` pod annotations.

use std::collections::BTreeMap;

use super::common::{checked_record, parse_index, parse_uint};
use super::{FormatError, MAX_DEVICE_MEM_BYTES, keys};

/// A pod's share of one device under Aliyun gpushare. Memory is in the unit the cluster's
/// `aliyun.com/gpu-mem` resource uses (GiB by default, sometimes MiB).
#[derive(Debug, Clone, PartialEq)]
pub struct AliyunAlloc {
    /// Device index on the node (`ALIYUN_COM_GPU_MEM_IDX`).
    pub index: u32,
    /// The pod's memory request (`ALIYUN_COM_GPU_MEM_POD`).
    pub pod_mem: u64,
    /// The chosen device's total memory (`ALIYUN_COM_GPU_MEM_DEV`).
    pub dev_mem: u64,
}

/// Reads the pod annotations `ALIYUN_COM_GPU_MEM_IDX`, `ALIYUN_COM_GPU_MEM_POD` and
/// `ALIYUN_COM_GPU_MEM_DEV` (decimal integers).
///
/// `Ok(None)` when `ALIYUN_COM_GPU_MEM_IDX` is absent (the pod was not placed by gpushare).
/// Errors when it is present but malformed, when either of the others is missing or malformed,
/// when `dev_mem` is 0, or when `pod_mem > dev_mem`. Memory values above
/// [`MAX_DEVICE_MEM_BYTES`] are refused whatever the unit.
pub fn parse_aliyun(
    annotations: &BTreeMap<String, String>,
) -> Result<Option<AliyunAlloc>, FormatError> {
    let Some(idx) = annotations.get(keys::ALIYUN_GPU_MEM_IDX) else {
        return Ok(None);
    };
    let index = parse_index(
        keys::ALIYUN_GPU_MEM_IDX,
        "index",
        checked_record(keys::ALIYUN_GPU_MEM_IDX, idx)?,
    )?;
    let mem = |key: &'static str| -> Result<u64, FormatError> {
        let v = annotations.get(key).ok_or_else(|| FormatError::Missing {
            key: keys::ALIYUN_GPU_MEM_IDX,
            what: format!("annotation {key}"),
        })?;
        parse_uint(key, "memory", checked_record(key, v)?, MAX_DEVICE_MEM_BYTES)
    };
    let pod_mem = mem(keys::ALIYUN_GPU_MEM_POD)?;
    let dev_mem = mem(keys::ALIYUN_GPU_MEM_DEV)?;
    if dev_mem == 0 {
        return Err(FormatError::OutOfRange {
            key: keys::ALIYUN_GPU_MEM_DEV,
            field: "memory",
            detail: "is 0".into(),
        });
    }
    if pod_mem > dev_mem {
        return Err(FormatError::OutOfRange {
            key: keys::ALIYUN_GPU_MEM_POD,
            field: "memory",
            detail: format!("{pod_mem} exceeds the device's {dev_mem}"),
        });
    }
    Ok(Some(AliyunAlloc {
        index,
        pod_mem,
        dev_mem,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ann(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn example() {
        // As the extender writes them at bind time (GiB units), plus unrelated annotations.
        let a = ann(&[
            ("ALIYUN_COM_GPU_MEM_IDX", "1"),
            ("ALIYUN_COM_GPU_MEM_POD", "3"),
            ("ALIYUN_COM_GPU_MEM_DEV", "15"),
            ("ALIYUN_COM_GPU_MEM_ASSIGNED", "true"),
            ("ALIYUN_COM_GPU_MEM_ASSUME_TIME", "1680000000000000000"),
        ]);
        assert_eq!(
            parse_aliyun(&a),
            Ok(Some(AliyunAlloc {
                index: 1,
                pod_mem: 3,
                dev_mem: 15
            }))
        );
        assert_eq!(parse_aliyun(&ann(&[("other", "x")])), Ok(None));
        assert_eq!(parse_aliyun(&BTreeMap::new()), Ok(None));
    }

    #[test]
    fn errors() {
        let base = [
            ("ALIYUN_COM_GPU_MEM_IDX", "0"),
            ("ALIYUN_COM_GPU_MEM_POD", "4"),
            ("ALIYUN_COM_GPU_MEM_DEV", "16"),
        ];
        let with = |k: &str, v: Option<&str>| {
            let mut a = ann(&base);
            match v {
                Some(v) => a.insert(k.to_string(), v.to_string()),
                None => a.remove(k),
            };
            parse_aliyun(&a).expect_err(k).to_string()
        };
        for (got, want) in [
            (
                with("ALIYUN_COM_GPU_MEM_IDX", Some("")),
                "ALIYUN_COM_GPU_MEM_IDX: empty value",
            ),
            (
                with("ALIYUN_COM_GPU_MEM_IDX", Some("x")),
                "ALIYUN_COM_GPU_MEM_IDX: index is not a non-negative integer: \"x\"",
            ),
            (
                with("ALIYUN_COM_GPU_MEM_IDX", Some("-1")),
                "index must not be negative",
            ),
            (
                with("ALIYUN_COM_GPU_MEM_IDX", Some("0,1")),
                "not a non-negative integer",
            ),
            (
                with("ALIYUN_COM_GPU_MEM_POD", None),
                "ALIYUN_COM_GPU_MEM_IDX: missing annotation ALIYUN_COM_GPU_MEM_POD",
            ),
            (
                with("ALIYUN_COM_GPU_MEM_DEV", None),
                "missing annotation ALIYUN_COM_GPU_MEM_DEV",
            ),
            (
                with("ALIYUN_COM_GPU_MEM_POD", Some("4.5")),
                "ALIYUN_COM_GPU_MEM_POD: memory is not a non-negative integer",
            ),
            (
                with("ALIYUN_COM_GPU_MEM_POD", Some("17")),
                "ALIYUN_COM_GPU_MEM_POD: memory 17 exceeds the device's 16",
            ),
            (
                with("ALIYUN_COM_GPU_MEM_DEV", Some("0")),
                "ALIYUN_COM_GPU_MEM_DEV: memory is 0",
            ),
            (
                with("ALIYUN_COM_GPU_MEM_DEV", Some("99999999999999999999999")),
                "ALIYUN_COM_GPU_MEM_DEV: memory exceeds",
            ),
            (
                with("ALIYUN_COM_GPU_MEM_DEV", Some("１６")),
                "not a non-negative integer",
            ),
            (
                with("ALIYUN_COM_GPU_MEM_DEV", Some(&"1".repeat(1 << 20))),
                "over the 65536-byte limit",
            ),
        ] {
            assert!(got.contains(want), "got {got:?}, want {want:?}");
        }
    }

    proptest! {
        #[test]
        fn never_panics(idx in ".{0,20}", pod in ".{0,20}", dev in ".{0,20}", b in proptest::collection::vec(any::<u8>(), 0..40)) {
            let lossy = String::from_utf8_lossy(&b).into_owned();
            for (i, p, d) in [(&idx, &pod, &dev), (&lossy, &pod, &dev), (&idx, &lossy, &lossy)] {
                let a = ann(&[
                    ("ALIYUN_COM_GPU_MEM_IDX", i),
                    ("ALIYUN_COM_GPU_MEM_POD", p),
                    ("ALIYUN_COM_GPU_MEM_DEV", d),
                ]);
                let _ = parse_aliyun(&a);
            }
        }

        #[test]
        fn valid_values_round_trip(index in 0u32..64, dev in 1u64..100_000, pod_frac in 0.0f64..=1.0) {
            let pod = (dev as f64 * pod_frac) as u64;
            let a = ann(&[
                ("ALIYUN_COM_GPU_MEM_IDX", &index.to_string()),
                ("ALIYUN_COM_GPU_MEM_POD", &pod.to_string()),
                ("ALIYUN_COM_GPU_MEM_DEV", &dev.to_string()),
            ]);
            prop_assert_eq!(parse_aliyun(&a), Ok(Some(AliyunAlloc { index, pod_mem: pod, dev_mem: dev })));
        }
    }
}
