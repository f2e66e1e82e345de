//! Transmit: the engine's passes over the QPs that may send (round
//! robin, responses before requests within a QP), the ACK-clocked pass
//! that holds new messages for the ACK on its way, and the last touches
//! every packet gets on its way out (source port, ICRC, counters).

use super::qp::Qp;
use super::{gid_of, Engine, Nanos};
use crate::memory::PayloadRef;
use roxe_wire::{icrc, ICRC_LEN};
use std::net::{IpAddr, Ipv6Addr};

/// A packet the engine wants sent: `len` bytes at the start of the caller's
/// buffer form the UDP payload (BTH .. ICRC) for `dst` port 4791; or, with
/// a `payload` by reference, the buffer holds the headers before it and
/// the pad and ICRC after it (see [`Transmit::buf_len`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    /// Destination device address.
    pub dst: IpAddr,
    /// UDP source port (per QP, as rxe spreads flows).
    pub src_port: u16,
    /// The packet's length on the wire.
    pub len: usize,
    /// The payload, when it is sent straight from registered memory
    /// (only in a pass that allows it: [`TxPass::payload_by_ref`]).
    pub payload: Option<PayloadAt>,
}

/// A payload sent from registered memory: the packet is the buffer's
/// first `at` bytes, then `data`, then the buffer's bytes from `at` to
/// [`Transmit::buf_len`] (pad and ICRC).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PayloadAt {
    /// Where the payload goes: the length of the headers.
    pub at: usize,
    /// The memory (valid until the engine's memory table next changes).
    pub data: PayloadRef,
}

impl Transmit {
    /// A packet written whole into the buffer.
    pub(crate) fn whole(dst: IpAddr, src_port: u16, len: usize) -> Transmit {
        Transmit {
            dst,
            src_port,
            len,
            payload: None,
        }
    }

    /// How many bytes of the caller's buffer the packet uses.
    pub fn buf_len(&self) -> usize {
        self.len - self.payload.map_or(0, |p| p.data.len())
    }
}

/// Which new messages of reliable QPs an ACK-clocked pass holds back
/// (`Engine::poll_transmit_pass`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HoldNew {
    /// None: send what may be sent.
    Never,
    /// Every one.
    Any,
    /// Those of one packet.
    SinglePacket,
    /// Those under [`PAYLOAD_BY_REF_MIN`] bytes, whose packets cost a
    /// system call each more than their copy.
    Small,
}

/// What the device's QPs have out ([`Engine::unacked`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unacked {
    /// At least [`ACK_CLOCKED_MIN_UNACKED`] PSNs.
    Psns,
    /// Fewer PSNs, but [`ACK_CLOCKED_MIN_MESSAGES`] messages.
    Messages,
    /// Less.
    Few,
}

/// How a transmit pass runs ([`Engine::poll_transmit_pass`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TxPass {
    /// A pass right after a verb: see [`Engine::poll_transmit_ack_clocked`].
    pub ack_clocked: bool,
    /// Payloads of at least [`PAYLOAD_BY_REF_MIN`] bytes that lie in one
    /// region may be sent from it by reference ([`Transmit::payload`]):
    /// the caller sends every packet before it next changes the engine.
    pub payload_by_ref: bool,
}

/// The smallest payload sent by reference: below it the copy costs less
/// than the kernel's extra iovec.
pub const PAYLOAD_BY_REF_MIN: usize = 1024;

/// In an ACK-clocked pass (`Engine::poll_transmit_ack_clocked`, after a
/// verb), a new message of a reliable QP waits while at least this many
/// PSNs of the device's QPs are unacknowledged, or
/// [`ACK_CLOCKED_MIN_MESSAGES`] messages: the ACK on its way triggers the
/// next pass, which sends it with the others posted meanwhile, on every
/// QP (one system call for many `ibv_post_send`s). Below both (a
/// ping-pong, a message and its notification, the first messages) a post
/// sends at once.
const ACK_CLOCKED_MIN_UNACKED: i32 = 16;

/// See [`ACK_CLOCKED_MIN_UNACKED`]; for messages under
/// [`PAYLOAD_BY_REF_MIN`] bytes only. A peer that ACKs each small message
/// as it comes keeps fewer than 16 PSNs out, so without this count a
/// stream of single posts leaves one datagram per post, each ACKed alone,
/// until the peer falls behind. Larger messages cost their copy more than
/// their system call, and holding them leaves the sender idle
/// (docs/PERFORMANCE.md, session 25).
const ACK_CLOCKED_MIN_MESSAGES: usize = 2;

impl Engine {
    /// Produce the next packet to send into `buf` (at least 4096 + 64
    /// bytes), or `None` when no QP has anything to send now.
    pub fn poll_transmit(&mut self, now: Nanos, buf: &mut [u8]) -> Option<Transmit> {
        self.round_robin_transmit(now, buf, HoldNew::Never, false)
    }

    /// [`poll_transmit`](Self::poll_transmit) for a pass right after a verb
    /// (`ibv_post_send`): a reliable QP's new message waits while enough of
    /// the device's PSNs are unacknowledged, since the ACK on its way
    /// starts a pass that sends it (doorbell batching, clocked by ACKs).
    /// Responses, retransmissions and messages already started are not
    /// held.
    pub fn poll_transmit_ack_clocked(&mut self, now: Nanos, buf: &mut [u8]) -> Option<Transmit> {
        let pass = TxPass {
            ack_clocked: true,
            payload_by_ref: false,
        };
        self.poll_transmit_pass(now, buf, pass)
    }

    /// [`poll_transmit`](Self::poll_transmit) for a pass run as `pass` says.
    pub fn poll_transmit_pass(
        &mut self,
        now: Nanos,
        buf: &mut [u8],
        pass: TxPass,
    ) -> Option<Transmit> {
        // Held messages wait for any ACK, not their own QP's (the next
        // pass that holds nothing releases them all). With several QPs in
        // flight only single-packet messages wait: each of those would
        // otherwise be a system call of its own, while holding long ones
        // halved ib_write_bw -q 16 (1.6 -> 0.8-0.9 GB/s).
        let hold_new = if !pass.ack_clocked {
            HoldNew::Never
        } else {
            match self.unacked(ACK_CLOCKED_MIN_UNACKED, ACK_CLOCKED_MIN_MESSAGES) {
                Unacked::Psns if self.deadlines.len() <= 1 => HoldNew::Any,
                Unacked::Psns => HoldNew::SinglePacket,
                Unacked::Messages => HoldNew::Small,
                Unacked::Few => HoldNew::Never,
            }
        };
        self.round_robin_transmit(now, buf, hold_new, pass.payload_by_ref)
    }

    /// Whether the QPs with PSNs in flight have at least `psns`
    /// unacknowledged between them, or else `messages` messages sent and
    /// not acknowledged.
    fn unacked(&self, psns: i32, messages: usize) -> Unacked {
        let (mut p, mut m) = (0, 0);
        for q in self.qps_in_flight() {
            p += q.unacked_psns();
            if p >= psns {
                return Unacked::Psns;
            }
            m += q.unacked_messages(messages.saturating_sub(m));
        }
        if m >= messages {
            Unacked::Messages
        } else {
            Unacked::Few
        }
    }

    /// The QPs with PSNs in flight (an armed timer), earliest deadline
    /// first.
    pub(super) fn qps_in_flight(&self) -> impl Iterator<Item = &Qp> {
        self.deadlines
            .iter()
            .filter_map(|(_, qpn)| self.qps.get(qpn))
    }

    /// The next packet of any QP, round robin; `hold_new`: an ACK-clocked
    /// pass (see `poll_transmit_ack_clocked`); `by_ref`: payloads may be
    /// sent by reference ([`TxPass::payload_by_ref`]).
    fn round_robin_transmit(
        &mut self,
        now: Nanos,
        buf: &mut [u8],
        hold_new: HoldNew,
        by_ref: bool,
    ) -> Option<Transmit> {
        self.clock = self.clock.max(now);
        if hold_new == HoldNew::Never && !self.held.is_empty() {
            // Nothing to wait for (any more): what was held goes now.
            self.scheduled.append(&mut self.held);
        }
        if self.cm.has_transmit() {
            self.release_overtaken_acks(None);
        }
        if let Some(t) = self.overtaken_transmit(buf) {
            return Some(self.seal_packet(t, buf));
        }
        if let Some(t) = self.gsi_transmit(buf) {
            return Some(self.seal_packet(t, buf));
        }
        if let Some(t) = self.parting_transmit(buf) {
            return Some(self.seal_packet(t, buf));
        }
        // Round-robin from the cursor, without collecting the QPNs: this
        // runs once per packet.
        let mut next = self.tx_cursor;
        loop {
            let qpn = *self
                .scheduled
                .range(next..)
                .next()
                .or_else(|| self.scheduled.first())?;
            next = qpn.wrapping_add(1);
            let mut held = false;
            let mut holds_ack = false;
            let t = self
                .drive_qp(qpn, |q, cx| {
                    cx.payload_by_ref = by_ref;
                    let t = q.poll_transmit(cx, now, buf, hold_new);
                    held = cx.held_new;
                    holds_ack = q.ack_hold.until().is_some();
                    t
                })
                .flatten();
            if holds_ack && !self.ack_holders.contains(&qpn) {
                self.ack_holders.push(qpn);
            }
            if let Some(t) = t {
                self.tx_cursor = next;
                return Some(self.seal_packet(t, buf));
            }
            if held {
                self.held.insert(qpn);
            }
            // Nothing until a verb, a packet or a timer schedules it again.
            self.scheduled.remove(&qpn);
        }
    }

    /// What every packet gets on its way out, whichever QP made it: the
    /// source port from the driver's pool, the ICRC (over headers, payload
    /// and pad, in one piece or three), the counter, and a trace line.
    fn seal_packet(&mut self, mut t: Transmit, buf: &mut [u8]) -> Transmit {
        let pool = &self.config.src_ports;
        if !pool.is_empty() {
            t.src_port = pool[usize::from(t.src_port) % pool.len()];
        }
        let buf_len = t.buf_len();
        let Some(body_len) = buf_len.checked_sub(ICRC_LEN) else {
            return t;
        };
        // The packet's bytes before the ICRC, in one piece or three.
        let (head, tail) = buf[..body_len].split_at(t.payload.map_or(body_len, |p| p.at));
        // SAFETY: the payload was taken from the memory table during this
        // call (`poll_transmit` of the QP just above), which has not
        // changed since; the slice is dropped before this returns.
        let payload = t.payload.map_or(&[][..], |p| unsafe { p.data.bytes() });
        let parts = [head, payload, tail];
        let port = roxe_wire::ROCEV2_PORT;
        let c = match (self.config.addr, t.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                self.icrc_prefixes.icrc(s, d, t.src_port, port, &parts)
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                icrc::compute_ipv6_parts(s, d, t.src_port, port, &parts)
            }
            (s, d) => icrc::compute_ipv6_parts(
                Ipv6Addr::from(gid_of(s)),
                Ipv6Addr::from(gid_of(d)),
                t.src_port,
                port,
                &parts,
            ),
        };
        if let Ok(c) = c {
            roxe_wire::packet::set_icrc(&mut buf[..buf_len], c);
        }
        self.stats.tx_packets += 1;
        if tracing::enabled!(tracing::Level::TRACE) {
            // The headers are in the buffer either way.
            let bth = roxe_wire::bth::Bth::new_checked(&buf[..buf_len]);
            if let (Ok(b), Ok(op)) = (bth, roxe_wire::Opcode::try_from(buf[0])) {
                tracing::trace!(
                    dest_qpn = format_args!("{:#x}", b.dest_qp()),
                    opcode = %op,
                    psn = %b.psn(),
                    len = t.len,
                    dst = %t.dst,
                    "packet sent"
                );
            }
        }
        t
    }
}
