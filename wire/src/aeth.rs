//! The AETH syndrome and the IB timer encodings that go with it: the RNR NAK
//! timer table and the local ACK timeout.

use crate::error::{Error, Result};
use core::fmt;
use core::time::Duration;

/// NAK codes of the AETH (syndrome `011nnnnn`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NakCode {
    /// PSN sequence error: the responder expected another PSN (carried in the NAK).
    PsnSequenceError = 0,
    /// Invalid request: bad opcode sequence, length error, unsupported operation.
    InvalidRequest = 1,
    /// Remote access error: bad rkey, range or access rights.
    RemoteAccessError = 2,
    /// Remote operational error: the responder could not complete the request.
    RemoteOperationalError = 3,
    /// Invalid RD request (RD only).
    InvalidRdRequest = 4,
}

impl NakCode {
    /// The IBA name, as tools print it.
    pub const fn name(self) -> &'static str {
        match self {
            NakCode::PsnSequenceError => "NAK_PSN_SEQUENCE_ERROR",
            NakCode::InvalidRequest => "NAK_INVALID_REQUEST",
            NakCode::RemoteAccessError => "NAK_REMOTE_ACCESS_ERROR",
            NakCode::RemoteOperationalError => "NAK_REMOTE_OPERATIONAL_ERROR",
            NakCode::InvalidRdRequest => "NAK_INVALID_RD_REQUEST",
        }
    }
}

/// A 5-bit RNR NAK timer code (IBA table 45): how long the requester waits
/// before retrying after an RNR NAK. Code 0 is the longest, 655.36 ms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RnrTimer(u8);

/// The RNR NAK timer table in microseconds, indexed by code.
///
/// Code 25 is 61.44 ms as the IBA says; Linux rxe has a typo there (61410 µs).
pub const RNR_TIMER_US: [u32; 32] = [
    655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560, 3_840,
    5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840,
    245_760, 327_680, 491_520,
];

impl RnrTimer {
    /// Code 0: the longest wait, 655.36 ms.
    pub const LONGEST: RnrTimer = RnrTimer(0);

    /// The timer for a 5-bit code; `None` above 31.
    pub const fn new(code: u8) -> Option<RnrTimer> {
        if code < 32 {
            Some(RnrTimer(code))
        } else {
            None
        }
    }

    /// The 5-bit code.
    pub const fn code(self) -> u8 {
        self.0
    }

    /// The wait in microseconds.
    pub const fn micros(self) -> u32 {
        RNR_TIMER_US[self.0 as usize]
    }

    /// The wait as a [`Duration`].
    pub const fn duration(self) -> Duration {
        Duration::from_micros(self.micros() as u64)
    }
}

/// ACK credit counts (IBA table 44), indexed by the 5-bit credit code;
/// code 31 means "invalid": no end-to-end flow control (rxe always sends it).
pub const ACK_CREDITS: [Option<u16>; 32] = [
    Some(0),
    Some(1),
    Some(2),
    Some(3),
    Some(4),
    Some(6),
    Some(8),
    Some(12),
    Some(16),
    Some(24),
    Some(32),
    Some(48),
    Some(64),
    Some(96),
    Some(128),
    Some(192),
    Some(256),
    Some(384),
    Some(512),
    Some(768),
    Some(1024),
    Some(1536),
    Some(2048),
    Some(3072),
    Some(4096),
    Some(6144),
    Some(8192),
    Some(12288),
    Some(16384),
    Some(24576),
    Some(32768),
    None,
];

/// The credit code meaning "no credit information" (unlimited).
pub const CREDITS_INVALID: u8 = 31;

/// The AETH syndrome byte, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AethSyndrome {
    /// Positive acknowledgement with an end-to-end credit code (31 = invalid).
    Ack {
        /// The 5-bit credit code; see [`ACK_CREDITS`].
        credits: u8,
    },
    /// Receiver not ready: retry after the timer.
    RnrNak(RnrTimer),
    /// Negative acknowledgement.
    Nak(NakCode),
}

impl AethSyndrome {
    /// A plain ACK with no credit information, as rxe sends (syndrome 0x1F).
    pub const ACK: AethSyndrome = AethSyndrome::Ack {
        credits: CREDITS_INVALID,
    };

    /// Decode a syndrome byte; reserved encodings (bit 7, type `10`, NAK
    /// codes 5..31, credit codes above 31) are errors.
    pub const fn from_byte(b: u8) -> Result<AethSyndrome> {
        if b & 0x80 != 0 {
            return Err(Error::ReservedSyndrome(b));
        }
        let value = b & 0x1F;
        match (b >> 5) & 0x3 {
            0 => Ok(AethSyndrome::Ack { credits: value }),
            1 => Ok(AethSyndrome::RnrNak(RnrTimer(value))),
            3 => match value {
                0 => Ok(AethSyndrome::Nak(NakCode::PsnSequenceError)),
                1 => Ok(AethSyndrome::Nak(NakCode::InvalidRequest)),
                2 => Ok(AethSyndrome::Nak(NakCode::RemoteAccessError)),
                3 => Ok(AethSyndrome::Nak(NakCode::RemoteOperationalError)),
                4 => Ok(AethSyndrome::Nak(NakCode::InvalidRdRequest)),
                _ => Err(Error::ReservedSyndrome(b)),
            },
            _ => Err(Error::ReservedSyndrome(b)),
        }
    }

    /// Encode as the syndrome byte. An ACK's credit code is masked to 5 bits.
    pub const fn to_byte(self) -> u8 {
        match self {
            AethSyndrome::Ack { credits } => credits & 0x1F,
            AethSyndrome::RnrNak(t) => 0x20 | t.0,
            AethSyndrome::Nak(code) => 0x60 | code as u8,
        }
    }

    /// True for an ACK syndrome.
    pub const fn is_ack(self) -> bool {
        matches!(self, AethSyndrome::Ack { .. })
    }
}

impl fmt::Display for AethSyndrome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            AethSyndrome::Ack { credits } => match ACK_CREDITS[(credits & 0x1F) as usize] {
                Some(n) => write!(f, "ACK credits={n}"),
                None => f.write_str("ACK credits=invalid"),
            },
            AethSyndrome::RnrNak(t) => write!(
                f,
                "RNR_NAK rnr_timer={} ({}.{:02} ms)",
                t.code(),
                t.micros() / 1000,
                (t.micros() % 1000) / 10
            ),
            AethSyndrome::Nak(code) => f.write_str(code.name()),
        }
    }
}

/// The local ACK timeout attribute of a QP: `4.096 µs × 2^t`, 0 = infinite
/// (never retransmit on timeout).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AckTimeout(u8);

impl AckTimeout {
    /// Code 0: no retransmission timer.
    pub const INFINITE: AckTimeout = AckTimeout(0);

    /// The encoding for `t` in `0..=31`; `None` above (rxe rejects it at modify_qp).
    pub const fn new(t: u8) -> Option<AckTimeout> {
        if t < 32 {
            Some(AckTimeout(t))
        } else {
            None
        }
    }

    /// The 5-bit encoding.
    pub const fn code(self) -> u8 {
        self.0
    }

    /// The timeout in nanoseconds (4096 ns × 2^t), or `None` for 0 (infinite).
    pub const fn nanos(self) -> Option<u64> {
        if self.0 == 0 {
            None
        } else {
            Some(4096u64 << self.0)
        }
    }

    /// The timeout as a [`Duration`], or `None` for infinite.
    pub const fn duration(self) -> Option<Duration> {
        match self.nanos() {
            Some(ns) => Some(Duration::from_nanos(ns)),
            None => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_syndrome_byte_decodes_or_is_reserved() {
        let mut ok = 0;
        for b in 0..=255u8 {
            if let Ok(s) = AethSyndrome::from_byte(b) {
                assert_eq!(s.to_byte(), b);
                ok += 1;
            }
        }
        // 32 ACK + 32 RNR + 5 NAK codes.
        assert_eq!(ok, 69);
        assert_eq!(AethSyndrome::ACK.to_byte(), 0x1F);
        assert_eq!(
            AethSyndrome::from_byte(0x60),
            Ok(AethSyndrome::Nak(NakCode::PsnSequenceError))
        );
        assert_eq!(
            AethSyndrome::from_byte(0x62),
            Ok(AethSyndrome::Nak(NakCode::RemoteAccessError))
        );
        assert_eq!(
            AethSyndrome::from_byte(0x65),
            Err(Error::ReservedSyndrome(0x65))
        );
        assert_eq!(
            AethSyndrome::from_byte(0x40),
            Err(Error::ReservedSyndrome(0x40))
        );
        assert_eq!(
            AethSyndrome::from_byte(0x9F),
            Err(Error::ReservedSyndrome(0x9F))
        );
    }

    #[test]
    fn rnr_table_matches_iba() {
        assert_eq!(RnrTimer::new(0).unwrap().micros(), 655_360);
        assert_eq!(RnrTimer::new(1).unwrap().micros(), 10);
        assert_eq!(RnrTimer::new(25).unwrap().micros(), 61_440);
        assert_eq!(RnrTimer::new(31).unwrap().micros(), 491_520);
        assert!(RnrTimer::new(32).is_none());
        // Codes 1..31 increase strictly.
        assert!(RNR_TIMER_US[1..].windows(2).all(|w| w[0] < w[1]));
        assert_eq!(
            AethSyndrome::RnrNak(RnrTimer::new(12).unwrap()).to_string(),
            "RNR_NAK rnr_timer=12 (0.64 ms)"
        );
    }

    #[test]
    fn ack_timeout_encoding() {
        assert_eq!(AckTimeout::new(0).unwrap().nanos(), None);
        assert_eq!(AckTimeout::new(1).unwrap().nanos(), Some(8192));
        assert_eq!(AckTimeout::new(14).unwrap().nanos(), Some(4096 << 14)); // ~67 ms
        assert_eq!(AckTimeout::new(31).unwrap().nanos(), Some(4096u64 << 31));
        assert!(AckTimeout::new(32).is_none());
    }
}
