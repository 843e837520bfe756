//! Planner properties over random small clusters, and exact cases on tiny clusters
//! where the optimum is found by exhaustive search.
use std::collections::{BTreeMap, BTreeSet, HashMap};

use gpu_defrag_core::frag::{self, Capacity};
use gpu_defrag_core::ingest::BINPACK_SCHEDULER;
use gpu_defrag_core::model::*;
use gpu_defrag_core::plan::{History, Plan, UnitKind, apply, plan, plan_with_activity};
use gpu_defrag_core::policy::{Policy, TargetShape};
use proptest::prelude::*;

mod common;
use common::model_node as node;

const OPT_OUT: &str = "gpu-defrag.io/do-not-disrupt";
const KARPENTER_OPT_OUT: &str = "karpenter.sh/do-not-disrupt";

fn pod(ns: &str, name: &str, owner: &str) -> Pod {
    Pod {
        namespace: ns.into(),
        name: name.into(),
        node: None,
        node_name: None,
        phase: Phase::Running,
        labels: BTreeMap::from([("app".to_string(), owner.to_string())]).into(),
        annotations: BTreeMap::new(),
        gpu: GpuUse::None,
        shape: None,
        scheme: None,
        cpu: 1000,
        mem: 1 << 30,
        priority: 0,
        priority_class: None,
        owner: Some(Owner {
            group: "apps".into(),
            kind: "ReplicaSet".into(),
            name: owner.into(),
        }),
        started: None,
        deleting: false,
        mirror: false,
        local_storage: false,
        ready: true,
        workload: Some(Workload::checked("apps/ReplicaSet", owner)),
        node_selector: BTreeMap::new(),
        affinity: vec![],
        tolerations: vec![],
        models: vec![],
        scheduler: BINPACK_SCHEDULER.into(),
        ..Default::default()
    }
}

/// Binds `p` to node `n` on `devs` with `milli` each, updating the node.
fn bind(c: &mut Cluster, mut p: Pod, n: usize, devs: &[usize], milli: Milli) {
    let node = &mut c.nodes[n];
    for &g in devs {
        node.gpus[g].used += milli;
    }
    node.cpu_used += p.cpu;
    node.mem_used += p.mem;
    node.pods_used += 1;
    p.node = Some(n);
    p.node_name = Some(node.name.clone());
    p.shape = Some(GpuShape {
        gpus: devs.len() as u32,
        milli,
    });
    if node.granularity == Granularity::Device {
        p.gpu = GpuUse::Devices(devs.iter().map(|&g| (g, milli)).collect());
        p.scheme = Some(node.scheme);
    } else {
        p.gpu = GpuUse::Whole(devs.len() as u32);
    }
    c.pods.push(p);
}

fn finish(mut c: Cluster) -> Cluster {
    c.pods.sort_by_key(Pod::key);
    c
}

fn shape(gpus: u32, milli: Milli, weight: f64) -> TargetShape {
    TargetShape::of_gpus(gpus, milli, weight)
}

/// A pod spec drawn by the strategy, placed if it fits.
#[derive(Debug, Clone)]
struct PodSpec {
    node: usize,
    gpus: u32,
    milli: Milli,
    ns: u8,
    owner: u8,
    priority: bool,
    protected: bool,
    opt_out: u8,
}

#[derive(Debug, Clone)]
struct Case {
    nodes: Vec<(usize, bool)>,
    pods: Vec<PodSpec>,
    pdbs: Vec<(u8, i64)>,
    limits: (u32, u32, u32, u32),
}

fn pod_spec() -> impl Strategy<Value = PodSpec> {
    (
        0usize..5,
        prop_oneof![3 => Just(1u32), 1 => Just(2u32)],
        prop_oneof![Just(250u32), Just(400), Just(500), Just(1000)],
        0u8..3,
        0u8..4,
        prop::bool::weighted(0.15),
        prop::bool::weighted(0.1),
        0u8..8,
    )
        .prop_map(
            |(node, gpus, milli, ns, owner, priority, protected, opt_out)| PodSpec {
                node,
                gpus,
                milli,
                ns,
                owner,
                priority,
                protected,
                opt_out,
            },
        )
}

fn case() -> impl Strategy<Value = Case> {
    let nodes = prop::collection::vec((2usize..=4, prop::bool::weighted(0.75)), 2..=5);
    let pods = prop::collection::vec(pod_spec(), 0..14);
    let pdbs = prop::collection::vec((0u8..4, 0i64..3), 0..3);
    let limits = (1u32..8, 1u32..4, 1u32..5, 1u32..3);
    (nodes, pods, pdbs, limits).prop_map(|(nodes, pods, pdbs, limits)| Case {
        nodes,
        pods,
        pdbs,
        limits,
    })
}

/// Fuller clusters of 4-GPU nodes, where a 4-GPU pod mostly fits nowhere as it is.
fn full_case() -> impl Strategy<Value = Case> {
    let nodes = prop::collection::vec((4usize..=4, prop::bool::weighted(0.5)), 2..=4);
    let pods = prop::collection::vec(pod_spec(), 4..16);
    let pdbs = prop::collection::vec((0u8..4, 0i64..3), 0..3);
    let limits = (2u32..16, 2u32..6, 2u32..8, 1u32..3);
    (nodes, pods, pdbs, limits).prop_map(|(nodes, pods, pdbs, limits)| Case {
        nodes,
        pods,
        pdbs,
        limits,
    })
}

fn build(cs: &Case) -> (Cluster, Policy) {
    let mut c = Cluster::default();
    for (i, (g, dev)) in cs.nodes.iter().enumerate() {
        let gran = if *dev {
            Granularity::Device
        } else {
            Granularity::Node
        };
        c.nodes.push(node(&format!("n{i}"), *g, gran));
    }
    for (k, s) in cs.pods.iter().enumerate() {
        let n = s.node % c.nodes.len();
        let gran = c.nodes[n].granularity;
        // Shares only where devices are recorded; multi-GPU pods take whole GPUs.
        let milli = if s.gpus > 1 || gran == Granularity::Node {
            GPU_MILLI
        } else {
            s.milli
        };
        let devs: Vec<usize> = (0..c.nodes[n].gpus.len())
            .filter(|&g| GPU_MILLI - c.nodes[n].gpus[g].used >= milli)
            .take(s.gpus as usize)
            .collect();
        if devs.len() < s.gpus as usize {
            continue;
        }
        let mut p = pod(
            &format!("ns{}", s.ns),
            &format!("p{k:02}"),
            &format!("rs{}", s.owner),
        );
        if s.priority {
            p.priority = 2000;
        }
        if s.protected {
            p.priority_class = Some("critical".into());
        }
        match s.opt_out {
            0 => {
                p.annotations.insert(OPT_OUT.into(), "true".into());
            }
            1 => {
                p.annotations
                    .insert(KARPENTER_OPT_OUT.into(), "true".into());
            }
            2 => {
                p.annotations.insert(OPT_OUT.into(), "false".into());
            }
            _ => {}
        }
        bind(&mut c, p, n, &devs, milli);
    }
    for (i, (owner, allowed)) in cs.pdbs.iter().enumerate() {
        // PDBs select by app label across namespaces ns0..ns2 (each its own namespace).
        for ns in 0..3 {
            c.pdbs.push(Pdb {
                stale: false,
                namespace: format!("ns{ns}"),
                name: format!("pdb{i}"),
                selector: Some(LabelSelector {
                    match_labels: BTreeMap::from([("app".to_string(), format!("rs{owner}"))]),
                    match_expressions: vec![],
                }),
                disruptions_allowed: *allowed,
            });
        }
    }
    let c = finish(c);
    let p = Policy {
        shapes: vec![shape(1, 1000, 0.5), shape(2, 1000, 0.3), shape(1, 500, 0.2)],
        max_evictions_per_run: cs.limits.0,
        max_evictions_per_node: cs.limits.1,
        max_evictions_per_namespace: cs.limits.2,
        max_unavailable_per_workload: cs.limits.3,
        max_priority: Some(1000),
        protected_classes: vec!["critical".into()],
        ..Policy::default()
    };
    (c, p)
}

fn pods_by_key(c: &Cluster) -> HashMap<String, usize> {
    c.pods
        .iter()
        .enumerate()
        .map(|(i, p)| (p.key(), i))
        .collect()
}

/// Recomputes used milli per GPU from the pods (apply() clamps; this does not).
fn used_from_pods(c: &Cluster) -> Vec<Vec<u64>> {
    let mut u: Vec<Vec<u64>> = c.nodes.iter().map(|n| vec![0; n.gpus.len()]).collect();
    for p in &c.pods {
        if let (Some(n), GpuUse::Devices(d)) = (p.node, &p.gpu) {
            for (g, m) in d {
                u[n][*g] += u64::from(*m);
            }
        }
    }
    u
}

fn check_plan(c: &Cluster, pol: &Policy, pl: &Plan) -> Result<(), TestCaseError> {
    let keys = pods_by_key(c);
    prop_assert!(pl.moves.len() as u32 <= pol.max_evictions_per_run);
    let mut per_node: HashMap<&str, u32> = HashMap::new();
    let mut per_ns: HashMap<&str, u32> = HashMap::new();
    // A workload is its controller within a namespace.
    let mut per_owner: HashMap<(&str, &Owner), u32> = HashMap::new();
    let mut per_pdb: HashMap<usize, i64> = HashMap::new();
    let mut seen = BTreeSet::new();
    for m in &pl.moves {
        prop_assert!(seen.insert(m.pod.clone()), "pod moved twice: {}", m.pod);
        let pi = keys[&m.pod];
        prop_assert_eq!(pi, m.pod_index);
        let p = &c.pods[pi];
        // Every moved pod has a target node of the model.
        prop_assert!(
            c.node_index(&m.to_node).is_some(),
            "no target for {}",
            m.pod
        );
        let to = &c.nodes[c.node_index(&m.to_node).unwrap()];
        if to.granularity == Granularity::Device {
            prop_assert_eq!(
                m.to_devices.len() as u32,
                p.shape.unwrap().gpus,
                "devices for {}",
                m.pod
            );
        }
        prop_assert_eq!(&m.from_node, &c.nodes[p.node.unwrap()].name);
        *per_node.entry(m.from_node.as_str()).or_default() += 1;
        *per_ns.entry(p.namespace.as_str()).or_default() += 1;
        *per_owner
            .entry((p.namespace.as_str(), p.owner.as_ref().unwrap()))
            .or_default() += 1;
        let matching: Vec<usize> = c
            .pdbs
            .iter()
            .enumerate()
            .filter(|(_, b)| {
                b.namespace == p.namespace && b.selector.as_ref().unwrap().matches(&p.labels)
            })
            .map(|(i, _)| i)
            .collect();
        prop_assert!(matching.len() <= 1, "pod under two PDBs moved");
        for b in matching {
            *per_pdb.entry(b).or_default() += 1;
        }
        prop_assert!(p.priority <= pol.max_priority.unwrap(), "priority");
        prop_assert!(
            p.priority_class
                .as_ref()
                .is_none_or(|pc| !pol.protected_classes.contains(pc)),
            "protected class"
        );
        prop_assert!(
            p.annotations.get(OPT_OUT).is_none_or(|v| v == "false"),
            "gpu-defrag opt-out"
        );
        prop_assert!(
            !p.annotations.contains_key(KARPENTER_OPT_OUT),
            "karpenter opt-out"
        );
    }
    prop_assert!(per_node.values().all(|v| *v <= pol.max_evictions_per_node));
    prop_assert!(
        per_ns
            .values()
            .all(|v| *v <= pol.max_evictions_per_namespace)
    );
    // Workload rules, from live state: no moved pod's workload was already at its
    // unavailability limit, and none was its workload's last Ready replica unless a PDB
    // allowed it (moves of one workload are serialised by the executor, so the plan may
    // hold several).
    for ((ns, owner), _) in per_owner {
        let same = |q: &&Pod| q.namespace == ns && q.owner.as_ref() == Some(owner);
        let live: Vec<&Pod> = c
            .pods
            .iter()
            .filter(same)
            .filter(|q| !q.phase.is_terminal())
            .collect();
        let ready = live
            .iter()
            .filter(|q| q.phase == Phase::Running && q.ready && !q.deleting)
            .count() as u32;
        let unavailable = live.len() as u32 - ready;
        prop_assert!(
            unavailable < pol.max_unavailable_per_workload,
            "{ns}/{owner:?} already unavailable"
        );
        let covered = c.pods.iter().filter(same).any(|q| {
            c.pdbs.iter().any(|b| {
                b.namespace == q.namespace && b.selector.as_ref().unwrap().matches(&q.labels)
            })
        });
        prop_assert!(
            ready >= 2 || covered || pol.evict_single_replicas,
            "last Ready replica of {ns}/{owner:?} moved"
        );
    }
    for (b, n) in per_pdb {
        prop_assert!(n <= c.pdbs[b].disruptions_allowed, "PDB {} over", b);
    }

    // All or nothing per unit: each batch empties its unit in the applied cluster.
    let after = apply(c, pl);
    let used = used_from_pods(&after);
    for (n, u) in used.iter().enumerate() {
        for (g, x) in u.iter().enumerate() {
            prop_assert!(*x <= 1000, "GPU {n}/{g} over-committed after the plan");
        }
    }
    let mut moves_in_batch = vec![0usize; pl.batches.len()];
    for m in &pl.moves {
        moves_in_batch[m.batch] += 1;
    }
    for (bi, b) in pl.batches.iter().enumerate() {
        prop_assert_eq!(b.moves, moves_in_batch[bi]);
        let n = c.node_index(&b.node).unwrap();
        let before_on: Vec<usize> = c
            .pods
            .iter()
            .enumerate()
            .filter(|(_, p)| p.node == Some(n) && p.held_milli() > 0)
            .map(|(i, _)| i)
            .collect();
        match b.kind {
            UnitKind::Node => {
                for &pi in &before_on {
                    prop_assert!(
                        pl.moves.iter().any(|m| m.pod_index == pi && m.batch == bi),
                        "node batch left {} behind",
                        c.pods[pi].key()
                    );
                }
                prop_assert!(after.nodes[n].gpus.iter().all(|g| g.used == 0));
            }
            UnitKind::Gpu => {
                // Fenced by itself exactly where the scheduler can keep pods off one GPU.
                prop_assert_eq!(b.device_fence, c.nodes[n].scheme == Scheme::Hami);
                let g = c.nodes[n]
                    .gpus
                    .iter()
                    .position(|x| Some(&x.key) == b.gpu.as_ref())
                    .unwrap();
                for &pi in &before_on {
                    let on_g = matches!(&c.pods[pi].gpu, GpuUse::Devices(d) if d.iter().any(|(x, _)| *x == g));
                    if on_g {
                        prop_assert!(
                            pl.moves.iter().any(|m| m.pod_index == pi && m.batch == bi),
                            "GPU batch left {} behind",
                            c.pods[pi].key()
                        );
                    }
                }
                prop_assert_eq!(after.nodes[n].gpus[g].used, 0);
            }
            UnitKind::Group => {
                prop_assert!(b.moves > 0);
            }
        }
    }
    // The plan's forecast is what its own moves give.
    let t = frag::totals(&after, &Capacity::of(&after), &pol.scope, &pl.shapes);
    prop_assert!(
        (t.fragment_milli - pl.after.fragment_milli).abs() < 1e-6,
        "forecast {} vs applied {}",
        pl.after.fragment_milli,
        t.fragment_milli
    );
    prop_assert!(pl.after.fragment_milli <= pl.before.fragment_milli + 1e-9);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn plans_respect_every_limit_and_are_deterministic(cs in case()) {
        let (c, pol) = build(&cs);
        let a = plan(&c, &pol, None, &History::default());
        let b = plan(&c, &pol, None, &History::default());
        prop_assert_eq!(&a, &b, "same input, same plan");
        check_plan(&c, &pol, &a)?;
    }

    #[test]
    fn a_plan_cut_to_its_first_batches_is_a_plan_of_whole_units(cs in case(), k in 0usize..6) {
        let (c, pol) = build(&cs);
        let full = plan(&c, &pol, None, &History::default());
        let cut = full.first_batches(k);
        let n = k.min(full.batches.len());
        prop_assert_eq!(cut.batches.len(), n);
        prop_assert_eq!(&cut.moves[..], &full.moves[..cut.moves.len()], "a prefix");
        prop_assert_eq!(cut.moves.len(), full.batches[..n].iter().map(|b| b.moves).sum::<usize>());
        // Fences: exactly the nodes of the node and group units kept.
        let want: BTreeSet<&str> = cut
            .batches
            .iter()
            .filter(|b| b.kind != UnitKind::Gpu)
            .map(|b| b.node.as_str())
            .collect();
        prop_assert_eq!(cut.fenced_nodes.iter().map(String::as_str).collect::<BTreeSet<_>>(), want);
        // and the GPUs of the GPU units kept (every device node here is a HAMi node).
        let want: BTreeSet<(&str, &str)> = cut
            .batches
            .iter()
            .filter(|b| b.kind == UnitKind::Gpu)
            .map(|b| (b.node.as_str(), b.gpu.as_deref().unwrap_or_default()))
            .collect();
        let got: BTreeSet<(&str, &str)> =
            cut.fenced_devices.iter().map(|d| (d.node.as_str(), d.gpu.as_str())).collect();
        prop_assert_eq!(got, want);
        // What is expected after it is what applying it gives.
        let after = apply(&c, &cut);
        let t = frag::totals(&after, &Capacity::of(&after), &pol.scope, &cut.shapes);
        prop_assert!((t.fragment_milli - cut.after.fragment_milli).abs() < 1e-3 * (1.0 + t.fragment_milli));
        if n == full.batches.len() {
            prop_assert_eq!(&cut, &full);
        } else {
            check_plan(&c, &pol, &cut)?;
        }
    }

    #[test]
    fn history_counts_against_the_limits(cs in case(), done in 0u32..4) {
        let (c, pol) = build(&cs);
        let mut h = History::default();
        for i in 0..done {
            h.evicted.push(format!("gone/p{i}"));
            *h.per_node.entry("n0".into()).or_default() += 1;
            *h.per_namespace.entry("ns0".into()).or_default() += 1;
        }
        let pl = plan(&c, &pol, None, &h);
        prop_assert!(pl.moves.len() as u32 + done <= pol.max_evictions_per_run.max(done));
        let n0 = pl.moves.iter().filter(|m| m.from_node == "n0").count() as u32;
        prop_assert!(n0 == 0 || n0 + done <= pol.max_evictions_per_node);
        let ns0 = pl.moves.iter().filter(|m| m.pod.starts_with("ns0/")).count() as u32;
        prop_assert!(ns0 == 0 || ns0 + done <= pol.max_evictions_per_namespace);
    }
}

/// Two Ready replicas of one workload (ns0/rs0), each alone on its node (300 milli), and a
/// third node with two GPUs at 700: each pod can fill one of them and free its node.
/// `maxUnavailablePerWorkload: 1` counts replicas unavailable *at once*, from live state,
/// not moves per plan: both move (the executor evicts the second once the first's
/// replacement is Ready). With a third replica Pending, the workload is already at its
/// limit, and neither moves — also after a restart, since nothing is counted in memory.
#[test]
fn workload_limit_counts_live_unavailability() {
    let mut c = Cluster {
        nodes: vec![
            node("n0", 2, Granularity::Device),
            node("n1", 2, Granularity::Device),
            node("n2", 2, Granularity::Device),
        ],
        ..Default::default()
    };
    bind(&mut c, pod("ns0", "a", "rs0"), 0, &[0], 300);
    bind(&mut c, pod("ns0", "b", "rs0"), 1, &[0], 300);
    bind(&mut c, pod("ns1", "c", "rs8"), 2, &[0], 700);
    bind(&mut c, pod("ns1", "d", "rs9"), 2, &[1], 700);
    let c = finish(c);
    let mut pol = exact_policy(4);
    pol.max_unavailable_per_workload = 1;
    pol.evict_single_replicas = false;
    let pl = plan(&c, &pol, None, &History::default());
    let moved: Vec<&str> = pl.moves.iter().map(|m| m.pod.as_str()).collect();
    assert_eq!(
        moved.iter().filter(|p| p.starts_with("ns0/")).count(),
        2,
        "{moved:?}"
    );
    // A third replica, Pending: the workload already has one replica unavailable.
    let mut pending = pod("ns0", "e", "rs0");
    pending.phase = Phase::Pending;
    pending.ready = false;
    pending.shape = Some(GpuShape {
        gpus: 1,
        milli: 300,
    });
    let mut c2 = c.clone();
    c2.pods.push(pending);
    let c2 = finish(c2);
    let pl = plan(&c2, &pol, None, &History::default());
    assert!(
        pl.moves.iter().all(|m| !m.pod.starts_with("ns0/")),
        "{:?}",
        pl.moves
    );
    assert_eq!(
        pl.skipped.get("workload-unavailable"),
        Some(&2),
        "{:?}",
        pl.skipped
    );
}

// ---------------------------------------------------------------------------------
// Exact cases.

/// Lowest fragment milli reachable by evicting at most `budget` movable pods and
/// placing them anywhere they fit (any node, any devices): exhaustive.
fn optimum(c: &Cluster, pol: &Policy, budget: usize) -> f64 {
    let pods: Vec<usize> = (0..c.pods.len())
        .filter(|&i| c.pods[i].node.is_some())
        .collect();
    let mut best = f64::INFINITY;
    let n = pods.len();
    for mask in 0u32..(1 << n) {
        if mask.count_ones() as usize > budget {
            continue;
        }
        let mut cap = Capacity::of(c);
        let set: Vec<usize> = (0..n)
            .filter(|b| mask & (1 << b) != 0)
            .map(|b| pods[b])
            .collect();
        for &pi in &set {
            let p = &c.pods[pi];
            let nd = p.node.unwrap();
            if let GpuUse::Devices(d) = &p.gpu {
                for (g, m) in d {
                    cap.free[nd][*g] += m;
                }
            }
            cap.cpu_free[nd] += p.cpu;
            cap.mem_free[nd] += p.mem;
        }
        place_all(c, pol, &set, 0, &mut cap, &mut best);
    }
    best
}

fn place_all(
    c: &Cluster,
    pol: &Policy,
    set: &[usize],
    k: usize,
    cap: &mut Capacity,
    best: &mut f64,
) {
    if k == set.len() {
        let t = frag::totals(c, cap, &pol.scope, &pol.shapes);
        *best = best.min(t.fragment_milli);
        return;
    }
    let p = &c.pods[set[k]];
    let s = p.shape.unwrap();
    for n in 0..c.nodes.len() {
        let g = c.nodes[n].gpus.len();
        // Every combination of s.gpus devices with room.
        for combo in 0u32..(1 << g) {
            if combo.count_ones() != s.gpus {
                continue;
            }
            let devs: Vec<usize> = (0..g).filter(|b| combo & (1 << b) != 0).collect();
            if devs.iter().any(|&d| cap.free[n][d] < s.milli) || cap.cpu_free[n] < p.cpu {
                continue;
            }
            for &d in &devs {
                cap.free[n][d] -= s.milli;
            }
            cap.cpu_free[n] -= p.cpu;
            place_all(c, pol, set, k + 1, cap, best);
            for &d in &devs {
                cap.free[n][d] += s.milli;
            }
            cap.cpu_free[n] += p.cpu;
        }
    }
}

fn exact_policy(budget: u32) -> Policy {
    Policy {
        shapes: vec![shape(1, 1000, 0.6), shape(2, 1000, 0.4)],
        max_evictions_per_run: budget,
        max_evictions_per_node: budget,
        max_evictions_per_namespace: budget,
        max_unavailable_per_workload: budget,
        // The exact cases compare the search with an exhaustive one over every pod.
        evict_single_replicas: true,
        ..Policy::default()
    }
}

#[test]
fn two_half_gpus_are_merged_in_one_move() {
    // n0: GPU0 500 used; n1: GPU0 500 used. One move frees a whole GPU on one node.
    let mut c = Cluster {
        nodes: vec![
            node("n0", 2, Granularity::Device),
            node("n1", 2, Granularity::Device),
        ],
        ..Default::default()
    };
    bind(&mut c, pod("a", "p0", "r0"), 0, &[0], 500);
    bind(&mut c, pod("a", "p1", "r1"), 1, &[0], 500);
    let c = finish(c);
    let pol = exact_policy(1);
    let pl = plan(&c, &pol, None, &History::default());
    assert_eq!(pl.moves.len(), 1);
    let opt = optimum(&c, &pol, 1);
    assert!(
        (pl.after.fragment_milli - opt).abs() < 1e-6,
        "{} vs {opt}",
        pl.after.fragment_milli
    );
    let after = apply(&c, &pl);
    assert_eq!(
        frag::totals(&after, &Capacity::of(&after), &pol.scope, &pol.shapes).fully_free_nodes,
        1
    );
}

#[test]
fn nothing_to_gain_means_no_move() {
    // Every GPU full: no eviction can lower the fragment.
    let mut c = Cluster {
        nodes: vec![
            node("n0", 2, Granularity::Device),
            node("n1", 2, Granularity::Device),
        ],
        ..Default::default()
    };
    for (i, (n, g)) in [(0, 0), (0, 1), (1, 0), (1, 1)].iter().enumerate() {
        bind(
            &mut c,
            pod("a", &format!("p{i}"), &format!("r{i}")),
            *n,
            &[*g],
            1000,
        );
    }
    let c = finish(c);
    let pl = plan(&c, &exact_policy(4), None, &History::default());
    assert!(pl.moves.is_empty());
}

fn tiny_case() -> impl Strategy<Value = Vec<(usize, u32, Milli)>> {
    prop::collection::vec(
        (
            0usize..3,
            prop_oneof![4 => Just(1u32), 1 => Just(2u32)],
            prop_oneof![Just(200u32), Just(300), Just(500), Just(700), Just(1000)],
        ),
        2..=6,
    )
}

fn tiny_cluster(spec: &[(usize, u32, Milli)], gpus: [usize; 3]) -> Cluster {
    let mut c = Cluster {
        nodes: (0..3)
            .map(|i| node(&format!("n{i}"), gpus[i], Granularity::Device))
            .collect(),
        ..Default::default()
    };
    for (k, &(n, g, m)) in spec.iter().enumerate() {
        let m = if g > 1 { 1000 } else { m };
        // Spread: the emptiest GPUs that fit (a fragmenting placement).
        let mut devs: Vec<usize> = (0..c.nodes[n].gpus.len())
            .filter(|&d| 1000 - c.nodes[n].gpus[d].used >= m)
            .collect();
        devs.sort_by_key(|&d| (c.nodes[n].gpus[d].used, d));
        if devs.len() < g as usize {
            continue;
        }
        devs.truncate(g as usize);
        bind(
            &mut c,
            pod("a", &format!("p{k}"), &format!("r{k}")),
            n,
            &devs,
            m,
        );
    }
    finish(c)
}

/// The greedy against the exhaustive optimum on many tiny clusters: it never claims
/// more than the optimum, and in aggregate it reaches a stated share of the optimal
/// drop. The measured gap is printed (`cargo test -- --nocapture`).
#[test]
fn greedy_against_exhaustive_optimum_on_tiny_clusters() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config, TestRunner};
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        proptest::test_runner::TestRng::deterministic_rng(
            proptest::test_runner::RngAlgorithm::ChaCha,
        ),
    );
    let (mut drop_greedy, mut drop_opt) = (0.0, 0.0);
    let (mut cases, mut optimal, mut worst) = (0, 0, 1.0f64);
    for i in 0..120 {
        let spec = tiny_case().new_tree(&mut runner).unwrap().current();
        let gpus = [[2, 2, 2], [4, 2, 2], [4, 4, 2], [2, 4, 4]][i % 4];
        let c = tiny_cluster(&spec, gpus);
        let budget = 1 + i % 3;
        let pol = exact_policy(budget as u32);
        let pl = plan(&c, &pol, None, &History::default());
        let opt = optimum(&c, &pol, budget);
        let before = pl.before.fragment_milli;
        assert!(
            pl.after.fragment_milli + 1e-6 >= opt,
            "greedy {} below the optimum {opt}: the plan's forecast is impossible ({spec:?})",
            pl.after.fragment_milli
        );
        cases += 1;
        drop_greedy += before - pl.after.fragment_milli;
        drop_opt += before - opt;
        if (pl.after.fragment_milli - opt).abs() < 1e-6 {
            optimal += 1;
        } else if before - opt > 1e-6 {
            worst = worst.min((before - pl.after.fragment_milli) / (before - opt));
        }
    }
    let share = if drop_opt > 0.0 {
        drop_greedy / drop_opt
    } else {
        1.0
    };
    println!(
        "greedy vs exhaustive optimum: {optimal}/{cases} cases optimal, aggregate drop {:.0}/{:.0} milli = {:.1}%, worst single case {:.1}% of the optimal drop",
        drop_greedy,
        drop_opt,
        100.0 * share,
        100.0 * worst
    );
    // Stated factor: the greedy reaches at least half of the optimal drop in aggregate.
    assert!(
        share >= 0.5,
        "greedy reaches only {:.1}% of the optimal drop",
        100.0 * share
    );
}

#[test]
fn targets_follow_most_allocated_across_node_sizes() {
    // The 300-milli pod on c-src is drained. Two nodes can take it: a-small (1 GPU, 400
    // free: 90% allocated after) and b-big (8 GPUs, 1000 free: 91.25% after). The
    // bin-packing scheduler (MostAllocated on GPU) picks b-big although a-small has less
    // free milli; the planner must expect the same node, and best fit there.
    let mut c = Cluster {
        nodes: vec![
            node("a-small", 1, Granularity::Device),
            node("b-big", 8, Granularity::Device),
            node("c-src", 2, Granularity::Device),
        ],
        ..Default::default()
    };
    bind(&mut c, pod("t", "small", "small"), 0, &[0], 600);
    for g in 0..6 {
        bind(&mut c, pod("t", &format!("full{g}"), "full"), 1, &[g], 1000);
    }
    for g in 6..8 {
        let mut p = pod("t", &format!("half{g}"), &format!("half{g}"));
        p.annotations
            .insert("gpu-defrag.io/do-not-disrupt".into(), "true".into());
        bind(&mut c, p, 1, &[g], 500);
    }
    bind(&mut c, pod("t", "mover", "mover"), 2, &[0], 300);
    let c = finish(c);
    let pol = Policy {
        shapes: vec![shape(1, 1000, 1.0)],
        ..exact_policy(1)
    };
    let pl = plan(&c, &pol, None, &History::default());
    assert_eq!(pl.moves.len(), 1, "{:?}", pl.moves);
    let m = &pl.moves[0];
    assert_eq!(m.pod, "t/mover");
    assert_eq!(m.to_node, "b-big");
    assert_eq!(m.to_devices, vec!["6".to_string()]);
    let after = apply(&c, &pl);
    let t = frag::totals(&after, &Capacity::of(&after), &pol.scope, &pl.shapes);
    assert!((t.fragment_milli - pl.after.fragment_milli).abs() < 1e-6);
}

#[test]
fn long_idle_pods_rank_as_cheaper_to_move() {
    // Three nodes, a half-used GPU on each: draining n0's or n1's GPU gives the same drop.
    let mut c = Cluster {
        nodes: vec![
            node("n0", 2, Granularity::Device),
            node("n1", 2, Granularity::Device),
            node("n2", 2, Granularity::Device),
        ],
        ..Default::default()
    };
    bind(&mut c, pod("a", "busy", "r0"), 0, &[0], 500);
    bind(&mut c, pod("a", "idle", "r1"), 1, &[0], 500);
    bind(&mut c, pod("a", "other", "r2"), 2, &[0], 500);
    let c = finish(c);
    let pol = exact_policy(1);
    // Without activity data the tie goes to node order.
    let pl = plan(&c, &pol, None, &History::default());
    assert_eq!(
        pl.moves.iter().map(|m| m.pod.as_str()).collect::<Vec<_>>(),
        ["a/busy"]
    );
    let measured = |peak: f64| PodActivity { peak, gpus: 1 };
    let mut activity = Activity {
        threshold: 0.3,
        lookback: std::time::Duration::from_secs(4 * 3600),
        ..Default::default()
    };
    activity.pods.insert("a/busy".into(), measured(0.9));
    activity.pods.insert("a/idle".into(), measured(0.05));
    let pl = plan_with_activity(&c, &pol, None, &History::default(), &activity);
    assert_eq!(
        pl.moves.iter().map(|m| m.pod.as_str()).collect::<Vec<_>>(),
        ["a/idle"]
    );
    // Busy above the threshold, or no measurement: no preference.
    activity.pods.insert("a/idle".into(), measured(0.5));
    let pl = plan_with_activity(&c, &pol, None, &History::default(), &activity);
    assert_eq!(
        pl.moves.iter().map(|m| m.pod.as_str()).collect::<Vec<_>>(),
        ["a/busy"]
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// Every batch reports the totals of the cluster after it (the plan's figures per
    /// batch, as `plan` prints them): the same idle capacity and fully free GPUs and nodes
    /// as the cluster with the batches so far applied, and its fragment up to rounding.
    #[test]
    fn every_batch_reports_the_totals_after_it(cs in case()) {
        let (c, pol) = build(&cs);
        let pl = plan(&c, &pol, None, &History::default());
        for k in 0..pl.batches.len() {
            let prefix = pl.first_batches(k + 1);
            let exact = gpu_defrag_core::frag::report(&gpu_defrag_core::plan::apply(&c, &prefix), &pol);
            let after = pl.batches[k].after;
            prop_assert_eq!(after.idle_milli, exact.idle_milli, "batch {}", k);
            // Fully free GPUs and nodes may differ by one from the applied cluster: for a
            // share the planner's own device state and `apply`'s re-placement can pick
            // different GPUs of the target (a known difference, left alone here).
            prop_assert!(after.fully_free_gpus.abs_diff(exact.fully_free_gpus) <= 1, "batch {}: {:?} vs {}", k, after, exact.fully_free_gpus);
            prop_assert!(after.fully_free_nodes.abs_diff(exact.fully_free_nodes) <= 1, "batch {}", k);
            prop_assert!(after.idle_milli == 0 || exact.fragment_milli == 0 || after.fragment_rate > 0.0, "batch {}: a zero rate", k);
            prop_assert!(
                (after.fragment_milli - exact.fragment_milli as f64).abs() < 1.0,
                "batch {}: {} vs {}", k, after.fragment_milli, exact.fragment_milli
            );
        }
    }
}

mod demand {
    use super::*;
    use chrono::{Duration, TimeZone, Utc};
    use gpu_defrag_core::plan::demand::{
        DemandLimits, DemandOutcome, DemandPlan, NotServed, plan_demand, served, waiting,
    };

    fn pending(ns: &str, name: &str, gpus: u32, priority: i32) -> Pod {
        let mut p = pod(ns, name, name);
        p.phase = Phase::Pending;
        p.ready = false;
        p.priority = priority;
        p.shape = Some(GpuShape { gpus, milli: 1000 });
        p.unschedulable_since = Some(Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap());
        p
    }

    /// Three 8-GPU nodes: n0 holds 2 one-GPU pods, n1 holds 3, n2 holds 5; nothing fits
    /// an 8-GPU pod.
    fn three_nodes(prio_n0: i32) -> Cluster {
        let mut c = Cluster {
            nodes: (0..3)
                .map(|i| node(&format!("n{i}"), 8, Granularity::Node))
                .collect(),
            ..Default::default()
        };
        let mut k = 0;
        for (n, count) in [(0usize, 2usize), (1, 3), (2, 5)] {
            for g in 0..count {
                let mut p = pod("a", &format!("p{k:02}"), &format!("r{k}"));
                if n == 0 {
                    p.priority = prio_n0;
                }
                bind(&mut c, p, n, &[g], 1000);
                k += 1;
            }
        }
        c
    }

    fn served_index(c: &Cluster, key: &str) -> usize {
        c.pods.iter().position(|p| p.key() == key).unwrap()
    }

    fn run(c: &Cluster, pol: &Policy, served: &[&str], limits: DemandLimits) -> DemandPlan {
        let idx: Vec<usize> = served.iter().map(|k| served_index(c, k)).collect();
        plan_demand(c, pol, None, &History::default(), &idx, &limits)
    }

    /// The invariants of every planned demand run: the served pods fit on their rooms
    /// after the moves, every victim lands elsewhere, none outranks the served pod, and
    /// the limit holds.
    fn check(c: &Cluster, pol: &Policy, d: &DemandPlan, limit: u32) {
        assert_eq!(d.outcome, DemandOutcome::Planned, "{}", d.why);
        assert!(d.plan.moves.len() as u32 <= limit);
        let after = apply(c, &d.plan);
        let cap = Capacity::of(&after);
        let min_prio = d
            .rooms
            .iter()
            .map(|r| c.pods[r.pod].priority)
            .min()
            .unwrap();
        for m in &d.plan.moves {
            assert!(c.pods[m.pod_index].priority <= min_prio, "{m:?}");
            assert!(d.rooms.iter().all(|r| r.node_name != m.to_node), "{m:?}");
        }
        let mut rooms: Vec<&str> = d.rooms.iter().map(|r| r.node_name.as_str()).collect();
        rooms.sort();
        rooms.dedup();
        assert_eq!(rooms.len(), d.rooms.len(), "one node per served pod");
        for r in &d.rooms {
            let n = after.node_index(&r.node_name).unwrap();
            let p = &c.pods[r.pod];
            assert!(
                gpu_defrag_core::sched::fits(p, &after.nodes[n], cap.at(n)).is_some(),
                "{} does not fit on {} after the moves",
                r.pod_key,
                r.node_name
            );
        }
        let _ = pol;
    }

    #[test]
    fn the_cheapest_room_is_made_and_every_evicted_pod_refits() {
        let mut c = three_nodes(0);
        c.pods.push(pending("ml", "train", 8, 0));
        let c = finish(c);
        let pol = exact_policy(16);
        let d = run(&c, &pol, &["ml/train"], DemandLimits::default());
        check(&c, &pol, &d, 16);
        assert_eq!(d.rooms[0].node_name, "n0");
        assert_eq!(d.plan.moves.len(), 2);
        assert_eq!(d.plan.fenced_nodes, vec!["n0".to_string()]);
        assert_eq!(d.plan.pending_served, vec!["ml/train".to_string()]);
        assert!(
            d.plan.moves[0]
                .reason
                .contains("make room for ml/train on n0")
        );
    }

    #[test]
    fn a_pod_of_higher_priority_is_never_evicted_for_it() {
        let mut c = three_nodes(100);
        c.pods.push(pending("ml", "train", 8, 0));
        let c = finish(c);
        let pol = exact_policy(16);
        let d = run(&c, &pol, &["ml/train"], DemandLimits::default());
        check(&c, &pol, &d, 16);
        assert_eq!(
            d.rooms[0].node_name, "n1",
            "n0's pods outrank the served pod"
        );
        assert_eq!(d.plan.moves.len(), 3);
        // Served at priority 100, n0 is the cheapest room again.
        let mut c = three_nodes(100);
        c.pods.push(pending("ml", "train", 8, 100));
        let c = finish(c);
        let d = run(&c, &pol, &["ml/train"], DemandLimits::default());
        assert_eq!(d.rooms[0].node_name, "n0");
    }

    #[test]
    fn limits_and_the_step_budget_plan_nothing() {
        let mut c = three_nodes(0);
        c.pods.push(pending("ml", "train", 8, 0));
        let c = finish(c);
        let pol = exact_policy(16);
        let d = run(
            &c,
            &pol,
            &["ml/train"],
            DemandLimits {
                max_evictions: 1,
                ..DemandLimits::default()
            },
        );
        assert_eq!(d.outcome, DemandOutcome::NoRoom);
        assert!(d.plan.moves.is_empty());
        assert!(d.why.contains("limits"), "{}", d.why);
        let d = run(
            &c,
            &pol,
            &["ml/train"],
            DemandLimits {
                max_steps: 2,
                ..DemandLimits::default()
            },
        );
        assert_eq!(d.outcome, DemandOutcome::BudgetSpent);
        assert!(d.plan.moves.is_empty());
        // A PDB that allows no disruption protects the pods it covers.
        let mut c = three_nodes(0);
        c.pods.push(pending("ml", "train", 8, 0));
        for p in c.pods.iter_mut().filter(|p| p.namespace == "a") {
            std::sync::Arc::make_mut(&mut p.labels).insert("team".into(), "x".into());
        }
        c.pdbs.push(Pdb {
            namespace: "a".into(),
            name: "all".into(),
            selector: Some(LabelSelector {
                match_labels: BTreeMap::from([("team".to_string(), "x".to_string())]),
                match_expressions: vec![],
            }),
            disruptions_allowed: 0,
            stale: false,
        });
        let c = finish(c);
        let d = run(&c, &pol, &["ml/train"], DemandLimits::default());
        assert_eq!(d.outcome, DemandOutcome::NoRoom, "{}", d.why);
    }

    #[test]
    fn a_gang_gets_a_node_per_member_or_nothing() {
        // Room for one 8-GPU pod only (the 10 pods fill all but 14 GPUs of 24; two rooms
        // would leave 10 pods on 8 GPUs).
        let mut c = three_nodes(0);
        let mut a = pending("ml", "gang-0", 8, 0);
        let mut b = pending("ml", "gang-1", 8, 0);
        a.gang = Some(Gang::Member("pod group g".into()));
        b.gang = a.gang.clone();
        c.pods.push(a.clone());
        c.pods.push(b.clone());
        let c1 = finish(c);
        let pol = exact_policy(16);
        let d = run(
            &c1,
            &pol,
            &["ml/gang-0", "ml/gang-1"],
            DemandLimits::default(),
        );
        assert_eq!(d.outcome, DemandOutcome::NoRoom, "{}", d.why);
        assert!(d.plan.moves.is_empty() && d.rooms.is_empty());
        assert!(d.why.contains("gang of 2"), "{}", d.why);
        // A fourth, empty node: one room as it is, one made.
        let mut c = three_nodes(0);
        c.nodes.push(node("n3", 8, Granularity::Node));
        c.pods.push(a);
        c.pods.push(b);
        let c2 = finish(c);
        let d = run(
            &c2,
            &pol,
            &["ml/gang-0", "ml/gang-1"],
            DemandLimits::default(),
        );
        check(&c2, &pol, &d, 16);
        assert_eq!(d.rooms.len(), 2);
        assert_eq!(d.plan.moves.len(), 2);
    }

    #[test]
    fn a_gang_room_is_not_filled_by_the_pods_of_its_first_room() {
        // n0: movers of 2+2 GPUs; n1: movers of 2+2+1+1; n2, n3: 3 GPUs of pods that
        // never move. Both rooms exist (n0 and n1, the six movers onto n2 and n3), but
        // the first room's pods, placed most-allocated first, would fill n1.
        let mut c = Cluster {
            nodes: (0..4)
                .map(|i| node(&format!("n{i}"), 8, Granularity::Node))
                .collect(),
            ..Default::default()
        };
        let mut k = 0;
        for (n, sizes) in [(0usize, vec![2usize, 2]), (1, vec![2, 2, 1, 1])] {
            let mut g = 0;
            for size in sizes {
                let devs: Vec<usize> = (g..g + size).collect();
                bind(
                    &mut c,
                    pod("a", &format!("m{k}"), &format!("r{k}")),
                    n,
                    &devs,
                    1000,
                );
                g += size;
                k += 1;
            }
        }
        for n in [2usize, 3] {
            let mut p = pod("a", &format!("bare{n}"), "x");
            p.owner = None;
            p.workload = None;
            bind(&mut c, p, n, &[0, 1, 2], 1000);
        }
        for name in ["gang-0", "gang-1"] {
            let mut p = pending("ml", name, 8, 0);
            p.gang = Some(Gang::Member("pod group g".into()));
            c.pods.push(p);
        }
        let c = finish(c);
        let pol = exact_policy(16);
        let d = run(
            &c,
            &pol,
            &["ml/gang-0", "ml/gang-1"],
            DemandLimits::default(),
        );
        check(&c, &pol, &d, 16);
        assert_eq!(d.plan.moves.len(), 6);
        let mut rooms: Vec<&str> = d.rooms.iter().map(|r| r.node_name.as_str()).collect();
        rooms.sort();
        assert_eq!(rooms, vec!["n0", "n1"]);
    }

    #[test]
    fn shares_make_room_on_the_cheapest_gpus() {
        // Device granularity: two 4-GPU nodes; m0 has a 0.5 share on each GPU, m1 has a
        // 0.5 share on GPU 0 and GPU 1. A 2-GPU pod needs m1's two free GPUs: no move.
        // A 4-GPU pod needs m1 cleared of its two shares, which re-fit on m0.
        let mut c = Cluster {
            nodes: vec![
                node("m0", 4, Granularity::Device),
                node("m1", 4, Granularity::Device),
            ],
            ..Default::default()
        };
        bind(&mut c, pod("a", "s0", "r0"), 0, &[0], 500);
        bind(&mut c, pod("a", "s1", "r1"), 0, &[1], 500);
        bind(&mut c, pod("a", "s2", "r2"), 1, &[0], 500);
        bind(&mut c, pod("a", "s3", "r3"), 1, &[1], 500);
        let mut big = pending("ml", "big", 4, 0);
        big.scheme = Some(Scheme::Hami);
        c.pods.push(big);
        let c = finish(c);
        let pol = exact_policy(16);
        let d = run(&c, &pol, &["ml/big"], DemandLimits::default());
        check(&c, &pol, &d, 16);
        assert_eq!(d.plan.moves.len(), 2);
        for m in &d.plan.moves {
            assert_ne!(m.to_node, d.rooms[0].node_name);
        }
    }

    proptest! {
        // Most random clusters have a room as they are or none at all: 2048 cases give
        // about a hundred plans with evictions.
        #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

        /// On random clusters: a demand plan is deterministic, moves only pods the window
        /// planner may move (none it skips), none of higher priority than the served pod,
        /// within every limit and PDB allowance, each pod once, and leaves the served pod
        /// fitting on its room with every victim placed elsewhere.
        #[test]
        fn demand_plans_keep_every_rule(
            cs in full_case(),
            gpus in 1u32..=4,
            share in prop::bool::weighted(0.3),
            high in any::<bool>(),
        ) {
            let (mut c, pol) = build(&cs);
            // Mostly a whole node of the largest size: the pod that waits for room.
            let largest = c.nodes.iter().map(|n| n.gpus.len() as u32).max().unwrap_or(1);
            let gpus = if gpus > 1 { largest } else { gpus };
            let mut want = pending("ml", "want", gpus, if high { 1000 } else { 0 });
            if share {
                want.shape = Some(GpuShape { gpus: 1, milli: 500 });
            }
            c.pods.push(want);
            let c = finish(c);
            let idx = served_index(&c, "ml/want");
            let limits = DemandLimits {
                max_evictions: pol.max_evictions_per_run,
                ..DemandLimits::default()
            };
            let d = plan_demand(&c, &pol, None, &History::default(), &[idx], &limits);
            let again = plan_demand(&c, &pol, None, &History::default(), &[idx], &limits);
            prop_assert_eq!(&d, &again);
            if d.outcome != DemandOutcome::Planned {
                prop_assert!(d.plan.moves.is_empty() && d.rooms.is_empty());
                return Ok(());
            }
            check(&c, &pol, &d, pol.max_evictions_per_run);
            let skipped: BTreeSet<&str> =
                d.plan.skipped_pods.iter().map(|s| s.pod.as_str()).collect();
            let mut seen = BTreeSet::new();
            let mut per_node: HashMap<&str, u32> = HashMap::new();
            let mut per_ns: HashMap<&str, u32> = HashMap::new();
            for m in &d.plan.moves {
                let p = &c.pods[m.pod_index];
                prop_assert!(seen.insert(m.pod.as_str()), "moved twice: {}", m.pod);
                prop_assert!(!skipped.contains(m.pod.as_str()), "moved a skipped pod {}", m.pod);
                prop_assert!(p.is_active_bound());
                prop_assert_eq!(&m.from_node, &c.nodes[p.node.unwrap()].name);
                *per_node.entry(m.from_node.as_str()).or_default() += 1;
                *per_ns.entry(p.namespace.as_str()).or_default() += 1;
            }
            prop_assert!(per_node.values().all(|v| *v <= pol.max_evictions_per_node));
            prop_assert!(per_ns.values().all(|v| *v <= pol.max_evictions_per_namespace));
            for (b, pdb) in c.pdbs.iter().enumerate() {
                let n = d
                    .plan
                    .moves
                    .iter()
                    .filter(|m| {
                        let p = &c.pods[m.pod_index];
                        p.namespace == pdb.namespace
                            && pdb.selector.as_ref().is_some_and(|s| s.matches(&p.labels))
                    })
                    .count() as i64;
                prop_assert!(n <= pdb.disruptions_allowed.max(0), "PDB {} over", b);
            }
            // No GPU over-committed once the moves are applied and the pod is on its room.
            let after = apply(&c, &d.plan);
            for n in &after.nodes {
                prop_assert!(n.gpus.iter().all(|g| g.used <= 1000));
            }
        }
    }

    #[test]
    fn waiting_pods_are_grouped_and_filtered() {
        let mut c = three_nodes(0);
        let t0 = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap();
        let mut fresh = pending("ml", "fresh", 8, 0);
        fresh.unschedulable_since = Some(t0 + Duration::minutes(55));
        let mut other = pending("ml", "other-scheduler", 8, 0);
        other.scheduler = "default-scheduler".into();
        let mut small = pending("ml", "small", 1, 0);
        small.unschedulable_since = Some(t0);
        let mut g0 = pending("ml", "g0", 8, 0);
        let mut g1 = pending("ml", "g1", 8, 0);
        g0.gang = Some(Gang::Member("pod group g".into()));
        g1.gang = g0.gang.clone();
        g1.unschedulable_since = Some(t0 + Duration::minutes(1));
        let mut unknown = pending("ml", "unknown-gang", 8, 0);
        unknown.gang = Some(Gang::Unknown("pod group h".into()));
        let mut out_of_scope = pending("kube-system", "x", 8, 0);
        out_of_scope.unschedulable_since = Some(t0);
        for p in [
            fresh,
            other,
            small,
            g0,
            g1,
            unknown,
            out_of_scope,
            pending("ml", "old", 8, 0),
        ] {
            c.pods.push(p);
        }
        let c = finish(c);
        let pol = Policy {
            scope: gpu_defrag_core::policy::Scope {
                exclude: vec!["kube-system".into()],
                ..Default::default()
            },
            ..exact_policy(16)
        };
        let now = t0 + Duration::hours(1);
        let keys = |groups: Vec<Vec<usize>>| -> Vec<Vec<String>> {
            groups
                .into_iter()
                .map(|g| g.into_iter().map(|i| c.pods[i].key()).collect())
                .collect()
        };
        // The 1-GPU pod fits (n0 has 6 free GPUs): not waiting for room.
        assert_eq!(
            keys(waiting(&c, &pol, now, Duration::minutes(10))),
            vec![
                vec!["ml/g0".to_string(), "ml/g1".to_string()],
                vec!["ml/old".to_string()],
            ]
        );
        assert_eq!(
            keys(waiting(&c, &pol, now, Duration::minutes(1))).len(),
            3,
            "with a 1-minute wait the fresh pod waits too"
        );
    }

    /// The operator's served-pod checks, one by one, as `plan --for` reports them: a pod
    /// the scheduler has nominated, one that fits a node outside the policy's node scope,
    /// one that waited less than minWait, one of another scheduler, one never marked
    /// Unschedulable get no room; the one left is served.
    #[test]
    fn served_pods_are_those_the_operator_would_serve() {
        let t0 = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap();
        let now = t0 + Duration::hours(1);
        let min_wait = Duration::minutes(10);
        let mut c = three_nodes(0);
        let mut nominated = pending("ml", "nominated", 8, 0);
        nominated.nominated = Some("n0".into());
        let mut fresh = pending("ml", "fresh", 8, 0);
        fresh.unschedulable_since = Some(now - Duration::minutes(1));
        let mut other = pending("ml", "other", 8, 0);
        other.scheduler = "default-scheduler".into();
        let mut untried = pending("ml", "untried", 8, 0);
        untried.unschedulable_since = None;
        let mut pvc = pending("ml", "pvc", 8, 0);
        pvc.pvc = true;
        for p in [
            nominated,
            fresh,
            other,
            untried,
            pvc,
            pending("ml", "old", 8, 0),
        ] {
            c.pods.push(p);
        }
        let c = finish(c);
        let pol = exact_policy(16);
        let why = |key: &str| served(&c, &pol, now, min_wait, served_index(&c, key));
        assert!(matches!(why("ml/nominated"), Err(NotServed::Nominated(n)) if n == "n0"));
        assert!(matches!(why("ml/fresh"), Err(NotServed::TooSoon(..))));
        assert_eq!(
            why("ml/fresh").unwrap_err().to_string(),
            "unschedulable for 60s, under demand.minWait 10m"
        );
        assert!(matches!(why("ml/other"), Err(NotServed::Scheduler(_))));
        assert_eq!(why("ml/untried"), Err(NotServed::NotUnschedulable));
        assert_eq!(why("ml/pvc"), Err(NotServed::Volumes));
        let vouched = Policy {
            evict_pvc_pods: true,
            ..exact_policy(16)
        };
        let pvc = served_index(&c, "ml/pvc");
        assert!(served(&c, &vouched, now, min_wait, pvc).is_ok());
        assert_eq!(why("ml/old"), Ok(vec![served_index(&c, "ml/old")]));
        assert_eq!(why("a/p00"), Err(NotServed::NotPending));

        // An empty node outside the policy's node scope: the pod fits there as the
        // cluster is, so no room is made for it (and it is not counted as waiting).
        let mut c2 = c.clone();
        let mut spare = node("spare", 8, Granularity::Node);
        spare.labels.insert("pool".into(), "other".into());
        c2.nodes.push(spare);
        let c2 = finish(c2);
        let scoped = Policy {
            scope: gpu_defrag_core::policy::Scope {
                node_selector: Some(LabelSelector {
                    match_expressions: vec![("pool".into(), "DoesNotExist".into(), vec![])],
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..exact_policy(16)
        };
        let old = c2.pods.iter().position(|p| p.key() == "ml/old").unwrap();
        assert_eq!(
            served(&c2, &scoped, now, min_wait, old),
            Err(NotServed::FitsAsItIs)
        );
        assert!(waiting(&c2, &scoped, now, min_wait).is_empty());
    }

    /// The served pod's own constraints choose its room: an extended resource only one
    /// node has, and an anti-affinity against a pod that stays on the cheapest node.
    #[test]
    fn the_room_satisfies_the_served_pods_own_constraints() {
        let nic = "vpc.amazonaws.com/efa";
        let pol = exact_policy(16);
        // The NIC only on n1: the room is made there though n0 is cheaper.
        let mut c = three_nodes(0);
        c.nodes[1].extra_alloc = vec![(nic.to_string(), 1000)];
        let mut train = pending("ml", "train", 8, 0);
        train.constraints = Some(Box::new(Constraints {
            resources: vec![(nic.to_string(), 1000)],
            ..Default::default()
        }));
        c.pods.push(train.clone());
        let c = finish(c);
        let d = run(&c, &pol, &["ml/train"], DemandLimits::default());
        assert_eq!(d.outcome, DemandOutcome::Planned, "{}", d.why);
        assert_eq!(d.rooms[0].node_name, "n1");
        check(&c, &pol, &d, DemandLimits::default().max_evictions);

        // A cache pod (no GPU: never evicted for room) on n0, and the served pod keeps
        // away from it: the room goes to n1, the next cheapest.
        let mut c = three_nodes(0);
        let cache = pod("ml", "cache", "cache");
        bind(&mut c, cache, 0, &[], 1000);
        let mut train = pending("ml", "train", 8, 0);
        train.constraints = Some(Box::new(Constraints {
            anti_affinity: vec![PodAffinityTerm {
                selector: Some(LabelSelector {
                    match_labels: BTreeMap::from([("app".to_string(), "cache".to_string())]),
                    match_expressions: vec![],
                }),
                namespaces: TermNamespaces::List(vec!["ml".into()]),
                topology_key: "kubernetes.io/hostname".into(),
            }],
            ..Default::default()
        }));
        c.pods.push(train);
        let c = finish(c);
        let d = run(&c, &pol, &["ml/train"], DemandLimits::default());
        assert_eq!(d.outcome, DemandOutcome::Planned, "{}", d.why);
        assert_eq!(d.rooms[0].node_name, "n1");

        // Without the NIC anywhere: no room at all, and nothing evicted.
        let mut c = three_nodes(0);
        c.pods.push({
            let mut t = pending("ml", "train", 8, 0);
            t.constraints = Some(Box::new(Constraints {
                resources: vec![(nic.to_string(), 1000)],
                ..Default::default()
            }));
            t
        });
        let c = finish(c);
        let d = run(&c, &pol, &["ml/train"], DemandLimits::default());
        assert_eq!(d.outcome, DemandOutcome::NoRoom);
        assert!(d.plan.moves.is_empty());
    }

    /// Evicted pods are re-placed only where they fit by every filter: the pods of the
    /// cheapest node need a NIC no other node has, so the room is made elsewhere.
    #[test]
    fn victims_are_replaced_only_where_their_resources_are() {
        let nic = "example.com/rdma";
        let pol = exact_policy(16);
        let mut c = three_nodes(0);
        c.nodes[0].extra_alloc = vec![(nic.to_string(), 2000)];
        c.nodes[0].extra_used = vec![(nic.to_string(), 2000)];
        for p in c.pods.iter_mut().filter(|p| p.node == Some(0)) {
            p.constraints = Some(Box::new(Constraints {
                resources: vec![(nic.to_string(), 1000)],
                ..Default::default()
            }));
        }
        c.pods.push(pending("ml", "train", 8, 0));
        let c = finish(c);
        let d = run(&c, &pol, &["ml/train"], DemandLimits::default());
        assert_eq!(d.outcome, DemandOutcome::Planned, "{}", d.why);
        assert_eq!(
            d.rooms[0].node_name, "n1",
            "n0's pods could go nowhere else"
        );
        assert_eq!(d.plan.moves.len(), 3);
    }
}
