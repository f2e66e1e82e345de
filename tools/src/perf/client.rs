//! The client side of `roxe perf`: it chooses the run's parameters, sends
//! them to the server with its endpoints, runs the measuring loop and
//! reports.

use super::args::{default_outs, params_of, sizes, Args, Op, Params, ALL_SIZES};
use super::ctrl::{self, Ctrl, Msg};
use super::report::{both_ways, Report};
use super::setup::setup;
use super::{bw, conclude, lat, Res};
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// `roxe perf ... client ADDR`: one run per size (`-a`), each on a
/// connection of its own.
pub fn run(args: &Args, addr: &str) -> ExitCode {
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
        let mut ctrl = match ctrl::connect(addr, args.port, deadline) {
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

/// One run: its results, which both sides print.
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
            bw::post_initial_recvs(p, &s, &mut recv_posted)?;
        }
        ctrl.send(&Msg::Go)?;
    }
    let report = if p.lat {
        match p.op {
            Op::Read => lat::read(p, &s, ctrl, rmr, deadline)?,
            Op::Write if p.poll_buffer => lat::write_polling(p, &s, ctrl, rmr, deadline, true)?,
            Op::Write | Op::Send => {
                let posted = lat::prepost_pingpong(p, &s)?;
                lat::pingpong(p, &s, ctrl, rmr, deadline, true, posted)?
            }
        }
    } else {
        let recv = (p.bidir && p.op == Op::Send).then(|| bw::RecvSide::new(&mut recv_posted));
        bw::sender(p, &s, ctrl, rmr, deadline, recv)?
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
