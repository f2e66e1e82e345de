//! IPv4, IPv6 and UDP headers: the ICRC covers them, captures carry them,
//! and UD receive buffers start with them (the GRH area).

use crate::error::{need, Error, Result};
use crate::field::{set_u16, set_u32, u16_at, u32_at};
use std::net::{Ipv4Addr, Ipv6Addr};

/// IP protocol number of UDP.
pub const PROTO_UDP: u8 = 17;
/// Length of an IPv4 header without options.
pub const IPV4_HEADER_LEN: usize = 20;
/// Length of the IPv6 fixed header.
pub const IPV6_HEADER_LEN: usize = 40;
/// Length of the UDP header.
pub const UDP_HEADER_LEN: usize = 8;

/// The Internet checksum (RFC 1071) over `data`, starting from `initial`
/// (a partial 32-bit sum), returned folded but not complemented.
pub fn ones_complement_sum(data: &[u8], initial: u32) -> u16 {
    let mut sum = initial as u64;
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        sum += u16::from_be_bytes([c[0], c[1]]) as u64;
    }
    if let [last] = chunks.remainder() {
        sum += (*last as u64) << 8;
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xFFFF) + (sum >> 16);
    }
    sum as u16
}

/// A checked view of an IPv4 header (with any options) at the start of a buffer.
#[derive(Debug, Clone, Copy)]
pub struct Ipv4Header<'a> {
    b: &'a [u8],
}

impl<'a> Ipv4Header<'a> {
    /// Check version 4, IHL >= 5 and that the buffer holds the whole header.
    pub fn new_checked(b: &'a [u8]) -> Result<Self> {
        need(b, IPV4_HEADER_LEN)?;
        if b[0] >> 4 != 4 || (b[0] & 0xF) < 5 {
            return Err(Error::BadIpHeader("IPv4"));
        }
        need(b, ((b[0] & 0xF) as usize) * 4)?;
        Ok(Ipv4Header { b })
    }
    /// Header length in bytes (IHL × 4).
    pub fn header_len(&self) -> usize {
        ((self.b[0] & 0xF) as usize) * 4
    }
    /// The header bytes, options included.
    pub fn header_bytes(&self) -> &'a [u8] {
        &self.b[..self.header_len()]
    }
    /// DSCP and ECN (the former TOS byte).
    pub fn tos(&self) -> u8 {
        self.b[1]
    }
    /// Total length field.
    pub fn total_len(&self) -> u16 {
        u16_at(self.b, 2)
    }
    /// Identification.
    pub fn ident(&self) -> u16 {
        u16_at(self.b, 4)
    }
    /// Don't-fragment flag.
    pub fn dont_frag(&self) -> bool {
        self.b[6] & 0x40 != 0
    }
    /// More-fragments flag.
    pub fn more_frags(&self) -> bool {
        self.b[6] & 0x20 != 0
    }
    /// Fragment offset in 8-byte units.
    pub fn frag_offset(&self) -> u16 {
        u16_at(self.b, 6) & 0x1FFF
    }
    /// Time to live.
    pub fn ttl(&self) -> u8 {
        self.b[8]
    }
    /// Protocol.
    pub fn protocol(&self) -> u8 {
        self.b[9]
    }
    /// Header checksum field.
    pub fn checksum(&self) -> u16 {
        u16_at(self.b, 10)
    }
    /// Source address.
    pub fn src(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32_at(self.b, 12))
    }
    /// Destination address.
    pub fn dst(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32_at(self.b, 16))
    }
    /// True when the header checksum verifies.
    pub fn checksum_ok(&self) -> bool {
        ones_complement_sum(self.header_bytes(), 0) == 0xFFFF
    }
}

/// What roxe needs to build an IPv4 header (no options).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4Repr {
    /// Source address.
    pub src: Ipv4Addr,
    /// Destination address.
    pub dst: Ipv4Addr,
    /// DSCP and ECN.
    pub tos: u8,
    /// Identification (0 for what Linux sends from an unconnected DF socket).
    pub ident: u16,
    /// Don't fragment.
    pub dont_frag: bool,
    /// Time to live.
    pub ttl: u8,
    /// Bytes after the IP header.
    pub payload_len: usize,
}

impl Ipv4Repr {
    /// Emit a 20-byte UDP/IPv4 header with a correct checksum.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        let total = IPV4_HEADER_LEN + self.payload_len;
        if total > u16::MAX as usize {
            return Err(Error::FieldRange("IPv4 total length"));
        }
        if buf.len() < IPV4_HEADER_LEN {
            return Err(Error::BufferTooSmall {
                needed: IPV4_HEADER_LEN,
                available: buf.len(),
            });
        }
        let h = &mut buf[..IPV4_HEADER_LEN];
        h[0] = 0x45;
        h[1] = self.tos;
        set_u16(h, 2, total as u16);
        set_u16(h, 4, self.ident);
        set_u16(h, 6, if self.dont_frag { 0x4000 } else { 0 });
        h[8] = self.ttl;
        h[9] = PROTO_UDP;
        set_u16(h, 10, 0);
        set_u32(h, 12, self.src.into());
        set_u32(h, 16, self.dst.into());
        let c = !ones_complement_sum(h, 0);
        set_u16(h, 10, c);
        Ok(())
    }
}

/// A checked view of the IPv6 fixed header.
#[derive(Debug, Clone, Copy)]
pub struct Ipv6Header<'a> {
    b: &'a [u8],
}

impl<'a> Ipv6Header<'a> {
    /// Check version 6 and that the buffer holds the fixed header.
    pub fn new_checked(b: &'a [u8]) -> Result<Self> {
        need(b, IPV6_HEADER_LEN)?;
        if b[0] >> 4 != 6 {
            return Err(Error::BadIpHeader("IPv6"));
        }
        Ok(Ipv6Header { b })
    }
    /// The 40 header bytes.
    pub fn header_bytes(&self) -> &'a [u8] {
        &self.b[..IPV6_HEADER_LEN]
    }
    /// Traffic class.
    pub fn traffic_class(&self) -> u8 {
        ((u16_at(self.b, 0) >> 4) & 0xFF) as u8
    }
    /// Flow label (20 bits).
    pub fn flow_label(&self) -> u32 {
        u32_at(self.b, 0) & 0xF_FFFF
    }
    /// Payload length field.
    pub fn payload_len(&self) -> u16 {
        u16_at(self.b, 4)
    }
    /// Next header.
    pub fn next_header(&self) -> u8 {
        self.b[6]
    }
    /// Hop limit.
    pub fn hop_limit(&self) -> u8 {
        self.b[7]
    }
    /// Source address.
    pub fn src(&self) -> Ipv6Addr {
        let mut a = [0u8; 16];
        a.copy_from_slice(&self.b[8..24]);
        Ipv6Addr::from(a)
    }
    /// Destination address.
    pub fn dst(&self) -> Ipv6Addr {
        let mut a = [0u8; 16];
        a.copy_from_slice(&self.b[24..40]);
        Ipv6Addr::from(a)
    }
}

/// What roxe needs to build an IPv6 header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv6Repr {
    /// Source address.
    pub src: Ipv6Addr,
    /// Destination address.
    pub dst: Ipv6Addr,
    /// Traffic class.
    pub traffic_class: u8,
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Hop limit.
    pub hop_limit: u8,
    /// Bytes after the IPv6 header.
    pub payload_len: usize,
}

impl Ipv6Repr {
    /// Emit the 40-byte header with next header UDP.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        if self.payload_len > u16::MAX as usize {
            return Err(Error::FieldRange("IPv6 payload length"));
        }
        if buf.len() < IPV6_HEADER_LEN {
            return Err(Error::BufferTooSmall {
                needed: IPV6_HEADER_LEN,
                available: buf.len(),
            });
        }
        let h = &mut buf[..IPV6_HEADER_LEN];
        let word0 =
            (6u32 << 28) | ((self.traffic_class as u32) << 20) | (self.flow_label & 0xF_FFFF);
        set_u32(h, 0, word0);
        set_u16(h, 4, self.payload_len as u16);
        h[6] = PROTO_UDP;
        h[7] = self.hop_limit;
        h[8..24].copy_from_slice(&self.src.octets());
        h[24..40].copy_from_slice(&self.dst.octets());
        Ok(())
    }
}

/// A checked view of a UDP header.
#[derive(Debug, Clone, Copy)]
pub struct UdpHeader<'a> {
    b: &'a [u8],
}

impl<'a> UdpHeader<'a> {
    /// Check the buffer holds a UDP header.
    pub fn new_checked(b: &'a [u8]) -> Result<Self> {
        need(b, UDP_HEADER_LEN)?;
        Ok(UdpHeader { b })
    }
    /// The 8 header bytes.
    pub fn header_bytes(&self) -> &'a [u8] {
        &self.b[..UDP_HEADER_LEN]
    }
    /// Source port.
    pub fn src_port(&self) -> u16 {
        u16_at(self.b, 0)
    }
    /// Destination port.
    pub fn dst_port(&self) -> u16 {
        u16_at(self.b, 2)
    }
    /// Length field (header + payload).
    pub fn length(&self) -> u16 {
        u16_at(self.b, 4)
    }
    /// Checksum field.
    pub fn checksum(&self) -> u16 {
        u16_at(self.b, 6)
    }
}

/// A UDP header to build. The checksum is written as 0, as rxe and NICs
/// send RoCEv2 (the ICRC protects the payload).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpRepr {
    /// Source port.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
    /// Bytes after the UDP header.
    pub payload_len: usize,
}

impl UdpRepr {
    /// Emit the 8-byte header.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        let len = UDP_HEADER_LEN + self.payload_len;
        if len > u16::MAX as usize {
            return Err(Error::FieldRange("UDP length"));
        }
        if buf.len() < UDP_HEADER_LEN {
            return Err(Error::BufferTooSmall {
                needed: UDP_HEADER_LEN,
                available: buf.len(),
            });
        }
        set_u16(buf, 0, self.src_port);
        set_u16(buf, 2, self.dst_port);
        set_u16(buf, 4, len as u16);
        set_u16(buf, 6, 0);
        Ok(())
    }
}

/// How a UDP checksum field relates to the datagram it covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UdpChecksum {
    /// 0: not computed (what RoCEv2 senders do, allowed over IPv6 for tunnels).
    Zero,
    /// Correct.
    Correct,
    /// Holds the folded pseudo-header sum only: checksum offload left for a
    /// NIC that a loopback capture never reached.
    Offload,
    /// Wrong; a Linux receiver drops the datagram.
    Bad,
}

/// Classify the UDP checksum of `udp` (header + payload) sent between the
/// given source and destination address bytes (4 or 16 bytes each).
pub fn classify_udp_checksum(src: &[u8], dst: &[u8], udp: &[u8]) -> UdpChecksum {
    if udp.len() < UDP_HEADER_LEN {
        return UdpChecksum::Bad;
    }
    let field = u16_at(udp, 6);
    if field == 0 {
        return UdpChecksum::Zero;
    }
    let len = udp.len() as u32;
    let pseudo = ones_complement_sum(src, 0) as u32
        + ones_complement_sum(dst, 0) as u32
        + PROTO_UDP as u32
        + (len >> 16)
        + (len & 0xFFFF);
    let full = ones_complement_sum(udp, pseudo);
    if full == 0xFFFF {
        return UdpChecksum::Correct;
    }
    let partial = ones_complement_sum(&[], pseudo);
    if field == partial || field == !partial {
        return UdpChecksum::Offload;
    }
    UdpChecksum::Bad
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_emit_parse_checksum() {
        let r = Ipv4Repr {
            src: Ipv4Addr::new(10, 47, 91, 12),
            dst: Ipv4Addr::new(10, 47, 91, 11),
            tos: 0,
            ident: 0x1234,
            dont_frag: true,
            ttl: 64,
            payload_len: 100,
        };
        let mut b = [0u8; 20];
        r.emit(&mut b).unwrap();
        let v = Ipv4Header::new_checked(&b).unwrap();
        assert!(v.checksum_ok());
        assert_eq!(v.total_len(), 120);
        assert_eq!(v.src(), r.src);
        assert!(v.dont_frag());
        b[8] = 63;
        assert!(!Ipv4Header::new_checked(&b).unwrap().checksum_ok());
    }

    #[test]
    fn udp_checksum_classes() {
        let src = [127, 0, 0, 1];
        let dst = [127, 0, 0, 2];
        let mut udp = vec![0x12, 0xb7, 0x12, 0xb7, 0, 12, 0, 0, 1, 2, 3, 4];
        assert_eq!(classify_udp_checksum(&src, &dst, &udp), UdpChecksum::Zero);
        let pseudo =
            ones_complement_sum(&src, 0) as u32 + ones_complement_sum(&dst, 0) as u32 + 17 + 12;
        let c = !ones_complement_sum(&udp, pseudo);
        udp[6..8].copy_from_slice(&c.to_be_bytes());
        assert_eq!(
            classify_udp_checksum(&src, &dst, &udp),
            UdpChecksum::Correct
        );
        let p = ones_complement_sum(&[], pseudo);
        udp[6..8].copy_from_slice(&p.to_be_bytes());
        assert_eq!(
            classify_udp_checksum(&src, &dst, &udp),
            UdpChecksum::Offload
        );
        udp[6..8].copy_from_slice(&[0xde, 0xad]);
        assert_eq!(classify_udp_checksum(&src, &dst, &udp), UdpChecksum::Bad);
    }
}
