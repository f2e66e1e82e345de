//! The network interface behind a device address: its MTU sets the port's
//! active MTU, as rxe derives it from its netdev (a 1500-byte Ethernet
//! link gives 1024, jumbo frames and loopback 4096).

use crate::qp_attr::Mtu;
use std::ffi::CStr;
use std::net::IpAddr;

/// Headers around a RoCEv2 payload at most: IP, UDP (8), BTH (12), the
/// largest extension header (AtomicETH, 28), ICRC (4).
fn overhead(addr: IpAddr) -> usize {
    let ip = if addr.is_ipv4() { 20 } else { 40 };
    ip + 8 + 12 + 28 + 4
}

/// The largest IB MTU whose packets fit in a link of `link_mtu` bytes.
pub fn ib_mtu_for_link(addr: IpAddr, link_mtu: usize) -> Mtu {
    let room = link_mtu.saturating_sub(overhead(addr));
    Mtu::ALL
        .into_iter()
        .rev()
        .find(|m| m.bytes() <= room)
        .unwrap_or(Mtu::Mtu256)
}

/// The port's active MTU for a device at `addr`: from the MTU of the
/// interface that holds the address (or whose subnet holds it: 127.0.0.N
/// on `lo`); 4096 when it cannot be found.
pub fn active_mtu(addr: IpAddr) -> Mtu {
    interface_of(addr)
        .and_then(|name| std::fs::read_to_string(format!("/sys/class/net/{name}/mtu")).ok())
        .and_then(|s| s.trim().parse::<usize>().ok())
        .map_or(Mtu::Mtu4096, |m| ib_mtu_for_link(addr, m))
}

/// Why the kernel would not send from `src` to `dst` (no route: a
/// connected UDP socket's `connect` fails as a RoCE packet's route lookup
/// would), or `None` when it would. A `src` that is not (or no longer) an
/// address of this host says nothing: `None`.
pub fn route_error(src: IpAddr, dst: IpAddr) -> Option<std::io::Error> {
    let sock = std::net::UdpSocket::bind((src, 0)).ok()?;
    sock.connect((dst, 4791)).err()
}

/// The name of the interface whose address is `addr`, or else whose
/// subnet contains it.
pub fn interface_of(addr: IpAddr) -> Option<String> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list we free below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return None;
    }
    let mut exact = None;
    let mut subnet = None;
    let mut p = head;
    while !p.is_null() {
        // SAFETY: p is a node of the list getifaddrs returned, alive until
        // freeifaddrs; its address/netmask pointers are NULL or valid
        // sockaddrs of the family they say, and its name is a C string.
        let (name, a, m) = unsafe {
            let ifa = &*p;
            p = ifa.ifa_next;
            (
                CStr::from_ptr(ifa.ifa_name).to_string_lossy().into_owned(),
                sockaddr_ip(ifa.ifa_addr),
                sockaddr_ip(ifa.ifa_netmask),
            )
        };
        match (a, m) {
            (Some(a), _) if a == addr => exact = Some(name),
            (Some(a), Some(m)) if same_subnet(a, addr, m) && subnet.is_none() => {
                subnet = Some(name)
            }
            _ => {}
        }
    }
    // SAFETY: the list came from getifaddrs and is not used after this.
    unsafe { libc::freeifaddrs(head) };
    exact.or(subnet)
}

/// The IP address in a sockaddr, if it is IPv4 or IPv6.
///
/// # Safety
/// `sa` is NULL or points to a valid sockaddr of the family it states.
unsafe fn sockaddr_ip(sa: *const libc::sockaddr) -> Option<IpAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: per the contract, the family field is readable and tells the
    // real type behind the pointer.
    unsafe {
        match i32::from((*sa).sa_family) {
            libc::AF_INET => {
                let v4 = &*sa.cast::<libc::sockaddr_in>();
                Some(IpAddr::from(u32::from_be(v4.sin_addr.s_addr).to_be_bytes()))
            }
            libc::AF_INET6 => {
                let v6 = &*sa.cast::<libc::sockaddr_in6>();
                Some(IpAddr::from(v6.sin6_addr.s6_addr))
            }
            _ => None,
        }
    }
}

fn same_subnet(a: IpAddr, b: IpAddr, mask: IpAddr) -> bool {
    match (a, b, mask) {
        (IpAddr::V4(a), IpAddr::V4(b), IpAddr::V4(m)) => {
            let m = u32::from(m);
            m != 0 && u32::from(a) & m == u32::from(b) & m
        }
        (IpAddr::V6(a), IpAddr::V6(b), IpAddr::V6(m)) => {
            let m = u128::from(m);
            m != 0 && u128::from(a) & m == u128::from(b) & m
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_mtus_map_like_rxe() {
        let v4: IpAddr = "10.0.0.1".parse().unwrap();
        let v6: IpAddr = "fd00::1".parse().unwrap();
        assert_eq!(ib_mtu_for_link(v4, 1500), Mtu::Mtu1024);
        assert_eq!(ib_mtu_for_link(v4, 9000), Mtu::Mtu4096);
        assert_eq!(ib_mtu_for_link(v4, 65536), Mtu::Mtu4096);
        assert_eq!(ib_mtu_for_link(v4, 4096 + 72), Mtu::Mtu4096);
        assert_eq!(ib_mtu_for_link(v4, 4096 + 71), Mtu::Mtu2048);
        assert_eq!(ib_mtu_for_link(v6, 1280), Mtu::Mtu1024);
        assert_eq!(ib_mtu_for_link(v4, 100), Mtu::Mtu256);
    }

    #[test]
    fn loopback_addresses_are_on_lo() {
        // 127.0.0.N is not an address of `lo`, but in its subnet.
        let a: IpAddr = "127.0.77.9".parse().unwrap();
        assert_eq!(interface_of(a).as_deref(), Some("lo"));
        assert_eq!(active_mtu(a), Mtu::Mtu4096);
    }
}
