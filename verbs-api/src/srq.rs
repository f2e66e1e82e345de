//! Shared receive queues ([`Srq`], `struct ibv_srq`): plain, XRC and
//! tag-matching.

use crate::backend::{Backed, SoftObj};
use crate::{hw, verbs, Cq, CqId, Errno, Pd, RecvWr, Result, SrqOp, Xrcd};
use roxe_provider::engine::{Engine, SrqId};
use roxe_provider::types::{PdId, VerbsResult};
use std::sync::Arc;

/// A shared receive queue (`struct ibv_srq`).
#[derive(Clone)]
pub struct Srq {
    pub(crate) inner: Arc<SrqInner>,
}

pub(crate) struct SrqInner {
    /// Dropped first: a hardware SRQ before its PD.
    pub(crate) imp: Backed<SoftObj<SrqId>, hw::HwSrq>,
    /// Kept alive while the SRQ is.
    _pd: Pd,
    /// An XRC SRQ's domain, kept alive while it is.
    _xrcd: Option<Xrcd>,
    /// An XRC SRQ's receive CQ, or a tag-matching SRQ's (of its tag-list
    /// operations), kept alive while it is.
    _cq: Option<Cq>,
}

impl Drop for SrqInner {
    fn drop(&mut self) {
        // The QPs using it hold it: none is left.
        if let Some(s) = self.imp.soft() {
            let _ = s.dev.engine().destroy_srq(s.id);
        }
    }
}

impl Pd {
    /// `ibv_create_srq`.
    pub fn create_srq(&self, max_wr: u32, max_sge: u32) -> Result<Srq> {
        let imp = self.inner.imp.make_child(
            |s| {
                Ok(SoftObj {
                    dev: s.dev.clone(),
                    id: s.dev.engine().create_srq(s.id, max_wr, max_sge)?,
                })
            },
            |h| h.create_srq(max_wr, max_sge),
        )?;
        Ok(Srq {
            inner: Arc::new(SrqInner {
                imp,
                _pd: self.clone(),
                _xrcd: None,
                _cq: None,
            }),
        })
    }

    /// `ibv_create_srq_ex` with `IBV_SRQT_XRC`: a shared receive queue of
    /// XRC domain `xrcd` whose receives complete in `cq`. Requests reach it
    /// through any XRC_RECV QP of the domain whose XRCETH names
    /// [`Srq::number`]; RDMA through it is checked against this PD. Soft
    /// devices only.
    pub fn create_xrc_srq(&self, xrcd: &Xrcd, cq: &Cq, max_wr: u32, max_sge: u32) -> Result<Srq> {
        let x = xrcd.inner.id;
        self.soft_srq_on_cq(cq, Some(xrcd.clone()), "XRC", |e, pd, cq| {
            e.create_xrc_srq(pd, x, cq, max_wr, max_sge)
        })
    }

    /// `ibv_create_srq_ex` with `IBV_SRQT_TM`: a tag-matching SRQ whose tag
    /// list holds up to `max_tags` buffers ([`Context::tm_caps`]) and whose
    /// tag-list operations ([`Srq::post_op`]) complete in `cq`. RC QPs
    /// created on it deliver messages by their tag-matching header: see
    /// `roxe_provider::engine::tm` for the rules. Soft devices only.
    ///
    /// [`Context::tm_caps`]: crate::Context::tm_caps
    pub fn create_tm_srq(&self, cq: &Cq, max_wr: u32, max_sge: u32, max_tags: u32) -> Result<Srq> {
        self.soft_srq_on_cq(cq, None, "tag matching", |e, pd, cq| {
            e.create_tm_srq(pd, cq, max_wr, max_sge, max_tags)
        })
    }

    /// An SRQ of a soft device made by `create` with this PD and `cq`'s
    /// id (XRC and tag-matching SRQs), holding `cq` (and `xrcd`) while it
    /// lives; EOPNOTSUPP naming `what` on a hardware device.
    fn soft_srq_on_cq(
        &self,
        cq: &Cq,
        xrcd: Option<Xrcd>,
        what: &str,
        create: impl FnOnce(&mut Engine, PdId, CqId) -> VerbsResult<SrqId>,
    ) -> Result<Srq> {
        let (Some(pd), Some(soft_cq)) = (self.inner.imp.soft(), cq.inner.imp.soft()) else {
            return Err(verbs(
                "ibv_create_srq_ex",
                Errno::EOPNOTSUPP,
                format!("{what} through the Rust API on a hardware device"),
            ));
        };
        let foreign_xrcd = xrcd
            .as_ref()
            .is_some_and(|x| !Arc::ptr_eq(&x.inner.dev, &pd.dev));
        let (Some(cq_id), false) = (soft_cq.id_on(&pd.dev), foreign_xrcd) else {
            return Err(verbs(
                "ibv_create_srq_ex",
                Errno::EINVAL,
                "a CQ or XRC domain of another device",
            ));
        };
        let id = create(&mut pd.dev.engine(), pd.id, cq_id)?;
        Ok(Srq {
            inner: Arc::new(SrqInner {
                imp: Backed::Soft(SoftObj {
                    dev: pd.dev.clone(),
                    id,
                }),
                _pd: self.clone(),
                _xrcd: xrcd,
                _cq: Some(cq.clone()),
            }),
        })
    }
}

impl Srq {
    /// `ibv_get_srq_num`: the number an XRC sender puts in its WRs
    /// (`SendWr::xrc_remote_srqn`) to reach this SRQ. Soft devices only.
    pub fn number(&self) -> Result<u32> {
        let s = self.inner.imp.soft_only(
            "ibv_get_srq_num",
            "XRC through the Rust API on a hardware device",
        )?;
        Ok(s.dev.engine().srq_number(s.id)?)
    }

    /// `ibv_post_srq_recv`.
    pub fn post_recv(&self, wr: RecvWr) -> Result<()> {
        self.inner.imp.dispatch_with(
            wr,
            |s, wr| Ok(s.dev.engine().post_srq_recv(s.id, wr)?),
            |h, wr| h.post_recv(&wr),
        )
    }

    /// `ibv_post_srq_ops` (one operation) on a tag-matching SRQ: applied
    /// at once, completing in its CQ when signaled (always on failure). An
    /// ADD returns the tag's handle (what a DEL names), the others 0. Soft
    /// devices only.
    pub fn post_op(&self, op: SrqOp) -> Result<u32> {
        let s = self.inner.imp.soft_only(
            "ibv_post_srq_ops",
            "tag matching through the Rust API on a hardware device",
        )?;
        // The engine guard's release notifies the CQ's channel.
        Ok(s.dev.engine().post_srq_op(s.id, op)?)
    }
}
