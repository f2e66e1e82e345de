//! The new post-send API (`ibv_wr_start`, `ibv_wr_send`, `ibv_wr_set_sge`,
//! ..., `ibv_wr_complete`): inline calls through the function pointers of
//! `struct ibv_qp_ex`. Between `wr_start` and `wr_complete` the WRs are
//! collected; each opcode call starts one (taking `qpx->wr_id` and
//! `qpx->wr_flags`), the setters complete the last one, and `wr_complete`
//! posts them in order. The calls returning `void` record their first
//! error, which `wr_complete` returns (as rdma-core's providers do).

use crate::abi::*;
use crate::ah::RoxeAh;
use crate::guard;
use crate::object::container_of;
use crate::post::sge_from_c;
use crate::qp::{as_roxe_qp, RoxeQp};
use roxe_verbs::{SendFlags, SendOpcode, SendWr, Sge};
use std::ffi::{c_int, c_void};

/// Point every `wr_*` slot roxe implements at its function.
pub(crate) fn fill_wr_ops(q: &mut ibv_qp_ex) {
    q.wr_atomic_cmp_swp = Some(wr_atomic_cmp_swp);
    q.wr_atomic_fetch_add = Some(wr_atomic_fetch_add);
    q.wr_rdma_read = Some(wr_rdma_read);
    q.wr_rdma_write = Some(wr_rdma_write);
    q.wr_rdma_write_imm = Some(wr_rdma_write_imm);
    q.wr_send = Some(wr_send);
    q.wr_send_imm = Some(wr_send_imm);
    q.wr_send_inv = Some(wr_send_inv);
    q.wr_bind_mw = Some(wr_bind_mw);
    q.wr_local_inv = Some(wr_local_inv);
    q.wr_set_ud_addr = Some(wr_set_ud_addr);
    q.wr_set_xrc_srqn = Some(wr_set_xrc_srqn);
    q.wr_set_inline_data = Some(wr_set_inline_data);
    q.wr_set_inline_data_list = Some(wr_set_inline_data_list);
    q.wr_set_sge = Some(wr_set_sge);
    q.wr_set_sge_list = Some(wr_set_sge_list);
    q.wr_start = Some(wr_start);
    q.wr_complete = Some(wr_complete);
    q.wr_abort = Some(wr_abort);
    q.wr_atomic_write = Some(wr_atomic_write);
}

/// The QP of an `ibv_qp_ex` (`None` for NULL).
///
/// # Safety
/// `qpx` is NULL or the `ibv_qp_ex` of a live QP of this library, which
/// stays live for `'a`: the contract of every function here, which verbs.h's
/// inline `ibv_wr_*` call through the QP's own `ibv_qp_ex`.
unsafe fn qp_of<'a>(qpx: *mut ibv_qp_ex) -> Option<&'a RoxeQp> {
    // SAFETY: per the contract (its qp_base is the RoxeQp's first member).
    unsafe { as_roxe_qp(qpx) }
}

/// Run `f` on the QP's batch; no QP (NULL) is ignored (the void `ibv_wr_*`
/// calls have no way to report it).
fn with_batch(q: Option<&RoxeQp>, f: impl FnOnce(&RoxeQp, &mut Vec<SendWr>, &mut c_int)) {
    guard((), || {
        let Some(q) = q else {
            return;
        };
        let mut b = q.batch.lock();
        let (wrs, err) = &mut *b;
        f(q, wrs, err);
    })
}

/// A new WR of `opcode` from `qpx->wr_id` / `qpx->wr_flags`.
fn new_wr(q: &RoxeQp, opcode: SendOpcode) -> SendWr {
    let mut wr = SendWr::new(q.c.wr_id, opcode, Vec::new());
    wr.flags = SendFlags(q.c.wr_flags);
    wr
}

/// Record a void call's error unless an earlier one is recorded.
fn record(err: &mut c_int, e: c_int) {
    if *err == 0 {
        *err = e;
    }
}

/// Start a WR of `opcode` (see [`new_wr`]), filled in by `fill`.
fn start(q: Option<&RoxeQp>, opcode: SendOpcode, fill: impl FnOnce(&mut SendWr)) {
    with_batch(q, |q, wrs, _| {
        let mut wr = new_wr(q, opcode);
        fill(&mut wr);
        wrs.push(wr);
    });
}

/// Change the WR the last opcode call started (EINVAL without one).
fn last(q: Option<&RoxeQp>, f: impl FnOnce(&mut SendWr) -> Result<(), c_int>) {
    with_batch(q, |_, wrs, err| {
        let r = match wrs.last_mut() {
            Some(w) => f(w),
            None => Err(libc::EINVAL),
        };
        if let Err(e) = r {
            record(err, e);
        }
    });
}

/// An empty batch with no error: what `wr_start` begins with and
/// `wr_abort` leaves.
fn discard_batch(q: Option<&RoxeQp>) {
    with_batch(q, |_, wrs, err| {
        wrs.clear();
        *err = 0;
    });
}

/// # Safety
/// As [`qp_of`].
unsafe extern "C" fn wr_start(qpx: *mut ibv_qp_ex) {
    // SAFETY: per the contract.
    discard_batch(unsafe { qp_of(qpx) });
}

/// # Safety
/// As [`qp_of`].
unsafe extern "C" fn wr_abort(qpx: *mut ibv_qp_ex) {
    // SAFETY: per the contract.
    discard_batch(unsafe { qp_of(qpx) });
}

/// Post the batch in order (one list under one lock: the packets leave
/// together), or return the first error a void call recorded; EINVAL for
/// a NULL QP.
///
/// # Safety
/// As [`qp_of`].
unsafe extern "C" fn wr_complete(qpx: *mut ibv_qp_ex) -> c_int {
    let mut rc = libc::EINVAL;
    // SAFETY: per the contract.
    with_batch(unsafe { qp_of(qpx) }, |q, wrs, err| {
        let batch = std::mem::take(wrs);
        rc = std::mem::take(err);
        if rc != 0 {
            return;
        }
        if let Err((_, e)) = q.qp.post_send_list(batch) {
            rc = e.errno();
        }
    });
    rc
}

/// # Safety
/// As [`qp_of`].
unsafe extern "C" fn wr_send(qpx: *mut ibv_qp_ex) {
    // SAFETY: per the contract.
    start(unsafe { qp_of(qpx) }, SendOpcode::Send, |_| {});
}

/// # Safety
/// As [`qp_of`].
unsafe extern "C" fn wr_send_imm(qpx: *mut ibv_qp_ex, imm_data: u32) {
    // imm_data is __be32: the wire value is its big-endian reading.
    // SAFETY: per the contract.
    start(unsafe { qp_of(qpx) }, SendOpcode::SendWithImm, |w| {
        w.imm_data = u32::from_be(imm_data)
    });
}

/// # Safety
/// As [`qp_of`].
unsafe extern "C" fn wr_send_inv(qpx: *mut ibv_qp_ex, invalidate_rkey: u32) {
    // SAFETY: per the contract.
    start(unsafe { qp_of(qpx) }, SendOpcode::SendWithInv, |w| {
        w.invalidate_rkey = invalidate_rkey
    });
}

/// # Safety
/// As [`qp_of`].
unsafe extern "C" fn wr_local_inv(qpx: *mut ibv_qp_ex, invalidate_rkey: u32) {
    // SAFETY: per the contract.
    start(unsafe { qp_of(qpx) }, SendOpcode::LocalInv, |w| {
        w.invalidate_rkey = invalidate_rkey
    });
}

/// `ibv_wr_bind_mw`: bind `mw` (a window of this QP's context) with key
/// `rkey` to `bind_info`; EINVAL (at `wr_complete`) for a foreign window
/// or MR, or no bind information.
///
/// # Safety
/// As [`qp_of`]; `mw` is NULL or a live window, `bind_info` NULL or the
/// caller's, its MR NULL or a live MR.
unsafe extern "C" fn wr_bind_mw(
    qpx: *mut ibv_qp_ex,
    mw: *mut ibv_mw,
    rkey: u32,
    bind_info: *const ibv_mw_bind_info,
) {
    // SAFETY: per the contract.
    with_batch(unsafe { qp_of(qpx) }, |q, wrs, err| {
        // SAFETY: bind_info is NULL or the caller's (the contract).
        let bind = match unsafe { bind_info.as_ref() } {
            // SAFETY: the window and MR are NULL or live (the contract).
            Some(info) => unsafe { crate::mw::bind_of(mw, rkey, info, q.context()) },
            None => Err(libc::EINVAL),
        };
        match bind {
            Ok(bind) => {
                let mut wr = new_wr(q, SendOpcode::BindMw);
                wr.bind = Some(bind);
                wrs.push(wr);
            }
            Err(e) => record(err, e),
        }
    });
}

/// # Safety
/// As [`qp_of`].
unsafe extern "C" fn wr_rdma_write(qpx: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    // SAFETY: per the contract.
    start(unsafe { qp_of(qpx) }, SendOpcode::RdmaWrite, |w| {
        w.rkey = rkey;
        w.remote_addr = remote_addr;
    });
}

/// # Safety
/// As [`qp_of`].
unsafe extern "C" fn wr_rdma_write_imm(
    qpx: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    imm_data: u32,
) {
    // SAFETY: per the contract.
    start(unsafe { qp_of(qpx) }, SendOpcode::RdmaWriteWithImm, |w| {
        w.rkey = rkey;
        w.remote_addr = remote_addr;
        w.imm_data = u32::from_be(imm_data);
    });
}

/// # Safety
/// As [`qp_of`].
unsafe extern "C" fn wr_rdma_read(qpx: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    // SAFETY: per the contract.
    start(unsafe { qp_of(qpx) }, SendOpcode::RdmaRead, |w| {
        w.rkey = rkey;
        w.remote_addr = remote_addr;
    });
}

/// # Safety
/// As [`qp_of`].
unsafe extern "C" fn wr_atomic_cmp_swp(
    qpx: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    compare: u64,
    swap: u64,
) {
    // SAFETY: per the contract.
    start(unsafe { qp_of(qpx) }, SendOpcode::AtomicCmpAndSwp, |w| {
        w.rkey = rkey;
        w.remote_addr = remote_addr;
        w.compare_add = compare;
        w.swap = swap;
    });
}

/// # Safety
/// As [`qp_of`].
unsafe extern "C" fn wr_atomic_fetch_add(
    qpx: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    add: u64,
) {
    // SAFETY: per the contract.
    start(unsafe { qp_of(qpx) }, SendOpcode::AtomicFetchAndAdd, |w| {
        w.rkey = rkey;
        w.remote_addr = remote_addr;
        w.compare_add = add;
    });
}

/// `ibv_wr_atomic_write`: the 8 bytes at `atomic_wr` stored at
/// `remote_addr` as one atomic write (copied now, as the call returns
/// before `wr_complete`).
///
/// # Safety
/// As [`qp_of`]; `atomic_wr` is NULL or points at 8 readable bytes.
unsafe extern "C" fn wr_atomic_write(
    qpx: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    atomic_wr: *const c_void,
) {
    // SAFETY: per the contract.
    let q = unsafe { qp_of(qpx) };
    if atomic_wr.is_null() {
        with_batch(q, |_, _, err| record(err, libc::EINVAL));
        return;
    }
    let mut value = [0u8; 8];
    // SAFETY: ibv_wr_atomic_write's contract: atomic_wr points to the 8
    // bytes to write (read unaligned: nothing promises alignment).
    unsafe { std::ptr::copy_nonoverlapping(atomic_wr.cast::<u8>(), value.as_mut_ptr(), 8) };
    start(q, SendOpcode::AtomicWrite, |w| {
        w.rkey = rkey;
        w.remote_addr = remote_addr;
        w.flags = SendFlags(w.flags.0 | SendFlags::INLINE.0);
        w.inline_data = Some(value.to_vec());
    });
}

/// # Safety
/// As [`qp_of`]; `ah` is NULL or a live AH.
unsafe extern "C" fn wr_set_ud_addr(
    qpx: *mut ibv_qp_ex,
    ah: *mut ibv_ah,
    remote_qpn: u32,
    remote_qkey: u32,
) {
    // SAFETY: per the contract.
    last(unsafe { qp_of(qpx) }, |w| {
        // SAFETY: ah is NULL or from ibv_create_ah (the contract).
        let a = unsafe { container_of::<RoxeAh, _>(ah) }.ok_or(libc::EINVAL)?;
        w.ud = Some(a.ah.dest(remote_qpn, remote_qkey));
        Ok(())
    });
}

/// # Safety
/// As [`qp_of`].
unsafe extern "C" fn wr_set_xrc_srqn(qpx: *mut ibv_qp_ex, remote_srqn: u32) {
    // SAFETY: per the contract.
    last(unsafe { qp_of(qpx) }, |w| {
        w.xrc_remote_srqn = remote_srqn;
        Ok(())
    });
}

/// # Safety
/// As [`qp_of`].
unsafe extern "C" fn wr_set_sge(qpx: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    // SAFETY: per the contract.
    last(unsafe { qp_of(qpx) }, |w| {
        w.sg_list = vec![Sge { addr, length, lkey }];
        w.inline_data = None;
        Ok(())
    });
}

/// # Safety
/// As [`qp_of`]; `sg_list` holds `num_sge` readable entries.
unsafe extern "C" fn wr_set_sge_list(qpx: *mut ibv_qp_ex, num_sge: usize, sg_list: *const ibv_sge) {
    // SAFETY: per the contract.
    last(unsafe { qp_of(qpx) }, |w| {
        // SAFETY: the caller's array holds num_sge entries (the contract).
        let list = unsafe { caller_slice(sg_list, num_sge) }?;
        w.sg_list = list.iter().map(sge_from_c).collect();
        w.inline_data = None;
        Ok(())
    });
}

/// The caller's array of `len` entries at `p` (EINVAL for NULL with
/// entries; an empty slice for none, whatever `p` is).
///
/// # Safety
/// `p` points at `len` readable entries when `len > 0`.
unsafe fn caller_slice<'a, T>(p: *const T, len: usize) -> Result<&'a [T], c_int> {
    if len == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: per the contract, p (not NULL) holds len entries.
    Ok(unsafe { std::slice::from_raw_parts(p, len) })
}

/// Copy inline data now: the buffers may be reused once the call returns.
///
/// # Safety
/// Each `(addr, len)` names `len` readable bytes.
unsafe fn set_inline(w: &mut SendWr, bufs: &[(*const c_void, usize)]) -> Result<(), c_int> {
    let mut data = Vec::new();
    for &(addr, len) in bufs {
        if len == 0 {
            continue;
        }
        if addr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: per the contract, `len` readable bytes at `addr` (not
        // NULL).
        data.extend_from_slice(unsafe { std::slice::from_raw_parts(addr.cast::<u8>(), len) });
    }
    w.sg_list = vec![Sge {
        addr: 0,
        length: data.len() as u32,
        lkey: 0,
    }];
    w.flags = w.flags | SendFlags::INLINE;
    w.inline_data = Some(data);
    Ok(())
}

/// # Safety
/// As [`qp_of`]; `addr` holds `length` readable bytes.
unsafe extern "C" fn wr_set_inline_data(qpx: *mut ibv_qp_ex, addr: *mut c_void, length: usize) {
    // SAFETY: per the contract.
    last(unsafe { qp_of(qpx) }, |w| {
        // SAFETY: addr holds length readable bytes (the contract).
        unsafe { set_inline(w, &[(addr.cast_const(), length)]) }
    });
}

/// # Safety
/// As [`qp_of`]; `buf_list` holds `num_buf` entries, each naming readable
/// bytes.
unsafe extern "C" fn wr_set_inline_data_list(
    qpx: *mut ibv_qp_ex,
    num_buf: usize,
    buf_list: *const ibv_data_buf,
) {
    // SAFETY: per the contract.
    last(unsafe { qp_of(qpx) }, |w| {
        // SAFETY: the caller's array holds num_buf entries (the contract).
        let list = unsafe { caller_slice(buf_list, num_buf) }?;
        let bufs: Vec<_> = list
            .iter()
            .map(|b| (b.addr.cast_const(), b.length))
            .collect();
        // SAFETY: each buffer holds its length (the contract).
        unsafe { set_inline(w, &bufs) }
    });
}
