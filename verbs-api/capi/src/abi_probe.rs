//! Checks the `#[repr(C)]` mirrors of [`crate::abi`] against the installed
//! `<infiniband/verbs.h>`: a C probe generated from the table below is
//! compiled with `cc` and prints `name size align` for every struct and
//! `struct.field offset [size]` for every named field, plus the `IBV_*`
//! constants the library uses; the Rust side prints the same lines from
//! `size_of`/`align_of`/`offset_of!`, and any difference fails the test.
//!
//! Fields map onto C in one of three ways:
//! - a C member (same name, or a designator such as
//!   `qp_type.xrc.remote_srqn`): offset and size compared;
//! - `starts_at`: a placeholder array covering C members from that one on:
//!   offset compared;
//! - `after`: a placeholder that also covers the padding C puts after that
//!   member: its offset is compared with the end of that member.
//!
//! A second test keeps the table complete: every struct, union, field and
//! `IBV_*` constant of `abi.rs` must appear here.

use crate::abi::*;
use libc::{pthread_cond_t, pthread_mutex_t};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::mem::{align_of, offset_of, size_of, MaybeUninit};
use std::path::Path;
use std::process::Command;

const HEADER: &str = "/usr/include/infiniband/verbs.h";
const CM_HEADER: &str = "/usr/include/rdma/rdma_cma.h";

/// How a Rust field maps onto the C struct.
enum CField {
    Member(&'static str),
    StartsAt(&'static str),
    After(&'static str),
}

struct Field {
    name: &'static str,
    c: CField,
    offset: usize,
    size: usize,
}

struct Layout {
    name: &'static str,
    c_type: &'static str,
    size: usize,
    align: usize,
    fields: Vec<Field>,
}

fn pointee_size<F>(_: *const F) -> usize {
    size_of::<F>()
}

macro_rules! field_size {
    ($ty:ident, $f:ident) => {{
        let place = MaybeUninit::<$ty>::uninit();
        // SAFETY: only the field's address inside the (uninitialised) value
        // is computed; nothing is read.
        pointee_size(unsafe { &raw const (*place.as_ptr()).$f })
    }};
}

macro_rules! c_type {
    ($ty:ident) => {
        concat!("struct ", stringify!($ty))
    };
    ($ty:ident, $c:literal) => {
        $c
    };
}

macro_rules! c_field {
    ($f:ident) => {
        CField::Member(stringify!($f))
    };
    ($f:ident, member $c:literal) => {
        CField::Member($c)
    };
    ($f:ident, starts_at $c:literal) => {
        CField::StartsAt($c)
    };
    ($f:ident, after $c:literal) => {
        CField::After($c)
    };
}

macro_rules! layouts {
    ($( $ty:ident $(= $cty:literal)? {
        $( $f:ident $(: $kind:ident $c:literal)? ),* $(,)?
    } )*) => {
        vec![$(
            Layout {
                name: stringify!($ty),
                c_type: c_type!($ty $(, $cty)?),
                size: size_of::<$ty>(),
                align: align_of::<$ty>(),
                fields: vec![$(
                    Field {
                        name: stringify!($f),
                        c: c_field!($f $(, $kind $c)?),
                        offset: offset_of!($ty, $f),
                        size: field_size!($ty, $f),
                    }
                ),*],
            }
        ),*]
    };
}

/// Every struct and union of `abi.rs` (plus the libc types it embeds).
fn layouts() -> Vec<Layout> {
    layouts! {
        pthread_mutex_t = "pthread_mutex_t" {}
        pthread_cond_t = "pthread_cond_t" {}
        ibv_device { _ops, node_type, transport_type, name, dev_name, dev_path, ibdev_path }
        ibv_context_ops {
            _compat_slots0: starts_at "_compat_query_device",
            alloc_mw,
            bind_mw,
            dealloc_mw,
            _compat_create_cq,
            poll_cq,
            req_notify_cq,
            _compat_slots1: starts_at "_compat_cq_event",
            post_srq_recv,
            _compat_slots2: starts_at "_compat_create_qp",
            post_send,
            post_recv,
            _compat_slots3: starts_at "_compat_create_ah",
        }
        ibv_context { device, ops, cmd_fd, async_fd, num_comp_vectors, mutex, abi_compat }
        verbs_context {
            query_port,
            advise_mr,
            _unsupported0a: starts_at "alloc_null_mr",
            reg_dm_mr,
            alloc_dm,
            free_dm,
            _unsupported0: starts_at "modify_flow_action_esp",
            alloc_parent_domain,
            _unsupported0b: starts_at "dealloc_td",
            post_srq_ops,
            _unsupported0c: starts_at "destroy_rwq_ind_table",
            query_rt_values,
            create_cq_ex,
            priv_: member "priv",
            query_device_ex,
            _unsupported1: starts_at "ibv_destroy_flow",
            create_qp_ex,
            get_srq_num,
            create_srq_ex,
            open_xrcd,
            close_xrcd,
            _abi_placeholder3: member "_ABI_placeholder3",
            sz,
            context,
        }
        ibv_pd { context, handle }
        ibv_xrcd { context }
        ibv_values_ex { comp_mask, raw_clock }
        ibv_xrcd_init_attr { comp_mask, fd, oflags }
        ibv_mr { context, pd, addr, length, handle, lkey, rkey }
        ibv_mw { context, pd, rkey, handle, type_: member "type" }
        ibv_mw_bind_info { mr, addr, length, mw_access_flags }
        ibv_mw_bind { wr_id, send_flags, bind_info }
        ibv_send_wr_bind_mw = "__typeof__(((struct ibv_send_wr *)0)->bind_mw)" {
            mw, rkey, bind_info,
        }
        ibv_dm { context, memcpy_to_dm, memcpy_from_dm, comp_mask, handle }
        ibv_alloc_dm_attr { length, log_align_req, comp_mask }
        ibv_comp_channel { context, fd, refcnt }
        ibv_cq {
            context, channel, cq_context, handle, cqe, mutex, cond,
            comp_events_completed, async_events_completed,
        }
        ibv_cq_ex {
            context, channel, cq_context, handle, cqe, mutex, cond,
            comp_events_completed, async_events_completed, comp_mask, status, wr_id,
            start_poll, next_poll, end_poll, read_opcode, read_vendor_err, read_byte_len,
            read_imm_data, read_qp_num, read_src_qp, read_wc_flags, read_slid, read_sl,
            read_dlid_path_bits, read_completion_ts, read_cvlan, read_flow_tag, read_tm_info,
            read_completion_wallclock_ns,
        }
        ibv_poll_cq_attr { comp_mask }
        ibv_parent_domain_init_attr { pd, td, comp_mask, alloc, free, pd_context }
        ibv_cq_init_attr_ex {
            cqe, cq_context, channel, comp_vector, wc_flags, comp_mask, flags, parent_domain,
        }
        ibv_srq { context, srq_context, pd, handle, mutex, cond, events_completed }
        ibv_qp {
            context, qp_context, pd, send_cq, recv_cq, srq, handle, qp_num, state,
            qp_type, mutex, cond, events_completed,
        }
        ibv_ah { context, pd, handle }
        ibv_gid = "union ibv_gid" { raw }
        ibv_global_route { dgid, flow_label, sgid_index, hop_limit, traffic_class }
        ibv_ah_attr { grh, dlid, sl, src_path_bits, static_rate, is_global, port_num }
        ibv_qp_cap { max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data }
        ibv_qp_attr {
            qp_state, cur_qp_state, path_mtu, path_mig_state, qkey, rq_psn, sq_psn,
            dest_qp_num, qp_access_flags, cap, ah_attr, alt_ah_attr, pkey_index,
            alt_pkey_index, en_sqd_async_notify, sq_draining, max_rd_atomic,
            max_dest_rd_atomic, min_rnr_timer, port_num, timeout, retry_cnt, rnr_retry,
            alt_port_num, alt_timeout, rate_limit,
        }
        ibv_qp_init_attr { qp_context, send_cq, recv_cq, srq, cap, qp_type, sq_sig_all }
        ibv_qp_init_attr_ex {
            qp_context, send_cq, recv_cq, srq, cap, qp_type, sq_sig_all, comp_mask, pd,
            xrcd, create_flags, max_tso_header, rwq_ind_tbl, rx_hash_conf, source_qpn,
            send_ops_flags,
        }
        ibv_data_buf { addr, length }
        ibv_qp_ex {
            qp_base, comp_mask, wr_id, wr_flags, wr_atomic_cmp_swp, wr_atomic_fetch_add,
            wr_bind_mw, wr_local_inv, wr_rdma_read, wr_rdma_write, wr_rdma_write_imm,
            wr_send, wr_send_imm, wr_send_inv, wr_send_tso, wr_set_ud_addr,
            wr_set_xrc_srqn, wr_set_inline_data, wr_set_inline_data_list, wr_set_sge,
            wr_set_sge_list, wr_start, wr_complete, wr_abort, wr_atomic_write,
        }
        ibv_srq_attr { max_wr, max_sge, srq_limit }
        ibv_srq_init_attr { srq_context, attr }
        ibv_srq_init_attr_ex {
            srq_context, attr, comp_mask, srq_type, pd, xrcd, cq, tm_cap,
        }
        ibv_wc_tm_info { tag, priv_: member "priv" }
        ibv_ops_wr {
            wr_id, next, opcode, flags,
            tm_unexpected_cnt: member "tm.unexpected_cnt",
            tm_handle: member "tm.handle",
            add_recv_wr_id: member "tm.add.recv_wr_id",
            add_sg_list: member "tm.add.sg_list",
            add_num_sge: member "tm.add.num_sge",
            add_tag: member "tm.add.tag",
            add_mask: member "tm.add.mask",
        }
        ibv_ece { vendor_id, options, comp_mask }
        rdma_event_channel { fd }
        ibv_sa_path_rec {
            dgid, sgid, dlid, slid, raw_traffic, flow_label, hop_limit, traffic_class,
            reversible, numb_path, pkey, sl, mtu_selector, mtu, rate_selector, rate,
            packet_life_time_selector, packet_life_time, preference,
        }
        rdma_ib_addr { sgid, dgid, pkey }
        rdma_addr {
            src_addr: member "src_storage",
            dst_addr: member "dst_storage",
            addr,
        }
        rdma_route { addr, path_rec, num_paths }
        rdma_cm_id {
            verbs, channel, context, qp, route, ps, port_num, event, send_cq_channel,
            send_cq, recv_cq_channel, recv_cq, srq, pd, qp_type,
        }
        rdma_conn_param {
            private_data, private_data_len, responder_resources, initiator_depth,
            flow_control, retry_count, rnr_retry_count, srq, qp_num,
        }
        rdma_ud_param { private_data, private_data_len, ah_attr, qp_num, qkey }
        rdma_cm_event_param = "__typeof__(((struct rdma_cm_event *)0)->param)" { conn, ud }
        rdma_cm_event { id, listen_id, event, status, param }
        rdma_addrinfo {
            ai_flags, ai_family, ai_qp_type, ai_port_space, ai_src_len, ai_dst_len,
            ai_src_addr, ai_dst_addr, ai_src_canonname, ai_dst_canonname, ai_route_len,
            ai_route, ai_connect_len, ai_connect, ai_next,
        }
        ibv_sge { addr, length, lkey }
        ibv_send_wr_rdma = "__typeof__(((struct ibv_send_wr *)0)->wr.rdma)" {
            remote_addr, rkey,
        }
        ibv_send_wr_atomic = "__typeof__(((struct ibv_send_wr *)0)->wr.atomic)" {
            remote_addr, compare_add, swap, rkey,
        }
        ibv_send_wr_ud = "__typeof__(((struct ibv_send_wr *)0)->wr.ud)" {
            ah, remote_qpn, remote_qkey,
        }
        ibv_send_wr_wr = "__typeof__(((struct ibv_send_wr *)0)->wr)" { rdma, atomic, ud }
        ibv_send_wr {
            wr_id,
            next,
            sg_list,
            num_sge,
            opcode,
            send_flags,
            imm_data,
            wr,
            remote_srqn: member "qp_type.xrc.remote_srqn",
            _bind_mw_or_tso: starts_at "bind_mw",
        }
        ibv_recv_wr { wr_id, next, sg_list, num_sge }
        ibv_wc {
            wr_id, status, opcode, vendor_err, byte_len, imm_data, qp_num, src_qp,
            wc_flags, pkey_index, slid, sl, dlid_path_bits,
        }
        ibv_port_attr {
            state, max_mtu, active_mtu, gid_tbl_len, port_cap_flags, max_msg_sz,
            bad_pkey_cntr, qkey_viol_cntr, pkey_tbl_len, lid, sm_lid, lmc, max_vl_num,
            sm_sl, subnet_timeout, init_type_reply, active_width, active_speed,
            phys_state, link_layer, flags, port_cap_flags2,
        }
        ibv_device_attr {
            fw_ver, node_guid, sys_image_guid, max_mr_size, page_size_cap, vendor_id,
            vendor_part_id, hw_ver, max_qp, max_qp_wr, device_cap_flags, max_sge,
            max_sge_rd, max_cq, max_cqe, max_mr, max_pd, max_qp_rd_atom, max_ee_rd_atom,
            max_res_rd_atom, max_qp_init_rd_atom, max_ee_init_rd_atom, atomic_cap,
            max_ee, max_rdd, max_mw, max_raw_ipv6_qp, max_raw_ethy_qp, max_mcast_grp,
            max_mcast_qp_attach, max_total_mcast_qp_attach, max_ah, max_fmr,
            max_map_per_fmr, max_srq, max_srq_wr, max_srq_sge, max_pkeys,
            local_ca_ack_delay, phys_port_cnt,
        }
        ibv_device_attr_ex {
            orig_attr,
            comp_mask,
            // odp_caps is 8-aligned: C pads 4 bytes after comp_mask.
            _ext: after "comp_mask",
            phys_port_cnt_ex,
        }
        ibv_gid_entry { gid, gid_index, port_num, gid_type, ndev_ifindex }
        ibv_async_event { element, event_type }
        ibv_grh { version_tclass_flow, paylen, next_hdr, hop_limit, sgid, dgid }
    }
}

macro_rules! consts {
    ($($name:ident),* $(,)?) => {
        vec![$((stringify!($name), $name as i64)),*]
    };
}

/// The `IBV_*` constants of `abi.rs` that `verbs.h` defines.
fn constants() -> Vec<(&'static str, i64)> {
    consts![
        IBV_ODP_SUPPORT,
        IBV_ODP_SUPPORT_IMPLICIT,
        IBV_ODP_SUPPORT_SEND,
        IBV_ODP_SUPPORT_RECV,
        IBV_ODP_SUPPORT_WRITE,
        IBV_ODP_SUPPORT_READ,
        IBV_ODP_SUPPORT_ATOMIC,
        IBV_ODP_SUPPORT_SRQ_RECV,
        IBV_ADVISE_MR_ADVICE_PREFETCH,
        IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE,
        IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT,
        IBV_ADVISE_MR_FLAG_FLUSH,
        IBV_DEVICE_MEM_WINDOW,
        IBV_DEVICE_MEM_WINDOW_TYPE_2B,
        IBV_SYSFS_NAME_MAX,
        IBV_SYSFS_PATH_MAX,
        IBV_NODE_CA,
        IBV_TRANSPORT_IB,
        IBV_QPT_RC,
        IBV_QPT_UC,
        IBV_QPT_UD,
        IBV_ATOMIC_HCA,
        IBV_LINK_LAYER_ETHERNET,
        IBV_PORT_ACTIVE,
        IBV_GID_TYPE_ROCE_V2,
        IBV_ACCESS_OPTIONAL_RANGE,
        IBV_QP_STATE,
        IBV_QP_CUR_STATE,
        IBV_QP_EN_SQD_ASYNC_NOTIFY,
        IBV_QP_ACCESS_FLAGS,
        IBV_QP_PKEY_INDEX,
        IBV_QP_PORT,
        IBV_QP_QKEY,
        IBV_QP_AV,
        IBV_QP_PATH_MTU,
        IBV_QP_TIMEOUT,
        IBV_QP_RETRY_CNT,
        IBV_QP_RNR_RETRY,
        IBV_QP_RQ_PSN,
        IBV_QP_MAX_QP_RD_ATOMIC,
        IBV_QP_ALT_PATH,
        IBV_QP_MIN_RNR_TIMER,
        IBV_QP_SQ_PSN,
        IBV_QP_MAX_DEST_RD_ATOMIC,
        IBV_QP_PATH_MIG_STATE,
        IBV_QP_CAP,
        IBV_QP_DEST_QPN,
        IBV_SRQ_MAX_WR,
        IBV_SRQ_LIMIT,
        IBV_WC_GRH,
        IBV_QP_INIT_ATTR_PD,
        IBV_QP_INIT_ATTR_CREATE_FLAGS,
        IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
        IBV_QP_EX_WITH_RDMA_WRITE,
        IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM,
        IBV_QP_EX_WITH_SEND,
        IBV_QP_EX_WITH_SEND_WITH_IMM,
        IBV_QP_EX_WITH_RDMA_READ,
        IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP,
        IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD,
        IBV_QP_EX_WITH_SEND_WITH_INV,
        IBV_QP_EX_WITH_LOCAL_INV,
        IBV_QP_EX_WITH_BIND_MW,
        IBV_QP_EX_WITH_ATOMIC_WRITE,
        IBV_SRQ_INIT_ATTR_TYPE,
        IBV_SRQ_INIT_ATTR_PD,
        IBV_SRQ_INIT_ATTR_CQ,
        IBV_SRQT_BASIC,
        IBV_SRQT_XRC,
        IBV_SRQT_TM,
        IBV_SRQ_INIT_ATTR_TM,
        IBV_WC_EX_WITH_TM_INFO,
        IBV_TM_CAP_RC,
        IBV_WR_TAG_ADD,
        IBV_WR_TAG_DEL,
        IBV_WR_TAG_SYNC,
        IBV_OPS_SIGNALED,
        IBV_OPS_TM_SYNC,
        IBV_DEVICE_XRC,
        IBV_SRQ_INIT_ATTR_XRCD,
        IBV_QP_INIT_ATTR_XRCD,
        IBV_QPT_XRC_SEND,
        IBV_QPT_XRC_RECV,
        IBV_XRCD_INIT_ATTR_FD,
        IBV_XRCD_INIT_ATTR_OFLAGS,
        IBV_WC_EX_WITH_BYTE_LEN,
        IBV_WC_EX_WITH_IMM,
        IBV_WC_EX_WITH_QP_NUM,
        IBV_WC_EX_WITH_SRC_QP,
        IBV_WC_EX_WITH_SLID,
        IBV_WC_EX_WITH_SL,
        IBV_WC_EX_WITH_DLID_PATH_BITS,
        IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK,
        IBV_WC_EX_WITH_COMPLETION_TIMESTAMP,
        IBV_VALUES_MASK_RAW_CLOCK,
        IBV_WC_STANDARD_FLAGS,
        IBV_CQ_INIT_ATTR_MASK_FLAGS,
        IBV_CQ_INIT_ATTR_MASK_PD,
        IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS,
        IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT,
        RDMA_PS_IPOIB,
        RDMA_PS_TCP,
        RDMA_PS_UDP,
        RDMA_PS_IB,
        RAI_PASSIVE,
        RAI_NUMERICHOST,
        RAI_NOROUTE,
        RAI_FAMILY,
        RDMA_OPTION_ID,
        RDMA_OPTION_IB,
        RDMA_OPTION_ID_TOS,
        RDMA_OPTION_ID_REUSEADDR,
        RDMA_OPTION_ID_AFONLY,
        RDMA_OPTION_ID_ACK_TIMEOUT,
        RDMA_OPTION_IB_PATH,
        RDMA_MAX_RESP_RES,
        RDMA_MAX_INIT_DEPTH,
    ]
}

/// `IBV_*` constants of `abi.rs` that are not in `verbs.h`.
const NOT_IN_VERBS_H: &[&str] = &[
    // enum ibv_gid_type_sysfs lives in rdma-core's private driver.h.
    "IBV_GID_TYPE_SYSFS_ROCE_V2",
];

/// Values checked through a C expression: (key, C expression, Rust value).
fn extras() -> Vec<(&'static str, &'static str, i64)> {
    use crate::query::*;
    vec![
        (
            "COMPAT_PORT_ATTR_SIZE",
            "offsetof(struct ibv_port_attr, port_cap_flags2)",
            COMPAT_PORT_ATTR_SIZE as i64,
        ),
        (
            "EX_ODP_GENERAL_CAPS",
            "offsetof(struct ibv_device_attr_ex, odp_caps.general_caps)",
            EX_ODP_GENERAL_CAPS as i64,
        ),
        (
            "EX_RC_ODP_CAPS",
            "offsetof(struct ibv_device_attr_ex, odp_caps.per_transport_caps.rc_odp_caps)",
            EX_RC_ODP_CAPS as i64,
        ),
        (
            "EX_UC_ODP_CAPS",
            "offsetof(struct ibv_device_attr_ex, odp_caps.per_transport_caps.uc_odp_caps)",
            EX_UC_ODP_CAPS as i64,
        ),
        (
            "EX_UD_ODP_CAPS",
            "offsetof(struct ibv_device_attr_ex, odp_caps.per_transport_caps.ud_odp_caps)",
            EX_UD_ODP_CAPS as i64,
        ),
        (
            "EX_COMPLETION_TIMESTAMP_MASK",
            "offsetof(struct ibv_device_attr_ex, completion_timestamp_mask)",
            EX_COMPLETION_TIMESTAMP_MASK as i64,
        ),
        (
            "EX_HCA_CORE_CLOCK_KHZ",
            "offsetof(struct ibv_device_attr_ex, hca_core_clock)",
            EX_HCA_CORE_CLOCK_KHZ as i64,
        ),
        (
            "EX_MAX_DM_SIZE",
            "offsetof(struct ibv_device_attr_ex, max_dm_size)",
            EX_MAX_DM_SIZE as i64,
        ),
        (
            "EX_XRC_ODP_CAPS",
            "offsetof(struct ibv_device_attr_ex, xrc_odp_caps)",
            EX_XRC_ODP_CAPS as i64,
        ),
        (
            "EX_TM_CAPS",
            "offsetof(struct ibv_device_attr_ex, tm_caps)",
            EX_TM_CAPS as i64,
        ),
    ]
}

/// The lines the C probe must print, computed on the Rust side.
fn rust_lines() -> Vec<(String, String)> {
    let mut lines = Vec::new();
    for l in layouts() {
        lines.push((l.name.to_string(), format!("{} {}", l.size, l.align)));
        for f in &l.fields {
            let value = match f.c {
                CField::Member(_) => format!("{} {}", f.offset, f.size),
                CField::StartsAt(_) | CField::After(_) => f.offset.to_string(),
            };
            lines.push((format!("{}.{}", l.name, f.name), value));
        }
    }
    for (name, value) in constants() {
        lines.push((name.to_string(), value.to_string()));
    }
    for (name, _, value) in extras() {
        lines.push((name.to_string(), value.to_string()));
    }
    lines
}

/// The C probe: one `printf` per line of [`rust_lines`].
fn c_source() -> String {
    let mut c = String::from(
        "#include <stddef.h>\n#include <stdio.h>\n#include <pthread.h>\n\
         #include <infiniband/verbs.h>\n#include <rdma/rdma_cma.h>\n\n\
         #define FIELD_SIZE(T, m) sizeof(((T *)0)->m)\n\
         #define END_OF(T, m) (offsetof(T, m) + FIELD_SIZE(T, m))\n\n\
         int main(void)\n{\n",
    );
    for l in layouts() {
        let t = l.c_type;
        writeln!(
            c,
            "\tprintf(\"%s %zu %zu\\n\", \"{}\", sizeof({t}), _Alignof({t}));",
            l.name
        )
        .unwrap();
        for f in &l.fields {
            let key = format!("{}.{}", l.name, f.name);
            let line = match f.c {
                CField::Member(m) => format!(
                    "printf(\"%s %zu %zu\\n\", \"{key}\", offsetof({t}, {m}), FIELD_SIZE({t}, {m}));"
                ),
                CField::StartsAt(m) => {
                    format!("printf(\"%s %zu\\n\", \"{key}\", offsetof({t}, {m}));")
                }
                CField::After(m) => format!("printf(\"%s %zu\\n\", \"{key}\", END_OF({t}, {m}));"),
            };
            writeln!(c, "\t{line}").unwrap();
        }
    }
    for (name, _) in constants() {
        writeln!(
            c,
            "\tprintf(\"%s %lld\\n\", \"{name}\", (long long)({name}));"
        )
        .unwrap();
    }
    for (name, expr, _) in extras() {
        writeln!(
            c,
            "\tprintf(\"%s %lld\\n\", \"{name}\", (long long)({expr}));"
        )
        .unwrap();
    }
    c.push_str("\treturn 0;\n}\n");
    c
}

/// Compare the probe's output with the Rust lines; every difference.
fn mismatches(c_output: &str, rust: &[(String, String)]) -> Vec<String> {
    let mut errors = Vec::new();
    let mut c_map = BTreeMap::new();
    for line in c_output.lines().filter(|l| !l.trim().is_empty()) {
        match line.split_once(' ') {
            Some((k, v)) => {
                if c_map.insert(k.to_string(), v.to_string()).is_some() {
                    errors.push(format!("{k}: printed twice by the C probe"));
                }
            }
            None => errors.push(format!("unparsable C probe line {line:?}")),
        }
    }
    let mut rust_map = BTreeMap::new();
    for (k, v) in rust {
        if rust_map.insert(k.clone(), v.clone()).is_some() {
            errors.push(format!("{k}: listed twice on the Rust side"));
        }
    }
    let keys: BTreeSet<&String> = c_map.keys().chain(rust_map.keys()).collect();
    for k in keys {
        match (c_map.get(k), rust_map.get(k)) {
            (Some(c), Some(r)) if c != r => errors.push(format!("{k}: C `{c}`, Rust `{r}`")),
            (Some(_), Some(_)) => {}
            (Some(c), None) => errors.push(format!("{k}: only in C (`{c}`)")),
            (None, Some(r)) => errors.push(format!("{k}: only in Rust (`{r}`)")),
            (None, None) => unreachable!(),
        }
    }
    errors
}

#[test]
fn rust_layouts_match_verbs_h() {
    if !Path::new(HEADER).exists() || !Path::new(CM_HEADER).exists() {
        println!(
            "skipped: {HEADER} or {CM_HEADER} not found (install libibverbs-dev librdmacm-dev)"
        );
        return;
    }
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let dir = std::env::temp_dir().join(format!("roxe-abi-probe-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("probe.c");
    let exe = dir.join("probe");
    std::fs::write(&src, c_source()).unwrap();
    let compiled = Command::new(&cc)
        .args(["-std=gnu11", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(&src)
        .output();
    let compiled = match compiled {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            println!("skipped: C compiler `{cc}` not found");
            let _ = std::fs::remove_dir_all(&dir);
            return;
        }
        Err(e) => panic!("running `{cc}`: {e}"),
    };
    assert!(
        compiled.status.success(),
        "the C probe ({}) does not compile against {HEADER}:\n{}",
        src.display(),
        String::from_utf8_lossy(&compiled.stderr)
    );
    let run = Command::new(&exe).output().unwrap();
    assert!(run.status.success(), "the C probe failed: {:?}", run.status);
    let _ = std::fs::remove_dir_all(&dir);

    let rust = rust_lines();
    let errors = mismatches(&String::from_utf8_lossy(&run.stdout), &rust);
    assert!(
        errors.is_empty(),
        "{} of {} ABI entries differ from {HEADER}:\n  {}",
        errors.len(),
        rust.len(),
        errors.join("\n  ")
    );
    println!("{} ABI entries match {HEADER}", rust.len());
}

/// The structs/unions (with their `pub` fields in order) and `IBV_*`
/// constants declared in `abi.rs`.
fn declared_in_abi_rs() -> (Vec<(String, Vec<String>)>, Vec<String>) {
    let mut items = Vec::new();
    let mut consts = Vec::new();
    let mut current: Option<(String, Vec<String>)> = None;
    for line in include_str!("../../src/abi.rs").lines() {
        let line = line.trim();
        if let Some((name, fields)) = current.as_mut() {
            if line == "}" {
                items.push((std::mem::take(name), std::mem::take(fields)));
                current = None;
            } else if let Some(field) = line.strip_prefix("pub ") {
                fields.push(field.split(':').next().unwrap().trim().to_string());
            }
            continue;
        }
        let decl = line
            .strip_prefix("pub struct ")
            .or_else(|| line.strip_prefix("pub union "));
        if let Some(rest) = decl {
            let name = rest.split([' ', '{']).next().unwrap().to_string();
            current = Some((name, Vec::new()));
        } else if let Some((prefix, rest)) = ["IBV_", "RDMA_", "RAI_"]
            .iter()
            .find_map(|p| Some((*p, line.strip_prefix("pub const ")?.strip_prefix(p)?)))
        {
            consts.push(format!(
                "{prefix}{}",
                rest.split(':').next().unwrap().trim()
            ));
        }
    }
    (items, consts)
}

#[test]
fn probe_covers_every_abi_item() {
    let (items, consts) = declared_in_abi_rs();
    assert!(items.len() > 20 && consts.len() > 20, "abi.rs parse failed");
    let table: BTreeMap<&str, Vec<&str>> = layouts()
        .iter()
        .map(|l| (l.name, l.fields.iter().map(|f| f.name).collect()))
        .collect();
    let mut missing = Vec::new();
    for (name, fields) in &items {
        match table.get(name.as_str()) {
            None => missing.push(format!("struct {name}")),
            Some(probed) if probed != fields => {
                missing.push(format!("{name}: abi.rs {fields:?}, probe {probed:?}"))
            }
            Some(_) => {}
        }
    }
    let probed: BTreeSet<&str> = constants().iter().map(|c| c.0).collect();
    for c in &consts {
        if !probed.contains(c.as_str()) && !NOT_IN_VERBS_H.contains(&c.as_str()) {
            missing.push(format!("const {c}"));
        }
    }
    assert!(
        missing.is_empty(),
        "abi.rs items the C probe does not check:\n  {}",
        missing.join("\n  ")
    );
}

#[test]
fn mismatches_are_all_reported() {
    let rust = vec![
        ("a".to_string(), "8 8".to_string()),
        ("a.x".to_string(), "0 4".to_string()),
        ("a.y".to_string(), "4 4".to_string()),
    ];
    let errors = mismatches("a 8 8\na.x 0 8\nb 1 1\n", &rust);
    assert_eq!(
        errors,
        [
            "a.x: C `0 8`, Rust `0 4`",
            "a.y: only in Rust (`4 4`)",
            "b: only in C (`1 1`)"
        ]
    );
}
