//! PD, MR, completion channels, CQ, SRQ, QP and AH over roxe's verbs API,
//! and the data path the inline wrappers reach through the ops table.
//!
//! Each object is a `#[repr(C)]` container whose first member is the
//! public struct the program reads (`ibv_pd`, `ibv_cq`, ...), followed by
//! roxe's handle; the pointer handed out is the container's, so a cast
//! recovers it. A `users` count refuses to destroy an object others still
//! use (EBUSY), as the kernel does.

use crate::abi::convert::{av_from_c, qp_attr_from_c, qp_attr_to_c, wc_to_c};
use crate::abi::*;
use crate::device::context;
use crate::{guard, set_errno};
use parking_lot::{MappedMutexGuard, Mutex, MutexGuard};
use roxe_verbs::{
    AccessFlags, AttrMask, CompChannel, Cq, Mr, Mw, MwBind, MwType, Pd, Qp, QpInit, QpState,
    QpType, RecvWr, SendFlags, SendOpcode, SendWr, Sge, Srq, WorkCompletion,
};
use std::collections::HashMap;
use std::ffi::{c_int, c_uint, c_void};
use std::mem::zeroed;
use std::os::fd::AsRawFd;
use std::ptr::{self, null_mut};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Fill the ops the inline data-path wrappers call.
pub(crate) fn fill_ops(ops: &mut ibv_context_ops) {
    ops.poll_cq = Some(poll_cq);
    ops.req_notify_cq = Some(req_notify_cq);
    ops.post_send = Some(post_send);
    ops.post_recv = Some(post_recv);
    ops.post_srq_recv = Some(post_srq_recv);
    ops.alloc_mw = Some(alloc_mw);
    ops.bind_mw = Some(bind_mw);
    ops.dealloc_mw = Some(dealloc_mw);
}

/// Hand a container to C: its address is the public struct's.
pub(crate) fn leak<T>(v: T) -> *mut T {
    Box::into_raw(Box::new(v))
}

/// Recover a container from the public pointer this library handed out.
///
/// # Safety
/// `p` must be NULL or a pointer this module returned for a `T` that has
/// not been destroyed.
pub(crate) unsafe fn obj<'a, T, C>(p: *mut C) -> Option<&'a T> {
    // SAFETY: per the contract, p is the first member of a live T.
    unsafe { p.cast::<T>().as_ref() }
}

/// The `RoxeQp` behind a QP pointer: `None` for NULL and for an XRC_RECV
/// QP (a different container, see `crate::xrc`).
///
/// # Safety
/// `qp` must be NULL or the `ibv_qp` (or `ibv_qp_ex`) of a live QP of
/// this library.
pub(crate) unsafe fn qp_obj<'a, C>(qp: *mut C) -> Option<&'a RoxeQp> {
    let qp = qp.cast::<ibv_qp>();
    // SAFETY: per the contract.
    if unsafe { crate::xrc::is_recv_qp(qp) } {
        return None;
    }
    // SAFETY: per the contract, a QP that is not XRC_RECV is a RoxeQp.
    unsafe { obj::<RoxeQp, _>(qp) }
}

pub(crate) fn fail_null<T>(errno: i32) -> *mut T {
    set_errno(errno);
    null_mut()
}

// ---------------------------------------------------------------- PD, MR

#[repr(C)]
pub(crate) struct RoxePd {
    c: ibv_pd,
    pub(crate) pd: Pd,
    users: AtomicUsize,
    /// A parent domain (`ibv_alloc_parent_domain`): the PD it stands for,
    /// whose objects it creates (roxe has no device buffers for the
    /// allocators to place, so they are not called, as a provider may).
    parent_of: Option<*const RoxePd>,
}

impl RoxePd {
    /// The struct for `pd` on `ctx`, named `handle` on its command file.
    pub(crate) fn new(ctx: *mut ibv_context, handle: u32, pd: Pd) -> Self {
        RoxePd {
            c: ibv_pd {
                context: ctx,
                handle,
            },
            pd,
            users: AtomicUsize::new(0),
            parent_of: None,
        }
    }

    pub(crate) fn context(&self) -> *mut ibv_context {
        self.c.context
    }

    /// How many objects made through this struct live.
    pub(crate) fn users(&self) -> usize {
        self.users.load(Ordering::Acquire)
    }
}

/// `ibv_alloc_parent_domain` (the `verbs_context` op): a PD object that
/// stands for `attr->pd` (same protection domain: QPs, CQs and MRs made
/// with either are interchangeable); thread domains are refused.
pub(crate) unsafe extern "C" fn alloc_parent_domain(
    ctx: *mut ibv_context,
    attr: *mut ibv_parent_domain_init_attr,
) -> *mut ibv_pd {
    guard(null_mut(), || {
        // SAFETY: attr is NULL or the caller's.
        let Some(a) = (unsafe { attr.as_ref() }) else {
            return fail_null(libc::EINVAL);
        };
        let known = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS | IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
        if a.comp_mask & !known != 0 {
            return fail_null(libc::EINVAL);
        }
        if !a.td.is_null() {
            return fail_null(libc::EOPNOTSUPP);
        }
        // SAFETY: pd is NULL or from ibv_alloc_pd (the C contract).
        let Some(p) = (unsafe { obj::<RoxePd, _>(a.pd) }) else {
            return fail_null(libc::EINVAL);
        };
        if p.c.context != ctx || p.parent_of.is_some() {
            return fail_null(libc::EINVAL);
        }
        p.users.fetch_add(1, Ordering::AcqRel);
        leak(RoxePd {
            c: ibv_pd {
                context: ctx,
                handle: 0,
            },
            pd: p.pd.clone(),
            users: AtomicUsize::new(0),
            parent_of: Some(p),
        })
        .cast()
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_alloc_pd(ctx: *mut ibv_context) -> *mut ibv_pd {
    crate::passthrough::pass_through!(
        crate::passthrough::is_system_context(ctx),
        "ibv_alloc_pd",
        fn(*mut ibv_context) -> *mut ibv_pd,
        (ctx),
        null_mut()
    );
    guard(null_mut(), || {
        // SAFETY: ctx is NULL or an open context.
        let Some(c) = (unsafe { context(ctx) }) else {
            return fail_null(libc::EINVAL);
        };
        match c.ctx.alloc_pd() {
            Ok(pd) => {
                let handle = c.handles.add_pd(&pd);
                leak(RoxePd::new(ctx, handle, pd)).cast()
            }
            Err(e) => fail_null(e.errno()),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    crate::passthrough::pass_through!(
        object pd,
        "ibv_dealloc_pd",
        fn(*mut ibv_pd) -> c_int,
        (pd),
        libc::EOPNOTSUPP
    );
    guard(libc::EIO, || {
        // SAFETY: pd is NULL or from ibv_alloc_pd.
        let Some(p) = (unsafe { obj::<RoxePd, _>(pd) }) else {
            return libc::EINVAL;
        };
        if p.users.load(Ordering::Acquire) != 0 {
            return libc::EBUSY;
        }
        if let Some(parent) = p.parent_of {
            // SAFETY: the PD a parent domain stands for outlives it (its
            // users count refuses dealloc until then).
            unsafe { (*parent).users.fetch_sub(1, Ordering::AcqRel) };
        } else {
            forget_handle(p.c.context, p.c.handle);
        }
        // SAFETY: pd came from leak(RoxePd) and is destroyed once.
        drop(unsafe { Box::from_raw(pd.cast::<RoxePd>()) });
        0
    })
}

/// The 0 handle names nothing (handles start at 1): parent domains.
fn forget_handle(ctx: *mut ibv_context, handle: u32) {
    if handle == 0 {
        return;
    }
    // SAFETY: an object's context outlives it (the C contract).
    if let Some(c) = unsafe { context(ctx) } {
        c.handles.forget(handle);
    }
}

/// A registration, shared by the MR structs that name it (`ibv_import_mr`):
/// `None` once deregistered through any of them.
pub(crate) type MrSlot = Mutex<Option<Mr>>;

#[repr(C)]
pub(crate) struct RoxeMr {
    c: ibv_mr,
    mr: Arc<MrSlot>,
    pd: *const RoxePd,
}

impl RoxeMr {
    /// The struct `c` for the registration in `mr`, made through `pd`
    /// (whose users it counts until it is freed).
    pub(crate) fn new(c: ibv_mr, mr: Arc<MrSlot>, pd: &RoxePd) -> Self {
        pd.users.fetch_add(1, Ordering::AcqRel);
        RoxeMr { c, mr, pd }
    }

    /// A new registration through `pd` (PD pointer `pd_ptr`), named by a
    /// new handle of the context's command file.
    fn register(
        mr: Mr,
        pd: &RoxePd,
        pd_ptr: *mut ibv_pd,
        addr: *mut c_void,
        length: usize,
    ) -> Self {
        let (lkey, rkey) = (mr.lkey(), mr.rkey());
        let slot = Arc::new(Mutex::new(Some(mr)));
        // SAFETY: a PD's context outlives it.
        let handle = unsafe { context(pd.c.context) }.map_or(0, |c| c.handles.add_mr(&slot));
        let c = ibv_mr {
            context: pd.c.context,
            pd: pd_ptr,
            addr,
            length,
            handle,
            lkey,
            rkey,
        };
        RoxeMr::new(c, slot, pd)
    }
}

impl Drop for RoxeMr {
    fn drop(&mut self) {
        // SAFETY: a PD outlives the MRs made through it (dealloc and
        // unimport keep it while users > 0).
        unsafe { (*self.pd).users.fetch_sub(1, Ordering::AcqRel) };
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut ibv_mr {
    crate::passthrough::pass_through!(
        object pd,
        "ibv_reg_mr",
        fn(*mut ibv_pd, *mut c_void, usize, c_int) -> *mut ibv_mr,
        (pd, addr, length, access),
        null_mut()
    );
    // SAFETY: forwarded contract; the iova of ibv_reg_mr is the address.
    unsafe { ibv_reg_mr_iova2(pd, addr, length, addr as u64, access as u32) }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    crate::passthrough::pass_through!(
        object pd,
        "ibv_reg_mr_iova",
        fn(*mut ibv_pd, *mut c_void, usize, u64, c_int) -> *mut ibv_mr,
        (pd, addr, length, iova, access),
        null_mut()
    );
    // SAFETY: forwarded contract.
    unsafe { ibv_reg_mr_iova2(pd, addr, length, iova, access as u32) }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: u32,
) -> *mut ibv_mr {
    crate::passthrough::pass_through!(
        object pd,
        "ibv_reg_mr_iova2",
        fn(*mut ibv_pd, *mut c_void, usize, u64, u32) -> *mut ibv_mr,
        (pd, addr, length, iova, access),
        null_mut()
    );
    guard(null_mut(), || {
        // SAFETY: pd is NULL or from ibv_alloc_pd.
        let Some(p) = (unsafe { obj::<RoxePd, _>(pd) }) else {
            return fail_null(libc::EINVAL);
        };
        // Optional access bits a provider may ignore (verbs.h).
        let access = AccessFlags(access & !IBV_ACCESS_OPTIONAL_RANGE);
        let odp = access.contains(AccessFlags::ON_DEMAND);
        // NULL with SIZE_MAX: an implicit on-demand region.
        let implicit = odp && addr.is_null() && length == usize::MAX;
        if addr.is_null() && length > 0 && !implicit {
            return fail_null(libc::EINVAL);
        }
        let r = if odp {
            p.pd.reg_mr_odp(addr as usize, length, iova, access)
        } else {
            // SAFETY: the C contract of ibv_reg_mr: the memory stays
            // allocated until ibv_dereg_mr, and the program only reads what
            // completions announce, which is register_raw's contract.
            unsafe { p.pd.reg_mr_raw(addr.cast(), length, iova, access) }
        };
        match r {
            Ok(mr) => leak(RoxeMr::register(mr, p, pd, addr, length)).cast(),
            Err(e) => fail_null(e.errno()),
        }
    })
}

/// `ibv_rereg_mr`: another PD (`IBV_REREG_MR_CHANGE_PD`), access
/// (`_CHANGE_ACCESS`) and/or memory (`_CHANGE_TRANSLATION`), keeping the
/// keys, as rxe does. 0, or `IBV_REREG_MR_ERR_INPUT` (-1) for bad input and
/// `IBV_REREG_MR_ERR_CMD` (-4) for a refusal, with errno set.
#[no_mangle]
pub unsafe extern "C" fn ibv_rereg_mr(
    mr: *mut ibv_mr,
    flags: c_int,
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> c_int {
    crate::passthrough::pass_through!(
        object mr,
        "ibv_rereg_mr",
        fn(*mut ibv_mr, c_int, *mut ibv_pd, *mut c_void, usize, c_int) -> c_int,
        (mr, flags, pd, addr, length, access),
        libc::EOPNOTSUPP
    );
    const CHANGE_TRANSLATION: c_int = 1;
    const CHANGE_PD: c_int = 1 << 1;
    const CHANGE_ACCESS: c_int = 1 << 2;
    const ERR_INPUT: c_int = -1;
    const ERR_CMD: c_int = -4;
    let input = |e: c_int| {
        set_errno(e);
        ERR_INPUT
    };
    guard(ERR_CMD, || {
        if mr.is_null()
            || flags == 0
            || flags & !(CHANGE_TRANSLATION | CHANGE_PD | CHANGE_ACCESS) != 0
        {
            return input(libc::EINVAL);
        }
        // SAFETY: mr is an MR of this library; libibverbs requires that
        // nothing else uses it during ibv_rereg_mr, so this is the only
        // reference.
        let m = unsafe { &mut *mr.cast::<RoxeMr>() };
        let new_pd = if flags & CHANGE_PD != 0 {
            // SAFETY: pd is NULL or from ibv_alloc_pd.
            match unsafe { obj::<RoxePd, _>(pd) } {
                Some(p) => Some(p),
                None => return input(libc::EINVAL),
            }
        } else {
            None
        };
        let access = (flags & CHANGE_ACCESS != 0)
            .then_some(AccessFlags(access as u32 & !IBV_ACCESS_OPTIONAL_RANGE));
        let slot = Arc::clone(&m.mr);
        let mut slot = slot.lock();
        // Deregistered through an imported struct.
        let Some(region) = slot.as_mut() else {
            return input(libc::EINVAL);
        };
        let r = if flags & CHANGE_TRANSLATION != 0 {
            if addr.is_null() && length > 0 {
                return input(libc::EINVAL);
            }
            // SAFETY: the C contract, as for ibv_reg_mr, for the new range.
            unsafe {
                region.rereg_translation(
                    addr.cast(),
                    length,
                    addr as u64,
                    new_pd.map(|p| &p.pd),
                    access,
                )
            }
        } else {
            region.rereg(new_pd.map(|p| &p.pd), access)
        };
        if let Err(e) = r {
            set_errno(e.errno());
            return if e.errno() == libc::EINVAL {
                ERR_INPUT
            } else {
                ERR_CMD
            };
        }
        if flags & CHANGE_TRANSLATION != 0 {
            m.c.addr = addr;
            m.c.length = length;
        }
        if let Some(p) = new_pd {
            p.users.fetch_add(1, Ordering::AcqRel);
            // SAFETY: the old PD outlives its MRs (dealloc refuses while
            // users > 0).
            unsafe { (*m.pd).users.fetch_sub(1, Ordering::AcqRel) };
            m.pd = p;
            m.c.pd = pd;
        }
        m.c.lkey = region.lkey();
        m.c.rkey = region.rkey();
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    crate::passthrough::pass_through!(
        object mr,
        "ibv_dereg_mr",
        fn(*mut ibv_mr) -> c_int,
        (mr),
        libc::EOPNOTSUPP
    );
    guard(libc::EIO, || {
        if mr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: mr is from ibv_reg_mr (the C contract).
        if unsafe { obj::<RoxeMr, _>(mr) }
            .is_some_and(|m| m.mr.lock().as_ref().is_some_and(|r| r.bound_windows() > 0))
        {
            // As the kernel: not while memory windows are bound into it.
            return libc::EBUSY;
        }
        // SAFETY: mr came from leak(RoxeMr) and is destroyed once; its PD
        // outlives it (dealloc_pd refuses while users > 0).
        let m = unsafe { Box::from_raw(mr.cast::<RoxeMr>()) };
        forget_handle(m.c.context, m.c.handle);
        // Dropping the Mr deregisters it under the engine lock: no remote
        // access reaches the memory after this returns, whichever structs
        // (imports) still name it.
        let region = m.mr.lock().take();
        drop(region);
        drop(m);
        0
    })
}

/// `ibv_advise_mr` (the `verbs_context` op): EINVAL for an unknown advice
/// or flag, an empty SGE list, or an SGE that is not inside an on-demand
/// region of the PD; a valid prefetch has nothing to do (every page is
/// resolved when it is accessed).
pub(crate) unsafe extern "C" fn advise_mr(
    pd: *mut ibv_pd,
    advice: u32,
    flags: u32,
    sg_list: *mut ibv_sge,
    num_sge: u32,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: pd is NULL or from ibv_alloc_pd (the C contract).
        let Some(p) = (unsafe { obj::<RoxePd, _>(pd) }) else {
            return libc::EINVAL;
        };
        if advice > IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT || flags & !IBV_ADVISE_MR_FLAG_FLUSH != 0
        {
            return libc::EINVAL;
        }
        let Ok(n) = c_int::try_from(num_sge) else {
            return libc::EINVAL;
        };
        // SAFETY: sg_list holds num_sge SGEs (the C contract).
        let Some(list) = (unsafe { sges(sg_list, n) }) else {
            return libc::EINVAL;
        };
        match p.pd.advise_mr(&list) {
            Ok(()) => 0,
            Err(e) => e.errno(),
        }
    })
}

// -------------------------------------------------------- device memory

#[repr(C)]
pub(crate) struct RoxeDm {
    c: ibv_dm,
    dm: roxe_verbs::Dm,
}

impl RoxeDm {
    /// The struct for `dm` on `ctx`, named `handle` on its command file.
    pub(crate) fn new(ctx: *mut ibv_context, handle: u32, dm: roxe_verbs::Dm) -> Self {
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
                leak(RoxeDm::new(ctx, handle, dm)).cast()
            }
            Err(e) => fail_null(e.errno()),
        }
    })
}

/// `ibv_free_dm`: EBUSY while memory regions are registered over it.
pub(crate) unsafe extern "C" fn free_dm(dm: *mut ibv_dm) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: dm is NULL or from alloc_dm (the C contract).
        let Some(d) = (unsafe { obj::<RoxeDm, _>(dm) }) else {
            return libc::EINVAL;
        };
        if d.dm.has_regions() {
            return libc::EBUSY;
        }
        forget_handle(d.c.context, d.c.handle);
        // SAFETY: dm came from leak(RoxeDm) and is freed once.
        drop(unsafe { Box::from_raw(dm.cast::<RoxeDm>()) });
        0
    })
}

unsafe extern "C" fn memcpy_to_dm(
    dm: *mut ibv_dm,
    offset: u64,
    host: *const c_void,
    len: usize,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: dm is from alloc_dm; host holds len readable bytes (the
        // C contract of ibv_memcpy_to_dm).
        let Some(d) = (unsafe { obj::<RoxeDm, _>(dm) }) else {
            return libc::EINVAL;
        };
        if host.is_null() && len > 0 {
            return libc::EINVAL;
        }
        let data = if len == 0 {
            &[][..]
        } else {
            // SAFETY: as above.
            unsafe { std::slice::from_raw_parts(host.cast::<u8>(), len) }
        };
        match d.dm.write(offset, data) {
            Ok(()) => 0,
            Err(e) => e.errno(),
        }
    })
}

unsafe extern "C" fn memcpy_from_dm(
    host: *mut c_void,
    dm: *mut ibv_dm,
    offset: u64,
    len: usize,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: dm is from alloc_dm; host holds len writable bytes (the
        // C contract of ibv_memcpy_from_dm).
        let Some(d) = (unsafe { obj::<RoxeDm, _>(dm) }) else {
            return libc::EINVAL;
        };
        if host.is_null() && len > 0 {
            return libc::EINVAL;
        }
        let out = if len == 0 {
            &mut [][..]
        } else {
            // SAFETY: as above.
            unsafe { std::slice::from_raw_parts_mut(host.cast::<u8>(), len) }
        };
        match d.dm.read(offset, out) {
            Ok(()) => 0,
            Err(e) => e.errno(),
        }
    })
}

/// `ibv_reg_dm_mr`: a zero-based region over device memory.
pub(crate) unsafe extern "C" fn reg_dm_mr(
    pd: *mut ibv_pd,
    dm: *mut ibv_dm,
    offset: u64,
    length: usize,
    access: c_uint,
) -> *mut ibv_mr {
    guard(null_mut(), || {
        // SAFETY: pd and dm are NULL or this library's (the C contract).
        let (Some(p), Some(d)) = (unsafe { obj::<RoxePd, _>(pd) }, unsafe {
            obj::<RoxeDm, _>(dm)
        }) else {
            return fail_null(libc::EINVAL);
        };
        if d.c.context != p.c.context {
            return fail_null(libc::EINVAL);
        }
        let access = AccessFlags(access & !IBV_ACCESS_OPTIONAL_RANGE);
        match p.pd.reg_dm_mr(&d.dm, offset, length, access) {
            // Zero-based: the region's addresses start at 0.
            Ok(mr) => leak(RoxeMr::register(mr, p, pd, null_mut(), length)).cast(),
            Err(e) => fail_null(e.errno()),
        }
    })
}

// ------------------------------------------------------- memory windows

#[repr(C)]
pub(crate) struct RoxeMw {
    pub(crate) c: ibv_mw,
    pub(crate) mw: Mw,
    pd: *const RoxePd,
}

/// `ibv_alloc_mw` (the op verbs.h's inline wrapper calls): EINVAL for a
/// type other than 1 and 2, as rxe.
unsafe extern "C" fn alloc_mw(pd: *mut ibv_pd, mw_type: u32) -> *mut ibv_mw {
    guard(null_mut(), || {
        // SAFETY: pd is NULL or from ibv_alloc_pd (the C contract).
        let Some(p) = (unsafe { obj::<RoxePd, _>(pd) }) else {
            return fail_null(libc::EINVAL);
        };
        let kind = match mw_type {
            1 => MwType::Type1,
            2 => MwType::Type2,
            _ => return fail_null(libc::EINVAL),
        };
        match p.pd.alloc_mw(kind) {
            Ok(mw) => {
                p.users.fetch_add(1, Ordering::AcqRel);
                leak(RoxeMw {
                    c: ibv_mw {
                        context: p.c.context,
                        pd,
                        rkey: mw.rkey(),
                        handle: 0,
                        type_: mw_type,
                    },
                    mw,
                    pd: p,
                })
                .cast()
            }
            Err(e) => fail_null(e.errno()),
        }
    })
}

unsafe extern "C" fn dealloc_mw(mw: *mut ibv_mw) -> c_int {
    guard(libc::EIO, || {
        if mw.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: mw came from leak(RoxeMw) and is destroyed once; its PD
        // outlives it (dealloc_pd refuses while users > 0).
        let m = unsafe { Box::from_raw(mw.cast::<RoxeMw>()) };
        let pd = m.pd;
        // Dropping the Mw deallocates it: its keys stop working now.
        drop(m);
        // SAFETY: see above, the PD is still alive.
        unsafe { (*pd).users.fetch_sub(1, Ordering::AcqRel) };
        0
    })
}

/// The MR a bind names: NULL, or one of this library's on the same
/// context (EINVAL otherwise: a real device's MR cannot hold a soft
/// device's window).
///
/// # Safety
/// `mr` is NULL or an MR from `ibv_reg_mr*`.
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
    let Some(m) = (unsafe { obj::<RoxeMr, _>(mr) }) else {
        return Ok(None);
    };
    // Deregistered through another struct (an import): no region.
    MutexGuard::try_map(m.mr.lock(), Option::as_mut)
        .map(Some)
        .map_err(|_| libc::EINVAL)
}

/// `ibv_bind_mw` (type 1, through the op): posts the bind; on success the
/// window's `rkey` is the new key (which works once the bind executes).
unsafe extern "C" fn bind_mw(qp: *mut ibv_qp, mw: *mut ibv_mw, bind: *mut ibv_mw_bind) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: qp, mw and bind are the caller's (the C contract).
        let (Some(q), Some(m), Some(b)) =
            (unsafe { (qp_obj(qp), obj::<RoxeMw, _>(mw), bind.as_ref()) })
        else {
            return libc::EINVAL;
        };
        if m.c.context != q.c.qp_base.context {
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

// ------------------------------------------------- completion channels, CQ

#[repr(C)]
struct RoxeChannel {
    c: ibv_comp_channel,
    ch: CompChannel,
    /// Engine CQ id → the `ibv_cq*` its events name.
    cqs: Mutex<HashMap<u32, usize>>,
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_comp_channel(ctx: *mut ibv_context) -> *mut ibv_comp_channel {
    crate::passthrough::pass_through!(
        crate::passthrough::is_system_context(ctx),
        "ibv_create_comp_channel",
        fn(*mut ibv_context) -> *mut ibv_comp_channel,
        (ctx),
        null_mut()
    );
    guard(null_mut(), || {
        // SAFETY: ctx is NULL or an open context.
        let Some(c) = (unsafe { context(ctx) }) else {
            return fail_null(libc::EINVAL);
        };
        match c.ctx.create_comp_channel() {
            Ok(ch) => leak(RoxeChannel {
                c: ibv_comp_channel {
                    context: ctx,
                    fd: ch.as_raw_fd(),
                    refcnt: 0,
                },
                ch,
                cqs: Mutex::new(HashMap::new()),
            })
            .cast(),
            Err(e) => fail_null(e.errno()),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int {
    crate::passthrough::pass_through!(
        object channel,
        "ibv_destroy_comp_channel",
        fn(*mut ibv_comp_channel) -> c_int,
        (channel),
        libc::EOPNOTSUPP
    );
    guard(libc::EIO, || {
        // SAFETY: channel is NULL or from ibv_create_comp_channel.
        let Some(ch) = (unsafe { obj::<RoxeChannel, _>(channel) }) else {
            return libc::EINVAL;
        };
        if !ch.cqs.lock().is_empty() {
            return libc::EBUSY;
        }
        // SAFETY: created by leak(RoxeChannel), destroyed once.
        drop(unsafe { Box::from_raw(channel.cast::<RoxeChannel>()) });
        0
    })
}

/// Every CQ carries the `ibv_cq_ex` layout (its leading members are the
/// `ibv_cq`), so one created by `ibv_create_cq_ex` is polled through
/// `ibv_start_poll` & co, and any CQ through `ibv_poll_cq`.
#[repr(C)]
pub(crate) struct RoxeCq {
    c: ibv_cq_ex,
    pub(crate) cq: Cq,
    pub(crate) users: AtomicUsize,
    /// Completions taken from the CQ by `start_poll`/`next_poll` and not
    /// yet handed over (the first is the current one), in order, each
    /// with its wall-clock time (0 unless `wallclock`).
    polled: Mutex<std::collections::VecDeque<(WorkCompletion, u64)>>,
    /// Created with `IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK`.
    wallclock: bool,
    /// Whether `polled` holds any (so `ibv_poll_cq` need not lock).
    has_polled: std::sync::atomic::AtomicBool,
}

/// A fresh `ibv_cq_ex` with the extended-poll functions filled in.
fn cq_ex_header(
    ctx: *mut ibv_context,
    channel: *mut ibv_comp_channel,
    cq_context: *mut c_void,
    handle: u32,
    cqe: c_int,
) -> ibv_cq_ex {
    ibv_cq_ex {
        context: ctx,
        channel,
        cq_context,
        handle,
        cqe,
        mutex: libc::PTHREAD_MUTEX_INITIALIZER,
        cond: libc::PTHREAD_COND_INITIALIZER,
        comp_events_completed: 0,
        async_events_completed: 0,
        comp_mask: 0,
        status: 0,
        wr_id: 0,
        start_poll: Some(cq_ex::start_poll),
        next_poll: Some(cq_ex::next_poll),
        end_poll: Some(cq_ex::end_poll),
        read_opcode: Some(cq_ex::read_opcode),
        read_vendor_err: Some(cq_ex::read_vendor_err),
        read_byte_len: Some(cq_ex::read_byte_len),
        read_imm_data: Some(cq_ex::read_imm_data),
        read_qp_num: Some(cq_ex::read_qp_num),
        read_src_qp: Some(cq_ex::read_src_qp),
        read_wc_flags: Some(cq_ex::read_wc_flags),
        read_slid: Some(cq_ex::read_zero_u32),
        read_sl: Some(cq_ex::read_sl),
        read_dlid_path_bits: Some(cq_ex::read_zero_u8),
        // Not offered (create_cq_ex refuses the flags that need them).
        read_completion_ts: None,
        read_cvlan: None,
        read_flow_tag: None,
        read_tm_info: None,
        read_completion_wallclock_ns: None,
    }
}

/// The optional fields a CQ offers to `ibv_wc_read_*` (the flags of
/// `ibv_create_cq_ex`).
#[derive(Clone, Copy, Default)]
pub(crate) struct CqFields {
    /// `IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK`.
    wallclock: bool,
    /// `IBV_WC_EX_WITH_COMPLETION_TIMESTAMP`.
    device_clock: bool,
    /// `IBV_WC_EX_WITH_TM_INFO`.
    tm_info: bool,
}

/// A CQ of `cqe` entries on context `ctx` (both creation verbs).
///
/// # Safety
/// `ctx` is NULL or an open context; `channel` NULL or one of its channels.
unsafe fn create_roxe_cq(
    ctx: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
    times: CqFields,
) -> Result<*mut RoxeCq, c_int> {
    // SAFETY: per the contract.
    let Some(c) = (unsafe { context(ctx) }) else {
        return Err(libc::EINVAL);
    };
    if cqe < 1 || comp_vector < 0 || comp_vector >= c.vctx.context.num_comp_vectors {
        return Err(libc::EINVAL);
    }
    // SAFETY: channel is NULL or from ibv_create_comp_channel.
    let ch = unsafe { obj::<RoxeChannel, _>(channel) };
    let cq = c
        .ctx
        .create_cq(cqe as u32, ch.map(|h| &h.ch))
        .map_err(|e| e.errno())?;
    let id = cq.id().0;
    let mut header = cq_ex_header(ctx, channel, cq_context, id, cqe);
    if times.wallclock {
        header.read_completion_wallclock_ns = Some(cq_ex::read_completion_wallclock_ns);
    }
    if times.device_clock {
        // The device clock's ticks are those nanoseconds.
        header.read_completion_ts = Some(cq_ex::read_completion_wallclock_ns);
    }
    if times.tm_info {
        header.read_tm_info = Some(cq_ex::read_tm_info);
    }
    let wallclock = times.wallclock || times.device_clock;
    let raw = leak(RoxeCq {
        c: header,
        cq,
        users: AtomicUsize::new(0),
        wallclock,
        polled: Mutex::new(std::collections::VecDeque::new()),
        has_polled: std::sync::atomic::AtomicBool::new(false),
    });
    if let Some(ch) = ch {
        let mut cqs = ch.cqs.lock();
        cqs.insert(id, raw as usize);
        // SAFETY: refcnt is read by programs only; we update it under the
        // channel's lock.
        unsafe { (*channel).refcnt = cqs.len() as c_int };
    }
    Ok(raw)
}

/// `ibv_create_cq_ex` (the `verbs_context` op): the standard
/// work-completion fields (`IBV_WC_STANDARD_FLAGS`) and completion times,
/// wall-clock (`IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK`, read with
/// `ibv_wc_read_completion_wallclock_ns`) and on the device's clock
/// (`IBV_WC_EX_WITH_COMPLETION_TIMESTAMP`, `ibv_wc_read_completion_ts`):
/// a soft device's clock ticks in nanoseconds since the Unix epoch
/// (`hca_core_clock` 1,000,000 kHz), monotonic because it advances with the
/// device's monotonic clock from the wall-clock time it was opened at, so
/// both reads give the same value; tag-matching details
/// (`IBV_WC_EX_WITH_TM_INFO`, `ibv_wc_read_tm_info`). CVLAN and flow tags
/// are refused with EOPNOTSUPP, as by a device without them.
pub(crate) unsafe extern "C" fn create_cq_ex(
    ctx: *mut ibv_context,
    attr: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq_ex {
    guard(null_mut(), || {
        // SAFETY: attr is NULL or the caller's.
        let Some(a) = (unsafe { attr.as_ref() }) else {
            return fail_null(libc::EINVAL);
        };
        /// `IBV_CREATE_CQ_ATTR_SINGLE_THREADED`: a hint roxe can ignore.
        const SINGLE_THREADED: u32 = 1;
        let known_mask = IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD;
        if a.comp_mask & !known_mask != 0 {
            return fail_null(libc::EINVAL);
        }
        if (a.comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS != 0 && a.flags & !SINGLE_THREADED != 0)
            || a.wc_flags
                & !(IBV_WC_STANDARD_FLAGS
                    | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK
                    | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP
                    | IBV_WC_EX_WITH_TM_INFO)
                != 0
        {
            return fail_null(libc::EOPNOTSUPP);
        }
        if a.comp_mask & IBV_CQ_INIT_ATTR_MASK_PD != 0 {
            // A parent domain (its allocators have no CQ buffer to place
            // here); it must be one of this context's.
            // SAFETY: parent_domain is NULL or a PD of this library.
            match unsafe { obj::<RoxePd, _>(a.parent_domain) } {
                Some(p) if p.parent_of.is_some() && p.c.context == ctx => {}
                _ => return fail_null(libc::EINVAL),
            }
        }
        let (Ok(cqe), Ok(vector)) = (c_int::try_from(a.cqe), c_int::try_from(a.comp_vector)) else {
            return fail_null(libc::EINVAL);
        };
        let times = CqFields {
            wallclock: a.wc_flags & IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK != 0,
            device_clock: a.wc_flags & IBV_WC_EX_WITH_COMPLETION_TIMESTAMP != 0,
            tm_info: a.wc_flags & IBV_WC_EX_WITH_TM_INFO != 0,
        };
        // SAFETY: ctx is the context the inline wrapper passed; the
        // channel is the caller's.
        match unsafe { create_roxe_cq(ctx, cqe, a.cq_context, a.channel, vector, times) } {
            Ok(raw) => raw.cast(),
            Err(e) => fail_null(e),
        }
    })
}

/// The extended-poll functions (`ibv_start_poll`, `ibv_wc_read_*`, ...).
mod cq_ex {
    use super::*;

    /// The CQ behind `cq` and its polled completions.
    ///
    /// # Safety
    /// `cq` is a CQ this library created.
    unsafe fn roxe<'a>(cq: *mut ibv_cq_ex) -> Option<&'a RoxeCq> {
        // SAFETY: per the contract (RoxeCq starts with the ibv_cq_ex).
        unsafe { cq.cast::<RoxeCq>().as_ref() }
    }

    /// Make the first polled completion (if any) current: status and
    /// wr_id into the public fields. ENOENT when there is none.
    fn expose(
        q: &RoxeCq,
        cq: *mut ibv_cq_ex,
        polled: &mut std::collections::VecDeque<(WorkCompletion, u64)>,
    ) -> c_int {
        if polled.is_empty() {
            let mut buf = [WorkCompletion::new(
                0,
                roxe_verbs::WcStatus::Success,
                roxe_verbs::WcOpcode::Send,
                0,
            ); 16];
            let mut at = [0u64; 16];
            let got = if q.wallclock {
                q.cq.poll_with_wallclock(&mut buf, &mut at)
            } else {
                q.cq.poll(&mut buf)
            };
            match got {
                Ok(n) => polled.extend(buf[..n].iter().copied().zip(at)),
                Err(e) => return e.errno(),
            }
        }
        q.has_polled.store(!polled.is_empty(), Ordering::Release);
        let Some((w, _)) = polled.front() else {
            return libc::ENOENT;
        };
        // SAFETY: cq is the live CQ; the public fields programs read.
        unsafe {
            (*cq).status = w.status as u32;
            (*cq).wr_id = w.wr_id;
        }
        0
    }

    pub(super) unsafe extern "C" fn start_poll(
        cq: *mut ibv_cq_ex,
        attr: *mut ibv_poll_cq_attr,
    ) -> c_int {
        guard(libc::EIO, || {
            // SAFETY: the inline wrapper passes the CQ itself.
            let Some(q) = (unsafe { roxe(cq) }) else {
                return libc::EINVAL;
            };
            // SAFETY: attr is NULL or the caller's; comp_mask must be 0.
            if unsafe { attr.as_ref() }.is_some_and(|a| a.comp_mask != 0) {
                return libc::EINVAL;
            }
            let mut polled = q.polled.lock();
            expose(q, cq, &mut polled)
        })
    }

    pub(super) unsafe extern "C" fn next_poll(cq: *mut ibv_cq_ex) -> c_int {
        guard(libc::EIO, || {
            // SAFETY: as in start_poll.
            let Some(q) = (unsafe { roxe(cq) }) else {
                return libc::EINVAL;
            };
            let mut polled = q.polled.lock();
            // The current one is consumed.
            polled.pop_front();
            expose(q, cq, &mut polled)
        })
    }

    pub(super) unsafe extern "C" fn end_poll(cq: *mut ibv_cq_ex) {
        guard((), || {
            // SAFETY: as in start_poll.
            let Some(q) = (unsafe { roxe(cq) }) else {
                return;
            };
            // The current one is consumed; the rest wait for the next poll.
            let mut polled = q.polled.lock();
            polled.pop_front();
            q.has_polled.store(!polled.is_empty(), Ordering::Release);
        })
    }

    /// A field of the current completion (0 without one).
    fn current<T: Default>(cq: *mut ibv_cq_ex, f: impl FnOnce(&WorkCompletion) -> T) -> T {
        guard(T::default(), || {
            // SAFETY: as in start_poll.
            let Some(q) = (unsafe { roxe(cq) }) else {
                return T::default();
            };
            q.polled
                .lock()
                .front()
                .map(|(w, _)| f(w))
                .unwrap_or_default()
        })
    }

    pub(super) unsafe extern "C" fn read_opcode(cq: *mut ibv_cq_ex) -> u32 {
        current(cq, |w| w.opcode as u32)
    }
    pub(super) unsafe extern "C" fn read_vendor_err(_cq: *mut ibv_cq_ex) -> u32 {
        0
    }
    pub(super) unsafe extern "C" fn read_byte_len(cq: *mut ibv_cq_ex) -> u32 {
        current(cq, |w| w.byte_len)
    }
    pub(super) unsafe extern "C" fn read_imm_data(cq: *mut ibv_cq_ex) -> u32 {
        // __be32, as ibv_wc's imm_data (or the invalidated rkey).
        current(cq, |w| wc_to_c(w).imm_data)
    }
    pub(super) unsafe extern "C" fn read_qp_num(cq: *mut ibv_cq_ex) -> u32 {
        current(cq, |w| w.qp_num)
    }
    pub(super) unsafe extern "C" fn read_src_qp(cq: *mut ibv_cq_ex) -> u32 {
        current(cq, |w| w.src_qp)
    }
    pub(super) unsafe extern "C" fn read_sl(cq: *mut ibv_cq_ex) -> u8 {
        current(cq, |w| w.sl)
    }
    /// `ibv_wc_read_completion_wallclock_ns`: when the device made the
    /// current completion, in nanoseconds since the Unix epoch.
    pub(super) unsafe extern "C" fn read_completion_wallclock_ns(cq: *mut ibv_cq_ex) -> u64 {
        guard(0, || {
            // SAFETY: as in start_poll.
            let Some(q) = (unsafe { roxe(cq) }) else {
                return 0;
            };
            q.polled.lock().front().map_or(0, |&(_, at)| at)
        })
    }

    /// `ibv_wc_read_tm_info`: a tag-matching completion's tag and the
    /// TMH's application context (zeros for others).
    ///
    /// # Safety
    /// `cq` is this library's extended CQ; `info` is NULL or writable.
    pub(super) unsafe extern "C" fn read_tm_info(cq: *mut ibv_cq_ex, info: *mut ibv_wc_tm_info) {
        let (tag, priv_) = current(cq, |w| (w.tm_tag, w.tm_priv));
        // SAFETY: info is the caller's (the inline wrapper's contract).
        if let Some(out) = unsafe { info.as_mut() } {
            *out = ibv_wc_tm_info { tag, priv_ };
        }
    }

    pub(super) unsafe extern "C" fn read_wc_flags(cq: *mut ibv_cq_ex) -> c_uint {
        current(cq, |w| w.wc_flags)
    }
    pub(super) unsafe extern "C" fn read_zero_u32(_cq: *mut ibv_cq_ex) -> u32 {
        0
    }
    pub(super) unsafe extern "C" fn read_zero_u8(_cq: *mut ibv_cq_ex) -> u8 {
        0
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_cq(
    ctx: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    crate::passthrough::pass_through!(
        crate::passthrough::is_system_context(ctx),
        "ibv_create_cq",
        fn(*mut ibv_context, c_int, *mut c_void, *mut ibv_comp_channel, c_int) -> *mut ibv_cq,
        (ctx, cqe, cq_context, channel, comp_vector),
        null_mut()
    );
    guard(null_mut(), || {
        // SAFETY: ctx NULL or open, channel NULL or its channel (C contract).
        match unsafe {
            create_roxe_cq(
                ctx,
                cqe,
                cq_context,
                channel,
                comp_vector,
                CqFields::default(),
            )
        } {
            Ok(raw) => raw.cast(),
            Err(e) => fail_null(e),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
    crate::passthrough::pass_through!(
        object cq,
        "ibv_resize_cq",
        fn(*mut ibv_cq, c_int) -> c_int,
        (cq, cqe),
        libc::EOPNOTSUPP
    );
    guard(libc::EIO, || {
        // SAFETY: cq is NULL or from ibv_create_cq.
        let Some(q) = (unsafe { obj::<RoxeCq, _>(cq) }) else {
            return libc::EINVAL;
        };
        let Ok(depth) = u32::try_from(cqe) else {
            return libc::EINVAL;
        };
        match q.cq.resize(depth) {
            Ok(()) => {
                // SAFETY: the public field programs read.
                unsafe { (*cq).cqe = cqe };
                0
            }
            Err(e) => e.errno(),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    crate::passthrough::pass_through!(
        object cq,
        "ibv_destroy_cq",
        fn(*mut ibv_cq) -> c_int,
        (cq),
        libc::EOPNOTSUPP
    );
    guard(libc::EIO, || {
        // SAFETY: cq is NULL or from ibv_create_cq.
        let Some(q) = (unsafe { obj::<RoxeCq, _>(cq) }) else {
            return libc::EINVAL;
        };
        if q.users.load(Ordering::Acquire) != 0 {
            return libc::EBUSY;
        }
        // SAFETY: the channel outlives its CQs (destroy_comp_channel
        // refuses while any is attached).
        if let Some(ch) = unsafe { obj::<RoxeChannel, _>(q.c.channel) } {
            let mut cqs = ch.cqs.lock();
            cqs.remove(&q.cq.id().0);
            // SAFETY: as in ibv_create_cq.
            unsafe { (*q.c.channel).refcnt = cqs.len() as c_int };
        }
        // SAFETY: created by leak(RoxeCq), destroyed once.
        drop(unsafe { Box::from_raw(cq.cast::<RoxeCq>()) });
        0
    })
}

/// `ibv_get_cq_event`: the next event of the channel. Blocking or not as
/// the program set `channel->fd`; -1 with errno (EAGAIN) when nothing is
/// pending on a non-blocking channel.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_cq_event(
    channel: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    crate::passthrough::pass_through!(
        object channel,
        "ibv_get_cq_event",
        fn(*mut ibv_comp_channel, *mut *mut ibv_cq, *mut *mut c_void) -> c_int,
        (channel, cq, cq_context),
        libc::EOPNOTSUPP
    );
    guard(-1, || {
        // SAFETY: channel is NULL or from ibv_create_comp_channel.
        let Some(ch) = (unsafe { obj::<RoxeChannel, _>(channel) }) else {
            set_errno(libc::EINVAL);
            return -1;
        };
        if cq.is_null() || cq_context.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        loop {
            let id = match ch.ch.get_event() {
                Ok(id) => id,
                Err(e) => {
                    set_errno(e.raw_os_error().unwrap_or(libc::EIO));
                    return -1;
                }
            };
            // An event for a CQ destroyed meanwhile is stale: skip it.
            let Some(&p) = ch.cqs.lock().get(&id.0) else {
                continue;
            };
            let p = p as *mut ibv_cq;
            // SAFETY: p is a live CQ of this channel; the out-pointers are
            // the caller's.
            unsafe {
                *cq = p;
                *cq_context = (*p).cq_context;
            }
            return 0;
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_ack_cq_events(cq: *mut ibv_cq, nevents: u32) {
    crate::passthrough::pass_through!(
        object cq,
        "ibv_ack_cq_events",
        fn(*mut ibv_cq, u32) -> (),
        (cq, nevents),
        ()
    );
    if cq.is_null() {
        return;
    }
    // SAFETY: cq is a live CQ; its mutex/cond were initialised at create.
    unsafe {
        libc::pthread_mutex_lock(ptr::addr_of_mut!((*cq).mutex));
        (*cq).comp_events_completed = (*cq).comp_events_completed.wrapping_add(nevents);
        libc::pthread_cond_signal(ptr::addr_of_mut!((*cq).cond));
        libc::pthread_mutex_unlock(ptr::addr_of_mut!((*cq).mutex));
    }
}

unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, num_entries: c_int, wc: *mut ibv_wc) -> c_int {
    guard(-1, || {
        // SAFETY: cq is a CQ of this library (the inline wrapper found our
        // ops through cq->context).
        let Some(q) = (unsafe { obj::<RoxeCq, _>(cq) }) else {
            return -1;
        };
        if num_entries <= 0 {
            return 0;
        }
        if wc.is_null() {
            return -1;
        }
        let want = num_entries as usize;
        let mut done = 0usize;
        // Completions an extended poll took from the CQ and left come
        // first (in order).
        if q.has_polled.load(Ordering::Acquire) {
            let mut polled = q.polled.lock();
            while done < want {
                let Some((w, _)) = polled.pop_front() else {
                    break;
                };
                // SAFETY: the caller's array holds num_entries entries.
                unsafe { wc.add(done).write(wc_to_c(&w)) };
                done += 1;
            }
            q.has_polled.store(!polled.is_empty(), Ordering::Release);
        }
        let mut buf = [WorkCompletion::new(
            0,
            roxe_verbs::WcStatus::Success,
            roxe_verbs::WcOpcode::Send,
            0,
        ); 32];
        while done < want {
            let k = match q.cq.poll(&mut buf[..(want - done).min(32)]) {
                Ok(k) => k,
                Err(_) => return if done > 0 { done as c_int } else { -1 },
            };
            for (i, w) in buf[..k].iter().enumerate() {
                // SAFETY: the caller's array holds num_entries entries.
                unsafe { wc.add(done + i).write(wc_to_c(w)) };
            }
            done += k;
            if k < 32 {
                break;
            }
        }
        done as c_int
    })
}

unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: cq is a CQ of this library.
        let Some(q) = (unsafe { obj::<RoxeCq, _>(cq) }) else {
            return libc::EINVAL;
        };
        match q.cq.req_notify(solicited_only != 0) {
            Ok(()) => 0,
            Err(e) => e.errno(),
        }
    })
}

// ------------------------------------------------------------------- SRQ

#[repr(C)]
pub(crate) struct RoxeSrq {
    c: ibv_srq,
    pub(crate) srq: Srq,
    attr: ibv_srq_attr,
    pd: *const RoxePd,
    users: AtomicUsize,
    /// An XRC SRQ's domain (it counts as its user).
    xrcd: Option<*const crate::xrc::RoxeXrcd>,
    /// An XRC or tag-matching SRQ's CQ (it counts as its user).
    cq: Option<*const RoxeCq>,
}

impl RoxeSrq {
    /// Hand `srq` (created on `p`, whose public pointer is `pd`) to C.
    ///
    /// # Safety
    /// `p` is `pd`'s container; the XRC domain and CQ, if any, are live
    /// objects of this library that already count this SRQ as a user.
    pub(crate) unsafe fn hand_out(
        p: &RoxePd,
        pd: *mut ibv_pd,
        srq_context: *mut c_void,
        srq: Srq,
        a: ibv_srq_attr,
        xrcd: Option<&crate::xrc::RoxeXrcd>,
        cq: Option<&RoxeCq>,
    ) -> *mut ibv_srq {
        p.users.fetch_add(1, Ordering::AcqRel);
        leak(RoxeSrq {
            c: ibv_srq {
                context: p.c.context,
                srq_context,
                pd,
                handle: 0,
                mutex: libc::PTHREAD_MUTEX_INITIALIZER,
                cond: libc::PTHREAD_COND_INITIALIZER,
                events_completed: 0,
            },
            srq,
            attr: ibv_srq_attr {
                max_wr: a.max_wr,
                max_sge: a.max_sge,
                srq_limit: 0,
            },
            pd: p,
            users: AtomicUsize::new(0),
            xrcd: xrcd.map(|x| x as *const _),
            cq: cq.map(|c| c as *const _),
        })
        .cast()
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_srq(
    pd: *mut ibv_pd,
    init: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    crate::passthrough::pass_through!(
        object pd,
        "ibv_create_srq",
        fn(*mut ibv_pd, *mut ibv_srq_init_attr) -> *mut ibv_srq,
        (pd, init),
        null_mut()
    );
    guard(null_mut(), || {
        // SAFETY: pd is NULL or from ibv_alloc_pd; init is the caller's.
        let (Some(p), Some(init)) = (unsafe { obj::<RoxePd, _>(pd) }, unsafe { init.as_mut() })
        else {
            return fail_null(libc::EINVAL);
        };
        let a = init.attr;
        match p.pd.create_srq(a.max_wr, a.max_sge) {
            // SAFETY: p is pd's container; a basic SRQ.
            Ok(srq) => unsafe { RoxeSrq::hand_out(p, pd, init.srq_context, srq, a, None, None) },
            Err(e) => fail_null(e.errno()),
        }
    })
}

/// `vctx->create_srq_ex`, which the inline `ibv_create_srq_ex` calls for
/// anything beyond a basic SRQ with a PD: basic, XRC and tag-matching SRQs;
/// a basic SRQ accepts a CQ and leaves it unused, as it only matters to the
/// other types.
pub(crate) unsafe extern "C" fn create_srq_ex(
    _ctx: *mut ibv_context,
    attr: *mut ibv_srq_init_attr_ex,
) -> *mut ibv_srq {
    guard(null_mut(), || {
        // SAFETY: attr is the caller's.
        let Some(a) = (unsafe { attr.as_mut() }) else {
            return fail_null(libc::EINVAL);
        };
        let known = IBV_SRQ_INIT_ATTR_TYPE
            | IBV_SRQ_INIT_ATTR_PD
            | IBV_SRQ_INIT_ATTR_CQ
            | IBV_SRQ_INIT_ATTR_XRCD;
        let typed = a.comp_mask & IBV_SRQ_INIT_ATTR_TYPE != 0;
        if typed && a.srq_type == IBV_SRQT_XRC {
            // SAFETY: a is the caller's; its PD, XRCD and CQ NULL or ours.
            return unsafe { crate::xrc::create_xrc_srq(a) };
        }
        if typed && a.srq_type == IBV_SRQT_TM {
            // SAFETY: a is the caller's; its PD and CQ NULL or ours.
            return unsafe { crate::tm::create_tm_srq(a) };
        }
        if a.comp_mask & !known != 0 || (typed && a.srq_type != IBV_SRQT_BASIC) {
            return fail_null(libc::EOPNOTSUPP);
        }
        if a.comp_mask & IBV_SRQ_INIT_ATTR_PD == 0 {
            return fail_null(libc::EINVAL);
        }
        // SAFETY: ibv_srq_init_attr_ex starts with ibv_srq_init_attr's
        // layout (srq_context, attr), and the PD is NULL or ours.
        unsafe { ibv_create_srq(a.pd, attr.cast()) }
    })
}

/// The roxe QP and PD behind a QP this library created (rdma_cm attaches
/// them to an id).
///
/// # Safety
/// `qp` must be NULL or a live QP of this library.
pub(crate) unsafe fn qp_parts(qp: *mut ibv_qp) -> Option<(Qp, Pd)> {
    // SAFETY: per the contract; a live QP's PD outlives it (users count).
    let q = unsafe { qp_obj(qp) }?;
    // SAFETY: as above.
    let pd = unsafe { q.pd.as_ref() }?;
    Some((q.qp.clone(), pd.pd.clone()))
}

/// Resizing an SRQ and its limit event are not supported.
#[no_mangle]
pub unsafe extern "C" fn ibv_modify_srq(
    srq: *mut ibv_srq,
    _attr: *mut ibv_srq_attr,
    mask: c_int,
) -> c_int {
    crate::passthrough::pass_through!(
        object srq,
        "ibv_modify_srq",
        fn(*mut ibv_srq, *mut ibv_srq_attr, c_int) -> c_int,
        (srq, _attr, mask),
        libc::EOPNOTSUPP
    );
    if srq.is_null() {
        return libc::EINVAL;
    }
    if mask & !(IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT) != 0 {
        return libc::EINVAL;
    }
    if mask == 0 {
        0
    } else {
        libc::EOPNOTSUPP
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
    crate::passthrough::pass_through!(
        object srq,
        "ibv_query_srq",
        fn(*mut ibv_srq, *mut ibv_srq_attr) -> c_int,
        (srq, attr),
        libc::EOPNOTSUPP
    );
    // SAFETY: srq is NULL or from ibv_create_srq.
    let Some(s) = (unsafe { obj::<RoxeSrq, _>(srq) }) else {
        return libc::EINVAL;
    };
    if attr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: attr is the caller's.
    unsafe { attr.write(s.attr) };
    0
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int {
    crate::passthrough::pass_through!(
        object srq,
        "ibv_destroy_srq",
        fn(*mut ibv_srq) -> c_int,
        (srq),
        libc::EOPNOTSUPP
    );
    guard(libc::EIO, || {
        // SAFETY: srq is NULL or from ibv_create_srq.
        let Some(s) = (unsafe { obj::<RoxeSrq, _>(srq) }) else {
            return libc::EINVAL;
        };
        if s.users.load(Ordering::Acquire) != 0 {
            return libc::EBUSY;
        }
        let (pd, xrcd, cq) = (s.pd, s.xrcd, s.cq);
        // SAFETY: created by leak(RoxeSrq), destroyed once; the PD (and an
        // XRC SRQ's domain, an XRC or TM SRQ's CQ) outlive it.
        unsafe {
            drop(Box::from_raw(srq.cast::<RoxeSrq>()));
            (*pd).users.fetch_sub(1, Ordering::AcqRel);
            if let Some(x) = xrcd {
                (*x).users.fetch_sub(1, Ordering::AcqRel);
            }
            if let Some(cq) = cq {
                (*cq).users.fetch_sub(1, Ordering::AcqRel);
            }
        }
        0
    })
}

unsafe extern "C" fn post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: srq is one of ours (found through its context's ops).
        let Some(s) = (unsafe { obj::<RoxeSrq, _>(srq) }) else {
            return libc::EINVAL;
        };
        // SAFETY: wr is the caller's list.
        unsafe { post_recv_each(wr, bad_wr, |r| s.srq.post_recv(r).map_err(|e| e.errno())) }
    })
}

/// Walk a receive WR list, posting each on its own; on failure name the
/// first WR not posted in `bad_wr`.
///
/// # Safety
/// `wr` is NULL or the head of the caller's list of valid `ibv_recv_wr`s
/// (each with `num_sge` readable SGEs); `bad_wr` is NULL or writable.
unsafe fn post_recv_each(
    mut wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
    mut post: impl FnMut(RecvWr) -> Result<(), c_int>,
) -> c_int {
    while !wr.is_null() {
        // SAFETY: wr is a node of the caller's list.
        let w = unsafe { &*wr };
        // SAFETY: per ibv_post_recv's contract, its SGEs are readable.
        let r = match unsafe { recv_wr_from_c(w) } {
            Some(r) => post(r),
            None => Err(libc::EINVAL),
        };
        if let Err(e) = r {
            if !bad_wr.is_null() {
                // SAFETY: bad_wr is the caller's out-pointer.
                unsafe { *bad_wr = wr };
            }
            return e;
        }
        wr = w.next;
    }
    0
}

/// A receive WR of the caller's (`None`: its SGE list does not convert).
///
/// # Safety
/// `w.sg_list` must point at `w.num_sge` readable `ibv_sge`s.
unsafe fn recv_wr_from_c(w: &ibv_recv_wr) -> Option<RecvWr> {
    // SAFETY: per this function's contract.
    let sg_list = unsafe { sges(w.sg_list, w.num_sge) }?;
    Some(RecvWr {
        wr_id: w.wr_id,
        sg_list,
    })
}

/// The caller's scatter/gather list (`num_sge` entries at `sg`); `None`
/// for a negative count or a NULL list of entries.
///
/// # Safety
/// `sg` must point at `num_sge` readable `ibv_sge`s when `num_sge > 0`.
pub(crate) unsafe fn sges(sg: *const ibv_sge, num_sge: c_int) -> Option<Vec<Sge>> {
    if num_sge < 0 || (num_sge > 0 && sg.is_null()) {
        return None;
    }
    let mut v = Vec::with_capacity(num_sge as usize);
    for i in 0..num_sge as usize {
        // SAFETY: the caller's array has num_sge entries.
        let s = unsafe { &*sg.add(i) };
        v.push(Sge {
            addr: s.addr,
            length: s.length,
            lkey: s.lkey,
        });
    }
    Some(v)
}

// -------------------------------------------------------------------- QP

/// Every QP carries the `ibv_qp_ex` layout (its `qp_base` first, so it is
/// also an `ibv_qp`); `ibv_qp_to_qp_ex` hands it out only for QPs created
/// through `ibv_create_qp_ex` with send-ops flags, as libibverbs does.
#[repr(C)]
pub(crate) struct RoxeQp {
    pub(crate) c: ibv_qp_ex,
    pub(crate) qp: Qp,
    /// Created with `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`: the flags.
    pub(crate) send_ops: Option<u64>,
    /// The `ibv_wr_*` batch between `wr_start` and `wr_complete`, and the
    /// first error a void `ibv_wr_*` call hit (reported by `wr_complete`).
    pub(crate) batch: Mutex<(Vec<SendWr>, c_int)>,
    cap: ibv_qp_cap,
    sq_sig_all: c_int,
    pd: *const RoxePd,
    send_cq: *const RoxeCq,
    recv_cq: *const RoxeCq,
    srq: *const RoxeSrq,
}

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

unsafe fn create_qp(
    pd: *mut ibv_pd,
    init: *mut ibv_qp_init_attr,
    send_ops: Option<u64>,
) -> *mut ibv_qp {
    {
        // SAFETY: pd NULL or ours; init is the caller's.
        let (Some(p), Some(init)) = (unsafe { obj::<RoxePd, _>(pd) }, unsafe { init.as_mut() })
        else {
            return fail_null(libc::EINVAL);
        };
        // SAFETY: CQs and SRQ are NULL or ours.
        let (scq, rcq, srq) = unsafe {
            (
                obj::<RoxeCq, _>(init.send_cq),
                obj::<RoxeCq, _>(init.recv_cq),
                obj::<RoxeSrq, _>(init.srq),
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
            Err(_) if init.qp_type == 8 => return fail_null(libc::EOPNOTSUPP),
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
        p.users.fetch_add(1, Ordering::AcqRel);
        scq.users.fetch_add(1, Ordering::AcqRel);
        rcq.users.fetch_add(1, Ordering::AcqRel);
        if let Some(s) = srq {
            s.users.fetch_add(1, Ordering::AcqRel);
        }
        let granted = cap;
        init.cap = granted;
        let qpn = qp.qp_num();
        // SAFETY: the PD's context is an open context.
        let ctx = unsafe { context(p.c.context) };
        // SAFETY: ibv_qp_ex is pointers, integers and pthread objects: all
        // zero is valid (NULL function pointers are filled below).
        let mut c: ibv_qp_ex = unsafe { zeroed() };
        c.qp_base = ibv_qp {
            context: p.c.context,
            qp_context: init.qp_context,
            pd,
            send_cq: init.send_cq,
            recv_cq: init.recv_cq,
            srq: init.srq,
            handle: qp.qp_num(),
            qp_num: qp.qp_num(),
            state: QpState::Reset as u32,
            qp_type: init.qp_type,
            mutex: libc::PTHREAD_MUTEX_INITIALIZER,
            cond: libc::PTHREAD_COND_INITIALIZER,
            events_completed: 0,
        };
        if send_ops.is_some() {
            crate::qp_ex::fill_wr_ops(&mut c);
        }
        let raw = leak(RoxeQp {
            c,
            qp,
            send_ops,
            batch: Mutex::new((Vec::new(), 0)),
            cap: granted,
            sq_sig_all: init.sq_sig_all,
            pd: p,
            send_cq: scq,
            recv_cq: rcq,
            srq: srq.map_or(ptr::null(), |s| s as *const RoxeSrq),
        });
        if let Some(c) = ctx {
            c.qps.lock().insert(qpn, raw as usize);
        }
        raw.cast()
    }
}

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
        return unsafe { crate::xrc::destroy(qp) };
    }
    guard(libc::EIO, || {
        if qp.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: created by leak(RoxeQp), destroyed once; the objects it
        // counted itself a user of are still alive (they refuse to go
        // while users > 0).
        unsafe {
            let q = Box::from_raw(qp.cast::<RoxeQp>());
            if let Some(c) = context(q.c.qp_base.context) {
                c.qps.lock().remove(&q.qp.qp_num());
            }
            let (pd, scq, rcq, srq) = (q.pd, q.send_cq, q.recv_cq, q.srq);
            drop(q);
            (*pd).users.fetch_sub(1, Ordering::AcqRel);
            (*scq).users.fetch_sub(1, Ordering::AcqRel);
            (*rcq).users.fetch_sub(1, Ordering::AcqRel);
            if !srq.is_null() {
                (*srq).users.fetch_sub(1, Ordering::AcqRel);
            }
        }
        0
    })
}

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
        return unsafe { crate::xrc::modify(qp, attr, mask) };
    }
    guard(libc::EIO, || {
        // SAFETY: qp NULL or ours.
        let Some(q) = (unsafe { qp_obj(qp) }) else {
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
    modify: impl FnOnce(&roxe_verbs::QpAttr, AttrMask) -> roxe_verbs::Result<()>,
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
                // SAFETY: the public state field programs read.
                unsafe { (*qp).state = a.qp_state };
            }
            0
        }
        Err(e) => e.errno(),
    }
}

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
        return unsafe { crate::xrc::query(qp, attr, init) };
    }
    guard(libc::EIO, || {
        // SAFETY: qp NULL or ours.
        let Some(q) = (unsafe { qp_obj(qp) }) else {
            return libc::EINVAL;
        };
        if attr.is_null() || init.is_null() {
            return libc::EINVAL;
        }
        let a = match q.qp.query() {
            Ok(a) => a,
            Err(e) => return e.errno(),
        };
        let out = qp_attr_to_c(&a, q.cap);
        // SAFETY: attr and init are the caller's.
        unsafe {
            attr.write(out);
            init.write(ibv_qp_init_attr {
                qp_context: q.c.qp_base.qp_context,
                send_cq: q.c.qp_base.send_cq,
                recv_cq: q.c.qp_base.recv_cq,
                srq: q.c.qp_base.srq,
                cap: q.cap,
                qp_type: q.c.qp_base.qp_type,
                sq_sig_all: q.sq_sig_all,
            });
            (*qp).state = out.qp_state;
        }
        0
    })
}

/// The `ibv_qp_ex` of a QP created with send-ops flags, else NULL.
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
    match unsafe { qp_obj(qp) } {
        Some(q) if q.send_ops.is_some() => qp.cast(),
        _ => null_mut(),
    }
}

/// One C send WR as roxe's.
///
/// # Safety
/// `w` is a node of the caller's WR list; its SGEs, inline data and AH
/// are valid as `ibv_post_send` requires.
pub(crate) unsafe fn send_wr_from_c(
    w: &ibv_send_wr,
    qp_type: u32,
    ctx: *mut ibv_context,
) -> Result<SendWr, c_int> {
    let opcode = match w.opcode {
        0 => SendOpcode::RdmaWrite,
        1 => SendOpcode::RdmaWriteWithImm,
        2 => SendOpcode::Send,
        3 => SendOpcode::SendWithImm,
        4 => SendOpcode::RdmaRead,
        5 => SendOpcode::AtomicCmpAndSwp,
        6 => SendOpcode::AtomicFetchAndAdd,
        7 => SendOpcode::LocalInv,
        8 => SendOpcode::BindMw,
        9 => SendOpcode::SendWithInv,
        15 => SendOpcode::AtomicWrite,
        // TSO, FLUSH, driver opcodes.
        _ => return Err(libc::EINVAL),
    };
    // SAFETY: per the contract.
    let sg_list = unsafe { sges(w.sg_list, w.num_sge) }.ok_or(libc::EINVAL)?;
    let flags = SendFlags(w.send_flags);
    let mut wr = SendWr::new(w.wr_id, opcode, Vec::new());
    wr.flags = flags;
    match opcode {
        SendOpcode::SendWithImm | SendOpcode::RdmaWriteWithImm => {
            wr.imm_data = u32::from_be(w.imm_data)
        }
        SendOpcode::SendWithInv | SendOpcode::LocalInv => wr.invalidate_rkey = w.imm_data,
        SendOpcode::BindMw => {
            let b = w.bind_mw();
            if b.mw.is_null() {
                return Err(libc::EINVAL);
            }
            // SAFETY: b.mw is a window from ibv_alloc_mw (the C contract);
            // only this library's windows are on its contexts.
            if unsafe { (*b.mw).context } != ctx {
                return Err(libc::EINVAL);
            }
            // SAFETY: as above.
            let m = unsafe { obj::<RoxeMw, _>(b.mw) }.ok_or(libc::EINVAL)?;
            // SAFETY: bind_info.mr is NULL or from ibv_reg_mr.
            let mr = unsafe { bind_mr(b.bind_info.mr, ctx) }?;
            wr.bind = Some(MwBind {
                mw_rkey: m.mw.rkey(),
                new_rkey: b.rkey,
                mr_lkey: mr.as_deref().map_or(0, Mr::lkey),
                addr: b.bind_info.addr,
                length: b.bind_info.length,
                access: AccessFlags(b.bind_info.mw_access_flags),
            });
        }
        _ => {}
    }
    if qp_type == IBV_QPT_XRC_SEND {
        wr.xrc_remote_srqn = w.remote_srqn;
    }
    if qp_type == IBV_QPT_UD {
        // SAFETY: the union's ud member for a UD QP.
        let ud = unsafe { w.wr.ud };
        // SAFETY: ah is NULL or from ibv_create_ah.
        let Some(ah) = (unsafe { obj::<RoxeAh, _>(ud.ah) }) else {
            return Err(libc::EINVAL);
        };
        wr.ud = Some(ah.ah.dest(ud.remote_qpn, ud.remote_qkey));
    } else if opcode.is_atomic() {
        // SAFETY: the union's atomic member for an atomic opcode.
        let a = unsafe { w.wr.atomic };
        wr.remote_addr = a.remote_addr;
        wr.rkey = a.rkey;
        wr.compare_add = a.compare_add;
        wr.swap = a.swap;
    } else {
        // SAFETY: the union's rdma member (ignored by SENDs).
        let r = unsafe { w.wr.rdma };
        wr.remote_addr = r.remote_addr;
        wr.rkey = r.rkey;
    }
    if flags.contains(SendFlags::INLINE) && !opcode.is_read_or_atomic() {
        // The data is copied now: the program may reuse its buffer as
        // soon as ibv_post_send returns, and lkeys are not checked.
        let total: u64 = sg_list.iter().map(|s| u64::from(s.length)).sum();
        let mut data = Vec::with_capacity(total as usize);
        for s in &sg_list {
            if s.length > 0 {
                // SAFETY: an inline SGE names program memory readable for
                // its length (the ibv_post_send contract).
                data.extend_from_slice(unsafe {
                    std::slice::from_raw_parts(s.addr as usize as *const u8, s.length as usize)
                });
            }
        }
        wr.inline_data = Some(data);
    }
    wr.sg_list = sg_list;
    Ok(wr)
}

unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    mut wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: qp is ours (found through its context's ops).
        let Some(q) = (unsafe { qp_obj(qp) }) else {
            return libc::EINVAL;
        };
        let fail = |at: *mut ibv_send_wr, e: c_int| {
            if !bad_wr.is_null() {
                // SAFETY: bad_wr is the caller's out-pointer.
                unsafe { *bad_wr = at };
            }
            e
        };
        // SAFETY: wr is NULL or the caller's WR, per post_send's contract.
        if !wr.is_null() && unsafe { (*wr).next.is_null() } {
            // One WR, the common case: no list to build.
            // SAFETY: as above.
            let r = unsafe { send_wr_from_c(&*wr, q.c.qp_base.qp_type, q.c.qp_base.context) }
                .and_then(|sw| q.qp.post_send(sw).map_err(|e| e.errno()));
            return r.map_or_else(|e| fail(wr, e), |()| 0);
        }
        // A list: converted first, then posted under one lock so its
        // packets leave together. A WR that does not convert ends the list
        // (the ones before it are posted) and is the one reported.
        let head = wr;
        let mut wrs = Vec::new();
        let mut refused = None;
        while !wr.is_null() {
            // SAFETY: wr is a node of the caller's list.
            let w = unsafe { &*wr };
            // SAFETY: per post_send's contract.
            match unsafe { send_wr_from_c(w, q.c.qp_base.qp_type, q.c.qp_base.context) } {
                Ok(sw) => wrs.push(sw),
                Err(e) => {
                    refused = Some((wr, e));
                    break;
                }
            }
            wr = w.next;
        }
        let posted = q.qp.post_send_list(wrs).map_err(|(i, e)| (i, e.errno()));
        // SAFETY: head and the refused WR are nodes of the caller's list,
        // walked above; bad_wr is its out-pointer.
        unsafe { list_outcome(head, bad_wr, posted, refused) }
    })
}

/// A node of a caller's work-request list.
trait WrNode {
    fn next_node(&self) -> *mut Self;
}

impl WrNode for ibv_send_wr {
    fn next_node(&self) -> *mut Self {
        self.next
    }
}

impl WrNode for ibv_recv_wr {
    fn next_node(&self) -> *mut Self {
        self.next
    }
}

/// What posting a converted list returns: 0, or the errno with `bad_wr`
/// naming the WR refused: the `i`-th from `head` when the post stopped
/// there, else the one that did not convert (`refused`, which ended the
/// list).
///
/// # Safety
/// `head` must start the caller's list, at least `i + 1` nodes long for
/// a refused `i`; `bad_wr` is NULL or the caller's out-pointer.
unsafe fn list_outcome<T: WrNode>(
    head: *mut T,
    bad_wr: *mut *mut T,
    posted: Result<(), (usize, c_int)>,
    refused: Option<(*mut T, c_int)>,
) -> c_int {
    let fail = |at: *mut T, e: c_int| {
        if !bad_wr.is_null() {
            // SAFETY: bad_wr is the caller's out-pointer.
            unsafe { *bad_wr = at };
        }
        e
    };
    if let Err((i, e)) = posted {
        let mut at = head;
        for _ in 0..i {
            // SAFETY: a node of the caller's list (the contract).
            at = unsafe { (*at).next_node() };
        }
        return fail(at, e);
    }
    match refused {
        Some((at, e)) => fail(at, e),
        None => 0,
    }
}

unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: qp is ours.
        let Some(q) = (unsafe { qp_obj(qp) }) else {
            return libc::EINVAL;
        };
        // SAFETY: wr is NULL or the caller's WR, per post_recv's contract.
        if wr.is_null() || unsafe { (*wr).next.is_null() } {
            // SAFETY: wr is the caller's list (of one, or none).
            return unsafe {
                post_recv_each(wr, bad_wr, |r| q.qp.post_recv(r).map_err(|e| e.errno()))
            };
        }
        // A list: converted first, then posted under one lock. A WR whose
        // SGEs do not convert ends the list (the ones before it are
        // posted) and is the one reported.
        let (head, mut at) = (wr, wr);
        let mut wrs = Vec::new();
        let mut refused = None;
        while !at.is_null() {
            // SAFETY: at is a node of the caller's list.
            let w = unsafe { &*at };
            // SAFETY: per post_recv's contract.
            match unsafe { recv_wr_from_c(w) } {
                Some(r) => wrs.push(r),
                None => {
                    refused = Some((at, libc::EINVAL));
                    break;
                }
            }
            at = w.next;
        }
        let posted = q.qp.post_recv_list(wrs).map_err(|(i, e)| (i, e.errno()));
        // SAFETY: head and the refused WR are nodes of the caller's list,
        // walked above; bad_wr is its out-pointer.
        unsafe { list_outcome(head, bad_wr, posted, refused) }
    })
}

// -------------------------------------------------------------------- AH

#[repr(C)]
pub(crate) struct RoxeAh {
    c: ibv_ah,
    pub(crate) ah: roxe_verbs::Ah,
    pd: *const RoxePd,
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    crate::passthrough::pass_through!(
        object pd,
        "ibv_create_ah",
        fn(*mut ibv_pd, *mut ibv_ah_attr) -> *mut ibv_ah,
        (pd, attr),
        null_mut()
    );
    guard(null_mut(), || {
        // SAFETY: pd NULL or ours; attr the caller's.
        let (Some(p), Some(a)) = (unsafe { obj::<RoxePd, _>(pd) }, unsafe { attr.as_ref() }) else {
            return fail_null(libc::EINVAL);
        };
        match p.pd.create_ah(&av_from_c(a)) {
            Ok(ah) => {
                p.users.fetch_add(1, Ordering::AcqRel);
                leak(RoxeAh {
                    c: ibv_ah {
                        context: p.c.context,
                        pd,
                        handle: 0,
                    },
                    ah,
                    pd: p,
                })
                .cast()
            }
            Err(e) => fail_null(e.errno()),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_ah(ah: *mut ibv_ah) -> c_int {
    crate::passthrough::pass_through!(
        object ah,
        "ibv_destroy_ah",
        fn(*mut ibv_ah) -> c_int,
        (ah),
        libc::EOPNOTSUPP
    );
    guard(libc::EIO, || {
        if ah.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: created by leak(RoxeAh), destroyed once; its PD lives.
        unsafe {
            let a = Box::from_raw(ah.cast::<RoxeAh>());
            let pd = a.pd;
            drop(a);
            (*pd).users.fetch_sub(1, Ordering::AcqRel);
        }
        0
    })
}

/// The sender's GID from the GRH area of a UD receive: an IPv4 header in
/// bytes 20..40 (RoCEv2 over IPv4, recognised by its valid checksum), or
/// an IPv6 header.
fn sgid_of_grh(g: &[u8; 40]) -> Option<[u8; 16]> {
    let v4 = &g[20..40];
    if v4[0] == 0x45 && ipv4_checksum_ok(v4) {
        let mut gid = [0u8; 16];
        gid[10] = 0xff;
        gid[11] = 0xff;
        gid[12..].copy_from_slice(&v4[12..16]);
        return Some(gid);
    }
    if g[0] >> 4 == 6 {
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&g[8..24]);
        return Some(gid);
    }
    None
}

fn ipv4_checksum_ok(h: &[u8]) -> bool {
    let mut sum = 0u32;
    for c in h.chunks(2) {
        sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum == 0xffff
}

#[no_mangle]
pub unsafe extern "C" fn ibv_init_ah_from_wc(
    ctx: *mut ibv_context,
    port_num: u8,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    ah_attr: *mut ibv_ah_attr,
) -> c_int {
    crate::passthrough::pass_through!(
        crate::passthrough::is_system_context(ctx),
        "ibv_init_ah_from_wc",
        fn(*mut ibv_context, u8, *mut ibv_wc, *mut ibv_grh, *mut ibv_ah_attr) -> c_int,
        (ctx, port_num, wc, grh, ah_attr),
        libc::EOPNOTSUPP
    );
    guard(-1, || {
        // SAFETY: all three are the caller's (or NULL).
        let (Some(_), Some(wc), Some(out)) =
            (unsafe { context(ctx) }, unsafe { wc.as_ref() }, unsafe {
                ah_attr.as_mut()
            })
        else {
            set_errno(libc::EINVAL);
            return -1;
        };
        let mut a = ibv_ah_attr {
            dlid: wc.slid,
            sl: wc.sl,
            src_path_bits: wc.dlid_path_bits,
            port_num,
            ..ibv_ah_attr::default()
        };
        if wc.wc_flags & IBV_WC_GRH != 0 {
            if grh.is_null() {
                set_errno(libc::EINVAL);
                return -1;
            }
            // SAFETY: with IBV_WC_GRH the first 40 bytes of the receive
            // buffer, which grh points to, hold the GRH area.
            let g = unsafe { &*grh.cast::<[u8; 40]>() };
            let Some(sgid) = sgid_of_grh(g) else {
                set_errno(libc::EINVAL);
                return -1;
            };
            a.is_global = 1;
            a.grh.dgid = ibv_gid { raw: sgid };
            a.grh.sgid_index = 0;
            a.grh.hop_limit = 0xff;
        }
        *out = a;
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah_from_wc(
    pd: *mut ibv_pd,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    port_num: u8,
) -> *mut ibv_ah {
    crate::passthrough::pass_through!(
        object pd,
        "ibv_create_ah_from_wc",
        fn(*mut ibv_pd, *mut ibv_wc, *mut ibv_grh, u8) -> *mut ibv_ah,
        (pd, wc, grh, port_num),
        null_mut()
    );
    // SAFETY: pd NULL or ours.
    let Some(p) = (unsafe { obj::<RoxePd, _>(pd) }) else {
        return fail_null(libc::EINVAL);
    };
    // SAFETY: plain data.
    let mut a: ibv_ah_attr = unsafe { zeroed() };
    // SAFETY: forwarded contract.
    if unsafe { ibv_init_ah_from_wc(p.c.context, port_num, wc, grh, &mut a) } != 0 {
        return null_mut();
    }
    // SAFETY: forwarded contract.
    unsafe { ibv_create_ah(pd, &mut a) }
}
