//! RoCEv2 on the wire: zero-copy header views, typed representations, the
//! ICRC, PSN arithmetic and pcap capture files.
//!
//! The shape follows smoltcp's `wire` module. For every header there is
//!
//! * a *view* over a byte buffer (`Bth<&[u8]>`, `Reth<&mut [u8]>`, ...) with
//!   field getters and setters; `new_checked` verifies the length once, after
//!   which no accessor can panic;
//! * a *representation* (`BthRepr`, `RethRepr`, ...): a plain struct that
//!   `parse`s from a view and `emit`s into one.
//!
//! [`Packet`] ties them together: it parses a whole RoCEv2 UDP payload (BTH,
//! the extension headers its opcode implies, payload, pad and ICRC) into a
//! [`PacketRepr`] borrowing the payload, and emits one into a caller-provided
//! buffer without allocating. [`icrc`] computes and verifies the invariant
//! CRC over the IPv4/IPv6 and UDP headers exactly as hardware does.
//!
//! Nothing in this crate does I/O, spawns threads or knows about QPs.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod error;
mod field;

pub mod aeth;
pub mod bth;
pub mod cm;
pub mod ext;
pub mod frame;
pub mod frontier;
pub mod icrc;
pub mod ip;
pub mod lint;
pub mod opcode;
pub mod packet;
pub mod pcap;
pub mod psn;

pub use aeth::{AckTimeout, AethSyndrome, NakCode, RnrTimer};
pub use bth::{Bth, BthRepr};
pub use cm::{CmMad, CmMessage};
pub use error::{Error, Result};
pub use ext::{
    AethRepr, AtomicAckEthRepr, AtomicEthRepr, DethRepr, ExtHeaders, FethRepr, RethRepr,
};
pub use opcode::{HeaderSet, Layout, Opcode, Operation, PacketClass, Transport};
pub use packet::{Packet, PacketRepr};
pub use psn::Psn;

/// The UDP destination port of RoCEv2 (IANA).
pub const ROCEV2_PORT: u16 = 4791;
/// Length of the ICRC trailer.
pub const ICRC_LEN: usize = 4;
/// The default P_Key (full member of the default partition); rxe accepts only this.
pub const DEFAULT_PKEY: u16 = 0xFFFF;
/// Q_Key of the General Service Interface (QP1).
pub const GSI_QKEY: u32 = 0x8001_0000;
/// The path MTUs InfiniBand allows, in bytes.
pub const VALID_PMTUS: [usize; 5] = [256, 512, 1024, 2048, 4096];
/// The largest path MTU.
pub const MAX_PMTU: usize = 4096;
