//! XRC in the drop-in: XRC domains (`ibv_open_xrcd`; one opened through a
//! file is the same domain for every open of that file on the device, as
//! the kernel keys domains by inode), XRC SRQs (`ibv_create_srq_ex` with
//! `IBV_SRQT_XRC`, `ibv_get_srq_num`) and XRC_RECV QPs (`ibv_create_qp_ex`
//! with an XRCD). An XRC_RECV QP has no queues: `ibv_modify_qp`,
//! `ibv_query_qp` and `ibv_destroy_qp` come here for it (they tell it by
//! its public `qp_type`), and posting on it is EINVAL.

use crate::abi::*;
use crate::context::context;
use crate::cq::RoxeCq;
use crate::object::{container_of, destroy, hand_out, Counted, Used, Users};
use crate::pd::RoxePd;
use crate::srq::RoxeSrq;
use crate::{fail_null, guard};
use parking_lot::Mutex;
use roxe_verbs::{QpState, XrcRecvQp, Xrcd};
use std::collections::BTreeMap;
use std::ffi::c_int;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicUsize, Ordering};

#[repr(C)]
pub(crate) struct RoxeXrcd {
    c: ibv_xrcd,
    xrcd: Xrcd,
    /// SRQs and QPs in the domain: it cannot close while any is left.
    users: Users,
    /// Opens not yet closed (several through the same file).
    opens: AtomicUsize,
    /// The file it was opened through.
    file: Option<FileKey>,
}

impl Counted for RoxeXrcd {
    fn users(&self) -> &Users {
        &self.users
    }
}

/// (device name, st_dev, st_ino): the file a domain is shared through.
type FileKey = (String, u64, u64);

/// Domains opened through a file, by (device, st_dev, st_ino): the address
/// of their `RoxeXrcd`. Also serialises open against close.
static BY_FILE: Mutex<BTreeMap<FileKey, usize>> = Mutex::new(BTreeMap::new());

/// `vctx->open_xrcd`. `fd` -1 (or no `IBV_XRCD_INIT_ATTR_FD`): a private
/// domain. Otherwise the domain of that file: without one yet, `O_CREAT`
/// makes it (else EAGAIN); with one, `O_EXCL` is EINVAL (the kernel's
/// rules); a bad descriptor is EBADF.
///
/// # Safety
/// `ctx` is one of this library's contexts (the op is only in their
/// tables); `attr` NULL or the caller's.
pub(crate) unsafe extern "C" fn open_xrcd(
    ctx: *mut ibv_context,
    attr: *mut ibv_xrcd_init_attr,
) -> *mut ibv_xrcd {
    guard(null_mut(), || {
        // SAFETY: ctx is one of ours (this op is only in our contexts);
        // attr is the caller's.
        let (Some(c), Some(a)) = (unsafe { context(ctx) }, unsafe { attr.as_ref() }) else {
            return fail_null(libc::EINVAL);
        };
        let known = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
        if a.comp_mask & !known != 0 {
            return fail_null(libc::EOPNOTSUPP);
        }
        let fd = if a.comp_mask & IBV_XRCD_INIT_ATTR_FD != 0 {
            a.fd
        } else {
            -1
        };
        let oflags = if a.comp_mask & IBV_XRCD_INIT_ATTR_OFLAGS != 0 {
            a.oflags
        } else {
            0
        };
        let mut by_file = BY_FILE.lock();
        let key = if fd == -1 {
            None
        } else {
            // SAFETY: an all-zero stat is valid; fstat fills it.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: fstat on the caller's descriptor into our buffer.
            if unsafe { libc::fstat(fd, &mut st) } != 0 {
                return fail_null(libc::EBADF);
            }
            Some((c.ctx.name().to_string(), st.st_dev, st.st_ino))
        };
        if let Some(k) = &key {
            let existing = by_file.get(k).copied();
            match existing {
                Some(_) if oflags & libc::O_EXCL != 0 => return fail_null(libc::EINVAL),
                Some(p) => {
                    // SAFETY: registered domains are live until their last
                    // close, which takes this lock.
                    let x = unsafe { &*(p as *const RoxeXrcd) };
                    x.opens.fetch_add(1, Ordering::AcqRel);
                    return p as *mut ibv_xrcd;
                }
                None if oflags & libc::O_CREAT == 0 => return fail_null(libc::EAGAIN),
                None => {}
            }
        }
        let xrcd = match c.ctx.open_xrcd() {
            Ok(x) => x,
            Err(e) => return fail_null(e.errno()),
        };
        let raw = hand_out(RoxeXrcd {
            c: ibv_xrcd { context: ctx },
            xrcd,
            users: Users::default(),
            opens: AtomicUsize::new(1),
            file: key.clone(),
        });
        if let Some(k) = key {
            by_file.insert(k, raw as usize);
        }
        raw.cast()
    })
}

/// `vctx->close_xrcd`: the last close of a domain with SRQs or QPs left is
/// EBUSY.
///
/// # Safety
/// `xrcd` is NULL or from [`open_xrcd`], not closed for good.
pub(crate) unsafe extern "C" fn close_xrcd(xrcd: *mut ibv_xrcd) -> c_int {
    guard(libc::EIO, || {
        let mut by_file = BY_FILE.lock();
        // SAFETY: xrcd is NULL or from open_xrcd and not yet closed for
        // good (the lock keeps a concurrent close out).
        let Some(x) = (unsafe { container_of::<RoxeXrcd, _>(xrcd) }) else {
            return libc::EINVAL;
        };
        if x.opens.load(Ordering::Acquire) > 1 {
            x.opens.fetch_sub(1, Ordering::AcqRel);
            return 0;
        }
        // The last close frees the domain.
        // SAFETY: as above; not used again once closed for good.
        unsafe {
            destroy(xrcd, |x: &RoxeXrcd| {
                x.users.refuse_if_used()?;
                if let Some(k) = &x.file {
                    by_file.remove(k);
                }
                Ok(())
            })
        }
    })
}

/// `ibv_create_srq_ex` for `IBV_SRQT_XRC`: needs a PD, an XRCD and a CQ.
///
/// # Safety
/// `a` is the caller's attributes; its PD, XRCD and CQ NULL or ours.
pub(crate) unsafe fn create_xrc_srq(a: &ibv_srq_init_attr_ex) -> *mut ibv_srq {
    let need = IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ;
    if a.comp_mask & need != need {
        return fail_null(libc::EINVAL);
    }
    // SAFETY: per the contract.
    let (p, x, cq) = unsafe {
        (
            container_of::<RoxePd, _>(a.pd),
            container_of::<RoxeXrcd, _>(a.xrcd.cast::<ibv_xrcd>()),
            container_of::<RoxeCq, _>(a.cq),
        )
    };
    let (Some(p), Some(x), Some(cq)) = (p, x, cq) else {
        return fail_null(libc::EINVAL);
    };
    let srq = match p
        .pd
        .create_xrc_srq(&x.xrcd, &cq.cq, a.attr.max_wr, a.attr.max_sge)
    {
        Ok(s) => s,
        Err(e) => return fail_null(e.errno()),
    };
    RoxeSrq::hand_out(p, a.pd, a.srq_context, srq, a.attr, Some(x), Some(cq))
}

/// `vctx->get_srq_num`.
///
/// # Safety
/// `srq` is NULL or an SRQ of this library; `num` NULL or the caller's.
pub(crate) unsafe extern "C" fn get_srq_num(srq: *mut ibv_srq, num: *mut u32) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: srq NULL or ours; num is the caller's.
        let (Some(s), Some(out)) = (unsafe { container_of::<RoxeSrq, _>(srq) }, unsafe {
            num.as_mut()
        }) else {
            return libc::EINVAL;
        };
        match s.srq.number() {
            Ok(n) => {
                *out = n;
                0
            }
            Err(e) => e.errno(),
        }
    })
}

#[repr(C)]
pub(crate) struct RoxeXrcRecvQp {
    c: ibv_qp,
    qp: XrcRecvQp,
    _xrcd: Used<RoxeXrcd>,
}

/// An XRC_RECV QP has no queues.
const NO_CAP: ibv_qp_cap = ibv_qp_cap {
    max_send_wr: 0,
    max_recv_wr: 0,
    max_send_sge: 0,
    max_recv_sge: 0,
    max_inline_data: 0,
};

/// True for an XRC_RECV QP (of this library, or any: the field is public).
///
/// # Safety
/// `qp` must be NULL or a live `ibv_qp`.
pub(crate) unsafe fn is_recv_qp(qp: *const ibv_qp) -> bool {
    // SAFETY: per the contract.
    unsafe { qp.as_ref() }.is_some_and(|q| q.qp_type == IBV_QPT_XRC_RECV)
}

/// `ibv_create_qp_ex` for `IBV_QPT_XRC_RECV`: only the XRCD matters.
///
/// # Safety
/// `a` is the caller's attributes; its XRCD NULL or ours.
pub(crate) unsafe fn create_recv_qp(
    ctx: *mut ibv_context,
    a: &mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    if a.comp_mask & IBV_QP_INIT_ATTR_XRCD == 0 {
        return fail_null(libc::EINVAL);
    }
    // SAFETY: per the contract.
    let Some(x) = (unsafe { container_of::<RoxeXrcd, _>(a.xrcd.cast::<ibv_xrcd>()) }) else {
        return fail_null(libc::EINVAL);
    };
    let qp = match x.xrcd.create_recv_qp() {
        Ok(q) => q,
        Err(e) => return fail_null(e.errno()),
    };
    a.cap = NO_CAP;
    let qpn = qp.qp_num();
    hand_out(RoxeXrcRecvQp {
        c: ibv_qp {
            context: ctx,
            qp_context: a.qp_context,
            pd: null_mut(),
            send_cq: null_mut(),
            recv_cq: null_mut(),
            srq: null_mut(),
            handle: qpn,
            qp_num: qpn,
            state: QpState::Reset as u32,
            qp_type: IBV_QPT_XRC_RECV,
            mutex: libc::PTHREAD_MUTEX_INITIALIZER,
            cond: libc::PTHREAD_COND_INITIALIZER,
            events_completed: 0,
        },
        qp,
        _xrcd: Used::new(x),
    })
    .cast()
}

/// `ibv_modify_qp` on an XRC_RECV QP.
///
/// # Safety
/// `qp` is an XRC_RECV QP of this library; `attr` NULL or the caller's.
pub(crate) unsafe fn modify_recv_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, mask: c_int) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: per the contract.
        let Some(q) = (unsafe { container_of::<RoxeXrcRecvQp, _>(qp) }) else {
            return libc::EINVAL;
        };
        // SAFETY: as above.
        unsafe { crate::qp::modify_with(qp, attr, mask, |a, m| q.qp.modify(a, m)) }
    })
}

/// `ibv_query_qp` on an XRC_RECV QP.
///
/// # Safety
/// As [`modify_recv_qp`]; `attr` and `init` NULL or the caller's.
pub(crate) unsafe fn query_recv_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    init: *mut ibv_qp_init_attr,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: per the contract.
        let Some(q) = (unsafe { container_of::<RoxeXrcRecvQp, _>(qp) }) else {
            return libc::EINVAL;
        };
        let created = ibv_qp_init_attr {
            qp_context: q.c.qp_context,
            send_cq: null_mut(),
            recv_cq: null_mut(),
            srq: null_mut(),
            cap: NO_CAP,
            qp_type: IBV_QPT_XRC_RECV,
            sq_sig_all: 0,
        };
        // SAFETY: per the contract.
        unsafe { crate::qp::query_with(qp, attr, init, created, || q.qp.query()) }
    })
}

/// `ibv_destroy_qp` on an XRC_RECV QP.
///
/// # Safety
/// As [`modify_recv_qp`]; the QP is not used again.
pub(crate) unsafe fn destroy_recv_qp(qp: *mut ibv_qp) -> c_int {
    // SAFETY: per the contract; its domain outlives it (it counts).
    unsafe { destroy(qp, |_: &RoxeXrcRecvQp| Ok(())) }
}
