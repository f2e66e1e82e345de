//! The engine on a simulated network: a virtual clock and seeded loss,
//! reordering, duplication, delay and corruption between engines.
//!
//! `ROXE_SIM_SEED=N` replays a run (the seed is printed on failure);
//! `ROXE_SIM_MESSAGES=N` sets the soak's message count.
//! Run alone: `cargo test -p roxe-provider --test simnet`.

use roxe_provider::engine::{CqId, Engine, EngineConfig, Nanos, QpCap, QpInitAttr};
use roxe_provider::memory::{MrInfo, Sge};
use roxe_provider::qp_attr::{AddressVector, AttrMask, Mtu, QpAttr, QpState, QpType};
use roxe_provider::types::{AccessFlags, PdId, WcOpcode, WcStatus};
use roxe_provider::wr::{wc_flags, RecvWr, SendOpcode, SendWr, UdDest, WorkCompletion};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::net::{IpAddr, Ipv4Addr};

/// SplitMix64: a small, seeded, reproducible generator.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
    fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p && p > 0.0
    }
}

#[derive(Clone, Copy, Default)]
struct Faults {
    loss: f64,
    dup: f64,
    reorder: f64,
    corrupt: f64,
}

struct Packet {
    to: usize,
    from: IpAddr,
    src_port: u16,
    bytes: Vec<u8>,
}

/// Engines joined by a lossy wire with a fixed 2 µs latency.
struct Net {
    engines: Vec<Engine>,
    now: Nanos,
    rng: Rng,
    faults: Faults,
    queue: BinaryHeap<Reverse<(Nanos, u64, usize)>>,
    slots: Vec<Option<Packet>>,
    seq: u64,
    /// Packets put on the wire, for statistics.
    sent: u64,
    corrupted: u64,
}

const LATENCY: Nanos = 2_000;

impl Net {
    fn new(n: usize, seed: u64, faults: Faults) -> Net {
        let engines = (0..n)
            .map(|i| {
                Engine::new(EngineConfig::new(IpAddr::V4(Ipv4Addr::new(
                    127,
                    0,
                    0,
                    i as u8 + 1,
                ))))
            })
            .collect();
        Net {
            engines,
            now: 0,
            rng: Rng(seed),
            faults,
            queue: BinaryHeap::new(),
            slots: Vec::new(),
            seq: 0,
            sent: 0,
            corrupted: 0,
        }
    }

    fn index_of(&self, addr: IpAddr) -> Option<usize> {
        self.engines.iter().position(|e| e.addr() == addr)
    }

    fn schedule(&mut self, at: Nanos, p: Packet) {
        self.seq += 1;
        self.slots.push(Some(p));
        self.queue
            .push(Reverse((at, self.seq, self.slots.len() - 1)));
    }

    /// Move every packet the engines want to send onto the wire.
    fn pump(&mut self) {
        let mut buf = vec![0u8; 9000];
        for i in 0..self.engines.len() {
            let from = self.engines[i].addr();
            while let Some(t) = self.engines[i].poll_transmit(self.now, &mut buf) {
                self.sent += 1;
                let Some(to) = self.index_of(t.dst) else {
                    continue;
                };
                let f = self.faults;
                let lost = self.rng.chance(f.loss);
                if std::env::var_os("ROXE_SIM_TRACE").is_some() {
                    let p = roxe_provider::wire::Packet::new_checked(&buf[..t.len]).unwrap();
                    let aeth = p.aeth().map(|a| a.syndrome.to_string()).unwrap_or_default();
                    eprintln!(
                        "{:>10} {i}->{to} {} psn={} {aeth}{}",
                        self.now,
                        p.opcode(),
                        p.bth().psn(),
                        if lost { " LOST" } else { "" }
                    );
                }
                if lost {
                    continue;
                }
                let mut bytes = buf[..t.len].to_vec();
                if self.rng.chance(f.corrupt) {
                    let i = self.rng.below(bytes.len() as u64) as usize;
                    bytes[i] ^= 1 << self.rng.below(8);
                    self.corrupted += 1;
                }
                let delay = if self.rng.chance(f.reorder) {
                    LATENCY + self.rng.below(50_000)
                } else {
                    LATENCY
                };
                if self.rng.chance(f.dup) {
                    let extra = self.rng.below(20_000);
                    let copy = Packet {
                        to,
                        from,
                        src_port: t.src_port,
                        bytes: bytes.clone(),
                    };
                    self.schedule(self.now + delay + extra, copy);
                }
                self.schedule(
                    self.now + delay,
                    Packet {
                        to,
                        from,
                        src_port: t.src_port,
                        bytes,
                    },
                );
            }
        }
    }

    /// Advance to the next event (delivery or timer) and process it.
    /// Returns false when nothing at all is pending.
    fn step(&mut self) -> bool {
        self.pump();
        let next_packet = self.queue.peek().map(|Reverse((t, _, _))| *t);
        let next_timer = self.engines.iter().filter_map(|e| e.poll_timeout()).min();
        let Some(t) = [next_packet, next_timer].into_iter().flatten().min() else {
            return false;
        };
        self.now = self.now.max(t);
        while let Some(Reverse((at, _, slot))) = self.queue.peek().copied() {
            if at > self.now {
                break;
            }
            self.queue.pop();
            if let Some(p) = self.slots[slot].take() {
                self.engines[p.to].handle_packet(self.now, p.from, p.src_port, &p.bytes);
            }
        }
        if self.queue.is_empty() {
            self.slots.clear();
        }
        let now = self.now;
        for e in &mut self.engines {
            if e.poll_timeout().is_some_and(|d| d <= now) {
                e.handle_timeout(now);
            }
        }
        true
    }

    /// Step until `done` holds; panics after `max_steps`.
    fn run_until(&mut self, max_steps: u64, mut done: impl FnMut(&mut Net) -> bool) {
        for _ in 0..max_steps {
            if done(self) {
                return;
            }
            if !self.step() && done(self) {
                return;
            }
        }
        assert!(
            done(self),
            "simulation did not finish within {max_steps} steps (virtual time {} ns)",
            self.now
        );
    }
}

/// One side of a connection: engine index, PD, CQ, a big MR, QPN.
#[derive(Clone, Copy)]
struct Side {
    e: usize,
    pd: PdId,
    cq: CqId,
    mr: MrInfo,
    qpn: u32,
}

const MR_LEN: usize = 1 << 20;

fn access_all() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC
}

fn setup_side(net: &mut Net, e: usize, qp_type: QpType, cq_depth: u32) -> Side {
    let eng = &mut net.engines[e];
    let pd = eng.alloc_pd();
    let cq = eng.create_cq(cq_depth).unwrap();
    let mr = eng
        .memory_mut()
        .register_owned(pd, MR_LEN, access_all())
        .unwrap();
    let cap = QpCap {
        max_send_wr: 4096,
        max_recv_wr: 4096,
        max_send_sge: 4,
        max_recv_sge: 4,
        max_inline_data: 256,
    };
    let qpn = eng
        .create_qp(QpInitAttr {
            qp_type,
            pd,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            cap,
            sq_sig_all: false,
        })
        .unwrap();
    Side { e, pd, cq, mr, qpn }
}

/// Bring a QP to RTS facing `peer`, as ibv_rc_pingpong does.
#[allow(clippy::too_many_arguments)]
fn connect(
    net: &mut Net,
    s: Side,
    peer: Side,
    qp_type: QpType,
    mtu: Mtu,
    timeout: u8,
    retry: u8,
    rnr_retry: u8,
) {
    let peer_addr = net.engines[peer.e].addr();
    let eng = &mut net.engines[s.e];
    let mut a = QpAttr {
        qp_state: QpState::Init,
        pkey_index: 0,
        port_num: 1,
        qp_access_flags: access_all(),
        qkey: 0x1111,
        ..QpAttr::default()
    };
    let init_mask = match qp_type {
        QpType::Ud => AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::QKEY,
        QpType::Uc => {
            AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS
        }
        QpType::Rc => {
            AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS
        }
    };
    if qp_type == QpType::Uc {
        a.qp_access_flags = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    }
    eng.modify_qp(s.qpn, &a, init_mask).unwrap();
    a.qp_state = QpState::Rtr;
    a.path_mtu = mtu;
    a.dest_qp_num = peer.qpn;
    a.rq_psn = 0xFF_FFF0; // exercise the 24-bit wrap
    a.max_dest_rd_atomic = 16;
    a.min_rnr_timer = 1;
    let gid = match peer_addr {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    };
    a.av = AddressVector {
        dgid: gid,
        is_global: true,
        hop_limit: 64,
        port_num: 1,
        ..AddressVector::default()
    };
    let rtr_mask = match qp_type {
        QpType::Ud => AttrMask::STATE,
        QpType::Uc => {
            AttrMask::STATE
                | AttrMask::AV
                | AttrMask::PATH_MTU
                | AttrMask::DEST_QPN
                | AttrMask::RQ_PSN
        }
        QpType::Rc => {
            AttrMask::STATE
                | AttrMask::AV
                | AttrMask::PATH_MTU
                | AttrMask::DEST_QPN
                | AttrMask::RQ_PSN
                | AttrMask::MAX_DEST_RD_ATOMIC
                | AttrMask::MIN_RNR_TIMER
        }
    };
    eng.modify_qp(s.qpn, &a, rtr_mask).unwrap();
    a.qp_state = QpState::Rts;
    a.sq_psn = 0xFF_FFF0;
    a.timeout = timeout;
    a.retry_cnt = retry;
    a.rnr_retry = rnr_retry;
    a.max_rd_atomic = 16;
    let rts_mask = match qp_type {
        QpType::Rc => {
            AttrMask::STATE
                | AttrMask::SQ_PSN
                | AttrMask::TIMEOUT
                | AttrMask::RETRY_CNT
                | AttrMask::RNR_RETRY
                | AttrMask::MAX_QP_RD_ATOMIC
        }
        _ => AttrMask::STATE | AttrMask::SQ_PSN,
    };
    eng.modify_qp(s.qpn, &a, rts_mask).unwrap();
    // UD needs the path MTU for its size limit; it is the device's (4096).
}

fn pair(net: &mut Net, qp_type: QpType, mtu: Mtu) -> (Side, Side) {
    let a = setup_side(net, 0, qp_type, 65536);
    let b = setup_side(net, 1, qp_type, 65536);
    // timeout 8 = ~1 ms, retry 7, rnr_retry 7 (infinite).
    connect(net, a, b, qp_type, mtu, 8, 7, 7);
    connect(net, b, a, qp_type, mtu, 8, 7, 7);
    (a, b)
}

fn sge(s: Side, offset: u64, len: u32) -> Sge {
    Sge {
        addr: s.mr.addr + offset,
        length: len,
        lkey: s.mr.lkey,
    }
}

fn fill(net: &mut Net, s: Side, offset: usize, data: &[u8]) {
    net.engines[s.e]
        .memory_mut()
        .owned_write(s.mr.lkey, offset, data)
        .unwrap();
}

fn read(net: &Net, s: Side, offset: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    net.engines[s.e]
        .memory()
        .owned_read(s.mr.lkey, offset, &mut v)
        .unwrap();
    v
}

fn poll(net: &mut Net, s: Side) -> Vec<WorkCompletion> {
    let mut out = [WorkCompletion::new(0, WcStatus::Success, WcOpcode::Send, 0); 64];
    let mut all = Vec::new();
    loop {
        let n = net.engines[s.e].poll_cq(s.cq, &mut out).unwrap();
        all.extend_from_slice(&out[..n]);
        if n < out.len() {
            return all;
        }
    }
}

/// Run until `s` has `n` completions; return them.
fn wait_wcs(net: &mut Net, s: Side, n: usize) -> Vec<WorkCompletion> {
    let mut got = Vec::new();
    net.run_until(5_000_000, |net| {
        got.extend(poll(net, s));
        got.len() >= n
    });
    got
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut r = Rng(seed);
    (0..len).map(|_| r.next() as u8).collect()
}

fn seed() -> u64 {
    let s = std::env::var("ROXE_SIM_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x5EED);
    eprintln!("simnet seed {s} (replay with ROXE_SIM_SEED={s})");
    s
}

const MTUS: [Mtu; 5] = [
    Mtu::Mtu256,
    Mtu::Mtu512,
    Mtu::Mtu1024,
    Mtu::Mtu2048,
    Mtu::Mtu4096,
];

#[test]
fn rc_send_every_mtu_and_size() {
    for mtu in MTUS {
        let m = mtu.bytes();
        let mut net = Net::new(2, 1, Faults::default());
        let (a, b) = pair(&mut net, QpType::Rc, mtu);
        for (k, &len) in [0usize, 1, 3, m - 1, m, m + 1, 3 * m + 5, 16 * m]
            .iter()
            .enumerate()
        {
            let data = pattern(k as u64, len);
            fill(&mut net, a, 0, &data);
            net.engines[b.e]
                .post_recv(
                    b.qpn,
                    RecvWr {
                        wr_id: 100 + k as u64,
                        sg_list: vec![sge(b, 4096, 65536)],
                    },
                )
                .unwrap();
            let imm = k % 2 == 1;
            let mut wr = SendWr::new(
                k as u64,
                if imm {
                    SendOpcode::SendWithImm
                } else {
                    SendOpcode::Send
                },
                vec![sge(a, 0, len as u32)],
            );
            wr.imm_data = 0xA0B0_C000 + k as u32;
            net.engines[a.e].post_send(a.qpn, wr).unwrap();
            let rx = wait_wcs(&mut net, b, 1);
            assert_eq!(rx.len(), 1);
            let w = rx[0];
            assert_eq!(
                (w.status, w.opcode, w.byte_len, w.wr_id),
                (
                    WcStatus::Success,
                    WcOpcode::Recv,
                    len as u32,
                    100 + k as u64
                ),
                "mtu {m} len {len}"
            );
            assert_eq!(w.wc_flags & wc_flags::WITH_IMM != 0, imm);
            if imm {
                assert_eq!(w.imm_data, 0xA0B0_C000 + k as u32);
            }
            assert_eq!(read(&net, b, 4096, len), data, "mtu {m} len {len}");
            let tx = wait_wcs(&mut net, a, 1);
            assert_eq!(
                (tx[0].status, tx[0].opcode, tx[0].wr_id),
                (WcStatus::Success, WcOpcode::Send, k as u64)
            );
        }
    }
}

#[test]
fn rc_write_read_atomics_every_mtu() {
    for mtu in MTUS {
        let m = mtu.bytes();
        let mut net = Net::new(2, 2, Faults::default());
        let (a, b) = pair(&mut net, QpType::Rc, mtu);
        for (k, &len) in [1usize, m, m + 7, 5 * m].iter().enumerate() {
            // WRITE a -> b.
            let data = pattern(10 + k as u64, len);
            fill(&mut net, a, 0, &data);
            let mut wr = SendWr::new(1, SendOpcode::RdmaWrite, vec![sge(a, 0, len as u32)]);
            wr.remote_addr = b.mr.addr + 8192;
            wr.rkey = b.mr.rkey;
            net.engines[a.e].post_send(a.qpn, wr).unwrap();
            let tx = wait_wcs(&mut net, a, 1);
            assert_eq!(
                (tx[0].status, tx[0].opcode),
                (WcStatus::Success, WcOpcode::RdmaWrite)
            );
            assert_eq!(read(&net, b, 8192, len), data, "write mtu {m} len {len}");
            // READ it back into a at another place.
            let mut wr = SendWr::new(2, SendOpcode::RdmaRead, vec![sge(a, 200_000, len as u32)]);
            wr.remote_addr = b.mr.addr + 8192;
            wr.rkey = b.mr.rkey;
            net.engines[a.e].post_send(a.qpn, wr).unwrap();
            let tx = wait_wcs(&mut net, a, 1);
            assert_eq!(
                (tx[0].status, tx[0].opcode, tx[0].byte_len),
                (WcStatus::Success, WcOpcode::RdmaRead, len as u32)
            );
            assert_eq!(read(&net, a, 200_000, len), data, "read mtu {m} len {len}");
        }
        // WRITE_WITH_IMM consumes a receive and reports the immediate.
        net.engines[b.e]
            .post_recv(
                b.qpn,
                RecvWr {
                    wr_id: 77,
                    sg_list: vec![],
                },
            )
            .unwrap();
        let mut wr = SendWr::new(3, SendOpcode::RdmaWriteWithImm, vec![sge(a, 0, 100)]);
        wr.remote_addr = b.mr.addr;
        wr.rkey = b.mr.rkey;
        wr.imm_data = 0x1234_5678;
        net.engines[a.e].post_send(a.qpn, wr).unwrap();
        let rx = wait_wcs(&mut net, b, 1);
        assert_eq!(
            (
                rx[0].opcode,
                rx[0].imm_data,
                rx[0].byte_len,
                rx[0].wc_flags & wc_flags::WITH_IMM
            ),
            (
                WcOpcode::RecvRdmaWithImm,
                0x1234_5678,
                100,
                wc_flags::WITH_IMM
            )
        );
        // Atomics on an 8-byte counter at b.
        fill(&mut net, b, 512, &5u64.to_ne_bytes());
        let mut wr = SendWr::new(4, SendOpcode::AtomicFetchAndAdd, vec![sge(a, 600_000, 8)]);
        wr.remote_addr = b.mr.addr + 512;
        wr.rkey = b.mr.rkey;
        wr.compare_add = 10;
        net.engines[a.e].post_send(a.qpn, wr).unwrap();
        let mut wr = SendWr::new(5, SendOpcode::AtomicCmpAndSwp, vec![sge(a, 600_008, 8)]);
        wr.remote_addr = b.mr.addr + 512;
        wr.rkey = b.mr.rkey;
        wr.compare_add = 15;
        wr.swap = 99;
        net.engines[a.e].post_send(a.qpn, wr).unwrap();
        let tx = wait_wcs(&mut net, a, 3);
        let ops: Vec<_> = tx.iter().map(|w| (w.wr_id, w.status, w.opcode)).collect();
        assert_eq!(
            ops[1..],
            [
                (4, WcStatus::Success, WcOpcode::FetchAdd),
                (5, WcStatus::Success, WcOpcode::CompSwap)
            ]
        );
        assert_eq!(read(&net, a, 600_000, 8), 5u64.to_ne_bytes());
        assert_eq!(read(&net, a, 600_008, 8), 15u64.to_ne_bytes());
        assert_eq!(read(&net, b, 512, 8), 99u64.to_ne_bytes());
    }
}

/// 100,000 random operations (SEND, SEND_WITH_IMM, WRITE, READ, FETCH_ADD)
/// of random sizes under 10% loss, 10% reordering, 5% duplication and 1%
/// corruption: every message arrives exactly once, in order, byte-exact,
/// and the atomic counter ends exact.
#[test]
fn soak_random_operations_under_faults() {
    let seed = seed();
    let messages: u64 = std::env::var("ROXE_SIM_MESSAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let faults = Faults {
        loss: 0.10,
        reorder: 0.10,
        dup: 0.05,
        corrupt: 0.01,
    };
    let mut net = Net::new(2, seed, faults);
    let mut rng = Rng(seed ^ 0xABCD);
    let (a, b) = pair(&mut net, QpType::Rc, Mtu::Mtu1024);
    const WINDOW: u64 = 32;
    const SLOT: u64 = 16 * 1024;
    const READ_SRC: u64 = 600 * 1024;
    const COUNTER: u64 = 900 * 1024;
    let read_src = pattern(seed ^ 7, 64 * 1024);
    fill(&mut net, b, READ_SRC as usize, &read_src);
    fill(&mut net, b, COUNTER as usize, &0u64.to_ne_bytes());

    #[derive(Clone, Copy, PartialEq, Debug)]
    enum Op {
        Send,
        SendImm,
        Write,
        Read,
        Faa,
    }
    // What each posted WR must produce, in posting order.
    let mut posted: std::collections::VecDeque<(u64, Op, usize, u64)> = Default::default();
    let mut recvs: std::collections::VecDeque<(u64, usize)> = Default::default();
    let (mut next, mut done, mut received, mut faa_count) = (0u64, 0u64, 0u64, 0u64);
    let mut faa_seen = std::collections::HashSet::new();
    let mut steps = 0u64;
    while done < messages {
        while next < messages && next - done < WINDOW {
            let slot = (next % WINDOW) * SLOT;
            let op = match rng.below(5) {
                0 => Op::Send,
                1 => Op::SendImm,
                2 => Op::Write,
                3 => Op::Read,
                _ => Op::Faa,
            };
            let len = match rng.below(4) {
                0 => rng.below(64),
                1 => rng.below(1025),
                _ => rng.below(12 * 1024),
            } as usize;
            let mut wr;
            let mut aux = 0;
            match op {
                Op::Send | Op::SendImm => {
                    let data = pattern(next, len);
                    fill(&mut net, a, slot as usize, &data);
                    net.engines[b.e]
                        .post_recv(
                            b.qpn,
                            RecvWr {
                                wr_id: next,
                                sg_list: vec![sge(b, slot, SLOT as u32)],
                            },
                        )
                        .unwrap();
                    recvs.push_back((next, len));
                    wr = SendWr::new(
                        next,
                        if op == Op::Send {
                            SendOpcode::Send
                        } else {
                            SendOpcode::SendWithImm
                        },
                        vec![sge(a, slot, len as u32)],
                    );
                    wr.imm_data = next as u32;
                }
                Op::Write => {
                    fill(&mut net, a, slot as usize, &pattern(next, len));
                    wr = SendWr::new(next, SendOpcode::RdmaWrite, vec![sge(a, slot, len as u32)]);
                    wr.remote_addr = b.mr.addr + 300 * 1024 + slot / 2 % (256 * 1024);
                    wr.remote_addr = b.mr.addr + slot;
                    wr.rkey = b.mr.rkey;
                }
                Op::Read => {
                    let off = rng.below((64 * 1024 - len) as u64);
                    aux = off;
                    wr = SendWr::new(next, SendOpcode::RdmaRead, vec![sge(a, slot, len as u32)]);
                    wr.remote_addr = b.mr.addr + READ_SRC + off;
                    wr.rkey = b.mr.rkey;
                }
                Op::Faa => {
                    wr = SendWr::new(next, SendOpcode::AtomicFetchAndAdd, vec![sge(a, slot, 8)]);
                    wr.remote_addr = b.mr.addr + COUNTER;
                    wr.rkey = b.mr.rkey;
                    wr.compare_add = 1;
                    faa_count += 1;
                }
            }
            net.engines[a.e].post_send(a.qpn, wr).unwrap();
            posted.push_back((next, op, len, aux));
            next += 1;
        }
        net.step();
        steps += 1;
        assert!(
            steps < 200 * messages + 1_000_000,
            "seed {seed}: no progress (done {done}, virtual {} ns, stats {:?})",
            net.now,
            net.engines[a.e].stats()
        );
        for wc in poll(&mut net, a) {
            let (id, op, len, aux) = posted.pop_front().expect("completion without a posted WR");
            assert_eq!(
                (wc.wr_id, wc.status),
                (id, WcStatus::Success),
                "seed {seed}: completion out of order or failed: {wc:?}"
            );
            let slot = ((id % WINDOW) * SLOT) as usize;
            match op {
                Op::Write => assert_eq!(
                    read(&net, b, slot, len),
                    pattern(id, len),
                    "seed {seed}: WRITE {id}"
                ),
                Op::Read => assert_eq!(
                    read(&net, a, slot, len),
                    read_src[aux as usize..aux as usize + len],
                    "seed {seed}: READ {id}"
                ),
                Op::Faa => {
                    let v = u64::from_ne_bytes(read(&net, a, slot, 8).try_into().unwrap());
                    assert!(
                        faa_seen.insert(v),
                        "seed {seed}: FETCH_ADD returned {v} twice"
                    );
                }
                _ => {}
            }
            done += 1;
        }
        for wc in poll(&mut net, b) {
            let (id, len) = recvs.pop_front().expect("receive without a posted recv");
            assert_eq!(
                (wc.wr_id, wc.status, wc.byte_len as usize),
                (id, WcStatus::Success, len),
                "seed {seed}: receive out of order: {wc:?}"
            );
            let slot = ((id % WINDOW) * SLOT) as usize;
            assert_eq!(
                read(&net, b, slot, len),
                pattern(id, len),
                "seed {seed}: SEND {id} data"
            );
            if wc.wc_flags & wc_flags::WITH_IMM != 0 {
                assert_eq!(wc.imm_data, id as u32);
            }
            received += 1;
        }
    }
    net.run_until(1_000_000, |net| {
        !poll(net, b).is_empty() || recvs.is_empty()
    });
    assert!(
        recvs.is_empty(),
        "seed {seed}: {} sends never received",
        recvs.len()
    );
    let counter = u64::from_ne_bytes(read(&net, b, COUNTER as usize, 8).try_into().unwrap());
    assert_eq!(counter, faa_count, "seed {seed}: atomic counter");
    assert_eq!(faa_seen.len() as u64, faa_count);
    let sa = net.engines[a.e].stats();
    let sb = net.engines[b.e].stats();
    eprintln!(
        "soak: {messages} messages ({received} sends) in {:.3} s virtual, {} packets on the wire, {} corrupted and dropped by ICRC, requester retransmits {}, timeouts {}, NAKs sent by responder {}",
        net.now as f64 / 1e9,
        net.sent,
        sa.rx_bad_icrc + sb.rx_bad_icrc,
        sa.tx_retransmits,
        sa.timeouts,
        sb.naks_sent
    );
    assert!(sa.rx_bad_icrc + sb.rx_bad_icrc > 0 || net.corrupted == 0);
}

fn expect_remote_error(setup: impl Fn(&mut Net, Side, Side) -> SendWr, want: WcStatus) {
    let mut net = Net::new(2, 3, Faults::default());
    let (a, b) = pair(&mut net, QpType::Rc, Mtu::Mtu1024);
    let wr = setup(&mut net, a, b);
    net.engines[a.e].post_send(a.qpn, wr).unwrap();
    // A second WR behind it is flushed.
    net.engines[a.e]
        .post_send(
            a.qpn,
            SendWr::new(99, SendOpcode::RdmaWrite, vec![sge(a, 0, 8)]),
        )
        .unwrap();
    let wcs = wait_wcs(&mut net, a, 2);
    assert_eq!(wcs[0].status, want, "{wcs:?}");
    assert_eq!((wcs[1].wr_id, wcs[1].status), (99, WcStatus::WrFlushErr));
    assert_eq!(
        net.engines[a.e].query_qp(a.qpn).unwrap().0.qp_state,
        QpState::Err
    );
}

#[test]
fn bad_rkey_out_of_range_missing_right_wrong_pd_deregistered() {
    let write = |a: Side, rkey: u32, addr: u64| {
        let mut wr = SendWr::new(1, SendOpcode::RdmaWrite, vec![sge(a, 0, 64)]);
        wr.remote_addr = addr;
        wr.rkey = rkey;
        wr
    };
    expect_remote_error(
        |_, a, b| write(a, b.mr.rkey ^ 0x100, b.mr.addr),
        WcStatus::RemAccessErr,
    );
    expect_remote_error(
        |_, a, b| write(a, b.mr.rkey, b.mr.addr + MR_LEN as u64 - 32),
        WcStatus::RemAccessErr,
    );
    expect_remote_error(
        |_, a, b| {
            let mut wr = SendWr::new(1, SendOpcode::RdmaRead, vec![sge(a, 0, 64)]);
            wr.remote_addr = b.mr.addr.wrapping_sub(8);
            wr.rkey = b.mr.rkey;
            wr
        },
        WcStatus::RemAccessErr,
    );
    expect_remote_error(
        |net, a, b| {
            let mr = net.engines[b.e]
                .memory_mut()
                .register_owned(
                    b.pd,
                    4096,
                    AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
                )
                .unwrap();
            write(a, mr.rkey, mr.addr)
        },
        WcStatus::RemAccessErr,
    );
    expect_remote_error(
        |net, a, b| {
            let other_pd = net.engines[b.e].alloc_pd();
            let mr = net.engines[b.e]
                .memory_mut()
                .register_owned(other_pd, 4096, access_all())
                .unwrap();
            write(a, mr.rkey, mr.addr)
        },
        WcStatus::RemAccessErr,
    );
    expect_remote_error(
        |net, a, b| {
            let mr = net.engines[b.e]
                .memory_mut()
                .register_owned(b.pd, 4096, access_all())
                .unwrap();
            net.engines[b.e].memory_mut().deregister(mr.lkey).unwrap();
            write(a, mr.rkey, mr.addr)
        },
        WcStatus::RemAccessErr,
    );
    // A misaligned atomic is an invalid request.
    expect_remote_error(
        |_, a, b| {
            let mut wr = SendWr::new(1, SendOpcode::AtomicFetchAndAdd, vec![sge(a, 0, 8)]);
            wr.remote_addr = b.mr.addr + 4;
            wr.rkey = b.mr.rkey;
            wr
        },
        WcStatus::RemInvReqErr,
    );
}

#[test]
fn receive_buffer_too_small() {
    let mut net = Net::new(2, 4, Faults::default());
    let (a, b) = pair(&mut net, QpType::Rc, Mtu::Mtu1024);
    net.engines[b.e]
        .post_recv(
            b.qpn,
            RecvWr {
                wr_id: 5,
                sg_list: vec![sge(b, 0, 10)],
            },
        )
        .unwrap();
    net.engines[a.e]
        .post_send(
            a.qpn,
            SendWr::new(1, SendOpcode::Send, vec![sge(a, 0, 100)]),
        )
        .unwrap();
    let tx = wait_wcs(&mut net, a, 1);
    assert_eq!(tx[0].status, WcStatus::RemInvReqErr);
    let rx = poll(&mut net, b);
    assert_eq!((rx[0].wr_id, rx[0].status), (5, WcStatus::LocLenErr));
}

#[test]
fn rnr_with_finite_retries_then_recovery() {
    // No receive posted and rnr_retry 2: RNR_RETRY_EXC_ERR.
    let mut net = Net::new(2, 5, Faults::default());
    let a = setup_side(&mut net, 0, QpType::Rc, 64);
    let b = setup_side(&mut net, 1, QpType::Rc, 64);
    connect(&mut net, a, b, QpType::Rc, Mtu::Mtu1024, 8, 7, 2);
    connect(&mut net, b, a, QpType::Rc, Mtu::Mtu1024, 8, 7, 2);
    net.engines[a.e]
        .post_send(a.qpn, SendWr::new(1, SendOpcode::Send, vec![sge(a, 0, 10)]))
        .unwrap();
    let tx = wait_wcs(&mut net, a, 1);
    assert_eq!(tx[0].status, WcStatus::RnrRetryExcErr);
    assert_eq!(
        net.engines[a.e].stats().rnr_naks_received,
        3,
        "first try + 2 retries"
    );

    // With infinite RNR retry, a receive posted later is found.
    let mut net = Net::new(2, 6, Faults::default());
    let (a, b) = pair(&mut net, QpType::Rc, Mtu::Mtu1024);
    net.engines[a.e]
        .post_send(a.qpn, SendWr::new(1, SendOpcode::Send, vec![sge(a, 0, 10)]))
        .unwrap();
    net.run_until(10_000, |net| {
        net.engines[a.e].stats().rnr_naks_received >= 3
    });
    net.engines[b.e]
        .post_recv(
            b.qpn,
            RecvWr {
                wr_id: 9,
                sg_list: vec![sge(b, 0, 64)],
            },
        )
        .unwrap();
    let tx = wait_wcs(&mut net, a, 1);
    assert_eq!(tx[0].status, WcStatus::Success);
    assert_eq!(poll(&mut net, b)[0].wr_id, 9);
}

#[test]
fn peer_that_stops_answering_gives_retry_exceeded_in_bounded_time() {
    let mut net = Net::new(2, 7, Faults::default());
    let a = setup_side(&mut net, 0, QpType::Rc, 64);
    let b = setup_side(&mut net, 1, QpType::Rc, 64);
    connect(&mut net, a, b, QpType::Rc, Mtu::Mtu1024, 10, 3, 7);
    connect(&mut net, b, a, QpType::Rc, Mtu::Mtu1024, 10, 3, 7);
    net.faults.loss = 1.0;
    net.engines[a.e]
        .post_send(
            a.qpn,
            SendWr::new(1, SendOpcode::RdmaWrite, vec![sge(a, 0, 10)]),
        )
        .unwrap();
    let tx = wait_wcs(&mut net, a, 1);
    assert_eq!(tx[0].status, WcStatus::RetryExcErr);
    // 1 try + 3 retries, each 4.096 µs × 2^10 ≈ 4.2 ms.
    let bound = 4 * (4096u64 << 10) + 100_000;
    assert!(net.now <= bound, "took {} ns, bound {bound}", net.now);
    assert_eq!(net.engines[a.e].stats().timeouts, 4);
}

#[test]
fn cq_overflow_moves_the_qp_to_error() {
    let mut net = Net::new(2, 8, Faults::default());
    let a = setup_side(&mut net, 0, QpType::Rc, 64);
    let b = setup_side(&mut net, 1, QpType::Rc, 2);
    connect(&mut net, a, b, QpType::Rc, Mtu::Mtu1024, 8, 7, 7);
    connect(&mut net, b, a, QpType::Rc, Mtu::Mtu1024, 8, 7, 7);
    for i in 0..4 {
        net.engines[b.e]
            .post_recv(
                b.qpn,
                RecvWr {
                    wr_id: i,
                    sg_list: vec![sge(b, 0, 64)],
                },
            )
            .unwrap();
        net.engines[a.e]
            .post_send(a.qpn, SendWr::new(i, SendOpcode::Send, vec![sge(a, 0, 8)]))
            .unwrap();
    }
    net.run_until(100_000, |net| {
        net.engines[b.e].query_qp(b.qpn).unwrap().0.qp_state == QpState::Err
    });
    assert!(net.engines[b.e].cq_mut(b.cq).unwrap().overflowed());
}

#[test]
fn uc_and_ud() {
    // UC SEND and WRITE.
    let mut net = Net::new(2, 9, Faults::default());
    let (a, b) = pair(&mut net, QpType::Uc, Mtu::Mtu512);
    let data = pattern(1, 2000);
    fill(&mut net, a, 0, &data);
    net.engines[b.e]
        .post_recv(
            b.qpn,
            RecvWr {
                wr_id: 1,
                sg_list: vec![sge(b, 0, 4096)],
            },
        )
        .unwrap();
    net.engines[a.e]
        .post_send(
            a.qpn,
            SendWr::new(1, SendOpcode::Send, vec![sge(a, 0, 2000)]),
        )
        .unwrap();
    let rx = wait_wcs(&mut net, b, 1);
    assert_eq!((rx[0].status, rx[0].byte_len), (WcStatus::Success, 2000));
    assert_eq!(read(&net, b, 0, 2000), data);
    let mut wr = SendWr::new(2, SendOpcode::RdmaWrite, vec![sge(a, 0, 1500)]);
    wr.remote_addr = b.mr.addr + 8192;
    wr.rkey = b.mr.rkey;
    net.engines[a.e].post_send(a.qpn, wr).unwrap();
    assert_eq!(
        wait_wcs(&mut net, a, 2).len(),
        2,
        "UC completes at the requester when sent"
    );
    while net.step() {}
    assert_eq!(read(&net, b, 8192, 1500), data[..1500]);

    // UD with the GRH area and the source QP.
    let mut net = Net::new(2, 10, Faults::default());
    let (a, b) = pair(&mut net, QpType::Ud, Mtu::Mtu4096);
    net.engines[b.e]
        .post_recv(
            b.qpn,
            RecvWr {
                wr_id: 3,
                sg_list: vec![sge(b, 0, 4096 + 40)],
            },
        )
        .unwrap();
    let data = pattern(3, 300);
    fill(&mut net, a, 0, &data);
    let mut wr = SendWr::new(3, SendOpcode::SendWithImm, vec![sge(a, 0, 300)]);
    wr.imm_data = 42;
    wr.ud = Some(UdDest {
        addr: net.engines[b.e].addr(),
        remote_qpn: b.qpn,
        remote_qkey: 0x1111,
    });
    net.engines[a.e].post_send(a.qpn, wr).unwrap();
    let rx = wait_wcs(&mut net, b, 1);
    assert_eq!(
        (rx[0].status, rx[0].byte_len, rx[0].src_qp, rx[0].imm_data),
        (WcStatus::Success, 340, a.qpn, 42)
    );
    assert_eq!(rx[0].wc_flags & wc_flags::GRH, wc_flags::GRH);
    assert_eq!(read(&net, b, 40, 300), data);
    let grh = read(&net, b, 0, 40);
    assert_eq!(&grh[..20], &[0u8; 20]);
    assert_eq!(grh[20] >> 4, 4, "IPv4 header in the last 20 bytes");
    assert_eq!(&grh[32..36], &[127, 0, 0, 1]);
    // A wrong Q_Key is dropped.
    let mut wr = SendWr::new(4, SendOpcode::Send, vec![sge(a, 0, 10)]);
    wr.ud = Some(UdDest {
        addr: net.engines[b.e].addr(),
        remote_qpn: b.qpn,
        remote_qkey: 0x2222,
    });
    net.engines[b.e]
        .post_recv(
            b.qpn,
            RecvWr {
                wr_id: 4,
                sg_list: vec![sge(b, 0, 4096)],
            },
        )
        .unwrap();
    net.engines[a.e].post_send(a.qpn, wr).unwrap();
    while net.step() {}
    assert!(poll(&mut net, b).is_empty());
    // A UD message larger than the path MTU is refused at post time.
    let mut wr = SendWr::new(5, SendOpcode::Send, vec![sge(a, 0, 5000)]);
    wr.ud = Some(UdDest {
        addr: net.engines[b.e].addr(),
        remote_qpn: b.qpn,
        remote_qkey: 0x1111,
    });
    assert!(net.engines[a.e].post_send(a.qpn, wr).is_err());
}

#[test]
fn reads_under_loss() {
    let seed = seed();
    let mut net = Net::new(
        2,
        seed,
        Faults {
            loss: 0.10,
            ..Faults::default()
        },
    );
    let (a, b) = pair(&mut net, QpType::Rc, Mtu::Mtu1024);
    let src = pattern(9, 64 * 1024);
    fill(&mut net, b, 0, &src);
    for i in 0..300u64 {
        let len = 1 + (i * 7919) as usize % (12 * 1024);
        let mut wr = SendWr::new(i, SendOpcode::RdmaRead, vec![sge(a, 0, len as u32)]);
        wr.remote_addr = b.mr.addr + i % 1000;
        wr.rkey = b.mr.rkey;
        net.engines[a.e].post_send(a.qpn, wr).unwrap();
        let tx = wait_wcs(&mut net, a, 1);
        assert_eq!(
            tx[0].status,
            WcStatus::Success,
            "read {i} len {len}: {:?} {:?}",
            net.engines[a.e].stats(),
            net.engines[b.e].stats()
        );
        let off = (i % 1000) as usize;
        assert_eq!(read(&net, a, 0, len), src[off..off + len]);
    }
}
