//! What the engine is doing, in one snapshot: what the driver's pacing
//! decides from (`driver/pacing.rs`).

use super::{Engine, STREAM_SAMPLE};

/// The messages posted and not completed and the PSNs unacknowledged on
/// the first QPs in flight (at most 64, earliest deadline first: it is
/// computed on the data path), and whether new messages wait for an ACK.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Load {
    /// Messages posted and not completed.
    pub queued: usize,
    /// Their PSNs not yet acknowledged.
    pub unacked: usize,
    /// New messages wait for the ACK on its way (an ACK-clocked pass held
    /// them).
    pub held: bool,
}

impl Load {
    /// A stream of small messages goes out: `n` messages or more queued,
    /// two unacknowledged packets each or fewer (one large message, a
    /// ping-pong's, is no stream however many packets it makes; a stream
    /// of large ones is paced by its ACKs, which the progress thread had
    /// better receive alongside the caller).
    pub fn sends_stream(&self, n: usize) -> bool {
        self.queued >= n && self.unacked <= 2 * self.queued
    }
}

impl Engine {
    /// The engine's [`Load`] now.
    pub fn load(&self) -> Load {
        let (queued, unacked) =
            self.qps_in_flight()
                .take(STREAM_SAMPLE)
                .fold((0usize, 0usize), |(m, p), q| {
                    (
                        m + q.queued_messages(),
                        p + q.unacked_psns().max(0) as usize,
                    )
                });
        Load {
            queued,
            unacked,
            held: self.has_held(),
        }
    }

    /// Bytes of READ responses this device's QPs are still owed, counted
    /// until the sum exceeds `limit` (the pacer asks whether a burst of
    /// READ responses was nearly the last: `Burst::read_due`). Only QPs
    /// with PSNs in flight are asked: a QP with none has no READ whose
    /// responses are on their way.
    pub fn read_bytes_due(&self, limit: u64) -> u64 {
        let mut due = 0u64;
        for q in self.qps_in_flight() {
            due += q.read_bytes_due(limit.saturating_sub(due));
            if due > limit {
                break;
            }
        }
        due
    }
}
