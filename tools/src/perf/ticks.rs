//! Latency timestamps. On x86_64 the time-stamp counter, which perftest's
//! `get_cycles` reads too: in guests whose clocksource is not the TSC
//! (emulated ones: HPET, ACPI PM) reading the system clock is a system call
//! and a device access, whose cost would land in every sample. Elsewhere
//! the monotonic clock. [`TickRate`] turns ticks into time.

use std::time::Instant;

#[cfg(target_arch = "x86_64")]
/// The tick counter.
pub fn now() -> u64 {
    // SAFETY: RDTSC exists on every x86_64 CPU and reads a counter;
    // it has no memory effects or preconditions.
    unsafe { core::arch::x86_64::_rdtsc() }
}

#[cfg(not(target_arch = "x86_64"))]
/// The tick counter.
pub fn now() -> u64 {
    use std::sync::OnceLock;
    static ORIGIN: OnceLock<std::time::Instant> = OnceLock::new();
    let origin = *ORIGIN.get_or_init(std::time::Instant::now);
    origin.elapsed().as_nanos() as u64
}

/// Ticks against the monotonic clock over a run: nanoseconds per tick.
pub struct TickRate {
    at: Instant,
    tick: u64,
}

impl TickRate {
    pub fn start() -> Self {
        TickRate {
            at: Instant::now(),
            tick: now(),
        }
    }

    /// Nanoseconds per tick since `start` (1.0 if too little time passed).
    pub fn ns_per_tick(&self) -> f64 {
        let ticks = now().wrapping_sub(self.tick);
        let ns = self.at.elapsed().as_nanos() as f64;
        if ticks == 0 || ns < 1e6 {
            1.0
        } else {
            ns / ticks as f64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn ticks_are_calibrated_against_the_monotonic_clock() {
        let rate = TickRate::start();
        let (t0, i0) = (now(), Instant::now());
        std::thread::sleep(Duration::from_millis(20));
        let (t1, i1) = (now(), Instant::now());
        let ns = rate.ns_per_tick() * t1.wrapping_sub(t0) as f64;
        let real = (i1 - i0).as_nanos() as f64;
        assert!(
            (ns / real - 1.0).abs() < 0.2,
            "{ns} ns by ticks against {real} ns"
        );
    }
}
