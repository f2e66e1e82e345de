//! QP1, the General Services Interface: the CM's MADs leave as UD
//! SEND_ONLY packets from QP1 to QP1 (Q_Key 0x80010000, AckReq set, as the
//! kernel's GSI sends them) and UD packets to QP1 reach the CM.

use super::{DropReason, Engine, Nanos, Transmit};
use roxe_wire::Packet;
use std::net::IpAddr;

impl Engine {
    /// A MAD from QP1 to QP1 of `dst`, as the kernel's GSI sends it.
    pub(super) fn gsi_transmit(&mut self, buf: &mut [u8]) -> Option<Transmit> {
        let (dst, mad) = self.cm.poll_transmit()?;
        let mut payload = [0u8; roxe_wire::cm::MAD_LEN];
        if mad.emit(&mut payload).is_err() {
            debug_assert!(false, "a CM MAD always fits 256 bytes");
            return None;
        }
        let psn = self.gsi_psn;
        self.gsi_psn += 1;
        let repr = roxe_wire::PacketRepr {
            bth: roxe_wire::BthRepr {
                ack_req: true,
                ..roxe_wire::BthRepr::new(
                    roxe_wire::Opcode::UdSendOnly,
                    roxe_wire::cm::GSI_QPN,
                    psn,
                )
            },
            ext: roxe_wire::ExtHeaders {
                deth: Some(roxe_wire::DethRepr {
                    qkey: roxe_wire::cm::GSI_QKEY,
                    src_qp: roxe_wire::cm::GSI_QPN,
                    reserved: 0,
                }),
                ..roxe_wire::ExtHeaders::NONE
            },
            payload: &payload,
        };
        let len = repr.emit(buf).ok()?;
        Some(Transmit::whole(
            dst,
            0xC000 | roxe_wire::cm::GSI_QPN as u16,
            len,
        ))
    }

    /// A UD packet to QP1: a MAD for the CM if it is one.
    pub(super) fn gsi_receive(&mut self, now: Nanos, src: IpAddr, pkt: &Packet<&[u8]>) {
        let qkey_ok = pkt
            .deth()
            .is_some_and(|d| d.qkey == roxe_wire::cm::GSI_QKEY);
        if pkt.opcode() != roxe_wire::Opcode::UdSendOnly || !qkey_ok {
            self.stats.count_drop(DropReason::NotCm, None);
            return;
        }
        self.cm.handle_mad(now, src, pkt.payload());
    }
}
