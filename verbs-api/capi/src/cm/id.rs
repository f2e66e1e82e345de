//! Ids: `IdPriv` (`struct rdma_cm_id`, roxe's `CmId` and what librdmacm's
//! `cma_id_private` keeps), the registry that finds an id by its roxe id
//! (for its events) and tells live ids from other pointers,
//! `rdma_create_id`, `rdma_destroy_id`, the steps that bind, resolve and
//! listen, `rdma_migrate_id` and `rdma_set_option`.

use super::addr::{from_sockaddr, gid, to_storage};
use super::event::{ack, channel_ref, complete, free_channel, new_channel};
use crate::abi::*;
use crate::device::{shared_device, SharedDevice};
use crate::{fail_minus_one, guard};
use parking_lot::{Condvar, Mutex};
use roxe_verbs::cm::{CmId, PortSpace};
use std::collections::{HashMap, HashSet};
use std::ffi::{c_int, c_void};
use std::mem::{size_of, zeroed};
use std::ptr::{self, null_mut};
use std::sync::atomic::{AtomicBool, Ordering};

/// CMA_IBOE_PACKET_LIFETIME of the kernel's rdma_cm.
const IBOE_PACKET_LIFETIME: u8 = 16;

/// Events reported to the user for an id, and how many were acknowledged.
#[derive(Default)]
struct EventCounts {
    reported: u64,
    completed: u64,
}

/// What librdmacm's `cma_id_private` keeps beside the public id.
pub(super) struct IdExtra {
    pub(super) dev: Option<SharedDevice>,
    /// `rdma_create_ep` of a passive id: the QP each request gets.
    pub(super) qp_init_attr: Option<ibv_qp_init_attr>,
    pub(super) responder_resources: u8,
    pub(super) initiator_depth: u8,
    pub(super) local_ece: [u32; 2],
}

/// `struct rdma_cm_id` and roxe's id behind it.
#[repr(C)]
pub(super) struct IdPriv {
    pub(super) id: rdma_cm_id,
    pub(super) cm: CmId,
    /// Created without a channel: owns `id.channel`, and its calls wait
    /// for their event.
    pub(super) sync: AtomicBool,
    events: Mutex<EventCounts>,
    acked: Condvar,
    /// `id.route.path_rec` points here.
    path: Box<ibv_sa_path_rec>,
    pub(super) extra: Mutex<IdExtra>,
}

impl IdPriv {
    /// One event reported for the id is acknowledged.
    pub(super) fn count_ack(&self) {
        self.events.lock().completed += 1;
        self.acked.notify_all();
    }

    /// Wait until every event reported for the id is acknowledged.
    fn wait_acked(&self) {
        let mut n = self.events.lock();
        while n.completed < n.reported {
            self.acked.wait(&mut n);
        }
    }
}

/// Acknowledge the event a synchronous call left in `id->event`, if any
/// (the next call, or the id's end, replaces it).
///
/// # Safety
/// `p` is a live id; its C fields are written by the calling thread only
/// (librdmacm's contract).
pub(super) unsafe fn ack_pending(p: *mut IdPriv) {
    // SAFETY: per the contract.
    let ev = unsafe { std::mem::replace(&mut (*p).id.event, null_mut()) };
    if !ev.is_null() {
        // SAFETY: the id's own event from rdma_get_cm_event, not yet
        // acknowledged (it is taken out of id->event once).
        unsafe { ack(ev) };
    }
}

/// Every live id by its roxe id's key, so events find their C id.
static IDS: Mutex<Option<HashMap<usize, usize>>> = Mutex::new(None);
/// Every live id's address: a pointer a program passes that is not one
/// (destroyed, or never an id: perftest 4.5 retries a rejected connect on
/// a freed id) is refused with EINVAL instead of being dereferenced.
static LIVE: Mutex<Option<HashSet<usize>>> = Mutex::new(None);

/// Enter a new id in the registry.
///
/// # Safety
/// `p` is a live id just created.
unsafe fn register(p: *mut IdPriv) {
    // SAFETY: p is a live id just created.
    let key = unsafe { (*p).cm.key() };
    IDS.lock()
        .get_or_insert_with(HashMap::new)
        .insert(key, p as usize);
    LIVE.lock()
        .get_or_insert_with(HashSet::new)
        .insert(p as usize);
}

/// The C id of `cm`, with one more event reported for it (under the
/// registry lock, so a concurrent `rdma_destroy_id` waits for its ack).
pub(super) fn lookup_and_count(cm: &CmId) -> Option<*mut IdPriv> {
    let ids = IDS.lock();
    let p = *ids.as_ref()?.get(&cm.key())? as *mut IdPriv;
    // SAFETY: registered ids are live until removed under this lock.
    unsafe { (*p).events.lock().reported += 1 };
    Some(p)
}

/// The id behind `id`, if it is a live id of this library (`None` for
/// NULL, a destroyed id or any other pointer: `id` is only compared).
pub(super) fn id_priv(id: *mut rdma_cm_id) -> Option<*mut IdPriv> {
    let live = LIVE.lock();
    live.as_ref()?.contains(&(id as usize)).then_some(id.cast())
}

/// The port space of `enum rdma_port_space`.
fn port_space(ps: u32) -> Option<PortSpace> {
    match ps {
        RDMA_PS_TCP => Some(PortSpace::Tcp),
        RDMA_PS_UDP => Some(PortSpace::Udp),
        RDMA_PS_IB => Some(PortSpace::Ib),
        _ => None,
    }
}

/// A new id on `channel` (a channel of its own when NULL: synchronous).
///
/// # Safety
/// `channel` must be NULL or a live channel of this library.
pub(super) unsafe fn new_id(
    channel: *mut rdma_event_channel,
    cm: Option<CmId>,
    context: *mut c_void,
    ps: u32,
    qp_type: u32,
) -> Result<*mut IdPriv, i32> {
    let space = port_space(ps).ok_or(libc::EINVAL)?;
    let (channel, sync) = if channel.is_null() {
        (new_channel()?, true)
    } else {
        (channel, false)
    };
    // SAFETY: only compared unless live.
    let Some(ch) = (unsafe { channel_ref(channel) }) else {
        return Err(libc::EINVAL);
    };
    let cm = match cm {
        Some(cm) => {
            if sync {
                cm.migrate(&ch.ch);
            }
            cm
        }
        None => CmId::new(&ch.ch, space),
    };
    // SAFETY: ibv_sa_path_rec and rdma_cm_id are pointers and integers:
    // all-zero is valid (NULL pointers).
    let (path, mut id): (ibv_sa_path_rec, rdma_cm_id) = unsafe { (zeroed(), zeroed()) };
    id.channel = channel;
    id.context = context;
    id.ps = ps;
    id.qp_type = qp_type;
    let p = Box::into_raw(Box::new(IdPriv {
        id,
        cm,
        sync: AtomicBool::new(sync),
        events: Mutex::new(EventCounts::default()),
        acked: Condvar::new(),
        path: Box::new(path),
        extra: Mutex::new(IdExtra {
            dev: None,
            qp_init_attr: None,
            responder_resources: 0,
            initiator_depth: 0,
            local_ece: [0; 2],
        }),
    }));
    // SAFETY: p was just created.
    unsafe { register(p) };
    Ok(p)
}

/// Fill what librdmacm fills once an id has a device (`ucma_get_device`)
/// and its addresses (`ucma_query_route`): verbs, pd, port, route.
///
/// # Safety
/// `p` must be a live id.
pub(super) unsafe fn refresh(p: *mut IdPriv) -> Result<(), i32> {
    // SAFETY: per the contract. Field by field: other threads read the
    // Rust fields (`cm`, `extra`, `events`) through shared references,
    // while the C fields (`id`, the path record) are written only by the
    // thread calling into the id, as librdmacm does.
    let (cm, extra, id, path) = unsafe { (&(*p).cm, &(*p).extra, &mut (*p).id, &mut *(*p).path) };
    if let Some(ctx) = cm.context() {
        let mut extra = extra.lock();
        let dev = match extra.dev {
            Some(d) => d,
            None => {
                let d = shared_device(&ctx)?;
                extra.dev = Some(d);
                id.pd = d.pd;
                d
            }
        };
        id.verbs = dev.ctx;
        id.port_num = 1;
    }
    let (local, peer) = (cm.local_addr(), cm.peer_addr());
    let route = &mut id.route;
    route.addr.src_addr = to_storage(local).0;
    route.addr.dst_addr = to_storage(peer).0;
    if let Some(l) = local {
        route.addr.addr.sgid = gid(l.ip());
    }
    if let Some(r) = peer {
        route.addr.addr.dgid = gid(r.ip());
    }
    route.addr.addr.pkey = 0xffff;
    if let (Some(l), Some(r)) = (local, peer) {
        path.dgid = gid(r.ip());
        path.sgid = gid(l.ip());
        path.pkey = 0xffffu16.to_be();
        path.hop_limit = 64;
        path.reversible = 1;
        path.numb_path = 1;
        path.mtu_selector = 2;
        path.mtu = cm
            .context()
            .and_then(|c| c.query_port(1).ok())
            .map_or(3, |a| a.active_mtu as u8);
        path.rate_selector = 2;
        path.rate = 3;
        path.packet_life_time_selector = 2;
        path.packet_life_time = IBOE_PACKET_LIFETIME;
        route.path_rec = ptr::addr_of_mut!(*path);
        route.num_paths = 1;
    }
    Ok(())
}

/// Keep `id->qp->state` what roxe's QP is in after the CM moved it.
///
/// # Safety
/// `p` must be a live id.
pub(super) unsafe fn sync_qp_state(p: *mut IdPriv) {
    // SAFETY: per the contract.
    let p = unsafe { &*p };
    if p.id.qp.is_null() {
        return;
    }
    if let Some(a) = p.cm.qp().and_then(|q| q.query().ok()) {
        // SAFETY: id.qp is the id's live QP.
        unsafe { (*p.id.qp).state = a.qp_state as u32 };
    }
}

/// # Safety
/// `channel` is NULL or any pointer (only a live channel of this library
/// is used); `id` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_id(
    channel: *mut rdma_event_channel,
    id: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: u32,
) -> c_int {
    guard(-1, || {
        if id.is_null() {
            return fail_minus_one(libc::EINVAL);
        }
        let qp_type = if ps == RDMA_PS_UDP || ps == RDMA_PS_IPOIB {
            IBV_QPT_UD
        } else {
            IBV_QPT_RC
        };
        // SAFETY: channel is NULL or the caller's live channel.
        match unsafe { new_id(channel, None, context, ps, qp_type) } {
            Ok(p) => {
                // SAFETY: id is the caller's out-pointer.
                unsafe { *id = p.cast() };
                0
            }
            Err(e) => fail_minus_one(e),
        }
    })
}

/// Waits until the events reported for the id are acknowledged.
///
/// # Safety
/// `id` is NULL or any pointer (only a live id of this library is used: the
/// rest are EINVAL); a live id is not destroyed during the call; it is not used
/// again.
#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_id(id: *mut rdma_cm_id) -> c_int {
    guard(-1, || {
        let Some(p) = id_priv(id) else {
            return fail_minus_one(libc::EINVAL);
        };
        // SAFETY: p is live until freed below.
        unsafe { destroy(p) };
        0
    })
}

/// Unregister `p`, wait until every event reported for it is
/// acknowledged (librdmacm's contract), then free it.
///
/// # Safety
/// `p` must be a live id; nothing uses it afterwards.
pub(super) unsafe fn destroy(p: *mut IdPriv) {
    // SAFETY: per the contract.
    let key = unsafe { (*p).cm.key() };
    if let Some(ids) = IDS.lock().as_mut() {
        ids.remove(&key);
    }
    if let Some(live) = LIVE.lock().as_mut() {
        live.remove(&(p as usize));
    }
    // SAFETY: per the contract.
    unsafe { ack_pending(p) };
    // SAFETY: per the contract.
    unsafe { &*p }.wait_acked();
    // SAFETY: created by new_id (Box); unregistered, so no event can reach
    // it any more.
    let b = unsafe { Box::from_raw(p) };
    let (channel, sync) = (b.id.channel, b.sync.load(Ordering::Acquire));
    drop(b);
    if sync {
        // SAFETY: a synchronous id's own channel, used by nothing else.
        unsafe { free_channel(channel) };
    }
}

/// One CM step of an id, as librdmacm's verbs do it: `op` on roxe's id,
/// then the public fields refreshed (device, addresses, path); a
/// synchronous id then waits for the step's event when `waits`.
///
/// # Safety
/// `id` must be NULL or a live id of this library.
unsafe fn id_step(
    id: *mut rdma_cm_id,
    waits: bool,
    op: impl FnOnce(&CmId) -> roxe_verbs::Result<()>,
) -> c_int {
    let Some(p) = id_priv(id) else {
        return fail_minus_one(libc::EINVAL);
    };
    // SAFETY: p is live.
    if let Err(e) = op(unsafe { &(*p).cm }) {
        return fail_minus_one(e.errno());
    }
    // SAFETY: p is live.
    if let Err(e) = unsafe { refresh(p) } {
        return fail_minus_one(e);
    }
    if waits {
        // SAFETY: p is live.
        unsafe { complete(p) }
    } else {
        0
    }
}

/// # Safety
/// `id` is NULL or any pointer (only a live id of this library is used: the
/// rest are EINVAL); a live id is not destroyed during the call; `addr` is NULL
/// or a sockaddr of its family's size.
#[no_mangle]
pub unsafe extern "C" fn rdma_bind_addr(id: *mut rdma_cm_id, addr: *mut libc::sockaddr) -> c_int {
    guard(-1, || {
        // SAFETY: addr is the caller's.
        let Some(sa) = (unsafe { from_sockaddr(addr) }) else {
            return fail_minus_one(libc::EINVAL);
        };
        // SAFETY: id NULL or ours.
        unsafe { id_step(id, false, |cm| cm.bind_addr(sa)) }
    })
}

/// # Safety
/// `id` is NULL or any pointer (only a live id of this library is used: the
/// rest are EINVAL); a live id is not destroyed during the call; the addresses
/// are NULL or sockaddrs of their family's size.
#[no_mangle]
pub unsafe extern "C" fn rdma_resolve_addr(
    id: *mut rdma_cm_id,
    src_addr: *mut libc::sockaddr,
    dst_addr: *mut libc::sockaddr,
    _timeout_ms: c_int,
) -> c_int {
    guard(-1, || {
        // SAFETY: the addresses are the caller's.
        let (src, Some(dst)) = (unsafe { from_sockaddr(src_addr) }, unsafe {
            from_sockaddr(dst_addr)
        }) else {
            return fail_minus_one(libc::EINVAL);
        };
        // SAFETY: id NULL or ours.
        unsafe { id_step(id, true, |cm| cm.resolve_addr(src, dst)) }
    })
}

/// # Safety
/// `id` is NULL or any pointer (only a live id of this library is used:
/// the rest are EINVAL); a live id is not destroyed during the call.
#[no_mangle]
pub unsafe extern "C" fn rdma_resolve_route(id: *mut rdma_cm_id, _timeout_ms: c_int) -> c_int {
    // SAFETY: id NULL or ours.
    guard(-1, || unsafe { id_step(id, true, CmId::resolve_route) })
}

/// # Safety
/// `id` is NULL or any pointer (only a live id of this library is used:
/// the rest are EINVAL); a live id is not destroyed during the call.
#[no_mangle]
pub unsafe extern "C" fn rdma_listen(id: *mut rdma_cm_id, backlog: c_int) -> c_int {
    // SAFETY: id NULL or ours.
    guard(-1, || unsafe {
        id_step(id, false, |cm| cm.listen(backlog))
    })
}

/// Move the id to `channel` (a channel of its own, synchronous, for
/// NULL); waits until the events reported for it are acknowledged.
///
/// # Safety
/// `id` is NULL or any pointer (only a live id of this library is used: the
/// rest are EINVAL); a live id is not destroyed during the call; `channel` is
/// NULL or any pointer (only a live channel of this library is used).
#[no_mangle]
pub unsafe extern "C" fn rdma_migrate_id(
    id: *mut rdma_cm_id,
    channel: *mut rdma_event_channel,
) -> c_int {
    guard(-1, || {
        let Some(p) = id_priv(id) else {
            return fail_minus_one(libc::EINVAL);
        };
        // Shared references to the Rust fields (other threads ack events
        // through them), raw writes to the C fields.
        // SAFETY: p is live.
        let pr = unsafe { &*p };
        let was_sync = pr.sync.load(Ordering::Acquire);
        if was_sync && channel.is_null() {
            return fail_minus_one(libc::EINVAL);
        }
        let (channel, sync) = if channel.is_null() {
            match new_channel() {
                Ok(c) => (c, true),
                Err(e) => return fail_minus_one(e),
            }
        } else {
            (channel, false)
        };
        // SAFETY: only compared unless live.
        let Some(ch) = (unsafe { channel_ref(channel) }) else {
            return fail_minus_one(libc::EINVAL);
        };
        pr.cm.migrate(&ch.ch);
        // SAFETY: p is live; its C fields are written by this caller only.
        let old = unsafe { std::mem::replace(&mut (*p).id.channel, channel) };
        if was_sync {
            // SAFETY: as above; the pending event is the id's own, and the
            // old channel the id's own, now unused.
            unsafe {
                ack_pending(p);
                free_channel(old);
            }
        }
        pr.sync.store(sync, Ordering::Release);
        pr.wait_acked();
        0
    })
}

/// # Safety
/// `id` is NULL or any pointer (only a live id of this library is used: the
/// rest are EINVAL); a live id is not destroyed during the call; `optval` is
/// NULL or holds `optlen` bytes.
#[no_mangle]
pub unsafe extern "C" fn rdma_set_option(
    id: *mut rdma_cm_id,
    level: c_int,
    optname: c_int,
    optval: *mut c_void,
    optlen: usize,
) -> c_int {
    guard(-1, || {
        let Some(p) = id_priv(id) else {
            return fail_minus_one(libc::EINVAL);
        };
        if optval.is_null() {
            return fail_minus_one(libc::EINVAL);
        }
        // SAFETY: p is live.
        let cm = unsafe { &(*p).cm };
        // SAFETY: optval covers optlen bytes (checked per option below).
        let byte = || unsafe { *optval.cast::<u8>() };
        match (level, optname) {
            (RDMA_OPTION_ID, RDMA_OPTION_ID_TOS) if optlen == 1 => {
                cm.set_tos(byte());
                0
            }
            (RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT) if optlen == 1 => {
                match cm.set_ack_timeout(byte()) {
                    Ok(()) => 0,
                    Err(e) => fail_minus_one(e.errno()),
                }
            }
            // Address reuse and v6-only binding: each roxe device is one
            // address of its own, so both hold already.
            (RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR | RDMA_OPTION_ID_AFONLY)
                if optlen == size_of::<c_int>() =>
            {
                0
            }
            (RDMA_OPTION_ID, RDMA_OPTION_ID_TOS | RDMA_OPTION_ID_ACK_TIMEOUT)
            | (RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR | RDMA_OPTION_ID_AFONLY) => {
                fail_minus_one(libc::EINVAL)
            }
            // Path records come from the SA on InfiniBand; RoCE resolves
            // routes from IP, as the kernel's rdma_cm does for RoCE ids.
            (RDMA_OPTION_IB, RDMA_OPTION_IB_PATH) => fail_minus_one(libc::EINVAL),
            _ => fail_minus_one(libc::ENOSYS),
        }
    })
}
