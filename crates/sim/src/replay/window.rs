//! The planners at a window opening, and gpu-defrag's run over simulated time (the
//! operator's run state machine, its fences, one eviction per replacement Ready).

use chrono::{DateTime, TimeDelta, Utc};
use gpu_defrag_core::frag;
use gpu_defrag_core::plan::{self, History};
use gpu_defrag_core::run::{self, Ended, Limits, RunState, Sent, Stop, Verdict};

use super::sim::{Fences, Sim, bucket_of};
use super::view::{Ctx, gpu_defrag_policy, to_cluster};
use super::{HOUR, NONE, POLL_SECONDS};
use crate::bench;

/// The `runsEnded` key of how a run ended.
fn end_key(stop: Option<&Stop>) -> &'static str {
    match stop {
        None => "succeeded",
        Some(Stop::PendingPileUp(_)) => "pending",
        Some(Stop::Stalled(_)) => "stalled",
        Some(Stop::WindowClosed) => "window-closed",
        Some(Stop::LostLeadership) => "lost-leadership",
        Some(Stop::Requested(_)) => "stopped",
    }
}

/// A gpu-defrag run in progress: the operator's own run ([`gpu_defrag_core::run`]) over
/// simulated time. A replacement is Ready `ready_seconds` after it is bound; the fences
/// hold until the run ends.
#[derive(Clone)]
pub(super) struct RunSim {
    /// The queue's sequence number when the run started: pods queued after it were
    /// created since (replacements, arrivals).
    start_seq: u64,
    /// Planned evictions in plan order: (pod, its node then, its epoch then).
    moves: Vec<(usize, u32, u32)>,
    /// The run's decisions; each wait keeps its pod (= its replacement).
    state: RunState<usize>,
    /// When the run looks again.
    pub(super) next_step: f64,
    ready_seconds: f64,
    /// Simulated time 0.
    base: DateTime<Utc>,
}

impl RunSim {
    fn at(&self, t: f64) -> DateTime<Utc> {
        self.base + TimeDelta::milliseconds((t * 1000.0).round() as i64)
    }

    fn seconds(&self, at: DateTime<Utc>) -> f64 {
        (at - self.base).num_milliseconds() as f64 / 1000.0
    }
}

/// The workload of a replay pod in the run's state machine: its service, or itself (each
/// trace task is its own workload).
fn workload_of(sim: &Sim, pi: usize) -> String {
    match sim.pods[pi].svc {
        NONE => format!("pod-{pi}"),
        s => format!("svc-{s}"),
    }
}

/// One window opening: the planner's evictions, then the queue. gpu-defrag starts a run
/// (its evictions then follow over time, [`step_run`]).
pub(super) fn window(sim: &mut Sim, ctx: &Ctx, planner: &str, t: f64, window_end: f64) {
    if planner == "oracle" {
        // The repacking is kept only when every running pod found a place again (greedy
        // best fit can fail at high load): the oracle never displaces a running pod.
        let mut trial = sim.clone();
        trial.oracle(t);
        if trial.displaced == sim.displaced {
            *sim = trial;
            sim.runs += 1;
        } else {
            *sim.runs_skipped
                .entry("repack-incomplete".into())
                .or_default() += 1;
        }
        return;
    }
    if sim.run.is_some() {
        // The previous run is still going (windows closer than a run): no second one.
        *sim.runs_skipped.entry("running".into()).or_default() += 1;
        return;
    }
    let running_gpu = sim.pods.iter().filter(|p| p.node != NONE).count();
    let budget = ((ctx.params.budget.max(0.0) * running_gpu as f64).floor() as usize).max(1);
    let (c, ids) = to_cluster(sim, ctx);
    let chosen: Vec<usize> = match planner {
        "high-node-utilization" => {
            bench::choose_high_node_utilization(&c, budget, ctx.params.hnu_threshold).evicted
        }
        "fgd-descheduler" => {
            let shapes = frag::default_shapes(&c, &Default::default());
            bench::choose_fgd(&c, budget, &shapes).evicted
        }
        "gpu-defrag" | "gpu-defrag-demand" | "gpu-defrag-unguarded" | "gpu-defrag-8gpu" => {
            let mut policy = gpu_defrag_policy(budget as u32, ctx.params.max_pending_gpu_pods);
            if !matches!(planner, "gpu-defrag" | "gpu-defrag-demand") {
                policy.max_pending_gpu_pods = u32::MAX;
            }
            if planner == "gpu-defrag-8gpu" {
                let shapes = frag::default_shapes(&c, &Default::default());
                policy.shapes = bench::with_whole_node_shape(
                    &bench::bench_policy(shapes, budget as u32),
                    bench::WHOLE_NODE_SHAPE_WEIGHT,
                )
                .shapes;
            }
            let now = ctx.base + TimeDelta::milliseconds((t * 1000.0).round() as i64);
            let p = plan::plan(&c, &policy, Some(now), &History::default());
            if std::env::var_os("REPLAY_DEBUG").is_some() {
                eprintln!(
                    "t={:.1}h pending={} rate={:.4} moves={} skipped={:?} shapes={}",
                    t / HOUR,
                    sim.queued(),
                    p.before.fragment_rate,
                    p.moves.len(),
                    p.skipped,
                    p.shapes.len()
                );
            }
            if p.before.fragment_rate < policy.min_fragment_rate {
                *sim.runs_skipped.entry("trigger".into()).or_default() += 1;
            } else if !p.moves.is_empty() {
                let mut f = Fences {
                    node: vec![false; c.nodes.len()],
                    gpu: vec![0; c.nodes.len()],
                };
                for n in &p.fenced_nodes {
                    if let Some(i) = c.node_index(n) {
                        f.node[i] = true;
                    }
                }
                for d in &p.fenced_devices {
                    if let Some(i) = c.node_index(&d.node)
                        && let Some(g) = c.nodes[i].gpus.iter().position(|x| x.key == d.gpu)
                    {
                        f.gpu[i] |= 1 << g;
                    }
                }
                let moves: Vec<(usize, u32, u32)> = p
                    .moves
                    .iter()
                    .map(|m| {
                        let pi = ids[m.pod_index];
                        (pi, sim.pods[pi].node, sim.pods[pi].epoch)
                    })
                    .collect();
                let steps = p
                    .moves
                    .iter()
                    .zip(&moves)
                    .map(|(m, &(pi, _, _))| run::Planned {
                        pod: m.pod.clone(),
                        batch: m.batch,
                        workload: Some(workload_of(sim, pi)),
                    })
                    .collect();
                sim.fences = Some(f);
                let end = ctx.base + TimeDelta::milliseconds((window_end * 1000.0).round() as i64);
                sim.run = Some(RunSim {
                    start_seq: sim.seq,
                    moves,
                    state: RunState::new(steps, Limits::of(&policy), end),
                    next_step: t,
                    ready_seconds: ctx.params.ready_seconds.max(0.0),
                    base: ctx.base,
                });
                sim.runs += 1;
                step_run(sim, t);
            }
            return;
        }
        _ => Vec::new(),
    };
    let pis: Vec<usize> = chosen.iter().map(|&i| ids[i]).collect();
    if !pis.is_empty() {
        sim.runs += 1;
    }
    sim.evict(&pis, t);
    sim.serve_all(t);
}

/// One look of the gpu-defrag run at time `t`: the executor's shell over simulated time.
/// A wait ends when its replacement has been bound `ready_seconds` (or its pod ended); the
/// re-check verdict is the plan's own (the pod still on its node, same incarnation, else
/// passed over); GPU pods pending since the start are those queued after it.
pub(super) fn step_run(sim: &mut Sim, t: f64) {
    let Some(mut r) = sim.run.take() else { return };
    let now = r.at(t);
    r.state.settle(|w| {
        let p = &sim.pods[w.detail];
        if p.node != NONE {
            return (t >= p.bound_at + r.ready_seconds)
                .then_some(Ended::Replaced { bounced: false });
        }
        let b = bucket_of(&sim.tpl[p.tpl as usize]);
        // Not queued, not bound: it ended.
        (!sim.queue[b].contains_key(&p.seq)).then_some(Ended::Replaced { bounced: false })
    });
    let mut step = r.state.next(None, true, now);
    let stop = loop {
        match step {
            run::Step::Wait { until } => {
                // The next look: a replacement's Ready, a poll while one is queued, a
                // timeout.
                let (mut next_ready, mut poll) = (f64::INFINITY, f64::INFINITY);
                for w in r.state.in_flight() {
                    let p = &sim.pods[w.detail];
                    if p.node == NONE {
                        poll = t + POLL_SECONDS;
                    } else {
                        next_ready = next_ready.min(p.bound_at + r.ready_seconds);
                    }
                }
                let until = until.map_or(f64::INFINITY, |u| r.seconds(u));
                r.next_step = next_ready.min(poll).min(until).max(t + 1e-3);
                sim.run = Some(r);
                return;
            }
            run::Step::Check(i) => {
                let pending: usize = sim
                    .queue
                    .iter()
                    .map(|q| q.range(r.start_seq + 1..).count())
                    .sum();
                let (pi, node, epoch) = r.moves[i];
                let verdict = if sim.pods[pi].node == node && sim.pods[pi].epoch == epoch {
                    Verdict::Go
                } else {
                    Verdict::PassOver // gone (ended) or elsewhere: its unit goes on
                };
                step = match r.state.judged(i, pending, verdict) {
                    Some(s) => s,
                    None => r.state.next(None, true, now),
                };
            }
            run::Step::Evict(i) => {
                let (pi, node, _) = r.moves[i];
                sim.evict(&[pi], t);
                sim.dequeue(pi);
                if !sim.try_place(pi, t) {
                    sim.enqueue(pi);
                }
                sim.serve_node(node as usize, t);
                r.state.sent(i, Sent::Evicted(pi), now);
                step = r.state.next(None, true, now);
            }
            run::Step::GiveUp { .. } => step = r.state.next(None, true, now),
            run::Step::Done(stop) => break stop,
        }
    };
    *sim.runs_ended
        .entry(end_key(stop.as_ref()).into())
        .or_default() += 1;
    sim.fences = None;
    sim.serve_all(t);
}

#[cfg(test)]
mod tests {
    use super::super::arrivals::base_time;
    use super::super::placement::Placer;
    use super::super::sim::PodS;
    use super::super::test_support::*;
    use super::super::{DAY, Params};
    use super::*;
    use crate::scenario;

    /// `maxPendingGpuPods` counts GPU pods created since the run started that are pending,
    /// beyond the replacements in flight; the queue that was there before does not count.
    #[test]
    fn the_pending_guard_counts_only_pods_created_since_the_run_started() {
        let t = [tpl(1, 1000), tpl(8, 1000)];
        // One 8-GPU node with one long 1-GPU pod: 8-GPU pods can never run.
        let setup = |sim: &mut Sim| {
            sim.arrive(&arrival(0.0, 0, 100.0 * DAY), true);
            let mut f = Fences {
                node: vec![false; 1],
                gpu: vec![0; 1],
            };
            f.gpu[0] = 0;
            sim.fences = Some(f);
        };
        let run = |sim: &Sim, moves: Vec<(usize, u32, u32)>| {
            let steps = moves
                .iter()
                .map(|&(pi, _, _)| run::Planned {
                    pod: format!("ns/p{pi}"),
                    batch: 0,
                    workload: Some(workload_of(sim, pi)),
                })
                .collect();
            let limits = Limits {
                max_in_flight: 1,
                per_workload: 1,
                reschedule_timeout: std::time::Duration::from_secs(600),
                max_pending: 2,
            };
            let base = base_time();
            RunSim {
                start_seq: sim.seq,
                moves,
                state: RunState::new(steps, limits, base + TimeDelta::hours(10)),
                next_step: HOUR,
                ready_seconds: 30.0,
                base,
            }
        };
        // Ten 8-GPU pods queued before the run: it still evicts.
        let mut sim = Sim::new(&t, nodes(1, 8), Placer::BinPack, Vec::new());
        setup(&mut sim);
        for i in 0..10 {
            sim.arrive(&arrival(1.0 + f64::from(i), 1, HOUR), true);
        }
        assert_eq!(sim.queued(), 10);
        let m = vec![(0, 0, sim.pods[0].epoch)];
        sim.run = Some(run(&sim, m.clone()));
        step_run(&mut sim, HOUR);
        assert_eq!(sim.evictions, 1, "the old queue does not stop the run");
        // Three 8-GPU pods arriving after the run started: more than 2 → stopped before
        // its eviction.
        let mut sim = Sim::new(&t, nodes(1, 8), Placer::BinPack, Vec::new());
        setup(&mut sim);
        sim.run = Some(run(&sim, m.clone()));
        sim.run.as_mut().expect("run").next_step = 2.0 * HOUR;
        for i in 0..3 {
            sim.arrive(&arrival(HOUR + f64::from(i), 1, HOUR), true);
        }
        step_run(&mut sim, 2.0 * HOUR);
        assert_eq!(sim.evictions, 0);
        assert_eq!(sim.runs_ended.get("pending"), Some(&1));
        assert!(sim.run.is_none() && sim.fences.is_none(), "fences lifted");
        // Two: within the limit.
        let mut sim = Sim::new(&t, nodes(1, 8), Placer::BinPack, Vec::new());
        setup(&mut sim);
        sim.run = Some(run(&sim, m));
        for i in 0..2 {
            sim.arrive(&arrival(HOUR + f64::from(i), 1, HOUR), true);
        }
        step_run(&mut sim, 2.0 * HOUR);
        assert_eq!(sim.evictions, 1);
    }

    /// Two 8-GPU nodes, each with two 1-GPU pods of long life; an 8-GPU pod waits. Without
    /// a descheduler it waits until they end; one eviction run that moves the two pods of
    /// one node onto the other lets it start at the window.
    #[test]
    fn defragmentation_shortens_the_wait_of_an_8_gpu_pod() {
        let t = [tpl(1, 1000), tpl(8, 1000)];
        let trace = tiny_trace();
        let stream = |sim: &mut Sim| {
            // A spreading start: 1-GPU pods alternate between the nodes.
            for i in 0..4 {
                sim.pods.push(PodS {
                    tpl: 0,
                    queued_at: 0.0,
                    remaining: 10.0 * DAY,
                    end: 0.0,
                    node: NONE,
                    devs: 0,
                    epoch: 0,
                    seq: 0,
                    evicted_at: None,
                    measured: false,
                    bound_at: 0.0,
                    svc: NONE,
                });
                sim.bind(i, i % 2, 1 << (i / 2), 0.0);
            }
            sim.arrive(&arrival(HOUR, 1, HOUR), true);
            assert_eq!(sim.queued(), 1);
        };
        let params = Params {
            workload: "tiny".into(),
            seed: 1,
            days: 2.0,
            warmup_days: 0.0,
            load: 0.9,
            windows: vec!["0 2 * * *".into()],
            window_hours: 3.0,
            budget: 0.5,
            max_lifetime_hours: 1e6,
            hnu_threshold: 50.0,
            max_pending_gpu_pods: 5,
            ready_seconds: 30.0,
            services: 0.0,
        };
        let base_nodes = scenario::nodes_of(&trace);
        let ctx = Ctx {
            trace: &trace,
            base_nodes: &base_nodes,
            params: &params,
            base: base_time(),
        };
        for planner in ["gpu-defrag", "oracle"] {
            let mut sim = Sim::new(&t, nodes(2, 8), Placer::BinPack, Vec::new());
            stream(&mut sim);
            window(&mut sim, &ctx, planner, 2.0 * HOUR, 5.0 * HOUR);
            // gpu-defrag's run: one eviction per replacement Ready (30 s each); the
            // drained node stays fenced until the run ends.
            while let Some(r) = &sim.run {
                assert!(sim.queued() == 1, "{planner}: fenced during the run");
                let s = r.next_step;
                step_run(&mut sim, s);
            }
            assert_eq!(
                sim.queued(),
                0,
                "{planner}: the 8-GPU pod runs at the window"
            );
            if planner == "oracle" {
                assert_eq!(sim.waits[3], vec![HOUR], "{planner}");
            } else {
                assert_eq!(sim.waits[3], vec![HOUR + 60.0], "{planner}");
                assert_eq!(sim.evictions, 2, "{planner}");
                assert_eq!(sim.disruptions, vec![0.0, 0.0], "{planner}");
                assert_eq!(sim.runs_ended.get("succeeded"), Some(&1));
            }
        }
        let mut sim = Sim::new(&t, nodes(2, 8), Placer::BinPack, Vec::new());
        stream(&mut sim);
        window(&mut sim, &ctx, "none", 2.0 * HOUR, 5.0 * HOUR);
        assert_eq!(sim.queued(), 1, "no descheduler: still waiting");
    }
}
