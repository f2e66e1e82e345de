//! Completion queues: `ibv_create_cq`, `ibv_create_cq_ex` (the
//! `verbs_context` op), `ibv_resize_cq`, `ibv_destroy_cq`,
//! `ibv_ack_cq_events`, the ops `ibv_poll_cq` and `ibv_req_notify_cq` jump
//! through, and the extended CQ's polling (`ibv_start_poll`,
//! `ibv_wc_read_*`, ...).
//!
//! Every CQ carries the `ibv_cq_ex` layout (its leading members are the
//! `ibv_cq`), so one created by `ibv_create_cq_ex` is polled through
//! `ibv_start_poll` & co, and any CQ through `ibv_poll_cq`. `start_poll` /
//! `next_poll` take completions from the CQ into a per-CQ queue whose front
//! is the current one; `ibv_poll_cq` drains that queue first.

use crate::abi::convert::wc_to_c;
use crate::abi::*;
use crate::comp_channel::{attach_cq, detach_cq, RoxeChannel};
use crate::context::context;
use crate::object::{container_of, count_acked_events, destroy, hand_out, Counted, Users};
use crate::pd::RoxePd;
use crate::{fail_null, guard};
use parking_lot::Mutex;
use roxe_verbs::{Cq, WcOpcode, WcStatus, WorkCompletion};
use std::collections::VecDeque;
use std::ffi::{c_int, c_uint, c_void};
use std::ptr::{self, null_mut};
use std::sync::atomic::{AtomicBool, Ordering};

#[repr(C)]
pub(crate) struct RoxeCq {
    c: ibv_cq_ex,
    pub(crate) cq: Cq,
    users: Users,
    /// Completions taken from the CQ by `start_poll`/`next_poll` and not
    /// yet handed over (the first is the current one), in order, each
    /// with its wall-clock time (0 unless `wallclock`).
    polled: Mutex<VecDeque<(WorkCompletion, u64)>>,
    /// Created with `IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK` (or
    /// `_TIMESTAMP`): completions are polled with their times.
    wallclock: bool,
    /// Whether `polled` holds any (so `ibv_poll_cq` need not lock).
    has_polled: AtomicBool,
}

impl Counted for RoxeCq {
    fn users(&self) -> &Users {
        &self.users
    }
}

/// A placeholder for the slots of a poll buffer.
fn blank_completion() -> WorkCompletion {
    WorkCompletion::new(0, WcStatus::Success, WcOpcode::Send, 0)
}

/// A fresh `ibv_cq_ex` with the extended-poll functions filled in.
fn cq_ex_header(
    ctx: *mut ibv_context,
    channel: *mut ibv_comp_channel,
    cq_context: *mut c_void,
    handle: u32,
    cqe: c_int,
) -> ibv_cq_ex {
    ibv_cq_ex {
        context: ctx,
        channel,
        cq_context,
        handle,
        cqe,
        mutex: libc::PTHREAD_MUTEX_INITIALIZER,
        cond: libc::PTHREAD_COND_INITIALIZER,
        comp_events_completed: 0,
        async_events_completed: 0,
        comp_mask: 0,
        status: 0,
        wr_id: 0,
        start_poll: Some(poll_ex::start_poll),
        next_poll: Some(poll_ex::next_poll),
        end_poll: Some(poll_ex::end_poll),
        read_opcode: Some(poll_ex::read_opcode),
        read_vendor_err: Some(poll_ex::read_vendor_err),
        read_byte_len: Some(poll_ex::read_byte_len),
        read_imm_data: Some(poll_ex::read_imm_data),
        read_qp_num: Some(poll_ex::read_qp_num),
        read_src_qp: Some(poll_ex::read_src_qp),
        read_wc_flags: Some(poll_ex::read_wc_flags),
        read_slid: Some(poll_ex::read_zero_u32),
        read_sl: Some(poll_ex::read_sl),
        read_dlid_path_bits: Some(poll_ex::read_zero_u8),
        // Not offered (create_cq_ex refuses the flags that need them).
        read_completion_ts: None,
        read_cvlan: None,
        read_flow_tag: None,
        read_tm_info: None,
        read_completion_wallclock_ns: None,
    }
}

/// The optional fields a CQ offers to `ibv_wc_read_*` (the flags of
/// `ibv_create_cq_ex`).
#[derive(Clone, Copy, Default)]
struct CqFields {
    /// `IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK`.
    wallclock: bool,
    /// `IBV_WC_EX_WITH_COMPLETION_TIMESTAMP`.
    device_clock: bool,
    /// `IBV_WC_EX_WITH_TM_INFO`.
    tm_info: bool,
}

/// A CQ of `cqe` entries on context `ctx` (both creation verbs).
///
/// # Safety
/// `ctx` is NULL or an open context; `channel` NULL or one of its channels.
unsafe fn create_roxe_cq(
    ctx: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
    fields: CqFields,
) -> Result<*mut RoxeCq, c_int> {
    // SAFETY: per the contract.
    let Some(c) = (unsafe { context(ctx) }) else {
        return Err(libc::EINVAL);
    };
    if cqe < 1 || comp_vector < 0 || comp_vector >= c.vctx.context.num_comp_vectors {
        return Err(libc::EINVAL);
    }
    // SAFETY: channel is NULL or from ibv_create_comp_channel.
    let ch = unsafe { container_of::<RoxeChannel, _>(channel) };
    let cq = c
        .ctx
        .create_cq(cqe as u32, ch.map(|h| &h.ch))
        .map_err(|e| e.errno())?;
    let id = cq.id().0;
    let mut header = cq_ex_header(ctx, channel, cq_context, id, cqe);
    if fields.wallclock {
        header.read_completion_wallclock_ns = Some(poll_ex::read_completion_wallclock_ns);
    }
    if fields.device_clock {
        // The device clock's ticks are those nanoseconds.
        header.read_completion_ts = Some(poll_ex::read_completion_wallclock_ns);
    }
    if fields.tm_info {
        header.read_tm_info = Some(poll_ex::read_tm_info);
    }
    let raw = hand_out(RoxeCq {
        c: header,
        cq,
        users: Users::default(),
        wallclock: fields.wallclock || fields.device_clock,
        polled: Mutex::new(VecDeque::new()),
        has_polled: AtomicBool::new(false),
    });
    if ch.is_some() {
        // SAFETY: channel is a live channel of this library (checked).
        unsafe { attach_cq(channel, id, raw.cast()) };
    }
    Ok(raw)
}

/// `ibv_create_cq_ex` (the `verbs_context` op): the standard
/// work-completion fields (`IBV_WC_STANDARD_FLAGS`) and completion times,
/// wall-clock (`IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK`, read with
/// `ibv_wc_read_completion_wallclock_ns`) and on the device's clock
/// (`IBV_WC_EX_WITH_COMPLETION_TIMESTAMP`, `ibv_wc_read_completion_ts`):
/// a soft device's clock ticks in nanoseconds since the Unix epoch
/// (`hca_core_clock` 1,000,000 kHz), monotonic because it advances with the
/// device's monotonic clock from the wall-clock time it was opened at, so
/// both reads give the same value; tag-matching details
/// (`IBV_WC_EX_WITH_TM_INFO`, `ibv_wc_read_tm_info`). CVLAN and flow tags
/// are refused with EOPNOTSUPP, as by a device without them.
///
/// # Safety
/// `ctx` is one of this library's contexts (the op is only in their
/// tables); `attr` is NULL or the caller's, its channel NULL or one of the
/// context's and its parent domain NULL or a PD of this library.
pub(crate) unsafe extern "C" fn create_cq_ex(
    ctx: *mut ibv_context,
    attr: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq_ex {
    guard(null_mut(), || {
        // SAFETY: attr is NULL or the caller's.
        let Some(a) = (unsafe { attr.as_ref() }) else {
            return fail_null(libc::EINVAL);
        };
        /// `IBV_CREATE_CQ_ATTR_SINGLE_THREADED`: a hint roxe can ignore.
        const SINGLE_THREADED: u32 = 1;
        let known_mask = IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD;
        if a.comp_mask & !known_mask != 0 {
            return fail_null(libc::EINVAL);
        }
        if (a.comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS != 0 && a.flags & !SINGLE_THREADED != 0)
            || a.wc_flags
                & !(IBV_WC_STANDARD_FLAGS
                    | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK
                    | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP
                    | IBV_WC_EX_WITH_TM_INFO)
                != 0
        {
            return fail_null(libc::EOPNOTSUPP);
        }
        if a.comp_mask & IBV_CQ_INIT_ATTR_MASK_PD != 0 {
            // A parent domain (its allocators have no CQ buffer to place
            // here); it must be one of this context's.
            // SAFETY: parent_domain is NULL or a PD of this library.
            match unsafe { container_of::<RoxePd, _>(a.parent_domain) } {
                Some(p) if p.is_parent_domain() && p.context() == ctx => {}
                _ => return fail_null(libc::EINVAL),
            }
        }
        let (Ok(cqe), Ok(vector)) = (c_int::try_from(a.cqe), c_int::try_from(a.comp_vector)) else {
            return fail_null(libc::EINVAL);
        };
        let fields = CqFields {
            wallclock: a.wc_flags & IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK != 0,
            device_clock: a.wc_flags & IBV_WC_EX_WITH_COMPLETION_TIMESTAMP != 0,
            tm_info: a.wc_flags & IBV_WC_EX_WITH_TM_INFO != 0,
        };
        // SAFETY: ctx is the context the inline wrapper passed; the
        // channel is the caller's.
        match unsafe { create_roxe_cq(ctx, cqe, a.cq_context, a.channel, vector, fields) } {
            Ok(raw) => raw.cast(),
            Err(e) => fail_null(e),
        }
    })
}

/// The extended-poll functions (`ibv_start_poll`, `ibv_wc_read_*`, ...),
/// which verbs.h's inline wrappers call through the `ibv_cq_ex` with the
/// CQ itself.
mod poll_ex {
    use super::*;

    /// The CQ behind `cq`.
    ///
    /// # Safety
    /// `cq` is NULL or a live CQ this library created.
    unsafe fn roxe<'a>(cq: *mut ibv_cq_ex) -> Option<&'a RoxeCq> {
        // SAFETY: per the contract (a RoxeCq starts with its ibv_cq_ex).
        unsafe { container_of::<RoxeCq, _>(cq) }
    }

    /// Make the first polled completion (if any) current: status and
    /// wr_id into the public fields. ENOENT when there is none.
    ///
    /// # Safety
    /// `cq` is `q`'s public struct.
    unsafe fn expose(
        q: &RoxeCq,
        cq: *mut ibv_cq_ex,
        polled: &mut VecDeque<(WorkCompletion, u64)>,
    ) -> c_int {
        if polled.is_empty() {
            let mut buf = [blank_completion(); 16];
            let mut at = [0u64; 16];
            let got = if q.wallclock {
                q.cq.poll_with_wallclock(&mut buf, &mut at)
            } else {
                q.cq.poll(&mut buf)
            };
            match got {
                Ok(n) => polled.extend(buf[..n].iter().copied().zip(at)),
                Err(e) => return e.errno(),
            }
        }
        q.has_polled.store(!polled.is_empty(), Ordering::Release);
        let Some((w, _)) = polled.front() else {
            return libc::ENOENT;
        };
        // SAFETY: cq is the live CQ (the contract); the public fields
        // programs read, written only by the thread polling.
        unsafe {
            (*cq).status = w.status as u32;
            (*cq).wr_id = w.wr_id;
        }
        0
    }

    /// # Safety
    /// `cq` is NULL or a live CQ of this library; `attr` NULL or the
    /// caller's.
    pub(super) unsafe extern "C" fn start_poll(
        cq: *mut ibv_cq_ex,
        attr: *mut ibv_poll_cq_attr,
    ) -> c_int {
        guard(libc::EIO, || {
            // SAFETY: the inline wrapper passes the CQ itself.
            let Some(q) = (unsafe { roxe(cq) }) else {
                return libc::EINVAL;
            };
            // SAFETY: attr is NULL or the caller's; comp_mask must be 0.
            if unsafe { attr.as_ref() }.is_some_and(|a| a.comp_mask != 0) {
                return libc::EINVAL;
            }
            let mut polled = q.polled.lock();
            // SAFETY: cq is q's public struct.
            unsafe { expose(q, cq, &mut polled) }
        })
    }

    /// # Safety
    /// `cq` is NULL or a live CQ of this library.
    pub(super) unsafe extern "C" fn next_poll(cq: *mut ibv_cq_ex) -> c_int {
        guard(libc::EIO, || {
            // SAFETY: as in start_poll.
            let Some(q) = (unsafe { roxe(cq) }) else {
                return libc::EINVAL;
            };
            let mut polled = q.polled.lock();
            // The current one is consumed.
            polled.pop_front();
            // SAFETY: cq is q's public struct.
            unsafe { expose(q, cq, &mut polled) }
        })
    }

    /// # Safety
    /// `cq` is NULL or a live CQ of this library.
    pub(super) unsafe extern "C" fn end_poll(cq: *mut ibv_cq_ex) {
        guard((), || {
            // SAFETY: as in start_poll.
            let Some(q) = (unsafe { roxe(cq) }) else {
                return;
            };
            // The current one is consumed; the rest wait for the next poll.
            let mut polled = q.polled.lock();
            polled.pop_front();
            q.has_polled.store(!polled.is_empty(), Ordering::Release);
        })
    }

    /// A field of the current completion (0 without one).
    ///
    /// # Safety
    /// `cq` is NULL or a live CQ of this library.
    unsafe fn current<T: Default>(cq: *mut ibv_cq_ex, f: impl FnOnce(&WorkCompletion) -> T) -> T {
        guard(T::default(), || {
            // SAFETY: per the contract.
            let Some(q) = (unsafe { roxe(cq) }) else {
                return T::default();
            };
            q.polled
                .lock()
                .front()
                .map(|(w, _)| f(w))
                .unwrap_or_default()
        })
    }

    /// # Safety
    /// `cq` is NULL or a live CQ of this library.
    pub(super) unsafe extern "C" fn read_opcode(cq: *mut ibv_cq_ex) -> u32 {
        // SAFETY: per the contract.
        unsafe { current(cq, |w| w.opcode as u32) }
    }
    pub(super) extern "C" fn read_vendor_err(_cq: *mut ibv_cq_ex) -> u32 {
        0
    }
    /// # Safety
    /// `cq` is NULL or a live CQ of this library.
    pub(super) unsafe extern "C" fn read_byte_len(cq: *mut ibv_cq_ex) -> u32 {
        // SAFETY: per the contract.
        unsafe { current(cq, |w| w.byte_len) }
    }
    /// `__be32`, as `ibv_wc`'s `imm_data` (or the invalidated rkey).
    ///
    /// # Safety
    /// `cq` is NULL or a live CQ of this library.
    pub(super) unsafe extern "C" fn read_imm_data(cq: *mut ibv_cq_ex) -> u32 {
        // SAFETY: per the contract.
        unsafe { current(cq, |w| wc_to_c(w).imm_data) }
    }
    /// # Safety
    /// `cq` is NULL or a live CQ of this library.
    pub(super) unsafe extern "C" fn read_qp_num(cq: *mut ibv_cq_ex) -> u32 {
        // SAFETY: per the contract.
        unsafe { current(cq, |w| w.qp_num) }
    }
    /// # Safety
    /// `cq` is NULL or a live CQ of this library.
    pub(super) unsafe extern "C" fn read_src_qp(cq: *mut ibv_cq_ex) -> u32 {
        // SAFETY: per the contract.
        unsafe { current(cq, |w| w.src_qp) }
    }
    /// # Safety
    /// `cq` is NULL or a live CQ of this library.
    pub(super) unsafe extern "C" fn read_sl(cq: *mut ibv_cq_ex) -> u8 {
        // SAFETY: per the contract.
        unsafe { current(cq, |w| w.sl) }
    }
    /// # Safety
    /// `cq` is NULL or a live CQ of this library.
    pub(super) unsafe extern "C" fn read_wc_flags(cq: *mut ibv_cq_ex) -> c_uint {
        // SAFETY: per the contract.
        unsafe { current(cq, |w| w.wc_flags) }
    }
    /// `ibv_wc_read_slid` (no LIDs on RoCE).
    pub(super) extern "C" fn read_zero_u32(_cq: *mut ibv_cq_ex) -> u32 {
        0
    }
    /// `ibv_wc_read_dlid_path_bits` (no LIDs on RoCE).
    pub(super) extern "C" fn read_zero_u8(_cq: *mut ibv_cq_ex) -> u8 {
        0
    }

    /// `ibv_wc_read_completion_wallclock_ns`: when the device made the
    /// current completion, in nanoseconds since the Unix epoch.
    ///
    /// # Safety
    /// `cq` is NULL or a live CQ of this library.
    pub(super) unsafe extern "C" fn read_completion_wallclock_ns(cq: *mut ibv_cq_ex) -> u64 {
        guard(0, || {
            // SAFETY: as in start_poll.
            let Some(q) = (unsafe { roxe(cq) }) else {
                return 0;
            };
            q.polled.lock().front().map_or(0, |&(_, at)| at)
        })
    }

    /// `ibv_wc_read_tm_info`: a tag-matching completion's tag and the
    /// TMH's application context (zeros for others).
    ///
    /// # Safety
    /// `cq` is NULL or a live CQ of this library; `info` is NULL or
    /// writable.
    pub(super) unsafe extern "C" fn read_tm_info(cq: *mut ibv_cq_ex, info: *mut ibv_wc_tm_info) {
        // SAFETY: per the contract.
        let (tag, priv_) = unsafe { current(cq, |w| (w.tm_tag, w.tm_priv)) };
        // SAFETY: info is the caller's (the inline wrapper's contract).
        if let Some(out) = unsafe { info.as_mut() } {
            *out = ibv_wc_tm_info { tag, priv_ };
        }
    }
}

/// # Safety
/// `ctx` is NULL or an open context (of this library or the system's);
/// `channel` NULL or one of its completion channels.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_cq(
    ctx: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    crate::passthrough::pass_through!(
        context ctx,
        "ibv_create_cq",
        fn(*mut ibv_context, c_int, *mut c_void, *mut ibv_comp_channel, c_int) -> *mut ibv_cq,
        (ctx, cqe, cq_context, channel, comp_vector),
        null_mut()
    );
    guard(null_mut(), || {
        // SAFETY: ctx NULL or open, channel NULL or its channel (C contract).
        match unsafe {
            create_roxe_cq(
                ctx,
                cqe,
                cq_context,
                channel,
                comp_vector,
                CqFields::default(),
            )
        } {
            Ok(raw) => raw.cast(),
            Err(e) => fail_null(e),
        }
    })
}

/// # Safety
/// `cq` is NULL or a live CQ (of this library or the system's).
#[no_mangle]
pub unsafe extern "C" fn ibv_resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
    crate::passthrough::pass_through!(
        object cq,
        "ibv_resize_cq",
        fn(*mut ibv_cq, c_int) -> c_int,
        (cq, cqe),
        libc::EOPNOTSUPP
    );
    guard(libc::EIO, || {
        // SAFETY: cq is NULL or from ibv_create_cq.
        let Some(q) = (unsafe { container_of::<RoxeCq, _>(cq) }) else {
            return libc::EINVAL;
        };
        let Ok(depth) = u32::try_from(cqe) else {
            return libc::EINVAL;
        };
        match q.cq.resize(depth) {
            Ok(()) => {
                // SAFETY: the public field programs read, written through
                // the CQ's own pointer.
                unsafe { (*cq).cqe = cqe };
                0
            }
            Err(e) => e.errno(),
        }
    })
}

/// EBUSY while QPs or SRQs use the CQ.
///
/// # Safety
/// `cq` is NULL or a live CQ (of this library or the system's), not used
/// again once destroyed.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    crate::passthrough::pass_through!(
        object cq,
        "ibv_destroy_cq",
        fn(*mut ibv_cq) -> c_int,
        (cq),
        libc::EOPNOTSUPP
    );
    let retire = |q: &RoxeCq| {
        q.users.refuse_if_used()?;
        // SAFETY: the channel outlives its CQs (destroying it is refused
        // while any is attached).
        unsafe { detach_cq(q.c.channel, q.cq.id().0) };
        Ok(())
    };
    // SAFETY: per the contract.
    unsafe { destroy(cq, retire) }
}

/// # Safety
/// `cq` is NULL or a live CQ (of this library or the system's).
#[no_mangle]
pub unsafe extern "C" fn ibv_ack_cq_events(cq: *mut ibv_cq, nevents: u32) {
    crate::passthrough::pass_through!(
        object cq,
        "ibv_ack_cq_events",
        fn(*mut ibv_cq, u32) -> (),
        (cq, nevents),
        ()
    );
    if cq.is_null() {
        return;
    }
    // SAFETY: cq is a live CQ; its mutex and cond were initialised at
    // create.
    unsafe {
        count_acked_events(
            ptr::addr_of_mut!((*cq).mutex),
            ptr::addr_of_mut!((*cq).cond),
            ptr::addr_of_mut!((*cq).comp_events_completed),
            nevents,
        )
    }
}

/// `ibv_poll_cq` (the op): up to `num_entries` completions, those an
/// extended poll took from the CQ and left first; -1 on error.
///
/// # Safety
/// `cq` is NULL or a live CQ of this library (the inline wrapper found
/// this op through its context); `wc` holds `num_entries` writable
/// entries.
pub(crate) unsafe extern "C" fn poll_cq(
    cq: *mut ibv_cq,
    num_entries: c_int,
    wc: *mut ibv_wc,
) -> c_int {
    guard(-1, || {
        // SAFETY: per the contract.
        let Some(q) = (unsafe { container_of::<RoxeCq, _>(cq) }) else {
            return -1;
        };
        if num_entries <= 0 {
            return 0;
        }
        if wc.is_null() {
            return -1;
        }
        let want = num_entries as usize;
        let mut done = 0usize;
        // Completions an extended poll took from the CQ and left come
        // first (in order).
        if q.has_polled.load(Ordering::Acquire) {
            let mut polled = q.polled.lock();
            while done < want {
                let Some((w, _)) = polled.pop_front() else {
                    break;
                };
                // SAFETY: the caller's array holds num_entries entries.
                unsafe { wc.add(done).write(wc_to_c(&w)) };
                done += 1;
            }
            q.has_polled.store(!polled.is_empty(), Ordering::Release);
        }
        let mut buf = [blank_completion(); 32];
        while done < want {
            let k = match q.cq.poll(&mut buf[..(want - done).min(32)]) {
                Ok(k) => k,
                Err(_) => return if done > 0 { done as c_int } else { -1 },
            };
            for (i, w) in buf[..k].iter().enumerate() {
                // SAFETY: the caller's array holds num_entries entries.
                unsafe { wc.add(done + i).write(wc_to_c(w)) };
            }
            done += k;
            if k < 32 {
                break;
            }
        }
        done as c_int
    })
}

/// `ibv_req_notify_cq` (the op): arm the CQ's channel for its next
/// (solicited) completion.
///
/// # Safety
/// `cq` is NULL or a live CQ of this library.
pub(crate) unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: per the contract.
        let Some(q) = (unsafe { container_of::<RoxeCq, _>(cq) }) else {
            return libc::EINVAL;
        };
        match q.cq.req_notify(solicited_only != 0) {
            Ok(()) => 0,
            Err(e) => e.errno(),
        }
    })
}
