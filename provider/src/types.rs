//! Types shared by the engine's parts: errors with libibverbs' errno values,
//! access flags, completion statuses and opcodes (numbered as in rdma-core's
//! `verbs.h`, so the C ABI layer can pass them through unchanged).

use thiserror::Error;

/// An errno value as libibverbs returns it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Errno(pub i32);

impl Errno {
    /// Operation not permitted.
    pub const EPERM: Errno = Errno(1);
    /// No such entry.
    pub const ENOENT: Errno = Errno(2);
    /// Try again.
    pub const EAGAIN: Errno = Errno(11);
    /// Out of memory / resources.
    pub const ENOMEM: Errno = Errno(12);
    /// Permission denied.
    pub const EACCES: Errno = Errno(13);
    /// Bad address.
    pub const EFAULT: Errno = Errno(14);
    /// Device or resource busy.
    pub const EBUSY: Errno = Errno(16);
    /// Invalid argument.
    pub const EINVAL: Errno = Errno(22);
    /// Function not implemented.
    pub const ENOSYS: Errno = Errno(38);
    /// No data available (an empty GID table entry).
    pub const ENODATA: Errno = Errno(61);
    /// Operation not supported.
    pub const EOPNOTSUPP: Errno = Errno(95);
    /// Timed out (a bounded wait ran out).
    pub const ETIMEDOUT: Errno = Errno(110);
}

/// A verb failed: which one, why (errno), and a human-readable detail.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{verb}: {detail} (errno {})", errno.0)]
pub struct VerbsError {
    /// The failing verb, e.g. `"ibv_modify_qp"`.
    pub verb: &'static str,
    /// The errno libibverbs would return or set.
    pub errno: Errno,
    /// What was wrong.
    pub detail: String,
}

impl VerbsError {
    /// A new error.
    pub fn new(verb: &'static str, errno: Errno, detail: impl Into<String>) -> Self {
        let e = VerbsError {
            verb,
            errno,
            detail: detail.into(),
        };
        // Every refused verb of the Rust API, the drop-in and the hardware
        // backend is made here: one place shows them all (ROXE_LOG=debug).
        tracing::debug!(verb, errno = errno.0, detail = %e.detail, "verb failed");
        e
    }
}

/// Result of a verb.
pub type VerbsResult<T> = Result<T, VerbsError>;

/// Memory region / QP access flags (`enum ibv_access_flags` values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AccessFlags(pub u32);

impl AccessFlags {
    /// No access beyond local read.
    pub const NONE: AccessFlags = AccessFlags(0);
    /// `IBV_ACCESS_LOCAL_WRITE`.
    pub const LOCAL_WRITE: AccessFlags = AccessFlags(1);
    /// `IBV_ACCESS_REMOTE_WRITE`.
    pub const REMOTE_WRITE: AccessFlags = AccessFlags(1 << 1);
    /// `IBV_ACCESS_REMOTE_READ`.
    pub const REMOTE_READ: AccessFlags = AccessFlags(1 << 2);
    /// `IBV_ACCESS_REMOTE_ATOMIC`.
    pub const REMOTE_ATOMIC: AccessFlags = AccessFlags(1 << 3);
    /// `IBV_ACCESS_MW_BIND`.
    pub const MW_BIND: AccessFlags = AccessFlags(1 << 4);
    /// `IBV_ACCESS_ZERO_BASED`.
    pub const ZERO_BASED: AccessFlags = AccessFlags(1 << 5);
    /// `IBV_ACCESS_ON_DEMAND`.
    pub const ON_DEMAND: AccessFlags = AccessFlags(1 << 6);
    /// `IBV_ACCESS_HUGETLB`.
    pub const HUGETLB: AccessFlags = AccessFlags(1 << 7);
    /// `IBV_ACCESS_RELAXED_ORDERING`.
    pub const RELAXED_ORDERING: AccessFlags = AccessFlags(1 << 20);

    /// True when every flag of `other` is set.
    pub const fn contains(self, other: AccessFlags) -> bool {
        self.0 & other.0 == other.0
    }

    /// True when any remote access is granted.
    pub const fn any_remote(self) -> bool {
        self.0 & (Self::REMOTE_WRITE.0 | Self::REMOTE_READ.0 | Self::REMOTE_ATOMIC.0) != 0
    }
}

impl core::ops::BitOr for AccessFlags {
    type Output = AccessFlags;
    fn bitor(self, rhs: AccessFlags) -> AccessFlags {
        AccessFlags(self.0 | rhs.0)
    }
}

/// A protection domain's identity within one engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PdId(pub u32);

/// Work completion status (`enum ibv_wc_status` values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum WcStatus {
    /// `IBV_WC_SUCCESS`.
    Success = 0,
    /// `IBV_WC_LOC_LEN_ERR`.
    LocLenErr = 1,
    /// `IBV_WC_LOC_QP_OP_ERR`.
    LocQpOpErr = 2,
    /// `IBV_WC_LOC_EEC_OP_ERR`.
    LocEecOpErr = 3,
    /// `IBV_WC_LOC_PROT_ERR`.
    LocProtErr = 4,
    /// `IBV_WC_WR_FLUSH_ERR`.
    WrFlushErr = 5,
    /// `IBV_WC_MW_BIND_ERR`.
    MwBindErr = 6,
    /// `IBV_WC_BAD_RESP_ERR`.
    BadRespErr = 7,
    /// `IBV_WC_LOC_ACCESS_ERR`.
    LocAccessErr = 8,
    /// `IBV_WC_REM_INV_REQ_ERR`.
    RemInvReqErr = 9,
    /// `IBV_WC_REM_ACCESS_ERR`.
    RemAccessErr = 10,
    /// `IBV_WC_REM_OP_ERR`.
    RemOpErr = 11,
    /// `IBV_WC_RETRY_EXC_ERR`.
    RetryExcErr = 12,
    /// `IBV_WC_RNR_RETRY_EXC_ERR`.
    RnrRetryExcErr = 13,
    /// `IBV_WC_LOC_RDD_VIOL_ERR`.
    LocRddViolErr = 14,
    /// `IBV_WC_REM_INV_RD_REQ_ERR`.
    RemInvRdReqErr = 15,
    /// `IBV_WC_REM_ABORT_ERR`.
    RemAbortErr = 16,
    /// `IBV_WC_INV_EECN_ERR`.
    InvEecnErr = 17,
    /// `IBV_WC_INV_EEC_STATE_ERR`.
    InvEecStateErr = 18,
    /// `IBV_WC_FATAL_ERR`.
    FatalErr = 19,
    /// `IBV_WC_RESP_TIMEOUT_ERR`.
    RespTimeoutErr = 20,
    /// `IBV_WC_GENERAL_ERR`.
    GeneralErr = 21,
    /// `IBV_WC_TM_ERR`: a tag operation failed (a tag removed that was
    /// consumed or never added).
    TmErr = 22,
    /// `IBV_WC_TM_RNDV_INCOMPLETE`.
    TmRndvIncomplete = 23,
}

impl WcStatus {
    /// libibverbs' `ibv_wc_status_str` text, NUL-terminated (the one copy:
    /// the drop-in returns it to C, the tools print it).
    pub const fn as_cstr(self) -> &'static std::ffi::CStr {
        match self {
            WcStatus::Success => c"success",
            WcStatus::LocLenErr => c"local length error",
            WcStatus::LocQpOpErr => c"local QP operation error",
            WcStatus::LocEecOpErr => c"local EE context operation error",
            WcStatus::LocProtErr => c"local protection error",
            WcStatus::WrFlushErr => c"Work Request Flushed Error",
            WcStatus::MwBindErr => c"memory management operation error",
            WcStatus::BadRespErr => c"bad response error",
            WcStatus::LocAccessErr => c"local access error",
            WcStatus::RemInvReqErr => c"remote invalid request error",
            WcStatus::RemAccessErr => c"remote access error",
            WcStatus::RemOpErr => c"remote operation error",
            WcStatus::RetryExcErr => c"transport retry counter exceeded",
            WcStatus::RnrRetryExcErr => c"RNR retry counter exceeded",
            WcStatus::LocRddViolErr => c"local RDD violation error",
            WcStatus::RemInvRdReqErr => c"remote invalid RD request",
            WcStatus::RemAbortErr => c"aborted error",
            WcStatus::InvEecnErr => c"invalid EE context number",
            WcStatus::InvEecStateErr => c"invalid EE context state",
            WcStatus::FatalErr => c"fatal error",
            WcStatus::RespTimeoutErr => c"response timeout error",
            WcStatus::GeneralErr => c"general error",
            WcStatus::TmErr => c"TM error",
            WcStatus::TmRndvIncomplete => c"TM software rendezvous",
        }
    }

    /// [`as_cstr`](Self::as_cstr) as a `&str`.
    pub fn as_str(self) -> &'static str {
        // The texts are ASCII.
        self.as_cstr().to_str().unwrap_or("unknown")
    }
}

/// Work completion opcode (`enum ibv_wc_opcode` values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum WcOpcode {
    /// `IBV_WC_SEND`.
    Send = 0,
    /// `IBV_WC_RDMA_WRITE`.
    RdmaWrite = 1,
    /// `IBV_WC_RDMA_READ`.
    RdmaRead = 2,
    /// `IBV_WC_COMP_SWAP`.
    CompSwap = 3,
    /// `IBV_WC_FETCH_ADD`.
    FetchAdd = 4,
    /// `IBV_WC_BIND_MW`.
    BindMw = 5,
    /// `IBV_WC_LOCAL_INV`.
    LocalInv = 6,
    /// `IBV_WC_ATOMIC_WRITE`.
    AtomicWrite = 9,
    /// `IBV_WC_RECV` (receive side of a SEND).
    Recv = 128,
    /// `IBV_WC_RECV_RDMA_WITH_IMM` (receive side of WRITE_WITH_IMM).
    RecvRdmaWithImm = 129,
    /// `IBV_WC_TM_ADD`: a tag added to a tag-matching SRQ.
    TmAdd = 130,
    /// `IBV_WC_TM_DEL`: a tag removed.
    TmDel = 131,
    /// `IBV_WC_TM_SYNC`: the unexpected-message count synchronized.
    TmSync = 132,
    /// `IBV_WC_TM_RECV`: a tagged message (matched, or unexpected).
    TmRecv = 133,
    /// `IBV_WC_TM_NO_TAG`: a message to a tag-matching SRQ without a tag.
    TmNoTag = 134,
}
