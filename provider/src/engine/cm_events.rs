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

/// A DISCONNECTED held back: its connection, its QP, and until when at
/// most.
#[derive(Debug, Clone)]
pub(crate) struct HeldDisconnect {
    event: CmEvent,
    conn: ConnId,
    qpn: u32,
    until: Nanos,
}

impl Engine {
    /// The next CM event for the user, or `None`; DISCONNECTED events of a
    /// DREQ are held while their QP's earlier completions wait unpolled.
    pub fn poll_cm_event(&mut self, now: Nanos) -> Option<CmEvent> {
        if let Some(k) = self
            .held_disconnects
            .iter()
            .position(|h| now >= h.until || !self.disconnect_must_wait(h.conn, h.qpn))
        {
            return Some(self.held_disconnects.remove(k).event);
        }
        loop {
            let event = self.cm.poll_event()?;
            let CmEvent::Disconnected { conn } = event else {
                return Some(event);
            };
            match self.disconnect_qp(conn) {
                Some(qpn) if self.disconnect_must_wait(conn, qpn) => {
                    self.held_disconnects.push(HeldDisconnect {
                        event,
                        conn,
                        qpn,
                        until: now + DISCONNECT_HOLD,
                    })
                }
                _ => return Some(event),
            }
        }
    }

    /// True when CM events wait, held ones included.
    pub fn has_cm_events(&self) -> bool {
        self.cm.has_events() || !self.held_disconnects.is_empty()
    }

    /// When the earliest held DISCONNECTED must be let through.
    pub(super) fn held_disconnect_deadline(&self) -> Option<Nanos> {
        self.held_disconnects.iter().map(|h| h.until).min()
    }

    /// The QP of `conn`, when the peer's DREQ closed it (and the user has
    /// not disconnected since): the one connected to the peer's QP.
    fn disconnect_qp(&self, conn: ConnId) -> Option<u32> {
        let (peer, remote_qpn) = self.cm.dreq_received_from(conn)?;
        self.qps
            .values()
            .find(|q| q.peer == Some(peer) && q.attr.dest_qp_num == remote_qpn)
            .map(|q| q.qpn)
    }

    /// Whether `conn`'s DISCONNECTED still has completions of its QP
    /// `qpn` ahead of it in a CQ (and the user has not disconnected).
    fn disconnect_must_wait(&self, conn: ConnId, qpn: u32) -> bool {
        let Some(q) = self.qps.get(&qpn) else {
            return false;
        };
        self.cm.dreq_received_from(conn).is_some()
            && [q.init.send_cq, q.init.recv_cq]
                .iter()
                .any(|cq| self.cqs.get(&cq.0).is_some_and(|c| c.holds_qp(qpn)))
    }
}
