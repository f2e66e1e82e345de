//! Queue pairs ([`Qp`], `struct ibv_qp`): creation ([`QpInit`]), modify
//! and query, posting, and the helpers that connect a pair ([`Endpoint`],
//! [`Qp::connect`], [`Qp::ready_ud`]). Binding a memory window is in
//! `mw.rs`; XRC_RECV QPs are in `xrc.rs`.

use crate::backend::{Backed, SoftObj};
use crate::{
    abi, hw, verbs, AccessFlags, AddressVector, AttrMask, Cq, Errno, Error, Mtu, Pd, QpAttr, QpCap,
    QpState, QpType, RecvWr, Result, SendWr, Srq,
};
use roxe_provider::driver::Device;
use roxe_provider::engine::QpInitAttr;
use std::sync::Arc;

/// `struct ibv_qp_init_attr`.
pub struct QpInit<'a> {
    /// Transport.
    pub qp_type: QpType,
    /// Send completions.
    pub send_cq: &'a Cq,
    /// Receive completions.
    pub recv_cq: &'a Cq,
    /// Shared receive queue.
    pub srq: Option<&'a Srq>,
    /// Queue sizes.
    pub cap: QpCap,
    /// Complete every send WR.
    pub sq_sig_all: bool,
}

impl<'a> QpInit<'a> {
    /// Defaults: 128-deep queues, 4 SGEs, 64 inline bytes, sq_sig_all off.
    pub fn new(qp_type: QpType, send_cq: &'a Cq, recv_cq: &'a Cq) -> Self {
        QpInit {
            qp_type,
            send_cq,
            recv_cq,
            srq: None,
            cap: QpCap {
                max_send_wr: 128,
                max_recv_wr: 128,
                max_send_sge: 4,
                max_recv_sge: 4,
                max_inline_data: 64,
            },
            sq_sig_all: false,
        }
    }
}

/// A queue pair (`struct ibv_qp`).
#[derive(Clone)]
pub struct Qp {
    inner: Arc<QpInner>,
}

struct QpInner {
    /// Dropped first: a hardware QP before its PD, CQs and SRQ. A soft
    /// QP's id is its QP number.
    imp: Backed<SoftObj<u32>, hw::HwQp>,
    pd: Pd,
    qp_type: QpType,
    _send_cq: Cq,
    _recv_cq: Cq,
    _srq: Option<Srq>,
}

impl Drop for QpInner {
    fn drop(&mut self) {
        if let Some(s) = self.imp.soft() {
            let _ = s.dev.engine().destroy_qp(s.id);
        }
    }
}

impl Pd {
    /// `ibv_create_qp`. The CQs and SRQ must be of this PD's device.
    pub fn create_qp(&self, init: &QpInit<'_>) -> Result<Qp> {
        let mismatch = || {
            verbs(
                "ibv_create_qp",
                Errno::EINVAL,
                "a CQ or SRQ of another device",
            )
        };
        let imp = self.inner.imp.make_child(
            |pd| {
                let on_pd = |cq: &Cq| cq.inner.imp.soft().and_then(|c| c.id_on(&pd.dev));
                let (Some(send_cq), Some(recv_cq)) = (on_pd(init.send_cq), on_pd(init.recv_cq))
                else {
                    return Err(mismatch());
                };
                let srq = init
                    .srq
                    .map(|s| {
                        s.inner
                            .imp
                            .soft()
                            .and_then(|s| s.id_on(&pd.dev))
                            .ok_or_else(mismatch)
                    })
                    .transpose()?;
                let attr = QpInitAttr {
                    qp_type: init.qp_type,
                    pd: pd.id,
                    send_cq,
                    recv_cq,
                    srq,
                    xrcd: None,
                    cap: init.cap,
                    sq_sig_all: init.sq_sig_all,
                };
                Ok(SoftObj {
                    dev: pd.dev.clone(),
                    id: pd.dev.engine().create_qp(attr)?,
                })
            },
            |pd| {
                let (Some(send_cq), Some(recv_cq)) =
                    (init.send_cq.inner.imp.hw(), init.recv_cq.inner.imp.hw())
                else {
                    return Err(mismatch());
                };
                let srq = init
                    .srq
                    .map(|s| s.inner.imp.hw().ok_or_else(mismatch))
                    .transpose()?;
                let c = init.cap;
                let cap = abi::ibv_qp_cap {
                    max_send_wr: c.max_send_wr,
                    max_recv_wr: c.max_recv_wr,
                    max_send_sge: c.max_send_sge,
                    max_recv_sge: c.max_recv_sge,
                    max_inline_data: c.max_inline_data,
                };
                pd.create_qp(init.qp_type, send_cq, recv_cq, srq, cap, init.sq_sig_all)
            },
        )?;
        Ok(Qp {
            inner: Arc::new(QpInner {
                imp,
                pd: self.clone(),
                qp_type: init.qp_type,
                _send_cq: init.send_cq.clone(),
                _recv_cq: init.recv_cq.clone(),
                _srq: init.srq.cloned(),
            }),
        })
    }
}

/// `ibv_modify_qp` of QP `qpn` of a soft device: an LID-only address
/// vector (`is_global = 0`) is routed to the loopback device with that
/// LID, and the route to the destination is checked.
pub(crate) fn modify_soft(dev: &Device, qpn: u32, attr: &QpAttr, mask: AttrMask) -> Result<()> {
    let mut attr = *attr;
    if mask.contains(AttrMask::AV) {
        if let Some(av) = dev.resolve_av(&attr.av) {
            attr.av = av;
            dev.check_route(&av)?;
        }
    }
    Ok(dev.engine().modify_qp(qpn, &attr, mask)?)
}

impl Qp {
    /// The QP number.
    pub fn qp_num(&self) -> u32 {
        self.inner.imp.dispatch(|s| s.id, |h| h.qp_num())
    }
    /// The transport.
    pub fn qp_type(&self) -> QpType {
        self.inner.qp_type
    }
    /// The PD.
    pub fn pd(&self) -> &Pd {
        &self.inner.pd
    }
    /// `ibv_modify_qp`. On a soft device, an LID-only address vector
    /// (`is_global = 0`) is routed to the loopback device with that LID.
    pub fn modify(&self, attr: &QpAttr, mask: AttrMask) -> Result<()> {
        self.inner.imp.dispatch(
            |s| modify_soft(&s.dev, s.id, attr, mask),
            |h| h.modify(attr, mask),
        )
    }
    /// The queue sizes the device granted (`ibv_query_qp`'s `cap`; it
    /// may round up what [`QpInit`] asked for).
    pub fn cap(&self) -> Result<QpCap> {
        self.inner.imp.dispatch(
            |s| Ok(s.dev.engine().query_qp(s.id)?.1.cap),
            |h| Ok(h.cap()),
        )
    }
    /// `ibv_query_qp`: the attributes and the current state.
    pub fn query(&self) -> Result<QpAttr> {
        self.inner
            .imp
            .dispatch(|s| Ok(s.dev.engine().query_qp(s.id)?.0), |h| h.query())
    }
    /// `ibv_post_send`.
    pub fn post_send(&self, wr: SendWr) -> Result<()> {
        self.inner.imp.dispatch_with(
            wr,
            |s, wr| Ok(s.dev.engine_for_post().post_send(s.id, wr)?),
            |h, wr| h.post_send(&wr),
        )
    }
    /// `ibv_post_send` with a list of work requests (`wr->next`): posted
    /// in order under one device lock, so the packets they make sendable
    /// leave together (one `sendmmsg`, runs of equal packets as GSO sends)
    /// instead of one system call per request. Stops at the first request
    /// refused, as `bad_wr` does: `Err((index, error))`, the requests before
    /// it posted.
    pub fn post_send_list(
        &self,
        wrs: impl IntoIterator<Item = SendWr>,
    ) -> std::result::Result<(), (usize, Error)> {
        self.inner.imp.dispatch_with(
            wrs,
            |s, wrs| {
                let mut engine = s.dev.engine_for_post_list();
                for (i, wr) in wrs.into_iter().enumerate() {
                    engine.post_send(s.id, wr).map_err(|e| (i, e.into()))?;
                }
                Ok(())
            },
            |h, wrs| {
                for (i, wr) in wrs.into_iter().enumerate() {
                    h.post_send(&wr).map_err(|e| (i, e))?;
                }
                Ok(())
            },
        )
    }

    /// `ibv_post_recv`.
    pub fn post_recv(&self, wr: RecvWr) -> Result<()> {
        self.inner.imp.dispatch_with(
            wr,
            |s, wr| Ok(s.dev.engine().post_recv(s.id, wr)?),
            |h, wr| h.post_recv(&wr),
        )
    }

    /// `ibv_post_recv` with a list of work requests (`wr->next`): posted
    /// in order under one device lock (one lock and one pass for the list,
    /// not one per request). Stops at the first request refused, as
    /// `bad_wr` does: `Err((index, error))`, the requests before it posted.
    pub fn post_recv_list(
        &self,
        wrs: impl IntoIterator<Item = RecvWr>,
    ) -> std::result::Result<(), (usize, Error)> {
        self.inner.imp.dispatch_with(
            wrs,
            |s, wrs| {
                let mut engine = s.dev.engine();
                for (i, wr) in wrs.into_iter().enumerate() {
                    engine.post_recv(s.id, wr).map_err(|e| (i, e.into()))?;
                }
                Ok(())
            },
            |h, wrs| {
                for (i, wr) in wrs.into_iter().enumerate() {
                    h.post_recv(&wr).map_err(|e| (i, e))?;
                }
                Ok(())
            },
        )
    }
}

/// What two sides exchange out of band to connect an RC/UC QP pair
/// (serialisable with the `serde` feature).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Endpoint {
    /// LID (loopback devices).
    pub lid: u16,
    /// QP number.
    pub qpn: u32,
    /// Initial PSN.
    pub psn: u32,
    /// GID.
    pub gid: [u8; 16],
}

/// READs and atomics outstanding each way after [`Qp::connect`].
pub(crate) const CONNECT_RD_ATOMIC: u8 = 16;

/// How [`Qp::connect`] and [`XrcRecvQp::connect`](crate::XrcRecvQp::connect)
/// bring a QP to RTS.
pub(crate) struct Connect {
    pub(crate) qp_type: QpType,
    pub(crate) local_psn: u32,
    pub(crate) mtu: Mtu,
    pub(crate) access: AccessFlags,
    pub(crate) timeout: u8,
    pub(crate) sgid_index: u8,
    /// `max_rd_atomic` and `max_dest_rd_atomic`: READs and atomics
    /// outstanding each way.
    pub(crate) rd_atomic: u8,
}

impl Connect {
    /// The three modifies, with the masks `ibv_rc_pingpong` uses for RC/UC
    /// and the kernel's XRC_INI/XRC_TGT rules for the XRC halves.
    pub(crate) fn run(
        &self,
        remote: &Endpoint,
        modify: impl Fn(&QpAttr, AttrMask) -> Result<()>,
    ) -> Result<()> {
        let t = self.qp_type;
        // Which halves of a reliable connection this QP has.
        let responder = matches!(t, QpType::Rc | QpType::XrcRecv);
        let requester = matches!(t, QpType::Rc | QpType::XrcSend);
        let mut a = QpAttr {
            qp_state: QpState::Init,
            pkey_index: 0,
            port_num: 1,
            qp_access_flags: self.access,
            ..QpAttr::default()
        };
        modify(
            &a,
            AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS,
        )?;
        a.qp_state = QpState::Rtr;
        a.path_mtu = self.mtu;
        a.dest_qp_num = remote.qpn;
        a.rq_psn = remote.psn;
        a.av = AddressVector {
            dgid: remote.gid,
            sgid_index: self.sgid_index,
            is_global: true,
            hop_limit: 64,
            dlid: remote.lid,
            port_num: 1,
            ..AddressVector::default()
        };
        let mut mask = AttrMask::STATE
            | AttrMask::AV
            | AttrMask::PATH_MTU
            | AttrMask::DEST_QPN
            | AttrMask::RQ_PSN;
        if responder {
            a.max_dest_rd_atomic = self.rd_atomic;
            a.min_rnr_timer = 12;
            mask = mask | AttrMask::MAX_DEST_RD_ATOMIC | AttrMask::MIN_RNR_TIMER;
        }
        modify(&a, mask)?;
        a.qp_state = QpState::Rts;
        a.sq_psn = self.local_psn;
        let mut mask = AttrMask::STATE | AttrMask::SQ_PSN;
        if t.is_reliable() {
            a.timeout = self.timeout;
            mask |= AttrMask::TIMEOUT;
        }
        if requester {
            a.retry_cnt = 7;
            a.rnr_retry = 7;
            a.max_rd_atomic = self.rd_atomic;
            mask = mask | AttrMask::RETRY_CNT | AttrMask::RNR_RETRY | AttrMask::MAX_QP_RD_ATOMIC;
        }
        modify(&a, mask)
    }
}

impl Qp {
    /// This side's endpoint (GID and LID of its device; on hardware the
    /// GID at [`Context::default_gid_index`](crate::Context::default_gid_index)),
    /// with `psn`.
    pub fn endpoint(&self, psn: u32) -> Endpoint {
        let (lid, gid) = self.inner.imp.dispatch(
            |s| (s.dev.lid(), s.dev.gid()),
            |h| {
                let ctx = h.context();
                (
                    ctx.port_attr(1).map_or(0, |p| p.lid),
                    ctx.query_gid(1, u32::from(h.gid_index()))
                        .unwrap_or([0; 16]),
                )
            },
        );
        Endpoint {
            lid,
            qpn: self.qp_num(),
            psn,
            gid,
        }
    }

    /// RESET → INIT → RTR → RTS towards `remote` with the usual attributes
    /// (the modify masks `ibv_rc_pingpong` uses): `access` for the remote
    /// side, path MTU `mtu`, `timeout`/`retry_cnt`/`rnr_retry` as given.
    /// On hardware the source GID is
    /// [`Context::default_gid_index`](crate::Context::default_gid_index)
    /// and the path MTU at most the port's active MTU.
    pub fn connect(
        &self,
        local_psn: u32,
        remote: &Endpoint,
        mtu: Mtu,
        access: AccessFlags,
        timeout: u8,
    ) -> Result<()> {
        self.connect_with_outstanding(local_psn, remote, mtu, access, timeout, CONNECT_RD_ATOMIC)
    }

    /// [`connect`](Self::connect) with `rd_atomic` READs and atomics
    /// outstanding each way (`max_rd_atomic`, `max_dest_rd_atomic`;
    /// `connect` uses 16). At most the device's `max_qp_init_rd_atom` and
    /// `max_qp_rd_atom` ([`DeviceAttr`](crate::DeviceAttr)), else the
    /// modify fails with EINVAL, as `ibv_modify_qp` does.
    pub fn connect_with_outstanding(
        &self,
        local_psn: u32,
        remote: &Endpoint,
        mtu: Mtu,
        access: AccessFlags,
        timeout: u8,
        rd_atomic: u8,
    ) -> Result<()> {
        let (mtu, sgid_index) = self.inner.imp.dispatch(
            |_| (mtu, 0),
            |h| {
                let active = h.context().port_attr(1).map_or(mtu, |p| p.active_mtu);
                (mtu.min(active), h.gid_index())
            },
        );
        let how = Connect {
            qp_type: self.inner.qp_type,
            local_psn,
            mtu,
            access,
            timeout,
            sgid_index,
            rd_atomic,
        };
        how.run(remote, |a, m| self.modify(a, m))
    }

    /// RESET → INIT → RTR → RTS for a UD QP with `qkey`.
    pub fn ready_ud(&self, qkey: u32, sq_psn: u32) -> Result<()> {
        let mut a = QpAttr {
            qp_state: QpState::Init,
            pkey_index: 0,
            port_num: 1,
            qkey,
            ..QpAttr::default()
        };
        self.modify(
            &a,
            AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::QKEY,
        )?;
        a.qp_state = QpState::Rtr;
        self.modify(&a, AttrMask::STATE)?;
        a.qp_state = QpState::Rts;
        a.sq_psn = sq_psn;
        self.modify(&a, AttrMask::STATE | AttrMask::SQ_PSN)
    }
}
