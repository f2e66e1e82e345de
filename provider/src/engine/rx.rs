//! Receive: parse, ICRC policy, QP1 for the CM, and dispatch to the QP a
//! packet names (which admits it or counts why not).

use super::{gid_of, DropReason, Engine, IcrcPolicy, Nanos};
use roxe_wire::{icrc, Packet};
use std::net::{IpAddr, Ipv6Addr};

impl Engine {
    /// Handle one received RoCEv2 UDP payload (BTH .. ICRC) from `src`.
    pub fn handle_packet(&mut self, now: Nanos, src: IpAddr, src_port: u16, bytes: &[u8]) {
        self.handle_segment(now, src, src_port, bytes, 0);
    }

    /// [`handle_packet`](Self::handle_packet) for packet `index` of a
    /// datagram UDP GRO coalesced: from a Linux sender's GSO send it
    /// carried IPv4 identification `index` (from separate sends, 0), and
    /// the ICRC is checked for both.
    pub fn handle_segment(
        &mut self,
        now: Nanos,
        src: IpAddr,
        src_port: u16,
        bytes: &[u8],
        index: usize,
    ) {
        let policy = self.config.icrc_policy;
        self.handle_segment_under(policy, now, src, src_port, bytes, index);
    }

    /// [`handle_segment`](Self::handle_segment) for a packet a roxe device
    /// on this host sent straight to this device's UDP socket (beside rxe,
    /// at its claim port, see the driver's `DirectPeers`): the sender is
    /// Linux, so its IPv4 ICRC is checked exactly (identification 0, or
    /// `index` of a GSO send) whatever the policy says of raw packets;
    /// only [`IcrcPolicy::Off`] skips it.
    pub fn handle_direct_segment(
        &mut self,
        now: Nanos,
        src: IpAddr,
        src_port: u16,
        bytes: &[u8],
        index: usize,
    ) {
        let policy = match self.config.icrc_policy {
            IcrcPolicy::Off => IcrcPolicy::Off,
            _ => IcrcPolicy::AssumeLinuxSender,
        };
        self.handle_segment_under(policy, now, src, src_port, bytes, index);
    }

    fn handle_segment_under(
        &mut self,
        policy: IcrcPolicy,
        now: Nanos,
        src: IpAddr,
        src_port: u16,
        bytes: &[u8],
        index: usize,
    ) {
        self.clock = self.clock.max(now);
        self.stats.rx_packets += 1;
        let Ok(pkt) = Packet::new_checked(bytes) else {
            self.stats.count_drop(DropReason::Malformed, None);
            return;
        };
        if !self.icrc_ok(policy, src, src_port, &pkt, index) {
            self.stats.count_drop(DropReason::BadIcrc, None);
            return;
        }
        let qpn = pkt.bth().dest_qp();
        tracing::trace!(
            qpn = format_args!("{qpn:#x}"),
            opcode = %pkt.opcode(),
            psn = %pkt.bth().psn(),
            len = bytes.len(),
            %src,
            "packet received"
        );
        if qpn == roxe_wire::cm::GSI_QPN {
            self.gsi_receive(now, src, &pkt);
            return;
        }
        if self
            .drive_and_schedule(qpn, |q, cx| q.on_packet(cx, now, src, &pkt))
            .is_none()
        {
            self.stats.count_drop(DropReason::NoQp, None);
        }
    }

    /// Handle one received RoCEv2 UDP payload (BTH .. ICRC) with the IP
    /// header (IPv4 with options, or IPv6) and the UDP header it arrived
    /// under, as a raw-socket driver reads them. The ICRC is verified over
    /// those headers as they were on the wire (IPv4 identification, flags
    /// and all), whatever the policy; a mismatch is dropped and counted in
    /// [`Stats::rx_bad_icrc`](super::Stats::rx_bad_icrc). The rest is [`handle_packet`](Self::handle_packet)
    /// (use [`IcrcPolicy::WireHeaders`], so that it does not check again).
    pub fn handle_ip_packet(
        &mut self,
        now: Nanos,
        ip_header: &[u8],
        udp_header: &[u8],
        bytes: &[u8],
    ) {
        let src = match ip_header.first().map(|b| b >> 4) {
            Some(4) => roxe_wire::ip::Ipv4Header::new_checked(ip_header)
                .ok()
                .map(|h| IpAddr::V4(h.src())),
            Some(6) => roxe_wire::ip::Ipv6Header::new_checked(ip_header)
                .ok()
                .map(|h| IpAddr::V6(h.src())),
            _ => None,
        };
        let udp = roxe_wire::ip::UdpHeader::new_checked(udp_header).ok();
        let (Some(src), Some(udp)) = (src, udp) else {
            self.stats.rx_packets += 1;
            self.stats.count_drop(DropReason::Malformed, None);
            return;
        };
        // A malformed packet is left to `handle_packet` to count.
        if Packet::new_checked(bytes).is_ok()
            && !icrc::check(ip_header, udp_header, bytes).is_ok_and(|c| c.ok())
        {
            self.stats.rx_packets += 1;
            self.stats.count_drop(DropReason::BadIcrc, None);
            return;
        }
        self.handle_packet(now, src, udp.src_port(), bytes);
    }

    fn icrc_ok(
        &mut self,
        policy: IcrcPolicy,
        src: IpAddr,
        src_port: u16,
        pkt: &Packet<&[u8]>,
        gro_index: usize,
    ) -> bool {
        let body = pkt.icrc_covered();
        let port = roxe_wire::ROCEV2_PORT;
        let want = match (src, self.config.addr) {
            (IpAddr::V4(s), IpAddr::V4(d)) => match policy {
                IcrcPolicy::Off => return true,
                // Verified over the real headers by `handle_ip_packet`.
                IcrcPolicy::WireHeaders => return true,
                IcrcPolicy::Warn | IcrcPolicy::AssumeLinuxSender => {
                    // One CRC, for identification 0 with DF set (a Linux
                    // sender's datagram); the rest are deltas.
                    let Ok(c0) = self.icrc_prefixes.icrc(s, d, src_port, port, &[body]) else {
                        return false;
                    };
                    let diff = c0 ^ pkt.icrc();
                    if diff == 0 {
                        return true;
                    }
                    let fields = self
                        .unseen_ipv4
                        .get_or_make(body.len(), icrc::UnseenIpv4Fields::new);
                    // Segment k of a Linux sender's GSO send (GRO hands
                    // them over in order) carries identification k.
                    let k = u16::try_from(gro_index).unwrap_or(0);
                    if k != 0 && diff == fields.ident_delta(0, k) {
                        return true;
                    }
                    // rxe and NICs number their datagrams, which a UDP
                    // socket does not show: accept what some
                    // identification (and DF either way) explains, drop
                    // the rest: damaged whatever the header was.
                    if policy == IcrcPolicy::Warn && fields.explains(diff) {
                        self.stats.rx_icrc_unverified += 1;
                        return true;
                    }
                    return false;
                }
            },
            (IpAddr::V6(s), IpAddr::V6(d)) => icrc::compute_ipv6(s, d, src_port, port, body),
            _ => return false,
        };
        want.is_ok_and(|c| c == pkt.icrc())
    }
}

/// The GRH area a UD receive buffer starts with (IBA A17.4.5.2): the
/// IPv6 header, or 20 zero bytes and then the IPv4 header.
pub(super) fn grh_area(src: IpAddr, local: IpAddr, udp_payload_len: usize) -> [u8; 40] {
    let mut g = [0u8; 40];
    let udp_len = 8 + udp_payload_len;
    match (src, local) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let _ = roxe_wire::ip::Ipv4Repr {
                src: s,
                dst: d,
                tos: 0,
                ident: 0,
                dont_frag: true,
                ttl: 64,
                payload_len: udp_len,
            }
            .emit(&mut g[20..]);
        }
        (s, d) => {
            let _ = roxe_wire::ip::Ipv6Repr {
                src: Ipv6Addr::from(gid_of(s)),
                dst: Ipv6Addr::from(gid_of(d)),
                traffic_class: 0,
                flow_label: 0,
                hop_limit: 64,
                payload_len: udp_len,
            }
            .emit(&mut g);
        }
    }
    g
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{EngineConfig, IcrcPolicy};
    use roxe_wire::{BthRepr, ExtHeaders, Opcode, PacketRepr, Psn};
    use std::net::Ipv4Addr;

    const SRC: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 1);
    const DST: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);

    /// A SEND to QP 0x99 (none exists: a packet that passes the ICRC is
    /// then dropped as NoQp), its ICRC computed for IPv4 identification
    /// `ident`.
    fn packet(ident: u16) -> Vec<u8> {
        let payload = [0x5Au8; 1024];
        let r = PacketRepr {
            bth: BthRepr::new(Opcode::RcSendOnly, 0x99, Psn::new(7)),
            ext: ExtHeaders::NONE,
            payload: &payload,
        };
        let mut buf = vec![0u8; 2048];
        let n = r.emit_ipv4_linux(&mut buf, SRC, DST, 0xC000, 4791).unwrap();
        buf.truncate(n);
        let body = n - roxe_wire::ICRC_LEN;
        let c = icrc::compute_ipv4(SRC, DST, 0xC000, 4791, ident, &buf[..body]).unwrap();
        roxe_wire::packet::set_icrc(&mut buf, c);
        buf
    }

    fn engine(policy: IcrcPolicy) -> Engine {
        let mut config = EngineConfig::new(IpAddr::V4(DST));
        config.icrc_policy = policy;
        Engine::new(config)
    }

    fn drops(e: &Engine) -> (u64, u64, u64) {
        let s = e.stats();
        (
            s.drops.get(DropReason::NoQp),
            s.drops.get(DropReason::BadIcrc),
            s.rx_icrc_unverified,
        )
    }

    #[test]
    fn warn_accepts_any_identification_but_drops_damage() {
        let mut e = engine(IcrcPolicy::Warn);
        let from = IpAddr::V4(SRC);
        e.handle_packet(0, from, 0xC000, &packet(0));
        assert_eq!(drops(&e), (1, 0, 0), "identification 0: verified");
        // rxe's and NICs' datagrams carry identifications a UDP socket
        // does not show: accepted, counted.
        e.handle_packet(0, from, 0xC000, &packet(12345));
        assert_eq!(drops(&e), (2, 0, 1));
        // Segment 3 of a GSO send: identification 3, verified exactly.
        e.handle_segment(0, from, 0xC000, &packet(3), 3);
        assert_eq!(drops(&e), (3, 0, 1));
        // A payload bit flipped: no identification explains it.
        let mut bad = packet(12345);
        bad[100] ^= 0x10;
        e.handle_packet(0, from, 0xC000, &bad);
        assert_eq!(drops(&e), (3, 1, 1));
        // So is a packet from another source port than it was signed for.
        e.handle_packet(0, from, 0xC001, &packet(0));
        assert_eq!(drops(&e), (3, 2, 1));
    }

    #[test]
    fn assuming_a_linux_sender_accepts_only_its_identifications() {
        let mut e = engine(IcrcPolicy::AssumeLinuxSender);
        let from = IpAddr::V4(SRC);
        e.handle_packet(0, from, 0xC000, &packet(0));
        e.handle_segment(0, from, 0xC000, &packet(5), 5);
        e.handle_segment(0, from, 0xC000, &packet(0), 5);
        assert_eq!(drops(&e), (3, 0, 0));
        e.handle_packet(0, from, 0xC000, &packet(12345));
        e.handle_segment(0, from, 0xC000, &packet(6), 5);
        assert_eq!(drops(&e), (3, 2, 0));
    }
}
