//! `ROXE_ICRC=raw`: receive RoCEv2 packets from an `AF_PACKET` socket, which
//! shows the IPv4 header as it was on the wire, so the ICRC can be verified
//! exactly whatever identification the sender wrote (rxe and NICs write
//! non-zero ones, which a UDP socket never shows).
//!
//! The socket is `SOCK_DGRAM` bound to `ETH_P_IP` on every interface
//! (ifindex 0): a read starts at the IPv4 header. Every interface, not the
//! one owning the address: Linux routes traffic between two local addresses
//! through `lo` even when they belong to `eth0`, so a socket bound to `eth0`
//! would miss a local peer. A protocol-specific packet socket sees each
//! received packet once, on the device it is finally delivered on, and
//! never the host's own transmissions (those go to `ETH_P_ALL` taps only);
//! an outgoing copy would still be dropped (filter and [`RawBatch::get`]).
//!
//! A classic BPF filter (`SO_ATTACH_FILTER`) keeps only IPv4 UDP packets to
//! the device's address and port 4791, so the socket costs nothing for other
//! traffic. It is attached before the socket is bound (created with protocol
//! 0, a packet socket receives nothing), so no unfiltered packet is queued.
//! Non-first fragments are dropped by the filter (they carry no UDP header);
//! first fragments reach [`split`] and are counted.

use roxe_wire::ip::{Ipv4Header, UdpHeader, PROTO_UDP, UDP_HEADER_LEN};
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use super::batch::{PageAligned, MAX_BATCH, RX_SLOT};

/// Opening the raw socket was refused for want of `CAP_NET_RAW`. The
/// [`io::Error`] `Device::open` returns carries it (kind
/// `PermissionDenied`); its `source()` is the OS error (`EPERM`).
#[derive(Debug, thiserror::Error)]
#[error(
    "ROXE_ICRC=raw needs CAP_NET_RAW (it receives from an AF_PACKET socket); \
     run as root, or `setcap cap_net_raw+ep` the program, or use ROXE_ICRC=warn: {source}"
)]
pub struct NeedsCapNetRaw {
    #[source]
    source: io::Error,
}

/// Snap length the filter accepts: whole packets (a read longer than the
/// buffer is truncated and counted).
const SNAP: u32 = 0x0004_0000;

/// The classic BPF program: IPv4, UDP, to `addr`, not a non-first
/// fragment, UDP destination port `port`, not an outgoing copy.
fn filter(addr: Ipv4Addr, port: u16) -> [socket2::SockFilter; 16] {
    use libc::{
        BPF_ABS, BPF_ALU, BPF_AND, BPF_B, BPF_H, BPF_IND, BPF_JEQ, BPF_JMP, BPF_JSET, BPF_K,
        BPF_LD, BPF_LDX, BPF_MSH, BPF_RET, BPF_W,
    };
    use socket2::SockFilter as F;
    const DROP: u8 = 15;
    let code = |c: u32| c as u16;
    // A jump at index `i` to the drop instruction (offsets are relative to
    // the next instruction).
    let to_drop = |i: u8| DROP - i - 1;
    let ad_pkttype = (libc::SKF_AD_OFF + libc::SKF_AD_PKTTYPE) as u32;
    [
        /* 0 */ F::new(code(BPF_LD | BPF_B | BPF_ABS), 0, 0, ad_pkttype),
        /* 1 */
        F::new(
            code(BPF_JMP | BPF_JEQ | BPF_K),
            to_drop(1),
            0,
            u32::from(libc::PACKET_OUTGOING),
        ),
        /* 2 */ F::new(code(BPF_LD | BPF_B | BPF_ABS), 0, 0, 0),
        /* 3 */ F::new(code(BPF_ALU | BPF_AND | BPF_K), 0, 0, 0xF0),
        /* 4 */ F::new(code(BPF_JMP | BPF_JEQ | BPF_K), 0, to_drop(4), 0x40),
        /* 5 */ F::new(code(BPF_LD | BPF_B | BPF_ABS), 0, 0, 9),
        /* 6 */
        F::new(
            code(BPF_JMP | BPF_JEQ | BPF_K),
            0,
            to_drop(6),
            u32::from(PROTO_UDP),
        ),
        /* 7 */ F::new(code(BPF_LD | BPF_W | BPF_ABS), 0, 0, 16),
        /* 8 */
        F::new(
            code(BPF_JMP | BPF_JEQ | BPF_K),
            0,
            to_drop(8),
            u32::from(addr),
        ),
        /* 9 */ F::new(code(BPF_LD | BPF_H | BPF_ABS), 0, 0, 6),
        /* 10: fragment offset non-zero */
        F::new(code(BPF_JMP | BPF_JSET | BPF_K), to_drop(10), 0, 0x1FFF),
        /* 11: X = IHL * 4 */ F::new(code(BPF_LDX | BPF_B | BPF_MSH), 0, 0, 0),
        /* 12: UDP destination port */ F::new(code(BPF_LD | BPF_H | BPF_IND), 0, 0, 2),
        /* 13 */ F::new(code(BPF_JMP | BPF_JEQ | BPF_K), 0, 1, u32::from(port)),
        /* 14 */ F::new(code(BPF_RET | BPF_K), 0, 0, SNAP),
        /* 15 = DROP */ F::new(code(BPF_RET | BPF_K), 0, 0, 0),
    ]
}

/// Open the raw receive socket of a device at `addr`, receiving packets to
/// UDP `port` (non-blocking). Fails with [`NeedsCapNetRaw`] inside a
/// `PermissionDenied` error without `CAP_NET_RAW`.
pub(crate) fn open(addr: Ipv4Addr, port: u16) -> io::Result<OwnedFd> {
    use rustix::net::{AddressFamily, SocketFlags, SocketType};
    let fd = rustix::net::socket_with(
        AddressFamily::PACKET,
        SocketType::DGRAM,
        SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
        None, // protocol 0: nothing is received until `bind` below
    )
    .map_err(|e| {
        let source = io::Error::from(e);
        if matches!(e, rustix::io::Errno::PERM | rustix::io::Errno::ACCESS) {
            io::Error::new(io::ErrorKind::PermissionDenied, NeedsCapNetRaw { source })
        } else {
            io::Error::new(
                source.kind(),
                format!("ROXE_ICRC=raw: opening an AF_PACKET socket: {source}"),
            )
        }
    })?;
    let sock = socket2::Socket::from(fd);
    sock.attach_filter(&filter(addr, port))?;
    // As for the UDP socket (see socket.rs): the forced size needs
    // CAP_NET_ADMIN, the plain one is capped at rmem_max.
    if rustix::net::sockopt::set_socket_recv_buffer_size_force(&sock, 8 << 20).is_err() {
        sock.set_recv_buffer_size(8 << 20)?;
    }
    // SAFETY: all-zero is a valid sockaddr_ll.
    let mut ll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    ll.sll_family = libc::AF_PACKET as libc::c_ushort;
    ll.sll_protocol = (libc::ETH_P_IP as u16).to_be();
    ll.sll_ifindex = 0; // every interface (see the module documentation)
                        // SAFETY: `sock` is an open socket for the duration of the call; `ll` is
                        // a live, initialised sockaddr_ll and its exact size is passed.
    let rc = unsafe {
        libc::bind(
            sock.as_raw_fd(),
            (&ll as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(sock.into())
}

/// A RoCEv2 packet cut out of an IPv4 packet: the IP header (with
/// options), the UDP header and the UDP payload (BTH .. ICRC).
pub(crate) type Split<'a> = (&'a [u8], &'a [u8], &'a [u8]);

/// Cut a packet read from the raw socket into its headers and RoCEv2
/// payload, or `None` if it is not a whole, unfragmented IPv4 UDP datagram
/// to `own`:`port` with a correct IPv4 header checksum (what the kernel's
/// IP layer would have dropped or reassembled before a UDP socket saw it).
/// Bytes after the IPv4 total length (Ethernet padding) are ignored.
pub(crate) fn split(pkt: &[u8], own: Ipv4Addr, port: u16) -> Option<Split<'_>> {
    let h = Ipv4Header::new_checked(pkt).ok()?;
    let hl = h.header_len();
    let total = usize::from(h.total_len());
    if total > pkt.len()
        || total < hl + UDP_HEADER_LEN
        || h.protocol() != PROTO_UDP
        || h.dst() != own
        || h.more_frags()
        || h.frag_offset() != 0
        || !h.checksum_ok()
    {
        return None;
    }
    let udp = UdpHeader::new_checked(&pkt[hl..total]).ok()?;
    if udp.dst_port() != port || usize::from(udp.length()) != total - hl {
        return None;
    }
    Some((
        h.header_bytes(),
        udp.header_bytes(),
        &pkt[hl + UDP_HEADER_LEN..total],
    ))
}

/// Why [`RawBatch::get`] gives no packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RawSkip {
    /// Longer than the buffer.
    Truncated,
    /// A copy of a packet this host sent (not expected with `ETH_P_IP`).
    Outgoing,
}

/// The raw socket's receive pool: [`MAX_BATCH`] buffers of [`RX_SLOT`]
/// bytes and the `recvmmsg` headers pointing into them, built once (as
/// `batch::RxBatch`).
///
/// Not `Send` (raw pointers): it lives on the progress thread. The pointers
/// in `hdrs` point into `pool`, `iovs` and `names`, heap allocations owned
/// by the struct that never move or shrink.
pub(crate) struct RawBatch {
    pool: PageAligned,
    hdrs: Box<[libc::mmsghdr]>,
    iovs: Box<[libc::iovec]>,
    names: Box<[libc::sockaddr_ll]>,
    n: usize,
}

impl RawBatch {
    pub(crate) fn new() -> RawBatch {
        // SAFETY: all-zero is a valid value of these plain C structs.
        let zero_hdr: libc::mmsghdr = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let zero_iov: libc::iovec = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let zero_name: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        let mut rx = RawBatch {
            pool: PageAligned::zeroed(MAX_BATCH * RX_SLOT),
            hdrs: vec![zero_hdr; MAX_BATCH].into_boxed_slice(),
            iovs: vec![zero_iov; MAX_BATCH].into_boxed_slice(),
            names: vec![zero_name; MAX_BATCH].into_boxed_slice(),
            n: 0,
        };
        for (k, chunk) in rx.pool.chunks_exact_mut(RX_SLOT).enumerate() {
            rx.iovs[k] = libc::iovec {
                iov_base: chunk.as_mut_ptr().cast(),
                iov_len: RX_SLOT,
            };
            let h = &mut rx.hdrs[k].msg_hdr;
            h.msg_name = (&mut rx.names[k] as *mut libc::sockaddr_ll).cast();
            h.msg_iov = &mut rx.iovs[k];
            h.msg_iovlen = 1;
            Self::reset(h);
        }
        rx
    }

    /// The in/out fields the kernel overwrites.
    fn reset(h: &mut libc::msghdr) {
        h.msg_namelen = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
        h.msg_flags = 0;
    }

    /// Receive what is queued, up to [`MAX_BATCH`] packets, without
    /// blocking. `Ok(0)`: nothing to read.
    pub(crate) fn recv(&mut self, sock: &impl AsFd) -> io::Result<usize> {
        for h in &mut self.hdrs[..self.n.max(1)] {
            Self::reset(&mut h.msg_hdr);
        }
        self.n = 0;
        // SAFETY: every msghdr points at memory of the stated sizes owned by
        // `self` (a pool slot through its iovec, a sockaddr_ll; see the
        // struct), exclusively borrowed for the call; no control buffer.
        let rc = unsafe { super::batch::recv_many(sock.as_fd(), &mut self.hdrs) }?;
        self.n = rc;
        Ok(rc)
    }

    /// The `k`th packet of the last [`recv`](Self::recv), from its IP
    /// header on, unless it was truncated or is an outgoing copy.
    pub(crate) fn get(&self, k: usize) -> Result<&[u8], RawSkip> {
        assert!(k < self.n);
        let h = &self.hdrs[k];
        if self.names[k].sll_pkttype == libc::PACKET_OUTGOING {
            return Err(RawSkip::Outgoing);
        }
        if h.msg_hdr.msg_flags & libc::MSG_TRUNC != 0 {
            return Err(RawSkip::Truncated);
        }
        let start = k * RX_SLOT;
        Ok(&self.pool[start..start + (h.msg_len as usize).min(RX_SLOT)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use roxe_wire::ip::{Ipv4Repr, UdpRepr};

    fn datagram(dst: Ipv4Addr, port: u16, frag: bool, pad: usize) -> Vec<u8> {
        let payload = 24;
        let mut b = vec![0u8; 20 + 8 + payload + pad];
        Ipv4Repr {
            src: Ipv4Addr::new(127, 0, 0, 9),
            dst,
            tos: 0,
            ident: 0x1234,
            dont_frag: !frag,
            ttl: 64,
            payload_len: 8 + payload,
        }
        .emit(&mut b)
        .unwrap();
        if frag {
            b[6] |= 0x20; // more fragments
            b[10] = 0;
            b[11] = 0;
            let c = !roxe_wire::ip::ones_complement_sum(&b[..20], 0);
            b[10..12].copy_from_slice(&c.to_be_bytes());
        }
        UdpRepr {
            src_port: 4791,
            dst_port: port,
            payload_len: payload,
        }
        .emit(&mut b[20..])
        .unwrap();
        b
    }

    #[test]
    fn split_keeps_whole_datagrams_to_the_device() {
        let own = Ipv4Addr::new(127, 0, 0, 1);
        let d = datagram(own, 4791, false, 6);
        let (ip, udp, p) = split(&d, own, 4791).unwrap();
        assert_eq!((ip.len(), udp.len(), p.len()), (20, 8, 24), "padding cut");
        assert!(split(&d, Ipv4Addr::new(127, 0, 0, 2), 4791).is_none());
        assert!(split(&datagram(own, 4792, false, 0), own, 4791).is_none());
        assert!(split(&datagram(own, 4791, true, 0), own, 4791).is_none());
        assert!(split(&d[..40], own, 4791).is_none(), "cut short");
        let mut bad = d.clone();
        bad[10] ^= 1;
        assert!(split(&bad, own, 4791).is_none(), "IPv4 header checksum");
    }
}
