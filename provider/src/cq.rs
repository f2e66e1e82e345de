//! Completion queues.

use crate::types::{WcOpcode, WcStatus};
use crate::wr::WorkCompletion;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// A completion queue of fixed depth. When it is full, a new completion is
/// refused: the engine then moves the QPs that feed it to the error state,
/// as rxe does (the completion is lost, as on hardware).
#[derive(Debug)]
pub struct CompletionQueue {
    /// Each completion with the engine time it was made at (`Nanos`).
    entries: VecDeque<(WorkCompletion, u64)>,
    depth: usize,
    overflowed: bool,
    /// Armed by `ibv_req_notify_cq`: 0 = not armed, 1 = any, 2 = solicited only.
    armed: u8,
    /// Completion events raised and not yet consumed by the channel.
    events: u64,
    /// Mirror of `entries.len()` that a poller may read without the lock
    /// the queue lives under, so an empty `poll_cq` costs one atomic load
    /// instead of contending with the thread that delivers completions.
    waiting: Arc<AtomicUsize>,
}

impl CompletionQueue {
    /// A queue holding up to `depth` completions.
    pub fn new(depth: usize) -> Self {
        CompletionQueue {
            entries: VecDeque::with_capacity(depth.min(4096)),
            depth,
            overflowed: false,
            armed: 0,
            events: 0,
            waiting: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Capacity.
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// `ibv_resize_cq`: hold up to `depth` completions from now on; false
    /// (nothing changed) when more than that are waiting.
    pub fn resize(&mut self, depth: usize) -> bool {
        if depth < self.entries.len() {
            return false;
        }
        self.depth = depth;
        true
    }

    /// Completions waiting.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when no completion is waiting.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// True once a completion was refused for lack of room.
    pub fn overflowed(&self) -> bool {
        self.overflowed
    }

    /// Add a completion; `false` (and the overflow flag) when full.
    /// `solicited`: a receive completion for a message whose BTH carried the
    /// Solicited Event bit. A completion with an error status counts as
    /// solicited too (`ibv_req_notify_cq(3)`: "A CQE is solicited if it is a
    /// receive completion for a message with the Solicited Event header bit
    /// set, or if the status is not successful").
    pub fn push(&mut self, wc: WorkCompletion, solicited: bool) -> bool {
        self.push_at(wc, solicited, 0)
    }

    /// [`push`](Self::push) for a completion made at engine time `at`.
    pub fn push_at(&mut self, wc: WorkCompletion, solicited: bool, at: u64) -> bool {
        if self.entries.len() >= self.depth {
            self.overflowed = true;
            return false;
        }
        let solicited = solicited || wc.status != WcStatus::Success;
        self.entries.push_back((wc, at));
        self.waiting.store(self.entries.len(), Ordering::Release);
        if self.armed == 1 || (self.armed == 2 && solicited) {
            self.armed = 0;
            self.events += 1;
        }
        true
    }

    /// Take up to `out.len()` completions; returns how many.
    pub fn poll(&mut self, out: &mut [WorkCompletion]) -> usize {
        self.poll_at(out, &mut [])
    }

    /// [`poll`](Self::poll), also giving the engine time each completion
    /// was made at, in `at` (as far as it reaches).
    pub fn poll_at(&mut self, out: &mut [WorkCompletion], at: &mut [u64]) -> usize {
        let n = out.len().min(self.entries.len());
        for (k, (wc, made)) in self.entries.drain(..n).enumerate() {
            out[k] = wc;
            if let Some(slot) = at.get_mut(k) {
                *slot = made;
            }
        }
        self.waiting.store(self.entries.len(), Ordering::Release);
        n
    }

    /// Remove the completions of QP `qpn` not yet polled (a QP moved to
    /// RESET: libmlx5 cleans its CQs so, and a program restarting a QP
    /// after an error must not poll the old flushes). Returns how many.
    pub fn remove_qp(&mut self, qpn: u32) -> usize {
        self.remove_where(|wc| wc.qp_num == qpn)
    }

    /// Whether a completion of QP `qpn` waits to be polled.
    pub fn holds_qp(&self, qpn: u32) -> bool {
        self.entries.iter().any(|(wc, _)| wc.qp_num == qpn)
    }

    /// Remove the receive completions of QP `qpn` not yet polled (the QP
    /// is destroyed). Its send completions stay, as with rxe: middleware
    /// polls its CQ after destroying a connection's QP to learn which
    /// sends completed (libfabric's verbs provider reports every send it
    /// never saw complete as flushed), while a receive completion names
    /// a buffer it has already released (ofi_rxm would repost it to the
    /// closed endpoint). Returns how many.
    pub fn remove_qp_receives(&mut self, qpn: u32) -> usize {
        self.remove_where(|wc| wc.qp_num == qpn && wc.opcode as u32 >= WcOpcode::Recv as u32)
    }

    /// Remove the waiting completions `gone` picks; how many.
    fn remove_where(&mut self, gone: impl Fn(&WorkCompletion) -> bool) -> usize {
        let before = self.entries.len();
        self.entries.retain(|(wc, _)| !gone(wc));
        self.waiting.store(self.entries.len(), Ordering::Release);
        before - self.entries.len()
    }

    /// Take every waiting completion.
    pub fn drain(&mut self) -> Vec<WorkCompletion> {
        self.waiting.store(0, Ordering::Release);
        self.entries.drain(..).map(|(wc, _)| wc).collect()
    }

    /// A shared counter of the completions waiting, always equal to
    /// [`len`](Self::len) once the queue's lock is released.
    pub fn waiting_counter(&self) -> Arc<AtomicUsize> {
        Arc::clone(&self.waiting)
    }

    /// Arm the queue for one event (`ibv_req_notify_cq`).
    pub fn request_notify(&mut self, solicited_only: bool) {
        self.armed = if solicited_only { 2 } else { 1 };
    }

    /// Take the count of events raised since the last call.
    pub fn take_events(&mut self) -> u64 {
        std::mem::take(&mut self.events)
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn resize_keeps_waiting_completions_and_refuses_below_them() {
        let mut cq = CompletionQueue::new(3);
        for i in 0..2 {
            assert!(cq.push(
                WorkCompletion::new(i, WcStatus::Success, WcOpcode::Send, 1),
                false
            ));
        }
        assert!(!cq.resize(1), "two are waiting");
        assert_eq!(cq.depth(), 3);
        assert!(cq.resize(7));
        assert_eq!((cq.depth(), cq.len()), (7, 2));
        assert!(cq.resize(2));
        assert_eq!(cq.remove_qp(1), 2);
        assert!(cq.is_empty());
    }

    use super::*;

    #[test]
    fn overflow_and_notify() {
        let mut cq = CompletionQueue::new(2);
        let wc = WorkCompletion::new(1, WcStatus::Success, WcOpcode::Send, 5);
        cq.request_notify(false);
        assert!(cq.push(wc, false));
        assert_eq!(cq.take_events(), 1);
        assert!(cq.push(wc, false));
        assert_eq!(cq.take_events(), 0, "one event per arming");
        assert!(!cq.push(wc, false));
        assert!(cq.overflowed());
        let mut out = [wc; 4];
        assert_eq!(cq.poll(&mut out), 2);
        cq.request_notify(true);
        cq.push(wc, false);
        assert_eq!(cq.take_events(), 0);
        cq.push(wc, true);
        assert_eq!(cq.take_events(), 1);
        // An unsuccessful completion is solicited.
        cq.poll(&mut out);
        cq.request_notify(true);
        let bad = WorkCompletion::new(2, WcStatus::WrFlushErr, WcOpcode::Recv, 5);
        cq.push(bad, false);
        assert_eq!(cq.take_events(), 1);
    }
}
