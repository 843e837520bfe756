//! Allocated-but-idle GPUs: GPU activity of pods from dcgm-exporter series in Prometheus.
//!
//! ```text
//!   [refresh task, every --idle-refresh]
//!       GET <--prometheus-url>/api/v1/query?query=<SM_ACTIVE rule>   (--prometheus-timeout)
//!       GET <--prometheus-url>/api/v1/query?query=<GPU_UTIL rule>
//!       parse (bounded) -> per-pod peak activity -> IdleState (shared, replaced whole)
//!   [reconcile] reads IdleState: no I/O, never waits for Prometheus
//! ```
//!
//! The rule, per GPU: the highest sample over the lookback window of
//! `DCGM_FI_PROF_SM_ACTIVE` (a ratio 0..1), or, for GPUs that have no such series,
//! `DCGM_FI_DEV_GPU_UTIL` / 100 (a percentage). Only series that are still reported (a
//! sample within the last 5 minutes) and that already existed when the window began (a
//! sample within the 5 minutes before it) count, so a window with no data at its start is
//! never read as idle. A pod's peak is the highest of its GPUs; the core calls the pod idle
//! when that peak is under the threshold ([`gpu_defrag_core::model::Activity::is_idle`]).
//!
//! Pods are found by the labels dcgm-exporter writes with its Kubernetes pod mapping:
//! `namespace`/`pod`, or `exported_namespace`/`exported_pod` where Prometheus renamed them
//! (a scrape with `honor_labels: false` whose target has its own `pod` and `namespace`
//! labels). GPUs are told apart by `Hostname` and `gpu` (as the alert rule does), else by
//! `UUID`.
//!
//! Failures are never guesses: Prometheus unreachable, a timeout, an HTTP error, a
//! malformed or oversized answer all leave *no* idle data (and a reason) until the next
//! good answer. A bad sample (NaN, out of range) makes its pod unmeasured, not idle.
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use chrono::{DateTime, Utc};
use gpu_defrag_core::model::{Activity, PodActivity};
use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use serde::Deserialize;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
use tokio_rustls::rustls::{ClientConfig, RootCertStore};

use crate::lease::LeaderState;
use crate::metrics::Metrics;

/// Largest Prometheus answer read (8,000 GPUs take about 3 MB).
pub const MAX_RESPONSE_BYTES: usize = 32 * 1024 * 1024;
/// Series of one metric read at most per answer.
pub const MAX_SERIES: usize = 200_000;
/// How recent a GPU's last sample must be, and how close to the start of the window its
/// first one.
pub const FRESH: &str = "5m";
/// The profiling metric: SM activity, a ratio 0..1.
pub const SM_ACTIVE: &str = "DCGM_FI_PROF_SM_ACTIVE";
/// The fallback: GPU utilisation, a percentage 0..100.
pub const GPU_UTIL: &str = "DCGM_FI_DEV_GPU_UTIL";

/// Flags of `gpu-defrag run` for allocated-but-idle GPUs.
#[derive(Debug, Clone, clap::Args)]
pub struct IdleArgs {
    /// Base URL of a Prometheus that scrapes dcgm-exporter, `http://` or `https://`, e.g.
    /// `http://prometheus-operated.monitoring:9090`. Enables allocated-but-idle GPUs in
    /// status and metrics. Without it, nothing is queried.
    #[arg(long, env = "GPU_DEFRAG_PROMETHEUS_URL", value_name = "URL")]
    pub prometheus_url: Option<String>,
    /// PEM file of the CA certificates that sign an https Prometheus's certificate
    /// (default: the system's).
    #[arg(long, value_name = "FILE")]
    pub prometheus_ca_file: Option<PathBuf>,
    /// File holding a bearer token sent to Prometheus (read at every query, so a rotated
    /// token is picked up), e.g. a projected service account token behind kube-rbac-proxy.
    #[arg(long, value_name = "FILE", conflicts_with = "prometheus_username")]
    pub prometheus_bearer_token_file: Option<PathBuf>,
    /// User name for HTTP basic authentication to Prometheus (with
    /// `--prometheus-password-file`).
    #[arg(long, value_name = "NAME", requires = "prometheus_password_file")]
    pub prometheus_username: Option<String>,
    /// File holding the basic-authentication password (read at every query).
    #[arg(long, value_name = "FILE", requires = "prometheus_username")]
    pub prometheus_password_file: Option<PathBuf>,
    /// A GPU is idle when its activity (SM activity 0..1, or GPU utilisation / 100) stayed
    /// under this over the whole lookback window.
    #[arg(long, default_value_t = 0.3, value_name = "RATIO")]
    pub idle_threshold: f64,
    /// The window a GPU must have stayed under the threshold (e.g. `4h`, `30m`).
    #[arg(long, default_value = "4h", value_parser = duration_flag, value_name = "DURATION")]
    pub idle_lookback: Duration,
    /// How often Prometheus is queried.
    #[arg(long, default_value = "1m", value_parser = duration_flag, value_name = "DURATION")]
    pub idle_refresh: Duration,
    /// Time one Prometheus query may take (connect, send, read).
    #[arg(long, default_value = "10s", value_parser = duration_flag, value_name = "DURATION")]
    pub prometheus_timeout: Duration,
}

impl IdleArgs {
    /// The flags' defaults with `--prometheus-url url` (tests).
    #[cfg(test)]
    pub fn for_url(url: &str) -> Self {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            idle: IdleArgs,
        }
        Cli::parse_from(["gpu-defrag", "--prometheus-url", url]).idle
    }
}

fn duration_flag(s: &str) -> Result<Duration, String> {
    gpu_defrag_core::policy::parse_duration(s)
}

impl IdleArgs {
    /// The checked configuration, `None` without `--prometheus-url`.
    pub fn config(&self) -> Result<Option<IdleConfig>, String> {
        let Some(url) = &self.prometheus_url else {
            return Ok(None);
        };
        let endpoint = Endpoint::parse(url)?;
        let tls = match (endpoint.tls, &self.prometheus_ca_file) {
            (true, ca) => Some(tls_config(ca.as_deref())?),
            (false, Some(_)) => {
                return Err("--prometheus-ca-file needs an https:// --prometheus-url".into());
            }
            (false, None) => None,
        };
        let auth = match (
            &self.prometheus_bearer_token_file,
            &self.prometheus_username,
            &self.prometheus_password_file,
        ) {
            (None, None, None) => Auth::None,
            (Some(f), None, None) => Auth::Bearer(f.clone()),
            (None, Some(u), Some(f)) if !u.is_empty() && !u.contains(':') => Auth::Basic {
                username: u.clone(),
                password_file: f.clone(),
            },
            (None, Some(_), Some(_)) => {
                return Err("--prometheus-username must be non-empty, without ':'".into());
            }
            _ => {
                return Err("give either --prometheus-bearer-token-file or both --prometheus-username and --prometheus-password-file".into());
            }
        };
        if !(self.idle_threshold > 0.0 && self.idle_threshold <= 1.0) {
            return Err(format!(
                "--idle-threshold must be in (0, 1], not {}",
                self.idle_threshold
            ));
        }
        if self.idle_lookback < Duration::from_secs(1) || self.idle_lookback.subsec_nanos() != 0 {
            return Err(format!(
                "--idle-lookback must be whole seconds, at least 1s, not {:?}",
                self.idle_lookback
            ));
        }
        if self.idle_refresh < Duration::from_secs(1) {
            return Err("--idle-refresh must be at least 1s".into());
        }
        if self.prometheus_timeout < Duration::from_millis(100) {
            return Err("--prometheus-timeout must be at least 100ms".into());
        }
        Ok(Some(IdleConfig {
            endpoint,
            tls,
            auth,
            threshold: self.idle_threshold,
            lookback: self.idle_lookback,
            refresh: self.idle_refresh,
            timeout: self.prometheus_timeout,
        }))
    }
}

/// Where Prometheus listens: `http[s]://host[:port][/prefix]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// Whether it speaks TLS (`https://`).
    pub tls: bool,
    /// Host name or address (IPv6 without brackets).
    pub host: String,
    /// Port (80, or 443 for https, when the URL names none).
    pub port: u16,
    /// `Host` header value.
    pub authority: String,
    /// Path prefix without a trailing `/` (e.g. `/prometheus` behind a proxy), or empty.
    pub prefix: String,
}

impl Endpoint {
    /// Parses an `http://` or `https://` URL (no user info, query or fragment).
    pub fn parse(url: &str) -> Result<Self, String> {
        let bad = |why: &str| format!("--prometheus-url {url:?}: {why}");
        let uri: hyper::Uri = url.parse().map_err(|e| bad(&format!("{e}")))?;
        let tls = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            _ => return Err(bad("must start with http:// or https://")),
        };
        let auth = uri.authority().ok_or_else(|| bad("no host"))?;
        if auth.as_str().contains('@') {
            return Err(bad(
                "user info is not supported (use --prometheus-username and --prometheus-password-file)",
            ));
        }
        if uri.query().is_some() {
            return Err(bad("must not have a query"));
        }
        let host = auth.host().trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            return Err(bad("no host"));
        }
        Ok(Self {
            tls,
            host: host.to_string(),
            port: auth.port_u16().unwrap_or(if tls { 443 } else { 80 }),
            authority: auth.as_str().to_string(),
            prefix: uri.path().trim_end_matches('/').to_string(),
        })
    }
}

/// How the operator proves who it is to Prometheus. Secrets are read from their files at
/// every query (rotation needs no restart) and never logged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Auth {
    /// No credentials.
    None,
    /// `Authorization: Bearer <token in the file>`.
    Bearer(PathBuf),
    /// HTTP basic authentication.
    Basic {
        /// User name.
        username: String,
        /// File holding the password.
        password_file: PathBuf,
    },
}

/// Longest secret file read.
const MAX_SECRET_BYTES: u64 = 64 * 1024;
/// How often a standby looks whether it leads now (to start querying).
const STANDBY_POLL: Duration = Duration::from_secs(1);

impl Auth {
    /// The `Authorization` header value, if any.
    fn header(&self) -> Result<Option<String>, QueryError> {
        let read = |f: &PathBuf| -> Result<String, QueryError> {
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
        Ok(match self {
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
}

/// Standard base64 with padding (RFC 4648).
fn base64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The TLS client of an https Prometheus: the CA certificates of `ca_file` (PEM), or the
/// system's.
fn tls_config(ca_file: Option<&Path>) -> Result<Arc<ClientConfig>, String> {
    let mut roots = RootCertStore::empty();
    match ca_file {
        Some(f) => {
            let bad = |why: String| format!("--prometheus-ca-file {}: {why}", f.display());
            for cert in CertificateDer::pem_file_iter(f).map_err(|e| bad(e.to_string()))? {
                let cert = cert.map_err(|e| bad(e.to_string()))?;
                roots.add(cert).map_err(|e| bad(e.to_string()))?;
            }
            if roots.is_empty() {
                return Err(bad("no certificate in it".into()));
            }
        }
        None => {
            for cert in rustls_native_certs::load_native_certs().certs {
                let _ = roots.add(cert);
            }
            if roots.is_empty() {
                return Err(
                    "https --prometheus-url: no system CA certificates found; give --prometheus-ca-file"
                        .into(),
                );
            }
        }
    }
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let mut cfg = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// The checked configuration.
#[derive(Debug, Clone)]
pub struct IdleConfig {
    /// Prometheus.
    pub endpoint: Endpoint,
    /// TLS client (https).
    pub tls: Option<Arc<ClientConfig>>,
    /// Credentials.
    pub auth: Auth,
    /// Idle means activity under this (0..=1).
    pub threshold: f64,
    /// Window.
    pub lookback: Duration,
    /// Query interval.
    pub refresh: Duration,
    /// Timeout of one query.
    pub timeout: Duration,
}

impl IdleConfig {
    /// The instant query for `metric`: the highest sample of the window, for GPUs still
    /// reported now and already reported when the window began.
    pub fn query(&self, metric: &str) -> String {
        let lb = format!("{}s", self.lookback.as_secs());
        format!(
            "max_over_time({metric}[{lb}]) and last_over_time({metric}[{FRESH}]) \
             and last_over_time({metric}[{FRESH}] offset {lb})"
        )
    }

    /// The lookback as status shows it (`4h`, `15s`, `1h30m`).
    pub fn lookback_text(&self) -> String {
        let s = self.lookback.as_secs();
        let (h, m, sec) = (s / 3600, s % 3600 / 60, s % 60);
        let mut out = String::new();
        if h > 0 {
            out += &format!("{h}h");
        }
        if m > 0 {
            out += &format!("{m}m");
        }
        if sec > 0 || out.is_empty() {
            out += &format!("{sec}s");
        }
        out
    }
}

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
    /// An answer over [`MAX_RESPONSE_BYTES`] or [`MAX_SERIES`].
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

/// What the series said, beside the per-pod activity.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SeriesStats {
    /// GPUs measured by `DCGM_FI_PROF_SM_ACTIVE`.
    pub sm_active: usize,
    /// GPUs measured by `DCGM_FI_DEV_GPU_UTIL` (no SM activity series).
    pub gpu_util: usize,
    /// Series without a pod (free GPUs, or pod mapping off).
    pub without_pod: usize,
    /// Series skipped: NaN or out-of-range values, no GPU identity, a pod without a
    /// namespace. Their pods are not measured.
    pub invalid: usize,
}

/// One good answer.
#[derive(Debug, Clone)]
pub struct Measured {
    /// Per-pod activity with the threshold and lookback.
    pub activity: Activity,
    /// When it was read.
    pub at: DateTime<Utc>,
    /// Series counts.
    pub stats: SeriesStats,
}

/// The current idle data.
#[derive(Debug, Clone)]
pub enum IdleState {
    /// No answer yet.
    Pending,
    /// The last refresh succeeded.
    Ready(Arc<Measured>),
    /// The last refresh failed: no idle data.
    Failed {
        /// Why.
        error: QueryError,
        /// When.
        at: DateTime<Utc>,
    },
}

/// The idle data source: configuration and the last result. Cheap to clone.
#[derive(Clone)]
pub struct IdleSource {
    cfg: Arc<IdleConfig>,
    state: Arc<RwLock<IdleState>>,
}

impl IdleSource {
    /// A source with no data yet.
    pub fn new(cfg: IdleConfig) -> Self {
        Self {
            cfg: Arc::new(cfg),
            state: Arc::new(RwLock::new(IdleState::Pending)),
        }
    }

    /// A source holding `state` (tests).
    #[cfg(test)]
    pub fn with_state(cfg: IdleConfig, state: IdleState) -> Self {
        Self {
            cfg: Arc::new(cfg),
            state: Arc::new(RwLock::new(state)),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &IdleConfig {
        &self.cfg
    }

    /// The current state (a cheap clone).
    pub fn state(&self) -> IdleState {
        self.state.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Queries both metrics once (each within the timeout) and builds the activity.
    pub async fn fetch(&self) -> Result<Measured, QueryError> {
        let sm = self.query(SM_ACTIVE).await?;
        let util = self.query(GPU_UTIL).await?;
        let (pods, stats) = activity_of(&sm, &util);
        Ok(Measured {
            activity: Activity {
                pods,
                threshold: self.cfg.threshold,
                lookback: self.cfg.lookback,
            },
            at: Utc::now(),
            stats,
        })
    }

    async fn query(&self, metric: &str) -> Result<Vec<Sample>, QueryError> {
        let path = format!(
            "{}/api/v1/query?query={}",
            self.cfg.endpoint.prefix,
            url_encode(&self.cfg.query(metric))
        );
        let t = self.cfg.timeout;
        let (status, body) = tokio::time::timeout(t, get(&self.cfg, &path))
            .await
            .map_err(|_| QueryError::Timeout(t))??;
        parse_answer(status, &body)
    }

    /// Refreshes every `refresh` until the process ends, while this replica leads (a
    /// standby writes no status, so it does not load Prometheus; it starts querying the
    /// moment it takes over). `changed` is called when the set of measured pods or an
    /// error appears or goes away (to reconcile at once).
    pub async fn run(
        self,
        metrics: Metrics,
        leader: LeaderState,
        changed: impl Fn() + Send + 'static,
    ) {
        let mut last: Option<Result<HashMap<String, bool>, &'static str>> = None;
        loop {
            if !leader.is_leader() {
                tokio::time::sleep(self.cfg.refresh.min(STANDBY_POLL)).await;
                continue;
            }
            let result = self.fetch().await;
            let summary = match &result {
                Ok(m) => Ok(m
                    .activity
                    .pods
                    .iter()
                    .map(|(k, a)| (k.clone(), a.peak < m.activity.threshold))
                    .collect()),
                Err(e) => Err(e.kind()),
            };
            let state = match result {
                Ok(m) => IdleState::Ready(Arc::new(m)),
                Err(error) => {
                    tracing::warn!(%error, "idle GPUs: no data from Prometheus");
                    metrics.idle_query_error(error.kind());
                    IdleState::Failed {
                        error,
                        at: Utc::now(),
                    }
                }
            };
            *self.state.write().unwrap_or_else(|e| e.into_inner()) = state;
            if last.as_ref() != Some(&summary) {
                changed();
            }
            last = Some(summary);
            tokio::time::sleep(self.cfg.refresh).await;
        }
    }
}

/// `GET path` on the endpoint over HTTP/1.1 (in TLS for https, with the configured
/// credentials): `(status, body)`, the body at most [`MAX_RESPONSE_BYTES`].
async fn get(cfg: &IdleConfig, path: &str) -> Result<(u16, Bytes), QueryError> {
    let ep = &cfg.endpoint;
    let authorization = cfg.auth.header()?;
    let unreachable = |e: &dyn std::fmt::Display| {
        QueryError::Unreachable(format!("{}:{}: {e}", ep.host, ep.port))
    };
    let stream = tokio::net::TcpStream::connect((ep.host.as_str(), ep.port))
        .await
        .map_err(|e| unreachable(&e))?;
    match &cfg.tls {
        None => exchange(stream, ep, path, authorization.as_deref()).await,
        Some(tls) => {
            let name = ServerName::try_from(ep.host.clone()).map_err(|e| unreachable(&e))?;
            let stream = tokio_rustls::TlsConnector::from(tls.clone())
                .connect(name, stream)
                .await
                .map_err(|e| unreachable(&format!("TLS: {e}")))?;
            exchange(stream, ep, path, authorization.as_deref()).await
        }
    }
}

/// One request and its answer on a connected stream.
async fn exchange<S>(
    stream: S,
    ep: &Endpoint,
    path: &str,
    authorization: Option<&str>,
) -> Result<(u16, Bytes), QueryError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let unreachable = |e: &dyn std::fmt::Display| {
        QueryError::Unreachable(format!("{}:{}: {e}", ep.host, ep.port))
    };
    let io = hyper_util::rt::TokioIo::new(stream);
    let (mut sender, conn) = hyper::client::conn::http1::handshake::<_, Empty<Bytes>>(io)
        .await
        .map_err(|e| unreachable(&e))?;
    let conn = tokio::spawn(async move {
        let _ = conn.await;
    });
    let result = async {
        let mut req = hyper::Request::get(path)
            .header(hyper::header::HOST, &ep.authority)
            .header(hyper::header::ACCEPT, "application/json")
            .header(
                hyper::header::USER_AGENT,
                concat!("gpu-defrag/", env!("CARGO_PKG_VERSION")),
            );
        if let Some(a) = authorization {
            let mut v = hyper::header::HeaderValue::from_str(a)
                .map_err(|_| QueryError::Credentials("not a valid header value".into()))?;
            v.set_sensitive(true);
            req = req.header(hyper::header::AUTHORIZATION, v);
        }
        let req = req
            .body(Empty::new())
            .map_err(|e| QueryError::Malformed(format!("request: {e}")))?;
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| unreachable(&e))?;
        let status = resp.status().as_u16();
        let body = Limited::new(resp.into_body(), MAX_RESPONSE_BYTES)
            .collect()
            .await
            .map_err(|e| {
                if e.is::<http_body_util::LengthLimitError>() {
                    QueryError::TooLarge(format!("over {MAX_RESPONSE_BYTES} bytes"))
                } else {
                    unreachable(&e)
                }
            })?
            .to_bytes();
        Ok((status, body))
    }
    .await;
    conn.abort();
    result
}

/// Percent-encodes everything but RFC 3986 unreserved characters.
fn url_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            _ => out += &format!("%{b:02X}"),
        }
    }
    out
}

/// One element of an instant vector.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Sample {
    /// Labels.
    pub metric: HashMap<String, String>,
    /// `[unix seconds, "value"]`.
    pub value: (f64, String),
}

#[derive(Deserialize)]
struct Answer {
    status: String,
    #[serde(default)]
    data: Option<Data>,
    #[serde(default)]
    error: Option<String>,
}

#[derive(Deserialize)]
struct Data {
    #[serde(rename = "resultType")]
    result_type: String,
    result: Vec<Sample>,
}

/// The instant vector of a `/api/v1/query` answer. Anything else than a successful vector
/// answer is an error; the labels and values of its samples are judged later.
pub fn parse_answer(status: u16, body: &[u8]) -> Result<Vec<Sample>, QueryError> {
    let snippet = || String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
    let parsed: Result<Answer, _> = serde_json::from_slice(body);
    if !(200..300).contains(&status) {
        let message = match &parsed {
            Ok(Answer { error: Some(e), .. }) => e.chars().take(300).collect(),
            _ => snippet(),
        };
        return Err(QueryError::Http { status, message });
    }
    let a = parsed.map_err(|e| QueryError::Malformed(format!("{e} in {:?}", snippet())))?;
    if a.status != "success" {
        return Err(QueryError::Malformed(format!(
            "status {:?}: {}",
            a.status,
            a.error
                .unwrap_or_default()
                .chars()
                .take(300)
                .collect::<String>()
        )));
    }
    let data = a
        .data
        .ok_or_else(|| QueryError::Malformed("no data".into()))?;
    if data.result_type != "vector" {
        return Err(QueryError::Malformed(format!(
            "resultType {:?}, expected vector",
            data.result_type
        )));
    }
    if data.result.len() > MAX_SERIES {
        return Err(QueryError::TooLarge(format!(
            "{} series, at most {MAX_SERIES}",
            data.result.len()
        )));
    }
    Ok(data.result)
}

/// A non-empty label value.
fn label<'a>(m: &'a HashMap<String, String>, k: &str) -> Option<&'a str> {
    m.get(k).map(String::as_str).filter(|v| !v.is_empty())
}

/// `namespace/pod` of a series: `exported_*` (renamed by Prometheus) first. `Ok(None)`:
/// no pod (a free GPU); `Err`: a pod without its namespace.
fn pod_of(m: &HashMap<String, String>) -> Result<Option<String>, ()> {
    let (ns, pod) = match label(m, "exported_pod") {
        Some(p) => (label(m, "exported_namespace"), p),
        None => match label(m, "pod") {
            Some(p) => (label(m, "namespace"), p),
            None => return Ok(None),
        },
    };
    ns.map(|ns| Some(format!("{ns}/{pod}"))).ok_or(())
}

/// The GPU a series is about: `Hostname` and `gpu`, else `UUID` (with the MIG instance,
/// when there is one).
fn gpu_of(m: &HashMap<String, String>) -> Option<String> {
    let mig = label(m, "GPU_I_ID").unwrap_or("");
    match (label(m, "Hostname"), label(m, "gpu"), label(m, "UUID")) {
        (Some(h), Some(g), _) => Some(format!("{h}\u{0}{g}\u{0}{mig}")),
        (_, _, Some(u)) => Some(format!("\u{0}{u}\u{0}{mig}")),
        _ => None,
    }
}

/// The activity (0..=1) of a sample, `None` when not a number in range.
fn activity_value(s: &Sample, scale: f64) -> Option<f64> {
    let v: f64 = s.value.1.trim().parse().ok()?;
    let a = v / scale;
    (a.is_finite() && (0.0..=1.0 + 1e-9).contains(&a)).then_some(a.min(1.0))
}

/// Per-pod activity from the SM activity and GPU utilisation answers: a pod's peak is the
/// highest of its GPUs; a GPU with an SM activity series ignores its utilisation series.
/// A pod with any bad sample is left out (unmeasured, so never idle).
pub fn activity_of(sm: &[Sample], util: &[Sample]) -> (HashMap<String, PodActivity>, SeriesStats) {
    let mut stats = SeriesStats::default();
    let mut peaks: HashMap<String, (f64, HashSet<String>)> = HashMap::new();
    let mut poisoned: HashSet<String> = HashSet::new();
    let with_sm: HashSet<String> = sm.iter().filter_map(|s| gpu_of(&s.metric)).collect();
    for (samples, scale, is_sm) in [(sm, 1.0, true), (util, 100.0, false)] {
        for s in samples {
            let gpu = gpu_of(&s.metric);
            if !is_sm && gpu.as_ref().is_some_and(|g| with_sm.contains(g)) {
                continue;
            }
            let pod = match pod_of(&s.metric) {
                Ok(Some(p)) => p,
                Ok(None) => {
                    stats.without_pod += 1;
                    continue;
                }
                Err(()) => {
                    stats.invalid += 1;
                    continue;
                }
            };
            let (Some(gpu), Some(v)) = (gpu, activity_value(s, scale)) else {
                stats.invalid += 1;
                poisoned.insert(pod);
                continue;
            };
            if is_sm {
                stats.sm_active += 1;
            } else {
                stats.gpu_util += 1;
            }
            let e = peaks.entry(pod).or_insert((0.0, HashSet::new()));
            e.0 = e.0.max(v);
            e.1.insert(gpu);
        }
    }
    let pods = peaks
        .into_iter()
        .filter(|(k, _)| !poisoned.contains(k))
        .map(|(k, (peak, gpus))| {
            (
                k,
                PodActivity {
                    peak,
                    gpus: u32::try_from(gpus.len()).unwrap_or(u32::MAX),
                },
            )
        })
        .collect();
    (pods, stats)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn answer(result: serde_json::Value) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "status": "success",
            "data": {"resultType": "vector", "result": result}
        }))
        .unwrap()
    }

    fn series(labels: serde_json::Value, v: &str) -> serde_json::Value {
        json!({"metric": labels, "value": [1_700_000_000.5, v]})
    }

    fn gpu(host: &str, g: &str, ns: &str, pod: &str) -> serde_json::Value {
        json!({"Hostname": host, "gpu": g, "UUID": format!("GPU-{host}-{g}"),
               "modelName": "NVIDIA H100 80GB HBM3", "namespace": ns, "pod": pod,
               "container": "main"})
    }

    fn samples(v: serde_json::Value) -> Vec<Sample> {
        parse_answer(200, &answer(v)).unwrap()
    }

    #[test]
    fn sm_activity_wins_utilisation_is_the_fallback_and_pods_take_their_busiest_gpu() {
        let sm = samples(json!([
            series(gpu("n1", "0", "ml", "idle"), "0.05"),
            series(gpu("n1", "1", "ml", "busy"), "0.9"),
            // Two GPUs of one pod: the busier counts.
            series(gpu("n1", "2", "ml", "pair"), "0.1"),
            series(gpu("n1", "3", "ml", "pair"), "0.4"),
            // A free GPU (dcgm-exporter writes empty pod labels).
            series(gpu("n1", "4", "", ""), "0"),
        ]));
        let util = samples(json!([
            // Has SM activity: its low utilisation is ignored.
            series(gpu("n1", "1", "ml", "busy"), "3"),
            // No SM activity on node n2: utilisation in percent.
            series(gpu("n2", "0", "ml", "util-idle"), "12"),
            series(gpu("n2", "1", "ml", "util-busy"), "95"),
        ]));
        let (pods, stats) = activity_of(&sm, &util);
        let peak = |k: &str| pods.get(k).map(|a| (a.peak, a.gpus));
        assert_eq!(peak("ml/idle"), Some((0.05, 1)));
        assert_eq!(peak("ml/busy"), Some((0.9, 1)));
        assert_eq!(peak("ml/pair"), Some((0.4, 2)));
        assert_eq!(peak("ml/util-idle"), Some((0.12, 1)));
        assert_eq!(peak("ml/util-busy"), Some((0.95, 1)));
        assert_eq!(pods.len(), 5);
        assert_eq!(
            stats,
            SeriesStats {
                sm_active: 4,
                gpu_util: 2,
                without_pod: 1,
                invalid: 0
            }
        );
    }

    #[test]
    fn exported_labels_renamed_by_prometheus_win_over_the_targets_own() {
        // honor_labels: false and a target labelled with the exporter's own pod: Prometheus
        // keeps the exporter's labels as exported_pod / exported_namespace.
        let sm = samples(json!([
            series(
                json!({"Hostname": "n1", "gpu": "0", "pod": "dcgm-exporter-x",
                          "namespace": "gpu-operator", "exported_pod": "train-0",
                          "exported_namespace": "ml"}),
                "0.01"
            ),
            // A free GPU: only the target's labels are left.
            series(
                json!({"Hostname": "n1", "gpu": "1", "pod": "dcgm-exporter-x",
                          "namespace": "gpu-operator"}),
                "0"
            ),
        ]));
        let (pods, _) = activity_of(&sm, &[]);
        assert_eq!(pods["ml/train-0"].peak, 0.01);
        // The exporter's own pod holds no GPU, so the core never counts it.
        assert!(pods.contains_key("gpu-operator/dcgm-exporter-x"));
        assert_eq!(pods.len(), 2);
    }

    #[test]
    fn bad_samples_leave_their_pod_unmeasured_never_idle() {
        let sm = samples(json!([
            series(gpu("n1", "0", "ml", "nan"), "NaN"),
            series(gpu("n1", "1", "ml", "inf"), "+Inf"),
            series(gpu("n1", "2", "ml", "neg"), "-0.5"),
            series(gpu("n1", "3", "ml", "over"), "1.5"),
            series(gpu("n1", "4", "ml", "word"), "idle"),
            // One good GPU and one NaN: the pod is not measured.
            series(gpu("n1", "5", "ml", "mixed"), "0.0"),
            series(gpu("n1", "6", "ml", "mixed"), "NaN"),
            // A pod label without a namespace; a series with no GPU identity.
            series(json!({"Hostname": "n1", "gpu": "7", "pod": "lost"}), "0"),
            series(json!({"namespace": "ml", "pod": "anon"}), "0"),
            series(gpu("n1", "8", "ml", "ok"), " 0.2 "),
        ]));
        let util = samples(json!([series(gpu("n2", "0", "ml", "pct"), "100.5")]));
        let (pods, stats) = activity_of(&sm, &util);
        assert_eq!(pods.keys().collect::<Vec<_>>(), ["ml/ok"]);
        assert_eq!(stats.invalid, 9);
        assert_eq!(stats.sm_active, 2, "mixed/5 and ok");
    }

    #[test]
    fn answers_that_are_not_a_successful_vector_are_errors() {
        let cases: Vec<(u16, Vec<u8>, &str)> = vec![
            (200, b"".to_vec(), "malformed"),
            (200, b"<html>proxy login</html>".to_vec(), "malformed"),
            (200, b"{\"status\":\"success\"".to_vec(), "malformed"),
            (200, b"null".to_vec(), "malformed"),
            (200, b"[]".to_vec(), "malformed"),
            (200, br#"{"status":"success"}"#.to_vec(), "malformed"),
            (
                200,
                br#"{"status":"error","errorType":"bad_data","error":"parse error"}"#.to_vec(),
                "malformed",
            ),
            (
                200,
                br#"{"status":"success","data":{"resultType":"matrix","result":[]}}"#.to_vec(),
                "malformed",
            ),
            (
                200,
                br#"{"status":"success","data":{"resultType":"vector","result":{}}}"#.to_vec(),
                "malformed",
            ),
            // Wrong types: a numeric label, a numeric value string, a short value pair.
            (
                200,
                answer(json!([{"metric": {"pod": 3}, "value": [1.0, "0"]}])),
                "malformed",
            ),
            (
                200,
                answer(json!([{"metric": {}, "value": [1.0, 0.5]}])),
                "malformed",
            ),
            (
                200,
                answer(json!([{"metric": {}, "value": [1.0]}])),
                "malformed",
            ),
            (
                200,
                answer(json!([{"metric": {}, "value": "0.5"}])),
                "malformed",
            ),
            (200, answer(json!([{"value": [1.0, "0.5"]}])), "malformed"),
            (200, vec![0xff, 0xfe, 0x00], "malformed"),
            (
                400,
                br#"{"status":"error","errorType":"bad_data","error":"1:1: parse error"}"#.to_vec(),
                "http_status",
            ),
            (503, b"Service Unavailable".to_vec(), "http_status"),
            (302, b"".to_vec(), "http_status"),
        ];
        for (status, body, kind) in cases {
            let e = parse_answer(status, &body).expect_err(&String::from_utf8_lossy(&body));
            assert_eq!(
                e.kind(),
                kind,
                "{e} for {:?}",
                String::from_utf8_lossy(&body)
            );
        }
        let e = parse_answer(400, br#"{"status":"error","error":"1:1: parse error"}"#).unwrap_err();
        assert_eq!(
            e.to_string(),
            "Prometheus answered HTTP 400: 1:1: parse error"
        );
        // An empty vector is a good answer: no series.
        assert_eq!(parse_answer(200, &answer(json!([]))).unwrap(), vec![]);
    }

    #[test]
    fn huge_and_deep_answers_do_not_panic() {
        // Too many series.
        let one = series(gpu("n", "0", "ml", "p"), "0.1");
        let many = serde_json::Value::Array(vec![one; MAX_SERIES + 1]);
        let e = parse_answer(200, &answer(many)).unwrap_err();
        assert_eq!(e.kind(), "too_large");
        // Deep nesting: serde_json's recursion limit answers, no stack overflow.
        let deep = format!(
            "{{\"status\":\"success\",\"data\":{}{}",
            "[".repeat(100_000),
            "]".repeat(100_000)
        );
        assert_eq!(
            parse_answer(200, deep.as_bytes()).unwrap_err().kind(),
            "malformed"
        );
        // Long labels and many GPUs of one pod are fine.
        let long = "x".repeat(10_000);
        let big: Vec<serde_json::Value> = (0..1_000)
            .map(|i| series(gpu(&long, &i.to_string(), "ml", "wide"), "0.01"))
            .collect();
        let (pods, _) = activity_of(&samples(serde_json::Value::Array(big)), &[]);
        assert_eq!(pods["ml/wide"].gpus, 1_000);
    }

    #[test]
    fn flags_are_checked_and_urls_parsed() {
        let args = IdleArgs::for_url;
        let c = args("http://prometheus.monitoring:9090/")
            .config()
            .unwrap()
            .unwrap();
        assert_eq!(
            c.endpoint,
            Endpoint {
                tls: false,
                host: "prometheus.monitoring".into(),
                port: 9090,
                authority: "prometheus.monitoring:9090".into(),
                prefix: String::new()
            }
        );
        assert_eq!(c.lookback_text(), "4h");
        assert_eq!(
            c.query(SM_ACTIVE),
            "max_over_time(DCGM_FI_PROF_SM_ACTIVE[14400s]) and \
             last_over_time(DCGM_FI_PROF_SM_ACTIVE[5m]) and \
             last_over_time(DCGM_FI_PROF_SM_ACTIVE[5m] offset 14400s)"
        );
        let c = args("http://[::1]/prom").config().unwrap().unwrap();
        assert_eq!((c.endpoint.host.as_str(), c.endpoint.port), ("::1", 80));
        assert_eq!(c.endpoint.prefix, "/prom");
        for bad in [
            "p:9090",
            "ftp://p",
            "http://",
            "http://u:pw@p:9090",
            "http://p:9090/?x=1",
            "not a url",
        ] {
            assert!(args(bad).config().is_err(), "{bad}");
        }
        let mut a = args("http://p:9090");
        a.idle_threshold = 0.0;
        assert!(a.config().is_err());
        a.idle_threshold = f64::NAN;
        assert!(a.config().is_err());
        a.idle_threshold = 1.0;
        a.idle_lookback = Duration::from_millis(1500);
        assert!(a.config().is_err());
        a.idle_lookback = Duration::from_secs(5430);
        assert_eq!(a.config().unwrap().unwrap().lookback_text(), "1h30m30s");
        let none = IdleArgs {
            prometheus_url: None,
            ..args("http://p")
        };
        assert!(none.config().unwrap().is_none());
    }

    /// A loopback server answering every connection with `reply` (after `delay`); plain
    /// threads, so the client under test shares nothing with it.
    fn server(reply: Vec<u8>, delay: Duration) -> std::net::SocketAddr {
        use std::io::{Read, Write};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            for mut s in l.incoming().flatten() {
                let reply = reply.clone();
                std::thread::spawn(move || {
                    let mut buf = [0u8; 4096];
                    let _ = s.read(&mut buf);
                    std::thread::sleep(delay);
                    let _ = s.write_all(&reply);
                    let _ = s.shutdown(std::net::Shutdown::Write);
                });
            }
        });
        addr
    }

    fn source(addr: &str, timeout: Duration) -> IdleSource {
        IdleSource::new(
            IdleArgs {
                idle_lookback: Duration::from_secs(60),
                idle_refresh: Duration::from_secs(1),
                prometheus_timeout: timeout,
                ..IdleArgs::for_url(&format!("http://{addr}"))
            }
            .config()
            .unwrap()
            .unwrap(),
        )
    }

    fn http(status: &str, body: &[u8]) -> Vec<u8> {
        let mut r = format!(
            "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n",
            body.len()
        )
        .into_bytes();
        r.extend_from_slice(body);
        r
    }

    #[tokio::test]
    async fn fetch_reads_a_real_http_answer_and_reports_transport_failures() {
        let body = answer(json!([series(gpu("n1", "0", "ml", "p"), "0.2")]));
        let ok = server(http("200 OK", &body), Duration::ZERO);
        let m = source(&ok.to_string(), Duration::from_secs(5))
            .fetch()
            .await
            .unwrap();
        // Both queries got the same answer: the GPU counts once, by SM activity.
        assert_eq!(m.activity.pods["ml/p"].peak, 0.2);
        assert_eq!((m.stats.sm_active, m.stats.gpu_util), (1, 0));

        let slow = server(http("200 OK", &body), Duration::from_secs(5));
        let e = source(&slow.to_string(), Duration::from_millis(200))
            .fetch()
            .await
            .unwrap_err();
        assert_eq!(e.kind(), "timeout");

        let garbage = server(b"garbage\r\n\r\n".to_vec(), Duration::ZERO);
        let e = source(&garbage.to_string(), Duration::from_secs(5))
            .fetch()
            .await
            .unwrap_err();
        assert_eq!(e.kind(), "unreachable", "{e}");

        let html = server(http("200 OK", b"<html></html>"), Duration::ZERO);
        let e = source(&html.to_string(), Duration::from_secs(5))
            .fetch()
            .await
            .unwrap_err();
        assert_eq!(e.kind(), "malformed");

        // A port nobody listens on.
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let e = source(&closed.to_string(), Duration::from_secs(5))
            .fetch()
            .await
            .unwrap_err();
        assert_eq!(e.kind(), "unreachable");

        // Over the size limit (announced or not): refused, not read to the end.
        let mut huge = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n".to_vec();
        huge.resize(huge.len() + MAX_RESPONSE_BYTES + 10, b' ');
        let big = server(huge, Duration::ZERO);
        let e = source(&big.to_string(), Duration::from_secs(20))
            .fetch()
            .await
            .unwrap_err();
        assert_eq!(e.kind(), "too_large");
    }

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
    fn https_and_credential_flags_are_checked() {
        let dir =
            std::env::temp_dir().join(format!("gpu-defrag-idle-flags-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let a = |url: &str| IdleArgs::for_url(url);
        // https: port 443 by default; a CA file that holds no certificate is refused.
        let e = Endpoint::parse("https://thanos-querier.openshift-monitoring.svc:9091").unwrap();
        assert!(e.tls && e.port == 9091);
        assert_eq!(Endpoint::parse("https://p").unwrap().port, 443);
        let with_ca = |url: &str, ca: &std::path::Path| IdleArgs {
            prometheus_ca_file: Some(ca.into()),
            ..a(url)
        };
        let err = with_ca("https://p", &empty).config().unwrap_err();
        assert!(err.contains("no certificate"), "{err}");
        let err = with_ca("https://p", &dir.join("missing.pem"))
            .config()
            .unwrap_err();
        assert!(err.contains("missing.pem"), "{err}");
        let err = with_ca("http://p", &empty).config().unwrap_err();
        assert!(err.contains("https"), "{err}");
        // Credentials: one kind at a time, a user name needs its password file.
        let token = dir.join("token");
        let both = IdleArgs {
            prometheus_bearer_token_file: Some(token.clone()),
            prometheus_username: Some("u".into()),
            prometheus_password_file: Some(token.clone()),
            ..a("http://p")
        };
        assert!(both.config().is_err());
        let no_password = IdleArgs {
            prometheus_username: Some("u".into()),
            ..a("http://p")
        };
        assert!(no_password.config().is_err());
        let colon = IdleArgs {
            prometheus_username: Some("u:x".into()),
            prometheus_password_file: Some(token.clone()),
            ..a("http://p")
        };
        assert!(colon.config().is_err());
        let bearer = IdleArgs {
            prometheus_bearer_token_file: Some(token.clone()),
            ..a("http://p")
        };
        assert_eq!(bearer.config().unwrap().unwrap().auth, Auth::Bearer(token));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A loopback server answering `reply` and keeping every request head it got.
    fn recording_server(
        reply: Vec<u8>,
    ) -> (std::net::SocketAddr, Arc<std::sync::Mutex<Vec<String>>>) {
        use std::io::{Read, Write};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let heads = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = heads.clone();
        std::thread::spawn(move || {
            for mut s in l.incoming().flatten() {
                let mut buf = vec![0u8; 8192];
                let n = s.read(&mut buf).unwrap_or(0);
                seen.lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&buf[..n]).to_lowercase());
                let _ = s.write_all(&reply);
                let _ = s.shutdown(std::net::Shutdown::Write);
            }
        });
        (addr, heads)
    }

    #[tokio::test]
    async fn credentials_are_sent_and_read_again_at_every_query() {
        let dir = std::env::temp_dir().join(format!("gpu-defrag-idle-auth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let secret = dir.join("secret");
        let body = answer(json!([]));
        let (addr, heads) = recording_server(http("200 OK", &body));
        let src = |args: IdleArgs| IdleSource::new(args.config().unwrap().unwrap());
        let url = format!("http://{addr}");

        std::fs::write(&secret, "token-1\n").unwrap();
        let bearer = src(IdleArgs {
            prometheus_bearer_token_file: Some(secret.clone()),
            ..IdleArgs::for_url(&url)
        });
        bearer.fetch().await.unwrap();
        std::fs::write(&secret, "token-2").unwrap();
        bearer.fetch().await.unwrap();
        let basic = src(IdleArgs {
            prometheus_username: Some("u".into()),
            prometheus_password_file: Some(secret.clone()),
            ..IdleArgs::for_url(&url)
        });
        std::fs::write(&secret, "pw").unwrap();
        basic.fetch().await.unwrap();
        let got: Vec<String> = heads
            .lock()
            .unwrap()
            .iter()
            .map(|h| {
                h.lines()
                    .find_map(|l| l.strip_prefix("authorization: "))
                    .unwrap_or("none")
                    .trim()
                    .to_string()
            })
            .collect();
        // Two queries per fetch (SM activity, then utilisation).
        assert_eq!(
            got,
            [
                "bearer token-1",
                "bearer token-1",
                "bearer token-2",
                "bearer token-2",
                "basic dtpwdw==",
                "basic dtpwdw=="
            ]
        );
        // An unreadable secret: no query, a reason.
        std::fs::remove_file(&secret).unwrap();
        let e = bearer.fetch().await.unwrap_err();
        assert_eq!(
            (e.kind(), e.reason()),
            ("credentials", "CredentialsUnreadable")
        );
        assert_eq!(heads.lock().unwrap().len(), 6);
        std::fs::write(&secret, "   \n").unwrap();
        assert_eq!(bearer.fetch().await.unwrap_err().kind(), "credentials");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A standby sends Prometheus nothing; it queries from the moment it leads.
    #[tokio::test]
    async fn only_the_leader_queries_prometheus() {
        let body = answer(json!([]));
        let (addr, heads) = recording_server(http("200 OK", &body));
        let mut cfg = IdleArgs::for_url(&format!("http://{addr}"))
            .config()
            .unwrap()
            .unwrap();
        cfg.refresh = Duration::from_millis(50);
        let src = IdleSource::new(cfg);
        let leader = LeaderState::new();
        let task = tokio::spawn(src.run(Metrics::default(), leader.clone(), || {}));
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(heads.lock().unwrap().len(), 0, "a standby queried");
        leader.lead_until(std::time::Instant::now() + Duration::from_secs(600));
        let t0 = std::time::Instant::now();
        while heads.lock().unwrap().is_empty() {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "the leader never queried"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        task.abort();
    }
}
