//! Whole RoCEv2 packets: the UDP payload from the BTH to the ICRC.
//!
//! ```text
//! | BTH (12) | extension headers | payload | pad (0..3) | ICRC (4) |
//! ```

use crate::aeth::AethSyndrome;
use crate::bth::{self, Bth, BthRepr};
use crate::error::{Error, Result};
use crate::ext::{
    Aeth, AethRepr, AtomicAckEthRepr, AtomicEth, AtomicEthRepr, Deth, DethRepr, ExtHeaders, Reth,
    RethRepr,
};
use crate::icrc;
use crate::opcode::HeaderSet;
use crate::opcode::{Opcode, PacketClass};
use crate::ICRC_LEN;
use std::net::{Ipv4Addr, Ipv6Addr};

/// Shortest possible RoCEv2 packet: a BTH and the ICRC.
pub const MIN_LEN: usize = bth::HEADER_LEN + ICRC_LEN;

/// A structurally checked view of a RoCEv2 packet (UDP payload).
///
/// [`Packet::new_checked`] verifies everything needed to locate every field:
/// the length is a multiple of 4 and holds the BTH, the extension headers the
/// opcode implies and the ICRC; the opcode is known; TVer is 0; the pad count
/// fits the payload; opcodes without payload carry none (and ATOMIC_WRITE
/// exactly 8 bytes). After that no accessor can panic. Rules that depend on
/// the connection (payload against the path MTU, RETH length against the
/// payload) are left to the transport and to [`crate::lint`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
    opcode: Opcode,
    header_len: usize,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Check the structure of `buffer` and wrap it.
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let b = buffer.as_ref();
        let len = b.len();
        let bth = Bth::new_checked(b)?;
        let opcode = Opcode::try_from(bth.opcode_raw())?;
        if bth.tver() != 0 {
            return Err(Error::BadVersion(bth.tver()));
        }
        let header_len = opcode.header_len();
        if len < header_len + ICRC_LEN {
            return Err(Error::Truncated {
                needed: header_len + ICRC_LEN,
                available: len,
            });
        }
        if len % 4 != 0 {
            return Err(Error::Unaligned(len));
        }
        let padded = len - header_len - ICRC_LEN;
        let pad = bth.pad_count();
        if pad as usize > padded {
            return Err(Error::BadPadCount {
                pad,
                payload: padded,
            });
        }
        let payload = padded - pad as usize;
        let payload_ok = match opcode.class() {
            PacketClass::NoPayload | PacketClass::Cnp => padded == 0,
            PacketClass::Atomic8 => payload == 8,
            _ => true,
        };
        if !payload_ok {
            return Err(Error::BadPayloadLength {
                opcode: opcode.name(),
                len: payload,
            });
        }
        // Reserved AETH syndromes are malformed; checking here lets
        // `Packet::aeth` be infallible.
        if let Some(o) = opcode.layout().offset(HeaderSet::AETH) {
            AethSyndrome::from_byte(b[o])?;
        }
        Ok(Packet {
            buffer,
            opcode,
            header_len,
        })
    }

    fn at(&self, h: HeaderSet) -> Option<&[u8]> {
        let o = self.opcode.layout().offset(h)?;
        self.buffer.as_ref().get(o..)
    }

    /// The RETH, when the opcode carries one.
    #[inline]
    pub fn reth(&self) -> Option<RethRepr> {
        let v = Reth::new_checked(self.at(HeaderSet::RETH)?).ok()?;
        Some(RethRepr {
            va: v.va(),
            rkey: v.rkey(),
            dma_len: v.dma_len(),
        })
    }

    /// The AETH, when the opcode carries one.
    #[inline]
    pub fn aeth(&self) -> Option<AethRepr> {
        let v = Aeth::new_checked(self.at(HeaderSet::AETH)?).ok()?;
        Some(AethRepr {
            syndrome: AethSyndrome::from_byte(v.syndrome()).ok()?,
            msn: v.msn(),
        })
    }

    /// The AtomicETH, when the opcode carries one.
    #[inline]
    pub fn atomic_eth(&self) -> Option<AtomicEthRepr> {
        let v = AtomicEth::new_checked(self.at(HeaderSet::ATOMIC_ETH)?).ok()?;
        Some(AtomicEthRepr {
            va: v.va(),
            rkey: v.rkey(),
            swap_add: v.swap_add(),
            compare: v.compare(),
        })
    }

    /// The AtomicAckETH's original value, when the opcode carries one.
    #[inline]
    pub fn atomic_ack_eth(&self) -> Option<AtomicAckEthRepr> {
        let b = self.at(HeaderSet::ATOMIC_ACK_ETH)?.get(..8)?;
        Some(AtomicAckEthRepr {
            orig: u64::from_be_bytes(b.try_into().ok()?),
        })
    }

    /// The DETH, when the opcode carries one.
    #[inline]
    pub fn deth(&self) -> Option<DethRepr> {
        let v = Deth::new_checked(self.at(HeaderSet::DETH)?).ok()?;
        Some(DethRepr {
            qkey: v.qkey(),
            src_qp: v.src_qp(),
            reserved: v.reserved(),
        })
    }

    /// The immediate data, when the opcode carries it.
    #[inline]
    pub fn imm_dt(&self) -> Option<u32> {
        let b = self.at(HeaderSet::IMM_DT)?.get(..4)?;
        Some(u32::from_be_bytes(b.try_into().ok()?))
    }

    /// The IETH's R_Key, when the opcode carries one.
    #[inline]
    pub fn ieth(&self) -> Option<u32> {
        let b = self.at(HeaderSet::IETH)?.get(..4)?;
        Some(u32::from_be_bytes(b.try_into().ok()?))
    }

    /// The XRC SRQ number of an XRC request's XRCETH.
    #[inline]
    pub fn xrc_srqn(&self) -> Option<u32> {
        let b = self.at(HeaderSet::XRC_ETH)?.get(..4)?;
        Some(crate::ext::xrc_srqn(u32::from_be_bytes(b.try_into().ok()?)))
    }

    /// The opcode.
    pub fn opcode(&self) -> Opcode {
        self.opcode
    }

    /// The BTH view.
    pub fn bth(&self) -> Bth<&[u8]> {
        Bth::new_unchecked(self.buffer.as_ref())
    }

    /// Length of BTH plus extension headers.
    pub fn header_len(&self) -> usize {
        self.header_len
    }

    /// The bytes of the extension headers.
    pub fn ext_bytes(&self) -> &[u8] {
        &self.buffer.as_ref()[bth::HEADER_LEN..self.header_len]
    }

    /// The pad count.
    pub fn pad_count(&self) -> u8 {
        self.bth().pad_count()
    }

    /// The payload, without pad.
    pub fn payload(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        let end = b.len() - ICRC_LEN - self.pad_count() as usize;
        &b[self.header_len..end]
    }

    /// The pad bytes.
    pub fn pad(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        let end = b.len() - ICRC_LEN;
        &b[end - self.pad_count() as usize..end]
    }

    /// Everything the ICRC covers in this buffer: BTH to the end of the pad.
    pub fn icrc_covered(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        &b[..b.len() - ICRC_LEN]
    }

    /// The ICRC as carried in the packet.
    pub fn icrc(&self) -> u32 {
        let b = self.buffer.as_ref();
        let mut w = [0u8; ICRC_LEN];
        w.copy_from_slice(&b[b.len() - ICRC_LEN..]);
        u32::from_le_bytes(w)
    }

    /// The whole packet.
    pub fn as_bytes(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }
}

/// A parsed RoCEv2 packet: headers by value, payload borrowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacketRepr<'a> {
    /// The base transport header.
    pub bth: BthRepr,
    /// The extension headers the opcode implies.
    pub ext: ExtHeaders,
    /// The payload (without pad).
    pub payload: &'a [u8],
}

impl<'a> PacketRepr<'a> {
    /// Parse a checked packet.
    pub fn parse(packet: &Packet<&'a [u8]>) -> Result<PacketRepr<'a>> {
        let bth = BthRepr::parse(&packet.bth())?;
        let (ext, _) = ExtHeaders::parse(packet.opcode(), packet.ext_bytes())?;
        let b: &'a [u8] = packet.buffer;
        let end = b.len() - ICRC_LEN - packet.pad_count() as usize;
        Ok(PacketRepr {
            bth,
            ext,
            payload: &b[packet.header_len()..end],
        })
    }

    /// Check and parse a RoCEv2 UDP payload in one step.
    pub fn parse_bytes(buf: &'a [u8]) -> Result<PacketRepr<'a>> {
        PacketRepr::parse(&Packet::new_checked(buf)?)
    }

    /// The pad count this packet gets on the wire.
    pub fn pad_count(&self) -> u8 {
        (self.payload.len().wrapping_neg() & 3) as u8
    }

    /// Bytes the packet occupies, ICRC included.
    pub fn buffer_len(&self) -> usize {
        self.bth.opcode.header_len() + self.payload.len() + self.pad_count() as usize + ICRC_LEN
    }

    /// Emit the packet into the start of `buf`, with zero pad bytes and a
    /// zero ICRC placeholder (fill it with [`set_icrc`] or use
    /// [`PacketRepr::emit_ipv4_linux`] / [`PacketRepr::emit_ipv6`]).
    /// Returns the packet length, ICRC included. Does not allocate.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        let (h, total) = emit_headers(&self.bth, &self.ext, self.payload.len(), buf)?;
        buf[h..h + self.payload.len()].copy_from_slice(self.payload);
        Ok(total)
    }

    /// Emit and fill in the ICRC for a packet sent over IPv4 from an
    /// unconnected Linux UDP socket with don't-fragment set (IPv4 ID 0).
    pub fn emit_ipv4_linux(
        &self,
        buf: &mut [u8],
        src: Ipv4Addr,
        dst: Ipv4Addr,
        src_port: u16,
        dst_port: u16,
    ) -> Result<usize> {
        let n = self.emit(buf)?;
        let c = icrc::compute_linux_ipv4(src, dst, src_port, dst_port, &buf[..n - ICRC_LEN])?;
        set_icrc(&mut buf[..n], c);
        Ok(n)
    }

    /// Emit and fill in the ICRC for a packet sent over IPv6.
    pub fn emit_ipv6(
        &self,
        buf: &mut [u8],
        src: Ipv6Addr,
        dst: Ipv6Addr,
        src_port: u16,
        dst_port: u16,
    ) -> Result<usize> {
        let n = self.emit(buf)?;
        let c = icrc::compute_ipv6(src, dst, src_port, dst_port, &buf[..n - ICRC_LEN])?;
        set_icrc(&mut buf[..n], c);
        Ok(n)
    }
}

/// Emit the BTH and extension headers of a packet whose `payload_len`
/// payload bytes the caller writes itself (straight from registered memory,
/// without an intermediate copy) at `buf[header_len..header_len + payload_len]`.
/// The pad bytes and the ICRC placeholder are zeroed. Returns
/// `(header_len, total_len)`, the ICRC included in the total.
pub fn emit_headers(
    bth: &BthRepr,
    ext: &ExtHeaders,
    payload_len: usize,
    buf: &mut [u8],
) -> Result<(usize, usize)> {
    let opcode = bth.opcode;
    let header_len = opcode.header_len();
    let pad = (payload_len.wrapping_neg() & 3) as u8;
    let total = header_len + payload_len + pad as usize + ICRC_LEN;
    if buf.len() < total {
        return Err(Error::BufferTooSmall {
            needed: total,
            available: buf.len(),
        });
    }
    let payload_ok = match opcode.class() {
        PacketClass::NoPayload | PacketClass::Cnp => payload_len == 0,
        PacketClass::Atomic8 => payload_len == 8,
        _ => true,
    };
    if !payload_ok {
        return Err(Error::BadPayloadLength {
            opcode: opcode.name(),
            len: payload_len,
        });
    }
    if bth.dest_qp > 0xFF_FFFF {
        return Err(Error::FieldRange("destination QP"));
    }
    bth.emit(&mut Bth::new_unchecked(&mut buf[..bth::HEADER_LEN]), pad);
    ext.emit(opcode, &mut buf[bth::HEADER_LEN..header_len])?;
    buf[header_len + payload_len..total].fill(0);
    Ok((header_len, total))
}

/// Write `icrc` into the last four bytes of `packet` (least significant byte first).
/// Does nothing on a buffer shorter than four bytes.
pub fn set_icrc(packet: &mut [u8], icrc: u32) {
    let n = packet.len();
    if n >= ICRC_LEN {
        packet[n - ICRC_LEN..].copy_from_slice(&icrc.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::psn::Psn;

    fn write_only(payload: &[u8]) -> PacketRepr<'_> {
        PacketRepr {
            bth: BthRepr {
                ack_req: true,
                ..BthRepr::new(Opcode::RcWriteOnly, 0x11, Psn::new(0xFFFFFF))
            },
            ext: ExtHeaders {
                reth: Some(RethRepr {
                    va: 0x1000,
                    rkey: 0x2d5,
                    dma_len: payload.len() as u32,
                }),
                ..ExtHeaders::NONE
            },
            payload,
        }
    }

    #[test]
    fn emit_parse_round_trip_with_pad() {
        let payload = [7u8; 18];
        let r = write_only(&payload);
        assert_eq!(r.pad_count(), 2);
        let mut buf = [0xAAu8; 128];
        let n = r
            .emit_ipv4_linux(
                &mut buf,
                Ipv4Addr::LOCALHOST,
                Ipv4Addr::new(127, 0, 0, 2),
                0xc000,
                4791,
            )
            .unwrap();
        assert_eq!(n, 12 + 16 + 18 + 2 + 4);
        let p = Packet::new_checked(&buf[..n]).unwrap();
        assert_eq!(p.pad_count(), 2);
        assert_eq!(p.pad(), &[0, 0]);
        assert_eq!(PacketRepr::parse(&p).unwrap(), r);
        let mut again = [0u8; 128];
        let m = PacketRepr::parse(&p).unwrap().emit(&mut again).unwrap();
        assert_eq!(&again[..m - 4], &buf[..n - 4]);
    }

    #[test]
    fn structural_errors() {
        let payload = [1u8; 4];
        let r = write_only(&payload);
        let mut buf = [0u8; 64];
        let n = r.emit(&mut buf).unwrap();
        assert!(Packet::new_checked(&buf[..n]).is_ok());
        assert!(matches!(
            Packet::new_checked(&buf[..n - 1]),
            Err(Error::Unaligned(_))
        ));
        assert!(matches!(
            Packet::new_checked(&buf[..12 + 16]),
            Err(Error::Truncated { .. })
        ));
        let mut bad = buf;
        bad[0] = 0x15;
        assert_eq!(
            Packet::new_checked(&bad[..n]),
            Err(Error::UnknownOpcode(0x15))
        );
        let mut bad = buf;
        bad[1] |= 0x30; // pad 3 on a 4-byte payload is fine, on an ACK not
        assert!(Packet::new_checked(&bad[..n]).is_ok());
        let ack = PacketRepr {
            bth: BthRepr::new(Opcode::RcAcknowledge, 1, Psn::new(1)),
            ext: ExtHeaders {
                aeth: Some(AethRepr {
                    syndrome: AethSyndrome::ACK,
                    msn: 1,
                }),
                ..ExtHeaders::NONE
            },
            payload: &[],
        };
        let n = ack.emit(&mut buf).unwrap();
        assert_eq!(n, 20);
        buf[1] |= 0x10;
        assert!(matches!(
            Packet::new_checked(&buf[..n]),
            Err(Error::BadPadCount { .. })
        ));
        // An ACK with a payload is refused by the builder and the parser.
        let with_payload = PacketRepr {
            payload: &[1, 2, 3, 4],
            ..ack
        };
        assert!(with_payload.emit(&mut buf).is_err());
        buf[1] &= !0x30;
        let mut long = [0u8; 24];
        long[..20].copy_from_slice(&buf[..20]);
        assert!(matches!(
            Packet::new_checked(&long[..]),
            Err(Error::BadPayloadLength { .. })
        ));
    }

    #[test]
    fn emit_refuses_small_buffer_and_wrong_headers() {
        let payload = [1u8; 8];
        let r = write_only(&payload);
        let mut small = [0u8; 20];
        assert!(matches!(
            r.emit(&mut small),
            Err(Error::BufferTooSmall { .. })
        ));
        let wrong = PacketRepr {
            ext: ExtHeaders::NONE,
            ..r
        };
        let mut buf = [0u8; 64];
        assert_eq!(
            wrong.emit(&mut buf),
            Err(Error::HeaderMismatch("RC_RDMA_WRITE_ONLY"))
        );
    }
}
