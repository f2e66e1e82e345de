//! The opcode table: for every RC, UC and UD opcode (and the CNP) its name,
//! the extension headers that follow the BTH, where it sits in a message and
//! whether it carries payload.

use crate::error::{Error, Result};
use core::fmt;

/// The transport service an opcode belongs to (the top three opcode bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// Reliable connected (0x00..0x1F).
    Rc,
    /// Unreliable connected (0x20..0x3F).
    Uc,
    /// Unreliable datagram (0x60..0x7F).
    Ud,
    /// Congestion notification packet (0x81).
    Cnp,
    /// Extended reliable connected (0xA0..0xBF): RC's opcodes, with an
    /// XRCETH naming the target's XRC SRQ on every request.
    Xrc,
}

/// Where a packet sits in its message, which decides its payload rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PacketClass {
    /// First packet of a multi-packet message: payload exactly one PMTU.
    First,
    /// Middle packet: payload exactly one PMTU.
    Middle,
    /// Last packet: 1..=PMTU bytes.
    Last,
    /// The only packet of a message: 0..=PMTU bytes.
    Only,
    /// A packet that never carries payload (READ request, ACK, atomics, FLUSH).
    NoPayload,
    /// RC ATOMIC_WRITE: exactly 8 bytes of payload.
    Atomic8,
    /// CNP: BTH + 16 reserved bytes, nothing else.
    Cnp,
}

/// What a packet does, whatever its transport and place in its message:
/// the column the requester and responder choose and dispatch on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    /// SEND (any transport; with immediate data or invalidation or not).
    Send,
    /// RDMA WRITE (with immediate data or not).
    Write,
    /// RDMA READ request.
    ReadRequest,
    /// RDMA READ response.
    ReadResponse,
    /// ACK or NAK.
    Acknowledge,
    /// Atomic ACK carrying the original value.
    AtomicAcknowledge,
    /// Atomic compare-and-swap.
    CompareSwap,
    /// Atomic fetch-and-add.
    FetchAdd,
    /// FLUSH (IBA 1.5).
    Flush,
    /// ATOMIC WRITE (IBA 1.5).
    AtomicWrite,
    /// Congestion notification.
    Cnp,
}

/// A set of extension headers, in wire order (see [`HeaderSet::ORDER`]).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct HeaderSet(u16);

impl HeaderSet {
    /// Datagram extended transport header (8 bytes; UD).
    pub const DETH: HeaderSet = HeaderSet(1 << 0);
    /// Flush extended transport header (4 bytes; RC FLUSH).
    pub const FETH: HeaderSet = HeaderSet(1 << 1);
    /// RDMA extended transport header (16 bytes).
    pub const RETH: HeaderSet = HeaderSet(1 << 2);
    /// Atomic extended transport header (28 bytes).
    pub const ATOMIC_ETH: HeaderSet = HeaderSet(1 << 3);
    /// ACK extended transport header (4 bytes).
    pub const AETH: HeaderSet = HeaderSet(1 << 4);
    /// Atomic ACK extended transport header (8 bytes).
    pub const ATOMIC_ACK_ETH: HeaderSet = HeaderSet(1 << 5);
    /// Immediate data (4 bytes).
    pub const IMM_DT: HeaderSet = HeaderSet(1 << 6);
    /// Invalidate extended transport header (4 bytes).
    pub const IETH: HeaderSet = HeaderSet(1 << 7);
    /// The 16 reserved bytes that follow the BTH of a CNP.
    pub const CNP_PAD: HeaderSet = HeaderSet(1 << 8);
    /// XRC extended transport header (4 bytes: 8 reserved bits, the
    /// 24-bit XRC SRQ number; every XRC request).
    pub const XRC_ETH: HeaderSet = HeaderSet(1 << 9);
    /// No extension header.
    pub const EMPTY: HeaderSet = HeaderSet(0);

    /// Every header in the order it appears on the wire, with its length.
    pub const ORDER: [(HeaderSet, usize); 10] = [
        (Self::DETH, 8),
        (Self::XRC_ETH, 4),
        (Self::FETH, 4),
        (Self::RETH, 16),
        (Self::ATOMIC_ETH, 28),
        (Self::AETH, 4),
        (Self::ATOMIC_ACK_ETH, 8),
        (Self::IMM_DT, 4),
        (Self::IETH, 4),
        (Self::CNP_PAD, 16),
    ];

    /// The union of two sets.
    pub const fn union(self, other: HeaderSet) -> HeaderSet {
        HeaderSet(self.0 | other.0)
    }

    /// True when every header of `other` is in `self`.
    pub const fn contains(self, other: HeaderSet) -> bool {
        self.0 & other.0 == other.0
    }

    /// Total length in bytes of the headers in the set.
    pub const fn len(self) -> usize {
        let mut total = 0;
        let mut i = 0;
        while i < Self::ORDER.len() {
            if self.0 & Self::ORDER[i].0 .0 != 0 {
                total += Self::ORDER[i].1;
            }
            i += 1;
        }
        total
    }

    /// True when the set holds no header.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Name of a single-header set, for diagnostics.
    pub fn name(self) -> &'static str {
        match self {
            Self::DETH => "DETH",
            Self::FETH => "FETH",
            Self::RETH => "RETH",
            Self::ATOMIC_ETH => "AtomicETH",
            Self::AETH => "AETH",
            Self::ATOMIC_ACK_ETH => "AtomicAckETH",
            Self::IMM_DT => "ImmDt",
            Self::IETH => "IETH",
            Self::CNP_PAD => "CNP-reserved",
            Self::XRC_ETH => "XRCETH",
            _ => "headers",
        }
    }
}

impl core::ops::BitOr for HeaderSet {
    type Output = HeaderSet;
    fn bitor(self, rhs: HeaderSet) -> HeaderSet {
        self.union(rhs)
    }
}

impl fmt::Debug for HeaderSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut l = f.debug_set();
        for (h, _) in Self::ORDER {
            if self.contains(h) {
                l.entry(&h.name());
            }
        }
        l.finish()
    }
}

/// Where each extension header of an opcode sits: byte offsets from the
/// start of the packet (the BTH), computed at compile time per opcode so
/// parsing needs no walk over the header list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// BTH plus extension headers, in bytes.
    pub header_len: usize,
    /// Offset of each header, indexed by its bit in [`HeaderSet`]; 0 when absent
    /// (no extension header can start at 0: the BTH is there).
    offsets: [u8; 10],
}

impl Layout {
    /// The layout of a BTH followed by `set`.
    pub const fn of(set: HeaderSet) -> Layout {
        let mut offsets = [0u8; 10];
        let mut at = crate::bth::HEADER_LEN;
        let mut i = 0;
        while i < HeaderSet::ORDER.len() {
            let h = HeaderSet::ORDER[i].0 .0;
            if set.0 & h != 0 {
                // Indexed by the header's bit, which `offset` reads back.
                offsets[h.trailing_zeros() as usize] = at as u8;
                at += HeaderSet::ORDER[i].1;
            }
            i += 1;
        }
        Layout {
            header_len: at,
            offsets,
        }
    }

    /// Offset of a single header from the start of the packet, if present.
    #[inline]
    pub const fn offset(&self, header: HeaderSet) -> Option<usize> {
        let i = header.0.trailing_zeros() as usize;
        if i < 10 && header.0.count_ones() == 1 && self.offsets[i] != 0 {
            Some(self.offsets[i] as usize)
        } else {
            None
        }
    }
}

macro_rules! opcodes {
    ($( $(#[$doc:meta])* $variant:ident = $value:literal, $name:literal, $transport:ident, $operation:ident, $class:ident, $headers:expr, $response:literal; )*) => {
        /// A RoCEv2 BTH opcode that roxe understands.
        ///
        /// RD opcodes and reserved values do not convert: see
        /// [`Opcode::try_from`].
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u8)]
        pub enum Opcode {
            $( $(#[$doc])* $variant = $value, )*
        }

        impl Opcode {
            /// Every opcode, in numeric order.
            pub const ALL: &'static [Opcode] = &[ $( Opcode::$variant, )* ];

            /// The opcode's IBA name with its transport prefix (`RC_SEND_ONLY`).
            pub const fn name(self) -> &'static str {
                match self { $( Opcode::$variant => $name, )* }
            }

            /// The transport service.
            pub const fn transport(self) -> Transport {
                match self { $( Opcode::$variant => Transport::$transport, )* }
            }

            /// What the packet does (SEND, WRITE, READ request, ...).
            pub const fn operation(self) -> Operation {
                match self { $( Opcode::$variant => Operation::$operation, )* }
            }

            /// The packet's place in its message, which sets its payload rules.
            pub const fn class(self) -> PacketClass {
                match self { $( Opcode::$variant => PacketClass::$class, )* }
            }

            /// The extension headers that follow the BTH.
            pub const fn headers(self) -> HeaderSet {
                match self { $( Opcode::$variant => $headers, )* }
            }

            /// Offsets of the extension headers (a compile-time table).
            #[inline]
            pub const fn layout(self) -> &'static Layout {
                match self { $( Opcode::$variant => { const L: Layout = Layout::of($headers); &L } )* }
            }

            /// True for responder-to-requester packets (READ responses, ACKs).
            pub const fn is_response(self) -> bool {
                match self { $( Opcode::$variant => $response, )* }
            }
        }

        impl TryFrom<u8> for Opcode {
            type Error = Error;
            fn try_from(v: u8) -> Result<Opcode> {
                match v {
                    $( $value => Ok(Opcode::$variant), )*
                    // RD (0x40..0x5F) is an IBA transport that rxe and
                    // roxe do not implement.
                    0x40..=0x55 | 0x5C => Err(Error::UnsupportedTransport(v)),
                    _ => Err(Error::UnknownOpcode(v)),
                }
            }
        }
    };
}

const NONE: HeaderSet = HeaderSet::EMPTY;
const RETH: HeaderSet = HeaderSet::RETH;
const IMM: HeaderSet = HeaderSet::IMM_DT;
const AETH: HeaderSet = HeaderSet::AETH;
const DETH: HeaderSet = HeaderSet::DETH;
const XRCETH: HeaderSet = HeaderSet::XRC_ETH;

opcodes! {
    /// RC SEND, first packet.
    RcSendFirst = 0x00, "RC_SEND_FIRST", Rc, Send, First, NONE, false;
    /// RC SEND, middle packet.
    RcSendMiddle = 0x01, "RC_SEND_MIDDLE", Rc, Send, Middle, NONE, false;
    /// RC SEND, last packet.
    RcSendLast = 0x02, "RC_SEND_LAST", Rc, Send, Last, NONE, false;
    /// RC SEND, last packet with immediate data.
    RcSendLastImm = 0x03, "RC_SEND_LAST_WITH_IMMEDIATE", Rc, Send, Last, IMM, false;
    /// RC SEND in one packet.
    RcSendOnly = 0x04, "RC_SEND_ONLY", Rc, Send, Only, NONE, false;
    /// RC SEND in one packet with immediate data.
    RcSendOnlyImm = 0x05, "RC_SEND_ONLY_WITH_IMMEDIATE", Rc, Send, Only, IMM, false;
    /// RC RDMA WRITE, first packet.
    RcWriteFirst = 0x06, "RC_RDMA_WRITE_FIRST", Rc, Write, First, RETH, false;
    /// RC RDMA WRITE, middle packet.
    RcWriteMiddle = 0x07, "RC_RDMA_WRITE_MIDDLE", Rc, Write, Middle, NONE, false;
    /// RC RDMA WRITE, last packet.
    RcWriteLast = 0x08, "RC_RDMA_WRITE_LAST", Rc, Write, Last, NONE, false;
    /// RC RDMA WRITE, last packet with immediate data.
    RcWriteLastImm = 0x09, "RC_RDMA_WRITE_LAST_WITH_IMMEDIATE", Rc, Write, Last, IMM, false;
    /// RC RDMA WRITE in one packet.
    RcWriteOnly = 0x0A, "RC_RDMA_WRITE_ONLY", Rc, Write, Only, RETH, false;
    /// RC RDMA WRITE in one packet with immediate data.
    RcWriteOnlyImm = 0x0B, "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", Rc, Write, Only, RETH.union(IMM), false;
    /// RC RDMA READ request.
    RcReadRequest = 0x0C, "RC_RDMA_READ_REQUEST", Rc, ReadRequest, NoPayload, RETH, false;
    /// RC RDMA READ response, first packet.
    RcReadResponseFirst = 0x0D, "RC_RDMA_READ_RESPONSE_FIRST", Rc, ReadResponse, First, AETH, true;
    /// RC RDMA READ response, middle packet.
    RcReadResponseMiddle = 0x0E, "RC_RDMA_READ_RESPONSE_MIDDLE", Rc, ReadResponse, Middle, NONE, true;
    /// RC RDMA READ response, last packet.
    RcReadResponseLast = 0x0F, "RC_RDMA_READ_RESPONSE_LAST", Rc, ReadResponse, Last, AETH, true;
    /// RC RDMA READ response in one packet.
    RcReadResponseOnly = 0x10, "RC_RDMA_READ_RESPONSE_ONLY", Rc, ReadResponse, Only, AETH, true;
    /// RC ACK or NAK.
    RcAcknowledge = 0x11, "RC_ACKNOWLEDGE", Rc, Acknowledge, NoPayload, AETH, true;
    /// RC atomic ACK carrying the original value.
    RcAtomicAcknowledge = 0x12, "RC_ATOMIC_ACKNOWLEDGE", Rc, AtomicAcknowledge, NoPayload, AETH.union(HeaderSet::ATOMIC_ACK_ETH), true;
    /// RC atomic compare-and-swap.
    RcCompareSwap = 0x13, "RC_COMPARE_SWAP", Rc, CompareSwap, NoPayload, HeaderSet::ATOMIC_ETH, false;
    /// RC atomic fetch-and-add.
    RcFetchAdd = 0x14, "RC_FETCH_ADD", Rc, FetchAdd, NoPayload, HeaderSet::ATOMIC_ETH, false;
    /// RC SEND, last packet, invalidating an rkey.
    RcSendLastInv = 0x16, "RC_SEND_LAST_WITH_INVALIDATE", Rc, Send, Last, HeaderSet::IETH, false;
    /// RC SEND in one packet, invalidating an rkey.
    RcSendOnlyInv = 0x17, "RC_SEND_ONLY_WITH_INVALIDATE", Rc, Send, Only, HeaderSet::IETH, false;
    /// RC FLUSH (IBA 1.5).
    RcFlush = 0x1C, "RC_FLUSH", Rc, Flush, NoPayload, HeaderSet::FETH.union(RETH), false;
    /// RC ATOMIC WRITE (IBA 1.5): 8 bytes written atomically.
    RcAtomicWrite = 0x1D, "RC_ATOMIC_WRITE", Rc, AtomicWrite, Atomic8, RETH, false;
    /// UC SEND, first packet.
    UcSendFirst = 0x20, "UC_SEND_FIRST", Uc, Send, First, NONE, false;
    /// UC SEND, middle packet.
    UcSendMiddle = 0x21, "UC_SEND_MIDDLE", Uc, Send, Middle, NONE, false;
    /// UC SEND, last packet.
    UcSendLast = 0x22, "UC_SEND_LAST", Uc, Send, Last, NONE, false;
    /// UC SEND, last packet with immediate data.
    UcSendLastImm = 0x23, "UC_SEND_LAST_WITH_IMMEDIATE", Uc, Send, Last, IMM, false;
    /// UC SEND in one packet.
    UcSendOnly = 0x24, "UC_SEND_ONLY", Uc, Send, Only, NONE, false;
    /// UC SEND in one packet with immediate data.
    UcSendOnlyImm = 0x25, "UC_SEND_ONLY_WITH_IMMEDIATE", Uc, Send, Only, IMM, false;
    /// UC RDMA WRITE, first packet.
    UcWriteFirst = 0x26, "UC_RDMA_WRITE_FIRST", Uc, Write, First, RETH, false;
    /// UC RDMA WRITE, middle packet.
    UcWriteMiddle = 0x27, "UC_RDMA_WRITE_MIDDLE", Uc, Write, Middle, NONE, false;
    /// UC RDMA WRITE, last packet.
    UcWriteLast = 0x28, "UC_RDMA_WRITE_LAST", Uc, Write, Last, NONE, false;
    /// UC RDMA WRITE, last packet with immediate data.
    UcWriteLastImm = 0x29, "UC_RDMA_WRITE_LAST_WITH_IMMEDIATE", Uc, Write, Last, IMM, false;
    /// UC RDMA WRITE in one packet.
    UcWriteOnly = 0x2A, "UC_RDMA_WRITE_ONLY", Uc, Write, Only, RETH, false;
    /// UC RDMA WRITE in one packet with immediate data.
    UcWriteOnlyImm = 0x2B, "UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", Uc, Write, Only, RETH.union(IMM), false;
    /// UD SEND (always a single packet).
    UdSendOnly = 0x64, "UD_SEND_ONLY", Ud, Send, Only, DETH, false;
    /// UD SEND with immediate data.
    UdSendOnlyImm = 0x65, "UD_SEND_ONLY_WITH_IMMEDIATE", Ud, Send, Only, DETH.union(IMM), false;
    /// Congestion notification packet (RoCEv2 annex A17.9).
    Cnp = 0x81, "CNP", Cnp, Cnp, Cnp, HeaderSet::CNP_PAD, false;
    /// XRC SEND, first packet.
    XrcSendFirst = 0xA0, "XRC_SEND_FIRST", Xrc, Send, First, XRCETH, false;
    /// XRC SEND, middle packet.
    XrcSendMiddle = 0xA1, "XRC_SEND_MIDDLE", Xrc, Send, Middle, XRCETH, false;
    /// XRC SEND, last packet.
    XrcSendLast = 0xA2, "XRC_SEND_LAST", Xrc, Send, Last, XRCETH, false;
    /// XRC SEND, last packet with immediate data.
    XrcSendLastImm = 0xA3, "XRC_SEND_LAST_WITH_IMMEDIATE", Xrc, Send, Last, XRCETH.union(IMM), false;
    /// XRC SEND in one packet.
    XrcSendOnly = 0xA4, "XRC_SEND_ONLY", Xrc, Send, Only, XRCETH, false;
    /// XRC SEND in one packet with immediate data.
    XrcSendOnlyImm = 0xA5, "XRC_SEND_ONLY_WITH_IMMEDIATE", Xrc, Send, Only, XRCETH.union(IMM), false;
    /// XRC RDMA WRITE, first packet.
    XrcWriteFirst = 0xA6, "XRC_RDMA_WRITE_FIRST", Xrc, Write, First, XRCETH.union(RETH), false;
    /// XRC RDMA WRITE, middle packet.
    XrcWriteMiddle = 0xA7, "XRC_RDMA_WRITE_MIDDLE", Xrc, Write, Middle, XRCETH, false;
    /// XRC RDMA WRITE, last packet.
    XrcWriteLast = 0xA8, "XRC_RDMA_WRITE_LAST", Xrc, Write, Last, XRCETH, false;
    /// XRC RDMA WRITE, last packet with immediate data.
    XrcWriteLastImm = 0xA9, "XRC_RDMA_WRITE_LAST_WITH_IMMEDIATE", Xrc, Write, Last, XRCETH.union(IMM), false;
    /// XRC RDMA WRITE in one packet.
    XrcWriteOnly = 0xAA, "XRC_RDMA_WRITE_ONLY", Xrc, Write, Only, XRCETH.union(RETH), false;
    /// XRC RDMA WRITE in one packet with immediate data.
    XrcWriteOnlyImm = 0xAB, "XRC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", Xrc, Write, Only, XRCETH.union(RETH.union(IMM)), false;
    /// XRC RDMA READ request.
    XrcReadRequest = 0xAC, "XRC_RDMA_READ_REQUEST", Xrc, ReadRequest, NoPayload, XRCETH.union(RETH), false;
    /// XRC RDMA READ response, first packet.
    XrcReadResponseFirst = 0xAD, "XRC_RDMA_READ_RESPONSE_FIRST", Xrc, ReadResponse, First, AETH, true;
    /// XRC RDMA READ response, middle packet.
    XrcReadResponseMiddle = 0xAE, "XRC_RDMA_READ_RESPONSE_MIDDLE", Xrc, ReadResponse, Middle, NONE, true;
    /// XRC RDMA READ response, last packet.
    XrcReadResponseLast = 0xAF, "XRC_RDMA_READ_RESPONSE_LAST", Xrc, ReadResponse, Last, AETH, true;
    /// XRC RDMA READ response in one packet.
    XrcReadResponseOnly = 0xB0, "XRC_RDMA_READ_RESPONSE_ONLY", Xrc, ReadResponse, Only, AETH, true;
    /// XRC ACK or NAK.
    XrcAcknowledge = 0xB1, "XRC_ACKNOWLEDGE", Xrc, Acknowledge, NoPayload, AETH, true;
    /// XRC atomic ACK carrying the original value.
    XrcAtomicAcknowledge = 0xB2, "XRC_ATOMIC_ACKNOWLEDGE", Xrc, AtomicAcknowledge, NoPayload, AETH.union(HeaderSet::ATOMIC_ACK_ETH), true;
    /// XRC atomic compare-and-swap.
    XrcCompareSwap = 0xB3, "XRC_COMPARE_SWAP", Xrc, CompareSwap, NoPayload, XRCETH.union(HeaderSet::ATOMIC_ETH), false;
    /// XRC atomic fetch-and-add.
    XrcFetchAdd = 0xB4, "XRC_FETCH_ADD", Xrc, FetchAdd, NoPayload, XRCETH.union(HeaderSet::ATOMIC_ETH), false;
    /// XRC SEND, last packet, invalidating an rkey.
    XrcSendLastInv = 0xB6, "XRC_SEND_LAST_WITH_INVALIDATE", Xrc, Send, Last, XRCETH.union(HeaderSet::IETH), false;
    /// XRC SEND in one packet, invalidating an rkey.
    XrcSendOnlyInv = 0xB7, "XRC_SEND_ONLY_WITH_INVALIDATE", Xrc, Send, Only, XRCETH.union(HeaderSet::IETH), false;
}

/// The number of distinct [`request_key`]s.
const REQUEST_KEYS: usize = 5 * 11 * 7 * 2 * 2;

/// A dense index of a request's columns.
const fn request_key(
    transport: Transport,
    operation: Operation,
    class: PacketClass,
    immediate: bool,
    invalidate: bool,
) -> usize {
    (((transport as usize * 11 + operation as usize) * 7 + class as usize) * 2 + immediate as usize)
        * 2
        + invalidate as usize
}

/// Every request opcode at its [`request_key`].
const fn request_table() -> [Option<Opcode>; REQUEST_KEYS] {
    let mut table = [None; REQUEST_KEYS];
    let mut i = 0;
    while i < Opcode::ALL.len() {
        let o = Opcode::ALL[i];
        if !o.is_response() {
            let key = request_key(
                o.transport(),
                o.operation(),
                o.class(),
                o.headers().contains(HeaderSet::IMM_DT),
                o.headers().contains(HeaderSet::IETH),
            );
            table[key] = Some(o);
        }
        i += 1;
    }
    table
}

impl Opcode {
    /// The opcode of a request packet: `operation` on `transport`, at
    /// `class` in its message, with immediate data or an invalidation
    /// (IETH) when asked. `None` where the IBA has no such opcode (UC READ,
    /// a MIDDLE with immediate data, ...).
    #[inline]
    pub fn request(
        transport: Transport,
        operation: Operation,
        class: PacketClass,
        immediate: bool,
        invalidate: bool,
    ) -> Option<Opcode> {
        // A table built at compile time from the opcode table: the
        // requester asks once per packet.
        const TABLE: [Option<Opcode>; REQUEST_KEYS] = request_table();
        TABLE[request_key(transport, operation, class, immediate, invalidate)]
    }

    /// The same operation at the same place in its message on transport
    /// `t` (a responder answers an XRC request with XRC responses).
    /// `None` where `t` has no such opcode.
    pub fn on_transport(self, t: Transport) -> Option<Opcode> {
        // The common case, every RC response: no table lookup.
        if self.transport() == t {
            return Some(self);
        }
        let base = match t {
            Transport::Rc => 0x00,
            Transport::Uc => 0x20,
            Transport::Ud => 0x60,
            Transport::Xrc => 0xA0,
            Transport::Cnp => return (self == Opcode::Cnp).then_some(self),
        };
        let o = Opcode::try_from(base | (self.value() & 0x1F)).ok()?;
        (o.operation() == self.operation() && o.class() == self.class() && o.transport() == t)
            .then_some(o)
    }

    /// The raw opcode byte.
    pub const fn value(self) -> u8 {
        self as u8
    }

    /// True when packets of this opcode may carry payload bytes.
    pub const fn allows_payload(self) -> bool {
        !matches!(self.class(), PacketClass::NoPayload | PacketClass::Cnp)
    }

    /// True when the packet starts a message (FIRST or ONLY, or a single-packet request).
    pub const fn starts_message(self) -> bool {
        !matches!(
            self.class(),
            PacketClass::Middle | PacketClass::Last | PacketClass::Cnp
        )
    }

    /// True when the packet ends a message (LAST or ONLY, or a single-packet request).
    pub const fn ends_message(self) -> bool {
        !matches!(
            self.class(),
            PacketClass::First | PacketClass::Middle | PacketClass::Cnp
        )
    }

    /// True when the opcode carries immediate data.
    pub const fn has_immediate(self) -> bool {
        self.headers().contains(HeaderSet::IMM_DT)
    }

    /// Length of BTH plus every extension header of this opcode.
    #[inline]
    pub const fn header_len(self) -> usize {
        self.layout().header_len
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_request_opcode_is_found_by_its_columns() {
        for &op in Opcode::ALL.iter().filter(|o| !o.is_response()) {
            let found = Opcode::request(
                op.transport(),
                op.operation(),
                op.class(),
                op.has_immediate(),
                op.headers().contains(HeaderSet::IETH),
            );
            assert_eq!(found, Some(op), "{op}");
        }
        // No such opcodes: UC READ, a MIDDLE with immediate data.
        let uc_read = Opcode::request(
            Transport::Uc,
            Operation::ReadRequest,
            PacketClass::NoPayload,
            false,
            false,
        );
        assert_eq!(uc_read, None);
        let mid_imm = Opcode::request(
            Transport::Rc,
            Operation::Send,
            PacketClass::Middle,
            true,
            false,
        );
        assert_eq!(mid_imm, None);
    }

    #[test]
    fn operations_match_the_names() {
        for &op in Opcode::ALL {
            let name = op.name();
            let expect = match op.operation() {
                Operation::Send => "SEND",
                Operation::Write => "RDMA_WRITE",
                Operation::ReadRequest => "READ_REQUEST",
                Operation::ReadResponse => "READ_RESPONSE",
                Operation::Acknowledge => "ACKNOWLEDGE",
                Operation::AtomicAcknowledge => "ATOMIC_ACKNOWLEDGE",
                Operation::CompareSwap => "COMPARE_SWAP",
                Operation::FetchAdd => "FETCH_ADD",
                Operation::Flush => "FLUSH",
                Operation::AtomicWrite => "ATOMIC_WRITE",
                Operation::Cnp => "CNP",
            };
            assert!(name.contains(expect), "{name} is not {expect}");
        }
    }

    #[test]
    fn table_is_consistent() {
        for &op in Opcode::ALL {
            assert_eq!(Opcode::try_from(op.value()), Ok(op));
            let t = match op.value() >> 5 {
                0 => Transport::Rc,
                1 => Transport::Uc,
                3 => Transport::Ud,
                4 => Transport::Cnp,
                5 => Transport::Xrc,
                _ => unreachable!(),
            };
            assert_eq!(op.transport(), t, "{op}");
            assert!(op.name().starts_with(match t {
                Transport::Rc => "RC_",
                Transport::Uc => "UC_",
                Transport::Ud => "UD_",
                Transport::Cnp => "CNP",
                Transport::Xrc => "XRC_",
            }));
            // RETH and AETH never appear together, nor ImmDt with AETH.
            assert!(!(op.headers().contains(HeaderSet::RETH) && op.headers().contains(AETH)));
        }
        assert_eq!(Opcode::ALL.len(), 25 + 12 + 2 + 1 + 23);
    }

    #[test]
    fn every_byte_converts_or_errors() {
        let mut known = 0;
        for v in 0..=255u8 {
            match Opcode::try_from(v) {
                Ok(op) => {
                    assert_eq!(op.value(), v);
                    known += 1;
                }
                Err(Error::UnknownOpcode(x)) | Err(Error::UnsupportedTransport(x)) => {
                    assert_eq!(x, v)
                }
                Err(e) => panic!("unexpected {e:?}"),
            }
        }
        assert_eq!(known, Opcode::ALL.len());
        assert_eq!(Opcode::try_from(0x15), Err(Error::UnknownOpcode(0x15)));
        assert_eq!(Opcode::try_from(0x2C), Err(Error::UnknownOpcode(0x2C)));
        assert_eq!(Opcode::try_from(0x60), Err(Error::UnknownOpcode(0x60)));
        assert_eq!(
            Opcode::try_from(0x44),
            Err(Error::UnsupportedTransport(0x44))
        );
        assert_eq!(Opcode::try_from(0x80), Err(Error::UnknownOpcode(0x80)));
        assert_eq!(Opcode::try_from(0xB5), Err(Error::UnknownOpcode(0xB5)));
        assert_eq!(Opcode::try_from(0xBC), Err(Error::UnknownOpcode(0xBC)));
    }

    #[test]
    fn xrc_requests_carry_the_xrceth_first_and_responses_none() {
        for &op in Opcode::ALL {
            let xrc = op.transport() == Transport::Xrc;
            let has = op.headers().contains(HeaderSet::XRC_ETH);
            assert_eq!(has, xrc && !op.is_response(), "{op}");
            if has {
                assert_eq!(op.layout().offset(HeaderSet::XRC_ETH), Some(12), "{op}");
            }
            if xrc {
                // Every XRC opcode is its RC twin, 0xA0 higher, plus the XRCETH.
                let rc = op.on_transport(Transport::Rc).expect("an RC twin");
                assert_eq!(rc.value() | 0xA0, op.value());
                assert_eq!(
                    rc.headers().union(if has {
                        HeaderSet::XRC_ETH
                    } else {
                        HeaderSet::EMPTY
                    }),
                    op.headers()
                );
                assert_eq!(rc.on_transport(Transport::Xrc), Some(op));
            }
        }
        assert_eq!(
            Opcode::XrcWriteFirst.layout().offset(HeaderSet::RETH),
            Some(16)
        );
        assert_eq!(Opcode::XrcCompareSwap.header_len(), 12 + 4 + 28);
        // RC's IBA 1.5 additions have no XRC opcode; UC has no READ.
        assert_eq!(Opcode::RcFlush.on_transport(Transport::Xrc), None);
        assert_eq!(Opcode::RcReadRequest.on_transport(Transport::Uc), None);
    }

    #[test]
    fn layouts_agree_with_header_sets() {
        for &op in Opcode::ALL {
            let l = op.layout();
            assert_eq!(l.header_len, 12 + op.headers().len(), "{op}");
            let mut at = 12;
            for (h, len) in HeaderSet::ORDER {
                if op.headers().contains(h) {
                    assert_eq!(l.offset(h), Some(at), "{op} {}", h.name());
                    at += len;
                } else {
                    assert_eq!(l.offset(h), None, "{op} {}", h.name());
                }
            }
        }
        assert_eq!(Opcode::RcFlush.layout().offset(HeaderSet::RETH), Some(16));
    }

    #[test]
    fn header_lengths() {
        assert_eq!(Opcode::RcSendOnly.header_len(), 12);
        assert_eq!(Opcode::RcWriteOnlyImm.header_len(), 12 + 16 + 4);
        assert_eq!(Opcode::RcAtomicAcknowledge.header_len(), 12 + 4 + 8);
        assert_eq!(Opcode::RcCompareSwap.header_len(), 12 + 28);
        assert_eq!(Opcode::UdSendOnlyImm.header_len(), 12 + 8 + 4);
        assert_eq!(Opcode::RcFlush.header_len(), 12 + 4 + 16);
        assert_eq!(Opcode::Cnp.header_len(), 12 + 16);
    }
}
