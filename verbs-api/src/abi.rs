//! The structs of rdma-core 44's `<infiniband/verbs.h>` that cross the C
//! boundary, with the header's names. C enums are `u32` (programs pass
//! values an enum would not know), `pthread_*` come from `libc` so the
//! per-architecture sizes follow, and every layout is pinned by the
//! assertions at the bottom (x86_64 and aarch64 values measured in
//! ../shared/docs/libibverbs-abi.md §4) and by a test that compiles a C
//! probe against the installed header.

#![allow(non_camel_case_types, missing_docs)]

pub mod convert;

use libc::{pthread_cond_t, pthread_mutex_t};
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::mem::{offset_of, size_of};

pub type PollCqFn = unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int;
pub type ReqNotifyCqFn = unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int;
pub type PostSendFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int;
pub type PostRecvFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;
pub type PostSrqRecvFn =
    unsafe extern "C" fn(*mut ibv_srq, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;
/// `ibv_reg_dm_mr`'s op.
pub type RegDmMrFn =
    unsafe extern "C" fn(*mut ibv_pd, *mut ibv_dm, u64, usize, c_uint) -> *mut ibv_mr;
/// `ibv_alloc_dm`'s op.
pub type AllocDmFn = unsafe extern "C" fn(*mut ibv_context, *mut ibv_alloc_dm_attr) -> *mut ibv_dm;
/// `ibv_free_dm`'s op.
pub type FreeDmFn = unsafe extern "C" fn(*mut ibv_dm) -> c_int;
/// `ibv_dm.memcpy_to_dm`.
pub type MemcpyToDmFn = unsafe extern "C" fn(*mut ibv_dm, u64, *const c_void, usize) -> c_int;
/// `ibv_dm.memcpy_from_dm`.
pub type MemcpyFromDmFn = unsafe extern "C" fn(*mut c_void, *mut ibv_dm, u64, usize) -> c_int;

/// `struct ibv_dm`: the copy functions are called by verbs.h's inline
/// `ibv_memcpy_to_dm`/`from_dm` through these pointers.
#[repr(C)]
pub struct ibv_dm {
    pub context: *mut ibv_context,
    pub memcpy_to_dm: Option<MemcpyToDmFn>,
    pub memcpy_from_dm: Option<MemcpyFromDmFn>,
    pub comp_mask: u32,
    pub handle: u32,
}

/// `struct ibv_alloc_dm_attr`.
#[repr(C)]
pub struct ibv_alloc_dm_attr {
    pub length: usize,
    pub log_align_req: u32,
    pub comp_mask: u32,
}

const _: () = assert!(std::mem::size_of::<ibv_dm>() == 32);
const _: () = assert!(std::mem::size_of::<ibv_alloc_dm_attr>() == 16);

/// `ibv_advise_mr`'s op (`verbs_context`).
pub type AdviseMrFn = unsafe extern "C" fn(*mut ibv_pd, u32, u32, *mut ibv_sge, u32) -> c_int;
pub type QueryPortFn =
    unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr, usize) -> c_int;
pub type QueryDeviceExFn =
    unsafe extern "C" fn(*mut ibv_context, *const c_void, *mut ibv_device_attr_ex, usize) -> c_int;

pub const IBV_SYSFS_NAME_MAX: usize = 64;
/// `enum ibv_odp_general_caps` and `enum ibv_odp_transport_cap_bits`.
pub const IBV_ODP_SUPPORT: u32 = 1;
pub const IBV_ODP_SUPPORT_IMPLICIT: u32 = 1 << 1;
pub const IBV_ODP_SUPPORT_SEND: u32 = 1;
pub const IBV_ODP_SUPPORT_RECV: u32 = 1 << 1;
pub const IBV_ODP_SUPPORT_WRITE: u32 = 1 << 2;
pub const IBV_ODP_SUPPORT_READ: u32 = 1 << 3;
pub const IBV_ODP_SUPPORT_ATOMIC: u32 = 1 << 4;
pub const IBV_ODP_SUPPORT_SRQ_RECV: u32 = 1 << 5;
/// `enum ibv_advise_mr_advice` and `IBV_ADVISE_MR_FLAG_FLUSH`.
pub const IBV_ADVISE_MR_ADVICE_PREFETCH: u32 = 0;
pub const IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE: u32 = 1;
pub const IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT: u32 = 2;
pub const IBV_ADVISE_MR_FLAG_FLUSH: u32 = 1;
/// `IBV_DEVICE_MEM_WINDOW` in `device_cap_flags`.
pub const IBV_DEVICE_MEM_WINDOW: c_uint = 1 << 17;
/// `IBV_DEVICE_XRC` in `device_cap_flags`.
pub const IBV_DEVICE_XRC: c_uint = 1 << 20;
/// `IBV_DEVICE_MEM_WINDOW_TYPE_2B` in `device_cap_flags`.
pub const IBV_DEVICE_MEM_WINDOW_TYPE_2B: c_uint = 1 << 24;
pub const IBV_SYSFS_PATH_MAX: usize = 256;

#[repr(C)]
pub struct ibv_device {
    pub _ops: [*const c_void; 2],
    pub node_type: u32,
    pub transport_type: u32,
    pub name: [c_char; IBV_SYSFS_NAME_MAX],
    pub dev_name: [c_char; IBV_SYSFS_NAME_MAX],
    pub dev_path: [c_char; IBV_SYSFS_PATH_MAX],
    pub ibdev_path: [c_char; IBV_SYSFS_PATH_MAX],
}

/// `ibv_alloc_mw`'s op (verbs.h's inline wrapper calls it).
pub type AllocMwFn = unsafe extern "C" fn(*mut ibv_pd, u32) -> *mut ibv_mw;
/// `ibv_bind_mw`'s op.
pub type BindMwFn = unsafe extern "C" fn(*mut ibv_qp, *mut ibv_mw, *mut ibv_mw_bind) -> c_int;
/// `ibv_dealloc_mw`'s op.
pub type DeallocMwFn = unsafe extern "C" fn(*mut ibv_mw) -> c_int;

/// `struct ibv_context_ops`: 32 slots; the ones verbs.h's inline wrappers
/// call (data path, memory windows) are typed, the rest stay NULL
/// (`_compat_*`).
#[repr(C)]
pub struct ibv_context_ops {
    pub _compat_slots0: [*const c_void; 7],
    pub alloc_mw: Option<AllocMwFn>,
    pub bind_mw: Option<BindMwFn>,
    pub dealloc_mw: Option<DeallocMwFn>,
    pub _compat_create_cq: *const c_void,
    pub poll_cq: Option<PollCqFn>,
    pub req_notify_cq: Option<ReqNotifyCqFn>,
    pub _compat_slots1: [*const c_void; 7],
    pub post_srq_recv: Option<PostSrqRecvFn>,
    pub _compat_slots2: [*const c_void; 4],
    pub post_send: Option<PostSendFn>,
    pub post_recv: Option<PostRecvFn>,
    pub _compat_slots3: [*const c_void; 5],
}

#[repr(C)]
pub struct ibv_context {
    pub device: *mut ibv_device,
    pub ops: ibv_context_ops,
    pub cmd_fd: c_int,
    pub async_fd: c_int,
    pub num_comp_vectors: c_int,
    pub mutex: pthread_mutex_t,
    pub abi_compat: *mut c_void,
}

/// `struct verbs_context`: the extended ops sit in front of the
/// `ibv_context` at fixed negative offsets ("grows up").
#[repr(C)]
pub struct verbs_context {
    pub query_port: Option<QueryPortFn>,
    pub advise_mr: Option<AdviseMrFn>,
    /// alloc_null_mr .. destroy_counters: not supported (NULL: EOPNOTSUPP).
    pub _unsupported0a: [*const c_void; 5],
    pub reg_dm_mr: Option<RegDmMrFn>,
    pub alloc_dm: Option<AllocDmFn>,
    pub free_dm: Option<FreeDmFn>,
    /// modify_flow_action_esp .. modify_qp_rate_limit: not supported.
    pub _unsupported0: [*const c_void; 4],
    pub alloc_parent_domain: Option<AllocParentDomainFn>,
    /// dealloc_td, alloc_td, modify_cq: not supported (NULL: EOPNOTSUPP).
    pub _unsupported0b: [*const c_void; 3],
    pub post_srq_ops: Option<PostSrqOpsFn>,
    /// destroy_rwq_ind_table .. create_wq: not supported.
    pub _unsupported0c: [*const c_void; 5],
    pub query_rt_values: Option<QueryRtValuesFn>,
    pub create_cq_ex: Option<CreateCqExFn>,
    pub priv_: *mut c_void,
    pub query_device_ex: Option<QueryDeviceExFn>,
    /// ibv_destroy_flow, ABI_placeholder2, ibv_create_flow,
    /// ABI_placeholder1, open_qp.
    pub _unsupported1: [*const c_void; 5],
    pub create_qp_ex: Option<CreateQpExFn>,
    pub get_srq_num: Option<GetSrqNumFn>,
    pub create_srq_ex: Option<CreateSrqExFn>,
    pub open_xrcd: Option<OpenXrcdFn>,
    pub close_xrcd: Option<CloseXrcdFn>,
    pub _abi_placeholder3: u64,
    pub sz: usize,
    pub context: ibv_context,
}

#[repr(C)]
pub struct ibv_pd {
    pub context: *mut ibv_context,
    pub handle: u32,
}

/// `struct ibv_mw`.
#[repr(C)]
pub struct ibv_mw {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub rkey: u32,
    pub handle: u32,
    /// `enum ibv_mw_type`: 1 or 2.
    pub type_: u32,
}

/// `struct ibv_mw_bind_info`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_mw_bind_info {
    pub mr: *mut ibv_mr,
    pub addr: u64,
    pub length: u64,
    pub mw_access_flags: c_uint,
}

/// `struct ibv_mw_bind` (`ibv_bind_mw`'s argument).
#[repr(C)]
pub struct ibv_mw_bind {
    pub wr_id: u64,
    pub send_flags: c_uint,
    pub bind_info: ibv_mw_bind_info,
}

/// The `bind_mw` member of `ibv_send_wr`'s second union (IBV_WR_BIND_MW).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr_bind_mw {
    pub mw: *mut ibv_mw,
    pub rkey: u32,
    pub bind_info: ibv_mw_bind_info,
}

#[repr(C)]
pub struct ibv_mr {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

#[repr(C)]
pub struct ibv_comp_channel {
    pub context: *mut ibv_context,
    pub fd: c_int,
    pub refcnt: c_int,
}

#[repr(C)]
pub struct ibv_cq {
    pub context: *mut ibv_context,
    pub channel: *mut ibv_comp_channel,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub comp_events_completed: u32,
    pub async_events_completed: u32,
}

/// `struct ibv_parent_domain_init_attr`.
#[repr(C)]
pub struct ibv_parent_domain_init_attr {
    pub pd: *mut ibv_pd,
    pub td: *mut c_void,
    pub comp_mask: u32,
    pub alloc: *const c_void,
    pub free: *const c_void,
    pub pd_context: *mut c_void,
}

pub type AllocParentDomainFn =
    unsafe extern "C" fn(*mut ibv_context, *mut ibv_parent_domain_init_attr) -> *mut ibv_pd;

pub const IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS: u32 = 1 << 0;
pub const IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT: u32 = 1 << 1;

/// `struct ibv_cq_ex`: an `ibv_cq` (same leading members, so
/// `ibv_cq_ex_to_cq` is a cast) followed by the polling state and the
/// function pointers `ibv_start_poll`/`ibv_next_poll`/`ibv_end_poll` and the
/// `ibv_wc_read_*` inline functions call.
#[repr(C)]
pub struct ibv_cq_ex {
    pub context: *mut ibv_context,
    pub channel: *mut ibv_comp_channel,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub comp_events_completed: u32,
    pub async_events_completed: u32,
    pub comp_mask: u32,
    pub status: u32,
    pub wr_id: u64,
    pub start_poll: Option<unsafe extern "C" fn(*mut ibv_cq_ex, *mut ibv_poll_cq_attr) -> c_int>,
    pub next_poll: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> c_int>,
    pub end_poll: Option<unsafe extern "C" fn(*mut ibv_cq_ex)>,
    pub read_opcode: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    pub read_vendor_err: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    pub read_byte_len: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    pub read_imm_data: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    pub read_qp_num: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    pub read_src_qp: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    pub read_wc_flags: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> c_uint>,
    pub read_slid: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    pub read_sl: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u8>,
    pub read_dlid_path_bits: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u8>,
    pub read_completion_ts: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u64>,
    pub read_cvlan: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u16>,
    pub read_flow_tag: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    pub read_tm_info: Option<unsafe extern "C" fn(*mut ibv_cq_ex, *mut ibv_wc_tm_info)>,
    pub read_completion_wallclock_ns: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u64>,
}

/// `struct ibv_poll_cq_attr`.
#[repr(C)]
pub struct ibv_poll_cq_attr {
    pub comp_mask: u32,
}

/// `struct ibv_cq_init_attr_ex`.
#[repr(C)]
pub struct ibv_cq_init_attr_ex {
    pub cqe: u32,
    pub cq_context: *mut c_void,
    pub channel: *mut ibv_comp_channel,
    pub comp_vector: u32,
    pub wc_flags: u64,
    pub comp_mask: u32,
    pub flags: u32,
    pub parent_domain: *mut ibv_pd,
}

pub type CreateCqExFn =
    unsafe extern "C" fn(*mut ibv_context, *mut ibv_cq_init_attr_ex) -> *mut ibv_cq_ex;

pub const IBV_WC_EX_WITH_BYTE_LEN: u64 = 1 << 0;
pub const IBV_WC_EX_WITH_IMM: u64 = 1 << 1;
pub const IBV_WC_EX_WITH_QP_NUM: u64 = 1 << 2;
pub const IBV_WC_EX_WITH_SRC_QP: u64 = 1 << 3;
pub const IBV_WC_EX_WITH_SLID: u64 = 1 << 4;
pub const IBV_WC_EX_WITH_SL: u64 = 1 << 5;
pub const IBV_WC_EX_WITH_DLID_PATH_BITS: u64 = 1 << 6;
pub const IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK: u64 = 1 << 11;
pub const IBV_WC_STANDARD_FLAGS: u64 = 0x7f;
pub const IBV_CQ_INIT_ATTR_MASK_FLAGS: u32 = 1 << 0;
pub const IBV_CQ_INIT_ATTR_MASK_PD: u32 = 1 << 1;

#[repr(C)]
pub struct ibv_srq {
    pub context: *mut ibv_context,
    pub srq_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub handle: u32,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub events_completed: u32,
}

#[repr(C)]
pub struct ibv_qp {
    pub context: *mut ibv_context,
    pub qp_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub handle: u32,
    pub qp_num: u32,
    pub state: u32,
    pub qp_type: u32,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub events_completed: u32,
}

#[repr(C)]
pub struct ibv_ah {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub handle: u32,
}

/// `union ibv_gid`: 16 bytes, 8-aligned (its `global` view holds two
/// `__be64`), which shifts the structs that embed it.
#[repr(C, align(8))]
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct ibv_gid {
    pub raw: [u8; 16],
}

#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct ibv_global_route {
    pub dgid: ibv_gid,
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct ibv_ah_attr {
    pub grh: ibv_global_route,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct ibv_qp_cap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct ibv_qp_attr {
    pub qp_state: u32,
    pub cur_qp_state: u32,
    pub path_mtu: u32,
    pub path_mig_state: u32,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: c_uint,
    pub cap: ibv_qp_cap,
    pub ah_attr: ibv_ah_attr,
    pub alt_ah_attr: ibv_ah_attr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_qp_init_attr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub cap: ibv_qp_cap,
    pub qp_type: u32,
    pub sq_sig_all: c_int,
}

/// `struct ibv_qp_init_attr_ex`: the `ibv_qp_init_attr` prefix, then the
/// extended members (`comp_mask` says which are valid).
#[repr(C)]
pub struct ibv_qp_init_attr_ex {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub cap: ibv_qp_cap,
    pub qp_type: u32,
    pub sq_sig_all: c_int,
    pub comp_mask: u32,
    pub pd: *mut ibv_pd,
    pub xrcd: *mut c_void,
    pub create_flags: u32,
    pub max_tso_header: u16,
    pub rwq_ind_tbl: *mut c_void,
    /// `struct ibv_rx_hash_conf` (RSS, not supported).
    pub rx_hash_conf: [u64; 3],
    pub source_qpn: u32,
    pub send_ops_flags: u64,
}

pub type CreateQpExFn =
    unsafe extern "C" fn(*mut ibv_context, *mut ibv_qp_init_attr_ex) -> *mut ibv_qp;
pub type CreateSrqExFn =
    unsafe extern "C" fn(*mut ibv_context, *mut ibv_srq_init_attr_ex) -> *mut ibv_srq;
pub type QueryRtValuesFn = unsafe extern "C" fn(*mut ibv_context, *mut ibv_values_ex) -> c_int;

/// `struct ibv_values_ex` (`ibv_query_rt_values_ex`).
#[repr(C)]
pub struct ibv_values_ex {
    pub comp_mask: u32,
    pub raw_clock: libc::timespec,
}

pub const IBV_VALUES_MASK_RAW_CLOCK: u32 = 1;
/// `IBV_WC_EX_WITH_COMPLETION_TIMESTAMP`: the device clock's ticks.
pub const IBV_WC_EX_WITH_COMPLETION_TIMESTAMP: u64 = 1 << 7;

pub type GetSrqNumFn = unsafe extern "C" fn(*mut ibv_srq, *mut u32) -> c_int;
pub type OpenXrcdFn =
    unsafe extern "C" fn(*mut ibv_context, *mut ibv_xrcd_init_attr) -> *mut ibv_xrcd;
pub type CloseXrcdFn = unsafe extern "C" fn(*mut ibv_xrcd) -> c_int;

/// `struct ibv_xrcd`.
#[repr(C)]
pub struct ibv_xrcd {
    pub context: *mut ibv_context,
}

/// `struct ibv_xrcd_init_attr`.
#[repr(C)]
pub struct ibv_xrcd_init_attr {
    pub comp_mask: u32,
    pub fd: c_int,
    pub oflags: c_int,
}

pub const IBV_XRCD_INIT_ATTR_FD: u32 = 1 << 0;
pub const IBV_XRCD_INIT_ATTR_OFLAGS: u32 = 1 << 1;
pub const IBV_SRQT_XRC: u32 = 1;
pub const IBV_SRQ_INIT_ATTR_XRCD: u32 = 1 << 2;
pub const IBV_QP_INIT_ATTR_XRCD: u32 = 1 << 1;
pub const IBV_QPT_XRC_SEND: u32 = 9;
pub const IBV_QPT_XRC_RECV: u32 = 10;

/// `struct ibv_data_buf` (inline data lists of the `ibv_wr_*` API).
#[repr(C)]
pub struct ibv_data_buf {
    pub addr: *mut c_void,
    pub length: usize,
}

/// `struct ibv_qp_ex`: an `ibv_qp` followed by the new post-send API's
/// function pointers (`ibv_wr_*` are inline calls through them).
#[repr(C)]
pub struct ibv_qp_ex {
    pub qp_base: ibv_qp,
    pub comp_mask: u64,
    pub wr_id: u64,
    pub wr_flags: c_uint,
    pub wr_atomic_cmp_swp: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u64, u64)>,
    pub wr_atomic_fetch_add: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u64)>,
    pub wr_bind_mw:
        Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut ibv_mw, u32, *const ibv_mw_bind_info)>,
    pub wr_local_inv: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
    pub wr_rdma_read: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64)>,
    pub wr_rdma_write: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64)>,
    pub wr_rdma_write_imm: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u32)>,
    pub wr_send: Option<unsafe extern "C" fn(*mut ibv_qp_ex)>,
    pub wr_send_imm: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
    pub wr_send_inv: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
    pub wr_send_tso: *const c_void,
    pub wr_set_ud_addr: Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut ibv_ah, u32, u32)>,
    pub wr_set_xrc_srqn: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
    pub wr_set_inline_data: Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut c_void, usize)>,
    pub wr_set_inline_data_list:
        Option<unsafe extern "C" fn(*mut ibv_qp_ex, usize, *const ibv_data_buf)>,
    pub wr_set_sge: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u32)>,
    pub wr_set_sge_list: Option<unsafe extern "C" fn(*mut ibv_qp_ex, usize, *const ibv_sge)>,
    pub wr_start: Option<unsafe extern "C" fn(*mut ibv_qp_ex)>,
    pub wr_complete: Option<unsafe extern "C" fn(*mut ibv_qp_ex) -> c_int>,
    pub wr_abort: Option<unsafe extern "C" fn(*mut ibv_qp_ex)>,
    pub wr_atomic_write: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, *const c_void)>,
}

#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct ibv_srq_attr {
    pub max_wr: u32,
    pub max_sge: u32,
    pub srq_limit: u32,
}

#[repr(C)]
pub struct ibv_srq_init_attr {
    pub srq_context: *mut c_void,
    pub attr: ibv_srq_attr,
}

#[repr(C)]
pub struct ibv_srq_init_attr_ex {
    pub srq_context: *mut c_void,
    pub attr: ibv_srq_attr,
    pub comp_mask: u32,
    pub srq_type: u32,
    pub pd: *mut ibv_pd,
    pub xrcd: *mut c_void,
    pub cq: *mut ibv_cq,
    /// struct ibv_tm_cap (max_num_tags, max_ops).
    pub tm_cap: [u32; 2],
}

pub const IBV_SRQ_INIT_ATTR_TYPE: u32 = 1 << 0;
pub const IBV_SRQ_INIT_ATTR_PD: u32 = 1 << 1;
pub const IBV_SRQ_INIT_ATTR_CQ: u32 = 1 << 3;
pub const IBV_SRQT_BASIC: u32 = 0;
pub const IBV_SRQT_TM: u32 = 2;
pub const IBV_SRQ_INIT_ATTR_TM: u32 = 1 << 4;

/// `struct ibv_wc_tm_info`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_wc_tm_info {
    pub tag: u64,
    pub priv_: u32,
}

pub const IBV_WC_EX_WITH_TM_INFO: u64 = 1 << 10;
pub const IBV_TM_CAP_RC: u32 = 1;

/// `struct ibv_ops_wr` (`ibv_post_srq_ops`).
#[repr(C)]
pub struct ibv_ops_wr {
    pub wr_id: u64,
    pub next: *mut ibv_ops_wr,
    /// `enum ibv_ops_wr_opcode`.
    pub opcode: u32,
    /// `enum ibv_ops_flags`.
    pub flags: c_int,
    /// `tm.unexpected_cnt`.
    pub tm_unexpected_cnt: u32,
    /// `tm.handle`: DEL's input, ADD's output.
    pub tm_handle: u32,
    /// `tm.add.recv_wr_id` .. `tm.add.mask`.
    pub add_recv_wr_id: u64,
    pub add_sg_list: *mut ibv_sge,
    pub add_num_sge: c_int,
    pub add_tag: u64,
    pub add_mask: u64,
}

pub const IBV_WR_TAG_ADD: u32 = 0;
pub const IBV_WR_TAG_DEL: u32 = 1;
pub const IBV_WR_TAG_SYNC: u32 = 2;
pub const IBV_OPS_SIGNALED: c_int = 1;
pub const IBV_OPS_TM_SYNC: c_int = 1 << 1;

pub type PostSrqOpsFn =
    unsafe extern "C" fn(*mut ibv_srq, *mut ibv_ops_wr, *mut *mut ibv_ops_wr) -> c_int;

#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct ibv_sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr_rdma {
    pub remote_addr: u64,
    pub rkey: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr_atomic {
    pub remote_addr: u64,
    pub compare_add: u64,
    pub swap: u64,
    pub rkey: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr_ud {
    pub ah: *mut ibv_ah,
    pub remote_qpn: u32,
    pub remote_qkey: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_send_wr_wr {
    pub rdma: ibv_send_wr_rdma,
    pub atomic: ibv_send_wr_atomic,
    pub ud: ibv_send_wr_ud,
}

#[repr(C)]
pub struct ibv_send_wr {
    pub wr_id: u64,
    pub next: *mut ibv_send_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
    pub opcode: u32,
    pub send_flags: c_uint,
    /// `imm_data` (big-endian as on the wire) or `invalidate_rkey`.
    pub imm_data: u32,
    pub wr: ibv_send_wr_wr,
    /// `qp_type.xrc.remote_srqn`.
    pub remote_srqn: u32,
    /// `bind_mw` ([`ibv_send_wr::bind_mw`]) / `tso` (not supported).
    pub _bind_mw_or_tso: [u64; 6],
}

impl ibv_send_wr {
    /// The union's `bind_mw` member (meaningful for IBV_WR_BIND_MW).
    pub fn bind_mw(&self) -> ibv_send_wr_bind_mw {
        // SAFETY: the union is 48 bytes, 8-aligned, and bind_mw is one of
        // its members (asserted below); any bit pattern is a valid
        // ibv_send_wr_bind_mw (pointers and integers).
        unsafe { std::ptr::read(self._bind_mw_or_tso.as_ptr().cast::<ibv_send_wr_bind_mw>()) }
    }
}

const _: () = assert!(std::mem::size_of::<ibv_send_wr_bind_mw>() == 48);
const _: () = assert!(std::mem::align_of::<ibv_send_wr_bind_mw>() <= 8);
const _: () = assert!(std::mem::size_of::<ibv_mw>() == 32);
const _: () = assert!(std::mem::size_of::<ibv_mw_bind>() == 48);

#[repr(C)]
pub struct ibv_recv_wr {
    pub wr_id: u64,
    pub next: *mut ibv_recv_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct ibv_wc {
    pub wr_id: u64,
    pub status: u32,
    pub opcode: u32,
    pub vendor_err: u32,
    pub byte_len: u32,
    /// `imm_data` or `invalidated_rkey`.
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: c_uint,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct ibv_port_attr {
    pub state: u32,
    pub max_mtu: u32,
    pub active_mtu: u32,
    pub gid_tbl_len: c_int,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: u8,
    pub flags: u8,
    pub port_cap_flags2: u16,
}

/// What the exported `ibv_query_port@IBVERBS_1.1` writes: the port
/// attributes without `port_cap_flags2` (48 bytes).
pub const COMPAT_PORT_ATTR_SIZE: usize = 48;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_device_attr {
    pub fw_ver: [c_char; 64],
    pub node_guid: u64,
    pub sys_image_guid: u64,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_qp: c_int,
    pub max_qp_wr: c_int,
    pub device_cap_flags: c_uint,
    pub max_sge: c_int,
    pub max_sge_rd: c_int,
    pub max_cq: c_int,
    pub max_cqe: c_int,
    pub max_mr: c_int,
    pub max_pd: c_int,
    pub max_qp_rd_atom: c_int,
    pub max_ee_rd_atom: c_int,
    pub max_res_rd_atom: c_int,
    pub max_qp_init_rd_atom: c_int,
    pub max_ee_init_rd_atom: c_int,
    pub atomic_cap: u32,
    pub max_ee: c_int,
    pub max_rdd: c_int,
    pub max_mw: c_int,
    pub max_raw_ipv6_qp: c_int,
    pub max_raw_ethy_qp: c_int,
    pub max_mcast_grp: c_int,
    pub max_mcast_qp_attach: c_int,
    pub max_total_mcast_qp_attach: c_int,
    pub max_ah: c_int,
    pub max_fmr: c_int,
    pub max_map_per_fmr: c_int,
    pub max_srq: c_int,
    pub max_srq_wr: c_int,
    pub max_srq_sge: c_int,
    pub max_pkeys: u16,
    pub local_ca_ack_delay: u8,
    pub phys_port_cnt: u8,
}

/// `struct ibv_device_attr_ex`: the legacy attributes, then extended
/// capabilities roxe reports as absent (zero), except the port count.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_device_attr_ex {
    pub orig_attr: ibv_device_attr,
    pub comp_mask: u32,
    /// odp_caps .. max_dm_size, then `phys_port_cnt_ex` in the last word.
    pub _ext: [u32; 40],
    pub phys_port_cnt_ex: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct ibv_gid_entry {
    pub gid: ibv_gid,
    pub gid_index: u32,
    pub port_num: u32,
    pub gid_type: u32,
    pub ndev_ifindex: u32,
}

#[repr(C)]
pub struct ibv_async_event {
    /// `element`: a union of `cq`/`qp`/`srq`/`wq` pointers and `port_num`.
    pub element: *mut c_void,
    pub event_type: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct ibv_grh {
    pub version_tclass_flow: u32,
    pub paylen: u16,
    pub next_hdr: u8,
    pub hop_limit: u8,
    pub sgid: ibv_gid,
    pub dgid: ibv_gid,
}

// Constants of verbs.h this library acts on.
pub const IBV_NODE_CA: u32 = 1;
pub const IBV_TRANSPORT_IB: u32 = 0;
pub const IBV_QPT_RC: u32 = 2;
pub const IBV_QPT_UC: u32 = 3;
pub const IBV_QPT_UD: u32 = 4;
pub const IBV_ATOMIC_HCA: u32 = 1;
pub const IBV_LINK_LAYER_ETHERNET: u8 = 2;
pub const IBV_PORT_ACTIVE: u32 = 4;
pub const IBV_GID_TYPE_ROCE_V2: u32 = 2;
/// The private `ibv_query_gid_type` speaks `enum ibv_gid_type_sysfs`.
pub const IBV_GID_TYPE_SYSFS_ROCE_V2: u32 = 1;
pub const IBV_ACCESS_OPTIONAL_RANGE: u32 = 0x3ff0_0000;
pub const IBV_QP_STATE: c_int = 1;
pub const IBV_QP_CUR_STATE: c_int = 1 << 1;
pub const IBV_QP_EN_SQD_ASYNC_NOTIFY: c_int = 1 << 2;
pub const IBV_QP_ACCESS_FLAGS: c_int = 1 << 3;
pub const IBV_QP_PKEY_INDEX: c_int = 1 << 4;
pub const IBV_QP_PORT: c_int = 1 << 5;
pub const IBV_QP_QKEY: c_int = 1 << 6;
pub const IBV_QP_AV: c_int = 1 << 7;
pub const IBV_QP_PATH_MTU: c_int = 1 << 8;
pub const IBV_QP_TIMEOUT: c_int = 1 << 9;
pub const IBV_QP_RETRY_CNT: c_int = 1 << 10;
pub const IBV_QP_RNR_RETRY: c_int = 1 << 11;
pub const IBV_QP_RQ_PSN: c_int = 1 << 12;
pub const IBV_QP_MAX_QP_RD_ATOMIC: c_int = 1 << 13;
pub const IBV_QP_ALT_PATH: c_int = 1 << 14;
pub const IBV_QP_MIN_RNR_TIMER: c_int = 1 << 15;
pub const IBV_QP_SQ_PSN: c_int = 1 << 16;
pub const IBV_QP_MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
pub const IBV_QP_PATH_MIG_STATE: c_int = 1 << 18;
pub const IBV_QP_CAP: c_int = 1 << 19;
pub const IBV_QP_DEST_QPN: c_int = 1 << 20;
pub const IBV_SRQ_MAX_WR: c_int = 1;
pub const IBV_SRQ_LIMIT: c_int = 2;
pub const IBV_WC_GRH: u32 = 1;
pub const IBV_QP_INIT_ATTR_PD: u32 = 1;
pub const IBV_QP_INIT_ATTR_CREATE_FLAGS: u32 = 1 << 2;
pub const IBV_QP_INIT_ATTR_SEND_OPS_FLAGS: u32 = 1 << 6;
pub const IBV_QP_EX_WITH_RDMA_WRITE: u64 = 1;
pub const IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM: u64 = 1 << 1;
pub const IBV_QP_EX_WITH_SEND: u64 = 1 << 2;
pub const IBV_QP_EX_WITH_SEND_WITH_IMM: u64 = 1 << 3;
pub const IBV_QP_EX_WITH_RDMA_READ: u64 = 1 << 4;
pub const IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP: u64 = 1 << 5;
pub const IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD: u64 = 1 << 6;
pub const IBV_QP_EX_WITH_LOCAL_INV: u64 = 1 << 7;
pub const IBV_QP_EX_WITH_BIND_MW: u64 = 1 << 8;
pub const IBV_QP_EX_WITH_SEND_WITH_INV: u64 = 1 << 9;
pub const IBV_QP_EX_WITH_ATOMIC_WRITE: u64 = 1 << 12;

#[cfg(target_arch = "x86_64")]
const MUTEX: usize = 40;
#[cfg(target_arch = "aarch64")]
const MUTEX: usize = 48;

// The layouts the C side sees (../shared/docs/libibverbs-abi.md §4.1,
// §4.3: only the mutex size differs between x86_64 and aarch64).
// ------------------------------------------------ <rdma/rdma_cma.h>

/// `struct rdma_event_channel`.
#[repr(C)]
pub struct rdma_event_channel {
    pub fd: c_int,
}

/// `struct ibv_sa_path_rec` (`<infiniband/sa.h>`): `id->route.path_rec`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_sa_path_rec {
    pub dgid: ibv_gid,
    pub sgid: ibv_gid,
    pub dlid: u16,
    pub slid: u16,
    pub raw_traffic: c_int,
    pub flow_label: u32,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub reversible: c_int,
    pub numb_path: u8,
    pub pkey: u16,
    pub sl: u8,
    pub mtu_selector: u8,
    pub mtu: u8,
    pub rate_selector: u8,
    pub rate: u8,
    pub packet_life_time_selector: u8,
    pub packet_life_time: u8,
    pub preference: u8,
}

/// `struct rdma_ib_addr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_ib_addr {
    pub sgid: ibv_gid,
    pub dgid: ibv_gid,
    pub pkey: u16,
}

/// `struct rdma_addr`: the source and destination unions are each a
/// `sockaddr_storage`.
#[repr(C)]
pub struct rdma_addr {
    pub src_addr: libc::sockaddr_storage,
    pub dst_addr: libc::sockaddr_storage,
    pub addr: rdma_ib_addr,
}

/// `struct rdma_route`.
#[repr(C)]
pub struct rdma_route {
    pub addr: rdma_addr,
    pub path_rec: *mut ibv_sa_path_rec,
    pub num_paths: c_int,
}

/// `struct rdma_cm_id`.
#[repr(C)]
pub struct rdma_cm_id {
    pub verbs: *mut ibv_context,
    pub channel: *mut rdma_event_channel,
    pub context: *mut c_void,
    pub qp: *mut ibv_qp,
    pub route: rdma_route,
    pub ps: u32,
    pub port_num: u8,
    pub event: *mut rdma_cm_event,
    pub send_cq_channel: *mut ibv_comp_channel,
    pub send_cq: *mut ibv_cq,
    pub recv_cq_channel: *mut ibv_comp_channel,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub pd: *mut ibv_pd,
    pub qp_type: u32,
}

/// `struct rdma_conn_param`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_conn_param {
    pub private_data: *const c_void,
    pub private_data_len: u8,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub flow_control: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub srq: u8,
    pub qp_num: u32,
}

/// `struct rdma_ud_param`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_ud_param {
    pub private_data: *const c_void,
    pub private_data_len: u8,
    pub ah_attr: ibv_ah_attr,
    pub qp_num: u32,
    pub qkey: u32,
}

/// The `param` union of `struct rdma_cm_event`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union rdma_cm_event_param {
    pub conn: rdma_conn_param,
    pub ud: rdma_ud_param,
}

/// `struct rdma_cm_event`.
#[repr(C)]
pub struct rdma_cm_event {
    pub id: *mut rdma_cm_id,
    pub listen_id: *mut rdma_cm_id,
    pub event: u32,
    pub status: c_int,
    pub param: rdma_cm_event_param,
}

/// `struct rdma_addrinfo`.
#[repr(C)]
pub struct rdma_addrinfo {
    pub ai_flags: c_int,
    pub ai_family: c_int,
    pub ai_qp_type: c_int,
    pub ai_port_space: c_int,
    pub ai_src_len: libc::socklen_t,
    pub ai_dst_len: libc::socklen_t,
    pub ai_src_addr: *mut libc::sockaddr,
    pub ai_dst_addr: *mut libc::sockaddr,
    pub ai_src_canonname: *mut c_char,
    pub ai_dst_canonname: *mut c_char,
    pub ai_route_len: usize,
    pub ai_route: *mut c_void,
    pub ai_connect_len: usize,
    pub ai_connect: *mut c_void,
    pub ai_next: *mut rdma_addrinfo,
}

/// `struct ibv_ece` (`<infiniband/verbs.h>`): enhanced connection
/// establishment options.
#[repr(C)]
pub struct ibv_ece {
    pub vendor_id: u32,
    pub options: u32,
    pub comp_mask: u32,
}

pub const RDMA_PS_IPOIB: u32 = 0x0002;
pub const RDMA_PS_TCP: u32 = 0x0106;
pub const RDMA_PS_UDP: u32 = 0x0111;
pub const RDMA_PS_IB: u32 = 0x013F;
pub const RAI_PASSIVE: c_int = 0x1;
pub const RAI_NUMERICHOST: c_int = 0x2;
pub const RAI_NOROUTE: c_int = 0x4;
pub const RAI_FAMILY: c_int = 0x8;
pub const RDMA_OPTION_ID: c_int = 0;
pub const RDMA_OPTION_IB: c_int = 1;
pub const RDMA_OPTION_ID_TOS: c_int = 0;
pub const RDMA_OPTION_ID_REUSEADDR: c_int = 1;
pub const RDMA_OPTION_ID_AFONLY: c_int = 2;
pub const RDMA_OPTION_ID_ACK_TIMEOUT: c_int = 3;
pub const RDMA_OPTION_IB_PATH: c_int = 1;
pub const RDMA_MAX_RESP_RES: u8 = 0xff;
pub const RDMA_MAX_INIT_DEPTH: u8 = 0xff;

const _: () = {
    assert!(size_of::<pthread_mutex_t>() == MUTEX);
    assert!(size_of::<pthread_cond_t>() == 48);
    assert!(size_of::<ibv_device>() == 664);
    assert!(offset_of!(ibv_device, name) == 24);
    assert!(offset_of!(ibv_device, ibdev_path) == 408);
    assert!(size_of::<ibv_context_ops>() == 256);
    assert!(offset_of!(ibv_context_ops, alloc_mw) == 56);
    assert!(offset_of!(ibv_context_ops, poll_cq) == 88);
    assert!(offset_of!(ibv_context_ops, req_notify_cq) == 96);
    assert!(offset_of!(ibv_context_ops, post_srq_recv) == 160);
    assert!(offset_of!(ibv_context_ops, post_send) == 200);
    assert!(offset_of!(ibv_context_ops, post_recv) == 208);
    assert!(offset_of!(ibv_context, cmd_fd) == 264);
    assert!(offset_of!(ibv_context, mutex) == 280);
    assert!(offset_of!(ibv_context, abi_compat) == 280 + MUTEX);
    assert!(size_of::<ibv_context>() == 288 + MUTEX);
    assert!(offset_of!(verbs_context, context) == 320);
    assert!(size_of::<verbs_context>() == 320 + 288 + MUTEX);
    assert!(320 - offset_of!(verbs_context, create_cq_ex) == 120);
    assert!(320 - offset_of!(verbs_context, priv_) == 112);
    assert!(320 - offset_of!(verbs_context, query_device_ex) == 104);
    assert!(320 - offset_of!(verbs_context, create_qp_ex) == 56);
    assert!(320 - offset_of!(verbs_context, sz) == 8);
    assert!(size_of::<ibv_pd>() == 16);
    assert!(size_of::<ibv_mr>() == 48 && offset_of!(ibv_mr, rkey) == 40);
    assert!(size_of::<ibv_comp_channel>() == 16);
    assert!(offset_of!(ibv_cq, cqe) == 28 && offset_of!(ibv_cq, mutex) == 32);
    assert!(size_of::<ibv_cq>() == 88 + MUTEX);
    assert!(offset_of!(ibv_srq, mutex) == 32 && size_of::<ibv_srq>() == 88 + MUTEX);
    assert!(offset_of!(ibv_qp, qp_num) == 52 && offset_of!(ibv_qp, mutex) == 64);
    assert!(size_of::<ibv_qp>() == 120 + MUTEX);
    assert!(size_of::<ibv_ah>() == 24);
    assert!(size_of::<ibv_gid>() == 16 && std::mem::align_of::<ibv_gid>() == 8);
    assert!(size_of::<ibv_global_route>() == 24);
    assert!(size_of::<ibv_ah_attr>() == 32 && offset_of!(ibv_ah_attr, port_num) == 30);
    assert!(size_of::<ibv_qp_cap>() == 20);
    assert!(size_of::<ibv_qp_attr>() == 144);
    assert!(offset_of!(ibv_qp_attr, ah_attr) == 56 && offset_of!(ibv_qp_attr, pkey_index) == 120);
    assert!(offset_of!(ibv_qp_attr, min_rnr_timer) == 128);
    assert!(offset_of!(ibv_qp_attr, rate_limit) == 136);
    assert!(size_of::<ibv_qp_init_attr>() == 64 && offset_of!(ibv_qp_init_attr, qp_type) == 52);
    assert!(size_of::<ibv_srq_init_attr>() == 24);
    assert!(size_of::<ibv_qp_init_attr_ex>() == 136);
    assert!(offset_of!(ibv_qp_init_attr_ex, comp_mask) == 60);
    assert!(offset_of!(ibv_qp_init_attr_ex, pd) == 64);
    assert!(offset_of!(ibv_qp_init_attr_ex, rx_hash_conf) == 96);
    assert!(offset_of!(ibv_qp_init_attr_ex, source_qpn) == 120);
    assert!(offset_of!(ibv_qp_init_attr_ex, send_ops_flags) == 128);
    assert!(size_of::<ibv_qp_ex>() == 312 + MUTEX);
    assert!(offset_of!(ibv_qp_ex, comp_mask) == 120 + MUTEX);
    assert!(offset_of!(ibv_qp_ex, wr_send) == 200 + MUTEX);
    assert!(offset_of!(ibv_qp_ex, wr_set_sge) == 264 + MUTEX);
    assert!(offset_of!(ibv_qp_ex, wr_start) == 280 + MUTEX);
    assert!(offset_of!(ibv_qp_ex, wr_atomic_write) == 304 + MUTEX);
    assert!(size_of::<ibv_sge>() == 16);
    assert!(size_of::<ibv_send_wr>() == 128);
    assert!(offset_of!(ibv_send_wr, imm_data) == 36 && offset_of!(ibv_send_wr, wr) == 40);
    assert!(offset_of!(ibv_send_wr, remote_srqn) == 72);
    assert!(offset_of!(ibv_send_wr, _bind_mw_or_tso) == 80);
    assert!(size_of::<ibv_recv_wr>() == 32);
    assert!(size_of::<ibv_wc>() == 48 && offset_of!(ibv_wc, pkey_index) == 40);
    assert!(offset_of!(ibv_wc, sl) == 44);
    assert!(size_of::<ibv_port_attr>() == 52 && offset_of!(ibv_port_attr, port_cap_flags2) == 48);
    assert!(offset_of!(ibv_port_attr, link_layer) == 46);
    assert!(size_of::<ibv_device_attr>() == 232);
    assert!(offset_of!(ibv_device_attr, max_qp_init_rd_atom) == 156);
    assert!(offset_of!(ibv_device_attr, atomic_cap) == 164);
    assert!(offset_of!(ibv_device_attr, max_srq) == 212);
    assert!(offset_of!(ibv_device_attr, phys_port_cnt) == 227);
    assert!(size_of::<ibv_device_attr_ex>() == 400);
    assert!(offset_of!(ibv_device_attr_ex, phys_port_cnt_ex) == 396);
    assert!(size_of::<ibv_gid_entry>() == 32);
    assert!(size_of::<ibv_async_event>() == 16);
    assert!(size_of::<ibv_grh>() == 40);
};
