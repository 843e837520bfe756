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
//! Here: the source, its state and the refresh loop. [`config`]: the flags and the checked
//! configuration; [`client`]: the HTTP client; [`parse`]: reading answers (pure);
//! [`error`]: why there is no data.
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
use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use chrono::{DateTime, Utc};
use gpu_defrag_core::model::Activity;

use crate::lease::LeaderState;
use crate::metrics::Metrics;

mod client;
mod config;
mod error;
mod parse;

use client::Prometheus;
pub use config::{GPU_UTIL, IdleArgs, IdleConfig, SM_ACTIVE};
pub use error::QueryError;
pub use parse::SeriesStats;
use parse::{Sample, activity_of, parse_answer};

/// How often a standby looks whether it leads now (to start querying).
const STANDBY_POLL: Duration = Duration::from_secs(1);

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
    prometheus: Prometheus,
    state: Arc<RwLock<IdleState>>,
}

impl IdleSource {
    /// A source with no data yet.
    pub fn new(cfg: IdleConfig) -> Self {
        let cfg = Arc::new(cfg);
        Self {
            prometheus: Prometheus::new(cfg.clone()),
            cfg,
            state: Arc::new(RwLock::new(IdleState::Pending)),
        }
    }

    /// A source holding `state` (tests).
    #[cfg(test)]
    pub fn with_state(cfg: IdleConfig, state: IdleState) -> Self {
        let source = Self::new(cfg);
        *source.state.write().unwrap_or_else(|e| e.into_inner()) = state;
        source
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
        let (status, body) = self.prometheus.query(&self.cfg.query(metric)).await?;
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

#[cfg(test)]
mod tests {
    use super::client::MAX_RESPONSE_BYTES;
    use super::parse::tests::{answer, gpu, series};
    use super::*;
    use serde_json::json;

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
