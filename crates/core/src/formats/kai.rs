//! KAI-Scheduler records: the pod annotation `gpu-fraction`.

use super::common::snippet;
use super::quantity::parse_milli;
use super::{FormatError, keys};

/// Reads KAI's `gpu-fraction` annotation: a decimal in (0, 1] such as `"0.5"`, returned in
/// thousandths of a GPU rounded up to the next milli (`"0.5"` → 500, `"0.0001"` → 1, `"1"` →
/// 1000). Plain decimals and the exponent form (`"5e-1"`) are accepted; SI suffixes, `NaN`,
/// `inf`, signs other than `+`, zero, values above 1 and anything else are errors.
pub fn parse_gpu_fraction(value: &str) -> Result<u32, FormatError> {
    const KEY: &str = keys::KAI_GPU_FRACTION;
    let milli = parse_milli(KEY, value, false)?;
    if milli == 0 || milli > 1000 {
        return Err(FormatError::OutOfRange {
            key: KEY,
            field: "value",
            detail: format!("must be in (0, 1]: {}", snippet(value.trim())),
        });
    }
    Ok(milli as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn examples() {
        for (v, want) in [
            ("0.5", 500),
            ("1", 1000),
            ("1.0", 1000),
            ("0.25", 250),
            (".1", 100),
            ("0.0001", 1),
            ("0.3333", 334),
            ("5e-1", 500),
            (" 0.75 ", 750),
            ("+0.5", 500),
            ("0.999999", 1000),
        ] {
            assert_eq!(parse_gpu_fraction(v), Ok(want), "{v}");
        }
    }

    #[test]
    fn errors() {
        for (bad, want) in [
            ("", "gpu-fraction: empty value"),
            ("0", "gpu-fraction: value must be in (0, 1]: \"0\""),
            ("0.0", "must be in (0, 1]"),
            ("1.0001", "must be in (0, 1]"),
            ("2", "must be in (0, 1]"),
            ("-0.5", "gpu-fraction: value must not be negative"),
            ("NaN", "gpu-fraction: not a quantity: \"NaN\""),
            ("inf", "not a quantity"),
            ("500m", "unknown suffix"),
            ("0.5Gi", "unknown suffix"),
            ("half", "not a quantity"),
            ("0,5", "unknown suffix"),
            ("1e4000", "bad exponent"),
            ("1e400", "gpu-fraction: value is too large"),
            ("0.5.1", "more than one decimal point"),
        ] {
            let got = parse_gpu_fraction(bad).expect_err(bad).to_string();
            assert!(got.contains(want), "{bad:?}: {got}");
        }
        let big = format!("0.{}", "5".repeat(1 << 20));
        assert!(matches!(
            parse_gpu_fraction(&big),
            Err(FormatError::TooLarge { .. })
        ));
    }

    proptest! {
        #[test]
        fn never_panics(s in ".{0,60}", b in proptest::collection::vec(any::<u8>(), 0..60)) {
            let _ = parse_gpu_fraction(&s);
            let _ = parse_gpu_fraction(&String::from_utf8_lossy(&b));
        }

        #[test]
        fn in_range_or_error(s in "[-+]?[0-9]{0,3}\\.?[0-9]{0,6}([eE][-+]?[0-9]{1,2})?") {
            if let Ok(m) = parse_gpu_fraction(&s) {
                prop_assert!((1..=1000).contains(&m));
            }
        }

        #[test]
        fn milli_round_trip(m in 1u32..=1000) {
            prop_assert_eq!(parse_gpu_fraction(&format!("{}.{:03}", m / 1000, m % 1000)), Ok(m));
        }
    }
}
