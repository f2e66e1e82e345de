//! Completer (rxe's `rxe_comp.c`): ACKs, NAKs, READ responses and atomic
//! ACKs complete send WQEs, in order; the retransmission and RNR timers and
//! sequence NAKs drive go-back-N retries, and exhausted retries fail the
//! oldest WR and the QP.
//!
//! The completer owns how far the responses have come and the retries
//! left ([`Completer`], rxe's `rxe_comp_info`); the requester (`req/`)
//! owns the cursor and the PSNs handed out. Both work on the QP's send
//! queue (`sq.rs`: each WQE's PSNs, progress and status) and its timers
//! (`timer.rs`). Beyond those, they talk only through these methods:
//!
//! - the completer asks the requester for [`Requester::next_psn`] (the end
//!   of what is in flight), to go back with [`Requester::rewind_to`]
//!   (go-back-N), and tells it [`Requester::front_retired`] when the
//!   oldest WQE leaves the queue;
//! - the requester asks the completer for [`Completer::una`] (the base of
//!   its window), and has it deliver the completions of the WQEs it
//!   finished itself (local operations, unreliable sends, a gather that
//!   failed) with [`Qp::retire_finished`].
//!
//! [`Requester::next_psn`]: super::req::Requester::next_psn
//! [`Requester::rewind_to`]: super::req::Requester::rewind_to
//! [`Requester::front_retired`]: super::req::Requester::front_retired

use super::qp::{Qp, QpCtx};
use super::sq::SendQueue;
use super::timer::Timer;
use super::{DropReason, Nanos};
use crate::qp_attr::{QpAttr, QpState};
use crate::types::WcStatus;
use crate::wr::{SendFlags, SendOpcode, WorkCompletion};
use roxe_wire::aeth::{AethSyndrome, NakCode};
use roxe_wire::{Operation, Packet, Psn};

/// What started a go-back-N.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RetryCause {
    /// The retransmission timer: always retries.
    Timeout,
    /// A sequence NAK, or a response beyond an unanswered READ/atomic (an
    /// implied NAK): ignored while a go-back-N is under way.
    Nak,
}

/// Per-QP completer state.
#[derive(Debug)]
pub(crate) struct Completer {
    /// Oldest unacknowledged PSN (rxe's `comp.psn`).
    una: Psn,
    /// Retries left after timeouts and sequence NAKs (`retry_cnt`).
    retry_left: u8,
    /// Retries left after RNR NAKs (`rnr_retry`; 7 is for ever).
    rnr_left: u8,
    /// A go-back-N triggered by a NAK or an implied NAK is under way: more
    /// stale responses from before it must not start (and pay for) another
    /// one. Cleared by progress; a timeout always retries (rxe's
    /// `started_retry`).
    retry_started: bool,
    /// Set by `ack_upto` when a response moved `una` or finished a WQE:
    /// forward progress, which refills the retry counter (IBA 9.7.6.1.3).
    /// Finishing a SEND behind an unanswered READ counts too, so a READ
    /// whose response keeps being lost cannot exhaust retries while the
    /// peer is visibly making progress.
    progressed: bool,
    /// The responder keeps what arrives beyond a gap, as far as is known
    /// (`EngineConfig::keep_early`): a sequence NAK is answered by
    /// resending the missing packet alone. Cleared for good after a few
    /// NAKs in a row for the packet after the one so resent
    /// (`next_lacking_in_a_row`).
    peer_keeps_early: bool,
    /// The PSN last resent alone after a sequence NAK.
    last_hole: Option<Psn>,
    /// Sequence NAKs in a row for the PSN right after the one resent
    /// alone before (a second loss next to the first, or a responder
    /// that keeps nothing): a few in a row clear `peer_keeps_early`.
    next_lacking_in_a_row: u8,
    /// The PSN of the last go-back implied by a response beyond an
    /// unanswered READ or atomic, and when: every later response implies
    /// the same loss until the go-back's first answer is back
    /// (`Qp::on_response`).
    implied_retry: Option<(Psn, Nanos)>,
}

impl Completer {
    pub fn new() -> Self {
        Completer {
            una: Psn::new(0),
            retry_left: 7,
            rnr_left: 7,
            retry_started: false,
            progressed: false,
            peer_keeps_early: true,
            last_hole: None,
            next_lacking_in_a_row: 0,
            implied_retry: None,
        }
    }

    /// `sq_psn` was set: nothing is in flight, from `psn` on.
    pub fn reset_psn(&mut self, psn: Psn) {
        self.una = psn;
    }

    /// Refill both retry counters from the QP's attributes.
    pub fn reset_retries(&mut self, attr: &QpAttr) {
        self.retry_left = attr.retry_cnt;
        self.rnr_left = attr.rnr_retry;
    }

    /// For the requester: the oldest unacknowledged PSN, the base of its
    /// window.
    #[inline]
    pub fn una(&self) -> Psn {
        self.una
    }

    /// What `roxe stat` shows: (retries left, RNR retries left).
    pub fn retries_left(&self) -> (u8, u8) {
        (self.retry_left, self.rnr_left)
    }

    /// Mark every SEND/WRITE whose PSNs all lie at or before `p` as
    /// acknowledged: the responder executed everything up to `p`. A READ or
    /// atomic in that range still needs its own response; the first such is
    /// returned as the PSN to resume from (an implied NAK), and `una` stops
    /// there.
    fn ack_upto(&mut self, sq: &mut SendQueue, p: Psn) -> Option<Psn> {
        let mut implied = None;
        for w in sq.iter_mut() {
            // Finished first: a local operation (bind, invalidate) is done
            // without ever being started.
            if w.done.is_some() {
                continue;
            }
            if !w.started {
                break;
            }
            if w.last_psn().is_after(p) {
                break;
            }
            if w.wr.opcode.is_read_or_atomic() {
                implied.get_or_insert(w.first_psn + w.read_pkts);
                continue;
            }
            w.done = Some(WcStatus::Success);
            self.progressed = true;
        }
        let upto = implied.unwrap_or(p.next());
        if upto.is_after(self.una) {
            self.una = upto;
            self.progressed = true;
        }
        implied
    }

    /// Advance `una` past `p` unless an earlier READ/atomic is unanswered.
    fn advance_una(&mut self, sq: &SendQueue, p: Psn) {
        // Only a started READ/atomic can block, and the send queue counts
        // those not yet retired: without one, no walk of the queue (this
        // runs for every ACK).
        let blocked = sq.reads_atomics_started() > 0
            && sq.iter().any(|w| {
                w.started
                    && w.done.is_none()
                    && w.wr.opcode.is_read_or_atomic()
                    && (w.first_psn + w.read_pkts).is_before(p)
            });
        if !blocked && p.next().is_after(self.una) {
            self.una = p.next();
        }
    }

    /// `una` never lags the first unfinished WQE: WQEs completed out of
    /// order (atomics, READs answered after an earlier READ) get no further
    /// ACK, so it is raised here rather than by the responses. With nothing
    /// unfinished it is `next_psn`, the requester's.
    fn catch_up_una(&mut self, sq: &SendQueue, next_psn: Psn) {
        match sq.iter().find(|w| w.started && w.done.is_none()) {
            Some(w) => {
                let floor = w.first_psn + w.read_pkts;
                if floor.is_after(self.una) {
                    self.una = floor;
                }
            }
            None => self.una = next_psn,
        }
    }

    /// Whether a started message waits for its response (PSNs before
    /// `next_psn` unacknowledged): what the retransmission timer covers.
    fn awaits_response(&self, sq: &SendQueue, next_psn: Psn) -> bool {
        self.una != next_psn && sq.iter().any(|w| w.started && w.done.is_none())
    }
}

/// How long a go-back implied by a response beyond an unanswered READ is
/// not repeated for the same PSN before a round trip is measured.
const IMPLIED_RETRY_WAIT: Nanos = 1_000_000;

/// The PSN a hole report names (`resp::HOLE_REPORT_CREDITS`), if `pkt`
/// is one.
fn hole_reported(pkt: &Packet<&[u8]>) -> Option<Psn> {
    if pkt.opcode().operation() != Operation::Acknowledge {
        return None;
    }
    let aeth = pkt.aeth()?;
    matches!(
        aeth.syndrome,
        AethSyndrome::Ack { credits } if credits == super::resp::HOLE_REPORT_CREDITS
    )
    .then(|| Psn::new(aeth.msn))
}

impl Qp {
    /// Deliver, in order, the completions of finished WQEs at the front of
    /// the send queue.
    pub(super) fn retire_finished(&mut self, cx: &mut QpCtx) {
        let qpn = self.qpn;
        let sig_all = self.init.sq_sig_all;
        let send_cq = self.init.send_cq;
        self.comp.catch_up_una(&self.sq, self.req.next_psn());
        while let Some(w) = self.sq.pop_finished() {
            self.req.front_retired();
            let status = w.done.unwrap_or(WcStatus::GeneralErr);
            if let Some(kind) = w.internal {
                if let Some((cq, wc)) =
                    super::tm::internal_done(&mut self.sq, kind, &w, status, qpn)
                {
                    cx.push_wc(cq, wc, false);
                }
                continue;
            }
            if status != WcStatus::Success || sig_all || w.wr.flags.contains(SendFlags::SIGNALED) {
                let mut wc = WorkCompletion::new(w.wr.wr_id, status, w.wr.opcode.wc_opcode(), qpn);
                wc.byte_len = if status == WcStatus::Success {
                    w.len
                } else {
                    0
                };
                cx.push_wc(send_cq, wc, false);
            }
        }
        self.end_drain_if_done(cx);
    }

    /// Complete the oldest unfinished WQE with `status`, then fail the QP.
    fn fail_oldest_wqe(&mut self, cx: &mut QpCtx, status: WcStatus) {
        let qpn = self.qpn;
        if status == WcStatus::RetryExcErr || status == WcStatus::RnrRetryExcErr {
            tracing::warn!(
                qpn = format_args!("{qpn:#x}"),
                status = ?status,
                "retries exhausted: the oldest WR fails, the QP goes to ERR"
            );
        } else {
            tracing::debug!(
                qpn = format_args!("{qpn:#x}"),
                status = ?status,
                "remote error: the oldest WR fails, the QP goes to ERR"
            );
        }
        if let Some(w) = self.sq.iter_mut().find(|w| w.done.is_none()) {
            w.done = Some(status);
        }
        self.retire_finished(cx);
        self.fail_qp(cx);
    }

    /// Finish WQE `i` with an error, then fail the QP.
    fn fail_wqe(&mut self, cx: &mut QpCtx, i: usize, status: WcStatus) {
        self.sq[i].done = Some(status);
        self.retire_finished(cx);
        self.fail_qp(cx);
    }

    /// Go-back-N from `r`, spending one retry; false when none is left.
    /// A NAK-triggered retry while another is under way is ignored.
    fn go_back_n(&mut self, cx: &QpCtx, r: Psn, cause: RetryCause) -> bool {
        self.retry_from(cx, r, cause, false)
    }

    /// A retry from PSN `r`: go-back-N, or (`selective`) only the packet
    /// carrying `r` (`Requester::resend_one`). False when no retry is left.
    fn retry_from(&mut self, cx: &QpCtx, r: Psn, cause: RetryCause, selective: bool) -> bool {
        let path = self.path_window(cx);
        let comp = &mut self.comp;
        if comp.retry_started && cause == RetryCause::Nak {
            return true;
        }
        if comp.retry_left == 0 {
            return false;
        }
        comp.retry_left -= 1;
        comp.retry_started = true;
        if cause == RetryCause::Nak {
            self.counters.fast_retransmits += 1;
        }
        if !(selective && self.req.resend_one(&self.sq, r)) {
            self.req.rewind_to(&self.sq, r);
        }
        self.rtt.went_back(r);
        // Go-back-N resends less under a smaller window; a packet resent
        // alone costs one packet whatever the window, but the halving
        // keeps what the responder holds beyond a gap (and what the
        // next loss strands) small: 1% loss, 64 KiB WRITEs, 1.06-1.30
        // against 0.33-0.61 GB/s without it.
        self.loss_window.lost(path);
        let retries_left = comp.retry_left;
        let cause = match cause {
            RetryCause::Timeout => "timeout",
            RetryCause::Nak => "NAK",
        };
        let qpn = format_args!("{:#x}", self.qpn);
        if selective {
            tracing::debug!(qpn, psn = %r, retries_left, cause, "missing packet resent alone");
        } else {
            tracing::debug!(qpn, psn = %r, retries_left, cause, "go-back-N");
        }
        true
    }

    /// Whether a lost packet may be resent alone: the responder keeps what
    /// arrives beyond a gap, as far as is known (a roxe peer on this host,
    /// both with `keep_early`, that has not shown otherwise), and no READ
    /// or atomic is in flight (a responder keeps SEND and WRITE packets
    /// only: READ requests beyond a gap are gone, and resending them one
    /// by one made 64 KiB READs at 1% loss three times slower).
    fn peer_keeps_early(&self, cx: &QpCtx) -> bool {
        cx.config.keep_early
            && self.comp.peer_keeps_early
            && self.sq.reads_atomics_started() == 0
            && self.peer_on_this_host(cx.config)
    }

    /// Whether a sequence NAK for `p` is answered by resending that packet
    /// alone: towards a roxe responder on this host that keeps what
    /// arrives beyond a gap (`EngineConfig::keep_early`). A NAK for the
    /// packet right after the one last resent alone (sent before) is a
    /// second loss next to the first, or a responder that keeps nothing
    /// (an older roxe): after `GIVE_UP` such NAKs in a row the responder
    /// is taken to keep nothing, for good, and gets go-back-N.
    fn resends_hole_alone(&mut self, cx: &QpCtx, p: Psn) -> bool {
        const GIVE_UP: u8 = 3;
        if !self.peer_keeps_early(cx) {
            return false;
        }
        let next_lacking = self.comp.last_hole.is_some_and(|h| h.next() == p)
            && p.is_before(self.req.first_unsent());
        self.comp.last_hole = Some(p);
        if !next_lacking {
            self.comp.next_lacking_in_a_row = 0;
            return true;
        }
        self.comp.next_lacking_in_a_row += 1;
        if self.comp.next_lacking_in_a_row < GIVE_UP {
            return true;
        }
        tracing::debug!(
            qpn = format_args!("{:#x}", self.qpn),
            psn = %p,
            "the responder keeps nothing beyond a gap: go-back-N from now on"
        );
        self.comp.peer_keeps_early = false;
        false
    }

    /// A roxe responder on this host reported `hole` missing beyond the
    /// gap it NAKed: that packet alone goes again, without a retry spent
    /// or the window cut (the NAK before it did both for this loss
    /// episode). Ignored unless the responder is one that keeps what
    /// follows a gap and `hole` was sent and is not acknowledged.
    fn resend_hole(&mut self, cx: &QpCtx, hole: Psn) {
        if !self.peer_keeps_early(cx)
            || hole.is_before(self.comp.una)
            || !hole.is_before(self.req.first_unsent())
        {
            return;
        }
        if self.req.resend_hole(&self.sq, hole) {
            self.counters.holes_resent += 1;
            tracing::debug!(qpn = format_args!("{:#x}", self.qpn), psn = %hole, "reported hole resent alone");
        }
    }

    /// A retry from `r` after a NAK or an implied one (`selective`: the
    /// packet carrying `r` alone), or fail with RETRY_EXC_ERR when no
    /// retry is left.
    fn retry_or_fail(&mut self, cx: &mut QpCtx, r: Psn, selective: bool) {
        if !self.retry_from(cx, r, RetryCause::Nak, selective) {
            self.fail_oldest_wqe(cx, WcStatus::RetryExcErr);
        }
    }

    /// Forward progress: the retry counters refill (IBA 9.7.6.1.3) and a
    /// go-back-N under way is over.
    fn refill_retries(&mut self) {
        let attr = self.attr;
        self.comp.reset_retries(&attr);
        self.comp.retry_started = false;
    }

    /// Restart the retransmission timer while a message waits for its
    /// response, stop it otherwise.
    fn rearm_retransmit(&mut self, now: Nanos) {
        if self.comp.awaits_response(&self.sq, self.req.next_psn()) {
            let timeout = self.ack_timeout();
            self.timers.arm_after(Timer::Retransmit, now, timeout);
            self.arm_probe(now);
        } else {
            self.timers.stop(Timer::Retransmit);
            self.timers.stop(Timer::Probe);
        }
    }

    /// Arm the tail-loss probe `rtt.probe_after()` from `now`, if one is
    /// due before the retransmission timer (else that timer will do).
    pub(super) fn arm_probe(&mut self, now: Nanos) {
        let at = self.rtt.probe_after().map(|d| now + d);
        match (at, self.timers.deadline(Timer::Retransmit)) {
            (Some(at), Some(rto)) if at < rto => self.timers.arm_at(Timer::Probe, at),
            (Some(at), None) if self.ack_timeout().nanos().is_none() => {
                self.timers.arm_at(Timer::Probe, at)
            }
            _ => self.timers.stop(Timer::Probe),
        }
    }

    /// A response (ACK, NAK, READ response, atomic ACK) to this QP.
    pub(super) fn on_response(&mut self, cx: &mut QpCtx, now: Nanos, pkt: &Packet<&[u8]>) {
        if !matches!(self.state(), QpState::Rts | QpState::Sqd) || !self.sends_reliably() {
            self.drop_packet(cx, DropReason::WrongState);
            return;
        }
        let p = pkt.bth().psn();
        if let Some(hole) = hole_reported(pkt) {
            self.resend_hole(cx, hole);
            if p.is_before(self.comp.una) {
                // Its cumulative part tells nothing new.
                return;
            }
        }
        // Only responses to PSNs in flight count: [una, next_psn).
        if p.is_before(self.comp.una) || !p.is_before(self.req.next_psn()) {
            self.drop_packet(cx, DropReason::PsnOutOfWindow);
            return;
        }
        // A response in the window: the path is not silent (READ
        // responses stream without moving `una` until a READ ends).
        if self.timers.is_armed(Timer::Probe) {
            self.arm_probe(now);
        }
        self.comp.progressed = false;
        let una_before = self.comp.una;
        let implied = match pkt.opcode().operation() {
            Operation::Acknowledge => match pkt.aeth().map(|a| a.syndrome) {
                Some(AethSyndrome::Ack { .. }) => self.comp.ack_upto(&mut self.sq, p),
                Some(syndrome) => {
                    // A NAK acknowledges everything before its PSN.
                    let implied = self.comp.ack_upto(&mut self.sq, p - 1);
                    if matches!(syndrome, AethSyndrome::RnrNak(_)) {
                        cx.stats.rnr_naks_received += 1;
                        self.counters.rnr_naks_received += 1;
                    }
                    if implied.is_none() {
                        self.on_nak(cx, now, p, syndrome);
                        return;
                    }
                    implied
                }
                None => None,
            },
            Operation::ReadResponse => match self.on_read_response(cx, pkt) {
                Some(implied) => implied,
                None => return,
            },
            Operation::AtomicAcknowledge => match self.on_atomic_ack(cx, pkt) {
                Some(implied) => implied,
                None => return,
            },
            _ => {
                self.drop_packet(cx, DropReason::OpcodeSequence);
                return;
            }
        };
        if self.comp.progressed {
            // Forward progress refills the retry counter and restarts the
            // retransmission timer.
            self.comp.catch_up_una(&self.sq, self.req.next_psn());
            self.rtt.acked_before(self.comp.una, now);
            self.req.acked_before(self.comp.una);
            let path = self.path_window(cx);
            self.loss_window
                .acked(una_before.distance(self.comp.una).max(0), path);
            self.refill_retries();
            self.rearm_retransmit(now);
        }
        self.retire_finished(cx);
        if let Some(resume) = implied {
            // An ACK or response beyond a READ/atomic whose answer never
            // came. The responses of later READs keep coming meanwhile,
            // each implying the same loss (and each counting as progress,
            // which ends `retry_started`): one go-back per round trip for
            // it, not one per response. Each of those went back N and
            // halved the window, which sat at its floor: 190,000 go-backs
            // for about 3,000 losses in a 64 KiB READ stream at 1% loss.
            let again_within = self.rtt.srtt().map_or(IMPLIED_RETRY_WAIT, |s| 2 * s);
            if self
                .comp
                .implied_retry
                .is_some_and(|(p, at)| p == resume && now < at + again_within)
            {
                return;
            }
            self.comp.implied_retry = Some((resume, now));
            self.retry_or_fail(cx, resume, false);
        }
    }

    /// A NAK for PSN `p` with nothing unanswered before it.
    fn on_nak(&mut self, cx: &mut QpCtx, now: Nanos, p: Psn, syndrome: AethSyndrome) {
        let qpn = self.qpn;
        match syndrome {
            AethSyndrome::RnrNak(t) => {
                tracing::debug!(
                    qpn = format_args!("{qpn:#x}"),
                    psn = %p,
                    wait_us = t.micros(),
                    "RNR NAK received"
                );
                if self.timers.is_armed(Timer::RnrWait) {
                    // Nothing is sent during the wait, so this answers a
                    // packet sent before it began (a probe's copy, a
                    // duplicate): the wait under way answers it already,
                    // and it must not spend another of `rnr_retry`.
                    self.drop_packet(cx, DropReason::PsnOutOfWindow);
                    return;
                }
                if self.comp.rnr_left == 0 {
                    self.fail_oldest_wqe(cx, WcStatus::RnrRetryExcErr);
                    return;
                }
                // rnr_retry 7 means retry for ever.
                if self.attr.rnr_retry != 7 {
                    self.comp.rnr_left -= 1;
                }
                self.req.rewind_to(&self.sq, p);
                let wait = now + u64::from(t.micros()) * 1000;
                self.timers.arm_at(Timer::RnrWait, wait);
                self.timers.stop(Timer::Retransmit);
                self.timers.stop(Timer::Probe);
                self.rtt.went_back(p);
                self.retire_finished(cx);
            }
            AethSyndrome::Nak(NakCode::PsnSequenceError) => {
                if self.comp.progressed {
                    // The responder got further than at the last go-back-N:
                    // this NAK is news, not a stale copy of the one that
                    // started it.
                    self.refill_retries();
                }
                self.retire_finished(cx);
                if self.req.sent_alone(p) {
                    // A hole reported and resent already: the responder's
                    // replay reached it before that resend arrived. Should
                    // both copies of the resend be lost, a probe resends
                    // it (the oldest unacknowledged packet by then) a few
                    // round trips on.
                    return;
                }
                let selective = self.resends_hole_alone(cx, p);
                self.retry_or_fail(cx, p, selective);
            }
            AethSyndrome::Nak(code) => {
                let status = match code {
                    NakCode::InvalidRequest => WcStatus::RemInvReqErr,
                    NakCode::RemoteAccessError => WcStatus::RemAccessErr,
                    _ => WcStatus::RemOpErr,
                };
                self.retire_finished(cx);
                self.fail_oldest_wqe(cx, status);
            }
            AethSyndrome::Ack { .. } => {
                cx.internal_error(qpn, "an ACK handled as a NAK");
            }
        }
    }

    /// A READ response packet: placed if it is the READ's next one. The
    /// PSN to go back to (an implied NAK), or `None` when the packet was
    /// dropped or failed the QP.
    fn on_read_response(&mut self, cx: &mut QpCtx, pkt: &Packet<&[u8]>) -> Option<Option<Psn>> {
        let p = pkt.bth().psn();
        let pmtu = self.pmtu();
        let Some(i) = self.sq.holding(p) else {
            // In [una, next_psn), so some WQE holds it.
            cx.internal_error(self.qpn, "a PSN in flight that no WQE holds");
            return None;
        };
        if self.sq[i].wr.opcode != SendOpcode::RdmaRead {
            self.drop_packet(cx, DropReason::OpcodeSequence);
            return None;
        }
        // The response proves everything before the READ executed.
        let first = self.sq[i].first_psn;
        let implied = self.comp.ack_upto(&mut self.sq, first - 1);
        let w = &self.sq[i];
        if p != w.first_psn + w.read_pkts || w.done.is_some() {
            // Not the READ's next response packet: a duplicate.
            self.drop_packet(cx, DropReason::PsnOutOfWindow);
            return Some(implied);
        }
        let off = w.read_pkts as usize * pmtu;
        let data = pkt.payload();
        let fits = off + data.len() <= w.len as usize;
        if !fits {
            self.fail_wqe(cx, i, WcStatus::BadRespErr);
            return None;
        }
        if cx
            .memory
            .scatter(self.init.pd, &w.wr.sg_list, off, data)
            .is_err()
        {
            self.fail_wqe(cx, i, WcStatus::LocProtErr);
            return None;
        }
        let w = &mut self.sq[i];
        w.read_pkts += 1;
        if pkt.opcode().ends_message() {
            w.done = Some(WcStatus::Success);
        }
        self.comp.advance_una(&self.sq, p);
        self.comp.progressed = true;
        Some(implied)
    }

    /// An atomic ACK: the original value is placed. As
    /// [`on_read_response`](Self::on_read_response).
    fn on_atomic_ack(&mut self, cx: &mut QpCtx, pkt: &Packet<&[u8]>) -> Option<Option<Psn>> {
        let p = pkt.bth().psn();
        let Some(i) = self.sq.holding(p) else {
            cx.internal_error(self.qpn, "a PSN in flight that no WQE holds");
            return None;
        };
        let w = &self.sq[i];
        if !w.wr.opcode.is_atomic() || w.done.is_some() {
            self.drop_packet(cx, DropReason::OpcodeSequence);
            return None;
        }
        let implied = self.comp.ack_upto(&mut self.sq, p - 1);
        // Keep the result even when an earlier READ/atomic is still
        // unanswered: the atomic executed exactly once, and going back for
        // the earlier one skips it.
        let orig = pkt.atomic_ack_eth().map(|a| a.orig).unwrap_or(0);
        let placed = cx
            .memory
            .scatter(self.init.pd, &self.sq[i].wr.sg_list, 0, &orig.to_ne_bytes())
            .is_ok();
        if !placed {
            self.fail_wqe(cx, i, WcStatus::LocProtErr);
            return None;
        }
        self.sq[i].done = Some(WcStatus::Success);
        self.comp.advance_una(&self.sq, p);
        self.comp.progressed = true;
        Some(implied)
    }

    /// Fire this QP's timers that are due at `now` (none due: nothing
    /// happens).
    pub(super) fn on_timeout(&mut self, cx: &mut QpCtx, now: Nanos) {
        for timer in Timer::ALL {
            if self.timers.take_due(timer, now) {
                self.on_timer(cx, timer, now);
            }
        }
    }

    /// Timer `timer` fired.
    fn on_timer(&mut self, cx: &mut QpCtx, timer: Timer, now: Nanos) {
        let timeout = self.ack_timeout();
        match timer {
            // The wait is over: requests go again, under the
            // retransmission timer.
            Timer::RnrWait => self.timers.arm_after(Timer::Retransmit, now, timeout),
            Timer::Retransmit => {
                cx.stats.timeouts += 1;
                self.counters.timeouts += 1;
                let una = self.comp.una;
                tracing::debug!(
                    qpn = format_args!("{:#x}", self.qpn),
                    una = %una,
                    retries_left = self.comp.retry_left,
                    "retransmission timeout"
                );
                self.timers.arm_after(Timer::Retransmit, now, timeout);
                if !self.go_back_n(cx, una, RetryCause::Timeout) {
                    self.fail_oldest_wqe(cx, WcStatus::RetryExcErr);
                    return;
                }
                self.arm_probe(now);
            }
            Timer::Probe => {
                if !self.comp.awaits_response(&self.sq, self.req.next_psn()) {
                    return;
                }
                let una = self.comp.una;
                tracing::debug!(
                    qpn = format_args!("{:#x}", self.qpn),
                    una = %una,
                    srtt_ns = self.rtt.srtt().unwrap_or(0),
                    "tail-loss probe"
                );
                let first = self.rtt.probes_sent() == 0;
                self.rtt.probed();
                cx.stats.probes += 1;
                self.counters.probes += 1;
                // Towards a responder that keeps what follows a gap, the
                // oldest unacknowledged packet alone: it fills the gap (the
                // rest is replayed and acknowledged) or, if the ACK was
                // what got lost, draws the ACK again.
                let sent_again = if self.peer_keeps_early(cx) && self.req.resend_one(&self.sq, una)
                {
                    una
                } else {
                    // The first probe of a silence resends only the highest
                    // PSN sent, asking for an ACK: a responder that has
                    // everything re-ACKs it all (a late ACK costs one
                    // packet, not a window), one that lacks a PSN NAKs the
                    // gap. If it NAKed the gap already it stays silent
                    // (that NAK may be the packet lost), so the next probe
                    // goes back to the oldest unacknowledged PSN, as a
                    // timeout would, without spending a retry; under the
                    // halved window the resend is small.
                    match first.then(|| self.req.resend_last(&self.sq)).flatten() {
                        Some(last) => last,
                        None => {
                            self.req.rewind_to(&self.sq, una);
                            let path = self.path_window(cx);
                            self.loss_window.lost(path);
                            una
                        }
                    }
                };
                self.rtt.went_back(sent_again);
                self.arm_probe(now);
            }
            // The request it waited for did not come: the ACK goes now.
            Timer::AckHold => {
                self.ack_hold.ran_out();
                self.counters.holds_missed += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::sq::started_from;
    use crate::engine::timer::Timers;
    use roxe_wire::AckTimeout;

    /// A send queue of messages of `npsn` PSNs each (the opcodes given),
    /// all started from PSN 100, and a completer that has heard nothing
    /// back; the PSN after them.
    fn started(msgs: &[(SendOpcode, u32)]) -> (SendQueue, Completer, Psn) {
        let (sq, next) = started_from(Psn::new(100), msgs);
        let mut c = Completer::new();
        c.reset_psn(Psn::new(100));
        (sq, c, next)
    }

    #[test]
    fn an_ack_finishes_every_send_it_covers_and_moves_una() {
        // 100..=102, 103, 104..=105
        let (mut sq, mut c, _) = started(&[
            (SendOpcode::Send, 3),
            (SendOpcode::RdmaWrite, 1),
            (SendOpcode::Send, 2),
        ]);
        // Inside the first message: nothing finishes, una moves.
        assert_eq!(c.ack_upto(&mut sq, Psn::new(101)), None);
        assert_eq!(c.una, Psn::new(102));
        assert!(sq[0].done.is_none());
        assert!(c.progressed);
        // Through the second: both finish, the third does not.
        assert_eq!(c.ack_upto(&mut sq, Psn::new(103)), None);
        assert_eq!(sq[0].done, Some(WcStatus::Success));
        assert_eq!(sq[1].done, Some(WcStatus::Success));
        assert!(sq[2].done.is_none());
        assert_eq!(c.una, Psn::new(104));
        // A stale ACK changes nothing.
        c.progressed = false;
        assert_eq!(c.ack_upto(&mut sq, Psn::new(101)), None);
        assert_eq!(c.una, Psn::new(104));
        assert!(!c.progressed);
    }

    #[test]
    fn an_ack_beyond_an_unanswered_read_implies_a_nak() {
        // SEND 100, READ 101..=102, SEND 103
        let (mut sq, mut c, _) = started(&[
            (SendOpcode::Send, 1),
            (SendOpcode::RdmaRead, 2),
            (SendOpcode::Send, 1),
        ]);
        // The READ still needs its response: resume from its first PSN,
        // una stops there, and the SEND behind it is acknowledged.
        assert_eq!(c.ack_upto(&mut sq, Psn::new(103)), Some(Psn::new(101)));
        assert_eq!(c.una, Psn::new(101));
        assert_eq!(sq[0].done, Some(WcStatus::Success));
        assert!(sq[1].done.is_none());
        assert_eq!(sq[2].done, Some(WcStatus::Success));
        // With one response packet placed, the resume point moves on.
        sq[1].read_pkts = 1;
        assert_eq!(c.ack_upto(&mut sq, Psn::new(103)), Some(Psn::new(102)));
    }

    #[test]
    fn advance_una_waits_for_an_earlier_read() {
        let (mut sq, mut c, next) = started(&[
            (SendOpcode::RdmaRead, 2),
            (SendOpcode::AtomicFetchAndAdd, 1),
        ]);
        assert_eq!(sq.reads_atomics_started(), 2);
        // The atomic (102) answered before the READ (100..=101).
        c.advance_una(&sq, Psn::new(102));
        assert_eq!(c.una, Psn::new(100));
        sq[0].read_pkts = 2;
        sq[0].done = Some(WcStatus::Success);
        c.advance_una(&sq, Psn::new(101));
        assert_eq!(c.una, Psn::new(102));
        sq[1].done = Some(WcStatus::Success);
        // Nothing unfinished: una is next_psn.
        c.catch_up_una(&sq, next);
        assert_eq!(c.una, next);
    }

    #[test]
    fn the_timer_runs_only_while_a_message_awaits_its_response() {
        let (mut sq, mut c, next) = started(&[(SendOpcode::Send, 1)]);
        assert!(c.awaits_response(&sq, next));
        let mut timers = Timers::default();
        timers.arm_after(Timer::Retransmit, 1_000, AckTimeout::new(14).unwrap());
        assert!(timers
            .deadline(Timer::Retransmit)
            .is_some_and(|d| d > 1_000));
        c.ack_upto(&mut sq, Psn::new(100));
        assert!(!c.awaits_response(&sq, next));
        // An infinite timeout stops the timer rather than arming it.
        timers.arm_after(Timer::Retransmit, 2_000, AckTimeout::INFINITE);
        assert_eq!(timers.next_deadline(), None);
    }
}
