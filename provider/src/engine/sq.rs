//! The send queue (rxe's `qp->sq`): the posted send WQEs, in order, and
//! how far each has got. It is the one piece of state the requester and
//! the completer share: the requester starts WQEs (assigns their PSNs)
//! and marks unreliable ones done when sent; the completer marks reliable
//! ones done from the responses and retires finished WQEs from the front.
//! The counts the window checks need (`reads_atomics_started`,
//! `outstanding`) are kept here, by the only two methods that change
//! them, [`SendQueue::start`] and [`SendQueue::pop_finished`].

use crate::types::WcStatus;
use crate::wr::SendWr;
use roxe_wire::Psn;
use std::collections::VecDeque;
use std::ops::{Index, IndexMut};

/// A posted send WR and its progress.
#[derive(Debug, Clone)]
pub(crate) struct SendWqe {
    /// The request.
    pub wr: SendWr,
    /// Message length in bytes.
    pub len: u32,
    /// First PSN, once assigned.
    pub first_psn: Psn,
    /// PSNs the message consumes.
    pub npsn: u32,
    /// PSNs assigned (first packet sent at least once). Set by
    /// [`SendQueue::start`] only, which counts it.
    pub started: bool,
    /// READ: response packets already placed (the resume point of a retry).
    pub read_pkts: u32,
    /// Final status, once known; WQEs retire_finished in order.
    pub done: Option<WcStatus>,
    /// A request the QP made itself (not posted by the program).
    pub internal: Option<Internal>,
}

/// A request a QP makes on its own: tag matching's rendezvous (`tm.rs`).
/// It does not count against `max_send_wr` and has no send completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Internal {
    /// The READ of a matched rendezvous's data into its tagged buffer (the
    /// WR's `wr_id` is the buffer's): when it finishes, the buffer completes
    /// in `cq` (TM_RECV with DATA_VALID, or the error) and, on success, a
    /// FIN carrying `tag` and `app_ctx` goes to the sender.
    RndvRead {
        cq: super::CqId,
        tag: u64,
        app_ctx: u32,
    },
    /// That FIN.
    RndvFin,
}

impl SendWqe {
    pub(super) fn last_psn(&self) -> Psn {
        self.first_psn + (self.npsn - 1)
    }

    /// Whether PSN `p` is one of this (started) message's.
    pub(super) fn holds_psn(&self, p: Psn) -> bool {
        self.started && !p.is_before(self.first_psn) && !p.is_after(self.last_psn())
    }
}

/// The send WQEs not yet retired, oldest first.
#[derive(Debug, Default)]
pub(crate) struct SendQueue {
    wqes: VecDeque<SendWqe>,
    /// WQEs that are `internal`.
    internal: usize,
    /// Started READs and atomics not yet retired: what `max_rd_atomic`
    /// bounds (rxe's `req.rd_atomic`, counted up rather than down).
    reads_atomics: u32,
}

impl SendQueue {
    pub fn new() -> Self {
        SendQueue::default()
    }

    /// Queue a WR the program posted (`len`: its message length).
    pub fn post(&mut self, wr: SendWr, len: u32) {
        self.push(wr, len, None);
    }

    /// Queue a request of the QP's own, behind the program's.
    pub fn post_internal(&mut self, wr: SendWr, len: u32, kind: Internal) {
        self.internal += 1;
        self.push(wr, len, Some(kind));
    }

    fn push(&mut self, wr: SendWr, len: u32, internal: Option<Internal>) {
        self.wqes.push_back(SendWqe {
            wr,
            len,
            first_psn: Psn::new(0),
            npsn: 1,
            started: false,
            read_pkts: 0,
            done: None,
            internal,
        });
    }

    /// WQEs queued, internal ones included.
    #[inline]
    pub fn len(&self) -> usize {
        self.wqes.len()
    }

    /// The program's WRs queued (what `max_send_wr` bounds).
    #[inline]
    pub fn outstanding(&self) -> usize {
        self.wqes.len() - self.internal
    }

    /// Started READs and atomics not yet retired.
    #[inline]
    pub fn reads_atomics_started(&self) -> u32 {
        self.reads_atomics
    }

    /// The messages started and not finished, counted up to `limit`
    /// (finished ones retire from the front, so this looks at the first
    /// few).
    pub fn started_unfinished(&self, limit: usize) -> usize {
        let mut n = 0;
        for w in self.wqes.iter().take_while(|w| w.started) {
            if n >= limit {
                break;
            }
            n += usize::from(w.done.is_none());
        }
        n
    }

    /// Bytes the READs not yet finished are still to receive (`pmtu`: the
    /// size of a full response packet), counted until the sum exceeds
    /// `limit`.
    pub fn read_bytes_due(&self, pmtu: usize, limit: u64) -> u64 {
        let mut due = 0u64;
        for w in &self.wqes {
            if w.wr.opcode != crate::wr::SendOpcode::RdmaRead || w.done.is_some() {
                continue;
            }
            let placed = u64::from(w.read_pkts).saturating_mul(pmtu as u64);
            due += u64::from(w.len).saturating_sub(placed);
            if due > limit {
                break;
            }
        }
        due
    }

    /// A message has started (PSNs assigned) and is not finished.
    pub fn in_flight(&self) -> bool {
        self.wqes.iter().any(|w| w.started && w.done.is_none())
    }

    #[inline]
    pub fn get(&self, i: usize) -> Option<&SendWqe> {
        self.wqes.get(i)
    }

    #[inline]
    pub fn iter(&self) -> impl Iterator<Item = &SendWqe> {
        self.wqes.iter()
    }

    #[inline]
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut SendWqe> {
        self.wqes.iter_mut()
    }

    /// The index of the started WQE that PSN `p` belongs to.
    #[inline]
    pub fn holding(&self, p: Psn) -> Option<usize> {
        self.wqes.iter().position(|w| w.holds_psn(p))
    }

    /// WQE `i` starts: its `npsn` PSNs from `first` are assigned to it.
    #[inline]
    pub fn start(&mut self, i: usize, first: Psn, npsn: u32) {
        let w = &mut self.wqes[i];
        w.first_psn = first;
        w.npsn = npsn;
        w.started = true;
        if w.wr.opcode.is_read_or_atomic() {
            self.reads_atomics += 1;
        }
    }

    /// Remove the oldest WQE if it is finished: it is retired.
    #[inline]
    pub fn pop_finished(&mut self) -> Option<SendWqe> {
        // Only a finished WQE leaves, and only from the front.
        self.wqes.front()?.done?;
        let w = self.wqes.pop_front()?;
        if w.wr.opcode.is_read_or_atomic() && w.started {
            self.reads_atomics = self.reads_atomics.saturating_sub(1);
        }
        if w.internal.is_some() {
            self.internal = self.internal.saturating_sub(1);
        }
        Some(w)
    }

    /// Every WQE not yet retired, taken out (for flushing).
    pub fn flush(&mut self) -> Vec<SendWqe> {
        self.internal = 0;
        self.reads_atomics = 0;
        self.wqes.drain(..).collect()
    }
}

impl Index<usize> for SendQueue {
    type Output = SendWqe;
    #[inline]
    fn index(&self, i: usize) -> &SendWqe {
        &self.wqes[i]
    }
}

impl IndexMut<usize> for SendQueue {
    #[inline]
    fn index_mut(&mut self, i: usize) -> &mut SendWqe {
        &mut self.wqes[i]
    }
}

/// A send queue of messages of `npsn` PSNs each (the opcodes given), all
/// started, from PSN `first`; and the PSN after them.
#[cfg(test)]
pub(super) fn started_from(first: Psn, msgs: &[(crate::wr::SendOpcode, u32)]) -> (SendQueue, Psn) {
    let mut sq = SendQueue::new();
    let mut next = first;
    for (i, &(op, npsn)) in msgs.iter().enumerate() {
        sq.post(SendWr::new(i as u64, op, Vec::new()), npsn * 1024);
        sq.start(i, next, npsn);
        next += npsn;
    }
    (sq, next)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wr::SendOpcode::{RdmaRead, RdmaWrite};

    #[test]
    fn read_bytes_due_counts_what_unfinished_reads_still_owe() {
        // Messages of 1,024 bytes a PSN: a READ of 4 KiB, a WRITE, a READ
        // of 8 KiB.
        let (mut sq, _) = started_from(
            Psn::new(10),
            &[(RdmaRead, 4), (RdmaWrite, 2), (RdmaRead, 8)],
        );
        assert_eq!(sq.read_bytes_due(1024, u64::MAX), 12 * 1024);
        // Three response packets of the first placed.
        sq[0].read_pkts = 3;
        assert_eq!(sq.read_bytes_due(1024, u64::MAX), 9 * 1024);
        // The first done: only the second owes.
        sq[0].read_pkts = 4;
        sq[0].done = Some(WcStatus::Success);
        assert_eq!(sq.read_bytes_due(1024, u64::MAX), 8 * 1024);
        // Counting stops once past the limit.
        sq[0].done = None;
        sq[0].read_pkts = 0;
        assert_eq!(sq.read_bytes_due(1024, 1000), 4 * 1024);
    }
}
