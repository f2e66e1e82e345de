//! Requester and completer: send WQEs become packets (segmented by the path
//! MTU, PSNs assigned, at most 128 unacknowledged PSNs, at most
//! `max_rd_atomic` READs/atomics in flight, fences honoured); ACKs, NAKs,
//! READ responses and atomic ACKs complete them; the retransmission and RNR
//! timers drive go-back-N retries.

use super::{DropReason, Engine, Nanos, Transmit};
use crate::qp_attr::{QpAttr, QpState, QpType};
use crate::types::WcStatus;
use crate::wr::{SendFlags, SendOpcode, SendWr, WorkCompletion};
use roxe_wire::aeth::{AckTimeout, AethSyndrome, NakCode};
use roxe_wire::packet::emit_headers;
use roxe_wire::{
    AtomicEthRepr, BthRepr, DethRepr, ExtHeaders, Opcode, Packet, Psn, RethRepr, ICRC_LEN,
};
use std::collections::VecDeque;

/// Unacknowledged PSNs allowed in flight (rxe's RXE_MAX_UNACKED_PSNS).
const MAX_UNACKED_PSNS: i32 = 128;
/// Ask for an ACK at least this often inside long messages (rxe: 64).
const ACK_REQ_EVERY: u32 = 64;

/// A posted send WR and its progress.
#[derive(Debug, Clone)]
pub struct SendWqe {
    /// The request.
    pub wr: SendWr,
    /// Message length in bytes.
    pub len: u32,
    /// First PSN, once assigned.
    pub first_psn: Psn,
    /// PSNs the message consumes.
    pub npsn: u32,
    /// PSNs assigned (first packet sent at least once).
    pub started: bool,
    /// READ: response packets already placed (the resume point of a retry).
    pub read_pkts: u32,
    /// Final status, once known; WQEs retire in order.
    pub done: Option<WcStatus>,
}

impl SendWqe {
    fn last_psn(&self) -> Psn {
        self.first_psn + (self.npsn - 1)
    }
    fn contains(&self, p: Psn) -> bool {
        self.started && !p.is_before(self.first_psn) && !p.is_after(self.last_psn())
    }
}

/// Per-QP requester state.
#[derive(Debug)]
pub(crate) struct Requester {
    sq: VecDeque<SendWqe>,
    /// Index in `sq` of the WQE whose packet goes out next.
    cursor: usize,
    /// Packet index within that WQE (SEND/WRITE).
    cursor_pkt: u32,
    /// PSN the next new WQE starts at.
    next_psn: Psn,
    /// Oldest unacknowledged PSN.
    una: Psn,
    /// One past the highest PSN ever sent: anything below is a retransmission.
    high_psn: Psn,
    retry_left: u8,
    rnr_left: u8,
    rto: Option<Nanos>,
    rnr_wait: Option<Nanos>,
    rd_atomic_inflight: u32,
    since_ack_req: u32,
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
}

impl Requester {
    pub fn new() -> Self {
        Requester {
            sq: VecDeque::new(),
            cursor: 0,
            cursor_pkt: 0,
            next_psn: Psn::new(0),
            una: Psn::new(0),
            high_psn: Psn::new(0),
            retry_left: 7,
            rnr_left: 7,
            rto: None,
            rnr_wait: None,
            rd_atomic_inflight: 0,
            since_ack_req: 0,
            retry_started: false,
            progressed: false,
        }
    }

    pub fn reset_psn(&mut self, psn: Psn) {
        self.next_psn = psn;
        self.una = psn;
        self.high_psn = psn;
    }

    pub fn reset_retries(&mut self, attr: &QpAttr) {
        self.retry_left = attr.retry_cnt;
        self.rnr_left = attr.rnr_retry;
    }

    pub fn outstanding(&self) -> usize {
        self.sq.len()
    }

    /// A message has started (PSNs assigned) and is not finished.
    /// What `roxe stat` shows: (next new PSN, oldest unacknowledged PSN,
    /// send WQEs queued, retries left, RNR retries left).
    pub fn stat(&self) -> (u32, u32, usize, u8, u8) {
        (
            self.next_psn.value(),
            self.una.value(),
            self.sq.len(),
            self.retry_left,
            self.rnr_left,
        )
    }

    pub fn in_flight(&self) -> bool {
        self.sq.iter().any(|w| w.started && w.done.is_none())
    }

    pub fn post(&mut self, wr: SendWr, len: u32) {
        self.sq.push_back(SendWqe {
            wr,
            len,
            first_psn: Psn::new(0),
            npsn: 1,
            started: false,
            read_pkts: 0,
            done: None,
        });
    }

    /// Every WQE not yet retired (for flushing).
    pub fn flush(&mut self) -> Vec<SendWqe> {
        self.cursor = 0;
        self.cursor_pkt = 0;
        self.rto = None;
        self.rnr_wait = None;
        self.rd_atomic_inflight = 0;
        self.sq.drain(..).collect()
    }

    /// The liveness invariant: a message in flight always has a timer
    /// that will retransmit it or give up (retransmission or RNR), unless
    /// the QP's timeout is infinite. False means the QP would wait forever.
    pub fn timer_covers_flight(&self, timeout: AckTimeout) -> bool {
        timeout.nanos().is_none()
            || self.rto.is_some()
            || self.rnr_wait.is_some()
            || !self.in_flight()
    }

    /// Arm the retransmission timer (the liveness watchdog's repair).
    pub fn arm_retransmission(&mut self, now: Nanos, timeout: AckTimeout) {
        self.rto = timeout.nanos().map(|t| now + t);
    }

    pub fn next_deadline(&self) -> Option<Nanos> {
        match (self.rto, self.rnr_wait) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Go back to PSN `r`: the next packet sent is the one carrying it.
    fn rewind_to(&mut self, r: Psn) {
        if let Some(i) = self
            .sq
            .iter()
            .position(|w| w.contains(r) && w.done.is_none())
        {
            self.cursor = i;
            let w = &self.sq[i];
            self.cursor_pkt = if w.wr.opcode == SendOpcode::RdmaRead {
                0
            } else {
                r.distance(w.first_psn).unsigned_abs()
            };
        }
    }

    /// Mark every SEND/WRITE whose PSNs all lie at or before `p` as
    /// acknowledged: the responder executed everything up to `p`. A READ or
    /// atomic in that range still needs its own response; the first such is
    /// returned as the PSN to resume from (an implied NAK), and `una` stops
    /// there.
    fn ack_upto(&mut self, p: Psn) -> Option<Psn> {
        let mut implied = None;
        for w in self.sq.iter_mut() {
            if !w.started {
                break;
            }
            if w.done.is_some() {
                continue;
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
    fn advance_una(&mut self, p: Psn) {
        let blocked = self.sq.iter().any(|w| {
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
    /// ACK, so it is raised here rather than by the responses.
    fn normalize_una(&mut self) {
        match self.sq.iter().find(|w| w.started && w.done.is_none()) {
            Some(w) => {
                let floor = w.first_psn + w.read_pkts;
                if floor.is_after(self.una) {
                    self.una = floor;
                }
            }
            None => self.una = self.next_psn,
        }
    }

    fn rearm(&mut self, now: Nanos, timeout: AckTimeout) {
        self.rto = if self.una == self.next_psn
            || self.sq.iter().all(|w| w.done.is_some() || !w.started)
        {
            None
        } else {
            timeout.nanos().map(|t| now + t)
        };
    }
}

/// The BTH opcode for packet `i` of `n` of a SEND/WRITE on `transport`.
fn data_opcode(qp_type: QpType, op: SendOpcode, i: u32, n: u32) -> Opcode {
    use Opcode::*;
    let first = i == 0;
    let last = i + 1 == n;
    let rc = qp_type == QpType::Rc;
    match (op, first, last) {
        (SendOpcode::Send, true, true) => {
            if rc {
                RcSendOnly
            } else {
                UcSendOnly
            }
        }
        (SendOpcode::SendWithImm, true, true) => {
            if rc {
                RcSendOnlyImm
            } else {
                UcSendOnlyImm
            }
        }
        (SendOpcode::SendWithInv, true, true) => RcSendOnlyInv,
        (SendOpcode::Send | SendOpcode::SendWithImm | SendOpcode::SendWithInv, true, false) => {
            if rc {
                RcSendFirst
            } else {
                UcSendFirst
            }
        }
        (SendOpcode::Send | SendOpcode::SendWithImm | SendOpcode::SendWithInv, false, false) => {
            if rc {
                RcSendMiddle
            } else {
                UcSendMiddle
            }
        }
        (SendOpcode::Send, false, true) => {
            if rc {
                RcSendLast
            } else {
                UcSendLast
            }
        }
        (SendOpcode::SendWithImm, false, true) => {
            if rc {
                RcSendLastImm
            } else {
                UcSendLastImm
            }
        }
        (SendOpcode::SendWithInv, false, true) => RcSendLastInv,
        (SendOpcode::RdmaWrite, true, true) => {
            if rc {
                RcWriteOnly
            } else {
                UcWriteOnly
            }
        }
        (SendOpcode::RdmaWriteWithImm, true, true) => {
            if rc {
                RcWriteOnlyImm
            } else {
                UcWriteOnlyImm
            }
        }
        (SendOpcode::RdmaWrite | SendOpcode::RdmaWriteWithImm, true, false) => {
            if rc {
                RcWriteFirst
            } else {
                UcWriteFirst
            }
        }
        (SendOpcode::RdmaWrite | SendOpcode::RdmaWriteWithImm, false, false) => {
            if rc {
                RcWriteMiddle
            } else {
                UcWriteMiddle
            }
        }
        (SendOpcode::RdmaWrite, false, true) => {
            if rc {
                RcWriteLast
            } else {
                UcWriteLast
            }
        }
        (SendOpcode::RdmaWriteWithImm, false, true) => {
            if rc {
                RcWriteLastImm
            } else {
                UcWriteLastImm
            }
        }
        (SendOpcode::RdmaRead, ..) => RcReadRequest,
        (SendOpcode::AtomicCmpAndSwp, ..) => RcCompareSwap,
        (SendOpcode::AtomicFetchAndAdd, ..) => RcFetchAdd,
    }
}

fn packets_for(len: u32, pmtu: usize) -> u32 {
    (len as usize).div_ceil(pmtu).max(1) as u32
}

impl Engine {
    /// The next request packet of QP `qpn`, if it may send one now.
    pub(super) fn requester_transmit(
        &mut self,
        qpn: u32,
        now: Nanos,
        buf: &mut [u8],
    ) -> Option<Transmit> {
        let Engine {
            qps, memory, stats, ..
        } = self;
        let q = qps.get_mut(&qpn)?;
        // SQD: messages already started finish (retransmissions included);
        // no new one starts.
        let draining = q.state == QpState::Sqd;
        if !(q.state == QpState::Rts || draining) || q.req.rnr_wait.is_some() {
            return None;
        }
        let qp_type = q.init.qp_type;
        let pmtu = q.pmtu();
        let max_rd = u32::from(q.attr.max_rd_atomic.max(1));
        let timeout = AckTimeout::new(q.attr.timeout).unwrap_or(AckTimeout::INFINITE);
        let r = &mut q.req;
        // Skip WQEs already finished (UC/UD complete when sent).
        while r.sq.get(r.cursor).is_some_and(|w| w.done.is_some()) {
            r.cursor += 1;
            r.cursor_pkt = 0;
        }
        let idx = r.cursor;
        let w = r.sq.get(idx)?;
        if !w.started {
            if draining {
                return None;
            }
            let earlier_rd =
                r.sq.iter()
                    .take(idx)
                    .any(|e| e.wr.opcode.is_read_or_atomic() && e.done.is_none());
            if w.wr.flags.contains(SendFlags::FENCE) && earlier_rd {
                return None;
            }
            if w.wr.opcode.is_read_or_atomic() && r.rd_atomic_inflight >= max_rd {
                return None;
            }
            if qp_type == QpType::Rc && r.una.distance(r.next_psn) >= MAX_UNACKED_PSNS {
                // The window is full: PSNs are assigned when the first
                // packet can go, so a started message always has one out.
                return None;
            }
            debug_assert_eq!(r.cursor_pkt, 0, "a new message starts at its first packet");
            r.cursor_pkt = 0;
            let npsn = match w.wr.opcode {
                o if o.is_atomic() => 1,
                _ if qp_type == QpType::Ud => 1,
                _ => packets_for(w.len, pmtu),
            };
            let first = r.next_psn;
            r.next_psn += npsn;
            let w = &mut r.sq[idx];
            w.first_psn = first;
            w.npsn = npsn;
            w.started = true;
            if w.wr.opcode.is_read_or_atomic() {
                r.rd_atomic_inflight += 1;
            }
        }
        let w = &r.sq[idx];
        let op = w.wr.opcode;
        let (psn, pkt_index) = if op == SendOpcode::RdmaRead {
            (w.first_psn + w.read_pkts, w.read_pkts)
        } else {
            (w.first_psn + r.cursor_pkt, r.cursor_pkt)
        };
        if qp_type == QpType::Rc && r.una.distance(psn) >= MAX_UNACKED_PSNS {
            return None;
        }
        let n = w.npsn;
        let last_pkt = op.is_read_or_atomic() || pkt_index + 1 >= n;
        let (opcode, dest_qp, dst) = match qp_type {
            QpType::Ud => {
                let ud = w.wr.ud?;
                let o = if op == SendOpcode::SendWithImm {
                    Opcode::UdSendOnlyImm
                } else {
                    Opcode::UdSendOnly
                };
                (o, ud.remote_qpn, ud.addr)
            }
            _ => (
                data_opcode(qp_type, op, pkt_index, n),
                q.attr.dest_qp_num,
                q.peer?,
            ),
        };
        let mut ext = ExtHeaders::NONE;
        let h = opcode.headers();
        use roxe_wire::HeaderSet as H;
        let offset = pkt_index as u64 * pmtu as u64;
        if h.contains(H::RETH) {
            let (va, dma_len) = if op == SendOpcode::RdmaRead {
                (w.wr.remote_addr.wrapping_add(offset), w.len - offset as u32)
            } else {
                (w.wr.remote_addr, w.len)
            };
            ext.reth = Some(RethRepr {
                va,
                rkey: w.wr.rkey,
                dma_len,
            });
        }
        if h.contains(H::IMM_DT) {
            ext.imm_dt = Some(w.wr.imm_data);
        }
        if h.contains(H::IETH) {
            ext.ieth = Some(w.wr.invalidate_rkey);
        }
        if h.contains(H::ATOMIC_ETH) {
            let (swap_add, compare) = match op {
                SendOpcode::AtomicCmpAndSwp => (w.wr.swap, w.wr.compare_add),
                _ => (w.wr.compare_add, 0),
            };
            ext.atomic_eth = Some(AtomicEthRepr {
                va: w.wr.remote_addr,
                rkey: w.wr.rkey,
                swap_add,
                compare,
            });
        }
        if h.contains(H::DETH) {
            let ud = w.wr.ud?;
            // A Q_Key with the high bit set means: use the QP's own (IBA 10.2.5).
            let qkey = if ud.remote_qkey & 0x8000_0000 != 0 {
                q.attr.qkey
            } else {
                ud.remote_qkey
            };
            ext.deth = Some(DethRepr {
                qkey,
                src_qp: qpn,
                reserved: 0,
            });
        }
        let payload_len = if opcode.allows_payload() && !op.is_read_or_atomic() {
            (w.len as u64 - offset).min(pmtu as u64) as usize
        } else {
            0
        };
        let ends = last_pkt;
        r.since_ack_req += 1;
        let ack_req = qp_type == QpType::Rc && (ends || r.since_ack_req >= ACK_REQ_EVERY);
        if ack_req {
            r.since_ack_req = 0;
        }
        let solicited = ends
            && w.wr.flags.contains(SendFlags::SOLICITED)
            && matches!(
                op,
                SendOpcode::Send
                    | SendOpcode::SendWithImm
                    | SendOpcode::SendWithInv
                    | SendOpcode::RdmaWriteWithImm
            );
        let bth = BthRepr {
            ack_req,
            solicited,
            ..BthRepr::new(opcode, dest_qp, psn)
        };
        let (hl, total) = emit_headers(&bth, &ext, payload_len, buf).ok()?;
        let body = &mut buf[hl..hl + payload_len];
        let gathered = match &w.wr.inline_data {
            Some(d) if w.wr.flags.contains(SendFlags::INLINE) => {
                let o = offset as usize;
                d.get(o..o + payload_len)
                    .map(|s| body.copy_from_slice(s))
                    .is_some()
            }
            _ => {
                payload_len == 0
                    || memory
                        .gather(q.init.pd, &w.wr.sg_list, offset as usize, body)
                        .is_ok()
            }
        };
        if !gathered {
            // A bad lkey or range in the local SGEs: local protection error.
            r.sq[idx].done = Some(WcStatus::LocProtErr);
            self.retire(qpn);
            self.fail_qp(qpn);
            return None;
        }
        // Advance the cursor.
        if last_pkt {
            r.cursor += 1;
            r.cursor_pkt = 0;
        } else {
            r.cursor_pkt += 1;
        }
        if psn.is_before(r.high_psn) {
            stats.tx_retransmits += 1;
        } else {
            r.high_psn = psn.next();
        }
        if qp_type == QpType::Rc {
            if r.rto.is_none() {
                r.rto = timeout.nanos().map(|t| now + t);
            }
        } else if last_pkt {
            // Unreliable: complete as soon as the last packet is handed over.
            r.sq[idx].done = Some(WcStatus::Success);
            self.retire(qpn);
        }
        let src_port = self.qps.get(&qpn).map(|q| q.src_port()).unwrap_or(0xC000);
        debug_assert!(total > ICRC_LEN);
        Some(Transmit {
            dst,
            src_port,
            len: total,
        })
    }

    /// Deliver, in order, the completions of finished WQEs at the front of
    /// the send queue.
    pub(super) fn retire(&mut self, qpn: u32) {
        // Runs on every ACK: completions go straight into the CQ (disjoint
        // fields), and only an overflow needs the whole engine afterwards.
        let mut overflowed = None;
        let Engine {
            qps, cqs, events, ..
        } = self;
        if let Some(q) = qps.get_mut(&qpn) {
            let sig_all = q.init.sq_sig_all;
            q.req.normalize_una();
            while q.req.sq.front().is_some_and(|w| w.done.is_some()) {
                let Some(w) = q.req.sq.pop_front() else { break };
                if q.req.cursor == 0 {
                    // The cursor was inside the WQE that just went (a
                    // go-back-N overtaken by the ACK that finishes it): the
                    // next WQE starts at its first packet. A stale packet
                    // index here once made the next message start beyond
                    // the 128-PSN window with no timer armed, a silent stall.
                    q.req.cursor_pkt = 0;
                }
                q.req.cursor = q.req.cursor.saturating_sub(1);
                if w.wr.opcode.is_read_or_atomic() && w.started {
                    q.req.rd_atomic_inflight = q.req.rd_atomic_inflight.saturating_sub(1);
                }
                let status = w.done.unwrap_or(WcStatus::GeneralErr);
                if status != WcStatus::Success
                    || sig_all
                    || w.wr.flags.contains(SendFlags::SIGNALED)
                {
                    let mut wc =
                        WorkCompletion::new(w.wr.wr_id, status, w.wr.opcode.wc_opcode(), qpn);
                    wc.byte_len = if status == WcStatus::Success {
                        w.len
                    } else {
                        0
                    };
                    let cq = q.init.send_cq;
                    let pushed = cqs.get_mut(&cq.0).is_some_and(|c| c.push(wc, false));
                    if !pushed {
                        overflowed = Some(cq);
                    }
                }
            }
            if q.update_drain() {
                events.push(super::QpEvent {
                    qpn,
                    event_type: super::QpEvent::SQ_DRAINED,
                });
            }
        }
        if let Some(cq) = overflowed {
            self.cq_overflowed(cq);
        }
    }

    /// The QP failed: report it and flush the rest.
    pub(super) fn fail_qp(&mut self, qpn: u32) {
        if let Some(q) = self.qps.get_mut(&qpn) {
            if q.state == QpState::Err {
                return;
            }
            q.state = QpState::Err;
        }
        self.enter_error(qpn);
    }

    /// Complete the oldest unfinished WQE with `status`, then fail the QP.
    fn fail_oldest(&mut self, qpn: u32, status: WcStatus) {
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
        if let Some(q) = self.qps.get_mut(&qpn) {
            if let Some(w) = q.req.sq.iter_mut().find(|w| w.done.is_none()) {
                w.done = Some(status);
            }
        }
        self.retire(qpn);
        self.fail_qp(qpn);
    }

    /// Go-back-N from `r`, spending one retry; false when none is left.
    /// A NAK-triggered retry while another is under way is ignored.
    fn retry_from(&mut self, qpn: u32, r: Psn, timeout: bool) -> bool {
        let Some(q) = self.qps.get_mut(&qpn) else {
            return false;
        };
        if q.req.retry_started && !timeout {
            return true;
        }
        if q.req.retry_left == 0 {
            return false;
        }
        q.req.retry_left -= 1;
        q.req.retry_started = true;
        q.req.rewind_to(r);
        tracing::debug!(
            qpn = format_args!("{qpn:#x}"),
            psn = %r,
            retries_left = q.req.retry_left,
            cause = if timeout { "timeout" } else { "NAK" },
            "go-back-N"
        );
        true
    }

    /// A response (ACK, NAK, READ response, atomic ACK) for QP `qpn`.
    pub(super) fn completer_receive(&mut self, qpn: u32, now: Nanos, pkt: &Packet<&[u8]>) {
        let Some(q) = self.qps.get_mut(&qpn) else {
            return;
        };
        if !matches!(q.state, QpState::Rts | QpState::Sqd) || q.init.qp_type != QpType::Rc {
            q.drops.add(DropReason::WrongState);
            self.stats.count_drop(DropReason::WrongState, Some(qpn));
            return;
        }
        let timeout = AckTimeout::new(q.attr.timeout).unwrap_or(AckTimeout::INFINITE);
        let rnr_retry_infinite = q.attr.rnr_retry == 7;
        let p = pkt.bth().psn();
        let pmtu = q.pmtu();
        let pd = q.init.pd;
        let r = &mut q.req;
        // Only responses to PSNs in flight count: [una, next_psn).
        if p.is_before(r.una) || !p.is_before(r.next_psn) {
            q.drops.add(DropReason::PsnOutOfWindow);
            self.stats.count_drop(DropReason::PsnOutOfWindow, Some(qpn));
            return;
        }
        let aeth = pkt.aeth();
        r.progressed = false;
        let mut implied = None;
        let mut progress = false;
        match pkt.opcode() {
            Opcode::RcAcknowledge => match aeth.map(|a| a.syndrome) {
                Some(AethSyndrome::Ack { .. }) => {
                    implied = r.ack_upto(p);
                }
                Some(AethSyndrome::RnrNak(t)) => {
                    implied = r.ack_upto(p - 1);
                    self.stats.rnr_naks_received += 1;
                    tracing::debug!(
                        qpn = format_args!("{qpn:#x}"),
                        psn = %p,
                        wait_us = t.micros(),
                        "RNR NAK received"
                    );
                    if implied.is_none() {
                        if r.rnr_left == 0 {
                            self.fail_oldest(qpn, WcStatus::RnrRetryExcErr);
                            return;
                        }
                        if !rnr_retry_infinite {
                            r.rnr_left -= 1;
                        }
                        r.rewind_to(p);
                        r.rnr_wait = Some(now + u64::from(t.micros()) * 1000);
                        r.rto = None;
                        self.retire(qpn);
                        return;
                    }
                }
                Some(AethSyndrome::Nak(NakCode::PsnSequenceError)) => {
                    implied = r.ack_upto(p - 1);
                    if implied.is_none() {
                        if r.progressed {
                            // The responder got further than at the last
                            // go-back-N: this NAK is news, not a stale copy
                            // of the one that started it.
                            let attr = q.attr;
                            r.reset_retries(&attr);
                            r.retry_started = false;
                        }
                        self.retire(qpn);
                        if !self.retry_from(qpn, p, false) {
                            self.fail_oldest(qpn, WcStatus::RetryExcErr);
                        }
                        return;
                    }
                }
                Some(AethSyndrome::Nak(code)) => {
                    implied = r.ack_upto(p - 1);
                    if implied.is_none() {
                        let status = match code {
                            NakCode::InvalidRequest => WcStatus::RemInvReqErr,
                            NakCode::RemoteAccessError => WcStatus::RemAccessErr,
                            _ => WcStatus::RemOpErr,
                        };
                        self.retire(qpn);
                        self.fail_oldest(qpn, status);
                        return;
                    }
                }
                None => {}
            },
            Opcode::RcReadResponseFirst
            | Opcode::RcReadResponseMiddle
            | Opcode::RcReadResponseLast
            | Opcode::RcReadResponseOnly => {
                let Some(i) = r.sq.iter().position(|w| w.contains(p)) else {
                    // In [una, next_psn), so some WQE holds it.
                    q.drops.add(DropReason::PsnOutOfWindow);
                    self.stats.count_drop(DropReason::PsnOutOfWindow, Some(qpn));
                    return;
                };
                if r.sq[i].wr.opcode != SendOpcode::RdmaRead {
                    q.drops.add(DropReason::OpcodeSequence);
                    self.stats.count_drop(DropReason::OpcodeSequence, Some(qpn));
                    return;
                }
                let first = r.sq[i].first_psn;
                // The response proves everything before the READ executed.
                implied = r.ack_upto(first - 1);
                let w = &r.sq[i];
                if p == w.first_psn + w.read_pkts && w.done.is_none() {
                    let off = w.read_pkts as usize * pmtu;
                    let data = pkt.payload();
                    let ends = matches!(
                        pkt.opcode(),
                        Opcode::RcReadResponseLast | Opcode::RcReadResponseOnly
                    );
                    let fits = off + data.len() <= w.len as usize;
                    if !fits || self.memory.scatter(pd, &w.wr.sg_list, off, data).is_err() {
                        let status = if fits {
                            WcStatus::LocProtErr
                        } else {
                            WcStatus::BadRespErr
                        };
                        if let Some(q) = self.qps.get_mut(&qpn) {
                            q.req.sq[i].done = Some(status);
                        }
                        self.retire(qpn);
                        self.fail_qp(qpn);
                        return;
                    }
                    let Some(q) = self.qps.get_mut(&qpn) else {
                        return;
                    };
                    let r = &mut q.req;
                    r.sq[i].read_pkts += 1;
                    if ends {
                        r.sq[i].done = Some(WcStatus::Success);
                    }
                    r.advance_una(p);
                    progress = true;
                } else {
                    // Not the READ's next response packet: a duplicate.
                    self.drop_on(DropReason::PsnOutOfWindow, qpn);
                }
            }
            Opcode::RcAtomicAcknowledge => {
                let Some(i) = r.sq.iter().position(|w| w.contains(p)) else {
                    q.drops.add(DropReason::PsnOutOfWindow);
                    self.stats.count_drop(DropReason::PsnOutOfWindow, Some(qpn));
                    return;
                };
                if !r.sq[i].wr.opcode.is_atomic() || r.sq[i].done.is_some() {
                    q.drops.add(DropReason::OpcodeSequence);
                    self.stats.count_drop(DropReason::OpcodeSequence, Some(qpn));
                    return;
                }
                implied = r.ack_upto(p - 1);
                // Keep the result even when an earlier READ/atomic is still
                // unanswered: the atomic executed exactly once, and going
                // back for the earlier one skips it.
                let orig = pkt.atomic_ack_eth().map(|a| a.orig).unwrap_or(0);
                let placed = self
                    .memory
                    .scatter(pd, &r.sq[i].wr.sg_list, 0, &orig.to_ne_bytes())
                    .is_ok();
                let Some(q) = self.qps.get_mut(&qpn) else {
                    return;
                };
                let r = &mut q.req;
                r.sq[i].done = Some(if placed {
                    WcStatus::Success
                } else {
                    WcStatus::LocProtErr
                });
                if !placed {
                    self.retire(qpn);
                    self.fail_qp(qpn);
                    return;
                }
                r.advance_una(p);
                progress = true;
            }
            _ => {
                q.drops.add(DropReason::OpcodeSequence);
                self.stats.count_drop(DropReason::OpcodeSequence, Some(qpn));
                return;
            }
        }
        let progress = progress || self.qps.get(&qpn).is_some_and(|q| q.req.progressed);
        if progress {
            if let Some(q) = self.qps.get_mut(&qpn) {
                q.req.normalize_una();
                let attr = q.attr;
                q.req.reset_retries(&attr);
                q.req.retry_started = false;
                q.req.rearm(now, timeout);
            }
        }
        self.retire(qpn);
        if let Some(resume) = implied {
            // An ACK or response beyond a READ/atomic whose answer never came.
            if !self.retry_from(qpn, resume, false) {
                self.fail_oldest(qpn, WcStatus::RetryExcErr);
            }
        }
    }

    /// The retransmission or RNR timer of QP `qpn` fired.
    pub(super) fn requester_timeout(&mut self, qpn: u32, now: Nanos) {
        let Some(q) = self.qps.get_mut(&qpn) else {
            return;
        };
        let timeout = AckTimeout::new(q.attr.timeout).unwrap_or(AckTimeout::INFINITE);
        let r = &mut q.req;
        if r.rnr_wait.is_some_and(|d| d <= now) {
            r.rnr_wait = None;
            r.rto = timeout.nanos().map(|t| now + t);
        }
        if r.rto.is_some_and(|d| d <= now) {
            self.stats.timeouts += 1;
            tracing::debug!(
                qpn = format_args!("{qpn:#x}"),
                una = %r.una,
                retries_left = r.retry_left,
                "retransmission timeout"
            );
            let una = r.una;
            r.rto = timeout.nanos().map(|t| now + t);
            if !self.retry_from(qpn, una, true) {
                self.fail_oldest(qpn, WcStatus::RetryExcErr);
            }
        }
    }
}
