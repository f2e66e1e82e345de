//! Shared receive queues: `ibv_create_srq`, `ibv_create_srq_ex` (the
//! `verbs_context` op, which sends XRC and tag-matching SRQs to `xrc` and
//! `tm`), `ibv_modify_srq`, `ibv_query_srq` and `ibv_destroy_srq`.
//! Posting on one (`ibv_post_srq_recv`) is in `post`.

use crate::abi::*;
use crate::cq::RoxeCq;
use crate::object::{container_of, destroy, hand_out, Counted, Used, Users};
use crate::pd::RoxePd;
use crate::xrc::RoxeXrcd;
use crate::{fail_null, guard};
use roxe_verbs::Srq;
use std::ffi::{c_int, c_void};
use std::ptr::null_mut;

#[repr(C)]
pub(crate) struct RoxeSrq {
    c: ibv_srq,
    pub(crate) srq: Srq,
    attr: ibv_srq_attr,
    _pd: Used<RoxePd>,
    /// The QPs that receive through it.
    users: Users,
    /// An XRC SRQ's domain.
    _xrcd: Option<Used<RoxeXrcd>>,
    /// An XRC or tag-matching SRQ's CQ.
    _cq: Option<Used<RoxeCq>>,
}

impl Counted for RoxeSrq {
    fn users(&self) -> &Users {
        &self.users
    }
}

impl RoxeSrq {
    /// Hand `srq` (created on `p`, whose public pointer is `pd`) to C; it
    /// uses `p` and the XRC domain and CQ, if any, until destroyed.
    pub(crate) fn hand_out(
        p: &RoxePd,
        pd: *mut ibv_pd,
        srq_context: *mut c_void,
        srq: Srq,
        a: ibv_srq_attr,
        xrcd: Option<&RoxeXrcd>,
        cq: Option<&RoxeCq>,
    ) -> *mut ibv_srq {
        hand_out(RoxeSrq {
            c: ibv_srq {
                context: p.context(),
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
            _pd: Used::new(p),
            users: Users::default(),
            _xrcd: xrcd.map(Used::new),
            _cq: cq.map(Used::new),
        })
        .cast()
    }
}

/// # Safety
/// `pd` is NULL or a live PD (of this library or the system's); `init` is
/// NULL or the caller's.
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
        let (Some(p), Some(init)) = (unsafe { container_of::<RoxePd, _>(pd) }, unsafe {
            init.as_mut()
        }) else {
            return fail_null(libc::EINVAL);
        };
        let a = init.attr;
        match p.pd.create_srq(a.max_wr, a.max_sge) {
            Ok(srq) => RoxeSrq::hand_out(p, pd, init.srq_context, srq, a, None, None),
            Err(e) => fail_null(e.errno()),
        }
    })
}

/// `vctx->create_srq_ex`, which the inline `ibv_create_srq_ex` calls for
/// anything beyond a basic SRQ with a PD: basic, XRC and tag-matching SRQs;
/// a basic SRQ accepts a CQ and leaves it unused, as it only matters to the
/// other types.
///
/// # Safety
/// `attr` is NULL or the caller's; its PD, XRC domain and CQ are NULL or
/// this library's.
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

/// Resizing an SRQ and its limit event are not supported.
///
/// # Safety
/// `srq` is NULL or a live SRQ (of this library or the system's).
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

/// # Safety
/// `srq` is NULL or a live SRQ (of this library or the system's); `attr`
/// is NULL or writable.
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
    let Some(s) = (unsafe { container_of::<RoxeSrq, _>(srq) }) else {
        return libc::EINVAL;
    };
    if attr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: attr is the caller's.
    unsafe { attr.write(s.attr) };
    0
}

/// EBUSY while QPs receive through the SRQ.
///
/// # Safety
/// `srq` is NULL or a live SRQ (of this library or the system's), not used
/// again once destroyed.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int {
    crate::passthrough::pass_through!(
        object srq,
        "ibv_destroy_srq",
        fn(*mut ibv_srq) -> c_int,
        (srq),
        libc::EOPNOTSUPP
    );
    // SAFETY: per the contract.
    unsafe { destroy(srq, |s: &RoxeSrq| s.users.refuse_if_used()) }
}
