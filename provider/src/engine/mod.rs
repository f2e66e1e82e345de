//! The sans-IO transport engine of one soft device.
//!
//! Inputs: verbs calls, received packets ([`Engine::handle_packet`]) and the
//! current time, always passed in as nanoseconds of a clock the caller owns.
//! Outputs: packets to transmit ([`Engine::poll_transmit`], written into the
//! caller's buffer), completions on CQs, and the next timer deadline
//! ([`Engine::poll_timeout`]). Nothing here touches a socket or reads a clock,
//! which is what lets `tests/simnet.rs` drive engines through millions of
//! packets on a virtual clock.

mod comp;
mod config;
mod drops;
mod gsi;
mod load;
mod qp;
mod req;
mod resp;
mod rx;
mod tm;
#[cfg(test)]
mod watchdog_tests;
pub use config::{EngineConfig, IcrcPolicy, QpCap, QpInitAttr, MAX_LOOPBACK_WINDOW};
pub use drops::{DropCounts, DropReason};
pub use load::Load;
pub use tm::{tmh_op, SrqOp, SrqOpKind, Tmh, MAX_RNDV_HDR, RVH_LEN, TMH_LEN};

use crate::cq::CompletionQueue;
use crate::memory::{MemoryTable, MwType, PayloadRef};
use crate::qp_attr::{AttrMask, QpAttr, QpState, QpType};
use crate::types::{Errno, PdId, VerbsError, VerbsResult};
use crate::wr::{RecvWr, SendWr, WorkCompletion};
use roxe_wire::{icrc, Psn, ICRC_LEN};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::net::{IpAddr, Ipv6Addr};

pub use qp::QpCounters;
use qp::{Qp, QpCtx, RecvWqe, Srq, XrcSrq};

/// Nanoseconds on the caller's clock.
pub type Nanos = u64;

/// A completion queue handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CqId(pub u32);

/// A shared receive queue handle; also the SRQ number an XRCETH names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SrqId(pub u32);

/// An XRC domain handle (`struct ibv_xrcd`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct XrcdId(pub u32);

/// A packet the engine wants sent: `len` bytes at the start of the caller's
/// buffer form the UDP payload (BTH .. ICRC) for `dst` port 4791; or, with
/// a `payload` by reference, the buffer holds the headers before it and
/// the pad and ICRC after it (see [`Transmit::buf_len`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    /// Destination device address.
    pub dst: IpAddr,
    /// UDP source port (per QP, as rxe spreads flows).
    pub src_port: u16,
    /// The packet's length on the wire.
    pub len: usize,
    /// The payload, when it is sent straight from registered memory
    /// (only in a pass that allows it: [`TxPass::payload_by_ref`]).
    pub payload: Option<PayloadAt>,
}

/// A payload sent from registered memory: the packet is the buffer's
/// first `at` bytes, then `data`, then the buffer's bytes from `at` to
/// [`Transmit::buf_len`] (pad and ICRC).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PayloadAt {
    /// Where the payload goes: the length of the headers.
    pub at: usize,
    /// The memory (valid until the engine's memory table next changes).
    pub data: PayloadRef,
}

impl Transmit {
    /// A packet written whole into the buffer.
    pub(crate) fn whole(dst: IpAddr, src_port: u16, len: usize) -> Transmit {
        Transmit {
            dst,
            src_port,
            len,
            payload: None,
        }
    }

    /// How many bytes of the caller's buffer the packet uses.
    pub fn buf_len(&self) -> usize {
        self.len - self.payload.map_or(0, |p| p.data.len())
    }
}

/// QPs in flight [`Engine::sends_stream`] looks at.
const STREAM_SAMPLE: usize = 64;

/// Which new messages of reliable QPs an ACK-clocked pass holds back
/// (`Engine::poll_transmit_pass`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HoldNew {
    /// None: send what may be sent.
    Never,
    /// Every one.
    Any,
    /// Those of one packet.
    SinglePacket,
}

/// How a transmit pass runs ([`Engine::poll_transmit_pass`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TxPass {
    /// A pass right after a verb: see [`Engine::poll_transmit_ack_clocked`].
    pub ack_clocked: bool,
    /// Payloads of at least [`PAYLOAD_BY_REF_MIN`] bytes that lie in one
    /// region may be sent from it by reference ([`Transmit::payload`]):
    /// the caller sends every packet before it next changes the engine.
    pub payload_by_ref: bool,
}

/// The smallest payload sent by reference: below it the copy costs less
/// than the kernel's extra iovec.
pub const PAYLOAD_BY_REF_MIN: usize = 1024;

/// Why received packets were dropped, and other counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Packets handed to `handle_packet`.
    pub rx_packets: u64,
    /// Dropped: not a well-formed RoCEv2 packet.
    pub rx_malformed: u64,
    /// Dropped: ICRC mismatch.
    pub rx_bad_icrc: u64,
    /// Dropped: no such QP, wrong type, or QP not able to receive.
    pub rx_no_qp: u64,
    /// Dropped: from an address that is not the connected QP's peer.
    pub rx_wrong_peer: u64,
    /// Dropped by the responder or completer (duplicates, out of sequence, bad Q_Key...).
    pub rx_dropped: u64,
    /// Packets produced by `poll_transmit`.
    pub tx_packets: u64,
    /// Of those, retransmissions.
    pub tx_retransmits: u64,
    /// Retransmission timer expiries.
    pub timeouts: u64,
    /// NAKs sent (all kinds).
    pub naks_sent: u64,
    /// RNR NAKs received.
    pub rnr_naks_received: u64,
    /// Accepted IPv4 packets whose ICRC did not match the Linux-sender
    /// assumption but is right for another identification or DF flag
    /// (`IcrcPolicy::Warn`).
    pub rx_icrc_unverified: u64,
    /// The liveness watchdog ([`Engine::audit_liveness`]) found a QP with a
    /// message in flight and no timer armed, and armed its retransmission
    /// timer. Always 0 unless the engine has a bug (debug builds panic
    /// instead).
    pub stalls_repaired: u64,
    /// Every dropped received packet, by reason (the `rx_*` counters
    /// above are their older, coarser sums).
    pub drops: DropCounts,
}

impl Stats {
    /// Count a received packet dropped for `reason` (by the QP `qpn`, if
    /// it reached one), and log it at trace level.
    pub(crate) fn count_drop(&mut self, reason: DropReason, qpn: Option<u32>) {
        self.drops.add(reason);
        match reason {
            DropReason::Malformed => self.rx_malformed += 1,
            DropReason::BadIcrc => self.rx_bad_icrc += 1,
            DropReason::NoQp | DropReason::WrongTransport => self.rx_no_qp += 1,
            DropReason::WrongPeer => self.rx_wrong_peer += 1,
            _ => self.rx_dropped += 1,
        }
        match qpn {
            Some(qpn) => tracing::trace!(qpn = format_args!("{qpn:#x}"), %reason, "packet dropped"),
            None => tracing::trace!(%reason, "packet dropped"),
        }
    }
}

/// One QP as `roxe stat` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QpSnapshot {
    pub qpn: u32,
    pub qp_type: QpType,
    pub state: QpState,
    /// The connected peer's address and QP (RC/UC).
    pub peer: Option<(IpAddr, u32)>,
    /// PSN of the next new request.
    pub next_psn: u32,
    /// Oldest unacknowledged PSN.
    pub una: u32,
    /// Next PSN the responder expects.
    pub epsn: u32,
    /// Send WQEs not yet completed.
    pub send_queue: usize,
    /// Receive WQEs posted and not yet consumed.
    pub recv_queue: usize,
    pub retry_left: u8,
    pub rnr_retry_left: u8,
    /// Packets this QP dropped, by reason.
    pub drops: DropCounts,
    /// What it sent and received.
    pub counters: QpCounters,
}

/// One CQ as `roxe stat` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CqSnapshot {
    pub id: CqId,
    /// Capacity.
    pub depth: usize,
    /// Completions waiting to be polled.
    pub waiting: usize,
    /// A completion did not fit once (its QPs went to ERR).
    pub overflowed: bool,
    /// QPs feeding it (send or receive).
    pub qps: usize,
}

/// An affiliated asynchronous event of a QP (`ibv_get_async_event`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpEvent {
    /// The QP it is about.
    pub qpn: u32,
    /// `enum ibv_event_type`: [`QpEvent::SQ_DRAINED`] or
    /// [`QpEvent::LAST_WQE_REACHED`].
    pub event_type: u32,
}

impl QpEvent {
    /// `IBV_EVENT_SQ_DRAINED`: a QP moved to SQD with
    /// `en_sqd_async_notify` has no request left in flight.
    pub const SQ_DRAINED: u32 = 5;
    /// `IBV_EVENT_QP_LAST_WQE_REACHED`: a QP attached to an SRQ went to
    /// ERR and will take no more receive WQEs from it.
    pub const LAST_WQE_REACHED: u32 = 16;
}

/// The objects of one device and the transport that connects them.
#[derive(Debug)]
pub struct Engine {
    config: EngineConfig,
    /// The latest time the driver gave the engine (receive, timers,
    /// transmit): what completions are stamped with.
    clock: Nanos,
    /// Receive: ICRC changes of unseen IPv4 fields, per packet length.
    unseen_ipv4: icrc::RecentLengths<icrc::UnseenIpv4Fields>,
    memory: MemoryTable,
    next_pd: u32,
    pds: BTreeMap<u32, u32>,
    next_cq: u32,
    cqs: HashMap<u32, CompletionQueue>,
    next_srq: u32,
    srqs: HashMap<u32, Srq>,
    next_xrcd: u32,
    xrcds: BTreeSet<u32>,
    next_qpn: u32,
    qps: BTreeMap<u32, Qp>,
    /// PSNs unacknowledged on all reliable QPs that send under the
    /// loopback window (`Qp::loopback_unacked`): the window is the
    /// device's as much as each QP's (see `request_transmit`). The sum of
    /// the QPs' `counted_loopback_unacked`, kept by `with_qp`.
    loopback_unacked: i32,
    /// Round-robin cursor for transmit fairness between QPs.
    tx_cursor: u32,
    /// QPs that may have a packet to send: `poll_transmit` visits only
    /// these, so idle QPs cost nothing per packet. A QP enters when a verb
    /// or a packet or timer touches it, and leaves when it has nothing.
    active: BTreeSet<u32>,
    /// Every armed requester timer as (deadline, QPN): `poll_timeout` is
    /// its first entry, so thousands of QPs cost nothing per verb call.
    timers: BTreeSet<(Nanos, u32)>,
    /// QPs whose new message an ACK-clocked pass held: the next pass that
    /// is not one (the ACK's, a timer's, a poll's) makes them active again,
    /// whichever QP its packet was for.
    held: BTreeSet<u32>,
    /// Asynchronous events not yet taken by the driver.
    events: Vec<QpEvent>,
    /// The Communication Manager behind QP1 (rdma_cm's protocol).
    cm: crate::cm::Cm,
    /// The PSN of the next MAD sent from QP1.
    gsi_psn: Psn,
    stats: Stats,
}

fn err(verb: &'static str, errno: Errno, detail: impl Into<String>) -> VerbsError {
    VerbsError::new(verb, errno, detail)
}

/// 128 random bits from the OS (`getrandom`), for keys an observer must
/// not guess; the clock and process id if it fails.
fn random_key() -> u128 {
    let mut b = [0u8; 16];
    match rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty()) {
        Ok(16) => u128::from_ne_bytes(b),
        _ => {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0);
            t ^ u128::from(std::process::id()) << 96
        }
    }
}

/// The IPv6 form of a device address: IPv4-mapped for IPv4 (the RoCEv2 GID).
pub fn gid_of(addr: IpAddr) -> [u8; 16] {
    match addr {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// The device address a GID names.
pub fn addr_of_gid(gid: [u8; 16]) -> IpAddr {
    let v6 = Ipv6Addr::from(gid);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

impl Engine {
    /// An engine with no objects.
    pub fn new(config: EngineConfig) -> Engine {
        let gid = gid_of(config.addr);
        let addr = config.addr;
        Engine {
            config,
            clock: 0,
            unseen_ipv4: Default::default(),
            memory: MemoryTable::new(),
            next_pd: 1,
            pds: BTreeMap::new(),
            next_cq: 1,
            cqs: HashMap::new(),
            next_srq: 1,
            srqs: HashMap::new(),
            next_xrcd: 1,
            xrcds: BTreeSet::new(),
            // QPN 0 and 1 are the special QPs; rxe starts numbering at 17.
            next_qpn: 0x11,
            qps: BTreeMap::new(),
            loopback_unacked: 0,
            tx_cursor: 0,
            active: BTreeSet::new(),
            timers: BTreeSet::new(),
            held: BTreeSet::new(),
            events: Vec::new(),
            cm: crate::cm::Cm::new(crate::cm::CmConfig {
                ca_guid: u64::from_be_bytes([
                    gid[8], gid[9], gid[10], gid[11], gid[12], gid[13], gid[14], gid[15],
                ]),
                id_key: random_key(),
                local_addr: Some(addr),
                ..crate::cm::CmConfig::default()
            }),
            gsi_psn: Psn::new(0),
            stats: Stats::default(),
        }
    }

    /// The Communication Manager (QP1): connect, listen, accept, events.
    /// What it sends leaves through `poll_transmit`; its timers are part of
    /// `poll_timeout`/`handle_timeout`.
    /// The Communication Manager's counters.
    pub fn cm_stats(&self) -> crate::cm::CmStats {
        self.cm.stats()
    }

    pub fn cm(&mut self) -> &mut crate::cm::Cm {
        &mut self.cm
    }

    /// The device address.
    pub fn addr(&self) -> IpAddr {
        self.config.addr
    }

    /// Whether loopback peer `peer` is known to receive through a UDP
    /// socket (with its buffers), so the requester's window towards it
    /// may be the wide one even where `wide_loopback_window` is off
    /// (`EngineConfig::udp_peers`). The driver learns it when it sends.
    pub fn set_udp_peer(&mut self, peer: IpAddr, udp: bool) {
        let peers = &mut self.config.udp_peers;
        let known = peers.iter().position(|&p| p == peer);
        match (known, udp) {
            (None, true) => {
                if peers.len() >= 256 {
                    // Bounded: the oldest is forgotten (a narrow window again).
                    peers.remove(0);
                }
                peers.push(peer);
            }
            (Some(i), false) => {
                peers.swap_remove(i);
            }
            _ => return,
        }
        // Their QPs may send more now (or must wait): look at them again,
        // and count them under their window.
        let config = &self.config;
        for q in self.qps.values_mut().filter(|q| q.peer == Some(peer)) {
            let counted = q.loopback_unacked(config);
            self.loopback_unacked += counted - q.counted_loopback_unacked;
            q.counted_loopback_unacked = counted;
            self.active.insert(q.qpn);
        }
    }

    /// The limits and identity the engine was created with.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }
    /// Whether an ACK-clocked pass holds a new message (it goes with the
    /// next pass that holds nothing: an ACK received, a timer, a poll).
    pub fn has_held(&self) -> bool {
        !self.held.is_empty()
    }

    /// Counters.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// The memory table (register, deregister, owned-buffer access).
    pub fn memory(&self) -> &MemoryTable {
        &self.memory
    }

    /// The memory table, mutably.
    pub fn memory_mut(&mut self) -> &mut MemoryTable {
        &mut self.memory
    }

    /// `ibv_alloc_pd`.
    pub fn alloc_pd(&mut self) -> PdId {
        let id = self.next_pd;
        self.next_pd += 1;
        self.pds.insert(id, 0);
        PdId(id)
    }

    /// `ibv_dealloc_pd`: EBUSY while QPs still use it.
    pub fn dealloc_pd(&mut self, pd: PdId) -> VerbsResult<()> {
        if !self.pds.contains_key(&pd.0) {
            return Err(err("ibv_dealloc_pd", Errno::EINVAL, "no such PD"));
        }
        if self.qps.values().any(|q| q.init.pd == pd) || self.srqs.values().any(|s| s.pd == pd) {
            return Err(err("ibv_dealloc_pd", Errno::EBUSY, "PD still in use"));
        }
        self.pds.remove(&pd.0);
        Ok(())
    }

    /// `ibv_alloc_mw`: an unbound memory window of `kind` in `pd`; its
    /// key. `EINVAL` for no such PD.
    pub fn alloc_mw(&mut self, pd: PdId, kind: MwType) -> VerbsResult<u32> {
        if !self.pds.contains_key(&pd.0) {
            return Err(err("ibv_alloc_mw", Errno::EINVAL, "no such PD"));
        }
        self.memory.alloc_window(pd, kind)
    }

    /// `ibv_dealloc_mw`: the window goes; its keys stop working at once.
    pub fn dealloc_mw(&mut self, key: u32) -> VerbsResult<()> {
        self.memory.dealloc_window(key)
    }

    /// `ibv_create_cq`.
    pub fn create_cq(&mut self, depth: u32) -> VerbsResult<CqId> {
        if depth == 0 || depth > self.config.max_cqe {
            return Err(err(
                "ibv_create_cq",
                Errno::EINVAL,
                format!("cqe {depth} out of range"),
            ));
        }
        let id = self.next_cq;
        self.next_cq += 1;
        self.cqs.insert(id, CompletionQueue::new(depth as usize));
        Ok(CqId(id))
    }

    /// `ibv_resize_cq`: EINVAL for a depth out of range or below the
    /// completions waiting.
    pub fn resize_cq(&mut self, cq: CqId, depth: u32) -> VerbsResult<()> {
        const VERB: &str = "ibv_resize_cq";
        if depth == 0 || depth > self.config.max_cqe {
            return Err(err(
                VERB,
                Errno::EINVAL,
                format!("cqe {depth} out of range"),
            ));
        }
        let c = self
            .cqs
            .get_mut(&cq.0)
            .ok_or_else(|| err(VERB, Errno::EINVAL, "no such CQ"))?;
        if !c.resize(depth as usize) {
            return Err(err(
                VERB,
                Errno::EINVAL,
                format!("{} completions waiting, more than {depth}", c.len()),
            ));
        }
        Ok(())
    }

    /// `ibv_destroy_cq`: EBUSY while a QP uses it.
    pub fn destroy_cq(&mut self, cq: CqId) -> VerbsResult<()> {
        if self
            .qps
            .values()
            .any(|q| q.init.send_cq == cq || q.init.recv_cq == cq)
            || self
                .srqs
                .values()
                .any(|s| s.xrc.is_some_and(|x| x.cq == cq))
        {
            return Err(err("ibv_destroy_cq", Errno::EBUSY, "CQ still in use"));
        }
        self.cqs
            .remove(&cq.0)
            .map(|_| ())
            .ok_or_else(|| err("ibv_destroy_cq", Errno::EINVAL, "no such CQ"))
    }

    /// `ibv_poll_cq`: up to `out.len()` completions.
    pub fn poll_cq(&mut self, cq: CqId, out: &mut [WorkCompletion]) -> VerbsResult<usize> {
        let q = self
            .cqs
            .get_mut(&cq.0)
            .ok_or_else(|| err("ibv_poll_cq", Errno::EINVAL, "no such CQ"))?;
        Ok(q.poll(out))
    }

    /// [`poll_cq`](Self::poll_cq), also giving when each completion was
    /// made (engine time, the driver's clock) in `at`.
    pub fn poll_cq_at(
        &mut self,
        cq: CqId,
        out: &mut [WorkCompletion],
        at: &mut [Nanos],
    ) -> VerbsResult<usize> {
        let q = self
            .cqs
            .get_mut(&cq.0)
            .ok_or_else(|| err("ibv_poll_cq", Errno::EINVAL, "no such CQ"))?;
        Ok(q.poll_at(out, at))
    }

    /// The CQ itself (notification state, depth).
    pub fn cq_mut(&mut self, cq: CqId) -> Option<&mut CompletionQueue> {
        self.cqs.get_mut(&cq.0)
    }

    /// `ibv_create_srq`.
    pub fn create_srq(&mut self, pd: PdId, max_wr: u32, max_sge: u32) -> VerbsResult<SrqId> {
        self.new_srq("ibv_create_srq", pd, max_wr, max_sge, None)
    }

    /// `ibv_create_srq_ex` with `IBV_SRQT_XRC`: an SRQ of XRC domain
    /// `xrcd` whose receives complete in `cq`; XRC_RECV QPs of the domain
    /// deliver to it the requests whose XRCETH names its number.
    pub fn create_xrc_srq(
        &mut self,
        pd: PdId,
        xrcd: XrcdId,
        cq: CqId,
        max_wr: u32,
        max_sge: u32,
    ) -> VerbsResult<SrqId> {
        const VERB: &str = "ibv_create_srq_ex";
        if !self.xrcds.contains(&xrcd.0) {
            return Err(err(VERB, Errno::EINVAL, "no such XRC domain"));
        }
        if !self.cqs.contains_key(&cq.0) {
            return Err(err(VERB, Errno::EINVAL, "no such CQ"));
        }
        self.new_srq(VERB, pd, max_wr, max_sge, Some(XrcSrq { xrcd, cq }))
    }

    /// `ibv_create_srq_ex` with `IBV_SRQT_TM`: a tag-matching SRQ (see
    /// `tm.rs`) whose list holds up to `max_tags` tagged buffers and whose
    /// tag-list operations complete in `cq`. Only RC QPs may use it.
    pub fn create_tm_srq(
        &mut self,
        pd: PdId,
        cq: CqId,
        max_wr: u32,
        max_sge: u32,
        max_tags: u32,
    ) -> VerbsResult<SrqId> {
        const VERB: &str = "ibv_create_srq_ex";
        if !self.cqs.contains_key(&cq.0) {
            return Err(err(VERB, Errno::EINVAL, "no such CQ"));
        }
        if max_tags == 0 || max_tags > self.config.max_tm_tags {
            return Err(err(VERB, Errno::EINVAL, "max_num_tags out of range"));
        }
        let id = self.new_srq(VERB, pd, max_wr, max_sge, None)?;
        if let Some(s) = self.srqs.get_mut(&id.0) {
            s.tm = Some(tm::TmSrq::new(cq, max_tags));
        }
        Ok(id)
    }

    /// `ibv_post_srq_ops` (one operation): applied at once; the handle of
    /// an added tag is returned (0 for the others). A full list is ENOMEM,
    /// an SRQ without tag matching or too many SGEs EINVAL.
    pub fn post_srq_op(&mut self, srq: SrqId, op: SrqOp) -> VerbsResult<u32> {
        const VERB: &str = "ibv_post_srq_ops";
        let s = self
            .srqs
            .get_mut(&srq.0)
            .ok_or_else(|| err(VERB, Errno::EINVAL, "no such SRQ"))?;
        let max_sge = s.max_sge;
        let Some(t) = s.tm.as_mut() else {
            return Err(err(VERB, Errno::EINVAL, "not a tag-matching SRQ"));
        };
        if let SrqOpKind::Add { sg_list, .. } = &op.kind {
            if sg_list.len() > max_sge as usize {
                return Err(err(VERB, Errno::EINVAL, "too many SGEs"));
            }
            if t.full() {
                return Err(err(VERB, Errno::ENOMEM, "tag list full"));
            }
        }
        let cq = t.cq;
        let done = t.apply(op.kind, op.sync);
        if op.signaled || !done.ok {
            let status = if done.ok {
                crate::types::WcStatus::Success
            } else {
                crate::types::WcStatus::TmErr
            };
            let mut wc = WorkCompletion::new(op.wr_id, status, done.opcode, 0);
            wc.wc_flags = done.flags;
            let now = self.clock;
            let fits = self
                .cqs
                .get_mut(&cq.0)
                .is_some_and(|q| q.push_at(wc, false, now));
            if !fits {
                self.cq_overflowed(cq);
            }
        }
        Ok(done.handle)
    }

    fn new_srq(
        &mut self,
        verb: &'static str,
        pd: PdId,
        max_wr: u32,
        max_sge: u32,
        xrc: Option<XrcSrq>,
    ) -> VerbsResult<SrqId> {
        if !self.pds.contains_key(&pd.0) {
            return Err(err(verb, Errno::EINVAL, "no such PD"));
        }
        if max_wr == 0 || max_wr > self.config.max_qp_wr || max_sge > self.config.max_sge {
            return Err(err(verb, Errno::EINVAL, "SRQ size out of range"));
        }
        // SRQ numbers travel in 24 bits (the XRCETH).
        if self.next_srq > 0xFF_FFFF {
            return Err(err(verb, Errno::ENOMEM, "SRQ numbers exhausted"));
        }
        let id = self.next_srq;
        self.next_srq += 1;
        self.srqs.insert(
            id,
            Srq {
                pd,
                queue: VecDeque::new(),
                max_wr,
                max_sge,
                xrc,
                tm: None,
            },
        );
        Ok(SrqId(id))
    }

    /// `ibv_destroy_srq`: EBUSY while a QP uses it. Its receives go with
    /// it, without completions (as rxe's).
    pub fn destroy_srq(&mut self, srq: SrqId) -> VerbsResult<()> {
        const VERB: &str = "ibv_destroy_srq";
        if !self.srqs.contains_key(&srq.0) {
            return Err(err(VERB, Errno::EINVAL, "no such SRQ"));
        }
        if self.qps.values().any(|q| q.init.srq == Some(srq)) {
            return Err(err(VERB, Errno::EBUSY, "SRQ still in use"));
        }
        self.srqs.remove(&srq.0);
        Ok(())
    }

    /// `ibv_open_xrcd`: a new XRC domain.
    pub fn open_xrcd(&mut self) -> XrcdId {
        let id = self.next_xrcd;
        self.next_xrcd += 1;
        self.xrcds.insert(id);
        XrcdId(id)
    }

    /// `ibv_close_xrcd`: EBUSY while an SRQ or QP is in the domain.
    pub fn close_xrcd(&mut self, xrcd: XrcdId) -> VerbsResult<()> {
        const VERB: &str = "ibv_close_xrcd";
        if !self.xrcds.contains(&xrcd.0) {
            return Err(err(VERB, Errno::EINVAL, "no such XRC domain"));
        }
        let in_use = self
            .srqs
            .values()
            .any(|s| s.xrc.is_some_and(|x| x.xrcd == xrcd))
            || self.qps.values().any(|q| q.init.xrcd == Some(xrcd));
        if in_use {
            return Err(err(VERB, Errno::EBUSY, "XRC domain still in use"));
        }
        self.xrcds.remove(&xrcd.0);
        Ok(())
    }

    /// The SRQ number an XRCETH names to reach `srq` (`ibv_get_srq_num`).
    pub fn srq_number(&self, srq: SrqId) -> VerbsResult<u32> {
        if self.srqs.contains_key(&srq.0) {
            Ok(srq.0)
        } else {
            Err(err("ibv_get_srq_num", Errno::EINVAL, "no such SRQ"))
        }
    }

    /// `ibv_post_srq_recv`.
    pub fn post_srq_recv(&mut self, srq: SrqId, wr: RecvWr) -> VerbsResult<()> {
        let s = self
            .srqs
            .get_mut(&srq.0)
            .ok_or_else(|| err("ibv_post_srq_recv", Errno::EINVAL, "no such SRQ"))?;
        // rxe's post_one_recv (and mlx5) test for a full queue first.
        if s.queue.len() >= s.max_wr as usize {
            return Err(err("ibv_post_srq_recv", Errno::ENOMEM, "SRQ full"));
        }
        if wr.sg_list.len() > s.max_sge as usize {
            return Err(err("ibv_post_srq_recv", Errno::EINVAL, "too many SGEs"));
        }
        let total = MemoryTable::sge_total(&wr.sg_list);
        s.queue.push_back(RecvWqe {
            wr_id: wr.wr_id,
            sg_list: wr.sg_list,
            total,
        });
        Ok(())
    }

    /// `ibv_create_qp`.
    pub fn create_qp(&mut self, mut init: QpInitAttr) -> VerbsResult<u32> {
        const VERB: &str = "ibv_create_qp";
        match init.qp_type {
            QpType::XrcRecv => {
                if !init.xrcd.is_some_and(|x| self.xrcds.contains(&x.0)) {
                    return Err(err(VERB, Errno::EINVAL, "XRC_RECV needs an XRC domain"));
                }
                // Each request's XRC SRQ brings the PD and the CQ.
                (init.pd, init.send_cq, init.recv_cq, init.srq) = (PdId(0), CqId(0), CqId(0), None);
                init.cap = QpCap::default();
            }
            t => {
                if init.xrcd.is_some() {
                    return Err(err(
                        VERB,
                        Errno::EINVAL,
                        "only XRC_RECV QPs have an XRC domain",
                    ));
                }
                if !self.pds.contains_key(&init.pd.0) {
                    return Err(err(VERB, Errno::EINVAL, "no such PD"));
                }
                if t == QpType::XrcSend {
                    // No receive side.
                    if init.srq.is_some() {
                        return Err(err(VERB, Errno::EINVAL, "XRC_SEND QPs have no SRQ"));
                    }
                    init.recv_cq = init.send_cq;
                    init.cap.max_recv_wr = 0;
                    init.cap.max_recv_sge = 0;
                }
                if !self.cqs.contains_key(&init.send_cq.0)
                    || !self.cqs.contains_key(&init.recv_cq.0)
                {
                    return Err(err(VERB, Errno::EINVAL, "no such CQ"));
                }
                if let Some(s) = init.srq {
                    match self.srqs.get(&s.0) {
                        None => return Err(err(VERB, Errno::EINVAL, "no such SRQ")),
                        Some(srq) if srq.xrc.is_some() => {
                            return Err(err(
                                VERB,
                                Errno::EINVAL,
                                "an XRC SRQ serves XRC_RECV QPs only",
                            ))
                        }
                        // Tag matching's rendezvous READs from the sender.
                        Some(srq) if srq.tm.is_some() && t != QpType::Rc => {
                            return Err(err(
                                VERB,
                                Errno::EINVAL,
                                "a tag-matching SRQ serves RC QPs only",
                            ))
                        }
                        Some(_) => {}
                    }
                }
            }
        }
        let c = init.cap;
        let l = &self.config;
        if c.max_send_wr > l.max_qp_wr
            || c.max_recv_wr > l.max_qp_wr
            || c.max_send_sge > l.max_sge
            || c.max_recv_sge > l.max_sge
            || c.max_inline_data > l.max_inline
        {
            return Err(err(
                VERB,
                Errno::EINVAL,
                "capability beyond the device's limits",
            ));
        }
        let qpn = self.next_qpn;
        self.next_qpn += 1;
        if self.next_qpn > 0xFF_FFFF {
            self.next_qpn = 0x11;
        }
        let qp = Qp::new(qpn, init, self.config.active_mtu.bytes());
        self.qps.insert(qpn, qp);
        Ok(qpn)
    }

    /// `ibv_destroy_qp`.
    pub fn destroy_qp(&mut self, qpn: u32) -> VerbsResult<()> {
        let q = self
            .qps
            .remove(&qpn)
            .ok_or_else(|| err("ibv_destroy_qp", Errno::EINVAL, "no such QP"))?;
        if let Some(d) = q.indexed_deadline {
            self.timers.remove(&(d, qpn));
        }
        self.loopback_unacked -= q.counted_loopback_unacked;
        self.active.remove(&qpn);
        Ok(())
    }

    /// Drive QP `qpn` through `f` with the context it may use, then do
    /// what the call implies beyond the QP: QPs feeding a CQ that
    /// overflowed go to ERR, and the QP's timer is re-indexed. `None` when
    /// there is no such QP.
    fn with_qp<R>(&mut self, qpn: u32, f: impl FnOnce(&mut Qp, &mut QpCtx) -> R) -> Option<R> {
        let Engine {
            config,
            memory,
            cqs,
            srqs,
            qps,
            stats,
            events,
            clock,
            ..
        } = self;
        let q = qps.get_mut(&qpn)?;
        let mut cx = QpCtx {
            now: *clock,
            config,
            memory,
            cqs,
            srqs,
            stats,
            events,
            overflowed: Vec::new(),
            payload_by_ref: false,
            held_new: false,
            loopback_unacked: self.loopback_unacked,
        };
        let result = f(q, &mut cx);
        // Every change to a QP's PSNs, state or peer happens in here.
        let counted = q.loopback_unacked(config);
        self.loopback_unacked += counted - q.counted_loopback_unacked;
        q.counted_loopback_unacked = counted;
        let overflowed = cx.overflowed;
        for cq in overflowed {
            self.cq_overflowed(cq);
        }
        self.reindex_timer(qpn);
        Some(result)
    }

    /// [`with_qp`](Self::with_qp) for a verb, a packet or a timer: after
    /// it the QP may have something to send.
    fn touch<R>(&mut self, qpn: u32, f: impl FnOnce(&mut Qp, &mut QpCtx) -> R) -> Option<R> {
        let result = self.with_qp(qpn, f)?;
        self.active.insert(qpn);
        Some(result)
    }

    /// A verb on QP `qpn`: EINVAL naming `verb` when there is no such QP.
    fn qp_verb(
        &mut self,
        verb: &'static str,
        qpn: u32,
        f: impl FnOnce(&mut Qp, &mut QpCtx) -> VerbsResult<()>,
    ) -> VerbsResult<()> {
        self.touch(qpn, f)
            .unwrap_or_else(|| Err(err(verb, Errno::EINVAL, "no such QP")))
    }

    /// Keep `timers` in step with QP `qpn`'s next deadline.
    fn reindex_timer(&mut self, qpn: u32) {
        let Some(q) = self.qps.get_mut(&qpn) else {
            return;
        };
        let d = q.req.next_deadline();
        if d != q.indexed_deadline {
            if let Some(old) = q.indexed_deadline {
                self.timers.remove(&(old, qpn));
            }
            if let Some(new) = d {
                self.timers.insert((new, qpn));
            }
            q.indexed_deadline = d;
        }
    }

    /// `ibv_query_qp`: the stored attributes and the current state.
    pub fn query_qp(&self, qpn: u32) -> VerbsResult<(QpAttr, QpInitAttr)> {
        self.qps
            .get(&qpn)
            .map(Qp::query)
            .ok_or_else(|| err("ibv_query_qp", Errno::EINVAL, "no such QP"))
    }

    /// `ibv_modify_qp`, with the transition and attribute checks of
    /// libibverbs/rxe (EINVAL for anything they reject).
    pub fn modify_qp(&mut self, qpn: u32, attr: &QpAttr, mask: AttrMask) -> VerbsResult<()> {
        let limits = self.config.qp_limits;
        self.qp_verb("ibv_modify_qp", qpn, |q, cx| {
            q.modify(cx, attr, mask, &limits)
        })
    }

    /// `ibv_post_recv`.
    pub fn post_recv(&mut self, qpn: u32, wr: RecvWr) -> VerbsResult<()> {
        self.qp_verb("ibv_post_recv", qpn, |q, cx| q.post_recv(cx, wr))
    }

    /// `ibv_post_send`.
    pub fn post_send(&mut self, qpn: u32, wr: SendWr) -> VerbsResult<()> {
        self.qp_verb("ibv_post_send", qpn, |q, cx| q.post_send(cx, wr))
    }

    /// A completion did not fit in `cq`: every QP feeding it goes to ERR
    /// (rxe's class G), and its outstanding WRs are flushed.
    fn cq_overflowed(&mut self, cq: CqId) {
        tracing::warn!(cq = cq.0, "CQ overflow: the QPs feeding it go to ERR");
        let victims: Vec<u32> = self
            .qps
            .values()
            .filter(|q| (q.init.send_cq == cq || q.init.recv_cq == cq) && q.state() != QpState::Err)
            .map(|q| q.qpn)
            .collect();
        for v in victims {
            // Flushing into a full CQ cascades no further.
            self.touch(v, |q, cx| q.enter_error(cx));
        }
    }

    /// Every QP, in QPN order (`roxe stat`).
    pub fn qp_snapshots(&self) -> Vec<QpSnapshot> {
        // A BTreeMap iterates in QPN order.
        self.qps.values().map(Qp::snapshot).collect()
    }

    /// Every CQ, in id order (`roxe stat`).
    pub fn cq_snapshots(&self) -> Vec<CqSnapshot> {
        let mut v: Vec<CqSnapshot> = self
            .cqs
            .iter()
            .map(|(&id, c)| CqSnapshot {
                id: CqId(id),
                depth: c.depth(),
                waiting: c.len(),
                overflowed: c.overflowed(),
                qps: self
                    .qps
                    .values()
                    .filter(|q| q.init.send_cq.0 == id || q.init.recv_cq.0 == id)
                    .count(),
            })
            .collect();
        v.sort_by_key(|c| c.id);
        v
    }

    /// Take the asynchronous events raised since the last call.
    pub fn take_events(&mut self) -> Vec<QpEvent> {
        std::mem::take(&mut self.events)
    }

    /// True when asynchronous events are waiting.
    pub fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// The earliest timer deadline of any QP.
    pub fn poll_timeout(&self) -> Option<Nanos> {
        let first_qp = self.timers.first().map(|&(d, _)| d);
        debug_assert_eq!(
            first_qp,
            self.qps
                .values()
                .filter_map(|q| q.req.next_deadline())
                .min(),
            "the timer index missed a change"
        );
        #[cfg(debug_assertions)]
        for q in self.qps.values() {
            if let Some(why) = q.liveness_violation() {
                panic!("QP {:#x} would stall: {why}: {:?}", q.qpn, q.req);
            }
        }
        debug_assert!(
            self.qps
                .values()
                .all(|q| q.counted_loopback_unacked == q.loopback_unacked(&self.config)),
            "a QP's PSNs changed outside with_qp"
        );
        debug_assert_eq!(
            self.loopback_unacked,
            self.qps
                .values()
                .map(|q| q.counted_loopback_unacked)
                .sum::<i32>(),
            "the loopback window's count missed a QP"
        );
        match (first_qp, self.cm.poll_timeout()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The liveness watchdog: every RC QP with a message in flight must have
    /// a retransmission or RNR timer armed, or it would wait forever. A QP
    /// found without one is counted in [`Stats::stalls_repaired`] and gets
    /// its retransmission timer armed, so it retransmits or, after
    /// `retry_cnt` timeouts, fails with RETRY_EXC_ERR as the IB rules say.
    /// O(QPs × send queue): the driver runs it every 100 ms; debug builds
    /// check the same invariant after every call (`poll_timeout`).
    pub fn audit_liveness(&mut self, now: Nanos) -> usize {
        let stalled: Vec<u32> = self
            .qps
            .values()
            .filter(|q| q.liveness_violation().is_some())
            .map(|q| q.qpn)
            .collect();
        for &qpn in &stalled {
            self.stats.stalls_repaired += 1;
            tracing::error!(
                qpn = format_args!("{qpn:#x}"),
                "liveness watchdog: a message in flight had no timer (an engine bug); timer armed"
            );
            self.touch(qpn, |q, _| q.repair_liveness(now));
        }
        stalled.len()
    }

    /// Fire every timer due at `now`.
    pub fn handle_timeout(&mut self, now: Nanos) {
        self.clock = self.clock.max(now);
        if self.cm.poll_timeout().is_some_and(|d| d <= now) {
            self.cm.handle_timeout(now);
        }
        let due: Vec<u32> = self
            .timers
            .range(..=(now, u32::MAX))
            .map(|&(_, qpn)| qpn)
            .collect();
        for qpn in due {
            self.touch(qpn, |q, cx| q.on_timeout(cx, now));
        }
    }

    /// Produce the next packet to send into `buf` (at least 4096 + 64
    /// bytes), or `None` when no QP has anything to send now.
    pub fn poll_transmit(&mut self, now: Nanos, buf: &mut [u8]) -> Option<Transmit> {
        self.transmit(now, buf, HoldNew::Never, false)
    }

    /// [`poll_transmit`](Self::poll_transmit) for a pass right after a verb
    /// (`ibv_post_send`): a reliable QP's new message waits while enough of
    /// the device's PSNs are unacknowledged, since the ACK on its way
    /// starts a pass that sends it (doorbell batching, clocked by ACKs).
    /// Responses, retransmissions and messages already started are not
    /// held.
    pub fn poll_transmit_ack_clocked(&mut self, now: Nanos, buf: &mut [u8]) -> Option<Transmit> {
        let pass = TxPass {
            ack_clocked: true,
            payload_by_ref: false,
        };
        self.poll_transmit_pass(now, buf, pass)
    }

    /// [`poll_transmit`](Self::poll_transmit) for a pass run as `pass` says.
    pub fn poll_transmit_pass(
        &mut self,
        now: Nanos,
        buf: &mut [u8],
        pass: TxPass,
    ) -> Option<Transmit> {
        // Held messages wait for any ACK, not their own QP's (the next
        // pass that holds nothing releases them all). With several QPs in
        // flight only single-packet messages wait: each of those would
        // otherwise be a system call of its own, while holding long ones
        // halved ib_write_bw -q 16 (1.6 -> 0.8-0.9 GB/s).
        let hold_new = if !pass.ack_clocked || !self.unacked_at_least(req::ACK_CLOCKED_MIN_UNACKED)
        {
            HoldNew::Never
        } else if self.timers.len() <= 1 {
            HoldNew::Any
        } else {
            HoldNew::SinglePacket
        };
        self.transmit(now, buf, hold_new, pass.payload_by_ref)
    }

    /// Whether the device sends a stream of small messages: `n` messages
    /// or more posted and not yet completed on the QPs with PSNs in flight
    /// (one large message, a ping-pong's, is not a stream however many
    /// packets it makes), of two packets or fewer on average (a stream of
    /// large ones is paced by its ACKs, which the progress thread had
    /// better receive alongside the caller: `roxe perf write -s 65536`
    /// measured 2.5 % slower otherwise).
    ///
    /// It looks at the first `STREAM_SAMPLE` (64) QPs in flight only: it runs
    /// after every post list, which must not cost a walk over thousands of
    /// QPs.
    pub fn sends_stream(&self, n: usize) -> bool {
        let (messages, psns) = self
            .qps_in_flight()
            .take(STREAM_SAMPLE)
            .fold((0, 0), |(m, p), q| {
                (m + q.queued_messages(), p + q.unacked_psns() as usize)
            });
        messages >= n && psns <= 2 * messages
    }

    /// Whether at least `n` messages are posted and not completed on the
    /// QPs with PSNs in flight (the first `STREAM_SAMPLE` of them).
    pub fn queued_at_least(&self, n: usize) -> bool {
        let mut sum = 0;
        self.qps_in_flight().take(STREAM_SAMPLE).any(|q| {
            sum += q.queued_messages();
            sum >= n
        })
    }

    /// Whether the QPs with PSNs in flight have at least `n`
    /// unacknowledged between them.
    fn unacked_at_least(&self, n: i32) -> bool {
        let mut sum = 0;
        self.qps_in_flight().any(|q| {
            sum += q.unacked_psns();
            sum >= n
        })
    }

    /// The QPs with PSNs in flight (an armed timer), earliest deadline
    /// first.
    fn qps_in_flight(&self) -> impl Iterator<Item = &Qp> {
        self.timers.iter().filter_map(|(_, qpn)| self.qps.get(qpn))
    }

    /// The next packet of any QP, round robin; `hold_new`: an ACK-clocked
    /// pass (see `poll_transmit_ack_clocked`); `by_ref`: payloads may be
    /// sent by reference ([`TxPass::payload_by_ref`]).
    fn transmit(
        &mut self,
        now: Nanos,
        buf: &mut [u8],
        hold_new: HoldNew,
        by_ref: bool,
    ) -> Option<Transmit> {
        self.clock = self.clock.max(now);
        if hold_new == HoldNew::Never && !self.held.is_empty() {
            // Nothing to wait for (any more): what was held goes now.
            self.active.append(&mut self.held);
        }
        if let Some(t) = self.gsi_transmit(buf) {
            return Some(self.finish_transmit(t, buf));
        }
        // Round-robin from the cursor, without collecting the QPNs: this
        // runs once per packet.
        let mut next = self.tx_cursor;
        loop {
            let qpn = *self
                .active
                .range(next..)
                .next()
                .or_else(|| self.active.first())?;
            next = qpn.wrapping_add(1);
            let mut held = false;
            if let Some(t) = self
                .with_qp(qpn, |q, cx| {
                    cx.payload_by_ref = by_ref;
                    let t = q.poll_transmit(cx, now, buf, hold_new);
                    held = cx.held_new;
                    t
                })
                .flatten()
            {
                self.tx_cursor = next;
                return Some(self.finish_transmit(t, buf));
            }
            if held {
                self.held.insert(qpn);
            }
            // Nothing until a verb, a packet or a timer touches it again.
            self.active.remove(&qpn);
        }
    }

    fn finish_transmit(&mut self, mut t: Transmit, buf: &mut [u8]) -> Transmit {
        let pool = &self.config.src_ports;
        if !pool.is_empty() {
            t.src_port = pool[usize::from(t.src_port) % pool.len()];
        }
        let buf_len = t.buf_len();
        let Some(body_len) = buf_len.checked_sub(ICRC_LEN) else {
            return t;
        };
        // The packet's bytes before the ICRC, in one piece or three.
        let (head, tail) = buf[..body_len].split_at(t.payload.map_or(body_len, |p| p.at));
        // SAFETY: the payload was taken from the memory table during this
        // call (`poll_transmit` of the QP just above), which has not
        // changed since; the slice is dropped before this returns.
        let payload = t.payload.map_or(&[][..], |p| unsafe { p.data.bytes() });
        let parts = [head, payload, tail];
        let port = roxe_wire::ROCEV2_PORT;
        let c = match (self.config.addr, t.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                icrc::compute_ipv4_parts(s, d, t.src_port, port, 0, &parts)
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                icrc::compute_ipv6_parts(s, d, t.src_port, port, &parts)
            }
            (s, d) => icrc::compute_ipv6_parts(
                Ipv6Addr::from(gid_of(s)),
                Ipv6Addr::from(gid_of(d)),
                t.src_port,
                port,
                &parts,
            ),
        };
        if let Ok(c) = c {
            roxe_wire::packet::set_icrc(&mut buf[..buf_len], c);
        }
        self.stats.tx_packets += 1;
        if tracing::enabled!(tracing::Level::TRACE) {
            // The headers are in the buffer either way.
            let bth = roxe_wire::bth::Bth::new_checked(&buf[..buf_len]);
            if let (Ok(b), Ok(op)) = (bth, roxe_wire::Opcode::try_from(buf[0])) {
                tracing::trace!(
                    dest_qpn = format_args!("{:#x}", b.dest_qp()),
                    opcode = %op,
                    psn = %b.psn(),
                    len = t.len,
                    dst = %t.dst,
                    "packet sent"
                );
            }
        }
        t
    }
}
