//! Completion channels: `ibv_create_comp_channel`,
//! `ibv_destroy_comp_channel` and `ibv_get_cq_event`. A channel is roxe's
//! `CompChannel`, whose fd is `channel->fd` (so O_NONBLOCK and poll/epoll
//! work as programs expect), with a map from engine CQ id to the `ibv_cq*`
//! its events name.

use crate::abi::*;
use crate::context::context;
use crate::object::{container_of, destroy, hand_out};
use crate::{fail_minus_one, fail_null, guard};
use parking_lot::Mutex;
use roxe_verbs::CompChannel;
use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::os::fd::AsRawFd;
use std::ptr::null_mut;

#[repr(C)]
pub(crate) struct RoxeChannel {
    c: ibv_comp_channel,
    pub(crate) ch: CompChannel,
    /// Engine CQ id → the `ibv_cq*` its events name.
    cqs: Mutex<HashMap<u32, usize>>,
}

/// Name the CQ `cq` (engine id `id`) in `channel`'s events; the public
/// `refcnt` counts the CQs attached.
///
/// # Safety
/// `channel` is a live channel of this library.
pub(crate) unsafe fn attach_cq(channel: *mut ibv_comp_channel, id: u32, cq: *mut ibv_cq) {
    // SAFETY: per the contract.
    let Some(ch) = (unsafe { container_of::<RoxeChannel, _>(channel) }) else {
        return;
    };
    let mut cqs = ch.cqs.lock();
    cqs.insert(id, cq as usize);
    // SAFETY: refcnt is read by programs only; it is written under the
    // channel's lock, through the channel's own pointer.
    unsafe { (*channel).refcnt = cqs.len() as c_int };
}

/// The CQ with engine id `id` is destroyed: its events (still queued ones
/// included) name nothing any more.
///
/// # Safety
/// `channel` is NULL or a live channel of this library (a CQ's channel
/// outlives it: destroying the channel is refused while any is attached).
pub(crate) unsafe fn detach_cq(channel: *mut ibv_comp_channel, id: u32) {
    // SAFETY: per the contract.
    let Some(ch) = (unsafe { container_of::<RoxeChannel, _>(channel) }) else {
        return;
    };
    let mut cqs = ch.cqs.lock();
    cqs.remove(&id);
    // SAFETY: as in attach_cq.
    unsafe { (*channel).refcnt = cqs.len() as c_int };
}

/// # Safety
/// `ctx` is NULL or an open context (of this library or the system's).
#[no_mangle]
pub unsafe extern "C" fn ibv_create_comp_channel(ctx: *mut ibv_context) -> *mut ibv_comp_channel {
    crate::passthrough::pass_through!(
        context ctx,
        "ibv_create_comp_channel",
        fn(*mut ibv_context) -> *mut ibv_comp_channel,
        (ctx),
        null_mut()
    );
    guard(null_mut(), || {
        // SAFETY: ctx is NULL or an open context.
        let Some(c) = (unsafe { context(ctx) }) else {
            return fail_null(libc::EINVAL);
        };
        match c.ctx.create_comp_channel() {
            Ok(ch) => hand_out(RoxeChannel {
                c: ibv_comp_channel {
                    context: ctx,
                    fd: ch.as_raw_fd(),
                    refcnt: 0,
                },
                ch,
                cqs: Mutex::new(HashMap::new()),
            })
            .cast(),
            Err(e) => fail_null(e.errno()),
        }
    })
}

/// EBUSY while CQs use the channel.
///
/// # Safety
/// `channel` is NULL or a live channel (of this library or the system's),
/// not used again once destroyed.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int {
    crate::passthrough::pass_through!(
        object channel,
        "ibv_destroy_comp_channel",
        fn(*mut ibv_comp_channel) -> c_int,
        (channel),
        libc::EOPNOTSUPP
    );
    // SAFETY: per the contract.
    unsafe {
        destroy(channel, |ch: &RoxeChannel| {
            if ch.cqs.lock().is_empty() {
                Ok(())
            } else {
                Err(libc::EBUSY)
            }
        })
    }
}

/// `ibv_get_cq_event`: the next event of the channel. Blocking or not as
/// the program set `channel->fd`; -1 with errno (EAGAIN) when nothing is
/// pending on a non-blocking channel.
///
/// # Safety
/// `channel` is NULL or a live channel (of this library or the system's);
/// `cq` and `cq_context` are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_cq_event(
    channel: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    crate::passthrough::pass_through!(
        object channel,
        "ibv_get_cq_event",
        fn(*mut ibv_comp_channel, *mut *mut ibv_cq, *mut *mut c_void) -> c_int,
        (channel, cq, cq_context),
        libc::EOPNOTSUPP
    );
    guard(-1, || {
        // SAFETY: channel is NULL or from ibv_create_comp_channel.
        let Some(ch) = (unsafe { container_of::<RoxeChannel, _>(channel) }) else {
            return fail_minus_one(libc::EINVAL);
        };
        if cq.is_null() || cq_context.is_null() {
            return fail_minus_one(libc::EINVAL);
        }
        loop {
            let id = match ch.ch.get_event() {
                Ok(id) => id,
                Err(e) => return fail_minus_one(e.raw_os_error().unwrap_or(libc::EIO)),
            };
            // An event for a CQ destroyed meanwhile is stale: skip it.
            let Some(&p) = ch.cqs.lock().get(&id.0) else {
                continue;
            };
            let p = p as *mut ibv_cq;
            // SAFETY: p is a live CQ of this channel (destroying it detaches
            // it first); the out-pointers are the caller's.
            unsafe {
                *cq = p;
                *cq_context = (*p).cq_context;
            }
            return 0;
        }
    })
}
