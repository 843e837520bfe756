//! The shared state of the operator ([`Ctx`]): the client, the caches, the runs in
//! progress, metrics, leadership and events; the error of a reconcile or run step; the
//! status writer; and [`Ctx::observe`], the one place that turns the caches into the cluster
//! model and a plan (for the controller and the executor alike).
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use gpu_defrag_api::FIELD_MANAGER;
use gpu_defrag_api::v1alpha1::{DefragPolicy, DryRunCheck, RunRecord};
use gpu_defrag_core::frag::{self, Report};
use gpu_defrag_core::ingest;
use gpu_defrag_core::model::{Activity, Cluster};
use gpu_defrag_core::plan::{self, History, Plan};
use gpu_defrag_core::policy::Policy;
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::Store;
use kube::{Client, Resource};
use serde_json::json;
use tokio::sync::Mutex;
use tracing::warn;

use crate::dra::DraObjects;
use crate::idle::{IdleSource, IdleState, Measured};
use crate::koord::Devices;
use crate::landing::Landing;
use crate::lease::LeaderState;
use crate::metrics::Metrics;
use crate::objects::CachedPod;
use crate::owners::Owners;
use crate::status;

/// Field manager for the parts of status the reconciler owns.
pub const RECONCILE_MANAGER: &str = FIELD_MANAGER;
/// Field manager for the run records the executor owns.
pub const EXECUTOR_MANAGER: &str = "gpu-defrag-executor";
/// How long a status write may take before it counts as failed.
pub const STATUS_WRITE_TIMEOUT: Duration = Duration::from_secs(20);

/// Errors of a reconcile or a run step.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API server refused or failed a request.
    #[error("kubernetes API: {}", crate::apiclient::error_line(.0))]
    Kube(#[from] kube::Error),
    /// Status could not be serialised.
    #[error("serialising status: {0}")]
    Json(#[from] serde_json::Error),
    /// A node's fences could not be changed.
    #[error("fencing: {0}")]
    Fence(#[from] FenceError),
    /// The policy's finalizer could not be handled (the object has no name, or the
    /// finalizer patch cannot be built).
    #[error("finalizer: {0}")]
    Finalizer(Box<kube::runtime::finalizer::Error<Error>>),
}

impl From<kube::runtime::finalizer::Error<Error>> for Error {
    /// The error of the reconcile or clean-up itself, or of the finalizer patch.
    fn from(e: kube::runtime::finalizer::Error<Error>) -> Self {
        use kube::runtime::finalizer::Error as F;
        match e {
            F::ApplyFailed(e) | F::CleanupFailed(e) => e,
            F::AddFinalizer(e) | F::RemoveFinalizer(e) => Error::Kube(e),
            other => Error::Finalizer(Box::new(other)),
        }
    }
}

/// Why a node's fences could not be changed.
#[derive(Debug, thiserror::Error)]
pub enum FenceError {
    /// The node's fence annotations cannot be read, so no edit is safe.
    #[error("node {node}: {problem}")]
    Unreadable {
        /// The node.
        node: String,
        /// What is wrong with its annotations.
        problem: String,
    },
    /// Every attempt met a newer version of the node.
    #[error("node {node}: the update kept conflicting")]
    KeptConflicting {
        /// The node.
        node: String,
    },
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
            Error::Finalizer(_) => "Finalizer",
        }
    }
}

/// The reasons of the events the operator publishes on a policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventReason {
    /// The spec cannot be used.
    InvalidSpec,
    /// A window cannot be used.
    InvalidWindow,
    /// An API-server outage ended.
    ApiServerUnavailable,
    /// The policy covers no node with GPUs.
    NoGpuNodes,
    /// A run started.
    RunStarted,
    /// A run's plan was cut to fit its record.
    PlanCut,
    /// A pod was evicted.
    Evicted,
    /// An eviction was refused with 429 (a PodDisruptionBudget).
    EvictionBlocked,
    /// An eviction failed otherwise.
    EvictionFailed,
    /// A planned eviction was not sent (no longer safe, or its unit could not be drained).
    EvictionSkipped,
    /// A run finished.
    RunFinished,
    /// A run no task owned was ended.
    RunAbandoned,
    /// A run did every move but realised less than half of the forecast drop.
    BenefitNotRealized,
    /// A demand run is making room for a pending pod (on the pod).
    MakingRoom,
    /// A demand run's pod did not bind on its room, or no room can be made (on the pod).
    NoRoom,
}

impl EventReason {
    /// The reason as the event carries it.
    pub fn as_str(self) -> &'static str {
        match self {
            EventReason::InvalidSpec => "InvalidSpec",
            EventReason::InvalidWindow => "InvalidWindow",
            EventReason::ApiServerUnavailable => "ApiServerUnavailable",
            EventReason::NoGpuNodes => "NoGpuNodes",
            EventReason::RunStarted => "RunStarted",
            EventReason::PlanCut => "PlanCut",
            EventReason::Evicted => "Evicted",
            EventReason::EvictionBlocked => "EvictionBlocked",
            EventReason::EvictionFailed => "EvictionFailed",
            EventReason::EvictionSkipped => "EvictionSkipped",
            EventReason::RunFinished => "RunFinished",
            EventReason::RunAbandoned => "RunAbandoned",
            EventReason::BenefitNotRealized => "BenefitNotRealized",
            EventReason::MakingRoom => "MakingRoom",
            EventReason::NoRoom => "NoRoom",
        }
    }
}

/// Publishes events on policies through one shared recorder (kube-runtime's recorder
/// merges repeats of an event into a count, which only works if it is shared).
#[derive(Clone)]
pub struct Events {
    recorder: Recorder,
}

impl Events {
    /// Events published by `recorder`.
    pub fn new(recorder: Recorder) -> Self {
        Events { recorder }
    }

    /// Publishes an event on a policy (errors are logged, never fatal).
    pub async fn publish(
        &self,
        policy: &ObjectReference,
        type_: EventType,
        reason: EventReason,
        note: String,
        secondary: Option<ObjectReference>,
    ) -> bool {
        let ev = Event {
            type_,
            reason: reason.as_str().into(),
            note: Some(status::truncate(&note, 1000)),
            action: reason.as_str().into(),
            secondary,
        };
        match self.recorder.publish(&ev, policy).await {
            Ok(()) => true,
            Err(e) => {
                warn!(error = %crate::apiclient::error_line(&e), reason = reason.as_str(), "could not publish event");
                false
            }
        }
    }
}

/// A run in progress, owned by a tokio task.
pub struct RunHandle {
    /// The task.
    pub task: tokio::task::JoinHandle<()>,
    /// Asks the run to stop before its next eviction.
    pub stop: StopRequest,
}

/// A request to stop a run, shared by the controller and the run's task (a watch
/// channel): the run checks it before every eviction, and a run that waits is woken by
/// it at once; the first reason given wins.
#[derive(Clone, Debug)]
pub struct StopRequest(Arc<tokio::sync::watch::Sender<Option<String>>>);

impl Default for StopRequest {
    fn default() -> Self {
        StopRequest(Arc::new(tokio::sync::watch::Sender::new(None)))
    }
}

impl StopRequest {
    /// Asks the run to stop, saying why (a later request keeps the first reason).
    pub fn request(&self, why: &str) {
        self.0.send_if_modified(|r| {
            let first = r.is_none();
            if first {
                *r = Some(why.to_string());
            }
            first
        });
    }

    /// Why the run was asked to stop, if it was.
    pub fn requested(&self) -> Option<String> {
        self.0.borrow().clone()
    }

    /// Returns once a stop is requested (at once if it was already).
    pub async fn wait(&self) {
        let mut rx = self.0.subscribe();
        let _ = rx.wait_for(Option::is_some).await;
    }
}

/// Shared state of the controller and the executor.
pub struct Ctx {
    /// Client.
    pub client: Client,
    /// Nodes (reflector).
    pub nodes: Store<Node>,
    /// Pods (reflector of their projections to what the model and the executor read).
    pub pods: Store<CachedPod>,
    /// PDBs (reflector).
    pub pdbs: Store<PodDisruptionBudget>,
    /// Policies (the controller's own store).
    pub policies: Store<DefragPolicy>,
    /// Metrics.
    pub metrics: Metrics,
    /// Leadership.
    pub leader: LeaderState,
    /// Events.
    pub events: Events,
    /// Runs in progress, by policy name.
    pub runs: Mutex<HashMap<String, RunHandle>>,
    /// Set once the node, pod and PDB caches hold a full list.
    pub caches_ready: Arc<std::sync::atomic::AtomicBool>,
    /// Failed reconciles in a row, per policy (the retry backoff).
    pub failures: std::sync::Mutex<HashMap<String, u32>>,
    /// Koordinator `Device` objects (watched where the CRD is served).
    pub devices: Devices,
    /// The pods' owner objects, namespaces and pod groups.
    pub owners: Owners,
    /// DRA ResourceSlices, ResourceClaims, DeviceClasses and DeviceTaintRules (watched where
    /// served).
    pub dra: DraObjects,
    /// Last dry-run check per policy: plan fingerprint, when, result.
    pub dry_checks: Mutex<HashMap<String, (u64, Instant, DryRunCheck)>>,
    /// GPU activity from Prometheus (`--prometheus-url`), if configured.
    pub idle: Option<IdleSource>,
    /// Landing control: the replacements expected, held and nominated.
    pub landing: Arc<Landing>,
}

/// What the caches say at one instant, measured and planned for one policy.
pub struct Observed {
    /// The instant.
    pub now: DateTime<Utc>,
    /// The cluster model.
    pub cluster: Cluster,
    /// Its fragmentation under the policy.
    pub report: Report,
    /// The plan, given what the active run already did.
    pub plan: Plan,
}

impl Observed {
    /// The fragmentation and plan of a cluster model under `policy`, with what `run`
    /// already did and the GPU `activity` (what [`Ctx::observe`] computes once the model
    /// is built; `examples/reconcile_cost.rs` measures it at scale).
    pub fn of(
        cluster: Cluster,
        policy: &Policy,
        run: Option<&RunRecord>,
        now: DateTime<Utc>,
        activity: &Activity,
    ) -> Observed {
        let report = frag::report(&cluster, policy);
        let history = history_of(run);
        let plan = plan::plan_with_activity(&cluster, policy, Some(now), &history, activity);
        Observed {
            now,
            cluster,
            report,
            plan,
        }
    }
}

impl Ctx {
    /// The cluster model of the stores' current objects, built without copying them.
    pub fn cluster(&self, now: Option<DateTime<Utc>>) -> Cluster {
        self.cluster_without(now, &HashSet::new())
    }

    /// [`Ctx::cluster`] without the pods whose UID is in `skip`.
    pub fn cluster_without(&self, now: Option<DateTime<Utc>>, skip: &HashSet<String>) -> Cluster {
        let (nodes, pods, pdbs) = (self.nodes.state(), self.pods.state(), self.pdbs.state());
        let devices = self.devices.objects();
        let owners = self.owners.snapshot();
        let dra = self.dra.snapshot();
        ingest::build_cluster_from(
            ingest::ObjectRefs {
                nodes: nodes.iter().map(|n| n.as_ref()).collect(),
                pods: pods
                    .iter()
                    .filter(|p| !skip.contains(&p.uid))
                    .map(|p| &p.0)
                    .collect(),
                pdbs: pdbs.iter().map(|p| p.as_ref()).collect(),
                devices: &devices,
                controllers: owners.controllers(),
                namespaces: owners.namespaces(),
                pod_groups: &owners.pod_groups,
                resource_slices: dra.slices.iter().map(|s| s.as_ref()).collect(),
                resource_claims: dra.claims.iter().map(|c| c.as_ref()).collect(),
                device_classes: dra.classes.iter().map(|c| c.as_ref()).collect(),
                device_taint_rules: dra.rules.iter().map(|r| r.as_ref()).collect(),
                listed: gpu_defrag_core::workload::Listed {
                    device_taint_rules: dra.rules_listed,
                    ..owners.listed
                },
            },
            now,
        )
    }

    /// The cluster at `now`, its fragmentation and the plan, with what `run` already did
    /// (limits hold across restarts) and the same ranking everywhere: long-idle pods are
    /// cheaper to move when Prometheus gave an answer.
    pub fn observe(
        &self,
        policy: &Policy,
        run: Option<&RunRecord>,
        now: DateTime<Utc>,
    ) -> Observed {
        let cluster = self.cluster(Some(now));
        let measured = self.idle_measured();
        let no_activity = Activity::default();
        let activity = measured.as_ref().map_or(&no_activity, |m| &m.activity);
        Observed::of(cluster, policy, run, now, activity)
    }

    /// The last good GPU activity answer, if `--prometheus-url` is set and Prometheus gave
    /// one at the last refresh (the planner ranks long-idle pods as cheaper to move).
    pub fn idle_measured(&self) -> Option<Arc<Measured>> {
        match self.idle.as_ref()?.state() {
            IdleState::Ready(m) => Some(m),
            _ => None,
        }
    }

    /// Publishes an event on a policy (errors are logged, never fatal).
    pub async fn event(
        &self,
        policy: &DefragPolicy,
        type_: EventType,
        reason: EventReason,
        note: String,
        secondary: Option<ObjectReference>,
    ) -> bool {
        self.events
            .publish(&policy.object_ref(&()), type_, reason, note, secondary)
            .await
    }

    /// Publishes an event on another object (a pending pod a demand run serves).
    pub async fn event_on(
        &self,
        object: &ObjectReference,
        type_: EventType,
        reason: EventReason,
        note: String,
    ) -> bool {
        self.events.publish(object, type_, reason, note, None).await
    }

    /// Stops a run task (it leaves its record; the caller decides what to do with it).
    pub async fn stop_run(&self, name: &str) {
        if let Some(h) = self.runs.lock().await.remove(name) {
            h.task.abort();
        }
    }

    /// Asks the policy's run to stop before its next eviction; false when no run is alive.
    pub async fn request_stop(&self, name: &str, why: &str) -> bool {
        if !self.run_alive(name).await {
            return false;
        }
        if let Some(h) = self.runs.lock().await.get(name) {
            h.stop.request(why);
        }
        true
    }

    /// Waits until the policy's run task has ended, at most `timeout`; true if it did.
    pub async fn wait_run_end(&self, name: &str, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        while self.run_alive(name).await {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        true
    }

    /// Whether a run task of this policy is alive (a finished one is forgotten).
    pub async fn run_alive(&self, name: &str) -> bool {
        let mut runs = self.runs.lock().await;
        if let Some(h) = runs.get(name)
            && h.task.is_finished()
        {
            runs.remove(name);
        }
        runs.contains_key(name)
    }
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

/// Server-side apply of part of the status, as `manager`.
pub async fn patch_status(
    client: &Client,
    name: &str,
    manager: &str,
    status: serde_json::Value,
) -> Result<(), Error> {
    let api: Api<DefragPolicy> = Api::all(client.clone());
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
        STATUS_WRITE_TIMEOUT,
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

#[cfg(test)]
mod tests {
    use super::*;

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
    fn error_kinds_are_low_cardinality_labels() {
        let fence = Error::from(FenceError::KeptConflicting { node: "n".into() });
        assert_eq!(fence.kind(), "Fence");
        assert_eq!(
            fence.to_string(),
            "fencing: node n: the update kept conflicting"
        );
        let json = Error::from(serde_json::from_str::<u8>("x").unwrap_err());
        assert_eq!(json.kind(), "Serialise");
    }
}
