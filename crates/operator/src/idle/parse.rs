//! Reading Prometheus answers (pure): the instant vector of an answer, and per-pod activity
//! from the SM activity and GPU utilisation series.
use std::collections::{HashMap, HashSet};

use gpu_defrag_core::model::PodActivity;
use serde::Deserialize;

use super::error::QueryError;

/// Series of one metric read at most per answer.
pub const MAX_SERIES: usize = 200_000;

/// What the series said, beside the per-pod activity.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SeriesStats {
    /// GPUs measured by `DCGM_FI_PROF_SM_ACTIVE`.
    pub sm_active: usize,
    /// GPUs measured by `DCGM_FI_DEV_GPU_UTIL` (no SM activity series).
    pub gpu_util: usize,
    /// Series without a pod (free GPUs, or pod mapping off).
    pub without_pod: usize,
    /// Series skipped: NaN or out-of-range values, no GPU identity, a pod without a
    /// namespace. Their pods are not measured.
    pub invalid: usize,
}

/// One element of an instant vector.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Sample {
    /// Labels.
    pub metric: HashMap<String, String>,
    /// `[unix seconds, "value"]`.
    pub value: (f64, String),
}

#[derive(Deserialize)]
struct Answer {
    status: String,
    #[serde(default)]
    data: Option<Data>,
    #[serde(default)]
    error: Option<String>,
}

#[derive(Deserialize)]
struct Data {
    #[serde(rename = "resultType")]
    result_type: String,
    result: Vec<Sample>,
}

/// The instant vector of a `/api/v1/query` answer. Anything else than a successful vector
/// answer is an error; the labels and values of its samples are judged later.
pub fn parse_answer(status: u16, body: &[u8]) -> Result<Vec<Sample>, QueryError> {
    let snippet = || String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
    let parsed: Result<Answer, _> = serde_json::from_slice(body);
    if !(200..300).contains(&status) {
        let message = match &parsed {
            Ok(Answer { error: Some(e), .. }) => e.chars().take(300).collect(),
            _ => snippet(),
        };
        return Err(QueryError::Http { status, message });
    }
    let a = parsed.map_err(|e| QueryError::Malformed(format!("{e} in {:?}", snippet())))?;
    if a.status != "success" {
        return Err(QueryError::Malformed(format!(
            "status {:?}: {}",
            a.status,
            a.error
                .unwrap_or_default()
                .chars()
                .take(300)
                .collect::<String>()
        )));
    }
    let data = a
        .data
        .ok_or_else(|| QueryError::Malformed("no data".into()))?;
    if data.result_type != "vector" {
        return Err(QueryError::Malformed(format!(
            "resultType {:?}, expected vector",
            data.result_type
        )));
    }
    if data.result.len() > MAX_SERIES {
        return Err(QueryError::TooLarge(format!(
            "{} series, at most {MAX_SERIES}",
            data.result.len()
        )));
    }
    Ok(data.result)
}

/// A non-empty label value.
fn label<'a>(m: &'a HashMap<String, String>, k: &str) -> Option<&'a str> {
    m.get(k).map(String::as_str).filter(|v| !v.is_empty())
}

/// `namespace/pod` of a series: `exported_*` (renamed by Prometheus) first. `Ok(None)`:
/// no pod (a free GPU); `Err`: a pod without its namespace.
fn pod_of(m: &HashMap<String, String>) -> Result<Option<String>, ()> {
    let (ns, pod) = match label(m, "exported_pod") {
        Some(p) => (label(m, "exported_namespace"), p),
        None => match label(m, "pod") {
            Some(p) => (label(m, "namespace"), p),
            None => return Ok(None),
        },
    };
    ns.map(|ns| Some(format!("{ns}/{pod}"))).ok_or(())
}

/// The GPU a series is about: `Hostname` and `gpu`, else `UUID` (with the MIG instance,
/// when there is one).
fn gpu_of(m: &HashMap<String, String>) -> Option<String> {
    let mig = label(m, "GPU_I_ID").unwrap_or("");
    match (label(m, "Hostname"), label(m, "gpu"), label(m, "UUID")) {
        (Some(h), Some(g), _) => Some(format!("{h}\u{0}{g}\u{0}{mig}")),
        (_, _, Some(u)) => Some(format!("\u{0}{u}\u{0}{mig}")),
        _ => None,
    }
}

/// The activity (0..=1) of a sample, `None` when not a number in range.
fn activity_value(s: &Sample, scale: f64) -> Option<f64> {
    let v: f64 = s.value.1.trim().parse().ok()?;
    let a = v / scale;
    (a.is_finite() && (0.0..=1.0 + 1e-9).contains(&a)).then_some(a.min(1.0))
}

/// Per-pod activity from the SM activity and GPU utilisation answers: a pod's peak is the
/// highest of its GPUs; a GPU with an SM activity series ignores its utilisation series.
/// A pod with any bad sample is left out (unmeasured, so never idle).
pub fn activity_of(sm: &[Sample], util: &[Sample]) -> (HashMap<String, PodActivity>, SeriesStats) {
    let mut stats = SeriesStats::default();
    let mut peaks: HashMap<String, (f64, HashSet<String>)> = HashMap::new();
    let mut poisoned: HashSet<String> = HashSet::new();
    let with_sm: HashSet<String> = sm.iter().filter_map(|s| gpu_of(&s.metric)).collect();
    for (samples, scale, is_sm) in [(sm, 1.0, true), (util, 100.0, false)] {
        for s in samples {
            let gpu = gpu_of(&s.metric);
            if !is_sm && gpu.as_ref().is_some_and(|g| with_sm.contains(g)) {
                continue;
            }
            let pod = match pod_of(&s.metric) {
                Ok(Some(p)) => p,
                Ok(None) => {
                    stats.without_pod += 1;
                    continue;
                }
                Err(()) => {
                    stats.invalid += 1;
                    continue;
                }
            };
            let (Some(gpu), Some(v)) = (gpu, activity_value(s, scale)) else {
                stats.invalid += 1;
                poisoned.insert(pod);
                continue;
            };
            if is_sm {
                stats.sm_active += 1;
            } else {
                stats.gpu_util += 1;
            }
            let e = peaks.entry(pod).or_insert((0.0, HashSet::new()));
            e.0 = e.0.max(v);
            e.1.insert(gpu);
        }
    }
    let pods = peaks
        .into_iter()
        .filter(|(k, _)| !poisoned.contains(k))
        .map(|(k, (peak, gpus))| {
            (
                k,
                PodActivity {
                    peak,
                    gpus: u32::try_from(gpus.len()).unwrap_or(u32::MAX),
                },
            )
        })
        .collect();
    (pods, stats)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use serde_json::json;

    pub(crate) fn answer(result: serde_json::Value) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "status": "success",
            "data": {"resultType": "vector", "result": result}
        }))
        .unwrap()
    }

    pub(crate) fn series(labels: serde_json::Value, v: &str) -> serde_json::Value {
        json!({"metric": labels, "value": [1_700_000_000.5, v]})
    }

    pub(crate) fn gpu(host: &str, g: &str, ns: &str, pod: &str) -> serde_json::Value {
        json!({"Hostname": host, "gpu": g, "UUID": format!("GPU-{host}-{g}"),
               "modelName": "NVIDIA H100 80GB HBM3", "namespace": ns, "pod": pod,
               "container": "main"})
    }

    fn samples(v: serde_json::Value) -> Vec<Sample> {
        parse_answer(200, &answer(v)).unwrap()
    }

    #[test]
    fn sm_activity_wins_utilisation_is_the_fallback_and_pods_take_their_busiest_gpu() {
        let sm = samples(json!([
            series(gpu("n1", "0", "ml", "idle"), "0.05"),
            series(gpu("n1", "1", "ml", "busy"), "0.9"),
            // Two GPUs of one pod: the busier counts.
            series(gpu("n1", "2", "ml", "pair"), "0.1"),
            series(gpu("n1", "3", "ml", "pair"), "0.4"),
            // A free GPU (dcgm-exporter writes empty pod labels).
            series(gpu("n1", "4", "", ""), "0"),
        ]));
        let util = samples(json!([
            // Has SM activity: its low utilisation is ignored.
            series(gpu("n1", "1", "ml", "busy"), "3"),
            // No SM activity on node n2: utilisation in percent.
            series(gpu("n2", "0", "ml", "util-idle"), "12"),
            series(gpu("n2", "1", "ml", "util-busy"), "95"),
        ]));
        let (pods, stats) = activity_of(&sm, &util);
        let peak = |k: &str| pods.get(k).map(|a| (a.peak, a.gpus));
        assert_eq!(peak("ml/idle"), Some((0.05, 1)));
        assert_eq!(peak("ml/busy"), Some((0.9, 1)));
        assert_eq!(peak("ml/pair"), Some((0.4, 2)));
        assert_eq!(peak("ml/util-idle"), Some((0.12, 1)));
        assert_eq!(peak("ml/util-busy"), Some((0.95, 1)));
        assert_eq!(pods.len(), 5);
        assert_eq!(
            stats,
            SeriesStats {
                sm_active: 4,
                gpu_util: 2,
                without_pod: 1,
                invalid: 0
            }
        );
    }

    #[test]
    fn exported_labels_renamed_by_prometheus_win_over_the_targets_own() {
        // honor_labels: false and a target labelled with the exporter's own pod: Prometheus
        // keeps the exporter's labels as exported_pod / exported_namespace.
        let sm = samples(json!([
            series(
                json!({"Hostname": "n1", "gpu": "0", "pod": "dcgm-exporter-x",
                          "namespace": "gpu-operator", "exported_pod": "train-0",
                          "exported_namespace": "ml"}),
                "0.01"
            ),
            // A free GPU: only the target's labels are left.
            series(
                json!({"Hostname": "n1", "gpu": "1", "pod": "dcgm-exporter-x",
                          "namespace": "gpu-operator"}),
                "0"
            ),
        ]));
        let (pods, _) = activity_of(&sm, &[]);
        assert_eq!(pods["ml/train-0"].peak, 0.01);
        // The exporter's own pod holds no GPU, so the core never counts it.
        assert!(pods.contains_key("gpu-operator/dcgm-exporter-x"));
        assert_eq!(pods.len(), 2);
    }

    #[test]
    fn bad_samples_leave_their_pod_unmeasured_never_idle() {
        let sm = samples(json!([
            series(gpu("n1", "0", "ml", "nan"), "NaN"),
            series(gpu("n1", "1", "ml", "inf"), "+Inf"),
            series(gpu("n1", "2", "ml", "neg"), "-0.5"),
            series(gpu("n1", "3", "ml", "over"), "1.5"),
            series(gpu("n1", "4", "ml", "word"), "idle"),
            // One good GPU and one NaN: the pod is not measured.
            series(gpu("n1", "5", "ml", "mixed"), "0.0"),
            series(gpu("n1", "6", "ml", "mixed"), "NaN"),
            // A pod label without a namespace; a series with no GPU identity.
            series(json!({"Hostname": "n1", "gpu": "7", "pod": "lost"}), "0"),
            series(json!({"namespace": "ml", "pod": "anon"}), "0"),
            series(gpu("n1", "8", "ml", "ok"), " 0.2 "),
        ]));
        let util = samples(json!([series(gpu("n2", "0", "ml", "pct"), "100.5")]));
        let (pods, stats) = activity_of(&sm, &util);
        assert_eq!(pods.keys().collect::<Vec<_>>(), ["ml/ok"]);
        assert_eq!(stats.invalid, 9);
        assert_eq!(stats.sm_active, 2, "mixed/5 and ok");
    }

    #[test]
    fn answers_that_are_not_a_successful_vector_are_errors() {
        let cases: Vec<(u16, Vec<u8>, &str)> = vec![
            (200, b"".to_vec(), "malformed"),
            (200, b"<html>proxy login</html>".to_vec(), "malformed"),
            (200, b"{\"status\":\"success\"".to_vec(), "malformed"),
            (200, b"null".to_vec(), "malformed"),
            (200, b"[]".to_vec(), "malformed"),
            (200, br#"{"status":"success"}"#.to_vec(), "malformed"),
            (
                200,
                br#"{"status":"error","errorType":"bad_data","error":"parse error"}"#.to_vec(),
                "malformed",
            ),
            (
                200,
                br#"{"status":"success","data":{"resultType":"matrix","result":[]}}"#.to_vec(),
                "malformed",
            ),
            (
                200,
                br#"{"status":"success","data":{"resultType":"vector","result":{}}}"#.to_vec(),
                "malformed",
            ),
            // Wrong types: a numeric label, a numeric value string, a short value pair.
            (
                200,
                answer(json!([{"metric": {"pod": 3}, "value": [1.0, "0"]}])),
                "malformed",
            ),
            (
                200,
                answer(json!([{"metric": {}, "value": [1.0, 0.5]}])),
                "malformed",
            ),
            (
                200,
                answer(json!([{"metric": {}, "value": [1.0]}])),
                "malformed",
            ),
            (
                200,
                answer(json!([{"metric": {}, "value": "0.5"}])),
                "malformed",
            ),
            (200, answer(json!([{"value": [1.0, "0.5"]}])), "malformed"),
            (200, vec![0xff, 0xfe, 0x00], "malformed"),
            (
                400,
                br#"{"status":"error","errorType":"bad_data","error":"1:1: parse error"}"#.to_vec(),
                "http_status",
            ),
            (503, b"Service Unavailable".to_vec(), "http_status"),
            (302, b"".to_vec(), "http_status"),
        ];
        for (status, body, kind) in cases {
            let e = parse_answer(status, &body).expect_err(&String::from_utf8_lossy(&body));
            assert_eq!(
                e.kind(),
                kind,
                "{e} for {:?}",
                String::from_utf8_lossy(&body)
            );
        }
        let e = parse_answer(400, br#"{"status":"error","error":"1:1: parse error"}"#).unwrap_err();
        assert_eq!(
            e.to_string(),
            "Prometheus answered HTTP 400: 1:1: parse error"
        );
        // An empty vector is a good answer: no series.
        assert_eq!(parse_answer(200, &answer(json!([]))).unwrap(), vec![]);
    }

    #[test]
    fn huge_and_deep_answers_do_not_panic() {
        // Too many series.
        let one = series(gpu("n", "0", "ml", "p"), "0.1");
        let many = serde_json::Value::Array(vec![one; MAX_SERIES + 1]);
        let e = parse_answer(200, &answer(many)).unwrap_err();
        assert_eq!(e.kind(), "too_large");
        // Deep nesting: serde_json's recursion limit answers, no stack overflow.
        let deep = format!(
            "{{\"status\":\"success\",\"data\":{}{}",
            "[".repeat(100_000),
            "]".repeat(100_000)
        );
        assert_eq!(
            parse_answer(200, deep.as_bytes()).unwrap_err().kind(),
            "malformed"
        );
        // Long labels and many GPUs of one pod are fine.
        let long = "x".repeat(10_000);
        let big: Vec<serde_json::Value> = (0..1_000)
            .map(|i| series(gpu(&long, &i.to_string(), "ml", "wide"), "0.01"))
            .collect();
        let (pods, _) = activity_of(&samples(serde_json::Value::Array(big)), &[]);
        assert_eq!(pods["ml/wide"].gpus, 1_000);
    }

    #[test]
    fn http_errors_carry_the_prometheus_error_else_the_start_of_the_body() {
        let http = |status: u16, body: &[u8]| match parse_answer(status, body).unwrap_err() {
            QueryError::Http { status, message } => (status, message),
            e => panic!("{e:?}"),
        };
        let e = parse_answer(
            422,
            br#"{"status":"error","errorType":"execution","error":"query timed out"}"#,
        )
        .unwrap_err();
        assert_eq!((e.kind(), e.reason()), ("http_status", "PrometheusError"));
        assert_eq!(
            e.to_string(),
            "Prometheus answered HTTP 422: query timed out"
        );
        // Not JSON, or JSON without `error`: the start of the body.
        assert_eq!(
            http(503, b"Service Unavailable"),
            (503, "Service Unavailable".into())
        );
        assert_eq!(
            http(401, br#"{"status":"error"}"#),
            (401, r#"{"status":"error"}"#.into())
        );
        // Both are cut: the error at 300 characters, the body at 200 bytes.
        let long = format!(r#"{{"status":"error","error":"{}"}}"#, "é".repeat(1_000));
        assert_eq!(http(500, long.as_bytes()).1, "é".repeat(300));
        let page = format!("<html>{}</html>", "x".repeat(1_000));
        assert_eq!(http(502, page.as_bytes()).1, page[..200]);
        // The status decides, whatever the body says; any 2xx is an answer.
        let ok = answer(json!([series(gpu("n1", "0", "ml", "p"), "0.5")]));
        assert_eq!(http(404, &ok).0, 404);
        assert_eq!(parse_answer(203, &ok).unwrap().len(), 1);
    }

    #[test]
    fn result_types_other_than_vector_are_malformed() {
        for (data, why) in [
            (
                json!({"resultType": "matrix", "result": []}),
                r#"resultType "matrix", expected vector"#,
            ),
            (
                json!({"resultType": "scalar", "result": [1.0, "1"]}),
                "invalid type",
            ),
            (
                json!({"resultType": "string", "result": [1.0, "x"]}),
                "invalid type",
            ),
            (json!({"result": []}), "missing field `resultType`"),
        ] {
            let body = serde_json::to_vec(&json!({"status": "success", "data": data})).unwrap();
            let e = parse_answer(200, &body).unwrap_err();
            assert_eq!(
                (e.kind(), e.reason()),
                ("malformed", "MalformedResponse"),
                "{data}"
            );
            assert!(e.to_string().contains(why), "{e}");
        }
        // A matrix whose result happens to be a list of samples is still refused.
        let body = serde_json::to_vec(&json!({"status": "success", "data": {
            "resultType": "matrix", "result": [series(gpu("n1", "0", "ml", "p"), "0")]}}))
        .unwrap();
        assert_eq!(parse_answer(200, &body).unwrap_err().kind(), "malformed");
    }

    #[test]
    fn extra_fields_and_whole_second_timestamps_are_accepted() {
        let body = serde_json::to_vec(&json!({
            "status": "success",
            "warnings": ["PromQL info: metric might not be a counter"],
            "infos": [],
            "data": {"resultType": "vector", "analysis": {},
                     "result": [{"metric": {"gpu": "0", "Hostname": "n1", "namespace": "ml",
                                            "pod": "p"},
                                 "value": [1_700_000_000, "0.25"], "histogram": null}]}
        }))
        .unwrap();
        let s = parse_answer(200, &body).unwrap();
        assert_eq!(s[0].value, (1_700_000_000.0, "0.25".to_string()));
        assert_eq!(activity_of(&s, &[]).0["ml/p"].peak, 0.25);
    }

    #[test]
    fn non_finite_values_are_invalid_and_the_range_ends_are_kept() {
        let sm = samples(json!([
            series(gpu("n1", "0", "ml", "neg-inf"), "-Inf"),
            series(gpu("n1", "1", "ml", "inf"), "Inf"),
            series(gpu("n1", "2", "ml", "nan"), "nan"),
            series(gpu("n1", "3", "ml", "empty"), ""),
            series(gpu("n1", "4", "ml", "just-over"), "1.00001"),
            series(gpu("n1", "5", "ml", "zero"), "0"),
            series(gpu("n1", "6", "ml", "one"), "1"),
            // Rounding noise above 1 is 1.
            series(gpu("n1", "7", "ml", "noise"), "1.0000000001"),
            series(gpu("n1", "8", "ml", "sci"), "1e-3"),
        ]));
        let util = samples(json!([
            series(gpu("n2", "0", "ml", "full"), "100"),
            series(gpu("n2", "1", "ml", "none"), "0"),
            series(gpu("n2", "2", "ml", "below"), "-1"),
            series(gpu("n2", "3", "ml", "util-inf"), "+Inf"),
        ]));
        let (pods, stats) = activity_of(&sm, &util);
        let mut measured: Vec<(&str, f64)> =
            pods.iter().map(|(k, a)| (k.as_str(), a.peak)).collect();
        measured.sort_by(|a, b| a.0.cmp(b.0));
        assert_eq!(
            measured,
            [
                ("ml/full", 1.0),
                ("ml/noise", 1.0),
                ("ml/none", 0.0),
                ("ml/one", 1.0),
                ("ml/sci", 0.001),
                ("ml/zero", 0.0)
            ]
        );
        assert_eq!(
            stats,
            SeriesStats {
                sm_active: 4,
                gpu_util: 2,
                without_pod: 0,
                invalid: 7
            }
        );
    }

    #[test]
    fn series_without_pod_labels_are_counted_not_measured() {
        let sm = samples(json!([
            // No pod labels at all (pod mapping off), and empty ones (a free GPU).
            series(json!({"Hostname": "n1", "gpu": "0"}), "0"),
            series(
                json!({"Hostname": "n1", "gpu": "1", "pod": "", "namespace": "ml"}),
                "0"
            ),
            // A pod without its namespace, and an exported pod whose namespace is only the
            // target's: invalid, not measured under a guessed namespace.
            series(
                json!({"Hostname": "n1", "gpu": "2", "pod": "p", "namespace": ""}),
                "0"
            ),
            series(
                json!({"Hostname": "n1", "gpu": "3", "exported_pod": "q",
                       "namespace": "gpu-operator"}),
                "0"
            ),
            // An empty exported pod: the pod labels count.
            series(
                json!({"Hostname": "n1", "gpu": "4", "exported_pod": "", "pod": "r",
                       "namespace": "ml"}),
                "0.5"
            ),
        ]));
        // The utilisation of a GPU with SM activity is not counted, even without a pod.
        let util = samples(json!([
            series(json!({"Hostname": "n1", "gpu": "0"}), "0"),
            series(json!({"Hostname": "n2", "gpu": "0"}), "0"),
        ]));
        let (pods, stats) = activity_of(&sm, &util);
        assert_eq!(pods.keys().collect::<Vec<_>>(), ["ml/r"]);
        assert_eq!(pods["ml/r"].peak, 0.5);
        assert_eq!(
            stats,
            SeriesStats {
                sm_active: 1,
                gpu_util: 0,
                without_pod: 3,
                invalid: 2
            }
        );
    }

    #[test]
    fn gpus_are_told_apart_by_host_and_index_else_by_uuid_and_mig_instance() {
        let mig = |i: &str, v: &str| {
            series(
                json!({"UUID": "GPU-a", "GPU_I_ID": i, "namespace": "ml", "pod": "mig"}),
                v,
            )
        };
        let sm = samples(json!([
            // Two MIG instances of one GPU are two GPUs.
            mig("1", "0.1"),
            mig("2", "0.2"),
            // The same GPU twice (e.g. two containers): one GPU, its highest sample.
            series(gpu("n1", "0", "ml", "twice"), "0.1"),
            series(gpu("n1", "0", "ml", "twice"), "0.3"),
            // Identified by UUID only.
            series(
                json!({"UUID": "GPU-b", "namespace": "ml", "pod": "uuid"}),
                "0.05"
            ),
        ]));
        // The GPU-b utilisation is ignored: it has SM activity.
        let util = samples(json!([series(
            json!({"UUID": "GPU-b", "namespace": "ml", "pod": "uuid"}),
            "90"
        )]));
        let (pods, stats) = activity_of(&sm, &util);
        let peak = |k: &str| pods.get(k).map(|a| (a.peak, a.gpus));
        assert_eq!(peak("ml/mig"), Some((0.2, 2)));
        assert_eq!(peak("ml/twice"), Some((0.3, 1)));
        assert_eq!(peak("ml/uuid"), Some((0.05, 1)));
        assert_eq!((stats.sm_active, stats.gpu_util), (5, 0));
    }
}
