//! Receiving: a burst from the UDP socket (with GRO), or from the raw
//! socket (`ROXE_ICRC=raw`, or beside the kernel's rxe), handed to the
//! engine under the device lock, its shape told to the pacer.

use super::batch::RxBatch;
use super::counters::DriverStats;
use super::device::ROCEV2_PORT;
use super::pacing::{Burst, READ_TAIL_BURSTS, RX_BULK_BURST};
use super::raw::{self, RawBatch, RawSkip};
use super::shared::{Core, Shared};
use super::tap::Tap;
use crate::engine::{Engine, Nanos};
use parking_lot::MutexGuard;
use roxe_wire::opcode::{Opcode, Operation, PacketClass};
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::OwnedFd;

/// The IPv4 identification packet `index` of a GRO datagram carried: a
/// Linux GSO sender's segment `index` (when its ICRC says so), else 0.
fn gro_ident(from: std::net::SocketAddr, own: IpAddr, p: &[u8], index: usize) -> u16 {
    let (Ok(k), IpAddr::V4(s), IpAddr::V4(d)) = (u16::try_from(index), from.ip(), own) else {
        return 0;
    };
    let Some(body) = p.len().checked_sub(roxe_wire::ICRC_LEN).map(|n| &p[..n]) else {
        return 0;
    };
    let matches = roxe_wire::icrc::compute_ipv4(s, d, from.port(), ROCEV2_PORT, k, body)
        .is_ok_and(|c| Ok(c) == roxe_wire::icrc::from_wire(p));
    if k > 0 && matches {
        k
    } else {
        0
    }
}

impl Shared {
    /// The device lock, taken into `guard` unless it already holds it.
    fn locked<'a, 'g>(&'a self, guard: &'g mut Option<MutexGuard<'a, Core>>) -> &'g mut Core {
        guard.get_or_insert_with(|| self.core.lock())
    }

    /// The datagrams a receive call gave: `None` for none, or an error
    /// (counted in `rx_errors`).
    fn received<'a>(
        &'a self,
        got: std::io::Result<usize>,
        guard: &mut Option<MutexGuard<'a, Core>>,
    ) -> Option<usize> {
        match got {
            Ok(0) => None,
            Ok(n) => Some(n),
            Err(_) => {
                self.locked(guard).stats.rx_errors += 1;
                None
            }
        }
    }

    /// Receive one burst from the UDP socket and hand it to the engine under
    /// the lock (taken into `guard`). True if the burst was full (more may
    /// be queued).
    pub(super) fn receive_udp<'a>(
        &'a self,
        rx: &mut RxBatch,
        guard: &mut Option<MutexGuard<'a, Core>>,
    ) -> bool {
        self.receive_udp_with(rx, guard, Engine::handle_segment)
    }

    /// [`receive_udp`](Self::receive_udp), each packet handed to `handle`.
    fn receive_udp_with<'a>(
        &'a self,
        rx: &mut RxBatch,
        guard: &mut Option<MutexGuard<'a, Core>>,
        handle: fn(&mut Engine, Nanos, IpAddr, u16, &[u8], usize),
    ) -> bool {
        // Receive without the lock, then handle the burst under it with one
        // clock read.
        let Some(n) = self.received(rx.recv(&self.socket), guard) else {
            return false;
        };
        let Core {
            engine, tap, stats, ..
        } = self.locked(guard);
        self.handle_burst(rx, n, engine, tap, stats, handle);
        n == super::batch::MAX_BATCH
    }

    /// Inside a transmit pass, the device lock held (`after_work`, between
    /// batches), or in the progress thread before it fires a due timer:
    /// receive one burst from the UDP socket, if no other thread is
    /// receiving, and hand it to the engine. A pass that sends a window
    /// takes hundreds of microseconds; without this, an ACK or NAK that
    /// came meanwhile waited for the whole pass (docs/PERFORMANCE.md,
    /// session 17: the wait for a NAK at 1% loss). Not with a raw
    /// receive socket (`receive_raw`'s bursts). True if packets were
    /// handled.
    pub(super) fn receive_in_pass(
        &self,
        engine: &mut Engine,
        tap: &mut Option<Tap>,
        stats: &mut DriverStats,
    ) -> bool {
        if self.raw.is_some() {
            return false;
        }
        let Some(mut rx) = self.rx.try_lock() else {
            return false;
        };
        match rx.recv(&self.socket) {
            Ok(0) => false,
            Ok(n) => {
                stats.rx_in_pass += 1;
                self.handle_burst(&rx, n, engine, tap, stats, Engine::handle_segment);
                true
            }
            Err(_) => {
                stats.rx_errors += 1;
                false
            }
        }
    }

    /// Hand the `n` datagrams `rx` received to the engine, each packet to
    /// `handle`, and tell the pacer the burst's shape.
    fn handle_burst(
        &self,
        rx: &RxBatch,
        n: usize,
        engine: &mut Engine,
        tap: &mut Option<Tap>,
        stats: &mut DriverStats,
        handle: fn(&mut Engine, Nanos, IpAddr, u16, &[u8], usize),
    ) {
        let now = self.now();
        stats.rx_batches += 1;
        let mut messages = 0u32;
        let (mut bytes, mut packets) = (0usize, 0usize);
        let mut last_ends = false;
        let mut read_responses = 0usize;
        for k in 0..n {
            let (from, d, seg) = rx.get(k);
            bytes += d.len();
            let Some(from) = from else {
                stats.rx_errors += 1;
                continue;
            };
            // GRO: equal packets (the last may be shorter) as one.
            for (i, p) in d
                .chunks(if seg == 0 { d.len().max(1) } else { seg })
                .enumerate()
            {
                stats.rx_datagrams += 1;
                if let Some(st) = &self.steering {
                    // From a sending socket: an answer is not RoCEv2 and
                    // must not leave from port 4791.
                    let answer = |a: &[u8]| {
                        let _ = self.send[0].send_to(a, from);
                    };
                    if !st.admit(p, |sid| engine.cm_listens(sid), answer) {
                        continue;
                    }
                }
                packets += 1;
                if let Some(t) = tap.as_mut() {
                    let ident = gro_ident(from, self.addr, p, i);
                    t.write_ident(from.ip(), from.port(), self.addr, ROCEV2_PORT, ident, p);
                }
                let op = opcode(p);
                last_ends = op.is_some_and(ends_message);
                messages += u32::from(last_ends);
                read_responses +=
                    usize::from(op.is_some_and(|o| o.operation() == Operation::ReadResponse));
                handle(engine, now, from.ip(), from.port(), p, i);
            }
        }
        // Asked only where it can matter: a burst of READ responses large
        // enough to be bulk.
        let read_due = (packets > 0 && read_responses == packets && bytes >= RX_BULK_BURST)
            .then(|| engine.read_bytes_due(READ_TAIL_BURSTS * bytes as u64));
        self.pacer.burst(
            now,
            Burst {
                bytes,
                packets,
                messages,
                last_ends,
                read_due,
            },
        );
    }

    /// `ROXE_ICRC=raw`: discard what the UDP socket received, then receive
    /// one burst from the raw socket and hand each packet with its headers
    /// to the engine under the lock. True if the burst was full. Beside
    /// rxe the UDP socket (the claim port) receives what roxe devices on
    /// this host send straight to it: that is handled, a burst per call.
    pub(super) fn receive_raw<'a>(
        &'a self,
        raw_fd: &OwnedFd,
        rb: &mut RawBatch,
        drain: &mut RxBatch,
        guard: &mut Option<MutexGuard<'a, Core>>,
    ) -> bool {
        let IpAddr::V4(own) = self.addr else {
            unreachable!("a raw socket is opened for IPv4 devices only")
        };
        let mut full = false;
        if self.direct_rx {
            full = self.receive_udp_with(drain, guard, Engine::handle_direct_segment);
        }
        // The UDP socket gets a copy of every packet: a few bursts at most
        // per call (the rest next time round).
        let mut discarded = 0u64;
        for _ in 0..if self.direct_rx { 0 } else { 4 } {
            let Ok(n) = drain.recv(&self.socket) else {
                break;
            };
            for k in 0..n {
                let (_, d, seg) = drain.get(k);
                discarded += if seg == 0 {
                    1
                } else {
                    d.len().div_ceil(seg) as u64
                };
            }
            if n < super::batch::MAX_BATCH {
                break;
            }
        }
        if discarded > 0 {
            self.locked(guard).stats.rx_udp_discarded += discarded;
        }
        let Some(n) = self.received(rb.recv(raw_fd), guard) else {
            return full;
        };
        let core = self.locked(guard);
        let now = self.now();
        core.stats.rx_batches += 1;
        for k in 0..n {
            let p = match rb.get(k) {
                Ok(p) => p,
                Err(RawSkip::Truncated) => {
                    core.stats.rx_errors += 1;
                    continue;
                }
                // The device's own transmission, not a packet to it.
                Err(RawSkip::Outgoing) => continue,
            };
            let Some((ip, udp, payload)) = raw::split(p, own, ROCEV2_PORT) else {
                core.stats.rx_raw_dropped += 1;
                continue;
            };
            core.stats.rx_datagrams += 1;
            if let Some(t) = core.tap.as_mut() {
                let src = Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]);
                let sport = u16::from_be_bytes([udp[0], udp[1]]);
                t.write(IpAddr::V4(src), sport, self.addr, ROCEV2_PORT, payload);
            }
            core.engine.handle_ip_packet(now, ip, udp, payload);
        }
        full || n == super::batch::MAX_BATCH
    }
}

/// A packet's opcode (from its BTH on), if it has a valid one.
fn opcode(p: &[u8]) -> Option<Opcode> {
    p.first().and_then(|&b| Opcode::try_from(b).ok())
}

/// Whether a packet of opcode `op` ends a message: the last or only
/// packet of a SEND, WRITE or READ response.
fn ends_message(op: Opcode) -> bool {
    matches!(op.class(), PacketClass::Last | PacketClass::Only)
}
