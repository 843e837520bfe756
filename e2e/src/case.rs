//! One e2e test's world on the shared stack: a namespace, an admin client, a kwok node
//! pool of its own, and a DefragPolicy named after the namespace (labelled so that only
//! the test's own operator process reconciles it). Used by the operator, fault and churn
//! tests.

use std::{collections::BTreeMap, time::Duration};

use k8s_openapi::api::{
    apps::v1::Deployment,
    core::v1::{Pod, ResourceQuota},
};
use kube::{Api, Client, api::PostParams};
use serde_json::{Value, json};

use crate::{
    cluster::{TestCluster, TestNamespace},
    fixtures::{pod_ready, pods, wait_for},
    operator::{
        Pool, create_policy, delete_policy, int_at, open_window_this_minute, patch_policy,
        pod_node, pod_uids, policy_status, wait_status,
    },
    shared,
};

/// How long a step of a test may take.
pub const T: Duration = Duration::from_secs(60);
/// How long a run may take.
pub const RUN_TIMEOUT: Duration = Duration::from_secs(180);
/// How long "nothing happens" is watched.
pub const QUIET: Duration = Duration::from_secs(15);

/// One test's world: namespace, admin client, node pool; the policy is named after the
/// namespace.
pub struct Case {
    /// The binary's shared stack.
    pub cluster: &'static TestCluster,
    /// The test's namespace.
    pub ns: TestNamespace,
    /// An admin client.
    pub client: Client,
    /// The test's node pool.
    pub pool: Pool,
}

impl Case {
    pub async fn new(prefix: &str, nodes: usize, gpus: u32) -> Self {
        let cluster = shared().await.expect("local control plane");
        let ns = cluster.namespace(prefix).await.unwrap();
        let client = cluster.client().unwrap();
        let pool = Pool::create(cluster, ns.name(), nodes, gpus).await.unwrap();
        Case {
            cluster,
            ns,
            client,
            pool,
        }
    }

    pub fn name(&self) -> &str {
        self.ns.name()
    }

    /// A DryRun policy covering exactly this pool and namespace.
    pub fn spec(&self, shapes: Value, limits: Value) -> Value {
        json!({
            "mode": "DryRun",
            "nodeSelector": self.pool.selector(),
            "namespaces": {"include": [self.ns.name()]},
            "target": {"shapes": shapes, "fromPending": true},
            "trigger": {"minFragmentRate": 0.1},
            "limits": limits,
            // The pool's nodes and pods are brand new.
            "safety": {"minPodAge": "0s", "minNodeAge": "0s", "rescheduleTimeout": "2m"},
        })
    }

    pub fn deployments(&self) -> Api<Deployment> {
        Api::namespaced(self.client.clone(), self.ns.name())
    }

    /// Creates a pending `train-8gpu` Deployment (8 GPUs) on the pool and checks that it
    /// fits nowhere.
    pub async fn pending_training_job(&self) {
        let d = self.pool.deployment("train-8gpu", 1, 8).unwrap();
        self.deployments()
            .create(&PostParams::default(), &d)
            .await
            .unwrap();
        wait_for("train-8gpu to be Pending, unschedulable", T, || async {
            let ps = pods(&self.client, self.ns.name(), "app=train-8gpu").await?;
            Ok(ps
                .first()
                .filter(|p| {
                    pod_node(p).is_none()
                        && p.status.as_ref().is_some_and(|s| {
                            s.conditions.iter().flatten().any(|c| {
                                c.type_ == "PodScheduled"
                                    && c.status == "False"
                                    && c.reason.as_deref() == Some("Unschedulable")
                            })
                        })
                })
                .map(|_| ()))
        })
        .await
        .unwrap();
    }

    /// Creates a bare pending pod `name` asking for `gpus` GPUs on the pool (no
    /// controller) and waits until the scheduler marks it Unschedulable.
    pub async fn pending_pod(&self, name: &str, gpus: u32) {
        let d = self.pool.deployment(name, 1, gpus).unwrap();
        let mut spec = d.spec.template.spec.clone().unwrap();
        spec.termination_grace_period_seconds = Some(0);
        let pod = Pod {
            metadata: kube::api::ObjectMeta {
                name: Some(name.to_string()),
                labels: d.spec.template.metadata.and_then(|m| m.labels),
                ..Default::default()
            },
            spec: Some(spec),
            ..Default::default()
        };
        let api: Api<Pod> = Api::namespaced(self.client.clone(), self.ns.name());
        api.create(&PostParams::default(), &pod).await.unwrap();
        wait_for(&format!("{name} to be unschedulable"), T, || async {
            let p = api.get(name).await?;
            Ok(p.status
                .and_then(|s| s.conditions)
                .into_iter()
                .flatten()
                .any(|c| {
                    c.type_ == "PodScheduled"
                        && c.status == "False"
                        && c.reason.as_deref() == Some("Unschedulable")
                })
                .then_some(()))
        })
        .await
        .unwrap();
    }

    /// The node of the Running `train-8gpu` pod, once it runs.
    pub async fn training_job_running(&self, timeout: Duration) -> String {
        wait_for("train-8gpu to be Running", timeout, || async {
            let ps = pods(&self.client, self.ns.name(), "app=train-8gpu").await?;
            Ok(ps
                .iter()
                .find(|p| pod_ready(p))
                .and_then(|p| pod_node(p).map(str::to_string)))
        })
        .await
        .unwrap()
    }

    /// Pool nodes carrying a draining fence (`draining.gpu-defrag.io/<policy>`).
    pub async fn fenced_nodes(&self) -> Vec<String> {
        self.pool.fenced(&self.client).await.unwrap()
    }

    pub async fn uids(&self) -> BTreeMap<String, String> {
        pod_uids(&self.client, self.ns.name()).await.unwrap()
    }

    /// Creates the test's policy with `spec` (named after the namespace, labelled for the
    /// test's operator).
    pub async fn create_policy(&self, spec: Value) {
        create_policy(&self.client, self.name(), self.name(), spec)
            .await
            .unwrap();
    }

    /// Creates the test's DryRun policy ([`Case::spec`]).
    pub async fn dry_run_policy(&self, shapes: Value, limits: Value) {
        self.create_policy(self.spec(shapes, limits)).await;
    }

    /// A DryRun policy for 8-GPU shapes evicting one pod at a time, at most `max_run` per run.
    pub async fn one_at_a_time_policy(&self, max_run: i64) {
        self.dry_run_policy(
            json!([{"gpus": 8}]),
            json!({"maxEvictionsPerRun": max_run, "maxEvictionsPerNode": 8,
                   "maxEvictionsPerNamespace": 20, "maxInFlight": 1}),
        )
        .await;
    }

    /// The plan's `totalMoves` once the operator has published a non-empty dry-run plan.
    pub async fn planned_moves(&self) -> i64 {
        let st = wait_status(&self.client, self.name(), "a dry-run plan", T, |s| {
            int_at(s, "/plan/totalMoves").unwrap_or(0) > 0
        })
        .await
        .unwrap();
        int_at(&st, "/plan/totalMoves").unwrap()
    }

    /// Switches the policy to Enforce in a window that opened this minute (open for the
    /// hour, with the same end across restarts).
    pub async fn enforce_now(&self) {
        patch_policy(
            &self.client,
            self.name(),
            json!({"mode": "Enforce", "windows": [open_window_this_minute()]}),
        )
        .await
        .unwrap();
    }

    /// The active run once it has recorded its first eviction.
    pub async fn first_eviction(&self) -> Value {
        wait_for("the first eviction of the run", RUN_TIMEOUT, || async {
            let st = policy_status(&self.client, self.name()).await?;
            Ok(st
                .get("activeRun")
                .filter(|a| int_at(a, "/evicted").unwrap_or(0) >= 1)
                .cloned())
        })
        .await
        .unwrap()
    }

    /// The policy's status once its run has finished (no active run, a finished last run).
    pub async fn finished_run(&self) -> Value {
        wait_status(
            &self.client,
            self.name(),
            "the run to finish",
            RUN_TIMEOUT,
            has_finished_run,
        )
        .await
        .unwrap()
    }

    pub async fn cleanup(&self, policies: &[&str]) {
        for p in policies {
            delete_policy(&self.client, p).await.unwrap();
        }
    }
}

/// Whether the status shows no active run and a finished last run.
pub fn has_finished_run(st: &Value) -> bool {
    st.get("activeRun").is_none()
        && st
            .pointer("/lastRuns/0/finishedAt")
            .is_some_and(|v| v.is_string())
}

/// `evictedPerNode` of a run record.
pub fn evicted_per_node(run: &Value) -> BTreeMap<String, i64> {
    run.get("evictedPerNode")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_i64().unwrap_or(0)))
                .collect()
        })
        .unwrap_or_default()
}

/// Holds back replacements in the case's namespace: a ResourceQuota allowing `fewer` pods
/// fewer than run now, so the pods that replace the next `fewer` evicted ones cannot be
/// created (their ReplicaSets retry) until [`release_replacements`]. A run waiting for
/// one stays in the middle of its plan for as long as a test needs.
pub async fn hold_replacements(c: &Case, fewer: usize) {
    let live = pods(&c.client, c.ns.name(), "").await.unwrap().len();
    let quotas: Api<ResourceQuota> = Api::namespaced(c.client.clone(), c.ns.name());
    let quota: ResourceQuota = serde_json::from_value(json!({
        "metadata": {"name": "hold-replacements"},
        "spec": {"hard": {"pods": (live - fewer).to_string()}},
    }))
    .unwrap();
    quotas.create(&PostParams::default(), &quota).await.unwrap();
    // Admission needs the quota's usage, computed by the controller manager.
    wait_for("the quota's usage to be known", T, || async {
        let q = quotas.get("hold-replacements").await?;
        Ok(q.status
            .and_then(|s| s.used)
            .is_some_and(|u| u.contains_key("pods"))
            .then_some(()))
    })
    .await
    .unwrap();
}

/// Lets replacements be created again ([`hold_replacements`]).
pub async fn release_replacements(c: &Case) {
    let quotas: Api<ResourceQuota> = Api::namespaced(c.client.clone(), c.ns.name());
    quotas
        .delete("hold-replacements", &Default::default())
        .await
        .unwrap();
}
