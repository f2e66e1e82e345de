//! `roxe capture -i IFACE`: live RoCEv2 capture with ICRC verdicts.
//!
//! A packet socket (`AF_PACKET`, `SOCK_DGRAM`, every protocol) bound to the
//! interface shows each IP datagram with the IP header as it was on the
//! wire, so the ICRC is verified over the identification, flow label and
//! addresses the packet really carried (rxe's and NICs' packets verify too).
//! Each RoCEv2 packet is decoded and printed as `roxe decode` prints it; a
//! summary follows, and the exit status is `roxe decode`'s (1 when any
//! packet was malformed, truncated or failed its ICRC).
//!
//! The existing raw-socket approach of the driver serves here rather than
//! pnet's datalink layer: it is a few `libc` calls, it gives the
//! direction of each packet (`sll_pkttype`: on `lo` every packet is seen
//! once going out and once coming in, and only the second is kept), and it
//! adds no dependency to the workspace.
//!
//! On `lo` and veth a sender's UDP GSO sends (roxe with `ROXE_GSO=on`) reach
//! the socket uncut: with `PACKET_VNET_HDR` each packet comes with its
//! virtio-net header, whose `gso_size` says how the kernel will cut it; the
//! capture cuts it the same way (IPv4 identification one higher per
//! segment, as `inet_gso_segment` numbers them) and verifies each segment.

use crate::decode::{decode_frame, print_packet, print_summary, tally, Summary};
use clap::Args as ClapArgs;
use roxe_wire::pcap::{self, CaptureRecord, LinkType};
use std::ffi::CString;
use std::io::Write as _;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Arguments of `roxe capture`.
#[derive(ClapArgs, Debug)]
pub struct Args {
    /// The interface to capture on (e.g. lo, eth0).
    #[arg(short = 'i', long = "interface", value_name = "IFACE")]
    iface: String,
    /// Stop after this many RoCEv2 packets.
    #[arg(short = 'c', long, value_name = "COUNT")]
    count: Option<u64>,
    /// Also write the RoCEv2 packets to this pcap file.
    #[arg(short = 'w', long, value_name = "FILE")]
    write: Option<PathBuf>,
    /// Stop after this many seconds (0: run until -c or interrupted).
    #[arg(long, value_name = "SECS", default_value_t = 0)]
    timeout: u64,
    /// Also print every header field of each packet.
    #[arg(short, long)]
    verbose: bool,
    /// Treat this UDP destination port as RoCEv2 too (4791 always is).
    #[arg(long, value_name = "PORT")]
    port: Vec<u16>,
}

const ETH_P_ALL: u16 = 0x0003;
/// `PACKET_VNET_HDR` (linux/if_packet.h).
const PACKET_VNET_HDR: libc::c_int = 15;
/// `struct virtio_net_hdr`: flags, gso_type, hdr_len, gso_size,
/// csum_start, csum_offset (host byte order).
const VNET_HDR_LEN: usize = 10;
/// `VIRTIO_NET_HDR_GSO_UDP_L4` (and `_UDP`, UFO).
const GSO_UDP_L4: u8 = 5;
const GSO_UDP: u8 = 3;
const PACKET_OUTGOING: u8 = 4;
const ARPHRD_LOOPBACK: &str = "772";

/// A packet socket on `iface`, every protocol, non-blocking.
fn open(iface: &str) -> Result<OwnedFd, String> {
    let name = CString::new(iface).map_err(|_| format!("{iface:?}: not an interface name"))?;
    // SAFETY: if_nametoindex reads a valid C string.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if index == 0 {
        return Err(format!("roxe capture: no interface {iface:?}"));
    }
    // SAFETY: socket(2) with constant arguments.
    let fd = unsafe {
        libc::socket(
            libc::AF_PACKET,
            // SOCK_RAW: PACKET_VNET_HDR needs it; the link header is cut
            // below (`link_header_len`).
            libc::SOCK_RAW | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            i32::from(ETH_P_ALL.to_be()),
        )
    };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        return Err(match e.raw_os_error() {
            Some(libc::EPERM) | Some(libc::EACCES) => format!(
                "roxe capture needs CAP_NET_RAW (a packet socket): run as root, or \
                 `setcap cap_net_raw+ep` roxe ({e})"
            ),
            _ => format!("roxe capture: opening a packet socket: {e}"),
        });
    }
    // SAFETY: fd was just returned by socket(2) and is owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: sockaddr_ll is plain data; all-zero is a valid start.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = ETH_P_ALL.to_be();
    sll.sll_ifindex = index as i32;
    // SAFETY: bind with a sockaddr_ll of its own size.
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            std::ptr::addr_of!(sll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(format!(
            "roxe capture: binding to {iface}: {}",
            std::io::Error::last_os_error()
        ));
    }
    let on: libc::c_int = 1;
    // SAFETY: setsockopt with an int option of its size.
    if unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_PACKET,
            PACKET_VNET_HDR,
            std::ptr::addr_of!(on).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    } != 0
    {
        return Err(format!(
            "roxe capture: PACKET_VNET_HDR: {}",
            std::io::Error::last_os_error()
        ));
    }
    // A deep queue: bursts of a fast sender must not overflow it while
    // lines are printed (the forced size needs CAP_NET_ADMIN).
    let size: libc::c_int = 32 << 20;
    for opt in [libc::SO_RCVBUFFORCE, libc::SO_RCVBUF] {
        // SAFETY: setsockopt with an int option of its size.
        let rc = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                std::ptr::addr_of!(size).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc == 0 {
            break;
        }
    }
    Ok(fd)
}

/// Packets the kernel dropped because the queue was full, since the last
/// call (`PACKET_STATISTICS`).
fn kernel_drops(fd: &OwnedFd) -> u64 {
    // SAFETY: tpacket_stats is two u32s.
    let mut st: libc::tpacket_stats = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tpacket_stats>() as libc::socklen_t;
    // SAFETY: getsockopt into a struct of the given size.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_PACKET,
            libc::PACKET_STATISTICS,
            std::ptr::addr_of_mut!(st).cast(),
            &mut len,
        )
    };
    if rc == 0 {
        u64::from(st.tp_drops)
    } else {
        0
    }
}

/// Whether `iface` is a loopback device (each packet seen in both
/// directions).
fn is_loopback(iface: &str) -> bool {
    std::fs::read_to_string(Path::new("/sys/class/net").join(iface).join("type"))
        .is_ok_and(|t| t.trim() == ARPHRD_LOOPBACK)
}

/// Bytes of link-layer header before the IP header, by `sll_hatype`:
/// Ethernet-like (Ethernet, loopback) 14, plus 4 per VLAN tag; none for
/// IP-only devices (tun, WireGuard).
fn link_header_len(hatype: u16, frame: &[u8]) -> usize {
    const ARPHRD_ETHER: u16 = 1;
    const ARPHRD_LOOPBACK_TYPE: u16 = 772;
    if hatype != ARPHRD_ETHER && hatype != ARPHRD_LOOPBACK_TYPE {
        return 0;
    }
    let mut off = 12;
    while frame
        .get(off..off + 2)
        .is_some_and(|t| t == [0x81, 0x00] || t == [0x88, 0xa8])
    {
        off += 4;
    }
    off + 2
}

/// One frame, its packet type and link type, or None when nothing waits.
fn receive(fd: &OwnedFd, buf: &mut [u8]) -> Option<(usize, u8, u16)> {
    // SAFETY: sockaddr_ll is plain data.
    let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
    // SAFETY: recvfrom into our buffer and address of the given sizes.
    let n = unsafe {
        libc::recvfrom(
            fd.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_TRUNC,
            std::ptr::addr_of_mut!(from).cast(),
            &mut len,
        )
    };
    (n >= 0).then_some((n as usize, from.sll_pkttype, from.sll_hatype))
}

/// Wait at most `ms` for the socket to be readable.
fn wait(fd: &OwnedFd, ms: i32) {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: poll on one valid pollfd.
    unsafe { libc::poll(&mut p, 1, ms) };
}

/// Set by SIGINT/SIGTERM: stop, print the summary, flush the file.
static STOP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn on_stop_signal(_: libc::c_int) {
    STOP.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// The internet checksum of an IPv4 header (its checksum field zero).
fn ipv4_checksum(h: &[u8]) -> u16 {
    let mut sum: u32 = h
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// The datagrams a UDP GSO send of `gso_size`-byte segments becomes on the
/// wire: each with its own IP and UDP header (lengths, IPv4 identification
/// and header checksum set; UDP checksum 0, as RoCEv2 senders leave it).
/// None for anything but IPv4/IPv6 + UDP.
pub fn split_udp_gso(ip: &[u8], gso_size: usize) -> Option<Vec<Vec<u8>>> {
    if gso_size == 0 {
        return None;
    }
    let v4 = ip.first()? >> 4 == 4;
    let ip_len = if v4 {
        usize::from(ip[0] & 0x0f) * 4
    } else {
        40
    };
    let proto = if v4 { *ip.get(9)? } else { *ip.get(6)? };
    // A header shorter than IPv4's minimum is no packet the kernel built.
    if proto != 17 || ip_len < 20 || ip.len() < ip_len + 8 {
        return None;
    }
    let payload = &ip[ip_len + 8..];
    let id = if v4 {
        u16::from_be_bytes([ip[4], ip[5]])
    } else {
        0
    };
    let mut out = Vec::new();
    for (i, chunk) in payload.chunks(gso_size).enumerate() {
        let mut seg = Vec::with_capacity(ip_len + 8 + chunk.len());
        seg.extend_from_slice(&ip[..ip_len + 8]);
        seg.extend_from_slice(chunk);
        let udp_len = (8 + chunk.len()) as u16;
        if v4 {
            let total = (ip_len + 8 + chunk.len()) as u16;
            seg[2..4].copy_from_slice(&total.to_be_bytes());
            seg[4..6].copy_from_slice(&id.wrapping_add(i as u16).to_be_bytes());
            seg[10..12].copy_from_slice(&[0, 0]);
            let c = ipv4_checksum(&seg[..ip_len]);
            seg[10..12].copy_from_slice(&c.to_be_bytes());
        } else {
            seg[4..6].copy_from_slice(&udp_len.to_be_bytes());
        }
        seg[ip_len + 4..ip_len + 6].copy_from_slice(&udp_len.to_be_bytes());
        seg[ip_len + 6..ip_len + 8].copy_from_slice(&[0, 0]);
        out.push(seg);
    }
    Some(out)
}

/// `roxe capture`.
pub fn run(args: &Args) -> ExitCode {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic (async-signal-safe).
        unsafe { libc::signal(sig, on_stop_signal as *const () as libc::sighandler_t) };
    }
    let fd = match open(&args.iface) {
        Ok(fd) => fd,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let mut writer = match &args.write {
        Some(p) => match std::fs::File::create(p)
            .map_err(pcap::PcapError::from)
            .and_then(|f| pcap::PcapWriter::new(std::io::BufWriter::new(f)))
        {
            Ok(w) => Some(w),
            Err(e) => {
                eprintln!("roxe capture: {}: {e}", p.display());
                return ExitCode::from(2);
            }
        },
        None => None,
    };
    let loopback = is_loopback(&args.iface);
    let deadline = (args.timeout > 0).then(|| Instant::now() + Duration::from_secs(args.timeout));
    let stdout = std::io::stdout();
    // Buffered: lines reach the terminal when the socket runs dry.
    let mut out = std::io::BufWriter::new(stdout.lock());
    let _ = writeln!(out, "== live capture on {}", args.iface);
    let _ = out.flush();
    let mut s = Summary::default();
    let mut buf = vec![0u8; 65536 + 64];
    let mut frame = 0u64;
    while args.count.is_none_or(|c| s.roce_count() < c)
        && !STOP.load(std::sync::atomic::Ordering::Relaxed)
    {
        let left = match deadline {
            Some(d) => match d.checked_duration_since(Instant::now()) {
                Some(l) => l,
                None => break,
            },
            None => Duration::from_millis(500),
        };
        let Some((n, pkttype, hatype)) = receive(&fd, &mut buf) else {
            let _ = out.flush();
            wait(&fd, left.as_millis().min(500) as i32);
            continue;
        };
        if loopback && pkttype == PACKET_OUTGOING {
            continue;
        }
        let n = n.min(buf.len());
        if n < VNET_HDR_LEN {
            continue;
        }
        let (vnet, frame_bytes) = buf[..n].split_at(VNET_HDR_LEN);
        let Some(ip) = frame_bytes.get(link_header_len(hatype, frame_bytes)..) else {
            continue;
        };
        let gso_type = vnet[1] & 0x7f;
        let gso_size = usize::from(u16::from_ne_bytes([vnet[4], vnet[5]]));
        let datagrams = match gso_type {
            GSO_UDP_L4 | GSO_UDP => {
                split_udp_gso(ip, gso_size).unwrap_or_else(|| vec![ip.to_vec()])
            }
            _ => vec![ip.to_vec()],
        };
        let ts_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        for data in datagrams {
            frame += 1;
            let rec = CaptureRecord {
                frame,
                ts_ns,
                link: LinkType::RawIp,
                orig_len: u32::try_from(data.len()).unwrap_or(u32::MAX),
                data,
            };
            s.frames += 1;
            let Some(d) = decode_frame(&args.port, &rec, &mut s) else {
                continue;
            };
            tally(&mut s, &d);
            let _ = print_packet(&mut out, &d, args.verbose);
            if let Some(w) = writer.as_mut() {
                let _ = w.write_ip(ts_ns, &rec.data);
            }
        }
    }
    if let Some(mut w) = writer {
        let _ = w.flush();
    }
    let _ = print_summary(&mut out, Path::new(&args.iface), &s);
    let drops = kernel_drops(&fd);
    if drops > 0 {
        let _ = writeln!(
            out,
            "WARNING: the kernel dropped {drops} packets this capture did not read in time: \
             it is incomplete"
        );
    }
    ExitCode::from(s.status())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 3-segment IPv4 UDP GSO packet (id 7) becomes 3 datagrams with
    /// their own lengths, identifications 7, 8, 9 and valid checksums.
    #[test]
    fn udp_gso_is_cut_as_the_kernel_cuts_it() {
        let payload: Vec<u8> = (0..250u32).map(|i| i as u8).collect();
        let mut ip = vec![
            0x45, 0, 0, 0, 0, 7, 0x40, 0, 64, 17, 0, 0, 127, 0, 0, 2, 127, 0, 0, 1,
        ];
        let total = (20 + 8 + payload.len()) as u16;
        ip[2..4].copy_from_slice(&total.to_be_bytes());
        ip.extend_from_slice(&[0x12, 0xb7, 0x12, 0xb7]);
        ip.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
        ip.extend_from_slice(&[0xab, 0xcd]);
        ip.extend_from_slice(&payload);
        let segs = split_udp_gso(&ip, 100).unwrap();
        assert_eq!(segs.len(), 3);
        for (i, seg) in segs.iter().enumerate() {
            let want = if i < 2 { 100 } else { 50 };
            assert_eq!(seg.len(), 28 + want);
            assert_eq!(u16::from_be_bytes([seg[2], seg[3]]) as usize, 28 + want);
            assert_eq!(u16::from_be_bytes([seg[4], seg[5]]), 7 + i as u16);
            assert_eq!(ipv4_checksum(&seg[..20]), 0, "header checksum");
            assert_eq!(u16::from_be_bytes([seg[24], seg[25]]) as usize, 8 + want);
            assert_eq!(&seg[26..28], &[0, 0]);
            assert_eq!(&seg[28..], &payload[i * 100..i * 100 + want]);
        }
        assert!(split_udp_gso(&ip[..20], 100).is_none(), "no UDP header");
        assert!(split_udp_gso(&ip, 0).is_none());
        let mut bad_ihl = ip.clone();
        bad_ihl[0] = 0x40;
        assert!(split_udp_gso(&bad_ihl, 100).is_none(), "IHL 0");
    }
}
