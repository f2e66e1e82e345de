//! `roxe`: the command-line tool of the roxe software RoCEv2 provider.

use clap::{Parser, Subcommand};
use std::process::ExitCode;

mod capture;
mod decode;
mod demo;
mod info;
mod perf;
mod pingpong;
mod stat;

/// Every environment variable roxe reads (a test checks the list against
/// the sources), shown by `roxe --help`.
const ENVIRONMENT: &str = "\
Environment (every roxe device, in roxe and in programs over the drop-in library):
  ROXE_ADDR=A[,B...]      device addresses, one device each (default: the first free 127.0.0.N)
  ROXE_ICRC=MODE          off | warn | strict | raw: how received ICRCs are checked
  ROXE_PCAP=FILE          write every packet a device sends and receives to FILE (pcap)
  ROXE_FAULT=SPEC         loss=P,dup=P,reorder=P,corrupt=P,delay=T,seed=N on every device
  ROXE_GSO=on|off         UDP segmentation offload for sends and GRO for receives (default on)
  ROXE_BUSY_POLL=on|off   the progress thread spins instead of sleeping
  ROXE_CALLER_PROGRESS=on|off  a poll_cq that finds nothing receives in the caller's thread (default on)
  ROXE_LOG=FILTER         log (tracing EnvFilter syntax, e.g. info or roxe_provider::cm=debug)
  ROXE_BACKEND=CHOICE     soft | hardware | auto: which devices are offered (default auto)
  ROXE_SYSTEM_LIBIBVERBS=PATH  the system libibverbs.so.1 for real (hardware) devices
  ROXE_SYSTEM_DEVICES=on|off  the drop-in also lists the system's real devices (default on)
  ROXE_HW_ALLOW_DROP_IN=1 tests only: accept roxe's own drop-in as that library (roxe over roxe)";

#[derive(Parser)]
#[command(
    name = "roxe",
    version,
    about = "roxe: software RoCEv2 in userspace",
    after_help = ENVIRONMENT
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Decode every RoCEv2 packet in pcap/pcapng captures and verify its ICRC.
    ///
    /// Exit status: 0 when every RoCEv2 packet is well formed with a valid
    /// ICRC; 1 on any malformed, truncated or bad-ICRC packet; 2 when a file
    /// cannot be read; 3 when no RoCEv2 packet was found.
    Decode(decode::Args),
    /// Capture RoCEv2 live on an interface, one decoded line per packet
    /// with its ICRC verified over the real IP header; a summary at the
    /// end. Exit status as decode's. Needs CAP_NET_RAW.
    Capture(capture::Args),
    /// perftest-style bandwidth and latency between two processes.
    Perf(perf::Args),
    /// Ping-pong SENDs over an RC QP, as rdma-core's ibv_rc_pingpong.
    Pingpong(pingpong::Args),
    /// List roxe devices (like ibv_devices).
    Devices,
    /// The open roxe devices of this user's processes: counters and QPs
    /// (like `rdma stat` and `rdma res show qp`).
    Stat(stat::Args),
    /// Show device attributes, port and GID table (like ibv_devinfo).
    Devinfo(info::DevinfoArgs),
    /// Run every RDMA operation between a server and a client process on
    /// loopback, verify every byte, and print a table. Exit status 0 when
    /// all passed.
    Demo(demo::Args),
}

fn main() -> ExitCode {
    // Like the C tools: `roxe devices | head -1` ends quietly when the
    // reader goes away, instead of println! panicking on EPIPE.
    // SAFETY: restoring the default action of SIGPIPE before any thread
    // exists; no handler code is involved.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let cli = Cli::parse();
    match cli.command {
        Command::Decode(args) => decode::run(&args),
        Command::Capture(a) => capture::run(&a),
        Command::Perf(a) => perf::run(&a),
        Command::Pingpong(a) => pingpong::run(&a),
        Command::Stat(a) => stat::run(&a),
        Command::Devices => info::run_devices(),
        Command::Devinfo(args) => info::run_devinfo(&args),
        Command::Demo(args) => demo::run(&args),
    }
}
