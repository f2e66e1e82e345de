//! The exported symbols of rdma-core 44's `libibverbs.so.1` that are not
//! verbs over a roxe device: pure helpers (enum strings, rate tables, the
//! kernel-struct converters), fork and sysfs plumbing, features roxe does
//! not have, and the `IBVERBS_PRIVATE_34` provider interface.
//!
//! Programs are linked with `BIND_NOW`, and libraries they pull in
//! (libmlx5, libefa, librdmacm) import many of these, so every symbol must
//! exist for the program to load at all (docs/libibverbs-abi.md §2). Each
//! one answers the way a real provider lacking the feature answers: an
//! error code (EOPNOTSUPP), or NULL with `errno` set. None pretends to
//! succeed at something it did not do, and none dereferences a NULL
//! argument.
//!
//! Struct pointers are `*mut c_void` except for the few structs a helper
//! actually reads or writes; those have local `#[repr(C)]` mirrors whose
//! layout is pinned by const assertions (values measured with `offsetof`
//! against the installed rdma-core 44 headers on x86_64).

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::ptr;

use libc::{ENOENT, EOPNOTSUPP};

use crate::abi::{ibv_ah_attr, ibv_gid, ibv_qp_attr};
use crate::{fail_null, guard, set_errno};

// ---------------------------------------------------------------------------
// Enum strings (rdma-core libibverbs/enum_strs.c, verbatim).
// ---------------------------------------------------------------------------

/// `ibv_node_type_str`: rdma-core's text for `enum ibv_node_type`
/// (`IBV_NODE_CA` = 1 … `IBV_NODE_UNSPECIFIED` = 7), "unknown" otherwise.
#[no_mangle]
pub extern "C" fn ibv_node_type_str(node_type: c_int) -> *const c_char {
    let s = match node_type {
        1 => c"InfiniBand channel adapter",
        2 => c"InfiniBand switch",
        3 => c"InfiniBand router",
        4 => c"iWARP NIC",
        5 => c"usNIC",
        6 => c"usNIC UDP",
        7 => c"unspecified",
        _ => c"unknown",
    };
    s.as_ptr()
}

/// `ibv_port_state_str`: rdma-core's text for `enum ibv_port_state`
/// (`IBV_PORT_NOP` = 0 … `IBV_PORT_ACTIVE_DEFER` = 5), "unknown" otherwise.
#[no_mangle]
pub extern "C" fn ibv_port_state_str(port_state: c_int) -> *const c_char {
    let s = match port_state {
        0 => c"no state change (NOP)",
        1 => c"down",
        2 => c"init",
        3 => c"armed",
        4 => c"active",
        5 => c"active defer",
        _ => c"unknown",
    };
    s.as_ptr()
}

/// `ibv_event_type_str`: rdma-core's text for `enum ibv_event_type`
/// (`IBV_EVENT_CQ_ERR` = 0 … `IBV_EVENT_WQ_FATAL` = 19), "unknown" otherwise.
#[no_mangle]
pub extern "C" fn ibv_event_type_str(event: c_int) -> *const c_char {
    let s = match event {
        0 => c"CQ error",
        1 => c"local work queue catastrophic error",
        2 => c"invalid request local work queue error",
        3 => c"local access violation work queue error",
        4 => c"communication established",
        5 => c"send queue drained",
        6 => c"path migrated",
        7 => c"path migration request error",
        8 => c"local catastrophic error",
        9 => c"port active",
        10 => c"port error",
        11 => c"LID change",
        12 => c"P_Key change",
        13 => c"SM change",
        14 => c"SRQ catastrophic error",
        15 => c"SRQ limit reached",
        16 => c"last WQE reached",
        17 => c"client reregistration",
        18 => c"GID table change",
        19 => c"WQ fatal",
        _ => c"unknown",
    };
    s.as_ptr()
}

/// `ibv_wc_status_str`: rdma-core's text for `enum ibv_wc_status`
/// (`IBV_WC_SUCCESS` = 0 … `IBV_WC_TM_RNDV_INCOMPLETE` = 23), "unknown"
/// otherwise. ibv_*_pingpong print these on a failed completion.
#[no_mangle]
pub extern "C" fn ibv_wc_status_str(status: c_int) -> *const c_char {
    let s = match u32::try_from(status)
        .ok()
        .map(roxe_verbs::abi::convert::wc_status_from_c)
    {
        // wc_status_from_c maps unknown values to GENERAL_ERR: only a
        // value that maps back to itself is that status.
        Some(w) if w as i32 == status => w.as_cstr(),
        _ => c"unknown",
    };
    s.as_ptr()
}

// ---------------------------------------------------------------------------
// Rate conversions (rdma-core libibverbs/verbs.c tables, verbatim).
// ---------------------------------------------------------------------------

/// `enum ibv_rate` values, from `<infiniband/verbs.h>`.
mod rate {
    pub const MAX: i32 = 0;
    pub const R2_5: i32 = 2;
    pub const R5: i32 = 5;
    pub const R10: i32 = 3;
    pub const R20: i32 = 6;
    pub const R30: i32 = 4;
    pub const R40: i32 = 7;
    pub const R60: i32 = 8;
    pub const R80: i32 = 9;
    pub const R120: i32 = 10;
    pub const R14: i32 = 11;
    pub const R56: i32 = 12;
    pub const R112: i32 = 13;
    pub const R168: i32 = 14;
    pub const R25: i32 = 15;
    pub const R100: i32 = 16;
    pub const R200: i32 = 17;
    pub const R300: i32 = 18;
    pub const R28: i32 = 19;
    pub const R50: i32 = 20;
    pub const R400: i32 = 21;
    pub const R600: i32 = 22;
    pub const R800: i32 = 23;
    pub const R1200: i32 = 24;
}

/// (rate, multiple of 2.5 Gb/s) for the rates that have one; -1 /
/// `IBV_RATE_MAX` for the rest, as rdma-core.
const RATE_MULT: [(c_int, c_int); 15] = [
    (rate::R2_5, 1),
    (rate::R5, 2),
    (rate::R10, 4),
    (rate::R20, 8),
    (rate::R30, 12),
    (rate::R40, 16),
    (rate::R60, 24),
    (rate::R80, 32),
    (rate::R120, 48),
    (rate::R28, 11),
    (rate::R50, 20),
    (rate::R400, 160),
    (rate::R600, 240),
    (rate::R800, 320),
    (rate::R1200, 480),
];

/// (rate, Mbit/s) for every rate; -1 / `IBV_RATE_MAX` otherwise.
const RATE_MBPS: [(c_int, c_int); 23] = [
    (rate::R2_5, 2500),
    (rate::R5, 5000),
    (rate::R10, 10000),
    (rate::R20, 20000),
    (rate::R30, 30000),
    (rate::R40, 40000),
    (rate::R60, 60000),
    (rate::R80, 80000),
    (rate::R120, 120000),
    (rate::R14, 14062),
    (rate::R56, 56250),
    (rate::R112, 112500),
    (rate::R168, 168750),
    (rate::R25, 25781),
    (rate::R100, 103125),
    (rate::R200, 206250),
    (rate::R300, 309375),
    (rate::R28, 28125),
    (rate::R50, 53125),
    (rate::R400, 425000),
    (rate::R600, 637500),
    (rate::R800, 850000),
    (rate::R1200, 1275000),
];

fn lookup(table: &[(c_int, c_int)], key: c_int, miss: c_int) -> c_int {
    table.iter().find(|e| e.0 == key).map_or(miss, |e| e.1)
}

fn rlookup(table: &[(c_int, c_int)], value: c_int) -> c_int {
    table
        .iter()
        .find(|e| e.1 == value)
        .map_or(rate::MAX, |e| e.0)
}

/// `ibv_rate_to_mult`: multiple of 2.5 Gb/s, or -1 for rates that are not one.
#[no_mangle]
pub extern "C" fn ibv_rate_to_mult(rate: c_int) -> c_int {
    lookup(&RATE_MULT, rate, -1)
}

/// `mult_to_ibv_rate`: the rate for a multiple of 2.5 Gb/s, else `IBV_RATE_MAX`.
#[no_mangle]
pub extern "C" fn mult_to_ibv_rate(mult: c_int) -> c_int {
    rlookup(&RATE_MULT, mult)
}

/// `ibv_rate_to_mbps`: Mbit/s, or -1 for an unknown rate.
#[no_mangle]
pub extern "C" fn ibv_rate_to_mbps(rate: c_int) -> c_int {
    lookup(&RATE_MBPS, rate, -1)
}

/// `mbps_to_ibv_rate`: the rate for an exact Mbit/s value, else `IBV_RATE_MAX`.
#[no_mangle]
pub extern "C" fn mbps_to_ibv_rate(mbps: c_int) -> c_int {
    rlookup(&RATE_MBPS, mbps)
}

// ---------------------------------------------------------------------------
// Fork support. rdma-core marks pinned pages MADV_DONTFORK so a child does
// not break the parent's DMA mappings. roxe pins nothing (the "NIC" is this
// process reading its own memory), so fork needs no preparation.
// ---------------------------------------------------------------------------

/// `enum ibv_fork_status::IBV_FORK_UNNEEDED`.
const IBV_FORK_UNNEEDED: c_int = 2;

/// `ibv_fork_init`: nothing to prepare; success.
#[no_mangle]
pub extern "C" fn ibv_fork_init() -> c_int {
    0
}

/// `ibv_is_fork_initialized`: `IBV_FORK_UNNEEDED`, nothing is pinned.
#[no_mangle]
pub extern "C" fn ibv_is_fork_initialized() -> c_int {
    IBV_FORK_UNNEEDED
}

/// `ibv_dontfork_range`: nothing is pinned, so nothing to protect; success.
#[no_mangle]
pub extern "C" fn ibv_dontfork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}

/// `ibv_dofork_range`: the inverse of the above; success.
#[no_mangle]
pub extern "C" fn ibv_dofork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}

/// `ibv_query_qp_data_in_order`: 0 = "in-order data placement is not
/// guaranteed", the conservative answer rdma-core itself gives on every
/// architecture but x86, and for providers without the op.
///
/// # Safety
/// `_qp` is NULL or a live QP (of this library or the system's).
#[no_mangle]
pub unsafe extern "C" fn ibv_query_qp_data_in_order(
    _qp: *mut c_void,
    _op: c_int,
    _flags: u32,
) -> c_int {
    crate::passthrough::pass_through!(
        object _qp,
        "ibv_query_qp_data_in_order",
        fn(*mut c_void, c_int, u32) -> c_int,
        (_qp, _op, _flags),
        libc::EOPNOTSUPP
    );
    0
}

// ---------------------------------------------------------------------------
// sysfs. Under `roxe run` a soft device has its /sys/class/infiniband entry
// (see the tool's `run/view.rs`); elsewhere the paths are the usual ones
// and reading a device file fails as for a missing file.
// ---------------------------------------------------------------------------

/// `ibv_get_sysfs_path`: the static string "/sys".
#[no_mangle]
pub extern "C" fn ibv_get_sysfs_path() -> *const c_char {
    c"/sys".as_ptr()
}

/// `ibv_read_sysfs_file`: read `<dir>/<file>` into `buf` as rdma-core does
/// (at most `size - 1` bytes, NUL-terminated, one trailing newline
/// dropped); its length, or -1 with errno.
///
/// # Safety
/// `dir` and `file` are NUL-terminated strings; `buf` holds `size` bytes.
#[no_mangle]
pub unsafe extern "C" fn ibv_read_sysfs_file(
    dir: *const c_char,
    file: *const c_char,
    buf: *mut c_char,
    size: usize,
) -> c_int {
    crate::guard(-1, || {
        if dir.is_null() || file.is_null() || buf.is_null() || size == 0 {
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: both are NUL-terminated strings (the caller's contract).
        let (d, f) = unsafe {
            (
                std::ffi::CStr::from_ptr(dir),
                std::ffi::CStr::from_ptr(file),
            )
        };
        use std::os::unix::ffi::OsStrExt;
        let path = std::path::Path::new(std::ffi::OsStr::from_bytes(d.to_bytes()))
            .join(std::ffi::OsStr::from_bytes(f.to_bytes()));
        let mut data = match std::fs::read(&path) {
            Ok(d) => d,
            Err(e) => {
                set_errno(e.raw_os_error().unwrap_or(ENOENT));
                return -1;
            }
        };
        data.truncate(size - 1);
        if data.last() == Some(&b'\n') {
            data.pop();
        }
        // SAFETY: buf holds size bytes and data.len() < size.
        unsafe {
            ptr::copy_nonoverlapping(data.as_ptr(), buf.cast::<u8>(), data.len());
            *buf.add(data.len()) = 0;
        }
        data.len() as c_int
    })
}

/// `ibv_read_ibdev_sysfs_file`: -1 with errno ENOENT. Variadic in C
/// (`fnfmt, ...`); the fixed-argument definition is ABI-safe on x86_64 and
/// aarch64 Linux because it never reads the variadic part.
#[no_mangle]
pub extern "C" fn ibv_read_ibdev_sysfs_file(
    _buf: *mut c_char,
    _size: usize,
    _sysfs_dev: *mut c_void,
    _fnfmt: *const c_char,
) -> c_int {
    set_errno(ENOENT);
    -1
}

// ---------------------------------------------------------------------------
// Features roxe does not have. Sharing objects across processes through the
// kernel uverbs fd (import/unimport), dma-buf memory, multicast, ECE and
// kernel neighbour resolution for RoCE address handles all need a kernel
// RDMA stack; the answer is the one a provider without the op gives.
// ---------------------------------------------------------------------------

/// Int-returning unsupported verb: EOPNOTSUPP (also left in errno, as
/// rdma-core's own `ibv_set_ece` does).
fn eopnotsupp() -> c_int {
    set_errno(EOPNOTSUPP);
    EOPNOTSUPP
}

/// `ibv_reg_dmabuf_mr`: dma-buf fds are device memory roxe cannot read.
#[no_mangle]
pub extern "C" fn ibv_reg_dmabuf_mr(
    _pd: *mut c_void,
    _offset: u64,
    _length: usize,
    _iova: u64,
    _fd: c_int,
    _access: c_int,
) -> *mut c_void {
    fail_null(EOPNOTSUPP)
}

/// `ibv_attach_mcast`: UD multicast is not supported.
///
/// # Safety
/// `_qp` is NULL or a live QP (of this library or the system's).
#[no_mangle]
pub unsafe extern "C" fn ibv_attach_mcast(
    _qp: *mut c_void,
    _gid: *const c_void,
    _lid: u16,
) -> c_int {
    crate::passthrough::pass_through!(
        object _qp,
        "ibv_attach_mcast",
        fn(*mut c_void, *const c_void, u16) -> c_int,
        (_qp, _gid, _lid),
        libc::EOPNOTSUPP
    );
    eopnotsupp()
}

/// `ibv_detach_mcast`: UD multicast is not supported.
///
/// # Safety
/// `_qp` is NULL or a live QP (of this library or the system's).
#[no_mangle]
pub unsafe extern "C" fn ibv_detach_mcast(
    _qp: *mut c_void,
    _gid: *const c_void,
    _lid: u16,
) -> c_int {
    crate::passthrough::pass_through!(
        object _qp,
        "ibv_detach_mcast",
        fn(*mut c_void, *const c_void, u16) -> c_int,
        (_qp, _gid, _lid),
        libc::EOPNOTSUPP
    );
    eopnotsupp()
}

/// `ibv_query_ece`: no Enhanced Connection Establishment options.
///
/// # Safety
/// `_qp` is NULL or a live QP (of this library or the system's).
#[no_mangle]
pub unsafe extern "C" fn ibv_query_ece(_qp: *mut c_void, _ece: *mut c_void) -> c_int {
    crate::passthrough::pass_through!(
        object _qp,
        "ibv_query_ece",
        fn(*mut c_void, *mut c_void) -> c_int,
        (_qp, _ece),
        libc::EOPNOTSUPP
    );
    eopnotsupp()
}

/// `ibv_set_ece`: no Enhanced Connection Establishment options.
///
/// # Safety
/// `_qp` is NULL or a live QP (of this library or the system's).
#[no_mangle]
pub unsafe extern "C" fn ibv_set_ece(_qp: *mut c_void, _ece: *mut c_void) -> c_int {
    crate::passthrough::pass_through!(
        object _qp,
        "ibv_set_ece",
        fn(*mut c_void, *mut c_void) -> c_int,
        (_qp, _ece),
        libc::EOPNOTSUPP
    );
    eopnotsupp()
}

/// `ibv_resolve_eth_l2_from_gid`: rdma-core asks the kernel's neighbour
/// table over netlink; roxe resolves peers itself (UDP), so there is no
/// MAC/VLAN to report. libmlx5 is the only importer.
#[no_mangle]
pub extern "C" fn ibv_resolve_eth_l2_from_gid(
    _context: *mut c_void,
    _attr: *mut c_void,
    _eth_mac: *mut u8,
    _vid: *mut u16,
) -> c_int {
    eopnotsupp()
}

// ---------------------------------------------------------------------------
// Kernel-struct converters (rdma-core libibverbs/marshall.c). Pure field
// copies between the uverbs kernel ABI structs and the verbs structs, used
// by librdmacm (path records). Implemented for real; a NULL argument is a
// no-op instead of a crash.
// ---------------------------------------------------------------------------

// The verbs side of each conversion is `crate::abi`'s (ibv_ah_attr,
// ibv_qp_attr, ibv_gid); the kernel side is declared here.

/// `struct ib_uverbs_global_route` (`<rdma/ib_user_verbs.h>`).
#[repr(C)]
struct UverbsGlobalRoute {
    dgid: [u8; 16],
    flow_label: u32,
    sgid_index: u8,
    hop_limit: u8,
    traffic_class: u8,
    reserved: u8,
}

/// `struct ib_uverbs_ah_attr`.
#[repr(C)]
struct UverbsAhAttr {
    grh: UverbsGlobalRoute,
    dlid: u16,
    sl: u8,
    src_path_bits: u8,
    static_rate: u8,
    is_global: u8,
    port_num: u8,
    reserved: u8,
}

/// `struct ib_uverbs_qp_attr`.
#[repr(C)]
struct UverbsQpAttr {
    qp_attr_mask: u32,
    qp_state: u32,
    cur_qp_state: u32,
    path_mtu: u32,
    path_mig_state: u32,
    qkey: u32,
    rq_psn: u32,
    sq_psn: u32,
    dest_qp_num: u32,
    qp_access_flags: u32,
    ah_attr: UverbsAhAttr,
    alt_ah_attr: UverbsAhAttr,
    max_send_wr: u32,
    max_recv_wr: u32,
    max_send_sge: u32,
    max_recv_sge: u32,
    max_inline_data: u32,
    pkey_index: u16,
    alt_pkey_index: u16,
    en_sqd_async_notify: u8,
    sq_draining: u8,
    max_rd_atomic: u8,
    max_dest_rd_atomic: u8,
    min_rnr_timer: u8,
    port_num: u8,
    timeout: u8,
    retry_cnt: u8,
    rnr_retry: u8,
    alt_port_num: u8,
    alt_timeout: u8,
    reserved: [u8; 5],
}

/// `struct ibv_sa_path_rec` (`<infiniband/sa.h>`; `__be*` fields are
/// copied as-is, no byte swapping, exactly as rdma-core).
#[repr(C)]
struct IbvSaPathRec {
    dgid: ibv_gid,
    sgid: ibv_gid,
    dlid: u16,
    slid: u16,
    raw_traffic: c_int,
    flow_label: u32,
    hop_limit: u8,
    traffic_class: u8,
    reversible: c_int,
    numb_path: u8,
    pkey: u16,
    sl: u8,
    mtu_selector: u8,
    mtu: u8,
    rate_selector: u8,
    rate: u8,
    packet_life_time_selector: u8,
    packet_life_time: u8,
    preference: u8,
}

/// `struct ib_user_path_rec` (`<rdma/ib_user_sa.h>`).
#[repr(C)]
struct UserPathRec {
    dgid: [u8; 16],
    sgid: [u8; 16],
    dlid: u16,
    slid: u16,
    raw_traffic: u32,
    flow_label: u32,
    reversible: u32,
    mtu: u32,
    pkey: u16,
    hop_limit: u8,
    traffic_class: u8,
    numb_path: u8,
    sl: u8,
    mtu_selector: u8,
    rate_selector: u8,
    rate: u8,
    packet_life_time_selector: u8,
    packet_life_time: u8,
    preference: u8,
}

// Layout pins: sizes and a few offsets measured with offsetof() against
// the rdma-core 44 headers (identical on aarch64: no pointers, no longs).
const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<UverbsAhAttr>() == 32);
    assert!(offset_of!(UverbsAhAttr, dlid) == 24);
    assert!(offset_of!(UverbsAhAttr, port_num) == 30);
    assert!(size_of::<UverbsQpAttr>() == 144);
    assert!(offset_of!(UverbsQpAttr, ah_attr) == 40);
    assert!(offset_of!(UverbsQpAttr, alt_ah_attr) == 72);
    assert!(offset_of!(UverbsQpAttr, max_send_wr) == 104);
    assert!(offset_of!(UverbsQpAttr, pkey_index) == 124);
    assert!(offset_of!(UverbsQpAttr, alt_timeout) == 138);
    assert!(size_of::<IbvSaPathRec>() == 64);
    assert!(offset_of!(IbvSaPathRec, dlid) == 32);
    assert!(offset_of!(IbvSaPathRec, raw_traffic) == 36);
    assert!(offset_of!(IbvSaPathRec, flow_label) == 40);
    assert!(offset_of!(IbvSaPathRec, hop_limit) == 44);
    assert!(offset_of!(IbvSaPathRec, reversible) == 48);
    assert!(offset_of!(IbvSaPathRec, numb_path) == 52);
    assert!(offset_of!(IbvSaPathRec, pkey) == 54);
    assert!(offset_of!(IbvSaPathRec, sl) == 56);
    assert!(offset_of!(IbvSaPathRec, preference) == 63);
    assert!(size_of::<UserPathRec>() == 64);
    assert!(offset_of!(UserPathRec, raw_traffic) == 36);
    assert!(offset_of!(UserPathRec, pkey) == 52);
    assert!(offset_of!(UserPathRec, preference) == 63);
};

fn copy_ah_attr_from_kern(dst: &mut ibv_ah_attr, src: &UverbsAhAttr) {
    dst.grh.dgid = ibv_gid { raw: src.grh.dgid };
    dst.grh.flow_label = src.grh.flow_label;
    dst.grh.sgid_index = src.grh.sgid_index;
    dst.grh.hop_limit = src.grh.hop_limit;
    dst.grh.traffic_class = src.grh.traffic_class;
    dst.dlid = src.dlid;
    dst.sl = src.sl;
    dst.src_path_bits = src.src_path_bits;
    dst.static_rate = src.static_rate;
    dst.is_global = src.is_global;
    dst.port_num = src.port_num;
}

/// Run a kernel-struct converter on the caller's structs; NULL for either
/// is a no-op.
///
/// # Safety
/// `dst` and `src` are NULL or valid, non-overlapping structs of types `D`
/// and `S`.
unsafe fn convert<D, S>(dst: *mut c_void, src: *const c_void, copy: impl FnOnce(&mut D, &S)) {
    guard((), || {
        // SAFETY: per the contract; NULL is rejected by as_mut/as_ref.
        let (Some(d), Some(s)) = (unsafe { dst.cast::<D>().as_mut() }, unsafe {
            src.cast::<S>().as_ref()
        }) else {
            return;
        };
        copy(d, s);
    })
}

/// `ibv_copy_ah_attr_from_kern(struct ibv_ah_attr *dst, struct ib_uverbs_ah_attr *src)`.
///
/// # Safety
/// As [`convert`].
#[no_mangle]
pub unsafe extern "C" fn ibv_copy_ah_attr_from_kern(dst: *mut c_void, src: *const c_void) {
    // SAFETY: per the contract.
    unsafe { convert(dst, src, copy_ah_attr_from_kern) }
}

/// `ibv_copy_qp_attr_from_kern(struct ibv_qp_attr *dst, struct ib_uverbs_qp_attr *src)`.
/// Like rdma-core it leaves `qp_state` and `rate_limit` untouched.
///
/// # Safety
/// As [`convert`].
#[no_mangle]
pub unsafe extern "C" fn ibv_copy_qp_attr_from_kern(dst: *mut c_void, src: *const c_void) {
    // SAFETY: per the contract.
    unsafe {
        convert(dst, src, |d: &mut ibv_qp_attr, s: &UverbsQpAttr| {
            // The C enums are 4 bytes; the kernel's u32 values go in unchanged.
            d.cur_qp_state = s.cur_qp_state;
            d.path_mtu = s.path_mtu;
            d.path_mig_state = s.path_mig_state;
            d.qkey = s.qkey;
            d.rq_psn = s.rq_psn;
            d.sq_psn = s.sq_psn;
            d.dest_qp_num = s.dest_qp_num;
            d.qp_access_flags = s.qp_access_flags;
            d.cap.max_send_wr = s.max_send_wr;
            d.cap.max_recv_wr = s.max_recv_wr;
            d.cap.max_send_sge = s.max_send_sge;
            d.cap.max_recv_sge = s.max_recv_sge;
            d.cap.max_inline_data = s.max_inline_data;
            copy_ah_attr_from_kern(&mut d.ah_attr, &s.ah_attr);
            copy_ah_attr_from_kern(&mut d.alt_ah_attr, &s.alt_ah_attr);
            d.pkey_index = s.pkey_index;
            d.alt_pkey_index = s.alt_pkey_index;
            d.en_sqd_async_notify = s.en_sqd_async_notify;
            d.sq_draining = s.sq_draining;
            d.max_rd_atomic = s.max_rd_atomic;
            d.max_dest_rd_atomic = s.max_dest_rd_atomic;
            d.min_rnr_timer = s.min_rnr_timer;
            d.port_num = s.port_num;
            d.timeout = s.timeout;
            d.retry_cnt = s.retry_cnt;
            d.rnr_retry = s.rnr_retry;
            d.alt_port_num = s.alt_port_num;
            d.alt_timeout = s.alt_timeout;
        })
    }
}

/// `ibv_copy_path_rec_from_kern(struct ibv_sa_path_rec *dst, struct ib_user_path_rec *src)`.
/// Narrowing `mtu` (u32 → u8) and sign changes follow C's implicit conversions.
///
/// # Safety
/// As [`convert`].
#[no_mangle]
pub unsafe extern "C" fn ibv_copy_path_rec_from_kern(dst: *mut c_void, src: *const c_void) {
    // SAFETY: per the contract.
    unsafe {
        convert(dst, src, |d: &mut IbvSaPathRec, s: &UserPathRec| {
            d.dgid = ibv_gid { raw: s.dgid };
            d.sgid = ibv_gid { raw: s.sgid };
            d.dlid = s.dlid;
            d.slid = s.slid;
            d.raw_traffic = s.raw_traffic as c_int;
            d.flow_label = s.flow_label;
            d.hop_limit = s.hop_limit;
            d.traffic_class = s.traffic_class;
            d.reversible = s.reversible as c_int;
            d.numb_path = s.numb_path;
            d.pkey = s.pkey;
            d.sl = s.sl;
            d.mtu_selector = s.mtu_selector;
            d.mtu = s.mtu as u8;
            d.rate_selector = s.rate_selector;
            d.rate = s.rate;
            d.packet_life_time = s.packet_life_time;
            d.preference = s.preference;
            d.packet_life_time_selector = s.packet_life_time_selector;
        })
    }
}

/// `ibv_copy_path_rec_to_kern(struct ib_user_path_rec *dst, struct ibv_sa_path_rec *src)`.
///
/// # Safety
/// As [`convert`].
#[no_mangle]
pub unsafe extern "C" fn ibv_copy_path_rec_to_kern(dst: *mut c_void, src: *const c_void) {
    // SAFETY: per the contract.
    unsafe {
        convert(dst, src, |d: &mut UserPathRec, s: &IbvSaPathRec| {
            d.dgid = s.dgid.raw;
            d.sgid = s.sgid.raw;
            d.dlid = s.dlid;
            d.slid = s.slid;
            d.raw_traffic = s.raw_traffic as u32;
            d.flow_label = s.flow_label;
            d.hop_limit = s.hop_limit;
            d.traffic_class = s.traffic_class;
            d.reversible = s.reversible as u32;
            d.numb_path = s.numb_path;
            d.pkey = s.pkey;
            d.sl = s.sl;
            d.mtu_selector = s.mtu_selector;
            d.mtu = u32::from(s.mtu);
            d.rate_selector = s.rate_selector;
            d.rate = s.rate;
            d.packet_life_time = s.packet_life_time;
            d.preference = s.preference;
            d.packet_life_time_selector = s.packet_life_time_selector;
        })
    }
}

// ---------------------------------------------------------------------------
// IBVERBS_PRIVATE_34: the interface between libibverbs and its kernel
// providers (libmlx5, libefa, ...). Debian's perftest links libmlx5 and
// libefa, so they are loaded with every perftest binary: their constructors
// call verbs_register_driver_34() and their imports must resolve. They
// never get a device from roxe (device matching is roxe's own), so the
// rest is never reached in practice; if it is, every kernel command fails
// with EOPNOTSUPP — there is no uverbs kernel interface behind roxe.
// ---------------------------------------------------------------------------

/// `bool verbs_allow_disassociate_destroy`: providers read it to decide
/// whether destroy may succeed after a hot-unplug. Writable data, as in
/// rdma-core; roxe devices never disassociate.
#[allow(non_upper_case_globals)]
#[no_mangle]
pub static mut verbs_allow_disassociate_destroy: bool = false;

/// `verbs_register_driver_34(const struct verbs_device_ops *)`: called by
/// libmlx5/libefa constructors before `main`. roxe does not load kernel
/// providers, so registration is ignored (harmlessly, any number of times).
#[no_mangle]
pub extern "C" fn verbs_register_driver_34(_ops: *const c_void) {}

/// `__verbs_log(struct verbs_context *, uint32_t level, const char *fmt, ...)`:
/// provider debug logging, dropped. Variadic in C; a no-op with the fixed
/// arguments only is ABI-safe on x86_64 and aarch64 Linux.
#[no_mangle]
pub extern "C" fn __verbs_log(_ctx: *mut c_void, _level: u32, _fmt: *const c_char) {}

/// `verbs_set_ops`: only a provider's own context setup calls it; no-op.
#[no_mangle]
pub extern "C" fn verbs_set_ops(_vctx: *mut c_void, _ops: *const c_void) {}

/// `verbs_init_cq`: only a provider's own create_cq calls it; no-op.
#[no_mangle]
pub extern "C" fn verbs_init_cq(
    _cq: *mut c_void,
    _context: *mut c_void,
    _channel: *mut c_void,
    _cq_context: *mut c_void,
) {
}

/// `verbs_uninit_context`: no provider context was ever initialised; no-op.
#[no_mangle]
pub extern "C" fn verbs_uninit_context(_context: *mut c_void) {}

/// `verbs_open_device`: kernel providers cannot open devices here: NULL, EOPNOTSUPP.
#[no_mangle]
pub extern "C" fn verbs_open_device(
    _device: *mut c_void,
    _private_data: *mut c_void,
) -> *mut c_void {
    fail_null(EOPNOTSUPP)
}

/// `_verbs_init_and_alloc_context`: no uverbs fd to build a provider
/// context on: NULL, EOPNOTSUPP.
#[no_mangle]
pub extern "C" fn _verbs_init_and_alloc_context(
    _device: *mut c_void,
    _cmd_fd: c_int,
    _alloc_size: usize,
    _context_offset: *mut c_void,
    _driver_id: u32,
) -> *mut c_void {
    fail_null(EOPNOTSUPP)
}

/// `execute_ioctl(struct ibv_context *, struct ibv_command_buffer *)`: no
/// kernel to send the ioctl to.
#[no_mangle]
pub extern "C" fn execute_ioctl(_context: *mut c_void, _cmd: *mut c_void) -> c_int {
    eopnotsupp()
}

/// The head of `struct ibv_command_buffer` (rdma-core cmd_ioctl.h): the
/// link pointer, the fill cursor, and (at `ATTRS_OFFSET`) the flexible
/// `hdr.attrs[]` array of 16-byte `struct ib_uverbs_attr`.
#[repr(C)]
struct CommandBufferHead {
    next: *const CommandBufferHead,
    next_attr: *const u8,
}

/// `offsetof(struct ibv_command_buffer, hdr.attrs)` (measured; only
/// pointers and fixed-size fields precede it, so identical on aarch64).
const ATTRS_OFFSET: usize = 56;
/// `sizeof(struct ib_uverbs_attr)`.
const UVERBS_ATTR_SIZE: usize = 16;

/// `__ioctl_final_num_attrs(unsigned num_attrs, struct ibv_command_buffer *link)`:
/// a pure helper providers call to size the attribute array of a command,
/// implemented as rdma-core: `num_attrs` plus the attributes filled in
/// every linked buffer.
///
/// # Safety
/// `link` is NULL or a live command buffer whose `next` links are NULL
/// or live command buffers.
#[no_mangle]
pub unsafe extern "C" fn __ioctl_final_num_attrs(num_attrs: c_uint, link: *const c_void) -> c_uint {
    guard(num_attrs, || {
        let mut n = num_attrs;
        let mut link = link.cast::<CommandBufferHead>();
        while !link.is_null() {
            // SAFETY: `link` is a live command buffer on the caller's stack
            // (C contract); its next_attr points into its own attrs array.
            let b = unsafe { &*link };
            let attrs = link as usize + ATTRS_OFFSET;
            let filled = (b.next_attr as usize).wrapping_sub(attrs) / UVERBS_ATTR_SIZE;
            n = n.wrapping_add(filled as c_uint);
            link = b.next;
        }
        n
    })
}

/// Defines `ibv_cmd_*` entry points that fail with EOPNOTSUPP (returned
/// and left in errno): they marshal a command for the kernel's uverbs
/// interface, which does not exist under roxe. Each keeps its C signature
/// (struct pointers as `*mut c_void`).
macro_rules! ibv_cmd_unsupported {
    ($( fn $name:ident($($arg:ident: $ty:ty),* $(,)?); )*) => {
        $(
            #[doc = concat!("`", stringify!($name), "`: no uverbs kernel interface, EOPNOTSUPP.")]
            #[no_mangle]
            pub extern "C" fn $name($($arg: $ty),*) -> c_int {
                eopnotsupp()
            }
        )*
    };
}

type P = *mut c_void;

ibv_cmd_unsupported! {
    fn ibv_cmd_advise_mr(_pd: P, _advice: c_int, _flags: u32, _sg_list: P, _num_sge: u32);
    fn ibv_cmd_alloc_dm(_ctx: P, _dm_attr: P, _dm: P, _link: P);
    fn ibv_cmd_alloc_mw(_pd: P, _type: c_int, _mw: P, _cmd: P, _cmd_size: usize, _resp: P, _resp_size: usize);
    fn ibv_cmd_alloc_pd(_context: P, _pd: P, _cmd: P, _cmd_size: usize, _resp: P, _resp_size: usize);
    fn ibv_cmd_attach_mcast(_qp: P, _gid: P, _lid: u16);
    fn ibv_cmd_close_xrcd(_xrcd: P);
    fn ibv_cmd_create_ah(_pd: P, _ah: P, _attr: P, _resp: P, _resp_size: usize);
    fn ibv_cmd_create_counters(_context: P, _init_attr: P, _vcounters: P, _link: P);
    fn ibv_cmd_create_cq(_context: P, _cqe: c_int, _channel: P, _comp_vector: c_int, _cq: P, _cmd: P, _cmd_size: usize, _resp: P, _resp_size: usize);
    fn ibv_cmd_create_cq_ex(_context: P, _cq_attr: P, _cq: P, _cmd: P, _cmd_size: usize, _resp: P, _resp_size: usize, _cmd_flags: u32);
    fn ibv_cmd_create_flow(_qp: P, _flow_id: P, _flow_attr: P, _ucmd: P, _ucmd_size: usize);
    fn ibv_cmd_create_flow_action_esp(_ctx: P, _attr: P, _flow_action: P, _driver: P);
    fn ibv_cmd_create_qp(_pd: P, _qp: P, _attr: P, _cmd: P, _cmd_size: usize, _resp: P, _resp_size: usize);
    fn ibv_cmd_create_qp_ex(_context: P, _qp: P, _attr_ex: P, _cmd: P, _cmd_size: usize, _resp: P, _resp_size: usize);
    fn ibv_cmd_create_qp_ex2(_context: P, _qp: P, _qp_attr: P, _cmd: P, _cmd_size: usize, _resp: P, _resp_size: usize);
    fn ibv_cmd_create_rwq_ind_table(_context: P, _init_attr: P, _rwq_ind_table: P, _resp: P, _resp_size: usize);
    fn ibv_cmd_create_srq(_pd: P, _srq: P, _attr: P, _cmd: P, _cmd_size: usize, _resp: P, _resp_size: usize);
    fn ibv_cmd_create_srq_ex(_context: P, _srq: P, _attr_ex: P, _cmd: P, _cmd_size: usize, _resp: P, _resp_size: usize);
    fn ibv_cmd_create_wq(_context: P, _wq_init_attr: P, _wq: P, _cmd: P, _cmd_size: usize, _resp: P, _resp_size: usize);
    fn ibv_cmd_dealloc_mw(_mw: P);
    fn ibv_cmd_dealloc_pd(_pd: P);
    fn ibv_cmd_dereg_mr(_vmr: P);
    fn ibv_cmd_destroy_ah(_ah: P);
    fn ibv_cmd_destroy_counters(_vcounters: P);
    fn ibv_cmd_destroy_cq(_cq: P);
    fn ibv_cmd_destroy_flow(_flow_id: P);
    fn ibv_cmd_destroy_flow_action(_action: P);
    fn ibv_cmd_destroy_qp(_qp: P);
    fn ibv_cmd_destroy_rwq_ind_table(_rwq_ind_table: P);
    fn ibv_cmd_destroy_srq(_srq: P);
    fn ibv_cmd_destroy_wq(_wq: P);
    fn ibv_cmd_detach_mcast(_qp: P, _gid: P, _lid: u16);
    fn ibv_cmd_free_dm(_dm: P);
    fn ibv_cmd_get_context(_context: P, _cmd: P, _cmd_size: usize, _resp: P, _resp_size: usize);
    fn ibv_cmd_modify_cq(_cq: P, _attr: P, _cmd: P, _cmd_size: usize);
    fn ibv_cmd_modify_flow_action_esp(_flow_action: P, _attr: P, _driver: P);
    fn ibv_cmd_modify_qp(_qp: P, _attr: P, _attr_mask: c_int, _cmd: P, _cmd_size: usize);
    fn ibv_cmd_modify_qp_ex(_qp: P, _attr: P, _attr_mask: c_int, _cmd: P, _cmd_size: usize, _resp: P, _resp_size: usize);
    fn ibv_cmd_modify_srq(_srq: P, _srq_attr: P, _srq_attr_mask: c_int, _cmd: P, _cmd_size: usize);
    fn ibv_cmd_modify_wq(_wq: P, _attr: P, _cmd: P, _cmd_size: usize);
    fn ibv_cmd_open_qp(_context: P, _qp: P, _vqp_sz: c_int, _attr: P, _cmd: P, _cmd_size: usize, _resp: P, _resp_size: usize);
    fn ibv_cmd_open_xrcd(_context: P, _xrcd: P, _vxrcd_size: c_int, _attr: P, _cmd: P, _cmd_size: usize, _resp: P, _resp_size: usize);
    fn ibv_cmd_query_context(_ctx: P, _driver: P);
    fn ibv_cmd_query_device_any(_context: P, _input: P, _attr: P, _attr_size: usize, _resp: P, _resp_size: *mut usize);
    fn ibv_cmd_query_mr(_pd: P, _vmr: P, _mr_handle: u32);
    fn ibv_cmd_query_port(_context: P, _port_num: u8, _port_attr: P, _cmd: P, _cmd_size: usize);
    fn ibv_cmd_query_qp(_qp: P, _qp_attr: P, _attr_mask: c_int, _qp_init_attr: P, _cmd: P, _cmd_size: usize);
    fn ibv_cmd_query_srq(_srq: P, _srq_attr: P, _cmd: P, _cmd_size: usize);
    fn ibv_cmd_read_counters(_vcounters: P, _counters_value: *mut u64, _ncounters: u32, _flags: u32, _link: P);
    fn ibv_cmd_reg_dm_mr(_pd: P, _dm: P, _offset: u64, _length: usize, _access: c_uint, _vmr: P, _link: P);
    fn ibv_cmd_reg_dmabuf_mr(_pd: P, _offset: u64, _length: usize, _iova: u64, _fd: c_int, _access: c_int, _vmr: P);
    fn ibv_cmd_reg_mr(_pd: P, _addr: P, _length: usize, _hca_va: u64, _access: c_int, _vmr: P, _cmd: P, _cmd_size: usize, _resp: P, _resp_size: usize);
    fn ibv_cmd_req_notify_cq(_cq: P, _solicited_only: c_int);
    fn ibv_cmd_rereg_mr(_vmr: P, _flags: u32, _addr: P, _length: usize, _hca_va: u64, _access: c_int, _pd: P, _cmd: P, _cmd_sz: usize, _resp: P, _resp_sz: usize);
    fn ibv_cmd_resize_cq(_cq: P, _cqe: c_int, _cmd: P, _cmd_size: usize, _resp: P, _resp_size: usize);
}

/// `ibv_cmd_poll_cq(cq, ne, wc)`: returns a completion count, so failure
/// is -1 (errno EOPNOTSUPP), as rdma-core's own failure path; a positive
/// errno would read as completions.
#[no_mangle]
pub extern "C" fn ibv_cmd_poll_cq(_cq: *mut c_void, _ne: c_int, _wc: *mut c_void) -> c_int {
    set_errno(EOPNOTSUPP);
    -1
}

/// Report the first WR as not posted (`*bad_wr = wr`), then EOPNOTSUPP.
///
/// # Safety
/// `bad_wr` is NULL or valid for a pointer write.
unsafe fn post_unsupported(wr: *mut c_void, bad_wr: *mut *mut c_void) -> c_int {
    if !bad_wr.is_null() {
        // SAFETY: non-NULL and valid per this function's contract.
        unsafe { *bad_wr = wr };
    }
    eopnotsupp()
}

/// Defines the `ibv_cmd_post_*` entry points: nothing posted, the first
/// WR reported (`*bad_wr = wr`), EOPNOTSUPP.
macro_rules! cmd_post_unsupported {
    ($( fn $name:ident($queue:ident); )*) => {
        $(
            #[doc = concat!("`", stringify!($name), "`: nothing posted; `*bad_wr = wr`, EOPNOTSUPP.")]
            ///
            /// # Safety
            /// `bad_wr` is NULL or writable.
            #[no_mangle]
            pub unsafe extern "C" fn $name(
                $queue: *mut c_void,
                wr: *mut c_void,
                bad_wr: *mut *mut c_void,
            ) -> c_int {
                // SAFETY: per the contract.
                unsafe { post_unsupported(wr, bad_wr) }
            }
        )*
    };
}

cmd_post_unsupported! {
    fn ibv_cmd_post_send(_qp);
    fn ibv_cmd_post_recv(_qp);
    fn ibv_cmd_post_srq_recv(_srq);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    fn s(p: *const c_char) -> &'static str {
        // SAFETY: the helpers return pointers to static C strings.
        unsafe { CStr::from_ptr(p) }.to_str().unwrap()
    }

    #[test]
    fn enum_strings_match_rdma_core() {
        assert_eq!(s(ibv_wc_status_str(0)), "success");
        assert_eq!(s(ibv_wc_status_str(12)), "transport retry counter exceeded");
        assert_eq!(s(ibv_wc_status_str(23)), "TM software rendezvous");
        assert_eq!(s(ibv_wc_status_str(24)), "unknown");
        assert_eq!(s(ibv_wc_status_str(-1)), "unknown");
        assert_eq!(s(ibv_node_type_str(0)), "unknown");
        assert_eq!(s(ibv_node_type_str(-1)), "unknown");
        assert_eq!(s(ibv_node_type_str(1)), "InfiniBand channel adapter");
        assert_eq!(s(ibv_node_type_str(7)), "unspecified");
        assert_eq!(s(ibv_port_state_str(4)), "active");
        assert_eq!(s(ibv_port_state_str(6)), "unknown");
        assert_eq!(s(ibv_event_type_str(19)), "WQ fatal");
        assert_eq!(s(ibv_event_type_str(20)), "unknown");
        assert_eq!(s(ibv_get_sysfs_path()), "/sys");
    }

    #[test]
    fn rates_round_trip() {
        for &(r, m) in &RATE_MULT {
            assert_eq!(ibv_rate_to_mult(r), m);
            assert_eq!(mult_to_ibv_rate(m), r);
        }
        for &(r, mbps) in &RATE_MBPS {
            assert_eq!(ibv_rate_to_mbps(r), mbps);
            assert_eq!(mbps_to_ibv_rate(mbps), r);
        }
        assert_eq!(ibv_rate_to_mult(rate::R14), -1);
        assert_eq!(ibv_rate_to_mbps(rate::MAX), -1);
        assert_eq!(mult_to_ibv_rate(3), rate::MAX);
        assert_eq!(mbps_to_ibv_rate(1), rate::MAX);
        assert_eq!(ibv_rate_to_mbps(rate::R100), 103125);
    }

    #[test]
    fn unsupported_sets_errno() {
        set_errno(0);
        assert!(verbs_open_device(ptr::null_mut(), ptr::null_mut()).is_null());
        // SAFETY: reading this thread's errno.
        assert_eq!(unsafe { *libc::__errno_location() }, EOPNOTSUPP);
        // SAFETY: a NULL QP (refused without being read).
        let rc = unsafe { ibv_attach_mcast(ptr::null_mut(), ptr::null(), 0) };
        assert_eq!(rc, EOPNOTSUPP);
        assert_eq!(ibv_cmd_poll_cq(ptr::null_mut(), 1, ptr::null_mut()), -1);
        let wr = 0x1000 as *mut c_void;
        let mut bad = ptr::null_mut();
        // SAFETY: `bad` is a valid slot.
        let rc = unsafe { ibv_cmd_post_send(ptr::null_mut(), wr, &mut bad) };
        assert_eq!(rc, EOPNOTSUPP);
        assert_eq!(bad, wr);
        // SAFETY: NULL pointers are refused before use.
        let rc = unsafe { ibv_read_sysfs_file(ptr::null(), ptr::null(), ptr::null_mut(), 0) };
        assert_eq!(rc, -1);
        let mut buf = [0 as c_char; 8];
        // SAFETY: NUL-terminated names; buf holds 8 bytes.
        let n = unsafe {
            ibv_read_sysfs_file(
                c"/proc/sys/kernel".as_ptr(),
                c"ostype".as_ptr(),
                buf.as_mut_ptr(),
                8,
            )
        };
        assert_eq!(n, 5, "\"Linux\\n\" without its newline");
        // SAFETY: the call NUL-terminated it.
        assert_eq!(unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }, c"Linux");
        assert_eq!(ibv_is_fork_initialized(), IBV_FORK_UNNEEDED);
    }

    #[test]
    fn copy_path_rec_round_trip() {
        // SAFETY: all-zero is a valid value of these plain-data structs.
        let mut k: UserPathRec = unsafe { std::mem::zeroed() };
        k.dgid = [7; 16];
        k.sgid[0] = 0xfe;
        k.dlid = 0x1234;
        k.flow_label = 0xabcdef;
        k.reversible = 1;
        k.mtu = 5;
        k.pkey = 0xffff;
        k.packet_life_time_selector = 2;
        k.preference = 9;
        // SAFETY: as above.
        let mut u: IbvSaPathRec = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut back: UserPathRec = unsafe { std::mem::zeroed() };
        // SAFETY: valid, distinct structs of the documented types.
        unsafe {
            ibv_copy_path_rec_from_kern(
                (&mut u as *mut IbvSaPathRec).cast(),
                (&k as *const UserPathRec).cast(),
            );
            ibv_copy_path_rec_to_kern(
                (&mut back as *mut UserPathRec).cast(),
                (&u as *const IbvSaPathRec).cast(),
            );
        }
        assert_eq!(u.dgid.raw, [7; 16]);
        assert_eq!(
            (u.mtu, u.pkey, u.reversible, u.preference),
            (5, 0xffff, 1, 9)
        );
        assert_eq!(back.dgid, k.dgid);
        assert_eq!(back.sgid, k.sgid);
        assert_eq!(
            (back.dlid, back.flow_label, back.mtu),
            (0x1234, 0xabcdef, 5)
        );
        assert_eq!(back.packet_life_time_selector, 2);
        // NULL arguments are ignored, not dereferenced.
        // SAFETY: NULL is handled by the function.
        unsafe { ibv_copy_path_rec_to_kern(ptr::null_mut(), ptr::null()) };
    }

    #[test]
    fn copy_qp_attr_from_kern_copies_fields() {
        // SAFETY: all-zero is a valid value of these plain-data structs.
        let mut k: UverbsQpAttr = unsafe { std::mem::zeroed() };
        k.qp_state = 3;
        k.cur_qp_state = 2;
        k.dest_qp_num = 0x11;
        k.max_inline_data = 64;
        k.ah_attr.dlid = 9;
        k.ah_attr.grh.dgid = [1; 16];
        k.alt_ah_attr.port_num = 2;
        k.alt_timeout = 14;
        // SAFETY: as above.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        // SAFETY: valid, distinct structs of the documented types.
        unsafe {
            ibv_copy_qp_attr_from_kern(
                (&mut a as *mut ibv_qp_attr).cast(),
                (&k as *const UverbsQpAttr).cast(),
            )
        };
        assert_eq!(a.qp_state, 0, "rdma-core does not copy qp_state");
        assert_eq!(a.cur_qp_state, 2);
        assert_eq!(a.dest_qp_num, 0x11);
        assert_eq!(a.cap.max_inline_data, 64);
        assert_eq!(a.ah_attr.dlid, 9);
        assert_eq!(a.ah_attr.grh.dgid.raw, [1; 16]);
        assert_eq!(a.alt_ah_attr.port_num, 2);
        assert_eq!(a.alt_timeout, 14);
    }

    #[test]
    fn final_num_attrs_walks_links() {
        // Two linked command-buffer heads with 2 and 3 filled attrs; words
        // 0 and 1 are `next` and `next_attr`.
        let mut b1 = [0u64; 16];
        let mut b2 = [0u64; 16];
        let base1 = b1.as_ptr() as usize;
        let base2 = b2.as_ptr() as usize;
        b1[0] = base2 as u64;
        b1[1] = (base1 + ATTRS_OFFSET + 2 * UVERBS_ATTR_SIZE) as u64;
        b2[1] = (base2 + ATTRS_OFFSET + 3 * UVERBS_ATTR_SIZE) as u64;
        // SAFETY: both buffers are live and laid out as command buffer heads.
        let n = unsafe { __ioctl_final_num_attrs(4, b1.as_ptr().cast()) };
        std::hint::black_box(&b2);
        assert_eq!(n, 9);
        // SAFETY: NULL link is the common case.
        assert_eq!(unsafe { __ioctl_final_num_attrs(4, ptr::null()) }, 4);
    }
}
