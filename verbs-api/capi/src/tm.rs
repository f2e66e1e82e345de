//! Tag-matching SRQs through the C ABI: `ibv_create_srq_ex` with
//! `IBV_SRQT_TM`, `ibv_post_srq_ops` (the `verbs_context` op) and the
//! extended CQ's `read_tm_info` (in `cq.rs`). The matching itself is the
//! engine's (`roxe_provider::engine::tm`).

use crate::abi::*;
use crate::cq::RoxeCq;
use crate::object::container_of;
use crate::pd::RoxePd;
use crate::post::sges;
use crate::srq::RoxeSrq;
use crate::{fail_null, guard};
use roxe_verbs::{SrqOp, SrqOpKind};
use std::ffi::c_int;

/// `ibv_create_srq_ex` for `IBV_SRQT_TM`: PD, CQ and tag list required;
/// `max_num_tags` from 1 to `tm_caps.max_num_tags`, `max_ops` at most
/// `tm_caps.max_ops` (EINVAL otherwise).
///
/// # Safety
/// `a` is the caller's attributes; its PD and CQ NULL or this library's.
pub(crate) unsafe fn create_tm_srq(a: &ibv_srq_init_attr_ex) -> *mut ibv_srq {
    let need = IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_CQ | IBV_SRQ_INIT_ATTR_TM;
    if a.comp_mask & need != need {
        return fail_null(libc::EINVAL);
    }
    // SAFETY: per the contract.
    let (p, cq) = unsafe {
        (
            container_of::<RoxePd, _>(a.pd),
            container_of::<RoxeCq, _>(a.cq),
        )
    };
    let (Some(p), Some(cq)) = (p, cq) else {
        return fail_null(libc::EINVAL);
    };
    // SAFETY: a CQ's first member is its context, like every verbs object.
    if unsafe { *a.cq.cast::<*mut ibv_context>() } != p.context() {
        return fail_null(libc::EINVAL);
    }
    let [max_tags, max_ops] = a.tm_cap;
    let caps = p.pd.context().tm_caps();
    if max_ops > caps.max_ops {
        return fail_null(libc::EINVAL);
    }
    let srq = match p
        .pd
        .create_tm_srq(&cq.cq, a.attr.max_wr, a.attr.max_sge, max_tags)
    {
        Ok(s) => s,
        Err(e) => return fail_null(e.errno()),
    };
    // The SRQ counts as its CQ's user.
    RoxeSrq::hand_out(p, a.pd, a.srq_context, srq, a.attr, None, Some(cq))
}

/// `vctx->post_srq_ops`: each operation of the list in order; an ADD
/// writes its tag's handle into `tm.handle`. The first that fails stops
/// the list (`*bad_op`) with its errno: EINVAL for an unknown opcode, an
/// SRQ without tag matching or too many SGEs, ENOMEM for a full tag list.
///
/// # Safety
/// `srq` is NULL or this library's; `op` is NULL or the caller's list, each
/// node's SGEs readable; `bad_op` is NULL or the caller's out-pointer.
pub(crate) unsafe extern "C" fn post_srq_ops(
    srq: *mut ibv_srq,
    op: *mut ibv_ops_wr,
    bad_op: *mut *mut ibv_ops_wr,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: srq is NULL or this library's (the inline wrapper found
        // this op through its context).
        let Some(s) = (unsafe { container_of::<RoxeSrq, _>(srq) }) else {
            return libc::EINVAL;
        };
        let mut cur = op;
        // SAFETY: the list is the caller's, each `next` NULL or valid.
        while let Some(w) = unsafe { cur.as_mut() } {
            // SAFETY: the node's SGEs are readable (the contract).
            let rc = unsafe { post_one(s, w) };
            if rc != 0 {
                // SAFETY: bad_op is NULL or the caller's out-pointer.
                if let Some(b) = unsafe { bad_op.as_mut() } {
                    *b = cur;
                }
                return rc;
            }
            cur = w.next;
        }
        0
    })
}

/// One operation of a `post_srq_ops` list.
///
/// # Safety
/// An ADD's `add_sg_list` holds `add_num_sge` readable SGEs.
unsafe fn post_one(s: &RoxeSrq, w: &mut ibv_ops_wr) -> c_int {
    if w.flags & !(IBV_OPS_SIGNALED | IBV_OPS_TM_SYNC) != 0 {
        return libc::EINVAL;
    }
    let kind = match w.opcode {
        IBV_WR_TAG_ADD => {
            // SAFETY: sg_list holds num_sge SGEs (the contract).
            let Some(sg_list) = (unsafe { sges(w.add_sg_list, w.add_num_sge) }) else {
                return libc::EINVAL;
            };
            SrqOpKind::Add {
                recv_wr_id: w.add_recv_wr_id,
                sg_list,
                tag: w.add_tag,
                mask: w.add_mask,
            }
        }
        IBV_WR_TAG_DEL => SrqOpKind::Del {
            handle: w.tm_handle,
        },
        IBV_WR_TAG_SYNC => SrqOpKind::Sync,
        _ => return libc::EINVAL,
    };
    let add = matches!(kind, SrqOpKind::Add { .. });
    let op = SrqOp {
        wr_id: w.wr_id,
        kind,
        signaled: w.flags & IBV_OPS_SIGNALED != 0,
        sync: (w.flags & IBV_OPS_TM_SYNC != 0).then_some(w.tm_unexpected_cnt),
    };
    match s.srq.post_op(op) {
        Ok(handle) => {
            if add {
                w.tm_handle = handle;
            }
            0
        }
        Err(e) => e.errno(),
    }
}
