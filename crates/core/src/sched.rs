//! Emulation of the bin-packing scheduler the project recommends: filter like
//! kube-scheduler (selectors, required affinity, taints, resources, GPUs), score nodes
//! by MostAllocated on `nvidia.com/gpu`, and pick devices by best fit (the fullest GPU
//! that still fits), as HAMi binpack, Aliyun gpushare and KAI gpupack do.
use crate::model::*;

/// Whether `tolerations` tolerate `taint`.
pub fn tolerates(tolerations: &[Toleration], taint: &Taint) -> bool {
    tolerations.iter().any(|t| {
        let effect_ok = t.effect.is_empty() || t.effect == taint.effect;
        let key_ok = t.key.is_empty() && t.operator == "Exists" || t.key == taint.key;
        let value_ok = t.operator == "Exists" || t.value == taint.value;
        effect_ok && key_ok && value_ok
    })
}

fn requirement_matches(r: &NodeSelectorRequirement, node: &Node) -> bool {
    let value = if r.field {
        if r.key == "metadata.name" {
            Some(node.name.as_str())
        } else {
            None
        }
    } else {
        node.labels.get(&r.key).map(String::as_str)
    };
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| r.values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| !r.values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(v), Some(x)) = (
                value.and_then(|v| v.parse::<i64>().ok()),
                r.values.first().and_then(|x| x.parse::<i64>().ok()),
            ) else {
                return false;
            };
            if r.operator == "Gt" { v > x } else { v < x }
        }
        _ => false,
    }
}

/// Node selector, required node affinity, GPU model and taints (no resources).
pub fn placement_allowed(pod: &Pod, node: &Node) -> bool {
    if !node.ready || node.unschedulable {
        return false;
    }
    if !pod
        .node_selector
        .iter()
        .all(|(k, v)| node.labels.get(k) == Some(v))
    {
        return false;
    }
    if !pod.affinity.is_empty()
        && !pod
            .affinity
            .iter()
            .any(|term| term.iter().all(|r| requirement_matches(r, node)))
    {
        return false;
    }
    if !pod.models.is_empty() && !node.model.as_ref().is_some_and(|m| pod.models.contains(m)) {
        return false;
    }
    node.taints
        .iter()
        .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
        .all(|t| tolerates(&pod.tolerations, t))
}

/// Picks devices for `shape` on `node` given free milli per GPU, best fit: for a share,
/// the fullest GPU that fits; for whole GPUs, the first fully free ones. `None` if it
/// does not fit. Returned indices are into `node.gpus`.
pub fn pick_devices(free: &[Milli], healthy: &[bool], shape: GpuShape) -> Option<Vec<usize>> {
    pick_with(free, |i| healthy.get(i) == Some(&true), shape)
}

/// [`pick_devices`] with health given by a function of the GPU index (no allocation).
fn pick_with(
    free: &[Milli],
    healthy: impl Fn(usize) -> bool,
    shape: GpuShape,
) -> Option<Vec<usize>> {
    if shape.gpus == 0 {
        return Some(Vec::new());
    }
    if shape.gpus == 1 && shape.milli < GPU_MILLI {
        let mut best: Option<(Milli, usize)> = None;
        for (i, &f) in free.iter().enumerate() {
            if healthy(i) && f >= shape.milli && best.is_none_or(|(bf, _)| f < bf) {
                best = Some((f, i));
            }
        }
        return best.map(|(_, i)| vec![i]);
    }
    let need = shape.gpus as usize;
    let picked: Vec<usize> = free
        .iter()
        .enumerate()
        .filter(|(i, f)| healthy(*i) && **f >= shape.milli)
        .map(|(i, _)| i)
        .take(need)
        .collect();
    (picked.len() == need).then_some(picked)
}

/// Whether `pod` (its shape, cpu, memory) fits `node` with the given free milli per GPU
/// and free cpu/memory/pod slots, after placement rules.
///
/// A node whose GPU use is not fully known (a pod with an unknown allocation, or records
/// that contradict each other) never fits: its free capacity cannot be trusted, and a
/// tenant's fake record must not draw other tenants' pods onto it.
pub fn fits(
    pod: &Pod,
    node: &Node,
    free: &[Milli],
    cpu_free: u64,
    mem_free: u64,
    pods_free: u64,
) -> Option<Vec<usize>> {
    if node.unknown_pods > 0 || node.inconsistent.is_some() {
        return None;
    }
    if !placement_allowed(pod, node) || pod.cpu > cpu_free || pod.mem > mem_free || pods_free == 0 {
        return None;
    }
    let shape = pod.shape?;
    if shape.gpus as usize > free.len() {
        return None;
    }
    pick_with(free, |i| node.gpus.get(i).is_some_and(|g| g.healthy), shape)
}

/// MostAllocated score of a node for GPUs after placing `add_milli` (higher is fuller).
/// Ties are broken by the caller (name order) so results are deterministic.
pub fn most_allocated_score(node_gpus: usize, free_total: u64, add_milli: u64) -> u64 {
    let cap = node_gpus as u64 * u64::from(GPU_MILLI);
    if cap == 0 {
        return 0;
    }
    let used = cap
        .saturating_sub(free_total)
        .saturating_add(add_milli)
        .min(cap);
    used * 1_000_000 / cap
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_fit_picks_the_fullest_gpu_that_fits() {
        let free = [1000, 300, 600, 250];
        let healthy = [true; 4];
        assert_eq!(
            pick_devices(
                &free,
                &healthy,
                GpuShape {
                    gpus: 1,
                    milli: 280
                }
            ),
            Some(vec![1])
        );
        assert_eq!(
            pick_devices(
                &free,
                &healthy,
                GpuShape {
                    gpus: 1,
                    milli: 700
                }
            ),
            Some(vec![0])
        );
        assert_eq!(
            pick_devices(
                &free,
                &healthy,
                GpuShape {
                    gpus: 2,
                    milli: 1000
                }
            ),
            None
        );
        assert_eq!(
            pick_devices(
                &free,
                &healthy,
                GpuShape {
                    gpus: 1,
                    milli: 1000
                }
            ),
            Some(vec![0])
        );
    }

    #[test]
    fn unhealthy_gpus_are_never_picked() {
        assert_eq!(
            pick_devices(
                &[1000, 1000],
                &[false, true],
                GpuShape {
                    gpus: 2,
                    milli: 1000
                }
            ),
            None
        );
    }

    #[test]
    fn toleration_rules() {
        let taint = Taint {
            key: "gpu-defrag.io/draining".into(),
            value: "p".into(),
            effect: "NoSchedule".into(),
        };
        let exists_all = Toleration {
            key: String::new(),
            operator: "Exists".into(),
            value: String::new(),
            effect: String::new(),
        };
        let equal = Toleration {
            key: taint.key.clone(),
            operator: "Equal".into(),
            value: "p".into(),
            effect: "NoSchedule".into(),
        };
        let wrong = Toleration {
            value: "q".into(),
            ..equal.clone()
        };
        assert!(tolerates(&[exists_all], &taint));
        assert!(tolerates(&[equal], &taint));
        assert!(!tolerates(&[wrong], &taint));
        assert!(!tolerates(&[], &taint));
    }
}
