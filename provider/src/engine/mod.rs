//! The sans-IO transport engine of one soft device.
//!
//! Inputs: verbs calls, received packets ([`Engine::handle_packet`]) and the
//! current time, always passed in as nanoseconds of a clock the caller owns.
//! Outputs: packets to transmit ([`Engine::poll_transmit`], written into the
//! caller's buffer), completions on CQs, and the next timer deadline
//! ([`Engine::poll_timeout`]). Nothing here touches a socket or reads a clock,
//! which is what lets `tests/simnet.rs` drive engines through millions of
//! packets on a virtual clock.

mod drops;
mod requester;
mod responder;
pub use drops::{DropCounts, DropReason};

use crate::cq::CompletionQueue;
use crate::memory::{MemoryTable, Sge};
use crate::qp_attr::{self, AttrMask, Mtu, QpAttr, QpLimits, QpState, QpType};
use crate::types::{Errno, PdId, VerbsError, VerbsResult, WcOpcode, WcStatus};
use crate::wr::{RecvWr, SendOpcode, SendWr, WorkCompletion};
use roxe_wire::{icrc, AckTimeout, Packet, Psn, Transport, ICRC_LEN};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::net::{IpAddr, Ipv6Addr};

pub use requester::SendWqe;

/// Nanoseconds on the caller's clock.
pub type Nanos = u64;

/// A completion queue handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CqId(pub u32);

/// A shared receive queue handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SrqId(pub u32);

/// How received IPv4 packets' ICRCs are checked (IPv6 is always verified).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IcrcPolicy {
    /// Verify assuming the sender's IPv4 header is the one Linux emits for
    /// an unconnected don't-fragment UDP socket (identification 0), which is
    /// how roxe sends; drop on mismatch.
    AssumeLinuxSender,
    /// Verify as `AssumeLinuxSender`, but accept a mismatch and count it in
    /// [`Stats::rx_icrc_unverified`]: peers such as rxe and mlx5 put
    /// non-zero identifications in their IPv4 headers, which a UDP socket
    /// never shows, so their ICRCs cannot be recomputed.
    Warn,
    /// Do not verify IPv4 ICRCs.
    Off,
    /// The driver reads whole IP datagrams (a raw socket) and hands each
    /// packet to [`Engine::handle_ip_packet`] with the headers it arrived
    /// under, which verifies the ICRC over them exactly (any IPv4
    /// identification). [`Engine::handle_packet`] alone then does not check
    /// IPv4 ICRCs: its caller has.
    WireHeaders,
}

/// Device-wide limits and identity.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// The device's address (its RoCEv2 GID).
    pub addr: IpAddr,
    /// Largest `max_send_wr`/`max_recv_wr` (rxe: 0x4000).
    pub max_qp_wr: u32,
    /// Largest `max_send_sge`/`max_recv_sge` (rxe: 32).
    pub max_sge: u32,
    /// Largest `max_inline_data` (rxe: 400... roxe allows a full 4 KiB MTU).
    pub max_inline: u32,
    /// Largest CQ depth.
    pub max_cqe: u32,
    /// Limits for QP attributes.
    pub qp_limits: QpLimits,
    /// ICRC check on received IPv4 packets.
    pub icrc_policy: IcrcPolicy,
    /// Every packet leaves from this UDP source port (a driver with one
    /// socket bound to 4791); `None`: a per-QP port, as rxe spreads flows.
    /// The ICRC covers the source port, so it must be the real one.
    pub fixed_src_port: Option<u16>,
    /// The port's active MTU (from the link; 4096 on loopback): the
    /// largest UD message, and what `ibv_query_port` reports.
    pub active_mtu: Mtu,
}

impl EngineConfig {
    /// Defaults for a device at `addr`.
    pub fn new(addr: IpAddr) -> Self {
        EngineConfig {
            addr,
            max_qp_wr: 0x4000,
            max_sge: 32,
            max_inline: 4096,
            max_cqe: 0x1_0000,
            qp_limits: QpLimits::default(),
            icrc_policy: IcrcPolicy::AssumeLinuxSender,
            fixed_src_port: None,
            active_mtu: Mtu::Mtu4096,
        }
    }
}

/// Queue sizes a QP is created with (`struct ibv_qp_cap`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QpCap {
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// SGEs per send WR.
    pub max_send_sge: u32,
    /// SGEs per receive WR.
    pub max_recv_sge: u32,
    /// Inline bytes per send WR.
    pub max_inline_data: u32,
}

/// `struct ibv_qp_init_attr`, as the engine needs it.
#[derive(Debug, Clone, Copy)]
pub struct QpInitAttr {
    /// Transport.
    pub qp_type: QpType,
    /// Protection domain.
    pub pd: PdId,
    /// CQ for send completions.
    pub send_cq: CqId,
    /// CQ for receive completions.
    pub recv_cq: CqId,
    /// Shared receive queue, if any.
    pub srq: Option<SrqId>,
    /// Queue sizes.
    pub cap: QpCap,
    /// Every send WR generates a completion.
    pub sq_sig_all: bool,
}

/// A packet the engine wants sent: `len` bytes at the start of the caller's
/// buffer form the UDP payload (BTH .. ICRC) for `dst` port 4791.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    /// Destination device address.
    pub dst: IpAddr,
    /// UDP source port (per QP, as rxe spreads flows).
    pub src_port: u16,
    /// Bytes written.
    pub len: usize,
}

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
    /// assumption (`IcrcPolicy::Warn`).
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

/// A posted receive.
#[derive(Debug, Clone)]
pub(crate) struct RecvWqe {
    pub wr_id: u64,
    pub sg_list: Vec<Sge>,
    pub total: u64,
}

/// A shared receive queue.
#[derive(Debug)]
pub(crate) struct Srq {
    pub pd: PdId,
    pub queue: VecDeque<RecvWqe>,
    pub max_wr: u32,
    pub max_sge: u32,
}

/// One queue pair.
#[derive(Debug)]
pub(crate) struct Qp {
    pub qpn: u32,
    pub init: QpInitAttr,
    pub attr: QpAttr,
    pub state: QpState,
    /// The connected peer (RC/UC), from the AV's GID.
    pub peer: Option<IpAddr>,
    pub req: requester::Requester,
    pub resp: responder::Responder,
    pub rq: VecDeque<RecvWqe>,
    /// The deadline under which `Engine::timers` holds this QP.
    pub indexed_deadline: Option<Nanos>,
    /// The port's active MTU in bytes (UD's message limit).
    pub port_mtu: usize,
    /// Received packets this QP dropped, by reason.
    pub drops: DropCounts,
}

impl Qp {
    pub fn pmtu(&self) -> usize {
        // UD has no path MTU attribute: its limit is the port's active MTU.
        if self.init.qp_type == QpType::Ud {
            self.port_mtu
        } else {
            self.attr.path_mtu.bytes()
        }
    }
    pub fn src_port(&self) -> u16 {
        // Like rxe, a fixed source port per QP in 0xC000..0xFFFF.
        0xC000 | (self.qpn as u16 & 0x3FFF)
    }
    /// Why this QP could wait forever with work outstanding, if it could:
    /// an RC message in flight with neither a retransmission nor an RNR
    /// timer armed.
    pub fn liveness_violation(&self) -> Option<&'static str> {
        if self.init.qp_type != QpType::Rc || !matches!(self.state, QpState::Rts | QpState::Sqd) {
            return None;
        }
        let timeout = AckTimeout::new(self.attr.timeout).unwrap_or(AckTimeout::INFINITE);
        (!self.req.timer_covers_flight(timeout))
            .then_some("a message in flight with no timer armed")
    }
    pub fn can_receive(&self) -> bool {
        matches!(self.state, QpState::Rtr | QpState::Rts | QpState::Sqd)
    }
    /// In SQD, the drain is over once no message that had started is
    /// unfinished: `sq_draining` clears, as rxe's requester clears it, and
    /// SQD may be left for RTS again.
    /// True when the drain just ended and the QP asked to be told
    /// (`IBV_EVENT_SQ_DRAINED`).
    pub fn update_drain(&mut self) -> bool {
        if self.state == QpState::Sqd && self.attr.sq_draining && !self.req.in_flight() {
            self.attr.sq_draining = false;
            return self.attr.en_sqd_async_notify;
        }
        false
    }
}

/// The objects of one device and the transport that connects them.
#[derive(Debug)]
pub struct Engine {
    config: EngineConfig,
    memory: MemoryTable,
    next_pd: u32,
    pds: BTreeMap<u32, u32>,
    next_cq: u32,
    cqs: HashMap<u32, CompletionQueue>,
    next_srq: u32,
    srqs: HashMap<u32, Srq>,
    next_qpn: u32,
    qps: BTreeMap<u32, Qp>,
    /// Round-robin cursor for transmit fairness between QPs.
    tx_cursor: u32,
    /// QPs that may have a packet to send: `poll_transmit` visits only
    /// these, so idle QPs cost nothing per packet. A QP enters when a verb
    /// or a packet or timer touches it, and leaves when it has nothing.
    active: BTreeSet<u32>,
    /// Every armed requester timer as (deadline, QPN): `poll_timeout` is
    /// its first entry, so thousands of QPs cost nothing per verb call.
    timers: BTreeSet<(Nanos, u32)>,
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
        Engine {
            config,
            memory: MemoryTable::new(),
            next_pd: 1,
            pds: BTreeMap::new(),
            next_cq: 1,
            cqs: HashMap::new(),
            next_srq: 1,
            srqs: HashMap::new(),
            // QPN 0 and 1 are the special QPs; rxe starts numbering at 17.
            next_qpn: 0x11,
            qps: BTreeMap::new(),
            tx_cursor: 0,
            active: BTreeSet::new(),
            timers: BTreeSet::new(),
            events: Vec::new(),
            cm: crate::cm::Cm::new(crate::cm::CmConfig {
                ca_guid: u64::from_be_bytes([
                    gid[8], gid[9], gid[10], gid[11], gid[12], gid[13], gid[14], gid[15],
                ]),
                id_seed: {
                    // Different on every device and run: comm IDs must not
                    // be predictable (a forged REJ/DREQ needs one).
                    let t = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map(|d| d.subsec_nanos() ^ (d.as_secs() as u32))
                        .unwrap_or(0);
                    t ^ std::process::id().rotate_left(13)
                        ^ u32::from_be_bytes([gid[12], gid[13], gid[14], gid[15]])
                },
                ..crate::cm::CmConfig::default()
            }),
            gsi_psn: Psn::new(0),
            stats: Stats::default(),
        }
    }

    /// The Communication Manager (QP1): connect, listen, accept, events.
    /// What it sends leaves through `poll_transmit`; its timers are part of
    /// `poll_timeout`/`handle_timeout`.
    pub fn cm(&mut self) -> &mut crate::cm::Cm {
        &mut self.cm
    }

    /// A MAD from QP1 to QP1 of `dst`, as the kernel's GSI sends it.
    fn gsi_transmit(&mut self, buf: &mut [u8]) -> Option<Transmit> {
        let (dst, mad) = self.cm.poll_transmit()?;
        let mut payload = [0u8; roxe_wire::cm::MAD_LEN];
        if mad.emit(&mut payload).is_err() {
            debug_assert!(false, "a CM MAD always fits 256 bytes");
            return None;
        }
        let psn = self.gsi_psn;
        self.gsi_psn += 1;
        let repr = roxe_wire::PacketRepr {
            bth: roxe_wire::BthRepr {
                ack_req: true,
                ..roxe_wire::BthRepr::new(
                    roxe_wire::Opcode::UdSendOnly,
                    roxe_wire::cm::GSI_QPN,
                    psn,
                )
            },
            ext: roxe_wire::ExtHeaders {
                deth: Some(roxe_wire::DethRepr {
                    qkey: roxe_wire::cm::GSI_QKEY,
                    src_qp: roxe_wire::cm::GSI_QPN,
                    reserved: 0,
                }),
                ..roxe_wire::ExtHeaders::NONE
            },
            payload: &payload,
        };
        let len = repr.emit(buf).ok()?;
        Some(Transmit {
            dst,
            src_port: 0xC000 | roxe_wire::cm::GSI_QPN as u16,
            len,
        })
    }

    /// A UD packet to QP1: a MAD for the CM if it is one.
    fn gsi_receive(&mut self, now: Nanos, src: IpAddr, pkt: &Packet<&[u8]>) {
        let qkey_ok = pkt
            .deth()
            .is_some_and(|d| d.qkey == roxe_wire::cm::GSI_QKEY);
        if pkt.opcode() != roxe_wire::Opcode::UdSendOnly || !qkey_ok {
            self.stats.count_drop(DropReason::NotCm, None);
            return;
        }
        self.cm.handle_mad(now, src, pkt.payload());
    }

    /// The device address.
    pub fn addr(&self) -> IpAddr {
        self.config.addr
    }

    /// The limits and identity the engine was created with.
    pub fn config(&self) -> &EngineConfig {
        &self.config
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

    /// The CQ itself (notification state, depth).
    pub fn cq_mut(&mut self, cq: CqId) -> Option<&mut CompletionQueue> {
        self.cqs.get_mut(&cq.0)
    }

    /// `ibv_create_srq`.
    pub fn create_srq(&mut self, pd: PdId, max_wr: u32, max_sge: u32) -> VerbsResult<SrqId> {
        if !self.pds.contains_key(&pd.0) {
            return Err(err("ibv_create_srq", Errno::EINVAL, "no such PD"));
        }
        if max_wr == 0 || max_wr > self.config.max_qp_wr || max_sge > self.config.max_sge {
            return Err(err(
                "ibv_create_srq",
                Errno::EINVAL,
                "SRQ size out of range",
            ));
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
            },
        );
        Ok(SrqId(id))
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
    pub fn create_qp(&mut self, init: QpInitAttr) -> VerbsResult<u32> {
        const VERB: &str = "ibv_create_qp";
        if !self.pds.contains_key(&init.pd.0) {
            return Err(err(VERB, Errno::EINVAL, "no such PD"));
        }
        if !self.cqs.contains_key(&init.send_cq.0) || !self.cqs.contains_key(&init.recv_cq.0) {
            return Err(err(VERB, Errno::EINVAL, "no such CQ"));
        }
        if let Some(s) = init.srq {
            if !self.srqs.contains_key(&s.0) {
                return Err(err(VERB, Errno::EINVAL, "no such SRQ"));
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
        let qp = Qp {
            qpn,
            init,
            attr: QpAttr::default(),
            state: QpState::Reset,
            peer: None,
            req: requester::Requester::new(),
            resp: responder::Responder::new(),
            rq: VecDeque::new(),
            indexed_deadline: None,
            port_mtu: self.config.active_mtu.bytes(),
            drops: DropCounts::default(),
        };
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
        self.active.remove(&qpn);
        Ok(())
    }

    /// After anything that may have changed QP `qpn`'s requester or
    /// responder: it may have something to send, and its timer may have
    /// moved. Every entry point that touches a QP ends here.
    fn touched(&mut self, qpn: u32) {
        self.reindex_timer(qpn);
        if self.qps.contains_key(&qpn) {
            self.active.insert(qpn);
        }
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
        let q = self
            .qps
            .get(&qpn)
            .ok_or_else(|| err("ibv_query_qp", Errno::EINVAL, "no such QP"))?;
        let mut a = q.attr;
        a.qp_state = q.state;
        a.cur_qp_state = q.state;
        Ok((a, q.init))
    }

    /// `ibv_modify_qp`, with the transition and attribute checks of
    /// libibverbs/rxe (EINVAL for anything they reject).
    pub fn modify_qp(&mut self, qpn: u32, attr: &QpAttr, mask: AttrMask) -> VerbsResult<()> {
        let limits = self.config.qp_limits;
        let q = self
            .qps
            .get_mut(&qpn)
            .ok_or_else(|| err("ibv_modify_qp", Errno::EINVAL, "no such QP"))?;
        // With the stored attributes: an AV whose port is not the QP's on
        // the way to RTR, and leaving SQD before the drain ends, are EINVAL.
        let new_state = qp_attr::check_modify_with_stored(
            q.init.qp_type,
            q.state,
            &q.attr,
            attr,
            mask,
            &limits,
        )?;
        let old_state = q.state;
        if old_state != new_state {
            tracing::debug!(
                qpn = format_args!("{qpn:#x}"),
                from = %old_state,
                to = %new_state,
                "QP state change"
            );
        }
        qp_attr::apply(&mut q.attr, attr, mask, new_state);
        if mask.contains(AttrMask::AV) {
            q.peer = Some(addr_of_gid(q.attr.av.dgid));
        }
        q.state = new_state;
        if q.update_drain() {
            self.events.push(QpEvent {
                qpn,
                event_type: QpEvent::SQ_DRAINED,
            });
        }
        let Some(q) = self.qps.get_mut(&qpn) else {
            return Ok(());
        };
        if mask.contains(AttrMask::RQ_PSN) {
            q.resp.reset_psn(Psn::new(q.attr.rq_psn));
        }
        if mask.contains(AttrMask::SQ_PSN) {
            q.req.reset_psn(Psn::new(q.attr.sq_psn));
        }
        if mask.contains(AttrMask::RETRY_CNT) || mask.contains(AttrMask::RNR_RETRY) {
            q.req.reset_retries(&q.attr);
        }
        match new_state {
            QpState::Reset if old_state != QpState::Reset => {
                // Back to RESET: queues are emptied without completions,
                // and completions of this QP still in its CQs go too.
                q.req = requester::Requester::new();
                q.resp = responder::Responder::new();
                q.rq.clear();
                q.peer = None;
                let cqs = [q.init.send_cq, q.init.recv_cq];
                for cq in cqs {
                    if let Some(c) = self.cqs.get_mut(&cq.0) {
                        c.remove_qp(qpn);
                    }
                }
            }
            QpState::Err if old_state != QpState::Err => self.enter_error(qpn),
            _ => {}
        }
        self.touched(qpn);
        Ok(())
    }

    /// `ibv_post_recv`.
    pub fn post_recv(&mut self, qpn: u32, wr: RecvWr) -> VerbsResult<()> {
        const VERB: &str = "ibv_post_recv";
        let q = self
            .qps
            .get_mut(&qpn)
            .ok_or_else(|| err(VERB, Errno::EINVAL, "no such QP"))?;
        if q.init.srq.is_some() {
            return Err(err(VERB, Errno::EINVAL, "QP uses an SRQ"));
        }
        if q.state == QpState::Reset {
            return Err(err(VERB, Errno::EINVAL, "QP in RESET"));
        }
        // rxe's post_one_recv (and mlx5) test for a full queue first.
        if q.rq.len() >= q.init.cap.max_recv_wr as usize {
            return Err(err(VERB, Errno::ENOMEM, "receive queue full"));
        }
        if wr.sg_list.len() > q.init.cap.max_recv_sge as usize {
            return Err(err(VERB, Errno::EINVAL, "too many SGEs"));
        }
        let total = MemoryTable::sge_total(&wr.sg_list);
        let wqe = RecvWqe {
            wr_id: wr.wr_id,
            sg_list: wr.sg_list,
            total,
        };
        if q.state == QpState::Err {
            let wc = WorkCompletion::new(wqe.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, qpn);
            let cq = q.init.recv_cq;
            self.push_wc(cq, wc, false);
            return Ok(());
        }
        q.rq.push_back(wqe);
        Ok(())
    }

    /// `ibv_post_send`.
    pub fn post_send(&mut self, qpn: u32, wr: SendWr) -> VerbsResult<()> {
        const VERB: &str = "ibv_post_send";
        let q = self
            .qps
            .get_mut(&qpn)
            .ok_or_else(|| err(VERB, Errno::EINVAL, "no such QP"))?;
        let t = q.init.qp_type;
        let op_ok = match t {
            QpType::Rc => true,
            QpType::Uc => matches!(
                wr.opcode,
                SendOpcode::Send
                    | SendOpcode::SendWithImm
                    | SendOpcode::RdmaWrite
                    | SendOpcode::RdmaWriteWithImm
            ),
            QpType::Ud => matches!(wr.opcode, SendOpcode::Send | SendOpcode::SendWithImm),
        };
        if !op_ok {
            return Err(err(
                VERB,
                Errno::EINVAL,
                format!("{:?} not valid on {t:?}", wr.opcode),
            ));
        }
        if !matches!(q.state, QpState::Rts | QpState::Sqd | QpState::Err) {
            return Err(err(VERB, Errno::EINVAL, format!("QP in {}", q.state)));
        }
        if wr.sg_list.len() > q.init.cap.max_send_sge as usize {
            return Err(err(VERB, Errno::EINVAL, "too many SGEs"));
        }
        let inline = wr.flags.contains(crate::wr::SendFlags::INLINE);
        if inline && wr.opcode.is_read_or_atomic() {
            // rxe's validate_send_wr: the opcode has no WR_INLINE_MASK.
            return Err(err(
                VERB,
                Errno::EINVAL,
                format!("{:?} cannot carry inline data", wr.opcode),
            ));
        }
        let len = if inline {
            match &wr.inline_data {
                Some(d) if d.len() <= q.init.cap.max_inline_data as usize => d.len() as u64,
                Some(_) => {
                    return Err(err(
                        VERB,
                        Errno::EINVAL,
                        "inline data beyond max_inline_data",
                    ))
                }
                None => return Err(err(VERB, Errno::EINVAL, "INLINE without data")),
            }
        } else {
            MemoryTable::sge_total(&wr.sg_list)
        };
        if len > 1 << 31 {
            return Err(err(VERB, Errno::EINVAL, "message longer than 2^31 bytes"));
        }
        if wr.opcode.is_atomic() && len != 8 {
            return Err(err(VERB, Errno::EINVAL, "atomic needs one 8-byte SGE"));
        }
        if t == QpType::Ud {
            if wr.ud.is_none() {
                return Err(err(
                    VERB,
                    Errno::EINVAL,
                    "UD send without an address handle",
                ));
            }
            if q.state == QpState::Rts && len as usize > q.pmtu() {
                return Err(err(
                    VERB,
                    Errno::EINVAL,
                    "UD message larger than the path MTU",
                ));
            }
        }
        // As rxe's post_one_send: the WR is validated (EINVAL) before the
        // queue is found full (ENOMEM).
        if q.req.outstanding() >= q.init.cap.max_send_wr as usize {
            return Err(err(VERB, Errno::ENOMEM, "send queue full"));
        }
        if q.state == QpState::Err {
            let wc =
                WorkCompletion::new(wr.wr_id, WcStatus::WrFlushErr, wr.opcode.wc_opcode(), qpn);
            let cq = q.init.send_cq;
            self.push_wc(cq, wc, false);
            return Ok(());
        }
        q.req.post(wr, len as u32);
        self.touched(qpn);
        Ok(())
    }

    /// Deliver a completion; on overflow the QPs feeding that CQ go to ERR.
    fn push_wc(&mut self, cq: CqId, wc: WorkCompletion, solicited: bool) {
        let ok = self
            .cqs
            .get_mut(&cq.0)
            .map(|q| q.push(wc, solicited))
            .unwrap_or(false);
        if !ok {
            self.cq_overflowed(cq);
        }
    }

    /// A completion did not fit in `cq`: every QP feeding it goes to ERR
    /// (rxe's class G), and its outstanding WRs are flushed.
    fn cq_overflowed(&mut self, cq: CqId) {
        tracing::warn!(cq = cq.0, "CQ overflow: the QPs feeding it go to ERR");
        {
            let victims: Vec<u32> = self
                .qps
                .values()
                .filter(|q| {
                    (q.init.send_cq == cq || q.init.recv_cq == cq) && q.state != QpState::Err
                })
                .map(|q| q.qpn)
                .collect();
            for v in victims {
                if let Some(q) = self.qps.get_mut(&v) {
                    q.state = QpState::Err;
                }
                self.enter_error(v);
            }
        }
    }

    /// Move a QP to ERR: every outstanding send and receive WR completes
    /// with WR_FLUSH_ERR.
    fn enter_error(&mut self, qpn: u32) {
        let Some(q) = self.qps.get_mut(&qpn) else {
            return;
        };
        tracing::debug!(
            qpn = format_args!("{qpn:#x}"),
            "QP entered ERR: WRs flushed"
        );
        q.state = QpState::Err;
        if q.init.srq.is_some() {
            self.events.push(QpEvent {
                qpn,
                event_type: QpEvent::LAST_WQE_REACHED,
            });
        }
        let Some(q) = self.qps.get_mut(&qpn) else {
            return;
        };
        let send_cq = q.init.send_cq;
        let recv_cq = q.init.recv_cq;
        let sends = q.req.flush();
        let recvs: Vec<RecvWqe> = q.rq.drain(..).collect();
        let mut pending = q.resp.take_current_recv();
        pending.extend(recvs);
        for w in sends {
            let wc = WorkCompletion::new(
                w.wr.wr_id,
                WcStatus::WrFlushErr,
                w.wr.opcode.wc_opcode(),
                qpn,
            );
            self.push_wc_no_cascade(send_cq, wc);
        }
        for r in pending {
            let wc = WorkCompletion::new(r.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, qpn);
            self.push_wc_no_cascade(recv_cq, wc);
        }
        self.touched(qpn);
    }

    /// Completions of a QP already in ERR: an overflow changes nothing more.
    fn push_wc_no_cascade(&mut self, cq: CqId, wc: WorkCompletion) {
        if let Some(q) = self.cqs.get_mut(&cq.0) {
            q.push(wc, false);
        }
    }

    /// Take the asynchronous events raised since the last call.
    /// Every QP, in QPN order (`roxe stat`).
    pub fn qp_snapshots(&self) -> Vec<QpSnapshot> {
        let mut v: Vec<QpSnapshot> = self
            .qps
            .values()
            .map(|q| {
                let (next_psn, una, send_queue, retry_left, rnr_retry_left) = q.req.stat();
                QpSnapshot {
                    qpn: q.qpn,
                    qp_type: q.init.qp_type,
                    state: q.state,
                    peer: q.peer.map(|p| (p, q.attr.dest_qp_num)),
                    next_psn,
                    una,
                    epsn: q.resp.epsn(),
                    send_queue,
                    recv_queue: q.rq.len(),
                    retry_left,
                    rnr_retry_left,
                    drops: q.drops,
                }
            })
            .collect();
        v.sort_by_key(|q| q.qpn);
        v
    }

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
            if let Some(q) = self.qps.get_mut(&qpn) {
                let timeout = AckTimeout::new(q.attr.timeout).unwrap_or(AckTimeout::INFINITE);
                q.req.arm_retransmission(now, timeout);
            }
            self.stats.stalls_repaired += 1;
            tracing::error!(
                qpn = format_args!("{qpn:#x}"),
                "liveness watchdog: a message in flight had no timer (an engine bug); timer armed"
            );
            self.touched(qpn);
        }
        stalled.len()
    }

    /// Fire every timer due at `now`.
    pub fn handle_timeout(&mut self, now: Nanos) {
        if self.cm.poll_timeout().is_some_and(|d| d <= now) {
            self.cm.handle_timeout(now);
        }
        let due: Vec<u32> = self
            .timers
            .range(..=(now, u32::MAX))
            .map(|&(_, qpn)| qpn)
            .collect();
        for qpn in due {
            self.requester_timeout(qpn, now);
            self.touched(qpn);
        }
    }

    /// Produce the next packet to send into `buf` (at least 4096 + 64
    /// bytes), or `None` when no QP has anything to send now.
    pub fn poll_transmit(&mut self, now: Nanos, buf: &mut [u8]) -> Option<Transmit> {
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
            // Responses first: they unblock the peer's requester.
            if let Some(t) = self.responder_transmit(qpn, buf) {
                self.tx_cursor = next;
                return Some(self.finish_transmit(t, buf));
            }
            if let Some(t) = self.requester_transmit(qpn, now, buf) {
                self.tx_cursor = next;
                // Sending may arm the retransmission timer.
                self.reindex_timer(qpn);
                return Some(self.finish_transmit(t, buf));
            }
            // Nothing until a verb, a packet or a timer touches it again.
            self.active.remove(&qpn);
        }
    }

    /// Fill in the ICRC of a packet about to leave.
    fn finish_transmit(&mut self, mut t: Transmit, buf: &mut [u8]) -> Transmit {
        if let Some(port) = self.config.fixed_src_port {
            t.src_port = port;
        }
        let body = &buf[..t.len - ICRC_LEN];
        let c = match (self.config.addr, t.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                icrc::compute_linux_ipv4(s, d, t.src_port, roxe_wire::ROCEV2_PORT, body)
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                icrc::compute_ipv6(s, d, t.src_port, roxe_wire::ROCEV2_PORT, body)
            }
            (s, d) => icrc::compute_ipv6(
                Ipv6Addr::from(gid_of(s)),
                Ipv6Addr::from(gid_of(d)),
                t.src_port,
                roxe_wire::ROCEV2_PORT,
                body,
            ),
        };
        if let Ok(c) = c {
            roxe_wire::packet::set_icrc(&mut buf[..t.len], c);
        }
        self.stats.tx_packets += 1;
        t
    }

    /// Count a packet QP `qpn` dropped for `reason` (no borrow of the QP
    /// may be live).
    pub(crate) fn drop_on(&mut self, reason: DropReason, qpn: u32) {
        if let Some(q) = self.qps.get_mut(&qpn) {
            q.drops.add(reason);
        }
        self.stats.count_drop(reason, Some(qpn));
    }

    /// Handle one received RoCEv2 UDP payload (BTH .. ICRC) from `src`.
    pub fn handle_packet(&mut self, now: Nanos, src: IpAddr, src_port: u16, bytes: &[u8]) {
        self.handle_segment(now, src, src_port, bytes, 0);
    }

    /// [`handle_packet`](Self::handle_packet) for packet `index` of a
    /// datagram UDP GRO coalesced: from a Linux sender's GSO send it
    /// carried IPv4 identification `index` (from separate sends, 0), and
    /// the ICRC is checked for both.
    pub fn handle_segment(
        &mut self,
        now: Nanos,
        src: IpAddr,
        src_port: u16,
        bytes: &[u8],
        index: usize,
    ) {
        self.stats.rx_packets += 1;
        let Ok(pkt) = Packet::new_checked(bytes) else {
            self.stats.count_drop(DropReason::Malformed, None);
            return;
        };
        if !self.icrc_ok(src, src_port, &pkt, index) {
            self.stats.count_drop(DropReason::BadIcrc, None);
            return;
        }
        let qpn = pkt.bth().dest_qp();
        if qpn == roxe_wire::cm::GSI_QPN {
            self.gsi_receive(now, src, &pkt);
            return;
        }
        let Some(q) = self.qps.get_mut(&qpn) else {
            self.stats.count_drop(DropReason::NoQp, None);
            return;
        };
        let type_ok = matches!(
            (q.init.qp_type, pkt.opcode().transport()),
            (QpType::Rc, Transport::Rc) | (QpType::Uc, Transport::Uc) | (QpType::Ud, Transport::Ud)
        );
        let refused = if !type_ok {
            Some(DropReason::WrongTransport)
        } else if !q.can_receive() {
            Some(DropReason::WrongState)
        } else if q.init.qp_type != QpType::Ud && q.peer != Some(src) {
            Some(DropReason::WrongPeer)
        } else {
            None
        };
        if let Some(reason) = refused {
            q.drops.add(reason);
            self.stats.count_drop(reason, Some(qpn));
            return;
        }
        if pkt.opcode().is_response() {
            self.completer_receive(qpn, now, &pkt);
        } else {
            self.responder_receive(qpn, src, &pkt);
        }
        self.touched(qpn);
    }

    /// Handle one received RoCEv2 UDP payload (BTH .. ICRC) with the IP
    /// header (IPv4 with options, or IPv6) and the UDP header it arrived
    /// under, as a raw-socket driver reads them. The ICRC is verified over
    /// those headers as they were on the wire (IPv4 identification, flags
    /// and all), whatever the policy; a mismatch is dropped and counted in
    /// [`Stats::rx_bad_icrc`]. The rest is [`handle_packet`](Self::handle_packet)
    /// (use [`IcrcPolicy::WireHeaders`], so that it does not check again).
    pub fn handle_ip_packet(
        &mut self,
        now: Nanos,
        ip_header: &[u8],
        udp_header: &[u8],
        bytes: &[u8],
    ) {
        let src = match ip_header.first().map(|b| b >> 4) {
            Some(4) => roxe_wire::ip::Ipv4Header::new_checked(ip_header)
                .ok()
                .map(|h| IpAddr::V4(h.src())),
            Some(6) => roxe_wire::ip::Ipv6Header::new_checked(ip_header)
                .ok()
                .map(|h| IpAddr::V6(h.src())),
            _ => None,
        };
        let udp = roxe_wire::ip::UdpHeader::new_checked(udp_header).ok();
        let (Some(src), Some(udp)) = (src, udp) else {
            self.stats.rx_packets += 1;
            self.stats.count_drop(DropReason::Malformed, None);
            return;
        };
        // A malformed packet is left to `handle_packet` to count.
        if Packet::new_checked(bytes).is_ok()
            && !icrc::check(ip_header, udp_header, bytes).is_ok_and(|c| c.ok())
        {
            self.stats.rx_packets += 1;
            self.stats.count_drop(DropReason::BadIcrc, None);
            return;
        }
        self.handle_packet(now, src, udp.src_port(), bytes);
    }

    fn icrc_ok(
        &mut self,
        src: IpAddr,
        src_port: u16,
        pkt: &Packet<&[u8]>,
        gro_index: usize,
    ) -> bool {
        let body = pkt.icrc_covered();
        let port = roxe_wire::ROCEV2_PORT;
        // A Linux sender's IPv4 identification: 0 for one datagram, k for
        // segment k of a GSO send (which GRO hands over in order).
        let linux_ipv4 = |s, d| {
            let idents = [u16::try_from(gro_index).unwrap_or(0), 0];
            let n = if gro_index == 0 { 1 } else { 2 };
            idents[..n].iter().any(|&id| {
                icrc::compute_ipv4(s, d, src_port, port, id, body).is_ok_and(|c| c == pkt.icrc())
            })
        };
        let want = match (src, self.config.addr) {
            (IpAddr::V4(s), IpAddr::V4(d)) => match self.config.icrc_policy {
                IcrcPolicy::Off => return true,
                // Verified over the real headers by `handle_ip_packet`.
                IcrcPolicy::WireHeaders => return true,
                IcrcPolicy::Warn => {
                    if !linux_ipv4(s, d) {
                        self.stats.rx_icrc_unverified += 1;
                    }
                    return true;
                }
                IcrcPolicy::AssumeLinuxSender => return linux_ipv4(s, d),
            },
            (IpAddr::V6(s), IpAddr::V6(d)) => icrc::compute_ipv6(s, d, src_port, port, body),
            _ => return false,
        };
        want.is_ok_and(|c| c == pkt.icrc())
    }

    /// The GRH area a UD receive buffer starts with (IBA A17.4.5.2): the
    /// IPv6 header, or 20 zero bytes and then the IPv4 header.
    fn grh_area(&self, src: IpAddr, udp_payload_len: usize) -> [u8; 40] {
        let mut g = [0u8; 40];
        let udp_len = 8 + udp_payload_len;
        match (src, self.config.addr) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                let _ = roxe_wire::ip::Ipv4Repr {
                    src: s,
                    dst: d,
                    tos: 0,
                    ident: 0,
                    dont_frag: true,
                    ttl: 64,
                    payload_len: udp_len,
                }
                .emit(&mut g[20..]);
            }
            (s, d) => {
                let _ = roxe_wire::ip::Ipv6Repr {
                    src: Ipv6Addr::from(gid_of(s)),
                    dst: Ipv6Addr::from(gid_of(d)),
                    traffic_class: 0,
                    flow_label: 0,
                    hop_limit: 64,
                    payload_len: udp_len,
                }
                .emit(&mut g);
            }
        }
        g
    }
}

#[cfg(test)]
mod watchdog_tests {
    use super::*;
    use crate::qp_attr::AddressVector;
    use crate::types::AccessFlags;

    /// An RC QP in RTS facing 127.0.0.2 with one WRITE sent.
    fn engine_with_a_write_in_flight() -> (Engine, u32) {
        let mut e = Engine::new(EngineConfig::new("127.0.0.1".parse().unwrap()));
        let pd = e.alloc_pd();
        let cq = e.create_cq(16).unwrap();
        let mr = e
            .memory_mut()
            .register_owned(pd, 4096, AccessFlags::LOCAL_WRITE)
            .unwrap();
        let qpn = e
            .create_qp(QpInitAttr {
                qp_type: QpType::Rc,
                pd,
                send_cq: cq,
                recv_cq: cq,
                srq: None,
                cap: QpCap {
                    max_send_wr: 4,
                    max_recv_wr: 4,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                sq_sig_all: true,
            })
            .unwrap();
        let mut a = QpAttr {
            qp_state: QpState::Init,
            port_num: 1,
            ..QpAttr::default()
        };
        e.modify_qp(
            qpn,
            &a,
            AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS,
        )
        .unwrap();
        a.qp_state = QpState::Rtr;
        a.path_mtu = Mtu::Mtu1024;
        a.dest_qp_num = 0x12;
        a.av = AddressVector {
            dgid: gid_of("127.0.0.2".parse().unwrap()),
            is_global: true,
            hop_limit: 64,
            port_num: 1,
            ..AddressVector::default()
        };
        e.modify_qp(
            qpn,
            &a,
            AttrMask::STATE
                | AttrMask::AV
                | AttrMask::PATH_MTU
                | AttrMask::DEST_QPN
                | AttrMask::RQ_PSN
                | AttrMask::MAX_DEST_RD_ATOMIC
                | AttrMask::MIN_RNR_TIMER,
        )
        .unwrap();
        a.qp_state = QpState::Rts;
        a.timeout = 10;
        a.retry_cnt = 2;
        e.modify_qp(
            qpn,
            &a,
            AttrMask::STATE
                | AttrMask::SQ_PSN
                | AttrMask::TIMEOUT
                | AttrMask::RETRY_CNT
                | AttrMask::RNR_RETRY
                | AttrMask::MAX_QP_RD_ATOMIC,
        )
        .unwrap();
        let sge = Sge {
            addr: mr.addr,
            length: 100,
            lkey: mr.lkey,
        };
        let mut wr = SendWr::new(7, SendOpcode::RdmaWrite, vec![sge]);
        wr.rkey = 0x100;
        e.post_send(qpn, wr).unwrap();
        let mut buf = vec![0u8; 8192];
        assert!(e.poll_transmit(0, &mut buf).is_some());
        (e, qpn)
    }

    /// A `tracing` writer into a shared buffer.
    #[derive(Clone, Default)]
    struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
        type Writer = Captured;
        fn make_writer(&'a self) -> Captured {
            self.clone()
        }
    }

    #[test]
    fn retry_exhaustion_is_logged_with_its_qp() {
        let log = Captured::default();
        let sub = tracing_subscriber::fmt()
            .with_writer(log.clone())
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .finish();
        let (mut e, qpn) = engine_with_a_write_in_flight();
        tracing::subscriber::with_default(sub, || {
            let mut buf = vec![0u8; 8192];
            for _ in 0..10 {
                let Some(d) = e.poll_timeout() else { break };
                e.handle_timeout(d);
                while e.poll_transmit(d, &mut buf).is_some() {}
            }
        });
        let text = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
        let q = format!("qpn={qpn:#x}");
        assert!(
            text.lines()
                .any(|l| l.contains("retransmission timeout") && l.contains(&q)),
            "{text}"
        );
        assert!(
            text.lines()
                .any(|l| l.contains("go-back-N") && l.contains(&q)),
            "{text}"
        );
        assert!(
            text.lines().any(|l| l.contains("WARN")
                && l.contains("retries exhausted")
                && l.contains(&q)
                && l.contains("RetryExcErr")),
            "{text}"
        );
        assert!(text.contains("QP entered ERR"), "{text}");
    }

    #[test]
    fn a_healthy_engine_passes_the_audit() {
        let (mut e, _) = engine_with_a_write_in_flight();
        assert!(e.poll_timeout().is_some());
        assert_eq!(e.audit_liveness(1), 0);
        assert_eq!(e.stats().stalls_repaired, 0);
    }

    #[test]
    fn a_lost_timer_is_found_counted_and_rearmed() {
        let (mut e, qpn) = engine_with_a_write_in_flight();
        // Simulate the class of bug: the timer of a message in flight gone.
        if let Some(q) = e.qps.get_mut(&qpn) {
            q.req.arm_retransmission(0, AckTimeout::INFINITE);
            assert!(q.liveness_violation().is_some());
        }
        e.reindex_timer(qpn);
        assert_eq!(e.timers.len(), 0, "nothing would ever wake this QP");
        assert_eq!(e.audit_liveness(1_000), 1);
        assert_eq!(e.stats().stalls_repaired, 1);
        // The repair: a timer that retransmits, then gives up.
        let mut buf = vec![0u8; 8192];
        let mut status = None;
        for _ in 0..10 {
            let Some(d) = e.poll_timeout() else { break };
            e.handle_timeout(d);
            while e.poll_transmit(d, &mut buf).is_some() {}
            let mut wc = [WorkCompletion::new(0, WcStatus::Success, WcOpcode::Send, 0)];
            if e.poll_cq(e.qps[&qpn].init.send_cq, &mut wc).unwrap() == 1 {
                status = Some(wc[0].status);
                break;
            }
        }
        assert_eq!(status, Some(WcStatus::RetryExcErr));
        assert!(e.stats().tx_retransmits >= 2);
    }
}
