//! The JSON-line protocol between `tests/two_process.rs` (the client, in
//! the test process) and `roxe-test-peer` (the server, a child process):
//! the peer prints its [`Hello`] on stdout, reads the client's
//! [`ClientHello`] from stdin, connects and answers [`Reply::Ok`], then
//! answers each [`Cmd`] read from stdin with one [`Reply`] line on stdout
//! (two for [`Cmd::Stream`]: `Ready`, then `Streamed`).
//!
//! Shared by both sides with `#[path]`, so each uses only part of it.
#![allow(dead_code)]

use serde::{Deserialize, Serialize};

/// The Q_Key of both sides' UD QPs.
pub const QKEY: u32 = 0x1111_1111;
/// Size of the peer's memory region.
pub const PEER_MR_LEN: usize = 80 << 20;
/// The peer's RC QPs: 0 has its own receive queue, 1 and 2 share the SRQ.
pub const PEER_RC_QPS: usize = 3;
/// Where in the peer's MR [`Cmd::PingPong`] is written to (its answer
/// goes from 64 bytes further).
pub const PINGPONG_OFF: u64 = 64 << 20;
/// The initial PSN of the peer's QPs (the client's are its own choice).
pub const PEER_PSN: u32 = 0x00a0_0000;

/// An RC endpoint (`roxe_verbs::Endpoint`, serialisable with its `serde`
/// feature).
pub type Ep = roxe_verbs::Endpoint;

/// What the peer announces when it is ready to be connected.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct Hello {
    pub pid: u32,
    /// The peer device's address.
    pub addr: String,
    pub gid: [u8; 16],
    /// One per peer RC QP (see [`PEER_RC_QPS`]).
    pub rc: Vec<Ep>,
    pub ud_qpn: u32,
    pub mr_addr: u64,
    pub mr_len: u64,
    pub rkey: u32,
}

/// The client's answer: which peer QP (by index) to connect to which
/// client endpoint, and the ACK timeout the peer's QPs use.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct ClientHello {
    pub connect: Vec<(usize, Ep)>,
    pub timeout: u8,
    pub ud_qpn: u32,
}

/// A receive queue of the peer.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rq {
    /// The own receive queue of RC QP `i`.
    Qp(usize),
    /// The SRQ of RC QPs 1 and 2.
    Srq,
    /// The UD QP's.
    Ud,
}

/// How the peer waits for completions.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// `ibv_poll_cq` in a loop (spinning, yielding, then napping).
    Poll,
    /// `ibv_req_notify_cq` + a blocking `ibv_get_cq_event`.
    Channel,
    /// `ibv_req_notify_cq`, the channel non-blocking, `poll(2)` on its fd.
    ChannelFd,
}

#[derive(Serialize, Deserialize, Debug, Clone)]
pub enum Cmd {
    /// Post `n` receives of `size` bytes on `rq`: receive `i` gets wr_id
    /// `first_wr_id + i` and the buffer at `off + i * size`.
    PostRecv {
        rq: Rq,
        first_wr_id: u64,
        n: u32,
        off: u64,
        size: u32,
    },
    /// Wait for `n` completions on the RC receive CQ (`ud`: the UD CQ) and
    /// report them, with the data each receive buffer got.
    Expect { ud: bool, n: u32, wait: Wait },
    /// The MR at `off` must hold `pattern(seed, len)`.
    Verify { off: u64, len: u64, seed: u64 },
    /// Fill the MR at `off` with `pattern(seed, len)`.
    Fill { off: u64, len: u64, seed: u64 },
    /// CRC-32 of `len` bytes of the MR at `off`.
    Crc { off: u64, len: u64 },
    /// Set the 8-byte word at `off` (native endianness, as atomics see it).
    SetWord { off: u64, value: u64 },
    /// Read the 8-byte word at `off`.
    GetWord { off: u64 },
    /// Receive `n` messages of `size` bytes on `rq` through a ring of
    /// `slots` receives at `off`, hashing the bytes in arrival order
    /// (CRC-32): answers `Ready` once the ring is posted, `Streamed` at
    /// the end.
    Stream {
        rq: Rq,
        n: u64,
        size: u32,
        slots: u32,
        off: u64,
        wait: Wait,
    },
    /// A WRITE ping-pong on RC QP 0, as perftest's `ib_write_lat` plays
    /// it: answer `Ready`, then for each turn `t` in `first..first +
    /// turns` spin until the 4-byte word at [`PINGPONG_OFF`] holds `t`
    /// (little-endian; the client's WRITE), and answer with a WRITE of
    /// `t` to the client's `addr` (`rkey`); then, with `exit`, wait for
    /// `first + turns` and exit 0 at once, without answering, closing or
    /// destroying anything. Answers `Word` with the ACKs QP 0 held for
    /// its answers (`roxe stat`'s `acks_held`).
    PingPong {
        first: u32,
        turns: u32,
        exit: bool,
        addr: u64,
        rkey: u32,
    },
    /// The device's counters.
    Stats,
    /// Answer `Ok` and exit 0.
    Quit,
}

/// A work completion as the peer saw it, with what its buffer holds.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Wc {
    pub wr_id: u64,
    /// `WcStatus as u32`.
    pub status: u32,
    /// `WcOpcode as u32`.
    pub opcode: u32,
    pub byte_len: u32,
    pub imm_data: u32,
    pub wc_flags: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    /// For a successful SEND: the first 8 bytes of the message (LE) and
    /// the CRC-32 of its `byte_len` bytes (UD: after the 40-byte GRH area).
    pub tag: Option<u64>,
    pub crc: Option<u32>,
    /// UD: the source address in the GRH area (IPv4: bytes 32..36).
    pub grh_src: Option<String>,
}

#[derive(Serialize, Deserialize, Debug, Clone)]
pub enum Reply {
    Ok,
    Bad(String),
    Word(u64),
    Crc(u32),
    Completions {
        wcs: Vec<Wc>,
        /// Completion-channel events consumed.
        events: u64,
        /// Times the peer went to sleep waiting for one.
        sleeps: u64,
    },
    Ready,
    Streamed {
        crc: u32,
        bytes: u64,
        msgs: u64,
        secs: f64,
        events: u64,
        /// CPU seconds the peer process used during the stream.
        cpu_secs: f64,
    },
    Stats(String),
}

/// Deterministic test data: xorshift64 bytes from `seed`.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// CRC-32 of `data`.
pub fn crc(data: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(data);
    h.finalize()
}
