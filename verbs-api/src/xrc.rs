//! XRC domains ([`Xrcd`], `struct ibv_xrcd`) and the receiving QPs of XRC
//! connections ([`XrcRecvQp`]). XRC SRQs are made in `srq.rs`
//! (`Pd::create_xrc_srq`); the sending side is a [`Qp`](crate::Qp) of type
//! `XrcSend`. Soft devices only through the Rust API.

use crate::qp::{modify_soft, Connect, CONNECT_RD_ATOMIC};
use crate::{AccessFlags, AttrMask, Context, CqId, Endpoint, Mtu, QpAttr, QpCap, QpType, Result};
use roxe_provider::driver::Device;
use roxe_provider::engine::{QpInitAttr, XrcdId};
use std::sync::Arc;

/// An XRC domain (`struct ibv_xrcd`). Closed when the last handle, SRQ and
/// QP in it are dropped.
#[derive(Clone)]
pub struct Xrcd {
    pub(crate) inner: Arc<XrcdInner>,
}

pub(crate) struct XrcdInner {
    pub(crate) dev: Arc<Device>,
    pub(crate) id: XrcdId,
    _ctx: Context,
}

impl Drop for XrcdInner {
    fn drop(&mut self) {
        // Its SRQs and QPs each hold an Xrcd: none is left.
        let _ = self.dev.engine().close_xrcd(self.id);
    }
}

impl std::fmt::Debug for Xrcd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Xrcd")
            .field("id", &self.inner.id.0)
            .finish()
    }
}

impl Context {
    /// `ibv_open_xrcd`: an XRC domain, to group XRC SRQs and the XRC_RECV
    /// QPs that deliver to them. EOPNOTSUPP on a hardware device.
    pub fn open_xrcd(&self) -> Result<Xrcd> {
        let d = self.inner.imp.soft_only(
            "ibv_open_xrcd",
            "XRC through the Rust API on a hardware device",
        )?;
        let id = d.engine().open_xrcd();
        Ok(Xrcd {
            inner: Arc::new(XrcdInner {
                dev: Arc::clone(d),
                id,
                _ctx: self.clone(),
            }),
        })
    }
}

impl Xrcd {
    /// `ibv_create_qp_ex` with `IBV_QPT_XRC_RECV`: the receiving half of
    /// XRC connections. It has no queues: each request's XRCETH picks the
    /// domain's SRQ that takes it, whose PD and CQ apply.
    pub fn create_recv_qp(&self) -> Result<XrcRecvQp> {
        let d = &self.inner.dev;
        let qpn = d.engine().create_qp(QpInitAttr {
            qp_type: QpType::XrcRecv,
            pd: roxe_provider::types::PdId(0),
            send_cq: CqId(0),
            recv_cq: CqId(0),
            srq: None,
            xrcd: Some(self.inner.id),
            cap: QpCap::default(),
            sq_sig_all: false,
        })?;
        Ok(XrcRecvQp {
            dev: Arc::clone(d),
            qpn,
            _xrcd: self.clone(),
        })
    }
}

/// An XRC_RECV QP (`IBV_QPT_XRC_RECV`): connected like an RC QP to one
/// XRC_SEND QP, with nothing to post.
pub struct XrcRecvQp {
    dev: Arc<Device>,
    qpn: u32,
    _xrcd: Xrcd,
}

impl Drop for XrcRecvQp {
    fn drop(&mut self) {
        let _ = self.dev.engine().destroy_qp(self.qpn);
    }
}

impl XrcRecvQp {
    /// The QP number (what the XRC_SEND side connects to).
    pub fn qp_num(&self) -> u32 {
        self.qpn
    }

    /// `ibv_modify_qp` (the kernel's XRC_TGT rules).
    pub fn modify(&self, attr: &QpAttr, mask: AttrMask) -> Result<()> {
        modify_soft(&self.dev, self.qpn, attr, mask)
    }

    /// `ibv_query_qp`.
    pub fn query(&self) -> Result<QpAttr> {
        Ok(self.dev.engine().query_qp(self.qpn)?.0)
    }

    /// This side's endpoint, with `psn`.
    pub fn endpoint(&self, psn: u32) -> Endpoint {
        Endpoint {
            lid: self.dev.lid(),
            qpn: self.qpn,
            psn,
            gid: self.dev.gid(),
        }
    }

    /// RESET → INIT → RTR → RTS towards the XRC_SEND QP `remote`, as
    /// [`Qp::connect`](crate::Qp::connect).
    pub fn connect(
        &self,
        local_psn: u32,
        remote: &Endpoint,
        mtu: Mtu,
        access: AccessFlags,
        timeout: u8,
    ) -> Result<()> {
        let how = Connect {
            qp_type: QpType::XrcRecv,
            local_psn,
            mtu,
            access,
            timeout,
            sgid_index: 0,
            rd_atomic: CONNECT_RD_ATOMIC,
        };
        how.run(remote, |a, m| self.modify(a, m))
    }
}
