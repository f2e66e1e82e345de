//! `roxe`: the command-line tool of the roxe software RoCEv2 provider.

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use std::process::ExitCode;

mod capture;
mod decode;
mod demo;
mod info;
mod perf;
mod pingpong;
mod plot;
mod run;
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
}

/// The environment every roxe device reads, as global options too: clap
/// shows each with its variable in `--help`, and one given on the command
/// line is exported before any device opens (unset, the variable as the
/// environment has it applies). (variable, option, value, help)
const ENV_OPTIONS: &[(&str, &str, &str, &str)] = &[
    (
        "ROXE_ADDR",
        "roxe-addr",
        "A[,B...]",
        "Device addresses, one device each (default: the first free 127.0.0.N)",
    ),
    (
        "ROXE_SHARE",
        "roxe-share",
        "on|off",
        "Share a configured address with this user's other processes (default on; off: EADDRINUSE for a second process)",
    ),
    (
        "ROXE_SELECTIVE",
        "roxe-selective",
        "on|off",
        "Towards roxe peers on this host, a lost packet is resent alone and what followed it kept (default on; off: go-back-N)",
    ),
    (
        "ROXE_ICRC",
        "roxe-icrc",
        "MODE",
        "How received ICRCs are checked: off, warn, strict or raw",
    ),
    (
        "ROXE_PCAP",
        "roxe-pcap",
        "FILE",
        "Write every packet a device sends and receives to FILE (pcap)",
    ),
    (
        "ROXE_FAULT",
        "roxe-fault",
        "SPEC",
        "Faults on transmit: loss=P,dup=P,reorder=P,corrupt=P,delay=T,seed=N",
    ),
    (
        "ROXE_GSO",
        "roxe-gso",
        "on|off",
        "UDP GSO for sends and GRO for receives (default on)",
    ),
    (
        "ROXE_BUSY_POLL",
        "roxe-busy-poll",
        "on|off",
        "The progress thread spins instead of sleeping",
    ),
    (
        "ROXE_CALLER_PROGRESS",
        "roxe-caller-progress",
        "on|off",
        "A poll_cq that finds nothing receives in the caller's thread (default on)",
    ),
    (
        "ROXE_CALLER_HOLD",
        "roxe-caller-hold",
        "on|off",
        "A caller spinning on poll_cq, or polling while a stream flows, keeps the socket from the progress thread and fires the timers (default on)",
    ),
    (
        "ROXE_ACK_CLOCKED",
        "roxe-ack-clocked",
        "on|off",
        "After a single post, a new message waits for an ACK while 16+ PSNs (a message under 1 KiB: 2+ messages) are in flight (default on)",
    ),
    (
        "ROXE_TX_BY_REF",
        "roxe-tx-by-ref",
        "on|off",
        "Payloads of 1 KiB or more leave straight from registered memory, not copied first (default on)",
    ),
    (
        "ROXE_ACK_HOLD",
        "roxe-ack-hold",
        "on|off",
        "A QP playing a WRITE ping-pong sends each ACK after its own answer, at most a few turnarounds later (default on)",
    ),
    (
        "ROXE_PROGRESS_SPIN",
        "roxe-progress-spin",
        "on|off",
        "While the program polls no CQ, the progress thread spins for 100 µs after each burst it receives (default on)",
    ),
    (
        "ROXE_RX_COALESCE_US",
        "roxe-rx-coalesce-us",
        "0..1000",
        "After a receive burst of 32 KiB+, the progress thread sleeps this many µs without the socket (default 20; 0 off)",
    ),
    (
        "ROXE_LOG",
        "roxe-log",
        "FILTER",
        "Log filter (tracing EnvFilter syntax, e.g. info or roxe_provider::cm=debug)",
    ),
    (
        "ROXE_BACKEND",
        "roxe-backend",
        "CHOICE",
        "Which devices are offered: soft, hardware or auto (default auto)",
    ),
    (
        "ROXE_SYSTEM_LIBIBVERBS",
        "roxe-system-libibverbs",
        "PATH",
        "The system libibverbs.so.1 for real (hardware) devices",
    ),
    (
        "ROXE_SYSTEM_DEVICES",
        "roxe-system-devices",
        "on|off",
        "The drop-in also lists the system's real devices (default on)",
    ),
    (
        "ROXE_DROPIN_DIR",
        "roxe-dropin-dir",
        "DIR",
        "Where `roxe run` takes the drop-in libibverbs.so.1 from (default: beside roxe, or ../lib/roxe)",
    ),
    (
        "ROXE_UVERBS_BASE",
        "roxe-uverbs-base",
        "N",
        "The uverbs<N> number of the first soft device (`roxe run` sets it to match /dev/infiniband)",
    ),
    (
        "ROXE_VIEW_ROOT",
        "roxe-view-root",
        "DIR",
        "Where the preloaded view library (`roxe run --view preload`) finds the sysfs and /dev files it shows (`roxe run` sets it)",
    ),
    (
        "ROXE_HW_ALLOW_DROP_IN",
        "roxe-hw-allow-drop-in",
        "1",
        "Tests only: accept roxe's own drop-in as the system library",
    ),
];

/// The `roxe` command with the [`ENV_OPTIONS`].
fn command() -> clap::Command {
    ENV_OPTIONS.iter().fold(
        Cli::command().next_help_heading("Environment (also as options)"),
        |cmd, &(var, long, value, help)| {
            cmd.arg(
                clap::Arg::new(var)
                    .long(long)
                    .env(var)
                    .value_name(value)
                    .help(help)
                    .global(true),
            )
        },
    )
}

/// Export the [`ENV_OPTIONS`] given on the command line (the devices read
/// the variables). Runs before any thread exists.
fn export_env_options(matches: &clap::ArgMatches) {
    for &(var, ..) in ENV_OPTIONS {
        if matches.value_source(var) == Some(clap::parser::ValueSource::CommandLine) {
            if let Some(v) = matches.get_one::<String>(var) {
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
    /// Draw PSN against time per QP from a capture, as an SVG a browser
    /// opens: first sends, retransmissions, duplicates, out-of-order
    /// arrivals, ACKs, sequence and RNR NAKs marked. Exit status 2 when a
    /// file cannot be read or written, 3 when the capture holds no RC, UC
    /// or XRC request.
    Plot(plot::Args),
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
    /// Run a program over roxe: the drop-in libraries in its library path,
    /// and roxe's devices in /sys/class/infiniband and /dev/infiniband
    /// (a mount namespace of its own), as UCX, MPI and libfabric look
    /// for them. Exit status: the program's; 125 when it could not be set
    /// up, 127 when it could not be started.
    Run(run::Args),
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
    let matches = command().get_matches();
    export_env_options(&matches);
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    match cli.command {
        Command::Decode(args) => decode::run(&args),
        Command::Capture(a) => capture::run(&a),
        Command::Plot(a) => plot::run(&a),
        Command::Perf(a) => perf::run(&a),
        Command::Pingpong(a) => pingpong::run(&a),
        Command::Stat(a) => stat::run(&a),
        Command::Devices => info::run_devices(),
        Command::Devinfo(args) => info::run_devinfo(&args),
        Command::Demo(args) => demo::run(&args),
        Command::Run(args) => run::run(&args),
    }
}
