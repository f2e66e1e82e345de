//! The synchronous endpoints of `<rdma/rdma_verbs.h>`: `rdma_create_ep`
//! (an id bound, or resolved with its route and QP, in one call),
//! `rdma_get_request` (a listener's next connection request as a new id,
//! with the QP `rdma_create_ep` was given) and `rdma_destroy_ep`.

use super::event::rdma_get_cm_event;
use super::id::{
    ack_pending, id_priv, new_id, rdma_bind_addr, rdma_destroy_id, rdma_resolve_addr,
    rdma_resolve_route,
};
use super::qp::{rdma_create_qp, rdma_destroy_qp, rdma_destroy_srq};
use crate::abi::*;
use crate::{fail_minus_one, guard, last_errno};
use roxe_verbs::cm::EventKind;
use std::ffi::c_int;
use std::ptr::null_mut;
use std::sync::atomic::Ordering;

/// The next connection request of a synchronous listener, as a new id
/// (with the QP `rdma_create_ep` was given for it) that holds the event.
///
/// # Safety
/// `listen` is NULL or any pointer (only a live id of this library is
/// used); a live one is not destroyed during the call; `id` is NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn rdma_get_request(
    listen: *mut rdma_cm_id,
    id: *mut *mut rdma_cm_id,
) -> c_int {
    guard(-1, || {
        let Some(l) = id_priv(listen) else {
            return fail_minus_one(libc::EINVAL);
        };
        // Raw field accesses only: rdma_get_cm_event below reaches the
        // listener through its own pointer (event counts, context).
        // SAFETY: l is live.
        if !unsafe { (*l).sync.load(Ordering::Acquire) } || id.is_null() {
            return fail_minus_one(libc::EINVAL);
        }
        // SAFETY: l is live; its pending event (if any) is ours to ack.
        unsafe { ack_pending(l) };
        let mut ev = null_mut();
        // SAFETY: the listener's own channel.
        let r = unsafe { rdma_get_cm_event((*l).id.channel, &mut ev) };
        if r != 0 {
            return r;
        }
        // SAFETY: ev was just handed out.
        let (kind, status, new_id) = unsafe { ((*ev).event, (*ev).status, (*ev).id) };
        let errno = if kind == EventKind::Rejected as u32 {
            Some(libc::ECONNREFUSED)
        } else if status != 0 {
            Some(-status)
        } else if kind != EventKind::ConnectRequest as u32 {
            Some(libc::EINVAL)
        } else {
            None
        };
        if let Some(errno) = errno {
            // SAFETY: l is live.
            unsafe { (*l).id.event = ev };
            return fail_minus_one(errno);
        }
        // SAFETY: l is live.
        let init = unsafe { (*l).extra.lock().qp_init_attr };
        if let Some(mut a) = init {
            // SAFETY: the new id is live; a is a valid init attr.
            let r = unsafe { rdma_create_qp(new_id, (*l).id.pd, &mut a) };
            if r != 0 {
                let errno = last_errno();
                // SAFETY: l is live.
                unsafe { (*l).id.event = ev };
                return fail_minus_one(errno);
            }
        }
        // SAFETY: the new id is live; id is the caller's out-pointer.
        unsafe {
            (*new_id).event = ev;
            *id = new_id;
        }
        0
    })
}

/// A synchronous id for `res`: bound (passive, its QP made per request
/// by `rdma_get_request`), or with its address and route resolved and its
/// QP made.
///
/// # Safety
/// `id` is NULL or writable; `res` is NULL or from `rdma_getaddrinfo`;
/// `pd` is NULL or a PD of this library; `qp_init_attr` is NULL or the
/// caller's.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_ep(
    id: *mut *mut rdma_cm_id,
    res: *mut rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    guard(-1, || {
        // SAFETY: res is the caller's.
        let Some(res) = (unsafe { res.as_ref() }) else {
            return fail_minus_one(libc::EINVAL);
        };
        if id.is_null() {
            return fail_minus_one(libc::EINVAL);
        }
        // SAFETY: a synchronous id (NULL channel).
        let p = match unsafe {
            new_id(
                null_mut(),
                None,
                null_mut(),
                res.ai_port_space as u32,
                res.ai_qp_type as u32,
            )
        } {
            Ok(p) => p,
            Err(e) => return fail_minus_one(e),
        };
        let cid = p.cast::<rdma_cm_id>();
        // SAFETY: cid is live; the addresses and attr are the caller's.
        let r = unsafe {
            if res.ai_flags & RAI_PASSIVE != 0 {
                let r = rdma_bind_addr(cid, res.ai_src_addr);
                if r == 0 {
                    if !pd.is_null() {
                        (*p).id.pd = pd;
                    }
                    if let Some(a) = qp_init_attr.as_ref() {
                        let mut a = *a;
                        a.qp_type = res.ai_qp_type as u32;
                        (*p).extra.lock().qp_init_attr = Some(a);
                    }
                }
                r
            } else {
                let mut r = rdma_resolve_addr(cid, res.ai_src_addr, res.ai_dst_addr, 2000);
                if r == 0 {
                    r = rdma_resolve_route(cid, 2000);
                }
                if r == 0 {
                    if let Some(a) = qp_init_attr.as_mut() {
                        a.qp_type = res.ai_qp_type as u32;
                        r = rdma_create_qp(cid, pd, a);
                    }
                }
                r
            }
        };
        if r != 0 {
            let e = last_errno();
            // SAFETY: cid is live and not handed out.
            unsafe { rdma_destroy_ep(cid) };
            return fail_minus_one(e);
        }
        // SAFETY: the caller's out-pointer.
        unsafe { *id = cid };
        0
    })
}

/// The id with its QP and SRQ.
///
/// # Safety
/// `id` is NULL or a live id of this library, not used again.
#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_ep(id: *mut rdma_cm_id) {
    guard((), || {
        if id.is_null() {
            return;
        }
        // SAFETY: id is ours; its QP and SRQ are ours.
        unsafe {
            if !(*id).qp.is_null() {
                rdma_destroy_qp(id);
            }
            if !(*id).srq.is_null() {
                rdma_destroy_srq(id);
            }
            rdma_destroy_id(id);
        }
    })
}
