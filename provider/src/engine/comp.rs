//! Completer (rxe's `rxe_comp.c`): ACKs, NAKs, READ responses and atomic
//! ACKs complete send WQEs, in order; the retransmission and RNR timers and
//! sequence NAKs drive go-back-N retries, and exhausted retries fail the
//! oldest WR and the QP.

use super::qp::{Qp, QpCtx};
use super::{DropReason, Nanos};
use crate::qp_attr::QpState;
use crate::types::WcStatus;
use crate::wr::{SendFlags, SendOpcode, WorkCompletion};
use roxe_wire::aeth::{AethSyndrome, NakCode};
use roxe_wire::{Operation, Packet, Psn};

impl Qp {
    /// Deliver, in order, the completions of finished WQEs at the front of
    /// the send queue.
    pub(super) fn retire(&mut self, cx: &mut QpCtx) {
        let qpn = self.qpn;
        let sig_all = self.init.sq_sig_all;
        let send_cq = self.init.send_cq;
        let r = &mut self.req;
        r.normalize_una();
        while r.sq.front().is_some_and(|w| w.done.is_some()) {
            let Some(w) = r.sq.pop_front() else { break };
            if r.cursor == 0 {
                // The cursor was inside the WQE that just went (a go-back-N
                // overtaken by the ACK that finishes it): the next WQE
                // starts at its first packet. A stale packet index here
                // once made the next message start beyond the 128-PSN
                // window with no timer armed, a silent stall.
                r.cursor_pkt = 0;
            }
            r.cursor = r.cursor.saturating_sub(1);
            if w.wr.opcode.is_read_or_atomic() && w.started {
                r.rd_atomic_inflight = r.rd_atomic_inflight.saturating_sub(1);
            }
            let status = w.done.unwrap_or(WcStatus::GeneralErr);
            if let Some(kind) = w.internal {
                r.internal = r.internal.saturating_sub(1);
                if let Some((cq, wc)) = super::tm::internal_done(r, kind, &w, status, qpn) {
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
        self.update_drain(cx);
    }

    /// Complete the oldest unfinished WQE with `status`, then fail the QP.
    fn fail_oldest(&mut self, cx: &mut QpCtx, status: WcStatus) {
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
        if let Some(w) = self.req.sq.iter_mut().find(|w| w.done.is_none()) {
            w.done = Some(status);
        }
        self.retire(cx);
        self.fail(cx);
    }

    /// Finish WQE `i` with an error, then fail the QP.
    fn fail_wqe(&mut self, cx: &mut QpCtx, i: usize, status: WcStatus) {
        self.req.sq[i].done = Some(status);
        self.retire(cx);
        self.fail(cx);
    }

    /// Go-back-N from `r`, spending one retry; false when none is left.
    /// A NAK-triggered retry while another is under way is ignored.
    fn retry_from(&mut self, r: Psn, timeout: bool) -> bool {
        let req = &mut self.req;
        if req.retry_started && !timeout {
            return true;
        }
        if req.retry_left == 0 {
            return false;
        }
        req.retry_left -= 1;
        req.retry_started = true;
        req.rewind_to(r);
        tracing::debug!(
            qpn = format_args!("{:#x}", self.qpn),
            psn = %r,
            retries_left = req.retry_left,
            cause = if timeout { "timeout" } else { "NAK" },
            "go-back-N"
        );
        true
    }

    /// Go-back-N from `r` after a NAK or an implied one, or fail with
    /// RETRY_EXC_ERR when no retry is left.
    fn retry_or_fail(&mut self, cx: &mut QpCtx, r: Psn) {
        if !self.retry_from(r, false) {
            self.fail_oldest(cx, WcStatus::RetryExcErr);
        }
    }

    /// A response (ACK, NAK, READ response, atomic ACK) to this QP.
    pub(super) fn on_response(&mut self, cx: &mut QpCtx, now: Nanos, pkt: &Packet<&[u8]>) {
        if !matches!(self.state(), QpState::Rts | QpState::Sqd) || !self.sends_reliably() {
            self.drop_packet(cx, DropReason::WrongState);
            return;
        }
        let p = pkt.bth().psn();
        // Only responses to PSNs in flight count: [una, next_psn).
        if p.is_before(self.req.una) || !p.is_before(self.req.next_psn) {
            self.drop_packet(cx, DropReason::PsnOutOfWindow);
            return;
        }
        self.req.progressed = false;
        let implied = match pkt.opcode().operation() {
            Operation::Acknowledge => match pkt.aeth().map(|a| a.syndrome) {
                Some(AethSyndrome::Ack { .. }) => self.req.ack_upto(p),
                Some(syndrome) => {
                    // A NAK acknowledges everything before its PSN.
                    let implied = self.req.ack_upto(p - 1);
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
        if self.req.progressed {
            // Forward progress refills the retry counter (IBA 9.7.6.1.3)
            // and restarts the retransmission timer.
            self.req.normalize_una();
            let attr = self.attr;
            self.req.reset_retries(&attr);
            self.req.retry_started = false;
            let timeout = self.ack_timeout();
            self.req.rearm(now, timeout);
        }
        self.retire(cx);
        if let Some(resume) = implied {
            // An ACK or response beyond a READ/atomic whose answer never came.
            self.retry_or_fail(cx, resume);
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
                if self.req.rnr_left == 0 {
                    self.fail_oldest(cx, WcStatus::RnrRetryExcErr);
                    return;
                }
                // rnr_retry 7 means retry for ever.
                if self.attr.rnr_retry != 7 {
                    self.req.rnr_left -= 1;
                }
                self.req.rewind_to(p);
                self.req.rnr_wait = Some(now + u64::from(t.micros()) * 1000);
                self.req.rto = None;
                self.retire(cx);
            }
            AethSyndrome::Nak(NakCode::PsnSequenceError) => {
                if self.req.progressed {
                    // The responder got further than at the last go-back-N:
                    // this NAK is news, not a stale copy of the one that
                    // started it.
                    let attr = self.attr;
                    self.req.reset_retries(&attr);
                    self.req.retry_started = false;
                }
                self.retire(cx);
                self.retry_or_fail(cx, p);
            }
            AethSyndrome::Nak(code) => {
                let status = match code {
                    NakCode::InvalidRequest => WcStatus::RemInvReqErr,
                    NakCode::RemoteAccessError => WcStatus::RemAccessErr,
                    _ => WcStatus::RemOpErr,
                };
                self.retire(cx);
                self.fail_oldest(cx, status);
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
        let Some(i) = self.req.sq.iter().position(|w| w.contains(p)) else {
            // In [una, next_psn), so some WQE holds it.
            cx.internal_error(self.qpn, "a PSN in flight that no WQE holds");
            return None;
        };
        if self.req.sq[i].wr.opcode != SendOpcode::RdmaRead {
            self.drop_packet(cx, DropReason::OpcodeSequence);
            return None;
        }
        // The response proves everything before the READ executed.
        let first = self.req.sq[i].first_psn;
        let implied = self.req.ack_upto(first - 1);
        let w = &self.req.sq[i];
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
        let r = &mut self.req;
        r.sq[i].read_pkts += 1;
        if pkt.opcode().ends_message() {
            r.sq[i].done = Some(WcStatus::Success);
        }
        r.advance_una(p);
        r.progressed = true;
        Some(implied)
    }

    /// An atomic ACK: the original value is placed. As
    /// [`on_read_response`](Self::on_read_response).
    fn on_atomic_ack(&mut self, cx: &mut QpCtx, pkt: &Packet<&[u8]>) -> Option<Option<Psn>> {
        let p = pkt.bth().psn();
        let Some(i) = self.req.sq.iter().position(|w| w.contains(p)) else {
            cx.internal_error(self.qpn, "a PSN in flight that no WQE holds");
            return None;
        };
        let w = &self.req.sq[i];
        if !w.wr.opcode.is_atomic() || w.done.is_some() {
            self.drop_packet(cx, DropReason::OpcodeSequence);
            return None;
        }
        let implied = self.req.ack_upto(p - 1);
        // Keep the result even when an earlier READ/atomic is still
        // unanswered: the atomic executed exactly once, and going back for
        // the earlier one skips it.
        let orig = pkt.atomic_ack_eth().map(|a| a.orig).unwrap_or(0);
        let placed = cx
            .memory
            .scatter(
                self.init.pd,
                &self.req.sq[i].wr.sg_list,
                0,
                &orig.to_ne_bytes(),
            )
            .is_ok();
        if !placed {
            self.fail_wqe(cx, i, WcStatus::LocProtErr);
            return None;
        }
        let r = &mut self.req;
        r.sq[i].done = Some(WcStatus::Success);
        r.advance_una(p);
        r.progressed = true;
        Some(implied)
    }

    /// The retransmission or RNR timer fired (or another timer of the QP:
    /// nothing due is a no-op).
    pub(super) fn on_timeout(&mut self, cx: &mut QpCtx, now: Nanos) {
        let timeout = self.ack_timeout();
        let r = &mut self.req;
        if r.rnr_wait.is_some_and(|d| d <= now) {
            r.rnr_wait = None;
            r.rto = timeout.nanos().map(|t| now + t);
        }
        if r.rto.is_some_and(|d| d <= now) {
            cx.stats.timeouts += 1;
            self.counters.timeouts += 1;
            tracing::debug!(
                qpn = format_args!("{:#x}", self.qpn),
                una = %r.una,
                retries_left = r.retry_left,
                "retransmission timeout"
            );
            let una = r.una;
            r.rto = timeout.nanos().map(|t| now + t);
            if !self.retry_from(una, true) {
                self.fail_oldest(cx, WcStatus::RetryExcErr);
            }
        }
    }
}
