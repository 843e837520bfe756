//! The DefragPolicy controller: the watches that feed the caches, the wiring of the
//! kube-runtime controller, retries.
//!
//! A reconcile ([`reconcile`]) is a pipeline of named steps; its decisions are pure
//! ([`decide`]); runs are the executor's ([`crate::executor`]).
pub mod decide;
pub mod reconcile;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use gpu_defrag_api::v1alpha1::DefragPolicy;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, ListParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::finalizer::{Event as FinalizerEvent, finalizer};
use kube::runtime::reflector;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use tokio::sync::Mutex;
use tracing::{info, warn};

use crate::context::{Ctx, Error, Events};
use crate::dra::DraObjects;
use crate::executor::fences;
use crate::idle::IdleSource;
use crate::koord::Devices;
use crate::landing::Landing;
use crate::lease::LeaderState;
use crate::metrics::Metrics;
use crate::objects::{CachedPod, cached_pod_event, trim_node};
use crate::owners::Owners;
pub use reconcile::reconcile;

/// Name of the finalizer that guarantees a deleted policy's fences are taken back, also
/// when the operator was down at the time.
pub const FINALIZER: &str = "gpu-defrag.io/fences";

/// How often (and once at start, as leader) fences of policies that no longer exist are
/// looked for.
pub const ORPHAN_SWEEP_EVERY: Duration = Duration::from_secs(300);

/// One reconcile of a policy: behind the finalizer ([`reconcile`] while it lives,
/// [`reconcile::cleanup`] once it is deleted); a success resets its retry backoff.
async fn reconcile_and_reset_backoff(
    dp: Arc<DefragPolicy>,
    ctx: Arc<Ctx>,
) -> Result<Action, Error> {
    let r = match reconcile::gate(&ctx) {
        Some(wait) => Ok(Action::requeue(wait)),
        None => {
            let api: Api<DefragPolicy> = Api::all(ctx.client.clone());
            let c = ctx.clone();
            finalizer(&api, FINALIZER, dp.clone(), |event| async move {
                match event {
                    FinalizerEvent::Apply(dp) => reconcile(dp, c).await,
                    FinalizerEvent::Cleanup(dp) => reconcile::cleanup(dp, c).await,
                }
            })
            .await
            .map_err(Error::from)
        }
    };
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
    /// Namespace of the landing-control ConfigMap.
    pub landing_namespace: String,
    /// Name of the landing-control ConfigMap (and the label value of the pods it holds).
    pub landing_configmap: String,
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
    let (pods, pods_w) = reflector::store::<CachedPod>();
    let (pdbs, pdbs_w) = reflector::store::<PodDisruptionBudget>();
    let (tx, rx) = tokio::sync::mpsc::channel::<()>(1);
    spawn_core_watches(&client, nodes_w, pods_w, pdbs_w, &tx);
    let devices = Devices::start(client.clone(), poke(&tx)).await;
    let owners = Owners::start(client.clone(), poke(&tx)).await;
    let dra = DraObjects::start(client.clone(), poke(&tx)).await;
    let controller = policy_controller(policies, &opts.policy_selector, tokio_stream_from(rx));
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        nodes: nodes.clone(),
        pods: pods.clone(),
        pdbs: pdbs.clone(),
        policies: controller.store(),
        metrics,
        leader,
        // One recorder for every event, so repeats are merged into a count.
        events: Events::new(Recorder::new(
            client.clone(),
            Reporter {
                controller: "gpu-defrag".into(),
                instance: Some(opts.identity),
            },
        )),
        runs: Mutex::new(HashMap::new()),
        devices: devices.clone(),
        owners: owners.clone(),
        dra: dra.clone(),
        failures: Default::default(),
        dry_checks: Mutex::new(HashMap::new()),
        idle: opts.idle.clone(),
        caches_ready: Arc::new(std::sync::atomic::AtomicBool::new(false)),
        landing: Arc::new(Landing::new(
            client.clone(),
            &opts.landing_namespace,
            &opts.landing_configmap,
        )),
    });
    // Landing control: held replacements nominated and released, every second.
    tokio::spawn(ctx.landing.clone().run(
        ctx.pods.clone(),
        ctx.policies.clone(),
        ctx.leader.clone(),
        ctx.metrics.clone(),
        ctx.caches_ready.clone(),
    ));
    // GPU activity: refreshed in the background; a change reconciles every policy.
    if let Some(src) = opts.idle.clone() {
        let tx = tx.clone();
        tokio::spawn(src.run(ctx.metrics.clone(), ctx.leader.clone(), move || {
            let _ = tx.try_send(());
        }));
    }
    // Series of deleted policies are dropped from /metrics.
    tokio::spawn(forget_deleted_policies(
        ctx.policies.clone(),
        ctx.metrics.clone(),
    ));
    // Fences of policies that no longer exist are removed (at start, then periodically).
    tokio::spawn(sweep_orphan_fences(ctx.clone()));
    // Ready once the caches are filled.
    let (n, p, b) = (nodes.clone(), pods.clone(), pdbs.clone());
    let (ready2, caches) = (ready.clone(), ctx.caches_ready.clone());
    tokio::spawn(async move {
        let _ = tokio::join!(
            n.wait_until_ready(),
            p.wait_until_ready(),
            b.wait_until_ready(),
            devices.wait_until_ready(),
            owners.wait_until_ready(),
            dra.wait_until_ready()
        );
        caches.store(true, std::sync::atomic::Ordering::SeqCst);
        ready2.store(true, std::sync::atomic::Ordering::SeqCst);
    });
    controller
        .shutdown_on_signal()
        .run(reconcile_and_reset_backoff, error_policy, ctx.clone())
        .for_each(|r| async move {
            if let Err(e) = r {
                warn!(error = %e, "controller");
            }
        })
        .await;
    // Nothing stays held by a process that stops.
    ctx.landing.shutdown(&ctx.pods, &ctx.leader).await;
    Ok(())
}

/// Watches nodes, pods and PodDisruptionBudgets into their caches (`*_w`), and pokes
/// `tx` at every change.
fn spawn_core_watches(
    client: &Client,
    nodes_w: reflector::store::Writer<Node>,
    pods_w: reflector::store::Writer<CachedPod>,
    pdbs_w: reflector::store::Writer<PodDisruptionBudget>,
    tx: &tokio::sync::mpsc::Sender<()>,
) {
    let cfg = watcher::Config::default().any_semantic();
    let node_stream = watcher(Api::<Node>::all(client.clone()), cfg.clone())
        .modify(trim_node)
        .default_backoff()
        .reflect(nodes_w)
        .touched_objects();
    // The cache holds each pod's projection (`CachedPod`), not the object.
    let pod_stream = reflector::reflector(
        pods_w,
        watcher(Api::<Pod>::all(client.clone()), cfg.clone())
            .map_ok(cached_pod_event)
            .default_backoff(),
    )
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
}

/// A change callback that pokes `tx` (a trigger already pending is enough).
fn poke(tx: &tokio::sync::mpsc::Sender<()>) -> impl Fn() + Clone + Send + Sync + 'static {
    let tx = tx.clone();
    move || {
        let _ = tx.try_send(());
    }
}

/// The DefragPolicy controller: the policies `selector` picks (all when empty),
/// every one reconciled again at each cluster change `trigger` yields.
fn policy_controller(
    policies: Api<DefragPolicy>,
    selector: &str,
    trigger: impl futures::Stream<Item = ()> + Send + 'static,
) -> Controller<DefragPolicy> {
    let mut pcfg = watcher::Config::default().any_semantic();
    if !selector.is_empty() {
        pcfg = pcfg.labels(selector);
    }
    Controller::new(policies, pcfg)
        // A short debounce only merges a policy's own bursts: kube's debounce restarts on
        // every new request, so with cluster changes more often than it lasts no reconcile
        // would ever run. Cluster changes are throttled instead (`tokio_stream_from`).
        .with_config(
            kube::runtime::controller::Config::default().debounce(Duration::from_millis(100)),
        )
        .reconcile_all_on(trigger)
}

/// Every 30 s, drops the metric series of the policies gone from `store` since the last
/// look.
async fn forget_deleted_policies(store: reflector::Store<DefragPolicy>, metrics: Metrics) {
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
}

/// Removes the fences of policies that no longer exist, once the caches are full and this
/// replica leads, then every [`ORPHAN_SWEEP_EVERY`]. Every policy of the cluster counts,
/// whatever operator (`--policy-selector`) reconciles it.
async fn sweep_orphan_fences(ctx: Arc<Ctx>) {
    loop {
        if ctx.leader.is_leader() && ctx.caches_ready.load(std::sync::atomic::Ordering::SeqCst) {
            // Nodes first: a fence seen here is older than the policy list below.
            let nodes = ctx.nodes.state();
            let rules = ctx.dra.rules();
            let api: Api<DefragPolicy> = Api::all(ctx.client.clone());
            match api.list_metadata(&ListParams::default()).await {
                Ok(list) => {
                    let names = list.items.iter().map(|p| p.name_any()).collect();
                    match fences::remove_orphans(&ctx.client, &nodes, &rules, &names).await {
                        Ok(0) => {}
                        Ok(n) => {
                            info!(nodes = n, "removed fences of policies that no longer exist")
                        }
                        Err(e) => warn!(error = %e, "could not remove fences of deleted policies"),
                    }
                }
                Err(e) => {
                    warn!(error = %crate::apiclient::error_line(&e), "could not list policies for the fence sweep")
                }
            }
            tokio::time::sleep(ORPHAN_SWEEP_EVERY).await;
        } else {
            tokio::time::sleep(Duration::from_secs(1)).await;
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
