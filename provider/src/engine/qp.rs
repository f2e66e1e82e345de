//! One queue pair: it owns its requester, completer and responder state
//! (rxe's three roles), the send queue and timers the first two share, and
//! is driven through a [`QpCtx`], the narrow part
//! of the engine a QP may touch for one call: memory, CQs, SRQs, counters
//! and the event queue. The entry points are the verbs (`post_send`,
//! `post_recv`, `modify`), [`Qp::on_packet`] (admission, then
//! `on_request` in `resp` or `on_response` in `comp`),
//! [`Qp::poll_transmit`] (`resp::reply` first, then `req`) and
//! [`Qp::on_timeout`] (`comp`). Nothing here looks another QP up: what
//! crosses QPs (a CQ overflow moves every QP feeding that CQ to ERR) is
//! noted in the context and done by the engine after the call.

use super::comp::Completer;
use super::req::Requester;
use super::resp::Responder;
use super::sq::SendQueue;
use super::timer::{Timer, Timers};
use super::{
    addr_of_gid, verb_error, CqId, DropCounts, DropReason, EngineConfig, HoldNew, Nanos, QpEvent,
    QpInitAttr, QpSnapshot, Stats, Transmit,
};
use crate::cq::CompletionQueue;
use crate::memory::{MemoryTable, RemoteQp, Sge};
use crate::qp_attr::{self, AttrMask, QpAttr, QpLimits, QpState, QpType};
use crate::types::{Errno, VerbsResult, WcOpcode, WcStatus};
use crate::wr::{RecvWr, SendOpcode, SendWr, WorkCompletion};
use roxe_wire::{AckTimeout, Packet, Psn, Transport};
use rustc_hash::FxHashMap;
use std::collections::VecDeque;
use std::net::IpAddr;

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
    pub pd: crate::types::PdId,
    pub queue: VecDeque<RecvWqe>,
    pub max_wr: u32,
    pub max_sge: u32,
    /// For an XRC SRQ: its domain and the CQ its receives complete in.
    pub xrc: Option<XrcSrq>,
    /// For a tag-matching SRQ: its tag list and counts.
    pub tm: Option<super::tm::TmSrq>,
}

/// What makes an SRQ an XRC SRQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct XrcSrq {
    pub xrcd: super::XrcdId,
    pub cq: CqId,
}

/// Where an XRC_RECV QP delivers the request in hand: the XRC SRQ its
/// XRCETH named, with that SRQ's PD (for memory access) and CQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct XrcTarget {
    pub srq: super::SrqId,
    pub pd: crate::types::PdId,
    pub cq: CqId,
}

/// What a QP may use beyond itself during one call, borrowed from the
/// engine.
pub(crate) struct QpCtx<'a> {
    /// The engine's clock: what completions are stamped with.
    pub now: Nanos,
    pub config: &'a EngineConfig,
    pub memory: &'a mut MemoryTable,
    pub cqs: &'a mut FxHashMap<u32, CompletionQueue>,
    pub srqs: &'a mut FxHashMap<u32, Srq>,
    pub stats: &'a mut Stats,
    pub events: &'a mut Vec<QpEvent>,
    /// CQs a completion did not fit in during this call: afterwards the
    /// engine moves every QP feeding them to ERR (rxe's class G).
    pub overflowed: Vec<CqId>,
    /// A transmit pass that takes large payloads by reference
    /// ([`super::TxPass::payload_by_ref`]).
    pub payload_by_ref: bool,
    /// Set by the requester when an ACK-clocked pass held a new message
    /// (the engine releases it at the next pass that is not).
    pub held_new: bool,
    /// Set by the requester when its next request waits for the device's
    /// loopback window (the engine wakes it when the window has room).
    pub waits_for_window: bool,
    /// PSNs unacknowledged on all QPs towards loopback peers
    /// (`Engine::loopback_unacked`), when the call began.
    pub loopback_unacked: i32,
}

impl<'a> QpCtx<'a> {
    /// The context of one call into a QP, with nothing noted yet.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        now: Nanos,
        config: &'a EngineConfig,
        memory: &'a mut MemoryTable,
        cqs: &'a mut FxHashMap<u32, CompletionQueue>,
        srqs: &'a mut FxHashMap<u32, Srq>,
        stats: &'a mut Stats,
        events: &'a mut Vec<QpEvent>,
        loopback_unacked: i32,
    ) -> Self {
        QpCtx {
            now,
            config,
            memory,
            cqs,
            srqs,
            stats,
            events,
            overflowed: Vec::new(),
            payload_by_ref: false,
            held_new: false,
            waits_for_window: false,
            loopback_unacked,
        }
    }

    /// Deliver a completion; an overflow is noted for the engine.
    pub fn push_wc(&mut self, cq: CqId, wc: WorkCompletion, solicited: bool) {
        let ok = self
            .cqs
            .get_mut(&cq.0)
            .is_some_and(|c| c.push_at(wc, solicited, self.now));
        if !ok && !self.overflowed.contains(&cq) {
            self.overflowed.push(cq);
        }
    }

    /// A completion of a QP already in ERR: an overflow changes nothing more.
    fn push_wc_no_cascade(&mut self, cq: CqId, wc: WorkCompletion) {
        if let Some(q) = self.cqs.get_mut(&cq.0) {
            q.push_at(wc, false, self.now);
        }
    }

    /// An impossible internal state: a bug in the engine. Debug builds
    /// stop here; release builds count it and carry on.
    pub fn internal_error(&mut self, qpn: u32, what: &'static str) {
        debug_assert!(false, "QP {qpn:#x}: {what}");
        tracing::error!(
            qpn = format_args!("{qpn:#x}"),
            what,
            "engine invariant broken"
        );
        self.stats.count_drop(DropReason::Internal, Some(qpn));
    }
}

/// One queue pair.
#[derive(Debug)]
pub(crate) struct Qp {
    pub qpn: u32,
    pub init: QpInitAttr,
    /// The stored attributes; `attr.qp_state` is the QP's state (the only
    /// copy of it).
    pub attr: QpAttr,
    /// The connected peer (RC/UC), from the AV's GID.
    pub peer: Option<IpAddr>,
    /// The send WQEs, which the requester sends and the completer
    /// completes.
    pub sq: SendQueue,
    /// The requester (`req/`): the send queue's cursor, PSNs handed out.
    pub req: Requester,
    /// The completer (`comp.rs`): acknowledged PSNs, retries left.
    pub comp: Completer,
    /// The retransmission and RNR timers, which both of them arm.
    pub timers: Timers,
    /// The round trip, and the tail-loss probe it times (reliable QPs).
    pub rtt: super::rtt::RttEstimator,
    /// The window after losses (`rtt.rs`).
    pub loss_window: super::rtt::LossWindow,
    /// The responder (`resp/`).
    pub resp: Responder,
    /// Ping-pong detection and the ACK it holds (`ack_hold.rs`).
    pub ack_hold: super::ack_hold::AckHold,
    pub rq: VecDeque<RecvWqe>,
    /// XRC_RECV: the SRQ, PD and CQ of the request being handled (set from
    /// each request's XRCETH before it executes).
    pub xrc: Option<XrcTarget>,
    /// The deadline under which `Engine::deadlines` files this QP.
    pub indexed_deadline: Option<Nanos>,
    /// The port's active MTU in bytes (UD's message limit).
    pub port_mtu: usize,
    /// Received packets this QP dropped, by reason.
    pub drops: DropCounts,
    /// What this QP sent and received (`roxe stat`).
    pub counters: QpCounters,
    /// This QP's share of `Engine::loopback_unacked`, as last counted
    /// (`Engine::drive_qp`).
    pub counted_loopback_unacked: i32,
}

/// One QP's traffic counters, as `roxe stat` shows them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QpCounters {
    /// Packets addressed to this QP (dropped ones included).
    pub rx_packets: u64,
    /// Packets this QP sent.
    pub tx_packets: u64,
    /// Of those, retransmissions.
    pub tx_retransmits: u64,
    /// Retransmission timer expiries.
    pub timeouts: u64,
    /// NAKs sent (sequence, RNR, errors).
    pub naks_sent: u64,
    /// RNR NAKs received.
    pub rnr_naks_received: u64,
    /// Tail-loss probes: resends after a few round trips of silence
    /// (`rtt.rs`).
    pub probes: u64,
    /// Go-back-N started by a sequence NAK: a loss repaired a round trip
    /// after it, without a timer.
    pub fast_retransmits: u64,
    /// Responder: PSNs reported missing to a roxe requester on this host
    /// beyond the one a sequence NAK names (`resp::HOLE_REPORT_CREDITS`).
    pub holes_reported: u64,
    /// Requester: packets resent alone on such a report.
    pub holes_resent: u64,
    /// ACKs held for this QP's own answer, as in a ping-pong
    /// (`ack_hold.rs`).
    pub acks_held: u64,
    /// Of those, holds that ran out or were overtaken: the ACK went
    /// before the answer.
    pub holds_missed: u64,
}

impl Qp {
    /// A QP in RESET.
    pub fn new(qpn: u32, init: QpInitAttr, port_mtu: usize) -> Qp {
        Qp {
            qpn,
            init,
            attr: QpAttr {
                qp_state: QpState::Reset,
                cur_qp_state: QpState::Reset,
                ..QpAttr::default()
            },
            peer: None,
            sq: SendQueue::new(),
            req: Requester::new(),
            comp: Completer::new(),
            timers: Timers::default(),
            rtt: Default::default(),
            loss_window: Default::default(),
            resp: Responder::new(),
            ack_hold: Default::default(),
            rq: VecDeque::new(),
            xrc: None,
            indexed_deadline: None,
            port_mtu,
            drops: DropCounts::default(),
            counters: QpCounters::default(),
            counted_loopback_unacked: 0,
        }
    }

    pub fn state(&self) -> QpState {
        self.attr.qp_state
    }

    fn set_state(&mut self, s: QpState) {
        self.attr.qp_state = s;
        self.attr.cur_qp_state = s;
    }

    pub fn pmtu(&self) -> usize {
        // UD has no path MTU attribute: its limit is the port's active MTU.
        if self.init.qp_type == QpType::Ud {
            self.port_mtu
        } else {
            self.attr.path_mtu.bytes()
        }
    }

    pub fn src_port(&self) -> u16 {
        // rxe's per-QP source port, 0xC000 + QPN bits; the driver's pool of
        // send sockets is indexed by it (`EngineConfig::src_ports`).
        0xC000 | (self.qpn as u16 & 0x3FFF)
    }

    /// The retransmission timeout the QP was given.
    pub fn ack_timeout(&self) -> AckTimeout {
        AckTimeout::new(self.attr.timeout).unwrap_or(AckTimeout::INFINITE)
    }

    /// Why this QP could wait forever with work outstanding, if it could:
    /// an RC message in flight with neither a retransmission nor an RNR
    /// timer armed.
    pub fn liveness_violation(&self) -> Option<&'static str> {
        if !self.sends_reliably() || !matches!(self.state(), QpState::Rts | QpState::Sqd) {
            return None;
        }
        // A message in flight always has a timer that will retransmit it
        // or give up, unless the QP's timeout is infinite.
        let covered = self.ack_timeout().nanos().is_none()
            || [Timer::RnrWait, Timer::Retransmit, Timer::Probe]
                .iter()
                .any(|&t| self.timers.is_armed(t))
            || !self.sq.in_flight();
        (!covered).then_some("a message in flight with no timer armed")
    }

    /// The watchdog's repair: arm the retransmission timer.
    pub fn repair_liveness(&mut self, now: Nanos) {
        let timeout = self.ack_timeout();
        self.timers.arm_after(Timer::Retransmit, now, timeout);
    }

    /// Whether the peer is on this host and reached as a roxe peer (the
    /// wide loopback window, selective recovery, ACK holds).
    pub fn peer_on_this_host(&self, config: &EngineConfig) -> bool {
        self.peer.is_some_and(|p| config.uses_loopback_window(p))
    }

    /// RC and XRC_SEND: a requester with PSNs, a window, ACKs and retries.
    pub fn sends_reliably(&self) -> bool {
        matches!(self.init.qp_type, QpType::Rc | QpType::XrcSend)
    }

    pub fn can_receive(&self) -> bool {
        matches!(self.state(), QpState::Rtr | QpState::Rts | QpState::Sqd)
    }

    /// In SQD, the drain is over once no message that had started is
    /// unfinished: `sq_draining` clears, as rxe's requester clears it, and
    /// SQD may be left for RTS again; `IBV_EVENT_SQ_DRAINED` is raised if
    /// the QP asked for it.
    pub fn end_drain_if_done(&mut self, cx: &mut QpCtx) {
        if self.state() == QpState::Sqd && self.attr.sq_draining && !self.sq.in_flight() {
            self.attr.sq_draining = false;
            if self.attr.en_sqd_async_notify {
                cx.events.push(QpEvent {
                    qpn: self.qpn,
                    event_type: QpEvent::SQ_DRAINED,
                });
            }
        }
    }

    /// This QP as the memory table sees a remote access through it: for
    /// XRC_RECV, with the PD of the XRC SRQ the request named.
    pub fn remote_qp(&self) -> RemoteQp {
        RemoteQp {
            pd: self.recv_pd(),
            qpn: Some(self.qpn),
        }
    }

    /// The PD received data is placed with.
    pub fn recv_pd(&self) -> crate::types::PdId {
        self.xrc.map_or(self.init.pd, |x| x.pd)
    }

    /// The CQ receives complete in.
    pub fn recv_cq(&self) -> CqId {
        self.xrc.map_or(self.init.recv_cq, |x| x.cq)
    }

    /// The SRQ receives come from, if not the QP's own queue.
    pub fn recv_srq(&self) -> Option<super::SrqId> {
        self.xrc.map(|x| x.srq).or(self.init.srq)
    }

    /// XRC_RECV: point the QP at the XRC SRQ an XRCETH names, if it is one
    /// of the QP's domain. False (an invalid request) otherwise.
    pub fn target_xrc_srq(&mut self, cx: &QpCtx, srqn: u32) -> bool {
        let found = cx.srqs.get(&srqn).and_then(|s| match s.xrc {
            Some(x) if Some(x.xrcd) == self.init.xrcd => Some(XrcTarget {
                srq: super::SrqId(srqn),
                pd: s.pd,
                cq: x.cq,
            }),
            _ => None,
        });
        self.xrc = found;
        found.is_some()
    }

    /// Count a received packet this QP dropped for `reason`.
    pub fn drop_packet(&mut self, cx: &mut QpCtx, reason: DropReason) {
        self.drops.add(reason);
        cx.stats.count_drop(reason, Some(self.qpn));
    }

    /// `ibv_query_qp`.
    pub fn query(&self) -> (QpAttr, QpInitAttr) {
        (self.attr, self.init)
    }

    /// `ibv_modify_qp`, with the transition and attribute checks of
    /// libibverbs/rxe (EINVAL for anything they reject).
    pub fn modify(
        &mut self,
        cx: &mut QpCtx,
        attr: &QpAttr,
        mask: AttrMask,
        limits: &QpLimits,
    ) -> VerbsResult<()> {
        let qpn = self.qpn;
        // With the stored attributes: an AV whose port is not the QP's on
        // the way to RTR, and leaving SQD before the drain ends, are EINVAL.
        let old_state = self.state();
        let new_state = qp_attr::check_modify_with_stored(
            self.init.qp_type,
            old_state,
            &self.attr,
            attr,
            mask,
            limits,
        )?;
        if old_state != new_state {
            tracing::debug!(
                qpn = format_args!("{qpn:#x}"),
                from = %old_state,
                to = %new_state,
                "QP state change"
            );
        }
        let fx = qp_attr::apply(&mut self.attr, attr, mask, new_state);
        if fx.changed.contains(AttrMask::AV) {
            let peer = addr_of_gid(self.attr.av.dgid);
            self.peer = Some(peer);
            self.rtt
                .probe_before_a_sample(cx.config.uses_loopback_window(peer));
        }
        self.end_drain_if_done(cx);
        if fx.changed.contains(AttrMask::RQ_PSN) {
            self.resp.reset_psn(Psn::new(self.attr.rq_psn));
        }
        if fx.changed.contains(AttrMask::SQ_PSN) {
            let psn = Psn::new(self.attr.sq_psn);
            self.req.reset_psn(psn);
            self.comp.reset_psn(psn);
        }
        if fx.changed.contains(AttrMask::RETRY_CNT) || fx.changed.contains(AttrMask::RNR_RETRY) {
            self.comp.reset_retries(&self.attr);
        }
        if fx.reset() && old_state != QpState::Reset {
            // Back to RESET: queues are emptied without completions, and
            // completions of this QP still in its CQs go too.
            self.sq = SendQueue::new();
            self.req = Requester::new();
            self.comp = Completer::new();
            self.timers = Timers::default();
            self.resp = Responder::new();
            self.ack_hold = Default::default();
            self.rq.clear();
            self.xrc = None;
            self.peer = None;
            for cq in [self.init.send_cq, self.init.recv_cq] {
                if let Some(c) = cx.cqs.get_mut(&cq.0) {
                    c.remove_qp(qpn);
                }
            }
        }
        if fx.error() && old_state != QpState::Err {
            self.enter_error(cx);
        }
        Ok(())
    }

    /// `ibv_post_recv`.
    pub fn post_recv(&mut self, cx: &mut QpCtx, wr: RecvWr) -> VerbsResult<()> {
        const VERB: &str = "ibv_post_recv";
        if self.init.srq.is_some() {
            return Err(verb_error(VERB, Errno::EINVAL, "QP uses an SRQ"));
        }
        if self.init.qp_type.is_xrc() {
            return Err(verb_error(
                VERB,
                Errno::EINVAL,
                "XRC QPs have no receive queue",
            ));
        }
        if self.state() == QpState::Reset {
            return Err(verb_error(VERB, Errno::EINVAL, "QP in RESET"));
        }
        // rxe's post_one_recv (and mlx5) test for a full queue first.
        if self.rq.len() >= self.init.cap.max_recv_wr as usize {
            return Err(verb_error(VERB, Errno::ENOMEM, "receive queue full"));
        }
        if wr.sg_list.len() > self.init.cap.max_recv_sge as usize {
            return Err(verb_error(VERB, Errno::EINVAL, "too many SGEs"));
        }
        let total = MemoryTable::sge_total(&wr.sg_list);
        let wqe = RecvWqe {
            wr_id: wr.wr_id,
            sg_list: wr.sg_list,
            total,
        };
        if self.state() == QpState::Err {
            let wc = WorkCompletion::new(wqe.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, self.qpn);
            cx.push_wc(self.init.recv_cq, wc, false);
            return Ok(());
        }
        self.rq.push_back(wqe);
        Ok(())
    }

    /// `ibv_post_send`.
    pub fn post_send(&mut self, cx: &mut QpCtx, wr: SendWr) -> VerbsResult<()> {
        const VERB: &str = "ibv_post_send";
        let t = self.init.qp_type;
        let op_ok = match t {
            QpType::Rc => true,
            // Everything RC has but the local operations, which XRC_SEND
            // QPs lack on mlx5 too (no MW binding through them).
            QpType::XrcSend => !wr.opcode.is_local(),
            QpType::XrcRecv => false,
            QpType::Uc => matches!(
                wr.opcode,
                SendOpcode::Send
                    | SendOpcode::SendWithImm
                    | SendOpcode::RdmaWrite
                    | SendOpcode::RdmaWriteWithImm
                    | SendOpcode::LocalInv
                    | SendOpcode::BindMw
            ),
            QpType::Ud => matches!(wr.opcode, SendOpcode::Send | SendOpcode::SendWithImm),
        };
        if !op_ok {
            return Err(verb_error(
                VERB,
                Errno::EINVAL,
                format!("{:?} not valid on {t:?}", wr.opcode),
            ));
        }
        let state = self.state();
        if !matches!(state, QpState::Rts | QpState::Sqd | QpState::Err) {
            return Err(verb_error(VERB, Errno::EINVAL, format!("QP in {state}")));
        }
        let cap = self.init.cap;
        if wr.sg_list.len() > cap.max_send_sge as usize {
            return Err(verb_error(VERB, Errno::EINVAL, "too many SGEs"));
        }
        if wr.opcode == SendOpcode::BindMw && wr.bind.is_none() {
            return Err(verb_error(VERB, Errno::EINVAL, "BIND_MW without a window"));
        }
        let inline = wr.flags.contains(crate::wr::SendFlags::INLINE);
        if inline && (wr.opcode.is_read_or_atomic() || wr.opcode.is_local()) {
            // rxe's validate_send_wr: the opcode has no WR_INLINE_MASK.
            return Err(verb_error(
                VERB,
                Errno::EINVAL,
                format!("{:?} cannot carry inline data", wr.opcode),
            ));
        }
        let len = if inline {
            match &wr.inline_data {
                Some(d) if d.len() <= cap.max_inline_data as usize => d.len() as u64,
                // ibv_wr_atomic_write's operand travels as inline data,
                // whatever the QP's inline size.
                Some(d) if wr.opcode == SendOpcode::AtomicWrite => d.len() as u64,
                Some(_) => {
                    return Err(verb_error(
                        VERB,
                        Errno::EINVAL,
                        "inline data beyond max_inline_data",
                    ))
                }
                None => return Err(verb_error(VERB, Errno::EINVAL, "INLINE without data")),
            }
        } else {
            MemoryTable::sge_total(&wr.sg_list)
        };
        if len > 1 << 31 {
            return Err(verb_error(
                VERB,
                Errno::EINVAL,
                "message longer than 2^31 bytes",
            ));
        }
        if (wr.opcode.is_atomic() || wr.opcode == SendOpcode::AtomicWrite) && len != 8 {
            return Err(verb_error(
                VERB,
                Errno::EINVAL,
                "atomic needs one 8-byte SGE",
            ));
        }
        if t == QpType::Ud {
            if wr.ud.is_none() {
                return Err(verb_error(
                    VERB,
                    Errno::EINVAL,
                    "UD send without an address handle",
                ));
            }
            if state == QpState::Rts && len as usize > self.pmtu() {
                return Err(verb_error(
                    VERB,
                    Errno::EINVAL,
                    "UD message larger than the path MTU",
                ));
            }
        }
        // As rxe's post_one_send: the WR is validated (EINVAL) before the
        // queue is found full (ENOMEM).
        if self.sq.outstanding() >= cap.max_send_wr as usize {
            return Err(verb_error(VERB, Errno::ENOMEM, "send queue full"));
        }
        if state == QpState::Err {
            let wc = WorkCompletion::new(
                wr.wr_id,
                WcStatus::WrFlushErr,
                wr.opcode.wc_opcode(),
                self.qpn,
            );
            cx.push_wc(self.init.send_cq, wc, false);
            return Ok(());
        }
        self.sq.post(wr, len as u32);
        Ok(())
    }

    /// Move to ERR: every outstanding send and receive WR completes with
    /// WR_FLUSH_ERR.
    pub fn enter_error(&mut self, cx: &mut QpCtx) {
        let qpn = self.qpn;
        tracing::debug!(
            qpn = format_args!("{qpn:#x}"),
            "QP entered ERR: WRs flushed"
        );
        self.set_state(QpState::Err);
        if self.init.srq.is_some() {
            cx.events.push(QpEvent {
                qpn,
                event_type: QpEvent::LAST_WQE_REACHED,
            });
        }
        self.req.flush();
        self.timers.stop_all();
        self.resp.forget_early();
        let sends = self.sq.flush();
        let recv_cq = self.recv_cq();
        let current = self.resp.take_current_recv();
        let pending = current
            .into_iter()
            .chain(self.rq.drain(..).map(|w| (w, WcOpcode::Recv)));
        for w in sends {
            if let Some(kind) = w.internal {
                if let Some((cq, wc)) = super::tm::internal_flushed(kind, &w, qpn) {
                    cx.push_wc_no_cascade(cq, wc);
                }
                continue;
            }
            let wc = WorkCompletion::new(
                w.wr.wr_id,
                WcStatus::WrFlushErr,
                w.wr.opcode.wc_opcode(),
                qpn,
            );
            cx.push_wc_no_cascade(self.init.send_cq, wc);
        }
        for (r, opcode) in pending {
            let wc = WorkCompletion::new(r.wr_id, WcStatus::WrFlushErr, opcode, qpn);
            cx.push_wc_no_cascade(recv_cq, wc);
        }
    }

    /// The QP failed (a transport error): to ERR, unless it is there.
    pub fn fail_qp(&mut self, cx: &mut QpCtx) {
        if self.state() != QpState::Err {
            self.enter_error(cx);
        }
    }

    /// What `roxe stat` shows of this QP.
    pub fn snapshot(&self) -> QpSnapshot {
        let (retry_left, rnr_retry_left) = self.comp.retries_left();
        QpSnapshot {
            qpn: self.qpn,
            qp_type: self.init.qp_type,
            state: self.state(),
            peer: self.peer.map(|p| (p, self.attr.dest_qp_num)),
            next_psn: self.req.next_psn().value(),
            una: self.comp.una().value(),
            epsn: self.resp.epsn(),
            send_queue: self.sq.len(),
            recv_queue: self.rq.len(),
            retry_left,
            rnr_retry_left,
            drops: self.drops,
            counters: self.counters,
            srtt_ns: self.rtt.srtt(),
            loss_window: self.loss_window.binding(),
        }
    }

    /// A packet addressed to this QP from `src`: admitted if its transport,
    /// the QP's state and its sender fit, then a request for the responder
    /// or a response for the completer.
    pub fn on_packet(&mut self, cx: &mut QpCtx, now: Nanos, src: IpAddr, pkt: &Packet<&[u8]>) {
        self.counters.rx_packets += 1;
        let response = pkt.opcode().is_response();
        let type_ok = match (self.init.qp_type, pkt.opcode().transport()) {
            (QpType::Rc, Transport::Rc)
            | (QpType::Uc, Transport::Uc)
            | (QpType::Ud, Transport::Ud) => true,
            // Each XRC half takes its half of the traffic.
            (QpType::XrcSend, Transport::Xrc) => response,
            (QpType::XrcRecv, Transport::Xrc) => !response,
            _ => false,
        };
        let refused = if !type_ok {
            Some(DropReason::WrongTransport)
        } else if !self.can_receive() {
            Some(DropReason::WrongState)
        } else if self.init.qp_type != QpType::Ud && self.peer != Some(src) {
            Some(DropReason::WrongPeer)
        } else {
            None
        };
        if let Some(reason) = refused {
            self.drop_packet(cx, reason);
        } else if response {
            self.on_response(cx, now, pkt);
        } else {
            self.on_request(cx, src, pkt);
        }
    }

    /// End a hold now: the ACK goes with the next pass. True if one was
    /// held.
    pub fn release_held_ack(&mut self) -> bool {
        let held = self.ack_hold.until().is_some();
        self.ack_hold.release();
        self.timers.stop(Timer::AckHold);
        held && self.resp.only_an_ack()
    }

    /// The program sent something else before this QP's answer
    /// (`Engine::release_overtaken_acks`): the ACK goes now, and the hold
    /// counts as one that ran out. True if one was held.
    pub fn release_overtaken_ack(&mut self) -> bool {
        if self.ack_hold.until().is_some() {
            self.ack_hold.missed();
            self.counters.holds_missed += 1;
        }
        self.release_held_ack()
    }

    /// Whether the next message to start completes a receive at the peer
    /// (a SEND or WRITE_WITH_IMM). Its ACK then goes first, as it would
    /// have without a hold: the peer's send completion comes before the
    /// receive completion of the answer, the order programs rely on (a
    /// loop that polls one completion after its post and takes it for the
    /// send's). After a WRITE, nothing at the peer shows the order.
    fn next_message_completes_a_receive(&self) -> bool {
        use crate::wr::SendOpcode as Op;
        self.sq.iter().find(|w| !w.started).is_some_and(|w| {
            matches!(
                w.wr.opcode,
                Op::Send | Op::SendWithImm | Op::SendWithInv | Op::RdmaWriteWithImm
            )
        })
    }

    /// Whether the reply queued, a plain ACK, waits for this QP's next
    /// request (`ack_hold.rs`); a hold starts here, with its timer, and
    /// ends when the queue holds anything else or the pattern breaks.
    fn holds_ack(&mut self, cx: &QpCtx, now: Nanos) -> bool {
        if self.ack_hold.until().is_none() && !self.ack_hold.may_begin() {
            // Every packet of a stream leaves here.
            return false;
        }
        // Only a roxe peer on this host receives in its program's thread:
        // rxe and NICs receive whatever the program does, so a hold would
        // only delay them.
        let may_hold = cx.config.hold_acks
            && self.peer_on_this_host(cx.config)
            && self.ack_hold.ping_pong()
            && self.resp.only_an_ack()
            && self.sq.len() <= 1
            && !self.next_message_completes_a_receive()
            && self.state() == QpState::Rts;
        match self.ack_hold.until() {
            Some(until) if may_hold && now < until => true,
            Some(_) => {
                self.release_held_ack();
                false
            }
            None if may_hold => {
                let until = now + self.ack_hold.hold_time();
                self.ack_hold.hold(until);
                self.timers.arm_at(Timer::AckHold, until);
                self.counters.acks_held += 1;
                true
            }
            None => false,
        }
    }

    /// The next packet this QP sends, if any: responses first (they
    /// unblock the peer's requester; a plain ACK may wait for this QP's
    /// own answer, `holds_ack`), then requests (`hold_new`: an
    /// ACK-clocked pass, see `Engine::poll_transmit_ack_clocked`).
    pub fn poll_transmit(
        &mut self,
        cx: &mut QpCtx,
        now: Nanos,
        buf: &mut [u8],
        hold_new: HoldNew,
    ) -> Option<Transmit> {
        let t = if self.ack_hold.answering() {
            // The ACK held follows the whole answer.
            self.request_transmit(cx, now, buf, hold_new).or_else(|| {
                self.ack_hold.answer_sent();
                self.reply_transmit(cx, buf)
            })
        } else if self.holds_ack(cx, now) {
            // The ACK follows this QP's next request, or its timer.
            let t = self.request_transmit(cx, now, buf, hold_new);
            if t.is_some() {
                self.ack_hold.answered();
                self.timers.stop(Timer::AckHold);
            }
            t
        } else {
            self.reply_transmit(cx, buf)
                .or_else(|| self.request_transmit(cx, now, buf, hold_new))
        };
        if t.is_some() {
            self.counters.tx_packets += 1;
        }
        t
    }
}
