//! Event channels (`RoxeEventChannel`: `rdma_event_channel` and roxe's
//! `EventChannel`, whose fd is the channel's, so O_NONBLOCK and poll
//! work), events (`EventPriv`: `rdma_cm_event` and the private data it
//! points into), `rdma_get_cm_event`, `rdma_ack_cm_event`,
//! `rdma_event_str`, and a synchronous id's wait for its event.

use super::id::{ack_pending, lookup_and_count, new_id, refresh, sync_qp_state, IdPriv};
use crate::abi::*;
use crate::{fail_minus_one, fail_null, guard};
use parking_lot::Mutex;
use roxe_verbs::cm::{Event, EventChannel, EventKind};
use std::collections::HashSet;
use std::ffi::{c_char, c_int, c_void};
use std::mem::zeroed;
use std::os::fd::{AsFd, AsRawFd};
use std::ptr::{self, null_mut};
use std::sync::atomic::Ordering;

/// `struct rdma_event_channel` and the roxe channel behind it.
#[repr(C)]
pub(super) struct RoxeEventChannel {
    c: rdma_event_channel,
    pub(super) ch: EventChannel,
}

/// Every live channel's address: a destroyed or foreign pointer (perftest
/// 4.5 destroys its channel twice after a rejected connect) is refused,
/// never dereferenced or freed again.
static LIVE_CHANNELS: Mutex<Option<HashSet<usize>>> = Mutex::new(None);

/// A new channel of this library.
pub(super) fn new_channel() -> Result<*mut rdma_event_channel, c_int> {
    let ch = EventChannel::new().map_err(|e| e.errno())?;
    let fd = ch.as_fd().as_raw_fd();
    let b = Box::new(RoxeEventChannel {
        c: rdma_event_channel { fd },
        ch,
    });
    let p: *mut rdma_event_channel = Box::into_raw(b).cast();
    LIVE_CHANNELS
        .lock()
        .get_or_insert_with(HashSet::new)
        .insert(p as usize);
    Ok(p)
}

/// The channel behind `c` if it is a live channel of this library (`c` is
/// only compared unless it is).
///
/// # Safety
/// A live `c` stays live for `'a` (librdmacm's contract: a channel is
/// destroyed only once nothing uses it).
pub(super) unsafe fn channel_ref<'a>(c: *mut rdma_event_channel) -> Option<&'a RoxeEventChannel> {
    if !LIVE_CHANNELS
        .lock()
        .as_ref()
        .is_some_and(|l| l.contains(&(c as usize)))
    {
        return None;
    }
    // SAFETY: a live channel: c is the first member of a RoxeEventChannel.
    unsafe { c.cast::<RoxeEventChannel>().as_ref() }
}

/// Free a channel of this library no id uses any more; false (nothing
/// done) for a pointer that is not a live channel.
///
/// # Safety
/// If live, no id uses `c` any more (librdmacm's contract).
pub(super) unsafe fn free_channel(c: *mut rdma_event_channel) -> bool {
    let was_live = LIVE_CHANNELS
        .lock()
        .as_mut()
        .is_some_and(|l| l.remove(&(c as usize)));
    if was_live {
        // SAFETY: live, so created by new_channel and not yet freed.
        drop(unsafe { Box::from_raw(c.cast::<RoxeEventChannel>()) });
    }
    was_live
}

#[no_mangle]
pub extern "C" fn rdma_create_event_channel() -> *mut rdma_event_channel {
    guard(null_mut(), || new_channel().unwrap_or_else(fail_null))
}

/// EINVAL (in errno) for a pointer that is no live channel.
///
/// # Safety
/// No id uses `channel` any more (librdmacm's contract).
#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_event_channel(channel: *mut rdma_event_channel) {
    guard((), || {
        // SAFETY: the caller destroys a channel whose ids are gone
        // (librdmacm's contract); anything else is refused.
        if !channel.is_null() && !unsafe { free_channel(channel) } {
            crate::set_errno(libc::EINVAL);
        }
    })
}

/// Wait for a synchronous id's event (librdmacm's `ucma_complete`): it
/// stays in `id->event`; a failure status becomes the errno.
///
/// # Safety
/// `p` must be a live id whose C fields only the calling thread writes.
pub(super) unsafe fn complete(p: *mut IdPriv) -> c_int {
    // SAFETY: per the contract.
    if !unsafe { (*p).sync.load(Ordering::Acquire) } {
        return 0;
    }
    // SAFETY: per the contract; the event rdma_get_cm_event hands out is
    // live until acknowledged.
    unsafe {
        ack_pending(p);
        let mut ev = null_mut();
        let r = rdma_get_cm_event((*p).id.channel, &mut ev);
        if r != 0 {
            return r;
        }
        (*p).id.event = ev;
        let (kind, status) = ((*ev).event, (*ev).status);
        if status == 0 {
            0
        } else if kind == EventKind::Rejected as u32 {
            fail_minus_one(libc::ECONNREFUSED)
        } else if status < 0 {
            fail_minus_one(-status)
        } else {
            fail_minus_one(status)
        }
    }
}

/// `struct rdma_cm_event`, the private data its param points into, and
/// the id its acknowledgement completes.
#[repr(C)]
struct EventPriv {
    ev: rdma_cm_event,
    data: Vec<u8>,
    counted: *mut IdPriv,
}

/// Acknowledge an event: free it and count it for the id it was reported
/// to.
///
/// # Safety
/// `ev` must be an event of this library not yet acknowledged.
pub(super) unsafe fn ack(ev: *mut rdma_cm_event) {
    // SAFETY: per the contract, ev came from Box<EventPriv>.
    let e = unsafe { Box::from_raw(ev.cast::<EventPriv>()) };
    // SAFETY: an id with unacknowledged events is not freed (destroy
    // waits for them).
    unsafe { &*e.counted }.count_ack();
}

/// # Safety
/// `event` is NULL or an event from `rdma_get_cm_event`, acknowledged
/// once.
#[no_mangle]
pub unsafe extern "C" fn rdma_ack_cm_event(event: *mut rdma_cm_event) -> c_int {
    guard(-1, || {
        if event.is_null() {
            return fail_minus_one(libc::EINVAL);
        }
        // SAFETY: the caller acknowledges an event we handed out, once.
        unsafe { ack(event) };
        0
    })
}

/// The next event of the channel; blocking unless the program made the
/// channel's fd non-blocking (then -1 with EAGAIN when none is pending).
///
/// # Safety
/// `channel` is NULL or a channel of this library, not destroyed during
/// the call; `event` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rdma_get_cm_event(
    channel: *mut rdma_event_channel,
    event: *mut *mut rdma_cm_event,
) -> c_int {
    guard(-1, || {
        // SAFETY: channel NULL or ours.
        let Some(ch) = (unsafe { channel_ref(channel) }) else {
            return fail_minus_one(libc::EINVAL);
        };
        if event.is_null() {
            return fail_minus_one(libc::EINVAL);
        }
        loop {
            // Blocks unless the program made the fd non-blocking (EAGAIN).
            let ev = match ch.ch.get_event() {
                Ok(ev) => ev,
                Err(e) => return fail_minus_one(e.errno()),
            };
            // SAFETY: channel is live.
            if let Some(e) = unsafe { convert(ev, channel) } {
                // SAFETY: event is the caller's out-pointer.
                unsafe { *event = e };
                return 0;
            }
        }
    })
}

/// The C event for `ev`: a connection request gets its new id here (as
/// `ucma_process_conn_req` does). None: the id is gone (event dropped).
///
/// # Safety
/// `channel` must be the live channel `ev` came from.
unsafe fn convert(ev: Event, channel: *mut rdma_event_channel) -> Option<*mut rdma_cm_event> {
    let (target, listen, counted) = if ev.kind == EventKind::ConnectRequest {
        let listener = lookup_and_count(ev.listen_id.as_ref()?)?;
        // SAFETY: listener is live (it has an unacknowledged event).
        let l = unsafe { &*listener };
        let sync = l.sync.load(Ordering::Acquire);
        let ch = if sync { null_mut() } else { channel };
        // SAFETY: ch is NULL or the live channel.
        let child =
            match unsafe { new_id(ch, Some(ev.id.clone()), l.id.context, l.id.ps, l.id.qp_type) } {
                Ok(c) => c,
                Err(_) => {
                    // The request is dropped: give back the event
                    // lookup_and_count counted for the listener.
                    l.count_ack();
                    return None;
                }
            };
        // SAFETY: child is live and not yet visible to the program.
        unsafe {
            let _ = refresh(child);
            let mut x = (*child).extra.lock();
            x.responder_resources = ev.param.responder_resources;
            x.initiator_depth = ev.param.initiator_depth;
        }
        (child, listener, listener)
    } else {
        let p = lookup_and_count(&ev.id)?;
        // SAFETY: p is live (it has an unacknowledged event).
        unsafe { sync_qp_state(p) };
        (p, null_mut(), p)
    };
    // SAFETY: target is live.
    let qp_type = unsafe { (*target).id.qp_type };
    let data = match &ev.ud {
        Some(ud) => ud.private_data.clone(),
        None => ev.param.private_data.clone(),
    };
    // SAFETY: rdma_cm_event is pointers and integers: all-zero is valid.
    let mut c: rdma_cm_event = unsafe { zeroed() };
    c.id = target.cast();
    c.listen_id = listen.cast();
    c.event = ev.kind as u32;
    c.status = ev.status;
    let mut b = Box::new(EventPriv {
        ev: c,
        data,
        counted,
    });
    let (pd, len) = if b.data.is_empty() {
        (ptr::null(), 0)
    } else {
        (
            b.data.as_ptr().cast::<c_void>(),
            b.data.len().min(255) as u8,
        )
    };
    if let (Some(ud), true) = (&ev.ud, qp_type == IBV_QPT_UD) {
        b.ev.param.ud = rdma_ud_param {
            private_data: pd,
            private_data_len: len,
            ah_attr: crate::abi::convert::av_to_c(&ud.ah_attr),
            qp_num: ud.qp_num,
            qkey: ud.qkey,
        };
    } else {
        let p = &ev.param;
        b.ev.param.conn = rdma_conn_param {
            private_data: pd,
            private_data_len: len,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            flow_control: 0,
            retry_count: p.retry_count,
            rnr_retry_count: p.rnr_retry_count,
            srq: u8::from(p.srq),
            qp_num: p.qp_num,
        };
    }
    Some(Box::into_raw(b).cast())
}

/// The name of an `enum rdma_cm_event_type` value.
#[no_mangle]
pub extern "C" fn rdma_event_str(event: u32) -> *const c_char {
    let s = match event {
        0 => c"RDMA_CM_EVENT_ADDR_RESOLVED",
        1 => c"RDMA_CM_EVENT_ADDR_ERROR",
        2 => c"RDMA_CM_EVENT_ROUTE_RESOLVED",
        3 => c"RDMA_CM_EVENT_ROUTE_ERROR",
        4 => c"RDMA_CM_EVENT_CONNECT_REQUEST",
        5 => c"RDMA_CM_EVENT_CONNECT_RESPONSE",
        6 => c"RDMA_CM_EVENT_CONNECT_ERROR",
        7 => c"RDMA_CM_EVENT_UNREACHABLE",
        8 => c"RDMA_CM_EVENT_REJECTED",
        9 => c"RDMA_CM_EVENT_ESTABLISHED",
        10 => c"RDMA_CM_EVENT_DISCONNECTED",
        11 => c"RDMA_CM_EVENT_DEVICE_REMOVAL",
        12 => c"RDMA_CM_EVENT_MULTICAST_JOIN",
        13 => c"RDMA_CM_EVENT_MULTICAST_ERROR",
        14 => c"RDMA_CM_EVENT_ADDR_CHANGE",
        15 => c"RDMA_CM_EVENT_TIMEWAIT_EXIT",
        _ => c"UNKNOWN EVENT",
    };
    s.as_ptr()
}
