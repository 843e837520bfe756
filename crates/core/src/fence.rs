//! Fencing single GPUs through node annotations.
//!
//! HAMi's scheduler (v2.10 and later) keeps new pods off the GPUs a node lists in
//! `hami.io/device-cordon` (comma-separated UUIDs; spaces and empty entries ignored), and
//! leaves the pods already running on them alone. A run that drains one GPU of a HAMi node
//! adds the GPU there, so the evicted pods cannot land back on it, and takes it out again
//! when the run ends.
//!
//! The list is shared with administrators and other policies, so what each policy added is
//! written next to it in `gpu-defrag.io/device-cordon`, a JSON object of policy name to the
//! UUIDs it added: a GPU that was already listed is never claimed, and a GPU is taken out
//! of the list only when its last claim goes. The functions here compute the annotation
//! changes; the caller writes them (guarded by the node's resourceVersion).

use std::collections::{BTreeMap, BTreeSet};

/// HAMi's list of cordoned GPUs on a node.
pub const HAMI_DEVICE_CORDON: &str = "hami.io/device-cordon";
/// What each policy added to [`HAMI_DEVICE_CORDON`]: JSON `{"<policy>": ["<uuid>", ...]}`.
pub const OWNED_DEVICE_CORDONS: &str = "gpu-defrag.io/device-cordon";

/// Annotation changes: key to its new value, `None` to remove it. Empty: nothing to do.
pub type Changes = BTreeMap<String, Option<String>>;

/// The UUIDs listed in a `hami.io/device-cordon` value, in order, each once.
pub fn cordoned(value: &str) -> Vec<String> {
    let mut seen = BTreeSet::new();
    value
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty() && seen.insert(*u))
        .map(str::to_string)
        .collect()
}

/// The claims in `gpu-defrag.io/device-cordon`, or why they cannot be read.
pub fn claims(
    annotations: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, Vec<String>>, String> {
    match annotations.get(OWNED_DEVICE_CORDONS) {
        None => Ok(BTreeMap::new()),
        Some(v) => serde_json::from_str(v).map_err(|e| {
            format!("{OWNED_DEVICE_CORDONS} is not a JSON object of lists of UUIDs: {e}")
        }),
    }
}

/// The GPUs `policy` claims on a node.
pub fn claimed_by(annotations: &BTreeMap<String, String>, policy: &str) -> Vec<String> {
    claims(annotations)
        .ok()
        .and_then(|mut c| c.remove(policy))
        .unwrap_or_default()
}

/// The changes that cordon `gpus` for `policy`. A GPU already in the list (cordoned by an
/// administrator or another policy) is left as it is and not claimed; unreadable claims
/// are an error (nothing is changed: whose entries are whose would be a guess).
pub fn cordon(
    annotations: &BTreeMap<String, String>,
    policy: &str,
    gpus: &[String],
) -> Result<Changes, String> {
    let mut claims = claims(annotations)?;
    let mut list = annotations
        .get(HAMI_DEVICE_CORDON)
        .map(|v| cordoned(v))
        .unwrap_or_default();
    let mine = claims.entry(policy.to_string()).or_default();
    let mut added = false;
    for g in gpus {
        if g.trim().is_empty() || g.contains(',') || list.iter().any(|u| u == g) {
            continue;
        }
        list.push(g.clone());
        if !mine.contains(g) {
            mine.push(g.clone());
        }
        added = true;
    }
    if !added {
        return Ok(Changes::new());
    }
    Ok(written(list, &claims))
}

/// The changes that take back every cordon `policy` claims on the node: each of its GPUs
/// leaves the list unless another policy claims it too; GPUs it did not add stay. With
/// unreadable claims nothing is changed (an error).
pub fn uncordon(annotations: &BTreeMap<String, String>, policy: &str) -> Result<Changes, String> {
    let mut claims = claims(annotations)?;
    let Some(mine) = claims.remove(policy) else {
        return Ok(Changes::new());
    };
    let still: BTreeSet<&String> = claims.values().flatten().collect();
    let list: Vec<String> = annotations
        .get(HAMI_DEVICE_CORDON)
        .map(|v| cordoned(v))
        .unwrap_or_default()
        .into_iter()
        .filter(|u| !mine.contains(u) || still.contains(u))
        .collect();
    Ok(written(list, &claims))
}

/// Both annotations as written: an empty list or no claims remove the annotation.
fn written(list: Vec<String>, claims: &BTreeMap<String, Vec<String>>) -> Changes {
    let claims: BTreeMap<&String, &Vec<String>> =
        claims.iter().filter(|(_, v)| !v.is_empty()).collect();
    Changes::from([
        (
            HAMI_DEVICE_CORDON.to_string(),
            (!list.is_empty()).then(|| list.join(",")),
        ),
        (
            OWNED_DEVICE_CORDONS.to_string(),
            (!claims.is_empty()).then(|| serde_json::to_string(&claims).unwrap_or_default()),
        ),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn apply(a: &mut BTreeMap<String, String>, c: Changes) {
        for (k, v) in c {
            match v {
                Some(v) => {
                    a.insert(k, v);
                }
                None => {
                    a.remove(&k);
                }
            }
        }
    }

    fn gpus(g: &[&str]) -> Vec<String> {
        g.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_list_is_read_as_hami_reads_it() {
        assert_eq!(cordoned(" a, b ,,c,a"), gpus(&["a", "b", "c"]));
        assert!(cordoned("").is_empty());
        assert!(cordoned(" , ").is_empty());
    }

    #[test]
    fn a_cordon_and_its_removal_leave_the_node_as_it_was() {
        let mut a = BTreeMap::from([("other".to_string(), "x".to_string())]);
        let before = a.clone();
        let c = cordon(&a, "p", &gpus(&["GPU-1"])).unwrap();
        apply(&mut a, c);
        assert_eq!(a[HAMI_DEVICE_CORDON], "GPU-1");
        assert_eq!(a[OWNED_DEVICE_CORDONS], r#"{"p":["GPU-1"]}"#);
        assert_eq!(claimed_by(&a, "p"), gpus(&["GPU-1"]));
        // Again: nothing to do.
        assert!(cordon(&a, "p", &gpus(&["GPU-1"])).unwrap().is_empty());
        let c = uncordon(&a, "p").unwrap();
        apply(&mut a, c);
        assert_eq!(a, before);
        assert!(uncordon(&a, "p").unwrap().is_empty());
    }

    #[test]
    fn an_administrators_cordon_is_never_claimed_nor_removed() {
        let mut a = BTreeMap::from([(
            HAMI_DEVICE_CORDON.to_string(),
            "GPU-admin, GPU-2".to_string(),
        )]);
        let c = cordon(&a, "p", &gpus(&["GPU-2", "GPU-3"])).unwrap();
        apply(&mut a, c);
        assert_eq!(a[HAMI_DEVICE_CORDON], "GPU-admin,GPU-2,GPU-3");
        assert_eq!(claimed_by(&a, "p"), gpus(&["GPU-3"]));
        let c = uncordon(&a, "p").unwrap();
        apply(&mut a, c);
        assert_eq!(a[HAMI_DEVICE_CORDON], "GPU-admin,GPU-2");
        assert!(!a.contains_key(OWNED_DEVICE_CORDONS));
    }

    #[test]
    fn a_gpu_two_policies_fence_stays_until_both_are_done() {
        let mut a = BTreeMap::new();
        let c = cordon(&a, "p", &gpus(&["GPU-1"])).unwrap();
        apply(&mut a, c);
        // q finds it listed: it does not claim it.
        assert!(cordon(&a, "q", &gpus(&["GPU-1"])).unwrap().is_empty());
        let c = cordon(&a, "q", &gpus(&["GPU-2"])).unwrap();
        apply(&mut a, c);
        let c = uncordon(&a, "q").unwrap();
        apply(&mut a, c);
        assert_eq!(a[HAMI_DEVICE_CORDON], "GPU-1");
        assert_eq!(claimed_by(&a, "p"), gpus(&["GPU-1"]));
        // Claims written by hand for both: the GPU stays while one is left.
        a.insert(
            OWNED_DEVICE_CORDONS.into(),
            r#"{"p":["GPU-1"],"q":["GPU-1"]}"#.into(),
        );
        let c = uncordon(&a, "p").unwrap();
        apply(&mut a, c);
        assert_eq!(a[HAMI_DEVICE_CORDON], "GPU-1");
        let c = uncordon(&a, "q").unwrap();
        apply(&mut a, c);
        assert!(a.is_empty(), "{a:?}");
    }

    #[test]
    fn unreadable_claims_change_nothing() {
        for bad in ["", "[]", r#"{"p": "GPU-1"}"#, "{", r#"{"p":[1]}"#] {
            let a = BTreeMap::from([
                (HAMI_DEVICE_CORDON.to_string(), "GPU-1".to_string()),
                (OWNED_DEVICE_CORDONS.to_string(), bad.to_string()),
            ]);
            assert!(cordon(&a, "p", &gpus(&["GPU-2"])).is_err(), "{bad}");
            assert!(uncordon(&a, "p").is_err(), "{bad}");
            assert!(claimed_by(&a, "p").is_empty());
        }
    }

    #[test]
    fn names_that_would_break_the_list_are_not_written() {
        let a = BTreeMap::new();
        assert!(
            cordon(&a, "p", &gpus(&["", " ", "a,b"]))
                .unwrap()
                .is_empty()
        );
    }
}
