//! `roxe`: the command-line tool of the roxe software RoCEv2 provider.

use clap::{Parser, Subcommand};
use std::process::ExitCode;

mod decode;

#[derive(Parser)]
#[command(name = "roxe", version, about = "roxe: software RoCEv2 in userspace")]
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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Decode(args) => decode::run(&args),
    }
}
