use thiserror::Error;

/// Why a byte sequence is not a well-formed RoCEv2 packet (or header).
///
/// Every malformed input maps to one of these; no parser in this crate
/// panics on any input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum Error {
    /// The buffer ends before the header or packet it should hold.
    #[error("truncated: need {needed} bytes, have {available}")]
    Truncated {
        /// Bytes the structure needs.
        needed: usize,
        /// Bytes available.
        available: usize,
    },
    /// The opcode is reserved or unknown for RoCEv2.
    #[error("opcode {0:#04x} is reserved or unknown")]
    UnknownOpcode(u8),
    /// The opcode is valid InfiniBand but its transport (RD, XRC) is not spoken here.
    #[error("opcode {0:#04x} belongs to a transport roxe does not implement (RD/XRC)")]
    UnsupportedTransport(u8),
    /// BTH transport header version other than 0 (receivers drop it).
    #[error("BTH transport header version {0} (must be 0)")]
    BadVersion(u8),
    /// A RoCEv2 UDP payload must be a multiple of 4 bytes.
    #[error("packet length {0} is not a multiple of 4")]
    Unaligned(usize),
    /// The pad count exceeds the payload it pads.
    #[error("pad count {pad} larger than the {payload}-byte payload")]
    BadPadCount {
        /// The BTH pad count.
        pad: u8,
        /// Payload bytes including pad.
        payload: usize,
    },
    /// A payload where the opcode allows none, or of a length the opcode forbids.
    #[error("payload of {len} bytes not allowed for {opcode}")]
    BadPayloadLength {
        /// The opcode's name.
        opcode: &'static str,
        /// The payload length.
        len: usize,
    },
    /// The extension headers given to a builder do not match what the opcode requires.
    #[error("extension headers do not match opcode {0}")]
    HeaderMismatch(&'static str),
    /// An AETH syndrome the IBA reserves.
    #[error("AETH syndrome {0:#04x} is reserved")]
    ReservedSyndrome(u8),
    /// A field value out of its range (QPN > 24 bits, bad version, ...).
    #[error("field out of range: {0}")]
    FieldRange(&'static str),
    /// The output buffer is too small for what is being emitted.
    #[error("buffer too small: need {needed} bytes, have {available}")]
    BufferTooSmall {
        /// Bytes needed.
        needed: usize,
        /// Bytes available.
        available: usize,
    },
    /// Not an IPv4/IPv6 + UDP datagram addressed to the RoCEv2 port.
    #[error("not RoCEv2: {0}")]
    NotRoce(&'static str),
    /// A malformed IP or UDP header.
    #[error("malformed {0} header")]
    BadIpHeader(&'static str),
    /// A MAD that is not a Communication Manager MAD (base version other
    /// than 1 or management class other than 0x07).
    #[error("not a CM MAD: base version {base_version}, management class {mgmt_class:#04x}")]
    NotCmMad {
        /// The MAD's base version.
        base_version: u8,
        /// The MAD's management class.
        mgmt_class: u8,
    },
    /// A CM MAD whose header names another attribute than its message.
    #[error("MAD attribute ID {attr_id:#06x} does not match the {message} message")]
    CmAttrMismatch {
        /// The header's attribute ID.
        attr_id: u16,
        /// The message's name.
        message: &'static str,
    },
    /// A malformed rdma_cm (CMA) header in CM private data.
    #[error("bad CMA header: {0}")]
    BadCmaHeader(&'static str),
}

/// Result with this crate's [`Error`](enum@Error).
pub type Result<T> = core::result::Result<T, Error>;

/// Returns `Err(Truncated)` unless `buf` holds at least `needed` bytes.
#[inline]
pub(crate) fn need(buf: &[u8], needed: usize) -> Result<()> {
    if buf.len() < needed {
        Err(Error::Truncated {
            needed,
            available: buf.len(),
        })
    } else {
        Ok(())
    }
}
