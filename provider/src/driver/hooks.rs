//! What tests reach into a running device for (feature `testing`): stop
//! its progress thread, hold its batch lock, take or see a caller's hold.

use super::batch::TxBatch;
use super::device::Device;
use parking_lot::MutexGuard;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// The batch lock, held ([`Device::hold_batch`]).
pub struct BatchHold<'a>(#[allow(dead_code)] MutexGuard<'a, TxBatch>);

impl Device {
    /// Stop the progress thread from receiving, firing timers or sending
    /// (`true`) or let it go on (`false`), so that what still works is what
    /// callers' threads do themselves. Pausing returns once the thread has
    /// finished what it was doing (within 10 s), so nothing it receives
    /// afterwards is handled.
    pub fn pause_progress_thread(&self, paused: bool) {
        let s = &*self.shared;
        // Set again by the thread each time it looks while paused.
        s.progress_parked.store(false, Ordering::Release);
        s.progress_paused.store(paused, Ordering::Release);
        s.wake();
        let t0 = std::time::Instant::now();
        while paused
            && !s.progress_parked.load(Ordering::Acquire)
            && t0.elapsed() < Duration::from_secs(10)
        {
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    /// Take the batch lock as a pass sending a batch holds it (see
    /// `Shared::tx`), until the returned guard drops.
    pub fn hold_batch(&self) -> BatchHold<'_> {
        BatchHold(self.shared.tx.lock())
    }

    /// Make callers wait `delay` between arming the hold timer and taking
    /// the hold, as a caller preempted there would (zero: no wait).
    pub fn delay_hold_taking(&self, delay: Duration) {
        self.shared
            .hold_take_delay_us
            .store(delay.as_micros() as u64, Ordering::Relaxed);
    }

    /// Take a caller's hold on the socket for `hold` without receiving, as
    /// a program that took one and then stopped polling (descheduled) does:
    /// the progress thread neither receives nor watches the socket until
    /// the hold's timer fires.
    pub fn hold_socket_for(&self, hold: Duration) -> std::io::Result<()> {
        let s = &*self.shared;
        s.arm_hold_timer(hold)?;
        s.pacer.hold_armed(s.now());
        Ok(())
    }

    /// Whether a caller holds the socket now (`Pacer::empty_poll`).
    pub fn caller_hold_on(&self) -> bool {
        self.shared.pacer.hold_on()
    }

    /// How long the next hold a caller takes lasts, in ns
    /// (`Pacer::hold_len`).
    pub fn caller_hold_len(&self) -> u64 {
        self.shared.pacer.hold_len()
    }
}
