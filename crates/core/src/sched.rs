//! The scheduler emulation: one predicate, [`fit`], that mirrors kube-scheduler 1.37's
//! Filter plugins for everything the cluster model holds, used for every placement the
//! planners make (a served pod's room, every evicted pod's target, both landing modes)
//! and by the simulator. Device choice follows the bin-packing scheduler the project
//! recommends: MostAllocated on GPU, best fit per device (the fullest GPU that still
//! fits), as HAMi binpack, Aliyun gpushare and KAI gpupack do.
//!
//! | kube-scheduler filter | what is read | see |
//! |---|---|---|
//! | NodeName | `spec.nodeName` of a pending pod | [`fit`] |
//! | NodeUnschedulable | `spec.unschedulable` (cordoned: never fits), node Ready | [`node_rules`] |
//! | NodeAffinity | `nodeSelector`, required node affinity | [`node_rules`] |
//! | TaintToleration | `NoSchedule` / `NoExecute` taints, tolerations | [`node_rules`] |
//! | NodeResourcesFit | cpu, memory, pods, every other resource, GPUs through the adapters | [`fit`] |
//! | NodePorts | host ports of every container | [`fit`] |
//! | InterPodAffinity | required affinity and anti-affinity, both directions | [`Incoming`] |
//! | PodTopologySpread | `DoNotSchedule` constraints, `minDomains`, both node policies | [`Incoming`] |
//!
//! What the model cannot see (a `namespaceSelector` over namespace labels) makes the
//! verdict [`Fit::Unknown`]: no placement is ever proven for it.
use std::collections::HashMap;

use crate::model::*;

mod interpod;

pub use interpod::Incoming;

/// Which filter turned a node down.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub enum Filter {
    /// The pod is bound already (`spec.nodeName`) to another node.
    NodeName,
    /// The node is cordoned or not Ready.
    NodeUnschedulable,
    /// `nodeSelector` or required node affinity (or the GPU model asked for).
    NodeAffinity,
    /// A `NoSchedule` / `NoExecute` taint the pod does not tolerate.
    TaintToleration,
    /// Not enough cpu, memory, pod slots or another resource.
    NodeResourcesFit,
    /// Not enough GPU capacity of the pod's scheme (or the node's GPU use is unknown).
    Gpus,
    /// A host port in use.
    NodePorts,
    /// The pod's required pod affinity.
    InterPodAffinity,
    /// The pod's required anti-affinity, or an existing pod's against it.
    InterPodAntiAffinity,
    /// A `DoNotSchedule` topology spread constraint.
    PodTopologySpread,
}

impl Filter {
    /// The kube-scheduler plugin name, but for two parts of plugins told apart here:
    /// `Gpus` (the GPU part of NodeResourcesFit, through the allocation adapters) and
    /// `InterPodAntiAffinity` (the anti-affinity part of InterPodAffinity).
    pub fn as_str(self) -> &'static str {
        match self {
            Filter::NodeName => "NodeName",
            Filter::NodeUnschedulable => "NodeUnschedulable",
            Filter::NodeAffinity => "NodeAffinity",
            Filter::TaintToleration => "TaintToleration",
            Filter::NodeResourcesFit => "NodeResourcesFit",
            Filter::Gpus => "Gpus",
            Filter::NodePorts => "NodePorts",
            Filter::InterPodAffinity => "InterPodAffinity",
            Filter::InterPodAntiAffinity => "InterPodAntiAffinity",
            Filter::PodTopologySpread => "PodTopologySpread",
        }
    }
}

/// The verdict of [`fit`] for one pod on one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fit {
    /// It fits, on these GPUs (indices into the node's `gpus`; empty for no GPU).
    Fits(Vec<usize>),
    /// It does not: the first filter that said no.
    No(Filter),
    /// The model cannot tell (the message says what it cannot see): never a target.
    Unknown(String),
}

impl Fit {
    /// The devices when it fits.
    pub fn devices(self) -> Option<Vec<usize>> {
        match self {
            Fit::Fits(d) => Some(d),
            _ => None,
        }
    }
    /// Whether it fits.
    pub fn fits(&self) -> bool {
        matches!(self, Fit::Fits(_))
    }
}

/// What is free on one node now: milli per GPU (masked GPUs at 0), cpu (milli), memory
/// (bytes) and pod slots.
#[derive(Debug, Clone, Copy)]
pub struct Free<'a> {
    /// Free milli per GPU, in the node's `gpus` order.
    pub gpus: &'a [Milli],
    /// Free CPU, milli.
    pub cpu: u64,
    /// Free memory, bytes.
    pub mem: u64,
    /// Free pod slots.
    pub pods: u64,
}

impl<'a> Free<'a> {
    /// What the node's own figures leave free, with `gpus` free milli per GPU.
    pub fn of_node(node: &Node, gpus: &'a [Milli]) -> Free<'a> {
        Free {
            gpus,
            cpu: node.cpu_free(),
            mem: node.mem_free(),
            pods: node.pods_alloc.saturating_sub(node.pods_used),
        }
    }
}

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

/// NodeAffinity: the node selector and the required node affinity (an empty term matches
/// no node, as in Kubernetes), and the GPU model the pod asks for.
#[inline]
pub fn node_affinity_allows(pod: &Pod, node: &Node) -> bool {
    pod.node_selector
        .iter()
        .all(|(k, v)| node.labels.get(k) == Some(v))
        && (pod.affinity.is_empty()
            || pod
                .affinity
                .iter()
                .any(|term| !term.is_empty() && term.iter().all(|r| requirement_matches(r, node))))
        && (pod.models.is_empty() || node.model.as_ref().is_some_and(|m| pod.models.contains(m)))
}

/// TaintToleration: every `NoSchedule` / `NoExecute` taint tolerated.
#[inline]
pub fn taints_tolerated(pod: &Pod, node: &Node) -> bool {
    node.taints
        .iter()
        .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
        .all(|t| tolerates(&pod.tolerations, t))
}

/// The node rules of [`fit`] (NodeUnschedulable, NodeAffinity, TaintToleration), no
/// resources: the first that says no.
#[inline]
pub fn node_rules(pod: &Pod, node: &Node) -> Result<(), Filter> {
    if !node.ready || node.unschedulable {
        return Err(Filter::NodeUnschedulable);
    }
    if !node_affinity_allows(pod, node) {
        return Err(Filter::NodeAffinity);
    }
    if !taints_tolerated(pod, node) {
        return Err(Filter::TaintToleration);
    }
    Ok(())
}

/// [`node_rules`] as a yes or no.
pub fn placement_allowed(pod: &Pod, node: &Node) -> bool {
    node_rules(pod, node).is_ok()
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

/// The GPU part of NodeResourcesFit through the allocation model: the node's scheme and
/// granularity can hold the pod's shape, and devices are free for it (best fit).
///
/// A node whose GPU use is not fully known (a pod with an unknown allocation, or records
/// that contradict each other) never takes a GPU pod: its free capacity cannot be trusted,
/// and a tenant's fake record must not draw other tenants' pods onto it.
#[inline]
pub fn gpus_fit(pod: &Pod, node: &Node, free: &[Milli]) -> Option<Vec<usize>> {
    let Some(shape) = pod.shape.filter(|s| s.gpus > 0) else {
        return Some(Vec::new());
    };
    if node.unknown_pods > 0 || node.inconsistent.is_some() {
        return None;
    }
    if node.scheme != pod.scheme.unwrap_or(node.scheme)
        || (node.granularity == Granularity::Node && shape.milli < GPU_MILLI)
        || shape.gpus as usize > free.len()
    {
        return None;
    }
    pick_with(free, |i| node.gpus.get(i).is_some_and(|g| g.healthy), shape)
}

/// Whether `pod` fits `node` as far as its own requests go (node rules, cpu, memory, pod
/// slots, GPUs): the part of [`fit`] that needs no other pod. Returns its devices.
pub fn fits(pod: &Pod, node: &Node, free: Free<'_>) -> Option<Vec<usize>> {
    rules_and_core_resources(pod, node, free).ok()?;
    gpus_fit(pod, node, free.gpus)
}

/// The node rules, then cpu, memory and pod slots: what [`fits`] and [`fit`] check first.
#[inline]
fn rules_and_core_resources(pod: &Pod, node: &Node, free: Free<'_>) -> Result<(), Filter> {
    node_rules(pod, node)?;
    if pod.cpu > free.cpu || pod.mem > free.mem || free.pods == 0 {
        return Err(Filter::NodeResourcesFit);
    }
    Ok(())
}

/// Who is where, for the filters that look beyond one pod's own requests: where each pod
/// is now (planned moves applied), what bound pods use of the other resources and which
/// host ports per node. The planners move pods in it as they plan ([`Occupancy::leave`],
/// [`Occupancy::place`]).
#[derive(Debug, Clone)]
pub struct Occupancy {
    /// Pod index → the node it is on now.
    at: Vec<Option<usize>>,
    /// Node → use of the other resources (sorted by name).
    extra_used: Vec<Vec<(String, u64)>>,
    /// Node → pods with host ports on it.
    ports: Vec<Vec<usize>>,
    /// Pods with required anti-affinity terms (the reverse check of every placement).
    holders: Vec<usize>,
    /// Namespace → its pods.
    by_ns: HashMap<String, Vec<usize>>,
}

impl Occupancy {
    /// The cluster as it is: active bound pods on their nodes.
    pub fn of(c: &Cluster) -> Occupancy {
        let mut at = vec![None; c.pods.len()];
        let mut ports = vec![Vec::new(); c.nodes.len()];
        let mut holders = Vec::new();
        let mut by_ns: HashMap<String, Vec<usize>> = HashMap::new();
        for (i, p) in c.pods.iter().enumerate() {
            let here = p.node.filter(|_| p.is_active_bound());
            at[i] = here;
            if let Some(cs) = &p.constraints {
                if let Some(n) = here
                    && !cs.host_ports.is_empty()
                {
                    ports[n].push(i);
                }
                if !cs.anti_affinity.is_empty() {
                    holders.push(i);
                }
            }
            match by_ns.get_mut(p.namespace.as_str()) {
                Some(v) => v.push(i),
                None => {
                    by_ns.insert(p.namespace.clone(), vec![i]);
                }
            }
        }
        Occupancy {
            at,
            extra_used: c.nodes.iter().map(|n| n.extra_used.clone()).collect(),
            ports,
            holders,
            by_ns,
        }
    }

    /// The node pod `pod` is on now.
    pub fn node_of(&self, pod: usize) -> Option<usize> {
        self.at.get(pod).copied().flatten()
    }

    /// Pod `pod` leaves the node it is on (nothing when it is on none).
    pub fn leave(&mut self, c: &Cluster, pod: usize) {
        let Some(n) = self.node_of(pod) else { return };
        self.at[pod] = None;
        if let Some(cs) = &c.pods[pod].constraints {
            let used = &mut self.extra_used[n];
            for (k, v) in &cs.resources {
                if let Ok(i) = used.binary_search_by(|(x, _)| x.as_str().cmp(k)) {
                    used[i].1 = used[i].1.saturating_sub(*v);
                }
            }
            if !cs.host_ports.is_empty() {
                self.ports[n].retain(|&x| x != pod);
            }
        }
    }

    /// Pod `pod` is placed on node `n` (it leaves where it was first).
    pub fn place(&mut self, c: &Cluster, pod: usize, n: usize) {
        self.leave(c, pod);
        self.at[pod] = Some(n);
        if let Some(cs) = &c.pods[pod].constraints {
            add_resources(&mut self.extra_used[n], &cs.resources);
            if !cs.host_ports.is_empty() {
                self.ports[n].push(pod);
            }
        }
    }

    /// Whether any pod has required anti-affinity terms (then where a pod fits depends on
    /// its labels too).
    pub fn has_anti_affinity(&self) -> bool {
        !self.holders.is_empty()
    }

    /// Pods of namespace `ns`.
    fn in_namespace(&self, ns: &str) -> &[usize] {
        self.by_ns.get(ns).map_or(&[], Vec::as_slice)
    }
}

/// NodeResourcesFit for the resources other than cpu, memory, pods and GPUs: every one the
/// pod asks for is allocatable on the node and not used up.
fn other_resources_fit(
    asked: &[(String, u64)],
    alloc: &[(String, u64)],
    used: &[(String, u64)],
) -> bool {
    let get = |l: &[(String, u64)], k: &str| {
        l.binary_search_by(|(x, _)| x.as_str().cmp(k))
            .map_or(0, |i| l[i].1)
    };
    asked
        .iter()
        .all(|(k, v)| *v == 0 || get(alloc, k).saturating_sub(get(used, k)) >= *v)
}

/// NodePorts: none of `ports` conflicts with a host port of a pod on the node.
fn ports_free(c: &Cluster, occ: &Occupancy, pod: usize, ports: &[HostPort], n: usize) -> bool {
    ports.is_empty()
        || occ.ports[n].iter().filter(|&&x| x != pod).all(|&x| {
            c.pods[x]
                .constraints()
                .host_ports
                .iter()
                .all(|h| !ports.iter().any(|p| p.conflicts(h)))
        })
}

/// kube-scheduler's Filter verdict for pod `pod` of `c` on node `n`, with `free` what the
/// node has free now and `occ` who is where now. The filters run in the scheduler's
/// order; the first that says no is returned.
pub fn fit(c: &Cluster, occ: &Occupancy, pod: usize, n: usize, free: Free<'_>) -> Fit {
    Incoming::new(c, occ, pod).fit(n, free)
}

/// The part of [`fit`] every pod has (no inter-pod constraint): node rules, resources,
/// GPUs, host ports.
#[inline]
fn own_fit(c: &Cluster, occ: &Occupancy, pod: usize, n: usize, free: Free<'_>) -> Fit {
    let p = &c.pods[pod];
    let node = &c.nodes[n];
    // A pod bound by name (not a replacement of a bound pod) goes to that node only.
    if !p.is_active_bound() && p.node_name.as_deref().is_some_and(|x| x != node.name) {
        return Fit::No(Filter::NodeName);
    }
    if let Err(f) = rules_and_core_resources(p, node, free) {
        return Fit::No(f);
    }
    let cs = p.constraints.as_deref();
    if cs.is_some_and(|cs| {
        !other_resources_fit(&cs.resources, &node.extra_alloc, &occ.extra_used[n])
    }) {
        return Fit::No(Filter::NodeResourcesFit);
    }
    let Some(devs) = gpus_fit(p, node, free.gpus) else {
        return Fit::No(Filter::Gpus);
    };
    if cs.is_some_and(|cs| !ports_free(c, occ, pod, &cs.host_ports, n)) {
        return Fit::No(Filter::NodePorts);
    }
    Fit::Fits(devs)
}

/// Most-allocated score of a node for GPUs after placing `add_milli` (higher is fuller).
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
