//! Batched datagram I/O on the device socket, with preallocated buffers so
//! the steady state allocates nothing per packet.
//!
//! Transmit: the engine writes each packet of a progress pass straight into
//! [`TxBatch`]'s arena (one after the other, contiguous); [`TxBatch::flush`]
//! hands the whole pass to the kernel with one `sendmmsg(2)` per up to
//! [`MAX_BATCH`] packets per socket (the packets grouped by socket first,
//! each socket's in order). With UDP GSO enabled (see [`TxBatch::new`])
//! runs of consecutive equal-size packets from one socket to one
//! destination ([`gso_run`]) become one message with a `UDP_SEGMENT` control message; the
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

use std::io;
use std::mem::MaybeUninit;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd};
use std::time::{Duration, Instant};

use crate::engine::PayloadAt;

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

/// One packet waiting in the transmit arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TxPkt {
    /// Offset in the arena.
    pub off: usize,
    /// Length on the wire.
    pub len: usize,
    /// A payload sent from registered memory: the arena holds the headers
    /// before it and the pad and ICRC after it.
    pub payload: Option<PayloadAt>,
    /// Destination device.
    pub dst: IpAddr,
    /// The IPv4 identification its ICRC is computed for (the engine signs
    /// for 0; a GSO send re-signs segment `k` for `k`).
    pub ident: u16,
    /// Which of the sockets passed to [`TxBatch::flush`] sends it.
    pub sock: u8,
}

impl TxPkt {
    /// Bytes it takes in the arena.
    pub(crate) fn arena_len(&self) -> usize {
        self.len - self.payload.map_or(0, |p| p.data.len())
    }
}

/// How many packets from the start of `pkts` form one GSO send: consecutive
/// packets from one socket to one destination (anywhere in the arena: each
/// piece is an iovec, a payload by reference between its packet's head and
/// tail), all as long as
/// the first except the last, which may be shorter; at most `max_segs`
/// packets and `max_bytes` bytes. Always at least 1 for a non-empty slice.
pub(crate) fn gso_run(pkts: &[TxPkt], max_segs: usize, max_bytes: usize) -> usize {
    let Some(first) = pkts.first() else {
        return 0;
    };
    let mut n = 1;
    let mut bytes = first.len;
    for (i, p) in pkts.iter().enumerate().skip(1) {
        // A shorter packet followed by one as long as itself starts a
        // run of its own rather than ending this one.
        let short_head_of_run = p.len < first.len
            && pkts
                .get(i + 1)
                .is_some_and(|q| q.len == p.len && q.dst == p.dst);
        if short_head_of_run
            || n >= max_segs
            || p.dst != first.dst
            || p.sock != first.sock
            || p.len > first.len
            || p.len == 0
            || bytes + p.len > max_bytes
        {
            break;
        }
        n += 1;
        bytes += p.len;
        if p.len < first.len {
            break; // a shorter packet ends the run
        }
    }
    n
}

/// Most iovecs one `sendmmsg` needs: a packet with a payload by reference
/// takes its head, the payload and its tail (fewer when pieces touch in
/// the arena), any other packet one; at most `MAX_BATCH` packets.
const MAX_IOVECS: usize = 3 * MAX_BATCH;

/// Transmit counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct TxCounters {
    /// Datagrams the kernel took.
    pub datagrams: u64,
    /// Datagrams dropped (no buffer space in time, or refused).
    pub errors: u64,
    /// `sendmmsg` calls.
    pub syscalls: u64,
    /// GSO messages sent (each several datagrams).
    pub gso_sends: u64,
    /// 1 once GSO was refused by the kernel and turned off.
    pub gso_refused: u64,
}

/// The transmit arena: the packets of one progress pass, contiguous.
pub(crate) struct TxBatch {
    arena: Box<[u8]>,
    pkts: Vec<TxPkt>,
    /// Scratch for [`TxBatch::group_by_socket`] (kept: no allocation per
    /// flush).
    grouped: Vec<TxPkt>,
    end: usize,
    gso: bool,
    /// No GSO towards loopback addresses: their receivers on this host may
    /// read through raw sockets (shared-port mode beside rxe), which see
    /// a GSO send uncut.
    gso_loopback: bool,
    port: u16,
    /// The sockets send from an IPv4 address: segment `k` of a GSO send
    /// is re-signed for IPv4 identification `k` (see the module
    /// documentation).
    resign_idents: bool,
    /// Re-signing tables of the last lengths seen (a run of MIDDLE
    /// packets ends with a LAST of another length, message after message).
    reidents: roxe_wire::icrc::RecentLengths<roxe_wire::icrc::Reident>,
    /// Destination socket addresses, built once per destination, and
    /// whether the destination is reached directly (see `direct`).
    addrs: Vec<(IpAddr, socket2::SockAddr, bool)>,
    /// Beside rxe (shared-port mode): loopback peers that are shared-mode
    /// roxe devices themselves (a socket holds their claim port) are sent
    /// their packets at that port, where they read them through a UDP
    /// socket with GRO, instead of at 4791 for their raw socket: GSO goes
    /// to them, and rxe's socket no longer sees their traffic. The packets
    /// are signed for port 4791 all the same. `None`: never.
    direct: Option<DirectPeers>,
    pub(crate) counters: TxCounters,
}

/// Which loopback peers a shared-mode device reaches at their claim port.
#[derive(Debug)]
pub(crate) struct DirectPeers {
    /// The claim port (`device::SHARED_MODE_PORT`).
    pub port: u16,
    /// Answers by peer, each looked up again after `RECHECK` (a peer may
    /// open or close).
    known: Vec<(IpAddr, bool, Instant)>,
    /// Answers that changed since `take_changes`: the engine widens its
    /// window towards direct peers (`Engine::set_udp_peer`).
    changed: Vec<(IpAddr, bool)>,
}

impl DirectPeers {
    pub(crate) fn new(port: u16) -> Self {
        DirectPeers {
            port,
            known: Vec::new(),
            changed: Vec::new(),
        }
    }

    /// Whether `dst` is a loopback address whose claim port a socket holds
    /// (`/proc/net/udp`), cached for a second.
    fn is_direct(&mut self, dst: IpAddr) -> bool {
        const RECHECK: Duration = Duration::from_secs(1);
        let IpAddr::V4(v4) = dst else {
            return false;
        };
        if !v4.is_loopback() {
            return false;
        }
        let now = Instant::now();
        let known = self.known.iter().position(|(a, _, _)| *a == dst);
        let before = known.map(|i| self.known[i]);
        if let Some((_, d, at)) = before {
            if now < at + RECHECK {
                return d;
            }
        }
        let key = format!("{:08X}:{:04X}", u32::from_le_bytes(v4.octets()), self.port);
        let d = std::fs::read_to_string("/proc/net/udp").is_ok_and(|t| {
            t.lines()
                .skip(1)
                .any(|l| l.split_whitespace().nth(1) == Some(key.as_str()))
        });
        let was = before.map(|(_, d, _)| d);
        if was != Some(d) && (d || was.is_some()) {
            if self.changed.len() < 256 {
                self.changed.push((dst, d));
            }
            tracing::info!(
                peer = %dst,
                port = self.port,
                direct = d,
                "shared-mode roxe peer on this host: reached at its claim port"
            );
        }
        match known {
            Some(i) => self.known[i] = (dst, d, now),
            None => {
                if self.known.len() >= 256 {
                    self.known.clear();
                }
                self.known.push((dst, d, now));
            }
        }
        d
    }
}

impl std::fmt::Debug for TxBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TxBatch")
            .field("queued", &self.pkts.len())
            .field("gso", &self.gso)
            .field("counters", &self.counters)
            .finish_non_exhaustive()
    }
}

impl TxBatch {
    /// An empty batch sending to `port` on each destination, with UDP GSO
    /// if `gso` (see the module documentation).
    pub(crate) fn new(port: u16, gso: bool) -> TxBatch {
        TxBatch {
            arena: vec![0; MAX_BATCH * TX_SLOT].into_boxed_slice(),
            pkts: Vec::with_capacity(MAX_BATCH),
            grouped: Vec::with_capacity(MAX_BATCH),
            end: 0,
            gso,
            gso_loopback: true,
            port,
            resign_idents: false,
            reidents: Default::default(),
            addrs: Vec::new(),
            direct: None,
            counters: TxCounters::default(),
        }
    }

    /// Direct peers found or lost since the last call (see
    /// `DirectPeers::changed`).
    pub(crate) fn take_direct_changes(&mut self) -> Vec<(IpAddr, bool)> {
        match self.direct.as_mut() {
            Some(d) if !d.changed.is_empty() => std::mem::take(&mut d.changed),
            _ => Vec::new(),
        }
    }

    /// Reach shared-mode roxe peers on this host at their claim port
    /// (see `direct`).
    pub(crate) fn set_direct(&mut self, direct: DirectPeers) {
        self.direct = Some(direct);
    }

    /// The sockets' source address: from an IPv4 one, GSO segments are
    /// re-signed for the identification the kernel gives them; and whether
    /// GSO may go to loopback destinations.
    pub(crate) fn set_source(&mut self, src: IpAddr, gso_loopback: bool) {
        self.resign_idents = src.is_ipv4();
        self.gso_loopback = gso_loopback;
    }

    /// Sign the `n` packets from `first`, which leave as one message, for
    /// the IPv4 identifications the kernel gives them: segment `k` of a
    /// GSO send carries `k`, a single datagram 0. Only packets signed for
    /// another value change (after a partial send or a refused GSO send, a
    /// packet may move between runs), and by the identification's share of
    /// the CRC alone (`icrc::Reident`), not a new CRC over the packet: the
    /// same result for a packet as the engine signed it, one CRC pass per
    /// packet instead of two, and a packet the fault injector corrupted
    /// stays detectably corrupt. IPv6 has no identification.
    fn sign_for_idents(&mut self, first: usize, n: usize) {
        if !self.resign_idents {
            return;
        }
        for k in 0..n {
            // k < MAX_GSO_SEGMENTS (64): fits the 16-bit identification.
            let ident = if n > 1 { k as u16 } else { 0 };
            let pkt = self.pkts[first + k];
            let (off, len) = (pkt.off, pkt.len);
            let old = pkt.ident;
            if old == ident {
                continue;
            }
            let Some(body_len) = len.checked_sub(roxe_wire::ICRC_LEN) else {
                continue;
            };
            // The segments of a run share one length (the last may not).
            let r = self
                .reidents
                .get_or_make(body_len, roxe_wire::icrc::Reident::new);
            // The ICRC ends the packet's bytes in the arena either way.
            let pkt = &mut self.arena[off..off + pkt.arena_len()];
            let Ok(c) = roxe_wire::icrc::from_wire(pkt) else {
                continue;
            };
            roxe_wire::packet::set_icrc(pkt, c ^ r.delta(old, ident));
            self.pkts[first + k].ident = ident;
        }
    }

    /// Whether the next packet needs a flush first.
    pub(crate) fn is_full(&self) -> bool {
        self.pkts.len() >= MAX_BATCH
    }

    /// Whether nothing is queued.
    pub(crate) fn is_empty(&self) -> bool {
        self.pkts.is_empty()
    }

    /// Room for the next packet ([`TX_SLOT`] bytes). Not full: the arena
    /// holds `MAX_BATCH` slots and every packet takes at most one.
    pub(crate) fn slot(&mut self) -> &mut [u8] {
        debug_assert!(!self.is_full());
        &mut self.arena[self.end..self.end + TX_SLOT]
    }

    /// Queue the packet written into [`slot`](Self::slot) (`len` bytes on
    /// the wire, with `payload` by reference if given: see
    /// [`Transmit`](crate::engine::Transmit)), to leave from socket `sock`;
    /// returns its bytes in the arena.
    ///
    /// A payload by reference must stay registered until the batch is
    /// flushed (the device's `Shared::tx` says how it does).
    pub(crate) fn commit(
        &mut self,
        len: usize,
        dst: IpAddr,
        sock: u8,
        payload: Option<PayloadAt>,
    ) -> &[u8] {
        let pkt = TxPkt {
            off: self.end,
            len,
            payload,
            dst,
            ident: 0,
            sock,
        };
        let used = pkt.arena_len();
        assert!(used <= TX_SLOT && !self.is_full());
        self.pkts.push(pkt);
        self.end += used;
        &self.arena[pkt.off..pkt.off + used]
    }

    /// [`commit`](Self::commit) a packet the engine wrote into `from`
    /// instead of the slot: the bytes it takes in the arena are copied in
    /// (the headers and tail only, for a payload by reference).
    pub(crate) fn commit_copy(
        &mut self,
        from: &[u8],
        len: usize,
        dst: IpAddr,
        sock: u8,
        payload: Option<PayloadAt>,
    ) -> &[u8] {
        let used = len - payload.map_or(0, |p| p.data.len());
        self.slot()[..used].copy_from_slice(&from[..used]);
        self.commit(len, dst, sock, payload)
    }

    /// Queue a copy of `p` for `socks[sock]`, flushing first if the batch
    /// is full.
    pub(crate) fn push(&mut self, socks: &[impl AsFd], p: &[u8], dst: IpAddr, sock: u8) {
        if p.len() > TX_SLOT {
            self.counters.errors += 1;
            return;
        }
        if self.is_full() {
            self.flush(socks);
        }
        self.slot()[..p.len()].copy_from_slice(p);
        self.commit(p.len(), dst, sock, None);
    }

    /// The index in `addrs` of `dst`'s socket address. Rebuilt (and the
    /// direct peers looked up again) once per flush at most: `addrs` is
    /// cleared at the end of each flush that used a direct peer.
    fn addr_index(&mut self, dst: IpAddr) -> usize {
        if let Some(i) = self.addrs.iter().position(|(a, _, _)| *a == dst) {
            return i;
        }
        if self.addrs.len() >= 256 {
            // Bounded: many peers just rebuild the table now and then.
            self.addrs.clear();
        }
        let direct = self.direct.as_mut().is_some_and(|d| d.is_direct(dst));
        let port = match &self.direct {
            Some(d) if direct => d.port,
            _ => self.port,
        };
        let sa = socket2::SockAddr::from(SocketAddr::new(dst, port));
        self.addrs.push((dst, sa, direct));
        self.addrs.len() - 1
    }

    /// Whether GSO may carry packets to `dst`.
    fn gso_to(&mut self, dst: IpAddr) -> bool {
        if !self.gso {
            return false;
        }
        if self.gso_loopback || !dst.is_loopback() {
            return true;
        }
        let i = self.addr_index(dst);
        self.addrs[i].2
    }

    /// Reorder the packets so that each socket's are together, in the
    /// order they were committed. QPs take turns packet by packet, so a
    /// pass over several QPs interleaves their sockets (each QP sends from
    /// one); grouped, a QP's equal packets to one peer make one GSO run
    /// (their pieces need not touch in the arena: each is an iovec). The
    /// order between sockets is between different QPs, which the wire
    /// never promised (they leave from different UDP ports).
    /// `ib_send_bw -s 64 -q 4`: 0.26-0.33 -> 0.8-1.16 M msg/s.
    fn group_by_socket(&mut self) {
        let Some(first) = self.pkts.first().map(|p| p.sock) else {
            return;
        };
        if self.pkts.iter().all(|p| p.sock == first) {
            return;
        }
        let last = self.pkts.iter().map(|p| p.sock).max().unwrap_or(first);
        self.grouped.clear();
        for sock in 0..=last {
            self.grouped
                .extend(self.pkts.iter().filter(|p| p.sock == sock).copied());
        }
        std::mem::swap(&mut self.pkts, &mut self.grouped);
    }

    /// Send everything queued, each packet from `socks[its sock]`: one
    /// `sendmmsg` per up to `MAX_BATCH` messages from one socket, waiting a
    /// bounded time when a socket buffer is full. A packet naming no socket
    /// of `socks` is counted as an error.
    pub(crate) fn flush(&mut self, socks: &[impl AsFd]) {
        if self.pkts.len() == 1 && self.pkts[0].payload.is_none() {
            // One packet (the latency path): a plain sendto.
            match socks.get(usize::from(self.pkts[0].sock)) {
                Some(s) => self.flush_one(s.as_fd()),
                None => {
                    self.counters.errors += 1;
                    self.pkts.clear();
                    self.end = 0;
                }
            }
            return;
        }
        self.group_by_socket();
        // A packet naming no socket of `socks` cannot leave.
        let unsendable = self
            .pkts
            .iter()
            .filter(|p| usize::from(p.sock) >= socks.len())
            .count();
        self.counters.errors += unsendable as u64;
        let mut deadline: Option<Instant> = None;
        // Socket by socket (grouped above), each one's packets in as few
        // calls as possible.
        for (sock_index, sock) in socks.iter().enumerate() {
            let (fd, sock_index) = (sock.as_fd(), sock_index as u8);
            let mine = |pkts: &[TxPkt], from: usize| {
                (from..pkts.len()).find(|&k| pkts[k].sock == sock_index)
            };
            let mut i = 0;
            while let Some(start) = mine(&self.pkts, i) {
                // The messages of this call: (first packet, packets, gso size).
                let mut plan = [(0usize, 0usize, 0u16); MAX_BATCH];
                let mut m = 0;
                let mut j = start;
                while j < self.pkts.len() && m < MAX_BATCH {
                    if self.pkts[j].sock != sock_index {
                        j += 1;
                        continue;
                    }
                    let dst = self.pkts[j].dst;
                    let n = if self.gso_to(dst) {
                        gso_run(&self.pkts[j..], MAX_GSO_SEGMENTS, MAX_GSO_BYTES)
                    } else {
                        1
                    };
                    let seg = if n > 1 { self.pkts[j].len as u16 } else { 0 };
                    self.sign_for_idents(j, n);
                    plan[m] = (j, n, seg);
                    m += 1;
                    j += n;
                }
                let mut addr_of = [0usize; MAX_BATCH];
                for (k, &(first, _, _)) in plan[..m].iter().enumerate() {
                    addr_of[k] = self.addr_index(self.pkts[first].dst);
                }
                // Only the `m` entries used are written (a latency-bound pass
                // sends one packet).
                let mut hdrs = [const { MaybeUninit::<libc::mmsghdr>::uninit() }; MAX_BATCH];
                // Only the entries used are written, as for the headers.
                let mut iovs = [const { MaybeUninit::<libc::iovec>::uninit() }; MAX_IOVECS];
                let mut iov_at = [(0usize, 0usize); MAX_BATCH];
                let mut used = 0;
                for k in 0..m {
                    let (first, n, _) = plan[k];
                    let count = self.iovecs(&self.pkts[first..first + n], &mut iovs[used..]);
                    iov_at[k] = (used, count);
                    used += count;
                }
                let mut cmsgs = [const { MaybeUninit::<GsoCmsg>::uninit() }; MAX_BATCH];
                for k in 0..m {
                    let (_, _, seg) = plan[k];
                    let (at, count) = iov_at[k];
                    // SAFETY: all-zero is a valid mmsghdr (null pointers, zero
                    // lengths); the fields that matter are set below.
                    let mut mh: libc::mmsghdr = unsafe { std::mem::zeroed() };
                    let sa = &self.addrs[addr_of[k]].1;
                    let h = &mut mh.msg_hdr;
                    h.msg_name = sa.as_ptr() as *mut libc::c_void;
                    h.msg_namelen = sa.len();
                    h.msg_iov = iovs[at..].as_mut_ptr().cast::<libc::iovec>();
                    h.msg_iovlen = count as _;
                    if seg > 0 {
                        h.msg_control = (cmsgs[k].write(GsoCmsg::new(seg)) as *mut GsoCmsg).cast();
                        h.msg_controllen = std::mem::size_of::<GsoCmsg>() as _;
                    }
                    hdrs[k].write(mh);
                }
                // SAFETY: `hdrs[..m]` are initialised msghdrs whose pointers
                // (names in `self.addrs`, iovecs in `iovs` over `self.arena`
                // and payloads by reference, each message's `count` of them
                // initialised by `iovecs`, control messages in `cmsgs`)
                // stay valid and unmodified for the call; the kernel only
                // reads them and writes `msg_len`. A payload by reference is
                // registered memory, still registered: the device flushes
                // under the lock that deregistration takes (`commit`), and
                // the kernel reports an unmapped page as EFAULT, never a
                // fault.
                let rc = unsafe {
                    libc::sendmmsg(
                        fd.as_raw_fd(),
                        hdrs.as_mut_ptr().cast::<libc::mmsghdr>(),
                        m as libc::c_uint,
                        libc::MSG_DONTWAIT,
                    )
                };
                self.counters.syscalls += 1;
                if rc >= 0 {
                    for &(_, n, seg) in &plan[..rc as usize] {
                        self.counters.datagrams += n as u64;
                        self.counters.gso_sends += u64::from(seg > 0);
                    }
                    i = match plan.get(rc as usize) {
                        Some(&(first, _, _)) if (rc as usize) < m => first,
                        _ => j,
                    };
                    continue;
                }
                let err = io::Error::last_os_error();
                let (first, n, seg) = plan[0];
                match err.raw_os_error() {
                    Some(libc::EINTR) => {}
                    Some(libc::EAGAIN) => {
                        let d = *deadline.get_or_insert_with(|| Instant::now() + SEND_WAIT);
                        if !wait_writable(fd, d) {
                            let left = self.pkts[start..]
                                .iter()
                                .filter(|p| p.sock == sock_index)
                                .count();
                            self.counters.errors += left as u64;
                            break;
                        }
                    }
                    _ if seg > 0 => {
                        // GSO refused (EIO without checksum offload, EINVAL,
                        // ENOPROTOOPT on old kernels): per-datagram from now on.
                        self.gso = false;
                        self.counters.gso_refused = 1;
                    }
                    _ => {
                        self.counters.errors += n as u64;
                        i = first + n;
                    }
                }
            }
        }
        self.pkts.clear();
        self.end = 0;
        if self.direct.is_some() {
            // Direct peers come and go: look them up again (cached).
            self.addrs.clear();
        }
    }
}

impl TxBatch {
    /// The iovecs of `pkts` (queued in this batch) written into the start
    /// of `out`, arena pieces that touch merged; returns how many (only those are initialised).
    fn iovecs(&self, pkts: &[TxPkt], out: &mut [MaybeUninit<libc::iovec>]) -> usize {
        let mut n = 0;
        // The piece being extended: base, length, and its end in the arena
        // (`None` for registered memory, which never merges).
        let mut open: Option<(*const u8, usize, Option<usize>)> = None;
        let mut push = |out: &mut [MaybeUninit<libc::iovec>],
                        base: *const u8,
                        len: usize,
                        arena: Option<usize>| {
            match open {
                Some((b, l, Some(end))) if arena == Some(end) => {
                    open = Some((b, l + len, Some(end + len)));
                    return;
                }
                Some((b, l, _)) => {
                    out[n].write(libc::iovec {
                        iov_base: b as *mut libc::c_void,
                        iov_len: l,
                    });
                    n += 1;
                }
                None => {}
            }
            open = Some((base, len, arena.map(|off| off + len)));
        };
        for p in pkts {
            let piece = |from: usize, to: usize| self.arena[p.off + from..p.off + to].as_ptr();
            match p.payload {
                None => push(out, piece(0, p.len), p.len, Some(p.off)),
                Some(pl) => {
                    let used = p.arena_len();
                    push(out, piece(0, pl.at), pl.at, Some(p.off));
                    push(out, pl.data.as_ptr(), pl.data.len(), None);
                    push(out, piece(pl.at, used), used - pl.at, Some(p.off + pl.at));
                }
            }
        }
        if let Some((b, l, _)) = open {
            out[n].write(libc::iovec {
                iov_base: b as *mut libc::c_void,
                iov_len: l,
            });
            n += 1;
        }
        n
    }

    fn flush_one(&mut self, fd: std::os::fd::BorrowedFd<'_>) {
        let TxPkt { off, len, dst, .. } = self.pkts[0];
        let i = self.addr_index(dst);
        let port = match (&self.direct, self.addrs[i].2) {
            (Some(d), true) => d.port,
            _ => self.port,
        };
        if self.direct.is_some() {
            self.addrs.clear();
        }
        let to = SocketAddr::new(dst, port);
        let p = &self.arena[off..off + len];
        let mut deadline: Option<Instant> = None;
        let sent = loop {
            match rustix::net::sendto(fd, p, rustix::net::SendFlags::DONTWAIT, &to) {
                Ok(_) => break true,
                Err(rustix::io::Errno::INTR) => continue,
                Err(rustix::io::Errno::AGAIN) => {
                    let d = *deadline.get_or_insert_with(|| Instant::now() + SEND_WAIT);
                    if !wait_writable(fd, d) {
                        break false;
                    }
                }
                Err(_) => break false,
            }
        };
        self.counters.syscalls += 1;
        if sent {
            self.counters.datagrams += 1;
        } else {
            self.counters.errors += 1;
        }
        self.pkts.clear();
        self.end = 0;
    }
}

/// Wait until `fd` is writable or `deadline` passes (false).
fn wait_writable(fd: std::os::fd::BorrowedFd<'_>, deadline: Instant) -> bool {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return false;
    }
    let ts = rustix::time::Timespec {
        tv_sec: 0,
        tv_nsec: left.as_nanos().min(999_999_999) as _,
    };
    let mut fds = [rustix::event::PollFd::new(
        &fd,
        rustix::event::PollFlags::OUT,
    )];
    let _ = rustix::event::poll(&mut fds, Some(&ts));
    true
}

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

/// Room for an IPv4 or IPv6 peer address.
#[repr(C)]
#[derive(Clone, Copy)]
union PeerAddr {
    v4: libc::sockaddr_in,
    v6: libc::sockaddr_in6,
}

impl PeerAddr {
    fn to_std(self, len: libc::socklen_t) -> Option<SocketAddr> {
        // SAFETY: every field is a plain C struct whose first member is the
        // address family; the kernel wrote `len` bytes of the one the
        // family names, and the length is checked before reading it.
        unsafe {
            match self.v4.sin_family as libc::c_int {
                libc::AF_INET if len as usize >= std::mem::size_of::<libc::sockaddr_in>() => {
                    let a = self.v4;
                    Some(SocketAddr::new(
                        IpAddr::V4(Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr))),
                        u16::from_be(a.sin_port),
                    ))
                }
                libc::AF_INET6 if len as usize >= std::mem::size_of::<libc::sockaddr_in6>() => {
                    let a = self.v6;
                    Some(SocketAddr::new(
                        IpAddr::V6(Ipv6Addr::from(a.sin6_addr.s6_addr)),
                        u16::from_be(a.sin6_port),
                    ))
                }
                _ => None,
            }
        }
    }
}

/// One received datagram: length, source, GRO segment size (0: one packet).
type Got = (usize, Option<SocketAddr>, usize);

/// The receive pool: [`MAX_BATCH`] buffers of [`RX_SLOT`] bytes (64 KiB
/// with UDP GRO, which delivers runs of equal datagrams as one), and the
/// `recvmmsg` headers pointing into it, built once.
///
/// The pointers in `hdrs` and `iovs` point into `pool`, `iovs`, `names` and
/// `cmsgs`, heap allocations owned by the struct that never move or shrink.
pub(crate) struct RxBatch {
    pool: Box<[u8]>,
    hdrs: Box<[libc::mmsghdr]>,
    iovs: Box<[libc::iovec]>,
    names: Box<[PeerAddr]>,
    cmsgs: Box<[GsoCmsg]>,
    slot: usize,
    got: [Got; MAX_BATCH],
    n: usize,
}

// SAFETY: the raw pointers in `hdrs` and `iovs` point only into the
// struct's own boxed buffers, whose heap memory stays where it is when the
// struct moves to another thread; nothing else refers to those buffers, and
// every use goes through `&mut self` (the device keeps it in a mutex).
unsafe impl Send for RxBatch {}

impl RxBatch {
    /// A pool; `gro`: the socket has `UDP_GRO` on.
    pub(crate) fn new(gro: bool) -> RxBatch {
        let slot = if gro { RX_SLOT_GRO } else { RX_SLOT };
        // SAFETY: all-zero is a valid value of these plain C structs.
        let zero_hdr: libc::mmsghdr = unsafe { std::mem::zeroed() };
        let zero_iov: libc::iovec = unsafe { std::mem::zeroed() };
        let zero_name: PeerAddr = unsafe { std::mem::zeroed() };
        let mut rx = RxBatch {
            pool: vec![0; MAX_BATCH * slot].into_boxed_slice(),
            hdrs: vec![zero_hdr; MAX_BATCH].into_boxed_slice(),
            iovs: vec![zero_iov; MAX_BATCH].into_boxed_slice(),
            names: vec![zero_name; MAX_BATCH].into_boxed_slice(),
            cmsgs: vec![GsoCmsg::EMPTY; MAX_BATCH].into_boxed_slice(),
            slot,
            got: [(0, None, 0); MAX_BATCH],
            n: 0,
        };
        for (k, chunk) in rx.pool.chunks_exact_mut(slot).enumerate() {
            rx.iovs[k] = libc::iovec {
                iov_base: chunk.as_mut_ptr().cast(),
                iov_len: slot,
            };
            let h = &mut rx.hdrs[k].msg_hdr;
            h.msg_name = (&mut rx.names[k] as *mut PeerAddr).cast();
            h.msg_iov = &mut rx.iovs[k];
            h.msg_iovlen = 1;
            h.msg_control = (&mut rx.cmsgs[k] as *mut GsoCmsg).cast();
            Self::reset(h);
        }
        rx
    }

    /// The in/out lengths the kernel overwrites.
    fn reset(h: &mut libc::msghdr) {
        h.msg_namelen = std::mem::size_of::<PeerAddr>() as libc::socklen_t;
        h.msg_controllen = std::mem::size_of::<GsoCmsg>() as _;
        h.msg_flags = 0;
    }

    /// Receive what is queued, up to [`MAX_BATCH`] datagrams, without
    /// blocking. `Ok(0)`: nothing to read. Datagrams that were truncated or
    /// have no readable source come back with no address (count, skip).
    pub(crate) fn recv(&mut self, sock: &impl AsFd) -> io::Result<usize> {
        // Only the entries the last call used were written by the kernel.
        for h in &mut self.hdrs[..self.n.max(1)] {
            Self::reset(&mut h.msg_hdr);
        }
        self.n = 0;
        // SAFETY: every msghdr points at memory of the stated sizes owned by
        // `self` (a pool slot, a name and a control buffer, an iovec; see
        // the struct), exclusively borrowed for the call.
        let rc = unsafe { recv_many(sock.as_fd(), &mut self.hdrs) }?;
        for k in 0..rc {
            let h = &self.hdrs[k];
            let truncated = h.msg_hdr.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0;
            let from = if truncated {
                None
            } else {
                self.names[k].to_std(h.msg_hdr.msg_namelen)
            };
            // The only control message a UDP socket with UDP_GRO and no
            // other receive options gets is the GRO segment size (an int).
            let c = &self.cmsgs[k];
            let seg = if h.msg_hdr.msg_controllen >= std::mem::offset_of!(GsoCmsg, data) + 4
                && c.hdr.cmsg_level == libc::SOL_UDP
                && c.hdr.cmsg_type == UDP_GRO
            {
                let mut v = [0u8; 4];
                v.copy_from_slice(&c.data[..4]);
                libc::c_int::from_ne_bytes(v).max(0) as usize
            } else {
                0
            };
            self.got[k] = (h.msg_len as usize, from, seg);
        }
        self.n = rc;
        Ok(rc)
    }

    /// The `k`th datagram of the last [`recv`](Self::recv): its source
    /// (`None` if it was truncated or unreadable), bytes, and the size of
    /// the packets it holds if GRO coalesced several (0: one packet).
    pub(crate) fn get(&self, k: usize) -> (Option<SocketAddr>, &[u8], usize) {
        assert!(k < self.n);
        let (len, from, seg) = self.got[k];
        let start = k * self.slot;
        (from, &self.pool[start..start + len.min(self.slot)], seg)
    }
}

/// `recvmmsg` of up to `hdrs.len()` datagrams without blocking, retried on
/// EINTR. `Ok(0)`: nothing queued.
///
/// # Safety
/// Every header's name, iovec and control pointers must point at memory of
/// the lengths they state, writable and not otherwise used for the call.
pub(crate) unsafe fn recv_many(
    fd: std::os::fd::BorrowedFd<'_>,
    hdrs: &mut [libc::mmsghdr],
) -> io::Result<usize> {
    loop {
        // SAFETY: per the contract; no timeout pointer.
        let rc = unsafe {
            libc::recvmmsg(
                fd.as_raw_fd(),
                hdrs.as_mut_ptr(),
                hdrs.len().min(libc::c_uint::MAX as usize) as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if rc >= 0 {
            return Ok(rc as usize);
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::Interrupted => continue,
            io::ErrorKind::WouldBlock => return Ok(0),
            _ => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resigning_a_gso_run_keeps_a_corrupted_packet_detectable() {
        use roxe_wire::icrc;
        let (src, dst) = (Ipv4Addr::new(127, 0, 0, 1), Ipv4Addr::new(127, 0, 0, 2));
        let mut tx = TxBatch::new(4791, true);
        tx.set_source(IpAddr::V4(src), true);
        let sport = 0xC005;
        // Three equal packets (BTH + 64 bytes), signed as the engine signs
        // them (identification 0); the second then has a bit flipped, as
        // the fault injector does after signing.
        for k in 0..3u8 {
            let mut p = vec![k; 12 + 64 + 4];
            let c = icrc::compute_ipv4(src, dst, sport, 4791, 0, &p[..76]).unwrap();
            roxe_wire::packet::set_icrc(&mut p, c);
            if k == 1 {
                p[40] ^= 0x08;
            }
            tx.slot()[..p.len()].copy_from_slice(&p);
            tx.commit(p.len(), IpAddr::V4(dst), 0, None);
        }
        tx.sign_for_idents(0, 3);
        for k in 0..3usize {
            let TxPkt { off, len, .. } = tx.pkts[k];
            let p = &tx.arena[off..off + len];
            let want = icrc::compute_ipv4(src, dst, sport, 4791, k as u16, &p[..len - 4]).unwrap();
            let ok = icrc::from_wire(p).unwrap() == want;
            assert_eq!(ok, k != 1, "segment {k}: signed for identification {k}");
        }
    }

    #[test]
    fn direct_peers_are_loopback_addresses_whose_claim_port_is_held() {
        // A socket on 127.0.247.1, port P, plays a shared-mode peer.
        let held = std::net::UdpSocket::bind("127.0.247.1:0").expect("bind");
        let port = held.local_addr().expect("local address").port();
        let mut d = DirectPeers::new(port);
        assert!(d.is_direct("127.0.247.1".parse().unwrap()));
        assert!(!d.is_direct("127.0.247.2".parse().unwrap()));
        assert!(!d.is_direct("10.0.0.1".parse().unwrap()));
        assert!(!d.is_direct("::1".parse().unwrap()));
        // The answer is cached for a second, then looked up again.
        drop(held);
        assert!(d.is_direct("127.0.247.1".parse().unwrap()));
        std::thread::sleep(Duration::from_millis(1100));
        assert!(!d.is_direct("127.0.247.1".parse().unwrap()));
    }

    fn pkts(spec: &[(usize, u8)]) -> Vec<TxPkt> {
        let mut off = 0;
        spec.iter()
            .map(|&(len, d)| {
                let p = TxPkt {
                    off,
                    len,
                    payload: None,
                    dst: IpAddr::V4(Ipv4Addr::new(127, 0, 0, d)),
                    ident: 0,
                    sock: 0,
                };
                off += len;
                p
            })
            .collect()
    }

    fn runs(p: &[TxPkt], segs: usize, bytes: usize) -> Vec<usize> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < p.len() {
            let n = gso_run(&p[i..], segs, bytes);
            assert!(n >= 1);
            out.push(n);
            i += n;
        }
        out
    }

    #[test]
    fn gso_runs_group_equal_sizes_to_one_destination() {
        // 16 MIDDLE-size packets and a short LAST: one run.
        let mut spec = vec![(4112, 1); 16];
        spec.push((100, 1));
        assert_eq!(runs(&pkts(&spec), 64, 1 << 20), [17]);
        // A shorter packet ends the run (the next is not as short).
        assert_eq!(
            runs(
                &pkts(&[(4112, 1), (100, 1), (4112, 1), (4112, 1)]),
                64,
                1 << 20
            ),
            [2, 2]
        );
        // ... unless it heads a run of its own: FIRST (with RETH) and then
        // the MIDDLEs of a WRITE.
        let mut spec = vec![(4128, 1)];
        spec.extend([(4112, 1); 15]);
        assert_eq!(runs(&pkts(&spec), 64, MAX_GSO_BYTES), [1, 15]);
        // A longer packet starts a new run.
        assert_eq!(
            runs(
                &pkts(&[(100, 1), (100, 1), (4112, 1), (4112, 1)]),
                64,
                1 << 20
            ),
            [2, 2]
        );
        // Another destination starts a new run.
        assert_eq!(
            runs(
                &pkts(&[(64, 1), (64, 1), (64, 2), (64, 2), (64, 1)]),
                64,
                1 << 20
            ),
            [2, 2, 1]
        );
        assert_eq!(runs(&[], 64, 1 << 20), Vec::<usize>::new());
    }

    #[test]
    fn gso_runs_respect_segment_and_byte_limits() {
        // 65507 / 4112 = 15 segments per send.
        let p = pkts(&[(4112, 1); 40]);
        assert_eq!(runs(&p, MAX_GSO_SEGMENTS, MAX_GSO_BYTES), [15, 15, 10]);
        // 64 segments at most.
        let p = pkts(&[(64, 1); 130]);
        assert_eq!(runs(&p, MAX_GSO_SEGMENTS, MAX_GSO_BYTES), [64, 64, 2]);
        // The byte limit is inclusive.
        let p = pkts(&[(100, 1); 5]);
        assert_eq!(runs(&p, 64, 300), [3, 2]);
    }

    #[test]
    fn gso_runs_stay_on_one_socket() {
        let mut p = pkts(&[(64, 1); 4]);
        p[2].sock = 1;
        p[3].sock = 1;
        assert_eq!(runs(&p, 64, 1 << 20), [2, 2]);
    }

    /// A run's packets need not touch in the arena (grouped by socket, a
    /// QP's packets lie between other QPs'): each piece is an iovec.
    #[test]
    fn gso_runs_gather_packets_apart_in_the_arena() {
        let mut p = pkts(&[(64, 1); 4]);
        p[2].off += 8;
        p[3].off += 8;
        assert_eq!(runs(&p, 64, 1 << 20), [4]);
    }

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
                    assert!(d[4..].iter().all(|&x| x == i as u8));
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
                assert!(d[4..].iter().all(|&x| x == i as u8), "packet {i}");
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
