//! Batched datagram I/O on the device socket, with preallocated buffers so
//! the steady state allocates nothing per packet.
//!
//! Transmit: the engine writes each packet of a progress pass straight into
//! [`TxBatch`]'s arena (one after the other, contiguous); [`TxBatch::flush`]
//! hands the whole pass to the kernel with one `sendmmsg(2)` per up to
//! [`MAX_BATCH`] packets per socket (the packets grouped by socket first,
//! each socket's in order). With UDP GSO enabled (see [`TxBatch::new`])
//! runs of consecutive equal-size packets from one socket to one
//! destination ((`tx::gso_run`)) become one message with a `UDP_SEGMENT` control message; the
//! first refusal (`EIO`, `EINVAL`, ...) turns GSO off for good and is counted.
//!
//! GSO is wire-exact: the kernel builds the segments itself and gives them
//! IPv4 identifications 0, 1, 2, ... (`inet_gso_segment`, for an
//! unconnected socket with DF set), and the RoCEv2 ICRC covers the
//! identification, so [`TxBatch::flush`] signs segment `k` for
//! identification `k` (the engine signs every packet for 0, the value of a
//! single datagram). Wherever the kernel cuts the send (on the way out of
//! a NIC or veth, or on the receiving socket), every segment is exactly
//! the packet rxe or a NIC expects. On `lo` a capture sees the uncut send
//! (`roxe capture` cuts it as the kernel will; `ROXE_PCAP` records the
//! individual packets). No GSO to loopback peers where they may read
//! through raw sockets (beside rxe, `ROXE_ICRC=raw`): those see it uncut.
//! A receiver with GRO gets such a send back as one buffer; packet `k` is
//! checked for identification `k` or 0 (`Engine::handle_segment`).
//!
//! Receive: [`RxBatch::recv`] takes up to [`MAX_BATCH`] datagrams with one
//! `recvmmsg(2)` into a preallocated pool.
//!
//! `tx.rs` holds the transmit arena, `rx.rs` the receive pool, `direct.rs`
//! the peers reached at their claim port beside rxe, `pages.rs` the
//! page-aligned buffers both pools live in (why: its documentation).

mod direct;
mod pages;
mod rx;
mod tx;

pub(crate) use direct::DirectPeers;
pub(crate) use pages::PageAligned;
pub(crate) use rx::recv_many;
pub(crate) use rx::RxBatch;
use std::time::Duration;
pub(crate) use tx::TxBatch;

/// Packets (transmit) or datagrams (receive) per system call.
pub(crate) const MAX_BATCH: usize = 64;
/// Room the engine gets for one packet: 4096 B of data plus headers.
pub(crate) const TX_SLOT: usize = 4096 + 128;
/// Receive buffer per datagram: larger than any RoCEv2 packet (4 KiB MTU);
/// a longer datagram is truncated by the kernel and counted as an error.
pub(crate) const RX_SLOT: usize = 9216;
/// Most segments in one GSO send (the kernel's `UDP_MAX_SEGMENTS`).
pub(crate) const MAX_GSO_SEGMENTS: usize = 64;
/// Most payload bytes in one GSO send: the largest IPv4 UDP payload
/// (65535 - 20 - 8).
pub(crate) const MAX_GSO_BYTES: usize = 65507;
/// How long a send waits for socket buffer space before the remaining
/// packets are counted as dropped (retransmission recovers them).
const SEND_WAIT: Duration = Duration::from_millis(10);
/// linux/udp.h (not in the libc crate for Linux).
const UDP_SEGMENT: libc::c_int = 103;
/// linux/udp.h: the socket option and the control message giving the
/// segment size of a coalesced datagram.
pub(crate) const UDP_GRO: libc::c_int = 104;
/// Receive buffer per datagram with UDP GRO: a whole coalesced datagram.
const RX_SLOT_GRO: usize = 65536;

/// A control message carrying `UDP_SEGMENT`: `cmsghdr` then the 16-bit
/// segment size, padded to `CMSG_SPACE(2)`.
#[repr(C)]
#[derive(Clone, Copy)]
struct GsoCmsg {
    hdr: libc::cmsghdr,
    data: [u8; 8],
}

impl GsoCmsg {
    // SAFETY: all-zero is a valid cmsghdr.
    const EMPTY: GsoCmsg = unsafe { std::mem::zeroed() };

    fn new(seg: u16) -> GsoCmsg {
        let mut c = GsoCmsg::EMPTY;
        c.hdr.cmsg_level = libc::SOL_UDP;
        c.hdr.cmsg_type = UDP_SEGMENT;
        // SAFETY: CMSG_LEN is pure arithmetic.
        c.hdr.cmsg_len = unsafe { libc::CMSG_LEN(2) } as _;
        c.data[..2].copy_from_slice(&seg.to_ne_bytes());
        c
    }
}

// The layout CMSG_DATA/CMSG_SPACE expect.
// SAFETY (both): CMSG_SPACE/CMSG_LEN are pure arithmetic.
const _: () = assert!(std::mem::size_of::<GsoCmsg>() == unsafe { libc::CMSG_SPACE(2) } as usize);
const _: () = assert!(std::mem::offset_of!(GsoCmsg, data) == unsafe { libc::CMSG_LEN(0) } as usize);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::PayloadAt;
    use std::net::IpAddr;
    use std::time::Instant;

    fn pair() -> (std::net::UdpSocket, std::net::UdpSocket) {
        // The device sockets' options (DF, 8 MiB buffers, non-blocking).
        let lo = "127.0.0.1".parse().unwrap();
        (
            super::super::socket::bind(lo, 0).unwrap(),
            super::super::socket::bind(lo, 0).unwrap(),
        )
    }

    fn exchange(gso: bool, gro: bool) {
        let (a, b) = pair();
        // A second sending socket: packets 40..60 and every 7th leave from
        // it, interleaved with the first's in the batch.
        let a2 = super::super::socket::bind("127.0.0.1".parse().unwrap(), 0).unwrap();
        let sock_of = |i: usize| u8::from((40..60).contains(&i) || i % 7 == 3);
        let from = [a.local_addr().unwrap(), a2.local_addr().unwrap()];
        if gro {
            super::super::socket::enable_gro(&b).unwrap();
        }
        let port = b.local_addr().unwrap().port();
        let socks = [&a, &a2];
        let mut tx = TxBatch::new(port, gso);
        let dst: IpAddr = "127.0.0.1".parse().unwrap();
        // 100 packets: more than one batch; equal sizes with a short one
        // every 10th, so GSO runs end early.
        let sizes: Vec<usize> = (0..100)
            .map(|i| if i % 10 == 9 { 50 + i } else { 1000 })
            .collect();
        // Every third full-size packet has its payload (bytes 16..996)
        // sent by reference from a registered region, between a head and
        // a tail in the arena, inside GSO runs with copied packets.
        let mut memory = crate::memory::MemoryTable::new();
        let pd = crate::types::PdId(1);
        let region = memory
            .register_owned(pd, 100 * 1000, crate::types::AccessFlags::LOCAL_WRITE)
            .unwrap();
        for i in 0..100 {
            memory
                .owned_write(region.lkey, i * 1000, &[i as u8; 1000])
                .unwrap();
        }
        let by_ref = |i: usize| i % 3 == 1 && sizes[i] == 1000;
        for (i, &len) in sizes.iter().enumerate() {
            if tx.is_full() {
                tx.flush(&socks);
            }
            let s = tx.slot();
            s[..len].fill(i as u8);
            s[..4].copy_from_slice(&(i as u32).to_be_bytes());
            // Where a BTH has its destination QPN: one QP's (a GSO run
            // never crosses QPN slots).
            s[4..8].copy_from_slice(&0x11u32.to_be_bytes());
            let k = sock_of(i);
            let payload = by_ref(i).then(|| {
                let sge = crate::memory::Sge {
                    addr: region.addr,
                    length: region.length as u32,
                    lkey: region.lkey,
                };
                let data = memory.gather_ref(pd, &[sge], i * 1000 + 16, 980);
                // The tail (bytes 996..1000) follows the head in the arena.
                s.copy_within(996..1000, 16);
                PayloadAt {
                    at: 16,
                    data: data.unwrap().unwrap(),
                }
            });
            tx.commit(len, dst, k, payload);
        }
        tx.flush(&socks);
        assert!(tx.is_empty());
        assert_eq!(tx.counters.datagrams, 100, "{:?}", tx.counters);
        assert_eq!(tx.counters.errors, 0);
        // Two flushes (64 + 36 packets), one sendmmsg per socket each,
        // however the sockets interleave (a refused GSO send costs a retry).
        assert!(
            tx.counters.syscalls <= 4 + 2 * tx.counters.gso_refused,
            "{:?}",
            tx.counters
        );
        if gso && tx.counters.gso_refused == 0 {
            assert!(tx.counters.gso_sends > 0);
        }
        let mut rx = RxBatch::new(gro);
        let mut seen = Vec::new();
        let give_up = Instant::now() + Duration::from_secs(5);
        while seen.len() < 100 && Instant::now() < give_up {
            let n = rx.recv(&b).unwrap();
            for k in 0..n {
                let (sender, d, seg) = rx.get(k);
                assert!(gro || seg == 0);
                for d in d.chunks(if seg == 0 { d.len() } else { seg }) {
                    let i = u32::from_be_bytes(d[..4].try_into().unwrap()) as usize;
                    assert_eq!(sender, Some(from[usize::from(sock_of(i))]), "packet {i}");
                    assert_eq!(d.len(), sizes[i], "packet {i}");
                    assert!(d[8..].iter().all(|&x| x == i as u8));
                    seen.push(i);
                }
            }
        }
        // In order from each socket (the two are not ordered between them).
        for k in [0, 1] {
            let mine: Vec<usize> = seen.iter().copied().filter(|&i| sock_of(i) == k).collect();
            let want: Vec<usize> = (0..100).filter(|&i| sock_of(i) == k).collect();
            assert_eq!(mine, want, "socket {k}");
        }
    }

    #[test]
    fn sendmmsg_and_recvmmsg_carry_every_packet_in_order() {
        exchange(false, false);
    }

    /// Two QPs' packets taking turns in one pass (each QP has its own
    /// socket): each socket's leave as one GSO send, in order.
    #[test]
    fn interleaved_sockets_make_one_gso_run_each() {
        let (a, b) = pair();
        let a2 = super::super::socket::bind("127.0.0.1".parse().unwrap(), 0).unwrap();
        let from = [a.local_addr().unwrap(), a2.local_addr().unwrap()];
        let port = b.local_addr().unwrap().port();
        let mut tx = TxBatch::new(port, true);
        let dst: IpAddr = "127.0.0.1".parse().unwrap();
        const N: usize = 32;
        for i in 0..N {
            let s = tx.slot();
            s[..80].fill(i as u8);
            s[..4].copy_from_slice(&(i as u32).to_be_bytes());
            // Where a BTH has its destination QPN: one QP's (a GSO run
            // never crosses QPN slots).
            s[4..8].copy_from_slice(&0x11u32.to_be_bytes());
            tx.commit(80, dst, (i % 2) as u8, None);
        }
        tx.flush(&[&a, &a2]);
        assert_eq!(tx.counters.datagrams, N as u64, "{:?}", tx.counters);
        if tx.counters.gso_refused == 0 {
            assert_eq!(
                (tx.counters.gso_sends, tx.counters.syscalls),
                (2, 2),
                "one run per socket: {:?}",
                tx.counters
            );
        }
        let mut rx = RxBatch::new(false);
        let mut seen = [Vec::new(), Vec::new()];
        let give_up = Instant::now() + Duration::from_secs(5);
        while seen[0].len() + seen[1].len() < N && Instant::now() < give_up {
            let n = rx.recv(&b).unwrap();
            for k in 0..n {
                let (sender, d, _) = rx.get(k);
                let i = u32::from_be_bytes(d[..4].try_into().unwrap()) as usize;
                assert_eq!(d.len(), 80);
                assert!(d[8..].iter().all(|&x| x == i as u8), "packet {i}");
                let sock = from.iter().position(|f| Some(*f) == sender).unwrap();
                assert_eq!(sock, i % 2, "packet {i}");
                seen[sock].push(i);
            }
        }
        for k in [0, 1] {
            let want: Vec<usize> = (0..N).filter(|i| i % 2 == k).collect();
            assert_eq!(seen[k], want, "socket {k}");
        }
    }

    #[test]
    fn gso_sends_arrive_as_the_same_datagrams() {
        exchange(true, false);
        // With GRO the receiver splits them by the segment size.
        exchange(true, true);
    }
}
