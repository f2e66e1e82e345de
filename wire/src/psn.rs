//! Packet sequence numbers: 24-bit, wrapping, compared within a half window.

use core::fmt;
use core::ops::{Add, AddAssign, Sub};

/// A 24-bit InfiniBand packet sequence number.
///
/// Arithmetic wraps modulo 2^24. Ordering is the IB half-window rule (rxe's
/// `psn_compare`): `b` is *later* than `a` when it lies less than 2^23 ahead
/// of it, and a *duplicate* (earlier) when it lies within 2^23 behind.
/// Because that relation is not transitive, `Psn` implements no `Ord`; use
/// [`Psn::compare`] or [`Psn::distance`].
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Psn(u32);

/// Where a PSN lies relative to another one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PsnOrder {
    /// Earlier: within 2^23 behind (a duplicate from the responder's view).
    Earlier,
    /// The same PSN.
    Equal,
    /// Later: within 2^23 ahead (out of sequence from the responder's view).
    Later,
}

impl Psn {
    /// Mask of the 24 valid bits.
    pub const MASK: u32 = 0x00FF_FFFF;
    /// Half the PSN space: the comparison window.
    pub const HALF: u32 = 1 << 23;

    /// A PSN from the low 24 bits of `v` (higher bits are dropped).
    #[inline]
    pub const fn new(v: u32) -> Self {
        Psn(v & Self::MASK)
    }

    /// The PSN as an integer in `0..2^24`.
    #[inline]
    pub const fn value(self) -> u32 {
        self.0
    }

    /// Signed distance from `self` to `other` in `-2^23..2^23`:
    /// positive when `other` is later than `self`.
    #[inline]
    pub const fn distance(self, other: Psn) -> i32 {
        // Shift the 24-bit difference into the top of an i32 and back down:
        // the sign bit of the 24-bit difference becomes the i32 sign.
        ((other.0.wrapping_sub(self.0) << 8) as i32) >> 8
    }

    /// Where `other` lies relative to `self`.
    #[inline]
    pub const fn compare(self, other: Psn) -> PsnOrder {
        let d = self.distance(other);
        if d < 0 {
            PsnOrder::Earlier
        } else if d == 0 {
            PsnOrder::Equal
        } else {
            PsnOrder::Later
        }
    }

    /// True when `self` is strictly later than `other`.
    #[inline]
    pub const fn is_after(self, other: Psn) -> bool {
        other.distance(self) > 0
    }

    /// True when `self` is strictly earlier than `other`.
    #[inline]
    pub const fn is_before(self, other: Psn) -> bool {
        other.distance(self) < 0
    }

    /// The next PSN.
    #[inline]
    pub const fn next(self) -> Psn {
        Psn::new(self.0.wrapping_add(1))
    }
}

impl Add<u32> for Psn {
    type Output = Psn;
    #[inline]
    fn add(self, rhs: u32) -> Psn {
        Psn::new(self.0.wrapping_add(rhs))
    }
}

impl AddAssign<u32> for Psn {
    #[inline]
    fn add_assign(&mut self, rhs: u32) {
        *self = *self + rhs;
    }
}

impl Sub<u32> for Psn {
    type Output = Psn;
    #[inline]
    fn sub(self, rhs: u32) -> Psn {
        Psn::new(self.0.wrapping_sub(rhs))
    }
}

impl Sub<Psn> for Psn {
    type Output = i32;
    /// `a - b`: the signed half-window distance from `b` to `a`.
    #[inline]
    fn sub(self, rhs: Psn) -> i32 {
        rhs.distance(self)
    }
}

impl From<Psn> for u32 {
    fn from(p: Psn) -> u32 {
        p.0
    }
}

impl fmt::Debug for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Psn({})", self.0)
    }
}

impl fmt::Display for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps_at_24_bits() {
        assert_eq!(Psn::new(0xFF_FFFF) + 1, Psn::new(0));
        assert_eq!(Psn::new(0) - 1, Psn::new(0xFF_FFFF));
        assert_eq!(Psn::new(0x1_000_005).value(), 5);
        assert_eq!(Psn::new(0xFF_FFFE).next().next(), Psn::new(0));
    }

    #[test]
    fn half_window_comparison() {
        let a = Psn::new(10);
        assert_eq!(a.compare(Psn::new(11)), PsnOrder::Later);
        assert_eq!(a.compare(Psn::new(9)), PsnOrder::Earlier);
        assert_eq!(a.compare(a), PsnOrder::Equal);
        // Across the wrap: 0 is later than 0xFFFFFF.
        assert!(Psn::new(0).is_after(Psn::new(0xFF_FFFF)));
        assert!(Psn::new(0xFF_FFFF).is_before(Psn::new(0)));
        // Exactly 2^23 - 1 ahead is later; 2^23 ahead counts as earlier.
        assert_eq!(a.compare(a + (Psn::HALF - 1)), PsnOrder::Later);
        assert_eq!(a.compare(a + Psn::HALF), PsnOrder::Earlier);
        assert_eq!(Psn::new(5) - Psn::new(0xFF_FFFE), 7);
        assert_eq!(Psn::new(0xFF_FFFE) - Psn::new(5), -7);
    }
}
