//! The responses a responder sends: coalesced ACKs and NAKs, atomic ACKs,
//! and READ responses read from memory packet by packet (a region that
//! goes away mid-READ gets a remote-access NAK and fails the QP).

use super::Reply;
use crate::engine::qp::{Qp, QpCtx};
use crate::engine::{PayloadAt, Transmit, PAYLOAD_BY_REF_MIN};
use crate::qp_attr::{QpState, QpType};
use roxe_wire::aeth::{AethSyndrome, NakCode};
use roxe_wire::packet::emit_headers;
use roxe_wire::{AethRepr, AtomicAckEthRepr, BthRepr, ExtHeaders, HeaderSet, Opcode, Transport};

impl Qp {
    /// The next response packet, if one is queued.
    pub(in crate::engine) fn reply_transmit(
        &mut self,
        cx: &mut QpCtx,
        buf: &mut [u8],
    ) -> Option<Transmit> {
        let transport = match self.init.qp_type {
            QpType::Rc => Transport::Rc,
            QpType::XrcRecv => Transport::Xrc,
            _ => return None,
        };
        if self.resp.replies.is_empty() {
            return None;
        }
        // The RC opcode chosen below, on this QP's transport (`on_transport`
        // finds every RC response's XRC twin).
        let on = |rc: Opcode| rc.on_transport(transport).unwrap_or(rc);
        let qpn = self.qpn;
        let Some(dst) = self.peer else {
            cx.internal_error(qpn, "a response with no peer to send it to");
            self.resp.replies.clear();
            return None;
        };
        let dest_qp = self.attr.dest_qp_num;
        let pmtu = self.pmtu();
        let src_port = self.src_port();
        let in_error = self.state() == QpState::Err;
        let r = &mut self.resp;
        loop {
            let reply = *r.replies.front()?;
            if in_error && !matches!(reply, Reply::Ack { .. }) {
                r.replies.pop_front();
                continue;
            }
            let (bth, ext, payload_len, va_rkey) = match reply {
                Reply::Ack { psn, syndrome, msn } => {
                    r.replies.pop_front();
                    let ext = ExtHeaders {
                        aeth: Some(AethRepr { syndrome, msn }),
                        ..ExtHeaders::NONE
                    };
                    let bth = BthRepr::new(on(Opcode::RcAcknowledge), dest_qp, psn);
                    (bth, ext, 0, None)
                }
                Reply::AtomicAck { psn, orig, msn } => {
                    r.replies.pop_front();
                    let ext = ExtHeaders {
                        aeth: Some(AethRepr {
                            syndrome: AethSyndrome::ACK,
                            msn,
                        }),
                        atomic_ack_eth: Some(AtomicAckEthRepr { orig }),
                        ..ExtHeaders::NONE
                    };
                    let bth = BthRepr::new(on(Opcode::RcAtomicAcknowledge), dest_qp, psn);
                    (bth, ext, 0, None)
                }
                Reply::Read {
                    first,
                    next,
                    n,
                    va,
                    rkey,
                    len,
                    msn,
                    pd,
                } => {
                    let op = on(match (n, next) {
                        (1, _) => Opcode::RcReadResponseOnly,
                        (_, 0) => Opcode::RcReadResponseFirst,
                        (_, i) if i + 1 == n => Opcode::RcReadResponseLast,
                        _ => Opcode::RcReadResponseMiddle,
                    });
                    let off = next as u64 * pmtu as u64;
                    let size = (u64::from(len) - off.min(u64::from(len))).min(pmtu as u64) as usize;
                    let mut ext = ExtHeaders::NONE;
                    if op.headers().contains(HeaderSet::AETH) {
                        ext.aeth = Some(AethRepr {
                            syndrome: AethSyndrome::ACK,
                            msn,
                        });
                    }
                    if next + 1 >= n {
                        r.replies.pop_front();
                    } else if let Some(Reply::Read { next: nx, .. }) = r.replies.front_mut() {
                        *nx += 1;
                    }
                    let bth = BthRepr::new(op, dest_qp, first + next);
                    (bth, ext, size, Some((va.wrapping_add(off), rkey, pd)))
                }
            };
            let Ok((h, total)) = emit_headers(&bth, &ext, payload_len, buf) else {
                cx.internal_error(qpn, "a response does not fit the transmit buffer");
                return None;
            };
            let mut by_ref = None;
            if let Some((va, rkey, pd)) = va_rkey {
                let by = crate::memory::RemoteQp { pd, qpn: Some(qpn) };
                let read = if payload_len == 0 {
                    Ok(())
                } else if cx.payload_by_ref && payload_len >= PAYLOAD_BY_REF_MIN {
                    match cx.memory.remote_read_ref(rkey, by, va, payload_len) {
                        Ok(Some(data)) => {
                            by_ref = Some(PayloadAt { at: h, data });
                            Ok(())
                        }
                        Ok(None) => {
                            let out = &mut buf[h..h + payload_len];
                            cx.memory.remote_read(rkey, by, va, out)
                        }
                        Err(e) => Err(e),
                    }
                } else {
                    let out = &mut buf[h..h + payload_len];
                    cx.memory.remote_read(rkey, by, va, out)
                };
                if read.is_err() {
                    // The region went away between packets: NAK and fail.
                    r.replies.clear();
                    let ext = ExtHeaders {
                        aeth: Some(AethRepr {
                            syndrome: AethSyndrome::Nak(NakCode::RemoteAccessError),
                            msn: r.msn,
                        }),
                        ..ExtHeaders::NONE
                    };
                    let nak = BthRepr::new(on(Opcode::RcAcknowledge), dest_qp, bth.psn);
                    let Ok((_, total)) = emit_headers(&nak, &ext, 0, buf) else {
                        cx.internal_error(qpn, "a NAK does not fit the transmit buffer");
                        return None;
                    };
                    self.enter_error(cx);
                    return Some(Transmit::whole(dst, src_port, total));
                }
            }
            if by_ref.is_some() {
                // Pad and ICRC follow the headers in the buffer.
                buf.copy_within(h + payload_len..total, h);
            }
            return Some(Transmit {
                dst,
                src_port,
                len: total,
                payload: by_ref,
            });
        }
    }
}
