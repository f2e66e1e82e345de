//! `roxe-test-peer`: the server side of `tests/two_process.rs`, a separate
//! process with its own soft device (the first of `roxe_verbs::devices()`,
//! so `ROXE_ADDR`, `ROXE_FAULT`, `ROXE_PCAP` configure it).
//!
//! It creates a PD, a completion channel, CQs, one MR, three RC QPs (0 with
//! its own receive queue, 1 and 2 sharing an SRQ) and a UD QP, prints a
//! [`proto::Hello`] line, reads the client's [`proto::ClientHello`],
//! connects, answers `Ok`, then obeys [`proto::Cmd`] lines from stdin and
//! answers each on stdout. Every wait is bounded (a watchdog ends the
//! process if a command or the wait for one takes too long); any failure
//! ends it with a non-zero status and a message on stderr. It exits 0 on
//! `Quit` or when stdin closes.

mod proto;

use proto::{ClientHello, Cmd, Hello, Reply, Rq, Wait, Wc};
use roxe_verbs::*;
use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::net::IpAddr;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

type DynResult<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// Longest a command (or the wait for the next one) may take.
const CMD_LIMIT: Duration = Duration::from_secs(180);
/// Longest a `Stream` command may take.
const STREAM_LIMIT: Duration = Duration::from_secs(900);
/// Longest wait for one completion inside a command.
const WAIT: Duration = Duration::from_secs(60);

/// The watchdog's deadline, in milliseconds since [`start`].
static DEADLINE_MS: AtomicU64 = AtomicU64::new(u64::MAX);

fn start() -> Instant {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *START.get_or_init(Instant::now)
}

fn arm_watchdog(limit: Duration) {
    let at = start().elapsed() + limit;
    DEADLINE_MS.store(at.as_millis() as u64, Ordering::Release);
}

fn spawn_watchdog() {
    start();
    std::thread::spawn(|| loop {
        std::thread::sleep(Duration::from_millis(100));
        let d = DEADLINE_MS.load(Ordering::Acquire);
        if start().elapsed().as_millis() as u64 > d {
            eprintln!("roxe-test-peer: watchdog: a command or the wait for one took too long");
            std::process::exit(3);
        }
    });
}

fn access() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC
}

fn cpu_secs() -> f64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

struct Peer {
    ctx: Context,
    _pd: Pd,
    channel: CompChannel,
    /// Receive completions of the RC QPs (attached to `channel`).
    recv_cq: Cq,
    ud_cq: Cq,
    mr: Mr,
    srq: Srq,
    rc: Vec<Qp>,
    ud: Qp,
    /// wr_id → (offset, size) of posted RC (own RQ or SRQ) receives.
    posted_rc: HashMap<u64, (u64, u32)>,
    /// The same for the UD QP.
    posted_ud: HashMap<u64, (u64, u32)>,
}

impl Peer {
    fn new() -> DynResult<Peer> {
        let ctx = devices()?
            .into_iter()
            .next()
            .ok_or("no roxe device")?
            .open()?;
        let pd = ctx.alloc_pd()?;
        let channel = ctx.create_comp_channel()?;
        let send_cq = ctx.create_cq(4096, None)?;
        let recv_cq = ctx.create_cq(8192, Some(&channel))?;
        let ud_cq = ctx.create_cq(256, None)?;
        let srq = pd.create_srq(4096, 1)?;
        let mr = pd.reg_mr(proto::PEER_MR_LEN, access())?;
        let mut rc = Vec::new();
        for i in 0..proto::PEER_RC_QPS {
            let mut init = QpInit::new(QpType::Rc, &send_cq, &recv_cq);
            init.cap.max_send_wr = 256;
            init.cap.max_recv_wr = 4096;
            if i > 0 {
                init.srq = Some(&srq);
            }
            rc.push(pd.create_qp(&init)?);
        }
        let ud = pd.create_qp(&QpInit::new(QpType::Ud, &ud_cq, &ud_cq))?;
        ud.ready_ud(proto::QKEY, 0)?;
        Ok(Peer {
            ctx,
            _pd: pd,
            channel,
            recv_cq,
            ud_cq,
            mr,
            srq,
            rc,
            ud,
            posted_rc: HashMap::new(),
            posted_ud: HashMap::new(),
        })
    }

    fn hello(&self) -> Hello {
        Hello {
            pid: std::process::id(),
            addr: self.ctx.addr().to_string(),
            gid: self.ctx.query_gid(1, 0).unwrap(),
            rc: self
                .rc
                .iter()
                .map(|q| q.endpoint(proto::PEER_PSN))
                .collect(),
            ud_qpn: self.ud.qp_num(),
            mr_addr: self.mr.addr(),
            mr_len: self.mr.len() as u64,
            rkey: self.mr.rkey(),
        }
    }

    fn connect(&self, client: &ClientHello) -> DynResult<()> {
        for (i, ep) in &client.connect {
            let qp = self.rc.get(*i).ok_or("no such peer QP")?;
            let remote = Endpoint {
                lid: ep.lid,
                qpn: ep.qpn,
                psn: ep.psn,
                gid: ep.gid,
            };
            qp.connect(
                proto::PEER_PSN,
                &remote,
                Mtu::Mtu4096,
                access(),
                client.timeout,
            )?;
        }
        Ok(())
    }

    fn post_recv(&mut self, rq: Rq, wr_id: u64, off: u64, size: u32) -> DynResult<()> {
        let wr = RecvWr {
            wr_id,
            sg_list: vec![self.mr.sge(off as usize, size)],
        };
        match rq {
            Rq::Qp(i) => self.rc.get(i).ok_or("no such peer QP")?.post_recv(wr)?,
            Rq::Srq => self.srq.post_recv(wr)?,
            Rq::Ud => self.ud.post_recv(wr)?,
        }
        let map = if rq == Rq::Ud {
            &mut self.posted_ud
        } else {
            &mut self.posted_rc
        };
        if map.insert(wr_id, (off, size)).is_some() {
            return Err(format!("wr_id {wr_id} posted twice").into());
        }
        Ok(())
    }

    /// Wait for at least one completion on `cq` (the RC receive CQ unless
    /// `ud`) the way `wait` says, and return how many `out` got.
    fn wait_some(
        &self,
        ud: bool,
        wait: Wait,
        out: &mut [WorkCompletion],
        events: &mut u64,
        sleeps: &mut u64,
    ) -> DynResult<usize> {
        let cq = if ud { &self.ud_cq } else { &self.recv_cq };
        let wait = if ud { Wait::Poll } else { wait };
        let deadline = Instant::now() + WAIT;
        // Spin, then yield, then (a peer may be slow) short sleeps.
        let backoff = crossbeam_utils::Backoff::new();
        loop {
            let k = cq.poll(out)?;
            if k > 0 {
                return Ok(k);
            }
            if Instant::now() > deadline {
                return Err(format!("no completion within {WAIT:?}").into());
            }
            match wait {
                Wait::Poll => {
                    if backoff.is_completed() {
                        std::thread::sleep(Duration::from_micros(50));
                    } else {
                        backoff.snooze();
                    }
                }
                Wait::Channel | Wait::ChannelFd => {
                    cq.req_notify(false)?;
                    // A completion may have landed between the poll and
                    // the arming: poll again before sleeping.
                    let k = cq.poll(out)?;
                    if k > 0 {
                        return Ok(k);
                    }
                    *sleeps += 1;
                    self.event_for(cq, wait == Wait::Channel, deadline)?;
                    *events += 1;
                }
            }
        }
    }

    /// Wait for the completion channel's next event, which must be for
    /// `cq`: `blocking`, with `ibv_get_cq_event` (the watchdog bounds it);
    /// otherwise the channel is non-blocking and `poll(2)` waits on its fd.
    fn event_for(&self, cq: &Cq, blocking: bool, deadline: Instant) -> DynResult<()> {
        let id = if blocking {
            self.channel.get_event()?
        } else {
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err("no completion event within the wait".into());
                }
                let ts = rustix::time::Timespec {
                    tv_sec: left.as_secs() as _,
                    tv_nsec: left.subsec_nanos() as _,
                };
                let mut fds = [rustix::event::PollFd::new(
                    &self.channel,
                    rustix::event::PollFlags::IN,
                )];
                if rustix::event::poll(&mut fds, Some(&ts))? == 0 {
                    continue;
                }
                match self.channel.get_event() {
                    Ok(id) => break id,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                    Err(e) => return Err(e.into()),
                }
            }
        };
        if id != cq.id() {
            return Err(format!("event for CQ {id:?}, expected {:?}", cq.id()).into());
        }
        Ok(())
    }

    /// Describe a completion, with what its receive buffer holds.
    fn describe(&mut self, ud: bool, wc: &WorkCompletion) -> DynResult<Wc> {
        let mut d = Wc {
            wr_id: wc.wr_id,
            status: wc.status as u32,
            opcode: wc.opcode as u32,
            byte_len: wc.byte_len,
            imm_data: wc.imm_data,
            wc_flags: wc.wc_flags,
            qp_num: wc.qp_num,
            src_qp: wc.src_qp,
            tag: None,
            crc: None,
            grh_src: None,
        };
        let map = if ud {
            &mut self.posted_ud
        } else {
            &mut self.posted_rc
        };
        let Some((off, size)) = map.remove(&wc.wr_id) else {
            return Err(format!("completion of a receive never posted (or twice): {wc:?}").into());
        };
        if wc.status != WcStatus::Success || wc.opcode != WcOpcode::Recv {
            return Ok(d);
        }
        if wc.byte_len > size {
            return Err(format!("byte_len {} > posted {size}: {wc:?}", wc.byte_len).into());
        }
        let (data_off, len) = if ud {
            let mut grh = [0u8; 40];
            self.mr.read(off as usize, &mut grh)?;
            d.grh_src = Some(if grh[20] >> 4 == 4 {
                IpAddr::from([grh[32], grh[33], grh[34], grh[35]]).to_string()
            } else {
                let mut a = [0u8; 16];
                a.copy_from_slice(&grh[8..24]);
                IpAddr::from(a).to_string()
            });
            (off + 40, wc.byte_len.saturating_sub(40))
        } else {
            (off, wc.byte_len)
        };
        let mut data = vec![0u8; len as usize];
        self.mr.read(data_off as usize, &mut data)?;
        if data.len() >= 8 {
            let mut t = [0u8; 8];
            t.copy_from_slice(&data[..8]);
            d.tag = Some(u64::from_le_bytes(t));
        }
        d.crc = Some(proto::crc(&data));
        Ok(d)
    }

    fn serve(&mut self, cmd: &Cmd, out: &mut impl Write) -> DynResult<Reply> {
        let mr_len = self.mr.len() as u64;
        let range = |off: u64, len: u64| -> DynResult<()> {
            if off.checked_add(len).is_some_and(|e| e <= mr_len) {
                Ok(())
            } else {
                Err(format!("{len} bytes at {off} exceed the MR").into())
            }
        };
        match *cmd {
            Cmd::PostRecv {
                rq,
                first_wr_id,
                n,
                off,
                size,
            } => {
                range(off, u64::from(n) * u64::from(size))?;
                for i in 0..n {
                    let o = off + u64::from(i) * u64::from(size);
                    self.post_recv(rq, first_wr_id + u64::from(i), o, size)?;
                }
                Ok(Reply::Ok)
            }
            Cmd::Expect { ud, n, wait } => {
                // O_NONBLOCK on the channel for ChannelFd only (set per
                // command, so a failed one leaves nothing behind).
                self.channel.set_nonblocking(wait == Wait::ChannelFd)?;
                let (mut events, mut sleeps) = (0, 0);
                let mut wcs = Vec::new();
                let mut buf = [WorkCompletion::new(0, WcStatus::Success, WcOpcode::Send, 0); 64];
                while wcs.len() < n as usize {
                    let max = (n as usize - wcs.len()).min(buf.len());
                    let k = self.wait_some(ud, wait, &mut buf[..max], &mut events, &mut sleeps)?;
                    for wc in &buf[..k] {
                        let d = self.describe(ud, wc)?;
                        wcs.push(d);
                    }
                }
                Ok(Reply::Completions {
                    wcs,
                    events,
                    sleeps,
                })
            }
            Cmd::Verify { off, len, seed } => {
                range(off, len)?;
                let mut got = vec![0u8; len as usize];
                self.mr.read(off as usize, &mut got)?;
                let want = proto::pattern(seed, len as usize);
                Ok(match got.iter().zip(&want).position(|(a, b)| a != b) {
                    None => Reply::Ok,
                    Some(i) => Reply::Bad(format!(
                        "{len} bytes at {off}: byte {i} is {:#04x}, expected {:#04x}",
                        got[i], want[i]
                    )),
                })
            }
            Cmd::Fill { off, len, seed } => {
                range(off, len)?;
                self.mr
                    .write(off as usize, &proto::pattern(seed, len as usize))?;
                Ok(Reply::Ok)
            }
            Cmd::Crc { off, len } => {
                range(off, len)?;
                let mut got = vec![0u8; len as usize];
                self.mr.read(off as usize, &mut got)?;
                Ok(Reply::Crc(proto::crc(&got)))
            }
            Cmd::SetWord { off, value } => {
                range(off, 8)?;
                self.mr.write(off as usize, &value.to_ne_bytes())?;
                Ok(Reply::Ok)
            }
            Cmd::GetWord { off } => {
                range(off, 8)?;
                let mut b = [0u8; 8];
                self.mr.read(off as usize, &mut b)?;
                Ok(Reply::Word(u64::from_ne_bytes(b)))
            }
            Cmd::Stream {
                rq,
                n,
                size,
                slots,
                off,
                wait,
            } => self.stream(rq, n, size, slots, off, wait, out),
            Cmd::PingPong {
                first,
                turns,
                exit,
                addr,
                rkey,
            } => self.ping_pong(first..first + turns, exit, (addr, rkey), out),
            Cmd::Stats => Ok(Reply::Stats(format!("{:?}", self.ctx.stats().unwrap()))),
            Cmd::Quit => Ok(Reply::Ok),
        }
    }

    fn ping_pong(
        &mut self,
        turns: std::ops::Range<u32>,
        exit: bool,
        (addr, rkey): (u64, u32),
        out: &mut impl Write,
    ) -> DynResult<Reply> {
        let qp = &self.rc[0];
        let off = proto::PINGPONG_OFF as usize;
        // Poll memory, as ib_write_lat does: no verb runs meanwhile.
        let wait_turn = |turn: u32| -> DynResult<()> {
            let deadline = Instant::now() + WAIT;
            let mut word = [0u8; 4];
            loop {
                self.mr.read(off, &mut word)?;
                if u32::from_le_bytes(word) == turn {
                    return Ok(());
                }
                if Instant::now() > deadline {
                    return Err(format!("no WRITE of turn {turn} from the client").into());
                }
                // Others share the CPUs under a parallel test run.
                std::thread::yield_now();
            }
        };
        send_line(out, &Reply::Ready)?;
        let last = turns.end;
        for turn in turns {
            wait_turn(turn)?;
            self.mr.write(off + 64, &turn.to_le_bytes())?;
            let mut answer = SendWr::new(
                u64::from(turn),
                SendOpcode::RdmaWrite,
                vec![self.mr.sge(off + 64, 4)],
            );
            answer.remote_addr = addr;
            answer.rkey = rkey;
            answer.flags = SendFlags::default();
            qp.post_send(answer)?;
        }
        if exit {
            wait_turn(last)?;
            // The ACK of that WRITE may be held for an answer that never
            // comes: the device sends it as the process exits.
            std::process::exit(0);
        }
        let held = (self.ctx.soft_device())
            .and_then(|d| {
                (d.engine().qp_snapshots().into_iter())
                    .find(|q| q.qpn == qp.qp_num())
                    .map(|q| q.counters.acks_held)
            })
            .unwrap_or(0);
        Ok(Reply::Word(held))
    }

    #[allow(clippy::too_many_arguments)]
    fn stream(
        &mut self,
        rq: Rq,
        n: u64,
        size: u32,
        slots: u32,
        off: u64,
        wait: Wait,
        out: &mut impl Write,
    ) -> DynResult<Reply> {
        if rq == Rq::Ud || slots == 0 {
            return Err("Stream needs an RC receive queue and slots".into());
        }
        let slots = u64::from(slots).min(n.max(1));
        if off + slots * u64::from(size) > self.mr.len() as u64 {
            return Err("the ring exceeds the MR".into());
        }
        let slot_wr = |i: u64| 1 << 40 | i;
        let post = |p: &Peer, i: u64| -> DynResult<()> {
            let wr = RecvWr {
                wr_id: slot_wr(i),
                sg_list: vec![p.mr.sge((off + i * u64::from(size)) as usize, size)],
            };
            match rq {
                Rq::Qp(q) => p.rc.get(q).ok_or("no such peer QP")?.post_recv(wr)?,
                _ => p.srq.post_recv(wr)?,
            }
            Ok(())
        };
        for i in 0..slots {
            post(self, i)?;
        }
        send_line(out, &Reply::Ready)?;
        self.channel.set_nonblocking(wait == Wait::ChannelFd)?;
        let t0 = Instant::now();
        let cpu0 = cpu_secs();
        let mut hasher = crc32fast::Hasher::new();
        let mut data = vec![0u8; size as usize];
        let (mut events, mut sleeps) = (0, 0);
        let mut posted = slots;
        let mut got = 0u64;
        let mut bytes = 0u64;
        let mut buf = [WorkCompletion::new(0, WcStatus::Success, WcOpcode::Send, 0); 32];
        while got < n {
            let k = self.wait_some(false, wait, &mut buf, &mut events, &mut sleeps)?;
            for wc in &buf[..k] {
                let slot = got % slots;
                if wc.status != WcStatus::Success
                    || wc.opcode != WcOpcode::Recv
                    || wc.wr_id != slot_wr(slot)
                    || wc.byte_len != size
                {
                    return Err(format!(
                        "stream message {got}: expected slot {slot} with {size} bytes, got {wc:?}"
                    )
                    .into());
                }
                self.mr
                    .read((off + slot * u64::from(size)) as usize, &mut data)?;
                hasher.update(&data);
                bytes += u64::from(size);
                got += 1;
                if posted < n {
                    post(self, slot)?;
                    posted += 1;
                }
            }
        }
        Ok(Reply::Streamed {
            crc: hasher.finalize(),
            bytes,
            msgs: got,
            secs: t0.elapsed().as_secs_f64(),
            events,
            cpu_secs: cpu_secs() - cpu0,
        })
    }
}

fn send_line<T: serde::Serialize>(out: &mut impl Write, v: &T) -> DynResult<()> {
    let mut line = serde_json::to_vec(v)?;
    line.push(b'\n');
    out.write_all(&line)?;
    out.flush()?;
    Ok(())
}

fn run() -> DynResult<()> {
    arm_watchdog(CMD_LIMIT);
    let mut peer = Peer::new()?;
    let stdin = std::io::stdin();
    let mut input = stdin.lock();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    send_line(&mut out, &peer.hello())?;
    let mut line = String::new();
    if input.read_line(&mut line)? == 0 {
        return Ok(()); // The client went away before connecting.
    }
    let client: ClientHello = serde_json::from_str(&line)?;
    peer.connect(&client)?;
    send_line(&mut out, &Reply::Ok)?;
    loop {
        arm_watchdog(CMD_LIMIT);
        line.clear();
        if input.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let cmd: Cmd = serde_json::from_str(&line)?;
        if matches!(cmd, Cmd::Stream { .. }) {
            arm_watchdog(STREAM_LIMIT);
        }
        // A failed command is reported to the client, which fails the test
        // with the message; the peer itself carries on.
        let reply = match peer.serve(&cmd, &mut out) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("roxe-test-peer: {cmd:?}: {e}");
                Reply::Bad(e.to_string())
            }
        };
        send_line(&mut out, &reply)?;
        if matches!(cmd, Cmd::Quit) {
            return Ok(());
        }
    }
}

fn main() -> ExitCode {
    spawn_watchdog();
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("roxe-test-peer: {e}");
            ExitCode::from(1)
        }
    }
}
