//! The new post-send API (`ibv_wr_start`, `ibv_wr_send`, `ibv_wr_set_sge`,
//! ..., `ibv_wr_complete`): inline calls through the function pointers of
//! `struct ibv_qp_ex`. Between `wr_start` and `wr_complete` the WRs are
//! collected; each opcode call starts one (taking `qpx->wr_id` and
//! `qpx->wr_flags`), the setters complete the last one, and `wr_complete`
//! posts them in order. The calls returning `void` record their first
//! error, which `wr_complete` returns (as rdma-core's providers do).

use crate::abi::*;
use crate::guard;
use crate::verbs::{bind_mr, obj, qp_obj, RoxeAh, RoxeMw, RoxeQp};
use roxe_verbs::{AccessFlags, Mr, MwBind, SendFlags, SendOpcode, SendWr, Sge};
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

/// Run `f` on the QP's batch; a NULL or foreign pointer is ignored (the
/// void `ibv_wr_*` calls have no way to report it).
fn with_batch(qpx: *mut ibv_qp_ex, f: impl FnOnce(&RoxeQp, &mut Vec<SendWr>, &mut c_int)) {
    guard((), || {
        // SAFETY: qpx is NULL or the ibv_qp_ex of one of our QPs (its
        // qp_base is the RoxeQp's first member).
        let Some(q) = (unsafe { qp_obj(qpx) }) else {
            return;
        };
        let mut b = q.batch.lock();
        let (wrs, err) = &mut *b;
        f(q, wrs, err);
    })
}

/// Start a WR of `opcode` from `qpx->wr_id` / `qpx->wr_flags`.
fn start(qpx: *mut ibv_qp_ex, opcode: SendOpcode, fill: impl FnOnce(&mut SendWr)) {
    with_batch(qpx, |q, wrs, _| {
        let mut wr = SendWr::new(q.c.wr_id, opcode, Vec::new());
        wr.flags = SendFlags(q.c.wr_flags);
        fill(&mut wr);
        wrs.push(wr);
    });
}

/// Change the WR the last opcode call started (EINVAL without one).
fn last(qpx: *mut ibv_qp_ex, f: impl FnOnce(&mut SendWr) -> Result<(), c_int>) {
    with_batch(qpx, |_, wrs, err| {
        let r = match wrs.last_mut() {
            Some(w) => f(w),
            None => Err(libc::EINVAL),
        };
        if let (Err(e), 0) = (r, *err) {
            *err = e;
        }
    });
}

unsafe extern "C" fn wr_start(qpx: *mut ibv_qp_ex) {
    with_batch(qpx, |_, wrs, err| {
        wrs.clear();
        *err = 0;
    });
}

unsafe extern "C" fn wr_abort(qpx: *mut ibv_qp_ex) {
    with_batch(qpx, |_, wrs, err| {
        wrs.clear();
        *err = 0;
    });
}

unsafe extern "C" fn wr_complete(qpx: *mut ibv_qp_ex) -> c_int {
    let mut rc = libc::EINVAL;
    with_batch(qpx, |q, wrs, err| {
        let batch = std::mem::take(wrs);
        rc = std::mem::take(err);
        if rc != 0 {
            return;
        }
        // One list under one lock: the packets leave together.
        if let Err((_, e)) = q.qp.post_send_list(batch) {
            rc = e.errno();
        }
    });
    rc
}

unsafe extern "C" fn wr_send(qpx: *mut ibv_qp_ex) {
    start(qpx, SendOpcode::Send, |_| {});
}

unsafe extern "C" fn wr_send_imm(qpx: *mut ibv_qp_ex, imm_data: u32) {
    // imm_data is __be32: the wire value is its big-endian reading.
    start(qpx, SendOpcode::SendWithImm, |w| {
        w.imm_data = u32::from_be(imm_data)
    });
}

unsafe extern "C" fn wr_send_inv(qpx: *mut ibv_qp_ex, invalidate_rkey: u32) {
    start(qpx, SendOpcode::SendWithInv, |w| {
        w.invalidate_rkey = invalidate_rkey
    });
}

unsafe extern "C" fn wr_local_inv(qpx: *mut ibv_qp_ex, invalidate_rkey: u32) {
    start(qpx, SendOpcode::LocalInv, |w| {
        w.invalidate_rkey = invalidate_rkey
    });
}

/// `ibv_wr_bind_mw`: bind `mw` (a window of this QP's context) with key
/// `rkey` to `bind_info`; EINVAL (at `wr_complete`) for a foreign window
/// or MR, or no bind information.
unsafe extern "C" fn wr_bind_mw(
    qpx: *mut ibv_qp_ex,
    mw: *mut ibv_mw,
    rkey: u32,
    bind_info: *const ibv_mw_bind_info,
) {
    with_batch(qpx, |q, wrs, err| {
        let ctx = q.c.qp_base.context;
        let bind = (|| {
            // SAFETY: bind_info is NULL or the caller's (the C contract).
            let info = unsafe { bind_info.as_ref() }?;
            // SAFETY: mw is NULL or a window from ibv_alloc_mw, whose first
            // member is its context.
            if mw.is_null() || unsafe { (*mw).context } != ctx {
                return None;
            }
            // SAFETY: a window on this library's context is a RoxeMw.
            let m = unsafe { obj::<RoxeMw, _>(mw) }?;
            // SAFETY: info.mr is NULL or from ibv_reg_mr.
            let mr = unsafe { bind_mr(info.mr, ctx) }.ok()?;
            Some(MwBind {
                mw_rkey: m.mw.rkey(),
                new_rkey: rkey,
                mr_lkey: mr.as_deref().map_or(0, Mr::lkey),
                addr: info.addr,
                length: info.length,
                access: AccessFlags(info.mw_access_flags),
            })
        })();
        let Some(bind) = bind else {
            if *err == 0 {
                *err = libc::EINVAL;
            }
            return;
        };
        let mut wr = SendWr::new(q.c.wr_id, SendOpcode::BindMw, Vec::new());
        wr.flags = SendFlags(q.c.wr_flags);
        wr.bind = Some(bind);
        wrs.push(wr);
    });
}

unsafe extern "C" fn wr_rdma_write(qpx: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    start(qpx, SendOpcode::RdmaWrite, |w| {
        w.rkey = rkey;
        w.remote_addr = remote_addr;
    });
}

unsafe extern "C" fn wr_rdma_write_imm(
    qpx: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    imm_data: u32,
) {
    start(qpx, SendOpcode::RdmaWriteWithImm, |w| {
        w.rkey = rkey;
        w.remote_addr = remote_addr;
        w.imm_data = u32::from_be(imm_data);
    });
}

unsafe extern "C" fn wr_rdma_read(qpx: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    start(qpx, SendOpcode::RdmaRead, |w| {
        w.rkey = rkey;
        w.remote_addr = remote_addr;
    });
}

unsafe extern "C" fn wr_atomic_cmp_swp(
    qpx: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    compare: u64,
    swap: u64,
) {
    start(qpx, SendOpcode::AtomicCmpAndSwp, |w| {
        w.rkey = rkey;
        w.remote_addr = remote_addr;
        w.compare_add = compare;
        w.swap = swap;
    });
}

unsafe extern "C" fn wr_atomic_fetch_add(
    qpx: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    add: u64,
) {
    start(qpx, SendOpcode::AtomicFetchAndAdd, |w| {
        w.rkey = rkey;
        w.remote_addr = remote_addr;
        w.compare_add = add;
    });
}

/// `ibv_wr_atomic_write`: the 8 bytes at `atomic_wr` stored at
/// `remote_addr` as one atomic write (copied now, as the call returns
/// before `wr_complete`).
unsafe extern "C" fn wr_atomic_write(
    qpx: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    atomic_wr: *const c_void,
) {
    if atomic_wr.is_null() {
        with_batch(qpx, |_, _, err| {
            if *err == 0 {
                *err = libc::EINVAL;
            }
        });
        return;
    }
    let mut value = [0u8; 8];
    // SAFETY: ibv_wr_atomic_write's contract: atomic_wr points to the 8
    // bytes to write (read unaligned: nothing promises alignment).
    unsafe { std::ptr::copy_nonoverlapping(atomic_wr.cast::<u8>(), value.as_mut_ptr(), 8) };
    start(qpx, SendOpcode::AtomicWrite, |w| {
        w.rkey = rkey;
        w.remote_addr = remote_addr;
        w.flags = SendFlags(w.flags.0 | SendFlags::INLINE.0);
        w.inline_data = Some(value.to_vec());
    });
}

unsafe extern "C" fn wr_set_ud_addr(
    qpx: *mut ibv_qp_ex,
    ah: *mut ibv_ah,
    remote_qpn: u32,
    remote_qkey: u32,
) {
    last(qpx, |w| {
        // SAFETY: ah is NULL or from ibv_create_ah.
        let a = unsafe { obj::<RoxeAh, _>(ah) }.ok_or(libc::EINVAL)?;
        w.ud = Some(a.ah.dest(remote_qpn, remote_qkey));
        Ok(())
    });
}

unsafe extern "C" fn wr_set_xrc_srqn(qpx: *mut ibv_qp_ex, remote_srqn: u32) {
    last(qpx, |w| {
        w.xrc_remote_srqn = remote_srqn;
        Ok(())
    });
}

unsafe extern "C" fn wr_set_sge(qpx: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    last(qpx, |w| {
        w.sg_list = vec![Sge { addr, length, lkey }];
        w.inline_data = None;
        Ok(())
    });
}

unsafe extern "C" fn wr_set_sge_list(qpx: *mut ibv_qp_ex, num_sge: usize, sg_list: *const ibv_sge) {
    last(qpx, |w| {
        if num_sge > 0 && sg_list.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller's array holds num_sge entries.
        let list = unsafe { std::slice::from_raw_parts(sg_list, num_sge) };
        w.sg_list = list
            .iter()
            .map(|s| Sge {
                addr: s.addr,
                length: s.length,
                lkey: s.lkey,
            })
            .collect();
        w.inline_data = None;
        Ok(())
    });
}

/// Copy inline data now: the buffers may be reused once the call returns.
fn set_inline(w: &mut SendWr, bufs: &[(*const c_void, usize)]) -> Result<(), c_int> {
    let mut data = Vec::new();
    for &(addr, len) in bufs {
        if len == 0 {
            continue;
        }
        if addr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller passes `len` readable bytes at `addr`.
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

unsafe extern "C" fn wr_set_inline_data(qpx: *mut ibv_qp_ex, addr: *mut c_void, length: usize) {
    last(qpx, |w| set_inline(w, &[(addr.cast_const(), length)]));
}

unsafe extern "C" fn wr_set_inline_data_list(
    qpx: *mut ibv_qp_ex,
    num_buf: usize,
    buf_list: *const ibv_data_buf,
) {
    last(qpx, |w| {
        if num_buf > 0 && buf_list.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller's array holds num_buf entries.
        let list = unsafe { std::slice::from_raw_parts(buf_list, num_buf) };
        let bufs: Vec<_> = list
            .iter()
            .map(|b| (b.addr.cast_const(), b.length))
            .collect();
        set_inline(w, &bufs)
    });
}
