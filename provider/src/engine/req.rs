//! Requester (rxe's `rxe_req.c`): send WQEs become packets (segmented by
//! the path MTU, PSNs assigned, at most 128 unacknowledged PSNs, at most
//! `max_rd_atomic` READs/atomics in flight, fences honoured).
//!
//! The requester owns where the next packet comes from and which PSNs are
//! assigned ([`Requester`]); the completer (`comp.rs`) owns how far the
//! responses have come. They share the send queue (`sq.rs`) and the QP's
//! timers (`timer.rs`), and otherwise talk only through the few methods
//! each offers the other (listed at the top of `comp.rs`).

use super::qp::{Qp, QpCtx};
use super::sq::SendQueue;
use super::timer::Timer;
use super::{HoldNew, Nanos, PayloadAt, Transmit, PAYLOAD_BY_REF_MIN};
use crate::memory::RemoteQp;
use crate::qp_attr::{QpState, QpType};
use crate::types::WcStatus;
use crate::wr::{SendFlags, SendOpcode};
use roxe_wire::packet::emit_headers;
use roxe_wire::{
    AtomicEthRepr, BthRepr, DethRepr, ExtHeaders, Opcode, Operation, PacketClass, Psn, RethRepr,
    Transport, ICRC_LEN,
};

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
}

impl Requester {
    pub fn new() -> Self {
        Requester {
            wqe_index: 0,
            pkt_index: 0,
            next_psn: Psn::new(0),
            first_unsent_psn: Psn::new(0),
            pkts_since_ack_req: 0,
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
    }

    /// For the completer: one past the last PSN assigned. Responses at
    /// or beyond it answer nothing sent.
    pub fn next_psn(&self) -> Psn {
        self.next_psn
    }

    /// For the completer: go back to PSN `r` (go-back-N). The next packet
    /// sent is the one carrying it.
    pub fn rewind_to(&mut self, sq: &SendQueue, r: Psn) {
        if let Some(i) = sq.iter().position(|w| w.contains(r) && w.done.is_none()) {
            self.wqe_index = i;
            let w = &sq[i];
            self.pkt_index = if w.wr.opcode == SendOpcode::RdmaRead {
                0
            } else {
                r.distance(w.first_psn).unsigned_abs()
            };
        }
    }

    /// For the completer: the send queue's oldest WQE was retired, and
    /// the cursor moves down with the queue.
    pub fn front_retired(&mut self) {
        if self.wqe_index == 0 {
            // The cursor was inside the WQE that just went (a go-back-N
            // overtaken by the ACK that finishes it): the next WQE
            // starts at its first packet. A stale packet index here
            // once made the next message start beyond the 128-PSN
            // window with no timer armed, a silent stall.
            self.pkt_index = 0;
        }
        self.wqe_index = self.wqe_index.saturating_sub(1);
    }

    /// Move the cursor past finished WQEs (local operations done, UC/UD
    /// messages completed when sent); the index of the WQE it is on, if
    /// the queue has one there.
    fn skip_finished(&mut self, sq: &SendQueue) -> Option<usize> {
        while sq.get(self.wqe_index).is_some_and(|w| w.done.is_some()) {
            self.wqe_index += 1;
            self.pkt_index = 0;
        }
        sq.get(self.wqe_index).map(|_| self.wqe_index)
    }
}

/// The BTH opcode for packet `i` of `n` of a request on an RC, UC or
/// XRC_SEND QP:
/// the opcode table's operation column read backwards. Immediate data and
/// an invalidation ride on the last packet only.
fn data_opcode(qp_type: QpType, op: SendOpcode, i: u32, n: u32) -> Option<Opcode> {
    let transport = match qp_type {
        QpType::Rc => Transport::Rc,
        QpType::Uc => Transport::Uc,
        QpType::Ud => Transport::Ud,
        QpType::XrcSend => Transport::Xrc,
        QpType::XrcRecv => return None,
    };
    let (operation, imm, inv) = match op {
        SendOpcode::Send => (Operation::Send, false, false),
        SendOpcode::SendWithImm => (Operation::Send, true, false),
        SendOpcode::SendWithInv => (Operation::Send, false, true),
        SendOpcode::RdmaWrite => (Operation::Write, false, false),
        SendOpcode::RdmaWriteWithImm => (Operation::Write, true, false),
        SendOpcode::RdmaRead => (Operation::ReadRequest, false, false),
        SendOpcode::AtomicCmpAndSwp => (Operation::CompareSwap, false, false),
        SendOpcode::AtomicFetchAndAdd => (Operation::FetchAdd, false, false),
        SendOpcode::AtomicWrite => (Operation::AtomicWrite, false, false),
        SendOpcode::LocalInv | SendOpcode::BindMw => return None,
    };
    let last = i + 1 >= n;
    let class = match (op.is_read_or_atomic(), i == 0, last) {
        _ if op == SendOpcode::AtomicWrite => PacketClass::Atomic8,
        (true, ..) => PacketClass::NoPayload,
        (false, true, true) => PacketClass::Only,
        (false, true, false) => PacketClass::First,
        (false, false, false) => PacketClass::Middle,
        (false, false, true) => PacketClass::Last,
    };
    Opcode::request(transport, operation, class, imm && last, inv && last)
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
                    r.wqe_index += 1;
                    r.pkt_index = 0;
                    self.retire(cx);
                }
                Err(why) => {
                    tracing::debug!(
                        qpn = format_args!("{:#x}", self.qpn),
                        op = ?self.sq[cursor].wr.opcode,
                        %why,
                        "local operation failed: the QP goes to ERR"
                    );
                    self.sq[cursor].done = Some(status);
                    self.retire(cx);
                    self.fail(cx);
                    return false;
                }
            }
        }
    }

    /// Messages posted and not yet completed (sent or waiting to be).
    pub(super) fn queued_messages(&self) -> usize {
        self.sq.len()
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
            && self.sq.reads_atomics_started() > 0;
        match self.peer {
            Some(p) if sending && self.sends_reliably() && config.uses_loopback_window(p) => {
                self.unacked_psns()
            }
            _ => 0,
        }
    }

    /// The next request packet of this QP, if it may send one now
    /// (`hold_new`: a new message waits behind enough unacknowledged PSNs).
    pub(super) fn request_transmit(
        &mut self,
        cx: &mut QpCtx,
        now: Nanos,
        buf: &mut [u8],
        hold_new: HoldNew,
    ) -> Option<Transmit> {
        // SQD: messages already started finish (retransmissions included);
        // no new one starts.
        let state = self.state();
        let draining = state == QpState::Sqd;
        if !(state == QpState::Rts || draining) || self.timers.is_armed(Timer::RnrWait) {
            return None;
        }
        if !draining && !self.run_local_ops(cx) {
            return None;
        }
        let qpn = self.qpn;
        let qp_type = self.init.qp_type;
        let reliable = self.sends_reliably();
        let pmtu = self.pmtu();
        let max_rd = u32::from(self.attr.max_rd_atomic.max(1));
        let timeout = self.ack_timeout();
        let (dest_qp_num, own_qkey, peer) = (self.attr.dest_qp_num, self.attr.qkey, self.peer);
        let loopback = peer.is_some_and(|p| cx.config.uses_loopback_window(p));
        let window = if loopback {
            cx.config
                .loopback_window
                .clamp(1, super::config::MAX_LOOPBACK_WINDOW)
        } else {
            MAX_UNACKED_PSNS
        };
        let (pd, src_port) = (self.init.pd, self.src_port());
        let una = self.comp.una();
        let r = &mut self.req;
        // Skip WQEs already finished (UC/UD complete when sent).
        let idx = r.skip_finished(&self.sq)?;
        let w = &self.sq[idx];
        if !w.started {
            if draining {
                return None;
            }
            let hold = match hold_new {
                HoldNew::Never => false,
                HoldNew::Any => true,
                HoldNew::SinglePacket => w.len as usize <= pmtu,
            };
            if hold && reliable {
                cx.held_new = true;
                return None;
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
                return None;
            }
            if w.wr.opcode.is_read_or_atomic() && self.sq.reads_atomics_started() >= max_rd {
                return None;
            }
            if reliable && una.distance(r.next_psn) >= window {
                // The window is full: PSNs are assigned when the first
                // packet can go, so a started message always has one out.
                return None;
            }
            // READ responses come at the responder's pace into this
            // device's socket, whichever QP asked: towards loopback peers
            // the window bounds the device's reads together as well as
            // each QP's (4 QPs reading 64 KiB with a whole window each
            // overflowed the socket: responses lost, go-back-N re-reads).
            // A QP with nothing in flight still starts one, so none waits
            // behind the others' window. Requests that carry data are
            // paced by this device's own sending (a shared bound on them
            // left each of 1,024 QPs one message in flight: 64 KiB WRITEs
            // 2.7 -> 1.9 GB/s, an ACK per message).
            if reliable
                && loopback
                && w.wr.opcode.is_read_or_atomic()
                && una != r.next_psn
                && cx.loopback_unacked >= window
            {
                return None;
            }
            debug_assert_eq!(r.pkt_index, 0, "a new message starts at its first packet");
            r.pkt_index = 0;
            let npsn = match w.wr.opcode {
                o if o.is_atomic() => 1,
                _ if qp_type == QpType::Ud => 1,
                _ => packets_for(w.len, pmtu),
            };
            let first = r.next_psn;
            r.next_psn += npsn;
            self.sq.start(idx, first, npsn);
        }
        let w = &self.sq[idx];
        let op = w.wr.opcode;
        let (psn, pkt_index) = if op == SendOpcode::RdmaRead {
            (w.first_psn + w.read_pkts, w.read_pkts)
        } else {
            (w.first_psn + r.pkt_index, r.pkt_index)
        };
        if reliable && una.distance(psn) >= window {
            return None;
        }
        let n = w.npsn;
        let last_pkt = op.is_read_or_atomic() || pkt_index + 1 >= n;
        // `post_send` refused UD WRs without an address; RTR needed an AV.
        let (opcode, dest_qp, dst) = match (qp_type, w.wr.ud, peer) {
            (QpType::Ud, Some(ud), _) => {
                let o = if op == SendOpcode::SendWithImm {
                    Opcode::UdSendOnlyImm
                } else {
                    Opcode::UdSendOnly
                };
                (o, ud.remote_qpn, ud.addr)
            }
            (QpType::Rc | QpType::Uc | QpType::XrcSend, _, Some(peer)) => {
                // `post_send` let only the operations the transport has through.
                let Some(o) = data_opcode(qp_type, op, pkt_index, n) else {
                    cx.internal_error(qpn, "a request with no opcode on its transport");
                    return None;
                };
                (o, dest_qp_num, peer)
            }
            _ => {
                cx.internal_error(qpn, "a request with no destination");
                return None;
            }
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
        if h.contains(H::XRC_ETH) {
            ext.xrceth = Some(w.wr.xrc_remote_srqn & 0xFF_FFFF);
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
        if let (true, Some(ud)) = (h.contains(H::DETH), w.wr.ud) {
            // A Q_Key with the high bit set means: use the QP's own (IBA 10.2.5).
            let qkey = if ud.remote_qkey & 0x8000_0000 != 0 {
                own_qkey
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
        r.pkts_since_ack_req += 1;
        let ack_req = reliable && (ends || r.pkts_since_ack_req >= ACK_REQ_EVERY);
        if ack_req {
            r.pkts_since_ack_req = 0;
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
        let Ok((hl, total)) = emit_headers(&bth, &ext, payload_len, buf) else {
            cx.internal_error(qpn, "a request does not fit the transmit buffer");
            return None;
        };
        let mut by_ref = None;
        let body = &mut buf[hl..hl + payload_len];
        let gathered = match &w.wr.inline_data {
            Some(d) if w.wr.flags.contains(SendFlags::INLINE) => {
                let o = offset as usize;
                d.get(o..o + payload_len)
                    .map(|s| body.copy_from_slice(s))
                    .is_some()
            }
            _ if payload_len == 0 => true,
            _ if cx.payload_by_ref && payload_len >= PAYLOAD_BY_REF_MIN => {
                let sgl = &w.wr.sg_list;
                match cx.memory.gather_ref(pd, sgl, offset as usize, payload_len) {
                    Ok(Some(data)) => {
                        by_ref = Some(PayloadAt { at: hl, data });
                        true
                    }
                    Ok(None) => cx.memory.gather(pd, sgl, offset as usize, body).is_ok(),
                    Err(_) => false,
                }
            }
            _ => cx
                .memory
                .gather(pd, &w.wr.sg_list, offset as usize, body)
                .is_ok(),
        };
        if !gathered {
            // A bad lkey or range in the local SGEs: local protection error.
            self.sq[idx].done = Some(WcStatus::LocProtErr);
            self.retire(cx);
            self.fail(cx);
            return None;
        }
        // Advance the cursor.
        if last_pkt {
            r.wqe_index += 1;
            r.pkt_index = 0;
        } else {
            r.pkt_index += 1;
        }
        if psn.is_before(r.first_unsent_psn) {
            cx.stats.tx_retransmits += 1;
            self.counters.tx_retransmits += 1;
        } else {
            r.first_unsent_psn = psn.next();
        }
        if reliable {
            if !self.timers.is_armed(Timer::Retransmit) {
                self.timers.arm_after(Timer::Retransmit, now, timeout);
            }
        } else if last_pkt {
            // Unreliable: complete as soon as the last packet is handed over.
            self.sq[idx].done = Some(WcStatus::Success);
            self.retire(cx);
        }
        debug_assert!(total > ICRC_LEN);
        if by_ref.is_some() {
            // Pad and ICRC follow the headers in the buffer.
            buf.copy_within(hl + payload_len..total, hl);
        }
        Some(Transmit {
            dst,
            src_port,
            len: total,
            payload: by_ref,
        })
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

    #[test]
    fn data_opcodes_follow_the_message_position() {
        use Opcode::*;
        let rc = QpType::Rc;
        assert_eq!(data_opcode(rc, SendOpcode::Send, 0, 1), Some(RcSendOnly));
        assert_eq!(
            data_opcode(rc, SendOpcode::SendWithImm, 0, 3),
            Some(RcSendFirst)
        );
        assert_eq!(
            data_opcode(rc, SendOpcode::SendWithImm, 1, 3),
            Some(RcSendMiddle)
        );
        assert_eq!(
            data_opcode(rc, SendOpcode::SendWithImm, 2, 3),
            Some(RcSendLastImm)
        );
        assert_eq!(
            data_opcode(rc, SendOpcode::SendWithInv, 0, 1),
            Some(RcSendOnlyInv)
        );
        assert_eq!(
            data_opcode(rc, SendOpcode::SendWithInv, 1, 2),
            Some(RcSendLastInv)
        );
        assert_eq!(
            data_opcode(rc, SendOpcode::RdmaWriteWithImm, 0, 1),
            Some(RcWriteOnlyImm)
        );
        assert_eq!(
            data_opcode(rc, SendOpcode::RdmaWrite, 1, 2),
            Some(RcWriteLast)
        );
        assert_eq!(
            data_opcode(rc, SendOpcode::RdmaRead, 0, 4),
            Some(RcReadRequest)
        );
        assert_eq!(
            data_opcode(rc, SendOpcode::AtomicCmpAndSwp, 0, 1),
            Some(RcCompareSwap)
        );
        assert_eq!(
            data_opcode(rc, SendOpcode::AtomicFetchAndAdd, 0, 1),
            Some(RcFetchAdd)
        );
        let uc = QpType::Uc;
        assert_eq!(
            data_opcode(uc, SendOpcode::RdmaWrite, 0, 2),
            Some(UcWriteFirst)
        );
        assert_eq!(
            data_opcode(uc, SendOpcode::SendWithImm, 0, 1),
            Some(UcSendOnlyImm)
        );
        assert_eq!(data_opcode(uc, SendOpcode::RdmaRead, 0, 1), None);
    }
}
