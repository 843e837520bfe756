//! API-server faults: kube-apiserver is stopped right after the first eviction of a run
//! and started again (same port, same etcd) some seconds later.
//!
//! ```text
//! fragment ─> Enforce run ─> first eviction ─> SIGTERM kube-apiserver ─> 10 s down
//!   ─> restart ─> the run finishes (resumed or cleaned up) ─> no fence, no pod lost,
//!   the outage in the operator's metrics and as a Warning event on the policy
//! ```
//!
//! Its own test binary: the outage would disturb the other tests of a shared stack.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use gpu_defrag_e2e::{
    case::{Case, RUN_TIMEOUT, T, has_finished_run},
    fixtures::{pods, wait_for},
    operator::{
        Operator, PodWatch, fragment, int_at, metric_sum, str_at, wait_deployments_ready,
        wait_status,
    },
};
use k8s_openapi::api::core::v1::Event;
use kube::{Api, api::ListParams};

/// How long the API server stays down.
const OUTAGE: Duration = Duration::from_secs(10);

#[tokio::test]
async fn apiserver_restart_mid_run_loses_no_pod_and_leaves_no_fence() {
    let c = Case::new("apifault", 4, 8).await;
    let infer = fragment(&c.client, c.name(), &c.pool, &[4, 4, 4, 4])
        .await
        .unwrap();
    let max_run = 8;
    c.one_at_a_time_policy(max_run).await;
    let op = Operator::start(c.cluster, c.name(), &[]).await.unwrap();
    let planned = c.planned_moves().await;
    let watch = PodWatch::start(&c.client, c.name(), &c.pool, c.name())
        .await
        .unwrap();
    c.enforce_now().await;
    let active = c.first_eviction().await;
    let run_id = str_at(&active, "/id").unwrap().to_string();

    // The fault.
    let down_at = Instant::now();
    c.cluster.stop_apiserver(Duration::from_secs(10)).unwrap();
    let stopped_in = down_at.elapsed();
    tokio::time::sleep(OUTAGE).await;
    op.ensure_running().unwrap();
    let during = op.metrics().await.unwrap();
    let reachable_during = metric_sum(&during, "gpu_defrag_api_reachable", &[]);
    let restart_at = Instant::now();
    c.cluster
        .restart_apiserver(Duration::from_secs(90))
        .await
        .unwrap();
    let up_at = Instant::now();
    let restarted_in = up_at - restart_at;
    let down_for = up_at - down_at;
    // Every component survived the outage.
    c.cluster.ensure_running().unwrap();

    // The run ends, and every workload is back.
    let st = wait_status(
        &c.client,
        c.name(),
        "the run to finish after the outage",
        RUN_TIMEOUT,
        has_finished_run,
    )
    .await
    .unwrap();
    let finished_after = up_at.elapsed();
    let run = st.pointer("/lastRuns/0").unwrap().clone();
    assert_eq!(str_at(&run, "/id"), Some(run_id.as_str()), "{st:#}");
    let result = str_at(&run, "/result").unwrap_or("").to_string();
    assert!(
        ["Succeeded", "Partial", "Aborted", "WindowClosed", "Stalled"].contains(&result.as_str()),
        "{run:#}"
    );
    assert_eq!(c.fenced_nodes().await, Vec::<String>::new(), "fences left");
    wait_deployments_ready(&c.client, c.name(), &infer, T)
        .await
        .unwrap();
    let live = pods(&c.client, c.name(), "e2e-role=infer").await.unwrap();
    assert_eq!(live.len(), infer.len(), "a pod was lost");
    let seen = watch.seen();
    assert_eq!(
        seen.violations,
        BTreeMap::new(),
        "pods bound to fenced nodes"
    );
    let gone = seen.gone();
    assert!(
        gone.len() as i64 <= planned.min(max_run),
        "{} pods evicted; planned {planned}, limit {max_run}: {gone:?}",
        gone.len()
    );
    op.ensure_running().unwrap();

    // The fault is reported: metrics, then an event on the policy.
    assert_eq!(
        reachable_during, 0.0,
        "gpu_defrag_api_reachable during the outage"
    );
    let after = op.metrics().await.unwrap();
    let outages = metric_sum(&after, "gpu_defrag_api_outages_total", &[]);
    let unreachable = metric_sum(
        &after,
        "gpu_defrag_api_requests_total",
        &[("outcome", "unreachable")],
    );
    assert!(outages >= 1.0, "gpu_defrag_api_outages_total {outages}");
    assert!(unreachable >= 1.0, "no request seen failing");
    assert_eq!(metric_sum(&after, "gpu_defrag_api_reachable", &[]), 1.0);
    let events: Api<Event> = Api::namespaced(c.client.clone(), "default");
    let event = wait_for("the ApiServerUnavailable event", T, || async {
        let list = events
            .list(&ListParams::default().fields(&format!(
                "involvedObject.name={},reason=ApiServerUnavailable",
                c.name()
            )))
            .await?;
        Ok(list.items.into_iter().next())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}; the operator's log ends: {}", op.log_tail(40)));
    let note = event.message.clone().unwrap_or_default();
    assert!(note.contains("requests failed"), "{note}");
    let retries = metric_sum(
        &after,
        "gpu_defrag_api_requests_total",
        &[("verb", "watch")],
    );
    // An event that could not be published right after the outage is told again later.
    let unpublished = std::fs::read_to_string(op.log())
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("could not publish event") && l.contains("ApiServerUnavailable"))
        .count();
    eprintln!(
        "E2E-FIGURE faults: kube-apiserver stopped after the first eviction of run {run_id} (SIGTERM, exited in {:.1}s), down {:.1}s in all (restart took {:.1}s); the run finished as {result} {:.1}s after the restart; evictions observed {} (recorded {}), planned {planned}; outages {outages}, failed requests {unreachable}, watch requests {retries}; ApiServerUnavailable events that failed to publish and were told again {unpublished}; event: {note}",
        stopped_in.as_secs_f64(),
        down_for.as_secs_f64(),
        restarted_in.as_secs_f64(),
        finished_after.as_secs_f64(),
        gone.len(),
        int_at(&run, "/evicted").unwrap_or(0),
    );
    c.cleanup(&[c.name()]).await;
}
