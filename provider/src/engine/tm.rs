//! Tag matching (`IBV_SRQT_TM`: mlx5's offload, done in software). A
//! tag-matching SRQ keeps a list of tagged buffers beside its ordinary
//! receives. Every SEND reaching it starts with a 16-byte tag-matching
//! header (TMH: opcode, reserved, application context, tag; big-endian):
//! - EAGER whose tag matches a listed buffer: the data after the TMH lands in
//!   that buffer, which completes as TM_RECV with MATCH | DATA_VALID;
//! - RNDV (the TMH, then a rendezvous header: the sender's address, rkey and
//!   length) whose tag matches: TM_RECV with MATCH at once; then the QP the
//!   message came in on READs the data from the sender into the buffer
//!   (TM_RECV with DATA_VALID once it is there) and sends the sender a FIN
//!   (a SEND of a TMH whose opcode is FIN, with the RNDV's context and tag);
//! - a tag that matches nothing (unexpected): the whole message, TMH
//!   included, goes to an ordinary receive (TM_RECV, no flags) and the SRQ
//!   counts it. Software handles it and reports how many it has handled
//!   (`unexpected_cnt` with `IBV_OPS_TM_SYNC`); while the two counts
//!   differ, tags added do not match (their ADD completes with TM_SYNC_REQ):
//!   software must first look for their messages among the unexpected ones;
//! - NO_TAG, FIN, or a message too short for its header: an ordinary
//!   receive, completing as TM_NO_TAG.
//!
//! The wire carries plain RC SENDs, READs and their responses; the READ and
//! the FIN are the QP's own requests, outside its send queue's capacity and
//! without send completions.
//!
//! A buffer matches when `tag & mask == entry.tag & mask` (the man page
//! states `tag & mask == entry.tag`; the two agree for every entry whose tag
//! has no bits outside its mask).

use super::qp::RecvWqe;
use super::sq::{Internal, SendQueue, SendWqe};
use super::CqId;
use crate::memory::Sge;
use crate::types::{WcOpcode, WcStatus};
use crate::wr::{wc_flags, SendFlags, SendOpcode, SendWr, WorkCompletion};

/// The TMH's length: what an EAGER message's buffer does not receive.
pub const TMH_LEN: usize = 16;
/// The rendezvous header after an RNDV's TMH.
pub const RVH_LEN: usize = 16;
/// The largest RNDV message accepted (`tm_caps.max_rndv_hdr_size`, as mlx5).
pub const MAX_RNDV_HDR: u32 = 64;

/// `enum ibv_tmh_op`.
pub mod tmh_op {
    pub const NO_TAG: u8 = 0;
    pub const RNDV: u8 = 1;
    pub const FIN: u8 = 2;
    pub const EAGER: u8 = 3;
}

/// A parsed TMH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tmh {
    pub op: u8,
    pub app_ctx: u32,
    pub tag: u64,
}

impl Tmh {
    /// The TMH a payload starts with, if it is long enough.
    pub fn parse(b: &[u8]) -> Option<Tmh> {
        let h = b.get(..TMH_LEN)?;
        Some(Tmh {
            op: h[0],
            app_ctx: u32::from_be_bytes(h[4..8].try_into().ok()?),
            tag: u64::from_be_bytes(h[8..16].try_into().ok()?),
        })
    }

    pub fn to_bytes(self) -> [u8; TMH_LEN] {
        let mut b = [0u8; TMH_LEN];
        b[0] = self.op;
        b[4..8].copy_from_slice(&self.app_ctx.to_be_bytes());
        b[8..16].copy_from_slice(&self.tag.to_be_bytes());
        b
    }
}

/// A rendezvous header: where the sender's data is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rvh {
    pub va: u64,
    pub rkey: u32,
    pub len: u32,
}

impl Rvh {
    fn parse(b: &[u8]) -> Option<Rvh> {
        let h = b.get(TMH_LEN..TMH_LEN + RVH_LEN)?;
        Some(Rvh {
            va: u64::from_be_bytes(h[0..8].try_into().ok()?),
            rkey: u32::from_be_bytes(h[8..12].try_into().ok()?),
            len: u32::from_be_bytes(h[12..16].try_into().ok()?),
        })
    }
}

/// A tag-list operation (`struct ibv_ops_wr`).
#[derive(Debug, Clone)]
pub struct SrqOp {
    pub wr_id: u64,
    pub kind: SrqOpKind,
    /// `IBV_OPS_SIGNALED`: a completion on the SRQ's CQ (failures always
    /// complete).
    pub signaled: bool,
    /// `IBV_OPS_TM_SYNC`: how many unexpected messages software has handled.
    pub sync: Option<u32>,
}

#[derive(Debug, Clone)]
pub enum SrqOpKind {
    /// `IBV_WR_TAG_ADD`: a buffer for messages whose tag matches.
    Add {
        recv_wr_id: u64,
        sg_list: Vec<Sge>,
        tag: u64,
        mask: u64,
    },
    /// `IBV_WR_TAG_DEL`: the buffer `ADD` returned `handle` for.
    Del { handle: u32 },
    /// `IBV_WR_TAG_SYNC`: only the count.
    Sync,
}

#[derive(Debug)]
struct TagEntry {
    handle: u32,
    tag: u64,
    mask: u64,
    wqe: RecvWqe,
    /// Added while software and the SRQ agreed on the unexpected count (or
    /// synchronized since): it may match.
    active: bool,
}

/// The tag-matching state of an SRQ.
#[derive(Debug)]
pub(crate) struct TmSrq {
    /// Where tag-list operations complete.
    pub cq: CqId,
    pub max_tags: u32,
    tags: Vec<TagEntry>,
    last_handle: u32,
    /// Unexpected messages delivered.
    unexpected: u32,
    /// The count software reported last.
    synced: u32,
}

/// Where a message arriving at a tag-matching SRQ goes.
#[derive(Debug)]
pub(super) enum Route {
    /// Into a tagged buffer, after its TMH.
    Eager { wqe: RecvWqe, tmh: Tmh },
    /// A matched rendezvous: the data is to be read from the sender.
    Rndv { wqe: RecvWqe, tmh: Tmh, rvh: Rvh },
    /// Into an ordinary receive, completing with `opcode`.
    Ordinary { opcode: WcOpcode },
}

/// A tag-list operation's outcome: its completion's opcode, status flags,
/// and the handle an ADD returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct OpDone {
    pub opcode: WcOpcode,
    pub ok: bool,
    pub flags: u32,
    pub handle: u32,
}

impl TmSrq {
    pub fn new(cq: CqId, max_tags: u32) -> Self {
        TmSrq {
            cq,
            max_tags,
            tags: Vec::new(),
            last_handle: 0,
            unexpected: 0,
            synced: 0,
        }
    }

    fn in_sync(&self) -> bool {
        self.unexpected == self.synced
    }

    /// Whether the list has room for another tag.
    pub fn full(&self) -> bool {
        self.tags.len() >= self.max_tags as usize
    }

    /// Apply one operation (validated by the caller).
    pub fn apply(&mut self, kind: SrqOpKind, sync: Option<u32>) -> OpDone {
        if let Some(n) = sync {
            self.synced = n;
            if self.in_sync() {
                for t in &mut self.tags {
                    t.active = true;
                }
            }
        }
        let sync_req = if self.in_sync() {
            0
        } else {
            wc_flags::TM_SYNC_REQ
        };
        match kind {
            SrqOpKind::Add {
                recv_wr_id,
                sg_list,
                tag,
                mask,
            } => {
                let mut h = self.last_handle;
                loop {
                    h = h.wrapping_add(1);
                    if !self.tags.iter().any(|t| t.handle == h) {
                        break;
                    }
                }
                self.last_handle = h;
                let total = crate::memory::MemoryTable::sge_total(&sg_list);
                self.tags.push(TagEntry {
                    handle: h,
                    tag,
                    mask,
                    wqe: RecvWqe {
                        wr_id: recv_wr_id,
                        sg_list,
                        total,
                    },
                    active: self.in_sync(),
                });
                OpDone {
                    opcode: WcOpcode::TmAdd,
                    ok: true,
                    flags: sync_req,
                    handle: h,
                }
            }
            SrqOpKind::Del { handle } => {
                let found = self.tags.iter().position(|t| t.handle == handle);
                if let Some(i) = found {
                    self.tags.remove(i);
                }
                OpDone {
                    opcode: WcOpcode::TmDel,
                    // A tag consumed by a message meanwhile (or never added).
                    ok: found.is_some(),
                    flags: sync_req,
                    handle,
                }
            }
            SrqOpKind::Sync => OpDone {
                opcode: WcOpcode::TmSync,
                ok: true,
                flags: sync_req,
                handle: 0,
            },
        }
    }

    /// The active entry a message with TMH `tmh` would consume.
    fn find(&self, tmh: &Tmh) -> Option<usize> {
        self.tags
            .iter()
            .position(|t| t.active && tmh.tag & t.mask == t.tag & t.mask)
    }

    /// What a message whose first packet carries `first` is (`single`: the
    /// message is that one packet).
    fn classify(first: &[u8], single: bool) -> Class {
        let Some(tmh) = Tmh::parse(first) else {
            return Class::NoTag;
        };
        match tmh.op {
            tmh_op::EAGER => Class::Tagged(tmh, None),
            // The header must be whole in one packet (it is at most
            // MAX_RNDV_HDR bytes); otherwise software handles it.
            tmh_op::RNDV => match Rvh::parse(first).filter(|_| single) {
                Some(rvh) => Class::Tagged(tmh, Some(rvh)),
                None => Class::Unusable,
            },
            _ => Class::NoTag,
        }
    }

    /// Whether the message needs no ordinary receive (it matches a tag).
    pub fn matches(&self, first: &[u8], single: bool) -> bool {
        match Self::classify(first, single) {
            Class::Tagged(tmh, _) => self.find(&tmh).is_some(),
            Class::NoTag | Class::Unusable => false,
        }
    }

    /// Decide where the message goes, consuming the tag it matches or
    /// counting it unexpected.
    pub fn route(&mut self, first: &[u8], single: bool) -> Route {
        let found = match Self::classify(first, single) {
            Class::NoTag => {
                return Route::Ordinary {
                    opcode: WcOpcode::TmNoTag,
                }
            }
            Class::Unusable => None,
            Class::Tagged(tmh, rvh) => self.find(&tmh).map(|i| (i, tmh, rvh)),
        };
        let Some((i, tmh, rvh)) = found else {
            self.unexpected = self.unexpected.wrapping_add(1);
            return Route::Ordinary {
                opcode: WcOpcode::TmRecv,
            };
        };
        let wqe = self.tags.remove(i).wqe;
        match rvh {
            Some(rvh) => Route::Rndv { wqe, tmh, rvh },
            None => Route::Eager { wqe, tmh },
        }
    }
}

/// A message's first packet, as tag matching sees it.
enum Class {
    /// NO_TAG, FIN, another opcode, or too short for a TMH.
    NoTag,
    /// EAGER, or an RNDV with its whole header in one packet.
    Tagged(Tmh, Option<Rvh>),
    /// An RNDV whose header is not whole: unexpected, for software.
    Unusable,
}

/// The internal READ of a rendezvous into the tagged buffer `wqe`, of
/// the data `rvh` points at.
pub(super) fn rndv_read(wqe: RecvWqe, tmh: Tmh, rvh: Rvh, cq: CqId) -> (SendWr, u32, Internal) {
    let mut wr = SendWr::new(wqe.wr_id, SendOpcode::RdmaRead, wqe.sg_list);
    wr.remote_addr = rvh.va;
    wr.rkey = rvh.rkey;
    wr.flags = SendFlags::default();
    let kind = Internal::RndvRead {
        cq,
        tag: tmh.tag,
        app_ctx: tmh.app_ctx,
    };
    (wr, rvh.len, kind)
}

/// An internal request `w` finished with `status`: the completion it owes
/// (a rendezvous READ: its tagged buffer's second completion), and after a
/// READ that succeeded the FIN to the sender, queued on `sq`.
pub(super) fn internal_done(
    sq: &mut SendQueue,
    kind: Internal,
    w: &SendWqe,
    status: WcStatus,
    qpn: u32,
) -> Option<(CqId, WorkCompletion)> {
    let Internal::RndvRead { cq, tag, app_ctx } = kind else {
        return None;
    };
    let mut wc = WorkCompletion::new(w.wr.wr_id, status, WcOpcode::TmRecv, qpn);
    if status == WcStatus::Success {
        wc.byte_len = w.len;
        wc.wc_flags = wc_flags::TM_DATA_VALID;
        let fin = Tmh {
            op: tmh_op::FIN,
            app_ctx,
            tag,
        };
        let mut wr = SendWr::new(0, SendOpcode::Send, Vec::new());
        wr.flags = SendFlags::INLINE;
        wr.inline_data = Some(fin.to_bytes().to_vec());
        sq.post_internal(wr, TMH_LEN as u32, Internal::RndvFin);
    }
    Some((cq, wc))
}

/// The completion an internal request flushed by the QP's error owes.
pub(super) fn internal_flushed(
    kind: Internal,
    w: &SendWqe,
    qpn: u32,
) -> Option<(CqId, WorkCompletion)> {
    match kind {
        Internal::RndvRead { cq, .. } => Some((
            cq,
            WorkCompletion::new(w.wr.wr_id, WcStatus::WrFlushErr, WcOpcode::TmRecv, qpn),
        )),
        Internal::RndvFin => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(op: u8, tag: u64) -> Vec<u8> {
        let mut m = Tmh {
            op,
            app_ctx: 7,
            tag,
        }
        .to_bytes()
        .to_vec();
        m.extend_from_slice(&[0xAB; 32]);
        m
    }

    fn add(t: &mut TmSrq, tag: u64, sync: Option<u32>) -> OpDone {
        t.apply(
            SrqOpKind::Add {
                recv_wr_id: tag,
                sg_list: vec![Sge {
                    addr: 0,
                    length: 64,
                    lkey: 1,
                }],
                tag,
                mask: 0xFFFF,
            },
            sync,
        )
    }

    #[test]
    fn tmh_round_trips_big_endian() {
        let t = Tmh {
            op: tmh_op::FIN,
            app_ctx: 0x0102_0304,
            tag: 0x1122_3344_5566_7788,
        };
        let b = t.to_bytes();
        assert_eq!(b[0], 2);
        assert_eq!(&b[4..8], &[1, 2, 3, 4]);
        assert_eq!(b[8], 0x11);
        assert_eq!(Tmh::parse(&b), Some(t));
        assert_eq!(Tmh::parse(&b[..15]), None);
    }

    #[test]
    fn eager_consumes_the_first_matching_tag() {
        let mut t = TmSrq::new(CqId(1), 4);
        let a = add(&mut t, 5, None);
        let b = add(&mut t, 0x10005, None);
        assert!(a.ok && a.flags == 0 && b.handle != a.handle);
        // Both match tag 5 under mask 0xFFFF: the first added wins.
        assert!(t.matches(&msg(tmh_op::EAGER, 5), true));
        match t.route(&msg(tmh_op::EAGER, 5), true) {
            Route::Eager { wqe, tmh } => assert_eq!((wqe.wr_id, tmh.tag), (5, 5)),
            r => panic!("{r:?}"),
        }
        match t.route(&msg(tmh_op::EAGER, 5), true) {
            Route::Eager { wqe, .. } => assert_eq!(wqe.wr_id, 0x10005),
            r => panic!("{r:?}"),
        }
        // Consumed: deleting it fails.
        let d = t.apply(SrqOpKind::Del { handle: a.handle }, None);
        assert!(!d.ok);
    }

    #[test]
    fn unexpected_messages_hold_new_tags_until_synchronized() {
        let mut t = TmSrq::new(CqId(1), 8);
        assert!(matches!(
            t.route(&msg(tmh_op::EAGER, 9), true),
            Route::Ordinary {
                opcode: WcOpcode::TmRecv
            }
        ));
        // Added out of sync: SYNC_REQ, and it does not match.
        let a = add(&mut t, 9, None);
        assert_eq!(a.flags, wc_flags::TM_SYNC_REQ);
        assert!(!t.matches(&msg(tmh_op::EAGER, 9), true));
        // Software reports the one unexpected message: it matches now.
        let s = t.apply(SrqOpKind::Sync, Some(1));
        assert_eq!((s.opcode, s.flags), (WcOpcode::TmSync, 0));
        assert!(t.matches(&msg(tmh_op::EAGER, 9), true));
        // NO_TAG and FIN are not unexpected: they do not count.
        assert!(matches!(
            t.route(&msg(tmh_op::NO_TAG, 9), true),
            Route::Ordinary {
                opcode: WcOpcode::TmNoTag
            }
        ));
        assert!(matches!(
            t.route(&msg(tmh_op::FIN, 9), true),
            Route::Ordinary {
                opcode: WcOpcode::TmNoTag
            }
        ));
        assert_eq!(add(&mut t, 3, None).flags, 0);
    }

    #[test]
    fn rendezvous_needs_its_whole_header_in_one_packet() {
        let mut t = TmSrq::new(CqId(1), 8);
        add(&mut t, 4, None);
        let mut m = msg(tmh_op::RNDV, 4);
        m[16..24].copy_from_slice(&0x1000u64.to_be_bytes());
        m[24..28].copy_from_slice(&0x55u32.to_be_bytes());
        m[28..32].copy_from_slice(&64u32.to_be_bytes());
        assert!(!t.matches(&m, false));
        match t.route(&m, true) {
            Route::Rndv { rvh, wqe, .. } => {
                assert_eq!(
                    rvh,
                    Rvh {
                        va: 0x1000,
                        rkey: 0x55,
                        len: 64
                    }
                );
                assert_eq!(wqe.wr_id, 4);
            }
            r => panic!("{r:?}"),
        }
    }
}
