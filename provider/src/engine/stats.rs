//! Counters, and what `roxe stat` shows of QPs and CQs.

use super::{CqId, DropCounts, DropReason, QpCounters};
use crate::qp_attr::{QpState, QpType};
use std::net::IpAddr;

/// Why received packets were dropped, and other counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Packets handed to `handle_packet`.
    pub rx_packets: u64,
    /// WRITE packets kept beyond a gap (between roxe peers) whose payload
    /// was written to memory on arrival, only their headers kept.
    pub rx_placed_early: u64,
    /// Dropped: not a well-formed RoCEv2 packet.
    pub rx_malformed: u64,
    /// Dropped: ICRC mismatch.
    pub rx_bad_icrc: u64,
    /// Dropped: no such QP, wrong type, or QP not able to receive.
    pub rx_no_qp: u64,
    /// Dropped: from an address that is not the connected QP's peer.
    pub rx_wrong_peer: u64,
    /// Dropped by the responder or completer (duplicates, out of sequence, bad Q_Key...).
    pub rx_dropped: u64,
    /// Packets produced by `poll_transmit`.
    pub tx_packets: u64,
    /// Of those, retransmissions.
    pub tx_retransmits: u64,
    /// Retransmission timer expiries.
    pub timeouts: u64,
    /// Tail-loss probes sent (resends after a few round trips of silence,
    /// which spend no retry).
    pub probes: u64,
    /// NAKs sent (all kinds).
    pub naks_sent: u64,
    /// RNR NAKs received.
    pub rnr_naks_received: u64,
    /// Accepted IPv4 packets whose ICRC did not match the Linux-sender
    /// assumption but is right for another identification or DF flag
    /// (`IcrcPolicy::Warn`).
    pub rx_icrc_unverified: u64,
    /// The liveness watchdog ([`Engine::audit_liveness`](super::Engine::audit_liveness)) found a QP with a
    /// message in flight and no timer armed, and armed its retransmission
    /// timer. Always 0 unless the engine has a bug (debug builds panic
    /// instead).
    pub stalls_repaired: u64,
    /// Every dropped received packet, by reason (the `rx_*` counters
    /// above are their older, coarser sums).
    pub drops: DropCounts,
}

impl Stats {
    /// Count a received packet dropped for `reason` (by the QP `qpn`, if
    /// it reached one), and log it at trace level.
    pub(crate) fn count_drop(&mut self, reason: DropReason, qpn: Option<u32>) {
        self.drops.add(reason);
        match reason {
            DropReason::Malformed => self.rx_malformed += 1,
            DropReason::BadIcrc => self.rx_bad_icrc += 1,
            DropReason::NoQp | DropReason::WrongTransport => self.rx_no_qp += 1,
            DropReason::WrongPeer => self.rx_wrong_peer += 1,
            _ => self.rx_dropped += 1,
        }
        match qpn {
            Some(qpn) => tracing::trace!(qpn = format_args!("{qpn:#x}"), %reason, "packet dropped"),
            None => tracing::trace!(%reason, "packet dropped"),
        }
    }
}

/// One QP as `roxe stat` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QpSnapshot {
    pub qpn: u32,
    pub qp_type: QpType,
    pub state: QpState,
    /// The connected peer's address and QP (RC/UC).
    pub peer: Option<(IpAddr, u32)>,
    /// PSN of the next new request.
    pub next_psn: u32,
    /// Oldest unacknowledged PSN.
    pub una: u32,
    /// Next PSN the responder expects.
    pub epsn: u32,
    /// Send WQEs not yet completed.
    pub send_queue: usize,
    /// Receive WQEs posted and not yet consumed.
    pub recv_queue: usize,
    pub retry_left: u8,
    pub rnr_retry_left: u8,
    /// Packets this QP dropped, by reason.
    pub drops: DropCounts,
    /// What it sent and received.
    pub counters: QpCounters,
    /// The measured round trip (ns), once a response timed one.
    pub srtt_ns: Option<u64>,
    /// The window (PSNs) after losses, while it is below the path's.
    pub loss_window: Option<i32>,
}

/// One CQ as `roxe stat` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CqSnapshot {
    pub id: CqId,
    /// Capacity.
    pub depth: usize,
    /// Completions waiting to be polled.
    pub waiting: usize,
    /// A completion did not fit once (its QPs went to ERR).
    pub overflowed: bool,
    /// QPs feeding it (send or receive).
    pub qps: usize,
}
