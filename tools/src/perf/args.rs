//! The command line of `roxe perf`, and the parameters of a run it makes
//! ([`Params`]: the client's are the run's, and the server checks them with
//! the same [`validate`]).

use super::{Res, SEQ_MASK};
use clap::ValueEnum;
use roxe_verbs::Mtu;
use serde::{Deserialize, Serialize};

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
    pub fn name(self) -> &'static str {
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
pub const ALL_SIZES: std::ops::RangeInclusive<u32> = 1..=23;

/// What both sides agree on (the client's choice).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Params {
    pub op: Op,
    pub lat: bool,
    pub size: u32,
    pub iters: u64,
    pub qps: u32,
    pub tx_depth: u32,
    pub cq_mod: u32,
    pub rx_depth: u32,
    pub mtu: u32,
    /// Payloads up to this size go inline (`IBV_SEND_INLINE`).
    #[serde(default)]
    pub inline_size: u32,
    /// Write latency as ib_write_lat measures it: plain WRITEs, each side
    /// polling the last byte of its buffer for the peer's (the client's
    /// choice: on a hardware device, where the device writes host memory
    /// and a poll costs one load).
    #[serde(default)]
    pub poll_buffer: bool,
    /// `-D`: seconds to send for (0: `iters` operations).
    #[serde(default)]
    pub duration: u32,
    /// `-o`: READs and atomics outstanding per QP, the most the client's
    /// device allows unless given (the server lowers it to its own limit
    /// and says so in `Ready`).
    #[serde(default = "default_outs")]
    pub outs: u8,
    /// `-b`: both sides send.
    #[serde(default)]
    pub bidir: bool,
}

impl Params {
    /// Whether a WR of this run carries its payload inline (not READ).
    pub fn inline(&self) -> bool {
        self.op != Op::Read && self.size <= self.inline_size
    }

    pub fn mode(&self) -> &'static str {
        if self.lat {
            "lat"
        } else {
            "bw"
        }
    }
    /// Operations QP `i` carries (ITERS spread as evenly as possible; with
    /// `-D`, as many as time allows).
    pub fn per_qp(&self, i: usize) -> u64 {
        if self.duration > 0 {
            return SEQ_MASK;
        }
        let q = u64::from(self.qps);
        self.iters / q + u64::from((i as u64) < self.iters % q)
    }
}

/// READs outstanding of a peer that does not say (before `-o`).
pub fn default_outs() -> u8 {
    16
}

impl Args {
    /// The role and the server's address, from the positional words.
    pub fn role(&self) -> Res<(Role, Option<&str>)> {
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

/// The run's parameters from the command line, checked.
pub fn params_of(args: &Args) -> Res<Params> {
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

/// Whether a run can go as `p` says (the client's, checked again by the
/// server).
pub fn validate(p: &Params) -> Res<()> {
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

/// The path MTU of `-m`.
pub fn mtu_of(m: u32) -> Res<Mtu> {
    Ok(match m {
        256 => Mtu::Mtu256,
        512 => Mtu::Mtu512,
        1024 => Mtu::Mtu1024,
        2048 => Mtu::Mtu2048,
        4096 => Mtu::Mtu4096,
        _ => return Err(format!("mtu {m}: expected 256, 512, 1024, 2048 or 4096")),
    })
}

/// The message sizes of this run: `-a`'s 2 B .. 8 MiB, or the one size.
pub fn sizes(args: &Args, size: u32) -> Vec<u32> {
    if args.all {
        ALL_SIZES.map(|k| 1u32 << k).collect()
    } else {
        vec![size]
    }
}
