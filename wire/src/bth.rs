//! The base transport header (12 bytes).
//!
//! ```text
//!  0: OpCode | 1: SE M PadCnt(2) TVer(4) | 2-3: P_Key
//!  4: FECN BECN Resv6 | 5-7: DestQP
//!  8: AckReq Resv7 | 9-11: PSN
//! ```

use crate::error::{need, Error, Result};
use crate::field::{set_u16, set_u24, u16_at, u24_at};
use crate::opcode::Opcode;
use crate::psn::Psn;

/// Length of the BTH.
pub const HEADER_LEN: usize = 12;

/// A zero-copy view of a BTH at the start of `buffer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bth<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Bth<T> {
    /// Wrap a buffer without checking its length; accessors may panic on a
    /// short buffer. Prefer [`Bth::new_checked`].
    pub const fn new_unchecked(buffer: T) -> Bth<T> {
        Bth { buffer }
    }

    /// Wrap a buffer after checking it holds a whole BTH.
    pub fn new_checked(buffer: T) -> Result<Bth<T>> {
        let b = Bth { buffer };
        b.check_len()?;
        Ok(b)
    }

    /// Check the buffer holds a whole BTH.
    pub fn check_len(&self) -> Result<()> {
        need(self.buffer.as_ref(), HEADER_LEN)
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// The raw opcode byte.
    pub fn opcode_raw(&self) -> u8 {
        self.b()[0]
    }
    /// Solicited event.
    pub fn solicited(&self) -> bool {
        self.b()[1] & 0x80 != 0
    }
    /// Migration request.
    pub fn migreq(&self) -> bool {
        self.b()[1] & 0x40 != 0
    }
    /// Pad count (0..=3 bytes before the ICRC).
    pub fn pad_count(&self) -> u8 {
        (self.b()[1] >> 4) & 0x3
    }
    /// Transport header version (must be 0).
    pub fn tver(&self) -> u8 {
        self.b()[1] & 0x0F
    }
    /// Partition key.
    pub fn pkey(&self) -> u16 {
        u16_at(self.b(), 2)
    }
    /// Forward explicit congestion notification.
    pub fn fecn(&self) -> bool {
        self.b()[4] & 0x80 != 0
    }
    /// Backward explicit congestion notification.
    pub fn becn(&self) -> bool {
        self.b()[4] & 0x40 != 0
    }
    /// The six reserved bits after FECN/BECN.
    pub fn resv6(&self) -> u8 {
        self.b()[4] & 0x3F
    }
    /// Destination QP number (24 bits).
    pub fn dest_qp(&self) -> u32 {
        u24_at(self.b(), 5)
    }
    /// Acknowledge request.
    pub fn ack_req(&self) -> bool {
        self.b()[8] & 0x80 != 0
    }
    /// The seven reserved bits after AckReq.
    pub fn resv7(&self) -> u8 {
        self.b()[8] & 0x7F
    }
    /// Packet sequence number.
    pub fn psn(&self) -> Psn {
        Psn::new(u24_at(self.b(), 9))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Bth<T> {
    fn m(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }
    /// Set the opcode byte.
    pub fn set_opcode_raw(&mut self, v: u8) {
        self.m()[0] = v;
    }
    /// Set byte 1: SE, MigReq, pad count, TVer.
    pub fn set_flags(&mut self, se: bool, migreq: bool, pad: u8, tver: u8) {
        self.m()[1] =
            (u8::from(se) << 7) | (u8::from(migreq) << 6) | ((pad & 3) << 4) | (tver & 0xF);
    }
    /// Set the pad count, keeping the other bits of byte 1.
    pub fn set_pad_count(&mut self, pad: u8) {
        let b = &mut self.m()[1];
        *b = (*b & !0x30) | ((pad & 3) << 4);
    }
    /// Set the partition key.
    pub fn set_pkey(&mut self, v: u16) {
        set_u16(self.m(), 2, v)
    }
    /// Set byte 4: FECN, BECN and the reserved six bits.
    pub fn set_ecn(&mut self, fecn: bool, becn: bool, resv6: u8) {
        self.m()[4] = (u8::from(fecn) << 7) | (u8::from(becn) << 6) | (resv6 & 0x3F);
    }
    /// Set the destination QP (low 24 bits of `v`).
    pub fn set_dest_qp(&mut self, v: u32) {
        set_u24(self.m(), 5, v & 0xFF_FFFF)
    }
    /// Set AckReq and the reserved seven bits.
    pub fn set_ack_req(&mut self, ack_req: bool, resv7: u8) {
        self.m()[8] = (u8::from(ack_req) << 7) | (resv7 & 0x7F);
    }
    /// Set the PSN.
    pub fn set_psn(&mut self, psn: Psn) {
        set_u24(self.m(), 9, psn.value())
    }
}

/// A parsed BTH. The pad count is not here: it follows from the payload
/// length and is computed when a whole packet is emitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BthRepr {
    /// Operation.
    pub opcode: Opcode,
    /// Solicited event.
    pub solicited: bool,
    /// Migration request.
    pub migreq: bool,
    /// Partition key (0xFFFF: default partition).
    pub pkey: u16,
    /// Forward ECN.
    pub fecn: bool,
    /// Backward ECN.
    pub becn: bool,
    /// Reserved bits of byte 4; sent as 0, kept so captures re-emit exactly.
    pub resv6: u8,
    /// Destination QP number (24 bits).
    pub dest_qp: u32,
    /// Acknowledge request.
    pub ack_req: bool,
    /// Reserved bits of byte 8; sent as 0, kept so captures re-emit exactly.
    pub resv7: u8,
    /// Packet sequence number.
    pub psn: Psn,
}

impl BthRepr {
    /// A BTH with the defaults a requester uses: default P_Key, no flags.
    pub const fn new(opcode: Opcode, dest_qp: u32, psn: Psn) -> BthRepr {
        BthRepr {
            opcode,
            solicited: false,
            migreq: false,
            pkey: crate::DEFAULT_PKEY,
            fecn: false,
            becn: false,
            resv6: 0,
            dest_qp,
            ack_req: false,
            resv7: 0,
            psn,
        }
    }

    /// Parse a checked view. Fails on an unknown opcode or TVer != 0.
    pub fn parse<T: AsRef<[u8]>>(bth: &Bth<T>) -> Result<BthRepr> {
        let opcode = Opcode::try_from(bth.opcode_raw())?;
        if bth.tver() != 0 {
            return Err(Error::BadVersion(bth.tver()));
        }
        Ok(BthRepr {
            opcode,
            solicited: bth.solicited(),
            migreq: bth.migreq(),
            pkey: bth.pkey(),
            fecn: bth.fecn(),
            becn: bth.becn(),
            resv6: bth.resv6(),
            dest_qp: bth.dest_qp(),
            ack_req: bth.ack_req(),
            resv7: bth.resv7(),
            psn: bth.psn(),
        })
    }

    /// Emit into a checked view with the given pad count (TVer 0).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, bth: &mut Bth<T>, pad_count: u8) {
        bth.set_opcode_raw(self.opcode.value());
        bth.set_flags(self.solicited, self.migreq, pad_count, 0);
        bth.set_pkey(self.pkey);
        bth.set_ecn(self.fecn, self.becn, self.resv6);
        bth.set_dest_qp(self.dest_qp);
        bth.set_ack_req(self.ack_req, self.resv7);
        bth.set_psn(self.psn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // rxe RC_SEND_ONLY from golden/rxe/rc_send_pingpong_s64.pcap layout:
    // opcode 0x04, SE=0, pad=0, pkey ffff, dqp 0x000011, AckReq, psn 0x12d687.
    const SAMPLE: [u8; 12] = [
        0x04, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x80, 0x12, 0xd6, 0x87,
    ];

    #[test]
    fn parse_and_emit() {
        let v = Bth::new_checked(&SAMPLE[..]).unwrap();
        let r = BthRepr::parse(&v).unwrap();
        assert_eq!(r.opcode, Opcode::RcSendOnly);
        assert_eq!(r.dest_qp, 0x11);
        assert!(r.ack_req);
        assert_eq!(r.psn, Psn::new(0x12d687));
        let mut out = [0u8; 12];
        r.emit(&mut Bth::new_unchecked(&mut out[..]), 0);
        assert_eq!(out, SAMPLE);
    }

    #[test]
    fn short_and_bad_version() {
        assert!(Bth::new_checked(&SAMPLE[..11]).is_err());
        let mut b = SAMPLE;
        b[1] = 0x01;
        assert_eq!(
            BthRepr::parse(&Bth::new_checked(&b[..]).unwrap()),
            Err(Error::BadVersion(1))
        );
    }
}
