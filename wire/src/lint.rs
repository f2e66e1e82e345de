//! Rules a structurally valid packet can still break.
//!
//! [`crate::Packet::new_checked`] accepts every packet whose fields can be
//! located. Some rules depend on the connection (the path MTU, the message a
//! packet belongs to), and a responder answers their violation with a NAK
//! rather than dropping the packet; others are only suspicious. This module
//! names both for tools (`roxe decode`) and tests, without connection state:
//! it assumes the largest PMTU (4096) where a packet's own PMTU is unknown.

use crate::aeth::AethSyndrome;
use crate::ext::Deth;
use crate::opcode::{Opcode, PacketClass, Transport};
use crate::packet::Packet;
use crate::{DEFAULT_PKEY, GSI_QKEY, MAX_PMTU, VALID_PMTUS};
use core::fmt;

/// How bad a problem is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Severity {
    /// Suspicious but accepted by rxe and hardware.
    Warning,
    /// Against the IBA: a receiver drops or NAKs the packet.
    Error,
}

/// A rule a packet breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Problem {
    /// Pad count on a FIRST/MIDDLE packet, which must fill the PMTU exactly.
    PadNotAllowed(Opcode, u8),
    /// FIRST/MIDDLE payload that is not a valid PMTU.
    NotAPmtu(Opcode, usize),
    /// LAST packet without payload.
    EmptyLast(Opcode),
    /// Payload larger than the PMTU (the largest, 4096, where the
    /// connection's is unknown).
    LargerThanPmtu(Opcode, usize, usize),
    /// FIRST/MIDDLE payload other than the connection's path MTU.
    NotThePathMtu {
        /// The opcode.
        op: Opcode,
        /// Payload bytes.
        payload: usize,
        /// The path MTU.
        pmtu: usize,
    },
    /// RDMA WRITE ONLY whose payload differs from its RETH DMA length.
    WriteLengthMismatch {
        /// Payload bytes.
        payload: usize,
        /// RETH DMA length.
        dma_len: u32,
    },
    /// RDMA READ longer than 2^31 bytes (C9-94).
    ReadTooLong(u32),
    /// A READ response or atomic ACK carrying a NAK or RNR NAK syndrome.
    NakOnResponse(Opcode, AethSyndrome),
    /// UD packet to QP 0 (there is no SMI on RoCE).
    UdToQp0,
    /// P_Key other than the default partition.
    NonDefaultPkey(u16),
    /// Reserved BTH bits set (byte 4 low bits, byte 8 low bits).
    ReservedBits {
        /// Byte 4's reserved six bits.
        resv6: u8,
        /// Byte 8's reserved seven bits.
        resv7: u8,
    },
    /// Solicited event on a packet that does not end a message.
    SolicitedNotLast(Opcode),
    /// AckReq set on a response packet.
    AckReqOnResponse(Opcode),
    /// Atomic target address not 8-byte aligned (the responder NAKs it).
    AtomicUnaligned(u64),
    /// Non-zero DETH reserved byte.
    DethReserved(u8),
    /// A packet to QP1 with a Q_Key other than the GSI one.
    GsiQkey(u32),
    /// CNP without BECN set.
    CnpWithoutBecn,
}

impl Problem {
    /// How bad it is.
    pub fn severity(&self) -> Severity {
        match self {
            Problem::PadNotAllowed(..)
            | Problem::NotAPmtu(..)
            | Problem::EmptyLast(_)
            | Problem::LargerThanPmtu(..)
            | Problem::NotThePathMtu { .. }
            | Problem::WriteLengthMismatch { .. }
            | Problem::ReadTooLong(_)
            | Problem::NakOnResponse(..)
            | Problem::UdToQp0 => Severity::Error,
            _ => Severity::Warning,
        }
    }

    /// A short identifier for counting problems by kind.
    pub fn kind(&self) -> &'static str {
        match self {
            Problem::PadNotAllowed(..) => "pad",
            Problem::NotAPmtu(..) => "pmtu",
            Problem::EmptyLast(_) | Problem::LargerThanPmtu(..) => "payload",
            Problem::NotThePathMtu { .. } => "pmtu",
            Problem::WriteLengthMismatch { .. } | Problem::ReadTooLong(_) => "reth-length",
            Problem::NakOnResponse(..) => "aeth",
            Problem::UdToQp0 => "ud-qp0",
            Problem::NonDefaultPkey(_) => "pkey",
            Problem::ReservedBits { .. } => "bth-reserved",
            Problem::SolicitedNotLast(_) => "solicited",
            Problem::AckReqOnResponse(_) => "ackreq",
            Problem::AtomicUnaligned(_) => "atomic-align",
            Problem::DethReserved(_) => "deth-reserved",
            Problem::GsiQkey(_) => "gsi-qkey",
            Problem::CnpWithoutBecn => "cnp-becn",
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Problem::PadNotAllowed(op, pad) => write!(f, "{op} must have pad count 0 (has {pad})"),
            Problem::NotAPmtu(op, n) => write!(
                f,
                "{op} payload {n} bytes is not a valid PMTU (256/512/1024/2048/4096)"
            ),
            Problem::EmptyLast(op) => write!(f, "{op} with empty payload"),
            Problem::LargerThanPmtu(op, n, pmtu) => {
                write!(f, "{op} payload {n} larger than the PMTU {pmtu}")
            }
            Problem::NotThePathMtu { op, payload, pmtu } => {
                write!(f, "{op} payload {payload} is not the path MTU {pmtu}")
            }
            Problem::WriteLengthMismatch { payload, dma_len } => write!(
                f,
                "RDMA WRITE ONLY payload {payload} != RETH DMA length {dma_len}"
            ),
            Problem::ReadTooLong(n) => write!(f, "RDMA READ DMA length {n} exceeds 2^31"),
            Problem::NakOnResponse(op, s) => write!(f, "{op} carries a {s} syndrome"),
            Problem::UdToQp0 => f.write_str("UD packet to QP0 (no SMI on RoCE)"),
            Problem::NonDefaultPkey(p) => write!(f, "P_Key {p:#06x} is not the default 0xffff"),
            Problem::ReservedBits { resv6, resv7 } => write!(
                f,
                "BTH reserved bits set (resv6 {resv6:#04x}, resv7 {resv7:#04x})"
            ),
            Problem::SolicitedNotLast(op) => write!(f, "Solicited Event bit set on {op}"),
            Problem::AckReqOnResponse(op) => write!(f, "AckReq set on a response packet ({op})"),
            Problem::AtomicUnaligned(va) => write!(f, "atomic VA {va:#x} is not 8-byte aligned"),
            Problem::DethReserved(b) => write!(f, "DETH reserved byte is {b:#04x}"),
            Problem::GsiQkey(q) => write!(
                f,
                "packet to QP1 with Q_Key {q:#010x} (GSI uses 0x80010000)"
            ),
            Problem::CnpWithoutBecn => f.write_str("CNP without BECN set"),
        }
    }
}

/// The payload-length rule of a packet's place in its message (IBA
/// 9.7.3.1.2): FIRST and MIDDLE carry exactly the path MTU, LAST 1..=PMTU
/// bytes, ONLY 0..=PMTU. With the connection's `pmtu` this is the check a
/// responder NAKs (invalid request); without it, FIRST/MIDDLE must be one
/// of the valid PMTUs and nothing may exceed the largest.
pub fn payload_length(op: Opcode, payload: usize, pmtu: Option<usize>) -> Option<Problem> {
    let limit = pmtu.unwrap_or(MAX_PMTU);
    match op.class() {
        PacketClass::First | PacketClass::Middle => match pmtu {
            Some(pmtu) if payload != pmtu => Some(Problem::NotThePathMtu { op, payload, pmtu }),
            None if !VALID_PMTUS.contains(&payload) => Some(Problem::NotAPmtu(op, payload)),
            _ => None,
        },
        PacketClass::Last if payload == 0 => Some(Problem::EmptyLast(op)),
        PacketClass::Last | PacketClass::Only if payload > limit => {
            Some(Problem::LargerThanPmtu(op, payload, limit))
        }
        _ => None,
    }
}

/// Every problem of a structurally valid packet, errors and warnings.
pub fn lint(packet: &Packet<&[u8]>) -> Vec<Problem> {
    let mut out = Vec::new();
    let op = packet.opcode();
    let bth = packet.bth();
    let pad = bth.pad_count();
    let payload = packet.payload().len();
    let ext = crate::ExtHeaders::parse(op, packet.ext_bytes()).map(|(h, _)| h);

    if matches!(op.class(), PacketClass::First | PacketClass::Middle) && pad != 0 {
        out.push(Problem::PadNotAllowed(op, pad));
    }
    out.extend(payload_length(op, payload, None));

    if let Ok(h) = ext {
        if let (
            Opcode::RcWriteOnly
            | Opcode::RcWriteOnlyImm
            | Opcode::UcWriteOnly
            | Opcode::UcWriteOnlyImm,
            Some(r),
        ) = (op, h.reth)
        {
            if r.dma_len as usize != payload {
                out.push(Problem::WriteLengthMismatch {
                    payload,
                    dma_len: r.dma_len,
                });
            }
        }
        if let (Opcode::RcReadRequest, Some(r)) = (op, h.reth) {
            if r.dma_len > 0x8000_0000 {
                out.push(Problem::ReadTooLong(r.dma_len));
            }
        }
        if let Some(a) = h.aeth {
            let is_read_resp = matches!(
                op,
                Opcode::RcReadResponseFirst
                    | Opcode::RcReadResponseLast
                    | Opcode::RcReadResponseOnly
            );
            if (is_read_resp || op == Opcode::RcAtomicAcknowledge) && !a.syndrome.is_ack() {
                out.push(Problem::NakOnResponse(op, a.syndrome));
            }
        }
        if let Some(a) = h.atomic_eth {
            if a.va % 8 != 0 {
                out.push(Problem::AtomicUnaligned(a.va));
            }
        }
        if let Some(d) = h.deth {
            if bth.dest_qp() == 1 && d.qkey != GSI_QKEY {
                out.push(Problem::GsiQkey(d.qkey));
            }
        }
    }
    if op.transport() == Transport::Ud {
        if bth.dest_qp() == 0 {
            out.push(Problem::UdToQp0);
        }
        let deth = Deth::new_unchecked(packet.ext_bytes());
        if deth.reserved() != 0 {
            out.push(Problem::DethReserved(deth.reserved()));
        }
    }
    if op == Opcode::Cnp && !bth.becn() {
        out.push(Problem::CnpWithoutBecn);
    }
    if bth.pkey() != DEFAULT_PKEY && bth.pkey() != 0x7FFF {
        out.push(Problem::NonDefaultPkey(bth.pkey()));
    }
    if bth.resv6() != 0 || bth.resv7() != 0 {
        out.push(Problem::ReservedBits {
            resv6: bth.resv6(),
            resv7: bth.resv7(),
        });
    }
    if bth.solicited() && !op.ends_message() && op != Opcode::RcAcknowledge {
        out.push(Problem::SolicitedNotLast(op));
    }
    if op.is_response() && bth.ack_req() {
        out.push(Problem::AckReqOnResponse(op));
    }
    out.sort_by_key(|p| core::cmp::Reverse(p.severity()));
    out
}

/// True when the packet breaks no rule of [`Severity::Error`].
pub fn is_well_formed(packet: &Packet<&[u8]>) -> bool {
    lint(packet).iter().all(|p| p.severity() < Severity::Error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BthRepr, ExtHeaders, PacketRepr, Psn, RethRepr};

    fn lint_repr(r: &PacketRepr) -> Vec<Problem> {
        let mut buf = vec![0u8; r.buffer_len()];
        let n = r.emit(&mut buf).unwrap();
        lint(&Packet::new_checked(&buf[..n]).unwrap())
    }

    #[test]
    fn first_middle_must_fill_a_pmtu() {
        let p = [0u8; 1000];
        let r = PacketRepr {
            bth: BthRepr::new(Opcode::RcSendFirst, 5, Psn::new(0)),
            ext: ExtHeaders::NONE,
            payload: &p,
        };
        assert_eq!(
            lint_repr(&r),
            vec![Problem::NotAPmtu(Opcode::RcSendFirst, 1000)]
        );
        let r = PacketRepr {
            payload: &p[..512],
            ..r
        };
        assert!(lint_repr(&r).is_empty());
    }

    #[test]
    fn write_only_length_must_match_reth() {
        let p = [0u8; 8];
        let r = PacketRepr {
            bth: BthRepr::new(Opcode::RcWriteOnly, 5, Psn::new(0)),
            ext: ExtHeaders {
                reth: Some(RethRepr {
                    va: 0,
                    rkey: 1,
                    dma_len: 9,
                }),
                ..ExtHeaders::NONE
            },
            payload: &p,
        };
        assert_eq!(
            lint_repr(&r),
            vec![Problem::WriteLengthMismatch {
                payload: 8,
                dma_len: 9
            }]
        );
        assert_eq!(lint_repr(&r)[0].severity(), Severity::Error);
    }
}
