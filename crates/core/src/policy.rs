//! The parts of a DefragPolicy the pure core uses, parsed and checked once.
use std::time::Duration;

use gpu_defrag_api::v1alpha1::{DefragPolicySpec, LandingMode};

use crate::formats;
use crate::ingest::label_selector;
use crate::model::{GPU_MILLI, LabelSelector, Milli, Node, Pod};

/// A policy value the core cannot use, with the field it came from.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct PolicyError {
    /// JSON path of the field, e.g. `spec.target.shapes[1].cpu`.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

fn err(field: impl Into<String>, message: impl Into<String>) -> PolicyError {
    PolicyError {
        field: field.into(),
        message: message.into(),
    }
}

/// A target shape, parsed.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TargetShape {
    /// GPUs.
    pub gpus: u32,
    /// Milli per GPU.
    pub milli_per_gpu: Milli,
    /// CPU milli needed on the node.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<u64>,
    /// Memory bytes needed on the node.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<u64>,
    /// Accepted GPU models (empty: any).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<String>,
    /// Normalised weight (weights sum to 1).
    pub weight: f64,
}

impl TargetShape {
    /// A shape of `gpus` GPUs with `milli_per_gpu` each, on any node and model.
    pub fn of_gpus(gpus: u32, milli_per_gpu: Milli, weight: f64) -> Self {
        TargetShape {
            gpus,
            milli_per_gpu,
            cpu: None,
            memory: None,
            models: Vec::new(),
            weight,
        }
    }
}

/// Which nodes and pods a policy covers.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Scope {
    /// Node selector (None: every node).
    pub node_selector: Option<LabelSelector>,
    /// Namespaces allowed (empty: all).
    pub include: Vec<String>,
    /// Namespaces excluded.
    pub exclude: Vec<String>,
    /// Pod selector for movable pods.
    pub pod_selector: Option<LabelSelector>,
}

impl Scope {
    /// Whether the node is covered (label selector only; readiness is checked elsewhere).
    pub fn covers_node(&self, node: &Node) -> bool {
        self.node_selector
            .as_ref()
            .is_none_or(|s| s.matches(&node.labels))
    }
    /// Whether the namespace is covered (`namespaces.include` / `exclude`).
    pub fn covers_namespace(&self, ns: &str) -> bool {
        (self.include.is_empty() || self.include.iter().any(|n| n == ns))
            && !self.exclude.iter().any(|n| n == ns)
    }
    /// Whether the pod may be moved by namespace and selector.
    pub fn covers_pod(&self, pod: &Pod) -> bool {
        self.covers_namespace(&pod.namespace)
            && self
                .pod_selector
                .as_ref()
                .is_none_or(|s| s.matches(&pod.labels))
    }
}

/// The policy as the core uses it.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// Coverage.
    pub scope: Scope,
    /// Explicit target shapes (empty: derive from pods).
    pub shapes: Vec<TargetShape>,
    /// Serve unplaceable pending pods first.
    pub from_pending: bool,
    /// Trigger rate.
    pub min_fragment_rate: f64,
    /// Whole nodes a plan must free for a run to start (0: no gate).
    pub min_nodes_freed: u32,
    /// Limits.
    pub max_evictions_per_run: u32,
    /// Per node.
    pub max_evictions_per_node: u32,
    /// Per namespace.
    pub max_evictions_per_namespace: u32,
    /// At once.
    pub max_in_flight: u32,
    /// Per workload.
    pub max_unavailable_per_workload: u32,
    /// Priority threshold.
    pub max_priority: Option<i32>,
    /// Protected classes.
    pub protected_classes: Vec<String>,
    /// Minimum pod age.
    pub min_pod_age: Duration,
    /// Job pods movable.
    pub evict_job_pods: bool,
    /// Pods with local storage movable.
    pub evict_local_storage: bool,
    /// Pods with PVCs movable.
    pub evict_pvc_pods: bool,
    /// Pods with generic ephemeral volumes movable.
    pub evict_ephemeral_volume_pods: bool,
    /// The last Ready replica of a workload movable without a PDB allowing it.
    pub evict_single_replicas: bool,
    /// Extra movable controllers, `group/Kind`.
    pub movable_owner_kinds: Vec<String>,
    /// Schedulers whose placement the planner emulates; pods of any other stay put.
    pub binpack_schedulers: Vec<String>,
    /// Nodes younger than this receive no planned pod.
    pub min_node_age: Duration,
    /// Replacement timeout.
    pub reschedule_timeout: Duration,
    /// Pending GPU pods that stop a run.
    pub max_pending_gpu_pods: u32,
    /// Landing control: replacements are held and nominated onto their planned node.
    pub landing_control: bool,
    /// The longest a replacement is held.
    pub hold_timeout: Duration,
    /// Demand runs (`spec.demand`), when set.
    pub demand: Option<DemandPolicy>,
}

/// `spec.demand`, read.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DemandPolicy {
    /// How long a pod must have been unschedulable before it is served.
    pub min_wait: Duration,
    /// Demand runs outside the maintenance windows too.
    pub outside_windows: bool,
    /// Most evictions per demand run.
    pub max_evictions: u32,
    /// Most evictions of demand runs in any hour.
    pub max_evictions_per_hour: u32,
    /// How long the room is held for the pod once free.
    pub hold_timeout: Duration,
}

impl Default for Policy {
    fn default() -> Self {
        let spec: DefragPolicySpec =
            serde_json::from_str("{}").expect("an empty spec deserialises with defaults");
        Policy::from_spec(&spec).expect("defaults are valid")
    }
}

/// A duration as `1h2m3s` (whole seconds; `0s` for none), as [`parse_duration`] reads it.
pub fn duration_text(d: Duration) -> String {
    let s = d.as_secs();
    let (h, m, s) = (s / 3600, s / 60 % 60, s % 60);
    let mut out = String::new();
    if h > 0 {
        out += &format!("{h}h");
    }
    if m > 0 {
        out += &format!("{m}m");
    }
    if s > 0 || out.is_empty() {
        out += &format!("{s}s");
    }
    out
}

/// Parses a Go-style duration (`90s`, `1h30m`, `500ms`).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if s.is_empty() {
        return Err("empty duration".into());
    }
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    let mut total = Duration::ZERO;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits == 0 {
            return Err(format!("{s:?} is not a duration like 90s, 10m or 1h30m"));
        }
        let n: u64 = rest[..digits]
            .parse()
            .map_err(|_| format!("{s:?}: number too large"))?;
        rest = &rest[digits..];
        let (unit, len) = if rest.starts_with("ms") {
            (Duration::from_millis(1), 2)
        } else if rest.starts_with('s') {
            (Duration::from_secs(1), 1)
        } else if rest.starts_with('m') {
            (Duration::from_secs(60), 1)
        } else if rest.starts_with('h') {
            (Duration::from_secs(3600), 1)
        } else {
            return Err(format!("{s:?}: unit must be ms, s, m or h"));
        };
        rest = &rest[len..];
        let part = unit
            .checked_mul(u32::try_from(n).map_err(|_| format!("{s:?}: number too large"))?)
            .ok_or_else(|| format!("{s:?}: too long"))?;
        total = total
            .checked_add(part)
            .ok_or_else(|| format!("{s:?}: too long"))?;
    }
    Ok(total)
}

fn nonneg(field: &str, v: i32) -> Result<u32, PolicyError> {
    u32::try_from(v).map_err(|_| err(field, format!("must be >= 0, got {v}")))
}

impl Policy {
    /// Parses and checks a spec. Everything the CRD schema already refuses is checked
    /// again here: a policy read from a file never went through the API server.
    pub fn from_spec(spec: &DefragPolicySpec) -> Result<Policy, PolicyError> {
        let scope = scope_of(spec);
        let mut shapes = target_shapes(spec)?;
        normalise(&mut shapes);
        let rate = min_fragment_rate(spec)?;
        let l = &spec.limits;
        let s = &spec.safety;
        Ok(Policy {
            scope,
            shapes,
            from_pending: spec.target.as_ref().is_some_and(|t| t.from_pending),
            min_fragment_rate: rate,
            min_nodes_freed: nonneg(
                "spec.trigger.minNodesFreed",
                spec.trigger.as_ref().map_or(0, |t| t.min_nodes_freed),
            )?,
            max_evictions_per_run: nonneg(
                "spec.limits.maxEvictionsPerRun",
                l.max_evictions_per_run,
            )?,
            max_evictions_per_node: nonneg(
                "spec.limits.maxEvictionsPerNode",
                l.max_evictions_per_node,
            )?,
            max_evictions_per_namespace: nonneg(
                "spec.limits.maxEvictionsPerNamespace",
                l.max_evictions_per_namespace,
            )?,
            max_in_flight: nonneg("spec.limits.maxInFlight", l.max_in_flight)?.max(1),
            max_unavailable_per_workload: nonneg(
                "spec.limits.maxUnavailablePerWorkload",
                l.max_unavailable_per_workload,
            )?
            .max(1),
            max_priority: spec.priority.max_priority,
            protected_classes: spec.priority.protected_classes.clone(),
            min_pod_age: parse_duration(&s.min_pod_age)
                .map_err(|m| err("spec.safety.minPodAge", m))?,
            evict_job_pods: s.evict_job_pods,
            evict_local_storage: s.evict_local_storage,
            evict_pvc_pods: s.evict_pvc_pods,
            evict_ephemeral_volume_pods: s.evict_ephemeral_volume_pods,
            evict_single_replicas: s.evict_single_replicas,
            movable_owner_kinds: movable_owner_kinds(&s.movable_owner_kinds)?,
            binpack_schedulers: s.binpack_schedulers.clone(),
            min_node_age: parse_duration(&s.min_node_age)
                .map_err(|m| err("spec.safety.minNodeAge", m))?,
            reschedule_timeout: parse_duration(&s.reschedule_timeout)
                .map_err(|m| err("spec.safety.rescheduleTimeout", m))?,
            max_pending_gpu_pods: nonneg("spec.safety.maxPendingGpuPods", s.max_pending_gpu_pods)?,
            landing_control: spec.landing.mode == LandingMode::Nominate,
            hold_timeout: hold_timeout(&spec.landing.hold_timeout)?,
            demand: spec.demand.as_ref().map(demand_policy).transpose()?,
        })
    }
}

/// Reads the policy's scope: its node and pod selectors and namespaces (the system
/// namespaces are excluded unless `exclude` is given or they are included by name).
fn scope_of(spec: &DefragPolicySpec) -> Scope {
    Scope {
        node_selector: spec.node_selector.as_ref().map(label_selector),
        include: spec
            .namespaces
            .as_ref()
            .map(|n| n.include.clone())
            .unwrap_or_default(),
        exclude: match spec.namespaces.as_ref().and_then(|n| n.exclude.clone()) {
            Some(listed) => listed,
            None => {
                let included = spec.namespaces.as_ref().map(|n| &n.include);
                gpu_defrag_api::v1alpha1::SYSTEM_NAMESPACES
                    .iter()
                    .filter(|ns| included.is_none_or(|i| !i.iter().any(|x| x == *ns)))
                    .map(|ns| ns.to_string())
                    .collect()
            }
        },
        pod_selector: spec.pod_selector.as_ref().map(label_selector),
    }
}

/// Reads and checks `spec.target.shapes` (not yet normalised).
fn target_shapes(spec: &DefragPolicySpec) -> Result<Vec<TargetShape>, PolicyError> {
    let Some(t) = &spec.target else {
        return Ok(Vec::new());
    };
    t.shapes
        .iter()
        .enumerate()
        .map(|(i, s)| target_shape(i, s))
        .collect()
}

/// Reads and checks `spec.target.shapes[i]`.
fn target_shape(i: usize, s: &gpu_defrag_api::v1alpha1::Shape) -> Result<TargetShape, PolicyError> {
    let f = |n: &str| format!("spec.target.shapes[{i}].{n}");
    let gpus = u32::try_from(s.gpus)
        .ok()
        .filter(|g| *g <= 64)
        .ok_or_else(|| err(f("gpus"), format!("must be 0..64, got {}", s.gpus)))?;
    let milli = u32::try_from(s.milli_per_gpu)
        .ok()
        .filter(|m| (1..=GPU_MILLI).contains(m))
        .ok_or_else(|| {
            err(
                f("milliPerGpu"),
                format!("must be 1..1000, got {}", s.milli_per_gpu),
            )
        })?;
    if gpus > 1 && milli != GPU_MILLI {
        return Err(err(
            f("milliPerGpu"),
            "a shape of more than one GPU must use whole GPUs (1000)",
        ));
    }
    if !(s.weight.is_finite() && s.weight > 0.0) {
        return Err(err(
            f("weight"),
            format!("must be greater than 0, got {}", s.weight),
        ));
    }
    let cpu = s
        .cpu
        .as_deref()
        .map(formats::quantity_to_milli)
        .transpose()
        .map_err(|e| err(f("cpu"), e.to_string()))?;
    let memory = s
        .memory
        .as_deref()
        .map(formats::quantity_to_bytes)
        .transpose()
        .map_err(|e| err(f("memory"), e.to_string()))?;
    Ok(TargetShape {
        gpus,
        milli_per_gpu: milli,
        cpu,
        memory,
        models: s.models.clone(),
        weight: s.weight,
    })
}

/// Reads and checks `spec.trigger.minFragmentRate` (0.1 without a trigger).
fn min_fragment_rate(spec: &DefragPolicySpec) -> Result<f64, PolicyError> {
    let rate = spec
        .trigger
        .as_ref()
        .map(|t| t.min_fragment_rate)
        .unwrap_or(0.1);
    if !(0.0..=1.0).contains(&rate) {
        return Err(err(
            "spec.trigger.minFragmentRate",
            format!("must be between 0 and 1, got {rate}"),
        ));
    }
    Ok(rate)
}

impl Default for DemandPolicy {
    /// `spec.demand: {}`: every field at its documented default.
    fn default() -> Self {
        demand_policy(&gpu_defrag_api::v1alpha1::Demand::default())
            .expect("the demand defaults are valid")
    }
}

impl DemandPolicy {
    /// The most evictions the next demand run may make when demand runs made `spent` in
    /// the last hour: `maxEvictions`, lowered to what `maxEvictionsPerHour` leaves; `None`
    /// when the hour's allowance is spent.
    pub fn allowance(&self, spent: u32) -> Option<u32> {
        let left = self.max_evictions_per_hour.saturating_sub(spent);
        (left > 0).then(|| self.max_evictions.min(left))
    }
}

/// Reads `spec.demand`.
fn demand_policy(d: &gpu_defrag_api::v1alpha1::Demand) -> Result<DemandPolicy, PolicyError> {
    let min_wait = parse_duration(&d.min_wait).map_err(|m| err("spec.demand.minWait", m))?;
    let hold = parse_duration(&d.hold_timeout).map_err(|m| err("spec.demand.holdTimeout", m))?;
    if hold < Duration::from_secs(1) || hold > Duration::from_secs(3600) {
        return Err(err(
            "spec.demand.holdTimeout",
            format!("{:?} is outside 1s..1h", d.hold_timeout),
        ));
    }
    let positive = |field: &str, v: i32| -> Result<u32, PolicyError> {
        if v < 1 {
            return Err(err(field, format!("must be at least 1, got {v}")));
        }
        Ok(v as u32)
    };
    Ok(DemandPolicy {
        min_wait,
        outside_windows: d.outside_windows,
        max_evictions: positive("spec.demand.maxEvictions", d.max_evictions)?,
        max_evictions_per_hour: positive(
            "spec.demand.maxEvictionsPerHour",
            d.max_evictions_per_hour,
        )?,
        hold_timeout: hold,
    })
}

/// Reads `landing.holdTimeout`: 1s to 5m.
fn hold_timeout(text: &str) -> Result<Duration, PolicyError> {
    let field = "spec.landing.holdTimeout";
    let d = parse_duration(text).map_err(|m| err(field, m))?;
    if d < Duration::from_secs(1) || d > Duration::from_secs(300) {
        return Err(err(field, format!("{text:?} is outside 1s..5m")));
    }
    Ok(d)
}

/// Checks `safety.movableOwnerKinds` entries: `group/Kind` or `Kind`.
fn movable_owner_kinds(kinds: &[String]) -> Result<Vec<String>, PolicyError> {
    for (i, k) in kinds.iter().enumerate() {
        let (group, kind) = k.rsplit_once('/').unwrap_or(("", k));
        let group_ok = group
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '-');
        let kind_ok = kind.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
            && kind.chars().all(|c| c.is_ascii_alphanumeric());
        if !(group_ok && kind_ok) || k.len() > 253 || (k.contains('/') && group.is_empty()) {
            return Err(err(
                format!("spec.safety.movableOwnerKinds[{i}]"),
                format!("{k:?} is not group/Kind (e.g. example.com/InferenceServer) or Kind"),
            ));
        }
    }
    Ok(kinds.to_vec())
}

/// Normalises weights to sum 1 (no-op on an empty list).
pub fn normalise(shapes: &mut [TargetShape]) {
    let total: f64 = shapes.iter().map(|s| s.weight).sum();
    if total > 0.0 {
        for s in shapes {
            s.weight /= total;
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_demand_runs_allowance_is_its_limit_lowered_to_what_the_hour_leaves() {
        let d = super::DemandPolicy::default();
        assert_eq!(d.min_wait, super::Duration::from_secs(600));
        assert_eq!((d.max_evictions, d.max_evictions_per_hour), (16, 64));
        assert_eq!(d.allowance(0), Some(16));
        assert_eq!(d.allowance(50), Some(14));
        assert_eq!(d.allowance(64), None);
        assert_eq!(d.allowance(90), None);
    }

    #[test]
    fn system_namespaces_are_excluded_unless_said_otherwise() {
        let spec =
            |v: serde_json::Value| -> DefragPolicySpec { serde_json::from_value(v).unwrap() };
        let default = Policy::from_spec(&spec(serde_json::json!({}))).unwrap();
        assert!(!default.scope.covers_namespace("kube-system"));
        assert!(!default.scope.covers_namespace("kube-node-lease"));
        assert!(default.scope.covers_namespace("ml"));
        let none =
            Policy::from_spec(&spec(serde_json::json!({"namespaces": {"exclude": []}}))).unwrap();
        assert!(none.scope.covers_namespace("kube-system"));
        let included = Policy::from_spec(&spec(
            serde_json::json!({"namespaces": {"include": ["kube-system"]}}),
        ))
        .unwrap();
        assert!(
            included.scope.covers_namespace("kube-system"),
            "listed in include"
        );
        assert!(!included.scope.covers_namespace("ml"));
    }

    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert!(parse_duration("").is_err());
        assert!(parse_duration("10").is_err());
        assert!(parse_duration("m").is_err());
        assert!(parse_duration("5d").is_err());
        assert!(parse_duration("99999999999999999999h").is_err());
    }

    #[test]
    fn weights_are_normalised_and_bad_values_name_the_field() {
        let spec: DefragPolicySpec = serde_json::from_value(serde_json::json!({
            "target": {"shapes": [{"gpus": 8, "weight": 1.0}, {"gpus": 1, "milliPerGpu": 500, "weight": 3.0}]}
        }))
        .unwrap();
        let p = Policy::from_spec(&spec).unwrap();
        assert!((p.shapes[0].weight - 0.25).abs() < 1e-12);
        assert!((p.shapes[1].weight - 0.75).abs() < 1e-12);

        let bad: DefragPolicySpec = serde_json::from_value(serde_json::json!({
            "target": {"shapes": [{"gpus": 1, "cpu": "lots"}]}
        }))
        .unwrap();
        let e = Policy::from_spec(&bad).unwrap_err();
        assert_eq!(e.field, "spec.target.shapes[0].cpu");

        let neg: DefragPolicySpec =
            serde_json::from_value(serde_json::json!({"limits": {"maxEvictionsPerRun": -1}}))
                .unwrap();
        assert_eq!(
            Policy::from_spec(&neg).unwrap_err().field,
            "spec.limits.maxEvictionsPerRun"
        );
    }
}
