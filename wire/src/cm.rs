//! The InfiniBand Communication Manager's MADs (IBA vol. 1 chapter 12), as
//! rdma_cm speaks them over RoCEv2.
//!
//! The CM is a management class (0x07, class version 2) of 256-byte MADs
//! sent with method Send between the General Service Interfaces (QP1) of two
//! ports: on RoCEv2 a UD SEND_ONLY to QP 1 with DETH Q_Key
//! [`GSI_QKEY`] and source QP 1, whose payload is the MAD.
//!
//! ```text
//! | MAD header (24) | CM message (232): fields, then private data |
//! ```
//!
//! [`CmMad`] parses a whole MAD into a [`MadHeaderRepr`] and a
//! [`CmMessage`] (one plain struct per message: [`ReqRepr`], [`RepRepr`],
//! ...) and emits one back. Every field of every message is kept, the
//! reserved and vendor bits included, so a parsed MAD re-emits to the same
//! 256 bytes; attributes without a typed message are kept whole
//! ([`CmMessage::Other`]). Field offsets and widths follow IBA tables
//! 106–120 as the Linux kernel declares them
//! (`include/rdma/ibta_vol1_c12.h`): a field of `w` bits "at byte `o`"
//! occupies the `w` most significant bits from byte `o` on, big-endian.
//!
//! [`rdma_cm`] holds rdma_cm's conventions on top: service IDs made of a
//! port space and a port, and the CMA header at the start of a REQ's (or
//! SIDR_REQ's) private data.
//!
//! Emitting truncates a field wider than its bit width to that width, as the
//! other emitters of this crate do (a QPN is 24 bits, a timeout 5).

use crate::error::{need, Error, Result};
use crate::field::{set_u16, set_u24, set_u32, set_u64, u16_at, u24_at, u32_at, u64_at};

/// QP number of the General Service Interface, which carries the CM.
pub const GSI_QPN: u32 = 1;
/// Q_Key of the General Service Interface (QP1).
pub const GSI_QKEY: u32 = crate::GSI_QKEY;
/// Length of a MAD.
pub const MAD_LEN: usize = 256;
/// Length of the common MAD header.
pub const MAD_HEADER_LEN: usize = 24;
/// Length of a CM message: the MAD after its header.
pub const CM_DATA_LEN: usize = MAD_LEN - MAD_HEADER_LEN;
/// MAD base version (the only one defined).
pub const MAD_BASE_VERSION: u8 = 1;
/// Management class of the Communication Manager.
pub const MGMT_CLASS_CM: u8 = 0x07;
/// CM class version the kernel speaks.
pub const CM_CLASS_VERSION: u8 = 2;
/// MAD method Send: every CM message is one.
pub const METHOD_SEND: u8 = 0x03;

/// Private data bytes of a REQ.
pub const REQ_PRIVATE_DATA: usize = 92;
/// Private data bytes of an MRA.
pub const MRA_PRIVATE_DATA: usize = 222;
/// Private data bytes of a REJ.
pub const REJ_PRIVATE_DATA: usize = 148;
/// Private data bytes of a REP.
pub const REP_PRIVATE_DATA: usize = 196;
/// Private data bytes of an RTU.
pub const RTU_PRIVATE_DATA: usize = 224;
/// Private data bytes of a DREQ.
pub const DREQ_PRIVATE_DATA: usize = 220;
/// Private data bytes of a DREP.
pub const DREP_PRIVATE_DATA: usize = 224;
/// Private data bytes of a SIDR_REQ.
pub const SIDR_REQ_PRIVATE_DATA: usize = 216;
/// Private data bytes of a SIDR_REP.
pub const SIDR_REP_PRIVATE_DATA: usize = 136;
/// Length of a REJ's Additional Rejection Information.
pub const REJ_ARI_LEN: usize = 72;
/// Length of a SIDR_REP's ClassPortInfo (additional information).
pub const SIDR_REP_CLASS_PORT_INFO_LEN: usize = 72;

/// The CM's attribute IDs (IBA table 104).
pub mod attr {
    /// ClassPortInfo.
    pub const CLASS_PORT_INFO: u16 = 0x0001;
    /// ConnectRequest (REQ).
    pub const REQ: u16 = 0x0010;
    /// MsgRcptAck (MRA).
    pub const MRA: u16 = 0x0011;
    /// ConnectReject (REJ).
    pub const REJ: u16 = 0x0012;
    /// ConnectReply (REP).
    pub const REP: u16 = 0x0013;
    /// ReadyToUse (RTU).
    pub const RTU: u16 = 0x0014;
    /// DisconnectRequest (DREQ).
    pub const DREQ: u16 = 0x0015;
    /// DisconnectReply (DREP, IBA table 113).
    pub const DREP: u16 = 0x0016;
    /// ServiceIDResReq (SIDR_REQ).
    pub const SIDR_REQ: u16 = 0x0017;
    /// ServiceIDResReqResp (SIDR_REP).
    pub const SIDR_REP: u16 = 0x0018;
    /// LoadAlternatePath (LAP).
    pub const LAP: u16 = 0x0019;
    /// AlternatePathResponse (APR).
    pub const APR: u16 = 0x001A;
}

/// The IBA name of a CM attribute ("ConnectRequest", ...; "Unknown" for
/// IDs the CM does not define).
pub fn attr_name(attr_id: u16) -> &'static str {
    match attr_id {
        attr::CLASS_PORT_INFO => "ClassPortInfo",
        attr::REQ => "ConnectRequest",
        attr::MRA => "MsgRcptAck",
        attr::REJ => "ConnectReject",
        attr::REP => "ConnectReply",
        attr::RTU => "ReadyToUse",
        attr::DREQ => "DisconnectRequest",
        attr::DREP => "DisconnectReply",
        attr::SIDR_REQ => "SIDR_REQ",
        attr::SIDR_REP => "SIDR_REP",
        attr::LAP => "LoadAlternatePath",
        attr::APR => "AlternatePathResponse",
        _ => "Unknown",
    }
}

/// REJ reasons (IBA chapter 12, REJ message; the kernel's
/// `enum ib_cm_rej_reason`).
pub mod reason {
    /// No QP available.
    pub const NO_QP: u16 = 1;
    /// No EE context available.
    pub const NO_EEC: u16 = 2;
    /// No resources available.
    pub const NO_RESOURCES: u16 = 3;
    /// Timeout (the kernel's CM sends it when a REP went unanswered).
    pub const TIMEOUT: u16 = 4;
    /// Unsupported request.
    pub const UNSUPPORTED: u16 = 5;
    /// Invalid communication ID.
    pub const INVALID_COMM_ID: u16 = 6;
    /// Invalid communication instance.
    pub const INVALID_COMM_INSTANCE: u16 = 7;
    /// Invalid service ID: nobody listens on it.
    pub const INVALID_SERVICE_ID: u16 = 8;
    /// Invalid transport service type.
    pub const INVALID_TRANSPORT_TYPE: u16 = 9;
    /// Stale connection.
    pub const STALE_CONN: u16 = 10;
    /// RDC does not exist.
    pub const RDC_NOT_EXIST: u16 = 11;
    /// Primary remote port GID rejected.
    pub const INVALID_GID: u16 = 12;
    /// Primary remote port LID rejected.
    pub const INVALID_LID: u16 = 13;
    /// Primary SL rejected.
    pub const INVALID_SL: u16 = 14;
    /// Primary traffic class rejected.
    pub const INVALID_TRAFFIC_CLASS: u16 = 15;
    /// Primary hop limit rejected.
    pub const INVALID_HOP_LIMIT: u16 = 16;
    /// Primary packet rate rejected.
    pub const INVALID_PACKET_RATE: u16 = 17;
    /// Alternate remote port GID rejected.
    pub const INVALID_ALT_GID: u16 = 18;
    /// Alternate remote port LID rejected.
    pub const INVALID_ALT_LID: u16 = 19;
    /// Alternate SL rejected.
    pub const INVALID_ALT_SL: u16 = 20;
    /// Alternate traffic class rejected.
    pub const INVALID_ALT_TRAFFIC_CLASS: u16 = 21;
    /// Alternate hop limit rejected.
    pub const INVALID_ALT_HOP_LIMIT: u16 = 22;
    /// Alternate packet rate rejected.
    pub const INVALID_ALT_PACKET_RATE: u16 = 23;
    /// Port and CM redirection.
    pub const PORT_CM_REDIRECT: u16 = 24;
    /// Port redirection.
    pub const PORT_REDIRECT: u16 = 25;
    /// Invalid path MTU.
    pub const INVALID_MTU: u16 = 26;
    /// Insufficient responder resources.
    pub const INSUFFICIENT_RESP_RESOURCES: u16 = 27;
    /// Consumer defined (rdma_reject).
    pub const CONSUMER_DEFINED: u16 = 28;
    /// Invalid RNR retry count.
    pub const INVALID_RNR_RETRY: u16 = 29;
    /// Duplicate local communication ID.
    pub const DUPLICATE_LOCAL_COMM_ID: u16 = 30;
    /// Unsupported class version.
    pub const INVALID_CLASS_VERSION: u16 = 31;
    /// Invalid primary flow label.
    pub const INVALID_FLOW_LABEL: u16 = 32;
    /// Invalid alternate flow label.
    pub const INVALID_ALT_FLOW_LABEL: u16 = 33;
    /// Vendor option not supported.
    pub const VENDOR_OPTION_NOT_SUPPORTED: u16 = 35;
}

/// A short name of a REJ reason ("InvalidServiceID", ...; "Unknown" for
/// codes not in [`reason`]).
pub fn reject_reason_name(r: u16) -> &'static str {
    match r {
        reason::NO_QP => "NoQP",
        reason::NO_EEC => "NoEEC",
        reason::NO_RESOURCES => "NoResources",
        reason::TIMEOUT => "Timeout",
        reason::UNSUPPORTED => "Unsupported",
        reason::INVALID_COMM_ID => "InvalidCommID",
        reason::INVALID_COMM_INSTANCE => "InvalidCommInstance",
        reason::INVALID_SERVICE_ID => "InvalidServiceID",
        reason::INVALID_TRANSPORT_TYPE => "InvalidTransportType",
        reason::STALE_CONN => "StaleConn",
        reason::RDC_NOT_EXIST => "RDCNotExist",
        reason::INVALID_GID => "InvalidGID",
        reason::INVALID_LID => "InvalidLID",
        reason::INVALID_SL => "InvalidSL",
        reason::INVALID_TRAFFIC_CLASS => "InvalidTrafficClass",
        reason::INVALID_HOP_LIMIT => "InvalidHopLimit",
        reason::INVALID_PACKET_RATE => "InvalidPacketRate",
        reason::INVALID_ALT_GID => "InvalidAltGID",
        reason::INVALID_ALT_LID => "InvalidAltLID",
        reason::INVALID_ALT_SL => "InvalidAltSL",
        reason::INVALID_ALT_TRAFFIC_CLASS => "InvalidAltTrafficClass",
        reason::INVALID_ALT_HOP_LIMIT => "InvalidAltHopLimit",
        reason::INVALID_ALT_PACKET_RATE => "InvalidAltPacketRate",
        reason::PORT_CM_REDIRECT => "PortCMRedirect",
        reason::PORT_REDIRECT => "PortRedirect",
        reason::INVALID_MTU => "InvalidMTU",
        reason::INSUFFICIENT_RESP_RESOURCES => "InsufficientRespResources",
        reason::CONSUMER_DEFINED => "ConsumerDefined",
        reason::INVALID_RNR_RETRY => "InvalidRNRRetry",
        reason::DUPLICATE_LOCAL_COMM_ID => "DuplicateLocalCommID",
        reason::INVALID_CLASS_VERSION => "InvalidClassVersion",
        reason::INVALID_FLOW_LABEL => "InvalidFlowLabel",
        reason::INVALID_ALT_FLOW_LABEL => "InvalidAltFlowLabel",
        reason::VENDOR_OPTION_NOT_SUPPORTED => "VendorOptionNotSupported",
        _ => "Unknown",
    }
}

// ---------------------------------------------------------------------------
// Field helpers. Every caller passes a buffer whose length was checked (a
// `[u8; CM_DATA_LEN]` or a MAD after `need`) and constant offsets inside it.

#[inline(always)]
fn arr<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[at..at + N]);
    a
}

/// The `width` bits of `byte` that start `shift` bits above its LSB.
#[inline(always)]
const fn bits(byte: u8, shift: u32, width: u32) -> u8 {
    (byte >> shift) & ((1u16 << width) - 1) as u8
}

/// `v` truncated to `width` bits, placed `shift` bits above the LSB.
#[inline(always)]
const fn put(v: u8, shift: u32, width: u32) -> u8 {
    (v & ((1u16 << width) - 1) as u8) << shift
}

// ---------------------------------------------------------------------------
// Where a message's fields lie. Each message below is a table of rows
// `name: type = place`; `cm_message!` makes the struct, `parse` and `emit`
// from it, so each offset is written once and parse and emit cannot
// disagree.

/// Where a field of a CM message lies in the 232 bytes after the MAD
/// header, and so how its value is read and written.
trait Place<T> {
    fn get(&self, d: &[u8; CM_DATA_LEN]) -> T;
    fn set(&self, d: &mut [u8; CM_DATA_LEN], v: T);
}

/// The byte at this offset.
struct Byte(usize);
/// A big-endian 16-bit number at this offset.
struct Be16(usize);
/// A big-endian 24-bit number (QPN, PSN, ...) at this offset; emitting
/// keeps the value's low 24 bits.
struct Be24(usize);
/// A big-endian 32-bit number at this offset.
struct Be32(usize);
/// A big-endian 64-bit number at this offset.
struct Be64(usize);
/// `width` bits of the byte at `at`, `shift` bits above its least
/// significant bit (a `bool` is one bit); emitting keeps the value's low
/// `width` bits.
struct Bits {
    at: usize,
    shift: u32,
    width: u32,
}
/// A 24-bit number whose three bytes lie apart, most significant first:
/// REP and SIDR_REP fit their vendor ID into bytes other fields leave over.
struct Split24([usize; 3]);
/// Bytes kept as they are, from this offset on, as many as the field's
/// array holds.
struct Bytes(usize);
/// A REQ path ([`PathRepr`], 44 bytes) from this offset on.
struct Path(usize);

impl Place<u8> for Byte {
    fn get(&self, d: &[u8; CM_DATA_LEN]) -> u8 {
        d[self.0]
    }
    fn set(&self, d: &mut [u8; CM_DATA_LEN], v: u8) {
        d[self.0] = v;
    }
}

impl Place<u16> for Be16 {
    fn get(&self, d: &[u8; CM_DATA_LEN]) -> u16 {
        u16_at(d, self.0)
    }
    fn set(&self, d: &mut [u8; CM_DATA_LEN], v: u16) {
        set_u16(d, self.0, v);
    }
}

impl Place<u32> for Be24 {
    fn get(&self, d: &[u8; CM_DATA_LEN]) -> u32 {
        u24_at(d, self.0)
    }
    fn set(&self, d: &mut [u8; CM_DATA_LEN], v: u32) {
        set_u24(d, self.0, v);
    }
}

impl Place<u32> for Be32 {
    fn get(&self, d: &[u8; CM_DATA_LEN]) -> u32 {
        u32_at(d, self.0)
    }
    fn set(&self, d: &mut [u8; CM_DATA_LEN], v: u32) {
        set_u32(d, self.0, v);
    }
}

impl Place<u64> for Be64 {
    fn get(&self, d: &[u8; CM_DATA_LEN]) -> u64 {
        u64_at(d, self.0)
    }
    fn set(&self, d: &mut [u8; CM_DATA_LEN], v: u64) {
        set_u64(d, self.0, v);
    }
}

impl Place<u8> for Bits {
    fn get(&self, d: &[u8; CM_DATA_LEN]) -> u8 {
        bits(d[self.at], self.shift, self.width)
    }
    fn set(&self, d: &mut [u8; CM_DATA_LEN], v: u8) {
        // The byte's other bits belong to other fields.
        let others = !put(0xFF, self.shift, self.width);
        d[self.at] = d[self.at] & others | put(v, self.shift, self.width);
    }
}

impl Place<bool> for Bits {
    fn get(&self, d: &[u8; CM_DATA_LEN]) -> bool {
        Place::<u8>::get(self, d) != 0
    }
    fn set(&self, d: &mut [u8; CM_DATA_LEN], v: bool) {
        Place::<u8>::set(self, d, v.into());
    }
}

impl Place<u32> for Split24 {
    fn get(&self, d: &[u8; CM_DATA_LEN]) -> u32 {
        let [high, middle, low] = self.0;
        u32::from_be_bytes([0, d[high], d[middle], d[low]])
    }
    fn set(&self, d: &mut [u8; CM_DATA_LEN], v: u32) {
        let [_, h, m, l] = v.to_be_bytes();
        let [high, middle, low] = self.0;
        d[high] = h;
        d[middle] = m;
        d[low] = l;
    }
}

impl<const N: usize> Place<[u8; N]> for Bytes {
    fn get(&self, d: &[u8; CM_DATA_LEN]) -> [u8; N] {
        arr(d, self.0)
    }
    fn set(&self, d: &mut [u8; CM_DATA_LEN], v: [u8; N]) {
        d[self.0..self.0 + N].copy_from_slice(&v);
    }
}

impl Place<PathRepr> for Path {
    fn get(&self, d: &[u8; CM_DATA_LEN]) -> PathRepr {
        PathRepr::parse_at(d, self.0)
    }
    fn set(&self, d: &mut [u8; CM_DATA_LEN], v: PathRepr) {
        v.emit_at(d, self.0);
    }
}

/// A CM message from its table of fields: the struct (its fields public, in
/// table order), `Default` (the all-zero message), `ATTR_ID`, `parse` and
/// `emit`. Each row is `name: type = place`, the place one of those above
/// at an offset from the start of the message, as in the IBA tables.
///
/// The rows of a table cover all 232 bytes, reserved and vendor bits
/// included, so that a parsed message re-emits to the same bytes (the
/// tests' round trip of random bytes through every attribute checks it).
macro_rules! cm_message {
    (
        $(#[$meta:meta])*
        pub struct $name:ident($attr_id:expr) {
            $( $(#[$fmeta:meta])* $field:ident: $ty:ty = $place:expr, )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub struct $name {
            $( $(#[$fmeta])* pub $field: $ty, )*
        }

        /// The all-zero message.
        impl Default for $name {
            fn default() -> Self {
                Self::parse(&[0; CM_DATA_LEN])
            }
        }

        impl $name {
            /// Attribute ID of the message.
            pub const ATTR_ID: u16 = $attr_id;

            /// Parse the message from the 232 bytes after the MAD header.
            pub fn parse(d: &[u8; CM_DATA_LEN]) -> Self {
                $name {
                    $( $field: Place::get(&$place, d), )*
                }
            }

            /// Emit the message into the 232 bytes after the MAD header.
            pub fn emit(&self, d: &mut [u8; CM_DATA_LEN]) {
                $( Place::set(&$place, d, self.$field); )*
            }
        }
    };
}

// ---------------------------------------------------------------------------
// The MAD header.

/// A zero-copy view of a MAD: the common header's fields and the
/// class-specific data after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mad<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Mad<T> {
    /// Length of a MAD.
    pub const LEN: usize = MAD_LEN;

    /// Wrap a buffer without checking its length (accessors may panic).
    pub const fn new_unchecked(buffer: T) -> Self {
        Self { buffer }
    }

    /// Wrap a buffer after checking it holds a whole MAD (256 bytes; more
    /// are ignored).
    pub fn new_checked(buffer: T) -> Result<Self> {
        need(buffer.as_ref(), MAD_LEN)?;
        Ok(Self { buffer })
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Base version (1).
    pub fn base_version(&self) -> u8 {
        self.buffer.as_ref()[0]
    }
    /// Management class (0x07 for the CM).
    pub fn mgmt_class(&self) -> u8 {
        self.buffer.as_ref()[1]
    }
    /// Class version (2 for the CM).
    pub fn class_version(&self) -> u8 {
        self.buffer.as_ref()[2]
    }
    /// Method byte (response bit and method; 0x03 Send).
    pub fn method(&self) -> u8 {
        self.buffer.as_ref()[3]
    }
    /// Status.
    pub fn status(&self) -> u16 {
        u16_at(self.buffer.as_ref(), 4)
    }
    /// Class-specific field.
    pub fn class_specific(&self) -> u16 {
        u16_at(self.buffer.as_ref(), 6)
    }
    /// Transaction ID.
    pub fn tid(&self) -> u64 {
        u64_at(self.buffer.as_ref(), 8)
    }
    /// Attribute ID (the CM message; see [`attr`]).
    pub fn attr_id(&self) -> u16 {
        u16_at(self.buffer.as_ref(), 16)
    }
    /// The reserved 16 bits after the attribute ID.
    pub fn reserved(&self) -> u16 {
        u16_at(self.buffer.as_ref(), 18)
    }
    /// Attribute modifier.
    pub fn attr_mod(&self) -> u32 {
        u32_at(self.buffer.as_ref(), 20)
    }
    /// The 232 bytes after the header (the CM message).
    pub fn data(&self) -> &[u8] {
        &self.buffer.as_ref()[MAD_HEADER_LEN..MAD_LEN]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Mad<T> {
    /// The 232 bytes after the header, writable.
    pub fn data_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[MAD_HEADER_LEN..MAD_LEN]
    }
}

/// The common MAD header (24 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct MadHeaderRepr {
    /// Base version ([`MAD_BASE_VERSION`]).
    pub base_version: u8,
    /// Management class ([`MGMT_CLASS_CM`]).
    pub mgmt_class: u8,
    /// Class version ([`CM_CLASS_VERSION`]).
    pub class_version: u8,
    /// Method byte, response bit included ([`METHOD_SEND`]).
    pub method: u8,
    /// Status.
    pub status: u16,
    /// Class-specific field.
    pub class_specific: u16,
    /// Transaction ID.
    pub tid: u64,
    /// Attribute ID ([`attr`]).
    pub attr_id: u16,
    /// Reserved 16 bits.
    pub reserved: u16,
    /// Attribute modifier.
    pub attr_mod: u32,
}

impl MadHeaderRepr {
    /// The header of a CM message: base version 1, class 0x07, class
    /// version 2, method Send, everything else 0.
    pub const fn cm(attr_id: u16, tid: u64) -> Self {
        MadHeaderRepr {
            base_version: MAD_BASE_VERSION,
            mgmt_class: MGMT_CLASS_CM,
            class_version: CM_CLASS_VERSION,
            method: METHOD_SEND,
            status: 0,
            class_specific: 0,
            tid,
            attr_id,
            reserved: 0,
            attr_mod: 0,
        }
    }

    /// Parse the header from the first 24 bytes of `buf` (any class).
    pub fn parse(buf: &[u8]) -> Result<Self> {
        need(buf, MAD_HEADER_LEN)?;
        Ok(MadHeaderRepr {
            base_version: buf[0],
            mgmt_class: buf[1],
            class_version: buf[2],
            method: buf[3],
            status: u16_at(buf, 4),
            class_specific: u16_at(buf, 6),
            tid: u64_at(buf, 8),
            attr_id: u16_at(buf, 16),
            reserved: u16_at(buf, 18),
            attr_mod: u32_at(buf, 20),
        })
    }

    /// Emit the header into the first 24 bytes of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        if buf.len() < MAD_HEADER_LEN {
            return Err(Error::BufferTooSmall {
                needed: MAD_HEADER_LEN,
                available: buf.len(),
            });
        }
        buf[0] = self.base_version;
        buf[1] = self.mgmt_class;
        buf[2] = self.class_version;
        buf[3] = self.method;
        set_u16(buf, 4, self.status);
        set_u16(buf, 6, self.class_specific);
        set_u64(buf, 8, self.tid);
        set_u16(buf, 16, self.attr_id);
        set_u16(buf, 18, self.reserved);
        set_u32(buf, 20, self.attr_mod);
        Ok(MAD_HEADER_LEN)
    }
}

// ---------------------------------------------------------------------------
// Paths.

/// A path in a REQ (primary or alternate; 44 bytes, IBA table 106).
///
/// For RoCE the LIDs are the permissive 0xFFFF and the GIDs are the IP
/// addresses (IPv4 as `::ffff:a.b.c.d`); the flow label is the one the
/// data packets' UDP source port is derived from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct PathRepr {
    /// Local port LID.
    pub local_lid: u16,
    /// Remote port LID.
    pub remote_lid: u16,
    /// Local port GID.
    pub local_gid: [u8; 16],
    /// Remote port GID.
    pub remote_gid: [u8; 16],
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Packet rate (6 bits, `enum ib_rate`; 0 = port current).
    pub packet_rate: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Service level (4 bits).
    pub sl: u8,
    /// Subnet local.
    pub subnet_local: bool,
    /// Local ACK timeout (5 bits): 4.096 µs × 2^t.
    pub local_ack_timeout: u8,
    /// The 6 reserved bits between the flow label and the packet rate.
    pub reserved_rate: u8,
    /// The 3 reserved bits after SubnetLocal.
    pub reserved_sl: u8,
    /// The 3 bits after LocalAckTimeout: reserved, except that in a REQ's
    /// alternate path the top one (0x4) is SAP Supported
    /// ([`ReqRepr::sap_supported`]).
    pub reserved_ack: u8,
}

impl PathRepr {
    /// Length of a path in a REQ.
    pub const LEN: usize = 44;

    fn parse_at(d: &[u8], o: usize) -> Self {
        let w = u32_at(d, o + 36);
        PathRepr {
            local_lid: u16_at(d, o),
            remote_lid: u16_at(d, o + 2),
            local_gid: arr(d, o + 4),
            remote_gid: arr(d, o + 20),
            flow_label: w >> 12,
            reserved_rate: ((w >> 6) & 0x3F) as u8,
            packet_rate: (w & 0x3F) as u8,
            traffic_class: d[o + 40],
            hop_limit: d[o + 41],
            sl: bits(d[o + 42], 4, 4),
            subnet_local: bits(d[o + 42], 3, 1) != 0,
            reserved_sl: bits(d[o + 42], 0, 3),
            local_ack_timeout: bits(d[o + 43], 3, 5),
            reserved_ack: bits(d[o + 43], 0, 3),
        }
    }

    fn emit_at(&self, d: &mut [u8], o: usize) {
        set_u16(d, o, self.local_lid);
        set_u16(d, o + 2, self.remote_lid);
        d[o + 4..o + 20].copy_from_slice(&self.local_gid);
        d[o + 20..o + 36].copy_from_slice(&self.remote_gid);
        let w = (self.flow_label & 0xF_FFFF) << 12
            | u32::from(self.reserved_rate & 0x3F) << 6
            | u32::from(self.packet_rate & 0x3F);
        set_u32(d, o + 36, w);
        d[o + 40] = self.traffic_class;
        d[o + 41] = self.hop_limit;
        d[o + 42] =
            put(self.sl, 4, 4) | put(self.subnet_local.into(), 3, 1) | put(self.reserved_sl, 0, 3);
        d[o + 43] = put(self.local_ack_timeout, 3, 5) | put(self.reserved_ack, 0, 3);
    }
}

// ---------------------------------------------------------------------------
// The messages. Offsets below are from the start of the CM message (MAD
// byte 24), as in the IBA tables.

cm_message! {
    /// ConnectRequest (REQ, IBA table 106).
    pub struct ReqRepr(attr::REQ) {
        /// Local communication ID.
        local_comm_id: u32 = Be32(0),
        /// Reserved byte 4.
        reserved_4: u8 = Byte(4),
        /// Vendor ID (24 bits at byte 5).
        vendor_id: u32 = Be24(5),
        /// Service ID (rdma_cm: [`rdma_cm::service_id`]).
        service_id: u64 = Be64(8),
        /// Local CA GUID.
        local_ca_guid: u64 = Be64(16),
        /// Reserved bytes 24..28.
        reserved_24: u32 = Be32(24),
        /// Local Q_Key (UD/RD only).
        local_qkey: u32 = Be32(28),
        /// Local QPN (24 bits).
        local_qpn: u32 = Be24(32),
        /// Responder resources: RDMA READs/atomics the sender accepts.
        responder_resources: u8 = Byte(35),
        /// Local EE context number (24 bits, RD only).
        local_eecn: u32 = Be24(36),
        /// Initiator depth: RDMA READs/atomics the sender issues at once.
        initiator_depth: u8 = Byte(39),
        /// Remote EE context number (24 bits, RD only).
        remote_eecn: u32 = Be24(40),
        /// Remote CM response timeout (5 bits): 4.096 µs × 2^t.
        remote_cm_response_timeout: u8 = Bits { at: 43, shift: 3, width: 5 },
        /// Transport service type (2 bits): 0 RC, 1 UC, 2 RD.
        transport_service_type: u8 = Bits { at: 43, shift: 1, width: 2 },
        /// End-to-end flow control.
        end_to_end_flow_control: bool = Bits { at: 43, shift: 0, width: 1 },
        /// Starting PSN (24 bits).
        starting_psn: u32 = Be24(44),
        /// Local CM response timeout (5 bits).
        local_cm_response_timeout: u8 = Bits { at: 47, shift: 3, width: 5 },
        /// Retry count (3 bits).
        retry_count: u8 = Bits { at: 47, shift: 0, width: 3 },
        /// P_Key.
        pkey: u16 = Be16(48),
        /// Path MTU (4 bits, IB enum: 1 = 256 ... 5 = 4096).
        path_mtu: u8 = Bits { at: 50, shift: 4, width: 4 },
        /// RDC exists.
        rdc_exists: bool = Bits { at: 50, shift: 3, width: 1 },
        /// RNR retry count (3 bits, 7 = infinite).
        rnr_retry_count: u8 = Bits { at: 50, shift: 0, width: 3 },
        /// Max CM retries (4 bits).
        max_cm_retries: u8 = Bits { at: 51, shift: 4, width: 4 },
        /// The QP uses an SRQ.
        srq: bool = Bits { at: 51, shift: 3, width: 1 },
        /// Extended transport type (3 bits; 0 none, 3 XRC).
        extended_transport: u8 = Bits { at: 51, shift: 0, width: 3 },
        /// The primary path.
        primary: PathRepr = Path(52),
        /// The alternate path (all zero when there is none).
        alternate: PathRepr = Path(96),
        /// Private data (rdma_cm: a [`rdma_cm::CmaHeader`] first).
        private_data: [u8; REQ_PRIVATE_DATA] = Bytes(140),
    }
}

impl ReqRepr {
    /// The SAP Supported bit (in the alternate path's last byte).
    pub fn sap_supported(&self) -> bool {
        self.alternate.reserved_ack & 0x4 != 0
    }
}

cm_message! {
    /// MsgRcptAck (MRA, IBA table 107): "your message arrived, the answer
    /// takes longer".
    pub struct MraRepr(attr::MRA) {
        /// Local communication ID.
        local_comm_id: u32 = Be32(0),
        /// Remote communication ID.
        remote_comm_id: u32 = Be32(4),
        /// Message MRAed (2 bits): 0 REQ, 1 REP, 2 LAP.
        msg_mraed: u8 = Bits { at: 8, shift: 6, width: 2 },
        /// The 6 reserved bits after MessageMRAed.
        reserved_8: u8 = Bits { at: 8, shift: 0, width: 6 },
        /// Service timeout (5 bits): 4.096 µs × 2^t more to wait.
        service_timeout: u8 = Bits { at: 9, shift: 3, width: 5 },
        /// The 3 reserved bits after ServiceTimeout.
        reserved_9: u8 = Bits { at: 9, shift: 0, width: 3 },
        /// Private data.
        private_data: [u8; MRA_PRIVATE_DATA] = Bytes(10),
    }
}

cm_message! {
    /// ConnectReject (REJ, IBA table 108).
    pub struct RejRepr(attr::REJ) {
        /// Local communication ID.
        local_comm_id: u32 = Be32(0),
        /// Remote communication ID (0 when rejecting a REQ from an unknown peer).
        remote_comm_id: u32 = Be32(4),
        /// Message rejected (2 bits): 0 REQ, 1 REP, 2 other.
        msg_rejected: u8 = Bits { at: 8, shift: 6, width: 2 },
        /// The 6 reserved bits after MessageRejected.
        reserved_8: u8 = Bits { at: 8, shift: 0, width: 6 },
        /// Length of the ARI in bytes (7 bits).
        reject_info_length: u8 = Bits { at: 9, shift: 1, width: 7 },
        /// The reserved bit after RejectInfoLength.
        reserved_9: u8 = Bits { at: 9, shift: 0, width: 1 },
        /// Reason ([`reason`]).
        reason: u16 = Be16(10),
        /// Additional rejection information.
        ari: [u8; REJ_ARI_LEN] = Bytes(12),
        /// Private data.
        private_data: [u8; REJ_PRIVATE_DATA] = Bytes(84),
    }
}

cm_message! {
    /// ConnectReply (REP, IBA table 110).
    pub struct RepRepr(attr::REP) {
        /// Local communication ID.
        local_comm_id: u32 = Be32(0),
        /// Remote communication ID (the REQ's local one).
        remote_comm_id: u32 = Be32(4),
        /// Local Q_Key.
        local_qkey: u32 = Be32(8),
        /// Local QPN (24 bits).
        local_qpn: u32 = Be24(12),
        /// Local EE context number (24 bits).
        local_eecn: u32 = Be24(16),
        /// Starting PSN (24 bits).
        starting_psn: u32 = Be24(20),
        /// Responder resources.
        responder_resources: u8 = Byte(24),
        /// Initiator depth.
        initiator_depth: u8 = Byte(25),
        /// Target ACK delay (5 bits).
        target_ack_delay: u8 = Bits { at: 26, shift: 3, width: 5 },
        /// Failover accepted (2 bits): 0 accepted, 1 rejected, 2 unsupported.
        failover_accepted: u8 = Bits { at: 26, shift: 1, width: 2 },
        /// End-to-end flow control.
        end_to_end_flow_control: bool = Bits { at: 26, shift: 0, width: 1 },
        /// RNR retry count (3 bits).
        rnr_retry_count: u8 = Bits { at: 27, shift: 5, width: 3 },
        /// The QP uses an SRQ.
        srq: bool = Bits { at: 27, shift: 4, width: 1 },
        /// The 4 reserved bits after SRQ.
        reserved_27: u8 = Bits { at: 27, shift: 0, width: 4 },
        /// Vendor ID (24 bits, kept in the bytes after LocalQPN (high),
        /// LocalEECN (middle) and StartingPSN (low)).
        vendor_id: u32 = Split24([15, 19, 23]),
        /// Local CA GUID.
        local_ca_guid: u64 = Be64(28),
        /// Private data.
        private_data: [u8; REP_PRIVATE_DATA] = Bytes(36),
    }
}

cm_message! {
    /// ReadyToUse (RTU, IBA table 111).
    pub struct RtuRepr(attr::RTU) {
        /// Local communication ID.
        local_comm_id: u32 = Be32(0),
        /// Remote communication ID.
        remote_comm_id: u32 = Be32(4),
        /// Private data.
        private_data: [u8; RTU_PRIVATE_DATA] = Bytes(8),
    }
}

cm_message! {
    /// DisconnectRequest (DREQ, IBA table 112).
    pub struct DreqRepr(attr::DREQ) {
        /// Local communication ID.
        local_comm_id: u32 = Be32(0),
        /// Remote communication ID.
        remote_comm_id: u32 = Be32(4),
        /// Remote QPN/EECN (24 bits): the receiver's QP.
        remote_qpn: u32 = Be24(8),
        /// Reserved byte 11.
        reserved_11: u8 = Byte(11),
        /// Private data.
        private_data: [u8; DREQ_PRIVATE_DATA] = Bytes(12),
    }
}

cm_message! {
    /// DisconnectReply (DREP, IBA table 113).
    pub struct DrepRepr(attr::DREP) {
        /// Local communication ID.
        local_comm_id: u32 = Be32(0),
        /// Remote communication ID.
        remote_comm_id: u32 = Be32(4),
        /// Private data.
        private_data: [u8; DREP_PRIVATE_DATA] = Bytes(8),
    }
}

cm_message! {
    /// ServiceIDResReq (SIDR_REQ, IBA table 119): which UD QP serves this
    /// service ID?
    pub struct SidrReqRepr(attr::SIDR_REQ) {
        /// Request ID.
        request_id: u32 = Be32(0),
        /// P_Key.
        pkey: u16 = Be16(4),
        /// Reserved bytes 6..8.
        reserved_6: u16 = Be16(6),
        /// Service ID.
        service_id: u64 = Be64(8),
        /// Private data (rdma_cm: a [`rdma_cm::CmaHeader`] first).
        private_data: [u8; SIDR_REQ_PRIVATE_DATA] = Bytes(16),
    }
}

cm_message! {
    /// ServiceIDResReqResp (SIDR_REP, IBA table 120).
    pub struct SidrRepRepr(attr::SIDR_REP) {
        /// Request ID (the SIDR_REQ's).
        request_id: u32 = Be32(0),
        /// Status: 0 valid, 1 service ID not supported, 2 rejected, 3 no QP,
        /// 4 redirect, 5 unsupported class version.
        status: u8 = Byte(4),
        /// Length of the additional information in bytes.
        additional_info_length: u8 = Byte(5),
        /// Vendor ID (24 bits: high 16 at byte 6, low 8 at byte 11).
        vendor_id: u32 = Split24([6, 7, 11]),
        /// QPN of the service's UD QP (24 bits).
        qpn: u32 = Be24(8),
        /// Service ID.
        service_id: u64 = Be64(12),
        /// Q_Key of the service's UD QP (rdma_cm: [`rdma_cm::UDP_QKEY`]).
        qkey: u32 = Be32(20),
        /// ClassPortInfo (additional information, for a redirect).
        class_port_info: [u8; SIDR_REP_CLASS_PORT_INFO_LEN] = Bytes(24),
        /// Private data.
        private_data: [u8; SIDR_REP_PRIVATE_DATA] = Bytes(96),
    }
}

// ---------------------------------------------------------------------------
// Whole MADs.

/// The message a CM MAD carries, chosen by its attribute ID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmMessage {
    /// ConnectRequest.
    Req(ReqRepr),
    /// MsgRcptAck.
    Mra(MraRepr),
    /// ConnectReject.
    Rej(RejRepr),
    /// ConnectReply.
    Rep(RepRepr),
    /// ReadyToUse.
    Rtu(RtuRepr),
    /// DisconnectRequest.
    Dreq(DreqRepr),
    /// DisconnectReply.
    Drep(DrepRepr),
    /// ServiceIDResReq.
    SidrReq(SidrReqRepr),
    /// ServiceIDResReqResp.
    SidrRep(SidrRepRepr),
    /// Any other attribute (ClassPortInfo, LAP, APR, unknown), kept whole
    /// for byte-exact re-emit.
    Other([u8; CM_DATA_LEN]),
}

impl CmMessage {
    /// The attribute ID of a typed message; `None` for [`CmMessage::Other`]
    /// (the MAD header says which).
    pub fn attr_id(&self) -> Option<u16> {
        Some(match self {
            CmMessage::Req(_) => attr::REQ,
            CmMessage::Mra(_) => attr::MRA,
            CmMessage::Rej(_) => attr::REJ,
            CmMessage::Rep(_) => attr::REP,
            CmMessage::Rtu(_) => attr::RTU,
            CmMessage::Dreq(_) => attr::DREQ,
            CmMessage::Drep(_) => attr::DREP,
            CmMessage::SidrReq(_) => attr::SIDR_REQ,
            CmMessage::SidrRep(_) => attr::SIDR_REP,
            CmMessage::Other(_) => return None,
        })
    }

    /// The attribute name of a typed message ("Other" for
    /// [`CmMessage::Other`]).
    pub fn name(&self) -> &'static str {
        self.attr_id().map_or("Other", attr_name)
    }

    /// Whether `attr_id` has a typed message (and so never parses as
    /// [`CmMessage::Other`]).
    pub fn is_typed(attr_id: u16) -> bool {
        matches!(
            attr_id,
            attr::REQ
                | attr::MRA
                | attr::REJ
                | attr::REP
                | attr::RTU
                | attr::DREQ
                | attr::DREP
                | attr::SIDR_REQ
                | attr::SIDR_REP
        )
    }

    /// Parse the 232 bytes after the MAD header as the message `attr_id`
    /// names.
    pub fn parse(attr_id: u16, d: &[u8; CM_DATA_LEN]) -> Self {
        match attr_id {
            attr::REQ => CmMessage::Req(ReqRepr::parse(d)),
            attr::MRA => CmMessage::Mra(MraRepr::parse(d)),
            attr::REJ => CmMessage::Rej(RejRepr::parse(d)),
            attr::REP => CmMessage::Rep(RepRepr::parse(d)),
            attr::RTU => CmMessage::Rtu(RtuRepr::parse(d)),
            attr::DREQ => CmMessage::Dreq(DreqRepr::parse(d)),
            attr::DREP => CmMessage::Drep(DrepRepr::parse(d)),
            attr::SIDR_REQ => CmMessage::SidrReq(SidrReqRepr::parse(d)),
            attr::SIDR_REP => CmMessage::SidrRep(SidrRepRepr::parse(d)),
            _ => CmMessage::Other(*d),
        }
    }

    /// Emit the message into the 232 bytes after the MAD header.
    pub fn emit(&self, d: &mut [u8; CM_DATA_LEN]) {
        match self {
            CmMessage::Req(m) => m.emit(d),
            CmMessage::Mra(m) => m.emit(d),
            CmMessage::Rej(m) => m.emit(d),
            CmMessage::Rep(m) => m.emit(d),
            CmMessage::Rtu(m) => m.emit(d),
            CmMessage::Dreq(m) => m.emit(d),
            CmMessage::Drep(m) => m.emit(d),
            CmMessage::SidrReq(m) => m.emit(d),
            CmMessage::SidrRep(m) => m.emit(d),
            CmMessage::Other(raw) => *d = *raw,
        }
    }
}

/// A whole CM MAD: header and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CmMad {
    /// The MAD header (its `attr_id` matches `message`).
    pub header: MadHeaderRepr,
    /// The CM message.
    pub message: CmMessage,
}

impl CmMad {
    /// A CM MAD with the header [`MadHeaderRepr::cm`] gives for a typed
    /// message; `None` for [`CmMessage::Other`], whose attribute ID only a
    /// header can give.
    pub fn send(tid: u64, message: CmMessage) -> Option<CmMad> {
        let attr_id = message.attr_id()?;
        Some(CmMad {
            header: MadHeaderRepr::cm(attr_id, tid),
            message,
        })
    }

    /// Parse a MAD (at least 256 bytes: the UD payload after the DETH;
    /// extra bytes are ignored). Fails, without panicking on any input,
    /// when the input is short or is not a CM MAD (base version other than
    /// 1, management class other than 0x07). The class version and method
    /// are kept, not checked.
    pub fn parse(mad: &[u8]) -> Result<CmMad> {
        need(mad, MAD_LEN)?;
        let header = MadHeaderRepr::parse(mad)?;
        if header.base_version != MAD_BASE_VERSION || header.mgmt_class != MGMT_CLASS_CM {
            return Err(Error::NotCmMad {
                base_version: header.base_version,
                mgmt_class: header.mgmt_class,
            });
        }
        let data = <&[u8; CM_DATA_LEN]>::try_from(&mad[MAD_HEADER_LEN..MAD_LEN]).map_err(|_| {
            Error::Truncated {
                needed: MAD_LEN,
                available: mad.len(),
            }
        })?;
        Ok(CmMad {
            header,
            message: CmMessage::parse(header.attr_id, data),
        })
    }

    /// Emit the 256 bytes into `buf[..256]`; returns 256.
    ///
    /// Fails with [`Error::BufferTooSmall`] if `buf` is short, and with
    /// [`Error::CmAttrMismatch`] if the header's attribute ID is not the
    /// message's (for [`CmMessage::Other`]: if it names a typed message),
    /// since such a MAD would not parse back to `self`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        if buf.len() < MAD_LEN {
            return Err(Error::BufferTooSmall {
                needed: MAD_LEN,
                available: buf.len(),
            });
        }
        let attr_id = self.header.attr_id;
        let consistent = match self.message.attr_id() {
            Some(id) => id == attr_id,
            None => !CmMessage::is_typed(attr_id),
        };
        if !consistent {
            return Err(Error::CmAttrMismatch {
                attr_id,
                message: self.message.name(),
            });
        }
        let available = buf.len();
        self.header.emit(buf)?;
        let data = <&mut [u8; CM_DATA_LEN]>::try_from(&mut buf[MAD_HEADER_LEN..MAD_LEN]).map_err(
            |_| Error::BufferTooSmall {
                needed: MAD_LEN,
                available,
            },
        )?;
        self.message.emit(data);
        Ok(MAD_LEN)
    }
}

// ---------------------------------------------------------------------------

/// rdma_cm's conventions on top of the CM (the kernel's `cma.c`).
pub mod rdma_cm {
    use crate::error::{need, Error, Result};
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

    /// Port space of IPoIB (`RDMA_PS_IPOIB`).
    pub const PS_IPOIB: u16 = 0x0002;
    /// Port space of reliable connections (`RDMA_PS_TCP`).
    pub const PS_TCP: u16 = 0x0106;
    /// Port space of UD (`RDMA_PS_UDP`; resolved with SIDR).
    pub const PS_UDP: u16 = 0x0111;
    /// Port space of native IB addressing (`RDMA_PS_IB`).
    pub const PS_IB: u16 = 0x013F;
    /// Q_Key rdma_cm gives the UD QPs of [`PS_UDP`] (`RDMA_UDP_QKEY`).
    pub const UDP_QKEY: u32 = 0x0123_4567;
    /// The only CMA header version (`CMA_VERSION`).
    pub const CMA_VERSION: u8 = 0x00;
    /// Length of the CMA header.
    pub const CMA_HEADER_LEN: usize = 36;

    /// The service ID of `port` in port space `ps` (`cma_get_service_id`):
    /// `ps << 16 | port`, e.g. 0x0000_0000_0106_1c06 for TCP port 7174.
    pub fn service_id(ps: u16, port: u16) -> u64 {
        u64::from(ps) << 16 | u64::from(port)
    }

    /// The flow label the kernel's rdma_cm puts in a RoCEv2 REQ's primary
    /// path (`cma_get_roce_udp_flow_label`, IPv4 or an IPv6 source without
    /// a flow label): `(src_port * 31 + dst_port) & 0xFFFFF`.
    pub fn roce_flow_label(src_port: u16, dst_port: u16) -> u32 {
        (u32::from(src_port)
            .wrapping_mul(31)
            .wrapping_add(u32::from(dst_port)))
            & 0xF_FFFF
    }

    /// The (port space, port) of an rdma_cm service ID; `None` unless its
    /// top 32 bits are 0 and the port space is one of the four above.
    pub fn port_space_of(service_id: u64) -> Option<(u16, u16)> {
        if service_id >> 32 != 0 {
            return None;
        }
        let ps = (service_id >> 16) as u16;
        matches!(ps, PS_IPOIB | PS_TCP | PS_UDP | PS_IB).then_some((ps, service_id as u16))
    }

    /// The CMA header rdma_cm puts at the start of a REQ's and SIDR_REQ's
    /// private data (`struct cma_hdr`, 36 bytes):
    ///
    /// ```text
    /// | version (1) | IP version << 4 (1) | port (2) | src (16) | dst (16) |
    /// ```
    ///
    /// An address is a 16-byte `union cma_ip_addr`: an IPv6 address whole,
    /// an IPv4 address in the last 4 bytes after 12 zero bytes (not
    /// `::ffff:a.b.c.d`). `port` is the sender's (source) port; the
    /// destination port is in the service ID.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct CmaHeader {
        /// Header version ([`CMA_VERSION`]).
        pub cma_version: u8,
        /// IP version: 4 or 6 (the high nibble of byte 1).
        pub ip_version: u8,
        /// The sender's port.
        pub port: u16,
        /// The sender's address.
        pub src: IpAddr,
        /// The receiver's address.
        pub dst: IpAddr,
    }

    impl CmaHeader {
        /// Parse the header from the start of `private_data`. Fails if it
        /// is shorter than 36 bytes, its version is not 0 (the kernel
        /// refuses those) or its IP version is neither 4 nor 6. The low
        /// nibble of byte 1 and the 12 bytes before an IPv4 address are not
        /// checked.
        pub fn parse(private_data: &[u8]) -> Result<CmaHeader> {
            need(private_data, CMA_HEADER_LEN)?;
            let b = private_data;
            if b[0] != CMA_VERSION {
                return Err(Error::BadCmaHeader("CMA version is not 0"));
            }
            let ip_version = b[1] >> 4;
            let addr = |at: usize| -> Result<IpAddr> {
                let mut a = [0u8; 16];
                a.copy_from_slice(&b[at..at + 16]);
                match ip_version {
                    4 => Ok(IpAddr::V4(Ipv4Addr::new(a[12], a[13], a[14], a[15]))),
                    6 => Ok(IpAddr::V6(Ipv6Addr::from(a))),
                    _ => Err(Error::BadCmaHeader("IP version is neither 4 nor 6")),
                }
            };
            Ok(CmaHeader {
                cma_version: b[0],
                ip_version,
                port: u16::from_be_bytes([b[2], b[3]]),
                src: addr(4)?,
                dst: addr(20)?,
            })
        }

        /// Emit the 36 bytes into the start of `buf`; returns 36. Fails if
        /// `buf` is short, or if `ip_version` is not 4 or 6 or does not
        /// match the family of both addresses.
        pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
            if buf.len() < CMA_HEADER_LEN {
                return Err(Error::BufferTooSmall {
                    needed: CMA_HEADER_LEN,
                    available: buf.len(),
                });
            }
            let family_ok = |a: IpAddr| match self.ip_version {
                4 => a.is_ipv4(),
                6 => a.is_ipv6(),
                _ => false,
            };
            if !family_ok(self.src) || !family_ok(self.dst) {
                return Err(Error::BadCmaHeader(
                    "IP version does not match the addresses",
                ));
            }
            let bytes = |a: IpAddr| match a {
                IpAddr::V4(v4) => {
                    let mut x = [0u8; 16];
                    x[12..].copy_from_slice(&v4.octets());
                    x
                }
                IpAddr::V6(v6) => v6.octets(),
            };
            buf[0] = self.cma_version;
            buf[1] = self.ip_version << 4;
            buf[2..4].copy_from_slice(&self.port.to_be_bytes());
            buf[4..20].copy_from_slice(&bytes(self.src));
            buf[20..36].copy_from_slice(&bytes(self.dst));
            Ok(CMA_HEADER_LEN)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::rdma_cm::{self, CmaHeader};
    use super::*;
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

    /// rping's REQ, frame 1 of golden/rxe/rdmacm_rping_s64.pcap (the UD
    /// payload after the DETH).
    const RPING_REQ: &str = concat!(
        "010702030000000000000002d1dbebe30010000000000000",
        "e3ebdbd1000000000000000001061c06505400fffe4791020000000000000000",
        "00002b0100000001000000a0b93b5aa7ffff37f0ffffffff0000000000000000",
        "0000ffff0a2f5b0c00000000000000000000ffff0a2f5b0b9517900000400098",
        "0000000000000000000000000000000000000000000000000000000000000000",
        "0000000000000000000000000040d02d0000000000000000000000000a2f5b0c",
        "0000000000000000000000000a2f5b0b00000000000000000000000000000000",
        "0000000000000000000000000000000000000000000000000000000000000000",
        "0000000000000000",
    );

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// xorshift64*: deterministic bytes without a dependency.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        fn fill(&mut self, b: &mut [u8]) {
            for x in b {
                *x = self.next() as u8;
            }
        }
    }

    fn round_trip(m: &CmMad) -> [u8; MAD_LEN] {
        let mut buf = [0u8; MAD_LEN];
        assert_eq!(m.emit(&mut buf), Ok(MAD_LEN));
        assert_eq!(CmMad::parse(&buf).as_ref(), Ok(m));
        buf
    }

    #[test]
    fn rping_req_fields() {
        let raw = unhex(RPING_REQ);
        assert_eq!(raw.len(), MAD_LEN);
        let m = CmMad::parse(&raw).unwrap();
        assert_eq!(
            m.header,
            MadHeaderRepr::cm(attr::REQ, 0x0000_0002_d1db_ebe3)
        );
        let CmMessage::Req(r) = &m.message else {
            panic!("not a REQ: {m:?}")
        };
        assert_eq!(r.local_comm_id, 0xe3eb_dbd1);
        assert_eq!(r.service_id, 0x0000_0000_0106_1c06);
        assert_eq!(r.local_ca_guid, 0x5054_00ff_fe47_9102);
        assert_eq!((r.local_qpn, r.responder_resources), (0x2b, 1));
        assert_eq!((r.initiator_depth, r.remote_eecn), (1, 0));
        assert_eq!(r.remote_cm_response_timeout, 0x14);
        assert_eq!(r.starting_psn, 0xb93b5a);
        assert_eq!((r.local_cm_response_timeout, r.retry_count), (0x14, 7));
        assert_eq!(r.pkey, 0xffff);
        assert_eq!((r.path_mtu, r.rdc_exists, r.rnr_retry_count), (3, false, 7));
        assert_eq!(
            (r.max_cm_retries, r.srq, r.extended_transport),
            (15, false, 0)
        );
        let p = &r.primary;
        assert_eq!((p.local_lid, p.remote_lid), (0xffff, 0xffff));
        assert_eq!(&p.local_gid[10..], &[0xff, 0xff, 10, 47, 91, 12]);
        assert_eq!(&p.remote_gid[10..], &[0xff, 0xff, 10, 47, 91, 11]);
        // The kernel's layout (20-bit flow label, 6 reserved bits, 6-bit
        // rate); Wireshark 4.0 misreads these three.
        assert_eq!(
            (p.flow_label, p.reserved_rate, p.packet_rate),
            (0x95179, 0, 0)
        );
        assert_eq!((p.traffic_class, p.hop_limit, p.sl), (0, 0x40, 0));
        assert_eq!((p.local_ack_timeout, p.reserved_ack), (0x13, 0));
        assert_eq!(r.alternate, PathRepr::default());
        assert!(!r.sap_supported());
        let h = CmaHeader::parse(&r.private_data).unwrap();
        assert_eq!(h.ip_version, 4);
        assert_eq!(h.port, 0xd02d);
        assert_eq!(h.src, IpAddr::V4(Ipv4Addr::new(10, 47, 91, 12)));
        assert_eq!(h.dst, IpAddr::V4(Ipv4Addr::new(10, 47, 91, 11)));
        assert_eq!(round_trip(&m)[..], raw[..]);
        // Extra bytes after the MAD are ignored.
        let mut longer = raw.clone();
        longer.extend_from_slice(&[0xAA; 20]);
        assert_eq!(CmMad::parse(&longer), Ok(m));
    }

    #[test]
    fn not_a_cm_mad() {
        let mut raw = unhex(RPING_REQ);
        raw[1] = 0x04; // PerfMgt
        assert_eq!(
            CmMad::parse(&raw),
            Err(Error::NotCmMad {
                base_version: 1,
                mgmt_class: 4
            })
        );
        raw[1] = MGMT_CLASS_CM;
        raw[0] = 2;
        assert!(matches!(CmMad::parse(&raw), Err(Error::NotCmMad { .. })));
    }

    #[test]
    fn truncated_and_garbage_input_never_panics() {
        let real = unhex(RPING_REQ);
        let mut rng = Rng(0x5eed_cafe_f00d_0001);
        for len in 0..300 {
            let r = CmMad::parse(&real[..len.min(real.len())]);
            assert_eq!(r.is_ok(), len >= MAD_LEN, "len {len}");
            let mut junk = vec![0u8; len];
            for _ in 0..8 {
                rng.fill(&mut junk);
                if len > 1 {
                    // Half the time make it look like a CM MAD of any attribute.
                    if rng.next() & 1 == 0 {
                        junk[0] = 1;
                        junk[1] = MGMT_CLASS_CM;
                        if len > 17 {
                            junk[16] = 0;
                            junk[17] = 0x10 + (rng.next() % 11) as u8;
                        }
                    }
                }
                match CmMad::parse(&junk) {
                    Ok(m) => {
                        // Everything is kept: the MAD re-emits exactly.
                        let mut out = [0u8; MAD_LEN];
                        assert_eq!(m.emit(&mut out), Ok(MAD_LEN));
                        assert_eq!(out[..], junk[..MAD_LEN]);
                    }
                    Err(_) => assert!(len < MAD_LEN || junk[0] != 1 || junk[1] != 7),
                }
                let _ = CmaHeader::parse(&junk);
                let _ = MadHeaderRepr::parse(&junk);
                let _ = Mad::new_checked(&junk[..]).map(|v| (v.attr_id(), v.data().len()));
            }
        }
    }

    #[test]
    fn every_attribute_round_trips_random_bytes() {
        let mut rng = Rng(42);
        for attr_id in 0..=0x1Cu16 {
            for _ in 0..64 {
                let mut raw = [0u8; MAD_LEN];
                rng.fill(&mut raw);
                raw[0] = 1;
                raw[1] = MGMT_CLASS_CM;
                raw[16..18].copy_from_slice(&attr_id.to_be_bytes());
                let m = CmMad::parse(&raw).unwrap();
                assert_eq!(m.message.attr_id().is_some(), CmMessage::is_typed(attr_id));
                assert_eq!(round_trip(&m), raw);
            }
        }
    }

    /// `emit` writes each byte whole, whatever the buffer held: the rows
    /// of every message's table cover all 232 bytes.
    #[test]
    fn emit_writes_every_byte() {
        let mut rng = Rng(7);
        for attr_id in 0..=0x1Cu16 {
            let mut raw = [0u8; CM_DATA_LEN];
            rng.fill(&mut raw);
            let m = CmMessage::parse(attr_id, &raw);
            for fill in [0x00, 0xA5, 0xFF] {
                let mut out = [fill; CM_DATA_LEN];
                m.emit(&mut out);
                assert_eq!(out, raw, "attribute {attr_id:#x} over {fill:#x}");
            }
        }
    }

    #[test]
    fn constructed_messages_round_trip() {
        let mut pd = [0u8; REQ_PRIVATE_DATA];
        pd[0] = 0x55;
        pd[91] = 0xAA;
        let req = ReqRepr {
            local_comm_id: 0x1234_5678,
            vendor_id: 0xAB_CDEF,
            service_id: rdma_cm::service_id(rdma_cm::PS_TCP, 18515),
            local_ca_guid: 0x0202_03ff_fe04_0506,
            local_qpn: 0x11,
            responder_resources: 16,
            initiator_depth: 16,
            remote_cm_response_timeout: 20,
            transport_service_type: 1,
            end_to_end_flow_control: true,
            starting_psn: 0xFF_FFFF,
            local_cm_response_timeout: 20,
            retry_count: 7,
            pkey: 0xffff,
            path_mtu: 5,
            rnr_retry_count: 7,
            max_cm_retries: 15,
            srq: true,
            primary: PathRepr {
                local_lid: 0xffff,
                remote_lid: 0xffff,
                local_gid: [0xfe; 16],
                remote_gid: [0xfd; 16],
                flow_label: 0xF_FFFF,
                packet_rate: 0x3F,
                traffic_class: 0xb8,
                hop_limit: 64,
                sl: 0xF,
                subnet_local: true,
                local_ack_timeout: 0x1F,
                reserved_rate: 0x21,
                reserved_sl: 5,
                reserved_ack: 3,
            },
            alternate: PathRepr {
                reserved_ack: 4,
                ..PathRepr::default()
            },
            private_data: pd,
            ..ReqRepr::default()
        };
        assert!(req.sap_supported());
        let rep = RepRepr {
            local_comm_id: 1,
            remote_comm_id: 2,
            local_qkey: 3,
            local_qpn: 0xAB_CDEF,
            local_eecn: 0x12_3456,
            starting_psn: 0x65_4321,
            responder_resources: 4,
            initiator_depth: 5,
            target_ack_delay: 15,
            failover_accepted: 2,
            end_to_end_flow_control: true,
            rnr_retry_count: 6,
            srq: true,
            reserved_27: 0xA,
            vendor_id: 0x11_2233,
            local_ca_guid: u64::MAX,
            private_data: [7; REP_PRIVATE_DATA],
        };
        let mut ari = [0u8; REJ_ARI_LEN];
        ari[71] = 9;
        let msgs = [
            CmMessage::Req(req),
            CmMessage::Rep(rep),
            CmMessage::Rtu(RtuRepr {
                local_comm_id: 9,
                remote_comm_id: 8,
                private_data: [1; RTU_PRIVATE_DATA],
            }),
            CmMessage::Rej(RejRepr {
                local_comm_id: 5,
                remote_comm_id: 0,
                msg_rejected: 2,
                reserved_8: 0x3F,
                reject_info_length: 72,
                reserved_9: 1,
                reason: reason::CONSUMER_DEFINED,
                ari,
                private_data: [2; REJ_PRIVATE_DATA],
            }),
            CmMessage::Mra(MraRepr {
                local_comm_id: 5,
                remote_comm_id: 6,
                msg_mraed: 1,
                service_timeout: 0x1F,
                ..MraRepr::default()
            }),
            CmMessage::Dreq(DreqRepr {
                local_comm_id: 5,
                remote_comm_id: 6,
                remote_qpn: 0x2b,
                reserved_11: 0x80,
                private_data: [3; DREQ_PRIVATE_DATA],
            }),
            CmMessage::Drep(DrepRepr {
                local_comm_id: 6,
                remote_comm_id: 5,
                ..DrepRepr::default()
            }),
            CmMessage::SidrReq(SidrReqRepr {
                request_id: 77,
                pkey: 0xffff,
                reserved_6: 0x0102,
                service_id: rdma_cm::service_id(rdma_cm::PS_UDP, 7174),
                private_data: [4; SIDR_REQ_PRIVATE_DATA],
            }),
            CmMessage::SidrRep(SidrRepRepr {
                request_id: 77,
                status: 1,
                additional_info_length: 72,
                vendor_id: 0xAB_CDEF,
                qpn: 0x2c,
                service_id: rdma_cm::service_id(rdma_cm::PS_UDP, 7174),
                qkey: rdma_cm::UDP_QKEY,
                class_port_info: [5; SIDR_REP_CLASS_PORT_INFO_LEN],
                private_data: [6; SIDR_REP_PRIVATE_DATA],
            }),
        ];
        for (i, msg) in msgs.into_iter().enumerate() {
            let m = CmMad::send(i as u64, msg).unwrap();
            assert_eq!(m.header.mgmt_class, MGMT_CLASS_CM);
            round_trip(&m);
        }
        let other = CmMad {
            header: MadHeaderRepr::cm(attr::LAP, 1),
            message: CmMessage::Other([0x5A; CM_DATA_LEN]),
        };
        assert_eq!(CmMad::send(1, other.message.clone()), None);
        round_trip(&other);
    }

    #[test]
    fn emit_checks_length_and_attribute() {
        let m = CmMad::send(
            7,
            CmMessage::Rtu(RtuRepr {
                local_comm_id: 1,
                ..RtuRepr::default()
            }),
        )
        .unwrap();
        let mut short = [0u8; MAD_LEN - 1];
        assert_eq!(
            m.emit(&mut short),
            Err(Error::BufferTooSmall {
                needed: MAD_LEN,
                available: MAD_LEN - 1
            })
        );
        let mut buf = [0u8; 300];
        assert_eq!(m.emit(&mut buf), Ok(MAD_LEN));
        let wrong = CmMad {
            header: MadHeaderRepr::cm(attr::REQ, 7),
            ..m.clone()
        };
        assert!(matches!(
            wrong.emit(&mut buf),
            Err(Error::CmAttrMismatch {
                attr_id: attr::REQ,
                message: "ReadyToUse"
            })
        ));
        let other_as_req = CmMad {
            header: MadHeaderRepr::cm(attr::REQ, 7),
            message: CmMessage::Other([0; CM_DATA_LEN]),
        };
        assert!(other_as_req.emit(&mut buf).is_err());
    }

    #[test]
    fn emit_truncates_wide_fields() {
        let m = CmMad::send(
            0,
            CmMessage::Dreq(DreqRepr {
                remote_qpn: 0xFF12_3456,
                ..DreqRepr::default()
            }),
        )
        .unwrap();
        let mut buf = [0u8; MAD_LEN];
        m.emit(&mut buf).unwrap();
        assert_eq!(&buf[24 + 8..24 + 12], &[0x12, 0x34, 0x56, 0]);
    }

    #[test]
    fn names() {
        assert_eq!(attr_name(attr::REQ), "ConnectRequest");
        assert_eq!(attr_name(attr::REP), "ConnectReply");
        assert_eq!(attr_name(attr::RTU), "ReadyToUse");
        assert_eq!(attr_name(attr::DREQ), "DisconnectRequest");
        assert_eq!(attr_name(attr::DREP), "DisconnectReply");
        assert_eq!(attr_name(attr::REJ), "ConnectReject");
        assert_eq!(attr_name(attr::MRA), "MsgRcptAck");
        assert_eq!(attr_name(attr::SIDR_REQ), "SIDR_REQ");
        assert_eq!(attr_name(attr::SIDR_REP), "SIDR_REP");
        assert_eq!(attr_name(0x4242), "Unknown");
        assert_eq!(
            reject_reason_name(reason::INVALID_SERVICE_ID),
            "InvalidServiceID"
        );
        assert_eq!(
            reject_reason_name(reason::CONSUMER_DEFINED),
            "ConsumerDefined"
        );
        assert_eq!(reject_reason_name(reason::TIMEOUT), "Timeout");
        assert_eq!(reject_reason_name(reason::STALE_CONN), "StaleConn");
        assert_eq!(reject_reason_name(34), "Unknown");
        assert_eq!(reject_reason_name(0), "Unknown");
        for r in 1..=35u16 {
            assert_eq!(reject_reason_name(r) == "Unknown", r == 34, "{r}");
        }
    }

    #[test]
    fn service_ids() {
        // rping on port 7174, udaddy on 7174 (captures).
        assert_eq!(
            rdma_cm::service_id(rdma_cm::PS_TCP, 7174),
            0x0000_0000_0106_1c06
        );
        assert_eq!(
            rdma_cm::service_id(rdma_cm::PS_UDP, 7174),
            0x0000_0000_0111_1c06
        );
        assert_eq!(
            rdma_cm::service_id(rdma_cm::PS_IB, 1),
            0x0000_0000_013F_0001
        );
        assert_eq!(
            rdma_cm::service_id(rdma_cm::PS_IPOIB, 2),
            0x0000_0000_0002_0002
        );
        for ps in [
            rdma_cm::PS_IPOIB,
            rdma_cm::PS_TCP,
            rdma_cm::PS_UDP,
            rdma_cm::PS_IB,
        ] {
            for port in [0, 1, 7174, 18515, u16::MAX] {
                let sid = rdma_cm::service_id(ps, port);
                assert_eq!(rdma_cm::port_space_of(sid), Some((ps, port)));
            }
        }
        assert_eq!(rdma_cm::port_space_of(0x0000_0000_0107_1c06), None);
        assert_eq!(rdma_cm::port_space_of(0x0000_0001_0106_1c06), None);
        assert_eq!(rdma_cm::port_space_of(0), None);
    }

    #[test]
    fn cma_header_round_trips() {
        let v4 = CmaHeader {
            cma_version: 0,
            ip_version: 4,
            port: 0xd02d,
            src: IpAddr::V4(Ipv4Addr::new(10, 47, 91, 12)),
            dst: IpAddr::V4(Ipv4Addr::new(10, 47, 91, 11)),
        };
        let mut buf = [0xEEu8; 40];
        assert_eq!(v4.emit(&mut buf), Ok(rdma_cm::CMA_HEADER_LEN));
        // The layout of rping's REQ: 00 40 d0 2d, then 12 zero bytes and
        // the IPv4 address, twice.
        assert_eq!(&buf[..4], &[0x00, 0x40, 0xd0, 0x2d]);
        assert_eq!(&buf[4..16], &[0; 12]);
        assert_eq!(&buf[16..20], &[10, 47, 91, 12]);
        assert_eq!(&buf[20..32], &[0; 12]);
        assert_eq!(&buf[32..36], &[10, 47, 91, 11]);
        assert_eq!(&buf[36..], &[0xEE; 4]);
        assert_eq!(CmaHeader::parse(&buf), Ok(v4));

        let v6 = CmaHeader {
            cma_version: 0,
            ip_version: 6,
            port: 65535,
            src: IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1)),
            dst: IpAddr::V6(Ipv6Addr::new(0xfe80, 1, 2, 3, 4, 5, 6, 7)),
        };
        let mut buf = [0u8; 36];
        assert_eq!(v6.emit(&mut buf), Ok(36));
        assert_eq!(buf[1], 0x60);
        assert_eq!(&buf[4..6], &[0xfd, 0x00]);
        assert_eq!(CmaHeader::parse(&buf), Ok(v6));

        // Errors.
        assert!(v6.emit(&mut [0u8; 35]).is_err());
        assert!(CmaHeader::parse(&buf[..35]).is_err());
        let mixed = CmaHeader {
            dst: IpAddr::V4(Ipv4Addr::LOCALHOST),
            ..v6
        };
        assert!(matches!(mixed.emit(&mut buf), Err(Error::BadCmaHeader(_))));
        let bad_version = CmaHeader {
            ip_version: 5,
            ..v4
        };
        assert!(bad_version.emit(&mut buf).is_err());
        let mut b = [0u8; 36];
        v4.emit(&mut b).unwrap();
        b[1] = 0x50;
        assert!(matches!(CmaHeader::parse(&b), Err(Error::BadCmaHeader(_))));
        b[1] = 0x40;
        b[0] = 1;
        assert!(matches!(CmaHeader::parse(&b), Err(Error::BadCmaHeader(_))));
    }

    #[test]
    fn mad_view_reads_the_header() {
        let raw = unhex(RPING_REQ);
        let v = Mad::new_checked(&raw[..]).unwrap();
        assert_eq!(
            (
                v.base_version(),
                v.mgmt_class(),
                v.class_version(),
                v.method()
            ),
            (1, 7, 2, 3)
        );
        assert_eq!(
            (v.status(), v.class_specific(), v.reserved(), v.attr_mod()),
            (0, 0, 0, 0)
        );
        assert_eq!((v.tid(), v.attr_id()), (0x2_d1db_ebe3, attr::REQ));
        assert_eq!(&v.data()[..4], &[0xe3, 0xeb, 0xdb, 0xd1]);
        assert!(Mad::new_checked(&raw[..255]).is_err());
        let mut copy = raw.clone();
        let mut w = Mad::new_checked(&mut copy[..]).unwrap();
        w.data_mut()[0] = 0;
        assert_eq!(copy[24], 0);
    }
}
