//! Async events: the pipe behind `context->async_fd`, the sink that writes
//! a device's QP events into it as `ibv_async_event` records (with the
//! context's `ibv_qp*`), `ibv_get_async_event` and `ibv_ack_async_event`.
//! roxe raises `IBV_EVENT_SQ_DRAINED` and `IBV_EVENT_QP_LAST_WQE_REACHED`.
//! An event whose QP was destroyed before it was read is dropped, and
//! `ibv_destroy_qp` waits for the acknowledgement of every event handed
//! out for its QP, as libibverbs over the kernel's uverbs does.

use crate::abi::*;
use crate::context::context;
use crate::object::count_acked_events;
use crate::{fail_minus_one, guard, last_errno};
use parking_lot::Mutex;
use roxe_provider::driver::EventSink;
use roxe_provider::engine::QpEvent;
use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::mem::size_of;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr;
use std::sync::Arc;

/// The size of the records the pipe carries.
const RECORD: usize = size_of::<ibv_async_event>();
const _: () = assert!(RECORD == 16);

/// Whether an event (`enum ibv_event_type`) names a QP:
/// `IBV_EVENT_QP_FATAL` (1) to `IBV_EVENT_PATH_MIG_ERR` (7) and
/// `IBV_EVENT_QP_LAST_WQE_REACHED` (16).
fn names_qp(event_type: u32) -> bool {
    matches!(event_type, 1..=7 | 16)
}

/// Whether an event names an object (a CQ, QP, SRQ or WQ:
/// `IBV_EVENT_CQ_ERR` (0), the QP events, `IBV_EVENT_SRQ_ERR` (14),
/// `IBV_EVENT_SRQ_LIMIT_REACHED` (15), `IBV_EVENT_WQ_FATAL` (19)) rather
/// than the device or a port.
fn names_object(event_type: u32) -> bool {
    matches!(event_type, 0..=7 | 14..=16 | 19)
}

/// The async event pipe: the read end blocking (programs may make it
/// non-blocking themselves), the write end non-blocking so the progress
/// thread never waits on a program that does not read its events.
pub(crate) fn pipe() -> Result<(OwnedFd, OwnedFd), c_int> {
    let mut fds = [0 as c_int; 2];
    // SAFETY: pipe2 writes two fds into the 2-element array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(last_errno());
    }
    // SAFETY: pipe2 just returned these two fds, owned by nobody else.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: fcntl on an fd we own; F_SETFL takes an int flag argument.
    if unsafe { libc::fcntl(w.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) } != 0 {
        return Err(last_errno());
    }
    Ok((r, w))
}

/// The sink that turns a device's QP events into `ibv_async_event`
/// records on the context's pipe (QPs of other contexts are skipped).
pub(crate) fn sink(write: OwnedFd, qps: Arc<Mutex<HashMap<u32, usize>>>) -> Arc<EventSink> {
    Arc::new(move |ev: QpEvent| {
        let Some(&qp) = qps.lock().get(&ev.qpn) else {
            return;
        };
        let rec = ibv_async_event {
            element: qp as *mut c_void,
            event_type: ev.event_type,
        };
        // SAFETY: writes the 16 bytes of `rec` (plain data) to our own
        // non-blocking pipe; a full pipe drops the event, as a kernel
        // event queue overflow would.
        let _ = unsafe { libc::write(write.as_raw_fd(), ptr::addr_of!(rec).cast(), RECORD) };
    })
}

/// `ibv_get_async_event`: blocks on the context's async fd (or fails with
/// EAGAIN when the program made it non-blocking).
///
/// # Safety
/// `ctx` is NULL or an open context (of this library or the system's);
/// `event` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_async_event(
    ctx: *mut ibv_context,
    event: *mut ibv_async_event,
) -> c_int {
    crate::passthrough::pass_through!(
        context ctx,
        "ibv_get_async_event",
        fn(*mut ibv_context, *mut ibv_async_event) -> c_int,
        (ctx, event),
        libc::EOPNOTSUPP
    );
    guard(-1, || {
        // SAFETY: ctx is NULL or an open context.
        let Some(c) = (unsafe { context(ctx) }) else {
            return fail_minus_one(libc::EINVAL);
        };
        if event.is_null() {
            return fail_minus_one(libc::EINVAL);
        }
        loop {
            let mut rec = [0u8; RECORD];
            // SAFETY: reading into a RECORD-byte stack buffer from our own
            // pipe.
            let n =
                unsafe { libc::read(c.async_read.as_raw_fd(), rec.as_mut_ptr().cast(), RECORD) };
            if n != RECORD as isize {
                // errno is read's (EAGAIN on a non-blocking pipe).
                return -1;
            }
            // SAFETY: the pipe carries whole ibv_async_event records
            // (written by `sink`).
            let ev: ibv_async_event = unsafe { ptr::read_unaligned(rec.as_ptr().cast()) };
            if names_qp(ev.event_type) && !handed_out_for_live_qp(&c.qps, ev.element) {
                // Its QP was destroyed before the program read the event:
                // dropped, as the kernel drops a destroyed QP's unread
                // events, rather than handing out a freed pointer.
                continue;
            }
            // SAFETY: event is the caller's.
            unsafe { event.write(ev) };
            return 0;
        }
    })
}

/// Whether `element` is a QP of this context that is still live, counting
/// the event about to be handed out for it (`ibv_destroy_qp` waits for its
/// acknowledgement). Under the QP map's lock, which `ibv_destroy_qp` takes
/// to remove the QP before it reads the count.
fn handed_out_for_live_qp(qps: &Mutex<HashMap<u32, usize>>, element: *mut c_void) -> bool {
    let qps = qps.lock();
    if !qps.values().any(|&p| p == element as usize) {
        return false;
    }
    // SAFETY: the map holds only live `RoxeQp`s (inserted at create,
    // removed under this lock before destroy frees them), and a QP's
    // public struct is its container's address.
    let qp = unsafe { &*element.cast::<crate::qp::RoxeQp>() };
    qp.async_events_returned
        .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    true
}

/// QP events count in `qp->events_completed` (under `qp->mutex`), as in
/// libibverbs.
///
/// # Safety
/// `event` is NULL or a record from `ibv_get_async_event`, whose object is
/// still live.
#[no_mangle]
pub unsafe extern "C" fn ibv_ack_async_event(event: *mut ibv_async_event) {
    // SAFETY: event is NULL or the caller's record from
    // ibv_get_async_event.
    let Some(ev) = (unsafe { event.as_ref() }) else {
        return;
    };
    // Events naming an object of a real device go back to the system
    // library; device and port events need no ack.
    crate::passthrough::pass_through!(
        // SAFETY: an object event names a live object.
        names_object(ev.event_type) && unsafe { crate::passthrough::is_system_object(ev.element) },
        "ibv_ack_async_event",
        fn(*mut ibv_async_event) -> (),
        (event),
        ()
    );
    if names_qp(ev.event_type) && !ev.element.is_null() {
        let qp = ev.element.cast::<ibv_qp>();
        // SAFETY: QP events name a live QP (programs ack before destroying
        // it); its mutex and cond were initialised at create.
        unsafe {
            count_acked_events(
                ptr::addr_of_mut!((*qp).mutex),
                ptr::addr_of_mut!((*qp).cond),
                ptr::addr_of_mut!((*qp).events_completed),
                1,
            )
        }
    }
}
