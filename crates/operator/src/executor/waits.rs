//! Waiting for replacements: after an eviction the run waits until a new pod of the same
//! workload is Ready and checks where it landed (a landing on a fence is a bounce); the
//! run's state machine ([`gpu_defrag_core::run`]) stalls when that takes longer than
//! `rescheduleTimeout`.
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use gpu_defrag_api::v1alpha1::{InFlightEviction, RunRecord};
use gpu_defrag_core::compact::CompactPod;
use gpu_defrag_core::ingest;
use gpu_defrag_core::policy::Policy;
use kube::runtime::reflector::Store;
use tracing::warn;

use gpu_defrag_core::run::{Ended, InFlight};

use super::fences::Fences;
use super::outcome;
use crate::dra::DraSnapshot;
use crate::metrics::{Eviction, Landed, Metrics};
use crate::objects::CachedPod;

/// How often waits poll the caches.
pub const POLL: Duration = Duration::from_millis(500);

/// A workload: `(kind, name)` of a pod's controller, in a namespace.
pub type Workload = (String, String);

/// What the run keeps to recognise the replacement of an evicted pod (the run's state
/// machine keeps the rest: [`InFlight`]).
#[derive(Clone, Debug)]
pub struct Wait {
    /// Its workload.
    pub owner: Workload,
    /// Its namespace.
    pub namespace: String,
    /// Its UID.
    pub evicted_uid: String,
    /// UIDs of the workload's pods when it was evicted (none of them is the replacement).
    pub known: HashSet<String>,
    /// The node its move planned for the replacement (empty: none known).
    pub to_node: String,
}

/// The key of a workload in the run's state machine (`namespace/kind/name`).
pub fn workload_key(namespace: &str, owner: &Workload) -> String {
    format!("{namespace}/{}/{}", owner.0, owner.1)
}

impl Wait {
    /// The UIDs of a workload's pods now: taken before its pod is evicted, so that none of
    /// them is mistaken for the replacement.
    pub fn known(pods: &Store<CachedPod>, pod: &CompactPod, owner: &Workload) -> HashSet<String> {
        pods_of_owner(pods, &pod.namespace, owner)
            .iter()
            .map(|p| p.uid.clone())
            .filter(|u| !u.is_empty())
            .collect()
    }

    /// A wait for the replacement of `pod` (of `owner`), planned to land on `to_node`;
    /// `known` as [`Wait::known`] gave before the eviction.
    pub fn new(pod: &CompactPod, owner: Workload, known: HashSet<String>, to_node: &str) -> Self {
        Wait {
            owner,
            namespace: pod.namespace.clone(),
            evicted_uid: pod.uid.clone(),
            known,
            to_node: to_node.to_string(),
        }
    }

    /// A wait taken over from the record of an earlier process, from `now` (None:
    /// unreadable entry).
    pub fn resumed(f: &InFlightEviction, now: DateTime<Utc>) -> Option<InFlight<Self>> {
        let (namespace, _) = f.pod.split_once('/')?;
        let (kind, name) = f.owner.split_once('/')?;
        let owner = (kind.to_string(), name.to_string());
        Some(InFlight {
            pod: f.pod.clone(),
            workload: Some(workload_key(namespace, &owner)),
            since: now,
            resumed: true,
            detail: Wait {
                owner,
                namespace: namespace.to_string(),
                evicted_uid: f.uid.clone(),
                known: HashSet::new(),
                to_node: String::new(),
            },
        })
    }

    /// Whether the evicted pod has been replaced by a Ready pod, among `pods` (its
    /// workload's); the replacement if it is known. A resumed wait does not know which pod
    /// replaces it: it ends once the evicted pod is gone and every pod of its workload is
    /// Ready.
    fn replaced<'a>(
        &self,
        resumed: bool,
        pods: &'a [Arc<CachedPod>],
    ) -> Option<Option<&'a Arc<CachedPod>>> {
        if resumed {
            let evicted_gone = pods.iter().all(|p| p.uid != self.evicted_uid);
            let all_ready = !pods.is_empty() && pods.iter().all(|p| p.ready && !p.deleting);
            return (evicted_gone && all_ready).then_some(None);
        }
        pods.iter()
            .find(|p| {
                p.uid != self.evicted_uid && !self.known.contains(&p.uid) && p.ready && !p.deleting
            })
            .map(Some)
    }
}

/// The pods of a workload in the cache.
fn pods_of_owner(pods: &Store<CachedPod>, ns: &str, owner: &Workload) -> Vec<Arc<CachedPod>> {
    pods.state()
        .into_iter()
        .filter(|p| {
            p.namespace == ns
                && p.controller
                    .as_ref()
                    .is_some_and(|c| c.kind == owner.0 && c.name == owner.1)
        })
        .collect()
}

/// GPU pods pending in the policy's scope that were created since `since` (the
/// `maxPendingGpuPods` guard: what the run itself left unschedulable, its replacements
/// and whatever arrived meanwhile, not the queue it came to serve).
pub fn pending_gpu_pods(
    pods: &Store<CachedPod>,
    dra: &DraSnapshot,
    policy: &Policy,
    since: DateTime<Utc>,
) -> usize {
    let pods = pods.state();
    let objs = ingest::ObjectRefs {
        pods: pods
            .iter()
            .filter(|p| {
                p.created
                    // Creation times have whole seconds: a pod of the second the run
                    // started belongs to the queue it came to serve, not to the run (its
                    // first replacements, if that quick, are in flight anyway).
                    .is_none_or(|t| t.timestamp() > since.timestamp())
            })
            .map(|p| &p.0)
            .collect(),
        // A pending pod's DRA-backed GPUs are read from its claims' device classes.
        resource_claims: dra.claims.iter().map(|c| c.as_ref()).collect(),
        device_classes: dra.classes.iter().map(|c| c.as_ref()).collect(),
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

/// How long after a run resumes an eviction its last process recorded as in flight is
/// held to have not happened, when the pod is still there and not terminating: the API
/// server's default request timeout (`--request-timeout`, 1 minute), past which a request
/// of the dead process cannot still be at work.
pub const NOT_EVICTED_AFTER: Duration = Duration::from_secs(60);

/// How the run looks at its waits: a Ready replacement ends a wait (a bounce if it landed
/// on a fence: counted in the record); a resumed wait whose pod is still there, not
/// terminating, [`Looker::not_evicted_after`] after the run resumed ends too: that eviction
/// never took effect (the last process died before or while asking for it), and the record
/// says so (not evicted, failed). Timeouts are the run's state machine's.
pub struct Looker<'a> {
    /// The pod cache.
    pub pods: &'a Store<CachedPod>,
    /// Metrics.
    pub metrics: &'a Metrics,
    /// The policy's name.
    pub policy: &'a str,
    /// The run's fences.
    pub fences: &'a Fences,
    /// [`NOT_EVICTED_AFTER`] (shorter in tests).
    pub not_evicted_after: Duration,
}

impl Looker<'_> {
    /// How wait `w` ended at `now`, if it did (settled in `rec`).
    pub fn ended(
        &self,
        w: &InFlight<Wait>,
        rec: &mut RunRecord,
        now: DateTime<Utc>,
    ) -> Option<Ended> {
        let d = &w.detail;
        let candidates = pods_of_owner(self.pods, &d.namespace, &d.owner);
        let waited = (now - w.since).to_std().unwrap_or_default();
        if w.resumed
            && waited >= self.not_evicted_after
            && let Some(still) = candidates
                .iter()
                .find(|p| p.uid == d.evicted_uid && !p.deleting)
        {
            let node = still.node_name.as_deref().unwrap_or_default();
            warn!(pod = %w.pod, node = %node, "an eviction the last process recorded as in flight never took effect: the pod is still there, not terminating");
            outcome::not_evicted(rec, &w.pod, &d.evicted_uid, node);
            self.metrics.eviction(self.policy, Eviction::Failed);
            return Some(Ended::NotEvicted);
        }
        let replacement = d.replaced(w.resumed, &candidates)?;
        outcome::landed(rec, &d.evicted_uid);
        let Some(r) = replacement else {
            return Some(Ended::Replaced { bounced: false });
        };
        let node = r.node_name.as_deref().unwrap_or_default();
        if !d.to_node.is_empty() {
            let planned = node == d.to_node;
            if planned {
                rec.landed_as_planned += 1;
            } else {
                rec.landed_elsewhere += 1;
                warn!(pod = %w.pod, node = %node, planned = %d.to_node, "replacement landed elsewhere than planned");
            }
            self.metrics.landing(
                self.policy,
                if planned {
                    Landed::Planned
                } else {
                    Landed::Elsewhere
                },
            );
        }
        let Some(on_gpu) = self
            .fences
            .hit(node, &ingest::hami_pod_gpus(&r.annotations))
        else {
            return Some(Ended::Replaced { bounced: false });
        };
        rec.bounced += 1;
        self.metrics.eviction(self.policy, Eviction::Bounced);
        match on_gpu {
            Some(gpu) => {
                warn!(pod = %w.pod, node = %node, gpu = %gpu, "replacement landed on a fenced GPU (does the scheduler read hami.io/device-cordon?)")
            }
            None => warn!(pod = %w.pod, node = %node, "replacement landed on a fenced node"),
        }
        Some(Ended::Replaced { bounced: true })
    }
}

#[cfg(test)]
mod tests {
    use gpu_defrag_core::run::{RunState, Sent, Step, Verdict};
    use kube::runtime::reflector::store::Writer;
    use kube::runtime::watcher;
    use serde_json::json;

    use super::*;

    fn pod(name: &str, uid: &str, ready: bool, deleting: bool) -> CachedPod {
        let mut meta = json!({"name": name, "namespace": "ml", "uid": uid,
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-1",
                                 "uid": "rs", "controller": true}]});
        if deleting {
            meta["deletionTimestamp"] = json!("2026-12-04T02:00:00Z");
        }
        CachedPod::of(
            &serde_json::from_value(json!({
                "metadata": meta,
                "spec": {"nodeName": "n2", "containers": [{"name": "c"}]},
                "status": {"conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]}
            }))
            .unwrap(),
        )
    }

    fn apply(w: &mut Writer<CachedPod>, p: CachedPod) {
        w.apply_watcher_event(&watcher::Event::Apply(p));
    }

    fn t(s: &str) -> DateTime<Utc> {
        crate::objects::parse_ts(s).unwrap()
    }

    /// The waits of a run, looked at once at `now` through `fences`: the open ones left.
    fn look(
        state: &mut RunState<Wait>,
        pods: &Store<CachedPod>,
        fences: &Fences,
        not_evicted_after: Duration,
        rec: &mut RunRecord,
        now: DateTime<Utc>,
    ) -> Vec<(InFlight<Wait>, Ended)> {
        let metrics = Metrics::new();
        let look = Looker {
            pods,
            metrics: &metrics,
            policy: "p",
            fences,
            not_evicted_after,
        };
        state.settle(|w| look.ended(w, rec, now))
    }

    fn run_state() -> RunState<Wait> {
        let limits = gpu_defrag_core::run::Limits::of(&Policy::default());
        RunState::new(Vec::new(), limits, t("2026-12-04T05:00:00Z"))
    }

    fn flight() -> InFlightEviction {
        InFlightEviction {
            pod: "ml/web-1-a".into(),
            uid: "a".into(),
            owner: "ReplicaSet/web-1".into(),
        }
    }

    #[test]
    fn a_resumed_wait_ends_once_the_evicted_pod_is_gone_and_its_workload_is_ready() {
        let (pods, mut writer) = kube::runtime::reflector::store::<CachedPod>();
        let now = t("2026-12-04T02:00:00Z");
        let mut waits = run_state();
        waits.resume(Wait::resumed(&flight(), now));
        let mut rec = RunRecord {
            in_flight: vec![flight()],
            ..Default::default()
        };
        let grace = Duration::from_secs(60);
        // The evicted pod is still terminating, its sibling Ready: still waiting.
        apply(&mut writer, pod("web-1-a", "a", true, true));
        apply(&mut writer, pod("web-1-b", "b", true, false));
        assert!(look(&mut waits, &pods, &Fences::default(), grace, &mut rec, now).is_empty());
        assert_eq!(waits.in_flight().len(), 1);
        // Gone, and its replacement created but not Ready: still waiting.
        writer.apply_watcher_event(&watcher::Event::Delete(pod("web-1-a", "a", true, true)));
        apply(&mut writer, pod("web-1-c", "c", false, false));
        assert!(look(&mut waits, &pods, &Fences::default(), grace, &mut rec, now).is_empty());
        assert_eq!(
            waits.in_flight().len(),
            1,
            "a replacement that is not Ready does not count"
        );
        // The replacement is Ready: the wait ends and the record forgets it.
        apply(&mut writer, pod("web-1-c", "c", true, false));
        let ended = look(&mut waits, &pods, &Fences::default(), grace, &mut rec, now);
        assert_eq!(ended[0].1, Ended::Replaced { bounced: false });
        assert!(waits.in_flight().is_empty());
        assert!(rec.in_flight.is_empty());
    }

    #[test]
    fn a_resumed_eviction_that_never_took_effect_is_settled_not_waited_for() {
        let (pods, mut writer) = kube::runtime::reflector::store::<CachedPod>();
        let now = t("2026-12-04T02:00:00Z");
        let mut rec = RunRecord {
            evicted: 2,
            evicted_pods: vec!["ml/web-1-a".into(), "ml/other".into()],
            evicted_per_node: [("n2".to_string(), 2)].into(),
            in_flight: vec![flight()],
            ..Default::default()
        };
        // The evicted pod is still there, Running and not terminating.
        apply(&mut writer, pod("web-1-a", "a", true, false));
        let mut waits = run_state();
        waits.resume(Wait::resumed(&flight(), now));
        let grace = Duration::from_secs(60);
        let fences = Fences::default();
        // Within the grace its eviction may still be at work on the API server: waiting.
        assert!(look(&mut waits, &pods, &fences, grace, &mut rec, now).is_empty());
        assert_eq!(waits.in_flight().len(), 1);
        assert_eq!(rec.evicted, 2);
        // Past it, the eviction never happened: not waited for, not counted as evicted.
        let later = now + chrono::TimeDelta::seconds(61);
        let ended = look(&mut waits, &pods, &fences, grace, &mut rec, later);
        assert_eq!(ended[0].1, Ended::NotEvicted);
        assert!(waits.in_flight().is_empty());
        assert!(rec.in_flight.is_empty());
        assert_eq!((rec.evicted, rec.failed), (1, 1));
        assert_eq!(rec.evicted_pods, ["ml/other"]);
        assert_eq!(rec.evicted_per_node["n2"], 1);
        // A terminating pod was evicted: its wait goes on.
        let mut waits = run_state();
        waits.resume(Wait::resumed(&flight(), now));
        apply(&mut writer, pod("web-1-a", "a", true, true));
        let mut rec = RunRecord {
            in_flight: vec![flight()],
            ..Default::default()
        };
        assert!(look(&mut waits, &pods, &fences, grace, &mut rec, later).is_empty());
        assert_eq!(waits.in_flight().len(), 1);
        assert_eq!(rec.failed, 0);
    }

    /// A run of one planned eviction of `ml/web-1-a`, sent at `now`, planned onto `to`.
    fn evicted(pods: &Store<CachedPod>, to: &str, now: DateTime<Utc>) -> RunState<Wait> {
        let evicted = pod("web-1-a", "a", true, false);
        let owner: Workload = ("ReplicaSet".into(), "web-1".into());
        let known = Wait::known(pods, &evicted, &owner);
        let step = gpu_defrag_core::run::Planned {
            pod: "ml/web-1-a".into(),
            batch: 0,
            workload: Some(workload_key("ml", &owner)),
        };
        let limits = gpu_defrag_core::run::Limits::of(&Policy::default());
        let mut state = RunState::new(vec![step], limits, t("2026-12-04T05:00:00Z"));
        assert_eq!(state.next(None, true, now), Step::Check(0));
        assert_eq!(state.judged(0, 0, Verdict::Go), Some(Step::Evict(0)));
        let wait = Wait::new(&evicted, owner, known, to);
        state.sent(0, Sent::Evicted(wait), now);
        state
    }

    #[test]
    fn a_wait_ends_on_a_new_ready_pod_of_its_workload_and_counts_a_bounce() {
        let (pods, mut writer) = kube::runtime::reflector::store::<CachedPod>();
        apply(&mut writer, pod("web-1-a", "a", true, false));
        apply(&mut writer, pod("web-1-b", "b", true, false));
        let now = t("2026-12-04T02:00:00Z");
        let mut waits = evicted(&pods, "n7", now);
        assert_eq!(waits.in_flight()[0].detail.known.len(), 2);
        let mut rec = RunRecord::default();
        let grace = Duration::from_secs(60);
        // The sibling was Ready before: it is not the replacement.
        writer.apply_watcher_event(&watcher::Event::Delete(pod("web-1-a", "a", true, false)));
        assert!(look(&mut waits, &pods, &Fences::default(), grace, &mut rec, now).is_empty());
        assert_eq!(waits.in_flight().len(), 1);
        // The replacement lands on n2, which the run fenced: a bounce, the workload backs off.
        apply(&mut writer, pod("web-1-c", "c", true, false));
        let fenced = Fences {
            nodes: ["n2".to_string()].into(),
            ..Default::default()
        };
        let ended = look(&mut waits, &pods, &fenced, grace, &mut rec, now);
        assert_eq!(ended[0].1, Ended::Replaced { bounced: true });
        assert_eq!(ended[0].0.detail.evicted_uid, "a");
        assert!(waits.in_flight().is_empty());
        assert_eq!(rec.bounced, 1);
        assert!(waits.backed_off().contains("ml/ReplicaSet/web-1"));
        // Planned onto n7, landed on n2: counted as landed elsewhere.
        assert_eq!((rec.landed_as_planned, rec.landed_elsewhere), (0, 1));
    }

    #[test]
    fn a_replacement_on_its_planned_node_counts_as_landed_as_planned() {
        let (pods, mut writer) = kube::runtime::reflector::store::<CachedPod>();
        let now = t("2026-12-04T02:00:00Z");
        let mut waits = evicted(&pods, "n2", now);
        apply(&mut writer, pod("web-1-c", "c", true, false));
        let mut rec = RunRecord::default();
        let ended = look(
            &mut waits,
            &pods,
            &Fences::default(),
            Duration::from_secs(60),
            &mut rec,
            now,
        );
        assert_eq!(ended.len(), 1);
        assert_eq!((rec.landed_as_planned, rec.landed_elsewhere), (1, 0));
    }

    #[test]
    fn the_pending_guard_counts_only_pods_created_during_the_run() {
        let (pods, mut writer) = kube::runtime::reflector::store::<CachedPod>();
        let pending = |name: &str, created: &str| {
            CachedPod::of(
                &serde_json::from_value(json!({
                    "metadata": {"name": name, "namespace": "ml", "uid": name,
                                 "creationTimestamp": created},
                    "spec": {"containers": [{"name": "c", "resources": {
                        "limits": {"nvidia.com/gpu": "8"}, "requests": {"nvidia.com/gpu": "8"}}}]},
                    "status": {"phase": "Pending"}
                }))
                .unwrap(),
            )
        };
        apply(&mut writer, pending("queued", "2026-12-04T01:00:00Z"));
        apply(&mut writer, pending("new", "2026-12-04T02:10:00Z"));
        // Queued in the very second the run started (the run's start has sub-seconds).
        apply(&mut writer, pending("same-second", "2026-12-04T02:00:00Z"));
        let start = crate::objects::parse_ts("2026-12-04T02:00:00.4Z").unwrap();
        let policy = Policy::default();
        assert_eq!(
            pending_gpu_pods(&pods, &Default::default(), &policy, start),
            1,
            "the queue it came to serve does not count"
        );
        let before = crate::objects::parse_ts("2026-12-04T00:00:00Z").unwrap();
        assert_eq!(
            pending_gpu_pods(&pods, &Default::default(), &policy, before),
            3
        );
    }
}
