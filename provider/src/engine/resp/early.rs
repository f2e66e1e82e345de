//! Packets of a reliable connection that arrived beyond a gap, kept until
//! the gap is filled (between roxe peers only: see `Qp::keeps_early`).
//!
//! A standard responder drops everything after a missing PSN, so the
//! requester's go-back-N resends it all. A roxe requester facing a roxe
//! responder on this host instead resends only the missing packet
//! (`Requester::resend_one`); this responder replays what it kept through
//! the ordinary in-order path, every check included, as if the packets had
//! just arrived in order.

use roxe_wire::Psn;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Most packets one QP keeps (a full loopback window).
pub(super) const MAX_PACKETS: usize = 1024;
/// Most bytes all QPs of this process keep together.
const MAX_PROCESS_BYTES: usize = 64 << 20;
/// Bytes kept by every QP of this process.
static PROCESS_BYTES: AtomicUsize = AtomicUsize::new(0);

/// The early packets of one QP, by PSN.
#[derive(Debug, Default)]
pub(crate) struct EarlyPackets {
    by_psn: HashMap<u32, Vec<u8>>,
    bytes: usize,
}

impl EarlyPackets {
    /// Keep a copy of packet `bytes` (PSN `psn`); false (nothing kept)
    /// when one is kept for that PSN already or the bounds are reached.
    pub fn keep(&mut self, psn: Psn, bytes: &[u8]) -> bool {
        if self.by_psn.len() >= MAX_PACKETS || self.by_psn.contains_key(&psn.value()) {
            return false;
        }
        let n = bytes.len();
        let reserved = PROCESS_BYTES
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                (used + n <= MAX_PROCESS_BYTES).then_some(used + n)
            })
            .is_ok();
        if !reserved {
            return false;
        }
        self.bytes += n;
        self.by_psn.insert(psn.value(), bytes.to_vec());
        true
    }

    /// Take the packet kept for `psn`.
    pub fn take(&mut self, psn: Psn) -> Option<Vec<u8>> {
        let b = self.by_psn.remove(&psn.value())?;
        self.release(b.len());
        Some(b)
    }

    /// Forget the packets before `epsn` (executed already, or duplicates).
    pub fn forget_before(&mut self, epsn: Psn) {
        let mut freed = 0;
        self.by_psn.retain(|&p, b| {
            let keep = !Psn::new(p).is_before(epsn);
            if !keep {
                freed += b.len();
            }
            keep
        });
        self.release(freed);
    }

    /// Forget every packet.
    pub fn clear(&mut self) {
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
        assert_eq!(e.bytes, 160);
        assert_eq!(e.take(Psn::new(10)).unwrap(), vec![1; 100]);
        assert_eq!(e.take(Psn::new(10)), None);
        // 0xFFFFFF is before 5 across the wrap; 12 is not.
        e.forget_before(Psn::new(5));
        assert_eq!((e.len(), e.bytes), (1, 50));
        e.clear();
        assert!(e.is_empty());
        assert_eq!(e.bytes, 0);
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
