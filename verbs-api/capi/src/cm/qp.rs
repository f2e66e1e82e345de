//! An id's QP and SRQ: `rdma_create_qp` (and `_ex`), `rdma_destroy_qp`,
//! `rdma_create_srq` (and `_ex`), `rdma_destroy_srq` and
//! `rdma_init_qp_attr`. The QP is made through this library's own
//! `create_qp_ex` (with CQs and completion channels of the id's own when
//! the attributes name none) and attached to roxe's `CmId`, which moves it
//! as the CM proceeds.

use super::id::{id_priv, sync_qp_state, IdPriv};
use crate::abi::*;
use crate::{fail_minus_one, guard, last_errno};
use roxe_verbs::QpState;
use std::ffi::{c_int, c_void};
use std::mem::zeroed;
use std::ptr::null_mut;

/// librdmacm's `ucma_destroy_cqs`.
///
/// # Safety
/// `p` must be a live id whose CQs no QP or SRQ uses any more.
unsafe fn destroy_cqs(p: *mut IdPriv) {
    // SAFETY: per the contract; the CQs and channels are the id's own.
    unsafe {
        let id = &mut (*p).id;
        if !id.recv_cq.is_null() {
            crate::cq::ibv_destroy_cq(id.recv_cq);
            if !id.send_cq.is_null() && id.send_cq != id.recv_cq {
                crate::cq::ibv_destroy_cq(id.send_cq);
            }
            id.send_cq = null_mut();
            id.recv_cq = null_mut();
        }
        if !id.recv_cq_channel.is_null() {
            crate::comp_channel::ibv_destroy_comp_channel(id.recv_cq_channel);
            if !id.send_cq_channel.is_null() && id.send_cq_channel != id.recv_cq_channel {
                crate::comp_channel::ibv_destroy_comp_channel(id.send_cq_channel);
            }
            id.send_cq_channel = null_mut();
            id.recv_cq_channel = null_mut();
        }
    }
}

/// librdmacm's `ucma_create_cqs`: a CQ with its own completion channel
/// for each queue that has none (size 0: none needed).
///
/// # Safety
/// `p` must be a live id with a device.
unsafe fn create_cqs(p: *mut IdPriv, send_size: u32, recv_size: u32) -> Result<(), c_int> {
    // SAFETY: per the contract.
    unsafe {
        let id = &mut (*p).id;
        let me = p.cast::<c_void>();
        let mk = |size: u32,
                  ch: &mut *mut ibv_comp_channel,
                  cq: &mut *mut ibv_cq|
         -> Result<(), c_int> {
            *ch = crate::comp_channel::ibv_create_comp_channel(id.verbs);
            if ch.is_null() {
                return Err(last_errno());
            }
            *cq = crate::cq::ibv_create_cq(id.verbs, size as c_int, me, *ch, 0);
            if cq.is_null() {
                return Err(last_errno());
            }
            Ok(())
        };
        let (mut rch, mut rcq, mut sch, mut scq) = (
            id.recv_cq_channel,
            id.recv_cq,
            id.send_cq_channel,
            id.send_cq,
        );
        let mut r = Ok(());
        if recv_size > 0 {
            r = mk(recv_size, &mut rch, &mut rcq);
        }
        if r.is_ok() && send_size > 0 {
            r = mk(send_size, &mut sch, &mut scq);
        }
        id.recv_cq_channel = rch;
        id.recv_cq = rcq;
        id.send_cq_channel = sch;
        id.send_cq = scq;
        if r.is_err() {
            destroy_cqs(p);
        }
        r
    }
}

/// # Safety
/// `id` is NULL or any pointer (only a live id of this library is used: the
/// rest are EINVAL); a live id is not destroyed during the call; `attr` is NULL
/// or the caller's, its PD, CQs and SRQ NULL or this library's.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_qp_ex(
    id: *mut rdma_cm_id,
    attr: *mut ibv_qp_init_attr_ex,
) -> c_int {
    guard(-1, || {
        // SAFETY: attr the caller's.
        let (Some(p), Some(a)) = (id_priv(id), unsafe { attr.as_mut() }) else {
            return fail_minus_one(libc::EINVAL);
        };
        // SAFETY: p is live.
        let idr = unsafe { &mut (*p).id };
        if !idr.qp.is_null() || idr.verbs.is_null() {
            return fail_minus_one(libc::EINVAL);
        }
        if a.comp_mask & IBV_QP_INIT_ATTR_PD == 0 || a.pd.is_null() {
            a.comp_mask |= IBV_QP_INIT_ATTR_PD;
            a.pd = idr.pd;
        // SAFETY: a non-NULL PD of the caller's.
        } else if unsafe { (*a.pd).context } != idr.verbs {
            return fail_minus_one(libc::EINVAL);
        }
        if (!idr.recv_cq.is_null() && !a.recv_cq.is_null() && idr.recv_cq != a.recv_cq)
            || (!idr.send_cq.is_null() && !a.send_cq.is_null() && idr.send_cq != a.send_cq)
        {
            return fail_minus_one(libc::EINVAL);
        }
        let send = if a.send_cq.is_null() && idr.send_cq.is_null() {
            a.cap.max_send_wr
        } else {
            0
        };
        let recv = if a.recv_cq.is_null() && idr.recv_cq.is_null() {
            a.cap.max_recv_wr
        } else {
            0
        };
        // SAFETY: p is live with a device.
        if let Err(e) = unsafe { create_cqs(p, send, recv) } {
            return fail_minus_one(e);
        }
        // SAFETY: p is live.
        let idr = unsafe { &mut (*p).id };
        if a.send_cq.is_null() {
            a.send_cq = idr.send_cq;
        }
        if a.recv_cq.is_null() {
            a.recv_cq = idr.recv_cq;
        }
        if !idr.srq.is_null() && a.srq.is_null() {
            a.srq = idr.srq;
        }
        // SAFETY: idr.verbs is our context; attr is the caller's.
        let qp = unsafe { crate::qp::create_qp_ex(idr.verbs, attr) };
        if qp.is_null() {
            let e = last_errno();
            // SAFETY: p is live; its CQs are unused.
            unsafe { destroy_cqs(p) };
            return fail_minus_one(e);
        }
        // SAFETY: qp was just created by this library.
        let attached = match unsafe { crate::qp::qp_parts(qp) } {
            // SAFETY: p is live.
            Some((q, pd)) => unsafe { (*p).cm.attach_qp(&q, &pd) }.map_err(|e| e.errno()),
            None => Err(libc::EINVAL),
        };
        if let Err(e) = attached {
            // SAFETY: the QP and CQs just created, unused.
            unsafe {
                crate::qp::ibv_destroy_qp(qp);
                destroy_cqs(p);
            }
            return fail_minus_one(e);
        }
        // SAFETY: p is live; qp is ours.
        unsafe {
            (*p).id.pd = (*qp).pd;
            (*p).id.qp = qp;
            sync_qp_state(p);
        }
        0
    })
}

/// # Safety
/// As [`rdma_create_qp_ex`]; `pd` is NULL or a PD of this library.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_qp(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    guard(-1, || {
        // SAFETY: attr the caller's.
        let (Some(p), Some(init)) = (id_priv(id), unsafe { qp_init_attr.as_mut() }) else {
            return fail_minus_one(libc::EINVAL);
        };
        // SAFETY: ibv_qp_init_attr_ex is pointers and integers.
        let mut ex: ibv_qp_init_attr_ex = unsafe { zeroed() };
        ex.qp_context = init.qp_context;
        ex.send_cq = init.send_cq;
        ex.recv_cq = init.recv_cq;
        ex.srq = init.srq;
        ex.cap = init.cap;
        ex.qp_type = init.qp_type;
        ex.sq_sig_all = init.sq_sig_all;
        ex.comp_mask = IBV_QP_INIT_ATTR_PD;
        ex.pd = if pd.is_null() {
            // SAFETY: p is live.
            unsafe { (*p).id.pd }
        } else {
            pd
        };
        // SAFETY: id and ex are valid.
        let r = unsafe { rdma_create_qp_ex(id, &mut ex) };
        init.send_cq = ex.send_cq;
        init.recv_cq = ex.recv_cq;
        init.srq = ex.srq;
        init.cap = ex.cap;
        r
    })
}

/// # Safety
/// `id` is NULL or any pointer (only a live id of this library is used:
/// the rest are EINVAL); a live id is not destroyed during the call.
#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_qp(id: *mut rdma_cm_id) {
    guard((), || {
        let Some(p) = id_priv(id) else {
            return;
        };
        // SAFETY: p is live; its QP (if any) is ours.
        unsafe {
            (*p).cm.detach_qp();
            let qp = (*p).id.qp;
            if !qp.is_null() {
                crate::qp::ibv_destroy_qp(qp);
            }
            (*p).id.qp = null_mut();
            destroy_cqs(p);
        }
    })
}

/// # Safety
/// `id` is NULL or any pointer (only a live id of this library is used: the
/// rest are EINVAL); a live id is not destroyed during the call; `attr` is NULL
/// or the caller's, its PD, XRC domain and CQ NULL or this library's.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_srq_ex(
    id: *mut rdma_cm_id,
    attr: *mut ibv_srq_init_attr_ex,
) -> c_int {
    guard(-1, || {
        // SAFETY: attr the caller's.
        let (Some(p), Some(a)) = (id_priv(id), unsafe { attr.as_mut() }) else {
            return fail_minus_one(libc::EINVAL);
        };
        if a.comp_mask & IBV_SRQ_INIT_ATTR_TYPE == 0 {
            return fail_minus_one(libc::EINVAL);
        }
        // SAFETY: p is live.
        let idr = unsafe { &mut (*p).id };
        if a.comp_mask & IBV_SRQ_INIT_ATTR_PD == 0 || a.pd.is_null() {
            a.pd = idr.pd;
            a.comp_mask |= IBV_SRQ_INIT_ATTR_PD;
        }
        // SAFETY: our context; attr is the caller's.
        let srq = unsafe { crate::srq::create_srq_ex(idr.verbs, attr) };
        if srq.is_null() {
            return -1;
        }
        if idr.pd.is_null() {
            idr.pd = a.pd;
        }
        idr.srq = srq;
        0
    })
}

/// # Safety
/// As [`rdma_create_srq_ex`]; `pd` is NULL or a PD of this library.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_srq(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_srq_init_attr,
) -> c_int {
    guard(-1, || {
        // SAFETY: the caller's attr.
        let Some(init) = (unsafe { attr.as_mut() }) else {
            return fail_minus_one(libc::EINVAL);
        };
        let mut ex = ibv_srq_init_attr_ex {
            srq_context: init.srq_context,
            attr: init.attr,
            comp_mask: IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD,
            srq_type: IBV_SRQT_BASIC,
            pd,
            xrcd: null_mut(),
            cq: null_mut(),
            tm_cap: [0; 2],
        };
        // SAFETY: id is the caller's; ex is valid.
        let r = unsafe { rdma_create_srq_ex(id, &mut ex) };
        init.attr = ex.attr;
        r
    })
}

/// # Safety
/// `id` is NULL or any pointer (only a live id of this library is used:
/// the rest are EINVAL); a live id is not destroyed during the call.
#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_srq(id: *mut rdma_cm_id) {
    guard((), || {
        let Some(p) = id_priv(id) else {
            return;
        };
        // SAFETY: p is live; its SRQ (if any) is ours.
        unsafe {
            let srq = (*p).id.srq;
            if !srq.is_null() {
                crate::srq::ibv_destroy_srq(srq);
            }
            (*p).id.srq = null_mut();
            destroy_cqs(p);
        }
    })
}

/// The attributes that move the id's QP to `qp_attr->qp_state`.
///
/// # Safety
/// `id` is NULL or any pointer (only a live id of this library is used: the
/// rest are EINVAL); a live id is not destroyed during the call; `qp_attr` and
/// `qp_attr_mask` are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rdma_init_qp_attr(
    id: *mut rdma_cm_id,
    qp_attr: *mut ibv_qp_attr,
    qp_attr_mask: *mut c_int,
) -> c_int {
    guard(-1, || {
        // SAFETY: the out-pointers are the caller's.
        let (Some(p), Some(out), false) = (
            id_priv(id),
            unsafe { qp_attr.as_mut() },
            qp_attr_mask.is_null(),
        ) else {
            return fail_minus_one(libc::EINVAL);
        };
        let Ok(state) = QpState::try_from(out.qp_state) else {
            return fail_minus_one(libc::EINVAL);
        };
        // SAFETY: p is live.
        match unsafe { (*p).cm.init_qp_attr(state) } {
            Ok((a, mask)) => {
                *out = crate::abi::convert::qp_attr_to_c(&a, out.cap);
                // SAFETY: the caller's out-pointer.
                unsafe { *qp_attr_mask = mask.bits() as c_int };
                0
            }
            Err(e) => fail_minus_one(e.errno()),
        }
    })
}
