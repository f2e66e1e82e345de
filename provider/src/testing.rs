//! A rig for driving engines without sockets, shared by the simulated
//! network (`provider/tests/simnet.rs`) and the engine benchmark
//! (`benches/engine.rs`): seeded randomness, one-call endpoint set-up, and
//! the RESET → INIT → RTR → RTS sequence `ibv_rc_pingpong` uses. Behind the
//! `testing` feature; nothing in the provider itself uses it.

use crate::engine::{CqId, Engine, QpCap, QpInitAttr};
use crate::memory::{MrInfo, Sge};
use crate::qp_attr::{AddressVector, AttrMask, Mtu, QpAttr, QpState, QpType};
use crate::types::{AccessFlags, PdId, VerbsResult};
use std::net::IpAddr;

/// SplitMix64: a small, seeded, reproducible generator.
#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        crate::rng::splitmix64(&mut self.0)
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }

    /// True with probability `p`. Draws a number even when `p` is 0, so
    /// that turning one fault off leaves the others' draws unchanged.
    pub fn chance(&mut self, p: f64) -> bool {
        let x = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        p > 0.0 && x <= p
    }
}

/// `len` bytes that differ for every seed.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut r = Rng(seed);
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        v.extend_from_slice(&r.next_u64().to_le_bytes());
    }
    v.truncate(len);
    v
}

/// Every remote right and local write.
pub fn access_all() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC
}

/// A PD, one CQ for sends and receives, an owned MR and a QP in RESET.
#[derive(Debug, Clone, Copy)]
pub struct Endpoint {
    pub pd: PdId,
    pub cq: CqId,
    pub mr: MrInfo,
    pub qpn: u32,
}

impl Endpoint {
    /// Create the objects on `eng`.
    pub fn create(
        eng: &mut Engine,
        qp_type: QpType,
        cq_depth: u32,
        mr_len: usize,
        mr_access: AccessFlags,
        cap: QpCap,
    ) -> VerbsResult<Endpoint> {
        let pd = eng.alloc_pd();
        let cq = eng.create_cq(cq_depth)?;
        let mr = eng.memory_mut().register_owned(pd, mr_len, mr_access)?;
        let qpn = eng.create_qp(QpInitAttr {
            qp_type,
            pd,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            xrcd: None,
            cap,
            sq_sig_all: false,
        })?;
        Ok(Endpoint { pd, cq, mr, qpn })
    }

    /// An SGE of the MR.
    pub fn sge(&self, offset: u64, len: u32) -> Sge {
        Sge {
            addr: self.mr.addr + offset,
            length: len,
            lkey: self.mr.lkey,
        }
    }
}

/// How [`connect`] sets a QP up.
#[derive(Debug, Clone, Copy)]
pub struct Connection {
    pub qp_type: QpType,
    pub mtu: Mtu,
    pub access: AccessFlags,
    /// The peer's (RTR) and our own (RTS) first PSN.
    pub psn: u32,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub max_rd_atomic: u8,
    pub qkey: u32,
}

impl Connection {
    /// RC at `mtu` with every right, PSN 0, timeout 14 (~67 ms), 7 retries,
    /// infinite RNR retries, 16 READs/atomics in flight.
    pub fn rc(mtu: Mtu) -> Connection {
        Connection {
            qp_type: QpType::Rc,
            mtu,
            access: access_all(),
            psn: 0,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 16,
            qkey: 0x1111,
        }
    }
}

/// Bring QP `qpn` of `eng` from RESET to RTS facing QP `peer_qpn` at
/// `peer`, with the masks `ibv_rc_pingpong` (RC/UC) and `ibv_ud_pingpong`
/// (UD) use.
pub fn connect(
    eng: &mut Engine,
    qpn: u32,
    peer_qpn: u32,
    peer: IpAddr,
    c: &Connection,
) -> VerbsResult<()> {
    let mut a = QpAttr {
        qp_state: QpState::Init,
        pkey_index: 0,
        port_num: 1,
        qp_access_flags: c.access,
        qkey: c.qkey,
        ..QpAttr::default()
    };
    let init = AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT;
    let init = match c.qp_type {
        QpType::Ud => init | AttrMask::QKEY,
        QpType::Uc | QpType::Rc | QpType::XrcSend | QpType::XrcRecv => {
            init | AttrMask::ACCESS_FLAGS
        }
    };
    eng.modify_qp(qpn, &a, init)?;
    a.qp_state = QpState::Rtr;
    a.path_mtu = c.mtu;
    a.dest_qp_num = peer_qpn;
    a.rq_psn = c.psn;
    a.max_dest_rd_atomic = c.max_rd_atomic;
    a.min_rnr_timer = 1;
    a.av = AddressVector {
        dgid: crate::engine::gid_of(peer),
        is_global: true,
        hop_limit: 64,
        port_num: 1,
        ..AddressVector::default()
    };
    let uc_rtr =
        AttrMask::STATE | AttrMask::AV | AttrMask::PATH_MTU | AttrMask::DEST_QPN | AttrMask::RQ_PSN;
    let rtr = match c.qp_type {
        QpType::Ud => AttrMask::STATE,
        QpType::Uc | QpType::XrcSend => uc_rtr,
        QpType::Rc | QpType::XrcRecv => {
            uc_rtr | AttrMask::MAX_DEST_RD_ATOMIC | AttrMask::MIN_RNR_TIMER
        }
    };
    eng.modify_qp(qpn, &a, rtr)?;
    a.qp_state = QpState::Rts;
    a.sq_psn = c.psn;
    a.timeout = c.timeout;
    a.retry_cnt = c.retry_cnt;
    a.rnr_retry = c.rnr_retry;
    a.max_rd_atomic = c.max_rd_atomic;
    let rts = match c.qp_type {
        QpType::Rc | QpType::XrcSend => {
            AttrMask::STATE
                | AttrMask::SQ_PSN
                | AttrMask::TIMEOUT
                | AttrMask::RETRY_CNT
                | AttrMask::RNR_RETRY
                | AttrMask::MAX_QP_RD_ATOMIC
        }
        QpType::Uc | QpType::Ud => AttrMask::STATE | AttrMask::SQ_PSN,
        QpType::XrcRecv => AttrMask::STATE | AttrMask::SQ_PSN | AttrMask::TIMEOUT,
    };
    eng.modify_qp(qpn, &a, rts)
}
