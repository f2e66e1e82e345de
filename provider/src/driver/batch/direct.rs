//! Beside rxe: which loopback peers are shared-mode roxe devices, reached
//! at their claim port (see `TxBatch::direct`).

use std::net::IpAddr;
use std::time::{Duration, Instant};

/// Which loopback peers a shared-mode device reaches at their claim port.
#[derive(Debug)]
pub(crate) struct DirectPeers {
    /// The claim port (`device::SHARED_MODE_PORT`).
    pub port: u16,
    /// Answers by peer, each looked up again after `RECHECK` (a peer may
    /// open or close).
    known: Vec<(IpAddr, bool, Instant)>,
    /// Answers that changed since `take_changes`: the engine widens its
    /// window towards direct peers (`Engine::set_udp_peer`).
    pub(super) changed: Vec<(IpAddr, bool)>,
}

impl DirectPeers {
    pub(crate) fn new(port: u16) -> Self {
        DirectPeers {
            port,
            known: Vec::new(),
            changed: Vec::new(),
        }
    }

    /// Whether `dst` is a loopback address whose claim port a socket holds
    /// (`/proc/net/udp`), cached for a second.
    pub(super) fn is_direct(&mut self, dst: IpAddr) -> bool {
        const RECHECK: Duration = Duration::from_secs(1);
        let IpAddr::V4(v4) = dst else {
            return false;
        };
        if !v4.is_loopback() {
            return false;
        }
        let now = Instant::now();
        let known = self.known.iter().position(|(a, _, _)| *a == dst);
        let before = known.map(|i| self.known[i]);
        if let Some((_, d, at)) = before {
            if now < at + RECHECK {
                return d;
            }
        }
        let key = format!("{:08X}:{:04X}", u32::from_le_bytes(v4.octets()), self.port);
        let d = std::fs::read_to_string("/proc/net/udp").is_ok_and(|t| {
            t.lines()
                .skip(1)
                .any(|l| l.split_whitespace().nth(1) == Some(key.as_str()))
        });
        let was = before.map(|(_, d, _)| d);
        if was != Some(d) && (d || was.is_some()) {
            if self.changed.len() < 256 {
                self.changed.push((dst, d));
            }
            tracing::info!(
                peer = %dst,
                port = self.port,
                direct = d,
                "shared-mode roxe peer on this host: reached at its claim port"
            );
        }
        match known {
            Some(i) => self.known[i] = (dst, d, now),
            None => {
                if self.known.len() >= 256 {
                    self.known.clear();
                }
                self.known.push((dst, d, now));
            }
        }
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn direct_peers_are_loopback_addresses_whose_claim_port_is_held() {
        // A socket on 127.0.247.1, port P, plays a shared-mode peer.
        let held = std::net::UdpSocket::bind("127.0.247.1:0").expect("bind");
        let port = held.local_addr().expect("local address").port();
        let mut d = DirectPeers::new(port);
        assert!(d.is_direct("127.0.247.1".parse().unwrap()));
        assert!(!d.is_direct("127.0.247.2".parse().unwrap()));
        assert!(!d.is_direct("10.0.0.1".parse().unwrap()));
        assert!(!d.is_direct("::1".parse().unwrap()));
        // The answer is cached for a second, then looked up again.
        drop(held);
        assert!(d.is_direct("127.0.247.1".parse().unwrap()));
        std::thread::sleep(Duration::from_millis(1100));
        assert!(!d.is_direct("127.0.247.1".parse().unwrap()));
    }
}
