//! The Prometheus HTTP client: `GET <prefix>/api/v1/query` on hyper-util's pooled client (one
//! kept-alive connection reused across queries; TLS by hyper-rustls for https), with the
//! configured credentials, within the timeout, reading at most [`MAX_RESPONSE_BYTES`].
use std::error::Error as _;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use hyper::header::{ACCEPT, AUTHORIZATION, HOST, HeaderValue, USER_AGENT};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

use super::config::{Auth, IdleConfig};
use super::error::QueryError;

/// Largest Prometheus answer read (8,000 GPUs take about 3 MB).
pub const MAX_RESPONSE_BYTES: usize = 32 * 1024 * 1024;
/// Longest secret file read.
const MAX_SECRET_BYTES: u64 = 64 * 1024;
/// How long an unused connection is kept (past the default refresh of 1m).
const KEEP_IDLE: Duration = Duration::from_secs(90);
/// What is percent-encoded in the query: everything but RFC 3986 unreserved characters.
const NOT_UNRESERVED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// The pooled connections, plain or TLS.
#[derive(Clone)]
enum Pool {
    Http(Client<HttpConnector, Empty<Bytes>>),
    Https(Client<HttpsConnector<HttpConnector>, Empty<Bytes>>),
}

/// A client of the configured Prometheus. Cheap to clone (clones share the connections).
#[derive(Clone)]
pub struct Prometheus {
    cfg: Arc<IdleConfig>,
    pool: Pool,
}

impl Prometheus {
    /// A client with no connection yet.
    pub fn new(cfg: Arc<IdleConfig>) -> Self {
        let mut builder = Client::builder(TokioExecutor::new());
        builder
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(KEEP_IDLE)
            .pool_max_idle_per_host(1);
        let mut http = HttpConnector::new();
        let pool = match &cfg.tls {
            None => Pool::Http(builder.build(http)),
            Some(tls) => {
                http.enforce_http(false);
                // `From` takes the TLS client as configured (its ALPN offers http/1.1; the
                // connector's builder wants it without ALPN).
                Pool::Https(builder.build(HttpsConnector::from((http, tls.clone()))))
            }
        };
        Self { cfg, pool }
    }

    /// The instant query `promql` within the timeout: `(status, body)`.
    pub async fn query(&self, promql: &str) -> Result<(u16, Bytes), QueryError> {
        let path = format!(
            "{}/api/v1/query?query={}",
            self.cfg.endpoint.prefix,
            utf8_percent_encode(promql, NOT_UNRESERVED)
        );
        let t = self.cfg.timeout;
        tokio::time::timeout(t, self.get(&path))
            .await
            .map_err(|_| QueryError::Timeout(t))?
    }

    /// `GET path` on the endpoint over HTTP/1.1 (in TLS for https, with the configured
    /// credentials): `(status, body)`, the body at most [`MAX_RESPONSE_BYTES`].
    async fn get(&self, path: &str) -> Result<(u16, Bytes), QueryError> {
        let ep = &self.cfg.endpoint;
        let authorization = authorization(&self.cfg.auth)?;
        let unreachable = |e: &(dyn std::error::Error + 'static)| {
            QueryError::Unreachable(format!("{}:{}: {}", ep.host, ep.port, causes(e)))
        };
        let scheme = if ep.tls { "https" } else { "http" };
        let mut req = hyper::Request::get(format!("{scheme}://{}{path}", ep.authority))
            .header(HOST, &ep.authority)
            .header(ACCEPT, "application/json")
            .header(
                USER_AGENT,
                concat!("gpu-defrag/", env!("CARGO_PKG_VERSION")),
            );
        if let Some(a) = authorization {
            let mut v = HeaderValue::from_str(&a)
                .map_err(|_| QueryError::Credentials("not a valid header value".into()))?;
            v.set_sensitive(true);
            req = req.header(AUTHORIZATION, v);
        }
        let req = req
            .body(Empty::new())
            .map_err(|e| QueryError::Malformed(format!("request: {e}")))?;
        let resp = match &self.pool {
            Pool::Http(c) => c.request(req),
            Pool::Https(c) => c.request(req),
        }
        .await
        // Its causes say it all ("client error (Connect)" says nothing more).
        .map_err(|e| unreachable(e.source().unwrap_or(&e)))?;
        let status = resp.status().as_u16();
        let body = Limited::new(resp.into_body(), MAX_RESPONSE_BYTES)
            .collect()
            .await
            .map_err(|e| {
                if e.is::<http_body_util::LengthLimitError>() {
                    QueryError::TooLarge(format!("over {MAX_RESPONSE_BYTES} bytes"))
                } else {
                    unreachable(&*e)
                }
            })?
            .to_bytes();
        Ok((status, body))
    }
}

/// An error and its causes, `: `-separated, a TLS failure marked as such.
fn causes(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = Vec::new();
    let mut cause = Some(e);
    while let Some(c) = cause {
        out.push(if is_tls(c) {
            format!("TLS: {c}")
        } else {
            c.to_string()
        });
        cause = c.source();
    }
    out.join(": ")
}

/// Whether `e` is a rustls error, maybe inside I/O errors.
fn is_tls(mut e: &(dyn std::error::Error + 'static)) -> bool {
    loop {
        if e.is::<rustls::Error>() {
            return true;
        }
        match e
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref)
        {
            Some(inner) => e = inner,
            None => return false,
        }
    }
}

/// The `Authorization` header value, if any. Secrets are read from their files at every
/// query (rotation needs no restart) and never logged.
fn authorization(auth: &Auth) -> Result<Option<String>, QueryError> {
    let read = |f: &std::path::PathBuf| -> Result<String, QueryError> {
        let bad = |why: String| QueryError::Credentials(format!("{}: {why}", f.display()));
        let meta = std::fs::metadata(f).map_err(|e| bad(e.to_string()))?;
        if meta.len() > MAX_SECRET_BYTES {
            return Err(bad(format!("over {MAX_SECRET_BYTES} bytes")));
        }
        let text = std::fs::read_to_string(f).map_err(|e| bad(e.to_string()))?;
        let text = text.trim();
        if text.is_empty() || text.chars().any(|c| c.is_control()) {
            return Err(bad("empty, or has control characters".into()));
        }
        Ok(text.to_string())
    };
    Ok(match auth {
        Auth::None => None,
        Auth::Bearer(f) => Some(format!("Bearer {}", read(f)?)),
        Auth::Basic {
            username,
            password_file,
        } => Some(format!(
            "Basic {}",
            base64(format!("{username}:{}", read(password_file)?).as_bytes())
        )),
    })
}

/// Standard base64 with padding (RFC 4648).
fn base64(bytes: &[u8]) -> String {
    STANDARD.encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc_4648() {
        for (i, o) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("foobar", "Zm9vYmFy"),
            ("u:pw", "dTpwdw=="),
        ] {
            assert_eq!(base64(i.as_bytes()), o, "{i}");
        }
    }

    #[test]
    fn queries_are_percent_encoded_but_unreserved_characters() {
        let q = "max_over_time(M[60s]) and m{a=\"b c\"} ~ é";
        assert_eq!(
            utf8_percent_encode(q, NOT_UNRESERVED).to_string(),
            "max_over_time%28M%5B60s%5D%29%20and%20m%7Ba%3D%22b%20c%22%7D%20~%20%C3%A9"
        );
    }

    #[test]
    fn transport_errors_name_their_causes() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert_eq!(causes(&refused), refused.to_string());
        let tls = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::General("handshake".into()),
        );
        assert_eq!(causes(&tls), format!("TLS: {tls}"));
        // hyper-rustls wraps the I/O error of the handshake in one of its own.
        let wrapped = std::io::Error::other(tls);
        assert_eq!(causes(&wrapped), format!("TLS: {wrapped}"));
    }
}
