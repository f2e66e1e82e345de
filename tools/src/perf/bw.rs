//! The bandwidth loops of `roxe perf`: the sender (the client, and with
//! `-b` the server too) and the receiver of a `send` run.

use super::args::{Op, Params};
use super::ctrl::{Ctrl, RemoteMr};
use super::poll::{blank_wcs, Poller};
use super::report::{report, Progress, Report};
use super::setup::{inline_payload, Setup};
use super::{Res, QP_SHIFT, SEQ_MASK};
use roxe_verbs::{RecvWr, SendFlags, SendOpcode, SendWr, WcOpcode, WorkCompletion};
use std::time::{Duration, Instant};

/// The immediate of the SEND that ends a `-D` SEND run (its receiver
/// cannot count to a number it does not know).
const END_OF_RUN_IMM: u32 = 0xE0D0_E0D0;

/// The wr_id of that SEND.
const END_OF_RUN_WR: u64 = u64::MAX;

/// Receives for the peer's SENDs, as many per QP as it will send (at most
/// the receive depth).
pub fn post_initial_recvs(p: &Params, s: &Setup, recv_posted: &mut [u64]) -> Res<()> {
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
pub struct RecvSide<'r> {
    posted: &'r mut [u64],
    received: u64,
    /// The peer's end-of-run SEND arrived (`-D`).
    ended: bool,
    /// Receives to re-post, per QP: each poll's worth goes as one list
    /// (`RecvSide::repost`).
    reposts: Vec<Vec<RecvWr>>,
}

impl<'r> RecvSide<'r> {
    pub fn new(posted: &'r mut [u64]) -> Self {
        let reposts = vec![Vec::new(); posted.len()];
        RecvSide {
            posted,
            received: 0,
            ended: false,
            reposts,
        }
    }

    pub fn done(&self, p: &Params) -> bool {
        if p.duration > 0 {
            self.ended
        } else {
            self.received >= p.iters
        }
    }
    /// A receive completion: count it and re-post its receive.
    pub fn on_recv(&mut self, p: &Params, s: &Setup, wc: &WorkCompletion) -> Res<()> {
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
    pub fn repost(&mut self, s: &Setup) -> Res<()> {
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
pub fn sender(
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

/// The receiving side of a `send` bandwidth run (the server without
/// `-b`): count ITERS receive completions, re-posting each consumed receive
/// while its QP still expects more messages.
pub fn receiver(
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
