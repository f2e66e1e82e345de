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

const U24: u32 = 0xFF_FFFF;

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

/// ConnectRequest (REQ, IBA table 106).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReqRepr {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Reserved byte 4.
    pub reserved_4: u8,
    /// Vendor ID (24 bits at byte 5).
    pub vendor_id: u32,
    /// Service ID (rdma_cm: [`rdma_cm::service_id`]).
    pub service_id: u64,
    /// Local CA GUID.
    pub local_ca_guid: u64,
    /// Reserved bytes 24..28.
    pub reserved_24: u32,
    /// Local Q_Key (UD/RD only).
    pub local_qkey: u32,
    /// Local QPN (24 bits).
    pub local_qpn: u32,
    /// Responder resources: RDMA READs/atomics the sender accepts.
    pub responder_resources: u8,
    /// Local EE context number (24 bits, RD only).
    pub local_eecn: u32,
    /// Initiator depth: RDMA READs/atomics the sender issues at once.
    pub initiator_depth: u8,
    /// Remote EE context number (24 bits, RD only).
    pub remote_eecn: u32,
    /// Remote CM response timeout (5 bits): 4.096 µs × 2^t.
    pub remote_cm_response_timeout: u8,
    /// Transport service type (2 bits): 0 RC, 1 UC, 2 RD.
    pub transport_service_type: u8,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// Starting PSN (24 bits).
    pub starting_psn: u32,
    /// Local CM response timeout (5 bits).
    pub local_cm_response_timeout: u8,
    /// Retry count (3 bits).
    pub retry_count: u8,
    /// P_Key.
    pub pkey: u16,
    /// Path MTU (4 bits, IB enum: 1 = 256 ... 5 = 4096).
    pub path_mtu: u8,
    /// RDC exists.
    pub rdc_exists: bool,
    /// RNR retry count (3 bits, 7 = infinite).
    pub rnr_retry_count: u8,
    /// Max CM retries (4 bits).
    pub max_cm_retries: u8,
    /// The QP uses an SRQ.
    pub srq: bool,
    /// Extended transport type (3 bits; 0 none, 3 XRC).
    pub extended_transport: u8,
    /// The primary path.
    pub primary: PathRepr,
    /// The alternate path (all zero when there is none).
    pub alternate: PathRepr,
    /// Private data (rdma_cm: a [`rdma_cm::CmaHeader`] first).
    pub private_data: [u8; REQ_PRIVATE_DATA],
}

impl Default for ReqRepr {
    fn default() -> Self {
        ReqRepr {
            local_comm_id: 0,
            reserved_4: 0,
            vendor_id: 0,
            service_id: 0,
            local_ca_guid: 0,
            reserved_24: 0,
            local_qkey: 0,
            local_qpn: 0,
            responder_resources: 0,
            local_eecn: 0,
            initiator_depth: 0,
            remote_eecn: 0,
            remote_cm_response_timeout: 0,
            transport_service_type: 0,
            end_to_end_flow_control: false,
            starting_psn: 0,
            local_cm_response_timeout: 0,
            retry_count: 0,
            pkey: 0,
            path_mtu: 0,
            rdc_exists: false,
            rnr_retry_count: 0,
            max_cm_retries: 0,
            srq: false,
            extended_transport: 0,
            primary: PathRepr::default(),
            alternate: PathRepr::default(),
            private_data: [0; REQ_PRIVATE_DATA],
        }
    }
}

impl ReqRepr {
    /// Attribute ID of the message.
    pub const ATTR_ID: u16 = attr::REQ;

    /// The SAP Supported bit (in the alternate path's last byte).
    pub fn sap_supported(&self) -> bool {
        self.alternate.reserved_ack & 0x4 != 0
    }

    /// Parse the message from the 232 bytes after the MAD header.
    pub fn parse(d: &[u8; CM_DATA_LEN]) -> Self {
        ReqRepr {
            local_comm_id: u32_at(d, 0),
            reserved_4: d[4],
            vendor_id: u24_at(d, 5),
            service_id: u64_at(d, 8),
            local_ca_guid: u64_at(d, 16),
            reserved_24: u32_at(d, 24),
            local_qkey: u32_at(d, 28),
            local_qpn: u24_at(d, 32),
            responder_resources: d[35],
            local_eecn: u24_at(d, 36),
            initiator_depth: d[39],
            remote_eecn: u24_at(d, 40),
            remote_cm_response_timeout: bits(d[43], 3, 5),
            transport_service_type: bits(d[43], 1, 2),
            end_to_end_flow_control: bits(d[43], 0, 1) != 0,
            starting_psn: u24_at(d, 44),
            local_cm_response_timeout: bits(d[47], 3, 5),
            retry_count: bits(d[47], 0, 3),
            pkey: u16_at(d, 48),
            path_mtu: bits(d[50], 4, 4),
            rdc_exists: bits(d[50], 3, 1) != 0,
            rnr_retry_count: bits(d[50], 0, 3),
            max_cm_retries: bits(d[51], 4, 4),
            srq: bits(d[51], 3, 1) != 0,
            extended_transport: bits(d[51], 0, 3),
            primary: PathRepr::parse_at(d, 52),
            alternate: PathRepr::parse_at(d, 96),
            private_data: arr(d, 140),
        }
    }

    /// Emit the message into the 232 bytes after the MAD header.
    pub fn emit(&self, d: &mut [u8; CM_DATA_LEN]) {
        set_u32(d, 0, self.local_comm_id);
        d[4] = self.reserved_4;
        set_u24(d, 5, self.vendor_id & U24);
        set_u64(d, 8, self.service_id);
        set_u64(d, 16, self.local_ca_guid);
        set_u32(d, 24, self.reserved_24);
        set_u32(d, 28, self.local_qkey);
        set_u24(d, 32, self.local_qpn & U24);
        d[35] = self.responder_resources;
        set_u24(d, 36, self.local_eecn & U24);
        d[39] = self.initiator_depth;
        set_u24(d, 40, self.remote_eecn & U24);
        d[43] = put(self.remote_cm_response_timeout, 3, 5)
            | put(self.transport_service_type, 1, 2)
            | put(self.end_to_end_flow_control.into(), 0, 1);
        set_u24(d, 44, self.starting_psn & U24);
        d[47] = put(self.local_cm_response_timeout, 3, 5) | put(self.retry_count, 0, 3);
        set_u16(d, 48, self.pkey);
        d[50] = put(self.path_mtu, 4, 4)
            | put(self.rdc_exists.into(), 3, 1)
            | put(self.rnr_retry_count, 0, 3);
        d[51] = put(self.max_cm_retries, 4, 4)
            | put(self.srq.into(), 3, 1)
            | put(self.extended_transport, 0, 3);
        self.primary.emit_at(d, 52);
        self.alternate.emit_at(d, 96);
        d[140..].copy_from_slice(&self.private_data);
    }
}

/// MsgRcptAck (MRA, IBA table 107): "your message arrived, the answer
/// takes longer".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MraRepr {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Remote communication ID.
    pub remote_comm_id: u32,
    /// Message MRAed (2 bits): 0 REQ, 1 REP, 2 LAP.
    pub msg_mraed: u8,
    /// The 6 reserved bits after MessageMRAed.
    pub reserved_8: u8,
    /// Service timeout (5 bits): 4.096 µs × 2^t more to wait.
    pub service_timeout: u8,
    /// The 3 reserved bits after ServiceTimeout.
    pub reserved_9: u8,
    /// Private data.
    pub private_data: [u8; MRA_PRIVATE_DATA],
}

impl Default for MraRepr {
    fn default() -> Self {
        MraRepr {
            local_comm_id: 0,
            remote_comm_id: 0,
            msg_mraed: 0,
            reserved_8: 0,
            service_timeout: 0,
            reserved_9: 0,
            private_data: [0; MRA_PRIVATE_DATA],
        }
    }
}

impl MraRepr {
    /// Attribute ID of the message.
    pub const ATTR_ID: u16 = attr::MRA;

    /// Parse the message from the 232 bytes after the MAD header.
    pub fn parse(d: &[u8; CM_DATA_LEN]) -> Self {
        MraRepr {
            local_comm_id: u32_at(d, 0),
            remote_comm_id: u32_at(d, 4),
            msg_mraed: bits(d[8], 6, 2),
            reserved_8: bits(d[8], 0, 6),
            service_timeout: bits(d[9], 3, 5),
            reserved_9: bits(d[9], 0, 3),
            private_data: arr(d, 10),
        }
    }

    /// Emit the message into the 232 bytes after the MAD header.
    pub fn emit(&self, d: &mut [u8; CM_DATA_LEN]) {
        set_u32(d, 0, self.local_comm_id);
        set_u32(d, 4, self.remote_comm_id);
        d[8] = put(self.msg_mraed, 6, 2) | put(self.reserved_8, 0, 6);
        d[9] = put(self.service_timeout, 3, 5) | put(self.reserved_9, 0, 3);
        d[10..].copy_from_slice(&self.private_data);
    }
}

/// ConnectReject (REJ, IBA table 108).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RejRepr {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Remote communication ID (0 when rejecting a REQ from an unknown peer).
    pub remote_comm_id: u32,
    /// Message rejected (2 bits): 0 REQ, 1 REP, 2 other.
    pub msg_rejected: u8,
    /// The 6 reserved bits after MessageRejected.
    pub reserved_8: u8,
    /// Length of the ARI in bytes (7 bits).
    pub reject_info_length: u8,
    /// The reserved bit after RejectInfoLength.
    pub reserved_9: u8,
    /// Reason ([`reason`]).
    pub reason: u16,
    /// Additional rejection information.
    pub ari: [u8; REJ_ARI_LEN],
    /// Private data.
    pub private_data: [u8; REJ_PRIVATE_DATA],
}

impl Default for RejRepr {
    fn default() -> Self {
        RejRepr {
            local_comm_id: 0,
            remote_comm_id: 0,
            msg_rejected: 0,
            reserved_8: 0,
            reject_info_length: 0,
            reserved_9: 0,
            reason: 0,
            ari: [0; REJ_ARI_LEN],
            private_data: [0; REJ_PRIVATE_DATA],
        }
    }
}

impl RejRepr {
    /// Attribute ID of the message.
    pub const ATTR_ID: u16 = attr::REJ;

    /// Parse the message from the 232 bytes after the MAD header.
    pub fn parse(d: &[u8; CM_DATA_LEN]) -> Self {
        RejRepr {
            local_comm_id: u32_at(d, 0),
            remote_comm_id: u32_at(d, 4),
            msg_rejected: bits(d[8], 6, 2),
            reserved_8: bits(d[8], 0, 6),
            reject_info_length: bits(d[9], 1, 7),
            reserved_9: bits(d[9], 0, 1),
            reason: u16_at(d, 10),
            ari: arr(d, 12),
            private_data: arr(d, 84),
        }
    }

    /// Emit the message into the 232 bytes after the MAD header.
    pub fn emit(&self, d: &mut [u8; CM_DATA_LEN]) {
        set_u32(d, 0, self.local_comm_id);
        set_u32(d, 4, self.remote_comm_id);
        d[8] = put(self.msg_rejected, 6, 2) | put(self.reserved_8, 0, 6);
        d[9] = put(self.reject_info_length, 1, 7) | put(self.reserved_9, 0, 1);
        set_u16(d, 10, self.reason);
        d[12..84].copy_from_slice(&self.ari);
        d[84..].copy_from_slice(&self.private_data);
    }
}

/// ConnectReply (REP, IBA table 110).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepRepr {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Remote communication ID (the REQ's local one).
    pub remote_comm_id: u32,
    /// Local Q_Key.
    pub local_qkey: u32,
    /// Local QPN (24 bits).
    pub local_qpn: u32,
    /// Local EE context number (24 bits).
    pub local_eecn: u32,
    /// Starting PSN (24 bits).
    pub starting_psn: u32,
    /// Responder resources.
    pub responder_resources: u8,
    /// Initiator depth.
    pub initiator_depth: u8,
    /// Target ACK delay (5 bits).
    pub target_ack_delay: u8,
    /// Failover accepted (2 bits): 0 accepted, 1 rejected, 2 unsupported.
    pub failover_accepted: u8,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// The QP uses an SRQ.
    pub srq: bool,
    /// The 4 reserved bits after SRQ.
    pub reserved_27: u8,
    /// Vendor ID (24 bits, kept in the bytes after LocalQPN (high),
    /// LocalEECN (middle) and StartingPSN (low)).
    pub vendor_id: u32,
    /// Local CA GUID.
    pub local_ca_guid: u64,
    /// Private data.
    pub private_data: [u8; REP_PRIVATE_DATA],
}

impl Default for RepRepr {
    fn default() -> Self {
        RepRepr {
            local_comm_id: 0,
            remote_comm_id: 0,
            local_qkey: 0,
            local_qpn: 0,
            local_eecn: 0,
            starting_psn: 0,
            responder_resources: 0,
            initiator_depth: 0,
            target_ack_delay: 0,
            failover_accepted: 0,
            end_to_end_flow_control: false,
            rnr_retry_count: 0,
            srq: false,
            reserved_27: 0,
            vendor_id: 0,
            local_ca_guid: 0,
            private_data: [0; REP_PRIVATE_DATA],
        }
    }
}

impl RepRepr {
    /// Attribute ID of the message.
    pub const ATTR_ID: u16 = attr::REP;

    /// Parse the message from the 232 bytes after the MAD header.
    pub fn parse(d: &[u8; CM_DATA_LEN]) -> Self {
        RepRepr {
            local_comm_id: u32_at(d, 0),
            remote_comm_id: u32_at(d, 4),
            local_qkey: u32_at(d, 8),
            local_qpn: u24_at(d, 12),
            local_eecn: u24_at(d, 16),
            starting_psn: u24_at(d, 20),
            vendor_id: u32::from(d[15]) << 16 | u32::from(d[19]) << 8 | u32::from(d[23]),
            responder_resources: d[24],
            initiator_depth: d[25],
            target_ack_delay: bits(d[26], 3, 5),
            failover_accepted: bits(d[26], 1, 2),
            end_to_end_flow_control: bits(d[26], 0, 1) != 0,
            rnr_retry_count: bits(d[27], 5, 3),
            srq: bits(d[27], 4, 1) != 0,
            reserved_27: bits(d[27], 0, 4),
            local_ca_guid: u64_at(d, 28),
            private_data: arr(d, 36),
        }
    }

    /// Emit the message into the 232 bytes after the MAD header.
    pub fn emit(&self, d: &mut [u8; CM_DATA_LEN]) {
        set_u32(d, 0, self.local_comm_id);
        set_u32(d, 4, self.remote_comm_id);
        set_u32(d, 8, self.local_qkey);
        set_u24(d, 12, self.local_qpn & U24);
        d[15] = (self.vendor_id >> 16) as u8;
        set_u24(d, 16, self.local_eecn & U24);
        d[19] = (self.vendor_id >> 8) as u8;
        set_u24(d, 20, self.starting_psn & U24);
        d[23] = self.vendor_id as u8;
        d[24] = self.responder_resources;
        d[25] = self.initiator_depth;
        d[26] = put(self.target_ack_delay, 3, 5)
            | put(self.failover_accepted, 1, 2)
            | put(self.end_to_end_flow_control.into(), 0, 1);
        d[27] = put(self.rnr_retry_count, 5, 3)
            | put(self.srq.into(), 4, 1)
            | put(self.reserved_27, 0, 4);
        set_u64(d, 28, self.local_ca_guid);
        d[36..].copy_from_slice(&self.private_data);
    }
}

/// ReadyToUse (RTU, IBA table 111).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RtuRepr {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Remote communication ID.
    pub remote_comm_id: u32,
    /// Private data.
    pub private_data: [u8; RTU_PRIVATE_DATA],
}

impl Default for RtuRepr {
    fn default() -> Self {
        RtuRepr {
            local_comm_id: 0,
            remote_comm_id: 0,
            private_data: [0; RTU_PRIVATE_DATA],
        }
    }
}

impl RtuRepr {
    /// Attribute ID of the message.
    pub const ATTR_ID: u16 = attr::RTU;

    /// Parse the message from the 232 bytes after the MAD header.
    pub fn parse(d: &[u8; CM_DATA_LEN]) -> Self {
        RtuRepr {
            local_comm_id: u32_at(d, 0),
            remote_comm_id: u32_at(d, 4),
            private_data: arr(d, 8),
        }
    }

    /// Emit the message into the 232 bytes after the MAD header.
    pub fn emit(&self, d: &mut [u8; CM_DATA_LEN]) {
        set_u32(d, 0, self.local_comm_id);
        set_u32(d, 4, self.remote_comm_id);
        d[8..].copy_from_slice(&self.private_data);
    }
}

/// DisconnectRequest (DREQ, IBA table 112).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DreqRepr {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Remote communication ID.
    pub remote_comm_id: u32,
    /// Remote QPN/EECN (24 bits): the receiver's QP.
    pub remote_qpn: u32,
    /// Reserved byte 11.
    pub reserved_11: u8,
    /// Private data.
    pub private_data: [u8; DREQ_PRIVATE_DATA],
}

impl Default for DreqRepr {
    fn default() -> Self {
        DreqRepr {
            local_comm_id: 0,
            remote_comm_id: 0,
            remote_qpn: 0,
            reserved_11: 0,
            private_data: [0; DREQ_PRIVATE_DATA],
        }
    }
}

impl DreqRepr {
    /// Attribute ID of the message.
    pub const ATTR_ID: u16 = attr::DREQ;

    /// Parse the message from the 232 bytes after the MAD header.
    pub fn parse(d: &[u8; CM_DATA_LEN]) -> Self {
        DreqRepr {
            local_comm_id: u32_at(d, 0),
            remote_comm_id: u32_at(d, 4),
            remote_qpn: u24_at(d, 8),
            reserved_11: d[11],
            private_data: arr(d, 12),
        }
    }

    /// Emit the message into the 232 bytes after the MAD header.
    pub fn emit(&self, d: &mut [u8; CM_DATA_LEN]) {
        set_u32(d, 0, self.local_comm_id);
        set_u32(d, 4, self.remote_comm_id);
        set_u24(d, 8, self.remote_qpn & U24);
        d[11] = self.reserved_11;
        d[12..].copy_from_slice(&self.private_data);
    }
}

/// DisconnectReply (DREP, IBA table 113).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrepRepr {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Remote communication ID.
    pub remote_comm_id: u32,
    /// Private data.
    pub private_data: [u8; DREP_PRIVATE_DATA],
}

impl Default for DrepRepr {
    fn default() -> Self {
        DrepRepr {
            local_comm_id: 0,
            remote_comm_id: 0,
            private_data: [0; DREP_PRIVATE_DATA],
        }
    }
}

impl DrepRepr {
    /// Attribute ID of the message.
    pub const ATTR_ID: u16 = attr::DREP;

    /// Parse the message from the 232 bytes after the MAD header.
    pub fn parse(d: &[u8; CM_DATA_LEN]) -> Self {
        DrepRepr {
            local_comm_id: u32_at(d, 0),
            remote_comm_id: u32_at(d, 4),
            private_data: arr(d, 8),
        }
    }

    /// Emit the message into the 232 bytes after the MAD header.
    pub fn emit(&self, d: &mut [u8; CM_DATA_LEN]) {
        set_u32(d, 0, self.local_comm_id);
        set_u32(d, 4, self.remote_comm_id);
        d[8..].copy_from_slice(&self.private_data);
    }
}

/// ServiceIDResReq (SIDR_REQ, IBA table 119): which UD QP serves this
/// service ID?
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidrReqRepr {
    /// Request ID.
    pub request_id: u32,
    /// P_Key.
    pub pkey: u16,
    /// Reserved bytes 6..8.
    pub reserved_6: u16,
    /// Service ID.
    pub service_id: u64,
    /// Private data (rdma_cm: a [`rdma_cm::CmaHeader`] first).
    pub private_data: [u8; SIDR_REQ_PRIVATE_DATA],
}

impl Default for SidrReqRepr {
    fn default() -> Self {
        SidrReqRepr {
            request_id: 0,
            pkey: 0,
            reserved_6: 0,
            service_id: 0,
            private_data: [0; SIDR_REQ_PRIVATE_DATA],
        }
    }
}

impl SidrReqRepr {
    /// Attribute ID of the message.
    pub const ATTR_ID: u16 = attr::SIDR_REQ;

    /// Parse the message from the 232 bytes after the MAD header.
    pub fn parse(d: &[u8; CM_DATA_LEN]) -> Self {
        SidrReqRepr {
            request_id: u32_at(d, 0),
            pkey: u16_at(d, 4),
            reserved_6: u16_at(d, 6),
            service_id: u64_at(d, 8),
            private_data: arr(d, 16),
        }
    }

    /// Emit the message into the 232 bytes after the MAD header.
    pub fn emit(&self, d: &mut [u8; CM_DATA_LEN]) {
        set_u32(d, 0, self.request_id);
        set_u16(d, 4, self.pkey);
        set_u16(d, 6, self.reserved_6);
        set_u64(d, 8, self.service_id);
        d[16..].copy_from_slice(&self.private_data);
    }
}

/// ServiceIDResReqResp (SIDR_REP, IBA table 120).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidrRepRepr {
    /// Request ID (the SIDR_REQ's).
    pub request_id: u32,
    /// Status: 0 valid, 1 service ID not supported, 2 rejected, 3 no QP,
    /// 4 redirect, 5 unsupported class version.
    pub status: u8,
    /// Length of the additional information in bytes.
    pub additional_info_length: u8,
    /// Vendor ID (24 bits: high 16 at byte 6, low 8 at byte 11).
    pub vendor_id: u32,
    /// QPN of the service's UD QP (24 bits).
    pub qpn: u32,
    /// Service ID.
    pub service_id: u64,
    /// Q_Key of the service's UD QP (rdma_cm: [`rdma_cm::UDP_QKEY`]).
    pub qkey: u32,
    /// ClassPortInfo (additional information, for a redirect).
    pub class_port_info: [u8; SIDR_REP_CLASS_PORT_INFO_LEN],
    /// Private data.
    pub private_data: [u8; SIDR_REP_PRIVATE_DATA],
}

impl Default for SidrRepRepr {
    fn default() -> Self {
        SidrRepRepr {
            request_id: 0,
            status: 0,
            additional_info_length: 0,
            vendor_id: 0,
            qpn: 0,
            service_id: 0,
            qkey: 0,
            class_port_info: [0; SIDR_REP_CLASS_PORT_INFO_LEN],
            private_data: [0; SIDR_REP_PRIVATE_DATA],
        }
    }
}

impl SidrRepRepr {
    /// Attribute ID of the message.
    pub const ATTR_ID: u16 = attr::SIDR_REP;

    /// Parse the message from the 232 bytes after the MAD header.
    pub fn parse(d: &[u8; CM_DATA_LEN]) -> Self {
        SidrRepRepr {
            request_id: u32_at(d, 0),
            status: d[4],
            additional_info_length: d[5],
            vendor_id: u32::from(u16_at(d, 6)) << 8 | u32::from(d[11]),
            qpn: u24_at(d, 8),
            service_id: u64_at(d, 12),
            qkey: u32_at(d, 20),
            class_port_info: arr(d, 24),
            private_data: arr(d, 96),
        }
    }

    /// Emit the message into the 232 bytes after the MAD header.
    pub fn emit(&self, d: &mut [u8; CM_DATA_LEN]) {
        set_u32(d, 0, self.request_id);
        d[4] = self.status;
        d[5] = self.additional_info_length;
        set_u16(d, 6, (self.vendor_id >> 8) as u16);
        set_u24(d, 8, self.qpn & U24);
        d[11] = self.vendor_id as u8;
        set_u64(d, 12, self.service_id);
        set_u32(d, 20, self.qkey);
        d[24..96].copy_from_slice(&self.class_port_info);
        d[96..].copy_from_slice(&self.private_data);
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
