//! CPU time of the calling thread, so benchmark figures hold on a busy machine: the
//! wall clock counts other processes' turns on the cores, this does not.

use std::time::Instant;

/// Nanoseconds this thread has run on a CPU (Linux `/proc/thread-self/schedstat`);
/// `None` where that file does not exist.
pub fn thread_cpu_ns() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// Wall and CPU seconds of one phase.
#[derive(Debug, Clone, Copy)]
pub struct Timer {
    wall: Instant,
    cpu: Option<u64>,
}

impl Timer {
    /// Starts timing.
    pub fn start() -> Self {
        Timer {
            wall: Instant::now(),
            cpu: thread_cpu_ns(),
        }
    }

    /// (wall seconds, CPU seconds of this thread — the wall figure when unknown).
    pub fn stop(&self) -> (f64, f64) {
        let wall = self.wall.elapsed().as_secs_f64();
        let cpu = match (self.cpu, thread_cpu_ns()) {
            (Some(a), Some(b)) => b.saturating_sub(a) as f64 / 1e9,
            _ => wall,
        };
        (wall, cpu)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_advances_with_work() {
        let t = Timer::start();
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
        }
        let (wall, cpu) = t.stop();
        assert!(cpu > 0.0 && wall > 0.0, "{wall} {cpu} {x}");
        assert!(cpu <= wall * 1.5 + 0.01, "{wall} {cpu}");
    }
}
