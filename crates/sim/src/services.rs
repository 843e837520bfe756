//! Long-running inference services for the churn replay (`replay --services FRACTION`):
//! Deployment-like workloads that run for the whole replay beside the trace's jobs, their
//! replica count scaled up and down once an hour along a daily curve.
//!
//! - **How many, which shapes**: [`SERVICES`] services; each takes one shape drawn
//!   (seeded) from the workload's small pods (a GPU share or one whole GPU) that name no
//!   GPU model (a model-pinned service of dozens of replicas could outgrow its pool).
//! - **How much**: together they offer `fraction` of the replay's load on average; each
//!   service's share of it is drawn uniformly in [0.5, 1.5] and normalised.
//! - **Daily curve**: replicas at hour `h` are
//!   `round(mean · (1 + AMPLITUDE · cos(2π (h − PEAK_HOUR − phase) / 24)))`, the phase
//!   drawn per service in ±[`PHASE_HOURS`]: a daytime peak (15:00 UTC), a night trough,
//!   peak/trough 1.5. Replicas are created or deleted at the hour; scale-down deletes
//!   pending replicas first, then the newest running ones (the ReplicaSet order).
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Services in a replay with `--services` > 0.
pub const SERVICES: usize = 40;
/// Relative amplitude of the daily curve.
pub const AMPLITUDE: f64 = 0.2;
/// Hour of the day (UTC) of the peak.
pub const PEAK_HOUR: f64 = 15.0;
/// Per-service phase spread, hours (uniform in ±this).
pub const PHASE_HOURS: f64 = 1.5;

/// One service.
#[derive(Debug, Clone, PartialEq)]
pub struct Service {
    /// Trace pod index of its replicas' shape.
    pub tpl: u32,
    /// Mean replica count over a day.
    pub mean: f64,
    /// Phase offset of its daily curve, hours.
    pub phase_hours: f64,
}

impl Service {
    /// Replicas wanted at time `t` (seconds from midnight UTC of day 0).
    pub fn replicas(&self, t: f64) -> usize {
        let h = t / 3600.0;
        let x = std::f64::consts::TAU * (h - PEAK_HOUR - self.phase_hours) / 24.0;
        (self.mean * (1.0 + AMPLITUDE * x.cos())).round().max(0.0) as usize
    }
}

/// The services of a seed: `small` are the candidate trace pod indices (shares and
/// one-GPU pods without a model constraint), `demand[i]` the GPU milli of pod `i`,
/// `milli` the mean GPU milli all services together ask for.
pub fn draw(small: &[u32], demand: &[u64], milli: f64, seed: u64) -> Vec<Service> {
    if small.is_empty() || milli <= 0.0 {
        return Vec::new();
    }
    let mut rng = StdRng::seed_from_u64(seed ^ 0x005e_711c_e50f_1a7e);
    let picks: Vec<(u32, f64, f64)> = (0..SERVICES)
        .map(|_| {
            let tpl = small[rng.random_range(0..small.len())];
            let w = rng.random_range(0.5..1.5);
            let phase = rng.random_range(-PHASE_HOURS..PHASE_HOURS);
            (tpl, w, phase)
        })
        .collect();
    let total_w: f64 = picks.iter().map(|p| p.1).sum();
    picks
        .into_iter()
        .map(|(tpl, w, phase_hours)| Service {
            tpl,
            mean: milli * w / total_w / demand[tpl as usize].max(1) as f64,
            phase_hours,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn services_offer_their_share_and_follow_the_day() {
        let demand = [500, 1000, 250];
        let s = draw(&[0, 1, 2], &demand, 100_000.0, 7);
        assert_eq!(s, draw(&[0, 1, 2], &demand, 100_000.0, 7), "seeded");
        assert_ne!(s, draw(&[0, 1, 2], &demand, 100_000.0, 8));
        assert_eq!(s.len(), SERVICES);
        // Mean offered milli over a day (hourly steps) ≈ the asked milli.
        let day: f64 = (0..24)
            .map(|h| {
                s.iter()
                    .map(|x| {
                        x.replicas(f64::from(h) * 3600.0) as f64 * demand[x.tpl as usize] as f64
                    })
                    .sum::<f64>()
            })
            .sum::<f64>()
            / 24.0;
        assert!((day - 100_000.0).abs() < 2_000.0, "{day}");
        // A daytime peak, a night trough.
        let at = |h: f64| -> f64 {
            s.iter()
                .map(|x| x.replicas(h * 3600.0) as f64 * demand[x.tpl as usize] as f64)
                .sum()
        };
        assert!(at(15.0) > 1.2 * at(3.0), "{} vs {}", at(15.0), at(3.0));
        assert_eq!(at(15.0), at(15.0 + 24.0), "daily");
        assert!(draw(&[], &demand, 1.0, 1).is_empty());
    }
}
