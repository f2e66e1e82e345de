//! Memory windows: `ibv_alloc_mw`, `ibv_dealloc_mw` and `ibv_bind_mw`
//! (type 1), the ops verbs.h's inline wrappers call, and the binds that
//! send WRs carry (type 2: `IBV_WR_BIND_MW`, `ibv_wr_bind_mw`).

use crate::abi::*;
use crate::mr::RoxeMr;
use crate::object::{container_of, destroy, hand_out, Used};
use crate::pd::RoxePd;
use crate::qp::as_roxe_qp;
use crate::{fail_null, guard};
use parking_lot::{MappedMutexGuard, MutexGuard};
use roxe_verbs::{AccessFlags, Mr, Mw, MwBind, MwType, SendFlags};
use std::ffi::c_int;
use std::ptr::{self, null_mut};

#[repr(C)]
pub(crate) struct RoxeMw {
    c: ibv_mw,
    mw: Mw,
    _pd: Used<RoxePd>,
}

/// `ibv_alloc_mw` (the op verbs.h's inline wrapper calls): EINVAL for a
/// type other than 1 and 2, as rxe.
///
/// # Safety
/// `pd` is NULL or a PD of this library.
pub(crate) unsafe extern "C" fn alloc_mw(pd: *mut ibv_pd, mw_type: u32) -> *mut ibv_mw {
    guard(null_mut(), || {
        // SAFETY: pd is NULL or from ibv_alloc_pd (the C contract).
        let Some(p) = (unsafe { container_of::<RoxePd, _>(pd) }) else {
            return fail_null(libc::EINVAL);
        };
        let kind = match mw_type {
            1 => MwType::Type1,
            2 => MwType::Type2,
            _ => return fail_null(libc::EINVAL),
        };
        match p.pd.alloc_mw(kind) {
            Ok(mw) => hand_out(RoxeMw {
                c: ibv_mw {
                    context: p.context(),
                    pd,
                    rkey: mw.rkey(),
                    handle: 0,
                    type_: mw_type,
                },
                mw,
                _pd: Used::new(p),
            })
            .cast(),
            Err(e) => fail_null(e.errno()),
        }
    })
}

/// `ibv_dealloc_mw`: the window's keys stop working now.
///
/// # Safety
/// `mw` is NULL or a live window of this library, not used again.
pub(crate) unsafe extern "C" fn dealloc_mw(mw: *mut ibv_mw) -> c_int {
    // SAFETY: per the contract.
    unsafe { destroy(mw, |_: &RoxeMw| Ok(())) }
}

/// The MR a bind names: NULL, or one of this library's on the same
/// context (EINVAL otherwise: a real device's MR cannot hold a soft
/// device's window).
///
/// # Safety
/// `mr` is NULL or a live MR from `ibv_reg_mr*`.
pub(crate) unsafe fn bind_mr<'a>(
    mr: *mut ibv_mr,
    ctx: *mut ibv_context,
) -> Result<Option<MappedMutexGuard<'a, Mr>>, c_int> {
    if mr.is_null() {
        return Ok(None);
    }
    // SAFETY: per the contract; the context member is first in ibv_mr.
    if unsafe { (*mr).context } != ctx {
        return Err(libc::EINVAL);
    }
    // SAFETY: an MR of this library's context is a RoxeMr.
    let Some(m) = (unsafe { container_of::<RoxeMr, _>(mr) }) else {
        return Ok(None);
    };
    // Deregistered through another struct (an import): no region.
    MutexGuard::try_map(m.mr.lock(), Option::as_mut)
        .map(Some)
        .map_err(|_| libc::EINVAL)
}

/// The bind a send WR carries (`IBV_WR_BIND_MW`, `ibv_wr_bind_mw`): the
/// window `mw` gets the key `new_rkey` over `info`'s range of its MR.
/// EINVAL for no window, or a window or MR that is not on context `ctx`.
///
/// # Safety
/// `mw` is NULL or a live window from `ibv_alloc_mw`; `info.mr` NULL or a
/// live MR from `ibv_reg_mr*`.
pub(crate) unsafe fn bind_of(
    mw: *mut ibv_mw,
    new_rkey: u32,
    info: &ibv_mw_bind_info,
    ctx: *mut ibv_context,
) -> Result<MwBind, c_int> {
    // SAFETY: per the contract, a non-NULL mw is a live window, whose first
    // member is its context.
    if mw.is_null() || unsafe { (*mw).context } != ctx {
        return Err(libc::EINVAL);
    }
    // SAFETY: a window on this library's context is a RoxeMw.
    let m = unsafe { container_of::<RoxeMw, _>(mw) }.ok_or(libc::EINVAL)?;
    // SAFETY: info.mr is NULL or a live MR (the contract).
    let mr = unsafe { bind_mr(info.mr, ctx) }?;
    Ok(MwBind {
        mw_rkey: m.mw.rkey(),
        new_rkey,
        mr_lkey: mr.as_deref().map_or(0, Mr::lkey),
        addr: info.addr,
        length: info.length,
        access: AccessFlags(info.mw_access_flags),
    })
}

/// `ibv_bind_mw` (type 1, through the op): posts the bind; on success the
/// window's `rkey` is the new key (which works once the bind executes).
///
/// # Safety
/// `qp` is NULL or a live QP of this library, `mw` NULL or a live window
/// of it; `bind` is NULL or the caller's, its MR NULL or a live MR.
pub(crate) unsafe extern "C" fn bind_mw(
    qp: *mut ibv_qp,
    mw: *mut ibv_mw,
    bind: *mut ibv_mw_bind,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: qp, mw and bind are the caller's (the C contract).
        let (Some(q), Some(m), Some(b)) =
            (unsafe { (as_roxe_qp(qp), container_of::<RoxeMw, _>(mw), bind.as_ref()) })
        else {
            return libc::EINVAL;
        };
        if m.c.context != q.context() {
            return libc::EINVAL;
        }
        let info = b.bind_info;
        // SAFETY: info.mr is NULL or from ibv_reg_mr (the C contract).
        let mr = match unsafe { bind_mr(info.mr, m.c.context) } {
            Ok(mr) => mr,
            Err(e) => return e,
        };
        let r = q.qp.bind_mw(
            &m.mw,
            mr.as_deref(),
            info.addr,
            info.length,
            AccessFlags(info.mw_access_flags),
            b.wr_id,
            SendFlags(b.send_flags),
        );
        match r {
            Ok(key) => {
                // SAFETY: mw is a live RoxeMw (checked above); the shared
                // borrow `m` is not used past this point.
                unsafe { ptr::addr_of_mut!((*mw).rkey).write(key) };
                0
            }
            Err(e) => e.errno(),
        }
    })
}
