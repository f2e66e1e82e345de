//! The transmit arena: the packets of one pass, sent with `sendmmsg(2)`
//! and UDP GSO (see the module documentation of `batch`).

use super::{
    DirectPeers, GsoCmsg, PageAligned, MAX_BATCH, MAX_GSO_BYTES, MAX_GSO_SEGMENTS, SEND_WAIT,
    TX_SLOT,
};
use crate::engine::PayloadAt;
use std::io;
use std::mem::MaybeUninit;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd};
use std::time::Instant;

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
    /// The destination QPN's slot (bits 16..23), by which a shared
    /// address steers it to a process; `None` for QP0 and QP1, whose
    /// packets (CM MADs) are steered by their contents. The kernel steers
    /// a GSO send as one datagram: a run never crosses lanes, and QP1
    /// packets leave one by one.
    pub lane: Option<u8>,
}

/// The lane of a packet whose BTH starts `head`.
fn lane_of(head: &[u8]) -> Option<u8> {
    let qpn = u32::from_be_bytes(head.get(4..8)?.try_into().ok()?) & 0xFF_FFFF;
    (qpn > 1).then_some((qpn >> 16) as u8)
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
            || p.lane != first.lane
            || first.lane.is_none()
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
    arena: PageAligned,
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
            arena: PageAligned::zeroed(MAX_BATCH * TX_SLOT),
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
            lane: lane_of(&self.arena[self.end..self.end + TX_SLOT.min(8)]),
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

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
                    lane: Some(0),
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
    fn gso_runs_never_cross_qpn_slots_and_leave_qp1_alone() {
        let mut p = pkts(&[(4112, 1); 6]);
        p[3].lane = Some(2);
        p[4].lane = Some(2);
        assert_eq!(runs(&p, 64, 1 << 20), [3, 2, 1]);
        // CM MADs to QP1 of two processes on one address: one each.
        let mut mads = pkts(&[(300, 1); 3]);
        for m in &mut mads {
            m.lane = None;
        }
        assert_eq!(runs(&mads, 64, 1 << 20), [1, 1, 1]);
        let mut head = [0u8; 12];
        head[4..8].copy_from_slice(&0x8003_0011u32.to_be_bytes());
        assert_eq!(lane_of(&head), Some(3));
        head[4..8].copy_from_slice(&1u32.to_be_bytes());
        assert_eq!(lane_of(&head), None);
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
}
