//! What a device counts: the driver's counters beside the engine's.

use super::fault::FaultStats;
use crate::engine::Stats;

/// Driver-level counters (the engine's own are in [`Stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DriverStats {
    /// Datagrams handed to the kernel (as on the wire: each segment of a
    /// GSO send counts).
    pub tx_datagrams: u64,
    /// Datagrams the kernel refused (after waiting for buffer space).
    pub tx_errors: u64,
    /// Datagrams received (as on the wire: each segment of a GRO run
    /// counts; `rx_batches` counts the `recvmmsg` calls).
    pub rx_datagrams: u64,
    /// Receive errors other than "nothing to read" (and truncated datagrams).
    pub rx_errors: u64,
    /// `sendmmsg` calls (each up to 64 datagrams).
    pub tx_batches: u64,
    /// UDP GSO sends among them (each several datagrams).
    pub tx_gso_sends: u64,
    /// 1 if the kernel refused UDP GSO and the device fell back to one
    /// datagram per message.
    pub tx_gso_refused: u64,
    /// `recvmmsg` calls that returned datagrams.
    pub rx_batches: u64,
    /// Those made in a caller's thread by a `poll_cq` that found nothing
    /// ([`Device::progress_here`](super::Device::progress_here)), not by the progress thread.
    pub rx_caller_batches: u64,
    /// Passes in which such a caller fired the engine's due timers (a
    /// caller holding the socket fires them: `Pacer::progress_deadline`).
    pub caller_timers: u64,
    /// Holds whose timer ended them with datagrams waiting in the socket:
    /// the caller had stopped polling while its peer sent.
    pub holds_stranded: u64,
    /// Those made between the batches of a long transmit pass
    /// (`Shared::receive_in_pass`).
    pub rx_in_pass: u64,
    /// `ROXE_ICRC=raw`: packets from the raw socket dropped before the
    /// engine because they are not a whole IPv4 UDP datagram to the device
    /// (a fragment, a bad IPv4 header checksum, inconsistent lengths). The
    /// engine counts the rest (`rx_bad_icrc`, `rx_malformed`, ...).
    pub rx_raw_dropped: u64,
    /// `ROXE_ICRC=raw`: datagrams the UDP socket received and the device
    /// discarded (copies of what the raw socket received).
    pub rx_udp_discarded: u64,
    /// Timers the progress thread fired more than 250 ms after their
    /// deadline: a missed wake-up (or a machine stalled that long).
    pub timers_late: u64,
    /// Times the progress thread woke from its sleep in `poll(2)` (socket,
    /// timer, eventfd or `roxe stat`): each is a cross-thread wake-up.
    pub progress_wakeups: u64,
    /// Holds callers took on the socket (`pacing.rs`): times a caller
    /// spinning on an empty CQ during a stream kept the socket from the
    /// progress thread.
    pub caller_holds: u64,
    /// Yields callers spinning on an empty CQ took: for the progress
    /// thread's work (a due timer, a receive the caller could not do) or
    /// after a quiet spell (`Pacer::caller_yields`).
    pub caller_yields: u64,
    /// Sleeps the progress thread took without the socket after a bulk
    /// receive burst (`PacingConfig::rx_coalesce`).
    pub rx_coalesced: u64,
    /// Sleeps callers polling a CQ took before receiving, in a run of
    /// bulk bursts (the same interval).
    pub rx_caller_coalesced: u64,
    /// Passes of the progress thread that left the messages held for an
    /// ACK to a caller polling the CQ (`PacingConfig::handover_window`).
    pub tx_left_to_caller: u64,
}

/// Everything a device counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceStats {
    /// The transport's counters (drops by reason, retransmits, NAKs).
    pub engine: Stats,
    /// The socket's.
    pub driver: DriverStats,
    /// The fault injector's, when one is configured.
    pub faults: FaultStats,
}
