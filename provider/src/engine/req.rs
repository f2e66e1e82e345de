//! Requester (rxe's `rxe_req.c`): send WQEs become packets (segmented by
//! the path MTU, PSNs assigned, at most 128 unacknowledged PSNs, at most
//! `max_rd_atomic` READs/atomics in flight, fences honoured). The send
//! queue's bookkeeping (`ack_upto`, `rewind_to`, `una`) lives here too; the
//! completer (`comp.rs`) drives it from ACKs, responses and timers.

use super::qp::{Qp, QpCtx};
use super::{HoldNew, Nanos, PayloadAt, Transmit, PAYLOAD_BY_REF_MIN};
use crate::memory::RemoteQp;
use crate::qp_attr::{QpAttr, QpState, QpType};
use crate::types::WcStatus;
use crate::wr::{SendFlags, SendOpcode, SendWr};
use roxe_wire::aeth::AckTimeout;
use roxe_wire::packet::emit_headers;
use roxe_wire::{
    AtomicEthRepr, BthRepr, DethRepr, ExtHeaders, Opcode, Operation, PacketClass, Psn, RethRepr,
    Transport, ICRC_LEN,
};
use std::collections::VecDeque;

/// Unacknowledged PSNs allowed in flight towards a peer on another host:
/// rxe's RXE_MAX_UNACKED_PSNS. Without congestion control a larger burst
/// overflows the queues of a real path (a tap's 1,000 packets): at 1,024,
/// 64 KiB READs from rxe in an rxe-peer guest lost responses, and each
/// go-back-N resent the same burst until RETRY_EXC_ERR.
const MAX_UNACKED_PSNS: i32 = 128;
// Towards a peer on this host's loopback the window is
// `EngineConfig::loopback_window` (`MAX_LOOPBACK_WINDOW` says why wider).

/// Ask for an ACK at least this often inside long messages (rxe: 64).
const ACK_REQ_EVERY: u32 = 64;

/// A posted send WR and its progress.
#[derive(Debug, Clone)]
pub(crate) struct SendWqe {
    /// The request.
    pub wr: SendWr,
    /// Message length in bytes.
    pub len: u32,
    /// First PSN, once assigned.
    pub first_psn: Psn,
    /// PSNs the message consumes.
    pub npsn: u32,
    /// PSNs assigned (first packet sent at least once).
    pub started: bool,
    /// READ: response packets already placed (the resume point of a retry).
    pub read_pkts: u32,
    /// Final status, once known; WQEs retire in order.
    pub done: Option<WcStatus>,
    /// A request the QP made itself (not posted by the program).
    pub internal: Option<Internal>,
}

/// A request a QP makes on its own: tag matching's rendezvous (`tm.rs`).
/// It does not count against `max_send_wr` and has no send completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Internal {
    /// The READ of a matched rendezvous's data into its tagged buffer (the
    /// WR's `wr_id` is the buffer's): when it finishes, the buffer completes
    /// in `cq` (TM_RECV with DATA_VALID, or the error) and, on success, a
    /// FIN carrying `tag` and `app_ctx` goes to the sender.
    RndvRead {
        cq: super::CqId,
        tag: u64,
        app_ctx: u32,
    },
    /// That FIN.
    RndvFin,
}

impl SendWqe {
    pub(super) fn last_psn(&self) -> Psn {
        self.first_psn + (self.npsn - 1)
    }
    pub(super) fn contains(&self, p: Psn) -> bool {
        self.started && !p.is_before(self.first_psn) && !p.is_after(self.last_psn())
    }
}

/// Per-QP requester state.
#[derive(Debug)]
pub(crate) struct Requester {
    pub(super) sq: VecDeque<SendWqe>,
    /// Index in `sq` of the WQE whose packet goes out next.
    pub(super) cursor: usize,
    /// Packet index within that WQE (SEND/WRITE).
    pub(super) cursor_pkt: u32,
    /// PSN the next new WQE starts at.
    pub(super) next_psn: Psn,
    /// Oldest unacknowledged PSN.
    pub(super) una: Psn,
    /// One past the highest PSN ever sent: anything below is a retransmission.
    pub(super) high_psn: Psn,
    pub(super) retry_left: u8,
    pub(super) rnr_left: u8,
    pub(super) rto: Option<Nanos>,
    pub(super) rnr_wait: Option<Nanos>,
    pub(super) rd_atomic_inflight: u32,
    pub(super) since_ack_req: u32,
    /// A go-back-N triggered by a NAK or an implied NAK is under way: more
    /// stale responses from before it must not start (and pay for) another
    /// one. Cleared by progress; a timeout always retries (rxe's
    /// `started_retry`).
    pub(super) retry_started: bool,
    /// Set by `ack_upto` when a response moved `una` or finished a WQE:
    /// forward progress, which refills the retry counter (IBA 9.7.6.1.3).
    /// Finishing a SEND behind an unanswered READ counts too, so a READ
    /// whose response keeps being lost cannot exhaust retries while the
    /// peer is visibly making progress.
    pub(super) progressed: bool,
    /// WQEs in `sq` that are `internal`.
    pub(super) internal: usize,
}

impl Requester {
    pub fn new() -> Self {
        Requester {
            sq: VecDeque::new(),
            cursor: 0,
            cursor_pkt: 0,
            next_psn: Psn::new(0),
            una: Psn::new(0),
            high_psn: Psn::new(0),
            retry_left: 7,
            rnr_left: 7,
            rto: None,
            rnr_wait: None,
            rd_atomic_inflight: 0,
            since_ack_req: 0,
            retry_started: false,
            progressed: false,
            internal: 0,
        }
    }

    pub fn reset_psn(&mut self, psn: Psn) {
        self.next_psn = psn;
        self.una = psn;
        self.high_psn = psn;
    }

    pub fn reset_retries(&mut self, attr: &QpAttr) {
        self.retry_left = attr.retry_cnt;
        self.rnr_left = attr.rnr_retry;
    }

    /// The program's WRs queued (what `max_send_wr` bounds).
    pub fn outstanding(&self) -> usize {
        self.sq.len() - self.internal
    }

    /// A message has started (PSNs assigned) and is not finished.
    /// What `roxe stat` shows: (next new PSN, oldest unacknowledged PSN,
    /// send WQEs queued, retries left, RNR retries left).
    pub fn stat(&self) -> (u32, u32, usize, u8, u8) {
        (
            self.next_psn.value(),
            self.una.value(),
            self.sq.len(),
            self.retry_left,
            self.rnr_left,
        )
    }

    pub fn in_flight(&self) -> bool {
        self.sq.iter().any(|w| w.started && w.done.is_none())
    }

    pub fn post(&mut self, wr: SendWr, len: u32) {
        self.push(wr, len, None);
    }

    /// Queue a request of the QP's own, behind the program's.
    pub fn post_internal(&mut self, wr: SendWr, len: u32, kind: Internal) {
        self.internal += 1;
        self.push(wr, len, Some(kind));
    }

    fn push(&mut self, wr: SendWr, len: u32, internal: Option<Internal>) {
        self.sq.push_back(SendWqe {
            wr,
            len,
            first_psn: Psn::new(0),
            npsn: 1,
            started: false,
            read_pkts: 0,
            done: None,
            internal,
        });
    }

    /// Every WQE not yet retired (for flushing).
    pub fn flush(&mut self) -> Vec<SendWqe> {
        self.cursor = 0;
        self.cursor_pkt = 0;
        self.rto = None;
        self.rnr_wait = None;
        self.rd_atomic_inflight = 0;
        self.internal = 0;
        self.sq.drain(..).collect()
    }

    /// The liveness invariant: a message in flight always has a timer
    /// that will retransmit it or give up (retransmission or RNR), unless
    /// the QP's timeout is infinite. False means the QP would wait forever.
    pub fn timer_covers_flight(&self, timeout: AckTimeout) -> bool {
        timeout.nanos().is_none()
            || self.rto.is_some()
            || self.rnr_wait.is_some()
            || !self.in_flight()
    }

    /// Arm the retransmission timer (the liveness watchdog's repair).
    pub fn arm_retransmission(&mut self, now: Nanos, timeout: AckTimeout) {
        self.rto = timeout.nanos().map(|t| now + t);
    }

    pub fn next_deadline(&self) -> Option<Nanos> {
        match (self.rto, self.rnr_wait) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Go back to PSN `r`: the next packet sent is the one carrying it.
    pub(super) fn rewind_to(&mut self, r: Psn) {
        if let Some(i) = self
            .sq
            .iter()
            .position(|w| w.contains(r) && w.done.is_none())
        {
            self.cursor = i;
            let w = &self.sq[i];
            self.cursor_pkt = if w.wr.opcode == SendOpcode::RdmaRead {
                0
            } else {
                r.distance(w.first_psn).unsigned_abs()
            };
        }
    }

    /// Mark every SEND/WRITE whose PSNs all lie at or before `p` as
    /// acknowledged: the responder executed everything up to `p`. A READ or
    /// atomic in that range still needs its own response; the first such is
    /// returned as the PSN to resume from (an implied NAK), and `una` stops
    /// there.
    pub(super) fn ack_upto(&mut self, p: Psn) -> Option<Psn> {
        let mut implied = None;
        for w in self.sq.iter_mut() {
            // Finished first: a local operation (bind, invalidate) is done
            // without ever being started.
            if w.done.is_some() {
                continue;
            }
            if !w.started {
                break;
            }
            if w.last_psn().is_after(p) {
                break;
            }
            if w.wr.opcode.is_read_or_atomic() {
                implied.get_or_insert(w.first_psn + w.read_pkts);
                continue;
            }
            w.done = Some(WcStatus::Success);
            self.progressed = true;
        }
        let upto = implied.unwrap_or(p.next());
        if upto.is_after(self.una) {
            self.una = upto;
            self.progressed = true;
        }
        implied
    }

    /// Advance `una` past `p` unless an earlier READ/atomic is unanswered.
    pub(super) fn advance_una(&mut self, p: Psn) {
        // Only a started READ/atomic can block, and `rd_atomic_inflight`
        // counts those not yet retired: without one, no walk of the queue
        // (this runs for every ACK).
        let blocked = self.rd_atomic_inflight > 0
            && self.sq.iter().any(|w| {
                w.started
                    && w.done.is_none()
                    && w.wr.opcode.is_read_or_atomic()
                    && (w.first_psn + w.read_pkts).is_before(p)
            });
        if !blocked && p.next().is_after(self.una) {
            self.una = p.next();
        }
    }

    /// `una` never lags the first unfinished WQE: WQEs completed out of
    /// order (atomics, READs answered after an earlier READ) get no further
    /// ACK, so it is raised here rather than by the responses.
    pub(super) fn normalize_una(&mut self) {
        match self.sq.iter().find(|w| w.started && w.done.is_none()) {
            Some(w) => {
                let floor = w.first_psn + w.read_pkts;
                if floor.is_after(self.una) {
                    self.una = floor;
                }
            }
            None => self.una = self.next_psn,
        }
    }

    pub(super) fn rearm(&mut self, now: Nanos, timeout: AckTimeout) {
        self.rto = if self.una == self.next_psn
            || self.sq.iter().all(|w| w.done.is_some() || !w.started)
        {
            None
        } else {
            timeout.nanos().map(|t| now + t)
        };
    }
}

/// The BTH opcode for packet `i` of `n` of a request on an RC, UC or
/// XRC_SEND QP:
/// the opcode table's operation column read backwards. Immediate data and
/// an invalidation ride on the last packet only.
fn data_opcode(qp_type: QpType, op: SendOpcode, i: u32, n: u32) -> Option<Opcode> {
    let transport = match qp_type {
        QpType::Rc => Transport::Rc,
        QpType::Uc => Transport::Uc,
        QpType::Ud => Transport::Ud,
        QpType::XrcSend => Transport::Xrc,
        QpType::XrcRecv => return None,
    };
    let (operation, imm, inv) = match op {
        SendOpcode::Send => (Operation::Send, false, false),
        SendOpcode::SendWithImm => (Operation::Send, true, false),
        SendOpcode::SendWithInv => (Operation::Send, false, true),
        SendOpcode::RdmaWrite => (Operation::Write, false, false),
        SendOpcode::RdmaWriteWithImm => (Operation::Write, true, false),
        SendOpcode::RdmaRead => (Operation::ReadRequest, false, false),
        SendOpcode::AtomicCmpAndSwp => (Operation::CompareSwap, false, false),
        SendOpcode::AtomicFetchAndAdd => (Operation::FetchAdd, false, false),
        SendOpcode::AtomicWrite => (Operation::AtomicWrite, false, false),
        SendOpcode::LocalInv | SendOpcode::BindMw => return None,
    };
    let last = i + 1 >= n;
    let class = match (op.is_read_or_atomic(), i == 0, last) {
        _ if op == SendOpcode::AtomicWrite => PacketClass::Atomic8,
        (true, ..) => PacketClass::NoPayload,
        (false, true, true) => PacketClass::Only,
        (false, true, false) => PacketClass::First,
        (false, false, false) => PacketClass::Middle,
        (false, false, true) => PacketClass::Last,
    };
    Opcode::request(transport, operation, class, imm && last, inv && last)
}

fn packets_for(len: u32, pmtu: usize) -> u32 {
    (len as usize).div_ceil(pmtu).max(1) as u32
}

impl Qp {
    /// Execute the local operations (bind, invalidate) the cursor has
    /// reached, in send-queue order: they take effect now, send nothing,
    /// and complete in order with the rest (rxe's `rxe_do_local_ops`).
    /// False when one failed: its WR completes with MW_BIND_ERR (bind) or
    /// LOC_QP_OP_ERR (invalidate) and the QP goes to ERR.
    fn run_local_ops(&mut self, cx: &mut QpCtx) -> bool {
        loop {
            let r = &mut self.req;
            while r.sq.get(r.cursor).is_some_and(|w| w.done.is_some()) {
                r.cursor += 1;
                r.cursor_pkt = 0;
            }
            let Some(w) = r.sq.get(r.cursor) else {
                return true;
            };
            if !w.wr.opcode.is_local() {
                return true;
            }
            let by = RemoteQp {
                pd: self.init.pd,
                qpn: Some(self.qpn),
            };
            let (status, outcome) = match (w.wr.opcode, w.wr.bind) {
                (SendOpcode::BindMw, Some(bind)) => (
                    WcStatus::MwBindErr,
                    cx.memory.bind_window(by, &bind).map_err(|e| e.to_string()),
                ),
                (SendOpcode::LocalInv, _) => (
                    WcStatus::LocQpOpErr,
                    cx.memory
                        .invalidate(w.wr.invalidate_rkey, by)
                        .map_err(|e| e.to_string()),
                ),
                _ => (WcStatus::MwBindErr, Err("a bind without its window".into())),
            };
            let cursor = r.cursor;
            match outcome {
                Ok(()) => {
                    r.sq[cursor].done = Some(WcStatus::Success);
                    r.cursor += 1;
                    r.cursor_pkt = 0;
                    self.retire(cx);
                }
                Err(why) => {
                    tracing::debug!(
                        qpn = format_args!("{:#x}", self.qpn),
                        op = ?r.sq[cursor].wr.opcode,
                        %why,
                        "local operation failed: the QP goes to ERR"
                    );
                    r.sq[cursor].done = Some(status);
                    self.retire(cx);
                    self.fail(cx);
                    return false;
                }
            }
        }
    }

    /// Messages posted and not yet completed (sent or waiting to be).
    pub(super) fn queued_messages(&self) -> usize {
        self.req.sq.len()
    }

    /// PSNs sent and not yet acknowledged.
    pub(super) fn unacked_psns(&self) -> i32 {
        self.req.una.distance(self.req.next_psn).max(0)
    }

    /// This QP's PSNs unacknowledged under the loopback window
    /// (`EngineConfig::loopback_window`) while it has READs or atomics in
    /// flight: 0 unless it sends reliably (RTS or SQD) to a peer under
    /// that window.
    pub(super) fn loopback_unacked(&self, config: &super::config::EngineConfig) -> i32 {
        let sending =
            matches!(self.state(), QpState::Rts | QpState::Sqd) && self.req.rd_atomic_inflight > 0;
        match self.peer {
            Some(p) if sending && self.sends_reliably() && config.uses_loopback_window(p) => {
                self.unacked_psns()
            }
            _ => 0,
        }
    }

    /// The next request packet of this QP, if it may send one now
    /// (`hold_new`: a new message waits behind enough unacknowledged PSNs).
    pub(super) fn request_transmit(
        &mut self,
        cx: &mut QpCtx,
        now: Nanos,
        buf: &mut [u8],
        hold_new: HoldNew,
    ) -> Option<Transmit> {
        // SQD: messages already started finish (retransmissions included);
        // no new one starts.
        let state = self.state();
        let draining = state == QpState::Sqd;
        if !(state == QpState::Rts || draining) || self.req.rnr_wait.is_some() {
            return None;
        }
        if !draining && !self.run_local_ops(cx) {
            return None;
        }
        let qpn = self.qpn;
        let qp_type = self.init.qp_type;
        let reliable = self.sends_reliably();
        let pmtu = self.pmtu();
        let max_rd = u32::from(self.attr.max_rd_atomic.max(1));
        let timeout = self.ack_timeout();
        let (dest_qp_num, own_qkey, peer) = (self.attr.dest_qp_num, self.attr.qkey, self.peer);
        let loopback = peer.is_some_and(|p| cx.config.uses_loopback_window(p));
        let window = if loopback {
            cx.config
                .loopback_window
                .clamp(1, super::config::MAX_LOOPBACK_WINDOW)
        } else {
            MAX_UNACKED_PSNS
        };
        let (pd, src_port) = (self.init.pd, self.src_port());
        let r = &mut self.req;
        // Skip WQEs already finished (UC/UD complete when sent).
        while r.sq.get(r.cursor).is_some_and(|w| w.done.is_some()) {
            r.cursor += 1;
            r.cursor_pkt = 0;
        }
        let idx = r.cursor;
        let w = r.sq.get(idx)?;
        if !w.started {
            if draining {
                return None;
            }
            let hold = match hold_new {
                HoldNew::Never => false,
                HoldNew::Any => true,
                HoldNew::SinglePacket => w.len as usize <= pmtu,
            };
            if hold && reliable {
                cx.held_new = true;
                return None;
            }
            // Only a fenced WR looks back (a walk of the queue for every
            // message started cost 5 % of a 64 B SEND stream).
            if w.wr.flags.contains(SendFlags::FENCE)
                && r.sq
                    .iter()
                    .take(idx)
                    .any(|e| e.wr.opcode.is_read_or_atomic() && e.done.is_none())
            {
                return None;
            }
            if w.wr.opcode.is_read_or_atomic() && r.rd_atomic_inflight >= max_rd {
                return None;
            }
            if reliable && r.una.distance(r.next_psn) >= window {
                // The window is full: PSNs are assigned when the first
                // packet can go, so a started message always has one out.
                return None;
            }
            // READ responses come at the responder's pace into this
            // device's socket, whichever QP asked: towards loopback peers
            // the window bounds the device's reads together as well as
            // each QP's (4 QPs reading 64 KiB with a whole window each
            // overflowed the socket: responses lost, go-back-N re-reads).
            // A QP with nothing in flight still starts one, so none waits
            // behind the others' window. Requests that carry data are
            // paced by this device's own sending (a shared bound on them
            // left each of 1,024 QPs one message in flight: 64 KiB WRITEs
            // 2.7 -> 1.9 GB/s, an ACK per message).
            if reliable
                && loopback
                && w.wr.opcode.is_read_or_atomic()
                && r.una != r.next_psn
                && cx.loopback_unacked >= window
            {
                return None;
            }
            debug_assert_eq!(r.cursor_pkt, 0, "a new message starts at its first packet");
            r.cursor_pkt = 0;
            let npsn = match w.wr.opcode {
                o if o.is_atomic() => 1,
                _ if qp_type == QpType::Ud => 1,
                _ => packets_for(w.len, pmtu),
            };
            let first = r.next_psn;
            r.next_psn += npsn;
            let w = &mut r.sq[idx];
            w.first_psn = first;
            w.npsn = npsn;
            w.started = true;
            if w.wr.opcode.is_read_or_atomic() {
                r.rd_atomic_inflight += 1;
            }
        }
        let w = &r.sq[idx];
        let op = w.wr.opcode;
        let (psn, pkt_index) = if op == SendOpcode::RdmaRead {
            (w.first_psn + w.read_pkts, w.read_pkts)
        } else {
            (w.first_psn + r.cursor_pkt, r.cursor_pkt)
        };
        if reliable && r.una.distance(psn) >= window {
            return None;
        }
        let n = w.npsn;
        let last_pkt = op.is_read_or_atomic() || pkt_index + 1 >= n;
        // `post_send` refused UD WRs without an address; RTR needed an AV.
        let (opcode, dest_qp, dst) = match (qp_type, w.wr.ud, peer) {
            (QpType::Ud, Some(ud), _) => {
                let o = if op == SendOpcode::SendWithImm {
                    Opcode::UdSendOnlyImm
                } else {
                    Opcode::UdSendOnly
                };
                (o, ud.remote_qpn, ud.addr)
            }
            (QpType::Rc | QpType::Uc | QpType::XrcSend, _, Some(peer)) => {
                // `post_send` let only the operations the transport has through.
                let Some(o) = data_opcode(qp_type, op, pkt_index, n) else {
                    cx.internal_error(qpn, "a request with no opcode on its transport");
                    return None;
                };
                (o, dest_qp_num, peer)
            }
            _ => {
                cx.internal_error(qpn, "a request with no destination");
                return None;
            }
        };
        let mut ext = ExtHeaders::NONE;
        let h = opcode.headers();
        use roxe_wire::HeaderSet as H;
        let offset = pkt_index as u64 * pmtu as u64;
        if h.contains(H::RETH) {
            let (va, dma_len) = if op == SendOpcode::RdmaRead {
                (w.wr.remote_addr.wrapping_add(offset), w.len - offset as u32)
            } else {
                (w.wr.remote_addr, w.len)
            };
            ext.reth = Some(RethRepr {
                va,
                rkey: w.wr.rkey,
                dma_len,
            });
        }
        if h.contains(H::XRC_ETH) {
            ext.xrceth = Some(w.wr.xrc_remote_srqn & 0xFF_FFFF);
        }
        if h.contains(H::IMM_DT) {
            ext.imm_dt = Some(w.wr.imm_data);
        }
        if h.contains(H::IETH) {
            ext.ieth = Some(w.wr.invalidate_rkey);
        }
        if h.contains(H::ATOMIC_ETH) {
            let (swap_add, compare) = match op {
                SendOpcode::AtomicCmpAndSwp => (w.wr.swap, w.wr.compare_add),
                _ => (w.wr.compare_add, 0),
            };
            ext.atomic_eth = Some(AtomicEthRepr {
                va: w.wr.remote_addr,
                rkey: w.wr.rkey,
                swap_add,
                compare,
            });
        }
        if let (true, Some(ud)) = (h.contains(H::DETH), w.wr.ud) {
            // A Q_Key with the high bit set means: use the QP's own (IBA 10.2.5).
            let qkey = if ud.remote_qkey & 0x8000_0000 != 0 {
                own_qkey
            } else {
                ud.remote_qkey
            };
            ext.deth = Some(DethRepr {
                qkey,
                src_qp: qpn,
                reserved: 0,
            });
        }
        let payload_len = if opcode.allows_payload() && !op.is_read_or_atomic() {
            (w.len as u64 - offset).min(pmtu as u64) as usize
        } else {
            0
        };
        let ends = last_pkt;
        r.since_ack_req += 1;
        let ack_req = reliable && (ends || r.since_ack_req >= ACK_REQ_EVERY);
        if ack_req {
            r.since_ack_req = 0;
        }
        let solicited = ends
            && w.wr.flags.contains(SendFlags::SOLICITED)
            && matches!(
                op,
                SendOpcode::Send
                    | SendOpcode::SendWithImm
                    | SendOpcode::SendWithInv
                    | SendOpcode::RdmaWriteWithImm
            );
        let bth = BthRepr {
            ack_req,
            solicited,
            ..BthRepr::new(opcode, dest_qp, psn)
        };
        let Ok((hl, total)) = emit_headers(&bth, &ext, payload_len, buf) else {
            cx.internal_error(qpn, "a request does not fit the transmit buffer");
            return None;
        };
        let mut by_ref = None;
        let body = &mut buf[hl..hl + payload_len];
        let gathered = match &w.wr.inline_data {
            Some(d) if w.wr.flags.contains(SendFlags::INLINE) => {
                let o = offset as usize;
                d.get(o..o + payload_len)
                    .map(|s| body.copy_from_slice(s))
                    .is_some()
            }
            _ if payload_len == 0 => true,
            _ if cx.payload_by_ref && payload_len >= PAYLOAD_BY_REF_MIN => {
                let sgl = &w.wr.sg_list;
                match cx.memory.gather_ref(pd, sgl, offset as usize, payload_len) {
                    Ok(Some(data)) => {
                        by_ref = Some(PayloadAt { at: hl, data });
                        true
                    }
                    Ok(None) => cx.memory.gather(pd, sgl, offset as usize, body).is_ok(),
                    Err(_) => false,
                }
            }
            _ => cx
                .memory
                .gather(pd, &w.wr.sg_list, offset as usize, body)
                .is_ok(),
        };
        if !gathered {
            // A bad lkey or range in the local SGEs: local protection error.
            r.sq[idx].done = Some(WcStatus::LocProtErr);
            self.retire(cx);
            self.fail(cx);
            return None;
        }
        // Advance the cursor.
        if last_pkt {
            r.cursor += 1;
            r.cursor_pkt = 0;
        } else {
            r.cursor_pkt += 1;
        }
        if psn.is_before(r.high_psn) {
            cx.stats.tx_retransmits += 1;
            self.counters.tx_retransmits += 1;
        } else {
            r.high_psn = psn.next();
        }
        if reliable {
            if r.rto.is_none() {
                r.rto = timeout.nanos().map(|t| now + t);
            }
        } else if last_pkt {
            // Unreliable: complete as soon as the last packet is handed over.
            r.sq[idx].done = Some(WcStatus::Success);
            self.retire(cx);
        }
        debug_assert!(total > ICRC_LEN);
        if by_ref.is_some() {
            // Pad and ICRC follow the headers in the buffer.
            buf.copy_within(hl + payload_len..total, hl);
        }
        Some(Transmit {
            dst,
            src_port,
            len: total,
            payload: by_ref,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wr::SendWr;

    /// A requester with messages of `npsns` PSNs each (the opcodes given),
    /// all started, from PSN 100.
    fn started(msgs: &[(SendOpcode, u32)]) -> Requester {
        let mut r = Requester::new();
        r.reset_psn(Psn::new(100));
        for (i, &(op, npsn)) in msgs.iter().enumerate() {
            r.post(SendWr::new(i as u64, op, Vec::new()), npsn * 1024);
            let w = r.sq.back_mut().unwrap();
            w.first_psn = r.next_psn;
            w.npsn = npsn;
            w.started = true;
            r.next_psn += npsn;
            // As `request_transmit` counts them when they start.
            if op.is_read_or_atomic() {
                r.rd_atomic_inflight += 1;
            }
        }
        r.high_psn = r.next_psn;
        r.cursor = msgs.len();
        r
    }

    #[test]
    fn an_ack_finishes_every_send_it_covers_and_moves_una() {
        // 100..=102, 103, 104..=105
        let mut r = started(&[
            (SendOpcode::Send, 3),
            (SendOpcode::RdmaWrite, 1),
            (SendOpcode::Send, 2),
        ]);
        // Inside the first message: nothing finishes, una moves.
        assert_eq!(r.ack_upto(Psn::new(101)), None);
        assert_eq!(r.una, Psn::new(102));
        assert!(r.sq[0].done.is_none());
        assert!(r.progressed);
        // Through the second: both finish, the third does not.
        assert_eq!(r.ack_upto(Psn::new(103)), None);
        assert_eq!(r.sq[0].done, Some(WcStatus::Success));
        assert_eq!(r.sq[1].done, Some(WcStatus::Success));
        assert!(r.sq[2].done.is_none());
        assert_eq!(r.una, Psn::new(104));
        // A stale ACK changes nothing.
        r.progressed = false;
        assert_eq!(r.ack_upto(Psn::new(101)), None);
        assert_eq!(r.una, Psn::new(104));
        assert!(!r.progressed);
    }

    #[test]
    fn an_ack_beyond_an_unanswered_read_implies_a_nak() {
        // SEND 100, READ 101..=102, SEND 103
        let mut r = started(&[
            (SendOpcode::Send, 1),
            (SendOpcode::RdmaRead, 2),
            (SendOpcode::Send, 1),
        ]);
        // The READ still needs its response: resume from its first PSN,
        // una stops there, and the SEND behind it is acknowledged.
        assert_eq!(r.ack_upto(Psn::new(103)), Some(Psn::new(101)));
        assert_eq!(r.una, Psn::new(101));
        assert_eq!(r.sq[0].done, Some(WcStatus::Success));
        assert!(r.sq[1].done.is_none());
        assert_eq!(r.sq[2].done, Some(WcStatus::Success));
        // With one response packet placed, the resume point moves on.
        r.sq[1].read_pkts = 1;
        assert_eq!(r.ack_upto(Psn::new(103)), Some(Psn::new(102)));
    }

    #[test]
    fn advance_una_waits_for_an_earlier_read() {
        let mut r = started(&[
            (SendOpcode::RdmaRead, 2),
            (SendOpcode::AtomicFetchAndAdd, 1),
        ]);
        // The atomic (102) answered before the READ (100..=101).
        r.advance_una(Psn::new(102));
        assert_eq!(r.una, Psn::new(100));
        r.sq[0].read_pkts = 2;
        r.sq[0].done = Some(WcStatus::Success);
        r.advance_una(Psn::new(101));
        assert_eq!(r.una, Psn::new(102));
        r.sq[1].done = Some(WcStatus::Success);
        // Nothing unfinished: una is next_psn.
        r.normalize_una();
        assert_eq!(r.una, r.next_psn);
    }

    #[test]
    fn rewind_goes_back_to_the_packet_carrying_the_psn() {
        let mut r = started(&[(SendOpcode::Send, 4), (SendOpcode::RdmaRead, 3)]);
        r.rewind_to(Psn::new(102));
        assert_eq!((r.cursor, r.cursor_pkt), (0, 2));
        // A READ is re-requested from its first unanswered packet
        // (`read_pkts`), so the cursor packet index is 0.
        r.rewind_to(Psn::new(105));
        assert_eq!((r.cursor, r.cursor_pkt), (1, 0));
        // A finished message is not resent.
        r.sq[0].done = Some(WcStatus::Success);
        r.cursor = 1;
        r.rewind_to(Psn::new(101));
        assert_eq!(r.cursor, 1);
    }

    #[test]
    fn the_timer_is_armed_only_with_unfinished_messages_in_flight() {
        let timeout = AckTimeout::new(14).unwrap();
        let mut r = started(&[(SendOpcode::Send, 1)]);
        r.rearm(1_000, timeout);
        assert!(r.rto.is_some_and(|d| d > 1_000));
        assert!(r.timer_covers_flight(timeout));
        r.ack_upto(Psn::new(100));
        r.rearm(2_000, timeout);
        assert_eq!(r.rto, None);
        assert!(r.timer_covers_flight(timeout));
    }

    #[test]
    fn data_opcodes_follow_the_message_position() {
        use Opcode::*;
        let rc = QpType::Rc;
        assert_eq!(data_opcode(rc, SendOpcode::Send, 0, 1), Some(RcSendOnly));
        assert_eq!(
            data_opcode(rc, SendOpcode::SendWithImm, 0, 3),
            Some(RcSendFirst)
        );
        assert_eq!(
            data_opcode(rc, SendOpcode::SendWithImm, 1, 3),
            Some(RcSendMiddle)
        );
        assert_eq!(
            data_opcode(rc, SendOpcode::SendWithImm, 2, 3),
            Some(RcSendLastImm)
        );
        assert_eq!(
            data_opcode(rc, SendOpcode::SendWithInv, 0, 1),
            Some(RcSendOnlyInv)
        );
        assert_eq!(
            data_opcode(rc, SendOpcode::SendWithInv, 1, 2),
            Some(RcSendLastInv)
        );
        assert_eq!(
            data_opcode(rc, SendOpcode::RdmaWriteWithImm, 0, 1),
            Some(RcWriteOnlyImm)
        );
        assert_eq!(
            data_opcode(rc, SendOpcode::RdmaWrite, 1, 2),
            Some(RcWriteLast)
        );
        assert_eq!(
            data_opcode(rc, SendOpcode::RdmaRead, 0, 4),
            Some(RcReadRequest)
        );
        assert_eq!(
            data_opcode(rc, SendOpcode::AtomicCmpAndSwp, 0, 1),
            Some(RcCompareSwap)
        );
        assert_eq!(
            data_opcode(rc, SendOpcode::AtomicFetchAndAdd, 0, 1),
            Some(RcFetchAdd)
        );
        let uc = QpType::Uc;
        assert_eq!(
            data_opcode(uc, SendOpcode::RdmaWrite, 0, 2),
            Some(UcWriteFirst)
        );
        assert_eq!(
            data_opcode(uc, SendOpcode::SendWithImm, 0, 1),
            Some(UcSendOnlyImm)
        );
        assert_eq!(data_opcode(uc, SendOpcode::RdmaRead, 0, 1), None);
    }
}
