//! Leader election on a `coordination.k8s.io/v1` Lease.
//!
//! ```text
//!   [LeaderElector::run] --get/create/replace--> [Lease ns/name]
//!          |                                          ^
//!          | is_leader (bounded by a deadline)        | other replicas
//!          v                                          |
//!   [LeaderState] <-- executor, status writer: act only while is_leader()
//! ```
//!
//! Only the lease holder evicts, fences or writes status. The rules:
//!
//! - **Acquire** when the lease is absent, has no holder, or expired
//!   (`renewTime + leaseDurationSeconds < now`); **renew** when we hold it. Every write is a
//!   `replace` carrying the `resourceVersion` that was read, so two candidates can never both
//!   win: the loser gets 409, re-reads and decides again.
//! - A takeover from another holder also needs the lease record to have stayed unchanged for a
//!   full lease duration *as measured by our own monotonic clock* (as client-go does), so a
//!   replica whose wall clock runs ahead cannot steal a live lease.
//! - [`LeaderState::is_leader`] is bounded by a deadline: `lease_duration - renew_every` after
//!   the start of the last successful renew. Even if the election task is starved or stuck in
//!   an API call, the flag turns false before any other replica could consider the lease
//!   expired. A failed renew, a lost lease or a passed deadline steps down at once.
//! - Shutdown: [`LeaderElector::release`] (on a clone of the elector) stops the loop, steps the
//!   state down and then clears `holderIdentity`, so a standby takes over without waiting for
//!   expiry.
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Api;
use kube::api::PostParams;
use tokio::sync::Notify;

use crate::metrics::Metrics;

// === LeaderState ===

/// Whether this replica may perform side effects (evict, fence, write status).
///
/// Cheap to clone and to query. While elected, leadership is held until a deadline that the
/// election loop pushes forward on each successful renew; [`LeaderState::is_leader`] turns
/// false by itself when the deadline passes.
#[derive(Clone, Debug)]
pub struct LeaderState(Arc<StateInner>);

#[derive(Debug)]
struct StateInner {
    base: Instant,
    /// Nanoseconds after `base` until which we lead; 0 = not leader; `u64::MAX` = always.
    until_ns: AtomicU64,
}

const ALWAYS: u64 = u64::MAX;

impl LeaderState {
    /// A state that is not leader until a [`LeaderElector`] running with it wins the lease.
    pub fn new() -> Self {
        Self(Arc::new(StateInner {
            base: Instant::now(),
            until_ns: AtomicU64::new(0),
        }))
    }

    /// A state that is always leader, for `--leader-elect=false` (a single replica).
    pub fn always() -> Self {
        let s = Self::new();
        s.0.until_ns.store(ALWAYS, Ordering::SeqCst);
        s
    }

    /// True while this replica holds the lease (or always, see [`LeaderState::always`]).
    pub fn is_leader(&self) -> bool {
        match self.0.until_ns.load(Ordering::SeqCst) {
            0 => false,
            ALWAYS => true,
            until => self.elapsed_ns() < until,
        }
    }

    fn elapsed_ns(&self) -> u64 {
        u64::try_from(self.0.base.elapsed().as_nanos()).unwrap_or(ALWAYS - 1)
    }

    /// Leader until `deadline` (monotonic clock).
    pub(crate) fn lead_until(&self, deadline: Instant) {
        if deadline <= Instant::now() {
            return self.step_down();
        }
        let ns = deadline.saturating_duration_since(self.0.base).as_nanos();
        let ns = u64::try_from(ns).unwrap_or(ALWAYS - 1).clamp(1, ALWAYS - 1);
        self.0.until_ns.store(ns, Ordering::SeqCst);
    }

    /// Not leader, from now on until the next successful acquire.
    fn step_down(&self) {
        self.0.until_ns.store(0, Ordering::SeqCst);
    }
}

impl Default for LeaderState {
    fn default() -> Self {
        Self::new()
    }
}

// === decide (pure) ===

/// What to do with the lease as read, at wall-clock time `now`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Nobody holds a live lease: take it. `transition` is whether `leaseTransitions`
    /// increments (the holder changes); false only when the lease does not exist yet.
    Acquire {
        /// The holder changes from someone (or nobody) else to us.
        transition: bool,
    },
    /// We hold it: renew.
    Renew,
    /// Someone else holds a live lease.
    Wait {
        /// The current holder.
        holder: String,
        /// Time left until the lease expires by its `renewTime`.
        expires_in: Duration,
    },
}

/// Decides from a lease spec (`None`: the Lease does not exist) whether `me` acquires, renews
/// or waits. `duration` is used when the lease carries no `leaseDurationSeconds`. A lease with
/// a holder but no `renewTime` counts as expired.
pub fn decide(lease: Option<&LeaseSpec>, me: &str, now: Timestamp, duration: Duration) -> Decision {
    let Some(spec) = lease else {
        return Decision::Acquire { transition: false };
    };
    let holder = spec.holder_identity.as_deref().unwrap_or("");
    if holder == me {
        return Decision::Renew;
    }
    if holder.is_empty() {
        return Decision::Acquire { transition: true };
    }
    let secs = spec
        .lease_duration_seconds
        .filter(|s| *s > 0)
        .map(i64::from)
        .unwrap_or_else(|| i64::try_from(duration.as_secs()).unwrap_or(i64::MAX));
    let expiry = spec
        .renew_time
        .as_ref()
        .and_then(|t| t.0.checked_add(SignedDuration::from_secs(secs)).ok());
    match expiry {
        Some(expiry) if expiry >= now => Decision::Wait {
            holder: holder.to_string(),
            expires_in: Duration::try_from(now.duration_until(expiry)).unwrap_or_default(),
        },
        _ => Decision::Acquire { transition: true },
    }
}

/// The part of a lease that changes on every renew or handover.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Record {
    holder: Option<String>,
    renew_time: Option<Timestamp>,
    transitions: Option<i32>,
}

impl Record {
    fn of(spec: Option<&LeaseSpec>) -> Self {
        Self {
            holder: spec.and_then(|s| s.holder_identity.clone()),
            renew_time: spec.and_then(|s| s.renew_time.as_ref().map(|t| t.0)),
            transitions: spec.and_then(|s| s.lease_transitions),
        }
    }
}

/// When we first saw the current record unchanged (monotonic clock).
#[derive(Clone, Debug)]
struct Observation {
    record: Record,
    since: Instant,
}

/// Updates the observation with a freshly read record and tells whether it has stayed
/// unchanged for at least `duration` (our clock): the skew guard for takeovers.
fn observe(
    obs: &mut Option<Observation>,
    record: Record,
    now: Instant,
    duration: Duration,
) -> bool {
    match obs {
        Some(o) if o.record == record => now.saturating_duration_since(o.since) >= duration,
        _ => {
            *obs = Some(Observation { record, since: now });
            false
        }
    }
}

// === LeaderElector ===

/// What a failed acquire or renew of the Lease `namespace/name` means for the user, in one
/// line with the fix: the namespace missing (404), no permission (403), or the API error.
pub fn cannot_lead(namespace: &str, name: &str, e: &kube::Error) -> String {
    let api = crate::apiclient::error_line(e);
    let fix_ns = format!(
        "create it (kubectl create namespace {namespace}; config/default does) or start with \
         --lease-namespace naming an existing namespace (env POD_NAMESPACE)"
    );
    match e {
        kube::Error::Api(s) if s.code == 404 => format!(
            "cannot lead: the Lease namespace {namespace} does not exist ({api}); {fix_ns}; \
             no policy is reconciled until then"
        ),
        kube::Error::Api(s) if s.code == 403 => format!(
            "cannot lead: not allowed to read or write the Lease {namespace}/{name} ({api}); \
             if the namespace does not exist, {fix_ns}; otherwise bind the Role of \
             config/rbac/leader_election_role.yaml there; no policy is reconciled until then"
        ),
        _ => format!("cannot lead: the Lease {namespace}/{name}: {api}; retrying"),
    }
}

/// Lease-based leader election. Clone it before [`LeaderElector::run`] to keep a handle for
/// [`LeaderElector::release`].
#[derive(Clone)]
pub struct LeaderElector {
    api: Api<Lease>,
    namespace: String,
    name: String,
    identity: String,
    lease_duration: Duration,
    renew_every: Duration,
    metrics: Option<Metrics>,
    shared: Arc<Shared>,
}

struct Shared {
    stopped: AtomicBool,
    wake: Notify,
    state: OnceLock<LeaderState>,
}

/// Result of one acquire/renew attempt.
enum Attempt {
    Leader,
    Follower { holder: String },
}

/// Attempts per tick when writes conflict (409) before giving up until the next tick.
const CONFLICT_RETRIES: usize = 3;

impl LeaderElector {
    /// An elector for the Lease `namespace/name`, competing as `identity` (e.g. the pod name).
    ///
    /// `lease_duration` is rounded up to whole seconds (at least 1s); `renew_every` is the
    /// renew and retry period, at most a third of the lease duration (clamped). The leader
    /// steps down `lease_duration - renew_every` after the start of its last successful renew.
    pub fn new(
        client: kube::Client,
        namespace: &str,
        name: &str,
        identity: &str,
        lease_duration: Duration,
        renew_every: Duration,
    ) -> Self {
        let secs = lease_duration.as_secs() + u64::from(lease_duration.subsec_nanos() > 0);
        let lease_duration = Duration::from_secs(secs.max(1));
        let renew_every = renew_every
            .min(lease_duration / 3)
            .max(Duration::from_millis(100));
        Self {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
            name: name.to_string(),
            identity: identity.to_string(),
            lease_duration,
            renew_every,
            metrics: None,
            shared: Arc::new(Shared {
                stopped: AtomicBool::new(false),
                wake: Notify::new(),
                state: OnceLock::new(),
            }),
        }
    }

    /// Also report leadership in `gpu_defrag_is_leader`.
    pub fn with_metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Runs the election until [`LeaderElector::release`] is called (otherwise forever),
    /// updating `state`. Never returns an error: API failures are logged, step down, and are
    /// retried every `renew_every`.
    pub async fn run(self, state: LeaderState) {
        let _ = self.shared.state.set(state.clone());
        let mut observed: Option<Observation> = None;
        let renew_deadline = self.lease_duration - self.renew_every;
        let mut was_leader = false;
        // The last failure said, so that one that repeats every tick is said once.
        let mut said: Option<String> = None;
        while !self.stopped() {
            let started = Instant::now();
            let budget = self.renew_every.max(Duration::from_secs(1));
            let result =
                tokio::time::timeout(budget, self.try_acquire_or_renew(&mut observed)).await;
            let leader = match result {
                Ok(Ok(Attempt::Leader)) => {
                    state.lead_until(started + renew_deadline);
                    if self.stopped() {
                        state.step_down();
                    }
                    true
                }
                Ok(Ok(Attempt::Follower { holder })) => {
                    state.step_down();
                    if was_leader {
                        tracing::warn!(lease = %self.name, %holder, "lost the lease");
                    }
                    tracing::debug!(lease = %self.name, %holder, "lease held by another replica");
                    false
                }
                Ok(Err(error)) => {
                    state.step_down();
                    let line = cannot_lead(&self.namespace, &self.name, &error);
                    if said.as_deref() != Some(line.as_str()) {
                        tracing::error!(lease = %self.name, namespace = %self.namespace, "{line}");
                        said = Some(line);
                    } else {
                        tracing::debug!(lease = %self.name, "{line}");
                    }
                    false
                }
                Err(_) => {
                    state.step_down();
                    let line = format!(
                        "cannot lead: the Lease {}/{} got no answer within {budget:?}; \
                         retrying every {:?}",
                        self.namespace, self.name, self.renew_every
                    );
                    if said.as_deref() != Some(line.as_str()) {
                        tracing::warn!(lease = %self.name, "{line}");
                        said = Some(line);
                    }
                    false
                }
            };
            if leader {
                said = None;
            }
            if leader != was_leader {
                if leader {
                    tracing::info!(lease = %self.name, identity = %self.identity, "became leader");
                } else if !self.stopped() {
                    tracing::info!(lease = %self.name, identity = %self.identity, "stepped down");
                }
                was_leader = leader;
            }
            if let Some(m) = &self.metrics {
                m.set_leader(state.is_leader());
            }
            let next = started + self.renew_every;
            tokio::select! {
                _ = tokio::time::sleep_until(next.into()) => {}
                _ = self.shared.wake.notified() => {}
            }
        }
        state.step_down();
        if let Some(m) = &self.metrics {
            m.set_leader(false);
        }
    }

    /// Gives the lease up on shutdown: stops a running [`LeaderElector::run`] (on any clone),
    /// steps its state down first, then clears `holderIdentity` if we hold the lease so a
    /// standby can take over at once. Errors are logged; the lease then simply expires.
    pub async fn release(&self) {
        self.shared.stopped.store(true, Ordering::SeqCst);
        if let Some(state) = self.shared.state.get() {
            state.step_down();
        }
        self.shared.wake.notify_waiters();
        if let Some(m) = &self.metrics {
            m.set_leader(false);
        }
        let result = tokio::time::timeout(self.lease_duration, self.clear_holder()).await;
        match result {
            Ok(Ok(true)) => tracing::info!(lease = %self.name, "released the lease"),
            Ok(Ok(false)) => {}
            Ok(Err(error)) => {
                tracing::warn!(lease = %self.name, error = %crate::apiclient::error_line(&error), "lease release failed")
            }
            Err(_) => tracing::warn!(lease = %self.name, "lease release timed out"),
        }
    }

    fn stopped(&self) -> bool {
        self.shared.stopped.load(Ordering::SeqCst)
    }

    async fn try_acquire_or_renew(
        &self,
        observed: &mut Option<Observation>,
    ) -> Result<Attempt, kube::Error> {
        let mut last_err = None;
        for _ in 0..CONFLICT_RETRIES {
            if self.stopped() {
                return Ok(Attempt::Follower {
                    holder: String::new(),
                });
            }
            let current = self.api.get_opt(&self.name).await?;
            let now = Timestamp::now();
            let spec = current.as_ref().and_then(|l| l.spec.as_ref());
            let fresh = observe(
                observed,
                Record::of(spec),
                Instant::now(),
                self.record_duration(spec),
            );
            let decision = decide(spec, &self.identity, now, self.lease_duration);
            let write = match (&current, &decision) {
                (_, Decision::Wait { holder, .. }) => {
                    return Ok(Attempt::Follower {
                        holder: holder.clone(),
                    });
                }
                (None, _) => {
                    let lease = Lease {
                        metadata: ObjectMeta {
                            name: Some(self.name.clone()),
                            ..ObjectMeta::default()
                        },
                        spec: Some(next_spec(
                            None,
                            &decision,
                            &self.identity,
                            now,
                            self.duration_secs(),
                        )),
                    };
                    self.api.create(&PostParams::default(), &lease).await
                }
                (Some(lease), decision) => {
                    let takeover = spec
                        .and_then(|s| s.holder_identity.as_deref())
                        .is_some_and(|h| !h.is_empty() && h != self.identity);
                    if takeover && !fresh {
                        // Expired by its renewTime, but not yet by our own clock.
                        let holder = spec
                            .and_then(|s| s.holder_identity.clone())
                            .unwrap_or_default();
                        return Ok(Attempt::Follower { holder });
                    }
                    let mut lease = lease.clone();
                    lease.spec = Some(next_spec(
                        spec,
                        decision,
                        &self.identity,
                        now,
                        self.duration_secs(),
                    ));
                    // `lease.metadata.resource_version` is the one read: optimistic concurrency.
                    self.api
                        .replace(&self.name, &PostParams::default(), &lease)
                        .await
                }
            };
            match write {
                Ok(_) => return Ok(Attempt::Leader),
                Err(e) if is_conflict(&e) => {
                    tracing::debug!(lease = %self.name, "lease write conflict, re-reading");
                    last_err = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(last_err.expect("at least one attempt"))
    }

    /// Clears `holderIdentity` if we hold the lease. Returns whether it did.
    async fn clear_holder(&self) -> Result<bool, kube::Error> {
        for attempt in 0..CONFLICT_RETRIES {
            let Some(mut lease) = self.api.get_opt(&self.name).await? else {
                return Ok(false);
            };
            let Some(spec) = lease.spec.as_mut() else {
                return Ok(false);
            };
            if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
                return Ok(false);
            }
            spec.holder_identity = None;
            spec.renew_time = Some(MicroTime(Timestamp::now()));
            spec.lease_duration_seconds = Some(1);
            match self
                .api
                .replace(&self.name, &PostParams::default(), &lease)
                .await
            {
                Ok(_) => return Ok(true),
                Err(e) if is_conflict(&e) && attempt + 1 < CONFLICT_RETRIES => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(false)
    }

    fn duration_secs(&self) -> i32 {
        i32::try_from(self.lease_duration.as_secs()).unwrap_or(i32::MAX)
    }

    /// The duration the current holder announced (or ours).
    fn record_duration(&self, spec: Option<&LeaseSpec>) -> Duration {
        spec.and_then(|s| s.lease_duration_seconds)
            .and_then(|s| u64::try_from(s).ok())
            .filter(|s| *s > 0)
            .map_or(self.lease_duration, Duration::from_secs)
    }
}

/// The spec to write after `decision`: a renew moves `renewTime`; an acquire also sets the
/// holder and `acquireTime`, and counts a transition if the holder changes.
fn next_spec(
    old: Option<&LeaseSpec>,
    decision: &Decision,
    identity: &str,
    now: Timestamp,
    duration_secs: i32,
) -> LeaseSpec {
    let mut spec = old.cloned().unwrap_or_default();
    if let Decision::Acquire { transition } = decision {
        spec.holder_identity = Some(identity.to_string());
        spec.acquire_time = Some(MicroTime(now));
        let transitions = spec.lease_transitions.unwrap_or(0);
        spec.lease_transitions = Some(if *transition {
            transitions.saturating_add(1)
        } else {
            transitions
        });
    }
    spec.renew_time = Some(MicroTime(now));
    spec.lease_duration_seconds = Some(duration_secs);
    spec
}

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).unwrap()
    }

    fn api_error(code: u16, reason: &str, message: &str) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status {
            code,
            reason: reason.into(),
            message: message.into(),
            ..Default::default()
        }))
    }

    #[test]
    fn a_missing_namespace_or_permission_is_one_line_with_the_fix() {
        let missing = cannot_lead(
            "gpu-defrag-system",
            "gpu-defrag",
            &api_error(
                404,
                "NotFound",
                "namespaces \"gpu-defrag-system\" not found\n",
            ),
        );
        assert_eq!(
            missing,
            "cannot lead: the Lease namespace gpu-defrag-system does not exist (HTTP 404 \
             NotFound: namespaces \"gpu-defrag-system\" not found); create it (kubectl create \
             namespace gpu-defrag-system; config/default does) or start with --lease-namespace \
             naming an existing namespace (env POD_NAMESPACE); no policy is reconciled until then"
        );
        let forbidden = cannot_lead(
            "ops",
            "gpu-defrag",
            &api_error(403, "Forbidden", "leases.coordination.k8s.io is forbidden"),
        );
        assert!(forbidden.contains("not allowed"), "{forbidden}");
        assert!(
            forbidden.contains("leader_election_role.yaml"),
            "{forbidden}"
        );
        for line in [&missing, &forbidden] {
            assert!(!line.contains('\n'), "{line}");
        }
    }

    fn spec(holder: Option<&str>, renew: Option<i64>, secs: Option<i32>) -> LeaseSpec {
        LeaseSpec {
            holder_identity: holder.map(str::to_string),
            renew_time: renew.map(|r| MicroTime(ts(r))),
            lease_duration_seconds: secs,
            lease_transitions: Some(4),
            ..LeaseSpec::default()
        }
    }

    #[test]
    fn decide_table() {
        let d = Duration::from_secs(15);
        let wait = |h: &str, s: u64| Decision::Wait {
            holder: h.into(),
            expires_in: Duration::from_secs(s),
        };
        let acquire = Decision::Acquire { transition: true };
        let cases: Vec<(&str, Option<LeaseSpec>, i64, Decision)> = vec![
            ("absent", None, 0, Decision::Acquire { transition: false }),
            (
                "no holder",
                Some(spec(None, Some(0), Some(15))),
                1,
                acquire.clone(),
            ),
            (
                "empty holder",
                Some(spec(Some(""), Some(0), Some(15))),
                1,
                acquire.clone(),
            ),
            (
                "ours, fresh",
                Some(spec(Some("me"), Some(0), Some(15))),
                1,
                Decision::Renew,
            ),
            (
                "ours, expired",
                Some(spec(Some("me"), Some(0), Some(15))),
                100,
                Decision::Renew,
            ),
            (
                "theirs, fresh",
                Some(spec(Some("b"), Some(0), Some(15))),
                5,
                wait("b", 10),
            ),
            (
                "theirs, at expiry",
                Some(spec(Some("b"), Some(0), Some(15))),
                15,
                wait("b", 0),
            ),
            (
                "theirs, expired",
                Some(spec(Some("b"), Some(0), Some(15))),
                16,
                acquire.clone(),
            ),
            (
                "theirs, own duration",
                Some(spec(Some("b"), Some(0), Some(60))),
                30,
                wait("b", 30),
            ),
            (
                "theirs, no duration",
                Some(spec(Some("b"), Some(0), None)),
                10,
                wait("b", 5),
            ),
            (
                "theirs, no duration, expired",
                Some(spec(Some("b"), Some(0), None)),
                16,
                acquire.clone(),
            ),
            (
                "theirs, no renewTime",
                Some(spec(Some("b"), None, Some(15))),
                0,
                acquire.clone(),
            ),
            (
                "theirs, renewTime in future",
                Some(spec(Some("b"), Some(10), Some(15))),
                0,
                wait("b", 25),
            ),
        ];
        for (name, lease, now, want) in cases {
            assert_eq!(decide(lease.as_ref(), "me", ts(now), d), want, "{name}");
        }
    }

    #[test]
    fn next_spec_sets_holder_times_and_transitions() {
        let now = ts(100);
        let theirs = spec(Some("b"), Some(0), Some(60));
        let taken = next_spec(
            Some(&theirs),
            &Decision::Acquire { transition: true },
            "me",
            now,
            15,
        );
        assert_eq!(taken.holder_identity.as_deref(), Some("me"));
        assert_eq!(taken.acquire_time, Some(MicroTime(now)));
        assert_eq!(taken.renew_time, Some(MicroTime(now)));
        assert_eq!(taken.lease_duration_seconds, Some(15));
        assert_eq!(taken.lease_transitions, Some(5));

        let created = next_spec(
            None,
            &Decision::Acquire { transition: false },
            "me",
            now,
            15,
        );
        assert_eq!(created.lease_transitions, Some(0));
        assert_eq!(created.holder_identity.as_deref(), Some("me"));

        let mut ours = spec(Some("me"), Some(0), Some(15));
        ours.acquire_time = Some(MicroTime(ts(-50)));
        let renewed = next_spec(Some(&ours), &Decision::Renew, "me", now, 15);
        assert_eq!(
            renewed.acquire_time,
            Some(MicroTime(ts(-50))),
            "renew keeps acquireTime"
        );
        assert_eq!(renewed.renew_time, Some(MicroTime(now)));
        assert_eq!(renewed.lease_transitions, Some(4));
    }

    #[test]
    fn skew_guard_needs_a_full_duration_of_silence() {
        let d = Duration::from_secs(15);
        let t0 = Instant::now();
        let rec = |r: i64| Record::of(Some(&spec(Some("b"), Some(r), Some(15))));
        let mut obs = None;
        assert!(!observe(&mut obs, rec(0), t0, d), "first sight");
        assert!(!observe(&mut obs, rec(0), t0 + Duration::from_secs(14), d));
        assert!(observe(&mut obs, rec(0), t0 + Duration::from_secs(15), d));
        // A renew restarts the clock.
        assert!(!observe(&mut obs, rec(5), t0 + Duration::from_secs(16), d));
        assert!(!observe(&mut obs, rec(5), t0 + Duration::from_secs(30), d));
        assert!(observe(&mut obs, rec(5), t0 + Duration::from_secs(31), d));
    }

    #[test]
    fn leader_state_expires_by_itself() {
        let s = LeaderState::new();
        assert!(!s.is_leader());
        s.lead_until(Instant::now() + Duration::from_secs(60));
        assert!(s.is_leader());
        let c = s.clone();
        s.step_down();
        assert!(!c.is_leader(), "clones share the state");
        s.lead_until(Instant::now());
        assert!(!s.is_leader(), "a passed deadline is not leadership");
        s.lead_until(Instant::now() + Duration::from_millis(20));
        assert!(s.is_leader());
        std::thread::sleep(Duration::from_millis(30));
        assert!(
            !s.is_leader(),
            "leadership ends at the deadline without any call"
        );
        assert!(LeaderState::always().is_leader());
    }
}
