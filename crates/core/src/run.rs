//! A run as a pure state machine: every decision the executor takes while it carries out a
//! plan, and nothing it does. The operator's executor is a shell around it (it looks at the
//! cluster, asks [`RunState::next`] what to do, does it, reports back); the simulator's
//! replay drives the same machine over simulated time, so its runs follow the operator's
//! own rules.
//!
//! The protocol (docs/operator.md#how-a-run-works):
//! - the planned evictions are sent in plan order, each once fewer than `maxInFlight`
//!   replacements are in flight and fewer than `maxUnavailablePerWorkload` of its workload;
//! - before each: a stop request stops at once; lost leadership ends the run (the new
//!   leader resumes it); the window's end stops sending (moves in flight finish); more GPU
//!   pods pending, created since the run started, than `maxPendingGpuPods` plus the
//!   replacements in flight stops sending; then the pod is judged again on a fresh model
//!   ([`Verdict`]);
//! - a drain unit (a batch of the plan) is given up at its first refused or unsafe
//!   eviction: the rest of it is not sent (a node half drained frees nothing);
//! - a workload whose replacement landed on a fence is not moved again in the run;
//! - a replacement not Ready within `rescheduleTimeout` stalls the run: nothing more is
//!   sent, the other moves in flight finish (a second stall ends the wait);
//! - an eviction whose answer stays unknown stalls the run the same way.
//!
//! A demand run then holds its room until its pods bind ([`Hold`]).
use std::collections::BTreeSet;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};

use crate::policy::Policy;

/// Why a run stopped before its plan was done.
#[derive(Clone, Debug, PartialEq)]
pub enum Stop {
    /// The window closed.
    WindowClosed,
    /// A replacement was not Ready in time, or an eviction's fate is unknown (the message
    /// says which).
    Stalled(String),
    /// More GPU pods pending than `safety.maxPendingGpuPods` (how many).
    PendingPileUp(usize),
    /// Another replica became leader.
    LostLeadership,
    /// Asked to stop: the policy was switched to DryRun, suspended or deleted (why).
    Requested(String),
}

/// The shortest `rescheduleTimeout` a run waits for (a shorter policy value is raised).
pub const MIN_RESCHEDULE_TIMEOUT: Duration = Duration::from_secs(5);

/// The policy's limits a run keeps.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Limits {
    /// `maxInFlight` (at least 1).
    pub max_in_flight: usize,
    /// `maxUnavailablePerWorkload` (at least 1).
    pub per_workload: usize,
    /// `rescheduleTimeout` (at least [`MIN_RESCHEDULE_TIMEOUT`]).
    pub reschedule_timeout: Duration,
    /// `maxPendingGpuPods`.
    pub max_pending: usize,
}

impl Limits {
    /// The limits of `policy`.
    pub fn of(policy: &Policy) -> Self {
        Limits {
            max_in_flight: policy.max_in_flight.max(1) as usize,
            per_workload: policy.max_unavailable_per_workload.max(1) as usize,
            reschedule_timeout: policy.reschedule_timeout.max(MIN_RESCHEDULE_TIMEOUT),
            max_pending: policy.max_pending_gpu_pods as usize,
        }
    }
}

/// One planned eviction, as the run takes it.
#[derive(Clone, Debug, PartialEq)]
pub struct Planned {
    /// `namespace/name` of the pod.
    pub pod: String,
    /// Its drain unit (the plan's batch).
    pub batch: usize,
    /// Its workload (any key naming it; `None`: none known).
    pub workload: Option<String>,
}

/// A replacement the run waits for. `W` is what the shell keeps to recognise it.
#[derive(Clone, Debug)]
pub struct InFlight<W> {
    /// `namespace/name` of the evicted pod.
    pub pod: String,
    /// Its workload.
    pub workload: Option<String>,
    /// Since when it is waited for (the eviction, or the resume of the run).
    pub since: DateTime<Utc>,
    /// Taken over from the record of an earlier process.
    pub resumed: bool,
    /// The shell's part.
    pub detail: W,
}

/// How a wait ended, as the shell saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// Replaced by a Ready pod (or its pod ended for good); `bounced`: the replacement
    /// landed on one of the run's fences.
    Replaced {
        /// Landed on a fence.
        bounced: bool,
    },
    /// The eviction never took effect (a resumed run found the pod still there).
    NotEvicted,
}

/// The verdict on a planned pod at its turn, judged again on a fresh model.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// Still planned and safe: evict it.
    Go,
    /// Gone, elsewhere or terminating: off its node anyway, its unit goes on.
    PassOver,
    /// Must not be moved now (why): its unit is given up.
    Refuse(String),
}

/// What the API server answered to an eviction the run sent.
#[derive(Clone, Debug, PartialEq)]
pub enum Sent<W> {
    /// Accepted: its replacement is waited for (with the shell's part).
    Evicted(W),
    /// The pod was gone already.
    Gone,
    /// Refused (a PodDisruptionBudget or another answer): its unit is given up.
    Refused,
    /// No answer, and whether it happened stays unknown (why): the run stalls.
    Unknown(String),
}

/// What the shell does next.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Nothing now: look again at the next change, or at `until` at the latest.
    Wait {
        /// When a wait times out (none: no deadline).
        until: Option<DateTime<Utc>>,
    },
    /// Judge planned eviction `i` and count the GPU pods pending; answer with
    /// [`RunState::judged`].
    Check(usize),
    /// Send planned eviction `i`; answer with [`RunState::sent`].
    Evict(usize),
    /// Planned eviction `i` is not sent and the rest of its unit neither (why).
    GiveUp {
        /// The planned eviction.
        step: usize,
        /// Why.
        why: String,
    },
    /// The eviction part of the run is over (why it stopped early, if it did). After
    /// [`Stop::LostLeadership`] the run is left to the new leader as it is.
    Done(Option<Stop>),
}

#[derive(Clone, Debug, PartialEq)]
enum Phase {
    /// Sending the plan's evictions.
    Evicting,
    /// Nothing more is sent; the moves in flight finish (why it stopped early).
    Finishing(Option<Stop>),
    /// Over.
    Done(Option<Stop>),
}

/// A run in progress (see the module doc).
#[derive(Clone, Debug)]
pub struct RunState<W> {
    limits: Limits,
    window_end: DateTime<Utc>,
    steps: Vec<Planned>,
    cursor: usize,
    in_flight: Vec<InFlight<W>>,
    given_up: BTreeSet<usize>,
    backed_off: BTreeSet<String>,
    skipped: usize,
    phase: Phase,
    /// Waits ended by a timeout, not yet taken by the shell.
    dropped: Vec<InFlight<W>>,
}

impl<W> RunState<W> {
    /// A run of `steps`, in order, until `window_end`.
    pub fn new(steps: Vec<Planned>, limits: Limits, window_end: DateTime<Utc>) -> Self {
        RunState {
            limits,
            window_end,
            steps,
            cursor: 0,
            in_flight: Vec::new(),
            given_up: BTreeSet::new(),
            backed_off: BTreeSet::new(),
            skipped: 0,
            phase: Phase::Evicting,
            dropped: Vec::new(),
        }
    }

    /// Takes over the replacements an earlier process was waiting for (a resumed run).
    pub fn resume(&mut self, waits: impl IntoIterator<Item = InFlight<W>>) {
        self.in_flight.extend(waits);
    }

    /// The planned evictions.
    pub fn steps(&self) -> &[Planned] {
        &self.steps
    }

    /// The replacements in flight.
    pub fn in_flight(&self) -> &[InFlight<W>] {
        &self.in_flight
    }

    /// Planned evictions not sent because their unit was given up.
    pub fn skipped(&self) -> usize {
        self.skipped
    }

    /// Whether any unit was given up (a refused, blocked or unsafe eviction).
    pub fn gave_up(&self) -> bool {
        !self.given_up.is_empty()
    }

    /// Workloads not moved again in this run (a replacement bounced onto a fence).
    pub fn backed_off(&self) -> &BTreeSet<String> {
        &self.backed_off
    }

    /// The waits that timed out since this was last called (no longer waited for).
    pub fn take_dropped(&mut self) -> Vec<InFlight<W>> {
        std::mem::take(&mut self.dropped)
    }

    /// Ends the waits the shell finds over (`ended` says how, for each one); returns the
    /// ended ones, in order.
    pub fn settle(
        &mut self,
        mut ended: impl FnMut(&InFlight<W>) -> Option<Ended>,
    ) -> Vec<(InFlight<W>, Ended)> {
        let mut out = Vec::new();
        let mut open = Vec::with_capacity(self.in_flight.len());
        for w in std::mem::take(&mut self.in_flight) {
            match ended(&w) {
                Some(how) => {
                    if how == (Ended::Replaced { bounced: true })
                        && let Some(k) = &w.workload
                    {
                        self.backed_off.insert(k.clone());
                    }
                    out.push((w, how));
                }
                None => open.push(w),
            }
        }
        self.in_flight = open;
        out
    }

    /// The first wait past `rescheduleTimeout` at `now`: it ends (the run stalls).
    fn stalled(&mut self, now: DateTime<Utc>) -> Option<Stop> {
        let timeout = self.limits.reschedule_timeout;
        let i = self
            .in_flight
            .iter()
            .position(|w| elapsed(w.since, now) > timeout)?;
        let w = self.in_flight.remove(i);
        let stop = Stop::Stalled(format!(
            "the replacement of {} was not Ready within {}s",
            w.pod,
            timeout.as_secs()
        ));
        self.dropped.push(w);
        Some(stop)
    }

    /// When the first wait times out (just past `rescheduleTimeout`).
    fn deadline(&self) -> Option<DateTime<Utc>> {
        let timeout = TimeDelta::from_std(self.limits.reschedule_timeout).unwrap_or(TimeDelta::MAX);
        self.in_flight
            .iter()
            .map(|w| w.since + timeout + TimeDelta::milliseconds(1))
            .min()
    }

    /// Whether the next eviction (of `workload`) has room: fewer than `maxInFlight` in
    /// flight, fewer than `maxUnavailablePerWorkload` of its workload.
    fn has_room(&self, workload: Option<&String>) -> bool {
        let of_workload = self
            .in_flight
            .iter()
            .filter(|w| w.workload.is_some() && w.workload.as_ref() == workload)
            .count();
        self.in_flight.len() < self.limits.max_in_flight && of_workload < self.limits.per_workload
    }

    fn done(&mut self, stop: Option<Stop>) -> Step {
        self.phase = Phase::Done(stop.clone());
        Step::Done(stop)
    }

    /// The next step at `now`, after [`RunState::settle`]. `stop_requested`: why the run
    /// was asked to stop, if it was; `leader`: whether this process still leads.
    pub fn next(&mut self, stop_requested: Option<&str>, leader: bool, now: DateTime<Utc>) -> Step {
        loop {
            match self.phase.clone() {
                Phase::Done(stop) => return Step::Done(stop),
                Phase::Finishing(stop) => return self.next_finishing(stop, stop_requested, now),
                Phase::Evicting => {}
            }
            // Units given up: the rest of their evictions is not sent.
            while let Some(s) = self.steps.get(self.cursor) {
                if !self.given_up.contains(&s.batch) {
                    break;
                }
                self.skipped += 1;
                self.cursor += 1;
            }
            if self.cursor >= self.steps.len() {
                self.phase = Phase::Finishing(None);
                continue;
            }
            if let Some(why) = stop_requested {
                return self.done(Some(Stop::Requested(why.to_string())));
            }
            if let Some(stall) = self.stalled(now) {
                self.phase = Phase::Finishing(Some(stall));
                continue;
            }
            if !self.has_room(self.steps[self.cursor].workload.as_ref()) {
                return Step::Wait {
                    until: self.deadline(),
                };
            }
            if !leader {
                return self.done(Some(Stop::LostLeadership));
            }
            if now >= self.window_end {
                self.phase = Phase::Finishing(Some(Stop::WindowClosed));
                continue;
            }
            return Step::Check(self.cursor);
        }
    }

    fn next_finishing(
        &mut self,
        stop: Option<Stop>,
        stop_requested: Option<&str>,
        now: DateTime<Utc>,
    ) -> Step {
        if self.in_flight.is_empty() || matches!(stop, Some(Stop::Requested(_))) {
            return self.done(stop);
        }
        if let Some(why) = stop_requested {
            return self.done(Some(Stop::Requested(why.to_string())));
        }
        if let Some(stall) = self.stalled(now) {
            return self.done(Some(stop.unwrap_or(stall)));
        }
        Step::Wait {
            until: self.deadline(),
        }
    }

    /// The answer to [`Step::Check`]`(i)`: `pending` GPU pods created since the run started
    /// are pending, and the pod's verdict. Returns what to do with it ([`Step::Evict`],
    /// [`Step::GiveUp`]), or `None` when it is passed over or the run stops sending (ask
    /// [`RunState::next`] again).
    pub fn judged(&mut self, i: usize, pending: usize, verdict: Verdict) -> Option<Step> {
        if self.phase != Phase::Evicting || i != self.cursor || i >= self.steps.len() {
            return None;
        }
        if pending > self.limits.max_pending.saturating_add(self.in_flight.len()) {
            self.phase = Phase::Finishing(Some(Stop::PendingPileUp(pending)));
            return None;
        }
        let step = &self.steps[i];
        let verdict = match verdict {
            Verdict::Go
                if step
                    .workload
                    .as_ref()
                    .is_some_and(|k| self.backed_off.contains(k)) =>
            {
                Verdict::Refuse("its workload bounced back onto a fence".into())
            }
            v => v,
        };
        match verdict {
            Verdict::Go => Some(Step::Evict(i)),
            Verdict::PassOver => {
                self.cursor += 1;
                None
            }
            Verdict::Refuse(why) => {
                self.skipped += 1;
                self.given_up.insert(step.batch);
                self.cursor += 1;
                Some(Step::GiveUp { step: i, why })
            }
        }
    }

    /// The answer to [`Step::Evict`]`(i)`, at `now`.
    pub fn sent(&mut self, i: usize, result: Sent<W>, now: DateTime<Utc>) {
        if self.phase != Phase::Evicting || i != self.cursor || i >= self.steps.len() {
            return;
        }
        self.cursor += 1;
        let step = &self.steps[i];
        match result {
            Sent::Evicted(detail) => self.in_flight.push(InFlight {
                pod: step.pod.clone(),
                workload: step.workload.clone(),
                since: now,
                resumed: false,
                detail,
            }),
            Sent::Gone => {}
            Sent::Refused => {
                self.given_up.insert(step.batch);
            }
            Sent::Unknown(why) => self.phase = Phase::Finishing(Some(Stop::Stalled(why))),
        }
    }

    /// Stops sending now (the shell failed to act, e.g. it could not set the fences): the
    /// run is over without finishing its moves.
    pub fn abort(&mut self, stop: Stop) {
        self.phase = Phase::Done(Some(stop));
    }
}

/// Time from `since` to `now` (zero when `now` is earlier).
fn elapsed(since: DateTime<Utc>, now: DateTime<Utc>) -> Duration {
    (now - since).to_std().unwrap_or(Duration::ZERO)
}

/// What became of a pod a demand run serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    /// Bound on its room.
    Served,
    /// Bound on another node.
    BoundElsewhere,
    /// Deleted, or replaced by another pod of the same name.
    Gone,
    /// Not bound yet.
    Binding,
}

impl Fate {
    /// As `status.activeRun.demand.served` shows it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Fate::Served => "Served",
            Fate::BoundElsewhere => "BoundElsewhere",
            Fate::Gone => "Gone",
            Fate::Binding => "Binding",
        }
    }

    /// The fate of a served pod whose room is `room`: `bound` is the node of the pod of
    /// that name now (`None`: not bound), `None` overall when no such pod is there or it is
    /// another pod (another UID).
    pub fn of(pod: Option<Option<&str>>, room: &str) -> Fate {
        match pod {
            None => Fate::Gone,
            Some(None) => Fate::Binding,
            Some(Some(n)) if n == room => Fate::Served,
            Some(Some(_)) => Fate::BoundElsewhere,
        }
    }
}

/// How often a held pod's nomination is looked at again (the scheduler clears a
/// nomination when it tries the pod while the fence is still on).
pub const RENOMINATE_EVERY: Duration = Duration::from_secs(2);

/// The hold of a demand run: the room is kept for its pods until each has bound, at most
/// `demand.holdTimeout`.
#[derive(Clone, Debug)]
pub struct Hold {
    deadline: DateTime<Utc>,
    timeout: Duration,
    renominated: DateTime<Utc>,
}

/// What the hold does next.
#[derive(Clone, Debug, PartialEq)]
pub enum HoldStep {
    /// Every served pod has bound (or is gone): the hold is over.
    Over,
    /// Release the pods still waiting: the hold ends early (why).
    Release(Stop),
    /// Nominate the waiting pods whose nomination was cleared, again.
    Renominate,
    /// Look again at the next change.
    Wait,
}

impl Hold {
    /// A hold from `now`, for `timeout`.
    pub fn new(now: DateTime<Utc>, timeout: Duration) -> Self {
        Hold {
            deadline: now + TimeDelta::from_std(timeout).unwrap_or(TimeDelta::MAX),
            timeout,
            renominated: now,
        }
    }

    /// The next step of the hold at `now`: `waiting` the served pods not bound yet (their
    /// names, with their rooms).
    pub fn next(
        &mut self,
        waiting: &[String],
        stop_requested: Option<&str>,
        leader: bool,
        now: DateTime<Utc>,
    ) -> HoldStep {
        if waiting.is_empty() {
            return HoldStep::Over;
        }
        if let Some(why) = stop_requested {
            return HoldStep::Release(Stop::Requested(why.to_string()));
        }
        if !leader {
            return HoldStep::Release(Stop::LostLeadership);
        }
        if now >= self.deadline {
            return HoldStep::Release(Stop::Stalled(format!(
                "the room was made but {} did not bind within demand.holdTimeout ({}s); the hold is released",
                waiting.join(", "),
                self.timeout.as_secs()
            )));
        }
        if elapsed(self.renominated, now) >= RENOMINATE_EVERY {
            self.renominated = now;
            return HoldStep::Renominate;
        }
        HoldStep::Wait
    }
}
