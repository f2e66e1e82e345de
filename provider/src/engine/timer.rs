//! Timers. A QP has rxe's two (`retrans_timer` and `rnr_nak_timer`), a
//! tail-loss probe and the end of an ACK hold, named
//! by [`Timer`] and kept in its [`Timers`]; every QP with one armed is
//! filed in the engine's index under its earliest deadline, so
//! `poll_timeout` is one lookup however many QPs there are.
//! `handle_timeout` fires what is due, and the liveness watchdog finds a
//! QP that could wait forever.
//!
//! Nothing else in the transport runs on time: ACKs are coalesced in the
//! responder's queue (`resp::Responder::ack`), not by a timer (only a
//! ping-pong's ACK waits for one, `ack_hold.rs`), and the
//! watchdog runs when the driver calls it (`Engine::audit_liveness`). The
//! Communication Manager keeps its own timers, which `poll_timeout` and
//! `handle_timeout` merge in.

use super::{Engine, Nanos};
use roxe_wire::AckTimeout;

/// A timer of a QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Timer {
    /// An RNR NAK's wait: the requester sends nothing until it fires, and
    /// then the retransmission timer starts.
    RnrWait,
    /// No response came in time for the oldest unacknowledged PSN: go
    /// back to it, spending a retry (or fail with RETRY_EXC_ERR).
    Retransmit,
    /// No response for a few round trips: resend from the oldest
    /// unacknowledged PSN without spending a retry (`rtt.rs`).
    Probe,
    /// An ACK held for the QP's next request (`ack_hold.rs`) goes
    /// without it.
    AckHold,
}

impl Timer {
    /// Every timer, in the order a QP fires those due at once: an RNR wait
    /// that ends restarts the retransmission timer, which is then no
    /// longer due; a retransmission re-arms the probe.
    pub const ALL: [Timer; 4] = [
        Timer::RnrWait,
        Timer::Retransmit,
        Timer::Probe,
        Timer::AckHold,
    ];
}

/// The deadlines of one QP's timers, `None` where stopped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Timers([Option<Nanos>; Timer::ALL.len()]);

impl Timers {
    #[inline]
    pub fn deadline(&self, t: Timer) -> Option<Nanos> {
        self.0[t as usize]
    }

    #[inline]
    pub fn is_armed(&self, t: Timer) -> bool {
        self.deadline(t).is_some()
    }

    /// Arm `t` to fire at `at`.
    #[inline]
    pub fn arm_at(&mut self, t: Timer, at: Nanos) {
        self.0[t as usize] = Some(at);
    }

    /// Arm `t` to fire `timeout` after `now`; an infinite timeout (a QP
    /// `timeout` of 0) stops it instead.
    #[inline]
    pub fn arm_after(&mut self, t: Timer, now: Nanos, timeout: AckTimeout) {
        self.0[t as usize] = timeout.nanos().map(|d| now + d);
    }

    #[inline]
    pub fn stop(&mut self, t: Timer) {
        self.0[t as usize] = None;
    }

    pub fn stop_all(&mut self) {
        *self = Timers::default();
    }

    /// The earliest deadline of the armed timers.
    #[inline]
    pub fn next_deadline(&self) -> Option<Nanos> {
        self.0.iter().flatten().min().copied()
    }

    /// Whether `t` is due at `now`; a due timer is stopped, for the caller
    /// to fire.
    #[inline]
    pub fn take_due(&mut self, t: Timer, now: Nanos) -> bool {
        let due = self.deadline(t).is_some_and(|d| d <= now);
        if due {
            self.stop(t);
        }
        due
    }
}

impl Engine {
    /// File QP `qpn` in `deadlines` under its next deadline (or take it
    /// out), after anything that may have changed its timers.
    pub(super) fn refile_deadline(&mut self, qpn: u32) {
        let Some(q) = self.qps.get_mut(&qpn) else {
            return;
        };
        let d = q.timers.next_deadline();
        if d != q.indexed_deadline {
            if let Some(old) = q.indexed_deadline {
                self.deadlines.remove(&(old, qpn));
            }
            if let Some(new) = d {
                self.deadlines.insert((new, qpn));
            }
            q.indexed_deadline = d;
        }
    }

    /// The earliest timer deadline of any QP.
    pub fn poll_timeout(&self) -> Option<Nanos> {
        let first_qp = self.deadlines.first().map(|&(d, _)| d);
        debug_assert_eq!(
            first_qp,
            self.qps
                .values()
                .filter_map(|q| q.timers.next_deadline())
                .min(),
            "the timer index missed a change"
        );
        #[cfg(debug_assertions)]
        for q in self.qps.values() {
            if let Some(why) = q.liveness_violation() {
                panic!("QP {:#x} would stall: {why}: {q:?}", q.qpn);
            }
        }
        debug_assert!(
            self.qps
                .values()
                .all(|q| q.counted_loopback_unacked == q.loopback_unacked(&self.config)),
            "a QP's PSNs changed outside drive_qp"
        );
        debug_assert!(
            self.window_waiters.is_empty() || self.loopback_unacked > 0,
            "a QP waits for the loopback window with nothing in flight to free it"
        );
        debug_assert_eq!(
            self.loopback_unacked,
            self.qps
                .values()
                .map(|q| q.counted_loopback_unacked)
                .sum::<i32>(),
            "the loopback window's count missed a QP"
        );
        [
            first_qp,
            self.cm.poll_timeout(),
            self.held_disconnect_deadline(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// The liveness watchdog: every RC QP with a message in flight must have
    /// a retransmission or RNR timer armed, or it would wait forever. A QP
    /// found without one is counted in [`Stats::stalls_repaired`](super::Stats::stalls_repaired) and gets
    /// its retransmission timer armed, so it retransmits or, after
    /// `retry_cnt` timeouts, fails with RETRY_EXC_ERR as the IB rules say.
    /// O(QPs × send queue): the driver runs it every 100 ms; debug builds
    /// check the same invariant after every call (`poll_timeout`).
    pub fn audit_liveness(&mut self, now: Nanos) -> usize {
        let stalled: Vec<u32> = self
            .qps
            .values()
            .filter(|q| q.liveness_violation().is_some())
            .map(|q| q.qpn)
            .collect();
        for &qpn in &stalled {
            self.stats.stalls_repaired += 1;
            tracing::error!(
                qpn = format_args!("{qpn:#x}"),
                "liveness watchdog: a message in flight had no timer (an engine bug); timer armed"
            );
            self.drive_and_schedule(qpn, |q, _| q.repair_liveness(now));
        }
        stalled.len()
    }

    /// Fire every timer due at `now`.
    pub fn handle_timeout(&mut self, now: Nanos) {
        self.clock = self.clock.max(now);
        if self.cm.poll_timeout().is_some_and(|d| d <= now) {
            self.cm.handle_timeout(now);
        }
        let due: Vec<u32> = self
            .deadlines
            .range(..=(now, u32::MAX))
            .map(|&(_, qpn)| qpn)
            .collect();
        for qpn in due {
            self.drive_and_schedule(qpn, |q, cx| q.on_timeout(cx, now));
        }
    }
}
