//! `roxe perf`: a perftest-style benchmark between two processes, each with
//! its own soft device (the first of `roxe_verbs::devices()`: set
//! `ROXE_ADDR` per process, or let each take the next free loopback
//! address).
//!
//! ```text
//! roxe perf write|read|send [-d DEV] [-x GID] [-s SIZE] [-n ITERS] [-q QPS] [-Q CQ_MOD] [--lat] [--json] [-p PORT] [server | client ADDR | ADDR]
//! ```
//!
//! Where things are:
//!
//! - [`args`]: the command line, and the [`Params`](args::Params) of a run
//!   it makes, which the client sends the server;
//! - [`ctrl`]: the TCP control connection and its messages;
//! - [`client`] and [`server`]: each side's sequence of a run;
//! - [`setup`]: the verbs resources of one side; [`poll`]: waiting for
//!   their completions;
//! - [`bw`] and [`lat`]: the bandwidth and latency loops, which both sides
//!   share;
//! - [`report`]: the results, and printing them (human, perftest's table,
//!   JSON); [`ticks`]: the latency clock.
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

mod args;
mod bw;
mod client;
mod ctrl;
mod lat;
mod poll;
mod report;
mod server;
mod setup;
mod ticks;

pub use args::Args;

use args::Role;
use ctrl::{Ctrl, Msg};
use report::Report;
use std::fmt::Display;
use std::process::ExitCode;

/// The low bits of a wr_id count WRs; the high bits name the QP.
const QP_SHIFT: u32 = 40;
const SEQ_MASK: u64 = (1 << QP_SHIFT) - 1;

/// Failures: a message for stderr (and for the peer).
type Res<T> = Result<T, String>;

fn ctx<E: Display>(what: &'static str) -> impl FnOnce(E) -> String {
    move |e| format!("{what}: {e}")
}

/// `roxe perf`.
pub fn run(args: &Args) -> ExitCode {
    match args.role() {
        Ok((Role::Client, Some(addr))) => client::run(args, addr),
        Ok(_) => server::run(args),
        Err(e) => {
            eprintln!("roxe perf: {e}");
            ExitCode::from(2)
        }
    }
}

/// Print a run's results, or say why it failed (here, and to the peer).
fn conclude(run: Res<Report>, ctrl: &mut Ctrl, args: &Args) -> bool {
    match run {
        Ok(report) => {
            report::print_run(&report, args);
            true
        }
        Err(e) => {
            eprintln!("roxe perf: {e}");
            let _ = ctrl.send(&Msg::Error { message: e });
            false
        }
    }
}
