//! Fidelity of the scheduler emulation: a seeded differential test of
//! `gpu_defrag_core::sched::fit` against the real kube-scheduler of the local control plane.
//!
//! Each seed makes a small scenario in a namespace of its own: a few kwok nodes (zones,
//! racks, tiers, a numeric rank, taints, a cordon, allocatable cpu, memory, pods, GPUs, an
//! RDMA extended resource, ephemeral-storage, hugepages) and pods bound to them by name
//! (labels, required pod affinity and anti-affinity, `DoNotSchedule` spread constraints,
//! host ports, requests). Then it generates pods to place ("probes", with random mixes of the
//! same constraints, tolerations, node selectors and node affinity) and, for every
//! (probe, node) pair, compares
//!
//! * core's verdict: `sched::fit` on a model built from the live nodes and pods plus the
//!   probe as the API server would store it (a dry-run create), pending, with
//! * the real scheduler's verdict: the probe created pinned to that node alone, then bound
//!   (fits) or `PodScheduled=False/Unschedulable` (does not); deleted before the next pair.
//!
//! **How a probe is pinned.** Not by node affinity on `kubernetes.io/hostname`: with the
//! default `nodeAffinityPolicy: Honor` PodTopologySpread counts only the nodes the pod's
//! required node affinity allows, so a hostname pin shrinks the spread to one domain and
//! changes the verdict (kube-scheduler 1.37 `podtopologyspread.calPreFilterState` ->
//! `matchNodeInclusionPolicies`); a taint pin has the same flaw under
//! `nodeTaintsPolicy: Honor`. Every node instead has one unit of an extended resource of its
//! own, `pin.fidelity.gpu-defrag.io/<node>`, and the pinned probe asks for the one of its
//! target: every other node fails NodeResourcesFit on it, and no other filter reads it
//! (NodeResourcesFit checks each resource on its own). The pinned probe therefore passes
//! the target's filters exactly when the probe itself would.
//!
//! Pairs run one at a time (a probe left on a node would change the next verdict); a
//! disagreement is observed a second time after a pause, so that a scheduler cache that had
//! not yet seen the previous probe's deletion cannot make one. The test asserts no unsafe
//! disagreement (core says it fits, the scheduler leaves it unschedulable) and prints every
//! disagreement, the conservative share and per-filter tallies. `FIDELITY_SEED=<n>` replaces
//! the fixed seeds.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use gpu_defrag_core::{
    frag::Capacity,
    ingest::{Objects, build_cluster},
    sched::{self, Filter, Fit, Occupancy},
};
use gpu_defrag_e2e::{
    ClusterOptions, GpuNodes, TestCluster,
    fixtures::{FAKE_IMAGE, wait_for_every},
};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};

/// The scenarios' seeds (one scenario each) unless `FIDELITY_SEED` is set.
const SEEDS: [u64; 9] = [7, 19, 23, 42, 58, 71, 88, 97, 101];
/// Nodes per scenario.
const NODES: usize = 5;
/// Probes per scenario: each is tried on every node.
const PROBES: usize = 8;
/// At least this many pairs are compared.
const MIN_PAIRS: usize = 300;

const HOSTNAME: &str = "kubernetes.io/hostname";
const ZONE: &str = "topology.kubernetes.io/zone";
/// On some nodes only: terms and constraints over it meet nodes without the key.
const RACK: &str = "fidelity.gpu-defrag.io/rack";
const TIER: &str = "fidelity.gpu-defrag.io/tier";
/// A number, for `Gt` / `Lt`.
const RANK: &str = "fidelity.gpu-defrag.io/rank";
const DEDICATED: &str = "fidelity.gpu-defrag.io/dedicated";
const MAINTENANCE: &str = "fidelity.gpu-defrag.io/maintenance";
const SPOT: &str = "fidelity.gpu-defrag.io/spot";
const CORDON_TAINT: &str = "node.kubernetes.io/unschedulable";
const GPU: &str = "nvidia.com/gpu";
const RDMA: &str = "example.com/rdma";
const EPHEMERAL: &str = "ephemeral-storage";
const HUGEPAGES: &str = "hugepages-2Mi";
/// The pin resource's domain: `pin.fidelity.gpu-defrag.io/<node>`.
const PIN: &str = "pin.fidelity.gpu-defrag.io";
const APPS: [&str; 4] = ["web", "db", "cache", "batch"];
const GROUPS: [&str; 2] = ["g1", "g2"];

/// How long the scheduler may take to decide on a probe.
const VERDICT_TIMEOUT: Duration = Duration::from_secs(30);
/// How often a probe is looked at.
const POLL: Duration = Duration::from_millis(15);
/// After a probe is gone, so that the scheduler's cache has seen it go.
const SETTLE: Duration = Duration::from_millis(30);
/// Before a disagreement is observed again (longer than the scheduler's first backoff).
const RECHECK: Duration = Duration::from_millis(1500);

// === seeded generation ===

/// SplitMix64: a small deterministic generator, the same on every platform and version.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x5DEE_CE66_D1CE_4E5B)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// True with probability `percent`%.
    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }

    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())]
    }
}

/// What a pod asks for (zero: not asked).
#[derive(Debug, Clone, Copy, Default)]
struct Req {
    cpu_m: u64,
    mem_mi: u64,
    gpus: u64,
    rdma: u64,
    ephemeral_gi: u64,
    hugepages_mi: u64,
}

impl Req {
    /// The container's `resources`: cpu, memory, ephemeral-storage as requests; GPUs, RDMA
    /// and hugepages as requests equal to limits (as the API requires of them).
    fn resources(&self) -> Value {
        let mut requests = serde_json::Map::new();
        let mut limits = serde_json::Map::new();
        let mut put = |k: &str, v: String, limit: bool| {
            requests.insert(k.to_string(), json!(v));
            if limit {
                limits.insert(k.to_string(), json!(v));
            }
        };
        if self.cpu_m > 0 {
            put("cpu", format!("{}m", self.cpu_m), false);
        }
        if self.mem_mi > 0 {
            put("memory", format!("{}Mi", self.mem_mi), false);
        }
        if self.ephemeral_gi > 0 {
            put(EPHEMERAL, format!("{}Gi", self.ephemeral_gi), false);
        }
        if self.gpus > 0 {
            put(GPU, self.gpus.to_string(), true);
        }
        if self.rdma > 0 {
            put(RDMA, self.rdma.to_string(), true);
        }
        if self.hugepages_mi > 0 {
            put(HUGEPAGES, format!("{}Mi", self.hugepages_mi), true);
        }
        json!({"requests": requests, "limits": limits})
    }
}

/// One node of a scenario.
#[derive(Debug, Clone)]
struct NodeSpec {
    name: String,
    labels: BTreeMap<String, String>,
    /// (key, value, effect).
    taints: Vec<(&'static str, &'static str, &'static str)>,
    cordoned: bool,
    cpu: u64,
    mem_gi: u64,
    pods: u64,
    gpus: u64,
    rdma: u64,
    ephemeral_gi: u64,
    hugepages_mi: u64,
}

impl NodeSpec {
    /// Random labels (a node may lack the zone, rack or tier), taints, a cordon now and
    /// then, and allocatable figures.
    fn generate(rng: &mut Rng, name: String) -> NodeSpec {
        let mut labels = BTreeMap::new();
        if rng.chance(85) {
            labels.insert(ZONE.into(), rng.pick(&["za", "zb", "zc"]).into());
        }
        if rng.chance(50) {
            labels.insert(RACK.into(), rng.pick(&["r1", "r2"]).into());
        }
        if rng.chance(60) {
            labels.insert(TIER.into(), rng.pick(&["gold", "silver"]).into());
        }
        labels.insert(RANK.into(), rng.below(10).to_string());
        let mut taints = Vec::new();
        if rng.chance(20) {
            taints.push((DEDICATED, "ml", "NoSchedule"));
        }
        if rng.chance(10) {
            taints.push((MAINTENANCE, "soon", "NoExecute"));
        }
        if rng.chance(15) {
            taints.push((SPOT, "true", "PreferNoSchedule"));
        }
        NodeSpec {
            name,
            labels,
            taints,
            cordoned: rng.chance(5),
            cpu: rng.pick(&[4, 8, 16, 32]),
            mem_gi: rng.pick(&[8, 32, 64]),
            pods: rng.pick(&[4, 6, 10, 16]),
            gpus: rng.pick(&[0, 2, 4, 8]),
            rdma: rng.pick(&[0, 0, 1, 2]),
            ephemeral_gi: rng.pick(&[0, 20, 100]),
            hugepages_mi: rng.pick(&[0, 0, 512]),
        }
    }

    /// The pin resource of this node.
    fn pin(&self) -> String {
        format!("{PIN}/{}", self.name)
    }

    /// The Node object (the harness's kwok node, with this node's figures).
    fn object(&self) -> Result<Node> {
        let mut n = GpuNodes::new(1, self.gpus as u32);
        n.cpu = self.cpu.to_string();
        n.memory = format!("{}Gi", self.mem_gi);
        n.pods = self.pods as u32;
        n.labels = self.labels.clone();
        for (k, v, e) in &self.taints {
            n = n.taint(k, v, e);
        }
        n = n.resource(self.pin(), "1");
        if self.rdma > 0 {
            n = n.resource(RDMA, self.rdma.to_string());
        }
        if self.ephemeral_gi > 0 {
            n = n.resource(EPHEMERAL, format!("{}Gi", self.ephemeral_gi));
        }
        if self.hugepages_mi > 0 {
            n = n.resource(HUGEPAGES, format!("{}Mi", self.hugepages_mi));
        }
        n.node(&self.name)
    }

    /// Whether `add` fits beside what its `pods` pods already ask for (`used`).
    fn holds(&self, used: &Req, pods: u64, add: &Req) -> bool {
        pods < self.pods
            && used.cpu_m + add.cpu_m <= self.cpu * 1000
            && used.mem_mi + add.mem_mi <= self.mem_gi * 1024
            && used.gpus + add.gpus <= self.gpus
            && used.rdma + add.rdma <= self.rdma
            && used.ephemeral_gi + add.ephemeral_gi <= self.ephemeral_gi
            && used.hugepages_mi + add.hugepages_mi <= self.hugepages_mi
    }

    /// One line for a disagreement report.
    fn summary(&self) -> String {
        let labels: Vec<String> = self
            .labels
            .iter()
            .map(|(k, v)| format!("{}={v}", k.rsplit('/').next().unwrap_or(k)))
            .collect();
        let taints: Vec<String> = self
            .taints
            .iter()
            .map(|(k, v, e)| format!("{}={v}:{e}", k.rsplit('/').next().unwrap_or(k)))
            .collect();
        format!(
            "{} [{}] taints [{}]{} cpu {} mem {}Gi pods {} gpu {} rdma {} eph {}Gi huge {}Mi",
            self.name,
            labels.join(" "),
            taints.join(" "),
            if self.cordoned { " CORDONED" } else { "" },
            self.cpu,
            self.mem_gi,
            self.pods,
            self.gpus,
            self.rdma,
            self.ephemeral_gi,
            self.hugepages_mi,
        )
    }
}

/// A label selector over the scenario's pod labels.
fn selector(rng: &mut Rng) -> Value {
    match rng.below(10) {
        0..=4 => json!({"matchLabels": {"app": rng.pick(&APPS)}}),
        5 | 6 => json!({"matchExpressions": [
            {"key": "app", "operator": "In", "values": [rng.pick(&APPS), rng.pick(&APPS)]}]}),
        7 => json!({"matchLabels": {"group": rng.pick(&GROUPS)}}),
        8 => {
            json!({"matchExpressions": [{"key": "app", "operator": "NotIn", "values": [rng.pick(&APPS)]}]})
        }
        _ => json!({"matchLabels": {"app": rng.pick(&APPS), "group": rng.pick(&GROUPS)}}),
    }
}

fn topology_key(rng: &mut Rng) -> &'static str {
    rng.pick(&[HOSTNAME, HOSTNAME, ZONE, ZONE, RACK])
}

/// One required pod (anti-)affinity term (now and then with `matchLabelKeys`).
fn affinity_term(rng: &mut Rng) -> Value {
    let mut t = json!({"labelSelector": selector(rng), "topologyKey": topology_key(rng)});
    if rng.chance(10) {
        // The key may not be in the selector too.
        t["labelSelector"] = json!({"matchLabels": {"app": rng.pick(&APPS)}});
        t["matchLabelKeys"] = json!(["group"]);
    }
    t
}

/// One `DoNotSchedule` topology spread constraint, over the pod's own app mostly, with
/// `minDomains` and the node inclusion policies now and then.
fn spread_constraint(rng: &mut Rng, app: &str) -> Value {
    let own = rng.chance(70);
    let sel = if own {
        json!({"matchLabels": {"app": app}})
    } else {
        selector(rng)
    };
    let mut c = json!({
        "maxSkew": rng.pick(&[1, 1, 2]),
        "topologyKey": topology_key(rng),
        "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": sel,
    });
    if rng.chance(5) {
        // An empty selector: the scheduler counts no pod with it.
        c["labelSelector"] = json!({});
    } else if rng.chance(10) {
        c["labelSelector"] = json!({"matchExpressions": [{"key": "app", "operator": "Exists"}]});
        c["matchLabelKeys"] = json!(["group"]);
    }
    if rng.chance(30) {
        c["minDomains"] = json!(rng.pick(&[2, 3, 4]));
    }
    if let Some(p) = rng.pick(&[None, None, Some("Honor"), Some("Ignore")]) {
        c["nodeAffinityPolicy"] = json!(p);
    }
    if let Some(p) = rng.pick(&[None, None, Some("Honor"), Some("Ignore")]) {
        c["nodeTaintsPolicy"] = json!(p);
    }
    c
}

/// One node selector requirement over the scenario's node labels (or `metadata.name`).
fn node_requirement(rng: &mut Rng, nodes: &[NodeSpec]) -> (bool, Value) {
    let node = rng
        .pick(&nodes.iter().map(|n| n.name.as_str()).collect::<Vec<_>>())
        .to_string();
    let zone = rng.pick(&["za", "zb", "zc"]);
    match rng.below(9) {
        0 => (
            false,
            json!({"key": ZONE, "operator": "In", "values": [zone]}),
        ),
        1 => (
            false,
            json!({"key": ZONE, "operator": "NotIn", "values": [zone]}),
        ),
        2 => (false, json!({"key": TIER, "operator": "Exists"})),
        3 => (false, json!({"key": RACK, "operator": "DoesNotExist"})),
        4 => (
            false,
            json!({"key": RANK, "operator": "Gt", "values": [rng.below(9).to_string()]}),
        ),
        5 => (
            false,
            json!({"key": RANK, "operator": "Lt", "values": [rng.below(9).to_string()]}),
        ),
        6 => (
            false,
            json!({"key": HOSTNAME, "operator": "In", "values": [node]}),
        ),
        7 => (
            true,
            json!({"key": "metadata.name", "operator": "NotIn", "values": [node]}),
        ),
        _ => (
            false,
            json!({"key": TIER, "operator": "In", "values": ["gold"]}),
        ),
    }
}

/// A required node affinity of one or two terms (ORed), each of one or two requirements.
fn node_affinity(rng: &mut Rng, nodes: &[NodeSpec]) -> Value {
    let terms: Vec<Value> = (0..1 + usize::from(rng.chance(30)))
        .map(|_| {
            let mut exprs = Vec::new();
            let mut fields = Vec::new();
            for _ in 0..1 + usize::from(rng.chance(40)) {
                let (field, r) = node_requirement(rng, nodes);
                if field { fields.push(r) } else { exprs.push(r) }
            }
            let mut t = json!({});
            if !exprs.is_empty() {
                t["matchExpressions"] = json!(exprs);
            }
            if !fields.is_empty() {
                t["matchFields"] = json!(fields);
            }
            t
        })
        .collect();
    json!({"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}})
}

/// Tolerations of the scenario's taints (and of a cordon, and of everything, now and then).
fn tolerations(rng: &mut Rng, all_taints: bool) -> Vec<Value> {
    let mut out = Vec::new();
    if all_taints || rng.chance(50) {
        out.push(if rng.chance(50) {
            json!({"key": DEDICATED, "operator": "Equal", "value": "ml", "effect": "NoSchedule"})
        } else {
            json!({"key": DEDICATED, "operator": "Exists"})
        });
    }
    if all_taints || rng.chance(40) {
        out.push(json!({"key": MAINTENANCE, "operator": "Exists", "effect": "NoExecute"}));
    }
    if rng.chance(10) {
        out.push(
            json!({"key": DEDICATED, "operator": "Equal", "value": "web", "effect": "NoSchedule"}),
        );
    }
    if rng.chance(10) {
        // The wrong effect: it does not tolerate the NoExecute taint.
        out.push(json!({"key": MAINTENANCE, "operator": "Exists", "effect": "NoSchedule"}));
    }
    if rng.chance(8) {
        out.push(json!({"key": CORDON_TAINT, "operator": "Exists", "effect": "NoSchedule"}));
    }
    if rng.chance(5) {
        out.push(json!({"operator": "Exists"}));
    }
    out
}

/// A host port: 8080/TCP on every address, 9090/TCP on 127.0.0.1 only, or 8080/UDP.
fn host_port(rng: &mut Rng) -> Value {
    match rng.below(4) {
        0 | 1 => json!({"containerPort": 8080, "hostPort": 8080}),
        2 => json!({"containerPort": 9090, "hostPort": 9090, "hostIP": "127.0.0.1"}),
        _ => json!({"containerPort": 8080, "hostPort": 8080, "protocol": "UDP"}),
    }
}

/// A pod object: one container with `req` and `ports`, labels, and `spec` merged in.
fn pod_object(name: &str, labels: Value, req: &Req, ports: Vec<Value>, spec: Value) -> Result<Pod> {
    let mut s = json!({
        "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "main", "image": FAKE_IMAGE, "resources": req.resources()}],
    });
    if !ports.is_empty() {
        s["containers"][0]["ports"] = json!(ports);
    }
    if let (Some(s), Value::Object(extra)) = (s.as_object_mut(), spec) {
        s.extend(extra);
    }
    serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}, "spec": s}))
        .with_context(|| format!("building pod {name}"))
}

/// A pod already running: bound by name to a node that has room for it (tolerating the
/// node's `NoExecute` taints, so that nothing evicts it), with the constraints a workload
/// has: labels, host ports, anti-affinity mostly, affinity and spread now and then.
fn existing_pods(rng: &mut Rng, nodes: &[NodeSpec]) -> Result<Vec<Pod>> {
    let mut used = vec![(Req::default(), 0u64, Vec::<u16>::new()); nodes.len()];
    let mut out = Vec::new();
    for i in 0..3 + rng.below(8) {
        let req = Req {
            cpu_m: rng.pick(&[100, 500, 1000, 2000, 3000]),
            mem_mi: rng.pick(&[256, 1024, 4096]),
            gpus: rng.pick(&[0, 0, 0, 1, 2]),
            rdma: u64::from(rng.chance(15)),
            ephemeral_gi: if rng.chance(15) { 5 } else { 0 },
            hugepages_mi: if rng.chance(8) { 256 } else { 0 },
        };
        let room: Vec<usize> = (0..nodes.len())
            .filter(|&n| nodes[n].holds(&used[n].0, used[n].1, &req))
            .collect();
        if room.is_empty() {
            continue;
        }
        let n = rng.pick(&room);
        let app = rng.pick(&APPS);
        let mut ports = Vec::new();
        if rng.chance(50) {
            let p = host_port(rng);
            let port = p["hostPort"].as_u64().unwrap_or(0) as u16;
            if !used[n].2.contains(&port) {
                used[n].2.push(port);
                ports.push(p);
            }
        }
        let mut spec = json!({"nodeName": nodes[n].name});
        let no_execute: Vec<Value> = nodes[n]
            .taints
            .iter()
            .filter(|t| t.2 == "NoExecute")
            .map(|(k, v, e)| json!({"key": k, "operator": "Equal", "value": v, "effect": e}))
            .collect();
        if !no_execute.is_empty() {
            spec["tolerations"] = json!(no_execute);
        }
        let mut affinity = json!({});
        if rng.chance(30) {
            affinity["podAntiAffinity"] = json!({
                "requiredDuringSchedulingIgnoredDuringExecution": [affinity_term(rng)]});
        }
        if rng.chance(10) {
            affinity["podAffinity"] = json!({
                "requiredDuringSchedulingIgnoredDuringExecution": [affinity_term(rng)]});
        }
        if affinity != json!({}) {
            spec["affinity"] = affinity;
        }
        if rng.chance(10) {
            spec["topologySpreadConstraints"] = json!([spread_constraint(rng, app)]);
        }
        if rng.chance(10) {
            spec["initContainers"] = json!([init_container(rng, &["500m", "2"])]);
        }
        let labels = json!({"app": app, "group": rng.pick(&GROUPS)});
        out.push(pod_object(&format!("e{i}"), labels, &req, ports, spec)?);
        used[n].0 = Req {
            cpu_m: used[n].0.cpu_m + req.cpu_m,
            mem_mi: used[n].0.mem_mi + req.mem_mi,
            gpus: used[n].0.gpus + req.gpus,
            rdma: used[n].0.rdma + req.rdma,
            ephemeral_gi: used[n].0.ephemeral_gi + req.ephemeral_gi,
            hugepages_mi: used[n].0.hugepages_mi + req.hugepages_mi,
        };
        used[n].1 += 1;
    }
    Ok(out)
}

/// A pod to place. Inter-pod probes (about 40%) have small requests, tolerate the
/// scenario's taints more often and carry pod affinity, anti-affinity or spread
/// constraints (one at least), so that those filters decide; the others mix requests of
/// every size, node selectors, node affinity, tolerations, host ports and init containers.
fn probe(rng: &mut Rng, name: &str, nodes: &[NodeSpec]) -> Result<Pod> {
    let inter = rng.chance(40);
    let app = rng.pick(&APPS);
    let req = if inter {
        Req {
            cpu_m: rng.pick(&[100, 250]),
            mem_mi: rng.pick(&[128, 512]),
            gpus: rng.pick(&[0, 0, 1]),
            ..Req::default()
        }
    } else {
        let hugepages_mi = if rng.chance(8) {
            rng.pick(&[256, 1024])
        } else {
            0
        };
        Req {
            cpu_m: rng.pick(&[0, 250, 500, 1000, 2000, 6000]),
            mem_mi: rng
                .pick(&[0, 256, 512, 1024, 4096, 20480])
                .max(if hugepages_mi > 0 { 128 } else { 0 }),
            gpus: rng.pick(&[0, 0, 0, 0, 1, 2, 8]),
            rdma: if rng.chance(15) { rng.pick(&[1, 2]) } else { 0 },
            ephemeral_gi: if rng.chance(15) {
                rng.pick(&[5, 50])
            } else {
                0
            },
            hugepages_mi,
        }
    };
    let mut spec = json!({});
    let mut ports = Vec::new();
    if rng.chance(if inter { 15 } else { 45 }) {
        ports.push(host_port(rng));
    }
    if rng.chance(if inter { 10 } else { 15 }) {
        let mut sel = serde_json::Map::new();
        match rng.below(3) {
            0 => sel.insert(TIER.into(), json!("gold")),
            1 => sel.insert(ZONE.into(), json!(rng.pick(&["za", "zb"]))),
            _ => sel.insert(RACK.into(), json!("r1")),
        };
        spec["nodeSelector"] = Value::Object(sel);
    }
    let mut affinity = json!({});
    if rng.chance(if inter { 10 } else { 25 }) {
        affinity["nodeAffinity"] = node_affinity(rng, nodes);
    }
    let tolerate_all = inter && rng.chance(75);
    let tols = tolerations(rng, tolerate_all);
    if !tols.is_empty() {
        spec["tolerations"] = json!(tols);
    }
    if !inter && rng.chance(12) {
        spec["initContainers"] = json!([init_container(rng, &["1", "6", "14"])]);
    }
    if inter {
        let (with_affinity, with_anti) = (rng.chance(35), rng.chance(40));
        let with_spread = rng.chance(60) || !(with_affinity || with_anti);
        if with_affinity {
            let terms: Vec<Value> = (0..1 + usize::from(rng.chance(40)))
                .map(|_| affinity_term(rng))
                .collect();
            affinity["podAffinity"] =
                json!({"requiredDuringSchedulingIgnoredDuringExecution": terms});
        }
        if with_anti {
            let terms: Vec<Value> = (0..1 + usize::from(rng.chance(20)))
                .map(|_| affinity_term(rng))
                .collect();
            affinity["podAntiAffinity"] =
                json!({"requiredDuringSchedulingIgnoredDuringExecution": terms});
        }
        if with_spread {
            let mut cs: Vec<Value> = Vec::new();
            for _ in 0..1 + usize::from(rng.chance(20)) {
                let c = spread_constraint(rng, app);
                // One constraint per topology key (the API's rule).
                if cs.iter().all(|x| x["topologyKey"] != c["topologyKey"]) {
                    cs.push(c);
                }
            }
            spec["topologySpreadConstraints"] = json!(cs);
        }
    }
    if affinity != json!({}) {
        spec["affinity"] = affinity;
    }
    let labels = json!({"app": app, "group": rng.pick(&GROUPS)});
    pod_object(name, labels, &req, ports, spec)
}

/// An init container: a plain one (its needs count alone, before the app starts), or a
/// sidecar (`restartPolicy: Always`, counted with the app), with cpu or a host port.
fn init_container(rng: &mut Rng, cpus: &[&str]) -> Value {
    let mut c = json!({
        "name": "init",
        "image": FAKE_IMAGE,
        "resources": {"requests": {"cpu": rng.pick(cpus), "memory": "256Mi"}},
    });
    if rng.chance(50) {
        c["restartPolicy"] = json!("Always");
    }
    if rng.chance(30) {
        c["ports"] = json!([{"containerPort": 8080, "hostPort": 8080}]);
    }
    c
}

/// One scenario: its nodes, the pods on them, the pods to place.
struct Scenario {
    nodes: Vec<NodeSpec>,
    existing: Vec<Pod>,
    probes: Vec<Pod>,
}

impl Scenario {
    fn generate(seed: u64, index: usize) -> Result<Scenario> {
        let mut rng = Rng::new(seed);
        let nodes: Vec<NodeSpec> = (0..NODES)
            .map(|j| NodeSpec::generate(&mut rng, format!("fid-s{index}-n{j}")))
            .collect();
        let existing = existing_pods(&mut rng, &nodes)?;
        let probes = (0..PROBES)
            .map(|i| probe(&mut rng, &format!("p{i}"), &nodes))
            .collect::<Result<_>>()?;
        Ok(Scenario {
            nodes,
            existing,
            probes,
        })
    }
}

// === the cluster side ===

fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// Creates the scenario's nodes, waits until they are Ready, cordons the cordoned ones
/// (with the taint the node lifecycle controller would add, so that nothing changes under
/// the test), and binds the existing pods.
async fn set_up(cluster: &TestCluster, client: &Client, ns: &str, sc: &Scenario) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    for n in &sc.nodes {
        nodes
            .create(&PostParams::default(), &n.object()?)
            .await
            .with_context(|| format!("creating node {}", n.name))?;
    }
    let names: Vec<String> = sc.nodes.iter().map(|n| n.name.clone()).collect();
    cluster
        .wait_nodes_ready(&names, Duration::from_secs(60))
        .await?;
    for n in sc.nodes.iter().filter(|n| n.cordoned) {
        let mut taints: Vec<Value> = n
            .taints
            .iter()
            .map(|(k, v, e)| json!({"key": k, "value": v, "effect": e}))
            .collect();
        taints.push(json!({"key": CORDON_TAINT, "effect": "NoSchedule"}));
        let patch = json!({"spec": {"unschedulable": true, "taints": taints}});
        nodes
            .patch(&n.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    for p in &sc.existing {
        pods.create(&PostParams::default(), p)
            .await
            .context("creating an existing pod")?;
    }
    // Both schedulers of this comparison read the same objects; give the real one's
    // informers a moment to have them all.
    tokio::time::sleep(Duration::from_millis(300)).await;
    Ok(())
}

/// Deletes the scenario's pods and nodes and waits until they are gone: the next scenario
/// starts on an empty cluster (a node left over would be a spread domain).
async fn tear_down(client: &Client, ns: &str, sc: &Scenario) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let now = DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    pods.delete_collection(&now, &ListParams::default()).await?;
    wait_for_every(
        "the scenario's pods to go",
        Duration::from_secs(60),
        POLL,
        || async {
            Ok(pods
                .list(&ListParams::default())
                .await?
                .items
                .is_empty()
                .then_some(()))
        },
    )
    .await?;
    let nodes: Api<Node> = Api::all(client.clone());
    for n in &sc.nodes {
        if let Err(e) = nodes.delete(&n.name, &DeleteParams::default()).await
            && !is_not_found(&e)
        {
            return Err(e.into());
        }
    }
    wait_for_every(
        "the scenario's nodes to go",
        Duration::from_secs(60),
        POLL,
        || async {
            Ok(nodes
                .list(&ListParams::default())
                .await?
                .items
                .is_empty()
                .then_some(()))
        },
    )
    .await
}

/// The real scheduler's verdict on one pinned probe.
#[derive(Debug, Clone)]
enum Verdict {
    Bound,
    /// The `PodScheduled` condition's message.
    Unschedulable(String),
}

/// `probe` pinned to `node`: it also asks for the node's own pin resource.
fn pinned(probe: &Pod, name: &str, node: &NodeSpec) -> Result<Pod> {
    let mut v = serde_json::to_value(probe)?;
    v["metadata"]["name"] = json!(name);
    let res = &mut v["spec"]["containers"][0]["resources"];
    for list in ["requests", "limits"] {
        res[list][node.pin()] = json!("1");
    }
    Ok(serde_json::from_value(v)?)
}

/// The condition message when the scheduler has found no node for the pod.
fn unschedulable(p: &Pod) -> Option<String> {
    p.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find_map(|c| {
            (c.type_ == "PodScheduled"
                && c.status == "False"
                && c.reason.as_deref() == Some("Unschedulable"))
            .then(|| c.message.clone().unwrap_or_default())
        })
}

/// Creates `pod` (pinned to `node`), waits for the scheduler's verdict, deletes it and
/// waits until it is gone (and a little more, for the scheduler's cache).
async fn observe(pods: &Api<Pod>, pod: &Pod, node: &str) -> Result<Verdict> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    pods.create(&PostParams::default(), pod)
        .await
        .with_context(|| format!("creating probe {name}"))?;
    let decided = wait_for_every(
        &format!("the scheduler's verdict on {name}"),
        VERDICT_TIMEOUT,
        POLL,
        || async {
            let p = pods.get(&name).await?;
            let bound = p.spec.as_ref().and_then(|s| s.node_name.clone());
            Ok((bound.is_some() || unschedulable(&p).is_some()).then_some(p))
        },
    )
    .await;
    let now = DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    if let Err(e) = pods.delete(&name, &now).await
        && !is_not_found(&e)
    {
        return Err(e.into());
    }
    wait_for_every(&format!("{name} to go"), VERDICT_TIMEOUT, POLL, || async {
        match pods.get(&name).await {
            Err(e) if is_not_found(&e) => Ok(Some(())),
            Err(e) => Err(e.into()),
            Ok(_) => Ok(None),
        }
    })
    .await?;
    tokio::time::sleep(SETTLE).await;
    let p = decided?;
    match p.spec.as_ref().and_then(|s| s.node_name.as_deref()) {
        Some(n) if n == node => Ok(Verdict::Bound),
        Some(n) => bail!("{name} was bound to {n}, not {node}: the pin did not hold"),
        None => Ok(Verdict::Unschedulable(
            unschedulable(&p).unwrap_or_default(),
        )),
    }
}

// === the core side ===

/// Core's verdicts for `probe` (pending, as the API server would store it) on each of
/// `nodes`, on a model of the live cluster; and whether an inter-pod filter has a say (the
/// probe's own affinity, anti-affinity or spread, or a bound pod's anti-affinity that
/// selects it).
async fn core_verdicts(
    client: &Client,
    probe: &Pod,
    nodes: &[NodeSpec],
) -> Result<(Vec<Fit>, bool)> {
    let mut objs = Objects {
        nodes: Api::<Node>::all(client.clone())
            .list(&ListParams::default())
            .await?
            .items,
        pods: Api::<Pod>::all(client.clone())
            .list(&ListParams::default())
            .await?
            .items,
        ..Objects::default()
    };
    objs.pods.push(probe.clone());
    let cluster = build_cluster(&objs, None);
    let (ns, name) = (
        probe.metadata.namespace.as_deref(),
        probe.metadata.name.as_deref(),
    );
    let pod = cluster
        .pods
        .iter()
        .position(|p| Some(p.namespace.as_str()) == ns && Some(p.name.as_str()) == name)
        .context("the probe is not in the model")?;
    let occ = Occupancy::of(&cluster);
    let cap = Capacity::of(&cluster);
    let fits = nodes
        .iter()
        .map(|n| {
            let i = cluster
                .nodes
                .iter()
                .position(|x| x.name == n.name)
                .context("a node is not in the model")?;
            Ok(sched::fit(&cluster, &occ, pod, i, cap.at(i)))
        })
        .collect::<Result<Vec<_>>>()?;
    let p = &cluster.pods[pod];
    let selected_by_anti = cluster.pods.iter().any(|q| {
        q.namespace == p.namespace
            && q.node.is_some()
            && q.constraints()
                .anti_affinity
                .iter()
                .any(|t| t.selector.as_ref().is_some_and(|s| s.matches(&p.labels)))
    });
    Ok((fits, p.constraints().inter_pod() || selected_by_anti))
}

// === comparison ===

/// How core's verdict compares with the scheduler's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Agree,
    /// Core says no (or cannot tell); the scheduler binds it.
    Conservative,
    /// Core says it fits; the scheduler does not bind it.
    Unsafe,
}

fn outcome(core: &Fit, v: &Verdict) -> Outcome {
    match (core.fits(), v) {
        (true, Verdict::Bound) | (false, Verdict::Unschedulable(_)) => Outcome::Agree,
        (false, Verdict::Bound) => Outcome::Conservative,
        (true, Verdict::Unschedulable(_)) => Outcome::Unsafe,
    }
}

/// Core's verdict as a tally key: `Fits`, the filter's name, or `Unknown`.
fn label(f: &Fit) -> &'static str {
    match f {
        Fit::Fits(_) => "Fits",
        Fit::No(filter) => filter.as_str(),
        Fit::Unknown(_) => "Unknown",
    }
}

/// One compared pair.
struct Pair {
    seed: u64,
    probe: String,
    spec: String,
    node: String,
    core: Fit,
    verdict: Verdict,
    inter_pod: bool,
    /// A disagreement whose second observation differed from the first.
    unstable: bool,
    /// Where the scenario's pods are ([`placements`]).
    placements: String,
}

impl Pair {
    fn outcome(&self) -> Outcome {
        outcome(&self.core, &self.verdict)
    }

    fn report(&self) -> String {
        let sched = match &self.verdict {
            Verdict::Bound => "bound".to_string(),
            Verdict::Unschedulable(m) => format!("unschedulable: {m}"),
        };
        format!(
            "{:?} seed {} {} on {}{}\n    core: {:?}\n    scheduler: {sched}\n    pod: {}\n    \
             bound pods: {}",
            self.outcome(),
            self.seed,
            self.probe,
            self.node,
            if self.unstable {
                " (UNSTABLE: the two observations differed)"
            } else {
                ""
            },
            self.core,
            self.spec,
            self.placements,
        )
    }
}

/// The scenario's bound pods: `name@node{labels}`, with `anti[...]` / `affinity[...]`
/// (selector @ topology key) and `ports[...]` when they have them.
fn placements(sc: &Scenario) -> String {
    let terms = |ts: Option<&Vec<k8s_openapi::api::core::v1::PodAffinityTerm>>| {
        ts.into_iter()
            .flatten()
            .map(|t| {
                let sel = t
                    .label_selector
                    .as_ref()
                    .map(|s| json!(s).to_string())
                    .unwrap_or_default();
                format!(
                    "{sel}@{}",
                    t.topology_key.rsplit('/').next().unwrap_or_default()
                )
            })
            .collect::<Vec<_>>()
    };
    sc.existing
        .iter()
        .map(|p| {
            let spec = p.spec.as_ref();
            let node = spec
                .and_then(|s| s.node_name.as_deref())
                .unwrap_or_default();
            let labels = json!(p.metadata.labels).to_string();
            let aff = spec.and_then(|s| s.affinity.as_ref());
            let anti = terms(
                aff.and_then(|a| a.pod_anti_affinity.as_ref())
                    .and_then(|a| {
                        a.required_during_scheduling_ignored_during_execution
                            .as_ref()
                    }),
            );
            let affinity = terms(aff.and_then(|a| a.pod_affinity.as_ref()).and_then(|a| {
                a.required_during_scheduling_ignored_during_execution
                    .as_ref()
            }));
            let ports: Vec<String> = spec
                .into_iter()
                .flat_map(|s| {
                    s.containers
                        .iter()
                        .chain(s.init_containers.iter().flatten())
                })
                .flat_map(|c| c.ports.iter().flatten())
                .filter_map(|c| {
                    c.host_port
                        .map(|h| format!("{h}/{}", c.protocol.as_deref().unwrap_or("TCP")))
                })
                .collect();
            let mut out = format!(
                "{}@{node}{labels}",
                p.metadata.name.as_deref().unwrap_or_default()
            );
            for (what, list) in [("anti", anti), ("affinity", affinity), ("ports", ports)] {
                if !list.is_empty() {
                    out.push_str(&format!(" {what}[{}]", list.join(", ")));
                }
            }
            out
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The probe's scheduling-relevant fields, compact JSON.
fn pod_summary(p: &Pod) -> String {
    let spec = p.spec.as_ref();
    let v = json!({
        "labels": p.metadata.labels,
        "containers": spec.map(|s| s.containers.iter().map(|c| json!({"resources": c.resources, "ports": c.ports})).collect::<Vec<_>>()),
        "initContainers": spec.and_then(|s| s.init_containers.as_ref()).map(|cs| cs.iter().map(|c| json!({"resources": c.resources, "ports": c.ports, "restartPolicy": c.restart_policy})).collect::<Vec<_>>()),
        "nodeSelector": spec.and_then(|s| s.node_selector.as_ref()),
        "affinity": spec.and_then(|s| s.affinity.as_ref()),
        "tolerations": spec.and_then(|s| s.tolerations.as_ref()),
        "topologySpreadConstraints": spec.and_then(|s| s.topology_spread_constraints.as_ref()),
    });
    let v: serde_json::Map<String, Value> = v
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(_, x)| !x.is_null())
        .map(|(k, x)| (k.clone(), x.clone()))
        .collect();
    Value::Object(v).to_string()
}

/// Runs one scenario: every probe on every node.
async fn run_scenario(
    cluster: &TestCluster,
    client: &Client,
    seed: u64,
    index: usize,
) -> Result<Vec<Pair>> {
    let sc = Scenario::generate(seed, index)?;
    let ns = cluster.namespace(&format!("fidelity-{index}")).await?;
    set_up(cluster, client, ns.name(), &sc).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns.name());
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let mut pairs = Vec::new();
    for probe in &sc.probes {
        let stored = pods
            .create(&dry_run, probe)
            .await
            .context("a dry-run create of a probe")?;
        let (fits, inter_pod) = core_verdicts(client, &stored, &sc.nodes).await?;
        let name = probe.metadata.name.clone().unwrap_or_default();
        for (j, (node, core)) in sc.nodes.iter().zip(fits).enumerate() {
            let pod = pinned(probe, &format!("{name}-on-{j}"), node)?;
            let mut verdict = observe(&pods, &pod, &node.name).await?;
            let mut unstable = false;
            if outcome(&core, &verdict) != Outcome::Agree {
                tokio::time::sleep(RECHECK).await;
                let again = pinned(probe, &format!("{name}-on-{j}-again"), node)?;
                let second = observe(&pods, &again, &node.name).await?;
                unstable = outcome(&core, &second) != outcome(&core, &verdict);
                verdict = second;
            }
            pairs.push(Pair {
                seed,
                probe: format!("{}/{name}", ns.name()),
                spec: pod_summary(&stored),
                node: node.summary(),
                core,
                verdict,
                inter_pod,
                unstable,
                placements: placements(&sc),
            });
        }
    }
    tear_down(client, ns.name(), &sc).await?;
    Ok(pairs)
}

/// The seeds to run: [`SEEDS`], or as many from `FIDELITY_SEED` on.
fn seeds() -> Vec<u64> {
    match std::env::var("FIDELITY_SEED")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
    {
        Some(s) => (0..SEEDS.len() as u64).map(|i| s.wrapping_add(i)).collect(),
        None => SEEDS.to_vec(),
    }
}

/// Per core verdict (`Fits`, a filter, `Unknown`): pairs, agreeing, conservative, unsafe.
fn tallies(pairs: &[Pair]) -> BTreeMap<&'static str, [usize; 4]> {
    let mut t: BTreeMap<&'static str, [usize; 4]> = BTreeMap::new();
    for p in pairs {
        let e = t.entry(label(&p.core)).or_default();
        e[0] += 1;
        e[match p.outcome() {
            Outcome::Agree => 1,
            Outcome::Conservative => 2,
            Outcome::Unsafe => 3,
        }] += 1;
    }
    t
}

fn share(n: usize, of: usize) -> f64 {
    100.0 * n as f64 / of.max(1) as f64
}

/// Core's filter verdicts match the real kube-scheduler's over seeded scenarios: never a
/// "fits" the scheduler refuses; the conservative disagreements are counted and printed.
#[tokio::test(flavor = "multi_thread")]
async fn core_filter_verdicts_match_the_real_scheduler() {
    let t0 = Instant::now();
    let cluster = TestCluster::start(ClusterOptions {
        nodes: 0,
        binpack_scheduler: None,
        ..ClusterOptions::default()
    })
    .await
    .expect("local control plane");
    let client = cluster.client().unwrap();
    let started = t0.elapsed();
    let seeds = seeds();
    eprintln!(
        "fidelity: seeds {seeds:?} (FIDELITY_SEED=<n> runs {} seeds from n)",
        SEEDS.len()
    );
    let mut pairs = Vec::new();
    for (i, &seed) in seeds.iter().enumerate() {
        let ts = Instant::now();
        let got = run_scenario(&cluster, &client, seed, i)
            .await
            .unwrap_or_else(|e| panic!("scenario seed {seed}: {e:#}"));
        eprintln!(
            "fidelity: seed {seed}: {} pairs in {:.1}s",
            got.len(),
            ts.elapsed().as_secs_f64()
        );
        pairs.extend(got);
    }
    let elapsed = t0.elapsed();

    let count = |o: Outcome| pairs.iter().filter(|p| p.outcome() == o).count();
    let (total, unsafe_n, conservative) = (
        pairs.len(),
        count(Outcome::Unsafe),
        count(Outcome::Conservative),
    );
    let bound = pairs
        .iter()
        .filter(|p| matches!(p.verdict, Verdict::Bound))
        .count();
    let inter = pairs.iter().filter(|p| p.inter_pod).count();
    for p in pairs
        .iter()
        .filter(|p| p.outcome() != Outcome::Agree || p.unstable)
    {
        eprintln!("DISAGREEMENT {}", p.report());
    }
    eprintln!("fidelity: core verdict -> pairs / agree / conservative / unsafe");
    for (k, [n, a, c, u]) in tallies(&pairs) {
        eprintln!("  {k:<22} {n:>4} {a:>4} {c:>4} {u:>4}");
    }
    eprintln!(
        "E2E-FIGURE fidelity: {total} pairs in {:.1}s (control plane {:.1}s); scheduler bound {bound} ({:.0}%); \
         inter-pod filters involved in {inter} ({:.0}%); unsafe disagreements {unsafe_n}; conservative {conservative} ({:.1}%); \
         unstable observations {}",
        elapsed.as_secs_f64(),
        started.as_secs_f64(),
        share(bound, total),
        share(inter, total),
        share(conservative, total),
        pairs.iter().filter(|p| p.unstable).count(),
    );

    assert!(total >= MIN_PAIRS, "only {total} pairs compared");
    assert_eq!(
        unsafe_n, 0,
        "core said Fits where the real scheduler did not bind (see DISAGREEMENT lines)"
    );
    // The generator keeps the comparison meaningful: both verdicts common, inter-pod
    // filters often involved, and every filter deciding somewhere.
    assert!(
        share(bound, total) >= 10.0 && share(total - bound, total) >= 10.0,
        "bound {bound} of {total}"
    );
    assert!(
        share(inter, total) >= 25.0,
        "inter-pod filters involved in {inter} of {total}"
    );
    let seen = tallies(&pairs);
    for f in [
        Filter::NodeUnschedulable,
        Filter::NodeAffinity,
        Filter::TaintToleration,
        Filter::NodeResourcesFit,
        Filter::Gpus,
        Filter::NodePorts,
        Filter::InterPodAffinity,
        Filter::InterPodAntiAffinity,
        Filter::PodTopologySpread,
    ] {
        assert!(
            seen.contains_key(f.as_str()),
            "no pair where core's {} said no",
            f.as_str()
        );
    }
    cluster.stop();
}
