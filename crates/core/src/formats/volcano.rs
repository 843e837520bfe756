//! Volcano gpushare records: the pod annotation `volcano.sh/gpu-index`.

use std::collections::BTreeSet;

use super::common::{at, checked_record, parse_index};
use super::{FormatError, MAX_DEVICES_PER_NODE};

/// Reads a comma-separated device index list such as `volcano.sh/gpu-index` (`"2"`, `"0,1"`).
///
/// `key` names the annotation in errors. Whitespace around indices is ignored. Errors on an
/// empty value or empty element, on anything but non-negative integers, on indices not below
/// [`MAX_DEVICES_PER_NODE`], on repeated indices, and on more than [`MAX_DEVICES_PER_NODE`]
/// entries. The order of the record is kept.
pub fn parse_index_list(key: &'static str, value: &str) -> Result<Vec<u32>, FormatError> {
    let t = checked_record(key, value)?;
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for (i, part) in t.split(',').enumerate() {
        if out.len() == MAX_DEVICES_PER_NODE {
            return Err(FormatError::TooMany {
                key,
                what: "indices",
                max: MAX_DEVICES_PER_NODE,
            });
        }
        let idx = parse_index(key, "index", part).map_err(|e| at(e, &format!("element {i}")))?;
        if !seen.insert(idx) {
            return Err(FormatError::Duplicate {
                key,
                what: "device index",
                value: idx.to_string(),
            });
        }
        out.push(idx);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::keys::VOLCANO_GPU_INDEX as K;
    use proptest::prelude::*;

    #[test]
    fn examples() {
        assert_eq!(parse_index_list(K, "2"), Ok(vec![2]));
        assert_eq!(parse_index_list(K, "0,1"), Ok(vec![0, 1]));
        assert_eq!(parse_index_list(K, " 3 , 1 "), Ok(vec![3, 1]));
    }

    #[test]
    fn errors() {
        for (bad, want) in [
            ("", "volcano.sh/gpu-index: empty value"),
            ("0,,1", "volcano.sh/gpu-index: index is empty (element 1)"),
            ("0,", "index is empty (element 1)"),
            ("1,1", "volcano.sh/gpu-index: duplicate device index 1"),
            ("-1", "index must not be negative: \"-1\" (element 0)"),
            ("a", "index is not a non-negative integer: \"a\""),
            ("1.0", "index is not a non-negative integer"),
            ("64", "index exceeds 63: \"64\""),
            ("99999999999999999999999999", "index exceeds 63"),
            ("0;1", "not a non-negative integer"),
            ("٣", "not a non-negative integer"),
        ] {
            let got = parse_index_list(K, bad).expect_err(bad).to_string();
            assert!(got.contains(want), "{bad:?}: {got}");
        }
        let many = (0..70)
            .map(|i| (i % 64).to_string())
            .collect::<Vec<_>>()
            .join(",");
        assert!(matches!(
            parse_index_list(K, &many),
            Err(FormatError::TooMany { .. })
        ));
        assert!(matches!(
            parse_index_list(K, &"0".repeat(1 << 20)),
            Err(FormatError::TooLarge { .. })
        ));
    }

    proptest! {
        #[test]
        fn never_panics(s in ".{0,100}", b in proptest::collection::vec(any::<u8>(), 0..100)) {
            let _ = parse_index_list(K, &s);
            let _ = parse_index_list(K, &String::from_utf8_lossy(&b));
        }

        #[test]
        fn round_trip(set in proptest::collection::btree_set(0u32..64, 1..10)) {
            let v: Vec<u32> = set.into_iter().rev().collect();
            let s = v.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
            prop_assert_eq!(parse_index_list(K, &s), Ok(v));
        }
    }
}
