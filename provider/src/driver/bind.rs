//! How a device takes its address: its own socket on UDP port 4791, or,
//! where the kernel's rxe holds port 4791 on every address, a claim on
//! [`SHARED_MODE_PORT`] and a raw socket; or the first free loopback
//! address when none is configured.

use super::device::ROCEV2_PORT;
use super::lid::addr_of_lid;
use super::socket;
use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};

/// The UDP port a device sends from, and holds as its claim on its
/// address, where port 4791 belongs to the kernel's rxe (see `AddressClaim`).
pub const SHARED_MODE_PORT: u16 = 47910;

/// Sockets a device sends from (each on its own ephemeral UDP port): the
/// source ports its QPs spread over.
pub(super) const SEND_SOCKETS: usize = 8;

/// How a device owns its address: its own socket on port 4791, or, where
/// the kernel's rxe holds `0.0.0.0:4791`, a claim on [`SHARED_MODE_PORT`]
/// (which it sends from) and a raw socket that receives what is addressed
/// to port 4791 of its address. RoCEv2 fixes only the destination port.
/// rxe sees the same packets on its socket and ignores those for
/// interfaces it is not attached to (loopback).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AddressClaim {
    /// Port 4791 of the address, a socket of ours.
    Port4791,
    /// `0.0.0.0:4791` (or `[::]:4791`) is held by the kernel's rxe: the
    /// claim port, and port 4791 shared through a raw socket.
    ClaimPort,
}

/// Whether a wildcard socket holds port 4791 (the kernel's rxe does from
/// `rdma link add`), read from `/proc/net/udp{,6}`.
pub(super) fn wildcard_4791_held(v6: bool) -> bool {
    let (file, wildcard) = if v6 {
        ("/proc/net/udp6", "00000000000000000000000000000000:12B7")
    } else {
        ("/proc/net/udp", "00000000:12B7")
    };
    std::fs::read_to_string(file).is_ok_and(|t| {
        t.lines()
            .skip(1)
            .any(|l| l.split_whitespace().nth(1) == Some(wildcard))
    })
}

/// Bind `addr`'s socket: port 4791, or in shared mode the claim port.
pub(super) fn bind_device(addr: IpAddr) -> io::Result<(UdpSocket, AddressClaim)> {
    match socket::bind(addr, ROCEV2_PORT) {
        Ok(s) => Ok((s, AddressClaim::Port4791)),
        Err(e) if e.kind() == io::ErrorKind::AddrInUse && wildcard_4791_held(addr.is_ipv6()) => {
            let s = socket::bind(addr, SHARED_MODE_PORT).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!(
                        "port 4791 is held by another socket on every address (the kernel's \
                         rxe); sharing it, {} is taken: {e}",
                        SocketAddr::new(addr, SHARED_MODE_PORT)
                    ),
                )
            })?;
            Ok((s, AddressClaim::ClaimPort))
        }
        Err(e) => Err(io::Error::new(
            e.kind(),
            format!("binding {}: {e}", SocketAddr::new(addr, ROCEV2_PORT)),
        )),
    }
}

/// The address a device without a configured one would take if opened
/// now (`ibv_devices` shows its GUID before any open): the first
/// 127.0.0.N whose port 4791 (or, beside rxe, whose claim port) no socket
/// holds, per `/proc/net/udp`.
pub fn next_auto_addr() -> Option<IpAddr> {
    let table = std::fs::read_to_string("/proc/net/udp").ok()?;
    let port = if wildcard_4791_held(false) {
        SHARED_MODE_PORT
    } else {
        ROCEV2_PORT
    };
    let bound: std::collections::HashSet<String> = table
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().nth(1).map(str::to_string))
        .collect();
    (1..=0xBFFFu16).filter_map(addr_of_lid).find(|a| {
        let IpAddr::V4(v4) = a else { return false };
        let key = format!("{:08X}:{port:04X}", u32::from_le_bytes(v4.octets()));
        !bound.contains(&key)
    })
}

/// Bind the first free loopback address from 127.0.0.1 upward.
pub(super) fn bind_auto() -> io::Result<(IpAddr, UdpSocket, AddressClaim)> {
    for lid in 1..=0xBFFFu16 {
        let Some(addr) = addr_of_lid(lid) else {
            continue;
        };
        match bind_device(addr) {
            Ok((s, shared)) => return Ok((addr, s, shared)),
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => continue,
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AddrInUse,
        "every loopback address 127.0.0.1 .. 127.0.191.255 has port 4791 taken",
    ))
}

/// The one line that explains a shared-mode device without CAP_NET_RAW.
pub(super) fn shared_mode_needs_raw(addr: IpAddr, e: io::Error) -> io::Error {
    io::Error::new(
        e.kind(),
        format!(
            "{addr}: port 4791 is held by the kernel's rxe (0.0.0.0:4791); roxe shares it by \
             receiving from a raw socket, which needs CAP_NET_RAW: run as root, or \
             `setcap cap_net_raw+ep` the program, or remove the rxe link (`rdma link delete`)"
        ),
    )
}
