//! What an in-sequence request that passed the opcode checks does: READ
//! and atomics queue their responses (remembered for replay), WRITEs and
//! SENDs place their payload, and the last packet of a message completes a
//! receive where it consumes one.

use super::{check, InMsg, Outcome, Reply, Resource, TmDelivery};
use crate::engine::qp::{Qp, QpCtx, RecvWqe};
use crate::engine::tm::{self, Route, Rvh, Tmh, TMH_LEN};
use crate::engine::DropReason;
use crate::memory::AccessError;
use crate::types::{AccessFlags, WcOpcode, WcStatus};
use crate::wr::{wc_flags, WorkCompletion};
use roxe_wire::aeth::{AethSyndrome, NakCode, RnrTimer};
use roxe_wire::{Operation, Packet};

impl Qp {
    /// Execute an in-sequence request (RC; UC with `reliable == false`:
    /// errors then drop silently instead of NAKing).
    pub(super) fn execute(
        &mut self,
        cx: &mut QpCtx,
        pkt: &Packet<&[u8]>,
        reliable: bool,
    ) -> Outcome {
        let op = pkt.opcode();
        let checked = check::op_sequence(self.resp.msg.as_ref(), op)
            .and_then(|()| check::op_valid(op, self.attr.qp_access_flags));
        if let Err(code) = checked {
            return self.class_c(pkt, code, reliable);
        }
        if check::needs_receive(op) && !self.has_recv(cx, pkt) {
            if reliable {
                let t = RnrTimer::new(self.attr.min_rnr_timer).unwrap_or(RnrTimer::LONGEST);
                self.resp.nak(pkt.bth().psn(), AethSyndrome::RnrNak(t));
                tracing::debug!(
                    qpn = format_args!("{:#x}", self.qpn),
                    psn = %pkt.bth().psn(),
                    "no receive posted: RNR NAK sent"
                );
                cx.stats.naks_sent += 1;
                self.counters.naks_sent += 1;
            }
            self.drop_packet(cx, DropReason::NoReceive);
            return Outcome::Fine;
        }
        if let Err(code) = check::length(pkt, self.pmtu()) {
            return self.class_c(pkt, code, reliable);
        }
        let result = match op.operation() {
            Operation::ReadRequest => self.execute_read(cx, pkt),
            Operation::CompareSwap | Operation::FetchAdd => self.execute_atomic(cx, pkt),
            Operation::Write => self.execute_write(cx, pkt),
            Operation::AtomicWrite => self.execute_atomic_write(cx, pkt),
            Operation::Send => return self.execute_send(cx, pkt, reliable),
            // `check::op_valid` let nothing else through.
            _ => Err(NakCode::InvalidRequest),
        };
        match result {
            Ok(outcome) => outcome,
            Err(code) => self.class_c(pkt, code, reliable),
        }
    }

    /// A class C error (invalid request, remote access): NAK (RC), and the
    /// QP goes to ERR.
    fn class_c(&mut self, pkt: &Packet<&[u8]>, code: NakCode, reliable: bool) -> Outcome {
        if reliable {
            self.resp.nak(pkt.bth().psn(), AethSyndrome::Nak(code));
        }
        Outcome::Fail(None)
    }

    fn next_msn(&mut self) -> u32 {
        self.resp.msn = (self.resp.msn + 1) & 0xFF_FFFF;
        self.resp.msn
    }

    fn execute_read(&mut self, cx: &mut QpCtx, pkt: &Packet<&[u8]>) -> Result<Outcome, NakCode> {
        let reth = check::rkey(cx.memory, pkt, self.remote_qp(), AccessFlags::REMOTE_READ)?;
        let p = pkt.bth().psn();
        let n = (reth.dma_len as usize).div_ceil(self.pmtu()).max(1) as u32;
        let msn = self.next_msn();
        let depth = self.attr.max_dest_rd_atomic;
        let pd = self.recv_pd();
        let r = &mut self.resp;
        let res = Resource::Read {
            first: p,
            n,
            va: reth.va,
            rkey: reth.rkey,
            len: reth.dma_len,
            msn,
            pd,
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
            pd,
        });
        r.epsn = p + n;
        Ok(Outcome::Fine)
    }

    fn execute_atomic(&mut self, cx: &mut QpCtx, pkt: &Packet<&[u8]>) -> Result<Outcome, NakCode> {
        let a = pkt.atomic_eth().ok_or(NakCode::InvalidRequest)?;
        let by = self.remote_qp();
        let res = if pkt.opcode().operation() == Operation::CompareSwap {
            cx.memory
                .atomic_cmp_swap(a.rkey, by, a.va, a.compare, a.swap_add)
        } else {
            cx.memory.atomic_fetch_add(a.rkey, by, a.va, a.swap_add)
        };
        let orig = match res {
            Ok(v) => v,
            Err(AccessError::Misaligned) => return Err(NakCode::InvalidRequest),
            Err(_) => return Err(NakCode::RemoteAccessError),
        };
        let p = pkt.bth().psn();
        let msn = self.next_msn();
        let depth = self.attr.max_dest_rd_atomic;
        let r = &mut self.resp;
        r.remember(Resource::Atomic { psn: p, orig, msn }, depth);
        r.replies.push_back(Reply::AtomicAck { psn: p, orig, msn });
        r.epsn = p + 1;
        Ok(Outcome::Fine)
    }

    /// ATOMIC WRITE (rxe's `atomic_write_reply`): the 8-byte payload stored
    /// at the RETH's address as one atomic store; the address must be
    /// 8-byte aligned and the key allow remote writes over those 8 bytes.
    fn execute_atomic_write(
        &mut self,
        cx: &mut QpCtx,
        pkt: &Packet<&[u8]>,
    ) -> Result<Outcome, NakCode> {
        let by = self.remote_qp();
        let reth = check::rkey(cx.memory, pkt, by, AccessFlags::REMOTE_WRITE)?;
        let value: [u8; 8] = pkt
            .payload()
            .try_into()
            .map_err(|_| NakCode::InvalidRequest)?;
        if reth.dma_len != 8 {
            return Err(NakCode::InvalidRequest);
        }
        match cx
            .memory
            .atomic_write(reth.rkey, by, reth.va, u64::from_ne_bytes(value))
        {
            Ok(()) => {}
            Err(AccessError::Misaligned) => return Err(NakCode::InvalidRequest),
            Err(_) => return Err(NakCode::RemoteAccessError),
        }
        self.resp.epsn = pkt.bth().psn() + 1;
        self.next_msn();
        Ok(Outcome::Fine)
    }

    fn execute_write(&mut self, cx: &mut QpCtx, pkt: &Packet<&[u8]>) -> Result<Outcome, NakCode> {
        let op = pkt.opcode();
        let by = self.remote_qp();
        if op.starts_message() {
            let reth = check::rkey(cx.memory, pkt, by, AccessFlags::REMOTE_WRITE)?;
            self.resp.msg = Some(InMsg::Write {
                va: reth.va,
                rkey: reth.rkey,
                written: 0,
                total: u64::from(reth.dma_len),
            });
        }
        let Some(InMsg::Write {
            va,
            rkey,
            written,
            total,
        }) = self.resp.msg
        else {
            // `check::op_sequence` saw a WRITE in progress.
            return Err(NakCode::InvalidRequest);
        };
        let payload = pkt.payload();
        let n = payload.len() as u64;
        let ends = op.ends_message();
        if written + n > total || (ends && written + n != total) {
            return Err(NakCode::InvalidRequest);
        }
        // Placed when it arrived beyond a gap (`keep.rs`).
        if n > 0
            && !self.resp.payload_in_place
            && cx
                .memory
                .remote_write(rkey, by, va.wrapping_add(written), payload)
                .is_err()
        {
            return Err(NakCode::RemoteAccessError);
        }
        self.resp.epsn = pkt.bth().psn() + 1;
        if !ends {
            self.resp.msg = Some(InMsg::Write {
                va,
                rkey,
                written: written + n,
                total,
            });
            return Ok(Outcome::Fine);
        }
        self.resp.msg = None;
        self.next_msn();
        let Some(imm) = pkt.imm_dt() else {
            return Ok(Outcome::Fine);
        };
        // `check::needs_receive` found one posted.
        let Some(wqe) = self.take_recv(cx) else {
            cx.internal_error(self.qpn, "the receive a WRITE with immediate needed went");
            return Ok(Outcome::Fine);
        };
        let mut wc = WorkCompletion::new(
            wqe.wr_id,
            WcStatus::Success,
            WcOpcode::RecvRdmaWithImm,
            self.qpn,
        );
        wc.byte_len = total as u32;
        wc.imm_data = imm;
        wc.wc_flags = wc_flags::WITH_IMM;
        Ok(Outcome::Complete(self.recv_cq(), wc, pkt.bth().solicited()))
    }

    fn execute_send(&mut self, cx: &mut QpCtx, pkt: &Packet<&[u8]>, reliable: bool) -> Outcome {
        let qpn = self.qpn;
        let op = pkt.opcode();
        let p = pkt.bth().psn();
        let recv_cq = self.recv_cq();
        let mut payload = pkt.payload();
        if op.starts_message() {
            // `check::needs_receive` found a receive or a tag.
            let (wqe, tm) = match self.start_send(cx, pkt) {
                Ok(Some(start)) => start,
                Ok(None) => {
                    cx.internal_error(qpn, "the receive a SEND needed went");
                    return Outcome::Fine;
                }
                Err(outcome) => return outcome,
            };
            let skip = tm.map_or(0, |t| t.skip).min(payload.len());
            payload = &payload[skip..];
            self.resp.msg = Some(InMsg::Send { wqe, offset: 0, tm });
        }
        let Some(InMsg::Send { wqe, offset, tm }) = self.resp.msg.take() else {
            // `check::op_sequence` saw a SEND in progress.
            return self.class_c(pkt, NakCode::InvalidRequest, reliable);
        };
        let recv_opcode = tm.map_or(WcOpcode::Recv, |t| t.opcode);
        let n = payload.len() as u64;
        let fits = offset + n <= wqe.total;
        let placed = fits
            && (n == 0
                || cx
                    .memory
                    .scatter(self.recv_pd(), &wqe.sg_list, offset as usize, payload)
                    .is_ok());
        if !reliable && !placed {
            // UC: the message is dropped silently (class D) and its receive
            // WQE stays for the next one, as in rxe (the caller puts it back).
            self.resp.msg = Some(InMsg::Send { wqe, offset, tm });
            return Outcome::Fail(None);
        }
        if !fits {
            // The receive buffer is too small: the receiver sees LOC_LEN_ERR
            // (as on hardware; rxe reports REM_INV_REQ_ERR here), the sender
            // REM_INV_REQ_ERR.
            self.resp.nak(p, AethSyndrome::Nak(NakCode::InvalidRequest));
            let wc = WorkCompletion::new(wqe.wr_id, WcStatus::LocLenErr, recv_opcode, qpn);
            return Outcome::Fail(Some((recv_cq, wc)));
        }
        if !placed {
            self.resp
                .nak(p, AethSyndrome::Nak(NakCode::RemoteOperationalError));
            let wc = WorkCompletion::new(wqe.wr_id, WcStatus::LocProtErr, recv_opcode, qpn);
            return Outcome::Fail(Some((recv_cq, wc)));
        }
        let ends = op.ends_message();
        // SEND_WITH_INV: the key is invalidated when the message completes
        // (only a type 2 window bound through this QP can be; an ordinary
        // region cannot, as with rxe's `rxe_invalidate_mr`). On failure,
        // rxe's class J: the receive completes with REM_INV_REQ_ERR and the
        // QP goes to ERR, never reporting IBV_WC_WITH_INV for a key that
        // still works; the requester is NAKed invalid request (rxe ACKs and
        // leaves its sender to time out; hardware NAKs).
        let invalidated = match pkt.ieth() {
            Some(rkey) if ends => match cx.memory.invalidate(rkey, self.remote_qp()) {
                Ok(()) => Some(rkey),
                Err(e) => {
                    tracing::debug!(
                        qpn = format_args!("{qpn:#x}"),
                        rkey = format_args!("{rkey:#x}"),
                        error = %e,
                        "SEND_WITH_INV could not invalidate"
                    );
                    if reliable {
                        self.resp.nak(p, AethSyndrome::Nak(NakCode::InvalidRequest));
                    }
                    let wc =
                        WorkCompletion::new(wqe.wr_id, WcStatus::RemInvReqErr, recv_opcode, qpn);
                    return Outcome::Fail(Some((recv_cq, wc)));
                }
            },
            _ => None,
        };
        self.resp.epsn = p + 1;
        if !ends {
            self.resp.msg = Some(InMsg::Send {
                wqe,
                offset: offset + n,
                tm,
            });
            return Outcome::Fine;
        }
        self.next_msn();
        let mut wc = WorkCompletion::new(wqe.wr_id, WcStatus::Success, recv_opcode, qpn);
        wc.byte_len = (offset + n) as u32;
        if let Some(t) = tm {
            wc.wc_flags |= t.flags;
            wc.tm_tag = t.tag;
            wc.tm_priv = t.app_ctx;
        }
        if let Some(imm) = pkt.imm_dt() {
            wc.imm_data = imm;
            wc.wc_flags |= wc_flags::WITH_IMM;
        }
        if let Some(rkey) = invalidated {
            wc.invalidated_rkey = rkey;
            wc.wc_flags |= wc_flags::WITH_INV;
        }
        Outcome::Complete(recv_cq, wc, pkt.bth().solicited())
    }

    /// The receive a SEND's first packet starts: an ordinary one, or, at a
    /// tag-matching SRQ, where its TMH sends it (`tm.rs`); a matched
    /// rendezvous is handled here whole (`Err`: its outcome).
    fn start_send(
        &mut self,
        cx: &mut QpCtx,
        pkt: &Packet<&[u8]>,
    ) -> Result<Option<(RecvWqe, Option<TmDelivery>)>, Outcome> {
        let single = pkt.opcode().ends_message();
        let route = self
            .recv_srq()
            .and_then(|s| cx.srqs.get_mut(&s.0))
            .and_then(|s| s.tm.as_mut())
            .map(|t| t.route(pkt.payload(), single));
        let plain = |opcode| TmDelivery {
            opcode,
            flags: 0,
            tag: 0,
            app_ctx: 0,
            skip: 0,
        };
        match route {
            None => Ok(self.take_recv(cx).map(|w| (w, None))),
            Some(Route::Ordinary { opcode }) => {
                Ok(self.take_recv(cx).map(|w| (w, Some(plain(opcode)))))
            }
            Some(Route::Eager { wqe, tmh }) => Ok(Some((
                wqe,
                Some(TmDelivery {
                    opcode: WcOpcode::TmRecv,
                    flags: wc_flags::TM_MATCH | wc_flags::TM_DATA_VALID,
                    tag: tmh.tag,
                    app_ctx: tmh.app_ctx,
                    skip: TMH_LEN,
                }),
            ))),
            Some(Route::Rndv { wqe, tmh, rvh }) => Err(self.rendezvous(pkt, wqe, tmh, rvh)),
        }
    }

    /// A rendezvous matched tagged buffer `wqe`: the buffer's first
    /// completion (MATCH) now, and this QP's READ of the sender's data,
    /// after which the buffer completes again (DATA_VALID) and a FIN goes
    /// back. Data longer than the buffer fails it (LOC_LEN_ERR), unread.
    fn rendezvous(&mut self, pkt: &Packet<&[u8]>, wqe: RecvWqe, tmh: Tmh, rvh: Rvh) -> Outcome {
        let recv_cq = self.recv_cq();
        self.resp.epsn = pkt.bth().psn() + 1;
        self.next_msn();
        let mut wc = WorkCompletion::new(wqe.wr_id, WcStatus::Success, WcOpcode::TmRecv, self.qpn);
        wc.wc_flags = wc_flags::TM_MATCH;
        wc.tm_tag = tmh.tag;
        wc.tm_priv = tmh.app_ctx;
        if u64::from(rvh.len) > wqe.total {
            wc.status = WcStatus::LocLenErr;
        } else {
            let (wr, len, kind) = tm::rndv_read(wqe, tmh, rvh, recv_cq);
            self.sq.post_internal(wr, len, kind);
        }
        Outcome::Complete(recv_cq, wc, pkt.bth().solicited())
    }
}
