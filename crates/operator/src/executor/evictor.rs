//! The evictor: the only caller of the Eviction API, for real and server-side dry-run
//! evictions. It returns what the API server answered as an [`EvictionResult`] and owns
//! the eviction events and the `gpu_defrag_evictions_total` counts.
use gpu_defrag_api::v1alpha1::{DefragPolicy, DryRunCheck};
use gpu_defrag_core::plan::{Move, Plan};
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::api::{Api, EvictParams, PostParams};
use kube::runtime::events::EventType;
use kube::{Client, Resource, ResourceExt};

use crate::context::{Ctx, EventReason, Events};
use crate::metrics::Metrics;
use crate::status;

pub use super::outcome::EvictionResult;

/// Planned evictions checked server-side (dry run) per plan.
pub const DRY_RUN_CHECKS: usize = 20;

/// Evicts the pods of one policy's plan.
pub struct Evictor {
    client: Client,
    metrics: Metrics,
    events: Events,
    policy: String,
    policy_ref: ObjectReference,
}

impl Evictor {
    /// An evictor for `policy`: its events go on the policy, its counts under its name.
    pub fn new(client: Client, metrics: Metrics, events: Events, policy: &DefragPolicy) -> Self {
        Evictor {
            client,
            metrics,
            events,
            policy: policy.name_any(),
            policy_ref: policy.object_ref(&()),
        }
    }

    /// The evictor of `policy` with the operator's client, metrics and events.
    pub fn of(ctx: &Ctx, policy: &DefragPolicy) -> Self {
        Self::new(
            ctx.client.clone(),
            ctx.metrics.clone(),
            ctx.events.clone(),
            policy,
        )
    }

    /// Asks the API server to evict `pod` for the planned move `m` (never a delete: the
    /// PodDisruptionBudgets apply). Counts the answer and publishes an event on the policy
    /// (`Evicted`, `EvictionBlocked`, `EvictionFailed`; none for a pod already gone).
    pub async fn evict(&self, m: &Move, pod: &Pod) -> EvictionResult {
        let (ns, name) = (pod.namespace().unwrap_or_default(), pod.name_any());
        let answer = Api::<Pod>::namespaced(self.client.clone(), &ns)
            .evict(&name, &EvictParams::default())
            .await;
        let result = classify(answer.map(|_| ()));
        if let Some(label) = result.metric() {
            self.metrics.eviction(&self.policy, label);
        }
        let (type_, reason, note) = match &result {
            EvictionResult::Evicted => (
                EventType::Normal,
                EventReason::Evicted,
                format!(
                    "evicted {} from {} ({}); expected to land on {}",
                    m.pod, m.from_node, m.reason, m.to_node
                ),
            ),
            EvictionResult::Blocked(why) => (
                EventType::Warning,
                EventReason::EvictionBlocked,
                format!("{}: {why}", m.pod),
            ),
            EvictionResult::Refused(e) | EvictionResult::Unanswered(e) => (
                EventType::Warning,
                EventReason::EvictionFailed,
                format!("{}: {e}", m.pod),
            ),
            EvictionResult::Gone => return result,
        };
        self.events
            .publish(
                &self.policy_ref,
                type_,
                reason,
                note,
                Some(pod.object_ref(&())),
            )
            .await;
        result
    }

    /// Server-side dry run (`dryRun=All`) of the first [`DRY_RUN_CHECKS`] planned
    /// evictions: would the API server (the PodDisruptionBudgets) allow them?
    pub async fn dry_run_check(&self, plan: &Plan) -> DryRunCheck {
        let mut out = DryRunCheck::default();
        let params = EvictParams {
            post_options: PostParams {
                dry_run: true,
                field_manager: None,
            },
            delete_options: None,
        };
        for m in plan.moves.iter().take(DRY_RUN_CHECKS) {
            let Some((ns, name)) = m.pod.split_once('/') else {
                continue;
            };
            let answer = Api::<Pod>::namespaced(self.client.clone(), ns)
                .evict(name, &params)
                .await;
            let refusal = match answer {
                Ok(_) => {
                    out.allowed += 1;
                    continue;
                }
                Err(kube::Error::Api(s)) if s.code == 429 => {
                    out.blocked += 1;
                    s.message.clone()
                }
                Err(e) => {
                    out.failed += 1;
                    e.to_string()
                }
            };
            if out.blocked_pods.len() < 10 {
                out.blocked_pods
                    .push(status::truncate(&format!("{}: {refusal}", m.pod), 200));
            }
        }
        for _ in 0..out.allowed {
            self.metrics.eviction(&self.policy, "dry_run_allowed");
        }
        for _ in 0..out.blocked {
            self.metrics.eviction(&self.policy, "dry_run_blocked");
        }
        out
    }
}

/// What an answer of the Eviction API means.
fn classify(answer: Result<(), kube::Error>) -> EvictionResult {
    match answer {
        Ok(()) => EvictionResult::Evicted,
        Err(kube::Error::Api(s)) if s.code == 429 => EvictionResult::Blocked(s.message.clone()),
        Err(kube::Error::Api(s)) if s.code == 404 => EvictionResult::Gone,
        Err(e @ kube::Error::Api(_)) => EvictionResult::Refused(e.to_string()),
        Err(e) => EvictionResult::Unanswered(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use gpu_defrag_api::v1alpha1::DefragPolicySpec;
    use http::{Request, Response};
    use http_body_util::BodyExt;
    use kube::runtime::events::{Recorder, Reporter};
    use serde_json::{Value, json};

    use super::*;

    /// A request the mocked API server saw: method, path and query, and its JSON body.
    type Seen = Arc<Mutex<Vec<(String, Value)>>>;

    /// A mocked API server: an eviction of pod `<name>` is answered by `answer(name)` (an
    /// HTTP status, or no answer at all); events are created as sent.
    fn mocked(answer: fn(&str) -> Option<u16>) -> (Client, Seen) {
        let seen: Seen = Arc::default();
        let log = seen.clone();
        let service = tower::service_fn(move |req: Request<kube::client::Body>| {
            let log = log.clone();
            async move {
                let target = format!("{} {}", req.method(), req.uri());
                let body = req.into_body().collect().await?.to_bytes();
                let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                log.lock().unwrap().push((target.clone(), body.clone()));
                let path = target.split('?').next().unwrap_or_default().to_string();
                let (code, reply) = if path.ends_with("/eviction") {
                    let pod = path.rsplit('/').nth(1).unwrap_or_default();
                    let Some(code) = answer(pod) else {
                        return Err::<Response<kube::client::Body>, kube::Error>(
                            kube::Error::Service("connection reset".into()),
                        );
                    };
                    let status = if code < 300 { "Success" } else { "Failure" };
                    let message = format!("answer {code} for {pod}");
                    (
                        code,
                        json!({"kind": "Status", "apiVersion": "v1", "status": status,
                               "message": message, "code": code}),
                    )
                } else {
                    (201, body)
                };
                Ok(Response::builder()
                    .status(code)
                    .header("content-type", "application/json")
                    .body(kube::client::Body::from(
                        serde_json::to_vec(&reply).unwrap(),
                    ))
                    .unwrap())
            }
        });
        (Client::new(service, "default"), seen)
    }

    fn evictor(client: Client, metrics: &Metrics) -> Evictor {
        let policy = DefragPolicy::new(
            "nightly",
            serde_json::from_value::<DefragPolicySpec>(json!({})).unwrap(),
        );
        let reporter = Reporter {
            controller: "gpu-defrag".into(),
            instance: None,
        };
        let events = Events::new(Recorder::new(client.clone(), reporter));
        Evictor::new(client, metrics.clone(), events, &policy)
    }

    fn planned(name: &str) -> (Move, Pod) {
        let m = Move {
            pod: format!("ml/{name}"),
            pod_index: 0,
            from_node: "n1".into(),
            from_devices: Vec::new(),
            to_node: "n2".into(),
            to_devices: Vec::new(),
            batch: 0,
            reason: "drain n1".into(),
        };
        let pod = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}")}
        }))
        .unwrap();
        (m, pod)
    }

    /// The reasons of the events the mocked server received.
    fn event_reasons(seen: &Seen) -> Vec<String> {
        seen.lock()
            .unwrap()
            .iter()
            .filter(|(target, _)| target.contains("/events"))
            .map(|(_, body)| body["reason"].as_str().unwrap_or_default().to_string())
            .collect()
    }

    fn count(metrics: &Metrics, result: &str) -> String {
        let text = metrics.encode();
        let key = format!("gpu_defrag_evictions_total{{policy=\"nightly\",result=\"{result}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(key.as_str()))
            .unwrap_or("absent")
            .to_string()
    }

    #[tokio::test]
    async fn every_answer_of_the_eviction_api_has_its_own_outcome_event_and_count() {
        let (client, seen) = mocked(|pod| match pod {
            "ok" => Some(201),
            "pdb" => Some(429),
            "gone" => Some(404),
            "forbidden" => Some(403),
            "broken" => Some(500),
            _ => None,
        });
        let metrics = Metrics::new();
        let e = evictor(client, &metrics);
        let mut results = Vec::new();
        for name in ["ok", "pdb", "gone", "forbidden", "broken", "silent"] {
            let (m, pod) = planned(name);
            results.push(e.evict(&m, &pod).await);
        }
        assert_eq!(results[0], EvictionResult::Evicted);
        assert_eq!(
            results[1],
            EvictionResult::Blocked("answer 429 for pdb".into())
        );
        assert_eq!(results[2], EvictionResult::Gone);
        assert!(matches!(&results[3], EvictionResult::Refused(e) if e.contains("answer 403")));
        assert!(matches!(&results[4], EvictionResult::Refused(e) if e.contains("answer 500")));
        assert!(
            matches!(&results[5], EvictionResult::Unanswered(e) if e.contains("connection reset"))
        );
        assert_eq!(
            event_reasons(&seen),
            [
                "Evicted",
                "EvictionBlocked",
                "EvictionFailed",
                "EvictionFailed",
                "EvictionFailed"
            ],
            "no event for a pod already gone"
        );
        assert_eq!(
            (
                count(&metrics, "done"),
                count(&metrics, "blocked"),
                count(&metrics, "failed")
            ),
            ("1".into(), "1".into(), "3".into())
        );
        // Evictions only: never a delete, never a dry run.
        let requests = seen.lock().unwrap().clone();
        let evictions: Vec<&String> = requests
            .iter()
            .map(|(t, _)| t)
            .filter(|t| t.contains("/eviction"))
            .collect();
        assert_eq!(evictions.len(), 6);
        assert!(
            evictions
                .iter()
                .all(|t| t.starts_with("POST /api/v1/namespaces/ml/pods/"))
        );
        assert!(evictions.iter().all(|t| !t.contains("dryRun")));
        assert!(requests.iter().all(|(t, _)| !t.starts_with("DELETE")));
    }

    #[tokio::test]
    async fn the_dry_run_check_asks_the_server_without_evicting_and_names_refusals() {
        let (client, seen) = mocked(|pod| match pod {
            "pdb" => Some(429),
            "broken" => Some(500),
            _ => Some(201),
        });
        let metrics = Metrics::new();
        let e = evictor(client, &metrics);
        let mut plan = gpu_defrag_core::plan::plan(
            &gpu_defrag_core::model::Cluster::default(),
            &gpu_defrag_core::policy::Policy::default(),
            None,
            &Default::default(),
        );
        for name in ["a", "pdb", "broken"]
            .into_iter()
            .chain(std::iter::repeat_n("x", DRY_RUN_CHECKS + 5))
        {
            plan.moves.push(planned(name).0);
        }
        let c = e.dry_run_check(&plan).await;
        assert_eq!(
            (c.allowed, c.blocked, c.failed),
            (DRY_RUN_CHECKS as i64 - 2, 1, 1)
        );
        assert_eq!(c.blocked_pods[0], "ml/pdb: answer 429 for pdb");
        assert!(
            c.blocked_pods[1].starts_with("ml/broken: "),
            "{:?}",
            c.blocked_pods
        );
        let requests = seen.lock().unwrap().clone();
        assert_eq!(
            requests.len(),
            DRY_RUN_CHECKS,
            "only the first planned evictions"
        );
        assert!(
            requests
                .iter()
                .all(|(t, _)| t.contains("/eviction?") && t.contains("dryRun=All"))
        );
        assert!(
            event_reasons(&seen).is_empty(),
            "a dry run publishes no event"
        );
        assert_eq!(count(&metrics, "dry_run_blocked"), "1");
        assert!(
            matches!(count(&metrics, "done").as_str(), "absent" | "0"),
            "a dry run evicts nothing"
        );
    }
}
