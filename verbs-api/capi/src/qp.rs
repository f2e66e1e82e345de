//! Queue pairs: `ibv_create_qp`, `ibv_create_qp_ex` (the `verbs_context`
//! op), `ibv_modify_qp`, `ibv_query_qp`, `ibv_destroy_qp` and
//! `ibv_qp_to_qp_ex`. XRC_RECV QPs are `xrc`'s; posting is in `post`, the
//! `ibv_wr_*` API of extended QPs in `qp_ex`.

use crate::abi::convert::{qp_attr_from_c, qp_attr_to_c};
use crate::abi::*;
use crate::context::context;
use crate::cq::RoxeCq;
use crate::object::{container_of, destroy, hand_out, wait_for_acked_events, Used};
use crate::pd::RoxePd;
use crate::srq::RoxeSrq;
use crate::{fail_null, guard};
use parking_lot::Mutex;
use roxe_verbs::{AttrMask, Pd, Qp, QpAttr, QpInit, QpState, QpType, SendWr};
use std::ffi::c_int;
use std::mem::zeroed;
use std::ptr::{self, null_mut};
use std::sync::atomic::{AtomicU32, Ordering};

/// Every QP carries the `ibv_qp_ex` layout (its `qp_base` first, so it is
/// also an `ibv_qp`); `ibv_qp_to_qp_ex` hands it out only for QPs created
/// through `ibv_create_qp_ex` with send-ops flags, as libibverbs does.
#[repr(C)]
pub(crate) struct RoxeQp {
    pub(crate) c: ibv_qp_ex,
    pub(crate) qp: Qp,
    /// Created with `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`: the flags.
    send_ops: Option<u64>,
    /// The `ibv_wr_*` batch between `wr_start` and `wr_complete`, and the
    /// first error a void `ibv_wr_*` call hit (reported by `wr_complete`).
    pub(crate) batch: Mutex<(Vec<SendWr>, c_int)>,
    cap: ibv_qp_cap,
    sq_sig_all: c_int,
    pd: Used<RoxePd>,
    _send_cq: Used<RoxeCq>,
    _recv_cq: Used<RoxeCq>,
    _srq: Option<Used<RoxeSrq>>,
    /// Async events `ibv_get_async_event` handed out naming this QP
    /// (counted under the context's QP map lock): `ibv_destroy_qp` waits
    /// until the program has acknowledged as many.
    pub(crate) async_events_returned: AtomicU32,
}

impl RoxeQp {
    pub(crate) fn context(&self) -> *mut ibv_context {
        self.c.qp_base.context
    }

    pub(crate) fn qp_type(&self) -> u32 {
        self.c.qp_base.qp_type
    }
}

/// The `RoxeQp` behind a QP pointer: `None` for NULL and for an XRC_RECV
/// QP (a different container, see `crate::xrc`). The one way to a
/// `RoxeQp`, so nothing posts on an XRC_RECV QP.
///
/// # Safety
/// `qp` must be NULL or the `ibv_qp` (or `ibv_qp_ex`) of a live QP of
/// this library.
pub(crate) unsafe fn as_roxe_qp<'a, C>(qp: *mut C) -> Option<&'a RoxeQp> {
    let qp = qp.cast::<ibv_qp>();
    // SAFETY: per the contract.
    if unsafe { crate::xrc::is_recv_qp(qp) } {
        return None;
    }
    // SAFETY: per the contract, a QP that is not XRC_RECV is a RoxeQp.
    unsafe { container_of::<RoxeQp, _>(qp) }
}

/// The roxe QP and PD behind a QP this library created (rdma_cm attaches
/// them to an id).
///
/// # Safety
/// `qp` must be NULL or a live QP of this library.
pub(crate) unsafe fn qp_parts(qp: *mut ibv_qp) -> Option<(Qp, Pd)> {
    // SAFETY: per the contract.
    let q = unsafe { as_roxe_qp(qp) }?;
    Some((q.qp.clone(), q.pd.pd.clone()))
}

/// # Safety
/// `pd` is NULL or a live PD (of this library or the system's); `init` is
/// NULL or the caller's, its CQs and SRQ NULL or live objects of the PD's
/// context.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_qp(
    pd: *mut ibv_pd,
    init: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    crate::passthrough::pass_through!(
        object pd,
        "ibv_create_qp",
        fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp,
        (pd, init),
        null_mut()
    );
    // SAFETY: pd NULL or ours; init is the caller's.
    guard(null_mut(), || unsafe { create_qp(pd, init, None) })
}

/// `vctx->create_qp_ex`: the PD and send-ops flags of the extended
/// attributes; XRC, RSS, TSO, source QPN and creation flags are not
/// supported (EOPNOTSUPP).
///
/// # Safety
/// `ctx` is one of this library's contexts; `attr` is NULL or the
/// caller's, its PD, CQs, SRQ and XRC domain NULL or this library's.
pub(crate) unsafe extern "C" fn create_qp_ex(
    ctx: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    guard(null_mut(), || {
        // SAFETY: attr is the caller's.
        let Some(a) = (unsafe { attr.as_mut() }) else {
            return fail_null(libc::EINVAL);
        };
        if a.qp_type == IBV_QPT_XRC_RECV {
            if a.comp_mask & !(IBV_QP_INIT_ATTR_XRCD | IBV_QP_INIT_ATTR_PD) != 0 {
                return fail_null(libc::EOPNOTSUPP);
            }
            // SAFETY: a is the caller's; its XRCD NULL or ours.
            return unsafe { crate::xrc::create_recv_qp(ctx, a) };
        }
        let known =
            IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
        if a.comp_mask & IBV_QP_INIT_ATTR_PD == 0 {
            return fail_null(libc::EINVAL);
        }
        if a.comp_mask & !known != 0
            || (a.comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS != 0 && a.create_flags != 0)
        {
            return fail_null(libc::EOPNOTSUPP);
        }
        let send_ops = if a.comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0 {
            if a.send_ops_flags & !SUPPORTED_SEND_OPS != 0 {
                return fail_null(libc::EOPNOTSUPP);
            }
            Some(a.send_ops_flags)
        } else {
            None
        };
        // SAFETY: ibv_qp_init_attr_ex starts with the ibv_qp_init_attr
        // layout (asserted in abi.rs), and the PD is NULL or ours.
        unsafe { create_qp(a.pd, attr.cast(), send_ops) }
    })
}

/// `IBV_QPT_RAW_PACKET`: a QP type roxe does not implement.
const IBV_QPT_RAW_PACKET: u32 = 8;

/// The `ibv_wr_*` operations `qp_ex` implements.
const SUPPORTED_SEND_OPS: u64 = IBV_QP_EX_WITH_RDMA_WRITE
    | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
    | IBV_QP_EX_WITH_SEND
    | IBV_QP_EX_WITH_SEND_WITH_IMM
    | IBV_QP_EX_WITH_RDMA_READ
    | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP
    | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD
    | IBV_QP_EX_WITH_SEND_WITH_INV
    | IBV_QP_EX_WITH_LOCAL_INV
    | IBV_QP_EX_WITH_BIND_MW
    | IBV_QP_EX_WITH_ATOMIC_WRITE;

/// A QP on `pd` (both creation verbs); the granted capabilities are
/// written back into `init->cap`.
///
/// # Safety
/// `pd` is NULL or a PD of this library; `init` is NULL or the caller's,
/// its CQs and SRQ NULL or this library's.
unsafe fn create_qp(
    pd: *mut ibv_pd,
    init: *mut ibv_qp_init_attr,
    send_ops: Option<u64>,
) -> *mut ibv_qp {
    // SAFETY: pd NULL or ours; init is the caller's.
    let (Some(p), Some(init)) = (unsafe { container_of::<RoxePd, _>(pd) }, unsafe {
        init.as_mut()
    }) else {
        return fail_null(libc::EINVAL);
    };
    // SAFETY: CQs and SRQ are NULL or ours.
    let (scq, rcq, srq) = unsafe {
        (
            container_of::<RoxeCq, _>(init.send_cq),
            container_of::<RoxeCq, _>(init.recv_cq),
            container_of::<RoxeSrq, _>(init.srq),
        )
    };
    // An XRC_SEND QP has no receive side: its receive CQ may be NULL
    // (it is stored as the send CQ, as the engine does).
    let rcq = if init.qp_type == IBV_QPT_XRC_SEND && init.recv_cq.is_null() {
        scq
    } else {
        rcq
    };
    let (Some(scq), Some(rcq)) = (scq, rcq) else {
        return fail_null(libc::EINVAL);
    };
    let qp_type = match QpType::try_from(init.qp_type) {
        // XRC_RECV QPs come from ibv_create_qp_ex with an XRCD.
        Ok(QpType::XrcRecv) => return fail_null(libc::EINVAL),
        Ok(t) => t,
        // Raw packet QPs are a type roxe does not implement.
        Err(_) if init.qp_type == IBV_QPT_RAW_PACKET => return fail_null(libc::EOPNOTSUPP),
        Err(_) => return fail_null(libc::EINVAL),
    };
    let mut qi = QpInit::new(qp_type, &scq.cq, &rcq.cq);
    qi.srq = srq.map(|s| &s.srq);
    let cap = init.cap;
    qi.cap.max_send_wr = cap.max_send_wr;
    qi.cap.max_recv_wr = cap.max_recv_wr;
    qi.cap.max_send_sge = cap.max_send_sge;
    qi.cap.max_recv_sge = cap.max_recv_sge;
    qi.cap.max_inline_data = cap.max_inline_data;
    qi.sq_sig_all = init.sq_sig_all != 0;
    let qp = match p.pd.create_qp(&qi) {
        Ok(q) => q,
        Err(e) => return fail_null(e.errno()),
    };
    let granted = cap;
    init.cap = granted;
    let qpn = qp.qp_num();
    // SAFETY: ibv_qp_ex is pointers, integers and pthread objects: all
    // zero is valid (NULL function pointers are filled below).
    let mut c: ibv_qp_ex = unsafe { zeroed() };
    c.qp_base = ibv_qp {
        context: p.context(),
        qp_context: init.qp_context,
        pd,
        send_cq: init.send_cq,
        recv_cq: init.recv_cq,
        srq: init.srq,
        handle: qpn,
        qp_num: qpn,
        state: QpState::Reset as u32,
        qp_type: init.qp_type,
        mutex: libc::PTHREAD_MUTEX_INITIALIZER,
        cond: libc::PTHREAD_COND_INITIALIZER,
        events_completed: 0,
    };
    if send_ops.is_some() {
        crate::qp_ex::fill_wr_ops(&mut c);
    }
    let raw = hand_out(RoxeQp {
        c,
        qp,
        send_ops,
        batch: Mutex::new((Vec::new(), 0)),
        cap: granted,
        sq_sig_all: init.sq_sig_all,
        pd: Used::new(p),
        _send_cq: Used::new(scq),
        _recv_cq: Used::new(rcq),
        _srq: srq.map(Used::new),
        async_events_returned: AtomicU32::new(0),
    });
    // SAFETY: the PD's context is an open context.
    if let Some(c) = unsafe { context(p.context()) } {
        c.qps.lock().insert(qpn, raw as usize);
    }
    raw.cast()
}

/// # Safety
/// `qp` is NULL or a live QP (of this library or the system's), not used
/// again once destroyed.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    crate::passthrough::pass_through!(
        object qp,
        "ibv_destroy_qp",
        fn(*mut ibv_qp) -> c_int,
        (qp),
        libc::EOPNOTSUPP
    );
    // SAFETY: qp is NULL or a live QP (the C contract).
    if unsafe { crate::xrc::is_recv_qp(qp) } {
        // SAFETY: an XRC_RECV QP on one of our contexts is ours.
        return unsafe { crate::xrc::destroy_recv_qp(qp) };
    }
    let retire = |q: &RoxeQp| {
        // Async events stop naming it: none is written for it from now
        // on, and one still unread is dropped by `ibv_get_async_event`
        // (as the kernel drops a destroyed object's unread events).
        // SAFETY: a QP's context outlives it.
        let returned = match unsafe { context(q.context()) } {
            Some(c) => {
                let mut qps = c.qps.lock();
                qps.remove(&q.qp.qp_num());
                q.async_events_returned.load(Ordering::Acquire)
            }
            None => 0,
        };
        // As libibverbs: wait until every event handed out naming this QP
        // has been acknowledged, so no program thread still holds one that
        // points at the QP about to be freed.
        let qp = ptr::addr_of!(q.c.qp_base).cast_mut();
        // SAFETY: the QP is live until freed after this closure; its mutex
        // and cond were initialised at create, and `ibv_ack_async_event`
        // counts acks with `count_acked_events` on the same three members.
        unsafe {
            wait_for_acked_events(
                ptr::addr_of_mut!((*qp).mutex),
                ptr::addr_of_mut!((*qp).cond),
                ptr::addr_of!((*qp).events_completed),
                returned,
            )
        }
        Ok(())
    };
    // SAFETY: a QP of this library that is not XRC_RECV is a RoxeQp; the
    // objects it uses outlive it (they refuse to go while it counts).
    unsafe { destroy(qp, retire) }
}

/// # Safety
/// `qp` is NULL or a live QP (of this library or the system's); `attr` is
/// NULL or the caller's.
#[no_mangle]
pub unsafe extern "C" fn ibv_modify_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    mask: c_int,
) -> c_int {
    crate::passthrough::pass_through!(
        object qp,
        "ibv_modify_qp",
        fn(*mut ibv_qp, *mut ibv_qp_attr, c_int) -> c_int,
        (qp, attr, mask),
        libc::EOPNOTSUPP
    );
    // SAFETY: qp is NULL or a live QP (the C contract).
    if unsafe { crate::xrc::is_recv_qp(qp) } {
        // SAFETY: an XRC_RECV QP on one of our contexts is ours.
        return unsafe { crate::xrc::modify_recv_qp(qp, attr, mask) };
    }
    guard(libc::EIO, || {
        // SAFETY: qp NULL or ours.
        let Some(q) = (unsafe { as_roxe_qp(qp) }) else {
            return libc::EINVAL;
        };
        // SAFETY: qp is live; attr NULL or the caller's.
        unsafe { modify_with(qp, attr, mask, |a, m| q.qp.modify(a, m)) }
    })
}

/// `ibv_modify_qp`'s common part: the C attributes converted, `modify`
/// run, and on success the public `state` field updated.
///
/// # Safety
/// `qp` is a live QP of this library; `attr` NULL or the caller's.
pub(crate) unsafe fn modify_with(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    mask: c_int,
    modify: impl FnOnce(&QpAttr, AttrMask) -> roxe_verbs::Result<()>,
) -> c_int {
    // SAFETY: per the contract.
    let Some(a) = (unsafe { attr.as_ref() }) else {
        return libc::EINVAL;
    };
    let attr_r = match qp_attr_from_c(a, mask) {
        Ok(v) => v,
        Err(e) => return e,
    };
    match modify(&attr_r, AttrMask(mask as u32)) {
        Ok(()) => {
            if mask & IBV_QP_STATE != 0 {
                // SAFETY: the public state field programs read, written
                // through the QP's own pointer.
                unsafe { (*qp).state = a.qp_state };
            }
            0
        }
        Err(e) => e.errno(),
    }
}

/// # Safety
/// `qp` is NULL or a live QP (of this library or the system's); `attr` and
/// `init` are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    _mask: c_int,
    init: *mut ibv_qp_init_attr,
) -> c_int {
    crate::passthrough::pass_through!(
        object qp,
        "ibv_query_qp",
        fn(*mut ibv_qp, *mut ibv_qp_attr, c_int, *mut ibv_qp_init_attr) -> c_int,
        (qp, attr, _mask, init),
        libc::EOPNOTSUPP
    );
    // SAFETY: qp is NULL or a live QP (the C contract).
    if unsafe { crate::xrc::is_recv_qp(qp) } {
        // SAFETY: an XRC_RECV QP on one of our contexts is ours.
        return unsafe { crate::xrc::query_recv_qp(qp, attr, init) };
    }
    guard(libc::EIO, || {
        // SAFETY: qp NULL or ours.
        let Some(q) = (unsafe { as_roxe_qp(qp) }) else {
            return libc::EINVAL;
        };
        let b = &q.c.qp_base;
        let created = ibv_qp_init_attr {
            qp_context: b.qp_context,
            send_cq: b.send_cq,
            recv_cq: b.recv_cq,
            srq: b.srq,
            cap: q.cap,
            qp_type: b.qp_type,
            sq_sig_all: q.sq_sig_all,
        };
        // SAFETY: qp is live; attr and init NULL or the caller's.
        unsafe { query_with(qp, attr, init, created, || q.qp.query()) }
    })
}

/// `ibv_query_qp`'s common part: EINVAL without both out-pointers, else
/// the attributes `query` reports into `attr` (with the capabilities of
/// `created`), the creation attributes into `init`, and the public `state`
/// field updated.
///
/// # Safety
/// `qp` is a live QP of this library; `attr` and `init` are NULL or
/// writable.
pub(crate) unsafe fn query_with(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    init: *mut ibv_qp_init_attr,
    created: ibv_qp_init_attr,
    query: impl FnOnce() -> roxe_verbs::Result<QpAttr>,
) -> c_int {
    if attr.is_null() || init.is_null() {
        return libc::EINVAL;
    }
    let a = match query() {
        Ok(a) => a,
        Err(e) => return e.errno(),
    };
    let out = qp_attr_to_c(&a, created.cap);
    // SAFETY: attr and init are the caller's (not NULL); qp is live, its
    // public state field written through its own pointer.
    unsafe {
        attr.write(out);
        init.write(created);
        (*qp).state = out.qp_state;
    }
    0
}

/// The `ibv_qp_ex` of a QP created with send-ops flags, else NULL.
///
/// # Safety
/// `qp` is NULL or a live QP (of this library or the system's).
#[no_mangle]
pub unsafe extern "C" fn ibv_qp_to_qp_ex(qp: *mut ibv_qp) -> *mut ibv_qp_ex {
    crate::passthrough::pass_through!(
        object qp,
        "ibv_qp_to_qp_ex",
        fn(*mut ibv_qp) -> *mut ibv_qp_ex,
        (qp),
        null_mut()
    );
    // SAFETY: qp NULL or ours.
    match unsafe { as_roxe_qp(qp) } {
        Some(q) if q.send_ops.is_some() => qp.cast(),
        _ => null_mut(),
    }
}
