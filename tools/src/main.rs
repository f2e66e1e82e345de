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

/// Under the options: where the variables apply.
const ENVIRONMENT: &str = "\
The environment variables above configure every roxe device: in roxe, and in \
programs over the drop-in library (libibverbs.so.1, librdmacm.so.1). \
Switches take 1/0, on/off, true/false or yes/no.";

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
    #[command(flatten)]
    env: Environment,
}

/// The environment every roxe device reads, as options too (clap shows
/// each variable in `--help`). An option given on the command line is
/// exported to the variable before any device opens; unset, the variable
/// as the environment has it applies.
#[derive(clap::Args)]
#[command(next_help_heading = "Environment (also as options)")]
struct Environment {
    /// Device addresses, one device each (default: the first free 127.0.0.N).
    #[arg(long, global = true, env = "ROXE_ADDR", value_name = "A[,B...]")]
    roxe_addr: Option<String>,
    /// How received ICRCs are checked: off, warn, strict or raw.
    #[arg(long, global = true, env = "ROXE_ICRC", value_name = "MODE")]
    roxe_icrc: Option<String>,
    /// Write every packet a device sends and receives to FILE (pcap).
    #[arg(long, global = true, env = "ROXE_PCAP", value_name = "FILE")]
    roxe_pcap: Option<String>,
    /// Faults on transmit: loss=P,dup=P,reorder=P,corrupt=P,delay=T,seed=N.
    #[arg(long, global = true, env = "ROXE_FAULT", value_name = "SPEC")]
    roxe_fault: Option<String>,
    /// UDP GSO for sends and GRO for receives (default on).
    #[arg(long, global = true, env = "ROXE_GSO", value_name = "on|off")]
    roxe_gso: Option<String>,
    /// The progress thread spins instead of sleeping.
    #[arg(long, global = true, env = "ROXE_BUSY_POLL", value_name = "on|off")]
    roxe_busy_poll: Option<String>,
    /// A poll_cq that finds nothing receives in the caller's thread (default on).
    #[arg(
        long,
        global = true,
        env = "ROXE_CALLER_PROGRESS",
        value_name = "on|off"
    )]
    roxe_caller_progress: Option<String>,
    /// Log filter (tracing EnvFilter syntax, e.g. info or roxe_provider::cm=debug).
    #[arg(long, global = true, env = "ROXE_LOG", value_name = "FILTER")]
    roxe_log: Option<String>,
    /// Which devices are offered: soft, hardware or auto (default auto).
    #[arg(long, global = true, env = "ROXE_BACKEND", value_name = "CHOICE")]
    roxe_backend: Option<String>,
    /// The system libibverbs.so.1 for real (hardware) devices.
    #[arg(
        long,
        global = true,
        env = "ROXE_SYSTEM_LIBIBVERBS",
        value_name = "PATH"
    )]
    roxe_system_libibverbs: Option<String>,
    /// The drop-in also lists the system's real devices (default on).
    #[arg(
        long,
        global = true,
        env = "ROXE_SYSTEM_DEVICES",
        value_name = "on|off"
    )]
    roxe_system_devices: Option<String>,
    /// Tests only: accept roxe's own drop-in as the system library.
    #[arg(long, global = true, env = "ROXE_HW_ALLOW_DROP_IN", value_name = "1")]
    roxe_hw_allow_drop_in: Option<String>,
}

impl Environment {
    /// Export what was given as options (the devices read the variables).
    fn export(&self) {
        for (var, value) in [
            ("ROXE_ADDR", &self.roxe_addr),
            ("ROXE_ICRC", &self.roxe_icrc),
            ("ROXE_PCAP", &self.roxe_pcap),
            ("ROXE_FAULT", &self.roxe_fault),
            ("ROXE_GSO", &self.roxe_gso),
            ("ROXE_BUSY_POLL", &self.roxe_busy_poll),
            ("ROXE_CALLER_PROGRESS", &self.roxe_caller_progress),
            ("ROXE_LOG", &self.roxe_log),
            ("ROXE_BACKEND", &self.roxe_backend),
            ("ROXE_SYSTEM_LIBIBVERBS", &self.roxe_system_libibverbs),
            ("ROXE_SYSTEM_DEVICES", &self.roxe_system_devices),
            ("ROXE_HW_ALLOW_DROP_IN", &self.roxe_hw_allow_drop_in),
        ] {
            if let Some(v) = value {
                // Before any thread exists (main's first step after parsing).
                std::env::set_var(var, v);
            }
        }
    }
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
    cli.env.export();
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
