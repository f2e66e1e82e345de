//! The progress thread: receives in bursts, fires the engine's timers,
//! releases what the fault injector holds, answers `roxe stat`, and sleeps
//! as the pacer says (`pacing.rs`).

use super::fault::Faults;
use super::raw::RawBatch;
use super::shared::{Core, Shared};
use crate::engine::Nanos;
use parking_lot::MutexGuard;
use rustix::event::{PollFd, PollFlags};
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// How often the progress thread runs the liveness audit
/// (`Engine::audit_liveness`) and, when busy-polling, answers `roxe stat`.
const AUDIT_EVERY: Nanos = 100_000_000;
/// A timer fired later than this after its deadline counts as late
/// (`DriverStats::timers_late`): more than one longest sleep plus
/// scheduling noise, so the progress thread missed a wake-up.
const LATE_TIMER: Nanos = 250_000_000;

impl Shared {
    /// The progress thread's loop, until the device closes.
    pub(super) fn progress(self: Arc<Self>) {
        let mut raw_rx = self.raw.as_ref().map(|fd| (fd, RawBatch::new()));
        let mut next_audit: Nanos = 0;
        let mut stat_pending = false;
        // Counted here, added to the stats under the next lock.
        let mut wakeups = 0u64;
        let mut coalesced = 0u64;
        // Spun since the last audit (`Pacer::progress_spins`).
        let mut spun = false;
        // The hold's timer woke the thread: a caller had stopped polling.
        let mut hold_lapsed = false;
        while !self.stop.load(Ordering::Acquire) {
            if self.progress_paused.load(Ordering::Acquire) {
                self.park();
                continue;
            }
            let mut guard: Option<MutexGuard<'_, Core>> = None;
            while self.pacer.progress_receives() {
                // Held from receive to hand-over (see `Shared::rx`).
                let mut rx = self.rx.lock();
                let full = match raw_rx.as_mut() {
                    None => self.receive_udp(&mut rx, &mut guard),
                    Some((fd, rb)) => self.receive_raw(fd, rb, &mut rx, &mut guard),
                };
                drop(rx);
                if !full {
                    // Drained for now: timers, sends and sleep below.
                    break;
                }
                // A full burst: send what it produced and let verbs calls in.
                if let Some(mut g) = guard.take() {
                    let batch = self.after_work(&mut g, false);
                    MutexGuard::unlock_fair(g);
                    self.send_batch(batch);
                }
            }
            let received = guard.is_some();
            let mut core = guard.unwrap_or_else(|| self.core.lock());
            if std::mem::take(&mut hold_lapsed) && received {
                // Datagrams waited in the socket for the hold to end.
                core.stats.holds_stranded += 1;
                self.pacer.hold_stranded();
            }
            core.stats.progress_wakeups += std::mem::take(&mut wakeups);
            core.stats.rx_coalesced += std::mem::take(&mut coalesced);
            let mut now = self.now();
            let due = core.engine.poll_timeout().filter(|&d| now >= d);
            if due.is_some_and(|d| now > d + LATE_TIMER) {
                core.stats.timers_late += 1;
            }
            if due.is_some() && !received {
                // What waits in the socket goes in before a timer fires,
                // even while a caller holds it (one that stopped polling):
                // a probe or a retransmission for packets whose answer sits
                // unread was spurious, and a duplicate READ request that
                // reaches a responder after the READ's memory is gone
                // fails that QP.
                let Core {
                    engine, tap, stats, ..
                } = &mut *core;
                if self.receive_in_pass(engine, tap, stats) {
                    now = self.now();
                }
            }
            core.engine.handle_timeout(now);
            if now >= next_audit {
                // The watchdog for "a QP waits forever": see
                // `Engine::audit_liveness` (debug builds check after every call).
                core.engine.audit_liveness(now);
                next_audit = now + AUDIT_EVERY;
                // A spinning thread may not sleep in poll for long: answer here.
                stat_pending |= std::mem::take(&mut spun);
            }
            if std::mem::take(&mut stat_pending) {
                if let Some(st) = &self.stat {
                    st.serve(|| self.stat_answer(&core));
                }
            }
            let handover = self.pacer.progress_pass(now, || core.engine.load());
            let batch = self.after_work(&mut core, handover);
            let left = self
                .pacer
                .progress_pass_done(handover, || core.engine.load());
            if left {
                core.stats.tx_left_to_caller += 1;
            }
            let deadline = self.pacer.progress_deadline(
                core.engine.poll_timeout(),
                core.faults.as_ref().and_then(Faults::next_release),
            );
            if self.pacer.progress_spins(now) {
                spun = true;
                MutexGuard::unlock_fair(core);
                let sent = batch.as_ref().is_some_and(|b| !b.is_empty());
                self.send_batch(batch);
                if self.pacer.busy_pass_yields(received, sent) {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
                continue;
            }
            // Going idle: what the capture holds reaches the file, so it is
            // complete even if the process exits without closing the device
            // (librdmacm keeps its devices open until exit).
            if let Some(tap) = core.tap.as_mut() {
                tap.flush_pending();
            }
            self.sleeping_until
                .store(deadline.unwrap_or(u64::MAX), Ordering::Release);
            MutexGuard::unlock_fair(core);
            self.send_batch(batch);
            let sleep = self.pacer.progress_sleep(self.now(), deadline, left);
            if sleep.coalescing {
                coalesced += 1;
            }
            let ts = rustix::time::Timespec {
                tv_sec: sleep.duration.as_secs() as _,
                tv_nsec: sleep.duration.subsec_nanos() as _,
            };
            let stat_fd = self.stat.as_ref().map(|s| s.fd());
            let stat_or_wake = stat_fd.unwrap_or(self.wake.as_fd());
            // While a caller holds the socket or the thread coalesces, its
            // datagrams wake nobody; the hold's timer ends the one, the
            // sleep's length the other.
            let socket_or_wake = if sleep.watch_socket {
                self.socket.as_fd()
            } else {
                self.wake.as_fd()
            };
            let mut fds = [
                PollFd::new(&socket_or_wake, PollFlags::IN),
                PollFd::new(&self.wake, PollFlags::IN),
                PollFd::new(self.raw.as_ref().unwrap_or(&self.wake), PollFlags::IN),
                PollFd::new(&stat_or_wake, PollFlags::IN),
                PollFd::new(&self.hold_timer, PollFlags::IN),
            ];
            let _ = rustix::event::poll(&mut fds, Some(&ts));
            self.pacer.progress_woke();
            wakeups += 1;
            stat_pending = stat_fd.is_some() && !fds[3].revents().is_empty();
            if !fds[4].revents().is_empty() {
                let _ = rustix::io::read(&self.hold_timer, &mut [0u8; 8]);
                self.pacer.hold_expired();
                hold_lapsed = true;
            }
            // Drained only when it woke the thread: a read of an empty
            // eventfd after every datagram's wake-up is a wasted system
            // call. A wake that comes after the poll returned is seen by
            // the next poll, which then returns at once.
            if !fds[1].revents().is_empty() {
                let mut drain = [0u8; 8];
                let _ = rustix::io::read(&self.wake, &mut drain);
            }
            self.sleeping_until.store(0, Ordering::Release);
        }
    }

    /// Paused by a test (`Device::pause_progress_thread`): say so, and
    /// look again within a millisecond.
    fn park(&self) {
        self.progress_parked.store(true, Ordering::Release);
        let mut fds = [PollFd::new(&self.wake, PollFlags::IN)];
        let pause = rustix::time::Timespec {
            tv_sec: 0,
            tv_nsec: 1_000_000,
        };
        let _ = rustix::event::poll(&mut fds, Some(&pause));
        let _ = rustix::io::read(&self.wake, &mut [0u8; 8]);
    }
}
