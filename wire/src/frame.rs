//! RoCEv2 inside IP datagrams: split an IPv4/IPv6 + UDP datagram into its
//! headers and RoCEv2 payload, and build whole datagrams (for captures,
//! tests and raw sockets).

use crate::error::{Error, Result};
use crate::icrc;
use crate::ip::{
    classify_udp_checksum, Ipv4Header, Ipv4Repr, Ipv6Header, Ipv6Repr, UdpChecksum, UdpHeader,
    UdpRepr, IPV4_HEADER_LEN, IPV6_HEADER_LEN, PROTO_UDP, UDP_HEADER_LEN,
};
use crate::packet::{set_icrc, PacketRepr};
use crate::ICRC_LEN;
use std::net::IpAddr;

/// A UDP datagram's network-layer facts, as far as RoCEv2 cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Datagram<'a> {
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// UDP source port.
    pub src_port: u16,
    /// UDP destination port.
    pub dst_port: u16,
    /// The IP header bytes (IPv4 with options, or the IPv6 fixed header).
    pub ip_header: &'a [u8],
    /// The UDP header bytes.
    pub udp_header: &'a [u8],
    /// The UDP payload, as far as the buffer holds it.
    pub payload: &'a [u8],
    /// Length of the UDP payload the headers announce.
    pub payload_len: usize,
    /// The buffer ends before the datagram does (a capture's snap length).
    pub truncated: bool,
    /// IPv4 header checksum wrong.
    pub bad_ipv4_checksum: bool,
    /// IPv4 fragment (more-fragments set or non-zero offset).
    pub fragment: bool,
    /// UDP length disagrees with the IP payload length.
    pub udp_length_mismatch: bool,
    /// The UDP checksum, classified (only when the datagram is whole).
    pub udp_checksum: Option<UdpChecksum>,
    /// IPv4 identification (None for IPv6).
    pub ipv4_ident: Option<u16>,
}

impl<'a> Datagram<'a> {
    /// Split an IPv4 or IPv6 datagram carrying UDP.
    ///
    /// Fails when the buffer is not IP, the IP header is cut, or the next
    /// protocol is not UDP (an IPv6 extension header before UDP counts as
    /// not UDP). A datagram cut short by a capture parses with `truncated`.
    pub fn parse(buf: &'a [u8]) -> Result<Datagram<'a>> {
        let version = buf.first().map(|b| b >> 4);
        let (src, dst, ip_len, ip_payload_len, next, bad_csum, fragment, ident) = match version {
            Some(4) => {
                let h = Ipv4Header::new_checked(buf)?;
                let hl = h.header_len();
                let total = h.total_len() as usize;
                if total < hl {
                    return Err(Error::BadIpHeader("IPv4"));
                }
                (
                    IpAddr::V4(h.src()),
                    IpAddr::V4(h.dst()),
                    hl,
                    total - hl,
                    h.protocol(),
                    !h.checksum_ok(),
                    h.more_frags() || h.frag_offset() != 0,
                    Some(h.ident()),
                )
            }
            Some(6) => {
                let h = Ipv6Header::new_checked(buf)?;
                (
                    IpAddr::V6(h.src()),
                    IpAddr::V6(h.dst()),
                    IPV6_HEADER_LEN,
                    h.payload_len() as usize,
                    h.next_header(),
                    false,
                    false,
                    None,
                )
            }
            _ => return Err(Error::NotRoce("not an IP datagram")),
        };
        if next != PROTO_UDP {
            return Err(Error::NotRoce("not UDP"));
        }
        let udp = UdpHeader::new_checked(&buf[ip_len..])?;
        let udp_len = udp.length() as usize;
        if udp_len < UDP_HEADER_LEN {
            return Err(Error::BadIpHeader("UDP"));
        }
        let payload_len = udp_len - UDP_HEADER_LEN;
        let start = ip_len + UDP_HEADER_LEN;
        let end = start + payload_len;
        let truncated = buf.len() < end;
        let payload = &buf[start..end.min(buf.len())];
        let udp_checksum = if truncated || fragment {
            None
        } else {
            let (s, d) = (addr_bytes(src), addr_bytes(dst));
            Some(classify_udp_checksum(
                &s[..addr_len(src)],
                &d[..addr_len(dst)],
                &buf[ip_len..end],
            ))
        };
        Ok(Datagram {
            src,
            dst,
            src_port: udp.src_port(),
            dst_port: udp.dst_port(),
            ip_header: &buf[..ip_len],
            udp_header: udp.header_bytes(),
            payload,
            payload_len,
            truncated,
            bad_ipv4_checksum: bad_csum,
            fragment,
            udp_length_mismatch: udp_len != ip_payload_len,
            udp_checksum,
            ipv4_ident: ident,
        })
    }

    /// Check the ICRC of the RoCEv2 payload; `None` when the capture cut it.
    pub fn check_icrc(&self) -> Option<Result<icrc::IcrcCheck>> {
        if self.truncated {
            None
        } else {
            Some(icrc::check(self.ip_header, self.udp_header, self.payload))
        }
    }
}

fn addr_bytes(a: IpAddr) -> [u8; 16] {
    let mut out = [0u8; 16];
    match a {
        IpAddr::V4(v) => out[..4].copy_from_slice(&v.octets()),
        IpAddr::V6(v) => out.copy_from_slice(&v.octets()),
    }
    out
}

fn addr_len(a: IpAddr) -> usize {
    if a.is_ipv4() {
        4
    } else {
        16
    }
}

/// The IP-level fields of a datagram to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpFields {
    /// IPv4 identification (0: what Linux sends from an unconnected DF socket).
    pub ipv4_ident: u16,
    /// IPv4 TOS / IPv6 traffic class (masked by the ICRC).
    pub tos: u8,
    /// TTL / hop limit (masked by the ICRC).
    pub ttl: u8,
    /// IPv6 flow label (masked by the ICRC).
    pub flow_label: u32,
}

impl Default for IpFields {
    fn default() -> Self {
        IpFields {
            ipv4_ident: 0,
            tos: 0,
            ttl: 64,
            flow_label: 0,
        }
    }
}

/// Build a whole IP + UDP + RoCEv2 datagram into `buf`, with the ICRC
/// computed over the headers actually written (IPv4 with DF set; UDP
/// checksum 0). `src` and `dst` must be of the same family. Returns its length.
pub fn build_datagram(
    buf: &mut [u8],
    src: IpAddr,
    dst: IpAddr,
    src_port: u16,
    dst_port: u16,
    fields: IpFields,
    packet: &PacketRepr<'_>,
) -> Result<usize> {
    let roce_len = packet.buffer_len();
    let udp_len = UDP_HEADER_LEN + roce_len;
    let ip_len = match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            Ipv4Repr {
                src: s,
                dst: d,
                tos: fields.tos,
                ident: fields.ipv4_ident,
                dont_frag: true,
                ttl: fields.ttl,
                payload_len: udp_len,
            }
            .emit(buf)?;
            IPV4_HEADER_LEN
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            Ipv6Repr {
                src: s,
                dst: d,
                traffic_class: fields.tos,
                flow_label: fields.flow_label,
                hop_limit: fields.ttl,
                payload_len: udp_len,
            }
            .emit(buf)?;
            IPV6_HEADER_LEN
        }
        _ => {
            return Err(Error::FieldRange(
                "source and destination address families differ",
            ))
        }
    };
    let total = ip_len + udp_len;
    if buf.len() < total {
        return Err(Error::BufferTooSmall {
            needed: total,
            available: buf.len(),
        });
    }
    UdpRepr {
        src_port,
        dst_port,
        payload_len: roce_len,
    }
    .emit(&mut buf[ip_len..])?;
    let start = ip_len + UDP_HEADER_LEN;
    let n = packet.emit(&mut buf[start..total])?;
    let (head, roce) = buf.split_at_mut(start);
    let c = icrc::compute(&head[..ip_len], &head[ip_len..], &roce[..n - ICRC_LEN])?;
    set_icrc(&mut roce[..n], c);
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BthRepr, ExtHeaders, Opcode, Psn};
    use std::net::{Ipv4Addr, Ipv6Addr};

    #[test]
    fn build_then_parse_v4_and_v6() {
        let payload = [9u8; 33];
        let r = PacketRepr {
            bth: BthRepr::new(Opcode::RcSendOnly, 0x42, Psn::new(3)),
            ext: ExtHeaders::NONE,
            payload: &payload,
        };
        for (s, d) in [
            (
                IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1)),
                IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)),
            ),
            (
                IpAddr::V6(Ipv6Addr::LOCALHOST),
                IpAddr::V6(Ipv6Addr::LOCALHOST),
            ),
        ] {
            let mut buf = [0u8; 256];
            let n = build_datagram(&mut buf, s, d, 0xc001, 4791, IpFields::default(), &r).unwrap();
            let dg = Datagram::parse(&buf[..n]).unwrap();
            assert_eq!((dg.src, dg.dst, dg.dst_port), (s, d, 4791));
            assert!(!dg.truncated && !dg.bad_ipv4_checksum && !dg.udp_length_mismatch);
            assert_eq!(dg.udp_checksum, Some(UdpChecksum::Zero));
            assert!(dg.check_icrc().unwrap().unwrap().ok());
            assert_eq!(PacketRepr::parse_bytes(dg.payload).unwrap(), r);
            // The Linux-socket shortcut agrees with the full header for IPv4 ID 0.
            let mut alone = [0u8; 128];
            let m = match (s, d) {
                (IpAddr::V4(s), IpAddr::V4(d)) => r.emit_ipv4_linux(&mut alone, s, d, 0xc001, 4791),
                (IpAddr::V6(s), IpAddr::V6(d)) => r.emit_ipv6(&mut alone, s, d, 0xc001, 4791),
                _ => unreachable!(),
            }
            .unwrap();
            assert_eq!(&alone[..m], dg.payload);
            // A cut datagram parses as truncated, without an ICRC verdict.
            let cut = Datagram::parse(&buf[..n - 3]).unwrap();
            assert!(cut.truncated && cut.check_icrc().is_none());
        }
    }
}
