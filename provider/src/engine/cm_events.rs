//! The CM's events on their way to the user, and the one the engine holds
//! back: a DISCONNECTED raised by the peer's DREQ waits until the user has
//! polled the completions its QP made before (at most [`DISCONNECT_HOLD`]).
//!
//! Why: a peer sends its last message and, at once, its DREQ. On the
//! kernel's stack the DREQ reaches the user much later than the message's
//! completion (a MAD through the kernel's CM and rdma_cm's event file), so
//! middleware that polls its CQ and then its event channel always sees the
//! message first. Here both arrive in one burst; a user that found its CQ
//! empty an instant before would read DISCONNECTED first, close the
//! connection and lose the message (libfabric's ofi_rxm then waits forever
//! for a `fin` it never sees).

use super::{Engine, Nanos};
use crate::cm::{CmEvent, ConnId};

/// The longest a DISCONNECTED waits for its QP's completions to be polled.
pub const DISCONNECT_HOLD: Nanos = 100_000_000;

/// A DISCONNECTED held back, and until when at most.
#[derive(Debug, Clone)]
pub(crate) struct HeldDisconnect {
    event: CmEvent,
    conn: ConnId,
    until: Nanos,
}

impl Engine {
    /// The next CM event for the user, or `None`; DISCONNECTED events of a
    /// DREQ are held while their QP's earlier completions wait unpolled.
    pub fn poll_cm_event(&mut self, now: Nanos) -> Option<CmEvent> {
        if let Some(k) = self
            .held_disconnects
            .iter()
            .position(|h| now >= h.until || !self.disconnect_must_wait(h.conn))
        {
            return Some(self.held_disconnects.remove(k).event);
        }
        let event = self.cm.poll_event()?;
        if let CmEvent::Disconnected { conn } = event {
            if self.disconnect_must_wait(conn) {
                self.held_disconnects.push(HeldDisconnect {
                    event,
                    conn,
                    until: now + DISCONNECT_HOLD,
                });
                return self.poll_cm_event(now);
            }
        }
        Some(event)
    }

    /// True when CM events wait, held ones included.
    pub fn has_cm_events(&mut self) -> bool {
        self.cm.has_events() || !self.held_disconnects.is_empty()
    }

    /// When the earliest held DISCONNECTED must be let through.
    pub(super) fn held_disconnect_deadline(&self) -> Option<Nanos> {
        self.held_disconnects.iter().map(|h| h.until).min()
    }

    /// Whether `conn`'s DISCONNECTED (of the peer's DREQ, the user not
    /// having disconnected since) still has completions of its QP ahead
    /// of it in a CQ.
    fn disconnect_must_wait(&self, conn: ConnId) -> bool {
        let Some((peer, remote_qpn)) = self.cm.dreq_received_from(conn) else {
            return false;
        };
        self.qps
            .values()
            .filter(|q| q.peer == Some(peer) && q.attr.dest_qp_num == remote_qpn)
            .any(|q| {
                [q.init.send_cq, q.init.recv_cq]
                    .iter()
                    .any(|cq| self.cqs.get(&cq.0).is_some_and(|c| c.holds_qp(q.qpn)))
            })
    }
}
