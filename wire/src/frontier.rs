//! Whether a capture's reliable requesters ever skip a PSN.
//!
//! A requester sends each PSN for the first time in order; after that it
//! may go back (go-back-N, a probe) and, when an ACK overtakes the resend,
//! jump forward again to the first PSN it never sent. A checker that
//! expects every packet after a retransmission to be the next PSN (as
//! `roce-check --strict` does) reports that legal jump as a gap. This
//! checks the rule itself: per request flow (source, destination,
//! destination QP; RC and XRC), the *frontier* is the highest PSN sent so
//! far, and a packet beyond frontier + 1 skipped the PSNs in between. A
//! READ request consumes one PSN per response packet; with the path MTU
//! unknown it may consume up to one per 256 bytes, so its frontier is its
//! PSN plus that many.

use crate::opcode::{Operation, Transport};
use crate::pcap::{self, PcapError};
use crate::{PacketRepr, Psn};
use std::collections::HashMap;
use std::io::Read;
use std::net::IpAddr;

/// PSNs a requester consumed without ever sending them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SkippedPsns {
    /// The frame (1-based) that jumped.
    pub frame: u64,
    /// The requester.
    pub src: IpAddr,
    /// The responder.
    pub dst: IpAddr,
    /// The responder's QP.
    pub dest_qp: u32,
    /// The PSN that should have come first.
    pub expected: Psn,
    /// The PSN that came.
    pub got: Psn,
}

impl core::fmt::Display for SkippedPsns {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "frame {}: {} > {} QP {:#x} sent PSN {} first, before {} ({} PSNs never sent before it)",
            self.frame,
            self.src,
            self.dst,
            self.dest_qp,
            self.got.value(),
            self.expected.value(),
            self.expected.distance(self.got)
        )
    }
}

/// The first-send frontier of each request flow.
#[derive(Debug, Default)]
pub struct Frontier {
    flows: HashMap<(IpAddr, IpAddr, u32), Psn>,
}

impl Frontier {
    /// A packet from `src` to `dst`: the PSNs it skipped, if it is a
    /// reliable request sent beyond its flow's frontier + 1.
    pub fn see(
        &mut self,
        frame: u64,
        src: IpAddr,
        dst: IpAddr,
        p: &PacketRepr<'_>,
    ) -> Option<SkippedPsns> {
        let op = p.bth.opcode;
        if !matches!(op.transport(), Transport::Rc | Transport::Xrc) || op.is_response() {
            return None;
        }
        let psn = p.bth.psn;
        let span = match (op.operation(), p.ext.reth) {
            (Operation::ReadRequest, Some(r)) => r.dma_len.div_ceil(256).max(1),
            _ => 1,
        };
        let last = psn + (span - 1);
        let key = (src, dst, p.bth.dest_qp);
        let Some(high) = self.flows.get_mut(&key) else {
            self.flows.insert(key, last);
            return None;
        };
        let expected = high.next();
        let skipped = expected.is_before(psn).then_some(SkippedPsns {
            frame,
            src,
            dst,
            dest_qp: p.bth.dest_qp,
            expected,
            got: psn,
        });
        if last.is_after(*high) {
            *high = last;
        }
        skipped
    }
}

/// Every skip in a pcap or pcapng capture of RoCEv2 packets.
pub fn skipped_psns<R: Read>(capture: R) -> Result<Vec<SkippedPsns>, PcapError> {
    let mut frontier = Frontier::default();
    let mut found = Vec::new();
    pcap::for_each_roce_packet(capture, |frame, dg, p| {
        found.extend(frontier.see(frame, dg.src, dg.dst, p));
    })?;
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BthRepr, ExtHeaders, Opcode, RethRepr};

    fn req(op: Opcode, psn: u32, reth_len: Option<u32>) -> PacketRepr<'static> {
        PacketRepr {
            bth: BthRepr::new(op, 0x11, Psn::new(psn)),
            ext: ExtHeaders {
                reth: reth_len.map(|dma_len| RethRepr {
                    va: 0,
                    rkey: 1,
                    dma_len,
                }),
                ..ExtHeaders::default()
            },
            payload: &[],
        }
    }

    #[test]
    fn a_go_back_overtaken_by_an_ack_is_no_skip_but_a_jump_is() {
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let mut f = Frontier::default();
        let mut see = |n, op, psn, len| f.see(n, a, b, &req(op, psn, len));
        for psn in 100..110 {
            assert_eq!(see(1, Opcode::RcSendMiddle, psn, None), None);
        }
        // Go back to 103, overtaken at 105 by an ACK: on to 110.
        for psn in 103..106 {
            assert_eq!(see(2, Opcode::RcSendMiddle, psn, None), None);
        }
        assert_eq!(see(3, Opcode::RcSendMiddle, 110, None), None);
        // A READ of 4096 bytes takes up to 16 PSNs (PMTU 256).
        assert_eq!(see(4, Opcode::RcReadRequest, 111, Some(4096)), None);
        assert_eq!(see(5, Opcode::RcSendOnly, 127, None), None);
        // 128..=129 never sent.
        let s = see(6, Opcode::RcSendOnly, 130, None).expect("a skip");
        assert_eq!(
            (s.expected, s.got, s.frame),
            (Psn::new(128), Psn::new(130), 6)
        );
        // Responses and other flows are not requests of this flow.
        assert_eq!(see(7, Opcode::RcAcknowledge, 500, None), None);
        assert_eq!(f.see(8, b, a, &req(Opcode::RcSendOnly, 9, None)), None);
    }

    #[test]
    fn psns_wrap_at_24_bits() {
        let (a, b): (IpAddr, IpAddr) = ("::1".parse().unwrap(), "::2".parse().unwrap());
        let mut f = Frontier::default();
        assert_eq!(
            f.see(1, a, b, &req(Opcode::RcSendOnly, 0xFF_FFFF, None)),
            None
        );
        assert_eq!(f.see(2, a, b, &req(Opcode::RcSendOnly, 0, None)), None);
        assert!(f.see(3, a, b, &req(Opcode::RcSendOnly, 2, None)).is_some());
    }
}
