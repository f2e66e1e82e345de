//! The device's UDP socket: bound to its address and port 4791, sending
//! with don't-fragment set (so Linux writes IPv4 identification 0, the value
//! the ICRC was computed with) and, for IPv6, accepting zero UDP checksums
//! (rxe and NICs send them).

use socket2::{Domain, Protocol, Socket, Type};
use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};

/// Receive and send buffer size asked for: a few windows of 128 × 4 KiB
/// packets, so bursts from several QPs are not dropped on arrival.
const SOCKET_BUFFER: usize = 8 << 20;

/// Bind a device socket to `addr`:`port` (non-blocking).
pub fn bind(addr: IpAddr, port: u16) -> io::Result<UdpSocket> {
    bind_with(addr, port, false)
}

/// [`bind`] with `SO_REUSEPORT`: beside the sockets of other processes of
/// this user on the same address and port (a shared address, see
/// `steering`).
pub fn bind_reuseport(addr: IpAddr, port: u16) -> io::Result<UdpSocket> {
    bind_with(addr, port, true)
}

fn bind_with(addr: IpAddr, port: u16, reuseport: bool) -> io::Result<UdpSocket> {
    let domain = match addr {
        IpAddr::V4(_) => Domain::IPV4,
        IpAddr::V6(_) => Domain::IPV6,
    };
    let s = Socket::new(domain, Type::DGRAM, Some(Protocol::UDP))?;
    match addr {
        IpAddr::V4(_) => rustix::net::sockopt::set_ip_mtu_discover(
            &s,
            rustix::net::sockopt::Ipv4PathMtuDiscovery::DO,
        )?,
        IpAddr::V6(_) => {
            s.set_only_v6(true)?;
            rustix::net::sockopt::set_ipv6_mtu_discover(
                &s,
                rustix::net::sockopt::Ipv6PathMtuDiscovery::DO,
            )?;
            allow_zero_udp6_checksums(&s)?;
        }
    }
    // The _force variants pass rmem_max/wmem_max but need CAP_NET_ADMIN;
    // without it the kernel caps the plain request at rmem_max.
    if rustix::net::sockopt::set_socket_recv_buffer_size_force(&s, SOCKET_BUFFER).is_err() {
        s.set_recv_buffer_size(SOCKET_BUFFER)?;
    }
    if rustix::net::sockopt::set_socket_send_buffer_size_force(&s, SOCKET_BUFFER).is_err() {
        s.set_send_buffer_size(SOCKET_BUFFER)?;
    }
    if reuseport {
        s.set_reuse_port(true)?;
    }
    s.bind(&SocketAddr::new(addr, port).into())?;
    s.set_nonblocking(true)?;
    Ok(s.into())
}

/// The window towards loopback peers (`EngineConfig::loopback_window`), in
/// PSNs, for a socket whose receive buffer the kernel reports as
/// `rcvbuf` bytes (`SO_RCVBUF`, twice what was granted: the kernel's
/// allowance for each datagram's overhead). The peers on this host get the
/// same `rmem_max`, and a burst larger than a peer's buffer is dropped and
/// resent whole (docs/PERFORMANCE.md: a distribution's default `rmem_max`
/// with the full window retransmitted about every message). Each PSN is counted at
/// twice the largest MTU (a datagram's overhead on top of its payload).
pub(crate) fn loopback_window(rcvbuf: usize) -> i32 {
    let psns = rcvbuf / (2 * 4096);
    psns.clamp(8, crate::engine::MAX_LOOPBACK_WINDOW as usize) as i32
}

/// The receive buffer the kernel reports for `s` (`SO_RCVBUF`).
pub(crate) fn recv_buffer(s: &UdpSocket) -> io::Result<usize> {
    Ok(rustix::net::sockopt::socket_recv_buffer_size(s)?)
}

/// `UDP_NO_CHECK6_RX`: Linux otherwise drops IPv6 UDP datagrams with a zero
/// checksum, which RoCEv2 senders use (the ICRC protects the payload).
fn allow_zero_udp6_checksums(s: &Socket) -> io::Result<()> {
    // linux/udp.h; the libc crate has only the _TX twin for Linux.
    const UDP_NO_CHECK6_RX: libc::c_int = 102;
    enable_udp_option(s.as_fd(), UDP_NO_CHECK6_RX)
}

/// `UDP_GRO`: runs of equal datagrams from one sender arrive as one, with
/// their size in a control message (see `batch::RxBatch`).
pub fn enable_gro(s: &UdpSocket) -> io::Result<()> {
    enable_udp_option(s.as_fd(), super::batch::UDP_GRO)
}

/// Turn on the `SOL_UDP` option `option` (an int flag) of socket `fd`.
fn enable_udp_option(fd: BorrowedFd<'_>, option: libc::c_int) -> io::Result<()> {
    let on: libc::c_int = 1;
    // SAFETY: `fd` is an open socket for the duration of the call; the
    // option value is a live c_int and its exact size is passed.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_UDP,
            option,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loopback_window_follows_the_receive_buffer() {
        // A distribution's default rmem_max (212,992), reported doubled.
        assert_eq!(loopback_window(425_984), 52);
        // 8 MiB granted (with CAP_NET_ADMIN), reported 16 MiB: the full one.
        assert_eq!(loopback_window(16 << 20), 1024);
        assert_eq!(loopback_window(8 << 20), 1024);
        // Tiny buffers keep a few PSNs.
        assert_eq!(loopback_window(4096), 8);
    }

    #[test]
    fn binds_ipv4_and_ipv6_loopback() {
        let a = bind("127.0.0.1".parse().unwrap(), 0).unwrap();
        assert!(a.local_addr().unwrap().is_ipv4());
        let b = bind("::1".parse().unwrap(), 0).unwrap();
        assert!(b.local_addr().unwrap().is_ipv6());
    }
}
