//! The extension transport headers that follow the BTH: DETH, FETH, RETH,
//! AtomicETH, AETH, AtomicAckETH, ImmDt, IETH, and the CNP's reserved bytes.

use crate::aeth::AethSyndrome;
use crate::bth;
use crate::error::{need, Error, Result};
use crate::field::{set_u24, set_u32, set_u64, u24_at, u32_at, u64_at};
use crate::opcode::{HeaderSet, Opcode};

/// Defines a fixed-length zero-copy header view with big-endian fields.
macro_rules! header_view {
    (
        $(#[$meta:meta])* $name:ident, $len:expr,
        { $( $(#[$fmeta:meta])* $get:ident, $set:ident : $ty:ty = $read:ident, $write:ident @ $at:expr; )* }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct $name<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> $name<T> {
            /// Length of this header in bytes.
            pub const LEN: usize = $len;

            /// Wrap a buffer without checking its length (accessors may panic).
            pub const fn new_unchecked(buffer: T) -> Self {
                Self { buffer }
            }

            /// Wrap a buffer after checking it holds the whole header.
            pub fn new_checked(buffer: T) -> Result<Self> {
                need(buffer.as_ref(), $len)?;
                Ok(Self { buffer })
            }

            /// The underlying buffer.
            pub fn into_inner(self) -> T {
                self.buffer
            }

            $( $(#[$fmeta])* #[inline] pub fn $get(&self) -> $ty { $read(self.buffer.as_ref(), $at) } )*
        }

        impl<T: AsRef<[u8]> + AsMut<[u8]>> $name<T> {
            $( #[doc = concat!("Set the field read by [`Self::", stringify!($get), "`].")]
               #[inline] pub fn $set(&mut self, v: $ty) { $write(self.buffer.as_mut(), $at, v) } )*
        }
    };
}

header_view!(
    /// RDMA extended transport header (16 bytes): virtual address, R_Key, DMA length.
    Reth, 16, {
        /// Remote virtual address.
        va, set_va: u64 = u64_at, set_u64 @ 0;
        /// Remote key.
        rkey, set_rkey: u32 = u32_at, set_u32 @ 8;
        /// DMA length of the whole message.
        dma_len, set_dma_len: u32 = u32_at, set_u32 @ 12;
    }
);

header_view!(
    /// Atomic extended transport header (28 bytes).
    AtomicEth, 28, {
        /// Remote virtual address (8-byte aligned).
        va, set_va: u64 = u64_at, set_u64 @ 0;
        /// Remote key.
        rkey, set_rkey: u32 = u32_at, set_u32 @ 8;
        /// Swap value (compare-and-swap) or addend (fetch-and-add).
        swap_add, set_swap_add: u64 = u64_at, set_u64 @ 12;
        /// Compare value (compare-and-swap only).
        compare, set_compare: u64 = u64_at, set_u64 @ 20;
    }
);

fn u8_at(b: &[u8], at: usize) -> u8 {
    b[at]
}
fn set_u8(b: &mut [u8], at: usize, v: u8) {
    b[at] = v;
}

header_view!(
    /// ACK extended transport header (4 bytes): syndrome and MSN.
    Aeth, 4, {
        /// Raw syndrome byte; see [`AethSyndrome::from_byte`].
        syndrome, set_syndrome: u8 = u8_at, set_u8 @ 0;
        /// Message sequence number (24 bits).
        msn, set_msn: u32 = u24_at, set_u24 @ 1;
    }
);

header_view!(
    /// Datagram extended transport header (8 bytes): Q_Key and source QP.
    Deth, 8, {
        /// Queue key.
        qkey, set_qkey: u32 = u32_at, set_u32 @ 0;
        /// Reserved byte (sent as 0).
        reserved, set_reserved: u8 = u8_at, set_u8 @ 4;
        /// Source QP number (24 bits).
        src_qp, set_src_qp: u32 = u24_at, set_u24 @ 5;
    }
);

/// A parsed RETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RethRepr {
    /// Remote virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// DMA length of the whole message.
    pub dma_len: u32,
}

/// A parsed AtomicETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AtomicEthRepr {
    /// Remote virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// Swap value or addend.
    pub swap_add: u64,
    /// Compare value.
    pub compare: u64,
}

/// A parsed AETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AethRepr {
    /// ACK, RNR NAK or NAK.
    pub syndrome: AethSyndrome,
    /// Message sequence number (24 bits).
    pub msn: u32,
}

/// A parsed DETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct DethRepr {
    /// Queue key.
    pub qkey: u32,
    /// Source QP number (24 bits).
    pub src_qp: u32,
    /// The reserved byte: sent as 0, kept so captures re-emit exactly.
    pub reserved: u8,
}

/// A parsed AtomicAckETH: the value at the target before the atomic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AtomicAckEthRepr {
    /// Original remote data.
    pub orig: u64,
}

/// A parsed FETH (IBA 1.5 FLUSH): selectivity level and placement type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct FethRepr {
    /// The raw 32-bit header.
    pub raw: u32,
}

impl FethRepr {
    /// Placement type (low 4 bits).
    pub const fn placement_type(self) -> u8 {
        (self.raw & 0xF) as u8
    }
    /// Selectivity level (bits 4..6).
    pub const fn selectivity_level(self) -> u8 {
        ((self.raw >> 4) & 0x3) as u8
    }
}

/// Every extension header a packet can carry; exactly those its opcode
/// implies are `Some`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ExtHeaders {
    /// DETH (UD).
    pub deth: Option<DethRepr>,
    /// FETH (RC FLUSH).
    pub feth: Option<FethRepr>,
    /// RETH (WRITE FIRST/ONLY, READ request, FLUSH, ATOMIC_WRITE).
    pub reth: Option<RethRepr>,
    /// AtomicETH (compare-swap, fetch-add).
    pub atomic_eth: Option<AtomicEthRepr>,
    /// AETH (ACK, READ response FIRST/LAST/ONLY, atomic ACK).
    pub aeth: Option<AethRepr>,
    /// AtomicAckETH (atomic ACK).
    pub atomic_ack_eth: Option<AtomicAckEthRepr>,
    /// Immediate data, as the 32-bit big-endian value on the wire.
    pub imm_dt: Option<u32>,
    /// IETH: the R_Key to invalidate.
    pub ieth: Option<u32>,
    /// The 16 reserved bytes of a CNP.
    pub cnp_reserved: Option<[u8; 16]>,
    /// XRCETH as the 32-bit word on the wire: 8 reserved bits, then the
    /// XRC SRQ number (see [`xrc_srqn`]).
    pub xrceth: Option<u32>,
}

/// The XRC SRQ number an XRCETH word names (its low 24 bits).
pub const fn xrc_srqn(xrceth: u32) -> u32 {
    xrceth & 0xFF_FFFF
}

impl ExtHeaders {
    /// No extension headers.
    pub const NONE: ExtHeaders = ExtHeaders {
        deth: None,
        feth: None,
        reth: None,
        atomic_eth: None,
        aeth: None,
        atomic_ack_eth: None,
        imm_dt: None,
        ieth: None,
        cnp_reserved: None,
        xrceth: None,
    };

    /// The set of headers present.
    pub fn present(&self) -> HeaderSet {
        let mut s = HeaderSet::EMPTY;
        let mut add = |present: bool, h: HeaderSet| {
            if present {
                s = s.union(h);
            }
        };
        add(self.deth.is_some(), HeaderSet::DETH);
        add(self.feth.is_some(), HeaderSet::FETH);
        add(self.reth.is_some(), HeaderSet::RETH);
        add(self.atomic_eth.is_some(), HeaderSet::ATOMIC_ETH);
        add(self.aeth.is_some(), HeaderSet::AETH);
        add(self.atomic_ack_eth.is_some(), HeaderSet::ATOMIC_ACK_ETH);
        add(self.imm_dt.is_some(), HeaderSet::IMM_DT);
        add(self.ieth.is_some(), HeaderSet::IETH);
        add(self.cnp_reserved.is_some(), HeaderSet::CNP_PAD);
        add(self.xrceth.is_some(), HeaderSet::XRC_ETH);
        s
    }

    /// Parse the extension headers `opcode` implies from the start of `buf`
    /// (the bytes after the BTH). Returns the headers and their total length.
    pub fn parse(opcode: Opcode, buf: &[u8]) -> Result<(ExtHeaders, usize)> {
        let layout = opcode.layout();
        let total = layout.header_len - bth::HEADER_LEN;
        need(buf, total)?;
        let buf = &buf[..total];
        // Offsets come from the compile-time layout and lie within `total`.
        let at = |h: HeaderSet| layout.offset(h).map(|o| o - bth::HEADER_LEN);
        let mut h = ExtHeaders::NONE;
        if let Some(o) = at(HeaderSet::DETH) {
            let v = Deth::new_unchecked(&buf[o..o + 8]);
            h.deth = Some(DethRepr {
                qkey: v.qkey(),
                src_qp: v.src_qp(),
                reserved: v.reserved(),
            });
        }
        if let Some(o) = at(HeaderSet::XRC_ETH) {
            h.xrceth = Some(u32_at(buf, o));
        }
        if let Some(o) = at(HeaderSet::FETH) {
            h.feth = Some(FethRepr {
                raw: u32_at(buf, o),
            });
        }
        if let Some(o) = at(HeaderSet::RETH) {
            let v = Reth::new_unchecked(&buf[o..o + 16]);
            h.reth = Some(RethRepr {
                va: v.va(),
                rkey: v.rkey(),
                dma_len: v.dma_len(),
            });
        }
        if let Some(o) = at(HeaderSet::ATOMIC_ETH) {
            let v = AtomicEth::new_unchecked(&buf[o..o + 28]);
            h.atomic_eth = Some(AtomicEthRepr {
                va: v.va(),
                rkey: v.rkey(),
                swap_add: v.swap_add(),
                compare: v.compare(),
            });
        }
        if let Some(o) = at(HeaderSet::AETH) {
            let v = Aeth::new_unchecked(&buf[o..o + 4]);
            h.aeth = Some(AethRepr {
                syndrome: AethSyndrome::from_byte(v.syndrome())?,
                msn: v.msn(),
            });
        }
        if let Some(o) = at(HeaderSet::ATOMIC_ACK_ETH) {
            h.atomic_ack_eth = Some(AtomicAckEthRepr {
                orig: u64_at(buf, o),
            });
        }
        if let Some(o) = at(HeaderSet::IMM_DT) {
            h.imm_dt = Some(u32_at(buf, o));
        }
        if let Some(o) = at(HeaderSet::IETH) {
            h.ieth = Some(u32_at(buf, o));
        }
        if let Some(o) = at(HeaderSet::CNP_PAD) {
            let mut r = [0u8; 16];
            r.copy_from_slice(&buf[o..o + 16]);
            h.cnp_reserved = Some(r);
        }
        Ok((h, total))
    }

    /// Emit the headers into the start of `buf` (the bytes after the BTH).
    /// The headers present must be exactly those `opcode` implies.
    pub fn emit(&self, opcode: Opcode, buf: &mut [u8]) -> Result<usize> {
        if self.present() != opcode.headers() {
            return Err(Error::HeaderMismatch(opcode.name()));
        }
        let layout = opcode.layout();
        let total = layout.header_len - bth::HEADER_LEN;
        if buf.len() < total {
            return Err(Error::BufferTooSmall {
                needed: total,
                available: buf.len(),
            });
        }
        let buf = &mut buf[..total];
        // `present() == headers()`: each header below has its offset.
        let at = |h: HeaderSet| layout.offset(h).map_or(0, |o| o - bth::HEADER_LEN);
        if let Some(d) = self.deth {
            let o = at(HeaderSet::DETH);
            let mut v = Deth::new_unchecked(&mut buf[o..o + 8]);
            v.set_qkey(d.qkey);
            v.set_reserved(d.reserved);
            v.set_src_qp(d.src_qp & 0xFF_FFFF);
        }
        if let Some(x) = self.xrceth {
            set_u32(buf, at(HeaderSet::XRC_ETH), x);
        }
        if let Some(f) = self.feth {
            set_u32(buf, at(HeaderSet::FETH), f.raw);
        }
        if let Some(r) = self.reth {
            let o = at(HeaderSet::RETH);
            let mut v = Reth::new_unchecked(&mut buf[o..o + 16]);
            v.set_va(r.va);
            v.set_rkey(r.rkey);
            v.set_dma_len(r.dma_len);
        }
        if let Some(a) = self.atomic_eth {
            let o = at(HeaderSet::ATOMIC_ETH);
            let mut v = AtomicEth::new_unchecked(&mut buf[o..o + 28]);
            v.set_va(a.va);
            v.set_rkey(a.rkey);
            v.set_swap_add(a.swap_add);
            v.set_compare(a.compare);
        }
        if let Some(a) = self.aeth {
            let o = at(HeaderSet::AETH);
            let mut v = Aeth::new_unchecked(&mut buf[o..o + 4]);
            v.set_syndrome(a.syndrome.to_byte());
            v.set_msn(a.msn & 0xFF_FFFF);
        }
        if let Some(a) = self.atomic_ack_eth {
            set_u64(buf, at(HeaderSet::ATOMIC_ACK_ETH), a.orig);
        }
        if let Some(i) = self.imm_dt {
            set_u32(buf, at(HeaderSet::IMM_DT), i);
        }
        if let Some(k) = self.ieth {
            set_u32(buf, at(HeaderSet::IETH), k);
        }
        if let Some(r) = self.cnp_reserved {
            let o = at(HeaderSet::CNP_PAD);
            buf[o..o + 16].copy_from_slice(&r);
        }
        Ok(total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aeth::NakCode;

    #[test]
    fn reth_view_fields() {
        let mut buf = [0u8; 16];
        let mut v = Reth::new_checked(&mut buf[..]).unwrap();
        v.set_va(0x0000_aaab_09dd_5000);
        v.set_rkey(0x2d5);
        v.set_dma_len(18);
        assert_eq!(
            buf,
            [0, 0, 0xaa, 0xab, 0x09, 0xdd, 0x50, 0, 0, 0, 0x02, 0xd5, 0, 0, 0, 18]
        );
        assert!(Reth::new_checked(&buf[..15]).is_err());
    }

    #[test]
    fn headers_round_trip_for_atomic_ack() {
        let h = ExtHeaders {
            aeth: Some(AethRepr {
                syndrome: AethSyndrome::ACK,
                msn: 7,
            }),
            atomic_ack_eth: Some(AtomicAckEthRepr { orig: 42 }),
            ..ExtHeaders::NONE
        };
        let mut buf = [0u8; 12];
        assert_eq!(h.emit(Opcode::RcAtomicAcknowledge, &mut buf), Ok(12));
        assert_eq!(&buf[..4], &[0x1F, 0, 0, 7]);
        let (p, n) = ExtHeaders::parse(Opcode::RcAtomicAcknowledge, &buf).unwrap();
        assert_eq!((p, n), (h, 12));
        // Wrong headers for the opcode are refused.
        assert_eq!(
            h.emit(Opcode::RcAcknowledge, &mut buf),
            Err(Error::HeaderMismatch("RC_ACKNOWLEDGE"))
        );
    }

    #[test]
    fn xrceth_round_trips_with_its_reserved_bits() {
        let h = ExtHeaders {
            xrceth: Some(0xAB00_0042),
            reth: Some(RethRepr {
                va: 0x1000,
                rkey: 7,
                dma_len: 64,
            }),
            ..ExtHeaders::NONE
        };
        let mut buf = [0u8; 20];
        assert_eq!(h.emit(Opcode::XrcWriteOnly, &mut buf), Ok(20));
        assert_eq!(&buf[..4], &[0xAB, 0, 0, 0x42]);
        let (p, n) = ExtHeaders::parse(Opcode::XrcWriteOnly, &buf).unwrap();
        assert_eq!((p, n), (h, 20));
        assert_eq!(xrc_srqn(p.xrceth.unwrap()), 0x42);
        // An XRC request without its XRCETH does not emit.
        let no_xrceth = ExtHeaders { xrceth: None, ..h };
        assert!(no_xrceth.emit(Opcode::XrcWriteOnly, &mut buf).is_err());
    }

    #[test]
    fn reserved_syndrome_is_an_error() {
        let buf = [0x7F, 0, 0, 1];
        assert_eq!(
            ExtHeaders::parse(Opcode::RcAcknowledge, &buf),
            Err(Error::ReservedSyndrome(0x7F))
        );
        let buf = [0x62, 0, 0, 1];
        assert_eq!(
            ExtHeaders::parse(Opcode::RcAcknowledge, &buf)
                .unwrap()
                .0
                .aeth
                .unwrap()
                .syndrome,
            AethSyndrome::Nak(NakCode::RemoteAccessError)
        );
    }
}
