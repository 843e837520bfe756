//! The evictor: the only caller of the Eviction API, for real and server-side dry-run
//! evictions. It returns what the API server answered as an [`EvictionResult`] and owns
//! the eviction events and the `gpu_defrag_evictions_total` counts.
use gpu_defrag_api::v1alpha1::{DefragPolicy, DryRunCheck};
use gpu_defrag_core::compact::CompactPod;
use gpu_defrag_core::plan::{Move, Plan};
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::api::Api;
use kube::runtime::events::EventType;
use kube::{Client, Resource, ResourceExt};

use crate::context::{Ctx, EventReason, Events};
use crate::metrics::{Eviction, Metrics};
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
    /// PodDisruptionBudgets apply), only if it is still the pod with `uid` (a
    /// precondition: a new pod under the same name is never evicted in its place). An
    /// answer is counted and announced at once ([`Evictor::report`]); an unanswered one
    /// (no answer, a timeout, a 5xx: it may have happened) is left to the caller to
    /// confirm and report.
    pub async fn evict(&self, m: &Move, pod: &CompactPod, uid: &str) -> EvictionResult {
        let answer = self
            .post_eviction(&pod.namespace, &pod.name, Some(uid), false)
            .await;
        let result = classify(answer);
        if !matches!(result, EvictionResult::Unanswered(_)) {
            self.report(m, pod, &result).await;
        }
        result
    }

    /// Whether an eviction that got no answer happened: the pod is asked for (with backoff
    /// while the API server fails) until it is seen gone, replaced or terminating
    /// (`Evicted`) or still there (`Refused`), at most until `deadline` (`Unanswered`).
    pub async fn confirm(
        &self,
        pod: &CompactPod,
        uid: &str,
        deadline: tokio::time::Instant,
    ) -> EvictionResult {
        let name = &pod.name;
        let api = Api::<Pod>::namespaced(self.client.clone(), &pod.namespace);
        let mut wait = std::time::Duration::from_secs(1);
        loop {
            let last = match api.get(name).await {
                Err(kube::Error::Api(s)) if s.code == 404 => return EvictionResult::Evicted,
                Ok(p) if p.metadata.uid.as_deref() != Some(uid) => return EvictionResult::Evicted,
                Ok(p) if p.metadata.deletion_timestamp.is_some() => return EvictionResult::Evicted,
                Ok(_) => {
                    return EvictionResult::Refused(
                        "the eviction got no answer and the pod is still there".into(),
                    );
                }
                Err(e) => e.to_string(),
            };
            if tokio::time::Instant::now() + wait > deadline {
                return EvictionResult::Unanswered(last);
            }
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(std::time::Duration::from_secs(16));
        }
    }

    /// Counts an eviction's result and publishes its event on the policy (`Evicted`,
    /// `EvictionBlocked`, `EvictionFailed`; none for a pod already gone).
    pub async fn report(&self, m: &Move, pod: &CompactPod, result: &EvictionResult) {
        if let Some(label) = result.metric() {
            self.metrics.eviction(&self.policy, label);
        }
        let (type_, reason, note) = match result {
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
            EvictionResult::Gone => return,
        };
        self.events
            .publish(
                &self.policy_ref,
                type_,
                reason,
                note,
                Some(pod.object_reference()),
            )
            .await;
    }

    /// Announces a planned eviction that is not sent (`EvictionSkipped`), and why.
    pub async fn skipped(&self, m: &Move, pod: Option<&CompactPod>, why: String) {
        self.events
            .publish(
                &self.policy_ref,
                EventType::Warning,
                EventReason::EvictionSkipped,
                format!("{}: not evicted: {why}", m.pod),
                pod.map(|p| p.object_reference()),
            )
            .await;
    }

    /// Server-side dry run (`dryRun=All`) of the first [`DRY_RUN_CHECKS`] planned
    /// evictions: would the API server (the PodDisruptionBudgets) allow them?
    pub async fn dry_run_check(&self, plan: &Plan) -> DryRunCheck {
        let mut out = DryRunCheck::default();
        for m in plan.moves.iter().take(DRY_RUN_CHECKS) {
            let Some((ns, name)) = m.pod.split_once('/') else {
                continue;
            };
            let answer = self.post_eviction(ns, name, None, true).await;
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
            self.metrics.eviction(&self.policy, Eviction::DryRunAllowed);
        }
        for _ in 0..out.blocked {
            self.metrics.eviction(&self.policy, Eviction::DryRunBlocked);
        }
        out
    }
}

impl Evictor {
    /// POSTs an `Eviction` of pod `ns/name` (`policy/v1`), with `uid` as a precondition,
    /// or as a server-side dry run. Built here rather than with kube's `Api::evict`, whose
    /// body names the delete options `delete_options`: the API server ignores that field,
    /// so a precondition set through it would silently not apply.
    async fn post_eviction(
        &self,
        ns: &str,
        name: &str,
        uid: Option<&str>,
        dry_run: bool,
    ) -> Result<(), kube::Error> {
        let mut body = serde_json::json!({
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": ns},
        });
        if let Some(uid) = uid {
            body["deleteOptions"] = serde_json::json!({"preconditions": {"uid": uid}});
        }
        let mut uri = format!("/api/v1/namespaces/{ns}/pods/{name}/eviction");
        if dry_run {
            uri.push_str("?dryRun=All");
        }
        let req = http::Request::post(uri)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(serde_json::to_vec(&body).map_err(kube::Error::SerdeError)?)
            .map_err(kube::Error::HttpError)?;
        self.client
            .request::<k8s_openapi::apimachinery::pkg::apis::meta::v1::Status>(req)
            .await
            .map(|_| ())
    }
}

/// What an answer of the Eviction API means. A 409 is the UID precondition: the pod of
/// the plan is gone, another one has its name. A 5xx may have been evicted.
fn classify(answer: Result<(), kube::Error>) -> EvictionResult {
    match answer {
        Ok(()) => EvictionResult::Evicted,
        Err(kube::Error::Api(s)) if s.code == 429 => EvictionResult::Blocked(s.message.clone()),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => EvictionResult::Gone,
        Err(e @ kube::Error::Api(_)) if matches!(&e, kube::Error::Api(s) if s.code >= 500) => {
            EvictionResult::Unanswered(e.to_string())
        }
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

    fn planned(name: &str) -> (Move, CompactPod) {
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
        let pod = CompactPod::of(
            &serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}")}
            }))
            .unwrap(),
        );
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
            "replaced" => Some(409),
            "forbidden" => Some(403),
            "broken" => Some(500),
            _ => None,
        });
        let metrics = Metrics::new();
        let e = evictor(client, &metrics);
        let mut results = Vec::new();
        for name in [
            "ok",
            "pdb",
            "gone",
            "replaced",
            "forbidden",
            "broken",
            "silent",
        ] {
            let (m, pod) = planned(name);
            results.push(e.evict(&m, &pod, &format!("uid-{name}")).await);
        }
        assert_eq!(results[0], EvictionResult::Evicted);
        assert_eq!(
            results[1],
            EvictionResult::Blocked("answer 429 for pdb".into())
        );
        assert_eq!(results[2], EvictionResult::Gone);
        assert_eq!(
            results[3],
            EvictionResult::Gone,
            "the UID precondition failed: another pod has the name"
        );
        assert!(matches!(&results[4], EvictionResult::Refused(e) if e.contains("answer 403")));
        // A 5xx or no answer may have evicted: unknown, left to confirm.
        assert!(matches!(&results[5], EvictionResult::Unanswered(e) if e.contains("answer 500")));
        assert!(
            matches!(&results[6], EvictionResult::Unanswered(e) if e.contains("connection reset"))
        );
        assert_eq!(
            event_reasons(&seen),
            ["Evicted", "EvictionBlocked", "EvictionFailed"],
            "no event for a pod already gone, none yet for an unknown outcome"
        );
        assert_eq!(
            (
                count(&metrics, "done"),
                count(&metrics, "blocked"),
                count(&metrics, "failed")
            ),
            ("1".into(), "1".into(), "1".into())
        );
        // Evictions only: never a delete, never a dry run; each with the pod's UID as a
        // precondition.
        let requests = seen.lock().unwrap().clone();
        let evictions: Vec<&(String, Value)> = requests
            .iter()
            .filter(|(t, _)| t.contains("/eviction"))
            .collect();
        assert_eq!(evictions.len(), 7);
        for (target, body) in &evictions {
            assert!(
                target.starts_with("POST /api/v1/namespaces/ml/pods/"),
                "{target}"
            );
            assert!(!target.contains("dryRun"), "{target}");
            let pod = target.split('/').nth(6).unwrap_or_default();
            assert_eq!(body.pointer("/kind"), Some(&json!("Eviction")), "{body}");
            assert_eq!(
                body.pointer("/deleteOptions/preconditions/uid"),
                Some(&json!(format!("uid-{pod}"))),
                "{body}"
            );
        }
        assert!(requests.iter().all(|(t, _)| !t.starts_with("DELETE")));
    }

    #[tokio::test]
    async fn an_unanswered_eviction_is_confirmed_by_looking_at_the_pod() {
        // GET answers: `gone` 404; `still` the same pod; `terminating` the same pod being
        // deleted; `renamed` another UID; `down` no answer at all.
        let seen: Seen = Arc::default();
        let log = seen.clone();
        let service = tower::service_fn(move |req: Request<kube::client::Body>| {
            let log = log.clone();
            async move {
                let target = format!("{} {}", req.method(), req.uri());
                log.lock().unwrap().push((target.clone(), Value::Null));
                let pod = target.rsplit('/').next().unwrap_or_default().to_string();
                let meta = |uid: &str, deleting: bool| {
                    let mut m = json!({"name": pod, "namespace": "ml", "uid": uid});
                    if deleting {
                        m["deletionTimestamp"] = json!("2026-12-04T02:00:00Z");
                    }
                    json!({"apiVersion": "v1", "kind": "Pod", "metadata": m})
                };
                let (code, body) = match pod.as_str() {
                    "gone" => (
                        404,
                        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": "not found", "code": 404}),
                    ),
                    "still" => (200, meta("uid-still", false)),
                    "terminating" => (200, meta("uid-terminating", true)),
                    "renamed" => (200, meta("uid-other", false)),
                    _ => return Err(kube::Error::Service("connection refused".into())),
                };
                Ok(Response::builder()
                    .status(code)
                    .header("content-type", "application/json")
                    .body(kube::client::Body::from(serde_json::to_vec(&body).unwrap()))
                    .unwrap())
            }
        });
        let metrics = Metrics::new();
        let e = evictor(Client::new(service, "default"), &metrics);
        let soon = tokio::time::Instant::now() + std::time::Duration::from_millis(1500);
        let confirm = |name: &'static str| {
            let (_, pod) = planned(name);
            let e = &e;
            async move { e.confirm(&pod, &format!("uid-{name}"), soon).await }
        };
        assert_eq!(confirm("gone").await, EvictionResult::Evicted);
        assert_eq!(confirm("terminating").await, EvictionResult::Evicted);
        assert_eq!(confirm("renamed").await, EvictionResult::Evicted);
        assert!(matches!(confirm("still").await, EvictionResult::Refused(_)));
        assert!(
            matches!(confirm("down").await, EvictionResult::Unanswered(e) if e.contains("connection refused"))
        );
        let gets = seen
            .lock()
            .unwrap()
            .iter()
            .filter(|(t, _)| t.ends_with("/down"))
            .count();
        assert!(gets >= 2, "asked again after a failure ({gets})");
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
