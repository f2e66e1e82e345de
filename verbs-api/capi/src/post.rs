//! The data path's posting: `ibv_post_send`, `ibv_post_recv` and
//! `ibv_post_srq_recv`, the ops verbs.h's inline wrappers jump through,
//! and the conversion of the caller's work requests to roxe's. Send WRs
//! are converted per post (inline data copied at post time; `imm_data`
//! kept in wire byte order). A list of WRs is converted first, then posted
//! under one lock, so its packets leave together.

use crate::abi::*;
use crate::ah::RoxeAh;
use crate::guard;
use crate::object::container_of;
use crate::qp::as_roxe_qp;
use crate::srq::RoxeSrq;
use roxe_verbs::{RecvWr, SendFlags, SendOpcode, SendWr, Sge};
use std::ffi::c_int;

/// One C scatter/gather entry as roxe's.
pub(crate) fn sge_from_c(s: &ibv_sge) -> Sge {
    Sge {
        addr: s.addr,
        length: s.length,
        lkey: s.lkey,
    }
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
        v.push(sge_from_c(unsafe { &*sg.add(i) }));
    }
    Some(v)
}

/// One C send WR as roxe's, for a QP of type `qp_type` on context `ctx`.
///
/// # Safety
/// `w` is a node of the caller's WR list; its SGEs, inline data, AH and
/// window are valid as `ibv_post_send` requires.
pub(crate) unsafe fn send_wr_from_c(
    w: &ibv_send_wr,
    qp_type: u32,
    ctx: *mut ibv_context,
) -> Result<SendWr, c_int> {
    // `enum ibv_wr_opcode`.
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
            // SAFETY: the window and its MR are NULL or live (the C
            // contract).
            wr.bind = Some(unsafe { crate::mw::bind_of(b.mw, b.rkey, &b.bind_info, ctx) }?);
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
        let Some(ah) = (unsafe { container_of::<RoxeAh, _>(ud.ah) }) else {
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

/// A post failed at the caller's WR `at`: name it in `*bad_wr` (when the
/// caller gave a place) and return the errno.
///
/// # Safety
/// `bad_wr` is NULL or the caller's writable out-pointer.
unsafe fn fail_at<T>(bad_wr: *mut *mut T, at: *mut T, errno: c_int) -> c_int {
    if !bad_wr.is_null() {
        // SAFETY: per the contract.
        unsafe { *bad_wr = at };
    }
    errno
}

/// The caller's list from `head` converted for one post: the WRs up to the
/// first that does not convert and, if one does not, that WR with its
/// errno (it ends the list: the ones before it are posted).
///
/// # Safety
/// `head` is NULL or the head of the caller's list of valid nodes.
unsafe fn convert_list<T: WrNode, R>(
    head: *mut T,
    mut convert: impl FnMut(&T) -> Result<R, c_int>,
) -> (Vec<R>, Option<(*mut T, c_int)>) {
    let (mut at, mut converted) = (head, Vec::new());
    while !at.is_null() {
        // SAFETY: at is a node of the caller's list (the contract).
        let w = unsafe { &*at };
        match convert(w) {
            Ok(r) => converted.push(r),
            Err(e) => return (converted, Some((at, e))),
        }
        at = w.next_node();
    }
    (converted, None)
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
    if let Err((i, e)) = posted {
        let mut at = head;
        for _ in 0..i {
            // SAFETY: a node of the caller's list (the contract).
            at = unsafe { (*at).next_node() };
        }
        // SAFETY: bad_wr is NULL or the caller's (the contract).
        return unsafe { fail_at(bad_wr, at, e) };
    }
    match refused {
        // SAFETY: as above.
        Some((at, e)) => unsafe { fail_at(bad_wr, at, e) },
        None => 0,
    }
}

/// `ibv_post_send` (the op).
///
/// # Safety
/// `qp` is NULL or a live QP of this library (the inline wrapper found this
/// op through its context); `wr` is NULL or the head of the caller's list,
/// valid as [`send_wr_from_c`] requires; `bad_wr` NULL or writable.
pub(crate) unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: per the contract.
        let Some(q) = (unsafe { as_roxe_qp(qp) }) else {
            return libc::EINVAL;
        };
        // SAFETY: every WR of the list is valid (the contract).
        let convert = |w: &ibv_send_wr| unsafe { send_wr_from_c(w, q.qp_type(), q.context()) };
        // SAFETY: wr is NULL or the caller's WR (the contract).
        if !wr.is_null() && unsafe { (*wr).next.is_null() } {
            // One WR, the common case: no list to build.
            // SAFETY: as above.
            let r =
                convert(unsafe { &*wr }).and_then(|sw| q.qp.post_send(sw).map_err(|e| e.errno()));
            // SAFETY: bad_wr is NULL or writable (the contract).
            return r.map_or_else(|e| unsafe { fail_at(bad_wr, wr, e) }, |()| 0);
        }
        // SAFETY: wr is NULL or the head of the caller's list.
        let (wrs, refused) = unsafe { convert_list(wr, convert) };
        let posted = q.qp.post_send_list(wrs).map_err(|(i, e)| (i, e.errno()));
        // SAFETY: wr heads the list walked above, which holds the refused
        // WR; bad_wr is the caller's out-pointer.
        unsafe { list_outcome(wr, bad_wr, posted, refused) }
    })
}

/// `ibv_post_recv` (the op).
///
/// # Safety
/// `qp` is NULL or a live QP of this library; `wr` is NULL or the head of
/// the caller's list of valid `ibv_recv_wr`s (each with `num_sge` readable
/// SGEs); `bad_wr` NULL or writable.
pub(crate) unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: per the contract.
        let Some(q) = (unsafe { as_roxe_qp(qp) }) else {
            return libc::EINVAL;
        };
        // SAFETY: wr is NULL or the caller's WR (the contract).
        if wr.is_null() || unsafe { (*wr).next.is_null() } {
            // SAFETY: wr is the caller's list (of one, or none).
            return unsafe {
                post_recv_each(wr, bad_wr, |r| q.qp.post_recv(r).map_err(|e| e.errno()))
            };
        }
        // A WR whose SGEs do not convert is EINVAL.
        // SAFETY: per the contract, every WR's SGEs are readable.
        let convert = |w: &ibv_recv_wr| unsafe { recv_wr_from_c(w) }.ok_or(libc::EINVAL);
        // SAFETY: wr is the head of the caller's list.
        let (wrs, refused) = unsafe { convert_list(wr, convert) };
        let posted = q.qp.post_recv_list(wrs).map_err(|(i, e)| (i, e.errno()));
        // SAFETY: wr heads the list walked above, which holds the refused
        // WR; bad_wr is the caller's out-pointer.
        unsafe { list_outcome(wr, bad_wr, posted, refused) }
    })
}

/// `ibv_post_srq_recv` (the op).
///
/// # Safety
/// `srq` is NULL or a live SRQ of this library; `wr` and `bad_wr` as for
/// [`post_recv`].
pub(crate) unsafe extern "C" fn post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: per the contract.
        let Some(s) = (unsafe { container_of::<RoxeSrq, _>(srq) }) else {
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
        // SAFETY: per the contract, its SGEs are readable.
        let r = match unsafe { recv_wr_from_c(w) } {
            Some(r) => post(r),
            None => Err(libc::EINVAL),
        };
        if let Err(e) = r {
            // SAFETY: bad_wr is NULL or the caller's out-pointer.
            return unsafe { fail_at(bad_wr, wr, e) };
        }
        wr = w.next;
    }
    0
}
