//! Timers: every armed QP timer is filed in the engine's index by its
//! deadline, so `poll_timeout` is one lookup however many QPs there are;
//! `handle_timeout` fires what is due, and the liveness watchdog finds a
//! QP that could wait forever.

use super::{Engine, Nanos};

impl Engine {
    /// Keep `timers` in step with QP `qpn`'s next deadline.
    pub(super) fn reindex_timer(&mut self, qpn: u32) {
        let Some(q) = self.qps.get_mut(&qpn) else {
            return;
        };
        let d = q.req.next_deadline();
        if d != q.indexed_deadline {
            if let Some(old) = q.indexed_deadline {
                self.timers.remove(&(old, qpn));
            }
            if let Some(new) = d {
                self.timers.insert((new, qpn));
            }
            q.indexed_deadline = d;
        }
    }

    /// The earliest timer deadline of any QP.
    pub fn poll_timeout(&self) -> Option<Nanos> {
        let first_qp = self.timers.first().map(|&(d, _)| d);
        debug_assert_eq!(
            first_qp,
            self.qps
                .values()
                .filter_map(|q| q.req.next_deadline())
                .min(),
            "the timer index missed a change"
        );
        #[cfg(debug_assertions)]
        for q in self.qps.values() {
            if let Some(why) = q.liveness_violation() {
                panic!("QP {:#x} would stall: {why}: {:?}", q.qpn, q.req);
            }
        }
        debug_assert!(
            self.qps
                .values()
                .all(|q| q.counted_loopback_unacked == q.loopback_unacked(&self.config)),
            "a QP's PSNs changed outside with_qp"
        );
        debug_assert_eq!(
            self.loopback_unacked,
            self.qps
                .values()
                .map(|q| q.counted_loopback_unacked)
                .sum::<i32>(),
            "the loopback window's count missed a QP"
        );
        match (first_qp, self.cm.poll_timeout()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The liveness watchdog: every RC QP with a message in flight must have
    /// a retransmission or RNR timer armed, or it would wait forever. A QP
    /// found without one is counted in [`Stats::stalls_repaired`] and gets
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
            self.touch(qpn, |q, _| q.repair_liveness(now));
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
            .timers
            .range(..=(now, u32::MAX))
            .map(|&(_, qpn)| qpn)
            .collect();
        for qpn in due {
            self.touch(qpn, |q, cx| q.on_timeout(cx, now));
        }
    }
}
