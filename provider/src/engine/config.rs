//! What an engine and its QPs are created with: device limits and
//! identity, the ICRC policy, QP capabilities.

use super::{CqId, SrqId, XrcdId};
use crate::qp_attr::{Mtu, QpLimits, QpType};
use crate::types::PdId;
use std::net::IpAddr;

/// How received IPv4 packets' ICRCs are checked (IPv6 is always verified).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IcrcPolicy {
    /// Verify assuming the sender's IPv4 header is the one Linux emits for
    /// an unconnected don't-fragment UDP socket (identification 0), which is
    /// how roxe sends; drop on mismatch.
    AssumeLinuxSender,
    /// Verify as `AssumeLinuxSender`, but accept a mismatch that some IPv4
    /// identification and don't-fragment flag explain, counted in
    /// [`Stats::rx_icrc_unverified`](super::Stats::rx_icrc_unverified): peers such as rxe and mlx5 put
    /// non-zero identifications in their IPv4 headers, which a UDP socket
    /// never shows. Other mismatches are damage, dropped
    /// (`roxe_wire::icrc::UnseenIpv4Fields`).
    Warn,
    /// Do not verify IPv4 ICRCs.
    Off,
    /// The driver reads whole IP datagrams (a raw socket) and hands each
    /// packet to [`Engine::handle_ip_packet`](super::Engine::handle_ip_packet) with the headers it arrived
    /// under, which verifies the ICRC over them exactly (any IPv4
    /// identification). [`Engine::handle_packet`](super::Engine::handle_packet) alone then does not check
    /// IPv4 ICRCs: its caller has.
    WireHeaders,
}

/// Device-wide limits and identity.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// The device's address (its RoCEv2 GID).
    pub addr: IpAddr,
    /// Largest `max_send_wr`/`max_recv_wr` (rxe: 0x4000).
    pub max_qp_wr: u32,
    /// Largest `max_send_sge`/`max_recv_sge` (rxe: 32).
    pub max_sge: u32,
    /// Largest `max_inline_data` (rxe: 400... roxe allows a full 4 KiB MTU).
    pub max_inline: u32,
    /// Largest CQ depth.
    pub max_cqe: u32,
    /// Largest tag list of a tag-matching SRQ (`tm_caps.max_num_tags`).
    pub max_tm_tags: u32,
    /// Limits for QP attributes.
    pub qp_limits: QpLimits,
    /// ICRC check on received IPv4 packets.
    pub icrc_policy: IcrcPolicy,
    /// The UDP source ports the driver can send from (one socket each).
    /// A QP always leaves from the same one, `src_ports[p % len]` for its
    /// rxe-style port `p` = 0xC000 + its QPN's low 14 bits, so QPs spread
    /// over the pool as ECMP and RSS expect. Empty: that rxe-style port
    /// itself (the sans-IO tests). The ICRC covers the source port, so it
    /// must be the real one.
    pub src_ports: Vec<u16>,
    /// The port's active MTU (from the link; 4096 on loopback): the
    /// largest UD message, and what `ibv_query_port` reports.
    pub active_mtu: Mtu,
    /// The requester's window towards peers on this host's loopback may
    /// exceed rxe's 128 PSNs (`req/`): true where their only queues are
    /// UDP socket buffers; a driver receiving through a raw socket (beside
    /// the kernel's rxe, `ROXE_ICRC=raw`) keeps 128, since its peers there
    /// receive the same way and drop bursts the UDP path would hold.
    pub wide_loopback_window: bool,
    /// That wide window, in PSNs (at most 1,024): the driver sizes it by
    /// the receive buffer its socket got (`driver::socket`), since its
    /// peers on this host get the same `rmem_max` and a burst larger than
    /// their buffer is dropped whole. It bounds the device's QPs together
    /// as well as each (`Engine::loopback_unacked`).
    pub loopback_window: i32,
    /// The device's slot of the QPN space on a shared address (QPN bits
    /// 16..23; see `driver/steering`): its QPNs and CM communication IDs
    /// carry it, so that the kernel steers their packets to this process.
    /// 0: the address is not shared and QPNs start at 0x11 as on rxe.
    pub qpn_slot: u8,
    /// Loopback peers known to receive through a UDP socket even where
    /// `wide_loopback_window` is off: roxe devices beside rxe, reached at
    /// their claim port (`Engine::set_udp_peer`).
    pub udp_peers: Vec<IpAddr>,
    /// Selective recovery between roxe peers on this host (loopback
    /// peers; rxe and NICs are never there): a responder keeps the SEND
    /// and WRITE packets that arrive beyond a gap and replays them once
    /// it is filled (`resp/early.rs`), and a requester answers a sequence
    /// NAK by resending the missing packet alone instead of going back N
    /// (`Requester::resend_one`), unless the responder shows it keeps
    /// nothing (it lacks the packet after the one resent: an older roxe).
    /// Off: both sides speak plain go-back-N.
    pub keep_early: bool,
    /// A QP playing a WRITE ping-pong holds the ACK of each WRITE it
    /// receives until its own next request leaves, or a few turnarounds
    /// (`ack_hold.rs`): a peer polling memory then receives that request
    /// in the `poll_cq` that waits for the ACK. Off: ACKs go at once.
    pub hold_acks: bool,
}

/// The largest window towards loopback peers, in PSNs. There the only
/// queues are the two sockets' buffers, and rxe's 128 packets (512 KiB at
/// MTU 4096) do not cover the round trip through the peer's wake-up: 64
/// KiB WRITEs measured 2.08 GB/s at 128, 2.58 at 512, 2.87 at 1,024, 2.72
/// at 2,048 (alternated, one session, 8 MiB buffers).
pub const MAX_LOOPBACK_WINDOW: i32 = 1024;

impl EngineConfig {
    /// Whether a reliable QP towards `peer` sends under the wide window
    /// (`loopback_window`) rather than rxe's.
    pub(crate) fn uses_loopback_window(&self, peer: IpAddr) -> bool {
        peer.is_loopback() && (self.wide_loopback_window || self.udp_peers.contains(&peer))
    }

    /// Whether the loopback window also bounds the QPs' data-carrying
    /// requests together: where the socket buffers are small (the window
    /// sized below its maximum, e.g. a distribution's default `rmem_max`
    /// without CAP_NET_ADMIN), many QPs each sending a window overflow the
    /// peer's socket; with large buffers each QP keeps its own window.
    pub(crate) fn shares_window_for_data(&self) -> bool {
        self.loopback_window < MAX_LOOPBACK_WINDOW
    }

    /// Defaults for a device at `addr`.
    pub fn new(addr: IpAddr) -> Self {
        EngineConfig {
            addr,
            max_qp_wr: 0x4000,
            max_sge: 32,
            max_inline: 4096,
            // As mlx5 (libfabric's rxm asks for (rx + tx) × 256 entries); the
            // ring grows as completions wait, so the bound costs nothing.
            max_cqe: 0x3F_FFFF,
            max_tm_tags: 1023,
            qp_limits: QpLimits::default(),
            icrc_policy: IcrcPolicy::AssumeLinuxSender,
            src_ports: Vec::new(),
            active_mtu: Mtu::Mtu4096,
            wide_loopback_window: true,
            loopback_window: MAX_LOOPBACK_WINDOW,
            qpn_slot: 0,
            udp_peers: Vec::new(),
            keep_early: true,
            hold_acks: true,
        }
    }
}

/// Queue sizes a QP is created with (`struct ibv_qp_cap`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QpCap {
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// SGEs per send WR.
    pub max_send_sge: u32,
    /// SGEs per receive WR.
    pub max_recv_sge: u32,
    /// Inline bytes per send WR.
    pub max_inline_data: u32,
}

/// `struct ibv_qp_init_attr`, as the engine needs it.
///
/// An XRC_SEND QP has no receive side: its `recv_cq` is stored as its
/// `send_cq`. An XRC_RECV QP has neither PD nor CQs (each request's XRC
/// SRQ brings them): it is stored with `PdId(0)` and `CqId(0)`, which name
/// no object.
#[derive(Debug, Clone, Copy)]
pub struct QpInitAttr {
    /// Transport.
    pub qp_type: QpType,
    /// Protection domain.
    pub pd: PdId,
    /// CQ for send completions.
    pub send_cq: CqId,
    /// CQ for receive completions.
    pub recv_cq: CqId,
    /// Shared receive queue, if any.
    pub srq: Option<SrqId>,
    /// The XRC domain of an XRC_RECV QP.
    pub xrcd: Option<XrcdId>,
    /// Queue sizes.
    pub cap: QpCap,
    /// Every send WR generates a completion.
    pub sq_sig_all: bool,
}
