//! One reconcile of a DefragPolicy, as a pipeline of named steps:
//! gate → validate → observe → decide → act → check → status → metrics → requeue.
//! Only `act`, `check` and `write_status` talk to the API server (and `refuse`, for an
//! invalid policy); [`decide`](super::decide) is pure.
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use gpu_defrag_api::v1alpha1::{DefragPolicy, DefragPolicyStatus, DryRunCheck};
use gpu_defrag_api::values::RunResult;
use gpu_defrag_core::plan::Plan;
use gpu_defrag_core::policy::Policy;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use serde_json::json;
use tracing::{info, warn};

use super::decide::{self, IdleView, Invalid, RunDecision, Situation};
use crate::apiclient;
use crate::context::{Ctx, Error, EventReason, Observed, RECONCILE_MANAGER, patch_status};
use crate::demand;
use crate::executor::{self, evictor::Evictor, fences};
use crate::metrics::{Metrics, ReportNumbers};
use crate::objects::ts;
use crate::status;

/// An outage whose event could not be published is told again this soon.
const RETELL_OUTAGES: Duration = Duration::from_secs(10);

/// With `demand` set, a reconcile comes back this soon while GPU pods wait for room.
const DEMAND_RECHECK: Duration = Duration::from_secs(10);

/// A dry-run check is repeated at most this often for an unchanged plan.
pub const DRY_RUN_EVERY: Duration = Duration::from_secs(300);

/// The reconcile.
#[tracing::instrument(skip_all, fields(policy = %dp.name_any()))]
pub async fn reconcile(dp: Arc<DefragPolicy>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let _timer = ctx.metrics.reconcile_timer();
    if let Some(wait) = gate(&ctx) {
        return Ok(Action::requeue(wait));
    }
    let outages_told = report_outages(&ctx, &dp).await;
    let now = Utc::now();
    let (policy, windows) = match decide::validate(&dp) {
        Ok(valid) => valid,
        Err(invalid) => return refuse(&ctx, &dp, invalid, now).await,
    };
    let old = dp.status.clone().unwrap_or_default();
    let obs = ctx.observe(&policy, old.active_run.as_ref(), now);
    let idle = ctx
        .idle
        .as_ref()
        .map(|src| decide::idle_view(src, &obs.cluster, &policy));
    let conflict = decide::conflicts_with(&dp, &ctx.policies.state(), &obs.cluster);
    let s = Situation::of(&dp, &policy, &windows, &old, &obs, conflict.as_deref(), now);
    if decide::newly_without_gpu_nodes(&s) {
        let note = decide::NO_GPU_NODES.to_string();
        ctx.event(&dp, EventType::Warning, EventReason::NoGpuNodes, note, None)
            .await;
    }
    let running = ctx.run_alive(&dp.name_any()).await;
    let decided = decide::decide(&s, running, &policy, &obs.cluster);
    if let Some(c) = &decided.demand {
        tell_demand(&ctx, &dp, c).await;
    }
    let run_note = act(&ctx, &dp, &policy, decided.run).await?;
    let considered = decided.demand;
    let check = check(&ctx, &dp, &obs.plan).await;
    let st = decide::reconciled_status(
        &s,
        &dp,
        &windows,
        running,
        &run_note,
        check,
        idle.as_ref(),
        considered.as_ref(),
    );
    write_status(&ctx, &dp.name_any(), &old, &st).await?;
    record_metrics(
        &ctx.metrics,
        &dp.name_any(),
        &policy,
        &obs,
        idle.as_ref(),
        s.open.is_some(),
    );
    let mut requeue = decide::requeue_after(&windows, now);
    if !outages_told {
        requeue = requeue.min(RETELL_OUTAGES);
    }
    // Demand runs look again soon while a GPU pod waits for room.
    if considered.is_some() && (obs.report.pending_unplaceable > 0 || running) {
        requeue = requeue.min(DEMAND_RECHECK);
    }
    Ok(Action::requeue(requeue))
}

/// Standby replicas compute nothing and write nothing; nobody plans (or resumes a run) on
/// a partial view of the cluster. Some: come back after that long.
pub fn gate(ctx: &Ctx) -> Option<Duration> {
    if !ctx.leader.is_leader() {
        return Some(Duration::from_secs(10));
    }
    if !ctx.caches_ready.load(std::sync::atomic::Ordering::SeqCst) {
        return Some(Duration::from_secs(1));
    }
    None
}

/// How long a deleted policy's run may take to stop and take its fences back before it is
/// cut short (its fences are then removed here).
pub const STOP_WAIT: Duration = Duration::from_secs(30);

/// A deleted policy (its finalizer): its run stops before the next eviction and takes its
/// fences back; a run no task owns (the operator was down) is ended here; then any fence
/// of the policy still on a node is removed. Only then may the object go.
#[tracing::instrument(skip_all, fields(policy = %dp.name_any()))]
pub async fn cleanup(dp: Arc<DefragPolicy>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let name = dp.name_any();
    let why = "the policy was deleted";
    if ctx.request_stop(&name, why).await && !ctx.wait_run_end(&name, STOP_WAIT).await {
        warn!(policy = %name, "the run did not stop in time; cutting it short");
        ctx.stop_run(&name).await;
    }
    // The record as the run left it.
    let api: Api<DefragPolicy> = Api::all(ctx.client.clone());
    let fresh = match api.get(&name).await {
        Ok(p) => p,
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(Action::await_change()),
        Err(e) => return Err(e.into()),
    };
    if fresh
        .status
        .as_ref()
        .is_some_and(|s| s.active_run.is_some())
    {
        let msg = format!("stopped: {why}; fences removed");
        executor::abandon(&ctx, &fresh, RunResult::Stopped, &msg).await?;
    }
    // A live list: the cache may lag the run's last fence edits.
    let nodes: Vec<Arc<Node>> = Api::<Node>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .map(Arc::new)
        .collect();
    let rules: Vec<Arc<_>> = fences::list_rules(&ctx.client, &name)
        .await?
        .into_iter()
        .map(Arc::new)
        .collect();
    fences::remove_stale(&ctx.client, &nodes, &rules, &name).await?;
    info!(policy = %name, "policy deleted: its fences are removed");
    Ok(Action::await_change())
}

/// A Warning event for each API-server outage that ended since the policy was last told;
/// false if one could not be published (they are all tried again at the next reconcile,
/// at most [`RETELL_OUTAGES`] later).
async fn report_outages(ctx: &Ctx, dp: &DefragPolicy) -> bool {
    let name = dp.name_any();
    let untold = apiclient::untold_outages(&name);
    let mut published = 0;
    for note in untold.notes() {
        let reason = EventReason::ApiServerUnavailable;
        if !ctx
            .event(dp, EventType::Warning, reason, note.into(), None)
            .await
        {
            break;
        }
        published += 1;
    }
    untold.told(&name, published);
    published == untold.len()
}

/// An invalid policy: a run in progress under it is stopped and cleaned up, the
/// conditions say why, nothing is evicted.
async fn refuse(
    ctx: &Ctx,
    dp: &DefragPolicy,
    invalid: Invalid,
    now: DateTime<Utc>,
) -> Result<Action, Error> {
    let name = dp.name_any();
    let old = dp.status.clone().unwrap_or_default();
    ctx.stop_run(&name).await;
    if old.active_run.is_some() {
        let why = format!("policy became invalid: {}", invalid.message);
        executor::abandon(ctx, dp, RunResult::Aborted, &why).await?;
    }
    let generation = dp.metadata.generation;
    let conds = status::conditions(&old.conditions, &invalid.conditions(), generation, &ts(now));
    let st = json!({"conditions": conds, "observedGeneration": generation});
    patch_status(&ctx.client, &name, RECONCILE_MANAGER, st).await?;
    ctx.metrics.reconcile_error(&name, invalid.reason.as_str());
    ctx.event(
        dp,
        EventType::Warning,
        invalid.event(),
        invalid.message,
        None,
    )
    .await;
    Ok(Action::requeue(decide::INVALID_RESYNC))
}

/// Tells the pods no room can be made for, once per new finding; exports the demand
/// series.
async fn tell_demand(ctx: &Ctx, dp: &DefragPolicy, c: &demand::Considered) {
    let name = dp.name_any();
    ctx.metrics.set_demand_waiting(&name, c.waiting as u64);
    for r in &c.new_records {
        ctx.metrics.demand_finished(&name, &r.result, 0, &[]);
        info!(policy = %name, pods = ?r.pods, result = %r.result, why = %r.message, "demand: no run");
        for key in &r.pods {
            let Some((ns, pod)) = key.split_once('/') else {
                continue;
            };
            let Some(p) = ctx
                .pods
                .get(&kube::runtime::reflector::ObjectRef::new(pod).within(ns))
            else {
                continue;
            };
            let msg = format!("gpu-defrag can make no room ({}): {}", r.result, r.message);
            ctx.event_on(
                &p.object_reference(),
                EventType::Normal,
                EventReason::NoRoom,
                msg,
            )
            .await;
        }
    }
}

/// Carries out the run decision; says what it did (empty: nothing new).
async fn act(
    ctx: &Arc<Ctx>,
    dp: &Arc<DefragPolicy>,
    policy: &Policy,
    decision: RunDecision,
) -> Result<String, Error> {
    let name = dp.name_any();
    Ok(match decision {
        RunDecision::Nothing => String::new(),
        RunDecision::Resume { record, end } => {
            info!(policy = %name, run = %record.id, "resuming run after restart");
            let note = format!("resumed run {}", record.id);
            executor::start(
                ctx.clone(),
                dp.clone(),
                policy.clone(),
                end,
                executor::Start::Resume(record),
            )
            .await;
            note
        }
        RunDecision::Stop(why) => {
            info!(policy = %name, why = %why, "stopping the run");
            ctx.request_stop(&name, &why).await;
            format!("stopping the run: {why}")
        }
        RunDecision::Abandon(result, why) => {
            info!(policy = %name, result = result.as_str(), "ending a run no task owns");
            executor::abandon(ctx, dp, result, &why).await?;
            String::new()
        }
        RunDecision::Start(end) => {
            executor::start(
                ctx.clone(),
                dp.clone(),
                policy.clone(),
                end,
                executor::Start::Window,
            )
            .await;
            "run started".into()
        }
        RunDecision::RemoveStaleFences => {
            executor::remove_stale_fences(ctx, &name).await?;
            String::new()
        }
        RunDecision::Demand { start, end } => {
            executor::remove_stale_fences(ctx, &name).await?;
            info!(policy = %name, pods = ?start.run.pods, nodes = ?start.run.nodes, evictions = start.plan.plan.moves.len(), "demand run started");
            let note = format!("demand run started: {}", start.plan.why);
            executor::start(
                ctx.clone(),
                dp.clone(),
                policy.clone(),
                end,
                executor::Start::Demand(start),
            )
            .await;
            note
        }
    })
}

/// Server-side dry run of the first planned evictions, repeated only when the plan
/// changes or [`DRY_RUN_EVERY`] has passed.
async fn check(ctx: &Ctx, dp: &DefragPolicy, plan: &Plan) -> Option<DryRunCheck> {
    if plan.moves.is_empty() {
        return None;
    }
    let name = dp.name_any();
    let fp = decide::fingerprint(plan);
    // The lock is not held across the dry runs (API calls): a policy is reconciled by one
    // task at a time, so no two checks of one policy race.
    if let Some((f, at, c)) = ctx.dry_checks.lock().await.get(&name)
        && *f == fp
        && at.elapsed() < DRY_RUN_EVERY
    {
        return Some(c.clone());
    }
    let c = Evictor::of(ctx, dp).dry_run_check(plan).await;
    ctx.dry_checks
        .lock()
        .await
        .insert(name, (fp, Instant::now(), c.clone()));
    Some(c)
}

/// Writes the reconciler's part of the status when anything but timestamps changed.
async fn write_status(
    ctx: &Ctx,
    name: &str,
    old: &DefragPolicyStatus,
    st: &DefragPolicyStatus,
) -> Result<(), Error> {
    if !decide::status_changed(old, st) {
        return Ok(());
    }
    let mut body = serde_json::to_value(st)?;
    // The run records belong to the executor's field manager.
    if let Some(o) = body.as_object_mut() {
        o.remove("activeRun");
        o.remove("lastRuns");
    }
    patch_status(&ctx.client, name, RECONCILE_MANAGER, body).await
}

/// The policy's series: fragmentation, trigger, idle GPUs, plan, window, GPUs.
/// Exports a policy's series of one reconcile.
pub fn record_metrics(
    metrics: &Metrics,
    name: &str,
    policy: &Policy,
    obs: &Observed,
    idle: Option<&IdleView>,
    window_open: bool,
) {
    let r = &obs.report;
    metrics.set_report(
        name,
        &ReportNumbers {
            fragment_rate: r.fragment_rate,
            idle_milli: r.idle_milli,
            fragment_milli: r.fragment_milli,
            fully_free_gpus: r.fully_free_gpus,
            fully_free_nodes: r.fully_free_nodes,
            unknown_pods: r.unknown_pods,
            pending_unplaceable: r.pending_unplaceable,
        },
    );
    metrics.set_trigger(name, policy.min_fragment_rate);
    metrics.set_idle(
        name,
        idle.and_then(|v| v.numbers.as_ref())
            .map(|r| (r.pods, r.gpus, r.milli)),
    );
    metrics.set_plan(name, obs.plan.moves.len() as u64, &obs.plan.skipped);
    let mut mig: std::collections::BTreeMap<String, (u64, u64)> = Default::default();
    for m in &r.mig {
        let e = mig.entry(m.profile.clone()).or_default();
        e.0 += m.used;
        e.1 += m.free;
    }
    metrics.set_mig(name, &mig);
    metrics.set_window(name, window_open);
    metrics.set_gpus(&obs.cluster.nodes);
}
