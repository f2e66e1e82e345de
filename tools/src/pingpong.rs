//! `roxe pingpong`: rdma-core's `ibv_rc_pingpong` (libibverbs/examples/
//! rc_pingpong.c and pingpong.c) over roxe's verbs.
//!
//! It behaves as the C program does: the same options (those that make
//! sense for a soft device), the same TCP exchange of
//! `"%04x:%06x:%06x:%s"` messages (52 bytes with the NUL, then the client's
//! `"done"`), the same QP attributes and modify masks, the same completion
//! bookkeeping (`routs`, `scnt`, `rcnt`, `pending`) and the same output, so
//! either side can face a real `ibv_rc_pingpong` on an rxe device.
//!
//! Deviations, all about bounding waits and reproducibility:
//! * every wait (TCP accept/connect/read, a completion in the data loop)
//!   gives up after `--timeout` seconds (default 60) without progress;
//! * the client retries a refused TCP connect (server not listening yet)
//!   for up to that time instead of failing at once;
//! * the PSN comes from the same drand48 generator and the same
//!   `getpid() * time(NULL)` seed as the C program, but the seed is printed
//!   on stderr and `--seed` sets it;
//! * busy polling yields the CPU after a burst of empty polls, so the
//!   device's progress thread can run on a loaded machine;
//! * `--stats` prints the device's counters on stderr at the end, and a run
//!   that fails after the device was opened prints them anyway.

use clap::{ArgAction, Args as ClapArgs};
use roxe_verbs::{
    AccessFlags, AddressVector, AttrMask, CompChannel, Context, Cq, DeviceInfo, Mr, Mtu, Qp,
    QpAttr, QpInit, QpState, QpType, RecvWr, SendFlags, SendOpcode, SendWr, WcOpcode, WcStatus,
    WorkCompletion,
};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// `PINGPONG_RECV_WRID`.
const RECV_WRID: u64 = 1;
/// `PINGPONG_SEND_WRID`.
const SEND_WRID: u64 = 2;
/// `sizeof "0000:000000:000000:00000000000000000000000000000000"`.
const MSG_SIZE: usize = 52;
/// `"done"` with its NUL, as the client writes it.
const DONE: &[u8; 5] = b"done\0";
/// `IBV_LINK_LAYER_ETHERNET`.
const LINK_LAYER_ETHERNET: u8 = 2;
/// Empty CQ polls between two yields of the CPU in the busy-poll loop.
const SPINS: u32 = 16;
/// How the program names itself in the usage text (`argv[0]`).
const ARGV0: &str = "roxe pingpong";

/// Ping-pong SENDs over an RC QP, as rdma-core's `ibv_rc_pingpong`.
///
/// Without SERVER: start a server and wait for a connection. With SERVER:
/// connect to the server there. Numbers are read as C's strtol does
/// (0x.. hexadecimal, 0.. octal).
#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Listen on/connect to TCP port PORT.
    #[arg(short = 'p', long = "port", value_name = "PORT", default_value = "18515",
          value_parser = c_long, allow_negative_numbers = true)]
    port: i64,
    /// Use IB device DEV (default first device found).
    #[arg(short = 'd', long = "ib-dev", value_name = "DEV")]
    ib_dev: Option<String>,
    /// Use port PORT of the IB device.
    #[arg(short = 'i', long = "ib-port", value_name = "PORT", default_value = "1",
          value_parser = c_long, allow_negative_numbers = true)]
    ib_port: i64,
    /// Size of message to exchange.
    #[arg(short = 's', long = "size", value_name = "SIZE", default_value = "4096",
          value_parser = c_long, allow_negative_numbers = true)]
    size: i64,
    /// Path MTU (256, 512, 1024, 2048 or 4096).
    #[arg(short = 'm', long = "mtu", value_name = "SIZE", default_value = "1024",
          value_parser = c_long, allow_negative_numbers = true)]
    mtu: i64,
    /// Number of receives to post at a time.
    #[arg(short = 'r', long = "rx-depth", value_name = "DEP", default_value = "500",
          value_parser = c_long, allow_negative_numbers = true)]
    rx_depth: i64,
    /// Number of exchanges.
    #[arg(short = 'n', long = "iters", value_name = "ITERS", default_value = "1000",
          value_parser = c_long, allow_negative_numbers = true)]
    iters: i64,
    /// Service level value.
    #[arg(short = 'l', long = "sl", value_name = "SL", default_value = "0",
          value_parser = c_long, allow_negative_numbers = true)]
    sl: i64,
    /// Sleep on CQ events (default poll).
    #[arg(short = 'e', long = "events", action = ArgAction::Count)]
    events: u8,
    /// Local port GID index (with it the QP is addressed by GID, without it
    /// by LID only).
    #[arg(short = 'g', long = "gid-idx", value_name = "GID_INDEX",
          value_parser = c_long, allow_negative_numbers = true)]
    gid_idx: Option<i64>,
    /// Validate received buffer.
    #[arg(short = 'c', long = "chk", action = ArgAction::Count)]
    chk: u8,
    /// Give up when a wait (TCP connect/accept/read, the next completion)
    /// makes no progress for this many seconds (roxe only).
    #[arg(long, value_name = "SECS", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..))]
    timeout: u64,
    /// Print the device's counters (packets, drops by reason, ICRC
    /// mismatches, retransmits, NAKs) on stderr at the end; a failed run
    /// prints them anyway (roxe only).
    #[arg(long)]
    stats: bool,
    /// Seed of the PSN generator (srand48); default getpid() * time(NULL)
    /// as ibv_rc_pingpong (roxe only).
    #[arg(long, value_name = "SEED", value_parser = c_long, allow_negative_numbers = true)]
    seed: Option<i64>,
    /// Connect to the server at SERVER (client mode).
    #[arg(value_name = "SERVER")]
    server: Option<String>,
}

/// A failure whose message is already on stderr: exit status 1.
#[derive(Debug)]
struct Fail;

type Res<T> = Result<T, Fail>;

/// Print `msg` to stderr and fail.
fn fail(msg: impl std::fmt::Display) -> Fail {
    eprintln!("{msg}");
    Fail
}

/// Print `msg` (rc_pingpong's text) and the underlying cause, and fail.
fn fail_with(msg: impl std::fmt::Display, cause: impl std::fmt::Display) -> Fail {
    eprintln!("{msg}");
    eprintln!("{ARGV0}: {cause}");
    Fail
}

/// `roxe pingpong`.
pub fn run(args: &Args) -> ExitCode {
    match pingpong(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Fail) => ExitCode::from(1),
    }
}

/// What each side tells the other (`struct pingpong_dest`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Dest {
    lid: u32,
    qpn: u32,
    psn: u32,
    gid: [u8; 16],
}

impl Dest {
    /// `sprintf(msg, "%04x:%06x:%06x:%s", ...)` into `char msg[52]`.
    fn encode(&self) -> [u8; MSG_SIZE] {
        let text = format!(
            "{:04x}:{:06x}:{:06x}:{}",
            self.lid,
            self.qpn,
            self.psn,
            gid_to_wire_gid(&self.gid)
        );
        let mut msg = [0u8; MSG_SIZE];
        let n = text.len().min(MSG_SIZE - 1);
        msg[..n].copy_from_slice(&text.as_bytes()[..n]);
        msg
    }

    /// `sscanf(msg, "%x:%x:%x:%s", ...)` and `wire_gid_to_gid`.
    fn decode(msg: &[u8]) -> Dest {
        let end = msg.iter().position(|&b| b == 0).unwrap_or(msg.len());
        let text = String::from_utf8_lossy(&msg[..end]);
        let mut fields = text.splitn(4, ':');
        let mut num = || fields.next().map_or(0, scan_hex);
        let (lid, qpn, psn) = (num(), num(), num());
        let gid = fields
            .next()
            .map(|g| g.split_whitespace().next().unwrap_or(""))
            .map_or([0; 16], wire_gid_to_gid);
        Dest { lid, qpn, psn, gid }
    }
}

/// `sscanf("%x")`: optional whitespace and `0x`, then hex digits (0 if none).
fn scan_hex(s: &str) -> u32 {
    let s = s.trim_start();
    let s = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .filter(|r| r.starts_with(|c: char| c.is_ascii_hexdigit()))
        .unwrap_or(s);
    s.chars()
        .map_while(|c| c.to_digit(16))
        .fold(0u32, |v, d| v.wrapping_mul(16).wrapping_add(d))
}

/// pingpong.c's `gid_to_wire_gid`: each 32-bit word of the GID as `%08x` of
/// its big-endian value, which is the 16 bytes in order as hex.
fn gid_to_wire_gid(gid: &[u8; 16]) -> String {
    gid.chunks(4)
        .map(|w| format!("{:08x}", u32::from_be_bytes([w[0], w[1], w[2], w[3]])))
        .collect()
}

/// pingpong.c's `wire_gid_to_gid`: four 8-digit hex words, each stored
/// big-endian.
fn wire_gid_to_gid(wire: &str) -> [u8; 16] {
    let b = wire.as_bytes();
    let mut gid = [0u8; 16];
    for i in 0..4 {
        let chunk = b.get(i * 8..(i * 8 + 8).min(b.len())).unwrap_or(&[]);
        let v = scan_hex(&String::from_utf8_lossy(chunk));
        gid[i * 4..i * 4 + 4].copy_from_slice(&v.to_be_bytes());
    }
    gid
}

/// A run of zero words: (first word, length).
type ZeroRun = Option<(usize, usize)>;

/// glibc's `inet_ntop(AF_INET6, ...)` (RFC 5952 style, with the embedded
/// IPv4 forms `::a.b.c.d` and `::ffff:a.b.c.d`).
fn inet_ntop6(src: &[u8; 16]) -> String {
    let words: Vec<u16> = src
        .chunks(2)
        .map(|w| u16::from_be_bytes([w[0], w[1]]))
        .collect();
    // The longest run of zero words (the first of equals), if 2 or more.
    // (first word, length) of the best and of the current run.
    let (mut best, mut cur): (ZeroRun, ZeroRun) = (None, None);
    for (i, &w) in words.iter().enumerate() {
        if w == 0 {
            cur = Some(cur.map_or((i, 1), |(b, l)| (b, l + 1)));
        } else if let Some(c) = cur.take() {
            if best.is_none_or(|b| c.1 > b.1) {
                best = Some(c);
            }
        }
    }
    if let Some(c) = cur {
        if best.is_none_or(|b| c.1 > b.1) {
            best = Some(c);
        }
    }
    let best = best.filter(|b| b.1 >= 2);
    let mut out = String::new();
    for (i, &w) in words.iter().enumerate() {
        if let Some((base, len)) = best {
            if i >= base && i < base + len {
                if i == base {
                    out.push(':');
                }
                continue;
            }
        }
        if i != 0 {
            out.push(':');
        }
        if i == 6
            && best.is_some_and(|(base, len)| {
                base == 0 && (len == 6 || (len == 5 && words[5] == 0xffff))
            })
        {
            out.push_str(&format!("{}.{}.{}.{}", src[12], src[13], src[14], src[15]));
            break;
        }
        out.push_str(&format!("{w:x}"));
    }
    if best.is_some_and(|(base, len)| base + len == 8) {
        out.push(':');
    }
    out
}

/// C's `strtol(s, NULL, 0)`: leading space, a sign, then `0x` hex, `0`
/// octal or decimal digits up to the first other character; 0 if none.
/// Never an error, as in the C program.
fn c_long(s: &str) -> Result<i64, String> {
    let s = s.trim_start();
    let (neg, s) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let (radix, digits) = if (s.starts_with("0x") || s.starts_with("0X"))
        && s[2..].starts_with(|c: char| c.is_ascii_hexdigit())
    {
        (16, &s[2..])
    } else if s.starts_with('0') {
        (8, s)
    } else {
        (10, s)
    };
    let mut v: i64 = 0;
    for d in digits.chars().map_while(|c| c.to_digit(radix)) {
        v = v
            .saturating_mul(i64::from(radix))
            .saturating_add(i64::from(d));
    }
    Ok(if neg { v.saturating_neg() } else { v })
}

/// glibc's `srand48`/`lrand48`: the 48-bit linear congruential generator.
struct Drand48 {
    x: u64,
}

impl Drand48 {
    const A: u64 = 0x5_DEEC_E66D;
    const C: u64 = 0xB;
    const MASK: u64 = (1 << 48) - 1;

    /// `srand48(seed)`: the low 32 bits of the seed, then 0x330E.
    fn new(seed: i64) -> Self {
        Drand48 {
            x: ((seed as u64 & 0xffff_ffff) << 16) | 0x330E,
        }
    }

    /// `lrand48()`: 31 bits.
    fn lrand48(&mut self) -> u32 {
        self.x = Self::A.wrapping_mul(self.x).wrapping_add(Self::C) & Self::MASK;
        (self.x >> 17) as u32
    }
}

/// `ibv_wc_status_str`.
fn wc_status_str(status: WcStatus) -> &'static str {
    status.as_str()
}

/// `pp_mtu_to_enum`.
fn mtu_of(bytes: i64) -> Option<Mtu> {
    match bytes {
        256 => Some(Mtu::Mtu256),
        512 => Some(Mtu::Mtu512),
        1024 => Some(Mtu::Mtu1024),
        2048 => Some(Mtu::Mtu2048),
        4096 => Some(Mtu::Mtu4096),
        _ => None,
    }
}

/// `sysconf(_SC_PAGESIZE)`, from the auxiliary vector (`AT_PAGESZ`).
fn page_size() -> usize {
    const AT_PAGESZ: usize = 6;
    const W: usize = std::mem::size_of::<usize>();
    let word = |b: &[u8]| usize::from_ne_bytes(b.try_into().unwrap_or([0; W]));
    std::fs::read("/proc/self/auxv")
        .ok()
        .and_then(|auxv| {
            auxv.chunks_exact(2 * W)
                .find(|e| word(&e[..W]) == AT_PAGESZ)
                .map(|e| word(&e[W..]))
        })
        .filter(|&p| p > 0)
        .unwrap_or(4096)
}

/// The byte rc_pingpong's `-c` puts at (and expects at) offset `i`:
/// `i / page_size % sizeof(char)`, which is always 0.
fn chk_byte(_i: usize, _page_size: usize) -> u8 {
    0
}

/// rc_pingpong's `usage()` (the options roxe implements).
fn usage() {
    println!("Usage:");
    println!("  {ARGV0}            start a server and wait for connection");
    println!("  {ARGV0} <host>     connect to server at <host>");
    println!();
    println!("Options:");
    println!("  -p, --port=<port>      listen on/connect to port <port> (default 18515)");
    println!("  -d, --ib-dev=<dev>     use IB device <dev> (default first device found)");
    println!("  -i, --ib-port=<port>   use port <port> of IB device (default 1)");
    println!("  -s, --size=<size>      size of message to exchange (default 4096)");
    println!("  -m, --mtu=<size>       path MTU (default 1024)");
    println!("  -r, --rx-depth=<dep>   number of receives to post at a time (default 500)");
    println!("  -n, --iters=<iters>    number of exchanges (default 1000)");
    println!("  -l, --sl=<sl>          service level value");
    println!("  -e, --events           sleep on CQ events (default poll)");
    println!("  -g, --gid-idx=<gid index> local port gid index");
    println!("  -c, --chk\t            validate received buffer");
}

/// Read until `want` bytes (or end of stream, or an error after some
/// bytes) into `buf`: what one `read(fd, buf, sizeof buf)` returns on a
/// loopback connection, without failing on a segmented stream.
fn read_upto(s: &mut TcpStream, buf: &mut [u8], want: usize) -> std::io::Result<usize> {
    let mut n = 0;
    while n < want {
        match s.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if n == 0 => return Err(e),
            Err(_) => break,
        }
    }
    Ok(n)
}

/// `perror(what)` for a read that returned `r` instead of `want` bytes.
fn perror_read(what: &str, r: &std::io::Result<usize>, want: usize) {
    match r {
        Err(e) => eprintln!("{what}: {e}"),
        Ok(n) => eprintln!("{what}: short read ({n} of {want} bytes)"),
    }
}

/// The QP, its buffer and CQ, and the state `parse_single_wc` keeps
/// (`struct pingpong_context`).
struct Pp {
    qp: Qp,
    mr: Mr,
    cq: Cq,
    size: u32,
    rx_depth: i64,
    send_flags: SendFlags,
    pending: u64,
}

impl Pp {
    /// `pp_post_recv`: post up to `n` receives of the whole buffer; how
    /// many were posted.
    fn post_recv(&self, n: i64) -> i64 {
        let mut i = 0;
        while i < n {
            let wr = RecvWr {
                wr_id: RECV_WRID,
                sg_list: vec![self.mr.sge(0, self.size)],
            };
            if self.qp.post_recv(wr).is_err() {
                break;
            }
            i += 1;
        }
        i
    }

    /// `pp_post_send`: a SEND of the whole buffer (inline when the QP's
    /// `max_inline_data` allows, as rc_pingpong decides).
    fn post_send(&self) -> roxe_verbs::Result<()> {
        let mut wr = SendWr::new(SEND_WRID, SendOpcode::Send, vec![self.mr.sge(0, self.size)]);
        wr.flags = self.send_flags;
        if self.send_flags.contains(SendFlags::INLINE) {
            let mut data = vec![0u8; self.size as usize];
            self.mr.read(0, &mut data)?;
            wr.inline_data = Some(data);
        }
        self.qp.post_send(wr)
    }

    /// `parse_single_wc`.
    fn parse_single_wc(
        &mut self,
        scnt: &mut i64,
        rcnt: &mut i64,
        routs: &mut i64,
        iters: u32,
        wc: &WorkCompletion,
    ) -> Res<()> {
        if wc.status != WcStatus::Success {
            return Err(fail(format!(
                "Failed status {} ({}) for wr_id {}",
                wc_status_str(wc.status),
                wc.status as u32,
                wc.wr_id as i32
            )));
        }
        match wc.wr_id {
            SEND_WRID => *scnt += 1,
            RECV_WRID => {
                *routs -= 1;
                if *routs <= 1 {
                    *routs += self.post_recv(self.rx_depth - *routs);
                    if *routs < self.rx_depth {
                        return Err(fail(format!("Couldn't post receive ({})", *routs)));
                    }
                }
                *rcnt += 1;
            }
            other => {
                return Err(fail(format!(
                    "Completion for unknown wr_id {}",
                    other as i32
                )))
            }
        }
        self.pending &= !wc.wr_id;
        if *scnt < i64::from(iters) && self.pending == 0 {
            if self.post_send().is_err() {
                return Err(fail("Couldn't post send"));
            }
            self.pending = RECV_WRID | SEND_WRID;
        }
        Ok(())
    }
}

/// `pp_connect_ctx`: RTR towards `dest` (by LID, or by GID when the remote
/// sent one), then RTS.
fn connect_ctx(
    qp: &Qp,
    port: i32,
    my_psn: u32,
    mtu: Mtu,
    sl: i32,
    dest: &Dest,
    sgid_idx: i32,
) -> Res<()> {
    let mut attr = QpAttr {
        qp_state: QpState::Rtr,
        path_mtu: mtu,
        dest_qp_num: dest.qpn,
        rq_psn: dest.psn,
        max_dest_rd_atomic: 1,
        min_rnr_timer: 12,
        av: AddressVector {
            is_global: false,
            dlid: dest.lid as u16,
            sl: sl as u8,
            port_num: port as u8,
            ..AddressVector::default()
        },
        ..QpAttr::default()
    };
    // dest->gid.global.interface_id: the low 64 bits.
    if dest.gid[8..] != [0u8; 8] {
        attr.av.is_global = true;
        attr.av.hop_limit = 1;
        attr.av.dgid = dest.gid;
        attr.av.sgid_index = sgid_idx as u8;
    }
    qp.modify(
        &attr,
        AttrMask::STATE
            | AttrMask::AV
            | AttrMask::PATH_MTU
            | AttrMask::DEST_QPN
            | AttrMask::RQ_PSN
            | AttrMask::MAX_DEST_RD_ATOMIC
            | AttrMask::MIN_RNR_TIMER,
    )
    .map_err(|e| fail_with("Failed to modify QP to RTR", e))?;

    attr.qp_state = QpState::Rts;
    attr.timeout = 14;
    attr.retry_cnt = 7;
    attr.rnr_retry = 7;
    attr.sq_psn = my_psn;
    attr.max_rd_atomic = 1;
    qp.modify(
        &attr,
        AttrMask::STATE
            | AttrMask::TIMEOUT
            | AttrMask::RETRY_CNT
            | AttrMask::RNR_RETRY
            | AttrMask::SQ_PSN
            | AttrMask::MAX_QP_RD_ATOMIC,
    )
    .map_err(|e| fail_with("Failed to modify QP to RTS", e))
}

/// `pp_client_exch_dest`: connect, send ours, read theirs, send "done".
fn client_exch_dest(server: &str, port: u16, my: &Dest, timeout: Duration) -> Res<Dest> {
    let addrs: Vec<SocketAddr> = match (server, port).to_socket_addrs() {
        Ok(a) => a.collect(),
        Err(e) => return Err(fail(format!("{e} for {server}:{port}"))),
    };
    let deadline = Instant::now() + timeout;
    let mut stream = None;
    'retry: loop {
        let mut refused = false;
        for a in &addrs {
            let left = deadline.saturating_duration_since(Instant::now());
            match TcpStream::connect_timeout(a, left.max(Duration::from_millis(1))) {
                Ok(s) => {
                    stream = Some(s);
                    break 'retry;
                }
                Err(e) => refused |= e.kind() == ErrorKind::ConnectionRefused,
            }
        }
        // Only a refused connection (the server is not listening yet) is
        // retried, every 50 ms until the timeout.
        if !refused || Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let Some(mut s) = stream else {
        return Err(fail(format!("Couldn't connect to {server}:{port}")));
    };
    let _ = s.set_read_timeout(Some(timeout));
    let _ = s.set_write_timeout(Some(timeout));

    if s.write_all(&my.encode()).is_err() {
        return Err(fail("Couldn't send local address"));
    }
    let mut msg = [0u8; MSG_SIZE];
    let r = read_upto(&mut s, &mut msg, MSG_SIZE);
    if !matches!(r, Ok(MSG_SIZE)) {
        perror_read("client read/write", &r, MSG_SIZE);
        return Err(fail("Couldn't read/write remote address"));
    }
    if let Err(e) = s.write_all(DONE) {
        eprintln!("client read/write: {e}");
        return Err(fail("Couldn't read/write remote address"));
    }
    Ok(Dest::decode(&msg))
}

/// `pp_server_exch_dest`: listen on every address, accept one client, read
/// its address, connect the QP, send ours, read "done".
#[allow(clippy::too_many_arguments)]
fn server_exch_dest(
    qp: &Qp,
    ib_port: i32,
    mtu: Mtu,
    port: u16,
    sl: i32,
    my: &Dest,
    sgid_idx: i32,
    timeout: Duration,
) -> Res<Dest> {
    // std sets SO_REUSEADDR on listeners, as rc_pingpong does.
    let listener = TcpListener::bind(("0.0.0.0", port))
        .map_err(|e| fail_with(format!("Couldn't listen to port {port}"), e))?;
    let deadline = Instant::now() + timeout;
    let accepted = listener.set_nonblocking(true).and_then(|()| loop {
        match listener.accept() {
            Ok((s, _)) => break Ok(s),
            Err(e) if e.kind() == ErrorKind::WouldBlock && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                break Err(std::io::Error::new(
                    ErrorKind::TimedOut,
                    format!("no client within {} s", timeout.as_secs()),
                ))
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => break Err(e),
        }
    });
    drop(listener);
    let mut s = accepted.map_err(|e| fail_with("accept() failed", e))?;
    let _ = s.set_nonblocking(false);
    let _ = s.set_read_timeout(Some(timeout));
    let _ = s.set_write_timeout(Some(timeout));

    let mut msg = [0u8; MSG_SIZE];
    let r = read_upto(&mut s, &mut msg, MSG_SIZE);
    if !matches!(r, Ok(MSG_SIZE)) {
        perror_read("server read", &r, MSG_SIZE);
        let n = r.map_or(-1, |n| n as i64);
        return Err(fail(format!(
            "{n}/{MSG_SIZE}: Couldn't read remote address"
        )));
    }
    let rem = Dest::decode(&msg);

    if connect_ctx(qp, ib_port, my.psn, mtu, sl, &rem, sgid_idx).is_err() {
        return Err(fail("Couldn't connect to remote QP"));
    }

    if s.write_all(&my.encode()).is_err()
        || !matches!(read_upto(&mut s, &mut msg, DONE.len()), Ok(5))
    {
        return Err(fail("Couldn't send/recv local address"));
    }
    Ok(rem)
}

/// `main()` of rc_pingpong, from the options on.
fn pingpong(args: &Args) -> Res<()> {
    let timeout = Duration::from_secs(args.timeout);
    // The C variables' types: unsigned int port/size/rx_depth/iters, int
    // ib_port/sl/gidx.
    let port = args.port as u32;
    if port > 65535 {
        usage();
        return Err(Fail);
    }
    let port = port as u16;
    let ib_port = args.ib_port as i32;
    if ib_port < 1 {
        usage();
        return Err(Fail);
    }
    let size = args.size as u32;
    let Some(mtu) = mtu_of(args.mtu as i32 as i64) else {
        usage();
        return Err(Fail);
    };
    let rx_depth = args.rx_depth as u32;
    let iters = args.iters as u32;
    let sl = args.sl as i32;
    let use_event = args.events > 0;
    let validate_buf = args.chk > 0;
    let gidx = args.gid_idx.map_or(-1, |g| g as i32);
    let servername = args.server.as_deref();

    // srand48(getpid() * time(NULL))
    let seed = args.seed.unwrap_or_else(|| {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        i64::from(std::process::id() as i32).wrapping_mul(now)
    });
    let mut rng = Drand48::new(seed);
    let page_size = page_size();

    let dev_list =
        roxe_verbs::devices().map_err(|e| fail(format!("Failed to get IB devices list: {e}")))?;
    let ib_dev: &DeviceInfo = match &args.ib_dev {
        None => dev_list
            .first()
            .ok_or_else(|| fail("No IB devices found"))?,
        Some(name) => dev_list
            .iter()
            .find(|d| d.name() == name)
            .ok_or_else(|| fail(format!("IB device {name} not found")))?,
    };

    // pp_init_ctx
    let context: Context = ib_dev
        .open()
        .map_err(|e| fail_with(format!("Couldn't get context for {}", ib_dev.name()), e))?;
    let mut counters = Counters {
        context: &context,
        name: ib_dev.name(),
        always: args.stats,
        ok: false,
    };
    let channel: Option<CompChannel> = if use_event {
        Some(
            context
                .create_comp_channel()
                .map_err(|e| fail_with("Couldn't create completion channel", e))?,
        )
    } else {
        None
    };
    let pd = context
        .alloc_pd()
        .map_err(|e| fail_with("Couldn't allocate PD", e))?;
    let mr = pd
        .reg_mr(size as usize, AccessFlags::LOCAL_WRITE)
        .map_err(|e| fail_with("Couldn't register MR", e))?;
    // memset(ctx->buf, 0x7b, size)
    mr.write(0, &vec![0x7b; size as usize])
        .map_err(|e| fail_with("Couldn't allocate work buf.", e))?;
    let cq = context
        .create_cq(rx_depth.wrapping_add(1), channel.as_ref())
        .map_err(|e| fail_with("Couldn't create CQ", e))?;
    let mut init = QpInit::new(QpType::Rc, &cq, &cq);
    init.cap.max_send_wr = 1;
    init.cap.max_recv_wr = rx_depth;
    init.cap.max_send_sge = 1;
    init.cap.max_recv_sge = 1;
    init.cap.max_inline_data = 0;
    init.sq_sig_all = false;
    let qp = pd
        .create_qp(&init)
        .map_err(|e| fail_with("Couldn't create QP", e))?;
    // ibv_query_qp(IBV_QP_CAP) (an error leaves the requested cap, as in
    // C).
    let max_inline = qp
        .cap()
        .map_or(init.cap.max_inline_data, |c| c.max_inline_data);
    let mut send_flags = SendFlags::SIGNALED;
    if max_inline >= size {
        send_flags = send_flags | SendFlags::INLINE;
    }
    let init_attr = QpAttr {
        qp_state: QpState::Init,
        pkey_index: 0,
        port_num: ib_port as u8,
        qp_access_flags: AccessFlags::default(),
        ..QpAttr::default()
    };
    qp.modify(
        &init_attr,
        AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS,
    )
    .map_err(|e| fail_with("Failed to modify QP to INIT", e))?;

    let mut ctx = Pp {
        qp,
        mr,
        cq,
        size,
        rx_depth: i64::from(rx_depth as i32),
        send_flags,
        pending: 0,
    };

    let mut routs = ctx.post_recv(ctx.rx_depth);
    if routs < ctx.rx_depth {
        return Err(fail(format!("Couldn't post receive ({routs})")));
    }

    if use_event && ctx.cq.req_notify(false).is_err() {
        return Err(fail("Couldn't request CQ notification"));
    }

    let portinfo = context
        .query_port(ib_port as u8)
        .map_err(|e| fail_with("Couldn't get port info", e))?;
    let lid = u32::from(portinfo.lid);
    if portinfo.link_layer != LINK_LAYER_ETHERNET && lid == 0 {
        return Err(fail("Couldn't get local LID"));
    }
    let gid = if gidx >= 0 {
        context
            .query_gid(ib_port as u8, gidx as u32)
            .map_err(|e| fail_with(format!("can't read sgid of index {gidx}"), e))?
    } else {
        [0u8; 16]
    };
    let my_dest = Dest {
        lid,
        qpn: ctx.qp.qp_num(),
        psn: rng.lrand48() & 0xffffff,
        gid,
    };
    eprintln!("{ARGV0}: PSN seed {seed} (--seed {seed} repeats this PSN)");
    println!(
        "  local address:  LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
        my_dest.lid,
        my_dest.qpn,
        my_dest.psn,
        inet_ntop6(&my_dest.gid)
    );

    let rem_dest = match servername {
        Some(server) => client_exch_dest(server, port, &my_dest, timeout)?,
        None => server_exch_dest(&ctx.qp, ib_port, mtu, port, sl, &my_dest, gidx, timeout)?,
    };
    println!(
        "  remote address: LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
        rem_dest.lid,
        rem_dest.qpn,
        rem_dest.psn,
        inet_ntop6(&rem_dest.gid)
    );

    if servername.is_some() {
        connect_ctx(&ctx.qp, ib_port, my_dest.psn, mtu, sl, &rem_dest, gidx)?;
    }

    ctx.pending = RECV_WRID;

    if servername.is_some() {
        if validate_buf {
            for i in (0..size as usize).step_by(page_size) {
                ctx.mr
                    .write(i, &[chk_byte(i, page_size)])
                    .map_err(|e| fail_with("Couldn't write the buffer", e))?;
            }
        }
        if ctx.post_send().is_err() {
            return Err(fail("Couldn't post send"));
        }
        ctx.pending |= SEND_WRID;
    }

    let start = Instant::now();
    let (mut rcnt, mut scnt) = (0i64, 0i64);
    let mut num_cq_events = 0u64;
    let mut wc = [WorkCompletion::new(0, WcStatus::Success, WcOpcode::Send, 0); 2];
    let mut progress = Instant::now();
    // Soft devices: yield every SPINS empty polls (the progress thread
    // needs the core). Hardware: spin as ibv_rc_pingpong does, looking at
    // the clock every 1024 polls (a syscall in some guests).
    let spins_per_check = if context.backend() == roxe_verbs::Backend::Hardware {
        1024
    } else {
        SPINS
    };
    let mut completed_since_check = false;
    while rcnt < i64::from(iters) || scnt < i64::from(iters) {
        if let Some(ch) = &channel {
            let ev_cq = match ch.get_event_timeout(timeout) {
                Ok(Some(c)) => c,
                Ok(None) => {
                    return Err(fail_with(
                        "Failed to get cq_event",
                        format!("no completion event within {} s", timeout.as_secs()),
                    ))
                }
                Err(e) => return Err(fail_with("Failed to get cq_event", e)),
            };
            num_cq_events += 1;
            if ev_cq != ctx.cq.id() {
                return Err(fail(format!("CQ event for unknown CQ {ev_cq:?}")));
            }
            if ctx.cq.req_notify(false).is_err() {
                return Err(fail("Couldn't request CQ notification"));
            }
        }

        // Spin, yielding the CPU every SPINS empty polls (and then checking
        // the time) so the progress thread runs even on a busy machine.
        let mut spins = spins_per_check;
        let ne = loop {
            let ne = ctx
                .cq
                .poll(&mut wc)
                .map_err(|e| fail(format!("poll CQ failed {}", -e.errno())))?;
            if use_event || ne >= 1 {
                break ne;
            }
            spins -= 1;
            if spins == 0 {
                spins = spins_per_check;
                if completed_since_check {
                    // The timeout counts from the last completion, read
                    // here rather than at each one (the clock is not free).
                    completed_since_check = false;
                    progress = Instant::now();
                } else if progress.elapsed() > timeout {
                    return Err(fail_with(
                        "poll CQ failed 0",
                        format!("no completion within {} s", timeout.as_secs()),
                    ));
                }
                if spins_per_check == SPINS {
                    std::thread::yield_now();
                }
            }
        };
        if ne > 0 {
            completed_since_check = true;
        }
        for w in &wc[..ne] {
            if ctx
                .parse_single_wc(&mut scnt, &mut rcnt, &mut routs, iters, w)
                .is_err()
            {
                return Err(fail(format!("parse WC failed {ne}")));
            }
        }
    }
    let elapsed = start.elapsed();
    let _ = num_cq_events; // ibv_ack_cq_events: roxe's channel needs no acks.

    {
        // float usec = ...; long long bytes = (long long) size * iters * 2;
        let usec = elapsed.as_micros() as i64 as f32;
        let bytes = i64::from(size) * i64::from(iters) * 2;
        println!(
            "{} bytes in {} seconds = {} Mbit/sec",
            bytes,
            c_f2(f64::from(usec) / 1_000_000.),
            c_f2(bytes as f64 * 8. / f64::from(usec))
        );
        println!(
            "{} iters in {} seconds = {} usec/iter",
            iters as i32,
            c_f2(f64::from(usec) / 1_000_000.),
            c_f2(f64::from(usec / iters as f32))
        );

        if servername.is_none() && validate_buf {
            let mut byte = [0u8; 1];
            for i in (0..size as usize).step_by(page_size) {
                ctx.mr
                    .read(i, &mut byte)
                    .map_err(|e| fail_with("Couldn't read the buffer", e))?;
                if byte[0] != chk_byte(i, page_size) {
                    println!("invalid data in page {}", i / page_size);
                }
            }
        }
    }
    counters.ok = true;
    Ok(())
}

/// Prints the device's counters on stderr when dropped, if asked to
/// (`--stats`) or if the run failed (`ok` not set): which side stopped,
/// retransmits, NAKs and drops by reason are the first thing to look at.
struct Counters<'a> {
    context: &'a Context,
    name: &'a str,
    always: bool,
    ok: bool,
}

impl Drop for Counters<'_> {
    fn drop(&mut self) {
        if self.always || !self.ok {
            if let Some(s) = self.context.stats() {
                eprintln!("{ARGV0}: {} counters: {:?}", self.name, s);
            }
        }
    }
}

/// printf's `%.2f`, including its `inf`/`nan` spellings.
fn c_f2(v: f64) -> String {
    if v.is_nan() {
        if v.is_sign_negative() { "-nan" } else { "nan" }.to_string()
    } else if v.is_infinite() {
        if v < 0.0 { "-inf" } else { "inf" }.to_string()
    } else {
        format!("{v:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv6Addr;

    #[test]
    fn message_is_rc_pingpongs_52_bytes_and_round_trips() {
        let mut gid = [0u8; 16];
        gid[10] = 0xff;
        gid[11] = 0xff;
        gid[12..].copy_from_slice(&[127, 0, 40, 1]);
        let d = Dest {
            lid: 0x2801,
            qpn: 0x11,
            psn: 0xabcdef,
            gid,
        };
        let msg = d.encode();
        assert_eq!(
            &msg[..],
            &b"2801:000011:abcdef:00000000000000000000ffff7f002801\0"[..]
        );
        assert_eq!(Dest::decode(&msg), d);
        let zero = Dest { gid: [0; 16], ..d };
        assert_eq!(
            &zero.encode()[19..],
            &b"00000000000000000000000000000000\0"[..]
        );
        assert_eq!(Dest::decode(&zero.encode()), zero);
    }

    #[test]
    fn inet_ntop6_matches_glibc() {
        // Expected strings from glibc's inet_ntop.
        for (addr, want) in [
            ("::", "::"),
            ("::ffff:127.0.40.1", "::ffff:127.0.40.1"),
            ("fe80::1", "fe80::1"),
            ("2001:db8:0:0:1:0:0:1", "2001:db8::1:0:0:1"),
            ("::1.2.3.4", "::1.2.3.4"),
            ("1:0:0:2:0:0:0:3", "1:0:0:2::3"),
            ("::1", "::1"),
            ("1::", "1::"),
            ("1:2:3:4:5:6:7:8", "1:2:3:4:5:6:7:8"),
            ("0:0:1::", "0:0:1::"),
            ("1:0:3:4:5:6:7:8", "1:0:3:4:5:6:7:8"),
            ("::ffff:0:1.2.3.4", "::ffff:0:102:304"),
            ("::fffe:1.2.3.4", "::fffe:102:304"),
        ] {
            let a: Ipv6Addr = addr.parse().unwrap();
            assert_eq!(inet_ntop6(&a.octets()), want, "{addr}");
        }
    }

    #[test]
    fn drand48_matches_glibc() {
        // Expected values from glibc's srand48/lrand48.
        for (seed, want) in [
            (0i64, [366850414u32, 1610402240, 206956554]),
            (12345, [483889296, 1973930609, 444188209]),
            (-987654321, [602334399, 438623348, 917316472]),
            (0x1234_5678_9abc, [45422196, 301871438, 887133056]),
        ] {
            let mut r = Drand48::new(seed);
            assert_eq!([r.lrand48(), r.lrand48(), r.lrand48()], want, "{seed}");
        }
    }

    #[test]
    fn numbers_parse_as_strtol_base_0() {
        for (s, v) in [
            ("18515", 18515),
            ("0x4853", 0x4853),
            ("010", 8),
            ("-1", -1),
            ("12abc", 12),
            ("abc", 0),
            (" +7", 7),
            ("0x", 0),
        ] {
            assert_eq!(c_long(s), Ok(v), "{s}");
        }
    }

    #[test]
    fn wc_status_strings_are_libibverbs() {
        assert_eq!(
            wc_status_str(WcStatus::RetryExcErr),
            "transport retry counter exceeded"
        );
        assert_eq!(
            wc_status_str(WcStatus::WrFlushErr),
            "Work Request Flushed Error"
        );
    }

    #[test]
    fn percent_2f() {
        assert_eq!(c_f2(0.125), "0.12");
        assert_eq!(c_f2(2.675), "2.67");
        assert_eq!(c_f2(f64::INFINITY), "inf");
        assert_eq!(c_f2(-f64::NAN), "-nan");
    }
}
