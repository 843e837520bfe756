//! Where the pending job goes: the pods a run made room for, nominated onto the nodes it
//! emptied, so that smaller pods do not refill the room before the scheduler retries them.
//!
//! A nomination (`status.nominatedNodeName`) makes kube-scheduler try that node first and,
//! while the pod waits, count it as taken against pods of equal or lower priority; it is
//! only a hint (the pod is scheduled normally when the node no longer fits). So a node is
//! offered only when it is *empty* — every GPU free — and a pod is nominated only where it
//! fits whole, by every rule the planner checks.
use std::collections::HashSet;
use std::time::Duration;

use crate::frag::Capacity;
use crate::model::{Cluster, Taint};
use crate::sched;

/// What landing control does with one replacement it holds at creation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Held {
    /// Nominate it onto this node (the one its move planned), then release it.
    Nominate(String),
    /// Release it without a nomination (why).
    Release(Released),
    /// Keep it held: its expectation may be another process's, or not here yet.
    Keep,
}

/// Why a held pod is released without a nomination (the `action` label of
/// `gpu_defrag_landing_actions_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Released {
    /// The first pass after the process started: nothing it held before is expected now.
    Swept,
    /// Held for the hold timeout.
    TimedOut,
    /// The leader expects no replacement of its workload.
    Unexpected,
}

impl Released {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Released::Swept => "swept",
            Released::TimedOut => "timed_out",
            Released::Unexpected => "released",
        }
    }
}

/// The decision on one held pod: `sweep` on the first pass after start; `leads` whether
/// this process leads; `expected` the planned node of the open expectation of its workload
/// the leader took for it (none: no such expectation, or not the leader); `age` how long
/// it has been held, `hold` the hold timeout. The leader holds nothing it does not expect;
/// a standby keeps a pod until the hold times out (the leader may expect it).
pub fn held_pod(
    sweep: bool,
    leads: bool,
    expected: Option<&str>,
    age: Duration,
    hold: Duration,
) -> Held {
    if sweep {
        return Held::Release(Released::Swept);
    }
    if leads && let Some(node) = expected {
        return Held::Nominate(node.to_string());
    }
    if age >= hold {
        return Held::Release(Released::TimedOut);
    }
    if leads {
        Held::Release(Released::Unexpected)
    } else {
        Held::Keep
    }
}

/// Which of the `queued` pods (UIDs of the GPU pods pending when the run started) to
/// nominate onto which of `nodes` (the nodes the run emptied), as `(pod index, node index)`.
/// `ignore` says which taints to disregard: the run's own fences, which come off as the
/// pods are nominated. Pods are served by priority, then the most GPUs first (the room
/// was made for the large ones), then namespace and name; each goes to the first node
/// in `nodes` where it fits in what the pods served before it left. A node with any GPU in
/// use, unknown pods or inconsistent records is not offered.
pub fn pending_nominations(
    c: &Cluster,
    nodes: &[usize],
    queued: &HashSet<String>,
    ignore: impl Fn(&Taint) -> bool,
) -> Vec<(usize, usize)> {
    let empty: Vec<usize> = nodes
        .iter()
        .copied()
        .filter(|&n| {
            c.nodes.get(n).is_some_and(|node| {
                !node.gpus.is_empty()
                    && node.gpus.iter().all(|g| g.used == 0)
                    && node.unknown_pods == 0
                    && node.inconsistent.is_none()
            })
        })
        .collect();
    if empty.is_empty() {
        return Vec::new();
    }
    let mut pods: Vec<usize> = c
        .pods
        .iter()
        .enumerate()
        .filter(|(_, p)| {
            p.is_pending()
                && queued.contains(&p.uid)
                && !p.resource_claims
                && p.shape.is_some_and(|s| s.gpus > 0)
        })
        .map(|(i, _)| i)
        .collect();
    pods.sort_by(|&a, &b| {
        let (pa, pb) = (&c.pods[a], &c.pods[b]);
        let size = |p: &crate::model::Pod| {
            p.shape
                .map(|s| u64::from(s.gpus) * u64::from(s.milli))
                .unwrap_or(0)
        };
        pb.priority
            .cmp(&pa.priority)
            .then_with(|| size(pb).cmp(&size(pa)))
            .then_with(|| pa.namespace.cmp(&pb.namespace))
            .then_with(|| pa.name.cmp(&pb.name))
    });
    // Fences the run put on the nodes come off as the pods are nominated: judged without
    // them.
    let mut unfenced = c.clone();
    for &n in &empty {
        unfenced.nodes[n].taints.retain(|t| !ignore(t));
    }
    let c = &unfenced;
    let mut cap = Capacity::of(c);
    let mut occ = sched::Occupancy::of(c);
    let mut out = Vec::new();
    for pi in pods {
        let p = &c.pods[pi];
        let milli = p.shape.map(|s| s.milli).unwrap_or(0);
        let inc = sched::Incoming::new(c, &occ, pi);
        let Some((n, devs)) = empty
            .iter()
            .find_map(|&n| inc.fit(n, cap.at(n)).devices().map(|d| (n, d)))
        else {
            continue;
        };
        for d in devs {
            cap.free[n][d] = cap.free[n][d].saturating_sub(milli);
        }
        cap.cpu_free[n] = cap.cpu_free[n].saturating_sub(p.cpu);
        cap.mem_free[n] = cap.mem_free[n].saturating_sub(p.mem);
        cap.pods_free[n] = cap.pods_free[n].saturating_sub(1);
        occ.place(c, pi, n);
        out.push((pi, n));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frag::tests::node;
    use crate::model::{GpuShape, Pod};

    fn pending(name: &str, gpus: u32, priority: i32) -> Pod {
        Pod {
            namespace: "ml".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            shape: Some(GpuShape { gpus, milli: 1000 }),
            priority,
            cpu: 1000,
            mem: 1 << 30,
            ..Default::default()
        }
    }

    fn fence() -> Taint {
        Taint {
            key: "draining.gpu-defrag.io/p".into(),
            value: "p".into(),
            effect: "NoSchedule".into(),
        }
    }

    fn cluster(pods: Vec<Pod>) -> Cluster {
        let mut emptied = node("emptied", &[0; 8]);
        emptied.taints.push(fence());
        Cluster {
            nodes: vec![node("busy", &[1000, 0, 0, 0, 0, 0, 0, 0]), emptied],
            pods,
            ..Default::default()
        }
    }

    fn all(c: &Cluster) -> HashSet<String> {
        c.pods.iter().map(|p| p.uid.clone()).collect()
    }

    fn is_fence(t: &Taint) -> bool {
        t.key.starts_with("draining.gpu-defrag.io/")
    }

    #[test]
    fn the_largest_queued_pod_goes_to_the_empty_node_past_the_runs_fence() {
        let c = cluster(vec![pending("small", 1, 0), pending("train", 8, 0)]);
        let got = pending_nominations(&c, &[0, 1], &all(&c), is_fence);
        assert_eq!(got, vec![(1, 1)], "train on the emptied node only");
        // The fence is honoured when it is not the run's own.
        assert!(pending_nominations(&c, &[1], &all(&c), |_| false).is_empty());
    }

    #[test]
    fn priority_first_then_size_and_what_is_left_serves_the_next() {
        let c = cluster(vec![
            pending("four-a", 4, 0),
            pending("six-low", 6, -10),
            pending("four-b", 4, 0),
        ]);
        let got = pending_nominations(&c, &[1], &all(&c), is_fence);
        assert_eq!(got, vec![(0, 1), (2, 1)]);
    }

    #[test]
    fn only_queued_unbound_pods_on_fully_empty_nodes() {
        let mut bound = pending("bound", 1, 0);
        bound.node_name = Some("busy".into());
        bound.node = Some(0);
        let late = pending("late", 8, 0);
        let c = cluster(vec![bound, late]);
        let queued: HashSet<String> = ["uid-bound".to_string()].into();
        assert!(pending_nominations(&c, &[1], &queued, is_fence).is_empty());
        // Node "busy" has a GPU in use: never offered, even for a pod that would fit.
        let c = cluster(vec![pending("one", 1, 0)]);
        assert!(pending_nominations(&c, &[0], &all(&c), is_fence).is_empty());
    }

    #[test]
    fn a_pod_too_large_for_the_node_is_not_nominated() {
        let c = cluster(vec![pending("huge", 16, 0)]);
        assert!(pending_nominations(&c, &[1], &all(&c), is_fence).is_empty());
    }
}
