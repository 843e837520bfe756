//! The flags of `gpu-defrag run` for idle GPUs and their checked configuration: where
//! Prometheus is, how to reach it (TLS, credentials) and which rule is queried.
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use rustls::{ClientConfig, RootCertStore};

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
    let provider = Arc::new(rustls::crypto::ring::default_provider());
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
        gpu_defrag_core::policy::duration_text(self.lookback)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
