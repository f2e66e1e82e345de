//! Packets of a reliable connection that arrived beyond a gap, kept until
//! the gap is filled (between roxe peers only: see `Qp::keeps_early`).
//!
//! A standard responder drops everything after a missing PSN, so the
//! requester's go-back-N resends it all. A roxe requester facing a roxe
//! responder on this host instead resends only the missing packet
//! (`Requester::resend_one`); this responder replays what it kept through
//! the ordinary in-order path, every check included, as if the packets had
//! just arrived in order.
//!
//! A WRITE packet has a known place: `pmtu` bytes per PSN after the bytes
//! written so far of the WRITE in progress, or after a kept FIRST of a
//! later one. Its payload is written there on arrival (`Qp::place_early`)
//! and only its headers, pad and ICRC are kept: the replay then writes
//! nothing (`payload_in_place`). Nothing changes on the wire. The bytes
//! land inside the range the WRITE's RETH names, whose content is
//! undefined until the WRITE completes, and it completes only after every
//! packet before this one has been executed in order, each where it
//! belongs.

use roxe_wire::{Psn, RethRepr};
use std::cell::RefCell;
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::ops::Deref;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Most packets one QP keeps (a full loopback window).
pub(super) const MAX_PACKETS: usize = 1024;
/// Most bytes all QPs of this process keep together.
const MAX_PROCESS_BYTES: usize = 64 << 20;
/// Bytes kept by every QP of this process.
static PROCESS_BYTES: AtomicUsize = AtomicUsize::new(0);

/// Most buffers of kept packets a thread holds for reuse (about 2 MiB).
const MAX_SPARE: usize = 512;

thread_local! {
    /// Buffers of kept packets, for reuse. A loss episode keeps up to a
    /// window of packets and frees them together at the replay; fresh
    /// buffers from the allocator cost a page fault each, since glibc
    /// hands the freed top of its heap back to the kernel (33,000 faults
    /// in a 64 KiB SEND stream at 1 % loss). Per thread: no lock, and a
    /// buffer goes back to the thread that replays its packet.
    static SPARE: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

/// A copy of a kept packet, in a buffer that goes back to this thread's
/// spares when dropped.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct KeptBytes(Vec<u8>);

impl KeptBytes {
    fn copy_of(bytes: &[u8]) -> Self {
        let mut b = SPARE.with_borrow_mut(Vec::pop).unwrap_or_default();
        b.clear();
        b.extend_from_slice(bytes);
        KeptBytes(b)
    }
}

impl Deref for KeptBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for KeptBytes {
    fn drop(&mut self) {
        let b = std::mem::take(&mut self.0);
        // Not during the thread's teardown (the pool may be gone).
        let _ = SPARE.try_with(|spare| {
            let mut spare = spare.borrow_mut();
            if spare.len() < MAX_SPARE {
                spare.push(b);
            }
        });
    }
}

/// What is kept of one packet.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Early {
    /// The packet as received.
    Packet(KeptBytes),
    /// A packet whose payload was placed on arrival: its headers (BTH on,
    /// before the payload), what follows the payload (pad and ICRC), the
    /// payload's length, and the offset in its message the payload went
    /// to.
    Placed {
        head: Vec<u8>,
        tail: Vec<u8>,
        payload_len: usize,
        offset: u64,
    },
}

impl Early {
    /// Bytes it holds.
    fn len(&self) -> usize {
        match self {
            Early::Packet(b) => b.len(),
            Early::Placed { head, tail, .. } => head.len() + tail.len(),
        }
    }
}

/// The early packets of one QP, by PSN.
#[derive(Debug, Default)]
pub(crate) struct EarlyPackets {
    by_psn: HashMap<u32, Early>,
    bytes: usize,
    /// The latest WRITE FIRST kept, and its RETH: where the packets after
    /// it go until the WRITE it starts is the one in progress.
    write_first: Option<(Psn, RethRepr)>,
    /// The highest PSN that arrived beyond the gap ([`new_holes`](Self::new_holes)).
    highest: Option<Psn>,
}

impl EarlyPackets {
    /// Whether a packet with PSN `psn` would be kept now: none is kept for
    /// it yet and the per-QP bound leaves room.
    pub fn has_room_for(&self, psn: Psn) -> bool {
        self.by_psn.len() < MAX_PACKETS && !self.by_psn.contains_key(&psn.value())
    }

    /// Keep a copy of packet `bytes` (PSN `psn`); false (nothing kept)
    /// when one is kept for that PSN already or the bounds are reached.
    pub fn keep(&mut self, psn: Psn, bytes: &[u8]) -> bool {
        self.keep_entry(psn, bytes.len(), || {
            Early::Packet(KeptBytes::copy_of(bytes))
        })
    }

    /// Keep what is left of a packet whose payload was placed (see
    /// [`Early::Placed`]); false as [`keep`](Self::keep).
    pub fn keep_placed(
        &mut self,
        psn: Psn,
        head: &[u8],
        tail: &[u8],
        payload_len: usize,
        offset: u64,
    ) -> bool {
        self.keep_entry(psn, head.len() + tail.len(), || Early::Placed {
            head: head.to_vec(),
            tail: tail.to_vec(),
            payload_len,
            offset,
        })
    }

    fn keep_entry(&mut self, psn: Psn, n: usize, entry: impl FnOnce() -> Early) -> bool {
        if self.by_psn.len() >= MAX_PACKETS {
            return false;
        }
        // One lookup for the check and the insert (this runs for about
        // half of all packets at 1 % loss).
        let Entry::Vacant(slot) = self.by_psn.entry(psn.value()) else {
            return false;
        };
        let reserved = PROCESS_BYTES
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                (used + n <= MAX_PROCESS_BYTES).then_some(used + n)
            })
            .is_ok();
        if !reserved {
            return false;
        }
        self.bytes += n;
        slot.insert(entry());
        true
    }

    /// Packet `psn` arrived beyond the gap at `epsn` (NAKed): the PSNs it
    /// shows missing that no earlier arrival showed, as (first, count).
    /// Those between `epsn` and the first packet beyond it, then those
    /// between the highest arrival so far and a later one.
    pub fn new_holes(&mut self, epsn: Psn, psn: Psn) -> Option<(Psn, u32)> {
        let from = match self.highest {
            Some(h) if h.is_after(epsn) => h.next(),
            _ => epsn.next(),
        };
        if self.highest.is_none_or(|h| psn.is_after(h)) {
            self.highest = Some(psn);
        }
        psn.is_after(from)
            .then(|| (from, from.distance(psn).unsigned_abs()))
    }

    /// A WRITE FIRST with PSN `psn` and RETH `reth` was kept.
    pub fn kept_write_first(&mut self, psn: Psn, reth: RethRepr) {
        if self.write_first.is_none_or(|(f, _)| psn.is_after(f)) {
            self.write_first = Some((psn, reth));
        }
    }

    /// The latest WRITE FIRST kept, before `psn`.
    pub fn write_first_before(&self, psn: Psn) -> Option<(Psn, RethRepr)> {
        self.write_first.filter(|(f, _)| f.is_before(psn))
    }

    /// Take what is kept for `psn`.
    pub fn take(&mut self, psn: Psn) -> Option<Early> {
        let e = self.by_psn.remove(&psn.value())?;
        self.release(e.len());
        Some(e)
    }

    /// Forget the packets before `epsn` (executed already, or duplicates).
    pub fn forget_before(&mut self, epsn: Psn) {
        if self.write_first.is_some_and(|(f, _)| f.is_before(epsn)) {
            self.write_first = None;
        }
        let mut freed = 0;
        self.by_psn.retain(|&p, e| {
            let keep = !Psn::new(p).is_before(epsn);
            if !keep {
                freed += e.len();
            }
            keep
        });
        self.release(freed);
    }

    /// Forget every packet.
    pub fn clear(&mut self) {
        self.write_first = None;
        self.highest = None;
        self.by_psn.clear();
        let n = self.bytes;
        self.release(n);
    }

    /// Nothing kept.
    pub fn is_empty(&self) -> bool {
        self.by_psn.is_empty()
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.by_psn.len()
    }

    fn release(&mut self, n: usize) {
        self.bytes -= n;
        PROCESS_BYTES.fetch_sub(n, Ordering::Relaxed);
    }
}

impl Drop for EarlyPackets {
    fn drop(&mut self) {
        self.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_each_psn_once_and_releases_what_it_forgets() {
        let mut e = EarlyPackets::default();
        assert!(e.keep(Psn::new(10), &[1; 100]));
        assert!(!e.keep(Psn::new(10), &[2; 100]), "one per PSN");
        assert!(e.keep(Psn::new(12), &[3; 50]));
        assert!(e.keep(Psn::new(0xFF_FFFF), &[4; 10]));
        assert!(e.keep_placed(Psn::new(13), &[5; 12], &[6; 4], 4096, 8192));
        assert!(
            !e.keep(Psn::new(13), &[7; 4112]),
            "one per PSN, placed or not"
        );
        assert_eq!(
            e.bytes, 176,
            "a placed packet holds its headers, pad and ICRC"
        );
        assert_eq!(
            e.take(Psn::new(13)).unwrap(),
            Early::Placed {
                head: vec![5; 12],
                tail: vec![6; 4],
                payload_len: 4096,
                offset: 8192
            }
        );
        assert_eq!(e.bytes, 160);
        assert!(matches!(e.take(Psn::new(10)), Some(Early::Packet(b)) if *b == [1; 100]));
        assert_eq!(e.take(Psn::new(10)), None);
        // 0xFFFFFF is before 5 across the wrap; 12 is not.
        e.forget_before(Psn::new(5));
        assert_eq!((e.len(), e.bytes), (1, 50));
        e.clear();
        assert!(e.is_empty());
        assert_eq!(e.bytes, 0);
    }

    #[test]
    fn buffers_of_replayed_packets_are_reused() {
        let mut e = EarlyPackets::default();
        let packet = [9u8; 4124];
        let mut first = Vec::new();
        for p in 0..64 {
            assert!(e.keep(Psn::new(p), &packet));
        }
        for p in 0..64 {
            let Some(Early::Packet(b)) = e.take(Psn::new(p)) else {
                panic!("PSN {p} kept whole");
            };
            first.push(b.as_ptr());
        }
        // Dropped at the take above: the next episode reuses them.
        for p in 100..164 {
            assert!(e.keep(Psn::new(p), &[p as u8; 4124]));
        }
        for p in 100..164 {
            let Some(Early::Packet(b)) = e.take(Psn::new(p)) else {
                panic!("PSN {p} kept whole");
            };
            assert_eq!(
                *b, [p as u8; 4124],
                "the new packet's bytes, not the old ones"
            );
            assert!(first.contains(&b.as_ptr()), "PSN {p} in a fresh buffer");
        }
        // Forgotten packets give theirs back too.
        for p in 200..210 {
            assert!(e.keep(Psn::new(p), &packet));
        }
        e.forget_before(Psn::new(210));
        let spares = SPARE.with_borrow(Vec::len);
        assert!(spares >= 64, "{spares} spares");
        assert!(spares <= MAX_SPARE);
    }

    #[test]
    fn a_qp_keeps_at_most_a_window() {
        let mut e = EarlyPackets::default();
        for p in 0..MAX_PACKETS as u32 {
            assert!(e.keep(Psn::new(p), &[0; 8]));
        }
        assert!(!e.keep(Psn::new(MAX_PACKETS as u32), &[0; 8]));
    }
}
