//! Responder (rxe's `rxe_resp.c`): request packets become memory writes,
//! receive completions, ACKs, NAKs, READ responses and atomic ACKs, with
//! rxe's PSN and error-class rules (a duplicate is re-acknowledged or
//! replayed, never executed twice; a gap gets one PSN-sequence NAK and
//! then silence). This file holds the state and the per-transport entry;
//! `check` the checks in rxe's order, `execute` what an accepted request
//! does, `reply` the responses it sends.

mod check;
mod early;
mod execute;
mod keep;
mod reply;

use super::qp::{Qp, QpCtx, RecvWqe};
use super::{CqId, DropReason};
use crate::qp_attr::QpType;
use crate::types::PdId;
use crate::types::{WcOpcode, WcStatus};
use crate::wr::{wc_flags, WorkCompletion};
use roxe_wire::aeth::{AethSyndrome, NakCode};
use roxe_wire::{Opcode, Operation, Packet, Psn};
use std::collections::VecDeque;
use std::net::IpAddr;

/// A message being received across several packets.
#[derive(Debug)]
pub(super) enum InMsg {
    Send {
        wqe: RecvWqe,
        /// Bytes placed so far.
        offset: u64,
        /// On a tag-matching SRQ: how the message completes.
        tm: Option<TmDelivery>,
    },
    Write {
        va: u64,
        rkey: u32,
        written: u64,
        total: u64,
    },
}

/// How a SEND that reached a tag-matching SRQ completes (`tm.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct TmDelivery {
    pub opcode: crate::types::WcOpcode,
    pub flags: u32,
    pub tag: u64,
    pub app_ctx: u32,
    /// Leading bytes of the message not placed (an EAGER's TMH).
    pub skip: usize,
}

/// A READ or atomic remembered for replay (the responder-resource ring).
#[derive(Debug, Clone, Copy)]
enum Resource {
    Read {
        first: Psn,
        n: u32,
        va: u64,
        rkey: u32,
        len: u32,
        msn: u32,
        /// The PD the READ was checked against (for XRC, its SRQ's).
        pd: PdId,
    },
    Atomic {
        psn: Psn,
        orig: u64,
        msn: u32,
    },
}

/// The AETH credit code that marks an ACK as a hole report, sent only to
/// a roxe requester on this host (`keeps_early`): its PSN is the last one
/// received in order, as in any ACK, and its MSN field carries a PSN that
/// a packet arriving beyond the gap shows missing, so that the requester
/// resends every lost packet of a window in one round trip instead of one
/// per round trip (a sequence NAK names only the first). A requester that
/// knows nothing of it reads a plain cumulative ACK, true as such.
pub(crate) const HOLE_REPORT_CREDITS: u8 = 30;

/// Most holes one arrival reports; a longer run of losses is NAKed, hole by
/// hole, as the replay reaches it.
const MAX_HOLES_REPORTED: u32 = 16;

/// Whether `syndrome` is a plain ACK (not a NAK, not a hole report).
fn plain_ack(syndrome: AethSyndrome) -> bool {
    matches!(syndrome, AethSyndrome::Ack { credits } if credits != HOLE_REPORT_CREDITS)
}

/// A response waiting to be sent.
#[derive(Debug, Clone, Copy)]
enum Reply {
    Ack {
        psn: Psn,
        syndrome: AethSyndrome,
        msn: u32,
    },
    AtomicAck {
        psn: Psn,
        orig: u64,
        msn: u32,
    },
    Read {
        first: Psn,
        next: u32,
        n: u32,
        va: u64,
        rkey: u32,
        len: u32,
        msn: u32,
        pd: PdId,
    },
}

impl Reply {
    /// The PSN of the request a READ's responses or an atomic ACK answer
    /// (an ACK answers no one request).
    fn request_psn(&self) -> Option<Psn> {
        match *self {
            Reply::Read { first, .. } => Some(first),
            Reply::AtomicAck { psn, .. } => Some(psn),
            Reply::Ack { .. } => None,
        }
    }
}

/// Per-QP responder state.
#[derive(Debug)]
pub(crate) struct Responder {
    epsn: Psn,
    msn: u32,
    nak_sent: bool,
    msg: Option<InMsg>,
    resources: VecDeque<Resource>,
    replies: VecDeque<Reply>,
    /// UC: drop packets until the next FIRST/ONLY.
    uc_drop: bool,
    /// SEND/WRITE packets beyond a gap, kept for a roxe requester on this
    /// host (`Qp::keeps_early`).
    early: early::EarlyPackets,
    /// The packet being executed is one kept beyond a gap whose payload
    /// was placed when it arrived (`keep.rs`): its own payload bytes are
    /// stale, and nothing is written for it.
    payload_in_place: bool,
    /// Where a placed packet is put back together for its replay.
    shadow: Vec<u8>,
}

impl Responder {
    pub fn new() -> Self {
        Responder {
            epsn: Psn::new(0),
            msn: 0,
            nak_sent: false,
            msg: None,
            resources: VecDeque::new(),
            replies: VecDeque::new(),
            uc_drop: false,
            early: early::EarlyPackets::default(),
            payload_in_place: false,
            shadow: Vec::new(),
        }
    }

    /// The next PSN this responder expects (`roxe stat`).
    pub fn epsn(&self) -> u32 {
        self.epsn.value()
    }

    pub fn reset_psn(&mut self, psn: Psn) {
        self.epsn = psn;
    }

    /// Forget the packets kept beyond a gap (the QP no longer receives).
    pub fn forget_early(&mut self) {
        self.early.clear();
    }

    /// The receive WQE of a half-received SEND (for flushing), with the
    /// opcode its completion takes (a tag-matching one's, or RECV).
    pub fn take_current_recv(&mut self) -> Option<(RecvWqe, crate::types::WcOpcode)> {
        match self.msg.take() {
            Some(InMsg::Send { wqe, tm, .. }) => {
                Some((wqe, tm.map_or(crate::types::WcOpcode::Recv, |t| t.opcode)))
            }
            other => {
                self.msg = other;
                None
            }
        }
    }

    /// Queue an ACK, merging with a queued one: ACKs are cumulative.
    fn ack(&mut self, psn: Psn) {
        let reply = Reply::Ack {
            psn,
            syndrome: AethSyndrome::ACK,
            msn: self.msn,
        };
        if let Some(&Reply::Ack { syndrome, .. }) = self.replies.back() {
            if plain_ack(syndrome) {
                self.replies.pop_back();
            }
        }
        self.replies.push_back(reply);
    }

    /// Queue a hole report for `hole` (see [`HOLE_REPORT_CREDITS`]).
    fn hole_report(&mut self, hole: Psn) {
        self.replies.push_back(Reply::Ack {
            psn: self.epsn - 1,
            syndrome: AethSyndrome::Ack {
                credits: HOLE_REPORT_CREDITS,
            },
            msn: hole.value(),
        });
    }

    /// Queue an ACK twice (a later `ack` merges with the second copy
    /// only): for the one ACK a blocked requester waits on.
    fn ack_twice(&mut self, psn: Psn) {
        self.ack(psn);
        if let Some(&copy) = self.replies.back() {
            self.replies.push_back(copy);
        }
    }

    fn nak(&mut self, psn: Psn, syndrome: AethSyndrome) {
        self.replies.push_back(Reply::Ack {
            psn,
            syndrome,
            msn: self.msn,
        });
    }

    /// A duplicate READ request asks for the READ starting at `first` again
    /// from its response `next`: if that READ's responses are still queued
    /// or being sent, they restart there, and true. As rxe replays its one
    /// resource from the PSN asked for: a second copy queued behind the
    /// first would send the rest twice.
    fn restart_read(&mut self, first: Psn, next: u32) -> bool {
        let queued = self.replies.iter_mut().find_map(|reply| match reply {
            Reply::Read { first: f, next, .. } if *f == first => Some(next),
            _ => None,
        });
        match queued {
            Some(at) => {
                *at = next;
                true
            }
            None => false,
        }
    }

    /// Queue the replay of a finished READ or atomic ahead of the READ and
    /// atomic responses queued for later requests: responses go in PSN
    /// order, and a requester going back (rxe) asks for those later ones
    /// again right after, which restarts them behind it.
    fn queue_replay(&mut self, reply: Reply) {
        let later = reply.request_psn().and_then(|psn| {
            self.replies
                .iter()
                .position(|q| q.request_psn().is_some_and(|p| p.is_after(psn)))
        });
        match later {
            Some(i) => self.replies.insert(i, reply),
            None => self.replies.push_back(reply),
        }
    }

    /// Whether the only reply queued is a plain ACK (one that may be held:
    /// `ack_hold.rs`).
    pub(super) fn only_an_ack(&self) -> bool {
        self.replies.len() == 1
            && matches!(self.replies.front(), Some(&Reply::Ack { syndrome, .. }) if plain_ack(syndrome))
    }

    fn remember(&mut self, r: Resource, depth: u8) {
        if self.resources.len() >= usize::from(depth.max(1)) {
            self.resources.pop_front();
        }
        self.resources.push_back(r);
    }
}

/// What a received request did beyond its own packet.
enum Outcome {
    Fine,
    /// A receive completes (CQ, completion, solicited).
    Complete(CqId, WorkCompletion, bool),
    /// Class C/A error: the NAK is queued; the QP goes to ERR, optionally
    /// completing a receive with an error first.
    Fail(Option<(CqId, WorkCompletion)>),
}

/// SEND, WRITE and ATOMIC WRITE are acknowledged (coalesced); READ and
/// the other atomics are answered by their responses.
fn is_send_or_write(op: Opcode) -> bool {
    matches!(
        op.operation(),
        Operation::Send | Operation::Write | Operation::AtomicWrite
    )
}

impl Qp {
    /// Take the next receive WQE (the SRQ's or the QP's own).
    fn take_recv(&mut self, cx: &mut QpCtx) -> Option<RecvWqe> {
        match self.recv_srq() {
            Some(s) => cx.srqs.get_mut(&s.0)?.queue.pop_front(),
            None => self.rq.pop_front(),
        }
    }

    /// Whether the message `pkt` starts has somewhere to go: a receive
    /// posted, or (a SEND at a tag-matching SRQ) a tag it matches.
    fn has_recv(&self, cx: &QpCtx, pkt: &Packet<&[u8]>) -> bool {
        match self.recv_srq() {
            Some(s) => cx.srqs.get(&s.0).is_some_and(|s| {
                !s.queue.is_empty()
                    || s.tm.as_ref().is_some_and(|t| {
                        pkt.opcode().operation() == roxe_wire::Operation::Send
                            && t.matches(pkt.payload(), pkt.opcode().ends_message())
                    })
            }),
            None => !self.rq.is_empty(),
        }
    }

    /// A request packet from `src`.
    pub(super) fn on_request(&mut self, cx: &mut QpCtx, src: IpAddr, pkt: &Packet<&[u8]>) {
        match self.init.qp_type {
            QpType::Rc | QpType::XrcRecv => self.rc_request(cx, pkt),
            QpType::Uc => self.uc_request(cx, pkt),
            QpType::Ud => self.ud_request(cx, src, pkt),
            QpType::XrcSend => {
                // `on_packet` admits only responses to an XRC_SEND QP.
                cx.internal_error(self.qpn, "a request reached an XRC_SEND QP");
            }
        }
    }

    fn rc_request(&mut self, cx: &mut QpCtx, pkt: &Packet<&[u8]>) {
        let p = pkt.bth().psn();
        // check_psn: a gap gets one NAK carrying the PSN expected, then
        // silence; a duplicate is answered without executing again.
        let d = self.resp.epsn.distance(p);
        if d > 0 {
            let keeps = self.keeps_early(cx, pkt.opcode());
            self.sequence_nak(cx, p, keeps);
            if keeps {
                self.report_holes(p);
            }
            let kept = keeps && d < early::MAX_PACKETS as i32 && self.keep_early(cx, pkt, d);
            if !kept {
                self.drop_packet(cx, DropReason::PsnGap);
            }
            return;
        }
        if d < 0 {
            self.rc_duplicate(cx, pkt);
            return;
        }
        if !self.rc_in_order(cx, pkt) {
            self.resp.early.clear();
            return;
        }
        if !self.resp.early.is_empty() {
            self.replay_early(cx, p);
        }
    }

    /// Whether this QP keeps request packets with opcode `op` that arrive
    /// beyond a gap: SEND and WRITE packets of an RC QP whose requester is
    /// roxe on this host (a loopback peer: the kernel's rxe and NICs are
    /// never there), which resends only the missing packet
    /// (`EngineConfig::keep_early`).
    fn keeps_early(&self, cx: &QpCtx, op: Opcode) -> bool {
        cx.config.keep_early
            && self.init.qp_type == QpType::Rc
            && matches!(op.operation(), Operation::Send | Operation::Write)
            && self.peer_on_this_host(cx.config)
    }

    /// A gap before `got`: one PSN-sequence NAK for the PSN expected, then
    /// silence until it arrives. Towards a requester that resends the
    /// missing packet alone (`keeps_early`), the NAK goes out twice: this
    /// responder keeps what follows silently, so a lost NAK would cost
    /// the requester a probe, milliseconds later.
    fn sequence_nak(&mut self, cx: &mut QpCtx, got: Psn, keeps_early: bool) {
        let r = &mut self.resp;
        if r.nak_sent {
            return;
        }
        r.nak_sent = true;
        let e = r.epsn;
        r.nak(e, AethSyndrome::Nak(NakCode::PsnSequenceError));
        if keeps_early {
            r.nak(e, AethSyndrome::Nak(NakCode::PsnSequenceError));
        }
        cx.stats.naks_sent += 1;
        self.counters.naks_sent += 1;
        tracing::debug!(
            qpn = format_args!("{:#x}", self.qpn),
            expected = %e,
            got = %got,
            "PSN gap: sequence-error NAK sent"
        );
    }

    /// Packet `got` arrived beyond the gap: report the PSNs it shows
    /// missing beyond the one NAKed (the requester resends each alone).
    fn report_holes(&mut self, got: Psn) {
        let r = &mut self.resp;
        let Some((first, n)) = r.early.new_holes(r.epsn, got) else {
            return;
        };
        let n = n.min(MAX_HOLES_REPORTED);
        for k in 0..n {
            r.hole_report(first + k);
        }
        self.counters.holes_reported += u64::from(n);
    }

    /// The request packet `pkt` carries the PSN expected: execute it and
    /// acknowledge it as asked. False when it failed the QP.
    fn rc_in_order(&mut self, cx: &mut QpCtx, pkt: &Packet<&[u8]>) -> bool {
        let qpn = self.qpn;
        let p = pkt.bth().psn();
        let op = pkt.opcode();
        let r = &mut self.resp;
        r.nak_sent = false;
        if self.init.qp_type == QpType::XrcRecv {
            // The XRCETH must name an XRC SRQ of this QP's domain; its PD
            // and CQ serve this request (IBA 9.7.5.1.4: else an invalid
            // request).
            let named = pkt.xrc_srqn().unwrap_or(u32::MAX);
            if !self.target_xrc_srq(cx, named) {
                tracing::debug!(
                    qpn = format_args!("{qpn:#x}"),
                    srqn = named,
                    "XRCETH names no XRC SRQ of this domain: invalid request"
                );
                self.resp.nak(p, AethSyndrome::Nak(NakCode::InvalidRequest));
                cx.stats.naks_sent += 1;
                self.counters.naks_sent += 1;
                self.fail_qp(cx);
                return false;
            }
        }
        match self.execute(cx, pkt, true) {
            Outcome::Fine => {}
            Outcome::Complete(cq, wc, solicited) => cx.push_wc(cq, wc, solicited),
            Outcome::Fail(wc) => {
                cx.stats.naks_sent += 1;
                self.counters.naks_sent += 1;
                if let Some((cq, wc)) = wc {
                    cx.push_wc(cq, wc, false);
                }
                self.fail_qp(cx);
                return false;
            }
        }
        // Acknowledge what the requester asked to be acknowledged.
        if pkt.bth().ack_req() && is_send_or_write(op) && self.resp.epsn != p {
            self.resp.ack(p);
            if op.ends_message() {
                let completes_receive = op.operation() == Operation::Send || op.has_immediate();
                self.ack_hold.message_received(cx.now, completes_receive);
            }
        }
        true
    }

    /// A request PSN already executed: re-ACK, or replay a READ or an
    /// atomic's saved result, never execute again.
    fn rc_duplicate(&mut self, cx: &mut QpCtx, pkt: &Packet<&[u8]>) {
        let p = pkt.bth().psn();
        let r = &mut self.resp;
        let op = pkt.opcode();
        if is_send_or_write(op) {
            let e = r.epsn - 1;
            r.ack(e);
            return;
        }
        let found = r
            .resources
            .iter()
            .rev()
            .find_map(|res| match (*res, op.operation()) {
                (
                    Resource::Read {
                        first,
                        n,
                        va,
                        rkey,
                        len,
                        msn,
                        pd,
                    },
                    Operation::ReadRequest,
                ) if !p.is_before(first) && !p.is_after(first + (n - 1)) => {
                    let k = first.distance(p) as u32;
                    let same_key = pkt.reth().is_some_and(|rh| rh.rkey == rkey);
                    same_key.then_some(Reply::Read {
                        first,
                        next: k,
                        n,
                        va,
                        rkey,
                        len,
                        msn,
                        pd,
                    })
                }
                (
                    Resource::Atomic { psn, orig, msn },
                    Operation::CompareSwap | Operation::FetchAdd,
                ) if psn == p => Some(Reply::AtomicAck { psn, orig, msn }),
                _ => None,
            });
        match found {
            Some(Reply::Read { first, next, .. }) if r.restart_read(first, next) => {}
            Some(reply) => r.queue_replay(reply),
            None => self.drop_packet(cx, DropReason::DuplicateUnanswerable),
        }
    }

    /// Drop the unfinished message; a SEND's receive WQE goes back to the
    /// front of the queue it came from (the QP's SRQ, or its own receive
    /// queue) to be used again.
    fn abandon_message(&mut self, cx: &mut QpCtx) {
        let Some(InMsg::Send { wqe, .. }) = self.resp.msg.take() else {
            return;
        };
        match self.recv_srq().and_then(|s| cx.srqs.get_mut(&s.0)) {
            Some(srq) => srq.queue.push_front(wqe),
            None => self.rq.push_front(wqe),
        }
    }

    fn uc_request(&mut self, cx: &mut QpCtx, pkt: &Packet<&[u8]>) {
        let p = pkt.bth().psn();
        let starts = pkt.opcode().starts_message();
        let in_seq = p == self.resp.epsn && !self.resp.uc_drop;
        if starts || !in_seq {
            // Any FIRST/ONLY resynchronises; an unfinished message is lost
            // and its receive buffer is used again.
            self.abandon_message(cx);
        }
        if starts {
            self.resp.epsn = p;
            self.resp.uc_drop = false;
        } else if !in_seq {
            self.resp.uc_drop = true;
            self.drop_packet(cx, DropReason::PsnGap);
            return;
        }
        match self.execute(cx, pkt, false) {
            Outcome::Fine => {}
            Outcome::Complete(cq, wc, solicited) => cx.push_wc(cq, wc, solicited),
            Outcome::Fail(_) => {
                // UC errors drop the message silently (class D).
                self.abandon_message(cx);
                self.resp.msg = None;
                self.resp.uc_drop = true;
                self.resp.replies.clear();
                self.drop_packet(cx, DropReason::Refused);
            }
        }
    }

    fn ud_request(&mut self, cx: &mut QpCtx, src: IpAddr, pkt: &Packet<&[u8]>) {
        let Some(deth) = pkt.deth() else {
            // `Packet::new_checked` found a DETH in every UD opcode.
            cx.internal_error(self.qpn, "a UD packet without a DETH");
            return;
        };
        if deth.qkey != self.attr.qkey {
            self.drop_packet(cx, DropReason::BadQkey);
            return;
        }
        let Some(wqe) = self.take_recv(cx) else {
            self.drop_packet(cx, DropReason::NoReceive);
            return;
        };
        let pd = self.init.pd;
        let payload = pkt.payload();
        let grh = crate::engine::rx::grh_area(src, cx.config.addr, pkt.as_bytes().len());
        let status = if wqe.total < 40 + payload.len() as u64 {
            WcStatus::LocLenErr
        } else if cx.memory.scatter(pd, &wqe.sg_list, 0, &grh).is_err()
            || cx.memory.scatter(pd, &wqe.sg_list, 40, payload).is_err()
        {
            WcStatus::LocProtErr
        } else {
            WcStatus::Success
        };
        let mut wc = WorkCompletion::new(wqe.wr_id, status, WcOpcode::Recv, self.qpn);
        if status == WcStatus::Success {
            wc.byte_len = 40 + payload.len() as u32;
            wc.src_qp = deth.src_qp;
            wc.sl = crate::wr::roce_packet_type(src.is_ipv4());
            wc.wc_flags = wc_flags::GRH;
            if let Some(imm) = pkt.imm_dt() {
                wc.imm_data = imm;
                wc.wc_flags |= wc_flags::WITH_IMM;
            }
        }
        cx.push_wc(self.init.recv_cq, wc, pkt.bth().solicited());
    }
}
