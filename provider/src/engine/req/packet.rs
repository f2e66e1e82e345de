//! Steps 6 and 7 of `request_transmit`: a request packet's headers (the
//! opcode from its place in the message, the extension headers the opcode
//! carries) and its payload (copied, or by reference).

use super::{NextPacket, RequestHeaders, SendLimits};
use crate::engine::qp::{Qp, QpCtx};
use crate::engine::{PayloadAt, PAYLOAD_BY_REF_MIN};
use crate::qp_attr::QpType;
use crate::wr::{SendFlags, SendOpcode};
use roxe_wire::{
    AtomicEthRepr, BthRepr, DethRepr, ExtHeaders, Opcode, Operation, PacketClass, RethRepr,
    Transport,
};

/// The BTH opcode for packet `i` of `n` of a request on an RC, UC or
/// XRC_SEND QP:
/// the opcode table's operation column read backwards. Immediate data and
/// an invalidation ride on the last packet only.
fn request_opcode(qp_type: QpType, op: SendOpcode, i: u32, n: u32) -> Option<Opcode> {
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

impl Qp {
    /// Step 6: the headers of `pkt` and where it goes. `None` (an engine
    /// bug, counted) when the request has no opcode on the QP's transport
    /// or no destination.
    #[inline(always)]
    pub(super) fn request_headers(
        &mut self,
        cx: &mut QpCtx,
        pkt: &NextPacket,
        limits: &SendLimits,
    ) -> Option<RequestHeaders> {
        let w = &self.sq[pkt.idx];
        let op = w.wr.opcode;
        // `post_send` refused UD WRs without an address; RTR needed an AV.
        let (opcode, dest_qp, dst) = match (limits.qp_type, w.wr.ud, self.peer) {
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
                let Some(o) = request_opcode(limits.qp_type, op, pkt.index, w.npsn) else {
                    cx.internal_error(self.qpn, "a request with no opcode on its transport");
                    return None;
                };
                (o, self.attr.dest_qp_num, peer)
            }
            _ => {
                cx.internal_error(self.qpn, "a request with no destination");
                return None;
            }
        };
        let ext = self.extension_headers(opcode, pkt);
        let payload_len = if opcode.allows_payload() && !op.is_read_or_atomic() {
            (u64::from(w.len) - pkt.offset).min(limits.pmtu as u64) as usize
        } else {
            0
        };
        let solicited = pkt.last
            && w.wr.flags.contains(SendFlags::SOLICITED)
            && matches!(
                op,
                SendOpcode::Send
                    | SendOpcode::SendWithImm
                    | SendOpcode::SendWithInv
                    | SendOpcode::RdmaWriteWithImm
            );
        let ack_req = self.req.asks_for_ack(limits.reliable, pkt.last);
        let bth = BthRepr {
            ack_req,
            solicited,
            ..BthRepr::new(opcode, dest_qp, pkt.psn)
        };
        Some(RequestHeaders {
            bth,
            ext,
            payload_len,
            dst,
        })
    }

    /// The extension headers `opcode` carries, for `pkt`.
    #[inline(always)]
    fn extension_headers(&self, opcode: Opcode, pkt: &NextPacket) -> ExtHeaders {
        use roxe_wire::HeaderSet as H;
        let w = &self.sq[pkt.idx];
        let op = w.wr.opcode;
        let h = opcode.headers();
        let mut ext = ExtHeaders::NONE;
        if h.contains(H::RETH) {
            // A READ asks again for what is left from this packet on.
            let (va, dma_len) = if op == SendOpcode::RdmaRead {
                let off = pkt.offset;
                (w.wr.remote_addr.wrapping_add(off), w.len - off as u32)
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
                self.attr.qkey
            } else {
                ud.remote_qkey
            };
            ext.deth = Some(DethRepr {
                qkey,
                src_qp: self.qpn,
                reserved: 0,
            });
        }
        ext
    }

    /// Step 7: the `payload_len` bytes of `pkt`'s payload into `buf`
    /// after its `hl` bytes of headers (the packet is `len` bytes): inline
    /// data or the SGEs' memory, copied; or, in a pass that allows it, a
    /// reference to the memory when it lies in one region, and then the
    /// pad and ICRC move up behind the headers. `Err` for a bad local SGE.
    #[inline(always)]
    pub(super) fn gather_payload(
        &self,
        cx: &mut QpCtx,
        pkt: &NextPacket,
        payload_len: usize,
        hl: usize,
        len: usize,
        buf: &mut [u8],
    ) -> Result<Option<PayloadAt>, ()> {
        let w = &self.sq[pkt.idx];
        let pd = self.init.pd;
        let offset = pkt.offset as usize;
        let mut by_ref = None;
        let body = &mut buf[hl..hl + payload_len];
        let gathered = match &w.wr.inline_data {
            Some(d) if w.wr.flags.contains(SendFlags::INLINE) => d
                .get(offset..offset + payload_len)
                .map(|s| body.copy_from_slice(s))
                .is_some(),
            _ if payload_len == 0 => true,
            _ if cx.payload_by_ref && payload_len >= PAYLOAD_BY_REF_MIN => {
                let sgl = &w.wr.sg_list;
                match cx.memory.gather_ref(pd, sgl, offset, payload_len) {
                    Ok(Some(data)) => {
                        by_ref = Some(PayloadAt { at: hl, data });
                        true
                    }
                    Ok(None) => cx.memory.gather(pd, sgl, offset, body).is_ok(),
                    Err(_) => false,
                }
            }
            _ => cx.memory.gather(pd, &w.wr.sg_list, offset, body).is_ok(),
        };
        if !gathered {
            return Err(());
        }
        if by_ref.is_some() {
            // Pad and ICRC follow the headers in the buffer.
            buf.copy_within(hl + payload_len..len, hl);
        }
        Ok(by_ref)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_opcodes_follow_the_message_position() {
        use Opcode::*;
        let rc = QpType::Rc;
        assert_eq!(request_opcode(rc, SendOpcode::Send, 0, 1), Some(RcSendOnly));
        assert_eq!(
            request_opcode(rc, SendOpcode::SendWithImm, 0, 3),
            Some(RcSendFirst)
        );
        assert_eq!(
            request_opcode(rc, SendOpcode::SendWithImm, 1, 3),
            Some(RcSendMiddle)
        );
        assert_eq!(
            request_opcode(rc, SendOpcode::SendWithImm, 2, 3),
            Some(RcSendLastImm)
        );
        assert_eq!(
            request_opcode(rc, SendOpcode::SendWithInv, 0, 1),
            Some(RcSendOnlyInv)
        );
        assert_eq!(
            request_opcode(rc, SendOpcode::SendWithInv, 1, 2),
            Some(RcSendLastInv)
        );
        assert_eq!(
            request_opcode(rc, SendOpcode::RdmaWriteWithImm, 0, 1),
            Some(RcWriteOnlyImm)
        );
        assert_eq!(
            request_opcode(rc, SendOpcode::RdmaWrite, 1, 2),
            Some(RcWriteLast)
        );
        assert_eq!(
            request_opcode(rc, SendOpcode::RdmaRead, 0, 4),
            Some(RcReadRequest)
        );
        assert_eq!(
            request_opcode(rc, SendOpcode::AtomicCmpAndSwp, 0, 1),
            Some(RcCompareSwap)
        );
        assert_eq!(
            request_opcode(rc, SendOpcode::AtomicFetchAndAdd, 0, 1),
            Some(RcFetchAdd)
        );
        let uc = QpType::Uc;
        assert_eq!(
            request_opcode(uc, SendOpcode::RdmaWrite, 0, 2),
            Some(UcWriteFirst)
        );
        assert_eq!(
            request_opcode(uc, SendOpcode::SendWithImm, 0, 1),
            Some(UcSendOnlyImm)
        );
        assert_eq!(request_opcode(uc, SendOpcode::RdmaRead, 0, 1), None);
    }
}
