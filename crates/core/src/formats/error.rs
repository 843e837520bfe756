//! The one error type of every parser in [`crate::formats`].

/// Why a record could not be read.
///
/// `Display` gives a short one-line message that names the annotation or field (`key`) and what
/// was wrong. Values quoted in messages are cut to about 64 characters and escaped, so a hostile
/// annotation cannot flood logs or inject control characters.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    /// The value was empty (or only whitespace) where a record was required.
    #[error("{key}: empty value")]
    Empty {
        /// Annotation or field name.
        key: &'static str,
    },
    /// A required annotation or field was absent.
    #[error("{key}: missing {what}")]
    Missing {
        /// Annotation or field name of the record being read.
        key: &'static str,
        /// What was missing (a field or another annotation).
        what: String,
    },
    /// The value was longer than the byte cap; it was not parsed.
    #[error("{key}: value is {len} bytes, over the {max}-byte limit")]
    TooLarge {
        /// Annotation or field name.
        key: &'static str,
        /// Length of the refused value in bytes.
        len: usize,
        /// The cap in bytes.
        max: usize,
    },
    /// The record holds more items (devices, containers) than allowed.
    #[error("{key}: more than {max} {what}")]
    TooMany {
        /// Annotation or field name.
        key: &'static str,
        /// Kind of item that was counted.
        what: &'static str,
        /// The cap.
        max: usize,
    },
    /// The value does not follow the record's syntax.
    #[error("{key}: {detail}")]
    Malformed {
        /// Annotation or field name.
        key: &'static str,
        /// What was wrong, with the offending part quoted (truncated).
        detail: String,
    },
    /// A number was well-formed but outside the accepted range (negative, too large, zero...).
    #[error("{key}: {field} {detail}")]
    OutOfRange {
        /// Annotation or field name.
        key: &'static str,
        /// The field within the record.
        field: &'static str,
        /// What was wrong, with the offending value quoted (truncated).
        detail: String,
    },
    /// The same device (UUID, index or minor) appears twice where it must be unique.
    #[error("{key}: duplicate {what} {value}")]
    Duplicate {
        /// Annotation or field name.
        key: &'static str,
        /// Kind of identifier that repeated.
        what: &'static str,
        /// The repeated identifier (quoted, truncated).
        value: String,
    },
}

impl FormatError {
    /// The annotation or field name this error is about.
    pub fn key(&self) -> &'static str {
        match self {
            FormatError::Empty { key }
            | FormatError::Missing { key, .. }
            | FormatError::TooLarge { key, .. }
            | FormatError::TooMany { key, .. }
            | FormatError::Malformed { key, .. }
            | FormatError::OutOfRange { key, .. }
            | FormatError::Duplicate { key, .. } => key,
        }
    }

    /// The same error, about another annotation or field. Useful for the quantity functions,
    /// whose errors name the generic key `"quantity"`:
    /// `quantity_to_bytes(v).map_err(|e| e.with_key("nvidia.com/gpumem"))`.
    pub fn with_key(mut self, new_key: &'static str) -> Self {
        match &mut self {
            FormatError::Empty { key }
            | FormatError::Missing { key, .. }
            | FormatError::TooLarge { key, .. }
            | FormatError::TooMany { key, .. }
            | FormatError::Malformed { key, .. }
            | FormatError::OutOfRange { key, .. }
            | FormatError::Duplicate { key, .. } => *key = new_key,
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_is_one_line_and_names_the_key() {
        let e = FormatError::Malformed {
            key: "hami.io/node-nvidia-register",
            detail: "bad".into(),
        };
        assert_eq!(e.to_string(), "hami.io/node-nvidia-register: bad");
        assert_eq!(e.key(), "hami.io/node-nvidia-register");
        let e = e.with_key("other");
        assert_eq!(e.key(), "other");
        let e = FormatError::TooLarge {
            key: "k",
            len: 70000,
            max: 65536,
        };
        assert_eq!(
            e.to_string(),
            "k: value is 70000 bytes, over the 65536-byte limit"
        );
    }
}
