//! The drop-in `librdmacm.so.1`: rdma-core 44's `<rdma/rdma_cma.h>` over
//! roxe's connection manager (`roxe_verbs::cm`), in the same shared object
//! as the drop-in `libibverbs.so.1` (docs/ARCHITECTURE.md says why), so
//! `id->verbs`, `id->pd` and `id->qp` are this library's own objects and
//! the inline helpers of `<rdma/rdma_verbs.h>` work on them.
//!
//! The structure follows librdmacm's `cma.c`, with roxe's CM in the place
//! of the kernel's `rdma_ucm`: ids and events are `#[repr(C)]` containers
//! whose first member is the public struct; an id created without a
//! channel is synchronous (its calls wait for their event); an id cannot
//! be destroyed while events reported for it are not acknowledged.

use crate::abi::*;
use crate::device::{all_shared_devices, shared_device, SharedDevice};
use crate::{guard, set_errno};
use parking_lot::{Condvar, Mutex};
use roxe_verbs::cm::{CmId, ConnParam, Event, EventChannel, EventKind, PortSpace};
use roxe_verbs::QpState;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void};
use std::mem::{size_of, zeroed};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsFd, AsRawFd};
use std::ptr::{self, null_mut};
use std::sync::atomic::{AtomicBool, Ordering};

/// A verb's failure: errno set, -1 returned.
fn fail(errno: i32) -> c_int {
    set_errno(errno);
    -1
}

/// `IBV_EVENT_COMM_EST`.
const IBV_EVENT_COMM_EST: c_int = 5;
/// The REJ reason of `rdma_reject_ece` (vendor option not supported).
const REJ_VENDOR_OPTION_NOT_SUPPORTED: u16 = 35;
/// CMA_IBOE_PACKET_LIFETIME of the kernel's rdma_cm.
const IBOE_PACKET_LIFETIME: u8 = 16;

// ------------------------------------------------------------- addresses

/// A `sockaddr` from C: IPv4 or IPv6, else None.
///
/// # Safety
/// `sa` must be NULL or point to a sockaddr of its family's size.
unsafe fn from_sockaddr(sa: *const libc::sockaddr) -> Option<SocketAddr> {
    // SAFETY: per the contract.
    let family = c_int::from(unsafe { sa.as_ref() }?.sa_family);
    match family {
        libc::AF_INET => {
            // SAFETY: an AF_INET sockaddr is a sockaddr_in.
            let a = unsafe { &*sa.cast::<libc::sockaddr_in>() };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
                u16::from_be(a.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: an AF_INET6 sockaddr is a sockaddr_in6.
            let a = unsafe { &*sa.cast::<libc::sockaddr_in6>() };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(a.sin6_addr.s6_addr),
                u16::from_be(a.sin6_port),
                a.sin6_flowinfo,
                a.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// A `sockaddr_storage` holding `addr` (all zero for None) and its length.
fn to_storage(addr: Option<SocketAddr>) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain data; all-zero is AF_UNSPEC.
    let mut ss: libc::sockaddr_storage = unsafe { zeroed() };
    let len = match addr {
        None => 0,
        Some(SocketAddr::V4(a)) => {
            // SAFETY: sockaddr_storage is larger than and as aligned as
            // sockaddr_in.
            let sin = unsafe { &mut *ptr::addr_of_mut!(ss).cast::<libc::sockaddr_in>() };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = a.port().to_be();
            sin.sin_addr.s_addr = u32::from(*a.ip()).to_be();
            size_of::<libc::sockaddr_in>()
        }
        Some(SocketAddr::V6(a)) => {
            // SAFETY: as above, for sockaddr_in6.
            let sin6 = unsafe { &mut *ptr::addr_of_mut!(ss).cast::<libc::sockaddr_in6>() };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = a.port().to_be();
            sin6.sin6_addr.s6_addr = a.ip().octets();
            sin6.sin6_flowinfo = a.flowinfo();
            sin6.sin6_scope_id = a.scope_id();
            size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

fn gid(addr: IpAddr) -> ibv_gid {
    ibv_gid {
        raw: roxe_provider::engine::gid_of(addr),
    }
}

// -------------------------------------------------------------- channels

/// `struct rdma_event_channel` and the roxe channel behind it.
#[repr(C)]
struct RoxeEventChannel {
    c: rdma_event_channel,
    ch: EventChannel,
}

/// Every live channel's address: a destroyed or foreign pointer (perftest
/// 4.5 destroys its channel twice after a rejected connect) is refused,
/// never dereferenced or freed again.
static LIVE_CHANNELS: Mutex<Option<std::collections::HashSet<usize>>> = Mutex::new(None);

fn new_channel() -> Result<*mut rdma_event_channel, i32> {
    let ch = EventChannel::new().map_err(|e| e.errno())?;
    let fd = ch.as_fd().as_raw_fd();
    let b = Box::new(RoxeEventChannel {
        c: rdma_event_channel { fd },
        ch,
    });
    let p: *mut rdma_event_channel = Box::into_raw(b).cast();
    LIVE_CHANNELS
        .lock()
        .get_or_insert_with(std::collections::HashSet::new)
        .insert(p as usize);
    Ok(p)
}

/// The channel behind `c` if it is a live channel of this library.
///
/// # Safety
/// None beyond the C contract: `c` is only compared unless it is live.
unsafe fn channel_ref<'a>(c: *mut rdma_event_channel) -> Option<&'a RoxeEventChannel> {
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
unsafe fn free_channel(c: *mut rdma_event_channel) -> bool {
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
pub unsafe extern "C" fn rdma_create_event_channel() -> *mut rdma_event_channel {
    guard(null_mut(), || match new_channel() {
        Ok(c) => c,
        Err(e) => {
            set_errno(e);
            null_mut()
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_event_channel(channel: *mut rdma_event_channel) {
    guard((), || {
        // SAFETY: the caller destroys a channel whose ids are gone
        // (librdmacm's contract); anything else is refused.
        if !channel.is_null() && !unsafe { free_channel(channel) } {
            set_errno(libc::EINVAL);
        }
    })
}

// ------------------------------------------------------------------- ids

/// Events reported to the user for an id, and how many were acknowledged.
#[derive(Default)]
struct EventCounts {
    reported: u64,
    completed: u64,
}

/// What librdmacm's `cma_id_private` keeps beside the public id.
struct IdExtra {
    dev: Option<SharedDevice>,
    /// `rdma_create_ep` of a passive id: the QP each request gets.
    qp_init_attr: Option<ibv_qp_init_attr>,
    responder_resources: u8,
    initiator_depth: u8,
    local_ece: [u32; 2],
}

/// `struct rdma_cm_id` and roxe's id behind it.
#[repr(C)]
struct IdPriv {
    id: rdma_cm_id,
    cm: CmId,
    /// Created without a channel: owns `id.channel`, and its calls wait
    /// for their event.
    sync: AtomicBool,
    events: Mutex<EventCounts>,
    acked: Condvar,
    /// `id.route.path_rec` points here.
    path: Box<ibv_sa_path_rec>,
    extra: Mutex<IdExtra>,
}

/// Every live id by its roxe id's key, so events find their C id.
static IDS: Mutex<Option<HashMap<usize, usize>>> = Mutex::new(None);
/// Every live id's address: a pointer a program passes that is not one
/// (destroyed, or never an id: perftest 4.5 retries a rejected connect on
/// a freed id) is refused with EINVAL instead of being dereferenced.
static LIVE: Mutex<Option<std::collections::HashSet<usize>>> = Mutex::new(None);

fn register(p: *mut IdPriv) {
    // SAFETY: p is a live id just created.
    let key = unsafe { (*p).cm.key() };
    IDS.lock()
        .get_or_insert_with(HashMap::new)
        .insert(key, p as usize);
    LIVE.lock()
        .get_or_insert_with(std::collections::HashSet::new)
        .insert(p as usize);
}

/// The C id of `cm`, with one more event reported for it (under the
/// registry lock, so a concurrent `rdma_destroy_id` waits for its ack).
fn lookup_and_count(cm: &CmId) -> Option<*mut IdPriv> {
    let ids = IDS.lock();
    let p = *ids.as_ref()?.get(&cm.key())? as *mut IdPriv;
    // SAFETY: registered ids are live until removed under this lock.
    unsafe { (*p).events.lock().reported += 1 };
    Some(p)
}

/// The id behind `id`, if it is a live id of this library (`None` for
/// NULL, a destroyed id or any other pointer).
///
/// # Safety
/// None beyond the C contract: `id` is only compared, never read, unless
/// it is live.
unsafe fn id_priv(id: *mut rdma_cm_id) -> Option<*mut IdPriv> {
    let live = LIVE.lock();
    live.as_ref()?.contains(&(id as usize)).then_some(id.cast())
}

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
unsafe fn new_id(
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
    register(p);
    Ok(p)
}

/// Fill what librdmacm fills once an id has a device (`ucma_get_device`)
/// and its addresses (`ucma_query_route`): verbs, pd, port, route.
///
/// # Safety
/// `p` must be a live id.
unsafe fn refresh(p: *mut IdPriv) -> Result<(), i32> {
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
unsafe fn sync_qp_state(p: *mut IdPriv) {
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

#[no_mangle]
pub unsafe extern "C" fn rdma_create_id(
    channel: *mut rdma_event_channel,
    id: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: u32,
) -> c_int {
    guard(-1, || {
        if id.is_null() {
            return fail(libc::EINVAL);
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
            Err(e) => fail(e),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_id(id: *mut rdma_cm_id) -> c_int {
    guard(-1, || {
        // SAFETY: id is NULL or ours.
        let Some(p) = (unsafe { id_priv(id) }) else {
            return fail(libc::EINVAL);
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
unsafe fn destroy(p: *mut IdPriv) {
    // SAFETY: per the contract.
    let key = unsafe { (*p).cm.key() };
    if let Some(ids) = IDS.lock().as_mut() {
        ids.remove(&key);
    }
    if let Some(live) = LIVE.lock().as_mut() {
        live.remove(&(p as usize));
    }
    // SAFETY: per the contract.
    let ev = unsafe { (*p).id.event };
    if !ev.is_null() {
        // SAFETY: the id's own pending event, from rdma_get_cm_event.
        unsafe {
            (*p).id.event = null_mut();
            ack(ev);
        }
    }
    {
        // SAFETY: per the contract.
        let pr = unsafe { &*p };
        let mut n = pr.events.lock();
        while n.completed < n.reported {
            pr.acked.wait(&mut n);
        }
    }
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

/// The errno of a roxe error.
fn errno_of(e: roxe_verbs::Error) -> i32 {
    e.errno()
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
    // SAFETY: per the contract.
    let Some(p) = (unsafe { id_priv(id) }) else {
        return fail(libc::EINVAL);
    };
    // SAFETY: p is live.
    if let Err(e) = op(unsafe { &(*p).cm }) {
        return fail(errno_of(e));
    }
    // SAFETY: p is live.
    if let Err(e) = unsafe { refresh(p) } {
        return fail(e);
    }
    if waits {
        // SAFETY: p is live.
        unsafe { complete(p) }
    } else {
        0
    }
}

#[no_mangle]
pub unsafe extern "C" fn rdma_bind_addr(id: *mut rdma_cm_id, addr: *mut libc::sockaddr) -> c_int {
    guard(-1, || {
        // SAFETY: addr is the caller's.
        let Some(sa) = (unsafe { from_sockaddr(addr) }) else {
            return fail(libc::EINVAL);
        };
        // SAFETY: id NULL or ours.
        unsafe { id_step(id, false, |cm| cm.bind_addr(sa)) }
    })
}

/// Wait for a synchronous id's event (librdmacm's `ucma_complete`): it
/// stays in `id->event`; a failure status becomes the errno.
///
/// # Safety
/// `p` must be a live id.
unsafe fn complete(p: *mut IdPriv) -> c_int {
    // SAFETY: per the contract.
    if !unsafe { (*p).sync.load(Ordering::Acquire) } {
        return 0;
    }
    // SAFETY: per the contract.
    unsafe {
        let ev = (*p).id.event;
        if !ev.is_null() {
            (*p).id.event = null_mut();
            ack(ev);
        }
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
            fail(libc::ECONNREFUSED)
        } else if status < 0 {
            fail(-status)
        } else {
            fail(status)
        }
    }
}

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
            return fail(libc::EINVAL);
        };
        // SAFETY: id NULL or ours.
        unsafe { id_step(id, true, |cm| cm.resolve_addr(src, dst)) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_resolve_route(id: *mut rdma_cm_id, _timeout_ms: c_int) -> c_int {
    // SAFETY: id NULL or ours.
    guard(-1, || unsafe { id_step(id, true, CmId::resolve_route) })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_listen(id: *mut rdma_cm_id, backlog: c_int) -> c_int {
    // SAFETY: id NULL or ours.
    guard(-1, || unsafe {
        id_step(id, false, |cm| cm.listen(backlog))
    })
}

/// The private data of a `rdma_conn_param`.
///
/// # Safety
/// `param`'s private data pointer must cover its length.
unsafe fn private_data(param: &rdma_conn_param) -> Vec<u8> {
    if param.private_data.is_null() || param.private_data_len == 0 {
        return Vec::new();
    }
    // SAFETY: per the contract.
    unsafe {
        std::slice::from_raw_parts(
            param.private_data.cast::<u8>(),
            usize::from(param.private_data_len),
        )
    }
    .to_vec()
}

/// librdmacm's `ucma_valid_param`: RC ids need parameters or a QP, and
/// no more READ/atomic depth than the device has.
fn valid_param(p: &IdPriv, param: Option<&rdma_conn_param>, dev: &SharedDevice) -> bool {
    if p.id.ps != RDMA_PS_TCP {
        return true;
    }
    let Some(param) = param else {
        return !p.id.qp.is_null();
    };
    (param.responder_resources == RDMA_MAX_RESP_RES
        || param.responder_resources <= dev.max_responder_resources)
        && (param.initiator_depth == RDMA_MAX_INIT_DEPTH
            || param.initiator_depth <= dev.max_initiator_depth)
}

/// The parameters to send, as `ucma_copy_conn_param_to_kern` builds them.
///
/// # Safety
/// `p` must be a live id; `param` as in [`private_data`].
unsafe fn to_conn_param(
    p: &IdPriv,
    param: Option<&rdma_conn_param>,
    depths: (u8, u8),
) -> ConnParam {
    let (responder_resources, initiator_depth) = depths;
    let (qp_num, srq) = if p.id.qp.is_null() {
        param.map_or((0, false), |c| (c.qp_num, c.srq != 0))
    } else {
        // SAFETY: the id's live QP.
        unsafe { ((*p.id.qp).qp_num, !(*p.id.qp).srq.is_null()) }
    };
    ConnParam {
        // SAFETY: per the contract.
        private_data: param
            .map(|c| unsafe { private_data(c) })
            .unwrap_or_default(),
        responder_resources,
        initiator_depth,
        retry_count: param.map_or(7, |c| c.retry_count),
        rnr_retry_count: param.map_or(7, |c| c.rnr_retry_count),
        qp_num,
        srq,
    }
}

#[no_mangle]
pub unsafe extern "C" fn rdma_connect(
    id: *mut rdma_cm_id,
    conn_param: *mut rdma_conn_param,
) -> c_int {
    guard(-1, || {
        // SAFETY: id NULL or ours; conn_param NULL or the caller's.
        let (Some(p), param) = (unsafe { id_priv(id) }, unsafe { conn_param.as_ref() }) else {
            return fail(libc::EINVAL);
        };
        // SAFETY: p is live.
        let pr = unsafe { &*p };
        let Some(dev) = pr.extra.lock().dev else {
            return fail(libc::EINVAL);
        };
        if !valid_param(pr, param, &dev) {
            return fail(libc::EINVAL);
        }
        let initiator_depth = match param {
            Some(c) if c.initiator_depth != RDMA_MAX_INIT_DEPTH => c.initiator_depth,
            _ => dev.max_initiator_depth,
        };
        let responder_resources = match param {
            Some(c) if c.responder_resources != RDMA_MAX_RESP_RES => c.responder_resources,
            _ => dev.max_responder_resources,
        };
        {
            let mut x = pr.extra.lock();
            x.initiator_depth = initiator_depth;
            x.responder_resources = responder_resources;
        }
        // SAFETY: p is live; param's data is the caller's.
        let cp = unsafe { to_conn_param(pr, param, (responder_resources, initiator_depth)) };
        if let Err(e) = pr.cm.connect(&cp) {
            return fail(errno_of(e));
        }
        // SAFETY: p is live.
        unsafe { complete(p) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_accept(
    id: *mut rdma_cm_id,
    conn_param: *mut rdma_conn_param,
) -> c_int {
    guard(-1, || {
        // SAFETY: id NULL or ours; conn_param NULL or the caller's.
        let (Some(p), param) = (unsafe { id_priv(id) }, unsafe { conn_param.as_ref() }) else {
            return fail(libc::EINVAL);
        };
        // SAFETY: p is live.
        let pr = unsafe { &*p };
        let Some(dev) = pr.extra.lock().dev else {
            return fail(libc::EINVAL);
        };
        if !valid_param(pr, param, &dev) || (pr.id.qp.is_null() && param.is_none()) {
            return fail(libc::EINVAL);
        }
        let depths = {
            let mut x = pr.extra.lock();
            x.initiator_depth = match param {
                Some(c) if c.initiator_depth != RDMA_MAX_INIT_DEPTH => c.initiator_depth,
                _ => x.initiator_depth.min(dev.max_initiator_depth),
            };
            x.responder_resources = match param {
                Some(c) if c.responder_resources != RDMA_MAX_RESP_RES => c.responder_resources,
                _ => x.responder_resources.min(dev.max_responder_resources),
            };
            (x.responder_resources, x.initiator_depth)
        };
        // SAFETY: p is live; param's data is the caller's.
        let cp = unsafe { to_conn_param(pr, param, depths) };
        let r = pr.cm.accept(&cp);
        // SAFETY: p is live.
        unsafe { sync_qp_state(p) };
        if let Err(e) = r {
            return fail(errno_of(e));
        }
        if pr.id.qp_type == IBV_QPT_UD {
            if pr.sync.load(Ordering::Acquire) && !pr.id.event.is_null() {
                // SAFETY: the id's pending event; p is live.
                unsafe {
                    let ev = (*p).id.event;
                    (*p).id.event = null_mut();
                    ack(ev);
                }
            }
            return 0;
        }
        // SAFETY: p is live.
        unsafe { complete(p) }
    })
}

/// # Safety
/// `id` NULL or ours; `data` covers `len` bytes.
unsafe fn reject(id: *mut rdma_cm_id, data: *const c_void, len: u8, reason: Option<u16>) -> c_int {
    // SAFETY: per the contract.
    let Some(p) = (unsafe { id_priv(id) }) else {
        return fail(libc::EINVAL);
    };
    let pd = if data.is_null() || len == 0 {
        Vec::new()
    } else {
        // SAFETY: per the contract.
        unsafe { std::slice::from_raw_parts(data.cast::<u8>(), usize::from(len)) }.to_vec()
    };
    // SAFETY: p is live.
    let cm = unsafe { &(*p).cm };
    let r = match reason {
        Some(why) => cm.reject_with_reason(&pd, why),
        None => cm.reject(&pd),
    };
    match r {
        Ok(()) => 0,
        Err(e) => fail(errno_of(e)),
    }
}

#[no_mangle]
pub unsafe extern "C" fn rdma_reject(
    id: *mut rdma_cm_id,
    private_data: *const c_void,
    private_data_len: u8,
) -> c_int {
    // SAFETY: the caller's id and data.
    guard(-1, || unsafe {
        reject(id, private_data, private_data_len, None)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_reject_ece(
    id: *mut rdma_cm_id,
    private_data: *const c_void,
    private_data_len: u8,
) -> c_int {
    guard(-1, || {
        // SAFETY: the caller's id and data.
        unsafe {
            reject(
                id,
                private_data,
                private_data_len,
                Some(REJ_VENDOR_OPTION_NOT_SUPPORTED),
            )
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_disconnect(id: *mut rdma_cm_id) -> c_int {
    guard(-1, || {
        // SAFETY: id NULL or ours.
        let Some(p) = (unsafe { id_priv(id) }) else {
            return fail(libc::EINVAL);
        };
        // SAFETY: p is live.
        let r = unsafe { (*p).cm.disconnect() };
        // SAFETY: p is live.
        unsafe { sync_qp_state(p) };
        if let Err(e) = r {
            return fail(errno_of(e));
        }
        // SAFETY: p is live.
        unsafe { complete(p) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_establish(id: *mut rdma_cm_id) -> c_int {
    guard(-1, || {
        // SAFETY: id NULL or ours.
        let Some(p) = (unsafe { id_priv(id) }) else {
            return fail(libc::EINVAL);
        };
        // SAFETY: p is live.
        match unsafe { (*p).cm.establish() } {
            Ok(()) => 0,
            Err(e) => fail(errno_of(e)),
        }
    })
}

/// `rdma_notify`: IBV_EVENT_COMM_EST tells the CM that data arrived before
/// the RTU; roxe's passive side is established when the RTU arrives or
/// its REP is resent until it does, so the notice only needs to find a
/// connection that is accepted or established. Other events: EINVAL, as
/// the kernel's `ib_cm_notify` answers them.
#[no_mangle]
pub unsafe extern "C" fn rdma_notify(id: *mut rdma_cm_id, event: c_int) -> c_int {
    guard(-1, || {
        // SAFETY: id NULL or ours.
        let Some(p) = (unsafe { id_priv(id) }) else {
            return fail(libc::EINVAL);
        };
        // SAFETY: p is live.
        if event != IBV_EVENT_COMM_EST || unsafe { (*p).cm.peer_addr() }.is_none() {
            return fail(libc::EINVAL);
        }
        0
    })
}

// ---------------------------------------------------------------- events

/// `struct rdma_cm_event`, the private data its param points into, and
/// the id its acknowledgement completes.
#[repr(C)]
struct EventPriv {
    ev: rdma_cm_event,
    data: Vec<u8>,
    counted: *mut IdPriv,
}

/// # Safety
/// `ev` must be an event of this library not yet acknowledged.
unsafe fn ack(ev: *mut rdma_cm_event) {
    // SAFETY: per the contract, ev came from Box<EventPriv>.
    let e = unsafe { Box::from_raw(ev.cast::<EventPriv>()) };
    // SAFETY: an id with unacknowledged events is not freed (destroy
    // waits for them).
    let p = unsafe { &*e.counted };
    p.events.lock().completed += 1;
    p.acked.notify_all();
}

#[no_mangle]
pub unsafe extern "C" fn rdma_ack_cm_event(event: *mut rdma_cm_event) -> c_int {
    guard(-1, || {
        if event.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: the caller acknowledges an event we handed out, once.
        unsafe { ack(event) };
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_get_cm_event(
    channel: *mut rdma_event_channel,
    event: *mut *mut rdma_cm_event,
) -> c_int {
    guard(-1, || {
        // SAFETY: channel NULL or ours.
        let Some(ch) = (unsafe { channel_ref(channel) }) else {
            return fail(libc::EINVAL);
        };
        if event.is_null() {
            return fail(libc::EINVAL);
        }
        loop {
            // Blocks unless the program made the fd non-blocking (EAGAIN).
            let ev = match ch.ch.get_event() {
                Ok(ev) => ev,
                Err(e) => return fail(errno_of(e)),
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
                    let mut n = l.events.lock();
                    n.completed += 1;
                    drop(n);
                    l.acked.notify_all();
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

#[no_mangle]
pub unsafe extern "C" fn rdma_event_str(event: u32) -> *const c_char {
    let s: &'static [u8] = match event {
        0 => b"RDMA_CM_EVENT_ADDR_RESOLVED\0",
        1 => b"RDMA_CM_EVENT_ADDR_ERROR\0",
        2 => b"RDMA_CM_EVENT_ROUTE_RESOLVED\0",
        3 => b"RDMA_CM_EVENT_ROUTE_ERROR\0",
        4 => b"RDMA_CM_EVENT_CONNECT_REQUEST\0",
        5 => b"RDMA_CM_EVENT_CONNECT_RESPONSE\0",
        6 => b"RDMA_CM_EVENT_CONNECT_ERROR\0",
        7 => b"RDMA_CM_EVENT_UNREACHABLE\0",
        8 => b"RDMA_CM_EVENT_REJECTED\0",
        9 => b"RDMA_CM_EVENT_ESTABLISHED\0",
        10 => b"RDMA_CM_EVENT_DISCONNECTED\0",
        11 => b"RDMA_CM_EVENT_DEVICE_REMOVAL\0",
        12 => b"RDMA_CM_EVENT_MULTICAST_JOIN\0",
        13 => b"RDMA_CM_EVENT_MULTICAST_ERROR\0",
        14 => b"RDMA_CM_EVENT_ADDR_CHANGE\0",
        15 => b"RDMA_CM_EVENT_TIMEWAIT_EXIT\0",
        _ => b"UNKNOWN EVENT\0",
    };
    s.as_ptr().cast()
}

// ------------------------------------------------------------ QP and SRQ

/// librdmacm's `ucma_destroy_cqs`.
///
/// # Safety
/// `p` must be a live id whose CQs no QP or SRQ uses any more.
unsafe fn destroy_cqs(p: *mut IdPriv) {
    // SAFETY: per the contract; the CQs and channels are the id's own.
    unsafe {
        let id = &mut (*p).id;
        if !id.recv_cq.is_null() {
            crate::cq::ibv_destroy_cq(id.recv_cq);
            if !id.send_cq.is_null() && id.send_cq != id.recv_cq {
                crate::cq::ibv_destroy_cq(id.send_cq);
            }
            id.send_cq = null_mut();
            id.recv_cq = null_mut();
        }
        if !id.recv_cq_channel.is_null() {
            crate::comp_channel::ibv_destroy_comp_channel(id.recv_cq_channel);
            if !id.send_cq_channel.is_null() && id.send_cq_channel != id.recv_cq_channel {
                crate::comp_channel::ibv_destroy_comp_channel(id.send_cq_channel);
            }
            id.send_cq_channel = null_mut();
            id.recv_cq_channel = null_mut();
        }
    }
}

/// librdmacm's `ucma_create_cqs`: a CQ with its own completion channel
/// for each queue that has none (size 0: none needed).
///
/// # Safety
/// `p` must be a live id with a device.
unsafe fn create_cqs(p: *mut IdPriv, send_size: u32, recv_size: u32) -> Result<(), i32> {
    // SAFETY: per the contract.
    unsafe {
        let id = &mut (*p).id;
        let me = p.cast::<c_void>();
        let mk =
            |size: u32, ch: &mut *mut ibv_comp_channel, cq: &mut *mut ibv_cq| -> Result<(), i32> {
                *ch = crate::comp_channel::ibv_create_comp_channel(id.verbs);
                if ch.is_null() {
                    return Err(last_errno());
                }
                *cq = crate::cq::ibv_create_cq(id.verbs, size as c_int, me, *ch, 0);
                if cq.is_null() {
                    return Err(last_errno());
                }
                Ok(())
            };
        let (mut rch, mut rcq, mut sch, mut scq) = (
            id.recv_cq_channel,
            id.recv_cq,
            id.send_cq_channel,
            id.send_cq,
        );
        let mut r = Ok(());
        if recv_size > 0 {
            r = mk(recv_size, &mut rch, &mut rcq);
        }
        if r.is_ok() && send_size > 0 {
            r = mk(send_size, &mut sch, &mut scq);
        }
        id.recv_cq_channel = rch;
        id.recv_cq = rcq;
        id.send_cq_channel = sch;
        id.send_cq = scq;
        if r.is_err() {
            destroy_cqs(p);
        }
        r
    }
}

fn last_errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

#[no_mangle]
pub unsafe extern "C" fn rdma_create_qp_ex(
    id: *mut rdma_cm_id,
    attr: *mut ibv_qp_init_attr_ex,
) -> c_int {
    guard(-1, || {
        // SAFETY: id NULL or ours; attr the caller's.
        let (Some(p), Some(a)) = (unsafe { id_priv(id) }, unsafe { attr.as_mut() }) else {
            return fail(libc::EINVAL);
        };
        // SAFETY: p is live.
        let idr = unsafe { &mut (*p).id };
        if !idr.qp.is_null() || idr.verbs.is_null() {
            return fail(libc::EINVAL);
        }
        if a.comp_mask & IBV_QP_INIT_ATTR_PD == 0 || a.pd.is_null() {
            a.comp_mask |= IBV_QP_INIT_ATTR_PD;
            a.pd = idr.pd;
        // SAFETY: a non-NULL PD of the caller's.
        } else if unsafe { (*a.pd).context } != idr.verbs {
            return fail(libc::EINVAL);
        }
        if (!idr.recv_cq.is_null() && !a.recv_cq.is_null() && idr.recv_cq != a.recv_cq)
            || (!idr.send_cq.is_null() && !a.send_cq.is_null() && idr.send_cq != a.send_cq)
        {
            return fail(libc::EINVAL);
        }
        let send = if a.send_cq.is_null() && idr.send_cq.is_null() {
            a.cap.max_send_wr
        } else {
            0
        };
        let recv = if a.recv_cq.is_null() && idr.recv_cq.is_null() {
            a.cap.max_recv_wr
        } else {
            0
        };
        // SAFETY: p is live with a device.
        if let Err(e) = unsafe { create_cqs(p, send, recv) } {
            return fail(e);
        }
        // SAFETY: p is live.
        let idr = unsafe { &mut (*p).id };
        if a.send_cq.is_null() {
            a.send_cq = idr.send_cq;
        }
        if a.recv_cq.is_null() {
            a.recv_cq = idr.recv_cq;
        }
        if !idr.srq.is_null() && a.srq.is_null() {
            a.srq = idr.srq;
        }
        // SAFETY: idr.verbs is our context; attr is the caller's.
        let qp = unsafe { crate::qp::create_qp_ex(idr.verbs, attr) };
        if qp.is_null() {
            let e = last_errno();
            // SAFETY: p is live; its CQs are unused.
            unsafe { destroy_cqs(p) };
            return fail(e);
        }
        // SAFETY: qp was just created by this library.
        let attached = match unsafe { crate::qp::qp_parts(qp) } {
            // SAFETY: p is live.
            Some((q, pd)) => unsafe { (*p).cm.attach_qp(&q, &pd) }.map_err(errno_of),
            None => Err(libc::EINVAL),
        };
        if let Err(e) = attached {
            // SAFETY: the QP and CQs just created, unused.
            unsafe {
                crate::qp::ibv_destroy_qp(qp);
                destroy_cqs(p);
            }
            return fail(e);
        }
        // SAFETY: p is live; qp is ours.
        unsafe {
            (*p).id.pd = (*qp).pd;
            (*p).id.qp = qp;
            sync_qp_state(p);
        }
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_create_qp(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    guard(-1, || {
        // SAFETY: id NULL or ours; attr the caller's.
        let (Some(p), Some(init)) = (unsafe { id_priv(id) }, unsafe { qp_init_attr.as_mut() })
        else {
            return fail(libc::EINVAL);
        };
        // SAFETY: ibv_qp_init_attr_ex is pointers and integers.
        let mut ex: ibv_qp_init_attr_ex = unsafe { zeroed() };
        ex.qp_context = init.qp_context;
        ex.send_cq = init.send_cq;
        ex.recv_cq = init.recv_cq;
        ex.srq = init.srq;
        ex.cap = init.cap;
        ex.qp_type = init.qp_type;
        ex.sq_sig_all = init.sq_sig_all;
        ex.comp_mask = IBV_QP_INIT_ATTR_PD;
        // SAFETY: p is live.
        ex.pd = if pd.is_null() {
            unsafe { (*p).id.pd }
        } else {
            pd
        };
        // SAFETY: id and ex are valid.
        let r = unsafe { rdma_create_qp_ex(id, &mut ex) };
        init.send_cq = ex.send_cq;
        init.recv_cq = ex.recv_cq;
        init.srq = ex.srq;
        init.cap = ex.cap;
        r
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_qp(id: *mut rdma_cm_id) {
    guard((), || {
        // SAFETY: id NULL or ours.
        let Some(p) = (unsafe { id_priv(id) }) else {
            return;
        };
        // SAFETY: p is live; its QP (if any) is ours.
        unsafe {
            (*p).cm.detach_qp();
            let qp = (*p).id.qp;
            if !qp.is_null() {
                crate::qp::ibv_destroy_qp(qp);
            }
            (*p).id.qp = null_mut();
            destroy_cqs(p);
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_create_srq_ex(
    id: *mut rdma_cm_id,
    attr: *mut ibv_srq_init_attr_ex,
) -> c_int {
    guard(-1, || {
        // SAFETY: id NULL or ours; attr the caller's.
        let (Some(p), Some(a)) = (unsafe { id_priv(id) }, unsafe { attr.as_mut() }) else {
            return fail(libc::EINVAL);
        };
        if a.comp_mask & IBV_SRQ_INIT_ATTR_TYPE == 0 {
            return fail(libc::EINVAL);
        }
        // SAFETY: p is live.
        let idr = unsafe { &mut (*p).id };
        if a.comp_mask & IBV_SRQ_INIT_ATTR_PD == 0 || a.pd.is_null() {
            a.pd = idr.pd;
            a.comp_mask |= IBV_SRQ_INIT_ATTR_PD;
        }
        // SAFETY: our context; attr is the caller's.
        let srq = unsafe { crate::srq::create_srq_ex(idr.verbs, attr) };
        if srq.is_null() {
            return -1;
        }
        if idr.pd.is_null() {
            idr.pd = a.pd;
        }
        idr.srq = srq;
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_create_srq(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_srq_init_attr,
) -> c_int {
    guard(-1, || {
        // SAFETY: the caller's attr.
        let Some(init) = (unsafe { attr.as_mut() }) else {
            return fail(libc::EINVAL);
        };
        let mut ex = ibv_srq_init_attr_ex {
            srq_context: init.srq_context,
            attr: init.attr,
            comp_mask: IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD,
            srq_type: IBV_SRQT_BASIC,
            pd,
            xrcd: null_mut(),
            cq: null_mut(),
            tm_cap: [0; 2],
        };
        // SAFETY: id is the caller's; ex is valid.
        let r = unsafe { rdma_create_srq_ex(id, &mut ex) };
        init.attr = ex.attr;
        r
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_srq(id: *mut rdma_cm_id) {
    guard((), || {
        // SAFETY: id NULL or ours.
        let Some(p) = (unsafe { id_priv(id) }) else {
            return;
        };
        // SAFETY: p is live; its SRQ (if any) is ours.
        unsafe {
            let srq = (*p).id.srq;
            if !srq.is_null() {
                crate::srq::ibv_destroy_srq(srq);
            }
            (*p).id.srq = null_mut();
            destroy_cqs(p);
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_init_qp_attr(
    id: *mut rdma_cm_id,
    qp_attr: *mut ibv_qp_attr,
    qp_attr_mask: *mut c_int,
) -> c_int {
    guard(-1, || {
        // SAFETY: id NULL or ours; the out-pointers are the caller's.
        let (Some(p), Some(out), false) = (
            unsafe { id_priv(id) },
            unsafe { qp_attr.as_mut() },
            qp_attr_mask.is_null(),
        ) else {
            return fail(libc::EINVAL);
        };
        let Ok(state) = QpState::try_from(out.qp_state) else {
            return fail(libc::EINVAL);
        };
        // SAFETY: p is live.
        match unsafe { (*p).cm.init_qp_attr(state) } {
            Ok((a, mask)) => {
                *out = crate::abi::convert::qp_attr_to_c(&a, out.cap);
                // SAFETY: the caller's out-pointer.
                unsafe { *qp_attr_mask = mask.bits() as c_int };
                0
            }
            Err(e) => fail(errno_of(e)),
        }
    })
}

// ------------------------------------------------ synchronous endpoints

#[no_mangle]
pub unsafe extern "C" fn rdma_get_request(
    listen: *mut rdma_cm_id,
    id: *mut *mut rdma_cm_id,
) -> c_int {
    guard(-1, || {
        // SAFETY: listen NULL or ours.
        let Some(l) = (unsafe { id_priv(listen) }) else {
            return fail(libc::EINVAL);
        };
        // Raw field accesses only: rdma_get_cm_event below reaches the
        // listener through its own pointer (event counts, context).
        // SAFETY: l is live.
        if !unsafe { (*l).sync.load(Ordering::Acquire) } || id.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: l is live; its pending event (if any) is ours to ack.
        unsafe {
            let ev = std::mem::replace(&mut (*l).id.event, null_mut());
            if !ev.is_null() {
                ack(ev);
            }
        }
        let mut ev = null_mut();
        // SAFETY: the listener's own channel.
        let r = unsafe { rdma_get_cm_event((*l).id.channel, &mut ev) };
        if r != 0 {
            return r;
        }
        // SAFETY: ev was just handed out.
        let (kind, status, new_id) = unsafe { ((*ev).event, (*ev).status, (*ev).id) };
        let errno = if kind == EventKind::Rejected as u32 {
            Some(libc::ECONNREFUSED)
        } else if status != 0 {
            Some(-status)
        } else if kind != EventKind::ConnectRequest as u32 {
            Some(libc::EINVAL)
        } else {
            None
        };
        if let Some(errno) = errno {
            // SAFETY: l is live.
            unsafe { (*l).id.event = ev };
            return fail(errno);
        }
        // SAFETY: l is live.
        let init = unsafe { (*l).extra.lock().qp_init_attr };
        if let Some(mut a) = init {
            // SAFETY: the new id is live; a is a valid init attr.
            let r = unsafe { rdma_create_qp(new_id, (*l).id.pd, &mut a) };
            if r != 0 {
                let errno = last_errno();
                // SAFETY: l is live.
                unsafe { (*l).id.event = ev };
                return fail(errno);
            }
        }
        // SAFETY: the new id is live; id is the caller's out-pointer.
        unsafe {
            (*new_id).event = ev;
            *id = new_id;
        }
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_create_ep(
    id: *mut *mut rdma_cm_id,
    res: *mut rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    guard(-1, || {
        // SAFETY: res is the caller's.
        let Some(res) = (unsafe { res.as_ref() }) else {
            return fail(libc::EINVAL);
        };
        if id.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: a synchronous id (NULL channel).
        let p = match unsafe {
            new_id(
                null_mut(),
                None,
                null_mut(),
                res.ai_port_space as u32,
                res.ai_qp_type as u32,
            )
        } {
            Ok(p) => p,
            Err(e) => return fail(e),
        };
        let cid = p.cast::<rdma_cm_id>();
        // SAFETY: cid is live; the addresses and attr are the caller's.
        let r = unsafe {
            if res.ai_flags & RAI_PASSIVE != 0 {
                let r = rdma_bind_addr(cid, res.ai_src_addr);
                if r == 0 {
                    if !pd.is_null() {
                        (*p).id.pd = pd;
                    }
                    if let Some(a) = qp_init_attr.as_ref() {
                        let mut a = *a;
                        a.qp_type = res.ai_qp_type as u32;
                        (*p).extra.lock().qp_init_attr = Some(a);
                    }
                }
                r
            } else {
                let mut r = rdma_resolve_addr(cid, res.ai_src_addr, res.ai_dst_addr, 2000);
                if r == 0 {
                    r = rdma_resolve_route(cid, 2000);
                }
                if r == 0 {
                    if let Some(a) = qp_init_attr.as_mut() {
                        a.qp_type = res.ai_qp_type as u32;
                        r = rdma_create_qp(cid, pd, a);
                    }
                }
                r
            }
        };
        if r != 0 {
            let e = last_errno();
            // SAFETY: cid is live and not handed out.
            unsafe { rdma_destroy_ep(cid) };
            return fail(e);
        }
        // SAFETY: the caller's out-pointer.
        unsafe { *id = cid };
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_ep(id: *mut rdma_cm_id) {
    guard((), || {
        if id.is_null() {
            return;
        }
        // SAFETY: id is ours; its QP and SRQ are ours.
        unsafe {
            if !(*id).qp.is_null() {
                rdma_destroy_qp(id);
            }
            if !(*id).srq.is_null() {
                rdma_destroy_srq(id);
            }
            rdma_destroy_id(id);
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_migrate_id(
    id: *mut rdma_cm_id,
    channel: *mut rdma_event_channel,
) -> c_int {
    guard(-1, || {
        // SAFETY: id NULL or ours.
        let Some(p) = (unsafe { id_priv(id) }) else {
            return fail(libc::EINVAL);
        };
        // Shared references to the Rust fields (other threads ack events
        // through them), raw writes to the C fields.
        // SAFETY: p is live.
        let pr = unsafe { &*p };
        let was_sync = pr.sync.load(Ordering::Acquire);
        if was_sync && channel.is_null() {
            return fail(libc::EINVAL);
        }
        let (channel, sync) = if channel.is_null() {
            match new_channel() {
                Ok(c) => (c, true),
                Err(e) => return fail(e),
            }
        } else {
            (channel, false)
        };
        // SAFETY: only compared unless live.
        let Some(ch) = (unsafe { channel_ref(channel) }) else {
            return fail(libc::EINVAL);
        };
        pr.cm.migrate(&ch.ch);
        // SAFETY: p is live; its C fields are written by this caller only.
        let old = unsafe { std::mem::replace(&mut (*p).id.channel, channel) };
        if was_sync {
            // SAFETY: as above; the pending event is the id's own.
            unsafe {
                let ev = std::mem::replace(&mut (*p).id.event, null_mut());
                if !ev.is_null() {
                    ack(ev);
                }
                // The id's own old channel, now unused.
                free_channel(old);
            }
        }
        pr.sync.store(sync, Ordering::Release);
        let mut n = pr.events.lock();
        while n.completed < n.reported {
            pr.acked.wait(&mut n);
        }
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_set_option(
    id: *mut rdma_cm_id,
    level: c_int,
    optname: c_int,
    optval: *mut c_void,
    optlen: usize,
) -> c_int {
    guard(-1, || {
        // SAFETY: id NULL or ours.
        let Some(p) = (unsafe { id_priv(id) }) else {
            return fail(libc::EINVAL);
        };
        if optval.is_null() {
            return fail(libc::EINVAL);
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
                    Err(e) => fail(errno_of(e)),
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
                fail(libc::EINVAL)
            }
            // Path records come from the SA on InfiniBand; RoCE resolves
            // routes from IP, as the kernel's rdma_cm does for RoCE ids.
            (RDMA_OPTION_IB, RDMA_OPTION_IB_PATH) => fail(libc::EINVAL),
            _ => fail(libc::ENOSYS),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_get_src_port(id: *mut rdma_cm_id) -> u16 {
    // SAFETY: id NULL or ours.
    guard(0, || match unsafe { id_priv(id) } {
        // SAFETY: p is live.
        Some(p) => unsafe { (*p).cm.local_addr() }.map_or(0, |a| a.port().to_be()),
        None => 0,
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_get_dst_port(id: *mut rdma_cm_id) -> u16 {
    // SAFETY: id NULL or ours.
    guard(0, || match unsafe { id_priv(id) } {
        // SAFETY: p is live.
        Some(p) => unsafe { (*p).cm.peer_addr() }.map_or(0, |a| a.port().to_be()),
        None => 0,
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_get_devices(num_devices: *mut c_int) -> *mut *mut ibv_context {
    guard(null_mut(), || {
        let list = match all_shared_devices() {
            Ok(l) => l,
            Err(e) => {
                set_errno(e);
                return null_mut();
            }
        };
        // SAFETY: calloc of len + 1 pointers (the last stays NULL);
        // rdma_free_devices frees it.
        let out = unsafe { libc::calloc(list.len() + 1, size_of::<*mut ibv_context>()) }
            .cast::<*mut ibv_context>();
        if out.is_null() {
            set_errno(libc::ENOMEM);
            return null_mut();
        }
        for (i, c) in list.iter().enumerate() {
            // SAFETY: out has list.len() + 1 slots.
            unsafe { *out.add(i) = *c };
        }
        if !num_devices.is_null() {
            // SAFETY: the caller's out-pointer.
            unsafe { *num_devices = list.len() as c_int };
        }
        out
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_free_devices(list: *mut *mut ibv_context) {
    // SAFETY: list came from rdma_get_devices (calloc) or is NULL.
    unsafe { libc::free(list.cast()) }
}

// ------------------------------------------------------------------- ECE

#[no_mangle]
pub unsafe extern "C" fn rdma_set_local_ece(id: *mut rdma_cm_id, ece: *mut ibv_ece) -> c_int {
    guard(-1, || {
        // SAFETY: id NULL or ours; ece the caller's.
        let (Some(p), Some(e)) = (unsafe { id_priv(id) }, unsafe { ece.as_ref() }) else {
            return fail(libc::EINVAL);
        };
        // SAFETY: p is live.
        unsafe { (*p).extra.lock().local_ece = [e.vendor_id, e.options] };
        0
    })
}

/// ECE options are vendor extensions roxe's peers (rxe, mlx5 without its
/// vendor options) do not send: the remote ECE is always empty.
#[no_mangle]
pub unsafe extern "C" fn rdma_get_remote_ece(id: *mut rdma_cm_id, ece: *mut ibv_ece) -> c_int {
    guard(-1, || {
        // SAFETY: ece the caller's.
        let (Some(_), Some(e)) = (unsafe { id_priv(id) }, unsafe { ece.as_mut() }) else {
            return fail(libc::EINVAL);
        };
        *e = ibv_ece {
            vendor_id: 0,
            options: 0,
            comp_mask: 0,
        };
        0
    })
}

// ------------------------------------------------------------ multicast

/// Multicast over RoCE needs IGMP joins and multicast GIDs, which roxe's
/// devices do not implement: ENOSYS.
#[no_mangle]
pub unsafe extern "C" fn rdma_join_multicast(
    _id: *mut rdma_cm_id,
    _addr: *mut libc::sockaddr,
    _context: *mut c_void,
) -> c_int {
    fail(libc::ENOSYS)
}

#[no_mangle]
pub unsafe extern "C" fn rdma_join_multicast_ex(
    _id: *mut rdma_cm_id,
    _attr: *mut c_void,
    _context: *mut c_void,
) -> c_int {
    fail(libc::ENOSYS)
}

#[no_mangle]
pub unsafe extern "C" fn rdma_leave_multicast(
    _id: *mut rdma_cm_id,
    _addr: *mut libc::sockaddr,
) -> c_int {
    fail(libc::ENOSYS)
}

// ---------------------------------------------------------- addrinfo

/// A malloc'ed copy of a sockaddr (freed by rdma_freeaddrinfo).
///
/// # Safety
/// `sa` must cover `len` bytes.
unsafe fn copy_addr(sa: *const libc::sockaddr, len: libc::socklen_t) -> *mut libc::sockaddr {
    // SAFETY: malloc of len bytes, filled from the caller's len bytes.
    unsafe {
        let p = libc::malloc(len as usize).cast::<libc::sockaddr>();
        if !p.is_null() {
            ptr::copy_nonoverlapping(sa.cast::<u8>(), p.cast::<u8>(), len as usize);
        }
        p
    }
}

#[no_mangle]
pub unsafe extern "C" fn rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    guard(-1, || {
        if res.is_null() || (node.is_null() && service.is_null() && hints.is_null()) {
            return fail(libc::EINVAL);
        }
        // SAFETY: rdma_addrinfo is integers and pointers.
        let none: rdma_addrinfo = unsafe { zeroed() };
        // SAFETY: hints NULL or the caller's.
        let h = unsafe { hints.as_ref() }.unwrap_or(&none);
        // SAFETY: calloc'ed, freed by rdma_freeaddrinfo.
        let rai = unsafe { libc::calloc(1, size_of::<rdma_addrinfo>()) }.cast::<rdma_addrinfo>();
        if rai.is_null() {
            return fail(libc::ENOMEM);
        }
        // SAFETY: rai is a fresh zeroed allocation.
        let r = unsafe { &mut *rai };
        if !node.is_null() || !service.is_null() {
            // SAFETY: addrinfo is integers and pointers.
            let mut ai_hints: libc::addrinfo = unsafe { zeroed() };
            if h.ai_flags & RAI_PASSIVE != 0 {
                ai_hints.ai_flags = libc::AI_PASSIVE;
            }
            if h.ai_flags & RAI_NUMERICHOST != 0 {
                ai_hints.ai_flags |= libc::AI_NUMERICHOST;
            }
            ai_hints.ai_family = h.ai_family;
            ai_hints.ai_socktype = if h.ai_qp_type == IBV_QPT_UD as c_int {
                libc::SOCK_DGRAM
            } else if h.ai_qp_type != 0 {
                libc::SOCK_STREAM
            } else {
                0
            };
            ai_hints.ai_protocol = match h.ai_port_space as u32 {
                RDMA_PS_TCP => libc::IPPROTO_TCP,
                RDMA_PS_UDP | RDMA_PS_IPOIB => libc::IPPROTO_UDP,
                _ => 0,
            };
            let mut ai: *mut libc::addrinfo = null_mut();
            // SAFETY: node/service NULL or C strings; ai the out-pointer.
            let rc = unsafe {
                libc::getaddrinfo(
                    node,
                    service,
                    if hints.is_null() {
                        ptr::null()
                    } else {
                        &ai_hints
                    },
                    &mut ai,
                )
            };
            if rc != 0 {
                // SAFETY: rai is ours, partly filled.
                unsafe { rdma_freeaddrinfo(rai) };
                return rc;
            }
            // SAFETY: getaddrinfo returned a non-empty list.
            let a = unsafe { &*ai };
            r.ai_qp_type = if h.ai_qp_type != 0 {
                h.ai_qp_type
            } else if a.ai_socktype == libc::SOCK_DGRAM {
                IBV_QPT_UD as c_int
            } else {
                IBV_QPT_RC as c_int
            };
            r.ai_port_space = if h.ai_port_space != 0 {
                h.ai_port_space
            } else if a.ai_protocol == libc::IPPROTO_UDP {
                RDMA_PS_UDP as c_int
            } else {
                RDMA_PS_TCP as c_int
            };
            r.ai_family = a.ai_family;
            // SAFETY: a.ai_addr covers a.ai_addrlen bytes.
            let copy = unsafe { copy_addr(a.ai_addr, a.ai_addrlen) };
            if a.ai_flags & libc::AI_PASSIVE != 0 {
                r.ai_flags = RAI_PASSIVE;
                r.ai_src_addr = copy;
                r.ai_src_len = a.ai_addrlen;
            } else {
                r.ai_dst_addr = copy;
                r.ai_dst_len = a.ai_addrlen;
            }
            // SAFETY: ai came from getaddrinfo.
            unsafe { libc::freeaddrinfo(ai) };
            if copy.is_null() {
                // SAFETY: rai is ours.
                unsafe { rdma_freeaddrinfo(rai) };
                return fail(libc::ENOMEM);
            }
        } else {
            r.ai_flags = h.ai_flags;
            r.ai_family = h.ai_family;
            r.ai_qp_type = h.ai_qp_type;
            r.ai_port_space = h.ai_port_space;
            if h.ai_dst_len > 0 && !h.ai_dst_addr.is_null() {
                // SAFETY: the hints' address covers its length.
                r.ai_dst_addr = unsafe { copy_addr(h.ai_dst_addr, h.ai_dst_len) };
                r.ai_dst_len = h.ai_dst_len;
            }
        }
        if r.ai_src_len == 0 && h.ai_src_len > 0 && !h.ai_src_addr.is_null() {
            // SAFETY: the hints' address covers its length.
            r.ai_src_addr = unsafe { copy_addr(h.ai_src_addr, h.ai_src_len) };
            r.ai_src_len = h.ai_src_len;
        }
        // SAFETY: the caller's out-pointer.
        unsafe { *res = rai };
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_freeaddrinfo(res: *mut rdma_addrinfo) {
    let mut cur = res;
    while !cur.is_null() {
        // SAFETY: a list rdma_getaddrinfo built from malloc'ed parts.
        unsafe {
            let next = (*cur).ai_next;
            libc::free((*cur).ai_src_addr.cast());
            libc::free((*cur).ai_dst_addr.cast());
            libc::free((*cur).ai_src_canonname.cast());
            libc::free((*cur).ai_dst_canonname.cast());
            libc::free((*cur).ai_route);
            libc::free((*cur).ai_connect);
            libc::free(cur.cast());
            cur = next;
        }
    }
}
