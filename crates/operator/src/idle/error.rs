//! Why there is no idle data: the errors of one refresh.
use std::time::Duration;

/// Why there is no idle data.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum QueryError {
    /// Could not connect or the connection failed.
    #[error("Prometheus unreachable: {0}")]
    Unreachable(String),
    /// No complete answer within the timeout.
    #[error("Prometheus did not answer within {0:?}")]
    Timeout(Duration),
    /// A non-2xx answer.
    #[error("Prometheus answered HTTP {status}: {message}")]
    Http {
        /// Status code.
        status: u16,
        /// Its `error` field, or the start of the body.
        message: String,
    },
    /// An answer that is not what the Prometheus HTTP API returns.
    #[error("malformed Prometheus answer: {0}")]
    Malformed(String),
    /// An answer over [`MAX_RESPONSE_BYTES`](super::client::MAX_RESPONSE_BYTES) or
    /// [`MAX_SERIES`](super::parse::MAX_SERIES).
    #[error("Prometheus answer too large: {0}")]
    TooLarge(String),
    /// A credentials file could not be read.
    #[error("Prometheus credentials unreadable: {0}")]
    Credentials(String),
}

impl QueryError {
    /// `kind` label of `gpu_defrag_idle_query_errors_total`.
    pub fn kind(&self) -> &'static str {
        match self {
            QueryError::Unreachable(_) => "unreachable",
            QueryError::Timeout(_) => "timeout",
            QueryError::Http { .. } => "http_status",
            QueryError::Malformed(_) => "malformed",
            QueryError::TooLarge(_) => "too_large",
            QueryError::Credentials(_) => "credentials",
        }
    }

    /// PascalCase reason of the `IdleData` condition.
    pub fn reason(&self) -> &'static str {
        match self {
            QueryError::Unreachable(_) => "PrometheusUnreachable",
            QueryError::Timeout(_) => "PrometheusTimeout",
            QueryError::Http { .. } => "PrometheusError",
            QueryError::Malformed(_) | QueryError::TooLarge(_) => "MalformedResponse",
            QueryError::Credentials(_) => "CredentialsUnreadable",
        }
    }
}
