//! The sans-IO transport engine of one soft device.
//!
//! Inputs: verbs calls, received packets ([`Engine::handle_packet`]) and the
//! current time, always passed in as nanoseconds of a clock the caller owns.
//! Outputs: packets to transmit ([`Engine::poll_transmit`], written into the
//! caller's buffer), completions on CQs, and the next timer deadline
//! ([`Engine::poll_timeout`]). Nothing here touches a socket or reads a clock,
//! which is what lets `tests/simnet.rs` drive engines through millions of
//! packets on a virtual clock. [`Engine`] states the calling contract.
//!
//! Where things are:
//! - `mod.rs`: the `Engine`, and `drive_qp`, the one way into a QP;
//! - `objects.rs`: the verbs on PDs, memory windows, CQs, SRQs, XRC
//!   domains and QPs, and what `roxe stat` shows of them;
//! - `rx.rs`: receive (parse, ICRC, dispatch by QPN); `gsi.rs`: QP1, the
//!   CM's MADs;
//! - `tx.rs`: the transmit passes (round robin over scheduled QPs, ACK
//!   clocking) and what every packet gets on its way out (ICRC);
//! - `timer.rs`: `Timer`, a QP's timers, the engine's index of deadlines,
//!   the liveness watchdog;
//! - `qp.rs`: one QP and the `QpCtx` it is driven through: its verbs,
//!   state changes and packet admission;
//! - rxe's three roles within a QP: `sq.rs` (the send queue, shared by)
//!   `req/` (requester) and `comp.rs` (completer); `resp/` (responder);
//! - `tm.rs`: tag matching; `config.rs`, `stats.rs`, `drops.rs`, `load.rs`:
//!   what an engine is created with, what it counts, and the snapshot of
//!   its load the driver paces by.

mod ack_hold;
mod cm_events;
mod comp;
mod config;
mod drops;
mod gsi;
mod load;
mod objects;
mod qp;
mod req;
mod resp;
mod rtt;
mod rx;
mod sq;
mod stats;
mod timer;
mod tm;
mod tx;
#[cfg(test)]
mod watchdog_tests;
pub use cm_events::DISCONNECT_HOLD;
pub use config::{EngineConfig, IcrcPolicy, QpCap, QpInitAttr, MAX_LOOPBACK_WINDOW};
pub use drops::{DropCounts, DropReason};
pub use load::Load;
pub use qp::QpCounters;
pub use stats::{CqSnapshot, QpSnapshot, Stats};
pub use tm::{tmh_op, SrqOp, SrqOpKind, Tmh, MAX_RNDV_HDR, RVH_LEN, TMH_LEN};
pub use tx::{PayloadAt, Transmit, TxPass, PAYLOAD_BY_REF_MIN};

use crate::cq::CompletionQueue;
use crate::memory::MemoryTable;
use crate::types::{Errno, VerbsError, VerbsResult};
use qp::{Qp, QpCtx, Srq};
use roxe_wire::{icrc, Psn};
use rustc_hash::FxHashMap;
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv6Addr};
use tx::HoldNew;

/// QPs in flight [`Engine::load`] looks at: it runs on the data path (after
/// every post list), which must not cost a walk over thousands of QPs.
const STREAM_SAMPLE: usize = 64;

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
///
/// # Calling contract
///
/// The engine does no I/O and reads no clock: a driver feeds it what
/// happened and asks it what to do, as quinn-proto's `Connection` is
/// driven. Its methods are of four kinds:
///
/// - **A. Getters** (`&self`): [`addr`](Self::addr),
///   [`config`](Self::config), [`stats`](Self::stats),
///   [`query_qp`](Self::query_qp), [`qp_snapshots`](Self::qp_snapshots),
///   [`cq_snapshots`](Self::cq_snapshots), [`has_events`](Self::has_events),
///   [`load`](Self::load), what the driver's pacing decides from... They
///   may be called at any time.
/// - **B. Inputs from the network and the clock**, named `handle_*`: a
///   received RoCEv2 UDP payload ([`handle_packet`](Self::handle_packet);
///   [`handle_segment`](Self::handle_segment) for a GRO segment,
///   [`handle_direct_segment`](Self::handle_direct_segment),
///   [`handle_ip_packet`](Self::handle_ip_packet) with its IP and UDP
///   headers), and [`handle_timeout`](Self::handle_timeout) when the
///   deadline [`poll_timeout`](Self::poll_timeout) gave has come (early
///   is harmless: only what is due fires).
/// - **C. Verbs from the program**: object creation and destruction,
///   [`modify_qp`](Self::modify_qp), [`post_send`](Self::post_send),
///   [`post_recv`](Self::post_recv), [`post_srq_recv`](Self::post_srq_recv),
///   [`post_srq_op`](Self::post_srq_op), [`poll_cq`](Self::poll_cq), the
///   memory table ([`memory_mut`](Self::memory_mut)), the CM
///   ([`cm`](Self::cm)). They return at once: what they cause on the wire
///   comes out of the `poll_*` calls.
/// - **D. Outputs**, named `poll_*` and `take_*`:
///   [`poll_transmit`](Self::poll_transmit) (and
///   [`poll_transmit_pass`](Self::poll_transmit_pass),
///   [`poll_transmit_ack_clocked`](Self::poll_transmit_ack_clocked)): the
///   next packet, written into the caller's buffer (at least 4096 + 64
///   bytes), or `None` when nothing may be sent now;
///   [`poll_timeout`](Self::poll_timeout): the earliest deadline of any
///   timer (QPs' retransmission and RNR timers, the CM's), or `None`;
///   [`take_events`](Self::take_events): asynchronous QP events. Completions
///   wait in their CQs ([`poll_cq`](Self::poll_cq); a CQ's notification
///   through [`cq_mut`](Self::cq_mut)), CM events in the CM.
///
/// After any call of kind B or C, the driver calls the outputs, in this
/// order:
///
/// 1. [`poll_transmit`](Self::poll_transmit) until it returns `None`,
///    sending each packet. A packet whose [`Transmit::payload`] is by
///    reference ([`TxPass::payload_by_ref`]) must be sent before the
///    engine is next called with `&mut self`: the memory may change then.
/// 2. [`poll_timeout`](Self::poll_timeout), which must come after (1):
///    sending a request arms its QP's retransmission timer.
/// 3. The events and completions, in any order.
///
/// Then it waits for a packet, a verb, or the deadline of (2), and starts
/// again. An ACK-clocked pass ([`poll_transmit_ack_clocked`]) may hold new
/// messages back ([`load`](Self::load)`().held`); they go at the next pass
/// that is not one, which the driver must run when the ACK arrives, at the
/// next timer, or when the program polls.
///
/// Every `now` is nanoseconds of one clock the driver owns, never going
/// back: deadlines are compared with it and completions are stamped with
/// it. Nothing is sent, completed or timed out between calls.
/// [`audit_liveness`](Self::audit_liveness) is a watchdog the driver may
/// run now and then (every 100 ms); a correct engine never needs it.
///
/// [`poll_transmit_ack_clocked`]: Self::poll_transmit_ack_clocked
#[derive(Debug)]
pub struct Engine {
    config: EngineConfig,
    /// The latest time the driver gave the engine (receive, timers,
    /// transmit): what completions are stamped with.
    clock: Nanos,
    /// Receive: ICRC changes of unseen IPv4 fields, per packet length.
    unseen_ipv4: icrc::RecentLengths<icrc::UnseenIpv4Fields>,
    /// Send and receive: the ICRC's state after the IPv4 and UDP headers,
    /// per flow and length.
    icrc_prefixes: icrc::Ipv4Prefixes,
    memory: MemoryTable,
    next_pd: u32,
    pds: BTreeMap<u32, u32>,
    next_cq: u32,
    cqs: FxHashMap<u32, CompletionQueue>,
    next_srq: u32,
    srqs: FxHashMap<u32, Srq>,
    next_xrcd: u32,
    xrcds: BTreeSet<u32>,
    next_qpn: u32,
    qps: BTreeMap<u32, Qp>,
    /// PSNs unacknowledged on all reliable QPs that send under the
    /// loopback window (`Qp::loopback_unacked`): the window is the
    /// device's as much as each QP's (see `request_transmit`). The sum of
    /// the QPs' `counted_loopback_unacked`, kept by `drive_qp`.
    loopback_unacked: i32,
    /// Round-robin cursor for transmit fairness between QPs.
    tx_cursor: u32,
    /// QPs that may have a packet to send: `poll_transmit` visits only
    /// these, so idle QPs cost nothing per packet. A QP enters when a verb
    /// or a packet or timer drives it (`drive_and_schedule`), and leaves
    /// when it has nothing.
    scheduled: BTreeSet<u32>,
    /// Every QP with a timer armed, as (its earliest deadline, QPN):
    /// `poll_timeout` is the first entry, so thousands of QPs cost nothing
    /// per verb call (`timer.rs`).
    deadlines: BTreeSet<(Nanos, u32)>,
    /// QPs whose new message an ACK-clocked pass held: the next pass that
    /// is not one (the ACK's, a timer's, a poll's) schedules them again,
    /// whichever QP its packet was for.
    held: BTreeSet<u32>,
    /// QPs whose next request waits for the device's loopback window
    /// (`Wait::LoopbackReads`), with or without PSNs of their own in
    /// flight: the pass after the device's unacknowledged PSNs drop below
    /// the window visits them again (`drive_qp`), so one with nothing in
    /// flight, which no ACK of its own would wake, waits safely.
    window_waiters: BTreeSet<u32>,
    /// Destroyed QPs that still owe their peer the ACK they held for an
    /// answer (`ack_hold.rs`): the next pass sends it, then they go.
    parting: Vec<Qp>,
    /// QPs that began a hold (`ack_hold.rs`: a hold begins only in a
    /// transmit pass, which lists its QP here) and may still hold; ones
    /// whose hold ended otherwise are dropped when next looked at.
    ack_holders: Vec<u32>,
    /// QPs whose held ACK was overtaken (`release_overtaken_acks`): the
    /// next pass sends it before anything else.
    overtaken: Vec<u32>,
    /// Asynchronous events not yet taken by the driver.
    events: Vec<QpEvent>,
    /// The Communication Manager behind QP1 (rdma_cm's protocol).
    cm: crate::cm::Cm,
    /// DISCONNECTED events waiting for their QP's completions to be
    /// polled (`cm_events.rs`).
    held_disconnects: Vec<cm_events::HeldDisconnect>,
    /// The PSN of the next MAD sent from QP1.
    gsi_psn: Psn,
    stats: Stats,
}

/// The error of `verb`: `errno`, and what was wrong.
fn verb_error(verb: &'static str, errno: Errno, detail: impl Into<String>) -> VerbsError {
    VerbsError::new(verb, errno, detail)
}

/// The first QPN of a device in QPN slot `slot`: 0x11 as on rxe (QPN 0
/// and 1 are the special QPs, and rxe starts at 17), within the slot.
fn first_qpn(slot: u8) -> u32 {
    (u32::from(slot) << 16) | 0x11
}

/// The QPN after `qpn`, staying in slot `slot` (0: the whole QPN space).
pub(crate) fn next_qpn(qpn: u32, slot: u8) -> u32 {
    let next = qpn + 1;
    match slot {
        0 if next > 0xFF_FFFF => first_qpn(0),
        0 => next,
        s if next >> 16 != u32::from(s) => first_qpn(s),
        _ => next,
    }
}

/// 128 random bits from the OS (`getrandom`), for keys an observer must
/// not guess; the clock and process id if it fails.
pub(crate) fn random_key() -> u128 {
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
        let qpn_slot = config.qpn_slot;
        let gid = gid_of(config.addr);
        let addr = config.addr;
        Engine {
            config,
            clock: 0,
            unseen_ipv4: Default::default(),
            icrc_prefixes: Default::default(),
            memory: MemoryTable::new(),
            next_pd: 1,
            pds: BTreeMap::new(),
            next_cq: 1,
            cqs: FxHashMap::default(),
            next_srq: 1,
            srqs: FxHashMap::default(),
            next_xrcd: 1,
            xrcds: BTreeSet::new(),
            // QPN 0 and 1 are the special QPs; rxe starts numbering at 17.
            next_qpn: first_qpn(qpn_slot),
            qps: BTreeMap::new(),
            loopback_unacked: 0,
            tx_cursor: 0,
            scheduled: BTreeSet::new(),
            deadlines: BTreeSet::new(),
            held: BTreeSet::new(),
            window_waiters: BTreeSet::new(),
            parting: Vec::new(),
            ack_holders: Vec::new(),
            overtaken: Vec::new(),
            events: Vec::new(),
            cm: crate::cm::Cm::new(crate::cm::CmConfig {
                ca_guid: u64::from_be_bytes([
                    gid[8], gid[9], gid[10], gid[11], gid[12], gid[13], gid[14], gid[15],
                ]),
                id_key: random_key(),
                id_slot: (qpn_slot != 0).then_some(qpn_slot),
                local_addr: Some(addr),
                ..crate::cm::CmConfig::default()
            }),
            held_disconnects: Vec::new(),
            gsi_psn: Psn::new(0),
            stats: Stats::default(),
        }
    }

    /// The Communication Manager's counters.
    pub fn cm_stats(&self) -> crate::cm::CmStats {
        self.cm.stats()
    }

    /// Whether the Communication Manager listens on `service_id`.
    pub fn cm_listens(&self, service_id: u64) -> bool {
        self.cm.listens(service_id)
    }

    /// The Communication Manager (QP1): connect, listen, accept, events.
    /// What it sends leaves through `poll_transmit`; its timers are part of
    /// `poll_timeout`/`handle_timeout`.
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
            self.scheduled.insert(q.qpn);
        }
        self.wake_window_waiters();
    }

    /// Switch selective recovery between roxe peers on or off
    /// (`EngineConfig::keep_early`); what a responder keeps now stays
    /// until its gap is filled.
    pub fn set_keep_early(&mut self, on: bool) {
        self.config.keep_early = on;
    }

    /// The limits and identity the engine was created with.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Whether an ACK-clocked pass holds a new message (it goes with the
    /// next pass that holds nothing: an ACK received, a timer, a poll).
    fn has_held(&self) -> bool {
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

    /// Drive QP `qpn` through `f` with the context it may use, then do
    /// what the call implies beyond the QP: its share of the loopback
    /// window is recounted, QPs feeding a CQ that overflowed go to ERR, and
    /// the QP is refiled under its next deadline. Every call into a QP
    /// goes through here. `None` when there is no such QP.
    fn drive_qp<R>(&mut self, qpn: u32, f: impl FnOnce(&mut Qp, &mut QpCtx) -> R) -> Option<R> {
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
        let mut cx = QpCtx::new(
            *clock,
            config,
            memory,
            cqs,
            srqs,
            stats,
            events,
            self.loopback_unacked,
        );
        let result = f(q, &mut cx);
        // Every change to a QP's PSNs, state or peer happens in here.
        let counted = q.loopback_unacked(config);
        self.loopback_unacked += counted - q.counted_loopback_unacked;
        let freed = counted < q.counted_loopback_unacked;
        q.counted_loopback_unacked = counted;
        let waits = cx.waits_for_window;
        let overflowed = cx.overflowed;
        if waits {
            self.window_waiters.insert(qpn);
        }
        if freed {
            self.wake_window_waiters();
        }
        for cq in overflowed {
            self.on_cq_overflow(cq);
        }
        self.refile_deadline(qpn);
        Some(result)
    }

    /// The next packet a destroyed QP still owes (an ACK it held, see
    /// `parting`); such a QP goes once it has sent it.
    fn parting_transmit(&mut self, buf: &mut [u8]) -> Option<Transmit> {
        while let Some(q) = self.parting.last_mut() {
            let mut cx = QpCtx::new(
                self.clock,
                &self.config,
                &mut self.memory,
                &mut self.cqs,
                &mut self.srqs,
                &mut self.stats,
                &mut self.events,
                self.loopback_unacked,
            );
            if let Some(t) = q.reply_transmit(&mut cx, buf) {
                return Some(t);
            }
            self.parting.pop();
        }
        None
    }

    /// The program sent something other than `except`'s answer (another
    /// QP's request, a CM MAD): every ACK held for an answer goes first,
    /// since the program may have sent it because the held message
    /// arrived, and its peer may wait for that ACK before it can take
    /// the new packet (perftest's server completes its last SEND over
    /// the first connection before it listens for the second one). A hold
    /// overtaken counts as one that ran out.
    pub(super) fn release_overtaken_acks(&mut self, except: Option<u32>) {
        if self.ack_holders.is_empty() {
            return;
        }
        for qpn in std::mem::take(&mut self.ack_holders) {
            if Some(qpn) == except {
                self.ack_holders.push(qpn);
            } else if self.drive_and_schedule(qpn, |q, _| q.release_overtaken_ack()) == Some(true) {
                self.overtaken.push(qpn);
            }
        }
    }

    /// The next ACK of an overtaken hold (`release_overtaken_acks`).
    fn overtaken_transmit(&mut self, buf: &mut [u8]) -> Option<Transmit> {
        while let Some(&qpn) = self.overtaken.last() {
            if let Some(t) = self
                .drive_qp(qpn, |q, cx| q.reply_transmit(cx, buf))
                .flatten()
            {
                return Some(t);
            }
            self.overtaken.pop();
        }
        None
    }

    /// Every ACK held for an answer goes with the next pass (the process
    /// is exiting: nothing will answer).
    pub fn release_held_acks(&mut self) {
        for qpn in std::mem::take(&mut self.ack_holders) {
            self.drive_and_schedule(qpn, |q, _| q.release_held_ack());
        }
    }

    /// The device's loopback window has room again: the QPs waiting for
    /// it are visited by the next pass (a necessary condition for any of
    /// them to go: each waits under a window no wider than this one).
    fn wake_window_waiters(&mut self) {
        let window = self
            .config
            .loopback_window
            .clamp(1, config::MAX_LOOPBACK_WINDOW);
        if !self.window_waiters.is_empty() && self.loopback_unacked < window {
            self.scheduled.append(&mut self.window_waiters);
        }
    }

    /// [`drive_qp`](Self::drive_qp) for a verb, a packet or a timer: after
    /// it the QP may have something to send, so the next transmit pass
    /// visits it (rxe schedules its tasks the same way).
    fn drive_and_schedule<R>(
        &mut self,
        qpn: u32,
        f: impl FnOnce(&mut Qp, &mut QpCtx) -> R,
    ) -> Option<R> {
        let result = self.drive_qp(qpn, f)?;
        self.scheduled.insert(qpn);
        Some(result)
    }

    /// A verb on QP `qpn`: EINVAL naming `verb` when there is no such QP.
    fn verb_on_qp(
        &mut self,
        verb: &'static str,
        qpn: u32,
        f: impl FnOnce(&mut Qp, &mut QpCtx) -> VerbsResult<()>,
    ) -> VerbsResult<()> {
        self.drive_and_schedule(qpn, f)
            .unwrap_or_else(|| Err(verb_error(verb, Errno::EINVAL, "no such QP")))
    }

    /// Take the asynchronous events raised since the last call.
    pub fn take_events(&mut self) -> Vec<QpEvent> {
        std::mem::take(&mut self.events)
    }

    /// True when asynchronous events are waiting.
    pub fn has_events(&self) -> bool {
        !self.events.is_empty()
    }
}
