//! Landing control: the replacement of an evicted pod lands on the node its move planned.
//!
//! ```text
//! executor ──expect(workload, target)──> [Landing] ──ConfigMap data──> API server's
//!                                            │        MutatingAdmissionPolicy
//!                                            │        (config/landing): a new pod of a
//!                                            │        listed workload is created gated
//!                                            │        (gpu-defrag.io/landing) and labelled
//! every second (tick): held pods ◀───────────┘
//!   leader, a matching expectation: status.nominatedNodeName = target, then ungate
//!   leader, none: ungate now            any replica, held past holdTimeout: ungate
//! ```
//!
//! The ConfigMap (`--landing-configmap` in `--landing-namespace`, labelled
//! [`PARAMS_LABEL`]) lists one key per workload with an eviction in flight,
//! `<namespace>.<Kind>.<name>`, valued with the policy's name; the policy's binding selects
//! every such ConfigMap, and labels the pods it gates with the name of the ConfigMap that
//! listed them ([`LANDING_LABEL`]), so each operator only releases its own.
//!
//! Failing open: when the ConfigMap cannot be written, the eviction goes on without a hold
//! (the scheduler alone places the replacement); when the admission path is down
//! (`failurePolicy: Ignore`) pods are created ungated; a process that starts releases every
//! pod it finds held under its name, and one that stops releases them too.
use std::collections::BTreeMap;
use std::time::Duration;

use chrono::Utc;
use gpu_defrag_api::v1alpha1::DefragPolicy;
use gpu_defrag_core::compact::LANDING_GATE;
use gpu_defrag_core::landing::{Held, Released, held_pod};
use gpu_defrag_core::policy::parse_duration;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::Store;
use serde_json::json;
use tracing::{info, warn};

use crate::lease::LeaderState;
use crate::metrics::{LandingAction, Metrics};
use crate::objects::CachedPod;

/// Label on the pods the admission policy gates: the name of the ConfigMap that listed
/// their workload.
pub const LANDING_LABEL: &str = "gpu-defrag.io/landing";
/// Label on the ConfigMaps the admission policy's binding reads as its parameters.
pub const PARAMS_LABEL: &str = "gpu-defrag.io/landing-params";
/// Field manager of the ConfigMap and of the pod edits.
pub const LANDING_MANAGER: &str = "gpu-defrag-landing";
/// How often held pods are looked at.
pub const TICK: Duration = Duration::from_secs(1);
/// How long after a new workload key is written before its eviction: the API server reads
/// admission parameters from its own informer, which sees the write a moment later.
pub const PROPAGATION: Duration = Duration::from_millis(500);
/// How long the tick waits before writing the ConfigMap again after a failed write.
pub const SYNC_RETRY: Duration = Duration::from_secs(30);
/// The hold timeout when no policy states one.
pub const DEFAULT_HOLD: Duration = Duration::from_secs(30);

/// The ConfigMap key of a workload: `<namespace>.<Kind>.<name>` (namespaces and kinds
/// have no dots, so the key is unambiguous); `None` when it would not be a valid key.
pub fn workload_key(namespace: &str, kind: &str, name: &str) -> Option<String> {
    let key = format!("{namespace}.{kind}.{name}");
    let valid = !namespace.is_empty()
        && !kind.is_empty()
        && !name.is_empty()
        && !namespace.contains('.')
        && !kind.contains('.')
        && key.len() <= 253
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    valid.then_some(key)
}

/// One replacement expected: the workload whose pod was evicted and the node planned for
/// its replacement.
#[derive(Clone, Debug, PartialEq)]
struct Expect {
    policy: String,
    key: String,
    evicted_uid: String,
    target: String,
    /// The held pod nominated for it, once one was.
    nominated: Option<String>,
}

#[derive(Default)]
struct State {
    expects: Vec<Expect>,
    /// The ConfigMap data last written by this process (`None`: not yet).
    written: Option<BTreeMap<String, String>>,
    /// Whether the start-up sweep ran.
    swept: bool,
    /// After a failed write, the tick writes again no sooner than this (an expectation
    /// still writes at once).
    retry_at: Option<std::time::Instant>,
}

impl State {
    /// The ConfigMap data the expectations call for.
    fn desired(&self) -> BTreeMap<String, String> {
        self.expects
            .iter()
            .map(|e| (e.key.clone(), e.policy.clone()))
            .collect()
    }
}

/// How a nomination went.
#[derive(Debug, PartialEq)]
enum Nomination {
    Set,
    /// The pod was bound meanwhile (the API server refuses a nomination then).
    Bound,
    Failed,
}

/// The landing state of one operator process: its expectations and its ConfigMap.
pub struct Landing {
    client: Client,
    namespace: String,
    name: String,
    state: std::sync::Mutex<State>,
    /// One ConfigMap write at a time, so an older view never lands after a newer one.
    writing: tokio::sync::Mutex<()>,
}

impl Landing {
    /// Landing control through the ConfigMap `name` in `namespace`.
    pub fn new(client: Client, namespace: &str, name: &str) -> Self {
        Landing {
            client,
            namespace: namespace.to_string(),
            name: name.to_string(),
            state: Default::default(),
            writing: Default::default(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Expects a replacement of the workload `(kind, name)` in `namespace`, whose pod
    /// `evicted_uid` is about to be evicted, to land on `target`; written to the
    /// ConfigMap before this returns. False when it could not be (no hold: the scheduler
    /// alone places the replacement).
    pub async fn expect(
        &self,
        policy: &str,
        namespace: &str,
        workload: &(String, String),
        evicted_uid: &str,
        target: &str,
    ) -> bool {
        let Some(key) = workload_key(namespace, &workload.0, &workload.1) else {
            return false;
        };
        let new_key = {
            let mut st = self.state();
            let new_key = !st.expects.iter().any(|e| e.key == key);
            st.expects.push(Expect {
                policy: policy.to_string(),
                key: key.clone(),
                evicted_uid: evicted_uid.to_string(),
                target: target.to_string(),
                nominated: None,
            });
            new_key
        };
        match self.sync().await {
            Ok(()) => {
                if new_key {
                    tokio::time::sleep(PROPAGATION).await;
                }
                true
            }
            Err(e) => {
                warn!(workload = %key, error = %crate::apiclient::error_line(&e), "could not list the workload for landing control; its replacement is not held");
                self.settle(evicted_uid);
                false
            }
        }
    }

    /// The replacement of `evicted_uid` is settled (Ready, failed or given up): its
    /// expectation goes (the ConfigMap follows at the next tick).
    pub fn settle(&self, evicted_uid: &str) {
        self.state()
            .expects
            .retain(|e| e.evicted_uid != evicted_uid);
    }

    /// Drops every expectation of a policy (its run ended, was stopped or the policy went).
    pub fn forget_policy(&self, policy: &str) {
        self.state().expects.retain(|e| e.policy != policy);
    }

    /// Writes the ConfigMap when its data differs from the expectations.
    async fn sync(&self) -> Result<(), kube::Error> {
        let _writing = self.writing.lock().await;
        let desired = {
            let st = self.state();
            let desired = st.desired();
            if st.written.as_ref() == Some(&desired) {
                return Ok(());
            }
            desired
        };
        let cm = json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "labels": {PARAMS_LABEL: "true", "app.kubernetes.io/name": "gpu-defrag"},
            },
            "data": desired,
        });
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.namespace);
        let failed = |_: &kube::Error| {
            self.state().retry_at = Some(std::time::Instant::now() + SYNC_RETRY);
        };
        let applied = api
            .patch(
                &self.name,
                &PatchParams::apply(LANDING_MANAGER).force(),
                &Patch::Apply(&cm),
            )
            .await
            .inspect_err(failed)?;
        // Keys another writer added (a hand edit, an older manager) survive an apply that
        // never owned them: a merge patch deletes them (null).
        let stale: serde_json::Map<String, serde_json::Value> = applied
            .data
            .iter()
            .flatten()
            .filter(|(k, _)| !desired.contains_key(*k))
            .map(|(k, _)| (k.clone(), serde_json::Value::Null))
            .collect();
        if !stale.is_empty() {
            api.patch(
                &self.name,
                &PatchParams::default(),
                &Patch::Merge(json!({"data": stale})),
            )
            .await
            .inspect_err(failed)?;
        }
        let mut st = self.state();
        st.written = Some(desired);
        st.retry_at = None;
        Ok(())
    }

    /// The leader takes the first open expectation of workload `key` for held pod `uid`:
    /// the node its move planned.
    fn take_expectation(&self, uid: &str, key: Option<&str>) -> Option<String> {
        let key = key?;
        let mut st = self.state();
        let e = st
            .expects
            .iter_mut()
            .find(|e| e.key == key && e.nominated.is_none())?;
        e.nominated = Some(uid.to_string());
        Some(e.target.clone())
    }

    /// One pass: the start-up sweep once, the ConfigMap (leader), then every held pod.
    pub async fn tick(
        &self,
        pods: &Store<CachedPod>,
        policies: &Store<DefragPolicy>,
        leader: &LeaderState,
        metrics: &Metrics,
    ) {
        let leads = leader.is_leader();
        let due = self
            .state()
            .retry_at
            .is_none_or(|t| std::time::Instant::now() >= t);
        if leads
            && due
            && let Err(e) = self.sync().await
        {
            warn!(error = %crate::apiclient::error_line(&e), retry_in = ?SYNC_RETRY, "could not write the landing ConfigMap");
        }
        let held = self.held(pods);
        let sweep = !std::mem::replace(&mut self.state().swept, true);
        let hold = hold_timeout(policies);
        let now = Utc::now();
        let mut stuck = 0;
        for p in held {
            let age = p
                .created
                .and_then(|t| (now - t).to_std().ok())
                .unwrap_or_default();
            let key = p
                .controller
                .as_ref()
                .and_then(|c| workload_key(&p.namespace, &c.kind, &c.name));
            let expected = if leads && !sweep {
                self.take_expectation(&p.uid, key.as_deref())
            } else {
                None
            };
            let done = match held_pod(sweep, leads, expected.as_deref(), age, hold) {
                Held::Keep => continue,
                Held::Nominate(node) => {
                    let nominated = self.nominate(&p, &node).await;
                    metrics.landing_action(if nominated {
                        LandingAction::Nominated
                    } else {
                        LandingAction::NominateFailed
                    });
                    self.release(&p).await
                }
                Held::Release(why) => {
                    metrics.landing_action(match why {
                        Released::Swept => LandingAction::Swept,
                        Released::TimedOut => LandingAction::TimedOut,
                        Released::Unexpected => LandingAction::Released,
                    });
                    self.release(&p).await
                }
            };
            if !done {
                metrics.landing_action(LandingAction::ReleaseFailed);
                if age >= hold {
                    stuck += 1;
                }
            }
        }
        if sweep {
            info!(configmap = %self.name, "landing control: start-up sweep done");
        }
        metrics.set_landing_stuck(stuck);
    }

    /// The pods held under this process's name, not bound, not being deleted.
    fn held(&self, pods: &Store<CachedPod>) -> Vec<std::sync::Arc<CachedPod>> {
        pods.state()
            .into_iter()
            .filter(|p| {
                p.labels.get(LANDING_LABEL) == Some(&self.name)
                    && p.node_name.is_none()
                    && !p.deleting
            })
            .collect()
    }

    /// Sets a held pod's `status.nominatedNodeName`; false when the API refused it.
    async fn nominate(&self, p: &CachedPod, node: &str) -> bool {
        self.set_nominated(&p.namespace, &p.name, node, "replacement")
            .await
            == Nomination::Set
    }

    /// Nominates a pending pod the run made room for onto the node it emptied for it
    /// (`gpu_defrag_landing_actions_total{kind="pending_nominated"}`); false when the API
    /// refused it (the pod is then scheduled as it would be anyway).
    pub async fn nominate_pending(
        &self,
        namespace: &str,
        name: &str,
        node: &str,
        metrics: &Metrics,
    ) -> bool {
        let done = self
            .set_nominated(namespace, name, node, "pending pod")
            .await;
        match done {
            Nomination::Set => metrics.landing_action(LandingAction::PendingNominated),
            Nomination::Bound => {}
            Nomination::Failed => metrics.landing_action(LandingAction::NominateFailed),
        }
        done == Nomination::Set
    }

    /// Clears the nomination of a pending pod a demand run held a room for (the hold is
    /// over); true when cleared or nothing to clear.
    pub async fn clear_nominated(&self, namespace: &str, name: &str) -> bool {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let patch = json!({"status": {"nominatedNodeName": null}});
        match api
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => true,
            Err(kube::Error::Api(s)) if s.code == 404 => true,
            Err(e) => {
                warn!(pod = %format!("{namespace}/{name}"), error = %crate::apiclient::error_line(&e), "could not clear the nomination of a held pod; the scheduler clears it at its next failed attempt");
                false
            }
        }
    }

    async fn set_nominated(
        &self,
        namespace: &str,
        name: &str,
        node: &str,
        what: &str,
    ) -> Nomination {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let patch = json!({"status": {"nominatedNodeName": node}});
        match api
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                info!(pod = %format!("{namespace}/{name}"), node = %node, "{what} nominated onto its planned node");
                Nomination::Set
            }
            // Bound meanwhile: nothing to steer any more.
            Err(kube::Error::Api(s)) if s.code == 422 && s.message.contains("already bound") => {
                info!(pod = %format!("{namespace}/{name}"), node = %node, "{what} already scheduled; not nominated");
                Nomination::Bound
            }
            Err(e) => {
                warn!(pod = %format!("{namespace}/{name}"), node = %node, error = %crate::apiclient::error_line(&e), "could not nominate the {what}; it is scheduled un-nominated");
                Nomination::Failed
            }
        }
    }

    /// Removes the landing gate and label of a pod; false when it could not (a 404 counts
    /// as done: the pod is gone).
    async fn release(&self, p: &CachedPod) -> bool {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &p.namespace);
        let patch = json!({
            "metadata": {"labels": {LANDING_LABEL: null}},
            "spec": {"schedulingGates": [{"$patch": "delete", "name": LANDING_GATE}]},
        });
        match api
            .patch(&p.name, &PatchParams::default(), &Patch::Strategic(&patch))
            .await
        {
            Ok(_) => true,
            Err(kube::Error::Api(s)) if s.code == 404 => true,
            Err(e) => {
                warn!(pod = %p.key(), error = %crate::apiclient::error_line(&e), "could not remove the landing gate");
                false
            }
        }
    }

    /// On shutdown: no more expectations (the leader empties the ConfigMap), every pod held
    /// under this name released.
    pub async fn shutdown(&self, pods: &Store<CachedPod>, leader: &LeaderState) {
        self.state().expects.clear();
        if leader.is_leader()
            && let Err(e) = self.sync().await
        {
            warn!(error = %crate::apiclient::error_line(&e), "could not empty the landing ConfigMap on shutdown");
        }
        for p in self.held(pods) {
            self.release(&p).await;
        }
    }

    /// Runs [`Landing::tick`] every [`TICK`], once `ready` says the caches are full.
    pub async fn run(
        self: std::sync::Arc<Self>,
        pods: Store<CachedPod>,
        policies: Store<DefragPolicy>,
        leader: LeaderState,
        metrics: Metrics,
        ready: std::sync::Arc<std::sync::atomic::AtomicBool>,
    ) {
        loop {
            if ready.load(std::sync::atomic::Ordering::SeqCst) {
                self.tick(&pods, &policies, &leader, &metrics).await;
            }
            tokio::time::sleep(TICK).await;
        }
    }
}

/// The longest `landing.holdTimeout` of the policies in the store ([`DEFAULT_HOLD`] when
/// there is none; an unreadable one counts as the default).
fn hold_timeout(policies: &Store<DefragPolicy>) -> Duration {
    policies
        .state()
        .iter()
        .map(|p| parse_duration(&p.spec.landing.hold_timeout).unwrap_or(DEFAULT_HOLD))
        .map(|d| d.clamp(Duration::from_secs(1), Duration::from_secs(300)))
        .max()
        .unwrap_or(DEFAULT_HOLD)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workload_keys_are_valid_configmap_keys_or_none() {
        assert_eq!(
            workload_key("ml", "ReplicaSet", "web-7d9f").as_deref(),
            Some("ml.ReplicaSet.web-7d9f")
        );
        assert_eq!(
            workload_key("ml", "StatefulSet", "db.v2").as_deref(),
            Some("ml.StatefulSet.db.v2")
        );
        assert_eq!(workload_key("", "ReplicaSet", "x"), None);
        assert_eq!(workload_key("ml", "", "x"), None);
        assert_eq!(workload_key("ml", "ReplicaSet", ""), None);
        assert_eq!(workload_key("m.l", "ReplicaSet", "x"), None);
        assert_eq!(workload_key("ml", "Replica/Set", "x"), None);
        assert_eq!(workload_key("ml", "ReplicaSet", &"x".repeat(250)), None);
    }
}
