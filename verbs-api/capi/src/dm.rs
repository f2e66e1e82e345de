//! Device memory: `ibv_alloc_dm`, `ibv_free_dm`, `ibv_memcpy_to_dm` /
//! `ibv_memcpy_from_dm` (the struct's own function pointers) and
//! `ibv_reg_dm_mr`, all reached through the `verbs_context`.

use crate::abi::*;
use crate::context::context;
use crate::mr::RoxeMr;
use crate::object::{container_of, destroy, hand_out};
use crate::pd::RoxePd;
use crate::{fail_null, guard};
use roxe_verbs::{AccessFlags, Dm};
use std::ffi::{c_int, c_uint, c_void};
use std::ptr::null_mut;

#[repr(C)]
pub(crate) struct RoxeDm {
    c: ibv_dm,
    dm: Dm,
}

impl RoxeDm {
    /// The struct for `dm` on `ctx`, named `handle` on its command file.
    pub(crate) fn new(ctx: *mut ibv_context, handle: u32, dm: Dm) -> Self {
        RoxeDm {
            c: ibv_dm {
                context: ctx,
                memcpy_to_dm: Some(memcpy_to_dm),
                memcpy_from_dm: Some(memcpy_from_dm),
                comp_mask: 0,
                handle,
            },
            dm,
        }
    }
}

/// `ibv_alloc_dm` (the `verbs_context` op): EINVAL for an unknown
/// `comp_mask`, a zero or too large length or alignment.
///
/// # Safety
/// `ctx` is NULL or one of this library's open contexts; `attr` is NULL or
/// the caller's.
pub(crate) unsafe extern "C" fn alloc_dm(
    ctx: *mut ibv_context,
    attr: *mut ibv_alloc_dm_attr,
) -> *mut ibv_dm {
    guard(null_mut(), || {
        // SAFETY: ctx is an open context, attr NULL or the caller's.
        let (Some(c), Some(a)) = (unsafe { context(ctx) }, unsafe { attr.as_ref() }) else {
            return fail_null(libc::EINVAL);
        };
        if a.comp_mask != 0 {
            return fail_null(libc::EINVAL);
        }
        match c.ctx.alloc_dm(a.length, a.log_align_req) {
            Ok(dm) => {
                let handle = c.handles.add_dm(&dm);
                hand_out(RoxeDm::new(ctx, handle, dm)).cast()
            }
            Err(e) => fail_null(e.errno()),
        }
    })
}

/// `ibv_free_dm`: EBUSY while memory regions are registered over it.
///
/// # Safety
/// `dm` is NULL or live device memory of this library, not used again once
/// freed.
pub(crate) unsafe extern "C" fn free_dm(dm: *mut ibv_dm) -> c_int {
    // SAFETY: per the contract.
    unsafe {
        destroy(dm, |d: &RoxeDm| {
            if d.dm.has_regions() {
                return Err(libc::EBUSY);
            }
            crate::import::forget_handle(d.c.context, d.c.handle);
            Ok(())
        })
    }
}

/// `ibv_memcpy_to_dm`: `len` bytes from `host` to `offset` in the memory.
///
/// # Safety
/// `dm` is NULL or live device memory of this library; `host` holds `len`
/// readable bytes.
unsafe extern "C" fn memcpy_to_dm(
    dm: *mut ibv_dm,
    offset: u64,
    host: *const c_void,
    len: usize,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: per the contract.
        let Some(d) = (unsafe { container_of::<RoxeDm, _>(dm) }) else {
            return libc::EINVAL;
        };
        if host.is_null() && len > 0 {
            return libc::EINVAL;
        }
        let data = if len == 0 {
            &[][..]
        } else {
            // SAFETY: per the contract, host (not NULL) holds len readable
            // bytes.
            unsafe { std::slice::from_raw_parts(host.cast::<u8>(), len) }
        };
        match d.dm.write(offset, data) {
            Ok(()) => 0,
            Err(e) => e.errno(),
        }
    })
}

/// `ibv_memcpy_from_dm`: `len` bytes from `offset` in the memory to `host`.
///
/// # Safety
/// `dm` is NULL or live device memory of this library; `host` holds `len`
/// writable bytes.
unsafe extern "C" fn memcpy_from_dm(
    host: *mut c_void,
    dm: *mut ibv_dm,
    offset: u64,
    len: usize,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: per the contract.
        let Some(d) = (unsafe { container_of::<RoxeDm, _>(dm) }) else {
            return libc::EINVAL;
        };
        if host.is_null() && len > 0 {
            return libc::EINVAL;
        }
        let out = if len == 0 {
            &mut [][..]
        } else {
            // SAFETY: per the contract, host (not NULL) holds len writable
            // bytes.
            unsafe { std::slice::from_raw_parts_mut(host.cast::<u8>(), len) }
        };
        match d.dm.read(offset, out) {
            Ok(()) => 0,
            Err(e) => e.errno(),
        }
    })
}

/// `ibv_reg_dm_mr`: a zero-based region over device memory.
///
/// # Safety
/// `pd` is NULL or a PD of this library, `dm` NULL or its live device
/// memory.
pub(crate) unsafe extern "C" fn reg_dm_mr(
    pd: *mut ibv_pd,
    dm: *mut ibv_dm,
    offset: u64,
    length: usize,
    access: c_uint,
) -> *mut ibv_mr {
    guard(null_mut(), || {
        // SAFETY: pd and dm are NULL or this library's (the C contract).
        let (Some(p), Some(d)) = (unsafe { container_of::<RoxePd, _>(pd) }, unsafe {
            container_of::<RoxeDm, _>(dm)
        }) else {
            return fail_null(libc::EINVAL);
        };
        if d.c.context != p.context() {
            return fail_null(libc::EINVAL);
        }
        let access = AccessFlags(access & !IBV_ACCESS_OPTIONAL_RANGE);
        match p.pd.reg_dm_mr(&d.dm, offset, length, access) {
            // Zero-based: the region's addresses start at 0.
            Ok(mr) => hand_out(RoxeMr::register(mr, p, pd, null_mut(), length)).cast(),
            Err(e) => fail_null(e.errno()),
        }
    })
}
