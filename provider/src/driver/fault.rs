//! Transmit-side fault injection (`ROXE_FAULT`), in the manner of smoltcp's
//! `phy::FaultInjector`: each packet the engine sends may be dropped,
//! duplicated, corrupted (one bit flipped), delayed, or held back so that
//! later packets overtake it. Seeded, so a run can be replayed.

use super::config::FaultSpec;
use crate::engine::Nanos;
use std::net::IpAddr;

/// How long a reordered packet is held at least (later packets overtake it).
const REORDER_HOLD_NS: u64 = 100_000;

/// Counters of what the injector did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultStats {
    /// Packets dropped.
    pub lost: u64,
    /// Extra copies sent.
    pub duplicated: u64,
    /// Packets held back to be overtaken.
    pub reordered: u64,
    /// Packets with a bit flipped.
    pub corrupted: u64,
    /// Packets delayed (every packet, with `delay`).
    pub delayed: u64,
}

/// The injector: its random state and the packets it holds.
#[derive(Debug)]
pub struct Faults {
    spec: FaultSpec,
    state: u64,
    held: Vec<(Nanos, IpAddr, u16, Vec<u8>)>,
    stats: FaultStats,
}

impl Faults {
    /// An injector for `spec` on the device at `own`. The seed is mixed
    /// with the address, so that two devices given one spec (both sides of
    /// a test) draw different faults: with one sequence each side's k-th
    /// packet shared its fate, so a ping-pong lost a request and the
    /// answer to its retry together far more often than the rates say.
    pub fn new(spec: FaultSpec, own: IpAddr) -> Self {
        let bits = match own {
            IpAddr::V4(a) => u128::from(u32::from(a)),
            IpAddr::V6(a) => u128::from(a),
        };
        let mut folded = bits as u64 ^ (bits >> 64) as u64;
        Faults {
            spec,
            state: spec.seed ^ crate::rng::splitmix64(&mut folded),
            held: Vec::new(),
            stats: FaultStats::default(),
        }
    }

    /// Counters.
    pub fn stats(&self) -> FaultStats {
        self.stats
    }

    // SplitMix64: small, seedable, good enough for fault decisions.
    fn next(&mut self) -> u64 {
        crate::rng::splitmix64(&mut self.state)
    }

    fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && ((self.next() >> 11) as f64 / (1u64 << 53) as f64) < p
    }

    /// Whether the spec only drops packets (no duplicates, corruption,
    /// reordering or delay): then a packet needs no bytes of its own to
    /// pass through, and the device sends it as it would without the
    /// injector (payload by reference, ACK-clocked passes), asking only
    /// [`lose`](Self::lose). A loss figure then measures recovery, not the
    /// injector's copies.
    pub fn drops_only(&self) -> bool {
        let s = &self.spec;
        s.dup == 0.0 && s.reorder == 0.0 && s.corrupt == 0.0 && s.delay_ns == 0
    }

    /// Whether to drop the next packet, for a [`drops_only`](Self::drops_only)
    /// spec: the same draw as [`submit`](Self::submit) makes for it, so a
    /// seed drops the same packets either way.
    pub fn lose(&mut self) -> bool {
        let lost = self.chance(self.spec.loss);
        self.stats.lost += u64::from(lost);
        lost
    }

    /// Pass one packet through: `send` is called for every copy to send now
    /// (zero, one or two); copies to send later are kept until
    /// [`release_due`](Self::release_due).
    pub fn submit(
        &mut self,
        now: Nanos,
        pkt: &mut [u8],
        dst: IpAddr,
        sport: u16,
        send: &mut dyn FnMut(&[u8], IpAddr, u16),
    ) {
        if self.chance(self.spec.loss) {
            self.stats.lost += 1;
            return;
        }
        let copies = if self.chance(self.spec.dup) {
            self.stats.duplicated += 1;
            2
        } else {
            1
        };
        if self.chance(self.spec.corrupt) && !pkt.is_empty() {
            let bit = self.next() as usize % (pkt.len() * 8);
            pkt[bit / 8] ^= 1 << (bit % 8);
            self.stats.corrupted += 1;
        }
        for _ in 0..copies {
            let mut hold = self.spec.delay_ns;
            if hold > 0 {
                self.stats.delayed += 1;
            }
            if self.chance(self.spec.reorder) {
                self.stats.reordered += 1;
                hold += REORDER_HOLD_NS + self.next() % REORDER_HOLD_NS;
            }
            if hold == 0 {
                send(pkt, dst, sport);
            } else {
                self.held.push((now + hold, dst, sport, pkt.to_vec()));
            }
        }
    }

    /// Send every held packet whose time has come.
    pub fn release_due(&mut self, now: Nanos, send: &mut dyn FnMut(&[u8], IpAddr, u16)) {
        let mut i = 0;
        while i < self.held.len() {
            if self.held[i].0 <= now {
                let (_, dst, sport, p) = self.held.swap_remove(i);
                send(&p, dst, sport);
            } else {
                i += 1;
            }
        }
    }

    /// When the next held packet is due.
    pub fn next_release(&self) -> Option<Nanos> {
        self.held.iter().map(|h| h.0).min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(spec: FaultSpec, n: usize) -> (usize, FaultStats) {
        let mut f = Faults::new(spec, "127.0.0.1".parse().unwrap());
        let dst: IpAddr = "127.0.0.1".parse().unwrap();
        let mut sent = 0;
        for i in 0..n {
            let mut p = [i as u8; 64];
            f.submit(i as u64, &mut p, dst, 7, &mut |_, _, _| sent += 1);
        }
        f.release_due(u64::MAX, &mut |_, _, _| sent += 1);
        (sent, f.stats())
    }

    #[test]
    fn rates_are_close_to_the_spec_and_replayable() {
        let spec = FaultSpec {
            loss: 0.1,
            dup: 0.05,
            reorder: 0.1,
            corrupt: 0.01,
            delay_ns: 0,
            seed: 42,
        };
        let (sent, s) = run(spec, 100_000);
        assert!((9_000..11_000).contains(&s.lost), "{s:?}");
        assert!((4_000..6_000).contains(&s.duplicated), "{s:?}");
        assert_eq!(sent as u64, 100_000 - s.lost + s.duplicated);
        assert_eq!(run(spec, 100_000), (sent, s), "same seed, same run");
    }

    /// Which of `n` packets the injector at `own` loses.
    fn losses(spec: FaultSpec, own: &str, n: usize) -> Vec<bool> {
        let mut f = Faults::new(spec, own.parse().unwrap());
        let dst: IpAddr = "127.0.0.9".parse().unwrap();
        (0..n)
            .map(|i| {
                let mut sent = false;
                f.submit(i as u64, &mut [0; 64], dst, 7, &mut |_, _, _| sent = true);
                !sent
            })
            .collect()
    }

    #[test]
    fn two_devices_with_one_spec_lose_different_packets() {
        let spec = FaultSpec {
            loss: 0.2,
            seed: 4,
            ..FaultSpec::default()
        };
        let a = losses(spec, "127.0.9.11", 1_000);
        assert_eq!(a, losses(spec, "127.0.9.11", 1_000), "replayable");
        for other in ["127.0.9.12", "::1"] {
            let b = losses(spec, other, 1_000);
            let both = a.iter().zip(&b).filter(|(x, y)| **x && **y).count();
            // Independent at 20%: about 40 of 1,000 lost on both sides.
            assert!((15..80).contains(&both), "{other}: {both} lost on both");
        }
    }

    #[test]
    fn a_loss_only_spec_drops_the_same_packets_without_the_bytes() {
        let spec = FaultSpec {
            loss: 0.1,
            seed: 9,
            ..FaultSpec::default()
        };
        let mut f = Faults::new(spec, "127.0.9.11".parse().unwrap());
        assert!(f.drops_only());
        let by_verdict: Vec<bool> = (0..2_000).map(|_| f.lose()).collect();
        assert_eq!(by_verdict, losses(spec, "127.0.9.11", 2_000));
        assert_eq!(
            f.stats().lost,
            by_verdict.iter().filter(|l| **l).count() as u64
        );
        for other in [
            FaultSpec { dup: 0.1, ..spec },
            FaultSpec {
                reorder: 0.1,
                ..spec
            },
            FaultSpec {
                corrupt: 0.1,
                ..spec
            },
            FaultSpec {
                delay_ns: 1,
                ..spec
            },
        ] {
            assert!(
                !Faults::new(other, "::1".parse().unwrap()).drops_only(),
                "{other:?}"
            );
        }
    }

    #[test]
    fn delay_holds_every_packet_until_due() {
        let mut f = Faults::new(
            FaultSpec {
                delay_ns: 50_000,
                ..FaultSpec::default()
            },
            "::1".parse().unwrap(),
        );
        let dst: IpAddr = "::1".parse().unwrap();
        let mut sent = 0;
        f.submit(1_000, &mut [1, 2, 3], dst, 7, &mut |_, _, _| sent += 1);
        assert_eq!((sent, f.next_release()), (0, Some(51_000)));
        f.release_due(50_999, &mut |_, _, _| sent += 1);
        assert_eq!(sent, 0);
        f.release_due(51_000, &mut |p, _, sport| {
            assert_eq!(sport, 7, "a held packet keeps its source port");
            assert_eq!(p, [1, 2, 3]);
            sent += 1
        });
        assert_eq!((sent, f.next_release()), (1, None));
    }
}
