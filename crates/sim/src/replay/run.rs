//! One run of one planner over the prepared stream: the event loop, and what it reached.

use std::cmp::Reverse;
use std::collections::BTreeMap;

use serde::Serialize;

use super::arrivals::{Prepared, base_time, window_openings};
use super::placement::Placer;
use super::sim::Sim;
use super::view::Ctx;
use super::window::{step_run, window};
use super::{
    CLASSES, DAY, HOUR, NONE, PERCENTILES, PLANNERS, POLL_SECONDS, Params, demand, percentile,
};

/// What one planner reached.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Outcome {
    /// Planner.
    pub planner: String,
    /// Seed.
    pub seed: u64,
    /// Time-averaged allocated GPU / capacity after warm-up.
    pub allocation_ratio: f64,
    /// Pods evicted.
    pub evictions: usize,
    /// Runs that evicted (or re-placed, oracle).
    pub runs: usize,
    /// Window openings without a run, by reason (gpu-defrag: `pending`, more pending
    /// GPU pods than `maxPendingGpuPods`; `trigger`, fragment rate under the trigger;
    /// oracle: `repack-incomplete`, its repacking could not place every running pod).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub runs_skipped: BTreeMap<String, usize>,
    /// gpu-defrag: how its runs ended (`succeeded`; `pending`, stopped by
    /// `maxPendingGpuPods`; `stalled`, a replacement not Ready within
    /// `rescheduleTimeout`; `window-closed`).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub runs_ended: BTreeMap<String, usize>,
    /// Oracle: running pods its re-placement could not fit (back in the queue).
    #[serde(skip_serializing_if = "is_zero")]
    pub displaced: usize,
    /// Evictions of service replicas (`--services`).
    #[serde(skip_serializing_if = "is_zero")]
    pub service_evictions: usize,
    /// The polled rows (`gpu-defrag-demand`, `gpu-defrag-demand-only`,
    /// `kai-consolidation`): planner calls by
    /// outcome, runs, evictions, where the served and evicted pods went.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub demand: Option<demand::Stats>,
    /// Pods queued at the end.
    pub pending_at_end: usize,
    /// Pods queued at the end, per class.
    pub pending_at_end_by_class: BTreeMap<String, usize>,
    /// Queueing delay percentiles, seconds, per class.
    pub wait_seconds: BTreeMap<String, BTreeMap<String, f64>>,
    /// Pods measured per class.
    pub measured_pods: BTreeMap<String, usize>,
    /// Eviction → replacement running, seconds (replacements still queued count with
    /// their wait so far).
    pub disruption_seconds: BTreeMap<String, f64>,
    /// CPU seconds of the run.
    pub cpu_seconds: f64,
    /// Time series for `--plot`: one point per [`SAMPLE_SECONDS`].
    #[serde(skip)]
    pub series: Vec<Sample>,
}

pub use crate::plot::Sample;

/// Interval of the time series, seconds.
pub const SAMPLE_SECONDS: f64 = 1800.0;

fn is_zero(x: &usize) -> bool {
    *x == 0
}

/// Runs one planner over the prepared stream.
pub fn run(prep: &Prepared, p: &Params, planner: &str) -> anyhow::Result<Outcome> {
    anyhow::ensure!(
        PLANNERS.contains(&planner),
        "unknown planner {planner:?} (one of {})",
        PLANNERS.join(", ")
    );
    let timer = crate::cputime::Timer::start();
    let horizon = p.days * DAY;
    let warmup = (p.warmup_days * DAY).min(horizon);
    let base = base_time();
    let windows = if matches!(
        planner,
        "none" | "fgd-placement" | "kai-consolidation" | "gpu-defrag-demand-only"
    ) {
        Vec::new()
    } else {
        window_openings(&p.windows, p.window_hours, base, horizon)?
    };
    let placer = if planner == "fgd-placement" {
        Placer::Fgd
    } else {
        Placer::BinPack
    };
    let mut sim = Sim::new(&prep.tpl, prep.nodes.clone(), placer, prep.shapes.clone());
    sim.warmup = warmup;
    let ctx = Ctx {
        trace: &prep.trace,
        base_nodes: &prep.base_nodes,
        params: p,
        base,
    };
    let series = event_loop(&mut sim, prep, &ctx, planner, &windows, horizon);
    let (pending_by_class, disruptions) = still_queued(&mut sim, prep, horizon);
    let (wait_seconds, measured) = wait_percentiles(&mut sim);
    let span = (horizon - warmup).max(1e-9);
    Ok(Outcome {
        planner: planner.to_string(),
        seed: p.seed,
        allocation_ratio: sim.alloc_integral / span / sim.capacity.max(1) as f64,
        evictions: sim.evictions,
        runs: sim.runs,
        runs_skipped: sim.runs_skipped.clone(),
        runs_ended: sim.runs_ended.clone(),
        displaced: sim.displaced,
        service_evictions: sim.svc_evictions,
        demand: demand::polled(planner).then(|| sim.demand.clone()),
        pending_at_end: sim.queued(),
        pending_at_end_by_class: pending_by_class,
        wait_seconds,
        measured_pods: measured,
        disruption_seconds: disruption_stats(disruptions),
        cpu_seconds: timer.stop().1,
        series,
    })
}

/// The event loop up to `horizon`: departures, arrivals, window openings, the steps
/// of a run, the services' hourly scaling and the polls, earliest first; the state is
/// sampled every [`SAMPLE_SECONDS`] and advanced to `horizon` at the end. Returns the
/// samples.
fn event_loop(
    sim: &mut Sim,
    prep: &Prepared,
    ctx: &Ctx,
    planner: &str,
    windows: &[(f64, f64)],
    horizon: f64,
) -> Vec<Sample> {
    let warmup = sim.warmup;
    let mut ai = 0;
    let mut wi = 0;
    let sample_every = SAMPLE_SECONDS;
    let mut next_sample = sample_every;
    let mut series = Vec::new();
    // Services: their replicas at t = 0 are placed first, then scaled at every hour.
    let mut next_hour = if prep.services.is_empty() {
        None
    } else {
        sim.scale_services(&prep.services, 0.0, false);
        Some(HOUR)
    };
    let mut next_poll = demand::polled(planner).then_some(POLL_SECONDS);
    loop {
        let next_dep = sim.heap.peek().map(|Reverse((b, _, _))| f64::from_bits(*b));
        let next_arr = prep.arrivals.get(ai).map(|a| a.t);
        let next_win = windows.get(wi).map(|w| w.0);
        let next_step = sim.run.as_ref().map(|r| r.next_step);
        let t = [
            next_dep, next_arr, next_win, next_step, next_hour, next_poll,
        ]
        .into_iter()
        .flatten()
        .fold(f64::INFINITY, f64::min);
        if t >= horizon || !t.is_finite() {
            break;
        }
        while next_sample <= t && next_sample < horizon {
            sim.sample(next_sample, sample_every, &mut series);
            next_sample += sample_every;
        }
        sim.advance(t);
        if next_step == Some(t) {
            step_run(sim, t);
        } else if next_hour == Some(t) {
            sim.scale_services(&prep.services, t, t >= warmup);
            next_hour = Some(t + HOUR);
        } else if next_poll == Some(t) {
            demand::poll(sim, ctx, planner, t);
            next_poll = Some(t + POLL_SECONDS);
        } else if next_dep == Some(t) {
            let Reverse((_, pi, epoch)) = sim.heap.pop().expect("peeked");
            if sim.pods[pi].epoch == epoch && sim.pods[pi].node != NONE {
                sim.depart(pi, t);
            }
        } else if next_win == Some(t) {
            window(sim, ctx, planner, t, windows[wi].1);
            wi += 1;
        } else {
            let a = prep.arrivals[ai];
            sim.arrive(&a, a.t >= warmup);
            ai += 1;
        }
    }
    while next_sample < horizon {
        sim.sample(next_sample, sample_every, &mut series);
        next_sample += sample_every;
    }
    sim.advance(horizon);
    series
}

/// Pods still queued at `horizon`: counted per class, their wait so far added to the
/// waits (when measured), and every disruption with a replacement still queued at its
/// length so far. Returns the counts and the disruptions.
fn still_queued(
    sim: &mut Sim,
    prep: &Prepared,
    horizon: f64,
) -> (BTreeMap<String, usize>, Vec<f64>) {
    let mut pending_by_class: BTreeMap<String, usize> = BTreeMap::new();
    let mut disruptions = sim.disruptions.clone();
    for pi in sim.queued_pods() {
        let pod = &sim.pods[pi];
        let c = prep.tpl[pod.tpl as usize].class;
        *pending_by_class.entry(CLASSES[c].to_string()).or_default() += 1;
        if pod.measured {
            sim.waits[c].push(horizon - pod.queued_at);
        }
        if let Some(e) = pod.evicted_at {
            disruptions.push(horizon - e);
        }
    }
    (pending_by_class, disruptions)
}

/// Queueing delay percentiles per class (the waits sorted in place), and the pods
/// measured per class.
fn wait_percentiles(
    sim: &mut Sim,
) -> (
    BTreeMap<String, BTreeMap<String, f64>>,
    BTreeMap<String, usize>,
) {
    let mut wait_seconds: BTreeMap<String, BTreeMap<String, f64>> = BTreeMap::new();
    let mut measured = BTreeMap::new();
    for (c, w) in sim.waits.iter_mut().enumerate() {
        if w.is_empty() {
            continue;
        }
        w.sort_by(f64::total_cmp);
        measured.insert(CLASSES[c].to_string(), w.len());
        for (name, q) in PERCENTILES {
            wait_seconds
                .entry(name.to_string())
                .or_default()
                .insert(CLASSES[c].to_string(), percentile(w, q).expect("non-empty"));
        }
    }
    (wait_seconds, measured)
}

/// Mean, percentiles and total of the disruptions (empty when there are none).
fn disruption_stats(mut disruptions: Vec<f64>) -> BTreeMap<String, f64> {
    disruptions.sort_by(f64::total_cmp);
    let mut disruption_seconds = BTreeMap::new();
    if !disruptions.is_empty() {
        disruption_seconds.insert(
            "mean".to_string(),
            disruptions.iter().sum::<f64>() / disruptions.len() as f64,
        );
        for (name, q) in PERCENTILES {
            disruption_seconds.insert(name.to_string(), percentile(&disruptions, q).expect("x"));
        }
        disruption_seconds.insert("total".to_string(), disruptions.iter().sum::<f64>());
    }
    disruption_seconds
}
