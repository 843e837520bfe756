//! Kubernetes `resource.Quantity` strings, read exactly (no floating point).
//!
//! Grammar (from the Kubernetes API): an optional sign, a decimal number (`5`, `5.`, `.5`,
//! `1.25`), then one suffix: a binary SI suffix (`Ki` `Mi` `Gi` `Ti` `Pi` `Ei`), a decimal SI
//! suffix (`n` `u` `m` `k` `M` `G` `T` `P` `E` or none), or a decimal exponent (`e3`, `E-2`).
//! Negative quantities are refused. Values finer than the unit a function returns are rounded
//! up to it, as Kubernetes' `MilliValue()` and `Value()` do (`"500u"` CPU is 1 milli).

use super::common::{checked_record, snippet};
use super::{FormatError, keys};

/// Most significant decimal digits accepted (the mantissa must fit a `u128`).
const MAX_SIGNIFICANT_DIGITS: usize = 38;
/// Largest exponent magnitude accepted in the `e<n>` form.
const MAX_EXPONENT: i64 = 1000;

/// `"500m"` → 500, `"2"` → 2000, `"1.5"` → 1500, `"2k"` → 2 000 000. Rounds up to the milli
/// (`"0.1m"` → 1, `"500u"` → 1, `"1500000n"` → 2). Errors on garbage, negative values and values over `u64::MAX` milli.
pub fn quantity_to_milli(q: &str) -> Result<u64, FormatError> {
    let v = parse_milli(keys::QUANTITY, q, true)?;
    u64::try_from(v).map_err(|_| too_large(keys::QUANTITY, q))
}

/// `"64Gi"` → 68 719 476 736, `"1G"`, `"512Mi"`, `"1000"`, `"1e3"`, `"0.5Gi"` → bytes, rounded
/// up to the byte (`"1500m"` → 2). Errors on garbage, negative values and overflow.
pub fn quantity_to_bytes(q: &str) -> Result<u64, FormatError> {
    let v = parse_milli(keys::QUANTITY, q, true)?;
    let bytes = v.div_ceil(1000);
    u64::try_from(bytes).map_err(|_| too_large(keys::QUANTITY, q))
}

/// An integer count: `"8"` → 8, `"8000m"` → 8, `"1k"` → 1000; `"1.5"` is an error (not a whole
/// number), as are garbage, negative values and overflow.
pub fn quantity_to_count(q: &str) -> Result<u64, FormatError> {
    let v = parse_milli(keys::QUANTITY, q, true)?;
    if v % 1000 != 0 {
        return Err(FormatError::Malformed {
            key: keys::QUANTITY,
            detail: format!("not a whole number: {}", snippet(q.trim())),
        });
    }
    u64::try_from(v / 1000).map_err(|_| too_large(keys::QUANTITY, q))
}

fn too_large(key: &'static str, q: &str) -> FormatError {
    FormatError::OutOfRange {
        key,
        field: "value",
        detail: format!("is too large: {}", snippet(q.trim())),
    }
}

/// The exact value of `q` in thousandths, rounded up. With `allow_si == false` only plain
/// decimals and the `e<n>` exponent form are accepted (no `k`, `Mi`, `m`, `u`...).
pub(crate) fn parse_milli(key: &'static str, q: &str, allow_si: bool) -> Result<u128, FormatError> {
    let t = checked_record(key, q)?;
    let (int_part, frac_part, suffix) = split_quantity(key, t)?;

    // Power of ten and power of two the digits are multiplied by, counting in thousandths.
    let (mut pow10, pow2) = suffix_scale(suffix, allow_si).map_err(|why| malformed(key, t, why))?;
    pow10 += 3;

    // Common case, whole numbers (`8`, `500m`, `64Gi`): exact in a u128 without the
    // general path (≤ 15 digits × 10^21, or × 10^3 × 2^60, stays below 2^128).
    if frac_part.is_empty()
        && int_part.len() <= 15
        && pow10 >= 0
        && ((pow2 == 0 && pow10 <= 21) || pow10 <= 3)
    {
        let int = int_part
            .bytes()
            .fold(0u128, |acc, b| acc * 10 + u128::from(b - b'0'));
        return Ok((int * 10u128.pow(pow10 as u32)) << pow2);
    }

    let Some((mantissa, pow10)) = significant(key, t, int_part, frac_part, pow10)? else {
        return Ok(0);
    };
    scale_up(key, t, mantissa, pow10, pow2)
}

/// A malformed-quantity error: `why`, then the (shortened) record `t`.
fn malformed(key: &'static str, t: &str, why: &str) -> FormatError {
    FormatError::Malformed {
        key,
        detail: format!("{why}: {}", snippet(t)),
    }
}

/// Splits a checked record into integer digits, fraction digits and suffix; refuses a
/// negative sign, a second decimal point and a record without digits.
fn split_quantity<'t>(
    key: &'static str,
    t: &'t str,
) -> Result<(&'t str, &'t str, &'t str), FormatError> {
    let unsigned = match t.as_bytes()[0] {
        b'+' => &t[1..],
        b'-' => {
            return Err(FormatError::OutOfRange {
                key,
                field: "value",
                detail: format!("must not be negative: {}", snippet(t)),
            });
        }
        _ => t,
    };
    let num_len = unsigned
        .bytes()
        .position(|b| !(b.is_ascii_digit() || b == b'.'))
        .unwrap_or(unsigned.len());
    let (number, suffix) = unsigned.split_at(num_len);
    let (int_part, frac_part) = match number.split_once('.') {
        Some((i, f)) => (i, f),
        None => (number, ""),
    };
    if frac_part.contains('.') {
        return Err(malformed(key, t, "more than one decimal point"));
    }
    if int_part.is_empty() && frac_part.is_empty() {
        return Err(malformed(key, t, "not a quantity"));
    }
    Ok((int_part, frac_part, suffix))
}

/// The power of ten and power of two a suffix multiplies the number by (SI suffixes only
/// with `allow_si`), or why the suffix is refused.
fn suffix_scale(suffix: &str, allow_si: bool) -> Result<(i64, u32), &'static str> {
    Ok(match suffix {
        "" => (0, 0),
        "n" if allow_si => (-9, 0),
        "u" if allow_si => (-6, 0),
        "m" if allow_si => (-3, 0),
        "k" if allow_si => (3, 0),
        "M" if allow_si => (6, 0),
        "G" if allow_si => (9, 0),
        "T" if allow_si => (12, 0),
        "P" if allow_si => (15, 0),
        "E" if allow_si => (18, 0),
        "Ki" if allow_si => (0, 10),
        "Mi" if allow_si => (0, 20),
        "Gi" if allow_si => (0, 30),
        "Ti" if allow_si => (0, 40),
        "Pi" if allow_si => (0, 50),
        "Ei" if allow_si => (0, 60),
        s if s.len() > 1 && (s.starts_with('e') || s.starts_with('E')) => {
            (parse_exponent(&s[1..]).ok_or("bad exponent")?, 0)
        }
        _ => return Err("unknown suffix"),
    })
}

/// The number's significant digits as a mantissa, with the power of ten (`pow10`, for
/// the digits as written) adjusted to it; `None` when the number is zero. Refuses more
/// than [`MAX_SIGNIFICANT_DIGITS`] significant digits.
fn significant(
    key: &'static str,
    t: &str,
    int_part: &str,
    frac_part: &str,
    mut pow10: i64,
) -> Result<Option<(u128, i64)>, FormatError> {
    // Significant digits: drop leading zeros, fold trailing zeros into the exponent.
    let digits = int_part.bytes().chain(frac_part.bytes());
    pow10 -= frac_part.len() as i64;
    let mut sig: Vec<u8> = digits.skip_while(|&b| b == b'0').collect();
    while sig.last() == Some(&b'0') {
        sig.pop();
        pow10 += 1;
    }
    if sig.is_empty() {
        return Ok(None);
    }
    if sig.len() > MAX_SIGNIFICANT_DIGITS {
        return Err(FormatError::OutOfRange {
            key,
            field: "value",
            detail: format!(
                "has more than {MAX_SIGNIFICANT_DIGITS} significant digits: {}",
                snippet(t)
            ),
        });
    }
    let mantissa = sig
        .iter()
        .fold(0u128, |acc, &b| acc * 10 + u128::from(b - b'0'));
    Ok(Some((mantissa, pow10)))
}

/// `mantissa × 2^pow2 × 10^pow10`, exactly, rounded up to an integer; an error when it
/// does not fit a `u128`.
fn scale_up(
    key: &'static str,
    t: &str,
    mantissa: u128,
    pow10: i64,
    pow2: u32,
) -> Result<u128, FormatError> {
    let mut n = U256::from_u128(mantissa);
    // mantissa < 10^38 < 2^127, so a shift of at most 60 bits stays below 2^187.
    n.mul_small(1u64 << pow2);
    if pow10 >= 0 {
        let mut left = pow10;
        while left > 0 {
            let k = left.min(19);
            if !n.mul_small(10u64.pow(k as u32)) {
                return Err(too_large(key, t));
            }
            left -= k;
        }
    } else {
        let mut left = -pow10;
        if left > 78 {
            // 10^78 > 2^256 > n > 0: the exact value is in (0, 1).
            return Ok(1);
        }
        while left > 0 {
            let k = left.min(19);
            // ceil(ceil(x / a) / b) == ceil(x / (a * b)) for positive integers.
            if n.div_small(10u64.pow(k as u32)) != 0 {
                n.add_one();
            }
            left -= k;
        }
    }
    n.to_u128().ok_or_else(|| too_large(key, t))
}

/// A signed decimal exponent with magnitude at most [`MAX_EXPONENT`].
fn parse_exponent(s: &str) -> Option<i64> {
    let (neg, digits) = match s.as_bytes().first()? {
        b'+' => (false, &s[1..]),
        b'-' => (true, &s[1..]),
        _ => (false, s),
    };
    if digits.is_empty() || digits.len() > 6 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let v: i64 = digits.parse().ok()?;
    if v > MAX_EXPONENT {
        return None;
    }
    Some(if neg { -v } else { v })
}

/// A little-endian 256-bit unsigned integer with just the operations the parser needs.
#[derive(Debug, Clone, Copy)]
struct U256([u64; 4]);

impl U256 {
    fn from_u128(v: u128) -> Self {
        U256([v as u64, (v >> 64) as u64, 0, 0])
    }

    /// `self *= m`; false (and `self` unspecified) on overflow.
    fn mul_small(&mut self, m: u64) -> bool {
        let mut carry: u128 = 0;
        for limb in &mut self.0 {
            let p = u128::from(*limb) * u128::from(m) + carry;
            *limb = p as u64;
            carry = p >> 64;
        }
        carry == 0
    }

    /// `self /= d`, returning the remainder. `d` must be non-zero.
    fn div_small(&mut self, d: u64) -> u64 {
        let mut rem: u128 = 0;
        for limb in self.0.iter_mut().rev() {
            let cur = (rem << 64) | u128::from(*limb);
            *limb = (cur / u128::from(d)) as u64;
            rem = cur % u128::from(d);
        }
        rem as u64
    }

    /// `self += 1`, wrapping at 2^256 (never reached: it is only called after a division).
    fn add_one(&mut self) {
        for limb in &mut self.0 {
            let (v, carry) = limb.overflowing_add(1);
            *limb = v;
            if !carry {
                return;
            }
        }
    }

    fn to_u128(self) -> Option<u128> {
        if self.0[2] != 0 || self.0[3] != 0 {
            return None;
        }
        Some(u128::from(self.0[0]) | (u128::from(self.0[1]) << 64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn milli_examples() {
        for (q, want) in [
            ("500m", 500),
            ("2", 2000),
            ("1.5", 1500),
            ("2k", 2_000_000),
            ("0.1m", 1),
            ("0", 0),
            ("0.000", 0),
            ("+3", 3000),
            (".5", 500),
            ("5.", 5000),
            ("1e3", 1_000_000),
            ("1E-3", 1),
            ("100e-5", 1),
            (" 7 ", 7000),
            ("1Ki", 1_024_000),
            ("0e999", 0),
        ] {
            assert_eq!(quantity_to_milli(q), Ok(want), "{q}");
        }
    }

    #[test]
    fn micro_and_nano_round_up_to_the_milli() {
        for (q, want) in [
            ("500u", 1),
            ("1000u", 1),
            ("1001u", 2),
            ("1500u", 2),
            ("2000000u", 2000),
            ("0u", 0),
            ("1n", 1),
            ("1000000n", 1),
            ("1500000n", 2),
            ("3000000000n", 3000),
            ("0.5u", 1),
            ("+250000u", 250),
        ] {
            assert_eq!(quantity_to_milli(q), Ok(want), "{q}");
        }
        assert_eq!(quantity_to_bytes("1u"), Ok(1));
        assert_eq!(quantity_to_bytes("2000000000n"), Ok(2));
        assert_eq!(quantity_to_bytes("0n"), Ok(0));
        assert_eq!(quantity_to_count("3000000u"), Ok(3));
        assert_eq!(quantity_to_count("1000000000n"), Ok(1));
        assert!(quantity_to_count("1500000u").is_err(), "not a whole number");
        for bad in ["1U", "1N", "1µ", "1nu", "1un", "-1u", "u", "1 u"] {
            assert!(quantity_to_milli(bad).is_err(), "{bad}");
        }
        // Only where SI suffixes are allowed.
        assert!(parse_milli(keys::QUANTITY, "5u", false).is_err());
    }

    #[test]
    fn bytes_examples() {
        for (q, want) in [
            ("64Gi", 64u64 << 30),
            ("1G", 1_000_000_000),
            ("512Mi", 512 << 20),
            ("1000", 1000),
            ("1e3", 1000),
            ("0.5Gi", 1 << 29),
            ("1500m", 2),
            ("1m", 1),
            ("16Gi", 16 << 30),
            ("1.5Ki", 1536),
            ("0.001Ki", 2),
            ("15Ei", 15 << 60),
            ("18446744073709551615", u64::MAX),
            ("1E", 1_000_000_000_000_000_000),
            (
                "0.0000000000000000000000000000000000000000000000000000000000000000000000000000000001",
                1,
            ),
            ("1e-1000", 1),
            ("123456789012345678901234567890e-20", 1_234_567_891),
        ] {
            assert_eq!(quantity_to_bytes(q), Ok(want), "{q}");
        }
    }

    #[test]
    fn count_examples() {
        assert_eq!(quantity_to_count("8"), Ok(8));
        assert_eq!(quantity_to_count("8000m"), Ok(8));
        assert_eq!(quantity_to_count("1k"), Ok(1000));
        assert_eq!(quantity_to_count("2e1"), Ok(20));
        let e = quantity_to_count("1.5").unwrap_err();
        assert_eq!(e.to_string(), "quantity: not a whole number: \"1.5\"");
    }

    #[test]
    fn garbage_is_refused_with_a_message() {
        for bad in [
            "",
            " ",
            "abc",
            "1.2.3",
            ".",
            "1 Gi",
            "1gi",
            "1KiB",
            "1e",
            "1e+",
            "0x10",
            "NaN",
            "inf",
            "1,5",
            "١",
            "1e99999999",
            "1e1001",
            "--1",
            "+-1",
            "1Gi ",
            "1e3.5",
            "12345678901234567890123456789012345678901",
            "∞",
        ] {
            let r = quantity_to_bytes(bad);
            if bad == "1Gi " {
                assert!(r.is_ok());
                continue;
            }
            let e = r.expect_err(bad);
            assert!(e.to_string().starts_with("quantity: "), "{e}");
        }
        let e = quantity_to_bytes("-1Gi").unwrap_err();
        assert_eq!(
            e.to_string(),
            "quantity: value must not be negative: \"-1Gi\""
        );
        assert!(matches!(
            quantity_to_bytes("16Ei"),
            Err(FormatError::OutOfRange { .. })
        ));
        assert!(matches!(
            quantity_to_milli("18446744073709552"),
            Err(FormatError::OutOfRange { .. })
        ));
        assert!(matches!(
            quantity_to_bytes("1e100"),
            Err(FormatError::OutOfRange { .. })
        ));
        let huge = "9".repeat(1 << 20);
        assert!(matches!(
            quantity_to_bytes(&huge),
            Err(FormatError::TooLarge { .. })
        ));
        let long_zeros = format!("0.{}1", "0".repeat(60_000));
        assert_eq!(quantity_to_bytes(&long_zeros), Ok(1));
    }

    const BIN: [(&str, u32); 7] = [
        ("", 0),
        ("Ki", 10),
        ("Mi", 20),
        ("Gi", 30),
        ("Ti", 40),
        ("Pi", 50),
        ("Ei", 60),
    ];
    const DEC: [(&str, u32); 7] = [
        ("", 0),
        ("k", 3),
        ("M", 6),
        ("G", 9),
        ("T", 12),
        ("P", 15),
        ("E", 18),
    ];

    proptest! {
        #[test]
        fn never_panics(s in ".{0,80}") {
            let _ = quantity_to_milli(&s);
            let _ = quantity_to_bytes(&s);
            let _ = quantity_to_count(&s);
        }

        #[test]
        fn never_panics_on_quantity_like_text(s in "[-+]?[0-9.]{0,45}([eE][-+]?[0-9]{0,5}|[kMGTPEm]|[KMGTPE]i)?") {
            let _ = quantity_to_milli(&s);
            let _ = quantity_to_bytes(&s);
            let _ = quantity_to_count(&s);
        }

        /// The whole-number shortcut agrees with the general path (`n.0` takes it).
        #[test]
        fn whole_number_shortcut_is_exact(
            n in prop_oneof![0u64..2000, 0u64..1_000_000_000_000_000],
            suf in "(|m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei|e[0-9]{1,2}|e-[0-9])",
        ) {
            let fast = parse_milli(keys::QUANTITY, &format!("{n}{suf}"), true);
            let general = parse_milli(keys::QUANTITY, &format!("{n}.0{suf}"), true);
            prop_assert_eq!(fast.ok(), general.ok());
        }

        #[test]
        fn never_panics_on_bytes(b in proptest::collection::vec(any::<u8>(), 0..64)) {
            let s = String::from_utf8_lossy(&b);
            let _ = quantity_to_bytes(&s);
        }

        #[test]
        fn binary_round_trip(n in 0u64..1_000_000, i in 0usize..7) {
            let (suf, shift) = BIN[i];
            let q = format!("{n}{suf}");
            match u64::try_from(u128::from(n) << shift) {
                Ok(want) => {
                    prop_assert_eq!(quantity_to_bytes(&q), Ok(want));
                    prop_assert_eq!(quantity_to_count(&q), Ok(want));
                }
                Err(_) => prop_assert!(quantity_to_bytes(&q).is_err()),
            }
        }

        #[test]
        fn decimal_round_trip(n in 0u64..1_000_000, i in 0usize..7) {
            let (suf, exp) = DEC[i];
            let want = u128::from(n) * 10u128.pow(exp);
            for q in [format!("{n}{suf}"), format!("{n}e{exp}")] {
                match u64::try_from(want) {
                    Ok(w) => prop_assert_eq!(quantity_to_bytes(&q), Ok(w)),
                    Err(_) => prop_assert!(quantity_to_bytes(&q).is_err()),
                }
            }
        }

        #[test]
        fn milli_round_trip(v in 0u64..10_000_000_000) {
            let q = format!("{}.{:03}", v / 1000, v % 1000);
            prop_assert_eq!(quantity_to_milli(&q), Ok(v));
            prop_assert_eq!(quantity_to_milli(&format!("{v}m")), Ok(v));
            prop_assert_eq!(quantity_to_bytes(&format!("{v}m")), Ok(v.div_ceil(1000)));
            prop_assert_eq!(quantity_to_count(&q).is_ok(), v % 1000 == 0);
        }

        #[test]
        fn micro_and_nano_agree_with_milli(v in 0u64..10_000_000_000) {
            prop_assert_eq!(quantity_to_milli(&format!("{v}u")), Ok(v.div_ceil(1000)));
            prop_assert_eq!(quantity_to_milli(&format!("{v}n")), Ok(v.div_ceil(1_000_000)));
            prop_assert_eq!(quantity_to_milli(&format!("{}u", v * 1000)), Ok(v));
            prop_assert_eq!(quantity_to_bytes(&format!("{v}n")), Ok(v.div_ceil(1_000_000_000)));
        }

        #[test]
        fn fractional_binary_rounds_up(whole in 0u64..1000, frac in 0u32..1000, i in 1usize..5) {
            let (suf, shift) = BIN[i];
            let q = format!("{whole}.{frac:03}{suf}");
            // exact = (whole * 1000 + frac) * 2^shift / 1000, rounded up
            let num = (u128::from(whole) * 1000 + u128::from(frac)) << shift;
            let want = num.div_ceil(1000) as u64;
            prop_assert_eq!(quantity_to_bytes(&q), Ok(want));
        }
    }
}
