//! The DefragPolicy controller.
//!
//! Pipeline of one reconcile (which steps talk to the API server is marked):
//! observe (stores, no I/O) → validate spec and windows (pure) → fragmentation and plan
//! (pure, core) → decide: dry run or a run → [client] server-side dry-run of planned
//! evictions → [client] start/resume/clean up a run (executor) → [client] status.
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, SecondsFormat, Utc};
use futures::StreamExt;
use gpu_defrag_api::v1alpha1::{DefragPolicy, DefragPolicyStatus, DryRunCheck, Mode, RunRecord};
use gpu_defrag_api::{DRAINING_TAINT, FIELD_MANAGER};
use gpu_defrag_core::frag;
use gpu_defrag_core::ingest;
use gpu_defrag_core::model::{Activity, Cluster};
use gpu_defrag_core::plan::{self, History, Plan};
use gpu_defrag_core::policy::Policy;
use gpu_defrag_core::windows::Windows;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, EvictParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use tokio::sync::Mutex;
use tracing::{info, warn};

use crate::executor;
use crate::idle::{IdleSource, IdleState, Measured};
use crate::lease::LeaderState;
use crate::metrics::{Metrics, ReportNumbers};
use crate::status::{self, Want};

/// Field manager for the parts of status the reconciler owns.
pub const RECONCILE_MANAGER: &str = FIELD_MANAGER;
/// Field manager for the run records the executor owns.
pub const EXECUTOR_MANAGER: &str = "gpu-defrag-executor";
/// How often every policy is reconciled without any change.
pub const RESYNC: Duration = Duration::from_secs(30);
/// Planned evictions checked server-side (dry run) per plan.
pub const DRY_RUN_CHECKS: usize = 20;
/// A dry-run check is repeated at most this often for an unchanged plan.
pub const DRY_RUN_EVERY: Duration = Duration::from_secs(300);

/// Errors of a reconcile.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API server refused or failed a request.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// Status could not be serialised.
    #[error("serialising status: {0}")]
    Json(#[from] serde_json::Error),
    /// A node's fences could not be changed (unreadable fence annotations, or updates
    /// that kept conflicting).
    #[error("fencing: {0}")]
    Fence(String),
}

impl Error {
    /// Low-cardinality label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Kube(kube::Error::Api(s)) if s.code == 409 => "Conflict",
            Error::Kube(kube::Error::Api(_)) => "ApiError",
            Error::Kube(_) => "Transport",
            Error::Json(_) => "Serialise",
            Error::Fence(_) => "Fence",
        }
    }
}

/// A run in progress, owned by a tokio task.
pub struct RunHandle {
    /// The task.
    pub task: tokio::task::JoinHandle<()>,
}

/// Shared state of the controller.
pub struct Ctx {
    /// Client.
    pub client: Client,
    /// Nodes (reflector).
    pub nodes: Store<Node>,
    /// Pods (reflector, trimmed to what the model needs).
    pub pods: Store<Pod>,
    /// PDBs (reflector).
    pub pdbs: Store<PodDisruptionBudget>,
    /// Policies (the controller's own store).
    pub policies: Store<DefragPolicy>,
    /// Metrics.
    pub metrics: Metrics,
    /// Leadership.
    pub leader: LeaderState,
    /// Event reporter.
    pub reporter: Reporter,
    /// Runs in progress, by policy name.
    pub runs: Mutex<HashMap<String, RunHandle>>,
    /// Set once the node, pod and PDB caches hold a full list.
    pub caches_ready: Arc<std::sync::atomic::AtomicBool>,
    /// Failed reconciles in a row, per policy (the retry backoff).
    pub failures: std::sync::Mutex<HashMap<String, u32>>,
    /// Koordinator `Device` objects (watched where the CRD is served).
    pub devices: crate::koord::Devices,
    /// The pods' owner objects, namespaces and pod groups.
    pub owners: crate::owners::Owners,
    /// Last dry-run check per policy: plan fingerprint, when, result.
    pub dry_checks: Mutex<HashMap<String, (u64, Instant, DryRunCheck)>>,
    /// GPU activity from Prometheus (`--prometheus-url`), if configured.
    pub idle: Option<IdleSource>,
}

impl Ctx {
    /// The cluster model of the stores' current objects, built without copying them.
    pub fn cluster(&self, now: Option<DateTime<Utc>>) -> Cluster {
        let (nodes, pods, pdbs) = (self.nodes.state(), self.pods.state(), self.pdbs.state());
        let devices = self.devices.objects();
        let owners = self.owners.snapshot();
        ingest::build_cluster_from(
            ingest::ObjectRefs {
                nodes: nodes.iter().map(|n| n.as_ref()).collect(),
                pods: pods.iter().map(|p| p.as_ref()).collect(),
                pdbs: pdbs.iter().map(|p| p.as_ref()).collect(),
                devices: &devices,
                controllers: owners.controllers(),
                namespaces: owners.namespaces(),
                pod_groups: &owners.pod_groups,
                listed: owners.listed,
            },
            now,
        )
    }

    /// The last good GPU activity answer, if `--prometheus-url` is set and Prometheus gave
    /// one at the last refresh (the planner ranks long-idle pods as cheaper to move).
    pub fn idle_measured(&self) -> Option<Arc<Measured>> {
        match self.idle.as_ref()?.state() {
            IdleState::Ready(m) => Some(m),
            _ => None,
        }
    }

    /// A recorder for events.
    pub fn recorder(&self) -> Recorder {
        Recorder::new(self.client.clone(), self.reporter.clone())
    }

    /// Publishes an event on a policy (errors are logged, never fatal).
    pub async fn event(
        &self,
        policy: &DefragPolicy,
        type_: EventType,
        reason: &str,
        note: String,
        secondary: Option<k8s_openapi::api::core::v1::ObjectReference>,
    ) {
        let ev = Event {
            type_,
            reason: reason.into(),
            note: Some(status::truncate(&note, 1000)),
            action: reason.into(),
            secondary,
        };
        if let Err(e) = self.recorder().publish(&ev, &policy.object_ref(&())).await {
            warn!(error = %e, reason, "could not publish event");
        }
    }
}

/// Strips what the model never reads from a Pod, so 6,000 pods stay cheap in memory.
pub fn trim_pod(p: &mut Pod) {
    p.metadata.managed_fields = None;
    if let Some(a) = p.metadata.annotations.as_mut() {
        a.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
    if let Some(spec) = p.spec.as_mut() {
        for c in spec
            .containers
            .iter_mut()
            .chain(spec.init_containers.iter_mut().flatten())
        {
            c.env = None;
            c.env_from = None;
            c.command = None;
            c.args = None;
            c.liveness_probe = None;
            c.readiness_probe = None;
            c.startup_probe = None;
            c.volume_mounts = None;
            c.ports = None;
            c.lifecycle = None;
        }
    }
    if let Some(st) = p.status.as_mut() {
        st.container_statuses = None;
        st.init_container_statuses = None;
        st.ephemeral_container_statuses = None;
    }
}

/// Whether a pod is Ready (condition).
pub fn pod_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Parses an RFC 3339 time from status.
pub fn parse_ts(s: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(s)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

/// RFC 3339 "now".
pub fn ts(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// Policies whose covered nodes overlap with an older policy (the older wins).
pub fn conflicts_with(
    me: &DefragPolicy,
    all: &[Arc<DefragPolicy>],
    cluster: &Cluster,
) -> Option<String> {
    let key = |p: &DefragPolicy| {
        (
            p.metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0.as_second())
                .unwrap_or(i64::MAX),
            p.name_any(),
        )
    };
    let mine = Policy::from_spec(&me.spec).ok()?;
    for other in all {
        if other.name_any() == me.name_any() || key(other) >= key(me) {
            continue;
        }
        let Ok(theirs) = Policy::from_spec(&other.spec) else {
            continue;
        };
        if let Some(n) = cluster.nodes.iter().find(|n| {
            !n.gpus.is_empty() && mine.scope.covers_node(n) && theirs.scope.covers_node(n)
        }) {
            return Some(format!(
                "node {} is also covered by the older policy {}; that policy acts on it, this one only reports",
                n.name,
                other.name_any()
            ));
        }
    }
    None
}

/// A fingerprint of the planned evictions (to re-check them only when they change).
fn fingerprint(p: &Plan) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for m in p.moves.iter().take(DRY_RUN_CHECKS) {
        m.pod.hash(&mut h);
    }
    h.finish()
}

/// Server-side dry run of the first planned evictions: would the API server (PDBs) allow them?
async fn dry_run_check(client: &Client, p: &Plan) -> DryRunCheck {
    let mut out = DryRunCheck::default();
    let params = EvictParams {
        post_options: PostParams {
            dry_run: true,
            field_manager: None,
        },
        delete_options: None,
    };
    for m in p.moves.iter().take(DRY_RUN_CHECKS) {
        let Some((ns, name)) = m.pod.split_once('/') else {
            continue;
        };
        let api: Api<Pod> = Api::namespaced(client.clone(), ns);
        match api.evict(name, &params).await {
            Ok(_) => out.allowed += 1,
            Err(kube::Error::Api(s)) if s.code == 429 => {
                out.blocked += 1;
                if out.blocked_pods.len() < 10 {
                    out.blocked_pods
                        .push(status::truncate(&format!("{}: {}", m.pod, s.message), 200));
                }
            }
            Err(e) => {
                out.failed += 1;
                if out.blocked_pods.len() < 10 {
                    out.blocked_pods
                        .push(status::truncate(&format!("{}: {e}", m.pod), 200));
                }
            }
        }
    }
    out
}

/// History of the active run (limits hold across restarts).
pub fn history_of(run: Option<&RunRecord>) -> History {
    let mut h = History::default();
    if let Some(r) = run {
        h.evicted = r.evicted_pods.clone();
        for key in &r.evicted_pods {
            if let Some((ns, _)) = key.split_once('/') {
                *h.per_namespace.entry(ns.to_string()).or_default() += 1;
            }
        }
        h.per_node = r
            .evicted_per_node
            .clone()
            .into_iter()
            .map(|(k, v)| (k, v.max(0) as u32))
            .collect();
        // Evictions beyond the recorded names still count against the run limit.
        while (h.evicted.len() as i64) < r.evicted {
            h.evicted.push(format!("<unrecorded-{}>", h.evicted.len()));
        }
    }
    h
}

/// The reconcile.
pub async fn reconcile(dp: Arc<DefragPolicy>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let started = Instant::now();
    let name = dp.name_any();
    if !ctx.leader.is_leader() {
        // Standby replicas compute nothing and write nothing.
        return Ok(Action::requeue(Duration::from_secs(10)));
    }
    if !ctx.caches_ready.load(std::sync::atomic::Ordering::SeqCst) {
        // Never plan (or resume a run) on a partial view of the cluster.
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    crate::apiclient::report_outage(&ctx, &dp).await;
    let now = Utc::now();
    let now_s = ts(now);
    let api: Api<DefragPolicy> = Api::all(ctx.client.clone());
    let old = dp.status.clone().unwrap_or_default();
    let generation = dp.metadata.generation;

    // Validate: what the schema cannot judge becomes a condition, and nothing is evicted.
    let policy = Policy::from_spec(&dp.spec);
    let windows = Windows::parse(&dp.spec.windows);
    let invalid = match (&policy, &windows) {
        (Err(e), _) => Some(("InvalidSpec", e.to_string())),
        (_, Err(e)) => Some(("InvalidWindow", e.to_string())),
        _ => None,
    };
    if let Some((reason, msg)) = invalid {
        // A run in progress under a policy that became invalid is stopped and cleaned up.
        stop_run(&ctx, &name).await;
        if old.active_run.is_some() {
            executor::abandon(
                &ctx,
                &dp,
                "Aborted",
                &format!("policy became invalid: {msg}"),
            )
            .await?;
        }
        let conds = status::conditions(
            &old.conditions,
            &[
                Want::new("Ready", false, reason, msg.clone()),
                Want::new("Degraded", true, reason, msg.clone()),
                Want::new(
                    "InWindow",
                    false,
                    reason,
                    "windows not evaluated: the policy is invalid",
                ),
                Want::new(
                    "Executing",
                    false,
                    reason,
                    "nothing is evicted while the policy is invalid",
                ),
            ],
            generation,
            &now_s,
        );
        let st = json!({"conditions": conds, "observedGeneration": generation});
        patch_status(&api, &name, RECONCILE_MANAGER, st).await?;
        ctx.metrics.reconcile_error(&name, reason);
        ctx.event(&dp, EventType::Warning, reason, msg, None).await;
        return Ok(Action::requeue(Duration::from_secs(300)));
    }
    let (policy, windows) = (policy.expect("checked"), windows.expect("checked"));

    // Observe and compute (pure).
    let cluster = ctx.cluster(Some(now));
    let report = frag::report(&cluster, &policy);
    let measured = ctx.idle_measured();
    let idle = ctx
        .idle
        .as_ref()
        .map(|src| idle_view(src, &cluster, &policy));
    let history = history_of(old.active_run.as_ref());
    let no_activity = Activity::default();
    let activity = measured.as_ref().map_or(&no_activity, |m| &m.activity);
    let plan = plan::plan_with_activity(&cluster, &policy, Some(now), &history, activity);
    let conflict = conflicts_with(&dp, &ctx.policies.state(), &cluster);
    let open = windows.open_at(now);
    let window_status = windows.status(now);
    let enforce = dp.spec.mode == Mode::Enforce;
    let triggered = report.fragment_rate >= policy.min_fragment_rate;

    // Runs: start, resume, or clean up.
    let running = {
        let mut runs = ctx.runs.lock().await;
        if let Some(h) = runs.get(&name)
            && h.task.is_finished()
        {
            runs.remove(&name);
        }
        runs.contains_key(&name)
    };
    let mut run_note = String::new();
    if !running {
        match (&old.active_run, open) {
            (Some(active), Some(_))
                if enforce
                    && conflict.is_none()
                    && parse_ts(&active.window_end).is_some_and(|end| end > now) =>
            {
                // The run's own window is still open: resume it, with its own end.
                info!(policy = %name, run = %active.id, "resuming run after restart");
                let end = parse_ts(&active.window_end).expect("checked");
                executor::start(
                    ctx.clone(),
                    dp.clone(),
                    policy.clone(),
                    end,
                    Some(active.clone()),
                )
                .await;
                run_note = format!("resumed run {}", active.id);
            }
            (Some(active), _) => {
                let result = if open.is_none() {
                    "WindowClosed"
                } else {
                    "Aborted"
                };
                info!(policy = %name, run = %active.id, result, "cleaning up a run left by a previous operator process");
                executor::abandon(&ctx, &dp, result, "the operator restarted outside the run's window (or the policy changed); fences removed").await?;
            }
            (None, Some(span))
                if enforce && conflict.is_none() && triggered && !plan.moves.is_empty() =>
            {
                // One run per window: overlapping openings (e.g. `* * * * *` with a 1h
                // duration) count as the window of the last run until it ends.
                let already = old
                    .last_runs
                    .first()
                    .and_then(|r| parse_ts(&r.window_end))
                    .is_some_and(|end| end > now);
                if !already {
                    executor::start(ctx.clone(), dp.clone(), policy.clone(), span.end, None).await;
                    run_note = "run started".into();
                }
            }
            (None, _) => executor::remove_stale_fences(&ctx, &name).await?,
        }
    }
    let executing = running || !run_note.is_empty();

    // Dry-run check of planned evictions (throttled).
    let fp = fingerprint(&plan);
    let check = if plan.moves.is_empty() {
        None
    } else {
        let mut checks = ctx.dry_checks.lock().await;
        match checks.get(&name) {
            Some((f, at, c)) if *f == fp && at.elapsed() < DRY_RUN_EVERY => Some(c.clone()),
            _ => {
                let c = dry_run_check(&ctx.client, &plan).await;
                for _ in 0..c.allowed {
                    ctx.metrics.eviction(&name, "dry_run_allowed");
                }
                for _ in 0..c.blocked {
                    ctx.metrics.eviction(&name, "dry_run_blocked");
                }
                checks.insert(name.clone(), (fp, Instant::now(), c.clone()));
                Some(c)
            }
        }
    };

    // Conditions.
    let mut wanted = vec![Want::new(
        "Ready",
        true,
        "Reconciled",
        format!(
            "measured {} nodes, plan of {} evictions",
            report.nodes_counted,
            plan.moves.len()
        ),
    )];
    wanted.push(match (open, &window_status) {
        (Some(s), _) => Want::new(
            "InWindow",
            true,
            "WindowOpen",
            format!("window open until {}", ts(s.end)),
        ),
        (None, Some(w)) => Want::new(
            "InWindow",
            false,
            "WindowClosed",
            format!("next window opens at {}", w.start),
        ),
        (None, None) => Want::new(
            "InWindow",
            false,
            "NoWindow",
            "no maintenance window: dry run only",
        ),
    });
    let why_not = if !enforce {
        "mode DryRun: plan only".to_string()
    } else if conflict.is_some() {
        "conflict with an older policy".to_string()
    } else if open.is_none() {
        "outside the maintenance windows".to_string()
    } else if !triggered {
        format!(
            "fragment rate {:.3} is below the trigger {:.3}",
            report.fragment_rate, policy.min_fragment_rate
        )
    } else if plan.moves.is_empty() {
        "no move would reduce fragmentation within the limits".to_string()
    } else {
        "this window's run has finished".to_string()
    };
    wanted.push(if executing {
        Want::new(
            "Executing",
            true,
            "RunInProgress",
            if run_note.is_empty() {
                "a run is in progress".into()
            } else {
                run_note.clone()
            },
        )
    } else {
        Want::new("Executing", false, "NotExecuting", why_not)
    });
    let degraded = match &check {
        Some(c) if c.blocked > 0 || c.failed > 0 => Some(format!(
            "{} of the first planned evictions would be refused (PodDisruptionBudget or error): {}",
            c.blocked + c.failed,
            c.blocked_pods.join("; ")
        )),
        _ if report.unknown_pods > 0 => Some(format!(
            "{} GPU pods have unreadable allocation records and are never moved; their nodes are never drained",
            report.unknown_pods
        )),
        _ => None,
    };
    wanted.push(match &degraded {
        Some(m) => Want::new("Degraded", true, "PlanPartlyBlocked", m.clone()),
        None => Want::new("Degraded", false, "AsExpected", "all checks passed"),
    });
    wanted.push(match &conflict {
        Some(m) => Want::new("Conflict", true, "OverlappingPolicy", m.clone()),
        None => Want::new(
            "Conflict",
            false,
            "NoOverlap",
            "no older policy covers these nodes",
        ),
    });
    if let Some(v) = &idle {
        wanted.push(v.condition.clone());
    }
    let conds = status::conditions(&old.conditions, &wanted, generation, &now_s);
    let mut plan_summary = status::plan_summary(&plan, &now_s);
    plan_summary.dry_run_check = check;
    let skipped: BTreeMap<String, i64> = plan
        .skipped
        .iter()
        .map(|(k, v)| (k.clone(), *v as i64))
        .collect();
    let st = DefragPolicyStatus {
        conditions: conds,
        observed_generation: generation,
        fragmentation: Some(status::summary(&report, &now_s)),
        plan: Some(plan_summary),
        next_window: window_status,
        active_run: None,
        last_runs: Vec::new(),
        skipped,
        idle_allocated: idle.as_ref().and_then(|v| v.summary.clone()),
    };
    let mut body = serde_json::to_value(&st)?;
    // The run records belong to the executor's field manager.
    if let Some(o) = body.as_object_mut() {
        o.remove("activeRun");
        o.remove("lastRuns");
    }
    let changed = status_changed(&old, &st);
    if changed {
        patch_status(&api, &name, RECONCILE_MANAGER, body).await?;
    }

    // Metrics.
    ctx.metrics.set_report(
        &name,
        &ReportNumbers {
            fragment_rate: report.fragment_rate,
            idle_milli: report.idle_milli,
            fragment_milli: report.fragment_milli,
            fully_free_gpus: report.fully_free_gpus,
            fully_free_nodes: report.fully_free_nodes,
            unknown_pods: report.unknown_pods,
            pending_unplaceable: report.pending_unplaceable,
        },
    );
    ctx.metrics.set_trigger(&name, policy.min_fragment_rate);
    ctx.metrics.set_idle(
        &name,
        idle.as_ref()
            .and_then(|v| v.numbers.as_ref())
            .map(|r| (r.pods, r.gpus, r.milli)),
    );
    ctx.metrics
        .set_plan(&name, plan.moves.len() as u64, &plan.skipped);
    ctx.metrics.set_window(&name, open.is_some());
    ctx.metrics.set_gpus(&cluster.nodes);
    ctx.metrics
        .observe_reconcile(started.elapsed().as_secs_f64());

    // Requeue: periodically, and right when the next window opens.
    let until_next = windows
        .next(now)
        .map(|s| (s.start - now).to_std().unwrap_or_default())
        .filter(|d| !d.is_zero());
    let after = until_next
        .map(|d| d.min(RESYNC) + Duration::from_millis(200))
        .unwrap_or(RESYNC);
    Ok(Action::requeue(after))
}

/// Whether anything but timestamps changed (avoids a status write every resync).
fn status_changed(old: &DefragPolicyStatus, new: &DefragPolicyStatus) -> bool {
    let mut a = old.clone();
    let mut b = new.clone();
    for s in [&mut a, &mut b] {
        s.active_run = None;
        s.last_runs.clear();
        if let Some(f) = s.fragmentation.as_mut() {
            f.observed_at.clear();
        }
        if let Some(p) = s.plan.as_mut() {
            p.computed_at.clear();
        }
        if let Some(i) = s.idle_allocated.as_mut() {
            i.observed_at.clear();
        }
    }
    a != b
}

/// Server-side apply of part of the status.
pub async fn patch_status(
    api: &Api<DefragPolicy>,
    name: &str,
    manager: &str,
    status: serde_json::Value,
) -> Result<(), Error> {
    let body =
        json!({"apiVersion": "gpu-defrag.io/v1alpha1", "kind": "DefragPolicy", "status": status});
    let size = body.to_string().len();
    if size > status::MAX_STATUS_BYTES {
        // Every list in the status is capped; this means a cap is missing.
        warn!(
            policy = name,
            manager,
            size,
            "status patch over {} bytes",
            status::MAX_STATUS_BYTES
        );
    }
    let pp = PatchParams::apply(manager).force();
    tokio::time::timeout(
        Duration::from_secs(20),
        api.patch_status(name, &pp, &Patch::Apply(&body)),
    )
    .await
    .map_err(|_| {
        kube::Error::Service(Box::new(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "status patch timed out",
        )))
    })??;
    Ok(())
}

/// Stops a run task (it leaves its record; the caller decides what to do with it).
pub async fn stop_run(ctx: &Ctx, name: &str) {
    if let Some(h) = ctx.runs.lock().await.remove(name) {
        h.task.abort();
    }
}

/// [`reconcile`]; a success resets the policy's retry backoff.
async fn reconcile_and_reset_backoff(
    dp: Arc<DefragPolicy>,
    ctx: Arc<Ctx>,
) -> Result<Action, Error> {
    let r = reconcile(dp.clone(), ctx.clone()).await;
    if r.is_ok() {
        ctx.failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&dp.name_any());
    }
    r
}

/// First retry of a failed reconcile; each further failure in a row doubles it.
pub const RETRY_FIRST: Duration = Duration::from_secs(1);
/// Longest wait before a failed reconcile is retried.
pub const RETRY_MAX: Duration = Duration::from_secs(60);

/// The wait before retrying a policy whose reconcile failed `failures` times in a row
/// (1 s, 2 s, 4 s … up to [`RETRY_MAX`]), with up to a quarter more picked from `seed`, so
/// that policies failing together do not retry together.
pub fn retry_after(failures: u32, seed: u64) -> Duration {
    let base = RETRY_FIRST
        .saturating_mul(1u32 << failures.saturating_sub(1).min(16))
        .min(RETRY_MAX);
    // splitmix64 of the seed: a fraction in [0, 1).
    let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    let frac = (z ^ (z >> 31)) as f64 / (u64::MAX as f64 + 1.0);
    base.mul_f64(1.0 + frac / 4.0).min(RETRY_MAX)
}

/// Error policy: a failed reconcile is retried with exponential backoff per policy (reset
/// by the next reconcile that succeeds); every failure is counted by kind.
pub fn error_policy(dp: Arc<DefragPolicy>, err: &Error, ctx: Arc<Ctx>) -> Action {
    let name = dp.name_any();
    let failures = {
        let mut f = ctx.failures.lock().unwrap_or_else(|p| p.into_inner());
        let n = f.entry(name.clone()).or_default();
        *n = n.saturating_add(1);
        *n
    };
    let seed = name.bytes().fold(u64::from(failures), |h, b| {
        h.wrapping_mul(31).wrapping_add(u64::from(b))
    });
    let wait = retry_after(failures, seed);
    warn!(policy = %name, error = %err, failures, retry_in = ?wait, "reconcile failed");
    ctx.metrics.reconcile_error(&name, err.kind());
    Action::requeue(wait)
}

/// Options of `gpu-defrag run`.
pub struct RunOptions {
    /// Identity for leader election and events.
    pub identity: String,
    /// Label selector of the policies this process reconciles (empty: all).
    pub policy_selector: String,
    /// Allocated-but-idle GPUs from Prometheus (`--prometheus-url`).
    pub idle: Option<IdleSource>,
}

/// Starts the reflectors and the controller; returns when the controller stream ends.
pub async fn run(
    client: Client,
    metrics: Metrics,
    leader: LeaderState,
    ready: Arc<std::sync::atomic::AtomicBool>,
    opts: RunOptions,
) -> anyhow::Result<()> {
    // Check the CRD is installed before anything else.
    let policies: Api<DefragPolicy> = Api::all(client.clone());
    if let Err(e) = policies.list(&ListParams::default().limit(1)).await {
        anyhow::bail!(
            "cannot list DefragPolicies ({e}); is the CRD installed? kubectl apply -f crds/defragpolicy.yaml"
        );
    }
    let (nodes, nodes_w) = reflector::store::<Node>();
    let (pods, pods_w) = reflector::store::<Pod>();
    let (pdbs, pdbs_w) = reflector::store::<PodDisruptionBudget>();
    let (tx, rx) = tokio::sync::mpsc::channel::<()>(1);
    let cfg = watcher::Config::default().any_semantic();
    let node_stream = watcher(Api::<Node>::all(client.clone()), cfg.clone())
        .modify(|n: &mut Node| {
            n.metadata.managed_fields = None;
            // Image lists are the bulk of a real node object; the model never reads them.
            if let Some(st) = n.status.as_mut() {
                st.images = None;
            }
        })
        .default_backoff()
        .reflect(nodes_w)
        .touched_objects();
    let pod_stream = watcher(Api::<Pod>::all(client.clone()), cfg.clone())
        .modify(trim_pod)
        .default_backoff()
        .reflect(pods_w)
        .touched_objects();
    let pdb_stream = watcher(Api::<PodDisruptionBudget>::all(client.clone()), cfg.clone())
        .default_backoff()
        .reflect(pdbs_w)
        .touched_objects();
    for s in [
        node_stream.map(|_| ()).boxed(),
        pod_stream.map(|_| ()).boxed(),
        pdb_stream.map(|_| ()).boxed(),
    ] {
        let tx = tx.clone();
        tokio::spawn(async move {
            let mut s = s;
            while s.next().await.is_some() {
                // Coalesce: one pending trigger is enough.
                let _ = tx.try_send(());
            }
        });
    }
    let devices = {
        let tx = tx.clone();
        crate::koord::Devices::start(client.clone(), move || {
            let _ = tx.try_send(());
        })
        .await
    };
    let owners = {
        let tx = tx.clone();
        crate::owners::Owners::start(client.clone(), move || {
            let _ = tx.try_send(());
        })
        .await
    };
    let trigger = tokio_stream_from(rx);
    let mut pcfg = watcher::Config::default().any_semantic();
    if !opts.policy_selector.is_empty() {
        pcfg = pcfg.labels(&opts.policy_selector);
    }
    let controller = Controller::new(policies, pcfg)
        // A short debounce only merges a policy's own bursts: kube's debounce restarts on
        // every new request, so with cluster changes more often than it lasts no reconcile
        // would ever run. Cluster changes are throttled instead (`tokio_stream_from`).
        .with_config(
            kube::runtime::controller::Config::default().debounce(Duration::from_millis(100)),
        )
        .reconcile_all_on(trigger);
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        nodes: nodes.clone(),
        pods: pods.clone(),
        pdbs: pdbs.clone(),
        policies: controller.store(),
        metrics,
        leader,
        reporter: Reporter {
            controller: "gpu-defrag".into(),
            instance: Some(opts.identity),
        },
        runs: Mutex::new(HashMap::new()),
        devices: devices.clone(),
        owners: owners.clone(),
        failures: Default::default(),
        dry_checks: Mutex::new(HashMap::new()),
        idle: opts.idle.clone(),
        caches_ready: Arc::new(std::sync::atomic::AtomicBool::new(false)),
    });
    // GPU activity: refreshed in the background; a change reconciles every policy.
    if let Some(src) = opts.idle.clone() {
        let tx = tx.clone();
        tokio::spawn(src.run(ctx.metrics.clone(), ctx.leader.clone(), move || {
            let _ = tx.try_send(());
        }));
    }
    // Series of deleted policies are dropped from /metrics.
    {
        let (store, metrics) = (ctx.policies.clone(), ctx.metrics.clone());
        tokio::spawn(async move {
            let mut known: std::collections::BTreeSet<String> = Default::default();
            loop {
                tokio::time::sleep(Duration::from_secs(30)).await;
                let now: std::collections::BTreeSet<String> =
                    store.state().iter().map(|p| p.name_any()).collect();
                for gone in known.difference(&now) {
                    metrics.forget_policy(gone);
                }
                known = now;
            }
        });
    }
    // Ready once the caches are filled.
    let (n, p, b) = (nodes.clone(), pods.clone(), pdbs.clone());
    let (ready2, caches) = (ready.clone(), ctx.caches_ready.clone());
    tokio::spawn(async move {
        let _ = tokio::join!(
            n.wait_until_ready(),
            p.wait_until_ready(),
            b.wait_until_ready(),
            devices.wait_until_ready(),
            owners.wait_until_ready()
        );
        caches.store(true, std::sync::atomic::Ordering::SeqCst);
        ready2.store(true, std::sync::atomic::Ordering::SeqCst);
    });
    controller
        .shutdown_on_signal()
        .run(reconcile_and_reset_backoff, error_policy, ctx)
        .for_each(|r| async move {
            if let Err(e) = r {
                warn!(error = %e, "controller");
            }
        })
        .await;
    Ok(())
}

/// What a reconcile reports about allocated-but-idle GPUs.
pub struct IdleView {
    /// The `IdleData` condition.
    pub condition: Want,
    /// `status.idleAllocated` (None: no data).
    pub summary: Option<gpu_defrag_api::v1alpha1::IdleAllocatedSummary>,
    /// The numbers for metrics (None: no data, the series are removed).
    pub numbers: Option<frag::IdleAllocated>,
}

/// The idle report of a policy from the source's last answer (no I/O).
pub fn idle_view(src: &IdleSource, cluster: &Cluster, policy: &Policy) -> IdleView {
    let cfg = src.config();
    match src.state() {
        IdleState::Pending => IdleView {
            condition: Want::new(
                "IdleData",
                false,
                "NotQueriedYet",
                "waiting for the first answer from Prometheus",
            ),
            summary: None,
            numbers: None,
        },
        IdleState::Failed { error, at } => IdleView {
            condition: Want::new(
                "IdleData",
                false,
                error.reason(),
                format!("no idle GPU data since {}: {error}", ts(at)),
            ),
            summary: None,
            numbers: None,
        },
        IdleState::Ready(m) => {
            let r = frag::idle_allocated(cluster, policy, &m.activity);
            let s = m.stats;
            let message = format!(
                "{} GPU series ({} by {}, {} by {}), {} without a pod, {} skipped as invalid; \
                 {} of {} GPU pods measured",
                s.sm_active + s.gpu_util + s.without_pod,
                s.sm_active,
                crate::idle::SM_ACTIVE,
                s.gpu_util,
                crate::idle::GPU_UTIL,
                s.without_pod,
                s.invalid,
                r.measured_pods,
                r.gpu_pods
            );
            let reason = if s.sm_active + s.gpu_util + s.without_pod == 0 {
                "NoSeries"
            } else {
                "Measured"
            };
            IdleView {
                condition: Want::new("IdleData", true, reason, message),
                summary: Some(status::idle_summary(
                    &r,
                    cfg.threshold,
                    &cfg.lookback_text(),
                    &ts(m.at),
                )),
                numbers: Some(r),
            }
        }
    }
}

/// How often cluster changes reconcile every policy, at most.
pub const TRIGGER_EVERY: Duration = Duration::from_secs(1);

/// A stream of `()` from a channel receiver, at most one per [`TRIGGER_EVERY`]: the first
/// change reconciles at once, changes during the pause after it are merged into one. Under
/// constant churn (a large cluster always has some) this still reconciles once per period.
fn tokio_stream_from(
    rx: tokio::sync::mpsc::Receiver<()>,
) -> impl futures::Stream<Item = ()> + Send + 'static {
    futures::stream::unfold((rx, false), |(mut rx, pause)| async move {
        if pause {
            tokio::time::sleep(TRIGGER_EVERY).await;
        }
        rx.recv().await.map(|()| ((), (rx, true)))
    })
}

/// The taint a run puts on nodes it empties.
pub fn draining_taint(policy: &str) -> serde_json::Value {
    json!({"key": DRAINING_TAINT, "value": policy, "effect": "NoSchedule"})
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu_defrag_api::v1alpha1::DefragPolicySpec;

    #[test]
    fn failed_reconciles_back_off_exponentially_with_jitter_up_to_a_minute() {
        let secs = |n, seed| retry_after(n, seed).as_secs_f64();
        for seed in [0, 1, 42, u64::MAX] {
            for (n, base) in [(0, 1.0), (1, 1.0), (2, 2.0), (3, 4.0), (6, 32.0)] {
                let s = secs(n, seed);
                assert!(
                    (base..=base * 1.25).contains(&s),
                    "{n} failures, seed {seed}: {s}"
                );
            }
            for n in [7, 20, u32::MAX] {
                assert_eq!(secs(n, seed), 60.0);
            }
        }
        // Jitter spreads policies that fail together.
        let spread: std::collections::BTreeSet<u128> = (0..20)
            .map(|seed| retry_after(3, seed).as_millis())
            .collect();
        assert!(spread.len() > 10, "{spread:?}");
    }
    use gpu_defrag_core::ingest::Objects;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn policy(name: &str, created: i64, selector: serde_json::Value) -> Arc<DefragPolicy> {
        let spec: DefragPolicySpec =
            serde_json::from_value(json!({"nodeSelector": selector})).unwrap();
        let mut p = DefragPolicy::new(name, spec);
        p.metadata.creation_timestamp = Some(Time(
            k8s_openapi::jiff::Timestamp::from_second(created).unwrap(),
        ));
        Arc::new(p)
    }

    fn cluster() -> Cluster {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": "n1", "labels": {"pool": "a", "team": "x"}},
            "status": {"allocatable": {"nvidia.com/gpu": "8"}, "conditions": [{"type": "Ready", "status": "True"}]}
        }))
        .unwrap();
        ingest::build_cluster(
            &Objects {
                nodes: vec![node],
                ..Default::default()
            },
            None,
        )
    }

    #[test]
    fn the_older_policy_wins_an_overlap() {
        let older = policy("older", 100, json!({"matchLabels": {"pool": "a"}}));
        let newer = policy("newer", 200, json!({"matchLabels": {"team": "x"}}));
        let elsewhere = policy("elsewhere", 50, json!({"matchLabels": {"pool": "b"}}));
        let all = vec![older.clone(), newer.clone(), elsewhere.clone()];
        let c = cluster();
        assert!(conflicts_with(&older, &all, &c).is_none());
        let msg = conflicts_with(&newer, &all, &c).expect("newer overlaps older");
        assert!(
            msg.contains("older policy older") && msg.contains("n1"),
            "{msg}"
        );
        assert!(conflicts_with(&elsewhere, &all, &c).is_none());
    }

    #[test]
    fn history_counts_every_recorded_eviction() {
        let run = RunRecord {
            evicted: 3,
            evicted_pods: vec!["a/p1".into(), "b/p2".into()],
            evicted_per_node: [("n1".to_string(), 3)].into(),
            ..Default::default()
        };
        let h = history_of(Some(&run));
        assert_eq!(
            h.evicted.len(),
            3,
            "an unrecorded name still counts against the run limit"
        );
        assert_eq!(h.per_node.get("n1"), Some(&3));
        assert_eq!(h.per_namespace.get("a"), Some(&1));
    }

    #[test]
    fn idle_view_reports_nothing_without_a_good_answer() {
        use crate::idle::{IdleArgs, IdleSource, IdleState, Measured, QueryError, SeriesStats};
        use gpu_defrag_core::model::PodActivity;
        let cfg = IdleArgs {
            idle_lookback: Duration::from_secs(3600),
            prometheus_timeout: Duration::from_secs(1),
            ..IdleArgs::for_url("http://127.0.0.1:9")
        }
        .config()
        .unwrap()
        .unwrap();
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ml", "uid": "u",
                         "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "resources": {
                "limits": {"nvidia.com/gpu": "2"}, "requests": {"nvidia.com/gpu": "2"}}}]},
            // Idle time counts from the pod's start.
            "status": {"phase": "Running", "startTime": "2026-01-01T00:00:00Z",
                       "conditions": [{"type": "Ready", "status": "True"}]}
        }))
        .unwrap();
        let objs = Objects {
            nodes: vec![
                serde_json::from_value(json!({
                    "metadata": {"name": "n1"},
                    "status": {"allocatable": {"nvidia.com/gpu": "8"},
                               "conditions": [{"type": "Ready", "status": "True"}]}
                }))
                .unwrap(),
            ],
            pods: vec![pod],
            ..Default::default()
        };
        let now = parse_ts("2026-01-02T00:00:00Z");
        let c = ingest::build_cluster(&objs, now);
        let policy = Policy::default();
        let failed = IdleSource::with_state(
            cfg.clone(),
            IdleState::Failed {
                error: QueryError::Unreachable("refused".into()),
                at: now.unwrap(),
            },
        );
        for (src, reason) in [
            (
                IdleSource::with_state(cfg.clone(), IdleState::Pending),
                "NotQueriedYet",
            ),
            (failed, "PrometheusUnreachable"),
        ] {
            let v = idle_view(&src, &c, &policy);
            assert_eq!(
                (v.condition.status, v.condition.reason.as_str()),
                (false, reason)
            );
            assert!(v.summary.is_none() && v.numbers.is_none());
        }
        let measured = Measured {
            activity: gpu_defrag_core::model::Activity {
                pods: [("ml/p".to_string(), PodActivity { peak: 0.1, gpus: 2 })].into(),
                threshold: 0.3,
                lookback: Duration::from_secs(3600),
            },
            at: now.unwrap(),
            stats: SeriesStats {
                sm_active: 2,
                ..Default::default()
            },
        };
        let v = idle_view(
            &IdleSource::with_state(cfg, IdleState::Ready(Arc::new(measured))),
            &c,
            &policy,
        );
        assert_eq!(
            (v.condition.status, v.condition.reason.as_str()),
            (true, "Measured")
        );
        let s = v.summary.unwrap();
        assert_eq!(
            (s.pods, s.gpus, s.milli, s.gpu_pods, s.measured_pods),
            (1, 2, 2000, 1, 1)
        );
        assert_eq!(
            (s.lookback.as_str(), s.idle_pods[0].pod.as_str()),
            ("1h", "ml/p")
        );
    }
}
