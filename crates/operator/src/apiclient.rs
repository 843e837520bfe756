//! The operator's API client layer: client-side rate limiting (`--kube-qps`,
//! `--kube-burst`), a count of every request, and API-server outages made visible.
//!
//! ```text
//!   Api<K> calls ──> kube Buffer ──> [ApiLayer: token bucket ─> count ─> outage tracker]
//!                                        ──> kube's stack (auth, base URI, TLS) ──> API server
//! ```
//!
//! kube-rs has no client-side rate limiter of its own (client-go's `QPS`/`Burst`), so this
//! layer is one: a token bucket holding up to `burst` tokens, refilled at `qps` per second.
//! A request waits in `poll_ready` until it gets a token; a watch takes one token when it
//! starts, like in client-go. `qps = 0` turns the limiter off.
//!
//! Every request is counted by verb, resource and outcome in
//! `gpu_defrag_api_requests_total`. A request that gets no answer (connection refused, reset,
//! timeout) or a 503/504 answer after a good one starts an *outage*: logged, counted in
//! `gpu_defrag_api_outages_total`, `gpu_defrag_api_reachable` drops to 0. The first answer
//! below 500 ends it, and the next reconcile of each policy publishes a Warning event
//! `ApiServerUnavailable` on it with when it began, how long it lasted and how many requests
//! failed ([`untold_outages`]).
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::AtomicU64;
use std::sync::{LazyLock, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use http::{Request, Response};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};
use tracing::{info, warn};

use crate::objects::ts;

/// An API error as one line a person can read: `HTTP 404 NotFound: namespaces "x" not
/// found` for an answer of the API server, the error's own message (newlines folded) for
/// anything else (no answer, a decoding failure).
pub fn error_line(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => {
            let reason = if s.reason.is_empty() {
                "Failure"
            } else {
                s.reason.as_str()
            };
            format!("HTTP {} {reason}: {}", s.code, s.message.trim())
        }
        other => other
            .to_string()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" "),
    }
}

// === stats ===

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    verb: String,
    resource: String,
    outcome: String,
}

/// What the layer saw: counters for `/metrics` and the outage state.
pub struct ApiStats {
    requests: Family<RequestLabels, Counter>,
    outages: Counter,
    reachable: Gauge,
    throttled: Counter<f64, AtomicU64>,
    state: Mutex<Health>,
}

#[derive(Default)]
struct Health {
    /// The running outage: when it began, failed requests so far, the first error.
    current: Option<Outage>,
    /// Outages that ended, newest last (at most [`KEPT_OUTAGES`]).
    ended: Vec<Outage>,
    /// Sequence number of the last outage that ended (1-based; 0 = none yet).
    seq: u64,
    /// Per policy: the `seq` it was told about.
    reported: HashMap<String, u64>,
}

/// One stretch of time the API server did not answer (or answered only 503/504).
#[derive(Clone, Debug)]
pub struct Outage {
    /// When the first failed request ended.
    pub since: DateTime<Utc>,
    /// When the first good answer came back.
    pub until: Option<DateTime<Utc>>,
    /// Requests that failed during it.
    pub failed: u64,
    /// The first failure.
    pub error: String,
}

const KEPT_OUTAGES: usize = 8;

/// The process-wide stats (one API server per process).
pub fn stats() -> &'static ApiStats {
    static STATS: LazyLock<ApiStats> = LazyLock::new(|| {
        let s = ApiStats {
            requests: Family::default(),
            outages: Counter::default(),
            reachable: Gauge::default(),
            throttled: Counter::default(),
            state: Mutex::default(),
        };
        s.reachable.set(1);
        s
    });
    &STATS
}

impl ApiStats {
    /// Registers the families under the registry's prefix (`gpu_defrag_`).
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "api_requests",
            "Requests to the API server by verb, resource and outcome (ok, client_error, throttled, server_error, unavailable, unreachable)",
            self.requests.clone(),
        );
        r.register(
            "api_outages",
            "Times the API server stopped answering (no answer, or 503/504, after a good answer)",
            self.outages.clone(),
        );
        r.register(
            "api_reachable",
            "0 during an API-server outage, else 1",
            self.reachable.clone(),
        );
        r.register_with_unit(
            "api_client_throttled",
            "Time requests waited for the client-side rate limiter (--kube-qps, --kube-burst)",
            Unit::Seconds,
            self.throttled.clone(),
        );
    }

    fn record(&self, verb: &str, resource: &str, outcome: Outcome, error: impl FnOnce() -> String) {
        self.requests
            .get_or_create(&RequestLabels {
                verb: verb.to_string(),
                resource: resource.to_string(),
                outcome: outcome.label().to_string(),
            })
            .inc();
        let mut h = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if outcome.is_failure() {
            match h.current.as_mut() {
                Some(o) => o.failed += 1,
                None => {
                    let error = error();
                    warn!(%error, verb, resource, "API server unreachable; requests are retried with backoff");
                    self.outages.inc();
                    self.reachable.set(0);
                    h.current = Some(Outage {
                        since: Utc::now(),
                        until: None,
                        failed: 1,
                        error,
                    });
                }
            }
        } else if let Some(mut o) = h.current.take() {
            let now = Utc::now();
            o.until = Some(now);
            let secs = (now - o.since).as_seconds_f64();
            info!(
                seconds = format!("{secs:.1}"),
                failed = o.failed,
                "API server reachable again"
            );
            self.reachable.set(1);
            h.ended.push(o);
            if h.ended.len() > KEPT_OUTAGES {
                h.ended.remove(0);
            }
            h.seq += 1;
        }
    }

    /// Outages that ended since `policy` was last told, oldest first, and the mark to pass
    /// to [`ApiStats::told`] once they are told. A policy seen for the first time is told
    /// about none (it did not exist or was not reconciled by this process before them).
    fn untold(&self, policy: &str) -> (Vec<Outage>, u64) {
        let mut h = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let seq = h.seq;
        let told = *h.reported.entry(policy.to_string()).or_insert(seq);
        let n = (seq - told.min(seq)) as usize;
        let start = h.ended.len().saturating_sub(n);
        (h.ended[start..].to_vec(), seq)
    }

    /// `policy` was told every outage up to `seq` (a mark from [`ApiStats::untold`]).
    fn told(&self, policy: &str, seq: u64) {
        let mut h = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let mark = h.reported.entry(policy.to_string()).or_insert(seq);
        *mark = (*mark).max(seq);
    }
}

/// Outages a policy has not been told about yet: one note each, oldest first, and the
/// mark that says it was told.
pub struct Untold(Vec<(String, u64)>);

impl Untold {
    /// One note per outage (for an `ApiServerUnavailable` Warning event), oldest first.
    pub fn notes(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|(note, _)| note.as_str())
    }

    /// How many outages are untold.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// None.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The first `n` notes reached the policy (their events were published): they are not
    /// told again.
    pub fn told(&self, policy: &str, n: usize) {
        if let Some((_, seq)) = n.checked_sub(1).and_then(|i| self.0.get(i)) {
            stats().told(policy, *seq);
        }
    }
}

/// What to tell a policy about the API server (an `ApiServerUnavailable` Warning event
/// each): one note per outage that ended since it was last told (asked at the start of
/// every reconcile). They stay untold until [`Untold::told`]: an event that cannot be
/// published right after an outage (the API server may still refuse writes) is tried
/// again at the next reconcile.
pub fn untold_outages(policy: &str) -> Untold {
    let (outages, seq) = stats().untold(policy);
    let first = seq + 1 - outages.len() as u64;
    let notes = outages
        .into_iter()
        .zip(first..)
        .map(|(o, seq)| {
            let until = o.until.unwrap_or_else(Utc::now);
            let note = format!(
                "the API server was unavailable from {} to {} ({:.0}s; {} requests failed, first: {}); watches and runs resumed",
                ts(o.since),
                ts(until),
                (until - o.since).as_seconds_f64(),
                o.failed,
                o.error
            );
            (note, seq)
        })
        .collect();
    Untold(notes)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Ok,
    ClientError,
    Throttled,
    ServerError,
    /// 503 or 504.
    Unavailable,
    Unreachable,
}

impl Outcome {
    fn of_status(code: u16) -> Self {
        match code {
            429 => Outcome::Throttled,
            503 | 504 => Outcome::Unavailable,
            500.. => Outcome::ServerError,
            400.. => Outcome::ClientError,
            _ => Outcome::Ok,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::ClientError => "client_error",
            Outcome::Throttled => "throttled",
            Outcome::ServerError => "server_error",
            Outcome::Unavailable => "unavailable",
            Outcome::Unreachable => "unreachable",
        }
    }

    /// No answer, or "unavailable" / "gateway timeout": the API server is not serving.
    fn is_failure(self) -> bool {
        matches!(self, Outcome::Unavailable | Outcome::Unreachable)
    }
}

// === verb and resource of a request ===

/// `(verb, resource)` of a request, as the API server's audit log names them: `list`,
/// `watch`, `get`, `create`, `patch`, `update`, `delete`, `deletecollection`; the resource
/// with its subresource (`pods/eviction`, `defragpolicies/status`). Paths outside the
/// resource API (`/version`, `/openapi/…`) are `("get", "nonresource")`.
pub fn classify(method: &http::Method, path: &str, query: Option<&str>) -> (&'static str, String) {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let rest: &[&str] = match segs.as_slice() {
        ["api", _version, rest @ ..] => rest,
        ["apis", _group, _version, rest @ ..] => rest,
        _ => return ("get", "nonresource".to_string()),
    };
    // `namespaces/<ns>/<resource>…` is namespaced; `namespaces` or `namespaces/<name>[/sub]`
    // is the Namespace resource itself.
    let rest = match rest {
        ["namespaces", _ns, r, more @ ..] if !matches!(*r, "status" | "finalize") => {
            let mut v = vec![*r];
            v.extend_from_slice(more);
            v
        }
        other => other.to_vec(),
    };
    let Some(resource) = rest.first() else {
        return ("get", "nonresource".to_string());
    };
    let resource = match rest.get(2) {
        Some(sub) => format!("{resource}/{sub}"),
        None => (*resource).to_string(),
    };
    let collection = rest.len() == 1;
    let watch = query.is_some_and(|q| {
        q.split('&')
            .any(|kv| kv == "watch=true" || kv == "watch=1" || kv == "watch")
    });
    let verb = match *method {
        http::Method::GET if watch => "watch",
        http::Method::GET if collection => "list",
        http::Method::GET => "get",
        http::Method::POST => "create",
        http::Method::PATCH => "patch",
        http::Method::PUT => "update",
        http::Method::DELETE if collection => "deletecollection",
        http::Method::DELETE => "delete",
        _ => "other",
    };
    (verb, resource)
}

// === the token bucket ===

/// Client-side rate limit: `qps` requests per second on average, bursts of up to `burst`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RateLimit {
    /// Average requests per second; 0 = no limit.
    pub qps: f64,
    /// Bucket size (at least 1).
    pub burst: u32,
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    last: Instant,
    qps: f64,
    burst: f64,
}

impl Bucket {
    fn new(limit: RateLimit, now: Instant) -> Self {
        let burst = f64::from(limit.burst.max(1));
        Self {
            tokens: burst,
            last: now,
            qps: limit.qps,
            burst,
        }
    }

    /// Takes a token, or says how long until one is there.
    fn take(&mut self, now: Instant) -> Result<(), Duration> {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * self.qps).min(self.burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.tokens) / self.qps))
        }
    }
}

// === the tower layer ===

/// The layer; see the module docs.
#[derive(Clone, Debug)]
pub struct ApiLayer {
    limit: Option<RateLimit>,
}

impl ApiLayer {
    /// A layer limiting to `limit` (`qps <= 0`: no limit) and counting every request.
    pub fn new(limit: RateLimit) -> Self {
        Self {
            limit: (limit.qps > 0.0 && limit.qps.is_finite()).then_some(limit),
        }
    }
}

impl<S> tower::Layer<S> for ApiLayer {
    type Service = ApiService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ApiService {
            inner,
            bucket: self.limit.map(|l| Bucket::new(l, Instant::now())),
            permit: false,
            wait: None,
        }
    }
}

/// The service of [`ApiLayer`]. kube's client drives it through a `Buffer`, so one
/// instance sees every request in order and its bucket needs no lock.
pub struct ApiService<S> {
    inner: S,
    bucket: Option<Bucket>,
    /// A token was taken for the next `call`.
    permit: bool,
    /// Sleeping for a token: until when, since when.
    wait: Option<(Pin<Box<tokio::time::Sleep>>, Instant)>,
}

impl<S, B, RB> tower::Service<Request<B>> for ApiService<S>
where
    S: tower::Service<Request<B>, Response = Response<RB>>,
    S::Future: Send + 'static,
    S::Error: std::fmt::Display,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        while !self.permit {
            let Some(bucket) = self.bucket.as_mut() else {
                self.permit = true;
                break;
            };
            if let Some((sleep, since)) = self.wait.as_mut() {
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                stats().throttled.inc_by(since.elapsed().as_secs_f64());
                self.wait = None;
            }
            let now = Instant::now();
            match bucket.take(now) {
                Ok(()) => self.permit = true,
                Err(d) => self.wait = Some((Box::pin(tokio::time::sleep(d)), now)),
            }
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        self.permit = false;
        let (verb, resource) = classify(req.method(), req.uri().path(), req.uri().query());
        let fut = self.inner.call(req);
        Box::pin(async move {
            let r = fut.await;
            match &r {
                Ok(resp) => stats().record(
                    verb,
                    &resource,
                    Outcome::of_status(resp.status().as_u16()),
                    || format!("HTTP {}", resp.status()),
                ),
                Err(e) => stats().record(verb, &resource, Outcome::Unreachable, || e.to_string()),
            }
            r
        })
    }
}

/// A client for `config` whose requests go through [`ApiLayer`].
pub fn client(config: kube::Config, limit: RateLimit) -> anyhow::Result<kube::Client> {
    let builder = kube::client::ClientBuilder::try_from(config)?;
    Ok(builder.with_layer(&ApiLayer::new(limit)).build())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_api_error_is_one_line_with_code_reason_and_message() {
        let e = kube::Error::Api(Box::new(kube::core::Status {
            code: 404,
            reason: "NotFound".into(),
            message: "namespaces \"gpu-defrag-system\" not found".into(),
            ..Default::default()
        }));
        assert_eq!(
            error_line(&e),
            "HTTP 404 NotFound: namespaces \"gpu-defrag-system\" not found"
        );
        let wrapped = crate::context::Error::Kube(e).to_string();
        assert_eq!(
            wrapped,
            "kubernetes API: HTTP 404 NotFound: namespaces \"gpu-defrag-system\" not found"
        );
        assert!(!wrapped.contains("Status {"), "no Debug dump: {wrapped}");
    }
    use http::Method;

    #[test]
    fn classifies_requests_like_the_audit_log() {
        let c = |m: Method, p: &str, q: Option<&str>| {
            let (v, r) = classify(&m, p, q);
            format!("{v} {r}")
        };
        assert_eq!(
            c(Method::GET, "/api/v1/pods", Some("resourceVersion=0")),
            "list pods"
        );
        assert_eq!(
            c(
                Method::GET,
                "/api/v1/pods",
                Some("watch=true&resourceVersion=5")
            ),
            "watch pods"
        );
        assert_eq!(
            c(Method::GET, "/api/v1/namespaces/a/pods/p", None),
            "get pods"
        );
        assert_eq!(
            c(Method::POST, "/api/v1/namespaces/a/pods/p/eviction", None),
            "create pods/eviction"
        );
        assert_eq!(
            c(
                Method::PATCH,
                "/apis/gpu-defrag.io/v1alpha1/defragpolicies/x/status",
                Some("fieldManager=gpu-defrag&force=true")
            ),
            "patch defragpolicies/status"
        );
        assert_eq!(c(Method::PATCH, "/api/v1/nodes/n1", None), "patch nodes");
        assert_eq!(
            c(
                Method::POST,
                "/apis/events.k8s.io/v1/namespaces/default/events",
                None
            ),
            "create events"
        );
        assert_eq!(
            c(
                Method::PUT,
                "/apis/coordination.k8s.io/v1/namespaces/s/leases/l",
                None
            ),
            "update leases"
        );
        assert_eq!(
            c(Method::GET, "/api/v1/namespaces", None),
            "list namespaces"
        );
        assert_eq!(
            c(Method::GET, "/api/v1/namespaces/x", None),
            "get namespaces"
        );
        assert_eq!(c(Method::GET, "/version", None), "get nonresource");
    }

    #[test]
    fn the_bucket_allows_a_burst_then_the_rate() {
        let t0 = Instant::now();
        let mut b = Bucket::new(
            RateLimit {
                qps: 10.0,
                burst: 3,
            },
            t0,
        );
        for _ in 0..3 {
            assert_eq!(b.take(t0), Ok(()));
        }
        let wait = b.take(t0).unwrap_err();
        assert!((wait.as_secs_f64() - 0.1).abs() < 1e-9, "{wait:?}");
        // 100 ms later one token is back, not more.
        let t1 = t0 + Duration::from_millis(100);
        assert_eq!(b.take(t1), Ok(()));
        assert!(b.take(t1).is_err());
        // After a long pause the bucket is full again, never fuller.
        let t2 = t1 + Duration::from_secs(60);
        for _ in 0..3 {
            assert_eq!(b.take(t2), Ok(()));
        }
        assert!(b.take(t2).is_err());
    }

    #[tokio::test]
    async fn the_layer_spaces_requests_at_the_rate() {
        use tower::{Layer, Service, ServiceExt};
        let inner = tower::service_fn(|_req: Request<()>| async {
            Ok::<_, std::convert::Infallible>(Response::new(()))
        });
        let mut svc = ApiLayer::new(RateLimit {
            qps: 20.0,
            burst: 2,
        })
        .layer(inner);
        let t0 = Instant::now();
        let mut at = Vec::new();
        for _ in 0..6 {
            let req = Request::get("/api/v1/nodes").body(()).unwrap();
            svc.ready().await.unwrap().call(req).await.unwrap();
            at.push(t0.elapsed().as_secs_f64());
        }
        // Two at once (the burst), then one every 50 ms: request k not before (k - 1) × 50 ms
        // after the start (a lower bound no scheduling delay can break; a delay of the test
        // thread only lets the bucket refill meanwhile), the 6th after 4 × 50 ms.
        assert!(at[1] - at[0] < 0.03, "{at:?}");
        for (k, t) in at.iter().enumerate().skip(2) {
            assert!(*t >= (k - 1) as f64 * 0.05 - 0.002, "request {k}: {at:?}");
        }
        assert!(at[5] >= 0.19 && at[5] < 1.0, "{at:?}");
        // Off: no waiting at all.
        let mut free = ApiLayer::new(RateLimit { qps: 0.0, burst: 1 }).layer(tower::service_fn(
            |_req: Request<()>| async { Ok::<_, std::convert::Infallible>(Response::new(())) },
        ));
        let t0 = Instant::now();
        for _ in 0..50 {
            let req = Request::get("/api/v1/nodes").body(()).unwrap();
            free.ready().await.unwrap().call(req).await.unwrap();
        }
        assert!(t0.elapsed() < Duration::from_millis(50));
    }

    #[test]
    fn an_outage_is_told_once_to_each_known_policy() {
        let s = ApiStats {
            requests: Family::default(),
            outages: Counter::default(),
            reachable: Gauge::default(),
            throttled: Counter::default(),
            state: Mutex::default(),
        };
        assert!(s.untold("a").0.is_empty(), "a new policy hears of nothing");
        s.record("list", "pods", Outcome::Ok, String::new);
        s.record("list", "pods", Outcome::Unreachable, || "refused".into());
        s.record("watch", "nodes", Outcome::Unreachable, || "again".into());
        assert_eq!(s.reachable.get(), 0);
        assert!(s.untold("a").0.is_empty(), "still going: nothing to tell");
        s.record("list", "pods", Outcome::ClientError, String::new);
        assert_eq!(s.reachable.get(), 1);
        assert_eq!(s.outages.get(), 1);
        let (told, _) = s.untold("a");
        assert_eq!(told.len(), 1);
        assert_eq!((told[0].failed, told[0].error.as_str()), (2, "refused"));
        let (again, seq) = s.untold("a");
        assert_eq!(again.len(), 1, "not told until its event is published");
        s.told("a", seq);
        assert!(s.untold("a").0.is_empty(), "told once");
        assert!(
            s.untold("b").0.is_empty(),
            "b was not known before the outage"
        );
        // A second outage while "a" still owes the first: both are told, oldest first.
        s.record("list", "pods", Outcome::Unavailable, || "503".into());
        s.record("list", "pods", Outcome::Ok, String::new);
        s.record("list", "pods", Outcome::Unreachable, || "reset".into());
        s.record("list", "pods", Outcome::Ok, String::new);
        let (both, _) = s.untold("b");
        let errors: Vec<&str> = both.iter().map(|o| o.error.as_str()).collect();
        assert_eq!(errors, ["503", "reset"]);
    }
}
