//! Protection domains: `ibv_alloc_pd`, `ibv_dealloc_pd` and parent
//! domains (`ibv_alloc_parent_domain`).

use crate::abi::*;
use crate::context::context;
use crate::object::{container_of, destroy, hand_out, Counted, Used, Users};
use crate::{fail_null, guard};
use roxe_verbs::Pd;
use std::ffi::c_int;
use std::ptr::null_mut;

#[repr(C)]
pub(crate) struct RoxePd {
    c: ibv_pd,
    pub(crate) pd: Pd,
    pub(crate) users: Users,
    /// A parent domain (`ibv_alloc_parent_domain`): the PD it stands for,
    /// whose objects it creates (roxe has no device buffers for the
    /// allocators to place, so they are not called, as a provider may).
    parent_of: Option<Used<RoxePd>>,
}

impl Counted for RoxePd {
    fn users(&self) -> &Users {
        &self.users
    }
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
            users: Users::default(),
            parent_of: None,
        }
    }

    pub(crate) fn context(&self) -> *mut ibv_context {
        self.c.context
    }

    /// Whether this is a parent domain (`ibv_alloc_parent_domain`).
    pub(crate) fn is_parent_domain(&self) -> bool {
        self.parent_of.is_some()
    }
}

/// `ibv_alloc_parent_domain` (the `verbs_context` op): a PD object that
/// stands for `attr->pd` (same protection domain: QPs, CQs and MRs made
/// with either are interchangeable); thread domains are refused.
///
/// # Safety
/// `ctx` is one of this library's contexts (the op is only in their
/// tables); `attr` is NULL or the caller's, its `pd` NULL or a PD of this
/// library.
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
        let Some(p) = (unsafe { container_of::<RoxePd, _>(a.pd) }) else {
            return fail_null(libc::EINVAL);
        };
        if p.c.context != ctx || p.is_parent_domain() {
            return fail_null(libc::EINVAL);
        }
        hand_out(RoxePd {
            c: ibv_pd {
                context: ctx,
                handle: 0,
            },
            pd: p.pd.clone(),
            users: Users::default(),
            parent_of: Some(Used::new(p)),
        })
        .cast()
    })
}

/// # Safety
/// `ctx` is NULL or an open context (of this library or the system's).
#[no_mangle]
pub unsafe extern "C" fn ibv_alloc_pd(ctx: *mut ibv_context) -> *mut ibv_pd {
    crate::passthrough::pass_through!(
        context ctx,
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
                hand_out(RoxePd::new(ctx, handle, pd)).cast()
            }
            Err(e) => fail_null(e.errno()),
        }
    })
}

/// EBUSY while objects made on the PD (or a parent domain standing for
/// it) live.
///
/// # Safety
/// `pd` is NULL or a live PD (of this library or the system's), not used
/// again once deallocated.
#[no_mangle]
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    crate::passthrough::pass_through!(
        object pd,
        "ibv_dealloc_pd",
        fn(*mut ibv_pd) -> c_int,
        (pd),
        libc::EOPNOTSUPP
    );
    // SAFETY: pd is NULL or a live PD of this library (the C contract).
    unsafe {
        destroy(pd, |p: &RoxePd| {
            p.users.refuse_if_used()?;
            // A parent domain's own handle is 0; freeing it releases the
            // PD it stands for.
            crate::import::forget_handle(p.c.context, p.c.handle);
            Ok(())
        })
    }
}
