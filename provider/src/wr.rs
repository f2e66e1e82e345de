//! Work requests and work completions, with libibverbs' numbering.

use crate::memory::Sge;
use crate::types::{WcOpcode, WcStatus};
use std::net::IpAddr;

/// Send-queue operation (`enum ibv_wr_opcode` values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum SendOpcode {
    /// `IBV_WR_RDMA_WRITE`.
    RdmaWrite = 0,
    /// `IBV_WR_RDMA_WRITE_WITH_IMM`.
    RdmaWriteWithImm = 1,
    /// `IBV_WR_SEND`.
    Send = 2,
    /// `IBV_WR_SEND_WITH_IMM`.
    SendWithImm = 3,
    /// `IBV_WR_RDMA_READ`.
    RdmaRead = 4,
    /// `IBV_WR_ATOMIC_CMP_AND_SWP`.
    AtomicCmpAndSwp = 5,
    /// `IBV_WR_ATOMIC_FETCH_AND_ADD`.
    AtomicFetchAndAdd = 6,
    /// `IBV_WR_LOCAL_INV`: invalidate a type 2 memory window's key
    /// (`SendWr::invalidate_rkey`); no packet.
    LocalInv = 7,
    /// `IBV_WR_BIND_MW`: bind a memory window (`SendWr::bind`); no packet.
    BindMw = 8,
    /// `IBV_WR_SEND_WITH_INV`.
    SendWithInv = 9,
    /// `IBV_WR_ATOMIC_WRITE` (IBA 1.5, RC): 8 bytes (one 8-byte SGE, or
    /// inline) written at `remote_addr` as one atomic store; acknowledged
    /// like a WRITE.
    AtomicWrite = 15,
}

impl SendOpcode {
    /// The completion opcode the requester reports.
    pub const fn wc_opcode(self) -> WcOpcode {
        match self {
            SendOpcode::RdmaWrite | SendOpcode::RdmaWriteWithImm => WcOpcode::RdmaWrite,
            SendOpcode::Send | SendOpcode::SendWithImm | SendOpcode::SendWithInv => WcOpcode::Send,
            SendOpcode::RdmaRead => WcOpcode::RdmaRead,
            SendOpcode::AtomicCmpAndSwp => WcOpcode::CompSwap,
            SendOpcode::AtomicFetchAndAdd => WcOpcode::FetchAdd,
            SendOpcode::LocalInv => WcOpcode::LocalInv,
            SendOpcode::BindMw => WcOpcode::BindMw,
            SendOpcode::AtomicWrite => WcOpcode::AtomicWrite,
        }
    }

    /// Local operations: executed by the requester in send-queue order,
    /// with no packet and no PSN.
    pub const fn is_local(self) -> bool {
        matches!(self, SendOpcode::LocalInv | SendOpcode::BindMw)
    }

    /// READ and atomics: they need a responder resource and a response.
    pub const fn is_read_or_atomic(self) -> bool {
        matches!(
            self,
            SendOpcode::RdmaRead | SendOpcode::AtomicCmpAndSwp | SendOpcode::AtomicFetchAndAdd
        )
    }

    /// Atomics.
    pub const fn is_atomic(self) -> bool {
        matches!(
            self,
            SendOpcode::AtomicCmpAndSwp | SendOpcode::AtomicFetchAndAdd
        )
    }
}

/// `enum ibv_send_flags` bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SendFlags(pub u32);

impl SendFlags {
    /// `IBV_SEND_FENCE`: wait for earlier READ/atomics to complete.
    pub const FENCE: SendFlags = SendFlags(1);
    /// `IBV_SEND_SIGNALED`: generate a completion on success.
    pub const SIGNALED: SendFlags = SendFlags(1 << 1);
    /// `IBV_SEND_SOLICITED`: set the solicited-event bit.
    pub const SOLICITED: SendFlags = SendFlags(1 << 2);
    /// `IBV_SEND_INLINE`: the data was copied at post time.
    pub const INLINE: SendFlags = SendFlags(1 << 3);

    /// True when every flag of `other` is set.
    pub const fn contains(self, other: SendFlags) -> bool {
        self.0 & other.0 == other.0
    }
}

impl core::ops::BitOr for SendFlags {
    type Output = SendFlags;
    fn bitor(self, rhs: SendFlags) -> SendFlags {
        SendFlags(self.0 | rhs.0)
    }
}

/// Where a UD send goes (what an address handle resolves to, plus the
/// remote QPN and Q_Key of `wr.ud`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdDest {
    /// Destination device address.
    pub addr: IpAddr,
    /// Destination QP number.
    pub remote_qpn: u32,
    /// Q_Key (a value with the high bit set means: use the QP's own Q_Key).
    pub remote_qkey: u32,
}

/// A send work request (`struct ibv_send_wr`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendWr {
    /// Caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// The operation.
    pub opcode: SendOpcode,
    /// Local memory to send from (or to place READ/atomic results in).
    pub sg_list: Vec<Sge>,
    /// Flags.
    pub flags: SendFlags,
    /// Immediate data, as the 32-bit value on the wire (ibv's `imm_data` is big-endian already).
    pub imm_data: u32,
    /// RDMA/atomic remote address.
    pub remote_addr: u64,
    /// RDMA/atomic remote key.
    pub rkey: u32,
    /// Atomic compare (CAS) or add (FAA) operand.
    pub compare_add: u64,
    /// Atomic swap operand (CAS).
    pub swap: u64,
    /// The R_Key to invalidate (SEND_WITH_INV).
    pub invalidate_rkey: u32,
    /// UD destination.
    pub ud: Option<UdDest>,
    /// With `SendFlags::INLINE`: the data, copied by the caller at post time.
    pub inline_data: Option<Vec<u8>>,
    /// `BindMw`: the window, its new key and what it is bound to.
    pub bind: Option<crate::memory::MwBind>,
    /// XRC_SEND: the number of the XRC SRQ at the peer that receives this
    /// request (`qp_type.xrc.remote_srqn`, the XRCETH).
    pub xrc_remote_srqn: u32,
}

impl SendWr {
    /// A request with every optional field empty.
    pub fn new(wr_id: u64, opcode: SendOpcode, sg_list: Vec<Sge>) -> SendWr {
        SendWr {
            wr_id,
            opcode,
            sg_list,
            flags: SendFlags::SIGNALED,
            imm_data: 0,
            remote_addr: 0,
            rkey: 0,
            compare_add: 0,
            swap: 0,
            invalidate_rkey: 0,
            ud: None,
            inline_data: None,
            bind: None,
            xrc_remote_srqn: 0,
        }
    }
}

/// A receive work request (`struct ibv_recv_wr`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecvWr {
    /// Caller's identifier.
    pub wr_id: u64,
    /// Where to scatter the incoming message.
    pub sg_list: Vec<Sge>,
}

/// `wc_flags` bits.
pub mod wc_flags {
    /// `IBV_WC_GRH`: the first 40 bytes of the buffer hold the GRH area.
    pub const GRH: u32 = 1;
    /// `IBV_WC_WITH_IMM`.
    pub const WITH_IMM: u32 = 1 << 1;
    /// `IBV_WC_WITH_INV`.
    pub const WITH_INV: u32 = 1 << 3;
    /// `IBV_WC_TM_SYNC_REQ`: the tag-matching SRQ wants the count of
    /// unexpected messages synchronized before new tags match.
    pub const TM_SYNC_REQ: u32 = 1 << 4;
    /// `IBV_WC_TM_MATCH`: a message matched a posted tag.
    pub const TM_MATCH: u32 = 1 << 5;
    /// `IBV_WC_TM_DATA_VALID`: the tag's buffer holds the message's data.
    pub const TM_DATA_VALID: u32 = 1 << 6;
}

/// A work completion (`struct ibv_wc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkCompletion {
    /// The work request's identifier.
    pub wr_id: u64,
    /// Outcome.
    pub status: WcStatus,
    /// Operation.
    pub opcode: WcOpcode,
    /// Bytes received (receive side), or transferred for READ/atomics.
    pub byte_len: u32,
    /// Immediate data (valid with `wc_flags::WITH_IMM`), as on the wire.
    pub imm_data: u32,
    /// Invalidated R_Key (valid with `wc_flags::WITH_INV`).
    pub invalidated_rkey: u32,
    /// Local QP number.
    pub qp_num: u32,
    /// Source QP (UD receives).
    pub src_qp: u32,
    /// `wc_flags` bits.
    pub wc_flags: u32,
    /// Tag matching (`ibv_wc_read_tm_info`): the tag of a matched message.
    pub tm_tag: u64,
    /// Tag matching: the TMH's opaque application context.
    pub tm_priv: u32,
    /// `sl` of a UD receive: RoCE has no service level, so roxe reports
    /// what mlx5 does there, the packet type (bit 3: UDP, RoCEv2; bits
    /// 2..0: 1 IPv6, 2 IPv4; [`roce_packet_type`]). UCX 1.13's UD reads
    /// it to find the IPv4 header in the GRH area. 0 otherwise, as rxe.
    pub sl: u8,
}

/// The `sl` mlx5 reports for a RoCEv2 packet received over IPv4 or IPv6.
pub fn roce_packet_type(ipv4: bool) -> u8 {
    0x8 | if ipv4 { 0x2 } else { 0x1 }
}

impl WorkCompletion {
    /// A completion with no receive-side details.
    pub fn new(wr_id: u64, status: WcStatus, opcode: WcOpcode, qp_num: u32) -> Self {
        WorkCompletion {
            wr_id,
            status,
            opcode,
            byte_len: 0,
            imm_data: 0,
            invalidated_rkey: 0,
            qp_num,
            src_qp: 0,
            wc_flags: 0,
            tm_tag: 0,
            tm_priv: 0,
            sl: 0,
        }
    }
}
