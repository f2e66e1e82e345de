//! The QP attribute model and the rules of `ibv_modify_qp`.
//!
//! This module is the one place that decides which `ibv_modify_qp` calls are
//! legal. A call to a real rxe device passes through libibverbs, the
//! kernel's uverbs layer, the RDMA core and rxe; [`check_modify`] applies
//! their checks in the same order, so a call fails here exactly when (and
//! with the errno with which) it fails there:
//!
//! 1. **libibverbs / uverbs**: mask bits above `IBV_QP_DEST_QPN` (including
//!    `IBV_QP_RATE_LIMIT`, which only the `_ex` command carries and rxe does
//!    not implement) → `EOPNOTSUPP`.
//! 2. **uverbs `modify_qp`**: `port_num` and `ah_attr.port_num` must name a
//!    port → `EINVAL`. With `IBV_QP_AV`, on the way to RTR the AV's port must
//!    be the QP's port; otherwise (SQD→SQD) an AV without `IBV_QP_PORT`
//!    *implies* `IBV_QP_PORT` with the AV's port, and an AV with a different
//!    `IBV_QP_PORT` → `EINVAL`. A Q_Key with bit 31 set (a privileged
//!    "controlled" Q_Key) → `EPERM`.
//! 3. **`ib_modify_qp_is_ok`** (the kernel's `qp_state_table`, see
//!    [`TRANSITIONS`]): the transition must exist, the mask must hold every
//!    required attribute and nothing outside required ∪ optional ∪
//!    `IBV_QP_STATE`. `IBV_QP_CUR_STATE` replaces the QP's current state by
//!    `cur_qp_state` and is only accepted when that state is RTR, RTS, SQD or
//!    SQE. Without `IBV_QP_STATE` the "transition" is from the current state
//!    to itself, so e.g. RTR with an empty mask is rejected.
//! 4. **core `_ib_modify_qp` / rxe**: a RoCE AV must carry a GRH
//!    (`is_global`) and name an existing source GID (roxe has one: index 0);
//!    `IBV_QP_ALT_PATH` is banned on RoCE; the values must be in range (see
//!    [`check_modify`]); out of SQD while the send queue is still draining
//!    only ERR is allowed ([`check_modify_with_stored`]).
//!
//! # Deviations from Linux
//!
//! * `IBV_QP_PATH_MIG_STATE` is rejected with `EINVAL`: roxe has no
//!   automatic path migration (neither does rxe, which stores the value and
//!   ignores it). The kernel table allows it for RC/UC in RTR→RTS, RTS→RTS,
//!   SQD→RTS and SQD→SQD but requires it nowhere.
//! * rxe does not range-check `pkey_index`, `retry_cnt`, `rnr_retry`,
//!   `min_rnr_timer`, `max_dest_rd_atomic` or `dest_qp_num`; roxe rejects
//!   values outside the fields' IBTA widths and the device limits with
//!   `EINVAL` (as hardware drivers such as mlx5 do for the limits), so the
//!   engine never sees them.
//! * An `ah_attr.sgid_index` other than 0 or 1 is `EINVAL` (both hold the
//!   device's one GID: 0 as roxe always had it, 1 where rxe puts the IPv4
//!   GID); rxe's 1024-entry table answers `ENODATA` for empty slots.
//! * A privileged Q_Key is always `EPERM` (Linux allows it to `CAP_NET_RAW`
//!   or when the `privileged_qkey` netlink setting is on).
//!
//! Like the kernel (and unlike a strict reading of the spec), `sq_psn` and
//! `rq_psn` are not rejected when they exceed 24 bits: they are masked to 24
//! bits when stored.

use core::fmt;
use core::ops::{BitAnd, BitOr, BitOrAssign};

use thiserror::Error;

use crate::types::{AccessFlags, Errno, VerbsError};

/// The verb every error of this module is reported for.
const VERB: &str = "ibv_modify_qp";

/// Mask of a 24-bit packet sequence number.
pub const PSN_MASK: u32 = 0x00FF_FFFF;

/// The largest queue pair number (QPNs are 24 bits).
pub const MAX_QPN: u32 = 0x00FF_FFFF;

/// The Q_Key bit that marks a privileged ("controlled") Q_Key.
pub const PRIVILEGED_QKEY_BIT: u32 = 0x8000_0000;

/// The largest source GID index a roxe device has: its GID is at 0 (as
/// roxe always had it) and at 1 (where rxe lists the IPv4 GID, after the
/// IPv6 link-local one, so programs written for rxe use 1).
pub const MAX_SGID_INDEX: u8 = 1;

/// The largest 5-bit timer code (`timeout`, `min_rnr_timer`).
pub const MAX_TIMER_CODE: u8 = 31;

/// The largest 3-bit retry count (`retry_cnt`, `rnr_retry`; 7 = infinite RNR retries).
pub const MAX_RETRY: u8 = 7;

/// `IBV_ACCESS_FLUSH_GLOBAL`.
const ACCESS_FLUSH_GLOBAL: u32 = 1 << 8;
/// `IBV_ACCESS_FLUSH_PERSISTENT`.
const ACCESS_FLUSH_PERSISTENT: u32 = 1 << 9;
/// `IBV_ACCESS_OPTIONAL_RANGE`: bits 20..=29, flags a device may ignore.
const ACCESS_OPTIONAL_RANGE: u32 = 0x3FF0_0000;

/// The QP access flags rxe accepts (`RXE_ACCESS_SUPPORTED_QP`): local write,
/// the three remote rights, MW bind, on-demand paging, the two flush rights
/// and the optional range (relaxed ordering, ...). Not zero-based or hugetlb.
pub const SUPPORTED_QP_ACCESS: AccessFlags = AccessFlags(
    AccessFlags::LOCAL_WRITE.0
        | AccessFlags::REMOTE_WRITE.0
        | AccessFlags::REMOTE_READ.0
        | AccessFlags::REMOTE_ATOMIC.0
        | AccessFlags::MW_BIND.0
        | AccessFlags::ON_DEMAND.0
        | ACCESS_FLUSH_GLOBAL
        | ACCESS_FLUSH_PERSISTENT
        | ACCESS_OPTIONAL_RANGE,
);

/// A raw value that names no variant of a verbs enumeration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[error("invalid {what} value {value}")]
pub struct InvalidValue {
    /// Which enumeration, e.g. `"QP state"`.
    pub what: &'static str,
    /// The rejected raw value.
    pub value: u32,
}

impl InvalidValue {
    /// The `EINVAL` error libibverbs/the kernel report for it, for `verb`.
    pub fn to_verbs_error(self, verb: &'static str) -> VerbsError {
        VerbsError::new(verb, Errno::EINVAL, self.to_string())
    }
}

impl From<InvalidValue> for VerbsError {
    fn from(e: InvalidValue) -> VerbsError {
        e.to_verbs_error(VERB)
    }
}

/// A verbs enumeration from its table of variants: the `#[repr(u32)]` enum,
/// whose discriminants are libibverbs' values, and `TryFrom<u32>`, which
/// refuses every other value with an [`InvalidValue`] naming `$what`. With a
/// name after each variant (`Rc = 2 => "RC"`) also `name()` and `Display`.
macro_rules! verbs_enum {
    (
        $(#[$meta:meta])*
        pub enum $ty:ident($what:literal) {
            $( $(#[$vmeta:meta])* $variant:ident = $value:literal => $name:literal, )*
        }
    ) => {
        verbs_enum! {
            $(#[$meta])*
            pub enum $ty($what) {
                $( $(#[$vmeta])* $variant = $value, )*
            }
        }

        impl $ty {
            /// The name as libibverbs spells the value, without its prefix
            /// (`"RC"` for `IBV_QPT_RC`, `"RESET"` for `IBV_QPS_RESET`).
            pub const fn name(self) -> &'static str {
                match self {
                    $( $ty::$variant => $name, )*
                }
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }
    };
    (
        $(#[$meta:meta])*
        pub enum $ty:ident($what:literal) {
            $( $(#[$vmeta:meta])* $variant:ident = $value:literal, )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u32)]
        pub enum $ty {
            $( $(#[$vmeta])* $variant = $value, )*
        }

        impl TryFrom<u32> for $ty {
            type Error = InvalidValue;

            fn try_from(value: u32) -> Result<Self, Self::Error> {
                match value {
                    $( $value => Ok($ty::$variant), )*
                    _ => Err(InvalidValue { what: $what, value }),
                }
            }
        }
    };
}

verbs_enum! {
    /// QP transport type (`enum ibv_qp_type` values: RC=2, UC=3, UD=4,
    /// XRC_SEND=9, XRC_RECV=10).
    pub enum QpType("QP type") {
        /// `IBV_QPT_RC`: reliable connected.
        Rc = 2 => "RC",
        /// `IBV_QPT_UC`: unreliable connected.
        Uc = 3 => "UC",
        /// `IBV_QPT_UD`: unreliable datagram.
        Ud = 4 => "UD",
        /// `IBV_QPT_XRC_SEND` (the kernel's XRC_INI): an XRC requester. It has
        /// a send queue and no receive side; each WR names the XRC SRQ it
        /// targets at the peer.
        XrcSend = 9 => "XRC_SEND",
        /// `IBV_QPT_XRC_RECV` (XRC_TGT): an XRC responder in an XRC domain,
        /// with no queue of its own: each request's XRCETH picks the domain's
        /// SRQ that receives it, whose PD and CQ apply.
        XrcRecv = 10 => "XRC_RECV",
    }
}

impl QpType {
    /// The types whose rules the tests compare column by column with the
    /// kernel's `qp_state_table` (the XRC types derive theirs from RC's:
    /// see [`Transition::rule`]).
    pub const ALL: [QpType; 3] = [QpType::Rc, QpType::Uc, QpType::Ud];

    /// RC and both XRC halves: PSNs, ACKs and retries (reliable connection).
    pub const fn is_reliable(self) -> bool {
        matches!(self, QpType::Rc | QpType::XrcSend | QpType::XrcRecv)
    }

    /// True for the two XRC types.
    pub const fn is_xrc(self) -> bool {
        matches!(self, QpType::XrcSend | QpType::XrcRecv)
    }
}

verbs_enum! {
    /// QP state (`enum ibv_qp_state` values: RESET=0, INIT=1, RTR=2, RTS=3, SQD=4, SQE=5, ERR=6).
    #[derive(Default)]
    pub enum QpState("QP state") {
        /// `IBV_QPS_RESET`: the state a QP is created in.
        #[default]
        Reset = 0 => "RESET",
        /// `IBV_QPS_INIT`: receives may be posted, nothing moves.
        Init = 1 => "INIT",
        /// `IBV_QPS_RTR`: ready to receive.
        Rtr = 2 => "RTR",
        /// `IBV_QPS_RTS`: ready to send.
        Rts = 3 => "RTS",
        /// `IBV_QPS_SQD`: send queue drain(ing/ed).
        Sqd = 4 => "SQD",
        /// `IBV_QPS_SQE`: send queue error (UC/UD only).
        Sqe = 5 => "SQE",
        /// `IBV_QPS_ERR`: error; outstanding work is flushed.
        Err = 6 => "ERR",
    }
}

impl QpState {
    /// Every state, in `enum ibv_qp_state` order.
    pub const ALL: [QpState; 7] = [
        QpState::Reset,
        QpState::Init,
        QpState::Rtr,
        QpState::Rts,
        QpState::Sqd,
        QpState::Sqe,
        QpState::Err,
    ];
}

verbs_enum! {
    /// IB path MTU (`enum ibv_mtu`: 256=1 .. 4096=5).
    #[derive(Default)]
    pub enum Mtu("path MTU") {
        /// `IBV_MTU_256` (rxe's initial path MTU).
        #[default]
        Mtu256 = 1,
        /// `IBV_MTU_512`.
        Mtu512 = 2,
        /// `IBV_MTU_1024`.
        Mtu1024 = 3,
        /// `IBV_MTU_2048`.
        Mtu2048 = 4,
        /// `IBV_MTU_4096`.
        Mtu4096 = 5,
    }
}

impl Mtu {
    /// Every MTU, smallest first.
    pub const ALL: [Mtu; 5] = [
        Mtu::Mtu256,
        Mtu::Mtu512,
        Mtu::Mtu1024,
        Mtu::Mtu2048,
        Mtu::Mtu4096,
    ];

    /// The MTU in bytes (256 .. 4096).
    pub const fn bytes(self) -> usize {
        256 << (self as u32 - 1)
    }

    /// The MTU of exactly `bytes` bytes, if it is one of the five.
    pub fn from_bytes(bytes: usize) -> Option<Mtu> {
        Mtu::ALL.into_iter().find(|m| m.bytes() == bytes)
    }
}

/// `enum ibv_qp_attr_mask`: which attributes an `ibv_modify_qp` call carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AttrMask(pub u32);

/// The mask bits, each with its libibverbs name: the [`AttrMask`]
/// constants, and the names `Display` prints.
macro_rules! mask_bits {
    ($( $(#[$doc:meta])* $bit:ident = $value:expr => $name:literal, )*) => {
        impl AttrMask {
            $(
                #[doc = concat!("`", $name, "`.")]
                $(#[$doc])*
                pub const $bit: AttrMask = AttrMask($value);
            )*
        }

        /// The libibverbs name of every defined mask bit.
        const MASK_NAMES: &[(AttrMask, &str)] = &[$( (AttrMask::$bit, $name), )*];
    };
}

mask_bits! {
    STATE = 1 => "IBV_QP_STATE",
    CUR_STATE = 1 << 1 => "IBV_QP_CUR_STATE",
    EN_SQD_ASYNC_NOTIFY = 1 << 2 => "IBV_QP_EN_SQD_ASYNC_NOTIFY",
    ACCESS_FLAGS = 1 << 3 => "IBV_QP_ACCESS_FLAGS",
    PKEY_INDEX = 1 << 4 => "IBV_QP_PKEY_INDEX",
    PORT = 1 << 5 => "IBV_QP_PORT",
    QKEY = 1 << 6 => "IBV_QP_QKEY",
    AV = 1 << 7 => "IBV_QP_AV",
    PATH_MTU = 1 << 8 => "IBV_QP_PATH_MTU",
    TIMEOUT = 1 << 9 => "IBV_QP_TIMEOUT",
    RETRY_CNT = 1 << 10 => "IBV_QP_RETRY_CNT",
    RNR_RETRY = 1 << 11 => "IBV_QP_RNR_RETRY",
    RQ_PSN = 1 << 12 => "IBV_QP_RQ_PSN",
    MAX_QP_RD_ATOMIC = 1 << 13 => "IBV_QP_MAX_QP_RD_ATOMIC",
    ALT_PATH = 1 << 14 => "IBV_QP_ALT_PATH",
    MIN_RNR_TIMER = 1 << 15 => "IBV_QP_MIN_RNR_TIMER",
    SQ_PSN = 1 << 16 => "IBV_QP_SQ_PSN",
    MAX_DEST_RD_ATOMIC = 1 << 17 => "IBV_QP_MAX_DEST_RD_ATOMIC",
    PATH_MIG_STATE = 1 << 18 => "IBV_QP_PATH_MIG_STATE",
    CAP = 1 << 19 => "IBV_QP_CAP",
    DEST_QPN = 1 << 20 => "IBV_QP_DEST_QPN",
    /// Only through the `_ex` command; rxe has no packet pacing.
    RATE_LIMIT = 1 << 25 => "IBV_QP_RATE_LIMIT",
}

impl AttrMask {
    /// No attribute.
    pub const EMPTY: AttrMask = AttrMask(0);
    /// Every bit the legacy modify command carries (`IB_QP_ATTR_STANDARD_BITS`: STATE ..= DEST_QPN).
    pub const STANDARD: AttrMask = AttrMask((1 << 21) - 1);

    /// The raw bits.
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// True when no bit is set.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// True when every bit of `other` is set.
    pub const fn contains(self, other: AttrMask) -> bool {
        self.0 & other.0 == other.0
    }

    /// True when some bit of `other` is set.
    pub const fn intersects(self, other: AttrMask) -> bool {
        self.0 & other.0 != 0
    }

    /// The bits of either mask.
    pub const fn union(self, other: AttrMask) -> AttrMask {
        AttrMask(self.0 | other.0)
    }

    /// The bits of both masks.
    pub const fn intersection(self, other: AttrMask) -> AttrMask {
        AttrMask(self.0 & other.0)
    }

    /// The bits of `self` that are not in `other`.
    pub const fn difference(self, other: AttrMask) -> AttrMask {
        AttrMask(self.0 & !other.0)
    }

    /// The union of a list of masks (usable in `const` items).
    pub const fn from_list(list: &[AttrMask]) -> AttrMask {
        let mut bits = 0;
        let mut i = 0;
        while i < list.len() {
            bits |= list[i].0;
            i += 1;
        }
        AttrMask(bits)
    }
}

impl BitOr for AttrMask {
    type Output = AttrMask;
    fn bitor(self, rhs: AttrMask) -> AttrMask {
        self.union(rhs)
    }
}

impl BitOrAssign for AttrMask {
    fn bitor_assign(&mut self, rhs: AttrMask) {
        *self = self.union(rhs);
    }
}

impl BitAnd for AttrMask {
    type Output = AttrMask;
    fn bitand(self, rhs: AttrMask) -> AttrMask {
        self.intersection(rhs)
    }
}

impl fmt::Display for AttrMask {
    /// The set bits by libibverbs name, joined by `|`; unnamed bits in hex.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("0");
        }
        let mut rest = *self;
        let mut first = true;
        for &(bit, name) in MASK_NAMES {
            if rest.contains(bit) {
                if !first {
                    f.write_str("|")?;
                }
                f.write_str(name)?;
                first = false;
                rest = rest.difference(bit);
            }
        }
        if !rest.is_empty() {
            if !first {
                f.write_str("|")?;
            }
            write!(f, "{:#x}", rest.0)?;
        }
        Ok(())
    }
}

/// The address vector of the remote end (what `ibv_ah_attr` carries, reduced to what RoCEv2 uses).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AddressVector {
    /// `grh.dgid`: the destination GID (an IPv6 or IPv4-mapped address).
    pub dgid: [u8; 16],
    /// `grh.sgid_index`: the source GID, 0 or 1 ([`MAX_SGID_INDEX`]).
    pub sgid_index: u8,
    /// `is_global`: a GRH is present (RoCE requires it).
    pub is_global: bool,
    /// `dlid`: ignored on RoCE.
    pub dlid: u16,
    /// `grh.hop_limit`: the IP TTL / hop limit.
    pub hop_limit: u8,
    /// `grh.traffic_class`: the IP DSCP/ECN byte.
    pub traffic_class: u8,
    /// `grh.flow_label`: the IPv6 flow label (not validated, as in Linux).
    pub flow_label: u32,
    /// `sl`: service level (ignored on RoCE).
    pub sl: u8,
    /// `port_num`: the local port the AV goes out of.
    pub port_num: u8,
}

/// Everything `ibv_modify_qp`/`ibv_query_qp` carry (the ibv_qp_attr fields roxe uses), all plain values with Default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct QpAttr {
    /// `qp_state`: the state to move to (`IBV_QP_STATE`).
    pub qp_state: QpState,
    /// `cur_qp_state`: the state the caller asserts the QP is in (`IBV_QP_CUR_STATE`).
    pub cur_qp_state: QpState,
    /// `path_mtu` (`IBV_QP_PATH_MTU`).
    pub path_mtu: Mtu,
    /// `qkey`: UD Q_Key (`IBV_QP_QKEY`).
    pub qkey: u32,
    /// `rq_psn`: the first PSN expected (`IBV_QP_RQ_PSN`), 24 bits when stored.
    pub rq_psn: u32,
    /// `sq_psn`: the first PSN sent (`IBV_QP_SQ_PSN`), 24 bits when stored.
    pub sq_psn: u32,
    /// `dest_qp_num`: the remote QPN of an RC/UC QP (`IBV_QP_DEST_QPN`).
    pub dest_qp_num: u32,
    /// `qp_access_flags`: the remote rights of RC/UC (`IBV_QP_ACCESS_FLAGS`).
    pub qp_access_flags: AccessFlags,
    /// `pkey_index` (`IBV_QP_PKEY_INDEX`).
    pub pkey_index: u16,
    /// `port_num` (`IBV_QP_PORT`).
    pub port_num: u8,
    /// `ah_attr`: the primary path (`IBV_QP_AV`).
    pub av: AddressVector,
    /// `timeout`: local ACK timeout, 4.096 µs · 2^timeout, 0 = infinite (`IBV_QP_TIMEOUT`).
    pub timeout: u8,
    /// `retry_cnt`: transport retries (`IBV_QP_RETRY_CNT`).
    pub retry_cnt: u8,
    /// `rnr_retry`: RNR retries, 7 = infinite (`IBV_QP_RNR_RETRY`).
    pub rnr_retry: u8,
    /// `min_rnr_timer`: the RNR NAK timer code this QP advertises (`IBV_QP_MIN_RNR_TIMER`).
    pub min_rnr_timer: u8,
    /// `max_rd_atomic`: outstanding RDMA READ/atomics as initiator (`IBV_QP_MAX_QP_RD_ATOMIC`).
    pub max_rd_atomic: u8,
    /// `max_dest_rd_atomic`: responder resources for READ/atomics (`IBV_QP_MAX_DEST_RD_ATOMIC`).
    pub max_dest_rd_atomic: u8,
    /// `en_sqd_async_notify`: raise `IBV_EVENT_SQ_DRAINED` (`IBV_QP_EN_SQD_ASYNC_NOTIFY`).
    pub en_sqd_async_notify: bool,
    /// `sq_draining`: in SQD, the send queue has not drained yet (query only).
    pub sq_draining: bool,
}

/// Device limits that bound attribute values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct QpLimits {
    /// `max_qp_rd_atom`: bound of `max_dest_rd_atomic` (rxe: 128).
    pub max_qp_rd_atom: u8,
    /// `max_qp_init_rd_atom`: bound of `max_rd_atomic` (rxe: 128).
    pub max_qp_init_rd_atom: u8,
    /// `pkey_tbl_len`: `pkey_index` must be below it (rxe: 1).
    pub pkey_table_len: u16,
    /// `phys_port_cnt`: ports are numbered `1..=port_count` (rxe: 1).
    pub port_count: u8,
}

impl Default for QpLimits {
    fn default() -> Self {
        QpLimits {
            max_qp_rd_atom: 128,
            max_qp_init_rd_atom: 128,
            pkey_table_len: 1,
            port_count: 1,
        }
    }
}

/// The required and optional attributes of one transition for one QP type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AttrRule {
    /// Attributes the mask must contain.
    pub required: AttrMask,
    /// Attributes the mask may contain (besides `IBV_QP_STATE`).
    pub optional: AttrMask,
}

impl AttrRule {
    /// The rule with `attrs` neither required nor allowed.
    pub const fn without(self, attrs: AttrMask) -> AttrRule {
        AttrRule {
            required: self.required.difference(attrs),
            optional: self.optional.difference(attrs),
        }
    }

    /// Everything the mask may contain: required, optional and `IBV_QP_STATE`.
    pub const fn allowed(self) -> AttrMask {
        self.required.union(self.optional).union(AttrMask::STATE)
    }
}

/// One legal transition of the kernel's `qp_state_table`, with its rule per QP type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Transition {
    /// The current state.
    pub from: QpState,
    /// The next state.
    pub to: QpState,
    /// The rule for RC QPs.
    pub rc: AttrRule,
    /// The rule for UC QPs.
    pub uc: AttrRule,
    /// The rule for UD QPs.
    pub ud: AttrRule,
}

impl Transition {
    /// The rule for `qp_type`. The kernel's XRC_INI and XRC_TGT columns are
    /// RC's without what the half lacks: an XRC_SEND QP has no responder
    /// (no `max_dest_rd_atomic`, `min_rnr_timer`), an XRC_RECV QP no
    /// requester (no `retry_cnt`, `rnr_retry`, `max_rd_atomic`).
    pub const fn rule(&self, qp_type: QpType) -> AttrRule {
        match qp_type {
            QpType::Rc => self.rc,
            QpType::Uc => self.uc,
            QpType::Ud => self.ud,
            QpType::XrcSend => self
                .rc
                .without(m(&[AttrMask::MAX_DEST_RD_ATOMIC, AttrMask::MIN_RNR_TIMER])),
            QpType::XrcRecv => self.rc.without(m(&[
                AttrMask::RETRY_CNT,
                AttrMask::RNR_RETRY,
                AttrMask::MAX_QP_RD_ATOMIC,
            ])),
        }
    }
}

const fn m(list: &[AttrMask]) -> AttrMask {
    AttrMask::from_list(list)
}

const fn rule(required: AttrMask, optional: AttrMask) -> AttrRule {
    AttrRule { required, optional }
}

/// A rule with nothing but `IBV_QP_STATE`.
const BARE: AttrRule = rule(AttrMask::EMPTY, AttrMask::EMPTY);

/// A transition that takes no attribute for any type (to RESET, to ERR, ...).
const fn bare(from: QpState, to: QpState) -> Transition {
    Transition {
        from,
        to,
        rc: BARE,
        uc: BARE,
        ud: BARE,
    }
}

/// A transition with one rule per type.
const fn edge(from: QpState, to: QpState, rc: AttrRule, uc: AttrRule, ud: AttrRule) -> Transition {
    Transition {
        from,
        to,
        rc,
        uc,
        ud,
    }
}

/// RC/UC: RESET→INIT (required) and INIT→INIT (optional).
const CONNECTED_INIT: AttrMask = m(&[AttrMask::PKEY_INDEX, AttrMask::PORT, AttrMask::ACCESS_FLAGS]);
/// UD: RESET→INIT (required) and INIT→INIT (optional).
const UD_INIT: AttrMask = m(&[AttrMask::PKEY_INDEX, AttrMask::PORT, AttrMask::QKEY]);
/// UC: INIT→RTR required.
const UC_RTR: AttrMask = m(&[
    AttrMask::AV,
    AttrMask::PATH_MTU,
    AttrMask::DEST_QPN,
    AttrMask::RQ_PSN,
]);
/// RC: INIT→RTR required.
const RC_RTR: AttrMask = UC_RTR.union(m(&[AttrMask::MAX_DEST_RD_ATOMIC, AttrMask::MIN_RNR_TIMER]));
/// RC/UC: INIT→RTR optional.
const CONNECTED_RTR_OPT: AttrMask = m(&[
    AttrMask::ALT_PATH,
    AttrMask::ACCESS_FLAGS,
    AttrMask::PKEY_INDEX,
]);
/// UD: INIT→RTR optional; also SQD→SQD optional.
const UD_PKEY_QKEY: AttrMask = m(&[AttrMask::PKEY_INDEX, AttrMask::QKEY]);
/// RC: RTR→RTS required.
const RC_RTS: AttrMask = m(&[
    AttrMask::TIMEOUT,
    AttrMask::RETRY_CNT,
    AttrMask::RNR_RETRY,
    AttrMask::SQ_PSN,
    AttrMask::MAX_QP_RD_ATOMIC,
]);
/// UD: optional into RTS (from RTR, RTS, SQD, SQE).
const UD_TO_RTS_OPT: AttrMask = m(&[AttrMask::CUR_STATE, AttrMask::QKEY]);
/// UC: optional into RTS from RTR, RTS and SQD.
const UC_TO_RTS_OPT: AttrMask = m(&[
    AttrMask::CUR_STATE,
    AttrMask::ALT_PATH,
    AttrMask::ACCESS_FLAGS,
    AttrMask::PATH_MIG_STATE,
]);
/// RC: optional into RTS from RTR, RTS and SQD.
const RC_TO_RTS_OPT: AttrMask = UC_TO_RTS_OPT.union(AttrMask::MIN_RNR_TIMER);
/// UC: SQE→RTS optional.
const UC_SQE_RTS_OPT: AttrMask = m(&[AttrMask::CUR_STATE, AttrMask::ACCESS_FLAGS]);
/// UC: SQD→SQD optional.
const UC_SQD_SQD_OPT: AttrMask = m(&[
    AttrMask::AV,
    AttrMask::ALT_PATH,
    AttrMask::ACCESS_FLAGS,
    AttrMask::PKEY_INDEX,
    AttrMask::PATH_MIG_STATE,
]);
/// RC: SQD→SQD optional.
const RC_SQD_SQD_OPT: AttrMask = m(&[
    AttrMask::PORT,
    AttrMask::AV,
    AttrMask::TIMEOUT,
    AttrMask::RETRY_CNT,
    AttrMask::RNR_RETRY,
    AttrMask::MAX_QP_RD_ATOMIC,
    AttrMask::MAX_DEST_RD_ATOMIC,
    AttrMask::ALT_PATH,
    AttrMask::ACCESS_FLAGS,
    AttrMask::PKEY_INDEX,
    AttrMask::MIN_RNR_TIMER,
    AttrMask::PATH_MIG_STATE,
]);

/// The legal transitions for RC, UC and UD: the kernel's `qp_state_table`
/// (`drivers/infiniband/core/verbs.c`) restricted to those types. Any pair
/// not listed (e.g. RESET→ERR, RTR→RTR, anything →SQE) is illegal.
pub static TRANSITIONS: [Transition; 22] = {
    use QpState::{Err, Init, Reset, Rtr, Rts, Sqd, Sqe};
    const fn opt(optional: AttrMask) -> AttrRule {
        rule(AttrMask::EMPTY, optional)
    }
    const fn req(required: AttrMask) -> AttrRule {
        rule(required, AttrMask::EMPTY)
    }
    [
        bare(Reset, Reset),
        edge(
            Reset,
            Init,
            req(CONNECTED_INIT),
            req(CONNECTED_INIT),
            req(UD_INIT),
        ),
        bare(Init, Reset),
        bare(Init, Err),
        edge(
            Init,
            Init,
            opt(CONNECTED_INIT),
            opt(CONNECTED_INIT),
            opt(UD_INIT),
        ),
        edge(
            Init,
            Rtr,
            rule(RC_RTR, CONNECTED_RTR_OPT),
            rule(UC_RTR, CONNECTED_RTR_OPT),
            opt(UD_PKEY_QKEY),
        ),
        bare(Rtr, Reset),
        bare(Rtr, Err),
        edge(
            Rtr,
            Rts,
            rule(RC_RTS, RC_TO_RTS_OPT),
            rule(AttrMask::SQ_PSN, UC_TO_RTS_OPT),
            rule(AttrMask::SQ_PSN, UD_TO_RTS_OPT),
        ),
        bare(Rts, Reset),
        bare(Rts, Err),
        edge(
            Rts,
            Rts,
            opt(RC_TO_RTS_OPT),
            opt(UC_TO_RTS_OPT),
            opt(UD_TO_RTS_OPT),
        ),
        edge(
            Rts,
            Sqd,
            opt(AttrMask::EN_SQD_ASYNC_NOTIFY),
            opt(AttrMask::EN_SQD_ASYNC_NOTIFY),
            opt(AttrMask::EN_SQD_ASYNC_NOTIFY),
        ),
        bare(Sqd, Reset),
        bare(Sqd, Err),
        edge(
            Sqd,
            Rts,
            opt(RC_TO_RTS_OPT),
            opt(UC_TO_RTS_OPT),
            opt(UD_TO_RTS_OPT),
        ),
        edge(
            Sqd,
            Sqd,
            opt(RC_SQD_SQD_OPT),
            opt(UC_SQD_SQD_OPT),
            opt(UD_PKEY_QKEY),
        ),
        bare(Sqe, Reset),
        bare(Sqe, Err),
        edge(Sqe, Rts, BARE, opt(UC_SQE_RTS_OPT), opt(UD_TO_RTS_OPT)),
        bare(Err, Reset),
        bare(Err, Err),
    ]
};

/// The table entry for `from`→`to`, if that transition exists.
pub fn transition(from: QpState, to: QpState) -> Option<&'static Transition> {
    TRANSITIONS.iter().find(|t| t.from == from && t.to == to)
}

/// The attributes roxe cannot honour because it has no automatic path migration.
const APM_ATTRS: AttrMask = m(&[AttrMask::ALT_PATH, AttrMask::PATH_MIG_STATE]);

fn einval(detail: impl Into<String>) -> VerbsError {
    VerbsError::new(VERB, Errno::EINVAL, detail)
}

/// Whether uverbs adds `IBV_QP_PORT` to the mask: an AV outside the
/// INIT→RTR transition (i.e. SQD→SQD) moves the primary port with it.
fn av_implies_port(attr: &QpAttr, mask: AttrMask) -> bool {
    mask.contains(AttrMask::AV)
        && !mask.contains(AttrMask::PORT)
        && !(mask.contains(AttrMask::STATE) && attr.qp_state == QpState::Rtr)
}

/// The mask the driver sees: the caller's, plus `IBV_QP_PORT` when the AV implies it.
fn effective_mask(attr: &QpAttr, mask: AttrMask) -> AttrMask {
    if av_implies_port(attr, mask) {
        mask | AttrMask::PORT
    } else {
        mask
    }
}

/// Check one `ibv_modify_qp` call on a QP of type `qp_type` in state `cur`.
///
/// The transition cur→new (new = `attr.qp_state` with `IBV_QP_STATE`, else
/// cur; cur is replaced by `attr.cur_qp_state` with `IBV_QP_CUR_STATE`) must
/// be in [`TRANSITIONS`] for the type, and the mask must contain its required
/// attributes and nothing outside required ∪ optional ∪ `IBV_QP_STATE`. Each
/// supplied value must be in range: `port_num` and `ah_attr.port_num` in
/// `1..=port_count`, `pkey_index < pkey_table_len`, `timeout` and
/// `min_rnr_timer` ≤ 31, `retry_cnt` and `rnr_retry` ≤ 7, `max_rd_atomic` ≤
/// `max_qp_init_rd_atom`, `max_dest_rd_atomic` ≤ `max_qp_rd_atom`,
/// `dest_qp_num` < 2^24, access flags within [`SUPPORTED_QP_ACCESS`], an AV
/// with `is_global` and `sgid_index` 0. `ALT_PATH` and `PATH_MIG_STATE` are
/// rejected (no APM). Errors are `EINVAL`, except `EOPNOTSUPP` for mask bits
/// above `IBV_QP_DEST_QPN` and `EPERM` for a privileged Q_Key.
///
/// Returns the state the QP will be in. [`check_modify_with_stored`] adds
/// the two checks that need the QP's stored attributes.
pub fn check_modify(
    qp_type: QpType,
    cur: QpState,
    attr: &QpAttr,
    mask: AttrMask,
    limits: &QpLimits,
) -> Result<QpState, VerbsError> {
    check(qp_type, cur, None, attr, mask, limits)
}

/// [`check_modify`] for a QP whose stored attributes are `stored`: also
/// rejects an AV whose port is not the QP's port on the way to RTR (uverbs),
/// and leaving SQD for anything but ERR while `stored.sq_draining` (rxe).
/// `cur` is the QP's current state (`stored.qp_state` may lag behind an
/// asynchronous move to ERR, so it is passed separately).
pub fn check_modify_with_stored(
    qp_type: QpType,
    cur: QpState,
    stored: &QpAttr,
    attr: &QpAttr,
    mask: AttrMask,
    limits: &QpLimits,
) -> Result<QpState, VerbsError> {
    check(qp_type, cur, Some(stored), attr, mask, limits)
}

fn check(
    qp_type: QpType,
    cur: QpState,
    stored: Option<&QpAttr>,
    attr: &QpAttr,
    mask: AttrMask,
    limits: &QpLimits,
) -> Result<QpState, VerbsError> {
    // libibverbs (RATE_LIMIT and above) and uverbs (bits 21..): EOPNOTSUPP.
    let unsupported = mask.difference(AttrMask::STANDARD);
    if !unsupported.is_empty() {
        return Err(VerbsError::new(
            VERB,
            Errno::EOPNOTSUPP,
            format!("attribute mask bits {unsupported} are not supported"),
        ));
    }

    // uverbs: port numbers, and the AV's port against the QP's.
    let port_valid = |p: u8| (1..=limits.port_count).contains(&p);
    if mask.contains(AttrMask::PORT) && !port_valid(attr.port_num) {
        return Err(einval(format!(
            "IBV_QP_PORT: port_num {} is not a port of the device (1..={})",
            attr.port_num, limits.port_count
        )));
    }
    if mask.contains(AttrMask::AV) {
        let av_port = attr.av.port_num;
        if !port_valid(av_port) {
            return Err(einval(format!(
                "IBV_QP_AV: ah_attr.port_num {av_port} is not a port of the device (1..={})",
                limits.port_count
            )));
        }
        let to_rtr = mask.contains(AttrMask::STATE) && attr.qp_state == QpState::Rtr;
        if to_rtr {
            if let Some(s) = stored {
                if av_port != s.port_num {
                    return Err(einval(format!(
                        "IBV_QP_AV: ah_attr.port_num {av_port} is not the QP's port {}",
                        s.port_num
                    )));
                }
            }
        } else if mask.contains(AttrMask::PORT) && attr.port_num != av_port {
            return Err(einval(format!(
                "IBV_QP_AV: ah_attr.port_num {av_port} differs from port_num {}",
                attr.port_num
            )));
        }
    }
    if mask.contains(AttrMask::QKEY) && attr.qkey & PRIVILEGED_QKEY_BIT != 0 {
        return Err(VerbsError::new(
            VERB,
            Errno::EPERM,
            format!(
                "IBV_QP_QKEY: qkey {:#010x} is a privileged (controlled) Q_Key",
                attr.qkey
            ),
        ));
    }

    // ib_modify_qp_is_ok: the transition and the mask.
    let eff = effective_mask(attr, mask);
    let cur = if eff.contains(AttrMask::CUR_STATE) {
        if !matches!(
            attr.cur_qp_state,
            QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
        ) {
            return Err(einval(format!(
                "IBV_QP_CUR_STATE: cur_qp_state {} is not RTR, RTS, SQD or SQE",
                attr.cur_qp_state
            )));
        }
        attr.cur_qp_state
    } else {
        cur
    };
    let new = if eff.contains(AttrMask::STATE) {
        attr.qp_state
    } else {
        cur
    };
    let rule = transition(cur, new)
        .ok_or_else(|| einval(format!("a {qp_type} QP cannot go from {cur} to {new}")))?
        .rule(qp_type);
    let missing = rule.required.difference(eff);
    if !missing.is_empty() {
        return Err(einval(format!(
            "{cur}->{new} of a {qp_type} QP requires {missing}"
        )));
    }
    let extra = eff.difference(rule.allowed());
    if !extra.is_empty() {
        let hint = if extra.contains(AttrMask::PORT) && !mask.contains(AttrMask::PORT) {
            " (IBV_QP_AV outside INIT->RTR implies IBV_QP_PORT)"
        } else {
            ""
        };
        return Err(einval(format!(
            "{cur}->{new} of a {qp_type} QP does not take {extra}{hint}"
        )));
    }

    // rxe: out of SQD only to ERR until the send queue has drained.
    if let Some(s) = stored {
        if eff.contains(AttrMask::STATE)
            && cur == QpState::Sqd
            && s.sq_draining
            && new != QpState::Err
        {
            return Err(einval(format!(
                "SQD->{new}: the send queue is still draining (only ERR is allowed)"
            )));
        }
    }

    // core: no alternate path on RoCE; roxe: no path migration at all.
    let apm = eff.intersection(APM_ATTRS);
    if !apm.is_empty() {
        return Err(einval(format!(
            "{apm}: roxe has no automatic path migration (no alternate path on RoCE)"
        )));
    }

    check_values(attr, eff, limits)?;
    Ok(new)
}

/// The range checks of the supplied values (only those the mask names).
fn check_values(attr: &QpAttr, mask: AttrMask, limits: &QpLimits) -> Result<(), VerbsError> {
    if mask.contains(AttrMask::PKEY_INDEX) && attr.pkey_index >= limits.pkey_table_len {
        return Err(einval(format!(
            "IBV_QP_PKEY_INDEX: pkey_index {} is beyond the P_Key table ({} entries)",
            attr.pkey_index, limits.pkey_table_len
        )));
    }
    if mask.contains(AttrMask::ACCESS_FLAGS) {
        let unsupported = attr.qp_access_flags.0 & !SUPPORTED_QP_ACCESS.0;
        if unsupported != 0 {
            return Err(einval(format!(
                "IBV_QP_ACCESS_FLAGS: qp_access_flags {:#x} has unsupported bits {unsupported:#x}",
                attr.qp_access_flags.0
            )));
        }
    }
    if mask.contains(AttrMask::AV) {
        if !attr.av.is_global {
            return Err(einval(
                "IBV_QP_AV: RoCE needs a GRH (ah_attr.is_global must be 1)",
            ));
        }
        if attr.av.sgid_index > MAX_SGID_INDEX {
            return Err(einval(format!(
                "IBV_QP_AV: ah_attr.grh.sgid_index {} names no GID (the device has indexes 0 and 1)",
                attr.av.sgid_index
            )));
        }
    }
    let bounded: [(AttrMask, &str, u32, u32); 7] = [
        (
            AttrMask::TIMEOUT,
            "IBV_QP_TIMEOUT: timeout",
            attr.timeout.into(),
            MAX_TIMER_CODE.into(),
        ),
        (
            AttrMask::RETRY_CNT,
            "IBV_QP_RETRY_CNT: retry_cnt",
            attr.retry_cnt.into(),
            MAX_RETRY.into(),
        ),
        (
            AttrMask::RNR_RETRY,
            "IBV_QP_RNR_RETRY: rnr_retry",
            attr.rnr_retry.into(),
            MAX_RETRY.into(),
        ),
        (
            AttrMask::MIN_RNR_TIMER,
            "IBV_QP_MIN_RNR_TIMER: min_rnr_timer",
            attr.min_rnr_timer.into(),
            MAX_TIMER_CODE.into(),
        ),
        (
            AttrMask::MAX_QP_RD_ATOMIC,
            "IBV_QP_MAX_QP_RD_ATOMIC: max_rd_atomic",
            attr.max_rd_atomic.into(),
            limits.max_qp_init_rd_atom.into(),
        ),
        (
            AttrMask::MAX_DEST_RD_ATOMIC,
            "IBV_QP_MAX_DEST_RD_ATOMIC: max_dest_rd_atomic",
            attr.max_dest_rd_atomic.into(),
            limits.max_qp_rd_atom.into(),
        ),
        (
            AttrMask::DEST_QPN,
            "IBV_QP_DEST_QPN: dest_qp_num",
            attr.dest_qp_num,
            MAX_QPN,
        ),
    ];
    for (bit, what, value, max) in bounded {
        if mask.contains(bit) && value > max {
            return Err(einval(format!("{what} {value} exceeds {max}")));
        }
    }
    Ok(())
}

/// What [`apply`] changed that the engine must act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ApplyEffects {
    /// The state the QP is in now.
    pub state: QpState,
    /// `IBV_QP_STATE` was in the mask (rxe re-runs a state's entry action
    /// even when the QP is already in it: RESET→RESET resets again, ERR→ERR
    /// flushes again, SQD→SQD restarts the drain).
    pub state_requested: bool,
    /// The attributes written: the mask, plus `IBV_QP_PORT` when the AV implied it.
    pub changed: AttrMask,
}

impl ApplyEffects {
    /// True when the call asked for `state` (`IBV_QP_STATE` with that state).
    pub fn requested(self, state: QpState) -> bool {
        self.state_requested && self.state == state
    }

    /// Moved to RESET: drop queued work without completions, reset the transport.
    pub fn reset(self) -> bool {
        self.requested(QpState::Reset)
    }

    /// Moved to ERR: flush outstanding work with `IBV_WC_WR_FLUSH_ERR`.
    pub fn error(self) -> bool {
        self.requested(QpState::Err)
    }

    /// Moved to RTR: the responder starts accepting packets.
    pub fn ready_to_receive(self) -> bool {
        self.requested(QpState::Rtr)
    }

    /// Moved to RTS: the requester may send (again, coming from SQD/SQE).
    pub fn ready_to_send(self) -> bool {
        self.requested(QpState::Rts)
    }

    /// Moved to SQD: finish the messages in flight, start no new ones.
    pub fn drain(self) -> bool {
        self.requested(QpState::Sqd)
    }
}

/// rxe stores `max_rd_atomic`/`max_dest_rd_atomic` rounded up to a power of two (0 stays 0).
fn round_up_pow2(v: u8) -> u8 {
    if v == 0 {
        0
    } else {
        v.checked_next_power_of_two().unwrap_or(v)
    }
}

/// Apply the masked attributes to the QP's stored attributes (after check_modify succeeded): copies exactly the fields the mask names, sets qp_state, and returns what changed that the engine must act on (e.g. entering RTR, RTS, ERR, RESET).
///
/// As rxe does: PSNs are stored masked to 24 bits, `max_rd_atomic` and
/// `max_dest_rd_atomic` rounded up to a power of two (what `ibv_query_qp`
/// then reports), an AV outside INIT→RTR also sets `port_num`, `cur_qp_state`
/// follows the new state and `sq_draining` is set on a request for SQD and
/// cleared on leaving SQD. Other fields keep their values, also across RESET.
pub fn apply(
    stored: &mut QpAttr,
    attr: &QpAttr,
    mask: AttrMask,
    new_state: QpState,
) -> ApplyEffects {
    let implied_port = av_implies_port(attr, mask);
    let changed = effective_mask(attr, mask).intersection(AttrMask::STANDARD);
    if changed.contains(AttrMask::EN_SQD_ASYNC_NOTIFY) {
        stored.en_sqd_async_notify = attr.en_sqd_async_notify;
    }
    if changed.contains(AttrMask::ACCESS_FLAGS) {
        stored.qp_access_flags = attr.qp_access_flags;
    }
    if changed.contains(AttrMask::PKEY_INDEX) {
        stored.pkey_index = attr.pkey_index;
    }
    if changed.contains(AttrMask::PORT) {
        stored.port_num = if implied_port {
            attr.av.port_num
        } else {
            attr.port_num
        };
    }
    if changed.contains(AttrMask::QKEY) {
        stored.qkey = attr.qkey;
    }
    if changed.contains(AttrMask::AV) {
        stored.av = attr.av;
    }
    if changed.contains(AttrMask::PATH_MTU) {
        stored.path_mtu = attr.path_mtu;
    }
    if changed.contains(AttrMask::TIMEOUT) {
        stored.timeout = attr.timeout;
    }
    if changed.contains(AttrMask::RETRY_CNT) {
        stored.retry_cnt = attr.retry_cnt;
    }
    if changed.contains(AttrMask::RNR_RETRY) {
        stored.rnr_retry = attr.rnr_retry;
    }
    if changed.contains(AttrMask::RQ_PSN) {
        stored.rq_psn = attr.rq_psn & PSN_MASK;
    }
    if changed.contains(AttrMask::MAX_QP_RD_ATOMIC) {
        stored.max_rd_atomic = round_up_pow2(attr.max_rd_atomic);
    }
    if changed.contains(AttrMask::MIN_RNR_TIMER) {
        stored.min_rnr_timer = attr.min_rnr_timer;
    }
    if changed.contains(AttrMask::SQ_PSN) {
        stored.sq_psn = attr.sq_psn & PSN_MASK;
    }
    if changed.contains(AttrMask::MAX_DEST_RD_ATOMIC) {
        stored.max_dest_rd_atomic = round_up_pow2(attr.max_dest_rd_atomic);
    }
    if changed.contains(AttrMask::DEST_QPN) {
        stored.dest_qp_num = attr.dest_qp_num;
    }
    let state_requested = changed.contains(AttrMask::STATE);
    if new_state != QpState::Sqd {
        stored.sq_draining = false;
    } else if state_requested {
        stored.sq_draining = true;
    }
    stored.qp_state = new_state;
    stored.cur_qp_state = new_state;
    ApplyEffects {
        state: new_state,
        state_requested,
        changed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    use QpState::{Err as ErrS, Init, Reset, Rtr, Rts, Sqd, Sqe};

    const L: QpLimits = QpLimits {
        max_qp_rd_atom: 128,
        max_qp_init_rd_atom: 128,
        pkey_table_len: 1,
        port_count: 1,
    };

    /// Every bit ibv_modify_qp accepts, one by one.
    fn standard_bits() -> impl Iterator<Item = AttrMask> {
        (0..21).map(|i| AttrMask(1 << i))
    }

    /// An attribute set where every value is valid.
    fn good(to: QpState) -> QpAttr {
        QpAttr {
            qp_state: to,
            cur_qp_state: Reset,
            path_mtu: Mtu::Mtu1024,
            qkey: 0x1111_1111,
            rq_psn: 0x12_3456,
            sq_psn: 0x65_4321,
            dest_qp_num: 0x12,
            qp_access_flags: AccessFlags::REMOTE_WRITE | AccessFlags::LOCAL_WRITE,
            pkey_index: 0,
            port_num: 1,
            av: AddressVector {
                dgid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1],
                sgid_index: 0,
                is_global: true,
                dlid: 0,
                hop_limit: 1,
                traffic_class: 0,
                flow_label: 0,
                sl: 0,
                port_num: 1,
            },
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
            en_sqd_async_notify: true,
            sq_draining: false,
        }
    }

    fn run(t: QpType, cur: QpState, attr: &QpAttr, mask: AttrMask) -> Result<QpState, VerbsError> {
        check_modify(t, cur, attr, mask, &L)
    }

    #[track_caller]
    fn ok(t: QpType, cur: QpState, attr: &QpAttr, mask: AttrMask) -> QpState {
        match run(t, cur, attr, mask) {
            Ok(s) => s,
            Err(e) => panic!("{t} {cur} mask {mask}: unexpected {e}"),
        }
    }

    #[track_caller]
    fn fails(t: QpType, cur: QpState, attr: &QpAttr, mask: AttrMask, errno: Errno) -> String {
        match run(t, cur, attr, mask) {
            Ok(s) => panic!("{t} {cur} mask {mask}: unexpectedly Ok({s})"),
            Err(e) => {
                assert_eq!(e.errno, errno, "{t} {cur} mask {mask}: {e}");
                assert_eq!(e.verb, "ibv_modify_qp");
                e.detail
            }
        }
    }

    #[track_caller]
    fn einval(t: QpType, cur: QpState, attr: &QpAttr, mask: AttrMask) -> String {
        fails(t, cur, attr, mask, Errno::EINVAL)
    }

    /// Drive a QP through `steps`, checking and applying each; returns the stored attributes.
    #[track_caller]
    fn drive(t: QpType, steps: &[(QpAttr, AttrMask)]) -> (QpState, QpAttr) {
        let mut state = Reset;
        let mut stored = QpAttr::default();
        for (attr, mask) in steps {
            let new = match check_modify_with_stored(t, state, &stored, attr, *mask, &L) {
                Ok(s) => s,
                Err(e) => panic!("{t} {state} mask {mask}: {e}"),
            };
            assert_eq!(new, attr.qp_state);
            apply(&mut stored, attr, *mask, new);
            state = new;
        }
        (state, stored)
    }

    // Masks as the programs write them.
    const S: AttrMask = AttrMask::STATE;
    fn rc_init_mask() -> AttrMask {
        S | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS
    }
    fn ud_init_mask() -> AttrMask {
        S | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::QKEY
    }
    fn rc_rtr_mask() -> AttrMask {
        S | AttrMask::AV
            | AttrMask::PATH_MTU
            | AttrMask::DEST_QPN
            | AttrMask::RQ_PSN
            | AttrMask::MAX_DEST_RD_ATOMIC
            | AttrMask::MIN_RNR_TIMER
    }
    fn uc_rtr_mask() -> AttrMask {
        S | AttrMask::AV | AttrMask::PATH_MTU | AttrMask::DEST_QPN | AttrMask::RQ_PSN
    }
    fn rc_rts_mask() -> AttrMask {
        S | AttrMask::TIMEOUT
            | AttrMask::RETRY_CNT
            | AttrMask::RNR_RETRY
            | AttrMask::SQ_PSN
            | AttrMask::MAX_QP_RD_ATOMIC
    }

    // ---- enums, masks, limits ------------------------------------------

    #[test]
    fn enum_values_match_verbs_h() {
        assert_eq!(QpType::Rc as u32, 2);
        assert_eq!(QpType::Uc as u32, 3);
        assert_eq!(QpType::Ud as u32, 4);
        for (i, s) in QpState::ALL.into_iter().enumerate() {
            assert_eq!(s as u32, i as u32);
            assert_eq!(QpState::try_from(i as u32), Ok(s));
        }
        for (i, m) in Mtu::ALL.into_iter().enumerate() {
            assert_eq!(m as u32, i as u32 + 1);
            assert_eq!(Mtu::try_from(i as u32 + 1), Ok(m));
        }
        for t in QpType::ALL {
            assert_eq!(QpType::try_from(t as u32), Ok(t));
        }
    }

    /// The kernel's XRC_INI and XRC_TGT columns, as `Transition::rule`
    /// derives them from RC's.
    #[test]
    fn xrc_rules_are_the_kernels_xrc_columns() {
        use QpState::*;
        let rule = |from, to, t| transition(from, to).unwrap().rule(t);
        let uc_rtr = m(&[
            AttrMask::AV,
            AttrMask::PATH_MTU,
            AttrMask::DEST_QPN,
            AttrMask::RQ_PSN,
        ]);
        assert_eq!(rule(Init, Rtr, QpType::XrcSend).required, uc_rtr);
        assert_eq!(rule(Init, Rtr, QpType::XrcRecv).required, RC_RTR);
        assert_eq!(rule(Rtr, Rts, QpType::XrcSend).required, RC_RTS);
        assert_eq!(
            rule(Rtr, Rts, QpType::XrcRecv).required,
            m(&[AttrMask::TIMEOUT, AttrMask::SQ_PSN])
        );
        assert!(!rule(Rtr, Rts, QpType::XrcSend)
            .optional
            .contains(AttrMask::MIN_RNR_TIMER));
        assert!(rule(Rtr, Rts, QpType::XrcRecv)
            .optional
            .contains(AttrMask::MIN_RNR_TIMER));
        assert_eq!(rule(Reset, Init, QpType::XrcRecv).required, CONNECTED_INIT);
        let sqd = rule(Sqd, Sqd, QpType::XrcRecv).optional;
        assert!(sqd.contains(AttrMask::MAX_DEST_RD_ATOMIC) && !sqd.contains(AttrMask::RETRY_CNT));
    }

    #[test]
    fn try_from_rejects_unknown_values() {
        for v in [7, 8, 100, u32::MAX] {
            let e = QpState::try_from(v).unwrap_err();
            assert_eq!(e.value, v);
            let ve: VerbsError = e.into();
            assert_eq!(ve.errno, Errno::EINVAL);
        }
        // 8 is IBV_QPT_RAW_PACKET, 11 IBV_QPT_DRIVER.
        for v in [0, 1, 5, 8, 11, 0xff, u32::MAX] {
            assert!(QpType::try_from(v).is_err(), "QP type {v}");
        }
        assert_eq!(QpType::try_from(9), Ok(QpType::XrcSend));
        assert_eq!(QpType::try_from(10), Ok(QpType::XrcRecv));
        for v in [0, 6, 7, u32::MAX] {
            assert!(Mtu::try_from(v).is_err(), "MTU {v}");
        }
        let e = Mtu::try_from(6)
            .unwrap_err()
            .to_verbs_error("ibv_query_port");
        assert_eq!(e.verb, "ibv_query_port");
        assert!(e.detail.contains("path MTU"));
    }

    #[test]
    fn display_names() {
        let names: Vec<String> = QpState::ALL.iter().map(|s| s.to_string()).collect();
        assert_eq!(names, ["RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"]);
        assert_eq!(QpType::Uc.to_string(), "UC");
        assert_eq!(AttrMask::EMPTY.to_string(), "0");
        assert_eq!(
            (AttrMask::STATE | AttrMask::QKEY).to_string(),
            "IBV_QP_STATE|IBV_QP_QKEY"
        );
        assert_eq!(
            AttrMask(AttrMask::PORT.0 | 1 << 22).to_string(),
            "IBV_QP_PORT|0x400000"
        );
    }

    #[test]
    fn mtu_bytes_round_trip() {
        let bytes: Vec<usize> = Mtu::ALL.iter().map(|m| m.bytes()).collect();
        assert_eq!(bytes, [256, 512, 1024, 2048, 4096]);
        for m in Mtu::ALL {
            assert_eq!(Mtu::from_bytes(m.bytes()), Some(m));
        }
        for b in [0, 1, 255, 257, 1500, 8192, 9000, usize::MAX] {
            assert_eq!(Mtu::from_bytes(b), None);
        }
        assert_eq!(Mtu::default(), Mtu::Mtu256);
    }

    #[test]
    fn mask_bits_match_verbs_h() {
        let expect = [
            (AttrMask::STATE, 0),
            (AttrMask::CUR_STATE, 1),
            (AttrMask::EN_SQD_ASYNC_NOTIFY, 2),
            (AttrMask::ACCESS_FLAGS, 3),
            (AttrMask::PKEY_INDEX, 4),
            (AttrMask::PORT, 5),
            (AttrMask::QKEY, 6),
            (AttrMask::AV, 7),
            (AttrMask::PATH_MTU, 8),
            (AttrMask::TIMEOUT, 9),
            (AttrMask::RETRY_CNT, 10),
            (AttrMask::RNR_RETRY, 11),
            (AttrMask::RQ_PSN, 12),
            (AttrMask::MAX_QP_RD_ATOMIC, 13),
            (AttrMask::ALT_PATH, 14),
            (AttrMask::MIN_RNR_TIMER, 15),
            (AttrMask::SQ_PSN, 16),
            (AttrMask::MAX_DEST_RD_ATOMIC, 17),
            (AttrMask::PATH_MIG_STATE, 18),
            (AttrMask::CAP, 19),
            (AttrMask::DEST_QPN, 20),
            (AttrMask::RATE_LIMIT, 25),
        ];
        for (m, bit) in expect {
            assert_eq!(m.bits(), 1 << bit, "{m}");
        }
        assert_eq!(AttrMask::STANDARD.bits(), 0x1F_FFFF);
    }

    #[test]
    fn mask_operations() {
        let a = AttrMask::STATE | AttrMask::PORT;
        assert!(a.contains(AttrMask::STATE));
        assert!(a.contains(a));
        assert!(a.contains(AttrMask::EMPTY));
        assert!(!a.contains(AttrMask::STATE | AttrMask::QKEY));
        assert!(a.intersects(AttrMask::PORT | AttrMask::QKEY));
        assert!(!a.intersects(AttrMask::QKEY));
        assert_eq!(a.union(AttrMask::QKEY), a | AttrMask::QKEY);
        assert_eq!(a & AttrMask::PORT, AttrMask::PORT);
        assert_eq!(a.difference(AttrMask::PORT), AttrMask::STATE);
        let mut b = AttrMask::EMPTY;
        assert!(b.is_empty());
        b |= AttrMask::AV;
        assert_eq!(b, AttrMask::AV);
        assert_eq!(AttrMask::from_list(&[AttrMask::STATE, AttrMask::PORT]), a);
    }

    #[test]
    fn limits_default_is_rxe() {
        assert_eq!(QpLimits::default(), L);
    }

    #[test]
    fn supported_access_is_rxes() {
        let a = SUPPORTED_QP_ACCESS;
        for f in [
            AccessFlags::LOCAL_WRITE,
            AccessFlags::REMOTE_WRITE,
            AccessFlags::REMOTE_READ,
            AccessFlags::REMOTE_ATOMIC,
            AccessFlags::MW_BIND,
            AccessFlags::ON_DEMAND,
            AccessFlags::RELAXED_ORDERING,
        ] {
            assert!(a.contains(f), "{f:?}");
        }
        assert!(!a.contains(AccessFlags::ZERO_BASED));
        assert!(!a.contains(AccessFlags::HUGETLB));
        assert_eq!(a.0, 0x3FF0_035F);
    }

    // ---- the table -------------------------------------------------------

    #[test]
    fn table_has_no_duplicates_and_the_expected_edges() {
        for (i, a) in TRANSITIONS.iter().enumerate() {
            for b in &TRANSITIONS[i + 1..] {
                assert!(
                    !(a.from == b.from && a.to == b.to),
                    "{}->{} twice",
                    a.from,
                    a.to
                );
            }
        }
        let mut edges: Vec<(QpState, QpState)> =
            TRANSITIONS.iter().map(|t| (t.from, t.to)).collect();
        edges.sort();
        let mut expect = vec![
            (Reset, Reset),
            (Reset, Init),
            (Init, Init),
            (Init, Rtr),
            (Rtr, Rts),
            (Rts, Rts),
            (Rts, Sqd),
            (Sqd, Rts),
            (Sqd, Sqd),
            (Sqe, Rts),
            (ErrS, ErrS),
        ];
        for s in [Init, Rtr, Rts, Sqd, Sqe, ErrS] {
            expect.push((s, Reset));
            if s != ErrS {
                expect.push((s, ErrS));
            }
        }
        expect.sort();
        assert_eq!(edges, expect);
        // STATE is never listed (it is always allowed), nor are CAP or RATE_LIMIT.
        for t in TRANSITIONS {
            for ty in QpType::ALL {
                let r = t.rule(ty);
                let listed = r.required | r.optional;
                assert!(!listed.intersects(AttrMask::STATE | AttrMask::CAP | AttrMask::RATE_LIMIT));
                assert!(!r.required.intersects(r.optional));
                // The kernel requires the APM attributes nowhere.
                assert!(!r.required.intersects(APM_ATTRS));
            }
        }
    }

    #[test]
    fn every_table_transition_succeeds_with_its_required_attributes() {
        for t in TRANSITIONS {
            for ty in QpType::ALL {
                let attr = good(t.to);
                let mask = S | t.rule(ty).required;
                assert_eq!(ok(ty, t.from, &attr, mask), t.to);
            }
        }
    }

    #[test]
    fn exhaustive_pairs_not_in_the_table_fail() {
        let mut illegal = 0;
        for ty in QpType::ALL {
            for from in QpState::ALL {
                for to in QpState::ALL {
                    if transition(from, to).is_some() {
                        continue;
                    }
                    illegal += 1;
                    let attr = good(to);
                    let d = einval(ty, from, &attr, S);
                    assert!(d.contains("cannot go from"), "{d}");
                    // No mask makes it legal.
                    for t in TRANSITIONS {
                        let mask = S | t.rule(ty).required | t.rule(ty).optional;
                        let mask = mask.difference(APM_ATTRS | AttrMask::CUR_STATE);
                        einval(ty, from, &attr, mask);
                    }
                    // Nor does IBV_QP_CUR_STATE naming another state `to` is illegal from.
                    for cur in [Rtr, Rts, Sqd, Sqe] {
                        if transition(cur, to).is_none() {
                            let attr = QpAttr {
                                cur_qp_state: cur,
                                ..good(to)
                            };
                            einval(ty, from, &attr, S | AttrMask::CUR_STATE);
                        }
                    }
                }
            }
        }
        assert_eq!(illegal, 3 * (49 - 22));
    }

    #[test]
    fn each_missing_required_bit_fails() {
        for t in TRANSITIONS {
            for ty in QpType::ALL {
                let rule = t.rule(ty);
                for bit in standard_bits().filter(|b| rule.required.contains(*b)) {
                    let mask = (S | rule.required).difference(bit);
                    let d = einval(ty, t.from, &good(t.to), mask);
                    assert!(d.contains("requires"), "{d}");
                }
            }
        }
    }

    #[test]
    fn each_disallowed_extra_bit_fails() {
        for t in TRANSITIONS {
            for ty in QpType::ALL {
                let rule = t.rule(ty);
                for bit in standard_bits().filter(|b| !rule.allowed().contains(*b)) {
                    let attr = QpAttr {
                        cur_qp_state: t.from,
                        ..good(t.to)
                    };
                    einval(ty, t.from, &attr, S | rule.required | bit);
                }
            }
        }
    }

    #[test]
    fn each_optional_bit_is_accepted_except_apm() {
        for t in TRANSITIONS {
            for ty in QpType::ALL {
                let rule = t.rule(ty);
                for bit in standard_bits().filter(|b| rule.optional.contains(*b)) {
                    let attr = QpAttr {
                        cur_qp_state: t.from,
                        ..good(t.to)
                    };
                    let mask = S | rule.required | bit;
                    let uc_av_quirk = ty == QpType::Uc && bit == AttrMask::AV;
                    if APM_ATTRS.contains(bit) {
                        let d = einval(ty, t.from, &attr, mask);
                        assert!(d.contains("path migration"), "{d}");
                    } else if uc_av_quirk {
                        // uverbs adds IBV_QP_PORT, which UC SQD->SQD does not take.
                        let d = einval(ty, t.from, &attr, mask);
                        assert!(d.contains("implies IBV_QP_PORT"), "{d}");
                    } else {
                        assert_eq!(ok(ty, t.from, &attr, mask), t.to, "{ty} {bit}");
                    }
                }
            }
        }
    }

    // ---- connect sequences ----------------------------------------------

    #[test]
    fn rc_connect_sequence() {
        let (state, st) = drive(
            QpType::Rc,
            &[
                (good(Init), rc_init_mask()),
                (good(Rtr), rc_rtr_mask()),
                (good(Rts), rc_rts_mask()),
            ],
        );
        assert_eq!(state, Rts);
        assert_eq!(st.qp_state, Rts);
        assert_eq!(st.dest_qp_num, 0x12);
        assert_eq!(st.rq_psn, 0x12_3456);
        assert_eq!(st.sq_psn, 0x65_4321);
        assert_eq!(st.path_mtu, Mtu::Mtu1024);
        assert_eq!(st.timeout, 14);
        assert_eq!(st.port_num, 1);
    }

    #[test]
    fn uc_connect_sequence() {
        let (state, st) = drive(
            QpType::Uc,
            &[
                (good(Init), rc_init_mask()),
                (good(Rtr), uc_rtr_mask()),
                (good(Rts), S | AttrMask::SQ_PSN),
            ],
        );
        assert_eq!(state, Rts);
        assert_eq!(st.sq_psn, 0x65_4321);
        // UC takes none of the RD-atomic, timeout or retry attributes.
        for bit in [AttrMask::MAX_DEST_RD_ATOMIC, AttrMask::MIN_RNR_TIMER] {
            einval(QpType::Uc, Init, &good(Rtr), uc_rtr_mask() | bit);
        }
        for bit in [
            AttrMask::TIMEOUT,
            AttrMask::RETRY_CNT,
            AttrMask::RNR_RETRY,
            AttrMask::MAX_QP_RD_ATOMIC,
            AttrMask::MIN_RNR_TIMER,
        ] {
            einval(QpType::Uc, Rtr, &good(Rts), S | AttrMask::SQ_PSN | bit);
        }
    }

    #[test]
    fn ud_connect_sequence() {
        let (state, st) = drive(
            QpType::Ud,
            &[
                (good(Init), ud_init_mask()),
                (good(Rtr), S),
                (good(Rts), S | AttrMask::SQ_PSN),
            ],
        );
        assert_eq!(state, Rts);
        assert_eq!(st.qkey, 0x1111_1111);
        // UD needs QKEY at RESET->INIT, takes no access flags, AV or path fields.
        einval(
            QpType::Ud,
            Reset,
            &good(Init),
            ud_init_mask().difference(AttrMask::QKEY),
        );
        einval(
            QpType::Ud,
            Reset,
            &good(Init),
            ud_init_mask() | AttrMask::ACCESS_FLAGS,
        );
        for bit in [
            AttrMask::AV,
            AttrMask::PATH_MTU,
            AttrMask::DEST_QPN,
            AttrMask::RQ_PSN,
            AttrMask::MAX_DEST_RD_ATOMIC,
            AttrMask::MIN_RNR_TIMER,
        ] {
            einval(QpType::Ud, Init, &good(Rtr), S | bit);
        }
        einval(QpType::Ud, Rtr, &good(Rts), S);
        ok(
            QpType::Ud,
            Init,
            &good(Rtr),
            S | AttrMask::QKEY | AttrMask::PKEY_INDEX,
        );
    }

    // ---- real programs --------------------------------------------------

    /// rdma-core libibverbs/examples/rc_pingpong.c (and srq_pingpong.c):
    /// INIT with qp_access_flags 0; RTR with max_dest_rd_atomic 1,
    /// min_rnr_timer 12 and a GRH (-g, needed on RoCE); RTS with timeout 14,
    /// retry_cnt 7, rnr_retry 7, max_rd_atomic 1.
    #[test]
    fn ibv_rc_pingpong() {
        let init = QpAttr {
            qp_state: Init,
            pkey_index: 0,
            port_num: 1,
            qp_access_flags: AccessFlags::NONE,
            ..QpAttr::default()
        };
        let rtr = QpAttr {
            qp_state: Rtr,
            path_mtu: Mtu::Mtu1024,
            dest_qp_num: 0x11,
            rq_psn: 0x0a_bcde,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
            av: AddressVector {
                is_global: true,
                hop_limit: 1,
                dgid: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 1],
                sgid_index: 0,
                port_num: 1,
                ..AddressVector::default()
            },
            ..QpAttr::default()
        };
        let rts = QpAttr {
            qp_state: Rts,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            sq_psn: 0x12_3456,
            max_rd_atomic: 1,
            ..rtr
        };
        let (state, st) = drive(
            QpType::Rc,
            &[
                (init, rc_init_mask()),
                (rtr, rc_rtr_mask()),
                (rts, rc_rts_mask()),
            ],
        );
        assert_eq!(state, Rts);
        assert_eq!(st.qp_access_flags, AccessFlags::NONE);
        assert_eq!(st.max_rd_atomic, 1);
        assert_eq!(st.max_dest_rd_atomic, 1);
        // Without -g the AV has no GRH: rxe (RoCE) refuses it.
        let no_grh = QpAttr {
            av: AddressVector {
                is_global: false,
                ..rtr.av
            },
            ..rtr
        };
        let d = einval(QpType::Rc, Init, &no_grh, rc_rtr_mask());
        assert!(d.contains("GRH"), "{d}");
    }

    /// rdma-core libibverbs/examples/uc_pingpong.c.
    #[test]
    fn ibv_uc_pingpong() {
        let init = QpAttr {
            qp_state: Init,
            port_num: 1,
            ..QpAttr::default()
        };
        let rtr = QpAttr {
            qp_state: Rtr,
            path_mtu: Mtu::Mtu1024,
            dest_qp_num: 0x11,
            rq_psn: 0x00_0001,
            av: good(Rtr).av,
            ..QpAttr::default()
        };
        let rts = QpAttr {
            qp_state: Rts,
            sq_psn: 0xff_ffff,
            ..rtr
        };
        let (state, _) = drive(
            QpType::Uc,
            &[
                (init, rc_init_mask()),
                (rtr, uc_rtr_mask()),
                (rts, S | AttrMask::SQ_PSN),
            ],
        );
        assert_eq!(state, Rts);
    }

    /// rdma-core libibverbs/examples/ud_pingpong.c: qkey 0x11111111, RTR
    /// with IBV_QP_STATE alone, RTS with SQ_PSN (the AH is separate).
    #[test]
    fn ibv_ud_pingpong() {
        let init = QpAttr {
            qp_state: Init,
            port_num: 1,
            qkey: 0x1111_1111,
            ..QpAttr::default()
        };
        let rtr = QpAttr {
            qp_state: Rtr,
            ..QpAttr::default()
        };
        let rts = QpAttr {
            qp_state: Rts,
            sq_psn: 0x44_4444,
            ..rtr
        };
        let (state, st) = drive(
            QpType::Ud,
            &[
                (init, ud_init_mask()),
                (rtr, S),
                (rts, S | AttrMask::SQ_PSN),
            ],
        );
        assert_eq!(state, Rts);
        assert_eq!(st.qkey, 0x1111_1111);
    }

    /// perftest src/perftest_resources.c, ctx_modify_qp_to_init/rtr/rts for
    /// RC with each verb's access flags (ib_send_bw, ib_write_bw,
    /// ib_read_bw, ib_atomic_bw, with and without data validation), GID
    /// index given (RoCE), hop_limit 0xFF, out_reads 16, qp_timeout 14.
    #[test]
    fn perftest_rc() {
        let r = AccessFlags::REMOTE_READ;
        let w = AccessFlags::REMOTE_WRITE;
        let a = AccessFlags::REMOTE_ATOMIC;
        for flags in [w | AccessFlags::LOCAL_WRITE, w, w | a | r, r, r | a, a] {
            let init = QpAttr {
                qp_state: Init,
                pkey_index: 0,
                port_num: 1,
                qp_access_flags: flags,
                ..QpAttr::default()
            };
            let rtr = QpAttr {
                qp_state: Rtr,
                path_mtu: Mtu::Mtu4096,
                dest_qp_num: 0x2a,
                rq_psn: 0x77_7777,
                max_dest_rd_atomic: 16,
                min_rnr_timer: 12,
                av: AddressVector {
                    is_global: true,
                    hop_limit: 0xFF,
                    traffic_class: 0,
                    ..good(Rtr).av
                },
                ..QpAttr::default()
            };
            let rts = QpAttr {
                qp_state: Rts,
                sq_psn: 0x12_3456,
                timeout: 14,
                retry_cnt: 7,
                rnr_retry: 7,
                max_rd_atomic: 16,
                ..rtr
            };
            let rtr_mask = S
                | AttrMask::AV
                | AttrMask::PATH_MTU
                | AttrMask::DEST_QPN
                | AttrMask::RQ_PSN
                | AttrMask::MIN_RNR_TIMER
                | AttrMask::MAX_DEST_RD_ATOMIC;
            let rts_mask = S
                | AttrMask::SQ_PSN
                | AttrMask::TIMEOUT
                | AttrMask::RETRY_CNT
                | AttrMask::RNR_RETRY
                | AttrMask::MAX_QP_RD_ATOMIC;
            let (state, st) = drive(
                QpType::Rc,
                &[(init, rc_init_mask()), (rtr, rtr_mask), (rts, rts_mask)],
            );
            assert_eq!(state, Rts);
            assert_eq!(st.qp_access_flags, flags);
            assert_eq!(st.max_rd_atomic, 16);
        }
        // Packet pacing (--rate_limit_type=PP) sets IBV_QP_RATE_LIMIT: rxe says EOPNOTSUPP.
        fails(
            QpType::Rc,
            Rtr,
            &good(Rts),
            rc_rts_mask() | AttrMask::RATE_LIMIT,
            Errno::EOPNOTSUPP,
        );
    }

    /// perftest UC: INIT with IBV_ACCESS_REMOTE_WRITE (write/send), RTR
    /// without the RC-only bits, RTS with SQ_PSN only.
    #[test]
    fn perftest_uc() {
        for flags in [
            AccessFlags::REMOTE_WRITE,
            AccessFlags::REMOTE_WRITE | AccessFlags::LOCAL_WRITE,
        ] {
            let init = QpAttr {
                qp_state: Init,
                port_num: 1,
                qp_access_flags: flags,
                ..QpAttr::default()
            };
            let (state, _) = drive(
                QpType::Uc,
                &[
                    (init, rc_init_mask()),
                    (good(Rtr), uc_rtr_mask()),
                    (good(Rts), S | AttrMask::SQ_PSN),
                ],
            );
            assert_eq!(state, Rts);
        }
    }

    /// perftest UD: INIT with QKEY (DEFF_QKEY 0x11111111), RTR with
    /// IBV_QP_STATE only (the AH attributes are filled but not masked), RTS
    /// with SQ_PSN.
    #[test]
    fn perftest_ud() {
        let init = QpAttr {
            qp_state: Init,
            port_num: 1,
            qkey: 0x1111_1111,
            ..QpAttr::default()
        };
        let rtr = QpAttr {
            qp_state: Rtr,
            av: AddressVector {
                is_global: true,
                sgid_index: 3, // set but not masked: ignored
                port_num: 1,
                ..AddressVector::default()
            },
            ..QpAttr::default()
        };
        let rts = QpAttr {
            qp_state: Rts,
            sq_psn: 0x12_3456,
            ..rtr
        };
        let (state, st) = drive(
            QpType::Ud,
            &[
                (init, ud_init_mask()),
                (rtr, S),
                (rts, S | AttrMask::SQ_PSN),
            ],
        );
        assert_eq!(state, Rts);
        assert_eq!(st.av, AddressVector::default());
    }

    /// librdmacm (rdma_connect/rdma_accept on an IB/RoCE id): RESET->INIT,
    /// then INIT->INIT with the same attributes before RTR, RTS from the
    /// kernel CM's masks, and rdma_disconnect's move to ERR.
    #[test]
    fn librdmacm_rc() {
        let flags = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::LOCAL_WRITE;
        let init = QpAttr {
            qp_state: Init,
            port_num: 1,
            qp_access_flags: flags,
            ..good(Init)
        };
        let (state, _) = drive(
            QpType::Rc,
            &[
                (init, rc_init_mask()),
                (init, rc_init_mask()),
                (good(Rtr), rc_rtr_mask()),
                (good(Rts), rc_rts_mask()),
                (good(ErrS), S),
            ],
        );
        assert_eq!(state, ErrS);
    }

    // ---- illegal transitions, ERR and RESET -----------------------------

    #[test]
    fn illegal_transitions() {
        for (from, to) in [
            (Reset, Rtr),
            (Reset, Rts),
            (Reset, ErrS),
            (Init, Rts),
            (Init, Sqd),
            (Rtr, Init),
            (Rtr, Rtr),
            (Rtr, Sqd),
            (Rts, Init),
            (Rts, Rtr),
            (Sqd, Init),
            (Sqd, Rtr),
            (Rts, Sqe),
            (ErrS, Init),
            (ErrS, Rts),
            (Sqe, Sqe),
        ] {
            for ty in QpType::ALL {
                // Even with every attribute the other transitions use.
                let all = AttrMask::STANDARD.difference(APM_ATTRS | AttrMask::CAP);
                einval(ty, from, &good(to), S);
                einval(ty, from, &good(to), all);
            }
        }
    }

    #[test]
    fn to_reset_and_error_from_every_state() {
        for ty in QpType::ALL {
            for from in QpState::ALL {
                assert_eq!(ok(ty, from, &good(Reset), S), Reset);
                if from == Reset {
                    // The kernel's table has no RESET->ERR.
                    einval(ty, from, &good(ErrS), S);
                } else {
                    assert_eq!(ok(ty, from, &good(ErrS), S), ErrS);
                }
            }
        }
    }

    #[test]
    fn reset_and_error_take_no_other_attribute() {
        for ty in QpType::ALL {
            for from in [Init, Rtr, Rts, Sqd, Sqe, ErrS] {
                for to in [Reset, ErrS] {
                    for bit in standard_bits().filter(|b| *b != S) {
                        einval(ty, from, &good(to), S | bit);
                    }
                }
            }
        }
    }

    #[test]
    fn no_state_bit_means_a_transition_to_the_same_state() {
        let ty = QpType::Rc;
        assert_eq!(ok(ty, Reset, &good(Rts), AttrMask::EMPTY), Reset);
        assert_eq!(ok(ty, ErrS, &good(Rts), AttrMask::EMPTY), ErrS);
        assert_eq!(ok(ty, Init, &good(Rts), AttrMask::ACCESS_FLAGS), Init);
        assert_eq!(ok(ty, Rts, &good(Init), AttrMask::MIN_RNR_TIMER), Rts);
        assert_eq!(ok(ty, Sqd, &good(Init), AttrMask::TIMEOUT), Sqd);
        // RTR->RTR and SQE->SQE are not in the table, even with an empty mask.
        einval(ty, Rtr, &good(Rts), AttrMask::EMPTY);
        einval(ty, Sqe, &good(Rts), AttrMask::EMPTY);
        // RTS->RTS does not take TIMEOUT.
        einval(ty, Rts, &good(Init), AttrMask::TIMEOUT);
    }

    #[test]
    fn cur_state_rules() {
        let ty = QpType::Uc;
        let with_cur = |cur: QpState, to: QpState| QpAttr {
            cur_qp_state: cur,
            ..good(to)
        };
        let m = S | AttrMask::SQ_PSN | AttrMask::CUR_STATE;
        assert_eq!(ok(ty, Rtr, &with_cur(Rtr, Rts), m), Rts);
        // CUR_STATE replaces the current state (as the kernel does).
        assert_eq!(ok(ty, Init, &with_cur(Rtr, Rts), m), Rts);
        // ... but only when it names RTR, RTS, SQD or SQE.
        let d = einval(
            ty,
            Init,
            &with_cur(Init, Rtr),
            uc_rtr_mask() | AttrMask::CUR_STATE,
        );
        assert!(d.contains("IBV_QP_CUR_STATE"), "{d}");
        einval(
            ty,
            Reset,
            &with_cur(Reset, Init),
            rc_init_mask() | AttrMask::CUR_STATE,
        );
        // And only where the table lists it.
        einval(ty, Rts, &with_cur(Rts, Sqd), S | AttrMask::CUR_STATE);
        einval(ty, Rts, &with_cur(Rts, ErrS), S | AttrMask::CUR_STATE);
        assert_eq!(
            ok(ty, Sqe, &with_cur(Sqe, Rts), S | AttrMask::CUR_STATE),
            Rts
        );
        // RC SQE->RTS takes nothing but STATE.
        einval(
            QpType::Rc,
            Sqe,
            &with_cur(Sqe, Rts),
            S | AttrMask::CUR_STATE,
        );
        assert_eq!(ok(QpType::Rc, Sqe, &good(Rts), S), Rts);
        // Without STATE: RTS->RTS.
        assert_eq!(ok(ty, Rts, &with_cur(Rts, Init), AttrMask::CUR_STATE), Rts);
    }

    #[test]
    fn sqd_transitions() {
        let ty = QpType::Rc;
        assert_eq!(
            ok(ty, Rts, &good(Sqd), S | AttrMask::EN_SQD_ASYNC_NOTIFY),
            Sqd
        );
        assert_eq!(ok(ty, Rts, &good(Sqd), S), Sqd);
        einval(ty, Rts, &good(Sqd), S | AttrMask::TIMEOUT);
        // RC SQD->SQD: the whole path may change, the AV with its port.
        let m = S
            | AttrMask::AV
            | AttrMask::TIMEOUT
            | AttrMask::RETRY_CNT
            | AttrMask::RNR_RETRY
            | AttrMask::MAX_QP_RD_ATOMIC
            | AttrMask::MAX_DEST_RD_ATOMIC
            | AttrMask::MIN_RNR_TIMER
            | AttrMask::ACCESS_FLAGS
            | AttrMask::PKEY_INDEX;
        assert_eq!(ok(ty, Sqd, &good(Sqd), m), Sqd);
        assert_eq!(ok(ty, Sqd, &good(Sqd), m | AttrMask::PORT), Sqd);
        assert_eq!(ok(ty, Sqd, &good(Sqd), AttrMask::AV), Sqd);
        // UC SQD->SQD lists AV, but uverbs adds PORT, which UC does not take.
        einval(QpType::Uc, Sqd, &good(Sqd), S | AttrMask::AV);
        assert_eq!(
            ok(
                QpType::Uc,
                Sqd,
                &good(Sqd),
                S | AttrMask::ACCESS_FLAGS | AttrMask::PKEY_INDEX
            ),
            Sqd
        );
        // UD SQD->SQD: PKEY_INDEX, QKEY.
        assert_eq!(
            ok(
                QpType::Ud,
                Sqd,
                &good(Sqd),
                S | AttrMask::QKEY | AttrMask::PKEY_INDEX
            ),
            Sqd
        );
        einval(QpType::Ud, Sqd, &good(Sqd), S | AttrMask::PORT);
        // Back to RTS.
        for t in QpType::ALL {
            assert_eq!(ok(t, Sqd, &good(Rts), S), Rts);
        }
        assert_eq!(ok(ty, Sqd, &good(Rts), S | AttrMask::MIN_RNR_TIMER), Rts);
        einval(QpType::Uc, Sqd, &good(Rts), S | AttrMask::MIN_RNR_TIMER);
    }

    #[test]
    fn av_port_must_agree_with_port() {
        let two = QpLimits { port_count: 2, ..L };
        let ty = QpType::Rc;
        let mut attr = good(Sqd);
        attr.port_num = 1;
        attr.av.port_num = 2;
        let m = S | AttrMask::AV | AttrMask::PORT;
        let e = check_modify(ty, Sqd, &attr, m, &two).unwrap_err();
        assert_eq!(e.errno, Errno::EINVAL);
        assert!(e.detail.contains("differs"), "{}", e.detail);
        attr.port_num = 2;
        assert_eq!(check_modify(ty, Sqd, &attr, m, &two), Ok(Sqd));
        // On the way to RTR the AV's port must be the QP's port.
        let stored = QpAttr {
            port_num: 1,
            ..QpAttr::default()
        };
        let mut rtr = good(Rtr);
        rtr.av.port_num = 2;
        let e = check_modify_with_stored(ty, Init, &stored, &rtr, rc_rtr_mask(), &two).unwrap_err();
        assert!(e.detail.contains("QP's port"), "{}", e.detail);
        rtr.av.port_num = 1;
        assert_eq!(
            check_modify_with_stored(ty, Init, &stored, &rtr, rc_rtr_mask(), &two),
            Ok(Rtr)
        );
    }

    #[test]
    fn draining_sqd_only_goes_to_error() {
        let stored = QpAttr {
            qp_state: Sqd,
            sq_draining: true,
            ..QpAttr::default()
        };
        let ty = QpType::Rc;
        let e = check_modify_with_stored(ty, Sqd, &stored, &good(Rts), S, &L).unwrap_err();
        assert_eq!(e.errno, Errno::EINVAL);
        assert!(e.detail.contains("draining"), "{}", e.detail);
        check_modify_with_stored(ty, Sqd, &stored, &good(Reset), S, &L).unwrap_err();
        check_modify_with_stored(ty, Sqd, &stored, &good(Sqd), S, &L).unwrap_err();
        assert_eq!(
            check_modify_with_stored(ty, Sqd, &stored, &good(ErrS), S, &L),
            Ok(ErrS)
        );
        // Attribute changes without STATE are fine while draining.
        assert_eq!(
            check_modify_with_stored(ty, Sqd, &stored, &good(Sqd), AttrMask::TIMEOUT, &L),
            Ok(Sqd)
        );
        let drained = QpAttr {
            sq_draining: false,
            ..stored
        };
        assert_eq!(
            check_modify_with_stored(ty, Sqd, &drained, &good(Rts), S, &L),
            Ok(Rts)
        );
    }

    // ---- values ---------------------------------------------------------

    /// From, to, mask, how to spoil the attributes, the attribute the error names.
    type Case = (QpState, QpState, AttrMask, fn(&mut QpAttr), &'static str);

    #[test]
    fn out_of_range_values() {
        let rc = QpType::Rc;
        let cases: Vec<Case> = vec![
            (
                Reset,
                Init,
                rc_init_mask(),
                |a| a.port_num = 0,
                "IBV_QP_PORT",
            ),
            (
                Reset,
                Init,
                rc_init_mask(),
                |a| a.port_num = 2,
                "IBV_QP_PORT",
            ),
            (
                Reset,
                Init,
                rc_init_mask(),
                |a| a.pkey_index = 1,
                "IBV_QP_PKEY_INDEX",
            ),
            (
                Reset,
                Init,
                rc_init_mask(),
                |a| a.qp_access_flags = AccessFlags::ZERO_BASED,
                "IBV_QP_ACCESS_FLAGS",
            ),
            (
                Reset,
                Init,
                rc_init_mask(),
                |a| a.qp_access_flags = AccessFlags::HUGETLB,
                "IBV_QP_ACCESS_FLAGS",
            ),
            (
                Reset,
                Init,
                rc_init_mask(),
                |a| a.qp_access_flags = AccessFlags(1 << 10),
                "IBV_QP_ACCESS_FLAGS",
            ),
            (
                Reset,
                Init,
                rc_init_mask(),
                |a| a.qp_access_flags = AccessFlags(1 << 30),
                "IBV_QP_ACCESS_FLAGS",
            ),
            (Init, Rtr, rc_rtr_mask(), |a| a.av.port_num = 0, "IBV_QP_AV"),
            (Init, Rtr, rc_rtr_mask(), |a| a.av.port_num = 2, "IBV_QP_AV"),
            (
                Init,
                Rtr,
                rc_rtr_mask(),
                |a| a.av.is_global = false,
                "IBV_QP_AV",
            ),
            (
                Init,
                Rtr,
                rc_rtr_mask(),
                |a| a.av.sgid_index = 2,
                "IBV_QP_AV",
            ),
            (
                Init,
                Rtr,
                rc_rtr_mask(),
                |a| a.dest_qp_num = 1 << 24,
                "IBV_QP_DEST_QPN",
            ),
            (
                Init,
                Rtr,
                rc_rtr_mask(),
                |a| a.min_rnr_timer = 32,
                "IBV_QP_MIN_RNR_TIMER",
            ),
            (
                Init,
                Rtr,
                rc_rtr_mask(),
                |a| a.max_dest_rd_atomic = 129,
                "IBV_QP_MAX_DEST_RD_ATOMIC",
            ),
            (
                Rtr,
                Rts,
                rc_rts_mask(),
                |a| a.timeout = 32,
                "IBV_QP_TIMEOUT",
            ),
            (
                Rtr,
                Rts,
                rc_rts_mask(),
                |a| a.retry_cnt = 8,
                "IBV_QP_RETRY_CNT",
            ),
            (
                Rtr,
                Rts,
                rc_rts_mask(),
                |a| a.rnr_retry = 8,
                "IBV_QP_RNR_RETRY",
            ),
            (
                Rtr,
                Rts,
                rc_rts_mask(),
                |a| a.max_rd_atomic = 129,
                "IBV_QP_MAX_QP_RD_ATOMIC",
            ),
            (
                Init,
                Init,
                S | AttrMask::PORT,
                |a| a.port_num = 9,
                "IBV_QP_PORT",
            ),
        ];
        for (from, to, mask, set, name) in cases {
            let mut attr = good(to);
            set(&mut attr);
            let d = einval(rc, from, &attr, mask);
            assert!(d.contains(name), "{name}: {d}");
        }
        // The limits, inclusive.
        let mut attr = good(Rts);
        attr.timeout = 31;
        attr.retry_cnt = 7;
        attr.rnr_retry = 7;
        attr.max_rd_atomic = 128;
        ok(rc, Rtr, &attr, rc_rts_mask());
        let mut attr = good(Rtr);
        attr.min_rnr_timer = 31;
        attr.max_dest_rd_atomic = 128;
        attr.dest_qp_num = MAX_QPN;
        ok(rc, Init, &attr, rc_rtr_mask());
        attr.max_dest_rd_atomic = 0;
        ok(rc, Init, &attr, rc_rtr_mask());
    }

    #[test]
    fn values_outside_the_mask_are_not_checked() {
        let mut attr = good(Init);
        attr.timeout = 200;
        attr.retry_cnt = 200;
        attr.av.is_global = false;
        attr.dest_qp_num = u32::MAX;
        attr.qkey = u32::MAX;
        attr.max_rd_atomic = 255;
        ok(QpType::Rc, Reset, &attr, rc_init_mask());
    }

    #[test]
    fn access_flags_rxe_accepts() {
        let flags = AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC
            | AccessFlags::MW_BIND
            | AccessFlags::ON_DEMAND
            | AccessFlags::RELAXED_ORDERING
            | AccessFlags(ACCESS_FLUSH_GLOBAL | ACCESS_FLUSH_PERSISTENT | 1 << 29);
        let attr = QpAttr {
            qp_access_flags: flags,
            ..good(Init)
        };
        for ty in [QpType::Rc, QpType::Uc] {
            ok(ty, Reset, &attr, rc_init_mask());
            ok(ty, Init, &attr, S | AttrMask::ACCESS_FLAGS);
            ok(ty, Rts, &attr, AttrMask::ACCESS_FLAGS);
        }
    }

    #[test]
    fn large_psns_are_masked_not_rejected() {
        let mut attr = good(Rtr);
        attr.rq_psn = 0xFFFF_FFFF;
        let (_, st) = drive(
            QpType::Rc,
            &[
                (good(Init), rc_init_mask()),
                (attr, rc_rtr_mask()),
                (
                    QpAttr {
                        sq_psn: 0x0100_0005,
                        ..good(Rts)
                    },
                    rc_rts_mask(),
                ),
            ],
        );
        assert_eq!(st.rq_psn, 0xFF_FFFF);
        assert_eq!(st.sq_psn, 5);
    }

    #[test]
    fn privileged_qkey_is_eperm() {
        let attr = QpAttr {
            qkey: 0x8000_0001,
            ..good(Init)
        };
        let d = fails(QpType::Ud, Reset, &attr, ud_init_mask(), Errno::EPERM);
        assert!(d.contains("IBV_QP_QKEY"), "{d}");
        // uverbs checks it before the driver sees the (illegal) mask.
        fails(
            QpType::Rc,
            Reset,
            &attr,
            rc_init_mask() | AttrMask::QKEY,
            Errno::EPERM,
        );
        // But a bad port comes first.
        let attr = QpAttr {
            port_num: 0,
            ..attr
        };
        einval(QpType::Ud, Reset, &attr, ud_init_mask());
        let attr = QpAttr {
            qkey: 0x7FFF_FFFF,
            ..good(Init)
        };
        ok(QpType::Ud, Reset, &attr, ud_init_mask());
    }

    #[test]
    fn unsupported_mask_bits_are_eopnotsupp() {
        for bit in [21, 22, 23, 24, 25, 26, 31] {
            let mask = rc_init_mask() | AttrMask(1 << bit);
            let d = fails(QpType::Rc, Reset, &good(Init), mask, Errno::EOPNOTSUPP);
            assert!(d.contains("not supported"), "{d}");
        }
        // Even with otherwise bad values.
        let attr = QpAttr {
            port_num: 0,
            ..good(Init)
        };
        fails(
            QpType::Rc,
            Reset,
            &attr,
            rc_init_mask() | AttrMask::RATE_LIMIT,
            Errno::EOPNOTSUPP,
        );
    }

    #[test]
    fn cap_and_apm_are_einval() {
        einval(QpType::Rc, Rts, &good(Rts), AttrMask::CAP);
        einval(
            QpType::Rc,
            Reset,
            &good(Init),
            rc_init_mask() | AttrMask::CAP,
        );
        let d = einval(
            QpType::Rc,
            Init,
            &good(Rtr),
            rc_rtr_mask() | AttrMask::ALT_PATH,
        );
        assert!(d.contains("IBV_QP_ALT_PATH"), "{d}");
        let d = einval(
            QpType::Rc,
            Rtr,
            &good(Rts),
            rc_rts_mask() | AttrMask::PATH_MIG_STATE,
        );
        assert!(d.contains("path migration"), "{d}");
        einval(QpType::Uc, Rts, &good(Rts), AttrMask::PATH_MIG_STATE);
    }

    // ---- apply ----------------------------------------------------------

    #[test]
    fn apply_copies_exactly_the_masked_fields() {
        let before = good(Init);
        let incoming = QpAttr {
            qp_state: Rtr,
            timeout: 3,
            qkey: 9,
            dest_qp_num: 0x77,
            path_mtu: Mtu::Mtu4096,
            ..QpAttr::default()
        };
        let mut stored = before;
        let fx = apply(
            &mut stored,
            &incoming,
            S | AttrMask::DEST_QPN | AttrMask::PATH_MTU,
            Rtr,
        );
        let expect = QpAttr {
            qp_state: Rtr,
            cur_qp_state: Rtr,
            dest_qp_num: 0x77,
            path_mtu: Mtu::Mtu4096,
            ..before
        };
        assert_eq!(stored, expect);
        assert_eq!(fx.state, Rtr);
        assert!(fx.state_requested);
        assert!(fx.ready_to_receive());
        assert!(!fx.ready_to_send() && !fx.reset() && !fx.error() && !fx.drain());
        assert_eq!(fx.changed, S | AttrMask::DEST_QPN | AttrMask::PATH_MTU);
    }

    #[test]
    fn apply_every_field() {
        let src = QpAttr {
            qp_state: Sqd,
            cur_qp_state: Sqd,
            path_mtu: Mtu::Mtu2048,
            qkey: 1,
            rq_psn: 2,
            sq_psn: 3,
            dest_qp_num: 4,
            qp_access_flags: AccessFlags::REMOTE_READ,
            pkey_index: 0,
            port_num: 1,
            av: AddressVector {
                hop_limit: 9,
                ..good(Rtr).av
            },
            timeout: 5,
            retry_cnt: 6,
            rnr_retry: 7,
            min_rnr_timer: 8,
            max_rd_atomic: 3,
            max_dest_rd_atomic: 5,
            en_sqd_async_notify: true,
            sq_draining: false,
        };
        let mut stored = QpAttr::default();
        let fx = apply(&mut stored, &src, AttrMask::STANDARD, Sqd);
        assert_eq!(
            stored,
            QpAttr {
                max_rd_atomic: 4,
                max_dest_rd_atomic: 8,
                sq_draining: true,
                ..src
            }
        );
        assert!(fx.drain());
    }

    #[test]
    fn apply_rounds_rd_atomic_like_rxe() {
        for (v, r) in [
            (0, 0),
            (1, 1),
            (2, 2),
            (3, 4),
            (5, 8),
            (16, 16),
            (100, 128),
            (128, 128),
            (200, 200),
        ] {
            let attr = QpAttr {
                max_rd_atomic: v,
                max_dest_rd_atomic: v,
                ..QpAttr::default()
            };
            let mut stored = QpAttr::default();
            apply(
                &mut stored,
                &attr,
                AttrMask::MAX_QP_RD_ATOMIC | AttrMask::MAX_DEST_RD_ATOMIC,
                Reset,
            );
            assert_eq!(
                (stored.max_rd_atomic, stored.max_dest_rd_atomic),
                (r, r),
                "{v}"
            );
        }
    }

    #[test]
    fn apply_av_outside_rtr_sets_the_port() {
        let mut stored = good(Sqd);
        stored.port_num = 1;
        let mut attr = good(Sqd);
        attr.port_num = 7; // not in the mask
        attr.av.port_num = 1;
        attr.av.hop_limit = 42;
        let fx = apply(&mut stored, &attr, AttrMask::AV, Sqd);
        assert_eq!(fx.changed, AttrMask::AV | AttrMask::PORT);
        assert_eq!(stored.port_num, 1);
        assert_eq!(stored.av.hop_limit, 42);
        assert!(!fx.state_requested);
        // On the way to RTR the AV does not touch the port.
        let mut stored = good(Init);
        stored.port_num = 1;
        let mut attr = good(Rtr);
        attr.port_num = 7;
        let fx = apply(&mut stored, &attr, rc_rtr_mask(), Rtr);
        assert!(!fx.changed.contains(AttrMask::PORT));
        assert_eq!(stored.port_num, 1);
    }

    #[test]
    fn apply_state_effects() {
        let mut stored = QpAttr::default();
        let fx = apply(&mut stored, &good(Init), rc_init_mask(), Init);
        assert!(fx.requested(Init));
        let fx = apply(&mut stored, &good(Rts), rc_rts_mask(), Rts);
        assert!(fx.ready_to_send());
        let fx = apply(&mut stored, &good(Sqd), S, Sqd);
        assert!(fx.drain());
        assert!(stored.sq_draining);
        // Attribute change in SQD keeps the drain going.
        let fx = apply(&mut stored, &good(Sqd), AttrMask::TIMEOUT, Sqd);
        assert!(!fx.drain());
        assert!(stored.sq_draining);
        let fx = apply(&mut stored, &good(ErrS), S, ErrS);
        assert!(fx.error());
        assert!(!stored.sq_draining);
        assert_eq!(stored.cur_qp_state, ErrS);
        // ERR->ERR and RESET->RESET re-assert the state.
        assert!(apply(&mut stored, &good(ErrS), S, ErrS).error());
        assert!(apply(&mut stored, &good(Reset), S, Reset).reset());
        assert!(apply(&mut stored, &good(Reset), S, Reset).reset());
        // Without STATE nothing is requested.
        let fx = apply(&mut stored, &good(Init), AttrMask::EMPTY, Reset);
        assert!(!fx.reset());
        assert_eq!(fx.state, Reset);
        // Attributes survive RESET, as in rxe.
        assert_eq!(stored.timeout, 14);
    }

    // ---- robustness -----------------------------------------------------

    fn any_state() -> impl Strategy<Value = QpState> {
        (0u32..7).prop_map(|v| QpState::try_from(v).unwrap_or_default())
    }

    fn any_type() -> impl Strategy<Value = QpType> {
        (2u32..5).prop_map(|v| QpType::try_from(v).unwrap_or(QpType::Rc))
    }

    fn any_attr() -> impl Strategy<Value = QpAttr> {
        (
            (
                any_state(),
                any_state(),
                1u32..6,
                any::<u32>(),
                any::<u32>(),
                any::<u32>(),
            ),
            (any::<u32>(), any::<u32>(), 0u16..3, 0u8..3),
            (any::<bool>(), 0u8..3, 0u8..3, any::<[u8; 16]>()),
            (0u8..40, 0u8..10, 0u8..10, 0u8..40, any::<u8>(), any::<u8>()),
            (any::<bool>(), any::<bool>()),
        )
            .prop_map(|(a, b, c, d, e)| QpAttr {
                qp_state: a.0,
                cur_qp_state: a.1,
                path_mtu: Mtu::try_from(a.2).unwrap_or_default(),
                qkey: a.3,
                rq_psn: a.4,
                sq_psn: a.5,
                dest_qp_num: b.0 >> (b.0 % 16),
                qp_access_flags: AccessFlags(b.1 & 0x3FF0_07FF),
                pkey_index: b.2,
                port_num: b.3,
                av: AddressVector {
                    dgid: c.3,
                    sgid_index: c.2,
                    is_global: c.0,
                    port_num: c.1,
                    ..AddressVector::default()
                },
                timeout: d.0,
                retry_cnt: d.1,
                rnr_retry: d.2,
                min_rnr_timer: d.3,
                max_rd_atomic: d.4,
                max_dest_rd_atomic: d.5,
                en_sqd_async_notify: e.0,
                sq_draining: e.1,
            })
    }

    fn any_mask() -> impl Strategy<Value = AttrMask> {
        prop_oneof![
            any::<u32>().prop_map(AttrMask),
            (0u32..(1 << 21)).prop_map(AttrMask),
            proptest::sample::select(TRANSITIONS.to_vec()).prop_flat_map(|t| {
                (any_type(), 0u32..(1 << 21)).prop_map(move |(ty, extra)| {
                    let r = t.rule(ty);
                    S | r.required | AttrMask(extra & r.optional.0)
                })
            }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]

        /// No input panics; whatever passes leaves the stored attributes in range.
        #[test]
        fn check_then_apply_keeps_invariants(
            ty in any_type(),
            cur in any_state(),
            stored in any_attr(),
            attr in any_attr(),
            mask in any_mask(),
        ) {
            let limits = QpLimits::default();
            let plain = check_modify(ty, cur, &attr, mask, &limits);
            let full = check_modify_with_stored(ty, cur, &stored, &attr, mask, &limits);
            if full.is_ok() {
                prop_assert_eq!(&plain, &full);
            }
            if let Ok(new) = plain {
                prop_assert!(AttrMask::STANDARD.contains(mask));
                let expect_cur = if mask.contains(AttrMask::CUR_STATE) { attr.cur_qp_state } else { cur };
                let expect_new = if mask.contains(AttrMask::STATE) { attr.qp_state } else { expect_cur };
                prop_assert_eq!(new, expect_new);
                prop_assert!(transition(expect_cur, new).is_some());
                let mut s = QpAttr::default();
                let fx = apply(&mut s, &attr, mask, new);
                prop_assert_eq!(fx.state, new);
                prop_assert_eq!(s.qp_state, new);
                prop_assert!(s.rq_psn <= PSN_MASK && s.sq_psn <= PSN_MASK);
                prop_assert!(s.dest_qp_num <= MAX_QPN);
                prop_assert!(s.timeout <= 31 && s.min_rnr_timer <= 31);
                prop_assert!(s.retry_cnt <= 7 && s.rnr_retry <= 7);
                prop_assert!(s.max_rd_atomic <= 128 && s.max_dest_rd_atomic <= 128);
                prop_assert!(s.port_num <= 1 && s.pkey_index == 0);
                prop_assert!(SUPPORTED_QP_ACCESS.contains(s.qp_access_flags));
                prop_assert!(!fx.changed.intersects(APM_ATTRS | AttrMask::CAP));
                if fx.changed.contains(AttrMask::AV) {
                    prop_assert!(
                        s.av.is_global && s.av.sgid_index <= MAX_SGID_INDEX && s.av.port_num == 1
                    );
                }
            } else if let Err(e) = plain {
                prop_assert!(
                    [Errno::EINVAL, Errno::EPERM, Errno::EOPNOTSUPP].contains(&e.errno)
                );
                prop_assert!(full.is_err());
            }
        }
    }
}
