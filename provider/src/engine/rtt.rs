//! A reliable QP's round-trip time, and the tail-loss probe it times.
//!
//! A lost packet in the middle of a stream is repaired in a round trip:
//! the responder sees the gap at the next packet and sends a sequence NAK.
//! A lost *last* packet (or its ACK) leaves the responder nothing to see,
//! and the requester waits out the QP's Local ACK Timeout, which rdma_cm
//! sets to about 2 s. So the requester measures the round trip (one
//! sample in flight at a time, none across a retransmission: Karn's rule,
//! as TCP) and, [`RttEstimator::probe_after`] without any response while
//! PSNs are outstanding, sends a *probe*: first the highest PSN sent
//! again, asking for an ACK (a responder that has everything re-ACKs it
//! all, one that lacks a PSN NAKs the gap: one packet, where a late ACK
//! on a loaded host would otherwise cost a window resent); then, if that
//! too goes unanswered (the responder NAKed the gap before and that NAK
//! was lost), go-back-N from the oldest unacknowledged PSN. A probe is
//! what a retransmission is on the wire, so any peer (rxe, a NIC) handles
//! it; it does not spend the QP's `retry_cnt`, and the Local ACK Timeout
//! keeps running untouched, so a dead peer still fails the QP with
//! RETRY_EXC_ERR after `retry_cnt` real timeouts. At most [`MAX_PROBES`]
//! probes per silence, each after twice the last wait, a go-back after
//! at least [`GO_BACK_PROBE_FLOOR`].

use super::Nanos;
use roxe_wire::Psn;

/// The shortest wait before a probe: above the ACK delays of a busy host
/// (a responder's progress thread asleep, its ACK coalesced), so that a
/// probe is almost never spurious.
pub(crate) const PROBE_FLOOR: Nanos = 1_000_000;

/// The shortest wait before a probe that goes back to the oldest
/// unacknowledged PSN (the second and later of a silence): a spurious one
/// resends a window, so it waits out longer stalls of a loaded host.
pub(crate) const GO_BACK_PROBE_FLOOR: Nanos = 2_000_000;

/// Probes per silence (reset by a response that moves the window).
pub(crate) const MAX_PROBES: u8 = 3;

/// The wait before a probe while nothing has been measured yet (a QP's
/// first message), towards a peer on this host
/// ([`RttEstimator::probe_before_a_sample`]): without it, a lost first
/// packet waited out the whole Local ACK Timeout (2.1 s under rdma_cm).
/// Ten times the floor: far above a round trip on this host, even loaded.
/// Should a host be slower, the probe is spurious and its resend voids the
/// sample in flight (Karn), so each such probe doubles the wait until a
/// sample is taken (`unmeasured_wait`): with a fixed wait towards rxe in an
/// emulated guest (90 ms for a first ACK) every message was probed and no
/// sample ever came. Towards other hosts there is no probe before a
/// sample: their round trip is unknown.
pub(crate) const INITIAL_PROBE_WAIT: Nanos = 10 * PROBE_FLOOR;

/// The most [`INITIAL_PROBE_WAIT`] doubles to.
const MAX_UNMEASURED_WAIT: Nanos = 1_000_000_000;

/// The estimate, RFC 6298 style (gains 1/8 and 1/4).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct RttEstimator {
    /// Smoothed round trip; 0 until the first sample.
    srtt: Nanos,
    rttvar: Nanos,
    /// The PSN being timed and when it was first sent.
    sample: Option<(Psn, Nanos)>,
    /// Probes sent since the window last moved.
    probes: u8,
    /// The wait before a probe until the first sample; 0: no probe
    /// before it. [`INITIAL_PROBE_WAIT`] towards a peer on this host,
    /// doubled by each probe sent before the sample.
    unmeasured_wait: Nanos,
}

impl RttEstimator {
    /// Packet `psn` left at `now` (`again`: a retransmission).
    #[inline]
    pub fn sent(&mut self, psn: Psn, now: Nanos, again: bool) {
        if again {
            self.sample = None;
        } else if self.sample.is_none() {
            self.sample = Some((psn, now));
        }
    }

    /// The window moved: `una` is the oldest PSN still unacknowledged.
    pub fn acked_before(&mut self, una: Psn, now: Nanos) {
        self.probes = 0;
        let Some((psn, at)) = self.sample else {
            return;
        };
        if !una.is_after(psn) {
            return;
        }
        self.sample = None;
        let r = now.saturating_sub(at);
        if self.srtt == 0 {
            self.srtt = r.max(1);
            self.rttvar = r / 2;
        } else {
            let err = self.srtt.abs_diff(r);
            self.rttvar = (3 * self.rttvar + err) / 4;
            self.srtt = ((7 * self.srtt + r) / 8).max(1);
        }
    }

    /// Packets are sent again from PSN `from` on (go-back-N, a probe): a
    /// sample of a PSN that will be sent again no longer times one send
    /// (Karn); one of an older PSN still does.
    pub fn went_back(&mut self, from: Psn) {
        if self.sample.is_some_and(|(psn, _)| !psn.is_before(from)) {
            self.sample = None;
        }
    }

    /// How long after the last response (or send) to probe, if a probe
    /// is due at all: [`INITIAL_PROBE_WAIT`] based before the first
    /// sample, none after [`MAX_PROBES`].
    pub fn probe_after(&self) -> Option<Nanos> {
        if self.probes >= MAX_PROBES {
            return None;
        }
        let base = if self.srtt == 0 {
            if self.unmeasured_wait == 0 {
                return None;
            }
            self.unmeasured_wait
        } else {
            (2 * self.srtt + 4 * self.rttvar).max(PROBE_FLOOR)
        };
        Some(match self.probes {
            0 => base,
            n => (base << n).max(GO_BACK_PROBE_FLOOR << (n - 1)),
        })
    }

    /// Probes sent since the window last moved.
    pub fn probes_sent(&self) -> u8 {
        self.probes
    }

    /// A probe went out.
    pub fn probed(&mut self) {
        self.probes += 1;
        if self.srtt == 0 {
            self.unmeasured_wait = (self.unmeasured_wait * 2).min(MAX_UNMEASURED_WAIT);
        }
    }

    /// Whether to probe before the first sample (at
    /// [`INITIAL_PROBE_WAIT`]): only towards a peer on this host.
    pub fn probe_before_a_sample(&mut self, on: bool) {
        self.unmeasured_wait = if on { INITIAL_PROBE_WAIT } else { 0 };
    }

    /// The smoothed round trip, once measured.
    pub fn srtt(&self) -> Option<Nanos> {
        (self.srtt > 0).then_some(self.srtt)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_follow_the_acks_and_skip_retransmissions() {
        let mut r = RttEstimator::default();
        assert_eq!(
            r.probe_after(),
            None,
            "another host: no probe before a sample"
        );
        r.probe_before_a_sample(true);
        assert_eq!(
            r.probe_after(),
            Some(INITIAL_PROBE_WAIT),
            "a peer on this host: the initial wait"
        );
        // A probe before any sample doubles the wait of later silences
        // (the probe itself voids the sample in flight).
        r.probed();
        r.acked_before(Psn::new(0), 0);
        assert_eq!(r.probe_after(), Some(2 * INITIAL_PROBE_WAIT));
        r = RttEstimator::default();
        r.sent(Psn::new(10), 1_000, false);
        r.sent(Psn::new(11), 1_500, false); // one sample at a time
        r.acked_before(Psn::new(11), 51_000);
        assert_eq!(r.srtt(), Some(50_000));
        // A retransmitted PSN is not timed (Karn).
        r.sent(Psn::new(12), 60_000, true);
        r.acked_before(Psn::new(13), 900_000);
        assert_eq!(r.srtt(), Some(50_000));
        // An ACK short of the timed PSN takes no sample.
        r.sent(Psn::new(20), 1_000_000, false);
        r.acked_before(Psn::new(20), 1_100_000);
        assert_eq!(r.srtt(), Some(50_000));
        r.acked_before(Psn::new(21), 1_070_000);
        assert_eq!(r.srtt(), Some((7 * 50_000 + 70_000) / 8));
    }

    #[test]
    fn a_go_back_past_the_timed_psn_keeps_its_sample() {
        let mut r = RttEstimator::default();
        r.sent(Psn::new(10), 0, false);
        // PSN 14 is lost and resent: 10 was sent once, its ACK still
        // times one round trip.
        r.went_back(Psn::new(14));
        r.acked_before(Psn::new(12), 40_000);
        assert_eq!(r.srtt(), Some(40_000));
        // Going back to or before the timed PSN drops the sample.
        r.sent(Psn::new(20), 100_000, false);
        r.went_back(Psn::new(20));
        r.acked_before(Psn::new(21), 900_000);
        assert_eq!(r.srtt(), Some(40_000));
    }

    #[test]
    fn probes_wait_at_least_the_floor_and_back_off() {
        let mut r = RttEstimator::default();
        r.sent(Psn::new(1), 0, false);
        r.acked_before(Psn::new(2), 30_000);
        assert_eq!(r.probe_after(), Some(PROBE_FLOOR));
        r.probed();
        assert_eq!(r.probe_after(), Some(GO_BACK_PROBE_FLOOR));
        r.probed();
        assert_eq!(r.probe_after(), Some(2 * GO_BACK_PROBE_FLOOR));
        r.probed();
        assert_eq!(r.probe_after(), None, "at most MAX_PROBES per silence");
        // The window moves: probing may start again.
        r.acked_before(Psn::new(3), 40_000);
        assert_eq!(r.probe_after(), Some(PROBE_FLOOR));
        // A slow path: twice the round trip plus its variation.
        let mut slow = RttEstimator::default();
        slow.sent(Psn::new(1), 0, false);
        slow.acked_before(Psn::new(2), 10_000_000);
        assert_eq!(slow.probe_after(), Some(2 * 10_000_000 + 4 * 5_000_000));
    }
}

/// The fewest PSNs a lossy path still gets in flight.
pub(crate) const MIN_LOSS_WINDOW: i32 = 16;

/// A reliable QP's window after losses: go-back-N resends everything
/// from the lost PSN on, so a loss under a full window (1,024 PSNs, 4 MiB
/// towards loopback peers) costs 4 MiB. Each loss (a go-back-N, by NAK,
/// timeout or probe) halves the window, down to [`MIN_LOSS_WINDOW`]; each
/// PSN acknowledged grows it by one (doubling it per round trip) until it
/// no longer binds. (Growing by one per window acknowledged, as TCP's
/// congestion avoidance, measured slower at 1% random loss: the window,
/// not the resent PSNs, then bounds the rate; docs/PERFORMANCE.md.) A
/// path without loss never meets it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct LossWindow {
    /// PSNs allowed; 0: not limited (no loss since it grew back).
    psns: i32,
}

impl LossWindow {
    /// The window to send under, given the path's own (`max`).
    #[inline]
    pub fn limit(&self, max: i32) -> i32 {
        if self.psns == 0 {
            max
        } else {
            self.psns.min(max)
        }
    }

    /// The PSNs it allows, while it binds (`roxe stat`).
    pub fn binding(&self) -> Option<i32> {
        (self.psns != 0).then_some(self.psns)
    }

    /// A loss, with the window at `max` before it.
    pub fn lost(&mut self, max: i32) {
        self.psns = (self.limit(max) / 2).max(MIN_LOSS_WINDOW.min(max));
    }

    /// `n` PSNs were acknowledged under a path window of `max`.
    pub fn acked(&mut self, n: i32, max: i32) {
        if self.psns == 0 {
            return;
        }
        self.psns = self.psns.saturating_add(n);
        if self.psns >= max {
            *self = LossWindow::default();
        }
    }
}

#[cfg(test)]
mod window_tests {
    use super::*;

    #[test]
    fn losses_halve_the_window_and_acks_grow_it_back() {
        let mut w = LossWindow::default();
        assert_eq!(w.limit(1024), 1024, "no loss, no limit");
        w.lost(1024);
        assert_eq!(w.limit(1024), 512);
        w.lost(1024);
        w.lost(1024);
        assert_eq!(w.limit(1024), 128);
        for _ in 0..10 {
            w.lost(1024);
        }
        assert_eq!(w.limit(1024), MIN_LOSS_WINDOW);
        w.acked(16, 1024);
        assert_eq!(w.limit(1024), 32, "doubled by a window's ACKs");
        w.acked(2000, 1024);
        assert_eq!(w.limit(1024), 1024);
        assert_eq!(w, LossWindow::default(), "grown back: no longer binding");
        // A path window below the floor stays the bound.
        w.lost(8);
        assert_eq!(w.limit(8), 8);
    }
}
