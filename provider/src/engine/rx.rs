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
            .touch(qpn, |q, cx| q.on_packet(cx, now, src, &pkt))
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
    /// [`Stats::rx_bad_icrc`]. The rest is [`handle_packet`](Self::handle_packet)
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
        // A Linux sender's IPv4 identification: 0 for one datagram, k for
        // segment k of a GSO send (which GRO hands over in order).
        let linux_ipv4 = |s, d| {
            let idents = [u16::try_from(gro_index).unwrap_or(0), 0];
            let n = if gro_index == 0 { 1 } else { 2 };
            idents[..n].iter().any(|&id| {
                icrc::compute_ipv4(s, d, src_port, port, id, body).is_ok_and(|c| c == pkt.icrc())
            })
        };
        let want = match (src, self.config.addr) {
            (IpAddr::V4(s), IpAddr::V4(d)) => match policy {
                IcrcPolicy::Off => return true,
                // Verified over the real headers by `handle_ip_packet`.
                IcrcPolicy::WireHeaders => return true,
                IcrcPolicy::Warn => {
                    if !linux_ipv4(s, d) {
                        self.stats.rx_icrc_unverified += 1;
                    }
                    return true;
                }
                IcrcPolicy::AssumeLinuxSender => return linux_ipv4(s, d),
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
