//! Responder: request packets become memory writes, receive completions,
//! ACKs, NAKs, READ responses and atomic ACKs, with rxe's PSN and
//! error-class rules (a duplicate is re-acknowledged or replayed, never
//! executed twice; a gap gets one PSN-sequence NAK and then silence).

use super::{CqId, DropReason, Engine, RecvWqe, Transmit};
use crate::memory::AccessError;
use crate::qp_attr::{QpState, QpType};
use crate::types::{AccessFlags, WcOpcode, WcStatus};
use crate::wr::{wc_flags, WorkCompletion};
use roxe_wire::aeth::{AethSyndrome, NakCode, RnrTimer};
use roxe_wire::packet::emit_headers;
use roxe_wire::{
    AethRepr, AtomicAckEthRepr, BthRepr, ExtHeaders, Opcode, Packet, PacketClass, Psn,
};
use std::collections::VecDeque;
use std::net::IpAddr;

/// A message being received across several packets.
#[derive(Debug)]
enum InMsg {
    Send {
        wqe: RecvWqe,
        offset: u64,
    },
    Write {
        va: u64,
        rkey: u32,
        written: u64,
        total: u64,
    },
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
    },
    Atomic {
        psn: Psn,
        orig: u64,
        msn: u32,
    },
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
    },
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
        }
    }

    /// The next PSN this responder expects (`roxe stat`).
    pub fn epsn(&self) -> u32 {
        self.epsn.value()
    }

    pub fn reset_psn(&mut self, psn: Psn) {
        self.epsn = psn;
    }

    /// The receive WQE of a half-received SEND (for flushing).
    pub fn take_current_recv(&mut self) -> Vec<RecvWqe> {
        match self.msg.take() {
            Some(InMsg::Send { wqe, .. }) => vec![wqe],
            other => {
                self.msg = other;
                Vec::new()
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
        if let Some(Reply::Ack {
            syndrome: AethSyndrome::Ack { .. },
            ..
        }) = self.replies.back()
        {
            self.replies.pop_back();
        }
        self.replies.push_back(reply);
    }

    fn nak(&mut self, psn: Psn, syndrome: AethSyndrome) {
        self.replies.push_back(Reply::Ack {
            psn,
            syndrome,
            msn: self.msn,
        });
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

fn is_send(op: Opcode) -> bool {
    use Opcode::*;
    matches!(
        op,
        RcSendFirst
            | RcSendMiddle
            | RcSendLast
            | RcSendLastImm
            | RcSendOnly
            | RcSendOnlyImm
            | RcSendLastInv
            | RcSendOnlyInv
            | UcSendFirst
            | UcSendMiddle
            | UcSendLast
            | UcSendLastImm
            | UcSendOnly
            | UcSendOnlyImm
    )
}

fn is_write(op: Opcode) -> bool {
    use Opcode::*;
    matches!(
        op,
        RcWriteFirst
            | RcWriteMiddle
            | RcWriteLast
            | RcWriteLastImm
            | RcWriteOnly
            | RcWriteOnlyImm
            | UcWriteFirst
            | UcWriteMiddle
            | UcWriteLast
            | UcWriteLastImm
            | UcWriteOnly
            | UcWriteOnlyImm
    )
}

impl Engine {
    /// Take the next receive WQE of QP `qpn` (its SRQ's or its own).
    fn take_recv(&mut self, qpn: u32) -> Option<RecvWqe> {
        let q = self.qps.get_mut(&qpn)?;
        match q.init.srq {
            Some(s) => self.srqs.get_mut(&s.0)?.queue.pop_front(),
            None => q.rq.pop_front(),
        }
    }

    /// The RETH of a WRITE FIRST/ONLY or READ request, checked once for the
    /// whole message: a missing header or a length over 2^31 (C9-94) is an
    /// invalid request, a key/PD/right/range failure a remote access error.
    fn checked_reth(
        &self,
        pkt: &Packet<&[u8]>,
        pd: crate::types::PdId,
        need: AccessFlags,
    ) -> Result<roxe_wire::RethRepr, NakCode> {
        let reth = pkt.reth().ok_or(NakCode::InvalidRequest)?;
        if reth.dma_len > 1 << 31 {
            return Err(NakCode::InvalidRequest);
        }
        self.memory
            .check_remote(reth.rkey, pd, reth.va, u64::from(reth.dma_len), need)
            .map_err(|_| NakCode::RemoteAccessError)?;
        Ok(reth)
    }

    fn has_recv(&self, qpn: u32) -> bool {
        self.qps.get(&qpn).is_some_and(|q| match q.init.srq {
            Some(s) => self.srqs.get(&s.0).is_some_and(|s| !s.queue.is_empty()),
            None => !q.rq.is_empty(),
        })
    }

    /// A request packet for QP `qpn`.
    pub(super) fn responder_receive(&mut self, qpn: u32, src: IpAddr, pkt: &Packet<&[u8]>) {
        let Some(q) = self.qps.get(&qpn) else { return };
        match q.init.qp_type {
            QpType::Rc => self.rc_request(qpn, pkt),
            QpType::Uc => self.uc_request(qpn, pkt),
            QpType::Ud => self.ud_request(qpn, src, pkt),
        }
    }

    fn rc_request(&mut self, qpn: u32, pkt: &Packet<&[u8]>) {
        let Some(q) = self.qps.get_mut(&qpn) else {
            return;
        };
        let p = pkt.bth().psn();
        let op = pkt.opcode();
        let r = &mut q.resp;
        let d = r.epsn.distance(p);
        if d > 0 {
            // A gap: one NAK carrying the PSN we expect, then silence.
            if !r.nak_sent {
                r.nak_sent = true;
                let e = r.epsn;
                r.nak(e, AethSyndrome::Nak(NakCode::PsnSequenceError));
                self.stats.naks_sent += 1;
                tracing::debug!(
                    qpn = format_args!("{qpn:#x}"),
                    expected = %e,
                    got = %p,
                    "PSN gap: sequence-error NAK sent"
                );
            }
            self.drop_on(DropReason::PsnGap, qpn);
            return;
        }
        if d < 0 {
            self.rc_duplicate(qpn, pkt);
            return;
        }
        r.nak_sent = false;
        match self.execute(qpn, pkt, true) {
            Outcome::Fine => {}
            Outcome::Complete(cq, wc, solicited) => self.push_wc(cq, wc, solicited),
            Outcome::Fail(wc) => {
                self.stats.naks_sent += 1;
                if let Some((cq, wc)) = wc {
                    self.push_wc(cq, wc, false);
                }
                self.fail_qp(qpn);
                return;
            }
        }
        // Acknowledge what the requester asked to be acknowledged.
        if let Some(q) = self.qps.get_mut(&qpn) {
            if pkt.bth().ack_req() && (is_send(op) || is_write(op)) && q.resp.epsn != p {
                q.resp.ack(p);
            }
        }
    }

    /// A request PSN we already executed: re-ACK, or replay a READ or an
    /// atomic's saved result, never execute again.
    fn rc_duplicate(&mut self, qpn: u32, pkt: &Packet<&[u8]>) {
        let Some(q) = self.qps.get_mut(&qpn) else {
            return;
        };
        let p = pkt.bth().psn();
        let r = &mut q.resp;
        let op = pkt.opcode();
        if is_send(op) || is_write(op) {
            let e = r.epsn - 1;
            r.ack(e);
            return;
        }
        let found = r.resources.iter().rev().find_map(|res| match (*res, op) {
            (
                Resource::Read {
                    first,
                    n,
                    va,
                    rkey,
                    len,
                    msn,
                },
                Opcode::RcReadRequest,
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
                })
            }
            (Resource::Atomic { psn, orig, msn }, Opcode::RcCompareSwap | Opcode::RcFetchAdd)
                if psn == p =>
            {
                Some(Reply::AtomicAck { psn, orig, msn })
            }
            _ => None,
        });
        match found {
            Some(reply) => r.replies.push_back(reply),
            None => {
                q.drops.add(DropReason::DuplicateUnanswerable);
                self.stats
                    .count_drop(DropReason::DuplicateUnanswerable, Some(qpn));
            }
        }
    }

    /// Execute an in-sequence request (RC, or UC with `reliable == false`:
    /// errors then drop silently instead of NAKing).
    fn execute(&mut self, qpn: u32, pkt: &Packet<&[u8]>, reliable: bool) -> Outcome {
        let Some(q) = self.qps.get(&qpn) else {
            return Outcome::Fine;
        };
        let p = pkt.bth().psn();
        let op = pkt.opcode();
        let class = op.class();
        let pmtu = q.pmtu();
        let pd = q.init.pd;
        let access = q.attr.qp_access_flags;
        let recv_cq = q.init.recv_cq;
        let min_rnr = q.attr.min_rnr_timer;
        let depth = q.attr.max_dest_rd_atomic;
        let payload = pkt.payload();
        let in_send = matches!(q.resp.msg, Some(InMsg::Send { .. }));
        let in_write = matches!(q.resp.msg, Some(InMsg::Write { .. }));

        // Class C errors: NAK invalid request / remote access, QP to ERR.
        let fail = |e: &mut Engine, code: NakCode| -> Outcome {
            if let Some(q) = e.qps.get_mut(&qpn) {
                if reliable {
                    q.resp.nak(p, AethSyndrome::Nak(code));
                }
            }
            Outcome::Fail(None)
        };

        // Opcode sequence.
        let seq_ok = match class {
            PacketClass::Middle | PacketClass::Last => {
                (in_send && is_send(op)) || (in_write && is_write(op))
            }
            _ => !in_send && !in_write,
        };
        if !seq_ok {
            return fail(self, NakCode::InvalidRequest);
        }
        // Length against the path MTU.
        let len_ok = match class {
            PacketClass::First | PacketClass::Middle => payload.len() == pmtu,
            PacketClass::Last => !payload.is_empty() && payload.len() <= pmtu,
            PacketClass::Only => payload.len() <= pmtu,
            _ => true,
        };
        if !len_ok {
            return fail(self, NakCode::InvalidRequest);
        }
        // Operations the QP allows.
        let need = if is_write(op) {
            AccessFlags::REMOTE_WRITE
        } else if op == Opcode::RcReadRequest {
            AccessFlags::REMOTE_READ
        } else if matches!(op, Opcode::RcCompareSwap | Opcode::RcFetchAdd) {
            AccessFlags::REMOTE_ATOMIC
        } else if matches!(op, Opcode::RcFlush | Opcode::RcAtomicWrite) {
            return fail(self, NakCode::InvalidRequest);
        } else {
            AccessFlags::NONE
        };
        if !access.contains(need) {
            return fail(self, NakCode::InvalidRequest);
        }

        let ends = op.ends_message();
        let needs_recv = is_send(op) && op.starts_message()
            || (ends
                && matches!(
                    op,
                    Opcode::RcWriteLastImm
                        | Opcode::RcWriteOnlyImm
                        | Opcode::UcWriteLastImm
                        | Opcode::UcWriteOnlyImm
                ));
        if needs_recv && !self.has_recv(qpn) {
            if reliable {
                if let Some(q) = self.qps.get_mut(&qpn) {
                    let t = RnrTimer::new(min_rnr).unwrap_or(RnrTimer::LONGEST);
                    q.resp.nak(p, AethSyndrome::RnrNak(t));
                }
                tracing::debug!(
                    qpn = format_args!("{qpn:#x}"),
                    psn = %p,
                    "no receive posted: RNR NAK sent"
                );
                self.stats.naks_sent += 1;
            }
            self.drop_on(DropReason::NoReceive, qpn);
            return Outcome::Fine;
        }

        // READ and atomics.
        if op == Opcode::RcReadRequest {
            let reth = match self.checked_reth(pkt, pd, AccessFlags::REMOTE_READ) {
                Ok(r) => r,
                Err(code) => return fail(self, code),
            };
            let n = (reth.dma_len as usize).div_ceil(pmtu).max(1) as u32;
            let Some(q) = self.qps.get_mut(&qpn) else {
                return Outcome::Fine;
            };
            let r = &mut q.resp;
            r.msn = (r.msn + 1) & 0xFF_FFFF;
            let msn = r.msn;
            let res = Resource::Read {
                first: p,
                n,
                va: reth.va,
                rkey: reth.rkey,
                len: reth.dma_len,
                msn,
            };
            r.remember(res, depth);
            r.replies.push_back(Reply::Read {
                first: p,
                next: 0,
                n,
                va: reth.va,
                rkey: reth.rkey,
                len: reth.dma_len,
                msn,
            });
            r.epsn = p + n;
            return Outcome::Fine;
        }
        if matches!(op, Opcode::RcCompareSwap | Opcode::RcFetchAdd) {
            let Some(a) = pkt.atomic_eth() else {
                return fail(self, NakCode::InvalidRequest);
            };
            let res = if op == Opcode::RcCompareSwap {
                self.memory
                    .atomic_cmp_swap(a.rkey, pd, a.va, a.compare, a.swap_add)
            } else {
                self.memory.atomic_fetch_add(a.rkey, pd, a.va, a.swap_add)
            };
            let orig = match res {
                Ok(v) => v,
                Err(AccessError::Misaligned) => return fail(self, NakCode::InvalidRequest),
                Err(_) => return fail(self, NakCode::RemoteAccessError),
            };
            let Some(q) = self.qps.get_mut(&qpn) else {
                return Outcome::Fine;
            };
            let r = &mut q.resp;
            r.msn = (r.msn + 1) & 0xFF_FFFF;
            let msn = r.msn;
            r.remember(Resource::Atomic { psn: p, orig, msn }, depth);
            r.replies.push_back(Reply::AtomicAck { psn: p, orig, msn });
            r.epsn = p + 1;
            return Outcome::Fine;
        }

        // WRITE.
        if is_write(op) {
            if op.starts_message() {
                let reth = match self.checked_reth(pkt, pd, AccessFlags::REMOTE_WRITE) {
                    Ok(r) => r,
                    Err(code) => return fail(self, code),
                };
                if let Some(q) = self.qps.get_mut(&qpn) {
                    q.resp.msg = Some(InMsg::Write {
                        va: reth.va,
                        rkey: reth.rkey,
                        written: 0,
                        total: u64::from(reth.dma_len),
                    });
                }
            }
            let Some(q) = self.qps.get_mut(&qpn) else {
                return Outcome::Fine;
            };
            let Some(InMsg::Write {
                va,
                rkey,
                written,
                total,
            }) = q.resp.msg
            else {
                return fail(self, NakCode::InvalidRequest);
            };
            let n = payload.len() as u64;
            if written + n > total || (ends && written + n != total) {
                return fail(self, NakCode::InvalidRequest);
            }
            if n > 0
                && self
                    .memory
                    .remote_write(rkey, pd, va.wrapping_add(written), payload)
                    .is_err()
            {
                return fail(self, NakCode::RemoteAccessError);
            }
            let Some(q) = self.qps.get_mut(&qpn) else {
                return Outcome::Fine;
            };
            let r = &mut q.resp;
            r.epsn = p + 1;
            if !ends {
                r.msg = Some(InMsg::Write {
                    va,
                    rkey,
                    written: written + n,
                    total,
                });
                return Outcome::Fine;
            }
            r.msg = None;
            r.msn = (r.msn + 1) & 0xFF_FFFF;
            if let Some(imm) = pkt.imm_dt() {
                let Some(wqe) = self.take_recv(qpn) else {
                    return Outcome::Fine;
                };
                let mut wc = WorkCompletion::new(
                    wqe.wr_id,
                    WcStatus::Success,
                    WcOpcode::RecvRdmaWithImm,
                    qpn,
                );
                wc.byte_len = total as u32;
                wc.imm_data = imm;
                wc.wc_flags = wc_flags::WITH_IMM;
                return Outcome::Complete(recv_cq, wc, pkt.bth().solicited());
            }
            return Outcome::Fine;
        }

        // SEND.
        if op.starts_message() {
            let Some(wqe) = self.take_recv(qpn) else {
                return Outcome::Fine;
            };
            if let Some(q) = self.qps.get_mut(&qpn) {
                q.resp.msg = Some(InMsg::Send { wqe, offset: 0 });
            }
        }
        let Some(q) = self.qps.get_mut(&qpn) else {
            return Outcome::Fine;
        };
        let Some(InMsg::Send { wqe, offset }) = q.resp.msg.take() else {
            return fail(self, NakCode::InvalidRequest);
        };
        let n = payload.len() as u64;
        let fits = offset + n <= wqe.total;
        let placed = fits
            && (n == 0
                || self
                    .memory
                    .scatter(pd, &wqe.sg_list, offset as usize, payload)
                    .is_ok());
        if !reliable && !placed {
            // UC: the message is dropped silently (class D) and its receive
            // WQE stays for the next one, as in rxe (the caller puts it back).
            if let Some(q) = self.qps.get_mut(&qpn) {
                q.resp.msg = Some(InMsg::Send { wqe, offset });
            }
            return Outcome::Fail(None);
        }
        if !fits {
            // The receive buffer is too small: the receiver sees LOC_LEN_ERR
            // (as on hardware; rxe reports REM_INV_REQ_ERR here), the sender
            // REM_INV_REQ_ERR.
            if let Some(q) = self.qps.get_mut(&qpn) {
                q.resp.nak(p, AethSyndrome::Nak(NakCode::InvalidRequest));
            }
            let wc = WorkCompletion::new(wqe.wr_id, WcStatus::LocLenErr, WcOpcode::Recv, qpn);
            return Outcome::Fail(Some((recv_cq, wc)));
        }
        if !placed {
            if let Some(q) = self.qps.get_mut(&qpn) {
                q.resp
                    .nak(p, AethSyndrome::Nak(NakCode::RemoteOperationalError));
            }
            let wc = WorkCompletion::new(wqe.wr_id, WcStatus::LocProtErr, WcOpcode::Recv, qpn);
            return Outcome::Fail(Some((recv_cq, wc)));
        }
        if ends && pkt.ieth().is_some() {
            // SEND_WITH_INV: only a memory window or a fast-registration MR
            // can be invalidated remotely, and roxe has neither, so the
            // invalidation fails, as rxe's does for an ordinary MR
            // (rxe_invalidate_mr: not IB_MR_TYPE_MEM_REG). rxe's class J:
            // the receive completes with REM_INV_REQ_ERR and the QP goes to
            // ERR, never reporting IBV_WC_WITH_INV for a key that still
            // works. The requester is NAKed invalid request (rxe's class J
            // path leaves its ACK syndrome alone and ACKs the message, so
            // its sender sees success and only later a retry error).
            if reliable {
                if let Some(q) = self.qps.get_mut(&qpn) {
                    q.resp.nak(p, AethSyndrome::Nak(NakCode::InvalidRequest));
                }
            }
            let wc = WorkCompletion::new(wqe.wr_id, WcStatus::RemInvReqErr, WcOpcode::Recv, qpn);
            return Outcome::Fail(Some((recv_cq, wc)));
        }
        let Some(q) = self.qps.get_mut(&qpn) else {
            return Outcome::Fine;
        };
        let r = &mut q.resp;
        r.epsn = p + 1;
        if !ends {
            r.msg = Some(InMsg::Send {
                wqe,
                offset: offset + n,
            });
            return Outcome::Fine;
        }
        r.msn = (r.msn + 1) & 0xFF_FFFF;
        let mut wc = WorkCompletion::new(wqe.wr_id, WcStatus::Success, WcOpcode::Recv, qpn);
        wc.byte_len = (offset + n) as u32;
        if let Some(imm) = pkt.imm_dt() {
            wc.imm_data = imm;
            wc.wc_flags |= wc_flags::WITH_IMM;
        }
        Outcome::Complete(recv_cq, wc, pkt.bth().solicited())
    }

    /// Drop the unfinished message of QP `qpn`; a SEND's receive WQE goes
    /// back to the front of the queue it came from (the QP's SRQ, or its
    /// own receive queue) to be used again.
    fn abandon_message(&mut self, qpn: u32) {
        let Some(q) = self.qps.get_mut(&qpn) else {
            return;
        };
        let Some(InMsg::Send { wqe, .. }) = q.resp.msg.take() else {
            return;
        };
        match q.init.srq.and_then(|s| self.srqs.get_mut(&s.0)) {
            Some(srq) => srq.queue.push_front(wqe),
            None => q.rq.push_front(wqe),
        }
    }

    fn uc_request(&mut self, qpn: u32, pkt: &Packet<&[u8]>) {
        let Some(q) = self.qps.get(&qpn) else {
            return;
        };
        let p = pkt.bth().psn();
        let starts = pkt.opcode().starts_message();
        let in_seq = p == q.resp.epsn && !q.resp.uc_drop;
        if starts || !in_seq {
            // Any FIRST/ONLY resynchronises; an unfinished message is lost
            // and its receive buffer is used again.
            self.abandon_message(qpn);
        }
        let Some(q) = self.qps.get_mut(&qpn) else {
            return;
        };
        if starts {
            q.resp.epsn = p;
            q.resp.uc_drop = false;
        } else if !in_seq {
            q.resp.uc_drop = true;
            q.drops.add(DropReason::PsnGap);
            self.stats.count_drop(DropReason::PsnGap, Some(qpn));
            return;
        }
        match self.execute(qpn, pkt, false) {
            Outcome::Fine => {}
            Outcome::Complete(cq, wc, solicited) => self.push_wc(cq, wc, solicited),
            Outcome::Fail(_) => {
                // UC errors drop the message silently (class D).
                self.abandon_message(qpn);
                if let Some(q) = self.qps.get_mut(&qpn) {
                    q.resp.msg = None;
                    q.resp.uc_drop = true;
                    q.resp.replies.clear();
                }
                self.drop_on(DropReason::Refused, qpn);
            }
        }
    }

    fn ud_request(&mut self, qpn: u32, src: IpAddr, pkt: &Packet<&[u8]>) {
        let Some(q) = self.qps.get(&qpn) else { return };
        let Some(deth) = pkt.deth() else { return };
        let pd = q.init.pd;
        let cq = q.init.recv_cq;
        if deth.qkey != q.attr.qkey {
            self.drop_on(DropReason::BadQkey, qpn);
            return;
        }
        let Some(wqe) = self.take_recv(qpn) else {
            self.drop_on(DropReason::NoReceive, qpn);
            return;
        };
        let payload = pkt.payload();
        let grh = self.grh_area(src, pkt.as_bytes().len());
        let status = if wqe.total < 40 + payload.len() as u64 {
            WcStatus::LocLenErr
        } else if self.memory.scatter(pd, &wqe.sg_list, 0, &grh).is_err()
            || self.memory.scatter(pd, &wqe.sg_list, 40, payload).is_err()
        {
            WcStatus::LocProtErr
        } else {
            WcStatus::Success
        };
        let mut wc = WorkCompletion::new(wqe.wr_id, status, WcOpcode::Recv, qpn);
        if status == WcStatus::Success {
            wc.byte_len = 40 + payload.len() as u32;
            wc.src_qp = deth.src_qp;
            wc.wc_flags = wc_flags::GRH;
            if let Some(imm) = pkt.imm_dt() {
                wc.imm_data = imm;
                wc.wc_flags |= wc_flags::WITH_IMM;
            }
        }
        self.push_wc(cq, wc, pkt.bth().solicited());
    }

    /// The next response packet of QP `qpn`, if one is queued.
    pub(super) fn responder_transmit(&mut self, qpn: u32, buf: &mut [u8]) -> Option<Transmit> {
        let Engine { qps, memory, .. } = self;
        let q = qps.get_mut(&qpn)?;
        if q.init.qp_type != QpType::Rc {
            return None;
        }
        let dst = q.peer?;
        let dest_qp = q.attr.dest_qp_num;
        let pmtu = q.pmtu();
        let pd = q.init.pd;
        let in_error = q.state == QpState::Err;
        let r = &mut q.resp;
        loop {
            let reply = *r.replies.front()?;
            if in_error && !matches!(reply, Reply::Ack { .. }) {
                r.replies.pop_front();
                continue;
            }
            let (bth, ext, payload_len, va_rkey) = match reply {
                Reply::Ack { psn, syndrome, msn } => {
                    r.replies.pop_front();
                    let ext = ExtHeaders {
                        aeth: Some(AethRepr { syndrome, msn }),
                        ..ExtHeaders::NONE
                    };
                    (
                        BthRepr::new(Opcode::RcAcknowledge, dest_qp, psn),
                        ext,
                        0,
                        None,
                    )
                }
                Reply::AtomicAck { psn, orig, msn } => {
                    r.replies.pop_front();
                    let ext = ExtHeaders {
                        aeth: Some(AethRepr {
                            syndrome: AethSyndrome::ACK,
                            msn,
                        }),
                        atomic_ack_eth: Some(AtomicAckEthRepr { orig }),
                        ..ExtHeaders::NONE
                    };
                    (
                        BthRepr::new(Opcode::RcAtomicAcknowledge, dest_qp, psn),
                        ext,
                        0,
                        None,
                    )
                }
                Reply::Read {
                    first,
                    next,
                    n,
                    va,
                    rkey,
                    len,
                    msn,
                } => {
                    let op = match (n, next) {
                        (1, _) => Opcode::RcReadResponseOnly,
                        (_, 0) => Opcode::RcReadResponseFirst,
                        (_, i) if i + 1 == n => Opcode::RcReadResponseLast,
                        _ => Opcode::RcReadResponseMiddle,
                    };
                    let off = next as u64 * pmtu as u64;
                    let size = (u64::from(len) - off.min(u64::from(len))).min(pmtu as u64) as usize;
                    let mut ext = ExtHeaders::NONE;
                    if op.headers().contains(roxe_wire::HeaderSet::AETH) {
                        ext.aeth = Some(AethRepr {
                            syndrome: AethSyndrome::ACK,
                            msn,
                        });
                    }
                    if next + 1 >= n {
                        r.replies.pop_front();
                    } else if let Some(Reply::Read { next: nx, .. }) = r.replies.front_mut() {
                        *nx += 1;
                    }
                    (
                        BthRepr::new(op, dest_qp, first + next),
                        ext,
                        size,
                        Some((va.wrapping_add(off), rkey)),
                    )
                }
            };
            let (h, total) = emit_headers(&bth, &ext, payload_len, buf).ok()?;
            if let Some((va, rkey)) = va_rkey {
                if payload_len > 0
                    && memory
                        .remote_read(rkey, pd, va, &mut buf[h..h + payload_len])
                        .is_err()
                {
                    // The region went away between packets: NAK and fail.
                    r.replies.clear();
                    let ext = ExtHeaders {
                        aeth: Some(AethRepr {
                            syndrome: AethSyndrome::Nak(NakCode::RemoteAccessError),
                            msn: r.msn,
                        }),
                        ..ExtHeaders::NONE
                    };
                    let nak = BthRepr::new(Opcode::RcAcknowledge, dest_qp, bth.psn);
                    let (_, total) = emit_headers(&nak, &ext, 0, buf).ok()?;
                    let src_port = q.src_port();
                    q.state = QpState::Err;
                    self.enter_error(qpn);
                    return Some(Transmit {
                        dst,
                        src_port,
                        len: total,
                    });
                }
            }
            return Some(Transmit {
                dst,
                src_port: q.src_port(),
                len: total,
            });
        }
    }
}
