//! `roxe perf`: a perftest-style benchmark between two processes, each with
//! its own soft device (the first of `roxe_verbs::devices()`: set
//! `ROXE_ADDR` per process, or let each take the next free loopback
//! address).
//!
//! ```text
//! roxe perf write|read|send [-d DEV] [-x GID] [-s SIZE] [-n ITERS] [-q QPS] [-Q CQ_MOD] [--lat] [--json] [-p PORT] [server | client ADDR | ADDR]
//! ```
//!
//! # Control protocol
//!
//! One TCP connection (the server listens on `-p`, default 18515) carries
//! newline-delimited JSON messages, each an object with a `"type"`:
//!
//! 1. client → server `hello`: the test (op, mode, size, iters, QP count,
//!    depths, MTU) and the client's endpoints (one per QP: lid, qpn, psn,
//!    gid) and its MR (addr, rkey, len). The client's parameters are
//!    authoritative; the server only insists that op and mode match its own.
//! 2. server → client `ready`: the server's endpoints and MR. The server has
//!    brought its QPs to RTS and posted its receives before sending it, so
//!    the client may start at once.
//! 3. client → server `done`, carrying the client's results, once every
//!    operation has completed. A `send` bandwidth server first counts all
//!    its receive completions.
//! 4. server → client `bye`: the final sync; neither side tears its QPs
//!    down before it.
//!
//! Either side sends `error` (with a message) instead when it fails, so the
//! other stops at once instead of running into its timeout.
//!
//! # What is measured
//!
//! Bandwidth (default): the client posts ITERS operations of SIZE bytes,
//! spread round-robin over the QPs, keeping at most `--tx-depth` posted and
//! not yet completed per QP, signaling only every `--cq-mod`-th WR (and
//! each QP's last). A signaled completion accounts for every earlier WR of
//! its QP, so the in-flight count the client tracks is never below what the
//! send queue holds and a post never meets a full queue. The clock runs
//! from the first post to the last completion.
//!
//! Latency (`--lat`, one QP): `write` is a ping-pong of RDMA WRITE_WITH_IMM
//! (each side learns of the peer's write from the receive completion the
//! immediate consumes, instead of ib_write_lat's polling of the buffer's
//! last byte); `send` is a SEND/RECV ping-pong (ib_send_lat); for both the
//! one-way latency is half the round trip, as perftest reports it. `read`
//! issues one READ at a time and reports the full time to its completion
//! (ib_read_lat).
//!
//! Both sides print the client's report (`--json`: one object on stdout:
//! op, mode, size, iters, qps, tx_depth, cq_mod, mtu, seconds, bytes,
//! gbytes_per_s (1e9 B/s), gbits_per_s, mmsgs_per_s, and for latency lat_us
//! {min, p50, p99, p999, max, mean}; percentiles are nearest-rank).
//!
//! # Waiting for completions
//!
//! The device's progress thread needs a core to receive, so a CQ poller
//! spins briefly and then yields between empty polls; with `-e` it sleeps on
//! a completion channel instead. Every wait ends at `--timeout`, and the
//! CQ loops also watch the control connection, so a peer's failure stops
//! both sides at once.

use clap::ValueEnum;
use crossbeam_utils::Backoff;
use roxe_verbs::{
    AccessFlags, CompChannel, Cq, Endpoint, Mr, Mtu, Pd, Qp, QpInit, QpType, RecvWr, SendFlags,
    SendOpcode, SendWr, WcOpcode, WcStatus, WorkCompletion,
};
use serde::{Deserialize, Serialize};
use std::cell::RefCell;
use std::collections::VecDeque;
use std::fmt::Display;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::process::ExitCode;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Latency timestamps. On x86_64 the time-stamp counter, which perftest's
/// `get_cycles` reads too: in guests whose clocksource is not the TSC
/// (emulated ones: HPET, ACPI PM) reading the system clock is a system call
/// and a device access, whose cost would land in every sample. Elsewhere
/// the monotonic clock. [`TickRate`] turns ticks into time.
mod ticks {
    #[cfg(target_arch = "x86_64")]
    pub fn now() -> u64 {
        // SAFETY: RDTSC exists on every x86_64 CPU and reads a counter;
        // it has no memory effects or preconditions.
        unsafe { core::arch::x86_64::_rdtsc() }
    }

    #[cfg(not(target_arch = "x86_64"))]
    pub fn now() -> u64 {
        use std::sync::OnceLock;
        static ORIGIN: OnceLock<std::time::Instant> = OnceLock::new();
        let origin = *ORIGIN.get_or_init(std::time::Instant::now);
        origin.elapsed().as_nanos() as u64
    }
}

/// Ticks against the monotonic clock over a run: nanoseconds per tick.
struct TickRate {
    at: Instant,
    tick: u64,
}

impl TickRate {
    fn start() -> Self {
        TickRate {
            at: Instant::now(),
            tick: ticks::now(),
        }
    }

    /// Nanoseconds per tick since `start` (1.0 if too little time passed).
    fn ns_per_tick(&self) -> f64 {
        let ticks = ticks::now().wrapping_sub(self.tick);
        let ns = self.at.elapsed().as_nanos() as f64;
        if ticks == 0 || ns < 1e6 {
            1.0
        } else {
            ns / ticks as f64
        }
    }
}

/// The operation under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    /// RDMA WRITE (latency: WRITE_WITH_IMM ping-pong).
    Write,
    /// RDMA READ.
    Read,
    /// SEND / RECV.
    Send,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Write => "write",
            Op::Read => "read",
            Op::Send => "send",
        }
    }
}

/// Which end this process is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum Role {
    /// Wait for a client on the control port.
    #[default]
    Server,
    /// Connect to the server at ADDR.
    Client,
}

/// `roxe perf`: a perftest-style benchmark (ib_{write,read,send}_{bw,lat})
/// between two processes.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The operation.
    #[arg(value_enum)]
    pub op: Op,
    /// Nothing or `server`: wait for a client. `client ADDR`, or a bare
    /// `ADDR` as perftest takes it: connect to the server there (host or
    /// IP, optionally with `:PORT`, which overrides `-p`).
    #[arg(value_name = "server | client ADDR | ADDR", num_args = 0..=2)]
    pub target: Vec<String>,
    /// Message size in bytes [default: 65536, or 64 with --lat].
    #[arg(short = 's', long)]
    pub size: Option<u32>,
    /// Operations [default: 5000, or 10000 with --lat].
    #[arg(short = 'n', long)]
    pub iters: Option<u64>,
    /// RC queue pairs to spread the operations over (bandwidth mode).
    #[arg(short = 'q', long, default_value_t = 1)]
    pub qps: u32,
    /// Measure latency (ping-pong for write and send, one READ at a time
    /// for read) instead of bandwidth.
    #[arg(long)]
    pub lat: bool,
    /// Print the results as one JSON object on stdout, and nothing else.
    #[arg(long)]
    pub json: bool,
    /// TCP port of the control connection (perftest's default).
    #[arg(short = 'p', long, default_value_t = 18515)]
    pub port: u16,
    /// Work requests in flight per QP (the send queue depth).
    #[arg(short = 't', long, default_value_t = 128)]
    pub tx_depth: u32,
    /// Signal every Nth send WR (at most --tx-depth; perftest's -Q).
    #[arg(short = 'Q', long, default_value_t = 100)]
    pub cq_mod: u32,
    /// Receives posted per QP (send, and latency ping-pongs).
    #[arg(short = 'r', long, default_value_t = 512)]
    pub rx_depth: u32,
    /// READs (and atomics) outstanding per QP each way (perftest's -o;
    /// default, as perftest: the most both devices allow).
    #[arg(short = 'o', long)]
    pub outs: Option<u8>,
    /// Send payloads of up to SIZE bytes inline (perftest's -I; by
    /// default perftest's choice: 220 for write and 236 for send latency
    /// runs, 0 otherwise).
    #[arg(short = 'I', long, value_name = "SIZE")]
    pub inline_size: Option<u32>,
    /// Path MTU: 256, 512, 1024, 2048 or 4096.
    #[arg(short = 'm', long, default_value_t = 4096)]
    pub mtu: u32,
    /// Sleep on a completion channel instead of polling the CQ (perftest's
    /// -e): frees the core for the device's progress thread.
    #[arg(short = 'e', long)]
    pub event: bool,
    /// Give up after this many seconds (every wait is bounded by it).
    #[arg(long, default_value_t = 120)]
    pub timeout: u64,
    /// The device (soft or hardware, as `roxe devices` lists them);
    /// default: the first.
    #[arg(short = 'd', long = "ib-dev", value_name = "DEV")]
    pub ib_dev: Option<String>,
    /// GID index of this side's endpoints (hardware; default: the first
    /// RoCEv2 GID holding an IPv4 address).
    #[arg(short = 'x', long = "gid-index", value_name = "INDEX")]
    pub gid_index: Option<u8>,
    /// Every size from 2 bytes to 8 MiB, doubling, one row each (perftest's
    /// -a); give it to both sides.
    #[arg(short = 'a', long = "all")]
    pub all: bool,
    /// Bandwidth runs: send for SECS seconds instead of a number of
    /// operations (perftest's -D).
    #[arg(short = 'D', long = "duration", value_name = "SECS")]
    pub duration: Option<u32>,
    /// Bandwidth runs: both sides send at once, and the report is the sum
    /// of both directions (perftest's -b).
    #[arg(short = 'b', long = "bidirectional")]
    pub bidir: bool,
}

/// `-a`: perftest's sizes, 2 B to 8 MiB.
const ALL_SIZES: std::ops::RangeInclusive<u32> = 1..=23;
/// The immediate of the SEND that ends a `-D` SEND run (its receiver
/// cannot count to a number it does not know).
const END_OF_RUN_IMM: u32 = 0xE0D0_E0D0;
/// The wr_id of that SEND.
const END_OF_RUN_WR: u64 = u64::MAX;

/// How long a client keeps retrying the TCP connection to the server.
const CONNECT_RETRY: Duration = Duration::from_secs(30);
/// Progress lines start after this long, then come every second.
const PROGRESS_AFTER: Duration = Duration::from_secs(2);
/// The low bits of a wr_id count WRs; the high bits name the QP.
const QP_SHIFT: u32 = 40;
const SEQ_MASK: u64 = (1 << QP_SHIFT) - 1;

/// What both sides agree on (the client's choice).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Params {
    op: Op,
    lat: bool,
    size: u32,
    iters: u64,
    qps: u32,
    tx_depth: u32,
    cq_mod: u32,
    rx_depth: u32,
    mtu: u32,
    /// Payloads up to this size go inline (`IBV_SEND_INLINE`).
    #[serde(default)]
    inline_size: u32,
    /// Write latency as ib_write_lat measures it: plain WRITEs, each side
    /// polling the last byte of its buffer for the peer's (the client's
    /// choice: on a hardware device, where the device writes host memory
    /// and a poll costs one load).
    #[serde(default)]
    poll_buffer: bool,
    /// `-D`: seconds to send for (0: `iters` operations).
    #[serde(default)]
    duration: u32,
    /// `-o`: READs and atomics outstanding per QP, the most the client's
    /// device allows unless given (the server lowers it to its own limit
    /// and says so in `Ready`).
    #[serde(default = "default_outs")]
    outs: u8,
    /// `-b`: both sides send.
    #[serde(default)]
    bidir: bool,
}

impl Params {
    /// Whether a WR of this run carries its payload inline (not READ).
    fn inline(&self) -> bool {
        self.op != Op::Read && self.size <= self.inline_size
    }

    fn mode(&self) -> &'static str {
        if self.lat {
            "lat"
        } else {
            "bw"
        }
    }
    /// Operations QP `i` carries (ITERS spread as evenly as possible; with
    /// `-D`, as many as time allows).
    fn per_qp(&self, i: usize) -> u64 {
        if self.duration > 0 {
            return SEQ_MASK;
        }
        let q = u64::from(self.qps);
        self.iters / q + u64::from((i as u64) < self.iters % q)
    }
}

/// READs outstanding of a peer that does not say (before `-o`).
fn default_outs() -> u8 {
    16
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct RemoteMr {
    addr: u64,
    rkey: u32,
    len: u64,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Msg {
    Hello {
        params: Params,
        eps: Vec<Endpoint>,
        mr: RemoteMr,
    },
    Ready {
        eps: Vec<Endpoint>,
        mr: RemoteMr,
        /// The READs outstanding the server connected with (the client's
        /// `outs`, or less where its device allows less).
        #[serde(default)]
        outs: Option<u8>,
    },
    Done {
        report: Report,
    },
    /// `-b`: the client's receives are up; the server may start sending.
    Go,
    Bye,
    Error {
        message: String,
    },
}

/// Latency percentiles, microseconds.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct LatUs {
    min: f64,
    p50: f64,
    p99: f64,
    p999: f64,
    max: f64,
    mean: f64,
    /// Standard deviation (perftest's t_stdev).
    #[serde(default)]
    stdev: f64,
}

/// The results (what `--json` prints).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Report {
    op: Op,
    mode: String,
    size: u32,
    iters: u64,
    qps: u32,
    tx_depth: u32,
    cq_mod: u32,
    /// READs and atomics outstanding per QP.
    #[serde(default = "default_outs")]
    outs: u8,
    mtu: u32,
    seconds: f64,
    bytes: u64,
    gbytes_per_s: f64,
    gbits_per_s: f64,
    mmsgs_per_s: f64,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    lat_us: Option<LatUs>,
}

/// Failures: a message for stderr (and for the peer).
type Res<T> = Result<T, String>;

fn ctx<E: Display>(what: &'static str) -> impl FnOnce(E) -> String {
    move |e| format!("{what}: {e}")
}

impl Args {
    /// The role and the server's address, from the positional words.
    fn role(&self) -> Res<(Role, Option<&str>)> {
        match self.target.iter().map(String::as_str).collect::<Vec<_>>()[..] {
            [] | ["server"] => Ok((Role::Server, None)),
            ["client", addr] => Ok((Role::Client, Some(addr))),
            ["client"] => Err("client needs the server's address (client ADDR)".into()),
            [addr] => Ok((Role::Client, Some(addr))),
            ["server", a] => Err(format!(
                "a server takes no address (got {a:?}); did you mean `client {a}`?"
            )),
            _ => Err(format!(
                "expected `server`, `client ADDR` or `ADDR`, got {:?}",
                self.target
            )),
        }
    }
}

/// `roxe perf`.
pub fn run(args: &Args) -> ExitCode {
    match args.role() {
        Ok((Role::Client, Some(addr))) => client(args, addr),
        Ok(_) => server(args),
        Err(e) => {
            eprintln!("roxe perf: {e}");
            ExitCode::from(2)
        }
    }
}

fn params_of(args: &Args) -> Res<Params> {
    let p = Params {
        op: args.op,
        lat: args.lat,
        size: args.size.unwrap_or(if args.lat { 64 } else { 65536 }),
        iters: args.iters.unwrap_or(if args.lat { 10_000 } else { 5000 }),
        qps: args.qps,
        tx_depth: args.tx_depth,
        cq_mod: args.cq_mod.min(args.tx_depth),
        rx_depth: args.rx_depth,
        // The client's device decides the default (`client_run`).
        outs: args.outs.unwrap_or_else(default_outs),
        mtu: args.mtu,
        // perftest's defaults (DEF_INLINE_WRITE, DEF_INLINE_SEND_RC_UC).
        inline_size: args.inline_size.unwrap_or(match (args.lat, args.op) {
            (true, Op::Write) => 220,
            (true, Op::Send) => 236,
            _ => 0,
        }),
        poll_buffer: false,
        duration: args.duration.unwrap_or(0),
        bidir: args.bidir,
    };
    validate(&p)?;
    Ok(p)
}

fn validate(p: &Params) -> Res<()> {
    if p.size == 0 || p.size > 1 << 31 {
        return Err(format!("size {}: must be 1 ..= 2^31", p.size));
    }
    if p.iters == 0 || p.iters > SEQ_MASK {
        return Err(format!("iters {}: must be 1 ..= 2^40 - 1", p.iters));
    }
    if p.qps == 0 || p.qps > 1024 {
        return Err(format!("qps {}: must be 1 ..= 1024", p.qps));
    }
    if p.lat && (p.duration > 0 || p.bidir) {
        return Err("-D and -b are for bandwidth runs (drop --lat)".into());
    }
    if p.lat && p.qps != 1 {
        return Err("latency mode uses one QP (drop -q)".into());
    }
    for (name, d) in [("tx-depth", p.tx_depth), ("rx-depth", p.rx_depth)] {
        if d == 0 || d > 0x4000 {
            return Err(format!("{name} {d}: must be 1 ..= 16384"));
        }
    }
    if p.cq_mod == 0 || p.cq_mod > p.tx_depth {
        return Err(format!("cq-mod {}: must be 1 ..= tx-depth", p.cq_mod));
    }
    mtu_of(p.mtu)?;
    let cqe = u64::from(p.qps) * u64::from(p.tx_depth + p.rx_depth) + 16;
    if cqe > 0x1_0000 {
        return Err(format!(
            "{} QPs x (tx-depth {} + rx-depth {}) completions do not fit one CQ (65536)",
            p.qps, p.tx_depth, p.rx_depth
        ));
    }
    let mr = u64::from(p.size) * u64::from(p.qps);
    if mr > 1 << 32 {
        return Err(format!("size x qps = {mr} bytes: too much memory"));
    }
    Ok(())
}

fn mtu_of(m: u32) -> Res<Mtu> {
    Ok(match m {
        256 => Mtu::Mtu256,
        512 => Mtu::Mtu512,
        1024 => Mtu::Mtu1024,
        2048 => Mtu::Mtu2048,
        4096 => Mtu::Mtu4096,
        _ => return Err(format!("mtu {m}: expected 256, 512, 1024, 2048 or 4096")),
    })
}

// ---------------------------------------------------------------------------
// Control connection.

/// The TCP control connection: writes go straight out; a reader thread
/// turns incoming lines into messages, so waits can be bounded and CQ loops
/// can notice a peer's error without blocking.
struct Ctrl {
    stream: TcpStream,
    rx: mpsc::Receiver<Res<Msg>>,
    /// Messages `check` took while a CQ loop ran.
    stash: RefCell<VecDeque<Msg>>,
}

impl Ctrl {
    fn new(stream: TcpStream) -> Res<Ctrl> {
        let _ = stream.set_nodelay(true);
        let read = stream.try_clone().map_err(ctx("control connection"))?;
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("roxe-perf-ctrl".into())
            .spawn(move || {
                let mut lines = BufReader::new(read).lines();
                loop {
                    let m = match lines.next() {
                        Some(Ok(l)) if l.trim().is_empty() => continue,
                        Some(Ok(l)) => serde_json::from_str::<Msg>(&l)
                            .map_err(|e| format!("bad control message ({e}): {l}")),
                        Some(Err(e)) => Err(format!("control connection: {e}")),
                        None => Err("the peer closed the control connection".into()),
                    };
                    let last = m.is_err();
                    if tx.send(m).is_err() || last {
                        return;
                    }
                }
            })
            .map_err(ctx("control thread"))?;
        Ok(Ctrl {
            stream,
            rx,
            stash: RefCell::default(),
        })
    }

    fn send(&mut self, m: &Msg) -> Res<()> {
        let mut line = serde_json::to_string(m).map_err(ctx("encoding a control message"))?;
        line.push('\n');
        self.stream
            .write_all(line.as_bytes())
            .map_err(ctx("control connection"))
    }

    /// The next message, by `deadline`; an `error` from the peer fails.
    fn recv(&self, deadline: Instant, waiting_for: &str) -> Res<Msg> {
        if let Some(m) = self.stash.borrow_mut().pop_front() {
            return Ok(m);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        match self.rx.recv_timeout(left) {
            Ok(Ok(Msg::Error { message })) => Err(format!("the peer failed: {message}")),
            Ok(m) => m,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                Err(format!("timed out waiting for {waiting_for}"))
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                Err("the control connection is gone".into())
            }
        }
    }

    /// Without waiting: fail if the peer reported an error or went away;
    /// keep any other message for `recv`.
    fn check(&self) -> Res<()> {
        loop {
            match self.rx.try_recv() {
                Ok(Ok(Msg::Error { message })) => {
                    return Err(format!("the peer failed: {message}"))
                }
                Ok(Ok(m)) => self.stash.borrow_mut().push_back(m),
                Ok(Err(e)) => return Err(e),
                Err(mpsc::TryRecvError::Empty) => return Ok(()),
                Err(mpsc::TryRecvError::Disconnected) => {
                    return Err("the control connection is gone".into())
                }
            }
        }
    }
}

fn server_addrs(addr: &str, port: u16) -> Res<Vec<SocketAddr>> {
    if let Ok(sa) = addr.parse::<SocketAddr>() {
        return Ok(vec![sa]);
    }
    if let Ok(ip) = addr.parse::<std::net::IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    let v: Vec<SocketAddr> = if addr.contains(':') {
        addr.to_socket_addrs()
    } else {
        (addr, port).to_socket_addrs()
    }
    .map_err(|e| format!("{addr}: {e}"))?
    .collect();
    if v.is_empty() {
        return Err(format!("{addr}: no address"));
    }
    Ok(v)
}

fn connect_ctrl(addr: &str, port: u16, deadline: Instant) -> Res<Ctrl> {
    let targets = server_addrs(addr, port)?;
    let give_up = deadline.min(Instant::now() + CONNECT_RETRY);
    loop {
        let mut last = None;
        for t in &targets {
            match TcpStream::connect_timeout(t, Duration::from_secs(2)) {
                Ok(s) => return Ctrl::new(s),
                Err(e) => last = Some(format!("{t}: {e}")),
            }
        }
        if Instant::now() >= give_up {
            return Err(format!(
                "cannot reach the server ({})",
                last.unwrap_or_default()
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn accept_ctrl(port: u16, deadline: Instant) -> Res<Ctrl> {
    let l =
        TcpListener::bind(("0.0.0.0", port)).map_err(|e| format!("listening on {port}: {e}"))?;
    l.set_nonblocking(true).map_err(ctx("listener"))?;
    loop {
        match l.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false)
                    .map_err(ctx("control connection"))?;
                return Ctrl::new(s);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(format!("no client connected to port {port} in time"));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(format!("accepting on {port}: {e}")),
        }
    }
}

// ---------------------------------------------------------------------------
// Verbs resources.

struct Setup {
    // Field order is drop order: QPs before the MR, CQ and PD they use.
    qps: Vec<Qp>,
    psns: Vec<u32>,
    mr: Mr,
    cq: Cq,
    channel: Option<CompChannel>,
    _pd: Pd,
    addr: std::net::IpAddr,
    /// A hardware device: nothing in this process needs the core, so a
    /// poller spins without yielding (as perftest does).
    hardware: bool,
    /// The most READs and atomics outstanding a QP of the device may have
    /// each way (`max_qp_init_rd_atom`, `max_qp_rd_atom`).
    max_outs: u8,
}

const ACCESS: AccessFlags = AccessFlags(
    AccessFlags::LOCAL_WRITE.0 | AccessFlags::REMOTE_WRITE.0 | AccessFlags::REMOTE_READ.0,
);

fn setup(p: &Params, event: bool, args: &Args) -> Res<Setup> {
    let dev = crate::info::open_device(args.ib_dev.as_deref(), args.gid_index)?;
    let pd = dev.alloc_pd().map_err(|e| e.to_string())?;
    let cqe = p.qps * (p.tx_depth + p.rx_depth) + 16;
    let channel = if event {
        Some(dev.create_comp_channel().map_err(|e| e.to_string())?)
    } else {
        None
    };
    let cq = dev
        .create_cq(cqe, channel.as_ref())
        .map_err(|e| e.to_string())?;
    // Write latency by buffer polling: the peer writes the first SIZE bytes,
    // this side sends from the next SIZE.
    let halves = if p.lat && p.op == Op::Write { 2 } else { 1 };
    let mr_len = p.size as usize * p.qps.max(halves) as usize;
    let mr = pd.reg_mr(mr_len, ACCESS).map_err(|e| e.to_string())?;
    let seed = seed();
    let mut qps = Vec::new();
    let mut psns = Vec::new();
    for i in 0..p.qps {
        let mut init = QpInit::new(QpType::Rc, &cq, &cq);
        init.cap.max_send_wr = p.tx_depth;
        init.cap.max_recv_wr = p.rx_depth;
        init.cap.max_send_sge = 1;
        init.cap.max_recv_sge = 1;
        init.cap.max_inline_data = if p.inline() { p.inline_size } else { 0 };
        qps.push(pd.create_qp(&init).map_err(|e| e.to_string())?);
        psns.push(mix(seed ^ u64::from(i)) as u32 & 0xFF_FFFF);
    }
    Ok(Setup {
        qps,
        psns,
        mr,
        cq,
        channel,
        _pd: pd,
        addr: dev.addr(),
        hardware: dev.backend() == roxe_verbs::Backend::Hardware,
        max_outs: {
            let a = dev.query_device();
            a.max_qp_init_rd_atom
                .min(a.max_qp_rd_atom)
                .clamp(1, u32::from(u8::MAX)) as u8
        },
    })
}

fn seed() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    t ^ (u64::from(std::process::id()) << 32)
}

/// splitmix64's finaliser: spreads a seed's bits.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Setup {
    fn eps(&self) -> Vec<Endpoint> {
        self.qps
            .iter()
            .zip(&self.psns)
            .map(|(q, &psn)| q.endpoint(psn))
            .collect()
    }
    fn remote_mr(&self) -> RemoteMr {
        RemoteMr {
            addr: self.mr.addr(),
            rkey: self.mr.rkey(),
            len: self.mr.len() as u64,
        }
    }
    /// Connect every QP, `outs` READs outstanding each way.
    fn connect(&self, p: &Params, remote: &[Endpoint], outs: u8) -> Res<()> {
        if remote.len() != self.qps.len() {
            return Err(format!(
                "the peer sent {} endpoints for {} QPs",
                remote.len(),
                self.qps.len()
            ));
        }
        let mtu = mtu_of(p.mtu)?;
        for ((q, &psn), r) in self.qps.iter().zip(&self.psns).zip(remote) {
            q.connect_with_outstanding(psn, r, mtu, ACCESS, 14, outs)
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }
    /// A receive into QP `i`'s slice of the MR (`data`: false for a
    /// receive only an immediate consumes).
    fn post_recv(&self, p: &Params, i: usize, wr_id: u64, data: bool) -> Res<()> {
        self.qps[i]
            .post_recv(self.recv_wr(p, i, wr_id, data))
            .map_err(|e| e.to_string())
    }

    /// A receive into QP `i`'s slot of the buffer (`data`), or without
    /// memory (WRITE_WITH_IMM).
    fn recv_wr(&self, p: &Params, i: usize, wr_id: u64, data: bool) -> RecvWr {
        let sg_list = if data {
            vec![self.mr.sge(i * p.size as usize, p.size)]
        } else {
            Vec::new()
        };
        RecvWr { wr_id, sg_list }
    }
}

fn wc_error(wc: &WorkCompletion) -> String {
    format!(
        "work completion error: status {:?} ({}), opcode {:?}, QP {:#x}, wr_id {:#x}",
        wc.status, wc.status as u32, wc.opcode, wc.qp_num, wc.wr_id
    )
}

/// Polls a CQ: spins, then yields the core, and every few milliseconds
/// checks the deadline and the control connection.
struct Poller<'a> {
    cq: &'a Cq,
    channel: Option<&'a CompChannel>,
    ctrl: &'a Ctrl,
    deadline: Instant,
    what: &'static str,
    idle: u32,
    /// Spin, then yield the core (the device's progress thread may need
    /// it); `None` on hardware, where the loop spins bare as perftest's
    /// (PAUSE costs a VM exit in some hypervisors and emulators).
    backoff: Option<Backoff>,
    next_check: Instant,
}

impl<'a> Poller<'a> {
    fn new(s: &'a Setup, ctrl: &'a Ctrl, deadline: Instant, what: &'static str) -> Self {
        Poller {
            cq: &s.cq,
            channel: s.channel.as_ref(),
            ctrl,
            deadline,
            what,
            idle: 0,
            backoff: (!s.hardware).then(Backoff::new),
            next_check: Instant::now(),
        }
    }
    /// Some completions (never zero), all successful.
    fn poll<'b>(&mut self, buf: &'b mut [WorkCompletion]) -> Res<&'b [WorkCompletion]> {
        loop {
            let mut n = self.cq.poll(buf).map_err(|e| e.to_string())?;
            if n == 0 {
                if let Some(ch) = self.channel {
                    // Arm, look once more (a completion may have slipped
                    // in before arming), then sleep until the event.
                    self.cq.req_notify(false).map_err(|e| e.to_string())?;
                    n = self.cq.poll(buf).map_err(|e| e.to_string())?;
                    if n == 0 {
                        let left = self.deadline.saturating_duration_since(Instant::now());
                        ch.get_event_timeout(left.min(Duration::from_millis(5)))
                            .map_err(ctx("completion channel"))?;
                    }
                }
            }
            if n > 0 {
                self.idle = 0;
                if let Some(b) = &self.backoff {
                    b.reset();
                }
                if let Some(bad) = buf[..n].iter().find(|w| w.status != WcStatus::Success) {
                    return Err(wc_error(bad));
                }
                return Ok(&buf[..n]);
            }
            self.idle = self.idle.saturating_add(1);
            let sleeping = self.channel.is_some();
            let yielding = match &self.backoff {
                // Slept in the channel already.
                _ if sleeping => false,
                Some(b) => {
                    b.snooze();
                    b.is_completed()
                }
                None => false,
            };
            // Reading the clock is not free everywhere (a syscall where the
            // clocksource is HPET, as in emulated guests): while spinning,
            // look at it every 1024 empty polls only.
            if sleeping || yielding || self.idle & 1023 == 0 {
                let now = Instant::now();
                if now >= self.next_check {
                    self.next_check = now + Duration::from_millis(5);
                    if now >= self.deadline {
                        return Err(format!("timed out waiting for {}", self.what));
                    }
                    self.ctrl.check()?;
                }
            }
        }
    }
}

fn blank_wcs() -> [WorkCompletion; 64] {
    [WorkCompletion::new(0, WcStatus::Success, WcOpcode::Send, 0); 64]
}

/// Progress lines on stderr, every second once a run passes two seconds.
struct Progress {
    start: Instant,
    next: Instant,
    total: u64,
    size: u32,
    /// Latency runs: the share of a sample that is one-way latency (1 for
    /// READ, 1/2 for ping-pongs); progress then shows the mean so far.
    lat_scale: Option<f64>,
}

impl Progress {
    fn new(start: Instant, p: &Params, lat_scale: Option<f64>) -> Self {
        Progress {
            start,
            next: start + PROGRESS_AFTER,
            total: p.iters,
            size: p.size,
            lat_scale,
        }
    }
    fn tick(&mut self, done: u64) {
        let now = Instant::now();
        if now < self.next || done == 0 {
            return;
        }
        self.next = now + Duration::from_secs(1);
        let secs = (now - self.start).as_secs_f64();
        match self.lat_scale {
            Some(k) => eprintln!(
                "  {done}/{} messages, {:.2} µs mean latency",
                self.total,
                secs / done as f64 * k * 1e6
            ),
            None => eprintln!(
                "  {done}/{} messages, {:.3} GB/s, {:.4} Mmsg/s",
                self.total,
                done as f64 * f64::from(self.size) / secs / 1e9,
                done as f64 / secs / 1e6
            ),
        }
    }
}

// ---------------------------------------------------------------------------
// Client.

fn client(args: &Args, addr: &str) -> ExitCode {
    let p = match params_of(args) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("roxe perf: {e}");
            return ExitCode::from(2);
        }
    };
    for size in sizes(args, p.size) {
        let deadline = Instant::now() + Duration::from_secs(args.timeout);
        let p = Params { size, ..p };
        let mut ctrl = match connect_ctrl(addr, args.port, deadline) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("roxe perf: {e}");
                return ExitCode::FAILURE;
            }
        };
        let run = client_run(&p, &mut ctrl, deadline, args);
        if !conclude(run, &mut ctrl, args) {
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}

/// Print a run's results, or say why it failed (here, and to the peer).
fn conclude(run: Res<Report>, ctrl: &mut Ctrl, args: &Args) -> bool {
    match run {
        Ok(report) => {
            print_run(&report, args);
            true
        }
        Err(e) => {
            eprintln!("roxe perf: {e}");
            let _ = ctrl.send(&Msg::Error { message: e });
            false
        }
    }
}

/// The message sizes of this run: `-a`'s 2 B .. 8 MiB, or the one size.
fn sizes(args: &Args, size: u32) -> Vec<u32> {
    if args.all {
        ALL_SIZES.map(|k| 1u32 << k).collect()
    } else {
        vec![size]
    }
}

/// One run's results: the full report, or with `-a` one row of perftest's
/// table (the header before the first size, the rule after the last).
fn print_run(r: &Report, args: &Args) {
    if !args.all || args.json {
        print_report(r, args.json);
        return;
    }
    let first = r.size == 1 << ALL_SIZES.start();
    let last = r.size == 1 << ALL_SIZES.end();
    if first {
        println!("{PERFTEST_RULE}");
        print_perftest_header(r);
    }
    print_perftest_row(r);
    if last {
        println!("{PERFTEST_RULE}");
    }
}

fn client_run(p: &Params, ctrl: &mut Ctrl, deadline: Instant, args: &Args) -> Res<Report> {
    let (json, event) = (args.json, args.event);
    let s = setup(p, event, args)?;
    let outs = match args.outs {
        Some(0) => return Err("-o 0: at least one READ must be outstanding".into()),
        Some(o) if o > s.max_outs => {
            return Err(format!(
                "-o {o}: device {} allows {} READs outstanding per QP",
                s.addr, s.max_outs
            ))
        }
        Some(o) => o,
        None => s.max_outs,
    };
    let p = &Params {
        poll_buffer: p.lat && p.op == Op::Write && s.hardware,
        outs,
        ..*p
    };
    ctrl.send(&Msg::Hello {
        params: *p,
        eps: s.eps(),
        mr: s.remote_mr(),
    })?;
    let (eps, rmr, server_outs) = match ctrl.recv(deadline, "the server's endpoints")? {
        Msg::Ready { eps, mr, outs } => (eps, mr, outs.unwrap_or_else(default_outs)),
        m => return Err(format!("expected the server's endpoints, got {m:?}")),
    };
    if rmr.len < s.mr.len() as u64 {
        return Err(format!(
            "the server's MR holds {} bytes, {} needed",
            rmr.len,
            s.mr.len()
        ));
    }
    let p = &Params {
        outs: p.outs.min(server_outs),
        ..*p
    };
    s.connect(p, &eps, p.outs)?;
    if !json && (!args.all || p.size == 1 << ALL_SIZES.start()) {
        println!(
            "roxe perf {} {}: device {} -> server {}, {} QP(s), {} B x {}, MTU {}{}",
            p.op.name(),
            p.mode(),
            s.addr,
            std::net::Ipv6Addr::from(eps[0].gid).to_canonical(),
            p.qps,
            p.size,
            p.iters,
            p.mtu,
            if p.lat {
                String::new()
            } else {
                format!(", tx depth {}, signal every {}", p.tx_depth, p.cq_mod)
            }
        );
    }
    let mut recv_posted = vec![0u64; s.qps.len()];
    if p.bidir {
        if p.op == Op::Send {
            post_initial_recvs(p, &s, &mut recv_posted)?;
        }
        ctrl.send(&Msg::Go)?;
    }
    let report = if p.lat {
        match p.op {
            Op::Read => read_lat(p, &s, ctrl, rmr, deadline)?,
            Op::Write if p.poll_buffer => write_lat_polling(p, &s, ctrl, rmr, deadline, true)?,
            Op::Write | Op::Send => {
                let posted = prepost_pingpong(p, &s)?;
                pingpong(p, &s, ctrl, rmr, deadline, true, posted)?
            }
        }
    } else {
        let recv = (p.bidir && p.op == Op::Send).then(|| RecvSide::new(&mut recv_posted));
        bw_client(p, &s, ctrl, rmr, deadline, recv)?
    };
    ctrl.send(&Msg::Done {
        report: report.clone(),
    })?;
    let report = if p.bidir {
        match ctrl.recv(deadline, "the server's results")? {
            Msg::Done { report: theirs } => both_ways(p, &report, &theirs),
            m => return Err(format!("expected the server's results, got {m:?}")),
        }
    } else {
        report
    };
    match ctrl.recv(deadline, "the server's goodbye")? {
        Msg::Bye => Ok(report),
        m => Err(format!("expected bye, got {m:?}")),
    }
}

/// `-b`: one report for both directions (bytes and operations added, over
/// the longer of the two times), as perftest sums them.
fn both_ways(p: &Params, a: &Report, b: &Report) -> Report {
    let both = Params {
        iters: a.iters + b.iters,
        ..*p
    };
    report(
        &both,
        Duration::from_secs_f64(a.seconds.max(b.seconds)),
        None,
    )
}

/// Receives for the peer's SENDs, as many per QP as it will send (at most
/// the receive depth).
fn post_initial_recvs(p: &Params, s: &Setup, recv_posted: &mut [u64]) -> Res<()> {
    for (i, posted) in recv_posted.iter_mut().enumerate() {
        let want = p.per_qp(i).min(u64::from(p.rx_depth));
        while *posted < want {
            s.post_recv(p, i, ((i as u64) << QP_SHIFT) | *posted, true)?;
            *posted += 1;
        }
    }
    Ok(())
}

/// The receiving half of a bidirectional SEND run (`-b`), kept by the side
/// that also sends: receives counted and re-posted as they complete.
struct RecvSide<'r> {
    posted: &'r mut [u64],
    received: u64,
    /// The peer's end-of-run SEND arrived (`-D`).
    ended: bool,
    /// Receives to re-post, per QP: each poll's worth goes as one list
    /// (`RecvSide::repost`).
    reposts: Vec<Vec<RecvWr>>,
}

impl<'r> RecvSide<'r> {
    fn new(posted: &'r mut [u64]) -> Self {
        let reposts = vec![Vec::new(); posted.len()];
        RecvSide {
            posted,
            received: 0,
            ended: false,
            reposts,
        }
    }

    fn done(&self, p: &Params) -> bool {
        if p.duration > 0 {
            self.ended
        } else {
            self.received >= p.iters
        }
    }
    /// A receive completion: count it and re-post its receive.
    fn on_recv(&mut self, p: &Params, s: &Setup, wc: &WorkCompletion) -> Res<()> {
        let i = (wc.wr_id >> QP_SHIFT) as usize;
        if i >= self.posted.len() {
            return Err(format!("unexpected completion {wc:?}"));
        }
        if wc.wc_flags & roxe_verbs::wc_flags::WITH_IMM != 0 && wc.imm_data == END_OF_RUN_IMM {
            self.ended = true;
        } else if wc.byte_len != p.size {
            return Err(format!("unexpected completion {wc:?}"));
        } else {
            self.received += 1;
        }
        if self.posted[i] < p.per_qp(i) {
            let wr_id = ((i as u64) << QP_SHIFT) | self.posted[i];
            self.reposts[i].push(s.recv_wr(p, i, wr_id, true));
            self.posted[i] += 1;
        }
        Ok(())
    }

    /// Post the receives `on_recv` collected, one list per QP.
    fn repost(&mut self, s: &Setup) -> Res<()> {
        for (i, list) in self.reposts.iter_mut().enumerate() {
            if !list.is_empty() {
                s.qps[i]
                    .post_recv_list(list.drain(..))
                    .map_err(|(_, e)| e.to_string())?;
            }
        }
        Ok(())
    }
}

/// The sending side of a bandwidth run: ITERS operations (or `-D` seconds)
/// spread over the QPs, each QP's refill posted as one list. `recv`: this
/// side also receives the peer's SENDs (`-b`).
fn bw_client(
    p: &Params,
    s: &Setup,
    ctrl: &Ctrl,
    rmr: RemoteMr,
    deadline: Instant,
    mut recv: Option<RecvSide<'_>>,
) -> Res<Report> {
    let nq = s.qps.len();
    let target: Vec<u64> = (0..nq).map(|i| p.per_qp(i)).collect();
    let mut posted = vec![0u64; nq];
    let mut completed = vec![0u64; nq];
    let depth = u64::from(p.tx_depth);
    let cq_mod = u64::from(p.cq_mod);
    let opcode = match p.op {
        Op::Write => SendOpcode::RdmaWrite,
        Op::Read => SendOpcode::RdmaRead,
        Op::Send => SendOpcode::Send,
    };
    let size = p.size as usize;
    let payload = inline_payload(p, s)?;
    let mut wcs = blank_wcs();
    let mut poller = Poller::new(s, ctrl, deadline, "send completions");
    let start = Instant::now();
    let stop_at = (p.duration > 0).then(|| start + Duration::from_secs(u64::from(p.duration)));
    // -D with SEND: the peer learns the end from a last SEND_WITH_IMM.
    let mut end_sent = p.duration == 0 || p.op != Op::Send;
    let mut end_done = end_sent;
    let mut progress = Progress::new(start, p, None);
    let mut done = 0u64;
    loop {
        let stopped = stop_at.is_some_and(|t| Instant::now() >= t);
        let drained = posted == completed;
        let sent_all = if p.duration > 0 {
            stopped && drained
        } else {
            done >= p.iters
        };
        if sent_all && !end_sent {
            let mut wr = SendWr::new(
                END_OF_RUN_WR,
                SendOpcode::SendWithImm,
                vec![s.mr.sge(0, p.size)],
            );
            wr.imm_data = END_OF_RUN_IMM;
            s.qps[0].post_send(wr).map_err(|e| e.to_string())?;
            end_sent = true;
        }
        if sent_all && end_done && recv.as_ref().is_none_or(|r| r.done(p)) {
            break;
        }
        for i in 0..nq {
            if stopped {
                break;
            }
            // The refill goes out as one post list (`wr->next`): its packets
            // leave together, as perftest's `-l` does it.
            let mut list = Vec::new();
            while posted[i] < target[i] && posted[i] - completed[i] < depth {
                let n = posted[i] + 1;
                let mut wr = SendWr::new(
                    ((i as u64) << QP_SHIFT) | n,
                    opcode,
                    vec![s.mr.sge(i * size, p.size)],
                );
                if !n.is_multiple_of(cq_mod) && n != target[i] {
                    wr.flags = SendFlags::default();
                }
                if opcode != SendOpcode::Send {
                    wr.remote_addr = rmr.addr + (i * size) as u64;
                    wr.rkey = rmr.rkey;
                }
                if let Some(data) = &payload {
                    wr.flags = SendFlags(wr.flags.0 | SendFlags::INLINE.0);
                    wr.inline_data = Some(data.clone());
                }
                list.push(wr);
                posted[i] = n;
            }
            if let Some(last) = list.last_mut() {
                if p.duration > 0 {
                    // A run that may stop after any list must see its
                    // last WR complete.
                    last.flags = SendFlags(last.flags.0 | SendFlags::SIGNALED.0);
                }
                s.qps[i]
                    .post_send_list(list)
                    .map_err(|(_, e)| e.to_string())?;
            }
        }
        for wc in poller.poll(&mut wcs)? {
            if wc.wr_id == END_OF_RUN_WR {
                end_done = true;
                continue;
            }
            if wc.opcode == WcOpcode::Recv {
                match recv.as_mut() {
                    Some(r) => r.on_recv(p, s, wc)?,
                    None => return Err(format!("unexpected completion {wc:?}")),
                }
                continue;
            }
            let i = (wc.wr_id >> QP_SHIFT) as usize;
            let n = wc.wr_id & SEQ_MASK;
            if i >= nq || n <= completed[i] || n > posted[i] {
                return Err(format!("unexpected completion {wc:?}"));
            }
            done += n - completed[i];
            completed[i] = n;
        }
        if let Some(r) = recv.as_mut() {
            r.repost(s)?;
        }
        progress.tick(done);
    }
    let ran = Params { iters: done, ..*p };
    Ok(report(&ran, start.elapsed(), None))
}

/// One READ at a time; each sample is the full time to its completion.
fn read_lat(p: &Params, s: &Setup, ctrl: &Ctrl, rmr: RemoteMr, deadline: Instant) -> Res<Report> {
    let mut wcs = blank_wcs();
    let mut poller = Poller::new(s, ctrl, deadline, "a READ completion");
    let mut samples = Vec::with_capacity(p.iters as usize);
    let start = Instant::now();
    let rate = TickRate::start();
    let mut progress = Progress::new(start, p, Some(1.0));
    for k in 0..p.iters {
        let mut wr = SendWr::new(k, SendOpcode::RdmaRead, vec![s.mr.sge(0, p.size)]);
        wr.remote_addr = rmr.addr;
        wr.rkey = rmr.rkey;
        let t0 = ticks::now();
        s.qps[0].post_send(wr).map_err(|e| e.to_string())?;
        let got = poller.poll(&mut wcs)?;
        let t1 = ticks::now();
        if got.len() != 1 || got[0].wr_id != k || got[0].opcode != WcOpcode::RdmaRead {
            return Err(format!("unexpected completions {got:?}"));
        }
        samples.push(t1.wrapping_sub(t0));
        progress.tick(k + 1);
    }
    let elapsed = start.elapsed();
    let scale = rate.ns_per_tick();
    Ok(report(p, elapsed, Some(lat_stats(&mut samples, scale))))
}

/// Write latency as ib_write_lat measures it (`Params::poll_buffer`):
/// the initiator WRITEs SIZE bytes whose last byte is the message number
/// (mod 256) into the peer's buffer and polls the last byte of its own
/// buffer for the answer; the peer polls first, then answers. Sends are
/// signaled every `cq_mod`-th, and their completions reaped then. The
/// one-way latency is half of each round trip.
fn write_lat_polling(
    p: &Params,
    s: &Setup,
    ctrl: &Ctrl,
    rmr: RemoteMr,
    deadline: Instant,
    initiator: bool,
) -> Res<Report> {
    let size = p.size as usize;
    let last = size - 1;
    let qp = &s.qps[0];
    let cq_mod = u64::from(p.cq_mod);
    let mut payload = inline_payload(p, s)?;
    let mut wcs = blank_wcs();
    let mut poller = Poller::new(s, ctrl, deadline, "the send completion");
    let mut samples = Vec::with_capacity(if initiator { p.iters as usize } else { 0 });
    let start = Instant::now();
    let rate = TickRate::start();
    let mut progress = Progress::new(start, p, Some(0.5));
    let (mut sent, mut received) = (0u64, 0u64);
    let mut t0 = 0u64;
    while sent < p.iters || received < p.iters {
        let my_turn = if initiator {
            sent == received
        } else {
            sent < received
        };
        if !my_turn && received < p.iters {
            let want = (received + 1) as u8;
            let mut polls = 0u32;
            loop {
                if s.mr.watch_byte(last).map_err(|e| e.to_string())? == want {
                    break;
                }
                polls = polls.wrapping_add(1);
                if !s.hardware {
                    // A soft device reads its memory under the device lock,
                    // which its progress thread needs to place the WRITE.
                    std::thread::yield_now();
                }
                if polls.is_multiple_of(1 << 16) && Instant::now() > deadline {
                    return Err(format!("no WRITE {} from the peer in time", received + 1));
                }
            }
            received += 1;
            if initiator {
                samples.push(ticks::now().wrapping_sub(t0));
                if received & 63 == 0 {
                    progress.tick(received);
                }
            }
            continue;
        }
        if sent < p.iters {
            let n = sent + 1;
            let mut wr = match &mut payload {
                Some(data) => {
                    data[last] = n as u8;
                    let mut wr = SendWr::new(n, SendOpcode::RdmaWrite, Vec::new());
                    wr.flags = SendFlags(SendFlags::SIGNALED.0 | SendFlags::INLINE.0);
                    wr.inline_data = Some(data.clone());
                    wr
                }
                None => {
                    s.mr.write(size + last, &[n as u8])
                        .map_err(|e| e.to_string())?;
                    SendWr::new(n, SendOpcode::RdmaWrite, vec![s.mr.sge(size, p.size)])
                }
            };
            wr.remote_addr = rmr.addr;
            wr.rkey = rmr.rkey;
            let signaled = n.is_multiple_of(cq_mod) || n == p.iters;
            if !signaled {
                wr.flags = SendFlags(wr.flags.0 & !SendFlags::SIGNALED.0);
            }
            if initiator {
                t0 = ticks::now();
            }
            qp.post_send(wr).map_err(|e| e.to_string())?;
            sent = n;
            if signaled {
                let got = poller.poll(&mut wcs)?;
                if got.len() != 1 || got[0].wr_id != n {
                    return Err(format!("unexpected completions {got:?}"));
                }
            }
        }
    }
    let elapsed = start.elapsed();
    let scale = rate.ns_per_tick() * 0.5;
    let lat = initiator.then(|| lat_stats(&mut samples, scale));
    Ok(report(p, elapsed, lat))
}

/// The bytes an inline WR of this run carries (the first SIZE bytes of the
/// region, as its SGE would), or `None` when payloads are not inline.
fn inline_payload(p: &Params, s: &Setup) -> Res<Option<Vec<u8>>> {
    if !p.inline() {
        return Ok(None);
    }
    let mut data = vec![0u8; p.size as usize];
    s.mr.read(0, &mut data).map_err(|e| e.to_string())?;
    Ok(Some(data))
}

/// A ping-pong's receives, posted before the peer may send: as many as
/// the receive queue holds, at most one per message. Returns the count.
fn prepost_pingpong(p: &Params, s: &Setup) -> Res<u64> {
    let n = p.iters.min(u64::from(p.rx_depth));
    for k in 0..n {
        s.post_recv(p, 0, k, p.op == Op::Send)?;
    }
    Ok(n)
}

/// A WRITE_WITH_IMM or SEND ping-pong. The client (`initiator`) sends
/// first and times each round trip from its post to the receive completion
/// of the answer; the server answers each message it receives. Each side
/// re-posts receives as they are consumed (`recv_posted` are up already)
/// and signals every `cq_mod`-th send, waiting for room when `tx_depth`
/// sends are not known complete.
fn pingpong(
    p: &Params,
    s: &Setup,
    ctrl: &Ctrl,
    rmr: RemoteMr,
    deadline: Instant,
    initiator: bool,
    mut recv_posted: u64,
) -> Res<Report> {
    let write = p.op == Op::Write;
    let qp = &s.qps[0];
    let iters = p.iters;
    let depth = u64::from(p.tx_depth);
    let cq_mod = u64::from(p.cq_mod);
    let (mut sent, mut send_done, mut received) = (0u64, 0u64, 0u64);
    let mut wcs = blank_wcs();
    let mut poller = Poller::new(s, ctrl, deadline, "the peer's message");
    let mut samples = Vec::with_capacity(if initiator { iters as usize } else { 0 });
    let payload = inline_payload(p, s)?;
    let send_wr = |n: u64| -> SendWr {
        let sg = vec![s.mr.sge(0, p.size)];
        let mut wr = if write {
            let mut wr = SendWr::new(n, SendOpcode::RdmaWriteWithImm, sg);
            wr.remote_addr = rmr.addr;
            wr.rkey = rmr.rkey;
            wr
        } else {
            SendWr::new(n, SendOpcode::Send, sg)
        };
        wr.imm_data = n as u32;
        if !n.is_multiple_of(cq_mod) && n != iters {
            wr.flags = SendFlags::default();
        }
        if let Some(data) = &payload {
            wr.flags = SendFlags(wr.flags.0 | SendFlags::INLINE.0);
            wr.inline_data = Some(data.clone());
        }
        wr
    };
    let start = Instant::now();
    let rate = TickRate::start();
    let mut progress = Progress::new(start, p, Some(0.5));
    let mut t0 = 0u64;
    loop {
        // The initiator sends before each receive, the responder after.
        let my_turn = if initiator {
            sent == received
        } else {
            sent < received
        };
        if my_turn && sent < iters {
            // Nothing can arrive while it is our turn: only our own send
            // completions.
            while sent - send_done >= depth {
                for wc in poller.poll(&mut wcs)? {
                    if matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm) {
                        return Err(format!("a message out of turn: {wc:?}"));
                    }
                    send_done = wc.wr_id;
                }
            }
            if initiator {
                t0 = ticks::now();
            }
            qp.post_send(send_wr(sent + 1)).map_err(|e| e.to_string())?;
            sent += 1;
        }
        if received == iters && sent == iters {
            break;
        }
        for wc in poller.poll(&mut wcs)? {
            match wc.opcode {
                WcOpcode::Recv | WcOpcode::RecvRdmaWithImm => {
                    let t1 = ticks::now();
                    received += 1;
                    if received > sent + u64::from(!initiator) {
                        return Err(format!("a message out of turn: {wc:?}"));
                    }
                    if initiator {
                        samples.push(t1.wrapping_sub(t0));
                    }
                    if recv_posted < iters {
                        s.post_recv(p, 0, recv_posted, !write)?;
                        recv_posted += 1;
                    }
                }
                _ => send_done = wc.wr_id,
            }
        }
        // The clock only every 64 messages (see Poller::poll).
        if initiator && received & 63 == 0 {
            progress.tick(received);
        }
    }
    let elapsed = start.elapsed();
    let scale = rate.ns_per_tick() * 0.5;
    let lat = initiator.then(|| lat_stats(&mut samples, scale));
    Ok(report(p, elapsed, lat))
}

/// Statistics of `samples` in ticks, `scale` nanoseconds each (half a
/// tick's time for one-way latencies from round trips).
fn lat_stats(samples: &mut [u64], scale: f64) -> LatUs {
    samples.sort_unstable();
    let us = |d: u64| d as f64 * scale / 1e3;
    let n = samples.len();
    // Nearest rank: the smallest sample with at least q of them at or below.
    let pct = |q: f64| {
        let rank = ((q * n as f64).ceil() as usize).clamp(1, n);
        us(samples[rank - 1])
    };
    let sum: f64 = samples.iter().map(|&d| us(d)).sum();
    let mean = sum / n as f64;
    let var = samples.iter().map(|&d| (us(d) - mean).powi(2)).sum::<f64>() / n as f64;
    LatUs {
        min: us(samples[0]),
        p50: pct(0.50),
        p99: pct(0.99),
        p999: pct(0.999),
        max: us(samples[n - 1]),
        mean,
        stdev: var.sqrt(),
    }
}

fn report(p: &Params, elapsed: Duration, lat_us: Option<LatUs>) -> Report {
    let seconds = elapsed.as_secs_f64();
    let bytes = u64::from(p.size) * p.iters;
    let rate = |x: f64| if seconds > 0.0 { x / seconds } else { 0.0 };
    Report {
        op: p.op,
        mode: p.mode().into(),
        size: p.size,
        iters: p.iters,
        qps: p.qps,
        tx_depth: p.tx_depth,
        cq_mod: p.cq_mod,
        outs: p.outs,
        mtu: p.mtu,
        seconds,
        bytes,
        gbytes_per_s: rate(bytes as f64) / 1e9,
        gbits_per_s: rate(bytes as f64) * 8.0 / 1e9,
        mmsgs_per_s: rate(p.iters as f64) / 1e6,
        lat_us,
    }
}

fn print_report(r: &Report, json: bool) {
    if json {
        match serde_json::to_string(r) {
            Ok(s) => println!("{s}"),
            Err(e) => eprintln!("roxe perf: encoding the report: {e}"),
        }
        return;
    }
    println!(
        "  {:>14} {:>10} {:>10} {:>10} {:>10}",
        "bytes", "seconds", "GB/s", "Gbit/s", "Mmsg/s"
    );
    println!(
        "  {:>14} {:>10.4} {:>10.4} {:>10.3} {:>10.4}",
        r.bytes, r.seconds, r.gbytes_per_s, r.gbits_per_s, r.mmsgs_per_s
    );
    if let Some(l) = &r.lat_us {
        let what = if r.op == Op::Read {
            "READ to completion"
        } else {
            "one-way = round trip / 2"
        };
        println!("  latency, µs ({what}):");
        println!(
            "  {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
            "min", "p50", "p99", "p99.9", "max", "mean"
        );
        println!(
            "  {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2}",
            l.min, l.p50, l.p99, l.p999, l.max, l.mean
        );
    }
    print_perftest_table(r);
}

/// The same results in perftest's layout (`ib_write_bw`, `ib_write_lat`),
/// so a script that reads perftest's table reads roxe's. perftest's MB
/// are 2^20 bytes; roxe does not sample a peak, so "BW peak" is the
/// average.
fn print_perftest_table(r: &Report) {
    println!("{PERFTEST_RULE}");
    print_perftest_header(r);
    print_perftest_row(r);
    println!("{PERFTEST_RULE}");
}

const PERFTEST_RULE: &str =
    "---------------------------------------------------------------------------------------";

fn print_perftest_header(r: &Report) {
    if r.lat_us.is_none() {
        println!(
            " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]"
        );
    } else {
        println!(
            " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] "
        );
    }
}

fn print_perftest_row(r: &Report) {
    match &r.lat_us {
        None => {
            let mb = r.gbytes_per_s * 1e9 / 1_048_576.0;
            println!(
                " {:<10} {:<10}       {:.2}            {:.2}\t\t   {:.6}",
                r.size, r.iters, mb, mb, r.mmsgs_per_s
            );
        }
        Some(l) => {
            println!(
                " {:<7} {:<10}     {:.2}          {:.2}      {:.2}    \t       {:.2}       \t{:.2}  \t\t{:.2}   \t\t{:.2}  ",
                r.size, r.iters, l.min, l.max, l.p50, l.mean, l.stdev, l.p99, l.p999
            );
        }
    }
}

// ---------------------------------------------------------------------------
// Server.

fn server(args: &Args) -> ExitCode {
    if let Err(e) = params_of(args) {
        eprintln!("roxe perf: {e}");
        return ExitCode::from(2);
    }
    if !args.json {
        eprintln!(
            "roxe perf {} server: waiting for a client on TCP port {}",
            args.op.name(),
            args.port
        );
    }
    // With -a the client connects once per size.
    let runs = if args.all { ALL_SIZES.count() } else { 1 };
    for _ in 0..runs {
        let deadline = Instant::now() + Duration::from_secs(args.timeout);
        let mut ctrl = match accept_ctrl(args.port, deadline) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("roxe perf: {e}");
                return ExitCode::FAILURE;
            }
        };
        let run = server_run(args, &mut ctrl, deadline);
        if !conclude(run, &mut ctrl, args) {
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}

/// Serve one client; returns the client's report.
fn server_run(args: &Args, ctrl: &mut Ctrl, deadline: Instant) -> Res<Report> {
    let (p, ceps, cmr) = match ctrl.recv(deadline, "the client's hello")? {
        Msg::Hello { params, eps, mr } => (params, eps, mr),
        m => return Err(format!("expected hello, got {m:?}")),
    };
    if p.op != args.op || p.lat != args.lat {
        return Err(format!(
            "the client runs {} {}, this server {} {}",
            p.op.name(),
            p.mode(),
            args.op.name(),
            if args.lat { "lat" } else { "bw" }
        ));
    }
    validate(&p)?;
    let s = setup(&p, args.event, args)?;
    if cmr.len < s.mr.len() as u64 {
        return Err(format!(
            "the client's MR holds {} bytes, {} needed",
            cmr.len,
            s.mr.len()
        ));
    }
    let outs = p.outs.clamp(1, s.max_outs);
    s.connect(&p, &ceps, outs)?;
    // Receives go up before `ready`: the client starts sending on it.
    let mut recv_posted = vec![0u64; s.qps.len()];
    let pingpong_mode = p.lat && p.op != Op::Read && !p.poll_buffer;
    if pingpong_mode {
        recv_posted[0] = prepost_pingpong(&p, &s)?;
    } else if p.op == Op::Send {
        post_initial_recvs(&p, &s, &mut recv_posted)?;
    }
    ctrl.send(&Msg::Ready {
        eps: s.eps(),
        mr: s.remote_mr(),
        outs: Some(outs),
    })?;
    if !args.json {
        eprintln!(
            "roxe perf {} {} server: device {}, {} QP(s), {} B x {}",
            p.op.name(),
            p.mode(),
            s.addr,
            p.qps,
            p.size,
            p.iters
        );
    }
    let mut mine = None;
    if p.poll_buffer {
        write_lat_polling(&p, &s, ctrl, cmr, deadline, false)?;
    } else if pingpong_mode {
        pingpong(&p, &s, ctrl, cmr, deadline, false, recv_posted[0])?;
    } else if p.bidir {
        match ctrl.recv(deadline, "the client's go")? {
            Msg::Go => {}
            m => return Err(format!("expected go, got {m:?}")),
        }
        let recv = (p.op == Op::Send).then(|| RecvSide::new(&mut recv_posted));
        mine = Some(bw_client(&p, &s, ctrl, cmr, deadline, recv)?);
    } else if p.op == Op::Send {
        send_bw_server(&p, &s, ctrl, deadline, &mut recv_posted)?;
    }
    let report = match ctrl.recv(deadline, "the client's results")? {
        Msg::Done { report } => report,
        m => return Err(format!("expected done, got {m:?}")),
    };
    let report = match mine {
        Some(mine) => {
            ctrl.send(&Msg::Done {
                report: mine.clone(),
            })?;
            both_ways(&p, &report, &mine)
        }
        None => report,
    };
    ctrl.send(&Msg::Bye)?;
    Ok(report)
}

/// Count ITERS receive completions, re-posting each consumed receive while
/// its QP still expects more messages.
fn send_bw_server(
    p: &Params,
    s: &Setup,
    ctrl: &Ctrl,
    deadline: Instant,
    recv_posted: &mut [u64],
) -> Res<()> {
    let mut wcs = blank_wcs();
    let mut poller = Poller::new(s, ctrl, deadline, "receive completions");
    let mut recv = RecvSide::new(recv_posted);
    while !recv.done(p) {
        for wc in poller.poll(&mut wcs)? {
            if wc.opcode != WcOpcode::Recv {
                return Err(format!("unexpected completion {wc:?}"));
            }
            recv.on_recv(p, s, wc)?;
        }
        recv.repost(s)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_calibrated_against_the_monotonic_clock() {
        let rate = TickRate::start();
        let (t0, i0) = (ticks::now(), Instant::now());
        std::thread::sleep(Duration::from_millis(20));
        let (t1, i1) = (ticks::now(), Instant::now());
        let ns = rate.ns_per_tick() * t1.wrapping_sub(t0) as f64;
        let real = (i1 - i0).as_nanos() as f64;
        assert!(
            (ns / real - 1.0).abs() < 0.2,
            "{ns} ns by ticks against {real} ns"
        );
    }

    #[test]
    fn latency_statistics_scale_ticks_to_microseconds() {
        // Round trips of 2,000..=11,000 ticks at 0.5 ns each, halved.
        let mut samples: Vec<u64> = (1..=10).rev().map(|k| 1000 + 1000 * k).collect();
        let l = lat_stats(&mut samples, 0.5 * 0.5);
        assert_eq!(l.min, 0.5);
        assert_eq!(l.max, 2.75);
        assert_eq!(l.p50, 1.5);
        assert!((l.mean - 1.625).abs() < 1e-9);
    }
}
