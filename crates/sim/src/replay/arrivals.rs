//! What a replay offers: its parameters, the pod shapes of the workload, the seeded
//! arrival stream, the window openings, and the workload prepared once per seed.

use std::collections::HashMap;

use chrono::{DateTime, TimeDelta, Utc};
use gpu_defrag_api::v1alpha1::Window;
use gpu_defrag_core::frag;
use gpu_defrag_core::model::*;
use gpu_defrag_core::policy::TargetShape;
use gpu_defrag_core::windows::Windows;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use super::sim::NodeS;
use super::{DAY, HOUR, class_of};
use crate::scenario;
use crate::services::{self, Service};
use crate::trace::{self, Trace};

/// Replay parameters.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Params {
    /// Workload (pod list).
    pub workload: String,
    /// Seed.
    pub seed: u64,
    /// Simulated days (warm-up included).
    pub days: f64,
    /// Warm-up days (not measured).
    pub warmup_days: f64,
    /// Offered GPU load (fraction of capacity).
    pub load: f64,
    /// Window schedules (cron, UTC).
    pub windows: Vec<String>,
    /// Window length, hours.
    pub window_hours: f64,
    /// Budget per run: fraction of running GPU pods.
    pub budget: f64,
    /// Lifetime cap, hours.
    pub max_lifetime_hours: f64,
    /// HighNodeUtilization threshold, percent.
    pub hnu_threshold: f64,
    /// gpu-defrag: `safety.maxPendingGpuPods` (the run stops before its next eviction
    /// when more GPU pods created since it started are pending, beyond the replacements
    /// in flight).
    pub max_pending_gpu_pods: u32,
    /// gpu-defrag: seconds from a replacement's binding to its being Ready (the pace of
    /// a run: with `maxInFlight: 1` one eviction per replacement Ready).
    pub ready_seconds: f64,
    /// Share of the offered GPU load that is long-running inference services
    /// ([`services`]); the trace's jobs offer the rest.
    pub services: f64,
}

/// One pod shape of the workload.
#[derive(Debug, Clone)]
pub(super) struct Tpl {
    pub(super) gpus: u32,
    pub(super) milli: u32,
    pub(super) cpu: u64,
    pub(super) mem: u64,
    /// Allowed model ids as a bit mask (0: any).
    pub(super) models: u64,
    pub(super) class: usize,
    pub(super) demand: u64,
}

/// One arrival of the shared stream.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Arrival {
    /// Time, seconds.
    pub t: f64,
    /// Trace pod index.
    pub tpl: u32,
    /// Lifetime, seconds.
    pub life: f64,
}

/// The arrival stream of a seed: the stationary population at t = 0, then Poisson
/// arrivals until `horizon`. `life_by_class[c]` are the lifetimes to draw from (capped).
pub fn arrivals(
    classes: &[usize],
    demand: &[u64],
    life_by_class: &[Vec<f64>; 4],
    capacity_milli: f64,
    load: f64,
    horizon: f64,
    seed: u64,
) -> (Vec<Arrival>, f64) {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed_a771_7a15);
    let n = classes.len();
    let mean = |v: &Vec<f64>| {
        if v.is_empty() {
            0.0
        } else {
            v.iter().sum::<f64>() / v.len() as f64
        }
    };
    let mean_life: Vec<f64> = life_by_class.iter().map(mean).collect();
    let max_life = life_by_class
        .iter()
        .flatten()
        .fold(1.0f64, |a, &b| a.max(b));
    let usable: Vec<usize> = (0..n)
        .filter(|&i| !life_by_class[classes[i]].is_empty())
        .collect();
    if usable.is_empty() {
        return (Vec::new(), 0.0);
    }
    let e_dt: f64 = usable
        .iter()
        .map(|&i| demand[i] as f64 * mean_life[classes[i]])
        .sum::<f64>()
        / usable.len() as f64;
    let e_t: f64 = usable.iter().map(|&i| mean_life[classes[i]]).sum::<f64>() / usable.len() as f64;
    let rate = load * capacity_milli / e_dt.max(1e-9);
    let draw = |rng: &mut StdRng| -> (u32, f64) {
        let i = usable[rng.random_range(0..usable.len())];
        let v = &life_by_class[classes[i]];
        (i as u32, v[rng.random_range(0..v.len())].max(1.0))
    };
    let mut out = Vec::new();
    // Stationary population: length-biased lifetimes (rejection), uniform residual.
    let initial = (rate * e_t).round() as usize;
    while out.len() < initial {
        let (tpl, life) = draw(&mut rng);
        if rng.random::<f64>() * max_life <= life {
            let residual = (rng.random::<f64>() * life).max(1.0);
            out.push(Arrival {
                t: 0.0,
                tpl,
                life: residual,
            });
        }
    }
    let mut t = 0.0;
    loop {
        t += -(1.0 - rng.random::<f64>()).ln() / rate;
        if t >= horizon {
            break;
        }
        let (tpl, life) = draw(&mut rng);
        out.push(Arrival { t, tpl, life });
    }
    (out, rate)
}

/// Window openings `[start, end)` in seconds from `base`, up to `horizon`.
pub fn window_openings(
    schedules: &[String],
    hours: f64,
    base: DateTime<Utc>,
    horizon: f64,
) -> anyhow::Result<Vec<(f64, f64)>> {
    if schedules.is_empty() {
        return Ok(Vec::new());
    }
    let minutes = (hours * 60.0).round() as i64;
    anyhow::ensure!(minutes > 0, "--window-hours must be positive");
    let ws: Vec<Window> = schedules
        .iter()
        .map(|s| Window {
            schedule: s.clone(),
            duration: format!("{minutes}m"),
            time_zone: None,
        })
        .collect();
    let ws = Windows::parse(&ws).map_err(|e| anyhow::anyhow!("--window: {e}"))?;
    let mut out = Vec::new();
    let mut now = base;
    while let Some(span) = ws.next(now) {
        let s = (span.start - base).num_milliseconds() as f64 / 1000.0;
        if s >= horizon {
            break;
        }
        let e = (span.end - base).num_milliseconds() as f64 / 1000.0;
        if out.last().is_none_or(|&(ls, _)| s > ls) {
            out.push((s.max(0.0), e));
        }
        now = span.end.max(span.start + TimeDelta::seconds(1));
    }
    Ok(out)
}

/// The simulated start: midnight UTC (windows are read from it).
pub fn base_time() -> DateTime<Utc> {
    DateTime::from_timestamp(1_767_225_600, 0).expect("valid") // 2026-01-01T00:00:00Z
}

/// The workload prepared once per (workload, seed): shapes, arrivals.
pub struct Prepared {
    pub(super) trace: Trace,
    pub(super) tpl: Vec<Tpl>,
    pub(super) nodes: Vec<NodeS>,
    pub(super) base_nodes: Vec<Node>,
    pub(super) arrivals: Vec<Arrival>,
    pub(super) shapes: Vec<TargetShape>,
    /// Long-running services (`--services`).
    pub(super) services: Vec<Service>,
    /// Arrivals per hour.
    pub rate_per_hour: f64,
    /// Pods at time 0.
    pub initial_pods: usize,
    /// Where lifetimes came from.
    pub lifetimes_from: String,
}

/// Loads the trace and draws the arrival stream.
pub fn prepare(dir: &std::path::Path, p: &Params) -> anyhow::Result<Prepared> {
    let trace = trace::load(dir, &p.workload)?;
    let (life_by_class, from) = lifetimes_by_class(dir, p, &trace)?;
    let models = model_ids(&trace)?;
    let nodes = sim_nodes(&trace, &models);
    let tpl = templates(&trace, &models);
    let classes: Vec<usize> = tpl.iter().map(|t| t.class).collect();
    let demand: Vec<u64> = tpl.iter().map(|t| t.demand).collect();
    let capacity: u64 = nodes.iter().map(|n| n.gpus as u64 * 1000).sum();
    let svc_share = p.services.clamp(0.0, 1.0);
    // Services: shapes of the list's shares and one-GPU pods that name no GPU model.
    let small: Vec<u32> = trace
        .pods
        .iter()
        .enumerate()
        .filter(|(_, t)| t.models.is_empty() && class_of(t.num_gpu, t.gpu_milli) <= 1)
        .map(|(i, _)| i as u32)
        .collect();
    let services = services::draw(
        &small,
        &demand,
        svc_share * p.load * capacity as f64,
        p.seed,
    );
    let (arrivals, rate) = arrivals(
        &classes,
        &demand,
        &life_by_class,
        capacity as f64,
        p.load * (1.0 - svc_share),
        p.days * DAY,
        p.seed,
    );
    let initial_pods = arrivals.iter().take_while(|a| a.t == 0.0).count();
    let shapes = fgd_shapes(&trace);
    let base_nodes = scenario::nodes_of(&trace);
    Ok(Prepared {
        trace,
        tpl,
        nodes,
        base_nodes,
        arrivals,
        shapes,
        services,
        rate_per_hour: rate * HOUR,
        initial_pods,
        lifetimes_from: from,
    })
}

/// The trace's lifetimes per shape class, capped at `max_lifetime_hours`: the pod
/// list's own, or those of `default` for a list without them; with the list they came
/// from.
fn lifetimes_by_class(
    dir: &std::path::Path,
    p: &Params,
    trace: &Trace,
) -> anyhow::Result<([Vec<f64>; 4], String)> {
    let (life, from) = match trace::load_lifetimes(dir, &p.workload)? {
        Some(l) => (l, p.workload.clone()),
        None => {
            let l = trace::load_lifetimes(dir, "default")?
                .ok_or_else(|| anyhow::anyhow!("default pod list has no lifetimes"))?;
            (l, "default".to_string())
        }
    };
    let life_src = if from == p.workload {
        trace.pods.clone()
    } else {
        trace::load(dir, "default")?.pods
    };
    anyhow::ensure!(life.len() == life_src.len(), "lifetimes do not match pods");
    let cap = p.max_lifetime_hours * HOUR;
    let mut life_by_class: [Vec<f64>; 4] = Default::default();
    for (tp, l) in life_src.iter().zip(&life) {
        life_by_class[class_of(tp.num_gpu, tp.gpu_milli)].push((*l as f64).min(cap));
    }
    Ok((life_by_class, from))
}

/// An id per GPU model of the trace's nodes, in order of appearance (at most 64).
fn model_ids(trace: &Trace) -> anyhow::Result<HashMap<String, u32>> {
    let mut models: HashMap<String, u32> = HashMap::new();
    for n in &trace.nodes {
        let k = models.len() as u32;
        models.entry(n.model.clone()).or_insert(k);
    }
    anyhow::ensure!(models.len() <= 64, "more than 64 GPU models");
    Ok(models)
}

/// The replay's nodes, empty: one per trace node, grouped by (GPUs, model).
fn sim_nodes(trace: &Trace, models: &HashMap<String, u32>) -> Vec<NodeS> {
    let mut groups: HashMap<(u32, u32), usize> = HashMap::new();
    trace
        .nodes
        .iter()
        .map(|n| {
            let m = models[&n.model];
            let k = groups.len();
            let group = *groups.entry((n.gpus, m)).or_insert(k);
            let gpus = (n.gpus as usize).min(8);
            let mut free = [0; 8];
            free[..gpus].fill(GPU_MILLI);
            NodeS {
                gpus,
                free,
                cpu_free: n.cpu_milli,
                mem_free: n.memory_mib << 20,
                pods_free: scenario::PODS_PER_NODE,
                model: 1 << m,
                group,
            }
        })
        .collect()
}

/// The pod shape of every pod of the list.
fn templates(trace: &Trace, models: &HashMap<String, u32>) -> Vec<Tpl> {
    trace
        .pods
        .iter()
        .map(|t| Tpl {
            gpus: t.num_gpu,
            milli: t.gpu_milli,
            cpu: t.cpu_milli,
            mem: t.memory_mib << 20,
            models: t
                .models
                .iter()
                .filter_map(|m| models.get(m))
                .fold(0u64, |a, &b| a | (1 << b))
                | if t.models.is_empty() { 0 } else { 1 << 63 },
            class: class_of(t.num_gpu, t.gpu_milli),
            demand: u64::from(t.num_gpu) * u64::from(t.gpu_milli),
        })
        .collect()
}

/// FGD's target workload: the shapes of the pod list covering 95% of its pods.
fn fgd_shapes(trace: &Trace) -> Vec<TargetShape> {
    let list = Cluster {
        pods: trace
            .pods
            .iter()
            .map(|t| scenario::pod_of(t, t.name.clone(), None, &[]))
            .collect(),
        ..Default::default()
    };
    frag::default_shapes(&list, &Default::default())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lives() -> [Vec<f64>; 4] {
        [
            vec![60.0, 600.0, 6000.0],
            vec![100.0, 1000.0],
            vec![3600.0],
            vec![7200.0, 36000.0],
        ]
    }

    #[test]
    fn arrivals_are_seeded_and_offer_the_load() {
        let classes = [0, 1, 2, 3, 1];
        let demand = [500, 1000, 2000, 8000, 1000];
        let (a, rate) = arrivals(&classes, &demand, &lives(), 64_000.0, 0.9, 30.0 * DAY, 3);
        let (b, _) = arrivals(&classes, &demand, &lives(), 64_000.0, 0.9, 30.0 * DAY, 3);
        let (c, _) = arrivals(&classes, &demand, &lives(), 64_000.0, 0.9, 30.0 * DAY, 4);
        assert_eq!(a, b, "same seed, same stream");
        assert_ne!(a, c);
        assert!(a.windows(2).all(|w| w[0].t <= w[1].t), "in time order");
        // Poisson: the count after t = 0 is close to rate × horizon.
        let n = a.iter().filter(|x| x.t > 0.0).count() as f64;
        let expect = rate * 30.0 * DAY;
        assert!((n - expect).abs() < 4.0 * expect.sqrt(), "{n} vs {expect}");
        // Offered load: Σ demand × life over the arrivals ≈ load × capacity × horizon.
        let work: f64 = a
            .iter()
            .filter(|x| x.t > 0.0)
            .map(|x| demand[x.tpl as usize] as f64 * x.life)
            .sum();
        let offered = work / (64_000.0 * 30.0 * DAY);
        assert!((offered - 0.9).abs() < 0.05, "offered {offered}");
        // Lifetimes come from the arrival's own class.
        for x in &a {
            if x.t > 0.0 {
                assert!(lives()[classes[x.tpl as usize]].contains(&x.life), "{x:?}");
            }
        }
    }

    #[test]
    fn windows_open_when_expected() {
        let base = base_time();
        let w = window_openings(&["0 2 * * *".into()], 3.0, base, 3.0 * DAY).unwrap();
        assert_eq!(
            w,
            vec![
                (2.0 * HOUR, 5.0 * HOUR),
                (DAY + 2.0 * HOUR, DAY + 5.0 * HOUR),
                (2.0 * DAY + 2.0 * HOUR, 2.0 * DAY + 5.0 * HOUR)
            ]
        );
        let w = window_openings(&["30 */6 * * *".into()], 1.0, base, DAY).unwrap();
        let starts: Vec<f64> = w.iter().map(|x| x.0 / HOUR).collect();
        assert_eq!(starts, vec![0.5, 6.5, 12.5, 18.5]);
        assert!(window_openings(&["nonsense".into()], 1.0, base, DAY).is_err());
        assert!(window_openings(&[], 1.0, base, DAY).unwrap().is_empty());
    }
}
