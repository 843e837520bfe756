//! The executor: the one place that evicts.
//!
//! Protocol of a run (restart-safe; every step is recorded before it is taken):
//! 1. record the run in `status.activeRun` (with the nodes it will fence);
//! 2. fence: `gpu-defrag.io/draining=<policy>:NoSchedule` on nodes being emptied, and
//!    single GPUs being emptied on HAMi nodes in `hami.io/device-cordon` ([`fence`]);
//! 3. evict through the Eviction API only (never delete), at most `maxInFlight`
//!    replacements pending at once; 429 = blocked by a PodDisruptionBudget: skip, report;
//! 4. wait until each replacement is Ready and check where it landed (a landing on a
//!    fenced node or GPU is a bounce: reported, the workload is backed off for the run);
//! 5. stop at window end (no new evictions; moves in flight finish), on a stall
//!    (`rescheduleTimeout`), when pending GPU pods pile up, or on lost leadership;
//! 6. remove the fences; write the outcome to `lastRuns`, events and metrics.
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use gpu_defrag_api::DRAINING_TAINT;
use gpu_defrag_api::v1alpha1::{DefragPolicy, FencedDevice, RunRecord};
use gpu_defrag_core::fence;
use gpu_defrag_core::frag;
use gpu_defrag_core::ingest;
use gpu_defrag_core::plan;
use gpu_defrag_core::policy::Policy;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, EvictParams, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use serde_json::json;
use tracing::{info, warn};

use crate::controller::{
    Ctx, EXECUTOR_MANAGER, Error, RunHandle, history_of, patch_status, pod_ready, ts,
};
use crate::status::{self, MAX_LAST_RUNS};

/// How often waits poll the caches.
const POLL: Duration = Duration::from_millis(500);

/// Starts (or resumes) a run in its own task.
pub async fn start(
    ctx: Arc<Ctx>,
    dp: Arc<DefragPolicy>,
    policy: Policy,
    window_end: DateTime<Utc>,
    resume: Option<RunRecord>,
) {
    let name = dp.name_any();
    let c2 = ctx.clone();
    let task = tokio::spawn(async move {
        if let Err(e) = run(c2.clone(), dp.clone(), policy, window_end, resume).await {
            warn!(policy = %dp.name_any(), error = %e, "run failed; fences are removed by the next reconcile");
            c2.metrics.reconcile_error(&dp.name_any(), e.kind());
        }
    });
    ctx.runs.lock().await.insert(name, RunHandle { task });
}

/// Writes the executor's part of status: the active run (or none) and the last runs.
async fn write_runs(
    ctx: &Ctx,
    name: &str,
    active: Option<&RunRecord>,
    last: &[RunRecord],
) -> Result<(), Error> {
    let api: Api<DefragPolicy> = Api::all(ctx.client.clone());
    let mut st = json!({"lastRuns": status::finished_runs(last)});
    if let Some(a) = active {
        st["activeRun"] = serde_json::to_value(a)?;
    }
    patch_status(&api, name, EXECUTOR_MANAGER, st).await
}

/// A node's fences as an edit sees them: its taints and annotations.
struct NodeFences {
    taints: Vec<serde_json::Value>,
    annotations: BTreeMap<String, String>,
}

/// Rewrites a node's taints and annotations with `edit`, guarded by its resourceVersion
/// (retried on conflicts), so a concurrent change by another controller is never lost.
/// An edit that cannot be made (unreadable fence annotations) is an error, nothing is
/// written.
async fn edit_node(
    ctx: &Ctx,
    node: &str,
    edit: impl Fn(&mut NodeFences) -> Result<(), String>,
) -> Result<(), Error> {
    let api: Api<Node> = Api::all(ctx.client.clone());
    let mut last = None;
    for _ in 0..5 {
        let n = match api.get(node).await {
            Ok(n) => n,
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        let before = NodeFences {
            taints: n
                .spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .map(|t| {
                    t.iter()
                        .filter_map(|t| serde_json::to_value(t).ok())
                        .collect()
                })
                .unwrap_or_default(),
            annotations: n.metadata.annotations.clone().unwrap_or_default(),
        };
        let mut after = NodeFences {
            taints: before.taints.clone(),
            annotations: before.annotations.clone(),
        };
        edit(&mut after).map_err(|e| Error::Fence(format!("node {node}: {e}")))?;
        let mut patch = json!({"metadata": {"resourceVersion": n.metadata.resource_version}});
        if after.taints != before.taints {
            patch["spec"] = json!({"taints": after.taints});
        }
        let mut changed: serde_json::Map<String, serde_json::Value> = serde_json::Map::new();
        for (k, v) in &after.annotations {
            if before.annotations.get(k) != Some(v) {
                changed.insert(k.clone(), json!(v));
            }
        }
        for k in before.annotations.keys() {
            if !after.annotations.contains_key(k) {
                changed.insert(k.clone(), serde_json::Value::Null);
            }
        }
        if !changed.is_empty() {
            patch["metadata"]["annotations"] = serde_json::Value::Object(changed);
        } else if patch.get("spec").is_none() {
            return Ok(());
        }
        match api
            .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => last = Some(kube::Error::Api(s)),
            Err(e) => return Err(e.into()),
        }
    }
    Err(last
        .map(Error::from)
        .unwrap_or_else(|| Error::Fence(format!("node {node}: the update kept conflicting"))))
}

async fn set_taint(ctx: &Ctx, node: &str, policy: &str) -> Result<(), Error> {
    let want = crate::controller::draining_taint(policy);
    edit_node(ctx, node, |n| {
        n.taints
            .retain(|x| x.get("key").and_then(|k| k.as_str()) != Some(DRAINING_TAINT));
        n.taints.push(want.clone());
        Ok(())
    })
    .await
}

/// Removes this policy's fence from a node (fences of other policies stay).
async fn remove_taint(ctx: &Ctx, node: &str, policy: &str) -> Result<(), Error> {
    edit_node(ctx, node, |n| {
        n.taints.retain(|x| {
            !(x.get("key").and_then(|k| k.as_str()) == Some(DRAINING_TAINT)
                && x.get("value").and_then(|v| v.as_str()) == Some(policy))
        });
        Ok(())
    })
    .await
}

/// Applies annotation changes computed by [`fence`].
fn apply_changes(annotations: &mut BTreeMap<String, String>, changes: fence::Changes) {
    for (k, v) in changes {
        match v {
            Some(v) => annotations.insert(k, v),
            None => annotations.remove(&k),
        };
    }
}

/// Fences single GPUs of a node for this policy (`hami.io/device-cordon`, see [`fence`]).
async fn cordon_devices(ctx: &Ctx, node: &str, gpus: &[String], policy: &str) -> Result<(), Error> {
    edit_node(ctx, node, |n| {
        let changes = fence::cordon(&n.annotations, policy, gpus)?;
        apply_changes(&mut n.annotations, changes);
        Ok(())
    })
    .await
}

/// Takes back every single-GPU fence this policy set on a node (fences of
/// administrators and other policies stay).
async fn uncordon_devices(ctx: &Ctx, node: &str, policy: &str) -> Result<(), Error> {
    edit_node(ctx, node, |n| {
        let changes = fence::uncordon(&n.annotations, policy)?;
        apply_changes(&mut n.annotations, changes);
        Ok(())
    })
    .await
}

/// The single GPUs of a run's record, by node.
fn devices_by_node(devices: &[FencedDevice]) -> BTreeMap<String, Vec<String>> {
    let mut by: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for d in devices {
        by.entry(d.node.clone()).or_default().push(d.gpu.clone());
    }
    by
}

/// Removes every fence this policy left on any node (from the node cache): its draining
/// taints and its single-GPU fences.
pub async fn remove_stale_fences(ctx: &Ctx, policy: &str) -> Result<(), Error> {
    let nodes = ctx.nodes.state();
    let tainted = nodes.iter().filter(|n| {
        n.spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|ts| {
                ts.iter()
                    .any(|t| t.key == DRAINING_TAINT && t.value.as_deref() == Some(policy))
            })
    });
    for n in tainted {
        info!(policy, node = %n.name_any(), "removing a fence no run owns");
        remove_taint(ctx, &n.name_any(), policy).await?;
    }
    let cordoned = nodes.iter().filter(|n| {
        n.metadata
            .annotations
            .as_ref()
            .is_some_and(|a| !fence::claimed_by(a, policy).is_empty())
    });
    for n in cordoned {
        info!(policy, node = %n.name_any(), "removing single-GPU fences no run owns");
        uncordon_devices(ctx, &n.name_any(), policy).await?;
    }
    Ok(())
}

/// Ends a recorded run that no task owns (after a restart outside its window, or an
/// invalid policy): fences removed, record moved to `lastRuns`.
pub async fn abandon(
    ctx: &Ctx,
    dp: &DefragPolicy,
    result: &str,
    message: &str,
) -> Result<(), Error> {
    let name = dp.name_any();
    let old = dp.status.clone().unwrap_or_default();
    let Some(mut rec) = old.active_run.clone() else {
        return Ok(());
    };
    for n in &rec.fenced_nodes {
        remove_taint(ctx, n, &name).await?;
    }
    for n in devices_by_node(&rec.fenced_devices).keys() {
        uncordon_devices(ctx, n, &name).await?;
    }
    remove_stale_fences(ctx, &name).await?;
    rec.result = result.into();
    rec.message = message.into();
    rec.finished_at = Some(ts(Utc::now()));
    let mut last = vec![rec.clone()];
    last.extend(
        old.last_runs
            .into_iter()
            .filter(|r| r.id != rec.id)
            .take(MAX_LAST_RUNS - 1),
    );
    write_runs(ctx, &name, None, &last).await?;
    ctx.metrics.run_finished(&name, result, 0.0);
    ctx.event(
        dp,
        EventType::Warning,
        "RunAbandoned",
        format!("run {}: {message}", rec.id),
        None,
    )
    .await;
    Ok(())
}

/// An eviction whose replacement we wait for.
struct Wait {
    pod: String,
    owner: (String, String),
    namespace: String,
    evicted_uid: String,
    known: HashSet<String>,
    since: tokio::time::Instant,
}

fn owner_of(p: &Pod) -> Option<(String, String)> {
    p.metadata
        .owner_references
        .as_ref()?
        .iter()
        .find(|o| o.controller == Some(true))
        .map(|o| (o.kind.clone(), o.name.clone()))
}

fn pods_of_owner(ctx: &Ctx, ns: &str, owner: &(String, String)) -> Vec<Arc<Pod>> {
    ctx.pods
        .state()
        .into_iter()
        .filter(|p| p.namespace().as_deref() == Some(ns) && owner_of(p).as_ref() == Some(owner))
        .collect()
}

fn pending_gpu_pods(ctx: &Ctx, policy: &Policy) -> usize {
    let pods = ctx.pods.state();
    let objs = ingest::ObjectRefs {
        pods: pods.iter().map(|p| p.as_ref()).collect(),
        ..Default::default()
    };
    let c = ingest::build_cluster_from(objs, None);
    c.pods
        .iter()
        .filter(|p| {
            p.is_pending() && p.shape.is_some_and(|s| s.gpus > 0) && policy.scope.covers_pod(p)
        })
        .count()
}

enum Stop {
    WindowClosed,
    Stalled(String),
    PendingPileUp(usize),
    LostLeadership,
}

/// The run itself.
async fn run(
    ctx: Arc<Ctx>,
    dp: Arc<DefragPolicy>,
    policy: Policy,
    window_end: DateTime<Utc>,
    resume: Option<RunRecord>,
) -> Result<(), Error> {
    let name = dp.name_any();
    let started = tokio::time::Instant::now();
    let timeout = policy.reschedule_timeout.max(Duration::from_secs(5));
    let old = dp.status.clone().unwrap_or_default();
    let last_runs: Vec<RunRecord> = old.last_runs.clone();

    // Plan on fresh caches, with what the run already did (resume).
    let now = Utc::now();
    let cluster = ctx.cluster(Some(now));
    let before = frag::report(&cluster, &policy);
    let history = history_of(resume.as_ref());
    // The same ranking as the plan in status: long-idle pods are cheaper to move.
    let measured = ctx.idle_measured();
    let no_activity = gpu_defrag_core::model::Activity::default();
    let activity = measured.as_ref().map_or(&no_activity, |m| &m.activity);
    let mut plan = plan::plan_with_activity(&cluster, &policy, Some(now), &history, activity);
    let mut rec = resume.clone().unwrap_or_else(|| RunRecord {
        id: format!("{}-{}", name, now.format("%Y%m%dt%H%M%S")),
        started_at: ts(now),
        window_end: ts(window_end),
        result: "Running".into(),
        planned: plan.moves.len() as i64,
        fragment_rate_before: before.fragment_rate,
        fully_free_gpus_before: before.fully_free_gpus as i64,
        ..Default::default()
    });
    // The record lists every pod the run evicts: a plan too large for it is cut to the
    // whole units that fit, and the run says so (the rest waits for the next window).
    let fit = status::batches_within_record(&rec, &plan);
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
            "PlanCut",
            format!("run {}: {why}", rec.id),
            None,
        )
        .await;
    }
    let fenced: BTreeSet<String> = rec
        .fenced_nodes
        .iter()
        .cloned()
        .chain(plan.fenced_nodes.iter().cloned())
        .collect();
    rec.fenced_nodes = fenced.iter().cloned().collect();
    let fenced_devices: BTreeSet<(String, String)> = rec
        .fenced_devices
        .iter()
        .map(|d| (d.node.clone(), d.gpu.clone()))
        .chain(
            plan.fenced_devices
                .iter()
                .map(|d| (d.node.clone(), d.gpu.clone())),
        )
        .collect();
    rec.fenced_devices = fenced_devices
        .iter()
        .map(|(node, gpu)| FencedDevice {
            node: node.clone(),
            gpu: gpu.clone(),
        })
        .collect();
    // 1. Record first, so a restart can resume or clean up.
    write_runs(&ctx, &name, Some(&rec), &last_runs).await?;
    if resume.is_none() {
        ctx.event(
            &dp,
            EventType::Normal,
            "RunStarted",
            format!(
                "run {}: {} evictions planned, fragment rate {:.3}, window ends {}",
                rec.id, rec.planned, before.fragment_rate, rec.window_end
            ),
            None,
        )
        .await;
    }
    // 2. Fence.
    for n in &fenced {
        set_taint(&ctx, n, &name).await?;
    }
    for (n, gpus) in devices_by_node(&rec.fenced_devices) {
        cordon_devices(&ctx, &n, &gpus, &name).await?;
    }
    // 3–5. Evict, pace, wait.
    let evict_api = |ns: &str| Api::<Pod>::namespaced(ctx.client.clone(), ns);
    let mut waits: Vec<Wait> = Vec::new();
    let mut backed_off: HashSet<(String, String)> = HashSet::new();
    let mut stop: Option<Stop> = None;
    let in_flight_max = policy.max_in_flight.max(1) as usize;
    'moves: for m in &plan.moves {
        // A workload loses at most `maxUnavailablePerWorkload` replicas at once: its next
        // eviction waits until the replacement of its previous one is Ready.
        let workload = cluster
            .pods
            .get(m.pod_index)
            .and_then(|p| p.owner.as_ref())
            .map(|o| (o.kind.clone(), o.name.clone()));
        let per_workload = policy.max_unavailable_per_workload.max(1) as usize;
        // Wait for room.
        loop {
            settle(
                &ctx,
                &name,
                &mut waits,
                (&fenced, &fenced_devices),
                &mut rec,
                &mut backed_off,
                timeout,
            )
            .map_err(|s| stop = Some(s))
            .ok();
            if stop.is_some() {
                break 'moves;
            }
            let same_workload = waits
                .iter()
                .filter(|w| Some(&w.owner) == workload.as_ref())
                .count();
            if waits.len() < in_flight_max && same_workload < per_workload {
                break;
            }
            tokio::time::sleep(POLL).await;
        }
        if !ctx.leader.is_leader() {
            stop = Some(Stop::LostLeadership);
            break;
        }
        if Utc::now() >= window_end {
            stop = Some(Stop::WindowClosed);
            break;
        }
        let pending = pending_gpu_pods(&ctx, &policy);
        if pending > policy.max_pending_gpu_pods as usize + waits.len() {
            stop = Some(Stop::PendingPileUp(pending));
            break;
        }
        let Some((ns, pod_name)) = m.pod.split_once('/') else {
            continue;
        };
        // Re-validate against the cache: the pod must still be where the plan saw it.
        let Some(current) = ctx
            .pods
            .state()
            .into_iter()
            .find(|p| p.namespace().as_deref() == Some(ns) && p.name_any() == pod_name)
        else {
            continue;
        };
        if current.spec.as_ref().and_then(|s| s.node_name.as_deref()) != Some(m.from_node.as_str())
            || current.metadata.deletion_timestamp.is_some()
        {
            continue;
        }
        let Some(owner) = owner_of(&current) else {
            continue;
        };
        if backed_off.contains(&owner) {
            continue;
        }
        let known: HashSet<String> = pods_of_owner(&ctx, ns, &owner)
            .iter()
            .filter_map(|p| p.metadata.uid.clone())
            .collect();
        // Record the eviction before asking for it: a crash in between then counts one
        // eviction too many against the limits, never one too few.
        let undo = rec.clone();
        rec.evicted += 1;
        rec.evicted_pods.push(m.pod.clone());
        *rec.evicted_per_node.entry(m.from_node.clone()).or_default() += 1;
        write_runs(&ctx, &name, Some(&rec), &last_runs).await?;
        let outcome = evict_api(ns).evict(pod_name, &EvictParams::default()).await;
        // Only an answer from the API server says the eviction did not happen. Without one
        // (the connection broke, the server went away) it may have: the record keeps it,
        // so the limits count it and a resumed run never evicts the pod again.
        if matches!(outcome, Err(kube::Error::Api(_))) {
            rec = undo;
        }
        match outcome {
            Ok(_) => {
                ctx.metrics.eviction(&name, "done");
                let note = format!(
                    "evicted {} from {} ({}); expected to land on {}",
                    m.pod, m.from_node, m.reason, m.to_node
                );
                ctx.event(
                    &dp,
                    EventType::Normal,
                    "Evicted",
                    note,
                    Some(current.object_ref(&())),
                )
                .await;
                waits.push(Wait {
                    pod: m.pod.clone(),
                    owner,
                    namespace: ns.to_string(),
                    evicted_uid: current.metadata.uid.clone().unwrap_or_default(),
                    known,
                    since: tokio::time::Instant::now(),
                });
            }
            Err(kube::Error::Api(s)) if s.code == 429 => {
                rec.blocked += 1;
                ctx.metrics.eviction(&name, "blocked");
                write_runs(&ctx, &name, Some(&rec), &last_runs).await?;
                ctx.event(
                    &dp,
                    EventType::Warning,
                    "EvictionBlocked",
                    format!("{}: {}", m.pod, s.message),
                    Some(current.object_ref(&())),
                )
                .await;
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {
                write_runs(&ctx, &name, Some(&rec), &last_runs).await?;
            }
            Err(e) => {
                rec.failed += 1;
                ctx.metrics.eviction(&name, "failed");
                write_runs(&ctx, &name, Some(&rec), &last_runs).await?;
                ctx.event(
                    &dp,
                    EventType::Warning,
                    "EvictionFailed",
                    format!("{}: {e}", m.pod),
                    Some(current.object_ref(&())),
                )
                .await;
            }
        }
    }
    if matches!(stop, Some(Stop::LostLeadership)) {
        // The new leader resumes from the recorded run; it owns the fences now.
        info!(policy = %name, "lost leadership; leaving the run to the new leader");
        return Ok(());
    }
    // Moves in flight finish, even after the window closed.
    while !waits.is_empty() {
        if let Err(s) = settle(
            &ctx,
            &name,
            &mut waits,
            (&fenced, &fenced_devices),
            &mut rec,
            &mut backed_off,
            timeout,
        ) {
            stop.get_or_insert(s);
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    // 6. Unfence, record.
    for n in &fenced {
        remove_taint(&ctx, n, &name).await?;
    }
    for n in devices_by_node(&rec.fenced_devices).keys() {
        uncordon_devices(&ctx, n, &name).await?;
    }
    let after_cluster = ctx.cluster(Some(Utc::now()));
    let after = frag::report(&after_cluster, &policy);
    rec.fragment_rate_after = Some(after.fragment_rate);
    rec.fully_free_gpus_after = Some(after.fully_free_gpus as i64);
    rec.finished_at = Some(ts(Utc::now()));
    let (result, msg) = match &stop {
        Some(Stop::WindowClosed) => (
            "WindowClosed",
            "the window closed; moves in flight were finished".to_string(),
        ),
        Some(Stop::Stalled(m)) => ("Stalled", m.clone()),
        Some(Stop::PendingPileUp(n)) => (
            "Stopped",
            format!("{n} GPU pods pending (more than safety.maxPendingGpuPods)"),
        ),
        Some(Stop::LostLeadership) => ("Aborted", "lost leadership".to_string()),
        None if rec.blocked + rec.failed + rec.bounced > 0 => (
            "Partial",
            "some moves were blocked, failed or bounced".to_string(),
        ),
        None => ("Succeeded", "every planned move done".to_string()),
    };
    rec.result = result.into();
    let msg = match &cut {
        Some(why) => format!("{msg}; {why}"),
        None => msg,
    };
    rec.message = format!(
        "{msg}; evicted {}, blocked {}, bounced {}, failed {}; fragment rate {:.3} → {:.3}, fully free GPUs {} → {}",
        rec.evicted,
        rec.blocked,
        rec.bounced,
        rec.failed,
        rec.fragment_rate_before,
        after.fragment_rate,
        rec.fully_free_gpus_before,
        after.fully_free_gpus
    );
    let mut last = vec![rec.clone()];
    last.extend(
        last_runs
            .into_iter()
            .filter(|r| r.id != rec.id)
            .take(MAX_LAST_RUNS - 1),
    );
    write_runs(&ctx, &name, None, &last).await?;
    ctx.metrics
        .run_finished(&name, result, started.elapsed().as_secs_f64());
    let type_ = if result == "Succeeded" {
        EventType::Normal
    } else {
        EventType::Warning
    };
    ctx.event(
        &dp,
        type_,
        "RunFinished",
        format!("run {}: {}", rec.id, status::truncate(&rec.message, 900)),
        None,
    )
    .await;
    info!(policy = %name, run = %rec.id, result, "run finished");
    Ok(())
}

/// Checks the waits: a Ready replacement ends a wait (bounce if it landed on a fence);
/// a wait older than the timeout stalls the run.
fn settle(
    ctx: &Ctx,
    policy: &str,
    waits: &mut Vec<Wait>,
    (fenced, fenced_devices): (&BTreeSet<String>, &BTreeSet<(String, String)>),
    rec: &mut RunRecord,
    backed_off: &mut HashSet<(String, String)>,
    timeout: Duration,
) -> Result<(), Stop> {
    let mut stalled = None;
    waits.retain(|w| {
        let pods = pods_of_owner(ctx, &w.namespace, &w.owner);
        let replacement = pods.iter().find(|p| {
            let uid = p.metadata.uid.clone().unwrap_or_default();
            uid != w.evicted_uid
                && !w.known.contains(&uid)
                && pod_ready(p)
                && p.metadata.deletion_timestamp.is_none()
        });
        if let Some(r) = replacement {
            let node = r
                .spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .unwrap_or_default();
            let on_fenced_gpu = hami_devices(r)
                .into_iter()
                .find(|g| fenced_devices.contains(&(node.clone(), g.clone())));
            if fenced.contains(&node) || on_fenced_gpu.is_some() {
                rec.bounced += 1;
                ctx.metrics.eviction(policy, "bounced");
                backed_off.insert(w.owner.clone());
                match on_fenced_gpu {
                    Some(gpu) => warn!(pod = %w.pod, node = %node, gpu = %gpu, "replacement landed on a fenced GPU (does the scheduler read hami.io/device-cordon?)"),
                    None => warn!(pod = %w.pod, node = %node, "replacement landed on a fenced node"),
                }
            }
            return false;
        }
        if w.since.elapsed() > timeout {
            stalled = Some(format!(
                "the replacement of {} was not Ready within {}s",
                w.pod,
                timeout.as_secs()
            ));
            return false;
        }
        true
    });
    match stalled {
        Some(m) => Err(Stop::Stalled(m)),
        None => Ok(()),
    }
}

/// The GPUs a pod's HAMi record names (none when it has no readable record).
fn hami_devices(pod: &Pod) -> Vec<String> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ingest::HAMI_POD_ALLOCATED))
        .and_then(|v| gpu_defrag_core::formats::parse_hami_pod_devices(v).ok())
        .map(|c| c.into_iter().flatten().map(|d| d.uuid).collect())
        .unwrap_or_default()
}
