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
//! Not built: splitting the GSO super-packets the kernel hands a packet
//! socket on `lo` and veth when a sender uses UDP GSO (roxe's own devices
//! with `ROXE_GSO=on`); such a packet fails its length checks and is
//! reported, it is not silently passed.

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
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
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

/// One datagram and its packet type, or None when nothing is waiting.
fn receive(fd: &OwnedFd, buf: &mut [u8]) -> Option<(usize, u8)> {
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
    (n >= 0).then_some((n as usize, from.sll_pkttype))
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
        Some(p) => match pcap::create(p) {
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
        let Some((n, pkttype)) = receive(&fd, &mut buf) else {
            let _ = out.flush();
            wait(&fd, left.as_millis().min(500) as i32);
            continue;
        };
        if loopback && pkttype == PACKET_OUTGOING {
            continue;
        }
        frame += 1;
        let ts_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let rec = CaptureRecord {
            frame,
            ts_ns,
            link: LinkType::RawIp,
            data: buf[..n.min(buf.len())].to_vec(),
            orig_len: u32::try_from(n).unwrap_or(u32::MAX),
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
