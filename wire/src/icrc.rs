//! The RoCEv2 invariant CRC.
//!
//! CRC-32 (IEEE 802.3, as zlib/crc32fast compute it) over
//!
//! 1. eight bytes of `0xFF` standing in for the masked LRH,
//! 2. the IP header with its variant fields set to all ones (IPv4: TOS, TTL,
//!    header checksum; IPv6: traffic class, flow label, hop limit),
//! 3. the UDP header with its checksum set to `0xFFFF`,
//! 4. the BTH with byte 4 (FECN, BECN, reserved) set to `0xFF`,
//! 5. the extension headers, payload and pad bytes,
//!
//! stored after the pad bytes least significant byte first. Everything else
//! is covered, notably the IPv4 identification, flags and lengths.

use crate::bth;
use crate::error::{need, Error, Result};
use crate::ip::{
    Ipv4Header, Ipv4Repr, Ipv6Header, Ipv6Repr, UdpHeader, UdpRepr, IPV4_HEADER_LEN,
    IPV6_HEADER_LEN, UDP_HEADER_LEN,
};
use crate::ICRC_LEN;
use crc32fast::Hasher;
use std::net::{Ipv4Addr, Ipv6Addr};

/// Finalized CRC-32 of eight `0xFF` bytes: the ICRC computation starts from
/// here (Linux rxe seeds its un-inverted register with `!SEED` = 0xdebb20e3).
const SEED: u32 = 0x2144_DF1C;

/// A CRC-32 state starting from `init`, with whichever of crc32fast's two
/// implementations runs faster here: its SIMD one (PCLMULQDQ, about 30-40
/// GB/s on a real x86 core) or its table one (slice-by-16, about 4-5
/// GB/s). Under an instruction emulator (qemu TCG, as in the rxe-peer
/// guests) the order flips: carry-less multiplication is emulated bit by
/// bit, and the table one measured 505 MB/s against 315 there. Both give
/// the same values; the choice is timed once per process on 4 KiB.
fn hasher(init: u32) -> Hasher {
    if table_crc_is_faster() {
        Hasher::internal_new_baseline(init, 0)
    } else {
        Hasher::new_with_initial(init)
    }
}

/// Whether crc32fast's table implementation beats its default (timed
/// once, the faster of three rounds each).
fn table_crc_is_faster() -> bool {
    use std::sync::OnceLock;
    use std::time::{Duration, Instant};
    static TABLE: OnceLock<bool> = OnceLock::new();
    *TABLE.get_or_init(|| {
        let buf = [0x5Au8; 4096];
        let time = |table: bool| {
            (0..3)
                .map(|_| {
                    let t = Instant::now();
                    for _ in 0..4 {
                        let mut h = if table {
                            Hasher::internal_new_baseline(0, 0)
                        } else {
                            Hasher::new()
                        };
                        h.update(std::hint::black_box(&buf));
                        std::hint::black_box(h.finalize());
                    }
                    t.elapsed()
                })
                .min()
                .unwrap_or(Duration::ZERO)
        };
        time(true) < time(false)
    })
}

/// The largest IP header (IPv4 with 40 bytes of options).
const MAX_IP_HEADER: usize = 60;

/// Mask the invariant fields of an IP header into `out`; returns its length.
fn masked_ip_header(ip_header: &[u8], out: &mut [u8; MAX_IP_HEADER]) -> Result<usize> {
    let first = *ip_header.first().ok_or(Error::BadIpHeader("IP"))?;
    match first >> 4 {
        4 => {
            let v = Ipv4Header::new_checked(ip_header)?;
            let n = v.header_len();
            out[..n].copy_from_slice(v.header_bytes());
            out[1] = 0xFF; // TOS (DSCP + ECN)
            out[8] = 0xFF; // TTL
            out[10] = 0xFF; // header checksum
            out[11] = 0xFF;
            Ok(n)
        }
        6 => {
            let v = Ipv6Header::new_checked(ip_header)?;
            out[..IPV6_HEADER_LEN].copy_from_slice(v.header_bytes());
            out[0] |= 0x0F; // traffic class, high nibble in byte 0
            out[1] = 0xFF; // traffic class low nibble + flow label
            out[2] = 0xFF;
            out[3] = 0xFF;
            out[7] = 0xFF; // hop limit
            Ok(IPV6_HEADER_LEN)
        }
        _ => Err(Error::BadIpHeader("IP")),
    }
}

/// Compute the ICRC of a RoCEv2 packet.
///
/// `ip_header` is the IPv4 (with options) or IPv6 header as it is (or will
/// be) on the wire, `udp_header` the 8-byte UDP header, and `roce` the UDP
/// payload from the BTH up to the end of the pad bytes, *without* the ICRC.
pub fn compute(ip_header: &[u8], udp_header: &[u8], roce: &[u8]) -> Result<u32> {
    compute_parts(ip_header, udp_header, &[roce])
}

/// [`compute`] over a packet given in pieces (headers, then payload that
/// lives elsewhere, then pad): `roce` is their concatenation, and the
/// first piece holds at least the BTH.
pub fn compute_parts(ip_header: &[u8], udp_header: &[u8], roce: &[&[u8]]) -> Result<u32> {
    continue_parts(prefix_crc(ip_header, udp_header)?, roce)
}

/// The CRC over the part of the ICRC's input before the BTH (masked LRH,
/// IP header and UDP header): the state [`continue_parts`] goes on from.
/// It depends only on the flow and the datagram's length, so callers that
/// sign or check many packets keep it ([`Ipv4Prefixes`]).
pub fn prefix_crc(ip_header: &[u8], udp_header: &[u8]) -> Result<u32> {
    let mut pre = [0u8; MAX_IP_HEADER + UDP_HEADER_LEN];
    let mut ip = [0u8; MAX_IP_HEADER];
    let n = masked_ip_header(ip_header, &mut ip)?;
    need(udp_header, UDP_HEADER_LEN)?;
    pre[..n].copy_from_slice(&ip[..n]);
    pre[n..n + 6].copy_from_slice(&udp_header[..6]);
    pre[n + 6] = 0xFF; // UDP checksum
    pre[n + 7] = 0xFF;
    let mut h = hasher(SEED);
    h.update(&pre[..n + UDP_HEADER_LEN]);
    Ok(h.finalize())
}

/// The ICRC of a packet whose headers before the BTH gave `prefix`
/// ([`prefix_crc`]), over `roce` in pieces as [`compute_parts`] takes it.
pub fn continue_parts(prefix: u32, roce: &[&[u8]]) -> Result<u32> {
    let (roce, rest) = match roce.split_first() {
        Some((first, rest)) => (*first, rest),
        None => (&[][..], &[][..]),
    };
    need(roce, bth::HEADER_LEN)?;
    let mut bth_masked = [0u8; bth::HEADER_LEN];
    bth_masked.copy_from_slice(&roce[..bth::HEADER_LEN]);
    bth_masked[4] = 0xFF; // FECN, BECN, resv6
    let mut h = hasher(prefix);
    h.update(&bth_masked);
    h.update(&roce[bth::HEADER_LEN..]);
    for piece in rest {
        h.update(piece);
    }
    Ok(h.finalize())
}

/// The prefix CRC ([`prefix_crc`]) of an IPv4 datagram from an unconnected
/// Linux socket (identification `ident`, DF set, no options) carrying
/// `roce_len` bytes from the BTH to the end of the pad.
pub fn ipv4_prefix_crc(
    src: Ipv4Addr,
    dst: Ipv4Addr,
    src_port: u16,
    dst_port: u16,
    ident: u16,
    roce_len: usize,
) -> Result<u32> {
    let udp_len = UDP_HEADER_LEN + roce_len + ICRC_LEN;
    let mut ip = [0u8; IPV4_HEADER_LEN];
    Ipv4Repr {
        src,
        dst,
        tos: 0,
        ident,
        dont_frag: true,
        ttl: 64,
        payload_len: udp_len,
    }
    .emit(&mut ip)?;
    prefix_crc(&ip, &udp_header(src_port, dst_port, udp_len)?)
}

/// The UDP header of a RoCEv2 datagram of `udp_len` bytes (checksum 0: the
/// ICRC masks it anyway).
fn udp_header(src_port: u16, dst_port: u16, udp_len: usize) -> Result<[u8; UDP_HEADER_LEN]> {
    let mut udp = [0u8; UDP_HEADER_LEN];
    UdpRepr {
        src_port,
        dst_port,
        payload_len: udp_len - UDP_HEADER_LEN,
    }
    .emit(&mut udp)?;
    Ok(udp)
}

/// Prefix CRCs ([`ipv4_prefix_crc`], identification 0) of recent IPv4
/// flows and lengths. A packet's ICRC otherwise starts by building and
/// hashing 36 bytes of headers, as much work as a small packet's own bytes;
/// the packets of a flow come in a few lengths. Direct-mapped: a flow that
/// collides with another costs the computation, never a wrong value.
#[derive(Debug, Clone)]
pub struct Ipv4Prefixes {
    /// (flow and length packed, with bit 31 set; prefix CRC). Key 0 is an
    /// empty slot.
    slots: Box<[(u128, u32); Self::SLOTS]>,
}

impl Default for Ipv4Prefixes {
    fn default() -> Self {
        Ipv4Prefixes {
            slots: Box::new([(0, 0); Self::SLOTS]),
        }
    }
}

impl Ipv4Prefixes {
    const SLOTS: usize = 64;

    /// The prefix CRC of `roce_len` bytes from `src`:`src_port` to
    /// `dst`:`dst_port` (identification 0, DF set).
    pub fn get(
        &mut self,
        src: Ipv4Addr,
        dst: Ipv4Addr,
        src_port: u16,
        dst_port: u16,
        roce_len: usize,
    ) -> Result<u32> {
        let Some(len) = u32::try_from(roce_len).ok().filter(|l| *l <= 0xFFFF) else {
            // Longer than any IPv4 datagram: the error, uncached.
            return ipv4_prefix_crc(src, dst, src_port, dst_port, 0, roce_len);
        };
        let key = u128::from(u32::from(src)) << 96
            | u128::from(u32::from(dst)) << 64
            | u128::from(src_port) << 48
            | u128::from(dst_port) << 32
            | u128::from(len | 1 << 31);
        let folded = (key ^ key >> 64) as u64;
        let folded = folded ^ folded >> 32;
        let at = (folded ^ folded >> 16 ^ folded >> 6) as usize % Self::SLOTS;
        let slot = &mut self.slots[at];
        if slot.0 == key {
            return Ok(slot.1);
        }
        let crc = ipv4_prefix_crc(src, dst, src_port, dst_port, 0, roce_len)?;
        *slot = (key, crc);
        Ok(crc)
    }

    /// [`compute_ipv4_parts`] with identification 0, from the kept prefix.
    pub fn icrc(
        &mut self,
        src: Ipv4Addr,
        dst: Ipv4Addr,
        src_port: u16,
        dst_port: u16,
        roce: &[&[u8]],
    ) -> Result<u32> {
        let roce_len = roce.iter().map(|p| p.len()).sum();
        let prefix = self.get(src, dst, src_port, dst_port, roce_len)?;
        continue_parts(prefix, roce)
    }
}

/// The ICRC as stored on the wire (least significant byte first).
pub const fn to_wire(icrc: u32) -> [u8; ICRC_LEN] {
    icrc.to_le_bytes()
}

/// Read the ICRC from the last four bytes of a RoCEv2 UDP payload.
pub fn from_wire(roce_with_icrc: &[u8]) -> Result<u32> {
    need(roce_with_icrc, bth::HEADER_LEN + ICRC_LEN)?;
    let n = roce_with_icrc.len();
    let mut w = [0u8; ICRC_LEN];
    w.copy_from_slice(&roce_with_icrc[n - ICRC_LEN..]);
    Ok(u32::from_le_bytes(w))
}

/// The outcome of checking a packet's ICRC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IcrcCheck {
    /// The value in the packet.
    pub wire: u32,
    /// The value computed from the headers and payload.
    pub expected: u32,
}

impl IcrcCheck {
    /// True when they agree.
    pub const fn ok(&self) -> bool {
        self.wire == self.expected
    }
}

/// Check the ICRC of a RoCEv2 UDP payload (`roce` includes the trailing ICRC).
pub fn check(ip_header: &[u8], udp_header: &[u8], roce: &[u8]) -> Result<IcrcCheck> {
    let wire = from_wire(roce)?;
    let expected = compute(ip_header, udp_header, &roce[..roce.len() - ICRC_LEN])?;
    Ok(IcrcCheck { wire, expected })
}

/// Compute the ICRC for a packet sent from an *unconnected* Linux UDP socket
/// with don't-fragment set (`IP_PMTUDISC_DO`): Linux then emits IPv4
/// identification 0, so the whole header is known in advance. TOS and TTL
/// are masked by the ICRC and do not matter.
///
/// `roce` runs from the BTH to the end of the pad, without the ICRC.
pub fn compute_linux_ipv4(
    src: Ipv4Addr,
    dst: Ipv4Addr,
    src_port: u16,
    dst_port: u16,
    roce: &[u8],
) -> Result<u32> {
    compute_ipv4(src, dst, src_port, dst_port, 0, roce)
}

/// [`compute_linux_ipv4`] for a packet whose IPv4 header carries
/// identification `ident`: segment `k` of a UDP GSO send from such a socket
/// carries `k` (the kernel numbers the segments of a send whose first
/// datagram has identification 0: `inet_gso_segment`).
pub fn compute_ipv4(
    src: Ipv4Addr,
    dst: Ipv4Addr,
    src_port: u16,
    dst_port: u16,
    ident: u16,
    roce: &[u8],
) -> Result<u32> {
    compute_ipv4_parts(src, dst, src_port, dst_port, ident, &[roce])
}

/// [`compute_ipv4`] over a packet given in pieces (see [`compute_parts`]).
pub fn compute_ipv4_parts(
    src: Ipv4Addr,
    dst: Ipv4Addr,
    src_port: u16,
    dst_port: u16,
    ident: u16,
    roce: &[&[u8]],
) -> Result<u32> {
    let roce_len: usize = roce.iter().map(|p| p.len()).sum();
    let prefix = ipv4_prefix_crc(src, dst, src_port, dst_port, ident, roce_len)?;
    continue_parts(prefix, roce)
}

/// The reflected CRC-32 polynomial.
const POLY: u32 = 0xEDB8_8320;

/// `a * b mod P` with both in the reflected representation (`1 << 31` is
/// the polynomial 1), as zlib's `multmodp`.
const fn mul_mod(a: u32, mut b: u32) -> u32 {
    let mut m: u32 = 1 << 31;
    let mut p: u32 = 0;
    loop {
        if a & m != 0 {
            p ^= b;
            if a & (m - 1) == 0 {
                return p;
            }
        }
        m >>= 1;
        if m == 0 {
            return p;
        }
        b = if b & 1 != 0 { (b >> 1) ^ POLY } else { b >> 1 };
    }
}

/// `x^(2^k) mod P` for k = 0..32.
const X2N: [u32; 32] = {
    let mut t = [0u32; 32];
    let mut p: u32 = 1 << 30; // x^1
    let mut k = 0;
    while k < 32 {
        t[k] = p;
        p = mul_mod(p, p);
        k += 1;
    }
    t
};

/// `x^(8 * bytes) mod P`: the operator that appends `bytes` zero bytes to
/// a CRC register with no initial value or final xor.
fn x_pow_bytes(bytes: usize) -> u32 {
    let mut p: u32 = 1 << 31; // x^0
    let mut n = bytes as u64;
    let mut k = 3; // x^(8n) = x^(n * 2^3)
    while n != 0 {
        if n & 1 != 0 {
            p = mul_mod(X2N[k & 31], p);
        }
        n >>= 1;
        k += 1;
    }
    p
}

/// The change an IPv4 identification change makes to an ICRC, for
/// packets of `roce_len` bytes from the BTH to the end of the pad: XOR it
/// into the ICRC computed for identification `old` to get the one for
/// `new`. See [`Reident`].
pub fn ipv4_ident_delta(old: u16, new: u16, roce_len: usize) -> u32 {
    Reident::new(roce_len).delta(old, new)
}

/// Re-signing IPv4 packets of one length for another identification
/// without recomputing their CRC: CRC-32 is affine, so two messages of one
/// length that differ only in the identification's two bytes have CRCs
/// that differ by the pure (no initial value, no final xor) CRC of that
/// difference followed by the bytes after it, all zero. XORing the delta
/// into a packet's ICRC gives exactly the recomputed value when the ICRC
/// was right, and keeps a wrong one (a packet corrupted on purpose) wrong.
///
/// The delta is linear in `old ^ new`, so it is kept per bit of the
/// identification: a delta is then a few XORs (GSO runs re-sign up to 64
/// packets of one length each).
#[derive(Debug, Clone, Copy)]
pub struct Reident {
    /// The delta for each single bit of `old ^ new` (bit `i`: `1 << i`).
    basis: [u32; 16],
}

impl Reident {
    /// For packets whose BTH..pad is `roce_len` bytes.
    pub fn new(roce_len: usize) -> Reident {
        // The CRC runs over 8 bytes of 0xFF, the IPv4 header (the
        // identification at its bytes 4 and 5), the UDP header and the
        // RoCE bytes: after the identification come 20 - 6 + 8 + roce_len.
        let after = IPV4_HEADER_LEN - 6 + UDP_HEADER_LEN + roce_len;
        let shift = x_pow_bytes(after);
        let mut basis = [0u32; 16];
        for (i, b) in basis.iter_mut().enumerate() {
            let mut s: u32 = 0;
            for byte in (1u16 << i).to_be_bytes() {
                s ^= u32::from(byte);
                for _ in 0..8 {
                    s = if s & 1 != 0 { (s >> 1) ^ POLY } else { s >> 1 };
                }
            }
            *b = mul_mod(shift, s);
        }
        Reident { basis }
    }

    /// What to XOR into the ICRC for identification `old` to make it the
    /// one for `new`.
    pub fn delta(&self, old: u16, new: u16) -> u32 {
        let mut d = old ^ new;
        let mut x = 0;
        while d != 0 {
            x ^= self.basis[d.trailing_zeros() as usize];
            d &= d - 1;
        }
        x
    }
}

/// Tables kept for the last few packet lengths seen ([`Reident`],
/// [`UnseenIpv4Fields`]: built once per length, as packets of one flow
/// come in a few lengths, e.g. MIDDLE and a LAST with an AETH), replaced
/// in turn.
#[derive(Debug, Clone)]
pub struct RecentLengths<T> {
    entries: [Option<(usize, T)>; 4],
    next: usize,
}

impl<T: Copy> Default for RecentLengths<T> {
    fn default() -> Self {
        RecentLengths {
            entries: [None; 4],
            next: 0,
        }
    }
}

impl<T: Copy> RecentLengths<T> {
    /// The table for `len`, built by `make` if it is not kept.
    pub fn get_or_make(&mut self, len: usize, make: impl FnOnce(usize) -> T) -> T {
        if let Some(&(_, t)) = self.entries.iter().flatten().find(|(l, _)| *l == len) {
            return t;
        }
        let t = make(len);
        let at = self.next % self.entries.len();
        self.entries[at] = Some((len, t));
        self.next = at + 1;
        t
    }
}

/// The ICRC changes the IPv4 fields a UDP socket never shows can make, for
/// packets of one length: any identification, and the don't-fragment flag
/// set or not (rxe and NICs number their datagrams; a UDP receiver sees
/// neither field). CRC-32 is affine, so these changes form a subspace of
/// 17 dimensions of the 32-bit values. A received ICRC that differs from
/// the one computed for identification 0 with DF set by a value outside it
/// is wrong whatever the sender's identification and flag: the packet was
/// damaged (a random error escapes with probability 2^17 / 2^32, 1 in
/// 32,768). Computing it takes 17 `x^(8n) mod P` multiplications; callers
/// keep one per packet length.
#[derive(Debug, Clone, Copy)]
pub struct UnseenIpv4Fields {
    ident: Reident,
    /// An echelon basis of the subspace: `rows[i]`'s highest set bit is
    /// its own, and the rows are in descending order of it.
    rows: [u32; 17],
    n: usize,
}

impl UnseenIpv4Fields {
    /// For packets whose BTH..pad is `roce_len` bytes.
    pub fn new(roce_len: usize) -> UnseenIpv4Fields {
        let ident = Reident::new(roce_len);
        // DF is bit 0x40 of the byte after the identification.
        let after_flags = IPV4_HEADER_LEN - 7 + UDP_HEADER_LEN + roce_len;
        let mut df: u32 = 0x40;
        for _ in 0..8 {
            df = if df & 1 != 0 {
                (df >> 1) ^ POLY
            } else {
                df >> 1
            };
        }
        let df = mul_mod(x_pow_bytes(after_flags), df);
        let mut rows = [0u32; 17];
        let mut n = 0;
        for mut v in ident.basis.into_iter().chain([df]) {
            for r in &rows[..n] {
                if v & (1 << (31 - r.leading_zeros())) != 0 {
                    v ^= r;
                }
            }
            if v != 0 {
                rows[n] = v;
                n += 1;
                rows[..n].sort_unstable_by(|a, b| b.cmp(a));
            }
        }
        UnseenIpv4Fields { ident, rows, n }
    }

    /// The change from identification `old` to `new` (see [`Reident`]).
    pub fn ident_delta(&self, old: u16, new: u16) -> u32 {
        self.ident.delta(old, new)
    }

    /// Whether `diff`, a received ICRC XOR the one computed for
    /// identification 0 with DF set, is a change those fields can make.
    pub fn explains(&self, diff: u32) -> bool {
        let mut x = diff;
        for r in &self.rows[..self.n] {
            if x & (1 << (31 - r.leading_zeros())) != 0 {
                x ^= r;
            }
        }
        x == 0
    }
}

/// Compute the ICRC for a packet over IPv6: every covered field is known
/// from the addresses, ports and length (flow label, traffic class and hop
/// limit are masked).
pub fn compute_ipv6(
    src: Ipv6Addr,
    dst: Ipv6Addr,
    src_port: u16,
    dst_port: u16,
    roce: &[u8],
) -> Result<u32> {
    compute_ipv6_parts(src, dst, src_port, dst_port, &[roce])
}

/// [`compute_ipv6`] over a packet given in pieces (see [`compute_parts`]).
pub fn compute_ipv6_parts(
    src: Ipv6Addr,
    dst: Ipv6Addr,
    src_port: u16,
    dst_port: u16,
    roce: &[&[u8]],
) -> Result<u32> {
    let roce_len: usize = roce.iter().map(|p| p.len()).sum();
    let udp_len = UDP_HEADER_LEN + roce_len + ICRC_LEN;
    let mut ip = [0u8; IPV6_HEADER_LEN];
    Ipv6Repr {
        src,
        dst,
        traffic_class: 0,
        flow_label: 0,
        hop_limit: 64,
        payload_len: udp_len,
    }
    .emit(&mut ip)?;
    compute_parts(&ip, &udp_header(src_port, dst_port, udp_len)?, roce)
}

/// Check the ICRC of a whole IP datagram (IPv4 or IPv6, then UDP, then RoCEv2).
pub fn check_datagram(datagram: &[u8]) -> Result<IcrcCheck> {
    let ip_len = match datagram.first().map(|b| b >> 4) {
        Some(4) => Ipv4Header::new_checked(datagram)?.header_len(),
        Some(6) => IPV6_HEADER_LEN,
        _ => return Err(Error::BadIpHeader("IP")),
    };
    need(datagram, ip_len + UDP_HEADER_LEN)?;
    let udp = UdpHeader::new_checked(&datagram[ip_len..])?;
    let udp_end = ip_len + udp.length() as usize;
    if (udp.length() as usize) < UDP_HEADER_LEN || udp_end > datagram.len() {
        return Err(Error::BadIpHeader("UDP"));
    }
    check(
        &datagram[..ip_len],
        udp.header_bytes(),
        &datagram[ip_len + UDP_HEADER_LEN..udp_end],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_prefix_gives_the_icrc_computed_whole() {
        // Flows that differ in one field each, more of them than the
        // cache has slots, asked in turn twice: a hit must be the flow's
        // own prefix, a miss recomputes it.
        let mut flows = Vec::new();
        for i in 0..40u8 {
            let a = Ipv4Addr::new(127, 0, 0, 1 + i % 5);
            let b = Ipv4Addr::new(127, 0, 1 + i % 3, 2);
            flows.push((a, b, 0xC000 + u16::from(i % 7), 4791));
            flows.push((b, a, 0xC000 + u16::from(i % 7), 4791));
            flows.push((a, b, 0xC000 + u16::from(i % 7), 4792));
        }
        let body: Vec<u8> = (0..4200u32).map(|i| (i * 7 + 3) as u8).collect();
        let mut kept = Ipv4Prefixes::default();
        for round in 0..2 {
            for (k, &(src, dst, sport, dport)) in flows.iter().enumerate() {
                for len in [12, 12 + 64, 16 + 4096, 28 + (k % 9)] {
                    let parts = [&body[..12], &body[12..len]];
                    let whole = compute_ipv4_parts(src, dst, sport, dport, 0, &parts).unwrap();
                    let prefix = kept.get(src, dst, sport, dport, len).unwrap();
                    assert_eq!(
                        continue_parts(prefix, &parts).unwrap(),
                        whole,
                        "round {round}, {src}:{sport} -> {dst}:{dport}, {len} bytes"
                    );
                }
            }
        }
        // Longer than an IPv4 datagram: the error, as uncached.
        assert!(kept.get(flows[0].0, flows[0].1, 1, 2, 70_000).is_err());
    }

    #[test]
    fn an_icrc_over_pieces_equals_the_one_over_their_concatenation() {
        let (src, dst) = (Ipv4Addr::new(127, 0, 0, 1), Ipv4Addr::new(127, 0, 0, 2));
        let (s6, d6) = (
            Ipv6Addr::LOCALHOST,
            Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 2),
        );
        let roce: Vec<u8> = (0..1500u32).map(|i| (i * 7 + 3) as u8).collect();
        for (a, b) in [(12, 12), (12, 40), (28, 1496), (40, 1500), (1500, 1500)] {
            let parts = [&roce[..a], &roce[a..b], &roce[b..]];
            assert_eq!(
                compute_ipv4_parts(src, dst, 0xC001, 4791, 5, &parts).unwrap(),
                compute_ipv4(src, dst, 0xC001, 4791, 5, &roce).unwrap(),
                "{a} {b}"
            );
            assert_eq!(
                compute_ipv6_parts(s6, d6, 0xC001, 4791, &parts).unwrap(),
                compute_ipv6(s6, d6, 0xC001, 4791, &roce).unwrap(),
                "{a} {b}"
            );
        }
        // The first piece must hold the BTH.
        let short = [&roce[..8], &roce[8..]];
        assert!(compute_ipv4_parts(src, dst, 1, 4791, 0, &short).is_err());
        assert!(compute_ipv4_parts(src, dst, 1, 4791, 0, &[]).is_err());
    }

    #[test]
    fn reidentified_icrc_equals_the_recomputed_one() {
        let (src, dst) = (Ipv4Addr::new(127, 0, 0, 1), Ipv4Addr::new(127, 0, 0, 2));
        // Seeded lengths and contents (SplitMix-like), every identification
        // pair class: 0 -> k, k -> 0, k -> j, and the same.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        for len in [12usize, 13, 28, 76, 1036, 4108] {
            let roce: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            let r = Reident::new(len);
            for (old, new) in [(0u16, 1u16), (0, 63), (5, 0), (17, 42), (9, 9), (0xFFFF, 0)] {
                let a = compute_ipv4(src, dst, 0xC001, 4791, old, &roce).unwrap();
                let b = compute_ipv4(src, dst, 0xC001, 4791, new, &roce).unwrap();
                assert_eq!(a ^ r.delta(old, new), b, "len {len}, {old} -> {new}");
                assert_eq!(ipv4_ident_delta(old, new, len), r.delta(old, new));
            }
            // A wrong ICRC stays exactly as wrong.
            let a = compute_ipv4(src, dst, 0xC001, 4791, 0, &roce).unwrap();
            let b = compute_ipv4(src, dst, 0xC001, 4791, 3, &roce).unwrap();
            assert_eq!((a ^ 0x10) ^ r.delta(0, 3), b ^ 0x10);
        }
    }

    /// The ICRC over an IPv4 header with `ident` and DF as given.
    fn icrc_with(src: Ipv4Addr, dst: Ipv4Addr, ident: u16, df: bool, roce: &[u8]) -> u32 {
        let udp_len = UDP_HEADER_LEN + roce.len() + ICRC_LEN;
        let mut ip = [0u8; IPV4_HEADER_LEN];
        Ipv4Repr {
            src,
            dst,
            tos: 0x12,
            ident,
            dont_frag: df,
            ttl: 17,
            payload_len: udp_len,
        }
        .emit(&mut ip)
        .unwrap();
        let mut udp = [0u8; UDP_HEADER_LEN];
        UdpRepr {
            src_port: 0xC001,
            dst_port: 4791,
            payload_len: roce.len() + ICRC_LEN,
        }
        .emit(&mut udp)
        .unwrap();
        compute(&ip, &udp, roce).unwrap()
    }

    #[test]
    fn unseen_ipv4_fields_explain_any_identification_and_flag_but_not_damage() {
        let (src, dst) = (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2));
        let mut x: u64 = 0x2545_F491_4F6C_DD1D;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut escaped = 0;
        for len in [12usize, 28, 76, 1036, 4108, 4112] {
            let roce: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            let f = UnseenIpv4Fields::new(len);
            assert_eq!(f.n, 17, "len {len}: 17 independent directions");
            let base = compute_ipv4(src, dst, 0xC001, 4791, 0, &roce).unwrap();
            assert_eq!(icrc_with(src, dst, 0, true, &roce), base);
            for _ in 0..40 {
                let ident = next() as u16;
                let df = next() & 1 == 0;
                let c = icrc_with(src, dst, ident, df, &roce);
                assert!(f.explains(c ^ base), "len {len}, ident {ident}, DF {df}");
                if df {
                    assert_eq!(c ^ base, f.ident_delta(0, ident));
                }
            }
            // One bit after the BTH flipped (some of the BTH's are masked
            // out of the ICRC), under some identification: no
            // identification or flag explains it.
            for _ in 0..if len > 12 { 300 } else { 0 } {
                let mut bad = roce.clone();
                let bit = 96 + next() as usize % ((len - 12) * 8);
                bad[bit / 8] ^= 1 << (bit % 8);
                let c = icrc_with(src, dst, next() as u16, true, &bad);
                escaped += usize::from(f.explains(c ^ base));
            }
        }
        // 1,500 damaged packets; each escapes with probability 2^-15.
        assert_eq!(escaped, 0);
        // Random differences: about 2^-15 of them are explained.
        let f = UnseenIpv4Fields::new(4108);
        let explained = (0..200_000).filter(|_| f.explains(next() as u32)).count();
        assert!((1..=20).contains(&explained), "{explained} of 200,000");
    }

    #[test]
    fn seed_is_crc_of_eight_ff() {
        assert_eq!(crc32fast::hash(&[0xFF; 8]), SEED);
        assert_eq!(!SEED, 0xdebb_20e3);
    }

    /// The recipe, checked against an independent byte-by-byte construction
    /// of the masked input (the real-hardware vectors are checked against
    /// the golden captures in tests/golden.rs).
    #[test]
    fn recipe_matches_manual_masking() {
        let ipv4 = Ipv4Repr {
            src: Ipv4Addr::new(127, 0, 0, 1),
            dst: Ipv4Addr::new(127, 0, 0, 2),
            tos: 0x02,
            ident: 0,
            dont_frag: true,
            ttl: 64,
            payload_len: 8 + 12 + 4 + 4,
        };
        let mut iph = [0u8; 20];
        ipv4.emit(&mut iph).unwrap();
        let mut udph = [0u8; 8];
        UdpRepr {
            src_port: 0xc000,
            dst_port: 4791,
            payload_len: 20,
        }
        .emit(&mut udph)
        .unwrap();
        let roce = [
            4u8, 0, 0xff, 0xff, 0xC0, 0, 0, 0x11, 0x80, 0, 0, 1, 1, 2, 3, 4,
        ];
        let mut manual = vec![0xFFu8; 8];
        let mut m = iph;
        m[1] = 0xFF;
        m[8] = 0xFF;
        m[10] = 0xFF;
        m[11] = 0xFF;
        manual.extend_from_slice(&m);
        manual.extend_from_slice(&udph[..6]);
        manual.extend_from_slice(&[0xFF, 0xFF]);
        let mut r = roce;
        r[4] = 0xFF;
        manual.extend_from_slice(&r);
        let want = crc32fast::hash(&manual);
        assert_eq!(compute(&iph, &udph, &roce).unwrap(), want);
        assert_eq!(
            compute_linux_ipv4(ipv4.src, ipv4.dst, 0xc000, 4791, &roce).unwrap(),
            want
        );
        // Variant fields do not change it; covered ones do.
        let mut iph2 = iph;
        iph2[8] = 1;
        iph2[1] = 0xb8;
        assert_eq!(compute(&iph2, &udph, &roce).unwrap(), want);
        let mut iph3 = iph;
        iph3[5] = 1; // identification
        assert_ne!(compute(&iph3, &udph, &roce).unwrap(), want);
        let mut r2 = roce;
        r2[4] = 0x80; // FECN
        assert_eq!(compute(&iph, &udph, &r2).unwrap(), want);
        r2[8] = 0; // AckReq is covered
        assert_ne!(compute(&iph, &udph, &r2).unwrap(), want);
    }

    #[test]
    fn bad_inputs_are_errors() {
        assert!(compute(&[], &[0; 8], &[0; 12]).is_err());
        assert!(compute(&[0x45; 19], &[0; 8], &[0; 12]).is_err());
        assert!(compute(&[0x60; 40], &[0; 7], &[0; 12]).is_err());
        assert!(compute(&[0x60; 40], &[0; 8], &[0; 11]).is_err());
        assert!(check_datagram(&[0x45]).is_err());
    }
}
