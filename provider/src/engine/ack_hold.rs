//! An ACK held for the QP's own next request, while the QP plays
//! ping-pong.
//!
//! A program that waits for its peer's message by polling memory
//! (perftest's `ib_write_lat`: post a WRITE, poll the send CQ for its
//! completion, then spin on the byte the peer's WRITE will change) is in
//! no verb when that WRITE arrives, so the progress thread must wake to
//! receive it: a scheduler round trip, and on a small machine the woken
//! thread preempts a spinning one (36-59 µs typical against 13 µs for
//! `ib_send_lat`, 99th percentile 2 ms). The peer's ACK decides where
//! that thread is: the program leaves `poll_cq` as soon as the ACK of its
//! WRITE completes it. So a responder whose QP answers each message it
//! receives with one of its own within [`MAX_TURNAROUND`] (three in a
//! row) holds the ACK of the message until its own next request has left
//! (the ACK goes right after it, in the same batch), or at most
//! [`AckHold::hold_time`]. The peer then receives the request first,
//! inside the `poll_cq` that waits for the ACK, and finds the bytes in
//! memory when it looks.
//!
//! Only the ACK of a message that leaves no completion here (a WRITE) is
//! held: a program that receives SENDs polls its CQ, so it receives in
//! its own thread, and its peer may wait for the ACK of its SEND before
//! the next step (perftest's server completes its last SEND before it
//! listens for the next connection). Nothing else the program sends
//! overtakes a held ACK either: another QP's request or a CM MAD goes
//! after it (`Engine::release_overtaken_acks`), since the program may
//! have sent it because the held message arrived. When the answer
//! completes a receive at the peer (a SEND or WRITE_WITH_IMM), the ACK
//! goes just before it instead: the peer's send completion then still
//! precedes the receive completion of the answer, an order programs rely
//! on (`Qp::next_message_completes_a_receive`); a WRITE leaves no
//! completion at the peer to show the order. A program whose answer
//! waits for that very ACK (one thread driving both ends: send, poll the
//! send CQ, only then answer) answers quickly too, but every hold it
//! meets runs out; each that does, or that is overtaken, doubles the
//! streak needed before the next hold.
//!
//! A delayed ACK is standard (a responder may coalesce and delay its ACKs,
//! well within any requester's timeout), but only a roxe peer on this host
//! gains from it: rxe and NICs receive whatever their program does, so
//! towards them (and towards other hosts, which may be either) nothing is
//! held. Only a plain ACK waits; NAKs, duplicates' re-ACKs, READ
//! responses and atomic ACKs never do, and neither does anything while
//! this QP has more than one message of its own unacknowledged (streams
//! in both directions are not a ping-pong). An ACK held when the QP is
//! destroyed or the process exits still goes (`Engine::destroy_qp`,
//! `driver/exit.rs`).

use super::Nanos;

/// Messages in a row answered within [`MAX_TURNAROUND`] before ACKs are
/// held (doubled per hold that ran out unanswered, see `misses`).
pub(crate) const HOLD_STREAK: u8 = 3;

/// The most doublings of [`HOLD_STREAK`]: after six holds in a row ran
/// out, one in 192 messages is held.
const MAX_MISSES: u8 = 6;

/// The longest time from a message received to this QP's next request
/// that still counts as an answer (a ping-pong turn).
pub(crate) const MAX_TURNAROUND: Nanos = 100_000;

/// The shortest hold: above the scheduling noise of a program's turn. At
/// 20 µs, holds ran out on answers 30-40 µs late (a preempted program),
/// and the peer, released from `poll_cq` by the ACK, left the answer to
/// its progress thread (docs/PERFORMANCE.md, session 26).
const MIN_HOLD: Nanos = 100_000;

/// The longest hold: what a wrong guess (the program does not answer)
/// costs the peer's completion at most.
const MAX_HOLD: Nanos = 200_000;

/// One QP's ping-pong detector and the deadline of the ACK it holds.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AckHold {
    /// When the last message that asked for an ACK arrived, until this
    /// QP's next request.
    received_at: Option<Nanos>,
    /// Messages in a row answered by a request within [`MAX_TURNAROUND`].
    streak: u8,
    /// The smoothed turnaround (gain 1/8).
    turnaround: Nanos,
    /// The deadline of the ACK held now.
    until: Option<Nanos>,
    /// Holds that ran out unanswered, less those answered since. The
    /// answer may wait for the ACK held: one thread driving both ends (send,
    /// poll the send CQ, only then answer from the other QP) answers
    /// quickly, yet every hold it meets runs out. Each doubles the streak
    /// needed before the next hold.
    misses: u8,
    /// A message arrived since the last hold began: one hold per message.
    unheld: bool,
    /// The answer's first packet left during a hold: its other packets go
    /// before the ACK, so the peer, polling for that ACK, finds the whole
    /// answer in memory when the ACK completes its request (a 64 KiB
    /// `ib_write_lat` spins on the answer's last byte).
    answering: bool,
}

impl AckHold {
    /// A message that asked for an ACK was received and executed at `now`;
    /// `completes_receive`: it left a receive completion (a SEND or
    /// WRITE_WITH_IMM). The program polls its CQ for such a message, so
    /// its own thread receives the next packet and nothing is gained by
    /// holding; the peer, meanwhile, may wait for that ACK before its
    /// next step (perftest's server completes its last SEND before it
    /// listens for the next connection). Only the ACK of a message that
    /// leaves no trace but memory (a WRITE) is held.
    pub fn message_received(&mut self, now: Nanos, completes_receive: bool) {
        if self.received_at.is_some() {
            // Two messages without an answer between: not a ping-pong.
            self.streak = 0;
        }
        self.received_at = Some(now);
        self.unheld = !completes_receive;
    }

    /// This QP's requester sent the first packet of a new message at `now`.
    pub fn message_sent(&mut self, now: Nanos) {
        match self.received_at.take() {
            Some(at) if now.saturating_sub(at) <= MAX_TURNAROUND => {
                let t = now.saturating_sub(at);
                self.turnaround = if self.streak == 0 {
                    t
                } else {
                    (7 * self.turnaround + t) / 8
                };
                self.streak = self.streak.saturating_add(1).min(self.streak_needed());
            }
            _ => self.streak = 0,
        }
    }

    /// Whether the QP plays ping-pong (its ACKs may be held).
    pub fn ping_pong(&self) -> bool {
        self.streak >= self.streak_needed()
    }

    fn streak_needed(&self) -> u8 {
        HOLD_STREAK << self.misses
    }

    /// Whether a hold may begin: a ping-pong, and a message received
    /// since the last hold began (an ACK whose hold ran out goes).
    pub fn may_begin(&self) -> bool {
        self.ping_pong() && self.unheld
    }

    /// How long an ACK waits for the QP's next request: a few turnarounds,
    /// within [`MIN_HOLD`, `MAX_HOLD`].
    pub fn hold_time(&self) -> Nanos {
        (4 * self.turnaround).clamp(MIN_HOLD, MAX_HOLD)
    }

    /// The deadline of the ACK held, if one is.
    pub fn until(&self) -> Option<Nanos> {
        self.until
    }

    /// Hold the ACK queued until `until`.
    pub fn hold(&mut self, until: Nanos) {
        self.until = Some(until);
        self.unheld = false;
    }

    /// The ACK held goes now (the pattern broke, or the QP goes away).
    pub fn release(&mut self) {
        self.until = None;
        self.answering = false;
    }

    /// The first packet of the QP's answer left during the hold: the ACK
    /// goes after the rest of it ([`answering`](Self::answering)).
    pub fn answered(&mut self) {
        self.until = None;
        self.answering = true;
        self.misses = self.misses.saturating_sub(1);
    }

    /// Whether the answer's packets still go before the ACK.
    pub fn answering(&self) -> bool {
        self.answering
    }

    /// The answer has left, as much of it as may go now: the ACK goes.
    pub fn answer_sent(&mut self) {
        self.answering = false;
    }

    /// The hold ran out before the answer: the ACK goes, and holding
    /// starts again only after a longer streak.
    pub fn ran_out(&mut self) {
        self.until = None;
        self.missed();
    }

    /// A hold went unanswered (ran out, or was overtaken): holding starts
    /// again only after a longer streak.
    pub fn missed(&mut self) {
        self.streak = 0;
        self.misses = (self.misses + 1).min(MAX_MISSES);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_quick_answers_make_a_ping_pong_and_anything_else_ends_it() {
        let mut h = AckHold::default();
        let mut t = 0;
        for _ in 0..HOLD_STREAK {
            assert!(!h.ping_pong());
            h.message_received(t, false);
            t += 5_000;
            h.message_sent(t);
            t += 30_000;
        }
        assert!(h.ping_pong());
        assert_eq!(h.hold_time(), MIN_HOLD, "4 x 5 us is the floor");
        // Two messages in without an answer: a stream coming in.
        h.message_received(t, false);
        h.message_received(t + 1, false);
        assert!(!h.ping_pong());
        // A slow answer is not a turn.
        let mut slow = AckHold::default();
        for _ in 0..HOLD_STREAK {
            slow.message_received(t, false);
            t += MAX_TURNAROUND + 1;
            slow.message_sent(t);
        }
        assert!(!slow.ping_pong());
        // Sending without having received: a stream going out.
        let mut out = AckHold::default();
        for _ in 0..HOLD_STREAK {
            out.message_received(t, false);
            out.message_sent(t + 1);
        }
        assert!(out.ping_pong());
        out.message_sent(t + 2);
        assert!(!out.ping_pong());
    }

    #[test]
    fn holds_that_run_out_need_longer_streaks_and_answers_shorten_them_again() {
        let mut h = AckHold::default();
        let mut t = 0;
        let turn = |h: &mut AckHold, t: &mut Nanos| {
            h.message_received(*t, false);
            *t += 5_000;
            h.message_sent(*t);
            *t += 30_000;
        };
        for misses in 0..8u32 {
            let needed = u32::from(HOLD_STREAK) << misses.min(u32::from(MAX_MISSES));
            for _ in 0..needed {
                assert!(!h.ping_pong());
                turn(&mut h, &mut t);
            }
            assert!(h.ping_pong(), "after {needed} quick answers");
            h.hold(t + 20_000);
            h.ran_out();
            assert!(!h.ping_pong(), "a hold ran out: the streak starts over");
        }
        // Answered holds bring the needed streak back down.
        for _ in 0..MAX_MISSES {
            while !h.ping_pong() {
                turn(&mut h, &mut t);
            }
            h.hold(t + 20_000);
            h.answered();
        }
        assert_eq!(h.streak_needed(), HOLD_STREAK);
    }

    #[test]
    fn a_message_that_completes_a_receive_is_never_held() {
        let mut h = AckHold::default();
        for i in 0..10 {
            h.message_received(i * 50_000, true);
            h.message_sent(i * 50_000 + 5_000);
        }
        assert!(h.ping_pong(), "a ping-pong of SENDs is still one");
        h.message_received(500_000, true);
        assert!(!h.may_begin());
        h.message_sent(505_000);
        h.message_received(550_000, false);
        assert!(h.may_begin(), "a WRITE's ACK may be held");
    }

    #[test]
    fn the_hold_follows_the_turnaround_within_its_bounds() {
        let mut h = AckHold::default();
        for i in 0..10 {
            h.message_received(i * 200_000, false);
            h.message_sent(i * 200_000 + 25_000);
        }
        assert_eq!(h.hold_time(), 100_000);
        let mut slow = AckHold::default();
        for i in 0..10 {
            slow.message_received(i * 200_000, false);
            slow.message_sent(i * 200_000 + 90_000);
        }
        assert_eq!(slow.hold_time(), MAX_HOLD);
    }
}
