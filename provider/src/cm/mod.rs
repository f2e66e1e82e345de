//! The InfiniBand Communication Manager, sans-IO: the protocol rdma_cm
//! speaks over QP1 to set up and tear down connections (REQ, MRA, REJ, REP,
//! RTU, DREQ, DREP) and to resolve UD service IDs (SIDR_REQ/SIDR_REP).
//!
//! Like the transport engine it never reads a clock or touches a socket:
//! callers pass `now`, feed received MADs to [`Cm::handle_mad`], send what
//! [`Cm::poll_transmit`] yields (the engine wraps it in a UD packet to QP1),
//! fire [`Cm::handle_timeout`] at [`Cm::poll_timeout`], and take
//! [`CmEvent`]s from [`Cm::poll_event`]. Queue pairs are not its business:
//! as in librdmacm, the layer above moves the QP through RTR and RTS with
//! what the REQ/REP carried, then tells the CM to send the RTU or the REP.
//!
//! States and timers follow the kernel's `drivers/infiniband/core/cm.c`:
//! a REQ, REP or DREQ is resent every CM response timeout until answered
//! or `max_cm_retries` run out (REQ/REP: [`CmEvent::Unreachable`]; DREQ:
//! the connection is considered gone, [`CmEvent::Disconnected`]); an MRA
//! extends the wait; a REQ for a service nobody listens on is rejected with
//! reason 8 (invalid service ID); a disconnected connection stays in
//! TimeWait for a while (late DREQs get their DREP again) before
//! [`CmEvent::TimewaitExit`].

use crate::engine::Nanos;
use crate::types::{Errno, VerbsError, VerbsResult};
use roxe_wire::cm::{
    self, attr, reason, CmMad, CmMessage, DrepRepr, DreqRepr, MadHeaderRepr, MraRepr, RejRepr,
    RepRepr, ReqRepr, RtuRepr, SidrRepRepr, SidrReqRepr,
};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::hash::{Hash, Hasher};
use std::net::IpAddr;

mod refusal;
pub use refusal::{Refusal, RefusalCounts};

/// A connection's local communication ID (also its handle here).
pub type ConnId = u32;
/// A listener's handle.
pub type ListenId = u32;

/// SIDR_REP status: the service ID is not supported (nobody listens).
pub const SIDR_UNSUPPORTED: u8 = 1;
/// SIDR_REP status: the request was rejected.
pub const SIDR_REJECT: u8 = 2;

/// The CM's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmConfig {
    /// CM response timeout exponent: a message is resent after
    /// 4.096 µs × 2^t (rdma_cm's CMA_CM_RESPONSE_TIMEOUT is 20: 4.3 s).
    pub response_timeout: u8,
    /// Resends before giving up (rdma_cm's CMA_MAX_CM_RETRIES: 15).
    pub max_retries: u8,
    /// How long a closed connection stays in TimeWait.
    pub timewait_ns: Nanos,
    /// The local CA GUID put in REQ and REP.
    pub ca_guid: u64,
    /// The key of the communication and transaction IDs: random (the
    /// engine draws it from the OS), so that an observer of one
    /// connection cannot predict the IDs of another (a forged REJ, DREQ
    /// or DREP needs them).
    pub id_key: u128,
    /// On a shared address, the device's slot: the top byte of every
    /// communication and SIDR request ID it picks, by which the kernel
    /// steers the answers to this process (`driver/steering`).
    pub id_slot: Option<u8>,
    /// The device's address: a REQ's path and CMA header must name it.
    /// `None` (a CM tested on its own) skips the address checks.
    pub local_addr: Option<IpAddr>,
}

impl Default for CmConfig {
    fn default() -> Self {
        CmConfig {
            response_timeout: 20,
            max_retries: 15,
            timewait_ns: 1_000_000_000,
            ca_guid: 0,
            id_key: 0x5eed_1234,
            id_slot: None,
            local_addr: None,
        }
    }
}

impl CmConfig {
    /// The resend interval for a response timeout exponent.
    pub fn timeout_ns(exp: u8) -> Nanos {
        4096u64 << exp.min(31)
    }
}

/// What the CM tells its user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmEvent {
    /// A REQ for a service `listen` listens on: answer with
    /// [`Cm::accept`] or [`Cm::reject`].
    ConnectRequest {
        /// The listener.
        listen: ListenId,
        /// The new connection.
        conn: ConnId,
        /// The requester's device address.
        peer: IpAddr,
        /// The REQ as received.
        req: Box<ReqRepr>,
    },
    /// The active side got the REP: move the QP to RTR/RTS with it, then
    /// call [`Cm::establish`] (which sends the RTU), or [`Cm::reject`].
    ConnectResponse {
        /// The connection.
        conn: ConnId,
        /// The REP as received.
        rep: Box<RepRepr>,
    },
    /// The passive side got the RTU (or the active side sent it).
    Established {
        /// The connection.
        conn: ConnId,
    },
    /// The peer rejected the REQ or the REP.
    Rejected {
        /// The connection.
        conn: ConnId,
        /// The REJ reason (`roxe_wire::cm::reason`).
        reason: u16,
        /// The REJ's private data.
        private_data: Vec<u8>,
    },
    /// The REQ or REP went unanswered through every retry.
    Unreachable {
        /// The connection.
        conn: ConnId,
    },
    /// The connection is closed: the peer's DREQ arrived, our DREQ was
    /// answered, or it went unanswered through every retry.
    Disconnected {
        /// The connection.
        conn: ConnId,
    },
    /// TimeWait is over; the connection's ID may be destroyed.
    TimewaitExit {
        /// The connection.
        conn: ConnId,
    },
    /// A SIDR_REQ for a service `listen` listens on: answer with
    /// [`Cm::sidr_reply`].
    SidrRequest {
        /// The listener.
        listen: ListenId,
        /// The request's handle.
        conn: ConnId,
        /// The requester's device address.
        peer: IpAddr,
        /// The SIDR_REQ as received.
        req: Box<SidrReqRepr>,
    },
    /// The SIDR_REP for our SIDR_REQ (check its status), or
    /// `rep: None` when every retry went unanswered.
    SidrResponse {
        /// The request's handle.
        conn: ConnId,
        /// The reply.
        rep: Option<Box<SidrRepRepr>>,
    },
}

impl CmEvent {
    /// The connection the event is about.
    pub fn conn(&self) -> ConnId {
        match self {
            CmEvent::ConnectRequest { conn, .. }
            | CmEvent::ConnectResponse { conn, .. }
            | CmEvent::Established { conn }
            | CmEvent::Rejected { conn, .. }
            | CmEvent::Unreachable { conn }
            | CmEvent::Disconnected { conn }
            | CmEvent::TimewaitExit { conn }
            | CmEvent::SidrRequest { conn, .. }
            | CmEvent::SidrResponse { conn, .. } => *conn,
        }
    }
}

/// Counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CmStats {
    /// MADs handed to [`Cm::handle_mad`].
    pub rx_mads: u64,
    /// Dropped: not a well-formed CM MAD.
    pub rx_malformed: u64,
    /// Dropped: no connection matches (wrong IDs, wrong peer, wrong state).
    pub rx_unmatched: u64,
    /// MADs produced.
    pub tx_mads: u64,
    /// Of those, resends after a timeout.
    pub tx_retries: u64,
    /// REQs rejected because nobody listens on their service ID.
    pub rejected_no_listener: u64,
    /// REQs dropped because the listener's backlog was full (the
    /// requester resends them, as a TCP SYN meets a full queue).
    pub dropped_backlog_full: u64,
    /// REQs dropped because they belong to a connection already closed
    /// here (stale duplicates).
    pub rx_stale_req: u64,
    /// REQs and SIDR_REQs refused before they changed anything (answered
    /// with a REJ or SIDR_REP where the kernel answers), by reason.
    pub refused: RefusalCounts,
}

/// Where a connection is (the kernel's `ib_cm_state`, as far as rdma_cm
/// needs it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnState {
    /// Active: REQ sent, waiting for REP.
    ReqSent,
    /// Passive: REQ received, waiting for the user's accept or reject.
    ReqRcvd,
    /// Active: REP received, waiting for the user (QP to RTS, then RTU).
    RepRcvd,
    /// Passive: REP sent, waiting for RTU.
    RepSent,
    /// Connected.
    Established,
    /// DREQ sent, waiting for DREP.
    DreqSent,
    /// DREQ received; the user's disconnect sends the DREP.
    DreqRcvd,
    /// Closed; late DREQs are answered until it ends.
    TimeWait,
    /// Rejected, failed or over: only destroy remains.
    Idle,
    /// Active SIDR: SIDR_REQ sent.
    SidrReqSent,
    /// Passive SIDR: SIDR_REQ received, waiting for the user's reply.
    SidrReqRcvd,
}

#[derive(Debug)]
struct Conn {
    state: ConnState,
    peer: IpAddr,
    remote_id: u32,
    tid: u64,
    /// The message resent on timeout, if one is outstanding.
    pending: Option<CmMad>,
    deadline: Option<Nanos>,
    retries_left: u8,
    /// The resend interval (the peer's, from the REQ, for REP).
    interval: Nanos,
    /// The last REP or DREP sent, resent for a duplicate REQ/DREQ.
    last_reply: Option<CmMad>,
    remote_qpn: u32,
    /// The listener whose backlog this passive request counts against.
    listen: Option<ListenId>,
}

#[derive(Debug, Clone, Copy)]
struct Listener {
    service_id: u64,
    /// Requests not yet accepted or rejected that it may hold.
    backlog: u32,
    pending: u32,
}

/// How many closed passive connections [`Cm`] remembers to recognise
/// stale duplicate REQs (about 24 bytes each).
const CLOSED_REMEMBERED: usize = 4096;

/// Communication and transaction IDs nobody can predict from the ones
/// seen: a keyed hash (SipHash) of a counter under [`CmConfig::id_key`].
#[derive(Debug)]
struct IdGen {
    key: u128,
    counter: u64,
}

impl IdGen {
    fn next(&mut self) -> u64 {
        self.counter = self.counter.wrapping_add(1);
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (self.key, self.counter).hash(&mut h);
        h.finish()
    }
}

/// One device's Communication Manager.
#[derive(Debug)]
pub struct Cm {
    config: CmConfig,
    ids: IdGen,
    listeners: HashMap<u64, ListenId>,
    /// Each listener's service ID and backlog.
    listener_ids: BTreeMap<ListenId, Listener>,
    conns: HashMap<ConnId, Conn>,
    /// Passive connections by (peer, peer's comm ID), to spot resent REQs.
    by_remote: HashMap<(IpAddr, u32), ConnId>,
    /// (peer, peer's comm ID) of the last [`CLOSED_REMEMBERED`] passive
    /// connections destroyed: a REQ naming one is a stale duplicate, not a
    /// new request (the kernel keeps such IDs in its timewait list and
    /// answers them with REJ "stale connection").
    closed: HashSet<(IpAddr, u32)>,
    closed_order: VecDeque<(IpAddr, u32)>,
    timers: BTreeSet<(Nanos, ConnId)>,
    /// The service ID of each SIDR_REQ awaiting the user's reply.
    sidr_services: HashMap<ConnId, u64>,
    tx: VecDeque<(IpAddr, CmMad)>,
    events: VecDeque<CmEvent>,
    stats: CmStats,
}

fn err(verb: &'static str, errno: Errno, detail: impl Into<String>) -> VerbsError {
    VerbsError::new(verb, errno, detail)
}

/// Copy `data` into a fixed private-data field; EINVAL when it is longer.
fn private<const N: usize>(verb: &'static str, data: &[u8]) -> VerbsResult<[u8; N]> {
    if data.len() > N {
        return Err(err(
            verb,
            Errno::EINVAL,
            format!("{} bytes of private data, at most {N}", data.len()),
        ));
    }
    let mut out = [0u8; N];
    out[..data.len()].copy_from_slice(data);
    Ok(out)
}

impl Cm {
    /// A CM with `config`.
    pub fn new(config: CmConfig) -> Cm {
        Cm {
            config,
            ids: IdGen {
                key: config.id_key,
                counter: 0,
            },
            listeners: HashMap::new(),
            listener_ids: BTreeMap::new(),
            conns: HashMap::new(),
            by_remote: HashMap::new(),
            closed: HashSet::new(),
            closed_order: VecDeque::new(),
            timers: BTreeSet::new(),
            sidr_services: HashMap::new(),
            tx: VecDeque::new(),
            events: VecDeque::new(),
            stats: CmStats::default(),
        }
    }

    /// Counters.
    pub fn stats(&self) -> CmStats {
        self.stats
    }

    /// The state of connection `conn`.
    pub fn state(&self, conn: ConnId) -> Option<ConnState> {
        self.conns.get(&conn).map(|c| c.state)
    }

    /// A communication ID distinct from every live one and never 0.
    fn alloc_id(&mut self) -> u32 {
        loop {
            let mut id = self.ids.next() as u32;
            if let Some(slot) = self.config.id_slot {
                id = (id & 0x00FF_FFFF) | (u32::from(slot) << 24);
            }
            if id != 0 && !self.conns.contains_key(&id) && !self.listener_ids.contains_key(&id) {
                return id;
            }
        }
    }

    fn alloc_tid(&mut self) -> u64 {
        self.ids.next()
    }

    /// Whether a listener takes REQs to `service_id`.
    pub fn listens(&self, service_id: u64) -> bool {
        self.listeners.contains_key(&service_id)
    }

    /// Listen for REQs and SIDR_REQs to `service_id`. EADDRINUSE if
    /// something listens there already (as `rdma_listen` on a taken port).
    pub fn listen(&mut self, service_id: u64) -> VerbsResult<ListenId> {
        if self.listeners.contains_key(&service_id) {
            return Err(err(
                "rdma_listen",
                Errno(98),
                format!("service ID {service_id:#018x} already has a listener"),
            ));
        }
        let id = self.alloc_id();
        tracing::debug!(service_id = format_args!("{service_id:#x}"), "CM listen");
        self.listeners.insert(service_id, id);
        self.listener_ids.insert(
            id,
            Listener {
                service_id,
                backlog: 1024,
                pending: 0,
            },
        );
        Ok(id)
    }

    /// How many requests `listen` may hold unanswered (`rdma_listen`'s
    /// backlog; at least 1). Further REQs are dropped, not rejected: the
    /// requester resends them until there is room or its retries run out.
    pub fn set_backlog(&mut self, listen: ListenId, backlog: u32) {
        if let Some(l) = self.listener_ids.get_mut(&listen) {
            l.backlog = backlog.max(1);
        }
    }

    /// A passive request left REQ_RCVD (answered or destroyed).
    fn release_backlog(&mut self, conn: ConnId) {
        let Some(l) = self.conns.get_mut(&conn).and_then(|c| c.listen.take()) else {
            return;
        };
        if let Some(l) = self.listener_ids.get_mut(&l) {
            l.pending = l.pending.saturating_sub(1);
        }
    }

    /// Stop listening.
    pub fn unlisten(&mut self, listen: ListenId) {
        if let Some(l) = self.listener_ids.remove(&listen) {
            tracing::debug!(
                service_id = format_args!("{:#x}", l.service_id),
                "CM unlisten"
            );
            self.listeners.remove(&l.service_id);
        }
    }

    fn send(&mut self, peer: IpAddr, mad: CmMad) {
        self.stats.tx_mads += 1;
        tracing::debug!(%peer, msg = mad.message.name(), "CM send");
        self.tx.push_back((peer, mad));
    }

    fn set_timer(&mut self, conn: ConnId, deadline: Option<Nanos>) {
        if let Some(c) = self.conns.get_mut(&conn) {
            if let Some(old) = c.deadline {
                self.timers.remove(&(old, conn));
            }
            c.deadline = deadline;
            if let Some(d) = deadline {
                self.timers.insert((d, conn));
            }
        }
    }

    /// Send `mad` now and again every `interval` until answered.
    fn send_reliably(&mut self, now: Nanos, conn: ConnId, mad: CmMad, interval: Nanos) {
        let retries = match &mad.message {
            // The REQ says how often it may be resent.
            CmMessage::Req(r) => r.max_cm_retries,
            _ => self.config.max_retries,
        };
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        let peer = c.peer;
        c.pending = Some(mad.clone());
        c.retries_left = retries;
        c.interval = interval;
        self.send(peer, mad);
        self.set_timer(conn, Some(now + interval));
    }

    fn answered(&mut self, conn: ConnId) {
        if let Some(c) = self.conns.get_mut(&conn) {
            c.pending = None;
        }
        self.set_timer(conn, None);
    }

    fn new_conn(&mut self, state: ConnState, peer: IpAddr, remote_id: u32, tid: u64) -> ConnId {
        let id = self.alloc_id();
        self.conns.insert(
            id,
            Conn {
                state,
                peer,
                remote_id,
                tid,
                pending: None,
                deadline: None,
                retries_left: 0,
                interval: CmConfig::timeout_ns(self.config.response_timeout),
                last_reply: None,
                remote_qpn: 0,
                listen: None,
            },
        );
        id
    }

    /// `rdma_connect`: send `req` (its `local_comm_id` is filled in; its
    /// CM timeouts and retries default to the config's when zero) to the
    /// device at `peer`. Returns the connection.
    pub fn connect(&mut self, now: Nanos, peer: IpAddr, mut req: ReqRepr) -> ConnId {
        let tid = self.alloc_tid();
        let conn = self.new_conn(ConnState::ReqSent, peer, 0, tid);
        req.local_comm_id = conn;
        if req.local_cm_response_timeout == 0 {
            req.local_cm_response_timeout = self.config.response_timeout;
        }
        if req.remote_cm_response_timeout == 0 {
            req.remote_cm_response_timeout = self.config.response_timeout;
        }
        if req.max_cm_retries == 0 {
            req.max_cm_retries = self.config.max_retries;
        }
        if req.local_ca_guid == 0 {
            req.local_ca_guid = self.config.ca_guid;
        }
        // The peer answers within its own response timeout.
        let interval = CmConfig::timeout_ns(req.remote_cm_response_timeout);
        let mad = CmMad {
            header: MadHeaderRepr::cm(attr::REQ, tid),
            message: CmMessage::Req(req),
        };
        self.send_reliably(now, conn, mad, interval);
        conn
    }

    fn conn_in(
        &mut self,
        verb: &'static str,
        conn: ConnId,
        states: &[ConnState],
    ) -> VerbsResult<&mut Conn> {
        let c = self
            .conns
            .get_mut(&conn)
            .ok_or_else(|| err(verb, Errno::EINVAL, "no such connection"))?;
        if !states.contains(&c.state) {
            return Err(err(
                verb,
                Errno::EINVAL,
                format!("connection in state {:?}", c.state),
            ));
        }
        Ok(c)
    }

    /// `rdma_accept`: answer a [`CmEvent::ConnectRequest`] with `rep`
    /// (IDs filled in). The connection is established when the RTU comes.
    pub fn accept(&mut self, now: Nanos, conn: ConnId, mut rep: RepRepr) -> VerbsResult<()> {
        let guid = self.config.ca_guid;
        self.conn_in("rdma_accept", conn, &[ConnState::ReqRcvd])?;
        self.release_backlog(conn);
        let c = self.conn_in("rdma_accept", conn, &[ConnState::ReqRcvd])?;
        c.state = ConnState::RepSent;
        rep.local_comm_id = conn;
        rep.remote_comm_id = c.remote_id;
        if rep.local_ca_guid == 0 {
            rep.local_ca_guid = guid;
        }
        let mad = CmMad {
            header: MadHeaderRepr::cm(attr::REP, c.tid),
            message: CmMessage::Rep(rep),
        };
        c.last_reply = Some(mad.clone());
        let interval = c.interval;
        self.send_reliably(now, conn, mad, interval);
        Ok(())
    }

    /// `rdma_reject`: refuse a REQ (passive) or a REP (active) with
    /// reason 28 (consumer reject) and `private_data` (at most 148 bytes).
    pub fn reject(&mut self, conn: ConnId, private_data: &[u8]) -> VerbsResult<()> {
        self.reject_with_reason(conn, reason::CONSUMER_DEFINED, private_data)
    }

    /// [`reject`](Self::reject) with another REJ reason (librdmacm's
    /// `rdma_reject_ece` sends 35, vendor option not supported).
    pub fn reject_with_reason(
        &mut self,
        conn: ConnId,
        why: u16,
        private_data: &[u8],
    ) -> VerbsResult<()> {
        let pd = private::<{ cm::REJ_PRIVATE_DATA }>("rdma_reject", private_data)?;
        self.conn_in(
            "rdma_reject",
            conn,
            &[ConnState::ReqRcvd, ConnState::RepRcvd],
        )?;
        self.release_backlog(conn);
        let c = self.conn_in(
            "rdma_reject",
            conn,
            &[ConnState::ReqRcvd, ConnState::RepRcvd],
        )?;
        let msg_rejected = if c.state == ConnState::ReqRcvd { 0 } else { 1 };
        let (peer, remote, tid) = (c.peer, c.remote_id, c.tid);
        c.state = ConnState::Idle;
        let rej = reject_message(conn, remote, msg_rejected, why, pd);
        self.send(
            peer,
            CmMad {
                header: MadHeaderRepr::cm(attr::REJ, tid),
                message: CmMessage::Rej(rej),
            },
        );
        self.answered(conn);
        Ok(())
    }

    /// The active side's QP is ready (after [`CmEvent::ConnectResponse`]):
    /// send the RTU; the connection is established.
    pub fn establish(&mut self, conn: ConnId, private_data: &[u8]) -> VerbsResult<()> {
        let pd = private::<{ cm::RTU_PRIVATE_DATA }>("rdma_establish", private_data)?;
        let c = self.conn_in("rdma_establish", conn, &[ConnState::RepRcvd])?;
        c.state = ConnState::Established;
        let (peer, remote, tid) = (c.peer, c.remote_id, c.tid);
        self.send(
            peer,
            CmMad {
                header: MadHeaderRepr::cm(attr::RTU, tid),
                message: CmMessage::Rtu(RtuRepr {
                    local_comm_id: conn,
                    remote_comm_id: remote,
                    private_data: pd,
                }),
            },
        );
        self.events.push_back(CmEvent::Established { conn });
        Ok(())
    }

    /// `rdma_disconnect`: from Established, send a DREQ (the connection
    /// closes when the DREP comes, or after the retries); after the peer's
    /// DREQ, send the DREP.
    pub fn disconnect(&mut self, now: Nanos, conn: ConnId, private_data: &[u8]) -> VerbsResult<()> {
        const VERB: &str = "rdma_disconnect";
        let c = self.conn_in(
            VERB,
            conn,
            &[
                ConnState::Established,
                ConnState::DreqRcvd,
                ConnState::RepSent,
            ],
        )?;
        match c.state {
            ConnState::DreqRcvd => {
                let pd = private::<{ cm::DREP_PRIVATE_DATA }>(VERB, private_data)?;
                let (peer, remote, tid) = (c.peer, c.remote_id, c.tid);
                let mad = CmMad {
                    header: MadHeaderRepr::cm(attr::DREP, tid),
                    message: CmMessage::Drep(DrepRepr {
                        local_comm_id: conn,
                        remote_comm_id: remote,
                        private_data: pd,
                    }),
                };
                c.last_reply = Some(mad.clone());
                self.send(peer, mad);
                self.enter_timewait(now, conn);
            }
            _ => {
                let pd = private::<{ cm::DREQ_PRIVATE_DATA }>(VERB, private_data)?;
                let (peer_qpn, remote) = (c.remote_qpn, c.remote_id);
                c.state = ConnState::DreqSent;
                let tid = self.alloc_tid();
                let mut dreq = DreqRepr {
                    local_comm_id: conn,
                    remote_comm_id: remote,
                    remote_qpn: peer_qpn,
                    ..DreqRepr::default()
                };
                dreq.private_data = pd;
                let mad = CmMad {
                    header: MadHeaderRepr::cm(attr::DREQ, tid),
                    message: CmMessage::Dreq(dreq),
                };
                let interval = CmConfig::timeout_ns(self.config.response_timeout);
                self.send_reliably(now, conn, mad, interval);
            }
        }
        Ok(())
    }

    fn enter_timewait(&mut self, now: Nanos, conn: ConnId) {
        if let Some(c) = self.conns.get_mut(&conn) {
            c.state = ConnState::TimeWait;
            c.pending = None;
        }
        self.set_timer(conn, Some(now + self.config.timewait_ns));
    }

    /// `rdma_resolve_route` for UD (`RDMA_PS_UDP`/`IPOIB`): ask the device
    /// at `peer` for the QPN and Q_Key behind `service_id`.
    pub fn sidr_request(
        &mut self,
        now: Nanos,
        peer: IpAddr,
        service_id: u64,
        private_data: &[u8],
    ) -> VerbsResult<ConnId> {
        let pd = private::<{ cm::SIDR_REQ_PRIVATE_DATA }>("rdma_resolve_route", private_data)?;
        let tid = self.alloc_tid();
        let conn = self.new_conn(ConnState::SidrReqSent, peer, 0, tid);
        let mut req = SidrReqRepr {
            request_id: conn,
            pkey: 0xffff,
            service_id,
            ..SidrReqRepr::default()
        };
        req.private_data = pd;
        let mad = CmMad {
            header: MadHeaderRepr::cm(attr::SIDR_REQ, tid),
            message: CmMessage::SidrReq(req),
        };
        let interval = CmConfig::timeout_ns(self.config.response_timeout);
        self.send_reliably(now, conn, mad, interval);
        Ok(conn)
    }

    /// Answer a [`CmEvent::SidrRequest`]: status 0 with the QPN and Q_Key
    /// of the UD QP behind the service, or a failure status.
    pub fn sidr_reply(
        &mut self,
        conn: ConnId,
        status: u8,
        qpn: u32,
        qkey: u32,
        private_data: &[u8],
    ) -> VerbsResult<()> {
        let pd = private::<{ cm::SIDR_REP_PRIVATE_DATA }>("rdma_accept", private_data)?;
        let c = self.conn_in("rdma_accept", conn, &[ConnState::SidrReqRcvd])?;
        let (peer, remote, tid) = (c.peer, c.remote_id, c.tid);
        c.state = ConnState::Idle;
        let mut rep = SidrRepRepr {
            request_id: remote,
            status,
            qpn,
            qkey,
            ..SidrRepRepr::default()
        };
        rep.private_data = pd;
        if let Some(sid) = self.sidr_services.remove(&conn) {
            rep.service_id = sid;
        }
        self.send(
            peer,
            CmMad {
                header: MadHeaderRepr::cm(attr::SIDR_REP, tid),
                message: CmMessage::SidrRep(rep),
            },
        );
        Ok(())
    }

    /// Forget connection `conn` (`rdma_destroy_id`). A connection that is
    /// still up is not told: the peer finds out by its own timeouts, as
    /// with the kernel's CM when a process dies.
    pub fn destroy(&mut self, conn: ConnId) {
        self.farewell(conn);
        self.set_timer(conn, None);
        self.release_backlog(conn);
        self.sidr_services.remove(&conn);
        if let Some(c) = self.conns.remove(&conn) {
            let key = (c.peer, c.remote_id);
            if self.by_remote.get(&key) == Some(&conn) {
                self.by_remote.remove(&key);
                if self.closed_order.len() >= CLOSED_REMEMBERED {
                    if let Some(old) = self.closed_order.pop_front() {
                        self.closed.remove(&old);
                    }
                }
                if self.closed.insert(key) {
                    self.closed_order.push_back(key);
                }
            }
        }
    }

    /// What the kernel's `cm_destroy_id` sends for a connection destroyed
    /// in mid-life, so the peer is not left resending: a REJ for a request
    /// or reply not yet answered, a DREQ for a live connection, the DREP a
    /// received DREQ is owed.
    fn farewell(&mut self, conn: ConnId) {
        let Some(c) = self.conns.get(&conn) else {
            return;
        };
        let (peer, remote, tid, state) = (c.peer, c.remote_id, c.tid, c.state);
        let message = match state {
            ConnState::ReqRcvd | ConnState::RepRcvd => {
                let msg_rejected = if state == ConnState::ReqRcvd { 0 } else { 1 };
                let rej = reject_message(
                    conn,
                    remote,
                    msg_rejected,
                    reason::CONSUMER_DEFINED,
                    [0; cm::REJ_PRIVATE_DATA],
                );
                (attr::REJ, tid, CmMessage::Rej(rej))
            }
            ConnState::Established | ConnState::RepSent => {
                let dreq = DreqRepr {
                    local_comm_id: conn,
                    remote_comm_id: remote,
                    remote_qpn: c.remote_qpn,
                    ..DreqRepr::default()
                };
                let tid = self.alloc_tid();
                (attr::DREQ, tid, CmMessage::Dreq(dreq))
            }
            ConnState::DreqRcvd => (
                attr::DREP,
                tid,
                CmMessage::Drep(DrepRepr {
                    local_comm_id: conn,
                    remote_comm_id: remote,
                    private_data: [0; cm::DREP_PRIVATE_DATA],
                }),
            ),
            _ => return,
        };
        let (attr, tid, message) = message;
        self.send(
            peer,
            CmMad {
                header: MadHeaderRepr::cm(attr, tid),
                message,
            },
        );
    }

    /// Whether a MAD waits to be sent.
    pub fn has_transmit(&self) -> bool {
        !self.tx.is_empty()
    }

    /// The next MAD to send and its destination device.
    pub fn poll_transmit(&mut self) -> Option<(IpAddr, CmMad)> {
        self.tx.pop_front()
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<CmEvent> {
        self.events.pop_front()
    }

    /// The peer and its QPN of a connection the peer's DREQ closed and
    /// the user has not disconnected since.
    pub fn dreq_received_from(&self, conn: ConnId) -> Option<(IpAddr, u32)> {
        self.conns
            .get(&conn)
            .filter(|c| c.state == ConnState::DreqRcvd)
            .map(|c| (c.peer, c.remote_qpn))
    }

    /// True when events are waiting.
    pub fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// The earliest timer.
    pub fn poll_timeout(&self) -> Option<Nanos> {
        self.timers.first().map(|&(d, _)| d)
    }

    /// Fire every timer due at `now`.
    pub fn handle_timeout(&mut self, now: Nanos) {
        let due: Vec<ConnId> = self
            .timers
            .range(..=(now, ConnId::MAX))
            .map(|&(_, c)| c)
            .collect();
        for conn in due {
            self.set_timer(conn, None);
            let Some(c) = self.conns.get_mut(&conn) else {
                continue;
            };
            if c.state == ConnState::TimeWait {
                c.state = ConnState::Idle;
                self.events.push_back(CmEvent::TimewaitExit { conn });
                continue;
            }
            let Some(mad) = c.pending.clone() else {
                continue;
            };
            if c.retries_left > 0 {
                c.retries_left -= 1;
                let (peer, interval) = (c.peer, c.interval);
                self.stats.tx_retries += 1;
                self.send(peer, mad);
                self.set_timer(conn, Some(now + interval));
                continue;
            }
            // Out of retries.
            let state = c.state;
            c.pending = None;
            match state {
                ConnState::ReqSent | ConnState::RepSent => {
                    tracing::debug!(
                        conn = format_args!("{conn:#x}"),
                        "CM retries exhausted: unreachable"
                    );
                    c.state = ConnState::Idle;
                    self.events.push_back(CmEvent::Unreachable { conn });
                }
                ConnState::DreqSent => {
                    self.events.push_back(CmEvent::Disconnected { conn });
                    self.enter_timewait(now, conn);
                }
                ConnState::SidrReqSent => {
                    c.state = ConnState::Idle;
                    self.events
                        .push_back(CmEvent::SidrResponse { conn, rep: None });
                }
                _ => {}
            }
        }
    }

    /// A MAD received on QP1 from the device at `from` (the 256 bytes
    /// after the DETH).
    pub fn handle_mad(&mut self, now: Nanos, from: IpAddr, mad: &[u8]) {
        self.stats.rx_mads += 1;
        let Ok(m) = CmMad::parse(mad) else {
            self.stats.rx_malformed += 1;
            return;
        };
        if m.header.mgmt_class != cm::MGMT_CLASS_CM || m.header.method != cm::METHOD_SEND {
            self.stats.rx_malformed += 1;
            return;
        }
        if let Err(r) = refusal::check_class_version(m.header.class_version) {
            self.stats.refused.count(r);
            return;
        }
        let tid = m.header.tid;
        tracing::debug!(peer = %from, msg = m.message.name(), "CM receive");
        let handled = match m.message {
            CmMessage::Req(req) => self.on_req(now, from, tid, req),
            CmMessage::Rep(rep) => self.on_rep(from, rep),
            CmMessage::Rtu(rtu) => self.on_rtu(from, &rtu),
            CmMessage::Rej(rej) => self.on_rej(from, rej),
            CmMessage::Mra(mra) => self.on_mra(now, from, &mra),
            CmMessage::Dreq(dreq) => self.on_dreq(from, tid, &dreq),
            CmMessage::Drep(drep) => self.on_drep(now, from, &drep),
            CmMessage::SidrReq(req) => self.on_sidr_req(from, tid, req),
            CmMessage::SidrRep(rep) => self.on_sidr_rep(from, rep),
            CmMessage::Other(_) => false,
        };
        if !handled {
            self.stats.rx_unmatched += 1;
            tracing::debug!(peer = %from, "CM message matches no connection: dropped");
        }
    }

    /// The connection `local` if it exists, talks to `from` and (when
    /// known) has the peer's `remote` ID.
    fn matching(&mut self, from: IpAddr, local: u32, remote: Option<u32>) -> Option<&mut Conn> {
        let c = self.conns.get_mut(&local)?;
        if c.peer != from {
            return None;
        }
        if let Some(r) = remote {
            if c.remote_id != 0 && c.remote_id != r {
                return None;
            }
        }
        Some(c)
    }

    fn on_req(&mut self, now: Nanos, from: IpAddr, tid: u64, req: ReqRepr) -> bool {
        if self.closed.contains(&(from, req.local_comm_id)) {
            // A duplicate of the REQ of a connection already closed here
            // (delayed or duplicated on the way): never a new request.
            self.stats.rx_stale_req += 1;
            tracing::debug!(peer = %from, "CM REQ of a closed connection: dropped");
            return true;
        }
        if let Some(&conn) = self.by_remote.get(&(from, req.local_comm_id)) {
            // A resent REQ: answer again what was answered.
            if let Some(c) = self.conns.get(&conn) {
                if let Some(rep) = c.last_reply.clone() {
                    if c.state == ConnState::RepSent {
                        self.send(from, rep);
                    }
                }
            }
            return true;
        }
        let Some(&listen) = self.listeners.get(&req.service_id) else {
            // Nobody listens: reject, as the kernel's CM does.
            self.stats.rejected_no_listener += 1;
            let rej = reject_message(
                0,
                req.local_comm_id,
                0,
                reason::INVALID_SERVICE_ID,
                [0; cm::REJ_PRIVATE_DATA],
            );
            self.send(
                from,
                CmMad {
                    header: MadHeaderRepr::cm(attr::REJ, tid),
                    message: CmMessage::Rej(rej),
                },
            );
            return true;
        };
        if let Err(r) = refusal::check_req(self.config.local_addr, from, &req) {
            self.refuse_req(from, tid, &req, r);
            return true;
        }
        if let Some(l) = self.listener_ids.get_mut(&listen) {
            if l.pending >= l.backlog {
                self.stats.dropped_backlog_full += 1;
                return true;
            }
            l.pending += 1;
        }
        let conn = self.new_conn(ConnState::ReqRcvd, from, req.local_comm_id, tid);
        if let Some(c) = self.conns.get_mut(&conn) {
            c.listen = Some(listen);
            c.remote_qpn = req.local_qpn;
            // Our REP is resent within the requester's expectation.
            c.interval = CmConfig::timeout_ns(req.local_cm_response_timeout);
        }
        let _ = now;
        self.by_remote.insert((from, req.local_comm_id), conn);
        self.events.push_back(CmEvent::ConnectRequest {
            listen,
            conn,
            peer: from,
            req: Box::new(req),
        });
        true
    }

    /// Count a refused REQ and answer it as the kernel does (see
    /// [`Refusal::rej_reason`]); nothing else changes.
    fn refuse_req(&mut self, from: IpAddr, tid: u64, req: &ReqRepr, r: Refusal) {
        self.stats.refused.count(r);
        tracing::debug!(peer = %from, reason = r.name(), "CM REQ refused");
        let Some(why) = r.rej_reason() else {
            return;
        };
        let mut rej = reject_message(0, req.local_comm_id, 0, why, [0; cm::REJ_PRIVATE_DATA]);
        if let (Refusal::ReceiverGid, Some(local)) = (r, self.config.local_addr) {
            // The ARI of "invalid GID": the GID this end would take.
            let gid = refusal::gid_of(local);
            rej.ari[..gid.len()].copy_from_slice(&gid);
            rej.reject_info_length = gid.len() as u8;
        }
        self.send(
            from,
            CmMad {
                header: MadHeaderRepr::cm(attr::REJ, tid),
                message: CmMessage::Rej(rej),
            },
        );
    }

    fn on_rep(&mut self, from: IpAddr, rep: RepRepr) -> bool {
        let local = rep.remote_comm_id;
        let Some(c) = self.matching(from, local, None) else {
            return false;
        };
        match c.state {
            ConnState::ReqSent => {
                c.state = ConnState::RepRcvd;
                c.remote_id = rep.local_comm_id;
                c.remote_qpn = rep.local_qpn;
                self.answered(local);
                self.events.push_back(CmEvent::ConnectResponse {
                    conn: local,
                    rep: Box::new(rep),
                });
                true
            }
            ConnState::Established if c.remote_id == rep.local_comm_id => {
                // Our RTU was lost and the REP resent: the RTU again.
                let (peer, tid) = (c.peer, c.tid);
                self.send(
                    peer,
                    CmMad {
                        header: MadHeaderRepr::cm(attr::RTU, tid),
                        message: CmMessage::Rtu(RtuRepr {
                            local_comm_id: local,
                            remote_comm_id: rep.local_comm_id,
                            private_data: [0; cm::RTU_PRIVATE_DATA],
                        }),
                    },
                );
                true
            }
            // A duplicate while the user decides.
            ConnState::RepRcvd => true,
            _ => false,
        }
    }

    fn on_rtu(&mut self, from: IpAddr, rtu: &RtuRepr) -> bool {
        let local = rtu.remote_comm_id;
        let Some(c) = self.matching(from, local, Some(rtu.local_comm_id)) else {
            return false;
        };
        match c.state {
            ConnState::RepSent => {
                c.state = ConnState::Established;
                self.answered(local);
                self.events.push_back(CmEvent::Established { conn: local });
                true
            }
            ConnState::Established => true,
            _ => false,
        }
    }

    fn on_rej(&mut self, from: IpAddr, rej: RejRepr) -> bool {
        let local = rej.remote_comm_id;
        let Some(c) = self.matching(from, local, None) else {
            return false;
        };
        if !matches!(
            c.state,
            ConnState::ReqSent | ConnState::RepSent | ConnState::RepRcvd
        ) {
            return false;
        }
        c.state = ConnState::Idle;
        self.answered(local);
        self.events.push_back(CmEvent::Rejected {
            conn: local,
            reason: rej.reason,
            private_data: rej.private_data.to_vec(),
        });
        true
    }

    fn on_mra(&mut self, now: Nanos, from: IpAddr, mra: &MraRepr) -> bool {
        let local = mra.remote_comm_id;
        let Some(c) = self.matching(from, local, None) else {
            return false;
        };
        if !matches!(c.state, ConnState::ReqSent | ConnState::RepSent) {
            return false;
        }
        // The peer needs longer: wait its service timeout on top.
        let extra = CmConfig::timeout_ns(mra.service_timeout);
        let interval = c.interval;
        self.set_timer(local, Some(now + interval + extra));
        true
    }

    fn on_dreq(&mut self, from: IpAddr, tid: u64, dreq: &DreqRepr) -> bool {
        let local = dreq.remote_comm_id;
        let Some(c) = self.matching(from, local, Some(dreq.local_comm_id)) else {
            // A DREQ for no connection of ours: its DREP was lost and the
            // connection is gone (destroyed, or out of TimeWait). Answer
            // it as the kernel does (cm_issue_drep), or the peer resends
            // until its retries run out (15 x 4.3 s under rdma_cm).
            self.stats.rx_unmatched += 1;
            self.send(
                from,
                CmMad {
                    header: MadHeaderRepr::cm(attr::DREP, tid),
                    message: CmMessage::Drep(DrepRepr {
                        local_comm_id: dreq.remote_comm_id,
                        remote_comm_id: dreq.local_comm_id,
                        private_data: [0; cm::DREP_PRIVATE_DATA],
                    }),
                },
            );
            return true;
        };
        match c.state {
            // Both sides disconnecting at once (DreqSent) is handled as the
            // kernel's cm_dreq_handler does: our DREQ stops, the user gets
            // Disconnected, and its disconnect (or destroy) sends the DREP.
            ConnState::Established | ConnState::RepSent | ConnState::DreqSent => {
                c.state = ConnState::DreqRcvd;
                c.tid = tid;
                self.answered(local);
                self.events.push_back(CmEvent::Disconnected { conn: local });
                true
            }
            ConnState::TimeWait => {
                if let Some(r) = c.last_reply.clone() {
                    let peer = c.peer;
                    self.send(peer, r);
                }
                true
            }
            ConnState::DreqRcvd => true,
            _ => false,
        }
    }

    fn on_drep(&mut self, now: Nanos, from: IpAddr, drep: &DrepRepr) -> bool {
        let local = drep.remote_comm_id;
        let Some(c) = self.matching(from, local, Some(drep.local_comm_id)) else {
            return false;
        };
        if c.state != ConnState::DreqSent {
            return c.state == ConnState::TimeWait;
        }
        self.events.push_back(CmEvent::Disconnected { conn: local });
        self.enter_timewait(now, local);
        true
    }

    fn on_sidr_req(&mut self, from: IpAddr, tid: u64, req: SidrReqRepr) -> bool {
        let Some(&listen) = self.listeners.get(&req.service_id) else {
            self.stats.rejected_no_listener += 1;
            let rep = SidrRepRepr {
                request_id: req.request_id,
                status: SIDR_UNSUPPORTED,
                service_id: req.service_id,
                ..SidrRepRepr::default()
            };
            self.send(
                from,
                CmMad {
                    header: MadHeaderRepr::cm(attr::SIDR_REP, tid),
                    message: CmMessage::SidrRep(rep),
                },
            );
            return true;
        };
        if let Err(r) = refusal::check_sidr_req(self.config.local_addr, from, &req) {
            self.stats.refused.count(r);
            tracing::debug!(peer = %from, reason = r.name(), "CM SIDR_REQ refused");
            let rep = SidrRepRepr {
                request_id: req.request_id,
                status: SIDR_REJECT,
                service_id: req.service_id,
                ..SidrRepRepr::default()
            };
            self.send(
                from,
                CmMad {
                    header: MadHeaderRepr::cm(attr::SIDR_REP, tid),
                    message: CmMessage::SidrRep(rep),
                },
            );
            return true;
        }
        let conn = self.new_conn(ConnState::SidrReqRcvd, from, req.request_id, tid);
        self.sidr_services.insert(conn, req.service_id);
        self.events.push_back(CmEvent::SidrRequest {
            listen,
            conn,
            peer: from,
            req: Box::new(req),
        });
        true
    }

    fn on_sidr_rep(&mut self, from: IpAddr, rep: SidrRepRepr) -> bool {
        let local = rep.request_id;
        let Some(c) = self.matching(from, local, None) else {
            return false;
        };
        if c.state != ConnState::SidrReqSent {
            return false;
        }
        c.state = ConnState::Idle;
        self.answered(local);
        self.events.push_back(CmEvent::SidrResponse {
            conn: local,
            rep: Some(Box::new(rep)),
        });
        true
    }
}

fn reject_message(
    local: u32,
    remote: u32,
    msg_rejected: u8,
    reason: u16,
    private_data: [u8; cm::REJ_PRIVATE_DATA],
) -> RejRepr {
    RejRepr {
        local_comm_id: local,
        remote_comm_id: remote,
        msg_rejected,
        reason,
        private_data,
        ..RejRepr::default()
    }
}

/// What one side of a connection offers (rdma_cm's `rdma_conn_param` plus
/// its QP).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConnParams {
    /// The QP's number.
    pub qpn: u32,
    /// The QP's initial send PSN.
    pub psn: u32,
    /// READs/atomics the peer may have outstanding at us.
    pub responder_resources: u8,
    /// READs/atomics we may have outstanding at the peer.
    pub initiator_depth: u8,
    /// Transport retries (3 bits).
    pub retry_count: u8,
    /// RNR retries (3 bits; 7 = infinite).
    pub rnr_retry_count: u8,
    /// The QP receives from an SRQ.
    pub srq: bool,
    /// Bytes for the REQ's or REP's private data (rdma_cm puts its own
    /// header first in a REQ).
    pub private_data: Vec<u8>,
}

/// The RoCEv2 path of a REQ as the kernel's rdma_cm fills it for rxe and
/// mlx5 (`cma_format_req`/`cm_format_req`): permissive LIDs 0xFFFF (RoCE
/// has no LIDs), the GIDs, hop limit 64, traffic class 0, SL 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RocePath {
    /// Our GID.
    pub local_gid: [u8; 16],
    /// The peer's GID.
    pub remote_gid: [u8; 16],
    /// The path MTU (IB enum: 1 = 256 ... 5 = 4096).
    pub path_mtu: u8,
    /// The QP's local ACK timeout exponent.
    pub local_ack_timeout: u8,
    /// The IPv6 flow label (0: none).
    pub flow_label: u32,
    /// The traffic class (`RDMA_OPTION_ID_TOS`).
    pub traffic_class: u8,
    /// Packet rate (`enum ib_rate`).
    pub packet_rate: u8,
}

/// A REQ for `service_id` over `path` offering `p`.
pub fn rocev2_req(service_id: u64, path: &RocePath, p: &ConnParams) -> VerbsResult<ReqRepr> {
    let private_data = private::<{ cm::REQ_PRIVATE_DATA }>("rdma_connect", &p.private_data)?;
    let primary = cm::PathRepr {
        local_lid: 0xffff,
        remote_lid: 0xffff,
        local_gid: path.local_gid,
        remote_gid: path.remote_gid,
        flow_label: path.flow_label,
        packet_rate: path.packet_rate,
        traffic_class: path.traffic_class,
        hop_limit: 64,
        sl: 0,
        subnet_local: false,
        local_ack_timeout: path.local_ack_timeout,
        ..cm::PathRepr::default()
    };
    Ok(ReqRepr {
        service_id,
        local_qpn: p.qpn,
        responder_resources: p.responder_resources,
        initiator_depth: p.initiator_depth,
        transport_service_type: 0,
        starting_psn: p.psn & 0xff_ffff,
        retry_count: p.retry_count & 7,
        rnr_retry_count: p.rnr_retry_count & 7,
        pkey: 0xffff,
        path_mtu: path.path_mtu,
        srq: p.srq,
        primary,
        private_data,
        ..ReqRepr::default()
    })
}

/// A REP offering `p`.
pub fn rep_for(p: &ConnParams) -> VerbsResult<RepRepr> {
    let private_data = private::<{ cm::REP_PRIVATE_DATA }>("rdma_accept", &p.private_data)?;
    Ok(RepRepr {
        local_qpn: p.qpn,
        starting_psn: p.psn & 0xff_ffff,
        responder_resources: p.responder_resources,
        initiator_depth: p.initiator_depth,
        // rxe and mlx5 answer with target ACK delay 15 (seen in captures).
        target_ack_delay: 15,
        rnr_retry_count: p.rnr_retry_count & 7,
        srq: p.srq,
        private_data,
        ..RepRepr::default()
    })
}
