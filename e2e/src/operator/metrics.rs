//! Reading the operator's `/metrics` text: sums of a metric's samples by label.

/// The sum of the samples of metric `name` (exact series name, e.g.
/// `gpu_defrag_api_requests_total`) whose labels include every `labels` pair; 0 if none.
pub fn metric_sum(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (n, rest) = match series.split_once('{') {
                Some((n, rest)) => (n, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            if n != name {
                return None;
            }
            let has = |k: &str, v: &str| {
                rest.split(',').any(|kv| {
                    kv.split_once('=')
                        .is_some_and(|(a, b)| a == k && b.trim_matches('"') == v)
                })
            };
            labels
                .iter()
                .all(|(k, v)| has(k, v))
                .then(|| value.parse::<f64>().ok())
                .flatten()
        })
        .sum()
}
