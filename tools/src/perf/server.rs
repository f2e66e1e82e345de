//! The server side of `roxe perf`: it takes the client's parameters, makes
//! its QPs ready and its receives posted before it answers, takes part in
//! the run (answers a ping-pong, counts a `send` run's receives, sends too
//! with `-b`) and prints the client's report.

use super::args::{params_of, validate, Args, Op, ALL_SIZES};
use super::ctrl::{self, Ctrl, Msg};
use super::report::{both_ways, Report};
use super::setup::setup;
use super::{bw, conclude, lat, Res};
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// `roxe perf ... [server]`: serve one client (`-a`: one per size).
pub fn run(args: &Args) -> ExitCode {
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
        let mut ctrl = match ctrl::accept(args.port, deadline) {
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
        recv_posted[0] = lat::prepost_pingpong(&p, &s)?;
    } else if p.op == Op::Send {
        bw::post_initial_recvs(&p, &s, &mut recv_posted)?;
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
        lat::write_polling(&p, &s, ctrl, cmr, deadline, false)?;
    } else if pingpong_mode {
        lat::pingpong(&p, &s, ctrl, cmr, deadline, false, recv_posted[0])?;
    } else if p.bidir {
        match ctrl.recv(deadline, "the client's go")? {
            Msg::Go => {}
            m => return Err(format!("expected go, got {m:?}")),
        }
        let recv = (p.op == Op::Send).then(|| bw::RecvSide::new(&mut recv_posted));
        mine = Some(bw::sender(&p, &s, ctrl, cmr, deadline, recv)?);
    } else if p.op == Op::Send {
        bw::receiver(&p, &s, ctrl, deadline, &mut recv_posted)?;
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
