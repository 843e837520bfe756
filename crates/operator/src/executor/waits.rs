//! Waiting for replacements: after an eviction the run waits until a new pod of the same
//! workload is Ready, checks where it landed (a landing on a fence is a bounce) and stalls
//! when that takes longer than `rescheduleTimeout`.
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

use super::fences::Fences;
use super::outcome::{self, Stop};
use crate::dra::DraSnapshot;
use crate::metrics::Metrics;
use crate::objects::CachedPod;

/// How often waits poll the caches.
pub const POLL: Duration = Duration::from_millis(500);

/// A workload: `(kind, name)` of a pod's controller, in a namespace.
pub type Workload = (String, String);

/// An eviction whose replacement the run waits for.
pub struct Wait {
    /// `namespace/name` of the evicted pod.
    pub pod: String,
    /// Its workload.
    pub owner: Workload,
    /// Its namespace.
    pub namespace: String,
    /// Its UID.
    pub evicted_uid: String,
    /// UIDs of the workload's pods when it was evicted (none of them is the replacement).
    pub known: HashSet<String>,
    /// When it was evicted (or, resumed, when the run resumed).
    pub since: tokio::time::Instant,
    /// Taken over from the record of an earlier process: which pod replaces it is not
    /// known, so it ends once the evicted pod is gone and every pod of its workload is
    /// Ready.
    pub resumed: bool,
    /// The node its move planned for the replacement (empty: none known).
    pub to_node: String,
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

    /// A wait for the replacement of `pod` (`key`, of `owner`), evicted now, planned to land
    /// on `to_node`; `known` as [`Wait::known`] gave before the eviction.
    pub fn new(
        key: &str,
        pod: &CompactPod,
        owner: Workload,
        known: HashSet<String>,
        to_node: &str,
    ) -> Self {
        Wait {
            pod: key.to_string(),
            owner,
            namespace: pod.namespace.clone(),
            evicted_uid: pod.uid.clone(),
            known,
            since: tokio::time::Instant::now(),
            resumed: false,
            to_node: to_node.to_string(),
        }
    }

    /// A wait taken over from the record of an earlier process (None: unreadable entry).
    pub fn resumed(f: &InFlightEviction) -> Option<Self> {
        let (namespace, _) = f.pod.split_once('/')?;
        let (kind, name) = f.owner.split_once('/')?;
        Some(Wait {
            pod: f.pod.clone(),
            owner: (kind.to_string(), name.to_string()),
            namespace: namespace.to_string(),
            evicted_uid: f.uid.clone(),
            known: HashSet::new(),
            since: tokio::time::Instant::now(),
            resumed: true,
            to_node: String::new(),
        })
    }

    /// Whether the evicted pod has been replaced by a Ready pod, among `pods` (its
    /// workload's); the replacement if it is known.
    fn replaced<'a>(&self, pods: &'a [Arc<CachedPod>]) -> Option<Option<&'a Arc<CachedPod>>> {
        if self.resumed {
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

/// The run's waits, and the workloads it stopped moving because a replacement bounced.
pub struct Waits {
    /// Evictions whose replacement is not Ready yet.
    pub open: Vec<Wait>,
    /// Workloads whose replacement landed on a fence: not moved again in this run.
    pub backed_off: HashSet<Workload>,
    /// How long a replacement may take.
    pub timeout: Duration,
    /// [`NOT_EVICTED_AFTER`] (shorter in tests).
    pub not_evicted_after: Duration,
    /// UIDs of the evicted pods whose waits ended since this was last emptied.
    pub ended: Vec<String>,
}

impl Waits {
    /// No waits yet.
    pub fn new(timeout: Duration) -> Self {
        Waits {
            open: Vec::new(),
            backed_off: HashSet::new(),
            timeout,
            not_evicted_after: NOT_EVICTED_AFTER,
            ended: Vec::new(),
        }
    }

    /// The waits of a resumed run: the evictions its record lists as in flight.
    pub fn resumed(timeout: Duration, in_flight: &[InFlightEviction]) -> Self {
        let mut w = Waits::new(timeout);
        w.open = in_flight.iter().filter_map(Wait::resumed).collect();
        w
    }

    /// Open waits of one workload.
    pub fn of_workload(&self, owner: Option<&Workload>) -> usize {
        self.open.iter().filter(|w| Some(&w.owner) == owner).count()
    }

    /// Checks the waits: a Ready replacement ends a wait (a bounce if it landed on a
    /// fence: counted in `rec`, its workload backed off); a resumed wait whose pod is still
    /// there, not terminating, [`Waits::not_evicted_after`] after the run resumed ends too:
    /// that eviction never took effect (the last process died before or while asking for
    /// it), and the record says so (not evicted, failed); a wait older than the timeout
    /// stalls the run.
    pub fn settle(
        &mut self,
        pods: &Store<CachedPod>,
        metrics: &Metrics,
        policy: &str,
        fences: &Fences,
        rec: &mut RunRecord,
    ) -> Result<(), Stop> {
        let mut stalled = None;
        let timeout = self.timeout;
        let not_evicted_after = self.not_evicted_after;
        let backed_off = &mut self.backed_off;
        let before: Vec<String> = self.open.iter().map(|w| w.evicted_uid.clone()).collect();
        self.open.retain(|w| {
            let candidates = pods_of_owner(pods, &w.namespace, &w.owner);
            if w.resumed
                && w.since.elapsed() >= not_evicted_after
                && let Some(still) = candidates
                    .iter()
                    .find(|p| p.uid == w.evicted_uid && !p.deleting)
            {
                let node = still.node_name.as_deref().unwrap_or_default();
                warn!(pod = %w.pod, node = %node, "an eviction the last process recorded as in flight never took effect: the pod is still there, not terminating");
                outcome::not_evicted(rec, &w.pod, &w.evicted_uid, node);
                metrics.eviction(policy, "failed");
                return false;
            }
            if let Some(replacement) = w.replaced(&candidates) {
                outcome::landed(rec, &w.evicted_uid);
                let Some(r) = replacement else {
                    return false;
                };
                let node = r.node_name.as_deref().unwrap_or_default();
                if !w.to_node.is_empty() {
                    let planned = node == w.to_node;
                    if planned {
                        rec.landed_as_planned += 1;
                    } else {
                        rec.landed_elsewhere += 1;
                        warn!(pod = %w.pod, node = %node, planned = %w.to_node, "replacement landed elsewhere than planned");
                    }
                    metrics.landing(policy, if planned { "planned" } else { "elsewhere" });
                }
                if let Some(on_gpu) = fences.hit(node, &ingest::hami_pod_gpus(&r.annotations)) {
                    rec.bounced += 1;
                    metrics.eviction(policy, "bounced");
                    backed_off.insert(w.owner.clone());
                    match on_gpu {
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
        self.ended.extend(
            before
                .into_iter()
                .filter(|u| !self.open.iter().any(|w| w.evicted_uid == *u)),
        );
        match stalled {
            Some(m) => Err(Stop::Stalled(m)),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
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

    #[test]
    fn a_resumed_wait_ends_once_the_evicted_pod_is_gone_and_its_workload_is_ready() {
        let (pods, mut writer) = kube::runtime::reflector::store::<CachedPod>();
        let flight = InFlightEviction {
            pod: "ml/web-1-a".into(),
            uid: "a".into(),
            owner: "ReplicaSet/web-1".into(),
        };
        let mut waits = Waits::resumed(Duration::from_secs(60), std::slice::from_ref(&flight));
        let mut rec = RunRecord {
            in_flight: vec![flight],
            ..Default::default()
        };
        let settle = |waits: &mut Waits, rec: &mut RunRecord| {
            waits.settle(&pods, &Metrics::new(), "p", &Fences::default(), rec)
        };
        // The evicted pod is still terminating, its sibling Ready: still waiting.
        apply(&mut writer, pod("web-1-a", "a", true, true));
        apply(&mut writer, pod("web-1-b", "b", true, false));
        assert_eq!(settle(&mut waits, &mut rec), Ok(()));
        assert_eq!(waits.open.len(), 1);
        // Gone, and its replacement created but not Ready: still waiting.
        writer.apply_watcher_event(&watcher::Event::Delete(pod("web-1-a", "a", true, true)));
        apply(&mut writer, pod("web-1-c", "c", false, false));
        assert_eq!(settle(&mut waits, &mut rec), Ok(()));
        assert_eq!(
            waits.open.len(),
            1,
            "a replacement that is not Ready does not count"
        );
        // The replacement is Ready: the wait ends and the record forgets it.
        apply(&mut writer, pod("web-1-c", "c", true, false));
        assert_eq!(settle(&mut waits, &mut rec), Ok(()));
        assert!(waits.open.is_empty());
        assert!(rec.in_flight.is_empty());
    }

    #[test]
    fn a_resumed_eviction_that_never_took_effect_is_settled_not_waited_for() {
        let (pods, mut writer) = kube::runtime::reflector::store::<CachedPod>();
        let flight = InFlightEviction {
            pod: "ml/web-1-a".into(),
            uid: "a".into(),
            owner: "ReplicaSet/web-1".into(),
        };
        let mut rec = RunRecord {
            evicted: 2,
            evicted_pods: vec!["ml/web-1-a".into(), "ml/other".into()],
            evicted_per_node: [("n2".to_string(), 2)].into(),
            in_flight: vec![flight.clone()],
            ..Default::default()
        };
        // The evicted pod is still there, Running and not terminating.
        apply(&mut writer, pod("web-1-a", "a", true, false));
        let mut waits = Waits::resumed(Duration::from_secs(600), std::slice::from_ref(&flight));
        let settle = |waits: &mut Waits, rec: &mut RunRecord| {
            waits.settle(&pods, &Metrics::new(), "p", &Fences::default(), rec)
        };
        // Within the grace its eviction may still be at work on the API server: waiting.
        assert_eq!(settle(&mut waits, &mut rec), Ok(()));
        assert_eq!(waits.open.len(), 1);
        assert_eq!(rec.evicted, 2);
        // Past it, the eviction never happened: not waited for, not counted as evicted.
        waits.not_evicted_after = Duration::ZERO;
        assert_eq!(settle(&mut waits, &mut rec), Ok(()));
        assert!(waits.open.is_empty());
        assert!(rec.in_flight.is_empty());
        assert_eq!((rec.evicted, rec.failed), (1, 1));
        assert_eq!(rec.evicted_pods, ["ml/other"]);
        assert_eq!(rec.evicted_per_node["n2"], 1);
        // A terminating pod was evicted: its wait goes on.
        let mut waits = Waits::resumed(Duration::from_secs(600), std::slice::from_ref(&flight));
        waits.not_evicted_after = Duration::ZERO;
        apply(&mut writer, pod("web-1-a", "a", true, true));
        let mut rec = RunRecord {
            in_flight: vec![flight.clone()],
            ..Default::default()
        };
        assert_eq!(settle(&mut waits, &mut rec), Ok(()));
        assert_eq!(waits.open.len(), 1);
        assert_eq!(rec.failed, 0);
    }

    #[test]
    fn a_wait_ends_on_a_new_ready_pod_of_its_workload_and_counts_a_bounce() {
        let (pods, mut writer) = kube::runtime::reflector::store::<CachedPod>();
        apply(&mut writer, pod("web-1-a", "a", true, false));
        apply(&mut writer, pod("web-1-b", "b", true, false));
        let evicted = pod("web-1-a", "a", true, false);
        let owner: Workload = ("ReplicaSet".into(), "web-1".into());
        let known = Wait::known(&pods, &evicted, &owner);
        assert_eq!(known.len(), 2);
        let mut waits = Waits::new(Duration::from_secs(60));
        waits.open.push(Wait::new(
            "ml/web-1-a",
            &evicted,
            owner.clone(),
            known,
            "n7",
        ));
        let mut rec = RunRecord::default();
        // The sibling was Ready before: it is not the replacement.
        writer.apply_watcher_event(&watcher::Event::Delete(evicted));
        assert_eq!(
            waits.settle(&pods, &Metrics::new(), "p", &Fences::default(), &mut rec),
            Ok(())
        );
        assert_eq!(waits.open.len(), 1);
        // The replacement lands on n2, which the run fenced: a bounce, the workload backs off.
        apply(&mut writer, pod("web-1-c", "c", true, false));
        let fenced = Fences {
            nodes: ["n2".to_string()].into(),
            ..Default::default()
        };
        assert_eq!(
            waits.settle(&pods, &Metrics::new(), "p", &fenced, &mut rec),
            Ok(())
        );
        assert!(waits.open.is_empty());
        assert_eq!(rec.bounced, 1);
        assert!(waits.backed_off.contains(&owner));
        // Planned onto n7, landed on n2: counted as landed elsewhere; the wait has ended.
        assert_eq!((rec.landed_as_planned, rec.landed_elsewhere), (0, 1));
        assert_eq!(waits.ended, vec!["a".to_string()]);
    }

    #[test]
    fn a_replacement_on_its_planned_node_counts_as_landed_as_planned() {
        let (pods, mut writer) = kube::runtime::reflector::store::<CachedPod>();
        let evicted = pod("web-1-a", "a", true, false);
        let owner: Workload = ("ReplicaSet".into(), "web-1".into());
        let mut waits = Waits::new(Duration::from_secs(60));
        waits.open.push(Wait::new(
            "ml/web-1-a",
            &evicted,
            owner,
            HashSet::new(),
            "n2",
        ));
        apply(&mut writer, pod("web-1-c", "c", true, false));
        let mut rec = RunRecord::default();
        assert_eq!(
            waits.settle(&pods, &Metrics::new(), "p", &Fences::default(), &mut rec),
            Ok(())
        );
        assert_eq!((rec.landed_as_planned, rec.landed_elsewhere), (1, 0));
    }

    #[test]
    fn a_wait_past_the_timeout_stalls_the_run() {
        let (pods, _writer) = kube::runtime::reflector::store::<CachedPod>();
        let mut waits = Waits::new(Duration::from_millis(0));
        let evicted = pod("web-1-a", "a", true, false);
        waits.open.push(Wait::new(
            "ml/web-1-a",
            &evicted,
            ("ReplicaSet".into(), "web-1".into()),
            HashSet::new(),
            "n2",
        ));
        std::thread::sleep(Duration::from_millis(5));
        let r = waits.settle(
            &pods,
            &Metrics::new(),
            "p",
            &Fences::default(),
            &mut RunRecord::default(),
        );
        assert!(matches!(r, Err(Stop::Stalled(m)) if m.contains("ml/web-1-a")));
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
