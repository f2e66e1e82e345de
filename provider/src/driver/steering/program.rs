//! The classic BPF program that steers a shared address's packets to the
//! process that owns them (`SO_ATTACH_REUSEPORT_CBPF`), and the same
//! decision in Rust ([`Table::route`]) for the receive path's own check.
//!
//! The kernel runs the program on each datagram with the UDP payload at
//! offset 0 (the BTH) and takes its return value as the index of the
//! socket in the port's reuseport group; an index beyond the group falls
//! back to the kernel's hash choice. Three kinds of packets:
//!
//! - a **probe** (a UD SEND to QP0, which RoCE never uses: there is no
//!   subnet management on Ethernet): the socket index its payload names,
//!   so that a process can ask the group who holds each index;
//! - a packet to a **QP** (destination QPN above 1): by the QPN's slot,
//!   its bits 16..23 (each process owns one slot of the QPN space);
//! - a **CM MAD** (QP1): a REQ or SIDR_REQ by its service ID (the
//!   listening process), a SIDR_REP by the slot in its request ID, any
//!   other by the slot in its remote communication ID (the comm ID this
//!   host chose: its top byte is the process's slot).

/// The BTH opcode of a probe: UD SEND only.
pub(crate) const PROBE_OPCODE: u8 = 0x64;
/// Offset of a probe's 16-bit socket index: its payload, after the BTH
/// and DETH.
pub(crate) const PROBE_INDEX_AT: usize = 20;

/// Where the MAD of a RoCEv2 packet to QP1 starts: BTH (12) + DETH (8).
const MAD_AT: usize = 20;
/// The MAD's attribute ID (16 bits).
const ATTR_AT: usize = MAD_AT + 16;
/// First word of a CM message body: local comm ID, or a SIDR request ID.
const BODY_AT: usize = MAD_AT + 24;
/// REQ and SIDR_REQ: the service ID (8 bytes).
const SERVICE_AT: usize = MAD_AT + 32;
/// Every other CM message: the remote communication ID.
const REMOTE_COMM_ID_AT: usize = MAD_AT + 28;

const ATTR_REQ: u16 = 0x0010;
const ATTR_SIDR_REQ: u16 = 0x0017;
const ATTR_SIDR_REP: u16 = 0x0018;

/// "No choice": the kernel picks a socket by hash.
pub(crate) const NO_INDEX: u32 = u32::MAX;

/// The slot of a QPN.
pub(crate) fn slot_of_qpn(qpn: u32) -> u8 {
    (qpn >> 16) as u8
}

/// What the group looks like: which socket index each live slot's socket
/// holds, and which slot listens on each service ID.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Table {
    /// (slot, socket index).
    pub indexes: Vec<(u8, u32)>,
    /// (service ID, slot).
    pub services: Vec<(u64, u8)>,
}

/// Where a packet goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// The process of this slot.
    Slot(u8),
    /// The socket at this index (a probe).
    Index(u32),
    /// Nobody in particular (unknown service, or too short to tell).
    Any,
}

fn be16(p: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes(p.get(at..at + 2)?.try_into().ok()?))
}

fn be32(p: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(p.get(at..at + 4)?.try_into().ok()?))
}

impl Table {
    /// The route of UDP payload `p`, as the program decides it.
    #[cfg(test)]
    pub(crate) fn route(&self, p: &[u8]) -> Route {
        Self::route_with(p, |sid| {
            self.services
                .iter()
                .find(|(s, _)| *s == sid)
                .map(|&(_, slot)| slot)
        })
    }

    /// [`route`](Self::route) with the service IDs' slots from `service`.
    pub(crate) fn route_with(p: &[u8], service: impl Fn(u64) -> Option<u8>) -> Route {
        let Some(qpn) = be32(p, 4).map(|w| w & 0xFF_FFFF) else {
            return Route::Any;
        };
        if qpn > 1 {
            return Route::Slot(slot_of_qpn(qpn));
        }
        if qpn == 0 {
            return match be16(p, PROBE_INDEX_AT) {
                Some(i) if p[0] == PROBE_OPCODE => Route::Index(i.into()),
                _ => Route::Any,
            };
        }
        let byte = |at: usize| p.get(at).copied().map_or(Route::Any, Route::Slot);
        match be16(p, ATTR_AT) {
            Some(ATTR_REQ | ATTR_SIDR_REQ) => {
                let sid = be32(p, SERVICE_AT)
                    .zip(be32(p, SERVICE_AT + 4))
                    .map(|(hi, lo)| (u64::from(hi) << 32) | u64::from(lo));
                sid.and_then(service).map_or(Route::Any, Route::Slot)
            }
            Some(ATTR_SIDR_REP) => byte(BODY_AT),
            Some(_) => byte(REMOTE_COMM_ID_AT),
            None => Route::Any,
        }
    }

    /// The classic BPF program for this table.
    pub(crate) fn program(&self) -> Vec<libc::sock_filter> {
        let mut b = Builder::default();
        // Data: the QPN's slot.
        b.op(LD | W | ABS, 4);
        b.op(ALU | AND | K, 0xFF_FFFF);
        b.jump(JGT, 1, 0, 2);
        b.op(ALU | RSH | K, 16);
        let to_table = b.ja();
        // QP0: probes, to the index they carry.
        b.jump(JEQ, 0, 0, 5);
        b.op(LD | B | ABS, 0);
        b.jump(JEQ, PROBE_OPCODE.into(), 0, 2);
        b.op(LD | H | ABS, PROBE_INDEX_AT as u32);
        b.op(RET | A, 0);
        b.op(RET | K, NO_INDEX);
        // QP1: CM MADs by attribute.
        b.op(LD | H | ABS, ATTR_AT as u32);
        b.jump(JEQ, ATTR_REQ.into(), 0, 1);
        let req1 = b.ja();
        b.jump(JEQ, ATTR_SIDR_REQ.into(), 0, 1);
        let req2 = b.ja();
        b.jump(JEQ, ATTR_SIDR_REP.into(), 0, 2);
        b.op(LD | B | ABS, BODY_AT as u32);
        let sidr_rep = b.ja();
        b.op(LD | B | ABS, REMOTE_COMM_ID_AT as u32);
        let other = b.ja();
        // REQ and SIDR_REQ: the listener's slot by service ID.
        b.land(&[req1, req2]);
        let mut found = Vec::new();
        for &(sid, slot) in &self.services {
            b.op(LD | W | ABS, SERVICE_AT as u32 + 4);
            b.jump(JEQ, sid as u32, 0, 4);
            b.op(LD | W | ABS, SERVICE_AT as u32);
            b.jump(JEQ, (sid >> 32) as u32, 0, 2);
            b.op(LD | IMM, slot.into());
            found.push(b.ja());
        }
        b.op(RET | K, NO_INDEX);
        // The slot in A: its socket's index.
        b.land(&[to_table, sidr_rep, other]);
        b.land(&found);
        for &(slot, index) in &self.indexes {
            b.jump(JEQ, slot.into(), 0, 1);
            b.op(RET | K, index);
        }
        b.op(RET | K, NO_INDEX);
        b.code
    }
}

// linux/filter.h and linux/bpf_common.h.
const LD: u16 = 0x00;
const ALU: u16 = 0x04;
const JMP: u16 = 0x05;
const RET: u16 = 0x06;
const W: u16 = 0x00;
const H: u16 = 0x08;
const B: u16 = 0x10;
const IMM: u16 = 0x00;
const ABS: u16 = 0x20;
const AND: u16 = 0x50;
const RSH: u16 = 0x70;
const K: u16 = 0x00;
const A: u16 = 0x10;
const JA: u16 = 0x00;
const JEQ: u16 = 0x10;
const JGT: u16 = 0x20;

/// Emits instructions; forward jumps to labels are patched on landing.
#[derive(Default)]
struct Builder {
    code: Vec<libc::sock_filter>,
}

impl Builder {
    fn op(&mut self, code: u16, k: u32) {
        self.code.push(libc::sock_filter {
            code,
            jt: 0,
            jf: 0,
            k,
        });
    }

    fn jump(&mut self, cond: u16, k: u32, jt: u8, jf: u8) {
        self.code.push(libc::sock_filter {
            code: JMP | cond | K,
            jt,
            jf,
            k,
        });
    }

    /// An unconditional jump to be landed later: its position.
    fn ja(&mut self) -> usize {
        self.op(JMP | JA, 0);
        self.code.len() - 1
    }

    /// Point the jumps at `from` to the next instruction.
    fn land(&mut self, from: &[usize]) {
        let here = self.code.len();
        for &j in from {
            self.code[j].k = (here - j - 1) as u32;
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A classic BPF interpreter for the instructions [`Table::program`]
    /// emits, with the kernel's rule that a load beyond the packet ends
    /// the program with 0.
    pub(crate) fn run(prog: &[libc::sock_filter], p: &[u8]) -> u32 {
        let (mut a, mut pc) = (0u32, 0usize);
        let load = |at: u32, n: usize| -> Option<u32> {
            let b = p.get(at as usize..at as usize + n)?;
            Some(b.iter().fold(0u32, |v, &x| (v << 8) | u32::from(x)))
        };
        loop {
            let i = prog[pc];
            pc += 1;
            match i.code {
                c if c == LD | B | ABS => match load(i.k, 1) {
                    Some(v) => a = v,
                    None => return 0,
                },
                c if c == LD | H | ABS => match load(i.k, 2) {
                    Some(v) => a = v,
                    None => return 0,
                },
                c if c == LD | W | ABS => match load(i.k, 4) {
                    Some(v) => a = v,
                    None => return 0,
                },
                c if c == LD | IMM => a = i.k,
                c if c == ALU | AND | K => a &= i.k,
                c if c == ALU | RSH | K => a >>= i.k,
                c if c == JMP | JA => pc += i.k as usize,
                c if c == JMP | JEQ | K => pc += usize::from(if a == i.k { i.jt } else { i.jf }),
                c if c == JMP | JGT | K => pc += usize::from(if a > i.k { i.jt } else { i.jf }),
                c if c == RET | K => return i.k,
                c if c == RET | A => return a,
                c => panic!("unexpected instruction {c:#x}"),
            }
        }
    }

    fn bth(opcode: u8, qpn: u32) -> Vec<u8> {
        let mut p = vec![0u8; 12];
        p[0] = opcode;
        p[4..8].copy_from_slice(&qpn.to_be_bytes());
        p[4] = 0x80; // the ack-request bit shares the word
        p
    }

    fn mad(attr: u16, body: &[(usize, &[u8])]) -> Vec<u8> {
        let mut p = bth(0x64, 1);
        p.resize(20 + 256, 0);
        p[ATTR_AT..ATTR_AT + 2].copy_from_slice(&attr.to_be_bytes());
        for (at, b) in body {
            p[MAD_AT + at..MAD_AT + at + b.len()].copy_from_slice(b);
        }
        p
    }

    fn table() -> Table {
        Table {
            indexes: vec![(3, 0), (7, 1), (9, 2)],
            services: vec![(0x0106_4e21, 7), (0xdead_beef_0000_0001, 9)],
        }
    }

    /// The index the program picks for `p`, as `Table::route` names it.
    fn expected(t: &Table, p: &[u8]) -> u32 {
        match t.route(p) {
            Route::Index(i) => i,
            Route::Slot(s) => t
                .indexes
                .iter()
                .find(|(slot, _)| *slot == s)
                .map_or(NO_INDEX, |&(_, i)| i),
            Route::Any if p.len() < 20 => 0,
            Route::Any => NO_INDEX,
        }
    }

    #[test]
    fn data_packets_go_to_the_slot_of_their_qpn() {
        let t = table();
        let prog = t.program();
        assert_eq!(run(&prog, &bth(0x0a, 0x07_0011)), 1);
        assert_eq!(run(&prog, &bth(0x04, 0x09_ffff)), 2);
        assert_eq!(run(&prog, &bth(0x11, 0x03_0000)), 0);
        // A slot nobody holds: the kernel's choice.
        assert_eq!(run(&prog, &bth(0x0a, 0x05_0011)), NO_INDEX);
    }

    #[test]
    fn probes_go_to_the_index_they_name() {
        let prog = table().program();
        let mut p = bth(PROBE_OPCODE, 0);
        p.extend_from_slice(&[0; 8]);
        p.extend_from_slice(&[0, 2, 0, 0]);
        assert_eq!(run(&prog, &p), 2);
        p[PROBE_INDEX_AT + 1] = 40;
        assert_eq!(run(&prog, &p), 40);
        // Anything else to QP0: nobody's.
        p[0] = 0x04;
        assert_eq!(run(&prog, &p), NO_INDEX);
    }

    #[test]
    fn cm_requests_go_to_their_listener_and_the_rest_by_comm_id() {
        let t = table();
        let prog = t.program();
        let sid = 0x0106_4e21u64.to_be_bytes();
        let req = mad(ATTR_REQ, &[(32, &sid)]);
        assert_eq!(run(&prog, &req), 1);
        let sidr = mad(
            ATTR_SIDR_REQ,
            &[(32, &0xdead_beef_0000_0001u64.to_be_bytes())],
        );
        assert_eq!(run(&prog, &sidr), 2);
        // The same low word under another high word: nobody's.
        let other = mad(ATTR_REQ, &[(32, &0x0000_0001_0106_4e21u64.to_be_bytes())]);
        assert_eq!(run(&prog, &other), NO_INDEX);
        // REP, RTU, DREQ, ...: the remote comm ID's top byte.
        let rep = mad(0x0013, &[(24, &[1, 2, 3, 4]), (28, &[9, 0, 0, 5])]);
        assert_eq!(run(&prog, &rep), 2);
        let sidr_rep = mad(ATTR_SIDR_REP, &[(24, &[3, 1, 1, 1])]);
        assert_eq!(run(&prog, &sidr_rep), 0);
    }

    #[test]
    fn the_program_and_the_rust_route_agree_on_random_packets() {
        let seed = 0x5eed_57ee_u64;
        println!("seed {seed:#x}");
        let mut state = seed;
        let mut next = || crate::rng::splitmix64(&mut state);
        let t = table();
        let prog = t.program();
        for _ in 0..20_000 {
            let len = (next() % 80) as usize;
            let mut p: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            // Bias towards the interesting cases.
            match next() % 4 {
                0 if len > 8 => p[5..8].copy_from_slice(&[0, 0, 1]),
                1 if len > 8 => {
                    p[0] = PROBE_OPCODE;
                    p[5..8].copy_from_slice(&[0, 0, 0]);
                }
                2 if len > 60 => {
                    p[5..8].copy_from_slice(&[0, 0, 1]);
                    p[ATTR_AT..ATTR_AT + 2].copy_from_slice(&ATTR_REQ.to_be_bytes());
                    p[SERVICE_AT..SERVICE_AT + 8].copy_from_slice(&0x0106_4e21u64.to_be_bytes());
                }
                _ => {}
            }
            let want = expected(&t, &p);
            let got = run(&prog, &p);
            assert!(
                got == want || (len < 60 && got == 0),
                "packet {p:02x?}: program {got}, route {want}"
            );
        }
    }

    #[test]
    fn a_large_group_fits_the_kernel_limit() {
        let t = Table {
            indexes: (1..=255).map(|s| (s, u32::from(s))).collect(),
            services: (0..256)
                .map(|p| (0x0106_0000 | p, (p % 255) as u8))
                .collect(),
        };
        // BPF_MAXINSNS.
        assert!(t.program().len() <= 4096, "{}", t.program().len());
    }
}
