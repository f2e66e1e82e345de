//! Conversions between the C structs of [`super`] and roxe's Rust types:
//! the drop-in library reads and fills them for C programs, the hardware
//! backend fills and reads them for the system library.

use super::*;
use crate::{AccessFlags, AddressVector, Mtu, QpAttr, QpState, WcOpcode, WcStatus, WorkCompletion};

/// An address vector as `struct ibv_ah_attr`.
pub fn av_from_c(a: &ibv_ah_attr) -> AddressVector {
    AddressVector {
        dgid: a.grh.dgid.raw,
        sgid_index: a.grh.sgid_index,
        is_global: a.is_global != 0,
        dlid: a.dlid,
        hop_limit: a.grh.hop_limit,
        traffic_class: a.grh.traffic_class,
        flow_label: a.grh.flow_label,
        sl: a.sl,
        port_num: a.port_num,
    }
}

/// `struct ibv_ah_attr` of an address vector.
pub fn av_to_c(a: &AddressVector) -> ibv_ah_attr {
    ibv_ah_attr {
        grh: ibv_global_route {
            dgid: ibv_gid { raw: a.dgid },
            flow_label: a.flow_label,
            sgid_index: a.sgid_index,
            hop_limit: a.hop_limit,
            traffic_class: a.traffic_class,
        },
        dlid: a.dlid,
        sl: a.sl,
        src_path_bits: 0,
        static_rate: 0,
        is_global: u8::from(a.is_global),
        port_num: a.port_num,
    }
}

/// The attributes `mask` names, converted; values outside the mask are
/// never looked at (programs leave them uninitialised). Err: EINVAL for a
/// state or MTU out of range.
pub fn qp_attr_from_c(a: &ibv_qp_attr, mask: c_int) -> Result<QpAttr, c_int> {
    let has = |bit: c_int| mask & bit != 0;
    let mut q = QpAttr::default();
    if has(IBV_QP_STATE) {
        q.qp_state = QpState::try_from(a.qp_state).map_err(|_| libc::EINVAL)?;
    }
    if has(IBV_QP_CUR_STATE) {
        q.cur_qp_state = QpState::try_from(a.cur_qp_state).map_err(|_| libc::EINVAL)?;
    }
    if has(IBV_QP_PATH_MTU) {
        q.path_mtu = Mtu::try_from(a.path_mtu).map_err(|_| libc::EINVAL)?;
    }
    q.qkey = a.qkey;
    q.rq_psn = a.rq_psn;
    q.sq_psn = a.sq_psn;
    q.dest_qp_num = a.dest_qp_num;
    q.qp_access_flags = AccessFlags(a.qp_access_flags);
    q.pkey_index = a.pkey_index;
    q.port_num = a.port_num;
    if has(IBV_QP_AV) {
        q.av = av_from_c(&a.ah_attr);
    }
    q.timeout = a.timeout;
    q.retry_cnt = a.retry_cnt;
    q.rnr_retry = a.rnr_retry;
    q.min_rnr_timer = a.min_rnr_timer;
    q.max_rd_atomic = a.max_rd_atomic;
    q.max_dest_rd_atomic = a.max_dest_rd_atomic;
    q.en_sqd_async_notify = has(IBV_QP_EN_SQD_ASYNC_NOTIFY) && a.en_sqd_async_notify != 0;
    q.sq_draining = a.sq_draining != 0;
    Ok(q)
}

/// `struct ibv_qp_attr` of roxe's attributes, with `cap`.
pub fn qp_attr_to_c(a: &QpAttr, cap: ibv_qp_cap) -> ibv_qp_attr {
    ibv_qp_attr {
        qp_state: a.qp_state as u32,
        cur_qp_state: a.qp_state as u32,
        path_mtu: a.path_mtu as u32,
        path_mig_state: 0,
        qkey: a.qkey,
        rq_psn: a.rq_psn,
        sq_psn: a.sq_psn,
        dest_qp_num: a.dest_qp_num,
        qp_access_flags: a.qp_access_flags.0,
        cap,
        ah_attr: av_to_c(&a.av),
        alt_ah_attr: ibv_ah_attr::default(),
        pkey_index: a.pkey_index,
        alt_pkey_index: 0,
        en_sqd_async_notify: u8::from(a.en_sqd_async_notify),
        sq_draining: u8::from(a.sq_draining),
        max_rd_atomic: a.max_rd_atomic,
        max_dest_rd_atomic: a.max_dest_rd_atomic,
        min_rnr_timer: a.min_rnr_timer,
        port_num: a.port_num,
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
        alt_port_num: 0,
        alt_timeout: 0,
        rate_limit: 0,
    }
}

/// `enum ibv_wc_status` as roxe's (an unknown value: GENERAL_ERR).
pub fn wc_status_from_c(v: u32) -> WcStatus {
    use WcStatus::*;
    const ALL: [WcStatus; 24] = [
        Success,
        LocLenErr,
        LocQpOpErr,
        LocEecOpErr,
        LocProtErr,
        WrFlushErr,
        MwBindErr,
        BadRespErr,
        LocAccessErr,
        RemInvReqErr,
        RemAccessErr,
        RemOpErr,
        RetryExcErr,
        RnrRetryExcErr,
        LocRddViolErr,
        RemInvRdReqErr,
        RemAbortErr,
        InvEecnErr,
        InvEecStateErr,
        FatalErr,
        RespTimeoutErr,
        GeneralErr,
        TmErr,
        TmRndvIncomplete,
    ];
    ALL.get(v as usize).copied().unwrap_or(GeneralErr)
}

/// `enum ibv_wc_opcode` as roxe's (`None`: one roxe has no name for, such
/// as TSO or a driver's own).
pub fn wc_opcode_from_c(v: u32) -> Option<WcOpcode> {
    use WcOpcode::*;
    Some(match v {
        0 => Send,
        1 => RdmaWrite,
        2 => RdmaRead,
        3 => CompSwap,
        4 => FetchAdd,
        5 => BindMw,
        6 => LocalInv,
        9 => AtomicWrite,
        128 => Recv,
        129 => RecvRdmaWithImm,
        130 => TmAdd,
        131 => TmDel,
        132 => TmSync,
        133 => TmRecv,
        134 => TmNoTag,
        _ => return None,
    })
}

/// A C work completion as roxe's. The opcode of an error completion is
/// undefined in libibverbs; an unknown one reads as SEND.
pub fn wc_from_c(w: &ibv_wc) -> WorkCompletion {
    let with_imm = w.wc_flags & crate::wc_flags::WITH_IMM != 0;
    let with_inv = w.wc_flags & crate::wc_flags::WITH_INV != 0;
    let mut wc = WorkCompletion::new(
        w.wr_id,
        wc_status_from_c(w.status),
        wc_opcode_from_c(w.opcode).unwrap_or(WcOpcode::Send),
        w.qp_num,
    );
    wc.byte_len = w.byte_len;
    // imm_data is __be32 (the wire's bytes); an invalidated rkey is in
    // host order (the union's invalidated_rkey).
    if with_imm {
        wc.imm_data = u32::from_be(w.imm_data);
    }
    if with_inv {
        wc.invalidated_rkey = w.imm_data;
    }
    wc.src_qp = w.src_qp;
    wc.wc_flags = w.wc_flags;
    wc.sl = w.sl;
    wc
}

/// `struct ibv_wc` of a roxe work completion.
pub fn wc_to_c(w: &WorkCompletion) -> ibv_wc {
    let with_imm = w.wc_flags & crate::wc_flags::WITH_IMM != 0;
    ibv_wc {
        wr_id: w.wr_id,
        status: w.status as u32,
        opcode: w.opcode as u32,
        vendor_err: 0,
        byte_len: w.byte_len,
        imm_data: if with_imm {
            w.imm_data.to_be()
        } else {
            w.invalidated_rkey
        },
        qp_num: w.qp_num,
        src_qp: w.src_qp,
        wc_flags: w.wc_flags,
        pkey_index: 0,
        slid: 0,
        sl: w.sl,
        dlid_path_bits: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_and_opcode_round_trips() {
        for v in 0..22u32 {
            assert_eq!(wc_status_from_c(v) as u32, v);
        }
        assert_eq!(wc_status_from_c(99), WcStatus::GeneralErr);
        for v in [0u32, 1, 2, 3, 4, 5, 6, 128, 129] {
            assert_eq!(wc_opcode_from_c(v).map(|o| o as u32), Some(v));
        }
        assert_eq!(wc_opcode_from_c(7), None);
    }

    #[test]
    fn a_completion_round_trips_through_c() {
        let mut wc = WorkCompletion::new(7, WcStatus::RemAccessErr, WcOpcode::Recv, 0x11);
        wc.byte_len = 100;
        wc.imm_data = 0x1234_5678;
        wc.wc_flags = crate::wc_flags::WITH_IMM;
        wc.src_qp = 3;
        let back = wc_from_c(&wc_to_c(&wc));
        assert_eq!(back, wc);
    }

    #[test]
    fn qp_attributes_round_trip_through_c() {
        let a = QpAttr {
            qp_state: QpState::Rtr,
            path_mtu: Mtu::Mtu1024,
            rq_psn: 5,
            sq_psn: 6,
            dest_qp_num: 0x12,
            qkey: 0x11111111,
            max_dest_rd_atomic: 4,
            av: AddressVector {
                dgid: [1; 16],
                sgid_index: 1,
                is_global: true,
                hop_limit: 64,
                ..AddressVector::default()
            },
            ..QpAttr::default()
        };
        let c = qp_attr_to_c(&a, ibv_qp_cap::default());
        let mut back = qp_attr_from_c(&c, 0x1fffff).unwrap();
        back.cur_qp_state = a.cur_qp_state;
        assert_eq!(back, a);
    }
}
