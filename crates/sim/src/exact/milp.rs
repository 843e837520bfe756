//! The MILP (see the module above) with good_lp, solved by HiGHS.
use std::collections::BTreeMap;
use std::time::Instant;

use ::highs::HighsModelStatus;
use anyhow::ensure;
use good_lp::solvers::highs::highs as highs_solver;
use good_lp::{Expression, ProblemVariables, SolverModel, Variable, variable};

use super::instance::{Landing, apply, deal};
use super::*;

/// Landing counts: (class (GPUs, milli), node) → per GPU (GPU, variable, column).
type Counts = BTreeMap<((u32, Milli), usize), Vec<(usize, Variable, usize)>>;

/// Columns in creation order: good_lp hands its variables to HiGHS in that order,
/// so column i of HiGHS' solution is the i-th variable created.
struct Vars {
    vars: ProblemVariables,
    n: usize,
    bin: usize,
    int: usize,
}

impl Vars {
    fn add(&mut self, def: good_lp::VariableDefinition, kind: u8) -> (Variable, usize) {
        match kind {
            0 => self.bin += 1,
            1 => self.int += 1,
            _ => {}
        }
        let v = self.vars.add(def);
        self.n += 1;
        (v, self.n - 1)
    }
    fn binary(&mut self) -> (Variable, usize) {
        self.add(variable().binary(), 0)
    }
    fn integer(&mut self, max: f64) -> (Variable, usize) {
        self.add(variable().integer().min(0).max(max), 1)
    }
    fn real(&mut self, max: f64) -> (Variable, usize) {
        self.add(variable().min(0).max(max), 2)
    }
}

/// The MILP under construction: its variables (columns) and rows, both in creation
/// order.
struct Milp {
    v: Vars,
    rows: Vec<good_lp::Constraint>,
}

/// The eviction variables and landing-node variables of every candidate.
struct Evictions {
    /// Per candidate: x_p (variable, column).
    x: Vec<(Variable, usize)>,
    /// Per candidate: (node, u_{p,n}, column) for every node it may land on.
    u: Vec<Vec<(usize, Variable, usize)>>,
}

/// Milli that leaves and arrives per GPU (by node), and cpu, memory and pod slots per
/// node, as expressions of the variables.
type Deltas = (Vec<Vec<Expression>>, Vec<[Expression; 3]>);

/// What HiGHS returned.
struct Solution {
    optimal: bool,
    objective_value: f64,
    /// The solver's dual bound (the objective when proved optimal).
    dual: f64,
    /// Value of every column.
    cols: Vec<f64>,
    /// Variables (binary, integer, continuous).
    size_vars: [usize; 3],
    n_rows: usize,
}

/// Solves the instance; the best plan found is applied and measured.
pub fn solve(
    c: &Cluster,
    inst: &Instance,
    shapes: &[TargetShape],
    time_limit: f64,
) -> Result<Solved> {
    let t0 = Instant::now();
    let mut m = Milp {
        v: Vars {
            vars: ProblemVariables::new(),
            n: 0,
            bin: 0,
            int: 0,
        },
        rows: Vec::new(),
    };
    let ev = eviction_vars(&mut m, inst);
    let (mut gpu_delta, node_delta) = deltas(c, inst, &ev);
    let counts = landing_counts(&mut m, c, inst, &ev, &mut gpu_delta);
    node_rows(&mut m, c, node_delta);
    let objective = levels_and_objective(&mut m, c, inst, gpu_delta);
    let sol = run_highs(m, objective, time_limit)?;
    let plan = deal_solution(inst, &ev, &counts, &sol.cols)?;
    let landed_back = plan
        .moves
        .iter()
        .filter(|(p, n, _)| c.pods[*p].node == Some(*n))
        .count();
    let (after, fragment_milli) = apply_and_check(c, inst, shapes, &plan, sol.objective_value)?;
    Ok(Solved {
        receiver_free_after: receiver_free_after(&plan, &after),
        optimal: sol.optimal,
        fragment_milli_after: fragment_milli,
        objective: sol.objective_value,
        fragment_milli_after_min: sol.dual.min(fragment_milli),
        evictions: plan.moves.len(),
        evicted: plan.moves.iter().map(|m| m.0).collect(),
        landed_back,
        seconds: t0.elapsed().as_secs_f64(),
        size: [
            sol.size_vars[0],
            sol.size_vars[1],
            sol.size_vars[2],
            sol.n_rows,
        ],
    })
}

/// Evictions and landing nodes: x_p, u_{p,n}, Σ_n u_{p,n} = x_p and Σ_p x_p ≤ B.
fn eviction_vars(m: &mut Milp, inst: &Instance) -> Evictions {
    let mut x = Vec::new();
    let mut u: Vec<Vec<(usize, Variable, usize)>> = Vec::new();
    let mut evict_all = Expression::default();
    for cand in &inst.cands {
        let (xv, xi) = m.v.binary();
        evict_all += xv;
        let mut lands = Vec::new();
        let mut sum = Expression::default();
        for &n in &cand.land {
            let (uv, ui) = m.v.binary();
            sum += uv;
            lands.push((n, uv, ui));
        }
        m.rows.push(sum.eq(xv));
        x.push((xv, xi));
        u.push(lands);
    }
    m.rows.push(evict_all.leq(inst.budget as f64));
    Evictions { x, u }
}

/// Per node: incoming pods' cpu, memory and slots; per GPU the milli that leaves (the
/// milli that arrives is added by [`landing_counts`]).
fn deltas(c: &Cluster, inst: &Instance, ev: &Evictions) -> Deltas {
    let nn = c.nodes.len();
    let mut gpu_delta: Vec<Vec<Expression>> = c
        .nodes
        .iter()
        .map(|n| vec![Expression::default(); n.gpus.len()])
        .collect();
    let mut node_delta: Vec<[Expression; 3]> = (0..nn).map(|_| Default::default()).collect();
    for (ci, cand) in inst.cands.iter().enumerate() {
        let p = &c.pods[cand.pod];
        let (xv, _) = ev.x[ci];
        for &(g, m) in &cand.devs {
            gpu_delta[cand.node][g] -= f64::from(m) * xv;
        }
        node_delta[cand.node][0] -= p.cpu as f64 * xv;
        node_delta[cand.node][1] -= p.mem as f64 * xv;
        node_delta[cand.node][2] -= xv;
        for &(n, uv, _) in &ev.u[ci] {
            node_delta[n][0] += p.cpu as f64 * uv;
            node_delta[n][1] += p.mem as f64 * uv;
            node_delta[n][2] += uv;
        }
    }
    (gpu_delta, node_delta)
}

/// Classes (GPUs, milli) and the pods of each landing on each node: the count
/// variables N_{s,g} and D_{c,g} with their rows; the milli they bring is added to
/// `gpu_delta`.
fn landing_counts(
    m: &mut Milp,
    c: &Cluster,
    inst: &Instance,
    ev: &Evictions,
    gpu_delta: &mut [Vec<Expression>],
) -> Counts {
    let mut classes: BTreeMap<(u32, Milli), Vec<usize>> = BTreeMap::new();
    for (ci, cand) in inst.cands.iter().enumerate() {
        classes.entry((cand.gpus, cand.milli)).or_default().push(ci);
    }
    // (class, node) → per GPU (count variable, column).
    let mut counts: Counts = BTreeMap::new();
    for (&(k, s), members) in &classes {
        for (n, node_delta_gpu) in gpu_delta.iter_mut().enumerate() {
            let mut incoming = Expression::default();
            let mut any = false;
            for &ci in members {
                if let Some(&(_, uv, _)) = ev.u[ci].iter().find(|(m, _, _)| *m == n) {
                    incoming += uv;
                    any = true;
                }
            }
            if !any {
                continue;
            }
            let mut total = Expression::default();
            let mut per_gpu = Vec::new();
            for (g, gpu) in c.nodes[n].gpus.iter().enumerate() {
                if !gpu.healthy || s == 0 {
                    continue;
                }
                let cap = if k == 1 {
                    f64::from(GPU_MILLI / s.max(1))
                } else {
                    members.len() as f64
                };
                let (dv, di) = m.v.integer(cap.min(members.len() as f64));
                total += dv;
                node_delta_gpu[g] += f64::from(s) * dv;
                if k >= 2 {
                    m.rows.push(Expression::from(dv).leq(incoming.clone()));
                }
                per_gpu.push((g, dv, di));
            }
            if s == 0 {
                continue;
            }
            m.rows.push(total.eq(f64::from(k) * incoming));
            counts.insert(((k, s), n), per_gpu);
        }
    }
    counts
}

/// The cpu, memory and pod-slot rows of every node.
fn node_rows(m: &mut Milp, c: &Cluster, node_delta: Vec<[Expression; 3]>) {
    for (node, [cpu, mem, pods]) in c.nodes.iter().zip(node_delta) {
        m.rows
            .push((cpu + node.cpu_used as f64).leq(node.cpu_alloc as f64));
        m.rows
            .push((mem + node.mem_used as f64).leq(node.mem_alloc as f64));
        m.rows
            .push((pods + node.pods_used as f64).leq(node.pods_alloc as f64));
    }
}

/// The levels of every GPU of the counted nodes and the multi-GPU shapes' fit
/// variables; returns the objective (the fragment milli after).
fn levels_and_objective(
    m: &mut Milp,
    c: &Cluster,
    inst: &Instance,
    mut gpu_delta: Vec<Vec<Expression>>,
) -> Expression {
    let metric = &inst.metric;
    let levels = metric.lo.len();
    let mut objective = Expression::default();
    for (n, node) in c.nodes.iter().enumerate() {
        if !inst.counted[n] {
            continue;
        }
        // Per GPU: Σ_j ρ_{g,j} over the levels at or above each multi shape's q,
        // and Σ_j z_{g,j} likewise.
        let mut above_r: Vec<Expression> = vec![Expression::default(); metric.multi.len()];
        let mut above_z: Vec<Expression> = vec![Expression::default(); metric.multi.len()];
        for (g, gpu) in node.gpus.iter().enumerate() {
            let delta = std::mem::take(&mut gpu_delta[n][g]);
            if !gpu.healthy {
                // No landing: its free milli (0) is what evictions give back.
                continue;
            }
            // used = used⁰ + delta, R = 1000 − used ∈ [0, 1000] by the levels.
            let used = delta + f64::from(gpu.used);
            let mut zs = Expression::default();
            let mut rs = Expression::default();
            for j in 0..levels {
                let (z, _) = m.v.binary();
                let (r, _) = m.v.real(f64::from(metric.hi[j]));
                m.rows
                    .push(Expression::from(r).leq(f64::from(metric.hi[j]) * z));
                m.rows
                    .push(Expression::from(r).geq(f64::from(metric.lo[j]) * z));
                zs += z;
                rs += r;
                objective += metric.coef[j] * r;
                for (mi, &(_, q, _)) in metric.multi.iter().enumerate() {
                    if metric.lo[j] >= q {
                        above_r[mi] += r;
                        above_z[mi] += z;
                    }
                }
            }
            m.rows.push(zs.eq(1.0));
            m.rows.push((rs + used).eq(f64::from(GPU_MILLI)));
        }
        let healthy = node.gpus.iter().filter(|g| g.healthy).count();
        for (mi, &(k, _, w)) in metric.multi.iter().enumerate() {
            if healthy < k as usize {
                continue; // never fits: its term is w·idle, in the coefficients
            }
            let (y, _) = m.v.binary();
            let (val, _) = m.v.real(f64::from(GPU_MILLI) * healthy as f64);
            m.rows
                .push(std::mem::take(&mut above_z[mi]).geq(f64::from(k) * y));
            m.rows
                .push(Expression::from(val).leq(std::mem::take(&mut above_r[mi])));
            m.rows
                .push(Expression::from(val).leq(f64::from(GPU_MILLI) * healthy as f64 * y));
            objective -= w * val;
        }
    }
    // Unhealthy GPUs free no milli to the metric (free() is 0): nothing to add.
    objective
}

/// Hands the MILP to HiGHS (quiet, one thread, the time limit and gaps) and reads
/// back its status, objective, dual bound and columns.
fn run_highs(m: Milp, objective: Expression, time_limit: f64) -> Result<Solution> {
    let v = m.v;
    let size_vars = [v.bin, v.int, v.n - v.bin - v.int];
    let mut problem = v.vars.minimise(objective).using(highs_solver);
    problem = m.rows.into_iter().fold(problem, |p, r| p.with(r));
    let mut model = problem
        .try_into_inner()
        .map_err(|e| anyhow::anyhow!("building the HiGHS model: {e}"))?;
    let n_rows = model.num_rows();
    model.make_quiet();
    model.set_option("time_limit", time_limit);
    model.set_option("threads", 1);
    model.set_option("mip_rel_gap", 1e-6);
    model.set_option("mip_abs_gap", 1e-2);
    let solved = model
        .try_solve()
        .map_err(|e| anyhow::anyhow!("HiGHS: {e:?}"))?;
    let status = solved.status();
    let optimal = match status {
        HighsModelStatus::Optimal => true,
        HighsModelStatus::ReachedTimeLimit => false,
        other => bail!("HiGHS ended with {other:?}"),
    };
    ensure!(
        solved.primal_solution_status() == ::highs::HighsSolutionStatus::Feasible,
        "HiGHS found no feasible plan within the time limit"
    );
    let objective_value = solved.objective_value();
    let dual = if optimal {
        objective_value
    } else {
        solved
            .double_info_value(c"mip_dual_bound")
            .map_err(|e| anyhow::anyhow!("HiGHS dual bound: {e:?}"))?
    };
    let cols = solved.get_solution().columns().to_vec();
    ensure!(
        cols.len() == v.n,
        "HiGHS returned {} columns, {} expected",
        cols.len(),
        v.n
    );
    Ok(Solution {
        optimal,
        objective_value,
        dual,
        cols,
        size_vars,
        n_rows,
    })
}

/// Deals the solution into pods and devices: each evicted pod's landing node, and per
/// (class, node) the landing counts per GPU dealt to its pods.
fn deal_solution(
    inst: &Instance,
    ev: &Evictions,
    counts: &Counts,
    cols: &[f64],
) -> Result<Landing> {
    let on = |i: usize| cols[i] > 0.5;
    let mut plan = Landing::default();
    let mut landing_on: BTreeMap<((u32, Milli), usize), Vec<usize>> = BTreeMap::new();
    for (ci, cand) in inst.cands.iter().enumerate() {
        if !on(ev.x[ci].1) {
            continue;
        }
        let n = ev.u[ci]
            .iter()
            .find(|(_, _, i)| on(*i))
            .map(|(n, _, _)| *n)
            .context("an evicted pod without a landing node")?;
        landing_on
            .entry(((cand.gpus, cand.milli), n))
            .or_default()
            .push(cand.pod);
    }
    for ((class, n), pods) in &landing_on {
        let per_gpu = counts.get(&(*class, *n)).context("no landing counts")?;
        let cs: Vec<(usize, u32)> = per_gpu
            .iter()
            .map(|(g, _, i)| (*g, cols[*i].round().max(0.0) as u32))
            .collect();
        let dealt = if class.0 == 1 {
            deal_shares(pods, cs)?
        } else {
            deal(pods, class.0 as usize, &cs)?
        };
        plan.moves
            .extend(dealt.into_iter().map(|(p, devs)| (p, *n, devs)));
    }
    Ok(plan)
}

/// Shares: pods of one size are interchangeable; a GPU may take several (`cs`: per
/// GPU, how many).
fn deal_shares(pods: &[usize], cs: Vec<(usize, u32)>) -> Result<Vec<(usize, Vec<usize>)>> {
    let mut out = Vec::new();
    let mut it = pods.iter();
    for (g, k) in cs {
        for _ in 0..k {
            let p = it.next().context("more landing counts than pods")?;
            out.push((*p, vec![g]));
        }
    }
    ensure!(it.next().is_none(), "fewer landing counts than pods");
    Ok(out)
}

/// Applies the plan and measures it with the bench's metric; checks that the levels'
/// linear value and the MILP's objective agree with the measurement. Returns the
/// cluster after and its fragment milli.
fn apply_and_check(
    c: &Cluster,
    inst: &Instance,
    shapes: &[TargetShape],
    plan: &Landing,
    objective_value: f64,
) -> Result<(Cluster, f64)> {
    let after = apply(c, plan)?;
    let scope = Default::default();
    let t = frag::totals(&after, &Capacity::of(&after), &scope, shapes);
    let linear: f64 = (0..after.nodes.len())
        .filter(|&n| inst.counted[n])
        .map(|n| inst.metric.node_value(&frag::free_of(&after.nodes[n])))
        .sum();
    ensure!(
        (t.fragment_milli - linear).abs() <= 1e-6 * t.fragment_milli.abs().max(1.0),
        "the levels' value {linear} differs from the metric {}",
        t.fragment_milli
    );
    ensure!(
        (t.fragment_milli - objective_value).abs() <= 1e-3 * t.fragment_milli.abs().max(1.0),
        "the MILP's objective {objective_value} differs from the measured fragment milli {}",
        t.fragment_milli
    );
    Ok((after, t.fragment_milli))
}

/// Free milli after the plan of each GPU an evicted pod landed on (once per GPU, in
/// (node, GPU) order).
fn receiver_free_after(plan: &Landing, after: &Cluster) -> Vec<Milli> {
    let mut receivers: Vec<(usize, usize)> = plan
        .moves
        .iter()
        .flat_map(|(_, n, devs)| devs.iter().map(move |g| (*n, *g)))
        .collect();
    receivers.sort_unstable();
    receivers.dedup();
    receivers
        .iter()
        .map(|&(n, g)| after.nodes[n].gpus[g].free())
        .collect()
}

/// Tests of the solver (feature `exact`: `cargo test -p gpu-defrag-sim --features exact`).
#[cfg(test)]
mod solver_tests {
    use super::*;
    use crate::scenario::tests::*;

    fn setup(seed: u64, budget: usize) -> (Cluster, Vec<TargetShape>, Instance) {
        let (c, _) = scenario::build(&tiny_trace(), &params(seed));
        let shapes = frag::default_shapes(&c, &Default::default());
        let inst = Instance::of(&c, &shapes, budget).unwrap();
        (c, shapes, inst)
    }

    /// With one eviction, the optimum is what trying every pod and every landing gives.
    #[test]
    fn one_eviction_matches_brute_force() {
        for seed in 0..4 {
            let (c, shapes, inst) = setup(seed, 1);
            let scope = Default::default();
            let before = frag::totals(&c, &Capacity::of(&c), &scope, &shapes);
            let mut best = before.fragment_milli;
            for cand in &inst.cands {
                for &n in &cand.land {
                    let g = c.nodes[n].gpus.len();
                    // Every set of `gpus` devices of node n.
                    for mask in 0u32..(1 << g) {
                        if mask.count_ones() != cand.gpus {
                            continue;
                        }
                        let devs: Vec<usize> = (0..g).filter(|i| mask & (1 << i) != 0).collect();
                        let plan = Landing {
                            moves: vec![(cand.pod, n, devs)],
                        };
                        if let Ok(after) = apply(&c, &plan) {
                            let t = frag::totals(&after, &Capacity::of(&after), &scope, &shapes);
                            best = best.min(t.fragment_milli);
                        }
                    }
                }
            }
            let s = solve(&c, &inst, &shapes, 60.0).unwrap();
            assert!(s.optimal);
            assert!(
                (s.fragment_milli_after - best).abs() < 1e-6,
                "seed {seed}: MILP {} brute force {best}",
                s.fragment_milli_after
            );
        }
    }

    /// The optimum is at least what every planner reaches without pending pods, and at
    /// most what the bench's bound allows.
    #[test]
    fn optimum_lies_between_the_planners_and_the_bound() {
        for seed in 0..4 {
            let (c, shapes, inst) = setup(seed, 4);
            let policy = bench::bench_policy(shapes.clone(), 4);
            let scope = Default::default();
            let before = frag::totals(&c, &Capacity::of(&c), &scope, &shapes);
            let s = solve(&c, &inst, &shapes, 60.0).unwrap();
            assert!(s.optimal);
            assert!(s.evictions <= 4);
            let opt = (before.fragment_milli - s.fragment_milli_after) / before.idle_milli as f64;
            for name in planners() {
                let r = bench::run(name, &c, &policy, 4, 50.0).unwrap();
                if r.pending_after == 0 {
                    let d = r.fragment_rate_before - r.fragment_rate_after;
                    assert!(d <= opt + 1e-9, "seed {seed} {name}: {d} > optimum {opt}");
                }
            }
            // Landing as planned is a plan the MILP may choose (every planned target
            // passes the filters the MILP's landings do): never above the optimum.
            let ap = as_planned(&c, &policy).unwrap();
            assert!(ap.evictions <= 4);
            assert!(
                ap.drop <= opt + 1e-9,
                "seed {seed} {AS_PLANNED}: {} > optimum {opt}",
                ap.drop
            );
            let b = bench::bound(&c, &shapes, 4);
            let bd = before.fragment_rate - b.fragment_rate_after_min;
            assert!(opt <= bd + 1e-9, "seed {seed}: optimum {opt} > bound {bd}");
        }
    }
}
