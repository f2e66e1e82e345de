//! The responder's checks, in rxe's order (`rxe_resp.c`: check_psn in
//! `rc_request`, then check_op_seq, check_op_valid, check_resource,
//! check_length, check_rkey), each a function of the packet and of the
//! state it needs, returning the NAK its failure implies.

use super::InMsg;
use crate::memory::{MemoryTable, RemoteQp};
use crate::types::AccessFlags;
use roxe_wire::aeth::NakCode;
use roxe_wire::{Opcode, Operation, Packet, PacketClass, RethRepr};

/// check_op_seq: a MIDDLE or LAST continues the message in progress, of
/// its kind; anything else may only start when none is in progress.
pub(super) fn op_sequence(msg: Option<&InMsg>, op: Opcode) -> Result<(), NakCode> {
    let ok = match (op.class(), msg) {
        (PacketClass::Middle | PacketClass::Last, Some(InMsg::Send { .. })) => {
            op.operation() == Operation::Send
        }
        (PacketClass::Middle | PacketClass::Last, Some(InMsg::Write { .. })) => {
            op.operation() == Operation::Write
        }
        (PacketClass::Middle | PacketClass::Last, None) => false,
        (_, msg) => msg.is_none(),
    };
    if ok {
        Ok(())
    } else {
        Err(NakCode::InvalidRequest)
    }
}

/// check_op_valid: the QP's access flags allow the operation (FLUSH is not
/// implemented; ATOMIC WRITE needs remote write, as on rxe since 6.2).
/// Returns the right the operation needs of the memory it names.
pub(super) fn op_valid(op: Opcode, qp_access: AccessFlags) -> Result<AccessFlags, NakCode> {
    let need = match op.operation() {
        Operation::Write | Operation::AtomicWrite => AccessFlags::REMOTE_WRITE,
        Operation::ReadRequest => AccessFlags::REMOTE_READ,
        Operation::CompareSwap | Operation::FetchAdd => AccessFlags::REMOTE_ATOMIC,
        Operation::Send => AccessFlags::NONE,
        _ => return Err(NakCode::InvalidRequest),
    };
    if qp_access.contains(need) {
        Ok(need)
    } else {
        Err(NakCode::InvalidRequest)
    }
}

/// check_resource: the packets that consume a receive WQE (a SEND's first,
/// a WRITE with immediate data's last). Without one the answer is an RNR
/// NAK (RC) or a drop (UC).
pub(super) fn needs_receive(op: Opcode) -> bool {
    match op.operation() {
        Operation::Send => op.starts_message(),
        Operation::Write => op.ends_message() && op.has_immediate(),
        _ => false,
    }
}

/// check_length: the payload against the connection's path MTU.
pub(super) fn length(pkt: &Packet<&[u8]>, pmtu: usize) -> Result<(), NakCode> {
    match roxe_wire::lint::payload_length(pkt.opcode(), pkt.payload().len(), Some(pmtu)) {
        None => Ok(()),
        Some(_) => Err(NakCode::InvalidRequest),
    }
}

/// check_rkey: the RETH of a WRITE FIRST/ONLY or a READ, checked once for
/// the whole message. A missing header or a length over 2^31 (C9-94) is an
/// invalid request; a key, PD, right or range failure a remote access
/// error.
pub(super) fn rkey(
    memory: &MemoryTable,
    pkt: &Packet<&[u8]>,
    by: RemoteQp,
    need: AccessFlags,
) -> Result<RethRepr, NakCode> {
    let reth = pkt.reth().ok_or(NakCode::InvalidRequest)?;
    if reth.dma_len > 1 << 31 {
        return Err(NakCode::InvalidRequest);
    }
    memory
        .check_remote(reth.rkey, by, reth.va, u64::from(reth.dma_len), need)
        .map_err(|_| NakCode::RemoteAccessError)?;
    Ok(reth)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::qp::RecvWqe;
    use crate::memory::Sge;

    fn send_in_progress() -> InMsg {
        InMsg::Send {
            wqe: RecvWqe {
                wr_id: 1,
                sg_list: Vec::<Sge>::new(),
                total: 0,
            },
            offset: 0,
            tm: None,
        }
    }

    #[test]
    fn opcode_sequence_follows_the_message_in_progress() {
        use Opcode::*;
        let send = send_in_progress();
        let write = InMsg::Write {
            va: 0,
            rkey: 0,
            written: 0,
            total: 8192,
        };
        assert_eq!(op_sequence(None, RcSendFirst), Ok(()));
        assert_eq!(op_sequence(None, RcReadRequest), Ok(()));
        assert!(op_sequence(None, RcSendMiddle).is_err());
        assert!(op_sequence(None, RcWriteLast).is_err());
        assert_eq!(op_sequence(Some(&send), RcSendLastImm), Ok(()));
        assert!(op_sequence(Some(&send), RcWriteMiddle).is_err());
        assert!(op_sequence(Some(&send), RcSendFirst).is_err());
        assert!(op_sequence(Some(&send), RcReadRequest).is_err());
        assert_eq!(op_sequence(Some(&write), UcWriteMiddle), Ok(()));
        assert!(op_sequence(Some(&write), RcSendLast).is_err());
    }

    #[test]
    fn operations_need_the_qp_rights() {
        use Opcode::*;
        let rw = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
        assert_eq!(op_valid(RcWriteFirst, rw), Ok(AccessFlags::REMOTE_WRITE));
        assert_eq!(op_valid(RcReadRequest, rw), Ok(AccessFlags::REMOTE_READ));
        assert_eq!(
            op_valid(RcSendOnly, AccessFlags::NONE),
            Ok(AccessFlags::NONE)
        );
        assert_eq!(op_valid(RcFetchAdd, rw), Err(NakCode::InvalidRequest));
        assert_eq!(op_valid(RcFlush, rw), Err(NakCode::InvalidRequest));
        assert_eq!(
            op_valid(RcWriteOnly, AccessFlags::REMOTE_READ),
            Err(NakCode::InvalidRequest)
        );
    }

    #[test]
    fn receives_are_consumed_by_a_send_first_and_a_write_imm_last() {
        use Opcode::*;
        for op in [
            RcSendFirst,
            RcSendOnly,
            RcSendOnlyInv,
            UcSendOnlyImm,
            UdSendOnly,
        ] {
            assert!(needs_receive(op), "{op}");
        }
        for op in [RcWriteLastImm, RcWriteOnlyImm, UcWriteLastImm] {
            assert!(needs_receive(op), "{op}");
        }
        for op in [
            RcSendMiddle,
            RcSendLast,
            RcWriteOnly,
            RcWriteLast,
            RcReadRequest,
        ] {
            assert!(!needs_receive(op), "{op}");
        }
    }
}
