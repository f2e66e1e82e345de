//! The latency loops of `roxe perf`: READ one at a time, and the
//! ping-pongs (WRITE_WITH_IMM or SEND, or plain WRITEs with buffer polling
//! on hardware), whose two sides share the code.

use super::args::{Op, Params};
use super::ctrl::{Ctrl, RemoteMr};
use super::poll::{blank_wcs, Poller};
use super::report::{lat_stats, report, Progress, Report};
use super::setup::{inline_payload, Setup};
use super::ticks::{self, TickRate};
use super::Res;
use roxe_verbs::{SendFlags, SendOpcode, SendWr, WcOpcode};
use std::time::Instant;

/// One READ at a time; each sample is the full time to its completion.
pub fn read(p: &Params, s: &Setup, ctrl: &Ctrl, rmr: RemoteMr, deadline: Instant) -> Res<Report> {
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
pub fn write_polling(
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

/// A ping-pong's receives, posted before the peer may send: as many as
/// the receive queue holds, at most one per message. Returns the count.
pub fn prepost_pingpong(p: &Params, s: &Setup) -> Res<u64> {
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
pub fn pingpong(
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
