//! Requester (rxe's `rxe_req.c`): send WQEs become packets (segmented by
//! the path MTU, PSNs assigned, at most 128 unacknowledged PSNs, at most
//! `max_rd_atomic` READs/atomics in flight, fences honoured).
//!
//! The requester owns where the next packet comes from and which PSNs are
//! assigned ([`Requester`]); the completer (`comp.rs`) owns how far the
//! responses have come. They share the send queue (`sq.rs`) and the QP's
//! timers (`timer.rs`), and otherwise talk only through the few methods
//! each offers the other (listed at the top of `comp.rs`).

mod packet;

use super::qp::{Qp, QpCtx};
use super::sq::SendQueue;
use super::timer::Timer;
use super::{HoldNew, Nanos, Transmit};
use crate::memory::RemoteQp;
use crate::qp_attr::{QpState, QpType};
use crate::types::WcStatus;
use crate::wr::{SendFlags, SendOpcode};
use roxe_wire::packet::emit_headers;
use roxe_wire::{BthRepr, ExtHeaders, Psn, ICRC_LEN};
use std::collections::VecDeque;
use std::net::IpAddr;

/// Unacknowledged PSNs allowed in flight towards a peer on another host:
/// rxe's RXE_MAX_UNACKED_PSNS. Without congestion control a larger burst
/// overflows the queues of a real path (a tap's 1,000 packets): at 1,024,
/// 64 KiB READs from rxe in an rxe-peer guest lost responses, and each
/// go-back-N resent the same burst until RETRY_EXC_ERR.
const MAX_UNACKED_PSNS: i32 = 128;
// Towards a peer on this host's loopback the window is
// `EngineConfig::loopback_window` (`MAX_LOOPBACK_WINDOW` says why wider).

/// Ask for an ACK at least this often inside long messages (rxe: 64).
const ACK_REQ_EVERY: u32 = 64;

/// Per-QP requester state (rxe's `rxe_req_info`): the send queue's cursor
/// and the PSNs handed out.
#[derive(Debug)]
pub(crate) struct Requester {
    /// Index in the send queue of the WQE whose packet goes out next
    /// (rxe's `wqe_index`).
    wqe_index: usize,
    /// Packet index within that WQE (SEND/WRITE; a READ resumes from its
    /// `read_pkts`).
    pkt_index: u32,
    /// PSN the next new WQE starts at.
    next_psn: Psn,
    /// One past the highest PSN ever sent: anything below is a
    /// retransmission.
    first_unsent_psn: Psn,
    /// Packets sent since the last one that asked for an ACK (rxe's
    /// `noack_pkts`).
    pkts_since_ack_req: u32,
    /// The next packet asks for an ACK whatever its place (a probe's).
    ack_req_next: bool,
    /// Where the cursor goes back to once the packet under it has left
    /// (`resend_one`).
    resume: Option<(usize, u32)>,
    /// The packet resent alone goes out once more before the cursor
    /// resumes (`resend_one`).
    resend_twice: bool,
    /// PSNs a roxe responder reported missing while a packet was being
    /// resent alone (`resend_hole`): each is resent alone, in turn, before
    /// the cursor resumes.
    holes: VecDeque<Psn>,
    /// The latest PSNs that left resent alone (`sent_alone`).
    sent_alone: VecDeque<Psn>,
}

/// Most reported holes waiting for their resend; a report beyond them is
/// left to the sequence NAK that follows once the gap before it fills.
const MAX_QUEUED_HOLES: usize = 64;

impl Requester {
    pub fn new() -> Self {
        Requester {
            wqe_index: 0,
            pkt_index: 0,
            next_psn: Psn::new(0),
            first_unsent_psn: Psn::new(0),
            pkts_since_ack_req: 0,
            ack_req_next: false,
            resume: None,
            resend_twice: false,
            holes: VecDeque::new(),
            sent_alone: VecDeque::new(),
        }
    }

    /// `sq_psn` was set: the next new message starts at `psn`.
    pub fn reset_psn(&mut self, psn: Psn) {
        self.next_psn = psn;
        self.first_unsent_psn = psn;
    }

    /// The send queue was flushed: the cursor goes back to its start.
    pub fn flush(&mut self) {
        self.wqe_index = 0;
        self.pkt_index = 0;
        self.resume = None;
        self.resend_twice = false;
        self.holes.clear();
    }

    /// For the completer: one past the last PSN assigned. Responses at
    /// or beyond it answer nothing sent.
    #[inline]
    pub fn next_psn(&self) -> Psn {
        self.next_psn
    }

    /// For the completer: go back to PSN `r` (go-back-N). The next packet
    /// sent is the one carrying it. False (nothing moved) when no
    /// unfinished WQE holds `r`.
    pub fn rewind_to(&mut self, sq: &SendQueue, r: Psn) -> bool {
        self.resume = None;
        self.resend_twice = false;
        self.holes.clear();
        self.move_to(sq, r)
    }

    /// For the completer, after a sequence NAK from a responder that kept
    /// what followed the gap (`EngineConfig::keep_early`): the packet
    /// carrying PSN `r` leaves again, asking for an ACK, and the cursor
    /// then goes on where it was. While another packet is being resent
    /// alone, `r` follows it (the oldest first). False (nothing moved)
    /// when no unfinished WQE holds `r`.
    pub fn resend_one(&mut self, sq: &SendQueue, r: Psn) -> bool {
        self.resend_alone(sq, r).is_some()
    }

    /// For the completer, on a hole report (`resp::HOLE_REPORT_CREDITS`):
    /// the packet carrying `r` is resent alone, now or after the packets
    /// being resent alone already. False when it will not be (no
    /// unfinished WQE holds it, it waits already, or too many wait).
    pub fn resend_hole(&mut self, sq: &SendQueue, r: Psn) -> bool {
        self.resend_alone(sq, r) == Some(true)
    }

    /// [`resend_one`](Self::resend_one)'s work: `None` when no unfinished
    /// WQE holds `r`; else whether `r` was sent for or queued (not when it
    /// waits already or the queue is full).
    fn resend_alone(&mut self, sq: &SendQueue, r: Psn) -> Option<bool> {
        if self.resume.is_some() {
            // Another packet is being resent alone: this one follows it,
            // and the cursor still goes back to where it was before both.
            if !sq.iter().any(|w| w.holds_psn(r) && w.done.is_none()) {
                return None;
            }
            if self.holes.contains(&r) || self.holes.len() >= MAX_QUEUED_HOLES {
                return Some(false);
            }
            // The oldest missing packet first: the responder's in-order
            // progress waits for it.
            match self.holes.front() {
                Some(f) if r.is_before(*f) => self.holes.push_front(r),
                _ => self.holes.push_back(r),
            }
            return Some(true);
        }
        let back = (self.wqe_index, self.pkt_index);
        if !self.move_to(sq, r) {
            return None;
        }
        self.resume = Some(back);
        self.ack_req_next = true;
        // A lost copy would be noticed only by a probe, milliseconds
        // later (the responder NAKs a gap once and keeps the rest
        // silently); two copies make that one loss in 10,000 at 1%.
        self.resend_twice = true;
        Some(true)
    }

    /// Whether the packet under the cursor is one resent alone: it goes
    /// whatever the window (it was inside it when first sent, and the
    /// oldest missing packet may wait behind it).
    #[inline]
    pub fn resending_alone(&self) -> bool {
        self.resume.is_some()
    }

    /// Whether the packet carrying `p` left resent alone lately (one of
    /// the last [`MAX_QUEUED_HOLES`] so resent) and is not acknowledged.
    pub fn sent_alone(&self, p: Psn) -> bool {
        self.sent_alone.contains(&p)
    }

    /// For the completer: everything before `una` is acknowledged.
    pub fn acked_before(&mut self, una: Psn) {
        if !self.sent_alone.is_empty() {
            self.sent_alone.retain(|p| !p.is_before(una));
        }
    }

    /// One past the highest PSN ever sent.
    pub fn first_unsent(&self) -> Psn {
        self.first_unsent_psn
    }

    fn move_to(&mut self, sq: &SendQueue, r: Psn) -> bool {
        let found = sq.iter().position(|w| w.holds_psn(r) && w.done.is_none());
        if let Some(i) = found {
            self.wqe_index = i;
            let w = &sq[i];
            self.pkt_index = if w.wr.opcode == SendOpcode::RdmaRead {
                0
            } else {
                r.distance(w.first_psn).unsigned_abs()
            };
        }
        found.is_some()
    }

    /// For the completer's first tail-loss probe: the cursor goes back to
    /// the highest PSN sent, which leaves again asking for an ACK, and the
    /// cursor then goes on where it was; that PSN. None (nothing moved)
    /// unless the cursor is at the frontier of what was ever sent (not
    /// inside a go-back) and a WQE still holds that PSN.
    pub fn resend_last(&mut self, sq: &SendQueue) -> Option<Psn> {
        let at_frontier = match sq.get(self.wqe_index) {
            Some(w) if w.started && w.done.is_none() => {
                let index = if w.wr.opcode == SendOpcode::RdmaRead {
                    w.read_pkts
                } else {
                    self.pkt_index
                };
                !(w.first_psn + index).is_before(self.first_unsent_psn)
            }
            _ => true,
        };
        let last = self.first_unsent_psn - 1;
        if !at_frontier || self.resume.is_some() || !self.rewind_to(sq, last) {
            return None;
        }
        self.ack_req_next = true;
        Some(last)
    }

    /// For the completer: the send queue's oldest WQE was retired, and
    /// the cursor moves down with the queue.
    #[inline]
    pub fn front_retired(&mut self) {
        if self.wqe_index == 0 {
            // The cursor was inside the WQE that just went (a go-back-N
            // overtaken by the ACK that finishes it): the next WQE
            // starts at its first packet. A stale packet index here
            // once made the next message start beyond the 128-PSN
            // window with no timer armed, a silent stall.
            self.pkt_index = 0;
        }
        let cursor_retired = self.wqe_index == 0;
        self.wqe_index = self.wqe_index.saturating_sub(1);
        if let Some((w, k)) = self.resume.as_mut() {
            if *w == 0 {
                *k = 0;
            }
            *w = w.saturating_sub(1);
        }
        if cursor_retired {
            // A packet to resend alone was in that WQE: acknowledged
            // before it left, it goes nowhere.
            self.resume_cursor();
        }
    }

    /// Back to where the cursor was before `resend_one`, if it moved.
    fn resume_cursor(&mut self) {
        self.resend_twice = false;
        self.holes.clear();
        if let Some((w, k)) = self.resume.take() {
            self.wqe_index = w;
            self.pkt_index = k;
        }
    }

    /// Move the cursor past finished WQEs (local operations done, UC/UD
    /// messages completed when sent); the index of the WQE it is on, if
    /// the queue has one there.
    #[inline]
    fn skip_finished(&mut self, sq: &SendQueue) -> Option<usize> {
        while sq.get(self.wqe_index).is_some_and(|w| w.done.is_some()) {
            self.step_to_next_wqe();
        }
        sq.get(self.wqe_index).map(|_| self.wqe_index)
    }

    /// The cursor moves to the next WQE's first packet.
    #[inline]
    fn step_to_next_wqe(&mut self) {
        self.wqe_index += 1;
        self.pkt_index = 0;
    }

    /// Hand out `npsn` PSNs to the message under the cursor, which starts
    /// at its first packet; the first of them.
    #[inline]
    fn assign_psns(&mut self, npsn: u32) -> Psn {
        debug_assert_eq!(
            self.pkt_index, 0,
            "a new message starts at its first packet"
        );
        self.pkt_index = 0;
        let first = self.next_psn;
        self.next_psn += npsn;
        first
    }

    /// Whether the next packet asks for an ACK: a reliable message's last
    /// one, and one in every `ACK_REQ_EVERY` inside long messages.
    #[inline]
    fn asks_for_ack(&mut self, reliable: bool, last: bool) -> bool {
        self.pkts_since_ack_req += 1;
        let forced = std::mem::take(&mut self.ack_req_next);
        let ack_req = reliable && (last || forced || self.pkts_since_ack_req >= ACK_REQ_EVERY);
        if ack_req {
            self.pkts_since_ack_req = 0;
        }
        ack_req
    }

    /// Packet `pkt` left: the cursor moves past it. Whether it had been
    /// sent before (a retransmission).
    #[inline]
    fn advance(&mut self, sq: &SendQueue, pkt: &NextPacket) -> bool {
        if self.resume.is_some() && std::mem::take(&mut self.resend_twice) {
            if self.sent_alone.len() >= MAX_QUEUED_HOLES {
                self.sent_alone.pop_front();
            }
            self.sent_alone.push_back(pkt.psn);
            self.ack_req_next = true;
            return true;
        }
        if pkt.last {
            self.step_to_next_wqe();
        } else {
            self.pkt_index += 1;
        }
        let again = pkt.psn.is_before(self.first_unsent_psn);
        if !again {
            self.first_unsent_psn = pkt.psn.next();
        }
        if self.resume.is_some() {
            // A packet resent alone left: the next hole reported, if any.
            while let Some(h) = self.holes.pop_front() {
                if h.is_before(self.first_unsent_psn) && self.move_to(sq, h) {
                    self.ack_req_next = true;
                    self.resend_twice = true;
                    return again;
                }
            }
        }
        self.resume_cursor();
        again
    }
}

/// Which requests a QP's state lets go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SendMode {
    /// RTS: every request.
    All,
    /// SQD: messages already started finish (retransmissions included);
    /// no new one starts.
    StartedOnly,
}

/// Why a message does not start yet (rxe's requester waits:
/// `wait_fence`, `need_rd_atomic`, `wait_psn`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wait {
    /// SQD: only messages already started finish.
    Draining,
    /// An ACK-clocked pass holds it for the ACK on its way.
    HeldForAck,
    /// FENCE: an earlier READ or atomic is unanswered.
    Fence,
    /// `max_rd_atomic` READs and atomics are in flight.
    ReadAtomicDepth,
    /// The window of unacknowledged PSNs is full.
    Window,
    /// A READ or atomic towards a loopback peer: the device's
    /// unacknowledged PSNs under the loopback window fill it.
    LoopbackReads,
}

/// What a QP sends under, read once per packet.
#[derive(Debug, Clone, Copy)]
struct SendLimits {
    qp_type: QpType,
    /// RC and XRC_SEND: PSNs under a window, ACKs, retries.
    reliable: bool,
    /// Payload bytes per packet.
    pmtu: usize,
    /// READs and atomics in flight at most (`max_rd_atomic`, at least 1).
    max_rd_atomic: u32,
    /// Unacknowledged PSNs allowed: rxe's 128, or the loopback window.
    window: i32,
    /// The peer is on this host's loopback, under the loopback window.
    loopback: bool,
}

/// The packet of a started message that goes out next.
#[derive(Debug, Clone, Copy)]
struct NextPacket {
    /// The WQE's index in the send queue.
    idx: usize,
    psn: Psn,
    /// Its index within the message.
    index: u32,
    /// The message's last packet (a READ or atomic request is always its
    /// message's last).
    last: bool,
    /// Where its payload starts in the message (a READ: where the data
    /// asked for starts).
    offset: u64,
}

/// A request packet's headers, and where it goes.
#[derive(Debug)]
struct RequestHeaders {
    bth: BthRepr,
    ext: ExtHeaders,
    payload_len: usize,
    dst: IpAddr,
}

fn packets_for(len: u32, pmtu: usize) -> u32 {
    (len as usize).div_ceil(pmtu).max(1) as u32
}

impl Qp {
    /// Execute the local operations (bind, invalidate) the cursor has
    /// reached, in send-queue order: they take effect now, send nothing,
    /// and complete in order with the rest (rxe's `rxe_do_local_ops`).
    /// False when one failed: its WR completes with MW_BIND_ERR (bind) or
    /// LOC_QP_OP_ERR (invalidate) and the QP goes to ERR.
    fn run_local_ops(&mut self, cx: &mut QpCtx) -> bool {
        loop {
            let r = &mut self.req;
            let Some(cursor) = r.skip_finished(&self.sq) else {
                return true;
            };
            let w = &self.sq[cursor];
            if !w.wr.opcode.is_local() {
                return true;
            }
            let by = RemoteQp {
                pd: self.init.pd,
                qpn: Some(self.qpn),
            };
            let (status, outcome) = match (w.wr.opcode, w.wr.bind) {
                (SendOpcode::BindMw, Some(bind)) => (
                    WcStatus::MwBindErr,
                    cx.memory.bind_window(by, &bind).map_err(|e| e.to_string()),
                ),
                (SendOpcode::LocalInv, _) => (
                    WcStatus::LocQpOpErr,
                    cx.memory
                        .invalidate(w.wr.invalidate_rkey, by)
                        .map_err(|e| e.to_string()),
                ),
                _ => (WcStatus::MwBindErr, Err("a bind without its window".into())),
            };
            match outcome {
                Ok(()) => {
                    self.sq[cursor].done = Some(WcStatus::Success);
                    r.step_to_next_wqe();
                    self.retire_finished(cx);
                }
                Err(why) => {
                    tracing::debug!(
                        qpn = format_args!("{:#x}", self.qpn),
                        op = ?self.sq[cursor].wr.opcode,
                        %why,
                        "local operation failed: the QP goes to ERR"
                    );
                    self.sq[cursor].done = Some(status);
                    self.retire_finished(cx);
                    self.fail_qp(cx);
                    return false;
                }
            }
        }
    }

    /// Messages posted and not yet completed (sent or waiting to be).
    pub(super) fn queued_messages(&self) -> usize {
        self.sq.len()
    }

    /// Bytes this QP's unfinished READs are still to receive, counted
    /// until the sum exceeds `limit`.
    pub(super) fn read_bytes_due(&self, limit: u64) -> u64 {
        self.sq.read_bytes_due(self.pmtu(), limit)
    }

    /// Messages started and not finished, counted up to `limit`.
    pub(super) fn unacked_messages(&self, limit: usize) -> usize {
        self.sq.started_unfinished(limit)
    }

    /// PSNs sent and not yet acknowledged.
    pub(super) fn unacked_psns(&self) -> i32 {
        self.comp.una().distance(self.req.next_psn()).max(0)
    }

    /// This QP's PSNs unacknowledged under the loopback window
    /// (`EngineConfig::loopback_window`) while it has READs or atomics in
    /// flight: 0 unless it sends reliably (RTS or SQD) to a peer under
    /// that window.
    pub(super) fn loopback_unacked(&self, config: &super::config::EngineConfig) -> i32 {
        let sending = matches!(self.state(), QpState::Rts | QpState::Sqd)
            && (self.sq.reads_atomics_started() > 0 || config.shares_window_for_data());
        match self.peer {
            Some(p) if sending && self.sends_reliably() && config.uses_loopback_window(p) => {
                self.unacked_psns()
            }
            _ => 0,
        }
    }

    /// The next request packet of this QP, if it may send one now
    /// (`hold_new`: a new message waits behind enough unacknowledged PSNs).
    /// The steps, in the order of rxe's `rxe_requester`:
    ///
    /// 1. whether the QP's state lets requests go at all ([`send_mode`]);
    /// 2. the local operations the cursor reached take effect
    ///    ([`run_local_ops`]);
    /// 3. the WQE whose packet is next, past finished ones
    ///    ([`Requester::skip_finished`]);
    /// 4. a message not yet started starts only within the limits
    ///    ([`new_message_wait`]: drain, ACK clocking, fence, READ/atomic
    ///    depth, windows), and is then assigned its PSNs
    ///    ([`start_message`]);
    /// 5. which of its packets goes, inside the window ([`next_packet`]);
    /// 6. its headers ([`request_headers`]), written into `buf`;
    /// 7. its payload, copied in or taken by reference
    ///    ([`gather_payload`]; a bad local SGE fails the WQE and the QP);
    /// 8. the state it leaves behind ([`packet_sent`]): the cursor, the
    ///    retransmission count, the timer, an unreliable message's
    ///    completion.
    ///
    /// [`send_mode`]: Self::send_mode
    /// [`run_local_ops`]: Self::run_local_ops
    /// [`new_message_wait`]: Self::new_message_wait
    /// [`start_message`]: Self::start_message
    /// [`next_packet`]: Self::next_packet
    /// [`request_headers`]: Self::request_headers
    /// [`gather_payload`]: Self::gather_payload
    /// [`packet_sent`]: Self::packet_sent
    ///
    /// The steps are this function's body cut into named pieces, run once
    /// per packet: they are `#[inline(always)]`, so that the cut is in the
    /// source only.
    pub(super) fn request_transmit(
        &mut self,
        cx: &mut QpCtx,
        now: Nanos,
        buf: &mut [u8],
        hold_new: HoldNew,
    ) -> Option<Transmit> {
        let mode = self.send_mode()?;
        if mode == SendMode::All && !self.run_local_ops(cx) {
            return None;
        }
        let limits = self.send_limits(cx);
        let idx = self.req.skip_finished(&self.sq)?;
        if !self.sq[idx].started {
            if let Some(wait) = self.new_message_wait(cx, idx, mode, hold_new, &limits) {
                match wait {
                    Wait::HeldForAck => cx.held_new = true,
                    Wait::LoopbackReads => cx.waits_for_window = true,
                    _ => {}
                }
                return None;
            }
            self.start_message(idx, &limits);
        }
        let pkt = self.next_packet(idx, &limits)?;
        let hdrs = self.request_headers(cx, &pkt, &limits)?;
        let Ok((hl, len)) = emit_headers(&hdrs.bth, &hdrs.ext, hdrs.payload_len, buf) else {
            cx.internal_error(self.qpn, "a request does not fit the transmit buffer");
            return None;
        };
        debug_assert!(len > ICRC_LEN);
        let Ok(payload) = self.gather_payload(cx, &pkt, hdrs.payload_len, hl, len, buf) else {
            // A bad lkey or range in the local SGEs: local protection error.
            self.sq[idx].done = Some(WcStatus::LocProtErr);
            self.retire_finished(cx);
            self.fail_qp(cx);
            return None;
        };
        self.packet_sent(cx, now, &pkt, &limits);
        Some(Transmit {
            dst: hdrs.dst,
            src_port: self.src_port(),
            len,
            payload,
        })
    }

    /// Step 1: which requests the QP's state lets go, if any. None while
    /// an RNR NAK's wait runs.
    #[inline(always)]
    fn send_mode(&self) -> Option<SendMode> {
        let mode = match self.state() {
            QpState::Rts => SendMode::All,
            QpState::Sqd => SendMode::StartedOnly,
            _ => return None,
        };
        (!self.timers.is_armed(Timer::RnrWait)).then_some(mode)
    }

    /// The window the path allows, losses aside: rxe's 128 PSNs, or the
    /// loopback window towards a peer on this host.
    #[inline(always)]
    pub(super) fn path_window(&self, cx: &QpCtx) -> i32 {
        if self.peer_on_this_host(cx.config) {
            cx.config
                .loopback_window
                .clamp(1, super::config::MAX_LOOPBACK_WINDOW)
        } else {
            MAX_UNACKED_PSNS
        }
    }

    /// The limits this QP sends under now.
    #[inline(always)]
    fn send_limits(&self, cx: &QpCtx) -> SendLimits {
        let loopback = self.peer_on_this_host(cx.config);
        let path_window = self.path_window(cx);
        let window = self.loss_window.limit(path_window);
        SendLimits {
            qp_type: self.init.qp_type,
            reliable: self.sends_reliably(),
            pmtu: self.pmtu(),
            max_rd_atomic: u32::from(self.attr.max_rd_atomic.max(1)),
            window,
            loopback,
        }
    }

    /// Step 4: why the message of WQE `idx`, not yet started, may not
    /// start now, if it may not. The checks run in this order; a message
    /// held for the ACK is noted by the caller (the engine releases it at
    /// the next pass that holds nothing).
    #[inline(always)]
    fn new_message_wait(
        &self,
        cx: &QpCtx,
        idx: usize,
        mode: SendMode,
        hold_new: HoldNew,
        limits: &SendLimits,
    ) -> Option<Wait> {
        let w = &self.sq[idx];
        let read_or_atomic = w.wr.opcode.is_read_or_atomic();
        let (una, next_psn) = (self.comp.una(), self.req.next_psn);
        if mode == SendMode::StartedOnly {
            return Some(Wait::Draining);
        }
        let hold = match hold_new {
            HoldNew::Never => false,
            HoldNew::Any => true,
            HoldNew::SinglePacket => w.len as usize <= limits.pmtu,
            HoldNew::Small => (w.len as usize) < super::tx::PAYLOAD_BY_REF_MIN,
        };
        if hold && limits.reliable {
            return Some(Wait::HeldForAck);
        }
        // Only a fenced WR looks back (a walk of the queue for every
        // message started cost 5 % of a 64 B SEND stream).
        if w.wr.flags.contains(SendFlags::FENCE)
            && self
                .sq
                .iter()
                .take(idx)
                .any(|e| e.wr.opcode.is_read_or_atomic() && e.done.is_none())
        {
            return Some(Wait::Fence);
        }
        if read_or_atomic && self.sq.reads_atomics_started() >= limits.max_rd_atomic {
            return Some(Wait::ReadAtomicDepth);
        }
        if limits.reliable && una.distance(next_psn) >= limits.window {
            // The window is full: PSNs are assigned when the first
            // packet can go, so a started message always has one out.
            return Some(Wait::Window);
        }
        // READ responses come at the responder's pace into this
        // device's socket, whichever QP asked: towards loopback peers
        // the window bounds the device's reads together as well as
        // each QP's (4 QPs reading 64 KiB with a whole window each
        // overflowed the socket: responses lost, go-back-N re-reads).
        // Requests that carry data are paced by this device's own
        // sending (a shared bound on them left each of 1,024 QPs one
        // message in flight: 64 KiB WRITEs 2.7 -> 1.9 GB/s, an ACK per
        // message), except where the socket buffers are small: there
        // the bound holds for every QP, even one with nothing in flight
        // (16 such QPs starting 64 KiB each were 5 windows at once);
        // the engine wakes it when the window has room
        // (`window_waiters`). Elsewhere a QP with nothing in flight
        // still starts one.
        let shared_data = cx.config.shares_window_for_data();
        if limits.reliable
            && limits.loopback
            && (read_or_atomic || shared_data)
            && (una != next_psn || shared_data)
            && cx.loopback_unacked >= limits.window
        {
            return Some(Wait::LoopbackReads);
        }
        None
    }

    /// Step 4, continued: WQE `idx` starts, with every PSN its message
    /// needs (one per packet; one for an atomic or a UD message).
    #[inline(always)]
    fn start_message(&mut self, idx: usize, limits: &SendLimits) {
        let w = &self.sq[idx];
        let npsn = match w.wr.opcode {
            o if o.is_atomic() => 1,
            _ if limits.qp_type == QpType::Ud => 1,
            _ => packets_for(w.len, limits.pmtu),
        };
        let first = self.req.assign_psns(npsn);
        self.sq.start(idx, first, npsn);
    }

    /// Step 5: the packet of WQE `idx` (started) the cursor is on, if the
    /// window lets it go: a READ resumes at its first response not yet
    /// placed.
    #[inline(always)]
    fn next_packet(&self, idx: usize, limits: &SendLimits) -> Option<NextPacket> {
        let w = &self.sq[idx];
        let op = w.wr.opcode;
        let index = if op == SendOpcode::RdmaRead {
            w.read_pkts
        } else {
            self.req.pkt_index
        };
        let psn = w.first_psn + index;
        if limits.reliable
            && self.comp.una().distance(psn) >= limits.window
            && !self.req.resending_alone()
        {
            return None;
        }
        Some(NextPacket {
            idx,
            psn,
            index,
            last: op.is_read_or_atomic() || index + 1 >= w.npsn,
            offset: u64::from(index) * limits.pmtu as u64,
        })
    }

    /// Step 8: `pkt` is on its way. The cursor moves past it, a
    /// retransmission is counted, and a reliable QP's retransmission timer
    /// runs; an unreliable message completes with its last packet.
    #[inline(always)]
    fn packet_sent(&mut self, cx: &mut QpCtx, now: Nanos, pkt: &NextPacket, limits: &SendLimits) {
        let again = self.req.advance(&self.sq, pkt);
        if again {
            cx.stats.tx_retransmits += 1;
            self.counters.tx_retransmits += 1;
        }
        if limits.reliable {
            self.rtt.sent(pkt.psn, now, again);
            if !again && pkt.index == 0 {
                self.ack_hold.message_sent(now);
            }
            if !self.timers.is_armed(Timer::Retransmit) {
                let timeout = self.ack_timeout();
                self.timers.arm_after(Timer::Retransmit, now, timeout);
            }
            if !self.timers.is_armed(Timer::Probe) {
                self.arm_probe(now);
            }
        } else if pkt.last {
            // Unreliable: complete as soon as the last packet is handed over.
            self.sq[pkt.idx].done = Some(WcStatus::Success);
            self.retire_finished(cx);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::sq::started_from;

    #[test]
    fn rewind_goes_back_to_the_packet_carrying_the_psn() {
        // SEND 100..=103, READ 104..=106
        let (mut sq, next) = started_from(
            Psn::new(100),
            &[(SendOpcode::Send, 4), (SendOpcode::RdmaRead, 3)],
        );
        let mut r = Requester::new();
        r.reset_psn(next);
        r.wqe_index = 2;
        r.rewind_to(&sq, Psn::new(102));
        assert_eq!((r.wqe_index, r.pkt_index), (0, 2));
        // A READ is re-requested from its first unanswered packet
        // (`read_pkts`), so the cursor packet index is 0.
        r.rewind_to(&sq, Psn::new(105));
        assert_eq!((r.wqe_index, r.pkt_index), (1, 0));
        // A finished message is not resent.
        sq[0].done = Some(WcStatus::Success);
        r.wqe_index = 1;
        r.rewind_to(&sq, Psn::new(101));
        assert_eq!(r.wqe_index, 1);
    }

    #[test]
    fn retiring_the_wqe_under_the_cursor_restarts_the_next_at_its_first_packet() {
        let (mut sq, next) =
            started_from(Psn::new(0), &[(SendOpcode::Send, 4), (SendOpcode::Send, 1)]);
        let mut r = Requester::new();
        r.reset_psn(next);
        r.rewind_to(&sq, Psn::new(2));
        assert_eq!((r.wqe_index, r.pkt_index), (0, 2));
        sq[0].done = Some(WcStatus::Success);
        assert!(sq.pop_finished().is_some());
        r.front_retired();
        assert_eq!((r.wqe_index, r.pkt_index), (0, 0));
    }
}
