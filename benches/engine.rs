//! Engine throughput: two sans-IO `Engine`s joined in memory (no sockets, no
//! loss, a virtual clock) over an RC QP pair at path MTU 4096.
//!
//! - `engine/rc_write_64KiB`: RDMA WRITEs of 64 KiB, 16 WRs kept in flight,
//!   in bytes per second: the engine's own ceiling (segmentation, headers,
//!   ICRC out and in, parse, placement, ACKs, completions).
//! - `engine/rc_send_64B`: SENDs of 64 B into pre-posted receives, 16 in
//!   flight, in messages per second.
//!
//! One criterion iteration is one message completed in the steady state:
//! the window stays full across iterations and samples. Before and after
//! measuring, each case checks that the data arrived byte-exact; every
//! completion is checked for `Success`; no retransmission or drop may occur.
//!
//! Run: `cargo bench --bench engine` (figures go to docs/PERFORMANCE.md).

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use roxe_provider::engine::{CqId, Engine, EngineConfig, Nanos, QpCap};
use roxe_provider::memory::{MrInfo, Sge};
use roxe_provider::qp_attr::{Mtu, QpType};
use roxe_provider::testing::{self, pattern, Connection, Endpoint};
use roxe_provider::types::{AccessFlags, WcOpcode, WcStatus};
use roxe_provider::wr::{RecvWr, SendOpcode, SendWr, WorkCompletion};
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

/// WRs kept posted on the send queue.
const WINDOW: u64 = 16;
/// Receives kept posted (SEND case); a multiple of `WINDOW`.
const RECV_DEPTH: u64 = 64;
/// The WRITE message size.
const WRITE_LEN: usize = 64 * 1024;
/// The SEND message size.
const SEND_LEN: usize = 64;
/// Each side's registered region: `WINDOW` slots of `WRITE_LEN`.
const MR_LEN: usize = WINDOW as usize * WRITE_LEN;
/// Virtual time per pump round (the clock only has to move forward).
const ROUND_NS: Nanos = 1_000;

const ADDR_A: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1)); // testnet: allow (the simulated network)
const ADDR_B: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)); // testnet: allow (the simulated network)

/// One end of the connection.
struct End {
    eng: Engine,
    cq: CqId,
    mr: MrInfo,
    qpn: u32,
}

impl End {
    fn new(addr: IpAddr) -> End {
        let mut eng = Engine::new(EngineConfig::new(addr));
        let cap = QpCap {
            max_send_wr: 256,
            max_recv_wr: 256,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        let ep = Endpoint::create(&mut eng, QpType::Rc, 4096, MR_LEN, access, cap).unwrap();
        End {
            eng,
            cq: ep.cq,
            mr: ep.mr,
            qpn: ep.qpn,
        }
    }

    /// `n` more RC QPs in RTS that never carry traffic (facing made-up
    /// peer QPs): what a busy server's idle connections cost the one
    /// that works.
    fn add_idle_qps(&mut self, n: usize, peer: IpAddr) {
        let (_, init) = self.eng.query_qp(self.qpn).unwrap();
        let working = self.qpn;
        for i in 0..n {
            self.qpn = self.eng.create_qp(init).unwrap();
            self.connect(0x10_0000 + i as u32, peer);
        }
        self.qpn = working;
    }

    fn sge(&self, offset: usize, len: usize) -> Sge {
        Sge {
            addr: self.mr.addr + offset as u64,
            length: len as u32,
            lkey: self.mr.lkey,
        }
    }

    /// RESET → INIT → RTR → RTS facing `peer` (as ibv_rc_pingpong does),
    /// with a timeout (~67 ms) never reached on a lossless wire.
    fn connect(&mut self, peer_qpn: u32, peer: IpAddr) {
        let c = Connection {
            access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
            ..Connection::rc(Mtu::Mtu4096)
        };
        testing::connect(&mut self.eng, self.qpn, peer_qpn, peer, &c).unwrap();
    }

    fn fill(&mut self, seed: u64) {
        let data = pattern(seed, MR_LEN);
        self.eng
            .memory_mut()
            .owned_write(self.mr.lkey, 0, &data)
            .unwrap();
    }

    fn read(&self, offset: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.eng
            .memory()
            .owned_read(self.mr.lkey, offset, &mut v)
            .unwrap();
        v
    }
}

/// Which traffic a rig pushes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Write,
    Send,
}

/// Two engines, `a` → `b`, and the in-memory wire between them.
struct Rig {
    kind: Kind,
    a: End,
    b: End,
    now: Nanos,
    buf: Vec<u8>,
    wcs: Vec<WorkCompletion>,
    /// Send WRs posted / completed at `a`.
    posted: u64,
    completed: u64,
    /// Receives posted / completed at `b` (SEND only).
    recv_posted: u64,
    received: u64,
}

impl Rig {
    fn new(kind: Kind) -> Rig {
        Rig::with_idle_qps(kind, 0)
    }

    fn with_idle_qps(kind: Kind, idle: usize) -> Rig {
        let mut a = End::new(ADDR_A);
        let mut b = End::new(ADDR_B);
        a.add_idle_qps(idle, ADDR_B);
        b.add_idle_qps(idle, ADDR_A);
        a.connect(b.qpn, ADDR_B);
        b.connect(a.qpn, ADDR_A);
        let mut rig = Rig {
            kind,
            a,
            b,
            now: 0,
            buf: vec![0u8; 9000],
            wcs: vec![WorkCompletion::new(0, WcStatus::Success, WcOpcode::Send, 0); 64],
            posted: 0,
            completed: 0,
            recv_posted: 0,
            received: 0,
        };
        if kind == Kind::Send {
            for _ in 0..RECV_DEPTH {
                rig.post_recv();
            }
        }
        rig
    }

    /// Receive `j` goes to slot `j % RECV_DEPTH` of `b`.
    fn post_recv(&mut self) {
        let j = self.recv_posted;
        let sge = self.b.sge((j % RECV_DEPTH) as usize * SEND_LEN, SEND_LEN);
        self.b
            .eng
            .post_recv(
                self.b.qpn,
                RecvWr {
                    wr_id: j,
                    sg_list: vec![sge],
                },
            )
            .unwrap();
        self.recv_posted += 1;
    }

    /// Send WR `i` reads slot `i % WINDOW` of `a` (WRITE: into the same
    /// slot of `b`).
    fn post_send(&mut self) {
        let i = self.posted;
        let slot = (i % WINDOW) as usize;
        let wr = match self.kind {
            Kind::Write => {
                let mut wr = SendWr::new(
                    i,
                    SendOpcode::RdmaWrite,
                    vec![self.a.sge(slot * WRITE_LEN, WRITE_LEN)],
                );
                wr.remote_addr = self.b.mr.addr + (slot * WRITE_LEN) as u64;
                wr.rkey = self.b.mr.rkey;
                wr
            }
            Kind::Send => SendWr::new(
                i,
                SendOpcode::Send,
                vec![self.a.sge(slot * SEND_LEN, SEND_LEN)],
            ),
        };
        self.a.eng.post_send(self.a.qpn, wr).unwrap();
        self.posted += 1;
    }

    /// One round on the wire: every packet `a` has goes to `b`, then every
    /// packet `b` has (ACKs) goes to `a`. Returns the packets moved.
    fn pump(&mut self) -> usize {
        self.now += ROUND_NS;
        let now = self.now;
        let mut moved = 0;
        for a_to_b in [true, false] {
            let (tx, rx) = if a_to_b {
                (&mut self.a.eng, &mut self.b.eng)
            } else {
                (&mut self.b.eng, &mut self.a.eng)
            };
            let src = tx.addr();
            while let Some(t) = tx.poll_transmit(now, &mut self.buf) {
                rx.handle_packet(now, src, t.src_port, &self.buf[..t.len]);
                moved += 1;
            }
        }
        for e in [&mut self.a.eng, &mut self.b.eng] {
            if e.poll_timeout().is_some_and(|d| d <= now) {
                e.handle_timeout(now);
            }
        }
        moved
    }

    /// Reap completions at both ends, checking each; returns how many.
    fn reap(&mut self) -> usize {
        let want = match self.kind {
            Kind::Write => WcOpcode::RdmaWrite,
            Kind::Send => WcOpcode::Send,
        };
        let mut reaped = 0;
        loop {
            let n = self.a.eng.poll_cq(self.a.cq, &mut self.wcs).unwrap();
            for wc in &self.wcs[..n] {
                assert_eq!(wc.status, WcStatus::Success, "send completion {wc:?}");
                assert_eq!(wc.opcode, want);
                assert_eq!(wc.wr_id, self.completed, "completions out of order");
                self.completed += 1;
            }
            reaped += n;
            if n < self.wcs.len() {
                break;
            }
        }
        if self.kind == Kind::Send {
            loop {
                let n = self.b.eng.poll_cq(self.b.cq, &mut self.wcs).unwrap();
                for k in 0..n {
                    let wc = self.wcs[k];
                    assert_eq!(wc.status, WcStatus::Success, "receive completion {wc:?}");
                    assert_eq!(wc.opcode, WcOpcode::Recv);
                    assert_eq!(wc.byte_len as usize, SEND_LEN);
                    assert_eq!(wc.wr_id, self.received, "receives out of order");
                    self.received += 1;
                    self.post_recv();
                }
                reaped += n;
                if n < self.wcs.len() {
                    break;
                }
            }
        }
        reaped
    }

    /// The count one iteration is: WRITE completions at `a`, receive
    /// completions at `b`.
    fn done(&self) -> u64 {
        match self.kind {
            Kind::Write => self.completed,
            Kind::Send => self.received,
        }
    }

    /// Run until `n` more messages are done, keeping `WINDOW` WRs posted
    /// (unless `drain`, in which case nothing new is posted once the target
    /// is covered, and the run ends with the send queue empty).
    fn run(&mut self, n: u64, drain: bool) {
        let target = self.done() + n;
        loop {
            while self.posted - self.completed < WINDOW && (!drain || self.posted < target) {
                self.post_send();
            }
            let moved = self.pump();
            let reaped = self.reap();
            if self.done() >= target && (!drain || self.completed == self.posted) {
                return;
            }
            assert!(
                moved > 0 || reaped > 0,
                "stalled at {} of {target} (stats a {:?}, b {:?})",
                self.done(),
                self.a.eng.stats(),
                self.b.eng.stats()
            );
        }
    }

    /// Fill `a` with fresh data, move enough messages to overwrite every
    /// destination slot, drain, and compare byte for byte; then check that
    /// the wire stayed clean.
    fn verify(&mut self, seed: u64) {
        self.a.fill(seed);
        match self.kind {
            Kind::Write => {
                self.run(0, true); // settle what the window still holds
                self.run(WINDOW, true);
                assert_eq!(
                    self.b.read(0, MR_LEN),
                    self.a.read(0, MR_LEN),
                    "WRITE data did not arrive byte-exact"
                );
            }
            Kind::Send => {
                self.run(0, true);
                self.run(RECV_DEPTH, true);
                // Message k went from slot k % WINDOW of `a` into receive k,
                // slot k % RECV_DEPTH of `b`: the last RECV_DEPTH messages
                // cover every receive slot.
                for k in self.received - RECV_DEPTH..self.received {
                    let got = self.b.read((k % RECV_DEPTH) as usize * SEND_LEN, SEND_LEN);
                    let sent = self.a.read((k % WINDOW) as usize * SEND_LEN, SEND_LEN);
                    assert_eq!(got, sent, "SEND {k} did not arrive byte-exact");
                }
            }
        }
        for (name, e) in [("a", &self.a.eng), ("b", &self.b.eng)] {
            let s = e.stats();
            assert_eq!(
                (
                    s.tx_retransmits,
                    s.timeouts,
                    s.naks_sent,
                    s.rx_dropped,
                    s.rx_bad_icrc,
                    s.rx_malformed
                ),
                (0, 0, 0, 0, 0, 0),
                "engine {name} saw trouble: {s:?}"
            );
        }
    }
}

fn bench_engine(c: &mut Criterion) {
    let mut g = c.benchmark_group("engine");
    g.sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5));

    let mut w = Rig::new(Kind::Write);
    w.verify(1);
    g.throughput(Throughput::Bytes(WRITE_LEN as u64));
    g.bench_function("rc_write_64KiB", |bch| {
        bch.iter_custom(|iters| {
            let t = Instant::now();
            w.run(iters, false);
            t.elapsed()
        })
    });
    w.verify(2);

    let mut s = Rig::new(Kind::Send);
    s.verify(3);
    g.throughput(Throughput::Elements(1));
    g.bench_function("rc_send_64B", |bch| {
        bch.iter_custom(|iters| {
            let t = Instant::now();
            s.run(iters, false);
            t.elapsed()
        })
    });
    s.verify(4);

    let mut s = Rig::with_idle_qps(Kind::Send, 1000);
    s.verify(5);
    g.bench_function("rc_send_64B_beside_1000_idle_qps", |bch| {
        bch.iter_custom(|iters| {
            let t = Instant::now();
            s.run(iters, false);
            t.elapsed()
        })
    });
    s.verify(6);

    g.finish();
}

criterion_group!(benches, bench_engine);
criterion_main!(benches);
