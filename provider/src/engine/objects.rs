//! The engine's verbs on its objects: PDs, memory windows, CQs, SRQs
//! (XRC and tag-matching ones too), XRC domains and QPs, and the
//! snapshots `roxe stat` shows. Verbs on a QP go through
//! `Engine::verb_on_qp`, so that what they change is settled as any other
//! call to a QP is.

use super::qp::{Qp, RecvWqe, Srq, XrcSrq};
use super::stats::{CqSnapshot, QpSnapshot};
use super::{
    tm, verb_error, CqId, Engine, Nanos, QpCap, QpInitAttr, SrqId, SrqOp, SrqOpKind, XrcdId,
};
use crate::cq::CompletionQueue;
use crate::memory::{MemoryTable, MwType};
use crate::qp_attr::{AttrMask, QpAttr, QpState, QpType};
use crate::types::{Errno, PdId, VerbsResult};
use crate::wr::{RecvWr, SendWr, WorkCompletion};
use std::collections::VecDeque;

impl Engine {
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
            return Err(verb_error("ibv_dealloc_pd", Errno::EINVAL, "no such PD"));
        }
        if self.qps.values().any(|q| q.init.pd == pd) || self.srqs.values().any(|s| s.pd == pd) {
            return Err(verb_error(
                "ibv_dealloc_pd",
                Errno::EBUSY,
                "PD still in use",
            ));
        }
        self.pds.remove(&pd.0);
        Ok(())
    }

    /// `ibv_alloc_mw`: an unbound memory window of `kind` in `pd`; its
    /// key. `EINVAL` for no such PD.
    pub fn alloc_mw(&mut self, pd: PdId, kind: MwType) -> VerbsResult<u32> {
        if !self.pds.contains_key(&pd.0) {
            return Err(verb_error("ibv_alloc_mw", Errno::EINVAL, "no such PD"));
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
            return Err(verb_error(
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
            return Err(verb_error(
                VERB,
                Errno::EINVAL,
                format!("cqe {depth} out of range"),
            ));
        }
        let c = self
            .cqs
            .get_mut(&cq.0)
            .ok_or_else(|| verb_error(VERB, Errno::EINVAL, "no such CQ"))?;
        if !c.resize(depth as usize) {
            return Err(verb_error(
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
            return Err(verb_error(
                "ibv_destroy_cq",
                Errno::EBUSY,
                "CQ still in use",
            ));
        }
        self.cqs
            .remove(&cq.0)
            .map(|_| ())
            .ok_or_else(|| verb_error("ibv_destroy_cq", Errno::EINVAL, "no such CQ"))
    }

    /// `ibv_poll_cq`: up to `out.len()` completions.
    pub fn poll_cq(&mut self, cq: CqId, out: &mut [WorkCompletion]) -> VerbsResult<usize> {
        let q = self
            .cqs
            .get_mut(&cq.0)
            .ok_or_else(|| verb_error("ibv_poll_cq", Errno::EINVAL, "no such CQ"))?;
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
            .ok_or_else(|| verb_error("ibv_poll_cq", Errno::EINVAL, "no such CQ"))?;
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
            return Err(verb_error(VERB, Errno::EINVAL, "no such XRC domain"));
        }
        if !self.cqs.contains_key(&cq.0) {
            return Err(verb_error(VERB, Errno::EINVAL, "no such CQ"));
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
            return Err(verb_error(VERB, Errno::EINVAL, "no such CQ"));
        }
        if max_tags == 0 || max_tags > self.config.max_tm_tags {
            return Err(verb_error(VERB, Errno::EINVAL, "max_num_tags out of range"));
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
            .ok_or_else(|| verb_error(VERB, Errno::EINVAL, "no such SRQ"))?;
        let max_sge = s.max_sge;
        let Some(t) = s.tm.as_mut() else {
            return Err(verb_error(VERB, Errno::EINVAL, "not a tag-matching SRQ"));
        };
        if let SrqOpKind::Add { sg_list, .. } = &op.kind {
            if sg_list.len() > max_sge as usize {
                return Err(verb_error(VERB, Errno::EINVAL, "too many SGEs"));
            }
            if t.full() {
                return Err(verb_error(VERB, Errno::ENOMEM, "tag list full"));
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
                self.on_cq_overflow(cq);
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
            return Err(verb_error(verb, Errno::EINVAL, "no such PD"));
        }
        if max_wr == 0 || max_wr > self.config.max_qp_wr || max_sge > self.config.max_sge {
            return Err(verb_error(verb, Errno::EINVAL, "SRQ size out of range"));
        }
        // SRQ numbers travel in 24 bits (the XRCETH).
        if self.next_srq > 0xFF_FFFF {
            return Err(verb_error(verb, Errno::ENOMEM, "SRQ numbers exhausted"));
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
            return Err(verb_error(VERB, Errno::EINVAL, "no such SRQ"));
        }
        if self.qps.values().any(|q| q.init.srq == Some(srq)) {
            return Err(verb_error(VERB, Errno::EBUSY, "SRQ still in use"));
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
            return Err(verb_error(VERB, Errno::EINVAL, "no such XRC domain"));
        }
        let in_use = self
            .srqs
            .values()
            .any(|s| s.xrc.is_some_and(|x| x.xrcd == xrcd))
            || self.qps.values().any(|q| q.init.xrcd == Some(xrcd));
        if in_use {
            return Err(verb_error(VERB, Errno::EBUSY, "XRC domain still in use"));
        }
        self.xrcds.remove(&xrcd.0);
        Ok(())
    }

    /// The SRQ number an XRCETH names to reach `srq` (`ibv_get_srq_num`).
    pub fn srq_number(&self, srq: SrqId) -> VerbsResult<u32> {
        if self.srqs.contains_key(&srq.0) {
            Ok(srq.0)
        } else {
            Err(verb_error("ibv_get_srq_num", Errno::EINVAL, "no such SRQ"))
        }
    }

    /// `ibv_post_srq_recv`.
    pub fn post_srq_recv(&mut self, srq: SrqId, wr: RecvWr) -> VerbsResult<()> {
        let s = self
            .srqs
            .get_mut(&srq.0)
            .ok_or_else(|| verb_error("ibv_post_srq_recv", Errno::EINVAL, "no such SRQ"))?;
        // rxe's post_one_recv (and mlx5) test for a full queue first.
        if s.queue.len() >= s.max_wr as usize {
            return Err(verb_error("ibv_post_srq_recv", Errno::ENOMEM, "SRQ full"));
        }
        if wr.sg_list.len() > s.max_sge as usize {
            return Err(verb_error(
                "ibv_post_srq_recv",
                Errno::EINVAL,
                "too many SGEs",
            ));
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
                    return Err(verb_error(
                        VERB,
                        Errno::EINVAL,
                        "XRC_RECV needs an XRC domain",
                    ));
                }
                // Each request's XRC SRQ brings the PD and the CQ.
                (init.pd, init.send_cq, init.recv_cq, init.srq) = (PdId(0), CqId(0), CqId(0), None);
                init.cap = QpCap::default();
            }
            t => {
                if init.xrcd.is_some() {
                    return Err(verb_error(
                        VERB,
                        Errno::EINVAL,
                        "only XRC_RECV QPs have an XRC domain",
                    ));
                }
                if !self.pds.contains_key(&init.pd.0) {
                    return Err(verb_error(VERB, Errno::EINVAL, "no such PD"));
                }
                if t == QpType::XrcSend {
                    // No receive side.
                    if init.srq.is_some() {
                        return Err(verb_error(VERB, Errno::EINVAL, "XRC_SEND QPs have no SRQ"));
                    }
                    init.recv_cq = init.send_cq;
                    init.cap.max_recv_wr = 0;
                    init.cap.max_recv_sge = 0;
                }
                if !self.cqs.contains_key(&init.send_cq.0)
                    || !self.cqs.contains_key(&init.recv_cq.0)
                {
                    return Err(verb_error(VERB, Errno::EINVAL, "no such CQ"));
                }
                if let Some(s) = init.srq {
                    match self.srqs.get(&s.0) {
                        None => return Err(verb_error(VERB, Errno::EINVAL, "no such SRQ")),
                        Some(srq) if srq.xrc.is_some() => {
                            return Err(verb_error(
                                VERB,
                                Errno::EINVAL,
                                "an XRC SRQ serves XRC_RECV QPs only",
                            ))
                        }
                        // Tag matching's rendezvous READs from the sender.
                        Some(srq) if srq.tm.is_some() && t != QpType::Rc => {
                            return Err(verb_error(
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
            return Err(verb_error(
                VERB,
                Errno::EINVAL,
                "capability beyond the device's limits",
            ));
        }
        // Past a wrap, skip the QPNs still in use.
        let slot = self.config.qpn_slot;
        let mut qpn = self.next_qpn;
        for _ in 0..=0xFF_FFFF {
            if !self.qps.contains_key(&qpn) {
                break;
            }
            qpn = super::next_qpn(qpn, slot);
        }
        if self.qps.contains_key(&qpn) {
            return Err(verb_error(
                VERB,
                Errno::ENOMEM,
                "every QPN of the device is in use",
            ));
        }
        self.next_qpn = super::next_qpn(qpn, slot);
        let qp = Qp::new(qpn, init, self.config.active_mtu.bytes());
        self.qps.insert(qpn, qp);
        Ok(qpn)
    }

    /// `ibv_destroy_qp`.
    pub fn destroy_qp(&mut self, qpn: u32) -> VerbsResult<()> {
        let mut q = self
            .qps
            .remove(&qpn)
            .ok_or_else(|| verb_error("ibv_destroy_qp", Errno::EINVAL, "no such QP"))?;
        if let Some(d) = q.indexed_deadline {
            self.deadlines.remove(&(d, qpn));
        }
        self.loopback_unacked -= q.counted_loopback_unacked;
        self.scheduled.remove(&qpn);
        self.window_waiters.remove(&qpn);
        if q.counted_loopback_unacked > 0 {
            self.wake_window_waiters();
        }
        // Receive completions of a destroyed QP not yet polled go with it,
        // as with libmlx5; its send completions stay, as with rxe
        // (`Cq::remove_qp_receives` says why).
        for cq in [q.init.send_cq, q.init.recv_cq] {
            if let Some(c) = self.cqs.get_mut(&cq.0) {
                let dropped = c.remove_qp_receives(qpn);
                if dropped > 0 {
                    tracing::debug!(
                        qpn = format_args!("{qpn:#x}"),
                        dropped,
                        "destroyed QP's unpolled receive completions dropped"
                    );
                }
            }
        }
        // A program commonly destroys its QP right after the last message
        // arrived: the ACK it held for an answer still goes, or the peer's
        // last send would never complete.
        if q.release_held_ack() {
            self.parting.push(q);
        }
        Ok(())
    }

    /// `ibv_query_qp`: the stored attributes and the current state.
    pub fn query_qp(&self, qpn: u32) -> VerbsResult<(QpAttr, QpInitAttr)> {
        self.qps
            .get(&qpn)
            .map(Qp::query)
            .ok_or_else(|| verb_error("ibv_query_qp", Errno::EINVAL, "no such QP"))
    }

    /// `ibv_modify_qp`, with the transition and attribute checks of
    /// libibverbs/rxe (EINVAL for anything they reject).
    pub fn modify_qp(&mut self, qpn: u32, attr: &QpAttr, mask: AttrMask) -> VerbsResult<()> {
        let limits = self.config.qp_limits;
        self.verb_on_qp("ibv_modify_qp", qpn, |q, cx| {
            q.modify(cx, attr, mask, &limits)
        })
    }

    /// `ibv_post_recv`.
    pub fn post_recv(&mut self, qpn: u32, wr: RecvWr) -> VerbsResult<()> {
        self.verb_on_qp("ibv_post_recv", qpn, |q, cx| q.post_recv(cx, wr))
    }

    /// `ibv_post_send`.
    pub fn post_send(&mut self, qpn: u32, wr: SendWr) -> VerbsResult<()> {
        self.release_overtaken_acks(Some(qpn));
        self.verb_on_qp("ibv_post_send", qpn, |q, cx| q.post_send(cx, wr))
    }

    /// A completion did not fit in `cq`: every QP feeding it goes to ERR
    /// (rxe's class G), and its outstanding WRs are flushed.
    pub(super) fn on_cq_overflow(&mut self, cq: CqId) {
        tracing::warn!(cq = cq.0, "CQ overflow: the QPs feeding it go to ERR");
        let victims: Vec<u32> = self
            .qps
            .values()
            .filter(|q| (q.init.send_cq == cq || q.init.recv_cq == cq) && q.state() != QpState::Err)
            .map(|q| q.qpn)
            .collect();
        for v in victims {
            // Flushing into a full CQ cascades no further.
            self.drive_and_schedule(v, |q, cx| q.enter_error(cx));
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
}
