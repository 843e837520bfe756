//! The executor: the one place that acts on the cluster for a plan.
//!
//! Protocol of a run (restart-safe; every step is recorded before it is taken):
//! 1. record the run in `status.activeRun` (with the nodes it will fence);
//! 2. fence: `draining.gpu-defrag.io/<policy>=<policy>:NoSchedule` on nodes being emptied, and
//!    single GPUs being emptied on HAMi nodes in `hami.io/device-cordon` ([`fences`]);
//! 3. evict through the Eviction API only, never delete ([`evictor`]), at most
//!    `maxInFlight` replacements pending at once; 429 = blocked by a PodDisruptionBudget:
//!    skip, report;
//! 4. wait until each replacement is Ready and check where it landed ([`waits`]; a landing
//!    on a fenced node or GPU is a bounce: reported, the workload is backed off for the run);
//! 5. stop at window end (no new evictions; moves in flight finish), on a stall
//!    (`rescheduleTimeout`), when pending GPU pods pile up, or on lost leadership;
//! 6. remove the fences; write the outcome ([`outcome`]) to `lastRuns`, events and metrics.
pub mod evictor;
pub mod fences;
pub mod outcome;
pub mod waits;

#[cfg(test)]
mod scenario;

use std::collections::HashSet;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use gpu_defrag_api::v1alpha1::{DefragPolicy, InFlightEviction, RunRecord};
use gpu_defrag_api::values::RunResult;
use gpu_defrag_core::frag;
use gpu_defrag_core::plan::{Move, Skip};
use gpu_defrag_core::policy::Policy;
use gpu_defrag_core::recheck::{Planned, Refusal, recheck};
use gpu_defrag_core::run::{self, Fate, Hold, HoldStep, Limits, RunState, Verdict};
use kube::ResourceExt;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use serde_json::json;
use tracing::{info, warn};

use crate::context::{
    Ctx, EXECUTOR_MANAGER, Error, EventReason, RunHandle, StopRequest, history_of, patch_status,
};
use crate::demand::{DemandStart, SERVED};
use crate::objects::{CachedPod, ts};
use crate::status;
use evictor::{EvictionResult, Evictor};
use fences::Fences;
use outcome::Stop;
use waits::{Looker, POLL, Wait};

/// How a run starts: a window run (new or resumed) or a demand run.
pub enum Start {
    /// A window run, planned at its start.
    Window,
    /// A window run resumed from its record.
    Resume(Box<RunRecord>),
    /// A demand run with its plan.
    Demand(Box<DemandStart>),
}

/// Starts (or resumes) a run in its own task.
pub async fn start(
    ctx: Arc<Ctx>,
    dp: Arc<DefragPolicy>,
    policy: Policy,
    window_end: DateTime<Utc>,
    how: Start,
) {
    let name = dp.name_any();
    let c2 = ctx.clone();
    let stop = StopRequest::default();
    let s2 = stop.clone();
    let task = tokio::spawn(async move {
        if let Err(e) = run(c2.clone(), dp.clone(), policy, window_end, how, s2).await {
            warn!(policy = %dp.name_any(), error = %e, "run failed; its record is ended by the next reconcile");
            c2.metrics.reconcile_error(&dp.name_any(), e.kind());
        }
    });
    ctx.runs.lock().await.insert(name, RunHandle { task, stop });
}

/// Writes the executor's part of status: the active run (or none) and the last runs.
async fn write_runs(
    ctx: &Ctx,
    name: &str,
    active: Option<&RunRecord>,
    last: &[RunRecord],
) -> Result<(), Error> {
    let mut st = json!({"lastRuns": status::finished_runs(last)});
    if let Some(a) = active {
        st["activeRun"] = serde_json::to_value(a)?;
    }
    patch_status(&ctx.client, name, EXECUTOR_MANAGER, st).await
}

/// Removes every fence this policy left on any node (from the node cache).
pub async fn remove_stale_fences(ctx: &Ctx, policy: &str) -> Result<(), Error> {
    fences::remove_stale(&ctx.client, &ctx.nodes.state(), &ctx.dra.rules(), policy).await
}

/// Ends a recorded run that no task owns (after a restart outside its window, or an
/// invalid policy): fences removed, record moved to `lastRuns`.
pub async fn abandon(
    ctx: &Ctx,
    dp: &DefragPolicy,
    result: RunResult,
    message: &str,
) -> Result<(), Error> {
    let name = dp.name_any();
    let old = dp.status.clone().unwrap_or_default();
    let Some(mut rec) = old.active_run.clone() else {
        return Ok(());
    };
    fences::remove(&ctx.client, &name, &rec).await?;
    remove_stale_fences(ctx, &name).await?;
    rec.result = result.as_str().into();
    rec.message = message.into();
    rec.finished_at = Some(ts(Utc::now()));
    write_runs(ctx, &name, None, &outcome::last_runs(&rec, &old.last_runs)).await?;
    ctx.metrics.run_finished(&name, result.as_str(), 0.0);
    ctx.event(
        dp,
        EventType::Warning,
        EventReason::RunAbandoned,
        format!("run {}: {message}", rec.id),
        None,
    )
    .await;
    Ok(())
}

/// The run itself: one call per step of the protocol.
async fn run(
    ctx: Arc<Ctx>,
    dp: Arc<DefragPolicy>,
    policy: Policy,
    window_end: DateTime<Utc>,
    how: Start,
    stop: StopRequest,
) -> Result<(), Error> {
    let name = dp.name_any();
    let landing = ctx.landing.clone();
    let result = run_steps(ctx, dp, policy, window_end, how, stop).await;
    // Whatever the end, no replacement of this run is expected any more.
    landing.forget_policy(&name);
    result
}

/// The steps of [`run`].
#[tracing::instrument(name = "run", skip_all, fields(policy = %dp.name_any()))]
async fn run_steps(
    ctx: Arc<Ctx>,
    dp: Arc<DefragPolicy>,
    policy: Policy,
    window_end: DateTime<Utc>,
    how: Start,
    stop: StopRequest,
) -> Result<(), Error> {
    let (mut run, steps) = Run::plan(ctx, dp, policy, window_end, how, stop).await;
    // 1. Record first, so a restart can resume or clean up.
    run.record_start(&steps).await?;
    // 2. Fence. 3–5. Evict, pace, wait; moves in flight finish, even after the window
    // closed (not after a stop request). A step that fails takes the fences back first.
    let mut stop = match run.fence_and_evict(&steps).await {
        Ok(stop) => stop,
        Err(e) => {
            if let Err(unfence) = fences::remove(&run.ctx.client, &run.name, &run.rec).await {
                warn!(policy = %run.name, error = %unfence, "could not take the run's fences back; the next reconcile retries");
            }
            return Err(e);
        }
    };
    if stop == Some(Stop::LostLeadership) {
        // The new leader resumes from the recorded run; it owns the fences now.
        info!(policy = %run.name, "lost leadership; leaving the run to the new leader");
        return Ok(());
    }
    // 6. Nominate the queued pods onto the nodes emptied for them while the fences still
    // keep every other pod off, unfence, record. A demand run nominates each served pod
    // onto its room and holds it there until the pod binds.
    let demand = run.rec.demand.is_some();
    let room_made = stop.is_none() && !run.state.gave_up();
    if demand && room_made {
        run.nominate_rooms().await;
    } else if !matches!(stop, Some(Stop::Requested(_))) && !demand {
        run.nominate_pending().await;
    }
    fences::remove(&run.ctx.client, &run.name, &run.rec).await?;
    if demand {
        if room_made {
            stop = run.hold().await;
        } else {
            stop.get_or_insert_with(|| {
                Stop::Stalled("some evictions of the room were refused or no longer safe: the room was not made".into())
            });
            run.release().await;
        }
    }
    run.record_end(stop).await
}

/// Waits until the next look at the caches: a poll, `until` when that is sooner, or at
/// once when a stop is requested.
async fn pause(until: Option<DateTime<Utc>>, stop: &StopRequest) {
    let left = until
        .and_then(|u| (u - Utc::now()).to_std().ok())
        .unwrap_or(POLL);
    tokio::select! {
        () = tokio::time::sleep(left.min(POLL)) => {}
        () = stop.wait() => {}
    }
}

/// One planned eviction as the run takes it: the move and the pod's UID when the plan was
/// made.
struct Step {
    m: Move,
    uid: String,
}

/// The state of a run in progress.
struct Run {
    ctx: Arc<Ctx>,
    dp: Arc<DefragPolicy>,
    name: String,
    policy: Policy,
    resumed: bool,
    started: tokio::time::Instant,
    /// The record in `status.activeRun`.
    rec: RunRecord,
    /// The runs before it, in `status.lastRuns`.
    last_runs: Vec<RunRecord>,
    /// Why the plan was cut to fit the record, if it was.
    cut: Option<String>,
    fences: Fences,
    /// The run's decisions: what to send, what is in flight, when it stops.
    state: RunState<Wait>,
    /// How long a replacement may take (`rescheduleTimeout`, at least 5 s).
    timeout: std::time::Duration,
    /// How long a resumed eviction may still take effect ([`waits::NOT_EVICTED_AFTER`]).
    not_evicted_after: std::time::Duration,
    /// The pod of the planned eviction last judged, as the cache had it then.
    current: Option<Arc<CachedPod>>,
    /// `skipped` of the record when the run (re)started.
    skipped_before: i64,
    evictor: Evictor,
    stop: StopRequest,
    /// UIDs of the GPU pods Pending when the run started: the queue it came to serve.
    /// Capacity they take is benefit realised, so the verdict on the forecast leaves them
    /// out. `None` for a resumed run (no verdict then).
    queued: Option<HashSet<String>>,
    /// A demand run: since when its first pod is unschedulable (waits are measured from
    /// it).
    demand_since: Option<DateTime<Utc>>,
}

impl Run {
    /// Plans on fresh caches, with what the run already did (resume); the plan too large
    /// for the record is cut to the whole units that fit. Returns the steps (with each
    /// pod's UID and workload from the plan's cluster model).
    async fn plan(
        ctx: Arc<Ctx>,
        dp: Arc<DefragPolicy>,
        policy: Policy,
        window_end: DateTime<Utc>,
        how: Start,
        stop: StopRequest,
    ) -> (Self, Vec<Step>) {
        let name = dp.name_any();
        let old = dp.status.clone().unwrap_or_default();
        let (resume, demand) = match how {
            Start::Window => (None, None),
            Start::Resume(r) => (Some(*r), None),
            Start::Demand(d) => (None, Some(*d)),
        };
        let obs = ctx.observe(&policy, resume.as_ref(), Utc::now());
        let queued = match &demand {
            Some(d) => Some(
                d.run
                    .uids
                    .iter()
                    .filter(|u| !u.is_empty())
                    .cloned()
                    .collect(),
            ),
            None => resume.is_none().then(|| {
                obs.cluster
                    .pods
                    .iter()
                    .filter(|p| p.is_pending() && p.shape.is_some_and(|s| s.gpus > 0))
                    .filter(|p| !p.uid.is_empty())
                    .map(|p| p.uid.clone())
                    .collect()
            }),
        };
        let demand_since = demand.as_ref().map(|d| d.since);
        let demand_run = demand.as_ref().map(|d| d.run.clone());
        let mut plan = match demand {
            Some(d) => d.plan.plan,
            None => obs.plan,
        };
        let mut rec = resume.clone().unwrap_or_else(|| RunRecord {
            id: match &demand_run {
                Some(_) => format!("{}-demand-{}", name, obs.now.format("%Y%m%dt%H%M%S")),
                None => format!("{}-{}", name, obs.now.format("%Y%m%dt%H%M%S")),
            },
            started_at: ts(obs.now),
            window_end: ts(window_end),
            result: RunResult::Running.as_str().into(),
            planned: plan.moves.len() as i64,
            fragment_rate_before: obs.report.fragment_rate,
            fully_free_gpus_before: obs.report.fully_free_gpus as i64,
            demand: demand_run,
            ..Default::default()
        });
        // The record lists every pod the run evicts.
        let in_flight_max = policy.max_in_flight.max(1) as usize;
        let fit = status::batches_within_record(&rec, &plan, in_flight_max);
        let cut = (fit < plan.batches.len()).then(|| {
            let all = plan.moves.len();
            plan = plan.first_batches(fit);
            if resume.is_none() {
                rec.planned = plan.moves.len() as i64;
            }
            format!(
                "plan cut to {} of {all} evictions ({fit} of its batches) so that the run record stays under {} KiB",
                plan.moves.len(),
                status::MAX_ACTIVE_RUN_BYTES / 1024
            )
        });
        if let Some(why) = &cut {
            warn!(policy = %name, "{why}");
            ctx.event(
                &dp,
                EventType::Warning,
                EventReason::PlanCut,
                format!("run {}: {why}", rec.id),
                None,
            )
            .await;
        }
        // The forecast the outcome is held against (a resumed run keeps its own).
        if rec.expected_fragment_rate_after.is_none() {
            rec.expected_fragment_rate_after = Some(plan.after.fragment_rate);
        }
        let fences = Fences::of_run(&rec, &plan);
        fences.record(&mut rec);
        let mut planned = Vec::with_capacity(plan.moves.len());
        let steps: Vec<Step> = plan
            .moves
            .into_iter()
            .map(|m| {
                // A demand plan was made on the reconcile's snapshot: its indices are
                // checked against the key (the pod is found by key otherwise).
                let pod = obs
                    .cluster
                    .pods
                    .get(m.pod_index)
                    .filter(|p| p.key() == m.pod)
                    .or_else(|| obs.cluster.pods.iter().find(|p| p.key() == m.pod));
                planned.push(run::Planned {
                    pod: m.pod.clone(),
                    batch: m.batch,
                    workload: pod.and_then(|p| {
                        let o = p.owner.as_ref()?;
                        Some(waits::workload_key(
                            &p.namespace,
                            &(o.kind.clone(), o.name.clone()),
                        ))
                    }),
                });
                Step {
                    uid: pod.map(|p| p.uid.clone()).unwrap_or_default(),
                    m,
                }
            })
            .collect();
        let limits = Limits::of(&policy);
        let mut state = RunState::new(planned, limits, window_end);
        // A resumed run first waits for the replacements its last process did not see.
        let now = Utc::now();
        state.resume(rec.in_flight.iter().filter_map(|f| Wait::resumed(f, now)));
        let run = Run {
            evictor: Evictor::of(&ctx, &dp),
            state,
            timeout: limits.reschedule_timeout,
            not_evicted_after: waits::NOT_EVICTED_AFTER,
            current: None,
            skipped_before: rec.skipped,
            ctx,
            dp,
            name,
            policy,
            resumed: resume.is_some(),
            started: tokio::time::Instant::now(),
            rec,
            last_runs: old.last_runs,
            cut,
            fences,
            stop,
            queued,
            demand_since,
        };
        (run, steps)
    }

    /// Writes the active record (and the last runs, unchanged).
    async fn write(&self) -> Result<(), Error> {
        write_runs(&self.ctx, &self.name, Some(&self.rec), &self.last_runs).await
    }

    /// Records the run before it acts; announces a new run (a demand run on its pods too:
    /// a gang member is told its own room's evictions and the gang's).
    async fn record_start(&self, steps: &[Step]) -> Result<(), Error> {
        self.write().await?;
        if let Some(d) = &self.rec.demand {
            let total = self.rec.planned;
            let gang = (d.pods.len() > 1)
                .then(|| format!(" there, {total} for the gang of {}", d.pods.len()));
            for (key, node) in d.pods.iter().zip(&d.nodes) {
                let k = match gang {
                    Some(_) => steps.iter().filter(|s| s.m.from_node == *node).count() as i64,
                    None => total,
                };
                let note = format!(
                    "gpu-defrag is making room on {node}: {k} eviction{}{} (run {})",
                    if k == 1 { "" } else { "s" },
                    gang.as_deref().unwrap_or(""),
                    self.rec.id
                );
                self.event_on_pod(key, EventType::Normal, EventReason::MakingRoom, note)
                    .await;
            }
        }
        if !self.resumed {
            let note = format!(
                "run {}: {} evictions planned, fragment rate {:.3}, window ends {}",
                self.rec.id, self.rec.planned, self.rec.fragment_rate_before, self.rec.window_end
            );
            self.ctx
                .event(
                    &self.dp,
                    EventType::Normal,
                    EventReason::RunStarted,
                    note,
                    None,
                )
                .await;
        }
        Ok(())
    }

    /// Sets the fences, then carries out the run's steps ([`RunState::next`]): evicts the
    /// planned moves in order, paced by the waits, each re-checked at its turn; a drain unit
    /// is given up at its first refused or unsafe eviction; the moves in flight finish.
    /// Says why it stopped early, if it did.
    async fn fence_and_evict(&mut self, steps: &[Step]) -> Result<Option<Stop>, Error> {
        fences::set(&self.ctx.client, &self.name, &self.rec).await?;
        let mut next = None;
        loop {
            let step = match next.take() {
                Some(step) => step,
                None => {
                    let now = Utc::now();
                    self.settle(now);
                    let requested = self.stop.requested();
                    let step =
                        self.state
                            .next(requested.as_deref(), self.ctx.leader.is_leader(), now);
                    self.forget_dropped();
                    step
                }
            };
            match step {
                run::Step::Wait { until } => pause(until, &self.stop).await,
                run::Step::Check(i) => next = self.check(i, &steps[i]),
                run::Step::Evict(i) => self.evict(i, &steps[i]).await?,
                run::Step::GiveUp { step, why } => self.give_up(&steps[step], why).await?,
                run::Step::Done(stop) => {
                    self.rec.skipped = self.skipped_before + self.state.skipped() as i64;
                    return Ok(stop);
                }
            }
        }
    }

    /// Looks at the waits once: those that ended leave the state machine (settled in the
    /// record), and landing control no longer expects their replacements.
    fn settle(&mut self, now: DateTime<Utc>) {
        let look = Looker {
            pods: &self.ctx.pods,
            metrics: &self.ctx.metrics,
            policy: &self.name,
            fences: &self.fences,
            not_evicted_after: self.not_evicted_after,
        };
        let rec = &mut self.rec;
        let ended = self.state.settle(|w| look.ended(w, rec, now));
        for (w, _) in ended {
            self.ctx.landing.settle(&w.detail.evicted_uid);
        }
    }

    /// Waits that timed out are no longer expected by landing control.
    fn forget_dropped(&mut self) {
        for w in self.state.take_dropped() {
            self.ctx.landing.settle(&w.detail.evicted_uid);
        }
    }

    /// Judges a step at its turn ([`run::Step::Check`]): the GPU pods pending since the run
    /// started, and the pod judged again on a fresh model of the cluster (the same pod, on
    /// the same node, still movable, its workload's live availability, room on its target).
    /// The model is built for each eviction, not once per poll, on purpose: several
    /// evictions of one poll (`maxInFlight` above 1) must each see the ones before them
    /// (their pods terminating, their PodDisruptionBudgets spent); a model from before
    /// would judge on a guess.
    fn check(&mut self, i: usize, step: &Step) -> Option<run::Step> {
        let since = crate::objects::parse_ts(&self.rec.started_at).unwrap_or_else(Utc::now);
        let pending = waits::pending_gpu_pods(
            &self.ctx.pods,
            &self.ctx.dra.snapshot(),
            &self.policy,
            since,
        );
        let verdict = self.verdict(step);
        self.state.judged(i, pending, verdict)
    }

    /// The verdict on a step's pod as the cache has it now; the pod and its workload are
    /// kept for the eviction when it may go.
    fn verdict(&mut self, step: &Step) -> Verdict {
        self.current = None;
        let m = &step.m;
        let Some((ns, pod_name)) = m.pod.split_once('/') else {
            return Verdict::PassOver;
        };
        let Some(current) = self.ctx.pods.get(&ObjectRef::new(pod_name).within(ns)) else {
            return Verdict::PassOver;
        };
        let owned = current.controller_of().is_some();
        self.current = Some(current);
        let now = Utc::now();
        let cluster = self.ctx.cluster(Some(now));
        let planned = Planned {
            pod: &m.pod,
            uid: &step.uid,
            from: &m.from_node,
            to: &m.to_node,
        };
        let history = history_of(Some(&self.rec));
        match recheck(&cluster, planned, &self.policy, now, &history) {
            Ok(()) => {}
            // Gone, elsewhere or terminating: off its node anyway, the unit goes on.
            Err(Refusal::Gone | Refusal::Moved | Refusal::Unmovable(Skip::Terminating)) => {
                return Verdict::PassOver;
            }
            Err(r) => return Verdict::Refuse(r.code().to_string()),
        }
        if !owned {
            return Verdict::Refuse("no-controller".into());
        }
        Verdict::Go
    }

    /// Gives up the step's drain unit: this eviction and the rest of its unit are not
    /// sent (counted as skipped, announced).
    async fn give_up(&mut self, step: &Step, why: String) -> Result<(), Error> {
        self.rec.skipped = self.skipped_before + self.state.skipped() as i64;
        let pod = self.current.take();
        info!(policy = %self.name, pod = %step.m.pod, why = %why, "eviction not sent; its unit is given up");
        self.evictor
            .skipped(
                &step.m,
                pod.as_ref().map(|p| &p.0),
                format!("{why}; the rest of its unit is not sent"),
            )
            .await;
        self.write().await
    }

    /// Evicts one pod: counted in the record (as in flight) before it is asked for; an
    /// eviction without an answer is confirmed by looking at the pod; the record is
    /// settled by the result, and the state machine told it.
    async fn evict(&mut self, i: usize, step: &Step) -> Result<(), Error> {
        let Some(pod) = self.current.take() else {
            self.state.sent(i, run::Sent::Gone, Utc::now());
            return Ok(());
        };
        // Judged `Go` only with a controller.
        let Some(owner) = pod.controller_of() else {
            self.state.sent(i, run::Sent::Refused, Utc::now());
            return Ok(());
        };
        let m = &step.m;
        let known = Wait::known(&self.ctx.pods, &pod, &owner);
        let before = self.rec.clone();
        let flight = InFlightEviction {
            pod: m.pod.clone(),
            uid: step.uid.clone(),
            owner: format!("{}/{}", owner.0, owner.1),
        };
        outcome::count_eviction(&mut self.rec, m, flight);
        self.write().await?;
        // Landing control: the replacement is held at creation and nominated onto the
        // planned node (when the expectation cannot be written, it is not held).
        if self.policy.landing_control && !m.to_node.is_empty() {
            self.ctx
                .landing
                .expect(&self.name, &pod.namespace, &owner, &step.uid, &m.to_node)
                .await;
        }
        let mut result = self.evictor.evict(m, &pod, &step.uid).await;
        if let EvictionResult::Unanswered(e) = &result {
            warn!(policy = %self.name, pod = %m.pod, error = %e, "eviction unanswered; looking whether it happened");
            let deadline = tokio::time::Instant::now() + self.timeout;
            result = self.evictor.confirm(&pod, &step.uid, deadline).await;
            self.evictor.report(m, &pod, &result).await;
        }
        outcome::account(&mut self.rec, before, &result);
        if !matches!(result, EvictionResult::Evicted) {
            self.ctx.landing.settle(&step.uid);
        }
        let sent = match &result {
            EvictionResult::Evicted => {
                let wait = Wait::new(&pod, owner, known, &m.to_node);
                self.state.sent(i, run::Sent::Evicted(wait), Utc::now());
                return Ok(());
            }
            EvictionResult::Gone => run::Sent::Gone,
            EvictionResult::Blocked(_) | EvictionResult::Refused(_) => run::Sent::Refused,
            EvictionResult::Unanswered(e) => run::Sent::Unknown(format!(
                "the eviction of {} got no answer and whether it happened is unknown after {}s ({e})",
                m.pod,
                self.timeout.as_secs()
            )),
        };
        self.state.sent(i, sent, Utc::now());
        self.write().await
    }

    /// With landing control, nominates the GPU pods that were pending when the run started
    /// onto the nodes it emptied (every GPU free), before the fences come off: when the
    /// fences go the scheduler tries each such pod on its node first, and holds the room
    /// against smaller pods of no higher priority meanwhile
    /// ([`gpu_defrag_core::landing::pending_nominations`]). Not for a resumed run (its queue
    /// is not known).
    async fn nominate_pending(&self) {
        let Some(queued) = self.queued.as_ref() else {
            return;
        };
        if !self.policy.landing_control || queued.is_empty() || self.rec.fenced_nodes.is_empty() {
            return;
        }
        let c = self.ctx.cluster(Some(Utc::now()));
        let nodes: Vec<usize> = self
            .rec
            .fenced_nodes
            .iter()
            .filter_map(|n| c.node_index(n))
            .collect();
        let own_fence = |t: &gpu_defrag_core::model::Taint| {
            crate::objects::is_fence_of(&t.key, Some(&t.value), &self.name)
        };
        let nominations =
            gpu_defrag_core::landing::pending_nominations(&c, &nodes, queued, own_fence);
        info!(policy = %self.name, queued = queued.len(), emptied = nodes.len(), nominations = nominations.len(), "pending pods for the nodes the run emptied");
        for (pi, ni) in nominations {
            let (p, node) = (&c.pods[pi], &c.nodes[ni].name);
            self.ctx
                .landing
                .nominate_pending(&p.namespace, &p.name, node, &self.ctx.metrics)
                .await;
        }
    }

    /// Publishes an event on a pod by key (nothing when it is not in the cache).
    async fn event_on_pod(&self, key: &str, type_: EventType, reason: EventReason, note: String) {
        let Some((ns, name)) = key.split_once('/') else {
            return;
        };
        if let Some(p) = self.ctx.pods.get(&ObjectRef::new(name).within(ns)) {
            self.ctx
                .event_on(&p.object_reference(), type_, reason, note)
                .await;
        }
    }

    /// A demand run's served pods that are still the pods served (same UID) and pending,
    /// with their rooms: (index, namespace, name, room).
    fn unbound_served(&self) -> Vec<(usize, String, String, String)> {
        let Some(d) = &self.rec.demand else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (i, key) in d.pods.iter().enumerate() {
            let (Some((ns, name)), Some(node)) = (key.split_once('/'), d.nodes.get(i)) else {
                continue;
            };
            let Some(p) = self.ctx.pods.get(&ObjectRef::new(name).within(ns)) else {
                continue;
            };
            let same = d.uids.get(i).is_none_or(|u| u.is_empty() || *u == p.uid);
            if same && p.node_name.is_none() {
                out.push((i, ns.to_string(), name.to_string(), node.clone()));
            }
        }
        out
    }

    /// Nominates each served pod of a demand run onto its room, while the fences still
    /// keep every other pod off: when they go, the scheduler tries the pod there first and
    /// counts it on the node against pods of no higher priority.
    async fn nominate_rooms(&self) {
        for (_, ns, name, node) in self.unbound_served() {
            self.ctx
                .landing
                .nominate_pending(&ns, &name, &node, &self.ctx.metrics)
                .await;
        }
    }

    /// Clears the nominations of served pods that did not bind (the hold is over).
    async fn release(&self) {
        for (_, ns, name, _) in self.unbound_served() {
            self.ctx.landing.clear_nominated(&ns, &name).await;
        }
    }

    /// Holds the rooms of a demand run until every served pod has bound, at most
    /// `demand.holdTimeout` ([`Hold`]): a nomination the scheduler cleared is set again. A
    /// stop request or the timeout releases the rest. Records each pod's fate.
    async fn hold(&mut self) -> Option<Stop> {
        let timeout = self
            .policy
            .demand
            .map(|d| d.hold_timeout)
            .unwrap_or(std::time::Duration::from_secs(300));
        let mut hold = Hold::new(Utc::now(), timeout);
        loop {
            let fates = self.fates();
            let changed = self.rec.demand.as_ref().is_some_and(|d| d.served != fates);
            if let Some(d) = self.rec.demand.as_mut() {
                d.served = fates.clone();
            }
            if changed && let Err(e) = self.write().await {
                warn!(policy = %self.name, error = %e, "could not record the served pods");
            }
            let waiting = self.unbound_served();
            let who: Vec<String> = waiting
                .iter()
                .map(|(_, ns, name, node)| format!("{ns}/{name} on {node}"))
                .collect();
            let requested = self.stop.requested();
            match hold.next(
                &who,
                requested.as_deref(),
                self.ctx.leader.is_leader(),
                Utc::now(),
            ) {
                HoldStep::Over => return None,
                HoldStep::Release(stop) => {
                    self.release().await;
                    if let Stop::Stalled(why) = &stop {
                        for (_, ns, name, _) in &waiting {
                            self.event_on_pod(
                                &format!("{ns}/{name}"),
                                EventType::Warning,
                                EventReason::NoRoom,
                                format!("run {}: {why}", self.rec.id),
                            )
                            .await;
                        }
                    }
                    return Some(stop);
                }
                // The scheduler clears a nomination when it tries the pod and finds no
                // node (the fence was still on): set it again.
                HoldStep::Renominate => {
                    for (_, ns, name, node) in &waiting {
                        let cached = self.ctx.pods.get(&ObjectRef::new(name).within(ns));
                        if cached
                            .is_some_and(|p| p.nominated_node.as_deref() != Some(node.as_str()))
                        {
                            self.ctx
                                .landing
                                .nominate_pending(ns, name, node, &self.ctx.metrics)
                                .await;
                        }
                    }
                }
                HoldStep::Wait => pause(None, &self.stop).await,
            }
        }
    }

    /// Each served pod's fate now: `Served` (bound on its room), `BoundElsewhere`,
    /// `Gone` (deleted or replaced), `Binding`.
    fn fates(&self) -> Vec<String> {
        let Some(d) = &self.rec.demand else {
            return Vec::new();
        };
        d.pods
            .iter()
            .enumerate()
            .map(|(i, key)| {
                let cached = key
                    .split_once('/')
                    .and_then(|(ns, name)| self.ctx.pods.get(&ObjectRef::new(name).within(ns)));
                let same =
                    |p: &CachedPod| d.uids.get(i).is_none_or(|u| u.is_empty() || *u == p.uid);
                let room = d.nodes.get(i).map(String::as_str).unwrap_or_default();
                let bound = cached
                    .as_ref()
                    .filter(|p| same(p))
                    .map(|p| p.node_name.as_deref());
                Fate::of(bound, room).as_str().to_string()
            })
            .collect()
    }

    /// Measures the result and records it in `lastRuns`, metrics and an event.
    async fn record_end(mut self, stop: Option<Stop>) -> Result<(), Error> {
        let now = Utc::now();
        let after = frag::report(&self.ctx.cluster(Some(now)), &self.policy);
        // What the moves achieved, without the queued pods that started meanwhile (they
        // took freed capacity: the run's purpose, not a shortfall).
        let realised = self.queued.as_ref().map(|q| {
            frag::report(&self.ctx.cluster_without(Some(now), q), &self.policy).fragment_rate
        });
        // A demand run is judged by its pods, not by the fragment rate.
        let realised = if self.rec.demand.is_some() {
            None
        } else {
            realised
        };
        if self.rec.demand.is_some() {
            let fates = self.fates();
            if let Some(d) = self.rec.demand.as_mut() {
                d.served = fates;
            }
        }
        let rec = &mut self.rec;
        rec.fragment_rate_after = Some(after.fragment_rate);
        rec.fully_free_gpus_after = Some(after.fully_free_gpus as i64);
        rec.finished_at = Some(ts(now));
        let (result, why) = outcome::result_of(stop.as_ref(), rec, realised);
        rec.result = result.as_str().into();
        rec.message = outcome::message(&why, self.cut.as_deref(), rec);
        if let Some(d) = &rec.demand {
            let served: Vec<String> = d
                .pods
                .iter()
                .zip(&d.nodes)
                .zip(&d.served)
                .map(|((p, n), f)| match f.as_str() {
                    SERVED => format!("{p} bound on {n}"),
                    other => format!("{p}: {other} (room on {n})"),
                })
                .collect();
            rec.message = format!("demand run: {}; {}", served.join(", "), rec.message);
            let waits: Vec<f64> = match self.demand_since {
                Some(since) if d.served.iter().all(|f| f == SERVED) => {
                    vec![(now - since).num_milliseconds().max(0) as f64 / 1000.0; d.pods.len()]
                }
                _ => Vec::new(),
            };
            let result = crate::demand::record_of_run(rec)
                .map(|r| r.result)
                .unwrap_or_default();
            self.ctx.metrics.demand_finished(
                &self.name,
                &result,
                rec.evicted.max(0) as u64,
                &waits,
            );
        }
        let last = outcome::last_runs(rec, &self.last_runs);
        write_runs(&self.ctx, &self.name, None, &last).await?;
        self.ctx.metrics.run_finished(
            &self.name,
            result.as_str(),
            self.started.elapsed().as_secs_f64(),
        );
        let type_ = if result == RunResult::Succeeded {
            EventType::Normal
        } else {
            EventType::Warning
        };
        let note = format!(
            "run {}: {}",
            self.rec.id,
            status::truncate(&self.rec.message, 900)
        );
        self.ctx
            .event(&self.dp, type_, EventReason::RunFinished, note, None)
            .await;
        if result == RunResult::BenefitNotRealized {
            let note = format!(
                "run {}: fragment rate {:.3} → {:.3}, forecast {:.3}",
                self.rec.id,
                self.rec.fragment_rate_before,
                self.rec.fragment_rate_after.unwrap_or_default(),
                self.rec.expected_fragment_rate_after.unwrap_or_default()
            );
            self.ctx
                .event(
                    &self.dp,
                    EventType::Warning,
                    EventReason::BenefitNotRealized,
                    note,
                    None,
                )
                .await;
        }
        info!(policy = %self.name, run = %self.rec.id, result = result.as_str(), "run finished");
        Ok(())
    }
}
