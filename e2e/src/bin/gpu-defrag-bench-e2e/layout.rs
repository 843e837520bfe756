//! The trace and the start layout.
use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::Path,
};

use anyhow::{Context, Result, anyhow};
use rand::{Rng, SeedableRng, rngs::StdRng, seq::SliceRandom};

use crate::args::Args;

/// Rows of a CSV with a header (no quoted fields in the trace), as maps by column name.
fn read_csv(path: &Path) -> Result<Vec<BTreeMap<String, String>>> {
    let text = fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut lines = text.lines();
    let header: Vec<String> = lines
        .next()
        .ok_or_else(|| anyhow!("{} is empty", path.display()))?
        .split(',')
        .map(str::to_string)
        .collect();
    Ok(lines
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            header
                .iter()
                .cloned()
                .zip(l.split(',').map(str::to_string))
                .collect()
        })
        .collect())
}

fn num(row: &BTreeMap<String, String>, col: &str) -> Result<u64> {
    row.get(col)
        .ok_or_else(|| anyhow!("no column {col}"))?
        .trim()
        .parse()
        .with_context(|| format!("column {col}"))
}

#[derive(Debug, Clone)]
pub(crate) struct NodeSpec {
    pub(crate) name: String,
    pub(crate) gpus: u32,
    pub(crate) model: String,
    pub(crate) cpu_milli: u64,
    pub(crate) memory_mib: u64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct PodShape {
    pub(crate) gpus: u32,
    pub(crate) cpu_milli: u64,
    pub(crate) memory_mib: u64,
}

#[derive(Debug, Clone)]
pub(crate) struct Placed {
    pub(crate) app: String,
    pub(crate) shape: PodShape,
    pub(crate) node: usize,
}

/// The start state: nodes, running pods (each a 1-replica Deployment with a PDB) and the
/// pending multi-GPU pods.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    pub(crate) nodes: Vec<NodeSpec>,
    pub(crate) running: Vec<Placed>,
    pub(crate) pending: Vec<(String, PodShape)>,
    pub(crate) trace_pods: usize,
    pub(crate) shares_as_whole: usize,
}

#[derive(Debug, Clone, Default)]
struct Use {
    gpus: u32,
    cpu: u64,
    mem: u64,
    pods: u32,
}

fn fits(n: &NodeSpec, u: &Use, p: &PodShape) -> bool {
    u.gpus + p.gpus <= n.gpus
        && u.cpu + p.cpu_milli <= n.cpu_milli
        && u.mem + p.memory_mib <= n.memory_mib
        && u.pods < 110
}

/// The node the bin-packing scheduler (MostAllocated: GPU weight 100, cpu and memory 1)
/// would pick; ties go to the lowest index.
fn best_node(nodes: &[NodeSpec], used: &[Use], p: &PodShape) -> Option<usize> {
    let mut best: Option<(f64, usize)> = None;
    for (i, n) in nodes.iter().enumerate() {
        if !fits(n, &used[i], p) {
            continue;
        }
        let u = &used[i];
        let frac = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
        let score = 100.0 * frac((u.gpus + p.gpus) as f64, n.gpus as f64)
            + frac((u.cpu + p.cpu_milli) as f64, n.cpu_milli as f64)
            + frac((u.mem + p.memory_mib) as f64, n.memory_mib as f64);
        if best.is_none_or(|(s, _)| score > s + 1e-9) {
            best = Some((score, i));
        }
    }
    best.map(|(_, i)| i)
}

impl Use {
    /// Adds pod `p`.
    fn add(&mut self, p: &PodShape) {
        self.gpus += p.gpus;
        self.cpu += p.cpu_milli;
        self.mem += p.memory_mib;
        self.pods += 1;
    }
}

/// `args.nodes` GPU nodes of the trace drawn at random, biggest first, named by size.
fn pick_nodes(args: &Args, rng: &mut StdRng) -> Result<Vec<NodeSpec>> {
    let node_rows = read_csv(&args.trace.join("openb_node_list_gpu_node.csv"))?;
    let mut all_nodes = Vec::new();
    for r in &node_rows {
        let gpus = num(r, "gpu")? as u32;
        if gpus == 0 {
            continue;
        }
        all_nodes.push((
            gpus,
            r.get("model").cloned().unwrap_or_default(),
            num(r, "cpu_milli")?,
            num(r, "memory_mib")?,
        ));
    }
    all_nodes.shuffle(rng);
    all_nodes.truncate(args.nodes);
    // Biggest first, so names read well; the names carry the size.
    all_nodes.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    Ok(all_nodes
        .into_iter()
        .enumerate()
        .map(|(i, (gpus, model, cpu_milli, memory_mib))| NodeSpec {
            name: format!("node-{i:02}-{gpus}g"),
            gpus,
            model: if model.is_empty() {
                "unknown".into()
            } else {
                model
            },
            cpu_milli,
            memory_mib,
        })
        .collect())
}

/// The GPU pods of the workload's pod list (shares as whole GPUs), and how many of them
/// are shares.
fn read_shapes(args: &Args) -> Result<(Vec<PodShape>, usize)> {
    let pod_rows = read_csv(
        &args
            .trace
            .join(format!("openb_pod_list_{}.csv", args.workload)),
    )?;
    let mut shapes = Vec::new();
    let mut shares = 0;
    for r in &pod_rows {
        let g = num(r, "num_gpu")? as u32;
        if g == 0 {
            continue;
        }
        if num(r, "gpu_milli")? < 1000 {
            shares += 1;
        }
        shapes.push(PodShape {
            gpus: g,
            cpu_milli: num(r, "cpu_milli")?,
            memory_mib: num(r, "memory_mib")?,
        });
    }
    Ok((shapes, shares))
}

/// Places `shapes` in order with the bin-packing scheduler until `load` of the GPUs are
/// in use (those that fit nowhere are skipped): each with its node.
fn fill(nodes: &[NodeSpec], shapes: &[PodShape], load: f64) -> Vec<(PodShape, usize)> {
    let total: u32 = nodes.iter().map(|n| n.gpus).sum();
    let mut used = vec![Use::default(); nodes.len()];
    let mut placed: Vec<(PodShape, usize)> = Vec::new();
    let mut in_use = 0u32;
    for s in shapes {
        if in_use as f64 >= load * total as f64 {
            break;
        }
        if let Some(i) = best_node(nodes, &used, s) {
            used[i].add(s);
            in_use += s.gpus;
            placed.push((*s, i));
        }
    }
    placed
}

/// A seeded share (`departures`) of the placed pods ends: the pods left running and
/// the nodes' use.
fn depart(
    nodes: &[NodeSpec],
    placed: &[(PodShape, usize)],
    departures: f64,
    rng: &mut StdRng,
) -> (Vec<(PodShape, usize)>, Vec<Use>) {
    let mut order: Vec<usize> = (0..placed.len()).collect();
    order.shuffle(rng);
    let gone: BTreeSet<usize> = order
        .into_iter()
        .take((departures * placed.len() as f64).round() as usize)
        .collect();
    let mut used = vec![Use::default(); nodes.len()];
    let mut running = Vec::new();
    for (k, (s, i)) in placed.iter().enumerate() {
        if gone.contains(&k) {
            continue;
        }
        used[*i].add(s);
        running.push((*s, *i));
    }
    (running, used)
}

/// The queue: `args.pending8` 8-GPU and `args.pending4` 4-GPU shapes drawn from the
/// trace's pods of that size (`big`; a default shape when it has none).
fn queue(big: &[PodShape], args: &Args, rng: &mut StdRng) -> Vec<PodShape> {
    let mut pick = |gpus: u32, n: usize| -> Vec<PodShape> {
        let of: Vec<&PodShape> = big.iter().filter(|s| s.gpus == gpus).collect();
        (0..n)
            .map(|_| {
                if of.is_empty() {
                    PodShape {
                        gpus,
                        cpu_milli: 8000 * gpus as u64,
                        memory_mib: 65536 * gpus as u64,
                    }
                } else {
                    *of[rng.random_range(0..of.len())]
                }
            })
            .collect()
    };
    pick(8, args.pending8)
        .into_iter()
        .chain(pick(4, args.pending4))
        .collect()
}

impl Layout {
    /// The start layout of `seed` from the trace: nodes, running pods after departures,
    /// and the queue of multi-GPU pods that fit nowhere.
    pub(crate) fn from_trace(args: &Args, seed: u64) -> Result<Self> {
        let mut rng = StdRng::seed_from_u64(seed);
        let nodes = pick_nodes(args, &mut rng)?;
        let (mut shapes, shares) = read_shapes(args)?;
        let trace_pods = shapes.len();
        let big: Vec<PodShape> = shapes.iter().copied().filter(|s| s.gpus >= 4).collect();
        shapes.shuffle(&mut rng);
        let placed = fill(&nodes, &shapes, args.load);
        // Departures: a seeded share of the placed pods ends.
        let (mut running, mut used) = depart(&nodes, &placed, args.departures, &mut rng);
        // The queue: multi-GPU pods of the trace. Those that fit somewhere run (the
        // scheduler placed them); the rest are the pending pods the defragmentation serves.
        let mut pending = Vec::new();
        for s in queue(&big, args, &mut rng) {
            match best_node(&nodes, &used, &s) {
                Some(i) => {
                    used[i].add(&s);
                    running.push((s, i));
                }
                None => pending.push(s),
            }
        }
        let running = running
            .into_iter()
            .enumerate()
            .map(|(k, (shape, node))| Placed {
                app: format!("w-{k:03}"),
                shape,
                node,
            })
            .collect();
        let pending = pending
            .into_iter()
            .enumerate()
            .map(|(k, s)| (format!("pending-{}g-{k:02}", s.gpus), s))
            .collect();
        Ok(Self {
            nodes,
            running,
            pending,
            trace_pods,
            shares_as_whole: shares.min(trace_pods),
        })
    }

    fn total_gpus(&self) -> u32 {
        self.nodes.iter().map(|n| n.gpus).sum()
    }

    fn used_gpus(&self) -> u32 {
        self.running.iter().map(|p| p.shape.gpus).sum()
    }

    fn sizes(&self) -> String {
        let mut by: BTreeMap<u32, usize> = BTreeMap::new();
        for n in &self.nodes {
            *by.entry(n.gpus).or_default() += 1;
        }
        by.iter()
            .rev()
            .map(|(g, c)| format!("{c}×{g}-GPU"))
            .collect::<Vec<_>>()
            .join(", ")
    }

    pub(crate) fn describe(&self) -> String {
        let pend: Vec<String> = self
            .pending
            .iter()
            .map(|(_, s)| format!("{}", s.gpus))
            .collect();
        format!(
            "start layout: {} nodes ({}), {} GPUs; {} running pods on {} GPUs ({:.0}%); pending multi-GPU pods: {} (GPUs: {})",
            self.nodes.len(),
            self.sizes(),
            self.total_gpus(),
            self.running.len(),
            self.used_gpus(),
            100.0 * self.used_gpus() as f64 / self.total_gpus().max(1) as f64,
            self.pending.len(),
            pend.join(",")
        )
    }
}
