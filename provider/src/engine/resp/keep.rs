//! Keeping request packets that arrive beyond a gap (between roxe peers:
//! `Qp::keeps_early`), placing their payload on arrival where its place is
//! known, and replaying them once the gap is filled (`early.rs` holds
//! what is kept, and why placing early is safe).

use super::early::Early;
use super::{check, InMsg};
use crate::engine::qp::{Qp, QpCtx};
use roxe_wire::{Opcode, Operation, Packet, Psn};

impl Qp {
    /// Keep request `pkt`, `ahead` PSNs beyond the one expected: its
    /// payload placed now if it continues the message in progress, else
    /// the whole packet. False when it could not be kept (the bounds).
    pub(super) fn keep_early(&mut self, cx: &mut QpCtx, pkt: &Packet<&[u8]>, ahead: i32) -> bool {
        let p = pkt.bth().psn();
        if !self.resp.early.has_room_for(p) {
            return false;
        }
        let Some(offset) = self.place_early(cx, pkt, ahead) else {
            let kept = self.resp.early.keep(p, pkt.as_bytes());
            if let (true, Opcode::RcWriteFirst, Some(reth)) = (kept, pkt.opcode(), pkt.reth()) {
                self.resp.early.kept_write_first(p, reth);
            }
            return kept;
        };
        let bytes = pkt.as_bytes();
        let payload_len = pkt.payload().len();
        let (head, rest) = bytes.split_at(pkt.header_len());
        // Pad and ICRC: the payload is `header_len..header_len + payload_len`.
        let tail = &rest[payload_len..];
        cx.stats.rx_placed_early += 1;
        self.resp
            .early
            .keep_placed(p, head, tail, payload_len, offset)
    }

    /// Place the payload of `pkt`, a WRITE MIDDLE or LAST packet `ahead`
    /// PSNs beyond the one expected, where its WRITE puts it: the WRITE in
    /// progress (`ahead` path MTUs after the bytes written so far), or the
    /// one the latest kept FIRST starts (a path MTU per PSN after that
    /// FIRST), every packet between being a MIDDLE of that WRITE. Returns
    /// the offset in the WRITE it went to; `None` (nothing written) when
    /// it continues neither (it would end anywhere but inside the WRITE,
    /// for a MIDDLE, or at its end, for a LAST: a packet of another
    /// message), its length is not one the in-order checks accept, or the
    /// memory refuses it (`remote_write`'s checks: key, PD, right, range).
    ///
    /// Not a SEND's: its length is unknown until its LAST, so a later
    /// message's packet (after a lost LAST and FIRST) could land past the
    /// end of this one, in bytes of its receive buffer that no message
    /// wrote.
    fn place_early(&mut self, cx: &mut QpCtx, pkt: &Packet<&[u8]>, ahead: i32) -> Option<u64> {
        let op = pkt.opcode();
        let pmtu = self.pmtu() as u64;
        if op.operation() != Operation::Write
            || op.starts_message()
            || check::length(pkt, self.pmtu()).is_err()
        {
            return None;
        }
        let payload = pkt.payload();
        let n = payload.len() as u64;
        if n == 0 {
            return None;
        }
        // Each WRITE this packet may continue: the one in progress, then
        // the latest one whose FIRST was kept. Where it would go in each.
        let in_progress = match &self.resp.msg {
            Some(InMsg::Write {
                va,
                rkey,
                written,
                total,
            }) => {
                let skipped = u64::try_from(ahead).ok()?.checked_mul(pmtu)?;
                Some((*va, *rkey, written.checked_add(skipped)?, *total))
            }
            _ => None,
        };
        let p = pkt.bth().psn();
        let after_kept_first = self.resp.early.write_first_before(p).and_then(|(f, reth)| {
            let skipped = u64::try_from(f.distance(p)).ok()?.checked_mul(pmtu)?;
            Some((reth.va, reth.rkey, skipped, u64::from(reth.dma_len)))
        });
        let continues = |&(_, _, offset, total): &(u64, u32, u64, u64)| {
            offset.checked_add(n).is_some_and(|end| {
                if op.ends_message() {
                    end == total
                } else {
                    end < total
                }
            })
        };
        let (va, rkey, offset, _) = in_progress
            .filter(continues)
            .or(after_kept_first.filter(continues))?;
        let by = self.remote_qp();
        cx.memory
            .remote_write(rkey, by, va.wrapping_add(offset), payload)
            .ok()?;
        Some(offset)
    }

    /// Where in the WRITE in progress the next payload goes.
    fn write_offset(&self) -> Option<u64> {
        match &self.resp.msg {
            Some(InMsg::Write { written, .. }) => Some(*written),
            _ => None,
        }
    }

    /// The packet with PSN `filled` went through the in-order path with
    /// packets kept beyond it: they follow, in PSN order, as far as they
    /// reach; what they placed is acknowledged, and a further gap NAKed.
    pub(super) fn replay_early(&mut self, cx: &mut QpCtx, filled: Psn) {
        let mut last = filled;
        let mut dropped = false;
        loop {
            if self.resp.epsn == last {
                // Not consumed (an RNR NAK): the requester resends from here.
                self.resp.early.clear();
                return;
            }
            let e = self.resp.epsn;
            let Some(kept) = self.resp.early.take(e) else {
                break;
            };
            let Some(executed) = self.replay_one(cx, kept) else {
                // Placed for another offset than the message is at (never
                // expected): treated as missing, so NAKed and resent.
                dropped = true;
                break;
            };
            if !executed {
                self.resp.early.clear();
                return;
            }
            last = e;
        }
        let epsn = self.resp.epsn;
        self.resp.early.forget_before(epsn);
        if dropped || !self.resp.early.is_empty() {
            if last != filled {
                self.resp.ack(epsn - 1);
            }
            self.sequence_nak(cx, epsn, true);
        } else if last != filled {
            // Everything the requester sent is here: this ACK is all it
            // waits for, and a lost one would cost it a probe.
            self.resp.ack_twice(epsn - 1);
        }
    }

    /// Execute one kept packet in order: `Some(false)` when it failed the
    /// QP, `None` when it cannot be replayed here.
    fn replay_one(&mut self, cx: &mut QpCtx, kept: Early) -> Option<bool> {
        match kept {
            Early::Packet(bytes) => {
                // Well formed and its ICRC checked when it arrived.
                let pkt = Packet::new_checked(&bytes[..]).ok()?;
                Some(self.rc_in_order(cx, &pkt))
            }
            Early::Placed {
                head,
                tail,
                payload_len,
                offset,
            } => {
                if self.write_offset() != Some(offset) {
                    return None;
                }
                // The packet again, its payload's bytes stale (never read).
                let mut shadow = std::mem::take(&mut self.resp.shadow);
                let n = head.len() + payload_len + tail.len();
                shadow.resize(shadow.len().max(n), 0);
                shadow[..head.len()].copy_from_slice(&head);
                shadow[n - tail.len()..n].copy_from_slice(&tail);
                let executed = Packet::new_checked(&shadow[..n]).ok().map(|pkt| {
                    self.resp.payload_in_place = true;
                    let executed = self.rc_in_order(cx, &pkt);
                    self.resp.payload_in_place = false;
                    executed
                });
                self.resp.shadow = shadow;
                executed
            }
        }
    }
}
