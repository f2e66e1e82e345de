//! Addresses: `sockaddr`s to and from Rust's, an address's GID,
//! `rdma_getaddrinfo` / `rdma_freeaddrinfo`, and an id's ports
//! (`rdma_get_src_port`, `rdma_get_dst_port`).

use super::id::id_priv;
use crate::abi::*;
use crate::{fail_minus_one, guard};
use std::ffi::{c_char, c_int};
use std::mem::{size_of, zeroed};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::ptr::{self, null_mut};

/// A `sockaddr` from C: IPv4 or IPv6, else None.
///
/// # Safety
/// `sa` must be NULL or point to a sockaddr of its family's size.
pub(super) unsafe fn from_sockaddr(sa: *const libc::sockaddr) -> Option<SocketAddr> {
    // SAFETY: per the contract.
    let family = c_int::from(unsafe { sa.as_ref() }?.sa_family);
    match family {
        libc::AF_INET => {
            // SAFETY: an AF_INET sockaddr is a sockaddr_in.
            let a = unsafe { &*sa.cast::<libc::sockaddr_in>() };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
                u16::from_be(a.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: an AF_INET6 sockaddr is a sockaddr_in6.
            let a = unsafe { &*sa.cast::<libc::sockaddr_in6>() };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(a.sin6_addr.s6_addr),
                u16::from_be(a.sin6_port),
                a.sin6_flowinfo,
                a.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// A `sockaddr_storage` holding `addr` (all zero for None) and its length.
pub(super) fn to_storage(addr: Option<SocketAddr>) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain data; all-zero is AF_UNSPEC.
    let mut ss: libc::sockaddr_storage = unsafe { zeroed() };
    let len = match addr {
        None => 0,
        Some(SocketAddr::V4(a)) => {
            // SAFETY: sockaddr_storage is larger than and as aligned as
            // sockaddr_in.
            let sin = unsafe { &mut *ptr::addr_of_mut!(ss).cast::<libc::sockaddr_in>() };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = a.port().to_be();
            sin.sin_addr.s_addr = u32::from(*a.ip()).to_be();
            size_of::<libc::sockaddr_in>()
        }
        Some(SocketAddr::V6(a)) => {
            // SAFETY: as above, for sockaddr_in6.
            let sin6 = unsafe { &mut *ptr::addr_of_mut!(ss).cast::<libc::sockaddr_in6>() };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = a.port().to_be();
            sin6.sin6_addr.s6_addr = a.ip().octets();
            sin6.sin6_flowinfo = a.flowinfo();
            sin6.sin6_scope_id = a.scope_id();
            size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

/// The RoCEv2 GID of an address.
pub(super) fn gid(addr: IpAddr) -> ibv_gid {
    ibv_gid {
        raw: roxe_provider::engine::gid_of(addr),
    }
}

/// The id's local port, in network byte order (0 without one).
///
/// # Safety
/// `id` is NULL or any pointer (only a live id of this library is used:
/// the rest are EINVAL); a live id is not destroyed during the call.
#[no_mangle]
pub unsafe extern "C" fn rdma_get_src_port(id: *mut rdma_cm_id) -> u16 {
    guard(0, || match id_priv(id) {
        // SAFETY: p is live.
        Some(p) => unsafe { (*p).cm.local_addr() }.map_or(0, |a| a.port().to_be()),
        None => 0,
    })
}

/// The id's peer's port, in network byte order (0 without one).
///
/// # Safety
/// `id` is NULL or any pointer (only a live id of this library is used:
/// the rest are EINVAL); a live id is not destroyed during the call.
#[no_mangle]
pub unsafe extern "C" fn rdma_get_dst_port(id: *mut rdma_cm_id) -> u16 {
    guard(0, || match id_priv(id) {
        // SAFETY: p is live.
        Some(p) => unsafe { (*p).cm.peer_addr() }.map_or(0, |a| a.port().to_be()),
        None => 0,
    })
}

/// A malloc'ed copy of a sockaddr (freed by rdma_freeaddrinfo).
///
/// # Safety
/// `sa` must cover `len` bytes.
unsafe fn copy_addr(sa: *const libc::sockaddr, len: libc::socklen_t) -> *mut libc::sockaddr {
    // SAFETY: malloc of len bytes, filled from the caller's len bytes.
    unsafe {
        let p = libc::malloc(len as usize).cast::<libc::sockaddr>();
        if !p.is_null() {
            ptr::copy_nonoverlapping(sa.cast::<u8>(), p.cast::<u8>(), len as usize);
        }
        p
    }
}

/// The address of `node`/`service` (through `getaddrinfo`) or of the
/// hints' addresses, as one `rdma_addrinfo` (freed by
/// `rdma_freeaddrinfo`).
///
/// # Safety
/// `node` and `service` are NULL or C strings; `hints` is NULL or the
/// caller's, its addresses covering their lengths; `res` is NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    guard(-1, || {
        if res.is_null() || (node.is_null() && service.is_null() && hints.is_null()) {
            return fail_minus_one(libc::EINVAL);
        }
        // SAFETY: rdma_addrinfo is integers and pointers.
        let none: rdma_addrinfo = unsafe { zeroed() };
        // SAFETY: hints NULL or the caller's.
        let h = unsafe { hints.as_ref() }.unwrap_or(&none);
        // SAFETY: calloc'ed, freed by rdma_freeaddrinfo.
        let rai = unsafe { libc::calloc(1, size_of::<rdma_addrinfo>()) }.cast::<rdma_addrinfo>();
        if rai.is_null() {
            return fail_minus_one(libc::ENOMEM);
        }
        // SAFETY: rai is a fresh zeroed allocation.
        let r = unsafe { &mut *rai };
        if !node.is_null() || !service.is_null() {
            // SAFETY: addrinfo is integers and pointers.
            let mut ai_hints: libc::addrinfo = unsafe { zeroed() };
            if h.ai_flags & RAI_PASSIVE != 0 {
                ai_hints.ai_flags = libc::AI_PASSIVE;
            }
            if h.ai_flags & RAI_NUMERICHOST != 0 {
                ai_hints.ai_flags |= libc::AI_NUMERICHOST;
            }
            ai_hints.ai_family = h.ai_family;
            ai_hints.ai_socktype = if h.ai_qp_type == IBV_QPT_UD as c_int {
                libc::SOCK_DGRAM
            } else if h.ai_qp_type != 0 {
                libc::SOCK_STREAM
            } else {
                0
            };
            ai_hints.ai_protocol = match h.ai_port_space as u32 {
                RDMA_PS_TCP => libc::IPPROTO_TCP,
                RDMA_PS_UDP | RDMA_PS_IPOIB => libc::IPPROTO_UDP,
                _ => 0,
            };
            let mut ai: *mut libc::addrinfo = null_mut();
            // SAFETY: node/service NULL or C strings; ai the out-pointer.
            let rc = unsafe {
                libc::getaddrinfo(
                    node,
                    service,
                    if hints.is_null() {
                        ptr::null()
                    } else {
                        &ai_hints
                    },
                    &mut ai,
                )
            };
            if rc != 0 {
                // SAFETY: rai is ours, partly filled.
                unsafe { rdma_freeaddrinfo(rai) };
                return rc;
            }
            // SAFETY: getaddrinfo returned a non-empty list.
            let a = unsafe { &*ai };
            r.ai_qp_type = if h.ai_qp_type != 0 {
                h.ai_qp_type
            } else if a.ai_socktype == libc::SOCK_DGRAM {
                IBV_QPT_UD as c_int
            } else {
                IBV_QPT_RC as c_int
            };
            r.ai_port_space = if h.ai_port_space != 0 {
                h.ai_port_space
            } else if a.ai_protocol == libc::IPPROTO_UDP {
                RDMA_PS_UDP as c_int
            } else {
                RDMA_PS_TCP as c_int
            };
            r.ai_family = a.ai_family;
            // SAFETY: a.ai_addr covers a.ai_addrlen bytes.
            let copy = unsafe { copy_addr(a.ai_addr, a.ai_addrlen) };
            if a.ai_flags & libc::AI_PASSIVE != 0 {
                r.ai_flags = RAI_PASSIVE;
                r.ai_src_addr = copy;
                r.ai_src_len = a.ai_addrlen;
            } else {
                r.ai_dst_addr = copy;
                r.ai_dst_len = a.ai_addrlen;
            }
            // SAFETY: ai came from getaddrinfo.
            unsafe { libc::freeaddrinfo(ai) };
            if copy.is_null() {
                // SAFETY: rai is ours.
                unsafe { rdma_freeaddrinfo(rai) };
                return fail_minus_one(libc::ENOMEM);
            }
        } else {
            r.ai_flags = h.ai_flags;
            r.ai_family = h.ai_family;
            r.ai_qp_type = h.ai_qp_type;
            r.ai_port_space = h.ai_port_space;
            if h.ai_dst_len > 0 && !h.ai_dst_addr.is_null() {
                // SAFETY: the hints' address covers its length.
                r.ai_dst_addr = unsafe { copy_addr(h.ai_dst_addr, h.ai_dst_len) };
                r.ai_dst_len = h.ai_dst_len;
            }
        }
        if r.ai_src_len == 0 && h.ai_src_len > 0 && !h.ai_src_addr.is_null() {
            // SAFETY: the hints' address covers its length.
            r.ai_src_addr = unsafe { copy_addr(h.ai_src_addr, h.ai_src_len) };
            r.ai_src_len = h.ai_src_len;
        }
        // SAFETY: the caller's out-pointer.
        unsafe { *res = rai };
        0
    })
}

/// # Safety
/// `res` is NULL or a list from `rdma_getaddrinfo`, not used again.
#[no_mangle]
pub unsafe extern "C" fn rdma_freeaddrinfo(res: *mut rdma_addrinfo) {
    let mut cur = res;
    while !cur.is_null() {
        // SAFETY: a list rdma_getaddrinfo built from malloc'ed parts.
        unsafe {
            let next = (*cur).ai_next;
            libc::free((*cur).ai_src_addr.cast());
            libc::free((*cur).ai_dst_addr.cast());
            libc::free((*cur).ai_src_canonname.cast());
            libc::free((*cur).ai_dst_canonname.cast());
            libc::free((*cur).ai_route);
            libc::free((*cur).ai_connect);
            libc::free(cur.cast());
            cur = next;
        }
    }
}
