//! `roxe demo`: a server and a client as two processes on loopback, each
//! with its own soft device, running every operation (SEND, SEND_WITH_IMM,
//! WRITE, WRITE_WITH_IMM, READ, FETCH_ADD, CMP_SWAP over RC, and a UD
//! exchange), verifying every byte on the side that received it, and
//! printing a table. The exit status says whether everything passed.
//!
//! The parent re-runs this binary as `roxe demo --role server` (which
//! prints its control port) and `--role client`; the two exchange QP
//! endpoints and commands as JSON lines over TCP.

use roxe_verbs::*;
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

const MR_LEN: usize = 8 << 20;
const QKEY: u32 = 0x1111_1111;
const WAIT: Duration = Duration::from_secs(20);
/// Offsets inside the server's MR.
const RECV_AREA: usize = 0;
const WRITE_AREA: usize = 2 << 20;
const READ_AREA: usize = 4 << 20;
const ATOMIC_WORD: usize = 7 << 20;
const UD_AREA: usize = 7 << 20 | 4096;

/// Arguments of `roxe demo`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Internal: run one side (the parent starts both).
    #[arg(long, hide = true)]
    role: Option<String>,
    /// Internal: the server's control address (client side).
    #[arg(long, hide = true)]
    server: Option<String>,
    /// Repetitions per operation.
    #[arg(short = 'n', long, default_value_t = 32)]
    iters: u32,
    /// Write the server's packets (all of the run's traffic, both
    /// directions) to this pcap file.
    #[arg(long)]
    pcap: Option<std::path::PathBuf>,
    /// The device both sides run on (soft or hardware, as `roxe devices`
    /// lists them); default: the first.
    #[arg(short = 'd', long = "ib-dev", value_name = "DEV")]
    ib_dev: Option<String>,
}

#[derive(Serialize, Deserialize, Debug, Clone, Copy)]
struct Hello {
    rc: Endpoint,
    ud_qpn: u32,
    mr_addr: u64,
    rkey: u32,
}

#[derive(Serialize, Deserialize, Debug)]
enum Cmd {
    /// Post `n` receives of `size` bytes each.
    PostRecv {
        n: u32,
        size: u32,
    },
    /// Wait for `n` receives; message i must hold pattern(seed + i) of
    /// `size` bytes (and `imm` + i when given).
    ExpectRecv {
        n: u32,
        size: u32,
        seed: u64,
        imm: Option<u32>,
    },
    /// The MR at `off` must hold pattern(seed) of `len` bytes.
    Check {
        off: usize,
        len: usize,
        seed: u64,
    },
    /// Fill the MR at `off` with pattern(seed) of `len` bytes.
    Fill {
        off: usize,
        len: usize,
        seed: u64,
    },
    /// Set the atomic word.
    SetWord {
        value: u64,
    },
    /// Return the atomic word.
    GetWord,
    /// Post a UD receive (before the datagram is sent: UD drops what finds
    /// no receive).
    UdPostRecv {
        size: u32,
    },
    /// Wait (at most `UD_TRY`) for one datagram of pattern(seed) from
    /// `src_qp`, then answer it with the same bytes; `Reply::Lost` if none
    /// came (UD may lose it: the client sends again).
    UdEcho {
        size: u32,
        seed: u64,
        src_qp: u32,
    },
    /// Send the echo again (the client did not receive it).
    UdEchoAgain {
        size: u32,
    },
    Done,
}

#[derive(Serialize, Deserialize, Debug)]
enum Reply {
    Ok,
    Word(u64),
    Bad(String),
    /// A UD datagram did not arrive in time.
    Lost,
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn send_line<T: Serialize>(s: &mut TcpStream, v: &T) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(v)?;
    line.push(b'\n');
    s.write_all(&line)
}

fn recv_line<T: for<'a> Deserialize<'a>>(r: &mut BufReader<TcpStream>) -> std::io::Result<T> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "peer closed the control connection",
        ));
    }
    serde_json::from_str(&line).map_err(std::io::Error::other)
}

type DynResult<T> = std::result::Result<T, Box<dyn std::error::Error>>;

struct Side {
    _ctx: Context,
    cq: Cq,
    ud_cq: Cq,
    mr: Mr,
    rc: Qp,
    ud: Qp,
    pd: Pd,
}

fn access() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC
}

impl Side {
    fn new(dev: Option<&str>) -> DynResult<Side> {
        let ctx = crate::info::open_device(dev, None)?;
        let pd = ctx.alloc_pd()?;
        let cq = ctx.create_cq(1024, None)?;
        let ud_cq = ctx.create_cq(64, None)?;
        let mr = pd.reg_mr(MR_LEN, access())?;
        let mut init = QpInit::new(QpType::Rc, &cq, &cq);
        init.cap.max_send_wr = 256;
        init.cap.max_recv_wr = 256;
        let rc = pd.create_qp(&init)?;
        let ud = pd.create_qp(&QpInit::new(QpType::Ud, &ud_cq, &ud_cq))?;
        ud.ready_ud(QKEY, 0)?;
        Ok(Side {
            _ctx: ctx,
            cq,
            ud_cq,
            mr,
            rc,
            ud,
            pd,
        })
    }

    fn hello(&self, psn: u32) -> Hello {
        Hello {
            rc: self.rc.endpoint(psn),
            ud_qpn: self.ud.qp_num(),
            mr_addr: self.mr.addr(),
            rkey: self.mr.rkey(),
        }
    }

    fn connect(&self, psn: u32, peer: &Hello) -> Result<()> {
        self.rc.connect(psn, &peer.rc, Mtu::Mtu4096, access(), 14)
    }
}

fn all_ok(wcs: &[WorkCompletion]) -> DynResult<()> {
    match wcs.iter().find(|w| w.status != WcStatus::Success) {
        Some(w) => Err(format!("wr {} failed: {:?}", w.wr_id, w.status).into()),
        None => Ok(()),
    }
}

fn server(dev: Option<&str>) -> DynResult<()> {
    let side = Side::new(dev)?;
    let listener = TcpListener::bind("127.0.0.1:0")?;
    println!("listening {}", listener.local_addr()?.port());
    std::io::stdout().flush()?;
    let (stream, _) = listener.accept()?;
    stream.set_read_timeout(Some(WAIT * 3))?;
    let mut w = stream.try_clone()?;
    let mut r = BufReader::new(stream);
    let peer: Hello = recv_line(&mut r)?;
    send_line(&mut w, &side.hello(0x1000))?;
    side.connect(0x1000, &peer)?;
    let mut recv_size = 0u32;
    loop {
        let cmd: Cmd = recv_line(&mut r)?;
        let reply = match serve(&side, &cmd, &mut recv_size, &peer) {
            Ok(r) => r,
            Err(e) => Reply::Bad(e.to_string()),
        };
        send_line(&mut w, &reply)?;
        if matches!(cmd, Cmd::Done) {
            return Ok(());
        }
    }
}

fn serve(side: &Side, cmd: &Cmd, recv_size: &mut u32, peer: &Hello) -> DynResult<Reply> {
    match *cmd {
        Cmd::PostRecv { n, size } => {
            *recv_size = size;
            for i in 0..n {
                let off = RECV_AREA + (i as usize * size as usize) % WRITE_AREA;
                side.rc.post_recv(RecvWr {
                    wr_id: u64::from(i),
                    sg_list: vec![side.mr.sge(off, size)],
                })?;
            }
        }
        Cmd::ExpectRecv { n, size, seed, imm } => {
            let wcs = side.cq.poll_wait(n as usize, WAIT)?;
            all_ok(&wcs)?;
            for (i, wc) in wcs.iter().enumerate() {
                if wc.byte_len != size || wc.wr_id != i as u64 {
                    return Ok(Reply::Bad(format!("receive {i}: {wc:?}")));
                }
                if let Some(imm) = imm {
                    if wc.wc_flags & wc_flags::WITH_IMM == 0 || wc.imm_data != imm + i as u32 {
                        return Ok(Reply::Bad(format!("receive {i}: immediate {wc:?}")));
                    }
                }
                if wc.opcode == WcOpcode::RecvRdmaWithImm {
                    continue; // WRITE_WITH_IMM: data checked with Check.
                }
                let off = RECV_AREA + (i * *recv_size as usize) % WRITE_AREA;
                let mut got = vec![0u8; size as usize];
                side.mr.read(off, &mut got)?;
                if got != pattern(seed + i as u64, size as usize) {
                    return Ok(Reply::Bad(format!("receive {i}: data differs")));
                }
            }
        }
        Cmd::Check { off, len, seed } => {
            let mut got = vec![0u8; len];
            side.mr.read(off, &mut got)?;
            if got != pattern(seed, len) {
                return Ok(Reply::Bad(format!("{len} bytes at {off}: data differs")));
            }
        }
        Cmd::Fill { off, len, seed } => side.mr.write(off, &pattern(seed, len))?,
        Cmd::SetWord { value } => side.mr.write(ATOMIC_WORD, &value.to_ne_bytes())?,
        Cmd::GetWord => {
            let mut b = [0u8; 8];
            side.mr.read(ATOMIC_WORD, &mut b)?;
            return Ok(Reply::Word(u64::from_ne_bytes(b)));
        }
        Cmd::UdPostRecv { size } => side.ud.post_recv(RecvWr {
            wr_id: 77,
            sg_list: vec![side.mr.sge(UD_AREA, 40 + size)],
        })?,
        Cmd::UdEcho { size, seed, src_qp } => {
            let Some(wc) = wait_one(&side.ud_cq, UD_TRY)? else {
                return Ok(Reply::Lost);
            };
            all_ok(&[wc])?;
            if wc.byte_len != 40 + size || wc.src_qp != src_qp || wc.wc_flags & wc_flags::GRH == 0 {
                return Ok(Reply::Bad(format!("UD receive: {wc:?}")));
            }
            let mut got = vec![0u8; size as usize];
            side.mr.read(UD_AREA + 40, &mut got)?;
            if got != pattern(seed, size as usize) {
                return Ok(Reply::Bad("UD data differs".into()));
            }
            ud_echo(side, peer, size)?;
        }
        Cmd::UdEchoAgain { size } => ud_echo(side, peer, size)?,
        Cmd::Done => {}
    }
    Ok(Reply::Ok)
}

/// How long one UD attempt waits for its datagram (UD may lose it).
const UD_TRY: Duration = Duration::from_millis(300);
/// UD attempts before the echo is reported as failed.
const UD_ATTEMPTS: u32 = 10;

/// The next completion of `cq`, or `None` after `timeout`.
fn wait_one(cq: &Cq, timeout: Duration) -> DynResult<Option<WorkCompletion>> {
    let deadline = Instant::now() + timeout;
    let mut buf = [WorkCompletion::new(0, WcStatus::Success, WcOpcode::Send, 0); 1];
    let backoff = crossbeam_utils::Backoff::new();
    loop {
        if cq.poll(&mut buf)? == 1 {
            return Ok(Some(buf[0]));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        backoff.snooze();
    }
}

/// The server's half of the UD echo: send the received bytes back.
fn ud_echo(side: &Side, peer: &Hello, size: u32) -> DynResult<()> {
    let ah = side.pd.create_ah(&AddressVector {
        dgid: peer.rc.gid,
        sgid_index: side.pd.context().default_gid_index(),
        is_global: true,
        hop_limit: 64,
        port_num: 1,
        ..AddressVector::default()
    })?;
    let mut wr = SendWr::new(78, SendOpcode::Send, vec![side.mr.sge(UD_AREA + 40, size)]);
    wr.ud = Some(ah.dest(peer.ud_qpn, QKEY));
    side.ud.post_send(wr)?;
    all_ok(&side.ud_cq.poll_wait(1, WAIT)?)?;
    Ok(())
}

struct Row {
    op: &'static str,
    size: usize,
    lat_us: f64,
    mbps: f64,
    ok: Result2,
}

type Result2 = std::result::Result<(), String>;

struct Client {
    side: Side,
    peer: Hello,
    w: TcpStream,
    r: BufReader<TcpStream>,
    iters: u32,
}

impl Client {
    fn ask(&mut self, cmd: Cmd) -> DynResult<Reply> {
        send_line(&mut self.w, &cmd)?;
        let reply: Reply = recv_line(&mut self.r)?;
        if let Reply::Bad(m) = &reply {
            return Err(format!("server: {m}").into());
        }
        Ok(reply)
    }

    /// Post `wrs` keeping at most `window` in flight, all signaled; returns
    /// the elapsed time.
    fn run_wrs(&self, wrs: Vec<SendWr>, window: usize) -> DynResult<Duration> {
        let n = wrs.len();
        let t0 = Instant::now();
        let mut posted = 0;
        let mut done = 0;
        let mut it = wrs.into_iter();
        while done < n {
            while posted < n && posted - done < window {
                self.side.rc.post_send(it.next().ok_or("short")?)?;
                posted += 1;
            }
            let wcs = self.side.cq.poll_wait(1, WAIT)?;
            all_ok(&wcs)?;
            done += wcs.len();
        }
        Ok(t0.elapsed())
    }

    /// Time one WR at a time (latency), then a window of them (bandwidth).
    fn measure(
        &mut self,
        op: &'static str,
        size: usize,
        make: &dyn Fn(u32) -> SendWr,
        prepare: &mut dyn FnMut(&mut Client, u32) -> DynResult<()>,
        verify: &mut dyn FnMut(&mut Client, u32) -> DynResult<()>,
    ) -> Row {
        let iters = self.iters;
        let mut body = || -> DynResult<(f64, f64)> {
            prepare(self, iters)?;
            let mut lat = Duration::ZERO;
            for i in 0..iters {
                lat += self.run_wrs(vec![make(i)], 1)?;
            }
            verify(self, iters)?;
            prepare(self, iters)?;
            let t = self.run_wrs((0..iters).map(make).collect(), 16)?;
            verify(self, iters)?;
            let lat_us = lat.as_secs_f64() * 1e6 / f64::from(iters);
            let mbps = (size as f64 * f64::from(iters)) / t.as_secs_f64() / 1e6;
            Ok((lat_us, mbps))
        };
        match body() {
            Ok((lat_us, mbps)) => Row {
                op,
                size,
                lat_us,
                mbps,
                ok: Ok(()),
            },
            Err(e) => Row {
                op,
                size,
                lat_us: 0.0,
                mbps: 0.0,
                ok: Err(e.to_string()),
            },
        }
    }
}

fn client(addr: &str, iters: u32, dev: Option<&str>) -> DynResult<Vec<Row>> {
    let side = Side::new(dev)?;
    let stream = connect_bounded(addr)?;
    stream.set_read_timeout(Some(WAIT * 3))?;
    let mut w = stream.try_clone()?;
    let mut r = BufReader::new(stream);
    send_line(&mut w, &side.hello(0x2000))?;
    let peer: Hello = recv_line(&mut r)?;
    side.connect(0x2000, &peer)?;
    let mut c = Client {
        side,
        peer,
        w,
        r,
        iters,
    };
    let mut rows = Vec::new();
    let (raddr, rkey) = (c.peer.mr_addr, c.peer.rkey);

    // SEND and SEND_WITH_IMM: the server checks every received message.
    for (op, size, imm) in [
        ("SEND", 65536usize, None),
        ("SEND_WITH_IMM", 4096, Some(0x1000u32)),
    ] {
        let seed = size as u64;
        for i in 0..iters {
            c.side.mr.write(
                i as usize * size % (2 << 20),
                &pattern(seed + u64::from(i), size),
            )?;
        }
        let sges: Vec<Sge> = (0..iters)
            .map(|i| c.side.mr.sge(i as usize * size % (2 << 20), size as u32))
            .collect();
        let make = |i: u32| {
            let mut wr = SendWr::new(
                u64::from(i),
                if imm.is_some() {
                    SendOpcode::SendWithImm
                } else {
                    SendOpcode::Send
                },
                vec![sges[i as usize]],
            );
            wr.imm_data = imm.map(|m| m + i).unwrap_or(0);
            wr
        };
        let row = c.measure(
            op,
            size,
            &make,
            &mut |c, n| {
                c.ask(Cmd::PostRecv {
                    n,
                    size: size as u32,
                })
                .map(|_| ())
            },
            &mut |c, n| {
                c.ask(Cmd::ExpectRecv {
                    n,
                    size: size as u32,
                    seed,
                    imm,
                })
                .map(|_| ())
            },
        );
        rows.push(row);
    }

    // RDMA WRITE of 1 MiB and WRITE_WITH_IMM of 64 KiB into the server's MR.
    for (op, size, imm) in [
        ("RDMA_WRITE", 1usize << 20, None),
        ("RDMA_WRITE_WITH_IMM", 65536, Some(0x2000u32)),
    ] {
        let seed = 0xAB00 + size as u64;
        c.side.mr.write(0, &pattern(seed, size))?;
        let sge = c.side.mr.sge(0, size as u32);
        let make = |i: u32| {
            let mut wr = SendWr::new(
                u64::from(i),
                if imm.is_some() {
                    SendOpcode::RdmaWriteWithImm
                } else {
                    SendOpcode::RdmaWrite
                },
                vec![sge],
            );
            wr.remote_addr = raddr + WRITE_AREA as u64;
            wr.rkey = rkey;
            wr.imm_data = imm.map(|m| m + i).unwrap_or(0);
            wr
        };
        let row = c.measure(
            op,
            size,
            &make,
            &mut |c, n| {
                if imm.is_some() {
                    c.ask(Cmd::PostRecv { n, size: 0 })?;
                }
                c.ask(Cmd::Fill {
                    off: WRITE_AREA,
                    len: size,
                    seed: 0,
                })
                .map(|_| ())
            },
            &mut |c, n| {
                if imm.is_some() {
                    c.ask(Cmd::ExpectRecv {
                        n,
                        size: size as u32,
                        seed,
                        imm,
                    })?;
                }
                c.ask(Cmd::Check {
                    off: WRITE_AREA,
                    len: size,
                    seed,
                })
                .map(|_| ())
            },
        );
        rows.push(row);
    }

    // RDMA READ of 1 MiB from the server's MR; the client checks.
    {
        let size = 1usize << 20;
        let seed = 0x5EAD;
        let sge = c.side.mr.sge(2 << 20, size as u32);
        let make = |i: u32| {
            let mut wr = SendWr::new(u64::from(i), SendOpcode::RdmaRead, vec![sge]);
            wr.remote_addr = raddr + READ_AREA as u64;
            wr.rkey = rkey;
            wr
        };
        let row = c.measure(
            "RDMA_READ",
            size,
            &make,
            &mut |c, _| {
                c.side.mr.write(2 << 20, &vec![0u8; size])?;
                c.ask(Cmd::Fill {
                    off: READ_AREA,
                    len: size,
                    seed,
                })
                .map(|_| ())
            },
            &mut |c, _| {
                let mut got = vec![0u8; size];
                c.side.mr.read(2 << 20, &mut got)?;
                if got != pattern(seed, size) {
                    return Err("READ data differs".into());
                }
                Ok(())
            },
        );
        rows.push(row);
    }

    // Atomics: the counter ends exact; every fetched value is distinct.
    for op in ["ATOMIC_FETCH_ADD", "ATOMIC_CMP_SWP"] {
        let faa = op == "ATOMIC_FETCH_ADD";
        let sges: Vec<Sge> = (0..iters)
            .map(|i| c.side.mr.sge(3 << 20 | (i as usize * 8), 8))
            .collect();
        let make = |i: u32| {
            let mut wr = SendWr::new(
                u64::from(i),
                if faa {
                    SendOpcode::AtomicFetchAndAdd
                } else {
                    SendOpcode::AtomicCmpAndSwp
                },
                vec![sges[i as usize]],
            );
            wr.remote_addr = raddr + ATOMIC_WORD as u64;
            wr.rkey = rkey;
            // FETCH_ADD adds 1; CMP_SWAP moves i → i + 1 (each succeeds
            // only in order, so a lost or repeated one shows).
            wr.compare_add = if faa { 1 } else { u64::from(i) };
            wr.swap = u64::from(i) + 1;
            wr
        };
        let row = c.measure(
            op,
            8,
            &make,
            &mut |c, _| c.ask(Cmd::SetWord { value: 0 }).map(|_| ()),
            &mut |c, n| {
                let Reply::Word(v) = c.ask(Cmd::GetWord)? else {
                    return Err("no word".into());
                };
                if v != u64::from(n) {
                    return Err(format!("counter {v}, expected {n}").into());
                }
                for i in 0..n {
                    let mut b = [0u8; 8];
                    c.side.mr.read(3 << 20 | (i as usize * 8), &mut b)?;
                    if u64::from_ne_bytes(b) != u64::from(i) {
                        return Err(format!("op {i} fetched {}", u64::from_ne_bytes(b)).into());
                    }
                }
                Ok(())
            },
        );
        rows.push(row);
    }

    // UD: one datagram to the server, which checks it and echoes it back.
    {
        let size = 1024usize;
        let seed = 0x0D;
        let t0 = Instant::now();
        let r = (|| -> DynResult<()> {
            c.side.mr.write(5 << 20 | 40, &pattern(seed, size))?;
            c.side.ud.post_recv(RecvWr {
                wr_id: 1,
                sg_list: vec![c.side.mr.sge(6 << 20, 40 + size as u32)],
            })?;
            let ah = c.side.pd.create_ah(&AddressVector {
                dgid: c.peer.rc.gid,
                sgid_index: c.side.pd.context().default_gid_index(),
                is_global: true,
                hop_limit: 64,
                port_num: 1,
                ..AddressVector::default()
            })?;
            c.ask(Cmd::UdPostRecv { size: size as u32 })?;
            let mut wr = SendWr::new(
                2,
                SendOpcode::Send,
                vec![c.side.mr.sge(5 << 20 | 40, size as u32)],
            );
            wr.ud = Some(ah.dest(c.peer.ud_qpn, QKEY));
            // UD may lose the datagram or its echo (ROXE_FAULT): both
            // are sent again, a bounded number of times.
            let (mut echoed, mut received) = (false, false);
            for _ in 0..UD_ATTEMPTS {
                if !echoed {
                    c.side.ud.post_send(wr.clone())?;
                    all_ok(&c.side.ud_cq.poll_wait(1, WAIT)?)?;
                    match c.ask(Cmd::UdEcho {
                        size: size as u32,
                        seed,
                        src_qp: c.side.ud.qp_num(),
                    })? {
                        Reply::Lost => continue,
                        _ => echoed = true,
                    }
                } else {
                    c.ask(Cmd::UdEchoAgain { size: size as u32 })?;
                }
                if let Some(wc) = wait_one(&c.side.ud_cq, UD_TRY)? {
                    all_ok(&[wc])?;
                    received = true;
                    break;
                }
            }
            if !received {
                return Err(format!("UD: no echo arrived in {UD_ATTEMPTS} attempts").into());
            }
            let mut got = vec![0u8; size];
            c.side.mr.read(6 << 20 | 40, &mut got)?;
            if got != pattern(seed, size) {
                return Err("UD echo differs".into());
            }
            Ok(())
        })();
        let t = t0.elapsed();
        rows.push(Row {
            op: "UD_SEND (echo)",
            size,
            lat_us: t.as_secs_f64() * 1e6 / 2.0,
            mbps: 0.0,
            ok: r.map_err(|e| e.to_string()),
        });
    }
    let _ = c.ask(Cmd::Done);
    Ok(rows)
}

fn connect_bounded(addr: &str) -> DynResult<TcpStream> {
    let deadline = Instant::now() + WAIT;
    loop {
        match TcpStream::connect(addr) {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(format!("connecting to {addr}: {e}").into()),
        }
    }
}

fn kill(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// `roxe demo`.
pub fn run(args: &Args) -> ExitCode {
    match args.role.as_deref() {
        Some("server") => match server(args.ib_dev.as_deref()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("roxe demo server: {e}");
                ExitCode::from(1)
            }
        },
        Some("client") => {
            let Some(addr) = args.server.as_deref() else {
                eprintln!("roxe demo client: --server missing");
                return ExitCode::from(2);
            };
            match client(addr, args.iters.max(1), args.ib_dev.as_deref()) {
                Ok(rows) => print_table(&rows),
                Err(e) => {
                    eprintln!("roxe demo client: {e}");
                    ExitCode::from(1)
                }
            }
        }
        Some(r) => {
            eprintln!("roxe demo: unknown role {r}");
            ExitCode::from(2)
        }
        None => parent(args),
    }
}

fn parent(args: &Args) -> ExitCode {
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("roxe demo: {e}");
            return ExitCode::from(1);
        }
    };
    let dev_args: Vec<String> = args
        .ib_dev
        .iter()
        .flat_map(|d| ["-d".to_string(), d.clone()])
        .collect();
    let mut server = Command::new(&exe);
    server
        .args(["demo", "--role", "server"])
        .args(&dev_args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    // The server's device sees every packet of the run, both directions:
    // it alone writes the capture (`--pcap`, else `ROXE_PCAP` as for any
    // roxe program); two writers would interleave one file.
    if let Some(p) = &args.pcap {
        server.env("ROXE_PCAP", p);
    }
    let mut server = match server.spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("roxe demo: starting the server: {e}");
            return ExitCode::from(1);
        }
    };
    let Some(out) = server.stdout.take() else {
        kill(&mut server);
        return ExitCode::from(1);
    };
    let mut line = String::new();
    let got = BufReader::new(out).read_line(&mut line);
    let port = match (got, line.trim().strip_prefix("listening ")) {
        (Ok(_), Some(p)) => p.to_string(),
        _ => {
            eprintln!("roxe demo: the server did not start");
            kill(&mut server);
            return ExitCode::from(1);
        }
    };
    println!("roxe demo: server and client as two processes on loopback (control port {port})");
    let client = Command::new(&exe)
        .args([
            "demo",
            "--role",
            "client",
            "--server",
            &format!("127.0.0.1:{port}"),
            "-n",
            &args.iters.to_string(),
        ])
        .args(&dev_args)
        .env_remove("ROXE_PCAP")
        .status();
    // The server exits after the client's Done; bound the wait anyway.
    let deadline = Instant::now() + WAIT;
    let server_ok = loop {
        match server.try_wait() {
            Ok(Some(s)) => break s.success(),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            _ => {
                kill(&mut server);
                break false;
            }
        }
    };
    match client {
        Ok(s) if s.success() && server_ok => ExitCode::SUCCESS,
        Ok(_) => ExitCode::from(1),
        Err(e) => {
            eprintln!("roxe demo: starting the client: {e}");
            ExitCode::from(1)
        }
    }
}

fn print_table(rows: &[Row]) -> ExitCode {
    println!(
        "{:<20} {:>9} {:>12} {:>14}  ok",
        "operation", "size", "latency µs", "bandwidth MB/s"
    );
    let mut all = true;
    for r in rows {
        let size = if r.size >= 1 << 20 {
            format!("{} MiB", r.size >> 20)
        } else if r.size >= 1024 {
            format!("{} KiB", r.size >> 10)
        } else {
            format!("{} B", r.size)
        };
        let bw = if r.mbps > 0.0 {
            format!("{:.0}", r.mbps)
        } else {
            "-".into()
        };
        let ok = match &r.ok {
            Ok(()) => "ok".to_string(),
            Err(e) => {
                all = false;
                format!("FAILED: {e}")
            }
        };
        println!(
            "{:<20} {:>9} {:>12.1} {:>14}  {}",
            r.op, size, r.lat_us, bw, ok
        );
    }
    if all {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
