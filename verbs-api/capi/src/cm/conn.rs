//! Connections: `rdma_connect`, `rdma_accept`, `rdma_reject` (and
//! `_ece`), `rdma_disconnect`, `rdma_establish` and `rdma_notify`, with the
//! connection parameters as librdmacm checks and builds them; ECE
//! (`rdma_set_local_ece`, `rdma_get_remote_ece`) and multicast joins, which
//! roxe does not support.

use super::event::complete;
use super::id::{ack_pending, id_priv, sync_qp_state, IdPriv};
use crate::abi::*;
use crate::device::SharedDevice;
use crate::{fail_minus_one, guard};
use roxe_verbs::cm::ConnParam;
use std::ffi::{c_int, c_void};
use std::sync::atomic::Ordering;

/// `IBV_EVENT_COMM_EST`.
const IBV_EVENT_COMM_EST: c_int = 4;
/// The REJ reason of `rdma_reject_ece` (vendor option not supported).
const REJ_VENDOR_OPTION_NOT_SUPPORTED: u16 = 35;

/// The caller's private data: `len` bytes at `data` (none for NULL).
///
/// # Safety
/// A non-NULL `data` holds `len` readable bytes.
unsafe fn caller_bytes(data: *const c_void, len: u8) -> Vec<u8> {
    if data.is_null() || len == 0 {
        return Vec::new();
    }
    // SAFETY: per the contract.
    unsafe { std::slice::from_raw_parts(data.cast::<u8>(), usize::from(len)) }.to_vec()
}

/// librdmacm's `ucma_valid_param`: RC ids need parameters or a QP, and
/// no more READ/atomic depth than the device has.
fn valid_param(p: &IdPriv, param: Option<&rdma_conn_param>, dev: &SharedDevice) -> bool {
    if p.id.ps != RDMA_PS_TCP {
        return true;
    }
    let Some(param) = param else {
        return !p.id.qp.is_null();
    };
    (param.responder_resources == RDMA_MAX_RESP_RES
        || param.responder_resources <= dev.max_responder_resources)
        && (param.initiator_depth == RDMA_MAX_INIT_DEPTH
            || param.initiator_depth <= dev.max_initiator_depth)
}

/// What `rdma_connect` and `rdma_accept` start from: the id, the caller's
/// parameters and the id's device. EINVAL for no live id, an id without a
/// device yet, or parameters the device cannot meet ([`valid_param`]).
///
/// # Safety
/// As [`rdma_connect`]; the parameters live for `'a`.
unsafe fn connecting<'a>(
    id: *mut rdma_cm_id,
    conn_param: *mut rdma_conn_param,
) -> Result<(*mut IdPriv, Option<&'a rdma_conn_param>, SharedDevice), c_int> {
    let p = id_priv(id).ok_or(libc::EINVAL)?;
    // SAFETY: conn_param is NULL or the caller's (the contract).
    let param = unsafe { conn_param.as_ref() };
    // SAFETY: p is live (the contract).
    let pr = unsafe { &*p };
    let dev = pr.extra.lock().dev.ok_or(libc::EINVAL)?;
    if !valid_param(pr, param, &dev) {
        return Err(libc::EINVAL);
    }
    Ok((p, param, dev))
}

/// The parameters to send, as `ucma_copy_conn_param_to_kern` builds them.
///
/// # Safety
/// `p`'s QP, if any, is live; `param`'s private data pointer covers its
/// length.
unsafe fn to_conn_param(
    p: &IdPriv,
    param: Option<&rdma_conn_param>,
    depths: (u8, u8),
) -> ConnParam {
    let (responder_resources, initiator_depth) = depths;
    let (qp_num, srq) = if p.id.qp.is_null() {
        param.map_or((0, false), |c| (c.qp_num, c.srq != 0))
    } else {
        // SAFETY: the id's live QP.
        unsafe { ((*p.id.qp).qp_num, !(*p.id.qp).srq.is_null()) }
    };
    ConnParam {
        // SAFETY: per the contract.
        private_data: param
            .map(|c| unsafe { caller_bytes(c.private_data, c.private_data_len) })
            .unwrap_or_default(),
        responder_resources,
        initiator_depth,
        retry_count: param.map_or(7, |c| c.retry_count),
        rnr_retry_count: param.map_or(7, |c| c.rnr_retry_count),
        qp_num,
        srq,
    }
}

/// Send a connection request (a synchronous id waits for the answer).
///
/// # Safety
/// `id` is NULL or any pointer (only a live id of this library is used: the
/// rest are EINVAL); a live id is not destroyed during the call; `conn_param`
/// is NULL or the caller's, its private data covering its length.
#[no_mangle]
pub unsafe extern "C" fn rdma_connect(
    id: *mut rdma_cm_id,
    conn_param: *mut rdma_conn_param,
) -> c_int {
    guard(-1, || {
        // SAFETY: per the contract.
        let (p, param, dev) = match unsafe { connecting(id, conn_param) } {
            Ok(c) => c,
            Err(e) => return fail_minus_one(e),
        };
        // SAFETY: p is live (the contract).
        let pr = unsafe { &*p };
        let initiator_depth = match param {
            Some(c) if c.initiator_depth != RDMA_MAX_INIT_DEPTH => c.initiator_depth,
            _ => dev.max_initiator_depth,
        };
        let responder_resources = match param {
            Some(c) if c.responder_resources != RDMA_MAX_RESP_RES => c.responder_resources,
            _ => dev.max_responder_resources,
        };
        {
            let mut x = pr.extra.lock();
            x.initiator_depth = initiator_depth;
            x.responder_resources = responder_resources;
        }
        // SAFETY: p is live; param's data is the caller's.
        let cp = unsafe { to_conn_param(pr, param, (responder_resources, initiator_depth)) };
        if let Err(e) = pr.cm.connect(&cp) {
            return fail_minus_one(e.errno());
        }
        // SAFETY: p is live.
        unsafe { complete(p) }
    })
}

/// Accept a connection request (a synchronous RC id waits for the
/// connection).
///
/// # Safety
/// As [`rdma_connect`].
#[no_mangle]
pub unsafe extern "C" fn rdma_accept(
    id: *mut rdma_cm_id,
    conn_param: *mut rdma_conn_param,
) -> c_int {
    guard(-1, || {
        // SAFETY: per the contract.
        let (p, param, dev) = match unsafe { connecting(id, conn_param) } {
            Ok(c) => c,
            Err(e) => return fail_minus_one(e),
        };
        // SAFETY: p is live (the contract).
        let pr = unsafe { &*p };
        if pr.id.qp.is_null() && param.is_none() {
            return fail_minus_one(libc::EINVAL);
        }
        let depths = {
            let mut x = pr.extra.lock();
            x.initiator_depth = match param {
                Some(c) if c.initiator_depth != RDMA_MAX_INIT_DEPTH => c.initiator_depth,
                _ => x.initiator_depth.min(dev.max_initiator_depth),
            };
            x.responder_resources = match param {
                Some(c) if c.responder_resources != RDMA_MAX_RESP_RES => c.responder_resources,
                _ => x.responder_resources.min(dev.max_responder_resources),
            };
            (x.responder_resources, x.initiator_depth)
        };
        // SAFETY: p is live; param's data is the caller's.
        let cp = unsafe { to_conn_param(pr, param, depths) };
        let r = pr.cm.accept(&cp);
        // SAFETY: p is live.
        unsafe { sync_qp_state(p) };
        if let Err(e) = r {
            return fail_minus_one(e.errno());
        }
        if pr.id.qp_type == IBV_QPT_UD {
            if pr.sync.load(Ordering::Acquire) {
                // SAFETY: p is live; its pending event is its own.
                unsafe { ack_pending(p) };
            }
            return 0;
        }
        // SAFETY: p is live.
        unsafe { complete(p) }
    })
}

/// `rdma_reject` and `rdma_reject_ece`: a REJ with `reason`, or the
/// consumer-defined one.
///
/// # Safety
/// A live `id` is not destroyed during the call; a non-NULL `data` holds
/// `len` readable bytes.
unsafe fn reject(id: *mut rdma_cm_id, data: *const c_void, len: u8, reason: Option<u16>) -> c_int {
    let Some(p) = id_priv(id) else {
        return fail_minus_one(libc::EINVAL);
    };
    // SAFETY: per the contract.
    let pd = unsafe { caller_bytes(data, len) };
    // SAFETY: p is live.
    let cm = unsafe { &(*p).cm };
    let r = match reason {
        Some(why) => cm.reject_with_reason(&pd, why),
        None => cm.reject(&pd),
    };
    match r {
        Ok(()) => 0,
        Err(e) => fail_minus_one(e.errno()),
    }
}

/// # Safety
/// `id` is NULL or any pointer (only a live id of this library is used:
/// the rest are EINVAL); a live id is not destroyed during the call; a non-NULL
/// `private_data` holds `private_data_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn rdma_reject(
    id: *mut rdma_cm_id,
    private_data: *const c_void,
    private_data_len: u8,
) -> c_int {
    // SAFETY: the caller's id and data.
    guard(-1, || unsafe {
        reject(id, private_data, private_data_len, None)
    })
}

/// A REJ saying the ECE options are not supported.
///
/// # Safety
/// As [`rdma_reject`].
#[no_mangle]
pub unsafe extern "C" fn rdma_reject_ece(
    id: *mut rdma_cm_id,
    private_data: *const c_void,
    private_data_len: u8,
) -> c_int {
    guard(-1, || {
        // SAFETY: the caller's id and data.
        unsafe {
            reject(
                id,
                private_data,
                private_data_len,
                Some(REJ_VENDOR_OPTION_NOT_SUPPORTED),
            )
        }
    })
}

/// # Safety
/// `id` is NULL or any pointer (only a live id of this library is used:
/// the rest are EINVAL); a live id is not destroyed during the call.
#[no_mangle]
pub unsafe extern "C" fn rdma_disconnect(id: *mut rdma_cm_id) -> c_int {
    guard(-1, || {
        let Some(p) = id_priv(id) else {
            return fail_minus_one(libc::EINVAL);
        };
        // SAFETY: p is live.
        let r = unsafe { (*p).cm.disconnect() };
        // SAFETY: p is live.
        unsafe { sync_qp_state(p) };
        if let Err(e) = r {
            return fail_minus_one(e.errno());
        }
        // SAFETY: p is live.
        unsafe { complete(p) }
    })
}

/// # Safety
/// `id` is NULL or any pointer (only a live id of this library is used:
/// the rest are EINVAL); a live id is not destroyed during the call.
#[no_mangle]
pub unsafe extern "C" fn rdma_establish(id: *mut rdma_cm_id) -> c_int {
    guard(-1, || {
        let Some(p) = id_priv(id) else {
            return fail_minus_one(libc::EINVAL);
        };
        // SAFETY: p is live.
        match unsafe { (*p).cm.establish() } {
            Ok(()) => 0,
            Err(e) => fail_minus_one(e.errno()),
        }
    })
}

/// `rdma_notify`: IBV_EVENT_COMM_EST tells the CM that data arrived before
/// the RTU; roxe's passive side is established when the RTU arrives or
/// its REP is resent until it does, so the notice only needs to find a
/// connection that is accepted or established. Other events: EINVAL, as
/// the kernel's `ib_cm_notify` answers them.
///
/// # Safety
/// `id` is NULL or any pointer (only a live id of this library is used:
/// the rest are EINVAL); a live id is not destroyed during the call.
#[no_mangle]
pub unsafe extern "C" fn rdma_notify(id: *mut rdma_cm_id, event: c_int) -> c_int {
    guard(-1, || {
        let Some(p) = id_priv(id) else {
            return fail_minus_one(libc::EINVAL);
        };
        // SAFETY: p is live.
        if event != IBV_EVENT_COMM_EST || unsafe { (*p).cm.peer_addr() }.is_none() {
            return fail_minus_one(libc::EINVAL);
        }
        0
    })
}

/// # Safety
/// `id` is NULL or any pointer (only a live id of this library is used: the
/// rest are EINVAL); a live id is not destroyed during the call; `ece` is NULL
/// or the caller's.
#[no_mangle]
pub unsafe extern "C" fn rdma_set_local_ece(id: *mut rdma_cm_id, ece: *mut ibv_ece) -> c_int {
    guard(-1, || {
        // SAFETY: ece the caller's.
        let (Some(p), Some(e)) = (id_priv(id), unsafe { ece.as_ref() }) else {
            return fail_minus_one(libc::EINVAL);
        };
        // SAFETY: p is live.
        unsafe { (*p).extra.lock().local_ece = [e.vendor_id, e.options] };
        0
    })
}

/// ECE options are vendor extensions roxe's peers (rxe, mlx5 without its
/// vendor options) do not send: the remote ECE is always empty.
///
/// # Safety
/// `id` is NULL or any pointer (only a live id of this library is used: the
/// rest are EINVAL); a live id is not destroyed during the call; `ece` is NULL
/// or writable.
#[no_mangle]
pub unsafe extern "C" fn rdma_get_remote_ece(id: *mut rdma_cm_id, ece: *mut ibv_ece) -> c_int {
    guard(-1, || {
        // SAFETY: ece the caller's.
        let (Some(_), Some(e)) = (id_priv(id), unsafe { ece.as_mut() }) else {
            return fail_minus_one(libc::EINVAL);
        };
        *e = ibv_ece {
            vendor_id: 0,
            options: 0,
            comp_mask: 0,
        };
        0
    })
}

/// Multicast over RoCE needs IGMP joins and multicast GIDs, which roxe's
/// devices do not implement: ENOSYS.
#[no_mangle]
pub extern "C" fn rdma_join_multicast(
    _id: *mut rdma_cm_id,
    _addr: *mut libc::sockaddr,
    _context: *mut c_void,
) -> c_int {
    fail_minus_one(libc::ENOSYS)
}

#[no_mangle]
pub extern "C" fn rdma_join_multicast_ex(
    _id: *mut rdma_cm_id,
    _attr: *mut c_void,
    _context: *mut c_void,
) -> c_int {
    fail_minus_one(libc::ENOSYS)
}

#[no_mangle]
pub extern "C" fn rdma_leave_multicast(_id: *mut rdma_cm_id, _addr: *mut libc::sockaddr) -> c_int {
    fail_minus_one(libc::ENOSYS)
}
