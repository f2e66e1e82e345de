//! Device, port, GID and P_Key queries: `ibv_query_device` and the
//! extended `query_device_ex` and `query_rt_values` ops, `ibv_query_port`
//! (and its op), `ibv_query_gid`, `_ibv_query_gid_ex`,
//! `_ibv_query_gid_table`, `ibv_query_gid_type`, `ibv_query_pkey` and
//! `ibv_get_pkey_index`. The GID table has 16 entries
//! (`roxe_verbs::SOFT_GID_TABLE_LEN`): index 0 the device's RoCEv2 GID, the
//! rest empty.

use crate::abi::*;
use crate::context::{context, RoxeContext};
use crate::device::copy_cstr;
use crate::{fail_minus_one, guard, set_errno};
use std::ffi::{c_int, c_void};
use std::mem::{size_of, zeroed};
use std::ptr;

/// The device's `ibv_device_attr`.
fn device_attr(c: &RoxeContext) -> ibv_device_attr {
    let a = c.ctx.query_device();
    // SAFETY: plain data, all-zero valid.
    let mut d: ibv_device_attr = unsafe { zeroed() };
    copy_cstr(&mut d.fw_ver, env!("CARGO_PKG_VERSION"));
    d.node_guid = a.node_guid.to_be();
    d.sys_image_guid = a.node_guid.to_be();
    d.max_mr_size = a.max_mr_size;
    d.page_size_cap = a.page_size_cap;
    // rxe's vendor id, and part id 0: perftest then treats the device as
    // generic (plain ibv_post_send, no mlx5dv/efadv calls).
    d.vendor_id = a.vendor_id;
    d.vendor_part_id = 0;
    d.hw_ver = 0;
    let clamp = |v: u32| v.min(i32::MAX as u32) as c_int;
    d.max_qp = clamp(a.max_qp);
    d.max_qp_wr = clamp(a.max_qp_wr);
    d.max_sge = clamp(a.max_sge);
    d.max_sge_rd = clamp(a.max_sge);
    d.max_cq = clamp(a.max_cq);
    d.max_cqe = clamp(a.max_cqe);
    d.max_mr = clamp(a.max_mr);
    // Memory windows (type 1 and 2B, as rxe): they share the key space
    // with memory regions.
    d.max_mw = clamp(a.max_mr);
    d.device_cap_flags |= IBV_DEVICE_MEM_WINDOW | IBV_DEVICE_MEM_WINDOW_TYPE_2B;
    if c.ctx.backend() == roxe_verbs::Backend::Soft {
        d.device_cap_flags |= IBV_DEVICE_XRC;
    }
    d.max_pd = clamp(a.max_pd);
    d.max_qp_rd_atom = clamp(a.max_qp_rd_atom);
    d.max_res_rd_atom = clamp(a.max_qp_rd_atom.saturating_mul(a.max_qp.min(1024)));
    d.max_qp_init_rd_atom = clamp(a.max_qp_init_rd_atom);
    d.atomic_cap = IBV_ATOMIC_HCA;
    d.max_ah = clamp(a.max_qp);
    d.max_srq = clamp(a.max_srq);
    d.max_srq_wr = clamp(a.max_srq_wr);
    d.max_srq_sge = clamp(a.max_srq_sge);
    d.max_pkeys = a.max_pkeys;
    d.local_ca_ack_delay = 15;
    d.phys_port_cnt = a.phys_port_cnt;
    d
}

/// # Safety
/// `ctx` is NULL or an open context (of this library or the system's);
/// `attr` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_device(
    ctx: *mut ibv_context,
    attr: *mut ibv_device_attr,
) -> c_int {
    crate::passthrough::pass_through!(
        context ctx,
        "ibv_query_device",
        fn(*mut ibv_context, *mut ibv_device_attr) -> c_int,
        (ctx, attr),
        libc::EOPNOTSUPP
    );
    guard(libc::EIO, || {
        // SAFETY: ctx is NULL or an open context (C contract).
        let Some(c) = (unsafe { context(ctx) }) else {
            return libc::EINVAL;
        };
        if attr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: attr points to a caller's ibv_device_attr.
        unsafe { attr.write(device_attr(c)) };
        0
    })
}

/// `vctx->query_device_ex`: the `ibv_device_attr_ex` of `attr_size`
/// bytes (the caller's header's size), with on-demand paging, clock,
/// device memory and tag-matching capabilities for a soft device.
///
/// # Safety
/// `ctx` is NULL or one of this library's contexts; `attr` is NULL or
/// holds `attr_size` writable bytes.
pub(crate) unsafe extern "C" fn query_device_ex(
    ctx: *mut ibv_context,
    _input: *const c_void,
    attr: *mut ibv_device_attr_ex,
    attr_size: usize,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: ctx is an open context (the inline wrapper passes its own).
        let Some(c) = (unsafe { context(ctx) }) else {
            return libc::EINVAL;
        };
        if attr.is_null() || attr_size < size_of::<ibv_device_attr>() {
            return libc::EINVAL;
        }
        // SAFETY: plain data, all-zero valid.
        let mut ex: ibv_device_attr_ex = unsafe { zeroed() };
        ex.orig_attr = device_attr(c);
        ex.phys_port_cnt_ex = u32::from(ex.orig_attr.phys_port_cnt);
        if c.ctx.backend() == roxe_verbs::Backend::Soft {
            // On-demand paging: every region of a soft device is reached
            // without pinning, so every operation of RC, UC, UD and XRC
            // works on ODP regions, and an implicit region may cover the
            // whole address space.
            let general = u64::from(IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT);
            put_u64(&mut ex, EX_ODP_GENERAL_CAPS, general);
            let rc = IBV_ODP_SUPPORT_SEND
                | IBV_ODP_SUPPORT_RECV
                | IBV_ODP_SUPPORT_WRITE
                | IBV_ODP_SUPPORT_READ
                | IBV_ODP_SUPPORT_ATOMIC
                | IBV_ODP_SUPPORT_SRQ_RECV;
            put_u32(&mut ex, EX_RC_ODP_CAPS, rc);
            put_u32(
                &mut ex,
                EX_UC_ODP_CAPS,
                IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE,
            );
            put_u32(
                &mut ex,
                EX_UD_ODP_CAPS,
                IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV,
            );
            put_u32(&mut ex, EX_XRC_ODP_CAPS, rc & !IBV_ODP_SUPPORT_RECV);
            // The device clock counts nanoseconds, 64 bits wide.
            put_u64(&mut ex, EX_COMPLETION_TIMESTAMP_MASK, u64::MAX);
            put_u64(&mut ex, EX_HCA_CORE_CLOCK_KHZ, 1_000_000);
            put_u64(
                &mut ex,
                EX_MAX_DM_SIZE,
                roxe_provider::memory::MAX_DM_SIZE as u64,
            );
            let tm = c.ctx.tm_caps();
            let caps = [
                tm.max_rndv_hdr_size,
                tm.max_num_tags,
                if tm.rc { IBV_TM_CAP_RC } else { 0 },
                tm.max_ops,
                tm.max_sge,
            ];
            for (i, v) in caps.into_iter().enumerate() {
                put_u32(&mut ex, EX_TM_CAPS + 4 * i, v);
            }
        }
        // SAFETY: the caller's buffer holds attr_size bytes (a newer,
        // larger struct keeps zeros past what we know).
        unsafe { copy_out(&ex, attr.cast(), attr_size) };
        0
    })
}

// Byte offsets in `struct ibv_device_attr_ex` (rdma-core 44, x86_64 and
// aarch64) of the members roxe fills beyond `orig_attr`; they lie in the
// `_ext` words of the mirror (`abi_probe.rs` checks them against verbs.h).
pub(crate) const EX_ODP_GENERAL_CAPS: usize = 240;
pub(crate) const EX_RC_ODP_CAPS: usize = 248;
pub(crate) const EX_UC_ODP_CAPS: usize = 252;
pub(crate) const EX_UD_ODP_CAPS: usize = 256;
pub(crate) const EX_COMPLETION_TIMESTAMP_MASK: usize = 264;
pub(crate) const EX_HCA_CORE_CLOCK_KHZ: usize = 272;
pub(crate) const EX_MAX_DM_SIZE: usize = 376;
pub(crate) const EX_XRC_ODP_CAPS: usize = 392;
/// `struct ibv_tm_caps`: max_rndv_hdr_size, max_num_tags, flags, max_ops,
/// max_sge (five u32s).
pub(crate) const EX_TM_CAPS: usize = 348;

/// The `_ext` word at byte offset `c_offset` of the C struct.
fn ext_word(c_offset: usize) -> usize {
    (c_offset - std::mem::offset_of!(ibv_device_attr_ex, _ext)) / 4
}

fn put_u32(ex: &mut ibv_device_attr_ex, c_offset: usize, v: u32) {
    ex._ext[ext_word(c_offset)] = v;
}

/// A u64 member, as two native-endian words (x86_64 and aarch64 are
/// little-endian).
fn put_u64(ex: &mut ibv_device_attr_ex, c_offset: usize, v: u64) {
    let i = ext_word(c_offset);
    ex._ext[i] = v as u32;
    ex._ext[i + 1] = (v >> 32) as u32;
}

/// `vctx->query_rt_values` (`ibv_query_rt_values_ex`): the device clock
/// now, in its ticks (nanoseconds since the Unix epoch, the clock of
/// `ibv_wc_read_completion_ts`), in `raw_clock.tv_nsec` as mlx5 reports
/// cycles.
///
/// # Safety
/// `ctx` is one of this library's contexts; `values` NULL or the caller's.
pub(crate) unsafe extern "C" fn query_rt_values(
    ctx: *mut ibv_context,
    values: *mut ibv_values_ex,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: ctx is one of ours (the op is only in our contexts);
        // values is the caller's.
        let (Some(c), Some(v)) = (unsafe { context(ctx) }, unsafe { values.as_mut() }) else {
            return libc::EINVAL;
        };
        if v.comp_mask & !IBV_VALUES_MASK_RAW_CLOCK != 0 {
            return libc::EINVAL;
        }
        let Some(d) = c.ctx.soft_device() else {
            return libc::EOPNOTSUPP;
        };
        if v.comp_mask & IBV_VALUES_MASK_RAW_CLOCK != 0 {
            let ticks = d.wallclock_ns(d.now());
            v.raw_clock.tv_sec = 0;
            v.raw_clock.tv_nsec = ticks as libc::c_long;
        }
        0
    })
}

/// Port `port`'s `ibv_port_attr`.
fn port_attr(c: &RoxeContext, port: u8) -> Result<ibv_port_attr, c_int> {
    let p = c.ctx.query_port(port).map_err(|e| e.errno())?;
    Ok(ibv_port_attr {
        state: u32::from(p.state),
        max_mtu: p.max_mtu as u32,
        active_mtu: p.active_mtu as u32,
        gid_tbl_len: p.gid_tbl_len as c_int,
        // IBV_PORT_CM_SUP, as rxe: connection management over the GID.
        port_cap_flags: 1 << 16,
        max_msg_sz: p.max_msg_sz,
        bad_pkey_cntr: 0,
        qkey_viol_cntr: 0,
        pkey_tbl_len: p.pkey_tbl_len,
        lid: p.lid,
        sm_lid: 0,
        lmc: 0,
        max_vl_num: 1,
        sm_sl: 0,
        subnet_timeout: 0,
        init_type_reply: 0,
        active_width: 1,
        active_speed: 1,
        // LinkUp.
        phys_state: 5,
        link_layer: p.link_layer,
        flags: 0,
        port_cap_flags2: 0,
    })
}

/// `vctx->query_port`: writes `len` bytes (the inline `ibv_query_port`
/// passes the caller's `sizeof(struct ibv_port_attr)`).
///
/// # Safety
/// `ctx` is NULL or one of this library's contexts; `attr` is NULL or
/// holds `len` writable bytes.
pub(crate) unsafe extern "C" fn query_port_ex(
    ctx: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
    len: usize,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: ctx is an open context.
        let Some(c) = (unsafe { context(ctx) }) else {
            return libc::EINVAL;
        };
        if attr.is_null() {
            return libc::EINVAL;
        }
        match port_attr(c, port) {
            Ok(a) => {
                // SAFETY: the caller's buffer holds `len` bytes.
                unsafe { copy_out(&a, attr.cast(), len) };
                0
            }
            Err(e) => e,
        }
    })
}

/// The exported `ibv_query_port@IBVERBS_1.1`: the 48-byte compat layout
/// (programs built against old headers, and the inline wrapper's
/// fallback).
///
/// # Safety
/// `ctx` is NULL or an open context (of this library or the system's);
/// `attr` is NULL or holds the 48 bytes of the compat layout.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_port(
    ctx: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
) -> c_int {
    crate::passthrough::pass_through!(
        context ctx,
        "ibv_query_port",
        fn(*mut ibv_context, u8, *mut ibv_port_attr) -> c_int,
        (ctx, port, attr),
        libc::EOPNOTSUPP
    );
    // SAFETY: forwarded contract; 48 bytes is the compat struct's size.
    unsafe { query_port_ex(ctx, port, attr, COMPAT_PORT_ATTR_SIZE) }
}

/// The zero GID for an empty entry of the table.
///
/// # Safety
/// `ctx` is NULL or an open context (of this library or the system's);
/// `gid` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid(
    ctx: *mut ibv_context,
    port: u8,
    index: c_int,
    gid: *mut ibv_gid,
) -> c_int {
    crate::passthrough::pass_through!(
        context ctx,
        "ibv_query_gid",
        fn(*mut ibv_context, u8, c_int, *mut ibv_gid) -> c_int,
        (ctx, port, index, gid),
        libc::EOPNOTSUPP
    );
    guard(-1, || {
        // SAFETY: ctx is NULL or an open context.
        let Some(c) = (unsafe { context(ctx) }) else {
            return fail_minus_one(libc::EINVAL);
        };
        if gid.is_null() || index < 0 {
            return fail_minus_one(libc::EINVAL);
        }
        match c.ctx.query_gid(port, index as u32) {
            Ok(raw) => {
                // SAFETY: gid points to a caller's ibv_gid.
                unsafe { gid.write(ibv_gid { raw }) };
                0
            }
            // An empty entry of the table reads as the zero GID, as
            // libibverbs reads an unused entry's sysfs file.
            Err(e) if e.errno() == libc::ENODATA => {
                // SAFETY: as above.
                unsafe { gid.write(ibv_gid { raw: [0; 16] }) };
                0
            }
            Err(e) => fail_minus_one(e.errno()),
        }
    })
}

/// The entry behind `ibv_query_gid_ex`: ENODATA for an index past the
/// table or an empty one.
///
/// # Safety
/// `ctx` is NULL or an open context (of this library or the system's);
/// `entry` is NULL or holds `entry_size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_ex(
    ctx: *mut ibv_context,
    port_num: u32,
    gid_index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    crate::passthrough::pass_through!(
        context ctx,
        "_ibv_query_gid_ex",
        fn(*mut ibv_context, u32, u32, *mut ibv_gid_entry, u32, usize) -> c_int,
        (ctx, port_num, gid_index, entry, flags, entry_size),
        libc::EOPNOTSUPP
    );
    guard(libc::EIO, || {
        // SAFETY: ctx is NULL or an open context.
        let Some(c) = (unsafe { context(ctx) }) else {
            return libc::EINVAL;
        };
        if flags != 0 || entry.is_null() {
            return libc::EINVAL;
        }
        let Ok(port) = u8::try_from(port_num) else {
            return libc::EINVAL;
        };
        if port_attr(c, port).is_err() {
            return libc::EINVAL;
        }
        let Ok(raw) = c.ctx.query_gid(port, gid_index) else {
            // An index past the table or an empty slot.
            return libc::ENODATA;
        };
        let e = gid_entry(raw, gid_index, port_num, ifindex_of(c.ctx.addr()));
        // SAFETY: the caller's entry holds entry_size bytes.
        unsafe { copy_out(&e, entry.cast(), entry_size) };
        0
    })
}

fn gid_entry(raw: [u8; 16], index: u32, port: u32, ifindex: u32) -> ibv_gid_entry {
    ibv_gid_entry {
        gid: ibv_gid { raw },
        gid_index: index,
        port_num: port,
        gid_type: IBV_GID_TYPE_ROCE_V2,
        ndev_ifindex: ifindex,
    }
}

/// The index of the interface that holds `addr` (`lo`, 1, when none does).
fn ifindex_of(addr: std::net::IpAddr) -> u32 {
    roxe_provider::driver::interface_of(addr)
        .and_then(|n| std::ffi::CString::new(n).ok())
        // SAFETY: if_nametoindex reads a NUL-terminated name.
        .map(|n| unsafe { libc::if_nametoindex(n.as_ptr()) })
        .filter(|&i| i != 0)
        .unwrap_or(1)
}

/// Copy at most `size` bytes of `v` to `dst`, zero-filling the rest: the
/// way a struct whose size the caller gives (`ibv_query_port`'s, newer or
/// older headers' `ibv_device_attr_ex`, `ibv_gid_entry`) is written.
///
/// # Safety
/// `dst` holds `size` writable bytes.
unsafe fn copy_out<T>(v: &T, dst: *mut u8, size: usize) {
    let n = size.min(size_of::<T>());
    // SAFETY: the caller guarantees `dst` holds `size` bytes.
    unsafe {
        ptr::write_bytes(dst, 0, size);
        ptr::copy_nonoverlapping((v as *const T).cast::<u8>(), dst, n);
    }
}

/// The entries behind `ibv_query_gid_table`: the non-empty ones of
/// port 1, their count, or a negative errno.
///
/// # Safety
/// `ctx` is NULL or an open context (of this library or the system's);
/// `entries` is NULL or holds `max_entries` writable entries of
/// `entry_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_table(
    ctx: *mut ibv_context,
    entries: *mut ibv_gid_entry,
    max_entries: usize,
    flags: u32,
    entry_size: usize,
) -> isize {
    crate::passthrough::pass_through!(
        context ctx,
        "_ibv_query_gid_table",
        fn(*mut ibv_context, *mut ibv_gid_entry, usize, u32, usize) -> isize,
        (ctx, entries, max_entries, flags, entry_size),
        -(libc::EOPNOTSUPP as isize)
    );
    guard(-(libc::EIO as isize), || {
        // SAFETY: ctx is NULL or an open context.
        let Some(c) = (unsafe { context(ctx) }) else {
            return -(libc::EINVAL as isize);
        };
        if flags != 0 || (entries.is_null() && max_entries > 0) {
            return -(libc::EINVAL as isize);
        }
        let mut n = 0usize;
        let Ok(p) = c.ctx.query_port(1) else {
            return -(libc::EINVAL as isize);
        };
        for i in 0..p.gid_tbl_len {
            if let Ok(raw) = c.ctx.query_gid(1, i) {
                if n == max_entries {
                    return -(libc::EINVAL as isize);
                }
                // SAFETY: entries holds max_entries entries of entry_size.
                unsafe {
                    copy_out(
                        &gid_entry(raw, i, 1, ifindex_of(c.ctx.addr())),
                        entries.cast::<u8>().add(n * entry_size),
                        entry_size,
                    )
                };
                n += 1;
            }
        }
        n as isize
    })
}

/// The private `ibv_query_gid_type` (`enum ibv_gid_type_sysfs`).
///
/// # Safety
/// `ctx` is NULL or an open context (of this library or the system's);
/// `gid_type` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid_type(
    ctx: *mut ibv_context,
    port_num: u8,
    index: u32,
    gid_type: *mut u32,
) -> c_int {
    crate::passthrough::pass_through!(
        context ctx,
        "ibv_query_gid_type",
        fn(*mut ibv_context, u8, u32, *mut u32) -> c_int,
        (ctx, port_num, index, gid_type),
        libc::EOPNOTSUPP
    );
    guard(-1, || {
        // SAFETY: ctx is NULL or an open context.
        let Some(c) = (unsafe { context(ctx) }) else {
            return fail_minus_one(libc::EINVAL);
        };
        if gid_type.is_null() || c.ctx.query_gid(port_num, index).is_err() {
            return fail_minus_one(libc::EINVAL);
        }
        // SAFETY: gid_type points to the caller's enum.
        unsafe { *gid_type = IBV_GID_TYPE_SYSFS_ROCE_V2 };
        0
    })
}

/// The default partition at every index of the P_Key table.
///
/// # Safety
/// `ctx` is NULL or an open context (of this library or the system's);
/// `pkey` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_pkey(
    ctx: *mut ibv_context,
    port: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    crate::passthrough::pass_through!(
        context ctx,
        "ibv_query_pkey",
        fn(*mut ibv_context, u8, c_int, *mut u16) -> c_int,
        (ctx, port, index, pkey),
        libc::EOPNOTSUPP
    );
    guard(-1, || {
        // SAFETY: ctx is NULL or an open context.
        let Some(c) = (unsafe { context(ctx) }) else {
            return -1;
        };
        let Ok(p) = c.ctx.query_port(port) else {
            return -1;
        };
        if pkey.is_null() || index < 0 || index as u32 >= u32::from(p.pkey_tbl_len) {
            return -1;
        }
        // The default partition, full membership (big-endian 0xffff).
        // SAFETY: pkey points to the caller's __be16.
        unsafe { *pkey = 0xffff };
        0
    })
}

/// # Safety
/// `ctx` is NULL or an open context (of this library or the system's).
#[no_mangle]
pub unsafe extern "C" fn ibv_get_pkey_index(ctx: *mut ibv_context, port: u8, pkey: u16) -> c_int {
    crate::passthrough::pass_through!(
        context ctx,
        "ibv_get_pkey_index",
        fn(*mut ibv_context, u8, u16) -> c_int,
        (ctx, port, pkey),
        libc::EOPNOTSUPP
    );
    let mut p = 0u16;
    // SAFETY: forwarded; &mut p is valid.
    if unsafe { ibv_query_pkey(ctx, port, 0, &mut p) } == 0 && p == pkey {
        return 0;
    }
    set_errno(libc::ENOENT);
    -1
}
