//! Loopback addresses and ports for the workspace's tests, never shared
//! (and, in [`roce_check`], how the tests pass their captures through the
//! independent checker).
//!
//! Tests open soft devices (each one IP address with UDP port 4791) and run
//! programs that listen on TCP ports. Cargo runs the tests of one binary on
//! parallel threads, nextest runs each in its own process, and a test may
//! start processes of its own; two tests that chose the same address or
//! port fail with `EADDRINUSE` whenever they happen to overlap. Every test
//! therefore takes its addresses and ports from here:
//!
//! ```no_run
//! let server = roxe_testnet::addr(); // e.g. 127.0.7.13
//! let port = roxe_testnet::port(); // e.g. 20412
//! # let _ = (server, port);
//! ```
//!
//! A lease is held until the process exits (its lock goes with the process,
//! however it ends), so a test cannot lose one early by dropping it.
//! Across processes, leases are `flock`s on one file per address or port
//! in `$TMPDIR/roxe-testnet`: no two live processes hold the same one. A
//! per-user cursor hands them out in rotation, so an address or port freed
//! by an ended process is taken again only after the whole pool has gone
//! round (a child process still exiting, or a TCP port in TIME_WAIT, does
//! not meet the next test). Each candidate is also probed by binding it,
//! so one held by something outside the tests (another user's device, a
//! server) is skipped.
//!
//! The pools:
//! - addresses 127.0.2.1 .. 127.0.191.254 (host parts 1..=254): inside the
//!   range roxe gives LIDs to (127.0.x.y has LID x·256 + y), so programs
//!   that address by LID work, and above 127.0.0.N / 127.0.1.N, where a
//!   device opened without an address takes the first free one;
//! - ports 20000 .. 31999: below Linux's ephemeral range (32768 up), so a
//!   kernel-chosen port never meets a leased one.
//!
//! `tests/no_fixed_addresses.rs` fails when a test of the workspace names a
//! loopback address or a port of its own instead.

pub mod roce_check;

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, UdpSocket};
use std::path::PathBuf;
use std::sync::Mutex;

use rustix::fs::{flock, FlockOperation};

/// The host that control connections (the TCP exchanges of perftest,
/// `ibv_*_pingpong`, `roxe perf`) go to: every TCP server listens on all
/// addresses, on a port from [`port`]. Not a device address.
pub const CONTROL_HOST: &str = "127.0.0.1";

/// The UDP ports a soft device binds on its address: RoCEv2's, and the
/// claim port it uses beside the kernel's rxe.
const DEVICE_PORTS: [u16; 2] = [4791, 47910];

/// Host parts per third octet in the address pool (1..=254).
const HOSTS_PER_SUBNET: u32 = 254;
/// The first third octet of the pool (127.0.0.N and 127.0.1.N are left to
/// devices that take the first free address).
const FIRST_SUBNET: u32 = 2;
/// One past the last third octet (LIDs end at 127.0.191.255).
const END_SUBNET: u32 = 192;
const ADDRESSES: u32 = (END_SUBNET - FIRST_SUBNET) * HOSTS_PER_SUBNET;

const FIRST_PORT: u32 = 20000;
const PORTS: u32 = 12000;

/// The lock files of this process's leases, kept open until it exits.
static HELD: Mutex<Vec<File>> = Mutex::new(Vec::new());

/// A loopback address no other live test holds, with UDP ports 4791 and
/// 47910 free on it: a soft device's address.
pub fn addr() -> Ipv4Addr {
    let i = lease(Kind::Addr);
    let third = FIRST_SUBNET + i / HOSTS_PER_SUBNET;
    let fourth = 1 + i % HOSTS_PER_SUBNET;
    Ipv4Addr::new(127, 0, third as u8, fourth as u8)
}

/// `N` distinct addresses from [`addr`].
pub fn addrs<const N: usize>() -> [Ipv4Addr; N] {
    std::array::from_fn(|_| addr())
}

/// A port no other live test holds, free for TCP and UDP on every address:
/// a control port, a listener's port, an rdma_cm port.
pub fn port() -> u16 {
    (FIRST_PORT + lease(Kind::Port)) as u16
}

#[derive(Clone, Copy)]
enum Kind {
    Addr,
    Port,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Addr => "addr",
            Kind::Port => "port",
        }
    }

    fn pool(self) -> u32 {
        match self {
            Kind::Addr => ADDRESSES,
            Kind::Port => PORTS,
        }
    }

    /// Whether the resource at pool index `i` is free outside the leases.
    fn probe(self, i: u32) -> bool {
        match self {
            Kind::Addr => {
                let third = FIRST_SUBNET + i / HOSTS_PER_SUBNET;
                let fourth = 1 + i % HOSTS_PER_SUBNET;
                let ip = IpAddr::V4(Ipv4Addr::new(127, 0, third as u8, fourth as u8));
                let [rocev2, claim] = DEVICE_PORTS;
                // Where the kernel's rxe holds 0.0.0.0:4791, no address's
                // 4791 binds, and devices hold the claim port instead.
                let rocev2_free =
                    UdpSocket::bind(SocketAddr::new(ip, rocev2)).is_ok() || wildcard_rocev2_held();
                rocev2_free && UdpSocket::bind(SocketAddr::new(ip, claim)).is_ok()
            }
            Kind::Port => {
                let port = (FIRST_PORT + i) as u16;
                let any4 = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port);
                let any6 = SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), port);
                let v6_ok = |r: std::io::Result<()>| match r {
                    Ok(()) => true,
                    // A host without IPv6 holds nothing there.
                    Err(e) => e.kind() != std::io::ErrorKind::AddrInUse,
                };
                TcpListener::bind(any4).is_ok()
                    && UdpSocket::bind(any4).is_ok()
                    && v6_ok(TcpListener::bind(any6).map(drop))
                    && v6_ok(UdpSocket::bind(any6).map(drop))
            }
        }
    }
}

/// Whether a socket holds UDP port 4791 on every IPv4 address (the
/// kernel's rxe does), per `/proc/net/udp`.
fn wildcard_rocev2_held() -> bool {
    std::fs::read_to_string("/proc/net/udp").is_ok_and(|t| {
        t.lines()
            .skip(1)
            .any(|l| l.split_whitespace().nth(1) == Some("00000000:12B7"))
    })
}

/// The IPv6 loopback address `::1`, the only one there is, held for the
/// rest of the process (a device on it may outlive the test): a test in
/// another process that asks for it waits until this one exits, and a
/// second test of this process that asks for it fails, naming the first.
pub fn ipv6_loopback(test: &str) -> Ipv6Addr {
    static HOLDER: Mutex<Option<String>> = Mutex::new(None);
    let mut holder = HOLDER.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(first) = holder.as_ref() {
        panic!("roxe-testnet: ::1 is held by {first} in this process; {test} cannot have it too");
    }
    let path = dir().join("addr-v6-loopback");
    let lock = open_lock(&path)
        .unwrap_or_else(|e| panic!("roxe-testnet: opening {}: {e}", path.display()));
    flock(&lock, FlockOperation::LockExclusive)
        .unwrap_or_else(|e| panic!("roxe-testnet: locking {}: {e}", path.display()));
    HELD.lock().unwrap_or_else(|p| p.into_inner()).push(lock);
    *holder = Some(test.to_string());
    Ipv6Addr::LOCALHOST
}

/// The directory of the lock files, shared by every user of the host (so
/// one user's tests skip what another's hold).
fn dir() -> PathBuf {
    let d = std::env::temp_dir().join("roxe-testnet");
    if std::fs::create_dir(&d).is_ok() {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o1777));
    }
    d
}

/// Open `path` to lock it: read-write, created if missing; read-only when
/// another user created it (`flock` works on either).
fn open_lock(path: &PathBuf) -> std::io::Result<File> {
    match OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
    {
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => File::open(path),
        r => r,
    }
}

/// Take the next free index of `kind`'s pool and hold it until the process
/// exits.
fn lease(kind: Kind) -> u32 {
    lease_in(&dir(), kind)
}

/// [`lease`] with the lock files in `dir`.
fn lease_in(dir: &std::path::Path, kind: Kind) -> u32 {
    let uid = rustix::process::getuid().as_raw();
    let cursor_path = dir.join(format!("cursor-{}-{uid}", kind.name()));
    let mut cursor = open_lock(&cursor_path)
        .unwrap_or_else(|e| panic!("roxe-testnet: opening {}: {e}", cursor_path.display()));
    flock(&cursor, FlockOperation::LockExclusive)
        .unwrap_or_else(|e| panic!("roxe-testnet: locking {}: {e}", cursor_path.display()));
    let mut text = String::new();
    let _ = cursor.read_to_string(&mut text);
    let start = text.trim().parse::<u32>().unwrap_or(0) % kind.pool();
    for step in 0..kind.pool() {
        let i = (start + step) % kind.pool();
        let path = dir.join(format!("{}-{i}", kind.name()));
        let Ok(file) = open_lock(&path) else {
            continue;
        };
        if flock(&file, FlockOperation::NonBlockingLockExclusive).is_err() {
            continue; // another live process holds it
        }
        if !kind.probe(i) {
            continue; // in use outside the leases; the lock goes with `file`
        }
        HELD.lock().unwrap_or_else(|p| p.into_inner()).push(file);
        let next = (i + 1) % kind.pool();
        let _ = cursor.seek(SeekFrom::Start(0));
        let _ = cursor.set_len(0);
        let _ = write!(cursor, "{next}");
        return i;
    }
    panic!(
        "roxe-testnet: every {} of the pool is held or in use ({} of them)",
        kind.name(),
        kind.pool()
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn leases_are_distinct_and_in_the_pools() {
        let addrs: Vec<Ipv4Addr> = (0..300).map(|_| addr()).collect();
        let unique: HashSet<_> = addrs.iter().collect();
        assert_eq!(unique.len(), addrs.len(), "an address leased twice");
        for a in &addrs {
            let o = a.octets();
            assert_eq!((o[0], o[1]), (127, 0), "{a}");
            assert!((2..192).contains(&o[2]) && (1..=254).contains(&o[3]), "{a}");
        }
        let ports: Vec<u16> = (0..300).map(|_| port()).collect();
        let unique: HashSet<_> = ports.iter().collect();
        assert_eq!(unique.len(), ports.len(), "a port leased twice");
        assert!(ports.iter().all(|p| (20000..32000).contains(p)));
    }

    #[test]
    fn leases_from_parallel_threads_are_distinct() {
        let all: Vec<(Ipv4Addr, u16)> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..8)
                .map(|_| s.spawn(|| (0..50).map(|_| (addr(), port())).collect::<Vec<_>>()))
                .collect();
            hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
        });
        let a: HashSet<_> = all.iter().map(|x| x.0).collect();
        let p: HashSet<_> = all.iter().map(|x| x.1).collect();
        assert_eq!((a.len(), p.len()), (all.len(), all.len()));
    }

    #[test]
    fn ipv6_loopback_serves_one_test_of_a_process() {
        assert_eq!(ipv6_loopback("first"), Ipv6Addr::LOCALHOST);
        let second = std::panic::catch_unwind(|| ipv6_loopback("second"));
        assert!(second.is_err());
    }

    #[test]
    fn an_address_in_use_is_skipped() {
        // A pool of our own whose cursor points at an address whose port
        // 4791 something outside the leases holds: the lease passes it by.
        let dir = std::env::temp_dir().join(format!("roxe-testnet-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (index, _squatter) = (ADDRESSES - 300..ADDRESSES)
            .find_map(|i| {
                let third = FIRST_SUBNET + i / HOSTS_PER_SUBNET;
                let fourth = 1 + i % HOSTS_PER_SUBNET;
                let a = Ipv4Addr::new(127, 0, third as u8, fourth as u8);
                UdpSocket::bind((a, 4791)).ok().map(|s| (i, s))
            })
            .expect("a free loopback address to hold");
        let uid = rustix::process::getuid().as_raw();
        std::fs::write(dir.join(format!("cursor-addr-{uid}")), index.to_string()).unwrap();
        let got = lease_in(&dir, Kind::Addr);
        assert_ne!(got, index, "leased an address whose port 4791 was taken");
        assert!(!Kind::Addr.probe(index));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_port_in_use_is_skipped() {
        let dir = std::env::temp_dir().join(format!("roxe-testnet-ptest-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (index, _squatter) = (PORTS - 300..PORTS)
            .find_map(|i| {
                let p = (FIRST_PORT + i) as u16;
                TcpListener::bind((Ipv4Addr::UNSPECIFIED, p))
                    .ok()
                    .map(|s| (i, s))
            })
            .expect("a free port to hold");
        let uid = rustix::process::getuid().as_raw();
        std::fs::write(dir.join(format!("cursor-port-{uid}")), index.to_string()).unwrap();
        assert_ne!(lease_in(&dir, Kind::Port), index);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
