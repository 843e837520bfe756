//! Small checked helpers shared by the parsers.

use super::{FormatError, MAX_DEVICES_PER_NODE, MAX_RECORD_BYTES, MAX_TEXT_FIELD_BYTES};

/// Characters of a value quoted in an error message.
const SNIPPET_CHARS: usize = 64;

/// `s` quoted and escaped for an error message, cut to [`SNIPPET_CHARS`] characters.
pub(crate) fn snippet(s: &str) -> String {
    let mut it = s.char_indices();
    match it.nth(SNIPPET_CHARS) {
        None => format!("{s:?}"),
        Some((cut, _)) => format!("{:?}…", &s[..cut]),
    }
}

/// Refuses values over [`MAX_RECORD_BYTES`] and blank values; returns the trimmed value.
pub(crate) fn checked_record<'a>(
    key: &'static str,
    value: &'a str,
) -> Result<&'a str, FormatError> {
    if value.len() > MAX_RECORD_BYTES {
        return Err(FormatError::TooLarge {
            key,
            len: value.len(),
            max: MAX_RECORD_BYTES,
        });
    }
    let t = value.trim();
    if t.is_empty() {
        return Err(FormatError::Empty { key });
    }
    Ok(t)
}

/// A non-negative decimal integer (ASCII digits only, surrounding whitespace allowed) no larger
/// than `max`.
pub(crate) fn parse_uint(
    key: &'static str,
    field: &'static str,
    s: &str,
    max: u64,
) -> Result<u64, FormatError> {
    let t = s.trim();
    if t.is_empty() {
        return Err(FormatError::Malformed {
            key,
            detail: format!("{field} is empty"),
        });
    }
    let digits = t.strip_prefix('+').unwrap_or(t);
    if let Some(rest) = digits.strip_prefix('-')
        && !rest.is_empty()
        && rest.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(FormatError::OutOfRange {
            key,
            field,
            detail: format!("must not be negative: {}", snippet(t)),
        });
    }
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(FormatError::Malformed {
            key,
            detail: format!("{field} is not a non-negative integer: {}", snippet(t)),
        });
    }
    let mut n: u64 = 0;
    for b in digits.bytes() {
        n = match n
            .checked_mul(10)
            .and_then(|n| n.checked_add(u64::from(b - b'0')))
        {
            Some(n) if n <= max => n,
            _ => {
                return Err(FormatError::OutOfRange {
                    key,
                    field,
                    detail: format!("exceeds {max}: {}", snippet(t)),
                });
            }
        };
    }
    Ok(n)
}

/// [`parse_uint`] bounded to `u32`.
pub(crate) fn parse_u32(
    key: &'static str,
    field: &'static str,
    s: &str,
) -> Result<u32, FormatError> {
    parse_uint(key, field, s, u64::from(u32::MAX)).map(|n| n as u32)
}

/// A device index or minor number: below [`MAX_DEVICES_PER_NODE`].
pub(crate) fn parse_index(
    key: &'static str,
    field: &'static str,
    s: &str,
) -> Result<u32, FormatError> {
    parse_uint(key, field, s, MAX_DEVICES_PER_NODE as u64 - 1).map(|n| n as u32)
}

/// Go's `strconv.ParseBool` spellings.
pub(crate) fn parse_bool(
    key: &'static str,
    field: &'static str,
    s: &str,
) -> Result<bool, FormatError> {
    match s.trim() {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        other => Err(FormatError::Malformed {
            key,
            detail: format!("{field} is not a boolean: {}", snippet(other)),
        }),
    }
}

/// A device identifier (UUID): non-empty, at most [`MAX_TEXT_FIELD_BYTES`], no whitespace,
/// control characters or record separators (`,` `:` `;`).
pub(crate) fn check_id(
    key: &'static str,
    field: &'static str,
    s: &str,
) -> Result<String, FormatError> {
    let t = s.trim();
    if t.is_empty() {
        return Err(FormatError::Malformed {
            key,
            detail: format!("{field} is empty"),
        });
    }
    if t.len() > MAX_TEXT_FIELD_BYTES {
        return Err(FormatError::OutOfRange {
            key,
            field,
            detail: format!(
                "is longer than {MAX_TEXT_FIELD_BYTES} bytes: {}",
                snippet(t)
            ),
        });
    }
    if t.chars()
        .any(|c| c.is_whitespace() || c.is_control() || matches!(c, ',' | ':' | ';'))
    {
        return Err(FormatError::Malformed {
            key,
            detail: format!("{field} has a forbidden character: {}", snippet(t)),
        });
    }
    Ok(t.to_owned())
}

/// A free-text field (model name): non-empty, at most [`MAX_TEXT_FIELD_BYTES`], no control
/// characters. Inner spaces are kept.
pub(crate) fn check_text(
    key: &'static str,
    field: &'static str,
    s: &str,
) -> Result<String, FormatError> {
    let t = s.trim();
    if t.is_empty() {
        return Err(FormatError::Malformed {
            key,
            detail: format!("{field} is empty"),
        });
    }
    if t.len() > MAX_TEXT_FIELD_BYTES {
        return Err(FormatError::OutOfRange {
            key,
            field,
            detail: format!(
                "is longer than {MAX_TEXT_FIELD_BYTES} bytes: {}",
                snippet(t)
            ),
        });
    }
    if t.chars().any(char::is_control) {
        return Err(FormatError::Malformed {
            key,
            detail: format!("{field} has a control character: {}", snippet(t)),
        });
    }
    Ok(t.to_owned())
}

/// Appends a location (such as `device 3`) to the error's detail.
pub(crate) fn at(e: FormatError, location: &str) -> FormatError {
    match e {
        FormatError::Malformed { key, detail } => FormatError::Malformed {
            key,
            detail: format!("{detail} ({location})"),
        },
        FormatError::OutOfRange { key, field, detail } => FormatError::OutOfRange {
            key,
            field,
            detail: format!("{detail} ({location})"),
        },
        FormatError::Missing { key, what } => FormatError::Missing {
            key,
            what: format!("{what} ({location})"),
        },
        other => other,
    }
}

/// Parses a JSON document, mapping syntax errors (including nesting deeper than serde_json's
/// recursion limit) to [`FormatError::Malformed`].
pub(crate) fn parse_json(key: &'static str, t: &str) -> Result<serde_json::Value, FormatError> {
    serde_json::from_str(t).map_err(|e| FormatError::Malformed {
        key,
        detail: format!("invalid JSON: {}", truncate(&e.to_string(), 120)),
    })
}

/// `s` cut to at most `max` characters (on a character boundary).
pub(crate) fn truncate(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        None => s.to_owned(),
        Some((cut, _)) => format!("{}…", &s[..cut]),
    }
}

/// Short description of a JSON value's type, for error messages.
pub(crate) fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// A JSON integer in `0..=max`.
pub(crate) fn json_uint(
    key: &'static str,
    field: &'static str,
    v: &serde_json::Value,
    max: u64,
) -> Result<u64, FormatError> {
    let serde_json::Value::Number(n) = v else {
        return Err(FormatError::Malformed {
            key,
            detail: format!("{field} must be a number, got {}", json_kind(v)),
        });
    };
    if let Some(u) = n.as_u64() {
        if u <= max {
            return Ok(u);
        }
        return Err(FormatError::OutOfRange {
            key,
            field,
            detail: format!("exceeds {max}: {u}"),
        });
    }
    if n.as_i64().is_some() || n.as_f64().is_some_and(|f| f < 0.0) {
        return Err(FormatError::OutOfRange {
            key,
            field,
            detail: format!("must not be negative: {}", snippet(&n.to_string())),
        });
    }
    if n.as_f64()
        .is_some_and(|f| f >= 18_446_744_073_709_551_616.0)
    {
        return Err(FormatError::OutOfRange {
            key,
            field,
            detail: format!("exceeds {max}: {}", snippet(&n.to_string())),
        });
    }
    Err(FormatError::Malformed {
        key,
        detail: format!("{field} is not an integer: {}", snippet(&n.to_string())),
    })
}

/// A JSON boolean; the strings `"true"` / `"false"` (Go `ParseBool` spellings) are accepted too.
pub(crate) fn json_bool(
    key: &'static str,
    field: &'static str,
    v: &serde_json::Value,
) -> Result<bool, FormatError> {
    match v {
        serde_json::Value::Bool(b) => Ok(*b),
        serde_json::Value::String(s) => parse_bool(key, field, s),
        other => Err(FormatError::Malformed {
            key,
            detail: format!("{field} must be a boolean, got {}", json_kind(other)),
        }),
    }
}

/// A JSON string field.
pub(crate) fn json_str<'a>(
    key: &'static str,
    field: &'static str,
    v: &'a serde_json::Value,
) -> Result<&'a str, FormatError> {
    v.as_str().ok_or_else(|| FormatError::Malformed {
        key,
        detail: format!("{field} must be a string, got {}", json_kind(v)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snippet_truncates_on_char_boundaries_and_escapes() {
        let long = "é".repeat(100);
        let s = snippet(&long);
        assert!(s.ends_with('…'));
        assert_eq!(s.chars().filter(|&c| c == 'é').count(), 64);
        assert_eq!(snippet("a\nb"), "\"a\\nb\"");
    }

    #[test]
    fn uint_rules() {
        assert_eq!(parse_uint("k", "f", " 42 ", 100), Ok(42));
        assert_eq!(parse_uint("k", "f", "+7", 100), Ok(7));
        assert!(matches!(
            parse_uint("k", "f", "-1", 100),
            Err(FormatError::OutOfRange { .. })
        ));
        assert!(matches!(
            parse_uint("k", "f", "101", 100),
            Err(FormatError::OutOfRange { .. })
        ));
        assert!(matches!(
            parse_uint("k", "f", "99999999999999999999999999", u64::MAX),
            Err(FormatError::OutOfRange { .. })
        ));
        for bad in ["", "1.5", "0x10", "1e3", "١٢", "-", "+", "--1"] {
            assert!(
                matches!(
                    parse_uint("k", "f", bad, u64::MAX),
                    Err(FormatError::Malformed { .. })
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn record_caps() {
        assert_eq!(checked_record("k", "  x "), Ok("x"));
        assert_eq!(
            checked_record("k", " \t"),
            Err(FormatError::Empty { key: "k" })
        );
        let big = "x".repeat(MAX_RECORD_BYTES + 1);
        assert!(matches!(
            checked_record("k", &big),
            Err(FormatError::TooLarge { .. })
        ));
    }
}
