//! The normalisation contract for a device share.

use super::FormatError;

/// One GPU, in thousandths.
const WHOLE: u32 = 1000;

/// The share of one GPU a pod holds, in thousandths (0..=1000):
/// `max(memory fraction, compute fraction) × 1000`, rounded up, capped at 1000.
///
/// * `mem` is `(used, total)` in any one unit (MiB, bytes, percent...). A `total` of 0 is an
///   error; `used > total` caps at 1000.
/// * `core_pct` is the compute share in percent of one GPU (100 = all of it); over 100 caps.
/// * With neither given the share is 0.
///
/// The result is monotone: it never decreases when `used` or `core_pct` grows.
pub fn share_milli(mem: Option<(u64, u64)>, core_pct: Option<u32>) -> Result<u32, FormatError> {
    let mem_milli = match mem {
        None => 0,
        Some((_, 0)) => {
            return Err(FormatError::OutOfRange {
                key: "share",
                field: "memory total",
                detail: "is 0".into(),
            });
        }
        Some((used, total)) => {
            // u64 × 1000 fits a u128, so this is exact.
            let m = (u128::from(used) * u128::from(WHOLE)).div_ceil(u128::from(total));
            m.min(u128::from(WHOLE)) as u32
        }
    };
    let core_milli = core_pct.map_or(0, |c| c.min(100) * 10);
    Ok(mem_milli.max(core_milli))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn examples() {
        assert_eq!(share_milli(None, None), Ok(0));
        assert_eq!(share_milli(Some((3000, 32768)), Some(0)), Ok(92));
        assert_eq!(share_milli(Some((8192, 16384)), Some(30)), Ok(500));
        assert_eq!(share_milli(Some((1000, 16384)), Some(30)), Ok(300));
        assert_eq!(share_milli(Some((1, u64::MAX)), None), Ok(1));
        assert_eq!(share_milli(Some((u64::MAX, 1)), None), Ok(1000));
        assert_eq!(share_milli(None, Some(250)), Ok(1000));
        assert_eq!(share_milli(Some((0, 10)), None), Ok(0));
        let e = share_milli(Some((1, 0)), Some(10)).unwrap_err();
        assert_eq!(e.to_string(), "share: memory total is 0");
    }

    proptest! {
        #[test]
        fn bounded_and_monotone(
            used in any::<u64>(),
            extra in any::<u64>(),
            total in 1u64..,
            core in proptest::option::of(any::<u32>()),
            core_extra in 0u32..200,
        ) {
            let s = share_milli(Some((used, total)), core).unwrap();
            prop_assert!(s <= 1000);
            let more_mem = share_milli(Some((used.saturating_add(extra), total)), core).unwrap();
            prop_assert!(more_mem >= s);
            let more_core = core.map(|c| c.saturating_add(core_extra)).or(Some(core_extra));
            prop_assert!(share_milli(Some((used, total)), more_core).unwrap() >= s);
            // Only memory, or only compute, never exceeds the combination.
            prop_assert!(share_milli(Some((used, total)), None).unwrap() <= s);
            prop_assert!(share_milli(None, core).unwrap() <= s);
            // A larger total never increases the share.
            let bigger_total = share_milli(Some((used, total.saturating_add(extra))), core).unwrap();
            prop_assert!(bigger_total <= s);
        }
    }
}
