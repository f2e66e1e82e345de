//! The receive pool: datagrams taken with `recvmmsg(2)`, with UDP GRO.

use super::{GsoCmsg, PageAligned, MAX_BATCH, RX_SLOT, RX_SLOT_GRO, UDP_GRO};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd};

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
    pool: PageAligned,
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
            pool: PageAligned::zeroed(MAX_BATCH * slot),
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
    fn every_receive_buffer_starts_where_the_kernel_copies_fast() {
        // A GRO slot is a multiple of a page: each buffer starts on one
        // (see `pages.rs` for the copy this avoids).
        let rx = RxBatch::new(true);
        for iov in rx.iovs.iter() {
            assert_eq!(iov.iov_base as usize % 4096, 0);
        }
        // Without GRO slots are 9 KiB: none starts 1..63 bytes into a page.
        let rx = RxBatch::new(false);
        for iov in rx.iovs.iter() {
            let off = iov.iov_base as usize % 4096;
            assert!(off == 0 || off >= 64, "buffer at page offset {off}");
        }
    }
}
