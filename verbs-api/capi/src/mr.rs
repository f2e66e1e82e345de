//! Memory regions: `ibv_reg_mr` and its `_iova` forms, `ibv_rereg_mr`,
//! `ibv_dereg_mr` and `ibv_advise_mr` (the `verbs_context` op).

use crate::abi::*;
use crate::context::context;
use crate::object::{container_of, destroy, hand_out, Used};
use crate::pd::RoxePd;
use crate::post::sges;
use crate::{fail_null, guard, set_errno};
use parking_lot::Mutex;
use roxe_verbs::{AccessFlags, Mr};
use std::ffi::{c_int, c_void};
use std::ptr::null_mut;
use std::sync::Arc;

/// A registration, shared by the MR structs that name it (`ibv_import_mr`):
/// `None` once deregistered through any of them.
pub(crate) type MrSlot = Mutex<Option<Mr>>;

#[repr(C)]
pub(crate) struct RoxeMr {
    c: ibv_mr,
    /// The PD it was made through (released before the slot is dropped).
    pd: Used<RoxePd>,
    pub(crate) mr: Arc<MrSlot>,
}

impl RoxeMr {
    /// The struct `c` for the registration in `mr`, made through `pd`
    /// (whose users it counts until it is freed).
    pub(crate) fn new(c: ibv_mr, mr: Arc<MrSlot>, pd: &RoxePd) -> Self {
        RoxeMr {
            c,
            pd: Used::new(pd),
            mr,
        }
    }

    /// A new registration through `pd` (PD pointer `pd_ptr`), named by a
    /// new handle of the context's command file.
    pub(crate) fn register(
        mr: Mr,
        pd: &RoxePd,
        pd_ptr: *mut ibv_pd,
        addr: *mut c_void,
        length: usize,
    ) -> Self {
        let (lkey, rkey) = (mr.lkey(), mr.rkey());
        let slot = Arc::new(Mutex::new(Some(mr)));
        // SAFETY: a PD's context outlives it (the C contract: contexts are
        // closed after their objects).
        let handle = unsafe { context(pd.context()) }.map_or(0, |c| c.handles.add_mr(&slot));
        let c = ibv_mr {
            context: pd.context(),
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

/// # Safety
/// `pd` is NULL or a live PD (of this library or the system's); the
/// `length` bytes at `addr` stay allocated until the MR is deregistered.
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

/// # Safety
/// As [`ibv_reg_mr`].
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

/// An on-demand region (`IBV_ACCESS_ON_DEMAND`) may be implicit: NULL and
/// `SIZE_MAX`, the whole address space.
///
/// # Safety
/// As [`ibv_reg_mr`] (for an on-demand region the memory is reached only
/// while mapped).
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
        let Some(p) = (unsafe { container_of::<RoxePd, _>(pd) }) else {
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
            Ok(mr) => hand_out(RoxeMr::register(mr, p, pd, addr, length)).cast(),
            Err(e) => fail_null(e.errno()),
        }
    })
}

/// `ibv_rereg_mr`: another PD (`IBV_REREG_MR_CHANGE_PD`), access
/// (`_CHANGE_ACCESS`) and/or memory (`_CHANGE_TRANSLATION`), keeping the
/// keys, as rxe does. 0, or `IBV_REREG_MR_ERR_INPUT` (-1) for bad input and
/// `IBV_REREG_MR_ERR_CMD` (-4) for a refusal, with errno set.
///
/// # Safety
/// `mr` is NULL or a live MR (of this library or the system's) that
/// nothing else uses during the call (libibverbs' contract); `pd` is NULL
/// or a live PD; with `_CHANGE_TRANSLATION`, as [`ibv_reg_mr`] for the new
/// range.
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
            match unsafe { container_of::<RoxePd, _>(pd) } {
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
            // The new PD counts the MR before the old one lets it go.
            m.pd = Used::new(p);
            m.c.pd = pd;
        }
        m.c.lkey = region.lkey();
        m.c.rkey = region.rkey();
        0
    })
}

/// EBUSY while memory windows are bound into the region, as the kernel.
/// The registration ends for every struct naming it (imports included):
/// no remote access reaches the memory after this returns.
///
/// # Safety
/// `mr` is NULL or a live MR (of this library or the system's), not used
/// again once deregistered.
#[no_mangle]
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    crate::passthrough::pass_through!(
        object mr,
        "ibv_dereg_mr",
        fn(*mut ibv_mr) -> c_int,
        (mr),
        libc::EOPNOTSUPP
    );
    // SAFETY: mr is NULL or a live MR of this library (the C contract).
    unsafe {
        destroy(mr, |m: &RoxeMr| {
            if m.mr.lock().as_ref().is_some_and(|r| r.bound_windows() > 0) {
                return Err(libc::EBUSY);
            }
            crate::import::forget_handle(m.c.context, m.c.handle);
            // Dropping the Mr (out of the slot's lock) deregisters it under
            // the engine lock.
            let region = m.mr.lock().take();
            drop(region);
            Ok(())
        })
    }
}

/// `ibv_advise_mr` (the `verbs_context` op): EINVAL for an unknown advice
/// or flag, an empty SGE list, or an SGE that is not inside an on-demand
/// region of the PD; a valid prefetch has nothing to do (every page is
/// resolved when it is accessed).
///
/// # Safety
/// `pd` is NULL or a PD of this library; `sg_list` holds `num_sge`
/// readable SGEs.
pub(crate) unsafe extern "C" fn advise_mr(
    pd: *mut ibv_pd,
    advice: u32,
    flags: u32,
    sg_list: *mut ibv_sge,
    num_sge: u32,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: pd is NULL or from ibv_alloc_pd (the C contract).
        let Some(p) = (unsafe { container_of::<RoxePd, _>(pd) }) else {
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
